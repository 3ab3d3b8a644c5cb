//! The capture files without root: Perfetto's decoder and plain JSON agree with the model,
//! and both match their golden copies.

use super::*;

#[test]
fn perfetto_capture_decodes_with_perfettos_own_definitions() {
    let python = match perfetto_python() {
        Ok(p) => p,
        Err(why) => {
            uvmwatch_testbed::skip(
                "perfetto_capture_decodes_with_perfettos_own_definitions",
                &why,
            );
            return;
        }
    };
    let c = story();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("story.pftrace");
    std::fs::write(&path, perfetto::encode(&c)).unwrap();
    let v = decode_with_perfetto(&python, &path);
    let snap = &v["snapshots"][0]["clocks"];
    assert_eq!(snap["3"], c.meta.clock.mono_ns);
    assert_eq!(snap["1"], c.meta.clock.unix_ns);
    assert_eq!(snap["6"], c.meta.boottime_ns);
    let proc_track = v["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["process"]["pid"] == 4242)
        .unwrap();
    let labels: Vec<&str> = proc_track["process"]["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(labels.contains(&"ns_pid=7"), "{labels:?}");
    assert!(labels
        .iter()
        .any(|l| l.starts_with("container=3f1c0ffee0dd")));
    assert_eq!(proc_track["process"]["cmdline"][1], "serve.py");
    assert!(v["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t.get("counter").is_some())
        .all(|t| t["counter"]["unit"] == "UNIT_COUNT"));
    check_story_view(&View::from_perfetto(&v), &c);
}

#[test]
fn chrome_json_capture_shows_the_same_story() {
    let c = story();
    let v: Value = serde_json::from_str(&chrome::encode(&c)).unwrap();
    check_story_view(&View::from_chrome(&v), &c);
    assert_eq!(v["uvmwatch"]["processes"][0]["ns_pid"], 7);
    assert_eq!(
        v["uvmwatch"]["clock"]["offset_ns"].as_i64().unwrap() as i128,
        c.meta.clock.offset_ns
    );
}

/// The story in both formats, checked against (or, blessing, written to) the golden
/// capture files that the annotate tests read.
pub(crate) fn story_fixtures() -> (Capture, String, Vec<u8>) {
    let c = story();
    let json = chrome::encode(&c);
    let pb = perfetto::encode(&c);
    golden("capture.json", json.as_bytes());
    golden("capture.pftrace", &pb);
    (c, json, pb)
}

#[test]
fn capture_files_match_their_golden_copies_and_read_back() {
    let (c, json, pb) = story_fixtures();
    assert_eq!(capture::decode_capture(json.as_bytes()).unwrap(), c);
    assert_eq!(capture::decode_capture(&pb).unwrap(), c);
}

//! `uvmwatch annotate`: a Kineto trace merged with a capture; only events are inserted.

use super::*;

fn annotate_cli(trace: &Path, capture: &Path, out: &Path, extra: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .arg("annotate")
        .arg("--trace")
        .arg(trace)
        .arg("--capture")
        .arg(capture)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Lines of `input` appear in `output` in order, and every other output line is
/// uvmwatch's.
fn check_inserted_only(input: &str, output: &str) {
    let mut it = input.lines().peekable();
    for line in output.lines() {
        // An input line may have gained the comma before what was inserted after it.
        if it
            .peek()
            .is_some_and(|l| line == *l || line == format!("{l},"))
        {
            it.next();
            continue;
        }
        let ours = line.contains("uvmwatch")
            || line.contains(&format!("\"tid\":{}", TRACK_TID_BASE / 100_000));
        assert!(ours, "line not from the input nor uvmwatch's: {line}");
    }
    assert!(it.peek().is_none(), "input line missing: {:?}", it.peek());
}

#[test]
fn annotate_golden_with_a_synthetic_kineto_trace() {
    story_fixtures();
    let f = fixtures();
    let trace = f.join("kineto_trace.json");
    let dir = tempfile::tempdir().unwrap();
    let input = std::fs::read_to_string(&trace).unwrap();
    // From the chrome-json capture, through the command line.
    let out = dir.path().join("annotated.json");
    let (ok, err) = annotate_cli(&trace, &f.join("capture.json"), &out, &[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("python3 (host pid 4242) -> trace pid 7"),
        "{err}"
    );
    let got = std::fs::read_to_string(&out).unwrap();
    golden("annotated.json", got.as_bytes());
    check_inserted_only(&input, &got);
    // The same from the perfetto capture (the file name is recorded, so set it alike).
    let pb = capture::read_capture(&f.join("capture.pftrace")).unwrap();
    let (from_pb, _) = annotate::annotate(
        &input,
        &pb,
        &annotate::Options {
            capture_name: "capture.json".into(),
            ..annotate::Options::default()
        },
    )
    .unwrap();
    assert_eq!(from_pb, got);

    let v: Value = serde_json::from_str(&got).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    // Kineto's own events are untouched; ours sit under pid 7 on their own threads.
    let base = v["baseTimeNanoseconds"].as_u64().unwrap();
    let cu = evs
        .iter()
        .find(|e| e["name"] == "cuInit" && e["tid"] == TRACK_TID_BASE + 4242)
        .unwrap();
    assert_eq!(cu["pid"], 7);
    let wall = story_clock().unix_ns + 1_200 * MS;
    assert_eq!(
        (cu["ts"].as_f64().unwrap() * 1000.0).round() as i128,
        wall as i128 - base as i128
    );
    let to = evs.iter().find(|e| e["name"] == "aten::to").unwrap();
    let (a, z) = (
        to["ts"].as_f64().unwrap(),
        to["ts"].as_f64().unwrap() + to["dur"].as_f64().unwrap(),
    );
    let cu_ts = cu["ts"].as_f64().unwrap();
    assert!(a <= cu_ts && cu_ts <= z, "cuInit falls inside aten::to");
    // Perfetto drops negative times: what precedes the base is left out or clipped.
    assert!(evs.iter().all(|e| e["ts"].as_f64().unwrap_or(0.0) >= 0.0));
    assert!(!evs.iter().any(|e| e["name"] == "NV_ESC_CHECK_VERSION_STR"));
    let across = evs.iter().find(|e| e["name"] == "NV_ESC_RM_ALLOC").unwrap();
    assert_eq!(
        (across["ts"].as_f64(), across["dur"].as_f64()),
        (Some(0.0), Some(50_000.0))
    );
    assert_eq!(across["args"]["clipped_start_ns"], -50_000_000);
    assert!(
        err.contains("1 events before the trace's baseTimeNanoseconds left out, 1 slices"),
        "{err}"
    );
    assert_eq!(v["uvmwatch"]["processes"][0]["host_pid"], 4242);
    assert_eq!(v["uvmwatch"]["processes"][0]["trace_pid"], 7);

    // Gzip in and out.
    let gz_in = dir.path().join("trace.json.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, input.as_bytes()).unwrap();
    std::fs::write(&gz_in, enc.finish().unwrap()).unwrap();
    let gz_out = dir.path().join("annotated.json.gz");
    let (ok, err) = annotate_cli(&gz_in, &f.join("capture.json"), &gz_out, &[]);
    assert!(ok, "{err}");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&gz_out).unwrap()),
        &mut text,
    )
    .unwrap();
    assert_eq!(text, got);
}

#[test]
fn annotate_explains_a_trace_of_another_process() {
    story_fixtures();
    let f = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("other.json");
    std::fs::write(
        &trace,
        r#"{"baseTimeNanoseconds": 1750000001000000000, "traceEvents": [{"ph":"X","name":"x","pid":12,"tid":12,"ts":0,"dur":1}]}"#,
    )
    .unwrap();
    let out = dir.path().join("o.json");
    let (ok, err) = annotate_cli(&trace, &f.join("capture.json"), &out, &[]);
    assert!(!ok);
    assert!(
        err.contains("pid 7 inside its namespace") && err.contains("--pid"),
        "{err}"
    );
    assert!(!out.exists());
    let (ok, err) = annotate_cli(
        &trace,
        &f.join("capture.pftrace"),
        &out,
        &["--pid", "4242", "--trace-pid", "12"],
    );
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "cuInit" && e["pid"] == 12));
}

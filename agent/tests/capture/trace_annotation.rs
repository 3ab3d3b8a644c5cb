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

/// Bytes of the generated traces below: big enough that holding one (or its parsed events)
/// would show in the peak memory, small enough for a debug build in CI. A 1 GB trace, with a
/// release build, is measured in docs/capture.md.
const BIG_TRACE: usize = 48 << 20;
/// Peak memory allowed to `uvmwatch annotate` on it: the binary, the capture and the
/// buffers, not the trace.
const ANNOTATE_RSS_BOUND: u64 = 32 << 20;

/// A Kineto-like trace of about `bytes`: the synthetic trace's header, `cpu_op` events of
/// pid 7 and its closing members.
fn big_kineto_trace(path: &Path, bytes: usize) -> usize {
    use std::io::Write as _;
    let src = std::fs::read_to_string(fixtures().join("kineto_trace.json")).unwrap();
    let cut = src.find("\"traceEvents\": [").unwrap() + "\"traceEvents\": [".len();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&src.as_bytes()[..cut]).unwrap();
    let (mut n, mut written) = (0usize, 0usize);
    while written < bytes {
        let e = format!(
            "\n  {{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"pid\": 7, \"tid\": 7, \"ts\": {}.250, \"dur\": 20.5, \"args\": {{\"External id\": {n}, \"Input Dims\": [[1024, 1024], [1024, 1024]]}}}},",
            n % 3_000_000
        );
        f.write_all(e.as_bytes()).unwrap();
        written += e.len();
        n += 1;
    }
    f.write_all(b"\n  {\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#0\", \"pid\": 7, \"tid\": 7, \"ts\": 0, \"dur\": 3000000}\n  ],\n  \"traceName\": \"big\"\n}\n").unwrap();
    f.flush().unwrap();
    n + 1
}

/// `uvmwatch annotate`, reaped with `wait4` for its peak memory (bytes).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also gives its rusage"
)]
fn annotate_measured(trace: &Path, capture: &Path, out: &Path) -> (bool, u64) {
    let child = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .arg("annotate")
        .arg("--trace")
        .arg(trace)
        .arg("--capture")
        .arg(capture)
        .arg("-o")
        .arg(out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not reaped yet; status and usage are valid pointers.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid);
    (
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        usage.ru_maxrss as u64 * 1024,
    )
}

#[test]
fn annotate_streams_a_large_trace_in_bounded_memory() {
    story_fixtures();
    let f = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("big.json");
    let events = big_kineto_trace(&trace, BIG_TRACE);
    let out = dir.path().join("big-annotated.json.gz");
    let (ok, rss) = annotate_measured(&trace, &f.join("capture.json"), &out);
    assert!(ok, "annotate failed");
    let size = std::fs::metadata(&trace).unwrap().len();
    eprintln!(
        "annotate: {} MiB trace, {events} events, peak RSS {:.1} MiB",
        size >> 20,
        rss as f64 / (1 << 20) as f64
    );
    assert!(
        rss < ANNOTATE_RSS_BOUND,
        "peak RSS {rss} bytes for a {size}-byte trace (bound {ANNOTATE_RSS_BOUND})"
    );
    // Every byte of the input is there, in order, with the events inserted before the
    // array's end and the member before the object's.
    let mut got = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap()),
        &mut got,
    )
    .unwrap();
    let input = std::fs::read(&trace).unwrap();
    let at = input
        .windows(b"}\n  ],".len())
        .rposition(|w| w == b"}\n  ],")
        .unwrap()
        + 1;
    assert_eq!(
        &got[..at],
        &input[..at],
        "the input's bytes up to its last event"
    );
    let tail = String::from_utf8(got[at..].to_vec()).unwrap();
    assert!(
        tail.starts_with(",\n  {"),
        "{}",
        &tail[..80.min(tail.len())]
    );
    assert!(
        tail.contains(
            "\n  ],\n  \"traceName\": \"big\",\n  \"uvmwatch\": {\"capture\":\"capture.json\""
        ),
        "{tail}"
    );
    assert!(tail.ends_with("}\n}\n"), "{tail}");
}

/// A Python with Holistic Trace Analysis (PyPI `HolisticTraceAnalysis`; `cargo xtask setup`
/// installs it in target/tools/hta-venv; `$UVMWATCH_HTA_PYTHON` overrides), or why none.
fn hta_python() -> Result<PathBuf, String> {
    common::tool_python(
        "UVMWATCH_HTA_PYTHON",
        "target/tools/hta-venv",
        "import hta.trace_analysis",
        false,
    )
    .ok_or_else(|| {
        "no Python with HolisticTraceAnalysis (cargo xtask setup installs it in \
         target/tools/hta-venv)"
            .into()
    })
}

/// The rows HTA keeps of each trace (`fixtures/annotate/hta_rows.py`).
fn hta_rows(python: &Path, traces: &[&Path]) -> Vec<Vec<serde_json::Value>> {
    let out = Command::new(python)
        .arg(fixtures().join("hta_rows.py"))
        .args(traces)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "HTA could not load {traces:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The bytes of a trace file, gunzipped when gzip.
fn trace_bytes(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&raw[..]), &mut out).unwrap();
        out
    } else {
        raw
    }
}

/// `output` is `input` with text inserted at two places at most (the events, the member):
/// the input's bytes between them appear unchanged, and nothing of it is lost.
fn check_only_inserted(input: &[u8], output: &[u8]) {
    assert!(output.len() > input.len());
    let prefix = input.iter().zip(output).take_while(|(a, b)| a == b).count();
    let suffix = input[prefix..]
        .iter()
        .rev()
        .zip(output[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let between = &input[prefix..input.len() - suffix];
    let inserted = &output[prefix..output.len() - suffix];
    assert!(
        between.is_empty() || inserted.windows(between.len()).any(|w| w == between),
        "input bytes changed between the insertions: {:?}",
        String::from_utf8_lossy(between)
    );
}

/// Annotates `trace` with the story capture placed on `trace_pid`, checks that only text
/// was inserted and that HTA loads the result with every row it had before; with
/// `same_run` (the capture's time overlaps the trace's), the uvmwatch events are among
/// HTA's rows too (of another run's trace, they may lie outside what HTA keeps).
fn annotate_and_load_in_hta(
    python: &Path,
    trace: &Path,
    trace_pid: u32,
    out: &Path,
    same_run: bool,
) {
    let capture = fixtures().join("capture.json");
    let pid = trace_pid.to_string();
    let (ok, err) = annotate_cli(
        trace,
        &capture,
        out,
        &["--pid", "4242", "--trace-pid", &pid],
    );
    assert!(ok, "{}: {err}", trace.display());
    let annotated = trace_bytes(out);
    check_only_inserted(&trace_bytes(trace), &annotated);
    assert!(
        annotated.windows(10).any(|w| w == b"\"uvmwatch,"),
        "{}: no uvmwatch event inserted",
        trace.display()
    );
    let rows = hta_rows(python, &[trace, out]);
    let (before, after) = (&rows[0], &rows[1]);
    assert!(
        !before.is_empty(),
        "HTA kept no event of {}",
        trace.display()
    );
    for r in before {
        assert!(after.contains(r), "{}: HTA lost {r:?}", trace.display());
    }
    assert!(
        !same_run || after.iter().any(|r| r[0] == "cuInit"),
        "{}: no uvmwatch event in HTA's view",
        trace.display()
    );
}

#[test]
fn annotated_traces_still_load_in_holistic_trace_analysis() {
    let name = "annotated_traces_still_load_in_holistic_trace_analysis";
    let python = match hta_python() {
        Ok(p) => p,
        Err(why) => {
            uvmwatch_testbed::skip(name, &why);
            return;
        }
    };
    story_fixtures();
    let dir = tempfile::tempdir().unwrap();
    annotate_and_load_in_hta(
        &python,
        &fixtures().join("kineto_trace.json"),
        7,
        &dir.path().join("annotated.json"),
        true,
    );
}

/// A pid of a trace's CPU events (the process the profiler ran in).
fn profiled_pid(trace: &Path) -> u32 {
    let v: serde_json::Value = serde_json::from_slice(&trace_bytes(trace)).unwrap();
    let events = v["traceEvents"]
        .as_array()
        .or_else(|| v.as_array())
        .unwrap();
    events
        .iter()
        .filter(|e| e["ph"] == "X")
        .find_map(|e| e["pid"].as_u64())
        .expect("an event with an integer pid") as u32
}

#[test]
fn real_public_kineto_traces_annotated_still_load_in_hta() {
    // Real torch.profiler traces: the two of PyPI perfdigest-mcp 1.3.0's source archive
    // (Apache-2.0), which `cargo xtask setup` fetches into target/tools/kineto-traces and
    // checks by hash (public traces of other projects are not committed here);
    // `$UVMWATCH_KINETO_TRACES` names another directory of them (docs/capture.md lists the
    // ones checked, with their sources).
    let name = "real_public_kineto_traces_annotated_still_load_in_hta";
    let dir = std::env::var_os("UVMWATCH_KINETO_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/kineto-traces")
        });
    if !dir.is_dir() {
        uvmwatch_testbed::skip(
            name,
            &format!(
                "no public Kineto traces in {} (cargo xtask setup fetches them)",
                dir.display()
            ),
        );
        return;
    }
    let python = match hta_python() {
        Ok(p) => p,
        Err(why) => {
            uvmwatch_testbed::skip(name, &why);
            return;
        }
    };
    story_fixtures();
    let out_dir = tempfile::tempdir().unwrap();
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".json") || n.ends_with(".json.gz")
        })
        .collect();
    traces.sort();
    assert!(
        traces.len() >= 2,
        "fewer than two traces in {}",
        dir.display()
    );
    for t in &traces {
        let out = out_dir.path().join(
            t.file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".json", ".annotated.json"),
        );
        annotate_and_load_in_hta(&python, t, profiled_pid(t), &out, false);
        eprintln!("annotated and loaded in HTA: {}", t.display());
    }
}

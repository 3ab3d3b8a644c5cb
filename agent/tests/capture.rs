//! `uvmwatch capture` and `uvmwatch annotate`.
//!
//! - Perfetto captures are decoded with Perfetto's own proto definitions: the generated
//!   `perfetto_trace_pb2` module that the PyPI `perfetto` package ships (found through
//!   `$UVMWATCH_PERFETTO_PYTHON`, `target/tools/perfetto-venv/bin/python3` or `python3`; the test
//!   skips with the install command when none has it). Every byte must be known to those
//!   definitions (no unknown fields), and what they decode must match the capture.
//! - Chrome JSON captures are read as plain JSON (Trace Event Format).
//! - Golden files (`tests/fixtures/annotate/`): the capture writers' output for a fixed
//!   story, and `annotate` on a synthetic Kineto trace; `UVMWATCH_BLESS=1` rewrites them.
//! - Root only: the real agent captures the testbed's success and hang scenarios, and a
//!   capture interrupted by SIGINT still leaves a valid file.

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;
use uvmwatch::{
    clock::Clock,
    doctor::finding::{Confidence, Finding, Severity},
    event::{
        CallKind, CallSummary, CuinitEnd, Diagnosis, Event, Inside, Ioctl, Kind, Open, Process,
        Scan, Stall, ThreadSnapshot, Trigger,
    },
    export::{
        annotate::{self, TRACK_TID_BASE},
        capture::{
            self, chrome,
            model::{Capture, Meta},
            perfetto,
            recorder::Recorder,
            Format,
        },
    },
};
use uvmwatch_testbed::{
    FakeDev, FakeDevConfig, IoctlAction, IoctlRule, LibLocation, Scenario, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);
const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// The cuInit sequence of the test library on nvidia-uvm (as in e2e.rs).
const UVM_SEQUENCE: &[&str] = &[
    "UVM_INITIALIZE",
    "UVM_MM_INITIALIZE",
    "UVM_PAGEABLE_MEM_ACCESS",
    "UVM_REGISTER_GPU",
    "UVM_CREATE_RANGE_GROUP",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/annotate")
}

fn bless() -> bool {
    std::env::var_os("UVMWATCH_BLESS").is_some_and(|v| v == "1")
}

/// Compares `got` with the golden file `name` (rewritten under `UVMWATCH_BLESS=1`).
fn golden(name: &str, got: &[u8]) {
    let path = fixtures().join(name);
    if bless() {
        std::fs::create_dir_all(fixtures()).unwrap();
        std::fs::write(&path, got).unwrap();
        eprintln!("blessed {}", path.display());
        return;
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UVMWATCH_BLESS=1 writes it)", path.display()));
    if want != got {
        let out = std::env::temp_dir().join(format!("uvmwatch-golden-{name}"));
        std::fs::write(&out, got).unwrap();
        panic!(
            "{} differs from the golden file; got written to {} (UVMWATCH_BLESS=1 accepts it)",
            path.display(),
            out.display()
        );
    }
}

// --- Perfetto's own definitions ----------------------------------------------------------

/// Decodes a trace with `perfetto_trace_pb2` and prints what it holds as JSON: byte counts
/// with and without unknown fields, clock snapshots, tracks and track events.
const PERFETTO_DECODER: &str = r#"
import json, sys
from importlib import metadata
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

data = open(sys.argv[1], "rb").read()
trace = pb.Trace()
trace.ParseFromString(data)
known = pb.Trace()
known.CopyFrom(trace)
known.DiscardUnknownFields()

def opt(msg, field):
    return getattr(msg, field) if msg.HasField(field) else None

def arg(a):
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind else None

out = {
    "perfetto_version": metadata.version("perfetto"),
    "bytes": len(data),
    "known_bytes": known.ByteSize(),
    "snapshots": [],
    "tracks": [],
    "events": [],
    "first_packet": {
        "sequence_flags": opt(trace.packet[0], "sequence_flags") if trace.packet else None,
        "incremental_state_cleared": opt(trace.packet[0], "incremental_state_cleared") if trace.packet else None,
    },
    "sequences": sorted({p.trusted_packet_sequence_id for p in trace.packet}),
}
for p in trace.packet:
    kind = p.WhichOneof("data")
    if kind == "clock_snapshot":
        s = p.clock_snapshot
        out["snapshots"].append({
            "primary": opt(s, "primary_trace_clock"),
            "clocks": {str(c.clock_id): c.timestamp for c in s.clocks},
        })
    elif kind == "track_descriptor":
        d = p.track_descriptor
        t = {"uuid": d.uuid, "parent": opt(d, "parent_uuid"), "name": opt(d, "name")}
        if d.HasField("process"):
            t["process"] = {"pid": d.process.pid, "name": d.process.process_name,
                            "cmdline": list(d.process.cmdline),
                            "labels": list(d.process.process_labels)}
        if d.HasField("thread"):
            t["thread"] = {"pid": d.thread.pid, "tid": d.thread.tid, "name": d.thread.thread_name}
        if d.HasField("counter"):
            t["counter"] = {"unit": pb.CounterDescriptor.Unit.Name(d.counter.unit)}
        out["tracks"].append(t)
    elif kind == "track_event":
        e = p.track_event
        out["events"].append({
            "ts": p.timestamp,
            "clock": opt(p, "timestamp_clock_id"),
            "type": pb.TrackEvent.Type.Name(e.type),
            "track": e.track_uuid,
            "name": opt(e, "name"),
            "categories": list(e.categories),
            "args": {a.name: arg(a) for a in e.debug_annotations},
            "counter": opt(e, "counter_value"),
        })
print(json.dumps(out))
"#;

const PERFETTO_INSTALL: &str = "cargo xtask setup (installs perfetto==0.59.1 protobuf==7.36.2 \
     in target/tools/perfetto-venv)";

/// A Python interpreter that has the PyPI `perfetto` package, or why there is none.
fn perfetto_python() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("UVMWATCH_PERFETTO_PYTHON") {
        candidates.push(p.into());
    }
    candidates.push(root.join("target/tools/perfetto-venv/bin/python3"));
    candidates.push("python3".into());
    for c in &candidates {
        let ok = Command::new(c)
            .args([
                "-c",
                "import perfetto.protos.perfetto.trace.perfetto_trace_pb2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(c.clone());
        }
    }
    Err(format!(
        "no Python with the PyPI perfetto package (Perfetto's proto definitions); \
         install with `{PERFETTO_INSTALL}` or set UVMWATCH_PERFETTO_PYTHON"
    ))
}

/// Decodes `path` with Perfetto's definitions ([`PERFETTO_DECODER`]).
fn decode_with_perfetto(python: &Path, path: &Path) -> Value {
    let out = Command::new(python)
        .arg("-c")
        .arg(PERFETTO_DECODER)
        .arg(path)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "perfetto_trace_pb2 could not decode {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!(
        "decoded {} with perfetto {} (perfetto_trace_pb2)",
        path.display(),
        v["perfetto_version"]
    );
    v
}

// --- A format-independent view of a trace --------------------------------------------------

#[derive(Clone, Debug)]
struct Span {
    pid: u32,
    tid: u32,
    name: String,
    start: i128,
    end: i128,
    args: Value,
}

#[derive(Clone, Debug)]
struct Point {
    pid: u32,
    tid: Option<u32>,
    name: String,
    ts: i128,
    args: Value,
}

#[derive(Clone, Debug)]
struct CounterValue {
    pid: u32,
    name: String,
    value: i64,
}

/// What a decoded trace shows: processes, threads, slices, instants, counters.
#[derive(Debug, Default)]
struct View {
    processes: BTreeMap<u32, String>,
    threads: BTreeMap<(u32, u32), String>,
    slices: Vec<Span>,
    instants: Vec<Point>,
    counters: Vec<CounterValue>,
}

impl View {
    /// From [`PERFETTO_DECODER`]'s output; checks the sequence and clock invariants.
    fn from_perfetto(v: &Value) -> View {
        assert_eq!(
            v["bytes"], v["known_bytes"],
            "fields unknown to Perfetto's definitions"
        );
        assert_eq!(v["sequences"].as_array().unwrap().len(), 1);
        assert_eq!(v["first_packet"]["sequence_flags"], 1);
        assert_eq!(v["first_packet"]["incremental_state_cleared"], true);
        let snap = &v["snapshots"][0];
        assert_eq!(snap["primary"], 3, "MONOTONIC is the trace clock");
        for id in ["1", "3", "6"] {
            assert!(snap["clocks"][id].as_u64().unwrap() > 0, "clock {id}");
        }
        let mut view = View::default();
        enum Track {
            Process(u32),
            Thread(u32, u32),
            Counter(u32, String),
        }
        let mut tracks: BTreeMap<u64, Track> = BTreeMap::new();
        for t in v["tracks"].as_array().unwrap() {
            let uuid = t["uuid"].as_u64().unwrap();
            if let Some(p) = t.get("process") {
                let pid = p["pid"].as_u64().unwrap() as u32;
                view.processes
                    .insert(pid, p["name"].as_str().unwrap().to_string());
                tracks.insert(uuid, Track::Process(pid));
            } else if let Some(th) = t.get("thread") {
                let (pid, tid) = (
                    th["pid"].as_u64().unwrap() as u32,
                    th["tid"].as_u64().unwrap() as u32,
                );
                view.threads
                    .insert((pid, tid), th["name"].as_str().unwrap().to_string());
                tracks.insert(uuid, Track::Thread(pid, tid));
            } else if t.get("counter").is_some() {
                let parent = t["parent"].as_u64().expect("counter track has a parent");
                let Some(Track::Process(pid)) = tracks.get(&parent) else {
                    panic!("counter parent {parent} is not a process track");
                };
                tracks.insert(
                    uuid,
                    Track::Counter(*pid, t["name"].as_str().unwrap().to_string()),
                );
            }
        }
        let mut open: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
        let mut last = 0;
        for e in v["events"].as_array().unwrap() {
            assert_eq!(e["clock"], 3, "timed in CLOCK_MONOTONIC: {e}");
            let ts = e["ts"].as_u64().unwrap();
            assert!(ts >= last, "time order");
            last = ts;
            let uuid = e["track"].as_u64().unwrap();
            let track = tracks.get(&uuid).expect("event on a described track");
            let ts = ts as i128;
            let name = e["name"].as_str().unwrap_or_default().to_string();
            match (e["type"].as_str().unwrap(), track) {
                ("TYPE_SLICE_BEGIN", Track::Thread(pid, tid)) => {
                    open.entry(uuid).or_default().push(Span {
                        pid: *pid,
                        tid: *tid,
                        name,
                        start: ts,
                        end: ts,
                        args: e["args"].clone(),
                    })
                }
                ("TYPE_SLICE_END", _) => {
                    let mut s = open.get_mut(&uuid).and_then(Vec::pop).expect("begin");
                    s.end = ts;
                    view.slices.push(s);
                }
                ("TYPE_INSTANT", Track::Thread(pid, tid)) => view.instants.push(Point {
                    pid: *pid,
                    tid: Some(*tid),
                    name,
                    ts,
                    args: e["args"].clone(),
                }),
                ("TYPE_INSTANT", Track::Process(pid)) => view.instants.push(Point {
                    pid: *pid,
                    tid: None,
                    name,
                    ts,
                    args: e["args"].clone(),
                }),
                ("TYPE_COUNTER", Track::Counter(pid, cname)) => view.counters.push(CounterValue {
                    pid: *pid,
                    name: cname.clone(),
                    value: e["counter"].as_i64().unwrap(),
                }),
                (ty, _) => panic!("unexpected {ty} on its track: {e}"),
            }
        }
        assert!(open.values().all(Vec::is_empty), "every slice ended");
        view
    }

    /// From a Chrome JSON trace; checks the Trace Event Format basics.
    fn from_chrome(v: &Value) -> View {
        assert_eq!(v["displayTimeUnit"], "ns");
        let mut view = View::default();
        let ns = |x: &Value| (x.as_f64().unwrap() * 1000.0).round() as i128;
        for e in v["traceEvents"].as_array().unwrap() {
            let pid = e["pid"].as_u64().unwrap() as u32;
            let tid = e["tid"].as_u64().unwrap() as u32;
            let name = e["name"].as_str().unwrap().to_string();
            match e["ph"].as_str().unwrap() {
                "M" if name == "process_name" => {
                    view.processes
                        .insert(pid, e["args"]["name"].as_str().unwrap().into());
                }
                "M" if name == "thread_name" => {
                    view.threads
                        .insert((pid, tid), e["args"]["name"].as_str().unwrap().into());
                }
                "M" => {}
                "X" => view.slices.push(Span {
                    pid,
                    tid,
                    name,
                    start: ns(&e["ts"]),
                    end: ns(&e["ts"]) + ns(&e["dur"]),
                    args: e["args"].clone(),
                }),
                "i" => view.instants.push(Point {
                    pid,
                    tid: (e["s"] == "t").then_some(tid),
                    name,
                    ts: ns(&e["ts"]),
                    args: e["args"].clone(),
                }),
                "C" => view.counters.push(CounterValue {
                    pid,
                    name,
                    value: e["args"]["value"].as_i64().unwrap(),
                }),
                ph => panic!("unexpected phase {ph}"),
            }
        }
        view
    }

    fn slices_named(&self, pid: u32, name: &str) -> Vec<&Span> {
        self.slices
            .iter()
            .filter(|s| s.pid == pid && s.name == name)
            .collect()
    }

    fn instant(&self, pid: u32, name: &str) -> Option<&Point> {
        self.instants
            .iter()
            .find(|p| p.pid == pid && p.name == name)
    }

    fn counter_values(&self, pid: Option<u32>, name: &str) -> Vec<i64> {
        self.counters
            .iter()
            .filter(|c| c.name == name && pid.is_none_or(|p| c.pid == p))
            .map(|c| c.value)
            .collect()
    }
}

// --- A fixed story ---------------------------------------------------------------------------

/// Monotonic 1000 s at wall clock 1 750 000 000 s (2025-06-15).
fn story_clock() -> Clock {
    Clock {
        offset_ns: 1_750_000_000_000_000_000i128 - 1_000_000_000_000,
        mono_ns: 1_000_000_000_000,
        unix_ns: 1_750_000_000_000_000_000,
    }
}

/// A containerised `python3` (host pid 4242, pid 7 inside): two ioctls, then a cuInit
/// with an open and five ioctls on its main thread, a failed ioctl after it, and a worker thread whose
/// cuInit hangs in UVM_REGISTER_GPU (both stalls, a diagnosis) and is still running when
/// the capture ends; one drop report.
fn story() -> Capture {
    let clock = story_clock();
    let mut meta = Meta::starting(clock, clock.mono_ns + 5 * S, "comm=python3".into(), 999);
    meta.version = "uvmwatch (test)".into();
    let mut r = Recorder::new(
        meta,
        1000,
        Box::new(|pid, tid| (pid != tid).then(|| format!("pt_worker_{tid}"))),
    );
    let p = Arc::new(Process {
        pid: 4242,
        ns_pid: Some(7),
        comm: "python3".into(),
        exe: "/usr/bin/python3.11".into(),
        cmdline: vec![
            "python3".into(),
            "serve.py".into(),
            "--tp".into(),
            "1".into(),
        ],
        container_id: Some(
            "3f1c0ffee0ddba11c0ffee0ddba11c0ffee0ddba11c0ffee0ddba11c0ffee0d".into(),
        ),
        workload: Default::default(),
    });
    let at = |tid: u32, ts_ns: u64, kind: Kind| Event {
        ts_ns,
        process: Some(p.clone()),
        tid,
        comm: p.comm.clone(),
        kind,
    };
    let ioctl = |start_ns: u64, name: &str, node: &str, result: &str, failed, in_cuinit| {
        Kind::Ioctl(Ioctl {
            start_ns,
            cmd: 0,
            name: name.into(),
            label: "unknown",
            node: node.into(),
            result: result.into(),
            ret: 0,
            failed,
            slow: false,
            in_cuinit,
        })
    };
    let t0 = clock.mono_ns;
    let main = 4242;
    // Two driver calls before the profiler's base time (monotonic 1001 s in the Kineto
    // fixture): one well before, one slow one running across it.
    for (start, dur, name) in [
        (800 * MS, 10 * MS, "NV_ESC_CHECK_VERSION_STR"),
        (950 * MS, 100 * MS, "NV_ESC_RM_ALLOC"),
    ] {
        let k = ioctl(t0 + start, name, "/dev/nvidiactl", "NV_OK", false, false);
        r.record(&at(main, t0 + start + dur, k), 0);
    }
    let cuinit_start = t0 + 1_200 * MS;
    r.record(
        &at(
            main,
            cuinit_start,
            Kind::CuinitStart {
                start_ns: cuinit_start,
                flags: 0,
            },
        ),
        0,
    );
    let open = Kind::Open(Open {
        start_ns: t0 + 1_201 * MS,
        path: "/dev/nvidia-uvm".into(),
        node: "nvidia-uvm".into(),
        errno: None,
        ret: 3,
        in_cuinit: true,
        findings: vec![],
    });
    r.record(&at(main, t0 + 1_201 * MS + 40_000, open), 0);
    for (i, name) in UVM_SEQUENCE.iter().enumerate() {
        let s = t0 + 1_210 * MS + i as u64 * 15 * MS;
        let k = ioctl(s, name, "/dev/nvidia-uvm", "NV_OK", false, true);
        r.record(&at(main, s + 4 * MS + 123, k), 0);
    }
    let end = Kind::CuinitEnd(CuinitEnd {
        start_ns: cuinit_start,
        code: 0,
        result: "CUDA_SUCCESS".into(),
        entry_seen: true,
        call: CallSummary::default(),
        findings: vec![],
    });
    r.record(&at(main, t0 + 1_300 * MS, end), 0);
    let k = ioctl(
        t0 + 1_500 * MS,
        "NV_ESC_RM_CONTROL",
        "/dev/nvidiactl",
        "NV_ERR_INVALID_ARGUMENT",
        true,
        false,
    );
    r.record(&at(main, t0 + 1_500 * MS + 250_000, k), 0);
    let w = 4250;
    r.record(
        &at(
            w,
            t0 + 2 * S,
            Kind::CuinitStart {
                start_ns: t0 + 2 * S,
                flags: 0,
            },
        ),
        0,
    );
    for call in ["UVM_REGISTER_GPU", "cuInit"] {
        let (kind, start) = if call == "cuInit" {
            (CallKind::Cuinit, t0 + 2 * S)
        } else {
            (CallKind::Ioctl, t0 + 2 * S + 10 * MS)
        };
        let stall = Kind::Stall(Box::new(Stall {
            kind,
            call: call.into(),
            label: call.into(),
            start_ns: start,
            threshold_ns: 0,
            node: "/dev/nvidia-uvm".into(),
            inside: Some(Inside {
                call: "UVM_REGISTER_GPU".into(),
                node: "/dev/nvidia-uvm".into(),
                start_ns: t0 + 2 * S + 10 * MS,
            }),
            cuinit_start_ns: Some(t0 + 2 * S),
            thread: ThreadSnapshot {
                read: true,
                state: "D (disk sleep)".into(),
                wchan: "uvm_gpu_retain_by_uuid".into(),
                ..ThreadSnapshot::default()
            },
            call_so_far: None,
            findings: vec![],
        }));
        r.record(&at(w, t0 + 3 * S + 60 * MS, stall), 0);
    }
    let finding = Finding {
        rule: "uvm_register_gpu_hang".into(),
        title: "cuInit hangs registering the GPU with nvidia-uvm".into(),
        severity: Severity::Critical,
        confidence: Confidence::High,
        evidence: vec![],
        unchecked: vec![],
        fix: vec![],
        runbook: "docs/runbooks/uvm_register_gpu_hang.md".into(),
    };
    let d = Kind::Diagnosis(Diagnosis {
        finding: Arc::new(finding),
        trigger: Trigger::Stall,
    });
    r.record(&at(4242, t0 + 3 * S + 61 * MS, d), 0);
    let scan = Event::agent(
        t0 + 3 * S + 500 * MS,
        Kind::Scan(Scan {
            cuinit_in_flight: 1,
            dropped_total: 3,
            undecodable_total: 0,
        }),
    );
    r.record(&scan, t0 + 3 * S + 500 * MS);
    r.build(t0 + 4 * S)
}

/// The story's calls as both formats show them, checked against the model.
fn check_story_view(view: &View, c: &Capture) {
    assert_eq!(
        view.processes.get(&4242).map(String::as_str),
        Some("python3")
    );
    assert_eq!(
        view.processes.get(&999).map(String::as_str),
        Some("uvmwatch capture")
    );
    assert_eq!(view.threads.get(&(4242, 4250)).unwrap(), "pt_worker_4250");
    let model_slices = c
        .events
        .iter()
        .filter(|e| matches!(e.kind, capture::model::Kind::Slice { .. }))
        .count();
    assert_eq!(view.slices.len(), model_slices);
    for e in &c.events {
        if let capture::model::Kind::Slice { .. } = e.kind {
            assert!(
                view.slices.iter().any(|s| s.name == e.name
                    && s.pid == e.pid
                    && Some(s.tid) == e.tid
                    && s.start == e.ts_ns as i128
                    && s.end == e.end_ns() as i128),
                "slice {e:?} not decoded as such"
            );
        }
    }
    let cu = view
        .slices_named(4242, "cuInit")
        .into_iter()
        .find(|s| s.tid == 4242)
        .unwrap();
    for name in UVM_SEQUENCE {
        let s = view
            .slices_named(4242, name)
            .into_iter()
            .find(|s| s.tid == 4242)
            .unwrap();
        assert!(
            s.start >= cu.start && s.end <= cu.end,
            "{name} inside cuInit"
        );
        assert_eq!(s.args["node"], "/dev/nvidia-uvm");
        assert_eq!(s.args["result"], "NV_OK");
        assert_eq!(s.args["failed"], false);
    }
    let stall = view.instant(4242, "stall: cuInit").unwrap();
    assert_eq!(stall.tid, Some(4250));
    assert_eq!(stall.args["wchan"], "uvm_gpu_retain_by_uuid");
    assert_eq!(stall.args["age_ms"], 1060);
    let d = view
        .instant(4242, "diagnosis: uvm_register_gpu_hang")
        .unwrap();
    assert_eq!(d.tid, None);
    assert_eq!(d.args["severity"], "critical");
    assert_eq!(d.args["runbook"], "docs/runbooks/uvm_register_gpu_hang.md");
    let f = view.instant(4242, "failed: NV_ESC_RM_CONTROL").unwrap();
    assert_eq!(f.args["result"], "NV_ERR_INVALID_ARGUMENT");
    assert_eq!(
        view.counter_values(Some(999), "dropped events"),
        vec![0, 3, 3]
    );
    assert_eq!(
        view.counter_values(Some(999), "events lost by the capture"),
        vec![0, 0]
    );
    assert_eq!(
        view.counter_values(Some(4242), "ioctls per 100 ms"),
        vec![0, 1, 1, 0, 5, 0, 1, 0]
    );
    let started = view.instant(999, "capture started").unwrap();
    assert_eq!(
        started.args["clock_offset_ns"].as_i64().unwrap() as i128,
        c.meta.clock.offset_ns
    );
    let ended = view.instant(999, "capture ended").unwrap();
    assert_eq!(ended.args["dropped_events"], 3);
    assert_eq!(ended.args["lost_events"], 0);
}

// --- Tests without root ----------------------------------------------------------------------

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
fn story_fixtures() -> (Capture, String, Vec<u8>) {
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

#[test]
fn capture_cli_takes_one_process_filter() {
    let o = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args([
            "capture",
            "--pid",
            "1",
            "--comm",
            "x",
            "-o",
            "/tmp/never-written",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
}

// --- Root: the real agent ----------------------------------------------------------------------

/// A running `uvmwatch capture`, its JSON log read as it comes.
struct CaptureRun {
    child: Child,
    log: Arc<Mutex<Vec<Value>>>,
    raw: Arc<Mutex<Vec<String>>>,
    out: PathBuf,
    started: Instant,
}

impl CaptureRun {
    fn start(out: &Path, format: &str, extra: &[&str]) -> CaptureRun {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
            .args(["--log-format", "json", "--log-level", "info", "capture"])
            .args(["--format", format, "-o"])
            .arg(out)
            .args(["--cuinit-stall", "1s", "--ioctl-stall", "1s"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uvmwatch capture");
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<Value>>> = Default::default();
        let raw: Arc<Mutex<Vec<String>>> = Default::default();
        let (l2, r2) = (log.clone(), raw.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                r2.lock().unwrap().push(line.clone());
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l2.lock().unwrap().push(v);
                }
            }
        });
        let mut c = CaptureRun {
            child,
            log,
            raw,
            out: out.to_path_buf(),
            started: Instant::now(),
        };
        c.wait_log(
            "started",
            |v| v["event"] == "started",
            Duration::from_secs(30),
        );
        c.started = Instant::now();
        c
    }

    fn raw_log(&self) -> String {
        self.raw.lock().unwrap().join("\n")
    }

    fn wait_log(&self, what: &str, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = self.log.lock().unwrap().iter().find(|v| pred(v)) {
                return v.clone();
            }
            if Instant::now() > end {
                panic!(
                    "no {what} within {timeout:?}; capture log:\n{}",
                    self.raw_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit; returns whether it succeeded.
    fn wait(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!(
                    "capture still running after {timeout:?}:\n{}",
                    self.raw_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// The written file as a [`View`] (Perfetto: through Perfetto's definitions), and the
    /// capture as uvmwatch reads it back.
    fn view(&self, python: Option<&Path>) -> (View, Capture) {
        let bytes = std::fs::read(&self.out)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", self.out.display(), self.raw_log()));
        let leftovers: Vec<_> = std::fs::read_dir(self.out.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let back = capture::decode_capture(&bytes).expect("uvmwatch reads its capture back");
        let view = match python {
            Some(py) => View::from_perfetto(&decode_with_perfetto(py, &self.out)),
            None => View::from_chrome(&serde_json::from_slice(&bytes).unwrap()),
        };
        (view, back)
    }
}

impl Drop for CaptureRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn workload(dev: &FakeDev, scenario: Scenario) -> Workload {
    Workload::spawn(
        dev,
        common::artifacts(),
        WorkloadConfig {
            scenario,
            gpus: 1,
            wait_ms: 1500,
            lib_location: LibLocation::PrivateNamespace,
            fork_child: false,
            extra_env: vec![],
        },
    )
    .expect("spawn workload")
}

fn hang_dev() -> FakeDev {
    FakeDev::start(
        common::artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap()
}

/// The format's name on the command line and, for Perfetto, the decoder (or why not).
fn format_setup(test: &str, format: Format) -> Option<(&'static str, Option<PathBuf>)> {
    match format {
        Format::ChromeJson => Some(("chrome-json", None)),
        Format::Perfetto => match perfetto_python() {
            Ok(p) => Some(("perfetto", Some(p))),
            Err(why) => {
                uvmwatch_testbed::skip(test, &why);
                None
            }
        },
    }
}

/// Captures the success and the hang scenario at once for 6 s, the hang released 3.5 s
/// after its workload started; checks tracks, nesting, stalls and the drop counter.
fn success_and_hang(test: &str, format: Format) {
    let Some((fmt, python)) = format_setup(test, format) else {
        return;
    };
    let ok_dev = FakeDev::start(common::artifacts(), FakeDevConfig::default()).unwrap();
    let hang = hang_dev();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("capture.{fmt}"));
    let mut cap = CaptureRun::start(&out, fmt, &["--duration", "6s", "--comm", "cuda-workload"]);
    let mut ok = workload(&ok_dev, Scenario::Success);
    let spawned = Instant::now();
    let mut hung = workload(&hang, Scenario::HangRegisterGpu);
    assert_eq!(ok.next_cuinit_line(T).unwrap().rc, 0);
    cap.wait_log(
        "the hang's stall",
        |v| {
            v["event"] == "stall"
                && v["call"] == "UVM_REGISTER_GPU"
                && v["pid"].as_u64() == Some(hung.pid() as u64)
        },
        T,
    );
    let release_at = spawned + Duration::from_millis(3500);
    std::thread::sleep(release_at.saturating_duration_since(Instant::now()));
    hang.release().unwrap();
    assert_eq!(hung.next_cuinit_line(T).unwrap().rc, 0);
    let ended_before = cap.started.elapsed();
    assert!(
        ended_before < Duration::from_millis(5500),
        "the hang ended {ended_before:?} after the capture started: too late for a 6 s capture"
    );
    assert!(
        cap.wait(Duration::from_secs(30)),
        "capture failed:\n{}",
        cap.raw_log()
    );
    assert!(
        !cap.raw_log().contains("events from"),
        "no progress line when stderr is not a terminal"
    );
    let written = cap.wait_log("capture_written", |v| v["event"] == "capture_written", T);
    assert_eq!(written["dropped_events"], 0);
    let (view, back) = cap.view(python.as_deref());

    let (okp, hp) = (ok.pid(), hung.pid());
    for pid in [okp, hp] {
        assert_eq!(
            view.processes.get(&pid).map(String::as_str),
            Some("cuda-workload"),
            "process track of {pid}: {:?}",
            view.processes
        );
        assert!(
            view.threads.contains_key(&(pid, pid)),
            "thread track of {pid}"
        );
        assert_eq!(back.process(pid).unwrap().name, "cuda-workload");
    }
    // Only processes that pass the filter (other tests' workloads may run meanwhile).
    let agent = cap.child.id();
    for (pid, name) in &view.processes {
        assert!(
            *pid == agent || name == "cuda-workload",
            "process {pid} ({name}) does not match --comm cuda-workload"
        );
    }
    // Success: a cuInit slice holding the UVM_* ioctls, each on nvidia-uvm.
    let cu = view.slices_named(okp, "cuInit");
    assert_eq!(cu.len(), 1, "{:?}", view.slices);
    let cu = cu[0];
    assert_eq!(cu.args["result"], "CUDA_SUCCESS");
    for name in UVM_SEQUENCE {
        let s = view
            .slices_named(okp, name)
            .into_iter()
            .find(|s| s.tid == cu.tid)
            .unwrap_or_else(|| panic!("{name} slice missing: {:?}", view.slices));
        assert!(
            s.start >= cu.start && s.end <= cu.end,
            "{name} inside cuInit"
        );
        assert_eq!(s.args["node"], "/dev/nvidia-uvm");
        assert_eq!(s.args["result"], "NV_OK");
        assert_eq!(s.args["in_cuinit"], true);
    }
    assert!(
        view.counter_values(Some(okp), "ioctls per 100 ms")
            .iter()
            .sum::<i64>()
            >= UVM_SEQUENCE.len() as i64
    );
    // Hang: stall instants at detection time, inside the calls, before they ended.
    let hcu = view.slices_named(hp, "cuInit");
    assert_eq!(hcu.len(), 1);
    let hcu = hcu[0];
    assert_eq!(hcu.args["result"], "CUDA_SUCCESS");
    assert!(hcu.args.get("unfinished").is_none());
    let reg = view
        .slices_named(hp, "UVM_REGISTER_GPU")
        .into_iter()
        .find(|s| s.tid == hcu.tid)
        .unwrap();
    assert!(reg.start >= hcu.start && reg.end <= hcu.end);
    assert!(reg.end - reg.start >= S as i128, "the hang lasted");
    for (call, span) in [("cuInit", hcu), ("UVM_REGISTER_GPU", reg)] {
        let st = view
            .instant(hp, &format!("stall: {call}"))
            .unwrap_or_else(|| panic!("no stall instant for {call}: {:?}", view.instants));
        assert_eq!(st.tid, Some(hcu.tid));
        assert!(
            st.ts >= span.start + S as i128,
            "{call}: detected after the 1 s threshold"
        );
        assert!(st.ts < span.end, "{call}: detected before the call ended");
        assert_eq!(st.args["wchan"], "request_wait_answer");
        assert!(st.args["thread_state"].as_str().unwrap().starts_with('S'));
        let end = view.instant(hp, &format!("stall ended: {call}")).unwrap();
        assert_eq!(end.args["outcome"], "returned");
        assert_eq!(end.ts, span.end);
    }
    assert_eq!(
        view.instant(hp, "stall: cuInit").unwrap().args["inside"],
        "UVM_REGISTER_GPU on /dev/nvidia-uvm"
    );
    // The drop counter is there, at 0, and so is the metadata.
    let dropped = view.counter_values(None, "dropped events");
    assert!(!dropped.is_empty(), "dropped-events counter");
    assert!(dropped.iter().all(|v| *v == 0), "{dropped:?}");
    assert_eq!(back.meta.dropped_events, 0);
    assert_eq!(back.meta.lost_events, 0);
    assert_eq!(back.meta.filter, "comm=cuda-workload");
    let ended = view
        .instants
        .iter()
        .find(|p| p.name == "capture ended")
        .unwrap();
    assert_eq!(ended.args["dropped_events"], 0);
}

/// SIGINT while a cuInit hangs: exit 0 and a valid file whose hung calls are drawn up to
/// the end, marked unfinished.
fn sigint_mid_capture(test: &str, format: Format) {
    let Some((fmt, python)) = format_setup(test, format) else {
        return;
    };
    let hang = hang_dev();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("interrupted.{fmt}"));
    let mut cap = CaptureRun::start(&out, fmt, &["--duration", "60s"]);
    let hung = workload(&hang, Scenario::HangRegisterGpu);
    let hp = hung.pid();
    cap.wait_log(
        "stall",
        |v| {
            v["event"] == "stall"
                && v["call"] == "UVM_REGISTER_GPU"
                && v["pid"].as_u64() == Some(hp as u64)
        },
        T,
    );
    std::thread::sleep(
        Duration::from_secs(2).saturating_sub(cap.started.elapsed()) + Duration::from_millis(200),
    );
    cap.signal(libc::SIGINT);
    assert!(
        cap.wait(Duration::from_secs(20)),
        "capture failed:\n{}",
        cap.raw_log()
    );
    let (view, back) = cap.view(python.as_deref());
    hang.release().unwrap();
    let cu = view.slices_named(hp, "cuInit");
    assert_eq!(cu.len(), 1, "{:?}", view.slices);
    assert_eq!(cu[0].args["unfinished"], true);
    let reg = view.slices_named(hp, "UVM_REGISTER_GPU");
    assert_eq!(reg.len(), 1);
    assert_eq!(reg[0].args["unfinished"], true);
    assert_eq!(reg[0].args["node"], "/dev/nvidia-uvm");
    assert!(view.instant(hp, "stall: UVM_REGISTER_GPU").is_some());
    assert!(!view.counter_values(None, "dropped events").is_empty());
    assert!(view.instants.iter().any(|p| p.name == "capture ended"));
    assert!(back.meta.end_ns > back.meta.start_ns);
    assert_eq!(cu[0].end, back.meta.end_ns as i128);
}

#[test]
fn capture_perfetto_success_and_hang() {
    require_env!("capture_perfetto_success_and_hang");
    success_and_hang("capture_perfetto_success_and_hang", Format::Perfetto);
}

#[test]
fn capture_chrome_json_success_and_hang() {
    require_env!("capture_chrome_json_success_and_hang");
    success_and_hang("capture_chrome_json_success_and_hang", Format::ChromeJson);
}

#[test]
fn capture_perfetto_sigint_leaves_a_valid_file() {
    require_env!("capture_perfetto_sigint_leaves_a_valid_file");
    sigint_mid_capture(
        "capture_perfetto_sigint_leaves_a_valid_file",
        Format::Perfetto,
    );
}

#[test]
fn capture_chrome_json_sigint_leaves_a_valid_file() {
    require_env!("capture_chrome_json_sigint_leaves_a_valid_file");
    sigint_mid_capture(
        "capture_chrome_json_sigint_leaves_a_valid_file",
        Format::ChromeJson,
    );
}

//! What a capture file shows: Perfetto's own decoder (`perfetto_trace_pb2`) or plain Chrome
//! JSON, read into one [`View`] of processes, slices, instants and counters.

use super::*;

/// Decodes a trace with `perfetto_trace_pb2` and prints what it holds as JSON: byte counts
/// with and without unknown fields, clock snapshots, tracks and track events.
pub(crate) const PERFETTO_DECODER: &str = r#"
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

pub(crate) const PERFETTO_INSTALL: &str =
    "cargo xtask setup (installs perfetto==0.59.1 protobuf==7.36.2 \
     in target/tools/perfetto-venv)";

/// A Python interpreter that has the PyPI `perfetto` package, or why there is none.
pub(crate) fn perfetto_python() -> Result<PathBuf, String> {
    common::tool_python(
        "UVMWATCH_PERFETTO_PYTHON",
        "target/tools/perfetto-venv",
        "import perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        true,
    )
    .ok_or_else(|| {
        format!(
            "no Python with the PyPI perfetto package (Perfetto's proto definitions); \
             install with `{PERFETTO_INSTALL}` or set UVMWATCH_PERFETTO_PYTHON"
        )
    })
}

/// Decodes `path` with Perfetto's definitions ([`PERFETTO_DECODER`]).
pub(crate) fn decode_with_perfetto(python: &Path, path: &Path) -> Value {
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
pub(crate) struct Span {
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    pub(crate) name: String,
    pub(crate) start: i128,
    pub(crate) end: i128,
    pub(crate) args: Value,
}

#[derive(Clone, Debug)]
pub(crate) struct Point {
    pub(crate) pid: u32,
    pub(crate) tid: Option<u32>,
    pub(crate) name: String,
    pub(crate) ts: i128,
    pub(crate) args: Value,
}

#[derive(Clone, Debug)]
pub(crate) struct CounterValue {
    pub(crate) pid: u32,
    pub(crate) name: String,
    pub(crate) value: i64,
}

/// What a decoded trace shows: processes, threads, slices, instants, counters.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) processes: BTreeMap<u32, String>,
    pub(crate) threads: BTreeMap<(u32, u32), String>,
    pub(crate) slices: Vec<Span>,
    pub(crate) instants: Vec<Point>,
    pub(crate) counters: Vec<CounterValue>,
}

impl View {
    /// From [`PERFETTO_DECODER`]'s output; checks the sequence and clock invariants.
    pub(crate) fn from_perfetto(v: &Value) -> View {
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
    pub(crate) fn from_chrome(v: &Value) -> View {
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

    pub(crate) fn slices_named(&self, pid: u32, name: &str) -> Vec<&Span> {
        self.slices
            .iter()
            .filter(|s| s.pid == pid && s.name == name)
            .collect()
    }

    pub(crate) fn instant(&self, pid: u32, name: &str) -> Option<&Point> {
        self.instants
            .iter()
            .find(|p| p.pid == pid && p.name == name)
    }

    pub(crate) fn counter_values(&self, pid: Option<u32>, name: &str) -> Vec<i64> {
        self.counters
            .iter()
            .filter(|c| c.name == name && pid.is_none_or(|p| c.pid == p))
            .map(|c| c.value)
            .collect()
    }
}

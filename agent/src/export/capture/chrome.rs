//! Chrome JSON trace files (the Trace Event Format that `chrome://tracing`, Perfetto and
//! the PyTorch profiler use): a [`Capture`] written and read back.
//!
//! The file is one object: `displayTimeUnit`, a `uvmwatch` object with the capture's
//! metadata (clock offset, processes with their host and namespace pids, drop totals),
//! and `traceEvents`: `M` events naming processes and threads, `X` events for calls,
//! `i` events for failures, stalls and diagnoses, `C` events for counters. `ts` and `dur`
//! are microseconds with three decimals, so nanoseconds survive ([`Micros`], written from
//! integer nanoseconds, never through a float); `ts` is `CLOCK_MONOTONIC`. Each object is
//! serialized (serde) from a struct whose fields are its keys in order, compact, one event
//! per line. [`decode`] reads the file back as a [`serde_json::Value`].

use anyhow::{bail, Context, Result};
use serde::{ser::Error as _, Serialize, Serializer};
use serde_json::{value::RawValue, Value};

use super::model::{Arg, Capture, Event, Kind, Meta, Process, Thread, AGENT_PROCESS_NAME};
use crate::event::Clock;

/// Microseconds with three decimals from signed nanoseconds, exactly (`-1.500`).
pub fn micros(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// Nanoseconds from a JSON number of microseconds.
pub fn nanos(v: &Value) -> Option<i128> {
    if let Some(i) = v.as_i64() {
        return Some(i as i128 * 1000);
    }
    v.as_f64().map(|f| (f * 1000.0).round() as i128)
}

/// A time or duration in exact microseconds, from nanoseconds: serialized as the JSON
/// number that [`micros`] writes (`1234.567`), never through a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Micros(pub i128);

impl Serialize for Micros {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        RawValue::from_string(micros(self.0))
            .map_err(S::Error::custom)?
            .serialize(s)
    }
}

/// `v` as compact JSON. What this module serializes (structs with string keys, valid raw
/// numbers) always serializes, so a failure is a bug here.
pub fn to_json(v: &impl Serialize) -> String {
    serde_json::to_string(v).expect("trace JSON serializes")
}

/// An event's arguments: a JSON object with the members in the list's order.
struct Args<'a>(&'a [(String, Arg)]);

impl Serialize for Args<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl Serialize for Arg {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Arg::Str(v) => s.serialize_str(v),
            Arg::Int(v) => s.serialize_i64(*v),
            Arg::Uint(v) => s.serialize_u64(*v),
            Arg::Bool(v) => s.serialize_bool(*v),
        }
    }
}

/// The `args` of an `X`, `i` or `C` event.
#[derive(Serialize)]
#[serde(untagged)]
enum EventArgs<'a> {
    /// A slice's or an instant's arguments.
    Args(Args<'a>),
    /// A counter's value.
    Counter { value: i64 },
}

/// An `X`, `i` or `C` event; the members in this order.
#[derive(Serialize)]
struct TraceEvent<'a> {
    ph: &'static str,
    /// An instant's scope: `t` (thread) or `p` (process).
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    name: &'a str,
    cat: &'a str,
    pid: u32,
    tid: u32,
    ts: Micros,
    /// A slice's duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<Micros>,
    args: EventArgs<'a>,
}

/// One event as a Trace Event Format object, with its pid, tid, timestamp (ns on the
/// trace's time base, written as µs) and category chosen by the caller (the annotator
/// maps them).
pub fn event_json(e: &Event, pid: u32, tid: u32, ts_ns: i128, cat: &str) -> String {
    let (ph, s, dur, args) = match e.kind {
        Kind::Slice { dur_ns } => (
            "X",
            None,
            Some(Micros(dur_ns as i128)),
            EventArgs::Args(Args(&e.args)),
        ),
        Kind::Instant => (
            "i",
            Some(if e.tid.is_some() { "t" } else { "p" }),
            None,
            EventArgs::Args(Args(&e.args)),
        ),
        Kind::Counter { value } => ("C", None, None, EventArgs::Counter { value }),
    };
    to_json(&TraceEvent {
        ph,
        s,
        name: &e.name,
        cat,
        pid,
        tid,
        ts: Micros(ts_ns),
        dur,
        args,
    })
}

/// A metadata (`M`) event: what it names, with its one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metadata<'a> {
    /// `process_name`, `{"name": …}`.
    ProcessName(&'a str),
    /// `process_labels`, `{"labels": …}`.
    ProcessLabels(&'a str),
    /// `thread_name`, `{"name": …}`.
    ThreadName(&'a str),
    /// `thread_sort_index`, `{"sort_index": …}`.
    ThreadSortIndex(i64),
}

/// The one argument of a metadata event, as `{"<key>": value}`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum MetadataArg<'a> {
    Name(&'a str),
    Labels(&'a str),
    SortIndex(i64),
}

/// A metadata event; the members in this order.
#[derive(Serialize)]
struct MetadataEvent<'a> {
    ph: &'static str,
    name: &'static str,
    pid: u32,
    tid: u32,
    args: MetadataArg<'a>,
}

/// A metadata (`M`) event of `pid` and `tid`.
pub fn metadata_json(m: Metadata, pid: u32, tid: u32) -> String {
    let (name, args) = match m {
        Metadata::ProcessName(n) => ("process_name", MetadataArg::Name(n)),
        Metadata::ProcessLabels(l) => ("process_labels", MetadataArg::Labels(l)),
        Metadata::ThreadName(n) => ("thread_name", MetadataArg::Name(n)),
        Metadata::ThreadSortIndex(i) => ("thread_sort_index", MetadataArg::SortIndex(i)),
    };
    to_json(&MetadataEvent {
        ph: "M",
        name,
        pid,
        tid,
        args,
    })
}

/// The file's `uvmwatch` member: the capture's [`Meta`], processes and threads.
#[derive(Serialize)]
struct FileMeta<'a> {
    version: &'a str,
    filter: &'a str,
    clock_domain: &'static str,
    clock: FileClock,
    start_ns: u64,
    end_ns: u64,
    dropped_events: u64,
    lost_events: u64,
    agent_pid: u32,
    processes: Vec<FileProcess<'a>>,
    threads: Vec<FileThread<'a>>,
}

/// `uvmwatch.clock`: the clocks read together when the capture started.
#[derive(Serialize)]
struct FileClock {
    offset_ns: i128,
    monotonic_ns: u64,
    realtime_ns: u64,
    boottime_ns: u64,
}

/// One of `uvmwatch.processes`.
#[derive(Serialize)]
struct FileProcess<'a> {
    pid: u32,
    ns_pid: Option<u32>,
    comm: &'a str,
    exe: &'a str,
    cmdline: &'a [String],
    container_id: Option<&'a str>,
}

/// One of `uvmwatch.threads`.
#[derive(Serialize)]
struct FileThread<'a> {
    pid: u32,
    tid: u32,
    name: &'a str,
}

fn file_meta(c: &Capture) -> FileMeta<'_> {
    let m = &c.meta;
    FileMeta {
        version: &m.version,
        filter: &m.filter,
        clock_domain: "CLOCK_MONOTONIC",
        clock: FileClock {
            offset_ns: m.clock.offset_ns,
            monotonic_ns: m.clock.mono_ns,
            realtime_ns: m.clock.unix_ns,
            boottime_ns: m.boottime_ns,
        },
        start_ns: m.start_ns,
        end_ns: m.end_ns,
        dropped_events: m.dropped_events,
        lost_events: m.lost_events,
        agent_pid: m.agent_pid,
        processes: c
            .processes
            .iter()
            .map(|p| FileProcess {
                pid: p.pid,
                ns_pid: p.ns_pid,
                comm: &p.name,
                exe: &p.exe,
                cmdline: &p.cmdline,
                container_id: p.container_id.as_deref(),
            })
            .collect(),
        threads: c
            .threads
            .iter()
            .map(|t| FileThread {
                pid: t.pid,
                tid: t.tid,
                name: &t.name,
            })
            .collect(),
    }
}

/// A human label for a process: `ns pid 7, container 3f1c0ffee0dd`.
pub fn process_label(p: &Process) -> String {
    let mut l = Vec::new();
    if let Some(n) = p.ns_pid {
        l.push(format!("ns pid {n}"));
    }
    if let Some(c) = &p.container_id {
        l.push(format!(
            "container {}",
            c.chars().take(12).collect::<String>()
        ));
    }
    l.join(", ")
}

/// The capture as a Chrome JSON trace: each member of the top-level object on a line of
/// its own, and each event.
pub fn encode(c: &Capture) -> String {
    let m = &c.meta;
    let mut lines = vec![metadata_json(
        Metadata::ProcessName(AGENT_PROCESS_NAME),
        m.agent_pid,
        0,
    )];
    for p in &c.processes {
        lines.push(metadata_json(Metadata::ProcessName(&p.name), p.pid, 0));
        let label = process_label(p);
        if !label.is_empty() {
            lines.push(metadata_json(Metadata::ProcessLabels(&label), p.pid, 0));
        }
    }
    for t in &c.threads {
        lines.push(metadata_json(Metadata::ThreadName(&t.name), t.pid, t.tid));
    }
    for e in &c.events {
        lines.push(event_json(
            e,
            e.pid,
            e.tid.unwrap_or(e.pid),
            e.ts_ns as i128,
            &e.cat,
        ));
    }
    format!(
        "{{\"displayTimeUnit\":\"ns\",\n\"uvmwatch\":{},\n\"traceEvents\":[\n{}\n]}}\n",
        to_json(&file_meta(c)),
        lines.join(",\n")
    )
}

fn u64_of(v: &Value, what: &str) -> Result<u64> {
    v.as_u64()
        .with_context(|| format!("uvmwatch.{what} is not a number"))
}

fn read_arg(v: &Value) -> Arg {
    match v {
        Value::String(s) => Arg::Str(s.clone()),
        Value::Bool(b) => Arg::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Arg::Int(i),
            (None, Some(u)) => Arg::Uint(u),
            _ => Arg::Str(n.to_string()),
        },
        other => Arg::Str(other.to_string()),
    }
}

/// Reads a capture written by [`encode`] back.
///
/// # Errors
/// Not JSON, or not a uvmwatch capture (no `uvmwatch` metadata).
pub fn decode(text: &str) -> Result<Capture> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    let m = v
        .get("uvmwatch")
        .context("no \"uvmwatch\" metadata: not a uvmwatch capture")?;
    let clock = &m["clock"];
    let offset = clock["offset_ns"]
        .as_i64()
        .context("uvmwatch.clock.offset_ns is not a number")?;
    let meta = Meta {
        version: m["version"].as_str().unwrap_or_default().to_string(),
        clock: Clock {
            offset_ns: offset as i128,
            mono_ns: u64_of(&clock["monotonic_ns"], "clock.monotonic_ns")?,
            unix_ns: u64_of(&clock["realtime_ns"], "clock.realtime_ns")?,
        },
        boottime_ns: u64_of(&clock["boottime_ns"], "clock.boottime_ns")?,
        start_ns: u64_of(&m["start_ns"], "start_ns")?,
        end_ns: u64_of(&m["end_ns"], "end_ns")?,
        filter: m["filter"].as_str().unwrap_or_default().to_string(),
        dropped_events: u64_of(&m["dropped_events"], "dropped_events")?,
        lost_events: u64_of(&m["lost_events"], "lost_events")?,
        agent_pid: u64_of(&m["agent_pid"], "agent_pid")? as u32,
    };
    let processes = m["processes"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|p| Process {
            pid: p["pid"].as_u64().unwrap_or(0) as u32,
            ns_pid: p["ns_pid"].as_u64().map(|n| n as u32),
            name: p["comm"].as_str().unwrap_or_default().to_string(),
            exe: p["exe"].as_str().unwrap_or_default().to_string(),
            cmdline: p["cmdline"]
                .as_array()
                .map(|a| a.as_slice())
                .unwrap_or_default()
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
            container_id: p["container_id"].as_str().map(str::to_string),
        })
        .collect();
    let threads = m["threads"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|t| Thread {
            pid: t["pid"].as_u64().unwrap_or(0) as u32,
            tid: t["tid"].as_u64().unwrap_or(0) as u32,
            name: t["name"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    let Some(list) = v["traceEvents"].as_array() else {
        bail!("no traceEvents array");
    };
    let mut events = Vec::new();
    for e in list {
        let ph = e["ph"].as_str().unwrap_or_default();
        if ph == "M" {
            continue;
        }
        let ts = nanos(&e["ts"]).context("event without ts")?;
        let pid = e["pid"].as_u64().unwrap_or(0) as u32;
        let tid = e["tid"].as_u64().map(|t| t as u32);
        let args: Vec<(String, Arg)> = e["args"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), read_arg(v))).collect())
            .unwrap_or_default();
        let (kind, tid, args) = match ph {
            "X" => (
                Kind::Slice {
                    dur_ns: nanos(&e["dur"]).unwrap_or(0).max(0) as u64,
                },
                tid,
                args,
            ),
            "i" | "I" => (Kind::Instant, if e["s"] == "p" { None } else { tid }, args),
            "C" => (
                Kind::Counter {
                    value: e["args"]["value"].as_i64().unwrap_or(0),
                },
                None,
                Vec::new(),
            ),
            other => bail!("unexpected event phase {other:?}"),
        };
        let mut args = args;
        args.sort_by(|a, b| a.0.cmp(&b.0));
        events.push(Event {
            ts_ns: ts.max(0) as u64,
            pid,
            tid,
            name: e["name"].as_str().unwrap_or_default().to_string(),
            cat: e["cat"].as_str().unwrap_or_default().to_string(),
            kind,
            args,
        });
    }
    Ok(Capture::normalized(meta, processes, threads, events))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::capture::testing::story;

    #[test]
    fn micros_are_exact() {
        assert_eq!(micros(0), "0.000");
        assert_eq!(micros(1_234_567), "1234.567");
        assert_eq!(micros(-1_500), "-1.500");
        assert_eq!(micros(999), "0.999");
    }

    #[test]
    fn writes_keys_in_order_escaped_and_exact_numbers() {
        let mut e = Event {
            ts_ns: 0,
            pid: 1,
            tid: Some(2),
            name: "a\"b\\c\u{1}\né".into(),
            cat: "ignored".into(),
            kind: Kind::Slice { dur_ns: 1_500 },
            args: vec![
                ("z".into(), Arg::Uint(u64::MAX)),
                ("neg".into(), Arg::Int(i64::MIN)),
                ("a".into(), Arg::Bool(true)),
                ("s".into(), Arg::from("tab\t/")),
            ],
        };
        assert_eq!(
            event_json(&e, 7, 8, -1_500, "c"),
            r#"{"ph":"X","name":"a\"b\\c\u0001\né","cat":"c","pid":7,"tid":8,"ts":-1.500,"dur":1.500,"args":{"z":18446744073709551615,"neg":-9223372036854775808,"a":true,"s":"tab\t/"}}"#
        );
        e.name = "n".into();
        e.kind = Kind::Instant;
        e.args.clear();
        assert_eq!(
            event_json(&e, 7, 8, 1_000_000_000_000_001, "c"),
            r#"{"ph":"i","s":"t","name":"n","cat":"c","pid":7,"tid":8,"ts":1000000000000.001,"args":{}}"#
        );
        e.tid = None;
        assert!(event_json(&e, 7, 7, 0, "c").starts_with(r#"{"ph":"i","s":"p","#));
        e.kind = Kind::Counter { value: -3 };
        assert_eq!(
            event_json(&e, 7, 7, 0, "c"),
            r#"{"ph":"C","name":"n","cat":"c","pid":7,"tid":7,"ts":0.000,"args":{"value":-3}}"#
        );
        assert_eq!(
            metadata_json(Metadata::ThreadSortIndex(-1000), 7, 9),
            r#"{"ph":"M","name":"thread_sort_index","pid":7,"tid":9,"args":{"sort_index":-1000}}"#
        );
        assert_eq!(
            metadata_json(Metadata::ProcessLabels("l"), 7, 0),
            r#"{"ph":"M","name":"process_labels","pid":7,"tid":0,"args":{"labels":"l"}}"#
        );
    }

    #[test]
    fn round_trips() {
        let c = story();
        let text = encode(&c);
        let back = decode(&text).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn is_trace_event_format() {
        let c = story();
        let v: Value = serde_json::from_str(&encode(&c)).unwrap();
        assert_eq!(v["displayTimeUnit"], "ns");
        let evs = v["traceEvents"].as_array().unwrap();
        for e in evs {
            let ph = e["ph"].as_str().unwrap();
            assert!(["M", "X", "i", "C"].contains(&ph), "{e}");
            assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
            if ph != "M" {
                assert!(e["ts"].is_f64(), "{e}");
            }
            if ph == "X" {
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
            }
        }
        let names: Vec<&str> = evs
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["args"]["name"].as_str().unwrap_or(""))
            .collect();
        assert!(names.contains(&"python3"));
        assert!(names.contains(&"worker-4250"));
        assert!(names.contains(&AGENT_PROCESS_NAME));
        let labels = evs.iter().find(|e| e["name"] == "process_labels").unwrap();
        assert_eq!(labels["args"]["labels"], "ns pid 7, container 3f1c0ffee0dd");
        assert_eq!(v["uvmwatch"]["processes"][0]["ns_pid"], 7);
        assert_eq!(v["uvmwatch"]["dropped_events"], 3);
    }

    #[test]
    fn rejects_what_is_not_a_capture() {
        assert!(decode("{\"traceEvents\":[]}").is_err());
        assert!(decode("nope").is_err());
    }
}

//! Chrome JSON trace files (the Trace Event Format that `chrome://tracing`, Perfetto and
//! the PyTorch profiler use): a [`Capture`] written and read back.
//!
//! The file is one object: `displayTimeUnit`, a `uvmwatch` object with the capture's
//! metadata (clock offset, processes with their host and namespace pids, drop totals),
//! and `traceEvents`: `M` events naming processes and threads, `X` events for calls,
//! `i` events for failures, stalls and diagnoses, `C` events for counters. `ts` and `dur`
//! are microseconds with three decimals, so nanoseconds survive; `ts` is
//! `CLOCK_MONOTONIC`. Keys are written in a fixed order, one event per line.

use anyhow::{bail, Context, Result};
use serde_json::Value;

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

/// A JSON string literal.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A JSON object written key by key in the order given (values are raw JSON).
#[derive(Default)]
pub struct Obj(Vec<(String, String)>);

impl Obj {
    /// An empty object.
    pub fn new() -> Obj {
        Obj::default()
    }

    /// Adds `key: raw` (raw must be valid JSON).
    pub fn raw(mut self, key: &str, raw: impl Into<String>) -> Obj {
        self.0.push((key.to_string(), raw.into()));
        self
    }

    /// Adds a string member.
    pub fn str(self, key: &str, v: &str) -> Obj {
        self.raw(key, quote(v))
    }

    /// Adds an integer member.
    pub fn int(self, key: &str, v: impl std::fmt::Display) -> Obj {
        self.raw(key, v.to_string())
    }

    /// The object as compact JSON.
    pub fn finish(&self) -> String {
        let members: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{}", quote(k), v))
            .collect();
        format!("{{{}}}", members.join(","))
    }
}

fn arg_json(v: &Arg) -> String {
    match v {
        Arg::Str(s) => quote(s),
        Arg::Int(i) => i.to_string(),
        Arg::Uint(u) => u.to_string(),
        Arg::Bool(b) => b.to_string(),
    }
}

/// The `args` object of an event.
pub fn args_json(args: &[(String, Arg)]) -> String {
    args.iter()
        .fold(Obj::new(), |o, (k, v)| o.raw(k, arg_json(v)))
        .finish()
}

/// One event as a Trace Event Format object, with its pid, tid, timestamp (raw JSON
/// number of µs) and category chosen by the caller (the annotator maps them).
pub fn event_json(e: &Event, pid: u32, tid: u32, ts: &str, cat: &str) -> String {
    let o = Obj::new();
    let o = match e.kind {
        Kind::Slice { dur_ns } => o
            .str("ph", "X")
            .str("name", &e.name)
            .str("cat", cat)
            .int("pid", pid)
            .int("tid", tid)
            .raw("ts", ts)
            .raw("dur", micros(dur_ns as i128))
            .raw("args", args_json(&e.args)),
        Kind::Instant => o
            .str("ph", "i")
            .str("s", if e.tid.is_some() { "t" } else { "p" })
            .str("name", &e.name)
            .str("cat", cat)
            .int("pid", pid)
            .int("tid", tid)
            .raw("ts", ts)
            .raw("args", args_json(&e.args)),
        Kind::Counter { value } => o
            .str("ph", "C")
            .str("name", &e.name)
            .str("cat", cat)
            .int("pid", pid)
            .int("tid", tid)
            .raw("ts", ts)
            .raw("args", Obj::new().int("value", value).finish()),
    };
    o.finish()
}

/// A metadata (`M`) event: `process_name`, `thread_name`, `process_labels`,
/// `thread_sort_index`...
pub fn metadata_json(name: &str, pid: u32, tid: u32, args: Obj) -> String {
    Obj::new()
        .str("ph", "M")
        .str("name", name)
        .int("pid", pid)
        .int("tid", tid)
        .raw("args", args.finish())
        .finish()
}

fn opt_u32(v: Option<u32>) -> String {
    v.map(|n| n.to_string()).unwrap_or_else(|| "null".into())
}

fn meta_json(c: &Capture) -> String {
    let m = &c.meta;
    let processes: Vec<String> = c
        .processes
        .iter()
        .map(|p| {
            let cmd: Vec<String> = p.cmdline.iter().map(|s| quote(s)).collect();
            Obj::new()
                .int("pid", p.pid)
                .raw("ns_pid", opt_u32(p.ns_pid))
                .str("comm", &p.name)
                .str("exe", &p.exe)
                .raw("cmdline", format!("[{}]", cmd.join(",")))
                .raw(
                    "container_id",
                    p.container_id
                        .as_deref()
                        .map(quote)
                        .unwrap_or_else(|| "null".into()),
                )
                .finish()
        })
        .collect();
    let threads: Vec<String> = c
        .threads
        .iter()
        .map(|t| {
            Obj::new()
                .int("pid", t.pid)
                .int("tid", t.tid)
                .str("name", &t.name)
                .finish()
        })
        .collect();
    Obj::new()
        .str("version", &m.version)
        .str("filter", &m.filter)
        .str("clock_domain", "CLOCK_MONOTONIC")
        .raw(
            "clock",
            Obj::new()
                .int("offset_ns", m.clock.offset_ns)
                .int("monotonic_ns", m.clock.mono_ns)
                .int("realtime_ns", m.clock.unix_ns)
                .int("boottime_ns", m.boottime_ns)
                .finish(),
        )
        .int("start_ns", m.start_ns)
        .int("end_ns", m.end_ns)
        .int("dropped_events", m.dropped_events)
        .int("lost_events", m.lost_events)
        .int("agent_pid", m.agent_pid)
        .raw("processes", format!("[{}]", processes.join(",")))
        .raw("threads", format!("[{}]", threads.join(",")))
        .finish()
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

/// The capture as a Chrome JSON trace.
pub fn encode(c: &Capture) -> String {
    let m = &c.meta;
    let mut lines = vec![metadata_json(
        "process_name",
        m.agent_pid,
        0,
        Obj::new().str("name", AGENT_PROCESS_NAME),
    )];
    for p in &c.processes {
        lines.push(metadata_json(
            "process_name",
            p.pid,
            0,
            Obj::new().str("name", &p.name),
        ));
        let label = process_label(p);
        if !label.is_empty() {
            lines.push(metadata_json(
                "process_labels",
                p.pid,
                0,
                Obj::new().str("labels", &label),
            ));
        }
    }
    for t in &c.threads {
        lines.push(metadata_json(
            "thread_name",
            t.pid,
            t.tid,
            Obj::new().str("name", &t.name),
        ));
    }
    for e in &c.events {
        lines.push(event_json(
            e,
            e.pid,
            e.tid.unwrap_or(e.pid),
            &micros(e.ts_ns as i128),
            &e.cat,
        ));
    }
    format!(
        "{{\"displayTimeUnit\":\"ns\",\n\"uvmwatch\":{},\n\"traceEvents\":[\n{}\n]}}\n",
        meta_json(c),
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
    let mut c = Capture {
        meta,
        processes,
        threads,
        events,
    };
    c.normalize();
    Ok(c)
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

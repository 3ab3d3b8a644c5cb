//! `uvmwatch annotate`: merges a capture's driver activity into a PyTorch profiler
//! (Kineto) Chrome trace of the same run.
//!
//! Each captured process is matched to the profiler's process by the pid the process
//! sees for itself (the last `NSpid` entry, which the capture records beside the host
//! pid), so a workload in a container lines up. Capture times (`CLOCK_MONOTONIC`) become
//! wall-clock time with the offset measured when the capture started, then Kineto time:
//! microseconds relative to the trace's `baseTimeNanoseconds` (or since the Unix epoch in
//! traces without it). The uvmwatch events go on their own thread tracks under the
//! matched process (`uvmwatch: <thread> (host tid N)`), with `uvmwatch,<category>`
//! categories, so they never break the nesting of the profiler's own slices.
//!
//! Perfetto drops events with negative timestamps, so by default what precedes
//! `baseTimeNanoseconds` is left out, a slice running across it starts at it (its real
//! start kept in `clipped_start_ns`) and each counter carries its last earlier value to
//! it; `--keep-before-base` keeps them as negative times for `chrome://tracing`.
//!
//! The profiler's file is not re-serialised: the new events are inserted as text at the
//! end of its `traceEvents` array and a `uvmwatch` member at the end of the top-level
//! object, so every other byte stays as it was. It is read as a stream, twice (`stream.rs`):
//! a trace of any size is annotated in memory bounded by the capture.

mod stream;

pub use stream::{survey, Survey};

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Write},
    path::Path,
};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::export::capture::{
    self,
    chrome::{self, Metadata},
    model::{Capture, Event, Kind, Process},
};

/// Synthetic thread ids of the uvmwatch tracks: this plus the host tid. Real tids stay
/// below 2^22 (`pid_max`), so they never collide with the profiler's threads.
pub const TRACK_TID_BASE: u32 = 1_000_000_000;

/// How to annotate.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only this captured process (host pid).
    pub pid: Option<u32>,
    /// Its pid in the trace, overriding the match.
    pub trace_pid: Option<u32>,
    /// Drop events outside the profiler's window.
    pub window_only: bool,
    /// Keep events before `baseTimeNanoseconds` as negative timestamps (chrome://tracing
    /// shows them; Perfetto drops them).
    pub keep_before_base: bool,
    /// Name of the capture file, recorded in the output's metadata.
    pub capture_name: String,
}

/// A captured process placed in the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Host pid (in the capture).
    pub host_pid: u32,
    /// Pid in the trace.
    pub trace_pid: u32,
    /// Process name.
    pub comm: String,
    /// Events added for it.
    pub events: usize,
}

/// What [`annotate`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Processes placed.
    pub mapped: Vec<Mapping>,
    /// Captured processes left out, and why.
    pub skipped: Vec<(u32, String)>,
    /// Events left out by `window_only`.
    pub outside_window: usize,
    /// Events that ended before the trace's base time, left out (Perfetto drops
    /// negative timestamps).
    pub before_base: usize,
    /// Slices that started before the base time, drawn from it.
    pub clipped: usize,
    /// The trace's `baseTimeNanoseconds`, when it has one.
    pub base_ns: Option<u64>,
    /// Warnings (e.g. no overlap in time).
    pub warnings: Vec<String>,
}

/// Opens a trace file for reading, gunzipping it on the fly when it is gzip.
///
/// # Errors
/// The file cannot be opened or read.
pub fn open_maybe_gz(path: &Path) -> Result<Box<dyn BufRead>> {
    let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 16, f);
    let gz = r
        .fill_buf()
        .with_context(|| format!("reading {}", path.display()))?
        .starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::GzDecoder::new(r),
        ))
    } else {
        Box::new(r)
    })
}

/// Picks the trace pid of each captured process (see the module documentation).
fn map_processes(
    capture: &Capture,
    facts: &Survey,
    to_trace_ns: &dyn Fn(u64) -> i128,
    opts: &Options,
    summary: &mut Summary,
) -> Result<Vec<(Process, u32)>> {
    if let Some(host) = opts.pid {
        let p = capture.process(host).with_context(|| {
            format!(
                "--pid {host}: no such process in the capture (it has {})",
                pid_list(capture)
            )
        })?;
        let tp = opts.trace_pid.unwrap_or(p.self_pid());
        if !facts.pids.contains(&tp) {
            summary.warnings.push(format!(
                "pid {tp} has no events in the profiler trace; the uvmwatch tracks form a process of their own"
            ));
        }
        for o in &capture.processes {
            if o.pid != host {
                summary.skipped.push((o.pid, format!("not --pid {host}")));
            }
        }
        return Ok(vec![(p.clone(), tp)]);
    }
    // Processes of the capture by the pid they see, with the time span of their events.
    let mut by_pid: BTreeMap<u32, Vec<&Process>> = BTreeMap::new();
    for p in &capture.processes {
        if facts.pids.contains(&p.self_pid()) {
            by_pid.entry(p.self_pid()).or_default().push(p);
        } else {
            summary.skipped.push((
                p.pid,
                format!("pid {} is not in the profiler trace", p.self_pid()),
            ));
        }
    }
    let span = |pid: u32| {
        let ts: Vec<i128> = capture
            .events
            .iter()
            .filter(|e| e.pid == pid)
            .flat_map(|e| [to_trace_ns(e.ts_ns), to_trace_ns(e.end_ns())])
            .collect();
        (
            ts.iter().copied().min().unwrap_or(0),
            ts.iter().copied().max().unwrap_or(0),
        )
    };
    let mut out = Vec::new();
    for (tp, procs) in by_pid {
        if procs.len() == 1 {
            out.push((procs[0].clone(), tp));
            continue;
        }
        // Several containers' processes see the same pid: keep the one active while the
        // profiler recorded.
        let overlapping: Vec<&&Process> = procs
            .iter()
            .filter(|p| match facts.window {
                Some((lo, hi)) => {
                    let (a, b) = span(p.pid);
                    a <= hi && b >= lo
                }
                None => false,
            })
            .collect();
        if overlapping.len() != 1 {
            let list: Vec<String> = procs.iter().map(|p| p.pid.to_string()).collect();
            bail!(
                "several captured processes see themselves as pid {tp} (host pids {}); choose one with --pid",
                list.join(", ")
            );
        }
        for p in &procs {
            if p.pid != overlapping[0].pid {
                summary.skipped.push((
                    p.pid,
                    format!(
                        "pid {tp} taken by host pid {}, active in the profiler's window",
                        overlapping[0].pid
                    ),
                ));
            }
        }
        out.push(((*overlapping[0]).clone(), tp));
    }
    if out.is_empty() {
        bail!(
            "no captured process is in the profiler trace (capture: {}; trace pids: {}); choose one with --pid",
            pid_list(capture),
            facts
                .pids
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(out)
}

fn pid_list(c: &Capture) -> String {
    if c.processes.is_empty() {
        return "no processes".into();
    }
    c.processes
        .iter()
        .map(|p| match p.ns_pid {
            Some(n) => format!("{} {} (pid {n} inside its namespace)", p.name, p.pid),
            None => format!("{} {}", p.name, p.pid),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An event to insert, at `at` ns on the trace's time base.
struct Item {
    ev: Event,
    at: i128,
}

/// Perfetto drops events before the trace's time zero, so what precedes
/// `baseTimeNanoseconds` is moved or left out: a slice that ends after it starts at 0
/// (its real start kept in `clipped_start_ns`), each counter keeps its last value from
/// before at 0, and earlier slices and instants are left out (counted).
fn clip_before_base(items: &mut Vec<Item>, summary: &mut Summary) {
    // The last sample at or before 0 of each counter.
    let mut last_before: BTreeMap<(u32, String), i128> = BTreeMap::new();
    for it in items.iter() {
        if matches!(it.ev.kind, Kind::Counter { .. }) && it.at <= 0 {
            let k = (it.ev.pid, it.ev.name.clone());
            let e = last_before.entry(k).or_insert(it.at);
            *e = (*e).max(it.at);
        }
    }
    items.retain_mut(|it| {
        if it.at >= 0 {
            return true;
        }
        match it.ev.kind {
            Kind::Counter { .. } => {
                let keep = last_before.get(&(it.ev.pid, it.ev.name.clone())) == Some(&it.at);
                it.at = 0;
                keep
            }
            Kind::Slice { dur_ns } => {
                let end = it.at + dur_ns as i128;
                if end <= 0 {
                    summary.before_base += 1;
                    return false;
                }
                it.ev.args.push((
                    "clipped_start_ns".into(),
                    capture::model::Arg::Int(i64::try_from(it.at).unwrap_or(i64::MIN)),
                ));
                it.ev.args.sort_by(|a, b| a.0.cmp(&b.0));
                it.ev.kind = Kind::Slice { dur_ns: end as u64 };
                it.at = 0;
                summary.clipped += 1;
                true
            }
            Kind::Instant => {
                summary.before_base += 1;
                false
            }
        }
    });
}

/// Merges `capture` into the profiler trace `text`; returns the new text ([`annotate_stream`]
/// on a text already in memory).
///
/// # Errors
/// As [`annotate_stream`].
pub fn annotate(text: &str, capture: &Capture, opts: &Options) -> Result<(String, Summary)> {
    let mut out = Vec::with_capacity(text.len() + 4096);
    let summary = annotate_stream(|| Ok(text.as_bytes()), &mut out, capture, opts)?;
    Ok((String::from_utf8(out)?, summary))
}

/// Merges `capture` into the profiler trace that `open` reads (called twice: the trace is
/// read as a stream, surveyed then copied, `stream.rs`) and writes the result to `w`. Memory
/// is bounded by the capture, whatever the trace's size.
///
/// # Errors
/// The trace is not a JSON object with a `traceEvents` array (or a bare array), is
/// already annotated, no captured process can be placed, or reading or writing fails.
pub fn annotate_stream<R: BufRead>(
    open: impl Fn() -> Result<R>,
    w: &mut impl Write,
    capture: &Capture,
    opts: &Options,
) -> Result<Summary> {
    let facts = stream::survey(open()?)?;
    let mut summary = Summary {
        base_ns: facts.base_ns,
        ..Summary::default()
    };
    let base = summary.base_ns.map(|b| b as i128).unwrap_or(0);
    let offset = capture.meta.clock.offset_ns;
    let to_trace_ns = move |mono: u64| mono as i128 + offset - base;
    let mapped = map_processes(capture, &facts, &to_trace_ns, opts, &mut summary)?;

    let clip = summary.base_ns.is_some() && !opts.keep_before_base;
    let mut lines: Vec<String> = Vec::new();
    let mut in_window = 0usize;
    let mut considered = 0usize;
    for (p, tp) in &mapped {
        // The process's events, then the drop total on its own counter track.
        let own = capture.events.iter().filter(|e| e.pid == p.pid);
        let drops = capture.events.iter().filter(|e| {
            e.pid == capture.meta.agent_pid && e.name == capture::model::DROPPED_COUNTER
        });
        let mut items: Vec<Item> = Vec::new();
        for e in own.chain(drops) {
            let (a, z) = (to_trace_ns(e.ts_ns), to_trace_ns(e.end_ns()));
            let inside = facts.window.is_some_and(|(lo, hi)| a <= hi && z >= lo);
            if e.pid == p.pid {
                considered += 1;
                if inside {
                    in_window += 1;
                }
            }
            if opts.window_only && !inside {
                summary.outside_window += 1;
                continue;
            }
            let mut ev = e.clone();
            if let Kind::Counter { .. } = ev.kind {
                ev.name = format!("uvmwatch {}", e.name);
            }
            items.push(Item { ev, at: a });
        }
        if clip {
            clip_before_base(&mut items, &mut summary);
        }
        if !items.iter().any(|i| i.ev.pid == p.pid) {
            items.clear();
        }
        let tids: BTreeSet<u32> = items
            .iter()
            .filter_map(|i| i.ev.tid.filter(|_| i.ev.pid == p.pid))
            .collect();
        for (i, t) in tids.iter().enumerate() {
            let tname = capture
                .threads
                .iter()
                .find(|x| x.pid == p.pid && x.tid == *t)
                .map(|x| x.name.clone())
                .unwrap_or_else(|| format!("thread {t}"));
            lines.push(chrome::metadata_json(
                Metadata::ThreadName(&format!("uvmwatch: {tname} (host tid {t})")),
                *tp,
                TRACK_TID_BASE + t,
            ));
            lines.push(chrome::metadata_json(
                Metadata::ThreadSortIndex(-1000 + i as i64),
                *tp,
                TRACK_TID_BASE + t,
            ));
        }
        let mut added = 0usize;
        for it in &items {
            let tid = match it.ev.tid {
                Some(t) if it.ev.pid == p.pid => TRACK_TID_BASE + t,
                _ => *tp,
            };
            lines.push(chrome::event_json(
                &it.ev,
                *tp,
                tid,
                it.at,
                &format!("uvmwatch,{}", it.ev.cat),
            ));
            if it.ev.pid == p.pid {
                added += 1;
            }
        }
        summary.mapped.push(Mapping {
            host_pid: p.pid,
            trace_pid: *tp,
            comm: p.name.clone(),
            events: added,
        });
    }
    if in_window == 0 && considered > 0 {
        summary.warnings.push(
            "no captured event falls inside the profiler's window: check that the capture and the trace are of the same run".into(),
        );
    }

    let events = (!lines.is_empty()).then(|| {
        lines
            .iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join(",\n")
    });
    let meta = facts.object.then(|| meta_member(capture, &summary, opts));
    stream::splice(open()?, w, events, meta)?;
    Ok(summary)
}

/// The output's `uvmwatch` member: where the capture came from and what was placed.
#[derive(Serialize)]
struct Annotation<'a> {
    capture: &'a str,
    version: &'a str,
    clock_offset_ns: i128,
    base_time_ns: Option<u64>,
    track_tid_base: u32,
    dropped_events: u64,
    lost_events: u64,
    outside_window: usize,
    before_base: usize,
    clipped: usize,
    processes: Vec<Placed<'a>>,
}

/// One of `uvmwatch.processes`: a [`Mapping`] with the process's namespace pid and container.
#[derive(Serialize)]
struct Placed<'a> {
    host_pid: u32,
    trace_pid: u32,
    ns_pid: Option<u32>,
    comm: &'a str,
    container_id: Option<&'a str>,
    events: usize,
}

fn meta_member(c: &Capture, s: &Summary, opts: &Options) -> String {
    chrome::to_json(&Annotation {
        capture: &opts.capture_name,
        version: &c.meta.version,
        clock_offset_ns: c.meta.clock.offset_ns,
        base_time_ns: s.base_ns,
        track_tid_base: TRACK_TID_BASE,
        dropped_events: c.meta.dropped_events,
        lost_events: c.meta.lost_events,
        outside_window: s.outside_window,
        before_base: s.before_base,
        clipped: s.clipped,
        processes: s
            .mapped
            .iter()
            .map(|m| {
                let p = c.process(m.host_pid);
                Placed {
                    host_pid: m.host_pid,
                    trace_pid: m.trace_pid,
                    ns_pid: p.and_then(|p| p.ns_pid),
                    comm: &m.comm,
                    container_id: p.and_then(|p| p.container_id.as_deref()),
                    events: m.events,
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::capture::testing::story;
    use serde_json::Value;

    /// base = wall clock of monotonic 1001 s in the story's clock (1 s after its start).
    const BASE: u64 = 1_750_000_001_000_000_000;

    /// A Kineto-like trace whose one step lasts `dur` µs from the base time.
    fn kineto_for(pid: u32, dur: u64) -> String {
        format!(
            r#"{{
  "schemaVersion": 1,
  "baseTimeNanoseconds": {BASE},
  "traceEvents": [
  {{
    "ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": {pid}, "tid": {pid},
    "ts": 0, "dur": {dur}
  }},
  {{"name": "process_name", "ph": "M", "ts": 0, "pid": {pid}, "tid": 0, "args": {{"name": "python3"}}}}
  ],
  "traceName": "x"
}}
"#
        )
    }

    /// A 3 s profiler window from the base time.
    fn kineto(pid: u32) -> String {
        kineto_for(pid, 3_000_000)
    }

    fn opts() -> Options {
        Options {
            capture_name: "c.json".into(),
            ..Options::default()
        }
    }

    #[test]
    fn maps_the_namespace_pid_and_converts_time() {
        let c = story();
        let t = kineto(7);
        let (out, s) = annotate(&t, &c, &opts()).unwrap();
        assert_eq!(s.mapped.len(), 1);
        assert_eq!((s.mapped[0].host_pid, s.mapped[0].trace_pid), (4242, 7));
        assert_eq!(s.base_ns, Some(BASE));
        let v: Value = serde_json::from_str(&out).unwrap();
        let evs = v["traceEvents"].as_array().unwrap();
        // The story's first cuInit starts at monotonic 1001.2 s: 0.2 s after the base.
        let cu = evs
            .iter()
            .find(|e| e["name"] == "cuInit" && e["tid"] == TRACK_TID_BASE + 4242)
            .unwrap();
        assert_eq!(cu["pid"], 7);
        assert_eq!(cu["ts"].as_f64().unwrap(), 200_000.0);
        assert_eq!(cu["cat"], "uvmwatch,cuinit");
        let name = evs
            .iter()
            .find(|e| e["name"] == "thread_name" && e["tid"] == TRACK_TID_BASE + 4250)
            .unwrap();
        assert_eq!(
            name["args"]["name"],
            "uvmwatch: worker-4250 (host tid 4250)"
        );
        assert_eq!(v["uvmwatch"]["processes"][0]["ns_pid"], 7);
        assert_eq!(v["traceName"], "x");
    }

    #[test]
    fn keeps_the_original_bytes() {
        let c = story();
        let t = kineto(7);
        let (out, _) = annotate(&t, &c, &opts()).unwrap();
        // Removing what was inserted gives the input back.
        let first = out.find(",\n  {\"ph\":\"M\"").unwrap();
        let end_events = out.find("\n  ],").unwrap();
        let meta = out.find(",\n  \"uvmwatch\"").unwrap();
        let meta_end = out.rfind("\n}\n").unwrap();
        let restored = format!(
            "{}{}{}",
            &out[..first],
            &out[end_events..meta],
            &out[meta_end..]
        );
        assert_eq!(restored, t);
    }

    #[test]
    fn no_base_time_means_epoch_microseconds() {
        let c = story();
        let t = r#"[{"ph":"X","name":"step","pid":7,"tid":7,"ts":1750000001000000,"dur":5}]"#;
        let (out, s) = annotate(t, &c, &opts()).unwrap();
        assert_eq!(s.base_ns, None);
        let v: Value = serde_json::from_str(&out).unwrap();
        let cu = v
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "cuInit")
            .unwrap();
        assert_eq!(cu["ts"].as_f64().unwrap(), 1_750_000_001_200_000.0);
    }

    #[test]
    fn window_only_drops_what_is_outside() {
        let c = story();
        let t = kineto(7);
        let o = Options {
            window_only: true,
            ..opts()
        };
        let (_, s) = annotate(&t, &c, &o).unwrap();
        assert!(s.outside_window > 0);
        assert!(s.mapped[0].events > 0);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    }

    #[test]
    fn a_capture_of_another_run_is_warned_about() {
        let c = story();
        let t = kineto_for(7, 1);
        let (_, s) = annotate(&t, &c, &opts()).unwrap();
        assert!(s.mapped[0].events > 0);
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
        let o = Options {
            window_only: true,
            ..opts()
        };
        let (_, s) = annotate(&t, &c, &o).unwrap();
        assert_eq!(s.mapped[0].events, 0);
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    }

    #[test]
    fn unmatched_pids_are_explained_and_pid_forces_a_mapping() {
        let c = story();
        let t = kineto(99);
        let e = annotate(&t, &c, &opts()).unwrap_err().to_string();
        assert!(
            e.contains("python3 4242 (pid 7 inside its namespace)"),
            "{e}"
        );
        assert!(e.contains("trace pids: 99"), "{e}");
        let o = Options {
            pid: Some(4242),
            trace_pid: Some(99),
            ..opts()
        };
        let (_, s) = annotate(&t, &c, &o).unwrap();
        assert_eq!(s.mapped[0].trace_pid, 99);
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn what_precedes_the_base_time_is_clipped_or_left_out() {
        let mut c = story();
        // A slow ioctl across the base (monotonic 1001 s), one well before it.
        for (start, name) in [
            (999_950 * 1_000_000u64, "ACROSS"),
            (999_000_000_000, "BEFORE"),
        ] {
            let mut e = c
                .events
                .iter()
                .find(|e| e.name == "UVM_INITIALIZE")
                .unwrap()
                .clone();
            e.name = name.into();
            e.ts_ns = c.meta.clock.mono_ns + start - 999_000_000_000;
            e.kind = Kind::Slice {
                dur_ns: 100_000_000,
            };
            c.events.push(e);
        }
        c.normalize();
        let (out, s) = annotate(&kineto(7), &c, &opts()).unwrap();
        assert_eq!((s.before_base, s.clipped), (1, 1));
        let v: Value = serde_json::from_str(&out).unwrap();
        let evs = v["traceEvents"].as_array().unwrap();
        assert!(evs.iter().all(|e| e["ts"].as_f64().unwrap_or(0.0) >= 0.0));
        assert!(!evs.iter().any(|e| e["name"] == "BEFORE"));
        let across = evs.iter().find(|e| e["name"] == "ACROSS").unwrap();
        assert_eq!(across["ts"].as_f64(), Some(0.0));
        assert_eq!(across["dur"].as_f64(), Some(50_000.0));
        assert_eq!(across["args"]["clipped_start_ns"], -50_000_000);
        // The rate counter's value from the capture start is carried to 0, once.
        let rate: Vec<f64> = evs
            .iter()
            .filter(|e| e["name"] == "uvmwatch ioctls per 100 ms")
            .map(|e| e["ts"].as_f64().unwrap())
            .collect();
        assert_eq!(rate[0], 0.0);
        assert_eq!(rate.iter().filter(|t| **t == 0.0).count(), 1);
        let o = Options {
            keep_before_base: true,
            ..opts()
        };
        let (out, s) = annotate(&kineto(7), &c, &o).unwrap();
        assert_eq!((s.before_base, s.clipped), (0, 0));
        assert!(out.contains("\"name\":\"BEFORE\""));
    }

    #[test]
    fn refuses_to_annotate_twice_and_non_traces() {
        let c = story();
        let (out, _) = annotate(&kineto(7), &c, &opts()).unwrap();
        assert!(annotate(&out, &c, &opts()).is_err());
        assert!(annotate("{\"a\":1}", &c, &opts()).is_err());
        assert!(annotate("nope", &c, &opts()).is_err());
    }
}

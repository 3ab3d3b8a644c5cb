//! [`TraceBuilder`]: builds a [`Capture`] from the observer's events, one at a time, as the
//! capture listener hands them over.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{
    cat, sorted, Arg, Capture, Event, Kind, Meta, Process, Thread, CAPTURE_ENDED, CAPTURE_STARTED,
    DROPPED_COUNTER, LOST_COUNTER, RATE_COUNTER,
};
use crate::event::{
    Event as Observed, Kind as Observation, Process as ObservedProcess, StallOutcome, Trigger,
};

/// Width of the buckets of the ioctl-rate counter.
pub const RATE_BUCKET_NS: u64 = 100_000_000;

/// Reads a thread's name (`(pid, tid) -> name`), e.g. from `/proc`.
pub type ThreadNamer = Box<dyn FnMut(u32, u32) -> Option<String> + Send>;

/// A call seen starting (or stalled) whose end has not been reported yet.
#[derive(Clone, Debug)]
struct Open {
    pid: u32,
    name: String,
    args: Vec<(String, Arg)>,
}

/// Builds a [`Capture`] from the agent's events: pairs `cuInit` starts and ends, keeps
/// ioctls, opens, failures, stalls and diagnoses, counts ioctls for the rate counter and
/// follows the drop total. Calls still running at the end become slices up to the end,
/// marked `unfinished`.
pub struct TraceBuilder {
    meta: Meta,
    limit: usize,
    namer: ThreadNamer,
    processes: BTreeMap<u32, Process>,
    threads: BTreeMap<(u32, u32), String>,
    events: Vec<Event>,
    /// `cuInit` calls started, by (tid, start).
    open_cuinit: BTreeMap<(u32, u64), Open>,
    /// Stalled ioctls not yet ended, by (tid, start).
    open_ioctls: BTreeMap<(u32, u64), Open>,
    /// Ioctl start times by process, for the rate counter.
    ioctl_starts: BTreeMap<u32, Vec<u64>>,
    /// Drop totals as reported: (when, total).
    dropped: Vec<(u64, u64)>,
    lost: u64,
}

impl TraceBuilder {
    /// A builder keeping at most `limit` events (more are counted as lost); `namer` names
    /// each thread the first time it is seen.
    pub fn new(meta: Meta, limit: usize, namer: ThreadNamer) -> TraceBuilder {
        TraceBuilder {
            meta,
            limit,
            namer,
            processes: BTreeMap::new(),
            threads: BTreeMap::new(),
            events: Vec::new(),
            open_cuinit: BTreeMap::new(),
            open_ioctls: BTreeMap::new(),
            ioctl_starts: BTreeMap::new(),
            dropped: Vec::new(),
            lost: 0,
        }
    }

    /// Events kept so far.
    pub fn recorded(&self) -> usize {
        self.events.len()
    }

    /// Events not kept (over the limit).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Latest drop total reported by the agent.
    pub fn dropped(&self) -> u64 {
        self.dropped.last().map(|d| d.1).unwrap_or(0)
    }

    /// Processes seen.
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    fn note_process(&mut self, p: &ObservedProcess) {
        let e = self.processes.entry(p.pid).or_insert_with(|| Process {
            pid: p.pid,
            ..Process::default()
        });
        if e.ns_pid.is_none() {
            e.ns_pid = p.ns_pid.filter(|n| *n != p.pid);
        }
        if e.name.is_empty() {
            e.name = p.comm.clone();
        }
        if e.exe.is_empty() {
            e.exe = p.exe.clone();
        }
        if e.cmdline.is_empty() {
            e.cmdline = p.cmdline.clone();
        }
        if e.container_id.is_none() {
            e.container_id = p.container_id.clone().filter(|c| !c.is_empty());
        }
    }

    fn note_thread(&mut self, p: &ObservedProcess, tid: u32) {
        self.note_process(p);
        if self.threads.contains_key(&(p.pid, tid)) {
            return;
        }
        let name = (self.namer)(p.pid, tid)
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                if tid == p.pid && !p.comm.is_empty() {
                    p.comm.clone()
                } else {
                    format!("thread {tid}")
                }
            });
        self.threads.insert((p.pid, tid), name);
    }

    fn push(&mut self, e: Event) {
        if self.events.len() >= self.limit {
            self.lost += 1;
        } else {
            self.events.push(e);
        }
    }

    /// Records one event from the observer (already filtered). `now_ns` dates what carries
    /// no time of its own (drop totals).
    pub fn record(&mut self, ev: &Observed, now_ns: u64) {
        if let Observation::Scan(s) = &ev.kind {
            if s.dropped_total != self.dropped() {
                self.dropped.push((now_ns, s.dropped_total));
            }
            return;
        }
        let Some(proc) = ev.process.as_deref() else {
            return;
        };
        let tid = ev.tid;
        match &ev.kind {
            Observation::CuinitStart {
                start_ns, flags, ..
            } => {
                self.note_thread(proc, tid);
                self.open_cuinit.insert(
                    (tid, *start_ns),
                    Open {
                        pid: proc.pid,
                        name: "cuInit".into(),
                        args: vec![("flags".into(), Arg::from(*flags))],
                    },
                );
            }
            Observation::CuinitEnd(c) if c.start_reported() => {
                self.note_thread(proc, tid);
                let mut args: Vec<(String, Arg)> = self
                    .open_cuinit
                    .remove(&(tid, c.start_ns))
                    .map(|o| o.args)
                    .unwrap_or_default();
                args.push(("result".into(), c.result.as_str().into()));
                args.push(("code".into(), Arg::Int(c.code)));
                args.push(("failed".into(), Arg::Bool(c.code != 0)));
                // A call found from its driver calls says so, and what its result rests on.
                if c.seen != crate::event::Seen::Whole {
                    args.push(("seen".into(), c.seen.name().into()));
                }
                if let Some(l) = c.late.as_ref().filter(|l| !l.result_basis.is_empty()) {
                    args.push((
                        "result_inferred_from".into(),
                        l.result_basis.as_str().into(),
                    ));
                }
                if let Some(f) = &c.call.last_failure {
                    args.push(("failed_call".into(), f.what.as_str().into()));
                    args.push(("failed_result".into(), f.result.as_str().into()));
                }
                args.sort_by(|a, b| a.0.cmp(&b.0));
                self.push(slice(
                    proc.pid,
                    tid,
                    c.start_ns,
                    ev.ts_ns,
                    "cuInit",
                    cat::CUINIT,
                    args,
                ));
                if c.code != 0 {
                    self.push(instant(
                        proc.pid,
                        Some(tid),
                        ev.ts_ns,
                        "cuInit failed".into(),
                        cat::FAILURE,
                        sorted(vec![
                            ("result", c.result.as_str().into()),
                            ("code", Arg::Int(c.code)),
                        ]),
                    ));
                }
            }
            Observation::Ioctl(io) => {
                self.note_thread(proc, tid);
                self.open_ioctls.remove(&(tid, io.start_ns));
                self.ioctl_starts
                    .entry(proc.pid)
                    .or_default()
                    .push(io.start_ns);
                self.push(slice(
                    proc.pid,
                    tid,
                    io.start_ns,
                    ev.ts_ns,
                    &io.name,
                    cat::IOCTL,
                    sorted(vec![
                        ("node", io.node.as_str().into()),
                        ("result", io.result.as_str().into()),
                        ("failed", io.failed.into()),
                        ("in_cuinit", io.in_cuinit.into()),
                    ]),
                ));
                if io.failed {
                    self.push(instant(
                        proc.pid,
                        Some(tid),
                        ev.ts_ns,
                        format!("failed: {}", io.name),
                        cat::FAILURE,
                        sorted(vec![
                            ("node", io.node.as_str().into()),
                            ("result", io.result.as_str().into()),
                        ]),
                    ));
                }
            }
            Observation::Open(o) => {
                self.note_thread(proc, tid);
                let path = o.path.as_str();
                let mut args = vec![
                    ("path", Arg::from(path)),
                    ("failed", Arg::from(o.errno.is_some())),
                    ("in_cuinit", Arg::from(o.in_cuinit)),
                ];
                if let Some(e) = &o.errno {
                    args.push(("errno", e.as_str().into()));
                }
                self.push(slice(
                    proc.pid,
                    tid,
                    o.start_ns,
                    ev.ts_ns,
                    &format!("open {path}"),
                    cat::OPEN,
                    sorted(args),
                ));
                if let Some(e) = &o.errno {
                    self.push(instant(
                        proc.pid,
                        Some(tid),
                        ev.ts_ns,
                        format!("open failed: {path}"),
                        cat::FAILURE,
                        sorted(vec![("path", path.into()), ("errno", e.as_str().into())]),
                    ));
                }
            }
            Observation::ContextCall(c) => {
                self.note_thread(proc, tid);
                let mut args = vec![
                    ("result", Arg::from(c.result.as_str())),
                    ("code", Arg::Int(c.code)),
                    ("failed", Arg::from(c.failed())),
                ];
                if let Some(d) = c.device {
                    args.push(("device", Arg::Int(i64::from(d))));
                }
                if let Some(n) = c.count {
                    args.push(("count", Arg::Int(i64::from(n))));
                }
                self.push(slice(
                    proc.pid,
                    tid,
                    c.start_ns,
                    ev.ts_ns,
                    c.call,
                    cat::CONTEXT,
                    sorted(args),
                ));
                if c.failed() {
                    self.push(instant(
                        proc.pid,
                        Some(tid),
                        ev.ts_ns,
                        format!("{} failed", c.call),
                        cat::FAILURE,
                        sorted(vec![
                            ("result", c.result.as_str().into()),
                            ("code", Arg::Int(c.code)),
                        ]),
                    ));
                }
            }
            Observation::Stall(st) => {
                self.note_thread(proc, tid);
                let call = st.call.as_str();
                if call != "cuInit" {
                    // The ioctl is reported only when it returns: keep it, to draw it up to
                    // the end of the capture if it never does.
                    self.open_ioctls
                        .entry((tid, st.start_ns))
                        .or_insert_with(|| Open {
                            pid: proc.pid,
                            name: call.to_string(),
                            args: vec![("node".into(), st.node.as_str().into())],
                        });
                }
                let inside = st.inside.as_ref().map(|i| i.text()).unwrap_or_default();
                self.push(instant(
                    proc.pid,
                    Some(tid),
                    ev.ts_ns,
                    format!("stall: {call}"),
                    cat::STALL,
                    sorted(vec![
                        ("call", call.into()),
                        ("call_start_ns", Arg::from(st.start_ns)),
                        ("age_ms", Arg::from(st.age_ns(ev.ts_ns) / 1_000_000)),
                        ("inside", inside.into()),
                        ("thread_state", st.thread.state.as_str().into()),
                        ("wchan", st.thread.wchan.as_str().into()),
                    ]),
                ));
            }
            Observation::StallEnd(st) => {
                self.note_thread(proc, tid);
                let call = st.call.as_str();
                let outcome = st.outcome.as_str();
                if st.outcome != StallOutcome::Returned {
                    // No end event follows: close the call here.
                    let open = if call == "cuInit" {
                        self.open_cuinit.remove(&(tid, st.start_ns))
                    } else {
                        self.open_ioctls.remove(&(tid, st.start_ns))
                    };
                    if let Some(o) = open {
                        let mut args = o.args;
                        args.push(("result".into(), outcome.into()));
                        args.sort_by(|a, b| a.0.cmp(&b.0));
                        let c = if call == "cuInit" {
                            cat::CUINIT
                        } else {
                            cat::IOCTL
                        };
                        self.push(slice(o.pid, tid, st.start_ns, ev.ts_ns, &o.name, c, args));
                    }
                }
                self.push(instant(
                    proc.pid,
                    Some(tid),
                    ev.ts_ns,
                    format!("stall ended: {call}"),
                    cat::STALL,
                    sorted(vec![
                        ("call", call.into()),
                        ("outcome", outcome.into()),
                        (
                            "duration_ms",
                            Arg::from(ev.ts_ns.saturating_sub(st.start_ns) / 1_000_000),
                        ),
                    ]),
                ));
            }
            Observation::Diagnosis(d) if d.trigger != Trigger::Evidence => {
                let finding = &d.finding;
                self.note_process(proc);
                self.push(instant(
                    proc.pid,
                    None,
                    ev.ts_ns,
                    format!("diagnosis: {}", finding.rule),
                    cat::DIAGNOSIS,
                    sorted(vec![
                        ("rule", finding.rule.as_str().into()),
                        ("severity", finding.severity.as_str().into()),
                        ("title", finding.title.as_str().into()),
                        ("runbook", finding.runbook.as_str().into()),
                    ]),
                ));
            }
            _ => {}
        }
    }

    /// The capture as it stands, ended at `end_ns`.
    pub fn build(&self, end_ns: u64) -> Capture {
        let mut meta = self.meta.clone();
        meta.end_ns = end_ns.max(meta.start_ns);
        meta.dropped_events = self.dropped();
        meta.lost_events = self.lost;
        let end = meta.end_ns;
        let mut events = self.events.clone();
        for (map, c) in [
            (&self.open_cuinit, cat::CUINIT),
            (&self.open_ioctls, cat::IOCTL),
        ] {
            for ((tid, start), o) in map {
                let mut args = o.args.clone();
                args.push(("unfinished".into(), Arg::Bool(true)));
                args.sort_by(|a, b| a.0.cmp(&b.0));
                events.push(slice(
                    o.pid,
                    *tid,
                    *start,
                    end.max(*start),
                    &o.name,
                    c,
                    args,
                ));
            }
        }
        for (pid, starts) in &self.ioctl_starts {
            events.extend(rate_counter(*pid, starts, meta.start_ns));
        }
        let agent = meta.agent_pid;
        let counter = |ts: u64, name: &str, value: u64| Event {
            ts_ns: ts,
            pid: agent,
            tid: None,
            name: name.into(),
            cat: cat::COUNTER.into(),
            kind: Kind::Counter {
                value: i64::try_from(value).unwrap_or(i64::MAX),
            },
            args: Vec::new(),
        };
        events.push(counter(meta.start_ns, DROPPED_COUNTER, 0));
        for (ts, total) in &self.dropped {
            events.push(counter(
                (*ts).clamp(meta.start_ns, end),
                DROPPED_COUNTER,
                *total,
            ));
        }
        if end > meta.start_ns {
            events.push(counter(end, DROPPED_COUNTER, meta.dropped_events));
        }
        events.push(counter(meta.start_ns, LOST_COUNTER, 0));
        if end > meta.start_ns {
            events.push(counter(end, LOST_COUNTER, self.lost));
        }
        let n = events.len() + 2;
        events.push(instant(
            agent,
            None,
            meta.start_ns,
            CAPTURE_STARTED.into(),
            cat::CAPTURE,
            meta.start_args(),
        ));
        events.push(instant(
            agent,
            None,
            end,
            CAPTURE_ENDED.into(),
            cat::CAPTURE,
            meta.end_args(n),
        ));
        dedup_counters(&mut events);
        let threads = self
            .threads
            .iter()
            .map(|((pid, tid), name)| Thread {
                pid: *pid,
                tid: *tid,
                name: name.clone(),
            })
            .collect();
        Capture::normalized(
            meta,
            self.processes.values().cloned().collect(),
            threads,
            events,
        )
    }
}

/// Keeps only the last of several values of one counter at the same time.
fn dedup_counters(events: &mut Vec<Event>) {
    let mut seen = BTreeSet::new();
    let mut keep = vec![true; events.len()];
    for (i, e) in events.iter().enumerate().rev() {
        if let Kind::Counter { .. } = e.kind {
            if !seen.insert((e.pid, e.name.clone(), e.ts_ns)) {
                keep[i] = false;
            }
        }
    }
    let mut i = 0;
    events.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// The ioctl-rate counter of one process: the count of each [`RATE_BUCKET_NS`] bucket at
/// the bucket's start, and 0 at the start of the next empty one (and at the capture start).
fn rate_counter(pid: u32, starts: &[u64], capture_start: u64) -> Vec<Event> {
    let mut buckets: BTreeMap<u64, i64> = BTreeMap::new();
    for s in starts {
        *buckets.entry(s / RATE_BUCKET_NS).or_default() += 1;
    }
    let ev = |ts: u64, value: i64| Event {
        ts_ns: ts,
        pid,
        tid: None,
        name: RATE_COUNTER.into(),
        cat: cat::COUNTER.into(),
        kind: Kind::Counter { value },
        args: Vec::new(),
    };
    let mut out = Vec::new();
    if let Some((first, _)) = buckets.first_key_value() {
        if first * RATE_BUCKET_NS > capture_start {
            out.push(ev(capture_start, 0));
        }
    }
    for (b, n) in &buckets {
        out.push(ev(b * RATE_BUCKET_NS, *n));
        if !buckets.contains_key(&(b + 1)) {
            out.push(ev((b + 1) * RATE_BUCKET_NS, 0));
        }
    }
    out
}

fn slice(
    pid: u32,
    tid: u32,
    start: u64,
    end: u64,
    name: &str,
    cat: &str,
    args: Vec<(String, Arg)>,
) -> Event {
    Event {
        ts_ns: start,
        pid,
        tid: Some(tid),
        name: name.to_string(),
        cat: cat.to_string(),
        kind: Kind::Slice {
            dur_ns: end.saturating_sub(start),
        },
        args,
    }
}

fn instant(
    pid: u32,
    tid: Option<u32>,
    ts: u64,
    name: String,
    cat: &str,
    args: Vec<(String, Arg)>,
) -> Event {
    Event {
        ts_ns: ts,
        pid,
        tid,
        name,
        cat: cat.to_string(),
        kind: Kind::Instant,
        args,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::testing as ev;
    use crate::export::capture::testing::{story, test_clock, workload};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn find<'a>(c: &'a Capture, name: &str) -> Vec<&'a Event> {
        c.events.iter().filter(|e| e.name == name).collect()
    }

    #[test]
    fn cuinit_encloses_its_ioctls_and_unfinished_calls_end_at_the_capture_end() {
        let c = story();
        let cu = find(&c, "cuInit");
        assert_eq!(cu.len(), 2);
        let done = cu.iter().find(|e| e.tid == Some(4242)).unwrap();
        assert_eq!(done.arg("result"), Some(&Arg::from("CUDA_SUCCESS")));
        assert_eq!(done.arg("flags"), Some(&Arg::Int(0)));
        for name in ["UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU"] {
            let io = find(&c, name);
            let inner = io.iter().find(|e| e.tid == Some(4242)).unwrap();
            assert!(inner.ts_ns >= done.ts_ns && inner.end_ns() <= done.end_ns());
            assert_eq!(inner.cat, cat::IOCTL);
        }
        let hung = cu.iter().find(|e| e.tid == Some(4250)).unwrap();
        assert_eq!(hung.arg("unfinished"), Some(&Arg::Bool(true)));
        assert_eq!(hung.end_ns(), c.meta.end_ns);
        let reg = find(&c, "UVM_REGISTER_GPU");
        let stuck = reg.iter().find(|e| e.tid == Some(4250)).unwrap();
        assert_eq!(stuck.arg("node"), Some(&Arg::from("/dev/nvidia-uvm")));
        assert_eq!(stuck.arg("unfinished"), Some(&Arg::Bool(true)));
        let stall = find(&c, "stall: cuInit")[0];
        assert!(stall.ts_ns < hung.end_ns());
        assert_eq!(stall.arg("wchan"), Some(&Arg::from("request_wait_answer")));
        assert_eq!(stall.arg("age_ms"), Some(&Arg::Int(1060)));
        let d = find(&c, "diagnosis: hmm_setup_failure")[0];
        assert_eq!(d.tid, None);
        assert_eq!(d.arg("severity"), Some(&Arg::from("critical")));
        let f = find(&c, "failed: NV_ESC_RM_CONTROL")[0];
        assert_eq!(f.cat, cat::FAILURE);
        assert_eq!(c.threads.len(), 2);
        assert_eq!(c.threads[1].name, "worker-4250");
        assert_eq!(c.threads[0].name, "python3");
        assert_eq!(c.processes[0].ns_pid, Some(7));
    }

    #[test]
    fn rate_counter_counts_per_bucket_and_returns_to_zero() {
        let c = story();
        let rate: Vec<(u64, i64)> = c
            .events
            .iter()
            .filter(|e| e.name == RATE_COUNTER)
            .map(|e| match e.kind {
                Kind::Counter { value } => (e.ts_ns - c.meta.start_ns, value),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            rate,
            vec![
                (0, 0),
                (1_200 * MS, 3),
                (1_300 * MS, 0),
                (1_500 * MS, 1),
                (1_600 * MS, 0)
            ]
        );
    }

    #[test]
    fn drops_and_losses_are_counters_and_metadata() {
        let c = story();
        assert_eq!(c.meta.dropped_events, 3);
        let dropped: Vec<i64> = c
            .events
            .iter()
            .filter(|e| e.name == DROPPED_COUNTER)
            .map(|e| match e.kind {
                Kind::Counter { value } => value,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(dropped, vec![0, 3, 3]);
        let ended = find(&c, CAPTURE_ENDED)[0];
        assert_eq!(ended.arg("dropped_events"), Some(&Arg::Int(3)));
        assert_eq!(ended.arg("lost_events"), Some(&Arg::Int(0)));
        let started = find(&c, CAPTURE_STARTED)[0];
        let meta = Meta::from_instants(started, Some(ended)).unwrap();
        assert_eq!(meta, c.meta);
    }

    #[test]
    fn events_over_the_limit_are_counted_as_lost() {
        let clock = test_clock();
        let meta = Meta::starting(clock, clock.mono_ns, "all".into(), 1);
        let mut r = TraceBuilder::new(meta, 2, Box::new(|_, _| None));
        let p = workload();
        for i in 0..5u64 {
            let t = clock.mono_ns + i;
            r.record(
                &ev::ioctl(
                    &p,
                    4242,
                    t,
                    t + 1,
                    "UVM_INITIALIZE",
                    "/dev/nvidia-uvm",
                    "NV_OK",
                    false,
                    false,
                ),
                0,
            );
        }
        assert_eq!(r.recorded(), 2);
        assert_eq!(r.lost(), 3);
        let c = r.build(clock.mono_ns + S);
        assert_eq!(c.meta.lost_events, 3);
        let lost = c.events.iter().rfind(|e| e.name == LOST_COUNTER).unwrap();
        assert_eq!(lost.kind, Kind::Counter { value: 3 });
    }

    #[test]
    fn a_thread_exit_closes_the_stalled_cuinit() {
        let clock = test_clock();
        let meta = Meta::starting(clock, clock.mono_ns, "all".into(), 1);
        let mut r = TraceBuilder::new(meta, 100, Box::new(|_, _| None));
        let p = workload();
        let t = clock.mono_ns;
        r.record(&ev::cuinit_start(&p, 4242, t), 0);
        r.record(
            &ev::stall_end(&p, 4242, "cuInit", t, t + 2 * S, StallOutcome::ThreadExited),
            0,
        );
        let c = r.build(t + 5 * S);
        let cu = find(&c, "cuInit")[0];
        assert_eq!(cu.end_ns(), t + 2 * S);
        assert_eq!(cu.arg("result"), Some(&Arg::from("thread_exited")));
        assert_eq!(cu.arg("unfinished"), None);
    }

    #[test]
    fn context_calls_are_slices_and_a_failed_one_is_also_a_failure() {
        let clock = test_clock();
        let meta = Meta::starting(clock, clock.mono_ns, "all".into(), 1);
        let mut r = TraceBuilder::new(meta, 100, Box::new(|_, _| None));
        let p = workload();
        let t = clock.mono_ns;
        r.record(
            &ev::context_call(
                &p,
                4242,
                t,
                t + MS,
                "cuDeviceGetCount",
                0,
                "CUDA_SUCCESS",
                Some(2),
            ),
            0,
        );
        r.record(
            &ev::context_call(
                &p,
                4242,
                t + 2 * MS,
                t + 5 * MS,
                "cuDevicePrimaryCtxRetain",
                46,
                "CUDA_ERROR_DEVICE_UNAVAILABLE",
                None,
            ),
            0,
        );
        let c = r.build(t + S);
        let count = find(&c, "cuDeviceGetCount")[0];
        assert_eq!(count.cat, cat::CONTEXT);
        assert_eq!(count.arg("count"), Some(&Arg::Int(2)));
        assert_eq!(count.arg("device"), None);
        let ctx = find(&c, "cuDevicePrimaryCtxRetain")[0];
        assert_eq!((ctx.ts_ns, ctx.end_ns()), (t + 2 * MS, t + 5 * MS));
        assert_eq!(ctx.arg("code"), Some(&Arg::Int(46)));
        assert_eq!(ctx.arg("device"), Some(&Arg::Int(0)));
        let failed = find(&c, "cuDevicePrimaryCtxRetain failed");
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].cat, cat::FAILURE);
        assert!(find(&c, "cuDeviceGetCount failed").is_empty());
    }
}

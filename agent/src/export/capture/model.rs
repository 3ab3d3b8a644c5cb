//! What a capture holds, whatever the file format: the processes and threads seen, and
//! timed events (slices, instants, counter values). [`Recorder`] builds it from what the
//! agent core reports; [`super::perfetto`] and [`super::chrome`] write it and read it back.
//!
//! All times are `CLOCK_MONOTONIC` nanoseconds, as the agent reports them; [`Meta::clock`]
//! is the offset to wall-clock time measured when the capture started.

use std::{
    cmp::{Ordering, Reverse},
    collections::{BTreeMap, BTreeSet},
};

use crate::event::{
    Clock, Event as Observed, Kind as Observation, Process as ObservedProcess, StallOutcome,
    Trigger,
};

/// Width of the buckets of the ioctl-rate counter.
pub const RATE_BUCKET_NS: u64 = 100_000_000;
/// Name of the per-process ioctl-rate counter track.
pub const RATE_COUNTER: &str = "ioctls per 100 ms";
/// Name of the counter of events lost before user space saw them (ring buffer full).
pub const DROPPED_COUNTER: &str = "dropped events";
/// Name of the counter of events the capture itself did not keep (over `--max-events`).
pub const LOST_COUNTER: &str = "events lost by the capture";
/// Name given to the capturing agent's own process in a trace.
pub const AGENT_PROCESS_NAME: &str = "uvmwatch capture";
/// Instant on the agent's process at the start, carrying the capture's metadata.
pub const CAPTURE_STARTED: &str = "capture started";
/// Instant on the agent's process at the end, carrying the drop totals.
pub const CAPTURE_ENDED: &str = "capture ended";

/// Event categories.
pub mod cat {
    /// `cuInit` calls.
    pub const CUINIT: &str = "cuinit";
    /// Driver ioctls.
    pub const IOCTL: &str = "ioctl";
    /// NVIDIA device opens.
    pub const OPEN: &str = "open";
    /// Failed calls (instants).
    pub const FAILURE: &str = "failure";
    /// Stalls detected and ended (instants).
    pub const STALL: &str = "stall";
    /// Diagnosis findings (instants).
    pub const DIAGNOSIS: &str = "diagnosis";
    /// Counters.
    pub const COUNTER: &str = "counter";
    /// The capture's own records (start, end).
    pub const CAPTURE: &str = "uvmwatch";
}

/// One argument of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// Text.
    Str(String),
    /// Signed integer.
    Int(i64),
    /// Unsigned integer too large for [`Arg::Int`].
    Uint(u64),
    /// Flag.
    Bool(bool),
}

impl Arg {
    /// The value as text (for messages and tests).
    pub fn to_text(&self) -> String {
        match self {
            Arg::Str(s) => s.clone(),
            Arg::Int(i) => i.to_string(),
            Arg::Uint(u) => u.to_string(),
            Arg::Bool(b) => b.to_string(),
        }
    }

    /// The value as an integer, when it is one.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Arg::Int(i) => Some(*i as i128),
            Arg::Uint(u) => Some(*u as i128),
            _ => None,
        }
    }
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Str(s.to_string())
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Str(s)
    }
}

impl From<bool> for Arg {
    fn from(b: bool) -> Arg {
        Arg::Bool(b)
    }
}

impl From<i64> for Arg {
    fn from(i: i64) -> Arg {
        Arg::Int(i)
    }
}

impl From<u64> for Arg {
    /// [`Arg::Int`] when it fits, so values read back from JSON compare equal.
    fn from(u: u64) -> Arg {
        match i64::try_from(u) {
            Ok(i) => Arg::Int(i),
            Err(_) => Arg::Uint(u),
        }
    }
}

impl From<u32> for Arg {
    fn from(u: u32) -> Arg {
        Arg::Int(u as i64)
    }
}

/// What an event is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call with a duration.
    Slice {
        /// Duration in ns.
        dur_ns: u64,
    },
    /// A point in time.
    Instant,
    /// A counter's value from this time on; the event's name is the counter's name.
    Counter {
        /// The value.
        value: i64,
    },
}

/// One timed event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Start (or the instant), `CLOCK_MONOTONIC` ns.
    pub ts_ns: u64,
    /// Process (host pid namespace).
    pub pid: u32,
    /// Thread, or `None` for an event of the whole process (diagnoses, counters).
    pub tid: Option<u32>,
    /// Name: `cuInit`, the ioctl's name, `stall: cuInit`, a counter's name, ...
    pub name: String,
    /// One of [`cat`].
    pub cat: String,
    /// Slice, instant or counter value.
    pub kind: Kind,
    /// Arguments, sorted by name.
    pub args: Vec<(String, Arg)>,
}

impl Event {
    /// The value of argument `name`.
    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// End of a slice (the start for other kinds).
    pub fn end_ns(&self) -> u64 {
        match self.kind {
            Kind::Slice { dur_ns } => self.ts_ns.saturating_add(dur_ns),
            _ => self.ts_ns,
        }
    }

    fn kind_rank(&self) -> u8 {
        match self.kind {
            Kind::Slice { .. } => 0,
            Kind::Instant => 1,
            Kind::Counter { .. } => 2,
        }
    }

    /// The order events are kept in: by time, longer slices first (so an enclosing call
    /// comes before what it encloses), then by kind, process, thread and name.
    pub fn canonical_cmp(&self, other: &Event) -> Ordering {
        let dur = |e: &Event| match e.kind {
            Kind::Slice { dur_ns } => dur_ns,
            _ => 0,
        };
        (
            self.ts_ns,
            Reverse(dur(self)),
            self.kind_rank(),
            self.pid,
            self.tid,
            &self.name,
            &self.cat,
        )
            .cmp(&(
                other.ts_ns,
                Reverse(dur(other)),
                other.kind_rank(),
                other.pid,
                other.tid,
                &other.name,
                &other.cat,
            ))
    }
}

/// A process that made calls during the capture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// Process id in the host's pid namespace.
    pub pid: u32,
    /// Process id inside its own pid namespace (a container's), when different.
    pub ns_pid: Option<u32>,
    /// `comm`.
    pub name: String,
    /// Executable path, when it was readable.
    pub exe: String,
    /// Command line, when it was readable.
    pub cmdline: Vec<String>,
    /// Container id, when in one.
    pub container_id: Option<String>,
}

impl Process {
    /// The pid the process sees for itself (what its own tools, e.g. a profiler, record).
    pub fn self_pid(&self) -> u32 {
        self.ns_pid.unwrap_or(self.pid)
    }
}

/// A thread that made calls during the capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    /// Its process.
    pub pid: u32,
    /// Thread id (host pid namespace).
    pub tid: u32,
    /// Thread name (`comm` of the thread).
    pub name: String,
}

/// Facts about the capture itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// `uvmwatch <version>`.
    pub version: String,
    /// `CLOCK_MONOTONIC` to wall-clock offset, measured when the capture started.
    pub clock: Clock,
    /// `CLOCK_BOOTTIME` ns at the same moment as `clock.mono_ns`.
    pub boottime_ns: u64,
    /// When the capture started and ended (monotonic ns).
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// Which processes were kept (`all`, `pid=…`, `comm=…`, `container=…`).
    pub filter: String,
    /// Events lost before user space saw them (ring buffer full, undecodable), all
    /// processes together: the agent cannot tell whose they were.
    pub dropped_events: u64,
    /// Events of the filtered processes that the capture did not keep (over its limit).
    pub lost_events: u64,
    /// Pid of the capturing agent (its track holds the capture's own records).
    pub agent_pid: u32,
}

impl Meta {
    /// Metadata of a capture starting now, from `clock` (measured now).
    pub fn starting(clock: Clock, boottime_ns: u64, filter: String, agent_pid: u32) -> Meta {
        Meta {
            version: format!("uvmwatch {}", env!("CARGO_PKG_VERSION")),
            clock,
            boottime_ns,
            start_ns: clock.mono_ns,
            end_ns: clock.mono_ns,
            filter,
            dropped_events: 0,
            lost_events: 0,
            agent_pid,
        }
    }

    /// The arguments of the [`CAPTURE_STARTED`] instant.
    pub fn start_args(&self) -> Vec<(String, Arg)> {
        sorted(vec![
            ("version", Arg::from(self.version.as_str())),
            ("filter", Arg::from(self.filter.as_str())),
            (
                "clock_offset_ns",
                Arg::Int(i64::try_from(self.clock.offset_ns).unwrap_or(i64::MAX)),
            ),
            ("clock_monotonic_ns", Arg::from(self.clock.mono_ns)),
            ("clock_realtime_ns", Arg::from(self.clock.unix_ns)),
            ("clock_boottime_ns", Arg::from(self.boottime_ns)),
            ("agent_pid", Arg::from(self.agent_pid)),
        ])
    }

    /// The arguments of the [`CAPTURE_ENDED`] instant.
    pub fn end_args(&self, events: usize) -> Vec<(String, Arg)> {
        sorted(vec![
            ("dropped_events", Arg::from(self.dropped_events)),
            ("lost_events", Arg::from(self.lost_events)),
            ("events", Arg::from(events as u64)),
        ])
    }

    /// Metadata read back from the two instants' arguments (formats that carry it that way).
    pub fn from_instants(started: &Event, ended: Option<&Event>) -> Option<Meta> {
        let int = |e: &Event, k: &str| e.arg(k).and_then(Arg::as_i128);
        let offset = int(started, "clock_offset_ns")?;
        let mono = int(started, "clock_monotonic_ns")? as u64;
        let unix = int(started, "clock_realtime_ns")? as u64;
        let (dropped, lost, end) = match ended {
            Some(e) => (
                int(e, "dropped_events").unwrap_or(0) as u64,
                int(e, "lost_events").unwrap_or(0) as u64,
                e.ts_ns,
            ),
            None => (0, 0, started.ts_ns),
        };
        Some(Meta {
            version: started.arg("version").map(Arg::to_text).unwrap_or_default(),
            clock: Clock {
                offset_ns: offset,
                mono_ns: mono,
                unix_ns: unix,
            },
            boottime_ns: int(started, "clock_boottime_ns").unwrap_or(mono as i128) as u64,
            start_ns: started.ts_ns,
            end_ns: end,
            filter: started.arg("filter").map(Arg::to_text).unwrap_or_default(),
            dropped_events: dropped,
            lost_events: lost,
            agent_pid: int(started, "agent_pid").unwrap_or(0) as u32,
        })
    }
}

/// A whole capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    /// About the capture.
    pub meta: Meta,
    /// Processes seen (not the agent), by pid.
    pub processes: Vec<Process>,
    /// Threads seen, by (pid, tid).
    pub threads: Vec<Thread>,
    /// Events, in [`Event::canonical_cmp`] order.
    pub events: Vec<Event>,
}

impl Capture {
    /// The process with host pid `pid`.
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Puts events in canonical order, processes by pid and threads by (pid, tid).
    pub fn normalize(&mut self) {
        self.events.sort_by(Event::canonical_cmp);
        self.processes.sort_by_key(|p| p.pid);
        self.threads.sort_by_key(|t| (t.pid, t.tid));
    }
}

/// Arguments as a sorted list (the order every format keeps).
pub fn sorted(args: Vec<(&str, Arg)>) -> Vec<(String, Arg)> {
    let mut v: Vec<(String, Arg)> = args.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

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
pub struct Recorder {
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

impl Recorder {
    /// A recorder keeping at most `limit` events (more are counted as lost); `namer` names
    /// each thread the first time it is seen.
    pub fn new(meta: Meta, limit: usize, namer: ThreadNamer) -> Recorder {
        Recorder {
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
            Observation::CuinitStart { start_ns, flags } => {
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
            Observation::CuinitEnd(c) if c.entry_seen => {
                self.note_thread(proc, tid);
                let mut args: Vec<(String, Arg)> = self
                    .open_cuinit
                    .remove(&(tid, c.start_ns))
                    .map(|o| o.args)
                    .unwrap_or_default();
                args.push(("result".into(), c.result.as_str().into()));
                args.push(("code".into(), Arg::Int(c.code)));
                args.push(("failed".into(), Arg::Bool(c.code != 0)));
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
        let mut c = Capture {
            meta,
            processes: self.processes.values().cloned().collect(),
            threads: self
                .threads
                .iter()
                .map(|((pid, tid), name)| Thread {
                    pid: *pid,
                    tid: *tid,
                    name: name.clone(),
                })
                .collect(),
            events,
        };
        dedup_counters(&mut c.events);
        c.normalize();
        c
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
pub(crate) mod tests {
    use super::*;
    use crate::doctor::finding::{Confidence, Finding, Severity};
    use crate::event::testing as ev;

    /// A fixed clock: monotonic 1000 s, wall clock 2025-06-15 (1 750 000 000 s).
    pub fn test_clock() -> Clock {
        Clock {
            offset_ns: 1_750_000_000_000_000_000i128 - 1_000_000_000_000,
            mono_ns: 1_000_000_000_000,
            unix_ns: 1_750_000_000_000_000_000,
        }
    }

    pub fn workload() -> std::sync::Arc<ObservedProcess> {
        ev::process()
    }

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    /// A short story: a cuInit with three ioctls and one open, a failed ioctl outside it,
    /// a second thread whose cuInit hangs in UVM_REGISTER_GPU (stalls, a diagnosis) and
    /// is still running at the end, and one drop report.
    pub fn story() -> Capture {
        let clock = test_clock();
        let meta = Meta::starting(clock, clock.mono_ns + 5 * S, "comm=python3".into(), 999);
        let mut r = Recorder::new(
            meta,
            1000,
            Box::new(|pid, tid| (pid != tid).then(|| format!("worker-{tid}"))),
        );
        let p = workload();
        let t0 = clock.mono_ns;
        let main = 4242;
        r.record(&ev::cuinit_start(&p, main, t0 + 1_200 * MS), 0);
        r.record(
            &ev::open(
                &p,
                main,
                t0 + 1_201 * MS,
                t0 + 1_202 * MS,
                "/dev/nvidia-uvm",
                None,
                true,
            ),
            0,
        );
        for (i, name) in ["UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU"]
            .iter()
            .enumerate()
        {
            let s = t0 + 1_210 * MS + i as u64 * 20 * MS;
            r.record(
                &ev::ioctl(
                    &p,
                    main,
                    s,
                    s + 5 * MS,
                    name,
                    "/dev/nvidia-uvm",
                    "NV_OK",
                    false,
                    true,
                ),
                0,
            );
        }
        r.record(
            &ev::cuinit_end(
                &p,
                main,
                t0 + 1_200 * MS,
                t0 + 1_300 * MS,
                0,
                "CUDA_SUCCESS",
            ),
            0,
        );
        r.record(
            &ev::ioctl(
                &p,
                main,
                t0 + 1_500 * MS,
                t0 + 1_501 * MS,
                "NV_ESC_RM_CONTROL",
                "/dev/nvidiactl",
                "NV_ERR_INVALID_ARGUMENT",
                true,
                false,
            ),
            0,
        );
        let w = 4250;
        r.record(&ev::cuinit_start(&p, w, t0 + 2 * S), 0);
        let inside = Some(("UVM_REGISTER_GPU", "/dev/nvidia-uvm"));
        r.record(
            &ev::stall(
                &p,
                w,
                "UVM_REGISTER_GPU",
                t0 + 2 * S + 10 * MS,
                t0 + 3 * S + 60 * MS,
                inside,
                "S (sleeping)",
                "request_wait_answer",
            ),
            0,
        );
        r.record(
            &ev::stall(
                &p,
                w,
                "cuInit",
                t0 + 2 * S,
                t0 + 3 * S + 60 * MS,
                inside,
                "S (sleeping)",
                "request_wait_answer",
            ),
            0,
        );
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
        r.record(
            &ev::diagnosis(&p, t0 + 3 * S + 61 * MS, &finding, Trigger::Stall),
            0,
        );
        r.record(&ev::scan(0, 3), t0 + 3 * S + 500 * MS);
        r.build(t0 + 4 * S)
    }

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
        let d = find(&c, "diagnosis: uvm_register_gpu_hang")[0];
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
        let mut r = Recorder::new(meta, 2, Box::new(|_, _| None));
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
        let mut r = Recorder::new(meta, 100, Box::new(|_, _| None));
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
}

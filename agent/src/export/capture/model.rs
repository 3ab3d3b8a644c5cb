//! What a capture holds, whatever the file format: the processes and threads seen, and
//! timed events (slices, instants, counter values). [`super::builder::TraceBuilder`] builds it
//! from what the agent core reports; [`super::perfetto`] and [`super::chrome`] write it and
//! read it back.
//!
//! All times are `CLOCK_MONOTONIC` nanoseconds, as the agent reports them; [`Meta::clock`]
//! is the offset to wall-clock time measured when the capture started.

use std::cmp::{Ordering, Reverse};

use crate::event::Clock;

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
    /// CUDA context creations and device counts (`cuCtxCreate*`, `cuDevicePrimaryCtxRetain`,
    /// `cuDeviceGetCount`).
    pub const CONTEXT: &str = "context";
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
    /// A capture of these parts, [normalized](Capture::normalize).
    pub fn normalized(
        meta: Meta,
        processes: Vec<Process>,
        threads: Vec<Thread>,
        events: Vec<Event>,
    ) -> Capture {
        let mut c = Capture {
            meta,
            processes,
            threads,
            events,
        };
        c.normalize();
        c
    }

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

//! Where observed calls go besides the log and the metrics: trace exporters (OTLP) and
//! capture files (Perfetto, Chrome JSON). The agent's core calls every [`Sink`] at the same
//! points it logs: a `cuInit` starting and ending, a driver ioctl worth reporting, a device
//! open, a stall when it is detected and when it ends, a diagnosis.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds (the kernel's `bpf_ktime_get_ns`); use
//! [`Clock::to_unix_nanos`] for wall-clock time.

pub use crate::clock::Clock;
use crate::doctor::finding::Finding;

/// The process a call belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id (init pid namespace).
    pub pid: u32,
    /// Process id inside its own pid namespace (last `NSpid` entry), when different.
    pub ns_pid: Option<u32>,
    /// `comm` of the process.
    pub comm: String,
    /// Executable path, when readable.
    pub exe: String,
    /// Command line, when readable.
    pub cmdline: Vec<String>,
    /// Container id (or `lxc:<name>`), when in one.
    pub container_id: Option<String>,
}

/// One thing the agent observed.
#[derive(Clone, Debug)]
pub enum CallEvent<'a> {
    /// `cuInit` entered.
    CuinitStart {
        proc: &'a ProcessInfo,
        tid: u32,
        start_ns: u64,
        flags: u32,
    },
    /// `cuInit` returned.
    CuinitEnd {
        proc: &'a ProcessInfo,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        /// `CUresult` code and name.
        code: i64,
        result: &'a str,
    },
    /// A driver ioctl that ended: every one inside `cuInit`, and failed or slow ones
    /// outside it.
    Ioctl {
        proc: &'a ProcessInfo,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        /// Ioctl name (`UVM_REGISTER_GPU`) or hex number.
        name: &'a str,
        /// Device node path.
        node: &'a str,
        /// Result label (`NV_OK`, `NV_ERR_NO_MEMORY`, an errno name, `OK`).
        result: &'a str,
        failed: bool,
        in_cuinit: bool,
    },
    /// An open of an NVIDIA device node (failed ones, and all inside `cuInit`).
    Open {
        proc: &'a ProcessInfo,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        path: &'a str,
        /// errno name when it failed.
        errno: Option<&'a str>,
        in_cuinit: bool,
    },
    /// A call crossed its stall threshold (reported while still stuck).
    Stall {
        proc: &'a ProcessInfo,
        tid: u32,
        /// `cuInit` or the ioctl name.
        call: &'a str,
        /// When the stalled call started.
        start_ns: u64,
        /// When the stall was detected.
        detected_ns: u64,
        /// For a `cuInit`: the driver call it is inside (`UVM_REGISTER_GPU on /dev/nvidia-uvm`).
        inside: &'a str,
        /// Thread state and `wchan` from `/proc`.
        thread_state: &'a str,
        wchan: &'a str,
    },
    /// A stalled call ended.
    StallEnd {
        proc: &'a ProcessInfo,
        tid: u32,
        call: &'a str,
        start_ns: u64,
        end_ns: u64,
        /// `returned`, `thread_exited` or `ended`.
        outcome: &'a str,
    },
    /// A diagnosis rule fired for this process.
    Diagnosis {
        proc: &'a ProcessInfo,
        tid: u32,
        ts_ns: u64,
        finding: &'a Finding,
    },
    /// Events lost before user space saw them (ring buffer full), as a running total.
    Dropped { total: u64 },
}

impl CallEvent<'_> {
    /// The process the event concerns (`None` for [`CallEvent::Dropped`]).
    pub fn process(&self) -> Option<&ProcessInfo> {
        match self {
            CallEvent::CuinitStart { proc, .. }
            | CallEvent::CuinitEnd { proc, .. }
            | CallEvent::Ioctl { proc, .. }
            | CallEvent::Open { proc, .. }
            | CallEvent::Stall { proc, .. }
            | CallEvent::StallEnd { proc, .. }
            | CallEvent::Diagnosis { proc, .. } => Some(proc),
            CallEvent::Dropped { .. } => None,
        }
    }
}

/// A consumer of observed calls. Called on the agent's event loop: keep it quick (queue and
/// send elsewhere for network exporters).
pub trait Sink: Send {
    /// One observed event.
    fn event(&mut self, ev: &CallEvent<'_>);
    /// Called at shutdown (and may be called periodically): write out what is buffered.
    fn flush(&mut self) {}
}

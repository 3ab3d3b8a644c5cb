//! The one event: what the observer saw, built once with everything resolved (the names of
//! ioctls, `NV_STATUS`, `CUresult` and errno values, the process's identity and workload,
//! the diagnosis of a failure or stall), then handed as the same [`Arc<Event>`] to every
//! [`Listener`]: the log, the metrics, the health endpoint, the OTLP exporter, a capture.
//! No listener mirrors another's types; each takes from an event what it needs.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds (the kernel's `bpf_ktime_get_ns`); use
//! [`Clock::to_unix_nanos`] for wall-clock time.
//!
//! Over 800 lines: the event is one type on purpose (every listener matches the same
//! [`Kind`]), so its kinds and their payloads stay in one file; the tests at the bottom
//! build each kind once.

use std::{sync::Arc, time::Duration};

pub use crate::clock::Clock;
pub use crate::host::identity::Process;
use crate::{
    doctor::{
        engine::Differential,
        facts::SeenCall,
        finding::{Finding, Severity, Standing},
    },
    kernel::registry::{ProbeSpec, ProbeState},
};

/// One thing the agent observed or did.
#[derive(Clone, Debug)]
pub struct Event {
    /// When it happened (a call's end, a stall's detection, ...), monotonic ns.
    pub ts_ns: u64,
    /// The process it is about; `None` for the agent's own events.
    pub process: Option<Arc<Process>>,
    /// The thread it is about (0 when none).
    pub tid: u32,
    /// `comm` of that thread when the kernel recorded the event (a thread can be named
    /// apart from its process); empty when none.
    pub comm: String,
    /// What happened.
    pub kind: Kind,
}

impl Event {
    /// An event of the agent itself (no process).
    pub fn agent(ts_ns: u64, kind: Kind) -> Event {
        Event {
            ts_ns,
            process: None,
            tid: 0,
            comm: String::new(),
            kind,
        }
    }

    /// The pid of the process it is about.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// The findings the diagnosis attached (a failed `cuInit` or open, a stall).
    pub fn findings(&self) -> &[Arc<Finding>] {
        match &self.kind {
            Kind::CuinitEnd(c) => &c.findings,
            Kind::Open(o) => &o.findings,
            Kind::Stall(s) => &s.findings,
            Kind::ContextCall(c) => &c.findings,
            _ => &[],
        }
    }
}

/// What an [`Event`] is.
#[derive(Clone, Debug)]
pub enum Kind {
    /// `cuInit` entered: seen by its uprobe, or (`late`) found at its first driver call
    /// because its libcuda was loaded before the probes were attached (`start_ns` is then
    /// that call's start, `flags` 0).
    CuinitStart {
        start_ns: u64,
        /// The `Flags` argument.
        flags: u32,
        /// Found from its driver calls, its entry not seen.
        late: bool,
    },
    /// `cuInit` returned.
    CuinitEnd(CuinitEnd),
    /// A driver ioctl that ended: every one inside `cuInit`, failed or slow ones outside.
    Ioctl(Ioctl),
    /// An open of an NVIDIA device node (failed ones, and all inside `cuInit`).
    Open(Open),
    /// A probed kernel or driver function failed.
    KernelSignal(KernelSignal),
    /// A CUDA context creation returned (every one), or `cuDeviceGetCount` (when it failed,
    /// or returned a count new for the process).
    ContextCall(ContextCall),
    /// A thread exited with a `cuInit` or driver call in flight.
    DiedInCall(DiedInCall),
    /// A call crossed its stall threshold (reported while still stuck). Boxed: the largest
    /// kind by far, and a rare one.
    Stall(Box<Stall>),
    /// A stalled call ended.
    StallEnd(StallEnd),
    /// A tracked process forked.
    Fork {
        /// The new process.
        child: u32,
    },
    /// A tracked process exec'ed a new image.
    Exec,
    /// A tracked process exited.
    ProcessExit,
    /// A diagnosis rule's finding (one event per finding, after the event that caused it).
    Diagnosis(Diagnosis),
    /// The set of findings active for `uvmwatch_diagnosis` changed.
    ActiveFindings(ActiveFindings),
    /// The agent runs: probes attached, start-up work done.
    Started(Started),
    /// The agent stops (probes detached after this).
    Stopped {
        /// What stopped it: `SIGTERM`, `SIGINT`, `duration`, ...
        signal: &'static str,
    },
    /// `cuInit` probes were attached to a libcuda file.
    LibcudaAttached {
        /// Path inside the process's mount namespace (or the host path).
        path: String,
        /// Path the probes were attached through.
        host_path: String,
        /// How the file was found.
        source: String,
        /// Seconds from when the file was found (the kernel's time of the open that made
        /// the agent find it; the attach's start for a file found otherwise) to its probes
        /// attached.
        attach_seconds: f64,
    },
    /// A libcuda file could not be probed.
    LibcudaAttachFailed { path: String, error: String },
    /// A `--libcuda` path could not be used.
    LibcudaFlagUnusable { error: String },
    /// No libcuda was found at start.
    LibcudaNotFound,
    /// A process opened a libcuda file that could not be resolved to a file to probe.
    LibcudaUnresolved { path: String, error: String },
    /// NVIDIA fds opened before the agent started were learned from `/proc`.
    FdsLearned { count: usize },
    /// A thread was already inside a driver call when the agent started.
    InFlightAtStart {
        /// Ioctl name (or hex number).
        ioctl: String,
        /// Device node path.
        node: String,
    },
    /// The module the module kprobes target was loaded or unloaded.
    ModuleChanged { module: &'static str, loaded: bool },
    /// The ioctl layouts statuses are read with: at start, and when the driver's version
    /// changes.
    DriverLayout(DriverLayout),
    /// The probe table changed (start, a libcuda attached, a module came or went).
    ProbesChanged {
        /// Every probe and its state.
        probes: Vec<(ProbeSpec, ProbeState)>,
        /// libcuda files with `cuInit` probes.
        libcuda_targets: usize,
        /// What the agent can see here, feature by feature.
        features: Vec<crate::kernel::features::Feature>,
        /// The backend the syscalls are hooked with, and why.
        backend: crate::kernel::registry::BackendChosen,
    },
    /// The diagnosis facts changed.
    EvidenceChanged,
    /// Entries of processes that are gone were removed from `PROCS`.
    Swept { removed: usize },
    /// A pass of the stall scan (every [`crate::observer::stall::SCAN_INTERVAL`]).
    Scan(Scan),
}

/// What a `cuInit` did while it ran, and how it ended for the diagnosis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallSummary {
    /// Driver ioctls made inside it.
    pub driver_calls: u32,
    /// NVIDIA device opens made inside it.
    pub device_opens: u32,
    /// The last failed driver call or open inside it (calls on a negative fd left out:
    /// they follow a failed open and reach no driver).
    pub last_failure: Option<FailedStep>,
    /// The last failed driver call inside it.
    pub failed_call: Option<SeenCall>,
    /// Failed opens inside it: (path, errno name).
    pub failed_opens: Vec<(String, String)>,
    /// Kernel-side signals seen on the thread meanwhile (`function = result`).
    pub kernel_signals: Vec<String>,
    /// The process was forked, without exec, from one whose `cuInit` had succeeded.
    pub forked_after_parent_init: bool,
    /// Seconds the first successful open of a GPU node (`/dev/nvidia<N>`) inside it took.
    pub first_gpu_open_seconds: Option<f64>,
    /// It was reported as stalled before it returned (its diagnosis came with the stall).
    pub stalled: bool,
}

/// How much of a `cuInit` call the probes saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Its entry and its return (with the `CUresult`).
    Whole,
    /// Its return, not its entry: its start is its first driver call's, or its return's
    /// when none was seen.
    Return,
    /// Neither: only its driver calls (its libcuda was loaded and the call made before the
    /// probes were attached). Its result is inferred from them where they tell it.
    DriverCalls,
}

impl Seen {
    /// The name records and metric labels use.
    pub fn name(self) -> &'static str {
        match self {
            Seen::Whole => "whole",
            Seen::Return => "return",
            Seen::DriverCalls => "driver_calls",
        }
    }
}

/// A `cuInit` found at its first driver call (a late one, [`Kind::CuinitStart`] with
/// `late`): how its end was known and, when its return was not seen, where its result
/// comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateCall {
    /// `returned` (the uretprobe saw it), `next_cuinit` or `next_call` (the thread entered
    /// `cuInit` or a probed context call), `exec`, `thread_exited`, `process_exited`, or
    /// `quiet` (no driver call for a while).
    pub ended: &'static str,
    /// What the result was inferred from (empty when the return was seen, or when the result
    /// is unknown).
    pub result_basis: String,
}

/// A driver call or device open that failed inside a `cuInit`: what the `cuinit_end`
/// record, the failure metric, the span and the diagnosis name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailedStep {
    /// For people: `UVM_REGISTER_GPU on /dev/nvidia-uvm`, `open /dev/nvidia-uvm`.
    pub what: String,
    /// The metric-label form of the call: the ioctl's label (`UVM_REGISTER_GPU`,
    /// `unknown`), or `open`.
    pub call: String,
    /// The node's label (`nvidia-uvm`, `nvidiactl`, `nvidia0`).
    pub node: String,
    /// Its result: an `NV_ERR_*` name or an errno name.
    pub result: String,
}

/// `cuInit` returned.
#[derive(Clone, Debug)]
pub struct CuinitEnd {
    /// Entry time (a late call's first driver call; the return time when neither was seen).
    pub start_ns: u64,
    /// The `CUresult` and its name (`cuda.h`); for a call whose return was not seen, the one
    /// inferred from its driver calls, or `-1` and `unknown`.
    pub code: i64,
    pub result: String,
    /// How much of the call the probes saw.
    pub seen: Seen,
    /// Set for a call found at its first driver call (its start was reported then); boxed,
    /// as most calls have none.
    pub late: Option<Box<LateCall>>,
    /// What the call did.
    pub call: CallSummary,
    /// The diagnosis of a failure (empty for success).
    pub findings: Vec<Arc<Finding>>,
}

impl CuinitEnd {
    /// Whether its start was reported ([`Kind::CuinitStart`]): its entry was seen, or it was
    /// found at its first driver call. A call whose return alone was seen had none.
    pub fn start_reported(&self) -> bool {
        self.seen == Seen::Whole || self.late.is_some()
    }
}

/// A driver ioctl.
#[derive(Clone, Debug)]
pub struct Ioctl {
    pub start_ns: u64,
    /// Request number.
    pub cmd: u32,
    /// Its name (`UVM_REGISTER_GPU`), or the request number in hex.
    pub name: String,
    /// The metric-label form of the name (`unknown` for unnamed requests).
    pub label: &'static str,
    /// Device node path (`/dev/nvidia-uvm`).
    pub node: String,
    /// The result label: `NV_OK`, an `NV_ERR_*` name, an errno name, `OK`,
    /// `PARAMS_UNREADABLE`.
    pub result: String,
    /// The syscall's return value.
    pub ret: i64,
    /// Failed: an errno, or a non-zero `rmStatus`.
    pub failed: bool,
    /// Took at least `--slow-ioctl`.
    pub slow: bool,
    /// Made inside `cuInit`.
    pub in_cuinit: bool,
}

/// An open of an NVIDIA device node.
#[derive(Clone, Debug)]
pub struct Open {
    pub start_ns: u64,
    /// The path opened.
    pub path: String,
    /// The node's label (`nvidia-uvm`, `nvidia0`, ...).
    pub node: String,
    /// The errno name when it failed.
    pub errno: Option<String>,
    /// The syscall's return value (the fd, or `-errno`; 0 for a success whose fd is not
    /// known).
    pub ret: i64,
    /// The new fd, when known (the fentry backend sees an open before its fd exists).
    pub fd: Option<i64>,
    /// Whether the open's start was seen (so its duration is known).
    pub timed: bool,
    /// Made inside `cuInit`.
    pub in_cuinit: bool,
    /// The diagnosis of a failed open.
    pub findings: Vec<Arc<Finding>>,
}

/// A CUDA context or device call probed in libcuda (`cuCtxCreate*`,
/// `cuDevicePrimaryCtxRetain`, `cuDeviceGetCount`) that returned.
#[derive(Clone, Debug)]
pub struct ContextCall {
    /// Entry time (the return time when the entry was not seen).
    pub start_ns: u64,
    /// The exported symbol called (`cuCtxCreate_v2`, ...).
    pub call: &'static str,
    /// The `CUresult` and its name (`cuda.h`).
    pub code: i64,
    pub result: String,
    /// The `CUdevice` it was for (`cuCtxCreate*`, `cuDevicePrimaryCtxRetain`).
    pub device: Option<i32>,
    /// `cuDeviceGetCount`: the count it returned, when it succeeded and was read.
    pub count: Option<i32>,
    /// Whether the entry was seen (otherwise the call started before the probe).
    pub entry_seen: bool,
    /// The process's `cuInit` was seen returning 0.
    pub cuinit_succeeded: bool,
    /// The last device count `cuDeviceGetCount` returned in the process (this call's, for
    /// a successful `cuDeviceGetCount`).
    pub device_count_seen: Option<i32>,
    /// The GPU nodes (`/dev/nvidia<N>`) the process sees in its root (`/proc/<pid>/root/dev`),
    /// read for a `cuDeviceGetCount` and for a failed call; `None` when unreadable.
    pub gpu_nodes: Option<u32>,
    /// `CUDA_VISIBLE_DEVICES` in the process's initial environment (`/proc/<pid>/environ`),
    /// read with [`ContextCall::gpu_nodes`]; `None` when unset or unreadable.
    pub cuda_visible_devices: Option<String>,
    /// A successful `cuDeviceGetCount` whose count is below the devices the process has (its
    /// GPU nodes, else with MIG on the MIG devices `nvidia-smi` lists; at most the entries of
    /// `CUDA_VISIBLE_DEVICES`): the diagnosis then runs (see
    /// `doctor::signal::device_count_disagrees`).
    pub count_disagrees: bool,
    /// The diagnosis of a failure or of a disagreeing count.
    pub findings: Vec<Arc<Finding>>,
}

impl ContextCall {
    /// `cuDeviceGetCount` rather than a context creation.
    pub fn is_device_count(&self) -> bool {
        self.call
            == uvmwatch_common::context_call::name(uvmwatch_common::context_call::DEVICE_GET_COUNT)
    }

    /// Failed: a `CUresult` other than `CUDA_SUCCESS`.
    pub fn failed(&self) -> bool {
        self.code != 0
    }
}

/// A probed kernel or driver function that failed.
#[derive(Clone, Debug)]
pub struct KernelSignal {
    pub start_ns: u64,
    /// The function (`request_free_mem_region`).
    pub function: &'static str,
    /// Its result: an `NV_STATUS` name, or `-<errno> (<name>)`.
    pub result: String,
    /// Called inside an ioctl on a UVM node.
    pub in_uvm_ioctl: bool,
}

impl KernelSignal {
    /// The signal as the diagnosis rules take it: `function = result`.
    pub fn text(&self) -> String {
        format!("{} = {}", self.function, self.result)
    }
}

/// A thread that exited inside calls.
#[derive(Clone, Debug)]
pub struct DiedInCall {
    /// The calls it was inside, outermost first (`cuInit`, the ioctl's name).
    pub calls: Vec<String>,
    /// It died inside a `cuInit` whose start the agent had seen (counted as
    /// `thread_exited`).
    pub cuinit_seen: bool,
}

/// What kind of call stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `cuInit` (uprobe).
    Cuinit,
    /// An ioctl on an NVIDIA node.
    Ioctl,
}

impl CallKind {
    /// As the stall record names it: `cuInit`, `driver ioctl`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Cuinit => "cuInit",
            CallKind::Ioctl => "driver ioctl",
        }
    }
}

/// The driver call a stalled `cuInit` is waiting in.
#[derive(Clone, Debug, PartialEq)]
pub struct Inside {
    /// Ioctl name (or hex number).
    pub call: String,
    /// Device node path.
    pub node: String,
    /// When it started.
    pub start_ns: u64,
}

impl Inside {
    /// `UVM_REGISTER_GPU on /dev/nvidia-uvm`.
    pub fn text(&self) -> String {
        format!("{} on {}", self.call, self.node)
    }
}

/// What `/proc` showed of a stuck thread when its stall was reported (empty fields when
/// it could not be read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadSnapshot {
    /// Read at all.
    pub read: bool,
    pub comm: String,
    pub exe: String,
    pub container_id: String,
    /// `S (sleeping)`, `D (disk sleep)`, ...
    pub state: String,
    pub wchan: String,
    /// Kernel stack, innermost first.
    pub stack: Vec<String>,
}

/// A call past its stall threshold.
#[derive(Clone, Debug)]
pub struct Stall {
    pub kind: CallKind,
    /// `cuInit`, or the ioctl's name (or hex number).
    pub call: String,
    /// The metric label (`cuInit`, the ioctl label).
    pub label: String,
    /// When the call started.
    pub start_ns: u64,
    /// The threshold it crossed, ns.
    pub threshold_ns: u64,
    /// For a stalled ioctl, or a `cuInit` inside one: the node of the driver call.
    pub node: String,
    /// For a `cuInit`: the driver call it is inside.
    pub inside: Option<Inside>,
    /// When the thread's `cuInit` started, when the stalled call is in one.
    pub cuinit_start_ns: Option<u64>,
    /// The stuck thread in `/proc`.
    pub thread: ThreadSnapshot,
    /// What the thread's `cuInit` did so far, when the agent saw it start.
    pub call_so_far: Option<CallSummary>,
    /// The diagnosis.
    pub findings: Vec<Arc<Finding>>,
}

impl Stall {
    /// How long the call had been running when reported, ns.
    pub fn age_ns(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.start_ns)
    }
}

/// How a stalled call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallOutcome {
    /// Its exit was seen.
    Returned,
    /// Its thread exited.
    ThreadExited,
    /// It left the kernel's map without an exit record.
    Ended,
}

impl StallOutcome {
    /// `returned`, `thread_exited`, `ended`.
    pub fn as_str(self) -> &'static str {
        match self {
            StallOutcome::Returned => "returned",
            StallOutcome::ThreadExited => "thread_exited",
            StallOutcome::Ended => "ended",
        }
    }
}

/// A stalled call ended.
#[derive(Clone, Debug)]
pub struct StallEnd {
    pub kind: CallKind,
    /// `cuInit` or the ioctl's name.
    pub call: String,
    /// The metric label.
    pub label: String,
    pub start_ns: u64,
    pub outcome: StallOutcome,
    /// For a returned ioctl: its node.
    pub node: Option<String>,
    /// For a returned call: its result label (and for `cuInit` its code).
    pub result: Option<String>,
    pub code: Option<i64>,
}

/// What made the diagnosis run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The host's facts alone (at start, and whenever they change).
    Evidence,
    /// A failed `cuInit`.
    CuinitEnd,
    /// A failed device open.
    DeviceOpenFailed,
    /// A stall.
    Stall,
    /// A failed CUDA context creation or `cuDeviceGetCount`.
    ContextCall,
    /// A device count below the GPUs the process has.
    DeviceCount,
}

impl Trigger {
    /// `evidence`, `cuinit_end`, `device_open_failed`, `stall`, `context_call`,
    /// `device_count` (the `event` of the cause).
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Evidence => "evidence",
            Trigger::CuinitEnd => "cuinit_end",
            Trigger::DeviceOpenFailed => "device_open_failed",
            Trigger::Stall => "stall",
            Trigger::ContextCall => "context_call",
            Trigger::DeviceCount => "device_count",
        }
    }
}

/// One finding of a differential, with the differential it is part of (its symptom, the
/// other causes, those ruled out).
#[derive(Clone, Debug)]
pub struct Diagnosis {
    pub finding: Arc<Finding>,
    pub trigger: Trigger,
    pub differential: Arc<Differential>,
}

/// The findings that `uvmwatch_diagnosis` shows: active ones at 1, cleared ones at 0, each
/// as (cause, severity, standing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActiveFindings {
    pub active: Vec<(String, Severity, Standing)>,
    pub cleared: Vec<(String, Severity, Standing)>,
}

/// The agent is running.
#[derive(Clone, Debug)]
pub struct Started {
    /// Address of `/metrics`, or `none`.
    pub listen: String,
    pub probes_attached: usize,
    pub probes_total: usize,
    pub libcuda_targets: usize,
    pub cuinit_stall: Duration,
    pub ioctl_stall: Duration,
    /// `fentry` or `tracepoint` (`kernel::registry::Backend::name`).
    pub backend: &'static str,
    /// Why that backend (the kernel's refusal of the other, or the flag).
    pub backend_reason: String,
}

/// Which driver release's ioctl params layouts the kernel side reads statuses with
/// (`observer::driver`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverLayout {
    /// The running driver's version, when known (`535.104.05`).
    pub driver: Option<String>,
    /// Where the version came from (a path, `--driver-version`, the snapshot), or why it is
    /// not known.
    pub source: String,
    /// The known release whose layouts are used (`decode::layouts`).
    pub layout: String,
    /// `exact` (the driver's own), `nearest` (a version the table does not know) or
    /// `newest` (no version known).
    pub selection: &'static str,
}

/// One pass of the stall scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// `cuInit` calls in flight now.
    pub cuinit_in_flight: usize,
    /// Records lost so far: ring buffer full in the kernel, or undecodable here.
    pub dropped_total: u64,
    /// Of those, the ones lost here (undecodable).
    pub undecodable_total: u64,
    /// Records taken from the ring buffer so far.
    pub received_total: u64,
    /// Times a process's identity could not be read when needed, so far
    /// (`host::identity::Identities::gone_total`).
    pub identities_unread_total: u64,
    /// The ring buffer was emptied before this pass: decoding keeps up.
    pub caught_up: bool,
}

/// A consumer of events. Called on the observer's loop: keep it quick (a network exporter
/// queues and sends from its own thread).
pub trait Listener: Send {
    /// One event.
    fn event(&mut self, ev: &Arc<Event>);
    /// Called at shutdown: write out what is buffered.
    fn flush(&mut self) {}
}

/// Events for the listeners' unit tests: a process and one builder per kind they consume.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) mod testing {
    use super::*;

    /// A PyTorch process in a container: pid 4242 (7 inside its namespace).
    pub fn process() -> Arc<Process> {
        Arc::new(Process {
            pid: 4242,
            ns_pid: Some(7),
            comm: "python3".into(),
            exe: "/usr/bin/python3.11".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            container_id: Some("3f1c0ffee0ddba11".into()),
            workload: Default::default(),
        })
    }

    /// An event of `p`'s thread `tid` at `ts_ns`.
    pub fn at(p: &Arc<Process>, tid: u32, ts_ns: u64, kind: Kind) -> Event {
        Event {
            ts_ns,
            process: Some(p.clone()),
            tid,
            comm: p.comm.clone(),
            kind,
        }
    }

    pub fn cuinit_start(p: &Arc<Process>, tid: u32, start_ns: u64) -> Event {
        at(
            p,
            tid,
            start_ns,
            Kind::CuinitStart {
                start_ns,
                flags: 0,
                late: false,
            },
        )
    }

    pub fn cuinit_end(
        p: &Arc<Process>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        code: i64,
        result: &str,
    ) -> Event {
        at(
            p,
            tid,
            end_ns,
            Kind::CuinitEnd(CuinitEnd {
                start_ns,
                code,
                result: result.into(),
                seen: Seen::Whole,
                late: None,
                call: CallSummary::default(),
                findings: Vec::new(),
            }),
        )
    }

    pub fn ioctl(
        p: &Arc<Process>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        name: &str,
        node: &str,
        result: &str,
        failed: bool,
        in_cuinit: bool,
    ) -> Event {
        at(
            p,
            tid,
            end_ns,
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
            }),
        )
    }

    pub fn open(
        p: &Arc<Process>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        path: &str,
        errno: Option<&str>,
        in_cuinit: bool,
    ) -> Event {
        at(
            p,
            tid,
            end_ns,
            Kind::Open(Open {
                start_ns,
                path: path.into(),
                node: path.trim_start_matches("/dev/").into(),
                errno: errno.map(str::to_string),
                ret: if errno.is_some() { -1 } else { 3 },
                fd: errno.is_none().then_some(3),
                timed: true,
                in_cuinit,
                findings: Vec::new(),
            }),
        )
    }

    /// A context or device call `call` of `p`'s thread `tid` that returned `code`
    /// (`result`); `count` for a `cuDeviceGetCount`.
    pub fn context_call(
        p: &Arc<Process>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        call: &'static str,
        code: i64,
        result: &str,
        count: Option<i32>,
    ) -> Event {
        let device_count = call == "cuDeviceGetCount";
        at(
            p,
            tid,
            end_ns,
            Kind::ContextCall(ContextCall {
                start_ns,
                call,
                code,
                result: result.into(),
                device: (!device_count).then_some(0),
                count,
                entry_seen: true,
                cuinit_succeeded: true,
                device_count_seen: count,
                gpu_nodes: None,
                cuda_visible_devices: None,
                count_disagrees: false,
                findings: Vec::new(),
            }),
        )
    }

    /// A stall of `call` (`cuInit` or an ioctl), `inside` the driver call (name, node) its
    /// thread waits in.
    pub fn stall(
        p: &Arc<Process>,
        tid: u32,
        call: &str,
        start_ns: u64,
        detected_ns: u64,
        inside: Option<(&str, &str)>,
        state: &str,
        wchan: &str,
    ) -> Event {
        let kind = if call == "cuInit" {
            CallKind::Cuinit
        } else {
            CallKind::Ioctl
        };
        at(
            p,
            tid,
            detected_ns,
            Kind::Stall(Box::new(Stall {
                kind,
                call: call.into(),
                label: call.into(),
                start_ns,
                threshold_ns: 0,
                node: inside.map(|i| i.1.to_string()).unwrap_or_default(),
                inside: inside.map(|(c, n)| Inside {
                    call: c.into(),
                    node: n.into(),
                    start_ns,
                }),
                cuinit_start_ns: None,
                thread: ThreadSnapshot {
                    read: true,
                    state: state.into(),
                    wchan: wchan.into(),
                    ..ThreadSnapshot::default()
                },
                call_so_far: None,
                findings: Vec::new(),
            })),
        )
    }

    pub fn stall_end(
        p: &Arc<Process>,
        tid: u32,
        call: &str,
        start_ns: u64,
        end_ns: u64,
        outcome: StallOutcome,
    ) -> Event {
        let kind = if call == "cuInit" {
            CallKind::Cuinit
        } else {
            CallKind::Ioctl
        };
        at(
            p,
            tid,
            end_ns,
            Kind::StallEnd(StallEnd {
                kind,
                call: call.into(),
                label: call.into(),
                start_ns,
                outcome,
                node: None,
                result: None,
                code: None,
            }),
        )
    }

    /// A finding about `p` (a stall's, unless `trigger` says otherwise), alone in its
    /// differential.
    pub fn diagnosis(p: &Arc<Process>, ts_ns: u64, finding: &Finding, trigger: Trigger) -> Event {
        at(
            p,
            p.pid,
            ts_ns,
            Kind::Diagnosis(Diagnosis {
                finding: Arc::new(finding.clone()),
                trigger,
                differential: Arc::new(Differential {
                    symptom: None,
                    findings: vec![finding.clone()],
                    ruled_out: Vec::new(),
                    also: Vec::new(),
                }),
            }),
        )
    }

    /// A scan pass reporting `dropped_total` lost records.
    pub fn scan(ts_ns: u64, dropped_total: u64) -> Event {
        Event::agent(
            ts_ns,
            Kind::Scan(Scan {
                cuinit_in_flight: 0,
                dropped_total,
                undecodable_total: 0,
                received_total: 0,
                identities_unread_total: 0,
                caught_up: true,
            }),
        )
    }
}

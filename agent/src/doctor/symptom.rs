//! The symptom: what failed or hung, and where, named before any cause. From what the probes
//! saw of a process when they saw a failure (a `cuInit` that failed or hangs, a driver call
//! stuck or refused, a device open refused, a start-up call of the CUDA driver API that
//! failed, a fork after `cuInit`, a slow start), else from what the host recorded (a module
//! the kernel refused, a GPU that failed, a driver that sees no GPU, `nvidia-smi` failing,
//! nodes missing). A host with neither has no symptom: only its hazards are judged.
//!
//! Causes declare the symptoms they can produce ([`Fits`]); the engine weighs only those
//! that can produce the one here.

use serde::Serialize;

use super::facts::{Observations, SeenCall};
use super::finding::Severity;
use super::signal::{Sig, Signals, Source};
use crate::decode::nvidia::cu_result_name;

/// The start-up calls of the CUDA driver API the agent probes after `cuInit` (context
/// creation, device count): a failure of one of them is a start-up symptom; other calls (a
/// kernel launch) are past start-up.
pub const START_CALLS: &[&str] = &[
    "cuCtxCreate",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceGetCount",
];

/// What the host recorded as failing, when no process was seen failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostSymptom {
    /// The nvidia module is not loaded, though an NVIDIA GPU, NVIDIA's tools or a refused
    /// load say it should be.
    DriverNotLoaded,
    /// The driver sees no GPU (refused to load for want of one, or registered none).
    DriverSeesNoGpu,
    /// A GPU failed in the kernel (failed to initialize, fell off the bus, GSP failed).
    GpuFailed,
    /// The loaded driver refused a GPU on the bus for its branch or flavour (a legacy GPU, a
    /// GPU without GSP under the open module); it may drive others.
    GpuNotDriven,
    /// The kernel logged a lockup, hung task or oops in nvidia code.
    DriverHangLogged,
    /// The user-space driver and the kernel module do not match (kernel log or NVML).
    VersionMismatch,
    /// `nvidia-smi` finds no GPU.
    SmiNoDevices,
    /// `nvidia-smi` fails with `Unknown Error`.
    SmiUnknownError,
    /// nvidia_uvm logged its HMM set-up failing.
    HmmErrorLogged,
    /// A device node's number is not the kernel's.
    NodeNumberMismatch,
    /// Access to a device node is refused.
    NodeDenied,
    /// nvidia_uvm or a device node is missing where CUDA runs.
    NodesMissing,
    /// `nvidia-smi -q` did not answer in time.
    SmiTimedOut,
    /// WSL2's GPU interface or libraries are missing or shadowed.
    WslBroken,
    /// The kernel logged a WARNING in nvidia code.
    DriverWarnLogged,
}

/// What failed, typed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SymptomKind {
    /// `cuInit` returned this `CUresult`.
    CuinitFailed { code: i64 },
    /// `cuInit` has not returned (its driver call unseen).
    CuinitHung,
    /// A thread sleeps and has not come back (its state, `wchan` or kernel stack seen; the
    /// call it is in unseen): `nvidia-smi` or another driver user, stuck.
    ThreadStuck { state: String },
    /// A thread is inside this driver call and has not returned.
    CallHung { call: String, node: String },
    /// A driver call failed (outside a `cuInit` that returned 0).
    CallFailed {
        call: String,
        node: String,
        status: String,
    },
    /// An open of a device node failed with this errno.
    OpenFailed { node: String, errno: String },
    /// A start-up call after `cuInit` failed ([`START_CALLS`], or a call not named).
    StartCallFailed { call: String, code: i64 },
    /// A call past start-up failed (a kernel launch, a library's set-up), as another tool
    /// recorded it.
    LaterCallFailed { call: String, code: i64 },
    /// `cuDeviceGetCount` gave fewer devices than the GPUs the process has.
    DeviceCountLow { count: i32 },
    /// The process was forked without exec after its parent's `cuInit`.
    ForkedAfterInit,
    /// `cuInit` succeeded but slowly.
    SlowStart { seconds: f64 },
    /// What the host recorded.
    Host { what: HostSymptom },
}

/// The symptom of one judgement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Symptom {
    /// What failed, typed.
    #[serde(flatten)]
    pub kind: SymptomKind,
    /// It in words: `cuInit returned 3 (CUDA_ERROR_NOT_INITIALIZED) after 0.41 s`.
    pub what: String,
    /// The driver call or open that failed inside it, when another than itself:
    /// `UVM_REGISTER_GPU on /dev/nvidia-uvm -> NV_ERR_NO_MEMORY (0.050 s)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inside: Option<String>,
    /// How bad: critical when CUDA cannot start or hangs.
    pub severity: Severity,
    /// Where it was seen.
    pub source: Source,
}

/// A pattern of symptoms a cause can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fits {
    /// `cuInit` returned one of these codes (any failure when empty).
    Cuinit(&'static [i64]),
    /// `cuInit` hangs with its driver call unseen.
    CuinitHung,
    /// A thread stuck in this driver call (any when `None`; `None` also matches a thread
    /// stuck in a call not seen).
    CallHung(Option<&'static str>),
    /// This driver call failed (any when `None`).
    CallFailed(Option<&'static str>),
    /// An open failed with one of these errnos.
    Open(&'static [&'static str]),
    /// A start-up call returned one of these codes (any failure when empty).
    StartCall(&'static [i64]),
    /// A call past start-up returned one of these codes (any failure when empty).
    LaterCall(&'static [i64]),
    /// Fewer CUDA devices than GPUs.
    DeviceCountLow,
    /// A fork after `cuInit`.
    Fork,
    /// A slow successful start.
    Slow,
    /// This host-recorded symptom.
    Host(HostSymptom),
}

impl Fits {
    /// Whether the symptom is one of this pattern's.
    pub fn matches(self, s: &SymptomKind) -> bool {
        match (self, s) {
            (Fits::Cuinit(codes), SymptomKind::CuinitFailed { code }) => {
                codes.is_empty() || codes.contains(code)
            }
            (Fits::CuinitHung, SymptomKind::CuinitHung) => true,
            (Fits::CallHung(c), SymptomKind::CallHung { call, .. }) => c.is_none_or(|c| c == call),
            (Fits::CallHung(None), SymptomKind::ThreadStuck { .. }) => true,
            (Fits::CallFailed(c), SymptomKind::CallFailed { call, .. }) => {
                c.is_none_or(|c| c == call)
            }
            (Fits::Open(errnos), SymptomKind::OpenFailed { errno, .. }) => {
                errnos.contains(&errno.as_str())
            }
            (Fits::StartCall(codes), SymptomKind::StartCallFailed { code, .. }) => {
                codes.is_empty() || codes.contains(code)
            }
            (Fits::LaterCall(codes), SymptomKind::LaterCallFailed { code, .. }) => {
                codes.is_empty() || codes.contains(code)
            }
            (Fits::DeviceCountLow, SymptomKind::DeviceCountLow { .. }) => true,
            (Fits::Fork, SymptomKind::ForkedAfterInit) => true,
            (Fits::Slow, SymptomKind::SlowStart { .. }) => true,
            (Fits::Host(h), SymptomKind::Host { what }) => h == *what,
            _ => false,
        }
    }
}

fn secs(s: Option<f64>) -> String {
    s.map(|s| format!(" after {s:.2} s")).unwrap_or_default()
}

fn call_text(c: &SeenCall) -> String {
    super::signal::call_text(c)
}

/// The first failed call or open inside a process's `cuInit`, to name beside it.
fn inside(o: &Observations) -> Option<String> {
    if let Some(c) = &o.failed_call {
        return Some(call_text(c));
    }
    o.failed_opens
        .first()
        .map(|(p, e)| format!("open {p} -> {e}"))
}

/// What was seen of a stuck thread whose call was not seen, in words: its state, `wchan`
/// and top frame. `None` without any (and for a process whose `cuInit` returned: its stuck
/// call would have been seen).
fn stuck_thread(o: &Observations) -> Option<String> {
    if o.cuinit_result.is_some() {
        return None;
    }
    let parts: Vec<String> = [
        o.stuck_state.as_ref().map(|s| format!("state {s}")),
        o.stuck_wchan.as_ref().map(|w| format!("wchan {w}")),
        o.stuck_stack.first().map(|f| format!("in {f}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The symptom of what the probes saw of a process, when they saw a failure.
fn of_process(o: &Observations, s: &Signals) -> Option<Symptom> {
    let probe = |name: &str| Source::probe(format!("probe:{name}"));
    if let Some(c) = o.stuck_in.as_ref().filter(|c| c.result.is_empty()) {
        let who = if o.cuinit_in_flight {
            "cuInit is stuck in "
        } else {
            ""
        };
        return Some(Symptom {
            kind: SymptomKind::CallHung {
                call: c.call.clone(),
                node: c.node.clone(),
            },
            what: format!("{who}{} for {:.0} s", c.what(), c.seconds),
            inside: None,
            severity: Severity::Critical,
            source: probe("ioctl"),
        });
    }
    if o.cuinit_in_flight {
        return Some(Symptom {
            kind: SymptomKind::CuinitHung,
            what: format!("cuInit has not returned{}", secs(o.cuinit_seconds)),
            inside: None,
            severity: Severity::Critical,
            source: probe("cuInit"),
        });
    }
    if let Some(state) = stuck_thread(o) {
        return Some(Symptom {
            kind: SymptomKind::ThreadStuck {
                state: state.clone(),
            },
            what: format!("a thread has not come back from the driver: {state}"),
            inside: None,
            severity: Severity::Critical,
            source: Source::probe(format!(
                "/proc/{}/task/{}",
                o.pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "<pid>".into()),
                o.stuck_tid
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "<tid>".into())
            )),
        });
    }
    if let Some(r) = o.cuinit_result.filter(|r| *r != 0) {
        return Some(Symptom {
            kind: SymptomKind::CuinitFailed { code: r },
            what: format!(
                "cuInit returned {r} ({}){}",
                cu_result_name(r),
                secs(o.cuinit_seconds)
            ),
            inside: inside(o),
            severity: Severity::Critical,
            source: probe("cuInit"),
        });
    }
    if let Some(r) = o.context_result.filter(|r| *r != 0) {
        let call = o
            .context_call
            .as_deref()
            .unwrap_or("a CUDA call after cuInit");
        // A start-up call that fails leaves CUDA unusable; a later one (recorded by another
        // tool: a kernel launch, a library's set-up) is past start-up, still a failure.
        let start = o
            .context_call
            .as_deref()
            .is_none_or(|c| START_CALLS.contains(&c));
        return Some(Symptom {
            kind: if start {
                SymptomKind::StartCallFailed {
                    call: call.to_string(),
                    code: r,
                }
            } else {
                SymptomKind::LaterCallFailed {
                    call: call.to_string(),
                    code: r,
                }
            },
            what: format!(
                "{call} returned {r} ({}){}",
                cu_result_name(r),
                secs(o.context_seconds)
            ),
            inside: None,
            severity: if start {
                Severity::Critical
            } else {
                Severity::Warning
            },
            source: probe(call),
        });
    }
    if s.holds(Sig::DeviceCountLow) {
        let count = o.device_count_seen.unwrap_or(0);
        return Some(Symptom {
            kind: SymptomKind::DeviceCountLow { count },
            what: format!("cuDeviceGetCount: {}", s.get(Sig::DeviceCountLow).value),
            inside: None,
            severity: if count <= 0 {
                Severity::Critical
            } else {
                Severity::Warning
            },
            source: probe("cuDeviceGetCount"),
        });
    }
    if o.forked_after_parent_init {
        return Some(Symptom {
            kind: SymptomKind::ForkedAfterInit,
            what: "the process was forked without exec after its parent's cuInit: CUDA cannot be used in it".into(),
            inside: None,
            severity: Severity::Critical,
            source: probe("fork"),
        });
    }
    if let Some((path, errno)) = o.failed_opens.first() {
        return Some(Symptom {
            kind: SymptomKind::OpenFailed {
                node: path.clone(),
                errno: errno.clone(),
            },
            what: format!("open {path} -> {errno}"),
            inside: None,
            severity: Severity::Warning,
            source: probe("openat"),
        });
    }
    // A failed driver call inside a cuInit that returned 0 was tolerated by the library
    // (libcuda skips some RM controls): no failure. One outside a cuInit, or in one whose
    // end was not seen, is.
    if let Some(c) = o
        .failed_call
        .as_ref()
        .filter(|c| !c.result.is_empty() && o.cuinit_result != Some(0))
    {
        return Some(Symptom {
            kind: SymptomKind::CallFailed {
                call: c.call.clone(),
                node: c.node.clone(),
                status: c.result.clone(),
            },
            what: call_text(c),
            inside: None,
            severity: Severity::Warning,
            source: probe("ioctl"),
        });
    }
    if s.holds(Sig::CuinitSlow) || (o.cuinit_result == Some(0) && s.holds(Sig::FirstGpuOpenSlow)) {
        let secs = o.cuinit_seconds.unwrap_or(0.0);
        return Some(Symptom {
            kind: SymptomKind::SlowStart { seconds: secs },
            what: format!("cuInit returned 0 but took {secs:.1} s"),
            inside: s
                .holds(Sig::FirstGpuOpenSlow)
                .then(|| format!("first GPU open: {}", s.get(Sig::FirstGpuOpenSlow).value)),
            severity: Severity::Info,
            source: probe("cuInit"),
        });
    }
    None
}

/// What the host recorded as failing: one symptom for each kind of [`HOST_SYMPTOMS`] one of
/// whose signals holds (its first), in that order.
fn of_host(s: &Signals) -> Vec<Symptom> {
    let mut out = Vec::new();
    for (what, severity, any) in HOST_SYMPTOMS {
        let Some(sig) = any.iter().copied().find(|g| s.holds(*g)) else {
            continue;
        };
        // A driver that is not loaded is a symptom only with a sign that it should be.
        if *what == HostSymptom::DriverNotLoaded && !DRIVER_WANTED.iter().any(|g| s.holds(*g)) {
            continue;
        }
        if matches!(what, HostSymptom::NodesMissing | HostSymptom::GpuNotDriven)
            && !s.holds(Sig::DriverLoaded)
        {
            continue;
        }
        // The service VM of the Shared NVSwitch model (Fabric Manager User Guide): nvidia
        // loaded for the NVSwitches, no GPU on the bus by design (nv.c loads GPU-less with
        // an NVSwitch present).
        if matches!(
            what,
            HostSymptom::DriverSeesNoGpu | HostSymptom::SmiNoDevices
        ) && s.holds(Sig::NvswitchPresent)
            && s.holds(Sig::NoGpuOnPci)
        {
            continue;
        }
        let r = s.get(sig);
        let severity = match (what, s.holds(Sig::InContainer)) {
            // On a host, CUDA makes the UVM nodes itself (the setuid nvidia-modprobe).
            (HostSymptom::NodesMissing, false) => Severity::Warning,
            _ => *severity,
        };
        out.push(Symptom {
            kind: SymptomKind::Host { what: *what },
            what: format!("{}: {}", sig.name(), r.value),
            inside: None,
            severity,
            source: r.source.clone(),
        });
    }
    out
}

/// Signs that the nvidia module should be loaded: NVIDIA's tools are installed and cannot
/// reach a driver, or the kernel refused it or could not find it. An NVIDIA GPU on the bus
/// without a driver is no such sign alone (a host that keeps it for passthrough, or does not
/// use it).
const DRIVER_WANTED: &[Sig] = &[
    Sig::SmiNoDriver,
    Sig::ModuleRefusedSignature,
    Sig::ModuleBuiltForOtherKernel,
    Sig::ModuleNotBuilt,
    Sig::ModuleRefusedBySecurity,
    Sig::ModuleLoadFailed,
    Sig::OpenModuleUnsupportedGpu,
    Sig::DriverFoundNoGpu,
];

/// The host-recorded symptoms, most telling first: each with its severity and the signals
/// that record it.
const HOST_SYMPTOMS: &[(HostSymptom, Severity, &[Sig])] = &[
    (
        HostSymptom::DriverNotLoaded,
        Severity::Critical,
        &[Sig::DriverAbsent],
    ),
    (
        HostSymptom::DriverSeesNoGpu,
        Severity::Critical,
        &[Sig::DriverFoundNoGpu, Sig::DriverRegisteredNoGpu],
    ),
    (
        HostSymptom::GpuFailed,
        Severity::Critical,
        &[
            Sig::GpuFellOffBus,
            Sig::AdapterInitFailed,
            Sig::ProbeFailed,
            Sig::BoundGpuNotListed,
            Sig::GpuFatalXid,
            Sig::GspFailed,
            Sig::Wpr2Up,
            Sig::BarInvalid,
            Sig::NeedsOpenModule,
            Sig::NodeOpenIoError,
        ],
    ),
    (
        HostSymptom::GpuNotDriven,
        Severity::Warning,
        &[Sig::LegacyGpu, Sig::OpenModuleUnsupportedGpu],
    ),
    (
        HostSymptom::DriverHangLogged,
        Severity::Critical,
        &[Sig::DriverOopsLogged, Sig::DriverLockupLogged],
    ),
    (
        HostSymptom::VersionMismatch,
        Severity::Critical,
        &[Sig::ApiMismatchLogged, Sig::SmiVersionMismatch],
    ),
    (
        HostSymptom::SmiNoDevices,
        Severity::Critical,
        &[Sig::SmiNoDevices],
    ),
    (
        HostSymptom::HmmErrorLogged,
        Severity::Critical,
        &[Sig::HmmErrorLogged],
    ),
    (
        HostSymptom::NodeNumberMismatch,
        Severity::Critical,
        &[Sig::NodeNumberMismatch],
    ),
    (
        HostSymptom::NodeDenied,
        Severity::Critical,
        &[Sig::NodeOpenDenied, Sig::AllowListMissesUvm],
    ),
    (
        HostSymptom::NodesMissing,
        Severity::Critical,
        &[
            Sig::ContainerWithoutGpu,
            Sig::UvmNotLoaded,
            Sig::CtlNodeAbsent,
            Sig::UvmNodeAbsent,
            Sig::UvmMajorMissing,
        ],
    ),
    (
        HostSymptom::SmiUnknownError,
        Severity::Critical,
        &[Sig::SmiUnknownError],
    ),
    (
        HostSymptom::WslBroken,
        Severity::Warning,
        &[
            Sig::LinuxLibcudaMappedInWsl,
            Sig::DxgAbsent,
            Sig::WslLibcudaAbsent,
            Sig::LinuxLibcudaInstalledInWsl,
        ],
    ),
    (
        HostSymptom::SmiTimedOut,
        Severity::Warning,
        &[Sig::SmiTimedOut],
    ),
    (
        HostSymptom::DriverWarnLogged,
        Severity::Warning,
        &[Sig::DriverWarnLogged],
    ),
];

/// The symptoms of a judgement: what the probes saw fail; else what the host recorded, most
/// telling first (each is judged on its own: a host can have two problems); else none.
pub fn symptoms(o: &Observations, s: &Signals) -> Vec<Symptom> {
    match of_process(o, s) {
        Some(p) => vec![p],
        None => of_host(s),
    }
}

//! Diagnosis rules: one per class of failure in `shared/reference/failure-classes.md`.
//!
//! Each rule is a small pure function of the static [`Evidence`] and of what the probes saw
//! for one process ([`Observations`], all defaults for a plain `uvmwatch doctor`). Several
//! classes share a CUDA error code, so no rule fires on a code alone: each one also needs a
//! signal specific to its class. A rule never claims a class whose defining signal it could
//! not observe: it lowers its confidence instead and lists in [`Finding::unchecked`] what it
//! could not see (a probe that is not attached here, a file it could not read).
//!
//! Sources of the facts the rules rely on:
//! * CUDA driver API `cuda.h` (CUDA 12/13): the `CUresult` codes (`CUDA_ERROR_*`);
//! * NVIDIA open-gpu-kernel-modules 590.48.01, `kernel-open/nvidia-uvm/`: `UVM_REGISTER_GPU`
//!   is where UVM brings a GPU up, HMM device memory included, and reports a failure in its
//!   `rmStatus` (`NV_ERR_NO_MEMORY` when `request_free_mem_region` fails), the
//!   `uvm_disable_hmm` and `uvm_debug_prints` module parameters (summarised in
//!   `shared/reference/nvidia-uvm.md`);
//! * NVIDIA CUDA Toolkit release notes (12.9 and 13.x), known issue "CUDA initialization can
//!   fail on certain Linux kernels with KASLR enabled": the
//!   `request_free_mem_region() err -34` message and the `nokaslr` / `uvm_disable_hmm=1`
//!   workarounds;
//! * Linux commit ea72ce5da228 ("x86/kaslr: Expose and use the end of the physical memory
//!   address space", tip x86/urgent, August 2024, mainline from 6.11): the kernel-side fix;
//! * NVIDIA Fabric Manager user guide (NVSwitch systems), CUDA Compatibility guide (forward
//!   compatibility, data-center GPUs only), NVIDIA persistence daemon documentation, NVIDIA
//!   driver README "Configuring Power Management Support" (suspend/resume services);
//! * Linux `Documentation/admin-guide/cgroup-v1/devices.rst`: the device allow-list format
//!   (`c 195:* rwm`).

use super::facts::{
    DevNode, DriverInfo, Evidence, Fact, KernelLog, Observations, SeenCall, SmiInfo,
};
use super::finding::{Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use crate::decode::nvidia::cu_result_name;

/// One diagnosis rule.
pub struct Rule {
    /// Rule id, snake case; also the runbook name (`docs/runbooks/<id>.md`).
    pub id: &'static str,
    /// What the class is, for listings (a finding carries a more specific title).
    pub title: &'static str,
    /// The check: a finding when the class applies, `None` otherwise.
    pub check: fn(&Evidence, &Observations) -> Option<Finding>,
}

/// Every rule, one per row of `shared/reference/failure-classes.md`, in table order. On equal
/// severity and confidence, [`diagnose`] keeps this order, so the more specific rule of two
/// (HMM set-up before a generic driver hang) comes first.
pub const RULES: &[Rule] = &[
    Rule {
        id: "hmm_setup_failure",
        title: "nvidia_uvm HMM set-up fails or hangs on this kernel",
        check: hmm_setup_failure,
    },
    Rule {
        id: "driver_hang",
        title: "a thread is stuck inside the NVIDIA driver",
        check: driver_hang,
    },
    Rule {
        id: "node_or_module_missing",
        title: "nvidia_uvm not loaded or an NVIDIA device node missing",
        check: node_or_module_missing,
    },
    Rule {
        id: "device_permission",
        title: "NVIDIA device node present but access denied",
        check: device_permission,
    },
    Rule {
        id: "stale_after_suspend",
        title: "driver state broken by suspend/resume",
        check: stale_after_suspend,
    },
    Rule {
        id: "fabric_not_ready",
        title: "NVSwitch fabric not ready (Fabric Manager)",
        check: fabric_not_ready,
    },
    Rule {
        id: "version_mismatch",
        title: "user-space driver library and kernel module differ",
        check: version_mismatch,
    },
    Rule {
        id: "slow_init",
        title: "cuInit succeeds but takes seconds",
        check: slow_init,
    },
    Rule {
        id: "adapter_init_failure",
        title: "a GPU fails to initialize in the kernel",
        check: adapter_init_failure,
    },
    Rule {
        id: "fork_after_init",
        title: "CUDA used in a child forked after cuInit",
        check: fork_after_init,
    },
    Rule {
        id: "policy_or_partition",
        title: "compute mode or MIG refuses the work",
        check: policy_or_partition,
    },
];

/// Runs every rule and returns the findings, worst first: by severity, then confidence, then
/// [`RULES`] order.
pub fn diagnose(e: &Evidence, o: &Observations) -> Vec<Finding> {
    let mut findings: Vec<Finding> = RULES.iter().filter_map(|r| (r.check)(e, o)).collect();
    // `sort_by` is stable: ties keep RULES order.
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.confidence.cmp(&a.confidence))
    });
    findings
}

/// Why no NVIDIA driver is present at all, when that is so: no `/proc/driver/nvidia/version`,
/// no `nvidia` module in `/proc/modules` and no `/dev/nvidia*` node. `None` when any trace of
/// the driver exists (or when it cannot be told).
pub fn no_driver(e: &Evidence) -> Option<String> {
    let why = match &e.driver.value {
        Ok(_) => return None,
        Err(u) => u.why.clone(),
    };
    if e.modules
        .get()
        .is_some_and(|m| m.iter().any(|n| n == "nvidia"))
    {
        return None;
    }
    if e.dev_nodes.get().is_some_and(|n| !n.is_empty()) {
        return None;
    }
    Some(format!("{}: {}", e.driver.source, why))
}

// ---------------------------------------------------------------------------------------
// Constants

/// `CUresult` codes (`cuda.h`).
mod cu {
    pub const SUCCESS: i64 = 0;
    pub const NOT_INITIALIZED: i64 = 3;
    pub const DEVICE_UNAVAILABLE: i64 = 46;
    pub const NO_DEVICE: i64 = 100;
    pub const OPERATING_SYSTEM: i64 = 304;
    pub const SYSTEM_NOT_READY: i64 = 802;
    pub const SYSTEM_DRIVER_MISMATCH: i64 = 803;
    pub const COMPAT_NOT_SUPPORTED_ON_DEVICE: i64 = 804;
    pub const UNKNOWN: i64 = 999;
}

/// Source label of what the `cuInit` uprobe/uretprobe saw.
pub const SRC_CUINIT: &str = "probe:cuInit";
/// Source label of what the `ioctl` tracepoints saw (call, node, `rmStatus` or errno).
pub const SRC_IOCTL: &str = "probe:ioctl";
/// Source label of what the `openat` tracepoints saw.
pub const SRC_OPENAT: &str = "probe:openat";
/// Source label of what the `sched_process_fork` tracepoint saw.
pub const SRC_FORK: &str = "probe:fork";
/// Source label of kernel-side (kprobe) signals.
pub const SRC_KPROBE: &str = "probe:kprobe";

/// The UVM ioctl in which UVM brings a GPU up (HMM device memory included) (`uvm_ioctl.h`).
const REGISTER_GPU: &str = "UVM_REGISTER_GPU";
/// `NV_STATUS` an HMM set-up failure returns (`nvstatuscodes.h`, 0x51).
const NV_ERR_NO_MEMORY: &str = "NV_ERR_NO_MEMORY";
/// Kernel function whose -34 (ERANGE) is the HMM set-up failure (nvidia-uvm.md).
const FREE_MEM_REGION: &str = "request_free_mem_region";
/// First mainline release with commit ea72ce5da228 (the x86/kaslr fix).
const KASLR_FIX_KERNEL: (u32, u32) = (6, 11);
/// The file the HMM fix writes.
pub const HMM_CONF: &str = "/etc/modprobe.d/uvmwatch-disable-hmm.conf";
/// A failing `cuInit` that returns within this many seconds "returned quickly".
const QUICK_SECONDS: f64 = 1.0;
/// A forked child's `cuInit` fails within microseconds; allow for probe latency.
const FORK_FAIL_SECONDS: f64 = 0.05;
/// Slow-init threshold: this many seconds, plus [`SLOW_INIT_PER_GPU_SECONDS`] per GPU (a
/// heuristic: `cuInit` on a host with persistence takes well under a second; without it each
/// GPU is brought up on first open).
const SLOW_INIT_BASE_SECONDS: f64 = 2.0;
/// See [`SLOW_INIT_BASE_SECONDS`].
const SLOW_INIT_PER_GPU_SECONDS: f64 = 0.5;
/// The fixed major of `/dev/nvidiactl` and `/dev/nvidia<N>` (`nvidia-frontend` in
/// `/proc/devices`; nvidia-uvm.md, "Device nodes").
const NVIDIA_MAJOR: u32 = 195;
/// Errnos of an `open()` of a node that is missing or has no driver behind it.
const MISSING_ERRNOS: &[&str] = &["ENOENT", "ENXIO", "ENODEV"];
/// Errnos of an `open()` refused by policy: `EPERM` (device cgroup / LXC allow-list),
/// `EACCES` (mode bits, user namespace).
const DENIED_ERRNOS: &[&str] = &["EPERM", "EACCES"];
/// Xids of a GPU lost or failing to come up: 79 fallen off the bus, 119 GSP RPC timeout,
/// 120 GSP error (NVIDIA Xid catalog).
const ADAPTER_XIDS: &[u32] = &[79, 119, 120];

// ---------------------------------------------------------------------------------------
// Reading the evidence

fn driver(e: &Evidence) -> Option<&DriverInfo> {
    e.driver.get()
}

fn smi(e: &Evidence) -> Option<&SmiInfo> {
    e.smi.get()
}

fn klog(e: &Evidence) -> Option<&KernelLog> {
    e.kernel_log.get()
}

/// A module parameter of nvidia_uvm (`/sys/module/nvidia_uvm/parameters/<name>`).
fn uvm_param<'a>(e: &'a Evidence, name: &str) -> Option<&'a str> {
    e.uvm_params.get()?.get(name).map(|s| s.trim())
}

/// A boolean module parameter as sysfs prints it (`Y`/`N`, or `1`/`0`).
fn param_bool(v: &str) -> Option<bool> {
    match v {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// `uvm_disable_hmm`: `Some(true)` when HMM is switched off.
fn hmm_disabled(e: &Evidence) -> Option<bool> {
    uvm_param(e, "uvm_disable_hmm").and_then(param_bool)
}

/// A kernel config option: `None` when the config is unknown, `Some(false)` when it is not
/// set (absent from the collected options), `Some(true)` when `=y`.
fn config_y(e: &Evidence, key: &str) -> Option<bool> {
    Some(e.kernel_config.get()?.get(key).is_some_and(|v| v == "y"))
}

/// The kernel has what HMM needs (`CONFIG_HMM_MIRROR` and `CONFIG_DEVICE_PRIVATE`).
fn kernel_hmm_capable(e: &Evidence) -> Option<bool> {
    Some(config_y(e, "CONFIG_HMM_MIRROR")? && config_y(e, "CONFIG_DEVICE_PRIVATE")?)
}

/// KASLR of the memory layout: `(on, why, source)`. Off with `nokaslr` on the command line
/// or, where the config is known, without `CONFIG_RANDOMIZE_MEMORY` (or
/// `CONFIG_RANDOMIZE_BASE`); unknown without the command line.
fn kaslr(e: &Evidence) -> Option<(bool, String, &str)> {
    let cmdline = e.cmdline.get()?;
    if cmdline.split_whitespace().any(|w| w == "nokaslr") {
        return Some((
            false,
            "nokaslr on the command line".into(),
            &e.cmdline.source,
        ));
    }
    if let Some(cfg) = e.kernel_config.get() {
        let key = if cfg.contains_key("CONFIG_RANDOMIZE_MEMORY") {
            "CONFIG_RANDOMIZE_MEMORY"
        } else {
            "CONFIG_RANDOMIZE_BASE"
        };
        if cfg.get(key).is_none_or(|v| v != "y") {
            return Some((false, format!("{key} not set"), &e.kernel_config.source));
        }
    }
    Some((
        true,
        "no nokaslr on the command line".into(),
        &e.cmdline.source,
    ))
}

fn kaslr_on(e: &Evidence) -> Option<bool> {
    kaslr(e).map(|k| k.0)
}

/// The running kernel is a mainline release with the x86/kaslr fix (6.11+). Distribution
/// kernels may carry it as a backport, which cannot be seen from here.
fn kernel_has_kaslr_fix(e: &Evidence) -> Option<bool> {
    Some(e.kernel.get()?.version >= KASLR_FIX_KERNEL)
}

/// `nvidia-smi -q` addressing modes, when any were listed.
/// `nvidia-smi -q` addressing modes (`HMM`, `ATS`, `None`) of the GPUs that print one
/// (drivers before 550 print none), when any do.
fn addressing_modes(e: &Evidence) -> Option<Vec<&str>> {
    let modes: Vec<&str> = smi(e)?
        .addressing_mode
        .iter()
        .map(String::as_str)
        .filter(|m| !m.is_empty())
        .collect();
    (!modes.is_empty()).then_some(modes)
}

/// The container the doctor (or the diagnosed process) runs in, if not the host.
fn container_kind(e: &Evidence) -> Option<&str> {
    e.container
        .get()
        .map(|c| c.kind.as_str())
        .filter(|k| *k != "host")
}

/// Whether a host daemon of that name was found running; unknown from inside a container,
/// which does not see the host's processes.
fn host_daemon(e: &Evidence, name: &str) -> Option<bool> {
    if container_kind(e).is_some() {
        return None;
    }
    Some(e.daemons.get()?.iter().any(|d| d == name))
}

/// The reason a probe is unavailable, when one whose entry mentions `needle` is listed.
fn probe_unavailable<'a>(o: &'a Observations, needle: &str) -> Option<&'a str> {
    o.unavailable_probes
        .iter()
        .find(|p| p.contains(needle))
        .map(|s| s.as_str())
}

/// Whether any probe saw anything for a process (false for a plain `doctor`).
fn observed(o: &Observations) -> bool {
    o.pid.is_some()
        || o.cuinit_result.is_some()
        || o.cuinit_in_flight
        || o.stuck_in.is_some()
        || o.failed_call.is_some()
        || !o.failed_opens.is_empty()
        || o.device_opens > 0
        || o.forked_after_parent_init
        || !o.kernel_signals.is_empty()
}

/// `cuInit` returned one of `codes`.
fn cuinit_is(o: &Observations, codes: &[i64]) -> bool {
    o.cuinit_result.is_some_and(|r| codes.contains(&r))
}

/// `cuInit` returned within [`QUICK_SECONDS`].
fn quick(o: &Observations) -> bool {
    o.cuinit_seconds.is_some_and(|s| s <= QUICK_SECONDS)
}

/// `/dev/nvidia<N>` (a GPU node, not `nvidiactl`, UVM or NVSwitch).
fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Splits `590.48.01` into numbers for comparison.
fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The numbered GPUs on this host: `nvidia-smi` count, else `/dev/nvidia<N>` nodes.
fn gpu_count(e: &Evidence) -> Option<u32> {
    if let Some(s) = smi(e).filter(|s| s.gpus > 0) {
        return Some(s.gpus);
    }
    let n = e
        .dev_nodes
        .get()?
        .iter()
        .filter(|d| is_gpu_node(&d.path))
        .count();
    (n > 0).then_some(n as u32)
}

// ---------------------------------------------------------------------------------------
// Building findings

fn finding(rule: &str, severity: Severity, confidence: Confidence, title: String) -> Finding {
    Finding {
        rule: rule.to_string(),
        title,
        severity,
        confidence,
        evidence: Vec::new(),
        unchecked: Vec::new(),
        fix: Vec::new(),
        runbook: format!("docs/runbooks/{rule}.md"),
    }
}

fn item(what: &str, value: impl Into<String>, source: impl Into<String>) -> EvidenceItem {
    EvidenceItem {
        what: what.to_string(),
        value: value.into(),
        source: source.into(),
    }
}

fn step(where_: Where, note: impl Into<String>, commands: &[&str]) -> FixStep {
    FixStep {
        where_,
        commands: commands.iter().map(|c| c.to_string()).collect(),
        note: note.into(),
    }
}

/// "`what` unknown: why (source)" for a fact that could not be read.
fn unknown<T>(f: &Fact<T>, what: &str) -> Option<String> {
    f.value
        .as_ref()
        .err()
        .map(|u| format!("{what} unknown: {} ({})", u.why, f.source))
}

/// One step lower, for a signal that argues against the class.
fn lower(c: Confidence) -> Confidence {
    match c {
        Confidence::High => Confidence::Medium,
        _ => Confidence::Low,
    }
}

/// `3 (CUDA_ERROR_NOT_INITIALIZED) after 0.412 s`.
fn cuinit_text(o: &Observations) -> Option<String> {
    let r = o.cuinit_result?;
    Some(match o.cuinit_seconds {
        Some(s) => format!("{r} ({}) after {s:.3} s", cu_result_name(r)),
        None => format!("{r} ({})", cu_result_name(r)),
    })
}

/// `UVM_REGISTER_GPU on /dev/nvidia-uvm -> NV_ERR_NO_MEMORY`.
fn call_text(c: &SeenCall) -> String {
    if c.result.is_empty() {
        format!("{} on {}, in flight for {:.1} s", c.call, c.node, c.seconds)
    } else {
        format!(
            "{} on {} -> {} ({:.3} s)",
            c.call, c.node, c.result, c.seconds
        )
    }
}

/// The evidence common to findings about an observed `cuInit`.
fn push_cuinit(f: &mut Finding, o: &Observations) {
    if let Some(t) = cuinit_text(o) {
        f.evidence.push(item("cuInit returned", t, SRC_CUINIT));
    } else if o.cuinit_in_flight {
        let secs = o
            .cuinit_seconds
            .map(|s| format!("for {s:.1} s"))
            .unwrap_or_else(|| "since an unknown time".into());
        f.evidence
            .push(item("cuInit", format!("still running {secs}"), SRC_CUINIT));
    }
}

/// Lists what the cuInit probe could not see, for a rule that needs the `cuInit` result.
fn push_cuinit_unchecked(f: &mut Finding, o: &Observations) {
    if o.cuinit_result.is_none() && !o.cuinit_in_flight {
        f.unchecked.push(match probe_unavailable(o, "cuInit") {
            Some(why) => format!("cuInit result not seen: {why}"),
            None if observed(o) => "cuInit result not seen (no cuInit probe fired)".into(),
            None => "no process observed: run `uvmwatch doctor --probe` or `uvmwatch run` to see cuInit and its driver calls".into(),
        });
    }
}

/// "You are inside a container" note for host-only fix steps.
fn host_only_note(e: &Evidence) -> String {
    match container_kind(e) {
        Some(kind) => format!(
            " This runs inside a container ({kind}): do it on the host; a container cannot."
        ),
        None => String::new(),
    }
}

// ---------------------------------------------------------------------------------------
// hmm_setup_failure

/// HMM set-up failure: nvidia_uvm's HMM device-memory set-up fails (or hangs) on the running
/// kernel (open module only).
///
/// Fires critical on a failing or hanging `UVM_REGISTER_GPU` (`probe:ioctl`), on
/// `request_free_mem_region() err` lines in the kernel log (`uvm_debug_prints=1`), or on a
/// `request_free_mem_region` = -34 kernel signal. Without any of them (plain `doctor`) it
/// fires a warning only for the risk profile: open module, `uvm_disable_hmm=N`, an HMM kernel,
/// KASLR on and a kernel without the upstream fix. Never fires with `uvm_disable_hmm=Y`,
/// the proprietary module, a kernel without HMM, or ATS addressing.
fn hmm_setup_failure(e: &Evidence, o: &Observations) -> Option<Finding> {
    // The set-up seen failing in the kernel itself (the driver's own error line, or the
    // allocator's error caught by a kprobe inside a UVM ioctl) is direct evidence: it
    // outweighs facts that say HMM set-up should not even run here.
    let attempted = klog(e).is_some_and(|l| !l.hmm_errors.is_empty())
        || o.kernel_signals.iter().any(|s| s.contains(FREE_MEM_REGION));
    // What makes HMM set-up impossible here: then it cannot be the cause.
    if !attempted
        && (driver(e).is_some_and(|d| !d.open_module)
            || hmm_disabled(e) == Some(true)
            || kernel_hmm_capable(e) == Some(false)
            || addressing_modes(e).is_some_and(|m| m.iter().all(|x| *x == "ATS")))
    {
        return None;
    }

    let reg_failed = o
        .failed_call
        .as_ref()
        .filter(|c| c.call == REGISTER_GPU && !c.result.is_empty() && c.result != "OK");
    let reg_hung = o
        .stuck_in
        .as_ref()
        .filter(|c| c.call == REGISTER_GPU && c.result.is_empty());
    let log_errors = klog(e).map(|l| l.hmm_errors.as_slice()).unwrap_or(&[]);
    let ksignal = o
        .kernel_signals
        .iter()
        .find(|s| s.contains(FREE_MEM_REGION));
    // cuInit 3/802 after successful opens where the ioctl probes could not see the calls.
    let ioctl_blind = probe_unavailable(o, "ioctl");
    // HMM device memory already set up (nvidia-uvm-hmm in /proc/iomem) means the set-up
    // did not fail: a blind 3/802 is then not evidence of it.
    let hmm_set_up = e.iomem_hmm.get().is_some_and(|l| !l.is_empty());
    let blind_failure = reg_failed.is_none()
        && !hmm_set_up
        && ioctl_blind.is_some()
        && cuinit_is(o, &[cu::NOT_INITIALIZED, cu::SYSTEM_NOT_READY])
        && o.device_opens > 0
        && o.failed_opens.is_empty()
        && !o.forked_after_parent_init;

    let critical = reg_failed.is_some()
        || reg_hung.is_some()
        || !log_errors.is_empty()
        || ksignal.is_some()
        || blind_failure;
    if !critical {
        return hmm_risk_warning(e, o);
    }

    let defining = !log_errors.is_empty() || ksignal.is_some();
    let base = if defining
        || reg_hung.is_some()
        || reg_failed.is_some_and(|c| c.result == NV_ERR_NO_MEMORY)
    {
        Confidence::High
    } else if reg_failed.is_some() {
        // A status other than the NV_ERR_NO_MEMORY this failure gives.
        Confidence::Medium
    } else {
        Confidence::Low
    };
    // The known cause needs the open module, HMM allowed, KASLR on and HMM addressing: one
    // step lower when any of that is unknown or contradicted (the kernel's own error line
    // needs no such support).
    let profile = driver(e).is_some_and(|d| d.open_module)
        && hmm_disabled(e) == Some(false)
        && kaslr_on(e) == Some(true)
        && !addressing_modes(e).is_some_and(|m| m.iter().all(|x| *x == "None"));
    let confidence = if defining || profile {
        base
    } else {
        lower(base)
    };

    let title = if let Some(c) = reg_hung {
        format!(
            "nvidia_uvm HMM set-up hangs: {} has not returned for {:.0} s",
            c.call, c.seconds
        )
    } else if let Some(c) = reg_failed {
        let code = o
            .cuinit_result
            .map(|r| format!("; cuInit returned {r}"))
            .unwrap_or_default();
        format!(
            "nvidia_uvm HMM set-up failed: {} returned {}{code}",
            c.call, c.result
        )
    } else if defining {
        "nvidia_uvm HMM set-up failed: request_free_mem_region() error".to_string()
    } else {
        format!(
            "cuInit failed ({}) where nvidia_uvm HMM set-up is known to fail",
            o.cuinit_result.map(cu_result_name).unwrap_or_default()
        )
    };
    let mut f = finding("hmm_setup_failure", Severity::Critical, confidence, title);

    if let Some(c) = reg_hung.or(reg_failed) {
        f.evidence
            .push(item("GPU registration in UVM", call_text(c), SRC_IOCTL));
    }
    push_cuinit(&mut f, o);
    if o.device_opens > 0 {
        f.evidence.push(item(
            "device opens",
            format!("{} succeeded (the nodes are fine)", o.device_opens),
            SRC_OPENAT,
        ));
    }
    if let Some(s) = ksignal {
        f.evidence
            .push(item("kernel signal", s.clone(), SRC_KPROBE));
    }
    for line in log_errors.iter().take(3) {
        f.evidence.push(item(
            "kernel log",
            line.clone(),
            e.kernel_log.source.clone(),
        ));
    }
    push_hmm_profile(&mut f, e);
    push_hmm_unchecked(&mut f, e, o, ksignal.is_some());
    if let Some(why) = ioctl_blind.filter(|_| reg_failed.is_none() && reg_hung.is_none()) {
        f.unchecked.push(format!(
            "UVM_REGISTER_GPU result not seen ({why}): cannot confirm the failing call"
        ));
    }
    push_cuinit_unchecked(&mut f, o);
    f.fix = hmm_fix(e);
    Some(f)
}

/// Static-only warning: the host matches the profile of the known KASLR/HMM issue.
fn hmm_risk_warning(e: &Evidence, o: &Observations) -> Option<Finding> {
    // It works here now, or UVM already set up HMM memory for a GPU.
    if o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    if e.iomem_hmm.get().is_some_and(|l| !l.is_empty()) {
        return None;
    }
    if !(driver(e)?.open_module && !hmm_disabled(e)? && kaslr_on(e)?) {
        return None;
    }
    let fix_in_kernel = kernel_has_kaslr_fix(e);
    if fix_in_kernel == Some(true) {
        return None;
    }
    let hmm_on = kernel_hmm_capable(e) == Some(true)
        || addressing_modes(e).is_some_and(|m| m.contains(&"HMM"));
    let confidence = if hmm_on && fix_in_kernel == Some(false) {
        Confidence::Medium
    } else {
        Confidence::Low
    };
    let kernel = match fix_in_kernel {
        Some(_) => "no upstream kernel fix",
        None => "kernel version unknown",
    };
    let mut f = finding(
        "hmm_setup_failure",
        Severity::Warning,
        confidence,
        format!("HMM set-up can fail on this kernel: open module, HMM on, KASLR on, {kernel}"),
    );
    push_hmm_profile(&mut f, e);
    push_hmm_unchecked(&mut f, e, o, false);
    push_cuinit_unchecked(&mut f, o);
    f.fix = hmm_fix(e);
    Some(f)
}

/// The HMM risk profile, as far as it is known.
fn push_hmm_profile(f: &mut Finding, e: &Evidence) {
    if let Some(d) = driver(e) {
        let flavor = if d.open_module {
            "open kernel module"
        } else {
            "proprietary kernel module"
        };
        f.evidence.push(item(
            "driver",
            format!("{} {flavor}", d.version),
            e.driver.source.clone(),
        ));
    }
    if let Some(v) = uvm_param(e, "uvm_disable_hmm") {
        f.evidence.push(item(
            "uvm_disable_hmm",
            format!("{v} (HMM allowed)"),
            e.uvm_params.source.clone(),
        ));
    }
    if let Some(cfg) = e.kernel_config.get() {
        let v: Vec<String> = ["CONFIG_HMM_MIRROR", "CONFIG_DEVICE_PRIVATE"]
            .iter()
            .map(|k| {
                format!(
                    "{k}={}",
                    cfg.get(*k).map(String::as_str).unwrap_or("not set")
                )
            })
            .collect();
        f.evidence.push(item(
            "kernel HMM support",
            v.join(" "),
            e.kernel_config.source.clone(),
        ));
    }
    if let Some(m) = addressing_modes(e) {
        f.evidence
            .push(item("addressing mode", m.join(", "), e.smi.source.clone()));
    }
    if let Some((on, why, source)) = kaslr(e) {
        let value = if on {
            format!("on ({why})")
        } else {
            format!("off ({why}): the known KASLR cause does not apply")
        };
        f.evidence.push(item("KASLR", value, source));
    }
    if let Some(k) = e.kernel.get() {
        let fix = if k.version >= KASLR_FIX_KERNEL {
            "has the x86/kaslr fix (mainline 6.11+)"
        } else {
            "older than 6.11: no upstream x86/kaslr fix unless backported"
        };
        f.evidence.push(item(
            "kernel",
            format!("{} ({fix})", k.release),
            e.kernel.source.clone(),
        ));
    }
    if let Some(s) = smi(e).filter(|s| s.gpus > 0) {
        f.evidence.push(item(
            "nvidia-smi",
            format!(
                "lists {} GPU(s): RM is healthy, the failure is in UVM",
                s.gpus
            ),
            e.smi.source.clone(),
        ));
    }
    if klog(e).is_some_and(|l| l.hmm_errors.is_empty()) {
        let debug = uvm_param(e, "uvm_debug_prints").and_then(param_bool);
        let v = if debug == Some(true) {
            "no request_free_mem_region() error although uvm_debug_prints=1"
        } else {
            "silent, as expected: UVM prints the error only with uvm_debug_prints=1"
        };
        f.evidence
            .push(item("kernel log", v, e.kernel_log.source.clone()));
    }
}

/// What the HMM rule could not see.
fn push_hmm_unchecked(f: &mut Finding, e: &Evidence, o: &Observations, saw_ksignal: bool) {
    if !saw_ksignal {
        let why = match probe_unavailable(o, FREE_MEM_REGION).or(probe_unavailable(o, "kprobe")) {
            Some(why) => why.to_string(),
            None if config_y(e, "CONFIG_KPROBES") == Some(false) => {
                "kprobes unavailable on this kernel (CONFIG_KPROBES not set)".into()
            }
            None => "no kprobe on request_free_mem_region attached".into(),
        };
        f.unchecked.push(format!(
            "{why}: cannot see request_free_mem_region() return -34 (ERANGE)"
        ));
    }
    f.unchecked.extend(
        [
            unknown(&e.driver, "driver flavor (open or proprietary)"),
            unknown(&e.uvm_params, "uvm_disable_hmm"),
            unknown(
                &e.kernel_config,
                "kernel HMM support (CONFIG_HMM_MIRROR, CONFIG_DEVICE_PRIVATE)",
            ),
            unknown(&e.cmdline, "KASLR (nokaslr)"),
            unknown(&e.kernel, "kernel version (x86/kaslr fix)"),
            unknown(&e.kernel_log, "kernel log"),
            unknown(&e.iomem_hmm, "nvidia-uvm-hmm regions in /proc/iomem"),
        ]
        .into_iter()
        .flatten(),
    );
    if e.kernel.get().is_some_and(|k| k.version < KASLR_FIX_KERNEL) {
        f.unchecked.push(
            "whether this distribution kernel carries a backport of commit ea72ce5da228".into(),
        );
    }
}

/// The HMM fix: disable HMM in nvidia_uvm on the host, reload, verify; or `nokaslr`; or a
/// kernel with the fix.
fn hmm_fix(e: &Evidence) -> Vec<FixStep> {
    let echo = format!("echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee {HMM_CONF}");
    vec![
        step(
            Where::Host,
            format!(
                "Disable HMM in nvidia_uvm. Module parameters are host state.{}",
                host_only_note(e)
            ),
            &[&echo],
        ),
        step(
            Where::Host,
            "Stop everything that uses the GPU (workloads, containers, nvidia-persistenced, \
             DCGM), then reload nvidia_uvm so the option takes effect, or reboot. If nvidia_uvm \
             is loaded from the initramfs, rebuild it first (update-initramfs -u or dracut -f).",
            &[
                "sudo fuser -v /dev/nvidia-uvm",
                "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            ],
        ),
        step(
            Where::Any,
            "Verify: must print Y. Then run cuInit again (or `uvmwatch doctor`).",
            &["cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"],
        ),
        step(
            Where::Host,
            "Alternative: boot with nokaslr (Debian/Ubuntu GRUB shown; RHEL/Fedora: \
             sudo grubby --update-kernel=ALL --args=nokaslr), then reboot. This turns off a \
             kernel hardening feature.",
            &[
                "sudo sed -i 's/^GRUB_CMDLINE_LINUX_DEFAULT=\"/&nokaslr /' /etc/default/grub && sudo update-grub",
            ],
        ),
        step(
            Where::Host,
            "Alternative: boot a kernel with upstream commit ea72ce5da228 (\"x86/kaslr: Expose \
             and use the end of the physical memory address space\", mainline 6.11 and later, \
             backported by some distributions).",
            &[],
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// driver_hang

/// What a kernel log report with nvidia frames is (`KernelLog::driver_hangs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HangKind {
    /// Soft or hard lockup, RCU stall, hung task: a thread stuck, maybe for good.
    Stall,
    /// Oops, BUG, general protection fault: the driver is wedged until reboot.
    Oops,
    /// A WARN: worth reading, not a hang by itself.
    Warn,
}

/// Classifies a report's first line. A lockup line also says `BUG:` (`watchdog: BUG: soft
/// lockup`), so stalls are recognized first.
fn hang_kind(line: &str) -> HangKind {
    let l = line.to_ascii_lowercase();
    if ["lockup", "rcu", "blocked for more than", "hung task"]
        .iter()
        .any(|k| l.contains(k))
    {
        HangKind::Stall
    } else if ["oops", "bug:", "kernel bug", "general protection"]
        .iter()
        .any(|k| l.contains(k))
    {
        HangKind::Oops
    } else {
        HangKind::Warn
    }
}

/// Driver hang / wedged: a thread is stuck inside the driver (`probe:ioctl` in-flight call,
/// thread state and `wchan`/stack from `/proc`), or the kernel log shows a soft lockup, RCU
/// stall, hung task, oops or WARN with nvidia frames.
fn driver_hang(e: &Evidence, o: &Observations) -> Option<Finding> {
    let stuck = o.stuck_in.as_ref().filter(|c| c.result.is_empty());
    let hangs = klog(e).map(|l| l.driver_hangs.as_slice()).unwrap_or(&[]);
    let ioctl_blind = probe_unavailable(o, "ioctl");
    let blind_hang = stuck.is_none() && o.cuinit_in_flight && ioctl_blind.is_some();
    if stuck.is_none() && hangs.is_empty() && !blind_hang {
        return None;
    }

    let nv_symbol = |s: &str| {
        s.contains("uvm_") || s.contains("nv_") || s.contains("_nv0") || s.contains("nvidia")
    };
    let d_state = o.stuck_state.as_deref().is_some_and(|s| s.starts_with('D'));
    let in_driver = o.stuck_wchan.as_deref().is_some_and(nv_symbol)
        || o.stuck_stack.iter().any(|s| nv_symbol(s));
    let kinds: Vec<HangKind> = hangs.iter().map(|l| hang_kind(l)).collect();
    let wedged = kinds.contains(&HangKind::Oops);
    let stalls = kinds.contains(&HangKind::Stall);

    let (severity, confidence, title) = if let Some(c) = stuck {
        let conf = if d_state || in_driver || wedged {
            Confidence::High
        } else {
            Confidence::Medium
        };
        let who = if o.cuinit_in_flight {
            "cuInit"
        } else {
            "a driver call"
        };
        (
            Severity::Critical,
            conf,
            format!(
                "{who} is stuck inside the driver: {} on {} for {:.0} s",
                c.call, c.node, c.seconds
            ),
        )
    } else if wedged {
        (
            Severity::Critical,
            Confidence::High,
            "the NVIDIA driver oopsed: it stays wedged until reboot".to_string(),
        )
    } else if stalls {
        (
            Severity::Critical,
            Confidence::Medium,
            "the kernel reports a lockup or hung task in NVIDIA code".to_string(),
        )
    } else if blind_hang {
        (
            Severity::Warning,
            Confidence::Low,
            "cuInit has not returned; the driver call it is in could not be seen".to_string(),
        )
    } else {
        (
            Severity::Warning,
            Confidence::Low,
            "the kernel logged a warning in NVIDIA code".to_string(),
        )
    };
    let mut f = finding("driver_hang", severity, confidence, title);
    let pid = o
        .pid
        .map(|p| p.to_string())
        .unwrap_or_else(|| "<pid>".into());
    push_cuinit(&mut f, o);
    if let Some(c) = stuck {
        f.evidence
            .push(item("call in flight", call_text(c), SRC_IOCTL));
    }
    if let Some(s) = &o.stuck_state {
        f.evidence
            .push(item("thread state", s.clone(), format!("/proc/{pid}/stat")));
    }
    if let Some(w) = &o.stuck_wchan {
        f.evidence
            .push(item("wchan", w.clone(), format!("/proc/{pid}/wchan")));
    }
    for frame in o.stuck_stack.iter().filter(|s| nv_symbol(s)).take(4) {
        f.evidence.push(item(
            "kernel stack",
            frame.clone(),
            format!("/proc/{pid}/stack"),
        ));
    }
    for l in hangs.iter().take(3) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if stuck.is_some() && o.stuck_wchan.is_none() && o.stuck_stack.is_empty() {
        f.unchecked.push(format!(
            "wchan and kernel stack of the stuck thread not readable (/proc/{pid}/stack needs root)"
        ));
    }
    if let Some(why) = ioctl_blind.filter(|_| stuck.is_none()) {
        f.unchecked
            .push(format!("driver call in flight not seen: {why}"));
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (lockups, hung tasks, oops)") {
        f.unchecked.push(s);
    }

    let stack_cmd = format!("sudo cat /proc/{pid}/stack");
    if stuck.is_some_and(|c| c.call == REGISTER_GPU) {
        f.fix.push(step(
            Where::Any,
            "UVM_REGISTER_GPU is where nvidia_uvm HMM set-up hangs: on an open module with HMM \
             on, follow hmm_setup_failure (docs/runbooks/hmm_setup_failure.md) first.",
            &["cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"],
        ));
    }
    f.fix.extend([
        step(
            Where::Any,
            "Collect evidence first: a reboot loses it.",
            &[
                &stack_cmd,
                "sudo dmesg -T | grep -iE 'nvrm|nvidia|uvm|hung_task|soft lockup|rcu'",
                "sudo nvidia-bug-report.sh",
            ],
        ),
        step(
            Where::Host,
            format!(
                "A thread in D state inside the driver cannot be killed. With every GPU process \
                 stopped, `nvidia-smi --gpu-reset -i <gpu>` may recover it; after an oops the \
                 driver stays wedged until reboot.{}",
                host_only_note(e)
            ),
            &["sudo reboot"],
        ),
        step(
            Where::Host,
            "If it recurs, upgrade the driver and report it with the bug report above.",
            &[],
        ),
    ]);
    Some(f)
}

// ---------------------------------------------------------------------------------------
// node_or_module_missing

/// Node or module missing: `nvidia_uvm` not loaded, or its node not created or not passed
/// into the container. Observed: an `openat` of a `/dev/nvidia*` node returning `ENOENT`
/// (or `ENXIO`/`ENODEV`: a node with no driver behind it). Static: `/proc/modules`,
/// `/proc/devices` and `/dev` disagree.
fn node_or_module_missing(e: &Evidence, o: &Observations) -> Option<Finding> {
    let missing: Vec<&(String, String)> = o
        .failed_opens
        .iter()
        .filter(|(_, err)| MISSING_ERRNOS.contains(&err.as_str()))
        .collect();
    let modules = e.modules.get();
    let nvidia_loaded = modules.map(|m| m.iter().any(|n| n == "nvidia"));
    let uvm_loaded = modules.map(|m| m.iter().any(|n| n == "nvidia_uvm"));
    let uvm_major = e.devices.get().and_then(|d| d.get("nvidia-uvm")).copied();
    let has_node = |p: &str| e.dev_nodes.get().map(|n| n.iter().any(|d| d.path == p));
    let container = container_kind(e);
    let driver_present = no_driver(e).is_none();

    // Static: what is missing, if anything. /proc/modules is global, so a container sees
    // the host's modules; its /dev is its own.
    let mut gaps: Vec<EvidenceItem> = Vec::new();
    if driver_present && nvidia_loaded != Some(false) {
        match uvm_loaded {
            Some(false) => gaps.push(item("nvidia_uvm", "not loaded", e.modules.source.clone())),
            None if e.devices.get().is_some() && uvm_major.is_none() => gaps.push(item(
                "nvidia-uvm",
                "no character major registered",
                e.devices.source.clone(),
            )),
            _ => {}
        }
        for node in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
            if has_node(node) == Some(false) {
                gaps.push(item(node, "absent", e.dev_nodes.source.clone()));
            }
        }
    }
    let works = o.cuinit_result == Some(cu::SUCCESS);
    if missing.is_empty() && (gaps.is_empty() || works) {
        return None;
    }
    let gap_list = gaps
        .iter()
        .map(|g| format!("{} {}", g.what, g.value))
        .collect::<Vec<_>>()
        .join(", ");

    let (severity, confidence, title) = if let Some((path, err)) = missing.first() {
        let title = if driver_present {
            format!("{path} is missing: open() returned {err}")
        } else {
            format!("no NVIDIA driver loaded: open({path}) returned {err}")
        };
        (Severity::Critical, Confidence::High, title)
    } else if container.is_some() {
        (
            Severity::Critical,
            Confidence::Medium,
            format!("{gap_list}: CUDA cannot start in this container"),
        )
    } else {
        // On a host, CUDA loads nvidia_uvm and creates the nodes through the setuid
        // nvidia-modprobe on first use.
        (
            Severity::Warning,
            Confidence::Low,
            format!("{gap_list}: CUDA relies on nvidia-modprobe to fix this on first use"),
        )
    };
    let mut f = finding("node_or_module_missing", severity, confidence, title);
    for (path, err) in &missing {
        f.evidence
            .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
    }
    push_cuinit(&mut f, o);
    if cuinit_is(o, &[cu::UNKNOWN, cu::NO_DEVICE]) && quick(o) {
        f.evidence.push(item(
            "cuInit",
            "failed quickly, as with a missing node",
            SRC_CUINIT,
        ));
    }
    f.evidence.extend(gaps);
    if let Some(why) = no_driver(e) {
        f.evidence.push(item("driver", "not present", why));
    }
    if let Some(kind) = container {
        f.evidence
            .push(item("runs in", kind, e.container.source.clone()));
    }
    f.unchecked.extend(
        [
            unknown(&e.modules, "loaded modules"),
            unknown(&e.dev_nodes, "device nodes"),
        ]
        .into_iter()
        .flatten(),
    );
    if missing.is_empty() {
        if let Some(why) = probe_unavailable(o, "openat") {
            f.unchecked.push(format!("device opens not seen: {why}"));
        }
        push_cuinit_unchecked(&mut f, o);
    }

    if !driver_present {
        f.fix.push(step(
            Where::Host,
            format!(
                "Load (or install) the NVIDIA driver; the version file must exist afterwards.{}",
                host_only_note(e)
            ),
            &["sudo modprobe nvidia", "cat /proc/driver/nvidia/version"],
        ));
    }
    f.fix.push(step(
        Where::Host,
        format!(
            "Load nvidia_uvm and create /dev/nvidia-uvm and /dev/nvidia-uvm-tools with the \
             current major (nvidia-modprobe is what CUDA runs on first use).{}",
            host_only_note(e)
        ),
        &["sudo modprobe nvidia_uvm", "sudo nvidia-modprobe -u -c 0"],
    ));
    if container.is_some() {
        f.fix.push(step(
            Where::Host,
            "Pass every node into the container: with the NVIDIA Container Toolkit use \
             `--gpus` / the nvidia runtime or CDI; by hand, as below. Recreate the container \
             after the host nodes exist.",
            &["docker run --device /dev/nvidiactl --device /dev/nvidia0 --device /dev/nvidia-uvm --device /dev/nvidia-uvm-tools <image>"],
        ));
    }
    f.fix.push(step(
        Where::Any,
        "Verify: the nodes exist and nvidia-uvm has a major.",
        &["ls -l /dev/nvidia*", "grep nvidia /proc/devices"],
    ));
    Some(f)
}

// ---------------------------------------------------------------------------------------
// device_permission

/// A device allow-list line (`devices.list`: `c 195:* rwm`, `a *:* rwm`) that lets a
/// character device `major:minor` be read and written.
fn allow_line_permits(line: &str, major: u32, minor: u32) -> bool {
    let mut parts = line.split_whitespace();
    let (Some(kind), Some(dev), Some(access)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if kind == "a" {
        return true;
    }
    if kind != "c" || !(access.contains('r') && access.contains('w')) {
        return false;
    }
    let Some((ma, mi)) = dev.split_once(':') else {
        return false;
    };
    let num_ok = |s: &str, n: u32| s == "*" || s.parse::<u32>() == Ok(n);
    num_ok(ma, major) && num_ok(mi, minor)
}

/// Device permission: the node exists but `open()` is refused, with `EPERM` (device cgroup /
/// LXC allow-list, e.g. a stale dynamic major) or `EACCES` (mode bits, user namespace).
/// Observed through `probe:openat`; static through the cgroup v1 allow-list against the
/// `nvidia-uvm` major of `/proc/devices`, and the collector's own open of each node.
fn device_permission(e: &Evidence, o: &Observations) -> Option<Finding> {
    let denied: Vec<&(String, String)> = o
        .failed_opens
        .iter()
        .filter(|(_, err)| DENIED_ERRNOS.contains(&err.as_str()))
        .collect();
    let collector_denied: Vec<(&DevNode, &str)> = e
        .dev_nodes
        .get()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| match &n.open {
                    Some(Err(err)) if DENIED_ERRNOS.contains(&err.as_str()) => {
                        Some((n, err.as_str()))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let uvm_major = e.devices.get().and_then(|d| d.get("nvidia-uvm")).copied();
    let allow = e.container.get().and_then(|c| c.device_allow.as_ref());
    // The allow-list lets in the RM control node (so the container is meant to use GPUs)
    // but not the current UVM major: written for an earlier boot or module load.
    let rm_major = e
        .devices
        .get()
        .and_then(|d| d.get("nvidia-frontend"))
        .copied()
        .unwrap_or(NVIDIA_MAJOR);
    let stale = match (allow, uvm_major) {
        (Some(lines), Some(major))
            if lines.iter().any(|l| allow_line_permits(l, rm_major, 255))
                && !lines.iter().any(|l| allow_line_permits(l, major, 0)) =>
        {
            Some(major)
        }
        _ => None,
    };
    if denied.is_empty() && collector_denied.is_empty() && stale.is_none() {
        return None;
    }
    let works = o.cuinit_result == Some(cu::SUCCESS);
    if denied.is_empty() && works {
        return None;
    }

    let eperm = denied.iter().any(|(_, e)| e == "EPERM")
        || collector_denied.iter().any(|(_, e)| *e == "EPERM")
        || stale.is_some();
    let (confidence, title) = if let Some((path, err)) = denied.first() {
        (
            Confidence::High,
            format!("access to {path} denied: open() returned {err}"),
        )
    } else if let Some((n, err)) = collector_denied.first() {
        (
            Confidence::Medium,
            format!("access to {} denied here: open() returned {err}", n.path),
        )
    } else {
        (
            Confidence::Medium,
            format!(
                "the device allow-list does not include the current nvidia-uvm major ({})",
                stale.unwrap_or_default()
            ),
        )
    };
    let mut f = finding("device_permission", Severity::Critical, confidence, title);
    for (path, err) in &denied {
        f.evidence
            .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
    }
    push_cuinit(&mut f, o);
    for (n, err) in &collector_denied {
        let dev = n
            .dev
            .map(|(ma, mi)| format!(" (char {ma}:{mi})"))
            .unwrap_or_default();
        f.evidence.push(item(
            "open by uvmwatch",
            format!("{}{dev}: {err}", n.path),
            n.path.clone(),
        ));
    }
    if let Some(major) = uvm_major {
        f.evidence.push(item(
            "nvidia-uvm major",
            major.to_string(),
            e.devices.source.clone(),
        ));
        // A node made for another major (before a reboot or reload) is stale too.
        if let Some((node_major, _)) = e
            .dev_nodes
            .get()
            .and_then(|n| n.iter().find(|d| d.path == "/dev/nvidia-uvm"))
            .and_then(|d| d.dev)
            .filter(|(ma, _)| *ma != major)
        {
            f.evidence.push(item(
                "/dev/nvidia-uvm",
                format!("made for major {node_major}, not {major}: stale node"),
                e.dev_nodes.source.clone(),
            ));
        }
    }
    if let Some(lines) = allow {
        let value = if let Some(major) = stale {
            format!("{} (nothing for c {major}:*)", lines.join("; "))
        } else {
            lines.join("; ")
        };
        f.evidence
            .push(item("device allow-list", value, e.container.source.clone()));
    } else if e.container.get().is_some_and(|c| c.kind != "host") {
        f.unchecked.push(
            "device allow-list not readable (cgroup v2: the policy is an eBPF program): cannot check for a stale major"
                .into(),
        );
    }
    if let Some(s) = unknown(&e.container, "container / device cgroup") {
        f.unchecked.push(s);
    }
    if let Some(s) = unknown(&e.devices, "nvidia-uvm major") {
        f.unchecked.push(s);
    }

    let major = uvm_major
        .map(|m| m.to_string())
        .unwrap_or_else(|| "<major>".into());
    if eperm {
        f.fix.push(step(
            Where::Host,
            format!(
                "Allow the current nvidia-uvm major ({major}) in the container's device policy; \
                 the major is dynamic and can change at each reboot or module reload. LXC: \
                 `lxc.cgroup2.devices.allow: c {major}:* rwm` (cgroup v1: \
                 `lxc.cgroup.devices.allow`) in the container config, then restart it. \
                 Docker/Kubernetes: recreate the container or pod so the runtime re-reads the \
                 nodes."
            ),
            &[
                "grep nvidia-uvm /proc/devices",
                "ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools",
            ],
        ));
    }
    if !eperm || denied.iter().any(|(_, e)| e == "EACCES") {
        f.fix.push(step(
            Where::Host,
            "EACCES: fix the node's mode or owner (NVIDIA nodes are normally crw-rw-rw-), or \
             the user-namespace mapping of the container; nvidia-modprobe recreates the UVM \
             nodes.",
            &["ls -l /dev/nvidia*", "sudo nvidia-modprobe -u -c 0"],
        ));
    }
    Some(f)
}

// ---------------------------------------------------------------------------------------
// stale_after_suspend

/// Stale after suspend: the kernel log shows a resume after nvidia_uvm was loaded, opens
/// succeed, and `cuInit` returns 999 quickly.
fn stale_after_suspend(e: &Evidence, o: &Observations) -> Option<Finding> {
    let resumed = klog(e).map(|l| l.resumed_after_uvm_load);
    let unknown999 = o.cuinit_result == Some(cu::UNKNOWN) && o.failed_opens.is_empty();
    let (severity, confidence, title) = match (resumed, unknown999) {
        (Some(true), true) => (
            Severity::Critical,
            if quick(o) {
                Confidence::High
            } else {
                Confidence::Medium
            },
            "cuInit returns 999 after a suspend/resume: nvidia_uvm state is stale".to_string(),
        ),
        (Some(true), false) if !observed(o) => (
            Severity::Warning,
            Confidence::Low,
            "the host resumed from suspend after nvidia_uvm was loaded: CUDA may fail with 999"
                .to_string(),
        ),
        (None, true) if o.device_opens > 0 => (
            Severity::Critical,
            Confidence::Low,
            "cuInit returns 999 with every open succeeding: typical of a stale driver after suspend"
                .to_string(),
        ),
        _ => return None,
    };
    let mut f = finding("stale_after_suspend", severity, confidence, title);
    push_cuinit(&mut f, o);
    if o.device_opens > 0 {
        f.evidence.push(item(
            "device opens",
            format!("{} succeeded", o.device_opens),
            SRC_OPENAT,
        ));
    }
    if resumed == Some(true) {
        f.evidence.push(item(
            "kernel log",
            "resume from suspend after nvidia_uvm was loaded",
            e.kernel_log.source.clone(),
        ));
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (needs root or CAP_SYSLOG)") {
        f.unchecked
            .push(format!("{s}: cannot see a resume from suspend"));
    }
    push_cuinit_unchecked(&mut f, o);
    f.fix = vec![
        step(
            Where::Host,
            format!(
                "Stop GPU users (containers too), then reload nvidia_uvm; a reboot also works.{}",
                host_only_note(e)
            ),
            &[
                "sudo fuser -v /dev/nvidia-uvm",
                "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            ],
        ),
        step(
            Where::Host,
            "Prevent it: enable NVIDIA's suspend/resume services (with `options nvidia \
             NVreg_PreserveVideoMemoryAllocations=1`), or keep GPU hosts from suspending.",
            &["sudo systemctl enable nvidia-suspend.service nvidia-resume.service nvidia-hibernate.service"],
        ),
    ];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// fabric_not_ready

/// Fabric not ready: an NVSwitch system without a running Fabric Manager. Needs NVSwitch
/// evidence (`/dev/nvidia-nvswitch*`, or a fabric state other than `N/A` in `nvidia-smi -q`):
/// without NVSwitch, 802 points elsewhere. Signals: `cuInit` 802 (later processes 304), fabric
/// state not `Completed`, no `nv-fabricmanager` process.
fn fabric_not_ready(e: &Evidence, o: &Observations) -> Option<Finding> {
    let switch_nodes = e.nvswitch_nodes.get();
    let states: Vec<&String> = smi(e)
        // "" for a GPU without a Fabric section (older drivers), N/A without NVSwitch;
        // NVML's NOT_SUPPORTED fabric state reads "Not Supported": no NVSwitch either.
        .map(|s| {
            s.fabric_state
                .iter()
                .filter(|x| {
                    !x.is_empty()
                        && !x.eq_ignore_ascii_case("N/A")
                        && !x.eq_ignore_ascii_case("Not Supported")
                })
                .collect()
        })
        .unwrap_or_default();
    // Fourth-generation NVSwitch systems have no /dev/nvidia-nvswitch* nodes: only a
    // fabric state from nvidia-smi rules NVSwitch out.
    let nvswitch = if switch_nodes.is_some_and(|n| !n.is_empty()) || !states.is_empty() {
        Some(true)
    } else if smi(e).is_some() {
        Some(false)
    } else {
        None
    };
    if nvswitch == Some(false) || o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    let code = cuinit_is(o, &[cu::SYSTEM_NOT_READY, cu::OPERATING_SYSTEM]);
    let incomplete = states.iter().any(|s| *s != "Completed");
    let fm = host_daemon(e, "nv-fabricmanager");
    // Every GPU registered with the fabric: ready, whether or not the manager is seen.
    let complete = !states.is_empty() && !incomplete;
    let problem = incomplete || (fm == Some(false) && !complete);

    let confidence = match nvswitch {
        None if code => Confidence::Low,
        None => return None,
        Some(_) if code && problem => Confidence::High,
        Some(_) if incomplete && fm == Some(false) => Confidence::High,
        Some(_) if problem => Confidence::Medium,
        // NVSwitch and the code, but nothing known about the fabric.
        Some(_) if code && fm.is_none() && states.is_empty() => Confidence::Low,
        Some(_) => return None,
    };
    let title = if code {
        format!(
            "cuInit returned {} on an NVSwitch system whose fabric is not ready",
            o.cuinit_result.unwrap_or_default()
        )
    } else {
        "NVSwitch fabric not ready: CUDA will fail with 802".to_string()
    };
    let mut f = finding("fabric_not_ready", Severity::Critical, confidence, title);
    push_cuinit(&mut f, o);
    if let Some(n) = switch_nodes.filter(|n| !n.is_empty()) {
        f.evidence.push(item(
            "NVSwitch nodes",
            n.join(", "),
            e.nvswitch_nodes.source.clone(),
        ));
    }
    if !states.is_empty() {
        let v: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        f.evidence
            .push(item("fabric state", v.join(", "), e.smi.source.clone()));
    }
    if let Some(kind) = container_kind(e) {
        f.unchecked.push(format!(
            "whether nv-fabricmanager runs: it runs on the host, and this is a container ({kind})"
        ));
    }
    match fm {
        Some(false) => f.evidence.push(item(
            "nv-fabricmanager",
            "not running",
            e.daemons.source.clone(),
        )),
        Some(true) => f.evidence.push(item(
            "nv-fabricmanager",
            "running",
            e.daemons.source.clone(),
        )),
        None => {}
    }
    f.unchecked.extend(
        [
            unknown(&e.nvswitch_nodes, "NVSwitch nodes"),
            unknown(&e.smi, "fabric state (nvidia-smi -q)"),
            unknown(&e.daemons, "running Fabric Manager"),
        ]
        .into_iter()
        .flatten(),
    );
    let ver = driver(e)
        .map(|d| d.version.clone())
        .unwrap_or_else(|| "the driver's".into());
    f.fix = vec![
        step(
            Where::Host,
            format!(
                "Start NVIDIA Fabric Manager. It must be the same version as the driver ({ver}): \
                 install the nvidia-fabricmanager package of that exact version.{}",
                host_only_note(e)
            ),
            &[
                "sudo systemctl enable --now nvidia-fabricmanager",
                "systemctl status nvidia-fabricmanager",
            ],
        ),
        step(
            Where::Any,
            "Verify: every GPU's fabric state must be Completed before CUDA starts.",
            &["nvidia-smi -q | grep -A 3 -i fabric"],
        ),
    ];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// version_mismatch

/// Version mismatch: the user-space driver library and the kernel module differ, or a
/// forward-compatibility library is used where it is not supported. Signals: `cuInit`
/// 803/804, an `API mismatch` kernel log line, NVML's "Driver/library version mismatch", a
/// mapped `libcuda.so.<ver>` other than `/proc/driver/nvidia/version`, a `compat/` library on
/// a GeForce GPU.
fn version_mismatch(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    let drv = driver(e).map(|d| d.version.as_str());
    let code = o
        .cuinit_result
        .filter(|r| *r == cu::SYSTEM_DRIVER_MISMATCH || *r == cu::COMPAT_NOT_SUPPORTED_ON_DEVICE);
    let api = klog(e).and_then(|l| l.api_mismatch.as_ref());
    let nvml = e
        .smi
        .value
        .as_ref()
        .err()
        .filter(|u| u.why.to_ascii_lowercase().contains("mismatch"));
    let smi_ver = smi(e)
        .and_then(|s| s.driver_version.as_deref())
        .zip(drv)
        .filter(|(s, d)| s != d);
    let geforce = smi(e).is_some_and(|s| s.product_brand.iter().any(|b| b.contains("GeForce")));
    let libs = e.libcuda.get().map(|l| l.as_slice()).unwrap_or(&[]);
    // Only the diagnosed process's libraries when one is observed.
    let relevant = |pid: u32| o.pid.is_none_or(|p| p == pid);
    let plain_diff: Vec<_> = libs
        .iter()
        .filter(|l| relevant(l.pid) && !l.compat)
        .filter(|l| matches!((l.version.as_deref(), drv), (Some(v), Some(d)) if v != d))
        .collect();
    let compat_bad: Vec<_> = libs
        .iter()
        .filter(|l| relevant(l.pid) && l.compat)
        .filter(|l| {
            geforce
                || matches!((l.version.as_deref(), drv),
                    (Some(v), Some(d)) if version_key(v) < version_key(d))
        })
        .collect();
    let compat_any = libs.iter().any(|l| relevant(l.pid) && l.compat);

    let corroborated =
        api.is_some() || nvml.is_some() || !plain_diff.is_empty() || !compat_bad.is_empty();
    let (severity, confidence) = if code.is_some() {
        (
            Severity::Critical,
            if corroborated
                || (code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) && (geforce || compat_any))
            {
                Confidence::High
            } else {
                Confidence::Medium
            },
        )
    } else if api.is_some() || nvml.is_some() {
        (Severity::Critical, Confidence::High)
    } else if !plain_diff.is_empty() || smi_ver.is_some() {
        (Severity::Critical, Confidence::Medium)
    } else if !compat_bad.is_empty() {
        (
            if geforce {
                Severity::Critical
            } else {
                Severity::Warning
            },
            Confidence::Medium,
        )
    } else {
        return None;
    };

    let title = match code {
        Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) => {
            "cuInit returned 804: the forward-compatibility library is not supported on this GPU"
                .to_string()
        }
        Some(c) => format!("cuInit returned {c}: user-space driver and kernel module differ"),
        None if !compat_bad.is_empty() && plain_diff.is_empty() && api.is_none() => {
            "a CUDA forward-compatibility library is used where it is not supported".to_string()
        }
        None => format!(
            "user-space driver and kernel module ({}) differ",
            drv.unwrap_or("version unknown")
        ),
    };
    let mut f = finding("version_mismatch", severity, confidence, title);
    push_cuinit(&mut f, o);
    if let Some(d) = drv {
        f.evidence
            .push(item("kernel module", d, e.driver.source.clone()));
    }
    if let Some(l) = api {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if let Some(u) = nvml {
        f.evidence
            .push(item("nvidia-smi", u.why.clone(), e.smi.source.clone()));
    }
    if let Some((s, _)) = smi_ver {
        f.evidence
            .push(item("NVML driver version", s, e.smi.source.clone()));
    }
    for l in plain_diff.iter().chain(compat_bad.iter()) {
        let kind = if l.compat { " (forward-compat)" } else { "" };
        f.evidence.push(item(
            "libcuda mapped",
            format!(
                "{} by {} (pid {}): {}{kind}",
                l.path,
                l.comm,
                l.pid,
                l.version.as_deref().unwrap_or("version unknown")
            ),
            format!("/proc/{}/maps", l.pid),
        ));
    }
    if geforce && (compat_any || code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE)) {
        f.evidence.push(item(
            "GPU brand",
            "GeForce: forward compatibility is for data-center GPUs",
            e.smi.source.clone(),
        ));
    }
    f.unchecked.extend(
        [
            unknown(&e.driver, "kernel module version"),
            unknown(&e.libcuda, "mapped libcuda"),
            unknown(&e.kernel_log, "kernel log (API mismatch lines)"),
        ]
        .into_iter()
        .flatten(),
    );

    let pid = o
        .pid
        .map(|p| p.to_string())
        .unwrap_or_else(|| "<pid>".into());
    let maps = format!("grep libcuda /proc/{pid}/maps");
    if !plain_diff.is_empty()
        || api.is_some()
        || nvml.is_some()
        || smi_ver.is_some()
        || code == Some(cu::SYSTEM_DRIVER_MISMATCH)
    {
        f.fix.push(step(
            Where::Host,
            format!(
                "After a driver upgrade the old module stays loaded until a reboot (or until \
                 every nvidia module is unloaded and reloaded): reboot so the module matches \
                 the libraries.{}",
                host_only_note(e)
            ),
            &["cat /proc/driver/nvidia/version", "sudo reboot"],
        ));
        f.fix.push(step(
            Where::Container,
            "Use the host's driver library: the NVIDIA Container Toolkit mounts it; a libcuda \
             baked into the image or found first on LD_LIBRARY_PATH shadows it.",
            &["ldconfig -p | grep libcuda", &maps],
        ));
    }
    if compat_any || code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) {
        f.fix.push(step(
            Where::Container,
            "Drop the CUDA forward-compatibility library (a compat/ directory) from the library \
             path, or remove the cuda-compat package: forward compatibility works only on \
             data-center GPUs and with a driver older than the compat library.",
            &["echo $LD_LIBRARY_PATH", &maps],
        ));
    }
    Some(f)
}

// ---------------------------------------------------------------------------------------
// slow_init

/// Slow init: `cuInit` returned 0 but took far longer than it should: above
/// [`SLOW_INIT_BASE_SECONDS`] + [`SLOW_INIT_PER_GPU_SECONDS`] per GPU. Persistence mode off
/// (or no `nvidia-persistenced`) explains it. Never fires for a failed `cuInit`.
fn slow_init(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result != Some(cu::SUCCESS) || o.cuinit_in_flight {
        return None;
    }
    let secs = o.cuinit_seconds?;
    let gpus = gpu_count(e).unwrap_or(1);
    let threshold = SLOW_INIT_BASE_SECONDS + SLOW_INIT_PER_GPU_SECONDS * f64::from(gpus);
    if secs < threshold {
        return None;
    }
    let persistence_off = smi(e)
        .map(|s| {
            s.persistence_mode
                .iter()
                .filter(|m| *m == "Disabled")
                .count()
        })
        .filter(|n| *n > 0);
    let daemon = host_daemon(e, "nvidia-persistenced");
    let explained = persistence_off.is_some() || daemon == Some(false);
    let confidence = if explained {
        Confidence::Medium
    } else {
        Confidence::Low
    };
    let mut f = finding(
        "slow_init",
        Severity::Info,
        confidence,
        format!("cuInit succeeded but took {secs:.1} s ({gpus} GPU(s))"),
    );
    push_cuinit(&mut f, o);
    if let Some(n) = persistence_off {
        f.evidence.push(item(
            "persistence mode",
            format!("Disabled on {n} GPU(s): each GPU is brought up on first open"),
            e.smi.source.clone(),
        ));
    }
    if let Some(running) = daemon {
        f.evidence.push(item(
            "nvidia-persistenced",
            if running { "running" } else { "not running" },
            e.daemons.source.clone(),
        ));
    }
    f.unchecked.push(format!(
        "no baseline of this host's cuInit latency: the threshold is {threshold:.1} s \
         ({SLOW_INIT_BASE_SECONDS} s + {SLOW_INIT_PER_GPU_SECONDS} s per GPU)"
    ));
    if let Some(s) = unknown(&e.smi, "persistence mode (nvidia-smi -q)") {
        f.unchecked.push(s);
    }
    f.fix = vec![step(
        Where::Host,
        format!(
            "Run the NVIDIA persistence daemon so the driver keeps GPU state between clients.{}",
            host_only_note(e)
        ),
        &[
            "sudo systemctl enable --now nvidia-persistenced",
            "nvidia-smi -q | grep -i 'persistence mode'",
        ],
    )];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// adapter_init_failure

/// Adapter init failure: a GPU fails to initialize in the kernel. Signals: kernel log
/// `RmInitAdapter failed` / `rm_init_adapter failed`, Xid 79/119/120; an open of
/// `/dev/nvidia<N>` failing with `EIO`.
fn adapter_init_failure(e: &Evidence, o: &Observations) -> Option<Finding> {
    let log = klog(e);
    let lines = log.map(|l| l.adapter_init_failed.as_slice()).unwrap_or(&[]);
    let xids: Vec<u32> = log
        .map(|l| {
            l.xids
                .iter()
                .copied()
                .filter(|x| ADAPTER_XIDS.contains(x))
                .collect()
        })
        .unwrap_or_default();
    // EIO on a GPU or control node: seen by the probes, or by uvmwatch's own open.
    let rm_node = |p: &str| is_gpu_node(p) || p == "/dev/nvidiactl";
    let mut eio: Vec<(&str, EvidenceItem)> = o
        .failed_opens
        .iter()
        .filter(|(p, err)| err == "EIO" && rm_node(p))
        .map(|(p, _)| (p.as_str(), item("open", format!("{p}: EIO"), SRC_OPENAT)))
        .collect();
    let own = e.dev_nodes.get().map(|n| n.as_slice()).unwrap_or(&[]);
    eio.extend(
        own.iter()
            .filter(|n| rm_node(&n.path) && n.open == Some(Err("EIO".to_string())))
            .map(|n| {
                let p = n.path.as_str();
                (p, item("open by uvmwatch", format!("{p}: EIO"), p))
            }),
    );
    if lines.is_empty() && xids.is_empty() && eio.is_empty() {
        return None;
    }
    let confidence =
        if !lines.is_empty() || xids.contains(&79) || (!eio.is_empty() && !xids.is_empty()) {
            Confidence::High
        } else {
            Confidence::Medium
        };
    let title = if xids.contains(&79) {
        "a GPU has fallen off the bus (Xid 79)".to_string()
    } else if !lines.is_empty() {
        "a GPU failed to initialize in the kernel (RmInitAdapter failed)".to_string()
    } else if let Some((p, _)) = eio.first() {
        format!("{p} returned EIO: the GPU did not initialize")
    } else {
        format!(
            "GSP firmware error on a GPU (Xid {})",
            xids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut f = finding(
        "adapter_init_failure",
        Severity::Critical,
        confidence,
        title,
    );
    push_cuinit(&mut f, o);
    f.evidence.extend(eio.into_iter().map(|(_, i)| i));
    for l in lines.iter().take(3) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if !xids.is_empty() {
        let v: Vec<String> = xids.iter().map(u32::to_string).collect();
        f.evidence
            .push(item("Xid", v.join(", "), e.kernel_log.source.clone()));
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (needs root or CAP_SYSLOG)") {
        f.unchecked
            .push(format!("{s}: cannot see RmInitAdapter failures or Xids"));
    }
    let fw = driver(e)
        .map(|d| format!("ls /lib/firmware/nvidia/{}/", d.version))
        .unwrap_or_else(|| "ls /lib/firmware/nvidia/".into());
    f.fix = vec![
        step(
            Where::Any,
            "Read the failure code: RmInitAdapter failed! (0xAA:0xBB:NNN) and the Xid name the \
             cause.",
            &[
                "sudo dmesg -T | grep -E 'RmInitAdapter|rm_init_adapter|Xid'",
                "sudo nvidia-bug-report.sh",
            ],
        ),
        step(
            Where::Host,
            format!(
                "Depends on the code: Xid 79 (fell off the bus) needs a reboot and a check of \
                 power, cooling and seating; RmInitAdapter failures: BIOS settings (Above 4G \
                 decoding, BAR size), the GSP firmware files of this driver, and a driver \
                 flavor that supports the GPU (Blackwell needs the open module); Xid 119/120: \
                 GPU reset or reboot, then a driver update.{}",
                host_only_note(e)
            ),
            &[&fw, "sudo reboot"],
        ),
    ];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// fork_after_init

/// Fork after init: a child forked (no exec) from a process that had already run `cuInit`
/// calls `cuInit`, which returns 3 within microseconds with no new `/dev/nvidia*` opens.
/// Fires only when the fork was seen (`probe:fork`) and no device open succeeded.
fn fork_after_init(_e: &Evidence, o: &Observations) -> Option<Finding> {
    if !o.forked_after_parent_init
        || o.cuinit_result != Some(cu::NOT_INITIALIZED)
        || o.device_opens > 0
        || !o.failed_opens.is_empty()
    {
        return None;
    }
    let opens_blind = probe_unavailable(o, "openat");
    let fast = o.cuinit_seconds.is_some_and(|s| s <= FORK_FAIL_SECONDS);
    let confidence = if fast && opens_blind.is_none() {
        Confidence::High
    } else {
        Confidence::Medium
    };
    let mut f = finding(
        "fork_after_init",
        Severity::Critical,
        confidence,
        "cuInit returned 3 in a child forked after its parent initialized CUDA".to_string(),
    );
    f.evidence.push(item(
        "process",
        "forked without exec from a process that had run cuInit",
        SRC_FORK,
    ));
    push_cuinit(&mut f, o);
    f.evidence.push(item(
        "device opens",
        "none: the driver was never reached",
        SRC_OPENAT,
    ));
    if let Some(why) = opens_blind {
        f.unchecked.push(format!("device opens not seen: {why}"));
    }
    if o.cuinit_seconds.is_none() {
        f.unchecked
            .push("cuInit duration not seen (uretprobe timing)".into());
    }
    f.unchecked
        .push("whether the parent's own cuInit succeeded (only the fork is recorded)".into());
    f.fix = vec![step(
        Where::Container,
        "In the workload: start workers with spawn (or forkserver), not fork, or initialize \
         CUDA only in the children; CUDA state does not survive fork(). Python: put this in \
         the main module before any worker starts (PyTorch: torch.multiprocessing).",
        &["multiprocessing.set_start_method(\"spawn\", force=True)"],
    )];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// policy_or_partition

/// Policy or partition: CUDA starts but the GPU refuses the work: a compute mode of
/// `Prohibited` or `Exclusive_Process` held by another process (CUDA error 46), or MIG on
/// with no MIG device visible to CUDA (`cuInit` 100 with every open succeeding). Static
/// only for `Prohibited`: an exclusive GPU held by one process, or MIG on, is a deliberate
/// set-up until something fails.
fn policy_or_partition(e: &Evidence, o: &Observations) -> Option<Finding> {
    let s = smi(e);
    let modes = s.map(|s| s.compute_mode.as_slice()).unwrap_or(&[]);
    let prohibited = modes.iter().filter(|m| *m == "Prohibited").count();
    let exclusive = modes.iter().filter(|m| m.starts_with("Exclusive")).count();
    let mig_on = s.is_some_and(|s| s.mig_mode.iter().any(|m| m == "Enabled"));
    let others: Vec<u32> = e
        .libcuda
        .get()
        .map(|l| {
            l.iter()
                .map(|m| m.pid)
                .filter(|p| Some(*p) != o.pid)
                .collect()
        })
        .unwrap_or_default();
    let code46 = o.cuinit_result == Some(cu::DEVICE_UNAVAILABLE);
    let mig100 = mig_on
        && o.cuinit_result == Some(cu::NO_DEVICE)
        && o.failed_opens.is_empty()
        && o.device_opens > 0;

    let (severity, confidence, title) = if code46 && (prohibited > 0 || exclusive > 0) {
        (
            Severity::Critical,
            Confidence::High,
            "CUDA error 46: the GPU's compute mode refuses this process".to_string(),
        )
    } else if code46 && s.is_none() {
        (
            Severity::Critical,
            Confidence::Low,
            "CUDA error 46 (device unavailable); the compute mode could not be read".to_string(),
        )
    } else if mig100 {
        (
            Severity::Critical,
            Confidence::Medium,
            "cuInit returned 100 with MIG on: CUDA sees MIG devices only".to_string(),
        )
    } else if !observed(o) && prohibited > 0 {
        (
            if prohibited == modes.len() {
                Severity::Critical
            } else {
                Severity::Warning
            },
            Confidence::Medium,
            format!("compute mode Prohibited on {prohibited} GPU(s): no CUDA context can be created there"),
        )
    } else {
        return None;
    };
    let mut f = finding("policy_or_partition", severity, confidence, title);
    push_cuinit(&mut f, o);
    if !modes.is_empty() {
        f.evidence
            .push(item("compute mode", modes.join(", "), e.smi.source.clone()));
    }
    if let Some(s) = s.filter(|s| !s.mig_mode.is_empty()) {
        f.evidence.push(item(
            "MIG mode",
            s.mig_mode.join(", "),
            e.smi.source.clone(),
        ));
    }
    if exclusive > 0 && !others.is_empty() {
        let v: Vec<String> = others.iter().map(u32::to_string).collect();
        f.evidence.push(item(
            "other CUDA processes (pid)",
            v.join(", "),
            e.libcuda.source.clone(),
        ));
    }
    if let Some(s) = unknown(&e.smi, "compute and MIG mode (nvidia-smi -q)") {
        f.unchecked.push(s);
    }
    f.unchecked.push(
        "context-creation results are not probed (only cuInit): a later 46 is not seen".into(),
    );
    f.fix = vec![
        step(
            Where::Host,
            format!(
                "If an exclusive or prohibited compute mode is not intended, set it back to \
                 Default (per GPU with -i).{}",
                host_only_note(e)
            ),
            &[
                "nvidia-smi --query-gpu=index,compute_mode --format=csv",
                "sudo nvidia-smi -c DEFAULT",
            ],
        ),
        step(
            Where::Container,
            "With MIG on, select MIG devices by UUID (CUDA_VISIBLE_DEVICES=MIG-<uuid>) and make \
             sure GPU and compute instances exist.",
            &["nvidia-smi -L"],
        ),
    ];
    Some(f)
}

// ---------------------------------------------------------------------------------------
// Test data

/// Evidence and observations built in code, for the rule and report tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use super::super::facts::{
        ContainerInfo, DevNode, DriverInfo, Evidence, Fact, KernelInfo, KernelLog, MappedLibcuda,
        Observations, SeenCall, SmiInfo,
    };

    /// The reason a collector gives for a file that is not there.
    pub const NO_FILE: &str = "not readable: No such file or directory (os error 2)";

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(path: &str, major: u32, minor: u32) -> DevNode {
        DevNode {
            path: path.into(),
            dev: Some((major, minor)),
            open: Some(Ok(())),
        }
    }

    fn kernel_config(release: &str) -> Fact<BTreeMap<String, String>> {
        Fact::ok(
            map(&[
                ("CONFIG_HMM_MIRROR", "y"),
                ("CONFIG_DEVICE_PRIVATE", "y"),
                ("CONFIG_RANDOMIZE_BASE", "y"),
                ("CONFIG_RANDOMIZE_MEMORY", "y"),
                ("CONFIG_KPROBES", "y"),
                ("CONFIG_ZONE_DEVICE", "y"),
            ]),
            format!("/boot/config-{release}"),
        )
    }

    /// A working host: open module 590.48.01, HMM on (`uvm_disable_hmm=N`), KASLR on, one
    /// GPU, persistence on, on a 6.12 kernel (which has the x86/kaslr fix). No rule fires.
    pub fn healthy_open_host() -> Evidence {
        let release = "6.12.0-55-generic";
        Evidence {
            driver: Fact::ok(
                DriverInfo {
                    version: "590.48.01".into(),
                    open_module: true,
                    line: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  \
                           Release Build  (dvs-builder@U22-I3-AF03-09-1)"
                        .into(),
                },
                "/proc/driver/nvidia/version",
            ),
            driver_params: Fact::ok(
                map(&[("ModifyDeviceFiles", "1")]),
                "/proc/driver/nvidia/params",
            ),
            uvm_params: Fact::ok(
                map(&[("uvm_disable_hmm", "N"), ("uvm_debug_prints", "N")]),
                "/sys/module/nvidia_uvm/parameters",
            ),
            modules: Fact::ok(
                vec![
                    "nvidia_uvm".into(),
                    "nvidia_drm".into(),
                    "nvidia_modeset".into(),
                    "nvidia".into(),
                ],
                "/proc/modules",
            ),
            devices: Fact::ok(
                [
                    ("nvidia-frontend".to_string(), 195),
                    ("nvidia-uvm".to_string(), 508),
                ]
                .into_iter()
                .collect(),
                "/proc/devices",
            ),
            dev_nodes: Fact::ok(
                vec![
                    node("/dev/nvidiactl", 195, 255),
                    node("/dev/nvidia0", 195, 0),
                    node("/dev/nvidia-uvm", 508, 0),
                    node("/dev/nvidia-uvm-tools", 508, 1),
                ],
                "/dev",
            ),
            nvswitch_nodes: Fact::ok(vec![], "/dev/nvidia-nvswitch*"),
            container: Fact::ok(
                ContainerInfo {
                    kind: "host".into(),
                    id: None,
                    pod_uid: None,
                    device_allow: None,
                },
                "/proc/1/cgroup",
            ),
            kernel: Fact::ok(
                KernelInfo {
                    release: release.into(),
                    version: (6, 12),
                },
                "/proc/sys/kernel/osrelease",
            ),
            kernel_config: kernel_config(release),
            cmdline: Fact::ok(
                format!("BOOT_IMAGE=/vmlinuz-{release} root=/dev/mapper/vg-root ro quiet splash"),
                "/proc/cmdline",
            ),
            iomem_hmm: Fact::unavailable("addresses hidden: needs root", "/proc/iomem"),
            smi: Fact::ok(
                SmiInfo {
                    gpus: 1,
                    addressing_mode: vec!["HMM".into()],
                    persistence_mode: vec!["Enabled".into()],
                    compute_mode: vec!["Default".into()],
                    mig_mode: vec!["N/A".into()],
                    fabric_state: vec!["N/A".into()],
                    product_brand: vec!["NVIDIA".into()],
                    driver_version: Some("590.48.01".into()),
                },
                "nvidia-smi -q",
            ),
            kernel_log: Fact::ok(KernelLog::default(), "/dev/kmsg"),
            daemons: Fact::ok(vec!["nvidia-persistenced".into()], "/proc/*/comm"),
            libcuda: Fact::ok(
                vec![MappedLibcuda {
                    pid: 1234,
                    comm: "python3".into(),
                    path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                    version: Some("590.48.01".into()),
                    compat: false,
                }],
                "/proc/*/maps",
            ),
        }
    }

    /// The motivating incident's host: as [`healthy_open_host`] on Ubuntu's 6.8 kernel, which
    /// has no x86/kaslr fix.
    pub fn motivating_host() -> Evidence {
        healthy_open_host().kernel("6.8.0-45-generic")
    }

    /// A machine without any NVIDIA driver.
    pub fn no_driver_host() -> Evidence {
        let mut e = healthy_open_host();
        e.driver = Fact::unavailable(NO_FILE, "/proc/driver/nvidia/version");
        e.driver_params = Fact::unavailable(NO_FILE, "/proc/driver/nvidia/params");
        e.uvm_params = Fact::unavailable(NO_FILE, "/sys/module/nvidia_uvm/parameters");
        e.modules = Fact::ok(vec![], "/proc/modules");
        e.devices = Fact::ok(BTreeMap::new(), "/proc/devices");
        e.dev_nodes = Fact::ok(vec![], "/dev");
        e.smi = Fact::unavailable("nvidia-smi not present", "nvidia-smi -q");
        e.daemons = Fact::ok(vec![], "/proc/*/comm");
        e.libcuda = Fact::ok(vec![], "/proc/*/maps");
        e
    }

    /// Tweaks of an [`Evidence`], chained: `motivating_host().hmm_param("Y")`.
    pub trait Tweak: Sized {
        /// Any change.
        fn with(self, f: impl FnOnce(&mut Evidence)) -> Self;

        /// Kernel release (version parsed from it).
        fn kernel(self, release: &str) -> Self {
            let mut it = release
                .split(['.', '-'])
                .map(|p| p.parse::<u32>().unwrap_or(0));
            let version = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            let release = release.to_string();
            self.with(move |e| {
                e.kernel = Fact::ok(
                    KernelInfo {
                        release: release.clone(),
                        version,
                    },
                    "/proc/sys/kernel/osrelease",
                );
                let cfg = kernel_config(&release);
                e.kernel_config = Fact {
                    value: e.kernel_config.value.clone(),
                    source: cfg.source,
                };
            })
        }
        /// `uvm_disable_hmm` as sysfs prints it.
        fn hmm_param(self, v: &str) -> Self {
            let v = v.to_string();
            self.with(|e| {
                if let Ok(m) = &mut e.uvm_params.value {
                    m.insert("uvm_disable_hmm".into(), v);
                }
            })
        }
        /// A kernel config option (`None` removes it: "is not set").
        fn config(self, key: &str, v: Option<&str>) -> Self {
            self.with(|e| {
                if let Ok(m) = &mut e.kernel_config.value {
                    match v {
                        Some(v) => m.insert(key.into(), v.into()),
                        None => m.remove(key),
                    };
                }
            })
        }
        /// `/proc/cmdline`.
        fn cmdline(self, s: &str) -> Self {
            self.with(|e| e.cmdline = Fact::ok(s.to_string(), "/proc/cmdline"))
        }
        /// The proprietary kernel module instead of the open one.
        fn proprietary(self) -> Self {
            self.with(|e| {
                if let Ok(d) = &mut e.driver.value {
                    d.open_module = false;
                    d.line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.48.01  Fri Nov 21 2025".into();
                }
            })
        }
        /// Runs in a container of `kind`, with a cgroup v1 allow-list when given.
        fn container(self, kind: &str, allow: Option<&[&str]>) -> Self {
            self.with(|e| {
                e.container = Fact::ok(
                    ContainerInfo {
                        kind: kind.into(),
                        id: Some("c0ffee".into()),
                        pod_uid: None,
                        device_allow: allow.map(|a| a.iter().map(|s| s.to_string()).collect()),
                    },
                    "/proc/1/cgroup",
                )
            })
        }
        /// Changes the kernel log.
        fn log(self, f: impl FnOnce(&mut KernelLog)) -> Self {
            self.with(|e| {
                if let Ok(l) = &mut e.kernel_log.value {
                    f(l)
                }
            })
        }
        /// Changes what nvidia-smi says.
        fn smi(self, f: impl FnOnce(&mut SmiInfo)) -> Self {
            self.with(|e| {
                if let Ok(s) = &mut e.smi.value {
                    f(s)
                }
            })
        }
        /// Removes a device node.
        fn without_node(self, path: &str) -> Self {
            self.with(|e| {
                if let Ok(n) = &mut e.dev_nodes.value {
                    n.retain(|d| d.path != path)
                }
            })
        }
        /// Replaces the mapped libcuda list.
        fn libcuda(self, libs: Vec<MappedLibcuda>) -> Self {
            self.with(|e| e.libcuda = Fact::ok(libs, "/proc/*/maps"))
        }
        /// Running daemons.
        fn daemons(self, names: &[&str]) -> Self {
            self.with(|e| {
                e.daemons = Fact::ok(
                    names.iter().map(|s| s.to_string()).collect(),
                    "/proc/*/comm",
                )
            })
        }
    }

    impl Tweak for Evidence {
        fn with(mut self, f: impl FnOnce(&mut Evidence)) -> Self {
            f(&mut self);
            self
        }
    }

    /// What the probes saw for process 4242, before any tweak: nothing yet.
    pub fn process() -> Observations {
        Observations {
            pid: Some(4242),
            ..Observations::default()
        }
    }

    /// Tweaks of an [`Observations`], chained.
    pub trait Saw: Sized {
        /// Any change.
        fn with(self, f: impl FnOnce(&mut Observations)) -> Self;

        /// `cuInit` returned `r` after `secs`.
        fn cuinit(self, r: i64, secs: f64) -> Self {
            self.with(|o| {
                o.cuinit_result = Some(r);
                o.cuinit_seconds = Some(secs);
            })
        }
        /// `cuInit` still running after `secs`.
        fn in_flight(self, secs: f64) -> Self {
            self.with(|o| {
                o.cuinit_in_flight = true;
                o.cuinit_seconds = Some(secs);
            })
        }
        /// `n` successful opens of NVIDIA nodes.
        fn opens(self, n: u32) -> Self {
            self.with(|o| o.device_opens = n)
        }
        /// A failed open.
        fn failed_open(self, path: &str, errno: &str) -> Self {
            self.with(|o| o.failed_opens.push((path.into(), errno.into())))
        }
        /// A driver call that returned `result`.
        fn failed_call(self, call: &str, node: &str, result: &str) -> Self {
            self.with(|o| {
                o.failed_call = Some(SeenCall {
                    call: call.into(),
                    node: node.into(),
                    result: result.into(),
                    seconds: 0.05,
                })
            })
        }
        /// A driver call in flight for `secs`, the thread in `state`.
        fn stuck(self, call: &str, node: &str, secs: f64, state: &str) -> Self {
            self.with(|o| {
                o.stuck_in = Some(SeenCall {
                    call: call.into(),
                    node: node.into(),
                    result: String::new(),
                    seconds: secs,
                });
                o.stuck_state = Some(state.into());
            })
        }
        /// Forked without exec after the parent's cuInit.
        fn forked(self) -> Self {
            self.with(|o| o.forked_after_parent_init = true)
        }
        /// A probe that is not attached, with why.
        fn unavailable(self, probe: &str) -> Self {
            self.with(|o| o.unavailable_probes.push(probe.into()))
        }
    }

    impl Saw for Observations {
        fn with(mut self, f: impl FnOnce(&mut Observations)) -> Self {
            f(&mut self);
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::{Evidence, Fact, MappedLibcuda, Observations};
    use super::fixtures::*;
    use super::*;

    /// Runs one rule and checks what every finding must have.
    fn run(id: &str, e: &Evidence, o: &Observations) -> Option<Finding> {
        let rule = RULES.iter().find(|r| r.id == id).expect("rule id");
        let f = (rule.check)(e, o)?;
        assert_eq!(f.rule, id);
        assert_eq!(f.runbook, format!("docs/runbooks/{id}.md"));
        assert!(!f.title.is_empty());
        assert!(!f.evidence.is_empty(), "{id}: no evidence");
        for i in &f.evidence {
            assert!(
                !i.source.is_empty(),
                "{id}: evidence {:?} has no source",
                i.what
            );
            assert!(
                !i.value.is_empty(),
                "{id}: evidence {:?} has no value",
                i.what
            );
        }
        assert!(!f.fix.is_empty(), "{id}: no fix");
        for s in &f.fix {
            assert!(!s.note.is_empty());
        }
        Some(f)
    }

    fn plain() -> Observations {
        Observations::default()
    }

    fn has_fix(f: &Finding, w: Where, needle: &str) -> bool {
        f.fix
            .iter()
            .any(|s| s.where_ == w && s.commands.iter().any(|c| c.contains(needle)))
    }

    fn mentions(f: &Finding, needle: &str) -> bool {
        f.unchecked.iter().any(|u| u.contains(needle))
    }

    // The motivating incident: cuInit 3 after UVM_REGISTER_GPU fails with NV_ERR_NO_MEMORY.
    fn incident() -> Observations {
        process().cuinit(3, 0.412).opens(4).failed_call(
            "UVM_REGISTER_GPU",
            "/dev/nvidia-uvm",
            "NV_ERR_NO_MEMORY",
        )
    }

    #[test]
    fn rules_are_one_per_class() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        assert_eq!(
            ids,
            [
                "hmm_setup_failure",
                "driver_hang",
                "node_or_module_missing",
                "device_permission",
                "stale_after_suspend",
                "fabric_not_ready",
                "version_mismatch",
                "slow_init",
                "adapter_init_failure",
                "fork_after_init",
                "policy_or_partition",
            ]
        );
    }

    #[test]
    fn every_rule_has_a_runbook() {
        // The agent crate runs tests from agent/; a harness that includes this file by
        // path finds docs/ from the file's own location.
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let candidates = std::iter::once(manifest.join("../docs/runbooks")).chain(
            std::path::Path::new(file!())
                .ancestors()
                .map(|a| a.join("docs/runbooks")),
        );
        let dir = candidates
            .into_iter()
            .find(|d| d.is_dir())
            .expect("docs/runbooks not found");
        for r in RULES {
            let path = dir.join(format!("{}.md", r.id));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.starts_with("# "), "{}: no title", path.display());
        }
    }

    #[test]
    fn healthy_hosts_have_no_findings() {
        assert_eq!(diagnose(&healthy_open_host(), &plain()), vec![]);
        let ok = process().cuinit(0, 0.31).opens(4);
        assert_eq!(diagnose(&healthy_open_host(), &ok), vec![]);
        assert_eq!(diagnose(&no_driver_host(), &plain()), vec![]);
        // Proprietary module on the incident's kernel: HMM set-up is not its path.
        assert_eq!(diagnose(&motivating_host().proprietary(), &plain()), vec![]);
    }

    #[test]
    fn no_driver_says_why() {
        let why = no_driver_reason();
        assert!(why.contains("/proc/driver/nvidia/version"), "{why}");
        assert!(no_driver(&healthy_open_host()).is_none());
    }

    fn no_driver_reason() -> String {
        no_driver(&no_driver_host()).expect("no driver")
    }

    // --- hmm_setup_failure

    #[test]
    fn motivating_case_end_to_end() {
        let findings = diagnose(&motivating_host(), &incident());
        assert_eq!(findings.len(), 1, "{findings:#?}");
        let f = &findings[0];
        assert_eq!(f.rule, "hmm_setup_failure");
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.confidence, Confidence::High);
        assert!(f.title.contains("NV_ERR_NO_MEMORY"), "{}", f.title);
        assert!(has_fix(f, Where::Host, "uvm_disable_hmm=1"));
        assert!(has_fix(f, Where::Host, HMM_CONF));
        assert!(has_fix(
            f,
            Where::Host,
            "modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm"
        ));
        assert!(has_fix(
            f,
            Where::Any,
            "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
        ));
        // Each item carries its source; the probe's are labelled as such.
        let src = |what: &str| {
            f.evidence
                .iter()
                .find(|i| i.what == what)
                .map(|i| i.source.as_str())
        };
        assert_eq!(src("GPU registration in UVM"), Some(SRC_IOCTL));
        assert_eq!(src("cuInit returned"), Some(SRC_CUINIT));
        assert_eq!(
            src("uvm_disable_hmm"),
            Some("/sys/module/nvidia_uvm/parameters")
        );
        assert_eq!(src("KASLR"), Some("/proc/cmdline"));
        // The kernel side could not be seen without a kprobe: said, not claimed.
        assert!(mentions(f, "request_free_mem_region"), "{:?}", f.unchecked);
    }

    #[test]
    fn motivating_case_hang_variant() {
        let hang = process().in_flight(45.0).opens(4).stuck(
            "UVM_REGISTER_GPU",
            "/dev/nvidia-uvm",
            44.5,
            "D (disk sleep)",
        );
        let findings = diagnose(&motivating_host(), &hang);
        let rules: Vec<&str> = findings.iter().map(|f| f.rule.as_str()).collect();
        assert_eq!(rules, ["hmm_setup_failure", "driver_hang"]);
        let f = &findings[0];
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.confidence, Confidence::High);
        assert!(f.title.contains("hangs"), "{}", f.title);
        assert!(has_fix(f, Where::Host, "uvm_disable_hmm=1"));
    }

    #[test]
    fn hmm_not_with_hmm_disabled() {
        let e = motivating_host().hmm_param("Y");
        assert_eq!(run("hmm_setup_failure", &e, &incident()), None);
        assert_eq!(run("hmm_setup_failure", &e, &plain()), None);
    }

    #[test]
    fn hmm_not_on_proprietary_module() {
        let e = motivating_host().proprietary();
        assert_eq!(run("hmm_setup_failure", &e, &incident()), None);
    }

    #[test]
    fn hmm_not_without_kernel_hmm_or_with_ats() {
        let e = motivating_host().config("CONFIG_DEVICE_PRIVATE", None);
        assert_eq!(run("hmm_setup_failure", &e, &incident()), None);
        let ats = motivating_host().smi(|s| s.addressing_mode = vec!["ATS".into()]);
        assert_eq!(run("hmm_setup_failure", &ats, &incident()), None);
    }

    #[test]
    fn rm_hang_is_driver_hang_not_hmm() {
        let hang = process().in_flight(60.0).opens(2).stuck(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            59.0,
            "D (disk sleep)",
        );
        let findings = diagnose(&motivating_host(), &hang);
        assert_eq!(findings[0].rule, "driver_hang");
        assert_eq!(findings[0].severity, Severity::Critical);
        assert!(findings
            .iter()
            .all(|f| f.rule != "hmm_setup_failure" || f.severity != Severity::Critical));
    }

    #[test]
    fn hmm_risk_warning_from_static_evidence() {
        let f = run("hmm_setup_failure", &motivating_host(), &plain()).expect("warning");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.confidence, Confidence::Medium);
        assert!(mentions(&f, "--probe"), "{:?}", f.unchecked);
        // Kernel with the fix, nokaslr, HMM regions already set up, or cuInit working: none.
        assert_eq!(
            run("hmm_setup_failure", &healthy_open_host(), &plain()),
            None
        );
        let nokaslr = motivating_host().cmdline("BOOT_IMAGE=/vmlinuz ro nokaslr");
        assert_eq!(run("hmm_setup_failure", &nokaslr, &plain()), None);
        let set_up = motivating_host().with(|e| {
            e.iomem_hmm = Fact::ok(
                vec!["  3f0000000000-3f07ffffffff : nvidia-uvm-hmm".into()],
                "/proc/iomem",
            )
        });
        assert_eq!(run("hmm_setup_failure", &set_up, &plain()), None);
        let works = process().cuinit(0, 0.3).opens(4);
        assert_eq!(run("hmm_setup_failure", &motivating_host(), &works), None);
    }

    #[test]
    fn hmm_needs_more_than_error_3() {
        // The ioctl probes saw every call and none failed: not the HMM failure.
        let only3 = process().cuinit(3, 0.3).opens(4);
        let f = run("hmm_setup_failure", &motivating_host(), &only3);
        assert!(f.is_none_or(|f| f.severity == Severity::Warning));
        // Blind to ioctls: a low-confidence critical that says what it could not see.
        let blind = only3.unavailable("syscalls:sys_exit_ioctl: tracefs not mounted");
        let f = run("hmm_setup_failure", &motivating_host(), &blind).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Low)
        );
        assert!(mentions(&f, "UVM_REGISTER_GPU result not seen"));
        // Blind, but HMM device memory is already set up (nvidia-uvm-hmm in /proc/iomem):
        // the set-up did not fail, so no critical finding.
        let set_up = motivating_host().with(|e| {
            e.iomem_hmm = Fact::ok(
                vec!["  3000000000-3fffffffff : nvidia-uvm-hmm".into()],
                "/proc/iomem",
            )
        });
        let f = run("hmm_setup_failure", &set_up, &blind);
        assert!(
            f.as_ref().is_none_or(|f| f.severity != Severity::Critical),
            "{f:?}"
        );
    }

    #[test]
    fn hmm_from_kernel_log_or_kprobe() {
        let e = motivating_host().log(|l| {
            l.hmm_errors = vec![
                "nvidia-uvm: uvm_pmm_gpu.c:3176 devmem_alloc_pagemap[pid:92821] \
                                 request_free_mem_region() err -34"
                    .into(),
            ]
        });
        let f = run("hmm_setup_failure", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        let k = process().cuinit(3, 0.4).with(|o| {
            o.kernel_signals
                .push("request_free_mem_region = -34 (ERANGE)".into())
        });
        let f = run("hmm_setup_failure", &motivating_host(), &k).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
        assert!(!mentions(&f, "cannot see request_free_mem_region"));
        // Seen failing in the kernel: fires even where the kernel config says HMM cannot
        // be set up (a kernel built without CONFIG_DEVICE_PRIVATE, as the VM tests' are).
        let no_dp = motivating_host().with(|e| {
            if let Ok(c) = e.kernel_config.value.as_mut() {
                c.insert("CONFIG_DEVICE_PRIVATE".into(), "n".into());
            }
        });
        // Without that evidence the config rules HMM out.
        assert!(run("hmm_setup_failure", &no_dp, &incident()).is_none());
        let f = run("hmm_setup_failure", &no_dp, &k).expect("kernel evidence wins");
        assert_eq!(f.severity, Severity::Critical);
    }

    #[test]
    fn hmm_lower_without_kaslr_or_unknown_profile() {
        let nokaslr = motivating_host().cmdline("ro nokaslr");
        let f = run("hmm_setup_failure", &nokaslr, &incident()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        let unknown = motivating_host().with(|e| {
            e.uvm_params =
                Fact::unavailable("permission denied", "/sys/module/nvidia_uvm/parameters")
        });
        let f = run("hmm_setup_failure", &unknown, &incident()).expect("finding");
        assert_eq!(f.confidence, Confidence::Medium);
        assert!(mentions(&f, "uvm_disable_hmm unknown"));
    }

    // --- driver_hang

    #[test]
    fn driver_hang_from_stuck_thread() {
        let hang = process()
            .in_flight(60.0)
            .stuck(
                "NV_ESC_RM_CONTROL",
                "/dev/nvidiactl",
                59.0,
                "D (disk sleep)",
            )
            .with(|o| o.stuck_wchan = Some("os_acquire_mutex".into()));
        let f = run("driver_hang", &healthy_open_host(), &hang).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f.evidence.iter().any(|i| i.source == "/proc/4242/wchan"));
        assert!(has_fix(&f, Where::Any, "/proc/4242/stack"));
    }

    #[test]
    fn driver_hang_from_kernel_log_only() {
        let e = healthy_open_host().log(|l| {
            l.driver_hangs = vec![
                "BUG: kernel NULL pointer dereference, address: 0000000000000000".into(),
                "RIP: 0010:uvm_va_space_register_gpu+0x1f/0x300 [nvidia_uvm]".into(),
            ]
        });
        let f = run("driver_hang", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f.title.contains("wedged"));
    }

    #[test]
    fn hang_kinds() {
        let k = |l: &str| hang_kind(l);
        assert_eq!(
            k("watchdog: BUG: soft lockup - CPU#12 stuck for 26s! [python3:2817]"),
            HangKind::Stall
        );
        assert_eq!(
            k("INFO: task python3:2817 blocked for more than 122 seconds."),
            HangKind::Stall
        );
        assert_eq!(
            k("rcu: INFO: rcu_sched self-detected stall on CPU"),
            HangKind::Stall
        );
        assert_eq!(
            k("BUG: kernel NULL pointer dereference, address: 0000000000000000"),
            HangKind::Oops
        );
        assert_eq!(
            k("general protection fault, probably for non-canonical address"),
            HangKind::Oops
        );
        assert_eq!(
            k("WARNING: CPU: 3 PID: 1 at nv.c:4511 nv_restore_user_channels"),
            HangKind::Warn
        );
    }

    #[test]
    fn driver_hang_not_without_a_call_in_flight() {
        // cuInit slow in user space, ioctl probes working: nothing stuck in the driver.
        let slow = process().in_flight(30.0).opens(4);
        assert_eq!(run("driver_hang", &healthy_open_host(), &slow), None);
        // A call that failed and returned is not a hang.
        assert_eq!(run("driver_hang", &motivating_host(), &incident()), None);
        // Blind to ioctls: a low warning that says so.
        let blind = slow.unavailable("syscalls:sys_enter_ioctl: tracefs not mounted");
        let f = run("driver_hang", &healthy_open_host(), &blind).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Warning, Confidence::Low)
        );
    }

    // --- node_or_module_missing

    #[test]
    fn missing_node_from_enoent() {
        let o = process()
            .cuinit(999, 0.004)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let e = healthy_open_host().without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-modprobe -u -c 0"));
        assert_eq!(run("device_permission", &e, &o), None);
    }

    #[test]
    fn missing_node_in_container_from_static_evidence() {
        let e = healthy_open_host()
            .container("docker", None)
            .without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        assert!(has_fix(&f, Where::Host, "--device /dev/nvidia-uvm"));
        // On the host nvidia-modprobe creates it on first use: only a low warning.
        let host = healthy_open_host().without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &host, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Warning, Confidence::Low)
        );
        // ...and none once cuInit is seen working.
        let ok = process().cuinit(0, 0.4).opens(4);
        assert_eq!(run("node_or_module_missing", &host, &ok), None);
    }

    #[test]
    fn missing_driver_when_a_process_tries() {
        let o = process()
            .cuinit(100, 0.002)
            .failed_open("/dev/nvidiactl", "ENOENT");
        let f = run("node_or_module_missing", &no_driver_host(), &o).expect("finding");
        assert!(f.title.contains("no NVIDIA driver"), "{}", f.title);
        assert!(has_fix(&f, Where::Host, "modprobe nvidia"));
    }

    #[test]
    fn eperm_is_not_a_missing_node() {
        let o = process()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        assert_eq!(
            run("node_or_module_missing", &healthy_open_host(), &o),
            None
        );
    }

    // --- device_permission

    const STALE_ALLOW: &[&str] = &["c 195:* rwm", "c 507:* rwm", "c 1:3 rwm"];

    #[test]
    fn eperm_with_stale_major() {
        let e = healthy_open_host().container("lxc", Some(STALE_ALLOW));
        let o = process()
            .cuinit(999, 0.003)
            .opens(2)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        let f = run("device_permission", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f
            .evidence
            .iter()
            .any(|i| i.value.contains("nothing for c 508:*")));
        assert!(f.fix.iter().any(|s| s.note.contains("c 508:* rwm")));
        assert_eq!(run("node_or_module_missing", &e, &o), None);
        assert_eq!(run("stale_after_suspend", &e, &o), None);
    }

    #[test]
    fn stale_allow_list_from_static_evidence() {
        let e = healthy_open_host().container("lxc", Some(STALE_ALLOW));
        let f = run("device_permission", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        let good = healthy_open_host().container("lxc", Some(&["c 195:* rwm", "c 508:* rwm"]));
        assert_eq!(run("device_permission", &good, &plain()), None);
        // A container not meant to have GPUs (no NVIDIA major at all): not stale.
        let no_gpu = healthy_open_host().container("docker", Some(&["c 1:3 rwm", "c 5:0 rwm"]));
        assert_eq!(run("device_permission", &no_gpu, &plain()), None);
        // cgroup v2: no list to check, nothing claimed.
        let v2 = healthy_open_host().container("docker", None);
        assert_eq!(run("device_permission", &v2, &plain()), None);
    }

    #[test]
    fn eacces_suggests_modes() {
        let o = process()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia0", "EACCES");
        let f = run("device_permission", &healthy_open_host(), &o).expect("finding");
        assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
    }

    #[test]
    fn allow_lines() {
        assert!(allow_line_permits("a *:* rwm", 508, 0));
        assert!(allow_line_permits("c 508:* rwm", 508, 0));
        assert!(allow_line_permits("c 508:0 rw", 508, 0));
        assert!(!allow_line_permits("c 508:1 rw", 508, 0));
        assert!(!allow_line_permits("c 508:* r", 508, 0));
        assert!(!allow_line_permits("b 508:* rwm", 508, 0));
        assert!(!allow_line_permits("c 195:* rwm", 508, 0));
        assert!(!allow_line_permits("garbage", 508, 0));
    }

    // --- stale_after_suspend

    #[test]
    fn suspend_then_999() {
        let e = healthy_open_host().log(|l| l.resumed_after_uvm_load = true);
        let o = process().cuinit(999, 0.02).opens(4);
        let f = run("stale_after_suspend", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "modprobe -r nvidia_uvm"));
    }

    #[test]
    fn suspend_near_misses() {
        let o = process().cuinit(999, 0.02).opens(4);
        // No resume in a readable log: not this.
        assert_eq!(run("stale_after_suspend", &healthy_open_host(), &o), None);
        // Resumed, but CUDA works.
        let e = healthy_open_host().log(|l| l.resumed_after_uvm_load = true);
        let ok = process().cuinit(0, 0.3).opens(4);
        assert_eq!(run("stale_after_suspend", &e, &ok), None);
        // Log unreadable: low, and it says why.
        let blind = healthy_open_host().with(|e| {
            e.kernel_log = Fact::unavailable("Operation not permitted (os error 1)", "/dev/kmsg")
        });
        let f = run("stale_after_suspend", &blind, &o).expect("finding");
        assert_eq!(f.confidence, Confidence::Low);
        assert!(mentions(&f, "CAP_SYSLOG"));
    }

    // --- fabric_not_ready

    fn nvswitch_host() -> Evidence {
        healthy_open_host()
            .with(|e| {
                e.nvswitch_nodes = Fact::ok(
                    vec![
                        "/dev/nvidia-nvswitch0".into(),
                        "/dev/nvidia-nvswitch1".into(),
                    ],
                    "/dev/nvidia-nvswitch*",
                )
            })
            .smi(|s| {
                s.gpus = 8;
                s.fabric_state = vec!["In Progress".into(); 8];
            })
            .daemons(&["nvidia-persistenced"])
    }

    #[test]
    fn fabric_802_on_nvswitch() {
        let o = process().cuinit(802, 0.8).opens(10);
        let f = run("fabric_not_ready", &nvswitch_host(), &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-fabricmanager"));
        // Static: fabric not started and no manager.
        let f = run("fabric_not_ready", &nvswitch_host(), &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
    }

    #[test]
    fn fabric_not_without_nvswitch() {
        let o = process().cuinit(802, 0.8).opens(4);
        assert_eq!(run("fabric_not_ready", &healthy_open_host(), &o), None);
        // Fabric complete: ready, even where the manager is not seen (a container, or a
        // manager outside this PID namespace).
        let complete = nvswitch_host().smi(|s| s.fabric_state = vec!["Completed".into(); 8]);
        assert_eq!(run("fabric_not_ready", &complete, &plain()), None);
        // Older drivers print no Fabric section ("" per GPU): not NVSwitch evidence.
        let old = healthy_open_host().smi(|s| s.fabric_state = vec!["".into()]);
        assert_eq!(run("fabric_not_ready", &old, &o), None);
        // NVSwitch, fabric complete, manager running: fine.
        let ready = nvswitch_host()
            .smi(|s| s.fabric_state = vec!["Completed".into(); 8])
            .daemons(&["nv-fabricmanager"]);
        assert_eq!(run("fabric_not_ready", &ready, &plain()), None);
        assert_eq!(run("fabric_not_ready", &ready, &o), None);
        // 802 where nothing tells whether NVSwitch is there: low, and it says why.
        let blind = healthy_open_host()
            .with(|e| e.smi = Fact::unavailable("nvidia-smi not present", "nvidia-smi -q"));
        let f = run("fabric_not_ready", &blind, &o).expect("finding");
        assert_eq!(f.confidence, Confidence::Low);
        assert!(mentions(&f, "nvidia-smi not present"));
    }

    // --- version_mismatch

    fn lib(version: &str, path: &str, compat: bool) -> MappedLibcuda {
        MappedLibcuda {
            pid: 4242,
            comm: "python3".into(),
            path: path.into(),
            version: Some(version.into()),
            compat,
        }
    }

    #[test]
    fn mismatch_803_with_api_line() {
        let e = healthy_open_host().log(|l| {
            l.api_mismatch = Some(
                "NVRM: API mismatch: the client has the version 590.48.01, but this kernel \
                 module has the version 580.95.05."
                    .into(),
            )
        });
        let o = process().cuinit(803, 0.1).opens(1);
        let f = run("version_mismatch", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "sudo reboot"));
    }

    #[test]
    fn mismatch_from_mapped_library() {
        let e = healthy_open_host().libcuda(vec![lib(
            "580.95.05",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            false,
        )]);
        let f = run("version_mismatch", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        assert!(f.evidence.iter().any(|i| i.source == "/proc/4242/maps"));
    }

    #[test]
    fn compat_804_on_geforce() {
        let e = healthy_open_host()
            .smi(|s| s.product_brand = vec!["GeForce".into()])
            .libcuda(vec![lib(
                "595.45.04",
                "/usr/local/cuda-13.1/compat/libcuda.so.1",
                true,
            )]);
        let o = process().cuinit(804, 0.05).opens(2);
        let f = run("version_mismatch", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f
            .fix
            .iter()
            .any(|s| s.note.contains("forward-compatibility")));
    }

    #[test]
    fn mismatch_near_misses() {
        // Same version everywhere, error 3: not a mismatch.
        assert_eq!(
            run("version_mismatch", &motivating_host(), &incident()),
            None
        );
        // Forward compat newer than the driver on a data-center GPU: supported.
        let dc = healthy_open_host().libcuda(vec![lib(
            "595.45.04",
            "/usr/local/cuda-13.1/compat/libcuda.so.1",
            true,
        )]);
        assert_eq!(run("version_mismatch", &dc, &plain()), None);
    }

    // --- slow_init

    #[test]
    fn slow_init_with_persistence_off() {
        let e = healthy_open_host().smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        let o = process().cuinit(0, 9.5).opens(4);
        let f = run("slow_init", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Info, Confidence::Medium)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-persistenced"));
    }

    #[test]
    fn slow_init_only_when_cuinit_succeeded() {
        let e = healthy_open_host().smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        assert_eq!(
            run("slow_init", &e, &process().cuinit(0, 0.3).opens(4)),
            None
        );
        assert_eq!(
            run("slow_init", &e, &process().cuinit(3, 9.5).opens(4)),
            None
        );
        assert_eq!(run("slow_init", &e, &plain()), None);
    }

    // --- adapter_init_failure

    #[test]
    fn adapter_init_from_log() {
        let e = healthy_open_host().log(|l| {
            l.adapter_init_failed =
                vec!["NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)".into()]
        });
        let f = run("adapter_init_failure", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "/lib/firmware/nvidia/590.48.01/"));
    }

    #[test]
    fn adapter_init_from_eio() {
        let o = process()
            .cuinit(100, 3.2)
            .opens(1)
            .failed_open("/dev/nvidia1", "EIO");
        let f = run("adapter_init_failure", &healthy_open_host(), &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
    }

    #[test]
    fn adapter_init_from_own_open() {
        let e = healthy_open_host().with(|e| {
            if let Ok(n) = &mut e.dev_nodes.value {
                n[1].open = Some(Err("EIO".into()));
            }
        });
        let f = run("adapter_init_failure", &e, &plain()).expect("finding");
        assert_eq!(
            f.title,
            "/dev/nvidia0 returned EIO: the GPU did not initialize"
        );
        assert_eq!(f.evidence[0].source, "/dev/nvidia0");
    }

    #[test]
    fn adapter_not_for_application_xids() {
        let e = healthy_open_host().log(|l| l.xids = vec![13, 31, 43]);
        assert_eq!(run("adapter_init_failure", &e, &plain()), None);
    }

    // --- fork_after_init

    #[test]
    fn fork_after_init_fires() {
        let o = process().forked().cuinit(3, 0.00002);
        let f = run("fork_after_init", &healthy_open_host(), &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f.fix.iter().all(|s| s.where_ == Where::Container));
        // Error 3 in the child is not the HMM failure (no REGISTER_GPU failure).
        assert!(diagnose(&healthy_open_host(), &o)
            .iter()
            .all(|f| f.rule != "hmm_setup_failure"));
    }

    #[test]
    fn fork_near_misses() {
        let e = healthy_open_host();
        assert_eq!(
            run(
                "fork_after_init",
                &e,
                &process().forked().cuinit(3, 0.2).opens(3)
            ),
            None
        );
        assert_eq!(
            run("fork_after_init", &e, &process().cuinit(3, 0.00002)),
            None
        );
        assert_eq!(
            run(
                "fork_after_init",
                &e,
                &process().forked().cuinit(0, 0.2).opens(4)
            ),
            None
        );
    }

    // --- policy_or_partition

    #[test]
    fn exclusive_mode_46() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Exclusive_Process".into()]);
        let o = process().cuinit(46, 0.2).opens(4);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-smi -c DEFAULT"));
    }

    #[test]
    fn mig_without_instances_100() {
        let e = healthy_open_host().smi(|s| s.mig_mode = vec!["Enabled".into()]);
        let o = process().cuinit(100, 0.2).opens(3);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 100 with a missing node is the missing node, not MIG.
        let missing = process()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        assert_eq!(run("policy_or_partition", &e, &missing), None);
        // MIG on, nothing failing: a deliberate set-up.
        assert_eq!(run("policy_or_partition", &e, &plain()), None);
    }

    #[test]
    fn prohibited_compute_mode_static() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Prohibited".into()]);
        let f = run("policy_or_partition", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 46 with Default compute mode: not policy (memory pressure, other causes).
        let o = process().cuinit(46, 0.2).opens(4);
        assert_eq!(run("policy_or_partition", &healthy_open_host(), &o), None);
    }

    // --- diagnose

    #[test]
    fn diagnose_sorts_worst_first() {
        // A critical (stale allow-list) and a warning (HMM risk profile), static only.
        let e = motivating_host().container("lxc", Some(STALE_ALLOW));
        let got: Vec<(String, Severity)> = diagnose(&e, &plain())
            .into_iter()
            .map(|f| (f.rule, f.severity))
            .collect();
        assert_eq!(
            got,
            [
                ("device_permission".to_string(), Severity::Critical),
                ("hmm_setup_failure".to_string(), Severity::Warning),
            ]
        );
        // cuInit seen working silences both; a slow one is an info.
        let slow = process().cuinit(0, 12.0).opens(4);
        let e = e.smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        let got: Vec<String> = diagnose(&e, &slow).into_iter().map(|f| f.rule).collect();
        assert_eq!(got, ["slow_init"]);
    }
}

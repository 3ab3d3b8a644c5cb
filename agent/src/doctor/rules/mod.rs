//! Diagnosis rules: one per class of failure (the rules table of `docs/doctor.md`), and `no_gpu`
//! (the driver sees no GPU), a class met with NVIDIA's real driver beside them.
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
//!   `uvm_disable_hmm` and `uvm_debug_prints` module parameters;
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
//!   (`c 195:* rwm`);
//! * NVIDIA open-gpu-kernel-modules, `kernel-open/nvidia/nv.c` (`nvidia_init_module`: the
//!   driver loads without a GPU only where an NVSwitch is present, else fails with `-ENODEV`
//!   and says why) and `nv-procfs.c` (`/proc/driver/nvidia/gpus/<pci>/`, `ExcludedGpus` in
//!   `params`).
//!
//! One file per rule (`hmm_setup_failure.rs`, `driver_hang.rs`, ...) holds its `check` and
//! its tests; this module holds the registry ([`RULES`]), [`diagnose`] and its ranking, and
//! the helpers several rules share (reading the evidence, building findings).

mod adapter_init_failure;
mod device_permission;
mod driver_hang;
mod fabric_not_ready;
#[cfg(test)]
mod finding_checks;
mod fork_after_init;
mod hmm_setup_failure;
mod module_refused;
mod no_gpu;
mod node_or_module_missing;
mod policy_or_partition;
mod slow_init;
mod stale_after_suspend;
mod version_mismatch;
mod wsl2;

pub use hmm_setup_failure::HMM_CONF;
pub use policy_or_partition::device_count_disagrees;
pub use slow_init::{SLOW_FIRST_OPEN_SECONDS, SLOW_INIT_BASE_SECONDS};

use super::facts::{DriverInfo, Evidence, Fact, KernelLog, Observations, SeenCall, SmiInfo};
use super::finding::{Basis, Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use crate::decode::nvidia::cu_result_name;

/// One diagnosis rule.
pub struct Rule {
    /// Rule id, snake case; also the runbook name (`docs/runbooks/<id>.md`).
    pub id: &'static str,
    /// What the class is, for listings (a finding carries a more specific title).
    pub title: &'static str,
    /// The check: a finding when the class applies, `None` otherwise.
    pub check: fn(&Evidence, &Observations) -> Option<Finding>,
    /// The one command whose output confirms this class or rules it out, set on its
    /// findings short of high confidence ([`Finding::tell_apart`]): when several causes fit,
    /// the report lists them most likely first, each with what tells it apart.
    pub tell_apart: &'static str,
    /// Rules whose finding already explains what this one would say: when one of them fires
    /// on what the probes saw ([`Basis::Observed`]), this one's finding is left out
    /// ([`diagnose`]). A slow successful start is no second finding beside the driver hang
    /// the probes saw it stuck in.
    pub yields_to: &'static [&'static str],
    /// When, on this host, the finding yields to those of [`Rule::yields_to`]: only where
    /// the stronger cause accounts for all of it ([`always`] for most rules).
    pub yield_when: fn(&Evidence) -> bool,
}

/// [`Rule::yield_when`] of a rule whose finding always yields to its stronger ones.
fn always(_: &Evidence) -> bool {
    true
}

/// Every rule, in the order of the rules table of `docs/doctor.md`, with `no_gpu` before
/// `node_or_module_missing` (it says why a driver or node is missing). On equal severity and
/// confidence, [`diagnose`] keeps this order, so the more specific rule of two (HMM set-up
/// before a generic driver hang) comes first.
pub const RULES: &[Rule] = &[
    Rule {
        id: "hmm_setup_failure",
        title: "nvidia_uvm HMM set-up fails or hangs on this kernel",
        check: hmm_setup_failure::check,
        tell_apart: "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm uvm_disable_hmm=1, then start the failing program again: it starts now if HMM set-up was the cause (reload without the parameter to undo)",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "driver_hang",
        title: "a thread is stuck inside the NVIDIA driver",
        check: driver_hang::check,
        tell_apart: "sudo cat /proc/<pid>/task/<tid>/stack: frames in uvm_* or nv_* functions mean the driver holds the thread",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "module_refused",
        title: "the kernel refused the nvidia module (signature, another kernel's build)",
        check: module_refused::check,
        tell_apart: "sudo modprobe nvidia; sudo dmesg | tail -n 5 && mokutil --sb-state: the kernel's own reason for refusing it",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "no_gpu",
        title: "the NVIDIA driver sees no GPU",
        check: no_gpu::check,
        tell_apart: "lspci -nnk -d 10de:: each NVIDIA GPU and the kernel driver in use for it (nvidia, vfio-pci, nouveau or none)",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "wsl2",
        title: "CUDA on WSL2: the Windows driver's GPU not reachable",
        check: wsl2::check,
        tell_apart: "/usr/lib/wsl/lib/nvidia-smi -L && ldconfig -p | grep libcuda: the GPU through WSL's own tools, and only WSL's libcuda found",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "node_or_module_missing",
        title: "nvidia_uvm not loaded or an NVIDIA device node missing",
        check: node_or_module_missing::check,
        tell_apart: "lsmod | grep -E '^nvidia(_uvm)? ' && ls -l /dev/nvidia*: the modules loaded and the nodes there (inside the container for a container)",
        yields_to: &["module_refused", "no_gpu"],
        yield_when: node_or_module_missing::explained_by_an_absent_driver,
    },
    Rule {
        id: "device_permission",
        title: "NVIDIA device node present but access denied",
        check: device_permission::check,
        tell_apart: "ls -l /dev/nvidia* && id: each node's owner and mode against your user and groups (in a cgroup v1 container also cat /sys/fs/cgroup/devices/devices.list)",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "stale_after_suspend",
        title: "driver state broken by suspend/resume",
        check: stale_after_suspend::check,
        tell_apart: "journalctl -k -b | grep -E 'nvidia-uvm: Loaded|PM: suspend exit': a resume after nvidia_uvm was loaded",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "fabric_not_ready",
        title: "NVSwitch fabric not ready (Fabric Manager)",
        check: fabric_not_ready::check,
        tell_apart: "nvidia-smi -q | grep -A3 Fabric: State Completed with Status Success once Fabric Manager has registered the GPU",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "version_mismatch",
        title: "user-space driver library and kernel module differ",
        check: version_mismatch::check,
        tell_apart: "cat /proc/driver/nvidia/version && ls -l /usr/lib/x86_64-linux-gnu/libcuda.so.*: the kernel module's version against the library's",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "slow_init",
        title: "cuInit succeeds but takes seconds",
        check: slow_init::check,
        tell_apart: "nvidia-smi -q | grep 'Persistence Mode' && time nvidia-smi -L: persistence off and a slow first call",
        yields_to: &["driver_hang"],
        yield_when: always,
    },
    Rule {
        id: "adapter_init_failure",
        title: "a GPU fails to initialize in the kernel",
        check: adapter_init_failure::check,
        tell_apart: "sudo dmesg | grep -E 'RmInitAdapter|Xid': the GPU that did not come up and the driver's reason",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "fork_after_init",
        title: "CUDA used in a child forked after cuInit",
        check: fork_after_init::check,
        tell_apart: "strace -f -e trace=clone,clone3,fork,vfork,execve <program>: a child cloned without execve after the parent's cuInit",
        yields_to: &[],
        yield_when: always,
    },
    Rule {
        id: "policy_or_partition",
        title: "compute mode or MIG refuses the work",
        check: policy_or_partition::check,
        tell_apart: "nvidia-smi --query-gpu=index,compute_mode,mig.mode.current --format=csv and echo $CUDA_VISIBLE_DEVICES",
        yields_to: &[],
        yield_when: always,
    },
];

/// Runs every rule and returns the findings, each with its [`Basis`], worst first
/// ([`rank`]), without those of rules that yield to another that fired on the observations
/// ([`Rule::yields_to`]).
pub fn diagnose(e: &Evidence, o: &Observations) -> Vec<Finding> {
    let mut findings: Vec<Finding> = RULES
        .iter()
        .filter_map(|r| (r.check)(e, o).map(|f| with_tell_apart(f, r)))
        .map(settle_basis)
        .collect();
    let fired: Vec<String> = findings
        .iter()
        .filter(|f| f.basis == Basis::Observed)
        .map(|f| f.rule.clone())
        .collect();
    findings.retain(|f| {
        RULES.iter().find(|r| r.id == f.rule).is_none_or(|r| {
            !((r.yield_when)(e) && r.yields_to.iter().any(|y| fired.iter().any(|id| id == y)))
        })
    });
    rank(&mut findings);
    findings
}

/// Sets [`Finding::tell_apart`] from the rule's command when the finding is short of high
/// confidence and its rule did not set a more specific one.
fn with_tell_apart(mut f: Finding, r: &Rule) -> Finding {
    if f.confidence < Confidence::High && f.tell_apart.is_none() && !r.tell_apart.is_empty() {
        f.tell_apart = Some(r.tell_apart.to_string());
    }
    f
}

/// Sorts findings worst first: by severity, then what they rest on (an observed finding
/// before a static one: a failure the probes saw outranks a risk read from the host's state),
/// then confidence, then [`RULES`] order (the sort is stable).
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.basis.cmp(&a.basis))
            .then(b.confidence.cmp(&a.confidence))
    });
}

/// Sets what a finding rests on from its evidence: [`Basis::Observed`] when an item came
/// from the probes (a `probe:` source), [`Basis::Static`] otherwise. Rules cite a probe's
/// item only when it supports the finding (a `cuInit` code the class gives, the failing or
/// stuck call, the opens), so this is the rule's own judgement of what it explains.
pub fn settle_basis(mut f: Finding) -> Finding {
    f.basis = if f.evidence.iter().any(|i| is_probe_source(&i.source)) {
        Basis::Observed
    } else {
        Basis::Static
    };
    f
}

/// A source label of what the probes saw (`probe:cuInit`, `probe:ioctl`, ...).
pub fn is_probe_source(source: &str) -> bool {
    source.starts_with("probe:")
}

/// Why no NVIDIA driver is present at all, when that is so: no `/proc/driver/nvidia/version`,
/// no `nvidia` module in `/proc/modules` and no `/dev/nvidia*` node. `None` when any trace of
/// the driver exists (or when it cannot be told).
pub fn no_driver(e: &Evidence) -> Option<String> {
    // On WSL2 the driver is the Windows host's ([`wsl2`]).
    if wsl2(e) {
        return None;
    }
    let why = match &e.driver.value {
        Ok(_) => return None,
        Err(u) => u.why.clone(),
    };
    if nvidia_in_modules(e) {
        return None;
    }
    if e.dev_nodes.get().is_some_and(|n| !n.is_empty()) {
        return None;
    }
    Some(format!("{}: {}", e.driver.source, why))
}

/// `nvidia` is among the loaded modules (`/proc/modules`).
fn nvidia_in_modules(e: &Evidence) -> bool {
    e.modules
        .get()
        .is_some_and(|m| m.iter().any(|n| n == "nvidia"))
}

/// The nvidia module is loaded: its version file is there, or `/proc/modules` lists it.
fn nvidia_loaded(e: &Evidence) -> bool {
    driver(e).is_some() || nvidia_in_modules(e)
}

// ---------------------------------------------------------------------------------------
// Constants several rules use

/// `CUresult` codes (`cuda.h`).
mod cu {
    pub const SUCCESS: i64 = 0;
    pub const NOT_INITIALIZED: i64 = 3;
    pub const DEVICE_UNAVAILABLE: i64 = 46;
    pub const NO_DEVICE: i64 = 100;
    pub const INVALID_DEVICE: i64 = 101;
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

/// A failing `cuInit` that returns within this many seconds "returned quickly".
const QUICK_SECONDS: f64 = 1.0;

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
        || o.context_result.is_some()
}

/// Whether this is WSL2: `/dev/dxg` or WSL's libraries are there, or the kernel is
/// Microsoft's WSL2 kernel (`5.15.153.1-microsoft-standard-WSL2`).
pub fn wsl2(e: &Evidence) -> bool {
    e.wsl.get().is_some_and(|w| w.dxg || !w.libcuda.is_empty())
        || e.kernel
            .get()
            .is_some_and(|k| k.release.contains("microsoft-standard-WSL2"))
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
pub fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

// ---------------------------------------------------------------------------------------
// Building findings

fn finding(rule: &str, severity: Severity, confidence: Confidence, title: String) -> Finding {
    Finding {
        rule: rule.to_string(),
        title,
        severity,
        confidence,
        basis: Basis::Static,
        evidence: Vec::new(),
        unchecked: Vec::new(),
        fix: Vec::new(),
        runbook: format!("docs/runbooks/{rule}.md"),
        tell_apart: None,
    }
}

fn item(what: &str, value: impl Into<String>, source: impl Into<String>) -> EvidenceItem {
    EvidenceItem {
        what: what.to_string(),
        value: value.into(),
        source: source.into(),
    }
}

/// An item that argues against the finding (it lowers the confidence): its value starts with
/// `against: `, so that no reader takes it for support.
fn against(what: &str, value: impl AsRef<str>, source: impl Into<String>) -> EvidenceItem {
    item(what, format!("{AGAINST}{}", value.as_ref()), source)
}

/// How the value of an item that argues against a finding starts.
pub const AGAINST: &str = "against: ";

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

#[cfg(test)]
mod tests {
    use super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn rules_are_one_per_class() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        assert_eq!(
            ids,
            [
                "hmm_setup_failure",
                "driver_hang",
                "module_refused",
                "no_gpu",
                "wsl2",
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

    /// Each rule of [`RULES`] has its file, `rules/<id>.rs`, whose tests all start with its
    /// id, a positive case and near misses among them: a new rule fails this until it has
    /// them.
    #[test]
    fn every_rule_has_its_file_with_its_tests() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/doctor/rules");
        for r in RULES {
            let path = dir.join(format!("{}.rs", r.id));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let tests = text.matches("#[test]\n    fn ").count();
            let named = text.matches(&format!("#[test]\n    fn {}_", r.id)).count();
            assert!(tests >= 2, "{}: {tests} test(s)", path.display());
            assert_eq!(
                named,
                tests,
                "{}: a test not named {}_...",
                path.display(),
                r.id
            );
        }
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

    /// A start the probes saw stuck in the driver, then return 0 after 40 s: the hang is the
    /// finding, not a slow start beside it; near miss: the same slow start without a stuck
    /// call is `slow_init`.
    #[test]
    fn a_slow_start_yields_to_the_hang_it_was_stuck_in() {
        let e = healthy_open_host();
        let stuck = watched().cuinit(0, 40.0).opens(4).stuck(
            "UVM_REGISTER_GPU",
            "/dev/nvidia-uvm",
            38.0,
            "D (disk sleep)",
        );
        let rules: Vec<String> = diagnose(&e, &stuck).into_iter().map(|f| f.rule).collect();
        assert!(rules.contains(&"driver_hang".to_string()), "{rules:?}");
        assert!(!rules.contains(&"slow_init".to_string()), "{rules:?}");
        let slow = watched().cuinit(0, 40.0).opens(4);
        let rules: Vec<String> = diagnose(&e, &slow).into_iter().map(|f| f.rule).collect();
        assert_eq!(rules, ["slow_init"]);
    }

    #[test]
    fn healthy_hosts_have_no_findings() {
        assert_eq!(diagnose(&healthy_open_host(), &plain()), vec![]);
        let ok = watched().cuinit(0, 0.31).opens(4);
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
        let slow = watched().cuinit(0, 12.0).opens(4);
        let e = e.smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        let got: Vec<String> = diagnose(&e, &slow).into_iter().map(|f| f.rule).collect();
        assert_eq!(got, ["slow_init"]);
    }

    #[test]
    fn rank_puts_observed_before_static_at_equal_severity() {
        let f = |rule: &str, severity, confidence, basis| Finding {
            basis,
            ..finding(rule, severity, confidence, rule.to_string())
        };
        let mut fs = vec![
            f("a", Severity::Critical, Confidence::High, Basis::Static),
            f("b", Severity::Warning, Confidence::High, Basis::Static),
            f("c", Severity::Critical, Confidence::Low, Basis::Observed),
            f("d", Severity::Warning, Confidence::Medium, Basis::Observed),
            f("e", Severity::Critical, Confidence::High, Basis::Observed),
        ];
        rank(&mut fs);
        let got: Vec<&str> = fs.iter().map(|f| f.rule.as_str()).collect();
        // Severity first; then what was seen, before confidence.
        assert_eq!(got, ["e", "c", "a", "d", "b"]);
    }

    #[test]
    fn diagnose_keeps_a_static_risk_apart_from_an_observed_failure_another_rule_explains() {
        // EPERM on the UVM node, seen by the probes, on the HMM-risk host: the denial is the
        // observed cause; the HMM risk stays a static warning that cites nothing the probes saw.
        let o = watched()
            .cuinit(999, 0.02)
            .opens(2)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        let fs = diagnose(&motivating_host(), &o);
        assert_eq!(fs[0].rule, "device_permission", "{fs:#?}");
        assert_eq!(fs[0].basis, Basis::Observed);
        let hmm = fs
            .iter()
            .find(|f| f.rule == "hmm_setup_failure")
            .expect("the static risk");
        assert_eq!(
            (hmm.severity, hmm.basis),
            (Severity::Warning, Basis::Static)
        );
        assert!(hmm.evidence.iter().all(|i| !is_probe_source(&i.source)));
        // Every finding is well formed: no absent fact cited as support.
        for f in &fs {
            well_formed(f, &f.rule);
        }
    }

    #[test]
    fn cites_an_absent_fact_knows_absent_from_against_and_words() {
        for v in [
            "None",
            "N/A",
            "HMM, None",
            "CONFIG_X=not set",
            "unknown",
            "",
        ] {
            assert!(cites_an_absent_fact(v), "{v:?}");
        }
        for v in [
            "against: None, None: no GPU uses HMM",
            "HMM, HMM",
            "not running",
            "/dev/nvidia-uvm absent",
        ] {
            assert!(!cites_an_absent_fact(v), "{v:?}");
        }
    }

    #[test]
    fn healthy_default_snapshot_plain_doctor_has_no_critical_finding() {
        let fs = diagnose_spec(&SnapshotSpec::default(), &plain());
        assert!(
            fs.iter().all(|f| f.severity != Severity::Critical),
            "{fs:#?}"
        );
        // Nothing at all, in fact: HMM memory is set up, fabric complete, persistence on.
        assert_eq!(rules_of(&fs), Vec::<&str>::new());
    }

    #[test]
    fn healthy_default_snapshot_with_a_working_cuinit_has_no_finding() {
        let fs = diagnose_spec(
            &SnapshotSpec::default(),
            &watched().cuinit(0, 0.31).opens(5),
        );
        assert_eq!(rules_of(&fs), Vec::<&str>::new());
    }
}

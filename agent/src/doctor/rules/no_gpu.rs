//! Rule `no_gpu`: the NVIDIA driver sees no GPU, loaded or refusing to load (one row of the rules
//! table in `docs/doctor.md`, a class beside the eleven others, seen with NVIDIA's real driver on
//! machines without a GPU); [`check`] says when it applies, and its tests go from evidence built in
//! code to snapshot trees read back by the collectors, those of real hosts among them
//! (`uvmwatch_testbed::snapshot::gpuless`).
//!
//! Over 800 lines, half of them tests: the rule reads three independent sources (the
//! driver's GPU list, `nvidia-smi`, the kernel log of a driver that refused to load), and
//! each needs its healthy and unreadable cases beside the real GPU-less hosts.

use super::super::collect::smi::SMI_AMBIGUOUS_NO_GPU;
use super::super::facts::{Evidence, Observations, SmiOutcome, SmiVerdict};
use super::super::finding::{Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use super::{
    against, call_text, container_kind, cu, cuinit_is, driver, finding, host_only_note,
    is_gpu_node, item, klog, nvidia_loaded, push_cuinit, step, unknown, SRC_CUINIT, SRC_IOCTL,
    SRC_OPENAT,
};

/// Errnos of an open of a GPU node that has no GPU behind it.
const NO_GPU_ERRNOS: &[&str] = &["ENOENT", "ENXIO", "ENODEV"];

/// Which way the driver sees no GPU, each with its title and fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    /// Loaded, and `/proc/driver/nvidia/gpus/` is empty: it registered no GPU at all.
    NoneRegistered,
    /// Loaded with GPUs on the host, none of them in this container.
    NotInContainer,
    /// Loaded with GPUs registered, but NVML finds none and no GPU node exists (excluded, or
    /// none came up).
    NoneUsable,
    /// Loaded; `nvidia-smi` finds no GPU and no GPU node exists; the driver's own list of
    /// GPUs could not be read.
    NvmlOnly,
    /// Not loaded: it refused to load for want of a GPU (`NVRM: No NVIDIA GPU found.`).
    RefusedNoDevice,
    /// Not loaded: another driver holds the GPUs (probe routine not called, none probed).
    RefusedTaken,
    /// Not loaded: GPUs were probed and none initialized (the lines before say why).
    RefusedFailed,
}

/// No GPU: the driver is loaded and sees no GPU (`/proc/driver/nvidia/gpus/` empty, or
/// `nvidia-smi` reports none, and no `/dev/nvidia<N>` where `/dev` can be read), or it is not
/// loaded and the kernel log has its own words for why: no GPU to drive
/// ([`KernelLog::no_gpu`](crate::doctor::facts::KernelLog::no_gpu)). CUDA cannot start
/// either way: `cuInit` returns 100 or, with the driver loaded GPU-less, 999 (535.261.03 and
/// 550.163.01: one `NV_ESC_RM_CONTROL` on `/dev/nvidiactl` fails with
/// `NV_ERR_INVALID_LOCK_STATE`). Observed: such a `cuInit`, its failed call, and opens of
/// GPU nodes that are not there, on such a host.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    let loaded = nvidia_loaded(e);
    let mut f = if loaded {
        loaded_without_gpu(e)?
    } else {
        refused(e, o)?
    };
    push_observed(&mut f, o);
    Some(f)
}

/// The finding for a loaded driver that sees no GPU, without what the probes saw.
fn loaded_without_gpu(e: &Evidence) -> Option<Finding> {
    // NVML lists GPUs in this namespace: whatever the rest says, there is one.
    if e.smi.get().is_some_and(|s| s.gpus > 0) {
        return None;
    }
    let registered = e.gpus.get();
    let smi_no_gpu = e
        .smi_outcome
        .get()
        .filter(|s| s.verdict == SmiVerdict::NoGpu);
    let ambiguous = smi_no_gpu
        .and_then(|s| s.message.as_deref())
        .is_some_and(|m| m.contains(SMI_AMBIGUOUS_NO_GPU));
    let gpu_nodes: Option<Vec<&str>> = e.dev_nodes.get().map(|nodes| {
        nodes
            .iter()
            .filter(|n| is_gpu_node(&n.path))
            .map(|n| n.path.as_str())
            .collect()
    });
    let no_gpu_nodes = gpu_nodes.as_ref().map(|n| n.is_empty());
    let container = container_kind(e);

    let holder = held_elsewhere(e);
    let (sub, confidence) = match registered {
        Some(g) if g.is_empty() => (
            Sub::NoneRegistered,
            // Nodes left from an earlier load (they outlive the driver) or made by hand;
            // a GPU seen held by another driver settles it.
            if no_gpu_nodes == Some(false) && holder.is_none() {
                Confidence::Medium
            } else {
                Confidence::High
            },
        ),
        // The driver has GPUs; NVML sees none here and there is no GPU node.
        Some(_) if smi_no_gpu.is_some() && no_gpu_nodes == Some(true) => match container {
            Some(_) if ambiguous => (Sub::NotInContainer, Confidence::Medium),
            Some(_) => (Sub::NotInContainer, Confidence::High),
            None if ambiguous => (Sub::NoneUsable, Confidence::Low),
            None => (Sub::NoneUsable, Confidence::Medium),
        },
        // A container with no NVIDIA node at all while the host's driver has GPUs, and
        // nvidia-smi not listing any here (not captured, or none): started without a GPU.
        Some(_)
            if container.is_some()
                && e.dev_nodes.get().is_some_and(|n| n.is_empty())
                && e.smi.get().is_none() =>
        {
            (Sub::NotInContainer, Confidence::Medium)
        }
        Some(_) => return None,
        // The driver's list is unknown (a snapshot taken without it): NVML alone.
        None if smi_no_gpu.is_none() => return None,
        None => match (ambiguous, no_gpu_nodes) {
            (false, Some(true)) => (Sub::NvmlOnly, Confidence::Medium),
            (false, None) | (true, Some(true)) => (Sub::NvmlOnly, Confidence::Low),
            _ => return None,
        },
    };

    let d = driver(e);
    let version = d.map(|d| format!("{} ", d.version)).unwrap_or_default();
    let switches: Vec<String> = e.nvswitch_nodes.get().cloned().unwrap_or_default();
    let count = registered.map(|g| g.len()).unwrap_or(0);
    let title = match sub {
        Sub::NoneRegistered if !switches.is_empty() => format!(
            "the NVIDIA driver {version}is loaded with NVSwitches but no GPU: CUDA cannot start \
             on an NVSwitch-only node"
        ),
        Sub::NoneRegistered => match &holder {
            Some((addr, drv)) => format!(
                "the NVIDIA driver {version}is loaded but sees no GPU: GPU {addr} is bound to \
                 {drv}: CUDA cannot start"
            ),
            None => {
                format!("the NVIDIA driver {version}is loaded but sees no GPU: CUDA cannot start")
            }
        },
        Sub::NotInContainer => format!(
            "the host's NVIDIA driver has {count} GPU(s), but none was given to this container \
             ({}): CUDA cannot start",
            container.unwrap_or("container")
        ),
        Sub::NoneUsable => format!(
            "the NVIDIA driver registered {count} GPU(s), but nvidia-smi finds none and there \
             is no /dev/nvidia<N>: CUDA cannot start"
        ),
        _ => {
            "nvidia-smi finds no GPU and there is no /dev/nvidia<N>: CUDA cannot start".to_string()
        }
    };
    let mut f = finding("no_gpu", Severity::Critical, confidence, title);
    if let Some(d) = d {
        let flavor = if d.open_module { "open" } else { "proprietary" };
        f.evidence.push(item(
            "driver",
            format!("{} {flavor} kernel module, loaded", d.version),
            e.driver.source.clone(),
        ));
    }
    match registered {
        Some(g) if g.is_empty() => f.evidence.push(item(
            "GPUs registered",
            "empty: the driver registered no GPU",
            e.gpus.source.clone(),
        )),
        Some(g) => f.evidence.push(item(
            "GPUs registered",
            format!("{} (the host's, procfs is global)", g.join(", ")),
            e.gpus.source.clone(),
        )),
        None => {}
    }
    if let Some(s) = smi_no_gpu {
        f.evidence.push(item(
            "nvidia-smi",
            smi_text(s, ambiguous),
            e.smi_outcome.source.clone(),
        ));
    }
    match (no_gpu_nodes, &gpu_nodes) {
        (Some(true), _) => f.evidence.push(item(
            "GPU nodes",
            "absent: no /dev/nvidia<N>",
            e.dev_nodes.source.clone(),
        )),
        (Some(false), Some(n)) => f.evidence.push(against(
            "GPU nodes",
            format!(
                "{} exist (left from an earlier load or made by hand; no GPU is registered \
                 behind them)",
                n.join(", ")
            ),
            e.dev_nodes.source.clone(),
        )),
        _ => {}
    }
    if !switches.is_empty() {
        f.evidence.push(item(
            "NVSwitch nodes",
            format!(
                "{}: NVSwitches without a GPU (an NVSwitch-only node, e.g. one that only runs \
                 Fabric Manager): CUDA cannot start here either",
                switches.join(", ")
            ),
            e.nvswitch_nodes.source.clone(),
        ));
    }
    f.evidence.extend(excluded_gpus(e));
    if let Some(kind) = container {
        f.evidence
            .push(item("runs in", kind, e.container.source.clone()));
    }
    f.unchecked.extend(
        [
            unknown(&e.gpus, "GPUs the driver registered"),
            unknown(&e.smi_outcome, "what nvidia-smi says"),
            unknown(&e.dev_nodes, "GPU device nodes"),
            unknown(&e.driver_params, "NVreg_ExcludedGpus (driver parameters)"),
        ]
        .into_iter()
        .flatten(),
    );
    push_pci(&mut f, e);
    if let Some(kind) = container {
        f.unchecked.push(format!(
            "which GPUs the host has and gives to containers: this is a container ({kind}); \
             ask the host (lspci, the container runtime's configuration)"
        ));
    }
    f.fix = fix(e, sub, !switches.is_empty());
    Some(f)
}

/// The first NVIDIA GPU on the PCI bus bound to another kernel driver than `nvidia`
/// (`vfio-pci`, `nouveau`): `(address, driver)`.
fn held_elsewhere(e: &Evidence) -> Option<(String, String)> {
    e.pci_gpus.get()?.iter().find_map(|g| {
        g.driver
            .as_deref()
            .filter(|d| *d != "nvidia")
            .map(|d| (g.address.clone(), d.to_string()))
    })
}

/// What the PCI bus says: each NVIDIA GPU and the driver bound to it, none on the bus, or
/// that it could not be read.
fn push_pci(f: &mut Finding, e: &Evidence) {
    let src = e.pci_gpus.source.clone();
    match e.pci_gpus.get() {
        Some(gpus) if gpus.is_empty() => f.evidence.push(item(
            "PCI bus",
            "no NVIDIA GPU on it (vendor 10de, display class)",
            src,
        )),
        Some(gpus) => {
            for g in gpus.iter().take(8) {
                let drv = g.driver.as_deref().unwrap_or("none");
                f.evidence.push(item(
                    "GPU on the PCI bus",
                    format!("{} (class {}), kernel driver: {drv}", g.address, g.class),
                    src.clone(),
                ));
            }
        }
        None => f.unchecked.extend(unknown(&e.pci_gpus, PCI_UNCHECKED)),
    }
}

/// The finding for a driver that refused to load for want of a GPU, without what the probes
/// saw: the kernel log's own lines after the last load.
fn refused(e: &Evidence, o: &Observations) -> Option<Finding> {
    let lines = klog(e).map(|l| l.no_gpu.as_slice()).unwrap_or(&[]);
    let pci_holder = held_elsewhere(e);
    // Without the driver's own lines, a GPU held by another driver explains a CUDA failure
    // seen, or NVIDIA's tools finding no driver (a host that just has no NVIDIA driver
    // wanted is no finding).
    let failed = o.cuinit_result.is_some_and(|r| r != cu::SUCCESS)
        || !o.failed_opens.is_empty()
        || e.smi_outcome
            .get()
            .is_some_and(|s| s.verdict == SmiVerdict::NoDriver);
    if lines.is_empty() && !(failed && pci_holder.is_some()) {
        return None;
    }
    let has = |p: &str| lines.iter().any(|l| l.contains(p));
    let holder = lines
        .iter()
        .find_map(|l| bound_to(l))
        .or(pci_holder.map(|(addr, drv)| format!("{drv} (GPU {addr})")));
    let sub = if has("No NVIDIA GPU found") {
        Sub::RefusedNoDevice
    } else if holder.is_some() || has("probe routine was not called") || has("devices probed") {
        Sub::RefusedTaken
    } else {
        Sub::RefusedFailed
    };
    let title = match sub {
        Sub::RefusedNoDevice => {
            "the NVIDIA driver refused to load: it found no NVIDIA GPU (NVRM: No NVIDIA GPU \
             found.)"
                .to_string()
        }
        Sub::RefusedTaken => match &holder {
            Some(h) => format!("the NVIDIA driver refused to load: {h} holds the GPU"),
            None => "the NVIDIA driver refused to load: another driver holds the GPU".to_string(),
        },
        _ => "the NVIDIA driver refused to load: none of its GPUs initialized".to_string(),
    };
    let mut f = finding("no_gpu", Severity::Critical, Confidence::High, title);
    for l in lines.iter().take(4) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    f.evidence.push(item(
        "driver",
        "not loaded: no /proc/driver/nvidia/version",
        e.driver.source.clone(),
    ));
    if let Some(s) = e
        .smi_outcome
        .get()
        .filter(|s| s.verdict == SmiVerdict::NoDriver)
    {
        f.evidence.push(item(
            "nvidia-smi",
            smi_text(s, false),
            e.smi_outcome.source.clone(),
        ));
    }
    if let Some(kind) = container_kind(e) {
        f.evidence
            .push(item("runs in", kind, e.container.source.clone()));
    }
    push_pci(&mut f, e);
    if sub == Sub::RefusedFailed {
        f.unchecked.push(
            "why each GPU failed its probe: the lines just before these in the kernel log say \
             it (not supported by this driver, fallen off the bus, an invalid BAR)"
                .to_string(),
        );
    }
    f.fix = fix(e, sub, false);
    Some(f)
}

/// What the probes saw that this host explains: `cuInit` 999 or 100, its failed driver
/// call, and failed opens of GPU nodes that have no GPU behind them.
fn push_observed(f: &mut Finding, o: &Observations) {
    if cuinit_is(o, &[cu::UNKNOWN, cu::NO_DEVICE]) {
        push_cuinit(f, o);
        if let Some(c) = &o.failed_call {
            f.evidence
                .push(item("failed driver call", call_text(c), SRC_IOCTL));
        }
    }
    for (path, err) in &o.failed_opens {
        if is_gpu_node(path) && NO_GPU_ERRNOS.contains(&err.as_str()) {
            f.evidence
                .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
        }
    }
    // The observed items first, as the other rules list them.
    f.evidence.sort_by_key(|i| !i.source.starts_with("probe:"));
    if f.evidence.iter().any(|i| i.source == SRC_CUINIT) {
        f.title = format!(
            "cuInit returned {}: {}",
            o.cuinit_result.unwrap_or_default(),
            f.title
        );
    }
}

/// `Failed to initialize NVML: No supported GPUs were found (exit status 255)`.
fn smi_text(s: &SmiOutcome, ambiguous: bool) -> String {
    let mut out = s
        .message
        .clone()
        .unwrap_or_else(|| s.verdict.as_str().to_string());
    if let Some(status) = &s.status {
        out.push_str(&format!(" ({status})"));
    }
    if ambiguous {
        out.push_str("; what NVML 535 says without a GPU, and also when device access is denied");
    }
    out
}

/// `vfio-pci` of `NVRM: GPU 0000:01:00.0 is already bound to vfio-pci.`.
fn bound_to(line: &str) -> Option<String> {
    let rest = &line[line.find("is already bound to ")? + "is already bound to ".len()..];
    let name = rest.trim().trim_end_matches('.');
    (!name.is_empty()).then(|| name.to_string())
}

/// `NVreg_ExcludedGpus` (or the older `GpuBlacklist`) when it names GPUs.
fn excluded_gpus(e: &Evidence) -> Vec<EvidenceItem> {
    let Some(params) = e.driver_params.get() else {
        return Vec::new();
    };
    ["ExcludedGpus", "GpuBlacklist"]
        .iter()
        .filter_map(|k| {
            let v = params.get(*k)?;
            let bare = v.trim_matches('"');
            (!bare.trim().is_empty()).then(|| {
                item(
                    k,
                    format!("{v}: GPUs the driver was told to leave alone"),
                    e.driver_params.source.clone(),
                )
            })
        })
        .collect()
}

/// What the rule could not see: the PCI bus.
const PCI_UNCHECKED: &str = "the PCI bus: which NVIDIA devices are on it and which kernel \
     driver holds each (lspci in the fix)";

/// The fix of each way the driver sees no GPU.
fn fix(e: &Evidence, sub: Sub, nvswitch: bool) -> Vec<FixStep> {
    let host = host_only_note(e);
    let refused = matches!(
        sub,
        Sub::RefusedNoDevice | Sub::RefusedTaken | Sub::RefusedFailed
    );
    let container = container_kind(e).is_some() || sub == Sub::NotInContainer;
    let mut steps = Vec::new();
    if container {
        steps.push(step(
            Where::Host,
            "Give the container the GPU: with the NVIDIA Container Toolkit, `--gpus all` (or \
             `--gpus device=<index or UUID>`), the nvidia runtime or CDI; in Kubernetes, \
             request nvidia.com/gpu in the pod's resources. Then recreate the container.",
            &[
                "docker run --gpus all <image> nvidia-smi -L",
                "nvidia-ctk cdi list",
            ],
        ));
        steps.push(step(
            Where::Container,
            "Verify inside the container: a /dev/nvidia<N> per GPU given, and the devices the \
             runtime was asked for.",
            &["ls -l /dev/nvidia*", "echo $NVIDIA_VISIBLE_DEVICES"],
        ));
    }
    steps.push(step(
        Where::Host,
        format!(
            "Check that the GPU is on this machine's PCI bus (vendor 10de). No line: it is not \
             there. In a VM, pass the GPU through to it (PCI passthrough on the hypervisor: \
             vfio-pci there, a hostdev/hostpci entry for this VM); on bare metal, check \
             seating, power and the BIOS; a GPU that fell off the bus comes back only after a \
             reboot.{host}"
        ),
        &["lspci -nn -d 10de:"],
    ));
    steps.push(step(
        Where::Host,
        format!(
            "See which kernel driver holds each NVIDIA device: `Kernel driver in use: nvidia` \
             is right; vfio-pci (kept for passthrough by vfio-pci.ids= on the kernel command \
             line or in /etc/modprobe.d) or nouveau (blacklist it and rebuild the initramfs) \
             keeps it from the NVIDIA driver.{host}"
        ),
        &[
            "lspci -k -d 10de:",
            "grep -sE 'vfio|nouveau' /proc/cmdline /etc/modprobe.d/*.conf",
        ],
    ));
    let excluded = match e.driver_params.get().and_then(|p| p.get("ExcludedGpus")) {
        Some(v) => format!(" (here ExcludedGpus: {v})"),
        None if refused => " (readable once the driver is loaded)".to_string(),
        None => String::new(),
    };
    steps.push(step(
        Where::Host,
        format!(
            "Check that the driver was not told to leave the GPU alone: NVreg_ExcludedGpus \
             (UUIDs or PCI addresses) in the module options{excluded}.{host}"
        ),
        &[
            "grep -E 'ExcludedGpus|GpuBlacklist' /proc/driver/nvidia/params",
            "grep -rs NVreg_ExcludedGpus /etc/modprobe.d/",
        ],
    ));
    steps.push(step(
        Where::Any,
        "Read what the driver said at load and since (NVRM lines, Xids).",
        &["sudo dmesg | grep -E 'NVRM|Xid'"],
    ));
    if nvswitch {
        steps.push(step(
            Where::Any,
            "If this is meant to be an NVSwitch-only node (Fabric Manager, no GPU), CUDA cannot \
             run on it: run the workload on a node with GPUs.",
            &[],
        ));
    }
    if refused {
        steps.push(step(
            Where::Host,
            format!(
                "Once the GPU is on the bus and free, load the driver again; the version file \
                 must exist afterwards.{host}"
            ),
            &["sudo modprobe nvidia", "cat /proc/driver/nvidia/version"],
        ));
    }
    steps.push(step(
        Where::Any,
        "Verify: one entry per GPU in the driver's list, and nvidia-smi lists them.",
        &["ls /proc/driver/nvidia/gpus/", "nvidia-smi -L"],
    ));
    steps
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::{Fact, SmiOutcome};
    use crate::doctor::finding::Basis;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    const NO_SUPPORTED: &str = "Failed to initialize NVML: No supported GPUs were found";

    /// A loaded driver without any GPU: empty gpus/, nvidia-smi 255, no /dev/nvidia<N>.
    fn gpuless_host() -> Evidence {
        healthy_open_host().without_node("/dev/nvidia0").with(|e| {
            e.gpus = Fact::ok(vec![], "/proc/driver/nvidia/gpus");
            e.pci_gpus = Fact::ok(vec![], "/sys/bus/pci/devices");
            e.smi = Fact::unavailable(
                format!("failed: `nvidia-smi -q` ended with exit status 255: {NO_SUPPORTED}"),
                "nvidia-smi -q",
            );
            e.smi_outcome = Fact::ok(
                SmiOutcome {
                    verdict: SmiVerdict::NoGpu,
                    status: Some("exit status 255".into()),
                    message: Some(NO_SUPPORTED.into()),
                },
                "nvidia-smi -q",
            );
        })
    }

    #[test]
    fn no_gpu_loaded_driver_with_an_empty_gpu_list_is_critical_high() {
        let f = run("no_gpu", &gpuless_host(), &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence, f.basis),
            (Severity::Critical, Confidence::High, Basis::Static)
        );
        assert_eq!(
            f.title,
            "the NVIDIA driver 590.48.01 is loaded but sees no GPU: CUDA cannot start"
        );
        assert_eq!(
            evidence_from(&f, "GPUs registered", "/proc/driver/nvidia/gpus"),
            "empty: the driver registered no GPU"
        );
        assert_eq!(
            evidence_from(&f, "nvidia-smi", "nvidia-smi -q"),
            format!("{NO_SUPPORTED} (exit status 255)")
        );
        assert_eq!(
            evidence_from(&f, "GPU nodes", "/dev"),
            "absent: no /dev/nvidia<N>"
        );
        for cmd in [
            "lspci -nn -d 10de:",
            "lspci -k -d 10de:",
            "/proc/driver/nvidia/params",
        ] {
            assert!(has_fix(&f, Where::Host, cmd), "{cmd}: {:#?}", f.fix);
        }
        assert!(has_fix(&f, Where::Any, "dmesg | grep -E 'NVRM|Xid'"));
        assert_eq!(
            evidence_from(&f, "PCI bus", "/sys/bus/pci/devices"),
            "no NVIDIA GPU on it (vendor 10de, display class)"
        );
        // The PCI bus unread: said so.
        let unread = gpuless_host().with(|e| {
            e.pci_gpus = Fact::unavailable("not present: no /sys", "/sys/bus/pci/devices")
        });
        let f = run("no_gpu", &unread, &plain()).expect("finding");
        assert!(unchecked_mentions(&f, "the PCI bus"));
        // A GPU on the bus held by vfio-pci: named in the title, high even with stale nodes.
        let held = gpuless_host().with(|e| {
            e.pci_gpus = healthy_open_host().pci_gpus;
            if let Ok(g) = &mut e.pci_gpus.value {
                g[0].driver = Some("vfio-pci".into());
            }
            e.dev_nodes = healthy_open_host().dev_nodes;
        });
        let f = run("no_gpu", &held, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
        assert!(f.title.contains("bound to vfio-pci"), "{}", f.title);
        // Not loaded, nouveau holds the GPU, cuInit failed: no_gpu names nouveau; without a
        // failure a host without the NVIDIA driver is no finding.
        let nouveau = no_driver_host().with(|e| {
            if let Ok(g) = &mut e.pci_gpus.value {
                g[0].driver = Some("nouveau".into());
            }
        });
        let f = run("no_gpu", &nouveau, &watched().cuinit(100, 0.05)).expect("finding");
        assert!(f.title.contains("nouveau"), "{}", f.title);
        assert_eq!(run("no_gpu", &nouveau, &plain()), None);
        // The healthy host, the same driver: nothing.
        assert_eq!(run("no_gpu", &healthy_open_host(), &plain()), None);
    }

    #[test]
    fn no_gpu_observed_cuinit_999_with_its_failed_call_is_attached() {
        let o = watched().cuinit(999, 0.08).opens(3).failed_call(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            "NV_ERR_INVALID_LOCK_STATE",
        );
        let f = run("no_gpu", &gpuless_host(), &o).expect("finding");
        assert_eq!(f.basis, Basis::Observed);
        assert!(f.title.starts_with("cuInit returned 999: "), "{}", f.title);
        assert_eq!(
            evidence_from(&f, "cuInit returned", "probe:cuInit"),
            "999 (CUDA_ERROR_UNKNOWN) after 0.080 s"
        );
        assert!(evidence_from(&f, "failed driver call", "probe:ioctl")
            .starts_with("NV_ESC_RM_CONTROL on /dev/nvidiactl -> NV_ERR_INVALID_LOCK_STATE"));
        assert_eq!(f.evidence[0].source, "probe:cuInit");
        // 100 too; a GPU node that is not there, opened, as well.
        let o = watched()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia0", "ENOENT");
        let f = run("no_gpu", &gpuless_host(), &o).expect("finding");
        assert_eq!(
            evidence_from(&f, "open", "probe:openat"),
            "/dev/nvidia0: ENOENT"
        );
        // Another code is no explanation of this host's: the finding stays static.
        let f = run("no_gpu", &gpuless_host(), &watched().cuinit(802, 0.5)).expect("finding");
        assert_eq!(f.basis, Basis::Static);
        // A cuInit that worked: no finding.
        assert_eq!(
            run(
                "no_gpu",
                &gpuless_host(),
                &watched().cuinit(0, 0.3).opens(4)
            ),
            None
        );
    }

    #[test]
    fn no_gpu_near_misses_on_hosts_with_gpus() {
        // nvidia-smi lists GPUs: never, whatever the rest says.
        let e = gpuless_host().with(|e| e.smi = healthy_open_host().smi);
        assert_eq!(run("no_gpu", &e, &plain()), None);
        // GPUs registered, nvidia-smi failing for another reason, nodes there.
        let e = healthy_open_host().with(|e| {
            e.gpus = Fact::ok(vec!["0000:18:00.0".into()], "/proc/driver/nvidia/gpus");
            e.smi = Fact::unavailable("failed: mismatch", "nvidia-smi -q");
            e.smi_outcome = Fact::ok(
                SmiOutcome {
                    verdict: SmiVerdict::Failed,
                    status: Some("exit status 18".into()),
                    message: Some(
                        "Failed to initialize NVML: Driver/library version mismatch".into(),
                    ),
                },
                "nvidia-smi -q",
            );
        });
        assert_eq!(run("no_gpu", &e, &plain()), None);
        // NVML's "Unknown Error" with the GPU node present: a denied device (docker after a
        // daemon-reload), not this.
        let e = healthy_open_host().with(|e| {
            e.smi = Fact::unavailable("failed: Unknown Error", "nvidia-smi -q");
            e.smi_outcome = Fact::ok(
                SmiOutcome {
                    verdict: SmiVerdict::NoGpu,
                    status: Some("exit status 255".into()),
                    message: Some("Failed to initialize NVML: Unknown Error".into()),
                },
                "nvidia-smi -q",
            );
        });
        assert_eq!(run("no_gpu", &e, &plain()), None);
        // No driver at all and a silent kernel log: nothing to say.
        assert_eq!(run("no_gpu", &no_driver_host(), &plain()), None);
    }

    #[test]
    fn no_gpu_says_what_it_could_not_check_when_the_gpu_list_is_unreadable() {
        // gpus/ unreadable, nvidia-smi working with GPUs: no claim.
        let blind = healthy_open_host().with(|e| {
            e.gpus = Fact::unavailable("not readable: EACCES", "/proc/driver/nvidia/gpus")
        });
        assert_eq!(run("no_gpu", &blind, &plain()), None);
        // gpus/ unreadable, nvidia-smi says no GPU, no GPU node: lower, and says so.
        let e = gpuless_host().with(|e| {
            e.gpus = Fact::unavailable("not readable: EACCES", "/proc/driver/nvidia/gpus")
        });
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::Medium);
        assert!(unchecked_mentions(
            &f,
            "GPUs the driver registered unknown: not readable: EACCES"
        ));
        // ...and with /dev unreadable too: low.
        let e = e.with(|e| e.dev_nodes = Fact::unavailable("not readable: EACCES", "/dev/nvidia*"));
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::Low);
        assert!(unchecked_mentions(&f, "GPU device nodes unknown"));
        // Only the ambiguous "Unknown Error" and nothing else known: no claim.
        let e = e.with(|e| {
            if let Ok(s) = &mut e.smi_outcome.value {
                s.message = Some("Failed to initialize NVML: Unknown Error".into());
            }
        });
        assert_eq!(run("no_gpu", &e, &plain()), None);
    }

    #[test]
    fn no_gpu_on_an_nvswitch_only_node_says_cuda_cannot_start_there_either() {
        let e = gpuless_host().with(|e| {
            e.nvswitch_nodes = Fact::ok(
                vec![
                    "/dev/nvidia-nvswitch0".into(),
                    "/dev/nvidia-nvswitchctl".into(),
                ],
                "/dev/nvidia-nvswitch*",
            )
        });
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
        assert!(f.title.contains("NVSwitch-only node"), "{}", f.title);
        assert!(evidence_from(&f, "NVSwitch nodes", "/dev/nvidia-nvswitch*")
            .ends_with("CUDA cannot start here either"));
        assert!(f.fix.iter().any(|s| s.note.contains("NVSwitch-only node")));
        // fabric_not_ready is not what this is: no fabric state, no 802.
        assert_eq!(run("fabric_not_ready", &e, &plain()), None);
    }

    #[test]
    fn no_gpu_stale_gpu_nodes_lower_it_and_argue_against() {
        let e = gpuless_host().with(|e| {
            if let Ok(n) = &mut e.dev_nodes.value {
                n.push(crate::doctor::facts::DevNode {
                    path: "/dev/nvidia0".into(),
                    dev: Some((195, 0)),
                    open: None,
                });
            }
        });
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::Medium);
        assert!(evidence_from(&f, "GPU nodes", "/dev").starts_with("against: /dev/nvidia0 exist"));
    }

    #[test]
    fn no_gpu_in_a_container_not_given_the_hosts_gpus() {
        let e = gpuless_host()
            .container("docker", None)
            .with(|e| e.gpus = Fact::ok(vec!["0000:18:00.0".into()], "/proc/driver/nvidia/gpus"));
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
        assert!(
            f.title
                .contains("none was given to this container (docker)"),
            "{}",
            f.title
        );
        assert!(has_fix(&f, Where::Host, "--gpus all"));
        assert!(has_fix(&f, Where::Container, "ls -l /dev/nvidia*"));
        // The same on the host: GPUs registered, none usable: medium.
        let host = gpuless_host()
            .with(|e| e.gpus = Fact::ok(vec!["0000:18:00.0".into()], "/proc/driver/nvidia/gpus"));
        let f = run("no_gpu", &host, &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::Medium);
        assert!(!has_fix(&f, Where::Host, "--gpus all"));
        // Near miss: the container has its GPU node.
        let given = healthy_open_host()
            .container("docker", None)
            .with(|e| e.smi = gpuless_host().smi)
            .with(|e| e.smi_outcome = gpuless_host().smi_outcome);
        assert_eq!(run("no_gpu", &given, &plain()), None);
    }

    #[test]
    fn no_gpu_excluded_gpus_are_cited() {
        let e = gpuless_host()
            .with(|e| e.gpus = Fact::ok(vec!["0000:18:00.0".into()], "/proc/driver/nvidia/gpus"))
            .with(|e| {
                if let Ok(p) = &mut e.driver_params.value {
                    p.insert("ExcludedGpus".into(), "\"0000:18:00.0\"".into());
                }
            });
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert!(
            evidence_from(&f, "ExcludedGpus", "/proc/driver/nvidia/params")
                .starts_with("\"0000:18:00.0\"")
        );
        assert!(f
            .fix
            .iter()
            .any(|s| s.note.contains("here ExcludedGpus: \"0000:18:00.0\"")));
    }

    #[test]
    fn no_gpu_driver_refused_to_load_from_the_kernel_log() {
        let e = no_driver_host()
            .log(|l| l.no_gpu = vec!["[    3.499020] NVRM: No NVIDIA GPU found.".into()]);
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(
            f.title.contains("refused to load: it found no NVIDIA GPU"),
            "{}",
            f.title
        );
        assert_eq!(
            evidence_from(&f, "kernel log", "/dev/kmsg"),
            "[    3.499020] NVRM: No NVIDIA GPU found."
        );
        assert!(has_fix(&f, Where::Host, "sudo modprobe nvidia"));
        assert!(f
            .fix
            .iter()
            .any(|s| s.note.contains("readable once the driver is loaded")));
        // Another driver holds it: named.
        let e = no_driver_host().log(|l| {
            l.no_gpu = vec![
                "NVRM: GPU 0000:01:00.0 is already bound to vfio-pci.".into(),
                "NVRM: No NVIDIA devices probed.".into(),
            ]
        });
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert_eq!(
            f.title,
            "the NVIDIA driver refused to load: vfio-pci holds the GPU"
        );
        // Probed and failed: the lines before say why.
        let e = no_driver_host()
            .log(|l| l.no_gpu = vec!["NVRM: None of the NVIDIA devices were initialized.".into()]);
        let f = run("no_gpu", &e, &plain()).expect("finding");
        assert!(unchecked_mentions(&f, "why each GPU failed its probe"));
        // Near misses: no such line; the driver loaded after all.
        assert_eq!(run("no_gpu", &no_driver_host(), &plain()), None);
        let loaded =
            healthy_open_host().log(|l| l.no_gpu = vec!["NVRM: No NVIDIA GPU found.".into()]);
        assert_eq!(run("no_gpu", &loaded, &plain()), None);
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors; the real
    // hosts of `uvmwatch_testbed::snapshot::gpuless`.

    #[test]
    fn no_gpu_real_550_host_loaded_without_a_gpu_is_the_only_critical_finding() {
        let e = snapshot_evidence(&gpuless_550());
        assert_eq!(e.gpus.get(), Some(&vec![]));
        assert_eq!(
            e.smi_outcome.get().map(|s| s.verdict),
            Some(SmiVerdict::NoGpu)
        );
        assert_eq!(e.devices.get().unwrap()["nvidiactl"], 195);
        let fs = diagnose(&e, &plain());
        assert_eq!(rules_of(&fs), ["no_gpu"], "{fs:#?}");
        let f = expect(&fs, "no_gpu", Severity::Critical, Confidence::High);
        assert_eq!(
            evidence_from(f, "driver", "/proc/driver/nvidia/version"),
            "550.163.01 open kernel module, loaded"
        );
        assert_eq!(
            evidence_from(f, "nvidia-smi", "nvidia-smi -q"),
            format!("{NO_SUPPORTED} (exit status 255)")
        );
        assert_eq!(
            evidence_from(f, "GPU nodes", "/dev/nvidia*"),
            "absent: no /dev/nvidia<N>"
        );
        assert!(f
            .fix
            .iter()
            .any(|s| s.note.contains("here ExcludedGpus: \"\"")));
        // What the agent saw there: cuInit 999 after RM_CONTROL failed.
        let o = watched().cuinit(999, 0.08).opens(3).failed_call(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            "NV_ERR_INVALID_LOCK_STATE",
        );
        let fs = diagnose(&e, &o);
        assert_eq!(rules_of(&fs), ["no_gpu"], "{fs:#?}");
        assert_eq!(fs[0].basis, Basis::Observed);
    }

    #[test]
    fn no_gpu_real_535_host_with_nvml_unknown_error_is_critical_high() {
        let fs = diagnose_spec(&gpuless_535(), &plain());
        let f = expect(&fs, "no_gpu", Severity::Critical, Confidence::High);
        assert!(evidence_from(f, "nvidia-smi", "nvidia-smi -q")
            .starts_with("Failed to initialize NVML: Unknown Error (exit status 255); "));
        assert_eq!(rules_of(&fs), ["no_gpu"]);
    }

    #[test]
    fn no_gpu_real_host_whose_driver_refused_to_load_is_critical_not_nothing() {
        let e = snapshot_evidence(&driver_refused_no_gpu());
        assert!(super::super::no_driver(&e).is_some());
        assert_eq!(
            e.smi_outcome.get().map(|s| s.verdict),
            Some(SmiVerdict::NoDriver)
        );
        let fs = diagnose(&e, &plain());
        assert_eq!(rules_of(&fs), ["no_gpu"], "{fs:#?}");
        let f = expect(&fs, "no_gpu", Severity::Critical, Confidence::High);
        assert!(evidence_from(f, "kernel log", DMESG).ends_with("NVRM: No NVIDIA GPU found."));
        assert!(evidence_from(f, "nvidia-smi", "nvidia-smi -q").contains("exit status 9"));
        // The driver loading later (a GPU added, passthrough fixed): history.
        let mut spec = driver_refused_no_gpu();
        spec.dmesg = Some(format!(
            "{}[   90.000000] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (buildd@debian)  Mon Jul 21 21:45:24 UTC 2025\n",
            spec.dmesg.unwrap()
        ));
        absent(&diagnose_spec(&spec, &plain()), "no_gpu");
    }

    #[test]
    fn no_gpu_stands_alone_over_the_missing_node_it_explains() {
        // The refused driver, and a process whose open of nvidiactl found nothing: the node
        // is missing because the driver refused to load, so `node_or_module_missing` yields
        // to the cause (`Rule::yields_to`) instead of standing beside it.
        let e = snapshot_evidence(&driver_refused_no_gpu());
        let o = watched()
            .cuinit(100, 0.002)
            .failed_open("/dev/nvidiactl", "ENOENT");
        let fs = diagnose(&e, &o);
        assert_eq!(rules_of(&fs), ["no_gpu"], "{fs:#?}");
        assert_eq!(fs[0].basis, Basis::Observed);
        assert!(
            fs[0].title.starts_with("cuInit returned 100: "),
            "{}",
            fs[0].title
        );
    }

    #[test]
    fn no_gpu_beside_a_missing_uvm_node_names_both() {
        // NVIDIA's real driver loaded without a GPU (vm-test nvidia_failures): a missing
        // /dev/nvidia-uvm is a problem of its own, not explained by the missing GPU.
        let mut e = healthy_open_host();
        e.gpus = Fact::ok(vec![], "/proc/driver/nvidia/gpus");
        e.pci_gpus = Fact::ok(vec![], "/sys/bus/pci/devices");
        e.smi = Fact::unavailable("nvidia-smi not captured", "nvidia-smi -q");
        let o = watched()
            .cuinit(999, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let fs = diagnose(&e, &o);
        let rules = rules_of(&fs);
        assert!(rules.contains(&"no_gpu"), "{fs:#?}");
        assert!(rules.contains(&"node_or_module_missing"), "{fs:#?}");
    }

    #[test]
    fn no_gpu_not_on_the_healthy_snapshot_nor_without_its_gpu_list() {
        absent(&diagnose_spec(&SnapshotSpec::default(), &plain()), "no_gpu");
        absent(
            &diagnose_spec(
                &SnapshotSpec::default(),
                &watched().cuinit(999, 0.08).opens(4),
            ),
            "no_gpu",
        );
        // A snapshot without gpus/ (written before uvmwatch read it), GPUs listed by
        // nvidia-smi: no claim either.
        let old = SnapshotSpec {
            gpus: None,
            ..SnapshotSpec::default()
        };
        let e = snapshot_evidence(&old);
        assert!(e.gpus.value.is_err());
        absent(&diagnose(&e, &plain()), "no_gpu");
        // The real 550 host without its gpus/ entry: from nvidia-smi and /dev, medium.
        let blind = SnapshotSpec {
            gpus: None,
            ..gpuless_550()
        };
        let fs = diagnose_spec(&blind, &plain());
        let f = expect(&fs, "no_gpu", Severity::Critical, Confidence::Medium);
        assert!(unchecked_mentions(f, "GPUs the driver registered unknown"));
    }
}

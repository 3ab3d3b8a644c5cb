//! Rule `module_refused`: the nvidia module could not be loaded (one row of the rules table in
//! `docs/doctor.md`): Secure Boot's signature check or lockdown turned an unsigned build away,
//! the module was built for another kernel (unknown symbols, version magic), or the open
//! flavour refused a GPU without GSP; without a reason in the kernel log, an NVIDIA GPU
//! waiting on the PCI bus with no driver while NVIDIA's tools cannot reach one. The GPU is
//! there, so nothing else is wrong with it; CUDA cannot start (`cuInit` 100, `/dev/nvidiactl`
//! missing).
//!
//! The kernel's own messages (`collect::kernel_log::MODULE_REFUSED_LINES`, with their Linux
//! sources) are the defining signal. The signature and lockdown lines name no module: they
//! are the nvidia module's when it is the one missing, and all the surer when an NVIDIA GPU
//! waits on the PCI bus with no driver.

use super::super::facts::{Evidence, Observations, SmiVerdict};
use super::super::finding::{Confidence, Finding, FixStep, Severity, Where};
use super::{
    cu, finding, host_only_note, item, klog, nvidia_loaded, push_cuinit, step, SRC_OPENAT,
};

/// Why the kernel refused the module, from its lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// Signature enforcement or lockdown (Secure Boot): an unsigned or untrusted build.
    Signature,
    /// Built for another kernel: unknown symbols, symbol versions, version magic.
    OtherKernel,
    /// The open flavour on a GPU without GSP (pre-Turing): it needs the proprietary one.
    Flavor,
    /// No refusal in the kernel log, but an NVIDIA GPU waits on the PCI bus with no driver
    /// while NVIDIA's user space is installed (`nvidia-smi` cannot reach a driver) or CUDA
    /// was seen failing: loading failed or was never tried.
    NotLoaded,
}

/// Module refused: the nvidia module is not loaded and the kernel log says, after the last
/// successful load, that a module was refused (signature, lockdown, unknown symbols, version
/// magic, the open flavour on a GPU without GSP); lines that name no module count only with a
/// sign of NVIDIA on the host (a GPU on the PCI bus, `nvidia-smi` finding no driver, CUDA
/// seen failing). Critical; high confidence when the lines name an nvidia module or an NVIDIA
/// GPU on the PCI bus has no driver, medium otherwise; low, with no line at all, for a GPU
/// waiting without a driver while
/// `nvidia-smi` cannot reach one or CUDA was seen failing. Observed: a `cuInit` failure and
/// failed opens of the nodes the driver would have made.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    let loaded = nvidia_loaded(e);
    if loaded {
        return None;
    }
    let lines = klog(e).map(|l| l.module_refused.as_slice()).unwrap_or(&[]);
    let waiting: Vec<String> = e
        .pci_gpus
        .get()
        .map(|g| {
            g.iter()
                .filter(|g| g.driver.is_none())
                .map(|g| g.address.clone())
                .collect()
        })
        .unwrap_or_default();
    let smi_no_driver = e
        .smi_outcome
        .get()
        .is_some_and(|s| s.verdict == SmiVerdict::NoDriver);
    let failed = o.cuinit_result.is_some_and(|r| r != cu::SUCCESS) || !o.failed_opens.is_empty();
    let has = |p: &str| lines.iter().any(|l| l.contains(p));
    let why = if has("unsigned module") || has("unavailable key") || has("Lockdown:") {
        Why::Signature
    } else if has("is not supported by open") {
        Why::Flavor
    } else if !lines.is_empty() {
        Why::OtherKernel
    } else if !waiting.is_empty() && (smi_no_driver || failed) {
        Why::NotLoaded
    } else {
        return None;
    };
    let named = lines.iter().any(|l| {
        l.contains("nvidia:")
            || l.contains("nvidia_")
            || l.contains("module nvidia")
            || l.contains("NVRM:")
    });
    // The signature and lockdown lines name no module: on their own they may be another
    // vendor's module. Only with a sign of NVIDIA here (a GPU on the PCI bus, NVIDIA's user
    // space finding no driver, CUDA seen failing) are they the nvidia module's.
    let nvidia_here = e.pci_gpus.get().is_some_and(|g| !g.is_empty()) || smi_no_driver || failed;
    if !lines.is_empty() && !named && !nvidia_here {
        return None;
    }
    let confidence = match why {
        Why::NotLoaded => Confidence::Low,
        _ if named || !waiting.is_empty() => Confidence::High,
        _ => Confidence::Medium,
    };
    let title = match why {
        Why::Signature => {
            "the kernel refused the nvidia module: it is not signed with a key this kernel \
             trusts (Secure Boot): CUDA cannot start"
        }
        Why::OtherKernel => {
            "the kernel refused the nvidia module: it was built for another kernel (unknown \
             symbols or version magic): CUDA cannot start"
        }
        Why::Flavor => {
            "the open nvidia module refused the GPU: it has no GSP (older than Turing) and \
             needs the proprietary module: CUDA cannot start"
        }
        Why::NotLoaded => {
            "the nvidia module is not loaded while an NVIDIA GPU waits on the PCI bus with no \
             driver: loading it failed or was never tried, and the kernel log does not say \
             why: CUDA cannot start"
        }
    };
    let mut f = finding(
        "module_refused",
        Severity::Critical,
        confidence,
        title.to_string(),
    );
    for l in lines.iter().take(4) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    f.evidence.push(item(
        "driver",
        "not loaded: no /proc/driver/nvidia/version",
        e.driver.source.clone(),
    ));
    if smi_no_driver {
        f.evidence.push(item(
            "nvidia-smi",
            "couldn't communicate with the NVIDIA driver: NVIDIA's user space is installed",
            e.smi_outcome.source.clone(),
        ));
    }
    if !waiting.is_empty() {
        f.evidence.push(item(
            "GPU on the PCI bus",
            format!("{}: no kernel driver bound", waiting.join(", ")),
            e.pci_gpus.source.clone(),
        ));
    }
    if o.cuinit_result.is_some() {
        push_cuinit(&mut f, o);
    }
    for (path, err) in &o.failed_opens {
        f.evidence
            .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
    }
    f.evidence.sort_by_key(|i| !i.source.starts_with("probe:"));
    if e.pci_gpus.get().is_none() {
        f.unchecked.push(
            "whether an NVIDIA GPU waits on the PCI bus without a driver (lspci -k -d 10de:)"
                .to_string(),
        );
    }
    f.fix = fix(e, why);
    Some(f)
}

/// The fix for each reason.
fn fix(e: &Evidence, why: Why) -> Vec<FixStep> {
    let host = host_only_note(e);
    let mut steps = match why {
        Why::Signature => vec![step(
            Where::Host,
            format!(
                "Secure Boot is on and the module is unsigned (a DKMS or .run build): \
                     enroll the key DKMS signs with as a Machine Owner Key, confirm it at the \
                     next boot (MOK manager), then load the module. Or install the \
                     distribution's signed driver packages, or turn Secure Boot off.{host}"
            ),
            &[
                "mokutil --sb-state",
                "sudo mokutil --import /var/lib/dkms/mok.pub",
                "sudo reboot",
            ],
        )],
        Why::Flavor => vec![step(
            Where::Host,
            format!(
                "Install the proprietary flavour of the driver (the open modules need a GPU \
                 with GSP, Turing or newer); remove the open packages first.{host}"
            ),
            &["lspci -nn -d 10de:", "sudo apt-get install nvidia-driver"],
        )],
        Why::NotLoaded => vec![step(
            Where::Host,
            format!(
                "Load the module and read the kernel's reason if it refuses: a module missing \
                 for this kernel (modprobe: Module nvidia not found) needs a DKMS build, a \
                 refused one says why in the kernel log.{host}"
            ),
            &[
                "sudo modprobe nvidia",
                "sudo dmesg | tail -n 20",
                "dkms status",
                "mokutil --sb-state",
            ],
        )],
        Why::OtherKernel => vec![step(
            Where::Host,
            format!(
                "Rebuild the module for the running kernel (install its headers, let DKMS \
                 build it), or boot the kernel it was built for.{host}"
            ),
            &[
                "sudo apt-get install linux-headers-$(uname -r)",
                "sudo dkms autoinstall",
                "dkms status",
            ],
        )],
    };
    steps.push(step(
        Where::Host,
        format!("Load the driver; the version file must exist afterwards.{host}"),
        &["sudo modprobe nvidia", "cat /proc/driver/nvidia/version"],
    ));
    steps.push(step(
        Where::Any,
        "Verify: the GPU is bound to nvidia and nvidia-smi lists it.",
        &["lspci -k -d 10de:", "nvidia-smi -L"],
    ));
    steps
}

#[cfg(test)]
mod tests {
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::{Fact, KernelLog};
    use crate::doctor::fixtures::*;

    fn refused_host(lines: &[&str], pci_driver: Option<&str>) -> Evidence {
        let mut e = no_driver_host();
        e.kernel_log = Fact::ok(
            KernelLog {
                module_refused: lines.iter().map(|l| l.to_string()).collect(),
                ..KernelLog::default()
            },
            "/dev/kmsg",
        );
        if let Ok(g) = &mut e.pci_gpus.value {
            g.iter_mut()
                .for_each(|g| g.driver = pci_driver.map(str::to_string));
        }
        e
    }

    const SIG: &str = "[    5.101010] Loading of unsigned module is rejected";

    #[test]
    fn module_refused_secure_boot_with_a_waiting_gpu_is_critical_high() {
        let e = refused_host(&[SIG], None);
        let fs = super::super::diagnose(&e, &watched().cuinit(100, 0.05));
        let f = expect(&fs, "module_refused", Severity::Critical, Confidence::High);
        assert!(f.title.contains("Secure Boot"), "{}", f.title);
        assert!(f.fix_text().contains("mokutil --import"));
        assert_eq!(fs[0].rule, "module_refused", "{fs:#?}");
    }

    #[test]
    fn module_refused_unnamed_line_needs_a_sign_of_nvidia_and_unknown_symbol_names_the_kernel() {
        // The PCI bus unreadable, NVIDIA's user space finding no driver: medium.
        let mut e = refused_host(&[SIG], None);
        e.pci_gpus = Fact::unavailable("not present", "/sys/bus/pci/devices");
        e.smi_outcome = Fact::ok(
            crate::doctor::facts::SmiOutcome {
                verdict: SmiVerdict::NoDriver,
                status: Some("exit status 9".into()),
                message: Some(
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
                        .into(),
                ),
            },
            "nvidia-smi -q",
        );
        let fs = super::super::diagnose(&e, &plain());
        expect(
            &fs,
            "module_refused",
            Severity::Critical,
            Confidence::Medium,
        );
        // No NVIDIA GPU on the bus, no NVIDIA user space, nothing failing: another vendor's
        // module, not this.
        let mut e = refused_host(&[SIG], None);
        e.pci_gpus = Fact::ok(vec![], "/sys/bus/pci/devices");
        absent(&super::super::diagnose(&e, &plain()), "module_refused");
        let e = refused_host(
            &["[ 6.2] nvidia: Unknown symbol drm_gem_prime_export (err -2)"],
            None,
        );
        let fs = super::super::diagnose(&e, &plain());
        let f = expect(&fs, "module_refused", Severity::Critical, Confidence::High);
        assert!(f.title.contains("another kernel"));
        assert!(f.fix_text().contains("dkms autoinstall"));
    }

    #[test]
    fn module_refused_near_misses_loaded_driver_or_working_cuinit_or_no_line() {
        // The driver loaded later (the collector drops older lines; a loaded driver wins).
        let mut e = healthy_open_host();
        e.kernel_log = Fact::ok(
            KernelLog {
                module_refused: vec![SIG.to_string()],
                ..KernelLog::default()
            },
            "/dev/kmsg",
        );
        absent(&super::super::diagnose(&e, &plain()), "module_refused");
        // cuInit worked.
        let e = refused_host(&[SIG], None);
        absent(
            &super::super::diagnose(&e, &watched().cuinit(0, 0.3).opens(3)),
            "module_refused",
        );
        // No driver and no refusal in the log: another rule's business.
        absent(
            &super::super::diagnose(&refused_host(&[], None), &plain()),
            "module_refused",
        );
    }
}

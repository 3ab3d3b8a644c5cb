//! Rule `stale_after_suspend`: driver state broken by suspend/resume (one row of the rules table in
//! `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in code
//! to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{
    cu, finding, host_only_note, item, klog, observed, push_cuinit, push_cuinit_unchecked, quick,
    step, unknown, SRC_OPENAT,
};

/// Stale after suspend: the kernel log shows a resume after nvidia_uvm was loaded, opens
/// succeed, and `cuInit` returns 999 quickly.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
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

#[cfg(test)]
mod tests {
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::Fact;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn stale_after_suspend_then_999() {
        let e = healthy_open_host().log(|l| l.resumed_after_uvm_load = true);
        let o = watched().cuinit(999, 0.02).opens(4);
        let f = run("stale_after_suspend", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "modprobe -r nvidia_uvm"));
    }

    #[test]
    fn stale_after_suspend_near_misses() {
        let o = watched().cuinit(999, 0.02).opens(4);
        // No resume in a readable log: not this.
        assert_eq!(run("stale_after_suspend", &healthy_open_host(), &o), None);
        // Resumed, but CUDA works.
        let e = healthy_open_host().log(|l| l.resumed_after_uvm_load = true);
        let ok = watched().cuinit(0, 0.3).opens(4);
        assert_eq!(run("stale_after_suspend", &e, &ok), None);
        // Log unreadable: low, and it says why.
        let blind = healthy_open_host().with(|e| {
            e.kernel_log = Fact::unavailable("Operation not permitted (os error 1)", "/dev/kmsg")
        });
        let f = run("stale_after_suspend", &blind, &o).expect("finding");
        assert_eq!(f.confidence, Confidence::Low);
        assert!(unchecked_mentions(&f, "CAP_SYSLOG"));
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    fn resumed() -> SnapshotSpec {
        with_kernel_log(DMESG_RESUME)
    }

    #[test]
    fn stale_after_suspend_resume_after_uvm_load_then_quick_999_is_critical_high() {
        let o = watched().cuinit(999, 0.02).opens(4);
        let fs = diagnose_spec(&resumed(), &o);
        assert_eq!(fs[0].rule, "stale_after_suspend");
        let f = expect(
            &fs,
            "stale_after_suspend",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "kernel log", DMESG),
            "resume from suspend after nvidia_uvm was loaded"
        );
        evidence_from(f, "cuInit returned", "probe:cuInit");
        evidence_from(f, "device opens", "probe:openat");
        assert!(has_fix(f, Where::Host, "modprobe -r nvidia_uvm"));
        // A slow 999 after the resume: still this, less sure.
        let fs = diagnose_spec(&resumed(), &watched().cuinit(999, 4.0).opens(4));
        expect(
            &fs,
            "stale_after_suspend",
            Severity::Critical,
            Confidence::Medium,
        );
    }

    #[test]
    fn stale_after_suspend_resume_with_plain_doctor_is_a_low_warning() {
        let fs = diagnose_spec(&resumed(), &plain());
        expect(
            &fs,
            "stale_after_suspend",
            Severity::Warning,
            Confidence::Low,
        );
    }

    #[test]
    fn stale_after_suspend_not_for_resume_before_load_reload_after_resume_or_working_cuinit() {
        let o = watched().cuinit(999, 0.02).opens(4);
        // Resume logged before nvidia_uvm was loaded.
        let before = SnapshotSpec {
            dmesg: Some(format!(
                "{DMESG_RESUME}{}",
                boot_dmesg(&DriverSpec::open(DRIVER), 508)
            )),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&before, &o), "stale_after_suspend");
        // nvidia_uvm reloaded after the resume.
        let reloaded = with_kernel_log(&format!(
                "{DMESG_RESUME}[ 9100.000000] nvidia-uvm: Loaded the UVM driver, major device number 508.\n"
            ));
        absent(&diagnose_spec(&reloaded, &o), "stale_after_suspend");
        // No resume in a readable log.
        absent(
            &diagnose_spec(&SnapshotSpec::default(), &o),
            "stale_after_suspend",
        );
        // Resumed, but CUDA works.
        absent(
            &diagnose_spec(&resumed(), &watched().cuinit(0, 0.3).opens(4)),
            "stale_after_suspend",
        );
        // Resumed, 999, but an open failed: the missing node explains it.
        let enoent = watched()
            .cuinit(999, 0.004)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        absent(&diagnose_spec(&resumed(), &enoent), "stale_after_suspend");
    }

    #[test]
    fn stale_after_suspend_999_without_a_kernel_log_is_low_and_says_why() {
        let spec = SnapshotSpec {
            dmesg: None,
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &watched().cuinit(999, 0.02).opens(4));
        let f = expect(
            &fs,
            "stale_after_suspend",
            Severity::Critical,
            Confidence::Low,
        );
        assert!(unchecked_mentions(f, "CAP_SYSLOG"), "{:?}", f.unchecked);
    }
}

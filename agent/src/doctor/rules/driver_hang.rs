//! Rule `driver_hang`: a thread is stuck inside the NVIDIA driver (one row of the rules table in
//! `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in code
//! to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{
    call_text, finding, host_only_note, item, klog, probe_unavailable, push_cuinit, step, unknown,
    REGISTER_GPU, SRC_IOCTL,
};

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
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
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
    let dir = o.stuck_thread_dir();
    push_cuinit(&mut f, o);
    if let Some(c) = stuck {
        f.evidence
            .push(item("call in flight", call_text(c), SRC_IOCTL));
    }
    if let Some(s) = &o.stuck_state {
        f.evidence
            .push(item("thread state", s.clone(), format!("{dir}/stat")));
    }
    if let Some(w) = &o.stuck_wchan {
        f.evidence
            .push(item("wchan", w.clone(), format!("{dir}/wchan")));
    }
    for frame in o.stuck_stack.iter().filter(|s| nv_symbol(s)).take(4) {
        f.evidence
            .push(item("kernel stack", frame.clone(), format!("{dir}/stack")));
    }
    for l in hangs.iter().take(3) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if stuck.is_some() && o.stuck_wchan.is_none() && o.stuck_stack.is_empty() {
        f.unchecked.push(format!(
            "wchan and kernel stack of the stuck thread not readable ({dir}/stack needs root)"
        ));
    }
    if let Some(why) = ioctl_blind.filter(|_| stuck.is_none()) {
        f.unchecked
            .push(format!("driver call in flight not seen: {why}"));
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (lockups, hung tasks, oops)") {
        f.unchecked.push(s);
    }

    let stack_cmd = format!("sudo cat {dir}/stack");
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

#[cfg(test)]
mod tests {
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn driver_hang_from_stuck_thread() {
        let hang = watched()
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
        // A thread other than the main one (which may have exited): its own directory.
        let f = run(
            "driver_hang",
            &healthy_open_host(),
            &hang.with(|o| o.stuck_tid = Some(4250)),
        )
        .expect("finding");
        assert!(f
            .evidence
            .iter()
            .any(|i| i.source == "/proc/4242/task/4250/wchan"));
        assert!(has_fix(&f, Where::Any, "cat /proc/4242/task/4250/stack"));
        assert!(!has_fix(&f, Where::Any, "/proc/4242/stack"));
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
    fn driver_hang_kinds_of_kernel_reports() {
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
        let slow = watched().in_flight(30.0).opens(4);
        assert_eq!(run("driver_hang", &healthy_open_host(), &slow), None);
        // A call that failed and returned is not a hang.
        assert_eq!(
            run("driver_hang", &motivating_host(), &register_gpu_no_memory()),
            None
        );
        // Blind to ioctls: a low warning that says so.
        let blind = slow.unavailable("syscalls:sys_enter_ioctl: tracefs not mounted");
        let f = run("driver_hang", &healthy_open_host(), &blind).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Warning, Confidence::Low)
        );
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn driver_hang_thread_stuck_in_rm_control_in_d_state_is_critical_high() {
        let o = watched()
            .in_flight(60.0)
            .opens(2)
            .stuck(
                "NV_ESC_RM_CONTROL",
                "/dev/nvidiactl",
                59.0,
                "D (disk sleep)",
            )
            .with(|o| o.stuck_wchan = Some("os_acquire_mutex".into()));
        let fs = diagnose_spec(&SnapshotSpec::default(), &o);
        assert_eq!(fs[0].rule, "driver_hang");
        let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::High);
        evidence_from(f, "call in flight", "probe:ioctl");
        evidence_from(f, "thread state", "/proc/4242/stat");
        evidence_from(f, "wchan", "/proc/4242/wchan");
        assert!(has_fix(f, Where::Any, "/proc/4242/stack"));
        // Not the HMM set-up: that is UVM_REGISTER_GPU, not an RM control call.
        at_most(&fs, "hmm_setup_failure", Severity::Warning);
    }

    #[test]
    fn driver_hang_hung_task_or_soft_lockup_with_uvm_frames_in_kernel_log_is_critical_medium() {
        for (needle, excerpt) in [
            ("blocked for more than", DMESG_HUNG_TASK_UVM),
            ("soft lockup", DMESG_SOFT_LOCKUP_UVM),
        ] {
            let spec = with_kernel_log(excerpt);
            let fs = diagnose_spec(&spec, &plain());
            let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::Medium);
            let line = evidence_from(f, "kernel log", DMESG);
            assert!(line.contains(needle), "{needle}: {line}");
        }
    }

    #[test]
    fn driver_hang_oops_in_nvidia_uvm_means_wedged_until_reboot() {
        let oops = "\
[ 4410.100001] BUG: kernel NULL pointer dereference, address: 0000000000000008
[ 4410.100010] #PF: supervisor read access in kernel mode
[ 4410.100020] Oops: 0000 [#1] PREEMPT SMP NOPTI
[ 4410.100030] RIP: 0010:uvm_va_space_register_gpu+0x1f/0x300 [nvidia_uvm]
[ 4410.100040] Call Trace:
[ 4410.100041]  <TASK>
[ 4410.100050]  uvm_api_register_gpu+0x5a/0x80 [nvidia_uvm]
[ 4410.100060]  </TASK>
";
        let spec = with_kernel_log(oops);
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::High);
        assert!(f.title.contains("wedged"), "{}", f.title);
        assert!(evidence_from(f, "kernel log", DMESG).contains("NULL pointer"));
        assert!(has_fix(f, Where::Host, "sudo reboot"));
    }

    #[test]
    fn driver_hang_not_for_a_hung_task_outside_nvidia() {
        let spec = with_kernel_log(DMESG_HUNG_TASK_OTHER);
        absent(&diagnose_spec(&spec, &plain()), "driver_hang");
        absent(
            &diagnose_spec(&spec, &watched().cuinit(0, 0.3).opens(4)),
            "driver_hang",
        );
    }

    #[test]
    fn driver_hang_not_for_slow_cuinit_without_a_call_in_flight_nor_for_a_returned_failure() {
        // cuInit still running, ioctl probes working, no driver call in flight.
        let slow = watched().in_flight(30.0).opens(4);
        absent(
            &diagnose_spec(&SnapshotSpec::default(), &slow),
            "driver_hang",
        );
        // A call that failed and returned is not a hang.
        absent(
            &diagnose_spec(&incident_spec(), &register_gpu_no_memory()),
            "driver_hang",
        );
        // Blind to ioctls: only a low warning that says so.
        let blind = slow.unavailable("syscalls:sys_enter_ioctl: tracefs not mounted");
        let fs = diagnose_spec(&SnapshotSpec::default(), &blind);
        let f = expect(&fs, "driver_hang", Severity::Warning, Confidence::Low);
        assert!(unchecked_mentions(f, "driver call in flight not seen"));
    }
}

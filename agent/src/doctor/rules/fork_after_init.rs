//! Rule `fork_after_init`: CUDA used in a child forked after cuInit (one row of the rules table in
//! `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in code
//! to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{cu, finding, item, probe_unavailable, push_cuinit, step, SRC_FORK, SRC_OPENAT};

/// A forked child's `cuInit` fails within microseconds; allow for probe latency.
const FORK_FAIL_SECONDS: f64 = 0.05;

/// Fork after init: a child forked (no exec) from a process that had already run `cuInit`
/// calls `cuInit`, which returns 3 within microseconds with no new `/dev/nvidia*` opens.
/// Fires only when the fork was seen (`probe:fork`) and no device open succeeded.
pub(super) fn check(_e: &Evidence, o: &Observations) -> Option<Finding> {
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

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn fork_after_init_fires() {
        let o = watched().forked().cuinit(3, 0.00002);
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
    fn fork_after_init_near_misses() {
        let e = healthy_open_host();
        assert_eq!(
            run(
                "fork_after_init",
                &e,
                &watched().forked().cuinit(3, 0.2).opens(3)
            ),
            None
        );
        assert_eq!(
            run("fork_after_init", &e, &watched().cuinit(3, 0.00002)),
            None
        );
        assert_eq!(
            run(
                "fork_after_init",
                &e,
                &watched().forked().cuinit(0, 0.2).opens(4)
            ),
            None
        );
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn fork_after_init_child_error_3_in_microseconds_without_opens_is_critical_high() {
        let o = watched().forked().cuinit(3, 0.00002);
        // On the HMM-risky host too: error 3 in the child is not the HMM failure.
        let fs = diagnose_spec(&incident_spec(), &o);
        assert_eq!(fs[0].rule, "fork_after_init");
        let f = expect(&fs, "fork_after_init", Severity::Critical, Confidence::High);
        evidence_from(f, "process", "probe:fork");
        evidence_from(f, "cuInit returned", "probe:cuInit");
        assert!(evidence_from(f, "device opens", "probe:openat").starts_with("none"));
        assert!(f.fix.iter().all(|s| s.where_ == Where::Container));
        at_most(&fs, "hmm_setup_failure", Severity::Warning);
    }

    #[test]
    fn fork_after_init_not_for_a_fork_with_device_opens() {
        let o = watched().forked().cuinit(3, 0.2).opens(3);
        absent(
            &diagnose_spec(&SnapshotSpec::default(), &o),
            "fork_after_init",
        );
    }

    #[test]
    fn fork_after_init_not_without_a_fork_nor_when_the_child_succeeds_or_an_open_failed() {
        let e = SnapshotSpec::default();
        absent(
            &diagnose_spec(&e, &watched().cuinit(3, 0.00002)),
            "fork_after_init",
        );
        absent(
            &diagnose_spec(&e, &watched().forked().cuinit(0, 0.2).opens(4)),
            "fork_after_init",
        );
        let denied = watched()
            .forked()
            .cuinit(3, 0.001)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        absent(&diagnose_spec(&e, &denied), "fork_after_init");
    }

    #[test]
    fn fork_after_init_slow_or_with_blind_opens_is_only_medium() {
        let blind = watched()
            .forked()
            .cuinit(3, 0.00002)
            .unavailable("syscalls:sys_exit_openat: tracefs not mounted");
        let fs = diagnose_spec(&SnapshotSpec::default(), &blind);
        let f = expect(
            &fs,
            "fork_after_init",
            Severity::Critical,
            Confidence::Medium,
        );
        assert!(unchecked_mentions(f, "device opens not seen"));
    }
}

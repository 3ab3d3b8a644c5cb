//! Rule `policy_or_partition`: compute mode or MIG refuses the work (one row of
//! `shared/reference/failure-classes.md`); [`check`] says when it applies, and its tests
//! go from evidence built in code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{cu, finding, host_only_note, item, observed, push_cuinit, smi, step, unknown};

/// Policy or partition: CUDA starts but the GPU refuses the work: a compute mode of
/// `Prohibited` or `Exclusive_Process` held by another process (CUDA error 46), or MIG on
/// with no MIG device visible to CUDA (`cuInit` 100 with every open succeeding). Static
/// only for `Prohibited`: an exclusive GPU held by one process, or MIG on, is a deliberate
/// set-up until something fails.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
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
    // A GPU without MIG prints `N/A`: no fact, so not cited.
    let mig: Vec<&str> = s
        .map(|s| {
            s.mig_mode
                .iter()
                .map(String::as_str)
                .filter(|m| *m != "N/A")
                .collect()
        })
        .unwrap_or_default();
    if !mig.is_empty() {
        f.evidence
            .push(item("MIG mode", mig.join(", "), e.smi.source.clone()));
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

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn policy_or_partition_exclusive_mode_46() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Exclusive_Process".into()]);
        let o = watched().cuinit(46, 0.2).opens(4);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-smi -c DEFAULT"));
    }

    #[test]
    fn policy_or_partition_mig_without_instances_100() {
        let e = healthy_open_host().smi(|s| s.mig_mode = vec!["Enabled".into()]);
        let o = watched().cuinit(100, 0.2).opens(3);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 100 with a missing node is the missing node, not MIG.
        let missing = watched()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        assert_eq!(run("policy_or_partition", &e, &missing), None);
        // MIG on, nothing failing: a deliberate set-up.
        assert_eq!(run("policy_or_partition", &e, &plain()), None);
    }

    #[test]
    fn policy_or_partition_prohibited_compute_mode_static() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Prohibited".into()]);
        let f = run("policy_or_partition", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 46 with Default compute mode: not policy (memory pressure, other causes).
        let o = watched().cuinit(46, 0.2).opens(4);
        assert_eq!(run("policy_or_partition", &healthy_open_host(), &o), None);
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn policy_or_partition_exclusive_process_46_with_another_holder_is_critical_high() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
            processes: vec![
                ProcessSpec::python3(5151, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
                ProcessSpec::python3(PID, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
            ],
            ..SnapshotSpec::default()
        };
        let e = snapshot_evidence(&spec);
        let fs = diagnose(&e, &watched().cuinit(46, 0.2).opens(4));
        let f = expect(
            &fs,
            "policy_or_partition",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "compute mode", "nvidia-smi -q"),
            "Exclusive_Process, Exclusive_Process"
        );
        assert_eq!(
            evidence_from(f, "other CUDA processes (pid)", &e.libcuda.source),
            "5151"
        );
        assert!(has_fix(f, Where::Host, "nvidia-smi -c DEFAULT"));
    }

    #[test]
    fn policy_or_partition_mig_on_and_cuinit_100_with_every_open_succeeding_is_critical_medium() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &watched().cuinit(100, 0.2).opens(3));
        let f = expect(
            &fs,
            "policy_or_partition",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "MIG mode", "nvidia-smi -q"),
            "Enabled, Enabled"
        );
        assert!(has_fix(f, Where::Container, "nvidia-smi -L"));
    }

    #[test]
    fn policy_or_partition_prohibited_compute_mode_from_static_evidence() {
        let all = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Prohibited".into()),
            ..SnapshotSpec::default()
        };
        expect(
            &diagnose_spec(&all, &plain()),
            "policy_or_partition",
            Severity::Critical,
            Confidence::Medium,
        );
        // Prohibited on one GPU of two: the other still works, a warning.
        let one = SnapshotSpec {
            smi: Some(smi_q(
                DRIVER,
                &[SmiGpu::h200(0), {
                    let mut g = SmiGpu::h200(1);
                    g.compute_mode = "Prohibited".into();
                    g
                }],
            )),
            ..SnapshotSpec::default()
        };
        expect(
            &diagnose_spec(&one, &plain()),
            "policy_or_partition",
            Severity::Warning,
            Confidence::Medium,
        );
    }

    #[test]
    fn policy_or_partition_mig_on_without_a_failure_is_not_policy_or_partition() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&spec, &plain()), "policy_or_partition");
        absent(
            &diagnose_spec(&spec, &watched().cuinit(0, 0.3).opens(4)),
            "policy_or_partition",
        );
        // Exclusive mode held by one process is a deliberate set-up until something fails.
        let exclusive = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&exclusive, &plain()), "policy_or_partition");
    }

    #[test]
    fn policy_or_partition_not_for_100_with_a_missing_node_or_46_in_default_compute_mode() {
        let mig = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            nodes: nodes_without("/dev/nvidia-uvm"),
            ..SnapshotSpec::default()
        };
        let missing = watched()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let fs = diagnose_spec(&mig, &missing);
        absent(&fs, "policy_or_partition");
        expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::High,
        );
        // 46 with compute mode Default: memory pressure or another cause, not policy.
        absent(
            &diagnose_spec(
                &SnapshotSpec::default(),
                &watched().cuinit(46, 0.2).opens(4),
            ),
            "policy_or_partition",
        );
    }
}

//! Rule `slow_init`: cuInit succeeds but takes seconds (one row of
//! `shared/reference/failure-classes.md`); [`check`] says when it applies, and its tests
//! go from evidence built in code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{
    cu, finding, host_daemon, host_only_note, is_gpu_node, item, push_cuinit, smi, step, unknown,
};

/// Slow-init threshold: this many seconds, plus [`SLOW_INIT_PER_GPU_SECONDS`] per GPU (a
/// heuristic: `cuInit` on a host with persistence takes well under a second; without it each
/// GPU is brought up on first open).
const SLOW_INIT_BASE_SECONDS: f64 = 2.0;

/// See [`SLOW_INIT_BASE_SECONDS`].
const SLOW_INIT_PER_GPU_SECONDS: f64 = 0.5;

/// Slow init: `cuInit` returned 0 but took far longer than it should: above
/// [`SLOW_INIT_BASE_SECONDS`] + [`SLOW_INIT_PER_GPU_SECONDS`] per GPU. Persistence mode off
/// (or no `nvidia-persistenced`) explains it. Never fires for a failed `cuInit`.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
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

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn slow_init_with_persistence_off() {
        let e = healthy_open_host().smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        let o = watched().cuinit(0, 9.5).opens(4);
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
            run("slow_init", &e, &watched().cuinit(0, 0.3).opens(4)),
            None
        );
        assert_eq!(
            run("slow_init", &e, &watched().cuinit(3, 9.5).opens(4)),
            None
        );
        assert_eq!(run("slow_init", &e, &plain()), None);
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    fn persistence_off() -> SnapshotSpec {
        SnapshotSpec {
            smi: smi_h200(2, |g| g.persistence_mode = "Disabled".into()),
            daemons: Vec::new(),
            ..SnapshotSpec::default()
        }
    }

    #[test]
    fn slow_init_9_seconds_with_persistence_off_is_info_medium() {
        let e = snapshot_evidence(&persistence_off());
        let fs = diagnose(&e, &watched().cuinit(0, 9.5).opens(4));
        assert_eq!(rules_of(&fs), ["slow_init"]);
        let f = expect(&fs, "slow_init", Severity::Info, Confidence::Medium);
        assert!(evidence_from(f, "persistence mode", "nvidia-smi -q").starts_with("Disabled on 2"));
        assert_eq!(
            evidence_from(f, "nvidia-persistenced", &e.daemons.source),
            "not running"
        );
        evidence_from(f, "cuInit returned", "probe:cuInit");
        assert!(has_fix(f, Where::Host, "nvidia-persistenced"));
    }

    #[test]
    fn slow_init_with_persistence_on_is_info_low() {
        let fs = diagnose_spec(&SnapshotSpec::default(), &watched().cuinit(0, 9.5).opens(4));
        let f = expect(&fs, "slow_init", Severity::Info, Confidence::Low);
        assert!(unchecked_mentions(f, "no baseline"));
    }

    #[test]
    fn slow_init_threshold_grows_with_the_gpu_count() {
        let o = watched().cuinit(0, 2.8).opens(3);
        // Two GPUs: 2 s + 0.5 s each = 3 s; 2.8 s is fine.
        absent(&diagnose_spec(&persistence_off(), &o), "slow_init");
        // The same 2.8 s on one GPU (2.5 s) is slow.
        let one = SnapshotSpec {
            smi: smi_h200(1, |g| g.persistence_mode = "Disabled".into()),
            nodes: standard_nodes(1, 508),
            ..persistence_off()
        };
        expect(
            &diagnose_spec(&one, &o),
            "slow_init",
            Severity::Info,
            Confidence::Medium,
        );
    }

    #[test]
    fn slow_init_not_for_a_failed_cuinit_a_fast_one_or_a_plain_doctor() {
        // A failed cuInit is not slow_init, however long it took.
        absent(
            &diagnose_spec(&persistence_off(), &watched().cuinit(3, 9.5).opens(4)),
            "slow_init",
        );
        absent(
            &diagnose_spec(&persistence_off(), &watched().cuinit(999, 9.5).opens(4)),
            "slow_init",
        );
        absent(
            &diagnose_spec(&persistence_off(), &watched().cuinit(0, 0.3).opens(4)),
            "slow_init",
        );
        absent(&diagnose_spec(&persistence_off(), &plain()), "slow_init");
        // Still running is a hang question, not slow init.
        absent(
            &diagnose_spec(&persistence_off(), &watched().in_flight(9.5).opens(4)),
            "slow_init",
        );
    }
}

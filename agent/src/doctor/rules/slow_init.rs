//! Rule `slow_init`: cuInit succeeds but takes seconds (one row of the rules table in
//! `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in code
//! to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, FixStep, Severity, Where};
use super::super::root::timed_out;
use super::{
    against, cu, finding, host_daemon, host_only_note, is_gpu_node, item, observed, push_cuinit,
    smi, step, unknown, SRC_OPENAT,
};

/// Slow-init threshold: this many seconds, plus [`SLOW_INIT_PER_GPU_SECONDS`] per GPU (a
/// heuristic: `cuInit` on a host with persistence takes well under a second; without it each
/// GPU is brought up on first open). The live agent judges a successful `cuInit` only when
/// it took at least this long.
pub const SLOW_INIT_BASE_SECONDS: f64 = 2.0;

/// See [`SLOW_INIT_BASE_SECONDS`].
const SLOW_INIT_PER_GPU_SECONDS: f64 = 0.5;

/// A first open of a GPU node (`/dev/nvidia<N>`) this long brought the GPU up: without
/// persistence the driver initializes the GPU in the first open after the last close
/// (NVIDIA driver persistence documentation). With persistence it takes milliseconds. The
/// live agent also judges a successful `cuInit` whose first GPU open took this long.
pub const SLOW_FIRST_OPEN_SECONDS: f64 = 1.0;

/// Slow init: `cuInit` succeeds but slowly.
///
/// Observed (a `cuInit` that returned 0): its duration above [`SLOW_INIT_BASE_SECONDS`] +
/// [`SLOW_INIT_PER_GPU_SECONDS`] per GPU, or a first GPU-node open of at least
/// [`SLOW_FIRST_OPEN_SECONDS`] (`probe:openat`); persistence mode off or no
/// `nvidia-persistenced` explains it. Static (no process observed): persistence mode
/// `Disabled` (`nvidia-smi -q`) with no `nvidia-persistenced` running (an info), or an
/// `nvidia-smi -q` that did not answer in time (a warning: the driver is slow to bring the
/// GPUs up, or hung). Never fires for a failed or still running `cuInit`.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result == Some(cu::SUCCESS) && !o.cuinit_in_flight {
        return observed_slow(e, o);
    }
    if observed(o) {
        // A failed or running cuInit: another class's question.
        return None;
    }
    smi_timed_out(e).or_else(|| persistence_off(e))
}

/// A `cuInit` seen returning 0, slowly.
fn observed_slow(e: &Evidence, o: &Observations) -> Option<Finding> {
    let secs = o.cuinit_seconds?;
    let gpus = gpu_count(e).unwrap_or(1);
    let threshold = SLOW_INIT_BASE_SECONDS + SLOW_INIT_PER_GPU_SECONDS * f64::from(gpus);
    let slow_total = secs >= threshold;
    let slow_open = o
        .first_gpu_open_seconds
        .filter(|s| *s >= SLOW_FIRST_OPEN_SECONDS);
    if !slow_total && slow_open.is_none() {
        return None;
    }
    let off = persistence_off_gpus(e);
    let daemon = host_daemon(e, "nvidia-persistenced");
    let explained = off.is_some() || daemon == Some(false);
    let confidence = match (slow_open.is_some(), explained) {
        (true, true) => Confidence::High,
        (true, false) | (false, true) => Confidence::Medium,
        (false, false) => Confidence::Low,
    };
    let title = match slow_open {
        Some(open) if !slow_total => format!(
            "cuInit succeeded, but its first GPU open took {open:.1} s: the GPU was brought up \
             in it"
        ),
        _ => format!("cuInit succeeded but took {secs:.1} s ({gpus} GPU(s))"),
    };
    let mut f = finding("slow_init", Severity::Info, confidence, title);
    push_cuinit(&mut f, o);
    match o.first_gpu_open_seconds {
        Some(open) if open >= SLOW_FIRST_OPEN_SECONDS => f.evidence.push(item(
            "first GPU open",
            format!("{open:.3} s: the driver brought the GPU up in it"),
            SRC_OPENAT,
        )),
        Some(open) => f.evidence.push(against(
            "first GPU open",
            format!("{open:.3} s: the GPU was up already, the time went elsewhere"),
            SRC_OPENAT,
        )),
        None => f
            .unchecked
            .push("how long the first GPU-node open took (not seen)".into()),
    }
    push_persistence(&mut f, e, off, daemon);
    f.unchecked.push(format!(
        "no baseline of this host's cuInit latency: the threshold is {threshold:.1} s \
         ({SLOW_INIT_BASE_SECONDS} s + {SLOW_INIT_PER_GPU_SECONDS} s per GPU)"
    ));
    if let Some(s) = unknown(&e.smi, "persistence mode (nvidia-smi -q)") {
        f.unchecked.push(s);
    }
    f.fix = vec![persistenced_step(e)];
    if !explained && slow_open.is_none() {
        f.fix.push(step(
            Where::Any,
            "The GPUs were up already: look for the slow driver calls of this cuInit in \
             uvmwatch's log (event=driver_ioctl, \"slow driver call\"; --slow-ioctl sets the \
             threshold) or at the process's user-space stack while it starts.",
            &["journalctl -u uvmwatch -o cat | grep 'slow driver call' | tail"],
        ));
    }
    Some(f)
}

/// Static: persistence mode off on some GPU and no `nvidia-persistenced` running.
fn persistence_off(e: &Evidence) -> Option<Finding> {
    let off = persistence_off_gpus(e)?;
    let daemon = host_daemon(e, "nvidia-persistenced");
    let confidence = match daemon {
        Some(true) => return None,
        Some(false) => Confidence::Medium,
        // In a container: the host's processes cannot be seen.
        None => Confidence::Low,
    };
    let mut f = finding(
        "slow_init",
        Severity::Info,
        confidence,
        format!(
            "persistence mode is off on {off} GPU(s) and nvidia-persistenced is not running: \
             every CUDA start brings the GPUs up again"
        ),
    );
    push_persistence(&mut f, e, Some(off), daemon);
    if daemon.is_none() {
        f.unchecked.push(
            "whether nvidia-persistenced runs on the host (a container does not see the \
             host's processes)"
                .into(),
        );
    }
    f.unchecked.push(
        "no cuInit observed: how long start-up takes here (run `uvmwatch doctor --probe`)".into(),
    );
    f.fix = vec![persistenced_step(e)];
    Some(f)
}

/// Static: `nvidia-smi -q` did not answer within the collector's time limit.
fn smi_timed_out(e: &Evidence) -> Option<Finding> {
    let why = e.smi.value.as_ref().err().filter(|u| timed_out(&u.why))?;
    let mut f = finding(
        "slow_init",
        Severity::Warning,
        Confidence::Low,
        "nvidia-smi -q did not answer in time: the driver is slow to bring the GPUs up, or hung"
            .to_string(),
    );
    f.evidence
        .push(item("nvidia-smi", why.why.clone(), e.smi.source.clone()));
    match host_daemon(e, "nvidia-persistenced") {
        Some(false) => f.evidence.push(item(
            "nvidia-persistenced",
            "not running: each client brings the GPUs up again",
            e.daemons.source.clone(),
        )),
        Some(true) => f.evidence.push(against(
            "nvidia-persistenced",
            "running: the GPUs should stay up, so a hang is more likely",
            e.daemons.source.clone(),
        )),
        None => {}
    }
    f.unchecked.push(
        "persistence mode and GPU state (nvidia-smi gave no output): whether it is slow or \
         hung"
            .into(),
    );
    f.fix = vec![
        step(
            Where::Host,
            "Is a thread stuck in the driver (state D, wchan in nvidia code)? Then it is a \
             hang: see docs/runbooks/driver_hang.md.",
            &[
                "ps -eo pid,stat,wchan:32,etime,cmd | awk '$2 ~ /D/'",
                "sudo dmesg -T | grep -iE 'NVRM|Xid|hung_task|soft lockup'",
                "time nvidia-smi -L",
            ],
        ),
        persistenced_step(e),
    ];
    Some(f)
}

/// Number of GPUs whose persistence mode is `Disabled`, when any.
fn persistence_off_gpus(e: &Evidence) -> Option<usize> {
    smi(e)
        .map(|s| {
            s.persistence_mode
                .iter()
                .filter(|m| *m == "Disabled")
                .count()
        })
        .filter(|n| *n > 0)
}

/// The persistence facts: support when they explain a slow start, `against:` when not.
fn push_persistence(f: &mut Finding, e: &Evidence, off: Option<usize>, daemon: Option<bool>) {
    match off {
        Some(n) => f.evidence.push(item(
            "persistence mode",
            format!("Disabled on {n} GPU(s): each GPU is brought up on first open"),
            e.smi.source.clone(),
        )),
        None if smi(e).is_some_and(|s| s.persistence_mode.iter().any(|m| m == "Enabled")) => {
            f.evidence.push(against(
                "persistence mode",
                "Enabled: the GPUs stay up between clients",
                e.smi.source.clone(),
            ))
        }
        None => {}
    }
    match daemon {
        Some(false) => f.evidence.push(item(
            "nvidia-persistenced",
            "not running",
            e.daemons.source.clone(),
        )),
        Some(true) => f.evidence.push(against(
            "nvidia-persistenced",
            "running",
            e.daemons.source.clone(),
        )),
        None => {}
    }
}

/// Run the persistence daemon.
fn persistenced_step(e: &Evidence) -> FixStep {
    step(
        Where::Host,
        format!(
            "Run the NVIDIA persistence daemon so the driver keeps GPU state between clients.{}",
            host_only_note(e)
        ),
        &[
            "sudo systemctl enable --now nvidia-persistenced",
            "nvidia-smi -q | grep -i 'persistence mode'",
        ],
    )
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
    fn slow_init_not_for_a_failed_cuinit_or_a_fast_one() {
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
        // Still running is a hang question, not slow init.
        absent(
            &diagnose_spec(&persistence_off(), &watched().in_flight(9.5).opens(4)),
            "slow_init",
        );
    }

    #[test]
    fn slow_init_first_gpu_open_of_seconds_with_persistence_off_is_info_high() {
        // cuInit under the threshold, but its first GPU open brought the GPU up.
        let o = watched()
            .cuinit(0, 2.1)
            .opens(4)
            .with(|o| o.first_gpu_open_seconds = Some(1.8));
        let fs = diagnose_spec(&persistence_off(), &o);
        let f = expect(&fs, "slow_init", Severity::Info, Confidence::High);
        assert!(f.title.contains("first GPU open took 1.8 s"), "{}", f.title);
        assert!(evidence_from(f, "first GPU open", "probe:openat").starts_with("1.800 s"));
        assert_eq!(f.basis, crate::doctor::finding::Basis::Observed);
        // Near miss: a fast first open and a fast cuInit are no slow start.
        let fast = watched()
            .cuinit(0, 2.1)
            .opens(4)
            .with(|o| o.first_gpu_open_seconds = Some(0.004));
        absent(&diagnose_spec(&persistence_off(), &fast), "slow_init");
    }

    #[test]
    fn slow_init_slow_cuinit_with_a_fast_first_open_says_the_gpus_were_up() {
        let o = watched()
            .cuinit(0, 9.5)
            .opens(4)
            .with(|o| o.first_gpu_open_seconds = Some(0.004));
        let fs = diagnose_spec(&SnapshotSpec::default(), &o);
        let f = expect(&fs, "slow_init", Severity::Info, Confidence::Low);
        assert!(evidence_from(f, "first GPU open", "probe:openat").starts_with("against: "));
        assert!(has_fix(f, Where::Any, "slow driver call"));
    }

    #[test]
    fn slow_init_static_persistence_off_without_the_daemon_is_info_medium() {
        let fs = diagnose_spec(&persistence_off(), &plain());
        assert_eq!(rules_of(&fs), ["slow_init"]);
        let f = expect(&fs, "slow_init", Severity::Info, Confidence::Medium);
        assert_eq!(f.basis, crate::doctor::finding::Basis::Static);
        assert!(evidence_from(f, "persistence mode", "nvidia-smi -q").starts_with("Disabled on 2"));
        assert!(unchecked_mentions(f, "no cuInit observed"));
        assert!(has_fix(
            f,
            Where::Host,
            "systemctl enable --now nvidia-persistenced"
        ));
        // Near miss: persistence off but the daemon runs (it keeps the GPUs up), or on.
        let daemon = SnapshotSpec {
            daemons: vec!["nvidia-persistenced".into()],
            ..persistence_off()
        };
        absent(&diagnose_spec(&daemon, &plain()), "slow_init");
        absent(
            &diagnose_spec(&SnapshotSpec::default(), &plain()),
            "slow_init",
        );
    }

    /// A snapshot whose `nvidia-smi -q` ended with `error` (no output captured).
    fn smi_error(error: &str) -> crate::doctor::facts::Evidence {
        let spec = SnapshotSpec {
            smi: None,
            ..SnapshotSpec::default()
        };
        snapshot_evidence_with(&spec, |dir| {
            let manifest = format!(r#"{{"command_errors": {{"nvidia-smi": {error}}}}}"#);
            std::fs::write(dir.join("manifest.json"), manifest).unwrap();
        })
    }

    #[test]
    fn slow_init_static_nvidia_smi_that_timed_out_is_a_warning() {
        let e = smi_error(r#"{"kind": "timed_out", "command": "nvidia-smi -q", "seconds": 10}"#);
        let fs = diagnose(&e, &plain());
        let f = expect(&fs, "slow_init", Severity::Warning, Confidence::Low);
        well_formed(f, "slow_init");
        assert!(evidence_from(f, "nvidia-smi", "nvidia-smi -q").starts_with("no answer:"));
        assert!(has_fix(f, Where::Host, "ps -eo pid,stat,wchan"));
        // Near miss: an nvidia-smi that failed or is not installed is no slow start.
        let failed = smi_error(
            r#"{"kind": "failed", "command": "nvidia-smi -q", "status": "exit status 9", "output": "NVIDIA-SMI has failed"}"#,
        );
        absent(&diagnose(&failed, &plain()), "slow_init");
        let missing = smi_error(r#"{"kind": "not_installed", "command": "nvidia-smi -q"}"#);
        absent(&diagnose(&missing, &plain()), "slow_init");
    }
}

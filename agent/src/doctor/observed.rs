//! What the probes saw, as `uvmwatch doctor` judges it: where the observations came from
//! ([`ObservationsSource`]: `--probe`, a snapshot's `observations.json`, or none), the one
//! line the report says about them ([`ObservationsSource::summary`]), and the diagnosis
//! itself ([`judge`]): the rules, plus [`UNEXPLAINED`] when the observations record a
//! failure that no finding explains, so that a report never says "healthy" over an observed
//! failure.

use serde::Serialize;

use super::bundle::SavedObservations;
use super::facts::{Evidence, Observations, SeenCall};
use super::finding::{Basis, Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use super::root::OBSERVATIONS_FILE;
use super::rules::{self, SRC_CUINIT, SRC_FORK, SRC_IOCTL, SRC_KPROBE, SRC_OPENAT};
use crate::decode::nvidia::cu_result_name;

/// Id (and runbook name) of the finding [`judge`] adds for a failure no rule explains. Not
/// a rule of [`rules::RULES`]: it names no cause.
pub const UNEXPLAINED: &str = "unexplained_failure";

/// Where the observations a diagnosis judged came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// None: only the static facts were judged.
    None,
    /// `uvmwatch doctor --probe`, on this machine.
    Probe,
    /// The snapshot's `observations.json`.
    Snapshot,
}

/// The snapshot's `observations.json`, when it has one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotFile {
    /// Its path in the snapshot: `observations.json`.
    pub path: String,
    /// The schema version it declares (1 without a `format` field); `null` when it could
    /// not be read.
    pub format: Option<u32>,
    /// Whether its observations were judged.
    pub used: bool,
    /// Why it could not be read or was refused; `null` when it was read.
    pub error: Option<String>,
    /// Its fields this uvmwatch does not know (ignored), as dotted paths.
    pub ignored_fields: Vec<String>,
}

/// Where the observations of a diagnosis came from, and what became of the snapshot's
/// `observations.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservationsSource {
    /// Where the observations judged came from.
    pub from: Origin,
    /// The snapshot's `observations.json`; `None` when there is no snapshot or it has none.
    pub snapshot_file: Option<SnapshotFile>,
}

impl ObservationsSource {
    /// A plain diagnosis of this machine: no observations.
    pub fn none() -> Self {
        ObservationsSource {
            from: Origin::None,
            snapshot_file: None,
        }
    }

    /// Picks the observations to judge: those of `--probe` when it ran (the snapshot's file
    /// is then reported but not used), else the snapshot's `observations.json` when it has a
    /// readable one, else none. `saved` is what reading the snapshot's file gave (`None`
    /// without a snapshot or without the file).
    pub fn choose(
        probed: Option<Observations>,
        saved: Option<anyhow::Result<SavedObservations>>,
    ) -> (Observations, ObservationsSource) {
        let file = |format, used, error, ignored_fields| SnapshotFile {
            path: OBSERVATIONS_FILE.to_string(),
            format,
            used,
            error,
            ignored_fields,
        };
        let snapshot_file = saved.as_ref().map(|s| match s {
            Ok(s) => file(
                Some(s.format),
                probed.is_none(),
                None,
                s.ignored_fields.clone(),
            ),
            Err(e) => file(None, false, Some(format!("{e:#}")), Vec::new()),
        });
        match (probed, saved) {
            (Some(o), _) => (
                o,
                ObservationsSource {
                    from: Origin::Probe,
                    snapshot_file,
                },
            ),
            (None, Some(Ok(s))) => (
                s.observations,
                ObservationsSource {
                    from: Origin::Snapshot,
                    snapshot_file,
                },
            ),
            (None, _) => (
                Observations::default(),
                ObservationsSource {
                    from: Origin::None,
                    snapshot_file,
                },
            ),
        }
    }

    /// The observations a bundle written by this run keeps as its `observations.json`: those
    /// judged (`o`), when there were any (`--probe`, or the snapshot's own file); `None`
    /// otherwise, so a plain run writes no file.
    pub fn kept_in_bundle<'a>(&self, o: &'a Observations) -> Option<&'a Observations> {
        (self.from != Origin::None).then_some(o)
    }

    /// The snapshot's `observations.json` exists but could not be used, and nothing else
    /// was observed: the diagnosis is incomplete (status `unknown`, exit code 3 unless a
    /// finding is critical).
    pub fn incomplete(&self) -> bool {
        self.from == Origin::None
            && self
                .snapshot_file
                .as_ref()
                .is_some_and(|f| f.error.is_some())
    }

    /// The report's line about the observations `o` (those this source gave), e.g. "judged
    /// with the probes' observations of pid 4242 (cuInit returned 3 ...), from the
    /// snapshot's observations.json (format 1)", or "only static facts were judged (no
    /// probe observations)". A second sentence names what became of a snapshot file not
    /// used, and fields it had that were ignored.
    pub fn summary(&self, o: &Observations) -> String {
        let mut out = match self.from {
            Origin::None => match self.snapshot_file.as_ref().and_then(|f| f.error.as_ref()) {
                Some(e) => {
                    format!(
                        "only static facts were judged: the snapshot's {OBSERVATIONS_FILE} \
                         could not be used ({e})"
                    )
                }
                None => "only static facts were judged (no probe observations)".to_string(),
            },
            Origin::Snapshot if is_empty(o) => format!(
                "only static facts were judged: the snapshot's {OBSERVATIONS_FILE} records no \
                 process"
            ),
            Origin::Probe | Origin::Snapshot => {
                let whose = match o.pid {
                    Some(pid) => format!("of pid {pid}"),
                    None => "of no process".to_string(),
                };
                let from = match self.from {
                    Origin::Probe => "from --probe on this machine".to_string(),
                    _ => format!(
                        "from the snapshot's {OBSERVATIONS_FILE} (format {})",
                        self.snapshot_file
                            .as_ref()
                            .and_then(|f| f.format)
                            .unwrap_or(1)
                    ),
                };
                format!(
                    "judged with the probes' observations {whose} ({}), {from}",
                    seen_parts(o).join(", ")
                )
            }
        };
        if let Some(f) = &self.snapshot_file {
            if self.from == Origin::Probe {
                match &f.error {
                    Some(e) => out.push_str(&format!(
                        "; the snapshot's {OBSERVATIONS_FILE} ({e}) was not used"
                    )),
                    None => out.push_str(&format!(
                        "; the snapshot's {OBSERVATIONS_FILE} was not used: --probe watched \
                         this machine instead"
                    )),
                }
            }
            if !f.ignored_fields.is_empty() {
                out.push_str(&format!(
                    "; fields of {OBSERVATIONS_FILE} this uvmwatch does not know were ignored: {}",
                    f.ignored_fields.join(", ")
                ));
            }
        }
        out
    }
}

/// Nothing observed at all (the observations of a plain `doctor`).
fn is_empty(o: &Observations) -> bool {
    *o == Observations::default()
}

/// The observations in short phrases, for [`ObservationsSource::summary`].
fn seen_parts(o: &Observations) -> Vec<String> {
    let mut parts = Vec::new();
    match (o.cuinit_result, o.cuinit_in_flight) {
        (_, true) => parts.push(format!("cuInit still running{}", secs(o.cuinit_seconds))),
        (Some(r), false) => parts.push(format!(
            "cuInit returned {r} ({}){}",
            cu_result_name(r),
            secs(o.cuinit_seconds)
        )),
        (None, false) => parts.push("cuInit result not seen".to_string()),
    }
    if let Some(c) = &o.stuck_in {
        let state = o
            .stuck_state
            .as_ref()
            .map(|s| format!(", thread {s}"))
            .unwrap_or_default();
        let wchan = o
            .stuck_wchan
            .as_ref()
            .map(|w| format!(", wchan {w}"))
            .unwrap_or_default();
        parts.push(format!(
            "stuck in {} for {:.1} s{state}{wchan}",
            c.what(),
            c.seconds
        ));
    }
    if let Some(c) = &o.failed_call {
        parts.push(format!("failed call {} -> {}", c.what(), c.result));
    }
    if !o.failed_opens.is_empty() {
        let list: Vec<String> = o
            .failed_opens
            .iter()
            .take(3)
            .map(|(p, e)| format!("{p}: {e}"))
            .collect();
        let more = o.failed_opens.len().saturating_sub(3);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        parts.push(format!("failed opens {}{more}", list.join(", ")));
    }
    parts.push(format!("{} device opens", o.device_opens));
    if o.forked_after_parent_init {
        parts.push("forked after its parent's cuInit".to_string());
    }
    if !o.kernel_signals.is_empty() {
        parts.push(format!("{} kernel signals", o.kernel_signals.len()));
    }
    if !o.unavailable_probes.is_empty() {
        parts.push(format!("{} probes unavailable", o.unavailable_probes.len()));
    }
    parts
}

fn secs(s: Option<f64>) -> String {
    s.map(|s| format!(" after {s:.2} s")).unwrap_or_default()
}

/// The failure the observations record, if any, with its severity: a `cuInit` that
/// returned non-zero, still ran, or a driver call it was stuck in, or a CUDA context or
/// device call that failed (critical: CUDA cannot start, hangs or refuses the work);
/// otherwise a failed open of a device node, or a failed driver call outside a `cuInit` seen
/// returning 0 (warning). A failed driver call inside a `cuInit` that returned 0 is no
/// failure: the library went on past it (an RM control that fails on the way to a working
/// start, as `docs/probes.md#late-cuinit` reads one).
pub fn observed_failure(o: &Observations) -> Option<(Severity, String)> {
    if let Some(c) = &o.stuck_in {
        return Some((
            Severity::Critical,
            format!("stuck in {} for {:.1} s", c.what(), c.seconds),
        ));
    }
    if o.cuinit_in_flight {
        return Some((
            Severity::Critical,
            format!("cuInit still running{}", secs(o.cuinit_seconds)),
        ));
    }
    if let Some(r) = o.cuinit_result.filter(|r| *r != 0) {
        return Some((
            Severity::Critical,
            format!("cuInit returned {r} ({})", cu_result_name(r)),
        ));
    }
    if let (Some(call), Some(r)) = (&o.context_call, o.context_result.filter(|r| *r != 0)) {
        return Some((
            Severity::Critical,
            format!("{call} returned {r} ({})", cu_result_name(r)),
        ));
    }
    if let Some((path, errno)) = o.failed_opens.first() {
        return Some((
            Severity::Warning,
            format!("open of {path} failed ({errno})"),
        ));
    }
    // A failed driver call inside a cuInit that returned 0 was tolerated by the library
    // (NVIDIA's libcuda retries or skips some RM controls): no failure. One seen outside a
    // cuInit, or in one whose end was not seen, is.
    let c = o
        .failed_call
        .as_ref()
        .filter(|c| !c.result.is_empty() && o.cuinit_result != Some(0))?;
    Some((
        Severity::Warning,
        format!("{} failed ({})", c.what(), c.result),
    ))
}

/// Whether a finding explains what the probes saw: it is a warning or worse and cites an
/// observation (a `probe:` source).
fn explains(f: &Finding) -> bool {
    f.severity >= Severity::Warning && f.basis == Basis::Observed
}

/// The diagnosis `uvmwatch doctor` reports: the findings of [`rules::diagnose`], plus, when
/// the observations record a failure ([`observed_failure`]) that no finding explains (no
/// finding of warning or worse cites an observation), an [`UNEXPLAINED`] finding (critical
/// for a failed or hung `cuInit`, warning for a failed open), placed worst first.
pub fn judge(e: &Evidence, o: &Observations) -> Vec<Finding> {
    let mut findings = rules::diagnose(e, o);
    if let Some((severity, what)) = observed_failure(o) {
        if !findings.iter().any(explains) {
            let f = unexplained(o, severity, &what);
            // After every observed finding at least as bad (a named cause comes first),
            // before static risks of its severity ([`rules::rank`]).
            let at = findings
                .iter()
                .position(|x| {
                    x.severity < severity || (x.severity == severity && x.basis == Basis::Static)
                })
                .unwrap_or(findings.len());
            findings.insert(at, f);
        }
    }
    findings
}

fn item(what: &str, value: impl Into<String>, source: impl Into<String>) -> EvidenceItem {
    EvidenceItem {
        what: what.to_string(),
        value: value.into(),
        source: source.into(),
    }
}

fn call_text(c: &SeenCall) -> String {
    if c.result.is_empty() {
        format!("{}, in flight for {:.1} s", c.what(), c.seconds)
    } else {
        format!("{} -> {} ({:.3} s)", c.what(), c.result, c.seconds)
    }
}

/// The [`UNEXPLAINED`] finding: every observation as evidence, the probes that were missing,
/// and how to learn more.
fn unexplained(o: &Observations, severity: Severity, what: &str) -> Finding {
    let mut evidence = Vec::new();
    if let Some(r) = o.cuinit_result {
        evidence.push(item(
            "cuInit returned",
            format!("{r} ({}){}", cu_result_name(r), secs(o.cuinit_seconds)),
            SRC_CUINIT,
        ));
    } else if o.cuinit_in_flight {
        evidence.push(item(
            "cuInit",
            format!("still running{}", secs(o.cuinit_seconds)),
            SRC_CUINIT,
        ));
    }
    let proc_of = |file: &str| format!("{}/{file}", o.stuck_thread_dir());
    if let Some(c) = &o.stuck_in {
        evidence.push(item("call in flight", call_text(c), SRC_IOCTL));
    }
    if let Some(s) = &o.stuck_state {
        evidence.push(item("thread state", s.clone(), proc_of("stat")));
    }
    if let Some(w) = &o.stuck_wchan {
        evidence.push(item("wchan", w.clone(), proc_of("wchan")));
    }
    if let Some(c) = &o.failed_call {
        evidence.push(item("failed driver call", call_text(c), SRC_IOCTL));
    }
    if let (Some(call), Some(r)) = (&o.context_call, o.context_result) {
        evidence.push(item(
            call,
            format!("{r} ({}){}", cu_result_name(r), secs(o.context_seconds)),
            format!("probe:{call}"),
        ));
    }
    for (path, errno) in &o.failed_opens {
        evidence.push(item("open", format!("{path}: {errno}"), SRC_OPENAT));
    }
    evidence.push(item(
        "device opens",
        format!("{} succeeded", o.device_opens),
        SRC_OPENAT,
    ));
    if o.forked_after_parent_init {
        evidence.push(item(
            "process",
            "forked without exec after its parent's cuInit",
            SRC_FORK,
        ));
    }
    for s in &o.kernel_signals {
        evidence.push(item("kernel signal", s.clone(), SRC_KPROBE));
    }
    let mut unchecked = vec![
        "no rule matched these observations: the cause is none of the known classes, or a \
         signal its rule needs was not seen"
            .to_string(),
    ];
    unchecked.extend(
        o.unavailable_probes
            .iter()
            .map(|p| format!("probe not attached: {p}")),
    );
    Finding {
        rule: UNEXPLAINED.to_string(),
        basis: Basis::Observed,
        title: format!("a failure was observed that no rule explains: {what}"),
        severity,
        confidence: Confidence::Low,
        evidence,
        unchecked,
        fix: vec![
            FixStep {
                where_: Where::Host,
                commands: vec![
                    "echo 1 | sudo tee /sys/module/nvidia_uvm/parameters/uvm_debug_prints"
                        .to_string(),
                    "sudo dmesg -T | grep -i -e NVRM -e nvidia-uvm | tail -50".to_string(),
                    "echo 0 | sudo tee /sys/module/nvidia_uvm/parameters/uvm_debug_prints"
                        .to_string(),
                ],
                note: "Make nvidia_uvm say why (the parameter is runtime-writable; needs \
                       root), run the CUDA program again, read the kernel log, then turn the \
                       prints off."
                    .to_string(),
            },
            FixStep {
                where_: Where::Any,
                commands: vec![
                    "sudo uvmwatch doctor --probe --bundle uvmwatch-doctor.tar.gz".to_string(),
                ],
                note: "On the failing machine, keep the facts and one observed cuInit \
                       together in a bundle, and attach it to the report."
                    .to_string(),
            },
        ],
        runbook: format!("docs/runbooks/{UNEXPLAINED}.md"),
        tell_apart: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    fn saved(o: Observations) -> Option<anyhow::Result<SavedObservations>> {
        Some(Ok(SavedObservations {
            observations: o,
            format: 1,
            ignored_fields: Vec::new(),
        }))
    }

    #[test]
    fn the_probe_wins_over_the_snapshot_file_and_says_so() {
        let (o, src) = ObservationsSource::choose(
            Some(register_gpu_no_memory()),
            saved(watched().cuinit(999, 0.1)),
        );
        assert_eq!(o, register_gpu_no_memory());
        assert_eq!(src.from, Origin::Probe);
        let f = src.snapshot_file.as_ref().unwrap();
        assert!(!f.used && f.error.is_none() && f.format == Some(1));
        let line = src.summary(&o);
        assert_eq!(
            line,
            "judged with the probes' observations of pid 4242 (cuInit returned 3 \
             (CUDA_ERROR_NOT_INITIALIZED) after 0.41 s, failed call UVM_REGISTER_GPU on \
             /dev/nvidia-uvm -> NV_ERR_NO_MEMORY, 4 device opens), from --probe on this \
             machine; the snapshot's observations.json was not used: --probe watched this \
             machine instead"
        );
        assert!(!src.incomplete());
    }

    #[test]
    fn the_snapshot_file_is_used_without_probe() {
        let stuck = watched().in_flight(31.0).stuck(
            "UVM_REGISTER_GPU",
            "/dev/nvidia-uvm",
            30.5,
            "D (disk sleep)",
        );
        let (o, src) = ObservationsSource::choose(None, saved(stuck.clone()));
        assert_eq!((o.clone(), src.from), (stuck, Origin::Snapshot));
        assert!(src.snapshot_file.as_ref().unwrap().used);
        assert_eq!(
            src.summary(&o),
            "judged with the probes' observations of pid 4242 (cuInit still running after \
             31.00 s, stuck in UVM_REGISTER_GPU on /dev/nvidia-uvm for 30.5 s, thread D (disk \
             sleep), 0 device opens), from the snapshot's observations.json (format 1)"
        );
        // A file that records nothing (a plain `doctor --bundle` of an older uvmwatch).
        let (o, src) = ObservationsSource::choose(None, saved(plain()));
        assert_eq!(
            src.summary(&o),
            "only static facts were judged: the snapshot's observations.json records no process"
        );
    }

    #[test]
    fn an_unusable_file_is_said_and_makes_the_diagnosis_incomplete() {
        let (o, src) =
            ObservationsSource::choose(None, Some(Err(anyhow::anyhow!("not valid JSON: x"))));
        assert_eq!(o, plain());
        assert!(src.incomplete());
        assert_eq!(
            src.summary(&o),
            "only static facts were judged: the snapshot's observations.json could not be used \
             (not valid JSON: x)"
        );
        let (_, src) = ObservationsSource::choose(None, None);
        assert!(!src.incomplete());
        assert_eq!(
            src.summary(&plain()),
            "only static facts were judged (no probe observations)"
        );
        // With --probe the bad file is only mentioned.
        let (o, src) = ObservationsSource::choose(
            Some(watched().cuinit(0, 0.3)),
            Some(Err(anyhow::anyhow!("format 7 is newer"))),
        );
        assert!(!src.incomplete());
        assert!(
            src.summary(&o)
                .ends_with("; the snapshot's observations.json (format 7 is newer) was not used"),
            "{}",
            src.summary(&o)
        );
    }

    #[test]
    fn ignored_fields_are_named() {
        let (o, src) = ObservationsSource::choose(
            None,
            Some(Ok(SavedObservations {
                observations: watched().cuinit(3, 0.4),
                format: 1,
                ignored_fields: vec!["context_create".into(), "stuck_in.tid".into()],
            })),
        );
        assert!(src.summary(&o).ends_with(
            "; fields of observations.json this uvmwatch does not know were ignored: \
             context_create, stuck_in.tid"
        ));
    }

    #[test]
    fn what_counts_as_an_observed_failure() {
        assert_eq!(observed_failure(&plain()), None);
        assert_eq!(observed_failure(&watched().cuinit(0, 0.2).opens(4)), None);
        // A failed driver call alone, cuInit fine: not a failure.
        let ok_with_failed_call = watched().cuinit(0, 0.2).failed_call(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            "NV_ERR_NOT_SUPPORTED",
        );
        assert_eq!(observed_failure(&ok_with_failed_call), None);
        assert_eq!(
            observed_failure(&watched().cuinit(999, 0.1)),
            Some((
                Severity::Critical,
                "cuInit returned 999 (CUDA_ERROR_UNKNOWN)".into()
            ))
        );
        assert_eq!(
            observed_failure(&watched().in_flight(12.0)).map(|f| f.0),
            Some(Severity::Critical)
        );
        assert_eq!(
            observed_failure(&watched().cuinit(0, 0.2).failed_open("/dev/nvidia3", "EIO")),
            Some((
                Severity::Warning,
                "open of /dev/nvidia3 failed (EIO)".into()
            ))
        );
    }

    #[test]
    fn a_failure_no_rule_explains_is_never_healthy() {
        // A healthy host, and a cuInit that returned 999 with every open fine: no rule
        // names a cause.
        let e = healthy_open_host();
        let o = watched().cuinit(999, 0.1).opens(4);
        assert!(rules::diagnose(&e, &o).is_empty());
        let findings = judge(&e, &o);
        assert_eq!(findings.len(), 1, "{findings:#?}");
        let f = &findings[0];
        assert_eq!(f.rule, UNEXPLAINED);
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(
            f.title,
            "a failure was observed that no rule explains: cuInit returned 999 \
             (CUDA_ERROR_UNKNOWN)"
        );
        assert!(f
            .evidence
            .iter()
            .any(|i| i.source == SRC_CUINIT && i.value.starts_with("999")));
        assert_eq!(f.runbook, "docs/runbooks/unexplained_failure.md");
        // Its runbook exists.
        let runbook = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(&f.runbook);
        assert!(runbook.exists(), "{}", runbook.display());

        // A failed open no rule knows, cuInit fine: a warning.
        let o = watched()
            .cuinit(0, 0.2)
            .opens(3)
            .failed_open("/dev/nvidia-uvm-tools", "EBUSY");
        assert!(rules::diagnose(&e, &o).iter().all(|f| !explains(f)));
        let findings = judge(&e, &o);
        let last = findings.last().unwrap();
        assert_eq!(
            (last.rule.as_str(), last.severity),
            (UNEXPLAINED, Severity::Warning)
        );
        assert_eq!(
            last.title,
            "a failure was observed that no rule explains: open of /dev/nvidia-uvm-tools \
             failed (EBUSY)"
        );
    }

    /// Every failed call the observations record counts: a context or device call, and a
    /// driver call outside a cuInit seen returning 0; near misses: the same calls that
    /// succeeded, and a failed driver call the cuInit went on past.
    #[test]
    fn every_recorded_failed_call_is_a_failure() {
        let e = healthy_open_host();
        // A failed cuCtxCreate_v2 (46) recorded in an observations file, cuInit fine.
        let o = watched()
            .cuinit(0, 0.2)
            .opens(4)
            .context("cuCtxCreate_v2", 46, 0.01);
        assert_eq!(
            observed_failure(&o),
            Some((
                Severity::Critical,
                "cuCtxCreate_v2 returned 46 (CUDA_ERROR_DEVICE_UNAVAILABLE)".into()
            ))
        );
        let findings = judge(&e, &o);
        assert!(!findings.is_empty(), "healthy over a failed cuCtxCreate_v2");
        assert!(findings[0].severity == Severity::Critical, "{findings:#?}");
        let u = findings.iter().find(|f| f.rule == UNEXPLAINED);
        if let Some(u) = u {
            assert!(u
                .evidence
                .iter()
                .any(|i| i.source == "probe:cuCtxCreate_v2" && i.value.starts_with("46")));
        }
        // Near miss: the same call succeeded.
        let o = watched()
            .cuinit(0, 0.2)
            .opens(4)
            .context("cuCtxCreate_v2", 0, 0.01);
        assert_eq!(observed_failure(&o), None);
        assert_eq!(judge(&e, &o), vec![]);

        // A failed driver call, no cuInit seen (the process's library was loaded before
        // the probes): a warning.
        let o = watched().failed_call("UVM_REGISTER_GPU", "", "NV_ERR_NO_MEMORY");
        assert_eq!(
            observed_failure(&o),
            Some((
                Severity::Warning,
                "UVM_REGISTER_GPU failed (NV_ERR_NO_MEMORY)".into()
            ))
        );
        assert!(judge(&e, &o)
            .iter()
            .any(|f| f.severity >= Severity::Warning));
        // Near miss: inside a cuInit that returned 0, the library went on past it.
        let o = watched().cuinit(0, 0.2).failed_call(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            "NV_ERR_INVALID_LOCK_STATE",
        );
        assert_eq!(observed_failure(&o), None);
    }

    #[test]
    fn an_explained_failure_gets_no_extra_finding() {
        let e = motivating_host();
        let o = register_gpu_no_memory();
        assert_eq!(judge(&e, &o), rules::diagnose(&e, &o));
        // A static warning alone does not explain an observed failure.
        let o = watched().cuinit(999, 0.1).opens(4);
        let findings = judge(&e, &o);
        assert!(
            findings.iter().any(|f| f.rule == UNEXPLAINED),
            "{findings:#?}"
        );
        // Worst first still.
        assert!(findings.windows(2).all(|w| w[0].severity >= w[1].severity));
    }
}

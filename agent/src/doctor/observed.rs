//! What the probes saw, as `uvmwatch doctor` judges it: where the observations came from
//! ([`ObservationsSource`]: `--probe`, a snapshot's `observations.json`, or none), and the
//! one line the report says about them ([`ObservationsSource::summary`]). The diagnosis
//! itself is the engine's (`engine.rs`).

use serde::Serialize;

use super::bundle::SavedObservations;
use super::facts::Observations;
use super::root::OBSERVATIONS_FILE;
use crate::decode::nvidia::cu_result_name;

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
}

//! What a rule concludes, and the one-line renderings of it that the log records and the
//! exporters carry ([`EvidenceItem::line`], [`FixStep::line`], [`Finding::evidence_text`],
//! [`Finding::fix_text`]). The text report of `uvmwatch doctor` lays a finding out on
//! several lines instead (`report.rs`).

use serde::{Deserialize, Serialize};

use super::cause::CauseId;
use super::signal::Sig;

/// How bad it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Informational (e.g. slow init that still works).
    Info,
    /// Degraded or at risk.
    Warning,
    /// CUDA cannot start or hangs.
    Critical,
}

impl Severity {
    /// Lower-case name, used as the `severity` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// How sure the rule is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// Signals consistent with the class but not specific to it.
    Low,
    /// Several specific signals.
    Medium,
    /// The class's defining signal was observed.
    High,
}

impl Confidence {
    /// Lower-case name, as the JSON document and the text report write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// What a finding rests on: what the probes saw of a process, or the host's state alone.
///
/// A finding is `observed` when a supporting item of its evidence came from the probes
/// (`probe:*` sources): it explains a failure, a hang or a slow start that was seen. It is
/// `static` when it rests on the host's state alone (files, `nvidia-smi`, the kernel log):
/// a risk, or a failure recorded by the host, that no observed call confirms. At equal
/// severity an observed finding ranks first, and the live agent attaches only observed
/// findings to a failed call (`agent/src/observer/diagnosis.rs`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// The host's state alone.
    #[default]
    Static,
    /// What the probes saw.
    Observed,
}

impl Basis {
    /// Lower-case name, as the JSON document and the log write it: `observed`, `static`.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Static => "static",
            Basis::Observed => "observed",
        }
    }

    /// What it means, for the text report.
    pub fn meaning(self) -> &'static str {
        match self {
            Basis::Static => "the host's state alone, no failing call seen",
            Basis::Observed => "what the probes saw",
        }
    }
}

/// Where a finding stands in the differential.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Standing {
    /// The most likely cause of the symptom.
    #[default]
    Leading,
    /// Still possible: the command of [`Finding::tell_apart`] tells it from the leading one.
    Possible,
    /// No symptom: the host's state makes the cause likely before anything fails.
    Hazard,
}

impl Standing {
    /// Lower-case name, as the JSON document, the log and the metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Leading => "leading",
            Standing::Possible => "possible",
            Standing::Hazard => "hazard",
        }
    }
}

/// How an evidence item bears on its finding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stance {
    /// The symptom, or a signal for the cause.
    #[default]
    For,
    /// A signal the cause needs, found to hold.
    Needs,
    /// A signal against the cause.
    Against,
}

impl Stance {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stance::For => "for",
            Stance::Needs => "needs",
            Stance::Against => "against",
        }
    }
}

/// One piece of evidence a finding used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceItem {
    /// What it shows, e.g. "uvm_disable_hmm".
    pub what: String,
    /// The value seen, e.g. "N".
    pub value: String,
    /// Where it came from: a path, a command, or `probe:<name>`.
    pub source: String,
    /// Whether it argues for the cause, is a condition it needs, or argues against it.
    #[serde(default)]
    pub stance: Stance,
    /// The signal it is, when it is one (not the symptom).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<Sig>,
}

impl EvidenceItem {
    /// The item on one line: `what=value [source]`.
    pub fn line(&self) -> String {
        match self.stance {
            Stance::Against => format!("against {}={} [{}]", self.what, self.value, self.source),
            _ => format!("{}={} [{}]", self.what, self.value, self.source),
        }
    }
}

/// Where a fix step must be run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Where {
    /// On the host (a container cannot do it: module parameters, kernel command line).
    Host,
    /// Inside the container / workload.
    Container,
    /// Either place.
    Any,
}

impl Where {
    /// Lower-case name, as the JSON document writes it: `host`, `container`, `any`.
    pub fn as_str(self) -> &'static str {
        match self {
            Where::Host => "host",
            Where::Container => "container",
            Where::Any => "any",
        }
    }
}

/// One step of the fix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixStep {
    /// Where to run it.
    #[serde(rename = "where")]
    pub where_: Where,
    /// Commands to paste, one per line (may be empty for a manual step).
    pub commands: Vec<String>,
    /// What the step does and why.
    pub note: String,
}

impl FixStep {
    /// The step on one line: `[host] cmd; cmd`, or `[host] note` when it has no command.
    pub fn line(&self) -> String {
        let what = if self.commands.is_empty() {
            self.note.clone()
        } else {
            self.commands.join("; ")
        };
        format!("[{}] {what}", self.where_.as_str())
    }
}

/// A cause, as the engine judged it for one symptom (or one host without any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The cause's id (`hmm_setup_failure`); also the runbook file name.
    pub rule: CauseId,
    /// Leading, still possible, or a hazard.
    #[serde(default)]
    pub standing: Standing,
    /// One-line summary for humans.
    pub title: String,
    /// Severity.
    pub severity: Severity,
    /// Confidence.
    pub confidence: Confidence,
    /// What it rests on (`observed` or `static`); findings read before this field existed
    /// count as static.
    #[serde(default)]
    pub basis: Basis,
    /// Evidence used, each with its source.
    pub evidence: Vec<EvidenceItem>,
    /// What the rule could not check and why (e.g. "kprobes unavailable on this kernel").
    pub unchecked: Vec<String>,
    /// The fix, in order.
    pub fix: Vec<FixStep>,
    /// Runbook path in the repository: `docs/runbooks/<rule>.md`.
    pub runbook: String,
    /// For a finding short of high confidence: the one command whose output confirms this
    /// cause or rules it out, telling it apart from the other causes that fit
    /// ([`Cause::tell_apart`](super::cause::Cause::tell_apart)). Absent when certain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tell_apart: Option<String>,
}

impl Finding {
    /// Whether the signal `s` is among what speaks for it.
    pub fn rests_on(&self, s: Sig) -> bool {
        self.evidence
            .iter()
            .any(|i| i.signal == Some(s) && i.stance == Stance::For)
    }

    /// The evidence on one line: each item's [`EvidenceItem::line`], joined by `; `.
    pub fn evidence_text(&self) -> String {
        self.evidence
            .iter()
            .map(EvidenceItem::line)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The fix on one line, numbered: `(1) [host] ... (2) [any] ...` (each step's
    /// [`FixStep::line`], joined by a space).
    pub fn fix_text(&self) -> String {
        self.fix
            .iter()
            .enumerate()
            .map(|(i, step)| format!("({}) {}", i + 1, step.line()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(where_: Where, commands: &[&str], note: &str) -> FixStep {
        FixStep {
            where_,
            commands: commands.iter().map(|c| c.to_string()).collect(),
            note: note.to_string(),
        }
    }

    #[test]
    fn one_line_renderings() {
        let f = Finding {
            rule: CauseId::HmmSetupFailure,
            standing: Standing::Leading,
            title: "t".into(),
            severity: Severity::Critical,
            confidence: Confidence::High,
            basis: Basis::Observed,
            evidence: vec![
                EvidenceItem {
                    what: "uvm_disable_hmm".into(),
                    value: "N".into(),
                    source: "/sys/module/nvidia_uvm/parameters".into(),
                    stance: Stance::Needs,
                    signal: Some(Sig::HmmAllowed),
                },
                EvidenceItem {
                    what: "cuInit returned".into(),
                    value: "3".into(),
                    source: "probe:cuInit".into(),
                    stance: Stance::Against,
                    signal: None,
                },
            ],
            unchecked: vec![],
            fix: vec![
                step(Where::Host, &["a", "b"], "ignored when there are commands"),
                step(Where::Any, &[], "read the runbook"),
                step(Where::Container, &["c"], "n"),
            ],
            runbook: "docs/runbooks/hmm_setup_failure.md".into(),
            tell_apart: None,
        };
        assert_eq!(
            f.evidence_text(),
            "uvm_disable_hmm=N [/sys/module/nvidia_uvm/parameters]; against cuInit returned=3 [probe:cuInit]"
        );
        assert_eq!(
            f.fix_text(),
            "(1) [host] a; b (2) [any] read the runbook (3) [container] c"
        );
        let empty = Finding {
            evidence: vec![],
            fix: vec![],
            ..f
        };
        assert_eq!(
            (empty.evidence_text(), empty.fix_text()),
            (String::new(), String::new())
        );
    }

    #[test]
    fn names_are_the_json_names() {
        for w in [Where::Host, Where::Container, Where::Any] {
            assert_eq!(serde_json::to_value(w).unwrap(), w.as_str());
        }
        for c in [Confidence::Low, Confidence::Medium, Confidence::High] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        for s in [Severity::Info, Severity::Warning, Severity::Critical] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for b in [Basis::Static, Basis::Observed] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
    }
}

//! What a rule concludes.

use serde::{Deserialize, Serialize};

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

/// One piece of evidence a finding used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceItem {
    /// What it shows, e.g. "uvm_disable_hmm".
    pub what: String,
    /// The value seen, e.g. "N".
    pub value: String,
    /// Where it came from: a path, a command, or `probe:<name>`.
    pub source: String,
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

/// A rule's conclusion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Rule id, snake case (`hmm_setup_failure`); also the runbook file name.
    pub rule: String,
    /// One-line summary for humans.
    pub title: String,
    /// Severity.
    pub severity: Severity,
    /// Confidence.
    pub confidence: Confidence,
    /// Evidence used, each with its source.
    pub evidence: Vec<EvidenceItem>,
    /// What the rule could not check and why (e.g. "kprobes unavailable on this kernel").
    pub unchecked: Vec<String>,
    /// The fix, in order.
    pub fix: Vec<FixStep>,
    /// Runbook path in the repository: `docs/runbooks/<rule>.md`.
    pub runbook: String,
}

//! What the rule tests check of the findings they get: the shape every finding must have
//! ([`well_formed`]), one rule run on its own ([`run`]) or all of them on a snapshot tree
//! ([`diagnose_spec`], [`expect`], [`absent`], [`at_most`]), and the parts of a finding the
//! tests look at ([`evidence_from`], [`has_fix`], [`unchecked_mentions`]).

use uvmwatch_testbed::snapshot::SnapshotSpec;

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::super::fixtures::snapshot_evidence;
use super::{diagnose, settle_basis, AGAINST, RULES};

/// What every finding of `rule` must carry: its id and runbook, a title, evidence each with
/// a value and a source, and a fix whose steps say what they do.
pub fn well_formed(f: &Finding, rule: &str) {
    assert_eq!(f.rule, rule);
    assert_eq!(f.runbook, format!("docs/runbooks/{rule}.md"));
    assert!(!f.title.is_empty());
    assert!(!f.evidence.is_empty(), "{rule}: no evidence");
    for i in &f.evidence {
        assert!(!i.source.is_empty(), "{rule}: {:?} has no source", i.what);
        assert!(!i.value.is_empty(), "{rule}: {:?} has no value", i.what);
        assert!(
            !cites_an_absent_fact(&i.value),
            "{rule}: evidence {:?} cites an absent fact as support: {:?}",
            i.what,
            i.value
        );
    }
    assert!(!f.fix.is_empty(), "{rule}: no fix");
    for s in &f.fix {
        assert!(!s.note.is_empty(), "{rule}: a fix step without a note");
    }
}

/// Whether an evidence value is an absent or negative fact written as if it supported the
/// finding: a bare `None`, `N/A`, `not set`, `unknown` (alone, as one entry of a list, or
/// as `KEY=not set`). Such a fact belongs under "could not check", or in an item whose
/// value starts with [`AGAINST`]; an absence that is itself the signal says so in words
/// (`absent`, `not loaded`, `none: the driver was never reached`).
pub fn cites_an_absent_fact(value: &str) -> bool {
    if value.starts_with(AGAINST) {
        return false;
    }
    const ABSENT: &[&str] = &["none", "n/a", "not set", "unknown", "null", "(null)", "-"];
    let v = value.trim().to_ascii_lowercase();
    v.is_empty()
        || v.contains("=not set")
        || v.split([',', ';'])
            .map(str::trim)
            .any(|part| ABSENT.contains(&part))
}

/// Runs the rule `id` alone; its finding, if any, is [`well_formed`] and carries its basis.
pub fn run(id: &str, e: &Evidence, o: &Observations) -> Option<Finding> {
    let rule = RULES.iter().find(|r| r.id == id).expect("rule id");
    let f = settle_basis((rule.check)(e, o)?);
    well_formed(&f, id);
    Some(f)
}

/// Diagnoses the snapshot tree of `spec` with what the probes saw; every finding is
/// [`well_formed`].
pub fn diagnose_spec(spec: &SnapshotSpec, o: &Observations) -> Vec<Finding> {
    let fs = diagnose(&snapshot_evidence(spec), o);
    for f in &fs {
        well_formed(f, &f.rule.clone());
    }
    fs
}

/// The finding of `rule` among `fs`, if any.
pub fn find<'a>(fs: &'a [Finding], rule: &str) -> Option<&'a Finding> {
    fs.iter().find(|f| f.rule == rule)
}

/// The finding of `rule`, with the severity and confidence expected; it is
/// [`well_formed`].
pub fn expect<'a>(fs: &'a [Finding], rule: &str, sev: Severity, conf: Confidence) -> &'a Finding {
    let f = find(fs, rule).unwrap_or_else(|| panic!("no {rule} finding in {fs:#?}"));
    assert_eq!((f.severity, f.confidence), (sev, conf), "{f:#?}");
    well_formed(f, rule);
    f
}

/// No finding of `rule`.
pub fn absent(fs: &[Finding], rule: &str) {
    assert!(find(fs, rule).is_none(), "unexpected {rule}: {fs:#?}");
}

/// `rule` absent, or at most `sev`.
pub fn at_most(fs: &[Finding], rule: &str, sev: Severity) {
    if let Some(f) = find(fs, rule) {
        assert!(f.severity <= sev, "{rule} above {sev:?}: {f:#?}");
    }
}

/// The evidence item `what` has `source`; returns its value.
pub fn evidence_from<'a>(f: &'a Finding, what: &str, source: &str) -> &'a str {
    let i = f
        .evidence
        .iter()
        .find(|i| i.what == what)
        .unwrap_or_else(|| panic!("{}: no evidence {what:?} in {:#?}", f.rule, f.evidence));
    assert_eq!(i.source, source, "{}: source of {what:?}", f.rule);
    &i.value
}

/// A fix step to run at `w` has a command containing `needle`.
pub fn has_fix(f: &Finding, w: Where, needle: &str) -> bool {
    f.fix
        .iter()
        .any(|s| s.where_ == w && s.commands.iter().any(|c| c.contains(needle)))
}

/// What the finding could not check mentions `needle`.
pub fn unchecked_mentions(f: &Finding, needle: &str) -> bool {
    f.unchecked.iter().any(|u| u.contains(needle))
}

/// The rule ids of `fs`, in order.
pub fn rules_of(fs: &[Finding]) -> Vec<&str> {
    fs.iter().map(|f| f.rule.as_str()).collect()
}

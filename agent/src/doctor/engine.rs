//! The one engine: it weighs every cause of `cause::CAUSES` against the signals and the
//! symptom the same way, for `uvmwatch doctor` and the live agent alike, and gives the
//! differential: the symptom, the leading cause, the others still possible (each with the
//! command that tells it apart), and the causes ruled out with the signal that ruled each
//! out.
//!
//! For each cause, in order:
//! 1. a needed signal that fails, or a ruling-out signal that holds, rules it out;
//! 2. with a symptom, a cause that cannot produce it is ruled out; the symptom's fit
//!    ([`Weight`]) counts for it;
//! 3. its score is the points of the signals for it that hold, less those against it;
//! 4. it is a candidate when its score is above zero and signals besides the symptom speak
//!    for it with at least 2 points (a strong one, or two weak ones), or the symptom is its
//!    decisive mark, or it is generic (it names the symptom's class: a thread stuck in the
//!    driver) and the symptom fits it strongly;
//! 5. a candidate without a decisive signal that yields to another candidate with one, or
//!    that only weak signals speak for (the background a hazard is made of) beside a
//!    candidate a strong or decisive signal speaks for, is ruled out, explained by that one.
//!
//! Candidates are ranked by score; on equal score one a strong or decisive signal speaks
//! for before one only weak signals do, a specific cause before a generic one, then the
//! order of `CAUSES`. Confidence comes from what
//! was seen: high with a decisive signal, nothing strong against it and every needed signal
//! known; medium with a score of at least 4 (a strong signal and a weak one, or more);
//! low otherwise. A symptom with no candidate is [`CauseId::UnexplainedFailure`]: the
//! symptom, the causes ruled out and why. Without a symptom, a cause that is not ruled out,
//! has no strong signal against it and whose hazard's signals all hold is a hazard.

use serde::Serialize;

use super::cause::{Cause, CauseId, Ctx, Weight, CAUSES};
use super::facts::{Evidence, Observations};
use super::finding::{
    Basis, Confidence, EvidenceItem, Finding, FixStep, Severity, Stance, Standing, Where,
};
use super::signal::{Reading, Sig, Signals, State};
use super::symptom::{symptoms, Symptom};

/// A cause the engine ruled out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuledOut {
    /// The cause.
    pub rule: CauseId,
    /// What ruled it out: a signal's name, `symptom` (it cannot produce it), `weight` (too
    /// little speaks for it), or the cause that explains it away.
    pub by: String,
    /// Why, in words.
    pub why: String,
    /// Where the deciding signal was read.
    pub source: String,
}

/// The differential of one judgement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Differential {
    /// What failed or hung, and where; `None` when nothing did.
    pub symptom: Option<Symptom>,
    /// The leading cause first, then those still possible, most likely first; without a
    /// symptom, the hazards, worst first.
    pub findings: Vec<Finding>,
    /// The causes ruled out, with the signal that ruled each out.
    pub ruled_out: Vec<RuledOut>,
    /// The other failures the host recorded, each judged on its own (a host can have two
    /// problems: a driver without a GPU and a node refused); empty for a process's symptom.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Differential>,
}

impl Differential {
    /// The leading finding (the first), if any.
    pub fn leading(&self) -> Option<&Finding> {
        self.findings.first()
    }

    /// The worst severity of the judgement: its symptoms', or its hazards'.
    pub fn severity(&self) -> Option<Severity> {
        self.symptom
            .as_ref()
            .map(|s| s.severity)
            .into_iter()
            .chain(self.findings.iter().map(|f| f.severity))
            .chain(self.also.iter().filter_map(Differential::severity))
            .max()
    }

    /// Its findings and those of the other failures the host recorded.
    pub fn all_findings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .chain(self.also.iter().flat_map(|d| d.findings.iter()))
    }
}

/// Reads the signals and the symptoms of `e` and `o`, and judges them: the first symptom's
/// differential, with the others' in [`Differential::also`].
pub fn diagnose(e: &Evidence, o: &Observations) -> Differential {
    let s = Signals::read(e, o);
    let mut syms = symptoms(o, &s).into_iter();
    let mut d = judge(e, o, &s, syms.next());
    d.also = syms.map(|sym| judge(e, o, &s, Some(sym))).collect();
    d
}

/// How one cause fared.
struct Weighed {
    cause: &'static Cause,
    score: i32,
    decisive: bool,
    /// A strong or decisive signal besides the symptom speaks for it.
    strong_for: bool,
    strong_against: bool,
    unknown_needs: Vec<Sig>,
    fit: Option<Weight>,
}

/// The differential of `sym` (or of the host's hazards without one) on these signals.
pub fn judge(e: &Evidence, o: &Observations, s: &Signals, sym: Option<Symptom>) -> Differential {
    let mut ruled_out = Vec::new();
    let mut weighed = Vec::new();
    for c in CAUSES.iter().copied() {
        match weigh(c, s, sym.as_ref()) {
            Ok(w) => weighed.push(w),
            Err(r) => ruled_out.push(r),
        }
    }
    let ctx = Ctx { s, e, o };
    let findings = match &sym {
        Some(symptom) => {
            let (mut candidates, weak): (Vec<Weighed>, Vec<Weighed>) =
                weighed.into_iter().partition(|w| {
                    let besides = w.score - w.fit.map(Weight::points).unwrap_or(0);
                    let generic = w.cause.generic && w.fit >= Some(Weight::Strong);
                    w.score > 0 && (besides >= 2 || w.fit == Some(Weight::Decisive) || generic)
                });
            ruled_out.extend(weak.iter().map(|w| weighed_out(w, s)));
            // Explained away: a candidate declared to yield to one with its decisive mark, and
            // one that only weak signals speak for (the background a hazard is made of)
            // beside a candidate that a strong or decisive signal speaks for.
            let decisive: Vec<CauseId> = candidates
                .iter()
                .filter(|w| w.decisive)
                .map(|w| w.cause.id)
                .collect();
            let strong: Vec<CauseId> = candidates
                .iter()
                .filter(|w| w.decisive || w.strong_for)
                .map(|w| w.cause.id)
                .collect();
            candidates.retain(|w| {
                if w.decisive {
                    return true;
                }
                let declared = w
                    .cause
                    .yields_to
                    .iter()
                    .find(|y| decisive.contains(y))
                    .map(|by| (*by, "whose decisive signal holds"));
                let background = (!w.strong_for && w.fit != Some(Weight::Decisive))
                    .then(|| strong.iter().find(|d| **d != w.cause.id))
                    .flatten()
                    .map(|by| (*by, "which a stronger signal speaks for"));
                match declared.or(background) {
                    Some((by, why)) => {
                        ruled_out.push(RuledOut {
                            rule: w.cause.id,
                            by: by.as_str().to_string(),
                            why: format!("explained by {by}, {why}"),
                            source: String::new(),
                        });
                        false
                    }
                    None => true,
                }
            });
            // By score; on equal score one with a strong signal before one with weak ones
            // only, a specific cause before a generic one, then (the sort is stable) the
            // order of CAUSES.
            candidates.sort_by(|a, b| {
                b.score
                    .cmp(&a.score)
                    .then(b.strong_for.cmp(&a.strong_for))
                    .then(a.cause.generic.cmp(&b.cause.generic))
            });
            if candidates.is_empty() {
                vec![unexplained(symptom, o)]
            } else {
                candidates
                    .iter()
                    .enumerate()
                    .map(|(n, w)| {
                        let standing = if n == 0 {
                            Standing::Leading
                        } else {
                            Standing::Possible
                        };
                        finding(&ctx, w, standing, symptom.severity, Some(symptom))
                    })
                    .collect()
            }
        }
        None => {
            let mut hazards: Vec<Finding> = weighed
                .iter()
                // Strong evidence against the cause suppresses its hazard.
                .filter(|w| !w.strong_against)
                .filter_map(|w| {
                    let h = w
                        .cause
                        .hazards
                        .iter()
                        .filter(|h| h.when.iter().all(|g| s.holds(*g)))
                        .max_by_key(|h| h.severity)?;
                    Some(finding(&ctx, w, Standing::Hazard, h.severity, None))
                })
                .collect();
            hazards.sort_by(|a, b| {
                b.severity
                    .cmp(&a.severity)
                    .then(b.confidence.cmp(&a.confidence))
            });
            hazards
        }
    };
    Differential {
        symptom: sym,
        findings,
        ruled_out,
        also: Vec::new(),
    }
}

/// Weighs one cause: ruled out, or its score.
fn weigh(c: &'static Cause, s: &Signals, sym: Option<&Symptom>) -> Result<Weighed, RuledOut> {
    let out = |sig: Sig, r: &Reading, why: String| RuledOut {
        rule: c.id,
        by: sig.name().to_string(),
        why,
        source: r.source.label.clone(),
    };
    for &n in c.needs {
        let r = s.get(n);
        if r.state == State::Fails {
            return Err(out(n, r, format!("needs {}: {}", n.name(), r.value)));
        }
    }
    for &n in c.rules_out {
        let r = s.get(n);
        if r.state == State::Holds {
            return Err(out(n, r, format!("{}: {}", n.name(), r.value)));
        }
    }
    let fit = match sym {
        Some(sym) => {
            let fit = c
                .produces
                .iter()
                .filter(|(f, _)| f.matches(&sym.kind))
                .map(|(_, w)| *w)
                .max();
            if fit.is_none() {
                return Err(RuledOut {
                    rule: c.id,
                    by: "symptom".to_string(),
                    why: format!("cannot produce it: {}", sym.what),
                    source: sym.source.label.clone(),
                });
            }
            fit
        }
        None => None,
    };
    let mut score = fit.map(Weight::points).unwrap_or(0);
    let mut decisive = fit == Some(Weight::Decisive);
    let mut strong_for = false;
    for &(g, w) in c.supports {
        if s.holds(g) {
            score += w.points();
            decisive |= w == Weight::Decisive;
            strong_for |= w >= Weight::Strong;
        }
    }
    let mut strong_against = false;
    for &(g, w) in c.against {
        if s.holds(g) {
            score -= w.points();
            strong_against |= w >= Weight::Strong;
        }
    }
    Ok(Weighed {
        cause: c,
        score,
        decisive,
        strong_for,
        strong_against,
        unknown_needs: c
            .needs
            .iter()
            .copied()
            .filter(|n| s.state(*n) == State::Unknown)
            .collect(),
        fit,
    })
}

/// A cause that can produce the symptom but that too little speaks for: what does, and what
/// speaks against it.
fn weighed_out(w: &Weighed, s: &Signals) -> RuledOut {
    let names = |list: &[(Sig, Weight)]| -> Vec<&'static str> {
        list.iter()
            .filter(|(g, _)| s.holds(*g))
            .map(|(g, _)| g.name())
            .collect()
    };
    let for_ = names(w.cause.supports);
    let against = names(w.cause.against);
    let mut why = if for_.is_empty() {
        "it can produce the symptom, but no signal besides it speaks for it".to_string()
    } else {
        format!("too little speaks for it: {}", for_.join(", "))
    };
    if !against.is_empty() {
        why.push_str(&format!("; against it: {}", against.join(", ")));
    }
    RuledOut {
        rule: w.cause.id,
        by: "weight".to_string(),
        why,
        source: String::new(),
    }
}

/// The confidence the engine gives a weighed cause.
fn confidence(w: &Weighed) -> Confidence {
    if w.decisive && !w.strong_against && w.unknown_needs.is_empty() {
        Confidence::High
    } else if w.score >= 4 && !w.strong_against {
        Confidence::Medium
    } else {
        Confidence::Low
    }
}

fn item(sig: Sig, r: &Reading, stance: Stance) -> EvidenceItem {
    EvidenceItem {
        what: sig.name().to_string(),
        value: r.value.clone(),
        source: r.source.label.clone(),
        stance,
        signal: Some(sig),
    }
}

/// The finding of a weighed cause: the symptom and the signals for it first, then what it
/// needs that holds, then what is against it; what it needs that is unknown as "could not
/// check".
fn finding(
    ctx: &Ctx,
    w: &Weighed,
    standing: Standing,
    severity: Severity,
    sym: Option<&Symptom>,
) -> Finding {
    let c = w.cause;
    let s = ctx.s;
    let mut evidence = Vec::new();
    if let Some(sym) = sym {
        evidence.push(EvidenceItem {
            what: "symptom".to_string(),
            value: match &sym.inside {
                Some(i) => format!("{}; inside it: {i}", sym.what),
                None => sym.what.clone(),
            },
            source: sym.source.label.clone(),
            stance: Stance::For,
            signal: None,
        });
    }
    for &(g, _) in c.supports {
        if s.holds(g) {
            evidence.push(item(g, s.get(g), Stance::For));
        }
    }
    for &n in c.needs {
        if s.holds(n) && !c.supports.iter().any(|(g, _)| *g == n) {
            evidence.push(item(n, s.get(n), Stance::Needs));
        }
    }
    for &(g, _) in c.against {
        if s.holds(g) {
            evidence.push(item(g, s.get(g), Stance::Against));
        }
    }
    let unchecked = w
        .unknown_needs
        .iter()
        .map(|n| {
            format!(
                "{} unknown: {} ({})",
                n.name(),
                s.get(*n).value,
                s.get(*n).source.label
            )
        })
        .collect();
    let confidence = confidence(w);
    let basis = match sym {
        Some(sym) => sym.source.basis,
        None => Basis::Static,
    };
    Finding {
        rule: c.id,
        standing,
        title: c.title.to_string(),
        severity,
        confidence,
        basis,
        evidence,
        unchecked,
        fix: (c.fix)(ctx),
        runbook: c.id.runbook(),
        tell_apart: (confidence < Confidence::High || standing == Standing::Possible)
            .then(|| c.tell_apart.to_string()),
    }
}

/// The finding of a symptom no cause explains: the symptom, every observation, and how to
/// learn more.
fn unexplained(sym: &Symptom, o: &Observations) -> Finding {
    let mut evidence = vec![EvidenceItem {
        what: "symptom".to_string(),
        value: match &sym.inside {
            Some(i) => format!("{}; inside it: {i}", sym.what),
            None => sym.what.clone(),
        },
        source: sym.source.label.clone(),
        stance: Stance::For,
        signal: None,
    }];
    for s in &o.kernel_signals {
        evidence.push(EvidenceItem {
            what: "kernel signal".into(),
            value: s.clone(),
            source: "probe:kprobe".into(),
            stance: Stance::For,
            signal: None,
        });
    }
    let mut unchecked = vec![
        "no known cause can produce this symptom with what was seen: the ruled-out causes below \
         say why each is out"
            .to_string(),
    ];
    unchecked.extend(
        o.unavailable_probes
            .iter()
            .map(|p| format!("probe not attached: {p}")),
    );
    Finding {
        rule: CauseId::UnexplainedFailure,
        standing: Standing::Leading,
        title: format!("no known cause explains it: {}", sym.what),
        severity: sym.severity,
        confidence: Confidence::Low,
        basis: sym.source.basis,
        evidence,
        unchecked,
        fix: vec![
            FixStep {
                where_: Where::Host,
                commands: vec![
                    "echo 1 | sudo tee /sys/module/nvidia_uvm/parameters/uvm_debug_prints".into(),
                    "sudo dmesg -T | grep -i -e NVRM -e nvidia-uvm | tail -50".into(),
                    "echo 0 | sudo tee /sys/module/nvidia_uvm/parameters/uvm_debug_prints".into(),
                ],
                note: "Make nvidia_uvm say why (the parameter is runtime-writable; needs root), \
                       run the CUDA program again, read the kernel log, then turn the prints off."
                    .into(),
            },
            FixStep {
                where_: Where::Any,
                commands: vec![
                    "sudo uvmwatch doctor --probe --bundle uvmwatch-doctor.tar.gz".into(),
                ],
                note: "On the failing machine, keep the facts and one observed cuInit together \
                       in a bundle, and attach it to the report."
                    .into(),
            },
        ],
        runbook: CauseId::UnexplainedFailure.runbook(),
        tell_apart: None,
    }
}

#[cfg(test)]
mod tests;

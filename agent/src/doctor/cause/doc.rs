//! The documentation generated from the declarations: `docs/doctor.md`'s cause and signal
//! tables and each runbook's "What the engine weighs" block, between `<!-- generated:NAME
//! -->` and `<!-- end:NAME -->` markers. A test fails when a page is stale
//! (`UVMWATCH_BLESS=1` rewrites it), so the docs cannot drift from the code.

use std::fmt::Write as _;

use super::super::signal::{Sig, SIGNALS};
use super::super::symptom::Fits;
use super::{Cause, Weight, CAUSES};

/// A list of signal names, in backquotes.
fn sigs(list: &[Sig]) -> String {
    if list.is_empty() {
        return "none".to_string();
    }
    list.iter()
        .map(|s| format!("`{}`", s.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Weighted signals, `name` (weight).
fn weighed(list: &[(Sig, Weight)]) -> String {
    if list.is_empty() {
        return "none".to_string();
    }
    list.iter()
        .map(|(s, w)| format!("`{}` ({})", s.name(), w.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A symptom pattern in words.
fn fits(f: Fits) -> String {
    let codes = |c: &[i64]| {
        if c.is_empty() {
            "any error".to_string()
        } else {
            c.iter().map(i64::to_string).collect::<Vec<_>>().join("/")
        }
    };
    match f {
        Fits::Cuinit(c) => format!("cuInit {}", codes(c)),
        Fits::CuinitHung => "cuInit hangs".to_string(),
        Fits::CallHung(c) => format!("{} hangs", c.unwrap_or("a driver call")),
        Fits::CallFailed(c) => format!("{} fails", c.unwrap_or("a driver call")),
        Fits::Open(e) => format!("open {}", e.join("/")),
        Fits::StartCall(c) => format!("a start-up call {}", codes(c)),
        Fits::LaterCall(c) => format!("a later call {}", codes(c)),
        Fits::DeviceCountLow => "device count low".to_string(),
        Fits::Fork => "fork after cuInit".to_string(),
        Fits::Slow => "slow start".to_string(),
        Fits::Host(h) => format!(
            "host: {}",
            serde_json::to_value(h)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        ),
    }
}

/// The symptoms a cause can produce, with how telling each is.
fn produces(c: &Cause) -> String {
    c.produces
        .iter()
        .map(|(f, w)| format!("{} ({})", fits(*f), w.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The hazards of a cause, in words.
fn hazards(c: &Cause) -> String {
    if c.hazards.is_empty() {
        return "none".to_string();
    }
    c.hazards
        .iter()
        .map(|h| format!("{} ({})", sigs(h.when), h.severity.as_str()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `docs/doctor.md`'s cause table: one row a cause, in the engine's order.
pub fn causes_table() -> String {
    let mut out = String::from(
        "| cause | what it is | symptoms it can produce | needs | ruled out by | for | against | hazard | runbook |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for c in CAUSES {
        let yields = if c.yields_to.is_empty() {
            String::new()
        } else {
            format!(
                "; explained away by {}",
                c.yields_to
                    .iter()
                    .map(|y| format!("`{y}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let generic = if c.generic { " (generic)" } else { "" };
        let _ = writeln!(
            out,
            "| `{id}`{generic} | {title} | {produces} | {needs} | {out}{yields} | {for_} | {against} | {hazard} | [runbook](runbooks/{id}.md) |",
            id = c.id,
            title = c.title,
            produces = produces(c),
            needs = sigs(c.needs),
            out = sigs(c.rules_out),
            for_ = weighed(c.supports),
            against = weighed(c.against),
            hazard = hazards(c),
        );
    }
    out
}

/// `docs/doctor.md`'s signal table: one row a signal, with its documentation.
pub fn signals_table() -> String {
    let mut out = String::from("| signal | what it says, and where it is read |\n|---|---|\n");
    for s in SIGNALS {
        let doc = s.doc().split_whitespace().collect::<Vec<_>>().join(" ");
        let _ = writeln!(out, "| `{}` | {} |", s.name(), doc.replace('|', "\\|"));
    }
    out
}

/// A runbook's block: what the engine weighs for this cause.
pub fn runbook_block(c: &Cause) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n",
        c.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| symptoms it can produce | {} |", produces(c));
    let _ = writeln!(
        out,
        "| needs (one failing rules it out) | {} |",
        sigs(c.needs)
    );
    let _ = writeln!(out, "| ruled out when it holds | {} |", sigs(c.rules_out));
    let _ = writeln!(out, "| for it | {} |", weighed(c.supports));
    let _ = writeln!(out, "| against it | {} |", weighed(c.against));
    if !c.yields_to.is_empty() {
        let _ = writeln!(
            out,
            "| explained away by | {} |",
            c.yields_to
                .iter()
                .map(|y| format!("[{y}]({y}.md)"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(out, "| hazard, before anything fails | {} |", hazards(c));
    let _ = writeln!(
        out,
        "| what tells it apart | {} |",
        c.tell_apart.replace('|', "\\|")
    );
    out
}

/// `text` with the block between `<!-- generated:name -->` and `<!-- end:name -->`
/// replaced by `body`; `None` when the markers are missing.
pub fn with_block(text: &str, name: &str, body: &str) -> Option<String> {
    let begin = format!("<!-- generated:{name} -->");
    let end = format!("<!-- end:{name} -->");
    let a = text.find(&begin)? + begin.len();
    let b = a + text[a..].find(&end)?;
    Some(format!("{}\n{}{}", &text[..a], body, &text[b..]))
}

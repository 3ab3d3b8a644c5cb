//! The declarations, checked as data: each cause is whole (symptoms, a tell-apart command, a
//! runbook), no signal argues both ways, and the docs generated from the declarations are
//! current (`UVMWATCH_BLESS=1` rewrites them).

use std::path::PathBuf;

use super::doc::{causes_table, runbook_block, signals_table, with_block};
use super::*;

fn repo() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bless() -> bool {
    std::env::var_os("UVMWATCH_BLESS").is_some_and(|v| v == "1")
}

/// Checks (or rewrites) the generated block `name` of `path` against `body`.
fn generated(path: &PathBuf, name: &str, body: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want = with_block(&text, name, body)
        .unwrap_or_else(|| panic!("{}: no <!-- generated:{name} --> block", path.display()));
    if want != text {
        if bless() {
            std::fs::write(path, &want).unwrap();
        } else {
            panic!(
                "{} is stale in its {name} block: rerun with UVMWATCH_BLESS=1",
                path.display()
            );
        }
    }
}

#[test]
fn every_cause_is_declared_whole() {
    let mut ids: Vec<CauseId> = CAUSES.iter().map(|c| c.id).collect();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "a cause declared twice");
    for c in CAUSES {
        assert_eq!(CauseId::from_name(c.id.as_str()), Some(c.id));
        assert!(!c.title.is_empty() && !c.doc.is_empty(), "{}", c.id);
        assert!(!c.produces.is_empty(), "{}: no symptom", c.id);
        assert!(!c.tell_apart.is_empty(), "{}: no tell-apart command", c.id);
        assert!(
            !c.supports.is_empty() || c.generic,
            "{}: nothing speaks for it",
            c.id
        );
        for (g, _) in c.supports {
            assert!(
                !c.against.iter().any(|(a, _)| a == g) && !c.rules_out.contains(g),
                "{}: {} argues both ways",
                c.id,
                g.name()
            );
        }
        for n in c.needs {
            assert!(
                !c.rules_out.contains(n),
                "{}: {} needed and ruling out",
                c.id,
                n.name()
            );
        }
        assert!(!c.yields_to.contains(&c.id), "{}: yields to itself", c.id);
    }
    assert_eq!(
        CauseId::from_name("unexplained_failure"),
        Some(CauseId::UnexplainedFailure)
    );
    assert!(CauseId::UnexplainedFailure.cause().is_none());
}

#[test]
fn every_cause_has_a_runbook_with_its_declaration() {
    for c in CAUSES {
        let path = repo().join(format!("docs/runbooks/{}.md", c.id));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(text.starts_with("# "), "{}: no title", path.display());
        generated(&path, "declaration", &runbook_block(c));
    }
    let path = repo().join("docs/runbooks/unexplained_failure.md");
    assert!(path.exists(), "{}", path.display());
}

#[test]
fn the_doctor_page_tables_are_generated_from_the_declarations() {
    let path = repo().join("docs/doctor.md");
    generated(&path, "causes", &causes_table());
    generated(&path, "signals", &signals_table());
}

#[test]
fn every_signal_is_documented_with_a_name_of_its_own() {
    let mut names: Vec<&str> = crate::doctor::signal::SIGNALS
        .iter()
        .map(|s| s.name())
        .collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "two signals share a name");
    for s in crate::doctor::signal::SIGNALS {
        assert!(!s.doc().trim().is_empty(), "{}", s.name());
    }
}

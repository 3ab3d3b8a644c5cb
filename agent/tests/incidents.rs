//! The incident bank: public reports of CUDA failing to start, each rebuilt as a snapshot of
//! the host it happened on (`agent/tests/incidents/<id>.json`, one file per incident, with its
//! URL, what the report shows, who confirmed the cause and what the case fills in from a
//! healthy host), judged by the real `uvmwatch doctor --root`. Each case names the cause that
//! must come first (the leading cause of its symptom, else the top hazard, or `healthy`) and
//! the near-miss causes that must not appear; a case with a
//! recorded failure must never read healthy. Kept apart from the rules' unit tests: these are
//! data, the rules' own tests are logic. `docs/testing.md` says how to add a case. No root.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

mod bank;

use bank::{cause_ids, doctor, write_case, Host};

/// At least this many cases: the bank only grows (206 after held-out batch 5, issue 32).
const MIN_CASES: usize = 200;

/// One incident (`docs/testing.md`, "Incident bank").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    id: String,
    source: String,
    kind: String,
    title: String,
    shows: String,
    cause: String,
    confirmed: String,
    filled: String,
    #[serde(default)]
    host: Host,
    #[serde(default)]
    observations: Option<Value>,
    first: String,
    #[serde(default)]
    absent: Vec<String>,
    /// A class the bank showed that no rule had when the case was written.
    #[serde(default)]
    new_class: Option<String>,
}

/// The bank, or the directory `UVMWATCH_INCIDENT_DIR` names: a new batch is scored from
/// where it was built, before it joins the bank and before any rule changes
/// (`docs/testing.md`, "Held-out batches").
fn cases_dir() -> PathBuf {
    match std::env::var_os("UVMWATCH_INCIDENT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/incidents"),
    }
}

/// Every case file, sorted by name, parsed (a file that does not parse fails the test with
/// its name).
fn cases() -> Vec<(String, Case)> {
    let mut files: Vec<PathBuf> = fs::read_dir(cases_dir())
        .expect("agent/tests/incidents")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&p).unwrap();
            let case: Case =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, case)
        })
        .collect()
}

/// What the doctor said of one case.
struct Verdict {
    status: String,
    /// Whether it named a symptom.
    symptom: bool,
    /// The findings' causes: the leading one first, then those still possible; without a
    /// symptom, the hazards, worst first.
    rules: Vec<String>,
    /// Whether a hazard of warning or worse was found (a host without a symptom).
    serious_hazard: bool,
}

fn judge(case: &Case) -> Verdict {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-incident")
        .tempdir()
        .unwrap();
    write_case(dir.path(), &case.host, case.observations.as_ref());
    let out = doctor(dir.path(), "json");
    // `UVMWATCH_INCIDENT_KEEP=<id>` (or `all`): keep that case's snapshot tree to read, rerun
    // by hand or time.
    if std::env::var("UVMWATCH_INCIDENT_KEEP").is_ok_and(|id| id == case.id || id == "all") {
        eprintln!("{}: snapshot kept at {}", case.id, dir.keep().display());
    }
    let report: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{}: doctor printed no JSON ({e}): {out}", case.id));
    let findings = report["findings"].as_array().cloned().unwrap_or_default();
    Verdict {
        status: report["status"].as_str().unwrap_or_default().to_string(),
        symptom: report["symptom"].is_object(),
        rules: findings
            .iter()
            .filter_map(|f| f["rule"].as_str().map(str::to_string))
            .collect(),
        serious_hazard: findings.iter().any(|f| f["severity"] != "info"),
    }
}

/// A recorded failure or hazard in a case's observations: a `cuInit` that did not return 0
/// or is still running, a failed context call, open or driver call, a fork after `cuInit`.
fn records_failure(o: &Value) -> bool {
    let nonzero = |k: &str| o[k].as_i64().is_some_and(|r| r != 0);
    nonzero("cuinit_result")
        || o["cuinit_in_flight"] == true
        || nonzero("context_result")
        || o["failed_opens"].as_array().is_some_and(|a| !a.is_empty())
        || o["failed_call"].is_object()
        || o["forked_after_parent_init"] == true
}

#[test]
fn incident_bank_cases_are_cited_and_well_formed() {
    let cases = cases();
    let causes = cause_ids();
    // A batch scored from elsewhere is checked for form, not size.
    let bank = std::env::var_os("UVMWATCH_INCIDENT_DIR").is_none();
    assert!(
        !bank || cases.len() >= MIN_CASES,
        "{} cases, at least {MIN_CASES} wanted",
        cases.len()
    );
    let mut near = 0;
    for (name, c) in &cases {
        assert_eq!(name, &c.id, "file name and id differ");
        assert!(
            c.source.starts_with("https://"),
            "{name}: source {}",
            c.source
        );
        for (field, v) in [
            ("title", &c.title),
            ("shows", &c.shows),
            ("cause", &c.cause),
            ("confirmed", &c.confirmed),
            ("filled", &c.filled),
        ] {
            assert!(!v.trim().is_empty(), "{name}: empty {field}");
        }
        assert!(
            c.first == "healthy" || causes.contains(&c.first.as_str()),
            "{name}: first {} is no rule",
            c.first
        );
        for a in &c.absent {
            assert!(
                causes.contains(&a.as_str()),
                "{name}: absent {a} is no cause"
            );
            assert_ne!(a, &c.first, "{name}: {a} both first and absent");
        }
        assert!(
            c.new_class.is_none() || causes.contains(&c.first.as_str()),
            "{name}: new class without a rule"
        );
        match c.kind.as_str() {
            "incident" => {}
            "near_miss" => near += 1,
            k => panic!("{name}: kind {k}"),
        }
    }
    assert!(!bank || near >= 5, "{near} near misses, at least 5 wanted");
}

#[test]
fn incident_bank_each_case_gets_its_rule_first_and_no_near_miss() {
    let mut failures = Vec::new();
    let mut table = String::new();
    let cases = cases();
    let total = cases.len();
    for (name, c) in cases {
        let v = judge(&c);
        let got = v.rules.first().map(String::as_str).unwrap_or("healthy");
        let mut wrong = Vec::new();
        if c.first == "healthy" {
            // Healthy: no symptom, and no hazard of warning or worse (an info, such as
            // persistence off, is advice).
            if v.symptom || v.serious_hazard {
                wrong.push(format!("status {} (rules {:?})", v.status, v.rules));
            }
        } else if got != c.first {
            wrong.push(format!("first {got}, want {}", c.first));
        }
        for a in &c.absent {
            if v.rules.contains(a) {
                wrong.push(format!("{a} present"));
            }
        }
        if c.observations.as_ref().is_some_and(records_failure) && v.status == "healthy" {
            wrong.push("healthy over a recorded failure".into());
        }
        table.push_str(&format!(
            "{:<4} {name:<44} {:<24} {}\n",
            if wrong.is_empty() { "ok" } else { "FAIL" },
            c.first,
            v.rules.join(",")
        ));
        if !wrong.is_empty() {
            failures.push(format!("{name} ({}): {}", c.source, wrong.join("; ")));
        }
    }
    println!("{table}");
    println!(
        "{} of {total} cases right ({})",
        total - failures.len(),
        cases_dir().display()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

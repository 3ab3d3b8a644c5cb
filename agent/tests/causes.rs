//! The causes' golden cases: for each cause, the picture NVIDIA's source and documents give of
//! it (`agent/tests/causes/<cause>-<picture>.json`, in the bank's host and observations
//! format, `tests/bank`), beside a near miss where one is telling, each with the real
//! `uvmwatch doctor --root` text report it must print (`<name>.txt`, the golden). A change of
//! the engine, a declaration, a signal or the report shows here as a diff of what users read;
//! `UVMWATCH_BLESS=1` rewrites the goldens after a change meant to make it. The incident bank
//! (`incidents.rs`) holds what the world showed; these hold what each cause is. No root.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

mod bank;

use bank::{cause_ids, doctor, write_case, Host};

/// One golden case.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Golden {
    /// The picture, in words.
    picture: String,
    #[serde(default)]
    host: Host,
    #[serde(default)]
    observations: Option<Value>,
    /// The leading cause, `unexplained_failure`, or `healthy`.
    first: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/causes")
}

fn goldens() -> Vec<(String, Golden)> {
    let mut names: Vec<String> = fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let text = fs::read_to_string(dir().join(format!("{n}.json"))).unwrap();
            let g: Golden = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{n}.json: {e}"));
            (n, g)
        })
        .collect()
}

#[test]
fn every_cause_has_a_golden_case_named_after_it() {
    let all = goldens();
    let ids = cause_ids();
    for id in ids.iter().filter(|i| **i != "unexplained_failure") {
        assert!(
            all.iter().any(|(n, g)| g.first == *id && n.starts_with(id)),
            "no golden case for {id} (agent/tests/causes/{id}-<picture>.json)"
        );
    }
    for (n, g) in &all {
        assert!(
            g.first == "healthy" || ids.contains(&g.first.as_str()),
            "{n}: first {} is no cause",
            g.first
        );
        assert!(!g.picture.is_empty(), "{n}: no picture");
        assert!(
            ids.iter()
                .chain(&["healthy"])
                .any(|id| n.starts_with(&format!("{id}-"))),
            "{n}: name it <cause>-<picture>"
        );
    }
}

#[test]
fn each_golden_case_leads_with_its_cause_and_prints_its_golden_report() {
    let bless = std::env::var_os("UVMWATCH_BLESS").is_some();
    let mut wrong = Vec::new();
    for (n, g) in goldens() {
        let tmp = tempfile::Builder::new()
            .prefix("uvmwatch-golden")
            .tempdir()
            .unwrap();
        write_case(tmp.path(), &g.host, g.observations.as_ref());
        let report: Value = serde_json::from_str(&doctor(tmp.path(), "json"))
            .unwrap_or_else(|e| panic!("{n}: no JSON report: {e}"));
        let leading = report["findings"]
            .as_array()
            .and_then(|f| f.first())
            .and_then(|f| f["rule"].as_str())
            .unwrap_or("healthy")
            .to_string();
        if leading != g.first {
            wrong.push(format!("{n}: leads with {leading}, want {}", g.first));
        }
        let text = doctor(tmp.path(), "text");
        let golden = dir().join(format!("{n}.txt"));
        if bless {
            fs::write(&golden, &text).unwrap();
        } else {
            let want = fs::read_to_string(&golden).unwrap_or_default();
            if want != text {
                wrong.push(format!(
                    "{n}: the report differs from {} (UVMWATCH_BLESS=1 rewrites it after a \
                     change meant to make it):\n{text}",
                    golden.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

//! The direction of imports between the agent's top modules (docs/architecture.md, "Which
//! module may import which"), checked on the source: every `crate::<module>` path, in a
//! `use` (grouped `crate::{…}` too) or inline, from a file under `agent/src/<module>/`
//! (or `<module>.rs`) must name a module its own is allowed to import. Comments are left
//! out (a doc link is no import). A new top module fails the test until it has a row.
//!
//! Needs nothing: it reads files.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Each top module of `agent/src` and the modules it may import, down the data path: the
/// kernel side and the host readers at the bottom, the doctor beside them, the event above,
/// the observer that builds events, the exporters that take them, the commands on top.
const ALLOWED: &[(&str, &[&str])] = &[
    ("clock", &[]),
    ("decode", &[]),
    ("host", &["clock", "decode"]),
    ("kernel", &["clock", "decode", "host"]),
    ("doctor", &["clock", "decode", "host"]),
    ("event", &["clock", "decode", "host", "kernel", "doctor"]),
    (
        "observer",
        &["clock", "decode", "host", "kernel", "doctor", "event"],
    ),
    (
        "export",
        &["clock", "decode", "host", "kernel", "doctor", "event"],
    ),
    (
        "cmd",
        &[
            "clock", "decode", "host", "kernel", "doctor", "event", "observer", "export",
        ],
    ),
];

/// `s` without `//` comments (to the end of their line) and `/* */` blocks, strings kept.
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(s.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' && i + 1 < b.len() {
                out.extend_from_slice(&b[i..i + 2]);
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        } else if b[i..].starts_with(b"/*") {
            let end = (i + 2..b.len().saturating_sub(1))
                .find(|&j| &b[j..j + 2] == b"*/")
                .map_or(b.len(), |j| j + 2);
            i = end;
            continue;
        } else if c == b'\'' && i + 3 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal (`'"'`, `'\\'`, `'\''`; a lifetime has no closing quote there):
            // copied whole, so no string starts in it.
            let end = if b[i + 1] == b'\\' { i + 4 } else { i + 3 };
            out.extend_from_slice(&b[i..end]);
            i = end;
            continue;
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The top modules `code` (comments stripped) names through `crate::`.
fn imported(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // The first name of every item at the group's top level.
            let mut depth = 1;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (c == ',' && depth == 1) {
                    let name = ident(&item);
                    if !name.is_empty() {
                        out.insert(name);
                    }
                    item.clear();
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                item.push(c);
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                out.insert(name);
            }
        }
        rest = after;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("agent/src readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn imports_run_down_the_data_path() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut seen_tops = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = first.trim_end_matches(".rs").to_string();
        if rel.components().count() == 1 && ["lib", "main"].contains(&top.as_str()) {
            continue;
        }
        seen_tops.insert(top.clone());
        let Some(ok) = allowed.get(top.as_str()) else {
            bad.push(format!(
                "{}: top module `{top}` has no row in ALLOWED",
                rel.display()
            ));
            continue;
        };
        let code = strip_comments(&fs::read_to_string(f).unwrap());
        for m in imported(&code) {
            if m != top && allowed.contains_key(m.as_str()) && !ok.contains(&m.as_str()) {
                bad.push(format!("{}: `{top}` imports `crate::{m}`", rel.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports running back up the data path (docs/architecture.md):\n{}",
        bad.join("\n")
    );
    // The table is about the modules there are.
    for (m, _) in ALLOWED {
        assert!(
            seen_tops.contains(*m),
            "ALLOWED names `{m}`, not in agent/src"
        );
    }
}

#[test]
fn the_check_sees_every_form_of_import() {
    let code = strip_comments(
        "use crate::{\n    host::caps,\n    kernel::{registry::X, Kernel},\n};\n\
         // crate::observer in a comment\n\
         let s = \"not a // comment\"; let c = '\"'; let t = crate::doctor::x();\n\
         /* crate::export */ use crate::event as ev;",
    );
    let got: Vec<String> = imported(&code).into_iter().collect();
    assert_eq!(got, ["doctor", "event", "host", "kernel"]);
}

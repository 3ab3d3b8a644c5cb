//! `cargo xtask nvidia-layouts --source <dir> [--check]`: the agent's table of NVIDIA ioctl
//! params layouts (`agent/src/decode/layouts/nvidia-layouts.tsv`), generated from the
//! headers of every release tag of NVIDIA's open-gpu-kernel-modules.
//!
//! For each tag (all of major 515 or later, sorted by version), [`probe`] reads the UVM
//! command list from `uvm_ioctl.h`/`uvm_linux_ioctl.h` and the RM escapes from the
//! `NV_ESC_*` defines, extracts the headers they need from the tag's commit, and compiles a C
//! program with the host's gcc that prints `sizeof` and `offsetof` of each params struct.
//! [`table`] merges the tags into rows (one per command, struct and run of tags with one
//! layout) and writes the file. `--check` regenerates it in memory and fails with the
//! differing rows when the committed file disagrees. Nothing of NVIDIA's code is kept: only
//! the numbers the compiler printed.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

mod escapes;
mod git;
mod probe;
mod scan;
mod table;

use crate::util;

/// The oldest driver branch read (the open modules start at 515).
pub const MIN_MAJOR: u32 = 515;

/// Where the generated file lives, from the workspace root.
pub const TABLE_PATH: &str = "agent/src/decode/layouts/nvidia-layouts.tsv";

/// Environment variable naming a git dir or checkout of NVIDIA/open-gpu-kernel-modules for
/// the test that checks the committed table.
pub const SOURCE_ENV: &str = "UVMWATCH_NVIDIA_SRC";

/// `cargo xtask nvidia-layouts` options.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// NVIDIA/open-gpu-kernel-modules with its release tags: a git dir (bare mirror) or a
    /// checkout (default: $UVMWATCH_NVIDIA_SRC).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// Regenerate in memory and compare with the committed file: exit 1 with the rows that
    /// differ when they do.
    #[arg(long)]
    pub check: bool,
    /// The file to write or check (default: agent/src/decode/layouts/nvidia-layouts.tsv).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// A driver version as NVIDIA tags it: `535.104.05`, `535.98`; ordered by its numbers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    parts: Vec<u32>,
    text: String,
}

impl Version {
    /// `MAJOR.MINOR[.PATCH]`, digits only.
    pub fn parse(s: &str) -> Option<Version> {
        let parts: Vec<u32> = s
            .split('.')
            .map(|p| {
                (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())
                    .flatten()
            })
            .collect::<Option<_>>()?;
        (2..=3).contains(&parts.len()).then(|| Version {
            parts,
            text: s.to_string(),
        })
    }

    pub fn major(&self) -> u32 {
        self.parts[0]
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Runs the subcommand.
pub fn run(args: &Args) -> Result<ExitCode> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| util::workspace_root().join(TABLE_PATH));
    let source = match (&args.source, std::env::var_os(SOURCE_ENV)) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) if !s.is_empty() => PathBuf::from(s),
        _ => bail!("--source DIR (or {SOURCE_ENV}) is needed: NVIDIA/open-gpu-kernel-modules"),
    };
    if let Some(why) = tools_missing() {
        bail!("{why}: git and gcc are needed");
    }
    let generated = generate(&source, true)?;
    if args.check {
        let committed = std::fs::read_to_string(&out)
            .with_context(|| format!("cannot read {}", out.display()))?;
        let d = table::diff(&committed, &generated);
        if d.is_empty() {
            println!("{} is up to date", out.display());
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{} differs from what the headers give (- committed, + regenerated):\n{d}",
            out.display()
        );
        return Ok(ExitCode::from(1));
    }
    std::fs::write(&out, &generated).with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// The file's text, from the repository at `source`.
pub fn generate(source: &Path, progress: bool) -> Result<String> {
    let machine = util::output("gcc", ["-dumpmachine"])
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .context("gcc is needed (it computes the layouts): not found")?;
    if !machine.starts_with("x86_64") {
        bail!("gcc targets {machine}: the table is of x86_64 layouts, run this on x86_64");
    }
    let repo = git::Repo::open(source)?;
    let tags = repo.release_tags(MIN_MAJOR)?;
    if tags.is_empty() {
        bail!(
            "{} has no release tags of major {MIN_MAJOR} or later",
            source.display()
        );
    }
    if progress {
        eprintln!(
            "nvidia-layouts: {} tags, {} .. {}",
            tags.len(),
            tags[0].0.as_str(),
            tags[tags.len() - 1].0.as_str()
        );
    }
    let work = tempfile::Builder::new()
        .prefix("uvmwatch-nvidia-layouts-")
        .tempdir()?;
    let results: Mutex<Vec<Option<Result<probe::TagFacts>>>> =
        Mutex::new((0..tags.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut reader = match repo.reader() {
                    Ok(r) => r,
                    Err(e) => {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i < tags.len() {
                            results.lock().unwrap()[i] = Some(Err(e));
                        }
                        return;
                    }
                };
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= tags.len() {
                        break;
                    }
                    let (v, commit) = &tags[i];
                    let dir = work.path().join(v.as_str());
                    let r = probe::probe(&mut reader, commit, &dir)
                        .with_context(|| format!("tag {}", v.as_str()));
                    let _ = std::fs::remove_dir_all(&dir);
                    results.lock().unwrap()[i] = Some(r);
                }
            });
        }
    });
    let mut per_tag = Vec::new();
    let mut headers = std::collections::BTreeSet::new();
    for (i, r) in results.into_inner().unwrap().into_iter().enumerate() {
        let tf = r.with_context(|| format!("tag {} was not read", tags[i].0.as_str()))??;
        headers.extend(tf.headers);
        per_tag.push(tf.facts);
    }
    let rows = table::rows(&per_tag)?;
    if progress {
        eprintln!("nvidia-layouts: {} rows", rows.len());
        for (kind, cmd, names) in table::renames(&rows) {
            eprintln!(
                "nvidia-layouts: {} {cmd:#x} renamed: {}",
                kind.as_str(),
                names.join(" -> ")
            );
        }
    }
    Ok(table::render(&tags, &rows, &headers))
}

/// `git` and `gcc` are there (what `generate` needs besides the source).
pub fn tools_missing() -> Option<String> {
    for (tool, arg) in [("git", "--version"), ("gcc", "--version")] {
        if !Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(format!("{tool} not found"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_number() {
        let mut v: Vec<Version> = [
            "535.98",
            "535.104.05",
            "535.43.02",
            "590.48.01",
            "535.183.01",
        ]
        .iter()
        .map(|s| Version::parse(s).unwrap())
        .collect();
        v.sort();
        let got: Vec<&str> = v.iter().map(Version::as_str).collect();
        assert_eq!(
            got,
            [
                "535.43.02",
                "535.98",
                "535.104.05",
                "535.183.01",
                "590.48.01"
            ]
        );
        for bad in ["535", "v535.1", "535.1.2.3", "535..1", "latest"] {
            assert!(Version::parse(bad).is_none(), "{bad}");
        }
    }

    /// The committed table is what the headers give. Needs NVIDIA's repository
    /// (`UVMWATCH_NVIDIA_SRC`: a git dir or checkout with the release tags), git and gcc;
    /// skipped without them.
    #[test]
    fn committed_table_matches_headers() {
        const NAME: &str = "nvidia_layouts::committed_table_matches_headers";
        let Some(src) = std::env::var_os(SOURCE_ENV).filter(|s| !s.is_empty()) else {
            uvmwatch_testbed::skip(NAME, &format!("{SOURCE_ENV} is not set"));
            return;
        };
        let src = PathBuf::from(src);
        if !src.exists() {
            uvmwatch_testbed::skip(
                NAME,
                &format!("{SOURCE_ENV}={} does not exist", src.display()),
            );
            return;
        }
        if let Some(why) = tools_missing() {
            uvmwatch_testbed::skip(NAME, &why);
            return;
        }
        let generated = generate(&src, false).unwrap();
        let committed = std::fs::read_to_string(util::workspace_root().join(TABLE_PATH)).unwrap();
        let d = table::diff(&committed, &generated);
        assert!(
            d.is_empty(),
            "{TABLE_PATH} is stale; run `cargo xtask nvidia-layouts --source {}`:\n{d}",
            src.display()
        );
    }
}

//! `cargo xtask test`: set-up, build, `cargo test` one test at a time, and a summary that
//! counts skipped tests.
//!
//! A test that cannot run here calls `uvmwatch_testbed::skip`, which appends
//! `SKIPPED <test>: <reason>` to the file named by `$UVMWATCH_SKIP_LOG`. Such a test returns
//! early, so cargo counts it as passed; the summary moves it from passed to skipped.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use uvmwatch_testbed::SKIP_LOG_ENV;

use crate::{setup, util};

/// Counts from cargo's `test result:` lines, summed over every test binary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Test binaries (and doc-test runs) that reported a result.
    pub binaries: u32,
    /// Passed, as cargo counts them (skipped tests included).
    pub passed: u32,
    /// Failed.
    pub failed: u32,
    /// `#[ignore]`d.
    pub ignored: u32,
}

impl Counts {
    /// Adds one `test result: …` line; other lines are ignored. Returns whether it was one.
    pub fn add_line(&mut self, line: &str) -> bool {
        let Some(at) = line.find("test result:") else {
            return false;
        };
        let rest = &line[at + "test result:".len()..];
        let mut seen = false;
        for part in rest.split([';', '.']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u32>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => continue,
            }
            seen = true;
        }
        if seen {
            self.binaries += 1;
        }
        seen
    }
}

/// The final summary: counts, then exactly one `uvmwatch tests: …` line, then the skips.
pub fn summary(counts: &Counts, skips: &[String]) -> String {
    let skipped = skips.len() as u32;
    let mut out = format!(
        "cargo test: {} passed, {} failed, {} ignored in {} test runs\n",
        counts.passed, counts.failed, counts.ignored, counts.binaries
    );
    out.push_str(&format!(
        "uvmwatch tests: {} passed, {} failed, {} skipped\n",
        counts.passed.saturating_sub(skipped),
        counts.failed,
        skipped
    ));
    for s in skips {
        out.push_str(&format!("  {s}\n"));
    }
    out
}

/// Splits `cargo xtask test -- ARGS` into `cargo test` arguments and test-binary arguments
/// (after a second `--`).
fn split_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args.to_vec(), Vec::new()),
    }
}

/// The `cargo test` command line.
fn cargo_test_args(cargo_args: &[String], test_args: &[String]) -> Vec<String> {
    // No `--workspace`: the default members leave out `agent-ebpf`, which only builds for
    // the BPF target (through `agent/build.rs`).
    let mut out = vec!["test".to_string(), "--no-fail-fast".to_string()];
    out.extend(cargo_args.iter().cloned());
    out.push("--".into());
    // Root eBPF tests must not run concurrently.
    out.push("--test-threads=1".into());
    out.extend(test_args.iter().cloned());
    out
}

/// The test files (`agent/tests/<name>.rs`) whose scenarios run a second time on the fentry
/// backend (`UVMWATCH_PROBE_BACKEND=fentry`) when the kernel allows trampolines; the first
/// run takes the agent's default, which falls back to the tracepoints where it does not.
const FENTRY_PASS: &[&str] = &["e2e", "losses", "load"];

fn fentry_pass_args() -> Vec<String> {
    let mut a = vec!["-p".to_string(), "uvmwatch".to_string()];
    for t in FENTRY_PASS {
        a.push("--test".into());
        a.push((*t).into());
    }
    a
}

/// `None` when this kernel lets the agent attach its fentry backend, else why not (the
/// loader's own words, from `uvmwatch --probe-backend fentry probes`).
fn fentry_refusal(root: &std::path::Path) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".into());
    }
    let bin = root.join("target/debug/uvmwatch");
    let out = match Command::new(&bin)
        .args(["--probe-backend", "fentry", "probes"])
        .env_remove("UVMWATCH_PROBE_BACKEND")
        .stderr(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => return Some(format!("{}: {e}", bin.display())),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("syscall hooks: "))
        .unwrap_or("no `syscall hooks:` line from uvmwatch probes");
    if line == "syscall hooks: fentry backend (the kernel allows trampolines)" {
        None
    } else {
        Some(
            line.split_once("refused: ")
                .map(|(_, w)| format!("the kernel refused it: {}", w.trim_end_matches(')')))
                .unwrap_or_else(|| line.to_string()),
        )
    }
}

/// Runs `cargo xtask test`.
///
/// # Errors
/// Set-up failed, or cargo could not be started.
pub fn run(args: &[String]) -> Result<ExitCode> {
    let started = Instant::now();
    setup::ensure()?;
    let root = util::workspace_root();

    // The tests need the binaries (uvmwatch, uvmwatch-fakedev) built first.
    println!("xtask: cargo build --bins");
    let mut build = Command::new("cargo");
    build.current_dir(&root).args(["build", "--bins"]);
    if util::run_inherit(&mut build).is_err() {
        println!("uvmwatch tests: 0 passed, 0 failed, 0 skipped (the build failed)");
        return Ok(ExitCode::from(1));
    }

    let skip_log = tempfile::Builder::new()
        .prefix("uvmwatch-skips-")
        .suffix(".log")
        .tempfile()
        .context("create the skip log")?;
    let (cargo_args, test_args) = split_args(args);
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args(cargo_test_args(&cargo_args, &test_args))
        .env(SKIP_LOG_ENV, skip_log.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    println!("xtask: {}", util::describe(&cmd));
    let mut child = cmd.spawn().context("start cargo test")?;
    let mut counts = Counts::default();
    let stdout = child.stdout.take().expect("stdout is piped");
    // (the fentry pass below adds to the same counts)
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        counts.add_line(&line);
    }
    let mut status = child.wait().context("wait for cargo test")?;

    // The e2e scenarios again on the fentry backend, where the kernel allows it.
    let mut extra_skips = Vec::new();
    if cargo_args.is_empty() && test_args.is_empty() {
        match fentry_refusal(&root) {
            None => {
                let mut cmd = Command::new("cargo");
                cmd.current_dir(&root)
                    .args(cargo_test_args(&fentry_pass_args(), &[]))
                    .env(SKIP_LOG_ENV, skip_log.path())
                    .env("UVMWATCH_PROBE_BACKEND", "fentry")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped());
                println!("xtask: on the fentry backend: {}", util::describe(&cmd));
                let mut child = cmd.spawn().context("start cargo test (fentry)")?;
                let stdout = child.stdout.take().expect("stdout is piped");
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    println!("[fentry] {line}");
                    counts.add_line(&line);
                }
                let s = child.wait().context("wait for cargo test (fentry)")?;
                if !s.success() {
                    status = s;
                }
            }
            Some(why) => {
                // One skipped test, counted as cargo counts a skip (among the passed).
                counts.passed += 1;
                extra_skips.push(format!(
                    "SKIPPED {} on the fentry backend: {why}",
                    FENTRY_PASS.join(", ")
                ));
            }
        }
    }

    let mut skips: Vec<String> = std::fs::read_to_string(skip_log.path())
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    skips.extend(extra_skips);
    println!();
    println!(
        "xtask: cargo test exited with {status} after {:.0}s in all",
        started.elapsed().as_secs_f64()
    );
    if !status.success() && counts.failed == 0 {
        println!("xtask: cargo test failed without a failing test (a build error? see above)");
    }
    print!("{}", summary(&counts, &skips));
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_result_lines() {
        let mut c = Counts::default();
        assert!(c.add_line(
            "test result: ok. 17 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 40.2s"
        ));
        assert!(c.add_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out; finished in 0.01s"
        ));
        assert!(!c.add_line("test foo ... ok"));
        assert!(!c.add_line("running 3 tests"));
        assert_eq!(
            c,
            Counts {
                binaries: 2,
                passed: 20,
                failed: 2,
                ignored: 1
            }
        );
    }

    #[test]
    fn summary_moves_skips_out_of_passed() {
        let c = Counts {
            binaries: 3,
            passed: 10,
            failed: 1,
            ignored: 0,
        };
        let skips = vec!["SKIPPED a: needs root".to_string()];
        let s = summary(&c, &skips);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[1], "uvmwatch tests: 9 passed, 1 failed, 1 skipped");
        assert_eq!(lines[2], "  SKIPPED a: needs root");
        assert_eq!(
            s.lines()
                .filter(|l| l.starts_with("uvmwatch tests:"))
                .count(),
            1
        );
    }

    #[test]
    fn args_are_split_between_cargo_and_the_test_binaries() {
        let a: Vec<String> = ["hung", "--", "--nocapture"].map(String::from).into();
        let (c, t) = split_args(&a);
        assert_eq!(
            cargo_test_args(&c, &t),
            [
                "test",
                "--no-fail-fast",
                "hung",
                "--",
                "--test-threads=1",
                "--nocapture"
            ]
        );
        let a: Vec<String> = ["-p", "uvmwatch-testbed"].map(String::from).into();
        let (c, t) = split_args(&a);
        assert_eq!(
            cargo_test_args(&c, &t),
            [
                "test",
                "--no-fail-fast",
                "-p",
                "uvmwatch-testbed",
                "--",
                "--test-threads=1"
            ]
        );
    }
}

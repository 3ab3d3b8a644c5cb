//! The overhead benchmark (`agent/benches/overhead.rs`) built to run elsewhere: inside
//! vm-test's VMs and on the device-check machine, against a release agent binary
//! (`UVMWATCH_BENCH_AGENT`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The overhead benchmark's executable and the release agent binary built with it.
pub struct Bench {
    pub bench: PathBuf,
    pub agent: PathBuf,
}

/// Builds the overhead benchmark (release) and returns its executable and the release agent
/// (`target/release/uvmwatch`, which the same build makes).
pub fn build(root: &Path, target: &Path) -> Result<Bench> {
    println!("xtask: cargo bench -p uvmwatch --bench overhead --no-run");
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "bench",
            "-p",
            "uvmwatch",
            "--bench",
            "overhead",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run cargo bench --no-run")?;
    if !out.status.success() {
        bail!("cargo bench --no-run failed ({})", out.status);
    }
    let bench = bench_executable(&String::from_utf8_lossy(&out.stdout))
        .context("cargo bench --no-run named no executable for the overhead bench")?;
    Ok(Bench {
        bench,
        agent: target.join("release").join("uvmwatch"),
    })
}

/// The `executable` of the `overhead` bench in cargo's JSON messages.
fn bench_executable(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter(|l| l.contains("\"name\":\"overhead\"") && l.contains("\"kind\":[\"bench\"]"))
        .find_map(|l| {
            let at = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = l[at..].find('"')?;
            Some(PathBuf::from(&l[at..at + end]))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_executable_from_cargo_messages() {
        let m = "{\"reason\":\"compiler-artifact\",\"target\":{\"kind\":[\"lib\"],\"name\":\"uvmwatch\"},\"executable\":null}\n\
                 {\"reason\":\"compiler-artifact\",\"target\":{\"kind\":[\"bench\"],\"crate_types\":[\"bin\"],\"name\":\"overhead\"},\"executable\":\"/t/release/deps/overhead-1f2e\",\"fresh\":false}";
        assert_eq!(
            bench_executable(m),
            Some(PathBuf::from("/t/release/deps/overhead-1f2e"))
        );
        assert_eq!(bench_executable("{}"), None);
    }
}

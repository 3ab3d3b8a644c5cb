//! `cargo xtask device-check`: a release agent plus `run.sh` for a real GPU machine.
//!
//! Writes `target/device-check/` (under the workspace root, whatever the cargo target dir):
//! `uvmwatch`, `run.sh` (from `device-check.sh` beside this file) and `build-info.txt`.
//! `docs/device-check.md` says how to run it and where its results go.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::{setup, util};

/// The script run on the GPU machine.
const RUN_SH: &str = include_str!("device-check.sh");

/// Where the bundle goes, relative to the workspace root (the path the device tool carries).
pub const BUNDLE_DIR: &str = "target/device-check";

/// Commit, build time and compiler, so a result in `docs/validation/` names what was run.
fn build_info(root: &Path) -> String {
    let text = |cmd: &mut Command| {
        cmd.output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    let commit = text(
        Command::new("git")
            .current_dir(root)
            .args(["rev-parse", "HEAD"]),
    );
    let changes = text(Command::new("git").current_dir(root).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]));
    let dirty = if changes.is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    let date = text(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]));
    let host = text(Command::new("uname").args(["-srm"]));
    let rustc = text(Command::new("rustc").current_dir(root).arg("--version"));
    format!("commit {commit}{dirty}\nbuilt {date} on {host}\n{rustc}\n")
}

/// `cargo xtask device-check`.
///
/// # Errors
/// Set-up or the release build failed, or the bundle could not be written.
pub fn run() -> Result<ExitCode> {
    setup::ensure()?;
    let root = util::workspace_root();
    // target/<profile>/xtask -> target/release/uvmwatch (same target dir).
    let target_dir: PathBuf = std::env::current_exe()?
        .parent()
        .and_then(|d| d.parent())
        .context("xtask is not inside a cargo target dir")?
        .to_path_buf();
    // The overhead benchmark, and with it the release agent (the same build makes both).
    let bench = crate::bench::build(&root, &target_dir)?;
    let bin = bench.agent.clone();
    let out = root.join(BUNDLE_DIR);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("clear {}", out.display()))?;
    }
    fs::create_dir_all(&out)?;
    fs::copy(&bin, out.join("uvmwatch")).with_context(|| format!("copy {}", bin.display()))?;
    util::run_inherit(
        Command::new("strip")
            .arg("-o")
            .arg(out.join("uvmwatch-overhead"))
            .arg(&bench.bench),
    )?;
    fs::write(out.join("run.sh"), RUN_SH)?;
    fs::set_permissions(out.join("run.sh"), fs::Permissions::from_mode(0o755))?;
    fs::write(out.join("build-info.txt"), build_info(&root))?;
    let size = fs::metadata(out.join("uvmwatch"))?.len();
    println!(
        "device-check: wrote {BUNDLE_DIR}/ (uvmwatch {:.1} MiB, uvmwatch-overhead, run.sh, build-info.txt)",
        size as f64 / (1024.0 * 1024.0)
    );
    println!("device-check: run it on the GPU machine with the device tool's `run`:");
    println!(
        "  command: bash {BUNDLE_DIR}/run.sh\n  carry:   [\"{BUNDLE_DIR}\"]\n  timeout_s: 420"
    );
    println!(
        "device-check: it writes eight files to $OUT (host.txt probes.txt workload.txt agent.log \
         metrics.txt capture.json report.txt summary.txt); keep them in docs/validation/ (see \
         docs/device-check.md)"
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn script_keeps_out_flat_and_small() {
        let s = super::RUN_SH;
        // At most 8 files come back from $OUT, none in subfolders.
        let mut files: Vec<&str> = s
            .match_indices("\"$OUT/")
            .map(|(i, _)| {
                let rest = &s[i + 6..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect();
        files.sort();
        files.dedup();
        assert!(files.len() <= 8, "{files:?}");
        assert!(files.iter().all(|f| !f.contains('/')), "{files:?}");
        assert!(s.contains("OUT=\"${OUT:-$PWD/device-check-out}\""));
    }
}

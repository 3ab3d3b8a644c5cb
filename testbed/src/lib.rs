//! Test doubles that let integration tests drive the real uvmwatch agent on a machine
//! without a GPU or an NVIDIA driver.
//!
//! Five parts:
//! - a fake `libcuda.so.1` (`c/fake_libcuda.c`) whose `cuInit` replays the opens and driver
//!   ioctls of a real `cuInit`, with NVIDIA's real ioctl numbers (see [`nv`]);
//! - `cuda-workload` (`c/cuda_workload.c`), a program that loads it and calls `cuInit`;
//! - `uvmwatch-fakedev`, a FUSE server that serves the device nodes and can fail, delay or
//!   hold any ioctl ([`FakeDev`]);
//! - snapshot trees of GPU machines for the doctor's tests ([`snapshot`]:
//!   [`write_snapshot_fixture`] from a [`SnapshotSpec`]), which need nothing of the above;
//! - replays of real recorded CUDA starts ([`replay`]: [`Replay::load`], [`ReplayRun`]),
//!   which the fake library issues call by call ([`Workload::spawn_replay`]).
//!
//! [`spawn_workload`] runs the workload in a private mount namespace whose `/dev` is a tmpfs
//! holding the fake nodes at their real paths (`/dev/nvidiactl`, `/dev/nvidia0`,
//! `/dev/nvidia-uvm`, ...), so an agent tracing `openat`/`ioctl` sees what it would see on
//! a GPU machine. The host's `/dev` is never touched.
//!
//! The first three need root, `/dev/fuse`, `unshare` and `mount` (util-linux) and a C
//! compiler; [`check_environment`] says what is missing so a test can report it with
//! [`skip`] and return.
//!
//! ```no_run
//! use uvmwatch_testbed::*;
//! # fn main() -> anyhow::Result<()> {
//! if let Err(reason) = check_environment() {
//!     skip("my_test", &reason);
//!     return Ok(());
//! }
//! let out = tempfile::tempdir()?;
//! let artifacts = build_artifacts(out.path())?;
//! let dev = FakeDev::start(&artifacts, FakeDevConfig::default())?;
//! let mut workload = Workload::spawn(&dev, &artifacts, WorkloadConfig::default())?;
//! let output = workload.wait_timeout(std::time::Duration::from_secs(10))?;
//! assert_eq!(output.cuinit_lines()[0].rc, 0);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod artifacts;
mod fakedev;
pub mod nv;
pub mod procfs;
pub mod replay;
pub mod rules;
pub mod snapshot;
mod workload;

pub use artifacts::{
    build_artifacts, build_artifacts_with_fakedev, check_environment, locate_fakedev, Artifacts,
    CUDA_WORKLOAD_C, FAKEDEV_BIN, FAKEDEV_ENV, FAKE_LIBCUDA_C,
};
pub use fakedev::{FakeDev, FakeDevConfig, FAKEDEV_FSTYPE};
pub use replay::{Replay, ReplayRun};
pub use rules::{IoctlAction, IoctlRule, OpenDenial};
pub use snapshot::{write_snapshot_fixture, SnapshotSpec};
pub use workload::{
    install_libcuda, parse_context_lines, parse_cuinit_lines, spawn_workload,
    spawn_workload_replay, spawn_workload_with_args, ContextLine, CuInitLine, LibLocation,
    Scenario, Workload, WorkloadConfig, WorkloadOutput, PRIVATE_LIB_DIR, REPLAY_ENV,
    REPLAY_TRACE_ENV,
};

/// Environment variable naming a file that [`skip`] appends its line to. `cargo xtask test`
/// sets it to a fresh file and counts the lines as skipped tests.
pub const SKIP_LOG_ENV: &str = "UVMWATCH_SKIP_LOG";

/// Reports that `test` cannot run here and why: prints `SKIPPED {test}: {reason}` to stderr
/// and, when `$UVMWATCH_SKIP_LOG` names a file, appends the same line to it (errors
/// ignored). The test then returns early, so cargo counts it as passed; `cargo xtask test`
/// subtracts the logged ones and reports them as skipped.
pub fn skip(test: &str, reason: &str) {
    // One line, whatever the reason holds, so the log stays one skip per line.
    let line = format!("SKIPPED {test}: {}", reason.replace('\n', " "));
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) {
        append_line(std::path::Path::new(&path), &line);
    }
}

/// Appends `line` and a newline to `path` in one write (so lines of tests running in
/// parallel do not interleave), creating the file; errors are ignored.
fn append_line(path: &std::path::Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn skip_lines_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips.log");
        super::append_line(&log, "SKIPPED a: needs root");
        super::append_line(&log, "SKIPPED b: no /dev/fuse");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "SKIPPED a: needs root\nSKIPPED b: no /dev/fuse\n"
        );
        // A directory that does not exist is not an error.
        super::append_line(&dir.path().join("no/such/dir"), "SKIPPED c: x");
    }
}

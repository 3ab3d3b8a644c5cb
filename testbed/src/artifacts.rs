//! Building the C doubles and finding the `uvmwatch-fakedev` binary.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Source of the fake `libcuda.so.1`, embedded so that any crate can build it.
pub const FAKE_LIBCUDA_C: &str = include_str!("../c/fake_libcuda.c");
/// Source of `cuda-workload`, embedded so that any crate can build it.
pub const CUDA_WORKLOAD_C: &str = include_str!("../c/cuda_workload.c");
/// File name of the FUSE server binary.
pub const FAKEDEV_BIN: &str = "uvmwatch-fakedev";
/// Environment variable that names the FUSE server binary, overriding the search.
pub const FAKEDEV_ENV: &str = "UVMWATCH_FAKEDEV";

/// The built test doubles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifacts {
    /// The fake `libcuda.so.1` (exports `cuInit`, `cuDriverGetVersion`).
    pub libcuda: PathBuf,
    /// The `cuda-workload` executable.
    pub workload: PathBuf,
    /// The `uvmwatch-fakedev` FUSE server executable.
    pub fakedev: PathBuf,
}

/// Compiles `libcuda.so.1` and `cuda-workload` into `out_dir` with the system C compiler
/// (`$CC`, else `cc`) and finds `uvmwatch-fakedev` with [`locate_fakedev`].
///
/// # Errors
/// The compiler is missing or fails, `out_dir` cannot be written, or the FUSE server binary
/// cannot be found.
pub fn build_artifacts(out_dir: &Path) -> Result<Artifacts> {
    build_artifacts_with_fakedev(out_dir, locate_fakedev()?)
}

/// Like [`build_artifacts`], with the FUSE server binary given, e.g. from
/// `env!("CARGO_BIN_EXE_uvmwatch-fakedev")` in this crate's own tests.
///
/// # Errors
/// The compiler is missing or fails, `out_dir` cannot be written, or `fakedev` is not a file.
pub fn build_artifacts_with_fakedev(out_dir: &Path, fakedev: PathBuf) -> Result<Artifacts> {
    if !fakedev.is_file() {
        bail!("{FAKEDEV_BIN} binary {} does not exist", fakedev.display());
    }
    let src_dir = out_dir.join("src");
    fs::create_dir_all(&src_dir).with_context(|| format!("create {}", src_dir.display()))?;
    let lib_src = src_dir.join("fake_libcuda.c");
    let workload_src = src_dir.join("cuda_workload.c");
    fs::write(&lib_src, FAKE_LIBCUDA_C)?;
    fs::write(&workload_src, CUDA_WORKLOAD_C)?;

    let libcuda = out_dir.join("libcuda.so.1");
    compile(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-Wl,-soname,libcuda.so.1".as_ref(),
        "-o".as_ref(),
        libcuda.as_os_str(),
        lib_src.as_os_str(),
        "-lpthread".as_ref(),
    ])?;
    let workload = out_dir.join("cuda-workload");
    compile(&[
        "-o".as_ref(),
        workload.as_os_str(),
        workload_src.as_os_str(),
        "-ldl".as_ref(),
        "-lpthread".as_ref(),
    ])?;
    Ok(Artifacts {
        libcuda,
        workload,
        fakedev,
    })
}

fn c_compiler() -> OsString {
    std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".into())
}

fn compile(args: &[&std::ffi::OsStr]) -> Result<()> {
    let cc = c_compiler();
    let output = Command::new(&cc)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-fno-omit-frame-pointer"])
        .args(args)
        .output()
        .with_context(|| format!("run C compiler {cc:?}"))?;
    if !output.status.success() {
        bail!(
            "{cc:?} {args:?} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Finds the `uvmwatch-fakedev` binary: `$UVMWATCH_FAKEDEV` if set, else next to the running
/// executable or up to two directories above it (a test binary lives in `target/<profile>/deps`,
/// cargo's binaries in `target/<profile>`).
///
/// Cargo does not build a dependency's binaries for another crate's tests: run
/// `cargo build -p uvmwatch-testbed --bin uvmwatch-fakedev` (same profile) first.
///
/// # Errors
/// The binary is not found, or `$UVMWATCH_FAKEDEV` names a missing file.
pub fn locate_fakedev() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(FAKEDEV_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!(
                "${FAKEDEV_ENV} names {}, which does not exist",
                path.display()
            );
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("current_exe")?;
    if let Some(found) = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.join(FAKEDEV_BIN))
        .find(|candidate| candidate.is_file())
    {
        return Ok(found);
    }
    bail!(
        "{FAKEDEV_BIN} not found near {}; build it with \
         `cargo build -p uvmwatch-testbed --bin {FAKEDEV_BIN}` or set ${FAKEDEV_ENV}",
        exe.display()
    )
}

/// Checks what the test doubles need: root, a usable `/dev/fuse`, `unshare` and `mount`
/// (util-linux), a C compiler, and `/usr/local` (mounted over inside the namespace for
/// [`crate::LibLocation::PrivateNamespace`]).
///
/// # Errors
/// A one-line reason, meant for [`crate::skip`].
pub fn check_environment() -> std::result::Result<(), String> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (mounts, mount namespaces)".into());
    }
    if let Err(e) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(format!("/dev/fuse is not usable: {e}"));
    }
    for tool in ["unshare", "mount", "umount"] {
        if !on_path(tool) {
            return Err(format!("`{tool}` (util-linux) is not on PATH"));
        }
    }
    let cc = c_compiler();
    if Command::new(&cc).arg("--version").output().is_err() {
        return Err(format!("no C compiler ({cc:?})"));
    }
    if !Path::new("/usr/local").is_dir() {
        return Err("/usr/local does not exist".into());
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

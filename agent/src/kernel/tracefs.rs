//! tracefs: finding (or mounting) it, and whether it lists an event.
//!
//! Tracepoint programs are attached by the id tracefs gives each event, so the agent needs
//! tracefs for the `syscalls` tracepoints (the `sched` ones are raw tracepoints, attached by
//! name). Many hosts (and containers) have it unmounted; the agent mounts it itself at
//! `/sys/kernel/tracing` when it can, and otherwise says how.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Places tracefs is usually found, newest first.
pub const CANDIDATES: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The mounted tracefs directory, if any (one holding an `events` directory).
pub fn find() -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Returns the tracefs directory, mounting tracefs at `/sys/kernel/tracing` if no mounted
/// copy is found.
///
/// # Errors
/// When it is not mounted and mounting fails (not root / no `CAP_SYS_ADMIN`, no tracefs in
/// the kernel, a read-only `/sys` in a container); the message says how to fix it.
pub fn ensure_mounted() -> Result<PathBuf> {
    if let Some(p) = find() {
        return Ok(p);
    }
    let target = Path::new(CANDIDATES[0]);
    let src = c"nodev";
    let fstype = c"tracefs";
    let tgt = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it at {} failed: {err}; mount it with \
             `mount -t tracefs nodev {}` (in a container: mount the host's /sys/kernel/tracing)",
            target.display(),
            target.display()
        );
    }
    if !target.join("events").is_dir() {
        bail!(
            "mounted tracefs at {} but it has no events directory",
            target.display()
        );
    }
    Ok(target.to_path_buf())
}

/// Whether the tracepoint `category:name` exists under `tracefs`.
pub fn has_event(tracefs: &Path, category: &str, name: &str) -> bool {
    tracefs.join("events").join(category).join(name).is_dir()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, field lines)` of every record format quoted in `text`: a doc block from a
    /// `/// name: <event>` line to the end of its fence, the `field:` lines with their
    /// whitespace collapsed.
    fn quoted_formats(text: &str) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        let mut open = false;
        for line in text.lines() {
            let Some(doc) = line.trim().strip_prefix("///") else {
                open = false;
                continue;
            };
            let doc = doc.trim();
            if let Some(name) = doc.strip_prefix("name: ") {
                out.push((name.to_string(), Vec::new()));
                open = true;
            } else if doc.starts_with("```") {
                open = false;
            } else if open && doc.starts_with("field:") {
                let fields = &mut out.last_mut().expect("opened by a name line").1;
                fields.push(collapsed(doc));
            }
        }
        out
    }

    /// A `field:` line with its runs of whitespace made one space (tracefs uses tabs).
    fn collapsed(line: &str) -> String {
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The `syscalls:*` records the programs read through `#[repr(C)]` structs are laid out
    /// as the formats quoted above those structs say (the structs were written from them):
    /// each quote is checked against this kernel's tracefs.
    #[test]
    fn the_quoted_syscall_formats_are_this_kernels() {
        let Some(t) = find() else {
            uvmwatch_testbed::skip(
                "the_quoted_syscall_formats_are_this_kernels",
                "tracefs not mounted",
            );
            return;
        };
        let probes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent-ebpf/src/probes");
        let mut checked = Vec::new();
        for file in ["ioctl.rs", "open.rs", "mod.rs"] {
            let text = std::fs::read_to_string(probes.join(file)).unwrap();
            for (name, quoted) in quoted_formats(&text) {
                let live =
                    std::fs::read_to_string(t.join("events/syscalls").join(&name).join("format"))
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                let live: Vec<String> = live
                    .lines()
                    .map(str::trim)
                    .filter(|l| l.starts_with("field:"))
                    .map(collapsed)
                    .collect();
                assert_eq!(quoted, live, "{file}: {name}");
                checked.push(name);
            }
        }
        checked.sort();
        assert_eq!(
            checked,
            [
                "sys_enter_ioctl",
                "sys_enter_open",
                "sys_enter_openat",
                "sys_enter_openat2",
                "sys_exit_openat"
            ]
        );
    }
}

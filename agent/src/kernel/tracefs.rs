//! tracefs: finding (or mounting) it and reading tracepoint `format` files.
//!
//! Tracepoint programs are attached by the id tracefs gives each event, so the agent needs
//! tracefs. Many hosts (and containers) have it unmounted; the agent mounts it itself at
//! `/sys/kernel/tracing` when it can, and otherwise says how.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

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

/// One field of a tracepoint record, from its `format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field name, e.g. `child_pid`.
    pub name: String,
    /// Declared C type, e.g. `pid_t`.
    pub ty: String,
    /// Byte offset in the record.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// Parses the text of a tracepoint `format` file into its fields.
///
/// Lines look like `\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;`.
///
/// # Errors
/// When no field line could be parsed.
pub fn parse_format(text: &str) -> Result<Vec<Field>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for (i, part) in rest.split(';').enumerate() {
            let part = part.trim();
            if i == 0 {
                decl = Some(part.to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse::<u32>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<u32>().ok();
            }
        }
        let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) else {
            continue;
        };
        // The name is the last identifier once array brackets (`[16]`, `[]`) are removed.
        let mut base = String::new();
        let mut depth = 0;
        for ch in decl.chars() {
            match ch {
                '[' => depth += 1,
                ']' => depth -= 1,
                c if depth == 0 => base.push(c),
                _ => {}
            }
        }
        let base = base.trim();
        let Some((ty, name)) = base.rsplit_once(|c: char| c.is_whitespace() || c == '*') else {
            continue;
        };
        out.push(Field {
            name: name.to_string(),
            ty: ty.trim().to_string(),
            offset,
            size,
        });
    }
    if out.is_empty() {
        bail!("no fields in tracepoint format");
    }
    Ok(out)
}

/// Reads and parses `events/<category>/<name>/format`.
///
/// # Errors
/// A missing or unreadable file, or one without fields.
pub fn read_format(tracefs: &Path, category: &str, name: &str) -> Result<Vec<Field>> {
    let p = tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    parse_format(&text).with_context(|| format!("parsing {}", p.display()))
}

/// Offset of field `field` of tracepoint `category:name`, if the field exists.
pub fn field_offset(
    tracefs: &Path,
    category: &str,
    name: &str,
    field: &str,
) -> Result<Option<u32>> {
    Ok(read_format(tracefs, category, name)?
        .into_iter()
        .find(|f| f.name == field)
        .map(|f| f.offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    // sched_process_fork as printed by 6.18 (comms as __data_loc) and by 6.1/6.12.
    const FORK_618: &str = "name: sched_process_fork\nID: 300\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";
    const FORK_612: &str = "format:\n\
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";

    #[test]
    fn parses_both_fork_layouts() {
        let f = parse_format(FORK_618).unwrap();
        let c = f.iter().find(|f| f.name == "child_pid").unwrap();
        assert_eq!((c.offset, c.size, c.ty.as_str()), (20, 4, "pid_t"));
        assert!(f.iter().any(|f| f.name == "parent_comm" && f.offset == 8));
        let f = parse_format(FORK_612).unwrap();
        assert_eq!(f.iter().find(|f| f.name == "child_pid").unwrap().offset, 44);
        assert_eq!(f.iter().find(|f| f.name == "child_comm").unwrap().size, 16);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_format("").is_err());
        assert!(parse_format("field:;offset:x;").is_err());
    }

    #[test]
    fn reads_this_kernels_format_when_available() {
        let Some(t) = find() else {
            uvmwatch_testbed::skip(
                "reads_this_kernels_format_when_available",
                "tracefs not mounted",
            );
            return;
        };
        let off = field_offset(&t, "sched", "sched_process_fork", "child_pid").unwrap();
        assert!(off.is_some());
        let f = read_format(&t, "syscalls", "sys_enter_ioctl").unwrap();
        assert_eq!(f.iter().find(|f| f.name == "cmd").unwrap().offset, 24);
    }
}

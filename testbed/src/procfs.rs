//! Small `/proc` readers for tests: where a workload's threads sleep, what is mounted, and a
//! snapshot of `/dev` to prove the host's was not changed.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One thread of a process, as `/proc/<pid>/task/<tid>` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Thread id.
    pub tid: u32,
    /// Scheduler state letter from `stat` (`R`, `S`, `D`, ...).
    pub state: char,
    /// Kernel function the thread sleeps in (`wchan`), empty or `0` when running. A thread
    /// blocked in a FUSE request shows `request_wait_answer`.
    pub wchan: String,
    /// Contents of `syscall`: the number and arguments of the system call it is blocked in
    /// (x86_64: `16 <fd> <cmd> ...` for `ioctl`), `running`, or empty if unreadable.
    pub syscall: String,
}

impl ThreadInfo {
    /// The `ioctl` request number, when the thread is blocked in `ioctl` (x86_64 syscall 16).
    pub fn blocked_ioctl_cmd(&self) -> Option<u32> {
        let mut fields = self.syscall.split_whitespace();
        if fields.next()? != "16" {
            return None;
        }
        let cmd = fields.nth(1)?;
        let cmd = u64::from_str_radix(cmd.strip_prefix("0x")?, 16).ok()?;
        u32::try_from(cmd).ok()
    }
}

/// Reads every thread of process `pid`.
///
/// # Errors
/// The process does not exist (or exited meanwhile).
pub fn threads(pid: u32) -> io::Result<Vec<ThreadInfo>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let dir = entry.path();
        let stat = fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // The state follows the parenthesised command name, which may contain spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .unwrap_or('?');
        out.push(ThreadInfo {
            tid,
            state,
            wchan: fs::read_to_string(dir.join("wchan")).unwrap_or_default(),
            syscall: fs::read_to_string(dir.join("syscall"))
                .unwrap_or_default()
                .trim()
                .to_string(),
        });
    }
    out.sort_by_key(|t| t.tid);
    Ok(out)
}

/// Polls the threads of `pid` every 20 ms until one satisfies `pred`, for at most `timeout`.
///
/// # Errors
/// The process went away, or no thread matched in time (the error lists the threads seen).
pub fn wait_for_thread(
    pid: u32,
    timeout: Duration,
    pred: impl Fn(&ThreadInfo) -> bool,
) -> io::Result<ThreadInfo> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = threads(pid)?;
        if let Some(t) = seen.iter().find(|t| pred(t)) {
            return Ok(t.clone());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no thread of {pid} matched within {timeout:?}; threads: {seen:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount point, unescaped.
    pub mount_point: PathBuf,
    /// File system type, e.g. `fuse.uvmwatch-fakedev`.
    pub fstype: String,
    /// Mount source, e.g. `uvmwatch-fakedev`.
    pub source: String,
}

/// The mounts of this process's mount namespace.
///
/// # Errors
/// `/proc/self/mountinfo` cannot be read.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = unescape_mount_field(left.split(' ').nth(4)?);
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let source = unescape_mount_field(right.next()?);
    Some(MountEntry {
        mount_point: PathBuf::from(mount_point),
        fstype,
        source,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mount_field(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether something is mounted exactly at `path` in this mount namespace.
///
/// # Errors
/// `/proc/self/mountinfo` cannot be read.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(mounts()?.iter().any(|m| m.mount_point == path))
}

/// What [`dev_snapshot`] records about each entry: file type and mode bits, device number,
/// and the target of a symbolic link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevEntry {
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// `st_rdev` for device nodes, else 0.
    pub rdev: u64,
    /// Target of a symbolic link.
    pub link: Option<PathBuf>,
}

/// Records every entry under `/dev` (not following links, skipping the volatile `pts`,
/// `shm` and `mqueue`), to compare before and after a test.
///
/// # Errors
/// `/dev` cannot be read.
pub fn dev_snapshot() -> io::Result<BTreeMap<PathBuf, DevEntry>> {
    let mut out = BTreeMap::new();
    walk_dev(Path::new("/dev"), &mut out)?;
    Ok(out)
}

fn walk_dev(dir: &Path, out: &mut BTreeMap<PathBuf, DevEntry>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if dir == Path::new("/dev")
            && matches!(entry.file_name().to_str(), Some("pts" | "shm" | "mqueue"))
        {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = meta.file_type();
        out.insert(
            path.clone(),
            DevEntry {
                mode: meta.mode(),
                rdev: if ft.is_char_device() || ft.is_block_device() {
                    meta.rdev()
                } else {
                    0
                },
                link: ft.is_symlink().then(|| fs::read_link(&path).ok()).flatten(),
            },
        );
        if ft.is_dir() {
            // Entries that vanish or cannot be read (races, permissions) are skipped.
            let _ = walk_dev(&path, out);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let m = parse_mountinfo_line(
            "43 27 0:39 / /tmp/a\\040b rw,nosuid,nodev,relatime - fuse.uvmwatch-fakedev \
             uvmwatch-fakedev rw,user_id=0,group_id=0,allow_other",
        )
        .unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/tmp/a b"));
        assert_eq!(m.fstype, "fuse.uvmwatch-fakedev");
        assert_eq!(m.source, "uvmwatch-fakedev");
        assert_eq!(unescape_mount_field("a\\134b\\"), "a\\b\\");
    }

    #[test]
    fn decodes_blocked_ioctl() {
        let t = ThreadInfo {
            tid: 1,
            state: 'S',
            wchan: "request_wait_answer".into(),
            syscall: "16 0x6 0x25 0x7ffc6e0b1d70 0x0 0x0 0x0 0x7ffc6e0b1ce0 0x7f5a73d23d6b".into(),
        };
        assert_eq!(t.blocked_ioctl_cmd(), Some(0x25));
        let t = ThreadInfo {
            syscall: "running".into(),
            ..t
        };
        assert_eq!(t.blocked_ioctl_cmd(), None);
    }

    #[test]
    fn reads_own_threads() {
        let me = threads(std::process::id()).unwrap();
        assert!(!me.is_empty());
    }
}

//! Where the doctor reads the diagnosed machine from: this machine ([`Root::Live`], set up
//! by [`Root::live`] for `uvmwatch doctor` or [`Root::observer`] for the agent) or a snapshot
//! directory ([`Root::Snapshot`]: an unpacked bundle or a test fixture), and the
//! [`ReadLog`] that keeps what was read so that a bundle can save exactly that.
//!
//! Every reader takes the absolute path as it is on the diagnosed machine
//! (`/proc/cmdline`); a snapshot holds that file at `<dir>/proc/cmdline`. What cannot be a
//! plain file in an archive lives in small JSON files of the snapshot (layout in
//! `docs/doctor-bundle.md`):
//! - `dev/nodes.json` ([`NodesFile`]): type, `(major, minor)`, mode, owner and the result
//!   of the collector's `open(2)` of every path whose metadata was asked for (device nodes
//!   cannot be archived);
//! - `commands/<name>.txt`: the standard output of a command ([`Root::command`]) or the
//!   kernel log ([`Root::kernel_log`], saved as `commands/dmesg.txt`);
//! - `manifest.json` ([`Manifest`]): symbolic links read, errors other than "no such file",
//!   failed commands, so that a snapshot answers every read as the live machine did.
//!
//! A file missing from a snapshot reads as `ENOENT`, like a file missing on a live machine.
//!
//! Parts: [`Live`] (`live.rs`), the snapshot layout and its answers (`snapshot.rs`), the
//! [`ReadLog`] (`record.rs`), commands with a time limit (`command.rs`) and the kernel log
//! device (`kmsg.rs`). This module dispatches each reader to them.

mod command;
mod kmsg;
mod live;
mod record;
mod snapshot;

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use command::{timed_out, CommandError, COMMAND_TIMEOUT, TIMED_OUT_VERDICT};
pub use kmsg::format_kmsg_record;
pub use live::{Live, OPEN_TIMED_OUT, OPEN_TIMEOUT};
pub use record::{ReadLog, Recorded};
pub use snapshot::{
    command_file, read_manifest, read_nodes, CommandEntry, Manifest, NodeRecord, NodesFile, Op,
    ReadError, COMMANDS_DIR, EVIDENCE_FILE, KERNEL_LOG_NAME, MANIFEST_FILE, NODES_FILE,
    OBSERVATIONS_FILE, OBSERVATIONS_FORMAT, SNAPSHOT_FORMAT,
};

use command::command_line;
use record::FilterRecording;

/// The machine being diagnosed.
#[derive(Clone, Debug)]
pub enum Root {
    /// This machine, read as it is now.
    Live(Live),
    /// A snapshot directory laid out like the diagnosed machine's file system, plus the
    /// bundle's metadata files (see the module documentation).
    Snapshot(PathBuf),
    /// Another root whose every read (result or error) is also kept in the [`ReadLog`].
    /// Build it with [`Root::recording`].
    Recorded(Box<Root>, ReadLog),
}

/// Type of a file, after following symbolic links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// Character device.
    Char,
    /// Block device.
    Block,
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
}

/// What `stat(2)` (symbolic links followed) tells of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMeta {
    /// Type of the file.
    pub kind: FileKind,
    /// `(major, minor)` of `st_rdev` for character and block devices, else `None`.
    pub dev: Option<(u32, u32)>,
    /// Permission bits of `st_mode` (`0o7777` mask), e.g. `0o666`.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
}

impl NodeMeta {
    /// What `stat(2)` returned, as a [`NodeMeta`].
    pub fn of(m: &fs::Metadata) -> NodeMeta {
        let ft = m.file_type();
        let kind = if ft.is_char_device() {
            FileKind::Char
        } else if ft.is_block_device() {
            FileKind::Block
        } else if ft.is_dir() {
            FileKind::Dir
        } else if ft.is_fifo() {
            FileKind::Fifo
        } else if ft.is_socket() {
            FileKind::Socket
        } else {
            FileKind::File
        };
        let dev = matches!(kind, FileKind::Char | FileKind::Block)
            .then(|| (libc::major(m.rdev()), libc::minor(m.rdev())));
        NodeMeta {
            kind,
            dev,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        }
    }
}

impl Root {
    /// This machine as `uvmwatch doctor` reads it: below `host_root` (`--host-root`) when
    /// given, else at `/`, where it also opens each device node once. With a host root it
    /// opens none (a doctor in a container must not open the host's GPU nodes).
    pub fn live(host_root: Option<&Path>) -> Root {
        Root::Live(Live {
            prefix: host_root.map(Path::to_path_buf),
            open_devices: host_root.is_none(),
        })
    }

    /// This machine as the agent reads it: below `host_root` when given, and never opening
    /// a device node (see [`Live::open_devices`]).
    pub fn observer(host_root: Option<&Path>) -> Root {
        Root::Live(Live {
            prefix: host_root.map(Path::to_path_buf),
            open_devices: false,
        })
    }

    /// This root, with every read also kept in `recorder`.
    pub fn recording(self, recorder: &ReadLog) -> Root {
        Root::Recorded(Box::new(self), recorder.clone())
    }

    /// Whether the reads reach this machine's live state (also through a recorder).
    pub fn is_live(&self) -> bool {
        match self {
            Root::Live(_) => true,
            Root::Snapshot(_) => false,
            Root::Recorded(inner, _) => inner.is_live(),
        }
    }

    /// Where `path` of the diagnosed machine is on this machine's file system: the path
    /// itself when live (below the host root when there is one), `<dir>/<path>` in a
    /// snapshot. For helpers that take a directory such as `proc_root`. `..` components are
    /// dropped.
    pub fn fs_path(&self, path: &str) -> PathBuf {
        match self {
            Root::Live(live) => live.path(path),
            Root::Snapshot(dir) => join_below(dir, path),
            Root::Recorded(inner, _) => inner.fs_path(path),
        }
    }

    /// Contents of the file at absolute `path`, at most its limit
    /// ([`input::limit_for`](crate::doctor::input::limit_for)).
    ///
    /// Errors: as `read(2)` on the diagnosed machine: `NotFound` when missing, the recorded
    /// error (same errno) for a snapshot of an unreadable file, `InvalidInput` for a path
    /// that is not absolute or has `..` components in a snapshot;
    /// [`TooLarge`](crate::doctor::input::TooLarge) past the limit.
    pub fn read_bytes(&self, path: &str) -> io::Result<Vec<u8>> {
        match self {
            Root::Live(live) => live.read_bytes(path),
            Root::Snapshot(dir) => snapshot::read_bytes(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.read_bytes(path);
                rec.read(path, &res);
                res
            }
        }
    }

    /// Contents of the text file at `path`; bytes that are not UTF-8 become U+FFFD.
    ///
    /// Errors: as [`Self::read_bytes`].
    pub fn read_to_string(&self, path: &str) -> io::Result<String> {
        self.read_bytes(path).map(crate::doctor::input::into_text)
    }

    /// The records of the file at `path` (split on `sep`, e.g. `b'\n'` for lines or `0` for
    /// `environ`) that `keep` maps to `Some`, joined again with `sep` after each one. A
    /// recorder keeps only that result (and errors): use it for files of which only a part
    /// may leave the machine (`/proc/1/environ`, `/proc/iomem`). `keep` must give the same
    /// answer for its own output (a snapshot applies it again).
    ///
    /// Errors: as [`Self::read_bytes`].
    pub fn read_filtered(
        &self,
        path: &str,
        sep: u8,
        keep: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<Vec<u8>> {
        self.filtered(path, sep, keep, FilterRecording::Always)
    }

    /// Like [`Self::read_filtered`], for scans over every process (`/proc/<pid>/maps`,
    /// `/proc/<pid>/comm`): a recorder keeps the result only when something was kept and
    /// keeps no errors, so that a bundle holds only the processes of interest.
    ///
    /// Errors: as [`Self::read_bytes`].
    pub fn scan_filtered(
        &self,
        path: &str,
        sep: u8,
        keep: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<Vec<u8>> {
        self.filtered(path, sep, keep, FilterRecording::NonEmpty)
    }

    fn filtered(
        &self,
        path: &str,
        sep: u8,
        keep: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
        recording: FilterRecording,
    ) -> io::Result<Vec<u8>> {
        match self {
            Root::Recorded(inner, rec) => {
                let res = inner.filtered(path, sep, keep, recording);
                rec.filtered(path, &res, recording);
                res
            }
            _ => Ok(filter_records(&self.read_bytes(path)?, sep, keep)),
        }
    }

    /// Names in the directory at `path`, sorted. In a snapshot these are the entries saved
    /// (for `/dev`: those of `dev/nodes.json`), not every entry the machine had.
    ///
    /// Errors: as `opendir(3)`/`readdir(3)` on the diagnosed machine.
    pub fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        match self {
            Root::Live(live) => live.read_dir(path),
            Root::Snapshot(dir) => snapshot::read_dir(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.read_dir(path);
                rec.dir(path, &res);
                res
            }
        }
    }

    /// Target of the symbolic link at `path`, as `readlink(2)` returns it.
    ///
    /// Errors: `InvalidInput` (`EINVAL`) when `path` is not a link, `NotFound` when missing,
    /// or the recorded error.
    pub fn read_link(&self, path: &str) -> io::Result<String> {
        match self {
            Root::Live(live) => live.read_link(path),
            Root::Snapshot(dir) => snapshot::read_link(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.read_link(path);
                rec.link(path, &res);
                res
            }
        }
    }

    /// `stat(2)` of `path`, symbolic links followed. In a snapshot: the `dev/nodes.json`
    /// entry, else the saved file or directory itself.
    ///
    /// Errors: as `stat(2)` on the diagnosed machine (`NotFound` for a missing path or a
    /// dangling link).
    pub fn metadata(&self, path: &str) -> io::Result<NodeMeta> {
        match self {
            Root::Live(live) => live.metadata(path),
            Root::Snapshot(dir) => snapshot::metadata(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.metadata(path);
                rec.metadata(path, &res);
                res
            }
        }
    }

    /// Whether `path` exists (symbolic links followed), i.e. [`Self::metadata`] succeeds.
    pub fn exists(&self, path: &str) -> bool {
        self.metadata(path).is_ok()
    }

    /// Opens the device node at `path` with `O_RDWR | O_CLOEXEC` and closes it again, as
    /// CUDA would open it, and reports the outcome: `Some(Ok(()))` when it opened,
    /// `Some(Err(name))` with the errno name (`EPERM`, `EACCES`, `ENOENT`, `ENXIO`, `EIO`,
    /// ..., or [`OPEN_TIMED_OUT`] after [`OPEN_TIMEOUT`]). A snapshot answers what was
    /// recorded when it was taken, or `None` (not tried).
    ///
    /// Live, this has the side effects of a real open (the driver may initialise the GPU).
    pub fn open_device(&self, path: &str) -> Option<Result<(), String>> {
        match self {
            Root::Live(live) => live.open_device(path),
            Root::Snapshot(dir) => snapshot::open_device(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.open_device(path);
                rec.open(path, &res);
                res
            }
        }
    }

    /// Standard output of the command `name args...`. Live it runs with `LC_ALL=C`, no
    /// standard input and [`COMMAND_TIMEOUT`]; a snapshot reads `commands/<name>.txt` (one
    /// capture per command name). At most
    /// [`COMMAND_OUTPUT_LIMIT`](crate::doctor::input::COMMAND_OUTPUT_LIMIT) is read.
    ///
    /// Errors: [`CommandError`]: not installed, timed out, non-zero exit (with its output),
    /// output too large, or not captured in the snapshot.
    pub fn command(&self, name: &str, args: &[&str]) -> Result<String, CommandError> {
        let line = command_line(name, args);
        match self {
            Root::Live(live) => live.command(name, args),
            Root::Snapshot(dir) => snapshot::command(dir, name, &line).map(|log| log.text),
            Root::Recorded(inner, rec) => {
                let res = inner.command(name, args);
                rec.command(name, args, &line, &res);
                res
            }
        }
    }

    /// The kernel log as `dmesg` prints it (`[seconds.micros] message` lines) and where it
    /// came from. Live: `/dev/kmsg` read without blocking until no record is left (needs
    /// root or `kernel.dmesg_restrict=0`), else the `dmesg` command. A snapshot reads
    /// `commands/dmesg.txt`. Only the newest
    /// [`KERNEL_LOG_LIMIT`](crate::doctor::input::KERNEL_LOG_LIMIT) are kept
    /// ([`CapturedText::dropped_bytes`]).
    ///
    /// Errors: [`CommandError`]: both sources failed (both reasons given), or not captured.
    pub fn kernel_log(&self) -> Result<CapturedText, CommandError> {
        match self {
            Root::Live(live) => live.kernel_log(),
            Root::Snapshot(dir) => snapshot::command(dir, KERNEL_LOG_NAME, KERNEL_LOG_NAME),
            Root::Recorded(inner, rec) => {
                let res = inner.kernel_log();
                rec.kernel_log(&res);
                res
            }
        }
    }
}

/// The kernel log ([`Root::kernel_log`]) or a command's output as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedText {
    /// The text; for the kernel log `[seconds.micros] message` lines, the newest ones when
    /// the log was too long.
    pub text: String,
    /// Where it came from: `/dev/kmsg`, `dmesg`, or the source a snapshot names.
    pub source: String,
    /// Bytes of older text left out before `text` (0 when it was read whole; only the
    /// kernel log keeps its newest part).
    pub dropped_bytes: u64,
}

/// `base` joined with the normal components of `path` (`/`, `.` and `..` dropped), so that
/// the result always lies below `base`.
fn join_below(base: &Path, path: &str) -> PathBuf {
    let mut out = base.to_path_buf();
    out.extend(Path::new(path).components().filter_map(|c| match c {
        Component::Normal(n) => Some(n),
        _ => None,
    }));
    out
}

/// Splits `bytes` on `sep`, keeps what `keep` maps to `Some`, and joins the kept records
/// with `sep` after each.
fn filter_records(bytes: &[u8], sep: u8, keep: &dyn Fn(&[u8]) -> Option<Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for record in bytes.split(|&b| b == sep) {
        if record.is_empty() {
            continue;
        }
        if let Some(kept) = keep(record) {
            out.extend_from_slice(&kept);
            out.push(sep);
        }
    }
    out
}

/// An errno as the report prints it: its name (`EPERM`), or `errno N` for a value Linux
/// does not define.
pub fn errno_name(errno: i32) -> String {
    match crate::decode::errno::name(errno) {
        Some(n) => n.to_string(),
        None => format!("errno {errno}"),
    }
}

/// Writes `contents` at `path`, creating its directories (for the tests of this module's
/// parts).
#[cfg(test)]
fn write_test_file(path: &Path, contents: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers_and_errno_names() {
        // makedev(508, 0) and makedev(195, 255), and a large minor.
        let split = |d: u64| (libc::major(d), libc::minor(d));
        assert_eq!(split(0x1fc00), (508, 0));
        assert_eq!(split(0xc3ff), (195, 255));
        // glibc's makedev() for numbers wider than the old 8-bit fields.
        let makedev = |maj: u64, min: u64| {
            ((maj & 0xffff_f000) << 32)
                | ((maj & 0xfff) << 8)
                | ((min & 0xffff_ff00) << 12)
                | (min & 0xff)
        };
        assert_eq!(split(makedev(0x12345, 0x6789a)), (0x12345, 0x6789a));
        assert_eq!(errno_name(libc::EPERM), "EPERM");
        assert_eq!(errno_name(libc::ENXIO), "ENXIO");
        assert_eq!(errno_name(4095), "errno 4095");
        assert_eq!(command_file("nvidia smi/x"), "commands/nvidia_smi_x.txt");
    }
}

//! Where `uvmwatch doctor` reads the diagnosed machine from: this machine ([`Root::Live`]) or
//! a snapshot directory ([`Root::Snapshot`]: an unpacked bundle or a test fixture), and the
//! [`Recorder`] that keeps what was read so that a bundle can save exactly that.
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long [`Root::command`] lets a live command run before killing it (10 s). A hung
/// driver makes `nvidia-smi` block; the doctor must still finish.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Root::open_device`] waits for a live `open(2)` of a device node (5 s). Opening
/// `/dev/nvidiaN` without persistence mode initialises the GPU, which can take seconds, and a
/// wedged driver can block it for ever; the open then runs on in a detached thread.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`Root::open_device`] reports when the open did not return within [`OPEN_TIMEOUT`].
/// Not an errno name: the kernel returned nothing.
pub const OPEN_TIMED_OUT: &str = "TIMEOUT";

/// Name under which the kernel log is kept among the commands (`commands/dmesg.txt`).
pub const KERNEL_LOG_NAME: &str = "dmesg";

/// Snapshot file with the manifest ([`Manifest`]), relative to the snapshot root.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Snapshot file with the collected evidence (written by the bundle, never read back by the
/// collectors), relative to the snapshot root.
pub const EVIDENCE_FILE: &str = "evidence.json";
/// Snapshot file with the probes' observations, when the bundle was written with some
/// (never read back by the collectors), relative to the snapshot root.
pub const OBSERVATIONS_FILE: &str = "observations.json";
/// Snapshot directory with command outputs (`<name>.txt`), relative to the snapshot root.
pub const COMMANDS_DIR: &str = "commands";
/// Snapshot file describing device nodes and other metadata ([`NodesFile`]), relative to the
/// snapshot root.
pub const NODES_FILE: &str = "dev/nodes.json";

/// Version of the snapshot layout written in [`Manifest::format`].
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Whether [`Root::open_device`] really opens nodes on the live machine (the default, as
/// `uvmwatch doctor` does). The agent turns it off ([`set_live_opens`]): an observer must not
/// open GPU nodes itself (that can start GPU initialisation), and the probes see the
/// workloads' own opens.
static LIVE_OPENS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns live device-node opens on or off for the whole process (see [`Root::open_device`]).
pub fn set_live_opens(on: bool) {
    LIVE_OPENS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Where the live machine's file system is mounted, when not at `/`: a container (e.g. the
/// Kubernetes DaemonSet) sees the host's `/` at, say, `/host` (`--host-root`). Set once at
/// start; every live file read, directory listing, link and `stat` goes below it, and the
/// kernel log is read from `<prefix>/dev/kmsg`. Commands (`nvidia-smi`) still run in the
/// agent's own file system.
static LIVE_PREFIX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Sets the host root for live reads (see [`LIVE_PREFIX`]); live device opens are turned
/// off too (an observer in a container must not open the host's GPU nodes). Only the first
/// call counts.
pub fn set_live_prefix(prefix: &Path) {
    let _ = LIVE_PREFIX.set(prefix.to_path_buf());
    set_live_opens(false);
}

/// `path` of the live machine on this file system (below the host root when one is set).
fn live(path: &str) -> PathBuf {
    match LIVE_PREFIX.get() {
        Some(p) => {
            let mut out = p.clone();
            out.extend(Path::new(path).components().filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            }));
            out
        }
        None => PathBuf::from(path),
    }
}

/// The machine being diagnosed.
#[derive(Clone, Debug)]
pub enum Root {
    /// This machine, read as it is now.
    Live,
    /// A snapshot directory laid out like the diagnosed machine's file system, plus the
    /// bundle's metadata files (see the module documentation).
    Snapshot(PathBuf),
    /// Another root whose every read (result or error) is also kept in the [`Recorder`].
    /// Build it with [`Root::recording`].
    Recorded(Box<Root>, Recorder),
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

/// One entry of `dev/nodes.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Absolute path on the diagnosed machine, e.g. `/dev/nvidia-uvm`.
    pub path: String,
    /// File type after following links; absent when `stat` failed (see the manifest's
    /// errors) but an open was tried.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FileKind>,
    /// Device major number (character and block devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    /// Device minor number (character and block devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// Permission bits in octal, e.g. `"0666"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Owner user id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Result of the collector's `open(O_RDWR | O_CLOEXEC)`: `"ok"`, an errno name
    /// (`"EPERM"`) or [`OPEN_TIMED_OUT`]; absent when not tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<String>,
}

impl NodeRecord {
    /// The metadata part as a [`NodeMeta`], when the type is known.
    pub fn meta(&self) -> Option<NodeMeta> {
        let kind = self.kind?;
        let dev = match (self.major, self.minor) {
            (Some(major), Some(minor)) => Some((major, minor)),
            _ => None,
        };
        let mode = self
            .mode
            .as_deref()
            .and_then(|m| u32::from_str_radix(m, 8).ok())
            .unwrap_or(0);
        Some(NodeMeta {
            kind,
            dev,
            mode,
            uid: self.uid.unwrap_or(0),
            gid: self.gid.unwrap_or(0),
        })
    }

    fn set_meta(&mut self, meta: &NodeMeta) {
        self.kind = Some(meta.kind);
        self.major = meta.dev.map(|d| d.0);
        self.minor = meta.dev.map(|d| d.1);
        self.mode = Some(format!("{:04o}", meta.mode));
        self.uid = Some(meta.uid);
        self.gid = Some(meta.gid);
    }

    /// The open result as [`crate::doctor::facts::DevNode::open`] holds it.
    pub fn open_result(&self) -> Option<Result<(), String>> {
        self.open.as_deref().map(|o| match o {
            "ok" => Ok(()),
            err => Err(err.to_string()),
        })
    }
}

/// Contents of `dev/nodes.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesFile {
    /// One entry per path, sorted by path.
    pub nodes: Vec<NodeRecord>,
}

/// Reader operation, to key recorded errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// [`Root::read_bytes`] and the other file reads.
    Read,
    /// [`Root::read_dir`].
    ReadDir,
    /// [`Root::read_link`].
    ReadLink,
    /// [`Root::metadata`] and [`Root::exists`].
    Metadata,
}

/// A read that failed with something other than "no such file".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadError {
    /// Which reader.
    pub op: Op,
    /// Absolute path on the diagnosed machine.
    pub path: String,
    /// `errno` when the error came from the kernel (replayed exactly from a snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// The error as printed, e.g. `Permission denied (os error 13)`.
    pub error: String,
}

impl ReadError {
    fn new(op: Op, path: &str, err: &io::Error) -> Self {
        ReadError {
            op,
            path: path.to_string(),
            errno: err.raw_os_error(),
            error: err.to_string(),
        }
    }

    /// The error again as an [`io::Error`] (same text when `errno` is known).
    pub fn to_io(&self) -> io::Error {
        match self.errno {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::other(self.error.clone()),
        }
    }
}

/// A captured command's place in the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEntry {
    /// Name, also the file name: `commands/<name>.txt`.
    pub name: String,
    /// Arguments it ran with.
    pub args: Vec<String>,
    /// What produced the text on the diagnosed machine, e.g. `nvidia-smi -q` or `/dev/kmsg`.
    pub source: String,
    /// Path of the output inside the snapshot, e.g. `commands/nvidia-smi.txt`.
    pub file: String,
}

/// Contents of `manifest.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version ([`SNAPSHOT_FORMAT`]).
    #[serde(default)]
    pub format: u32,
    /// Version of the uvmwatch that wrote the bundle.
    #[serde(default)]
    pub agent_version: String,
    /// When the bundle was written, RFC 3339 UTC.
    #[serde(default)]
    pub created: String,
    /// Host name of the machine that wrote the bundle (`/proc/sys/kernel/hostname`).
    #[serde(default)]
    pub hostname: String,
    /// Commands whose output is in `commands/`.
    #[serde(default)]
    pub commands: Vec<CommandEntry>,
    /// Commands that could not run or failed, by name.
    #[serde(default)]
    pub command_errors: BTreeMap<String, CommandError>,
    /// Symbolic links read: path -> target as `readlink(2)` returned it.
    #[serde(default)]
    pub links: BTreeMap<String, String>,
    /// Reads that failed with something other than "no such file" (permission, I/O, ...).
    #[serde(default)]
    pub errors: Vec<ReadError>,
    /// Paths that were looked for and did not exist (informational; a snapshot answers
    /// them with `ENOENT` anyway).
    #[serde(default)]
    pub missing: Vec<String>,
    /// Files saved filtered (only the lines or entries the collectors use; see
    /// `docs/doctor-bundle.md`).
    #[serde(default)]
    pub filtered: Vec<String>,
}

/// Why [`Root::command`] or [`Root::kernel_log`] gave no output. The `Display` text is
/// meant for users and starts with a short verdict (`not present:`, `failed:`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum CommandError {
    /// The program is not installed (`execve` gave `ENOENT` for every `PATH` entry).
    NotInstalled {
        /// Command line, e.g. `nvidia-smi -q`.
        command: String,
    },
    /// A snapshot without this command's output.
    NotCaptured {
        /// Command line.
        command: String,
    },
    /// Killed after [`COMMAND_TIMEOUT`].
    TimedOut {
        /// Command line.
        command: String,
        /// Seconds it was given.
        seconds: u64,
    },
    /// Exited with a non-zero status or was killed by a signal.
    Failed {
        /// Command line.
        command: String,
        /// `exit status 9`, `signal 9`, ...
        status: String,
        /// Its output (stdout then stderr), at most 2000 characters.
        output: String,
    },
    /// It could not be started or read for another reason.
    Io {
        /// Command line.
        command: String,
        /// The error as printed.
        error: String,
    },
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::NotInstalled { command } => {
                let program = command.split_whitespace().next().unwrap_or(command);
                write!(
                    f,
                    "not present: {program} is not installed here (not found in PATH)"
                )
            }
            CommandError::NotCaptured { command } => {
                write!(f, "not captured: the snapshot has no output of `{command}`")
            }
            CommandError::TimedOut { command, seconds } => write!(
                f,
                "no answer: `{command}` did not finish within {seconds} s (a hung driver does this)"
            ),
            CommandError::Failed {
                command,
                status,
                output,
            } => {
                let output = output.trim();
                if output.is_empty() {
                    write!(f, "failed: `{command}` ended with {status}")
                } else {
                    write!(f, "failed: `{command}` ended with {status}: {output}")
                }
            }
            CommandError::Io { command, error } => {
                write!(f, "not readable: `{command}`: {error}")
            }
        }
    }
}

impl std::error::Error for CommandError {}

/// Everything a [`Recorder`] kept, ready to be written as a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// File contents by absolute path (filtered files hold only the kept part).
    pub files: BTreeMap<String, Vec<u8>>,
    /// Directories that were listed (created in the snapshot even when empty).
    pub dirs: BTreeSet<String>,
    /// Symbolic links read: path -> target.
    pub links: BTreeMap<String, String>,
    /// Metadata and open results by path (`dev/nodes.json`).
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Command outputs by name: where they go and the text.
    pub commands: BTreeMap<String, (CommandEntry, String)>,
    /// Commands that gave no output, by name.
    pub command_errors: BTreeMap<String, CommandError>,
    /// Failed reads other than "no such file", by operation and path.
    pub errors: BTreeMap<(Op, String), ReadError>,
    /// Paths found missing (`ENOENT`).
    pub missing: BTreeSet<String>,
    /// Files saved filtered.
    pub filtered: BTreeSet<String>,
}

impl Recorded {
    /// The `dev/nodes.json` contents.
    pub fn nodes_file(&self) -> NodesFile {
        NodesFile {
            nodes: self.nodes.values().cloned().collect(),
        }
    }

    fn error(&mut self, op: Op, path: &str, err: &io::Error) {
        if err.kind() == io::ErrorKind::NotFound {
            self.missing.insert(path.to_string());
        } else {
            self.errors
                .insert((op, path.to_string()), ReadError::new(op, path, err));
        }
    }
}

/// Shared, thread-safe log of what a [`Root::Recorded`] read. Cloning gives another handle
/// to the same log.
#[derive(Clone, Debug, Default)]
pub struct Recorder(Arc<Mutex<Recorded>>);

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything recorded so far.
    pub fn recorded(&self) -> Recorded {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters here; keep going with what is there.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `record` for [`Root::read_filtered`]/[`Root::scan_filtered`]: which one records what.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FilterRecording {
    /// Result (even empty) and errors.
    Always,
    /// Only a non-empty result; errors are not kept.
    NonEmpty,
}

impl Root {
    /// This root, with every read also kept in `recorder`.
    pub fn recording(self, recorder: &Recorder) -> Root {
        Root::Recorded(Box::new(self), recorder.clone())
    }

    /// Whether the reads reach this machine's live state (also through a recorder).
    pub fn is_live(&self) -> bool {
        match self {
            Root::Live => true,
            Root::Snapshot(_) => false,
            Root::Recorded(inner, _) => inner.is_live(),
        }
    }

    /// Where `path` of the diagnosed machine is on this machine's file system: the path
    /// itself when live, `<dir>/<path>` in a snapshot. For helpers that take a directory
    /// such as `proc_root`. `..` components are dropped.
    pub fn fs_path(&self, path: &str) -> PathBuf {
        match self {
            Root::Live => live(path),
            Root::Snapshot(dir) => {
                let mut out = dir.clone();
                out.extend(Path::new(path).components().filter_map(|c| match c {
                    Component::Normal(n) => Some(n),
                    _ => None,
                }));
                out
            }
            Root::Recorded(inner, _) => inner.fs_path(path),
        }
    }

    /// Contents of the file at absolute `path`.
    ///
    /// Errors: as `read(2)` on the diagnosed machine: `NotFound` when missing, the recorded
    /// error (same errno) for a snapshot of an unreadable file, `InvalidInput` for a path
    /// that is not absolute or has `..` components in a snapshot.
    pub fn read_bytes(&self, path: &str) -> io::Result<Vec<u8>> {
        match self {
            Root::Live => fs::read(live(path)),
            Root::Snapshot(dir) => {
                let local = snapshot_path(dir, path)?;
                fs::read(local).map_err(|err| replay_error(dir, Op::Read, path, err))
            }
            Root::Recorded(inner, rec) => {
                let res = inner.read_bytes(path);
                let mut r = rec.lock();
                match &res {
                    Ok(bytes) => {
                        r.files.insert(path.to_string(), bytes.clone());
                    }
                    Err(err) => r.error(Op::Read, path, err),
                }
                res
            }
        }
    }

    /// Contents of the text file at `path`; bytes that are not UTF-8 become U+FFFD.
    ///
    /// Errors: as [`Self::read_bytes`].
    pub fn read_to_string(&self, path: &str) -> io::Result<String> {
        self.read_bytes(path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
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
                let mut r = rec.lock();
                match &res {
                    Ok(kept) if recording == FilterRecording::Always || !kept.is_empty() => {
                        r.files.insert(path.to_string(), kept.clone());
                        r.filtered.insert(path.to_string());
                    }
                    Ok(_) => {}
                    Err(err) if recording == FilterRecording::Always => {
                        r.error(Op::Read, path, err)
                    }
                    Err(_) => {}
                }
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
            Root::Live => {
                let mut names = Vec::new();
                for entry in fs::read_dir(live(path))? {
                    match entry {
                        Ok(e) => names.push(e.file_name().to_string_lossy().into_owned()),
                        Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                        Err(err) => return Err(err),
                    }
                }
                names.sort();
                Ok(names)
            }
            Root::Snapshot(dir) => snapshot_read_dir(dir, path),
            Root::Recorded(inner, rec) => {
                let res = inner.read_dir(path);
                let mut r = rec.lock();
                match &res {
                    Ok(_) => {
                        r.dirs.insert(path.to_string());
                    }
                    Err(err) => r.error(Op::ReadDir, path, err),
                }
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
            Root::Live => fs::read_link(live(path)).map(|t| t.to_string_lossy().into_owned()),
            Root::Snapshot(dir) => {
                let manifest = read_manifest(dir);
                if let Some(target) = manifest.links.get(path) {
                    return Ok(target.clone());
                }
                if let Some(err) = find_error(&manifest, Op::ReadLink, path) {
                    return Err(err);
                }
                let local = snapshot_path(dir, path)?;
                match fs::symlink_metadata(&local) {
                    Ok(m) if m.file_type().is_symlink() => {
                        fs::read_link(&local).map(|t| t.to_string_lossy().into_owned())
                    }
                    Ok(_) => Err(io::Error::from_raw_os_error(libc::EINVAL)),
                    Err(_) if snapshot_node(dir, path).is_some() => {
                        Err(io::Error::from_raw_os_error(libc::EINVAL))
                    }
                    Err(err) => Err(err),
                }
            }
            Root::Recorded(inner, rec) => {
                let res = inner.read_link(path);
                let mut r = rec.lock();
                match &res {
                    Ok(target) => {
                        r.links.insert(path.to_string(), target.clone());
                    }
                    // "Not a link" is an answer a snapshot gives by itself.
                    Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(err) => r.error(Op::ReadLink, path, err),
                }
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
            Root::Live => fs::metadata(live(path)).map(|m| node_meta(&m)),
            Root::Snapshot(dir) => {
                if let Some(meta) = snapshot_node(dir, path).and_then(|n| n.meta()) {
                    return Ok(meta);
                }
                let manifest = read_manifest(dir);
                if let Some(err) = find_error(&manifest, Op::Metadata, path) {
                    return Err(err);
                }
                let local = snapshot_path(dir, path)?;
                if is_reserved(dir, &local) {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                fs::metadata(local).map(|m| node_meta(&m))
            }
            Root::Recorded(inner, rec) => {
                let res = inner.metadata(path);
                let mut r = rec.lock();
                match &res {
                    Ok(meta) => {
                        let entry = r.nodes.entry(path.to_string()).or_default();
                        entry.path = path.to_string();
                        entry.set_meta(meta);
                    }
                    Err(err) => r.error(Op::Metadata, path, err),
                }
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
            Root::Live if !LIVE_OPENS.load(std::sync::atomic::Ordering::Relaxed) => None,
            Root::Live => Some(open_with_timeout(path, OPEN_TIMEOUT)),
            Root::Snapshot(dir) => snapshot_node(dir, path).and_then(|n| n.open_result()),
            Root::Recorded(inner, rec) => {
                let res = inner.open_device(path);
                if let Some(outcome) = &res {
                    let mut r = rec.lock();
                    let entry = r.nodes.entry(path.to_string()).or_default();
                    entry.path = path.to_string();
                    entry.open = Some(match outcome {
                        Ok(()) => "ok".to_string(),
                        Err(name) => name.clone(),
                    });
                }
                res
            }
        }
    }

    /// Standard output of the command `name args...`. Live it runs with `LC_ALL=C`, no
    /// standard input and [`COMMAND_TIMEOUT`]; a snapshot reads `commands/<name>.txt` (one
    /// capture per command name).
    ///
    /// Errors: [`CommandError`]: not installed, timed out, non-zero exit (with its output),
    /// or not captured in the snapshot.
    pub fn command(&self, name: &str, args: &[&str]) -> Result<String, CommandError> {
        let line = command_line(name, args);
        match self {
            Root::Live => run_command(name, args, COMMAND_TIMEOUT),
            Root::Snapshot(dir) => snapshot_command(dir, name, &line).map(|(text, _)| text),
            Root::Recorded(inner, rec) => {
                let res = inner.command(name, args);
                record_command(rec, name, args, &line, &res);
                res
            }
        }
    }

    /// The kernel log as `dmesg` prints it (`[seconds.micros] message` lines) and where it
    /// came from. Live: `/dev/kmsg` read without blocking until no record is left (needs
    /// root or `kernel.dmesg_restrict=0`), else the `dmesg` command. A snapshot reads
    /// `commands/dmesg.txt`.
    ///
    /// Errors: [`CommandError`]: both sources failed (both reasons given), or not captured.
    pub fn kernel_log(&self) -> Result<(String, String), CommandError> {
        match self {
            Root::Live => match read_kmsg() {
                Ok(text) => Ok((text, "/dev/kmsg".to_string())),
                Err(kmsg_err) => match run_command(KERNEL_LOG_NAME, &[], COMMAND_TIMEOUT) {
                    Ok(text) => Ok((text, KERNEL_LOG_NAME.to_string())),
                    Err(dmesg_err) => Err(CommandError::Io {
                        command: KERNEL_LOG_NAME.to_string(),
                        error: format!("/dev/kmsg: {kmsg_err}; dmesg: {dmesg_err}"),
                    }),
                },
            },
            Root::Snapshot(dir) => snapshot_command(dir, KERNEL_LOG_NAME, KERNEL_LOG_NAME),
            Root::Recorded(inner, rec) => {
                let res = inner.kernel_log();
                match &res {
                    Ok((text, source)) => {
                        let entry = CommandEntry {
                            name: KERNEL_LOG_NAME.to_string(),
                            args: Vec::new(),
                            source: source.clone(),
                            file: command_file(KERNEL_LOG_NAME),
                        };
                        rec.lock()
                            .commands
                            .insert(KERNEL_LOG_NAME.to_string(), (entry, text.clone()));
                    }
                    Err(err) => {
                        rec.lock()
                            .command_errors
                            .insert(KERNEL_LOG_NAME.to_string(), err.clone());
                    }
                }
                res
            }
        }
    }
}

/// `name args...` joined with spaces.
fn command_line(name: &str, args: &[&str]) -> String {
    std::iter::once(name)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Snapshot path of a command's output: `commands/<name>.txt`, with characters other than
/// ASCII letters, digits, `.`, `_` and `-` replaced by `_`.
pub fn command_file(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{COMMANDS_DIR}/{safe}.txt")
}

fn record_command(
    rec: &Recorder,
    name: &str,
    args: &[&str],
    line: &str,
    res: &Result<String, CommandError>,
) {
    let mut r = rec.lock();
    match res {
        Ok(text) => {
            let entry = CommandEntry {
                name: name.to_string(),
                args: args.iter().map(|a| a.to_string()).collect(),
                source: line.to_string(),
                file: command_file(name),
            };
            r.commands.insert(name.to_string(), (entry, text.clone()));
        }
        Err(err) => {
            r.command_errors.insert(name.to_string(), err.clone());
        }
    }
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

/// `<dir>/<path>` for an absolute `path` without `..`.
fn snapshot_path(dir: &Path, path: &str) -> io::Result<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() || path.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not an absolute path: {path:?}"),
        ));
    }
    let mut out = dir.to_path_buf();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("path with '..' in a snapshot: {path:?}"),
                ))
            }
        }
    }
    Ok(out)
}

/// The snapshot's own metadata files, which are not files of the diagnosed machine.
fn is_reserved(dir: &Path, local: &Path) -> bool {
    let Ok(rel) = local.strip_prefix(dir) else {
        return false;
    };
    rel == Path::new(MANIFEST_FILE)
        || rel == Path::new(EVIDENCE_FILE)
        || rel == Path::new(OBSERVATIONS_FILE)
        || rel == Path::new(NODES_FILE)
        || rel.starts_with(COMMANDS_DIR)
}

/// The manifest of a snapshot; an empty one when it has none (a hand-made fixture) or it
/// cannot be parsed.
pub fn read_manifest(dir: &Path) -> Manifest {
    fs::read(dir.join(MANIFEST_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The `dev/nodes.json` of a snapshot; empty when it has none or it cannot be parsed.
pub fn read_nodes(dir: &Path) -> NodesFile {
    fs::read(dir.join(NODES_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn snapshot_node(dir: &Path, path: &str) -> Option<NodeRecord> {
    read_nodes(dir).nodes.into_iter().find(|n| n.path == path)
}

fn find_error(manifest: &Manifest, op: Op, path: &str) -> Option<io::Error> {
    manifest
        .errors
        .iter()
        .find(|e| e.op == op && e.path == path)
        .map(ReadError::to_io)
}

/// A snapshot read failed with `err`: a recorded error for the same read wins over the
/// snapshot's own "no such file".
fn replay_error(dir: &Path, op: Op, path: &str, err: io::Error) -> io::Error {
    if err.kind() != io::ErrorKind::NotFound {
        return err;
    }
    find_error(&read_manifest(dir), op, path).unwrap_or(err)
}

fn snapshot_read_dir(dir: &Path, path: &str) -> io::Result<Vec<String>> {
    let local = snapshot_path(dir, path)?;
    let mut names = BTreeSet::new();
    let listed = match fs::read_dir(&local) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                if !is_reserved(dir, &entry.path()) {
                    names.insert(entry.file_name().to_string_lossy().into_owned());
                }
            }
            Ok(())
        }
        Err(err) => Err(err),
    };
    let prefix = if path.ends_with('/') {
        path.to_string()
    } else {
        format!("{path}/")
    };
    let mut from_nodes = false;
    for node in read_nodes(dir).nodes {
        if let Some(rest) = node.path.strip_prefix(&prefix) {
            if let Some(first) = rest.split('/').next().filter(|s| !s.is_empty()) {
                names.insert(first.to_string());
                from_nodes = true;
            }
        }
    }
    match listed {
        Ok(()) => Ok(names.into_iter().collect()),
        Err(_) if from_nodes => Ok(names.into_iter().collect()),
        Err(err) => Err(replay_error(dir, Op::ReadDir, path, err)),
    }
}

fn snapshot_command(dir: &Path, name: &str, line: &str) -> Result<(String, String), CommandError> {
    let file = dir.join(command_file(name));
    let manifest = read_manifest(dir);
    match fs::read(&file) {
        Ok(bytes) => {
            let source = manifest
                .commands
                .iter()
                .find(|c| c.name == name)
                .map(|c| c.source.clone())
                .unwrap_or_else(|| line.to_string());
            Ok((String::from_utf8_lossy(&bytes).into_owned(), source))
        }
        Err(_) => {
            Err(manifest
                .command_errors
                .get(name)
                .cloned()
                .unwrap_or(CommandError::NotCaptured {
                    command: line.to_string(),
                }))
        }
    }
}

fn node_meta(m: &fs::Metadata) -> NodeMeta {
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

/// An errno as the report prints it: its name (`EPERM`), or `errno N` for a value Linux
/// does not define.
pub fn errno_name(errno: i32) -> String {
    match crate::decode::errno::name(errno) {
        Some(n) => n.to_string(),
        None => format!("errno {errno}"),
    }
}

fn open_with_timeout(path: &str, timeout: Duration) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let owned = path.to_string();
    let spawned = thread::Builder::new()
        .name("doctor-open".to_string())
        .spawn(move || {
            // std opens with O_CLOEXEC; the file is closed when dropped.
            let res = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&owned)
                .map(drop);
            let _ = tx.send(res);
        });
    if let Err(err) = spawned {
        return Err(err.raw_os_error().map_or("EAGAIN".to_string(), errno_name));
    }
    match rx.recv_timeout(timeout) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(match err.raw_os_error() {
            Some(errno) => errno_name(errno),
            None => err.to_string(),
        }),
        Err(_) => Err(OPEN_TIMED_OUT.to_string()),
    }
}

/// Most output kept of a failed command, in characters.
const FAILED_OUTPUT_CHARS: usize = 2000;

fn run_command(name: &str, args: &[&str], timeout: Duration) -> Result<String, CommandError> {
    let line = command_line(name, args);
    let mut child = Command::new(name)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| {
            // `execvp` reports EACCES, not ENOENT, when some PATH directory could not be
            // searched (e.g. /root/... for an unprivileged user): look for the program.
            let absent = err.kind() == io::ErrorKind::NotFound
                || (err.kind() == io::ErrorKind::PermissionDenied && !on_path(name));
            if absent {
                CommandError::NotInstalled {
                    command: line.clone(),
                }
            } else {
                CommandError::Io {
                    command: line.clone(),
                    error: err.to_string(),
                }
            }
        })?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                // A process stuck in the kernel (D state) is not reaped until it leaves it:
                // do not wait for it.
                let _ = child.try_wait();
                return Err(CommandError::TimedOut {
                    command: line,
                    seconds: timeout.as_secs(),
                });
            }
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(err) => {
                return Err(CommandError::Io {
                    command: line,
                    error: err.to_string(),
                })
            }
        }
    };
    // The pipes close when the command exits (unless it left a child holding them).
    let out = stdout
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_default();
    let err = stderr
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_default();
    let out = String::from_utf8_lossy(&out).into_owned();
    if status.success() {
        return Ok(out);
    }
    let status_text = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "an unknown status".to_string(),
    };
    let mut output = out;
    output.push_str(&String::from_utf8_lossy(&err));
    let output: String = output.trim().chars().take(FAILED_OUTPUT_CHARS).collect();
    Err(CommandError::Failed {
        command: line,
        status: status_text,
        output,
    })
}

/// Whether `name` exists as a file: the path itself when it holds a `/`, else in one of
/// the `PATH` directories.
fn on_path(name: &str) -> bool {
    if name.contains('/') {
        return Path::new(name).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// Reads a pipe to its end on a helper thread.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

/// Largest `/dev/kmsg` record (the kernel's `CONSOLE_EXT_LOG_MAX` is 8 KiB).
const KMSG_RECORD_MAX: usize = 16 * 1024;
/// Most bytes of kernel log kept (the ring buffer is at most 32 MiB; guards a flood).
const KMSG_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Reads every record left in `/dev/kmsg` without blocking (`EAGAIN` ends the read; `EPIPE`,
/// a record overwritten while reading, is skipped). Format: `Documentation/ABI/testing/
/// dev-kmsg` of the kernel.
fn read_kmsg() -> io::Result<String> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(live("/dev/kmsg"))?;
    let mut buf = vec![0u8; KMSG_RECORD_MAX];
    let mut out = String::new();
    let mut records = 0usize;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                records += 1;
                if let Some(line) = format_kmsg_record(&buf[..n]) {
                    out.push_str(&line);
                    out.push('\n');
                }
                if out.len() > KMSG_MAX_BYTES {
                    break;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) if err.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(err) if records == 0 => return Err(err),
            Err(_) => break,
        }
    }
    Ok(out)
}

/// One `/dev/kmsg` record (`prio,seq,usec,flags[,...];message\n` followed by optional
/// ` KEY=value` continuation lines) as `dmesg` prints it: `[seconds.micros] message`, the
/// seconds right-aligned in 5 columns. `None` when the record has no `;`.
pub fn format_kmsg_record(record: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(record);
    let (header, rest) = text.split_once(';')?;
    let message = rest.split('\n').next().unwrap_or("");
    let usec: u64 = header.split(',').nth(2)?.trim().parse().ok()?;
    Some(format!(
        "[{:>5}.{:06}] {}",
        usec / 1_000_000,
        usec % 1_000_000,
        message
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, contents: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    #[test]
    fn snapshot_reads_files_and_replays_errors() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::Snapshot(dir.path().to_path_buf());
        write(&dir.path().join("proc/cmdline"), b"ro quiet\n");
        assert_eq!(root.read_to_string("/proc/cmdline").unwrap(), "ro quiet\n");
        let err = root
            .read_to_string("/proc/driver/nvidia/version")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(err.to_string(), "No such file or directory (os error 2)");
        // No escape from the snapshot; only absolute paths.
        assert_eq!(
            root.read_bytes("/proc/../../etc/passwd")
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            root.read_bytes("proc/cmdline").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // The snapshot's own files are not files of the machine.
        write(&dir.path().join(MANIFEST_FILE), b"{}");
        assert!(!root.exists("/manifest.json"));
        assert!(root
            .read_dir("/")
            .unwrap()
            .iter()
            .all(|n| n != "manifest.json"));

        let manifest = Manifest {
            errors: vec![ReadError {
                op: Op::Read,
                path: "/proc/1/environ".into(),
                errno: Some(libc::EACCES),
                error: "Permission denied (os error 13)".into(),
            }],
            links: BTreeMap::from([("/proc/9/root/lib/libcuda.so.1".into(), "x".into())]),
            ..Manifest::default()
        };
        write(
            &dir.path().join(MANIFEST_FILE),
            &serde_json::to_vec(&manifest).unwrap(),
        );
        let err = root.read_bytes("/proc/1/environ").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        assert_eq!(
            root.read_link("/proc/9/root/lib/libcuda.so.1").unwrap(),
            "x"
        );
        assert_eq!(
            root.read_link("/proc/cmdline").unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            root.read_link("/nope").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn snapshot_nodes_and_commands() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::Snapshot(dir.path().to_path_buf());
        let nodes = NodesFile {
            nodes: vec![
                NodeRecord {
                    path: "/dev/nvidia-uvm".into(),
                    kind: Some(FileKind::Char),
                    major: Some(508),
                    minor: Some(0),
                    mode: Some("0666".into()),
                    uid: Some(0),
                    gid: Some(0),
                    open: Some("EPERM".into()),
                },
                NodeRecord {
                    path: "/dev/nvidia-caps/nvidia-cap1".into(),
                    kind: Some(FileKind::Char),
                    major: Some(235),
                    minor: Some(1),
                    ..NodeRecord::default()
                },
            ],
        };
        write(
            &dir.path().join(NODES_FILE),
            &serde_json::to_vec(&nodes).unwrap(),
        );
        assert_eq!(
            root.read_dir("/dev").unwrap(),
            vec!["nvidia-caps".to_string(), "nvidia-uvm".to_string()]
        );
        let meta = root.metadata("/dev/nvidia-uvm").unwrap();
        assert_eq!(meta.kind, FileKind::Char);
        assert_eq!(meta.dev, Some((508, 0)));
        assert_eq!(meta.mode, 0o666);
        assert_eq!(
            root.open_device("/dev/nvidia-uvm"),
            Some(Err("EPERM".to_string()))
        );
        assert_eq!(root.open_device("/dev/nvidia-caps/nvidia-cap1"), None);
        assert!(!root.exists("/dev/nvidia0"));
        assert_eq!(
            root.read_link("/dev/nvidia-uvm")
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EINVAL)
        );

        assert_eq!(
            root.command("nvidia-smi", &["-q"]).unwrap_err(),
            CommandError::NotCaptured {
                command: "nvidia-smi -q".into()
            }
        );
        write(&dir.path().join("commands/nvidia-smi.txt"), b"smi text");
        assert_eq!(root.command("nvidia-smi", &["-q"]).unwrap(), "smi text");
        write(
            &dir.path().join("commands/dmesg.txt"),
            b"[    1.000000] x\n",
        );
        assert_eq!(
            root.kernel_log().unwrap(),
            ("[    1.000000] x\n".to_string(), "dmesg".to_string())
        );
    }

    #[test]
    fn recorder_keeps_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("proc/cmdline"), b"ro\n");
        write(
            &dir.path().join("proc/1/environ"),
            b"HOME=/\0container=docker\0SECRET=x\0",
        );
        write(&dir.path().join("proc/2/comm"), b"bash\n");
        let rec = Recorder::new();
        let root = Root::Snapshot(dir.path().to_path_buf()).recording(&rec);
        assert!(!root.is_live());
        root.read_bytes("/proc/cmdline").unwrap();
        root.read_bytes("/proc/missing").unwrap_err();
        let keep = |r: &[u8]| r.starts_with(b"container=").then(|| r.to_vec());
        assert_eq!(
            root.read_filtered("/proc/1/environ", 0, &keep).unwrap(),
            b"container=docker\0"
        );
        let never = |_: &[u8]| None;
        assert!(root
            .scan_filtered("/proc/2/comm", b'\n', &never)
            .unwrap()
            .is_empty());
        root.command("nvidia-smi", &["-q"]).unwrap_err();
        let r = rec.recorded();
        assert_eq!(r.files["/proc/cmdline"], b"ro\n");
        assert_eq!(r.files["/proc/1/environ"], b"container=docker\0");
        assert!(!r.files.contains_key("/proc/2/comm"));
        assert!(r.missing.contains("/proc/missing"));
        assert!(r.filtered.contains("/proc/1/environ"));
        assert!(r.command_errors.contains_key("nvidia-smi"));
    }

    #[test]
    fn live_reads_this_machine() {
        let root = Root::Live;
        assert!(root.is_live());
        assert!(!root
            .read_to_string("/proc/sys/kernel/osrelease")
            .unwrap()
            .is_empty());
        let meta = root.metadata("/dev/null").unwrap();
        assert_eq!((meta.kind, meta.dev), (FileKind::Char, Some((1, 3))));
        assert_eq!(root.open_device("/dev/null"), Some(Ok(())));
        assert_eq!(
            root.open_device("/dev/nvidia-does-not-exist"),
            Some(Err("ENOENT".to_string()))
        );
        assert_eq!(root.open_device("/proc"), Some(Err("EISDIR".to_string())));
        assert!(root.read_dir("/dev").unwrap().contains(&"null".to_string()));
        assert_eq!(
            root.read_link("/proc/self")
                .map(|t| t.parse::<u32>().is_ok())
                .ok(),
            Some(true)
        );
        assert_eq!(root.fs_path("/proc"), PathBuf::from("/proc"));
    }

    #[test]
    fn live_commands() {
        let root = Root::Live;
        assert_eq!(root.command("echo", &["a", "b"]).unwrap(), "a b\n");
        let err = root
            .command("uvmwatch-no-such-program", &["-q"])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not present: uvmwatch-no-such-program is not installed here (not found in PATH)"
        );
        match root
            .command("sh", &["-c", "echo oops >&2; exit 9"])
            .unwrap_err()
        {
            CommandError::Failed { status, output, .. } => {
                assert_eq!(status, "exit status 9");
                assert_eq!(output, "oops");
            }
            other => panic!("{other:?}"),
        }
        let big = root
            .command("sh", &["-c", "head -c 300000 /dev/zero | tr '\\0' x"])
            .unwrap();
        assert_eq!(big.len(), 300_000);
        let started = Instant::now();
        let err = run_command("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, CommandError::TimedOut { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn live_kernel_log() {
        match Root::Live.kernel_log() {
            Ok((text, source)) => {
                assert!(source == "/dev/kmsg" || source == "dmesg");
                if source == "/dev/kmsg" {
                    assert!(text.lines().all(|l| l.starts_with('[')), "{text}");
                }
            }
            // Unprivileged and without dmesg: both reasons are given.
            Err(err) => assert!(err.to_string().contains("/dev/kmsg"), "{err}"),
        }
    }

    #[test]
    fn kmsg_record_format() {
        assert_eq!(
            format_kmsg_record(b"6,1234,5004121,-;nvidia-uvm: Loaded the UVM driver, major device number 508.\n SUBSYSTEM=x\n")
                .unwrap(),
            "[    5.004121] nvidia-uvm: Loaded the UVM driver, major device number 508."
        );
        assert_eq!(
            format_kmsg_record(b"4,99,123456789012,c,caller=T1;WARNING: CPU: 1\n").unwrap(),
            "[123456.789012] WARNING: CPU: 1"
        );
        assert_eq!(format_kmsg_record(b"garbage"), None);
    }

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

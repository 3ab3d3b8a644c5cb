//! A snapshot directory as a machine to diagnose: its layout (the bundle's metadata files
//! and their JSON types, `docs/doctor-bundle.md`) and the answers it gives to each reader of
//! [`Root`](super::Root), replaying what was recorded when it was taken.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::command::CommandError;
use super::{CapturedText, FileKind, NodeMeta};
use crate::doctor::input::{
    self, limit_for, read_file_limited, COMMAND_OUTPUT_LIMIT, KERNEL_LOG_LIMIT,
    SNAPSHOT_METADATA_LIMIT,
};

/// Name under which the kernel log is kept among the commands (`commands/dmesg.txt`).
pub const KERNEL_LOG_NAME: &str = "dmesg";

/// Snapshot file with the manifest ([`Manifest`]), relative to the snapshot root.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Snapshot file with the collected evidence (written by the bundle, never read back by the
/// collectors), relative to the snapshot root.
pub const EVIDENCE_FILE: &str = "evidence.json";
/// Snapshot file with the probes' observations, when the bundle was written with some
/// (never read by the collectors: `uvmwatch doctor --root` reads it through
/// `bundle::read_saved_observations`), relative to the snapshot root.
pub const OBSERVATIONS_FILE: &str = "observations.json";
/// Snapshot directory with command outputs (`<name>.txt`), relative to the snapshot root.
pub const COMMANDS_DIR: &str = "commands";
/// Snapshot file describing device nodes and other metadata ([`NodesFile`]), relative to the
/// snapshot root.
pub const NODES_FILE: &str = "dev/nodes.json";

/// Version of the snapshot layout written in [`Manifest::format`].
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Version of the `observations.json` schema written in its `format` field: the fields of
/// [`Observations`](crate::doctor::facts::Observations). A file without the field is
/// version 1; fields added with a default keep the version, anything else bumps it.
pub const OBSERVATIONS_FORMAT: u32 = 1;

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
    /// (`"EPERM"`) or [`OPEN_TIMED_OUT`](super::OPEN_TIMED_OUT); absent when not tried.
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

    pub(super) fn set_meta(&mut self, meta: &NodeMeta) {
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
    /// [`Root::read_bytes`](super::Root::read_bytes) and the other file reads.
    Read,
    /// [`Root::read_dir`](super::Root::read_dir).
    ReadDir,
    /// [`Root::read_link`](super::Root::read_link).
    ReadLink,
    /// [`Root::metadata`](super::Root::metadata) and [`Root::exists`](super::Root::exists).
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
    pub(super) fn new(op: Op, path: &str, err: &io::Error) -> Self {
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

/// [`Root::read_bytes`](super::Root::read_bytes) of a snapshot: `<dir>/<path>`, or the
/// error recorded for it.
pub(super) fn read_bytes(dir: &Path, path: &str) -> io::Result<Vec<u8>> {
    let local = snapshot_path(dir, path)?;
    read_file_limited(&local, limit_for(path))
        .map(|read| read.bytes)
        .map_err(|err| replay_error(dir, Op::Read, path, err))
}

/// [`Root::read_dir`](super::Root::read_dir) of a snapshot: the saved entries plus those of
/// `dev/nodes.json` below `path`.
pub(super) fn read_dir(dir: &Path, path: &str) -> io::Result<Vec<String>> {
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
    for node in read_nodes(dir)?.nodes {
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

/// [`Root::read_link`](super::Root::read_link) of a snapshot: the link recorded in the
/// manifest, its recorded error, a link saved as such, or `EINVAL` for a saved file or node.
pub(super) fn read_link(dir: &Path, path: &str) -> io::Result<String> {
    let manifest = read_manifest(dir)?;
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
        Err(_) if snapshot_node(dir, path)?.is_some() => {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        }
        Err(err) => Err(err),
    }
}

/// [`Root::metadata`](super::Root::metadata) of a snapshot: the `dev/nodes.json` entry, its
/// recorded error, else the saved file or directory itself.
pub(super) fn metadata(dir: &Path, path: &str) -> io::Result<NodeMeta> {
    if let Some(meta) = snapshot_node(dir, path)?.and_then(|n| n.meta()) {
        return Ok(meta);
    }
    let manifest = read_manifest(dir)?;
    if let Some(err) = find_error(&manifest, Op::Metadata, path) {
        return Err(err);
    }
    let local = snapshot_path(dir, path)?;
    if is_reserved(dir, &local) {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    fs::metadata(local).map(|m| NodeMeta::of(&m))
}

/// [`Root::open_device`](super::Root::open_device) of a snapshot: the open result recorded
/// in `dev/nodes.json`, or `None` (not tried, or `dev/nodes.json` is malformed: the
/// listing of `/dev` says so).
pub(super) fn open_device(dir: &Path, path: &str) -> Option<Result<(), String>> {
    snapshot_node(dir, path)
        .ok()
        .flatten()
        .and_then(|n| n.open_result())
}

/// [`Root::command`](super::Root::command) and [`Root::kernel_log`](super::Root::kernel_log)
/// of a snapshot: `commands/<name>.txt` (the kernel log with [`KERNEL_LOG_LIMIT`], a command
/// with [`COMMAND_OUTPUT_LIMIT`]) and the source the manifest names (else `line`), or the
/// recorded error.
pub(super) fn command(dir: &Path, name: &str, line: &str) -> Result<CapturedText, CommandError> {
    let file = dir.join(command_file(name));
    let limit = if name == KERNEL_LOG_NAME {
        KERNEL_LOG_LIMIT
    } else {
        COMMAND_OUTPUT_LIMIT
    };
    let unreadable = |err: io::Error| CommandError::Io {
        command: line.to_string(),
        error: input::verdict(&err).unwrap_or_else(|| err.to_string()),
    };
    let manifest = read_manifest(dir);
    match read_file_limited(&file, limit) {
        Ok(read) => {
            // A malformed manifest loses only where the text came from: `line` stands in.
            let source = manifest
                .ok()
                .and_then(|m| m.commands.into_iter().find(|c| c.name == name))
                .map(|c| c.source)
                .unwrap_or_else(|| line.to_string());
            Ok(CapturedText {
                text: input::into_text(read.bytes),
                source,
                dropped_bytes: read.dropped,
            })
        }
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(unreadable(err)),
        Err(_) => match manifest {
            Ok(manifest) => Err(manifest.command_errors.get(name).cloned().unwrap_or(
                CommandError::NotCaptured {
                    command: line.to_string(),
                },
            )),
            // Whether it failed or was never captured is in the manifest.
            Err(err) => Err(unreadable(err)),
        },
    }
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

/// The manifest of a snapshot; an empty one when it has none (a hand-made fixture).
///
/// Errors: [`Malformed`](input::Malformed) when it is there but cannot be read or parsed
/// (or is larger than [`SNAPSHOT_METADATA_LIMIT`]): never read as empty.
pub fn read_manifest(dir: &Path) -> io::Result<Manifest> {
    read_metadata_file(dir, MANIFEST_FILE)
}

/// The `dev/nodes.json` of a snapshot; empty when it has none.
///
/// Errors: [`Malformed`](input::Malformed), as [`read_manifest`].
pub fn read_nodes(dir: &Path) -> io::Result<NodesFile> {
    read_metadata_file(dir, NODES_FILE)
}

/// The JSON file `file` of the snapshot in `dir`: its default when missing, else parsed.
fn read_metadata_file<T: serde::de::DeserializeOwned + Default>(
    dir: &Path,
    file: &str,
) -> io::Result<T> {
    let read = match read_file_limited(&dir.join(file), SNAPSHOT_METADATA_LIMIT) {
        Ok(read) => read,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(T::default()),
        Err(err) => {
            let why = input::verdict(&err).unwrap_or_else(|| format!("cannot be read: {err}"));
            return Err(input::malformed(file, why));
        }
    };
    serde_json::from_slice(&read.bytes)
        .map_err(|e| input::malformed(file, input::clip(format!("not valid: {e}"), 300)))
}

fn snapshot_node(dir: &Path, path: &str) -> io::Result<Option<NodeRecord>> {
    Ok(read_nodes(dir)?.nodes.into_iter().find(|n| n.path == path))
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
    match read_manifest(dir) {
        Ok(manifest) => find_error(&manifest, op, path).unwrap_or(err),
        // Whether the file was missing or unreadable is in the manifest.
        Err(malformed) => malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{write_test_file as write, Root};
    use super::*;

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
            CapturedText {
                text: "[    1.000000] x\n".to_string(),
                source: "dmesg".to_string(),
                dropped_bytes: 0
            }
        );
    }

    #[test]
    fn malformed_metadata_files_are_never_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::Snapshot(dir.path().to_path_buf());
        write(&dir.path().join("proc/cmdline"), b"ro\n");
        write(&dir.path().join("commands/nvidia-smi.txt"), b"smi text");
        write(&dir.path().join(NODES_FILE), b"\x00\xffnot json");
        write(&dir.path().join(MANIFEST_FILE), b"{\"links\": 5}");
        let nodes_why = "malformed: the snapshot's dev/nodes.json: not valid: expected value at line 1 column 1";
        let verdict = |e: io::Error| input::verdict(&e).unwrap();
        assert_eq!(verdict(root.read_dir("/dev").unwrap_err()), nodes_why);
        assert_eq!(
            verdict(root.metadata("/dev/nvidia0").unwrap_err()),
            nodes_why
        );
        assert_eq!(root.open_device("/dev/nvidia0"), None);
        let manifest_why = verdict(read_manifest(dir.path()).unwrap_err());
        assert!(
            manifest_why.starts_with(
                "malformed: the snapshot's manifest.json: not valid: invalid type: integer `5`"
            ),
            "{manifest_why}"
        );
        // A file that is there reads as it is; one that is not cannot be told from one that
        // failed, nor a link from a file.
        assert_eq!(root.read_to_string("/proc/cmdline").unwrap(), "ro\n");
        assert_eq!(
            verdict(root.read_bytes("/proc/missing").unwrap_err()),
            manifest_why
        );
        assert_eq!(
            verdict(root.read_link("/proc/cmdline").unwrap_err()),
            manifest_why
        );
        assert_eq!(root.command("nvidia-smi", &["-q"]).unwrap(), "smi text");
        assert_eq!(
            root.command("dmesg", &[]).unwrap_err().to_string(),
            format!("not readable: `dmesg`: {manifest_why}")
        );
        // Too large is malformed too, with the sizes.
        fs::File::create(dir.path().join(NODES_FILE))
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert_eq!(
            verdict(read_nodes(dir.path()).unwrap_err()),
            "malformed: the snapshot's dev/nodes.json: too large (1073741824 bytes, limit 16777216)"
        );
        // Absent is not malformed: a hand-made fixture needs neither file.
        fs::remove_file(dir.path().join(NODES_FILE)).unwrap();
        fs::remove_file(dir.path().join(MANIFEST_FILE)).unwrap();
        assert_eq!(read_nodes(dir.path()).unwrap(), NodesFile::default());
        assert_eq!(read_manifest(dir.path()).unwrap(), Manifest::default());
    }
}

//! [`ReadLog`]: what a [`Root::Recorded`](super::Root::Recorded) read, result or error,
//! kept so that a bundle can save exactly that ([`Recorded`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex};

use super::command::CommandError;
use super::snapshot::{
    command_file, CommandEntry, NodeRecord, NodesFile, Op, ReadError, KERNEL_LOG_NAME,
};
use super::{CapturedText, NodeMeta};

/// Everything a [`ReadLog`] kept, ready to be written as a snapshot.
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

/// Shared, thread-safe log of what a [`Root::Recorded`](super::Root::Recorded) read. Cloning gives another handle
/// to the same log.
#[derive(Clone, Debug, Default)]
pub struct ReadLog(Arc<Mutex<Recorded>>);

impl ReadLog {
    /// An empty read log.
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

/// What a recorder keeps of a [`Root::read_filtered`](super::Root::read_filtered) (`Always`)
/// or a [`Root::scan_filtered`](super::Root::scan_filtered) (`NonEmpty`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FilterRecording {
    /// Result (even empty) and errors.
    Always,
    /// Only a non-empty result; errors are not kept.
    NonEmpty,
}

impl ReadLog {
    /// Keeps a file read: its contents, or why it failed.
    pub(super) fn read(&self, path: &str, res: &io::Result<Vec<u8>>) {
        let mut r = self.lock();
        match res {
            Ok(bytes) => {
                r.files.insert(path.to_string(), bytes.clone());
            }
            Err(err) => r.error(Op::Read, path, err),
        }
    }

    /// Keeps a filtered read (see [`FilterRecording`]): the kept part, marked as filtered.
    pub(super) fn filtered(
        &self,
        path: &str,
        res: &io::Result<Vec<u8>>,
        recording: FilterRecording,
    ) {
        let mut r = self.lock();
        match res {
            Ok(kept) if recording == FilterRecording::Always || !kept.is_empty() => {
                r.files.insert(path.to_string(), kept.clone());
                r.filtered.insert(path.to_string());
            }
            Ok(_) => {}
            Err(err) if recording == FilterRecording::Always => r.error(Op::Read, path, err),
            Err(_) => {}
        }
    }

    /// Keeps a directory listing (the directory; its entries are what was read in it).
    pub(super) fn dir(&self, path: &str, res: &io::Result<Vec<String>>) {
        let mut r = self.lock();
        match res {
            Ok(_) => {
                r.dirs.insert(path.to_string());
            }
            Err(err) => r.error(Op::ReadDir, path, err),
        }
    }

    /// Keeps a symbolic link read.
    pub(super) fn link(&self, path: &str, res: &io::Result<String>) {
        let mut r = self.lock();
        match res {
            Ok(target) => {
                r.links.insert(path.to_string(), target.clone());
            }
            // "Not a link" is an answer a snapshot gives by itself.
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {}
            Err(err) => r.error(Op::ReadLink, path, err),
        }
    }

    /// Keeps a `stat(2)` answer in the path's `dev/nodes.json` entry.
    pub(super) fn metadata(&self, path: &str, res: &io::Result<NodeMeta>) {
        let mut r = self.lock();
        match res {
            Ok(meta) => {
                let entry = r.nodes.entry(path.to_string()).or_default();
                entry.path = path.to_string();
                entry.set_meta(meta);
            }
            Err(err) => r.error(Op::Metadata, path, err),
        }
    }

    /// Keeps the result of a device open, when one was tried, in the path's
    /// `dev/nodes.json` entry.
    pub(super) fn open(&self, path: &str, res: &Option<Result<(), String>>) {
        if let Some(outcome) = res {
            let mut r = self.lock();
            let entry = r.nodes.entry(path.to_string()).or_default();
            entry.path = path.to_string();
            entry.open = Some(match outcome {
                Ok(()) => "ok".to_string(),
                Err(name) => name.clone(),
            });
        }
    }

    /// Keeps a command's output (as `commands/<name>.txt`) or why it gave none.
    pub(super) fn command(
        &self,
        name: &str,
        args: &[&str],
        line: &str,
        res: &Result<String, CommandError>,
    ) {
        let mut r = self.lock();
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

    /// Keeps the kernel log (as `commands/dmesg.txt`, with the source it came from) or why
    /// it could not be read.
    pub(super) fn kernel_log(&self, res: &Result<CapturedText, CommandError>) {
        let mut r = self.lock();
        match res {
            Ok(log) => {
                let entry = CommandEntry {
                    name: KERNEL_LOG_NAME.to_string(),
                    args: Vec::new(),
                    source: log.source.clone(),
                    file: command_file(KERNEL_LOG_NAME),
                };
                r.commands
                    .insert(KERNEL_LOG_NAME.to_string(), (entry, log.text.clone()));
            }
            Err(err) => {
                r.command_errors
                    .insert(KERNEL_LOG_NAME.to_string(), err.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{write_test_file as write, Root};
    use super::*;

    #[test]
    fn recorder_keeps_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("proc/cmdline"), b"ro\n");
        write(
            &dir.path().join("proc/1/environ"),
            b"HOME=/\0container=docker\0SECRET=x\0",
        );
        write(&dir.path().join("proc/2/comm"), b"bash\n");
        let rec = ReadLog::new();
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
}

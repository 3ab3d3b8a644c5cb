//! This machine as the diagnosed one ([`Live`]): reads below a host root when the agent runs
//! in a container, device-node opens with a time limit, commands and the kernel log.
//!
//! Every path is resolved below the host root by the host's one reader
//! ([`crate::host::files`]): a link is followed as the host would follow it, never into the
//! reader's own container.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::command::{run_command, CommandError, COMMAND_TIMEOUT};
use super::kmsg::read_kmsg;
use super::snapshot::KERNEL_LOG_NAME;
use super::{errno_name, join_below, CapturedText, NodeMeta};
use crate::doctor::input::{limit_for, COMMAND_OUTPUT_LIMIT, KERNEL_LOG_LIMIT};
use crate::host::files;

/// How long [`Root::open_device`](super::Root::open_device) waits for a live `open(2)` of a device node (5 s). Opening
/// `/dev/nvidiaN` without persistence mode initialises the GPU, which can take seconds, and a
/// wedged driver can block it for ever; the open then runs on in a detached thread.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`Root::open_device`](super::Root::open_device) reports when the open did not return within [`OPEN_TIMEOUT`].
/// Not an errno name: the kernel returned nothing.
pub const OPEN_TIMED_OUT: &str = "TIMEOUT";

/// How this machine is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    /// Where this machine's file system is mounted, when not at `/`: a container (e.g. the
    /// Kubernetes DaemonSet) sees the host's `/` at, say, `/host` (`--host-root`). Every
    /// file read, directory listing, link, `stat` and device open goes below it, and the
    /// kernel log is read from `<prefix>/dev/kmsg`. Commands (`nvidia-smi`) still run in the
    /// reader's own file system.
    pub prefix: Option<PathBuf>,
    /// Whether [`Root::open_device`](super::Root::open_device) really opens device nodes (as `uvmwatch doctor` does on
    /// its own machine). The agent never does: an observer must not open GPU nodes itself
    /// (that can start GPU initialisation), and the probes see the workloads' own opens.
    pub open_devices: bool,
}

impl Live {
    /// Where this machine's `/` is on the reader's file system.
    fn root(&self) -> &Path {
        self.prefix.as_deref().unwrap_or(Path::new("/"))
    }

    /// `path` of this machine resolved on the reader's file system ([`files::resolve`]
    /// below [`Live::prefix`]).
    fn resolve(&self, path: &str) -> io::Result<PathBuf> {
        files::resolve(self.root(), None, Path::new(path))
    }

    /// `path` of this machine on the reader's file system (below [`Live::prefix`]): resolved
    /// there when it exists, else joined below it (`..` dropped).
    pub fn path(&self, path: &str) -> PathBuf {
        self.resolve(path).unwrap_or_else(|_| match &self.prefix {
            Some(prefix) => join_below(prefix, path),
            None => PathBuf::from(path),
        })
    }

    pub(super) fn read_bytes(&self, path: &str) -> io::Result<Vec<u8>> {
        files::read_below(self.root(), Path::new(path), limit_for(path)).map(|read| read.bytes)
    }

    pub(super) fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(self.resolve(path)?)? {
            match entry {
                Ok(e) => names.push(e.file_name().to_string_lossy().into_owned()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
        }
        names.sort();
        Ok(names)
    }

    /// The link itself is read, its directory resolved.
    pub(super) fn read_link(&self, path: &str) -> io::Result<String> {
        let p = Path::new(path);
        let link = match (p.parent(), p.file_name()) {
            (Some(dir), Some(name)) => self.resolve(&dir.to_string_lossy())?.join(name),
            _ => self.resolve(path)?,
        };
        fs::read_link(link).map(|t| t.to_string_lossy().into_owned())
    }

    pub(super) fn metadata(&self, path: &str) -> io::Result<NodeMeta> {
        fs::metadata(self.resolve(path)?).map(|m| NodeMeta::of(&m))
    }

    /// `None` when [`Live::open_devices`] is off, else the outcome of an open that gets
    /// [`OPEN_TIMEOUT`].
    pub(super) fn open_device(&self, path: &str) -> Option<Result<(), String>> {
        self.open_devices.then(|| match self.resolve(path) {
            Ok(node) => open_with_timeout(&node, OPEN_TIMEOUT),
            Err(err) => Err(os_error_name(&err)),
        })
    }

    pub(super) fn command(&self, name: &str, args: &[&str]) -> Result<String, CommandError> {
        run_command(name, args, COMMAND_TIMEOUT, COMMAND_OUTPUT_LIMIT).map(|(text, _)| text)
    }

    /// `<prefix>/dev/kmsg`, else the `dmesg` command.
    pub(super) fn kernel_log(&self) -> Result<CapturedText, CommandError> {
        match read_kmsg(&self.path("/dev/kmsg")) {
            Ok((text, dropped_bytes)) => Ok(CapturedText {
                text,
                source: "/dev/kmsg".to_string(),
                dropped_bytes,
            }),
            Err(kmsg_err) => {
                match run_command(KERNEL_LOG_NAME, &[], COMMAND_TIMEOUT, KERNEL_LOG_LIMIT) {
                    Ok((text, dropped_bytes)) => Ok(CapturedText {
                        text,
                        source: KERNEL_LOG_NAME.to_string(),
                        dropped_bytes,
                    }),
                    Err(dmesg_err) => Err(CommandError::Io {
                        command: KERNEL_LOG_NAME.to_string(),
                        error: format!("/dev/kmsg: {kmsg_err}; dmesg: {dmesg_err}"),
                    }),
                }
            }
        }
    }
}

/// The errno name of `err` (`ENOENT`), else its text.
fn os_error_name(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(errno) => errno_name(errno),
        None => err.to_string(),
    }
}

fn open_with_timeout(path: &Path, timeout: Duration) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let owned = path.to_path_buf();
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
        Ok(Err(err)) => Err(os_error_name(&err)),
        Err(_) => Err(OPEN_TIMED_OUT.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::{FileKind, Root};
    use super::*;

    #[test]
    fn live_reads_this_machine() {
        let root = Root::live(None);
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
    fn live_kernel_log() {
        match Root::live(None).kernel_log() {
            Ok(log) => {
                assert!(log.source == "/dev/kmsg" || log.source == "dmesg");
                if log.source == "/dev/kmsg" {
                    assert!(log.text.lines().all(|l| l.starts_with('[')), "{}", log.text);
                }
            }
            // Unprivileged and without dmesg: both reasons are given.
            Err(err) => assert!(err.to_string().contains("/dev/kmsg"), "{err}"),
        }
    }

    #[test]
    fn live_below_a_host_root() {
        let host = tempfile::tempdir().unwrap();
        fs::create_dir_all(host.path().join("proc/sys/kernel")).unwrap();
        fs::write(
            host.path().join("proc/sys/kernel/osrelease"),
            "6.8.0-45-generic\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("nvidia-uvm", host.path().join("proc/link")).unwrap();
        let root = Root::live(Some(host.path()));
        assert!(root.is_live());
        assert_eq!(
            root.read_to_string("/proc/sys/kernel/osrelease").unwrap(),
            "6.8.0-45-generic\n"
        );
        assert_eq!(root.read_dir("/proc").unwrap(), ["link", "sys"]);
        assert_eq!(root.read_link("/proc/link").unwrap(), "nvidia-uvm");
        assert_eq!(root.metadata("/proc").unwrap().kind, FileKind::Dir);
        // An absolute link of the host names the host's file, not the reader's.
        fs::create_dir_all(host.path().join("usr/lib")).unwrap();
        fs::write(host.path().join("usr/lib/os-release"), "ID=host\n").unwrap();
        fs::create_dir_all(host.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("/usr/lib/os-release", host.path().join("etc/os-release"))
            .unwrap();
        assert_eq!(root.read_to_string("/etc/os-release").unwrap(), "ID=host\n");
        assert_eq!(
            root.metadata("/etc/os-release").unwrap().kind,
            FileKind::File
        );
        assert_eq!(
            root.read_link("/etc/os-release").unwrap(),
            "/usr/lib/os-release"
        );
        assert_eq!(
            root.read_to_string("/etc/missing").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        // `..` does not leave the host root.
        assert_eq!(root.fs_path("/proc/../../etc"), host.path().join("etc"));
        assert_eq!(
            root.fs_path("/proc/../../nope"),
            host.path().join("proc/nope")
        );
        // Below a host root, and always for the agent, no device node is opened.
        assert_eq!(root.open_device("/dev/null"), None);
        assert_eq!(Root::observer(None).open_device("/dev/null"), None);
        assert_eq!(
            Root::observer(Some(host.path())).fs_path("/proc/cmdline"),
            host.path().join("proc/cmdline")
        );
    }
}

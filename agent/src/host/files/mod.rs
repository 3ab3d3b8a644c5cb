//! The one reader of host files, for the doctor, `host/` and the observer: a path is
//! resolved below a root as a process with that `/` would see it ([`resolve`]: links
//! re-rooted, `..` stopped at the root, procfs' own links left to the kernel), then read
//! with a bound ([`read_file_limited`]: refused past it, its newest lines kept, or its first
//! bytes kept). Errors keep their errno (`ENOENT`, `EACCES`, `ELOOP`), so that a report can
//! say why a file was not read.
//!
//! The roots: `/` (the agent on the host), the host's `/` mounted at `--host-root` (the
//! agent or the doctor in a container), and a process's `<proc_root>/<pid>/root` (its
//! libcuda files, its pod's files).

mod limited;
mod resolve;

use std::io;
use std::path::Path;

pub use limited::{
    read_file_limited, read_stream_limited, too_large, LimitedRead, Overflow, ReadLimit, TooLarge,
};
pub use resolve::{resolve, MAX_SYMLINKS};

/// The file at absolute `path` as a process whose `/` is `root` sees it, read up to `limit`.
///
/// Errors: as [`resolve`], then as [`read_file_limited`].
pub fn read_below(root: &Path, path: &Path, limit: ReadLimit) -> io::Result<LimitedRead> {
    read_file_limited(&resolve(root, None, path)?, limit)
}

/// The first `max` bytes of the file at `path` (a path of the agent's own; for
/// `<proc_root>/<pid>/cmdline` and the like), the rest left unread. `None` when it cannot be
/// read (the process is gone, or not readable to the agent); a cut file is said at trace
/// level.
pub fn read_capped(path: &Path, max: u64) -> Option<Vec<u8>> {
    keep_first(path, read_file_limited(path, first_bytes(max)))
}

/// [`read_capped`] of the file at absolute `path` below `root` ([`read_below`]).
pub fn read_capped_below(root: &Path, path: &Path, max: u64) -> Option<Vec<u8>> {
    keep_first(path, read_below(root, path, first_bytes(max)))
}

fn first_bytes(max: u64) -> ReadLimit {
    ReadLimit {
        bytes: max,
        overflow: Overflow::KeepFirst,
    }
}

fn keep_first(path: &Path, read: io::Result<LimitedRead>) -> Option<Vec<u8>> {
    match read {
        Ok(read) => {
            if read.cut {
                tracing::trace!(path = %path.display(), kept = read.bytes.len(), "file cut at its bound");
            }
            Some(read.bytes)
        }
        Err(err) => {
            tracing::trace!(path = %path.display(), %err, "file not read");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn reads_below_a_root_are_resolved_there_and_bounded() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::write(
            root.join("usr/lib/os-release"),
            "ID=debian\nVERSION_ID=12\n",
        )
        .unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        // An absolute link names the root's file, not the agent's /usr/lib/os-release.
        symlink("/usr/lib/os-release", root.join("etc/os-release")).unwrap();
        let limit = ReadLimit {
            bytes: 1 << 20,
            overflow: Overflow::Refuse,
        };
        let read = read_below(root, Path::new("/etc/os-release"), limit).unwrap();
        assert_eq!(read.bytes, b"ID=debian\nVERSION_ID=12\n");
        let small = ReadLimit {
            bytes: 4,
            overflow: Overflow::Refuse,
        };
        let err = read_below(root, Path::new("/etc/os-release"), small).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            read_capped_below(root, Path::new("/etc/os-release"), 9).as_deref(),
            Some(&b"ID=debian"[..])
        );
        let err = read_below(root, Path::new("/etc/missing"), limit).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(read_capped(&root.join("etc/missing"), 9), None);
    }
}

//! Finding the `libcuda` files to attach uprobes to.
//!
//! A uprobe binds to an inode, so every source of candidate paths (command-line flags, the
//! host's `ld.so.cache`, the usual driver directories, the maps and opens of running
//! processes) is reduced to `(st_dev, st_ino)` and each distinct file is reported once
//! ([`Discovery`]). Paths seen by a process are resolved inside that process's root
//! (`/proc/<pid>/root`), since a container's `libcuda` is often absent from the host or
//! a different file there; resolving a name like `libcuda.so.1` against the host's
//! linker cache instead is a known pitfall.
//!
//! Here: the libcuda names, [`LibTarget`] and the [`Discovery`] that deduplicates; in
//! `host.rs` the host-side finds ([`Discovery::from_host`], [`DRIVER_DIRS`]) with the linker
//! cache parser in `ld_cache.rs`; in `process.rs` the finds in running processes
//! ([`Discovery::from_process`], [`Discovery::from_opened_path`], [`mapped_libcuda`]).

mod host;
mod ld_cache;
mod process;

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub use host::DRIVER_DIRS;
pub use ld_cache::parse_ld_so_cache;
pub use process::{libcuda_file_version, libcuda_in_maps, libcuda_version, mapped_libcuda};

/// Whether a file name (or a path, judged by its last component) names the CUDA driver
/// library: `libcuda.so`, or `libcuda.so.` followed by a version (`libcuda.so.1`,
/// `libcuda.so.590.48.01`). `libcudart.so*`, `libcudadebugger.so*`, `libcuda_foo.so`,
/// `libcuda.sox` are not.
pub fn is_libcuda_name(file_name: &str) -> bool {
    let base = file_name.rsplit('/').next().unwrap_or(file_name);
    match base.strip_prefix("libcuda.so") {
        Some("") => true,
        Some(rest) => rest.len() > 1 && rest.starts_with('.'),
        None => false,
    }
}

/// Whether a path's last component names the CUDA driver library ([`is_libcuda_name`]).
pub fn is_libcuda_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(is_libcuda_name)
}

/// Where a [`LibTarget`] was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Named on the command line.
    Flag,
    /// An entry of the host's `ld.so.cache`.
    LdCache,
    /// A file in one of the driver directories ([`DRIVER_DIRS`]) on the host.
    DriverDir,
    /// Mapped by process `pid` (its `/proc/<pid>/maps`).
    ProcessMaps {
        /// Process id (tgid) whose maps named the file.
        pid: u32,
    },
    /// Opened by process `pid` (a path reported by the kernel, see
    /// [`Discovery::from_opened_path`]).
    ProcessOpen {
        /// Process id (tgid) that opened the file.
        pid: u32,
    },
}

/// One distinct libcuda file to attach to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibTarget {
    /// Path as the finding process (or the host, for host-side finds) names it.
    pub path_in_ns: PathBuf,
    /// Path through which the agent reaches the same file: the plain path for host-side
    /// finds and for process finds whose plain path is the same inode; otherwise
    /// `<proc_root>/<pid>/root/<path with symlinks resolved inside that root>`, or
    /// `<proc_root>/<pid>/map_files/<start>-<end>` for a mapped file that was deleted.
    pub host_path: PathBuf,
    /// `st_dev` of the file (`stat(2)`, symlinks followed).
    pub dev: u64,
    /// `st_ino` of the file (`stat(2)`, symlinks followed).
    pub ino: u64,
    /// How the file was found.
    pub source: Source,
}

/// Stats `host_path`, following symlinks, and describes it as a [`LibTarget`].
///
/// Errors: the path cannot be stat'ed (missing, dangling link, process gone) or is not a
/// regular file.
pub fn resolve(host_path: &Path, path_in_ns: &Path, source: Source) -> Result<LibTarget> {
    let meta = fs::metadata(host_path).with_context(|| format!("stat {}", host_path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", host_path.display());
    }
    Ok(LibTarget {
        path_in_ns: path_in_ns.to_path_buf(),
        host_path: host_path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        source,
    })
}

/// Finds libcuda files and reports each distinct file once.
///
/// Holds the `(st_dev, st_ino)` of every file already reported, so the `from_*` and
/// [`Self::scan_all`] methods return only files not returned before by this instance:
/// callers attach once per file. [`Self::forget`] undoes that for a failed attach.
#[derive(Debug, Default)]
pub struct Discovery {
    seen: HashSet<(u64, u64)>,
    /// The release of each libcuda file asked about ([`Discovery::opened_libcuda_version`]),
    /// by `(st_dev, st_ino)`: a file's content is read at most once.
    versions: std::collections::HashMap<(u64, u64), Option<String>>,
}

/// A libcuda file a process opened, open here too ([`Discovery::open_opened_libcuda`]).
#[derive(Debug)]
pub struct OpenedLibcuda {
    host: PathBuf,
    file: fs::File,
    key: (u64, u64),
}

/// Files whose release [`Discovery`] keeps at most (the cache is emptied when full).
const VERSIONS_KEPT: usize = 1024;

impl Discovery {
    /// An instance that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The file a process opened as a libcuda, resolved inside its root and opened here, for
    /// [`Self::opened_libcuda_version`]: opened while the process still runs (one whose
    /// `cuInit` fails at once, on a release the kernel module refuses, is gone a few
    /// milliseconds later), read after the probes are attached. `None` when the path cannot
    /// be resolved or opened.
    pub fn open_opened_libcuda(
        &self,
        proc_root: &Path,
        pid: u32,
        path_in_ns: &str,
    ) -> Option<OpenedLibcuda> {
        let host = process::resolve_opened(proc_root, pid, path_in_ns)?;
        let file = fs::File::open(&host).ok()?;
        let meta = file.metadata().ok()?;
        Some(OpenedLibcuda {
            host,
            file,
            key: (meta.dev(), meta.ino()),
        })
    }

    /// The driver release of a libcuda file a process opened
    /// ([`process::libcuda_file_version`]); `None` when neither its name nor its content
    /// tells. Each file's content is read once.
    pub fn opened_libcuda_version(&mut self, opened: OpenedLibcuda) -> Option<String> {
        if let Some(v) = self.versions.get(&opened.key) {
            return v.clone();
        }
        if self.versions.len() >= VERSIONS_KEPT {
            self.versions.clear();
        }
        let v = process::libcuda_file_version(&opened.host, opened.file);
        self.versions.insert(opened.key, v.clone());
        v
    }

    /// Makes `(dev, ino)` new again, so the next find of that file reports it (call it
    /// when attaching to a reported target failed).
    pub fn forget(&mut self, dev: u64, ino: u64) {
        self.seen.remove(&(dev, ino));
    }

    fn claim(&mut self, target: LibTarget) -> Option<LibTarget> {
        self.seen.insert((target.dev, target.ino)).then_some(target)
    }

    /// Files named on the command line, taken as they are (they need not have a libcuda
    /// name; relative paths are relative to the agent's working directory).
    ///
    /// Returns one item per path that is a new file or an error, in order: files already
    /// seen (including an earlier path of the same call) are left out; a path that cannot
    /// be stat'ed or is not a regular file gives an `Err` naming it.
    pub fn from_flags(&mut self, paths: &[PathBuf]) -> Vec<Result<LibTarget>> {
        let mut out = Vec::new();
        for path in paths {
            match resolve(path, path, Source::Flag) {
                Ok(target) => out.extend(self.claim(target).map(Ok)),
                Err(err) => out.push(Err(err.context("libcuda path given as flag"))),
            }
        }
        out
    }

    /// [`Self::from_process`] over every process in `proc_root`. Processes that vanish or
    /// cannot be read are skipped (logged at `debug`). Returns the new files.
    pub fn scan_all(&mut self, proc_root: &Path) -> Vec<LibTarget> {
        let pids = match crate::host::procfs::list_pids(proc_root) {
            Ok(pids) => pids,
            Err(err) => {
                tracing::warn!("cannot list processes: {err:#}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for pid in pids {
            match self.from_process(proc_root, pid) {
                Ok(found) => out.extend(found),
                Err(err) => tracing::debug!(pid, "skipping process: {err:#}"),
            }
        }
        out
    }
}

/// Whether two paths stat (following links) to the same file.
/// `path` resolved below `root` as a process with that `/` (and working directory `cwd`)
/// sees it ([`files::resolve`](crate::host::files::resolve)).
fn below(root: &Path, cwd: Option<&Path>, path: &Path) -> Result<PathBuf> {
    crate::host::files::resolve(root, cwd, path)
        .with_context(|| format!("resolving {} below {}", path.display(), root.display()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    pub(super) fn write(path: &Path, contents: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    pub(super) fn ino(path: &Path) -> (u64, u64) {
        let m = fs::metadata(path).unwrap();
        (m.dev(), m.ino())
    }

    #[test]
    fn libcuda_names() {
        for yes in [
            "libcuda.so",
            "libcuda.so.1",
            "libcuda.so.590.48.01",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/dir with space/libcuda.so.535.288.01",
        ] {
            assert!(is_libcuda_name(yes), "{yes}");
        }
        for no in [
            "libcudart.so.12",
            "libcudadebugger.so.1",
            "libcuda_foo.so",
            "libcuda.sox",
            "libcuda.so.",
            "libcuda",
            "xlibcuda.so.1",
            "/usr/lib/libcuda.so.1/other",
            "libnvcuvid.so.1",
            "",
        ] {
            assert!(!is_libcuda_name(no), "{no}");
        }
    }

    /// A process whose cuInit fails at once is gone by the time the probes are attached:
    /// the release of the copy it loaded is read from the file opened before, and once.
    #[test]
    fn the_release_of_an_opened_copy_is_read_after_the_process_is_gone() {
        let proc_root = tempfile::tempdir().unwrap();
        let lib = proc_root.path().join("77/root/opt/lib");
        fs::create_dir_all(&lib).unwrap();
        std::os::unix::fs::symlink("/", proc_root.path().join("77/cwd")).unwrap();
        write(
            &lib.join("libcuda.so.1"),
            b"\x7fELF nvidia-application-profiles-535.261.03-rc",
        );
        let mut d = Discovery::new();
        let path = "/opt/lib/libcuda.so.1";
        let opened = d.open_opened_libcuda(proc_root.path(), 77, path).unwrap();
        let again = d.open_opened_libcuda(proc_root.path(), 77, path).unwrap();
        fs::remove_dir_all(proc_root.path().join("77")).unwrap();
        assert!(d.open_opened_libcuda(proc_root.path(), 77, path).is_none());
        assert_eq!(
            d.opened_libcuda_version(opened).as_deref(),
            Some("535.261.03")
        );
        assert_eq!(
            d.opened_libcuda_version(again).as_deref(),
            Some("535.261.03")
        );
        assert_eq!(d.versions.len(), 1);
    }

    #[test]
    fn resolve_and_flags_dedupe() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("libcuda.so.590.48.01");
        write(&real, b"ELF");
        let link = dir.path().join("libcuda.so.1");
        symlink("libcuda.so.590.48.01", &link).unwrap();
        let dangling = dir.path().join("libcuda.so");
        symlink("libcuda.so.404", &dangling).unwrap();

        let t = resolve(&link, Path::new("/x/libcuda.so.1"), Source::Flag).unwrap();
        assert_eq!((t.dev, t.ino), ino(&real));
        assert_eq!(t.host_path, link);
        assert_eq!(t.path_in_ns, PathBuf::from("/x/libcuda.so.1"));
        assert!(resolve(&dangling, &dangling, Source::Flag).is_err());
        assert!(resolve(dir.path(), dir.path(), Source::Flag).is_err());

        let mut d = Discovery::new();
        let got = d.from_flags(&[link.clone(), real.clone(), dangling.clone()]);
        assert_eq!(got.len(), 2);
        let first = got[0].as_ref().unwrap();
        assert_eq!(first.host_path, link);
        assert_eq!(first.source, Source::Flag);
        let err = got[1].as_ref().unwrap_err();
        assert!(format!("{err:#}").contains("libcuda.so"), "{err:#}");
        // Seen before: nothing new; after forget: reported again.
        assert!(d.from_flags(std::slice::from_ref(&real)).is_empty());
        let (dev, i) = ino(&real);
        d.forget(dev, i);
        assert_eq!(d.from_flags(std::slice::from_ref(&real)).len(), 1);
    }
}

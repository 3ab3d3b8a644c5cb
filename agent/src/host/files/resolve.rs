//! Paths below a root: resolving a path as the kernel would for a process whose `/` is
//! `root` ([`resolve`]): a process's `<proc_root>/<pid>/root`, or the host's `/` mounted at
//! `--host-root` in the agent's container.
//!
//! Following a link found there with the agent's own root would be wrong: an absolute link
//! inside a container names a file of the container (`/var/run -> /run`), not of the
//! host, and `..` must not climb out of the container's root. procfs' own links
//! (`/proc/<pid>/root`, `/proc/<pid>/fd/N`) are not paths: the kernel follows them, and
//! `/proc/<pid>/root` becomes the root for what comes after it.

use std::collections::VecDeque;
use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed in one resolution (the kernel's `MAXSYMLINKS`).
pub const MAX_SYMLINKS: usize = 40;

/// One step of a path walk, owned so that link targets can be spliced in.
enum Step {
    Root,
    Parent,
    Name(OsString),
}

fn steps(path: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir | Component::Prefix(_) => Some(Step::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(name) => Some(Step::Name(name.to_os_string())),
    })
}

/// Resolves `path` component by component as the kernel would for a process whose `/` is
/// `root` and whose working directory is `cwd` (for relative paths): symlink targets are
/// followed with absolute ones re-rooted at `root`, and `..` never climbs above `root`.
/// Returns a host path under `root` (or `cwd`) with no symlink components left. For a
/// relative path, a `..` above `cwd` is kept as `cwd/..`, for the kernel to walk from the
/// cwd's own directory.
///
/// A link of procfs whose target is not a path of this root (`/proc/<pid>/root` reads `/`,
/// `/proc/<pid>/fd/3` `socket:[123]` or a file of another mount namespace) is left for the
/// kernel to follow, and a `/proc/<pid>/root` so crossed is the root from there on.
///
/// Errors: as `lstat(2)` of the first component that does not exist or cannot be stat'ed
/// (the same errno), `InvalidInput` for a relative path without `cwd`, `ELOOP` past
/// [`MAX_SYMLINKS`] links (a loop).
pub fn resolve(root: &Path, cwd: Option<&Path>, path: &Path) -> io::Result<PathBuf> {
    let mut root = root.to_path_buf();
    let (mut base, mut at_root) = if path.is_absolute() {
        (root.clone(), true)
    } else {
        let cwd = cwd.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("relative path {} without a cwd", path.display()),
            )
        })?;
        (cwd.to_path_buf(), false)
    };
    let mut stack: Vec<OsString> = Vec::new();
    let mut pending: VecDeque<Step> = steps(path).collect();
    let mut follows = 0;
    while let Some(step) = pending.pop_front() {
        match step {
            Step::Root => {
                base = root.clone();
                at_root = true;
                stack.clear();
            }
            Step::Parent => {
                if stack.pop().is_none() && !at_root {
                    base.push("..");
                }
            }
            Step::Name(name) => {
                let mut candidate = base.clone();
                candidate.extend(&stack);
                candidate.push(&name);
                let meta = fs::symlink_metadata(&candidate)?;
                if !meta.file_type().is_symlink() {
                    stack.push(name);
                    continue;
                }
                follows += 1;
                if follows > MAX_SYMLINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = fs::read_link(&candidate)?;
                if is_procfs_link(&candidate, &target) {
                    if name == "root" {
                        root = candidate;
                        base = root.clone();
                        at_root = true;
                        stack.clear();
                    } else {
                        stack.push(name);
                    }
                    continue;
                }
                for step in steps(&target).rev() {
                    pending.push_front(step);
                }
            }
        }
    }
    let mut out = base;
    out.extend(&stack);
    Ok(out)
}

/// Whether the link at `link` (target `target`) is one of procfs' own, which the kernel
/// follows to an object rather than a path: its directory is on procfs
/// (`PROC_SUPER_MAGIC`) and its target is absolute or no path at all. `/proc/self` and
/// `/proc/mounts` (relative targets) are ordinary links.
fn is_procfs_link(link: &Path, target: &Path) -> bool {
    if target.is_relative() && !target.as_os_str().as_bytes().contains(&b':') {
        return false;
    }
    let Some(dir) = link.parent() else {
        return false;
    };
    let Ok(dir) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `dir` is a NUL-terminated path and `fs` a buffer of the size statfs writes.
    let rc = unsafe { libc::statfs(dir.as_ptr(), fs.as_mut_ptr()) };
    // SAFETY: statfs filled `fs` when it returned 0.
    rc == 0 && unsafe { fs.assume_init() }.f_type == libc::PROC_SUPER_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn read(root: &Path, path: &str) -> Option<String> {
        let host = resolve(root, None, Path::new(path)).ok()?;
        fs::read(host)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn files_under_a_process_root_resolve_inside_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("real/secrets")).unwrap();
        fs::write(root.join("real/secrets/namespace"), "ns\n").unwrap();
        // Re-rooted, this link names itself: a loop, not the agent's /etc.
        symlink("/etc", root.join("etc")).unwrap();
        assert_eq!(
            read(&root, "/real/secrets/namespace").as_deref(),
            Some("ns\n")
        );
        assert_eq!(read(&root, "/etc/hostname"), None);
        assert_eq!(read(&root, "../x"), None);
        // `..` stops at the root: never the file beside it.
        fs::write(t.path().join("x"), "outside").unwrap();
        assert_eq!(read(&root, "/../x"), None);
        fs::write(root.join("x"), "inside").unwrap();
        assert_eq!(read(&root, "/../x").as_deref(), Some("inside"));
        assert_eq!(read(&root, "/real/../../x").as_deref(), Some("inside"));
        // Absolute and relative links are followed inside the root.
        symlink("/real/secrets", root.join("abs")).unwrap();
        symlink("real/secrets/../secrets", root.join("rel")).unwrap();
        symlink("../../../../x", root.join("real/up")).unwrap();
        assert_eq!(read(&root, "/abs/namespace").as_deref(), Some("ns\n"));
        assert_eq!(read(&root, "/rel/namespace").as_deref(), Some("ns\n"));
        assert_eq!(read(&root, "/real/up").as_deref(), Some("inside"));
        assert_eq!(
            resolve(&root, None, Path::new("/abs/namespace")).unwrap(),
            root.join("real/secrets/namespace")
        );
        // A loop is ELOOP, a missing component its own errno.
        let err = resolve(&root, None, Path::new("/etc/hostname")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let err = resolve(&root, None, Path::new("/real/nope/x")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn procfs_links_are_followed_by_the_kernel() {
        // This process's `/proc/self/root` is `/`: what lies below it is this machine's.
        let me = std::process::id();
        let via = resolve(
            Path::new("/"),
            None,
            Path::new(&format!("/proc/{me}/root/proc/sys/kernel/osrelease")),
        )
        .unwrap();
        assert_eq!(
            via,
            PathBuf::from(format!("/proc/{me}/root/proc/sys/kernel/osrelease"))
        );
        assert_eq!(
            fs::read(&via).unwrap(),
            fs::read("/proc/sys/kernel/osrelease").unwrap()
        );
        // An absolute link below it is re-rooted there, not at the first root.
        let t = tempfile::tempdir().unwrap();
        symlink(t.path(), t.path().join("here")).unwrap();
        let inside = format!("/proc/{me}/root{}/here", t.path().display());
        let got = resolve(Path::new("/"), None, Path::new(&inside)).unwrap();
        assert_eq!(
            got,
            PathBuf::from(format!("/proc/{me}/root{}", t.path().display()))
        );
        // An fd link is left as it is; `/proc/self` is an ordinary link.
        let f = fs::File::open(t.path()).unwrap();
        use std::os::fd::AsRawFd;
        let fd = format!("/proc/self/fd/{}", f.as_raw_fd());
        let got = resolve(Path::new("/"), None, Path::new(&fd)).unwrap();
        assert_eq!(
            got,
            PathBuf::from(format!("/proc/{me}/fd/{}", f.as_raw_fd()))
        );
    }

    #[test]
    fn relative_paths_start_at_the_cwd() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("work/sub")).unwrap();
        fs::write(root.join("work/f"), "f").unwrap();
        let cwd = root.join("work/sub");
        assert_eq!(
            resolve(&root, Some(&cwd), Path::new("../f")).unwrap(),
            cwd.join("../f")
        );
        let err = resolve(&root, None, Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("without a cwd"), "{err}");
        let err = resolve(&root, Some(&cwd), Path::new("missing")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}

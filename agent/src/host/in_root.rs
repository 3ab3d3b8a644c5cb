//! Paths inside a process's root: resolving a path as the kernel would for a process whose
//! `/` is `<proc_root>/<pid>/root` ([`resolve`]), and reading a small file through that
//! resolution ([`read_capped`]).
//!
//! Following a link found there with the agent's own root would be wrong: an absolute link
//! inside a container names a file of the container (`/var/run -> /run`), not of the
//! host, and `..` must not climb out of the container's root. Used for the libcuda
//! files of a process ([`super::discovery`]) and the files the workload identification
//! reads in a pod ([`super::workload`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

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
/// Errors: a relative path without `cwd`, a component that does not exist or cannot be
/// stat'ed, more than [`MAX_SYMLINKS`] links followed (a loop).
pub fn resolve(root: &Path, cwd: Option<&Path>, path: &Path) -> Result<PathBuf> {
    let (mut base, mut at_root) = if path.is_absolute() {
        (root.to_path_buf(), true)
    } else {
        let cwd = cwd.ok_or_else(|| anyhow!("relative path {} without a cwd", path.display()))?;
        (cwd.to_path_buf(), false)
    };
    let mut stack: Vec<OsString> = Vec::new();
    let mut pending: VecDeque<Step> = steps(path).collect();
    let mut follows = 0;
    while let Some(step) = pending.pop_front() {
        match step {
            Step::Root => {
                base = root.to_path_buf();
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
                let meta = fs::symlink_metadata(&candidate).with_context(|| {
                    format!("resolving {}: stat {}", path.display(), candidate.display())
                })?;
                if !meta.file_type().is_symlink() {
                    stack.push(name);
                    continue;
                }
                follows += 1;
                if follows > MAX_SYMLINKS {
                    bail!(
                        "resolving {}: too many levels of symbolic links",
                        path.display()
                    );
                }
                let target = fs::read_link(&candidate)
                    .with_context(|| format!("reading link {}", candidate.display()))?;
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

/// The first `max` bytes of the file at `path` as the process whose `/` is `root` sees it
/// (`path` absolute; see [`resolve`]). `None` when it cannot be resolved or read.
pub fn read_capped(root: &Path, path: &Path, max: u64) -> Option<Vec<u8>> {
    super::procfs::read_capped(&resolve(root, None, path).ok()?, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn read(root: &Path, path: &str) -> Option<String> {
        read_capped(root, Path::new(path), 4096).map(|b| String::from_utf8_lossy(&b).into_owned())
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
        // Only `max` bytes.
        assert_eq!(
            read_capped(&root, Path::new("/x"), 2).as_deref(),
            Some(&b"in"[..])
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
        assert!(format!("{err:#}").contains("without a cwd"), "{err:#}");
        let err = resolve(&root, Some(&cwd), Path::new("missing")).unwrap_err();
        assert!(format!("{err:#}").contains("missing"), "{err:#}");
    }
}

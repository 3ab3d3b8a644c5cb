//! Processes of interest, found in one pass over `/proc`: the NVIDIA daemons running, and
//! the libcuda each CUDA process has mapped (with the version its path resolves to).

use super::super::facts::{Fact, MappedLibcuda};
use super::super::root::Root;
use crate::host::discovery::libcuda_version;

/// Daemons looked for by process name ([`Evidence::daemons`](super::super::facts::Evidence::daemons)).
pub const DAEMONS: [&str; 2] = ["nv-fabricmanager", "nvidia-persistenced"];

/// Most symbolic links followed when resolving a libcuda path (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Lists processes once and fills [`Evidence::daemons`](super::super::facts::Evidence::daemons) and [`Evidence::libcuda`].
pub(super) fn collect_processes(root: &Root) -> (Fact<Vec<String>>, Fact<Vec<MappedLibcuda>>) {
    const DAEMON_SOURCE: &str = "/proc/<pid>/comm";
    const LIBCUDA_SOURCE: &str = "/proc/<pid>/maps";
    let proc_dir = root.fs_path("/proc");
    let pids = match crate::host::procfs::list_pids(&proc_dir) {
        Ok(pids) => pids,
        Err(err) => {
            let why = format!("not readable: cannot list processes: {}", err.root_cause());
            return (
                Fact::unavailable(why.clone(), DAEMON_SOURCE),
                Fact::unavailable(why, LIBCUDA_SOURCE),
            );
        }
    };
    let keep_daemon =
        |comm: &[u8]| daemon_of_comm(String::from_utf8_lossy(comm).trim()).map(|_| comm.to_vec());
    let mut daemons = Vec::new();
    let mut libcuda = Vec::new();
    for pid in pids {
        if let Ok(comm) = root.scan_filtered(&format!("/proc/{pid}/comm"), b'\n', &keep_daemon) {
            if let Some(name) = daemon_of_comm(String::from_utf8_lossy(&comm).trim()) {
                daemons.push(name.to_string());
            }
        }
        let Ok(kept) = root.scan_filtered(&format!("/proc/{pid}/maps"), b'\n', &keep_libcuda_line)
        else {
            continue;
        };
        let paths = crate::host::discovery::libcuda_in_maps(&kept);
        if paths.is_empty() {
            continue;
        }
        let comm = root
            .read_to_string(&format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end_matches('\n').to_string())
            .unwrap_or_default();
        for path in paths {
            let path = path.to_string_lossy().into_owned();
            libcuda.push(MappedLibcuda {
                pid,
                comm: comm.clone(),
                version: resolve_libcuda_version(root, pid, &path),
                compat: is_compat_path(&path),
                path,
            });
        }
    }
    daemons.sort();
    daemons.dedup();
    (
        Fact::ok(daemons, DAEMON_SOURCE),
        Fact::ok(libcuda, LIBCUDA_SOURCE),
    )
}

/// Which of [`DAEMONS`] a process name (`/proc/<pid>/comm`) is. The kernel keeps at most 15
/// bytes of a name (`TASK_COMM_LEN` is 16), so `nvidia-persiste` is `nvidia-persistenced`.
pub fn daemon_of_comm(comm: &str) -> Option<&'static str> {
    DAEMONS
        .into_iter()
        .find(|d| comm == *d || (comm.len() == 15 && d.starts_with(comm)))
}

/// Keeps a `/proc/<pid>/maps` line ([`crate::host::procfs::maps::parse_line`]) whose path
/// names libcuda ([`crate::host::discovery::is_libcuda_file`]).
fn keep_libcuda_line(line: &[u8]) -> Option<Vec<u8>> {
    crate::host::procfs::maps::parse_line(line)
        .is_some_and(|m| crate::host::discovery::is_libcuda_file(&m.path))
        .then(|| line.to_vec())
}

/// Whether a path lies in a `compat` directory (the CUDA forward-compatibility package,
/// e.g. `/usr/local/cuda-12.8/compat/libcuda.so.570.86.15`).
pub fn is_compat_path(path: &str) -> bool {
    path.split('/').any(|c| c == "compat")
}

/// Version of the libcuda file `path` (inside process `pid`'s mount namespace) resolves to:
/// the file name if it carries a version, else the targets of its symbolic links read
/// through `/proc/<pid>/root`. `None` when no name on the way has a version or a link
/// cannot be read.
fn resolve_libcuda_version(root: &Root, pid: u32, path: &str) -> Option<String> {
    let ns_root = format!("/proc/{pid}/root");
    let mut current = normalize(path);
    for _ in 0..=MAX_LINKS {
        let name = current.rsplit('/').next().unwrap_or(&current);
        if let Some(version) = libcuda_version(name) {
            return Some(version);
        }
        let target = root.read_link(&format!("{ns_root}{current}")).ok()?;
        current = if target.starts_with('/') {
            normalize(&target)
        } else {
            let parent = current.rsplit_once('/').map_or("", |(p, _)| p);
            normalize(&format!("{parent}/{target}"))
        };
    }
    None
}

/// Lexically normalised absolute path: `.` dropped, `..` applied (never above `/`).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcuda_names_and_daemons() {
        assert_eq!(
            libcuda_version("libcuda.so.590.48.01").as_deref(),
            Some("590.48.01")
        );
        assert_eq!(libcuda_version("libcuda.so.1"), None);
        assert_eq!(libcuda_version("libcuda.so"), None);
        assert_eq!(libcuda_version("libcuda.so.590..01"), None);
        assert!(is_compat_path(
            "/usr/local/cuda-12.8/compat/libcuda.so.570.86.15"
        ));
        assert!(!is_compat_path("/usr/lib/compatibility/libcuda.so.1"));
        assert_eq!(
            daemon_of_comm("nvidia-persiste"),
            Some("nvidia-persistenced")
        );
        assert_eq!(daemon_of_comm("nv-fabricmanage"), Some("nv-fabricmanager"));
        assert_eq!(daemon_of_comm("nvidia-pers"), None);
        assert_eq!(daemon_of_comm("python3"), None);
        assert_eq!(normalize("/a/./b/../../../c//d"), "/c/d");
        assert!(
            keep_libcuda_line(b"7f00-7f01 r--p 0 fd:01 12 /usr/lib/libcuda.so.1 (deleted)")
                .is_some()
        );
        assert!(keep_libcuda_line(b"7f00-7f01 r--p 0 fd:01 12 /usr/lib/libcudart.so.12").is_none());
        assert!(keep_libcuda_line(b"7ffd-7ffe rw-p 0 00:00 0 [stack]").is_none());
    }
}

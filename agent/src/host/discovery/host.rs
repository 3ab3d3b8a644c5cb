//! Libcuda files installed on the host: the linker cache's entries and the driver
//! directories ([`DRIVER_DIRS`]), read under the host's root when the agent runs in a
//! container of its own.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::ld_cache::native_libcuda_paths;

/// Most of the linker cache read: glibc's own is a few hundred KiB on a full desktop; a larger
/// file is refused (and said so) rather than read whole.
const LD_CACHE_LIMIT: crate::host::files::ReadLimit = crate::host::files::ReadLimit {
    bytes: 16 << 20,
    overflow: crate::host::files::Overflow::Refuse,
};
use super::{below, is_libcuda_name, resolve, same_file, Discovery, LibTarget, Source};

/// Directories where NVIDIA driver packages and installers put `libcuda.so*`, searched by
/// [`Discovery::from_host`] in this order (a file reached twice is reported once). Paths
/// are as seen on the host. Not listed on purpose: `/usr/local/cuda/lib64/stubs`, whose
/// `libcuda.so` is a link-time stub that no process runs.
pub const DRIVER_DIRS: &[&str] = &[
    // Debian/Ubuntu multiarch: distribution packages (libcuda1, libnvidia-compute-*) and
    // NVIDIA's .run installer on Debian-like systems.
    "/usr/lib/x86_64-linux-gnu",
    // Debian's nvidia-driver packages keep the real files here, linked from the above.
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    // RHEL/Fedora/SUSE/Amazon Linux packages and the .run installer on those.
    "/usr/lib64",
    // Arch Linux, and the .run installer on systems without lib64/multiarch.
    "/usr/lib",
    // NixOS: the driver's libraries are exposed to all programs here.
    "/run/opengl-driver/lib",
    // Kubernetes: the GKE/device-plugin driver installers mount the driver here inside
    // containers; NVIDIA's CUDA images put it on LD_LIBRARY_PATH.
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    // GKE Container-Optimized OS: host directory the driver installer writes to.
    "/home/kubernetes/bin/nvidia/lib64",
    // NVIDIA GPU Operator: root of the driver container, exposed on the host
    // (Ubuntu-based and RHEL-based driver images).
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
    // WSL2: libcuda provided by the Windows driver.
    "/usr/lib/wsl/lib",
    // CUDA forward-compatibility package (cuda-compat-<ver>): a newer libcuda on an older
    // kernel module, picked up through LD_LIBRARY_PATH.
    "/usr/local/cuda/compat",
];

impl Discovery {
    /// Libcuda files installed on the host: entries of the linker cache at `ld_cache_path`
    /// whose soname or path is a libcuda name and whose ABI is this machine's, then the
    /// libcuda names in each of `dirs` (non-symlinks first, then by name).
    ///
    /// Paths are host paths. When the agent itself runs in another root than the host's
    /// (a container with the host's pid namespace), `<proc_root>/1/root` differs from `/`
    /// and everything is read under it, with symlinks resolved inside it; otherwise paths
    /// are used as they are.
    ///
    /// Returns the new files found. A missing or unreadable cache or directory, a
    /// malformed cache and dangling links are logged (`debug`/`warn`) and skipped.
    pub fn from_host(
        &mut self,
        proc_root: &Path,
        ld_cache_path: &Path,
        dirs: &[&str],
    ) -> Vec<LibTarget> {
        let root = host_root(proc_root);
        let mut out = Vec::new();
        let mut add = |this: &mut Self, path: &Path, source: Source| {
            let found = match &root {
                Some(root) => below(root, None, path).and_then(|host| resolve(&host, path, source)),
                None => resolve(path, path, source),
            };
            match found {
                Ok(target) => out.extend(this.claim(target)),
                Err(err) => tracing::debug!(path = %path.display(), "skipping: {err:#}"),
            }
        };

        let cache = match &root {
            Some(root) => below(root, None, ld_cache_path),
            None => Ok(ld_cache_path.to_path_buf()),
        }
        .and_then(|file| {
            let bytes = crate::host::files::read_file_limited(&file, LD_CACHE_LIMIT)
                .with_context(|| format!("reading {}", file.display()))?
                .bytes;
            Ok((file, bytes))
        });
        match cache {
            Ok((file, bytes)) => match native_libcuda_paths(&bytes) {
                Ok(paths) => {
                    for path in paths {
                        add(self, Path::new(&path), Source::LdCache);
                    }
                }
                Err(err) => {
                    tracing::warn!(cache = %file.display(), "unreadable linker cache: {err:#}")
                }
            },
            Err(err) => {
                tracing::debug!(cache = %ld_cache_path.display(), "no linker cache: {err:#}")
            }
        }

        for dir in dirs {
            let host_dir = match &root {
                Some(root) => match below(root, None, Path::new(dir)) {
                    Ok(d) => d,
                    Err(err) => {
                        tracing::debug!(dir, "skipping driver directory: {err:#}");
                        continue;
                    }
                },
                None => PathBuf::from(dir),
            };
            let entries = match fs::read_dir(&host_dir) {
                Ok(entries) => entries,
                Err(err) => {
                    tracing::debug!(dir, %err, "skipping driver directory");
                    continue;
                }
            };
            let mut names: Vec<(bool, String)> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let is_link = e.file_type().ok()?.is_symlink();
                    is_libcuda_name(&name).then_some((is_link, name))
                })
                .collect();
            names.sort();
            for (_, name) in names {
                add(self, &Path::new(dir).join(name), Source::DriverDir);
            }
        }
        out
    }
}

/// `<proc_root>/1/root` when it is not the agent's own `/`, i.e. the agent runs in another
/// root (container) but sees the host's init process.
fn host_root(proc_root: &Path) -> Option<PathBuf> {
    let init_root = proc_root.join("1").join("root");
    (init_root.exists() && !same_file(&init_root, Path::new("/"))).then_some(init_root)
}

#[cfg(test)]
mod tests {
    use super::super::is_libcuda_name;
    use super::super::ld_cache::tests::{build_cache, I386_LIBC6, X86_64_LIBC6};
    use super::super::tests::{ino, write};
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn host_finds_cache_and_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib64");
        let real = lib.join("libcuda.so.590.48.01");
        write(&real, b"ELF");
        symlink("libcuda.so.590.48.01", lib.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        symlink("libcuda.so.404", lib.join("libcuda.so.2")).unwrap();
        write(&lib.join("libcudart.so.12"), b"ELF");
        let compat = dir.path().join("compat");
        write(&compat.join("libcuda.so.1"), b"ELF newer");
        let i386 = dir.path().join("lib32/libcuda.so.1");
        write(&i386, b"ELF32");

        let cache = dir.path().join("ld.so.cache");
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let so1 = s(&lib.join("libcuda.so.1"));
        let rt = s(&lib.join("libcudart.so.12"));
        let i386s = s(&i386);
        let entries = [
            (I386_LIBC6, "libcuda.so.1", i386s.as_str()),
            (X86_64_LIBC6, "libcudart.so.12", rt.as_str()),
            (X86_64_LIBC6, "libcuda.so.1", so1.as_str()),
        ];
        write(&cache, &build_cache(&entries, true));

        let proc_root = dir.path().join("proc"); // no 1/root: plain host paths
        fs::create_dir(&proc_root).unwrap();
        let dirs = [
            lib.to_str().unwrap(),
            "/nonexistent/dir",
            compat.to_str().unwrap(),
        ];
        let mut d = Discovery::new();
        let got = d.from_host(&proc_root, &cache, &dirs);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert_eq!(got[0].source, Source::LdCache);
        assert_eq!(got[0].host_path, lib.join("libcuda.so.1"));
        assert_eq!((got[0].dev, got[0].ino), ino(&real));
        assert_eq!(got[1].source, Source::DriverDir);
        assert_eq!(got[1].path_in_ns, compat.join("libcuda.so.1"));
        assert!(d.from_host(&proc_root, &cache, &dirs).is_empty());

        // Without the cache, the directory scan reports the real file first.
        let mut d = Discovery::new();
        let got = d.from_host(&proc_root, &dir.path().join("missing"), &dirs[..1]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].path_in_ns, real);

        // A garbage cache is skipped, the directories still searched.
        write(&cache, b"garbage");
        assert_eq!(
            Discovery::new().from_host(&proc_root, &cache, &dirs).len(),
            2
        );
    }

    #[test]
    fn host_root_of_containerised_agent() {
        // `<proc_root>/1/root` differs from `/`: the host is read under it, and an absolute
        // link there points inside it, not at the agent's own root.
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("proc/1/root");
        let libdir = host.join("usr/lib/x86_64-linux-gnu");
        write(&libdir.join("nvidia/current/libcuda.so.590.48.01"), b"ELF");
        symlink(
            "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.590.48.01",
            libdir.join("libcuda.so.1"),
        )
        .unwrap();
        let entries = [(
            X86_64_LIBC6,
            "libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        )];
        write(&host.join("etc/ld.so.cache"), &build_cache(&entries, false));

        let mut d = Discovery::new();
        let got = d.from_host(
            &dir.path().join("proc"),
            Path::new("/etc/ld.so.cache"),
            &[
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu/nvidia/current",
            ],
        );
        assert_eq!(got.len(), 1, "{got:#?}");
        assert_eq!(
            got[0].path_in_ns,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
        assert_eq!(
            got[0].host_path,
            libdir.join("nvidia/current/libcuda.so.590.48.01")
        );
        assert_eq!(
            (got[0].dev, got[0].ino),
            ino(&libdir.join("nvidia/current/libcuda.so.590.48.01"))
        );
    }

    #[test]
    fn host_real_machine() {
        // Whatever this machine holds (no driver here): runs, finds only libcuda names.
        let mut d = Discovery::new();
        let got = d.from_host(
            Path::new("/proc"),
            Path::new("/etc/ld.so.cache"),
            DRIVER_DIRS,
        );
        for t in &got {
            assert!(
                is_libcuda_name(t.path_in_ns.to_str().unwrap()) || t.source == Source::LdCache,
                "{t:?}"
            );
        }
        assert!(d
            .from_host(
                Path::new("/proc"),
                Path::new("/etc/ld.so.cache"),
                DRIVER_DIRS
            )
            .is_empty());
    }
}

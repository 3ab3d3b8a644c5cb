//! Finding the `libcuda` files to attach uprobes to.
//!
//! A uprobe binds to an inode, so every source of candidate paths (command-line flags, the
//! host's `ld.so.cache`, the usual driver directories, the maps and opens of running
//! processes) is reduced to `(st_dev, st_ino)` and each distinct file is reported once
//! ([`Discovery`]). Paths seen by a process are resolved inside that process's root
//! (`/proc/<pid>/root`), since a container's `libcuda` is often absent from the host or
//! a different file there; resolving a name like `libcuda.so.1` against the host's
//! linker cache instead is a known pitfall.

use std::collections::HashSet;
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::in_root;
use super::procfs::maps::{self, MappedFile};

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

const OLD_CACHE_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// `struct cache_file` (old format): magic[11], pad, `u32 nlibs`.
const OLD_HEADER_LEN: usize = 16;
/// `struct file_entry` (old format): `i32 flags; u32 key, value`.
const OLD_ENTRY_LEN: usize = 12;
/// `struct cache_file_new`: magic+version[20], `u32 nlibs`, `u32 len_strings`, `u8 flags`,
/// pad[3], `u32 extension_offset`, `u32 unused[3]`.
const NEW_HEADER_LEN: usize = 48;
/// `struct file_entry_new`: `i32 flags; u32 key, value; u32 osversion; u64 hwcap`.
const NEW_ENTRY_LEN: usize = 24;

/// `flags` value of an entry for this machine's own ABI (glibc `ldconfig.h`: `FLAG_ELF_LIBC6`
/// combined with `FLAG_X8664_LIB64` or `FLAG_AARCH64_LIB64`); `None` where unknown.
#[cfg(target_arch = "x86_64")]
const NATIVE_ENTRY_FLAGS: Option<i32> = Some(0x0303);
#[cfg(target_arch = "aarch64")]
const NATIVE_ENTRY_FLAGS: Option<i32> = Some(0x0a03);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const NATIVE_ENTRY_FLAGS: Option<i32> = None;

struct CacheEntry {
    flags: i32,
    soname: String,
    path: String,
}

/// Parses glibc's dynamic-linker cache (`/etc/ld.so.cache`).
///
/// Accepts the current format (magic `glibc-ld.so.cache1.1`, written by glibc >= 2.32) and
/// the compat layout of older glibc (an `ld.so-1.7.0` section followed, 8-byte aligned, by
/// the new one; only the new section is read). Layout from glibc
/// `sysdeps/generic/dl-cache.h`; string offsets are relative to the new header.
///
/// Returns `(soname, path)` for every entry in file order, i.e. what `ldconfig -p` prints
/// as `soname (...) => path`, for all ABIs present (entries whose strings are not UTF-8
/// are skipped).
///
/// Errors: unknown magic, an old-format-only cache, a byte order other than this
/// machine's, or any header, entry or string that lies outside `bytes` (truncation).
pub fn parse_ld_so_cache(bytes: &[u8]) -> Result<Vec<(String, String)>> {
    Ok(parse_cache_entries(bytes)?
        .into_iter()
        .map(|e| (e.soname, e.path))
        .collect())
}

fn parse_cache_entries(bytes: &[u8]) -> Result<Vec<CacheEntry>> {
    let new = if bytes.starts_with(NEW_CACHE_MAGIC) {
        bytes
    } else if bytes.starts_with(OLD_CACHE_MAGIC) {
        let nlibs = read_u32(bytes, 12, true)? as usize;
        let offset = nlibs
            .checked_mul(OLD_ENTRY_LEN)
            .and_then(|n| n.checked_add(OLD_HEADER_LEN + 7))
            .map(|n| n & !7)
            .ok_or_else(|| anyhow!("ld.so.cache: old section entry count {nlibs} overflows"))?;
        match bytes.get(offset..) {
            Some(rest) if rest.starts_with(NEW_CACHE_MAGIC) => rest,
            Some(_) => bail!("ld.so.cache: old format only (no glibc-ld.so.cache1.1 section)"),
            None => bail!("ld.so.cache: truncated in the old-format section"),
        }
    } else {
        bail!("not an ld.so.cache: unknown magic");
    };

    if new.len() < NEW_HEADER_LEN {
        bail!("ld.so.cache: truncated header ({} bytes)", new.len());
    }
    let little = match new[28] {
        0 => cfg!(target_endian = "little"),
        2 => true,
        3 => false,
        other => bail!("ld.so.cache: invalid byte-order flag {other}"),
    };
    if little != cfg!(target_endian = "little") {
        bail!("ld.so.cache: written for the other byte order");
    }
    let nlibs = read_u32(new, 20, little)? as usize;
    let end = nlibs
        .checked_mul(NEW_ENTRY_LEN)
        .and_then(|n| n.checked_add(NEW_HEADER_LEN))
        .filter(|&end| end <= new.len())
        .ok_or_else(|| {
            anyhow!(
                "ld.so.cache: {nlibs} entries do not fit in {} bytes",
                new.len()
            )
        })?;

    let len_strings = read_u32(new, 24, little)? as usize;
    if end.checked_add(len_strings).is_none_or(|e| e > new.len()) {
        bail!("ld.so.cache: string table of {len_strings} bytes truncated");
    }
    check_cache_extensions(new, read_u32(new, 32, little)? as usize, little)?;

    let mut out = Vec::with_capacity(nlibs);
    for base in (NEW_HEADER_LEN..end).step_by(NEW_ENTRY_LEN) {
        let flags = read_u32(new, base, little)? as i32;
        let key = read_u32(new, base + 4, little)? as usize;
        let value = read_u32(new, base + 8, little)? as usize;
        let soname = cache_string(new, key).context("ld.so.cache: entry soname")?;
        let path = cache_string(new, value).context("ld.so.cache: entry path")?;
        match (std::str::from_utf8(soname), std::str::from_utf8(path)) {
            (Ok(soname), Ok(path)) => out.push(CacheEntry {
                flags,
                soname: soname.to_string(),
                path: path.to_string(),
            }),
            _ => tracing::debug!(
                entry = (base - NEW_HEADER_LEN) / NEW_ENTRY_LEN,
                "ld.so.cache: non-UTF-8 entry skipped"
            ),
        }
    }
    Ok(out)
}

/// `struct cache_extension` magic (glibc `dl-cache.h`: `cache_extension_magic`).
const CACHE_EXTENSION_MAGIC: u32 = 0xEAA4_2174;

/// Checks that the optional extension directory at `offset` (0: none) and the sections it
/// lists (`u32 tag, flags, offset, size` each) lie within `new`, so that a cache cut
/// short in its tail is reported rather than read as complete.
fn check_cache_extensions(new: &[u8], offset: usize, little: bool) -> Result<()> {
    if offset == 0 {
        return Ok(());
    }
    if read_u32(new, offset, little)? != CACHE_EXTENSION_MAGIC {
        bail!("ld.so.cache: bad extension magic at byte {offset}");
    }
    let count = read_u32(new, offset + 4, little)? as usize;
    for i in 0..count {
        let section = offset + 8 + i * 16;
        let start = read_u32(new, section + 8, little)? as usize;
        let size = read_u32(new, section + 12, little)? as usize;
        if start.checked_add(size).is_none_or(|e| e > new.len()) {
            bail!("ld.so.cache: extension section {i} truncated");
        }
    }
    Ok(())
}

fn read_u32(bytes: &[u8], at: usize, little: bool) -> Result<u32> {
    let raw: [u8; 4] = bytes
        .get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| anyhow!("ld.so.cache: truncated at byte {at}"))?;
    Ok(if little {
        u32::from_le_bytes(raw)
    } else {
        u32::from_be_bytes(raw)
    })
}

fn cache_string(bytes: &[u8], at: usize) -> Result<&[u8]> {
    let tail = bytes
        .get(at..)
        .ok_or_else(|| anyhow!("string offset {at} out of range"))?;
    let len = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| anyhow!("string at offset {at} not terminated"))?;
    Ok(&tail[..len])
}

/// Whether a path's last component names the CUDA driver library ([`is_libcuda_name`]).
pub fn is_libcuda_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(is_libcuda_name)
}

/// The first mapping of each distinct libcuda path, in maps order.
#[derive(Default)]
struct LibcudaMappings {
    seen: HashSet<PathBuf>,
    found: Vec<MappedFile>,
}

impl LibcudaMappings {
    fn add(&mut self, m: MappedFile) {
        if is_libcuda_file(&m.path) && self.seen.insert(m.path.clone()) {
            self.found.push(m);
        }
    }
}

fn paths(found: Vec<MappedFile>) -> Vec<PathBuf> {
    found.into_iter().map(|m| m.path).collect()
}

/// First mapping of each distinct libcuda path in `<proc_root>/<pid>/maps`.
fn libcuda_mappings(proc_root: &Path, pid: u32) -> Result<Vec<MappedFile>> {
    let mut libcuda = LibcudaMappings::default();
    maps::scan(proc_root, pid, |m| {
        libcuda.add(m);
        ControlFlow::Continue(())
    })?;
    Ok(libcuda.found)
}

/// The libcuda paths in `maps` contents (or in lines kept from it), as
/// [`mapped_libcuda`] gives them.
pub fn libcuda_in_maps(contents: &[u8]) -> Vec<PathBuf> {
    let mut libcuda = LibcudaMappings::default();
    maps::parse(contents).for_each(|m| libcuda.add(m));
    paths(libcuda.found)
}

/// Paths of the libcuda files process `pid` has mapped, from `<proc_root>/<pid>/maps`.
///
/// Paths are as seen inside the process's mount namespace, each once, in maps order, with
/// a `" (deleted)"` suffix removed (the process keeps the old file mapped after a driver
/// upgrade unlinked it). Paths may contain spaces. At most [`maps::MAX_MAPS_BYTES`] are read.
///
/// Errors: `maps` cannot be read (process gone, no permission).
pub fn mapped_libcuda(proc_root: &Path, pid: u32) -> Result<Vec<PathBuf>> {
    Ok(paths(libcuda_mappings(proc_root, pid)?))
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
}

impl Discovery {
    /// An instance that has seen nothing.
    pub fn new() -> Self {
        Self::default()
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
                Some(root) => {
                    in_root::resolve(root, None, path).and_then(|host| resolve(&host, path, source))
                }
                None => resolve(path, path, source),
            };
            match found {
                Ok(target) => out.extend(this.claim(target)),
                Err(err) => tracing::debug!(path = %path.display(), "skipping: {err:#}"),
            }
        };

        let cache = match &root {
            Some(root) => in_root::resolve(root, None, ld_cache_path),
            None => Ok(ld_cache_path.to_path_buf()),
        }
        .and_then(|file| {
            let bytes = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            Ok((file, bytes))
        });
        match cache {
            Ok((file, bytes)) => match parse_cache_entries(&bytes) {
                Ok(entries) => {
                    for e in entries {
                        let native = NATIVE_ENTRY_FLAGS.is_none_or(|f| e.flags & 0xffff == f);
                        if native && (is_libcuda_name(&e.soname) || is_libcuda_name(&e.path)) {
                            add(self, Path::new(&e.path), Source::LdCache);
                        }
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
                Some(root) => match in_root::resolve(root, None, Path::new(dir)) {
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

    /// Libcuda files mapped by process `pid` ([`mapped_libcuda`]), each resolved inside the
    /// process's root `<proc_root>/<pid>/root` (a deleted file through
    /// `<proc_root>/<pid>/map_files/`); see [`LibTarget::host_path`].
    ///
    /// Returns the new files. Errors: `maps` cannot be read, or a file cannot be resolved
    /// and the process is gone; a file that cannot be resolved while the process lives is
    /// logged (`warn`) and skipped.
    pub fn from_process(&mut self, proc_root: &Path, pid: u32) -> Result<Vec<LibTarget>> {
        let proc_dir = proc_root.join(pid.to_string());
        let mut out = Vec::new();
        for m in libcuda_mappings(proc_root, pid)? {
            let path_in_ns = m.path.as_path();
            let source = Source::ProcessMaps { pid };
            let found = if m.deleted {
                let link = proc_dir
                    .join("map_files")
                    .join(format!("{:x}-{:x}", m.start, m.end));
                resolve(&link, path_in_ns, source)
            } else {
                resolve_process_path(proc_root, pid, path_in_ns, source)
            };
            match found {
                Ok(target) => out.extend(self.claim(target)),
                Err(err) if !proc_dir.exists() => {
                    return Err(err.context(format!("process {pid} exited during discovery")))
                }
                Err(err) => {
                    tracing::warn!(pid, path = %m.path.display(), "cannot resolve mapped libcuda: {err:#}")
                }
            }
        }
        Ok(out)
    }

    /// A path the kernel saw process `pid` open (for example from an `openat` probe),
    /// resolved inside the process's root; a relative path is resolved against
    /// `<proc_root>/<pid>/cwd` and, for a process sharing the agent's root, made absolute
    /// with the cwd's link text for `path_in_ns` (otherwise kept relative).
    ///
    /// Returns `Some` for a new libcuda file (judged by the opened name or by the name the
    /// links lead to), `None` when the file is not libcuda or was seen before. Errors: a
    /// libcuda-named path that cannot be resolved (missing, process gone).
    pub fn from_opened_path(
        &mut self,
        proc_root: &Path,
        pid: u32,
        path_in_ns: &str,
    ) -> Result<Option<LibTarget>> {
        if path_in_ns.is_empty() {
            bail!("empty path opened by process {pid}");
        }
        let proc_dir = proc_root.join(pid.to_string());
        let given = Path::new(path_in_ns);
        let named = is_libcuda_name(path_in_ns);
        let source = Source::ProcessOpen { pid };

        let root = proc_dir.join("root");
        let resolved = if given.is_absolute() {
            in_root::resolve(&root, None, given).and_then(|host| {
                let target = resolve(&host, given, source)?;
                Ok((host, prefer_plain(target)))
            })
        } else {
            let cwd = proc_dir.join("cwd");
            in_root::resolve(&root, Some(&cwd), given).and_then(|host| {
                let shares_root = same_file(&root, Path::new("/"));
                let in_ns = match fs::read_link(&cwd) {
                    Ok(c) if shares_root && c.is_absolute() => c.join(given),
                    _ => given.to_path_buf(),
                };
                let target = resolve(&host, &in_ns, source)?;
                Ok((host, target))
            })
        };
        let (host, target) = match resolved {
            Ok(found) => found,
            Err(err) if named => {
                return Err(err.context(format!("resolving {path_in_ns} opened by process {pid}")))
            }
            Err(_) => return Ok(None),
        };
        if !named && !host.to_str().is_some_and(is_libcuda_name) {
            return Ok(None);
        }
        Ok(self.claim(target))
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

/// Resolves an absolute `path` of process `pid` inside `<proc_root>/<pid>/root`, preferring
/// the plain path as `host_path` when it is the same file.
fn resolve_process_path(
    proc_root: &Path,
    pid: u32,
    path: &Path,
    source: Source,
) -> Result<LibTarget> {
    let root = proc_root.join(pid.to_string()).join("root");
    let host = in_root::resolve(&root, None, path)?;
    Ok(prefer_plain(resolve(&host, path, source)?))
}

/// Uses `target.path_in_ns` as `host_path` when it is absolute and the agent reaches the
/// same file through it (the process shares the host's view of that path).
fn prefer_plain(mut target: LibTarget) -> LibTarget {
    if target.path_in_ns.is_absolute() {
        if let Ok(meta) = fs::metadata(&target.path_in_ns) {
            if (meta.dev(), meta.ino()) == (target.dev, target.ino) {
                target.host_path = target.path_in_ns.clone();
            }
        }
    }
    target
}

/// Whether two paths stat (following links) to the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
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
    use super::*;
    use std::io::BufRead;
    use std::os::unix::fs::symlink;
    use std::process::{Command, Stdio};

    use crate::host::procfs::maps::tests::MAPS_FIXTURE;

    const X86_64_LIBC6: i32 = 0x0303;
    const I386_LIBC6: i32 = 0x0003;

    /// A glibc cache in the new format, optionally behind an old-format section (the
    /// compat layout). Entries are `(flags, soname, path)`.
    fn build_cache(entries: &[(i32, &str, &str)], compat: bool) -> Vec<u8> {
        let mut strings = Vec::new();
        let table_start = NEW_HEADER_LEN + entries.len() * NEW_ENTRY_LEN;
        let mut offsets = Vec::new();
        for (_, key, value) in entries {
            let k = table_start + strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let v = table_start + strings.len();
            strings.extend_from_slice(value.as_bytes());
            strings.push(0);
            offsets.push((k as u32, v as u32));
        }
        let mut new = Vec::new();
        new.extend_from_slice(NEW_CACHE_MAGIC);
        new.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        new.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        new.extend_from_slice(&[2, 0, 0, 0]); // little endian
        new.extend_from_slice(&[0; 16]); // extension_offset, unused[3]
        assert_eq!(new.len(), NEW_HEADER_LEN);
        for ((flags, _, _), (k, v)) in entries.iter().zip(&offsets) {
            new.extend_from_slice(&flags.to_le_bytes());
            new.extend_from_slice(&k.to_le_bytes());
            new.extend_from_slice(&v.to_le_bytes());
            new.extend_from_slice(&0u32.to_le_bytes());
            new.extend_from_slice(&0u64.to_le_bytes());
        }
        new.extend_from_slice(&strings);
        if !compat {
            return new;
        }
        let mut out = Vec::new();
        out.extend_from_slice(OLD_CACHE_MAGIC);
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.resize(OLD_HEADER_LEN + entries.len() * OLD_ENTRY_LEN, 0xee);
        out.resize((out.len() + 7) & !7, 0);
        out.extend_from_slice(&new);
        out
    }

    fn write(path: &Path, contents: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    fn ino(path: &Path) -> (u64, u64) {
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

    #[test]
    fn ld_cache_matches_ldconfig() {
        let bytes = match fs::read("/etc/ld.so.cache") {
            Ok(b) => b,
            Err(err) => {
                uvmwatch_testbed::skip("discovery", &format!("no /etc/ld.so.cache here ({err})"));
                return;
            }
        };
        let parsed = parse_ld_so_cache(&bytes).unwrap();
        let out = match Command::new("ldconfig").arg("-p").output() {
            Ok(out) if out.status.success() => out,
            _ => {
                uvmwatch_testbed::skip("discovery", "ldconfig -p unavailable");
                return;
            }
        };
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        let count: usize = header.split_whitespace().next().unwrap().parse().unwrap();
        // `\tsoname (flags[, hwcap: ...]) => path`, then possibly a trailer from the
        // extension section ("Cache generated by: ...").
        let expected: Vec<(String, String)> = lines
            .filter(|l| l.starts_with('\t'))
            .map(|l| {
                let (left, path) = l.split_once(" => ").unwrap();
                let soname = left.trim_start().split(" (").next().unwrap();
                (soname.to_string(), path.to_string())
            })
            .collect();
        assert_eq!(expected.len(), count);
        assert!(!parsed.is_empty());
        assert_eq!(parsed, expected);

        // Truncations and garbage are errors, never panics.
        assert!(parse_ld_so_cache(&bytes[..bytes.len() / 2]).is_err());
        assert!(parse_ld_so_cache(&bytes[..bytes.len() - 1]).is_err());
        assert!(parse_ld_so_cache(&bytes[..30]).is_err());
        for len in (0..bytes.len()).step_by(61) {
            assert!(parse_ld_so_cache(&bytes[..len]).is_err(), "len={len}");
        }
    }

    #[test]
    fn ld_cache_synthetic() {
        let entries = [
            (
                X86_64_LIBC6,
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ),
            (
                I386_LIBC6,
                "libcuda.so.1",
                "/usr/lib/i386-linux-gnu/libcuda.so.1",
            ),
            (X86_64_LIBC6, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ];
        let want: Vec<(String, String)> = entries
            .iter()
            .map(|(_, k, v)| (k.to_string(), v.to_string()))
            .collect();
        for compat in [false, true] {
            let bytes = build_cache(&entries, compat);
            assert_eq!(parse_ld_so_cache(&bytes).unwrap(), want, "compat={compat}");
            // Every truncation ends inside an entry or the string table.
            for len in 0..bytes.len() {
                assert!(
                    parse_ld_so_cache(&bytes[..len]).is_err(),
                    "compat={compat} len={len}"
                );
            }
        }
        assert!(parse_ld_so_cache(&build_cache(&[], false))
            .unwrap()
            .is_empty());

        let mut bad = build_cache(&entries, false);
        bad[28] = 3; // big endian
        assert!(parse_ld_so_cache(&bad).is_err());
        bad[28] = 1; // invalid
        assert!(parse_ld_so_cache(&bad).is_err());

        let mut bad = build_cache(&entries, false);
        bad[20..24].copy_from_slice(&u32::MAX.to_le_bytes()); // nlibs
        assert!(parse_ld_so_cache(&bad).is_err());
        let mut bad = build_cache(&entries, false);
        bad[52..56].copy_from_slice(&0x7fff_0000u32.to_le_bytes()); // first key offset
        assert!(parse_ld_so_cache(&bad).is_err());

        let mut old_only = OLD_CACHE_MAGIC.to_vec();
        old_only.extend_from_slice(&[0, 0, 0, 0, 0]);
        old_only.resize(64, 0);
        assert!(parse_ld_so_cache(&old_only).is_err());
        assert!(
            parse_ld_so_cache(b"\x7fELF garbage garbage garbage garbage garbage garbage").is_err()
        );
        assert!(parse_ld_so_cache(&[]).is_err());
    }

    #[test]
    fn maps_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let maps = MAPS_FIXTURE;
        write(&dir.path().join("55/maps"), maps.as_bytes());
        let want = vec![
            PathBuf::from("/opt/my libs/libcuda.so.590.48.01"),
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.535.1"),
        ];
        assert_eq!(mapped_libcuda(dir.path(), 55).unwrap(), want);
        assert_eq!(libcuda_in_maps(maps.as_bytes()), want);
        let parsed = libcuda_mappings(dir.path(), 55).unwrap();
        assert_eq!(parsed[0].start, 0x7f1c2a000000);
        assert!(parsed.iter().any(|m| m.deleted && m.end == 0x7f1c2d100000));
        assert!(mapped_libcuda(dir.path(), 56).is_err());
        assert!(is_libcuda_file(Path::new("/dir with space/libcuda.so.1")));
        assert!(!is_libcuda_file(Path::new("/usr/lib/libcuda.so.1/other")));
        assert!(!is_libcuda_file(Path::new("/")));
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

    /// A fixture "container": process 4242 whose root holds the library at a path absent
    /// on the host, reached through relative and absolute links.
    fn container_fixture(dir: &Path) -> (PathBuf, PathBuf) {
        let proc_root = dir.join("proc");
        let p = proc_root.join("4242");
        let ctr_lib = p.join("root/opt/ctr-only/lib");
        let real = ctr_lib.join("libcuda.so.590.48.01");
        write(&real, b"ELF");
        symlink("libcuda.so.590.48.01", ctr_lib.join("libcuda.so.1")).unwrap();
        // Absolute inside the container: must not be followed on the host.
        symlink("/opt/ctr-only/lib/libcuda.so.1", ctr_lib.join("libcuda.so")).unwrap();
        symlink(
            "/../../../../opt/ctr-only/lib/libcuda.so",
            ctr_lib.join("escape.so"),
        )
        .unwrap();
        symlink("loop2", ctr_lib.join("libcuda.so.7")).unwrap();
        symlink("libcuda.so.7", ctr_lib.join("loop2")).unwrap();
        write(&ctr_lib.join("libfoo.so"), b"ELF");
        symlink(p.join("root/opt/ctr-only"), p.join("cwd")).unwrap();
        let maps = "\
5581d0a00000-5581d0a01000 r--p 00000000 00:3f 11 /usr/bin/python3
7f00aa000000-7f00aa400000 r--p 00000000 00:3f 12 /opt/ctr-only/lib/libcuda.so.590.48.01
7f00aa400000-7f00ab000000 r-xp 00400000 00:3f 12 /opt/ctr-only/lib/libcuda.so.590.48.01
7f00ac000000-7f00ac100000 r-xp 00000000 00:3f 13 /usr/local/cuda/lib64/libcudart.so.12
";
        write(&p.join("maps"), maps.as_bytes());
        // A process that vanished: directory without files.
        fs::create_dir_all(proc_root.join("4243")).unwrap();
        (proc_root, real)
    }

    #[test]
    fn container_process_maps_and_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_root, real) = container_fixture(dir.path());
        assert!(!Path::new("/opt/ctr-only").exists());

        let mut d = Discovery::new();
        let got = d.from_process(&proc_root, 4242).unwrap();
        assert_eq!(got.len(), 1);
        let t = &got[0];
        assert_eq!(
            t.path_in_ns,
            PathBuf::from("/opt/ctr-only/lib/libcuda.so.590.48.01")
        );
        assert_eq!(t.host_path, real);
        assert_eq!((t.dev, t.ino), ino(&real));
        assert_eq!(t.source, Source::ProcessMaps { pid: 4242 });
        assert!(d.from_process(&proc_root, 4242).unwrap().is_empty());
        assert!(d.from_process(&proc_root, 4243).is_err());

        // Opens of link names reach the same inode: already seen.
        for p in [
            "/opt/ctr-only/lib/libcuda.so",
            "/opt/ctr-only/lib/libcuda.so.1",
            "lib/libcuda.so",
        ] {
            assert_eq!(
                d.from_opened_path(&proc_root, 4242, p).unwrap(),
                None,
                "{p}"
            );
        }
        // A fresh instance reports them, resolved inside the container's root.
        let mut d2 = Discovery::new();
        let t = d2
            .from_opened_path(&proc_root, 4242, "/opt/ctr-only/lib/libcuda.so")
            .unwrap()
            .unwrap();
        assert_eq!(t.host_path, real);
        assert_eq!(t.path_in_ns, PathBuf::from("/opt/ctr-only/lib/libcuda.so"));
        assert_eq!(t.source, Source::ProcessOpen { pid: 4242 });
        let mut d3 = Discovery::new();
        let t = d3
            .from_opened_path(&proc_root, 4242, "./lib/../lib/libcuda.so.1")
            .unwrap()
            .unwrap();
        assert_eq!((t.dev, t.ino), ino(&real));
        // Reached through the cwd link; the fixture's root is not the agent's, so the
        // in-namespace path stays relative.
        assert_eq!(
            t.host_path,
            proc_root.join("4242/cwd/lib/libcuda.so.590.48.01")
        );
        assert_eq!(t.path_in_ns, PathBuf::from("./lib/../lib/libcuda.so.1"));
        // An absolute link climbing above the root stays inside it.
        let t = Discovery::new()
            .from_opened_path(&proc_root, 4242, "/opt/ctr-only/lib/escape.so")
            .unwrap()
            .unwrap();
        assert_eq!(t.host_path, real);

        // Not libcuda, missing, looping, vanished process.
        assert_eq!(
            d3.from_opened_path(&proc_root, 4242, "/opt/ctr-only/lib/libfoo.so")
                .unwrap(),
            None
        );
        assert_eq!(
            d3.from_opened_path(&proc_root, 4242, "/opt/nothing.so")
                .unwrap(),
            None
        );
        assert!(d3
            .from_opened_path(&proc_root, 4242, "/opt/ctr-only/lib/libcuda.so.9")
            .is_err());
        let err = d3
            .from_opened_path(&proc_root, 4242, "/opt/ctr-only/lib/libcuda.so.7")
            .unwrap_err();
        assert!(format!("{err:#}").contains("symbolic links"), "{err:#}");
        assert!(d3
            .from_opened_path(&proc_root, 4243, "/x/libcuda.so.1")
            .is_err());
        assert!(d3.from_opened_path(&proc_root, 4242, "").is_err());

        // scan_all skips the vanished process and reports the file once.
        let mut d4 = Discovery::new();
        let all = d4.scan_all(&proc_root);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].host_path, real);
        assert!(d4.scan_all(&proc_root).is_empty());
        d4.forget(all[0].dev, all[0].ino);
        assert_eq!(d4.scan_all(&proc_root).len(), 1);
        assert!(Discovery::new()
            .scan_all(&dir.path().join("nope"))
            .is_empty());
    }

    /// Child python process that dlopen()s `lib` and prints "ready".
    struct Loader(std::process::Child);

    impl Drop for Loader {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn spawn_loader(lib: &Path) -> Option<Loader> {
        let script = "import ctypes, sys, time\n\
                      ctypes.CDLL(sys.argv[1])\n\
                      print('ready', flush=True)\n\
                      time.sleep(30)\n";
        let child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(lib)
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut loader = Loader(child);
        let mut line = String::new();
        std::io::BufReader::new(loader.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .ok()?;
        (line.trim() == "ready").then_some(loader)
    }

    #[test]
    fn real_process_maps_fake_libcuda() {
        let dir = tempfile::tempdir().unwrap();
        let libdir = dir.path().join("dir with space");
        fs::create_dir(&libdir).unwrap();
        let src = dir.path().join("fake.c");
        fs::write(
            &src,
            "int cuInit(unsigned int flags) { return (int)flags; }\n",
        )
        .unwrap();
        let lib = libdir.join("libcuda.so.1");
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src)
            .status();
        if !matches!(built, Ok(s) if s.success()) {
            uvmwatch_testbed::skip("discovery", "cannot build a shared object with cc");
            return;
        }
        let Some(loader) = spawn_loader(&lib) else {
            uvmwatch_testbed::skip(
                "discovery",
                "python3 with ctypes cannot load the fake library",
            );
            return;
        };
        let pid = loader.0.id();
        let proc_root = Path::new("/proc");
        let want = ino(&lib);

        assert_eq!(mapped_libcuda(proc_root, pid).unwrap(), vec![lib.clone()]);
        let mut d = Discovery::new();
        let got = d.from_process(proc_root, pid).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].dev, got[0].ino), want);
        assert_eq!(got[0].path_in_ns, lib);
        // Same root as the agent: the plain path is the host path.
        assert_eq!(got[0].host_path, lib);
        assert_eq!(got[0].source, Source::ProcessMaps { pid });
        assert!(d.from_process(proc_root, pid).unwrap().is_empty());
        assert_eq!(
            d.from_opened_path(proc_root, pid, lib.to_str().unwrap())
                .unwrap(),
            None
        );

        let mut fresh = Discovery::new();
        let t = fresh
            .from_opened_path(proc_root, pid, lib.to_str().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!((t.dev, t.ino), want);

        let all = Discovery::new().scan_all(proc_root);
        assert!(all.iter().any(|t| (t.dev, t.ino) == want), "{all:#?}");

        // The driver was "upgraded" under the process: found through map_files (following
        // those links needs CAP_SYS_ADMIN).
        if unsafe { libc::geteuid() } != 0 {
            uvmwatch_testbed::skip("discovery (deleted-library part)", "map_files needs root");
            return;
        }
        fs::remove_file(&lib).unwrap();
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(maps.contains("libcuda.so.1 (deleted)"), "{maps}");
        assert_eq!(mapped_libcuda(proc_root, pid).unwrap(), vec![lib.clone()]);
        let got = Discovery::new().from_process(proc_root, pid).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].dev, got[0].ino), want);
        assert!(
            got[0]
                .host_path
                .starts_with(format!("/proc/{pid}/map_files")),
            "{got:?}"
        );
        assert_eq!(got[0].path_in_ns, lib);

        drop(loader);
        assert!(Discovery::new().from_process(proc_root, pid).is_err());
    }
}

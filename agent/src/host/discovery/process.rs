//! Libcuda files of running processes: what a process has mapped (its `maps`) and what
//! the kernel saw it open, each resolved inside the process's root.

use std::collections::HashSet;
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::{
    below, is_libcuda_file, is_libcuda_name, resolve, same_file, Discovery, LibTarget, Source,
};
use crate::host::procfs::maps::{self, MappedFile};

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

impl Discovery {
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
            below(&root, None, given).and_then(|host| {
                let target = resolve(&host, given, source)?;
                Ok((host, prefer_plain(target)))
            })
        } else {
            let cwd = proc_dir.join("cwd");
            below(&root, Some(&cwd), given).and_then(|host| {
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
    let host = below(&root, None, path)?;
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

/// The host path of a file a process opened, resolved inside its root (from its cwd for a
/// relative path).
pub(super) fn resolve_opened(proc_root: &Path, pid: u32, path_in_ns: &str) -> Option<PathBuf> {
    let proc_dir = proc_root.join(pid.to_string());
    crate::host::files::resolve(
        &proc_dir.join("root"),
        Some(&proc_dir.join("cwd")),
        Path::new(path_in_ns),
    )
    .ok()
}

/// What NVIDIA's libcuda embeds in front of its release: the path of its release's
/// application profiles, `/usr/share/nvidia/nvidia-application-profiles-<release>-rc`
/// (seen in Debian's libcuda1 535.261.03 and 550.163.01).
const PROFILES_MARK: &[u8] = b"nvidia-application-profiles-";

/// Driver version in a libcuda file name: `libcuda.so.590.48.01` gives `590.48.01`; names
/// without a dotted version (`libcuda.so`, `libcuda.so.1`) give `None`.
pub fn libcuda_version(file_name: &str) -> Option<String> {
    let rest = file_name.strip_prefix("libcuda.so.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    (parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| rest.to_string())
}

/// The driver release of the libcuda file at `path`: from its name
/// (`libcuda.so.535.261.03`), else from its `content` (a copy named `libcuda.so.1`:
/// [`PROFILES_MARK`]), read a chunk at a time (a real libcuda is about 100 MiB: read whole,
/// it set the agent's peak memory).
pub fn libcuda_file_version(path: &Path, content: impl std::io::Read) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if let Some(v) = libcuda_version(name) {
        return Some(v);
    }
    content_version(content)
}

/// How much of a file [`content_version`] reads at a time.
const CHUNK: usize = 64 * 1024;

/// The release after the first [`PROFILES_MARK`] followed by a release and `-rc` in `r`.
fn content_version(mut r: impl std::io::Read) -> Option<String> {
    // A mark, a release of at most 32 characters and "-rc": a mark that starts in the last
    // KEEP - 1 bytes of a chunk is looked at again with the next.
    const KEEP: usize = PROFILES_MARK.len() + 32 + 3;
    let mut buf = vec![0u8; KEEP - 1 + CHUNK];
    let mut have = 0;
    loop {
        let n = loop {
            match r.read(&mut buf[have..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other.ok()?,
            }
        };
        have += n;
        let end = n == 0;
        let complete = if end {
            have
        } else {
            have.saturating_sub(KEEP - 1)
        };
        for at in memchr::memmem::find_iter(&buf[..have], PROFILES_MARK) {
            if at >= complete {
                break;
            }
            if let Some(v) = release_after_mark(&buf[at + PROFILES_MARK.len()..have]) {
                return Some(v);
            }
        }
        if end {
            return None;
        }
        buf.copy_within(complete..have, 0);
        have -= complete;
    }
}

/// `535.261.03` from `535.261.03-rc...`: a release of at most 32 digits and dots, then `-rc`.
fn release_after_mark(rest: &[u8]) -> Option<String> {
    let n = rest
        .iter()
        .take(32)
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .count();
    if !rest[n..].starts_with(b"-rc") {
        return None;
    }
    let v = std::str::from_utf8(&rest[..n]).ok()?;
    libcuda_version(&format!("libcuda.so.{v}")).map(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ino, write};
    use super::*;

    #[test]
    fn the_release_of_a_libcuda_from_its_name_else_its_content() {
        let d = tempfile::tempdir().unwrap();
        let named = d.path().join("libcuda.so.550.163.01");
        fs::write(&named, b"anything").unwrap();
        let version = |p: &Path| libcuda_file_version(p, fs::File::open(p).unwrap());
        assert_eq!(version(&named).as_deref(), Some("550.163.01"));
        // A copy named libcuda.so.1: the profiles path NVIDIA's library embeds.
        let copy = d.path().join("libcuda.so.1");
        fs::write(
            &copy,
            b"\x7fELF...nvidia-application-profiles-rc:/usr/share/nvidia/nvidia-application-profiles-535.261.03-rc:...",
        )
        .unwrap();
        assert_eq!(version(&copy).as_deref(), Some("535.261.03"));
        fs::write(&copy, b"nvidia-application-profiles-rc only").unwrap();
        assert_eq!(version(&copy), None);
    }

    /// The content is read a chunk at a time: a mark (or its release) across the end of a
    /// chunk is found, as is one in the last bytes of the file, after a mark without one.
    #[test]
    fn the_release_is_found_across_chunks() {
        let tail = b"nvidia-application-profiles-rc:/x/nvidia-application-profiles-590.48.01-rc";
        for before in [
            0,
            1,
            CHUNK - 40,
            CHUNK - 10,
            CHUNK,
            CHUNK + 5,
            3 * CHUNK - 33,
        ] {
            let mut bytes = vec![b'x'; before];
            bytes.extend_from_slice(tail);
            assert_eq!(
                content_version(&bytes[..]).as_deref(),
                Some("590.48.01"),
                "{before} bytes before"
            );
            // Handed over a few bytes at a time, as a pipe would.
            let slow = std::io::BufReader::with_capacity(7, &bytes[..]);
            let r = SmallReads(slow);
            assert_eq!(content_version(r).as_deref(), Some("590.48.01"));
            bytes.truncate(bytes.len() - 3);
            assert_eq!(content_version(&bytes[..]), None, "no -rc");
        }
    }

    /// A reader that hands out at most 7 bytes per read.
    struct SmallReads<R>(R);

    impl<R: std::io::BufRead> std::io::Read for SmallReads<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = {
                let have = self.0.fill_buf()?;
                let n = have.len().min(buf.len());
                buf[..n].copy_from_slice(&have[..n]);
                n
            };
            self.0.consume(n);
            Ok(n)
        }
    }
    use std::io::BufRead;
    use std::os::unix::fs::symlink;
    use std::process::{Command, Stdio};

    use crate::host::procfs::maps::tests::MAPS_FIXTURE;

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

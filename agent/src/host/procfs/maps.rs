//! The files a process has mapped: one parser for the lines of `/proc/<pid>/maps`
//! ([`parse_line`], [`parse`]) and one reader of that file, bounded to [`MAX_MAPS_BYTES`]
//! ([`scan`]). Used by libcuda discovery, the workload identification (is `libtorch`
//! loaded) and the doctor.

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Most bytes of one process's `maps` read. At the default `vm.max_map_count` (65530
/// mappings, about 100 bytes a line) a whole file is well below it.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;

/// Suffix the kernel appends to the path of a mapped file that was unlinked.
const DELETED: &[u8] = b" (deleted)";

/// One line of `maps` that names a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedFile {
    /// Start of the address range.
    pub start: u64,
    /// End of the address range (exclusive).
    pub end: u64,
    /// Path as the process's mount namespace names it (it may contain spaces), without the
    /// `" (deleted)"` suffix.
    pub path: PathBuf,
    /// Whether the file was unlinked since it was mapped (the line ended in `" (deleted)"`).
    pub deleted: bool,
}

/// Parses one `maps` line `start-end perms offset dev inode   path`: the path is
/// everything after the padding that follows the fifth field. `None` for lines without an
/// absolute path (anonymous memory, `[heap]`, `[stack]`, `[vdso]`, ...) or whose address
/// range is not `hex-hex`.
pub fn parse_line(line: &[u8]) -> Option<MappedFile> {
    let is_blank = |b: &u8| *b == b' ' || *b == b'\t';
    let skip_blanks =
        |s: &[u8]| -> usize { s.iter().position(|b| !is_blank(b)).unwrap_or(s.len()) };
    let mut rest = line;
    let mut range: &[u8] = &[];
    for i in 0..5 {
        rest = &rest[skip_blanks(rest)..];
        let n = rest.iter().position(is_blank).unwrap_or(rest.len());
        if i == 0 {
            range = &rest[..n];
        }
        rest = &rest[n..];
    }
    let path = &rest[skip_blanks(rest)..];
    if !path.starts_with(b"/") {
        return None;
    }
    let range = std::str::from_utf8(range).ok()?;
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let (path, deleted) = match path.strip_suffix(DELETED) {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MappedFile {
        start,
        end,
        path: PathBuf::from(OsStr::from_bytes(path)),
        deleted,
    })
}

/// The mapped files of `maps` contents (or of lines kept from it), in order.
pub fn parse(contents: &[u8]) -> impl Iterator<Item = MappedFile> + '_ {
    contents.split(|&b| b == b'\n').filter_map(parse_line)
}

/// Reads `<proc_root>/<pid>/maps`, at most [`MAX_MAPS_BYTES`] of it (a line cut short there
/// is left out), and hands each mapped file to `visit` in order until it breaks.
///
/// Errors: the file cannot be opened or read (process gone, no permission); `visit` has
/// seen the lines read before a read error.
pub fn scan(
    proc_root: &Path,
    pid: u32,
    mut visit: impl FnMut(MappedFile) -> ControlFlow<()>,
) -> Result<()> {
    let path = proc_root.join(pid.to_string()).join("maps");
    let file = fs::File::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut reader = BufReader::new(file.take(MAX_MAPS_BYTES));
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("reading {}", path.display()))?;
        let Some(complete) = line.strip_suffix(b"\n") else {
            // End of file, or a last line without its newline: cut at the cap when the
            // reader is exhausted by the limit, else the kernel's last line.
            if n > 0 && reader.get_ref().limit() > 0 {
                if let Some(m) = parse_line(&line) {
                    let _ = visit(m);
                }
            }
            return Ok(());
        };
        if let Some(m) = parse_line(complete) {
            if visit(m).is_break() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `maps` file: an executable, a library at a path with spaces (two mappings), a
    /// deleted one, anonymous memory, `[heap]`, a device node and `[stack]`.
    pub(crate) const MAPS_FIXTURE: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3.11
7f1c2a000000-7f1c2a200000 r--p 00000000 00:2a 1234    /opt/my libs/libcuda.so.590.48.01
7f1c2a200000-7f1c2b000000 r-xp 00200000 00:2a 1234    /opt/my libs/libcuda.so.590.48.01
7f1c2c000000-7f1c2c100000 r-xp 00000000 08:02 999     /usr/lib/x86_64-linux-gnu/libcudart.so.12.4.127
7f1c2d000000-7f1c2d100000 r-xp 00000000 08:02 1000    /usr/lib/x86_64-linux-gnu/libcuda.so.535.1 (deleted)
7f1c2e000000-7f1c2e100000 rw-p 00000000 00:00 0 
7f1c2f000000-7f1c2f100000 rw-p 00000000 00:00 0       [heap]
7f1c30000000-7f1c30001000 rw-s 00000000 00:05 77      /dev/nvidia-uvm
7ffd0000000-7ffd0021000 rw-p 00000000 00:00 0         [stack]
";

    #[test]
    fn maps_lines() {
        let parsed: Vec<MappedFile> = parse(MAPS_FIXTURE.as_bytes()).collect();
        assert_eq!(parsed.len(), 6, "{parsed:#?}");
        assert_eq!(parsed[0].start, 0x400000);
        assert!(parsed.iter().any(|m| m.deleted && m.end == 0x7f1c2d100000));
        assert_eq!(
            parsed[1],
            MappedFile {
                start: 0x7f1c2a000000,
                end: 0x7f1c2a200000,
                path: PathBuf::from("/opt/my libs/libcuda.so.590.48.01"),
                deleted: false,
            }
        );
        assert_eq!(
            parsed[4].path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.535.1")
        );
        assert_eq!(parsed[5].path, PathBuf::from("/dev/nvidia-uvm"));
        // Tabs, a path that is not UTF-8, a broken range, too few fields.
        let m = parse_line(b"10-20\tr--p\t0\t0:0\t1\t/x/\xffy").unwrap();
        assert_eq!((m.start, m.end), (0x10, 0x20));
        assert_eq!(m.path.as_os_str().as_bytes(), b"/x/\xffy");
        assert_eq!(parse_line(b"10_20 r--p 0 0:0 1 /x"), None);
        assert_eq!(parse_line(b"10-zz r--p 0 0:0 1 /x"), None);
        assert_eq!(parse_line(b"10-20 r--p 0 /x"), None);
        assert_eq!(parse_line(b""), None);
    }

    #[test]
    fn scan_reads_in_order_stops_early_and_reports_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("55")).unwrap();
        // No newline after the last line: still read.
        fs::write(
            dir.path().join("55/maps"),
            MAPS_FIXTURE.trim_end().replace("[stack]", "/last"),
        )
        .unwrap();
        let mut all = Vec::new();
        scan(dir.path(), 55, |m| {
            all.push(m.path);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(all.len(), 7, "{all:?}");
        assert_eq!(all[6], PathBuf::from("/last"));
        let mut first = Vec::new();
        scan(dir.path(), 55, |m| {
            first.push(m.start);
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(first, [0x400000]);
        assert!(scan(dir.path(), 56, |_| ControlFlow::Continue(())).is_err());
    }

    #[test]
    fn scan_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("7")).unwrap();
        let line = "7f00-7f01 r--p 00000000 00:2a 1 /usr/lib/libfoo.so.1\n";
        let lines = MAX_MAPS_BYTES as usize / line.len() + 2;
        fs::write(dir.path().join("7/maps"), line.repeat(lines)).unwrap();
        let mut n = 0usize;
        let mut cut = false;
        scan(dir.path(), 7, |m| {
            n += 1;
            cut |= m.path != Path::new("/usr/lib/libfoo.so.1");
            ControlFlow::Continue(())
        })
        .unwrap();
        // Only whole lines within the cap; the one cut there is left out.
        assert_eq!(n, MAX_MAPS_BYTES as usize / line.len());
        assert!(!cut);
    }

    #[test]
    fn scan_this_process() {
        let exe = fs::read_link("/proc/self/exe").unwrap();
        let mut found = false;
        scan(Path::new("/proc"), std::process::id(), |m| {
            found |= m.path == exe;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert!(found, "{}", exe.display());
    }
}

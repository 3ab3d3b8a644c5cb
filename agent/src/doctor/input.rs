//! Bounded reading of every input of the doctor, and quoting of what it read.
//!
//! Every fact the doctor reads, live or from a snapshot (a `/proc` or `/sys` file, a
//! captured command's output, the kernel log, a snapshot's own `manifest.json`,
//! `dev/nodes.json`, `observations.json`), is read through [`read_file_limited`] or
//! [`read_stream_limited`] with the [`ReadLimit`] of its kind ([`limit_for`] for the files
//! of the diagnosed machine). A read past its limit either fails with [`TooLarge`] (the fact
//! is reported as `too large (N bytes, limit L)`) or keeps only the newest bytes (the kernel
//! log), as its [`Overflow`] says. The limits are in `docs/doctor.md` ("Input limits").
//!
//! Every value of an input shown in a report or an error message goes through [`quote`]
//! (quoted) or [`clip`] (unquoted): at most [`QUOTE_MAX_CHARS`] characters, control
//! characters and bytes that are not UTF-8 escaped, never raw bytes to a terminal.

use std::fmt;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// What a read does past its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// The read fails with [`TooLarge`]: the fact is reported as too large.
    Refuse,
    /// Only the newest `bytes` are kept, from the first line that starts within them; the
    /// number of bytes dropped is returned ([`LimitedRead::dropped`]).
    KeepNewest,
}

/// How much of one input is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    /// Most bytes kept.
    pub bytes: u64,
    /// What happens past it.
    pub overflow: Overflow,
}

/// A file of `/proc`, `/sys` or `/etc` read for a fact (`/proc/driver/nvidia/version`,
/// `/proc/modules`, `/proc/devices`, cgroup files, module parameters, `/proc/iomem`, ...):
/// 1 MiB, refused past it. The real ones are a few KiB (`/proc/iomem` of a large server
/// some 100 KiB).
pub const FACT_FILE_LIMIT: ReadLimit = ReadLimit {
    bytes: MIB,
    overflow: Overflow::Refuse,
};

/// `/proc/<pid>/maps`: 64 MiB, refused past it (65530 mappings, the default
/// `vm.max_map_count`, are about 10 MiB).
pub const PROCESS_MAPS_LIMIT: ReadLimit = ReadLimit {
    bytes: 64 * MIB,
    overflow: Overflow::Refuse,
};

/// `/boot/config-<release>`, and `/proc/config.gz` once decompressed: 16 MiB, refused past
/// it (real ones are about 300 KiB).
pub const KERNEL_CONFIG_LIMIT: ReadLimit = ReadLimit {
    bytes: 16 * MIB,
    overflow: Overflow::Refuse,
};

/// A command's output (`nvidia-smi -q`, live or `commands/<name>.txt` of a snapshot):
/// 8 MiB, refused past it (about 15 KiB a GPU).
pub const COMMAND_OUTPUT_LIMIT: ReadLimit = ReadLimit {
    bytes: 8 * MIB,
    overflow: Overflow::Refuse,
};

/// The kernel log (`/dev/kmsg`, `dmesg`, a snapshot's `commands/dmesg.txt`): the newest
/// 16 MiB are kept (ring buffers are 128 KiB to a few MiB; 16 MiB is `log_buf_len=16M`).
pub const KERNEL_LOG_LIMIT: ReadLimit = ReadLimit {
    bytes: 16 * MIB,
    overflow: Overflow::KeepNewest,
};

/// A snapshot's `manifest.json` and `dev/nodes.json`: 16 MiB, refused past it (uvmwatch
/// writes a few KiB).
pub const SNAPSHOT_METADATA_LIMIT: ReadLimit = ReadLimit {
    bytes: 16 * MIB,
    overflow: Overflow::Refuse,
};

/// A snapshot's `observations.json`: 1 MiB, refused past it (uvmwatch writes a few KiB).
pub const OBSERVATIONS_LIMIT: ReadLimit = ReadLimit {
    bytes: MIB,
    overflow: Overflow::Refuse,
};

/// The limit of the file at `path` of the diagnosed machine (live or in a snapshot):
/// [`PROCESS_MAPS_LIMIT`] for `/proc/<pid>/maps`, [`KERNEL_CONFIG_LIMIT`] for
/// `/boot/config-*`, else [`FACT_FILE_LIMIT`].
pub fn limit_for(path: &str) -> ReadLimit {
    if path.starts_with("/proc/") && path.ends_with("/maps") {
        PROCESS_MAPS_LIMIT
    } else if path.starts_with("/boot/config-") {
        KERNEL_CONFIG_LIMIT
    } else {
        FACT_FILE_LIMIT
    }
}

/// An input past its [`Overflow::Refuse`] limit. Carried inside an [`io::Error`] of kind
/// `FileTooLarge` ([`too_large`]); its text is the report's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// Its size when known (a regular file), else `None` (a `/proc` file or a pipe that
    /// went on past the limit).
    pub size: Option<u64>,
    /// The limit.
    pub limit: u64,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.size {
            Some(size) => write!(f, "too large ({size} bytes, limit {})", self.limit),
            None => write!(f, "too large (over {} bytes, the limit)", self.limit),
        }
    }
}

impl std::error::Error for TooLarge {}

/// A snapshot file that is there but cannot be used (not JSON, wrong types, too large).
/// Carried inside an [`io::Error`] of kind `InvalidData` ([`malformed`]) by the snapshot
/// reads that depend on the file, so that each fact read through it says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// The file, relative to the snapshot (`dev/nodes.json`).
    pub file: String,
    /// What is wrong with it.
    pub why: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed: the snapshot's {}: {}", self.file, self.why)
    }
}

impl std::error::Error for Malformed {}

/// [`TooLarge`] as an [`io::Error`].
pub fn too_large(size: Option<u64>, limit: u64) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, TooLarge { size, limit })
}

/// [`Malformed`] as an [`io::Error`].
pub fn malformed(file: &str, why: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        Malformed {
            file: file.to_string(),
            why: why.into(),
        },
    )
}

/// The report's verdict for an error of this module ([`TooLarge`], [`Malformed`]): its
/// text, which starts with `too large` or `malformed:`; `None` for any other error.
pub fn verdict(err: &io::Error) -> Option<String> {
    let inner = err.get_ref()?;
    if inner.is::<TooLarge>() || inner.is::<Malformed>() {
        Some(inner.to_string())
    } else {
        None
    }
}

/// What a limited read kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitedRead {
    /// The bytes kept.
    pub bytes: Vec<u8>,
    /// Bytes of the input left out at its start ([`Overflow::KeepNewest`]); 0 when whole.
    pub dropped: u64,
}

/// Reads the file at `path` up to `limit`. A regular file larger than the limit is not
/// read at all ([`Overflow::Refuse`]) or only its newest part is ([`Overflow::KeepNewest`]);
/// a file whose size is not known in advance (`/proc`, `/sys`) is read until the limit.
///
/// Errors: as `open(2)`/`read(2)`, or [`TooLarge`] for [`Overflow::Refuse`].
pub fn read_file_limited(path: &Path, limit: ReadLimit) -> io::Result<LimitedRead> {
    let mut file = fs::File::open(path)?;
    let size = file.metadata()?.len();
    if size > limit.bytes {
        match limit.overflow {
            Overflow::Refuse => return Err(too_large(Some(size), limit.bytes)),
            Overflow::KeepNewest => {
                file.seek(SeekFrom::Start(size - limit.bytes))?;
                let mut read = read_stream_limited(file, limit)?;
                let skipped = drop_partial_line(&mut read.bytes);
                read.dropped += size - limit.bytes + skipped;
                return Ok(read);
            }
        }
    }
    read_stream_limited(file, limit)
}

/// Reads `reader` to its end keeping at most `limit.bytes`: past it, [`Overflow::Refuse`]
/// reads the rest without keeping it (a pipe's writer is not left blocked) and fails;
/// [`Overflow::KeepNewest`] keeps the newest bytes, from the first line that starts within
/// them.
///
/// Errors: as `read(2)`, or [`TooLarge`] for [`Overflow::Refuse`].
pub fn read_stream_limited(mut reader: impl Read, limit: ReadLimit) -> io::Result<LimitedRead> {
    let cap = usize::try_from(limit.bytes).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    (&mut reader)
        .take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() <= cap {
        return Ok(LimitedRead { bytes, dropped: 0 });
    }
    match limit.overflow {
        Overflow::Refuse => {
            io::copy(&mut reader, &mut io::sink())?;
            Err(too_large(None, limit.bytes))
        }
        Overflow::KeepNewest => {
            // Keep a window of at most twice the limit, compacted to the newest `cap`.
            let mut dropped = 0u64;
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = match reader.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) => return Err(err),
                };
                bytes.extend_from_slice(&chunk[..n]);
                if bytes.len() >= 2 * cap {
                    let excess = bytes.len() - cap;
                    bytes.drain(..excess);
                    dropped += excess as u64;
                }
            }
            let excess = bytes.len().saturating_sub(cap);
            bytes.drain(..excess);
            dropped += excess as u64;
            dropped += drop_partial_line(&mut bytes);
            Ok(LimitedRead { bytes, dropped })
        }
    }
}

/// Drops the bytes before the first line start (a line cut by the limit); returns how
/// many. Text without any newline is kept as it is.
fn drop_partial_line(bytes: &mut Vec<u8>) -> u64 {
    match bytes.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            bytes.drain(..=nl);
            (nl + 1) as u64
        }
        None => 0,
    }
}

/// Bytes as text: kept as they are when UTF-8 (no copy), else with each invalid sequence
/// replaced by U+FFFD.
pub fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

pub use crate::decode::text::{clip, quote, QUOTE_MAX_CHARS};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_cuts_and_counts() {
        assert_eq!(quote("NVRM version: x"), "\"NVRM version: x\"");
        assert_eq!(
            quote(b"a\x1b[31m\"b\\\n\xff\xfe'z"),
            "\"a\\u{1b}[31m\\\"b\\\\\\n\\xff\\xfe'z\""
        );
        let long = "x".repeat(10_000);
        let q = quote(&long);
        assert_eq!(q, format!("\"{}…\" (10000 bytes)", "x".repeat(200)));
        // Only the shown prefix is looked at: a huge value costs nothing.
        let huge = vec![0u8; 64 << 20];
        let q = quote(&huge);
        assert!(q.ends_with("…\" (67108864 bytes)"), "{q}");
        assert!(q.len() < 1200, "{}", q.len());
        // Multi-byte characters are kept, never cut in the middle.
        assert_eq!(clip("ééé", 2), "éé… (6 bytes)");
        assert_eq!(clip("plain value", 200), "plain value");
        assert_eq!(
            clip("RegistryDwords: \"\" \\ \x07", 200),
            "RegistryDwords: \"\" \\ \\u{7}"
        );
        // Nothing of the output is a control character.
        let binary: Vec<u8> = (0..=255u8).collect();
        assert!(!clip(&binary, 1000).chars().any(|c| c.is_control()));
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn files_past_their_limit_are_refused_or_keep_their_newest_lines() {
        let dir = tempfile::tempdir().unwrap();
        let small = ReadLimit {
            bytes: 10,
            overflow: Overflow::Refuse,
        };
        let p = write(dir.path(), "ok", b"0123456789");
        assert_eq!(
            read_file_limited(&p, small).unwrap(),
            LimitedRead {
                bytes: b"0123456789".to_vec(),
                dropped: 0
            }
        );
        let p = write(dir.path(), "big", b"0123456789a");
        let err = read_file_limited(&p, small).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            verdict(&err).as_deref(),
            Some("too large (11 bytes, limit 10)")
        );
        // A sparse 1 GiB file is refused from its size, without reading it.
        let sparse = dir.path().join("sparse");
        fs::File::create(&sparse).unwrap().set_len(1 << 30).unwrap();
        let err = read_file_limited(&sparse, FACT_FILE_LIMIT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "too large (1073741824 bytes, limit 1048576)"
        );

        let newest = ReadLimit {
            bytes: 10,
            overflow: Overflow::KeepNewest,
        };
        let p = write(dir.path(), "log", b"line one\nline two\nend\n");
        let read = read_file_limited(&p, newest).unwrap();
        // The newest 10 bytes are "e two\nend\n": the cut line goes too.
        assert_eq!(read.bytes, b"end\n");
        assert_eq!(read.dropped, 18);
        // The same from a stream whose size is not known.
        let read = read_stream_limited(&b"line one\nline two\nend\n"[..], newest).unwrap();
        assert_eq!((read.bytes.as_slice(), read.dropped), (&b"end\n"[..], 18));
        let err = read_stream_limited(&[b'x'; 100][..], small).unwrap_err();
        assert_eq!(
            verdict(&err).as_deref(),
            Some("too large (over 10 bytes, the limit)")
        );
        // A stream much longer than its window keeps only its newest part.
        let long: Vec<u8> = (0..1000u32)
            .flat_map(|i| format!("{i:04}\n").into_bytes())
            .collect();
        let read = read_stream_limited(
            &long[..],
            ReadLimit {
                bytes: 12,
                overflow: Overflow::KeepNewest,
            },
        )
        .unwrap();
        assert_eq!(read.bytes, b"0998\n0999\n");
        assert_eq!(read.dropped as usize, long.len() - 10);

        // Other errors are not verdicts of this module.
        let err = read_file_limited(&dir.path().join("missing"), small).unwrap_err();
        assert_eq!(verdict(&err), None);
        let err = malformed("dev/nodes.json", "not valid JSON");
        assert_eq!(
            verdict(&err).as_deref(),
            Some("malformed: the snapshot's dev/nodes.json: not valid JSON")
        );
    }

    #[test]
    fn limits_by_path() {
        assert_eq!(limit_for("/proc/driver/nvidia/version"), FACT_FILE_LIMIT);
        assert_eq!(limit_for("/proc/77/maps"), PROCESS_MAPS_LIMIT);
        assert_eq!(
            limit_for("/boot/config-6.8.0-45-generic"),
            KERNEL_CONFIG_LIMIT
        );
        assert_eq!(into_text(b"ok".to_vec()), "ok");
        assert_eq!(into_text(b"o\xffk".to_vec()), "o\u{fffd}k");
    }
}

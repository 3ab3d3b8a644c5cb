//! Bounded reads: every file of the host and every captured output is read through
//! [`read_file_limited`] or [`read_stream_limited`] with a [`ReadLimit`] that says how much
//! is kept and what happens past it ([`Overflow`]: refused with [`TooLarge`], the newest
//! lines kept, or the first bytes kept). Nothing is read without a bound.

use std::fmt;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// What a read does past its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// The read fails with [`TooLarge`]: the fact is reported as too large.
    Refuse,
    /// Only the newest `bytes` are kept, from the first line that starts within them; the
    /// number of bytes dropped is returned ([`LimitedRead::dropped`]).
    KeepNewest,
    /// Only the first `bytes` are kept and the rest is not read ([`LimitedRead::cut`]): for
    /// files of which the start is enough and whose end may be anywhere (a process's
    /// `cmdline` or `environ`, a file inside a container's root).
    KeepFirst,
}

/// How much of one input is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    /// Most bytes kept.
    pub bytes: u64,
    /// What happens past it.
    pub overflow: Overflow,
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

/// [`TooLarge`] as an [`io::Error`].
pub fn too_large(size: Option<u64>, limit: u64) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, TooLarge { size, limit })
}

/// What a limited read kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitedRead {
    /// The bytes kept.
    pub bytes: Vec<u8>,
    /// Bytes of the input left out at its start ([`Overflow::KeepNewest`]); 0 when whole.
    pub dropped: u64,
    /// Whether more followed the bytes kept ([`Overflow::KeepFirst`]; it is not read, so
    /// not counted).
    pub cut: bool,
}

/// Reads the file at `path` up to `limit`. A regular file larger than the limit is not
/// read at all ([`Overflow::Refuse`]), or only its newest part is ([`Overflow::KeepNewest`])
/// or its first ([`Overflow::KeepFirst`]); a file whose size is not known in advance
/// (`/proc`, `/sys`) is read until the limit.
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
            Overflow::KeepFirst => {}
        }
    }
    read_stream_limited(file, limit)
}

/// Reads `reader` to its end keeping at most `limit.bytes`: past it, [`Overflow::Refuse`]
/// reads the rest without keeping it (a pipe's writer is not left blocked) and fails;
/// [`Overflow::KeepNewest`] keeps the newest bytes, from the first line that starts within
/// them; [`Overflow::KeepFirst`] stops there.
///
/// Errors: as `read(2)`, or [`TooLarge`] for [`Overflow::Refuse`].
pub fn read_stream_limited(mut reader: impl Read, limit: ReadLimit) -> io::Result<LimitedRead> {
    let cap = usize::try_from(limit.bytes).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    (&mut reader)
        .take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() <= cap {
        return Ok(LimitedRead {
            bytes,
            ..LimitedRead::default()
        });
    }
    match limit.overflow {
        Overflow::KeepFirst => {
            bytes.truncate(cap);
            Ok(LimitedRead {
                bytes,
                dropped: 0,
                cut: true,
            })
        }
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
            Ok(LimitedRead {
                bytes,
                dropped,
                cut: false,
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    /// The text of a [`TooLarge`] inside `err`, if it is one.
    fn shown(err: &io::Error) -> Option<String> {
        err.get_ref()
            .filter(|e| e.is::<TooLarge>())
            .map(|e| e.to_string())
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
                ..LimitedRead::default()
            }
        );
        let p = write(dir.path(), "big", b"0123456789a");
        let err = read_file_limited(&p, small).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            shown(&err).as_deref(),
            Some("too large (11 bytes, limit 10)")
        );
        // A sparse 1 GiB file is refused from its size, without reading it.
        let sparse = dir.path().join("sparse");
        fs::File::create(&sparse).unwrap().set_len(1 << 30).unwrap();
        let err = read_file_limited(
            &sparse,
            ReadLimit {
                bytes: 1 << 20,
                overflow: Overflow::Refuse,
            },
        )
        .unwrap_err();
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
            shown(&err).as_deref(),
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
        assert_eq!(shown(&err), None);

        // The first bytes, the rest unread.
        let first = ReadLimit {
            bytes: 4,
            overflow: Overflow::KeepFirst,
        };
        let read = read_file_limited(&p, first).unwrap();
        assert_eq!((read.bytes.as_slice(), read.cut), (&b"line"[..], true));
        let read = read_stream_limited(&b"abcd"[..], first).unwrap();
        assert_eq!((read.bytes.as_slice(), read.cut), (&b"abcd"[..], false));
        let read = read_stream_limited(std::io::repeat(b'x'), first).unwrap();
        assert_eq!((read.bytes.len(), read.cut), (4, true));
    }
}

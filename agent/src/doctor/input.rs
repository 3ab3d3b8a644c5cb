//! Bounded reading of every input of the doctor, and quoting of what it read.
//!
//! Every fact the doctor reads, live or from a snapshot (a `/proc` or `/sys` file, a
//! captured command's output, the kernel log, a snapshot's own `manifest.json`,
//! `dev/nodes.json`, `observations.json`), is read through [`read_file_limited`] or
//! [`read_stream_limited`] (the host's one bounded reader, [`crate::host::files`]) with
//! the [`ReadLimit`] of its kind ([`limit_for`] for the files
//! of the diagnosed machine). A read past its limit either fails with [`TooLarge`] (the fact
//! is reported as `too large (N bytes, limit L)`) or keeps only the newest bytes (the kernel
//! log), as its [`Overflow`] says. The limits are in `docs/doctor.md` ("Input limits").
//!
//! Every value of an input shown in a report or an error message goes through [`quote`]
//! (quoted) or [`clip`] (unquoted): at most [`QUOTE_MAX_CHARS`] characters, control
//! characters and bytes that are not UTF-8 escaped, never raw bytes to a terminal.

use std::fmt;
use std::io;

pub use crate::host::files::{
    read_file_limited, read_stream_limited, too_large, LimitedRead, Overflow, ReadLimit, TooLarge,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

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

//! Reading the live kernel log from `/dev/kmsg`, printed as `dmesg` prints it.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::doctor::input::{into_text, read_stream_limited, KERNEL_LOG_LIMIT};

/// Largest `/dev/kmsg` record (the kernel's `CONSOLE_EXT_LOG_MAX` is 8 KiB).
const KMSG_RECORD_MAX: usize = 16 * 1024;

/// Reads every record left in the kernel log device at `path` (`/dev/kmsg` of the live
/// machine, below its host root) without blocking (`EAGAIN` ends the read; `EPIPE`,
/// a record overwritten while reading, is skipped), keeping the newest
/// [`KERNEL_LOG_LIMIT`] of text. Returns the text and the bytes of older text left out.
/// Format: `Documentation/ABI/testing/dev-kmsg` of the kernel.
pub(super) fn read_kmsg(path: &Path) -> io::Result<(String, u64)> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let read = read_stream_limited(
        KmsgText {
            file,
            record: vec![0u8; KMSG_RECORD_MAX],
            pending: Vec::new(),
            at: 0,
            records: 0,
        },
        KERNEL_LOG_LIMIT,
    )?;
    Ok((into_text(read.bytes), read.dropped))
}

/// The records of `/dev/kmsg` as a stream of `dmesg` lines ([`format_kmsg_record`]); ends
/// when no record is left.
struct KmsgText {
    file: fs::File,
    record: Vec<u8>,
    /// The formatted line being handed out, from `at`.
    pending: Vec<u8>,
    at: usize,
    records: usize,
}

impl Read for KmsgText {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.pending.len() {
            match self.file.read(&mut self.record) {
                Ok(0) => return Ok(0),
                Ok(n) => {
                    self.records += 1;
                    if let Some(line) = format_kmsg_record(&self.record[..n]) {
                        self.pending = line.into_bytes();
                        self.pending.push(b'\n');
                        self.at = 0;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) if err.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(err) if self.records == 0 => return Err(err),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// One `/dev/kmsg` record (`prio,seq,usec,flags[,...];message\n` followed by optional
/// ` KEY=value` continuation lines) as `dmesg` prints it: `[seconds.micros] message`, the
/// seconds right-aligned in 5 columns. `None` when the record has no `;`.
pub fn format_kmsg_record(record: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(record);
    let (header, rest) = text.split_once(';')?;
    let message = rest.split('\n').next().unwrap_or("");
    let usec: u64 = header.split(',').nth(2)?.trim().parse().ok()?;
    Some(format!(
        "[{:>5}.{:06}] {}",
        usec / 1_000_000,
        usec % 1_000_000,
        message
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_record_format() {
        assert_eq!(
            format_kmsg_record(b"6,1234,5004121,-;nvidia-uvm: Loaded the UVM driver, major device number 508.\n SUBSYSTEM=x\n")
                .unwrap(),
            "[    5.004121] nvidia-uvm: Loaded the UVM driver, major device number 508."
        );
        assert_eq!(
            format_kmsg_record(b"4,99,123456789012,c,caller=T1;WARNING: CPU: 1\n").unwrap(),
            "[123456.789012] WARNING: CPU: 1"
        );
        assert_eq!(format_kmsg_record(b"garbage"), None);
    }
}

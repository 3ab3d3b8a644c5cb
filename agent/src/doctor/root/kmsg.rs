//! Reading the live kernel log from `/dev/kmsg`, printed as `dmesg` prints it.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Largest `/dev/kmsg` record (the kernel's `CONSOLE_EXT_LOG_MAX` is 8 KiB).
const KMSG_RECORD_MAX: usize = 16 * 1024;
/// Most bytes of kernel log kept (the ring buffer is at most 32 MiB; guards a flood).
const KMSG_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Reads every record left in the kernel log device at `path` (`/dev/kmsg` of the live
/// machine, below its host root) without blocking (`EAGAIN` ends the read; `EPIPE`,
/// a record overwritten while reading, is skipped). Format: `Documentation/ABI/testing/
/// dev-kmsg` of the kernel.
pub(super) fn read_kmsg(path: &Path) -> io::Result<String> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut buf = vec![0u8; KMSG_RECORD_MAX];
    let mut out = String::new();
    let mut records = 0usize;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                records += 1;
                if let Some(line) = format_kmsg_record(&buf[..n]) {
                    out.push_str(&line);
                    out.push('\n');
                }
                if out.len() > KMSG_MAX_BYTES {
                    break;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) if err.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(err) if records == 0 => return Err(err),
            Err(_) => break,
        }
    }
    Ok(out)
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

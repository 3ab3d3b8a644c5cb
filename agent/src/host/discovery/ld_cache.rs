//! glibc's dynamic-linker cache (`/etc/ld.so.cache`): the parser, and the libcuda entries
//! of this machine's ABI that [`super::Discovery::from_host`] starts from.

use anyhow::{anyhow, bail, Context, Result};

use super::is_libcuda_name;

const OLD_CACHE_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// `struct cache_file` (old format): `magic[11]`, pad, `u32 nlibs`.
const OLD_HEADER_LEN: usize = 16;
/// `struct file_entry` (old format): `i32 flags; u32 key, value`.
const OLD_ENTRY_LEN: usize = 12;
/// `struct cache_file_new`: `magic+version[20]`, `u32 nlibs`, `u32 len_strings`, `u8 flags`,
/// `pad[3]`, `u32 extension_offset`, `u32 unused[3]`.
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

/// Paths of the entries for this machine's own ABI whose soname or path is a libcuda name
/// ([`is_libcuda_name`]), in file order.
///
/// Errors: as [`parse_ld_so_cache`].
pub(super) fn native_libcuda_paths(bytes: &[u8]) -> Result<Vec<String>> {
    Ok(parse_cache_entries(bytes)?
        .into_iter()
        .filter(|e| NATIVE_ENTRY_FLAGS.is_none_or(|f| e.flags & 0xffff == f))
        .filter(|e| is_libcuda_name(&e.soname) || is_libcuda_name(&e.path))
        .map(|e| e.path)
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::fs;
    use std::process::Command;

    pub(in crate::host::discovery) const X86_64_LIBC6: i32 = 0x0303;
    pub(in crate::host::discovery) const I386_LIBC6: i32 = 0x0003;

    /// A glibc cache in the new format, optionally behind an old-format section (the
    /// compat layout). Entries are `(flags, soname, path)`.
    pub(in crate::host::discovery) fn build_cache(
        entries: &[(i32, &str, &str)],
        compat: bool,
    ) -> Vec<u8> {
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
}

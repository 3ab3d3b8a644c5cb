//! The download and build cache that outlives a clone: `UVMWATCH_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/uvmwatch`, else `$HOME/.cache/uvmwatch`. Under `vmtest/` it holds every
//! downloaded `.deb` (`debs/`), the private apt configuration and lists (`apt/`) and the
//! NVIDIA module builds (`nvidia/<key>/`). Whatever is written there is written beside its
//! final place first and renamed when complete, so a run that stops half-way never leaves
//! something a later run takes as done.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The cache directory from these environment values (pure, for tests): the first set and
/// non-empty of `UVMWATCH_CACHE_DIR`, `XDG_CACHE_HOME` (+ `uvmwatch`), `HOME` (+
/// `.cache/uvmwatch`); `None` when none is set.
pub(super) fn cache_dir_from(
    uvmwatch: Option<&str>,
    xdg: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let set = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    set(uvmwatch)
        .or_else(|| set(xdg).map(|x| x.join("uvmwatch")))
        .or_else(|| set(home).map(|h| h.join(".cache/uvmwatch")))
}

/// The cache directory of this process's environment (see [`cache_dir_from`]); `/root`'s
/// when even `HOME` is unset.
pub(super) fn cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var(k).ok();
    cache_dir_from(
        var("UVMWATCH_CACHE_DIR").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
    .unwrap_or_else(|| PathBuf::from("/root/.cache/uvmwatch"))
}

/// 64-bit FNV-1a over `parts`, each followed by a 0 byte (so `["ab", "c"]` and `["a",
/// "bc"]` differ). Stable across Rust releases, unlike `DefaultHasher`; a cache key, not a
/// security check.
pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// A name safe as one path component: `/` and whitespace become `_`.
pub(super) fn component(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A fresh temporary directory beside `fin` (`<fin>.tmp-<pid>`), emptied if a process of
/// the same pid left one.
pub(super) fn temp_beside(fin: &Path) -> Result<PathBuf> {
    let name = fin
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let tmp = fin.with_file_name(format!("{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    Ok(tmp)
}

/// Renames the complete `tmp` to `fin`. When another run finished the same `fin` first,
/// its copy is kept and `tmp` removed (both are the same build).
pub(super) fn publish(tmp: &Path, fin: &Path) -> Result<()> {
    match fs::rename(tmp, fin) {
        Ok(()) => Ok(()),
        Err(_) if fin.is_dir() => {
            let _ = fs::remove_dir_all(tmp);
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("rename {} to {}", tmp.display(), fin.display())),
    }
}

/// Removes `<name>.tmp-<pid>` entries of `dir` whose process is gone (left by a run that
/// was killed).
pub(super) fn remove_stale_temps(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().to_string();
        let Some(pid) = n
            .rsplit_once(".tmp-")
            .and_then(|(_, p)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let p = e.path();
            let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        }
    }
}

/// Moves the `.deb`s of the old per-clone cache (`target/vmtest/debs/`) into `debs` and
/// removes the old directory, so they are not downloaded again.
pub(super) fn migrate_debs(old: &Path, debs: &Path) -> Result<()> {
    let Ok(rd) = fs::read_dir(old) else {
        return Ok(());
    };
    let mut moved = 0;
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        let n = e.file_name();
        if !n.to_string_lossy().ends_with(".deb") {
            continue;
        }
        let dst = debs.join(&n);
        if !dst.exists() {
            let tmp = debs.join(format!(
                "{}.tmp-{}",
                n.to_string_lossy(),
                std::process::id()
            ));
            if fs::rename(&p, &dst).is_err() {
                fs::copy(&p, &tmp).with_context(|| format!("copy {}", p.display()))?;
                fs::rename(&tmp, &dst)?;
            }
            moved += 1;
        }
    }
    fs::remove_dir_all(old).with_context(|| format!("remove {}", old.display()))?;
    println!(
        "vm-test: moved {moved} .deb(s) from {} to the cache {}",
        old.display(),
        debs.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_order() {
        assert_eq!(
            cache_dir_from(Some("/c"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_dir_from(Some(""), Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/uvmwatch"))
        );
        assert_eq!(
            cache_dir_from(None, None, Some("/root")),
            Some(PathBuf::from("/root/.cache/uvmwatch"))
        );
        assert_eq!(cache_dir_from(None, Some(""), None), None);
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        // The FNV-1a 64 reference value of the empty input, then one 0 byte.
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b""]), 0xaf63_bd4c_8601_b7df);
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x", b"y"]), fnv1a(&[b"x", b"y"]));
    }

    #[test]
    fn temp_then_publish() {
        let d = tempfile::tempdir().unwrap();
        let fin = d.path().join("k");
        let tmp = temp_beside(&fin).unwrap();
        fs::write(tmp.join("f"), "1").unwrap();
        publish(&tmp, &fin).unwrap();
        assert_eq!(fs::read_to_string(fin.join("f")).unwrap(), "1");
        // A second, concurrent build of the same key: the first one stays.
        let tmp = temp_beside(&fin).unwrap();
        fs::write(tmp.join("f"), "2").unwrap();
        publish(&tmp, &fin).unwrap();
        assert_eq!(fs::read_to_string(fin.join("f")).unwrap(), "1");
        assert!(!tmp.exists());
        // A dead process's temp dir is removed, others are kept.
        let stale = d.path().join("k2.tmp-999999999");
        fs::create_dir(&stale).unwrap();
        remove_stale_temps(d.path());
        assert!(!stale.exists());
        assert!(fin.exists());
    }

    #[test]
    fn components() {
        assert_eq!(component("6.12.117+deb12-amd64"), "6.12.117+deb12-amd64");
        assert_eq!(component("a/b c"), "a_b_c");
    }
}

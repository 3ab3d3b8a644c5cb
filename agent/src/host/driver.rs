//! The NVIDIA driver as it reports itself: the first line of `/proc/driver/nvidia/version`
//! (written by the nvidia module, `kernel-open/nvidia/nv-procfs.c`). The doctor keeps it as a
//! fact; the observer reads it to choose the ioctl layouts of the running driver
//! (`decode::layouts`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::decode::layouts::{DriverVersion, ParseVersionError};
use crate::decode::text::quote;

/// Where the nvidia module says its version.
pub const VERSION_PATH: &str = "/proc/driver/nvidia/version";

/// The longest version file read: the real one is two lines of about 150 bytes.
const MAX_VERSION_FILE: u64 = 4096;

/// `/proc/driver/nvidia/version`, first line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// e.g. `590.48.01`.
    pub version: String,
    /// true for "NVIDIA UNIX Open Kernel Module", false for the proprietary module.
    pub open_module: bool,
    /// The CPU architecture the module was built for, as the line names it (`x86_64`,
    /// `aarch64`, `ppc64le`): `Open Kernel Module for <arch>` or `NVIDIA UNIX <arch>
    /// Kernel Module` (`nv-procfs.c`); `None` when the line names none.
    #[serde(default)]
    pub arch: Option<String>,
    /// The line as read.
    pub line: String,
}

impl DriverInfo {
    /// The version as a number ([`DriverVersion`]).
    ///
    /// # Errors
    /// The version word is not `MAJOR.MINOR[.PATCH]`.
    pub fn driver_version(&self) -> Result<DriverVersion, ParseVersionError> {
        self.version.parse()
    }
}

/// Parses the first line of `/proc/driver/nvidia/version`:
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (...)`
/// (open module) or `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  <date>`
/// (proprietary). The version is the first word made of digits and dots with at least one
/// dot.
///
/// Errors: the first line does not start with `NVRM version:` or has no version.
pub fn parse_driver_version(text: &str) -> Result<DriverInfo, String> {
    let line = text.lines().next().unwrap_or("").trim_end();
    if !line.starts_with("NVRM version:") {
        return Err(format!(
            "first line is not `NVRM version: ...`: {}",
            quote(line)
        ));
    }
    let version = line
        .split_whitespace()
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && !w.ends_with('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .ok_or_else(|| format!("no version number in {}", quote(line)))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let arch = words
        .windows(2)
        .find_map(|w| match w {
            ["for", a] if line.contains("Open Kernel Module") => Some(*a),
            ["UNIX", a] if *a != "Open" => Some(*a),
            _ => None,
        })
        .map(str::to_string);
    Ok(DriverInfo {
        version: version.to_string(),
        open_module: line.contains("Open Kernel Module"),
        arch,
        line: line.to_string(),
    })
}

/// Reads and parses [`VERSION_PATH`] below `host_root` (the host's `/` when the agent runs
/// in a container), at most 4 KiB of it.
///
/// # Errors
/// Absent (the nvidia module is not loaded), unreadable, or not a version line: the message
/// says which, with the path.
pub fn read_version_file(host_root: Option<&Path>) -> Result<DriverInfo, String> {
    let root = host_root.unwrap_or(Path::new("/"));
    let shown = version_path(host_root);
    let shown = shown.display();
    let bytes =
        crate::host::files::read_capped_below(root, Path::new(VERSION_PATH), MAX_VERSION_FILE)
            .ok_or_else(|| format!("no readable {shown}: the nvidia module is not loaded"))?;
    parse_driver_version(&String::from_utf8_lossy(&bytes)).map_err(|e| format!("{shown}: {e}"))
}

/// [`VERSION_PATH`] below `host_root`, as it is shown (the file read is resolved inside the
/// root, links included).
pub fn version_path(host_root: Option<&Path>) -> PathBuf {
    match host_root {
        Some(r) => r.join(VERSION_PATH.trim_start_matches('/')),
        None => PathBuf::from(VERSION_PATH),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_of_both_modules() {
        let open = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n",
        )
        .unwrap();
        assert_eq!(open.version, "590.48.01");
        assert!(open.open_module);
        assert!(open.line.starts_with("NVRM version: NVIDIA UNIX Open"));
        assert_eq!(open.arch.as_deref(), Some("x86_64"));
        assert!(!open.line.contains("GCC"));

        let prop = parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        )
        .unwrap();
        assert_eq!(prop.version, "535.183.01");
        assert!(!prop.open_module);
        assert_eq!(prop.arch.as_deref(), Some("x86_64"));

        let arm = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (dvs-builder@U16-T02-35-3)  Wed Feb 26 01:38:54 UTC 2025",
        )
        .unwrap();
        assert_eq!(arm.version, "570.124.06");
        assert_eq!(arm.arch.as_deref(), Some("aarch64"));

        assert!(parse_driver_version("").is_err());
        assert!(parse_driver_version("GCC version: 12").is_err());
        assert!(parse_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module").is_err());
    }

    #[test]
    fn the_file_below_a_host_root_and_why_not() {
        let root = tempfile::tempdir().unwrap();
        let err = read_version_file(Some(root.path())).unwrap_err();
        assert!(err.contains("not loaded"), "{err}");
        let dir = root.path().join("proc/driver/nvidia");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("version"), "garbage\n").unwrap();
        let err = read_version_file(Some(root.path())).unwrap_err();
        assert!(err.contains("NVRM version"), "{err}");
        std::fs::write(
            dir.join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  (dvs-builder@U16-T02-35-3)  Sat Aug 19 01:13:32 UTC 2023\nGCC version:  gcc version 12.3.0\n",
        )
        .unwrap();
        let info = read_version_file(Some(root.path())).unwrap();
        assert_eq!(info.driver_version().unwrap().to_string(), "535.104.05");
    }
}

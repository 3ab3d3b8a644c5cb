//! The nvidia kernel module as it reports itself: `/proc/driver/nvidia/version` and
//! `params`, and the `nvidia_uvm` module parameters in sysfs.

use std::collections::BTreeMap;

use super::super::facts::{DriverInfo, Fact};
use super::super::root::Root;
use super::{parse_fact, read_fact, why_unreadable, FactExt};

/// `/proc/driver/nvidia/version` (nvidia module, `nv-procfs.c`).
pub const DRIVER_VERSION_PATH: &str = "/proc/driver/nvidia/version";

/// `/proc/driver/nvidia/params` (nvidia module parameters as `Key: value`).
pub const DRIVER_PARAMS_PATH: &str = "/proc/driver/nvidia/params";

/// `/sys/module/nvidia_uvm/parameters` (one file per `nvidia_uvm` module parameter).
pub const UVM_PARAMS_DIR: &str = "/sys/module/nvidia_uvm/parameters";

/// `/proc/driver/nvidia/version`, parsed ([`parse_driver_version`]).
pub(super) fn collect_driver(root: &Root) -> Fact<DriverInfo> {
    let text = read_fact(
        root.read_to_string(DRIVER_VERSION_PATH),
        DRIVER_VERSION_PATH,
        Some("the nvidia kernel module is not loaded (no /proc/driver/nvidia/version)"),
    );
    parse_fact(text, parse_driver_version)
}

/// `/proc/driver/nvidia/params` ([`parse_key_values`]).
pub(super) fn collect_driver_params(root: &Root) -> Fact<BTreeMap<String, String>> {
    read_fact(
        root.read_to_string(DRIVER_PARAMS_PATH),
        DRIVER_PARAMS_PATH,
        Some("the nvidia kernel module is not loaded (no /proc/driver/nvidia/params)"),
    )
    .map_ok(|t| parse_key_values(&t))
}

/// Every readable file of `/sys/module/nvidia_uvm/parameters`, by name.
pub(super) fn collect_uvm_params(root: &Root) -> Fact<BTreeMap<String, String>> {
    let names = match root.read_dir(UVM_PARAMS_DIR) {
        Ok(names) => names,
        Err(err) => return Fact::unavailable(
            why_unreadable(
                &err,
                Some("the nvidia_uvm module is not loaded (no /sys/module/nvidia_uvm/parameters)"),
            ),
            UVM_PARAMS_DIR,
        ),
    };
    let mut params = BTreeMap::new();
    for name in names {
        // A parameter that cannot be read (mode 0400 as non-root) is left out.
        if let Ok(value) = root.read_to_string(&format!("{UVM_PARAMS_DIR}/{name}")) {
            params.insert(name, value.trim_end_matches('\n').to_string());
        }
    }
    Fact::ok(params, UVM_PARAMS_DIR)
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
        return Err(format!("first line is not `NVRM version: ...`: {line:?}"));
    }
    let version = line
        .split_whitespace()
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && !w.ends_with('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .ok_or_else(|| format!("no version number in {line:?}"))?;
    Ok(DriverInfo {
        version: version.to_string(),
        open_module: line.contains("Open Kernel Module"),
        line: line.to_string(),
    })
}

/// Parses `Key: value` lines (`/proc/driver/nvidia/params`): key and value trimmed, value
/// kept as printed (quotes included, may be empty). Lines without `:` are skipped.
pub fn parse_key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            let key = key.trim();
            (!key.is_empty()).then(|| (key.to_string(), value.trim().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_version_lines() {
        let open = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n",
        )
        .unwrap();
        assert_eq!(open.version, "590.48.01");
        assert!(open.open_module);
        assert!(open.line.starts_with("NVRM version: NVIDIA UNIX Open"));
        assert!(!open.line.contains("GCC"));

        let prop = parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        )
        .unwrap();
        assert_eq!(prop.version, "535.183.01");
        assert!(!prop.open_module);

        let arm = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (dvs-builder@U16-T02-35-3)  Wed Feb 26 01:38:54 UTC 2025",
        )
        .unwrap();
        assert_eq!(arm.version, "570.124.06");

        assert!(parse_driver_version("").is_err());
        assert!(parse_driver_version("GCC version: 12").is_err());
        assert!(parse_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module").is_err());
    }

    #[test]
    fn driver_params_key_values() {
        let params = parse_key_values(
            "ResmanDebugLevel: 4294967295\nEnableMSI: 1\nCoherentGPUMemoryMode: \nRegistryDwords: \"\"\nnot a pair\n",
        );
        assert_eq!(params["EnableMSI"], "1");
        assert_eq!(params["CoherentGPUMemoryMode"], "");
        assert_eq!(params["RegistryDwords"], "\"\"");
        assert_eq!(params.len(), 4);
    }
}

//! Loaded modules and registered character majors: `/proc/modules` and `/proc/devices`.

use std::collections::BTreeMap;

use super::super::facts::Fact;
use super::super::root::Root;
use super::{read_fact, FactExt};

/// `/proc/modules` (`kernel/module/procfs.c`).
pub const MODULES_PATH: &str = "/proc/modules";

/// `/proc/devices` (`fs/proc/devices.c`).
pub const DEVICES_PATH: &str = "/proc/devices";

/// `/proc/modules`: the nvidia module names ([`parse_modules`]).
pub(super) fn collect_modules(root: &Root) -> Fact<Vec<String>> {
    read_fact(
        root.read_to_string(MODULES_PATH),
        MODULES_PATH,
        Some("the kernel has no loadable module support (no /proc/modules), so no nvidia module can be loaded"),
    )
    .map_ok(|t| parse_modules(&t))
}

/// `/proc/devices`: the nvidia character majors ([`parse_devices`]).
pub(super) fn collect_devices(root: &Root) -> Fact<BTreeMap<String, u32>> {
    read_fact(root.read_to_string(DEVICES_PATH), DEVICES_PATH, None).map_ok(|t| parse_devices(&t))
}

/// Names of the modules in `/proc/modules` (`name size refcount deps state address`) that
/// start with `nvidia` (`nvidia`, `nvidia_uvm`, `nvidia_modeset`, `nvidia_drm`,
/// `nvidia_peermem`), in file order.
pub fn parse_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with("nvidia"))
        .map(str::to_string)
        .collect()
}

/// Majors by name from the `Character devices:` section of `/proc/devices`, for names
/// starting with `nvidia` (`nvidia-frontend` 195, `nvidia-uvm` (dynamic), `nvidia-nvswitch`,
/// `nvidia-caps`, ...). The `Block devices:` section is ignored.
pub fn parse_devices(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, name)) = line.split_once(char::is_whitespace) {
            let name = name.trim();
            if let (Ok(major), true) = (major.parse::<u32>(), name.starts_with("nvidia")) {
                out.insert(name.to_string(), major);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_and_devices() {
        let modules = parse_modules(
            "nvidia_uvm 2084864 4 - Live 0xffffffffc2a00000 (OE)\next4 1114112 2 - Live 0x0\nnvidia_modeset 1556480 1 nvidia_drm, Live 0x0 (OE)\nnvidia 11513856 32 nvidia_uvm,nvidia_modeset, Live 0x0 (OE)\nnvidiafb 1 0 - Live 0x0\n",
        );
        assert_eq!(
            modules,
            ["nvidia_uvm", "nvidia_modeset", "nvidia", "nvidiafb"]
        );

        let devices = parse_devices(
            "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-nvswitch\n235 nvidia-caps\n508 nvidia-uvm\n509 nvidia-nvlink\n\nBlock devices:\n  8 sd\n259 nvidia-fake-block\n",
        );
        assert_eq!(devices.len(), 5);
        assert_eq!(devices["nvidia-uvm"], 508);
        assert_eq!(devices["nvidia-frontend"], 195);
        assert!(!devices.contains_key("nvidia-fake-block"));
    }
}

//! Loaded modules and registered character majors: `/proc/modules` and `/proc/devices`.

use std::collections::BTreeMap;

use super::super::facts::Fact;
use super::super::root::Root;
use super::{parse_fact, read_fact, FactExt};
use crate::host::procfs::devices::{parse_devices, DEVICES_PATH};

/// `/proc/modules` (`kernel/module/procfs.c`).
pub const MODULES_PATH: &str = "/proc/modules";

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
    parse_fact(
        read_fact(root.read_to_string(DEVICES_PATH), DEVICES_PATH, None),
        parse_devices,
    )
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
        )
        .unwrap();
        assert_eq!(devices.len(), 5);
        assert_eq!(devices["nvidia-uvm"], 508);
        assert_eq!(devices["nvidia-frontend"], 195);
        assert!(!devices.contains_key("nvidia-fake-block"));
        assert_eq!(parse_devices(""), Ok(BTreeMap::new()));

        // Lines that are not `<major> <name>` are reported, quoted, never dropped.
        for (text, line) in [
            (
                "Character devices:\n195 nvidia-frontend\nxyz nvidia-uvm\n",
                3,
            ),
            ("Character devices:\n195\n", 2),
            ("508 nvidia-uvm\n", 1),
            ("Character devices:\n\x1b[2J\x00 binary\n", 2),
        ] {
            let err = parse_devices(text).unwrap_err();
            assert!(
                err.starts_with(&format!("line {line} is not `<major> <name>`")),
                "{err}"
            );
            assert!(!err.chars().any(|c| c.is_control()), "{err:?}");
        }
    }
}

//! The nvidia kernel module as it reports itself: `/proc/driver/nvidia/version`, `params`
//! and the GPUs it registered (`gpus/`), and the `nvidia_uvm` module parameters in sysfs.

use std::collections::BTreeMap;

use super::super::facts::{DriverInfo, Fact};
use super::super::root::Root;
use super::{parse_fact, read_fact, why_unreadable, FactExt};
use crate::host::driver::parse_driver_version;

pub use crate::host::driver::VERSION_PATH as DRIVER_VERSION_PATH;

/// `/proc/driver/nvidia/params` (nvidia module parameters as `Key: value`).
pub const DRIVER_PARAMS_PATH: &str = "/proc/driver/nvidia/params";

/// `/proc/driver/nvidia/gpus` (one directory per GPU the driver registered, named by its
/// PCI address; NVIDIA's `kernel-open/nvidia/nv-procfs.c`).
pub const GPUS_DIR: &str = "/proc/driver/nvidia/gpus";

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

/// The entries of `/proc/driver/nvidia/gpus`, sorted: empty when the driver is loaded with
/// no GPU.
///
/// Each entry is listed too (never read): a bundle then keeps it as a directory, so a re-run
/// sees the same GPUs. Its `information` file is not read, since reading it takes a power
/// reference on the GPU in the driver (`rm_ref_dynamic_power` in `nv_procfs_read_gpu_info`),
/// which would wake one in runtime D3: the agent observes and must not do that.
pub(super) fn collect_gpus(root: &Root) -> Fact<Vec<String>> {
    let names = match root.read_dir(GPUS_DIR) {
        Ok(names) => names,
        Err(err) => {
            return Fact::unavailable(
                why_unreadable(
                    &err,
                    Some(
                        "no /proc/driver/nvidia/gpus (the nvidia kernel module is not loaded, \
                         or the snapshot was written without it)",
                    ),
                ),
                GPUS_DIR,
            )
        }
    };
    for name in &names {
        let _ = root.read_dir(&format!("{GPUS_DIR}/{name}"));
    }
    Fact::ok(names, GPUS_DIR)
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

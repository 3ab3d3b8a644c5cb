//! What `nvidia-smi -q` says of each GPU.

use std::collections::BTreeMap;

use super::super::facts::{Fact, SmiInfo};
use super::super::root::Root;

/// `nvidia-smi -q`, parsed ([`parse_smi`]).
pub(super) fn collect_smi(root: &Root) -> Fact<SmiInfo> {
    const SOURCE: &str = "nvidia-smi -q";
    match root.command("nvidia-smi", &["-q"]) {
        Ok(text) => match parse_smi(&text) {
            Ok(info) => Fact::ok(info, SOURCE),
            Err(why) => Fact::unavailable(format!("malformed: {why}"), SOURCE),
        },
        Err(err) => Fact::unavailable(err.to_string(), SOURCE),
    }
}

/// Parses `nvidia-smi -q` text.
///
/// The format is indented `Key : value` lines (4 spaces a level); a line without ` : ` opens
/// a section (`MIG Mode`, `Fabric`), and each `GPU <bus id>` line at the left margin starts
/// a GPU. Per GPU it takes `Product Brand`, `Persistence Mode`, `Addressing Mode`,
/// `Compute Mode`, `MIG Mode / Current` and `Fabric / State`; a GPU whose section lacks one
/// (older drivers print no `Addressing Mode` or `Fabric`) gets an empty string there, so
/// that the lists stay aligned with the GPUs. `Driver Version` comes from the top level.
///
/// Errors: neither a `Driver Version` line nor a GPU section.
pub fn parse_smi(text: &str) -> Result<SmiInfo, String> {
    let mut info = SmiInfo::default();
    let mut gpus: Vec<BTreeMap<String, String>> = Vec::new();
    // (indent, section name) of the open sections inside the current GPU.
    let mut stack: Vec<(usize, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let content = line.trim_start();
        let kv = split_smi_kv(content);
        if indent == 0 && kv.is_none() && content.starts_with("GPU ") {
            gpus.push(BTreeMap::new());
            stack.clear();
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        match kv {
            Some(("Driver Version", value)) if indent == 0 => {
                info.driver_version = Some(value.to_string());
            }
            Some(_) if indent == 0 => {}
            Some((key, value)) => {
                if let Some(gpu) = gpus.last_mut() {
                    let mut path: Vec<&str> = stack.iter().map(|(_, n)| n.as_str()).collect();
                    path.push(key);
                    gpu.entry(path.join(" / "))
                        .or_insert_with(|| value.to_string());
                }
            }
            None if indent > 0 => stack.push((indent, content.to_string())),
            None => {}
        }
    }
    if gpus.is_empty() && info.driver_version.is_none() {
        return Err("no `Driver Version` line and no `GPU <bus id>` section".to_string());
    }
    let field = |key: &str| -> Vec<String> {
        gpus.iter()
            .map(|g| g.get(key).cloned().unwrap_or_default())
            .collect()
    };
    info.gpus = gpus.len() as u32;
    info.addressing_mode = field("Addressing Mode");
    info.persistence_mode = field("Persistence Mode");
    info.compute_mode = field("Compute Mode");
    info.mig_mode = field("MIG Mode / Current");
    info.fabric_state = field("Fabric / State");
    info.product_brand = field("Product Brand");
    Ok(info)
}

/// `Key    : value` (or `Key    :` with an empty value) split and trimmed.
fn split_smi_kv(content: &str) -> Option<(&str, &str)> {
    if let Some((key, value)) = content.split_once(" : ") {
        return Some((key.trim(), value.trim()));
    }
    content.strip_suffix(" :").map(|key| (key.trim(), ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uvmwatch_testbed::snapshot::{smi_q, SmiGpu};

    #[test]
    fn smi_h200_and_variants() {
        let text = smi_q("590.48.01", &[SmiGpu::h200(0), SmiGpu::h200(1)]);
        let info = parse_smi(&text).unwrap();
        assert_eq!(info.gpus, 2);
        assert_eq!(info.driver_version.as_deref(), Some("590.48.01"));
        assert_eq!(info.addressing_mode, ["HMM", "HMM"]);
        assert_eq!(info.persistence_mode, ["Enabled", "Enabled"]);
        assert_eq!(info.compute_mode, ["Default", "Default"]);
        assert_eq!(info.mig_mode, ["Disabled", "Disabled"]);
        assert_eq!(info.fabric_state, ["Completed", "Completed"]);
        assert_eq!(info.product_brand, ["NVIDIA", "NVIDIA"]);

        let mut odd = SmiGpu::h200(1);
        odd.mig_mode = "Enabled".into();
        odd.compute_mode = "Exclusive_Process".into();
        odd.fabric_state = Some("In Progress".into());
        odd.persistence_mode = "Disabled".into();
        let info = parse_smi(&smi_q("590.48.01", &[SmiGpu::h200(0), odd])).unwrap();
        assert_eq!(info.mig_mode, ["Disabled", "Enabled"]);
        assert_eq!(info.compute_mode, ["Default", "Exclusive_Process"]);
        assert_eq!(info.fabric_state, ["Completed", "In Progress"]);
        assert_eq!(info.persistence_mode, ["Enabled", "Disabled"]);
    }

    #[test]
    fn smi_older_geforce_without_new_fields() {
        // 535-era GeForce output: no Addressing Mode, no Fabric; a nested `Current` of
        // another section must not be taken for MIG's.
        let text = "
==============NVSMI LOG==============

Timestamp                                 : Tue Mar 18 14:08:47 2025
Driver Version                            : 535.161.08
CUDA Version                              : 12.2

Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA GeForce RTX 3090
    Product Brand                         : GeForce
    Product Architecture                  : Ampere
    Display Mode                          : Enabled
    Persistence Mode                      : Disabled
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
    Platform Info
        Chassis Serial Number             :
        Slot Number                       : 0
    Compute Mode                          : Default
    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 2817
            Type                          : C
            Name                          : python3
            Used GPU Memory               : 1024 MiB
";
        let info = parse_smi(text).unwrap();
        assert_eq!(info.gpus, 1);
        assert_eq!(info.driver_version.as_deref(), Some("535.161.08"));
        assert_eq!(info.addressing_mode, [""]);
        assert_eq!(info.fabric_state, [""]);
        assert_eq!(info.mig_mode, ["N/A"]);
        assert_eq!(info.product_brand, ["GeForce"]);
        assert_eq!(info.persistence_mode, ["Disabled"]);
        assert_eq!(info.compute_mode, ["Default"]);

        assert!(parse_smi(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        )
        .is_err());
        let none =
            parse_smi("Timestamp : x\nDriver Version : 590.48.01\nAttached GPUs : 0\n").unwrap();
        assert_eq!(none.gpus, 0);
        assert!(none.addressing_mode.is_empty());
    }
}

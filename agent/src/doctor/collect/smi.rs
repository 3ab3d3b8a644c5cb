//! What `nvidia-smi -q` says of each GPU, and how it ended (listed GPUs, found none, could
//! not reach the driver, failed otherwise).

use std::collections::BTreeMap;

use super::super::facts::{Fact, SmiInfo, SmiOutcome, SmiVerdict};
use super::super::root::{CommandError, Root};

/// `nvidia-smi -q`, run once: its GPUs ([`parse_smi`]) and how it ended ([`classify_smi`]).
/// When it could not run (not installed, timed out, not captured), both facts are unknown
/// with the same reason.
pub(super) fn collect_smi(root: &Root) -> (Fact<SmiInfo>, Fact<SmiOutcome>) {
    const SOURCE: &str = "nvidia-smi -q";
    match root.command("nvidia-smi", &["-q"]) {
        Ok(text) => match parse_smi(&text) {
            Ok(info) => {
                let verdict = if info.gpus > 0 {
                    SmiVerdict::GpusListed
                } else {
                    SmiVerdict::NoGpu
                };
                let outcome = SmiOutcome {
                    verdict,
                    status: None,
                    message: (info.gpus == 0).then(|| "no GPU section in its output".into()),
                };
                (Fact::ok(info, SOURCE), Fact::ok(outcome, SOURCE))
            }
            // A capture that kept only the output of a failure ("No devices were found")
            // still says what it found.
            Err(why) => (
                Fact::unavailable(format!("malformed: {why}"), SOURCE),
                Fact::ok(classify_smi(None, &text), SOURCE),
            ),
        },
        Err(err) => {
            let outcome = match &err {
                CommandError::Failed { status, output, .. } => {
                    Fact::ok(classify_smi(Some(status), output), SOURCE)
                }
                other => Fact::unavailable(other.to_string(), SOURCE),
            };
            (Fact::unavailable(err.to_string(), SOURCE), outcome)
        }
    }
}

/// What `nvidia-smi`'s output of a run that listed nothing says, by the line it prints:
/// no GPU ([`SMI_NO_GPU`]), no driver ([`SMI_NO_DRIVER`]), or another failure (its first
/// line). `status` is the exit status as [`CommandError::Failed`] gives it (`exit status
/// 255`), `None` when unknown.
pub fn classify_smi(status: Option<&str>, output: &str) -> SmiOutcome {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let find = |patterns: &[&str]| {
        lines
            .iter()
            .find(|l| patterns.iter().any(|p| l.contains(p)))
            .map(|l| l.to_string())
    };
    let (verdict, message) = if let Some(line) = find(SMI_NO_GPU) {
        (SmiVerdict::NoGpu, Some(line))
    } else if let Some(line) = find(SMI_NO_DRIVER) {
        (SmiVerdict::NoDriver, Some(line))
    } else {
        (SmiVerdict::Failed, lines.first().map(|l| l.to_string()))
    };
    SmiOutcome {
        verdict,
        status: status.map(str::to_string),
        message,
    }
}

/// What `nvidia-smi` prints when the driver answers but has no GPU to report:
/// `No devices were found` (exit 6), `Failed to initialize NVML: No supported GPUs were
/// found` (550.163.01 loaded without a GPU, exit 255) and `Failed to initialize NVML:
/// Unknown Error` (535.261.03 loaded without a GPU, exit 255; the same words come when
/// NVML is denied the device nodes, which is why the rules never take it alone).
pub const SMI_NO_GPU: &[&str] = &[
    "No devices were found",
    "No supported GPUs were found",
    "Failed to initialize NVML: Unknown Error",
];

/// What `nvidia-smi` prints when no driver answers: `NVIDIA-SMI has failed because it
/// couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is
/// installed and running.` (exit 9).
pub const SMI_NO_DRIVER: &[&str] = &["couldn't communicate with the NVIDIA driver"];

/// The words of [`SMI_NO_GPU`] that NVML also prints for other reasons (device access
/// denied): weaker evidence of "no GPU" than the others.
pub const SMI_AMBIGUOUS_NO_GPU: &str = "Unknown Error";

/// Parses `nvidia-smi -q` text.
///
/// The format is indented `Key : value` lines (4 spaces a level); a line without ` : ` opens
/// a section (`MIG Mode`, `Fabric`), and each `GPU <bus id>` line at the left margin starts
/// a GPU. Per GPU it takes `Product Brand`, `Persistence Mode`, `Addressing Mode`,
/// `Compute Mode`, `MIG Mode / Current` and `Fabric / State`, and counts its `MIG Device`
/// blocks; a GPU whose section lacks one
/// (older drivers print no `Addressing Mode` or `Fabric`) gets an empty string there, so
/// that the lists stay aligned with the GPUs. `Driver Version` comes from the top level.
///
/// Errors: neither a `Driver Version` line nor a GPU section.
pub fn parse_smi(text: &str) -> Result<SmiInfo, String> {
    let mut info = SmiInfo::default();
    let mut gpus: Vec<BTreeMap<String, String>> = Vec::new();
    // `MIG Device` blocks per GPU.
    let mut mig_devices: Vec<u32> = Vec::new();
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
            mig_devices.push(0);
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
            None if indent > 0 => {
                if indent == 4 && content == "MIG Device" {
                    if let Some(n) = mig_devices.last_mut() {
                        *n += 1;
                    }
                }
                stack.push((indent, content.to_string()))
            }
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
    info.mig_devices = mig_devices;
    info.fabric_state = field("Fabric / State");
    info.product_brand = field("Product Brand");
    info.product_name = field("Product Name");
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
        assert_eq!(info.mig_devices, [0, 0]);

        let mut odd = SmiGpu::h200(1);
        odd.mig_mode = "Enabled".into();
        odd.compute_mode = "Exclusive_Process".into();
        odd.fabric_state = Some("In Progress".into());
        odd.persistence_mode = "Disabled".into();
        odd.mig_devices = 3;
        let info = parse_smi(&smi_q("590.48.01", &[SmiGpu::h200(0), odd])).unwrap();
        assert_eq!(info.mig_mode, ["Disabled", "Enabled"]);
        // `MIG Device` blocks at the GPU's first level (a real 590 listing of an RTX PRO
        // 6000 Blackwell with one instance has `    MIG Device` / `        Index : 0` /
        // `        GPU Instance ID : 3` between `MIG Mode` and `FB Memory Usage`).
        assert_eq!(info.mig_devices, [0, 3]);
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

    #[test]
    fn smi_failures_are_classified_no_gpu_no_driver_or_other() {
        // Real output of nvidia-smi 550.163.01 and 535.261.03 with their drivers loaded on
        // a machine without a GPU (Debian's packages, in uvmwatch's vm-test).
        let o = classify_smi(
            Some("exit status 255"),
            "Failed to initialize NVML: No supported GPUs were found\nUnable to determine the number of GPUs\n",
        );
        assert_eq!(
            o,
            SmiOutcome {
                verdict: SmiVerdict::NoGpu,
                status: Some("exit status 255".into()),
                message: Some("Failed to initialize NVML: No supported GPUs were found".into()),
            }
        );
        let o = classify_smi(
            Some("exit status 255"),
            "Failed to initialize NVML: Unknown Error\n",
        );
        assert_eq!(o.verdict, SmiVerdict::NoGpu);
        assert!(o.message.unwrap().contains(SMI_AMBIGUOUS_NO_GPU));
        let o = classify_smi(Some("exit status 6"), "No devices were found\n");
        assert_eq!(
            (o.verdict, o.message.as_deref()),
            (SmiVerdict::NoGpu, Some("No devices were found"))
        );
        // No driver: exit 9.
        let o = classify_smi(
            Some("exit status 9"),
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n",
        );
        assert_eq!(o.verdict, SmiVerdict::NoDriver);
        // Anything else is another failure, with its first line.
        let o = classify_smi(
            Some("exit status 18"),
            "\nFailed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48\n",
        );
        assert_eq!(
            (o.verdict, o.message.as_deref()),
            (
                SmiVerdict::Failed,
                Some("Failed to initialize NVML: Driver/library version mismatch")
            )
        );
        assert_eq!(classify_smi(Some("signal 9"), "").message, None);
    }

    #[test]
    fn smi_outcome_from_a_snapshot_run_failed_or_listing() {
        use crate::doctor::root::Root;
        let dir = tempfile::tempdir().unwrap();
        let root = Root::Snapshot(dir.path().to_path_buf());
        // Not captured: both unknown, for the same reason.
        let (smi, outcome) = collect_smi(&root);
        assert_eq!(smi.value.unwrap_err(), outcome.value.unwrap_err());
        // A listing: GPUs listed.
        std::fs::create_dir_all(dir.path().join("commands")).unwrap();
        std::fs::write(
            dir.path().join("commands/nvidia-smi.txt"),
            smi_q("590.48.01", &[SmiGpu::h200(0)]),
        )
        .unwrap();
        let (smi, outcome) = collect_smi(&root);
        assert_eq!(smi.get().unwrap().gpus, 1);
        assert_eq!(outcome.get().unwrap().verdict, SmiVerdict::GpusListed);
        // Only the output of a failure kept: classified from it.
        std::fs::write(
            dir.path().join("commands/nvidia-smi.txt"),
            "No devices were found\n",
        )
        .unwrap();
        let (smi, outcome) = collect_smi(&root);
        assert!(smi.value.is_err());
        let o = outcome.get().unwrap();
        assert_eq!((o.verdict, o.status.as_deref()), (SmiVerdict::NoGpu, None));
    }
}

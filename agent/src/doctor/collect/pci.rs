//! NVIDIA GPUs on the PCI bus and the driver bound to each: `/sys/bus/pci/devices/` (Linux
//! `Documentation/ABI/testing/sysfs-bus-pci`: `vendor`, `device`, `class`, the `driver` link).
//!
//! What the hardware has, whether or not the nvidia driver took it: a GPU held by `vfio-pci`
//! or `nouveau`, or by no driver at all because the nvidia module was refused, is here and
//! nowhere in `/proc/driver/nvidia`.

use super::super::facts::{Fact, PciGpu};
use super::super::root::Root;
use super::why_unreadable;

/// The PCI devices directory.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// NVIDIA's PCI vendor id (PCI-SIG vendor list; `PCI_VENDOR_ID_NVIDIA` in Linux
/// `include/linux/pci_ids.h`).
const NVIDIA_VENDOR: &str = "0x10de";

/// Most PCI devices looked at (a machine has a few hundred at most).
const MAX_DEVICES: usize = 4096;

/// Every NVIDIA display-class device (class `0x03xxxx`: VGA or 3D controller; an NVSwitch is
/// a bridge, `0x068000`, and is left out) with its bound driver.
pub(super) fn collect_pci_gpus(root: &Root) -> Fact<Vec<PciGpu>> {
    let names = match root.read_dir(PCI_DEVICES) {
        Ok(names) => names,
        Err(err) => return Fact::unavailable(
            why_unreadable(
                &err,
                Some("no PCI devices to read here (no /sys, or a snapshot that did not record it)"),
            ),
            PCI_DEVICES,
        ),
    };
    let mut gpus = Vec::new();
    for name in names.iter().take(MAX_DEVICES) {
        let dir = format!("{PCI_DEVICES}/{name}");
        let read = |file: &str| {
            root.read_to_string(&format!("{dir}/{file}"))
                .map(|s| s.trim().to_lowercase())
        };
        if read("vendor").ok().as_deref() != Some(NVIDIA_VENDOR) {
            continue;
        }
        let Ok(class) = read("class") else { continue };
        if !class.starts_with("0x03") {
            continue;
        }
        let driver = root
            .read_link(&format!("{dir}/driver"))
            .ok()
            .and_then(|t| t.rsplit('/').next().map(str::to_string))
            .filter(|d| !d.is_empty());
        let device = read("device")
            .ok()
            .and_then(|d| u16::from_str_radix(d.trim_start_matches("0x"), 16).ok());
        gpus.push(PciGpu {
            address: name.clone(),
            class,
            driver,
            device,
        });
    }
    Fact::ok(gpus, PCI_DEVICES)
}

#[cfg(test)]
mod tests {
    use super::super::super::root::Root;
    use super::*;

    #[test]
    fn pci_gpus_with_their_drivers_and_not_other_devices() {
        let dir = tempfile::tempdir().unwrap();
        let dev = |addr: &str, vendor: &str, class: &str, driver: Option<&str>| {
            let d = dir.path().join("sys/bus/pci/devices").join(addr);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
            if let Some(drv) = driver {
                std::os::unix::fs::symlink(
                    format!("../../../../bus/pci/drivers/{drv}"),
                    d.join("driver"),
                )
                .unwrap();
            }
        };
        dev("0000:01:00.0", "0x10de", "0x030000", Some("vfio-pci"));
        dev("0000:01:00.1", "0x10de", "0x040300", Some("snd_hda_intel"));
        dev("0000:02:00.0", "0x10de", "0x030200", None);
        dev(
            "0000:03:00.0",
            "0x10de",
            "0x068000",
            Some("nvidia-nvswitch"),
        );
        dev("0000:04:00.0", "0x8086", "0x030000", Some("i915"));
        let root = Root::Snapshot(dir.path().to_path_buf());
        let f = collect_pci_gpus(&root);
        let gpus = f.get().unwrap();
        assert_eq!(gpus.len(), 2, "{gpus:?}");
        assert_eq!(gpus[0].address, "0000:01:00.0");
        assert_eq!(gpus[0].driver.as_deref(), Some("vfio-pci"));
        assert_eq!(gpus[1].class, "0x030200");
        assert_eq!(gpus[1].driver, None);
        let empty = tempfile::tempdir().unwrap();
        assert!(
            collect_pci_gpus(&Root::Snapshot(empty.path().to_path_buf()))
                .get()
                .is_none()
        );
    }
}

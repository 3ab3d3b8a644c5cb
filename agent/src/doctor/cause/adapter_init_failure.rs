//! `adapter_init_failure`: a GPU failed to initialize, or was lost, in the kernel.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::AdapterInitFailure,
    title: "a GPU failed to initialize or was lost in the kernel (RmInitAdapter failed, fell off the bus, GSP, BAR, a GPU the proprietary module refuses)",
    doc: "RM logs 'RmInitAdapter failed! (initStatus:rmStatus:line)' when a GPU does not come \
          up (osinit.c): GSP firmware that does not start or answer (Xid 119, 120, \
          'Cannot initialize GSP firmware RM'), WPR2 left up by an earlier boot (kernel_gsp.c), \
          a PCI BAR the firmware did not assign (nv-pci.c), a GPU that requires the open \
          modules refused by the proprietary one ('requires use of the NVIDIA open kernel \
          modules', then RmInitAdapter failed! (0x22:0x56), Blackwell). A GPU that stops answering on PCIe \
          'has fallen off the bus' (Xid 79, nverror.h) and stays lost until a reboot; opens of \
          its node fail with EIO and its calls fail or hang. The probe itself can fail on the \
          PCI bus (nv-pci.c: pci_enable_device, no IRQ, registers claimed): with no GPU left \
          the module does not load. A GPU bound to nvidia that nvidia-smi does not list is one \
          the driver could not bring up; Xids after which the GPU needs a reset (ECC double \
          bit 48, PMU halt 62, uncontained 95, GSP 119/120, 140, 143, recovery action 154) \
          mean the same for work already running.",
    produces: &[
        (Fits::Host(HostSymptom::GpuFailed), Strong),
        (Fits::Open(&["EIO"]), Strong),
        // nv_open_device: NV_ERR_GPU_IS_LOST becomes -ENODEV (kernel-open/nvidia/nv.c).
        (Fits::Open(&["ENODEV"]), Weak),
        (Fits::StartCall(&[]), Weak),
        (Fits::DeviceCountLow, Weak),
        (Fits::Cuinit(&[100, 101, 999, 3]), Weak),
        (Fits::CuinitHung, Weak),
        (Fits::CallHung(None), Weak),
        (Fits::CallFailed(None), Weak),
        (Fits::LaterCall(&[]), Weak),
        (Fits::Host(HostSymptom::DriverSeesNoGpu), Weak),
        (Fits::Host(HostSymptom::DriverNotLoaded), Weak),
        (Fits::Host(HostSymptom::SmiNoDevices), Weak),
        (Fits::Host(HostSymptom::SmiUnknownError), Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[
        (AdapterInitFailed, Decisive),
        (GpuFellOffBus, Decisive),
        (Wpr2Up, Decisive),
        (BarInvalid, Decisive),
        (NeedsOpenModule, Decisive),
        (ProbeFailed, Decisive),
        (GspFailed, Strong),
        (BoundGpuNotListed, Strong),
        (GpuFatalXid, Strong),
        (OpenIoError, Strong),
        (NodeOpenIoError, Strong),
        (XidLogged, Weak),
    ],
    against: &[(LegacyGpu, Decisive)],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "sudo dmesg | grep -E 'RmInitAdapter|Xid|fallen off': the GPU that did not come up and the driver's reason",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let host = c.host_only();
    let fw = format!("ls /lib/firmware/nvidia/{}/", c.driver_version(""));
    let read = step(
        Where::Any,
        "Read the failure code: RmInitAdapter failed! (0xAA:0xBB:NNN) and the Xid name the cause.",
        &[
            "sudo dmesg -T | grep -E 'RmInitAdapter|rm_init_adapter|Xid|NVRM'",
            "sudo nvidia-bug-report.sh",
        ],
    );
    if c.holds(NeedsOpenModule) {
        return vec![
            step(
                Where::Host,
                format!(
                    "This GPU needs the open kernel modules (Blackwell and later): install the \
                     open flavor of the same driver (Ubuntu: nvidia-driver-<branch>-open; \
                     RHEL: the open-dkms stream; the .run installer: \
                     --kernel-module-type=open), then reboot.{host}"
                ),
                &[
                    "sudo apt install nvidia-driver-<branch>-open",
                    "sudo reboot",
                ],
            ),
            step(
                Where::Any,
                "Verify: the first line must name the Open Kernel Module.",
                &["head -1 /proc/driver/nvidia/version"],
            ),
        ];
    }
    if c.holds(GpuFellOffBus) {
        return vec![
            step(
                Where::Host,
                format!(
                    "The GPU no longer answers on PCIe; only a reboot brings it back. Look for \
                     PCIe errors first.{host}"
                ),
                &[
                    "sudo dmesg -T | grep -iE 'AER|pcieport|fallen off'",
                    "sudo reboot",
                ],
            ),
            step(
                Where::Host,
                "If it repeats: check the GPU's power cables and supply, cooling and seating; a \
                 GPU that keeps falling off the bus is a hardware case for the vendor.",
                &["nvidia-smi -q -d TEMPERATURE,POWER"],
            ),
        ];
    }
    if c.holds(Wpr2Up) {
        return vec![
            step(
                Where::Host,
                format!(
                    "The GPU kept its GSP state (WPR2) from an earlier driver load: reset it \
                     (stop every GPU user first), or power the machine off and on.{host}"
                ),
                &[
                    "sudo fuser -v /dev/nvidia*",
                    "sudo nvidia-smi -r",
                    "echo 1 | sudo tee /sys/bus/pci/devices/<0000:BB:DD.F>/reset",
                ],
            ),
            read,
        ];
    }
    if c.holds(BarInvalid) {
        return vec![
            step(
                Where::Host,
                format!(
                    "The firmware left a GPU BAR unassigned or too small. In the BIOS/UEFI set \
                     'Above 4G Decoding' on (and 'Resizable BAR' where offered), or boot with \
                     pci=realloc.{host}"
                ),
                &["sudo lspci -vv -d 10de: | grep -E 'Region|BAR'"],
            ),
            read,
        ];
    }
    if c.holds(GspFailed) {
        return vec![
            step(
                Where::Host,
                format!(
                    "GSP, the GPU's own firmware processor, did not answer. Reset the GPU (or \
                     reboot), and check that this driver's GSP firmware files are installed; if \
                     it repeats, update the driver (or the GPU's VBIOS).{host}"
                ),
                &["sudo nvidia-smi -r", &fw, "sudo reboot"],
            ),
            read,
        ];
    }
    vec![
        read,
        step(
            Where::Host,
            format!(
                "Depends on the code: BIOS settings (Above 4G decoding, BAR size), the GSP \
                 firmware files of this driver, the GPU's VBIOS, a driver flavor that supports \
                 the GPU.{host}"
            ),
            &[&fw, "sudo reboot"],
        ),
    ]
}

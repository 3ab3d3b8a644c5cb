//! `no_gpu`: the NVIDIA driver drives no GPU.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::NoGpu,
    title: "the NVIDIA driver drives no GPU: none on the bus, bound to another driver, excluded, or dropped by this driver branch",
    doc: "nvidia.ko refuses to load without a GPU to drive (kernel-open/nvidia/nv.c, \
          nvidia_init_module: -ENODEV, 'NVRM: No NVIDIA GPU found.', unless an NVSwitch is \
          there), and ignores a GPU another driver holds (vfio-pci for passthrough, nouveau), \
          one excluded by NVreg_ExcludedGpus, and a GPU of a legacy branch ('supported through \
          the NVIDIA ... Legacy drivers'). Loaded without a GPU, /proc/driver/nvidia/gpus is empty, \
          nvidia-smi says 'No devices were found' and cuInit returns 100 (999 on 535 and 550 \
          with the driver loaded GPU-less: one RM control fails with \
          NV_ERR_INVALID_LOCK_STATE).",
    produces: &[
        (Fits::Host(HostSymptom::DriverSeesNoGpu), Strong),
        (Fits::Host(HostSymptom::GpuNotDriven), Decisive),
        (Fits::Host(HostSymptom::SmiNoDevices), Strong),
        (Fits::Host(HostSymptom::DriverNotLoaded), Strong),
        (Fits::Host(HostSymptom::GpuFailed), Weak),
        (Fits::Cuinit(&[100]), Strong),
        (Fits::Cuinit(&[999]), Weak),
        (Fits::Open(&["ENOENT", "ENXIO", "ENODEV"]), Weak),
    ],
    needs: &[],
    rules_out: &[Wsl, DriverHoldsEveryGpu],
    supports: &[
        (DriverFoundNoGpu, Decisive),
        (DriverRegisteredNoGpu, Decisive),
        (LegacyGpu, Decisive),
        (GpuHeldElsewhere, Strong),
        (GpusExcluded, Strong),
        (SmiNoDevices, Strong),
        (NoGpuOnPci, Strong),
    ],
    against: &[
        (SmiListsGpus, Strong),
        (ContainerWithoutGpu, Strong),
        (AdapterInitFailed, Strong),
        (NeedsOpenModule, Strong),
        (GpuFellOffBus, Strong),
        (BarInvalid, Strong),
        (ProbeFailed, Strong),
    ],
    generic: false,
    yields_to: &[],
    hazards: &[Hazard {
        when: &[DriverLoaded, GpuHeldElsewhere],
        severity: Severity::Warning,
    }],
    tell_apart: "lspci -nnk -d 10de:: each NVIDIA GPU and the kernel driver in use for it (nvidia, vfio-pci, nouveau or none)",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let host = c.host_only();
    let mut steps = Vec::new();
    if c.holds(LegacyGpu) {
        steps.push(step(
            Where::Host,
            format!(
                "This driver branch dropped the GPU: install the legacy branch the kernel log \
                 names for it.{host}"
            ),
            &["sudo dmesg | grep -i legacy"],
        ));
    }
    steps.extend([
        step(
            Where::Host,
            format!(
                "Check that the GPU is on this machine's PCI bus (vendor 10de). No line: it is \
                 not there. In a VM, pass the GPU through to it (PCI passthrough on the \
                 hypervisor: vfio-pci there, a hostdev/hostpci entry for this VM); on bare \
                 metal, check seating, power and the BIOS.{host}"
            ),
            &["lspci -nn -d 10de:"],
        ),
        step(
            Where::Host,
            format!(
                "See which kernel driver holds each NVIDIA device: `Kernel driver in use: \
                 nvidia` is right; vfio-pci (kept for passthrough by vfio-pci.ids= on the kernel \
                 command line or in /etc/modprobe.d) or nouveau (blacklist it and rebuild the \
                 initramfs) keeps it from the NVIDIA driver.{host}"
            ),
            &[
                "lspci -k -d 10de:",
                "grep -sE 'vfio|nouveau' /proc/cmdline /etc/modprobe.d/*.conf",
            ],
        ),
        step(
            Where::Host,
            format!(
                "Check that the driver was not told to leave the GPU alone: NVreg_ExcludedGpus \
                 in the module options.{host}"
            ),
            &[
                "grep -E 'ExcludedGpus|GpuBlacklist' /proc/driver/nvidia/params",
                "grep -rs NVreg_ExcludedGpus /etc/modprobe.d/",
            ],
        ),
        step(
            Where::Any,
            "Verify: one entry per GPU in the driver's list, and nvidia-smi lists them.",
            &["ls /proc/driver/nvidia/gpus/", "nvidia-smi -L"],
        ),
    ]);
    steps
}

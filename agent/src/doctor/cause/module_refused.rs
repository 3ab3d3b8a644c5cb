//! `module_refused`: an NVIDIA kernel module CUDA needs (nvidia, nvidia_uvm) does not load:
//! the kernel refused it, or no build of it exists for the running kernel.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::ModuleRefused,
    title: "an NVIDIA kernel module (nvidia, nvidia_uvm) does not load: refused by the kernel, or not built for it",
    doc: "Without the nvidia module there is no /proc/driver/nvidia, no /dev/nvidiactl, and \
          cuInit returns 100 (or 999); nvidia-smi says it couldn't communicate with the \
          driver. The kernel refuses an unsigned build under Secure Boot or lockdown \
          (kernel/module/signing.c, security/lockdown/lockdown.c), a build for another kernel \
          (unknown symbols, version magic: kernel/module/), and the open flavour on a GPU \
          without GSP (nv-pci.c); after a kernel upgrade DKMS may have built none for the new \
          kernel (modprobe: Module nvidia not found). nvidia_uvm is refused the same ways \
          while nvidia stays loaded (an unknown GPL-only symbol: 'nvidia_uvm: Unknown symbol'), \
          and then /dev/nvidia-uvm is never made. Any other failed insert names its errno \
          (modprobe: could not insert 'nvidia_uvm': ...). The GPU itself is fine.",
    produces: &[
        (Fits::Host(HostSymptom::DriverNotLoaded), Strong),
        (Fits::Host(HostSymptom::NodesMissing), Weak),
        (Fits::Cuinit(&[100, 999]), Weak),
        (Fits::Open(&["ENOENT", "ENXIO", "ENODEV"]), Weak),
    ],
    needs: &[CudaModuleAbsent],
    rules_out: &[Wsl],
    supports: &[
        (ModuleRefusedSignature, Decisive),
        (ModuleBuiltForOtherKernel, Decisive),
        (ModuleNotBuilt, Decisive),
        (ModuleRefusedBySecurity, Decisive),
        (OpenModuleUnsupportedGpu, Decisive),
        (ModuleLoadFailed, Strong),
        (GpuWithoutDriver, Strong),
        (LockdownOn, Strong),
        (SecureBootOn, Strong),
        (SmiNoDriver, Weak),
        (CtlNodeAbsent, Weak),
    ],
    against: &[
        (GpuHeldElsewhere, Strong),
        (DriverFoundNoGpu, Strong),
        (NoGpuOnPci, Strong),
    ],
    generic: false,
    yields_to: &[CauseId::NoGpu, CauseId::AdapterInitFailure],
    hazards: &[],
    tell_apart: "sudo modprobe nvidia; sudo dmesg | tail -n 5 && mokutil --sb-state: the kernel's own reason for refusing it",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let host = c.host_only();
    let mut steps = Vec::new();
    if c.holds(ModuleRefusedSignature)
        || c.holds(ModuleRefusedBySecurity)
        || c.holds(LockdownOn)
        || c.holds(SecureBootOn)
    {
        steps.push(step(
            Where::Host,
            format!(
                "Secure Boot or lockdown refuses the unsigned module (a DKMS or .run build): \
                 enroll the key DKMS signs with as a Machine Owner Key, confirm it at the next \
                 boot (MOK manager), then load the module. Or install the distribution's signed \
                 driver packages, or turn Secure Boot off.{host}"
            ),
            &[
                "mokutil --sb-state",
                "sudo mokutil --import /var/lib/dkms/mok.pub",
                "sudo reboot",
            ],
        ));
    }
    if c.holds(OpenModuleUnsupportedGpu) {
        steps.push(step(
            Where::Host,
            format!(
                "Install the proprietary flavour of the driver (the open modules need a GPU \
                 with GSP, Turing or newer); remove the open packages first.{host}"
            ),
            &["lspci -nn -d 10de:", "sudo apt-get install nvidia-driver"],
        ));
    }
    steps.push(step(
        Where::Host,
        format!(
            "Build the module for the running kernel (DKMS) and load it; a module built for \
             another kernel (Unknown symbol, version magic, Invalid module format) or none at \
             all (Module nvidia not found) needs the headers of this kernel and a rebuild.{host}"
        ),
        &[
            "uname -r && dkms status",
            "sudo apt-get install linux-headers-$(uname -r) && sudo dkms autoinstall",
            "sudo modprobe nvidia && sudo modprobe nvidia_uvm",
        ],
    ));
    if c.holds(UvmNotLoaded) {
        steps.push(step(
            Where::Host,
            format!(
                "nvidia is loaded but nvidia_uvm is refused: a driver older than the kernel \
                 (symbols the kernel no longer exports to it) needs a newer driver release \
                 that supports this kernel; the kernel's line says which symbol.{host}"
            ),
            &["sudo modprobe nvidia_uvm; sudo dmesg | grep -i nvidia_uvm | tail -n 5"],
        ));
    }
    steps.push(step(
        Where::Any,
        "Verify: the version file exists and nvidia-smi lists the GPUs.",
        &["cat /proc/driver/nvidia/version", "nvidia-smi -L"],
    ));
    steps
}

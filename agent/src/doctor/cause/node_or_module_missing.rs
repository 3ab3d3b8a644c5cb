//! `node_or_module_missing`: nvidia_uvm not loaded, or a device node missing where CUDA runs.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::NodeOrModuleMissing,
    title: "nvidia_uvm is not loaded, or a /dev/nvidia* node is missing where CUDA runs",
    doc: "The nvidia module is loaded, but CUDA also needs nvidia_uvm and its node \
          /dev/nvidia-uvm, which no module creates: nvidia-modprobe (setuid, run by libcuda), \
          udev rules or the container runtime make it (open-gpu-kernel-modules: nvidia-uvm's \
          major is dynamic, its nodes are made from /proc/devices). A container gets only the \
          nodes its runtime passes (the NVIDIA Container Toolkit, CDI, an LXC config). An open \
          of a missing node fails with ENOENT (ENXIO or ENODEV without a driver behind it), and \
          cuInit returns 999 or 100 at once.",
    produces: &[
        (Fits::Open(&["ENOENT", "ENXIO", "ENODEV"]), Strong),
        (Fits::Host(HostSymptom::NodesMissing), Strong),
        // NVML in a container given no GPU node finds none: "No devices were found".
        (Fits::Host(HostSymptom::SmiNoDevices), Weak),
        (Fits::Cuinit(&[999, 100, 3]), Weak),
        (Fits::StartCall(&[100]), Weak),
        (Fits::DeviceCountLow, Weak),
    ],
    needs: &[DriverLoaded],
    rules_out: &[Wsl],
    supports: &[
        (OpenMissing, Strong),
        (UvmOpenMissing, Decisive),
        (UvmNotLoaded, Strong),
        (UvmNodeAbsent, Strong),
        (CtlNodeAbsent, Strong),
        (ContainerWithoutGpu, Strong),
        (UvmMajorMissing, Weak),
        (CuinitQuick, Weak),
    ],
    against: &[
        (NodeNumberMismatch, Strong),
        (DeviceOpensOk, Weak),
        (GpuFellOffBus, Strong),
    ],
    generic: false,
    yields_to: &[CauseId::NoGpu, CauseId::ModuleRefused],
    hazards: &[],
    tell_apart: "lsmod | grep -E '^nvidia(_uvm)? ' && ls -l /dev/nvidia*: the modules loaded and the nodes there (inside the container for a container)",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let mut steps = vec![step(
        Where::Host,
        format!(
            "Load nvidia_uvm and create /dev/nvidia-uvm and /dev/nvidia-uvm-tools with the \
             current major (nvidia-modprobe is what CUDA runs on first use).{}",
            c.host_only()
        ),
        &["sudo modprobe nvidia_uvm", "sudo nvidia-modprobe -u -c 0"],
    )];
    if c.holds(InContainer) {
        steps.push(step(
            Where::Host,
            "Pass every node into the container: with the NVIDIA Container Toolkit use `--gpus` \
             / the nvidia runtime or CDI; in Kubernetes request nvidia.com/gpu; in LXC add each \
             node (lxc.mount.entry, or pct set --dev). Recreate the container after the host \
             nodes exist.",
            &["docker run --device /dev/nvidiactl --device /dev/nvidia0 --device /dev/nvidia-uvm --device /dev/nvidia-uvm-tools <image>"],
        ));
    }
    steps.push(step(
        Where::Any,
        "Verify: the nodes exist and nvidia-uvm has a major.",
        &["ls -l /dev/nvidia*", "grep nvidia /proc/devices"],
    ));
    steps
}

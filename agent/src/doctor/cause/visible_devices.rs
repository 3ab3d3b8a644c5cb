//! `visible_devices`: the process's visible-devices setting names no GPU it has.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::Fits;
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::VisibleDevices,
    title: "CUDA_VISIBLE_DEVICES (or the container's visible devices) names no GPU the process has",
    doc: "CUDA enumerates only the devices CUDA_VISIBLE_DEVICES names, in its order, and stops \
          at the first entry that names none (CUDA programming guide, environment variables): \
          an empty value, -1, an index past the GPUs or an unknown UUID leaves no device, and \
          cuInit returns 100 or the first device call 101. A container's NVIDIA_VISIBLE_DEVICES \
          does the same one level up: it decides which nodes the container gets.",
    produces: &[
        (Fits::Cuinit(&[100]), Strong),
        (Fits::StartCall(&[100, 101]), Strong),
        (Fits::DeviceCountLow, Strong),
    ],
    needs: &[VisibleDevicesSet],
    rules_out: &[],
    supports: &[
        (VisibleDevicesNameNone, Decisive),
        (VisibleDevicesNarrow, Strong),
        (VisibleDevicesSet, Weak),
    ],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[Hazard {
        when: &[VisibleDevicesNameNone],
        severity: Severity::Warning,
    }],
    tell_apart: "nvidia-smi -L && tr '\\0' '\\n' < /proc/<pid>/environ | grep VISIBLE_DEVICES: the GPUs there against those the variables name",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let pid =
        c.o.pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "<pid>".into());
    let environ = format!("tr '\\0' '\\n' < /proc/{pid}/environ | grep VISIBLE_DEVICES");
    vec![step(
        Where::Container,
        "Give the process the devices it needs: CUDA_VISIBLE_DEVICES must name each of them \
         (indexes below the GPU count, or GPU-/MIG- UUIDs nvidia-smi -L lists), or be unset; \
         the container must be given each GPU (NVIDIA_VISIBLE_DEVICES, --gpus, the pod's \
         nvidia.com/gpu).",
        &["nvidia-smi -L", &environ],
    )]
}

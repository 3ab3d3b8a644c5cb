//! `policy_or_partition`: compute mode or MIG refuses the work or hides the GPUs.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::Fits;
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::PolicyOrPartition,
    title: "the GPU's compute mode or MIG partitioning refuses the work or hides the GPUs",
    doc: "Compute mode Prohibited refuses every context, Exclusive_Process every context but \
          one process's: the CUDA call fails with 46, 'all CUDA-capable devices are busy or \
          unavailable' (nvidia-smi documentation). With MIG on, CUDA enumerates MIG devices \
          (a GPU instance with a compute instance) in place of the GPU, and none where no \
          instance exists (MIG User Guide): cuInit or the first CUDA call fails (46, 100, \
          or 3 on some releases) or the device count is low. A process enumerates a single \
          MIG device (MIG User Guide, CUDA Device Enumeration): one that asks for several \
          (CUDA_VISIBLE_DEVICES=0,1,2,3, a data-parallel job) sees one.",
    produces: &[
        (Fits::Cuinit(&[46]), Strong),
        (Fits::StartCall(&[46]), Strong),
        (Fits::LaterCall(&[46]), Strong),
        (Fits::Cuinit(&[100, 3]), Weak),
        (Fits::StartCall(&[100, 101]), Weak),
        (Fits::DeviceCountLow, Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[
        (ComputeProhibited, Decisive),
        (MigWithoutDevices, Decisive),
        (VisibleDevicesParentUnderMig, Decisive),
        (ComputeExclusive, Strong),
        (MigOn, Strong),
        (OtherCudaProcesses, Weak),
    ],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[
        Hazard {
            when: &[ComputeProhibited],
            severity: Severity::Warning,
        },
        Hazard {
            when: &[MigWithoutDevices],
            severity: Severity::Warning,
        },
        Hazard {
            when: &[MigOn, VisibleDevicesSeveral],
            severity: Severity::Warning,
        },
    ],
    tell_apart: "nvidia-smi --query-gpu=index,compute_mode,mig.mode.current --format=csv && nvidia-smi -L: the compute mode, MIG mode and MIG devices of each GPU",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let host = c.host_only();
    let mig = step(
        Where::Host,
        format!(
            "With MIG on, CUDA sees MIG devices only: create GPU instances with their default \
             compute instances from a profile nvidia-smi lists (MIG User Guide), or turn MIG \
             off (nvidia-smi -mig 0, then reset the GPU); a process uses one MIG device: \
             give each process its own by UUID (CUDA_VISIBLE_DEVICES=MIG-<uuid>), or turn MIG \
             off for a job that spans several GPUs.{host}"
        ),
        &[
            "nvidia-smi mig -lgip",
            "sudo nvidia-smi mig -cgi <profile> -C",
            "nvidia-smi -L",
        ],
    );
    let mode = step(
        Where::Host,
        format!(
            "If an exclusive or prohibited compute mode is not intended, set it back to Default \
             (per GPU with -i); under Exclusive_Process only one process may hold a context.{host}"
        ),
        &[
            "nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid --format=csv",
            "sudo nvidia-smi -c DEFAULT",
        ],
    );
    if c.holds(MigOn) {
        vec![mig, mode]
    } else {
        vec![mode, mig]
    }
}

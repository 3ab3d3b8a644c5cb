//! `fabric_not_ready`: an NVSwitch system whose fabric is not ready.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::Fits;
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::FabricNotReady,
    title: "NVSwitch fabric not ready: Fabric Manager not running, not done, or not the driver's version",
    doc: "On NVSwitch systems (HGX/DGX) each GPU must be registered with the fabric by NVIDIA \
          Fabric Manager, of exactly the driver's version, before CUDA can use it (Fabric \
          Manager user guide): until then cuInit returns 802 (CUDA_ERROR_SYSTEM_NOT_READY), \
          later processes 304, and nvidia-smi -q shows the fabric state In Progress or Not \
          Started. On an NVSwitch system 802 is the fabric's own code; without NVSwitch it points \
          elsewhere.",
    produces: &[
        (Fits::Cuinit(&[802]), Decisive),
        (Fits::StartCall(&[802]), Decisive),
        (Fits::Cuinit(&[304]), Weak),
    ],
    needs: &[NvswitchPresent],
    rules_out: &[DriverRegisteredNoGpu, Wsl],
    supports: &[
        (FabricIncomplete, Strong),
        (FabricManagerNotRunning, Strong),
        (NvswitchPresent, Weak),
    ],
    against: &[(FabricComplete, Strong)],
    generic: false,
    yields_to: &[],
    hazards: &[
        Hazard {
            when: &[NvswitchPresent, FabricIncomplete],
            severity: Severity::Critical,
        },
        Hazard {
            when: &[NvswitchPresent, FabricManagerNotRunning],
            severity: Severity::Critical,
        },
    ],
    tell_apart: "nvidia-smi -q | grep -A3 Fabric: State Completed with Status Success once Fabric Manager has registered the GPU",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let ver = c.driver_version("the driver's");
    vec![
        step(
            Where::Host,
            format!(
                "Start NVIDIA Fabric Manager. It must be the same version as the driver ({ver}): \
                 install the nvidia-fabricmanager package of that exact version.{}",
                c.host_only()
            ),
            &[
                "sudo systemctl enable --now nvidia-fabricmanager",
                "systemctl status nvidia-fabricmanager",
            ],
        ),
        step(
            Where::Any,
            "Verify: every GPU's fabric state must be Completed before CUDA starts.",
            &["nvidia-smi -q | grep -A 3 -i fabric"],
        ),
    ]
}

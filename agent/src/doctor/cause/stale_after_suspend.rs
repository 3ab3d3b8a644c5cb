//! `stale_after_suspend`: driver state broken by a suspend and resume.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::Fits;
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::StaleAfterSuspend,
    title: "driver state broken by a suspend and resume",
    doc: "Without NVIDIA's suspend services (nvidia-suspend/resume, \
          NVreg_PreserveVideoMemoryAllocations=1: NVIDIA driver README, 'Configuring Power \
          Management Support'), nvidia_uvm comes back from a suspend with stale state: opens \
          succeed and cuInit returns 999 at once until nvidia_uvm is reloaded.",
    produces: &[(Fits::Cuinit(&[999]), Strong), (Fits::Cuinit(&[3, 100]), Weak)],
    needs: &[ResumedAfterUvmLoad],
    rules_out: &[Wsl],
    supports: &[
        (ResumedAfterUvmLoad, Strong),
        (DeviceOpensOk, Weak),
        (CuinitQuick, Weak),
    ],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[Hazard {
        when: &[ResumedAfterUvmLoad],
        severity: Severity::Warning,
    }],
    tell_apart: "journalctl -k -b | grep -E 'nvidia-uvm: Loaded|PM: suspend exit': a resume after nvidia_uvm was loaded",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    vec![
        step(
            Where::Host,
            format!(
                "Stop GPU users (containers too), then reload nvidia_uvm; a reboot also works.{}",
                c.host_only()
            ),
            &[
                "sudo fuser -v /dev/nvidia-uvm",
                "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            ],
        ),
        step(
            Where::Host,
            "Prevent it: enable NVIDIA's suspend/resume services (with `options nvidia \
             NVreg_PreserveVideoMemoryAllocations=1`), or keep GPU hosts from suspending.",
            &["sudo systemctl enable nvidia-suspend.service nvidia-resume.service nvidia-hibernate.service"],
        ),
    ]
}

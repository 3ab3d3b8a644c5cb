//! `slow_init`: cuInit succeeds but takes seconds.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::SlowInit,
    title: "cuInit succeeds but takes seconds: the GPUs are brought up again at each start (persistence off)",
    doc: "Without persistence mode or nvidia-persistenced, the driver tears a GPU down when \
          its last client closes it and brings it up again in the next first open (NVIDIA \
          driver persistence documentation): every CUDA start pays seconds per GPU, more on \
          large GPUs and in confidential-computing VMs.",
    produces: &[
        (Fits::Slow, Strong),
        (Fits::Host(HostSymptom::SmiTimedOut), Weak),
    ],
    needs: &[],
    rules_out: &[],
    supports: &[
        (FirstGpuOpenSlow, Strong),
        (PersistenceOff, Strong),
        (PersistencedNotRunning, Strong),
    ],
    against: &[],
    generic: false,
    yields_to: &[CauseId::DriverHang],
    hazards: &[Hazard {
        when: &[PersistenceOff],
        severity: Severity::Info,
    }],
    tell_apart: "nvidia-smi -q | grep 'Persistence Mode' && time nvidia-smi -L: persistence off and a slow first call",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let mut steps = vec![step(
        Where::Host,
        format!(
            "Run the NVIDIA persistence daemon so the driver keeps GPU state between clients.{}",
            c.host_only()
        ),
        &[
            "sudo systemctl enable --now nvidia-persistenced",
            "nvidia-smi -q | grep -i 'persistence mode'",
        ],
    )];
    if !c.holds(PersistenceOff) && !c.holds(FirstGpuOpenSlow) {
        steps.push(step(
            Where::Any,
            "The GPUs were up already: look for the slow driver calls of this cuInit in \
             uvmwatch's log (event=driver_ioctl, \"slow driver call\"; --slow-ioctl sets the \
             threshold).",
            &["journalctl -u uvmwatch -o cat | grep 'slow driver call' | tail"],
        ));
    }
    steps
}

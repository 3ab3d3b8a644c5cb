//! `driver_hang`: a thread is stuck inside the NVIDIA driver, or the driver is wedged.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::DriverHang,
    title: "a thread is stuck inside the NVIDIA driver, or the driver is wedged",
    doc: "A driver call that does not return leaves its thread in the kernel (state D, its \
          wchan and stack in nvidia_uvm or nvidia frames); the kernel's watchdogs report it as \
          a soft lockup, an RCU stall or a hung task (kernel/watchdog.c, kernel/hung_task.c). \
          After an oops in nvidia code the driver stays wedged until reboot, and later calls \
          fail or hang. It names no mechanism: a more specific cause that explains the same \
          hang (HMM set-up, a GPU lost) comes first.",
    produces: &[
        (Fits::CallHung(None), Strong),
        (Fits::CuinitHung, Weak),
        (Fits::Cuinit(&[999, 3, 100]), Weak),
        (Fits::Host(HostSymptom::DriverHangLogged), Strong),
        (Fits::Host(HostSymptom::DriverWarnLogged), Weak),
        (Fits::Host(HostSymptom::SmiTimedOut), Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[
        // The hang itself, seen from /proc: it confirms the symptom more than it names a cause.
        (ThreadInDriver, Weak),
        (StackOutsideHmm, Strong),
        (DriverLockupLogged, Strong),
        (DriverOopsLogged, Decisive),
        (DriverWarnLogged, Weak),
    ],
    against: &[
        (StackInHmmSetup, Strong),
        (GpuFellOffBus, Strong),
        (DeviceOpensOk, Weak),
    ],
    generic: true,
    yields_to: &[],
    hazards: &[],
    tell_apart: "sudo cat /proc/<pid>/task/<tid>/stack: frames in uvm_* or nv_* functions mean the driver holds the thread",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let dir = c.o.stuck_thread_dir();
    let stack = format!("sudo cat {dir}/stack");
    let mut steps = Vec::new();
    if c.holds(RegisterGpuHung) {
        steps.push(step(
            Where::Any,
            "UVM_REGISTER_GPU is where nvidia_uvm HMM set-up hangs: on an open module with HMM \
             on, follow hmm_setup_failure (docs/runbooks/hmm_setup_failure.md) first.",
            &["cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"],
        ));
    }
    steps.extend([
        step(
            Where::Any,
            "Collect evidence first: a reboot loses it.",
            &[
                &stack,
                "sudo dmesg -T | grep -iE 'nvrm|nvidia|uvm|hung_task|soft lockup|rcu'",
                "sudo nvidia-bug-report.sh",
            ],
        ),
        step(
            Where::Host,
            format!(
                "A thread in D state inside the driver cannot be killed. With every GPU process \
                 stopped, `nvidia-smi --gpu-reset -i <gpu>` may recover it; after an oops the \
                 driver stays wedged until reboot.{}",
                c.host_only()
            ),
            &["sudo reboot"],
        ),
        step(
            Where::Host,
            "If it recurs, upgrade the driver and report it with the bug report above.",
            &[],
        ),
    ]);
    steps
}

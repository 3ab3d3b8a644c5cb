//! `fork_after_init`: CUDA used in a child forked after its parent's cuInit.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::Fits;
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::ForkAfterInit,
    title: "CUDA used in a child forked (without exec) after its parent initialized CUDA",
    doc: "CUDA state does not survive fork(): in a child forked from a process that ran \
          cuInit, cuInit returns 3 within microseconds without opening a device (CUDA \
          programming guide); frameworks refuse earlier still, in user space ('Cannot \
          re-initialize CUDA in forked subprocess', PyTorch), so no CUDA call comes at all. \
          Start workers with spawn.",
    produces: &[(Fits::Fork, Decisive), (Fits::Cuinit(&[3]), Strong)],
    needs: &[ForkedAfterInit],
    rules_out: &[],
    supports: &[(ForkedAfterInit, Decisive), (NoDeviceOpens, Weak)],
    against: &[(DeviceOpensOk, Strong)],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "strace -f -e trace=clone,clone3,fork,vfork,execve <program>: a child cloned without execve after the parent's cuInit",
    fix,
};

fn fix(_: &Ctx) -> Vec<FixStep> {
    vec![step(
        Where::Container,
        "In the workload: start workers with spawn (or forkserver), not fork, or initialize \
         CUDA only in the children (nothing in the parent may touch CUDA before the workers \
         start, imports included). Python: put this in the main module before any worker \
         starts; vLLM: VLLM_WORKER_MULTIPROC_METHOD=spawn.",
        &["multiprocessing.set_start_method(\"spawn\", force=True)"],
    )]
}

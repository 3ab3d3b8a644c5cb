//! The floor reference of the overhead benchmark (`agent/benches/overhead.rs`): programs that
//! do one map operation, a per-CPU counter increment, and nothing else. `uvmwatch
//! bench-floor` attaches them, through the agent's own loader and its choice of backend, to
//! every hook the agent attaches (the tracepoints and raw tracepoints, or the fentry/fexit functions), so that
//! what the floor costs is what the mechanism costs (the syscall slow path and the
//! tracepoint's record, or the trampoline, and the program's call) and the agent's cost above
//! it is what its programs' bodies add. `uvmwatch run` never loads them: the loader loads
//! programs per registry entry, and no entry of the agent's registry names them. A
//! trampoline program is loaded for one function, so there is one per function and
//! direction.

use aya_ebpf::{
    macros::{fentry, fexit, raw_tracepoint, tracepoint},
    programs::{FEntryContext, FExitContext, RawTracePointContext, TracePointContext},
};

use crate::maps::FLOOR_HITS;

/// Counts one hit on this CPU.
#[inline(always)]
fn hit() -> u32 {
    if let Some(p) = FLOOR_HITS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, written only by this CPU while the program runs.
        unsafe { *p += 1 };
    }
    0
}

/// On a tracepoint: reads nothing of the record.
#[tracepoint]
pub fn floor_tp(_ctx: TracePointContext) -> u32 {
    hit()
}

/// On a raw tracepoint: reads none of its arguments.
#[raw_tracepoint]
pub fn floor_raw_tp(_ctx: RawTracePointContext) -> u32 {
    hit()
}

/// On `__x64_sys_ioctl`'s entry.
#[fentry(function = "__x64_sys_ioctl")]
pub fn floor_fe_ioctl(_ctx: FEntryContext) -> u32 {
    hit()
}

/// On `__x64_sys_ioctl`'s exit.
#[fexit(function = "__x64_sys_ioctl")]
pub fn floor_fx_ioctl(_ctx: FExitContext) -> u32 {
    hit()
}

/// On `chrdev_open`'s entry.
#[fentry(function = "chrdev_open")]
pub fn floor_fe_chrdev(_ctx: FEntryContext) -> u32 {
    hit()
}

/// On `chrdev_open`'s exit.
#[fexit(function = "chrdev_open")]
pub fn floor_fx_chrdev(_ctx: FExitContext) -> u32 {
    hit()
}

/// On `do_filp_open`'s exit.
#[fexit(function = "do_filp_open")]
pub fn floor_fx_open(_ctx: FExitContext) -> u32 {
    hit()
}

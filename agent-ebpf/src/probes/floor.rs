//! The floor reference of the overhead benchmark (`agent/benches/overhead.rs`): one program
//! that does one map operation, a per-CPU counter increment, and nothing else. `uvmwatch
//! bench-floor` attaches it, through the agent's own loader, to every tracepoint the agent
//! attaches, so that what the floor costs is what the mechanism costs (the syscall slow path,
//! the tracepoint's record, the program's call) and the agent's cost above it is what its
//! programs' bodies add. `uvmwatch run` never loads it: the loader loads programs per
//! registry entry, and no entry of the agent's registry names it.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};

use crate::maps::FLOOR_HITS;

/// Counts one hit on this CPU; reads nothing of the record.
#[tracepoint]
pub fn floor_tp(_ctx: TracePointContext) -> u32 {
    if let Some(p) = FLOOR_HITS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, written only by this CPU while the program runs.
        unsafe { *p += 1 };
    }
    0
}

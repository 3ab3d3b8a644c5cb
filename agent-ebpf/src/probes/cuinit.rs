//! `cuInit` uprobe and uretprobe, attached by user space to each `libcuda.so.1` it finds.
//! Entry goes to `INFLIGHT_CUINIT` and is reported; the return removes it and reports the
//! `CUresult`. A `cuInit` that hangs never returns, so its entry stays: that is how user space
//! sees it.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use uvmwatch_common::{
    counter, CuinitEvent, InflightCuinit, ProcState, EVENT_CUINIT_ENTER, EVENT_CUINIT_EXIT,
};

use crate::helpers::{bump, config, emit, ensure_proc, header, ids};
use crate::maps::{INFLIGHT_CUINIT, PROCS};

/// Uprobe on `cuInit(unsigned int Flags)`.
#[uprobe]
pub fn cuinit_enter(ctx: ProbeContext) -> u32 {
    let _ = try_cuinit_enter(&ctx);
    0
}

fn try_cuinit_enter(ctx: &ProbeContext) -> Option<()> {
    config()?;
    let (tgid, tid) = ids();
    let flags: u32 = ctx.arg(0).unwrap_or(0);
    let now = unsafe { bpf_ktime_get_ns() };
    let e = InflightCuinit {
        start_ns: now,
        tgid,
        flags,
    };
    if INFLIGHT_CUINIT.insert(&tid, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    }
    // Puts the process in `PROCS` so its ioctls, children and exit are followed from the
    // first call.
    let p = ensure_proc(tgid, now);
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_ENTER, tgid, tid, now),
        start_ns: now,
        ret: 0,
        flags,
        entry_seen: 1,
        forked_from: p.map(forked_from).unwrap_or(0),
        _pad: 0,
    };
    emit(&ev);
    Some(())
}

/// The parent a process was forked from, while it has not exec'ed since the fork.
#[inline(always)]
fn forked_from(p: ProcState) -> u32 {
    if p.parent_tgid != 0 && p.execed == 0 {
        p.parent_tgid
    } else {
        0
    }
}

/// Uretprobe on `cuInit`: the `CUresult` it returned.
#[uretprobe]
pub fn cuinit_exit(ctx: RetProbeContext) -> u32 {
    let _ = try_cuinit_exit(&ctx);
    0
}

fn try_cuinit_exit(ctx: &RetProbeContext) -> Option<()> {
    config()?;
    let (tgid, tid) = ids();
    let ret: i32 = ctx.ret();
    let now = unsafe { bpf_ktime_get_ns() };
    let (start, flags, seen) = match unsafe { INFLIGHT_CUINIT.get(&tid) } {
        Some(e) => (e.start_ns, e.flags, 1),
        None => (now, 0, 0),
    };
    let _ = INFLIGHT_CUINIT.remove(&tid);
    let parent = unsafe { PROCS.get(&tgid) }
        .map(|p| forked_from(*p))
        .unwrap_or(0);
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_EXIT, tgid, tid, now),
        start_ns: start,
        ret: ret as i64,
        flags,
        entry_seen: seen,
        forked_from: parent,
        _pad: 0,
    };
    emit(&ev);
    Some(())
}

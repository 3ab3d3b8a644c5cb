//! `cuInit` uprobe and uretprobe, attached by user space to each `libcuda.so.1` it finds.
//! Entry goes to `INFLIGHT_CUINIT` and is reported; the return removes it and reports the
//! `CUresult`. A `cuInit` that hangs never returns, so its entry stays: that is how user space
//! sees it.
//!
//! A library user space has not attached to yet (a process opened it, and calls `cuInit` at
//! once) has no probes to see its first `cuInit`: its open marks the process
//! (`ProcState::unprobed_load_ns`), and the process's first driver call (a device open or an
//! ioctl on an NVIDIA node) starts a *late* call in `INFLIGHT_CUINIT` instead ([`in_cuinit`]),
//! reported like an entry. Its driver calls are then the call's, as a seen one's are, until it
//! ends: the uretprobe sees it return (when it was attached in time for that), the thread
//! enters `cuInit` or a probed context call again (the late one had returned), the process
//! exec's, the thread exits (`sched.rs`), or user space finds it quiet.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use uvmwatch_common::{
    counter, CuinitEvent, InflightCuinit, ProcState, CUINIT_LATE, EVENT_CUINIT_ENTER,
    EVENT_CUINIT_EXIT, LATE_END_RETURN,
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
    // A late call still open on the thread had returned before this one began.
    end_late(tgid, tid, now, uvmwatch_common::LATE_END_NEXT_CUINIT);
    let e = InflightCuinit {
        start_ns: now,
        tgid,
        flags,
        late: 0,
        _pad: 0,
    };
    if INFLIGHT_CUINIT.insert(&tid, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    }
    // Puts the process in `PROCS` so its ioctls, children and exit are followed from the
    // first call.
    let p = ensure_proc(tgid, now);
    probed_call(tgid);
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_ENTER, tgid, tid, now),
        start_ns: now,
        ret: 0,
        flags,
        entry_seen: 1,
        forked_from: p.map(forked_from).unwrap_or(0),
        late: 0,
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
    let (start, flags, seen, late) = match unsafe { INFLIGHT_CUINIT.get(&tid) } {
        // A late call the uretprobe saw return: its start is its first driver call's.
        Some(e) if e.late != 0 => (e.start_ns, e.flags, 0, LATE_END_RETURN),
        Some(e) => (e.start_ns, e.flags, 1, 0),
        None => (now, 0, 0, 0),
    };
    let _ = INFLIGHT_CUINIT.remove(&tid);
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_EXIT, tgid, tid, now),
        start_ns: start,
        ret: ret as i64,
        flags,
        entry_seen: seen,
        forked_from: parent_of(tgid),
        late,
    };
    emit(&ev);
    Some(())
}

#[inline(always)]
fn parent_of(tgid: u32) -> u32 {
    unsafe { PROCS.get(&tgid) }
        .map(|p| forked_from(*p))
        .unwrap_or(0)
}

/// Whether the thread's driver call starting at `start_ns` is inside a `cuInit`: one the
/// probes saw enter, or a late one, started now when this thread loaded a libcuda before
/// its probes were attached and makes its first driver call since. Called only for calls
/// on NVIDIA nodes (a device open, an ioctl on one).
#[inline(always)]
pub fn in_cuinit(tgid: u32, tid: u32, start_ns: u64) -> bool {
    if unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some() {
        return true;
    }
    let Some(p) = PROCS.get_ptr_mut(&tgid) else {
        return false;
    };
    if unsafe { (*p).unprobed_load_ns } == 0 || unsafe { (*p).unprobed_load_tid } != tid {
        return false;
    }
    unsafe { (*p).unprobed_load_ns = 0 };
    let parent = forked_from(unsafe { *p });
    let e = InflightCuinit {
        start_ns,
        tgid,
        flags: 0,
        late: 1,
        _pad: 0,
    };
    if INFLIGHT_CUINIT.insert(&tid, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
        return false;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_ENTER, tgid, tid, now),
        start_ns,
        ret: 0,
        flags: 0,
        entry_seen: 0,
        forked_from: parent,
        late: CUINIT_LATE,
    };
    emit(&ev);
    true
}

/// Ends the thread's late `cuInit`, if it has one, for `why` (a `LATE_END_*` value): the
/// thread is past it (a probed libcuda call began, or the process exec'ed).
#[inline(always)]
pub fn end_late(tgid: u32, tid: u32, now: u64, why: u32) {
    let Some(e) = (unsafe { INFLIGHT_CUINIT.get(&tid) }).copied() else {
        return;
    };
    if e.late == 0 {
        return;
    }
    let _ = INFLIGHT_CUINIT.remove(&tid);
    let ev = CuinitEvent {
        header: header(EVENT_CUINIT_EXIT, tgid, tid, now),
        start_ns: e.start_ns,
        ret: 0,
        flags: e.flags,
        entry_seen: 0,
        forked_from: parent_of(tgid),
        late: why,
    };
    emit(&ev);
}

/// A probed libcuda function was entered by `tgid`: its probes are attached, so a driver
/// call of the process from now on needs no late `cuInit` to be seen.
#[inline(always)]
pub fn probed_call(tgid: u32) {
    if let Some(p) = PROCS.get_ptr_mut(&tgid) {
        unsafe { (*p).unprobed_load_ns = 0 };
    }
}

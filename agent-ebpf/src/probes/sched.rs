//! Process lifecycle: `sched_process_fork` puts the child of a process in `PROCS` there too
//! (its inherited fds are identified by their files like its parent's), `sched_process_exec`
//! reports a new image, `sched_process_exit` drops calls in flight (reporting a thread that
//! died inside one) and, for the last thread, the process.
//!
//! They are raw tracepoints: each program gets the tracepoint's `TP_PROTO` arguments
//! (`include/trace/events/sched.h`) as they are, not a record, and detaching one does not wait
//! for a grace period (a `sched:*` event attached through perf waits for one, serialised
//! under the kernel's `event_mutex`, about 80 ms each on 6.18: `docs/probes.md`, stop time).
//! What moves between kernels comes from BTF: `task_struct.pid` (`Config::task_pid_off`),
//! and whether `sched_process_exit` passes `group_dead`, which picks its program.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::raw_tracepoint, programs::RawTracePointContext};
use uvmwatch_common::{
    ProcState, TaskEvent, DIED_IN_CUINIT, DIED_IN_IOCTL, DIED_IN_LATE_CUINIT, EVENT_DIED_IN_CALL,
    EVENT_EXEC, EVENT_FORK, EVENT_PROC_EXIT, LATE_END_EXEC,
};

use super::cuinit::end_late;
use crate::helpers::{config, emit, header, ids, kread, maybe_tracked, track, untrack};
use crate::maps::{DEVCOUNT_SENT, INFLIGHT_CUINIT, INFLIGHT_IOCTL, PENDING_OPEN, PROCS};

/// `sched_process_fork`, `TP_PROTO(struct task_struct *parent, struct task_struct *child)`,
/// in the parent.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_fork(ctx: RawTracePointContext) -> u32 {
    let _ = try_fork(&ctx);
    0
}

fn try_fork(ctx: &RawTracePointContext) -> Option<()> {
    let cfg = config()?;
    let (tgid, tid) = ids();
    unsafe { PROCS.get(&tgid) }?;
    if cfg.task_pid_off == 0 {
        return None;
    }
    let child_task: u64 = ctx.arg(1);
    let child: i32 = kread(child_task + cfg.task_pid_off as u64)?;
    if child <= 0 {
        return None;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // For a new thread this makes an entry under the thread's id that is never looked up
    // as a tgid; the thread's exit removes it.
    // A child forked before the parent's new libcuda was probed may call cuInit before it
    // is: it inherits the mark, for its own main thread.
    let unprobed = unsafe { PROCS.get(&tgid) }
        .map(|p| p.unprobed_load_ns)
        .unwrap_or(0);
    let st = ProcState {
        since_ns: now,
        parent_tgid: tgid,
        execed: 0,
        unprobed_load_ns: unprobed,
        unprobed_load_tid: child as u32,
        _pad: 0,
    };
    let _ = track(child as u32, &st);
    let ev = TaskEvent {
        header: header(EVENT_FORK, tgid, tid, now),
        aux: child as u32,
        ..TaskEvent::default()
    };
    emit(&ev);
    Some(())
}

/// `sched_process_exec`, `TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm
/// *bprm)`, in the new image of a process in `PROCS`: it is no longer a copy of its parent
/// (its close-on-exec fds are gone from its fd table, so nothing identifies them). It needs
/// none of the arguments: the new image is the current task's.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_exec(_ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = ids();
    if let Some(p) = PROCS.get_ptr_mut(&tgid) {
        let now = unsafe { bpf_ktime_get_ns() };
        unsafe { (*p).execed = 1 };
        // The libcuda of the old image is gone, and so is a late cuInit of it.
        unsafe { (*p).unprobed_load_ns = 0 };
        end_late(tgid, tid, now, LATE_END_EXEC);
        // A new image asks for its device count afresh.
        let _ = DEVCOUNT_SENT.remove(&tgid);
        let ev = TaskEvent {
            header: header(EVENT_EXEC, tgid, tid, now),
            ..TaskEvent::default()
        };
        emit(&ev);
    }
    0
}

/// `sched_process_exit`, `TP_PROTO(struct task_struct *p)` (6.1, 6.12: before the kernel
/// added `group_dead`), for every exiting thread: drops calls in flight (so a thread that dies
/// mid-call leaves no phantom stall) and, for the last thread, the process state. Without the
/// argument, the exit of the thread whose tid is the tgid counts as the process's.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_exit(_ctx: RawTracePointContext) -> u32 {
    let _ = try_exit(None);
    0
}

/// [`sched_exit`] where the tracepoint is `TP_PROTO(struct task_struct *p, bool group_dead)`
/// (6.18). A program of its own: the kernel refuses to attach a raw tracepoint program that
/// may read past the tracepoint's arguments (`max_ctx_offset` in `__bpf_probe_register`,
/// kernel/trace/bpf_trace.c), even behind a branch never taken. User space loads the one
/// that fits the kernel's BTF.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_exit_group_dead(ctx: RawTracePointContext) -> u32 {
    let _ = try_exit(Some(ctx.arg::<u64>(1) != 0));
    0
}

fn try_exit(group_dead: Option<bool>) -> Option<()> {
    config()?;
    let (tgid, tid) = ids();
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = PENDING_OPEN.remove(&tid);
    let cu = unsafe { INFLIGHT_CUINIT.get(&tid) }.copied();
    let io = unsafe { INFLIGHT_IOCTL.get(&tid) }.copied();
    if cu.is_some() || io.is_some() {
        let mut ev = TaskEvent {
            header: header(EVENT_DIED_IN_CALL, tgid, tid, now),
            ..TaskEvent::default()
        };
        if let Some(c) = cu {
            ev.what |= DIED_IN_CUINIT;
            if c.late != 0 {
                ev.what |= DIED_IN_LATE_CUINIT;
            }
            ev.start_ns = c.start_ns;
            let _ = INFLIGHT_CUINIT.remove(&tid);
        }
        if let Some(i) = io {
            ev.what |= DIED_IN_IOCTL;
            ev.aux = i.cmd;
            ev.ioctl_start_ns = i.start_ns;
            ev.node = i.node;
            ev.minor = i.minor;
            let _ = INFLIGHT_IOCTL.remove(&tid);
        }
        emit(&ev);
    }
    if tid != tgid {
        // Entry made by sched_fork for this thread, if any.
        if maybe_tracked(tid) {
            untrack(tid);
        }
    }
    let group_dead = group_dead.unwrap_or(tid == tgid);
    if group_dead {
        let _ = DEVCOUNT_SENT.remove(&tgid);
    }
    if group_dead && unsafe { PROCS.get(&tgid) }.is_some() {
        untrack(tgid);
        let ev = TaskEvent {
            header: header(EVENT_PROC_EXIT, tgid, tid, now),
            ..TaskEvent::default()
        };
        emit(&ev);
    }
    Some(())
}

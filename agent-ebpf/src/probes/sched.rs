//! Process lifecycle: `sched_process_fork` puts the child of a process in `PROCS` there too
//! (its inherited fds are identified by their files like its parent's), `sched_process_exec`
//! reports a new image, `sched_process_exit` drops calls in flight (reporting a thread that
//! died inside one) and, for the last thread, the process.
//!
//! Two fields move between kernels, so these programs do not read them through the structs
//! below: user space reads their offsets from the tracepoints' `format` files at start and
//! hands them over in `Config` (`fork_child_pid_off`, `exit_group_dead_off`).

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use uvmwatch_common::{
    ProcState, TaskEvent, DIED_IN_CUINIT, DIED_IN_IOCTL, DIED_IN_LATE_CUINIT, EVENT_DIED_IN_CALL,
    EVENT_EXEC, EVENT_FORK, EVENT_PROC_EXIT, LATE_END_EXEC,
};

use super::cuinit::end_late;
use super::TraceEntry;
use crate::helpers::{config, emit, header, ids, maybe_tracked, track, untrack};
use crate::maps::{DEVCOUNT_SENT, INFLIGHT_CUINIT, INFLIGHT_IOCTL, PENDING_OPEN, PROCS};

/// `sched:sched_process_fork`, 6.18:
///
/// ```text
/// name: sched_process_fork
/// ID: 366
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:__data_loc char[] parent_comm;  offset:8;  size:4;  signed:0;
///   field:pid_t parent_pid;  offset:12;  size:4;  signed:1;
///   field:__data_loc char[] child_comm;  offset:16;  size:4;  signed:0;
///   field:pid_t child_pid;  offset:20;  size:4;  signed:1;
///
/// print fmt: "comm=%s pid=%d child_comm=%s child_pid=%d", ...
/// ```
///
/// 6.1 and 6.12 (`include/trace/events/sched.h` of their Debian headers) keep the comms as
/// `char[16]` arrays instead: `parent_comm` @8, `parent_pid` @24, `child_comm` @28,
/// `child_pid` @44. So `child_pid` is read at `Config::fork_child_pid_off` (user space falls
/// back to 44 when the `format` cannot be read), not through this struct.
#[repr(C)]
#[allow(dead_code)] // the 6.18 layout, for reference; see above
struct SchedProcessForkArgs {
    entry: TraceEntry,
    parent_comm: u32,
    parent_pid: i32,
    child_comm: u32,
    child_pid: i32,
}

/// `sched:sched_process_exec`, 6.18 (the same fields since long before 6.1):
///
/// ```text
/// name: sched_process_exec
/// ID: 365
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:__data_loc char[] filename;  offset:8;  size:4;  signed:0;
///   field:pid_t pid;  offset:12;  size:4;  signed:1;
///   field:pid_t old_pid;  offset:16;  size:4;  signed:1;
///
/// print fmt: "filename=%s pid=%d old_pid=%d", ...
/// ```
///
/// The program needs none of it: the new image is the current task's.
#[repr(C)]
#[allow(dead_code)] // the layout, for reference; see above
struct SchedProcessExecArgs {
    entry: TraceEntry,
    filename: u32,
    pid: i32,
    old_pid: i32,
}

/// `sched:sched_process_exit`, 6.18:
///
/// ```text
/// name: sched_process_exit
/// ID: 369
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:char comm[16];  offset:8;  size:16;  signed:0;
///   field:pid_t pid;  offset:24;  size:4;  signed:1;
///   field:int prio;  offset:28;  size:4;  signed:1;
///   field:bool group_dead;  offset:32;  size:1;  signed:0;
///
/// print fmt: "comm=%s pid=%d prio=%d group_dead=%s", ...
/// ```
///
/// 6.1 and 6.12 have no `group_dead` (the record ends after `prio`). So it is read at
/// `Config::exit_group_dead_off` when user space found it in the `format` (0 otherwise: then
/// the exit of the thread whose tid is the tgid counts as the process's), not through this
/// struct.
#[repr(C)]
#[allow(dead_code)] // the 6.18 layout, for reference; see above
struct SchedProcessExitArgs {
    entry: TraceEntry,
    comm: [u8; 16],
    pid: i32,
    prio: i32,
    group_dead: u8,
}

/// `sched:sched_process_fork` ([`SchedProcessForkArgs`]), in the parent.
#[tracepoint]
pub fn sched_fork(ctx: TracePointContext) -> u32 {
    let _ = try_fork(&ctx);
    0
}

fn try_fork(ctx: &TracePointContext) -> Option<()> {
    let cfg = config()?;
    let (tgid, tid) = ids();
    unsafe { PROCS.get(&tgid) }?;
    let child: i32 = unsafe { ctx.read_at(cfg.fork_child_pid_off as usize) }.ok()?;
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

/// `sched:sched_process_exec` ([`SchedProcessExecArgs`]), in the new image of a process in
/// `PROCS`: it is no longer a copy of its parent (its close-on-exec fds are gone from its fd
/// table, so nothing identifies them).
#[tracepoint]
pub fn sched_exec(_ctx: TracePointContext) -> u32 {
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

/// `sched:sched_process_exit` ([`SchedProcessExitArgs`]), for every exiting thread: drops
/// calls in flight (so a thread that dies mid-call leaves no phantom stall) and, for the last
/// thread, the process state.
#[tracepoint]
pub fn sched_exit(ctx: TracePointContext) -> u32 {
    let _ = try_exit(&ctx);
    0
}

fn try_exit(ctx: &TracePointContext) -> Option<()> {
    let cfg = config()?;
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
    let group_dead = if cfg.exit_group_dead_off != 0 {
        unsafe { ctx.read_at::<u8>(cfg.exit_group_dead_off as usize) }.unwrap_or(0) != 0
    } else {
        tid == tgid
    };
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

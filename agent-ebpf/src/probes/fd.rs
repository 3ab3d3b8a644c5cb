//! `close`, `dup`, `dup2`, `dup3` and `fcntl(F_DUPFD, F_DUPFD_CLOEXEC)`: keep `FDS` true for
//! tracked fds. `close` forgets one; the others copy it to the new fd at exit (or forget the
//! target of a `dup2`/`dup3` that replaced a tracked fd with an untracked file).

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use uvmwatch_common::{counter, FdInfo, FD_CLOEXEC};

use super::{SysExitArgs, SyscallHead, O_CLOEXEC};
use crate::helpers::{bump, ids, resolve_fd, track_fd, untrack_fd};
use crate::maps::{PendingDup, PENDING_DUP};

/// `F_DUPFD` and `F_DUPFD_CLOEXEC` (`include/uapi/linux/fcntl.h`).
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

/// `syscalls:sys_enter_close`, 6.18:
///
/// ```text
/// name: sys_enter_close
/// ID: 776
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int fd;  offset:16;  size:8;  signed:0;
///
/// print fmt: "fd: 0x%08lx", ((unsigned long)(REC->fd))
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterCloseArgs {
    head: SyscallHead,
    fd: u64,
}

/// `syscalls:sys_enter_dup`, 6.18:
///
/// ```text
/// name: sys_enter_dup
/// ID: 916
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int fildes;  offset:16;  size:8;  signed:0;
///
/// print fmt: "fildes: 0x%08lx", ((unsigned long)(REC->fildes))
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterDupArgs {
    head: SyscallHead,
    fildes: u64,
}

/// `syscalls:sys_enter_dup2` (not on arm64), 6.18:
///
/// ```text
/// name: sys_enter_dup2
/// ID: 918
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int oldfd;  offset:16;  size:8;  signed:0;
///   field:unsigned int newfd;  offset:24;  size:8;  signed:0;
///
/// print fmt: "oldfd: 0x%08lx, newfd: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterDup2Args {
    head: SyscallHead,
    oldfd: u64,
    newfd: u64,
}

/// `syscalls:sys_enter_dup3`, 6.18:
///
/// ```text
/// name: sys_enter_dup3
/// ID: 920
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int oldfd;  offset:16;  size:8;  signed:0;
///   field:unsigned int newfd;  offset:24;  size:8;  signed:0;
///   field:int flags;  offset:32;  size:8;  signed:0;
///
/// print fmt: "oldfd: 0x%08lx, newfd: 0x%08lx, flags: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterDup3Args {
    head: SyscallHead,
    oldfd: u64,
    newfd: u64,
    flags: u64,
}

/// `syscalls:sys_enter_fcntl`, 6.18:
///
/// ```text
/// name: sys_enter_fcntl
/// ID: 896
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int fd;  offset:16;  size:8;  signed:0;
///   field:unsigned int cmd;  offset:24;  size:8;  signed:0;
///   field:unsigned long arg;  offset:32;  size:8;  signed:0;
///
/// print fmt: "fd: 0x%08lx, cmd: 0x%08lx, arg: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterFcntlArgs {
    head: SyscallHead,
    fd: u64,
    cmd: u64,
    arg: u64,
}

/// `syscalls:sys_enter_close` ([`SysEnterCloseArgs`]).
#[tracepoint]
pub fn close_enter(ctx: TracePointContext) -> u32 {
    let (tgid, _) = ids();
    if let Ok(a) = unsafe { ctx.read_at::<SysEnterCloseArgs>(0) } {
        if resolve_fd(tgid, a.fd as u32).is_some() {
            untrack_fd(tgid, a.fd as u32);
        }
    }
    0
}

/// Remembers a copy of a tracked fd (or over one) until the syscall returns.
#[inline(always)]
fn dup_enter(oldfd: u64, newfd: i64, cloexec: bool) -> Option<()> {
    let (tgid, tid) = ids();
    let src = resolve_fd(tgid, oldfd as u32);
    let dst_tracked = newfd >= 0 && resolve_fd(tgid, newfd as u32).is_some();
    let info = match src {
        Some(i) => i,
        None if dst_tracked => FdInfo::default(),
        None => return None,
    };
    let p = PendingDup {
        info,
        newfd,
        src_tracked: src.is_some() as u32,
        cloexec: cloexec as u32,
    };
    if PENDING_DUP.insert(&tid, &p, 0).is_err() {
        bump(counter::PENDING_DUP_FULL);
    }
    None
}

#[inline(always)]
fn dup_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    let p = *unsafe { PENDING_DUP.get(&tid) }?;
    let _ = PENDING_DUP.remove(&tid);
    let ret = unsafe { ctx.read_at::<SysExitArgs>(0) }.ok()?.ret;
    if ret < 0 {
        return None;
    }
    if p.src_tracked == 0 {
        // dup2/dup3 replaced a tracked fd with an untracked file.
        untrack_fd(tgid, ret as u32);
        return Some(());
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let fl = if p.cloexec != 0 { FD_CLOEXEC } else { 0 };
    track_fd(tgid, ret as u32, p.info.node, p.info.minor, fl, now);
    Some(())
}

/// `syscalls:sys_enter_dup` ([`SysEnterDupArgs`]).
#[tracepoint]
pub fn dup_enter_tp(ctx: TracePointContext) -> u32 {
    if let Ok(a) = unsafe { ctx.read_at::<SysEnterDupArgs>(0) } {
        let _ = dup_enter(a.fildes, -1, false);
    }
    0
}

/// `syscalls:sys_enter_dup2` ([`SysEnterDup2Args`]).
#[tracepoint]
pub fn dup2_enter(ctx: TracePointContext) -> u32 {
    if let Ok(a) = unsafe { ctx.read_at::<SysEnterDup2Args>(0) } {
        let _ = dup_enter(a.oldfd, a.newfd as u32 as i64, false);
    }
    0
}

/// `syscalls:sys_enter_dup3` ([`SysEnterDup3Args`]).
#[tracepoint]
pub fn dup3_enter(ctx: TracePointContext) -> u32 {
    if let Ok(a) = unsafe { ctx.read_at::<SysEnterDup3Args>(0) } {
        let _ = dup_enter(a.oldfd, a.newfd as u32 as i64, a.flags & O_CLOEXEC != 0);
    }
    0
}

/// `syscalls:sys_enter_fcntl` ([`SysEnterFcntlArgs`]): only `F_DUPFD*`.
#[tracepoint]
pub fn fcntl_enter(ctx: TracePointContext) -> u32 {
    if let Ok(a) = unsafe { ctx.read_at::<SysEnterFcntlArgs>(0) } {
        if a.cmd == F_DUPFD || a.cmd == F_DUPFD_CLOEXEC {
            let _ = dup_enter(a.fd, -1, a.cmd == F_DUPFD_CLOEXEC);
        }
    }
    0
}

/// `syscalls:sys_exit_{dup,dup2,dup3,fcntl}` ([`SysExitArgs`]): one program for the four.
#[tracepoint]
pub fn dup_exit_tp(ctx: TracePointContext) -> u32 {
    let _ = dup_exit(&ctx);
    0
}

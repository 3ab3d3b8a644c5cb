//! `open`, `openat` and `openat2` enter, and their one exit. The path is classified ([`classify_dev_path`]); every open of an
//! NVIDIA node is counted in `OPENS` and a successful one is remembered in `FDS` per (tgid, fd);
//! failed opens and opens inside `cuInit` are reported. A read-only open of a file named
//! `libcuda.so*` is reported too, so user space can attach the `cuInit` uprobes.
//!
//! A tracepoint program cannot fault a page in: a path whose page is not mapped yet (a
//! string in a file mapping not touched before) cannot be read at entry. The enter then
//! keeps the path's address (`PENDING_PATH`) and the exit reads it again, after the kernel
//! copied it in (`getname`); a path unreadable at both is counted
//! (`counter::PATH_UNREADABLE`).

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use uvmwatch_common::{
    classify_dev_path, counter, node, DevFile, OpenEvent, OpenKey, EVENT_OPEN, FD_CLOEXEC,
    OPEN_IN_CUINIT, OPEN_LIBCUDA, OPEN_PATH_TRUNCATED, PATH_LEN,
};

use super::{SysExitArgs, SyscallHead, O_CLOEXEC};
use crate::helpers::{
    bump, config, count, emit, failure_allowed, file_ids, file_of_fd, header, ids,
    node_of_dev_name, track_fd,
};
use crate::maps::{
    PendingPath, DEVFILES, INFLIGHT_CUINIT, OPENS, PENDING_OPEN, PENDING_PATH, SCRATCH_OPEN,
};

/// `O_ACCMODE` and `O_RDONLY` (`include/uapi/asm-generic/fcntl.h`).
const O_ACCMODE: u64 = 0o3;
const O_RDONLY: u64 = 0;

/// `syscalls:sys_enter_open`, 6.18 (x86_64 only: arm64 has no `open(2)`; glibc before 2.26,
/// as in CentOS 7-based CUDA images, calls it for `open()`):
///
/// ```text
/// name: sys_enter_open
/// ID: 784
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:const char * filename;  offset:16;  size:8;  signed:0;
///   field:int flags;  offset:24;  size:8;  signed:0;
///   field:umode_t mode;  offset:32;  size:8;  signed:0;
///
/// print fmt: "filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterOpenArgs {
    head: SyscallHead,
    /// User-space address of the NUL-terminated path.
    filename: u64,
    /// `O_*` flags.
    flags: u64,
    mode: u64,
}

/// `syscalls:sys_enter_openat`, 6.18:
///
/// ```text
/// name: sys_enter_openat
/// ID: 782
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:int dfd;  offset:16;  size:8;  signed:0;
///   field:const char * filename;  offset:24;  size:8;  signed:0;
///   field:int flags;  offset:32;  size:8;  signed:0;
///   field:umode_t mode;  offset:40;  size:8;  signed:0;
///
/// print fmt: "dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterOpenatArgs {
    head: SyscallHead,
    dfd: u64,
    /// User-space address of the NUL-terminated path.
    filename: u64,
    /// `O_*` flags.
    flags: u64,
    mode: u64,
}

/// `syscalls:sys_enter_openat2`, 6.18 (Linux 5.6+):
///
/// ```text
/// name: sys_enter_openat2
/// ID: 780
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:int dfd;  offset:16;  size:8;  signed:0;
///   field:const char * filename;  offset:24;  size:8;  signed:0;
///   field:struct open_how * how;  offset:32;  size:8;  signed:0;
///   field:size_t usize;  offset:40;  size:8;  signed:0;
///
/// print fmt: "dfd: 0x%08lx, filename: 0x%08lx, how: 0x%08lx, usize: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterOpenat2Args {
    head: SyscallHead,
    dfd: u64,
    /// User-space address of the NUL-terminated path.
    filename: u64,
    /// User-space address of `struct open_how` (`include/uapi/linux/openat2.h`), whose
    /// first member is `__u64 flags`.
    how: u64,
    usize: u64,
}

/// `syscalls:sys_enter_open` ([`SysEnterOpenArgs`]).
#[tracepoint]
pub fn open_enter(ctx: TracePointContext) -> u32 {
    if let Ok(args) = unsafe { ctx.read_at::<SysEnterOpenArgs>(0) } {
        let _ = enter(args.filename, args.flags);
    }
    0
}

/// `syscalls:sys_enter_openat` ([`SysEnterOpenatArgs`]).
#[tracepoint]
pub fn openat_enter(ctx: TracePointContext) -> u32 {
    if let Ok(args) = unsafe { ctx.read_at::<SysEnterOpenatArgs>(0) } {
        let _ = enter(args.filename, args.flags);
    }
    0
}

/// `syscalls:sys_enter_openat2` ([`SysEnterOpenat2Args`]); the flags are read from the
/// caller's `open_how`.
#[tracepoint]
pub fn openat2_enter(ctx: TracePointContext) -> u32 {
    if let Ok(args) = unsafe { ctx.read_at::<SysEnterOpenat2Args>(0) } {
        if let Ok(flags) = unsafe { bpf_probe_read_user::<u64>(args.how as *const u64) } {
            let _ = enter(args.filename, flags);
        }
    }
    0
}

/// What the three enters share: classify the path, keep the pending open for the exit; a
/// path that cannot be read yet is kept for the exit to read.
#[inline(always)]
fn enter(filename: u64, open_flags: u64) -> Option<()> {
    let cfg = config()?;
    let (tgid, tid) = ids();
    if tgid == cfg.agent_tgid {
        return None;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let in_cuinit = unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some();
    match pending_open(filename, open_flags, tgid, tid, now, in_cuinit) {
        Classified::Pending(ev) => {
            if PENDING_OPEN.insert(&tid, ev, 0).is_err() {
                bump(counter::PENDING_OPEN_FULL);
            }
            None
        }
        Classified::NotOurs => None,
        Classified::Unreadable => {
            let p = PendingPath {
                filename,
                open_flags,
                start_ns: now,
                in_cuinit: in_cuinit as u32,
                _pad: 0,
            };
            if PENDING_PATH.insert(&tid, &p, 0).is_err() {
                bump(counter::PENDING_PATH_FULL);
            }
            None
        }
    }
}

/// What reading and classifying an open's path gave.
enum Classified {
    /// An open to follow to its exit, built in `SCRATCH_OPEN`.
    Pending(&'static OpenEvent),
    /// Not an NVIDIA node nor a libcuda load.
    NotOurs,
    /// The path could not be read (its page not mapped yet).
    Unreadable,
}

/// Reads the path at `filename` into `SCRATCH_OPEN` and builds the pending open from it.
#[inline(always)]
fn pending_open(
    filename: u64,
    open_flags: u64,
    tgid: u32,
    tid: u32,
    start_ns: u64,
    in_cuinit: bool,
) -> Classified {
    let Some(ev) = SCRATCH_OPEN.get_ptr_mut(0) else {
        return Classified::NotOurs;
    };
    let ev = unsafe { &mut *ev };
    let len = match unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut ev.path) } {
        Ok(s) => s.len(),
        Err(_) => return Classified::Unreadable,
    };
    let mut head = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        head[i] = ev.path[i];
        i += 1;
    }
    let (kind, minor) = classify_dev_path(&head);
    let mut flags = 0u32;
    if kind == node::NONE {
        // Libraries are opened read-only by the loader; writes (copies, image extraction)
        // are not loads.
        if open_flags & O_ACCMODE != O_RDONLY || !basename_is_libcuda(&ev.path, len) {
            return Classified::NotOurs;
        }
        flags |= OPEN_LIBCUDA;
    }
    if len >= PATH_LEN - 1 {
        flags |= OPEN_PATH_TRUNCATED;
    }
    if in_cuinit {
        flags |= OPEN_IN_CUINIT;
    }
    ev.header = header(EVENT_OPEN, tgid, tid, start_ns);
    ev.start_ns = start_ns;
    ev.ret = 0;
    ev.open_flags = open_flags as u32;
    ev.flags = flags;
    ev.node = kind;
    ev.minor = minor;
    Classified::Pending(ev)
}

/// Whether the NUL-terminated path's last component starts with `libcuda.so`.
///
/// Scans backwards from the end for the last `/` with a loop bounded by a constant, and
/// indexes the buffer only through [`path_at`], so verifiers back to 6.1 can prove every
/// access in bounds and the loop finite.
#[inline(always)]
fn basename_is_libcuda(path: &[u8; PATH_LEN], len: usize) -> bool {
    const NAME: &[u8; 10] = b"libcuda.so";
    if len < NAME.len() || len > PATH_LEN {
        return false;
    }
    let mut base = 0usize;
    let mut k = 0usize;
    while k < PATH_LEN {
        if k >= len {
            break;
        }
        let i = len - 1 - k;
        if path_at(path, i) == b'/' {
            base = i + 1;
            break;
        }
        k += 1;
    }
    if base + NAME.len() > len {
        return false;
    }
    let mut j = 0usize;
    while j < NAME.len() {
        if path_at(path, base + j) != NAME[j] {
            return false;
        }
        j += 1;
    }
    true
}

/// `path[i % PATH_LEN]`, with the index passed through a volatile read first so LLVM cannot
/// drop the mask on the grounds that it already knows the range: older verifiers (6.1) only
/// accept the access when they see the mask themselves.
#[inline(always)]
fn path_at(path: &[u8; PATH_LEN], i: usize) -> u8 {
    let i = unsafe { core::ptr::read_volatile(&i) } & (PATH_LEN - 1);
    path[i]
}

/// A file just opened as `fd` that is not a character device but sits at a `/dev/nvidia*`
/// name (by its own dentries, [`node_of_dev_name`]) goes into `DEVFILES`, so ioctls on any fd
/// referring to it are identified; a character device needs nothing (its number says it).
#[inline(always)]
fn remember_dev_file(fd: u32) -> Option<()> {
    let cfg = config()?;
    let file = file_of_fd(cfg, fd)?;
    let ids = file_ids(cfg, file)?;
    if ids.is_chr {
        return None;
    }
    let (node, minor) = node_of_dev_name(cfg, file)?;
    let v = DevFile {
        node,
        minor,
        _pad: [0; 6],
    };
    let _ = DEVFILES.insert(&ids.key, &v, 0);
    Some(())
}

/// `syscalls:sys_exit_open`, `sys_exit_openat` and `sys_exit_openat2` ([`SysExitArgs`]):
/// the pending open of this thread, whichever enter made it.
#[tracepoint]
pub fn open_exit(ctx: TracePointContext) -> u32 {
    let _ = try_open_exit(&ctx);
    0
}

fn try_open_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    let ev = SCRATCH_OPEN.get_ptr_mut(0)?;
    let ev = unsafe { &mut *ev };
    if let Some(pending) = unsafe { PENDING_OPEN.get(&tid) } {
        *ev = *pending;
        let _ = PENDING_OPEN.remove(&tid);
    } else {
        // The path was not readable at entry: the kernel has copied it in by now.
        let p = unsafe { PENDING_PATH.get(&tid) }.copied()?;
        let _ = PENDING_PATH.remove(&tid);
        match pending_open(
            p.filename,
            p.open_flags,
            tgid,
            tid,
            p.start_ns,
            p.in_cuinit != 0,
        ) {
            Classified::Pending(_) => {}
            Classified::NotOurs => return None,
            Classified::Unreadable => {
                bump(counter::PATH_UNREADABLE);
                return None;
            }
        }
    }
    let ret = unsafe { ctx.read_at::<SysExitArgs>(0) }.ok()?.ret;
    let now = unsafe { bpf_ktime_get_ns() };
    ev.ret = ret;
    ev.header.ts_ns = now;
    if ev.flags & OPEN_LIBCUDA != 0 {
        if ret >= 0 {
            emit(ev);
        }
        return Some(());
    }
    let errno = if ret < 0 { (-ret) as u32 } else { 0 };
    let key = OpenKey {
        node: ev.node,
        minor: ev.minor,
        _pad: 0,
        errno,
    };
    count(&OPENS, &key, counter::OPENS_FULL);
    if ret >= 0 {
        let fl = if ev.open_flags as u64 & O_CLOEXEC != 0 {
            FD_CLOEXEC
        } else {
            0
        };
        track_fd(tgid, ret as u32, ev.node, ev.minor, fl, now);
        remember_dev_file(ret as u32);
    }
    let in_cuinit = ev.flags & OPEN_IN_CUINIT != 0;
    // A failed open outside cuInit is subject to the process's failure-record budget (the
    // `OPENS` counter above counted it already).
    if ret < 0 && !in_cuinit && !failure_allowed(tgid, now) {
        return Some(());
    }
    if ret < 0 || in_cuinit {
        emit(ev);
    }
    Some(())
}

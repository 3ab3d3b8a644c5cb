//! Opens, on either backend. Tracepoints: `open`, `openat` and `openat2` enter, and their
//! one exit; the enter keeps only the path's address, the flags and the time
//! (`PENDING_OPEN`). Fentry: fexit on `do_filp_open` (every path open, whichever syscall or
//! io_uring made it, gives the kernel's copy of the path and the new `struct file *` or
//! `ERR_PTR`), with fentry on `chrdev_open` stamping the start of an NVIDIA character
//! device's open (only character device opens run it; no map is touched for any other
//! file). The exit identifies what was opened the same way on both:
//!
//! - a successful open by the new fd's file: a character device by its number (NVIDIA's
//!   195, nvidia-uvm's major from `/proc/devices`), any other file by its own name (its
//!   dentry, crossing mounts): one at a `/dev/nvidia*` name is a double of that node and is
//!   remembered in `DEVFILES` by (device, inode); a `libcuda.so*` file opened read-only is a
//!   library being loaded, reported (with the caller's path, read now) so user space can
//!   attach the `cuInit` uprobes. The caller's path plays no part in identifying the file.
//! - a failed open by its path, read at the exit: the kernel copied it in (`getname`)
//!   before failing, so its page is mapped even when it was not at the entry.
//!
//! Every open of an NVIDIA node is counted in `OPENS`, and its process is put in `PROCS`
//! (from then on its ioctls are looked at); failed opens and opens inside `cuInit` are
//! reported.

use core::ptr::write_volatile;

use aya_ebpf::{
    helpers::{
        bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes,
    },
    macros::{fentry, fexit, tracepoint},
    programs::{FEntryContext, FExitContext, TracePointContext},
};
use uvmwatch_common::{
    classify_dev_path, classify_rdev, counter, node, DevFile, OpenEvent, OpenKey, EVENT_OPEN,
    OPEN_FD_UNKNOWN, OPEN_IN_CUINIT, OPEN_LIBCUDA, OPEN_LIBCUDA_UNPROBED, OPEN_NO_START,
    OPEN_PATH_TRUNCATED, PATH_LEN,
};

use super::cuinit::in_cuinit;
use super::{tp_record, SysExitArgs, SyscallHead};
use crate::helpers::{
    bump, config, count, emit, ensure_proc, failure_allowed, file_id, file_name_kind, file_of_fd,
    header, ids, kread, FileId, Named,
};
use crate::maps::{
    PendingOpen, DEVFILES, INFLIGHT_CUINIT, LIBCUDA_PROBED, OPENS, PENDING_OPEN, PROCS,
    SCRATCH_OPEN,
};

/// `O_ACCMODE` and `O_RDONLY` (`include/uapi/asm-generic/fcntl.h`).
const O_ACCMODE: u64 = 0o3;
const O_RDONLY: u64 = 0;
/// `O_PATH` (`include/uapi/asm-generic/fcntl.h`, x86-64 and arm64: `010000000`).
const O_PATH: u64 = 0o10000000;

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
    let args = unsafe { tp_record::<SysEnterOpenArgs>(&ctx) };
    let _ = enter(args.filename, args.flags);
    0
}

/// `syscalls:sys_enter_openat` ([`SysEnterOpenatArgs`]).
#[tracepoint]
pub fn openat_enter(ctx: TracePointContext) -> u32 {
    let args = unsafe { tp_record::<SysEnterOpenatArgs>(&ctx) };
    let _ = enter(args.filename, args.flags);
    0
}

/// `syscalls:sys_enter_openat2` ([`SysEnterOpenat2Args`]); the flags are read from the
/// caller's `open_how`.
#[tracepoint]
pub fn openat2_enter(ctx: TracePointContext) -> u32 {
    let args = unsafe { tp_record::<SysEnterOpenat2Args>(&ctx) };
    // Unreadable here (not paged in), the flags are taken as 0: the open is still kept, or
    // its exit would take the thread's previous open for it.
    let flags = unsafe { bpf_probe_read_user::<u64>(args.how as *const u64) }.unwrap_or(0);
    let _ = enter(args.filename, flags);
    0
}

/// What the three enters share: keep the open for the exit (no path read).
#[inline(always)]
fn enter(filename: u64, open_flags: u64) -> Option<()> {
    let cfg = config()?;
    let (tgid, tid) = ids();
    if tgid == cfg.agent_tgid {
        return None;
    }
    // Whether it is inside `cuInit` is asked at the exit, of the opens that are reported.
    let p = PendingOpen::new(
        tid,
        filename,
        open_flags,
        unsafe { bpf_ktime_get_ns() },
        false,
    );
    // The thread's entry of its last open is left by the exit (below) for this one to
    // overwrite in place: a lookup, where an update of an LRU map takes a free node, a
    // bucket lock and gives the old node back (on every open of the host). Only this thread
    // writes its entry; one the map recycled for another thread meanwhile carries this
    // thread's id, so that thread's exit does not take it for its own.
    if let Some(slot) = PENDING_OPEN.get_ptr_mut(&tid) {
        // The owner cleared first and written last, each store in this order: an entry the
        // map hands to another thread while this writes (an LRU map reuses a node at once)
        // ends either wholly that thread's (its copy, owner first, came after) or marked as
        // this one's.
        unsafe {
            write_volatile(&mut (*slot).tid, 0);
            write_volatile(&mut (*slot).filename, p.filename);
            write_volatile(&mut (*slot).open_flags, p.open_flags);
            write_volatile(&mut (*slot).start_ns, p.start_ns);
            write_volatile(&mut (*slot).in_cuinit, p.in_cuinit);
            write_volatile(&mut (*slot).node, p.node);
            write_volatile(&mut (*slot).minor, p.minor);
            write_volatile(&mut (*slot).kernel_path, p.kernel_path);
            write_volatile(&mut (*slot).reported, p.reported);
            write_volatile(&mut (*slot).tid, tid);
        }
    } else if PENDING_OPEN.insert(&tid, &p, 0).is_err() {
        bump(counter::PENDING_OPEN_FULL);
    }
    None
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
    if tgid == config()?.agent_tgid {
        return None;
    }
    let ret = unsafe { tp_record::<SysExitArgs>(ctx) }.ret;
    // The thread's pending open, taken only for an open to report: any other open leaves it
    // for the thread's next open to overwrite (`PENDING_OPEN` is an LRU map), so the host's
    // ordinary opens cost no lookup and no delete here. One the map recycled (or that began
    // before the probes) is counted where it was needed.
    let take = || {
        let Some(mut p) = unsafe { PENDING_OPEN.get(&tid) }
            .copied()
            .filter(|p| p.tid == tid)
        else {
            bump(counter::OPEN_UNFOLLOWED);
            return None;
        };
        let _ = PENDING_OPEN.remove(&tid);
        p.in_cuinit = unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some() as u8;
        Some(p)
    };
    if ret >= 0 {
        let file = file_of_fd(config()?, ret as u32)?;
        opened_file(take, None, tgid, tid, file, ret as u32)
    } else {
        open_failed(&take()?, tgid, tid, ret, unsafe { bpf_ktime_get_ns() })
    }
}

/// fentry on `chrdev_open(struct inode *inode, struct file *filp)`: the start of an open of
/// an NVIDIA character device (its number read from the inode), for `do_filp_open`'s exit
/// (a success) or `chrdev_open`'s (a refusal).
#[fentry(function = "chrdev_open")]
pub fn chrdev_fentry(ctx: FEntryContext) -> u32 {
    let _ = chrdev_entered(ctx.arg::<u64>(0));
    0
}

#[inline(always)]
fn chrdev_entered(inode: u64) -> Option<()> {
    let cfg = config()?;
    let rdev: u32 = kread(inode + cfg.files.inode_rdev as u64)?;
    let (node_kind, minor) = classify_rdev(rdev, cfg.uvm_major);
    if node_kind == node::NONE {
        return None;
    }
    let (tgid, tid) = ids();
    if tgid == cfg.agent_tgid {
        return None;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let p = PendingOpen {
        in_cuinit: in_cuinit(tgid, tid, now) as u8,
        node: node_kind,
        minor,
        ..PendingOpen::new(tid, 0, 0, now, true)
    };
    if PENDING_OPEN.insert(&tid, &p, 0).is_err() {
        bump(counter::PENDING_OPEN_FULL);
    }
    None
}

/// fexit on `chrdev_open(struct inode *inode, struct file *filp)`, which returns 0 or
/// `-errno`: an NVIDIA device whose driver refused the open (`EIO`, `ENXIO`, ...) is
/// reported here, by its number, with the start its entry stamped. A success (every
/// character device's, `/dev/null`'s too) returns at once: `do_filp_open`'s exit reports it.
#[fexit(function = "chrdev_open")]
pub fn chrdev_fexit(ctx: FExitContext) -> u32 {
    // An `int`: the low half of the return register.
    let ret = ctx.arg::<u64>(2) as u32 as i32;
    if ret < 0 {
        let _ = chrdev_refused(ctx.arg::<u64>(0), ctx.arg::<u64>(1), ret);
    }
    0
}

#[inline(always)]
fn chrdev_refused(inode: u64, filp: u64, ret: i32) -> Option<()> {
    let cfg = config()?;
    let rdev: u32 = kread(inode + cfg.files.inode_rdev as u64)?;
    if classify_rdev(rdev, cfg.uvm_major).0 == node::NONE {
        return None;
    }
    let (tgid, tid) = ids();
    let stamp = PENDING_OPEN.get_ptr_mut(&tid)?;
    let mut p = unsafe { *stamp };
    if p.tid != tid {
        return None;
    }
    // Left for `do_filp_open`'s exit to drop, marked: it sees the same failure.
    unsafe { (*stamp).reported = 1 };
    p.open_flags = kread::<u32>(filp + cfg.fentry.file_flags as u64).unwrap_or(0) as u64;
    // No path: the record names the node by its number (user space gives its /dev path).
    p.filename = 0;
    open_failed(&p, tgid, tid, ret as i64, unsafe { bpf_ktime_get_ns() })
}

/// fexit on `do_filp_open(int dfd, struct filename *pathname, const struct open_flags *op)`,
/// which returns the new `struct file *` or an `ERR_PTR`.
#[fexit(function = "do_filp_open")]
pub fn open_fexit(ctx: FExitContext) -> u32 {
    let _ = filp_opened(ctx.arg::<u64>(1), ctx.arg::<u64>(2), ctx.arg::<u64>(3));
    0
}

#[inline(always)]
fn filp_opened(pathname: u64, op: u64, ret: u64) -> Option<()> {
    let cfg = config()?;
    if cfg.fentry.ready == 0 {
        return None;
    }
    let err = ret as i64;
    let failed = (-4095..0).contains(&err);
    // Only an NVIDIA device's open left a stamp (a failed one is reported by `chrdev_open`'s
    // exit): any other character device is done with here, and no other file has a stamp,
    // so the host's opens of other files touch no map.
    let stamped = if failed {
        // Only to drop a refusal `chrdev_open`'s exit reported (any other failure is told
        // by its path, below).
        true
    } else {
        match file_id(cfg, ret)? {
            FileId::Chr { rdev } => {
                if classify_rdev(rdev, cfg.uvm_major).0 == node::NONE {
                    return None;
                }
                true
            }
            FileId::Other { .. } => false,
        }
    };
    let (tgid, tid) = ids();
    if tgid == cfg.agent_tgid {
        return None;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let stamp = if stamped {
        let s = unsafe { PENDING_OPEN.get(&tid) }
            .copied()
            .filter(|p| p.tid == tid);
        if s.is_some() {
            let _ = PENDING_OPEN.remove(&tid);
        } else if !failed {
            // An NVIDIA node's open with no start: its stamp was recycled, or its
            // `chrdev_open` ran before the probes. Counted, and reported without a start.
            bump(counter::OPEN_UNFOLLOWED);
        }
        s
    } else {
        None
    };
    let stamp = match stamp {
        // Reported already by `chrdev_open`'s exit.
        Some(s) if failed && s.reported != 0 => return None,
        // A failure after a successful `chrdev_open` (or a stamp left by an open outside
        // `do_filp_open`): told by its path like any other failure.
        Some(_) if failed => None,
        s => s,
    };
    // No stamp: not an NVIDIA character device (a double's open time is not measured on
    // this backend).
    let mut p = stamp.unwrap_or(PendingOpen::new(tid, 0, 0, now, true));
    let args = Some(FilpArgs { pathname, op });
    if failed {
        complete(&mut p, args, tid);
        open_failed(&p, tgid, tid, err, now)
    } else {
        // The fd is not installed yet inside `do_filp_open`: a successful open reports 0.
        opened_file(move || Some(p), args, tgid, tid, ret, 0)
    }
}

/// `do_filp_open`'s arguments (fentry backend), read only when an open is to be reported.
#[derive(Clone, Copy)]
struct FilpArgs {
    /// `struct filename *`.
    pathname: u64,
    /// `const struct open_flags *`.
    op: u64,
}

/// Fills in what the fentry backend reads late: the kernel's copy of the path, the flags and,
/// for an open no `chrdev_open` stamped, whether it is inside `cuInit`. Nothing to do on the
/// tracepoint backend (`args` is `None`).
#[inline(always)]
fn complete(p: &mut PendingOpen, args: Option<FilpArgs>, tid: u32) {
    let (Some(a), Some(cfg)) = (args, config()) else {
        return;
    };
    let o = &cfg.fentry;
    p.filename = kread(a.pathname + o.filename_name as u64).unwrap_or(0);
    p.open_flags = kread::<u32>(a.op + o.open_flags_flag as u64).unwrap_or(0) as u64;
    if p.node == node::NONE {
        p.in_cuinit = unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some() as u8;
    }
}

/// The record of open `p` in `SCRATCH_OPEN`, its path empty.
#[inline(always)]
fn record(
    p: &PendingOpen,
    tgid: u32,
    tid: u32,
    ret: i64,
    now: u64,
    node_kind: u8,
    minor: u8,
) -> Option<&'static mut OpenEvent> {
    let ev = unsafe { &mut *SCRATCH_OPEN.get_ptr_mut(0)? };
    ev.header = header(EVENT_OPEN, tgid, tid, now);
    ev.start_ns = p.start_ns;
    ev.ret = ret;
    ev.open_flags = p.open_flags as u32;
    ev.flags = if p.in_cuinit != 0 { OPEN_IN_CUINIT } else { 0 };
    // The fentry backend (the kernel's copy of the path): no fd yet, and a start only when
    // `chrdev_open` stamped one.
    if p.kernel_path != 0 {
        if ret >= 0 {
            ev.flags |= OPEN_FD_UNKNOWN;
        }
        if p.node == node::NONE {
            ev.flags |= OPEN_NO_START;
        }
    }
    ev.node = node_kind;
    ev.minor = minor;
    ev.path[0] = 0;
    Some(ev)
}

/// Reads the path of open `p` into `ev` (the caller's, or on the fentry backend the
/// kernel's copy of it); `false` when it cannot be read.
#[inline(always)]
fn read_path(ev: &mut OpenEvent, p: &PendingOpen) -> bool {
    if p.filename == 0 {
        ev.path[0] = 0;
        return false;
    }
    let at = p.filename as *const u8;
    let r = if p.kernel_path != 0 {
        unsafe { bpf_probe_read_kernel_str_bytes(at, &mut ev.path) }
    } else {
        unsafe { bpf_probe_read_user_str_bytes(at, &mut ev.path) }
    };
    match r {
        Ok(s) => {
            if s.len() >= PATH_LEN - 1 {
                ev.flags |= OPEN_PATH_TRUNCATED;
            }
            true
        }
        Err(_) => {
            ev.path[0] = 0;
            false
        }
    }
}

/// A successful open of `struct file *file` as `fd`: identified by what the file is. `take`
/// gives the open's pending state, asked for only when the open is to be reported.
#[inline(always)]
fn opened_file<F: FnOnce() -> Option<PendingOpen>>(
    take: F,
    args: Option<FilpArgs>,
    tgid: u32,
    tid: u32,
    file: u64,
    fd: u32,
) -> Option<()> {
    let cfg = config()?;
    let (node_kind, minor) = match file_id(cfg, file)? {
        FileId::Chr { rdev } => classify_rdev(rdev, cfg.uvm_major),
        FileId::Other { key } => match file_name_kind(cfg, file)? {
            Named::Node(k, m) => {
                // A double: ioctls on any fd referring to this file are identified by it.
                let v = DevFile {
                    node: k,
                    minor: m,
                    _pad: [0; 6],
                };
                let _ = DEVFILES.insert(&key, &v, 0);
                (k, m)
            }
            Named::Libcuda => {
                let mut p = take()?;
                let p = &mut p;
                complete(p, args, tid);
                // Libraries are opened read-only by the loader; writes (copies, image
                // extraction) are not loads.
                if p.open_flags & O_ACCMODE != O_RDONLY {
                    return None;
                }
                // The time only of an open that is reported (not of the host's others).
                let now = unsafe { bpf_ktime_get_ns() };
                let _ = ensure_proc(tgid, now);
                // Not probed yet: a cuInit the process makes before it is will be found
                // from its first driver call.
                let unprobed = unsafe { LIBCUDA_PROBED.get(&key) }.is_none();
                if unprobed {
                    if let Some(st) = PROCS.get_ptr_mut(&tgid) {
                        unsafe {
                            (*st).unprobed_load_ns = now;
                            (*st).unprobed_load_tid = tid;
                        }
                    }
                }
                let ev = record(p, tgid, tid, fd as i64, now, node::NONE, 0)?;
                ev.flags |= OPEN_LIBCUDA;
                if unprobed {
                    ev.flags |= OPEN_LIBCUDA_UNPROBED;
                }
                // The path user space attaches through (in the caller's mount namespace).
                read_path(ev, p);
                emit(ev);
                return Some(());
            }
        },
    };
    if node_kind == node::NONE {
        return None;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // Without its start (counted by `take`), the open is still counted, as ending now.
    let mut p = take().unwrap_or(PendingOpen::new(tid, 0, 0, now, false));
    complete(&mut p, args, tid);
    // An `O_PATH` open reaches no driver (no `chrdev_open`): not a device open.
    if p.open_flags & O_PATH != 0 {
        return None;
    }
    let key = OpenKey {
        node: node_kind,
        minor,
        _pad: 0,
        errno: 0,
    };
    count(&OPENS, &key, counter::OPENS_FULL);
    let _ = ensure_proc(tgid, now);
    if p.in_cuinit == 0 && in_cuinit(tgid, tid, p.start_ns) {
        p.in_cuinit = 1;
    }
    if p.in_cuinit != 0 {
        let ev = record(&p, tgid, tid, fd as i64, now, node_kind, minor)?;
        emit(ev);
    }
    Some(())
}

/// A failed open: its path, read now, says whether it was of an NVIDIA node.
#[inline(always)]
fn open_failed(p: &PendingOpen, tgid: u32, tid: u32, ret: i64, now: u64) -> Option<()> {
    let ev = record(p, tgid, tid, ret, now, node::NONE, 0)?;
    if !read_path(ev, p) && p.node == node::NONE {
        bump(counter::PATH_UNREADABLE);
        return None;
    }
    let mut head = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        head[i] = ev.path[i];
        i += 1;
    }
    // A device the driver refused to open (fentry: `chrdev_open` ran for it) is known by
    // its number; any other failure by its path.
    let (node_kind, minor) = if p.node != node::NONE {
        (p.node, p.minor)
    } else {
        classify_dev_path(&head)
    };
    if node_kind == node::NONE {
        return None;
    }
    ev.node = node_kind;
    ev.minor = minor;
    let key = OpenKey {
        node: node_kind,
        minor,
        _pad: 0,
        errno: (-ret) as u32,
    };
    count(&OPENS, &key, counter::OPENS_FULL);
    // The first driver call of a process whose libcuda is not probed yet may start a late
    // cuInit, a failed open as well as any.
    let inside = p.in_cuinit != 0 || in_cuinit(tgid, tid, p.start_ns);
    if inside {
        ev.flags |= OPEN_IN_CUINIT;
    }
    // A failed open outside cuInit is subject to the process's failure-record budget (the
    // `OPENS` counter above counted it already).
    if !inside && !failure_allowed(tgid, now) {
        return Some(());
    }
    emit(ev);
    Some(())
}

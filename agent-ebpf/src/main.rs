//! uvmwatch kernel programs.
//!
//! Read-only observers: nothing here changes what a traced process sees. Per-call work is done
//! in the kernel (fd tracking, latency histograms, result counters); only failures, slow calls,
//! calls inside `cuInit` and lifecycle changes of tracked processes reach user space.
//!
//! Data path:
//! * `openat` enter/exit: classify the path ([`classify_dev_path`]); successful opens of NVIDIA
//!   nodes are remembered in `FDS` per (tgid, fd); every open is counted in `OPENS`; opens of a
//!   file named `libcuda.so*` are reported so user space can attach the `cuInit` uprobes.
//! * `close`, `dup*`, `fcntl(F_DUPFD*)`, `sched_process_fork/exec/exit` keep `FDS` true.
//! * `ioctl` enter/exit on tracked fds: `INFLIGHT_IOCTL` while in the call, then `IOCTL_HIST`
//!   and `IOCTL_RESULTS`, with the `rmStatus` read from the caller's params.
//! * `cuInit` uprobe/uretprobe: `INFLIGHT_CUINIT` and enter/exit events.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes,
    },
    macros::{kprobe, kretprobe, map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
use uvmwatch_common::{
    classify_dev_path, counter, hist_bucket, kfunc, node, result, CmdInfo, CmdKey, Config,
    CuinitEvent, EventHeader, FdInfo, FdKey, InflightCuinit, InflightIoctl, IoctlEvent, IoctlKey,
    KfKey, KfResultKey, KfuncEvent, LatencyHist, OpenEvent, OpenKey, ProcState, TaskEvent,
    COMM_LEN, DIED_IN_CUINIT, DIED_IN_IOCTL, EVENT_CUINIT_ENTER, EVENT_CUINIT_EXIT,
    EVENT_DIED_IN_CALL, EVENT_EXEC, EVENT_FORK, EVENT_IOCTL, EVENT_KFUNC, EVENT_OPEN,
    EVENT_PROC_EXIT, FD_CLOEXEC, FD_INHERITED, IOCTL_FAILED, IOCTL_IN_CUINIT, IOCTL_SLOW,
    OPEN_IN_CUINIT, OPEN_LIBCUDA, OPEN_PATH_TRUNCATED, PATH_LEN,
};

/// `BPF_F_NO_PREALLOC`: per-CPU hashes grow with use instead of reserving
/// `max_entries * ncpus` values up front.
const NO_PREALLOC: u32 = 1;
/// `O_CLOEXEC` on x86_64 and aarch64 (`include/uapi/asm-generic/fcntl.h`).
const O_CLOEXEC: u64 = 0o2000000;
/// `O_ACCMODE` and `O_RDONLY` (`include/uapi/asm-generic/fcntl.h`).
const O_ACCMODE: u64 = 0o3;
const O_RDONLY: u64 = 0;
/// `F_DUPFD` and `F_DUPFD_CLOEXEC` (`include/uapi/linux/fcntl.h`).
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;
/// How many fork generations an inherited fd is looked up through.
const INHERIT_DEPTH: usize = 3;

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(512 * 1024, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[map]
static FDS: HashMap<FdKey, FdInfo> = HashMap::with_max_entries(65536, 0);
#[map]
static PROCS: HashMap<u32, ProcState> = HashMap::with_max_entries(16384, 0);
#[map]
static CMDS: HashMap<CmdKey, CmdInfo> = HashMap::with_max_entries(1024, 0);

#[map]
static INFLIGHT_IOCTL: LruHashMap<u32, InflightIoctl> = LruHashMap::with_max_entries(16384, 0);
#[map]
static INFLIGHT_CUINIT: LruHashMap<u32, InflightCuinit> = LruHashMap::with_max_entries(8192, 0);

#[map]
static IOCTL_HIST: PerCpuHashMap<IoctlKey, LatencyHist> =
    PerCpuHashMap::with_max_entries(512, NO_PREALLOC);
#[map]
static IOCTL_RESULTS: PerCpuHashMap<IoctlKey, u64> =
    PerCpuHashMap::with_max_entries(2048, NO_PREALLOC);
#[map]
static OPENS: PerCpuHashMap<OpenKey, u64> = PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);

/// An `openat` between enter and exit (keyed by tid). Only NVIDIA nodes and libcuda files.
#[map]
static PENDING_OPEN: HashMap<u32, OpenEvent> = HashMap::with_max_entries(4096, 0);
/// A `dup*`/`fcntl(F_DUPFD*)` of a tracked fd between enter and exit (keyed by tid).
#[map]
static PENDING_DUP: HashMap<u32, PendingDup> = HashMap::with_max_entries(4096, 0);

/// Per-CPU scratch: an `OpenEvent` being built (too large for the 512-byte stack), and a
/// zeroed histogram used as the initial value of new `IOCTL_HIST` entries.
#[map]
static SCRATCH_OPEN: PerCpuArray<OpenEvent> = PerCpuArray::with_max_entries(1, 0);
#[map]
static ZERO_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct PendingDup {
    info: FdInfo,
    /// Target fd of `dup2`/`dup3` (-1 for `dup`/`fcntl`).
    newfd: i64,
    /// 1 when the source fd is tracked; 0 when only the target of a `dup2/3` is.
    src_tracked: u32,
    cloexec: u32,
}

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn config() -> Option<&'static Config> {
    let c = CONFIG.get(0)?;
    if c.ready == 0 {
        return None;
    }
    Some(c)
}

#[inline(always)]
fn ids() -> (u32, u32) {
    let v = bpf_get_current_pid_tgid();
    ((v >> 32) as u32, v as u32)
}

#[inline(always)]
fn bump(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn header(kind: u32, tgid: u32, tid: u32, now: u64) -> EventHeader {
    EventHeader {
        kind,
        tgid,
        tid,
        _pad: 0,
        ts_ns: now,
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
    }
}

/// Sends one record; a full ring buffer is counted, never waited for.
#[inline(always)]
fn emit<T: 'static>(ev: &T) {
    if EVENTS.output::<T>(ev, 0).is_err() {
        bump(counter::RINGBUF_DROPS);
    }
}

#[inline(always)]
fn ensure_proc(tgid: u32, now: u64) -> Option<ProcState> {
    if let Some(p) = unsafe { PROCS.get(&tgid) } {
        return Some(*p);
    }
    let p = ProcState {
        proc_gen: now,
        exec_gen: now,
        parent_tgid: 0,
        _pad: 0,
        forked_ns: 0,
    };
    PROCS.insert(&tgid, &p, 0).ok()?;
    Some(p)
}

#[inline(always)]
fn entry_valid(e: &FdInfo, p: &ProcState) -> bool {
    e.proc_gen == p.proc_gen && (e.flags & FD_CLOEXEC == 0 || e.exec_gen == p.exec_gen)
}

/// Looks up the NVIDIA node behind (tgid, fd), following `fork` inheritance.
///
/// An fd inherited from a parent is copied into the child's own entry the first time it is
/// used, so later lookups are one hash lookup.
#[inline(always)]
fn resolve_fd(tgid: u32, fd: u32) -> Option<FdInfo> {
    let me = *unsafe { PROCS.get(&tgid) }?;
    let key = FdKey { tgid, fd };
    if let Some(e) = unsafe { FDS.get(&key) } {
        if e.node != node::NONE && entry_valid(e, &me) {
            return Some(*e);
        }
        return None;
    }
    // Not recorded for this process: maybe inherited through fork.
    let mut child = me;
    let mut i = 0;
    while i < INHERIT_DEPTH {
        i += 1;
        let parent = child.parent_tgid;
        if parent == 0 {
            return None;
        }
        let pstate = *unsafe { PROCS.get(&parent) }?;
        let pk = FdKey { tgid: parent, fd };
        if let Some(e) = unsafe { FDS.get(&pk) } {
            if e.node == node::NONE || !entry_valid(e, &pstate) || e.opened_ns > child.forked_ns {
                return None;
            }
            // This process exec'ed since the fork: close-on-exec fds did not survive.
            if e.flags & FD_CLOEXEC != 0 && me.exec_gen != me.proc_gen {
                return None;
            }
            let mut mine = *e;
            mine.proc_gen = me.proc_gen;
            mine.exec_gen = me.exec_gen;
            mine.flags |= FD_INHERITED;
            if FDS.insert(&key, &mine, 0).is_err() {
                bump(counter::FDS_FULL);
            }
            return Some(mine);
        }
        child = pstate;
    }
    None
}

#[inline(always)]
fn track_fd(tgid: u32, fd: u32, node_kind: u8, minor: u8, flags: u8, now: u64) {
    let Some(p) = ensure_proc(tgid, now) else {
        bump(counter::FDS_FULL);
        return;
    };
    let info = FdInfo {
        node: node_kind,
        minor,
        flags,
        _pad: [0; 5],
        proc_gen: p.proc_gen,
        exec_gen: p.exec_gen,
        opened_ns: now,
    };
    if FDS.insert(&FdKey { tgid, fd }, &info, 0).is_err() {
        bump(counter::FDS_FULL);
    }
}

/// Forgets (tgid, fd); leaves a tombstone where a parent's fd could otherwise be inherited.
#[inline(always)]
fn untrack_fd(tgid: u32, fd: u32) {
    let Some(p) = (unsafe { PROCS.get(&tgid) }) else {
        return;
    };
    let key = FdKey { tgid, fd };
    if p.parent_tgid != 0 {
        let tomb = FdInfo {
            node: node::NONE,
            minor: 0,
            flags: 0,
            _pad: [0; 5],
            proc_gen: p.proc_gen,
            exec_gen: p.exec_gen,
            opened_ns: 0,
        };
        let _ = FDS.insert(&key, &tomb, 0);
    } else {
        let _ = FDS.remove(&key);
    }
}

// ---------------------------------------------------------------------------------------------
// openat
// ---------------------------------------------------------------------------------------------

/// `syscalls:sys_enter_openat` (format: dfd @16, filename @24, flags @32, mode @40; all 8 bytes).
#[tracepoint]
pub fn openat_enter(ctx: TracePointContext) -> u32 {
    let _ = try_openat_enter(&ctx);
    0
}

fn try_openat_enter(ctx: &TracePointContext) -> Option<()> {
    let cfg = config()?;
    let (tgid, tid) = ids();
    if tgid == cfg.agent_tgid {
        return None;
    }
    let filename: u64 = unsafe { ctx.read_at(24) }.ok()?;
    let open_flags: u64 = unsafe { ctx.read_at(32) }.ok()?;
    let ev = SCRATCH_OPEN.get_ptr_mut(0)?;
    let ev = unsafe { &mut *ev };
    let len = match unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut ev.path) } {
        Ok(s) => s.len(),
        Err(_) => return None,
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
            return None;
        }
        flags |= OPEN_LIBCUDA;
    }
    if len >= PATH_LEN - 1 {
        flags |= OPEN_PATH_TRUNCATED;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some() {
        flags |= OPEN_IN_CUINIT;
    }
    ev.header = header(EVENT_OPEN, tgid, tid, now);
    ev.start_ns = now;
    ev.ret = 0;
    ev.open_flags = open_flags as u32;
    ev.flags = flags;
    ev.node = kind;
    ev.minor = minor;
    PENDING_OPEN.insert(&tid, ev, 0).ok()
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

/// `syscalls:sys_exit_openat` (format: ret @16).
#[tracepoint]
pub fn openat_exit(ctx: TracePointContext) -> u32 {
    let _ = try_openat_exit(&ctx);
    0
}

fn try_openat_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    let pending = unsafe { PENDING_OPEN.get(&tid) }?;
    let ev = SCRATCH_OPEN.get_ptr_mut(0)?;
    let ev = unsafe { &mut *ev };
    *ev = *pending;
    let _ = PENDING_OPEN.remove(&tid);
    let ret: i64 = unsafe { ctx.read_at(16) }.ok()?;
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
    match OPENS.get_ptr_mut(&key) {
        Some(c) => unsafe { *c += 1 },
        None => {
            let _ = OPENS.insert(&key, &1, 0);
        }
    }
    if ret >= 0 {
        let fl = if ev.open_flags as u64 & O_CLOEXEC != 0 {
            FD_CLOEXEC
        } else {
            0
        };
        track_fd(tgid, ret as u32, ev.node, ev.minor, fl, now);
    }
    if ret < 0 || ev.flags & OPEN_IN_CUINIT != 0 {
        emit(ev);
    }
    Some(())
}

// ---------------------------------------------------------------------------------------------
// close, dup, fcntl
// ---------------------------------------------------------------------------------------------

/// `syscalls:sys_enter_close` (format: fd @16).
#[tracepoint]
pub fn close_enter(ctx: TracePointContext) -> u32 {
    let (tgid, _) = ids();
    if let Ok(fd) = unsafe { ctx.read_at::<u64>(16) } {
        if resolve_fd(tgid, fd as u32).is_some() {
            untrack_fd(tgid, fd as u32);
        }
    }
    0
}

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
    PENDING_DUP.insert(&tid, &p, 0).ok()
}

#[inline(always)]
fn dup_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    let p = *unsafe { PENDING_DUP.get(&tid) }?;
    let _ = PENDING_DUP.remove(&tid);
    let ret: i64 = unsafe { ctx.read_at(16) }.ok()?;
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

/// `syscalls:sys_enter_dup` (format: fildes @16).
#[tracepoint]
pub fn dup_enter_tp(ctx: TracePointContext) -> u32 {
    if let Ok(fd) = unsafe { ctx.read_at::<u64>(16) } {
        let _ = dup_enter(fd, -1, false);
    }
    0
}

/// `syscalls:sys_enter_dup2` (format: oldfd @16, newfd @24).
#[tracepoint]
pub fn dup2_enter(ctx: TracePointContext) -> u32 {
    let old = unsafe { ctx.read_at::<u64>(16) };
    let new = unsafe { ctx.read_at::<u64>(24) };
    if let (Ok(old), Ok(new)) = (old, new) {
        let _ = dup_enter(old, new as u32 as i64, false);
    }
    0
}

/// `syscalls:sys_enter_dup3` (format: oldfd @16, newfd @24, flags @32).
#[tracepoint]
pub fn dup3_enter(ctx: TracePointContext) -> u32 {
    let old = unsafe { ctx.read_at::<u64>(16) };
    let new = unsafe { ctx.read_at::<u64>(24) };
    let flags = unsafe { ctx.read_at::<u64>(32) }.unwrap_or(0);
    if let (Ok(old), Ok(new)) = (old, new) {
        let _ = dup_enter(old, new as u32 as i64, flags & O_CLOEXEC != 0);
    }
    0
}

/// `syscalls:sys_enter_fcntl` (format: fd @16, cmd @24, arg @32): only `F_DUPFD*`.
#[tracepoint]
pub fn fcntl_enter(ctx: TracePointContext) -> u32 {
    let fd = unsafe { ctx.read_at::<u64>(16) };
    let cmd = unsafe { ctx.read_at::<u64>(24) }.unwrap_or(u64::MAX);
    if let Ok(fd) = fd {
        if cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC {
            let _ = dup_enter(fd, -1, cmd == F_DUPFD_CLOEXEC);
        }
    }
    0
}

/// `syscalls:sys_exit_{dup,dup2,dup3,fcntl}` (format: ret @16).
#[tracepoint]
pub fn dup_exit_tp(ctx: TracePointContext) -> u32 {
    let _ = dup_exit(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// ioctl
// ---------------------------------------------------------------------------------------------

/// `syscalls:sys_enter_ioctl` (format: fd @16, cmd @24, arg @32).
#[tracepoint]
pub fn ioctl_enter(ctx: TracePointContext) -> u32 {
    let _ = try_ioctl_enter(&ctx);
    0
}

fn try_ioctl_enter(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    // One hash lookup for every process that never touched an NVIDIA node.
    unsafe { PROCS.get(&tgid) }?;
    let fd: u64 = unsafe { ctx.read_at(16) }.ok()?;
    let info = resolve_fd(tgid, fd as u32)?;
    let cmd: u64 = unsafe { ctx.read_at(24) }.ok()?;
    let arg: u64 = unsafe { ctx.read_at(32) }.ok()?;
    let in_cuinit = unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some();
    let e = InflightIoctl {
        start_ns: unsafe { bpf_ktime_get_ns() },
        arg,
        tgid,
        fd: fd as u32,
        cmd: cmd as u32,
        node: info.node,
        minor: info.minor,
        in_cuinit: in_cuinit as u8,
        _pad: 0,
    };
    if INFLIGHT_IOCTL.insert(&tid, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    }
    Some(())
}

/// `syscalls:sys_exit_ioctl` (format: ret @16).
#[tracepoint]
pub fn ioctl_exit(ctx: TracePointContext) -> u32 {
    let _ = try_ioctl_exit(&ctx);
    0
}

fn try_ioctl_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = ids();
    let call = *unsafe { INFLIGHT_IOCTL.get(&tid) }?;
    let _ = INFLIGHT_IOCTL.remove(&tid);
    let ret: i64 = unsafe { ctx.read_at(16) }.ok()?;
    let now = unsafe { bpf_ktime_get_ns() };
    let dur = now.saturating_sub(call.start_ns);

    // Result: errno, else the rmStatus at the command's offset, else plain OK.
    let (kind, code) = if ret < 0 {
        (result::ERRNO, (-ret) as u32)
    } else {
        let ck = CmdKey {
            uvm: node::is_uvm(call.node) as u32,
            cmd: call.cmd,
        };
        match unsafe { CMDS.get(&ck) } {
            Some(ci) => {
                let at = call.arg.wrapping_add(ci.status_offset as u64) as *const u32;
                match unsafe { bpf_probe_read_user::<u32>(at) } {
                    Ok(s) => (result::NV_STATUS, s),
                    Err(_) => (result::UNREADABLE, 0),
                }
            }
            None => (result::OK, 0),
        }
    };

    let hk = IoctlKey {
        cmd: call.cmd,
        node: call.node,
        minor: call.minor,
        result_kind: 0,
        _pad: 0,
        code: 0,
    };
    let b = hist_bucket(dur);
    match IOCTL_HIST.get_ptr_mut(&hk) {
        Some(h) => add_sample(h, b, dur),
        None => {
            if let Some(z) = ZERO_HIST.get_ptr(0) {
                let _ = IOCTL_HIST.insert(&hk, unsafe { &*z }, 0);
                if let Some(h) = IOCTL_HIST.get_ptr_mut(&hk) {
                    add_sample(h, b, dur);
                }
            }
        }
    }
    let rk = IoctlKey {
        result_kind: kind,
        code,
        ..hk
    };
    match IOCTL_RESULTS.get_ptr_mut(&rk) {
        Some(c) => unsafe { *c += 1 },
        None => {
            let _ = IOCTL_RESULTS.insert(&rk, &1, 0);
        }
    }

    let failed = kind == result::ERRNO || (kind == result::NV_STATUS && code != 0);
    let slow = config().map(|c| dur >= c.slow_ioctl_ns).unwrap_or(false);
    if failed || slow || call.in_cuinit != 0 {
        let mut flags = 0;
        if failed {
            flags |= IOCTL_FAILED;
        }
        if slow {
            flags |= IOCTL_SLOW;
        }
        if call.in_cuinit != 0 {
            flags |= IOCTL_IN_CUINIT;
        }
        let ev = IoctlEvent {
            header: header(EVENT_IOCTL, tgid, tid, now),
            start_ns: call.start_ns,
            ret,
            cmd: call.cmd,
            fd: call.fd,
            status: code,
            flags,
            node: call.node,
            minor: call.minor,
            result_kind: kind,
            _pad: [0; 5],
        };
        emit(&ev);
    }
    Some(())
}

#[inline(always)]
fn add_sample(h: *mut LatencyHist, b: usize, dur: u64) {
    let h = unsafe { &mut *h };
    if let Some(slot) = h.buckets.get_mut(b) {
        *slot += 1;
    }
    h.sum_ns += dur;
    h.count += 1;
}

// ---------------------------------------------------------------------------------------------
// cuInit
// ---------------------------------------------------------------------------------------------

/// Uprobe on `cuInit(unsigned int Flags)` in each `libcuda.so.1` user space attaches to.
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
    // Tracks the process so fork inheritance and exit clean-up apply from the first call.
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
    if p.parent_tgid != 0 && p.exec_gen == p.proc_gen {
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

// ---------------------------------------------------------------------------------------------
// process lifecycle
// ---------------------------------------------------------------------------------------------

/// `sched:sched_process_fork`, in the parent. The `child_pid` offset differs between kernels
/// (`__data_loc` comms since 6.x), so user space reads it from the tracepoint's `format`.
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
    let st = ProcState {
        proc_gen: now,
        exec_gen: now,
        parent_tgid: tgid,
        _pad: 0,
        forked_ns: now,
    };
    let _ = PROCS.insert(&(child as u32), &st, 0);
    let ev = TaskEvent {
        header: header(EVENT_FORK, tgid, tid, now),
        aux: child as u32,
        ..TaskEvent::default()
    };
    emit(&ev);
    Some(())
}

/// `sched:sched_process_exec`, in the new image: close-on-exec fds are gone from here on.
#[tracepoint]
pub fn sched_exec(ctx: TracePointContext) -> u32 {
    let _ = ctx.as_ptr();
    let (tgid, tid) = ids();
    if let Some(p) = PROCS.get_ptr_mut(&tgid) {
        let now = unsafe { bpf_ktime_get_ns() };
        unsafe { (*p).exec_gen = now };
        let ev = TaskEvent {
            header: header(EVENT_EXEC, tgid, tid, now),
            ..TaskEvent::default()
        };
        emit(&ev);
    }
    0
}

/// `sched:sched_process_exit`, for every exiting thread: drops calls in flight (so a thread
/// that dies mid-call leaves no phantom stall) and, for the last thread, the process state.
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
    let _ = PENDING_DUP.remove(&tid);
    let cu = unsafe { INFLIGHT_CUINIT.get(&tid) }.copied();
    let io = unsafe { INFLIGHT_IOCTL.get(&tid) }.copied();
    if cu.is_some() || io.is_some() {
        let mut ev = TaskEvent {
            header: header(EVENT_DIED_IN_CALL, tgid, tid, now),
            ..TaskEvent::default()
        };
        if let Some(c) = cu {
            ev.what |= DIED_IN_CUINIT;
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
        let _ = PROCS.remove(&tid);
    }
    let group_dead = if cfg.exit_group_dead_off != 0 {
        unsafe { ctx.read_at::<u8>(cfg.exit_group_dead_off as usize) }.unwrap_or(0) != 0
    } else {
        tid == tgid
    };
    if group_dead && unsafe { PROCS.get(&tgid) }.is_some() {
        let _ = PROCS.remove(&tgid);
        let ev = TaskEvent {
            header: header(EVENT_PROC_EXIT, tgid, tid, now),
            ..TaskEvent::default()
        };
        emit(&ev);
    }
    Some(())
}

// ---------------------------------------------------------------------------------------------
// kernel and driver functions (kprobe/kretprobe pairs; only where the kernel has kprobes)
// ---------------------------------------------------------------------------------------------

/// Entry times of probed functions in progress, per (thread, function).
#[map]
static KF_START: LruHashMap<KfKey, u64> = LruHashMap::with_max_entries(16384, 0);
/// Per-CPU latency histograms, indexed by function ([`kfunc`]).
#[map]
static KF_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(kfunc::COUNT, 0);
/// Per-CPU result counters per (function, result kind, code).
#[map]
static KF_RESULTS: PerCpuHashMap<KfResultKey, u64> =
    PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);

/// Whether the current thread is inside an ioctl on a UVM node.
#[inline(always)]
fn in_uvm_ioctl(tid: u32) -> bool {
    match unsafe { INFLIGHT_IOCTL.get(&tid) } {
        Some(i) => node::is_uvm(i.node),
        None => false,
    }
}

/// The HMM set-up allocators are called by other drivers too: only calls made inside a
/// UVM ioctl (the register-GPU path) are UVM's.
#[inline(always)]
const fn uvm_context_only(func: u32) -> bool {
    func == kfunc::REQUEST_FREE_MEM_REGION || func == kfunc::MEMREMAP_PAGES
}

#[inline(always)]
fn kf_enter(func: u32) {
    if config().is_none() {
        return;
    }
    let (_, tid) = ids();
    if uvm_context_only(func) && !in_uvm_ioctl(tid) {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = KF_START.insert(&KfKey { tid, func }, &now, 0);
}

#[inline(always)]
fn kf_exit(ctx: &RetProbeContext, func: u32, ret_kind: u8) {
    let (tgid, tid) = ids();
    let key = KfKey { tid, func };
    let Some(start) = (unsafe { KF_START.get(&key) }).copied() else {
        return;
    };
    let _ = KF_START.remove(&key);
    let now = unsafe { bpf_ktime_get_ns() };
    let dur = now.saturating_sub(start);
    let raw: u64 = ctx.ret();
    let (kind, code) = match ret_kind {
        kfunc::ret::NV_STATUS => {
            let st = raw as u32;
            (result::NV_STATUS, st)
        }
        kfunc::ret::ERR_PTR => {
            let v = raw as i64;
            if (-4095..0).contains(&v) {
                (result::ERRNO, (-v) as u32)
            } else {
                (result::OK, 0)
            }
        }
        kfunc::ret::ERRNO => {
            let v = raw as i32;
            if v < 0 {
                (result::ERRNO, v.unsigned_abs())
            } else {
                (result::OK, 0)
            }
        }
        _ => (result::OK, 0),
    };
    if let Some(h) = KF_HIST.get_ptr_mut(func) {
        add_sample(h, hist_bucket(dur), dur);
    }
    let rk = KfResultKey {
        func,
        kind,
        _pad: [0; 3],
        code,
    };
    match KF_RESULTS.get_ptr_mut(&rk) {
        Some(c) => unsafe { *c += 1 },
        None => {
            let _ = KF_RESULTS.insert(&rk, &1, 0);
        }
    }
    let failed = kind == result::ERRNO || (kind == result::NV_STATUS && code != 0);
    if failed {
        let ev = KfuncEvent {
            header: header(EVENT_KFUNC, tgid, tid, now),
            start_ns: start,
            ret: raw as i64,
            func,
            code,
            kind,
            in_uvm_ioctl: in_uvm_ioctl(tid) as u8,
            _pad: [0; 6],
        };
        emit(&ev);
    }
}

/// One kprobe and one kretprobe program per function: the program itself says which
/// function fired (aya 0.14 kprobes take no attach cookie).
macro_rules! kfunc_probes {
    ($enter:ident, $exit:ident, $func:expr, $ret:expr) => {
        #[kprobe]
        pub fn $enter(_ctx: ProbeContext) -> u32 {
            kf_enter($func);
            0
        }
        #[kretprobe]
        pub fn $exit(ctx: RetProbeContext) -> u32 {
            kf_exit(&ctx, $func, $ret);
            0
        }
    };
}

kfunc_probes!(
    kp_free_mem_region,
    krp_free_mem_region,
    kfunc::REQUEST_FREE_MEM_REGION,
    kfunc::ret::ERR_PTR
);
kfunc_probes!(
    kp_memremap_pages,
    krp_memremap_pages,
    kfunc::MEMREMAP_PAGES,
    kfunc::ret::ERR_PTR
);
kfunc_probes!(
    kp_api_register_gpu,
    krp_api_register_gpu,
    kfunc::UVM_API_REGISTER_GPU,
    kfunc::ret::NV_STATUS
);
kfunc_probes!(
    kp_va_space_reg_gpu,
    krp_va_space_reg_gpu,
    kfunc::UVM_VA_SPACE_REGISTER_GPU,
    kfunc::ret::NV_STATUS
);
kfunc_probes!(
    kp_gpu_retain,
    krp_gpu_retain,
    kfunc::UVM_GPU_RETAIN_BY_UUID,
    kfunc::ret::NV_STATUS
);
kfunc_probes!(
    kp_hmm_block_svc,
    krp_hmm_block_svc,
    kfunc::UVM_HMM_VA_BLOCK_SERVICE_LOCKED,
    kfunc::ret::NV_STATUS
);
kfunc_probes!(
    kp_hmm_range_fault,
    krp_hmm_range_fault,
    kfunc::HMM_RANGE_FAULT,
    kfunc::ret::ERRNO
);
kfunc_probes!(
    kp_migrate_setup,
    krp_migrate_setup,
    kfunc::MIGRATE_VMA_SETUP,
    kfunc::ret::ERRNO
);
kfunc_probes!(
    kp_migrate_pages,
    krp_migrate_pages,
    kfunc::MIGRATE_VMA_PAGES,
    kfunc::ret::VOID
);
kfunc_probes!(
    kp_migrate_final,
    krp_migrate_final,
    kfunc::MIGRATE_VMA_FINALIZE,
    kfunc::ret::VOID
);
kfunc_probes!(
    kp_hmm_migrate,
    krp_hmm_migrate,
    kfunc::UVM_HMM_MIGRATE_RANGES,
    kfunc::ret::NV_STATUS
);
kfunc_probes!(
    kp_pgpu_replay,
    krp_pgpu_replay,
    kfunc::PARENT_GPU_SERVICE_REPLAYABLE,
    kfunc::ret::VOID
);
kfunc_probes!(
    kp_pgpu_nonreplay,
    krp_pgpu_nonreplay,
    kfunc::PARENT_GPU_SERVICE_NON_REPLAYABLE,
    kfunc::ret::VOID
);
kfunc_probes!(
    kp_gpu_replay,
    krp_gpu_replay,
    kfunc::GPU_SERVICE_REPLAYABLE,
    kfunc::ret::VOID
);
kfunc_probes!(
    kp_gpu_nonreplay,
    krp_gpu_nonreplay,
    kfunc::GPU_SERVICE_NON_REPLAYABLE,
    kfunc::ret::VOID
);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

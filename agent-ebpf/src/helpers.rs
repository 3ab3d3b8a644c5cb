//! What every probe uses: the settings, the caller's ids, counters, record headers and
//! sending, the per-CPU aggregates, the fd table (`FDS` and `PROCS`, with `fork`
//! inheritance), and the file behind an fd read from the task's own fd table.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    maps::PerCpuHashMap,
};
use uvmwatch_common::{
    classify_node_name, classify_rdev, counter, node, result, Config, DevFileKey, EventHeader,
    FdInfo, FdKey, FileOffsets, LatencyHist, ProcState, RateWindow, COMM_LEN, FD_CLOEXEC,
    FD_INHERITED, NODE_NAME_LEN, S_IFCHR, S_IFMT,
};

use crate::maps::{CONFIG, COUNTERS, DEVFILES, EVENTS, FAILURE_RATE, FDS, PROCS};

/// How many fork generations an inherited fd is looked up through.
const INHERIT_DEPTH: usize = 3;

// ---------------------------------------------------------------------------------------------
// settings, ids, records
// ---------------------------------------------------------------------------------------------

/// The settings, once user space has written them.
#[inline(always)]
pub fn config() -> Option<&'static Config> {
    let c = CONFIG.get(0)?;
    if c.ready == 0 {
        return None;
    }
    Some(c)
}

/// `(tgid, tid)` of the current thread.
#[inline(always)]
pub fn ids() -> (u32, u32) {
    let v = bpf_get_current_pid_tgid();
    ((v >> 32) as u32, v as u32)
}

/// Adds one to the [`counter`] `idx` of this CPU.
#[inline(always)]
pub fn bump(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

/// Whether process `tgid` may send one more failure record now: at most
/// `Config::failure_events_per_second` in each one-second window. A record held back is
/// counted in [`counter::THROTTLED`]. Records of calls inside `cuInit`, slow ones and stalls
/// are never held back (callers ask only for failures outside `cuInit`).
#[inline(always)]
pub fn failure_allowed(tgid: u32, now: u64) -> bool {
    let limit = match config() {
        Some(c) => c.failure_events_per_second,
        None => return true,
    };
    if limit == 0 {
        return true;
    }
    match FAILURE_RATE.get_ptr_mut(&tgid) {
        Some(w) => {
            let w = unsafe { &mut *w };
            if now.saturating_sub(w.start_ns) >= 1_000_000_000 {
                w.start_ns = now;
                w.sent = 1;
                return true;
            }
            if w.sent < limit {
                w.sent += 1;
                return true;
            }
            bump(counter::THROTTLED);
            false
        }
        None => {
            let w = RateWindow {
                start_ns: now,
                sent: 1,
                _pad: 0,
            };
            // A full LRU map evicts another process's window: never a reason to hold back.
            let _ = FAILURE_RATE.insert(&tgid, &w, 0);
            true
        }
    }
}

/// The header of a record of `kind` made now by the current thread.
#[inline(always)]
pub fn header(kind: u32, tgid: u32, tid: u32, now: u64) -> EventHeader {
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
pub fn emit<T: 'static>(ev: &T) {
    if EVENTS.output::<T>(ev, 0).is_err() {
        bump(counter::RINGBUF_DROPS);
    }
}

// ---------------------------------------------------------------------------------------------
// aggregates
// ---------------------------------------------------------------------------------------------

/// Adds one to `map[key]` of this CPU, creating the entry at 1; a full map is counted in
/// counter `full`.
#[inline(always)]
pub fn count<K>(map: &PerCpuHashMap<K, u64>, key: &K, full: u32) {
    match map.get_ptr_mut(key) {
        Some(c) => unsafe { *c += 1 },
        None => {
            if map.insert(key, &1, 0).is_err() {
                bump(full);
            }
        }
    }
}

/// Adds one call of `dur` ns, in bucket `b`, to a histogram.
#[inline(always)]
pub fn add_sample(h: *mut LatencyHist, b: usize, dur: u64) {
    let h = unsafe { &mut *h };
    if let Some(slot) = h.buckets.get_mut(b) {
        *slot += 1;
    }
    h.sum_ns += dur;
    h.count += 1;
}

/// Whether a [`result`] kind and code is a failure (an errno, or an `NV_STATUS` other than
/// `NV_OK`).
#[inline(always)]
pub fn failed(kind: u8, code: u32) -> bool {
    kind == result::ERRNO || (kind == result::NV_STATUS && code != 0)
}

// ---------------------------------------------------------------------------------------------
// the fd table
// ---------------------------------------------------------------------------------------------

/// The state of `tgid`, made now when the process is not known yet.
#[inline(always)]
pub fn ensure_proc(tgid: u32, now: u64) -> Option<ProcState> {
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
    if PROCS.insert(&tgid, &p, 0).is_err() {
        bump(counter::PROCS_FULL);
        return None;
    }
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
pub fn resolve_fd(tgid: u32, fd: u32) -> Option<FdInfo> {
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

/// Records (tgid, fd) as an open node of `node_kind`.
#[inline(always)]
pub fn track_fd(tgid: u32, fd: u32, node_kind: u8, minor: u8, flags: u8, now: u64) {
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
pub fn untrack_fd(tgid: u32, fd: u32) {
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
// the file behind an fd
// ---------------------------------------------------------------------------------------------

/// A kernel value of type `T` at `addr`.
#[inline(always)]
fn kread<T>(addr: u64) -> Option<T> {
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// The `struct file *` behind `fd` in the current task's fd table:
/// `task_struct.files -> files_struct.fdt -> fdtable.fd[fd]` (offsets from BTF, in
/// [`Config::files`]). `None` when the offsets are unknown, the fd is past `max_fds` or not
/// open.
#[inline(always)]
pub fn file_of_fd(cfg: &Config, fd: u32) -> Option<u64> {
    let o = &cfg.files;
    if o.ready == 0 {
        return None;
    }
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = kread(task + o.task_files as u64)?;
    let fdt: u64 = kread(files + o.files_fdt as u64)?;
    let max: u32 = kread(fdt + o.fdt_max_fds as u64)?;
    if fd >= max {
        return None;
    }
    let arr: u64 = kread(fdt + o.fdt_fd as u64)?;
    let f: u64 = kread(arr + fd as u64 * 8)?;
    (f != 0).then_some(f)
}

/// What identifies a file: its inode's mode and `rdev`, and its (superblock device, inode).
#[derive(Clone, Copy)]
pub struct FileIds {
    pub is_chr: bool,
    pub rdev: u32,
    pub key: DevFileKey,
}

/// [`FileIds`] of `struct file *file`.
#[inline(always)]
pub fn file_ids(cfg: &Config, file: u64) -> Option<FileIds> {
    let o = &cfg.files;
    let inode: u64 = kread(file + o.file_inode as u64)?;
    let mode: u16 = kread(inode + o.inode_mode as u64)?;
    let rdev: u32 = kread(inode + o.inode_rdev as u64)?;
    let ino: u64 = kread(inode + o.inode_ino as u64)?;
    let sb: u64 = kread(inode + o.inode_sb as u64)?;
    let dev: u32 = kread(sb + o.sb_dev as u64)?;
    Some(FileIds {
        is_chr: mode & S_IFMT == S_IFCHR,
        rdev,
        key: DevFileKey { dev, _pad: 0, ino },
    })
}

/// The NVIDIA node `ids` stand for: a character device by its number
/// ([`classify_rdev`]), any other file by `DEVFILES` (filled when it was opened at a
/// `/dev/nvidia*` name, or by user space for files open before the agent started).
#[inline(always)]
pub fn node_of(cfg: &Config, ids: &FileIds) -> (u8, u8) {
    if ids.is_chr {
        return classify_rdev(ids.rdev, cfg.uvm_major);
    }
    match unsafe { DEVFILES.get(&ids.key) } {
        Some(d) => (d.node, d.minor),
        None => (node::NONE, 0),
    }
}

/// How many mounts a name is followed up through: a file bind-mounted at `/dev/nvidia-uvm`
/// on a tmpfs that is itself mounted over the devtmpfs at `/dev` (the testbed) needs two.
const MOUNT_CROSSINGS: usize = 4;

/// The dentry a name is read from, and the mount (`struct mount *`) it is seen in: the root
/// of a mount (a bind-mounted file, the root of a tmpfs at `/dev`) is named by where it is
/// mounted, through stacked mounts.
#[inline(always)]
fn mounted_name(o: &FileOffsets, dentry: u64, mnt: u64) -> Option<(u64, u64)> {
    let (mut d, mut m) = (dentry, mnt);
    let mut i = 0;
    while i < MOUNT_CROSSINGS {
        i += 1;
        let root: u64 = kread(m + o.mount_mnt as u64 + o.vfsmount_root as u64)?;
        if d != root {
            break;
        }
        let parent: u64 = kread(m + o.mount_parent as u64)?;
        if parent == m {
            // The namespace's root mount is its own parent.
            break;
        }
        d = kread(m + o.mount_mountpoint as u64)?;
        m = parent;
    }
    Some((d, m))
}

/// The node kind a file's name says, when it sits at `/dev/<name>`: the last component
/// and its parent directory's, read from the file's own `f_path` (dentry names, crossing up
/// to [`MOUNT_CROSSINGS`] mounts for each: a file bind-mounted at `/dev/nvidia-uvm` is named
/// by its mount point, and a `/dev` that is the root of a tmpfs by its own). The caller's
/// path string is never read.
#[inline(always)]
pub fn node_of_dev_name(cfg: &Config, file: u64) -> Option<(u8, u8)> {
    let o = &cfg.files;
    let dentry: u64 = kread(file + o.file_dentry as u64)?;
    let vfsmnt: u64 = kread(file + o.file_mnt as u64)?;
    let mnt = vfsmnt.wrapping_sub(o.mount_mnt as u64);
    let (d, mnt) = mounted_name(o, dentry, mnt)?;
    let mut name = [0u8; NODE_NAME_LEN];
    let p: u64 = kread(d + o.dentry_name as u64)?;
    unsafe { bpf_probe_read_kernel_str_bytes(p as *const u8, &mut name) }.ok()?;
    let kind = classify_node_name(&name);
    if kind.0 == node::NONE {
        return None;
    }
    let parent: u64 = kread(d + o.dentry_parent as u64)?;
    let (pd, _) = mounted_name(o, parent, mnt)?;
    let mut pname = [0u8; 8];
    let pp: u64 = kread(pd + o.dentry_name as u64)?;
    unsafe { bpf_probe_read_kernel_str_bytes(pp as *const u8, &mut pname) }.ok()?;
    (pname[0] == b'd' && pname[1] == b'e' && pname[2] == b'v' && pname[3] == 0).then_some(kind)
}

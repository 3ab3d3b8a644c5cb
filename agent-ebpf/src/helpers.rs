//! What every probe uses: the settings, the caller's ids, counters, record headers and
//! sending, the per-CPU aggregates, the processes whose ioctls are looked at (`PROCS`), and
//! the file behind an fd, read from the task's own fd table and identified by what it is.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    maps::PerCpuHashMap,
};
use uvmwatch_common::{
    classify_node_name, classify_rdev, counter, is_libcuda_name, node, result, Config, DevFileKey,
    EventHeader, FileOffsets, LatencyHist, ProcState, RateWindow, COMM_LEN, NODE_NAME_LEN, S_IFCHR,
    S_IFMT,
};

use crate::maps::{CONFIG, COUNTERS, DEVFILES, EVENTS, FAILURE_RATE, PROCS, PROC_GATE};

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
// the processes looked at
// ---------------------------------------------------------------------------------------------

/// Whether `pid` may be in `PROCS` (`PROC_GATE`; a pid past the gate's end may).
#[inline(always)]
pub fn maybe_tracked(pid: u32) -> bool {
    match PROC_GATE.get(pid) {
        Some(v) => *v != 0,
        None => true,
    }
}

/// Puts `pid` in `PROCS` (`st`) and opens its gate; `false` when the map is full.
#[inline(always)]
pub fn track(pid: u32, st: &ProcState) -> bool {
    // The gate first: a call between the two is looked up in `PROCS`, never missed.
    if let Some(g) = PROC_GATE.get_ptr_mut(pid) {
        unsafe { *g = 1 };
    }
    PROCS.insert(&pid, st, 0).is_ok()
}

/// Takes `pid` out of `PROCS` and closes its gate.
#[inline(always)]
pub fn untrack(pid: u32) {
    let _ = PROCS.remove(&pid);
    if let Some(g) = PROC_GATE.get_ptr_mut(pid) {
        unsafe { *g = 0 };
    }
}

/// The state of `tgid` in `PROCS`, put there now (its ioctls are looked at from now on)
/// when it is not; a full map is counted.
#[inline(always)]
pub fn ensure_proc(tgid: u32, now: u64) -> Option<ProcState> {
    if let Some(p) = unsafe { PROCS.get(&tgid) } {
        return Some(*p);
    }
    let p = ProcState {
        since_ns: now,
        parent_tgid: 0,
        execed: 0,
        unprobed_load_ns: 0,
        unprobed_load_tid: 0,
        _pad: 0,
    };
    if !track(tgid, &p) {
        bump(counter::PROCS_FULL);
        return None;
    }
    Some(p)
}

// ---------------------------------------------------------------------------------------------
// the file behind an fd
// ---------------------------------------------------------------------------------------------

/// A kernel value of type `T` at `addr`.
#[inline(always)]
pub fn kread<T>(addr: u64) -> Option<T> {
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
    // `max_fds` and `fd` side by side (as in `struct fdtable` of 5.x and 6.x: an `unsigned
    // int`, then the pointer 8 bytes on): one read for both.
    let (max, arr) = if o.fdt_fd == o.fdt_max_fds + 8 {
        let pair: [u64; 2] = kread(fdt + o.fdt_max_fds as u64)?;
        (pair[0] as u32, pair[1])
    } else {
        (
            kread::<u32>(fdt + o.fdt_max_fds as u64)?,
            kread::<u64>(fdt + o.fdt_fd as u64)?,
        )
    };
    if fd >= max {
        return None;
    }
    let f: u64 = kread(arr + fd as u64 * 8)?;
    (f != 0).then_some(f)
}

/// What a file is, as far as identifying it goes: a character device by its number, any
/// other file by its (superblock device, inode).
#[derive(Clone, Copy)]
pub enum FileId {
    Chr { rdev: u32 },
    Other { key: DevFileKey },
}

/// [`FileId`] of `struct file *file` (three reads for a character device, five otherwise).
#[inline(always)]
pub fn file_id(cfg: &Config, file: u64) -> Option<FileId> {
    let o = &cfg.files;
    let inode: u64 = kread(file + o.file_inode as u64)?;
    let mode: u16 = kread(inode + o.inode_mode as u64)?;
    if mode & S_IFMT == S_IFCHR {
        let rdev: u32 = kread(inode + o.inode_rdev as u64)?;
        return Some(FileId::Chr { rdev });
    }
    let ino: u64 = kread(inode + o.inode_ino as u64)?;
    let sb: u64 = kread(inode + o.inode_sb as u64)?;
    let dev: u32 = kread(sb + o.sb_dev as u64)?;
    Some(FileId::Other {
        key: DevFileKey { dev, _pad: 0, ino },
    })
}

/// The NVIDIA node `id` stands for: a character device by its number
/// ([`classify_rdev`]), any other file by `DEVFILES` (filled when it was opened at a
/// `/dev/nvidia*` name, or by user space for files open before the agent started).
#[inline(always)]
pub fn node_of(cfg: &Config, id: &FileId) -> (u8, u8) {
    match id {
        FileId::Chr { rdev } => classify_rdev(*rdev, cfg.uvm_major),
        FileId::Other { key } => match unsafe { DEVFILES.get(key) } {
            Some(d) => (d.node, d.minor),
            None => (node::NONE, 0),
        },
    }
}

/// The NVIDIA node behind `fd` of the current task (`None` when the offsets are unknown or
/// the fd is not open; `node::NONE` for any other file).
#[inline(always)]
pub fn node_of_fd(cfg: &Config, fd: u32) -> Option<(u8, u8)> {
    let file = file_of_fd(cfg, fd)?;
    let id = file_id(cfg, file)?;
    Some(node_of(cfg, &id))
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

/// What a file that is not a character device is named as.
pub enum Named {
    /// A `/dev/nvidia*` node name (kind, minor): a double of that node.
    Node(u8, u8),
    /// A `libcuda.so*` file.
    Libcuda,
}

/// What a file's own name says (its `f_path`'s dentry, crossing up to [`MOUNT_CROSSINGS`]
/// mounts: a file bind-mounted at `/dev/nvidia-uvm` is named by its mount point, and a
/// `/dev` that is the root of a tmpfs by its own): a `/dev/nvidia*` node when it sits in a
/// directory named `dev`, or a `libcuda.so*` file anywhere. The caller's path string is
/// never read.
#[inline(always)]
pub fn file_name_kind(cfg: &Config, file: u64) -> Option<Named> {
    let o = &cfg.files;
    let dentry: u64 = kread(file + o.file_dentry as u64)?;
    let vfsmnt: u64 = kread(file + o.file_mnt as u64)?;
    let mnt = vfsmnt.wrapping_sub(o.mount_mnt as u64);
    let (d, mnt) = mounted_name(o, dentry, mnt)?;
    let mut name = [0u8; NODE_NAME_LEN];
    let p: u64 = kread(d + o.dentry_name as u64)?;
    unsafe { bpf_probe_read_kernel_str_bytes(p as *const u8, &mut name) }.ok()?;
    if is_libcuda_name(&name) {
        return Some(Named::Libcuda);
    }
    let kind = classify_node_name(&name);
    if kind.0 == node::NONE {
        return None;
    }
    let parent: u64 = kread(d + o.dentry_parent as u64)?;
    let (pd, _) = mounted_name(o, parent, mnt)?;
    let mut pname = [0u8; 8];
    let pp: u64 = kread(pd + o.dentry_name as u64)?;
    unsafe { bpf_probe_read_kernel_str_bytes(pp as *const u8, &mut pname) }.ok()?;
    (pname[0] == b'd' && pname[1] == b'e' && pname[2] == b'v' && pname[3] == 0)
        .then_some(Named::Node(kind.0, kind.1))
}

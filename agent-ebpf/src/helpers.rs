//! What every probe uses: the settings, the caller's ids, counters, record headers and
//! sending, the per-CPU aggregates, and the fd table (`FDS` and `PROCS`, with `fork`
//! inheritance).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    maps::PerCpuHashMap,
};
use uvmwatch_common::{
    counter, node, result, Config, EventHeader, FdInfo, FdKey, LatencyHist, ProcState, RateWindow,
    COMM_LEN, FD_CLOEXEC, FD_INHERITED,
};

use crate::maps::{CONFIG, COUNTERS, EVENTS, FAILURE_RATE, FDS, PROCS};

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

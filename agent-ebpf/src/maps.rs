//! Every map of the kernel side. User space finds them by these names (`agent/src/kernel/`),
//! so a name, a key or a value type changes only together with the agent.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use uvmwatch_common::{
    context_call, counter, kernel_fn, CmdInfo, CmdKey, Config, ContextCallKey,
    ContextCallResultKey, DevFile, DevFileKey, InflightContextCall, InflightCuinit, InflightIoctl,
    IoctlKey, KernelFnKey, KernelFnResultKey, LatencyHist, OpenEvent, OpenKey, ProcState,
    RateWindow,
};

/// `BPF_F_NO_PREALLOC`: per-CPU hashes grow with use instead of reserving
/// `max_entries * ncpus` values up front.
const NO_PREALLOC: u32 = 1;

// ---------------------------------------------------------------------------------------------
// written by user space
// ---------------------------------------------------------------------------------------------

/// Runtime settings, one entry, written at start; every program does nothing until
/// [`Config::ready`] is set.
#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Where each ioctl command keeps its `rmStatus` (filled by user space from its tables).
#[map]
pub static CMDS: HashMap<CmdKey, CmdInfo> = HashMap::with_max_entries(1024, 0);
/// Every request user space can name: UVM commands by request number, RM escapes by
/// `_IOC_NR` (`CmdKey::cmd`). The aggregates keep a named request under its number and the
/// rest under [`uvmwatch_common::UNKNOWN_CMD`].
#[map]
pub static NAMED_CMDS: HashMap<CmdKey, u8> = HashMap::with_max_entries(1024, 0);

// ---------------------------------------------------------------------------------------------
// to user space
// ---------------------------------------------------------------------------------------------

/// Records user space must see (every one starts with `EventHeader`); a full buffer drops the
/// record and counts it in [`COUNTERS`].
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(512 * 1024, 0);
/// Per-CPU counters of lost records and full maps, indexed by [`counter`].
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

// ---------------------------------------------------------------------------------------------
// files and processes
// ---------------------------------------------------------------------------------------------

/// Files that are not character devices but were opened at a `/dev/nvidia*` name (test
/// doubles: FUSE files bind-mounted there), by (superblock device, inode): what node each
/// stands for. Filled at open and by user space for files open before the agent started;
/// LRU, so stale entries of deleted files age out.
#[map]
pub static DEVFILES: LruHashMap<DevFileKey, DevFile> = LruHashMap::with_max_entries(4096, 0);
/// Processes whose ioctls are looked at, by tgid: those that opened an NVIDIA node or a
/// libcuda file, those user space found holding an NVIDIA fd at start, and those forked
/// from any of them. One lookup here is all an ioctl of any other process costs.
#[map]
pub static PROCS: HashMap<u32, ProcState> = HashMap::with_max_entries(16384, 0);
/// libcuda files whose `cuInit` probes are attached, by (superblock device, inode): user
/// space adds a file once it attached to it and removes it when it detaches. A libcuda
/// opened while its file is not here marks its process (`ProcState::unprobed_load_ns`), so
/// a `cuInit` that runs before the probes are attached is still found (`probes/cuinit.rs`).
/// LRU: an evicted file only looks unprobed, and its probes still see its `cuInit` whole
/// (their entry clears the mark).
#[map]
pub static LIBCUDA_PROBED: LruHashMap<DevFileKey, u8> = LruHashMap::with_max_entries(1024, 0);
/// One entry per pid, 1 while `PROCS` may hold it: the ioctl enter's first test, an array
/// lookup instead of a hash lookup for every process that is not looked at (a pid past its
/// end goes on to `PROCS`). User space sizes it to `/proc/sys/kernel/pid_max`, at most 2^19
/// pids (the kernel keeps 8 bytes per element: 4 MiB at most). Opened wherever `PROCS`
/// gains a process; closed only by the kernel, at the process's exit.
#[map]
pub static PROC_GATE: Array<u8> = Array::with_max_entries(uvmwatch_common::PID_MAX_LIMIT, 0);

// ---------------------------------------------------------------------------------------------
// calls in flight (keyed by tid)
// ---------------------------------------------------------------------------------------------

/// Driver ioctls of processes in `PROCS`, on an identified NVIDIA file (or a negative fd), between
/// enter and exit; user space reads it for stalls.
#[map]
pub static INFLIGHT_IOCTL: LruHashMap<u32, InflightIoctl> = LruHashMap::with_max_entries(16384, 0);
/// `cuInit` calls between entry and return; a hung one stays here, which is how user space
/// sees it.
#[map]
pub static INFLIGHT_CUINIT: LruHashMap<u32, InflightCuinit> = LruHashMap::with_max_entries(8192, 0);
/// Tracepoint backend: the last `open`, `openat` or `openat2` of each thread (the path's
/// address, not the path), put here by the enter and taken by the exit only for an open it
/// reports (a failed one: its path is read then); any other stays until the thread's next
/// open overwrites it or the thread exits (an LRU map, so it never fills; an entry it
/// recycled is counted at its exit where needed: `counter::OPEN_UNFOLLOWED`). Fentry backend:
/// only opens of NVIDIA character devices, from `chrdev_open`'s entry (their start and
/// node) to `do_filp_open`'s exit.
#[map]
pub static PENDING_OPEN: LruHashMap<u32, PendingOpen> = LruHashMap::with_max_entries(16384, 0);
/// CUDA context and device calls between entry and return, per (thread, slot): the
/// `cuCtxCreate` versions share a slot, so only the outermost of nested ones counts.
#[map]
pub static INFLIGHT_CTX: LruHashMap<ContextCallKey, InflightContextCall> =
    LruHashMap::with_max_entries(8192, 0);
/// The last `cuDeviceGetCount` result sent to user space, per process (tgid): a count sent
/// once is not sent again for that process. Cleared on exec and on the process's exit.
#[map]
pub static DEVCOUNT_SENT: LruHashMap<u32, i32> = LruHashMap::with_max_entries(8192, 0);
/// Entry times of probed kernel functions in progress, per (thread, function).
#[map]
pub static KF_START: LruHashMap<KernelFnKey, u64> = LruHashMap::with_max_entries(16384, 0);

/// Value of [`PENDING_OPEN`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingOpen {
    /// The thread whose open it is (the key: see the tracepoint enter in `probes/open.rs`).
    pub tid: u32,
    pub _pad0: u32,
    /// User-space address of the path.
    pub filename: u64,
    /// The `O_*` flags of the open.
    pub open_flags: u64,
    pub start_ns: u64,
    /// 1 when the open is inside `cuInit`.
    pub in_cuinit: u8,
    /// On the fentry backend, the NVIDIA node `chrdev_open` was entered for (kind, minor);
    /// `node::NONE` on the tracepoint backend.
    pub node: u8,
    pub minor: u8,
    /// 1 when `filename` is the kernel's copy of the path (fentry), 0 the caller's.
    pub kernel_path: u8,
    /// 1 once `chrdev_open`'s exit reported the open as refused by its driver (fentry):
    /// `do_filp_open`'s exit, which sees the same failure, then says nothing of it.
    pub reported: u8,
    pub _pad: [u8; 3],
}

impl PendingOpen {
    /// An open of no known node begun at `start_ns`, not (yet) known to be inside `cuInit`.
    #[inline(always)]
    pub fn new(
        tid: u32,
        filename: u64,
        open_flags: u64,
        start_ns: u64,
        kernel_path: bool,
    ) -> PendingOpen {
        PendingOpen {
            tid,
            _pad0: 0,
            filename,
            open_flags,
            start_ns,
            in_cuinit: 0,
            node: uvmwatch_common::node::NONE,
            minor: 0,
            kernel_path: kernel_path as u8,
            reported: 0,
            _pad: [0; 3],
        }
    }
}

// ---------------------------------------------------------------------------------------------
// aggregates, per CPU, read by user space at scrape
// ---------------------------------------------------------------------------------------------

/// Ioctl latency histograms per (cmd, node, minor).
#[map]
pub static IOCTL_HIST: PerCpuHashMap<IoctlKey, LatencyHist> =
    PerCpuHashMap::with_max_entries(512, NO_PREALLOC);
/// Ioctl result counters per (cmd, node, minor, result kind, code).
#[map]
pub static IOCTL_RESULTS: PerCpuHashMap<IoctlKey, u64> =
    PerCpuHashMap::with_max_entries(2048, NO_PREALLOC);
/// Device open counters per (node, minor, errno).
#[map]
pub static OPENS: PerCpuHashMap<OpenKey, u64> = PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);
/// Kernel-function latency histograms, indexed by [`kernel_fn`] id.
#[map]
pub static KF_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(kernel_fn::COUNT, 0);
/// Kernel-function result counters per (function, result kind, code).
#[map]
pub static KF_RESULTS: PerCpuHashMap<KernelFnResultKey, u64> =
    PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);

/// CUDA context and device call latency histograms, indexed by [`context_call`] id.
#[map]
pub static CTX_HIST: PerCpuArray<LatencyHist> =
    PerCpuArray::with_max_entries(context_call::COUNT, 0);
/// CUDA context and device call result counters per (call, `CUresult`).
#[map]
pub static CTX_RESULTS: PerCpuHashMap<ContextCallResultKey, u64> =
    PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);

// ---------------------------------------------------------------------------------------------
// per-CPU scratch
// ---------------------------------------------------------------------------------------------

/// An `OpenEvent` being built (too large for the 512-byte stack).
#[map]
pub static SCRATCH_OPEN: PerCpuArray<OpenEvent> = PerCpuArray::with_max_entries(1, 0);
/// A zeroed histogram: the initial value of new [`IOCTL_HIST`] entries.
#[map]
pub static ZERO_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(1, 0);

/// Failure records sent per process in the current second (the throttle of
/// [`crate::helpers::failure_allowed`]); LRU, so a churn of processes recycles entries.
#[map]
pub static FAILURE_RATE: LruHashMap<u32, RateWindow> = LruHashMap::with_max_entries(8192, 0);

// ---------------------------------------------------------------------------------------------
// the overhead benchmark's floor reference (`probes::floor`), not used by `uvmwatch run`
// ---------------------------------------------------------------------------------------------

/// Hits of `floor_tp`, one per-CPU counter: its one map operation. The agent creates the
/// map with the others (8 bytes per CPU) but no program of its own touches it.
#[map]
pub static FLOOR_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

//! Types shared by the uvmwatch eBPF programs (`agent-ebpf`) and the agent (`agent`).
//!
//! Everything here is `#[repr(C)]`, made of fixed-width integers (no `bool`, no pointers) and
//! padded explicitly, so the kernel side and user space agree byte for byte. With the `user`
//! feature every map key and value implements [`aya::Pod`].
//!
//! Layout rules kept by this crate:
//! * every ring-buffer record starts with [`EventHeader`]; [`EventHeader::kind`] is one of the
//!   `EVENT_*` numbers, which are never reused;
//! * times are `bpf_ktime_get_ns()` values: nanoseconds of `CLOCK_MONOTONIC`;
//! * sizes are asserted in the tests at the bottom.
//!
//! Over 800 lines: every record and map value both sides read is here, one crate, so that a
//! layout has one definition (kernel-function records are in [`kernel_fn`]); the size tests at
//! the bottom are a fifth of it.
#![no_std]

/// Length of a task's `comm` (`TASK_COMM_LEN` in `include/linux/sched.h`).
pub const COMM_LEN: usize = 16;
/// Bytes of a path kept in [`OpenEvent`]; longer paths are cut (and flagged).
pub const PATH_LEN: usize = 128;

// ---------------------------------------------------------------------------------------------
// Device nodes
// ---------------------------------------------------------------------------------------------

/// Kind of NVIDIA device node behind a file descriptor (`DevFile::node`, `*Key::node`).
pub mod node {
    /// Not an NVIDIA node.
    pub const NONE: u8 = 0;
    /// `/dev/nvidiactl` (char 195:255): RM control node.
    pub const CTL: u8 = 1;
    /// `/dev/nvidia<N>` (char 195:N): one per GPU; the minor N is kept beside the kind.
    pub const GPU: u8 = 2;
    /// `/dev/nvidia-uvm` (dynamic major, minor 0).
    pub const UVM: u8 = 3;
    /// `/dev/nvidia-uvm-tools` (same major, minor 1).
    pub const UVM_TOOLS: u8 = 4;
    /// No node: an ioctl on a negative fd by a process that uses NVIDIA nodes (real `cuInit`s
    /// issue `UVM_DEINITIALIZE` on fd = -errno after a failed `/dev/nvidia-uvm` open). The
    /// kernel fails it with `EBADF` before any driver sees it.
    pub const INVALID_FD: u8 = 5;
    /// Highest kind number in use.
    pub const MAX: u8 = 5;

    /// Whether ioctls on this kind carry UVM command numbers (plain integers) rather than RM
    /// `_IOWR('F', nr, size)` escapes.
    #[inline(always)]
    pub const fn is_uvm(kind: u8) -> bool {
        kind == UVM || kind == UVM_TOOLS
    }
}

/// Classify a NUL-terminated path the kernel read from `openat`'s `filename` argument.
///
/// Returns `(kind, minor)`: `minor` is the GPU number for [`node::GPU`] and 0 otherwise.
/// Recognises exactly `/dev/nvidiactl`, `/dev/nvidia<N>` (N = 0..=254, decimal, no leading
/// zero), `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`; everything else (e.g.
/// `/dev/nvidia-modeset`, `/dev/nvidia-caps/…`, `/dev/nvidia-nvswitch0`) is [`node::NONE`].
/// Written without loops over the input beyond a fixed bound so the BPF verifier accepts it.
#[inline(always)]
pub fn classify_dev_path(p: &[u8; 32]) -> (u8, u8) {
    const PREFIX: &[u8; 5] = b"/dev/";
    let mut i = 0;
    while i < PREFIX.len() {
        if p[i] != PREFIX[i] {
            return (node::NONE, 0);
        }
        i += 1;
    }
    let mut name = [0u8; NODE_NAME_LEN];
    let mut j = 0;
    while j < NODE_NAME_LEN {
        name[j] = p[5 + j];
        j += 1;
    }
    classify_node_name(&name)
}

/// Bytes of a node's name [`classify_node_name`] looks at: `nvidia-uvm-tools` and its NUL
/// fit.
pub const NODE_NAME_LEN: usize = 24;

/// Whether a NUL-terminated file name (a dentry's `d_name`) starts with `libcuda.so`: the
/// CUDA driver library, whose read-only opens are libraries being loaded.
#[inline(always)]
pub fn is_libcuda_name(p: &[u8; NODE_NAME_LEN]) -> bool {
    const NAME: &[u8; 10] = b"libcuda.so";
    let mut i = 0;
    while i < NAME.len() {
        if p[i] != NAME[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Classify a NUL-terminated file name (the last path component, as a dentry's `d_name`
/// holds it): `nvidiactl`, `nvidia<N>` (N = 0..=254, decimal, no leading zero),
/// `nvidia-uvm`, `nvidia-uvm-tools`. Returns `(kind, minor)` as [`classify_dev_path`].
#[inline(always)]
pub fn classify_node_name(p: &[u8; NODE_NAME_LEN]) -> (u8, u8) {
    const PREFIX: &[u8; 6] = b"nvidia";
    let mut i = 0;
    while i < PREFIX.len() {
        if p[i] != PREFIX[i] {
            return (node::NONE, 0);
        }
        i += 1;
    }
    let rest = &p[6..];
    // "ctl\0"
    if rest[0] == b'c' && rest[1] == b't' && rest[2] == b'l' && rest[3] == 0 {
        return (node::CTL, 0);
    }
    // "-uvm\0" / "-uvm-tools\0"
    if rest[0] == b'-' && rest[1] == b'u' && rest[2] == b'v' && rest[3] == b'm' {
        if rest[4] == 0 {
            return (node::UVM, 0);
        }
        if rest[4] == b'-'
            && rest[5] == b't'
            && rest[6] == b'o'
            && rest[7] == b'o'
            && rest[8] == b'l'
            && rest[9] == b's'
            && rest[10] == 0
        {
            return (node::UVM_TOOLS, 0);
        }
        return (node::NONE, 0);
    }
    // "<N>\0" with 1..=3 digits, value <= 254, no leading zero unless N == 0.
    let mut n: u32 = 0;
    let mut digits = 0;
    while digits < 4 {
        let c = rest[digits];
        if c == 0 {
            break;
        }
        if !c.is_ascii_digit() {
            return (node::NONE, 0);
        }
        n = n * 10 + (c - b'0') as u32;
        digits += 1;
    }
    if digits == 0 || digits > 3 || rest[digits] != 0 || n > 254 || (digits > 1 && rest[0] == b'0')
    {
        return (node::NONE, 0);
    }
    (node::GPU, n as u8)
}

/// NVIDIA's reserved character major, for `nvidiactl` and the GPU nodes
/// (`NV_MAJOR_DEVICE_NUMBER`, `kernel-open/common/inc/nv-chardev-numbers.h` of NVIDIA's open
/// kernel modules; the same in the proprietary `nv.h`). `nvidia-uvm`'s major is dynamic
/// (`alloc_chrdev_region` in `uvm.c`): user space reads it from `/proc/devices`.
pub const NV_MAJOR: u32 = 195;
/// `nvidiactl`'s minor (`NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE`, the same header).
pub const NV_CTL_MINOR: u32 = 255;
/// `nvidia-uvm-tools`' minor under the UVM major (`NVIDIA_UVM_TOOLS_MINOR_NUMBER`,
/// `kernel-open/nvidia-uvm/uvm_common.h`); `nvidia-uvm` is minor 0.
pub const UVM_TOOLS_MINOR: u32 = 1;

/// The kernel's internal `dev_t` split (`MINORBITS` = 20, `include/linux/kdev_t.h`), as in
/// `inode::i_rdev` and `super_block::s_dev` (not the `stat` encoding: see [`kdev_from`]).
pub const KDEV_MINOR_BITS: u32 = 20;

/// The kernel-internal `dev_t` (`MKDEV`) of a major and minor.
#[inline(always)]
pub const fn kdev_from(major: u32, minor: u32) -> u32 {
    (major << KDEV_MINOR_BITS) | (minor & ((1 << KDEV_MINOR_BITS) - 1))
}

/// `S_IFMT` and `S_IFCHR` (`include/uapi/linux/stat.h`).
pub const S_IFMT: u16 = 0o170000;
pub const S_IFCHR: u16 = 0o020000;

/// Node kind and minor of a character device `rdev` (kernel-internal `dev_t`): major
/// [`NV_MAJOR`] gives `nvidiactl` (minor [`NV_CTL_MINOR`]) or GPU `N` (minor 0..=254, 254
/// being NVKMS's modeset node, which is not ours: see `NV_MINOR_DEVICE_NUMBER_MODESET_DEVICE`);
/// `uvm_major` (0 when `nvidia-uvm` is not registered) gives `nvidia-uvm` (minor 0) and
/// `nvidia-uvm-tools` (minor 1).
#[inline(always)]
pub const fn classify_rdev(rdev: u32, uvm_major: u32) -> (u8, u8) {
    let major = rdev >> KDEV_MINOR_BITS;
    let minor = rdev & ((1 << KDEV_MINOR_BITS) - 1);
    if major == NV_MAJOR {
        if minor == NV_CTL_MINOR {
            return (node::CTL, 0);
        }
        if minor < 254 {
            return (node::GPU, minor as u8);
        }
        return (node::NONE, 0);
    }
    if uvm_major != 0 && major == uvm_major {
        if minor == 0 {
            return (node::UVM, 0);
        }
        if minor == UVM_TOOLS_MINOR {
            return (node::UVM_TOOLS, 0);
        }
    }
    (node::NONE, 0)
}

// ---------------------------------------------------------------------------------------------
// Maps: keys and values
// ---------------------------------------------------------------------------------------------

/// Value of the `PROCS` map, keyed by tgid: processes that opened an NVIDIA node or a
/// libcuda file, were found holding an NVIDIA fd at start, or were forked from one of them.
/// Only their ioctls are looked at (the gate of `ioctl_enter`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ProcState {
    /// When the process entered the map (ns, `CLOCK_MONOTONIC`).
    pub since_ns: u64,
    /// The tgid of the process it was forked from, when it entered the map by `fork` (0
    /// otherwise).
    pub parent_tgid: u32,
    /// 1 once the process exec'ed (it is no longer a copy of its parent).
    pub execed: u32,
    /// When the process loaded a libcuda whose `cuInit` probes were not attached yet (ns;
    /// 0: none since). The first driver call of the thread that loaded it
    /// ([`ProcState::unprobed_load_tid`]) then starts a [`InflightCuinit::late`] call, and
    /// clears it; a probed libcuda call of the process clears it too.
    pub unprobed_load_ns: u64,
    /// The thread that loaded that libcuda (the CUDA runtime loads it on the thread that
    /// then calls `cuInit`; another thread's driver calls, NVML's say, are no `cuInit`).
    pub unprobed_load_tid: u32,
    pub _pad: u32,
}

/// Key of the `CMDS` map: which ioctl commands have a known `rmStatus` location.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CmdKey {
    /// 1 for UVM nodes (`nvidia-uvm`, `nvidia-uvm-tools`), 0 for RM nodes (`nvidiactl`, GPUs).
    pub uvm: u32,
    /// UVM: the request number as passed to `ioctl(2)`. RM: [`rm_cmd_key`] of it.
    pub cmd: u32,
}

/// `_IOC_SIZEMASK << _IOC_SIZESHIFT | _IOC_NRMASK` (`include/uapi/asm-generic/ioctl.h`).
pub const IOC_SIZE_AND_NR: u32 = 0x3fff_00ff;

/// The part of an RM escape's request number the driver dispatches on: `_IOC_NR` and
/// `_IOC_SIZE`. `nvidia_ioctl` (`kernel-open/nvidia/nv.c`) ignores the type byte and the
/// direction bits, so callers that do not use 'F' reach the same escape.
#[inline(always)]
pub const fn rm_cmd_key(cmd: u32) -> u32 {
    cmd & IOC_SIZE_AND_NR
}

/// Value of the `CMDS` map, filled by user space from its table so a new driver needs no
/// rebuild of the eBPF object.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CmdInfo {
    /// Byte offset of the `NV_STATUS rmStatus` (u32) inside the params struct.
    pub status_offset: u32,
    /// Size of the params struct in bytes (informational; the offset is checked against it).
    pub params_size: u32,
}

/// Ioctl in flight on one thread (`INFLIGHT_IOCTL`, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InflightIoctl {
    /// Entry time (ns, `CLOCK_MONOTONIC`).
    pub start_ns: u64,
    /// User-space address of the params (`arg` of `ioctl(2)`).
    pub arg: u64,
    pub tgid: u32,
    pub fd: u32,
    /// Request number.
    pub cmd: u32,
    /// Node kind ([`node`]).
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    /// 1 when the call began inside a `cuInit` of the same thread.
    pub in_cuinit: u8,
    pub _pad: u8,
}

/// `cuInit` in flight on one thread (`INFLIGHT_CUINIT`, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InflightCuinit {
    /// Entry time (ns, `CLOCK_MONOTONIC`).
    pub start_ns: u64,
    pub tgid: u32,
    /// The `Flags` argument of `cuInit` (must be 0 per the CUDA driver API).
    pub flags: u32,
    /// 1 for a call whose entry no probe saw: its libcuda was loaded before its probes were
    /// attached, and the call was found at its first driver call (`start_ns` is that
    /// call's start; see [`CUINIT_LATE`]).
    pub late: u32,
    pub _pad: u32,
}

/// Number of log2 buckets in [`LatencyHist`]: bucket `i` counts calls with
/// `2^i <= ns < 2^(i+1)` (bucket 0 also holds 0 ns); the last bucket holds everything above.
pub const HIST_BUCKETS: usize = 40;

/// Key of the per-CPU `IOCTL_HIST` and `IOCTL_RESULTS` maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IoctlKey {
    /// Request number.
    pub cmd: u32,
    /// Node kind ([`node`]).
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    /// For `IOCTL_RESULTS`: one of [`result`]; 0 in `IOCTL_HIST`.
    pub result_kind: u8,
    pub _pad: u8,
    /// For `IOCTL_RESULTS`: the errno (positive) or `NV_STATUS`; 0 in `IOCTL_HIST`.
    pub code: u32,
}

/// How an ioctl ended, in [`IoctlKey::result_kind`] and [`IoctlEvent::result_kind`].
pub mod result {
    /// Syscall returned >= 0 and no `rmStatus` is known for the command.
    pub const OK: u8 = 0;
    /// Syscall returned >= 0 and the `rmStatus` read from the params is in `code`
    /// (`NV_OK` = 0 included).
    pub const NV_STATUS: u8 = 1;
    /// Syscall failed; `code` is the errno.
    pub const ERRNO: u8 = 2;
    /// Syscall returned >= 0 but the params could not be read at exit.
    pub const UNREADABLE: u8 = 3;
}

/// Per-CPU latency histogram (`IOCTL_HIST` value), in nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHist {
    /// Log2 buckets, see [`HIST_BUCKETS`].
    pub buckets: [u64; HIST_BUCKETS],
    /// Sum of all latencies (ns).
    pub sum_ns: u64,
    /// Number of calls.
    pub count: u64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist {
            buckets: [0; HIST_BUCKETS],
            sum_ns: 0,
            count: 0,
        }
    }
}

/// Bucket index of a latency in ns for [`LatencyHist`]: `floor(log2(ns))`, capped.
#[inline(always)]
pub fn hist_bucket(ns: u64) -> usize {
    if ns == 0 {
        return 0;
    }
    let b = 63 - ns.leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Key of the per-CPU `OPENS` map: device opens by node and result.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OpenKey {
    /// Node kind ([`node`]).
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    pub _pad: u16,
    /// 0 for success, else the errno (positive, e.g. 2 = ENOENT, 1 = EPERM).
    pub errno: u32,
}

/// Index of each counter in the per-CPU `COUNTERS` array.
pub mod counter {
    /// `bpf_ringbuf_reserve` failed: an event was lost.
    pub const RINGBUF_DROPS: u32 = 0;
    /// An in-flight map was full: a call could not be tracked.
    pub const INFLIGHT_FULL: u32 = 1;
    /// A failure record (a failed call or open outside `cuInit`) not sent because its
    /// process went past [`super::Config::failure_events_per_second`]; the call is counted
    /// in the aggregates all the same.
    pub const THROTTLED: u32 = 2;
    /// A failed open's path could not be read at its exit (a bad address: the kernel could
    /// not read it either): the failure is not classified. Successful opens are identified
    /// by their file and need no path.
    pub const PATH_UNREADABLE: u32 = 3;
    /// `PROCS` was full: a process that uses NVIDIA nodes was not put in it, so its ioctls
    /// are not looked at.
    pub const PROCS_FULL: u32 = 4;
    /// `PENDING_OPEN` was full: an open was not followed to its exit.
    pub const PENDING_OPEN_FULL: u32 = 5;
    /// `IOCTL_HIST` was full: a call's latency was not counted.
    pub const IOCTL_HIST_FULL: u32 = 6;
    /// `IOCTL_RESULTS` was full: a call's result was not counted.
    pub const IOCTL_RESULTS_FULL: u32 = 7;
    /// `OPENS` was full: a device open was not counted.
    pub const OPENS_FULL: u32 = 8;
    /// `KF_RESULTS` was full: a kernel function's result was not counted.
    pub const KF_RESULTS_FULL: u32 = 9;
    /// `CTX_RESULTS` was full: a context or device call's result was not counted.
    pub const CTX_RESULTS_FULL: u32 = 10;
    /// An open whose start the kernel side no longer held at its exit (tracepoint backend:
    /// `PENDING_OPEN`, an LRU map keyed by thread, recycled its entry for other threads'
    /// opens; or the open began before the probes were attached), where the exit needed it:
    /// a failed open (its path is not known, so it is not classified), a successful open of
    /// an NVIDIA node (counted in `OPENS` all the same, its start taken as its exit) or of a
    /// libcuda (not reported: its `cuInit` probes wait for the next process that loads it).
    /// Fentry backend: an NVIDIA node's successful open whose `chrdev_open` stamp was gone.
    pub const OPEN_UNFOLLOWED: u32 = 11;
    /// Number of counters.
    pub const COUNT: u32 = 12;
    /// Every "map full" counter and the `map` label `uvmwatch_kernel_map_full_total` gives
    /// it. The LRU maps (in-flight calls, kernel-function starts, failure budgets, the
    /// doubles in `DEVFILES`) recycle their oldest entry instead of refusing one and have no
    /// counter; `INFLIGHT_FULL` counts an in-flight insert refused all the same.
    pub const MAP_FULL: [(u32, &str); 8] = [
        (INFLIGHT_FULL, "inflight"),
        (PROCS_FULL, "procs"),
        (PENDING_OPEN_FULL, "pending_open"),
        (IOCTL_HIST_FULL, "ioctl_hist"),
        (IOCTL_RESULTS_FULL, "ioctl_results"),
        (OPENS_FULL, "opens"),
        (KF_RESULTS_FULL, "kf_results"),
        (CTX_RESULTS_FULL, "ctx_results"),
    ];
}

/// [`IoctlKey::cmd`] of every request number the running driver's layout table does not
/// know (not in `CMDS`): unknown commands share one key per node and result, so a process
/// issuing thousands of distinct numbers cannot fill the aggregates (`_IOC_NR` 0xff with an
/// impossible size: no real request has it).
pub const UNKNOWN_CMD: u32 = 0xffff_ffff;

/// NVIDIA's ioctl type byte, `'F'` (`NV_IOCTL_MAGIC`, `kernel-open/common/inc/nv-ioctl-numbers.h`).
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

/// The most `/proc/sys/kernel/pid_max` can be on a 64-bit kernel (`PID_MAX_LIMIT`,
/// `include/linux/threads.h`: 4 × 1024 × 1024): the largest size of the `PROC_GATE` map.
pub const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;

/// Runtime settings written by user space into the one-entry `CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Config {
    /// Ioctls at least this long (ns) are sent to user space individually.
    pub slow_ioctl_ns: u64,
    /// Agent's own tgid: its activity is ignored in the kernel.
    pub agent_tgid: u32,
    /// `task_struct.pid` (from BTF), which `sched_process_fork` reads of the child; 0 when
    /// unknown (children are then not followed).
    pub task_pid_off: u32,
    /// 1 once user space has filled the config (programs do nothing before).
    pub ready: u32,
    /// Failure records (failed calls and opens outside `cuInit`) one process may send per
    /// second; the rest are counted ([`counter::THROTTLED`]), so a process failing in a loop
    /// cannot fill the ring buffer for everyone else.
    pub failure_events_per_second: u32,
    /// `nvidia-uvm`'s character major from `/proc/devices`, 0 while it is not registered.
    pub uvm_major: u32,
    pub _pad: u32,
    /// Where the programs find the file behind an fd (from the running kernel's BTF).
    pub files: FileOffsets,
    /// What the fentry/fexit programs read of their functions' arguments (from BTF).
    pub fentry: FentryOffsets,
}

/// Byte offsets the fentry/fexit programs (`agent-ebpf/src/probes/{ioctl,open}.rs`) read
/// arguments through, taken by user space from the running kernel's BTF: the syscall's
/// `struct pt_regs` (`arch/x86/include/asm/ptrace.h`: the first three syscall arguments are
/// in `di`, `si`, `dx`), `struct filename` (`include/linux/fs.h`) and `struct open_flags`
/// (`fs/internal.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FentryOffsets {
    /// `pt_regs.di`: the first syscall argument (the ioctl's fd).
    pub regs_arg0: u32,
    /// `pt_regs.si`: the second (the request number).
    pub regs_arg1: u32,
    /// `pt_regs.dx`: the third (the params' user-space address).
    pub regs_arg2: u32,
    /// `filename.name` (`const char *`: the kernel's copy of the caller's path).
    pub filename_name: u32,
    /// `open_flags.open_flag` (`int`: the `O_*` flags).
    pub open_flags_flag: u32,
    /// `file.f_flags` (`unsigned int`: the `O_*` flags of an open file).
    pub file_flags: u32,
    /// 1 when the offsets were found; 0 keeps the fentry backend off.
    pub ready: u32,
    pub _pad: u32,
}

/// Byte offsets of the kernel struct members the programs read to find and identify the
/// file behind an fd (`task_struct.files -> files_struct.fdt -> fdtable.fd[fd] -> file`),
/// taken by user space from `/sys/kernel/btf/vmlinux` (`agent/src/kernel/btf.rs`): the
/// layouts are those of `include/linux/{sched,fdtable,fs,dcache,mount}.h` and `fs/mount.h`
/// of the running kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FileOffsets {
    /// `task_struct.files` (`struct files_struct *`).
    pub task_files: u32,
    /// `files_struct.fdt` (`struct fdtable *`).
    pub files_fdt: u32,
    /// `fdtable.max_fds` (`unsigned int`).
    pub fdt_max_fds: u32,
    /// `fdtable.fd` (`struct file **`).
    pub fdt_fd: u32,
    /// `file.f_inode` (`struct inode *`).
    pub file_inode: u32,
    /// `file.f_path.dentry` (`struct dentry *`).
    pub file_dentry: u32,
    /// `file.f_path.mnt` (`struct vfsmount *`).
    pub file_mnt: u32,
    /// `inode.i_mode` (`umode_t`, u16).
    pub inode_mode: u32,
    /// `inode.i_rdev` (`dev_t`, u32).
    pub inode_rdev: u32,
    /// `inode.i_ino` (`unsigned long`).
    pub inode_ino: u32,
    /// `inode.i_sb` (`struct super_block *`).
    pub inode_sb: u32,
    /// `super_block.s_dev` (`dev_t`, u32).
    pub sb_dev: u32,
    /// `dentry.d_name.name` (`const unsigned char *`).
    pub dentry_name: u32,
    /// `dentry.d_parent` (`struct dentry *`).
    pub dentry_parent: u32,
    /// `vfsmount.mnt_root` (`struct dentry *`).
    pub vfsmount_root: u32,
    /// `mount.mnt` (the embedded `struct vfsmount` that `file.f_path.mnt` points to).
    pub mount_mnt: u32,
    /// `mount.mnt_mountpoint` (`struct dentry *`).
    pub mount_mountpoint: u32,
    /// `mount.mnt_parent` (`struct mount *`).
    pub mount_parent: u32,
    /// 1 when the offsets were found; 0 leaves files unidentified.
    pub ready: u32,
    pub _pad: u32,
}

/// Key of the `DEVFILES` map: a file that is not a character device but sits at a
/// `/dev/nvidia*` name (a test double, e.g. a FUSE file bind-mounted there), by the
/// kernel-internal device of its superblock and its inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DevFileKey {
    /// `super_block.s_dev` (kernel-internal `dev_t`, [`kdev_from`]).
    pub dev: u32,
    pub _pad: u32,
    /// `inode.i_ino`.
    pub ino: u64,
}

/// Value of the `DEVFILES` map: which node the file stands for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DevFile {
    /// Node kind ([`node`]).
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    pub _pad: [u8; 6],
}

/// Value of the `FAILURE_RATE` map (by tgid): failure records sent in the current second.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RateWindow {
    /// Start of the one-second window (ns, `CLOCK_MONOTONIC`).
    pub start_ns: u64,
    /// Records sent in it.
    pub sent: u32,
    pub _pad: u32,
}

// ---------------------------------------------------------------------------------------------
// Ring-buffer events
// ---------------------------------------------------------------------------------------------

/// [`IoctlEvent`]: an ioctl on an NVIDIA fd ended and is interesting (failed, slow, in cuInit).
pub const EVENT_IOCTL: u32 = 1;
/// [`OpenEvent`]: an open of an NVIDIA node (failures always; successes inside `cuInit` or
/// of a process not yet known), or of a file named `libcuda.so*`.
pub const EVENT_OPEN: u32 = 2;
/// [`CuinitEvent`]: `cuInit` entered.
pub const EVENT_CUINIT_ENTER: u32 = 3;
/// [`CuinitEvent`]: `cuInit` returned.
pub const EVENT_CUINIT_EXIT: u32 = 4;
/// [`TaskEvent`]: a thread exited with a `cuInit` or ioctl in flight.
pub const EVENT_DIED_IN_CALL: u32 = 5;
/// [`TaskEvent`]: a tracked process forked (`aux` = child pid).
pub const EVENT_FORK: u32 = 6;
/// [`TaskEvent`]: a tracked process called `exec`.
pub const EVENT_EXEC: u32 = 7;
/// [`TaskEvent`]: a tracked process exited (its last thread).
pub const EVENT_PROC_EXIT: u32 = 8;

/// Header of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EventHeader {
    /// One of the `EVENT_*` numbers.
    pub kind: u32,
    /// Process id (tgid) in the init pid namespace.
    pub tgid: u32,
    /// Thread id in the init pid namespace.
    pub tid: u32,
    pub _pad: u32,
    /// When the record was made (ns, `CLOCK_MONOTONIC`).
    pub ts_ns: u64,
    /// `comm` of the thread, NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// [`IoctlEvent::flags`] bit: the call began inside `cuInit`.
pub const IOCTL_IN_CUINIT: u32 = 1;
/// [`IoctlEvent::flags`] bit: the call took at least `Config::slow_ioctl_ns`.
pub const IOCTL_SLOW: u32 = 2;
/// [`IoctlEvent::flags`] bit: the call failed (errno or non-zero `rmStatus`).
pub const IOCTL_FAILED: u32 = 4;

/// An ioctl that ended (kind [`EVENT_IOCTL`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IoctlEvent {
    pub header: EventHeader,
    /// Entry time (ns).
    pub start_ns: u64,
    /// Syscall return value.
    pub ret: i64,
    /// Request number.
    pub cmd: u32,
    pub fd: u32,
    /// `rmStatus` (meaningful when `result_kind` is [`result::NV_STATUS`]).
    pub status: u32,
    /// `IOCTL_*` bits.
    pub flags: u32,
    /// Node kind ([`node`]).
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    /// One of [`result`].
    pub result_kind: u8,
    pub _pad: [u8; 5],
}

/// [`OpenEvent::flags`] bit: the path was longer than [`PATH_LEN`] and was cut.
pub const OPEN_PATH_TRUNCATED: u32 = 1;
/// [`OpenEvent::flags`] bit: the open began inside `cuInit`.
pub const OPEN_IN_CUINIT: u32 = 2;
/// [`OpenEvent::flags`] bit: the file's name starts with `libcuda.so`.
pub const OPEN_LIBCUDA: u32 = 4;
/// [`OpenEvent::flags`] bit: a successful open whose fd is not known (the fentry backend
/// sees the open inside `do_filp_open`, before the fd is installed; `ret` is then 0).
pub const OPEN_FD_UNKNOWN: u32 = 8;
/// [`OpenEvent::flags`] bit: no start of the open was seen (the fentry backend times only
/// NVIDIA character devices' opens; `start_ns` is then the exit time).
pub const OPEN_NO_START: u32 = 16;
/// [`OpenEvent::flags`] bit (with [`OPEN_LIBCUDA`]): the library's `cuInit` probes were not
/// attached when it was opened (`LIBCUDA_PROBED` had no entry for its file), so a `cuInit`
/// the process starts before they are is found from its driver calls.
pub const OPEN_LIBCUDA_UNPROBED: u32 = 32;

/// An `openat` of an NVIDIA node or of `libcuda.so*` ended (kind [`EVENT_OPEN`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenEvent {
    pub header: EventHeader,
    /// Entry time (ns).
    pub start_ns: u64,
    /// Syscall return: the new fd, or `-errno`.
    pub ret: i64,
    /// `openat` flags argument.
    pub open_flags: u32,
    /// `OPEN_*` bits.
    pub flags: u32,
    /// Node kind ([`node`]); [`node::NONE`] for a library open.
    pub node: u8,
    /// GPU minor for [`node::GPU`].
    pub minor: u8,
    pub _pad: [u8; 6],
    /// The path as passed by the caller (in its mount namespace), NUL terminated, read at
    /// the open's exit: for a failed open and for a libcuda load. Empty for a successful open
    /// of an NVIDIA node, which is identified by its file, not its path.
    pub path: [u8; PATH_LEN],
}

impl Default for OpenEvent {
    fn default() -> Self {
        OpenEvent {
            header: EventHeader::default(),
            start_ns: 0,
            ret: 0,
            open_flags: 0,
            flags: 0,
            node: 0,
            minor: 0,
            _pad: [0; 6],
            path: [0; PATH_LEN],
        }
    }
}

/// `cuInit` entered or returned (kinds [`EVENT_CUINIT_ENTER`], [`EVENT_CUINIT_EXIT`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CuinitEvent {
    pub header: EventHeader,
    /// Entry time (ns).
    pub start_ns: u64,
    /// `CUresult` returned (exit only; 0 = `CUDA_SUCCESS`).
    pub ret: i64,
    /// The `Flags` argument.
    pub flags: u32,
    /// 1 when the entry was seen (exit only; 0 means the uprobe attached mid-call).
    pub entry_seen: u32,
    /// The parent this process was forked from when it has not exec'ed since (its fds and
    /// memory are the parent's); 0 otherwise. Used to recognise fork-after-init.
    pub forked_from: u32,
    /// A call no probe saw enter ([`InflightCuinit::late`]): on the entry record
    /// [`CUINIT_LATE`] (found at its first driver call, `start_ns`); on the exit record how
    /// it ended, one of the `LATE_END_*` values (`ret` is meaningful only for
    /// [`LATE_END_RETURN`]). 0 for a call whose entry was seen.
    pub late: u32,
}

/// [`CuinitEvent::late`] of an entry record: a `cuInit` found at its first driver call
/// (a device open or ioctl), its library loaded before the probes were attached.
pub const CUINIT_LATE: u32 = 1;
/// [`CuinitEvent::late`] of an exit record: the uretprobe saw the late call return (`ret` is
/// its `CUresult`).
pub const LATE_END_RETURN: u32 = 1;
/// [`CuinitEvent::late`] of an exit record: the thread entered `cuInit` again (probed now),
/// so the late call had returned.
pub const LATE_END_NEXT_CUINIT: u32 = 2;
/// [`CuinitEvent::late`] of an exit record: the thread entered a probed context or device
/// call (`cuDeviceGetCount`, `cuCtxCreate*`, `cuDevicePrimaryCtxRetain`): the late call had
/// returned.
pub const LATE_END_NEXT_CALL: u32 = 3;
/// [`CuinitEvent::late`] of an exit record: the process exec'ed.
pub const LATE_END_EXEC: u32 = 4;

/// Task lifecycle record (kinds [`EVENT_DIED_IN_CALL`], [`EVENT_FORK`], [`EVENT_EXEC`],
/// [`EVENT_PROC_EXIT`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TaskEvent {
    pub header: EventHeader,
    /// [`EVENT_DIED_IN_CALL`]: start (ns) of the call in flight.
    pub start_ns: u64,
    /// [`EVENT_FORK`]: child pid; [`EVENT_DIED_IN_CALL`]: ioctl cmd (if `what` has bit 2).
    pub aux: u32,
    /// [`EVENT_DIED_IN_CALL`]: bit 1 = a `cuInit` was in flight, bit 2 = an ioctl was.
    pub what: u32,
    /// [`EVENT_DIED_IN_CALL`]: start (ns) of the ioctl in flight.
    pub ioctl_start_ns: u64,
    /// [`EVENT_DIED_IN_CALL`]: node kind of the ioctl in flight.
    pub node: u8,
    pub minor: u8,
    pub _pad: [u8; 6],
}

/// [`TaskEvent::what`] bit: a `cuInit` was in flight.
pub const DIED_IN_CUINIT: u32 = 1;
/// [`TaskEvent::what`] bit: an ioctl was in flight.
pub const DIED_IN_IOCTL: u32 = 2;
/// [`TaskEvent::what`] bit (with [`DIED_IN_CUINIT`]): the `cuInit` in flight was a late
/// one ([`InflightCuinit::late`]): its thread may well have returned from it long before.
pub const DIED_IN_LATE_CUINIT: u32 = 4;

/// [`KernelFnEvent`]: a probed kernel or driver function (kprobe or fexit) failed (or, for the
/// HMM set-up allocators, failed inside a UVM ioctl).
pub const EVENT_KERNEL_FN: u32 = 9;

pub mod kernel_fn;

/// Key of `KF_START`: one function in progress on one thread (calls nest: the register path
/// is `uvm_api_register_gpu` > `uvm_va_space_register_gpu` > `uvm_gpu_retain_by_uuid`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KernelFnKey {
    pub tid: u32,
    /// One of [`kernel_fn`].
    pub func: u32,
}

/// Key of the per-CPU `KF_RESULTS` counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KernelFnResultKey {
    /// One of [`kernel_fn`].
    pub func: u32,
    /// One of [`result`]: `OK` (void or success without a code), `NV_STATUS`, `ERRNO`.
    pub kind: u8,
    pub _pad: [u8; 3],
    /// `NV_STATUS` or errno (positive).
    pub code: u32,
}

/// A probed kernel/driver function failed (kind [`EVENT_KERNEL_FN`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelFnEvent {
    pub header: EventHeader,
    /// Entry time (ns).
    pub start_ns: u64,
    /// Raw return value (register).
    pub ret: i64,
    /// One of [`kernel_fn`].
    pub func: u32,
    /// `NV_STATUS` or errno (positive).
    pub code: u32,
    /// One of [`result`].
    pub kind: u8,
    /// 1 when the thread was inside an ioctl on a UVM node.
    pub in_uvm_ioctl: u8,
    pub _pad: [u8; 6],
}

/// [`ContextCallEvent`]: a CUDA context or device call probed in libcuda returned (`cuCtxCreate*`,
/// `cuDevicePrimaryCtxRetain`, `cuDeviceGetCount`; which ones are sent: [`context_call`]).
pub const EVENT_CONTEXT_CALL: u32 = 10;

/// The CUDA driver calls probed besides `cuInit`, by id: [`ContextCallEvent::call`], the index of
/// `CTX_HIST` and the `call` of [`ContextCallResultKey`]. Each id has its own uprobe and uretprobe
/// programs (a uprobe cannot tell which symbol it was attached to).
pub mod context_call {
    /// `cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)`: the ABI of CUDA
    /// before 3.2, still exported for old binaries.
    pub const CTX_CREATE: u32 = 0;
    /// `cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)`: what `cuda.h`
    /// of CUDA 3.2 to 12 maps `cuCtxCreate` to.
    pub const CTX_CREATE_V2: u32 = 1;
    /// `cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
    /// unsigned int flags, CUdevice dev)` (CUDA 11.4+).
    pub const CTX_CREATE_V3: u32 = 2;
    /// `cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int
    /// flags, CUdevice dev)` (CUDA 12.5+; what `cuda.h` of CUDA 13 maps `cuCtxCreate` to).
    pub const CTX_CREATE_V4: u32 = 3;
    /// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`: the CUDA runtime's
    /// context (`cudaSetDevice`, the first runtime call on a device).
    pub const PRIMARY_CTX_RETAIN: u32 = 4;
    /// `cuDeviceGetCount(int *count)`.
    pub const DEVICE_GET_COUNT: u32 = 5;
    /// Number of ids.
    pub const COUNT: u32 = 6;

    /// The exported symbol of each id, in id order.
    pub const SYMBOLS: [&str; COUNT as usize] = [
        "cuCtxCreate",
        "cuCtxCreate_v2",
        "cuCtxCreate_v3",
        "cuCtxCreate_v4",
        "cuDevicePrimaryCtxRetain",
        "cuDeviceGetCount",
    ];

    /// The argument index of the `CUdevice` of each id (`None`: the call takes none).
    pub const DEVICE_ARG: [Option<usize>; COUNT as usize] =
        [Some(2), Some(2), Some(4), Some(3), Some(1), None];

    /// The in-flight slot of each id (`INFLIGHT_CTX` key): the four `cuCtxCreate` versions
    /// share one, so a version that calls another (or two names of one function) counts
    /// once, as the outermost call.
    #[inline(always)]
    pub const fn slot(call: u32) -> u32 {
        match call {
            CTX_CREATE | CTX_CREATE_V2 | CTX_CREATE_V3 | CTX_CREATE_V4 => 0,
            PRIMARY_CTX_RETAIN => 1,
            _ => 2,
        }
    }

    /// Whether the id is one of the context creations (every call is sent to user space),
    /// not `cuDeviceGetCount` (sent when it fails or returns a count new for its process).
    #[inline(always)]
    pub const fn creates_context(call: u32) -> bool {
        call != DEVICE_GET_COUNT
    }

    /// The symbol of an id, `unknown` when out of range.
    pub fn name(call: u32) -> &'static str {
        match SYMBOLS.get(call as usize) {
            Some(s) => s,
            None => "unknown",
        }
    }
}

/// Key of `INFLIGHT_CTX`: a context or device call in progress on one thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ContextCallKey {
    pub tid: u32,
    /// [`context_call::slot`] of the call.
    pub slot: u32,
}

/// Value of `INFLIGHT_CTX`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InflightContextCall {
    /// Entry time (ns, `CLOCK_MONOTONIC`).
    pub start_ns: u64,
    /// For `cuDeviceGetCount`: the `int *count` argument, read at return.
    pub out_ptr: u64,
    /// One of [`context_call`].
    pub call: u32,
    /// The `CUdevice` argument (-1 when the call takes none).
    pub device: i32,
}

/// Key of the per-CPU `CTX_RESULTS` counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ContextCallResultKey {
    /// One of [`context_call`].
    pub call: u32,
    /// The `CUresult` returned.
    pub code: u32,
}

/// [`ContextCallEvent::flags`] bit: the entry was seen (else the uprobe attached mid-call and
/// `start_ns` is the return time).
pub const CTX_ENTRY_SEEN: u32 = 1;
/// [`ContextCallEvent::flags`] bit: `count` was read from the caller's `int *count`.
pub const CTX_COUNT_READ: u32 = 2;

/// A context or device call returned (kind [`EVENT_CONTEXT_CALL`]). Every context creation is sent;
/// `cuDeviceGetCount` when it failed, or when its count differs from the last one sent for
/// the process. Every call is counted in `CTX_HIST` and `CTX_RESULTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ContextCallEvent {
    pub header: EventHeader,
    /// Entry time (ns).
    pub start_ns: u64,
    /// `CUresult` returned.
    pub ret: i64,
    /// One of [`context_call`].
    pub call: u32,
    /// The `CUdevice` argument, -1 when the call takes none.
    pub device: i32,
    /// `cuDeviceGetCount`: the count it wrote (when [`CTX_COUNT_READ`]).
    pub count: i32,
    /// `CTX_*` bits.
    pub flags: u32,
}

/// Largest record size, for ring-buffer sizing.
pub const MAX_EVENT_SIZE: usize = core::mem::size_of::<OpenEvent>();

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for ProcState {}
    unsafe impl aya::Pod for CmdKey {}
    unsafe impl aya::Pod for CmdInfo {}
    unsafe impl aya::Pod for InflightIoctl {}
    unsafe impl aya::Pod for InflightCuinit {}
    unsafe impl aya::Pod for IoctlKey {}
    unsafe impl aya::Pod for LatencyHist {}
    unsafe impl aya::Pod for OpenKey {}
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for DevFileKey {}
    unsafe impl aya::Pod for DevFile {}
    unsafe impl aya::Pod for KernelFnKey {}
    unsafe impl aya::Pod for KernelFnResultKey {}
    unsafe impl aya::Pod for ContextCallKey {}
    unsafe impl aya::Pod for InflightContextCall {}
    unsafe impl aya::Pod for ContextCallResultKey {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::size_of;

    fn path(s: &str) -> [u8; 32] {
        let mut p = [0u8; 32];
        p[..s.len()].copy_from_slice(s.as_bytes());
        p
    }

    #[test]
    fn classifies_device_paths() {
        assert_eq!(classify_dev_path(&path("/dev/nvidiactl")), (node::CTL, 0));
        assert_eq!(classify_dev_path(&path("/dev/nvidia0")), (node::GPU, 0));
        assert_eq!(classify_dev_path(&path("/dev/nvidia7")), (node::GPU, 7));
        assert_eq!(classify_dev_path(&path("/dev/nvidia254")), (node::GPU, 254));
        assert_eq!(classify_dev_path(&path("/dev/nvidia-uvm")), (node::UVM, 0));
        assert_eq!(
            classify_dev_path(&path("/dev/nvidia-uvm-tools")),
            (node::UVM_TOOLS, 0)
        );
        for bad in [
            "/dev/nvidia255",
            "/dev/nvidia01",
            "/dev/nvidia1000",
            "/dev/nvidia",
            "/dev/nvidiactlx",
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvmx",
            "/dev/nvidia-uvm-toolsx",
            "/dev/nvidia-nvswitch0",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/nvidia0x",
            "dev/nvidia0",
            "/dev/null",
        ] {
            assert_eq!(classify_dev_path(&path(bad)), (node::NONE, 0), "{bad}");
        }
    }

    #[test]
    fn recognises_libcuda_names() {
        let name = |s: &str| {
            let mut p = [0u8; NODE_NAME_LEN];
            p[..s.len()].copy_from_slice(s.as_bytes());
            p
        };
        for good in ["libcuda.so", "libcuda.so.1", "libcuda.so.580.95.05"] {
            assert!(is_libcuda_name(&name(good)), "{good}");
        }
        for bad in [
            "libcuda",
            "libcudart.so.12",
            "libcuda.s",
            "xlibcuda.so.1",
            "",
        ] {
            assert!(!is_libcuda_name(&name(bad)), "{bad}");
        }
    }

    #[test]
    fn classifies_node_names() {
        let name = |s: &str| {
            let mut p = [0u8; NODE_NAME_LEN];
            p[..s.len()].copy_from_slice(s.as_bytes());
            p
        };
        assert_eq!(classify_node_name(&name("nvidiactl")), (node::CTL, 0));
        assert_eq!(classify_node_name(&name("nvidia3")), (node::GPU, 3));
        assert_eq!(classify_node_name(&name("nvidia-uvm")), (node::UVM, 0));
        assert_eq!(
            classify_node_name(&name("nvidia-uvm-tools")),
            (node::UVM_TOOLS, 0)
        );
        for bad in [
            "nvidia-modeset",
            "nvidia01",
            "nvidia",
            "null",
            "libcuda.so.1",
            "",
        ] {
            assert_eq!(classify_node_name(&name(bad)), (node::NONE, 0), "{bad}");
        }
    }

    #[test]
    fn classifies_device_numbers() {
        let uvm = 508;
        assert_eq!(kdev_from(195, 255), 0x0c3000ff);
        assert_eq!(classify_rdev(kdev_from(195, 255), uvm), (node::CTL, 0));
        assert_eq!(classify_rdev(kdev_from(195, 0), uvm), (node::GPU, 0));
        assert_eq!(classify_rdev(kdev_from(195, 7), uvm), (node::GPU, 7));
        assert_eq!(classify_rdev(kdev_from(uvm, 0), uvm), (node::UVM, 0));
        assert_eq!(classify_rdev(kdev_from(uvm, 1), uvm), (node::UVM_TOOLS, 0));
        // nvidia-modeset (195:254), a third minor of the UVM major, the UVM major unknown,
        // /dev/null (1:3), an anonymous superblock device (0:42).
        for (rdev, m) in [
            (kdev_from(195, 254), uvm),
            (kdev_from(uvm, 2), uvm),
            (kdev_from(uvm, 0), 0),
            (kdev_from(1, 3), uvm),
            (kdev_from(0, 42), uvm),
            (kdev_from(0, 0), 0),
        ] {
            assert_eq!(classify_rdev(rdev, m), (node::NONE, 0), "{rdev:#x} {m}");
        }
    }

    #[test]
    fn buckets_are_log2() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(2), 1);
        assert_eq!(hist_bucket(1023), 9);
        assert_eq!(hist_bucket(1024), 10);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn sizes_are_stable() {
        assert_eq!(size_of::<EventHeader>(), 40);
        assert_eq!(size_of::<IoctlEvent>(), 80);
        assert_eq!(size_of::<OpenEvent>(), 200);
        assert_eq!(size_of::<CuinitEvent>(), 72);
        assert_eq!(size_of::<TaskEvent>(), 72);
        assert_eq!(size_of::<ProcState>(), 32);
        assert_eq!(size_of::<InflightIoctl>(), 32);
        assert_eq!(size_of::<InflightCuinit>(), 24);
        assert_eq!(size_of::<IoctlKey>(), 12);
        assert_eq!(size_of::<LatencyHist>(), 8 * (HIST_BUCKETS + 2));
        assert_eq!(size_of::<OpenKey>(), 8);
        assert_eq!(size_of::<Config>(), 144);
        assert_eq!(size_of::<FileOffsets>(), 80);
        assert_eq!(size_of::<FentryOffsets>(), 32);
        assert_eq!(size_of::<DevFileKey>(), 16);
        assert_eq!(size_of::<DevFile>(), 8);
        assert_eq!(MAX_EVENT_SIZE, 200);
        assert_eq!(size_of::<KernelFnEvent>(), 72);
        assert_eq!(size_of::<KernelFnKey>(), 8);
        assert_eq!(size_of::<KernelFnResultKey>(), 12);
        assert_eq!(size_of::<ContextCallEvent>(), 72);
        assert_eq!(size_of::<ContextCallKey>(), 8);
        assert_eq!(size_of::<InflightContextCall>(), 24);
        assert_eq!(size_of::<ContextCallResultKey>(), 8);
        assert_eq!(
            context_call::name(context_call::DEVICE_GET_COUNT),
            "cuDeviceGetCount"
        );
        assert_eq!(context_call::name(99), "unknown");
    }
}

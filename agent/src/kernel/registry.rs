//! The probe registry: every kernel program the agent attaches, what it needs, and whether it
//! is attached here (and if not, why).
//!
//! Over 800 lines: the registry is one table ([`REGISTRY`]) read by the loader, `uvmwatch
//! probes`, the metrics and the docs' probe table, so every probe's row, the states it can
//! be in and their rendering are kept together; a third of the file is tests.

use std::fmt;

/// How a probe attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A static tracepoint `category:name` (needs tracefs for its id).
    Tracepoint {
        category: &'static str,
        name: &'static str,
    },
    /// A raw tracepoint `name` (BPF_RAW_TRACEPOINT_OPEN, Linux 4.17+; no tracefs): the
    /// program gets the tracepoint's `TP_PROTO` arguments, and detaching it waits for no
    /// grace period. `category` names the tracefs event it is, for the label.
    RawTracepoint {
        category: &'static str,
        name: &'static str,
    },
    /// A uprobe (or uretprobe when `ret`) on `symbol` in every libcuda found (needs the
    /// `uprobe` perf PMU, `CONFIG_UPROBE_EVENTS`).
    Uprobe { symbol: &'static str, ret: bool },
    /// A kprobe (or kretprobe when `ret`) on a kernel function, or on a function of
    /// `module` (needs the `kprobe` perf PMU, `CONFIG_KPROBES`, and the symbol in
    /// `/proc/kallsyms`; module functions only while the module is loaded). Module
    /// functions use kprobes, not fentry: out-of-tree modules usually ship without BTF.
    Kprobe {
        symbol: &'static str,
        ret: bool,
        module: Option<&'static str>,
    },
    /// A BPF trampoline (fentry, or fexit when `ret`) on a core-kernel function named in the
    /// running kernel's BTF (needs `CONFIG_DEBUG_INFO_BTF` and trampolines: x86-64 5.5+,
    /// arm64 6.0+; lockdown or a security module may refuse them).
    Fentry { function: &'static str, ret: bool },
}

impl Attach {
    /// `tracepoint`, `raw_tracepoint`, `uprobe`, `uretprobe`, `kprobe`, `kretprobe`,
    /// `fentry` or `fexit`.
    pub fn kind(&self) -> &'static str {
        match self {
            Attach::Tracepoint { .. } => "tracepoint",
            Attach::RawTracepoint { .. } => "raw_tracepoint",
            Attach::Fentry { ret: false, .. } => "fentry",
            Attach::Fentry { ret: true, .. } => "fexit",
            Attach::Uprobe { ret: false, .. } => "uprobe",
            Attach::Uprobe { ret: true, .. } => "uretprobe",
            Attach::Kprobe { ret: false, .. } => "kprobe",
            Attach::Kprobe { ret: true, .. } => "kretprobe",
        }
    }
}

/// The kernel module whose functions the module kprobes target.
pub const UVM_MODULE: &str = "nvidia_uvm";

/// One probed kernel or driver function: a row of [`uvmwatch_common::kernel_fns!`].
#[derive(Clone, Copy, Debug)]
pub struct KernelFn {
    /// Its `uvmwatch_common::kernel_fn` id (also its index in [`KERNEL_FNS`]).
    pub id: u32,
    /// Name in `/proc/kallsyms`.
    pub symbol: &'static str,
    /// The module it belongs to ([`UVM_MODULE`]), `None` for the core kernel.
    pub module: Option<&'static str>,
    /// The kernel source file, or the module and the driver versions that have it.
    pub lives_in: &'static str,
    /// Counted only inside an ioctl on a UVM node (`kernel_fn::scope::UVM_IOCTL`).
    pub uvm_ioctl_only: bool,
    /// The kprobe and the kretprobe.
    pub probes: [ProbeSpec; 2],
    /// For a core-kernel function, the fentry and fexit used instead on the fentry backend
    /// (module functions stay on kprobes: out-of-tree modules usually ship without BTF).
    pub trampolines: Option<[ProbeSpec; 2]>,
}

const fn kp(
    label: &'static str,
    program: &'static str,
    symbol: &'static str,
    side: Side,
    module: Option<&'static str>,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Kprobe {
            symbol,
            ret: side.is_exit(),
            module,
        },
        required: false,
        purpose,
        // A core-kernel function's kprobes give way to its trampolines on the fentry backend.
        backend: if module.is_none() {
            Some(Backend::Tracepoint)
        } else {
            None
        },
    }
}

/// Whether a [`KERNEL_FNS`] row's `module` is the core kernel's.
const fn is_core(module: Option<&'static str>) -> bool {
    module.is_none()
}

/// [`KERNEL_FNS`], from the rows of [`uvmwatch_common::kernel_fns!`].
macro_rules! kernel_fn_table {
    ($(($id:ident = $n:literal, $sym:literal, $module:expr, $ret:ident, $scope:ident,
        $enter:ident, $exit:ident, $fentry:ident, $fexit:ident, $lives:literal, $purpose:literal)),* $(,)?) => {
        /// The probed-function part of the registry (kprobe pairs; fentry/fexit pairs for
        /// core-kernel functions): every probed function, in id order.
        pub const KERNEL_FNS: &[KernelFn] = &[$(
            KernelFn {
                id: uvmwatch_common::kernel_fn::$id,
                symbol: $sym,
                module: $module,
                lives_in: $lives,
                uvm_ioctl_only: uvmwatch_common::kernel_fn::scope::$scope
                    == uvmwatch_common::kernel_fn::scope::UVM_IOCTL,
                probes: [
                    kp(concat!("kprobe:", $sym), stringify!($enter), $sym, Side::Entry, $module, $purpose),
                    kp(concat!("kretprobe:", $sym), stringify!($exit), $sym, Side::Exit, $module, $purpose),
                ],
                trampolines: if is_core($module) {
                    Some([
                        fe(concat!("fentry:", $sym), stringify!($fentry), $sym, Side::Entry, Need::Optional, $purpose),
                        fe(concat!("fexit:", $sym), stringify!($fexit), $sym, Side::Exit, Need::Optional, $purpose),
                    ])
                } else {
                    None
                },
            },
        )*];
    };
}

uvmwatch_common::kernel_fns!(kernel_fn_table);

/// Whether `spec` is the fentry or fexit of a function of [`KERNEL_FNS`] (not one of the
/// syscall trampolines).
pub fn is_kernel_fn_trampoline(spec: &ProbeSpec) -> bool {
    matches!(spec.attach, Attach::Fentry { function, .. }
        if KERNEL_FNS.iter().any(|k| k.symbol == function))
}

/// Name of a probed function by id (`unknown` when out of range).
pub fn kernel_fn_name(id: u32) -> &'static str {
    KERNEL_FNS
        .get(id as usize)
        .map(|k| k.symbol)
        .unwrap_or("unknown")
}

/// Every probe: [`REGISTRY`], the kprobe pairs of [`KERNEL_FNS`], then the fentry/fexit pairs
/// of its core-kernel functions.
pub fn all() -> Vec<ProbeSpec> {
    REGISTRY
        .iter()
        .copied()
        .chain(KERNEL_FNS.iter().flat_map(|k| k.probes))
        .chain(KERNEL_FNS.iter().filter_map(|k| k.trampolines).flatten())
        .collect()
}

/// The program of the overhead benchmark's floor reference on a tracepoint
/// (`agent-ebpf/src/probes/floor.rs`: one per-CPU counter increment). No entry of [`all`]
/// names it, so `uvmwatch run` never loads it.
pub const FLOOR_PROGRAM: &str = "floor_tp";

/// The program of `sched:sched_process_exit` where the tracepoint passes `group_dead`
/// (6.18; `sched_exit`, the registry's, elsewhere: `agent-ebpf/src/probes/sched.rs` says why
/// two). Chosen by `Kernel::fit_sched_probes` from the kernel's BTF.
pub const EXIT_GROUP_DEAD_PROGRAM: &str = "sched_exit_group_dead";

/// [`FLOOR_PROGRAM`]'s counterpart on a raw tracepoint.
pub const FLOOR_RAW_PROGRAM: &str = "floor_raw_tp";

/// The floor program standing in for an fentry/fexit program of the agent's (one per
/// function and direction: a trampoline program is loaded for one function).
fn floor_trampoline(program: &str) -> Option<&'static str> {
    Some(match program {
        "ioctl_fentry" => "floor_fe_ioctl",
        "ioctl_fexit" => "floor_fx_ioctl",
        "chrdev_fentry" => "floor_fe_chrdev",
        "chrdev_fexit" => "floor_fx_chrdev",
        "open_fexit" => "floor_fx_open",
        _ => return None,
    })
}

/// The floor reference's probes (`uvmwatch bench-floor`): every tracepoint, raw tracepoint
/// and fentry/fexit probe of [`REGISTRY`], with its label, attach point and backend, running a floor program
/// (one map operation) instead of the agent's. The loader picks the backend for the floor as
/// it does for the agent.
pub fn floor() -> Vec<ProbeSpec> {
    REGISTRY
        .iter()
        .filter_map(|p| {
            let program = match p.attach {
                Attach::Tracepoint { .. } => FLOOR_PROGRAM,
                Attach::RawTracepoint { .. } => FLOOR_RAW_PROGRAM,
                Attach::Fentry { .. } => floor_trampoline(p.program)?,
                _ => return None,
            };
            Some(ProbeSpec {
                program,
                purpose: "floor reference of the overhead benchmark: one map operation",
                ..*p
            })
        })
        .collect()
}

/// How the syscalls the agent needs (opens and ioctls) are hooked. Every other probe (the
/// `sched` raw tracepoints, uprobes, kprobes) is the same on both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// fentry/fexit on the kernel functions (`__x64_sys_ioctl`, `do_filp_open`,
    /// `chrdev_open`): only those functions' callers pay.
    Fentry,
    /// The `syscalls:sys_{enter,exit}_*` tracepoints: enabling any of them puts every
    /// syscall of every thread on the kernel's slow path.
    Tracepoint,
}

impl Backend {
    /// `fentry` or `tracepoint`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Fentry => "fentry",
            Backend::Tracepoint => "tracepoint",
        }
    }
}

/// The backend the loader chose, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendChosen {
    pub backend: Backend,
    /// Why, in one bounded word (the `reason` label of `uvmwatch_probe_backend_info`):
    /// `trampolines_allowed`, `fentry_refused` or `flag`.
    pub cause: &'static str,
    /// Why, in words (the kernel's refusal, or the flag).
    pub why: String,
}

/// Which backend `uvmwatch run --probe-backend` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendChoice {
    /// fentry where the kernel allows trampolines, else the tracepoints.
    #[default]
    Auto,
    /// fentry only (nothing of the syscalls is seen where it is refused).
    Fentry,
    /// The syscall tracepoints only.
    Tracepoint,
}

/// One entry of the registry.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// Label used in `uvmwatch_probe_attached{probe}` and `uvmwatch probes`.
    pub label: &'static str,
    /// Program name in the eBPF object (a function in `agent-ebpf/src/probes/`).
    pub program: &'static str,
    /// Where it attaches.
    pub attach: Attach,
    /// Without a required probe the agent's main signal is gone (it still starts).
    pub required: bool,
    /// What the probe gives, for `uvmwatch probes`.
    pub purpose: &'static str,
    /// The backend it belongs to (`None`: attached on both).
    pub backend: Option<Backend>,
}

/// Where on a function a probe fires: its entry (kprobe, fentry, uprobe) or its exit
/// (kretprobe, fexit, uretprobe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Entry,
    Exit,
}

impl Side {
    const fn is_exit(self) -> bool {
        matches!(self, Side::Exit)
    }
}

/// Whether the agent's main signal is gone without the probe ([`ProbeSpec::required`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    Required,
    Optional,
}

impl Need {
    const fn is_required(self) -> bool {
        matches!(self, Need::Required)
    }
}

const fn tp(
    label: &'static str,
    program: &'static str,
    category: &'static str,
    name: &'static str,
    need: Need,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Tracepoint { category, name },
        required: need.is_required(),
        purpose,
        backend: if matches!(category.as_bytes(), b"syscalls") {
            Some(Backend::Tracepoint)
        } else {
            None
        },
    }
}

/// [`tp`]'s entry as a raw tracepoint, attached by name (a `sched` one: on both backends).
const fn raw(spec: ProbeSpec) -> ProbeSpec {
    let Attach::Tracepoint { category, name } = spec.attach else {
        panic!("raw() takes a tp() entry");
    };
    ProbeSpec {
        attach: Attach::RawTracepoint { category, name },
        ..spec
    }
}

/// A fentry (or fexit at [`Side::Exit`]) probe of the fentry backend.
const fn fe(
    label: &'static str,
    program: &'static str,
    function: &'static str,
    side: Side,
    need: Need,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Fentry {
            function,
            ret: side.is_exit(),
        },
        required: need.is_required(),
        purpose,
        backend: Some(Backend::Fentry),
    }
}

/// The syscall trampolines, tracepoints and uprobes, in attach order ([`all`] adds the kprobe
/// pairs of [`KERNEL_FNS`] and the trampolines of its core-kernel functions).
pub const REGISTRY: &[ProbeSpec] = &[
    fe(
        "fentry:__x64_sys_ioctl",
        "ioctl_fentry",
        IOCTL_FUNCTION,
        Side::Entry,
        Need::Required,
        "driver calls in flight (fentry backend: only ioctl(2) callers pay)",
    ),
    fe(
        "fexit:__x64_sys_ioctl",
        "ioctl_fexit",
        IOCTL_FUNCTION,
        Side::Exit,
        Need::Required,
        "driver call latency, errno and rmStatus (fentry backend)",
    ),
    fe(
        "fentry:chrdev_open",
        "chrdev_fentry",
        "chrdev_open",
        Side::Entry,
        Need::Required,
        "start of NVIDIA character device opens (fentry backend: only character device opens run it)",
    ),
    fe(
        "fexit:chrdev_open",
        "chrdev_fexit",
        "chrdev_open",
        Side::Exit,
        Need::Required,
        "NVIDIA character device opens the driver refused (EIO, ENXIO, ...), by device number (fentry backend)",
    ),
    fe(
        "fexit:do_filp_open",
        "open_fexit",
        "do_filp_open",
        Side::Exit,
        Need::Required,
        "device open results and libcuda loads: the new file identified, the kernel's copy of the path read only on failure (fentry backend)",
    ),
    tp(
        "syscalls:sys_enter_openat",
        "openat_enter",
        "syscalls",
        "sys_enter_openat",
        Need::Required,
        "device node opens and libcuda loads (the path's address, flags, start)",
    ),
    tp(
        "syscalls:sys_exit_openat",
        "open_exit",
        "syscalls",
        "sys_exit_openat",
        Need::Required,
        "device open results: the new fd's file identified, the path read only on failure",
    ),
    tp(
        "syscalls:sys_enter_open",
        "open_enter",
        "syscalls",
        "sys_enter_open",
        Need::Optional,
        "device opens by open(2) (glibc before 2.26; absent on arm64)",
    ),
    tp(
        "syscalls:sys_exit_open",
        "open_exit",
        "syscalls",
        "sys_exit_open",
        Need::Optional,
        "device opens by open(2) (glibc before 2.26; absent on arm64)",
    ),
    tp(
        "syscalls:sys_enter_openat2",
        "openat2_enter",
        "syscalls",
        "sys_enter_openat2",
        Need::Optional,
        "device opens by openat2(2) (Linux 5.6+)",
    ),
    tp(
        "syscalls:sys_exit_openat2",
        "open_exit",
        "syscalls",
        "sys_exit_openat2",
        Need::Optional,
        "device opens by openat2(2) (Linux 5.6+)",
    ),
    tp(
        "syscalls:sys_enter_ioctl",
        "ioctl_enter",
        "syscalls",
        "sys_enter_ioctl",
        Need::Required,
        "driver calls in flight",
    ),
    tp(
        "syscalls:sys_exit_ioctl",
        "ioctl_exit",
        "syscalls",
        "sys_exit_ioctl",
        Need::Required,
        "driver call latency, errno and rmStatus",
    ),
    raw(tp(
        "sched:sched_process_fork",
        "sched_fork",
        "sched",
        "sched_process_fork",
        Need::Optional,
        "children of NVIDIA processes followed across fork",
    )),
    raw(tp(
        "sched:sched_process_exec",
        "sched_exec",
        "sched",
        "sched_process_exec",
        Need::Optional,
        "new images (a forked child that exec'ed is no longer its parent's copy)",
    )),
    raw(tp(
        "sched:sched_process_exit",
        "sched_exit",
        "sched",
        "sched_process_exit",
        Need::Optional,
        "threads that die mid-call, process clean-up",
    )),
    up(
        "uprobe:cuInit",
        "cuinit_enter",
        "cuInit",
        Side::Entry,
        "cuInit entry in every libcuda found",
    ),
    up(
        "uretprobe:cuInit",
        "cuinit_exit",
        "cuInit",
        Side::Exit,
        "cuInit result and duration",
    ),
    up(
        "uprobe:cuCtxCreate",
        "cuctx_v1_enter",
        "cuCtxCreate",
        Side::Entry,
        "context creation, pre-3.2 ABI (old binaries): entry and device",
    ),
    up(
        "uretprobe:cuCtxCreate",
        "cuctx_v1_exit",
        "cuCtxCreate",
        Side::Exit,
        "context creation: CUresult (46 under an exclusive compute mode) and duration",
    ),
    up(
        "uprobe:cuCtxCreate_v2",
        "cuctx_v2_enter",
        "cuCtxCreate_v2",
        Side::Entry,
        "context creation (cuCtxCreate of CUDA 3.2 to 12 headers): entry and device",
    ),
    up(
        "uretprobe:cuCtxCreate_v2",
        "cuctx_v2_exit",
        "cuCtxCreate_v2",
        Side::Exit,
        "context creation: CUresult and duration",
    ),
    up(
        "uprobe:cuCtxCreate_v3",
        "cuctx_v3_enter",
        "cuCtxCreate_v3",
        Side::Entry,
        "context creation with execution affinity (CUDA 11.4+): entry and device",
    ),
    up(
        "uretprobe:cuCtxCreate_v3",
        "cuctx_v3_exit",
        "cuCtxCreate_v3",
        Side::Exit,
        "context creation: CUresult and duration",
    ),
    up(
        "uprobe:cuCtxCreate_v4",
        "cuctx_v4_enter",
        "cuCtxCreate_v4",
        Side::Entry,
        "context creation with parameters (CUDA 12.5+; cuCtxCreate of CUDA 13 headers): entry and device",
    ),
    up(
        "uretprobe:cuCtxCreate_v4",
        "cuctx_v4_exit",
        "cuCtxCreate_v4",
        Side::Exit,
        "context creation: CUresult and duration",
    ),
    up(
        "uprobe:cuDevicePrimaryCtxRetain",
        "cuprimctx_enter",
        "cuDevicePrimaryCtxRetain",
        Side::Entry,
        "primary context (what the CUDA runtime uses): entry and device",
    ),
    up(
        "uretprobe:cuDevicePrimaryCtxRetain",
        "cuprimctx_exit",
        "cuDevicePrimaryCtxRetain",
        Side::Exit,
        "primary context: CUresult (46 under an exclusive compute mode) and duration",
    ),
    up(
        "uprobe:cuDeviceGetCount",
        "cudevcnt_enter",
        "cuDeviceGetCount",
        Side::Entry,
        "device count: entry and the count pointer",
    ),
    up(
        "uretprobe:cuDeviceGetCount",
        "cudevcnt_exit",
        "cuDeviceGetCount",
        Side::Exit,
        "device count CUDA sees (against nvidia-smi's GPUs with MIG on), CUresult and duration",
    ),
];

const fn up(
    label: &'static str,
    program: &'static str,
    symbol: &'static str,
    side: Side,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Uprobe {
            symbol,
            ret: side.is_exit(),
        },
        required: false,
        purpose,
        backend: None,
    }
}

/// The function every `ioctl(2)` enters with its `struct pt_regs` (x86-64; `vfs_ioctl`, which
/// takes the file, is inlined into it on 6.18 and has no fd).
pub const IOCTL_FUNCTION: &str = "__x64_sys_ioctl";

/// The libcuda symbol every probed library must define (the others are optional: a
/// library lacking one says so in its probes' state).
pub const LIBCUDA_REQUIRED_SYMBOL: &str = "cuInit";

/// State of one probe on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeState {
    /// Attached (for uprobes: to this many libcuda files).
    Attached(usize),
    /// Can attach but has nothing to attach to yet (uprobes before any libcuda is found).
    Waiting(String),
    /// Not attached, with the reason.
    Unavailable(String),
    /// Not used: a probe of the backend not chosen (why: the other one is attached, or the
    /// flag). Nothing is lost by it.
    Standby(String),
}

impl ProbeState {
    /// 1 when attached (for the `uvmwatch_probe_attached` gauge), else 0.
    pub fn gauge(&self) -> i64 {
        matches!(self, ProbeState::Attached(_)) as i64
    }
}

impl fmt::Display for ProbeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeState::Attached(0) | ProbeState::Attached(1) => write!(f, "attached"),
            ProbeState::Attached(n) => write!(f, "attached ({n} targets)"),
            ProbeState::Waiting(why) => write!(f, "waiting: {why}"),
            ProbeState::Unavailable(why) => write!(f, "unavailable: {why}"),
            ProbeState::Standby(why) => write!(f, "not used: {why}"),
        }
    }
}

/// What the host says about why a module function may be absent: whether the kernel has
/// `CONFIG_DEVICE_PRIVATE` (and where that was read), and the running driver's version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AbsenceFacts {
    /// `Some(on)` when the kernel's configuration was read; its source or why not.
    pub device_private: Option<bool>,
    pub config_source: String,
    /// The running driver's version (`550.163.01`), when known.
    pub driver: Option<String>,
}

/// The first number of a driver version (`550` of `550.163.01`).
fn driver_branch(v: &str) -> Option<u32> {
    v.split('.').next()?.parse().ok()
}

/// Why the function `symbol` of `module` is not in `/proc/kallsyms`, in the driver's own
/// terms where they are known: UVM compiles its HMM code (`uvm_hmm_*`) only when the kernel
/// has `CONFIG_HMM_MIRROR` and `CONFIG_DEVICE_PRIVATE` (`UVM_IS_CONFIG_HMM()`,
/// `kernel-open/nvidia-uvm/uvm_linux.h`, 535.261.03 and 550.163.01); the fault-batch
/// functions are `uvm_gpu_service_*` up to 550 and `uvm_parent_gpu_service_*` from 560.
pub fn absence_reason(symbol: &str, module: Option<&str>, facts: &AbsenceFacts) -> String {
    let generic = format!(
        "{symbol} not in /proc/kallsyms{} (another kernel or driver version)",
        module
            .map(|m| format!(" for module {m}"))
            .unwrap_or_default()
    );
    let branch = facts.driver.as_deref().and_then(driver_branch);
    let drv = facts.driver.as_deref().unwrap_or("");
    if symbol.starts_with("uvm_hmm_") {
        return match facts.device_private {
            Some(false) => format!(
                "{symbol} not in /proc/kallsyms: compiled out, nvidia_uvm builds its HMM code only with \
                 CONFIG_HMM_MIRROR and CONFIG_DEVICE_PRIVATE (UVM_IS_CONFIG_HMM) and this kernel has \
                 CONFIG_DEVICE_PRIVATE off ({})",
                facts.config_source
            ),
            Some(true) => generic,
            None => format!(
                "{generic}; nvidia_uvm compiles it out on kernels without CONFIG_DEVICE_PRIVATE, \
                 and this kernel's configuration could not be read ({})",
                facts.config_source
            ),
        };
    }
    match (symbol.strip_prefix("uvm_parent_gpu_"), symbol.strip_prefix("uvm_gpu_service_")) {
        (Some(rest), _) if branch.is_some_and(|b| b < 560) => format!(
            "{symbol} not in /proc/kallsyms: not in driver {drv}, added in 560 (before it: uvm_gpu_{rest})"
        ),
        (_, Some(rest)) if branch.is_some_and(|b| b >= 560) => format!(
            "{symbol} not in /proc/kallsyms: driver {drv} calls it uvm_parent_gpu_service_{rest} (renamed in 560)"
        ),
        _ => generic,
    }
}

/// Renders the `uvmwatch probes` table: one row per probe that is attached or required, then
/// the others grouped by state, one line per distinct reason followed by the probes it applies
/// to, listed compactly (`kprobe+kretprobe: a, b` for both probes of functions `a` and `b`).
pub fn render_table(rows: &[(ProbeSpec, ProbeState)]) -> String {
    let (listed, rest): (Vec<_>, Vec<_>) = rows.iter().partition(|(s, st)| {
        st.gauge() == 1 || (s.required && !matches!(st, ProbeState::Standby(_)))
    });
    let mut out = String::new();
    if !listed.is_empty() {
        let w = listed
            .iter()
            .map(|(s, _)| s.label.len())
            .max()
            .unwrap_or(5)
            .max(5);
        out.push_str(&format!(
            "{:<w$}  {:<10}  {:<8}  {}\n",
            "PROBE", "KIND", "REQUIRED", "STATE"
        ));
        for (s, st) in &listed {
            out.push_str(&format!(
                "{:<w$}  {:<10}  {:<8}  {}  [{}]\n",
                s.label,
                s.attach.kind(),
                if s.required { "yes" } else { "no" },
                st,
                s.purpose
            ));
        }
    }
    if rest.is_empty() {
        return out;
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&format!(
        "not attached: {} of {} probes, by reason\n",
        rest.len(),
        rows.len()
    ));
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for (s, st) in &rest {
        let reason = st.to_string();
        match groups.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, labels)) => labels.push(s.label),
            None => groups.push((reason, vec![s.label])),
        }
    }
    for (reason, labels) in &groups {
        out.push_str(&format!("  {reason}\n"));
        for (kinds, targets) in compact_labels(labels) {
            push_wrapped(&mut out, &kinds, &targets);
        }
    }
    out
}

/// Labels (`kind:target`) as `(kinds, targets)` lines: a kprobe and a kretprobe (or a uprobe
/// and a uretprobe) on the same target become one `kprobe+kretprobe` entry.
fn compact_labels<'a>(labels: &[&'a str]) -> Vec<(String, Vec<&'a str>)> {
    let split: Vec<(&str, &str)> = labels
        .iter()
        .map(|l| l.split_once(':').unwrap_or(("", l)))
        .collect();
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for &(kind, target) in &split {
        let (entry, ret) = match kind {
            "kprobe" | "kretprobe" => ("kprobe", "kretprobe"),
            "uprobe" | "uretprobe" => ("uprobe", "uretprobe"),
            _ => (kind, ""),
        };
        let paired =
            !ret.is_empty() && split.contains(&(entry, target)) && split.contains(&(ret, target));
        if paired && kind == ret {
            continue; // listed with its entry probe
        }
        let kinds = if paired {
            format!("{entry}+{ret}")
        } else {
            kind.to_string()
        };
        match out.iter_mut().find(|(k, _)| *k == kinds) {
            Some((_, targets)) => targets.push(target),
            None => out.push((kinds, vec![target])),
        }
    }
    out
}

/// Appends `    kinds: a, b, c` wrapped at 100 columns (continuations indented further).
fn push_wrapped(out: &mut String, kinds: &str, targets: &[&str]) {
    const WIDTH: usize = 100;
    let mut line = format!("    {kinds}:");
    for (i, t) in targets.iter().enumerate() {
        let sep = if i + 1 < targets.len() { "," } else { "" };
        if i > 0 && line.len() + 1 + t.len() + sep.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = String::from("     ");
        }
        line.push(' ');
        line.push_str(t);
        line.push_str(sep);
    }
    out.push_str(&line);
    out.push('\n');
}

/// First and last line of the generated probe table in `docs/probes.md`.
const TABLE_BEGIN: &str = "<!-- probe table: generated from agent/src/kernel/registry.rs by `uvmwatch probes-doc`; a test keeps it current -->";
const TABLE_END: &str = "<!-- end of the generated probe table -->";

/// The probe table of `docs/probes.md` (Markdown), generated from [`REGISTRY`] and
/// [`KERNEL_FNS`] so it cannot drift, between its two marker lines.
pub fn reference_table() -> String {
    let mut s =
        format!("{TABLE_BEGIN}\n| probe | kind | required | what it gives |\n|---|---|---|---|\n");
    let yes_no = |p: &ProbeSpec| if p.required { "yes" } else { "no" };
    for p in REGISTRY {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            p.label,
            p.attach.kind(),
            yes_no(p),
            p.purpose
        ));
    }
    for k in KERNEL_FNS {
        let [enter, exit] = &k.probes;
        let place = match k.module {
            None => format!(
                "core kernel (`{}`); `fentry:`/`fexit:{}` instead on the fentry backend",
                k.lives_in, k.symbol
            ),
            Some(m) => match k.lives_in.strip_prefix(m) {
                Some(versions) => format!("`{m}`{versions}"),
                None => format!("`{m}`, {}", k.lives_in),
            },
        };
        s.push_str(&format!(
            "| `{}` + `{}` | kprobe pair, {place} | {} | {} |\n",
            enter.label,
            exit.label,
            yes_no(enter),
            enter.purpose
        ));
    }
    s.push_str(TABLE_END);
    s.push('\n');
    s
}

/// `page` (the text of `docs/probes.md`) with its probe table replaced by
/// [`reference_table`]; `None` when the page lacks the marker lines.
pub fn with_reference_table(page: &str) -> Option<String> {
    let begin = page.find(TABLE_BEGIN)?;
    let end = begin + page[begin..].find(TABLE_END)? + TABLE_END.len();
    let end = if page[end..].starts_with('\n') {
        end + 1
    } else {
        end
    };
    Some(format!(
        "{}{}{}",
        &page[..begin],
        reference_table(),
        &page[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_module_function_says_why_in_the_drivers_terms() {
        let debian = AbsenceFacts {
            device_private: Some(false),
            config_source: "/boot/config-6.12.117+deb12-amd64".into(),
            driver: Some("550.163.01".into()),
        };
        let hmm = absence_reason("uvm_hmm_migrate_ranges", Some("nvidia_uvm"), &debian);
        assert!(
            hmm.contains("compiled out") && hmm.contains("CONFIG_DEVICE_PRIVATE off"),
            "{hmm}"
        );
        assert!(hmm.contains("/boot/config-6.12.117+deb12-amd64"), "{hmm}");
        let new = absence_reason(
            "uvm_parent_gpu_service_replayable_faults",
            Some("nvidia_uvm"),
            &debian,
        );
        assert!(
            new.contains("not in driver 550.163.01, added in 560"),
            "{new}"
        );
        assert!(new.contains("uvm_gpu_service_replayable_faults"), "{new}");
        let newer = AbsenceFacts {
            driver: Some("590.48.01".into()),
            device_private: Some(true),
            ..debian.clone()
        };
        let old = absence_reason(
            "uvm_gpu_service_replayable_faults",
            Some("nvidia_uvm"),
            &newer,
        );
        assert!(old.contains("renamed in 560"), "{old}");
        // HMM compiled in and still absent, or no facts: the plain reason.
        let plain = absence_reason("uvm_hmm_migrate_ranges", Some("nvidia_uvm"), &newer);
        assert!(
            plain.contains("another kernel or driver version"),
            "{plain}"
        );
        let unknown = AbsenceFacts::default();
        let u = absence_reason("uvm_hmm_migrate_ranges", Some("nvidia_uvm"), &unknown);
        assert!(u.contains("could not be read"), "{u}");
        assert!(
            absence_reason("uvm_parent_gpu_service_replayable_faults", None, &unknown)
                .contains("another kernel or driver version")
        );
    }

    #[test]
    fn kprobes_follow_the_kernel_fn_ids() {
        assert_eq!(KERNEL_FNS.len(), uvmwatch_common::kernel_fn::COUNT as usize);
        for (i, k) in KERNEL_FNS.iter().enumerate() {
            assert_eq!(k.id as usize, i, "{}", k.symbol);
            assert!(k.module.is_none() || k.module == Some(UVM_MODULE));
            for (p, want_ret) in k.probes.iter().zip([false, true]) {
                let Attach::Kprobe {
                    symbol,
                    ret,
                    module,
                } = p.attach
                else {
                    panic!("{} is not a kprobe", p.label)
                };
                assert_eq!((symbol, ret, module), (k.symbol, want_ret, k.module));
            }
        }
        // The kernel keeps 15 bytes of a program name: those must tell programs apart.
        let mut short = std::collections::HashMap::new();
        for p in all() {
            let k = &p.program[..p.program.len().min(15)];
            if let Some(other) = short.insert(k, p.program) {
                assert_eq!(other, p.program, "{k} is ambiguous");
            }
        }
        assert_eq!(
            kernel_fn_name(uvmwatch_common::kernel_fn::REQUEST_FREE_MEM_REGION),
            "request_free_mem_region"
        );
        assert_eq!(
            kernel_fn_name(uvmwatch_common::kernel_fn::GPU_SERVICE_NON_REPLAYABLE),
            "uvm_gpu_service_non_replayable_fault_buffer"
        );
        assert_eq!(kernel_fn_name(99), "unknown");
        let scoped: Vec<_> = KERNEL_FNS
            .iter()
            .filter(|k| k.uvm_ioctl_only)
            .map(|k| k.symbol)
            .collect();
        assert_eq!(scoped, ["request_free_mem_region", "memremap_pages"]);
    }

    #[test]
    fn labels_unique_and_programs_named() {
        let mut seen = std::collections::HashSet::new();
        for p in &all() {
            assert!(seen.insert(p.label), "duplicate label {}", p.label);
            assert!(!p.program.is_empty());
        }
        // 5 fentry/fexit, 11 tracepoints, 14 uprobes (cuInit and the six context and device
        // calls, each with its uretprobe), 30 kprobes, 12 fentry/fexit of the 6 core-kernel
        // functions.
        assert_eq!(all().len(), 72);
        let uprobes: Vec<_> = REGISTRY
            .iter()
            .filter(|p| matches!(p.attach, Attach::Uprobe { .. }))
            .collect();
        assert_eq!(uprobes.len(), 14);
        for sym in uvmwatch_common::context_call::SYMBOLS {
            let pair: Vec<(String, &str)> = uprobes
                .iter()
                .filter(|p| matches!(p.attach, Attach::Uprobe { symbol, .. } if symbol == sym))
                .map(|p| (p.label.to_string(), p.attach.kind()))
                .collect();
            assert_eq!(
                pair,
                [
                    (format!("uprobe:{sym}"), "uprobe"),
                    (format!("uretprobe:{sym}"), "uretprobe")
                ]
            );
        }
        assert!(REGISTRY.iter().filter(|p| p.required).count() >= 4);
    }

    #[test]
    fn the_floor_takes_every_syscall_hook_of_both_backends_and_the_agent_never_loads_it() {
        let floor = floor();
        let hooks: Vec<(Attach, Option<Backend>)> = REGISTRY
            .iter()
            .filter(|p| {
                matches!(
                    p.attach,
                    Attach::Tracepoint { .. }
                        | Attach::RawTracepoint { .. }
                        | Attach::Fentry { .. }
                )
            })
            .map(|p| (p.attach, p.backend))
            .collect();
        assert_eq!(
            floor
                .iter()
                .map(|p| (p.attach, p.backend))
                .collect::<Vec<_>>(),
            hooks
        );
        assert_eq!(floor.len(), 16);
        let floor_programs: Vec<&str> = floor.iter().map(|p| p.program).collect();
        assert!(floor_programs.iter().all(|p| p.starts_with("floor_")));
        // One floor program per trampoline (each is loaded for its one function).
        let tramp: std::collections::HashSet<&str> = floor
            .iter()
            .filter(|p| matches!(p.attach, Attach::Fentry { .. }))
            .map(|p| p.program)
            .collect();
        assert_eq!(tramp.len(), 5);
        assert!(all().iter().all(|p| !p.program.starts_with("floor_")));
    }

    #[test]
    fn the_syscall_hooks_exist_on_both_backends_and_nothing_else_is_tied_to_one() {
        for p in all() {
            let want = match p.attach {
                Attach::Fentry { .. } => Some(Backend::Fentry),
                Attach::Tracepoint {
                    category: "syscalls",
                    ..
                } => Some(Backend::Tracepoint),
                // A core-kernel function: its kprobes give way to its trampolines.
                Attach::Kprobe { module: None, .. } => Some(Backend::Tracepoint),
                _ => None,
            };
            assert_eq!(p.backend, want, "{}", p.label);
        }
        let core: Vec<&str> = KERNEL_FNS
            .iter()
            .filter(|k| k.trampolines.is_some())
            .map(|k| k.symbol)
            .collect();
        assert_eq!(
            core,
            [
                "request_free_mem_region",
                "memremap_pages",
                "hmm_range_fault",
                "migrate_vma_setup",
                "migrate_vma_pages",
                "migrate_vma_finalize"
            ]
        );
        for k in KERNEL_FNS {
            assert_eq!(k.trampolines.is_some(), k.module.is_none(), "{}", k.symbol);
            if let Some([fe, fx]) = k.trampolines {
                assert_eq!(
                    fe.attach,
                    Attach::Fentry {
                        function: k.symbol,
                        ret: false
                    }
                );
                assert_eq!(
                    fx.attach,
                    Attach::Fentry {
                        function: k.symbol,
                        ret: true
                    }
                );
                assert!(!fe.required && !fx.required);
            }
        }
        let required = |b| {
            all()
                .iter()
                .filter(|p| p.required && p.backend == Some(b))
                .count()
        };
        assert_eq!(required(Backend::Fentry), 5);
        assert_eq!(required(Backend::Tracepoint), 4);
    }

    fn spec(label: &str) -> ProbeSpec {
        all().into_iter().find(|p| p.label == label).unwrap()
    }

    #[test]
    fn table_lists_attached_and_required_and_groups_the_rest() {
        let no_kprobes = ProbeState::Unavailable("kprobes not supported by this kernel".into());
        let mut rows = vec![
            (spec("syscalls:sys_enter_openat"), ProbeState::Attached(1)),
            (
                spec("syscalls:sys_exit_ioctl"),
                ProbeState::Unavailable("tracefs not mounted".into()),
            ),
            (
                spec("sched:sched_process_fork"),
                ProbeState::Unavailable("tracefs not mounted".into()),
            ),
            (
                spec("uprobe:cuInit"),
                ProbeState::Waiting("no libcuda found".into()),
            ),
            (
                spec("uretprobe:cuInit"),
                ProbeState::Waiting("no libcuda found".into()),
            ),
            (spec("kprobe:hmm_range_fault"), ProbeState::Attached(1)),
        ];
        for k in KERNEL_FNS {
            for p in k.probes {
                if p.label != "kprobe:hmm_range_fault" {
                    rows.push((p, no_kprobes.clone()));
                }
            }
        }
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        // Rows: the attached ones and the required one that is not.
        assert!(lines[0].starts_with("PROBE "), "{t}");
        assert!(
            lines[1].starts_with("syscalls:sys_enter_openat ") && lines[1].contains(" attached ")
        );
        assert!(
            lines[2].starts_with("syscalls:sys_exit_ioctl ")
                && lines[2].contains("unavailable: tracefs not mounted")
        );
        assert!(lines[3].starts_with("kprobe:hmm_range_fault ") && lines[3].contains(" kprobe "));
        assert_eq!(lines[4], "");
        assert_eq!(
            lines[5],
            format!(
                "not attached: {} of {} probes, by reason",
                rows.len() - 3,
                rows.len()
            )
        );
        // One line per reason, then the probes it applies to.
        assert_eq!(lines[6], "  unavailable: tracefs not mounted");
        assert_eq!(lines[7], "    sched: sched_process_fork");
        assert_eq!(lines[8], "  waiting: no libcuda found");
        assert_eq!(lines[9], "    uprobe+uretprobe: cuInit");
        assert_eq!(
            lines[10],
            "  unavailable: kprobes not supported by this kernel"
        );
        assert!(
            lines[11].starts_with("    kprobe+kretprobe: request_free_mem_region, memremap_pages,"),
            "{t}"
        );
        assert!(t.contains("    kretprobe: hmm_range_fault\n"), "{t}");
        assert_eq!(t.matches("kprobes not supported").count(), 1, "{t}");
        for l in &lines {
            assert!(l.len() <= 100 || !l.starts_with("    "), "too long: {l}");
        }
        for k in KERNEL_FNS.iter().filter(|k| k.symbol != "hmm_range_fault") {
            assert_eq!(
                t.matches(&format!(" {},", k.symbol)).count()
                    + t.matches(&format!(" {}\n", k.symbol)).count(),
                1,
                "{}: {t}",
                k.symbol
            );
        }
        assert_eq!(ProbeState::Attached(2).gauge(), 1);
        assert_eq!(ProbeState::Waiting(String::new()).gauge(), 0);
    }

    #[test]
    fn reference_page_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/probes.md");
        let page = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            with_reference_table(&page).as_deref() == Some(page.as_str()),
            "docs/probes.md's probe table is stale: run \
             `cargo run -p uvmwatch -- probes-doc --update docs/probes.md`"
        );
        let table = reference_table();
        assert_eq!(
            table.lines().count(),
            2 + 2 + REGISTRY.len() + KERNEL_FNS.len()
        );
        assert!(table.contains(
            "| `kprobe:request_free_mem_region` + `kretprobe:request_free_mem_region` | \
             kprobe pair, core kernel (`kernel/resource.c`); `fentry:`/`fexit:request_free_mem_region` \
             instead on the fentry backend | no |"
        ));
        assert!(table.contains(
            "| `kprobe:uvm_parent_gpu_service_replayable_faults` + \
             `kretprobe:uvm_parent_gpu_service_replayable_faults` | kprobe pair, `nvidia_uvm` (560+) | no |"
        ));
    }
}

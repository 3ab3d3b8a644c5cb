//! The probe registry: every kernel program the agent attaches, what it needs, and whether it
//! is attached here (and if not, why).

use std::fmt;

/// How a probe attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A static tracepoint `category:name` (needs tracefs for its id).
    Tracepoint {
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
}

/// The kernel module whose functions the module kprobes target.
pub const UVM_MODULE: &str = "nvidia_uvm";

/// Name of each probed kernel/driver function, indexed by its `uvmwatch_common::kfunc` id.
pub const KFUNC_NAMES: &[&str] = &[
    "request_free_mem_region",
    "memremap_pages",
    "uvm_api_register_gpu",
    "uvm_va_space_register_gpu",
    "uvm_gpu_retain_by_uuid",
    "uvm_hmm_va_block_service_locked",
    "hmm_range_fault",
    "migrate_vma_setup",
    "migrate_vma_pages",
    "migrate_vma_finalize",
    "uvm_hmm_migrate_ranges",
    "uvm_parent_gpu_service_replayable_faults",
    "uvm_parent_gpu_service_non_replayable_fault_buffer",
    "uvm_gpu_service_replayable_faults",
    "uvm_gpu_service_non_replayable_fault_buffer",
];

/// Name of a probed function by id (`unknown` when out of range).
pub fn kfunc_name(id: u32) -> &'static str {
    KFUNC_NAMES.get(id as usize).copied().unwrap_or("unknown")
}

const fn kp(
    label: &'static str,
    program: &'static str,
    symbol: &'static str,
    ret: bool,
    module: Option<&'static str>,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Kprobe {
            symbol,
            ret,
            module,
        },
        required: false,
        purpose,
    }
}

/// Registry entries of one kprobe/kretprobe pair.
macro_rules! kpair {
    ($sym:literal, $enter:literal, $exit:literal, $module:expr, $purpose:literal) => {
        [
            kp(
                concat!("kprobe:", $sym),
                $enter,
                $sym,
                false,
                $module,
                $purpose,
            ),
            kp(
                concat!("kretprobe:", $sym),
                $exit,
                $sym,
                true,
                $module,
                $purpose,
            ),
        ]
    };
}

const UVM: Option<&str> = Some(UVM_MODULE);

/// The kprobe part of the registry, in `uvmwatch_common::kfunc` order.
pub const KPROBES: &[[ProbeSpec; 2]] = &[
    kpair!(
        "request_free_mem_region",
        "kp_free_mem_region",
        "krp_free_mem_region",
        None,
        "HMM device-memory set-up: its error (-34 ERANGE in the KASLR case) inside a UVM ioctl"
    ),
    kpair!(
        "memremap_pages",
        "kp_memremap_pages",
        "krp_memremap_pages",
        None,
        "HMM device-memory set-up: its error inside a UVM ioctl"
    ),
    kpair!(
        "uvm_api_register_gpu",
        "kp_api_register_gpu",
        "krp_api_register_gpu",
        UVM,
        "UVM_REGISTER_GPU: latency and NV_STATUS"
    ),
    kpair!(
        "uvm_va_space_register_gpu",
        "kp_va_space_reg_gpu",
        "krp_va_space_reg_gpu",
        UVM,
        "GPU registration in the VA space: latency and NV_STATUS"
    ),
    kpair!(
        "uvm_gpu_retain_by_uuid",
        "kp_gpu_retain",
        "krp_gpu_retain",
        UVM,
        "global UVM lock wait plus GPU bring-up: latency and NV_STATUS"
    ),
    kpair!(
        "uvm_hmm_va_block_service_locked",
        "kp_hmm_block_svc",
        "krp_hmm_block_svc",
        UVM,
        "HMM fault servicing: count and latency"
    ),
    kpair!(
        "hmm_range_fault",
        "kp_hmm_range_fault",
        "krp_hmm_range_fault",
        None,
        "HMM faults (every caller): count, latency, errors"
    ),
    kpair!(
        "migrate_vma_setup",
        "kp_migrate_setup",
        "krp_migrate_setup",
        None,
        "HMM migration set-up: count, latency, errors"
    ),
    kpair!(
        "migrate_vma_pages",
        "kp_migrate_pages",
        "krp_migrate_pages",
        None,
        "HMM migration: count and latency"
    ),
    kpair!(
        "migrate_vma_finalize",
        "kp_migrate_final",
        "krp_migrate_final",
        None,
        "HMM migration finalize: count and latency"
    ),
    kpair!(
        "uvm_hmm_migrate_ranges",
        "kp_hmm_migrate",
        "krp_hmm_migrate",
        UVM,
        "UVM HMM migrations: count, latency, NV_STATUS"
    ),
    kpair!(
        "uvm_parent_gpu_service_replayable_faults",
        "kp_pgpu_replay",
        "krp_pgpu_replay",
        UVM,
        "replayable GPU fault batches (560+)"
    ),
    kpair!(
        "uvm_parent_gpu_service_non_replayable_fault_buffer",
        "kp_pgpu_nonreplay",
        "krp_pgpu_nonreplay",
        UVM,
        "non-replayable GPU fault batches (560+)"
    ),
    kpair!(
        "uvm_gpu_service_replayable_faults",
        "kp_gpu_replay",
        "krp_gpu_replay",
        UVM,
        "replayable GPU fault batches (535/550)"
    ),
    kpair!(
        "uvm_gpu_service_non_replayable_fault_buffer",
        "kp_gpu_nonreplay",
        "krp_gpu_nonreplay",
        UVM,
        "non-replayable GPU fault batches (535/550)"
    ),
];

/// Every probe: [`REGISTRY`] then the kprobe pairs of [`KPROBES`].
pub fn all() -> Vec<ProbeSpec> {
    REGISTRY
        .iter()
        .copied()
        .chain(KPROBES.iter().flat_map(|p| p.iter().copied()))
        .collect()
}

/// One entry of the registry.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// Label used in `uvmwatch_probe_attached{probe}` and `uvmwatch probes`.
    pub label: &'static str,
    /// Program name in the eBPF object (`agent-ebpf/src/main.rs`).
    pub program: &'static str,
    /// Where it attaches.
    pub attach: Attach,
    /// Without a required probe the agent's main signal is gone (it still starts).
    pub required: bool,
    /// What the probe gives, for `uvmwatch probes`.
    pub purpose: &'static str,
}

const fn tp(
    label: &'static str,
    program: &'static str,
    category: &'static str,
    name: &'static str,
    required: bool,
    purpose: &'static str,
) -> ProbeSpec {
    ProbeSpec {
        label,
        program,
        attach: Attach::Tracepoint { category, name },
        required,
        purpose,
    }
}

/// Every probe, in attach order.
pub const REGISTRY: &[ProbeSpec] = &[
    tp(
        "syscalls:sys_enter_openat",
        "openat_enter",
        "syscalls",
        "sys_enter_openat",
        true,
        "device node opens (path), libcuda loads",
    ),
    tp(
        "syscalls:sys_exit_openat",
        "openat_exit",
        "syscalls",
        "sys_exit_openat",
        true,
        "device open results, fd tracking",
    ),
    tp(
        "syscalls:sys_enter_ioctl",
        "ioctl_enter",
        "syscalls",
        "sys_enter_ioctl",
        true,
        "driver calls in flight",
    ),
    tp(
        "syscalls:sys_exit_ioctl",
        "ioctl_exit",
        "syscalls",
        "sys_exit_ioctl",
        true,
        "driver call latency, errno and rmStatus",
    ),
    tp(
        "syscalls:sys_enter_close",
        "close_enter",
        "syscalls",
        "sys_enter_close",
        false,
        "fd tracking (close)",
    ),
    tp(
        "syscalls:sys_enter_dup",
        "dup_enter_tp",
        "syscalls",
        "sys_enter_dup",
        false,
        "fd tracking (dup)",
    ),
    tp(
        "syscalls:sys_exit_dup",
        "dup_exit_tp",
        "syscalls",
        "sys_exit_dup",
        false,
        "fd tracking (dup)",
    ),
    tp(
        "syscalls:sys_enter_dup2",
        "dup2_enter",
        "syscalls",
        "sys_enter_dup2",
        false,
        "fd tracking (dup2; absent on arm64)",
    ),
    tp(
        "syscalls:sys_exit_dup2",
        "dup_exit_tp",
        "syscalls",
        "sys_exit_dup2",
        false,
        "fd tracking (dup2; absent on arm64)",
    ),
    tp(
        "syscalls:sys_enter_dup3",
        "dup3_enter",
        "syscalls",
        "sys_enter_dup3",
        false,
        "fd tracking (dup3)",
    ),
    tp(
        "syscalls:sys_exit_dup3",
        "dup_exit_tp",
        "syscalls",
        "sys_exit_dup3",
        false,
        "fd tracking (dup3)",
    ),
    tp(
        "syscalls:sys_enter_fcntl",
        "fcntl_enter",
        "syscalls",
        "sys_enter_fcntl",
        false,
        "fd tracking (F_DUPFD)",
    ),
    tp(
        "syscalls:sys_exit_fcntl",
        "dup_exit_tp",
        "syscalls",
        "sys_exit_fcntl",
        false,
        "fd tracking (F_DUPFD)",
    ),
    tp(
        "sched:sched_process_fork",
        "sched_fork",
        "sched",
        "sched_process_fork",
        false,
        "fd inheritance across fork",
    ),
    tp(
        "sched:sched_process_exec",
        "sched_exec",
        "sched",
        "sched_process_exec",
        false,
        "close-on-exec fds",
    ),
    tp(
        "sched:sched_process_exit",
        "sched_exit",
        "sched",
        "sched_process_exit",
        false,
        "threads that die mid-call, process clean-up",
    ),
    ProbeSpec {
        label: "uprobe:cuInit",
        program: "cuinit_enter",
        attach: Attach::Uprobe {
            symbol: "cuInit",
            ret: false,
        },
        required: false,
        purpose: "cuInit entry in every libcuda found",
    },
    ProbeSpec {
        label: "uretprobe:cuInit",
        program: "cuinit_exit",
        attach: Attach::Uprobe {
            symbol: "cuInit",
            ret: true,
        },
        required: false,
        purpose: "cuInit result and duration",
    },
];

/// State of one probe on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeState {
    /// Attached (for uprobes: to this many libcuda files).
    Attached(usize),
    /// Can attach but has nothing to attach to yet (uprobes before any libcuda is found).
    Waiting(String),
    /// Not attached, with the reason.
    Unavailable(String),
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
        }
    }
}

/// Renders the `uvmwatch probes` table.
pub fn render_table(rows: &[(ProbeSpec, ProbeState)]) -> String {
    let mut out = String::new();
    let w = rows
        .iter()
        .map(|(s, _)| s.label.len())
        .max()
        .unwrap_or(5)
        .max(5);
    out.push_str(&format!(
        "{:<w$}  {:<10}  {:<8}  {}\n",
        "PROBE", "KIND", "REQUIRED", "STATE"
    ));
    for (s, st) in rows {
        let kind = match s.attach {
            Attach::Tracepoint { .. } => "tracepoint",
            Attach::Uprobe { ret: false, .. } => "uprobe",
            Attach::Uprobe { ret: true, .. } => "uretprobe",
            Attach::Kprobe { ret: false, .. } => "kprobe",
            Attach::Kprobe { ret: true, .. } => "kretprobe",
        };
        out.push_str(&format!(
            "{:<w$}  {:<10}  {:<8}  {}  [{}]\n",
            s.label,
            kind,
            if s.required { "yes" } else { "no" },
            st,
            s.purpose
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kprobes_follow_the_kfunc_ids() {
        assert_eq!(KPROBES.len(), uvmwatch_common::kfunc::COUNT as usize);
        assert_eq!(KFUNC_NAMES.len(), KPROBES.len());
        for (i, pair) in KPROBES.iter().enumerate() {
            for p in pair {
                let Attach::Kprobe { symbol, .. } = p.attach else {
                    panic!("{} is not a kprobe", p.label)
                };
                assert_eq!(symbol, KFUNC_NAMES[i]);
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
            kfunc_name(uvmwatch_common::kfunc::REQUEST_FREE_MEM_REGION),
            "request_free_mem_region"
        );
        assert_eq!(kfunc_name(99), "unknown");
    }

    #[test]
    fn labels_unique_and_programs_named() {
        let mut seen = std::collections::HashSet::new();
        for p in &all() {
            assert!(seen.insert(p.label), "duplicate label {}", p.label);
            assert!(!p.program.is_empty());
        }
        assert!(REGISTRY.iter().filter(|p| p.required).count() >= 4);
    }

    #[test]
    fn table_lists_reasons() {
        let rows = vec![
            (REGISTRY[0], ProbeState::Attached(1)),
            (REGISTRY[16], ProbeState::Waiting("no libcuda found".into())),
            (
                REGISTRY[13],
                ProbeState::Unavailable("tracefs not mounted".into()),
            ),
        ];
        let t = render_table(&rows);
        assert!(t.contains("syscalls:sys_enter_openat"));
        assert!(t.contains("waiting: no libcuda found"));
        assert!(t.contains("unavailable: tracefs not mounted"));
        assert_eq!(ProbeState::Attached(2).gauge(), 1);
        assert_eq!(ProbeState::Waiting(String::new()).gauge(), 0);
    }
}

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
    fn labels_unique_and_programs_named() {
        let mut seen = std::collections::HashSet::new();
        for p in REGISTRY {
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

//! The capabilities this process holds, as far as they decide what the agent can see
//! (docs/capabilities.md): `CAP_SYS_ADMIN` (uprobes, kernel stacks), `CAP_SYS_PTRACE`
//! (other processes' `/proc/<pid>/root`, `exe`, `wchan`) and `CAP_SYSLOG` (the kernel log
//! under `kernel.dmesg_restrict=1`).

use caps::{CapSet, Capability};

/// The effective capabilities that matter to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub sys_admin: bool,
    pub sys_ptrace: bool,
    pub syslog: bool,
    /// `kernel.dmesg_restrict` is 1 (reading `/dev/kmsg` then needs `CAP_SYSLOG`).
    pub dmesg_restrict: bool,
}

impl Capabilities {
    /// This process's effective set (each capability taken as held when it cannot be read,
    /// so that a kernel without capget never turns features off by itself).
    pub fn of_this_process() -> Capabilities {
        let has = |c| caps::has_cap(None, CapSet::Effective, c).unwrap_or(true);
        Capabilities {
            sys_admin: has(Capability::CAP_SYS_ADMIN),
            sys_ptrace: has(Capability::CAP_SYS_PTRACE),
            syslog: has(Capability::CAP_SYSLOG),
            dmesg_restrict: std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict")
                .map(|s| s.trim() != "0")
                .unwrap_or(true),
        }
    }

    /// Every capability held (tests, and the observer over a test kernel side).
    pub fn all() -> Capabilities {
        Capabilities {
            sys_admin: true,
            sys_ptrace: true,
            syslog: true,
            dmesg_restrict: false,
        }
    }
}

//! What the agent can see on this host, feature by feature: each feature is on or off, and
//! when off, what is lost and why (a probe the kernel refused, a capability not held). The
//! observer sends them with every probe-table change ([`crate::event::Kind::ProbesChanged`]):
//! the log says each feature that goes off once, at WARN; `uvmwatch_feature_enabled` exports
//! them; `/readyz` is not ready while [`DRIVER_CALLS`] is off.

use crate::{
    host::caps::Capabilities,
    kernel::registry::{Attach, ProbeSpec, ProbeState},
};

/// The driver's ioctls and device opens: every required probe attached.
pub const DRIVER_CALLS: &str = "driver_calls";

/// One feature's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feature {
    /// Its name, the `feature` label of `uvmwatch_feature_enabled`.
    pub name: &'static str,
    pub on: bool,
    /// What the agent does not see while it is off.
    pub lost: &'static str,
    /// Why it is off (empty when on).
    pub why: String,
}

fn feature(name: &'static str, lost: &'static str, off: Option<String>) -> Feature {
    Feature {
        name,
        on: off.is_none(),
        lost,
        why: off.unwrap_or_default(),
    }
}

/// The features, from the probe table and the capabilities held. `kprobes`: the kernel
/// offers kprobes at all.
pub fn assess(
    probes: &[(ProbeSpec, ProbeState)],
    caps: &Capabilities,
    kprobes: bool,
) -> Vec<Feature> {
    let first_unavailable = |pick: &dyn Fn(&ProbeSpec) -> bool| {
        probes.iter().find_map(|(s, st)| match st {
            ProbeState::Unavailable(why) if pick(s) => Some(format!("{}: {why}", s.label)),
            _ => None,
        })
    };
    let uprobes = |s: &ProbeSpec| matches!(s.attach, Attach::Uprobe { .. });
    let kernel_fn_trampoline_attached = probes.iter().any(|(s, st)| {
        crate::kernel::registry::is_kernel_fn_trampoline(s) && matches!(st, ProbeState::Attached(_))
    });
    let required_off = probes
        .iter()
        .find(|(s, st)| {
            // A probe of the backend not chosen is on standby: the other one's are attached.
            s.required && !matches!(st, ProbeState::Attached(_) | ProbeState::Standby(_))
        })
        .map(|(s, st)| format!("required probe {} {st}", s.label));
    let cuinit_off = if !caps.sys_admin {
        Some("no CAP_SYS_ADMIN: the kernel refuses uprobes to CAP_BPF and CAP_PERFMON (docs/capabilities.md)".into())
    } else if probes
        .iter()
        .filter(|(s, _)| uprobes(s))
        .all(|(_, st)| matches!(st, ProbeState::Unavailable(_)))
    {
        first_unavailable(&uprobes)
    } else {
        None
    };
    vec![
        feature(
            DRIVER_CALLS,
            "driver ioctls, their results and latencies, device opens, ioctl stalls",
            required_off,
        ),
        feature(
            "cuinit_calls",
            "cuInit calls, results and durations, cuInit stalls and what the diagnosis builds on them",
            cuinit_off,
        ),
        feature(
            "container_libcuda",
            "libcuda files that exist only inside containers (their cuInit is not seen); exe and wchan of other processes in stall reports",
            (!caps.sys_ptrace).then(|| {
                "no CAP_SYS_PTRACE: other processes' /proc/<pid>/root, exe and wchan are refused".into()
            }),
        ),
        feature(
            "kernel_stacks",
            "the kernel stack of a stalled thread",
            match (caps.sys_admin, caps.sys_ptrace) {
                (false, _) => Some("no CAP_SYS_ADMIN: /proc/<pid>/task/<tid>/stack is refused".into()),
                (true, false) => Some(
                    "no CAP_SYS_PTRACE: other processes' /proc/<pid>/task/<tid>/stack is refused"
                        .into(),
                ),
                (true, true) => None,
            },
        ),
        feature(
            "kernel_log",
            "Xid lines, API mismatches and lockups from the kernel log for the diagnosis",
            (!caps.syslog && caps.dmesg_restrict).then(|| {
                "no CAP_SYSLOG and kernel.dmesg_restrict=1: /dev/kmsg is refused".into()
            }),
        ),
        feature(
            "kernel_functions",
            "the HMM and fault-handling kernel functions (calls, results, the -34 HMM signal)",
            // Off only while no kernel-function probe can attach: without kprobes, the core
            // functions' trampolines of the fentry backend still give them.
            (!kprobes && !kernel_fn_trampoline_attached).then(|| {
                "kprobes not supported by this kernel (no kprobe PMU: CONFIG_KPROBES off) and no fentry on the core kernel functions".into()
            }),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::registry::REGISTRY;

    fn table(state: impl Fn(&ProbeSpec) -> ProbeState) -> Vec<(ProbeSpec, ProbeState)> {
        REGISTRY.iter().map(|s| (*s, state(s))).collect()
    }

    fn on(fs: &[Feature], name: &str) -> bool {
        fs.iter().find(|f| f.name == name).unwrap().on
    }

    #[test]
    fn everything_on_with_every_probe_and_capability() {
        let fs = assess(
            &table(|_| ProbeState::Attached(1)),
            &Capabilities::all(),
            true,
        );
        assert!(fs.iter().all(|f| f.on && f.why.is_empty()), "{fs:?}");
    }

    #[test]
    fn a_required_probe_refused_turns_driver_calls_off_with_its_reason() {
        let fs = assess(
            &table(|_| ProbeState::Unavailable("perf_event_open: Permission denied".into())),
            &Capabilities::all(),
            true,
        );
        let d = fs.iter().find(|f| f.name == DRIVER_CALLS).unwrap();
        assert!(!d.on);
        assert!(d.why.contains("Permission denied"), "{d:?}");
        assert!(!on(&fs, "cuinit_calls"));
    }

    #[test]
    fn uprobes_waiting_for_a_libcuda_are_on_but_not_without_cap_sys_admin() {
        let t = table(|s| match s.attach {
            Attach::Uprobe { .. } => ProbeState::Waiting("no libcuda found yet".into()),
            _ => ProbeState::Attached(1),
        });
        assert!(on(&assess(&t, &Capabilities::all(), true), "cuinit_calls"));
        let no_admin = Capabilities {
            sys_admin: false,
            ..Capabilities::all()
        };
        let fs = assess(&t, &no_admin, true);
        assert!(!on(&fs, "cuinit_calls") && !on(&fs, "kernel_stacks"));
        assert!(on(&fs, DRIVER_CALLS) && on(&fs, "container_libcuda"));
        let no_ptrace = Capabilities {
            sys_ptrace: false,
            ..Capabilities::all()
        };
        let fs = assess(&t, &no_ptrace, true);
        assert!(!on(&fs, "container_libcuda") && !on(&fs, "kernel_stacks"));
        assert!(on(&fs, "cuinit_calls"));
    }

    #[test]
    fn the_kernel_log_is_off_only_when_restricted_and_no_cap_syslog() {
        let t = table(|_| ProbeState::Attached(1));
        let c = |syslog, dmesg_restrict| Capabilities {
            syslog,
            dmesg_restrict,
            ..Capabilities::all()
        };
        assert!(on(&assess(&t, &c(false, false), true), "kernel_log"));
        assert!(on(&assess(&t, &c(true, true), true), "kernel_log"));
        assert!(!on(&assess(&t, &c(false, true), true), "kernel_log"));
        assert!(!on(
            &assess(&t, &Capabilities::all(), false),
            "kernel_functions"
        ));
    }
}

//! Attaching the tracepoint programs: the `syscalls` tracepoints of the tracepoint backend,
//! each only where tracefs lists its event, and the `sched` raw tracepoints of both
//! backends (no tracefs needed).

use anyhow::{anyhow, Result};
use aya::programs::{RawTracePoint, TracePoint};

use super::{
    btf::SchedOffsets,
    registry::{Attach, ProbeSpec, ProbeState, EXIT_GROUP_DEAD_PROGRAM},
    tracefs, Kernel,
};

/// Fits the `sched` raw tracepoints of `specs` to the running kernel, before anything is
/// loaded: `sched_process_exit` gets the program that reads `group_dead` where the
/// tracepoint passes it, and `sched_process_fork` is unavailable without `task_struct.pid`
/// (its program could not read the child's pid).
fn fit_sched_probes(specs: &mut [ProbeSpec], states: &mut [ProbeState], sched: SchedOffsets) {
    for (spec, state) in specs.iter_mut().zip(states.iter_mut()) {
        match spec.program {
            "sched_exit" if sched.exit_group_dead => spec.program = EXIT_GROUP_DEAD_PROGRAM,
            "sched_fork" if sched.task_pid == 0 => {
                *state = ProbeState::Unavailable(
                    "no task_struct.pid in the kernel's BTF: forks not followed".into(),
                );
            }
            _ => {}
        }
    }
}

impl Kernel {
    /// [`fit_sched_probes`] on this kernel's probes.
    pub(super) fn fit_sched_probes(&mut self, sched: SchedOffsets) {
        fit_sched_probes(&mut self.specs, &mut self.states, sched);
    }

    pub(super) fn attach_tracepoints(&mut self) {
        for i in 0..self.specs.len() {
            let spec = self.specs[i];
            let (category, name, raw) = match spec.attach {
                Attach::Tracepoint { category, name } => (category, name, false),
                Attach::RawTracepoint { category, name } => (category, name, true),
                Attach::Uprobe { .. } => {
                    if matches!(self.states[i], ProbeState::Unavailable(ref s) if s == "not attached yet")
                    {
                        self.states[i] = ProbeState::Waiting("no libcuda found yet".into());
                    }
                    continue;
                }
                _ => continue,
            };
            // Only what is still to attach: not a program the verifier rejected, a probe
            // found unusable before (`fit_sched_probes`) or the other backend's.
            if !matches!(self.states[i], ProbeState::Unavailable(ref s) if s == "not attached yet")
            {
                continue;
            }
            if !raw {
                let Some(t) = &self.tracefs else {
                    self.states[i] = ProbeState::Unavailable("tracefs not mounted".into());
                    continue;
                };
                if !tracefs::has_event(t, category, name) {
                    self.states[i] = ProbeState::Unavailable(format!(
                        "tracepoint {category}:{name} not in this kernel"
                    ));
                    continue;
                }
            }
            let r: Result<()> = (|| {
                let prog = self
                    .bpf
                    .program_mut(spec.program)
                    .ok_or_else(|| anyhow!("program {} missing", spec.program))?;
                if raw {
                    let p: &mut RawTracePoint = prog.try_into()?;
                    p.attach(name)?;
                } else {
                    let p: &mut TracePoint = prog.try_into()?;
                    p.attach(category, name)?;
                }
                Ok(())
            })();
            self.states[i] = match r {
                Ok(()) => ProbeState::Attached(1),
                Err(e) => ProbeState::Unavailable(format!("{e:#}")),
            };
        }
        for (spec, st) in self.specs.iter().zip(&self.states) {
            if spec.required && !matches!(st, ProbeState::Attached(_) | ProbeState::Standby(_)) {
                tracing::error!(probe = spec.label, state = %st, "required probe not attached");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::registry;

    fn fitted(sched: SchedOffsets) -> Vec<(&'static str, &'static str, ProbeState)> {
        let mut specs = registry::all();
        let mut states = vec![ProbeState::Unavailable("not attached yet".into()); specs.len()];
        fit_sched_probes(&mut specs, &mut states, sched);
        specs
            .iter()
            .zip(states)
            .filter(|(s, _)| s.label.starts_with("sched:"))
            .map(|(s, st)| (s.label, s.program, st))
            .collect()
    }

    #[test]
    fn the_exit_program_fits_the_tracepoints_arguments_and_fork_needs_the_pid_offset() {
        let pending = || ProbeState::Unavailable("not attached yet".into());
        // 6.1 and 6.12: `sched_process_exit(p)`.
        let old = fitted(SchedOffsets {
            task_pid: 1234,
            exit_group_dead: false,
        });
        assert_eq!(
            old,
            [
                ("sched:sched_process_fork", "sched_fork", pending()),
                ("sched:sched_process_exec", "sched_exec", pending()),
                ("sched:sched_process_exit", "sched_exit", pending()),
            ]
        );
        // 6.18: `sched_process_exit(p, group_dead)`; no BTF for the pid.
        let new = fitted(SchedOffsets {
            task_pid: 0,
            exit_group_dead: true,
        });
        assert_eq!(new[2].1, EXIT_GROUP_DEAD_PROGRAM);
        assert!(
            matches!(&new[0].2, ProbeState::Unavailable(s) if s.contains("task_struct.pid")),
            "{:?}",
            new[0]
        );
        assert_eq!(new[1].2, pending());
        // The floor's programs read no argument: nothing to fit.
        let mut floor = registry::floor();
        let mut states = vec![pending(); floor.len()];
        fit_sched_probes(&mut floor, &mut states, SchedOffsets::default());
        assert!(floor.iter().all(|s| s.program.starts_with("floor_")));
        assert!(states.iter().all(|s| *s == pending()));
    }
}

//! Attaching the tracepoint programs: the `syscalls` tracepoints of the tracepoint backend,
//! each only where tracefs lists its event, and the `sched` raw tracepoints of both
//! backends (no tracefs needed).

use anyhow::{anyhow, Result};
use aya::programs::{RawTracePoint, TracePoint};

use super::{
    registry::{Attach, ProbeState},
    tracefs, Kernel,
};

impl Kernel {
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
            if matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("program rejected"))
                || matches!(self.states[i], ProbeState::Standby(_))
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

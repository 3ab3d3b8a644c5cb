//! Attaching the tracepoint programs (`sched` on both backends, `syscalls` on the
//! tracepoint backend), each only where tracefs lists its event.

use anyhow::{anyhow, Result};
use aya::programs::TracePoint;

use super::{
    registry::{Attach, ProbeState},
    tracefs, Kernel,
};

impl Kernel {
    pub(super) fn attach_tracepoints(&mut self) {
        for i in 0..self.specs.len() {
            let spec = self.specs[i];
            let Attach::Tracepoint { category, name } = spec.attach else {
                if matches!(spec.attach, Attach::Uprobe { .. })
                    && matches!(self.states[i], ProbeState::Unavailable(ref s) if s == "not attached yet")
                {
                    self.states[i] = ProbeState::Waiting("no libcuda found yet".into());
                }
                continue;
            };
            if matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("program rejected"))
                || matches!(self.states[i], ProbeState::Standby(_))
            {
                continue;
            }
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
            let r: Result<()> = (|| {
                let p: &mut TracePoint = self
                    .bpf
                    .program_mut(spec.program)
                    .ok_or_else(|| anyhow!("program {} missing", spec.program))?
                    .try_into()?;
                p.attach(category, name)?;
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

//! Kprobes on `nvidia_uvm`'s functions and the core kernel's, and the watch on the
//! module: its kprobes attach when it is loaded and detach when it goes; a function the
//! running kernel or driver lacks says why ([`registry::absence_reason`]).

use std::path::Path;

use anyhow::{anyhow, Result};
use aya::programs::{kprobe::KProbeLinkId, KProbe};

use super::{
    kallsyms::Kallsyms,
    registry::{self, Attach, ProbeState, UVM_MODULE},
    Kernel,
};

impl Kernel {
    /// Attaches every kprobe whose target is present now: core-kernel functions once,
    /// module functions whenever their module is loaded. Records why the others are off.
    pub(super) fn attach_kprobes(&mut self) {
        if !kprobes_supported() {
            for (i, spec) in self.specs.iter().enumerate() {
                if matches!(spec.attach, Attach::Kprobe { .. })
                    && !matches!(self.states[i], ProbeState::Standby(_))
                {
                    self.states[i] = ProbeState::Unavailable(
                        "kprobes not supported by this kernel (no kprobe PMU in \
                         /sys/bus/event_source/devices: CONFIG_KPROBES off)"
                            .into(),
                    );
                }
            }
            return;
        }
        let wanted: Vec<&str> = self
            .specs
            .iter()
            .filter_map(|spec| match spec.attach {
                Attach::Kprobe { symbol, .. } => Some(symbol),
                _ => None,
            })
            .collect();
        let syms = match Kallsyms::read(Path::new("/proc/kallsyms"), &wanted) {
            Ok(k) => k,
            Err(e) => {
                for (i, spec) in self.specs.iter().enumerate() {
                    if matches!(spec.attach, Attach::Kprobe { .. })
                        && !matches!(self.states[i], ProbeState::Standby(_))
                    {
                        self.states[i] = ProbeState::Unavailable(format!("{e:#}"));
                    }
                }
                return;
            }
        };
        self.uvm_loaded = syms.has_module(UVM_MODULE);
        // Read once, and only when a function is missing.
        let mut absence: Option<registry::AbsenceFacts> = None;
        for i in 0..self.specs.len() {
            let spec = self.specs[i];
            let Attach::Kprobe {
                symbol,
                ret,
                module,
            } = spec.attach
            else {
                continue;
            };
            if self.kprobe_links.contains_key(&i)
                || matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("program rejected"))
                || matches!(self.states[i], ProbeState::Standby(_))
            {
                continue;
            }
            if let Some(m) = module {
                if !syms.has_module(m) {
                    self.states[i] = ProbeState::Waiting(format!("module {m} not loaded"));
                    continue;
                }
            }
            let Some(target) = syms.resolve(symbol, module) else {
                let facts = absence.get_or_insert_with(self.absence_facts);
                self.states[i] =
                    ProbeState::Unavailable(registry::absence_reason(symbol, module, facts));
                continue;
            };
            let r: Result<KProbeLinkId> = (|| {
                let p: &mut KProbe = self
                    .bpf
                    .program_mut(spec.program)
                    .ok_or_else(|| anyhow!("program {} missing", spec.program))?
                    .try_into()?;
                Ok(p.attach(&target, 0)?)
            })();
            self.states[i] = match r {
                Ok(link) => {
                    self.kprobe_links.insert(i, link);
                    ProbeState::Attached(1)
                }
                Err(e) => ProbeState::Unavailable(format!(
                    "attaching {}probe to {target}: {e:#}",
                    if ret { "kret" } else { "k" }
                )),
            };
        }
    }

    /// Detaches the kprobes on functions of `module` (it was unloaded).
    fn detach_module_kprobes(&mut self, module: &str) {
        for i in 0..self.specs.len() {
            let spec = self.specs[i];
            let Attach::Kprobe {
                module: Some(m), ..
            } = spec.attach
            else {
                continue;
            };
            if m != module {
                continue;
            }
            if let Some(link) = self.kprobe_links.remove(&i) {
                if let Some(p) = self.bpf.program_mut(spec.program) {
                    if let Ok(p) = <&mut KProbe>::try_from(p) {
                        let _ = p.detach(link);
                    }
                }
            }
            self.states[i] = ProbeState::Waiting(format!("module {m} not loaded"));
        }
    }

    /// Checks whether `nvidia_uvm` was loaded or unloaded since the last check and attaches
    /// or detaches its kprobes. Returns `Some(loaded)` when it changed.
    pub fn refresh_module(&mut self) -> Option<bool> {
        if let Some(m) = self.refresh_uvm_major() {
            tracing::info!(major = m, "nvidia-uvm character major (0: not registered)");
        }
        if !kprobes_supported() {
            return None;
        }
        let loaded = Path::new("/sys/module").join(UVM_MODULE).exists();
        if loaded == self.uvm_loaded {
            return None;
        }
        if loaded {
            self.attach_kprobes();
            // kallsyms can lag the sysfs entry for a moment: retry on the next check.
            if !self.uvm_loaded {
                return None;
            }
        } else {
            self.detach_module_kprobes(UVM_MODULE);
            self.uvm_loaded = false;
        }
        Some(loaded)
    }

    /// Whether the kretprobe of function `id` is attached now.
    pub fn kernel_fn_attached(&self, id: u32) -> bool {
        let name = registry::kernel_fn_name(id);
        self.specs.iter().enumerate().any(|(i, s)| match s.attach {
            Attach::Kprobe {
                ret: true, symbol, ..
            } => symbol == name && self.kprobe_links.contains_key(&i),
            Attach::Fentry {
                ret: true,
                function,
            } => function == name && matches!(self.states[i], ProbeState::Attached(_)),
            _ => false,
        })
    }
}

/// Whether the kernel offers kprobes (the `kprobe` perf PMU, `CONFIG_KPROBES`).
pub fn kprobes_supported() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

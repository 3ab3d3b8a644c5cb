//! The choice of how the opens and ioctls are hooked: fentry/fexit trampolines where the
//! kernel allows them, else the syscall tracepoints (docs/probes.md#backends), and the
//! trampolines of the core-kernel functions on the fentry backend.

use anyhow::{anyhow, Result};
use aya::{
    programs::{FEntry, FExit},
    Btf as AyaBtf,
};

use super::{
    btf,
    registry::{self as probes, Attach, Backend, BackendChoice, BackendChosen, ProbeState},
    verifier::refusal,
    Kernel,
};

impl Kernel {
    /// Picks the backend the syscalls are hooked with: on `auto` or `fentry`, loads and
    /// attaches every fentry/fexit probe of the syscalls; if the kernel refuses one, detaches
    /// them all and (on `auto`) falls back to the tracepoints, keeping the kernel's reason.
    /// On the fentry backend the core-kernel functions of `KERNEL_FNS` get their trampolines too,
    /// each pair falling back to its kprobes alone when refused. The probes of the backend
    /// not used are put on standby, each saying why.
    pub(super) fn choose_backend(&mut self, choice: BackendChoice) {
        let fentry: Vec<usize> = (0..self.specs.len())
            .filter(|&i| {
                matches!(self.specs[i].attach, Attach::Fentry { .. })
                    && !probes::is_kernel_fn_trampoline(&self.specs[i])
            })
            .collect();
        // The kernel's BTF as aya reads it (several MiB while held): parsed once, for every
        // trampoline, and dropped before the rest loads.
        let kernel_btf = match choice {
            BackendChoice::Tracepoint => None,
            _ => Some(self.fentry_btf()),
        };
        let attempt = match (choice, &kernel_btf) {
            (BackendChoice::Tracepoint, _) | (_, None) => {
                Err("--probe-backend tracepoint".to_string())
            }
            (_, Some(Err(e))) => Err(e.clone()),
            (_, Some(Ok(b))) => self.attach_fentry(&fentry, b),
        };
        let attached = attempt.is_ok();
        let (backend, cause, why, standby) = match (attempt, choice) {
            (Ok(()), _) => (
                Backend::Fentry,
                "trampolines_allowed",
                "the kernel allows trampolines".to_string(),
                "the fentry backend is attached".to_string(),
            ),
            (Err(flag), BackendChoice::Tracepoint) => {
                (Backend::Tracepoint, "flag", flag.clone(), flag)
            }
            (Err(e), BackendChoice::Fentry) => {
                for &i in &fentry {
                    self.states[i] = ProbeState::Unavailable(format!("fentry refused: {e}"));
                }
                (
                    Backend::Fentry,
                    "flag",
                    format!("--probe-backend fentry, refused: {e}"),
                    "--probe-backend fentry".to_string(),
                )
            }
            (Err(e), BackendChoice::Auto) => {
                let why = format!("fentry refused: {e}");
                let standby = format!("{why}; the syscall tracepoints and kprobes are used");
                (Backend::Tracepoint, "fentry_refused", why, standby)
            }
        };
        let other = match backend {
            Backend::Fentry => Backend::Tracepoint,
            Backend::Tracepoint => Backend::Fentry,
        };
        for i in 0..self.specs.len() {
            if self.specs[i].backend == Some(other)
                && !matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("fentry refused"))
            {
                self.states[i] = ProbeState::Standby(standby.clone());
            }
        }
        if let (true, Some(Ok(b))) = (attached, &kernel_btf) {
            self.attach_kernel_fn_trampolines(b);
        }
        drop(kernel_btf);
        tracing::debug!(backend = backend.name(), why = %why, "syscall hooks");
        self.backend = BackendChosen {
            backend,
            cause,
            why,
        };
    }

    /// What the trampolines are loaded with: the kernel's BTF, once the argument offsets the
    /// programs read are known.
    fn fentry_btf(&self) -> std::result::Result<AyaBtf, String> {
        if self.config.fentry.ready == 0 {
            return Err(format!(
                "the argument offsets (pt_regs.di/si/dx, filename.name, open_flags.open_flag, \
                 file.f_flags) are not in {}",
                btf::VMLINUX_BTF
            ));
        }
        AyaBtf::from_sys_fs().map_err(|e| format!("reading {}: {e}", btf::VMLINUX_BTF))
    }

    /// The fentry/fexit pair of each core-kernel function of `KERNEL_FNS`, in place of its kprobe
    /// pair; a pair the kernel refuses (a function without BTF, a kernel before 5.17 for the
    /// fexit's `bpf_get_func_ret`) leaves that function to its kprobes.
    fn attach_kernel_fn_trampolines(&mut self, btf: &AyaBtf) {
        for k in probes::KERNEL_FNS {
            let Some(pair) = k.trampolines else { continue };
            let specs = self.specs.clone();
            let find = |label: &str| specs.iter().position(|s| s.label == label);
            let (Some(fe), Some(fx)) = (find(pair[0].label), find(pair[1].label)) else {
                continue;
            };
            if let Err(e) = self.attach_fentry(&[fe, fx], btf) {
                let st = ProbeState::Standby(format!("fentry refused: {e}; its kprobes are used"));
                self.states[fe] = st.clone();
                self.states[fx] = st;
                for kp in k.probes {
                    if let Some(i) = find(kp.label) {
                        self.states[i] = ProbeState::Unavailable("not attached yet".into());
                    }
                }
            }
        }
    }

    /// Loads and attaches the fentry/fexit probes `which`; on the first refusal unloads
    /// them all (detaching what was attached) and returns the kernel's reason.
    fn attach_fentry(&mut self, which: &[usize], btf: &AyaBtf) -> std::result::Result<(), String> {
        if which.is_empty() {
            return Err("no fentry probes in this program set".into());
        }
        let mut done: Vec<usize> = Vec::new();
        let mut failure = None;
        for &i in which {
            let spec = self.specs[i];
            let Attach::Fentry { function, ret } = spec.attach else {
                continue;
            };
            let r: Result<()> = (|| {
                let prog = self
                    .bpf
                    .program_mut(spec.program)
                    .ok_or_else(|| anyhow!("program {} not in the object", spec.program))?;
                if ret {
                    let p: &mut FExit = prog.try_into()?;
                    p.load(function, btf)?;
                    p.attach()?;
                } else {
                    let p: &mut FEntry = prog.try_into()?;
                    p.load(function, btf)?;
                    p.attach()?;
                }
                Ok(())
            })();
            done.push(i);
            match r {
                Ok(()) => self.states[i] = ProbeState::Attached(1),
                Err(e) => {
                    failure = Some(format!(
                        "the kernel refused {} on {function}: {}",
                        spec.attach.kind(),
                        refusal(&e)
                    ));
                    break;
                }
            }
        }
        let Some(why) = failure else {
            return Ok(());
        };
        for i in done {
            let ret = matches!(self.specs[i].attach, Attach::Fentry { ret: true, .. });
            if let Some(p) = self.bpf.program_mut(self.specs[i].program) {
                // Unloading detaches the program's links too.
                let _ = if ret {
                    <&mut FExit>::try_from(p).map(|p| p.unload())
                } else {
                    <&mut FEntry>::try_from(p).map(|p| p.unload())
                };
            }
        }
        Err(why)
    }
}

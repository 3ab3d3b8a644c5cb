//! The choice of how the opens and ioctls are hooked: fentry/fexit trampolines where the
//! kernel allows them, else the syscall tracepoints (docs/probes.md#backends), and the
//! trampolines of the core-kernel functions on the fentry backend.

use anyhow::{anyhow, Result};
use aya::{
    programs::{FEntry, FExit},
    Btf as AyaBtf,
};
use aya_obj::btf::{BtfType, Func, FuncLinkage};

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

    /// What the trampolines are loaded with, once the argument offsets the programs read are
    /// known: [`trampoline_btf`] of the functions' ids in the kernel's BTF.
    fn fentry_btf(&self) -> std::result::Result<AyaBtf, String> {
        if self.config.fentry.ready == 0 {
            return Err(format!(
                "the argument offsets (pt_regs.di/si/dx, filename.name, open_flags.open_flag, \
                 file.f_flags) are not in {}",
                btf::VMLINUX_BTF
            ));
        }
        Ok(trampoline_btf(&self.trampoline_func_ids))
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

/// An aya [`AyaBtf`] with only the functions `funcs` (name, type id in the running kernel's
/// BTF), each at its id, `void` placeholders between: all that `FEntry::load` and
/// `FExit::load` read of it is a `FUNC`'s id by name, which the kernel then resolves in its
/// own BTF. aya's parse of the whole vmlinux BTF would hold some 20 MB for a moment, the
/// agent's peak memory (issue 21); this holds one small entry per id up to the last function's.
/// A function the kernel's BTF lacks is not in it (its load fails naming it).
fn trampoline_btf(funcs: &[(&'static str, u32)]) -> AyaBtf {
    let mut sorted = funcs.to_vec();
    sorted.sort_by_key(|&(_, id)| id);
    sorted.dedup_by_key(|f| f.1);
    let mut b = AyaBtf::new();
    // Id 0, `void`, is there from the start.
    let mut next = 1u32;
    for (name, id) in sorted {
        while next < id {
            next = b.add_type(BtfType::Unknown) + 1;
        }
        let name_off = b.add_string(name);
        next = b.add_type(BtfType::Func(Func::new(name_off, 0, FuncLinkage::Global))) + 1;
    }
    b
}

#[cfg(test)]
mod tests {
    use aya_obj::btf::BtfKind;

    use super::*;

    #[test]
    fn trampoline_btf_has_each_function_at_its_id() {
        let b = trampoline_btf(&[
            ("do_filp_open", 40),
            ("__x64_sys_ioctl", 7),
            ("chrdev_open", 41),
        ]);
        for (name, id) in [
            ("__x64_sys_ioctl", 7),
            ("do_filp_open", 40),
            ("chrdev_open", 41),
        ] {
            assert_eq!(
                b.id_by_type_name_kind(name, BtfKind::Func).unwrap(),
                id,
                "{name}"
            );
        }
        assert!(b.id_by_type_name_kind("vfs_read", BtfKind::Func).is_err());
    }

    /// Against this machine's kernel: the ids the agent's reader finds are the ids aya's own
    /// parse of the whole BTF gives.
    #[test]
    fn trampoline_btf_agrees_with_ayas_parse_of_the_kernel() {
        let Ok(kernel) = btf::running_kernel() else {
            eprintln!("skipped: no {}", btf::VMLINUX_BTF);
            return;
        };
        let names = [
            "__x64_sys_ioctl",
            "do_filp_open",
            "chrdev_open",
            "hmm_range_fault",
        ];
        let ids = kernel.func_ids(&names);
        assert!(ids.len() >= 3, "{ids:?}");
        let aya_btf = AyaBtf::from_sys_fs().unwrap();
        let ours = trampoline_btf(&ids);
        for (name, id) in ids {
            assert_eq!(
                aya_btf.id_by_type_name_kind(name, BtfKind::Func).unwrap(),
                id,
                "{name}"
            );
            assert_eq!(
                ours.id_by_type_name_kind(name, BtfKind::Func).unwrap(),
                id,
                "{name}"
            );
        }
    }
}

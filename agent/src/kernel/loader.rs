//! Loading the eBPF object: the programs the registry names, loaded once each, with the
//! settings maps written before anything attaches (see [`super::settings`]) and the
//! syscall backend chosen ([`super::backends`]); a program the verifier refuses leaves its
//! probes unavailable with the verdict ([`super::verifier`]), not the agent down.

use std::collections::HashMap as StdHashMap;

use anyhow::{anyhow, Context, Result};
use aya::{
    programs::{KProbe, TracePoint, UProbe},
    Ebpf, EbpfLoader,
};
use uvmwatch_common::Config;

use super::{
    kprobes::kprobes_supported,
    registry::{self as probes, Attach, Backend, BackendChosen, ProbeSpec, ProbeState},
    tracefs,
    uprobe_multi::MultiPrograms,
    verifier::short_verifier_error,
    Kernel, KernelSettings,
};

/// The eBPF object (`bpfel-unknown-none`, built by `build.rs` from `agent-ebpf`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/uvmwatch-ebpf"));

/// The size of the `PROC_GATE` map: one entry per pid up to `/proc/sys/kernel/pid_max`, at
/// most [`PROC_GATE_MAX`] (a pid past the end is looked up in `PROCS`, so a larger or later
/// raised `pid_max` costs only speed).
fn proc_gate_size() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(PROC_GATE_MAX)
        .clamp(1, PROC_GATE_MAX)
}

/// The most pids `PROC_GATE` covers: the kernel keeps 8 bytes per array element whatever
/// the value size, so 2^19 pids take 4 MiB; higher pids go to `PROCS` directly.
const PROC_GATE_MAX: u32 = 1 << 19;

/// Gives the heap's free memory back to the system: loading parses the eBPF object and
/// the kernel's BTF (several MiB, freed once loaded), which glibc would otherwise keep
/// in the agent's RSS for good.
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe { libc::malloc_trim(0) };
}

/// Whether this process can load BPF programs (effective uid 0 is the practical test; the
/// capability the agent needs for its uprobes and tracefs is `CAP_SYS_ADMIN`, measured in
/// docs/capabilities.md).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Kernel {
    /// Loads the programs and maps, writes the runtime config and the ioctl table, and
    /// attaches every tracepoint that this kernel has. Probes that cannot attach are recorded
    /// with the reason; only a failure to load the object at all is an error.
    ///
    /// # Errors
    /// Not root, no BPF in the kernel, or the object rejected as a whole.
    pub fn load(settings: &KernelSettings) -> Result<Kernel> {
        Kernel::load_probes(settings, probes::all())
    }

    /// [`Kernel::load`] with the overhead benchmark's floor reference ([`probes::floor`]) in
    /// place of the agent's probes: the same object, settings, maps and loader, the same
    /// tracepoints, each running one per-CPU counter increment. `uvmwatch bench-floor`.
    ///
    /// # Errors
    /// As [`Kernel::load`].
    pub fn load_floor(settings: &KernelSettings) -> Result<Kernel> {
        Kernel::load_probes(settings, probes::floor())
    }

    /// Loads the object and then only the programs `specs` name, and attaches them.
    fn load_probes(settings: &KernelSettings, specs: Vec<ProbeSpec>) -> Result<Kernel> {
        if !is_root() {
            return Err(anyhow!(
                "loading eBPF programs needs root (CAP_SYS_ADMIN; docs/capabilities.md); run as root"
            ));
        }
        let bpf = EbpfLoader::new()
            // No kernel BTF for the loader: the programs have no CO-RE relocations (struct
            // offsets come from `btf::file_offsets` in `Config`), and aya's parse of it
            // would be most of the agent's peak memory. The trampolines get it when loaded.
            .btf(None)
            .map_max_entries("PROC_GATE", proc_gate_size())
            .load(EBPF_OBJECT)
            .context("loading the uvmwatch eBPF object")?;
        let tracefs = match tracefs::ensure_mounted() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(error = %e, "tracepoints unavailable");
                None
            }
        };
        let mut k = Kernel {
            bpf,
            states: specs
                .iter()
                .map(|_| ProbeState::Unavailable("not attached yet".into()))
                .collect(),
            specs,
            kprobe_links: StdHashMap::new(),
            uvm_loaded: false,
            targets: StdHashMap::new(),
            multi: None,
            tracefs,
            config: Config::default(),
            backend: BackendChosen {
                backend: Backend::Tracepoint,
                cause: "flag",
                why: String::new(),
            },
            absence_facts: settings.absence_facts,
        };
        k.load_layout(settings.layout)?;
        k.load_named_cmds()?;
        k.write_config(settings)?;
        k.choose_backend(settings.backend);
        k.load_programs();
        k.load_multi_uprobes();
        k.attach_tracepoints();
        k.attach_kprobes();
        release_freed_memory();
        Ok(k)
    }

    pub(super) fn load_programs(&mut self) {
        let mut done: StdHashMap<&'static str, Result<(), String>> = StdHashMap::new();
        for (i, spec) in self.specs.iter().enumerate() {
            if matches!(spec.attach, Attach::Kprobe { .. }) && !kprobes_supported() {
                // Not even loadable where the kernel has no kprobes.
                continue;
            }
            // Trampolines are loaded for their function by `choose_backend`; the other
            // backend's probes are not loaded at all.
            if matches!(spec.attach, Attach::Fentry { .. })
                || matches!(self.states[i], ProbeState::Standby(_))
            {
                continue;
            }
            let r = done
                .entry(spec.program)
                .or_insert_with(|| {
                    load_one(&mut self.bpf, spec)
                        .map_err(|e| short_verifier_error(&format!("{e:#}")))
                })
                .clone();
            if let Err(e) = r {
                self.states[i] = ProbeState::Unavailable(format!("program rejected: {e}"));
            }
        }
    }
}

impl Kernel {
    /// Loads the uprobe programs aya loaded a second time, for multi-uprobe links, where the
    /// kernel has them ([`super::uprobe_multi`]); elsewhere, or if that fails, the libcuda
    /// files get perf-event uprobes.
    fn load_multi_uprobes(&mut self) {
        let mut names: Vec<&'static str> = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            if matches!(spec.attach, Attach::Uprobe { .. })
                && !self.program_rejected(i)
                && !names.contains(&spec.program)
            {
                names.push(spec.program);
            }
        }
        if names.is_empty() {
            return;
        }
        match MultiPrograms::load(&self.bpf, EBPF_OBJECT, &names) {
            Ok(multi) => {
                tracing::debug!(multi_uprobe_links = multi.is_some(), "libcuda uprobes");
                self.multi = multi;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "multi-uprobe links unavailable: perf-event uprobes instead");
            }
        }
    }
}

fn load_one(bpf: &mut Ebpf, spec: &ProbeSpec) -> Result<()> {
    let prog = bpf
        .program_mut(spec.program)
        .ok_or_else(|| anyhow!("program {} not in the object", spec.program))?;
    match spec.attach {
        Attach::Tracepoint { .. } => {
            let p: &mut TracePoint = prog.try_into()?;
            p.load()?;
        }
        Attach::Uprobe { .. } => {
            let p: &mut UProbe = prog.try_into()?;
            p.load()?;
        }
        Attach::Kprobe { .. } => {
            let p: &mut KProbe = prog.try_into()?;
            p.load()?;
        }
        Attach::Fentry { .. } => return Err(anyhow!("fentry programs load with their function")),
    }
    Ok(())
}

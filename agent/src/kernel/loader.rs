//! Loading the eBPF object: the programs the registry names, loaded once each, with the
//! settings maps written before anything attaches (see [`super::settings`]) and the
//! syscall backend chosen ([`super::backends`]); a program the verifier refuses leaves its
//! probes unavailable with the verdict ([`super::verifier`]), not the agent down.

use std::collections::HashMap as StdHashMap;

use anyhow::{anyhow, Context, Result};
use aya::{
    programs::{KProbe, RawTracePoint, TracePoint, UProbe},
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

/// Keeps glibc from raising its mmap threshold (it does, up to 32 MiB, after a large block
/// is freed): the start-up's large, short-lived blocks (the kernel's BTF read, the
/// trampolines' BTF, the object's relocation) then each get their own mapping, grown in
/// place (`mremap`) and unmapped when freed, instead of being copied as they grow on the heap
/// and kept there; the peak memory is what they hold, not twice that (issue 21).
fn map_large_blocks() {
    /// glibc's default threshold (`M_MMAP_THRESHOLD`, mallopt(3)), made fixed.
    const THRESHOLD: libc::c_int = 128 * 1024;
    // SAFETY: mallopt only changes the allocator's tuning.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
}

/// Gives the heap's free memory back to the system: loading parses the eBPF object and
/// the kernel's BTF (several MiB, freed once loaded), which glibc would otherwise keep
/// in the agent's RSS for good.
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe { libc::malloc_trim(0) };
}

/// Loads the object with aya's loader, without the kernel's BTF: the programs have no CO-RE
/// relocations (struct offsets come from `btf::file_offsets` in `Config`). `EbpfLoader::new`
/// parses `/sys/kernel/btf/vmlinux` all the same (aya 0.14, before `.btf(None)` can say no),
/// some 20 MB of heap for a moment: most of the agent's peak memory. So the loader runs in a
/// thread of its own whose mount namespace shows `/dev/null` there ([`hide_kernel_btf`]);
/// where that cannot be done (no `CAP_SYS_ADMIN`, no such file), it parses it.
fn load_object() -> Result<Ebpf, aya::EbpfError> {
    let load = || {
        EbpfLoader::new()
            .btf(None)
            .map_max_entries("PROC_GATE", proc_gate_size())
            .load(EBPF_OBJECT)
    };
    std::thread::scope(|s| {
        let loader = std::thread::Builder::new()
            .name("uvmwatch-load".into())
            .spawn_scoped(s, || {
                if let Err(e) = hide_kernel_btf() {
                    tracing::debug!(error = %e, "kernel BTF not hidden from the loader");
                }
                load()
            });
        match loader {
            Ok(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(_) => load(),
        }
    })
}

/// Gives the calling thread a mount namespace of its own (nothing mounted in it reaches the
/// host's) in which `/sys/kernel/btf/vmlinux` is `/dev/null`. The thread must end after its
/// use: the namespace goes with it.
fn hide_kernel_btf() -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: unshare and mount with valid NUL-terminated paths; CLONE_FS first, so that the
    // mount namespace is this thread's alone and the process's other threads keep theirs.
    unsafe {
        check(libc::unshare(libc::CLONE_FS))?;
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"/dev/null".as_ptr(),
            c"/sys/kernel/btf/vmlinux".as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ))
    }
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
        map_large_blocks();
        let bpf = load_object().context("loading the uvmwatch eBPF object")?;
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
            trampoline_func_ids: Vec::new(),
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
        let sched = k.write_config(settings)?;
        k.fit_sched_probes(sched);
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
        Attach::RawTracepoint { .. } => {
            let p: &mut RawTracePoint = prog.try_into()?;
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

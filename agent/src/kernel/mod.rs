//! Loading the kernel programs, attaching them, and reading their maps.
//!
//! The eBPF object is built from `agent-ebpf` by `agent/build.rs` and embedded in the binary.
//! [`Kernel`] owns it: programs, maps and every link. Dropping it detaches everything (aya
//! detaches links and unloads programs on drop), which is how `SIGTERM` leaves nothing behind.

use std::{
    collections::HashMap as StdHashMap,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        kprobe::KProbeLinkId,
        uprobe::{UProbeLinkId, UProbeScope},
        FEntry, FExit, KProbe, TracePoint, UProbe,
    },
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use uvmwatch_common::{
    counter, kdev_from, CmdInfo, CmdKey, Config, DevFile, DevFileKey, InflightCuinit,
    InflightIoctl, IoctlKey, LatencyHist, OpenKey, ProcState, HIST_BUCKETS,
};

pub mod btf;
pub mod kallsyms;
pub mod registry;
pub mod tracefs;

use crate::decode::layouts::Layout;
use kallsyms::Kallsyms;
use registry::{
    self as probes, Attach, Backend, BackendChoice, BackendChosen, ProbeSpec, ProbeState,
    UVM_MODULE,
};

/// The eBPF object (`bpfel-unknown-none`, built by `build.rs` from `agent-ebpf`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/uvmwatch-ebpf"));

/// Settings handed to the kernel side at load time.
#[derive(Clone, Debug)]
pub struct KernelSettings<'a> {
    /// Ioctls at least this long are sent to user space one by one (ns).
    pub slow_ioctl_ns: u64,
    /// The driver release whose params layouts statuses are read with.
    pub layout: &'a Layout,
    /// Failure records one process may send per second (0: no limit).
    pub failure_events_per_second: u32,
    /// How the syscalls are hooked ([`BackendChoice::Auto`]: fentry where allowed).
    pub backend: BackendChoice,
}

/// [`KernelSettings::failure_events_per_second`] by default: far above what a failing start
/// produces (a cuInit is a few hundred calls), far below what fills the ring buffer.
pub const FAILURE_EVENTS_PER_SECOND: u32 = 200;

/// A libcuda file with uprobes attached.
#[derive(Debug)]
pub struct LibcudaTarget {
    /// Path used to attach (host view, e.g. `/proc/<pid>/root/usr/lib/.../libcuda.so.1`).
    pub path: PathBuf,
    /// The links, by registry index of their probe.
    links: Vec<(usize, UProbeLinkId)>,
    /// The registry's uprobes not attached to this file, and why.
    missing: Vec<(usize, MissingSymbol)>,
}

/// Why a uprobe of the registry is not attached to a libcuda file.
#[derive(Clone, Debug)]
enum MissingSymbol {
    /// The file does not export the symbol (an older or newer driver).
    NotExported,
    /// The kernel refused the probe.
    Refused(String),
}

/// The loaded kernel side.
pub struct Kernel {
    bpf: Ebpf,
    /// Every probe loaded ([`probes::all`], or [`probes::floor`] for the benchmark's floor);
    /// `states` is indexed the same way.
    specs: Vec<ProbeSpec>,
    states: Vec<ProbeState>,
    /// Kprobe links by registry index.
    kprobe_links: StdHashMap<usize, KProbeLinkId>,
    /// Whether `nvidia_uvm` was loaded at the last check.
    uvm_loaded: bool,
    targets: StdHashMap<(u64, u64), LibcudaTarget>,
    /// Where tracefs is, when it is.
    pub tracefs: Option<PathBuf>,
    /// What `CONFIG` holds (rewritten when `nvidia-uvm`'s major changes).
    config: Config,
    /// The backend the syscalls are hooked with, and why.
    backend: BackendChosen,
}

/// `nvidia-uvm`'s character major as `/proc/devices` lists it now (`None` while it is not
/// registered, or when the file cannot be read).
pub fn uvm_major() -> Option<u32> {
    let text = std::fs::read_to_string(crate::doctor::collect::modules::DEVICES_PATH).ok()?;
    crate::doctor::collect::modules::parse_devices(&text)
        .ok()?
        .get("nvidia-uvm")
        .copied()
}

/// The `CMDS` entries of `layout`: every command with a status, UVM by request number, RM by
/// [`uvmwatch_common::rm_cmd_key`] of its `_IOWR('F', nr, size)`.
fn status_entries(layout: &Layout) -> Vec<(CmdKey, CmdInfo)> {
    let uvm = layout.uvm().filter_map(|e| {
        let status_offset = e.status_offset?;
        let key = CmdKey { uvm: 1, cmd: e.cmd };
        Some((
            key,
            CmdInfo {
                status_offset,
                params_size: e.params_size,
            },
        ))
    });
    let rm = layout.rm().filter_map(|e| {
        let status_offset = e.status_offset?;
        let key = CmdKey {
            uvm: 0,
            cmd: uvmwatch_common::rm_cmd_key(e.request()),
        };
        Some((
            key,
            CmdInfo {
                status_offset,
                params_size: e.params_size,
            },
        ))
    });
    uvm.chain(rm).collect()
}

/// Whether this process can load BPF programs (effective uid 0 is the practical test; the
/// capability the agent needs for its uprobes and tracefs is `CAP_SYS_ADMIN`, measured in
/// docs/capabilities.md).
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

/// Opens `pid`'s entry of `PROC_GATE` (only the kernel closes one, at the process's exit);
/// a pid past its end needs none.
fn open_gate(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut gate: Array<&mut MapData, u8> =
        Array::try_from(bpf.map_mut("PROC_GATE").context("map PROC_GATE")?)?;
    if pid < gate.len() {
        gate.set(pid, 1, 0)?;
    }
    Ok(())
}

/// Gives the heap's free memory back to the system: loading parses the eBPF object and
/// the kernel's BTF (several MiB, freed once loaded), which glibc would otherwise keep
/// in the agent's RSS for good.
pub fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe { libc::malloc_trim(0) };
}

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

    /// Hits of the floor reference's program, summed over CPUs.
    ///
    /// # Errors
    /// The map cannot be read.
    pub fn floor_hits(&self) -> Result<u64> {
        let m: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.bpf.map("FLOOR_HITS").context("map FLOOR_HITS")?)?;
        Ok(m.get(&0, 0)?.iter().sum())
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
            tracefs,
            config: Config::default(),
            backend: BackendChosen {
                backend: Backend::Tracepoint,
                cause: "flag",
                why: String::new(),
            },
        };
        k.load_layout(settings.layout)?;
        k.load_named_cmds()?;
        k.write_config(settings)?;
        k.choose_backend(settings.backend);
        k.load_programs();
        k.attach_tracepoints();
        k.attach_kprobes();
        release_freed_memory();
        Ok(k)
    }

    /// Fills `NAMED_CMDS` with every request user space names (in any known driver), so the
    /// aggregates keep the others under one key ([`uvmwatch_common::UNKNOWN_CMD`]).
    fn load_named_cmds(&mut self) -> Result<()> {
        let mut named: HashMap<&mut MapData, CmdKey, u8> =
            HashMap::try_from(self.bpf.map_mut("NAMED_CMDS").context("map NAMED_CMDS")?)?;
        for (uvm, cmd) in crate::decode::nvidia::named_requests() {
            let key = CmdKey {
                uvm: uvm as u32,
                cmd,
            };
            named
                .insert(key, 1, 0)
                .with_context(|| format!("NAMED_CMDS[{cmd:#x}]"))?;
        }
        Ok(())
    }

    /// Replaces the status locations in `CMDS` by `layout`'s: UVM commands by request
    /// number, RM escapes by `_IOC_NR` and `_IOC_SIZE` of each params form
    /// ([`uvmwatch_common::rm_cmd_key`]). Entries of the old layout that the new one lacks
    /// are removed, so a command gone from a driver reads no status.
    pub fn load_layout(&mut self, layout: &Layout) -> Result<()> {
        let mut cmds: HashMap<&mut MapData, CmdKey, CmdInfo> =
            HashMap::try_from(self.bpf.map_mut("CMDS").context("map CMDS")?)?;
        let entries = status_entries(layout);
        // New entries first, then the stale ones out: no command loses its status between.
        for (k, v) in &entries {
            cmds.insert(k, v, 0)?;
        }
        let stale: Vec<CmdKey> = cmds
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !entries.iter().any(|(e, _)| e == k))
            .collect();
        for k in stale {
            cmds.remove(&k)?;
        }
        tracing::debug!(layout = %layout, commit = layout.commit(), "ioctl status table loaded");
        Ok(())
    }

    fn write_config(&mut self, s: &KernelSettings) -> Result<()> {
        let (fork_off, exit_off) = match &self.tracefs {
            Some(t) => (
                tracefs::field_offset(t, "sched", "sched_process_fork", "child_pid")
                    .ok()
                    .flatten(),
                tracefs::field_offset(t, "sched", "sched_process_exit", "group_dead")
                    .ok()
                    .flatten(),
            ),
            None => (None, None),
        };
        let btf = btf::running_kernel();
        let files = match btf
            .as_ref()
            .map_err(|e| anyhow!("{e:#}"))
            .and_then(btf::file_offsets)
        {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "no struct offsets from the kernel's BTF: successful device opens and driver calls cannot be identified (failed opens and cuInit still are)");
                Default::default()
            }
        };
        // Missing, these only keep the fentry backend off (`choose_backend` says why).
        let fentry = btf
            .as_ref()
            .ok()
            .and_then(|b| btf::fentry_offsets(b).ok())
            .unwrap_or_default();
        let cfg = Config {
            slow_ioctl_ns: s.slow_ioctl_ns,
            agent_tgid: std::process::id(),
            fork_child_pid_off: fork_off.unwrap_or(44),
            exit_group_dead_off: exit_off.unwrap_or(0),
            ready: 1,
            failure_events_per_second: s.failure_events_per_second,
            uvm_major: uvm_major().unwrap_or(0),
            _pad: 0,
            files,
            fentry,
        };
        if fork_off.is_none() {
            tracing::warn!("sched_process_fork format not readable; assuming child_pid at 44");
        }
        self.set_config(cfg)
    }

    fn set_config(&mut self, cfg: Config) -> Result<()> {
        let mut a: Array<&mut MapData, Config> =
            Array::try_from(self.bpf.map_mut("CONFIG").context("map CONFIG")?)?;
        a.set(0, cfg, 0)?;
        self.config = cfg;
        Ok(())
    }

    /// Re-reads `nvidia-uvm`'s major from `/proc/devices` and hands it to the programs when
    /// it changed (a module reload may register another one). Returns the new major then.
    pub fn refresh_uvm_major(&mut self) -> Option<u32> {
        let major = uvm_major().unwrap_or(0);
        if major == self.config.uvm_major {
            return None;
        }
        let cfg = Config {
            uvm_major: major,
            ..self.config
        };
        match self.set_config(cfg) {
            Ok(()) => Some(major),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "writing nvidia-uvm's major to CONFIG");
                None
            }
        }
    }

    /// Picks the backend the syscalls are hooked with: on `auto` or `fentry`, loads and
    /// attaches every fentry/fexit probe of the syscalls; if the kernel refuses one, detaches
    /// them all and (on `auto`) falls back to the tracepoints, keeping the kernel's reason.
    /// On the fentry backend the core-kernel functions of `KFUNCS` get their trampolines too,
    /// each pair falling back to its kprobes alone when refused. The probes of the backend
    /// not used are put on standby, each saying why.
    fn choose_backend(&mut self, choice: BackendChoice) {
        let fentry: Vec<usize> = (0..self.specs.len())
            .filter(|&i| {
                matches!(self.specs[i].attach, Attach::Fentry { .. })
                    && !probes::is_kfunc_trampoline(&self.specs[i])
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
            self.attach_kfunc_trampolines(b);
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

    /// The fentry/fexit pair of each core-kernel function of `KFUNCS`, in place of its kprobe
    /// pair; a pair the kernel refuses (a function without BTF, a kernel before 5.17 for the
    /// fexit's `bpf_get_func_ret`) leaves that function to its kprobes.
    fn attach_kfunc_trampolines(&mut self, btf: &AyaBtf) {
        for k in probes::KFUNCS {
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

    /// The backend the syscalls are hooked with, and why it was chosen.
    pub fn backend(&self) -> &BackendChosen {
        &self.backend
    }

    fn load_programs(&mut self) {
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

    fn attach_tracepoints(&mut self) {
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

    /// Probe table with the current state of each probe.
    pub fn probe_states(&self) -> Vec<(ProbeSpec, ProbeState)> {
        self.specs
            .iter()
            .copied()
            .zip(self.states.iter().cloned())
            .collect()
    }

    /// Attaches every kprobe whose target is present now: core-kernel functions once,
    /// module functions whenever their module is loaded. Records why the others are off.
    fn attach_kprobes(&mut self) {
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
        let syms = match Kallsyms::read(Path::new("/proc/kallsyms")) {
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
                let facts = absence.get_or_insert_with(absence_facts);
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

    /// Kernel-function latency histograms summed over CPUs, by `kfunc` id (all ids).
    pub fn kfunc_hist(&self) -> Result<Vec<LatencyHist>> {
        self.hists_by_id("KF_HIST", uvmwatch_common::kfunc::COUNT)
    }

    /// The histograms of the per-CPU array `map` (indexed by id, `count` ids), each summed
    /// over CPUs.
    fn hists_by_id(&self, map: &str, count: u32) -> Result<Vec<LatencyHist>> {
        let m: PerCpuArray<&MapData, LatencyHist> =
            PerCpuArray::try_from(self.bpf.map(map).with_context(|| format!("map {map}"))?)?;
        let mut out = Vec::new();
        for i in 0..count {
            let mut sum = LatencyHist::default();
            for h in m.get(&i, 0)?.iter() {
                for b in 0..HIST_BUCKETS {
                    sum.buckets[b] += h.buckets[b];
                }
                sum.sum_ns += h.sum_ns;
                sum.count += h.count;
            }
            out.push(sum);
        }
        Ok(out)
    }

    /// Kernel-function result counters summed over CPUs.
    pub fn kfunc_results(&self) -> Result<Vec<(uvmwatch_common::KfResultKey, u64)>> {
        sum_percpu(self.bpf.map("KF_RESULTS").context("map KF_RESULTS")?)
    }

    /// CUDA context and device call latency histograms summed over CPUs, by
    /// `uvmwatch_common::ctxcall` id (all ids).
    pub fn ctx_hist(&self) -> Result<Vec<LatencyHist>> {
        self.hists_by_id("CTX_HIST", uvmwatch_common::ctxcall::COUNT)
    }

    /// CUDA context and device call result counters summed over CPUs.
    pub fn ctx_results(&self) -> Result<Vec<(uvmwatch_common::CtxResultKey, u64)>> {
        sum_percpu(self.bpf.map("CTX_RESULTS").context("map CTX_RESULTS")?)
    }

    /// Whether the kretprobe of function `id` is attached now.
    pub fn kfunc_attached(&self, id: u32) -> bool {
        let name = probes::kfunc_name(id);
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

    /// Whether the uretprobe of context or device call `id` (`uvmwatch_common::ctxcall`) is
    /// attached to at least one libcuda now.
    pub fn ctx_attached(&self, id: u32) -> bool {
        let symbol = uvmwatch_common::ctxcall::name(id);
        self.specs.iter().enumerate().any(|(i, s)| {
            matches!(s.attach, Attach::Uprobe { ret: true, symbol: sy } if sy == symbol)
                && matches!(self.states[i], ProbeState::Attached(_))
        })
    }

    /// Attaches the uprobes of the registry to `path` (a file already known to be new by
    /// device and inode): the `cuInit` pair, which the file must export, and the pairs of
    /// the context and device calls it exports. A call the file does not export (another
    /// driver version), or whose probes the kernel refuses, is left out; the probe's state
    /// says why.
    ///
    /// # Errors
    /// The file is not an ELF exporting `cuInit`, or the kernel refuses its probes.
    pub fn attach_libcuda(&mut self, path: &Path, dev: u64, ino: u64) -> Result<()> {
        if self.targets.contains_key(&(dev, ino)) {
            return Ok(());
        }
        let wanted: Vec<&'static str> = self.uprobe_symbols();
        let defined = defined_symbols(path, &wanted)?;
        if !defined.contains(&probes::LIBCUDA_REQUIRED_SYMBOL) {
            return Err(anyhow!(
                "{} does not define {}",
                path.display(),
                probes::LIBCUDA_REQUIRED_SYMBOL
            ));
        }
        let mut t = LibcudaTarget {
            path: path.to_path_buf(),
            links: Vec::new(),
            missing: Vec::new(),
        };
        for symbol in wanted {
            let pair: Vec<usize> = (0..self.specs.len())
                .filter(|&i| {
                    matches!(self.specs[i].attach, Attach::Uprobe { symbol: s, .. } if s == symbol)
                })
                .collect();
            if pair.iter().any(|&i| self.program_rejected(i)) {
                continue; // its state says so already
            }
            if !defined.contains(&symbol) {
                t.missing
                    .extend(pair.iter().map(|&i| (i, MissingSymbol::NotExported)));
                continue;
            }
            match self.attach_pair(&pair, symbol, path) {
                Ok(links) => t.links.extend(links),
                Err(e) if symbol == probes::LIBCUDA_REQUIRED_SYMBOL => {
                    self.detach_links(t.links);
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(library = %path.display(), symbol, error = %format!("{e:#}"), "uprobe not attached");
                    let why = format!("{e:#}");
                    t.missing.extend(
                        pair.iter()
                            .map(|&i| (i, MissingSymbol::Refused(why.clone()))),
                    );
                }
            }
        }
        self.targets.insert((dev, ino), t);
        // From now on a process that opens this file needs no late cuInit to be seen.
        if let Err(e) = self.mark_probed(dev, ino, true) {
            tracing::warn!(library = %path.display(), error = %format!("{e:#}"), "LIBCUDA_PROBED not updated");
        }
        self.refresh_uprobe_states();
        Ok(())
    }

    /// Adds (or removes) a libcuda file, by `stat`'s device and inode, to `LIBCUDA_PROBED`.
    fn mark_probed(&mut self, dev: u64, ino: u64, probed: bool) -> Result<()> {
        let mut m: HashMap<&mut MapData, DevFileKey, u8> = HashMap::try_from(
            self.bpf
                .map_mut("LIBCUDA_PROBED")
                .context("map LIBCUDA_PROBED")?,
        )?;
        let key = DevFileKey {
            dev: kdev_from(libc::major(dev), libc::minor(dev)),
            _pad: 0,
            ino,
        };
        if probed {
            m.insert(key, 1, 0)?;
        } else {
            let _ = m.remove(&key);
        }
        Ok(())
    }

    /// The symbols the registry's uprobes attach to, each once, in registry order.
    fn uprobe_symbols(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for s in &self.specs {
            if let Attach::Uprobe { symbol, .. } = s.attach {
                if !out.contains(&symbol) {
                    out.push(symbol);
                }
            }
        }
        out
    }

    fn program_rejected(&self, i: usize) -> bool {
        matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("program rejected"))
    }

    /// Attaches the probes `pair` (registry indexes) to `symbol` in `path`: all or none.
    fn attach_pair(
        &mut self,
        pair: &[usize],
        symbol: &str,
        path: &Path,
    ) -> Result<Vec<(usize, UProbeLinkId)>> {
        let mut links = Vec::new();
        for &i in pair {
            let program = self.specs[i].program;
            match self.attach_uprobe(program, symbol, path) {
                Ok(l) => links.push((i, l)),
                Err(e) => {
                    self.detach_links(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    fn attach_uprobe(&mut self, program: &str, symbol: &str, path: &Path) -> Result<UProbeLinkId> {
        let p: &mut UProbe = self
            .bpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("program {program} missing"))?
            .try_into()?;
        p.attach(symbol, path, UProbeScope::AllProcesses)
            .with_context(|| format!("attaching {program} to {symbol} in {}", path.display()))
    }

    /// Detaches uprobe links (registry index, link); errors are ignored (the link is gone).
    /// Each detach waits for an RCU tasks-trace grace period in the kernel
    /// (`uprobe_unregister_sync`, under a lock: detaches cannot overlap).
    fn detach_links(&mut self, links: Vec<(usize, UProbeLinkId)>) {
        for (i, link) in links {
            let program = self.specs[i].program;
            if let Some(p) = self.bpf.program_mut(program) {
                if let Ok(p) = <&mut UProbe>::try_from(p) {
                    let _ = p.detach(link);
                }
            }
        }
    }

    /// Detaches the probes from one libcuda file (e.g. when it was deleted).
    pub fn detach_libcuda(&mut self, dev: u64, ino: u64) -> Result<()> {
        let Some(t) = self.targets.remove(&(dev, ino)) else {
            return Ok(());
        };
        self.mark_probed(dev, ino, false)?;
        self.detach_links(t.links);
        self.refresh_uprobe_states();
        Ok(())
    }

    /// Each uprobe's state from the files probed: attached to how many, else why not
    /// (waiting for a first libcuda, or not exported by any of them).
    fn refresh_uprobe_states(&mut self) {
        let n = self.targets.len();
        for i in 0..self.specs.len() {
            let Attach::Uprobe { symbol, .. } = self.specs[i].attach else {
                continue;
            };
            if self.program_rejected(i) {
                continue;
            }
            let attached = self
                .targets
                .values()
                .filter(|t| t.links.iter().any(|(j, _)| *j == i))
                .count();
            let refused = self.targets.values().find_map(|t| {
                t.missing.iter().find_map(|(j, m)| match m {
                    MissingSymbol::Refused(why) if *j == i => Some(why.clone()),
                    _ => None,
                })
            });
            self.states[i] = if attached > 0 {
                ProbeState::Attached(attached)
            } else if n == 0 {
                ProbeState::Waiting("no libcuda found yet".into())
            } else if let Some(why) = refused {
                ProbeState::Unavailable(why)
            } else if n == 1 {
                ProbeState::Unavailable(format!(
                    "{symbol} not exported by the libcuda probed (another driver version)"
                ))
            } else {
                ProbeState::Unavailable(format!(
                    "{symbol} not exported by any of the {n} libcuda files probed (another driver version)"
                ))
            };
        }
    }

    /// Number of libcuda files with probes attached.
    pub fn libcuda_targets(&self) -> usize {
        self.targets.len()
    }

    /// Paths of the libcuda files with probes attached.
    pub fn libcuda_paths(&self) -> Vec<PathBuf> {
        self.targets.values().map(|t| t.path.clone()).collect()
    }

    /// Takes the ring buffer out (once) for the event reader.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let m = self.bpf.take_map("EVENTS").context("map EVENTS")?;
        Ok(RingBuf::try_from(m)?)
    }

    /// `cuInit` calls in flight: (tid, entry).
    pub fn inflight_cuinit(&self) -> Result<Vec<(u32, InflightCuinit)>> {
        let m: HashMap<&MapData, u32, InflightCuinit> =
            HashMap::try_from(self.bpf.map("INFLIGHT_CUINIT").context("map")?)?;
        Ok(m.iter().filter_map(|r| r.ok()).collect())
    }

    /// Driver ioctls in flight: (tid, entry).
    pub fn inflight_ioctls(&self) -> Result<Vec<(u32, InflightIoctl)>> {
        let m: HashMap<&MapData, u32, InflightIoctl> =
            HashMap::try_from(self.bpf.map("INFLIGHT_IOCTL").context("map")?)?;
        Ok(m.iter().filter_map(|r| r.ok()).collect())
    }

    /// Records a driver call already in progress on thread `tid` (seen in `/proc` at start).
    ///
    /// # Errors
    /// The map update fails.
    pub fn seed_inflight_ioctl(&mut self, tid: u32, e: InflightIoctl) -> Result<()> {
        // Its exit is looked for only behind an open gate.
        open_gate(&mut self.bpf, e.tgid)?;
        let mut m: HashMap<&mut MapData, u32, InflightIoctl> =
            HashMap::try_from(self.bpf.map_mut("INFLIGHT_IOCTL").context("map")?)?;
        m.insert(tid, e, 0)?;
        Ok(())
    }

    /// Removes in-flight entries of a thread that no longer exists.
    /// Takes the thread's late `cuInit` out of `INFLIGHT_CUINIT` (user space found it
    /// quiet); `false` when the thread has none.
    pub fn end_late_cuinit(&mut self, tid: u32) -> bool {
        let Some(m) = self.bpf.map_mut("INFLIGHT_CUINIT") else {
            return false;
        };
        let Ok(mut h) = HashMap::<_, u32, InflightCuinit>::try_from(m) else {
            return false;
        };
        match h.get(&tid, 0) {
            Ok(c) if c.late != 0 => h.remove(&tid).is_ok(),
            _ => false,
        }
    }

    pub fn forget_thread(&mut self, tid: u32) {
        for name in ["INFLIGHT_CUINIT", "INFLIGHT_IOCTL"] {
            if let Some(m) = self.bpf.map_mut(name) {
                if name == "INFLIGHT_CUINIT" {
                    if let Ok(mut h) = HashMap::<_, u32, InflightCuinit>::try_from(m) {
                        let _ = h.remove(&tid);
                    }
                } else if let Ok(mut h) = HashMap::<_, u32, InflightIoctl>::try_from(m) {
                    let _ = h.remove(&tid);
                }
            }
        }
    }

    /// Latency histograms summed over CPUs.
    pub fn ioctl_hist(&self) -> Result<Vec<(IoctlKey, LatencyHist)>> {
        let m: PerCpuHashMap<&MapData, IoctlKey, LatencyHist> =
            PerCpuHashMap::try_from(self.bpf.map("IOCTL_HIST").context("map")?)?;
        let mut out = Vec::new();
        for r in m.iter() {
            let (k, per_cpu) = r?;
            let mut sum = LatencyHist::default();
            for h in per_cpu.iter() {
                for b in 0..HIST_BUCKETS {
                    sum.buckets[b] += h.buckets[b];
                }
                sum.sum_ns += h.sum_ns;
                sum.count += h.count;
            }
            out.push((k, sum));
        }
        Ok(out)
    }

    /// Result counters summed over CPUs.
    pub fn ioctl_results(&self) -> Result<Vec<(IoctlKey, u64)>> {
        sum_percpu(self.bpf.map("IOCTL_RESULTS").context("map")?)
    }

    /// Device open counters summed over CPUs.
    pub fn opens(&self) -> Result<Vec<(OpenKey, u64)>> {
        sum_percpu(self.bpf.map("OPENS").context("map")?)
    }

    /// Kernel-side counters (index [`counter`]) summed over CPUs.
    pub fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        let m: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.bpf.map("COUNTERS").context("map")?)?;
        let mut out = [0u64; counter::COUNT as usize];
        for (i, o) in out.iter_mut().enumerate() {
            *o = m.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(out)
    }

    /// Puts a process found holding an NVIDIA fd at start (from `/proc/<pid>/fd`) in
    /// `PROCS`, so its ioctls are looked at (their files identify them).
    pub fn seed_proc(&mut self, tgid: u32) -> Result<()> {
        open_gate(&mut self.bpf, tgid)?;
        let mut procs: HashMap<&mut MapData, u32, ProcState> =
            HashMap::try_from(self.bpf.map_mut("PROCS").context("map")?)?;
        if procs.get(&tgid, 0).is_err() {
            let p = ProcState {
                since_ns: crate::clock::monotonic_ns(),
                ..ProcState::default()
            };
            procs.insert(tgid, p, 0)?;
        }
        Ok(())
    }

    /// Records a file that is not a character device but sits at a `/dev/nvidia*` name, open
    /// before the agent started, in `DEVFILES`: `dev` is `stat`'s `st_dev` (converted to the
    /// kernel-internal `dev_t` the programs read from `super_block.s_dev`).
    pub fn seed_dev_file(&mut self, dev: u64, ino: u64, node: u8, minor: u8) -> Result<()> {
        // aya's HashMap also opens LRU hash maps.
        let mut m: HashMap<&mut MapData, DevFileKey, DevFile> =
            HashMap::try_from(self.bpf.map_mut("DEVFILES").context("map DEVFILES")?)?;
        let key = DevFileKey {
            dev: kdev_from(libc::major(dev), libc::minor(dev)),
            _pad: 0,
            ino,
        };
        let v = DevFile {
            node,
            minor,
            _pad: [0; 6],
        };
        m.insert(key, v, 0)?;
        Ok(())
    }

    /// Removes the `PROCS` entries of processes that are gone (a missed exit: the agent was
    /// not running, or the map was read between a pid's reuse). `alive(tgid)` says whether a
    /// tgid exists. Returns the number of entries removed.
    pub fn sweep(&mut self, alive: impl Fn(u32) -> bool) -> Result<usize> {
        let mut procs: HashMap<&mut MapData, u32, ProcState> =
            HashMap::try_from(self.bpf.map_mut("PROCS").context("map")?)?;
        let all: Vec<u32> = procs.keys().filter_map(|r| r.ok()).collect();
        let mut gone = Vec::new();
        for t in all {
            if !alive(t) && procs.remove(&t).is_ok() {
                gone.push(t);
            }
        }
        // Their gates stay open: closing one here could race a new process given the same
        // pid opening a node meanwhile (it would be missed); an open gate without a `PROCS`
        // entry costs only the hash lookup behind it.
        Ok(gone.len())
    }

    /// Number of processes in `PROCS`, whose ioctls the kernel side looks at (for
    /// self-monitoring).
    pub fn tracked_processes(&self) -> usize {
        self.bpf
            .map("PROCS")
            .and_then(|m| HashMap::<_, u32, ProcState>::try_from(m).ok())
            .map(|h| h.keys().count())
            .unwrap_or(0)
    }
}

fn sum_percpu<K: aya::Pod + Eq + std::hash::Hash>(m: &aya::maps::Map) -> Result<Vec<(K, u64)>> {
    let h: PerCpuHashMap<&MapData, K, u64> = PerCpuHashMap::try_from(m)?;
    let mut out = Vec::new();
    for r in h.iter() {
        let (k, v) = r?;
        out.push((k, v.iter().sum()));
    }
    Ok(out)
}

/// The first line of a load error and the verifier's verdict, not the whole instruction
/// log: the verdict is the last line before the statistics (`processed … insns`,
/// `verification time`, `stack depth`), e.g. `R4 unbounded memory access`.
fn short_verifier_error(e: &str) -> String {
    let lines: Vec<&str> = e.lines().collect();
    if lines.len() <= 4 {
        return e.to_string();
    }
    let first = lines[0]
        .split(". Verifier output")
        .next()
        .unwrap_or(lines[0]);
    let is_stat = |l: &str| {
        let l = l.trim();
        l.is_empty()
            || l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
            || l.starts_with("max_states_per_insn")
            || l.starts_with(':')
    };
    let verdict = lines
        .iter()
        .rev()
        .find(|l| !is_stat(l))
        .copied()
        .unwrap_or("");
    let stats: Vec<&str> = lines
        .iter()
        .filter(|l| l.trim().starts_with("processed "))
        .copied()
        .collect();
    format!("{first}: {} [{}]", verdict.trim(), stats.join(" "))
}

/// What the kernel said refusing a program: the errno by name and, when the verifier ran,
/// its verdict ([`short_verifier_error`]); an empty verifier log means the program was
/// refused before verification (a permission: lockdown, an LSM, a sysctl).
fn refusal(e: &anyhow::Error) -> String {
    if let Some(aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    }) = e.downcast_ref::<aya::programs::ProgramError>()
    {
        let errno = io_error
            .raw_os_error()
            .map(|n| crate::decode::errno::label(n as u32))
            .unwrap_or_else(|| "an error".into());
        let log = verifier_log.to_string();
        let log = log.trim();
        if log.is_empty() {
            return format!(
                "BPF_PROG_LOAD failed with {errno} ({}) before verification, no verifier log",
                io_error.kind()
            );
        }
        return format!(
            "BPF_PROG_LOAD failed with {errno}: {}",
            short_verifier_error(&format!("x\n{log}"))
                .trim_start_matches("x: ")
                .trim_start_matches("x\n")
        );
    }
    short_verifier_error(&format!("{e:#}"))
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

/// The host's facts for [`registry::absence_reason`]: `CONFIG_DEVICE_PRIVATE` from the
/// kernel's configuration, the driver's version from `/proc/driver/nvidia/version`.
fn absence_facts() -> registry::AbsenceFacts {
    let root = crate::doctor::root::Root::live(None);
    let config = crate::doctor::collect::kernel::kernel_config_of(&root);
    let driver = crate::host::driver::read_version_file(None)
        .ok()
        .map(|d| d.version);
    match config.value {
        Ok(c) => registry::AbsenceFacts {
            device_private: Some(c.get("CONFIG_DEVICE_PRIVATE").is_some_and(|v| v == "y")),
            config_source: config.source,
            driver,
        },
        Err(why) => registry::AbsenceFacts {
            device_private: None,
            config_source: why.why,
            driver,
        },
    }
}

/// Whether the kernel offers kprobes (the `kprobe` perf PMU, `CONFIG_KPROBES`).
pub fn kprobes_supported() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

/// Checks that `path` is an ELF shared object whose dynamic symbol table defines `cuInit`.
///
/// # Errors
/// Unreadable file, not an ELF, or no `cuInit` (e.g. a stub or an unrelated library).
pub fn check_exports_cuinit(path: &Path) -> Result<()> {
    let found = defined_symbols(path, &[probes::LIBCUDA_REQUIRED_SYMBOL])?;
    if found.is_empty() {
        return Err(anyhow!(
            "{} does not define {}",
            path.display(),
            probes::LIBCUDA_REQUIRED_SYMBOL
        ));
    }
    Ok(())
}

/// Which of `names` the ELF shared object `path` defines (in its dynamic or static symbol
/// table), in the order of `names`.
///
/// # Errors
/// Unreadable file, or not an ELF.
pub fn defined_symbols(path: &Path, names: &[&'static str]) -> Result<Vec<&'static str>> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF object", path.display()))?;
    let defined: std::collections::HashSet<&str> = file
        .dynamic_symbols()
        .chain(file.symbols())
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok())
        .collect();
    Ok(names
        .iter()
        .copied()
        .filter(|n| defined.contains(n))
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn verifier_errors_keep_the_verdict() {
        let log = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: 0: R1=ctx()\n\
1: (bf) r6 = r1\n\
57: (71) r1 = *(u8 *)(r4 +0)\n\
R4 unbounded memory access, make sure to bounds check any such access\n\
processed 412 insns (limit 1000000) max_states_per_insn 2 total_states 30\n\
verification time 1234 usec\n\
stack depth 184+0\n";
        let s = super::short_verifier_error(log);
        assert!(
            s.starts_with("the BPF_PROG_LOAD syscall returned Permission denied"),
            "{s}"
        );
        assert!(s.contains("R4 unbounded memory access"), "{s}");
        assert!(s.contains("processed 412 insns"), "{s}");
        assert!(!s.contains("(bf) r6"), "{s}");
    }
}

//! The kernel side: the eBPF programs of `agent-ebpf`, loaded, attached and read.
//!
//! The object is built from `agent-ebpf` by `agent/build.rs` and embedded in the binary.
//! [`Kernel`] owns it: programs, maps and every link. Dropping it detaches everything (aya
//! detaches links and unloads programs on drop), which is how `SIGTERM` leaves nothing behind.
//!
//! One file per concept, in the order a start goes through them:
//! - [`loader`]: the object and its programs, loaded once each;
//! - [`settings`]: the maps user space writes before anything attaches (`CONFIG`, `CMDS`);
//! - [`backends`]: fentry/fexit where the kernel allows trampolines, else the tracepoints;
//! - [`tracepoints`], [`kprobes`] (with the watch on `nvidia_uvm`), [`uprobes`] (libcuda
//!   files, with [`uprobe_multi`]'s links where the kernel has them): one attach kind each;
//! - [`maps`]: what the programs hand back (the ring buffer, calls in flight, aggregates,
//!   counters) and the few entries user space seeds or removes;
//! - [`verifier`]: the kernel's refusals, shortened for a probe's state;
//! - [`features`]: what the attached probes let the agent see, feature by feature;
//! - [`registry`] (every probe: what, where, why), [`btf`], [`kallsyms`], [`tracefs`]:
//!   what the rest reads of the running kernel.

use std::{collections::HashMap as StdHashMap, path::PathBuf};

use aya::{programs::kprobe::KProbeLinkId, Ebpf};
use uvmwatch_common::Config;

mod backends;
pub mod btf;
pub mod features;
pub mod kallsyms;
mod kprobes;
mod loader;
mod maps;
pub mod registry;
mod settings;
pub mod tracefs;
mod tracepoints;
mod uprobe_multi;
mod uprobes;
mod verifier;

pub use kprobes::kprobes_supported;
pub use loader::is_root;
pub use settings::uvm_major;

use crate::decode::layouts::Layout;
use registry::{AbsenceFacts, BackendChoice, BackendChosen, ProbeSpec, ProbeState};
use uprobes::LibcudaTarget;

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
    /// Reads the host's facts that say why a probed function is absent, when one is
    /// ([`registry::absence_reason`]; the observer's reads them with the doctor's readers).
    pub absence_facts: fn() -> AbsenceFacts,
}

/// [`KernelSettings::failure_events_per_second`] by default: far above what a failing start
/// produces (a cuInit is a few hundred calls), far below what fills the ring buffer.
pub const FAILURE_EVENTS_PER_SECOND: u32 = 200;

/// The loaded kernel side.
pub struct Kernel {
    bpf: Ebpf,
    /// Every probe loaded ([`registry::all`], or [`registry::floor`] for the benchmark's floor);
    /// `states` is indexed the same way.
    specs: Vec<ProbeSpec>,
    states: Vec<ProbeState>,
    /// Kprobe links by registry index.
    kprobe_links: StdHashMap<usize, KProbeLinkId>,
    /// Whether `nvidia_uvm` was loaded at the last check.
    uvm_loaded: bool,
    targets: StdHashMap<(u64, u64), LibcudaTarget>,
    /// The running kernel's BTF type ids of the functions the trampolines attach to (read
    /// with the struct offsets, [`settings`]).
    trampoline_func_ids: Vec<(&'static str, u32)>,
    /// The uprobe programs loaded for multi-uprobe links, where the kernel has them.
    multi: Option<uprobe_multi::MultiPrograms>,
    /// Where tracefs is, when it is.
    pub tracefs: Option<PathBuf>,
    /// What `CONFIG` holds (rewritten when `nvidia-uvm`'s major changes).
    config: Config,
    /// The backend the syscalls are hooked with, and why.
    backend: BackendChosen,
    /// [`KernelSettings::absence_facts`].
    absence_facts: fn() -> AbsenceFacts,
}

impl Drop for Kernel {
    /// Detaches the libcuda files' uprobes several at once (the rest, one link per probe, goes
    /// with `bpf`): a stop within a second however many files are probed, where the kernel
    /// lets detaches overlap ([`uprobe_multi`]).
    fn drop(&mut self) {
        self.detach_all_libcudas();
    }
}

impl Kernel {
    /// Probe table with the current state of each probe.
    pub fn probe_states(&self) -> Vec<(ProbeSpec, ProbeState)> {
        self.specs
            .iter()
            .copied()
            .zip(self.states.iter().cloned())
            .collect()
    }

    /// The backend the syscalls are hooked with, and why it was chosen.
    pub fn backend(&self) -> &BackendChosen {
        &self.backend
    }
}

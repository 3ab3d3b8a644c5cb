//! What the observer needs of the kernel side: the in-flight maps it scans, the probe table, the
//! loss counters, and the few writes it makes (probes for a new libcuda, processes, files and calls
//! learned at start, entries of threads that are gone). [`Kernel`] is it; the observer's tests put
//! a stand-in in its place, so its handlers run without root.

use std::path::Path;

use anyhow::Result;
use uvmwatch_common::{counter, InflightCuinit, InflightIoctl};

use crate::decode::layouts::Layout;
use crate::kernel::{
    registry::{BackendChosen, ProbeSpec, ProbeState},
    Kernel,
};

/// The kernel side as the observer uses it.
pub trait KernelSide: Send + 'static {
    /// Every probe and its state.
    fn probe_states(&self) -> Vec<(ProbeSpec, ProbeState)>;
    /// The backend the syscalls are hooked with, and why.
    fn backend(&self) -> BackendChosen;
    /// libcuda files with `cuInit` probes.
    fn libcuda_targets(&self) -> usize;
    /// Attaches the `cuInit` probes to a libcuda file (known to be new by device and inode).
    fn attach_libcuda(&mut self, path: &Path, dev: u64, ino: u64) -> Result<()>;
    /// `cuInit` calls in flight: (tid, entry).
    fn inflight_cuinit(&self) -> Result<Vec<(u32, InflightCuinit)>>;
    /// Driver ioctls in flight: (tid, entry).
    fn inflight_ioctls(&self) -> Result<Vec<(u32, InflightIoctl)>>;
    /// Removes the in-flight entries of a thread that no longer exists.
    fn forget_thread(&mut self, tid: u32);
    /// Takes the thread's late `cuInit` (found at its first driver call) out of the
    /// in-flight map, user space having found it quiet; `false` when the thread has none
    /// (a probe ended it meanwhile).
    fn end_late_cuinit(&mut self, tid: u32) -> bool;
    /// The loss counters (index `uvmwatch_common::counter`).
    fn counters(&self) -> Result<[u64; counter::COUNT as usize]>;
    /// `Some(loaded)` when `nvidia_uvm` came or went since the last call.
    fn refresh_module(&mut self) -> Option<bool>;
    /// Removes the process entries of processes that are gone; returns how many.
    fn sweep(&mut self, alive: &dyn Fn(u32) -> bool) -> Result<usize>;
    /// Looks at the ioctls of a process found holding an NVIDIA fd at start.
    fn seed_proc(&mut self, tgid: u32) -> Result<()>;
    /// Records a file that is not a character device but was open at a `/dev/nvidia*` name
    /// before the agent started, by its `stat` device (the `st_dev` encoding) and inode.
    fn seed_dev_file(&mut self, dev: u64, ino: u64, node: u8, minor: u8) -> Result<()>;
    /// Records a driver call already in progress on `tid` when the agent started.
    fn seed_inflight_ioctl(&mut self, tid: u32, e: InflightIoctl) -> Result<()>;
    /// Reads statuses with `layout` from now on.
    fn load_layout(&mut self, layout: &Layout) -> Result<()>;
}

impl KernelSide for Kernel {
    fn probe_states(&self) -> Vec<(ProbeSpec, ProbeState)> {
        Kernel::probe_states(self)
    }
    fn backend(&self) -> BackendChosen {
        Kernel::backend(self).clone()
    }
    fn libcuda_targets(&self) -> usize {
        Kernel::libcuda_targets(self)
    }
    fn attach_libcuda(&mut self, path: &Path, dev: u64, ino: u64) -> Result<()> {
        Kernel::attach_libcuda(self, path, dev, ino)
    }
    fn inflight_cuinit(&self) -> Result<Vec<(u32, InflightCuinit)>> {
        Kernel::inflight_cuinit(self)
    }
    fn inflight_ioctls(&self) -> Result<Vec<(u32, InflightIoctl)>> {
        Kernel::inflight_ioctls(self)
    }
    fn forget_thread(&mut self, tid: u32) {
        Kernel::forget_thread(self, tid)
    }
    fn end_late_cuinit(&mut self, tid: u32) -> bool {
        Kernel::end_late_cuinit(self, tid)
    }
    fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        Kernel::counters(self)
    }
    fn refresh_module(&mut self) -> Option<bool> {
        Kernel::refresh_module(self)
    }
    fn sweep(&mut self, alive: &dyn Fn(u32) -> bool) -> Result<usize> {
        Kernel::sweep(self, alive)
    }
    fn seed_proc(&mut self, tgid: u32) -> Result<()> {
        Kernel::seed_proc(self, tgid)
    }
    fn seed_dev_file(&mut self, dev: u64, ino: u64, node: u8, minor: u8) -> Result<()> {
        Kernel::seed_dev_file(self, dev, ino, node, minor)
    }
    fn seed_inflight_ioctl(&mut self, tid: u32, e: InflightIoctl) -> Result<()> {
        Kernel::seed_inflight_ioctl(self, tid, e)
    }
    fn load_layout(&mut self, layout: &Layout) -> Result<()> {
        Kernel::load_layout(self, layout)
    }
}

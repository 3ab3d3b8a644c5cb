//! Reading and writing the programs' state maps: the ring buffer, the calls in flight,
//! the per-CPU aggregates (summed here), the loss counters, and what user space learns at
//! start (processes and calls already under way) or finds gone (threads, processes).

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    Ebpf,
};
use uvmwatch_common::{
    counter, kdev_from, DevFile, DevFileKey, InflightCuinit, InflightIoctl, IoctlKey, LatencyHist,
    OpenKey, ProcState, HIST_BUCKETS,
};

use super::Kernel;

/// Opens `pid`'s entry of `PROC_GATE` (only the kernel closes one, at the process's exit);
/// a pid past its end needs none.
pub(super) fn open_gate(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut gate: Array<&mut MapData, u8> =
        Array::try_from(bpf.map_mut("PROC_GATE").context("map PROC_GATE")?)?;
    if pid < gate.len() {
        gate.set(pid, 1, 0)?;
    }
    Ok(())
}

impl Kernel {
    /// Hits of the floor reference's program, summed over CPUs.
    ///
    /// # Errors
    /// The map cannot be read.
    pub fn floor_hits(&self) -> Result<u64> {
        let m: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.bpf.map("FLOOR_HITS").context("map FLOOR_HITS")?)?;
        Ok(m.get(&0, 0)?.iter().sum())
    }

    /// Kernel-function latency histograms summed over CPUs, by `kernel_fn` id (all ids).
    pub fn kernel_fn_hist(&self) -> Result<Vec<LatencyHist>> {
        self.hists_by_id("KF_HIST", uvmwatch_common::kernel_fn::COUNT)
    }

    /// The histograms of the per-CPU array `map` (indexed by id, `count` ids), each summed
    /// over CPUs.
    fn hists_by_id(&self, map: &str, count: u32) -> Result<Vec<LatencyHist>> {
        let m: PerCpuArray<&MapData, LatencyHist> =
            PerCpuArray::try_from(self.bpf.map(map).with_context(|| format!("map {map}"))?)?;
        (0..count)
            .map(|i| Ok(summed(m.get(&i, 0)?.iter())))
            .collect()
    }

    /// Kernel-function result counters summed over CPUs.
    pub fn kernel_fn_results(&self) -> Result<Vec<(uvmwatch_common::KernelFnResultKey, u64)>> {
        sum_percpu(self.bpf.map("KF_RESULTS").context("map KF_RESULTS")?)
    }

    /// CUDA context and device call latency histograms summed over CPUs, by
    /// `uvmwatch_common::context_call` id (all ids).
    pub fn context_call_hist(&self) -> Result<Vec<LatencyHist>> {
        self.hists_by_id("CTX_HIST", uvmwatch_common::context_call::COUNT)
    }

    /// CUDA context and device call result counters summed over CPUs.
    pub fn context_call_results(
        &self,
    ) -> Result<Vec<(uvmwatch_common::ContextCallResultKey, u64)>> {
        sum_percpu(self.bpf.map("CTX_RESULTS").context("map CTX_RESULTS")?)
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

    /// Removes the in-flight entries of a thread that no longer exists.
    pub fn forget_thread(&mut self, tid: u32) {
        // A thread without an entry is no error: most have none.
        if let Some(m) = self.bpf.map_mut("INFLIGHT_CUINIT") {
            if let Ok(mut h) = HashMap::<_, u32, InflightCuinit>::try_from(m) {
                let _ = h.remove(&tid);
            }
        }
        if let Some(m) = self.bpf.map_mut("INFLIGHT_IOCTL") {
            if let Ok(mut h) = HashMap::<_, u32, InflightIoctl>::try_from(m) {
                let _ = h.remove(&tid);
            }
        }
    }

    /// Latency histograms summed over CPUs.
    pub fn ioctl_hist(&self) -> Result<Vec<(IoctlKey, LatencyHist)>> {
        let m: PerCpuHashMap<&MapData, IoctlKey, LatencyHist> =
            PerCpuHashMap::try_from(self.bpf.map("IOCTL_HIST").context("map")?)?;
        m.iter()
            .map(|r| {
                let (k, per_cpu) = r?;
                Ok((k, summed(per_cpu.iter())))
            })
            .collect()
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

/// One latency histogram from its per-CPU copies.
fn summed<'a>(per_cpu: impl Iterator<Item = &'a LatencyHist>) -> LatencyHist {
    let mut sum = LatencyHist::default();
    for h in per_cpu {
        for b in 0..HIST_BUCKETS {
            sum.buckets[b] += h.buckets[b];
        }
        sum.sum_ns += h.sum_ns;
        sum.count += h.count;
    }
    sum
}

//! The observer: turns what the kernel programs send into [`Event`]s and hands each to every
//! [`Listener`].
//!
//! One task owns the state. It drains the ring buffer when it is readable, building one event
//! per record (`handlers.rs`) with the process's identity ([`Identities`]) and what its
//! `cuInit` did so far ([`calls`]); every [`stall::SCAN_INTERVAL`] it scans the kernel's
//! in-flight maps for calls past their threshold ([`stall`]); a failure or stall is judged by
//! the live diagnosis ([`diagnosis`]) before the event leaves, and its findings follow it as
//! events of their own. It also attaches `cuInit` probes to each new libcuda (`startup.rs`),
//! follows `nvidia_uvm` loads and the driver's version (whose ioctl layouts the kernel side
//! reads statuses with, [`driver`]), and sweeps the `PROCS` entries of processes that are gone.
//! What it needs of the kernel side is [`KernelSide`].

pub mod calls;
pub mod diagnosis;
pub mod driver;
mod handlers;
mod kernel_side;
pub mod late;
pub mod stall;
mod startup;
#[cfg(test)]
mod tests;

use std::{
    future::Future,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::Duration,
};

use anyhow::{anyhow, Result};
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
};

use crate::{
    clock,
    decode::record,
    event::{Event, Kind, Listener, Scan},
    host::{discovery::Discovery, identity::Identities},
    kernel::registry::BackendChoice,
    kernel::{Kernel, KernelSettings},
};
use calls::Calls;
use diagnosis::{Diagnosis, FactsFrom};
use driver::{DriverFrom, DriverWatch};
pub use kernel_side::KernelSide;
use stall::StallDetector;

/// Settings of the observer.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// A `cuInit` running this long is a stall.
    pub cuinit_stall: Duration,
    /// A driver ioctl running this long is a stall.
    pub ioctl_stall: Duration,
    /// Ioctls at least this long are reported one by one (capped at `ioctl_stall`).
    pub slow_ioctl: Duration,
    /// Extra libcuda files to probe (`--libcuda`).
    pub libcuda: Vec<PathBuf>,
    /// Look through every process's maps at start (`--no-proc-scan` turns it off).
    pub proc_scan: bool,
    /// `/proc` (a different root only in tests).
    pub proc_root: PathBuf,
    /// Where the diagnosis facts come from; `None`: no live diagnosis (`doctor --probe`
    /// judges once, after the run).
    pub facts: Option<FactsFrom>,
    /// How long a finding from an incident stays active in `uvmwatch_diagnosis`.
    pub diagnosis_ttl: Duration,
    /// How often the diagnosis facts are read again.
    pub evidence_refresh: Duration,
    /// Where the driver's version (and so the ioctl layouts) comes from.
    pub driver: DriverFrom,
    /// `--probe-backend`.
    pub backend: BackendChoice,
}

/// The defaults of the probe settings, written as their flags take them
/// (`cmd::probe_flags`: `--cuinit-stall 20s`); [`RunConfig::new`] reads the same.
pub mod defaults {
    /// `--cuinit-stall`: a `cuInit` running this long is a stall.
    pub const CUINIT_STALL: &str = "20s";
    /// `--ioctl-stall`: a driver ioctl running this long is a stall.
    pub const IOCTL_STALL: &str = "5s";
    /// `--slow-ioctl`: driver ioctls at least this long are reported one by one.
    pub const SLOW_IOCTL: &str = "1s";

    /// One of the defaults above as a [`std::time::Duration`].
    pub(crate) fn duration(text: &str) -> std::time::Duration {
        humantime::parse_duration(text).expect("a default duration parses")
    }
}

impl RunConfig {
    /// The settings of `uvmwatch run` with its defaults ([`defaults`]: thresholds 20 s and
    /// 5 s, slow calls from 1 s; facts of this machine).
    pub fn new() -> RunConfig {
        RunConfig {
            cuinit_stall: defaults::duration(defaults::CUINIT_STALL),
            ioctl_stall: defaults::duration(defaults::IOCTL_STALL),
            slow_ioctl: defaults::duration(defaults::SLOW_IOCTL),
            libcuda: Vec::new(),
            proc_scan: true,
            proc_root: PathBuf::from("/proc"),
            facts: Some(FactsFrom::Live { host_root: None }),
            diagnosis_ttl: Duration::from_secs(600),
            evidence_refresh: Duration::from_secs(300),
            driver: DriverFrom::Live { host_root: None },
            backend: BackendChoice::Auto,
        }
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig::new()
    }
}

/// Records handled per turn of the loop at most, so the stall scan and the heartbeat never
/// wait for a flood of records to end (about 10 ms of decoding).
const DRAIN_BATCH: usize = 4096;

/// Scans between checks for `nvidia_uvm` coming or going (1 s).
const MODULE_CHECK_EVERY: u64 = 20;
/// How often the `PROCS` entries of gone processes are swept and expired findings cleared.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The observer's state, over the kernel side `K` ([`Kernel`]; a stand-in in its tests).
pub struct Observer<K: KernelSide = Kernel> {
    cfg: RunConfig,
    kernel: Arc<Mutex<K>>,
    ring: Option<RingBuf<MapData>>,
    discovery: Discovery,
    detector: StallDetector,
    calls: Calls,
    identities: Identities,
    diagnosis: Option<Diagnosis>,
    driver: DriverWatch,
    /// The layouts chosen before the listeners came, said at start.
    driver_layout: Option<crate::event::DriverLayout>,
    listeners: Vec<Box<dyn Listener>>,
    /// Records that could not be decoded (an agent/eBPF mismatch).
    undecodable: u64,
    /// Records taken from the ring buffer so far.
    received: u64,
    /// The last drain emptied the ring: a call missing from the in-flight maps then really
    /// ended without an exit record (not one still queued).
    caught_up: bool,
    /// The capabilities this process holds and whether the kernel has kprobes, for the
    /// [`crate::kernel::features`] said with each probe-table change.
    caps: crate::host::caps::Capabilities,
    kprobes: bool,
}

impl Observer<Kernel> {
    /// Loads and attaches the kernel programs and reads the diagnosis facts once. Nothing is
    /// reported yet: give the listeners to [`Observer::start`].
    ///
    /// # Errors
    /// Not root, the eBPF object cannot load, or the facts' snapshot cannot be opened.
    pub fn load(cfg: RunConfig) -> Result<Observer> {
        let slow = cfg.slow_ioctl.min(cfg.ioctl_stall);
        // The facts and the driver's version first, so the programs read statuses with the
        // running driver's layouts from their first call.
        let (diagnosis, mut driver) = Observer::<Kernel>::sources(&cfg)?;
        let mut loaded = None;
        let said = driver
            .check(|layout| {
                loaded = Some(Kernel::load(&KernelSettings {
                    slow_ioctl_ns: slow.as_nanos() as u64,
                    layout,
                    failure_events_per_second: crate::kernel::FAILURE_EVENTS_PER_SECOND,
                    backend: cfg.backend,
                    absence_facts: crate::observer::diagnosis::probe_absence_facts,
                })?);
                Ok(())
            })?
            .expect("a first check loads");
        let mut kernel = loaded.expect("loaded by the first check");
        let ring = kernel.take_events()?;
        let mut o = Observer::assemble(cfg, kernel, diagnosis, driver, said);
        o.ring = Some(ring);
        Ok(o)
    }

    /// The kernel side, for readers of its aggregates (the metrics' collector). Weak, so
    /// that dropping the observer really detaches the programs.
    pub fn kernel_handle(&self) -> Weak<Mutex<Kernel>> {
        Arc::downgrade(&self.kernel)
    }

    /// Runs until SIGINT, SIGTERM or `stop` (which gives the reason), then reports the last
    /// records, flushes the listeners, detaches every probe and sends the `stopped` event.
    ///
    /// # Errors
    /// The ring buffer cannot be watched, or a signal handler cannot be installed.
    pub async fn run(mut self, stop: impl Future<Output = &'static str>) -> Result<()> {
        tokio::pin!(stop);
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut scan = tokio::time::interval(stall::SCAN_INTERVAL);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let ring = self.ring.take().ok_or_else(|| anyhow!("already ran"))?;
        // SAFETY: the AsyncFd owns the ring buffer, so its fd stays open while registered.
        let mut ring = unsafe { AsyncFd::register(ring) }
            .map_err(|e| anyhow!("registering the ring buffer fd: {e}"))?;
        let mut ticks: u64 = 0;
        let why = loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    // At most one batch a turn: under a flood of records the scan below
                    // still gets its turns (select! picks among ready branches at random).
                    if self.drain(guard.get_inner_mut(), DRAIN_BATCH) {
                        guard.clear_ready();
                    }
                }
                _ = scan.tick() => {
                    // Records first (one batch), so a call that just returned is not taken
                    // for a vanished one; the scan counts a call missing only when the
                    // ring was caught up.
                    self.drain(ring.get_mut(), DRAIN_BATCH);
                    self.scan();
                    self.take_new_facts();
                    ticks += 1;
                    if ticks.is_multiple_of(MODULE_CHECK_EVERY) {
                        self.check_module();
                        self.check_driver();
                    }
                }
                _ = sweep.tick() => self.sweep(),
                reason = &mut stop => break reason,
                _ = sigterm.recv() => break "SIGTERM",
                _ = sigint.recv() => break "SIGINT",
            }
        };
        // Records that arrived last, then the listeners write out what they hold.
        self.drain(ring.get_mut(), usize::MAX);
        for l in self.listeners.iter_mut() {
            l.flush();
        }
        drop(ring);
        let mut listeners = std::mem::take(&mut self.listeners);
        let kernel = self.kernel.clone();
        drop(self);
        // Last reference: dropping the Kernel detaches every link and unloads the programs.
        match Arc::try_unwrap(kernel) {
            Ok(k) => drop(k.into_inner()),
            Err(_) => tracing::warn!("kernel handle still shared at exit"),
        }
        let stopped = Arc::new(Event::agent(
            clock::monotonic_ns(),
            Kind::Stopped { signal: why },
        ));
        for l in listeners.iter_mut() {
            l.event(&stopped);
            l.flush();
        }
        Ok(())
    }
}

impl<K: KernelSide> Observer<K> {
    /// An observer over a kernel side already loaded (and its ring buffer taken).
    ///
    /// # Errors
    /// The facts' snapshot cannot be opened.
    pub fn over(cfg: RunConfig, mut kernel: K) -> Result<Observer<K>> {
        let (diagnosis, mut driver) = Self::sources(&cfg)?;
        let said = driver
            .check(|layout| kernel.load_layout(layout))?
            .expect("a first check loads");
        Ok(Self::assemble(cfg, kernel, diagnosis, driver, said))
    }

    /// The live diagnosis (its facts read once) and the watch on the driver's version (over
    /// the facts' snapshot when the facts come from one).
    fn sources(cfg: &RunConfig) -> Result<(Option<Diagnosis>, DriverWatch)> {
        let diagnosis = match &cfg.facts {
            Some(from) => Some(Diagnosis::start(
                from,
                cfg.evidence_refresh,
                cfg.diagnosis_ttl,
            )?),
            None => None,
        };
        let snapshot = diagnosis.as_ref().map(Diagnosis::driver);
        Ok((diagnosis, DriverWatch::new(cfg.driver.clone(), snapshot)))
    }

    fn assemble(
        cfg: RunConfig,
        kernel: K,
        diagnosis: Option<Diagnosis>,
        driver: DriverWatch,
        said: crate::event::DriverLayout,
    ) -> Observer<K> {
        Observer {
            detector: StallDetector::new(cfg.cuinit_stall, cfg.ioctl_stall),
            identities: Identities::new(cfg.proc_root.clone()),
            cfg,
            kernel: Arc::new(Mutex::new(kernel)),
            ring: None,
            discovery: Discovery::new(),
            calls: Calls::default(),
            diagnosis,
            driver,
            driver_layout: Some(said),
            listeners: Vec::new(),
            undecodable: 0,
            received: 0,
            caught_up: true,
            caps: crate::host::caps::Capabilities::of_this_process(),
            kprobes: crate::kernel::kprobes_supported(),
        }
    }

    /// Does the start-up work with `listeners` watching: findings from the facts, libcuda
    /// discovery, fds and calls already open; ends with the `started` event, which says
    /// where `/metrics` is served (`listen`: an address, or `none`).
    pub fn start(&mut self, listeners: Vec<Box<dyn Listener>>, listen: &str) {
        self.listeners = listeners;
        let now = clock::monotonic_ns();
        if let Some(said) = self.driver_layout.take() {
            self.dispatch(Event::agent(now, Kind::DriverLayout(said)));
        }
        if let Some(d) = self.diagnosis.as_mut() {
            let found = d.static_findings(now);
            let active = d.active(now);
            for ev in found {
                self.dispatch(ev);
            }
            if let Some(a) = active {
                self.dispatch(Event::agent(now, Kind::ActiveFindings(a)));
            }
        }
        self.discover_initial();
        self.seed_fds();
        self.probes_changed();
        let (rows, targets, backend) = {
            let k = self.kernel();
            (k.probe_states(), k.libcuda_targets(), k.backend())
        };
        let started = crate::event::Started {
            backend: backend.backend.name(),
            backend_reason: backend.why,
            listen: listen.to_string(),
            probes_attached: rows.iter().filter(|(_, s)| s.gauge() == 1).count(),
            probes_total: rows.len(),
            libcuda_targets: targets,
            cuinit_stall: self.cfg.cuinit_stall,
            ioctl_stall: self.cfg.ioctl_stall,
        };
        self.dispatch(Event::agent(clock::monotonic_ns(), Kind::Started(started)));
    }

    fn kernel(&self) -> MutexGuard<'_, K> {
        lock(&self.kernel)
    }

    /// Hands an event to every listener, as it is.
    fn dispatch(&mut self, ev: Event) {
        let ev = Arc::new(ev);
        for l in self.listeners.iter_mut() {
            l.event(&ev);
        }
    }

    /// Judges an event that can have a cause, hands it on, then its findings one by one.
    fn emit(&mut self, mut ev: Event) {
        let differential = self.diagnosis.as_mut().and_then(|d| {
            let kernel = &self.kernel;
            d.diagnose_event(&mut ev, || unavailable_probes(kernel))
        });
        let findings = ev.findings().to_vec();
        let trigger = diagnosis::trigger_of(&ev);
        let (ts, process) = (ev.ts_ns, ev.process.clone());
        self.dispatch(ev);
        let (Some(trigger), Some(differential)) =
            (trigger.filter(|_| !findings.is_empty()), differential)
        else {
            return;
        };
        let pid = process.as_ref().map(|p| p.pid).unwrap_or(0);
        for finding in findings {
            self.dispatch(Event {
                ts_ns: ts,
                process: process.clone(),
                tid: pid,
                comm: String::new(),
                kind: Kind::Diagnosis(crate::event::Diagnosis {
                    finding,
                    trigger,
                    differential: differential.clone(),
                }),
            });
        }
        self.update_active(ts);
    }

    /// Sends `ActiveFindings` when the set of active findings changed.
    fn update_active(&mut self, now: u64) {
        if let Some(a) = self.diagnosis.as_mut().and_then(|d| d.active(now)) {
            self.dispatch(Event::agent(now, Kind::ActiveFindings(a)));
        }
    }

    /// New facts from the reader thread: the findings from the facts alone again.
    fn take_new_facts(&mut self) {
        let now = clock::monotonic_ns();
        let Some(d) = self.diagnosis.as_mut() else {
            return;
        };
        if !d.refresh() {
            return;
        }
        let found = d.static_findings(now);
        self.dispatch(Event::agent(now, Kind::EvidenceChanged));
        for ev in found {
            self.dispatch(ev);
        }
        self.update_active(now);
    }

    /// The probe table, to the listeners.
    fn probes_changed(&mut self) {
        let (probes, libcuda_targets, backend) = {
            let k = self.kernel();
            (k.probe_states(), k.libcuda_targets(), k.backend())
        };
        let features = crate::kernel::features::assess(&probes, &self.caps, self.kprobes);
        self.dispatch(Event::agent(
            clock::monotonic_ns(),
            Kind::ProbesChanged {
                probes,
                libcuda_targets,
                features,
                backend,
            },
        ));
    }

    /// Handles at most `max` records from the ring; returns whether it is empty now (also
    /// kept for the stall scan, [`Observer::caught_up`]).
    fn drain(&mut self, rb: &mut RingBuf<MapData>, max: usize) -> bool {
        let mut n = 0;
        while n < max {
            let Some(item) = rb.next() else {
                self.caught_up = true;
                return true;
            };
            n += 1;
            self.received += 1;
            match record::decode(&item) {
                Ok(r) => self.handle(r),
                Err(e) => {
                    self.undecodable += 1;
                    tracing::debug!(error = %e, "undecodable record");
                }
            }
        }
        self.caught_up = false;
        false
    }

    /// The scan's figures, after a pass.
    fn scan_figures(&self, cuinit_in_flight: usize) -> Scan {
        let kernel_drops = self
            .kernel()
            .counters()
            .map(|c| c[uvmwatch_common::counter::RINGBUF_DROPS as usize])
            .unwrap_or(0);
        Scan {
            cuinit_in_flight,
            dropped_total: kernel_drops + self.undecodable,
            undecodable_total: self.undecodable,
            received_total: self.received,
            identities_unread_total: self.identities.gone_total(),
            caught_up: self.caught_up,
        }
    }

    /// Attaches or detaches the module kprobes when `nvidia_uvm` comes or goes.
    fn check_module(&mut self) {
        let changed = self.kernel().refresh_module();
        if let Some(loaded) = changed {
            self.dispatch(Event::agent(
                clock::monotonic_ns(),
                Kind::ModuleChanged {
                    module: crate::kernel::registry::UVM_MODULE,
                    loaded,
                },
            ));
            self.probes_changed();
        }
    }

    /// Loads the layouts of a driver whose version changed (a reload), and says so. A
    /// layout that cannot be loaded is logged as an error and loaded again on the next check.
    fn check_driver(&mut self) {
        let kernel = self.kernel.clone();
        match self
            .driver
            .check(|layout| lock(&kernel).load_layout(layout))
        {
            Ok(Some(said)) => self.dispatch(Event::agent(
                clock::monotonic_ns(),
                Kind::DriverLayout(said),
            )),
            Ok(None) => {}
            Err(e) => tracing::error!("loading the ioctl layouts of the driver: {e:#}"),
        }
    }

    /// Checks the driver again now when no version is known yet: a process that opens a
    /// device node or enters `cuInit` may have just had the driver loaded on demand, and its
    /// first calls should not wait a second for the right layouts.
    pub(crate) fn check_driver_if_unknown(&mut self) {
        if !self.driver.knows_version() {
            self.check_driver();
        }
    }

    fn sweep(&mut self) {
        let root = self.cfg.proc_root.clone();
        let removed = self
            .kernel()
            .sweep(&|tgid| root.join(tgid.to_string()).exists())
            .unwrap_or(0);
        if removed > 0 {
            self.dispatch(Event::agent(clock::monotonic_ns(), Kind::Swept { removed }));
        }
        self.update_active(clock::monotonic_ns());
    }
}

fn lock<K>(kernel: &Mutex<K>) -> MutexGuard<'_, K> {
    match kernel.lock() {
        Ok(k) => k,
        Err(p) => p.into_inner(),
    }
}

/// Probes that are not attached, as `label: why`, for the rules' "could not check".
fn unavailable_probes<K: KernelSide>(kernel: &Mutex<K>) -> Vec<String> {
    lock(kernel)
        .probe_states()
        .into_iter()
        .filter(|(_, st)| st.gauge() == 0)
        .map(|(spec, st)| format!("{}: {st}", spec.label))
        .collect()
}

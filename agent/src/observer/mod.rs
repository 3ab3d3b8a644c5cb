//! `uvmwatch run`: the agent's main loop.
//!
//! One task owns the event state: it drains the ring buffer when it is readable, scans the
//! in-flight maps every [`stall::SCAN_INTERVAL`] for stalls, attaches `cuInit` probes to
//! each new libcuda, and sweeps stale fd entries. The HTTP server runs beside it and reads
//! the kernel's aggregates on scrape.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
};
use uvmwatch_common::{
    node, result, CuinitEvent, IoctlEvent, KfuncEvent, OpenEvent, TaskEvent, DIED_IN_CUINIT,
    DIED_IN_IOCTL, IOCTL_FAILED, IOCTL_IN_CUINIT, IOCTL_SLOW, OPEN_IN_CUINIT, OPEN_LIBCUDA,
};

pub mod stall;

use crate::{
    clock,
    decode::{
        nvidia,
        record::{self, cstr, Event},
    },
    doctor::{
        collect,
        facts::{Evidence, Observations, SeenCall},
        finding::{Finding, Severity, Where},
        root::Root,
        rules,
    },
    event::{CallEvent, ProcessInfo, Sink},
    export::{
        http,
        metrics::{KernelCollector, Metrics},
    },
    host::{
        discovery::{self, Discovery, LibTarget},
        procfs,
        workload::WorkloadInfo,
    },
    kernel::{Kernel, KernelSettings},
};
use stall::{CallKey, CallKind, InFlight, StallDetector};

/// Settings of `uvmwatch run`.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Address of the `/metrics` and `/healthz` server (`None`: no server, as in capture).
    pub listen: Option<SocketAddr>,
    /// Stop by itself after this long (capture `--duration`).
    pub stop_after: Option<Duration>,
    /// A `cuInit` running this long is a stall.
    pub cuinit_stall: Duration,
    /// A driver ioctl running this long is a stall.
    pub ioctl_stall: Duration,
    /// Ioctls at least this long are logged one by one (capped at `ioctl_stall`).
    pub slow_ioctl: Duration,
    /// Extra libcuda files to probe (`--libcuda`).
    pub libcuda: Vec<PathBuf>,
    /// Look through every process's maps at start (`--no-proc-scan` turns it off).
    pub proc_scan: bool,
    /// `/proc` (a different root only in tests).
    pub proc_root: PathBuf,
    /// Read the diagnosis facts from this snapshot (directory or bundle) instead of the
    /// live system (`--evidence-root`; for replaying a machine's state and for tests).
    pub evidence_root: Option<PathBuf>,
    /// Where the host's `/` is mounted when the agent runs in a container (`--host-root`):
    /// the live facts are read below it.
    pub host_root: Option<PathBuf>,
    /// How long a finding from an incident stays active in `uvmwatch_diagnosis`.
    pub diagnosis_ttl: Duration,
    /// How often the diagnosis facts are read again.
    pub evidence_refresh: Duration,
    /// Add the workload labels (engine, namespace, pod) to the cuInit and stall counters.
    pub workload_labels: bool,
}

/// Per-thread record of a `cuInit` in progress, for the summary logged when it ends.
#[derive(Debug, Default)]
struct CuinitCall {
    tgid: u32,
    ioctls: u32,
    opens: u32,
    /// Last failed driver call inside this cuInit: (what, result).
    last_failure: Option<(String, String)>,
    /// The same, for the diagnosis rules.
    failed_call: Option<SeenCall>,
    /// Failed device opens inside this cuInit: (path, errno name).
    failed_opens: Vec<(String, String)>,
    /// Parent this process was forked from without exec (0: none).
    forked_from: u32,
    /// Kernel-side signals (kprobes) seen on this thread during the call.
    kernel_signals: Vec<String>,
}

/// The event-handling state.
struct Core {
    cfg: RunConfig,
    kernel: Arc<Mutex<Kernel>>,
    metrics: Metrics,
    discovery: Discovery,
    detector: StallDetector,
    cuinit: HashMap<u32, CuinitCall>,
    /// Facts for the diagnosis rules (refreshed in the background).
    evidence: Evidence,
    /// Findings from the evidence alone, re-evaluated when it changes.
    static_findings: Vec<Finding>,
    /// Findings from incidents (stalls, failures): (rule, severity) -> expiry (monotonic ns).
    incident_findings: HashMap<(String, Severity), u64>,
    /// Processes whose cuInit returned 0 (for fork-after-init).
    initialized: HashSet<u32>,
    /// Trace and capture consumers.
    sinks: Vec<Box<dyn Sink>>,
    /// Identity of processes seen (read once from /proc), for the sinks.
    procs: HashMap<u32, ProcessInfo>,
    /// Inference workload identity of processes seen (engine, model, ...), for logs and
    /// the opt-in metric labels.
    workloads: HashMap<u32, WorkloadInfo>,
    /// Dropped-event total last passed to the sinks.
    dropped_seen: u64,
}

fn comm(e: &uvmwatch_common::EventHeader) -> String {
    cstr(&e.comm)
}

impl Core {
    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        match self.kernel.lock() {
            Ok(k) => k,
            Err(p) => p.into_inner(),
        }
    }

    // --- libcuda ------------------------------------------------------------------------------

    fn attach_all(&mut self, targets: Vec<LibTarget>) {
        for t in targets {
            self.attach(t);
        }
    }

    fn attach(&mut self, t: LibTarget) {
        let r = self.kernel().attach_libcuda(&t.host_path, t.dev, t.ino);
        match r {
            Ok(()) => tracing::info!(
                event = "libcuda_attached",
                path = %t.path_in_ns.display(),
                host_path = %t.host_path.display(),
                source = ?t.source,
                "cuInit probes attached"
            ),
            Err(e) => {
                tracing::warn!(
                    event = "libcuda_attach_failed",
                    path = %t.host_path.display(),
                    error = %format!("{e:#}"),
                    "could not probe cuInit in this library"
                );
                self.discovery.forget(t.dev, t.ino);
            }
        }
        self.refresh_probe_metrics();
    }

    fn refresh_probe_metrics(&self) {
        let (rows, n) = {
            let k = self.kernel();
            (k.probe_states(), k.libcuda_targets())
        };
        self.metrics.set_probes(&rows);
        self.metrics.libcuda_targets.set(n as i64);
    }

    fn discover_initial(&mut self) {
        let flagged = self.discovery.from_flags(&self.cfg.libcuda);
        for r in flagged {
            match r {
                Ok(t) => self.attach(t),
                Err(e) => {
                    tracing::error!(event = "libcuda_not_found", error = %format!("{e:#}"), "--libcuda path unusable")
                }
            }
        }
        let host = self.discovery.from_host(
            &self.cfg.proc_root,
            Path::new("/etc/ld.so.cache"),
            discovery::DRIVER_DIRS,
        );
        self.attach_all(host);
        if self.cfg.proc_scan {
            let found = self.discovery.scan_all(&self.cfg.proc_root);
            self.attach_all(found);
        }
        if self.kernel().libcuda_targets() == 0 {
            tracing::warn!(
                event = "libcuda_not_found",
                "no libcuda.so found on the host or in any running process; cuInit probes attach \
                 as soon as a process loads one (or pass --libcuda PATH)"
            );
        }
    }

    // --- fds learned from /proc ----------------------------------------------------------------

    fn seed_fds(&mut self) {
        let pids = procfs::list_pids(&self.cfg.proc_root).unwrap_or_default();
        let me = std::process::id();
        let mut n = 0;
        for pid in pids {
            if pid == me {
                continue;
            }
            let Ok(fds) = procfs::nvidia_fds(&self.cfg.proc_root, pid) else {
                continue;
            };
            let mut kinds = HashMap::new();
            for f in fds {
                let (kind, minor) = match f.node {
                    procfs::NodeKind::Ctl => (node::CTL, 0),
                    procfs::NodeKind::Gpu(m) => (node::GPU, m as u8),
                    procfs::NodeKind::Uvm => (node::UVM, 0),
                    procfs::NodeKind::UvmTools => (node::UVM_TOOLS, 0),
                };
                kinds.insert(f.fd, (kind, minor));
                if self
                    .kernel()
                    .seed_fd(pid, f.fd, kind, minor, f.cloexec)
                    .is_ok()
                {
                    n += 1;
                }
            }
            if !kinds.is_empty() {
                self.seed_blocked_ioctls(pid, &kinds);
            }
        }
        if n > 0 {
            tracing::info!(
                event = "fds_learned",
                count = n,
                "NVIDIA fds opened before the agent started are tracked"
            );
        }
    }

    /// Threads of `pid` already blocked in an ioctl on one of its NVIDIA fds when the agent
    /// starts (from `/proc/<pid>/task/<tid>/syscall`): their entry was never seen, so they
    /// are put in the kernel's in-flight map with the agent's start as their start. The stall
    /// detector then reports them (their age is a lower bound) and the exit probe ends them.
    fn seed_blocked_ioctls(&mut self, pid: u32, fds: &HashMap<u32, (u8, u8)>) {
        let now = clock::monotonic_ns();
        for tid in procfs::list_threads(&self.cfg.proc_root, pid).unwrap_or_default() {
            let Some((nr, args)) = procfs::syscall_of(&self.cfg.proc_root, pid, tid) else {
                continue;
            };
            if nr != libc::SYS_ioctl {
                continue;
            }
            let fd = args[0] as u32;
            let Some(&(kind, minor)) = fds.get(&fd) else {
                continue;
            };
            let e = uvmwatch_common::InflightIoctl {
                start_ns: now,
                arg: args[2],
                tgid: pid,
                fd,
                cmd: args[1] as u32,
                node: kind,
                minor,
                in_cuinit: 0,
                _pad: 0,
            };
            if self.kernel().seed_inflight_ioctl(tid, e).is_ok() {
                tracing::warn!(
                    event = "in_flight_at_start",
                    pid,
                    tid,
                    ioctl = %nvidia::ioctl_display(kind, args[1] as u32),
                    node = %nvidia::node_path(kind, minor),
                    "a thread was already inside a driver call when the agent started; its age counts from now"
                );
            }
        }
    }

    // --- events --------------------------------------------------------------------------------

    /// `uvmwatch_cuinit_in_flight` from the kernel's map, right after a `cuInit` starts or
    /// ends (the scan also refreshes it).
    fn refresh_in_flight(&self) {
        let n = self
            .kernel()
            .inflight_cuinit()
            .map(|v| v.len())
            .unwrap_or(0);
        self.metrics.cuinit_in_flight.set(n as i64);
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::CuinitEnter(e) => {
                self.on_cuinit_enter(&e);
                self.refresh_in_flight();
            }
            Event::CuinitExit(e) => {
                self.on_cuinit_exit(&e);
                self.refresh_in_flight();
            }
            Event::Ioctl(e) => self.on_ioctl(&e),
            Event::Open(e) => self.on_open(&e),
            Event::DiedInCall(e) => {
                self.on_died(&e);
                self.refresh_in_flight();
            }
            Event::Fork(e) => tracing::debug!(
                event = "fork",
                pid = e.header.tgid,
                child = e.aux,
                "tracked process forked"
            ),
            Event::Exec(e) => {
                tracing::debug!(
                    event = "exec",
                    pid = e.header.tgid,
                    "tracked process exec'ed"
                );
                // A new image: its CUDA state and the identity read before are gone.
                self.initialized.remove(&e.header.tgid);
                self.procs.remove(&e.header.tgid);
                self.workloads.remove(&e.header.tgid);
            }
            Event::Kfunc(e) => self.on_kfunc(&e),
            Event::ProcExit(e) => {
                tracing::debug!(
                    event = "process_exit",
                    pid = e.header.tgid,
                    "tracked process exited"
                );
                self.cuinit.retain(|_, c| c.tgid != e.header.tgid);
                self.procs.remove(&e.header.tgid);
                self.workloads.remove(&e.header.tgid);
            }
        }
    }

    /// Identity of a process for the sinks (read from /proc once, cached until it exits).
    fn proc_info(&mut self, pid: u32, comm_hint: &str) -> ProcessInfo {
        if let Some(p) = self.procs.get(&pid) {
            return p.clone();
        }
        let root = &self.cfg.proc_root;
        let t = procfs::read_thread(root, pid, pid).ok();
        let info = ProcessInfo {
            pid,
            ns_pid: procfs::ns_pid(root, pid).ok().flatten(),
            comm: t
                .as_ref()
                .map(|t| t.comm.clone())
                .unwrap_or_else(|| comm_hint.to_string()),
            exe: t
                .as_ref()
                .and_then(|t| t.exe.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            cmdline: t.as_ref().map(|t| t.cmdline.clone()).unwrap_or_default(),
            container_id: t.and_then(|t| t.container_id),
        };
        if self.procs.len() > 4096 {
            self.procs.clear();
        }
        self.procs.insert(pid, info.clone());
        info
    }

    /// The workload a process runs (read from /proc once, cached until it exits).
    fn workload(&mut self, pid: u32) -> WorkloadInfo {
        if let Some(w) = self.workloads.get(&pid) {
            return w.clone();
        }
        let w = crate::host::workload::identify(&self.cfg.proc_root, pid);
        if self.workloads.len() > 4096 {
            self.workloads.clear();
        }
        self.workloads.insert(pid, w.clone());
        w
    }

    /// Passes one event to every sink.
    fn emit(&mut self, ev: CallEvent<'_>) {
        for s in self.sinks.iter_mut() {
            s.event(&ev);
        }
    }

    fn on_cuinit_enter(&mut self, e: &CuinitEvent) {
        let h = &e.header;
        self.cuinit.insert(
            h.tid,
            CuinitCall {
                tgid: h.tgid,
                forked_from: e.forked_from,
                ..Default::default()
            },
        );
        let p = self.proc_info(h.tgid, &comm(h));
        let exe = p.exe.clone();
        let wl = self.workload(h.tgid);
        tracing::info!(
            event = "cuinit_start",
            pid = h.tgid,
            tid = h.tid,
            engine = wl.engine.as_deref().unwrap_or(""),
            model = wl.model.as_deref().unwrap_or(""),
            quantization = wl.quantization.as_deref().unwrap_or(""),
            tp_rank = wl.tp_rank.map(|r| r.to_string()).unwrap_or_default(),
            pod = wl.k8s_pod_name.as_deref().unwrap_or(""),
            namespace = wl.k8s_namespace.as_deref().unwrap_or(""),
            comm = %comm(h),
            exe = %exe,
            flags = e.flags,
            "cuInit entered"
        );
        if !self.sinks.is_empty() {
            self.emit(CallEvent::CuinitStart {
                proc: &p,
                tid: h.tid,
                start_ns: e.start_ns,
                flags: e.flags,
            });
        }
    }

    fn on_cuinit_exit(&mut self, e: &CuinitEvent) {
        let h = &e.header;
        let dur = h.ts_ns.saturating_sub(e.start_ns);
        let secs = dur as f64 / 1e9;
        let name = nvidia::cu_result_name(e.ret);
        let call = self.cuinit.remove(&h.tid).unwrap_or_default();
        if e.entry_seen == 1 {
            let wl = self.workload(h.tgid);
            let [e, n, p] = wl.metric_labels().map(|(_, v)| v);
            self.metrics.count_cuinit(&name, [e, n, p]);
            self.metrics.cuinit_duration.observe(secs);
        }
        let key = CallKey {
            kind: CallKind::Cuinit,
            tid: h.tid,
            start_ns: e.start_ns,
        };
        if self.detector.end(&key).is_some() {
            tracing::warn!(
                event = "stall_end",
                call = "cuInit",
                outcome = "returned",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                result = %name,
                code = e.ret,
                duration_seconds = secs,
                "stalled cuInit returned"
            );
            self.update_stalled_gauges();
            if !self.sinks.is_empty() {
                let p = self.proc_info(h.tgid, &comm(h));
                self.emit(CallEvent::StallEnd {
                    proc: &p,
                    tid: h.tid,
                    call: "cuInit",
                    start_ns: e.start_ns,
                    end_ns: h.ts_ns,
                    outcome: "returned",
                });
            }
        }
        if !self.sinks.is_empty() && e.entry_seen == 1 {
            let p = self.proc_info(h.tgid, &comm(h));
            self.emit(CallEvent::CuinitEnd {
                proc: &p,
                tid: h.tid,
                start_ns: e.start_ns,
                end_ns: h.ts_ns,
                code: e.ret,
                result: &name,
            });
        }
        let (fail_call, fail_result) = call
            .last_failure
            .clone()
            .unwrap_or_else(|| (String::new(), String::new()));
        if e.ret == 0 {
            tracing::info!(
                event = "cuinit_end",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                result = %name,
                code = e.ret,
                duration_seconds = secs,
                driver_calls = call.ioctls,
                device_opens = call.opens,
                "cuInit returned"
            );
        } else {
            let obs = Observations {
                pid: Some(h.tgid),
                cuinit_result: Some(e.ret),
                cuinit_seconds: Some(secs),
                failed_call: call.failed_call.clone(),
                failed_opens: call.failed_opens.clone(),
                device_opens: call.opens,
                forked_after_parent_init: e.forked_from != 0
                    && self.initialized.contains(&e.forked_from),
                kernel_signals: call.kernel_signals.clone(),
                unavailable_probes: self.unavailable_probes(),
                ..Observations::default()
            };
            let findings = self.diagnose(&obs);
            let d = DiagnosisFields::of(&findings);
            tracing::error!(
                event = "cuinit_end",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                result = %name,
                code = e.ret,
                duration_seconds = secs,
                driver_calls = call.ioctls,
                device_opens = call.opens,
                failed_call = %fail_call,
                failed_result = %fail_result,
                diagnosis = %d.rules,
                diagnosis_title = %d.title,
                diagnosis_fix = %d.fix,
                runbook = %d.runbook,
                "cuInit failed"
            );
            self.log_findings(&findings, h.tgid, "cuinit_end");
        }
        if e.ret == 0 {
            self.initialized.insert(h.tgid);
        }
    }

    fn on_ioctl(&mut self, e: &IoctlEvent) {
        let h = &e.header;
        let name = nvidia::ioctl_display(e.node, e.cmd);
        let node_path = nvidia::node_path(e.node, e.minor);
        let res = match e.result_kind {
            result::ERRNO => crate::decode::errno::label(e.status),
            k => nvidia::ioctl_result_label(k, e.status),
        };
        let dur = h.ts_ns.saturating_sub(e.start_ns);
        let secs = dur as f64 / 1e9;
        if e.flags & IOCTL_IN_CUINIT != 0 {
            if let Some(c) = self.cuinit.get_mut(&h.tid) {
                c.ioctls += 1;
                if e.flags & IOCTL_FAILED != 0 {
                    c.last_failure = Some((format!("{name} on {node_path}"), res.clone()));
                    c.failed_call = Some(SeenCall {
                        call: name.clone(),
                        node: node_path.clone(),
                        result: res.clone(),
                        seconds: secs,
                    });
                }
            }
        }
        let key = CallKey {
            kind: CallKind::Ioctl,
            tid: h.tid,
            start_ns: e.start_ns,
        };
        if self.detector.end(&key).is_some() {
            tracing::warn!(
                event = "stall_end",
                call = %name,
                node = %node_path,
                outcome = "returned",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                result = %res,
                duration_seconds = secs,
                "stalled driver call returned"
            );
            self.update_stalled_gauges();
            if !self.sinks.is_empty() {
                let p = self.proc_info(h.tgid, &comm(h));
                self.emit(CallEvent::StallEnd {
                    proc: &p,
                    tid: h.tid,
                    call: &name,
                    start_ns: e.start_ns,
                    end_ns: h.ts_ns,
                    outcome: "returned",
                });
            }
        }
        if !self.sinks.is_empty() {
            let p = self.proc_info(h.tgid, &comm(h));
            self.emit(CallEvent::Ioctl {
                proc: &p,
                tid: h.tid,
                start_ns: e.start_ns,
                end_ns: h.ts_ns,
                name: &name,
                node: &node_path,
                result: &res,
                failed: e.flags & IOCTL_FAILED != 0,
                in_cuinit: e.flags & IOCTL_IN_CUINIT != 0,
            });
        }
        if e.flags & IOCTL_FAILED != 0 {
            tracing::warn!(
                event = "driver_ioctl",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                ioctl = %name,
                cmd = %format!("{:#x}", e.cmd),
                node = %node_path,
                result = %res,
                ret = e.ret,
                duration_seconds = secs,
                in_cuinit = e.flags & IOCTL_IN_CUINIT != 0,
                "driver call failed"
            );
        } else if e.flags & IOCTL_SLOW != 0 {
            tracing::info!(
                event = "driver_ioctl",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                ioctl = %name,
                node = %node_path,
                result = %res,
                duration_seconds = secs,
                in_cuinit = e.flags & IOCTL_IN_CUINIT != 0,
                "slow driver call"
            );
        } else {
            tracing::debug!(
                event = "driver_ioctl",
                pid = h.tgid,
                tid = h.tid,
                ioctl = %name,
                node = %node_path,
                result = %res,
                duration_seconds = secs,
                "driver call inside cuInit"
            );
        }
    }

    fn on_open(&mut self, e: &OpenEvent) {
        let h = &e.header;
        let path = cstr(&e.path);
        if e.flags & OPEN_LIBCUDA != 0 {
            match self
                .discovery
                .from_opened_path(&self.cfg.proc_root, h.tgid, &path)
            {
                Ok(Some(t)) => self.attach(t),
                Ok(None) => {}
                Err(err) => {
                    tracing::debug!(event = "libcuda_open", pid = h.tgid, path = %path, error = %format!("{err:#}"), "library opened but not resolvable")
                }
            }
            return;
        }
        if e.flags & OPEN_IN_CUINIT != 0 {
            if let Some(c) = self.cuinit.get_mut(&h.tid) {
                c.opens += 1;
                if e.ret < 0 {
                    let errno = crate::decode::errno::label((-e.ret) as u32);
                    c.last_failure = Some((format!("open {path}"), errno.clone()));
                    c.failed_opens.push((path.clone(), errno));
                }
            }
        }
        if e.ret < 0 {
            let errno = crate::decode::errno::label((-e.ret) as u32);
            let container = self
                .proc_info(h.tgid, &comm(h))
                .container_id
                .unwrap_or_default();
            let obs = Observations {
                pid: Some(h.tgid),
                failed_opens: vec![(path.clone(), errno.clone())],
                unavailable_probes: self.unavailable_probes(),
                ..Observations::default()
            };
            let findings = self.diagnose(&obs);
            let d = DiagnosisFields::of(&findings);
            tracing::warn!(
                diagnosis = %d.rules,
                diagnosis_title = %d.title,
                diagnosis_fix = %d.fix,
                runbook = %d.runbook,
                event = "device_open_failed",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                node = %nvidia::node_label(e.node, e.minor),
                path = %path,
                errno = %errno,
                container_id = %container,
                in_cuinit = e.flags & OPEN_IN_CUINIT != 0,
                "NVIDIA device open failed"
            );
            self.log_findings(&findings, h.tgid, "device_open_failed");
            if !self.sinks.is_empty() {
                let p = self.proc_info(h.tgid, &comm(h));
                self.emit(CallEvent::Open {
                    proc: &p,
                    tid: h.tid,
                    start_ns: e.start_ns,
                    end_ns: h.ts_ns,
                    path: &path,
                    errno: Some(&errno),
                    in_cuinit: e.flags & OPEN_IN_CUINIT != 0,
                });
            }
        } else {
            tracing::debug!(event = "device_open", pid = h.tgid, path = %path, fd = e.ret, "NVIDIA device opened");
            if !self.sinks.is_empty() {
                let p = self.proc_info(h.tgid, &comm(h));
                self.emit(CallEvent::Open {
                    proc: &p,
                    tid: h.tid,
                    start_ns: e.start_ns,
                    end_ns: h.ts_ns,
                    path: &path,
                    errno: None,
                    in_cuinit: e.flags & OPEN_IN_CUINIT != 0,
                });
            }
        }
    }

    /// A kprobed kernel/driver function failed: logged, and kept as a kernel-side signal
    /// of the thread's `cuInit` for the diagnosis rules.
    fn on_kfunc(&mut self, e: &KfuncEvent) {
        let h = &e.header;
        let func = crate::kernel::registry::kfunc_name(e.func);
        let res = if e.kind == result::ERRNO {
            format!("-{} ({})", e.code, crate::decode::errno::label(e.code))
        } else {
            nvidia::nv_status_label(e.code)
        };
        let signal = format!("{func} = {res}");
        if let Some(c) = self.cuinit.get_mut(&h.tid) {
            if c.kernel_signals.len() < 16 {
                c.kernel_signals.push(signal.clone());
            }
        }
        tracing::warn!(
            event = "kernel_signal",
            pid = h.tgid,
            tid = h.tid,
            comm = %comm(h),
            function = func,
            result = %res,
            in_uvm_ioctl = e.in_uvm_ioctl == 1,
            duration_seconds = h.ts_ns.saturating_sub(e.start_ns) as f64 / 1e9,
            "kernel function failed"
        );
    }

    /// Probes that are not attached, as `label: why`, for the rules' "could not check".
    fn unavailable_probes(&self) -> Vec<String> {
        self.kernel()
            .probe_states()
            .into_iter()
            .filter(|(_, st)| st.gauge() == 0)
            .map(|(spec, st)| format!("{}: {st}", spec.label))
            .collect()
    }

    /// Attaches or detaches the module kprobes when `nvidia_uvm` comes or goes.
    fn check_module(&mut self) {
        let changed = self.kernel().refresh_module();
        if let Some(loaded) = changed {
            tracing::info!(
                event = if loaded {
                    "module_loaded"
                } else {
                    "module_unloaded"
                },
                module = crate::kernel::registry::UVM_MODULE,
                "kprobes on the module's functions {}",
                if loaded { "attached" } else { "detached" }
            );
            self.refresh_probe_metrics();
        }
    }

    fn on_died(&mut self, e: &TaskEvent) {
        let h = &e.header;
        let mut what = Vec::new();
        if e.what & DIED_IN_CUINIT != 0 {
            what.push("cuInit".to_string());
            if self.cuinit.remove(&h.tid).is_some() {
                let wl = self.workload(h.tgid);
                let [e, n, p] = wl.metric_labels().map(|(_, v)| v);
                self.metrics.count_cuinit("thread_exited", [e, n, p]);
            }
        }
        if e.what & DIED_IN_IOCTL != 0 {
            what.push(nvidia::ioctl_display(e.node, e.aux));
        }
        let ended = self.detector.end_thread(h.tid);
        for c in &ended {
            tracing::warn!(
                event = "stall_end",
                call = %c.call,
                outcome = "thread_exited",
                pid = h.tgid,
                tid = h.tid,
                comm = %comm(h),
                "thread died inside a stalled call"
            );
        }
        if !self.sinks.is_empty() {
            let p = self.proc_info(h.tgid, &comm(h));
            for c in &ended {
                self.emit(CallEvent::StallEnd {
                    proc: &p,
                    tid: h.tid,
                    call: &c.call,
                    start_ns: c.key.start_ns,
                    end_ns: h.ts_ns,
                    outcome: "thread_exited",
                });
            }
        }
        if !ended.is_empty() {
            self.update_stalled_gauges();
        }
        tracing::info!(
            event = "died_in_call",
            pid = h.tgid,
            tid = h.tid,
            comm = %comm(h),
            calls = %what.join(" > "),
            "thread exited with a driver call in flight"
        );
    }

    // --- stalls --------------------------------------------------------------------------------

    fn snapshot(&mut self) -> Vec<InFlight> {
        let (cu, io) = {
            let k = self.kernel();
            (
                k.inflight_cuinit().unwrap_or_default(),
                k.inflight_ioctls().unwrap_or_default(),
            )
        };
        let now = clock::monotonic_ns();
        let calls = cu
            .into_iter()
            .map(|(tid, c)| {
                let name = "cuInit".to_string();
                (
                    tid,
                    c.tgid,
                    c.start_ns,
                    CallKind::Cuinit,
                    name.clone(),
                    name,
                )
            })
            .chain(io.into_iter().map(|(tid, i)| {
                (
                    tid,
                    i.tgid,
                    i.start_ns,
                    CallKind::Ioctl,
                    nvidia::ioctl_display(i.node, i.cmd),
                    nvidia::ioctl_label(i.node, i.cmd).to_string(),
                )
            }));
        let mut out = Vec::new();
        let mut dead = Vec::new();
        for (tid, tgid, start_ns, kind, call, label) in calls {
            // A thread that vanished without an exit event (e.g. before the agent started)
            // must not become a phantom stall.
            if now.saturating_sub(start_ns) > 1_000_000_000
                && !thread_alive(&self.cfg.proc_root, tgid, tid)
            {
                dead.push(tid);
                continue;
            }
            out.push(InFlight {
                key: CallKey {
                    kind,
                    tid,
                    start_ns,
                },
                tgid,
                call,
                label,
            });
        }
        if !dead.is_empty() {
            let mut k = self.kernel();
            for tid in dead {
                k.forget_thread(tid);
            }
        }
        out
    }

    fn scan(&mut self) {
        if !self.sinks.is_empty() {
            let kernel_drops = self
                .kernel()
                .counters()
                .map(|c| c[uvmwatch_common::counter::RINGBUF_DROPS as usize])
                .unwrap_or(0);
            let total = kernel_drops + self.metrics.user_drops.get();
            if total != self.dropped_seen {
                self.dropped_seen = total;
                self.emit(CallEvent::Dropped { total });
            }
        }
        let snap = self.snapshot();
        let now = clock::monotonic_ns();
        let cu_in_flight = snap
            .iter()
            .filter(|c| c.key.kind == CallKind::Cuinit)
            .count();
        self.metrics.cuinit_in_flight.set(cu_in_flight as i64);
        let r = self.detector.scan(&snap, now);
        for c in &r.new_stalls {
            let wl = self.workload(c.tgid);
            let [e, n, p] = wl.metric_labels().map(|(_, v)| v);
            self.metrics.count_stall(&c.label, [e, n, p]);
            self.report_stall(c, &snap, now);
        }
        for c in &r.vanished {
            tracing::warn!(
                event = "stall_end",
                call = %c.call,
                outcome = "ended",
                pid = c.tgid,
                tid = c.key.tid,
                "stalled call is no longer in flight (no exit event seen)"
            );
            if !self.sinks.is_empty() {
                let p = self.proc_info(c.tgid, "");
                self.emit(CallEvent::StallEnd {
                    proc: &p,
                    tid: c.key.tid,
                    call: &c.call,
                    start_ns: c.key.start_ns,
                    end_ns: now,
                    outcome: "ended",
                });
            }
        }
        if !r.new_stalls.is_empty() || !r.vanished.is_empty() {
            self.update_stalled_gauges();
        }
    }

    fn update_stalled_gauges(&self) {
        let now = self.detector.stalled_by_label();
        // Reset every series first so a label that dropped to 0 is exported as 0.
        self.metrics.stalled.reset();
        self.metrics.stalled.with_label_values(&["cuInit"]).set(0);
        for (label, n) in now {
            self.metrics.stalled.with_label_values(&[&label]).set(n);
        }
    }

    fn report_stall(&mut self, c: &InFlight, snap: &[InFlight], now: u64) {
        let age = now.saturating_sub(c.key.start_ns);
        let threshold = self.detector.threshold_ns(c.key.kind);
        let late_ms = age.saturating_sub(threshold) as f64 / 1e6;
        let info = procfs::read_thread(&self.cfg.proc_root, c.tgid, c.key.tid).ok();
        // The driver call the thread is inside (for a cuInit stall), with its age.
        let inner = snap
            .iter()
            .find(|o| o.key.kind == CallKind::Ioctl && o.key.tid == c.key.tid);
        let node = {
            let k = self.kernel();
            k.inflight_ioctls()
                .unwrap_or_default()
                .into_iter()
                .find(|(tid, _)| *tid == c.key.tid)
                .map(|(_, i)| nvidia::node_path(i.node, i.minor))
                .unwrap_or_default()
        };
        let inside = inner
            .map(|i| format!("{} on {}", i.call, node))
            .unwrap_or_default();
        let inside_age = inner
            .map(|i| now.saturating_sub(i.key.start_ns) as f64 / 1e9)
            .unwrap_or(0.0);
        let (comm, state, wchan, exe, container, stack) = match &info {
            Some(t) => (
                t.comm.clone(),
                format!("{} ({})", t.state, t.state_name),
                t.wchan.clone().unwrap_or_default(),
                t.exe
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                t.container_id.clone().unwrap_or_default(),
                t.kernel_stack
                    .as_ref()
                    .map(|s| s.join(" < "))
                    .unwrap_or_default(),
            ),
            None => Default::default(),
        };
        let what = match c.key.kind {
            CallKind::Cuinit => "cuInit",
            CallKind::Ioctl => "driver ioctl",
        };
        // What the probes saw for this thread, for the diagnosis rules.
        let stuck = match c.key.kind {
            CallKind::Ioctl => Some((c.call.clone(), age)),
            CallKind::Cuinit => inner.map(|i| (i.call.clone(), now.saturating_sub(i.key.start_ns))),
        };
        let in_cuinit = c.key.kind == CallKind::Cuinit
            || snap
                .iter()
                .any(|o| o.key.kind == CallKind::Cuinit && o.key.tid == c.key.tid);
        let cu_age = snap
            .iter()
            .find(|o| o.key.kind == CallKind::Cuinit && o.key.tid == c.key.tid)
            .map(|o| now.saturating_sub(o.key.start_ns) as f64 / 1e9);
        let call_state = self.cuinit.get(&c.key.tid);
        let obs = Observations {
            pid: Some(c.tgid),
            cuinit_in_flight: in_cuinit,
            cuinit_seconds: cu_age,
            stuck_in: stuck.map(|(call, ns)| SeenCall {
                call,
                node: node.clone(),
                result: String::new(),
                seconds: ns as f64 / 1e9,
            }),
            stuck_wchan: info.as_ref().and_then(|t| t.wchan.clone()),
            stuck_state: info
                .as_ref()
                .map(|t| format!("{} ({})", t.state, t.state_name)),
            stuck_stack: info
                .as_ref()
                .and_then(|t| t.kernel_stack.clone())
                .unwrap_or_default(),
            failed_call: call_state.and_then(|s| s.failed_call.clone()),
            failed_opens: call_state
                .map(|s| s.failed_opens.clone())
                .unwrap_or_default(),
            device_opens: call_state.map(|s| s.opens).unwrap_or(0),
            forked_after_parent_init: call_state
                .map(|s| s.forked_from != 0 && self.initialized.contains(&s.forked_from))
                .unwrap_or(false),
            kernel_signals: call_state
                .map(|s| s.kernel_signals.clone())
                .unwrap_or_default(),
            unavailable_probes: self.unavailable_probes(),
            ..Observations::default()
        };
        let findings = self.diagnose(&obs);
        let d = DiagnosisFields::of(&findings);
        let wl = self.workload(c.tgid);
        tracing::error!(
            engine = wl.engine.as_deref().unwrap_or(""),
            model = wl.model.as_deref().unwrap_or(""),
            pod = wl.k8s_pod_name.as_deref().unwrap_or(""),
            namespace = wl.k8s_namespace.as_deref().unwrap_or(""),
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
            event = "stall",
            call = %c.call,
            kind = what,
            pid = c.tgid,
            tid = c.key.tid,
            comm = %comm,
            exe = %exe,
            container_id = %container,
            age_seconds = age as f64 / 1e9,
            threshold_seconds = threshold as f64 / 1e9,
            detect_delay_ms = late_ms,
            inside = %inside,
            inside_age_seconds = inside_age,
            node = %node,
            thread_state = %state,
            wchan = %wchan,
            kernel_stack = %stack,
            "call stalled"
        );
        if !self.sinks.is_empty() {
            let p = self.proc_info(c.tgid, &comm);
            self.emit(CallEvent::Stall {
                proc: &p,
                tid: c.key.tid,
                call: &c.call,
                start_ns: c.key.start_ns,
                detected_ns: now,
                inside: &inside,
                thread_state: &state,
                wchan: &wchan,
            });
        }
        self.log_findings(&findings, c.tgid, "stall");
    }

    // --- diagnosis -----------------------------------------------------------------------------

    /// Runs the rules on the current evidence and `obs`, and marks the findings active in
    /// `uvmwatch_diagnosis` for the configured time.
    fn diagnose(&mut self, obs: &Observations) -> Vec<Finding> {
        let findings = rules::diagnose(&self.evidence, obs);
        let until = clock::monotonic_ns() + self.cfg.diagnosis_ttl.as_nanos() as u64;
        for f in &findings {
            self.incident_findings
                .insert((f.rule.clone(), f.severity), until);
        }
        if !findings.is_empty() {
            self.update_diagnosis_gauge();
        }
        findings
    }

    /// One `event="diagnosis"` record per finding, with its evidence and fix in full.
    fn log_findings(&mut self, findings: &[Finding], pid: u32, trigger: &str) {
        if !self.sinks.is_empty() && !findings.is_empty() {
            let p = self.proc_info(pid, "");
            let now = clock::monotonic_ns();
            for f in findings {
                self.emit(CallEvent::Diagnosis {
                    proc: &p,
                    tid: pid,
                    ts_ns: now,
                    finding: f,
                });
            }
        }
        for f in findings {
            let evidence: Vec<String> = f
                .evidence
                .iter()
                .map(|e| format!("{}={} [{}]", e.what, e.value, e.source))
                .collect();
            let fix: Vec<String> = f
                .fix
                .iter()
                .enumerate()
                .map(|(i, st)| format!("({}) {}", i + 1, fix_line(st)))
                .collect();
            tracing::warn!(
                event = "diagnosis",
                trigger,
                pid,
                rule = %f.rule,
                severity = f.severity.as_str(),
                confidence = ?f.confidence,
                title = %f.title,
                evidence = %evidence.join("; "),
                unchecked = %f.unchecked.join("; "),
                fix = %fix.join(" "),
                runbook = %f.runbook,
                "diagnosis"
            );
        }
    }

    /// Re-evaluates the rules on the evidence alone (no process observed).
    fn evaluate_static(&mut self) {
        self.static_findings = rules::diagnose(&self.evidence, &Observations::default());
        for f in &self.static_findings {
            tracing::info!(
                event = "diagnosis",
                trigger = "evidence",
                rule = %f.rule,
                severity = f.severity.as_str(),
                title = %f.title,
                runbook = %f.runbook,
                "finding from the host's state"
            );
        }
        self.update_diagnosis_gauge();
    }

    /// Takes new evidence from the background reader; re-evaluates when it changed.
    fn new_evidence(&mut self, e: Evidence) {
        if e != self.evidence {
            self.evidence = e;
            tracing::debug!(event = "evidence_changed", "diagnosis facts changed");
            self.evaluate_static();
        }
    }

    /// `uvmwatch_diagnosis{rule,severity}`: 1 for static findings and unexpired incident
    /// findings, 0 for those that expired (so an alert sees them resolve).
    fn update_diagnosis_gauge(&mut self) {
        let now = clock::monotonic_ns();
        let mut expired = Vec::new();
        for (k, until) in &self.incident_findings {
            if *until <= now {
                expired.push(k.clone());
            }
        }
        for k in &expired {
            self.incident_findings.remove(k);
        }
        let mut active: HashSet<(String, Severity)> =
            self.incident_findings.keys().cloned().collect();
        for f in &self.static_findings {
            active.insert((f.rule.clone(), f.severity));
        }
        for (rule, sev) in &expired {
            if !active.contains(&(rule.clone(), *sev)) {
                self.metrics
                    .diagnosis
                    .with_label_values(&[rule.as_str(), sev.as_str()])
                    .set(0);
            }
        }
        for (rule, sev) in &active {
            self.metrics
                .diagnosis
                .with_label_values(&[rule.as_str(), sev.as_str()])
                .set(1);
        }
    }

    fn sweep(&mut self) {
        let root = self.cfg.proc_root.clone();
        let removed = self
            .kernel()
            .sweep(|tgid| root.join(tgid.to_string()).exists())
            .unwrap_or(0);
        if removed > 0 {
            tracing::debug!(event = "sweep", removed, "stale fd entries removed");
        }
    }
}

/// A fix step as one line: `[host] cmd; cmd (note)`.
fn fix_line(step: &crate::doctor::finding::FixStep) -> String {
    let w = match step.where_ {
        Where::Host => "host",
        Where::Container => "container",
        Where::Any => "any",
    };
    if step.commands.is_empty() {
        format!("[{w}] {}", step.note)
    } else {
        format!("[{w}] {}", step.commands.join("; "))
    }
}

/// The diagnosis summary fields added to a stall / failure record.
struct DiagnosisFields {
    /// Rule ids, worst first, comma separated (empty when none).
    rules: String,
    /// Title of the worst finding.
    title: String,
    /// Fix steps of the worst finding.
    fix: String,
    /// Runbook of the worst finding.
    runbook: String,
}

impl DiagnosisFields {
    fn of(findings: &[Finding]) -> Self {
        let worst = findings.first();
        DiagnosisFields {
            rules: findings
                .iter()
                .map(|f| f.rule.as_str())
                .collect::<Vec<_>>()
                .join(","),
            title: worst.map(|f| f.title.clone()).unwrap_or_default(),
            fix: worst
                .map(|f| {
                    f.fix
                        .iter()
                        .enumerate()
                        .map(|(i, st)| format!("({}) {}", i + 1, fix_line(st)))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default(),
            runbook: worst.map(|f| f.runbook.clone()).unwrap_or_default(),
        }
    }
}

fn thread_alive(proc_root: &Path, tgid: u32, tid: u32) -> bool {
    proc_root
        .join(tgid.to_string())
        .join("task")
        .join(tid.to_string())
        .exists()
}

fn drain(rb: &mut RingBuf<MapData>, core: &mut Core) {
    while let Some(item) = rb.next() {
        match record::decode(&item) {
            Ok(ev) => core.handle(ev),
            Err(e) => {
                core.metrics.user_drops.inc();
                tracing::debug!(error = %e, "undecodable record");
            }
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM. Everything attached is detached on return.
///
/// # Errors
/// Not root, the eBPF object cannot load, or the listen address is taken.
pub async fn run(cfg: RunConfig, sinks: Vec<Box<dyn Sink>>) -> Result<()> {
    let metrics = Metrics::with_workload_labels(cfg.workload_labels)?;
    let slow = cfg.slow_ioctl.min(cfg.ioctl_stall);
    let kernel = Kernel::load(&KernelSettings {
        slow_ioctl_ns: slow.as_nanos() as u64,
    })?;
    let listener = match cfg.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr} (choose another with --listen)"))?,
        ),
        None => None,
    };
    let local = match &listener {
        Some(l) => l.local_addr()?.to_string(),
        None => "none".to_string(),
    };
    let kernel = Arc::new(Mutex::new(kernel));
    let events = kernel.lock().unwrap().take_events()?;
    metrics.registry.register(Box::new(KernelCollector::new(
        Arc::downgrade(&kernel),
        metrics.user_drops.clone(),
    )?))?;

    // The agent observes: it never opens GPU nodes itself to collect evidence.
    let (_evidence_tmp, evidence_root) = match &cfg.evidence_root {
        Some(p) => {
            let (tmp, r) = crate::doctor::bundle::open_bundle(p)
                .with_context(|| format!("--evidence-root {}", p.display()))?;
            (tmp, r)
        }
        None => (None, Root::observer(cfg.host_root.as_deref())),
    };
    let evidence = collect::collect(&evidence_root);
    let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel::<Evidence>();
    {
        let root = evidence_root.clone();
        let every = cfg.evidence_refresh;
        std::thread::Builder::new()
            .name("uvmwatch-evidence".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                if ev_tx.send(collect::collect(&root)).is_err() {
                    break;
                }
            })
            .context("starting the evidence reader")?;
    }
    let mut core = Core {
        cfg: cfg.clone(),
        kernel: kernel.clone(),
        metrics: metrics.clone(),
        discovery: Discovery::new(),
        detector: StallDetector::new(cfg.cuinit_stall, cfg.ioctl_stall),
        cuinit: HashMap::new(),
        evidence,
        static_findings: Vec::new(),
        incident_findings: HashMap::new(),
        initialized: HashSet::new(),
        sinks,
        procs: HashMap::new(),
        workloads: HashMap::new(),
        dropped_seen: 0,
    };
    core.evaluate_static();
    core.update_stalled_gauges();
    core.discover_initial();
    core.seed_fds();
    core.refresh_probe_metrics();
    {
        let rows = kernel.lock().unwrap().probe_states();
        for (spec, st) in &rows {
            tracing::debug!(probe = spec.label, state = %st, "probe");
        }
        let attached = rows.iter().filter(|(_, s)| s.gauge() == 1).count();
        tracing::info!(
            event = "started",
            listen = %local,
            probes_attached = attached,
            probes_total = rows.len(),
            libcuda_targets = kernel.lock().unwrap().libcuda_targets(),
            cuinit_stall_seconds = cfg.cuinit_stall.as_secs_f64(),
            ioctl_stall_seconds = cfg.ioctl_stall.as_secs_f64(),
            "uvmwatch agent running"
        );
    }

    let heartbeat = Arc::new(AtomicU64::new(clock::monotonic_ns()));
    let server = listener.map(|l| tokio::spawn(http::serve(l, metrics.clone(), heartbeat.clone())));
    let deadline = async {
        match cfg.stop_after {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(deadline);

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut scan = tokio::time::interval(stall::SCAN_INTERVAL);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sweep = tokio::time::interval(Duration::from_secs(10));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);

    // SAFETY: the AsyncFd owns the ring buffer, so its fd stays open while registered.
    let mut ticks: u64 = 0;
    let mut afd = unsafe { AsyncFd::register(events) }
        .map_err(|e| anyhow::anyhow!("registering the ring buffer fd: {e}"))?;
    let why = loop {
        tokio::select! {
            guard = afd.readable_mut() => {
                let mut guard = guard?;
                drain(guard.get_inner_mut(), &mut core);
                guard.clear_ready();
            }
            _ = scan.tick() => {
                // Events first, so a call that just returned is not mistaken for a vanished one.
                drain(afd.get_mut(), &mut core);
                core.scan();
                ticks += 1;
                if ticks.is_multiple_of(20) {
                    core.check_module();
                }
                heartbeat.store(clock::monotonic_ns(), Ordering::Relaxed);
            }
            _ = sweep.tick() => {
                core.sweep();
                core.update_diagnosis_gauge();
            }
            Some(e) = ev_rx.recv() => core.new_evidence(e),
            _ = &mut deadline => break "duration",
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
        }
    };
    if let Some(server) = server {
        server.abort();
        let _ = server.await;
    }
    // Events that arrived last, then the sinks write out what they hold.
    drain(afd.get_mut(), &mut core);
    for s in core.sinks.iter_mut() {
        s.flush();
    }
    drop(afd);
    drop(core);
    // Last reference: dropping the Kernel detaches every link and unloads the programs.
    match Arc::try_unwrap(kernel) {
        Ok(k) => drop(k.into_inner()),
        Err(_) => tracing::warn!("kernel handle still shared at exit"),
    }
    tracing::info!(
        event = "stopped",
        signal = why,
        "probes detached, agent stopped"
    );
    Ok(())
}

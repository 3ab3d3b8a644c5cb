//! Live diagnosis: the doctor's one engine (`doctor::engine`) on the host's facts plus what
//! the probes saw, so that the agent and `uvmwatch doctor` give the same differential on the
//! same evidence.
//!
//! The facts ([`Evidence`]) are read at start and every `--evidence-refresh` in a thread of
//! their own (`uvmwatch-evidence`), from this machine, below `--host-root`, or from a
//! snapshot (`--evidence-root`); the agent never opens GPU nodes to read them. The engine on
//! the facts alone runs at start and whenever the facts change ("static" findings: the
//! host's recorded symptom and its causes, or its hazards; trigger `evidence`). A failed
//! `cuInit`, a failed device open, a stall, a failed context creation or `cuDeviceGetCount`,
//! and a device count below the GPUs the process has are diagnosed with what the probes saw
//! of that process ([`observations`]): the differential's findings ride on that event and
//! stay active in `uvmwatch_diagnosis` for `--diagnosis-ttl`.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::{mpsc, Arc},
    time::Duration,
};

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::{
    doctor::{
        bundle, collect,
        engine::{self, Differential},
        facts::{Evidence, Observations, SeenCall},
        finding::{Finding, Severity, Standing},
        root::Root,
        signal,
    },
    event::{ActiveFindings, CallKind, Event, Kind, Trigger},
    kernel::registry::AbsenceFacts,
};

/// A cause, its severity and its standing: the labels of `uvmwatch_diagnosis`.
type Key = (String, Severity, Standing);

/// The live diagnosis state.
pub struct Diagnosis {
    evidence: Evidence,
    /// New facts from the reader thread.
    refreshed: mpsc::Receiver<Evidence>,
    /// Keeps an unpacked `--evidence-root` bundle alive.
    _snapshot: Option<TempDir>,
    ttl_ns: u64,
    /// Findings from the facts alone.
    static_findings: Vec<Arc<Finding>>,
    /// Findings from incidents: key -> expiry (monotonic ns).
    incidents: HashMap<Key, u64>,
    /// What `uvmwatch_diagnosis` shows at 1 now.
    active: BTreeSet<Key>,
}

/// Where the facts come from.
#[derive(Clone, Debug)]
pub enum FactsFrom {
    /// This machine (below a host root when the agent runs in a container).
    Live { host_root: Option<PathBuf> },
    /// A snapshot directory or bundle (`--evidence-root`).
    Snapshot(PathBuf),
}

impl Diagnosis {
    /// Reads the facts once and starts the reader thread (every `refresh`). Findings that
    /// stay active after an incident: `ttl`.
    ///
    /// # Errors
    /// The snapshot cannot be opened, or the thread cannot start.
    pub fn start(from: &FactsFrom, refresh: Duration, ttl: Duration) -> Result<Diagnosis> {
        let (snapshot, root) = match from {
            FactsFrom::Snapshot(p) => bundle::open_bundle(p)
                .with_context(|| format!("--evidence-root {}", p.display()))?,
            // The agent observes: it never opens GPU nodes itself to collect evidence.
            FactsFrom::Live { host_root } => (None, Root::observer(host_root.as_deref())),
        };
        let evidence = collect::collect(&root);
        let (tx, refreshed) = mpsc::channel();
        std::thread::Builder::new()
            .name("uvmwatch-evidence".into())
            .spawn(move || loop {
                std::thread::sleep(refresh);
                if tx.send(collect::collect(&root)).is_err() {
                    break;
                }
            })
            .context("starting the evidence reader")?;
        Ok(Diagnosis {
            evidence,
            refreshed,
            _snapshot: snapshot,
            ttl_ns: ttl.as_nanos() as u64,
            static_findings: Vec::new(),
            incidents: HashMap::new(),
            active: BTreeSet::new(),
        })
    }

    /// The findings from the facts alone, as `Diagnosis` events (trigger `evidence`), after
    /// (re-)evaluating them. Call at start, and when [`Diagnosis::refresh`] says the facts
    /// changed.
    pub fn static_findings(&mut self, now_ns: u64) -> Vec<Event> {
        let d = Arc::new(engine::diagnose(&self.evidence, &Observations::default()));
        self.static_findings = d.all_findings().cloned().map(Arc::new).collect();
        self.static_findings
            .iter()
            .map(|f| {
                Event::agent(
                    now_ns,
                    Kind::Diagnosis(crate::event::Diagnosis {
                        finding: f.clone(),
                        trigger: Trigger::Evidence,
                        differential: d.clone(),
                    }),
                )
            })
            .collect()
    }

    /// The driver's version file as the facts have it (for the snapshot's ioctl layouts).
    pub fn driver(&self) -> Result<crate::host::driver::DriverInfo, String> {
        let f = &self.evidence.driver;
        f.value
            .clone()
            .map_err(|u| format!("{}: {}", f.source, u.why))
    }

    /// Whether a device count `cuDeviceGetCount` returned is below the GPUs the process has
    /// (`gpu_nodes` in its root, else the MIG devices and GPUs the facts list, at most the
    /// entries of `CUDA_VISIBLE_DEVICES`; see
    /// [`signal::device_count_disagrees`]): such a count is diagnosed.
    pub fn device_count_disagrees(
        &self,
        count: i32,
        gpu_nodes: Option<u32>,
        cuda_visible_devices: Option<&str>,
    ) -> bool {
        signal::device_count_disagrees(
            self.evidence.smi.get(),
            gpu_nodes,
            cuda_visible_devices,
            count,
        )
        .is_some()
    }

    /// Takes facts the reader thread sent; `true` when they differ from the current ones.
    pub fn refresh(&mut self) -> bool {
        let mut changed = false;
        while let Ok(e) = self.refreshed.try_recv() {
            if e != self.evidence {
                self.evidence = e;
                changed = true;
            }
        }
        changed
    }

    /// Diagnoses an event that can have a cause (a failed `cuInit`, a slow successful one
    /// that did not stall, a failed open, a stall): the engine's differential of what the
    /// probes saw of its process, whose symptom is then this event; its findings are
    /// attached to the event and kept active for the TTL, and the differential is returned
    /// for the per-finding records. `unavailable` lists the probes not attached (`label:
    /// why`), for what the causes could not check.
    pub fn diagnose_event(
        &mut self,
        ev: &mut Event,
        unavailable: impl FnOnce() -> Vec<String>,
    ) -> Option<Arc<Differential>> {
        if let Kind::CuinitEnd(c) = &ev.kind {
            let secs = ev.ts_ns.saturating_sub(c.start_ns) as f64 / 1e9;
            // A success is judged only when it may be slow, in all or in its first GPU
            // open (and its stall, if it had one, was judged already).
            let slow_open = c
                .call
                .first_gpu_open_seconds
                .is_some_and(|s| s >= signal::SLOW_FIRST_OPEN_SECONDS);
            if c.code == 0
                && (c.call.stalled || (secs < signal::SLOW_INIT_BASE_SECONDS && !slow_open))
            {
                return None;
            }
        }
        let obs = observations(ev, unavailable)?;
        let d = engine::diagnose(&self.evidence, &obs);
        // No symptom of this process (an open that failed for a reason the probes could
        // not tell, say): nothing to attach; the host's own state is the static findings'.
        d.symptom.as_ref()?;
        let findings: Vec<Arc<Finding>> = d.findings.iter().cloned().map(Arc::new).collect();
        let until = ev.ts_ns + self.ttl_ns;
        for f in &findings {
            self.incidents
                .insert((f.rule.as_str().to_string(), f.severity, f.standing), until);
        }
        match &mut ev.kind {
            Kind::CuinitEnd(c) => c.findings = findings,
            Kind::Open(o) => o.findings = findings,
            Kind::Stall(s) => s.findings = findings,
            Kind::ContextCall(c) => c.findings = findings,
            _ => {}
        }
        Some(Arc::new(d))
    }

    /// The findings active now (static ones, and incidents within their TTL) when that set
    /// changed since the last call, with those that cleared.
    pub fn active(&mut self, now_ns: u64) -> Option<ActiveFindings> {
        self.incidents.retain(|_, until| *until > now_ns);
        let now: BTreeSet<Key> = self
            .incidents
            .keys()
            .cloned()
            .chain(
                self.static_findings
                    .iter()
                    .map(|f| (f.rule.as_str().to_string(), f.severity, f.standing)),
            )
            .collect();
        if now == self.active {
            return None;
        }
        let cleared = self.active.difference(&now).cloned().collect();
        self.active = now;
        Some(ActiveFindings {
            active: self.active.iter().cloned().collect(),
            cleared,
        })
    }
}

/// What the probes saw of the process an event is about, for the rules: for a `cuInit`
/// that returned (whatever its result), a failed device open, a stall, a failed context
/// creation or `cuDeviceGetCount`, and a device count below the GPUs the process has (`None` for other
/// events). `unavailable` gives the probes that are not attached.
pub fn observations(ev: &Event, unavailable: impl FnOnce() -> Vec<String>) -> Option<Observations> {
    let pid = ev.pid();
    let obs = match &ev.kind {
        Kind::CuinitEnd(c) => Observations {
            pid,
            cuinit_result: Some(c.code),
            cuinit_seconds: Some(ev.ts_ns.saturating_sub(c.start_ns) as f64 / 1e9),
            failed_call: c.call.failed_call.clone(),
            failed_opens: c.call.failed_opens.clone(),
            device_opens: c.call.device_opens,
            forked_after_parent_init: c.call.forked_after_parent_init,
            kernel_signals: c.call.kernel_signals.clone(),
            first_gpu_open_seconds: c.call.first_gpu_open_seconds,
            ..Observations::default()
        },
        Kind::Open(o) => Observations {
            pid,
            failed_opens: vec![(o.path.clone(), o.errno.clone()?)],
            ..Observations::default()
        },
        Kind::Stall(s) => {
            let stuck = match s.kind {
                CallKind::Ioctl => Some((s.call.clone(), s.start_ns)),
                CallKind::Cuinit => s.inside.as_ref().map(|i| (i.call.clone(), i.start_ns)),
            };
            let call = s.call_so_far.clone().unwrap_or_default();
            let t = &s.thread;
            Observations {
                pid,
                cuinit_in_flight: s.cuinit_start_ns.is_some(),
                cuinit_seconds: s
                    .cuinit_start_ns
                    .map(|c| ev.ts_ns.saturating_sub(c) as f64 / 1e9),
                stuck_in: stuck.map(|(call, start)| SeenCall {
                    call,
                    node: s.node.clone(),
                    result: String::new(),
                    seconds: ev.ts_ns.saturating_sub(start) as f64 / 1e9,
                }),
                stuck_tid: Some(ev.tid),
                stuck_wchan: (!t.wchan.is_empty()).then(|| t.wchan.clone()),
                stuck_state: t.read.then(|| t.state.clone()),
                stuck_stack: t.stack.clone(),
                failed_call: call.failed_call,
                failed_opens: call.failed_opens,
                device_opens: call.device_opens,
                forked_after_parent_init: call.forked_after_parent_init,
                kernel_signals: call.kernel_signals,
                first_gpu_open_seconds: call.first_gpu_open_seconds,
                ..Observations::default()
            }
        }
        Kind::ContextCall(c) if c.failed() || c.count_disagrees => Observations {
            pid,
            // Every driver API call but cuInit returns CUDA_ERROR_NOT_INITIALIZED (or
            // _DEINITIALIZED) until a cuInit succeeded: any other result says it had.
            cuinit_result: (c.cuinit_succeeded || !matches!(c.code, 3 | 4)).then_some(0),
            context_call: Some(c.call.to_string()),
            context_result: Some(c.code),
            context_seconds: Some(ev.ts_ns.saturating_sub(c.start_ns) as f64 / 1e9),
            context_device: c.device,
            device_count_seen: c.count.or(c.device_count_seen),
            gpu_nodes_visible: c.gpu_nodes,
            cuda_visible_devices: c.cuda_visible_devices.clone(),
            ..Observations::default()
        },
        _ => return None,
    };
    Some(Observations {
        unavailable_probes: unavailable(),
        ..obs
    })
}

/// The trigger of the findings an event carries.
pub fn trigger_of(ev: &Event) -> Option<Trigger> {
    match &ev.kind {
        Kind::CuinitEnd(_) => Some(Trigger::CuinitEnd),
        Kind::Open(_) => Some(Trigger::DeviceOpenFailed),
        Kind::Stall(_) => Some(Trigger::Stall),
        Kind::ContextCall(c) if c.failed() => Some(Trigger::ContextCall),
        Kind::ContextCall(_) => Some(Trigger::DeviceCount),
        _ => None,
    }
}

/// The host's facts for [`crate::kernel::registry::absence_reason`] (the kernel side's
/// [`crate::kernel::KernelSettings::absence_facts`]): `CONFIG_DEVICE_PRIVATE` from the
/// kernel's configuration, the driver's version from `/proc/driver/nvidia/version`.
pub fn probe_absence_facts() -> AbsenceFacts {
    let root = crate::doctor::root::Root::live(None);
    let config = crate::doctor::collect::kernel::kernel_config_of(&root);
    let driver = crate::host::driver::read_version_file(None)
        .ok()
        .map(|d| d.version);
    match config.value {
        Ok(c) => AbsenceFacts {
            device_private: Some(c.get("CONFIG_DEVICE_PRIVATE").is_some_and(|v| v == "y")),
            config_source: config.source,
            driver,
        },
        Err(why) => AbsenceFacts {
            device_private: None,
            config_source: why.why,
            driver,
        },
    }
}

#[cfg(test)]
mod tests {
    //! The live agent and `uvmwatch doctor` give the same differential on the same
    //! evidence: each event's findings, as the agent attaches them, against the doctor's on
    //! the same facts with that event's observations written as a snapshot's
    //! `observations.json` and read back.

    use std::path::Path;

    use super::*;
    use crate::doctor::{bundle, observed::ObservationsSource};
    use crate::event::testing as mk;

    /// The doctor's differential of `facts` with `o` saved as the snapshot's file.
    fn doctor(facts: &Path, o: &Observations) -> Differential {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("snap");
        copy(facts, &root);
        std::fs::write(
            root.join("observations.json"),
            bundle::observations_json(o).unwrap(),
        )
        .unwrap();
        let saved = bundle::read_saved_observations(&root).transpose();
        let (judged, _) = ObservationsSource::choose(None, saved);
        let evidence = collect::collect(&Root::Snapshot(root));
        engine::diagnose(&evidence, &judged)
    }

    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let t = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &t);
            } else {
                std::fs::copy(e.path(), t).unwrap();
            }
        }
    }

    #[test]
    fn the_live_agent_and_the_doctor_give_the_same_causes_on_the_same_evidence() {
        let facts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbed/fixtures/incident-host");
        let mut live = Diagnosis::start(
            &FactsFrom::Snapshot(facts.clone()),
            Duration::from_secs(3600),
            Duration::from_secs(600),
        )
        .unwrap();
        let p = mk::process();
        let s = 1_000_000_000;
        let mut failed = mk::cuinit_end(&p, p.pid, s, 2 * s, 3, "CUDA_ERROR_NOT_INITIALIZED");
        if let Kind::CuinitEnd(c) = &mut failed.kind {
            c.call.device_opens = 4;
            c.call.failed_call = Some(SeenCall {
                call: "UVM_REGISTER_GPU".into(),
                node: "/dev/nvidia-uvm".into(),
                result: "NV_ERR_NO_MEMORY".into(),
                seconds: 0.05,
            });
        }
        let events = [
            failed,
            mk::open(
                &p,
                p.pid,
                s,
                s + 1000,
                "/dev/nvidia-uvm",
                Some("EPERM"),
                false,
            ),
            mk::context_call(
                &p,
                p.pid,
                s,
                s + 1000,
                "cuCtxCreate_v2",
                46,
                "CUDA_ERROR_DEVICE_UNAVAILABLE",
                None,
            ),
            mk::stall(
                &p,
                p.pid,
                "UVM_REGISTER_GPU",
                s,
                6 * s,
                Some(("UVM_REGISTER_GPU", "/dev/nvidia-uvm")),
                "D (disk sleep)",
                "uvm_gpu_retain_by_uuid",
            ),
        ];
        let mut named = Vec::new();
        for mut ev in events {
            let obs = observations(&ev, Vec::new).expect("an event the engine judges");
            let d = live
                .diagnose_event(&mut ev, Vec::new)
                .expect("a symptom of the process");
            let attached: Vec<Finding> = ev.findings().iter().map(|f| (**f).clone()).collect();
            assert_eq!(attached, d.findings);
            let offline = doctor(&facts, &obs);
            assert_eq!(offline.symptom, d.symptom, "{:?}", ev.kind);
            assert_eq!(offline.findings, d.findings, "{:?}", ev.kind);
            assert_eq!(offline.ruled_out, d.ruled_out, "{:?}", ev.kind);
            named.push(d.findings[0].rule);
        }
        use crate::doctor::cause::CauseId::*;
        assert_eq!(
            named,
            [
                HmmSetupFailure,
                DevicePermission,
                UnexplainedFailure,
                HmmSetupFailure
            ],
            "the causes named"
        );
    }
}

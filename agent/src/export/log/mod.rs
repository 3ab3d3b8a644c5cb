//! The agent's log: one record per event, written through `tracing` (JSON lines for
//! machines, text for people; the subscriber is set up by [`init`]).
//!
//! Every record the agent writes about what it observed comes from here, one callsite per
//! kind of record, with the target [`TARGET`] and an `event` field naming the kind. The
//! fields of each are the stable JSON schema ([`schema`], `docs/log-schema.md`); the text
//! format shows the ones that matter to a person ([`text`]).

pub mod schema;
pub mod text;

use std::sync::Arc;

use crate::{
    doctor::finding::Finding,
    event::{
        CallKind, ContextCall, CuinitEnd, Diagnosis, Event, Ioctl, Kind, Open, Stall, StallEnd,
        StallOutcome, Started, Trigger,
    },
};

/// The target of every event record (users filter on it: `--log-level uvmwatch::agent=debug`).
pub const TARGET: &str = "uvmwatch::agent";

/// How records are written.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line, every field (the stable schema).
    Json,
    /// One line per record for a terminal: the fields that matter, no empty ones; a
    /// finding's fix printed once per process and rule.
    Text,
}

/// Sets up the process's log: `format`, the `tracing` filter `level` (invalid filters fall
/// back to `info` with a message), and colours on a terminal. Records go to stderr.
pub fn init(format: Format, level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|e| {
        eprintln!("uvmwatch: bad --log-level {level:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        Format::Json => b.json().flatten_event(true).with_current_span(false).init(),
        Format::Text => b
            .with_ansi(std::io::stderr().is_terminal())
            .event_format(text::Compact)
            .init(),
    }
}

/// The log as a listener of the observer's events.
pub struct LogListener {
    format: Format,
    /// What the text format has shown already (findings per process and rule).
    seen: text::Seen,
    /// The probe table was logged (once, at start, at debug level).
    probes_logged: bool,
    /// Features said to be off (each once, at WARN, until it comes back on).
    features_off: std::collections::BTreeSet<&'static str>,
}

impl LogListener {
    /// A listener writing in `format` (which must be the format given to [`init`]).
    pub fn new(format: Format) -> LogListener {
        LogListener::with_repeat_window(format, text::REPEAT_WINDOW)
    }

    /// Like [`LogListener::new`], summing up repeated failures every `window`.
    pub fn with_repeat_window(format: Format, window: std::time::Duration) -> LogListener {
        LogListener {
            format,
            seen: text::Seen::with_window(window),
            probes_logged: false,
            features_off: Default::default(),
        }
    }
}

impl crate::event::Listener for LogListener {
    fn event(&mut self, ev: &Arc<Event>) {
        let pid = ev.pid().unwrap_or(0);
        let tid = ev.tid;
        let comm = ev.comm.as_str();
        match &ev.kind {
            Kind::CuinitStart { flags, late, .. } => {
                let p = ev.process.as_deref().cloned().unwrap_or_default();
                let w = &p.workload;
                tracing::info!(
                    target: TARGET,
                    event = "cuinit_start",
                    pid,
                    tid,
                    engine = w.engine.as_deref().unwrap_or(""),
                    model = w.model.as_deref().unwrap_or(""),
                    quantization = w.quantization.as_deref().unwrap_or(""),
                    tp_rank = w.tp_rank.map(|r| r.to_string()).unwrap_or_default(),
                    pod = w.k8s_pod_name.as_deref().unwrap_or(""),
                    namespace = w.k8s_namespace.as_deref().unwrap_or(""),
                    comm = %comm,
                    exe = %p.exe,
                    flags = *flags,
                    late = *late,
                    "cuInit entered"
                );
            }
            Kind::CuinitEnd(c) => self.cuinit_end(ev, c),
            Kind::Ioctl(io) => {
                if !io.failed
                    || io.in_cuinit
                    || self.print_failure(ev, &format!("{} on {}", io.name, io.node), &io.result)
                {
                    ioctl(ev, io);
                }
            }
            Kind::Open(o) => self.open(ev, o),
            Kind::ContextCall(c) => self.context_call(ev, c),
            Kind::KernelSignal(s) if !self.print_failure(ev, s.function, &s.result) => {}
            Kind::KernelSignal(s) => tracing::warn!(
                target: TARGET,
                event = "kernel_signal",
                pid,
                tid,
                comm = %comm,
                function = s.function,
                result = %s.result,
                in_uvm_ioctl = s.in_uvm_ioctl,
                duration_seconds = seconds(ev.ts_ns, s.start_ns),
                "kernel function failed"
            ),
            Kind::DiedInCall(d) => tracing::info!(
                target: TARGET,
                event = "died_in_call",
                pid,
                tid,
                comm = %comm,
                calls = %d.calls.join(" > "),
                "thread exited with a driver call in flight"
            ),
            Kind::Stall(s) => self.stall(ev, s),
            Kind::StallEnd(s) => stall_end(ev, s),
            Kind::Fork { child } => tracing::debug!(
                target: TARGET,
                event = "fork",
                pid,
                child = *child,
                "tracked process forked"
            ),
            Kind::Exec => tracing::debug!(
                target: TARGET,
                event = "exec",
                pid,
                "tracked process exec'ed"
            ),
            Kind::ProcessExit => tracing::debug!(
                target: TARGET,
                event = "process_exit",
                pid,
                "tracked process exited"
            ),
            Kind::Diagnosis(d) => self.diagnosis(ev, d),
            Kind::Scan(_) => self.print_repeats(ev.ts_ns, false),
            Kind::ActiveFindings(_) => {}
            Kind::Started(s) => started(s),
            Kind::Stopped { signal } => {
                self.print_repeats(ev.ts_ns, true);
                tracing::info!(
                target: TARGET,
                event = "stopped",
                signal = *signal,
                "probes detached, agent stopped"
                );
            }
            Kind::LibcudaAttached {
                path,
                host_path,
                source,
            } => tracing::info!(
                target: TARGET,
                event = "libcuda_attached",
                path = %path,
                host_path = %host_path,
                source = %source,
                "cuInit probes attached"
            ),
            Kind::LibcudaAttachFailed { path, error } => tracing::warn!(
                target: TARGET,
                event = "libcuda_attach_failed",
                path = %path,
                error = %error,
                "could not probe cuInit in this library"
            ),
            Kind::LibcudaFlagUnusable { error } => tracing::error!(
                target: TARGET,
                event = "libcuda_not_found",
                error = %error,
                "--libcuda path unusable"
            ),
            Kind::LibcudaNotFound => tracing::warn!(
                target: TARGET,
                event = "libcuda_not_found",
                "no libcuda.so found on the host or in any running process; cuInit probes attach \
                 as soon as a process loads one (or pass --libcuda PATH)"
            ),
            Kind::LibcudaUnresolved { path, error } => tracing::debug!(
                target: TARGET,
                event = "libcuda_open",
                pid,
                path = %path,
                error = %error,
                "library opened but not resolvable"
            ),
            Kind::FdsLearned { count } => tracing::info!(
                target: TARGET,
                event = "fds_learned",
                count = *count,
                "NVIDIA fds opened before the agent started are identified"
            ),
            Kind::InFlightAtStart { ioctl, node } => tracing::warn!(
                target: TARGET,
                event = "in_flight_at_start",
                pid,
                tid,
                ioctl = %ioctl,
                node = %node,
                "a thread was already inside a driver call when the agent started; its age counts from now"
            ),
            Kind::ModuleChanged { module, loaded } => {
                let done = if *loaded { "attached" } else { "detached" };
                if *loaded {
                    tracing::info!(
                        target: TARGET,
                        event = "module_loaded",
                        module = *module,
                        "kprobes on the module's functions {done}"
                    );
                } else {
                    tracing::info!(
                        target: TARGET,
                        event = "module_unloaded",
                        module = *module,
                        "kprobes on the module's functions {done}"
                    );
                }
            }
            Kind::ProbesChanged {
                probes, features, ..
            } => {
                if !self.probes_logged {
                    self.probes_logged = true;
                    for (spec, st) in probes {
                        tracing::debug!(target: TARGET, probe = spec.label, state = %st, "probe");
                    }
                }
                for f in features {
                    if f.on {
                        self.features_off.remove(f.name);
                    } else if self.features_off.insert(f.name) {
                        tracing::warn!(
                            target: TARGET,
                            event = "feature_off",
                            feature = f.name,
                            lost = f.lost,
                            reason = %f.why,
                            "a feature is off: what it gives is not seen"
                        );
                    }
                }
            }
            Kind::DriverLayout(d) => {
                let driver = d.driver.as_deref().unwrap_or("unknown");
                match d.selection {
                    "nearest" => tracing::warn!(
                        target: TARGET,
                        event = "driver_layout",
                        driver_version = driver,
                        layout = %d.layout,
                        selection = d.selection,
                        source = %d.source,
                        "driver version not in the layout table: statuses read with the layouts of the nearest known release"
                    ),
                    _ => tracing::info!(
                        target: TARGET,
                        event = "driver_layout",
                        driver_version = driver,
                        layout = %d.layout,
                        selection = d.selection,
                        source = %d.source,
                        "ioctl statuses read with the layouts of this driver release"
                    ),
                }
            }
            Kind::EvidenceChanged => tracing::debug!(
                target: TARGET,
                event = "evidence_changed",
                "diagnosis facts changed"
            ),
            Kind::Swept { removed } => tracing::debug!(
                target: TARGET,
                event = "sweep",
                removed = *removed,
                "stale process entries removed"
            ),
        }
    }
}

impl LogListener {
    /// Whether a failure is printed: the first time for this process, call and result in a
    /// while; the others are counted and summed up ([`text::Seen`]), in both formats. Calls
    /// inside `cuInit` are not asked: each is part of a start-up's story (the kernel sends
    /// them all, a few hundred a start), like the retry of a failed open.
    fn print_failure(&mut self, ev: &Event, call: &str, result: &str) -> bool {
        let key = text::FailureKey {
            pid: ev.pid().unwrap_or(0),
            call: call.to_string(),
            result: result.to_string(),
        };
        self.seen.print_failure(key, ev.ts_ns)
    }

    /// The sums of repeated failures: those whose window is over, or all.
    fn print_repeats(&mut self, now_ns: u64, all: bool) {
        for (key, times, over) in self.seen.repeated(now_ns, all) {
            tracing::warn!(
                target: TARGET,
                event = "repeated",
                pid = key.pid,
                call = %key.call,
                result = %key.result,
                times,
                over_seconds = over,
                "failure repeated"
            );
        }
    }

    /// The summary fields a failure or stall record carries of its findings; in the text
    /// format a finding already shown for this process is named only (rule and runbook).
    fn summary(&self, ev: &Event) -> DiagnosisFields {
        let f = DiagnosisFields::of(ev.findings());
        match self.format {
            Format::Json => f,
            Format::Text => self.seen.summary(f),
        }
    }

    fn cuinit_end(&mut self, ev: &Event, c: &CuinitEnd) {
        let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
        let secs = seconds(ev.ts_ns, c.start_ns);
        let seen = c.seen.name();
        let (ended, basis) = c
            .late
            .as_ref()
            .map(|l| (l.ended, l.result_basis.as_str()))
            .unwrap_or(("", ""));
        // A result not known (a call seen only through its driver calls, none failed) is no
        // failure to report.
        if c.code <= 0 {
            tracing::info!(
                target: TARGET,
                event = "cuinit_end",
                pid,
                tid,
                comm = %comm,
                result = %c.result,
                code = c.code,
                duration_seconds = secs,
                driver_calls = c.call.driver_calls,
                device_opens = c.call.device_opens,
                seen,
                ended,
                result_inferred_from = basis,
                "cuInit returned"
            );
            return;
        }
        let fail = c.call.last_failure.clone().unwrap_or_default();
        let d = self.summary(ev);
        tracing::error!(
            target: TARGET,
            event = "cuinit_end",
            pid,
            tid,
            comm = %comm,
            result = %c.result,
            code = c.code,
            duration_seconds = secs,
            driver_calls = c.call.driver_calls,
            device_opens = c.call.device_opens,
            seen,
            ended,
            result_inferred_from = basis,
            failed_call = %fail.what,
            failed_result = %fail.result,
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
            "cuInit failed"
        );
    }

    fn open(&mut self, ev: &Event, o: &Open) {
        let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
        if let Some(errno) = &o.errno {
            if !o.in_cuinit && !self.print_failure(ev, &format!("open {}", o.path), errno) {
                return;
            }
        }
        let Some(errno) = &o.errno else {
            tracing::debug!(
                target: TARGET,
                event = "device_open",
                pid,
                path = %o.path,
                fd = o.fd,
                "NVIDIA device opened"
            );
            return;
        };
        let container = ev
            .process
            .as_ref()
            .and_then(|p| p.container_id.clone())
            .unwrap_or_default();
        let d = self.summary(ev);
        tracing::warn!(
            target: TARGET,
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
            event = "device_open_failed",
            pid,
            tid,
            comm = %comm,
            node = %o.node,
            path = %o.path,
            errno = %errno,
            container_id = %container,
            in_cuinit = o.in_cuinit,
            "NVIDIA device open failed"
        );
    }

    /// A context creation or `cuDeviceGetCount`: a failure (summed up when repeated), a
    /// count below the process's GPUs, or (debug) a call that went well.
    fn context_call(&mut self, ev: &Event, c: &ContextCall) {
        let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
        let secs = seconds(ev.ts_ns, c.start_ns);
        let device = c.device.map(|d| d.to_string()).unwrap_or_default();
        let count = c.count.map(|n| n.to_string()).unwrap_or_default();
        if c.failed() {
            if !self.print_failure(ev, c.call, &c.result) {
                return;
            }
            let d = self.summary(ev);
            tracing::error!(
                target: TARGET,
                event = "context_call",
                pid,
                tid,
                comm = %comm,
                call = c.call,
                device = %device,
                result = %c.result,
                code = c.code,
                duration_seconds = secs,
                diagnosis = %d.rules,
                diagnosis_title = %d.title,
                diagnosis_fix = %d.fix,
                runbook = %d.runbook,
                "CUDA context or device call failed"
            );
        } else if c.count_disagrees {
            let d = self.summary(ev);
            tracing::warn!(
                target: TARGET,
                event = "device_count",
                pid,
                tid,
                comm = %comm,
                count = %count,
                gpu_nodes = %c.gpu_nodes.map(|n| n.to_string()).unwrap_or_default(),
                cuda_visible_devices = %c.cuda_visible_devices.as_deref().unwrap_or(""),
                diagnosis = %d.rules,
                diagnosis_title = %d.title,
                diagnosis_fix = %d.fix,
                runbook = %d.runbook,
                "CUDA sees fewer devices than the process has GPUs"
            );
        } else {
            tracing::debug!(
                target: TARGET,
                event = "context_call",
                pid,
                tid,
                call = c.call,
                device = %device,
                count = %count,
                result = %c.result,
                duration_seconds = secs,
                "CUDA context or device call returned"
            );
        }
    }

    fn stall(&mut self, ev: &Event, s: &Stall) {
        let (pid, tid) = (ev.pid().unwrap_or(0), ev.tid);
        let age = s.age_ns(ev.ts_ns);
        let late_ms = age.saturating_sub(s.threshold_ns) as f64 / 1e6;
        let inside = match (self.format, s.kind) {
            // For a stalled ioctl it names the call itself: people read `call` and `node`.
            (Format::Text, CallKind::Ioctl) => String::new(),
            _ => s.inside.as_ref().map(|i| i.text()).unwrap_or_default(),
        };
        let inside_age = s
            .inside
            .as_ref()
            .map(|i| seconds(ev.ts_ns, i.start_ns))
            .unwrap_or(0.0);
        let w = ev
            .process
            .as_ref()
            .map(|p| p.workload.clone())
            .unwrap_or_default();
        let t = &s.thread;
        let d = self.summary(ev);
        tracing::error!(
            target: TARGET,
            engine = w.engine.as_deref().unwrap_or(""),
            model = w.model.as_deref().unwrap_or(""),
            pod = w.k8s_pod_name.as_deref().unwrap_or(""),
            namespace = w.k8s_namespace.as_deref().unwrap_or(""),
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
            event = "stall",
            call = %s.call,
            kind = s.kind.as_str(),
            pid,
            tid,
            comm = %t.comm,
            exe = %t.exe,
            container_id = %t.container_id,
            age_seconds = age as f64 / 1e9,
            threshold_seconds = s.threshold_ns as f64 / 1e9,
            detect_delay_ms = late_ms,
            inside = %inside,
            inside_age_seconds = inside_age,
            node = %s.node,
            thread_state = %t.state,
            wchan = %t.wchan,
            kernel_stack = %t.stack.join(" < "),
            "call stalled"
        );
    }

    fn diagnosis(&mut self, ev: &Event, d: &Diagnosis) {
        let f = &d.finding;
        if d.trigger == Trigger::Evidence {
            self.seen.host_finding(f);
            tracing::info!(
                target: TARGET,
                event = "diagnosis",
                trigger = d.trigger.as_str(),
                rule = %f.rule,
                severity = f.severity.as_str(),
                basis = f.basis.as_str(),
                title = %f.title,
                runbook = %f.runbook,
                "finding from the host's state"
            );
            return;
        }
        let pid = ev.pid().unwrap_or(0);
        if self.format == Format::Text && !self.seen.first_time(pid, f) {
            // Shown in full already for this process: its cause's record names it.
            return;
        }
        tracing::warn!(
            target: TARGET,
            event = "diagnosis",
            trigger = d.trigger.as_str(),
            pid,
            rule = %f.rule,
            severity = f.severity.as_str(),
            basis = f.basis.as_str(),
            confidence = ?f.confidence,
            title = %f.title,
            evidence = %f.evidence_text(),
            unchecked = %f.unchecked.join("; "),
            fix = %f.fix_text(),
            runbook = %f.runbook,
            "diagnosis"
        );
    }
}

fn ioctl(ev: &Event, io: &Ioctl) {
    let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
    let secs = seconds(ev.ts_ns, io.start_ns);
    if io.failed {
        tracing::warn!(
            target: TARGET,
            event = "driver_ioctl",
            pid,
            tid,
            comm = %comm,
            ioctl = %io.name,
            cmd = %format!("{:#x}", io.cmd),
            node = %io.node,
            result = %io.result,
            ret = io.ret,
            duration_seconds = secs,
            in_cuinit = io.in_cuinit,
            "driver call failed"
        );
    } else if io.slow {
        tracing::info!(
            target: TARGET,
            event = "driver_ioctl",
            pid,
            tid,
            comm = %comm,
            ioctl = %io.name,
            node = %io.node,
            result = %io.result,
            duration_seconds = secs,
            in_cuinit = io.in_cuinit,
            "slow driver call"
        );
    } else {
        tracing::debug!(
            target: TARGET,
            event = "driver_ioctl",
            pid,
            tid,
            ioctl = %io.name,
            node = %io.node,
            result = %io.result,
            duration_seconds = secs,
            "driver call inside cuInit"
        );
    }
}

fn stall_end(ev: &Event, s: &StallEnd) {
    let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
    let secs = seconds(ev.ts_ns, s.start_ns);
    let outcome = s.outcome.as_str();
    match (s.outcome, s.kind) {
        (StallOutcome::Returned, CallKind::Cuinit) => tracing::warn!(
            target: TARGET,
            event = "stall_end",
            call = "cuInit",
            outcome,
            pid,
            tid,
            comm = %comm,
            result = %s.result.as_deref().unwrap_or(""),
            code = s.code.unwrap_or(0),
            duration_seconds = secs,
            "stalled cuInit returned"
        ),
        (StallOutcome::Returned, CallKind::Ioctl) => tracing::warn!(
            target: TARGET,
            event = "stall_end",
            call = %s.call,
            node = %s.node.as_deref().unwrap_or(""),
            outcome,
            pid,
            tid,
            comm = %comm,
            result = %s.result.as_deref().unwrap_or(""),
            duration_seconds = secs,
            "stalled driver call returned"
        ),
        (StallOutcome::ThreadExited, _) => tracing::warn!(
            target: TARGET,
            event = "stall_end",
            call = %s.call,
            outcome,
            pid,
            tid,
            comm = %comm,
            "thread died inside a stalled call"
        ),
        (StallOutcome::Ended, _) => tracing::warn!(
            target: TARGET,
            event = "stall_end",
            call = %s.call,
            outcome,
            pid,
            tid,
            "stalled call is no longer in flight (no exit event seen)"
        ),
    }
}

fn started(s: &Started) {
    tracing::info!(
        target: TARGET,
        event = "started",
        listen = %s.listen,
        probes_attached = s.probes_attached,
        probes_total = s.probes_total,
        libcuda_targets = s.libcuda_targets,
        cuinit_stall_seconds = s.cuinit_stall.as_secs_f64(),
        ioctl_stall_seconds = s.ioctl_stall.as_secs_f64(),
        backend = s.backend,
        backend_reason = %s.backend_reason,
        "uvmwatch agent running"
    );
}

/// Seconds from `start_ns` to `end_ns`.
fn seconds(end_ns: u64, start_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

/// The diagnosis fields of a failure or stall record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiagnosisFields {
    /// Rule ids, worst first, comma separated (empty when none).
    pub rules: String,
    /// Title of the worst finding.
    pub title: String,
    /// Fix steps of the worst finding.
    pub fix: String,
    /// Runbook of the worst finding.
    pub runbook: String,
}

impl DiagnosisFields {
    /// The fields of `findings` (worst first).
    pub fn of(findings: &[Arc<Finding>]) -> Self {
        let worst = findings.first();
        DiagnosisFields {
            rules: findings
                .iter()
                .map(|f| f.rule.as_str())
                .collect::<Vec<_>>()
                .join(","),
            title: worst.map(|f| f.title.clone()).unwrap_or_default(),
            fix: worst.map(|f| f.fix_text()).unwrap_or_default(),
            runbook: worst.map(|f| f.runbook.clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::finding::{Confidence, FixStep, Severity, Where};
    use crate::event::{testing as mk, Listener};
    use std::sync::Mutex;

    /// Runs `f` with the text format writing into a buffer; returns the lines.
    fn text_lines(f: impl FnOnce()) -> Vec<String> {
        let buf: Arc<Mutex<Vec<u8>>> = Default::default();
        let b = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(text::Compact)
            .with_writer(move || Writer(b.clone()))
            .finish();
        tracing::subscriber::with_default(sub, f);
        let out = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        out.lines().map(str::to_string).collect()
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Writer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn finding(rule: &str) -> Finding {
        Finding {
            rule: rule.into(),
            title: format!("{rule} title"),
            severity: Severity::Critical,
            confidence: Confidence::High,
            basis: Default::default(),
            evidence: vec![],
            unchecked: vec![],
            fix: vec![FixStep {
                where_: Where::Host,
                commands: vec!["echo fix".into()],
                note: String::new(),
            }],
            runbook: format!("docs/runbooks/{rule}.md"),
        }
    }

    /// A failed open (outside `cuInit`) with `f` attached, and its finding, as the observer
    /// sends them.
    fn failed_open(l: &mut LogListener, f: &Finding, t: u64) {
        failed_open_in(l, f, t, false)
    }

    fn failed_open_in(l: &mut LogListener, f: &Finding, t: u64, in_cuinit: bool) {
        let p = mk::process();
        let mut e = mk::open(
            &p,
            4242,
            t,
            t + 10,
            "/dev/nvidia-uvm",
            Some("ENOENT"),
            in_cuinit,
        );
        if let Kind::Open(o) = &mut e.kind {
            o.findings = vec![Arc::new(f.clone())];
        }
        l.event(&Arc::new(e));
        l.event(&Arc::new(mk::diagnosis(
            &p,
            t + 10,
            f,
            Trigger::DeviceOpenFailed,
        )));
    }

    #[test]
    fn the_text_log_shows_a_finding_once_and_sums_up_repeated_failures() {
        let f = finding("node_or_module_missing");
        let lines = text_lines(|| {
            let mut l = LogListener::new(Format::Text);
            failed_open(&mut l, &f, 1_000);
            // The same failure again, twice: summed up, not printed.
            failed_open(&mut l, &f, 2_000);
            failed_open(&mut l, &f, 3_000);
            l.event(&Arc::new(mk::scan(20_000_000_000, 0)));
        });
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(
            lines[0].contains(" WARN NVIDIA device open failed "),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("diagnosis=node_or_module_missing"));
        assert!(lines[0].contains("runbook=docs/runbooks/node_or_module_missing.md"));
        assert!(
            !lines[0].contains("title"),
            "the title is the finding's own line's"
        );
        assert!(!lines[0].contains("tid="), "json-only field");
        assert!(lines[0].contains("container_id=3f1c0ffee0ddba11"));
        assert!(
            !lines[0].contains("diagnosis_fix"),
            "blank in text: left out"
        );
        assert!(lines[1].contains(" WARN diagnosis "), "{}", lines[1]);
        assert!(
            lines[1].contains("fix=\"(1) [host] echo fix\""),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("failure repeated"), "{}", lines[2]);
        assert!(lines[2].contains("times=2"), "{}", lines[2]);
    }

    /// A start-up's failures are its story: inside `cuInit` each is written (the retry of a
    /// failed open too), never summed up.
    #[test]
    fn failures_inside_cuinit_are_each_written() {
        let f = finding("node_or_module_missing");
        let lines = text_lines(|| {
            let mut l = LogListener::new(Format::Text);
            for t in [1_000, 2_000, 3_000] {
                failed_open_in(&mut l, &f, t, true);
            }
            l.event(&Arc::new(mk::scan(20_000_000_000, 0)));
        });
        let opens = lines
            .iter()
            .filter(|l| l.contains("NVIDIA device open failed"))
            .count();
        assert_eq!(opens, 3, "{lines:#?}");
        assert!(
            !lines.iter().any(|l| l.contains("failure repeated")),
            "{lines:#?}"
        );
    }

    /// JSON keeps every field; a failure repeated is summed up there too (a flood of one
    /// failure is not a flood of lines), its count said when the agent stops at the latest.
    #[test]
    fn the_json_log_keeps_every_field_and_sums_up_repeated_failures() {
        let f = finding("node_or_module_missing");
        let buf: Arc<Mutex<Vec<u8>>> = Default::default();
        let b = buf.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(move || Writer(b.clone()))
            .finish();
        tracing::subscriber::with_default(sub, || {
            let mut l = LogListener::new(Format::Json);
            failed_open(&mut l, &f, 1_000);
            failed_open(&mut l, &f, 2_000);
            l.event(&Arc::new(Event::agent(
                3_000,
                Kind::Stopped { signal: "SIGTERM" },
            )));
        });
        let out = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let records: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let events: Vec<&str> = records
            .iter()
            .map(|r| r["event"].as_str().unwrap())
            .collect();
        assert_eq!(
            events,
            [
                "device_open_failed",
                "diagnosis",
                "diagnosis",
                "repeated",
                "stopped"
            ]
        );
        for r in &records {
            assert_eq!(r["target"], TARGET);
        }
        assert_eq!(
            records[0]["diagnosis_title"],
            "node_or_module_missing title"
        );
        assert_eq!(records[0]["container_id"], "3f1c0ffee0ddba11");
        assert_eq!(records[1]["fix"], "(1) [host] echo fix");
        let r = &records[3];
        assert_eq!(
            (&r["pid"], &r["call"], &r["result"], &r["times"]),
            (
                &serde_json::json!(4242),
                &serde_json::json!("open /dev/nvidia-uvm"),
                &serde_json::json!("ENOENT"),
                &serde_json::json!(1)
            )
        );
    }
}

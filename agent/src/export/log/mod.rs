//! The agent's log: one record per event, written through `tracing` (JSON lines for
//! machines, text for people; the subscriber is set up by [`init`]).
//!
//! Every record the agent writes about what it observed comes from here, one callsite per
//! kind of record, through [`write_record!`](crate::write_record): the record's `event`,
//! level, message and fields are its description in [`schema`] (the stable JSON schema,
//! `docs/log-schema.md`), the target is [`TARGET`]; the text format shows the fields that
//! matter to a person ([`text`]). The exporters write their own records the same way.
//!
//! Over 800 lines: one listener turns every kind of event into its record, so the file
//! follows [`Kind`]; a fifth of it is tests.

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

/// Writes one record described in [`schema`]: `write_record!(schema::FORK, pid, child =
/// *child)`. Its `event`, level and message are the description's; the fields are given in
/// the description's order, each as `name`, `name = value`, `name = %value` (`Display`) or
/// `name = ?value` (`Debug`), and a list that is not the description's does not compile.
#[macro_export]
macro_rules! write_record {
    ($record:path $(, $($fields:tt)*)?) => {
        $crate::write_record!(@fields $record; []; []; $($($fields)*)?)
    };
    (@fields $record:path; [$($names:expr,)*]; [$($done:tt)*]; $name:ident = % $value:expr $(, $($rest:tt)*)?) => {
        $crate::write_record!(@fields $record; [$($names,)* stringify!($name),]; [$($done)* $name = %$value,]; $($($rest)*)?)
    };
    (@fields $record:path; [$($names:expr,)*]; [$($done:tt)*]; $name:ident = ? $value:expr $(, $($rest:tt)*)?) => {
        $crate::write_record!(@fields $record; [$($names,)* stringify!($name),]; [$($done)* $name = ?$value,]; $($($rest)*)?)
    };
    (@fields $record:path; [$($names:expr,)*]; [$($done:tt)*]; $name:ident = $value:expr $(, $($rest:tt)*)?) => {
        $crate::write_record!(@fields $record; [$($names,)* stringify!($name),]; [$($done)* $name = $value,]; $($($rest)*)?)
    };
    (@fields $record:path; [$($names:expr,)*]; [$($done:tt)*]; $name:ident $(, $($rest:tt)*)?) => {
        $crate::write_record!(@fields $record; [$($names,)* stringify!($name),]; [$($done)* $name,]; $($($rest)*)?)
    };
    (@fields $record:path; [$($names:expr,)*]; [$($done:tt)*];) => {{
        const _: () = assert!(
            $crate::export::log::schema::fields_are(&$record, &[$($names),*]),
            "these fields are not the record's in agent/src/export/log/schema.rs (names and order)"
        );
        ::tracing::event!(
            target: $crate::export::log::TARGET,
            $record.level,
            event = $record.event,
            $($done)*
            "{}",
            $record.message
        )
    }};
}

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
                crate::write_record!(
                    schema::CUINIT_START,
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
            Kind::KernelSignal(s) => crate::write_record!(
                schema::KERNEL_FUNCTION_FAILED,
                pid,
                tid,
                comm = %comm,
                function = s.function,
                result = %s.result,
                in_uvm_ioctl = s.in_uvm_ioctl,
                duration_seconds = seconds(ev.ts_ns, s.start_ns),
            ),
            Kind::DiedInCall(d) => crate::write_record!(
                schema::DIED_IN_CALL,
                pid,
                tid,
                comm = %comm,
                calls = %d.calls.join(" > "),
            ),
            Kind::Stall(s) => self.stall(ev, s),
            Kind::StallEnd(s) => stall_end(ev, s),
            Kind::Fork { child } => crate::write_record!(schema::FORK, pid, child = *child,),
            Kind::Exec => crate::write_record!(schema::EXEC, pid,),
            Kind::ProcessExit => crate::write_record!(schema::PROCESS_EXIT, pid,),
            Kind::Diagnosis(d) => self.diagnosis(ev, d),
            Kind::Scan(_) => self.print_repeats(ev.ts_ns, false),
            Kind::ActiveFindings(_) => {}
            Kind::Started(s) => started(s),
            Kind::Stopped { signal } => {
                self.print_repeats(ev.ts_ns, true);
                crate::write_record!(schema::STOPPED, signal = *signal,);
            }
            Kind::LibcudaAttached {
                path,
                host_path,
                source,
                attach_seconds,
            } => crate::write_record!(
                schema::LIBCUDA_ATTACHED,
                path = %path,
                host_path = %host_path,
                source = %source,
                attach_seconds = *attach_seconds,
            ),
            Kind::LibcudaAttachFailed { path, error } => crate::write_record!(
                schema::LIBCUDA_ATTACH_FAILED,
                path = %path,
                error = %error,
            ),
            Kind::LibcudaFlagUnusable { error } => crate::write_record!(
                schema::LIBCUDA_FLAG_UNUSABLE,
                error = %error,
            ),
            Kind::LibcudaNotFound => crate::write_record!(schema::LIBCUDA_NOT_FOUND,),
            Kind::LibcudaUnresolved { path, error } => crate::write_record!(
                schema::LIBCUDA_UNRESOLVED,
                pid,
                path = %path,
                error = %error,
            ),
            Kind::FdsLearned { count } => {
                crate::write_record!(schema::FDS_LEARNED, count = *count,)
            }
            Kind::InFlightAtStart { ioctl, node } => crate::write_record!(
                schema::IN_FLIGHT_AT_START,
                pid,
                tid,
                ioctl = %ioctl,
                node = %node,
            ),
            Kind::ModuleChanged { module, loaded } => {
                if *loaded {
                    crate::write_record!(schema::MODULE_LOADED, module = *module,);
                } else {
                    crate::write_record!(schema::MODULE_UNLOADED, module = *module,);
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
                        crate::write_record!(
                            schema::FEATURE_OFF,
                            feature = f.name,
                            lost = f.lost,
                            reason = %f.why,
                        );
                    }
                }
            }
            Kind::DriverLayout(d) => {
                let driver = d.driver.as_deref().unwrap_or("unknown");
                match d.selection {
                    "nearest" => crate::write_record!(
                        schema::DRIVER_LAYOUT_NEAREST,
                        driver_version = driver,
                        layout = %d.layout,
                        selection = d.selection,
                        source = %d.source,
                    ),
                    _ => crate::write_record!(
                        schema::DRIVER_LAYOUT_EXACT,
                        driver_version = driver,
                        layout = %d.layout,
                        selection = d.selection,
                        source = %d.source,
                    ),
                }
            }
            Kind::EvidenceChanged => crate::write_record!(schema::EVIDENCE_CHANGED,),
            Kind::Swept { removed } => crate::write_record!(schema::SWEEP, removed = *removed,),
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
            crate::write_record!(
                schema::REPEATED,
                pid = key.pid,
                call = %key.call,
                result = %key.result,
                times,
                over_seconds = over,
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
            crate::write_record!(
                schema::CUINIT_RETURNED,
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
            );
            return;
        }
        let fail = c.call.last_failure.clone().unwrap_or_default();
        let d = self.summary(ev);
        crate::write_record!(
            schema::CUINIT_FAILED,
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
            crate::write_record!(
                schema::DEVICE_OPENED,
                pid,
                path = %o.path,
                fd = o.fd,
            );
            return;
        };
        let container = ev
            .process
            .as_ref()
            .and_then(|p| p.container_id.clone())
            .unwrap_or_default();
        let d = self.summary(ev);
        crate::write_record!(
            schema::DEVICE_OPEN_FAILED,
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
            pid,
            tid,
            comm = %comm,
            node = %o.node,
            path = %o.path,
            errno = %errno,
            container_id = %container,
            in_cuinit = o.in_cuinit,
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
            crate::write_record!(
                schema::CONTEXT_CALL_FAILED,
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
            );
        } else if c.count_disagrees {
            let d = self.summary(ev);
            crate::write_record!(
                schema::DEVICE_COUNT_LOW,
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
            );
        } else {
            crate::write_record!(
                schema::CONTEXT_CALL_RETURNED,
                pid,
                tid,
                call = c.call,
                device = %device,
                count = %count,
                result = %c.result,
                duration_seconds = secs,
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
        crate::write_record!(
            schema::STALL,
            engine = w.engine.as_deref().unwrap_or(""),
            model = w.model.as_deref().unwrap_or(""),
            pod = w.k8s_pod_name.as_deref().unwrap_or(""),
            namespace = w.k8s_namespace.as_deref().unwrap_or(""),
            diagnosis = %d.rules,
            diagnosis_title = %d.title,
            diagnosis_fix = %d.fix,
            runbook = %d.runbook,
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
        );
    }

    fn diagnosis(&mut self, ev: &Event, d: &Diagnosis) {
        let f = &d.finding;
        if d.trigger == Trigger::Evidence {
            self.seen.host_finding(f);
            crate::write_record!(
                schema::DIAGNOSIS_HOST,
                trigger = d.trigger.as_str(),
                rule = %f.rule,
                standing = f.standing.as_str(),
                severity = f.severity.as_str(),
                basis = f.basis.as_str(),
                title = %f.title,
                runbook = %f.runbook,
            );
            return;
        }
        let pid = ev.pid().unwrap_or(0);
        if self.format == Format::Text && !self.seen.first_time(pid, f) {
            // Shown in full already for this process: its cause's record names it.
            return;
        }
        let symptom = d
            .differential
            .symptom
            .as_ref()
            .map(|s| s.what.clone())
            .unwrap_or_default();
        let ruled_out: Vec<String> = d
            .differential
            .ruled_out
            .iter()
            .map(|o| format!("{}: {}", o.rule, o.why))
            .collect();
        crate::write_record!(
            schema::DIAGNOSIS_OBSERVED,
            trigger = d.trigger.as_str(),
            pid,
            rule = %f.rule,
            standing = f.standing.as_str(),
            severity = f.severity.as_str(),
            basis = f.basis.as_str(),
            confidence = ?f.confidence,
            title = %f.title,
            symptom = %symptom,
            evidence = %f.evidence_text(),
            unchecked = %f.unchecked.join("; "),
            fix = %f.fix_text(),
            tell_apart = %f.tell_apart.clone().unwrap_or_default(),
            ruled_out = %ruled_out.join("; "),
            runbook = %f.runbook,
        );
    }
}

fn ioctl(ev: &Event, io: &Ioctl) {
    let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
    let secs = seconds(ev.ts_ns, io.start_ns);
    if io.failed {
        crate::write_record!(
            schema::IOCTL_FAILED,
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
        );
    } else if io.slow {
        crate::write_record!(
            schema::IOCTL_SLOW,
            pid,
            tid,
            comm = %comm,
            ioctl = %io.name,
            node = %io.node,
            result = %io.result,
            duration_seconds = secs,
            in_cuinit = io.in_cuinit,
        );
    } else {
        crate::write_record!(
            schema::IOCTL_IN_CUINIT,
            pid,
            tid,
            ioctl = %io.name,
            node = %io.node,
            result = %io.result,
            duration_seconds = secs,
        );
    }
}

fn stall_end(ev: &Event, s: &StallEnd) {
    let (pid, tid, comm) = (ev.pid().unwrap_or(0), ev.tid, ev.comm.as_str());
    let secs = seconds(ev.ts_ns, s.start_ns);
    let outcome = s.outcome.as_str();
    match (s.outcome, s.kind) {
        (StallOutcome::Returned, CallKind::Cuinit) => crate::write_record!(
            schema::STALL_END_CUINIT,
            call = "cuInit",
            outcome,
            pid,
            tid,
            comm = %comm,
            result = %s.result.as_deref().unwrap_or(""),
            code = s.code.unwrap_or(0),
            duration_seconds = secs,
        ),
        (StallOutcome::Returned, CallKind::Ioctl) => crate::write_record!(
            schema::STALL_END_IOCTL,
            call = %s.call,
            node = %s.node.as_deref().unwrap_or(""),
            outcome,
            pid,
            tid,
            comm = %comm,
            result = %s.result.as_deref().unwrap_or(""),
            duration_seconds = secs,
        ),
        (StallOutcome::ThreadExited, _) => crate::write_record!(
            schema::STALL_END_THREAD_EXITED,
            call = %s.call,
            outcome,
            pid,
            tid,
            comm = %comm,
        ),
        (StallOutcome::Ended, _) => crate::write_record!(
            schema::STALL_END_NOT_IN_FLIGHT,
            call = %s.call,
            outcome,
            pid,
            tid,
        ),
    }
}

fn started(s: &Started) {
    crate::write_record!(
        schema::STARTED,
        listen = %s.listen,
        probes_attached = s.probes_attached,
        probes_total = s.probes_total,
        libcuda_targets = s.libcuda_targets,
        cuinit_stall_seconds = s.cuinit_stall.as_secs_f64(),
        ioctl_stall_seconds = s.ioctl_stall.as_secs_f64(),
        backend = s.backend,
        backend_reason = %s.backend_reason,
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
            rule: crate::doctor::cause::CauseId::from_name(rule).expect("a cause"),
            standing: crate::doctor::finding::Standing::Leading,
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
            tell_apart: None,
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

//! Events become spans: a `cuInit` with its driver calls and opens as children, failed or
//! slow calls outside it as roots, stalls as span events on the still-open span plus an
//! exported marker, findings on the span they concern.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use super::attributes::{kv_bool, kv_f64, kv_int, kv_str, process_attributes};
use super::exporter::{Exporter, OpenSpan, ProcEntry, Recent, RECENT_FOR, SPAN_FLAGS};
use super::{Msg, DIAGNOSIS, STALL, STALL_END};
use crate::doctor::finding::Finding;
use crate::event::{Event, Kind, Process, StallOutcome};

impl Exporter {
    pub(super) fn to_unix(&self, mono: u64) -> u64 {
        self.clock.to_unix_nanos(mono)
    }

    /// Root-span attributes of a process, made once per identity.
    fn proc_attrs(&mut self, p: &Arc<Process>) -> Vec<KeyValue> {
        if let Some(e) = self.procs.get(&p.pid) {
            if Arc::ptr_eq(&e.info, p) || *e.info == **p {
                return e.attrs.clone();
            }
        }
        let attrs = process_attributes(p, self.cfg.max_command_line);
        self.procs.insert(
            p.pid,
            ProcEntry {
                info: p.clone(),
                attrs: attrs.clone(),
            },
        );
        attrs
    }

    fn new_open(
        &mut self,
        name: &str,
        pid: u32,
        parent: Option<(&[u8; 16], &[u8; 8])>,
    ) -> OpenSpan {
        let (trace_id, parent) = match parent {
            Some((t, s)) => (*t, Some(*s)),
            None => (self.ids.trace_id(), None),
        };
        OpenSpan {
            name: name.to_string(),
            trace_id,
            span_id: self.ids.span_id(),
            parent,
            pid,
            start_ns: None,
            flags: None,
            events: Vec::new(),
            joined: false,
        }
    }

    /// A start-up span of `proc` (its `cuInit`, a CUDA context creation): a child of the span
    /// the process was started in when its environment names a sampled one (`TRACEPARENT`),
    /// else the root of a new trace.
    fn startup_open(&mut self, name: &str, proc: &Process) -> OpenSpan {
        match proc.workload.trace_parent.as_ref().filter(|t| t.sampled) {
            Some(t) => {
                let mut o = self.new_open(name, proc.pid, Some((&t.trace_id, &t.span_id)));
                o.joined = true;
                o
            }
            None => self.new_open(name, proc.pid, None),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        trace_id: [u8; 16],
        span_id: [u8; 8],
        parent: Option<[u8; 8]>,
        name: &str,
        start_ns: u64,
        end_ns: u64,
        attributes: Vec<KeyValue>,
        events: Vec<span::Event>,
        error: Option<String>,
    ) -> Span {
        let start = self.to_unix(start_ns);
        Span {
            trace_id: trace_id.to_vec(),
            span_id: span_id.to_vec(),
            parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
            flags: SPAN_FLAGS,
            name: name.to_string(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: self.to_unix(end_ns).max(start),
            attributes,
            events,
            status: error.map(|m| Status {
                message: m,
                code: status::StatusCode::Error as i32,
            }),
            ..Span::default()
        }
    }

    fn push(&mut self, s: Span) {
        if self.pending.len() >= self.cfg.max_pending.max(1) {
            self.pending.pop_front();
            self.stats.spans_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.pending.push_back(s);
    }

    fn event_at(&self, name: &str, ts_ns: u64, attributes: Vec<KeyValue>) -> span::Event {
        span::Event {
            time_unix_nano: self.to_unix(ts_ns),
            name: name.to_string(),
            attributes,
            ..span::Event::default()
        }
    }

    pub(super) fn handle(&mut self, m: Msg) {
        match m {
            Msg::Events(evs) => {
                for ev in &evs {
                    self.event(ev);
                }
            }
            Msg::Flush => self.urgent = true,
        }
    }

    fn event(&mut self, ev: &Event) {
        let Some(proc) = ev.process.clone() else {
            return;
        };
        let tid = ev.tid;
        let end_ns = ev.ts_ns;
        match &ev.kind {
            Kind::CuinitStart {
                start_ns, flags, ..
            } => {
                if let Some(old) = self.cuinit.remove(&tid) {
                    // Its end was lost: close it where the next one starts.
                    self.end_incomplete(old, tid, *start_ns, "superseded");
                }
                let mut o = self.startup_open("cuInit", &proc);
                o.start_ns = Some(*start_ns);
                o.flags = Some(*flags);
                self.cuinit.insert(tid, o);
            }
            Kind::CuinitEnd(c) => {
                let start_ns = c.start_ns;
                let o = match self.cuinit.remove(&tid) {
                    Some(o) if o.start_ns.is_none_or(|s| s == start_ns) => o,
                    other => {
                        if let Some(o) = other {
                            self.end_incomplete(o, tid, start_ns, "superseded");
                        }
                        self.startup_open("cuInit", &proc)
                    }
                };
                // Stalled ioctls of this call whose end was not seen end with it.
                let orphans: Vec<(u32, u64)> = self
                    .ioctls
                    .iter()
                    .filter(|(k, v)| k.0 == tid && v.parent == Some(o.span_id))
                    .map(|(k, _)| *k)
                    .collect();
                for k in orphans {
                    if let Some(io) = self.ioctls.remove(&k) {
                        self.end_incomplete(io, tid, end_ns, "not_seen");
                    }
                }
                let mut attrs = self.proc_attrs(&proc);
                joined_attrs(&mut attrs, &o);
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("uvmwatch.cuinit.result", c.result.clone()));
                attrs.push(kv_int("uvmwatch.cuinit.result_code", c.code));
                if let Some(f) = o.flags {
                    attrs.push(kv_int("uvmwatch.cuinit.flags", f as i64));
                }
                // A call found at its first driver call: what was seen, and what its result
                // rests on.
                if c.seen != crate::event::Seen::Whole {
                    attrs.push(kv_str("uvmwatch.cuinit.seen", c.seen.name()));
                }
                if let Some(l) = &c.late {
                    attrs.push(kv_str("uvmwatch.cuinit.ended", l.ended));
                    if !l.result_basis.is_empty() {
                        attrs.push(kv_str(
                            "uvmwatch.cuinit.result_inferred_from",
                            l.result_basis.clone(),
                        ));
                    }
                }
                if let Some(f) = &c.call.last_failure {
                    attrs.push(kv_str("uvmwatch.cuinit.failed_call", f.what.clone()));
                    attrs.push(kv_str("uvmwatch.cuinit.failed_result", f.result.clone()));
                }
                let error = (c.code > 0).then(|| {
                    attrs.push(kv_str("error.type", c.result.clone()));
                    c.result.clone()
                });
                let state = trace_state(&o, &proc);
                let mut s = self.span(
                    o.trace_id, o.span_id, o.parent, "cuInit", start_ns, end_ns, attrs, o.events,
                    error,
                );
                s.trace_state = state;
                self.remember(proc.pid, o.trace_id, o.span_id);
                self.push(s);
            }
            Kind::Ioctl(io) => {
                let o = match self.ioctls.remove(&(tid, io.start_ns)) {
                    Some(o) => o,
                    None => self.child_or_root(&io.name, &proc, tid, io.in_cuinit),
                };
                let mut attrs = if o.is_child() {
                    vec![kv_int("process.pid", proc.pid as i64)]
                } else {
                    self.proc_attrs(&proc)
                };
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("uvmwatch.ioctl.name", io.name.clone()));
                attrs.push(kv_str("uvmwatch.ioctl.node", io.node.clone()));
                attrs.push(kv_str("uvmwatch.ioctl.result", io.result.clone()));
                if io.result.starts_with("NV_") {
                    attrs.push(kv_str("uvmwatch.ioctl.rm_status", io.result.clone()));
                }
                if !io.in_cuinit {
                    attrs.push(kv_bool("uvmwatch.ioctl.in_cuinit", false));
                }
                let error = io.failed.then(|| {
                    attrs.push(kv_str("error.type", io.result.clone()));
                    io.result.clone()
                });
                let child = o.is_child();
                let s = self.span(
                    o.trace_id,
                    o.span_id,
                    o.parent,
                    &io.name,
                    io.start_ns,
                    end_ns,
                    attrs,
                    o.events,
                    error,
                );
                if !child {
                    self.remember(proc.pid, o.trace_id, o.span_id);
                }
                self.push(s);
            }
            Kind::Open(op) => {
                let o = self.child_or_root("open", &proc, tid, op.in_cuinit);
                let mut attrs = if o.is_child() {
                    vec![kv_int("process.pid", proc.pid as i64)]
                } else {
                    self.proc_attrs(&proc)
                };
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("file.path", op.path.clone()));
                let error = op
                    .errno
                    .clone()
                    .inspect(|e| attrs.push(kv_str("error.type", e.clone())));
                let s = self.span(
                    o.trace_id,
                    o.span_id,
                    o.parent,
                    &format!("open {}", op.path),
                    op.start_ns,
                    end_ns,
                    attrs,
                    Vec::new(),
                    error,
                );
                if !o.is_child() {
                    self.remember(proc.pid, o.trace_id, o.span_id);
                }
                self.push(s);
            }
            Kind::ContextCall(cc) => {
                // A root span of its own: a trace per context creation (or device count),
                // which its diagnosis joins.
                let o = self.startup_open(cc.call, &proc);
                let mut attrs = self.proc_attrs(&proc);
                joined_attrs(&mut attrs, &o);
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("uvmwatch.cuda.call", cc.call));
                attrs.push(kv_str("uvmwatch.cuda.result", cc.result.clone()));
                attrs.push(kv_int("uvmwatch.cuda.result_code", cc.code));
                if let Some(d) = cc.device {
                    attrs.push(kv_int("uvmwatch.cuda.device", i64::from(d)));
                }
                if let Some(n) = cc.count {
                    attrs.push(kv_int("uvmwatch.cuda.device_count", i64::from(n)));
                }
                if let Some(n) = cc.gpu_nodes.filter(|_| cc.count_disagrees) {
                    attrs.push(kv_int("uvmwatch.cuda.gpu_nodes", i64::from(n)));
                }
                let error = cc.failed().then(|| {
                    attrs.push(kv_str("error.type", cc.result.clone()));
                    cc.result.clone()
                });
                let mut s = self.span(
                    o.trace_id,
                    o.span_id,
                    o.parent,
                    cc.call,
                    cc.start_ns,
                    end_ns,
                    attrs,
                    Vec::new(),
                    error,
                );
                s.trace_state = trace_state(&o, &proc);
                self.remember(proc.pid, o.trace_id, o.span_id);
                self.push(s);
            }
            Kind::Stall(st) => {
                let detected_ns = ev.ts_ns;
                let call = st.call.clone();
                let mut a = vec![
                    kv_str("uvmwatch.stall.call", call.clone()),
                    kv_f64(
                        "uvmwatch.stall.age_seconds",
                        st.age_ns(detected_ns) as f64 / 1e9,
                    ),
                    kv_int("thread.id", tid as i64),
                ];
                if let Some(i) = &st.inside {
                    a.push(kv_str("uvmwatch.stall.inside", i.text()));
                }
                if !st.thread.state.is_empty() {
                    a.push(kv_str("uvmwatch.thread.state", st.thread.state.clone()));
                }
                if !st.thread.wchan.is_empty() {
                    a.push(kv_str("uvmwatch.thread.wchan", st.thread.wchan.clone()));
                }
                let e = self.event_at(STALL, detected_ns, a);
                let (trace_id, span_id) = self.open_target(&proc, tid, &call, st.start_ns);
                self.add_open_event(tid, &call, st.start_ns, e.clone());
                self.live_marker(&proc, tid, trace_id, span_id, STALL, detected_ns, e);
            }
            Kind::StallEnd(st) => {
                let call = st.call.clone();
                let outcome = st.outcome.as_str();
                let e = self.event_at(
                    STALL_END,
                    end_ns,
                    vec![
                        kv_str("uvmwatch.stall.call", call.clone()),
                        kv_str("uvmwatch.stall.outcome", outcome),
                        kv_f64(
                            "uvmwatch.stall.duration_seconds",
                            end_ns.saturating_sub(st.start_ns) as f64 / 1e9,
                        ),
                    ],
                );
                self.add_open_event(tid, &call, st.start_ns, e);
                if st.outcome != StallOutcome::Returned {
                    // No end event will come: end the span here.
                    let o = if call == "cuInit" {
                        self.cuinit.remove(&tid)
                    } else {
                        self.ioctls.remove(&(tid, st.start_ns))
                    };
                    if let Some(o) = o {
                        self.end_open(&proc, o, tid, &call, st.start_ns, end_ns, outcome);
                    }
                }
                self.urgent = true;
            }
            Kind::Diagnosis(d) => self.diagnosis(&proc, ev.ts_ns, &d.finding),
            _ => {}
        }
    }

    /// Ids for an ioctl or open: a child of the thread's `cuInit` when it is inside one (an
    /// open `cuInit` is made up when its start was not seen, so that its end joins it), or
    /// the root of a new trace.
    fn child_or_root(&mut self, name: &str, proc: &Process, tid: u32, in_cuinit: bool) -> OpenSpan {
        if in_cuinit {
            if !self.cuinit.contains_key(&tid) {
                let o = self.startup_open("cuInit", proc);
                self.cuinit.insert(tid, o);
            }
            let (t, s) = {
                let c = &self.cuinit[&tid];
                (c.trace_id, c.span_id)
            };
            self.new_open(name, proc.pid, Some((&t, &s)))
        } else {
            self.new_open(name, proc.pid, None)
        }
    }

    /// Ids of the span a stall concerns, fixing them now if needed: the thread's open
    /// `cuInit`, or the stalled ioctl (a child of that `cuInit` when inside one).
    fn open_target(
        &mut self,
        proc: &Process,
        tid: u32,
        call: &str,
        start_ns: u64,
    ) -> ([u8; 16], [u8; 8]) {
        if call == "cuInit" {
            if !self.cuinit.contains_key(&tid) {
                // The agent started while this cuInit was running.
                let mut o = self.startup_open("cuInit", proc);
                o.start_ns = Some(start_ns);
                self.cuinit.insert(tid, o);
            }
            let c = &self.cuinit[&tid];
            return (c.trace_id, c.span_id);
        }
        if let Some(o) = self.ioctls.get(&(tid, start_ns)) {
            return (o.trace_id, o.span_id);
        }
        let parent = self
            .cuinit
            .get(&tid)
            .filter(|c| c.start_ns.is_none_or(|s| s <= start_ns))
            .map(|c| (c.trace_id, c.span_id));
        let mut o = match parent {
            Some((t, s)) => self.new_open(call, proc.pid, Some((&t, &s))),
            None => self.new_open(call, proc.pid, None),
        };
        o.start_ns = Some(start_ns);
        let ids = (o.trace_id, o.span_id);
        self.ioctls.insert((tid, start_ns), o);
        ids
    }

    fn add_open_event(&mut self, tid: u32, call: &str, start_ns: u64, ev: span::Event) {
        let o = if call == "cuInit" {
            self.cuinit.get_mut(&tid)
        } else {
            self.ioctls.get_mut(&(tid, start_ns))
        };
        if let Some(o) = o {
            if o.events.len() < 64 {
                o.events.push(ev);
            }
        }
    }

    /// Makes `ev` leave now, on the span `(trace_id, parent)` that is still open: on a
    /// marker span of that parent still waiting in the batch, or on a new zero-length
    /// marker span `name` at `ts_ns`.
    #[allow(clippy::too_many_arguments)]
    fn live_marker(
        &mut self,
        proc: &Process,
        tid: u32,
        trace_id: [u8; 16],
        parent: [u8; 8],
        name: &str,
        ts_ns: u64,
        ev: span::Event,
    ) {
        self.urgent = true;
        let parent_v = parent.to_vec();
        if let Some(s) = self.pending.iter_mut().rev().find(|s| {
            s.parent_span_id == parent_v && s.name.starts_with("uvmwatch.") && s.events.len() < 64
        }) {
            s.events.push(ev);
            return;
        }
        let attrs = vec![
            kv_int("process.pid", proc.pid as i64),
            kv_int("thread.id", tid as i64),
        ];
        let id = self.ids.span_id();
        let s = self.span(
            trace_id,
            id,
            Some(parent),
            name,
            ts_ns,
            ts_ns,
            attrs,
            vec![ev],
            None,
        );
        self.push(s);
    }

    fn diagnosis(&mut self, proc: &Arc<Process>, ts_ns: u64, f: &Finding) {
        let evidence = f.evidence_text();
        let fix: Vec<String> = f
            .fix
            .iter()
            .flat_map(|s| {
                if s.commands.is_empty() {
                    vec![s.note.clone()]
                } else {
                    s.commands.clone()
                }
            })
            .collect();
        let mut a = vec![
            kv_str("uvmwatch.diagnosis.rule", f.rule.as_str()),
            kv_str("uvmwatch.diagnosis.standing", f.standing.as_str()),
            kv_str("uvmwatch.diagnosis.severity", f.severity.as_str()),
            kv_str("uvmwatch.diagnosis.confidence", f.confidence.as_str()),
            kv_str("uvmwatch.diagnosis.title", f.title.clone()),
            kv_str("uvmwatch.diagnosis.runbook", f.runbook.clone()),
        ];
        if !evidence.is_empty() {
            a.push(kv_str("uvmwatch.diagnosis.evidence", evidence));
        }
        if !fix.is_empty() {
            a.push(kv_str("uvmwatch.diagnosis.fix", fix.join(" | ")));
        }
        let ev = self.event_at(DIAGNOSIS, ts_ns, a);
        self.urgent = true;
        // 1. A cuInit of the process still running (a stall's diagnosis).
        let open = self
            .cuinit
            .iter()
            .filter(|(_, o)| o.pid == proc.pid)
            .min_by_key(|(_, o)| o.start_ns.unwrap_or(0))
            .map(|(tid, o)| (*tid, o.trace_id, o.span_id));
        if let Some((tid, t, s)) = open {
            if let Some(o) = self.cuinit.get_mut(&tid) {
                if o.events.len() < 64 {
                    o.events.push(ev.clone());
                }
            }
            self.live_marker(proc, tid, t, s, DIAGNOSIS, ts_ns, ev);
            return;
        }
        // 2. A stalled ioctl of the process outside cuInit, still running.
        let open = self
            .ioctls
            .iter()
            .filter(|(_, o)| o.pid == proc.pid)
            .max_by_key(|(k, _)| k.1)
            .map(|(k, o)| (*k, o.trace_id, o.span_id));
        if let Some((k, t, s)) = open {
            if let Some(o) = self.ioctls.get_mut(&k) {
                if o.events.len() < 64 {
                    o.events.push(ev.clone());
                }
            }
            self.live_marker(proc, k.0, t, s, DIAGNOSIS, ts_ns, ev);
            return;
        }
        // 3. The span of this process that just ended (a failure's diagnosis).
        if let Some(r) = self.recent.get(&proc.pid).copied() {
            if r.at.elapsed() < RECENT_FOR {
                let id = r.span_id.to_vec();
                if let Some(s) = self.pending.iter_mut().rev().find(|s| s.span_id == id) {
                    if s.events.len() < 64 {
                        s.events.push(ev);
                    }
                    return;
                }
                self.live_marker(proc, proc.pid, r.trace_id, r.span_id, DIAGNOSIS, ts_ns, ev);
                return;
            }
        }
        // 4. Nothing to attach to: a span of its own.
        let mut attrs = self.proc_attrs(proc);
        attrs.push(kv_str("uvmwatch.diagnosis.rule", f.rule.as_str()));
        let (t, id) = (self.ids.trace_id(), self.ids.span_id());
        let s = self.span(t, id, None, DIAGNOSIS, ts_ns, ts_ns, attrs, vec![ev], None);
        self.push(s);
    }

    fn remember(&mut self, pid: u32, trace_id: [u8; 16], span_id: [u8; 8]) {
        self.recent.insert(
            pid,
            Recent {
                trace_id,
                span_id,
                at: Instant::now(),
            },
        );
    }

    /// Ends an open span whose end event will not come (thread exited, call vanished).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn end_open(
        &mut self,
        proc: &Arc<Process>,
        o: OpenSpan,
        tid: u32,
        call: &str,
        start_ns: u64,
        end_ns: u64,
        outcome: &str,
    ) {
        let mut attrs = if o.is_child() {
            vec![kv_int("process.pid", proc.pid as i64)]
        } else {
            self.proc_attrs(proc)
        };
        attrs.push(kv_int("thread.id", tid as i64));
        attrs.push(kv_str("uvmwatch.outcome", outcome));
        let error = (outcome == "thread_exited").then(|| {
            attrs.push(kv_str("error.type", "thread_exited"));
            format!("thread exited inside {call}")
        });
        let start = o.start_ns.unwrap_or(start_ns);
        let child = o.is_child();
        let s = self.span(
            o.trace_id, o.span_id, o.parent, call, start, end_ns, attrs, o.events, error,
        );
        if !child {
            self.remember(proc.pid, o.trace_id, o.span_id);
        }
        self.push(s);
    }

    /// Ends an open span whose end was lost, or that is still open at shutdown:
    /// `uvmwatch.incomplete = true`, `uvmwatch.outcome = why`.
    pub(super) fn end_incomplete(&mut self, o: OpenSpan, tid: u32, end_ns: u64, why: &str) {
        let mut attrs = match self.procs.get(&o.pid) {
            Some(e) if !o.is_child() => e.attrs.clone(),
            _ => vec![kv_int("process.pid", o.pid as i64)],
        };
        attrs.push(kv_int("thread.id", tid as i64));
        attrs.push(kv_bool("uvmwatch.incomplete", true));
        attrs.push(kv_str("uvmwatch.outcome", why));
        let start = o.start_ns.unwrap_or(end_ns);
        let s = self.span(
            o.trace_id, o.span_id, o.parent, &o.name, start, end_ns, attrs, o.events, None,
        );
        self.push(s);
    }
}

/// Says which context a start-up span joined: `uvmwatch.trace.parent_from` is
/// `TRACEPARENT` (the process's environment) when it joined one.
fn joined_attrs(attrs: &mut Vec<KeyValue>, o: &OpenSpan) {
    if o.joined {
        attrs.push(kv_str("uvmwatch.trace.parent_from", "TRACEPARENT"));
    }
}

/// The `TRACESTATE` a joined start-up span carries on (W3C: a child keeps its parent's).
fn trace_state(o: &OpenSpan, proc: &Process) -> String {
    if !o.joined {
        return String::new();
    }
    proc.workload
        .trace_parent
        .as_ref()
        .and_then(|t| t.trace_state.clone())
        .unwrap_or_default()
}

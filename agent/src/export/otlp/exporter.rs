//! The exporting thread: events become spans (a `cuInit` with its driver calls and opens as
//! children, failed or slow calls outside it as roots, stalls and findings as span events
//! on the spans they concern), batched and sent with retries.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;

use super::attributes::{kv_bool, kv_f64, kv_int, kv_str, process_attributes};
use super::client::{Endpoint, HttpClient, Sent};
use super::{Compression, Msg, OtlpConfig, OtlpStats, DIAGNOSIS, SERVICE_NAME, STALL, STALL_END};
use crate::doctor::finding::Finding;
use crate::event::{Clock, Event, Kind, Process, StallOutcome, Trigger};

/// `Span.flags`: W3C trace flags `sampled`, and bit 8 (`CONTEXT_HAS_IS_REMOTE`) set with
/// bit 9 clear: the parent, when there is one, is local.
const SPAN_FLAGS: u32 = 0x01 | 0x100;
/// Retries of one batch before it is dropped (so 1 + 5 attempts).
const MAX_RETRIES: u32 = 5;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a just-ended span stays the one a later diagnosis of its process concerns.
const RECENT_FOR: Duration = Duration::from_secs(10);
/// At most this often, a log line about drops and failures.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether an event can become part of a trace (the others are not queued at all).
pub(super) fn traced(ev: &Event) -> bool {
    ev.process.is_some()
        && match &ev.kind {
            Kind::CuinitStart { .. }
            | Kind::Ioctl(_)
            | Kind::Open(_)
            | Kind::Stall(_)
            | Kind::StallEnd(_) => true,
            Kind::Diagnosis(d) => d.trigger != Trigger::Evidence,
            // `cuInit` calls whose start was not seen were not traced.
            Kind::CuinitEnd(c) => c.entry_seen,
            _ => false,
        }
}

/// Random trace and span ids: SplitMix64 seeded from `getrandom(2)` (falls back to time and
/// pid). W3C trace ids must be random and non-zero; nothing here needs them unguessable.
pub(super) struct Ids(u64);

impl Ids {
    pub(super) fn new() -> Ids {
        let mut seed = [0u8; 8];
        // SAFETY: valid buffer of the given length.
        let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
        let s = if n == 8 {
            u64::from_ne_bytes(seed)
        } else {
            crate::clock::monotonic_ns() ^ ((std::process::id() as u64) << 32)
        };
        Ids(s)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn span_id(&mut self) -> [u8; 8] {
        loop {
            let v = self.next();
            if v != 0 {
                return v.to_be_bytes();
            }
        }
    }

    pub(super) fn trace_id(&mut self) -> [u8; 16] {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.span_id());
        t[8..].copy_from_slice(&self.next().to_be_bytes());
        t
    }
}

/// A span whose ids are fixed but which has not ended (a `cuInit` in flight, a stalled
/// ioctl).
#[derive(Debug)]
struct OpenSpan {
    /// Span name (`cuInit`, the ioctl's name).
    name: String,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    pid: u32,
    /// Start (monotonic ns), when seen.
    start_ns: Option<u64>,
    flags: Option<u32>,
    events: Vec<span::Event>,
}

/// A span that just ended: a diagnosis of its process arriving right after belongs to it.
#[derive(Clone, Copy, Debug)]
struct Recent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    at: Instant,
}

struct ProcEntry {
    info: Arc<Process>,
    /// Root-span attributes.
    attrs: Vec<KeyValue>,
}

pub(super) struct Exporter {
    cfg: OtlpConfig,
    stats: Arc<OtlpStats>,
    http: HttpClient,
    clock: Clock,
    ids: Ids,
    resource: Resource,
    scope: InstrumentationScope,
    procs: HashMap<u32, ProcEntry>,
    /// `cuInit` calls in flight, by thread.
    cuinit: HashMap<u32, OpenSpan>,
    /// Stalled ioctls in flight, by (thread, start).
    ioctls: HashMap<(u32, u64), OpenSpan>,
    recent: HashMap<u32, Recent>,
    pending: VecDeque<Span>,
    /// A stall or diagnosis waits: export without waiting for the interval.
    urgent: bool,
    next_export: Instant,
    /// A batch that failed, to send again at `retry_at`.
    retry: Option<(Vec<Span>, u32, Instant)>,
    next_housekeeping: Instant,
    next_log: Instant,
    logged_events_dropped: u64,
    logged_spans_dropped: u64,
    /// Export failing since (for one log line per outage, not one per attempt).
    failing: Option<String>,
}

impl Exporter {
    pub(super) fn new(
        cfg: OtlpConfig,
        endpoint: Endpoint,
        headers: Vec<(HeaderName, HeaderValue)>,
        stats: Arc<OtlpStats>,
    ) -> Result<Exporter> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("OTLP exporter runtime")?;
        let host = cfg.host_name.clone().unwrap_or_else(host_name);
        let node = cfg.node_name.clone().or_else(|| {
            std::env::var("NODE_NAME")
                .ok()
                .filter(|s| !s.trim().is_empty())
        });
        let mut attrs = vec![
            kv_str("service.name", SERVICE_NAME),
            kv_str("service.version", cfg.service_version.clone()),
            kv_str("host.name", host),
        ];
        if let Some(n) = node {
            attrs.push(kv_str("k8s.node.name", n));
        }
        let now = Instant::now();
        tracing::info!(
            target: crate::export::log::TARGET,
            event = "otlp_started",
            endpoint = %format!("http://{}{}", endpoint.authority, endpoint.path),
            "exporting spans over OTLP/HTTP"
        );
        Ok(Exporter {
            http: HttpClient {
                rt,
                endpoint,
                headers,
                gzip: cfg.compression == Compression::Gzip,
                timeout: cfg.timeout,
                conn: None,
            },
            stats,
            clock: Clock::measure(),
            ids: Ids::new(),
            resource: Resource {
                attributes: attrs,
                ..Resource::default()
            },
            scope: InstrumentationScope {
                name: SERVICE_NAME.into(),
                version: cfg.service_version.clone(),
                ..InstrumentationScope::default()
            },
            procs: HashMap::new(),
            cuinit: HashMap::new(),
            ioctls: HashMap::new(),
            recent: HashMap::new(),
            pending: VecDeque::new(),
            urgent: false,
            next_export: now + cfg.export_interval,
            retry: None,
            next_housekeeping: now + cfg.housekeeping_interval,
            next_log: now + LOG_EVERY,
            logged_events_dropped: 0,
            logged_spans_dropped: 0,
            failing: None,
            cfg,
        })
    }

    pub(super) fn run(&mut self, rx: Receiver<Msg>) {
        loop {
            let wake = self.next_wake();
            let timeout = wake.saturating_duration_since(Instant::now());
            match rx.recv_timeout(timeout) {
                Ok(m) => self.handle(m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let mut closed = false;
            loop {
                match rx.try_recv() {
                    Ok(m) => self.handle(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            self.export_due();
            self.housekeeping();
            self.log_drops(false);
            if closed {
                break;
            }
        }
        self.shutdown();
    }

    fn next_wake(&self) -> Instant {
        let mut w = self.next_housekeeping.min(self.next_log);
        if let Some((_, _, at)) = &self.retry {
            w = w.min(*at);
        } else if self.urgent && !self.pending.is_empty() {
            return Instant::now();
        } else if !self.pending.is_empty() {
            w = w.min(self.next_export);
        }
        w
    }

    // --- events -> spans

    fn to_unix(&self, mono: u64) -> u64 {
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

    fn handle(&mut self, m: Msg) {
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
            Kind::CuinitStart { start_ns, flags } => {
                if let Some(old) = self.cuinit.remove(&tid) {
                    // Its end was lost: close it where the next one starts.
                    self.end_incomplete(old, tid, *start_ns, "superseded");
                }
                let mut o = self.new_open("cuInit", proc.pid, None);
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
                        self.new_open("cuInit", proc.pid, None)
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
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("uvmwatch.cuinit.result", c.result.clone()));
                attrs.push(kv_int("uvmwatch.cuinit.result_code", c.code));
                if let Some(f) = o.flags {
                    attrs.push(kv_int("uvmwatch.cuinit.flags", f as i64));
                }
                let error = (c.code != 0).then(|| {
                    attrs.push(kv_str("error.type", c.result.clone()));
                    c.result.clone()
                });
                let s = self.span(
                    o.trace_id, o.span_id, None, "cuInit", start_ns, end_ns, attrs, o.events, error,
                );
                self.remember(proc.pid, o.trace_id, o.span_id);
                self.push(s);
            }
            Kind::Ioctl(io) => {
                let o = match self.ioctls.remove(&(tid, io.start_ns)) {
                    Some(o) => o,
                    None => self.child_or_root(&io.name, &proc, tid, io.in_cuinit),
                };
                let mut attrs = if o.parent.is_some() {
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
                if o.parent.is_none() {
                    self.remember(proc.pid, o.trace_id, o.span_id);
                }
                self.push(s);
            }
            Kind::Open(op) => {
                let o = self.child_or_root("open", &proc, tid, op.in_cuinit);
                let mut attrs = if o.parent.is_some() {
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
                if o.parent.is_none() {
                    self.remember(proc.pid, o.trace_id, o.span_id);
                }
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
                let o = self.new_open("cuInit", proc.pid, None);
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
                let mut o = self.new_open("cuInit", proc.pid, None);
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
            kv_str("uvmwatch.diagnosis.rule", f.rule.clone()),
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
        attrs.push(kv_str("uvmwatch.diagnosis.rule", f.rule.clone()));
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
    fn end_open(
        &mut self,
        proc: &Arc<Process>,
        o: OpenSpan,
        tid: u32,
        call: &str,
        start_ns: u64,
        end_ns: u64,
        outcome: &str,
    ) {
        let mut attrs = if o.parent.is_some() {
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
        let s = self.span(
            o.trace_id, o.span_id, o.parent, call, start, end_ns, attrs, o.events, error,
        );
        if o.parent.is_none() {
            self.remember(proc.pid, o.trace_id, o.span_id);
        }
        self.push(s);
    }

    /// Ends an open span whose end was lost, or that is still open at shutdown:
    /// `uvmwatch.incomplete = true`, `uvmwatch.outcome = why`.
    fn end_incomplete(&mut self, o: OpenSpan, tid: u32, end_ns: u64, why: &str) {
        let mut attrs = match self.procs.get(&o.pid) {
            Some(e) if o.parent.is_none() => e.attrs.clone(),
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

    // --- housekeeping

    fn housekeeping(&mut self) {
        let now = Instant::now();
        if now < self.next_housekeeping {
            return;
        }
        self.next_housekeeping = now + self.cfg.housekeeping_interval;
        let root = self.cfg.proc_root.clone();
        let alive = |pid: u32, tid: u32| {
            root.join(pid.to_string())
                .join("task")
                .join(tid.to_string())
                .exists()
        };
        let mono = crate::clock::monotonic_ns();
        let dead: Vec<u32> = self
            .cuinit
            .iter()
            .filter(|(tid, o)| !alive(o.pid, **tid))
            .map(|(tid, _)| *tid)
            .collect();
        for tid in dead {
            if let Some(o) = self.cuinit.remove(&tid) {
                let proc = self
                    .procs
                    .get(&o.pid)
                    .map(|e| e.info.clone())
                    .unwrap_or_else(|| {
                        Arc::new(Process {
                            pid: o.pid,
                            ..Process::default()
                        })
                    });
                let start = o.start_ns.unwrap_or(mono);
                self.end_open(&proc, o, tid, "cuInit", start, mono, "thread_exited");
            }
        }
        let dead: Vec<(u32, u64)> = self
            .ioctls
            .iter()
            .filter(|(k, o)| !alive(o.pid, k.0))
            .map(|(k, _)| *k)
            .collect();
        for k in dead {
            if let Some(o) = self.ioctls.remove(&k) {
                self.end_incomplete(o, k.0, mono, "thread_exited");
            }
        }
        self.recent.retain(|_, r| r.at.elapsed() < RECENT_FOR);
        let open_pids: Vec<u32> = self.cuinit.values().map(|o| o.pid).collect();
        self.procs
            .retain(|pid, _| open_pids.contains(pid) || root.join(pid.to_string()).exists());
        // Re-measure the wall-clock offset when nothing is open (NTP steps), so that the
        // spans of one trace always share one offset.
        if self.cuinit.is_empty() && self.ioctls.is_empty() {
            self.clock = Clock::measure();
        }
    }

    fn log_drops(&mut self, force: bool) {
        let now = Instant::now();
        if !force && now < self.next_log {
            return;
        }
        self.next_log = now + LOG_EVERY;
        let ev = self.stats.events_dropped.load(Ordering::Relaxed);
        let sp = self.stats.spans_dropped.load(Ordering::Relaxed);
        if ev != self.logged_events_dropped || sp != self.logged_spans_dropped {
            tracing::warn!(
                target: crate::export::log::TARGET,
                event = "otlp_dropped",
                events_dropped_total = ev,
                spans_dropped_total = sp,
                events_dropped = ev - self.logged_events_dropped,
                spans_dropped = sp - self.logged_spans_dropped,
                "OTLP exporter dropped data (queue full or endpoint failing)"
            );
            self.logged_events_dropped = ev;
            self.logged_spans_dropped = sp;
        }
    }

    // --- exporting

    fn export_due(&mut self) {
        // Bounded work per wake-up, so that events keep being read.
        for _ in 0..8 {
            let now = Instant::now();
            if let Some((batch, attempt, at)) = self.retry.take() {
                if now < at {
                    self.retry = Some((batch, attempt, at));
                    return;
                }
                self.send(batch, attempt);
                if self.retry.is_some() {
                    return;
                }
                continue;
            }
            let due = !self.pending.is_empty()
                && (self.urgent
                    || now >= self.next_export
                    || self.pending.len() >= self.cfg.max_batch.max(1));
            if !due {
                if self.pending.is_empty() {
                    self.urgent = false;
                }
                return;
            }
            let n = self.pending.len().min(self.cfg.max_batch.max(1));
            let batch: Vec<Span> = self.pending.drain(..n).collect();
            if self.pending.is_empty() {
                self.urgent = false;
                self.next_export = now + self.cfg.export_interval;
            }
            self.send(batch, 0);
            if self.retry.is_some() {
                return;
            }
        }
    }

    fn encode(&self, spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
        .encode_to_vec()
    }

    /// One attempt; on a retryable failure the batch is kept for later (or dropped after
    /// [`MAX_RETRIES`]).
    fn send(&mut self, batch: Vec<Span>, attempt: u32) {
        let n = batch.len() as u64;
        let body = self.encode(batch.clone());
        match self.http.post(body) {
            Sent::Ok { rejected } => {
                let rejected = rejected.clamp(0, n as i64) as u64;
                self.stats
                    .spans_exported
                    .fetch_add(n - rejected, Ordering::Relaxed);
                if rejected > 0 {
                    self.stats
                        .spans_dropped
                        .fetch_add(rejected, Ordering::Relaxed);
                }
                if let Some(why) = self.failing.take() {
                    tracing::info!(
                        target: crate::export::log::TARGET,
                        event = "otlp_export_recovered",
                        previous_error = %why,
                        "OTLP export works again"
                    );
                }
            }
            Sent::Retry { why, after } if attempt < MAX_RETRIES => {
                self.stats.export_failures.fetch_add(1, Ordering::Relaxed);
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << attempt.min(10))
                    .min(MAX_BACKOFF);
                let delay = after.unwrap_or(backoff);
                if self.failing.is_none() {
                    tracing::warn!(
                        target: crate::export::log::TARGET,
                        event = "otlp_export_failed",
                        error = %why,
                        retry_in_seconds = delay.as_secs_f64(),
                        "OTLP export failed; retrying"
                    );
                    self.failing = Some(why);
                }
                self.retry = Some((batch, attempt + 1, Instant::now() + delay));
            }
            Sent::Retry { why, .. } | Sent::Fatal { why } => {
                self.stats.export_failures.fetch_add(1, Ordering::Relaxed);
                self.stats.spans_dropped.fetch_add(n, Ordering::Relaxed);
                tracing::warn!(
                    event = "otlp_export_failed",
                    error = %why,
                    spans = n,
                    "OTLP export failed; spans dropped"
                );
                self.failing = Some(why);
            }
        }
    }

    /// Queue closed: open spans end as incomplete, everything is sent once (no waiting for
    /// backoff), within the shutdown timeout.
    fn shutdown(&mut self) {
        let mono = crate::clock::monotonic_ns();
        let open: Vec<(u32, OpenSpan)> = self.cuinit.drain().collect();
        for (tid, o) in open {
            self.end_incomplete(o, tid, mono, "agent_stopped");
        }
        let open: Vec<((u32, u64), OpenSpan)> = self.ioctls.drain().collect();
        for ((tid, _), o) in open {
            self.end_incomplete(o, tid, mono, "agent_stopped");
        }
        let deadline = Instant::now() + self.cfg.shutdown_timeout;
        if let Some((batch, _, _)) = self.retry.take() {
            for s in batch.into_iter().rev() {
                self.pending.push_front(s);
            }
        }
        self.http.timeout = self.http.timeout.min(self.cfg.shutdown_timeout);
        while !self.pending.is_empty() && Instant::now() < deadline {
            let n = self.pending.len().min(self.cfg.max_batch.max(1));
            let batch: Vec<Span> = self.pending.drain(..n).collect();
            self.send(batch, MAX_RETRIES);
        }
        let left = self.pending.len() as u64;
        if left > 0 {
            self.stats.spans_dropped.fetch_add(left, Ordering::Relaxed);
        }
        self.log_drops(true);
    }
}

/// The kernel's host name (`uname -n`).
fn host_name() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: nodename is NUL-terminated by the kernel.
    unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

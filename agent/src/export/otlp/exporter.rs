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
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span};
use prost::Message;

use super::attributes::kv_str;
use super::client::{Endpoint, HttpClient, Sent};
use super::{Compression, Msg, OtlpConfig, OtlpStats, SERVICE_NAME};
use crate::event::{Clock, Event, Kind, Process, Trigger};

/// `Span.flags`: W3C trace flags `sampled`, and bit 8 (`CONTEXT_HAS_IS_REMOTE`) set with
/// bit 9 clear: the parent, when there is one, is local.
pub(super) const SPAN_FLAGS: u32 = 0x01 | 0x100;
/// Retries of one batch before it is dropped (so 1 + 5 attempts).
const MAX_RETRIES: u32 = 5;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a just-ended span stays the one a later diagnosis of its process concerns.
pub(super) const RECENT_FOR: Duration = Duration::from_secs(10);
/// At most this often, a log line about drops and failures.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether an event can become part of a trace (the others are not queued at all).
pub(super) fn traced(ev: &Event) -> bool {
    ev.process.is_some()
        && match &ev.kind {
            Kind::CuinitStart { .. }
            | Kind::Ioctl(_)
            | Kind::Open(_)
            | Kind::ContextCall(_)
            | Kind::Stall(_)
            | Kind::StallEnd(_) => true,
            Kind::Diagnosis(d) => d.trigger != Trigger::Evidence,
            // `cuInit` calls whose start was not reported were not traced.
            Kind::CuinitEnd(c) => c.start_reported(),
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
pub(super) struct OpenSpan {
    /// Span name (`cuInit`, the ioctl's name).
    pub(super) name: String,
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    pub(super) parent: Option<[u8; 8]>,
    pub(super) pid: u32,
    /// Start (monotonic ns), when seen.
    pub(super) start_ns: Option<u64>,
    pub(super) flags: Option<u32>,
    pub(super) events: Vec<span::Event>,
    /// The parent is the span the process was started in (`TRACEPARENT`), not one of ours:
    /// a start-up span that joined the workload's trace, still a root among uvmwatch's.
    pub(super) joined: bool,
}

impl OpenSpan {
    /// A child of another uvmwatch span (a driver call inside `cuInit`).
    pub(super) fn is_child(&self) -> bool {
        self.parent.is_some() && !self.joined
    }
}

/// A span that just ended: a diagnosis of its process arriving right after belongs to it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Recent {
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    pub(super) at: Instant,
}

pub(super) struct ProcEntry {
    pub(super) info: Arc<Process>,
    /// Root-span attributes.
    pub(super) attrs: Vec<KeyValue>,
}

pub(super) struct Exporter {
    pub(super) cfg: OtlpConfig,
    pub(super) stats: Arc<OtlpStats>,
    pub(super) http: HttpClient,
    pub(super) clock: Clock,
    pub(super) ids: Ids,
    pub(super) resource: Resource,
    pub(super) scope: InstrumentationScope,
    pub(super) procs: HashMap<u32, ProcEntry>,
    /// `cuInit` calls in flight, by thread.
    pub(super) cuinit: HashMap<u32, OpenSpan>,
    /// Stalled ioctls in flight, by (thread, start).
    pub(super) ioctls: HashMap<(u32, u64), OpenSpan>,
    pub(super) recent: HashMap<u32, Recent>,
    pub(super) pending: VecDeque<Span>,
    /// A stall or diagnosis waits: export without waiting for the interval.
    pub(super) urgent: bool,
    pub(super) next_export: Instant,
    /// A batch that failed, to send again at `retry_at`.
    pub(super) retry: Option<(Vec<Span>, u32, Instant)>,
    pub(super) next_housekeeping: Instant,
    pub(super) next_log: Instant,
    pub(super) logged_events_dropped: u64,
    pub(super) logged_spans_dropped: u64,
    /// Export failing since (for one log line per outage, not one per attempt).
    pub(super) failing: Option<String>,
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
        crate::write_record!(
            crate::export::log::schema::OTLP_STARTED,
            endpoint = %format!("http://{}{}", endpoint.authority, endpoint.path),
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
            crate::write_record!(
                crate::export::log::schema::OTLP_DROPPED,
                events_dropped_total = ev,
                spans_dropped_total = sp,
                events_dropped = ev - self.logged_events_dropped,
                spans_dropped = sp - self.logged_spans_dropped,
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
                    crate::write_record!(
                        crate::export::log::schema::OTLP_EXPORT_RECOVERED,
                        previous_error = %why,
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
                    crate::write_record!(
                        crate::export::log::schema::OTLP_EXPORT_RETRYING,
                        error = %why,
                        retry_in_seconds = delay.as_secs_f64(),
                    );
                    self.failing = Some(why);
                }
                self.retry = Some((batch, attempt + 1, Instant::now() + delay));
            }
            Sent::Retry { why, .. } | Sent::Fatal { why } => {
                self.stats.export_failures.fetch_add(1, Ordering::Relaxed);
                self.stats.spans_dropped.fetch_add(n, Ordering::Relaxed);
                crate::write_record!(
                    crate::export::log::schema::OTLP_EXPORT_DROPPED,
                    error = %why,
                    spans = n,
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

//! Live trace annotation: an OTLP/HTTP (protobuf) trace exporter as a [`Listener`].
//!
//! The observer's loop calls [`OtlpListener::event`]; it only puts the shared event into a
//! bounded queue (`try_send`: a full queue drops the event and counts it, it never waits).
//! A background thread (`uvmwatch-otlp`, `exporter.rs`) turns events into spans, batches them
//! and POSTs `ExportTraceServiceRequest`s to `<endpoint>/v1/traces` (`client.rs`), retrying
//! with backoff; `spans.rs` is how events become spans. Messages are the official OTLP
//! protobuf definitions (the
//! `opentelemetry-proto` crate, encoded with `prost`); the HTTP client is the `hyper`
//! already in the agent (for its `/metrics`). Process attributes come from the identity the
//! event carries (`attributes.rs`).
//!
//! What becomes a span (names per `docs/otlp.md`):
//! - every `cuInit` call: a root span `cuInit` (a trace of its own), status `ERROR` with
//!   the `CUresult` name when it returns non-zero;
//! - inside it, each driver ioctl (span named by the ioctl, e.g. `UVM_REGISTER_GPU`) and
//!   each NVIDIA device open (`open /dev/nvidiactl`) as child spans;
//! - outside `cuInit`, slow or failed ioctls and failed opens as root spans;
//! - stalls, their end, and diagnoses as span events on the span they concern.
//!
//! OTLP cannot update a span already sent, and a `cuInit` span is only sent when the call
//! ends, which for a hang may be never. So the span ids of a `cuInit` are chosen when it
//! starts (and those of a stalled ioctl when its stall is detected), and when a stall is
//! detected a short span `uvmwatch.stall` is exported at once, as a child of the still-open
//! span, carrying the `uvmwatch.stall` event; the event is put again on the span itself
//! when that ends. The findings of a stall (carried by its event) ride on the same
//! `uvmwatch.stall` span; those of a failure on the failed call's span, or on a
//! `uvmwatch.diagnosis` span of their own when there is none.
//!
//! Attribute names follow the OpenTelemetry semantic conventions where one exists
//! (`service.*`, `host.name`, `k8s.*`, `container.id`, `process.*`, `thread.id`,
//! `file.path`, `error.type`); the rest are under `uvmwatch.`.

mod attributes;
mod client;
mod exporter;
mod spans;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::header::{HeaderName, HeaderValue};

pub use attributes::command_line;
use client::Endpoint;
use exporter::Exporter;

use crate::event::{Event, Listener};

/// `service.name` of the resource.
pub const SERVICE_NAME: &str = "uvmwatch";
/// Name of the span exported when a stall is detected, and of the stall event.
pub const STALL: &str = "uvmwatch.stall";
/// Name of the event recorded when a stalled call ends.
pub const STALL_END: &str = "uvmwatch.stall_end";
/// Name of the span (when needed) and of the event carrying a diagnosis.
pub const DIAGNOSIS: &str = "uvmwatch.diagnosis";
/// Path appended to an endpoint that does not already end with it (OTLP/HTTP spec).
pub const TRACES_PATH: &str = "/v1/traces";

/// Body compression.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// None (the OTLP default).
    #[default]
    None,
    /// `Content-Encoding: gzip`.
    Gzip,
}

impl Compression {
    /// Parses `none` or `gzip` (for `--otlp-compression`).
    ///
    /// # Errors
    /// Any other value.
    pub fn parse(s: &str) -> std::result::Result<Compression, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            other => Err(format!("{other:?}: expected none or gzip")),
        }
    }
}

/// Parses `KEY=VALUE` (for `--otlp-header`); the key and value are checked as HTTP header
/// name and value.
///
/// # Errors
/// No `=`, or an invalid header name or value.
pub fn parse_header(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header name {k:?}: {e}"))?;
    HeaderValue::from_str(v).map_err(|e| format!("header value for {k}: {e}"))?;
    Ok((k.to_string(), v.to_string()))
}

/// Settings of the exporter. [`OtlpConfig::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// `http://host:port[/path]`. The spans go to `<endpoint>/v1/traces`, or to the URL as
    /// given when it already ends with `/v1/traces`. `https` is refused (no TLS in the
    /// agent: send to a local collector that forwards over TLS).
    pub endpoint: String,
    /// Extra request headers (`--otlp-header KEY=VALUE`), e.g. a tenant id.
    pub headers: Vec<(String, String)>,
    /// Body compression.
    pub compression: Compression,
    /// Timeout of one export request, connection included (OTLP default 10 s).
    pub timeout: Duration,
    /// `/proc`, to close the spans of threads that vanished (another root only in tests).
    pub proc_root: std::path::PathBuf,
    /// `host.name`; `None`: the kernel's host name.
    pub host_name: Option<String>,
    /// `k8s.node.name`; `None`: `$NODE_NAME` when set (downward API `spec.nodeName`).
    pub node_name: Option<String>,
    /// `service.version`.
    pub service_version: String,
    /// Events the agent's loop may queue before it starts dropping them.
    pub queue_capacity: usize,
    /// Spans per export request at most (OTel batch processor default 512).
    pub max_batch: usize,
    /// Spans kept while the endpoint is down before the oldest are dropped.
    pub max_pending: usize,
    /// Export at least this often when spans wait (stalls and diagnoses go at once).
    pub export_interval: Duration,
    /// Bytes of `process.command_line` kept.
    pub max_command_line: usize,
    /// How often open spans of threads that vanished are closed, and caches pruned.
    pub housekeeping_interval: Duration,
    /// How long dropping the sink waits for the last export.
    pub shutdown_timeout: Duration,
}

impl OtlpConfig {
    /// Defaults for `endpoint`: no extra headers, no compression, 10 s timeout, `/proc`,
    /// queue of 4096 events, batches of 512 spans, 16384 spans kept while the endpoint is
    /// down, export every second, command lines cut at 1024 bytes.
    pub fn new(endpoint: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            headers: Vec::new(),
            compression: Compression::None,
            timeout: Duration::from_secs(10),
            proc_root: "/proc".into(),
            host_name: None,
            node_name: None,
            service_version: env!("CARGO_PKG_VERSION").to_string(),
            queue_capacity: 4096,
            max_batch: 512,
            max_pending: 16384,
            export_interval: Duration::from_secs(1),
            max_command_line: 1024,
            housekeeping_interval: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters of the exporter, shared with the background thread (read them for metrics).
#[derive(Debug, Default)]
pub struct OtlpStats {
    /// Events not queued because the queue was full (the agent's loop never waits).
    pub events_dropped: AtomicU64,
    /// Spans the endpoint accepted.
    pub spans_exported: AtomicU64,
    /// Spans given up: refused by the endpoint, still failing after the retries, or pushed
    /// out of the buffer while the endpoint was unreachable.
    pub spans_dropped: AtomicU64,
    /// Export requests that failed (every attempt counts).
    pub export_failures: AtomicU64,
}

/// The OTLP exporter. Create it with [`OtlpListener::start`] and hand it to the observer as
/// a `Box<dyn Listener>`; dropping it sends what is left (waiting at most
/// [`OtlpConfig::shutdown_timeout`]).
pub struct OtlpListener {
    tx: Option<SyncSender<Msg>>,
    stats: Arc<OtlpStats>,
    thread: Option<JoinHandle<()>>,
    done: Receiver<()>,
    shutdown_timeout: Duration,
    /// A failure or stall waiting for the findings that follow it, so that they reach the
    /// thread together (a stall's findings then always ride on its marker span).
    group: Vec<Arc<Event>>,
    /// Findings still to come for `group`.
    awaited: usize,
}

impl OtlpListener {
    /// Validates the configuration and starts the exporting thread. Nothing is sent until
    /// there is a span: an unreachable endpoint is not an error here (it is retried and
    /// logged).
    ///
    /// # Errors
    /// The endpoint is not an `http://` URL with a host, a header is not a valid HTTP
    /// header, or the thread cannot start.
    pub fn start(cfg: OtlpConfig) -> Result<OtlpListener> {
        let endpoint = Endpoint::parse(&cfg.endpoint)?;
        let mut headers = Vec::new();
        for (k, v) in &cfg.headers {
            let name = HeaderName::from_bytes(k.trim().as_bytes())
                .with_context(|| format!("--otlp-header: bad header name {k:?}"))?;
            let value = HeaderValue::from_str(v.trim())
                .with_context(|| format!("--otlp-header: bad value for {k}"))?;
            headers.push((name, value));
        }
        let stats = Arc::new(OtlpStats::default());
        let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity.max(1));
        let (done_tx, done) = mpsc::channel();
        let shutdown_timeout = cfg.shutdown_timeout;
        let st = stats.clone();
        let thread = std::thread::Builder::new()
            .name("uvmwatch-otlp".into())
            .spawn(move || {
                match Exporter::new(cfg, endpoint, headers, st) {
                    Ok(mut e) => e.run(rx),
                    Err(e) => crate::write_record!(
                        crate::export::log::schema::OTLP_EXPORTER_FAILED,
                        error = %format!("{e:#}"),
                    ),
                }
                let _ = done_tx.send(());
            })
            .context("starting the OTLP exporter thread")?;
        Ok(OtlpListener {
            tx: Some(tx),
            stats,
            thread: Some(thread),
            done,
            shutdown_timeout,
            group: Vec::new(),
            awaited: 0,
        })
    }

    /// The exporter's counters.
    pub fn stats(&self) -> Arc<OtlpStats> {
        self.stats.clone()
    }

    fn send(&mut self, m: Msg) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(m) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Listener for OtlpListener {
    fn event(&mut self, ev: &Arc<Event>) {
        if !exporter::traced(ev) {
            return;
        }
        let finding = matches!(ev.kind, crate::event::Kind::Diagnosis(_));
        if self.awaited > 0 && finding {
            self.group.push(ev.clone());
            self.awaited -= 1;
            if self.awaited == 0 {
                let g = std::mem::take(&mut self.group);
                self.send(Msg::Events(g));
            }
            return;
        }
        if !self.group.is_empty() {
            // Its findings did not come (not traced): send it alone.
            let g = std::mem::take(&mut self.group);
            self.awaited = 0;
            self.send(Msg::Events(g));
        }
        let n = ev.findings().len();
        if n > 0 {
            self.group.push(ev.clone());
            self.awaited = n;
        } else {
            self.send(Msg::Events(vec![ev.clone()]));
        }
    }

    fn flush(&mut self) {
        if !self.group.is_empty() {
            let g = std::mem::take(&mut self.group);
            self.awaited = 0;
            self.send(Msg::Events(g));
        }
        self.send(Msg::Flush);
    }
}

impl Drop for OtlpListener {
    fn drop(&mut self) {
        // Closing the queue tells the thread to end open spans, send everything, and stop.
        drop(self.tx.take());
        match self
            .done
            .recv_timeout(self.shutdown_timeout + Duration::from_secs(1))
        {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                crate::write_record!(crate::export::log::schema::OTLP_SHUTDOWN,)
            }
        }
    }
}

/// What the observer's loop hands to the exporting thread.
enum Msg {
    /// Events to turn into spans, in order: one, or a failure or stall with its findings.
    Events(Vec<Arc<Event>>),
    /// Send what waits now.
    Flush,
}

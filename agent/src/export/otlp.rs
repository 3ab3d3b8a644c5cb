//! Live trace annotation: an OTLP/HTTP (protobuf) trace exporter as a [`Sink`].
//!
//! The agent's loop calls [`OtlpSink::event`]; it only clones the event into a bounded
//! queue (`try_send`: a full queue drops the event and counts it, it never waits), and at
//! a process's first event reads its few small workload files ([`workload::read_facts`]). A
//! background thread (`uvmwatch-otlp`) turns events into spans, batches them and POSTs
//! `ExportTraceServiceRequest`s to `<endpoint>/v1/traces`, retrying with backoff. Messages
//! are the official OTLP protobuf definitions (the `opentelemetry-proto` crate, encoded with
//! `prost`); the HTTP client is the `hyper` already in the agent (for its `/metrics`).
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
//! when that ends. Diagnoses made at the same time ride on the same `uvmwatch.stall` span
//! when it has not left yet, otherwise on a `uvmwatch.diagnosis` span of their own.
//!
//! Attribute names follow the OpenTelemetry semantic conventions where one exists
//! (`service.*`, `host.name`, `k8s.*`, `container.id`, `process.*`, `thread.id`,
//! `file.path`, `error.type`); the rest are under `uvmwatch.`.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;

use crate::doctor::finding::Finding;
use crate::event::{CallEvent, Clock, ProcessInfo, Sink};
use crate::host::workload::{self, WorkloadInfo};

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
/// Largest collector response read.
const MAX_RESPONSE: usize = 1 << 20;

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
    /// `/proc`, for the workload identity (another root only in tests).
    pub proc_root: PathBuf,
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
            proc_root: PathBuf::from("/proc"),
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

/// The OTLP exporter. Create it with [`OtlpSink::start`] and hand it to the agent as a
/// `Box<dyn Sink>`; dropping it sends what is left (waiting at most
/// [`OtlpConfig::shutdown_timeout`]).
pub struct OtlpSink {
    tx: Option<SyncSender<Msg>>,
    stats: Arc<OtlpStats>,
    thread: Option<JoinHandle<()>>,
    done: Receiver<()>,
    shutdown_timeout: Duration,
    /// Process identities already passed to the thread (shared, not copied per event).
    procs: HashMap<u32, Arc<ProcessInfo>>,
    /// `/proc`, for the workload facts read at first sight.
    proc_root: PathBuf,
}

impl OtlpSink {
    /// Validates the configuration and starts the exporting thread. Nothing is sent until
    /// there is a span: an unreachable endpoint is not an error here (it is retried and
    /// logged).
    ///
    /// # Errors
    /// The endpoint is not an `http://` URL with a host, a header is not a valid HTTP
    /// header, or the thread cannot start.
    pub fn start(cfg: OtlpConfig) -> Result<OtlpSink> {
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
        let proc_root = cfg.proc_root.clone();
        let st = stats.clone();
        let thread = std::thread::Builder::new()
            .name("uvmwatch-otlp".into())
            .spawn(move || {
                match Exporter::new(cfg, endpoint, headers, st) {
                    Ok(mut e) => e.run(rx),
                    Err(e) => tracing::error!(
                        event = "otlp_exporter_failed",
                        error = %format!("{e:#}"),
                        "OTLP exporter could not start; no spans will be sent"
                    ),
                }
                let _ = done_tx.send(());
            })
            .context("starting the OTLP exporter thread")?;
        Ok(OtlpSink {
            tx: Some(tx),
            stats,
            thread: Some(thread),
            done,
            shutdown_timeout,
            procs: HashMap::new(),
            proc_root,
        })
    }

    /// The exporter's counters.
    pub fn stats(&self) -> Arc<OtlpStats> {
        self.stats.clone()
    }

    /// The shared copy of a process's identity. At first sight of a process (or of a new
    /// one under a reused pid) its workload facts are read here, on the agent's loop, while
    /// the process surely lives (it is in the call being reported; a short-lived one may be
    /// gone by the time the exporting thread gets to it): a few small procfs files, about
    /// 0.1 ms once per process. The rest of the identification runs on the thread.
    fn proc(&mut self, p: &ProcessInfo) -> Arc<ProcessInfo> {
        if let Some(a) = self.procs.get(&p.pid) {
            if **a == *p {
                return a.clone();
            }
        }
        if self.procs.len() >= 4096 {
            self.procs.clear();
        }
        let a = Arc::new(p.clone());
        self.procs.insert(p.pid, a.clone());
        let facts = workload::read_facts(&self.proc_root, p.pid);
        self.send(Msg::Identity {
            proc: a.clone(),
            facts: Box::new(facts),
        });
        a
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

impl Sink for OtlpSink {
    fn event(&mut self, ev: &CallEvent<'_>) {
        let m = match ev {
            CallEvent::CuinitStart {
                proc,
                tid,
                start_ns,
                flags,
            } => Msg::CuinitStart {
                proc: self.proc(proc),
                tid: *tid,
                start_ns: *start_ns,
                flags: *flags,
            },
            CallEvent::CuinitEnd {
                proc,
                tid,
                start_ns,
                end_ns,
                code,
                result,
            } => Msg::CuinitEnd {
                proc: self.proc(proc),
                tid: *tid,
                start_ns: *start_ns,
                end_ns: *end_ns,
                code: *code,
                result: result.to_string(),
            },
            CallEvent::Ioctl {
                proc,
                tid,
                start_ns,
                end_ns,
                name,
                node,
                result,
                failed,
                in_cuinit,
            } => Msg::Ioctl {
                proc: self.proc(proc),
                tid: *tid,
                start_ns: *start_ns,
                end_ns: *end_ns,
                name: name.to_string(),
                node: node.to_string(),
                result: result.to_string(),
                failed: *failed,
                in_cuinit: *in_cuinit,
            },
            CallEvent::Open {
                proc,
                tid,
                start_ns,
                end_ns,
                path,
                errno,
                in_cuinit,
            } => Msg::Open {
                proc: self.proc(proc),
                tid: *tid,
                start_ns: *start_ns,
                end_ns: *end_ns,
                path: path.to_string(),
                errno: errno.map(str::to_string),
                in_cuinit: *in_cuinit,
            },
            CallEvent::Stall {
                proc,
                tid,
                call,
                start_ns,
                detected_ns,
                inside,
                thread_state,
                wchan,
            } => Msg::Stall {
                proc: self.proc(proc),
                tid: *tid,
                call: call.to_string(),
                start_ns: *start_ns,
                detected_ns: *detected_ns,
                inside: inside.to_string(),
                thread_state: thread_state.to_string(),
                wchan: wchan.to_string(),
            },
            CallEvent::StallEnd {
                proc,
                tid,
                call,
                start_ns,
                end_ns,
                outcome,
            } => Msg::StallEnd {
                proc: self.proc(proc),
                tid: *tid,
                call: call.to_string(),
                start_ns: *start_ns,
                end_ns: *end_ns,
                outcome: outcome.to_string(),
            },
            CallEvent::Diagnosis {
                proc,
                ts_ns,
                finding,
                ..
            } => Msg::Diagnosis {
                proc: self.proc(proc),
                ts_ns: *ts_ns,
                finding: Box::new((*finding).clone()),
            },
            // Ring-buffer losses are in the agent's metrics; nothing to trace.
            CallEvent::Dropped { .. } => return,
        };
        self.send(m);
    }

    fn flush(&mut self) {
        self.send(Msg::Flush);
    }
}

impl Drop for OtlpSink {
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
            Err(RecvTimeoutError::Timeout) => tracing::warn!(
                event = "otlp_shutdown",
                "OTLP exporter still sending at shutdown; abandoning what is left"
            ),
        }
    }
}

/// An event as queued for the thread (owned copies).
enum Msg {
    /// A process seen for the first time, with its workload facts read then.
    Identity {
        proc: Arc<ProcessInfo>,
        facts: Box<workload::ProcFacts>,
    },
    CuinitStart {
        proc: Arc<ProcessInfo>,
        tid: u32,
        start_ns: u64,
        flags: u32,
    },
    CuinitEnd {
        proc: Arc<ProcessInfo>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        code: i64,
        result: String,
    },
    Ioctl {
        proc: Arc<ProcessInfo>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        name: String,
        node: String,
        result: String,
        failed: bool,
        in_cuinit: bool,
    },
    Open {
        proc: Arc<ProcessInfo>,
        tid: u32,
        start_ns: u64,
        end_ns: u64,
        path: String,
        errno: Option<String>,
        in_cuinit: bool,
    },
    Stall {
        proc: Arc<ProcessInfo>,
        tid: u32,
        call: String,
        start_ns: u64,
        detected_ns: u64,
        inside: String,
        thread_state: String,
        wchan: String,
    },
    StallEnd {
        proc: Arc<ProcessInfo>,
        tid: u32,
        call: String,
        start_ns: u64,
        end_ns: u64,
        outcome: String,
    },
    Diagnosis {
        proc: Arc<ProcessInfo>,
        ts_ns: u64,
        finding: Box<Finding>,
    },
    Flush,
}

// --- endpoint and HTTP ---------------------------------------------------------------------

/// A parsed `http://` endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    /// Host to connect to (IPv6 without brackets).
    host: String,
    port: u16,
    /// `Host:` header value.
    authority: String,
    /// Request path, ending in `/v1/traces`.
    path: String,
}

impl Endpoint {
    fn parse(s: &str) -> Result<Endpoint> {
        let uri: hyper::Uri = s
            .trim()
            .parse()
            .with_context(|| format!("--otlp-endpoint {s:?} is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!(
                "--otlp-endpoint {s:?}: https is not supported (the agent has no TLS); \
                 send to a local OpenTelemetry Collector over http and let it forward"
            ),
            _ => bail!("--otlp-endpoint {s:?}: expected http://host:port"),
        }
        let auth = uri
            .authority()
            .with_context(|| format!("--otlp-endpoint {s:?} has no host"))?;
        if auth.as_str().contains('@') {
            bail!(
                "--otlp-endpoint {s:?}: credentials in the URL are not supported; \
                 use --otlp-header"
            );
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            bail!("--otlp-endpoint {s:?} has no host");
        }
        let base = uri.path().trim_end_matches('/');
        let path = if base.ends_with(TRACES_PATH) {
            base.to_string()
        } else {
            format!("{base}{TRACES_PATH}")
        };
        Ok(Endpoint {
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(80),
            authority: auth.as_str().to_string(),
            path,
        })
    }
}

/// What one export attempt came to.
#[derive(Debug)]
enum Sent {
    /// Accepted; `rejected` spans refused in a partial success.
    Ok { rejected: i64 },
    /// Worth retrying (connection error, timeout, 429, 502, 503, 504), after the delay the
    /// server asked for, if any.
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Refused for good (any other status).
    Fatal { why: String },
}

/// One keep-alive HTTP/1.1 connection (hyper's connection-level client), re-opened when
/// it closes. Runs on a current-thread tokio runtime owned by the exporting thread.
struct HttpClient {
    rt: tokio::runtime::Runtime,
    endpoint: Endpoint,
    headers: Vec<(HeaderName, HeaderValue)>,
    gzip: bool,
    timeout: Duration,
    conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl HttpClient {
    fn post(&mut self, body: Vec<u8>) -> Sent {
        let body = if self.gzip {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            if enc.write_all(&body).is_err() {
                return Sent::Fatal {
                    why: "gzip failed".into(),
                };
            }
            match enc.finish() {
                Ok(b) => b,
                Err(e) => {
                    return Sent::Fatal {
                        why: format!("gzip: {e}"),
                    }
                }
            }
        } else {
            body
        };
        let timeout = self.timeout;
        let rt = &self.rt;
        let fut = Self::post_async(
            &mut self.conn,
            &self.endpoint,
            &self.headers,
            self.gzip,
            body,
        );
        match rt.block_on(async { tokio::time::timeout(timeout, fut).await }) {
            Ok(r) => r,
            Err(_) => {
                self.conn = None;
                Sent::Retry {
                    why: format!("no answer within {timeout:?}"),
                    after: None,
                }
            }
        }
    }

    async fn post_async(
        conn: &mut Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
        ep: &Endpoint,
        headers: &[(HeaderName, HeaderValue)],
        gzip: bool,
        body: Vec<u8>,
    ) -> Sent {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            *conn = None;
            let tcp = match tokio::net::TcpStream::connect((ep.host.as_str(), ep.port)).await {
                Ok(t) => t,
                Err(e) => {
                    return Sent::Retry {
                        why: format!("connecting to {}: {e}", ep.authority),
                        after: None,
                    }
                }
            };
            let _ = tcp.set_nodelay(true);
            let io = hyper_util::rt::TokioIo::new(tcp);
            match hyper::client::conn::http1::handshake(io).await {
                Ok((sender, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    *conn = Some(sender);
                }
                Err(e) => {
                    return Sent::Retry {
                        why: format!("HTTP handshake with {}: {e}", ep.authority),
                        after: None,
                    }
                }
            }
        }
        let Some(sender) = conn.as_mut() else {
            return Sent::Retry {
                why: "no connection".into(),
                after: None,
            };
        };
        if let Err(e) = sender.ready().await {
            *conn = None;
            return Sent::Retry {
                why: format!("connection closed: {e}"),
                after: None,
            };
        }
        let mut req = hyper::Request::builder()
            .method(hyper::Method::POST)
            .uri(ep.path.as_str())
            .header(hyper::header::HOST, ep.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                hyper::header::USER_AGENT,
                concat!("uvmwatch/", env!("CARGO_PKG_VERSION")),
            );
        if gzip {
            req = req.header(hyper::header::CONTENT_ENCODING, "gzip");
        }
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = match req.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => {
                return Sent::Fatal {
                    why: format!("building the request: {e}"),
                }
            }
        };
        let resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => {
                *conn = None;
                return Sent::Retry {
                    why: format!("sending to {}: {e}", ep.authority),
                    after: None,
                };
            }
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s.min(60)));
        let body = match Limited::new(resp.into_body(), MAX_RESPONSE).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                *conn = None;
                Bytes::new()
            }
        };
        if status.is_success() {
            let rejected = ExportTraceServiceResponse::decode(body.as_ref())
                .ok()
                .and_then(|r| r.partial_success)
                .map(|p| p.rejected_spans)
                .unwrap_or(0);
            return Sent::Ok { rejected };
        }
        let why = format!(
            "{} answered {status}: {}",
            ep.authority,
            String::from_utf8_lossy(&body[..body.len().min(200)])
        );
        match status.as_u16() {
            429 | 502 | 503 | 504 => Sent::Retry {
                why,
                after: retry_after,
            },
            _ => Sent::Fatal { why },
        }
    }
}

// --- ids ------------------------------------------------------------------------------------

/// Random trace and span ids: SplitMix64 seeded from `getrandom(2)` (falls back to time and
/// pid). W3C trace ids must be random and non-zero; nothing here needs them unguessable.
struct Ids(u64);

impl Ids {
    fn new() -> Ids {
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

    fn span_id(&mut self) -> [u8; 8] {
        loop {
            let v = self.next();
            if v != 0 {
                return v.to_be_bytes();
            }
        }
    }

    fn trace_id(&mut self) -> [u8; 16] {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.span_id());
        t[8..].copy_from_slice(&self.next().to_be_bytes());
        t
    }
}

// --- attributes -----------------------------------------------------------------------------

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..KeyValue::default()
    }
}

fn kv_str(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

fn kv_int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}

fn kv_f64(key: &str, v: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(v))
}

fn kv_bool(key: &str, v: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(v))
}

/// Words in an option name that mark its value as a secret (`--api-key`, `--hf-token`,
/// `--password`); `--tokenizer` and `--max-num-batched-tokens` do not match.
const SECRET_WORDS: &[&str] = &[
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pass",
    "credential",
    "credentials",
    "auth",
    "authorization",
];

fn is_secret_flag(flag: &str) -> bool {
    flag.trim_start_matches('-')
        .to_ascii_lowercase()
        .split(['-', '_', '.'])
        .any(|w| SECRET_WORDS.contains(&w))
}

/// `process.command_line`: arguments joined by spaces, values of secret-looking options
/// and URL user-info replaced by `[REDACTED]`, cut at `max` bytes (`...` marks a cut).
pub fn command_line(args: &[String], max: usize) -> String {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for a in args {
        if hide_next {
            out.push("[REDACTED]".into());
            hide_next = false;
            continue;
        }
        if a.starts_with('-') {
            if let Some((f, _)) = a.split_once('=') {
                if is_secret_flag(f) {
                    out.push(format!("{f}=[REDACTED]"));
                    continue;
                }
            } else if is_secret_flag(a) {
                hide_next = true;
            }
        }
        out.push(redact_userinfo(a));
    }
    let s = out.join(" ");
    if s.len() <= max {
        return s;
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// `scheme://user:pass@host` → `scheme://[REDACTED]@host`.
fn redact_userinfo(a: &str) -> String {
    if let Some(i) = a.find("://") {
        let rest = &a[i + 3..];
        let host_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..host_end].rfind('@') {
            return format!("{}://[REDACTED]@{}", &a[..i], &rest[at + 1..]);
        }
    }
    a.to_string()
}

/// The span attributes describing a process and its workload (on root spans).
fn process_attributes(p: &ProcessInfo, w: &WorkloadInfo, max_cmd: usize) -> Vec<KeyValue> {
    let mut a = vec![kv_int("process.pid", p.pid as i64)];
    if let Some(v) = p.ns_pid {
        a.push(kv_int("process.vpid", v as i64));
    }
    let exe_name = Path::new(p.exe.trim_end_matches(" (deleted)"))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| p.comm.clone());
    if !exe_name.is_empty() {
        a.push(kv_str("process.executable.name", exe_name));
    }
    if !p.exe.is_empty() {
        a.push(kv_str("process.executable.path", p.exe.clone()));
    }
    if !p.cmdline.is_empty() {
        a.push(kv_str(
            "process.command_line",
            command_line(&p.cmdline, max_cmd),
        ));
    }
    if let Some(c) = p.container_id.as_ref().or(w.container_id.as_ref()) {
        a.push(kv_str("container.id", c.clone()));
    }
    if let Some(v) = &w.pod_uid {
        a.push(kv_str("k8s.pod.uid", v.clone()));
    }
    if let Some(v) = &w.k8s_pod_name {
        a.push(kv_str("k8s.pod.name", v.clone()));
    }
    if let Some(v) = &w.k8s_namespace {
        a.push(kv_str("k8s.namespace.name", v.clone()));
    }
    if let Some(v) = &w.engine {
        a.push(kv_str("uvmwatch.engine", v.clone()));
    }
    if let Some(v) = &w.model {
        a.push(kv_str("uvmwatch.model", v.clone()));
    }
    if let Some(v) = &w.quantization {
        a.push(kv_str("uvmwatch.quantization", v.clone()));
    }
    if let Some(v) = w.tp_rank {
        a.push(kv_int("uvmwatch.tp_rank", v as i64));
    }
    if let Some(v) = w.tensor_parallel_size {
        a.push(kv_int("uvmwatch.tp_size", v as i64));
    }
    a
}

/// Identity of a process for the spans: from the facts read at first sight (or procfs now
/// when they were not), falling back to what the agent read of it (`ProcessInfo`) for what
/// procfs no longer shows.
fn identify(proc_root: &Path, p: &ProcessInfo, facts: Option<workload::ProcFacts>) -> WorkloadInfo {
    let mut facts = facts.unwrap_or_else(|| workload::read_facts(proc_root, p.pid));
    if facts.cmdline.is_empty() {
        facts.cmdline = p.cmdline.clone();
    }
    if facts.exe.is_none() && !p.exe.is_empty() {
        facts.exe = Some(PathBuf::from(&p.exe));
    }
    if facts.comm.is_empty() {
        facts.comm = p.comm.clone();
    }
    workload::identify_from(proc_root, p.pid, facts)
}

// --- the exporting thread -------------------------------------------------------------------

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
    info: Arc<ProcessInfo>,
    /// Root-span attributes.
    attrs: Vec<KeyValue>,
}

struct Exporter {
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
    fn new(
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

    fn run(&mut self, rx: Receiver<Msg>) {
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

    /// Root-span attributes of a process: from its [`Msg::Identity`], or identified now when
    /// that was lost (queue full) or is stale (pid reused).
    fn proc_attrs(&mut self, p: &Arc<ProcessInfo>) -> Vec<KeyValue> {
        if let Some(e) = self.procs.get(&p.pid) {
            if Arc::ptr_eq(&e.info, p) || *e.info == **p {
                return e.attrs.clone();
            }
        }
        self.identified(p, None)
    }

    fn identified(
        &mut self,
        p: &Arc<ProcessInfo>,
        facts: Option<workload::ProcFacts>,
    ) -> Vec<KeyValue> {
        let w = identify(&self.cfg.proc_root, p, facts);
        let attrs = process_attributes(p, &w, self.cfg.max_command_line);
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

    fn event(&self, name: &str, ts_ns: u64, attributes: Vec<KeyValue>) -> span::Event {
        span::Event {
            time_unix_nano: self.to_unix(ts_ns),
            name: name.to_string(),
            attributes,
            ..span::Event::default()
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Identity { proc, facts } => {
                self.identified(&proc, Some(*facts));
            }
            Msg::CuinitStart {
                proc,
                tid,
                start_ns,
                flags,
            } => {
                if let Some(old) = self.cuinit.remove(&tid) {
                    // Its end was lost: close it where the next one starts.
                    self.end_incomplete(old, tid, start_ns, "superseded");
                }
                let mut o = self.new_open("cuInit", proc.pid, None);
                o.start_ns = Some(start_ns);
                o.flags = Some(flags);
                self.cuinit.insert(tid, o);
            }
            Msg::CuinitEnd {
                proc,
                tid,
                start_ns,
                end_ns,
                code,
                result,
            } => {
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
                attrs.push(kv_str("uvmwatch.cuinit.result", result.clone()));
                attrs.push(kv_int("uvmwatch.cuinit.result_code", code));
                if let Some(f) = o.flags {
                    attrs.push(kv_int("uvmwatch.cuinit.flags", f as i64));
                }
                let error = (code != 0).then(|| {
                    attrs.push(kv_str("error.type", result.clone()));
                    result.clone()
                });
                let s = self.span(
                    o.trace_id, o.span_id, None, "cuInit", start_ns, end_ns, attrs, o.events, error,
                );
                self.remember(proc.pid, o.trace_id, o.span_id);
                self.push(s);
            }
            Msg::Ioctl {
                proc,
                tid,
                start_ns,
                end_ns,
                name,
                node,
                result,
                failed,
                in_cuinit,
            } => {
                let o = match self.ioctls.remove(&(tid, start_ns)) {
                    Some(o) => o,
                    None => self.child_or_root(&name, &proc, tid, in_cuinit),
                };
                let mut attrs = if o.parent.is_some() {
                    vec![kv_int("process.pid", proc.pid as i64)]
                } else {
                    self.proc_attrs(&proc)
                };
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("uvmwatch.ioctl.name", name.clone()));
                attrs.push(kv_str("uvmwatch.ioctl.node", node));
                attrs.push(kv_str("uvmwatch.ioctl.result", result.clone()));
                if result.starts_with("NV_") {
                    attrs.push(kv_str("uvmwatch.ioctl.rm_status", result.clone()));
                }
                if !in_cuinit {
                    attrs.push(kv_bool("uvmwatch.ioctl.in_cuinit", false));
                }
                let error = failed.then(|| {
                    attrs.push(kv_str("error.type", result.clone()));
                    result.clone()
                });
                let s = self.span(
                    o.trace_id, o.span_id, o.parent, &name, start_ns, end_ns, attrs, o.events,
                    error,
                );
                if o.parent.is_none() {
                    self.remember(proc.pid, o.trace_id, o.span_id);
                }
                self.push(s);
            }
            Msg::Open {
                proc,
                tid,
                start_ns,
                end_ns,
                path,
                errno,
                in_cuinit,
            } => {
                let o = self.child_or_root("open", &proc, tid, in_cuinit);
                let mut attrs = if o.parent.is_some() {
                    vec![kv_int("process.pid", proc.pid as i64)]
                } else {
                    self.proc_attrs(&proc)
                };
                attrs.push(kv_int("thread.id", tid as i64));
                attrs.push(kv_str("file.path", path.clone()));
                let error = errno.inspect(|e| attrs.push(kv_str("error.type", e.clone())));
                let s = self.span(
                    o.trace_id,
                    o.span_id,
                    o.parent,
                    &format!("open {path}"),
                    start_ns,
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
            Msg::Stall {
                proc,
                tid,
                call,
                start_ns,
                detected_ns,
                inside,
                thread_state,
                wchan,
            } => {
                let mut a = vec![
                    kv_str("uvmwatch.stall.call", call.clone()),
                    kv_f64(
                        "uvmwatch.stall.age_seconds",
                        detected_ns.saturating_sub(start_ns) as f64 / 1e9,
                    ),
                    kv_int("thread.id", tid as i64),
                ];
                if !inside.is_empty() {
                    a.push(kv_str("uvmwatch.stall.inside", inside));
                }
                if !thread_state.is_empty() {
                    a.push(kv_str("uvmwatch.thread.state", thread_state));
                }
                if !wchan.is_empty() {
                    a.push(kv_str("uvmwatch.thread.wchan", wchan));
                }
                let ev = self.event(STALL, detected_ns, a);
                let (trace_id, span_id) = self.open_target(&proc, tid, &call, start_ns);
                self.add_open_event(tid, &call, start_ns, ev.clone());
                self.live_marker(&proc, tid, trace_id, span_id, STALL, detected_ns, ev);
            }
            Msg::StallEnd {
                proc,
                tid,
                call,
                start_ns,
                end_ns,
                outcome,
            } => {
                let ev = self.event(
                    STALL_END,
                    end_ns,
                    vec![
                        kv_str("uvmwatch.stall.call", call.clone()),
                        kv_str("uvmwatch.stall.outcome", outcome.clone()),
                        kv_f64(
                            "uvmwatch.stall.duration_seconds",
                            end_ns.saturating_sub(start_ns) as f64 / 1e9,
                        ),
                    ],
                );
                self.add_open_event(tid, &call, start_ns, ev);
                if outcome != "returned" {
                    // No end event will come: end the span here.
                    let o = if call == "cuInit" {
                        self.cuinit.remove(&tid)
                    } else {
                        self.ioctls.remove(&(tid, start_ns))
                    };
                    if let Some(o) = o {
                        self.end_open(&proc, o, tid, &call, start_ns, end_ns, &outcome);
                    }
                }
                self.urgent = true;
            }
            Msg::Diagnosis {
                proc,
                ts_ns,
                finding,
            } => self.diagnosis(&proc, ts_ns, &finding),
            Msg::Flush => self.urgent = true,
        }
    }

    /// Ids for an ioctl or open: a child of the thread's `cuInit` when it is inside one (an
    /// open `cuInit` is made up when its start was not seen, so that its end joins it), or
    /// the root of a new trace.
    fn child_or_root(
        &mut self,
        name: &str,
        proc: &ProcessInfo,
        tid: u32,
        in_cuinit: bool,
    ) -> OpenSpan {
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
        proc: &ProcessInfo,
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
        proc: &ProcessInfo,
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

    fn diagnosis(&mut self, proc: &Arc<ProcessInfo>, ts_ns: u64, f: &Finding) {
        let evidence: Vec<String> = f
            .evidence
            .iter()
            .map(|e| format!("{}={} [{}]", e.what, e.value, e.source))
            .collect();
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
            kv_str(
                "uvmwatch.diagnosis.confidence",
                format!("{:?}", f.confidence).to_ascii_lowercase(),
            ),
            kv_str("uvmwatch.diagnosis.title", f.title.clone()),
            kv_str("uvmwatch.diagnosis.runbook", f.runbook.clone()),
        ];
        if !evidence.is_empty() {
            a.push(kv_str("uvmwatch.diagnosis.evidence", evidence.join("; ")));
        }
        if !fix.is_empty() {
            a.push(kv_str("uvmwatch.diagnosis.fix", fix.join(" | ")));
        }
        let ev = self.event(DIAGNOSIS, ts_ns, a);
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
        proc: &Arc<ProcessInfo>,
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
                        Arc::new(ProcessInfo {
                            pid: o.pid,
                            ..ProcessInfo::default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::finding::{Confidence, EvidenceItem, FixStep, Severity, Where};
    use std::io::{BufRead, BufReader, Read};
    use std::net::TcpListener;
    use std::sync::Mutex;

    /// A minimal OTLP/HTTP receiver: decodes every `ExportTraceServiceRequest` with the
    /// official definitions and answers with the queued status codes (then 200).
    struct Collector {
        port: u16,
        got: Arc<Mutex<Vec<(Instant, ExportTraceServiceRequest)>>>,
        statuses: Arc<Mutex<VecDeque<u16>>>,
        encodings: Arc<Mutex<Vec<String>>>,
    }

    impl Collector {
        fn start() -> Collector {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let c = Collector {
                port,
                got: Default::default(),
                statuses: Default::default(),
                encodings: Default::default(),
            };
            let (got, statuses, enc) = (c.got.clone(), c.statuses.clone(), c.encodings.clone());
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(s) = s else { break };
                    let (got, statuses, enc) = (got.clone(), statuses.clone(), enc.clone());
                    std::thread::spawn(move || serve(s, got, statuses, enc));
                }
            });
            c
        }

        fn endpoint(&self) -> String {
            format!("http://127.0.0.1:{}", self.port)
        }

        fn spans(&self) -> Vec<Span> {
            self.got
                .lock()
                .unwrap()
                .iter()
                .flat_map(|(_, r)| r.resource_spans.iter())
                .flat_map(|rs| rs.scope_spans.iter())
                .flat_map(|ss| ss.spans.iter().cloned())
                .collect()
        }

        fn wait(&self, what: &str, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
            let end = Instant::now() + Duration::from_secs(10);
            loop {
                let s = self.spans();
                if pred(&s) {
                    return s;
                }
                assert!(Instant::now() < end, "no {what}; got {s:#?}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn serve(
        s: std::net::TcpStream,
        got: Arc<Mutex<Vec<(Instant, ExportTraceServiceRequest)>>>,
        statuses: Arc<Mutex<VecDeque<u16>>>,
        enc: Arc<Mutex<Vec<String>>>,
    ) {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            assert!(line.starts_with("POST /v1/traces HTTP/1.1"), "{line}");
            let (mut len, mut encoding) = (0usize, String::new());
            let mut ctype = String::new();
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap(),
                    "content-encoding" => encoding = v.trim().to_string(),
                    "content-type" => ctype = v.trim().to_string(),
                    _ => {}
                }
            }
            assert_eq!(ctype, "application/x-protobuf");
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            if encoding == "gzip" {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&body[..])
                    .read_to_end(&mut out)
                    .unwrap();
                body = out;
            }
            enc.lock().unwrap().push(encoding);
            let status = statuses.lock().unwrap().pop_front().unwrap_or(200);
            if status == 200 {
                let req = ExportTraceServiceRequest::decode(&body[..]).expect("valid OTLP");
                got.lock().unwrap().push((Instant::now(), req));
            }
            let resp = ExportTraceServiceResponse::default().encode_to_vec();
            write!(
                w,
                "HTTP/1.1 {status} X\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
                resp.len()
            )
            .unwrap();
            w.write_all(&resp).unwrap();
        }
    }

    fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
        attrs
            .iter()
            .find(|k| k.key == key)
            .and_then(|k| k.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn s_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
        match attr(attrs, key) {
            Some(any_value::Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }

    fn i_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
        match attr(attrs, key) {
            Some(any_value::Value::IntValue(i)) => Some(*i),
            _ => None,
        }
    }

    /// A procfs-like tree with a vLLM server as pid 4242 (thread 4243 alive).
    fn fake_proc() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("4242");
        std::fs::create_dir_all(d.join("task/4243")).unwrap();
        std::fs::write(
            d.join("cmdline"),
            "/usr/bin/python3\0/usr/local/bin/vllm\0serve\0nvidia/Llama-3.1-8B-Instruct-FP4\0--api-key\0sk-123\0",
        )
        .unwrap();
        std::fs::write(
            d.join("environ"),
            "RANK=1\0POD_NAMESPACE=llm\0HOSTNAME=vllm-0\0",
        )
        .unwrap();
        std::fs::write(d.join("stat"), "4242 (python3) S 1 1 1").unwrap();
        std::fs::write(d.join("cgroup"), "0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n").unwrap();
        t
    }

    fn proc_info() -> ProcessInfo {
        ProcessInfo {
            pid: 4242,
            ns_pid: Some(7),
            comm: "python3".into(),
            exe: "/usr/bin/python3.12".into(),
            cmdline: [
                "/usr/bin/python3",
                "/usr/local/bin/vllm",
                "serve",
                "nvidia/Llama-3.1-8B-Instruct-FP4",
                "--api-key",
                "sk-123",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            container_id: Some(
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
            ),
        }
    }

    fn config(c: &Collector, root: &Path) -> OtlpConfig {
        let mut cfg = OtlpConfig::new(c.endpoint());
        cfg.proc_root = root.to_path_buf();
        cfg.export_interval = Duration::from_secs(30);
        cfg.host_name = Some("gpu-node-1".into());
        cfg.node_name = Some("node-a".into());
        cfg
    }

    fn finding() -> Finding {
        Finding {
            rule: "uvm_register_gpu_no_memory".into(),
            title: "UVM could not register the GPU".into(),
            severity: Severity::Critical,
            confidence: Confidence::High,
            evidence: vec![EvidenceItem {
                what: "UVM_REGISTER_GPU".into(),
                value: "NV_ERR_NO_MEMORY".into(),
                source: "probe:ioctl".into(),
            }],
            unchecked: vec![],
            fix: vec![FixStep {
                where_: Where::Host,
                commands: vec!["nvidia-smi -q".into()],
                note: "look".into(),
            }],
            runbook: "docs/runbooks/uvm_register_gpu_no_memory.md".into(),
        }
    }

    struct Seq {
        t: u64,
    }
    impl Seq {
        fn new() -> Seq {
            Seq {
                t: crate::clock::monotonic_ns(),
            }
        }
        fn at(&mut self, ms: u64) -> u64 {
            self.t += ms * 1_000_000;
            self.t
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        sink: &mut OtlpSink,
        p: &ProcessInfo,
        tid: u32,
        s: u64,
        e: u64,
        name: &str,
        result: &str,
        failed: bool,
        in_cuinit: bool,
    ) {
        sink.event(&CallEvent::Ioctl {
            proc: p,
            tid,
            start_ns: s,
            end_ns: e,
            name,
            node: "/dev/nvidia-uvm",
            result,
            failed,
            in_cuinit,
        });
    }

    #[test]
    fn cuinit_is_a_root_span_with_its_driver_calls_as_children() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let mut t = Seq::new();
        let t0 = t.at(0);
        let wall_before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            flags: 0,
        });
        let (o1, o2) = (t.at(1), t.at(1));
        sink.event(&CallEvent::Open {
            proc: &p,
            tid: 4243,
            start_ns: o1,
            end_ns: o2,
            path: "/dev/nvidiactl",
            errno: None,
            in_cuinit: true,
        });
        let mut names = Vec::new();
        for n in ["UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU"] {
            let (s, e) = (t.at(1), t.at(2));
            ioctl(&mut sink, &p, 4243, s, e, n, "NV_OK", false, true);
            names.push(n);
        }
        let end = t.at(3);
        sink.event(&CallEvent::CuinitEnd {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            end_ns: end,
            code: 0,
            result: "CUDA_SUCCESS",
        });
        sink.flush();
        let spans = c.wait("5 spans", |s| s.len() >= 5);
        drop(sink);
        assert_eq!(spans.len(), 5, "{spans:#?}");
        let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
        assert!(cu.parent_span_id.is_empty());
        assert_eq!(cu.kind, span::SpanKind::Internal as i32);
        assert_eq!(cu.trace_id.len(), 16);
        assert_eq!(cu.span_id.len(), 8);
        assert!(cu.status.is_none(), "success leaves the status unset");
        assert_eq!(cu.end_time_unix_nano - cu.start_time_unix_nano, end - t0);
        // Wall clock: the monotonic times were converted (within a second of now).
        assert!(cu.start_time_unix_nano + 1_000_000_000 > wall_before);
        assert!(cu.start_time_unix_nano < wall_before + 1_000_000_000);
        let a = &cu.attributes;
        assert_eq!(i_attr(a, "process.pid"), Some(4242));
        assert_eq!(i_attr(a, "process.vpid"), Some(7));
        assert_eq!(i_attr(a, "thread.id"), Some(4243));
        assert_eq!(s_attr(a, "process.executable.name"), Some("python3.12"));
        assert_eq!(
            s_attr(a, "process.command_line"),
            Some("/usr/bin/python3 /usr/local/bin/vllm serve nvidia/Llama-3.1-8B-Instruct-FP4 --api-key [REDACTED]")
        );
        assert_eq!(s_attr(a, "uvmwatch.engine"), Some("vllm"));
        assert_eq!(
            s_attr(a, "uvmwatch.model"),
            Some("nvidia/Llama-3.1-8B-Instruct-FP4")
        );
        assert_eq!(s_attr(a, "uvmwatch.quantization"), Some("nvfp4"));
        assert_eq!(i_attr(a, "uvmwatch.tp_rank"), Some(1));
        assert_eq!(s_attr(a, "k8s.namespace.name"), Some("llm"));
        assert_eq!(s_attr(a, "k8s.pod.name"), Some("vllm-0"));
        assert_eq!(
            s_attr(a, "k8s.pod.uid"),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert!(s_attr(a, "container.id").unwrap().starts_with("0123"));
        assert_eq!(s_attr(a, "uvmwatch.cuinit.result"), Some("CUDA_SUCCESS"));
        for s in spans.iter().filter(|s| s.name != "cuInit") {
            assert_eq!(s.trace_id, cu.trace_id, "{}", s.name);
            assert_eq!(s.parent_span_id, cu.span_id, "{}", s.name);
            assert!(s.start_time_unix_nano >= cu.start_time_unix_nano);
            assert!(s.end_time_unix_nano <= cu.end_time_unix_nano);
            assert!(s.start_time_unix_nano <= s.end_time_unix_nano);
            assert_eq!(i_attr(&s.attributes, "process.pid"), Some(4242));
            assert_eq!(s_attr(&s.attributes, "uvmwatch.engine"), None);
        }
        let open = spans
            .iter()
            .find(|s| s.name == "open /dev/nvidiactl")
            .unwrap();
        assert_eq!(
            s_attr(&open.attributes, "file.path"),
            Some("/dev/nvidiactl")
        );
        let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
        assert_eq!(
            s_attr(&reg.attributes, "uvmwatch.ioctl.node"),
            Some("/dev/nvidia-uvm")
        );
        assert_eq!(
            s_attr(&reg.attributes, "uvmwatch.ioctl.rm_status"),
            Some("NV_OK")
        );
        // Span ids unique.
        let mut ids: Vec<_> = spans.iter().map(|s| s.span_id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), spans.len());
        // Resource.
        let got = c.got.lock().unwrap();
        let res = got[0].1.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(s_attr(&res.attributes, "service.name"), Some("uvmwatch"));
        assert_eq!(
            s_attr(&res.attributes, "service.version"),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(s_attr(&res.attributes, "host.name"), Some("gpu-node-1"));
        assert_eq!(s_attr(&res.attributes, "k8s.node.name"), Some("node-a"));
        let scope = got[0].1.resource_spans[0].scope_spans[0].scope.as_ref();
        assert_eq!(scope.unwrap().name, "uvmwatch");
    }

    #[test]
    fn a_failed_cuinit_is_an_error_and_its_diagnosis_rides_on_it() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let mut t = Seq::new();
        let t0 = t.at(0);
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            flags: 0,
        });
        let (s, e) = (t.at(1), t.at(1));
        ioctl(
            &mut sink,
            &p,
            4243,
            s,
            e,
            "UVM_REGISTER_GPU",
            "NV_ERR_NO_MEMORY",
            true,
            true,
        );
        let end = t.at(1);
        sink.event(&CallEvent::CuinitEnd {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            end_ns: end,
            code: 3,
            result: "CUDA_ERROR_NOT_INITIALIZED",
        });
        let f = finding();
        sink.event(&CallEvent::Diagnosis {
            proc: &p,
            tid: 4242,
            ts_ns: t.at(1),
            finding: &f,
        });
        let spans = c.wait("2 spans", |s| s.len() >= 2);
        let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
        let st = cu.status.as_ref().unwrap();
        assert_eq!(st.code, status::StatusCode::Error as i32);
        assert_eq!(st.message, "CUDA_ERROR_NOT_INITIALIZED");
        assert_eq!(
            s_attr(&cu.attributes, "error.type"),
            Some("CUDA_ERROR_NOT_INITIALIZED")
        );
        assert_eq!(
            i_attr(&cu.attributes, "uvmwatch.cuinit.result_code"),
            Some(3)
        );
        let ev = cu.events.iter().find(|e| e.name == DIAGNOSIS).unwrap();
        assert_eq!(
            s_attr(&ev.attributes, "uvmwatch.diagnosis.rule"),
            Some("uvm_register_gpu_no_memory")
        );
        assert_eq!(
            s_attr(&ev.attributes, "uvmwatch.diagnosis.severity"),
            Some("critical")
        );
        assert!(ev.time_unix_nano >= cu.end_time_unix_nano);
        let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
        assert_eq!(reg.status.as_ref().unwrap().message, "NV_ERR_NO_MEMORY");
        assert_eq!(reg.parent_span_id, cu.span_id);
        // A diagnosis arriving after the span left goes on a child span of it.
        sink.event(&CallEvent::Diagnosis {
            proc: &p,
            tid: 4242,
            ts_ns: t.at(5),
            finding: &f,
        });
        let spans = c.wait("diagnosis span", |s| s.iter().any(|s| s.name == DIAGNOSIS));
        let d = spans.iter().find(|s| s.name == DIAGNOSIS).unwrap();
        assert_eq!(d.parent_span_id, cu.span_id);
        assert_eq!(d.trace_id, cu.trace_id);
        assert_eq!(d.events[0].name, DIAGNOSIS);
    }

    #[test]
    fn a_stall_is_exported_while_the_call_is_still_stuck() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let mut t = Seq::new();
        let t0 = t.at(0);
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            flags: 0,
        });
        let (s, e) = (t.at(1), t.at(1));
        ioctl(
            &mut sink,
            &p,
            4243,
            s,
            e,
            "UVM_INITIALIZE",
            "NV_OK",
            false,
            true,
        );
        let reg_start = t.at(1);
        // The ioctl stalls first (threshold 1 s), then cuInit (2 s).
        let det_io = t.at(1000);
        sink.event(&CallEvent::Stall {
            proc: &p,
            tid: 4243,
            call: "UVM_REGISTER_GPU",
            start_ns: reg_start,
            detected_ns: det_io,
            inside: "",
            thread_state: "S (sleeping)",
            wchan: "request_wait_answer",
        });
        let det_cu = t.at(1000);
        sink.event(&CallEvent::Stall {
            proc: &p,
            tid: 4243,
            call: "cuInit",
            start_ns: t0,
            detected_ns: det_cu,
            inside: "UVM_REGISTER_GPU on /dev/nvidia-uvm",
            thread_state: "S (sleeping)",
            wchan: "request_wait_answer",
        });
        let f = finding();
        sink.event(&CallEvent::Diagnosis {
            proc: &p,
            tid: 4242,
            ts_ns: det_cu,
            finding: &f,
        });
        // Export interval is 30 s: only the stall's urgency sends these now.
        let early = c.wait("stall markers", |s| {
            s.iter().filter(|s| s.name == STALL).count() >= 2
                && s.iter()
                    .any(|s| s.events.iter().any(|e| e.name == DIAGNOSIS))
        });
        assert!(
            !early.iter().any(|s| s.name == "cuInit"),
            "cuInit not ended yet"
        );
        assert!(!early.iter().any(|s| s.name == "UVM_REGISTER_GPU"));
        let cu_marker = early
            .iter()
            .find(|s| {
                s.name == STALL
                    && s_attr(&s.events[0].attributes, "uvmwatch.stall.call") == Some("cuInit")
            })
            .unwrap();
        let io_marker = early
            .iter()
            .find(|s| {
                s.name == STALL
                    && s_attr(&s.events[0].attributes, "uvmwatch.stall.call")
                        == Some("UVM_REGISTER_GPU")
            })
            .unwrap();
        let ev = &cu_marker.events[0];
        assert_eq!(
            s_attr(&ev.attributes, "uvmwatch.stall.inside"),
            Some("UVM_REGISTER_GPU on /dev/nvidia-uvm")
        );
        assert_eq!(
            s_attr(&ev.attributes, "uvmwatch.thread.wchan"),
            Some("request_wait_answer")
        );
        assert!(cu_marker.events.iter().any(|e| e.name == DIAGNOSIS));
        assert_eq!(cu_marker.start_time_unix_nano, cu_marker.end_time_unix_nano);
        // Released: the ioctl returns, then cuInit.
        let reg_end = t.at(1500);
        sink.event(&CallEvent::StallEnd {
            proc: &p,
            tid: 4243,
            call: "UVM_REGISTER_GPU",
            start_ns: reg_start,
            end_ns: reg_end,
            outcome: "returned",
        });
        ioctl(
            &mut sink,
            &p,
            4243,
            reg_start,
            reg_end,
            "UVM_REGISTER_GPU",
            "NV_OK",
            false,
            true,
        );
        let end = t.at(1);
        sink.event(&CallEvent::StallEnd {
            proc: &p,
            tid: 4243,
            call: "cuInit",
            start_ns: t0,
            end_ns: end,
            outcome: "returned",
        });
        sink.event(&CallEvent::CuinitEnd {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            end_ns: end,
            code: 0,
            result: "CUDA_SUCCESS",
        });
        drop(sink);
        let spans = c.spans();
        let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
        let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
        // The ids fixed early are the ones the ended spans carry.
        assert_eq!(cu_marker.parent_span_id, cu.span_id);
        assert_eq!(cu_marker.trace_id, cu.trace_id);
        assert_eq!(io_marker.parent_span_id, reg.span_id);
        assert_eq!(reg.parent_span_id, cu.span_id);
        assert_eq!(reg.trace_id, cu.trace_id);
        let names: Vec<&str> = cu.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [STALL, DIAGNOSIS, STALL_END], "{:#?}", cu.events);
        let names: Vec<&str> = reg.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [STALL, STALL_END]);
        // Markers lie inside their parents.
        assert!(cu_marker.start_time_unix_nano >= cu.start_time_unix_nano);
        assert!(cu_marker.start_time_unix_nano <= cu.end_time_unix_nano);
        assert!(io_marker.start_time_unix_nano >= reg.start_time_unix_nano);
        assert!(io_marker.start_time_unix_nano <= reg.end_time_unix_nano);
    }

    #[test]
    fn calls_outside_cuinit_are_root_spans_and_thread_exit_ends_a_stalled_cuinit() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let mut t = Seq::new();
        let (s, e) = (t.at(0), t.at(2000));
        ioctl(
            &mut sink,
            &p,
            4243,
            s,
            e,
            "NV_ESC_RM_CONTROL",
            "NV_ERR_TIMEOUT",
            true,
            false,
        );
        let (s, e) = (t.at(1), t.at(1));
        sink.event(&CallEvent::Open {
            proc: &p,
            tid: 4243,
            start_ns: s,
            end_ns: e,
            path: "/dev/nvidia0",
            errno: Some("EACCES"),
            in_cuinit: false,
        });
        let t0 = t.at(1);
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            flags: 0,
        });
        let gone = t.at(3000);
        sink.event(&CallEvent::StallEnd {
            proc: &p,
            tid: 4243,
            call: "cuInit",
            start_ns: t0,
            end_ns: gone,
            outcome: "thread_exited",
        });
        let spans = c.wait("3 spans", |s| s.len() >= 3);
        let io = spans
            .iter()
            .find(|s| s.name == "NV_ESC_RM_CONTROL")
            .unwrap();
        assert!(io.parent_span_id.is_empty());
        assert_eq!(s_attr(&io.attributes, "uvmwatch.engine"), Some("vllm"));
        assert_eq!(s_attr(&io.attributes, "error.type"), Some("NV_ERR_TIMEOUT"));
        let open = spans
            .iter()
            .find(|s| s.name == "open /dev/nvidia0")
            .unwrap();
        assert!(open.parent_span_id.is_empty());
        assert_ne!(open.trace_id, io.trace_id);
        assert_eq!(open.status.as_ref().unwrap().message, "EACCES");
        let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
        assert_eq!(
            cu.status.as_ref().unwrap().message,
            "thread exited inside cuInit"
        );
        assert_eq!(
            s_attr(&cu.attributes, "uvmwatch.outcome"),
            Some("thread_exited")
        );
        assert_eq!(cu.events[0].name, STALL_END);
    }

    #[test]
    fn a_stalled_ioctl_outside_cuinit_carries_its_stall_and_diagnosis() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let mut t = Seq::new();
        let s0 = t.at(0);
        let det = t.at(5000);
        sink.event(&CallEvent::Stall {
            proc: &p,
            tid: 4243,
            call: "NV_ESC_RM_CONTROL",
            start_ns: s0,
            detected_ns: det,
            inside: "",
            thread_state: "D (disk sleep)",
            wchan: "os_acquire_mutex",
        });
        let f = finding();
        sink.event(&CallEvent::Diagnosis {
            proc: &p,
            tid: 4242,
            ts_ns: det,
            finding: &f,
        });
        let early = c.wait("stall marker", |s| {
            s.iter().any(|s| s.name == STALL && s.events.len() == 2)
        });
        let marker = early.iter().find(|s| s.name == STALL).unwrap();
        let end = t.at(100);
        ioctl(
            &mut sink,
            &p,
            4243,
            s0,
            end,
            "NV_ESC_RM_CONTROL",
            "NV_OK",
            false,
            false,
        );
        sink.flush();
        let spans = c.wait("ioctl span", |s| {
            s.iter().any(|s| s.name == "NV_ESC_RM_CONTROL")
        });
        let io = spans
            .iter()
            .find(|s| s.name == "NV_ESC_RM_CONTROL")
            .unwrap();
        assert!(io.parent_span_id.is_empty());
        assert_eq!(marker.parent_span_id, io.span_id);
        assert_eq!(marker.trace_id, io.trace_id);
        let names: Vec<&str> = io.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [STALL, DIAGNOSIS]);
        assert_eq!(s_attr(&io.attributes, "uvmwatch.engine"), Some("vllm"));
    }

    #[test]
    fn a_thread_that_vanished_mid_cuinit_is_closed_by_housekeeping() {
        let c = Collector::start();
        let root = fake_proc();
        let mut cfg = config(&c, root.path());
        cfg.housekeeping_interval = Duration::from_millis(50);
        cfg.export_interval = Duration::from_millis(50);
        let mut sink = OtlpSink::start(cfg).unwrap();
        let p = proc_info();
        // Thread 9999 does not exist under the fake root.
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 9999,
            start_ns: crate::clock::monotonic_ns(),
            flags: 0,
        });
        // Thread 4243 exists: its cuInit stays open.
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: crate::clock::monotonic_ns(),
            flags: 0,
        });
        let spans = c.wait("closed cuInit", |s| s.iter().any(|s| s.name == "cuInit"));
        assert_eq!(spans.len(), 1);
        assert_eq!(i_attr(&spans[0].attributes, "thread.id"), Some(9999));
        assert_eq!(
            s_attr(&spans[0].attributes, "uvmwatch.outcome"),
            Some("thread_exited")
        );
        // At shutdown the open one leaves as incomplete.
        drop(sink);
        let spans = c.spans();
        let open = spans
            .iter()
            .find(|s| i_attr(&s.attributes, "thread.id") == Some(4243))
            .unwrap();
        assert_eq!(open.name, "cuInit");
        assert_eq!(
            attr(&open.attributes, "uvmwatch.incomplete"),
            Some(&any_value::Value::BoolValue(true))
        );
        assert_eq!(
            s_attr(&open.attributes, "uvmwatch.outcome"),
            Some("agent_stopped")
        );
    }

    #[test]
    fn the_identity_of_a_process_that_exits_at_once_is_kept() {
        let c = Collector::start();
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let p = proc_info();
        let t0 = crate::clock::monotonic_ns();
        sink.event(&CallEvent::CuinitStart {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            flags: 0,
        });
        // Gone before the exporting thread may have looked.
        std::fs::remove_dir_all(root.path().join("4242")).unwrap();
        sink.event(&CallEvent::CuinitEnd {
            proc: &p,
            tid: 4243,
            start_ns: t0,
            end_ns: t0 + 1000,
            code: 0,
            result: "CUDA_SUCCESS",
        });
        sink.flush();
        let spans = c.wait("cuInit", |s| !s.is_empty());
        let a = &spans[0].attributes;
        assert_eq!(i_attr(a, "uvmwatch.tp_rank"), Some(1), "from environ");
        assert_eq!(s_attr(a, "k8s.namespace.name"), Some("llm"));
        assert_eq!(s_attr(a, "uvmwatch.engine"), Some("vllm"));
    }

    fn one_span(sink: &mut OtlpSink, p: &ProcessInfo) {
        let now = crate::clock::monotonic_ns();
        ioctl(
            sink,
            p,
            4243,
            now,
            now + 10,
            "NV_ESC_RM_ALLOC",
            "NV_ERR_INVALID_ARGUMENT",
            true,
            false,
        );
        sink.flush();
    }

    #[test]
    fn retryable_failures_are_retried_with_backoff() {
        let c = Collector::start();
        c.statuses.lock().unwrap().extend([503, 429]);
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let stats = sink.stats();
        let p = proc_info();
        let start = Instant::now();
        one_span(&mut sink, &p);
        c.wait("the span after two refusals", |s| s.len() == 1);
        // 0.5 s then 1 s of backoff.
        assert!(
            start.elapsed() >= Duration::from_millis(1400),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(stats.export_failures.load(Ordering::Relaxed), 2);
        assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 1);
        assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn refused_batches_are_dropped_and_counted() {
        let c = Collector::start();
        c.statuses.lock().unwrap().push_back(400);
        let root = fake_proc();
        let mut sink = OtlpSink::start(config(&c, root.path())).unwrap();
        let stats = sink.stats();
        let p = proc_info();
        one_span(&mut sink, &p);
        let end = Instant::now() + Duration::from_secs(5);
        while stats.spans_dropped.load(Ordering::Relaxed) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
        // The next one goes through.
        one_span(&mut sink, &p);
        c.wait("next span", |s| s.len() == 1);
    }

    #[test]
    fn gzip_bodies() {
        let c = Collector::start();
        let root = fake_proc();
        let mut cfg = config(&c, root.path());
        cfg.compression = Compression::Gzip;
        cfg.headers = vec![("X-Scope-OrgID".into(), "tenant-1".into())];
        let mut sink = OtlpSink::start(cfg).unwrap();
        one_span(&mut sink, &proc_info());
        c.wait("gzip span", |s| s.len() == 1);
        assert_eq!(c.encodings.lock().unwrap()[0], "gzip");
    }

    #[test]
    fn the_agent_loop_never_waits_on_a_hung_endpoint() {
        // Accepts connections and never answers.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming() {
                held.push(s);
            }
        });
        let root = fake_proc();
        let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
        cfg.proc_root = root.path().to_path_buf();
        cfg.queue_capacity = 64;
        cfg.timeout = Duration::from_secs(3);
        cfg.shutdown_timeout = Duration::from_millis(200);
        let mut sink = OtlpSink::start(cfg).unwrap();
        let stats = sink.stats();
        let p = proc_info();
        let n = 20_000u64;
        let start = Instant::now();
        let mut worst = Duration::ZERO;
        for i in 0..n {
            let t = Instant::now();
            ioctl(
                &mut sink,
                &p,
                4243,
                i,
                i + 1,
                "NV_ESC_RM_CONTROL",
                "NV_ERR_TIMEOUT",
                true,
                false,
            );
            if i % 100 == 0 {
                sink.flush();
            }
            worst = worst.max(t.elapsed());
        }
        let total = start.elapsed();
        eprintln!("{n} events: {total:?}, worst {worst:?}");
        assert!(total < Duration::from_secs(2), "{total:?}");
        assert!(worst < Duration::from_millis(50), "{worst:?}");
        assert!(stats.events_dropped.load(Ordering::Relaxed) > 0);
        let t = Instant::now();
        drop(sink);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    #[test]
    fn an_unreachable_endpoint_is_not_an_error_at_start() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
        cfg.shutdown_timeout = Duration::from_millis(300);
        let mut sink = OtlpSink::start(cfg).unwrap();
        let stats = sink.stats();
        one_span(&mut sink, &proc_info());
        let end = Instant::now() + Duration::from_secs(5);
        while stats.export_failures.load(Ordering::Relaxed) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(stats.export_failures.load(Ordering::Relaxed) >= 1);
        drop(sink);
        assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn endpoints() {
        let p = |s: &str| Endpoint::parse(s).unwrap();
        assert_eq!(p("http://collector:4318").path, "/v1/traces");
        assert_eq!(p("http://collector:4318/").path, "/v1/traces");
        assert_eq!(p("http://collector:4318").port, 4318);
        assert_eq!(p("http://gw/otlp").path, "/otlp/v1/traces");
        assert_eq!(p("http://gw/otlp").port, 80);
        assert_eq!(p("http://gw:1/v1/traces").path, "/v1/traces");
        let v6 = p("http://[::1]:4318");
        assert_eq!(
            (v6.host.as_str(), v6.authority.as_str()),
            ("::1", "[::1]:4318")
        );
        assert!(Endpoint::parse("https://collector:4318").is_err());
        assert!(Endpoint::parse("collector:4318").is_err());
        assert!(Endpoint::parse("http://u:p@collector:4318").is_err());
        let mut cfg = OtlpConfig::new("http://h:1");
        cfg.headers = vec![("bad header".into(), "v".into())];
        assert!(OtlpSink::start(cfg).is_err());
    }

    #[test]
    fn flag_parsers() {
        assert_eq!(Compression::parse("gzip"), Ok(Compression::Gzip));
        assert_eq!(Compression::parse("none"), Ok(Compression::None));
        assert!(Compression::parse("zstd").is_err());
        assert_eq!(
            parse_header("X-Scope-OrgID=team-a"),
            Ok(("X-Scope-OrgID".to_string(), "team-a".to_string()))
        );
        assert_eq!(
            parse_header("Authorization=Basic a=="),
            Ok(("Authorization".to_string(), "Basic a==".to_string()))
        );
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("bad name=x").is_err());
    }

    #[test]
    fn command_lines_are_redacted_and_bounded() {
        let a = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
        assert_eq!(
            command_line(
                &a("vllm serve m --api-key sk-1 --hf-token=hf_x --tokenizer t"),
                1024
            ),
            "vllm serve m --api-key [REDACTED] --hf-token=[REDACTED] --tokenizer t"
        );
        assert_eq!(
            command_line(&a("x --max-num-batched-tokens 8192 --password p"), 1024),
            "x --max-num-batched-tokens 8192 --password [REDACTED]"
        );
        assert_eq!(
            command_line(&a("x --db postgres://user:pw@db:5432/x"), 1024),
            "x --db postgres://[REDACTED]@db:5432/x"
        );
        let long = command_line(&a(&"é".repeat(2000)), 1024);
        assert!(long.len() <= 1024 && long.ends_with("..."));
    }

    #[test]
    fn ids_are_random_and_nonzero() {
        let mut a = Ids::new();
        let mut b = Ids::new();
        let (x, y) = (a.trace_id(), b.trace_id());
        assert_ne!(x, y);
        assert_ne!(x, [0; 16]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(a.span_id()));
        }
    }
}

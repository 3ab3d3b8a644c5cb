//! The HTTP side of the exporter: the endpoint, one keep-alive HTTP/1.1 connection, and
//! what an export attempt came to.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;

use super::TRACES_PATH;

/// Largest collector response read.
const MAX_RESPONSE: usize = 1 << 20;

/// A parsed `http://` endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Endpoint {
    /// Host to connect to (IPv6 without brackets).
    pub(super) host: String,
    pub(super) port: u16,
    /// `Host:` header value.
    pub(super) authority: String,
    /// Request path, ending in `/v1/traces`.
    pub(super) path: String,
}

impl Endpoint {
    pub(super) fn parse(s: &str) -> Result<Endpoint> {
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
pub(super) enum Sent {
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
pub(super) struct HttpClient {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) endpoint: Endpoint,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) gzip: bool,
    pub(super) timeout: Duration,
    pub(super) conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl HttpClient {
    pub(super) fn post(&mut self, body: Vec<u8>) -> Sent {
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

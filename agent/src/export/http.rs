//! The HTTP endpoint: `/metrics` (Prometheus text format 0.0.4) and `/healthz`, which tells
//! whether the observer's loop still runs: its [`Heartbeat`] listener notes every scan.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};

use crate::{
    clock::monotonic_ns,
    event::{Event, Kind, Listener},
    export::metrics::Metrics,
};

/// The `CLOCK_MONOTONIC` ns of the observer loop's last scan, kept by its listener.
#[derive(Clone, Debug)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    /// A heartbeat that beat now.
    pub fn new() -> Heartbeat {
        Heartbeat(Arc::new(AtomicU64::new(monotonic_ns())))
    }
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat::new()
    }
}

impl Listener for Heartbeat {
    fn event(&mut self, ev: &Arc<Event>) {
        if let Kind::Scan(_) = ev.kind {
            self.0.store(monotonic_ns(), Ordering::Relaxed);
        }
    }
}

/// `/healthz` fails when the main loop has not run for this long (ns).
const STALE_AFTER_NS: u64 = 5_000_000_000;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    heartbeat: Arc<AtomicU64>,
}

/// The router.
pub fn router(metrics: Metrics, heartbeat: Heartbeat) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/", get(index))
        .with_state(AppState {
            metrics,
            heartbeat: heartbeat.0,
        })
}

/// Serves until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, heartbeat: Heartbeat) {
    if let Err(e) = axum::serve(listener, router(metrics, heartbeat)).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    // Reading the kernel maps is a few syscalls per entry: keep it off the async workers.
    let m = s.metrics.clone();
    let body = tokio::task::spawn_blocking(move || m.render())
        .await
        .unwrap_or_else(|e| format!("# render failed: {e}\n"));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}

async fn health_handler(State(s): State<AppState>) -> impl IntoResponse {
    let age = monotonic_ns().saturating_sub(s.heartbeat.load(Ordering::Relaxed));
    if age > STALE_AFTER_NS {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("main loop stalled for {:.1}s\n", age as f64 / 1e9),
        )
    } else {
        (StatusCode::OK, "ok\n".to_string())
    }
}

async fn index() -> &'static str {
    "uvmwatch: see /metrics and /healthz\n"
}

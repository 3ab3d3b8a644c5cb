//! The HTTP endpoint: `/metrics` (Prometheus text format 0.0.4), `/healthz` (alive) and
//! `/readyz` (ready), both judged by [`Health`].

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};

use crate::{
    clock::monotonic_ns,
    export::{health::Health, metrics::Metrics},
};

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// The router.
pub fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/readyz", get(ready_handler))
        .route("/", get(index))
        .with_state(AppState { metrics, health })
}

/// Serves until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, health: Health) {
    if let Err(e) = axum::serve(listener, router(metrics, health)).await {
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
    match s.health.alive(monotonic_ns()) {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        None => (StatusCode::OK, "ok\n".to_string()),
    }
}

async fn ready_handler(State(s): State<AppState>) -> impl IntoResponse {
    let why = s.health.unready(monotonic_ns());
    if why.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", why.join("; ")),
        )
    }
}

async fn index() -> &'static str {
    "uvmwatch: see /metrics, /healthz and /readyz\n"
}

//! Where observations go: Prometheus metrics ([`metrics`]) served over HTTP ([`http`]),
//! OTLP traces ([`otlp`]), capture files ([`capture`]) and their merge into profiler traces
//! ([`annotate`]).

pub mod annotate;
pub mod capture;
pub mod http;
pub mod log;
pub mod metrics;
pub mod otlp;

//! Where observations go: Prometheus metrics ([`metrics`]) and the agent's [`health`]
//! served over HTTP ([`http`]) and told to systemd ([`systemd`]),
//! OTLP traces ([`otlp`]), capture files ([`capture`]) and their merge into profiler traces
//! ([`annotate`]).

pub mod annotate;
pub mod capture;
pub mod health;
pub mod http;
pub mod log;
pub mod metrics;
pub mod otlp;
pub mod systemd;

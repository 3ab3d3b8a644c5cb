//! `uvmwatch run`: the agent as a daemon.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;

use super::{probe_flags::ProbeArgs, Global};
use crate::{
    event::Listener,
    export::{health::Health, http, log::LogListener, metrics::Metrics, otlp, systemd},
    observer::{diagnosis::FactsFrom, driver::DriverFrom, Observer, RunConfig},
};

/// Default `--listen`: port 19400. The Prometheus default port allocations list (9100-9999)
/// is full; 19400 is outside it and outside the common service ranges (9400 is
/// dcgm-exporter, whose neighbour in spirit this is).
const DEFAULT_LISTEN: &str = "0.0.0.0:19400";

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// TOML file whose keys are these flags' long names (precedence: defaults < file <
    /// environment < flags; docs/deployment.md).
    #[arg(long, value_name = "FILE", env = "UVMWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration, with where each value came from, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = DEFAULT_LISTEN, env = "UVMWATCH_LISTEN")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Read the diagnosis facts from this snapshot (directory or bundle from `doctor
    /// --bundle`) instead of this machine; the probes still watch this machine.
    #[arg(long, value_name = "DIR|FILE", env = "UVMWATCH_EVIDENCE_ROOT")]
    pub evidence_root: Option<PathBuf>,
    /// How long a finding from a stall or failure stays active in uvmwatch_diagnosis.
    #[arg(long, default_value = "10m", value_parser = super::positive_duration, env = "UVMWATCH_DIAGNOSIS_TTL")]
    pub diagnosis_ttl: Duration,
    /// How often the diagnosis facts (driver, module parameters, kernel log, nvidia-smi, ...)
    /// are read again.
    #[arg(long, default_value = "5m", value_parser = super::positive_duration, env = "UVMWATCH_EVIDENCE_REFRESH")]
    pub evidence_refresh: Duration,
    /// Export spans (cuInit with its driver calls, stalls, diagnoses) over OTLP/HTTP
    /// protobuf to this endpoint (`<URL>/v1/traces`), e.g. http://127.0.0.1:4318.
    #[arg(long, value_name = "URL", env = "UVMWATCH_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Extra HTTP header for the OTLP endpoint (repeatable), e.g. authorization=Bearer x.
    #[arg(long = "otlp-header", value_name = "KEY=VALUE", value_parser = otlp::parse_header, requires = "otlp_endpoint")]
    pub otlp_headers: Vec<(String, String)>,
    /// Compression of OTLP requests.
    #[arg(long, value_name = "none|gzip", default_value = "none", value_parser = otlp::Compression::parse)]
    pub otlp_compression: otlp::Compression,
    /// Timeout of one OTLP request.
    #[arg(long, default_value = "10s", value_parser = super::positive_duration)]
    pub otlp_timeout: Duration,
    /// Add bounded workload labels (engine, namespace, pod) to uvmwatch_cuinit_calls_total
    /// and uvmwatch_stalls_total (off by default: pod names churn with rollouts).
    #[arg(long, env = "UVMWATCH_WORKLOAD_LABELS")]
    pub workload_labels: bool,
    /// A failure (process, call, result) logged once is then counted, and its count logged
    /// as one `repeated` record per this interval (the metrics count every call).
    #[arg(long, default_value = "10s", value_parser = super::positive_duration, env = "UVMWATCH_LOG_REPEAT_WINDOW")]
    pub log_repeat_window: Duration,
    /// Kubernetes node name, exported as the resource attribute k8s.node.name.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
}

/// `uvmwatch run`: runs the agent until SIGINT or SIGTERM.
///
/// # Errors
/// The agent could not start (not root, eBPF load, listen address taken, bad OTLP settings).
pub fn run(a: RunArgs, g: &Global) -> anyhow::Result<ExitCode> {
    let cfg = RunConfig {
        // The probes watch this machine, so its driver's layouts; with a snapshot's facts, the
        // snapshot's version only while this machine's cannot be read.
        driver: match (&a.evidence_root, g.driver_version) {
            (Some(_), None) => DriverFrom::LiveElseSnapshot {
                host_root: g.host_root.clone(),
            },
            _ => g.driver(),
        },
        facts: Some(match a.evidence_root {
            Some(p) => FactsFrom::Snapshot(p),
            None => FactsFrom::Live {
                host_root: g.host_root.clone(),
            },
        }),
        diagnosis_ttl: a.diagnosis_ttl,
        evidence_refresh: a.evidence_refresh,
        ..a.probe.run_config(g)
    };
    let metrics = Metrics::with_workload_labels(a.workload_labels)?;
    let health = Health::new();
    let mut listeners: Vec<Box<dyn Listener>> =
        vec![Box::new(metrics.listener()), Box::new(health.clone())];
    if let Some(endpoint) = a.otlp_endpoint {
        let mut c = otlp::OtlpConfig::new(endpoint);
        c.headers = a.otlp_headers;
        c.compression = a.otlp_compression;
        c.timeout = a.otlp_timeout;
        c.node_name = a.node_name;
        listeners.push(Box::new(otlp::OtlpListener::start(c)?));
    }
    listeners.push(Box::new(LogListener::with_repeat_window(
        g.log_format,
        a.log_repeat_window,
    )));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut observer = Observer::load(cfg)?;
        let tcp = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {} (choose another with --listen)", a.listen))?;
        metrics.collect_kernel(observer.kernel_handle())?;
        observer.start(listeners, &tcp.local_addr()?.to_string());
        let server = tokio::spawn(http::serve(tcp, metrics, health.clone()));
        let notifier = tokio::spawn(systemd::notify(health));
        let r = observer.run(std::future::pending()).await;
        for task in [server, notifier] {
            task.abort();
            let _ = task.await;
        }
        r
    })?;
    Ok(ExitCode::SUCCESS)
}

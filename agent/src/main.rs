//! `uvmwatch`: an eBPF agent that watches how CUDA starts.
//!
//! Subcommands: `run` (the agent) and `probes` (what can attach here, and why not).
//! The logic lives in the library crate (`lib.rs`); this file is the command line.

use uvmwatch::{agent, discovery, kernel, probes};

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

/// Default `--listen`: port 19400. The Prometheus default port allocations list (9100-9999)
/// is full; 19400 is outside it and outside the common service ranges (9400 is
/// dcgm-exporter, whose neighbour in spirit this is).
const DEFAULT_LISTEN: &str = "0.0.0.0:19400";

#[derive(Parser, Debug)]
#[command(
    name = "uvmwatch",
    version,
    about = "Watches how CUDA starts: cuInit, NVIDIA device opens and driver ioctls, with stalls reported as they happen."
)]
struct Cli {
    /// Log format: text on a terminal, json for daemons (one record per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, global = true, env = "UVMWATCH_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info`, `debug`, `uvmwatch=debug`.
    #[arg(long, default_value = "info", global = true, env = "UVMWATCH_LOG")]
    log_level: String,
    /// Where the host's `/` is mounted when the agent runs in a container (e.g. `/host` in
    /// the Kubernetes DaemonSet): the diagnosis facts are read below it. Device nodes are
    /// then never opened by the agent itself.
    #[arg(long, global = true, env = "UVMWATCH_HOST_ROOT", value_name = "DIR")]
    host_root: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Auto,
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the agent: attach the probes, report stalls live, serve /metrics and /healthz.
    Run(RunArgs),
    /// List every probe, whether it can attach on this host, and why not.
    Probes {
        /// Extra libcuda files to try (repeatable).
        #[arg(long)]
        libcuda: Vec<PathBuf>,
    },
    /// Diagnose why CUDA initialisation fails or hangs on this machine (or a snapshot).
    Doctor(DoctorArgs),
    /// Record what the agent sees about some processes into a Perfetto or Chrome JSON trace.
    Capture(uvmwatch::capture::CaptureArgs),
    /// Merge a capture into a PyTorch profiler (Kineto) Chrome trace of the same run.
    Annotate(uvmwatch::annotate::AnnotateArgs),
    /// Print the metrics reference (Markdown) generated from the code.
    MetricsDoc,
    /// Internal: dlopen LIB and call cuInit(0) (used by `doctor --probe`).
    #[command(name = "__cuinit-child", hide = true)]
    CuinitChild { lib: PathBuf },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// Diagnose a snapshot instead of this machine: a bundle (.tar.gz) or a directory laid
    /// out like the diagnosed machine's file system.
    #[arg(long, value_name = "DIR|FILE")]
    root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    /// Same as --format json.
    #[arg(long)]
    json: bool,
    /// Also save what was read into this bundle (.tar.gz) to re-run elsewhere with --root.
    #[arg(long, value_name = "FILE")]
    bundle: Option<PathBuf>,
    /// Also run one real cuInit under the probes (root) and diagnose what they saw. With
    /// --root the facts come from the snapshot and the probes still watch this machine.
    #[arg(long)]
    probe: bool,
    /// How long the probed cuInit may take before it counts as hung.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    probe_timeout: Duration,
    /// libcuda to call with --probe (default: the host's, from the ld cache).
    #[arg(long)]
    libcuda: Vec<PathBuf>,
    /// No colour in the text report.
    #[arg(long)]
    no_color: bool,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// TOML file whose keys are these flags' long names (precedence: defaults < file <
    /// environment < flags; docs/deployment.md).
    #[arg(long, value_name = "FILE", env = "UVMWATCH_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective configuration, with where each value came from, and exit.
    #[arg(long)]
    print_config: bool,
    /// Address for /metrics and /healthz.
    #[arg(long, default_value = DEFAULT_LISTEN, env = "UVMWATCH_LISTEN")]
    listen: SocketAddr,
    /// A cuInit still running after this long is reported as stalled (e.g. 20s, 1m).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration, env = "UVMWATCH_CUINIT_STALL")]
    cuinit_stall: Duration,
    /// A driver ioctl still running after this long is reported as stalled.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, env = "UVMWATCH_IOCTL_STALL")]
    ioctl_stall: Duration,
    /// Driver ioctls at least this long are logged individually (capped at --ioctl-stall).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, env = "UVMWATCH_SLOW_IOCTL")]
    slow_ioctl: Duration,
    /// A libcuda file to probe in addition to those found (repeatable).
    #[arg(long)]
    libcuda: Vec<PathBuf>,
    /// Do not scan running processes' memory maps for libcuda at start.
    #[arg(long)]
    no_proc_scan: bool,
    /// Read the diagnosis facts from this snapshot (directory or bundle from `doctor
    /// --bundle`) instead of this machine; the probes still watch this machine.
    #[arg(long, value_name = "DIR|FILE", env = "UVMWATCH_EVIDENCE_ROOT")]
    evidence_root: Option<PathBuf>,
    /// How long a finding from a stall or failure stays active in uvmwatch_diagnosis.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration, env = "UVMWATCH_DIAGNOSIS_TTL")]
    diagnosis_ttl: Duration,
    /// How often the diagnosis facts (driver, module parameters, kernel log, nvidia-smi, ...)
    /// are read again.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, env = "UVMWATCH_EVIDENCE_REFRESH")]
    evidence_refresh: Duration,
    /// Export spans (cuInit with its driver calls, stalls, diagnoses) over OTLP/HTTP
    /// protobuf to this endpoint (`<URL>/v1/traces`), e.g. http://127.0.0.1:4318.
    #[arg(long, value_name = "URL", env = "UVMWATCH_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Extra HTTP header for the OTLP endpoint (repeatable), e.g. authorization=Bearer x.
    #[arg(long = "otlp-header", value_name = "KEY=VALUE", value_parser = uvmwatch::otlp::parse_header)]
    otlp_headers: Vec<(String, String)>,
    /// Compression of OTLP requests.
    #[arg(long, value_name = "none|gzip", default_value = "none", value_parser = uvmwatch::otlp::Compression::parse)]
    otlp_compression: uvmwatch::otlp::Compression,
    /// Timeout of one OTLP request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    otlp_timeout: Duration,
    /// Add bounded workload labels (engine, namespace, pod) to uvmwatch_cuinit_calls_total
    /// and uvmwatch_stalls_total (off by default: pod names churn with rollouts).
    #[arg(long, env = "UVMWATCH_WORKLOAD_LABELS")]
    workload_labels: bool,
    /// Kubernetes node name, exported as the resource attribute k8s.node.name.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,
}

fn init_logging(format: LogFormat, level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|e| {
        eprintln!("uvmwatch: bad --log-level {level:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().flatten_event(true).with_current_span(false).init();
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

fn main() -> ExitCode {
    // The configuration file becomes arguments for the flags nothing else set.
    let (args, from_file) =
        match uvmwatch::config::apply(Cli::command(), std::env::args_os().collect()) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("uvmwatch: {e:#}");
                return ExitCode::from(2);
            }
        };
    let matches = Cli::command().get_matches_from(&args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Cmd::Run(a) = &cli.cmd {
        if a.print_config {
            print!(
                "{}",
                uvmwatch::config::describe(&Cli::command(), &matches, &from_file)
            );
            return ExitCode::SUCCESS;
        }
    }
    init_logging(cli.log_format, &cli.log_level);
    if let Some(h) = &cli.host_root {
        if !h.join("proc").is_dir() {
            eprintln!(
                "uvmwatch: --host-root {}: no proc directory there (mount the host's / with its submounts)",
                h.display()
            );
            return ExitCode::from(2);
        }
        uvmwatch::doctor::root::set_live_prefix(h);
    }
    let r = match cli.cmd {
        Cmd::Run(a) => {
            let cfg = agent::RunConfig {
                listen: Some(a.listen),
                stop_after: None,
                cuinit_stall: a.cuinit_stall,
                ioctl_stall: a.ioctl_stall,
                slow_ioctl: a.slow_ioctl,
                libcuda: a.libcuda,
                proc_scan: !a.no_proc_scan,
                proc_root: PathBuf::from("/proc"),
                evidence_root: a.evidence_root,
                diagnosis_ttl: a.diagnosis_ttl,
                evidence_refresh: a.evidence_refresh,
                workload_labels: a.workload_labels,
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| {
                    let mut sinks: Vec<Box<dyn uvmwatch::sink::Sink>> = Vec::new();
                    if let Some(endpoint) = a.otlp_endpoint {
                        let mut c = uvmwatch::otlp::OtlpConfig::new(endpoint);
                        c.headers = a.otlp_headers;
                        c.compression = a.otlp_compression;
                        c.timeout = a.otlp_timeout;
                        c.node_name = a.node_name;
                        sinks.push(Box::new(uvmwatch::otlp::OtlpSink::start(c)?));
                    }
                    rt.block_on(agent::run(cfg, sinks))
                })
                .map(|()| ExitCode::SUCCESS)
        }
        Cmd::Probes { libcuda } => probes_cmd(libcuda),
        Cmd::Doctor(a) => doctor_cmd(a),
        Cmd::Capture(a) => uvmwatch::capture::capture_cmd(a),
        Cmd::Annotate(a) => uvmwatch::annotate::annotate_cmd(a),
        Cmd::CuinitChild { lib } => Ok(ExitCode::from(uvmwatch::doctor::probe::cuinit_child(&lib))),
        Cmd::MetricsDoc => {
            print!("{}", uvmwatch::metrics::reference_markdown());
            Ok(ExitCode::SUCCESS)
        }
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "uvmwatch failed");
            eprintln!("uvmwatch: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `uvmwatch doctor`: collect, diagnose, report. Exit codes: 0 healthy, 1 warning,
/// 2 critical, 3 could not run (docs/doctor.md).
fn doctor_cmd(a: DoctorArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use uvmwatch::doctor::{bundle, collect, probe, report, root::Recorder, root::Root, rules};
    let json = a.json || a.format == ReportFormat::Json;
    let run = || -> anyhow::Result<(Vec<_>, _, _)> {
        let recorder = Recorder::new();
        let (_tmp, root) = match &a.root {
            Some(p) => bundle::open_bundle(p)?,
            None => (None, Root::Live),
        };
        let root = if a.bundle.is_some() {
            root.recording(&recorder)
        } else {
            root
        };
        let evidence = collect::collect(&root);
        let mut observations = uvmwatch::doctor::facts::Observations::default();
        if a.probe {
            let r = probe::run(&a.libcuda, a.probe_timeout)?;
            for n in &r.notes {
                eprintln!("uvmwatch doctor --probe: {n}");
            }
            observations = r.observations;
        }
        if let Some(out) = &a.bundle {
            bundle::write_bundle(&recorder, &evidence, Some(&observations), out)?;
            eprintln!("uvmwatch doctor: bundle written to {}", out.display());
        }
        let findings = rules::diagnose(&evidence, &observations);
        Ok((findings, evidence, observations))
    };
    match run() {
        Ok((findings, evidence, observations)) => {
            if json {
                let v = report::render_json(&findings, &evidence, &observations);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let color = !a.no_color && std::io::stdout().is_terminal();
                print!("{}", report::render_text(&findings, &evidence, color));
            }
            Ok(ExitCode::from(report::exit_code(&findings)))
        }
        Err(e) => {
            eprintln!("uvmwatch doctor: could not run: {e:#}");
            Ok(ExitCode::from(report::EXIT_COULD_NOT_RUN))
        }
    }
}

/// `uvmwatch probes`: loads and attaches for real, prints the table, detaches.
/// Exit 0 when every required probe attached, 1 otherwise, 2 when it could not run.
fn probes_cmd(libcuda: Vec<PathBuf>) -> anyhow::Result<ExitCode> {
    if !kernel::is_root() {
        let rows: Vec<_> = probes::REGISTRY
            .iter()
            .map(|s| {
                (
                    *s,
                    probes::ProbeState::Unavailable("needs root to check".into()),
                )
            })
            .collect();
        print!("{}", probes::render_table(&rows));
        eprintln!("uvmwatch: not root: cannot load eBPF programs (run as root to check for real)");
        return Ok(ExitCode::from(1));
    }
    let mut k = kernel::Kernel::load(&kernel::KernelSettings {
        slow_ioctl_ns: 1_000_000_000,
    })?;
    let mut d = discovery::Discovery::new();
    let mut targets: Vec<discovery::LibTarget> = Vec::new();
    for r in d.from_flags(&libcuda) {
        match r {
            Ok(t) => targets.push(t),
            Err(e) => eprintln!("uvmwatch: --libcuda: {e:#}"),
        }
    }
    let proc_root = PathBuf::from("/proc");
    targets.extend(d.from_host(
        &proc_root,
        std::path::Path::new("/etc/ld.so.cache"),
        discovery::DRIVER_DIRS,
    ));
    targets.extend(d.scan_all(&proc_root));
    for t in &targets {
        match k.attach_libcuda(&t.host_path, t.dev, t.ino) {
            Ok(()) => println!("libcuda: {} (probes attach)", t.host_path.display()),
            Err(e) => println!("libcuda: {} (cannot probe: {e:#})", t.host_path.display()),
        }
    }
    if targets.is_empty() {
        println!("libcuda: none found (host ld cache, driver directories, running processes)");
    }
    let rows = k.probe_states();
    print!("{}", probes::render_table(&rows));
    let ok = rows.iter().all(|(s, st)| !s.required || st.gauge() == 1);
    drop(k);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

//! The `uvmwatch` commands: the command line ([`main`]), `run` ([`run`]), `probes`
//! ([`probes`]), `doctor` ([`doctor`]), `capture` ([`capture`]), `annotate` ([`annotate`]),
//! the probe flags they share ([`probe_flags`]), the configuration file of `run`
//! ([`config`]), and the overhead benchmark's floor reference ([`bench_floor`]).

pub mod annotate;
pub mod bench_floor;
pub mod capture;
pub mod config;
pub mod doctor;
pub mod probe_flags;
pub mod probes;
pub mod run;

use std::{path::PathBuf, process::ExitCode};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::{export::log, kernel::registry::BackendChoice, observer::driver::DriverFrom};

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
    /// Read ioctl statuses with the params layouts of this driver release (e.g. 535.104.05)
    /// instead of the running driver's (`/proc/driver/nvidia/version`): for replays, tests,
    /// or a host whose version file the agent cannot see.
    #[arg(
        long,
        global = true,
        env = "UVMWATCH_DRIVER_VERSION",
        value_name = "X.Y.Z"
    )]
    driver_version: Option<crate::decode::layouts::DriverVersion>,
    /// How the opens and ioctls are hooked: fentry/fexit on the kernel functions where the
    /// kernel allows trampolines (only their callers pay), else the syscall tracepoints (every
    /// syscall of every thread pays); `auto` picks, and `uvmwatch probes` says which and why.
    #[arg(
        long,
        value_enum,
        default_value_t = BackendChoice::Auto,
        global = true,
        env = "UVMWATCH_PROBE_BACKEND"
    )]
    probe_backend: BackendChoice,
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
    Run(run::RunArgs),
    /// List every probe, whether it can attach on this host, and why not.
    Probes(probe_flags::LibcudaArgs),
    /// Diagnose why CUDA initialisation fails or hangs on this machine (or a snapshot).
    Doctor(doctor::DoctorArgs),
    /// Record what the agent sees about some processes into a Perfetto or Chrome JSON trace.
    Capture(capture::CaptureArgs),
    /// Merge a capture into a PyTorch profiler (Kineto) Chrome trace of the same run.
    Annotate(annotate::AnnotateArgs),
    /// Print the metrics reference (Markdown) generated from the code.
    MetricsDoc,
    /// Print the log schema (Markdown) generated from the code.
    #[command(hide = true)]
    LogSchemaDoc,
    /// Internal: print the probe table of docs/probes.md generated from the registry, or
    /// rewrite it in FILE (`--update docs/probes.md`).
    #[command(name = "probes-doc", hide = true)]
    ProbesDoc {
        #[arg(long, value_name = "FILE")]
        update: Option<PathBuf>,
    },
    /// Internal: the overhead benchmark's floor reference: one map operation on every
    /// tracepoint the agent attaches, through the agent's loader, until SIGTERM.
    #[command(name = "bench-floor", hide = true)]
    BenchFloor,
    /// Internal: dlopen LIB and call cuInit(0) (used by `doctor --probe`).
    #[command(name = "__cuinit-child", hide = true)]
    CuinitChild { lib: PathBuf },
}

/// What every command gets from the global flags.
#[derive(Clone, Debug)]
pub struct Global {
    /// The log's format (`auto` resolved: text on a terminal, JSON otherwise).
    pub log_format: log::Format,
    /// Where the host's `/` is mounted when the agent runs in a container.
    pub host_root: Option<PathBuf>,
    /// `--driver-version`.
    pub driver_version: Option<crate::decode::layouts::DriverVersion>,
    /// `--probe-backend`.
    pub probe_backend: BackendChoice,
}

impl Global {
    /// Where the driver's version comes from: `--driver-version`, else the version file
    /// below `--host-root`.
    pub fn driver(&self) -> DriverFrom {
        match self.driver_version {
            Some(v) => DriverFrom::Given(v),
            None => DriverFrom::Live {
                host_root: self.host_root.clone(),
            },
        }
    }
}

/// A duration flag's value (`20s`, `1m30s`, humantime's syntax): more than zero, since every
/// duration the agent takes is a threshold, an interval or a timeout that 0 would make
/// meaningless (a stall at once, a busy loop, no time at all).
///
/// # Errors
/// Not a duration, or zero.
pub fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

impl LogFormat {
    fn resolve(self) -> log::Format {
        use std::io::IsTerminal;
        match self {
            LogFormat::Json => log::Format::Json,
            LogFormat::Text => log::Format::Text,
            LogFormat::Auto if std::io::stderr().is_terminal() => log::Format::Text,
            LogFormat::Auto => log::Format::Json,
        }
    }
}

/// The `uvmwatch` command line: parses the arguments (and `--config`), sets up logging and
/// runs the command. The exit code is the command's (2 when it could not run).
pub fn main() -> ExitCode {
    // The configuration file becomes arguments for the flags nothing else set.
    let (args, from_file) = match config::apply(Cli::command(), std::env::args_os().collect()) {
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
                config::describe(&Cli::command(), &matches, &from_file)
            );
            return ExitCode::SUCCESS;
        }
    }
    let global = Global {
        log_format: cli.log_format.resolve(),
        host_root: cli.host_root.clone(),
        driver_version: cli.driver_version,
        probe_backend: cli.probe_backend,
    };
    log::init(global.log_format, &cli.log_level);
    if let Some(h) = &cli.host_root {
        if !h.join("proc").is_dir() {
            eprintln!(
                "uvmwatch: --host-root {}: no proc directory there (mount the host's / with its submounts)",
                h.display()
            );
            return ExitCode::from(2);
        }
    }
    let r = match cli.cmd {
        Cmd::Run(a) => run::run(a, &global),
        Cmd::Probes(a) => probes::probes(a.libcuda, &global),
        Cmd::Doctor(a) => doctor::doctor(a, &global),
        Cmd::Capture(a) => capture::capture(a, &global),
        Cmd::Annotate(a) => annotate::annotate(a),
        Cmd::BenchFloor => bench_floor::bench_floor(&global),
        Cmd::CuinitChild { lib } => Ok(ExitCode::from(doctor::cuinit_child(&lib))),
        Cmd::ProbesDoc { update } => probes::probes_doc(update),
        Cmd::MetricsDoc => {
            print!("{}", crate::export::metrics::reference_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::LogSchemaDoc => {
            print!("{}", log::schema::reference_markdown());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `./uvmwatch` command of the device check (`xtask/src/device-check.sh`) parses:
    /// the script runs only on a GPU machine, where a refused flag costs a whole run (its
    /// capture's `--slow-ioctl 0s` did, 2026-12-04).
    #[test]
    fn the_device_checks_commands_parse() {
        let script = include_str!("../../../xtask/src/device-check.sh");
        let joined = script.replace("\\\n", " ");
        let commands: Vec<Vec<String>> = joined
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("./uvmwatch ") || l.contains(" ./uvmwatch "))
            .map(|l| {
                let from = l.find("./uvmwatch ").unwrap();
                l[from..]
                    .split_whitespace()
                    .take_while(|w| !w.starts_with('>') && !w.starts_with("2>") && *w != "&")
                    .map(|w| w.trim_matches('"').replace("$LISTEN", "127.0.0.1:19400"))
                    .collect()
            })
            .collect();
        // probes, the agent, the capture.
        assert!(commands.len() >= 3, "{commands:?}");
        for c in &commands {
            if let Err(e) = Cli::try_parse_from(c) {
                panic!("{c:?}: {e}");
            }
        }
    }
}

//! `uvmwatch doctor`: collect the host's facts, diagnose, report.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::ValueEnum;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Diagnose a snapshot instead of this machine: a bundle (.tar.gz) or a directory laid
    /// out like the diagnosed machine's file system.
    #[arg(long, value_name = "DIR|FILE")]
    pub root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub format: ReportFormat,
    /// Same as --format json.
    #[arg(long)]
    pub json: bool,
    /// Also save what was read into this bundle (.tar.gz) to re-run elsewhere with --root.
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,
    /// Also run one real cuInit under the probes (root) and diagnose what they saw. With
    /// --root the facts come from the snapshot and the probes still watch this machine.
    #[arg(long)]
    pub probe: bool,
    /// How long the probed cuInit may take before it counts as hung.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub probe_timeout: Duration,
    /// libcuda to call with --probe (default: the host's, from the ld cache).
    #[arg(long)]
    pub libcuda: Vec<PathBuf>,
    /// No colour in the text report.
    #[arg(long)]
    pub no_color: bool,
}

/// `uvmwatch doctor`: collect, diagnose, report. Exit codes: 0 healthy, 1 warning,
/// 2 critical, 3 could not run (docs/doctor.md). `host_root` (`--host-root`): where this
/// machine's `/` is mounted when not at `/`.
pub fn doctor(a: DoctorArgs, host_root: Option<&Path>) -> anyhow::Result<ExitCode> {
    use crate::doctor::{bundle, collect, probe, report, root::Recorder, root::Root, rules};
    use std::io::IsTerminal;
    let json = a.json || a.format == ReportFormat::Json;
    let run = || -> anyhow::Result<(Vec<_>, _, _)> {
        let recorder = Recorder::new();
        let (_tmp, root) = match &a.root {
            Some(p) => bundle::open_bundle(p)?,
            None => (None, Root::live(host_root)),
        };
        let root = if a.bundle.is_some() {
            root.recording(&recorder)
        } else {
            root
        };
        let evidence = collect::collect(&root);
        let mut observations = crate::doctor::facts::Observations::default();
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

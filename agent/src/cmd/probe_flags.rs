//! The probe flags, declared once: the stall thresholds and the libcuda files of `run` and
//! `capture` ([`ProbeArgs`]), and the libcuda files of `probes` and `doctor --probe`
//! ([`LibcudaArgs`]). Each flag has its environment variable; its default is the observer's
//! ([`crate::observer::defaults`]), so that `RunConfig::new()` and the command line agree.

use std::{path::PathBuf, time::Duration};

use super::Global;
use crate::observer::{defaults, RunConfig};

/// `--libcuda`: libcuda files to probe besides those the agent finds.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LibcudaArgs {
    /// A libcuda file to probe in addition to those found (repeatable; in the environment,
    /// paths separated by `:`).
    #[arg(
        long,
        value_name = "PATH",
        env = "UVMWATCH_LIBCUDA",
        value_delimiter = ':'
    )]
    pub libcuda: Vec<PathBuf>,
}

/// What the probes watch for and where they attach: the flags `run` and `capture` share.
#[derive(clap::Args, Debug, Clone)]
pub struct ProbeArgs {
    /// A cuInit still running after this long is reported as stalled (e.g. 20s, 1m).
    #[arg(long, default_value = defaults::CUINIT_STALL, value_parser = super::positive_duration, env = "UVMWATCH_CUINIT_STALL")]
    pub cuinit_stall: Duration,
    /// A driver ioctl still running after this long is reported as stalled.
    #[arg(long, default_value = defaults::IOCTL_STALL, value_parser = super::positive_duration, env = "UVMWATCH_IOCTL_STALL")]
    pub ioctl_stall: Duration,
    /// Driver ioctls at least this long are reported one by one (capped at --ioctl-stall;
    /// failed ones always are).
    #[arg(long, default_value = defaults::SLOW_IOCTL, value_parser = super::positive_duration, env = "UVMWATCH_SLOW_IOCTL")]
    pub slow_ioctl: Duration,
    #[command(flatten)]
    pub libcuda: LibcudaArgs,
    /// Do not scan running processes' memory maps for libcuda at start.
    #[arg(long, env = "UVMWATCH_NO_PROC_SCAN")]
    pub no_proc_scan: bool,
}

impl ProbeArgs {
    /// The observer's settings with these flags and the global ones (driver, backend, the
    /// facts of this machine or of `--host-root`); the rest at their defaults.
    pub fn run_config(&self, g: &Global) -> RunConfig {
        RunConfig {
            cuinit_stall: self.cuinit_stall,
            ioctl_stall: self.ioctl_stall,
            slow_ioctl: self.slow_ioctl,
            libcuda: self.libcuda.libcuda.clone(),
            proc_scan: !self.no_proc_scan,
            facts: Some(crate::observer::diagnosis::FactsFrom::Live {
                host_root: g.host_root.clone(),
            }),
            driver: g.driver(),
            backend: g.probe_backend,
            ..RunConfig::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        probe: ProbeArgs,
    }

    /// The flags' defaults are the observer's: `uvmwatch run` with no flag and
    /// `RunConfig::new()` watch alike.
    #[test]
    fn flag_defaults_are_the_observers() {
        let g = Global {
            log_format: crate::export::log::Format::Json,
            host_root: None,
            driver_version: None,
            probe_backend: crate::kernel::registry::BackendChoice::Auto,
        };
        let parsed = Cli::try_parse_from(["uvmwatch"]).unwrap().probe;
        let from_flags = parsed.run_config(&g);
        let new = RunConfig::new();
        assert_eq!(from_flags.cuinit_stall, new.cuinit_stall);
        assert_eq!(from_flags.ioctl_stall, new.ioctl_stall);
        assert_eq!(from_flags.slow_ioctl, new.slow_ioctl);
        assert_eq!(from_flags.proc_scan, new.proc_scan);
        assert!(from_flags.libcuda.is_empty());
        assert_eq!(new.cuinit_stall, Duration::from_secs(20));
    }

    #[test]
    fn libcuda_is_repeatable() {
        let parsed = Cli::try_parse_from([
            "uvmwatch",
            "--libcuda",
            "/a",
            "--libcuda=/b",
            "--no-proc-scan",
        ])
        .unwrap()
        .probe;
        assert_eq!(
            parsed.libcuda.libcuda,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(parsed.no_proc_scan);
    }
}

//! `cargo xtask soak [--seconds N]`: the soak and fault harness (`agent/tests/soak.rs`) on
//! a release build, for longer than the part `cargo xtask test` runs: process churn, an event
//! flood with concurrent stalls, fd copies past any map's size, `kill -9` and a restart.
//! Prints the harness's `soak:` figures; fails when a bound is not met. Root.

use std::process::{Command, ExitCode};

use anyhow::Result;

use crate::{setup, util};

/// `soak` arguments.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// How long the churn and the flood run, in seconds (each about a third of it).
    #[arg(long, default_value_t = 300)]
    pub seconds: u64,
}

pub fn run(a: &SoakArgs) -> Result<ExitCode> {
    setup::ensure()?;
    let root = util::workspace_root();
    let mut build = Command::new("cargo");
    build
        .current_dir(&root)
        .args(["build", "--release", "--bins"]);
    util::run_inherit(&mut build)?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args([
            "test",
            "--release",
            "-p",
            "uvmwatch",
            "--test",
            "soak",
            "--",
            "--test-threads=1",
            "--nocapture",
        ])
        .env("UVMWATCH_SOAK_SECONDS", a.seconds.to_string());
    println!("xtask: {}", util::describe(&cmd));
    Ok(match util::run_inherit(&mut cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    })
}

//! `cargo xtask`: the project's tasks, in Rust so they need nothing but cargo.
//!
//! - `setup [--check]`: install (or only check) what a fresh Debian 12 machine lacks.
//! - `test [-- ARGS]`: set-up, build, every test single-threaded, a summary with skips.
//! - `demo`: set-up, build, run the agent against simulated NVIDIA device nodes.
//! - `device-check`: build a release agent and a script for a real GPU machine.
//! - `soak [--seconds N]`: the soak and fault harness on a release build, with its figures.
//! - `vm-test`: boot Debian's own kernels (kprobes, loadable modules) under qemu, with a test
//!   `nvidia_uvm` module (the stub series) and with NVIDIA's real open modules and libcuda
//!   (the nvidia series), and run the agent's kernel-side tests inside (`docs/vm-test.md`).
//! - `nvidia-layouts --source DIR [--check]`: regenerate (or check) the agent's table of NVIDIA
//!   ioctl params layouts from the headers of every driver release tag (`docs/compatibility.md`).
//!
//! This crate builds with the stable toolchain alone: it must not depend on the agent crate,
//! whose build script needs the nightly and bpf-linker that `setup` installs.

mod bench;
mod demo;
mod device_check;
mod nvidia_layouts;
mod setup;
mod soak;
mod test;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "cargo xtask", about = "uvmwatch project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Install what is missing (apt packages, Rust toolchains, bpf-linker); idempotent.
    Setup {
        /// Only report what is present and what is missing (exit 1 if something is).
        #[arg(long)]
        check: bool,
        /// Also the packages `vm-test` needs (qemu-system-x86, busybox-static, cpio, make, libelf1, strace).
        #[arg(long)]
        vm: bool,
    },
    /// Set up if needed, build, run every test (one at a time) and summarise, skips included.
    Test {
        /// Extra `cargo test` arguments after `--`, e.g. `-- -p uvmwatch-testbed hung`
        /// (a second `--` passes arguments on to the test binaries).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up if needed, build, and run the agent against simulated NVIDIA device nodes.
    Demo,
    /// Build a release agent and `target/device-check/run.sh` for a real GPU machine.
    DeviceCheck,
    /// The soak and fault harness (agent/tests/soak.rs) on a release build, longer than CI's.
    Soak(soak::SoakArgs),
    /// Boot Debian kernels under qemu with a test nvidia_uvm module and with NVIDIA's real
    /// modules and libcuda; run the kernel-side tests.
    VmTest(vm::VmTestArgs),
    /// Regenerate (or `--check`) agent/src/decode/layouts/nvidia-layouts.tsv from the headers of
    /// every release tag of NVIDIA/open-gpu-kernel-modules.
    NvidiaLayouts(nvidia_layouts::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Setup { check, vm } => setup::run_with(check, vm).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Cmd::Test { args } => test::run(&args),
        Cmd::Demo => demo::run(),
        Cmd::DeviceCheck => device_check::run(),
        Cmd::Soak(args) => soak::run(&args),
        Cmd::VmTest(args) => vm::run(&args),
        Cmd::NvidiaLayouts(args) => nvidia_layouts::run(&args),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

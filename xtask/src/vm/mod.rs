//! `cargo xtask vm-test`: the agent's kernel-side tests on real kernels, under qemu.
//!
//! The machines of this project run a kernel without kprobes and without loadable modules,
//! so kprobe paths and anything that needs a kernel module are tested on Debian's own
//! kernels instead (`docs/vm-test.md`). For each kernel:
//!
//! 1. `apt-get download` (cached in `target/vmtest/debs/`) the `linux-image-<k>` package, its
//!    `linux-headers-<k>`, the matching `-common` headers and `linux-kbuild-*`;
//! 2. extract `vmlinuz` and the headers under `target/vmtest/<k>/` (the host system is not
//!    modified) and build the test modules of `vmtest/module/` against them;
//! 3. build an initramfs: static busybox, `vmtest/init/` (the `/init` and the tests), the
//!    modules, the agent (`cargo build -p uvmwatch`, stripped) with its shared libraries and
//!    loader, the testbed's fake `libcuda.so.1` and `cuda-workload`, and `uvm-hmm-test`;
//! 4. boot it with `qemu-system-x86_64` (KVM when usable, else TCG) under a wall-clock
//!    limit, stream the serial console to `target/vmtest/<k>/console.log` and collect its
//!    `VMTEST <name> PASS|FAIL|SKIP <detail>` lines.
//!
//! Prints a per-kernel summary with the time of each step; exit status 1 when a test failed
//! or a VM did not finish, 2 when something could not be prepared.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::{setup, util};

mod debs;
mod image;
mod qemu;

use debs::*;
use image::*;
use qemu::*;

/// `cargo xtask vm-test` options.
#[derive(clap::Args, Debug, Clone)]
pub struct VmTestArgs {
    /// Kernels to test: `6.1`, `6.12`, `all`, or an exact Debian kernel release such as
    /// `6.12.100+deb12-amd64` (several separated by commas).
    #[arg(long, default_value = "all")]
    pub kernel: String,
    /// Keep the work files (the initramfs tree, the extracted image package) for inspection.
    #[arg(long)]
    pub keep: bool,
    /// Put a release build of the agent in the VM (default: the debug build).
    #[arg(long)]
    pub release: bool,
    /// Run only these tests (comma-separated names from `vmtest/init/tests.sh`).
    #[arg(long)]
    pub only: Option<String>,
    /// Put this agent binary in the VM instead of building one (e.g. a build from another
    /// tree or machine).
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// More kernel command-line arguments, e.g. `nokaslr`; `NAME=value` words without a dot
    /// reach /init (and the tests) as environment variables.
    #[arg(long, value_name = "ARGS")]
    pub append: Option<String>,
    /// qemu's `-accel` value instead of the automatic choice (`kvm` when usable, else
    /// `tcg,thread=single`), e.g. `tcg` for multi-threaded TCG.
    #[arg(long, value_name = "ACCEL")]
    pub accel: Option<String>,
    /// Wall-clock limit for one VM, in seconds.
    #[arg(long, default_value_t = 1500)]
    pub timeout: u64,
    /// Do not build and run the overhead benchmark inside the VMs (its `overhead` test
    /// then says it was skipped).
    #[arg(long)]
    pub no_bench: bool,
    /// Show the whole serial console, not only the VMTEST lines.
    #[arg(long, short)]
    pub verbose: bool,
}

/// A Debian kernel series this harness knows how to find.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Series {
    /// What `--kernel` calls it.
    name: &'static str,
    /// `linux-image-<prefix><N><suffix>`; the newest N is used.
    prefix: &'static str,
    suffix: &'static str,
}

const SERIES: &[Series] = &[
    Series {
        name: "6.1",
        prefix: "6.1.0-",
        suffix: "-amd64",
    },
    Series {
        name: "6.12",
        prefix: "6.12.",
        suffix: "+deb12-amd64",
    },
];

/// `kernel_release` of the newest package of `series` among `names` (package names), e.g.
/// `6.1.0-57-amd64` from `linux-image-6.1.0-57-amd64`; flavours (`-rt`, `-cloud`), `-dbg`
/// and `-unsigned` packages are left out.
fn newest_in_series(series: &Series, names: &[String]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix("linux-image-")?;
            let num = rest
                .strip_prefix(series.prefix)?
                .strip_suffix(series.suffix)?;
            let n: u32 = num.parse().ok()?;
            Some((n, rest.to_string()))
        })
        .max()
        .map(|(_, r)| r)
}

/// A `Depends:` field entry `name (op version)`, alternatives dropped.
fn depends_entries(field: &str) -> Vec<(String, Option<String>)> {
    field
        .split(',')
        .filter_map(|e| {
            let first = e.split('|').next()?.trim();
            let (name, rest) = match first.split_once(' ') {
                Some((n, r)) => (n, r.trim()),
                None => (first, ""),
            };
            let version = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| r.split_whitespace().nth(1))
                .map(String::from);
            (!name.is_empty()).then(|| (name.to_string(), version))
        })
        .collect()
}

/// Paths of the shared objects and loader `ldd` lists (absolute paths only).
fn ldd_paths(ldd_output: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in ldd_output.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            out.push(PathBuf::from(p));
        }
    }
    out
}

/// One `VMTEST` result line.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TestResult {
    name: String,
    status: String,
    detail: String,
}

fn parse_result(line: &str) -> Option<TestResult> {
    let rest = line.strip_prefix("VMTEST ")?;
    let mut it = rest.splitn(3, ' ');
    let name = it.next()?.to_string();
    let status = it.next()?.to_string();
    if !matches!(status.as_str(), "PASS" | "FAIL" | "SKIP") {
        return None;
    }
    Some(TestResult {
        name,
        status,
        detail: it.next().unwrap_or("").to_string(),
    })
}

/// What one kernel's run measured and found.
#[derive(Debug, Default)]
struct KernelRun {
    release: String,
    download: Duration,
    downloaded: bool,
    headers: Duration,
    module: Duration,
    initramfs: Duration,
    initramfs_bytes: u64,
    boot: Option<Duration>,
    tests: Option<Duration>,
    vm_total: Duration,
    finished: bool,
    timed_out: bool,
    results: Vec<TestResult>,
    /// The overhead benchmark's `overhead <kernel> <backend>: ...` lines.
    overhead: Vec<String>,
    console: PathBuf,
    error: Option<String>,
}

impl KernelRun {
    fn count(&self, status: &str) -> usize {
        self.results.iter().filter(|r| r.status == status).count()
    }
    fn ok(&self) -> bool {
        self.error.is_none() && self.finished && self.count("FAIL") == 0 && !self.results.is_empty()
    }
}

struct Paths {
    root: PathBuf,
    work: PathBuf,
    debs: PathBuf,
    userspace: PathBuf,
}

/// Runs `cargo xtask vm-test`.
///
/// # Errors
/// Set-up, a download, a build or the initramfs failed (a failing test is exit status 1).
pub fn run(args: &VmTestArgs) -> Result<ExitCode> {
    let t_all = Instant::now();
    setup::ensure_vm()?;
    let root = util::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let work = target.join("vmtest");
    let paths = Paths {
        root: root.clone(),
        debs: work.join("debs"),
        userspace: work.join("userspace"),
        work,
    };
    fs::create_dir_all(&paths.debs)?;
    fs::create_dir_all(&paths.userspace)?;

    let releases = resolve_kernels(&args.kernel, &paths)?;
    println!("vm-test: kernels: {}", releases.join(", "));

    let t = Instant::now();
    let agent = match &args.agent {
        Some(p) => {
            if !p.is_file() {
                bail!("--agent {}: no such file", p.display());
            }
            println!("vm-test: agent binary: {}", p.display());
            p.clone()
        }
        None => {
            let profile = if args.release { "release" } else { "debug" };
            println!("vm-test: cargo build -p uvmwatch --bin uvmwatch ({profile})");
            let mut build = Command::new("cargo");
            build
                .current_dir(&root)
                .args(["build", "-p", "uvmwatch", "--bin", "uvmwatch"]);
            if args.release {
                build.arg("--release");
            }
            util::run_inherit(&mut build)?;
            target.join(profile).join("uvmwatch")
        }
    };
    let bench = if args.no_bench {
        None
    } else {
        Some(crate::bench::build(&root, &target)?)
    };
    let userspace = build_userspace(&paths, &agent, bench.as_ref())?;
    println!(
        "vm-test: agent and test programs ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let accel: &str = match &args.accel {
        Some(a) => a,
        None => accelerator(),
    };
    println!("vm-test: qemu accelerator: {accel}");
    let mut runs = Vec::new();
    for release in &releases {
        let mut run = KernelRun {
            release: release.clone(),
            ..Default::default()
        };
        if let Err(e) = run_kernel(args, &paths, &userspace, accel, &mut run) {
            println!("vm-test: {release}: {e:#}");
            run.error = Some(format!("{e:#}"));
        }
        runs.push(run);
    }

    println!();
    println!(
        "vm-test summary ({:.0}s in all):",
        t_all.elapsed().as_secs_f64()
    );
    let mut all_ok = true;
    for r in &runs {
        all_ok &= r.ok();
        println!("{}", summary_line(r));
        for f in r.results.iter().filter(|t| t.status == "FAIL") {
            println!("  FAIL {}: {}", f.name, f.detail);
        }
        for o in &r.overhead {
            println!("  {o}");
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn summary_line(r: &KernelRun) -> String {
    let verdict = if r.ok() { "ok" } else { "FAILED" };
    let mut s = format!(
        "  {}: {verdict}: {} passed, {} failed, {} skipped",
        r.release,
        r.count("PASS"),
        r.count("FAIL"),
        r.count("SKIP")
    );
    if let Some(e) = &r.error {
        s.push_str(&format!(" (error: {e})"));
    } else if r.timed_out {
        s.push_str(" (VM timed out)");
    } else if !r.finished {
        s.push_str(" (VM ended before VMTEST-END)");
    }
    s.push_str(&format!(
        "; download {}{}, headers {}, module {}, initramfs {} ({} KiB), boot {}, tests {}, VM {} (console: {})",
        secs(r.download),
        if r.downloaded { "" } else { " (cached)" },
        secs(r.headers),
        secs(r.module),
        secs(r.initramfs),
        r.initramfs_bytes / 1024,
        r.boot.map(secs).unwrap_or_else(|| "-".into()),
        r.tests.map(secs).unwrap_or_else(|| "-".into()),
        secs(r.vm_total),
        r.console.display()
    ));
    s
}

// --- kernels -------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_of_each_series() {
        let names: Vec<String> = [
            "linux-image-6.1.0-55-amd64",
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-9-amd64",
            "linux-image-6.1.0-58-rt-amd64",
            "linux-image-6.1.0-58-amd64-dbg",
            "linux-image-6.1.0-58-cloud-amd64",
            "linux-image-6.12.100+deb12-amd64",
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.99+deb12-amd64",
            "linux-image-6.12.118+deb12-amd64-unsigned",
            "linux-image-6.12.118+deb12-cloud-amd64",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            newest_in_series(&SERIES[0], &names).as_deref(),
            Some("6.1.0-57-amd64")
        );
        assert_eq!(
            newest_in_series(&SERIES[1], &names).as_deref(),
            Some("6.12.117+deb12-amd64")
        );
        assert_eq!(newest_in_series(&SERIES[0], &[]), None);
    }

    #[test]
    fn depends_of_the_headers_packages() {
        let d = depends_entries(
            "linux-base (>= 4.12~), linux-headers-6.12.117+deb12-common (= 6.12.117-1~deb12u1), \
             linux-image-6.12.117+deb12-amd64 (= 6.12.117-1~deb12u1) | linux-image-6.12.117+deb12-amd64-unsigned (= 6.12.117-1~deb12u1), \
             linux-kbuild-6.12.117+deb12, gcc-12",
        );
        assert!(d.contains(&(
            "linux-headers-6.12.117+deb12-common".into(),
            Some("6.12.117-1~deb12u1".into())
        )));
        assert!(d.contains(&("linux-kbuild-6.12.117+deb12".into(), None)));
        assert!(!d.iter().any(|(n, _)| n.ends_with("-unsigned")));
        let d = depends_entries(
            "linux-headers-6.1.0-57-common (= 6.1.192-3), linux-kbuild-6.1 (>= 6.1.192-3), linux-compiler-gcc-12-x86",
        );
        assert!(d.contains(&("linux-kbuild-6.1".into(), Some("6.1.192-3".into()))));
    }

    #[test]
    fn ldd_lines() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            ldd_paths(out),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(ldd_paths("\tstatically linked\n").is_empty());
    }

    #[test]
    fn result_lines() {
        assert_eq!(
            parse_result("VMTEST cuinit_ok PASS cuInit=0 (3s)"),
            Some(TestResult {
                name: "cuinit_ok".into(),
                status: "PASS".into(),
                detail: "cuInit=0 (3s)".into()
            })
        );
        assert_eq!(parse_result("VMTEST x SKIP").unwrap().detail, "");
        assert_eq!(parse_result("VMTEST-BEGIN kernel=6.1"), None);
        assert_eq!(parse_result("VMTEST x MAYBE y"), None);
    }

    #[test]
    fn the_vm_files_exist() {
        let root = util::workspace_root();
        for f in [
            "vmtest/init/init",
            "vmtest/init/lib.sh",
            "vmtest/init/tests.sh",
            "vmtest/module/Kbuild",
            "vmtest/module/uvm_stub.c",
            "vmtest/module/nv_stub.c",
            "vmtest/c/uvm_hmm_test.c",
        ] {
            assert!(root.join(f).is_file(), "{f} missing");
        }
    }
}

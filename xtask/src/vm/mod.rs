//! `cargo xtask vm-test`: the agent's kernel-side tests on real kernels, under qemu.
//!
//! The machines of this project run a kernel without kprobes and without loadable modules,
//! so kprobe paths and anything that needs a kernel module are tested on Debian's own
//! kernels instead (`docs/vm-test.md`). Two series per kernel: `stub` (test modules standing
//! in for NVIDIA's, `vmtest/init/tests.sh`) and `nvidia` (NVIDIA's real open modules and
//! libcuda from Debian's packages, `vmtest/init/nvidia.sh`, see `nvidia.rs`). For each
//! kernel:
//!
//! 1. `apt-get download` (cached in `<cache>/vmtest/debs/`, `cache.rs`) the `linux-image-<k>` package, its
//!    `linux-headers-<k>`, the matching `-common` headers and `linux-kbuild-*`;
//! 2. extract `vmlinuz` and the headers under `target/vmtest/<k>/` (the host system is not
//!    modified) and build the test modules of `vmtest/module/` against them;
//! 3. build an initramfs: static busybox, `vmtest/init/` (the `/init` and the tests), the
//!    modules, the agent (`cargo build -p uvmwatch`, stripped) with its shared libraries and
//!    loader, the testbed's fake `libcuda.so.1` and `cuda-workload`, and `uvm-hmm-test`;
//! 4. boot it with `qemu-system-x86_64` (KVM when usable, else TCG) under a wall-clock
//!    limit, stream the serial console to `target/vmtest/<k>/console.log` and collect its
//!    `VMTEST <name> PASS|FAIL|SKIP <detail>` lines;
//! 5. for the `nvidia` series, the same with NVIDIA's modules built (cached) against the
//!    kernel's headers, in `target/vmtest/<k>/nvidia/`.
//!
//! Prints a per-kernel and per-series summary with the time of each step; exit status 1 when a test failed
//! or a VM did not finish, 2 when something could not be prepared.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{setup, util};

mod cache;
mod debs;
mod image;
mod nvidia;
mod qemu;

use debs::*;
use image::*;
use nvidia::NvidiaPlan;
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
    /// Which series to run per kernel: `stub` (test modules standing in for NVIDIA's,
    /// `vmtest/init/tests.sh`), `nvidia` (NVIDIA's real open modules and libcuda,
    /// `vmtest/init/nvidia.sh`), or both separated by a comma.
    #[arg(long, default_value = "stub,nvidia")]
    pub series: String,
    /// Run only these tests (comma-separated names from `vmtest/init/tests.sh` or
    /// `nvidia.sh`; a series with none of them is left out).
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

/// What one kernel's run of one series measured and found.
#[derive(Debug, Default)]
struct KernelRun {
    release: String,
    /// `stub`, or `nvidia-<version>`.
    series: String,
    /// The series' directory: its initramfs, console log (and for `nvidia` the saved files).
    dir: PathBuf,
    download: Duration,
    downloaded: bool,
    headers: Duration,
    module: Duration,
    /// The module build was taken from the cache (the `nvidia` series).
    module_cached: bool,
    /// Save the console lines with a file prefix (`strace| `, ...) into `dir`.
    artifacts: bool,
    artifact_files: Vec<String>,
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
    fn new(release: &str, series: &str, dir: PathBuf) -> KernelRun {
        KernelRun {
            release: release.to_string(),
            series: series.to_string(),
            console: dir.join("console.log"),
            dir,
            ..Default::default()
        }
    }
    /// `<release> <series>`, as the summary shows it.
    fn name(&self) -> String {
        format!("{} {}", self.release, self.series)
    }
    fn count(&self, status: &str) -> usize {
        self.results.iter().filter(|r| r.status == status).count()
    }
    fn ok(&self) -> bool {
        self.error.is_none() && self.finished && self.count("FAIL") == 0 && !self.results.is_empty()
    }
}

struct Paths {
    root: PathBuf,
    /// `target/vmtest`: extracted kernels, builds of this clone, initramfs trees.
    work: PathBuf,
    /// `<cache>/vmtest/debs`: every downloaded package.
    debs: PathBuf,
    userspace: PathBuf,
    /// The cache that outlives the clone (`cache.rs`).
    cache: PathBuf,
}

/// Which series `--series` asks for: (stub, nvidia).
fn parse_series(spec: &str) -> Result<(bool, bool)> {
    let (mut stub, mut nv) = (false, false);
    for s in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match s {
            "stub" => stub = true,
            "nvidia" => nv = true,
            "all" => (stub, nv) = (true, true),
            _ => bail!("unknown --series {s:?}: use stub, nvidia or stub,nvidia"),
        }
    }
    if !stub && !nv {
        bail!("--series names no series");
    }
    Ok((stub, nv))
}

/// The tests a script runs: the names in its `VMTEST_TESTS="..."` and `VMTEST_FINAL="..."`
/// assignments (which may span lines).
fn script_tests(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for var in ["VMTEST_TESTS=\"", "VMTEST_FINAL=\""] {
        let mut rest = text;
        while let Some(i) = rest.find(var) {
            let at_line_start = i == 0 || rest[..i].ends_with('\n');
            rest = &rest[i + var.len()..];
            let Some(end) = rest.find('"') else { break };
            if at_line_start {
                out.extend(rest[..end].split_whitespace().map(String::from));
            }
            rest = &rest[end..];
        }
    }
    out
}

/// A kernel's packages, extracted.
struct KernelPrep {
    kdir: PathBuf,
    debs: KernelDebs,
    vmlinuz: PathBuf,
    kbuild: PathBuf,
    download: Duration,
    downloaded: bool,
    headers: Duration,
}

fn prepare_kernel(args: &VmTestArgs, paths: &Paths, release: &str) -> Result<KernelPrep> {
    let kdir = paths.work.join(release);
    fs::create_dir_all(&kdir)?;
    let t = Instant::now();
    let (debs, downloaded) = fetch_kernel(paths, release)?;
    let download = t.elapsed();
    let t = Instant::now();
    let (vmlinuz, kbuild) = extract_kernel(&kdir, release, &debs, args.keep)?;
    Ok(KernelPrep {
        kdir,
        debs,
        vmlinuz,
        kbuild,
        download,
        downloaded,
        headers: t.elapsed(),
    })
}

/// The stand-in series of one kernel: the test modules, `tests.sh`, the benchmark.
fn run_stub(
    args: &VmTestArgs,
    paths: &Paths,
    us: &Userspace,
    accel: &str,
    kp: &KernelPrep,
    run: &mut KernelRun,
) -> Result<()> {
    let t = Instant::now();
    let modules = build_module(paths, &kp.kdir, &kp.kbuild)?;
    run.module = t.elapsed();
    let t = Instant::now();
    let img = Image {
        dir: run.dir.clone(),
        script: "tests.sh",
        bench: true,
        files: ["nvidia.ko", "nvidia-uvm.ko"]
            .iter()
            .map(|ko| (format!("vmtest/modules/{ko}"), modules.join(ko), 0o644))
            .collect(),
        links: Vec::new(),
        passwd: Vec::new(),
        group: Vec::new(),
    };
    let initrd = build_initramfs(paths, &kp.kdir, &run.release, us, &img, args.keep)?;
    run.initramfs = t.elapsed();
    run.initramfs_bytes = fs::metadata(&initrd)?.len();
    print_prepared(run);
    boot_vm(args, accel, &kp.vmlinuz, &initrd, 1024, "", run)
}

fn print_prepared(run: &KernelRun) {
    println!(
        "vm-test: {}: download {}{}, headers {}, {} {}{}, initramfs {} ({} KiB)",
        run.name(),
        secs(run.download),
        if run.downloaded { "" } else { " (cached)" },
        secs(run.headers),
        build_word(run),
        secs(run.module),
        if run.module_cached { " (cached)" } else { "" },
        secs(run.initramfs),
        run.initramfs_bytes / 1024
    );
}

fn build_word(run: &KernelRun) -> &'static str {
    if run.series == "stub" {
        "module"
    } else {
        "nvidia build"
    }
}

/// Runs `cargo xtask vm-test`.
///
/// # Errors
/// Set-up, a download, a build or the initramfs failed (a failing test is exit status 1).
pub fn run(args: &VmTestArgs) -> Result<ExitCode> {
    let t_all = Instant::now();
    let (mut want_stub, mut want_nvidia) = parse_series(&args.series)?;
    setup::ensure_vm()?;
    let root = util::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let work = target.join("vmtest");
    let cache = cache::cache_dir();
    let paths = Paths {
        root: root.clone(),
        debs: cache.join("vmtest/debs"),
        userspace: work.join("userspace"),
        work,
        cache,
    };
    fs::create_dir_all(&paths.debs)?;
    fs::create_dir_all(&paths.userspace)?;
    println!(
        "vm-test: cache: {} (UVMWATCH_CACHE_DIR, else $XDG_CACHE_HOME/uvmwatch, else ~/.cache/uvmwatch)",
        paths.cache.display()
    );
    cache::migrate_debs(&paths.work.join("debs"), &paths.debs)?;
    cache::remove_stale_temps(&paths.debs);
    cache::remove_stale_temps(&paths.cache.join("vmtest/nvidia"));

    // --only: a series none of whose tests is named is left out.
    if let Some(only) = &args.only {
        let names: Vec<&str> = only
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let tests_of = |script: &str| -> Result<Vec<String>> {
            let p = root.join("vmtest/init").join(script);
            Ok(script_tests(
                &fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?,
            ))
        };
        let (stub_tests, nv_tests) = (tests_of("tests.sh")?, tests_of("nvidia.sh")?);
        for n in &names {
            if !stub_tests.iter().chain(&nv_tests).any(|t| t == n) {
                println!("vm-test: warning: --only {n}: no such test in tests.sh or nvidia.sh");
            }
        }
        for (want, tests, name) in [
            (&mut want_stub, &stub_tests, "stub"),
            (&mut want_nvidia, &nv_tests, "nvidia"),
        ] {
            if *want && !names.iter().any(|n| tests.iter().any(|t| t == n)) {
                println!("vm-test: --only names no test of the {name} series; it is left out");
                *want = false;
            }
        }
        if !want_stub && !want_nvidia {
            bail!("--only {only}: no test of the series asked for");
        }
    }

    let releases = resolve_kernels(&args.kernel, &paths)?;
    println!("vm-test: kernels: {}", releases.join(", "));
    let plan = if want_nvidia {
        Some(NvidiaPlan::resolve(&paths, &releases)?)
    } else {
        None
    };

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
    // The overhead benchmark runs in the stub series only.
    let bench = if args.no_bench || !want_stub {
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
        println!("\nvm-test: === {release} ===");
        let kdir = paths.work.join(release);
        let mut series = Vec::new();
        if want_stub {
            series.push(KernelRun::new(release, "stub", kdir.clone()));
        }
        if let Some(plan) = &plan {
            let label = plan
                .release_for(release)
                .map_or_else(|| "nvidia".to_string(), |r| format!("nvidia-{}", r.version));
            let mut r = KernelRun::new(release, &label, kdir.join("nvidia"));
            r.artifacts = true;
            series.push(r);
        }
        let kp = match prepare_kernel(args, &paths, release) {
            Ok(kp) => kp,
            Err(e) => {
                println!("vm-test: {release}: {e:#}");
                for mut r in series {
                    r.error = Some(format!("{e:#}"));
                    runs.push(r);
                }
                continue;
            }
        };
        for (i, mut run) in series.into_iter().enumerate() {
            // The kernel's download and extraction are counted once, in its first series.
            if i == 0 {
                run.download = kp.download;
                run.downloaded = kp.downloaded;
                run.headers = kp.headers;
            }
            let r = fs::create_dir_all(&run.dir)
                .map_err(anyhow::Error::from)
                .and_then(|()| match &plan {
                    Some(plan) if run.series != "stub" => {
                        nvidia::run_nvidia(args, &paths, &userspace, accel, &kp, plan, &mut run)
                    }
                    _ => run_stub(args, &paths, &userspace, accel, &kp, &mut run),
                });
            if let Err(e) = r {
                println!("vm-test: {}: {e:#}", run.name());
                run.error = Some(format!("{e:#}"));
            }
            runs.push(run);
        }
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
        if !r.artifact_files.is_empty() {
            println!(
                "  saved in {}: {}",
                r.dir.display(),
                r.artifact_files.join(", ")
            );
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
        r.name(),
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
        "; download {}{}, headers {}, {} {}{}, initramfs {} ({} KiB), boot {}, tests {}, VM {} (console: {})",
        secs(r.download),
        if r.downloaded { "" } else { " (cached)" },
        secs(r.headers),
        build_word(r),
        secs(r.module),
        if r.module_cached { " (cached)" } else { "" },
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
    fn series_flag() {
        assert_eq!(parse_series("stub,nvidia").unwrap(), (true, true));
        assert_eq!(parse_series("nvidia").unwrap(), (false, true));
        assert_eq!(parse_series(" stub ").unwrap(), (true, false));
        assert!(parse_series("real").is_err());
        assert!(parse_series(",").is_err());
    }

    #[test]
    fn tests_of_a_script() {
        let text = "# VMTEST_TESTS=\"not this\"\nVMTEST_TESTS=\"a b\nc\"\nVMTEST_ONCE=\"a\"\nVMTEST_FINAL=\"z\"\n";
        assert_eq!(script_tests(text), ["a", "b", "c", "z"]);
        let root = util::workspace_root();
        let stub = script_tests(&fs::read_to_string(root.join("vmtest/init/tests.sh")).unwrap());
        assert!(stub.contains(&"cuinit_ok".to_string()) && stub.contains(&"overhead".to_string()));
        let nv = script_tests(&fs::read_to_string(root.join("vmtest/init/nvidia.sh")).unwrap());
        for t in [
            "nvidia_refused",
            "nvidia_load",
            "nvidia_cuinit",
            "agent_start",
            "nvidia_capture",
        ] {
            assert!(nv.contains(&t.to_string()), "{t} not in nvidia.sh: {nv:?}");
        }
        assert!(
            !nv.contains(&"overhead".to_string()),
            "the benchmark stays in the stub series"
        );
    }

    #[test]
    fn the_vm_files_exist() {
        let root = util::workspace_root();
        for f in [
            "vmtest/init/init",
            "vmtest/init/lib.sh",
            "vmtest/init/tests.sh",
            "vmtest/init/nvidia.sh",
            "vmtest/module/Kbuild",
            "vmtest/module/uvm_stub.c",
            "vmtest/module/nv_stub.c",
            "vmtest/c/uvm_hmm_test.c",
        ] {
            assert!(root.join(f).is_file(), "{f} missing");
        }
    }
}

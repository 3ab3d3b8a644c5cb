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
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{setup, util};

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
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
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
    let userspace = build_userspace(&paths, &agent)?;
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

fn apt_pkgnames(prefix: &str) -> Vec<String> {
    util::output("apt-cache", ["pkgnames", prefix])
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Package names already downloaded (offline use).
fn cached_image_names(debs: &Path) -> Vec<String> {
    fs::read_dir(debs)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.strip_suffix(".deb")?;
                    Some(n.split('_').next()?.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn resolve_kernels(spec: &str, paths: &Paths) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut updated = false;
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let wanted: Vec<&Series> = match item {
            "all" => SERIES.iter().collect(),
            _ => SERIES.iter().filter(|s| s.name == item).collect(),
        };
        if wanted.is_empty() {
            if item.ends_with("-amd64") {
                out.push(item.to_string());
                continue;
            }
            bail!("unknown --kernel {item:?}: use 6.1, 6.12, all or a release like 6.1.0-57-amd64");
        }
        for s in wanted {
            let prefix = format!("linux-image-{}", s.prefix);
            let mut found = newest_in_series(s, &apt_pkgnames(&prefix));
            if found.is_none() && !updated {
                println!("vm-test: no {prefix}* in the apt lists; apt-get update");
                let _ = util::run_inherit(
                    Command::new("apt-get")
                        .arg("update")
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                );
                updated = true;
                found = newest_in_series(s, &apt_pkgnames(&prefix));
            }
            if found.is_none() {
                found = newest_in_series(s, &cached_image_names(&paths.debs));
            }
            match found {
                Some(r) => {
                    println!(
                        "vm-test: {} series: newest available is linux-image-{r}",
                        s.name
                    );
                    out.push(r);
                }
                None => bail!("no linux-image-{}N{} package found", s.prefix, s.suffix),
            }
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|r| seen.insert(r.clone()));
    Ok(out)
}

/// The cached `.deb` of `pkg` (at `version` when given), downloading it when absent.
/// Returns the file and whether it was downloaded now.
fn fetch_deb(debs: &Path, pkg: &str, version: Option<&str>) -> Result<(PathBuf, bool)> {
    let find = || -> Option<PathBuf> {
        let mut hits: Vec<PathBuf> = fs::read_dir(debs)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                let n = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                let mut parts = n.split('_');
                parts.next() == Some(pkg)
                    && version.is_none_or(|v| parts.next() == Some(&v.replace(':', "%3a")))
                    && n.ends_with(".deb")
            })
            .collect();
        hits.sort();
        hits.pop()
    };
    if let Some(p) = find() {
        return Ok((p, false));
    }
    let spec = match version {
        Some(v) => format!("{pkg}={v}"),
        None => pkg.to_string(),
    };
    println!("vm-test: apt-get download {spec}");
    util::run_inherit(
        Command::new("apt-get")
            .current_dir(debs)
            .args(["download", "-q", &spec]),
    )?;
    find()
        .map(|p| (p, true))
        .with_context(|| format!("apt-get download {spec} left no .deb in {}", debs.display()))
}

fn deb_field(deb: &Path, field: &str) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .context("run dpkg-deb")?;
    if !out.status.success() {
        bail!("dpkg-deb -f {} {field} failed", deb.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn sh(script: &str) -> Result<()> {
    util::run_inherit(Command::new("sh").args(["-ec", script]))
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The `.deb`s of one kernel: image, headers, common headers, kbuild.
struct KernelDebs {
    image: PathBuf,
    headers: Vec<PathBuf>,
}

fn fetch_kernel(paths: &Paths, release: &str, run: &mut KernelRun) -> Result<KernelDebs> {
    let t = Instant::now();
    let mut downloaded = false;
    let (image, d) = fetch_deb(&paths.debs, &format!("linux-image-{release}"), None)?;
    downloaded |= d;
    let hdr_pkg = format!("linux-headers-{release}");
    let (hdr, d) = fetch_deb(&paths.debs, &hdr_pkg, None)?;
    downloaded |= d;
    let hdr_version = deb_field(&hdr, "Version")?;
    let mut headers = vec![hdr.clone()];
    for (name, version) in depends_entries(&deb_field(&hdr, "Depends")?) {
        let is_common = name.starts_with("linux-headers-") && name.ends_with("-common");
        if is_common || name.starts_with("linux-kbuild-") {
            let v = version.unwrap_or_else(|| hdr_version.clone());
            let (p, d) = fetch_deb(&paths.debs, &name, Some(&v))?;
            downloaded |= d;
            headers.push(p);
        }
    }
    if headers.len() < 3 {
        bail!("{hdr_pkg} does not name its -common headers and kbuild packages");
    }
    run.download = t.elapsed();
    run.downloaded = downloaded;
    Ok(KernelDebs { image, headers })
}

/// Extracts vmlinuz and the headers (once); returns (vmlinuz, kbuild dir).
fn extract_kernel(
    kdir: &Path,
    release: &str,
    debs: &KernelDebs,
    keep: bool,
) -> Result<(PathBuf, PathBuf)> {
    let vmlinuz = kdir.join("vmlinuz");
    let image_stamp = kdir.join("vmlinuz.from");
    let image_name = debs
        .image
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    if !vmlinuz.is_file() || fs::read_to_string(&image_stamp).ok().as_deref() != Some(&image_name) {
        let img = kdir.join("image");
        let _ = fs::remove_dir_all(&img);
        fs::create_dir_all(&img)?;
        sh(&format!(
            "dpkg-deb --fsys-tarfile {} | tar -xf - -C {} ./boot/vmlinuz-{release} ./boot/config-{release}",
            q(&debs.image),
            q(&img)
        ))?;
        fs::copy(img.join(format!("boot/vmlinuz-{release}")), &vmlinuz)?;
        fs::copy(
            img.join(format!("boot/config-{release}")),
            kdir.join("config"),
        )?;
        if !keep {
            fs::remove_dir_all(&img)?;
        }
        fs::write(&image_stamp, &image_name)?;
    }

    let hroot = kdir.join("headers");
    let kbuild = hroot.join(format!("usr/src/linux-headers-{release}"));
    let stamp = hroot.join(".extracted-from");
    let names: Vec<String> = debs
        .headers
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string()
        })
        .collect();
    if fs::read_to_string(&stamp).ok().as_deref() != Some(&names.join("\n")) {
        let _ = fs::remove_dir_all(&hroot);
        fs::create_dir_all(&hroot)?;
        for d in &debs.headers {
            util::run_inherit(Command::new("dpkg-deb").arg("-x").arg(d).arg(&hroot))?;
        }
        // The arch Makefile includes the common one by its absolute /usr/src path.
        let mk = kbuild.join("Makefile");
        let text = fs::read_to_string(&mk).with_context(|| format!("read {}", mk.display()))?;
        let fixed = text.replace(
            "include /usr/src/",
            &format!("include {}/usr/src/", hroot.display()),
        );
        fs::write(&mk, fixed)?;
        fs::write(&stamp, names.join("\n"))?;
    }
    Ok((vmlinuz, kbuild))
}

/// Builds the test modules against `kbuild`; returns the directory holding the `.ko`s.
fn build_module(paths: &Paths, kdir: &Path, kbuild: &Path) -> Result<PathBuf> {
    let src = paths.root.join("vmtest/module");
    let out = kdir.join("module");
    fs::create_dir_all(&out)?;
    for e in fs::read_dir(&src)? {
        let p = e?.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if name == "Kbuild" || name.ends_with(".c") || name.ends_with(".h") {
            let dst = out.join(&name);
            let new = fs::read(&p)?;
            if fs::read(&dst).ok().as_deref() != Some(&new[..]) {
                fs::write(&dst, &new)?;
            }
        }
    }
    let o = Command::new("make")
        .arg("-C")
        .arg(kbuild)
        .arg(format!("M={}", out.display()))
        // Out-of-tree modules carry no BTF (as NVIDIA's): no pahole needed either.
        .arg("CONFIG_DEBUG_INFO_BTF_MODULES=")
        .arg("modules")
        .output()
        .context("run make")?;
    fs::write(
        kdir.join("module-build.log"),
        [&o.stdout[..], &o.stderr[..]].concat(),
    )?;
    if !o.status.success() {
        bail!(
            "module build failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for ko in ["nvidia.ko", "nvidia-uvm.ko"] {
        if !out.join(ko).is_file() {
            bail!("module build left no {ko}");
        }
    }
    Ok(out)
}

// --- user space ----------------------------------------------------------------------------

struct Userspace {
    /// (path inside the initramfs, file on the host)
    files: Vec<(String, PathBuf)>,
    busybox: PathBuf,
}

fn cc(args: &[&std::ffi::OsStr]) -> Result<()> {
    let compiler = std::env::var_os("CC")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cc".into());
    util::run_inherit(
        Command::new(&compiler)
            .args(["-O2", "-g", "-Wall", "-Wextra", "-fno-omit-frame-pointer"])
            .args(args),
    )
}

fn build_userspace(paths: &Paths, agent: &Path) -> Result<Userspace> {
    let us = &paths.userspace;
    let src = us.join("src");
    fs::create_dir_all(&src)?;
    fs::write(src.join("fake_libcuda.c"), uvmwatch_testbed::FAKE_LIBCUDA_C)?;
    fs::write(
        src.join("cuda_workload.c"),
        uvmwatch_testbed::CUDA_WORKLOAD_C,
    )?;
    let libcuda = us.join("libcuda.so.1");
    let workload = us.join("cuda-workload");
    let hmm = us.join("uvm-hmm-test");
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-Wl,-soname,libcuda.so.1".as_ref(),
        "-o".as_ref(),
        libcuda.as_os_str(),
        src.join("fake_libcuda.c").as_os_str(),
        "-lpthread".as_ref(),
    ])?;
    cc(&[
        "-o".as_ref(),
        workload.as_os_str(),
        src.join("cuda_workload.c").as_os_str(),
        "-ldl".as_ref(),
    ])?;
    cc(&[
        "-o".as_ref(),
        hmm.as_os_str(),
        paths.root.join("vmtest/c/uvm_hmm_test.c").as_os_str(),
    ])?;
    let stripped = us.join("uvmwatch");
    util::run_inherit(Command::new("strip").arg("-o").arg(&stripped).arg(agent))?;

    let mut files = vec![
        ("usr/bin/uvmwatch".to_string(), stripped.clone()),
        ("usr/bin/cuda-workload".to_string(), workload.clone()),
        ("usr/bin/uvm-hmm-test".to_string(), hmm.clone()),
        ("opt/fakecuda/libcuda.so.1".to_string(), libcuda.clone()),
    ];
    let mut libs = BTreeSet::new();
    for bin in [&stripped, &workload, &hmm, &libcuda] {
        let o = Command::new("ldd").arg(bin).output().context("run ldd")?;
        libs.extend(ldd_paths(&String::from_utf8_lossy(&o.stdout)));
    }
    // dlopen'ed by nothing else; libdl/libpthread are part of libc on Debian 12.
    for l in libs {
        let inside = l.to_string_lossy().trim_start_matches('/').to_string();
        files.push((inside, l));
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("no busybox (apt-get install busybox-static)")?;
    Ok(Userspace { files, busybox })
}

fn build_initramfs(
    paths: &Paths,
    kdir: &Path,
    release: &str,
    modules: &Path,
    us: &Userspace,
    keep: bool,
) -> Result<PathBuf> {
    let tree = kdir.join("initramfs");
    let _ = fs::remove_dir_all(&tree);
    for d in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "root",
        "etc",
        "vmtest/modules",
        "opt/fakecuda",
        "lib64",
    ] {
        fs::create_dir_all(tree.join(d))?;
    }
    let put = |inside: &str, from: &Path, mode: u32| -> Result<()> {
        let dst = tree.join(inside);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(from, &dst).with_context(|| format!("copy {}", from.display()))?;
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put("bin/busybox", &us.busybox, 0o755)?;
    std::os::unix::fs::symlink("busybox", tree.join("bin/sh"))?;
    let init = paths.root.join("vmtest/init");
    put("init", &init.join("init"), 0o755)?;
    put("vmtest/lib.sh", &init.join("lib.sh"), 0o644)?;
    put("vmtest/tests.sh", &init.join("tests.sh"), 0o644)?;
    for ko in ["nvidia.ko", "nvidia-uvm.ko"] {
        put(&format!("vmtest/modules/{ko}"), &modules.join(ko), 0o644)?;
    }
    for (inside, from) in &us.files {
        put(inside, from, 0o755)?;
    }
    // The kernel's config where a Debian host has it (the agent's doctor reads it).
    let config = kdir.join("config");
    if config.is_file() {
        put(&format!("boot/config-{release}"), &config, 0o644)?;
    }
    fs::write(tree.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    fs::write(tree.join("etc/group"), "root:x:0:\n")?;

    let out = kdir.join("ir.cpio.gz");
    sh(&format!(
        "cd {} && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > {}",
        q(&tree),
        q(&out)
    ))?;
    if !keep {
        fs::remove_dir_all(&tree)?;
    }
    Ok(out)
}

// --- qemu ------------------------------------------------------------------------------------

/// `kvm` when /dev/kvm can be used (the CPU has vmx or svm), else single-threaded TCG.
///
/// Multi-threaded TCG (one host thread per vCPU) crashed a 6.12 guest with an `int3` oops in
/// `syscall_exit_to_user_mode_prepare` while the agent enabled its tracepoints: the kernel
/// patches its own text with `text_poke_bp` (int3, sync, write, sync), and a second vCPU
/// kept running stale code. `thread=single` runs both vCPUs in one host thread, which keeps
/// cross-modified code coherent and uses one host core instead of two.
fn accelerator() -> &'static str {
    let cpu_ok = fs::read_to_string("/proc/cpuinfo")
        .map(|c| {
            c.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        })
        .unwrap_or(false);
    let dev_ok = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if cpu_ok && dev_ok {
        "kvm"
    } else {
        "tcg,thread=single"
    }
}

fn run_kernel(
    args: &VmTestArgs,
    paths: &Paths,
    us: &Userspace,
    accel: &str,
    run: &mut KernelRun,
) -> Result<()> {
    let release = run.release.clone();
    let kdir = paths.work.join(&release);
    fs::create_dir_all(&kdir)?;
    run.console = kdir.join("console.log");
    println!("\nvm-test: === {release} ===");

    let debs = fetch_kernel(paths, &release, run)?;
    let t = Instant::now();
    let (vmlinuz, kbuild) = extract_kernel(&kdir, &release, &debs, args.keep)?;
    run.headers = t.elapsed();
    let t = Instant::now();
    let modules = build_module(paths, &kdir, &kbuild)?;
    run.module = t.elapsed();
    let t = Instant::now();
    let initrd = build_initramfs(paths, &kdir, &release, &modules, us, args.keep)?;
    run.initramfs = t.elapsed();
    run.initramfs_bytes = fs::metadata(&initrd)?.len();
    println!(
        "vm-test: {release}: download {}{}, headers {}, module {}, initramfs {} ({} KiB)",
        secs(run.download),
        if run.downloaded { "" } else { " (cached)" },
        secs(run.headers),
        secs(run.module),
        secs(run.initramfs),
        run.initramfs_bytes / 1024
    );

    let mut append = String::from("console=ttyS0 quiet panic=-1");
    if let Some(only) = &args.only {
        append.push_str(&format!(" vmtest.only={}", only.replace(' ', "")));
    }
    if let Some(extra) = &args.append {
        append.push(' ');
        append.push_str(extra);
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        accel,
        "-m",
        "1024",
        "-smp",
        "2",
        "-nographic",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(&vmlinuz)
    .arg("-initrd")
    .arg(&initrd)
    .args(["-append", &append])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    println!("vm-test: {release}: {}", util::describe(&cmd));
    boot(&mut cmd, args, run)
}

enum Msg {
    Line(String),
    Stderr(String),
    Eof,
}

fn boot(cmd: &mut Command, args: &VmTestArgs, run: &mut KernelRun) -> Result<()> {
    let mut log = fs::File::create(&run.console)
        .with_context(|| format!("create {}", run.console.display()))?;
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("start qemu-system-x86_64")?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .replace('\r', "");
                    if tx.send(Msg::Line(s)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Msg::Eof);
    });
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx2.send(Msg::Stderr(l));
        }
    });

    let deadline = t0 + Duration::from_secs(args.timeout);
    let mut begin: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            run.timed_out = true;
            let _ = child.kill();
            writeln!(log, "vm-test: killed after {}s (--timeout)", args.timeout)?;
            println!(
                "vm-test: {}: VM killed after {}s",
                run.release, args.timeout
            );
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(Msg::Line(l)) => {
                writeln!(log, "{l}")?;
                // The firmware's terminal reset can precede the first line: match anywhere.
                if let Some(rest) = l.find("VMTEST-BEGIN").map(|i| &l[i + 12..]) {
                    begin = Some(Instant::now());
                    run.boot = Some(t0.elapsed());
                    println!(
                        "vm-test: {}: booted in {}:{rest}",
                        run.release,
                        secs(t0.elapsed())
                    );
                } else if l.contains("VMTEST-END") {
                    run.finished = true;
                    run.tests = begin.map(|b| b.elapsed());
                } else if let Some(r) = parse_result(&l) {
                    println!("  {} {:<24} {}", r.status, r.name, r.detail);
                    run.results.push(r);
                } else if args.verbose {
                    println!("  | {l}");
                }
            }
            Ok(Msg::Stderr(l)) => {
                writeln!(log, "qemu: {l}")?;
                println!("  qemu: {l}");
            }
            Ok(Msg::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    let status = child.wait()?;
    run.vm_total = t0.elapsed();
    writeln!(log, "vm-test: qemu exited: {status}")?;
    if !run.finished && !run.timed_out {
        println!(
            "vm-test: {}: VM stopped before VMTEST-END ({status}); see {}",
            run.release,
            run.console.display()
        );
    }
    Ok(())
}

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

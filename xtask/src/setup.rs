//! `cargo xtask setup [--check]`: what a fresh Debian 12 machine lacks, installed in order.
//!
//! Every step prints one line: `ok: …` when present, `installing: …` before installing,
//! `missing: …` with `--check`, and `failed: <command>` when an install fails. Versions
//! match `rust-toolchain.toml` and `agent/build.rs` (unit tests below compare them).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{describe, is_root, output, run_inherit};

/// Debian packages: LLVM 22 for bpf-linker, a C toolchain for the test doubles, util-linux
/// for `unshare`/`mount`, `prometheus` for `promtool check metrics`, and curl.
pub const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "gcc",
    "libc6-dev",
    "util-linux",
    "mount",
    "prometheus",
    "curl",
    // `python3 -m venv` with pip, for the deploy/ checks.
    "python3-venv",
];

/// Debian packages that `cargo xtask vm-test` (and `setup --vm`) needs on top: qemu, a
/// static busybox and cpio for the initramfs, what the kernel packages' kbuild needs to
/// build the test module and NVIDIA's (make; libelf1 for its tools), and strace, which the
/// nvidia series runs beside the agent on NVIDIA's own libcuda. The kernels and NVIDIA's
/// packages are downloaded with `apt-get download` into the cache, never installed.
pub const VM_APT_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "make",
    "libelf1",
    "strace",
];

/// The user-space toolchain (`rust-toolchain.toml`).
pub const STABLE: &str = "1.95.0";
/// Components the stable toolchain needs.
pub const STABLE_COMPONENTS: &[&str] = &["rustfmt", "clippy"];
/// The toolchain that builds the eBPF crate (`agent/build.rs`).
pub const NIGHTLY: &str = "nightly-2026-05-20";
/// Components the nightly needs.
pub const NIGHTLY_COMPONENTS: &[&str] = &["rust-src"];
/// bpf-linker release that matches LLVM 22.
pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// Where Debian's `llvm-22-dev` lives (bpf-linker's build looks in /usr without it).
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// `dpkg`'s policy hook: while it exits 101, package scripts start no services.
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// Runs every step. With `check_only`, installs nothing. Returns whether everything needed
/// is present (after installing, when not `check_only`).
///
/// # Errors
/// An install command failed, or installing needs root and this is not root.
pub fn run(check_only: bool) -> Result<bool> {
    run_with(check_only, false)
}

/// [`run`], plus the packages of `cargo xtask vm-test` when `vm` (`setup --vm`).
///
/// # Errors
/// As [`run`].
pub fn run_with(check_only: bool, vm: bool) -> Result<bool> {
    let mut all = true;
    all &= apt(APT_PACKAGES, "apt packages", check_only)?;
    if vm {
        all &= apt(VM_APT_PACKAGES, "apt packages for vm-test", check_only)?;
    }
    all &= toolchain(STABLE, STABLE_COMPONENTS, check_only)?;
    all &= toolchain(NIGHTLY, NIGHTLY_COMPONENTS, check_only)?;
    all &= bpf_linker(check_only)?;
    all &= deploy_check_packages(check_only)?;
    all &= perfetto_check_packages(check_only)?;
    all &= otel_check_packages(check_only)?;
    all &= hta_check_packages(check_only)?;
    all &= public_kineto_traces(check_only)?;
    tracefs();
    if check_only && !all {
        println!("setup: something is missing; `cargo xtask setup` installs it");
    }
    Ok(all)
}

/// Runs the set-up and fails unless everything is present afterwards (for `test`, `demo`,
/// `device-check`).
///
/// # Errors
/// As [`run`].
pub fn ensure() -> Result<()> {
    if !run(false)? {
        bail!("set-up incomplete (see above)");
    }
    Ok(())
}

fn dpkg_installed(pkg: &str) -> Option<bool> {
    let out = output("dpkg-query", ["-W", "-f=${Status}", pkg])?;
    Some(out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with(" installed"))
}

/// Installs the packages `cargo xtask vm-test` needs when missing (the set-up for `vm-test`).
///
/// # Errors
/// As [`run`].
pub fn ensure_vm() -> Result<()> {
    ensure()?;
    if !apt(VM_APT_PACKAGES, "apt packages for vm-test", false)? {
        bail!("vm-test packages missing (see above)");
    }
    Ok(())
}

fn apt(packages: &[&str], what: &str, check_only: bool) -> Result<bool> {
    let mut missing = Vec::new();
    for pkg in packages {
        match dpkg_installed(pkg) {
            Some(true) => {}
            Some(false) => missing.push(*pkg),
            None => {
                println!(
                    "warn: no dpkg-query (not Debian-like?); make sure these are installed: {}",
                    packages.join(" ")
                );
                return Ok(true);
            }
        }
    }
    if missing.is_empty() {
        println!("ok: {what} ({})", packages.join(" "));
        return Ok(true);
    }
    let list = missing.join(" ");
    if check_only {
        println!("missing: {what} ({list})");
        return Ok(false);
    }
    if !is_root() {
        println!(
            "failed: {what} missing ({list}); installing them needs root: run `cargo xtask \
             setup` as root, or `apt-get install -y --no-install-recommends {list}`"
        );
        bail!("apt packages missing and not root");
    }
    println!("installing: {what} ({list})");
    // Keep package scripts from starting daemons (the prometheus package would start a
    // server on :9090): the usual container hook, only while we install.
    let placed_policy = !Path::new(POLICY_RC_D).exists()
        && std::fs::write(
            POLICY_RC_D,
            "#!/bin/sh\n# placed by cargo xtask setup\nexit 101\n",
        )
        .is_ok();
    if placed_policy {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(POLICY_RC_D, std::fs::Permissions::from_mode(0o755));
    }
    let result = (|| {
        run_inherit(
            Command::new("apt-get")
                .args(["update"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        run_inherit(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })();
    if placed_policy {
        let _ = std::fs::remove_file(POLICY_RC_D);
    }
    result?;
    Ok(true)
}

fn installed_toolchains() -> Option<Vec<String>> {
    let out = output("rustup", ["toolchain", "list"])?;
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(String::from))
            .collect(),
    )
}

/// Whether `rustup toolchain list` shows `name` (listed with its host triple).
fn has_toolchain(list: &[String], name: &str) -> bool {
    list.iter().any(|t| {
        t == name
            || (t.starts_with(&format!("{name}-"))
                && !t[name.len() + 1..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

fn missing_components(toolchain: &str, wanted: &[&str]) -> Vec<String> {
    let installed: Vec<String> = output(
        "rustup",
        ["component", "list", "--toolchain", toolchain, "--installed"],
    )
    .map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .collect()
    })
    .unwrap_or_default();
    wanted
        .iter()
        .filter(|c| {
            !installed
                .iter()
                .any(|i| i == *c || i.starts_with(&format!("{c}-")))
        })
        .map(|c| c.to_string())
        .collect()
}

fn toolchain(name: &str, components: &[&str], check_only: bool) -> Result<bool> {
    let what = format!("rust toolchain {name} (with {})", components.join(", "));
    let Some(list) = installed_toolchains() else {
        if check_only {
            println!("missing: {what}: rustup not found (https://rustup.rs)");
            return Ok(false);
        }
        println!(
            "failed: rustup not found; install it from https://rustup.rs, then run this again"
        );
        bail!("rustup not found");
    };
    let present = has_toolchain(&list, name);
    let missing = if present {
        missing_components(name, components)
    } else {
        components.iter().map(|c| c.to_string()).collect()
    };
    if present && missing.is_empty() {
        println!("ok: {what}");
        return Ok(true);
    }
    if check_only {
        if present {
            println!("missing: {what}: components {}", missing.join(", "));
        } else {
            println!("missing: {what}");
        }
        return Ok(false);
    }
    let mut cmd = Command::new("rustup");
    if present {
        println!("installing: {what}: components {}", missing.join(", "));
        cmd.args(["component", "add", "--toolchain", name])
            .args(&missing);
    } else {
        println!("installing: {what}");
        cmd.args(["toolchain", "install", name, "--profile", "minimal"]);
        for c in components {
            cmd.args(["--component", c]);
        }
    }
    run_inherit(&mut cmd)?;
    Ok(true)
}

fn bpf_linker_version() -> Option<String> {
    let out = output("bpf-linker", ["--version"])?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn bpf_linker(check_only: bool) -> Result<bool> {
    let what = format!("bpf-linker {BPF_LINKER_VERSION} (LLVM 22)");
    let found = bpf_linker_version();
    if found
        .as_deref()
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
    {
        println!("ok: {what}");
        return Ok(true);
    }
    let had = found.map(|v| format!(" (found {v})")).unwrap_or_default();
    if check_only {
        println!("missing: {what}{had}");
        return Ok(false);
    }
    let mut cmd = Command::new("cargo");
    cmd.env("LLVM_PREFIX", LLVM_PREFIX).args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--locked",
        "--no-default-features",
        "--features",
        "llvm-22",
    ]);
    if had.is_empty() {
        println!("installing: {what}, a few minutes: {}", describe(&cmd));
    } else {
        cmd.arg("--force");
        println!("installing: {what}{had}, a few minutes: {}", describe(&cmd));
    }
    run_inherit(&mut cmd)?;
    Ok(true)
}

/// PyPI packages for the offline checks of `deploy/` (run by `agent/tests/deploy.rs`): the
/// Kubernetes schemas (`kubernetes-validate`), models generated from the Prometheus
/// Operator's CRDs (the last release whose models install on Python 3.11), both used by
/// `deploy/kubernetes/validate.py`, BuildKit's Dockerfile parser (`dockerfile`) for the
/// container build file, and libseccomp's bindings (`pyseccomp`, over the system's
/// libseccomp.so.2) for running the agent under the systemd unit's system call filter
/// (`deploy/systemd/syscall-filter.py`).
pub const DEPLOY_CHECK_PACKAGES: &[&str] = &[
    "kubernetes-validate==1.37.0",
    "cloudcoil-models-prometheus-operator==0.80.1.0",
    "dockerfile==3.4.0",
    "pyseccomp==0.1.2",
];
/// Where they go: a virtual environment of their own, under `target/`.
pub const DEPLOY_CHECK_VENV: &str = "target/tools/deploy-venv";
/// What the venv must import to count as set up.
const DEPLOY_CHECK_IMPORTS: &str =
    "import kubernetes_validate, yaml, dockerfile, pyseccomp, cloudcoil.models.prometheus_operator.v1";

/// Python packages for checking capture files against Perfetto's own trace definitions
/// (`perfetto_trace_pb2`, generated from protos/perfetto/trace/perfetto_trace.proto).
pub const PERFETTO_CHECK_PACKAGES: &[&str] = &["perfetto==0.59.1", "protobuf==7.36.2"];
/// Their virtual environment (agent/tests/capture/view.rs looks here).
pub const PERFETTO_CHECK_VENV: &str = "target/tools/perfetto-venv";

/// The OpenTelemetry Python SDK and its OTLP/HTTP exporter: a real instrumented parent
/// process whose trace the agent's spans must join (`agent/tests/otlp.rs`).
pub const OTEL_CHECK_PACKAGES: &[&str] = &[
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
];
/// Their virtual environment (agent/tests/otlp.rs looks here).
pub const OTEL_CHECK_VENV: &str = "target/tools/otel-venv";

fn otel_check_packages(check_only: bool) -> Result<bool> {
    python_venv(
        check_only,
        "the OpenTelemetry join check",
        OTEL_CHECK_VENV,
        OTEL_CHECK_PACKAGES,
        "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter",
    )
}

/// Holistic Trace Analysis, the PyTorch profiler trace analyser: an annotated trace must
/// still load in it (`agent/tests/capture/trace_annotation.rs`).
pub const HTA_CHECK_PACKAGES: &[&str] = &["HolisticTraceAnalysis==0.5.0"];
/// Its virtual environment (agent/tests/capture/trace_annotation.rs looks here).
pub const HTA_CHECK_VENV: &str = "target/tools/hta-venv";

fn hta_check_packages(check_only: bool) -> Result<bool> {
    python_venv(
        check_only,
        "the profiler trace checks",
        HTA_CHECK_VENV,
        HTA_CHECK_PACKAGES,
        "import hta.trace_analysis",
    )
}

/// Real PyTorch profiler traces for `uvmwatch annotate`'s tests, from a registry CI can
/// reach: the source archive of PyPI `perfdigest-mcp` 1.3.0 (Apache-2.0) keeps two
/// torch.profiler exports in its tests (torch 2.12.1+cu132, RTX 4060 Laptop GPU, its
/// `host_name` redacted). Never committed here: fetched at set-up, checked by hash.
pub const PUBLIC_KINETO_SDIST: (&str, &str) = (
    "perfdigest-mcp==1.3.0",
    "85f5786040c10da963656caef982a7801591ac7de5d88e40959e166702c3c34e",
);
/// The traces in it: path inside the archive, and sha256.
pub const PUBLIC_KINETO_TRACES: &[(&str, &str)] = &[
    (
        "perfdigest_mcp-1.3.0/tests/fixtures/torch_sample.torch-trace.json",
        "30bef80a13f02093e07e6955bb63338be24d7eed468335cb336086c4e51b27f3",
    ),
    (
        "perfdigest_mcp-1.3.0/tests/fixtures/torch_compiled_train_sample.torch-trace.json",
        "3c2015da0208b6820d0eb90fb50956027bebdaa79c849ef1dc1a2f12516979bd",
    ),
];
/// Where they go (agent/tests/capture/trace_annotation.rs looks here).
pub const PUBLIC_KINETO_DIR: &str = "target/tools/kineto-traces";

fn sha256_of(path: &std::path::Path) -> Option<String> {
    let out = Command::new("sha256sum").arg(path).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().next().map(str::to_string)
}

fn public_kineto_traces(check_only: bool) -> Result<bool> {
    let what = format!(
        "public PyTorch profiler traces (from PyPI {}) in {PUBLIC_KINETO_DIR}",
        PUBLIC_KINETO_SDIST.0
    );
    let dir = crate::util::workspace_root().join(PUBLIC_KINETO_DIR);
    let file = |inner: &str| dir.join(inner.rsplit('/').next().unwrap_or(inner));
    let present = PUBLIC_KINETO_TRACES
        .iter()
        .all(|(inner, sum)| sha256_of(&file(inner)).as_deref() == Some(*sum));
    if present {
        println!("ok: {what}");
        return Ok(true);
    }
    if check_only {
        println!("missing: {what}");
        return Ok(false);
    }
    println!("installing: {what}");
    let tmp = dir.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    run_inherit(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
            ])
            .arg(&tmp)
            .arg(PUBLIC_KINETO_SDIST.0),
    )?;
    let sdist = tmp.join("perfdigest_mcp-1.3.0.tar.gz");
    if sha256_of(&sdist).as_deref() != Some(PUBLIC_KINETO_SDIST.1) {
        bail!("{} does not have the expected sha256", sdist.display());
    }
    let mut tar = Command::new("tar");
    tar.arg("xzf").arg(&sdist).arg("-C").arg(&tmp);
    for (inner, _) in PUBLIC_KINETO_TRACES {
        tar.arg(inner);
    }
    run_inherit(&mut tar)?;
    for (inner, sum) in PUBLIC_KINETO_TRACES {
        let got = tmp.join(inner);
        if sha256_of(&got).as_deref() != Some(*sum) {
            bail!("{} does not have the expected sha256", got.display());
        }
        std::fs::rename(&got, file(inner))?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(true)
}

fn deploy_check_packages(check_only: bool) -> Result<bool> {
    python_venv(
        check_only,
        "the deploy/ checks",
        DEPLOY_CHECK_VENV,
        DEPLOY_CHECK_PACKAGES,
        DEPLOY_CHECK_IMPORTS,
    )
}

fn perfetto_check_packages(check_only: bool) -> Result<bool> {
    python_venv(
        check_only,
        "the capture checks",
        PERFETTO_CHECK_VENV,
        PERFETTO_CHECK_PACKAGES,
        "from perfetto.protos.perfetto.trace import perfetto_trace_pb2",
    )
}

/// Makes sure the virtual environment `venv` (relative to the workspace) exists and imports
/// `imports`, installing `packages` with pip when not. Returns whether it is present.
fn python_venv(
    check_only: bool,
    purpose: &str,
    venv: &str,
    packages: &[&str],
    imports: &str,
) -> Result<bool> {
    let what = format!(
        "python packages for {purpose} ({}) in {venv}",
        packages.join(" ")
    );
    let dir = crate::util::workspace_root().join(venv);
    let python = dir.join("bin/python3");
    let present = python.is_file()
        && Command::new(&python)
            .args(["-c", imports])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if present {
        println!("ok: {what}");
        return Ok(true);
    }
    if check_only {
        println!("missing: {what}");
        return Ok(false);
    }
    println!("installing: {what}");
    if !python.is_file() {
        run_inherit(Command::new("python3").arg("-m").arg("venv").arg(&dir))?;
    }
    run_inherit(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
    )?;
    Ok(true)
}

fn tracefs() {
    match std::fs::metadata("/sys/kernel/tracing/events") {
        Ok(m) if m.is_dir() => println!("ok: tracefs mounted (/sys/kernel/tracing)"),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => println!(
            "note: tracefs: cannot look at /sys/kernel/tracing as this user (the agent runs as \
             root and mounts it itself when needed)"
        ),
        _ => println!(
            "note: tracefs is not mounted at /sys/kernel/tracing; the agent mounts it itself \
             when it starts as root"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchain_names_match() {
        let list: Vec<String> = [
            "stable-x86_64-unknown-linux-gnu",
            "nightly-x86_64-unknown-linux-gnu",
            "nightly-2026-05-20-x86_64-unknown-linux-gnu",
            "1.95.0-x86_64-unknown-linux-gnu",
        ]
        .map(String::from)
        .into();
        assert!(has_toolchain(&list, "1.95.0"));
        assert!(has_toolchain(&list, "nightly-2026-05-20"));
        assert!(!has_toolchain(&list, "1.95"));
        assert!(!has_toolchain(&list, "nightly-2026-05-21"));
        // `nightly-…-x86_64…` must not count as plain `nightly` of another date and back.
        let only_nightly: Vec<String> = vec!["nightly-x86_64-unknown-linux-gnu".into()];
        assert!(!has_toolchain(&only_nightly, "nightly-2026-05-20"));
        let only_dated: Vec<String> = vec!["nightly-2026-05-20-x86_64-unknown-linux-gnu".into()];
        assert!(!has_toolchain(&only_dated, "nightly"));
    }

    #[test]
    fn versions_match_the_pins() {
        let root = crate::util::workspace_root();
        let toolchain_toml = std::fs::read_to_string(root.join("rust-toolchain.toml")).unwrap();
        assert!(
            toolchain_toml.contains(&format!("channel = \"{STABLE}\"")),
            "rust-toolchain.toml and xtask disagree on the stable toolchain"
        );
        for c in STABLE_COMPONENTS {
            assert!(toolchain_toml.contains(&format!("\"{c}\"")));
        }
        let build_rs = std::fs::read_to_string(root.join("agent/build.rs")).unwrap();
        assert!(
            build_rs.contains(&format!("\"{NIGHTLY}\"")),
            "agent/build.rs and xtask disagree on the eBPF nightly"
        );
    }
}

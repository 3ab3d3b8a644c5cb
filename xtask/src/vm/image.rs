//! What boots: the test modules built against the kernel's headers, the user-space
//! programs with their libraries, and the initramfs that holds them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::*;

/// Builds the test modules against `kbuild`; returns the directory holding the `.ko`s.
pub(super) fn build_module(paths: &Paths, kdir: &Path, kbuild: &Path) -> Result<PathBuf> {
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

pub(super) struct Userspace {
    /// (path inside the initramfs, file on the host)
    pub(super) files: Vec<(String, PathBuf)>,
    /// The overhead benchmark and the release agent it measures (the stub series only).
    pub(super) bench: Vec<(String, PathBuf)>,
    busybox: PathBuf,
}

pub(super) fn cc(args: &[&std::ffi::OsStr]) -> Result<()> {
    let compiler = std::env::var_os("CC")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cc".into());
    util::run_inherit(
        Command::new(&compiler)
            .args(["-O2", "-g", "-Wall", "-Wextra", "-fno-omit-frame-pointer"])
            .args(args),
    )
}

pub(super) fn build_userspace(
    paths: &Paths,
    agent: &Path,
    bench: Option<&crate::bench::Bench>,
) -> Result<Userspace> {
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
    let mut bins = vec![
        stripped.clone(),
        workload.clone(),
        hmm.clone(),
        libcuda.clone(),
    ];
    let mut bench_files = Vec::new();
    if let Some(b) = bench {
        // The benchmark, and the release agent it measures (a debug agent's own CPU would
        // take from the loops: TCG runs every vCPU on one host thread).
        for (name, from) in [
            ("uvmwatch-overhead", &b.bench),
            ("uvmwatch-release", &b.agent),
        ] {
            let stripped = us.join(name);
            util::run_inherit(Command::new("strip").arg("-o").arg(&stripped).arg(from))?;
            bench_files.push((format!("usr/bin/{name}"), stripped.clone()));
            bins.push(stripped);
        }
    }
    // dlopen'ed by nothing else; libdl/libpthread are part of libc on Debian 12.
    files.extend(libraries(&bins)?);
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("no busybox (apt-get install busybox-static)")?;
    Ok(Userspace {
        files,
        bench: bench_files,
        busybox,
    })
}

/// The shared libraries and loader `ldd` names for `bins`, as (path inside, host file).
pub(super) fn libraries(bins: &[PathBuf]) -> Result<Vec<(String, PathBuf)>> {
    let mut libs = BTreeSet::new();
    for bin in bins {
        let o = Command::new("ldd").arg(bin).output().context("run ldd")?;
        libs.extend(ldd_paths(&String::from_utf8_lossy(&o.stdout)));
    }
    Ok(libs
        .into_iter()
        .map(|l| (l.to_string_lossy().trim_start_matches('/').to_string(), l))
        .collect())
}

/// What one series' initramfs holds besides the common base (busybox, `/init`, `lib.sh`,
/// the agent and the test programs).
pub(super) struct Image {
    /// Where the tree and `ir.cpio.gz` go.
    pub(super) dir: PathBuf,
    /// The test script of `vmtest/init/` that `/init` sources (`tests.sh`, `nvidia.sh`).
    pub(super) script: &'static str,
    /// Put the overhead benchmark in.
    pub(super) bench: bool,
    /// (path inside, host file, mode)
    pub(super) files: Vec<(String, PathBuf, u32)>,
    /// (path inside, link target)
    pub(super) links: Vec<(String, String)>,
    /// Lines added to `/etc/passwd` and `/etc/group`.
    pub(super) passwd: Vec<String>,
    pub(super) group: Vec<String>,
}

pub(super) fn build_initramfs(
    paths: &Paths,
    kdir: &Path,
    release: &str,
    us: &Userspace,
    img: &Image,
    keep: bool,
) -> Result<PathBuf> {
    let tree = img.dir.join("initramfs");
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
    put(
        &format!("vmtest/{}", img.script),
        &init.join(img.script),
        0o644,
    )?;
    for (inside, from) in &us.files {
        put(inside, from, 0o755)?;
    }
    if img.bench {
        for (inside, from) in &us.bench {
            put(inside, from, 0o755)?;
        }
    }
    for (inside, from, mode) in &img.files {
        put(inside, from, *mode)?;
    }
    for (inside, target) in &img.links {
        let dst = tree.join(inside);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        let _ = fs::remove_file(&dst);
        std::os::unix::fs::symlink(target, &dst)?;
    }
    // The kernel's config where a Debian host has it (the agent's doctor reads it).
    let config = kdir.join("config");
    if config.is_file() {
        put(&format!("boot/config-{release}"), &config, 0o644)?;
    }
    let lines = |first: &str, more: &[String]| -> String {
        std::iter::once(first.to_string())
            .chain(more.iter().cloned())
            .map(|l| l + "\n")
            .collect()
    };
    fs::write(
        tree.join("etc/passwd"),
        lines("root:x:0:0:root:/root:/bin/sh", &img.passwd),
    )?;
    fs::write(tree.join("etc/group"), lines("root:x:0:", &img.group))?;

    let out = img.dir.join("ir.cpio.gz");
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

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
    files: Vec<(String, PathBuf)>,
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
    if let Some(b) = bench {
        // The benchmark, and the release agent it measures (a debug agent's own CPU would
        // take from the loops: TCG runs every vCPU on one host thread).
        for (name, from) in [
            ("uvmwatch-overhead", &b.bench),
            ("uvmwatch-release", &b.agent),
        ] {
            let stripped = us.join(name);
            util::run_inherit(Command::new("strip").arg("-o").arg(&stripped).arg(from))?;
            files.push((format!("usr/bin/{name}"), stripped.clone()));
            bins.push(stripped);
        }
    }
    let mut libs = BTreeSet::new();
    for bin in &bins {
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

pub(super) fn build_initramfs(
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

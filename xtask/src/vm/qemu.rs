//! Booting the initramfs under qemu (KVM when usable, else TCG) within a wall-clock limit,
//! with the serial console streamed and its `VMTEST` lines collected.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::*;

/// `kvm` when /dev/kvm can be used (the CPU has vmx or svm), else single-threaded TCG.
///
/// Multi-threaded TCG (one host thread per vCPU) crashed a 6.12 guest with an `int3` oops in
/// `syscall_exit_to_user_mode_prepare` while the agent enabled its tracepoints: the kernel
/// patches its own text with `text_poke_bp` (int3, sync, write, sync), and a second vCPU
/// kept running stale code. `thread=single` runs both vCPUs in one host thread, which keeps
/// cross-modified code coherent and uses one host core instead of two.
pub(super) fn accelerator() -> &'static str {
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

/// Boots `vmlinuz` with `initrd` (`mem_mb` of memory) and the kernel arguments `extra`
/// besides the console, `--only` and `--append` ones; collects the results into `run`.
pub(super) fn boot_vm(
    args: &VmTestArgs,
    accel: &str,
    vmlinuz: &Path,
    initrd: &Path,
    mem_mb: u32,
    extra: &str,
    run: &mut KernelRun,
) -> Result<()> {
    let mut append = String::from("console=ttyS0 quiet panic=-1");
    if !extra.is_empty() {
        append.push(' ');
        append.push_str(extra);
    }
    if let Some(only) = &args.only {
        append.push_str(&format!(" vmtest.only={}", only.replace(' ', "")));
    }
    if let Some(extra) = &args.append {
        append.push(' ');
        append.push_str(extra);
    }
    let mem = mem_mb.to_string();
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        accel,
        "-m",
        &mem,
        "-smp",
        "2",
        "-nographic",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", &append])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    println!("vm-test: {}: {}", run.name(), util::describe(&cmd));
    if run.artifacts {
        nvidia::clear_artifacts(&run.dir);
    }
    boot(&mut cmd, args, run)
}

enum Msg {
    Line(String),
    Stderr(String),
    Eof,
}

pub(super) fn boot(cmd: &mut Command, args: &VmTestArgs, run: &mut KernelRun) -> Result<()> {
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
    let mut artifacts = nvidia::Artifacts::default();
    loop {
        let now = Instant::now();
        if now >= deadline {
            run.timed_out = true;
            let _ = child.kill();
            writeln!(log, "vm-test: killed after {}s (--timeout)", args.timeout)?;
            println!("vm-test: {}: VM killed after {}s", run.name(), args.timeout);
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
                        run.name(),
                        secs(t0.elapsed())
                    );
                } else if l.contains("VMTEST-END") {
                    run.finished = true;
                    run.tests = begin.map(|b| b.elapsed());
                } else if run.artifacts && artifacts.take(&l) {
                    if args.verbose {
                        println!("  | {l}");
                    }
                } else if let Some(r) = parse_result(&l) {
                    println!("  {} {:<24} {}", r.status, r.name, r.detail);
                    run.results.push(r);
                } else if let Some(o) = ["overhead ", "lifecycle "]
                    .iter()
                    .find_map(|w| l.find(w).map(|i| &l[i..]))
                {
                    // The benchmark's lines per kernel and backend, for the summary.
                    if o.contains(": ") {
                        println!("  {o}");
                        run.overhead.push(o.to_string());
                    }
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
    if run.artifacts {
        run.artifact_files = artifacts.write(&run.dir)?;
        if !run.artifact_files.is_empty() {
            println!(
                "vm-test: {}: saved {} in {}",
                run.name(),
                run.artifact_files.join(", "),
                run.dir.display()
            );
        }
    }
    writeln!(log, "vm-test: qemu exited: {status}")?;
    if !run.finished && !run.timed_out {
        println!(
            "vm-test: {}: VM stopped before VMTEST-END ({status}); see {}",
            run.name(),
            run.console.display()
        );
    }
    Ok(())
}

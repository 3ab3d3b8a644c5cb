//! The soak and fault harness: one agent through process churn, an event flood with
//! concurrent stalls, fd copies past any map's size, and a `kill -9` with a restart, with
//! the figures printed (`soak: ...` lines: stall delay under the flood, records decoded per
//! second, drops, RSS, CPU) and bounds asserted. Root only; single-threaded.
//!
//! `UVMWATCH_SOAK_SECONDS` (default 20, the part CI runs) sizes the churn and the flood;
//! `cargo xtask soak [--seconds N]` runs this file on a release build for longer.

mod common;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use common::{artifacts, metric, Agent};
use uvmwatch_testbed::{FakeDev, FakeDevConfig, IoctlAction, IoctlRule, Scenario, Workload};

const T: Duration = Duration::from_secs(60);

fn seconds() -> u64 {
    std::env::var("UVMWATCH_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .max(10)
}

/// A workload through the shared library `lib` (one file: the agent attaches to it once).
fn spawn(dev: &FakeDev, scenario: Scenario, lib: &str, args: &[&str]) -> Workload {
    let mut all = vec!["--lib", lib];
    all.extend_from_slice(args);
    common::spawn_workload(dev, scenario, 0, &all)
}

/// Resident memory (`VmRSS`, `VmHWM`, KiB) and CPU time (s) of `pid`.
fn usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the comm.
    (kib("VmRSS:"), kib("VmHWM:"), (ticks(11) + ticks(12)) / hz)
}

fn counter(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(m, name, labels).unwrap_or(0.0)
}

/// BPF programs loaded on this host named `name` (`BPF_PROG_GET_NEXT_ID`,
/// `BPF_PROG_GET_FD_BY_ID`, `BPF_OBJ_GET_INFO_BY_FD`; `struct bpf_prog_info` keeps the name
/// at byte 64, `include/uapi/linux/bpf.h`).
fn programs_named(name: &str) -> usize {
    const GET_NEXT_ID: libc::c_long = 11;
    const GET_FD_BY_ID: libc::c_long = 13;
    const GET_INFO_BY_FD: libc::c_long = 15;
    let bpf = |cmd: libc::c_long, attr: &mut [u8; 64]| unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32)
    };
    let mut n = 0;
    let mut id: u32 = 0;
    loop {
        let mut attr = [0u8; 64];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        if bpf(GET_NEXT_ID, &mut attr) != 0 {
            return n;
        }
        id = u32::from_ne_bytes(attr[4..8].try_into().unwrap());
        let mut attr = [0u8; 64];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        let fd = bpf(GET_FD_BY_ID, &mut attr);
        if fd < 0 {
            continue;
        }
        let mut info = [0u8; 256];
        let mut attr = [0u8; 64];
        attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        if bpf(GET_INFO_BY_FD, &mut attr) == 0 {
            let raw = &info[64..80];
            let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
            if &raw[..end] == name.as_bytes() {
                n += 1;
            }
        }
        unsafe { libc::close(fd as i32) };
    }
}

#[test]
fn soak_churn_flood_stalls_map_exhaustion_and_a_kill() {
    require_env!("soak_churn_flood_stalls_map_exhaustion_and_a_kill");
    let secs = seconds();
    let lib_dir = tempfile::tempdir().unwrap();
    let lib: PathBuf = lib_dir.path().join("libcuda.so.1");
    std::fs::copy(&artifacts().libcuda, &lib).unwrap();
    let lib_s = lib.to_str().unwrap().to_string();
    let agent = Agent::start(&[
        "--ioctl-stall",
        "1s",
        "--cuinit-stall",
        "2s",
        "--libcuda",
        &lib_s,
    ]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let (rss0, _, cpu0) = usage(agent.pid());

    // 1. Process churn: short CUDA processes, 8 at a time, for a third of the time.
    let churn_until = Instant::now() + Duration::from_secs(secs / 3);
    let mut started = 0u64;
    let mut succeeded = 0u64;
    let churn_start = Instant::now();
    while Instant::now() < churn_until {
        let mut batch: Vec<Workload> = (0..8)
            .map(|_| spawn(&dev, Scenario::Success, &lib_s, &[]))
            .collect();
        started += batch.len() as u64;
        for w in &mut batch {
            let out = w.wait_timeout(T).expect("workload exits");
            succeeded += out.cuinit_lines().iter().filter(|l| l.rc == 0).count() as u64;
        }
    }
    let churn_s = churn_start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let m = agent.metrics();
    let counted = counter(
        &m,
        "uvmwatch_cuinit_calls_total",
        &[("result", "CUDA_SUCCESS")],
    );
    let (rss1, _, cpu1) = usage(agent.pid());
    eprintln!(
        "soak: churn: {started} processes in {churn_s:.1} s ({:.0}/s), {succeeded} cuInit \
         succeeded, {counted} counted; agent RSS {} -> {} KiB, CPU {:.2} s",
        started as f64 / churn_s,
        rss0,
        rss1,
        cpu1 - cpu0
    );
    assert_eq!(
        counted, succeeded as f64,
        "every cuInit of the churn counted"
    );

    // 2. A flood of failed ioctls while three processes hang in UVM_REGISTER_GPU.
    let hang_dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let flood_ms = (secs * 1000 / 3).to_string();
    let received0 = counter(&agent.metrics(), "uvmwatch_events_received_total", &[]);
    let flood_start = Instant::now();
    let mut flood = spawn(&dev, Scenario::Success, &lib_s, &["--flood-ms", &flood_ms]);
    let flood_pid = flood.pid();
    std::thread::sleep(Duration::from_millis(500));
    let hangs: Vec<Workload> = (0..3)
        .map(|_| spawn(&hang_dev, Scenario::HangRegisterGpu, &lib_s, &[]))
        .collect();
    let hang_pids: Vec<u32> = hangs.iter().map(Workload::pid).collect();
    let mut unready = Vec::new();
    let mut delays = Vec::new();
    let deadline = Instant::now() + T;
    while delays.len() < hang_pids.len() {
        let (code, body) = agent.get("/readyz");
        if code != 200 {
            unready.push(body.trim().to_string());
        }
        delays = hang_pids
            .iter()
            .filter_map(|pid| {
                agent
                    .wait_event(
                        |v| {
                            v["event"] == "stall"
                                && v["call"] == "UVM_REGISTER_GPU"
                                && v["pid"].as_u64() == Some(*pid as u64)
                        },
                        Duration::ZERO,
                    )
                    .and_then(|v| v["detect_delay_ms"].as_f64())
            })
            .collect();
        assert!(Instant::now() < deadline, "stalls missing under the flood");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = flood.wait_timeout(T).expect("flood ends");
    let flood_s = flood_start.elapsed().as_secs_f64();
    let calls: f64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("flood="))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no flood line: {}", out.stdout));
    let m = agent.metrics();
    let counted = counter(
        &m,
        "uvmwatch_driver_ioctl_calls_total",
        &[
            ("node", "nvidia-uvm"),
            ("ioctl", "unknown"),
            ("result", "EBADF"),
        ],
    );
    let received = counter(&m, "uvmwatch_events_received_total", &[]) - received0;
    let dropped = counter(&m, "uvmwatch_events_dropped_total", &[]);
    let throttled = counter(&m, "uvmwatch_events_throttled_total", &[]);
    let lines = agent.count(|v| v["pid"].as_u64() == Some(flood_pid as u64));
    let worst = delays.iter().cloned().fold(0.0, f64::max);
    let (rss2, hwm2, cpu2) = usage(agent.pid());
    eprintln!(
        "soak: flood: {calls} failed ioctls in {flood_s:.1} s ({:.0}/s), {counted} counted; \
         {received} records decoded ({:.0}/s), {throttled} throttled in the kernel, {dropped} \
         dropped; {lines} log records of the flooding process; 3 concurrent stalls reported \
         {delays:?} ms after their threshold; /readyz not ready {} times; agent RSS {rss2} KiB \
         (peak {hwm2}), CPU {:.2} s over the flood ({:.0}% of one core)",
        calls / flood_s,
        received / flood_s,
        unready.len(),
        cpu2 - cpu1,
        100.0 * (cpu2 - cpu1) / flood_s
    );
    assert_eq!(counted, calls, "every failed call counted");
    assert!(
        worst <= 250.0,
        "a stall reported {worst} ms late under the flood"
    );
    assert!(unready.is_empty(), "/readyz under the flood: {unready:?}");
    assert_eq!(dropped, 0.0, "records dropped under the flood");
    assert!(lines < 1000, "{lines} log records for one flooding process");
    drop(hangs);
    hang_dev.release().unwrap();

    // 3. Fd copies past any map's size: four processes hold 30000 copies of a
    //    /dev/nvidia-uvm fd each (more than any kernel map holds) and call FICLONE on the
    //    last one; each call is identified by its file, nothing fills, the agent's memory
    //    stays flat, the processes leave the kernel's process map at exit, and a new
    //    process is seen after them.
    let ebadf = |m: &str| {
        counter(
            m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("node", "nvidia-uvm"),
                ("ioctl", "unknown"),
                ("result", "EBADF"),
            ],
        )
    };
    let procs_before = counter(&agent.metrics(), "uvmwatch_tracked_processes", &[]);
    let ebadf_before = ebadf(&agent.metrics());
    let (rss_h0, _, _) = usage(agent.pid());
    let mut holders: Vec<Workload> = (0..4)
        .map(|_| {
            spawn(
                &dev,
                Scenario::Success,
                &lib_s,
                &["--dup-fds", "30000", "--hold-ms", "2000"],
            )
        })
        .collect();
    let mut held = 0u64;
    for w in &mut holders {
        let out = w.wait_timeout(T).expect("fd holder exits");
        held += out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("dup_fds="))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no dup_fds line: {}", out.stdout));
    }
    std::thread::sleep(Duration::from_millis(300));
    let m = agent.metrics();
    let seen = ebadf(&m) - ebadf_before;
    let full: f64 = uvmwatch_common::counter::MAP_FULL
        .iter()
        .map(|(_, map)| counter(&m, "uvmwatch_kernel_map_full_total", &[("map", map)]))
        .sum();
    let (rss_h1, _, _) = usage(agent.pid());
    // Each holder leaves the process map at its exit.
    let drained = Instant::now();
    let mut procs;
    loop {
        procs = counter(&agent.metrics(), "uvmwatch_tracked_processes", &[]);
        if procs <= procs_before || drained.elapsed() > Duration::from_secs(25) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let opens_before = counter(
        &agent.metrics(),
        "uvmwatch_device_opens_total",
        &[("node", "nvidia-uvm"), ("result", "success")],
    );
    let mut w = spawn(&dev, Scenario::Success, &lib_s, &[]);
    w.wait_timeout(T).expect("exits");
    std::thread::sleep(Duration::from_millis(300));
    let opens_after = counter(
        &agent.metrics(),
        "uvmwatch_device_opens_total",
        &[("node", "nvidia-uvm"), ("result", "success")],
    );
    eprintln!(
        "soak: fd copies: {held} held at once, {seen} calls on the last copies seen, {full} \
         map entries refused; agent RSS {rss_h0} -> {rss_h1} KiB; {procs} processes tracked \
         {:.1} s after the holders exited ({procs_before} before); a new process's opens \
         counted: {}",
        drained.elapsed().as_secs_f64(),
        opens_after - opens_before
    );
    assert!(held > 70_000, "only {held} fds held");
    assert_eq!(seen, 4.0, "calls on the last of the held copies seen");
    assert_eq!(full, 0.0, "a kernel map filled");
    assert!(
        rss_h1 < rss_h0 + 16 * 1024,
        "agent RSS grew from {rss_h0} to {rss_h1} KiB while fds were held"
    );
    assert!(
        procs <= procs_before,
        "the holders stayed in the process map: {procs} (before {procs_before})"
    );
    assert!(
        opens_after > opens_before,
        "a new process after the holders not seen"
    );

    // 4. kill -9 while a call hangs; the programs go with the process; a new agent finds
    //    the hung call from /proc and reports it.
    let (rss3, hwm3, cpu3) = usage(agent.pid());
    let before = programs_named("ioctl_enter");
    assert!(
        before >= 1,
        "no ioctl_enter program loaded while the agent runs"
    );
    let hang_dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let hang = spawn(&hang_dev, Scenario::HangRegisterGpu, &lib_s, &[]);
    agent
        .wait_event(
            |v| v["event"] == "stall" && v["pid"].as_u64() == Some(hang.pid() as u64),
            T,
        )
        .expect("stall before the kill");
    agent.kill_hard();
    // The programs go when the last file holding them is released. A uretprobe pending in
    // the hung cuInit can hold that release up (the kernel waits for the probed function to
    // return, or for its own timeout): measured, and released at the latest with the hang.
    let gone = |within: Duration| {
        let start = Instant::now();
        while start.elapsed() < within {
            if programs_named("ioctl_enter") < before {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    };
    let while_hung = gone(Duration::from_secs(5));
    let restarted = Instant::now();
    let agent = Agent::start(&["--ioctl-stall", "1s", "--libcuda", &lib_s]);
    let up = restarted.elapsed();
    let seen = agent.wait_event(
        |v| {
            v["event"] == "stall"
                && v["call"] == "UVM_REGISTER_GPU"
                && v["pid"].as_u64() == Some(hang.pid() as u64)
        },
        T,
    );
    // The hang ends: whatever the killed agent left must go now (only the new agent's
    // programs stay).
    let released = Instant::now();
    drop(hang);
    hang_dev.release().unwrap();
    let mut after_release = while_hung.map(|_| Duration::ZERO);
    while after_release.is_none() && released.elapsed() < Duration::from_secs(10) {
        if programs_named("ioctl_enter") <= before {
            after_release = Some(released.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs_of = |d: Option<Duration>| {
        d.map(|d| format!("{:.2} s", d.as_secs_f64()))
            .unwrap_or_else(|| "not".into())
    };
    eprintln!(
        "soak: kill -9: the killed agent's programs gone {} while a call hung in cuInit, {} \
         after it ended; the new agent started in {:.2} s and reported the call hung \
         since before it: {}; agent RSS before the kill {rss3} KiB (peak {hwm3}), CPU {:.2} s in all",
        secs_of(while_hung),
        secs_of(after_release),
        up.as_secs_f64(),
        seen.is_some(),
        cpu3 - cpu0
    );
    assert!(
        seen.is_some(),
        "the restarted agent did not report the hung call"
    );
    assert!(
        after_release.is_some(),
        "the killed agent's programs still loaded 10 s after the hang ended"
    );
    assert!(hwm3 < 128 * 1024, "agent peak RSS {hwm3} KiB");
    assert!(
        rss1 < rss0 + 16 * 1024,
        "RSS grew {} KiB over the churn",
        rss1 - rss0
    );
    assert!(agent.stop());
}

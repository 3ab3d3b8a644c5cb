//! End-to-end tests: the real agent binary with its real eBPF programs, driven by workloads
//! that call the test `libcuda.so.1` against FUSE-backed `/dev/nvidia*` nodes in a private
//! mount namespace. Root only; run single-threaded (`cargo xtask test` does).
//!
//! One file because every test here shares one set-up (a FUSE device, a private namespace and a
//! running agent) and checks one thing: what the agent says about a cuInit it watched.

mod common;

use std::time::{Duration, Instant};

use common::{artifacts, host_lib, metric, Agent};
use serde_json::Value;
use uvmwatch_testbed::{
    FakeDev, FakeDevConfig, IoctlAction, IoctlRule, LibLocation, OpenDenial, Scenario, Workload,
    WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);

fn workload(dev: &FakeDev, scenario: Scenario, lib: LibLocation) -> Workload {
    Workload::spawn(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            gpus: 1,
            wait_ms: 0,
            lib_location: lib,
            fork_child: false,
            extra_env: vec![],
        },
    )
    .expect("spawn workload")
}

fn pid_is(v: &Value, pid: u32) -> bool {
    v["pid"].as_u64() == Some(pid as u64)
}

/// The cuInit sequence of the test library, as the driver would see it (driver 535.104.05 on an
/// H100: `testbed/replays/535.104.05-h100-cumemory.replay`, from the capture linked in
/// google/gvisor#9921).
const UVM_SEQUENCE: &[&str] = &[
    "UVM_INITIALIZE",
    "UVM_MM_INITIALIZE",
    "UVM_PAGEABLE_MEM_ACCESS",
    "UVM_REGISTER_GPU",
    "UVM_CREATE_RANGE_GROUP",
];

#[test]
fn success_sequence_is_seen_with_every_ioctl_named_and_timed() {
    require_env!("success_sequence_is_seen_with_every_ioctl_named_and_timed");
    // The host's installed library, probed from the agent's start: the call is seen whole.
    let lib = host_lib();
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(&dev, Scenario::Success, lib.location());
    let line = w.next_cuinit_line(T).unwrap();
    assert_eq!(line.rc, 0);
    let pid = w.pid();
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    assert_eq!(end["result"], "CUDA_SUCCESS");
    assert!(end["duration_seconds"].as_f64().unwrap() > 0.0);
    // Every driver call inside cuInit was seen and named, on the right node, with a time.
    let inside: Vec<Value> = agent
        .events("driver_ioctl")
        .into_iter()
        .filter(|v| pid_is(v, pid))
        .collect();
    for name in UVM_SEQUENCE {
        let e = inside
            .iter()
            .find(|v| v["ioctl"] == *name)
            .unwrap_or_else(|| panic!("{name} not reported; log:\n{}", agent.raw_log()));
        assert_eq!(e["node"], "/dev/nvidia-uvm");
        assert_eq!(e["result"], "NV_OK");
        assert!(e["duration_seconds"].as_f64().is_some());
    }
    for name in [
        "NV_ESC_SYS_PARAMS",
        "NV_ESC_CARD_INFO",
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_CONTROL",
        "NV_ESC_RM_FREE",
    ] {
        assert!(
            inside
                .iter()
                .any(|v| v["ioctl"] == name && v["node"] == "/dev/nvidiactl"),
            "{name} on nvidiactl not reported"
        );
    }
    assert_eq!(
        end["driver_calls"].as_u64().unwrap() as usize,
        inside.len(),
        "summary count matches the calls seen"
    );
    let m = agent.metrics();
    for name in UVM_SEQUENCE {
        let n = metric(
            &m,
            "uvmwatch_driver_ioctl_calls_total",
            &[("node", "nvidia-uvm"), ("ioctl", name), ("result", "NV_OK")],
        );
        assert!(n.unwrap_or(0.0) >= 1.0, "{name} not counted:\n{m}");
        let c = metric(
            &m,
            "uvmwatch_driver_ioctl_duration_seconds_count",
            &[("node", "nvidia-uvm"), ("ioctl", name)],
        );
        assert!(c.unwrap_or(0.0) >= 1.0, "{name} not timed:\n{m}");
    }
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuinit_calls_total",
            &[("result", "CUDA_SUCCESS")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "uvmwatch_cuinit_duration_seconds_count", &[]),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "uvmwatch_device_opens_total",
            &[("node", "nvidia-uvm"), ("result", "success")]
        ),
        Some(2.0)
    );
    assert_eq!(metric(&m, "uvmwatch_cuinit_in_flight", &[]), Some(0.0));
    assert!(agent.stop());
}

#[test]
fn error_3_is_counted_and_the_failing_rmstatus_decoded() {
    require_env!("error_3_is_counted_and_the_failing_rmstatus_decoded");
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(
        &dev,
        Scenario::RegisterGpuNoMemory,
        LibLocation::PrivateNamespace,
    );
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
    let pid = w.pid();
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    assert_eq!(end["result"], "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(end["code"], 3);
    assert_eq!(end["failed_call"], "UVM_REGISTER_GPU on /dev/nvidia-uvm");
    assert_eq!(end["failed_result"], "NV_ERR_NO_MEMORY");
    let failed = agent.expect_event(
        "failed driver_ioctl",
        |v| v["event"] == "driver_ioctl" && v["level"] == "WARN" && pid_is(v, pid),
        T,
    );
    assert_eq!(failed["ioctl"], "UVM_REGISTER_GPU");
    assert_eq!(failed["result"], "NV_ERR_NO_MEMORY");
    let m = agent.metrics();
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuinit_calls_total",
            &[("result", "CUDA_ERROR_NOT_INITIALIZED")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("node", "nvidia-uvm"),
                ("ioctl", "UVM_REGISTER_GPU"),
                ("result", "NV_ERR_NO_MEMORY")
            ]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(agent.stop());
}

#[test]
fn a_hang_in_register_gpu_is_reported_within_threshold_and_cleared_when_it_ends() {
    require_env!("a_hang_in_register_gpu_is_reported_within_threshold_and_cleared_when_it_ends");
    // The host's installed library: the hang's cuInit is seen whole, to its return.
    let lib = host_lib();
    let agent = Agent::start(&["--ioctl-stall", "1s", "--cuinit-stall", "2s"]);
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    let mut w = workload(&dev, Scenario::HangRegisterGpu, lib.location());
    let pid = w.pid();

    let io = agent.expect_event(
        "ioctl stall",
        |v| v["event"] == "stall" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    let delay = io["detect_delay_ms"].as_f64().unwrap();
    eprintln!("measured: ioctl stall reported {delay:.1} ms after crossing the threshold");
    assert!(
        delay < 250.0,
        "ioctl stall reported {delay} ms after the threshold"
    );
    assert_eq!(io["node"], "/dev/nvidia-uvm");
    assert_eq!(io["wchan"], "request_wait_answer", "{io}");
    assert!(
        io["thread_state"].as_str().unwrap().starts_with('S'),
        "{io}"
    );
    assert!(io["age_seconds"].as_f64().unwrap() >= 1.0);
    assert_eq!(io["comm"], "cuda-workload");

    let cu = agent.expect_event(
        "cuInit stall",
        |v| v["event"] == "stall" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    let delay = cu["detect_delay_ms"].as_f64().unwrap();
    eprintln!("measured: cuInit stall reported {delay:.1} ms after crossing the threshold");
    assert!(
        delay < 250.0,
        "cuInit stall reported {delay} ms after the threshold"
    );
    assert_eq!(cu["inside"], "UVM_REGISTER_GPU on /dev/nvidia-uvm");
    assert!(cu["inside_age_seconds"].as_f64().unwrap() >= 1.0);

    let m = agent.metrics();
    assert_eq!(
        metric(&m, "uvmwatch_stalled_calls", &[("call", "cuInit")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "uvmwatch_stalled_calls",
            &[("call", "UVM_REGISTER_GPU")]
        ),
        Some(1.0)
    );
    assert_eq!(metric(&m, "uvmwatch_cuinit_in_flight", &[]), Some(1.0));
    assert_eq!(
        metric(&m, "uvmwatch_stalls_total", &[("call", "cuInit")]),
        Some(1.0)
    );

    dev.release().unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let e1 = agent.expect_event(
        "cuInit stall end",
        |v| v["event"] == "stall_end" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    assert_eq!(e1["outcome"], "returned");
    assert_eq!(e1["result"], "CUDA_SUCCESS");
    assert!(e1["duration_seconds"].as_f64().unwrap() >= 2.0);
    let e2 = agent.expect_event(
        "ioctl stall end",
        |v| v["event"] == "stall_end" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    assert_eq!(e2["outcome"], "returned");
    std::thread::sleep(Duration::from_millis(200));
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "uvmwatch_stalled_calls", &[("call", "cuInit")]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "uvmwatch_stalls_total", &[("call", "cuInit")]),
        Some(1.0)
    );
    assert_eq!(metric(&m, "uvmwatch_cuinit_in_flight", &[]), Some(0.0));
    assert!(agent.stop());
}

#[test]
fn a_thread_killed_mid_cuinit_leaves_no_stall() {
    require_env!("a_thread_killed_mid_cuinit_leaves_no_stall");
    let agent = Agent::start(&["--ioctl-stall", "1s", "--cuinit-stall", "1s"]);
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    let mut w = workload(
        &dev,
        Scenario::HangRegisterGpu,
        LibLocation::PrivateNamespace,
    );
    let pid = w.pid();
    agent.expect_event(
        "cuInit stall",
        |v| v["event"] == "stall" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    agent.expect_event(
        "ioctl stall",
        |v| v["event"] == "stall" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    w.kill().unwrap();
    let ended = agent.expect_event(
        "stall end by thread exit",
        |v| v["event"] == "stall_end" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    assert_eq!(ended["outcome"], "thread_exited");
    agent.expect_event(
        "died_in_call",
        |v| v["event"] == "died_in_call" && pid_is(v, pid),
        T,
    );
    // Nothing comes back as a phantom stall.
    std::thread::sleep(Duration::from_millis(1500));
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "uvmwatch_stalled_calls", &[("call", "cuInit")]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "uvmwatch_stalled_calls",
            &[("call", "UVM_REGISTER_GPU")]
        )
        .unwrap_or(0.0),
        0.0
    );
    assert_eq!(metric(&m, "uvmwatch_cuinit_in_flight", &[]), Some(0.0));
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuinit_calls_total",
            &[("result", "thread_exited")]
        ),
        Some(1.0)
    );
    let stalls = agent
        .events("stall")
        .into_iter()
        .filter(|v| pid_is(v, pid))
        .count();
    assert_eq!(stalls, 2, "one cuInit and one ioctl stall, no repeats");
    assert!(agent.stop());
}

#[test]
fn failed_opens_are_counted_by_node_and_errno() {
    require_env!("failed_opens_are_counted_by_node_and_errno");
    let agent = Agent::start(&[]);
    // ENOENT: the node is not in the namespace.
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            omit: vec!["nvidia-uvm".into()],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = workload(&dev, Scenario::MissingNode, LibLocation::PrivateNamespace);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 999);
    let p1 = w.pid();
    let e = agent.expect_event(
        "ENOENT open",
        |v| v["event"] == "device_open_failed" && pid_is(v, p1),
        T,
    );
    assert_eq!(e["errno"], "ENOENT");
    assert_eq!(e["node"], "nvidia-uvm");
    assert_eq!(e["path"], "/dev/nvidia-uvm");
    assert_eq!(e["in_cuinit"], true);
    drop(w);
    drop(dev);
    // EPERM: the node is there but access is refused.
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = workload(&dev, Scenario::MissingNode, LibLocation::PrivateNamespace);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 999);
    let p2 = w.pid();
    let e = agent.expect_event(
        "EPERM open",
        |v| v["event"] == "device_open_failed" && pid_is(v, p2),
        T,
    );
    assert_eq!(e["errno"], "EPERM");
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, p2),
        T,
    );
    assert_eq!(end["result"], "CUDA_ERROR_UNKNOWN");
    assert_eq!(end["failed_call"], "open /dev/nvidia-uvm");
    assert_eq!(end["failed_result"], "EPERM");
    let m = agent.metrics();
    let opens = |r: &str| {
        metric(
            &m,
            "uvmwatch_device_opens_total",
            &[("node", "nvidia-uvm"), ("result", r)],
        )
    };
    // The library tries each open twice (with O_CLOEXEC, then without), as the real one
    // does.
    assert_eq!(opens("ENOENT"), Some(2.0), "{m}");
    assert_eq!(opens("EPERM"), Some(2.0), "{m}");
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuinit_calls_total",
            &[("result", "CUDA_ERROR_UNKNOWN")]
        ),
        Some(2.0)
    );
    assert!(agent.stop());
}

#[test]
fn a_library_in_another_mount_namespace_is_found_and_probed() {
    require_env!("a_library_in_another_mount_namespace_is_found_and_probed");
    assert!(
        !std::path::Path::new(uvmwatch_testbed::PRIVATE_LIB_DIR).exists(),
        "the private library path must not exist on the host"
    );
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    // Started after the agent: found through the library open the probes saw. It calls
    // cuInit at once, before the probes are attached: that first call is found from its
    // driver calls (docs/probes.md#late-cuinit); the process goes on for a while after, as
    // an application does, so its root can be read to attach through.
    let mut w = Workload::spawn_with_args(
        &dev,
        artifacts(),
        WorkloadConfig {
            scenario: Scenario::Success,
            gpus: 1,
            wait_ms: 0,
            lib_location: LibLocation::PrivateNamespace,
            fork_child: false,
            extra_env: vec![],
        },
        &["--hold-ms", "3000"],
    )
    .expect("spawn workload");
    let pid = w.pid();
    let att = agent.expect_event(
        "libcuda_attached",
        |v| v["event"] == "libcuda_attached" && v["path"] == "/usr/local/nvidia/lib64/libcuda.so.1",
        T,
    );
    assert!(
        att["host_path"]
            .as_str()
            .unwrap()
            .starts_with(&format!("/proc/{pid}/root/")),
        "{att}"
    );
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    // Seen whole when the probes won the race, else from its driver calls, every one.
    if end["seen"] != "whole" {
        assert_eq!(end["seen"], "driver_calls", "{end}");
        assert!(end["driver_calls"].as_u64().unwrap() >= 10, "{end}");
        assert!(end["device_opens"].as_u64().unwrap() >= 4, "{end}");
    }
    let m = agent.metrics();
    // Copies of the library opened on the way (by the test harness and `cp`) count too.
    assert!(
        metric(&m, "uvmwatch_libcuda_targets", &[]).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "uvmwatch_probe_attached", &[("probe", "uprobe:cuInit")]),
        Some(1.0)
    );
    assert!(agent.stop());
}

#[test]
fn a_workload_running_before_the_agent_is_found_through_its_maps() {
    require_env!("a_workload_running_before_the_agent_is_found_through_its_maps");
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = Workload::spawn(
        &dev,
        artifacts(),
        WorkloadConfig {
            wait_ms: 6000,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let pid = w.pid();
    // Let it load the library before the agent exists.
    let t0 = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("libcuda.so.1")
    {
        assert!(t0.elapsed() < T, "workload never mapped libcuda");
        std::thread::sleep(Duration::from_millis(20));
    }
    let agent = Agent::start(&[]);
    // Found in its maps (the host's installed library is attached too, from the flag).
    let att = agent.expect_event(
        "libcuda_attached from the maps",
        |v| {
            v["event"] == "libcuda_attached"
                && v["source"]
                    .as_str()
                    .is_some_and(|s| s.contains("ProcessMaps"))
        },
        T,
    );
    assert!(
        att["path"].as_str().unwrap().ends_with("libcuda.so.1"),
        "{att}"
    );
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    assert_eq!(end["result"], "CUDA_SUCCESS");
    assert!(agent.stop());
}

#[test]
fn fds_follow_fork_dup_close_and_exec() {
    require_env!("fds_follow_fork_dup_close_and_exec");
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut a = artifacts().clone();
    a.workload = common::fixture_binary("fd_tricks");
    let mut w = Workload::spawn(&dev, &a, WorkloadConfig::default()).unwrap();
    let out = w.wait_timeout(T).unwrap();
    assert!(out.status.success(), "fd_tricks failed:\n{}", out.stdout);
    std::thread::sleep(Duration::from_millis(200));
    let m = agent.metrics();
    let n = |ioctl: &str| {
        metric(
            &m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("node", "nvidia-uvm"),
                ("ioctl", ioctl),
                ("result", "NV_OK"),
            ],
        )
    };
    assert_eq!(
        n("UVM_PAGEABLE_MEM_ACCESS"),
        Some(1.0),
        "inherited fd:\n{m}\n{}",
        out.stdout
    );
    assert_eq!(n("UVM_CREATE_RANGE_GROUP"), Some(1.0), "dup:\n{m}");
    assert_eq!(n("UVM_FREE"), Some(1.0), "fcntl(F_DUPFD_CLOEXEC):\n{m}");
    assert_eq!(n("UVM_DESTROY_RANGE_GROUP"), Some(1.0), "dup2:\n{m}");
    assert_eq!(
        n("UVM_SET_RANGE_GROUP"),
        Some(1.0),
        "fd kept across exec:\n{m}"
    );
    assert!(
        !m.contains("ioctl=\"UVM_MIGRATE\""),
        "an ioctl on a closed fd was counted:\n{m}"
    );
    assert!(
        !m.contains("ioctl=\"UVM_MIGRATE_RANGE_GROUP\""),
        "a close-on-exec fd reused after exec was still tracked:\n{m}"
    );
    assert!(agent.stop());
}

#[test]
fn fds_opened_before_the_agent_are_learned_from_proc() {
    require_env!("fds_opened_before_the_agent_are_learned_from_proc");
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut a = artifacts().clone();
    a.workload = common::fixture_binary("fd_tricks");
    let mut w = Workload::spawn_with_args(&dev, &a, WorkloadConfig::default(), &["--late", "4000"])
        .unwrap();
    let pid = w.pid();
    let t0 = Instant::now();
    while !std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .map(|l| l.to_string_lossy().contains("nvidia-uvm"))
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
    {
        assert!(t0.elapsed() < T, "fd_tricks never opened the node");
        std::thread::sleep(Duration::from_millis(20));
    }
    let agent = Agent::start(&[]);
    agent.expect_event("fds_learned", |v| v["event"] == "fds_learned", T);
    let out = w.wait_timeout(T).unwrap();
    assert!(out.status.success(), "{}", out.stdout);
    std::thread::sleep(Duration::from_millis(200));
    let m = agent.metrics();
    assert_eq!(
        metric(
            &m,
            "uvmwatch_driver_ioctl_calls_total",
            &[("node", "nvidia-uvm"), ("ioctl", "UVM_PAGEABLE_MEM_ACCESS")]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(agent.stop());
}

#[test]
fn sigterm_leaves_no_program_or_link_attached() {
    require_env!("sigterm_leaves_no_program_or_link_attached");
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let agent = Agent::start(&[]);
    // Attach the uprobes too.
    let mut w = workload(&dev, Scenario::Success, LibLocation::PrivateNamespace);
    agent.expect_event("libcuda_attached", |v| v["event"] == "libcuda_attached", T);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    // The programs and links this agent holds, from its own fds (other agents on the host,
    // e.g. a benchmark, do not disturb the count).
    let pid = agent.pid();
    let (progs, links) = bpf_ids_of(pid);
    assert!(progs.len() >= 10, "agent holds {} programs", progs.len());
    assert!(agent.stop(), "agent exit status");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_none_left(&progs, &links);
}

/// How long a program or link of the agent's may stay visible after the agent has exited:
/// the kernel frees a link with deferred deallocation (raw tracepoint and multi-uprobe
/// links, `dealloc_deferred` in kernel/bpf/syscall.c) after an RCU grace period, longer
/// on a loaded host, and any process listing the host's programs (`bpftool`, `bpftop`, a
/// test like this one) holds each for a moment through `BPF_PROG_GET_FD_BY_ID`. Seen
/// 2026-12-04: one program still listed right after the agent's exit in 2 of 3 runs of a
/// README check with other tests running on the host; which of the two held it was not
/// established (not reproduced on an idle host, nor beside two busy loops).
const KERNEL_FREES_WITHIN: Duration = Duration::from_secs(5);

/// None of these programs and links is loaded any more, once the kernel has freed what it
/// frees after a grace period ([`KERNEL_FREES_WITHIN`]).
fn assert_none_left(progs: &[u32], links: &[u32]) {
    let left = || {
        let p: Vec<u32> = aya::programs::loaded_programs()
            .filter_map(|p| p.ok())
            .map(|p| p.id())
            .filter(|id| progs.contains(id))
            .collect();
        let l: Vec<u32> = aya::programs::loaded_links()
            .filter_map(|l| l.ok())
            .map(|l| l.id())
            .filter(|id| links.contains(id))
            .collect();
        (p, l)
    };
    let until = Instant::now() + KERNEL_FREES_WITHIN;
    let (mut p, mut l) = left();
    while (!p.is_empty() || !l.is_empty()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
        (p, l) = left();
    }
    assert!(
        p.is_empty(),
        "programs left loaded {KERNEL_FREES_WITHIN:?} after SIGTERM: {p:?}"
    );
    assert!(
        l.is_empty(),
        "links left {KERNEL_FREES_WITHIN:?} after SIGTERM: {l:?}"
    );
}

/// Libcuda files probed at once in [`fifty_libcuda_files_are_probed_and_all_detached_at_sigterm`]:
/// the files of as many container images (issue 21's stop bound is set for 50).
const MANY_LIBCUDAS: usize = 50;

#[test]
fn fifty_libcuda_files_are_probed_and_all_detached_at_sigterm() {
    require_env!("fifty_libcuda_files_are_probed_and_all_detached_at_sigterm");
    let dir = tempfile::tempdir().unwrap();
    let mut flags: Vec<String> = Vec::new();
    let mut copies = Vec::new();
    for i in 0..MANY_LIBCUDAS {
        let d = dir.path().join(i.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("libcuda.so.1");
        std::fs::copy(&host_lib().path, &p).unwrap();
        flags.extend(["--libcuda".to_string(), p.display().to_string()]);
        copies.push(p);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = Agent::start(&flags);
    let attached = agent.events("libcuda_attached");
    assert_eq!(attached.len(), MANY_LIBCUDAS + 1, "{}", agent.raw_log());
    // Where the kernel has multi-uprobe links (6.6+), each of a file's probes is one.
    let pid = agent.pid();
    let multi = bpf_link_types_of(pid)
        .iter()
        .filter(|t| *t == "uprobe_multi")
        .count();
    if kernel_at_least(6, 6) {
        assert!(
            multi >= 2 * (MANY_LIBCUDAS + 1),
            "{multi} multi-uprobe links for {} files",
            MANY_LIBCUDAS + 1
        );
    }
    // The probes work: a cuInit through the last copy is seen from entry to return.
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let last = copies.last().unwrap().clone();
    let mut w = workload(&dev, Scenario::Success, LibLocation::Installed(last));
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let wpid = w.pid();
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, wpid),
        T,
    );
    assert_eq!(end["seen"], "whole", "{end}");
    let (progs, links) = bpf_ids_of(pid);
    assert!(agent.stop(), "agent exit status");
    assert_none_left(&progs, &links);
}

/// Whether the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (major, minor)
}

/// The `link_type:` of each BPF link fd a process holds (`/proc/<pid>/fdinfo`).
fn bpf_link_types_of(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(t) = text.lines().find_map(|l| l.strip_prefix("link_type:")) {
            out.push(t.trim().to_string());
        }
    }
    out
}

/// Program and link ids held by a process, from `/proc/<pid>/fdinfo` (`prog_id:` of program
/// and perf-event fds, `link_id:` of link fds).
fn bpf_ids_of(pid: u32) -> (Vec<u32>, Vec<u32>) {
    let mut progs = Vec::new();
    let mut links = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            match (it.next(), it.next().and_then(|v| v.parse::<u32>().ok())) {
                (Some("prog_id:"), Some(id)) if !progs.contains(&id) => progs.push(id),
                (Some("link_id:"), Some(id)) => links.push(id),
                _ => {}
            }
        }
    }
    (progs, links)
}

#[test]
fn metrics_pass_promtool_and_healthz_answers() {
    require_env!("metrics_pass_promtool_and_healthz_answers");
    let Some(promtool) = common::which("promtool") else {
        uvmwatch_testbed::skip(
            "metrics_pass_promtool_and_healthz_answers",
            "promtool not installed (Debian package prometheus; `cargo xtask setup`)",
        );
        return;
    };
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(
        &dev,
        Scenario::RegisterGpuNoMemory,
        LibLocation::PrivateNamespace,
    );
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
    std::thread::sleep(Duration::from_millis(200));
    let (st, body) = agent.get("/healthz");
    assert_eq!((st, body.trim()), (200, "ok"));
    let m = agent.metrics();
    let mut p = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    p.stdin.take().unwrap().write_all(m.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{m}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, _, _) in uvmwatch::export::metrics::FAMILIES {
        if *name == "uvmwatch_diagnosis" {
            continue; // series appear with the first finding
        }
        if name.starts_with("uvmwatch_kernel_function") && !uvmwatch::kernel::kprobes_supported() {
            continue; // no kprobes on this kernel: nothing to export
        }
        assert!(
            m.contains(&format!("# TYPE {name} ")),
            "{name} missing from /metrics"
        );
    }
    assert!(!m.contains("pid=\""), "no pid labels");
    assert!(agent.stop());
}

#[test]
fn workload_labels_are_opt_in_and_come_from_the_process() {
    require_env!("workload_labels_are_opt_in_and_come_from_the_process");
    // A pod's library bind-mounted from the host (as the container toolkit does): probed
    // from the agent's start. The server goes on after its start-up, as a server does, until
    // the test has seen it (dropping the workload kills it): its identity is read from
    // /proc when the agent reaches its first event, which on a loaded machine can be seconds
    // after it happened (a process gone by then is counted in
    // uvmwatch_process_identities_unread_total and has no labels to give).
    let lib = host_lib();
    let agent = Agent::start(&["--workload-labels"]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = Workload::spawn_with_args(
        &dev,
        artifacts(),
        WorkloadConfig {
            extra_env: vec![
                ("POD_NAME".into(), "vllm-llama-0".into()),
                ("POD_NAMESPACE".into(), "inference".into()),
            ],
            lib_location: lib.location(),
            ..WorkloadConfig::default()
        },
        &["--hold-ms", "600000"],
    )
    .unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let pid = w.pid();
    let start = agent.expect_event(
        "cuinit_start",
        |v| v["event"] == "cuinit_start" && pid_is(v, pid),
        T,
    );
    assert_eq!(start["pod"], "vllm-llama-0", "{start}");
    assert_eq!(start["namespace"], "inference");
    agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    let m = agent.metrics();
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuinit_calls_total",
            &[
                ("result", "CUDA_SUCCESS"),
                ("namespace", "inference"),
                ("pod", "vllm-llama-0")
            ]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(agent.stop());
}

#[test]
fn a_call_already_stuck_when_the_agent_starts_is_reported() {
    require_env!("a_call_already_stuck_when_the_agent_starts_is_reported");
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    let mut w = workload(
        &dev,
        Scenario::HangRegisterGpu,
        LibLocation::PrivateNamespace,
    );
    let pid = w.pid();
    // Wait until the workload sits in UVM_REGISTER_GPU, before any agent exists.
    let t0 = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .map(|s| !s.starts_with(&format!("{} ", libc::SYS_ioctl)) || !s.contains(" 0x25 "))
        .unwrap_or(true)
    {
        assert!(
            t0.elapsed() < T,
            "workload never blocked in UVM_REGISTER_GPU"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let agent = Agent::start(&["--ioctl-stall", "1s"]);
    agent.expect_event(
        "in_flight_at_start",
        |v| {
            v["event"] == "in_flight_at_start" && pid_is(v, pid) && v["ioctl"] == "UVM_REGISTER_GPU"
        },
        T,
    );
    let st = agent.expect_event(
        "stall of the call that started before the agent",
        |v| v["event"] == "stall" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    assert_eq!(st["node"], "/dev/nvidia-uvm");
    assert_eq!(st["wchan"], "request_wait_answer");
    dev.release().unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let end = agent.expect_event(
        "stall_end",
        |v| v["event"] == "stall_end" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    assert_eq!(end["outcome"], "returned");
    assert!(agent.stop());
}

#[test]
fn a_hung_thread_whose_main_thread_exited_is_reported_with_its_identity_and_stack_path() {
    require_env!(
        "a_hung_thread_whose_main_thread_exited_is_reported_with_its_identity_and_stack_path"
    );
    let agent = Agent::start(&["--ioctl-stall", "1s", "--cuinit-stall", "30s"]);
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    // The main thread exits at once; a second thread calls cuInit and hangs in
    // UVM_REGISTER_GPU (a launcher's worker thread outliving it).
    let w = Workload::spawn_with_args(
        &dev,
        artifacts(),
        WorkloadConfig {
            scenario: Scenario::HangRegisterGpu,
            gpus: 1,
            wait_ms: 0,
            lib_location: LibLocation::PrivateNamespace,
            fork_child: false,
            extra_env: vec![],
        },
        &["--leader-exits"],
    )
    .expect("spawn workload");
    let pid = w.pid();
    let stall = agent.expect_event(
        "ioctl stall",
        |v| v["event"] == "stall" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        T,
    );
    let tid = stall["tid"].as_u64().unwrap();
    assert_ne!(
        tid, pid as u64,
        "the stuck thread is not the main thread: {stall}"
    );
    // The main thread is a zombie: /proc/<pid>/exe is gone, the thread's own is not.
    assert!(
        std::fs::read_link(format!("/proc/{pid}/exe")).is_err(),
        "the main thread has not exited"
    );
    assert!(
        stall["exe"]
            .as_str()
            .is_some_and(|e| e.ends_with("cuda-workload")),
        "exe from /proc/<pid>/task/<tid>: {stall}"
    );
    assert_eq!(stall["wchan"], "request_wait_answer", "{stall}");
    let finding = agent.expect_event(
        "the hang's finding",
        |v| v["event"] == "diagnosis" && v["rule"] == "driver_hang" && pid_is(v, pid),
        T,
    );
    let fix = finding["fix"].as_str().unwrap_or("");
    let stack = format!("/proc/{pid}/task/{tid}/stack");
    assert!(fix.contains(&stack), "the fix reads {stack}: {finding}");
    assert!(!fix.contains(&format!("/proc/{pid}/stack")), "{finding}");
    dev.release().unwrap();
    drop(w);
    assert!(agent.stop());
}

/// A process that loads a library the agent has never seen (a new file each time, as a
/// container image's own library is) and calls cuInit at once: every such first call is
/// reported, with its driver calls, its failure and the result they tell, whether the
/// probes won the race or not, also with both cores busy. The fake library fails
/// UVM_REGISTER_GPU with NV_ERR_NO_MEMORY and returns 3, as the real one does.
#[test]
fn the_first_cuinit_of_a_library_the_agent_has_not_seen_is_reported() {
    require_env!("the_first_cuinit_of_a_library_the_agent_has_not_seen_is_reported");
    const N: usize = 6;
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            })
        })
        .collect();
    let mut seen = Vec::new();
    for _ in 0..N {
        let mut w = workload(
            &dev,
            Scenario::RegisterGpuNoMemory,
            LibLocation::PrivateNamespace,
        );
        let rc = w.next_cuinit_line(T).unwrap().rc;
        assert_eq!(rc, 3);
        let pid = w.pid();
        let end = agent.expect_event(
            "cuinit_end",
            |v| v["event"] == "cuinit_end" && pid_is(v, pid),
            T,
        );
        assert_eq!(end["code"], 3, "{end}");
        assert_eq!(
            end["failed_call"], "UVM_REGISTER_GPU on /dev/nvidia-uvm",
            "{end}"
        );
        assert_eq!(end["failed_result"], "NV_ERR_NO_MEMORY", "{end}");
        assert!(end["driver_calls"].as_u64().unwrap() >= 10, "{end}");
        seen.push(end["seen"].as_str().unwrap().to_string());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    let late = seen.iter().filter(|s| *s == "driver_calls").count();
    println!("measured: {N} of {N} first cuInit calls reported ({late} from their driver calls, {} whole or from their return), tracepoint or fentry as the kernel allows", N - late);
    assert!(agent.stop());
}

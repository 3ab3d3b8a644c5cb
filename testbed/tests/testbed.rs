//! End-to-end checks of the test doubles: fake libcuda + cuda-workload + uvmwatch-fakedev in
//! a private mount namespace. They need root, /dev/fuse, unshare/mount and a C compiler, and
//! report a skip ([`uvmwatch_testbed::skip`]) and return when something is missing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uvmwatch_testbed::procfs::{self, ThreadInfo};
use uvmwatch_testbed::*;

const WAIT: Duration = Duration::from_secs(15);

/// Name of the running test: libtest runs each test on a thread named after it.
fn this_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("testbed")
        .to_string()
}

/// Builds the doubles, or says why the test is skipped.
fn setup() -> Option<(tempfile::TempDir, Artifacts)> {
    if let Err(reason) = check_environment() {
        skip(&this_test(), &reason);
        return None;
    }
    let out = tempfile::tempdir().expect("temp dir");
    let artifacts = build_artifacts_with_fakedev(
        out.path(),
        PathBuf::from(env!("CARGO_BIN_EXE_uvmwatch-fakedev")),
    )
    .expect("build artifacts");
    Some((out, artifacts))
}

/// A workload that calls cuInit at once (no agent needs time to attach here).
fn quick(scenario: Scenario) -> WorkloadConfig {
    WorkloadConfig {
        scenario,
        wait_ms: 0,
        ..WorkloadConfig::default()
    }
}

fn run(dev: &FakeDev, artifacts: &Artifacts, config: WorkloadConfig) -> (u32, WorkloadOutput) {
    let mut w = Workload::spawn(dev, artifacts, config).expect("spawn workload");
    let pid = w.pid();
    let out = w.wait_timeout(WAIT).expect("workload exits");
    (pid, out)
}

fn rcs(out: &WorkloadOutput) -> Vec<i32> {
    out.cuinit_lines().iter().map(|l| l.rc).collect()
}

fn in_ioctl(cmd: u32) -> impl Fn(&ThreadInfo) -> bool {
    move |t| t.wchan == "request_wait_answer" && t.blocked_ioctl_cmd() == Some(cmd)
}

#[test]
fn success_returns_0_and_uvm_commands_reach_the_server() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let before = procfs::dev_snapshot().unwrap();
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let (pid, out) = run(&dev, &artifacts, quick(Scenario::Success));
    assert_eq!(out.cuinit_lines(), [CuInitLine { rc: 0, pid }], "{out:?}");
    assert!(out.status.success());

    let log = dev.log();
    // In the order NVIDIA's libcuda 535.261.03 and 550.163.01 make them (strace, vm-test's
    // nvidia series: testbed/replays/535.261.03-gpuless-qemu-cuinit.replay): two control
    // node sessions, then UVM on two fds, only then the GPU node and its registration.
    let mut at = 0;
    for needle in [
        "open node=nvidiactl",
        "cmd=0xc00846d6",
        "cmd=0xc90046c8",
        "cmd=0xc020462b in=32 out=32",
        "cmd=0xc020462a in=32 out=32",
        "cmd=0xc0104629 in=16 out=16",
        "open node=nvidiactl",
        "cmd=0xc00846d6",
        "cmd=0xc90046c8",
        "cmd=0xc020462b in=32 out=32",
        "cmd=0xc020462a in=32 out=32",
        "cmd=0xc020462a in=32 out=32",
        "cmd=0xc030462b in=48 out=48",
        "open node=nvidia-uvm ",
        "open node=nvidia-uvm ",
        "cmd=0x30000001 in=0 out=0",
        "cmd=0x4b",
        "cmd=0x27",
        "open node=nvidia0",
        "cmd=0x25",
        "cmd=0x17",
    ] {
        match log[at..].find(needle) {
            Some(i) => at += i + needle.len(),
            None => panic!("missing {needle:?} after byte {at} in log:\n{log}"),
        }
    }
    assert_eq!(log.matches("open node=nvidia-uvm ").count(), 2, "{log}");
    assert!(
        !log.contains("cmd=0xc04846d2"),
        "no version-string escape: {log}"
    );
    let mountpoint = dev.mountpoint().to_path_buf();
    dev.stop().unwrap();
    assert!(!procfs::is_mount_point(&mountpoint).unwrap());
    assert_eq!(procfs::dev_snapshot().unwrap(), before);
}

#[test]
fn register_gpu_no_memory_returns_3() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let (_, out) = run(&dev, &artifacts, quick(Scenario::RegisterGpuNoMemory));
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_NOT_INITIALIZED], "{out:?}");
    assert_eq!(out.status.code(), Some(1));
    let log = dev.log();
    assert!(log.contains("cmd=0x25"), "{log}");
    assert!(
        !log.contains("cmd=0x17"),
        "no call after the failed one:\n{log}"
    );
}

#[test]
fn missing_uvm_node_returns_999() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        omit: vec!["nvidia-uvm".into()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    assert!(!dev.mountpoint().join("nvidia-uvm").exists());
    let (_, out) = run(&dev, &artifacts, quick(Scenario::MissingNode));
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_UNKNOWN], "{out:?}");
    assert!(!dev.log().contains("cmd=0x30000001"));
}

#[test]
fn denied_uvm_node_returns_999() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        deny: vec!["nvidia-uvm=EPERM".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let (_, out) = run(&dev, &artifacts, quick(Scenario::Success));
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_UNKNOWN], "{out:?}");
    let log = dev.log();
    let pid = out.cuinit_lines()[0].pid;
    let denied = format!(
        "open node=nvidia-uvm flags=0x8002 pid={pid}: errno {}",
        libc::EPERM
    );
    assert!(log.contains(&denied), "missing {denied:?} in log:\n{log}");
    assert!(!log.contains("cmd=0x30000001"), "{log}");
}

#[test]
fn failing_ioctl_returns_999() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(
            nv::UVM_INITIALIZE,
            IoctlAction::Errno(libc::EAGAIN),
        )],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let (_, out) = run(&dev, &artifacts, quick(Scenario::Success));
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_UNKNOWN], "{out:?}");
}

#[test]
fn hung_register_gpu_waits_in_fuse_until_released() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=hang".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let mut w = Workload::spawn(&dev, &artifacts, quick(Scenario::HangRegisterGpu)).unwrap();
    let thread = procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();
    println!("blocked thread: {thread:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(w.try_wait().unwrap().is_none(), "must still hang");
    assert_eq!(
        procfs::threads(w.pid()).unwrap()[0].wchan,
        "request_wait_answer"
    );

    dev.release().unwrap();
    let out = w.wait_timeout(WAIT).unwrap();
    assert_eq!(rcs(&out), [0], "{out:?}");
    assert!(dev.log().contains("release cmd=0x25"));
}

#[test]
fn killed_hung_workload_exits_promptly() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=hang".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let mut w = Workload::spawn(&dev, &artifacts, quick(Scenario::HangRegisterGpu)).unwrap();
    procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();

    let killed = Instant::now();
    w.kill().unwrap();
    let out = w.wait_timeout(Duration::from_secs(2)).unwrap();
    println!("exited {:?} after SIGKILL", killed.elapsed());
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    assert!(out.cuinit_lines().is_empty());
    let log = dev.log();
    assert!(log.contains("interrupt cmd=0x25"), "{log}");
}

#[test]
fn delayed_ioctl_is_answered_later() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=delay:400".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let started = Instant::now();
    let (_, out) = run(&dev, &artifacts, quick(Scenario::Success));
    assert_eq!(rcs(&out), [0], "{out:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[test]
fn forked_child_gets_3_after_parent_got_0() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let config = WorkloadConfig {
        fork_child: true,
        ..quick(Scenario::Success)
    };
    let mut w = Workload::spawn_with_args(&dev, &artifacts, config, &["--repeat", "2"]).unwrap();
    let pid = w.pid();
    let out = w.wait_timeout(WAIT).unwrap();
    let lines = out.cuinit_lines();
    assert_eq!(rcs(&out), [0, 0, 3], "{out:?}");
    assert_eq!(lines[0].pid, pid);
    assert_eq!(lines[1].pid, pid);
    assert_ne!(lines[2].pid, pid);
    // The second call and the child's call did not touch the driver again.
    assert_eq!(dev.log().matches("cmd=0x25").count(), 1);
}

#[test]
fn two_gpus_are_registered_each() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        gpus: 2,
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let two = WorkloadConfig {
        gpus: 2,
        ..quick(Scenario::Success)
    };
    let (_, out) = run(&dev, &artifacts, two);
    assert_eq!(rcs(&out), [0], "{out:?}");
    let log = dev.log();
    assert!(log.contains("open node=nvidia1 "), "{log}");
    assert_eq!(log.matches("cmd=0x25").count(), 2, "{log}");

    // The library expecting more GPUs than there are nodes fails the open.
    let (_, out) = run(
        &dev,
        &artifacts,
        WorkloadConfig {
            gpus: 3,
            ..quick(Scenario::Success)
        },
    );
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_UNKNOWN], "{out:?}");
}

fn maps_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}

#[test]
fn private_library_exists_only_in_the_namespace() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let before = procfs::dev_snapshot().unwrap();
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let config = WorkloadConfig {
        wait_ms: 3000,
        ..WorkloadConfig::default()
    };
    let mut w = Workload::spawn(&dev, &artifacts, config).unwrap();
    let lib = Path::new(PRIVATE_LIB_DIR).join("libcuda.so.1");
    let deadline = Instant::now() + WAIT;
    while !maps_of(w.pid()).contains(lib.to_str().unwrap()) {
        assert!(Instant::now() < deadline, "library never mapped");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!lib.exists(), "must not exist on the host");
    let through_root =
        PathBuf::from(format!("/proc/{}/root", w.pid())).join(lib.strip_prefix("/").unwrap());
    assert!(through_root.is_file(), "visible through /proc/<pid>/root");
    let dev_in_ns = PathBuf::from(format!("/proc/{}/root/dev/nvidia-uvm", w.pid()));
    assert!(dev_in_ns.exists());
    assert!(!Path::new("/dev/nvidia-uvm").exists());

    let out = w.wait_timeout(WAIT).unwrap();
    assert_eq!(rcs(&out), [0], "{out:?}");
    drop(dev);
    assert_eq!(procfs::dev_snapshot().unwrap(), before, "host /dev changed");
    assert!(!Path::new(PRIVATE_LIB_DIR).exists());
}

#[test]
fn host_path_library_is_used() {
    let Some((out_dir, artifacts)) = setup() else {
        return;
    };
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let lib = out_dir.path().join("host-lib/libcuda.so.1");
    let config = WorkloadConfig {
        lib_location: LibLocation::HostPath(lib.clone()),
        wait_ms: 3000,
        ..WorkloadConfig::default()
    };
    let mut w = Workload::spawn(&dev, &artifacts, config).unwrap();
    let deadline = Instant::now() + WAIT;
    while !maps_of(w.pid()).contains(lib.to_str().unwrap()) {
        assert!(Instant::now() < deadline, "library never mapped");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = w.wait_timeout(WAIT).unwrap();
    assert_eq!(rcs(&out), [0], "{out:?}");
}

#[test]
fn bad_configuration_is_reported() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        omit: vec!["nvidia7".into()],
        ..FakeDevConfig::default()
    };
    let err = FakeDev::start(&artifacts, config).unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown node 'nvidia7'"),
        "{err:#}"
    );
}

#[test]
fn stopping_the_server_fails_a_hung_call() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=hang".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let mut w = Workload::spawn(&dev, &artifacts, quick(Scenario::HangRegisterGpu)).unwrap();
    procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();
    let mountpoint = dev.mountpoint().to_path_buf();
    let stopped = Instant::now();
    dev.stop().unwrap();
    println!("server stopped after {:?}", stopped.elapsed());
    let out = w.wait_timeout(Duration::from_secs(3)).unwrap();
    println!("workload done after {:?}", stopped.elapsed());
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_UNKNOWN], "{out:?}");
    assert!(!procfs::is_mount_point(&mountpoint).unwrap());
}

#[test]
fn a_panicking_test_leaves_no_mount_and_no_process() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let seen = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let config = FakeDevConfig {
            ioctl_rules: vec!["0x25=hang".parse().unwrap()],
            ..FakeDevConfig::default()
        };
        let dev = FakeDev::start(&artifacts, config).unwrap();
        let w = Workload::spawn(&dev, &artifacts, quick(Scenario::HangRegisterGpu)).unwrap();
        procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();
        *seen.lock().unwrap() = Some((dev.mountpoint().to_path_buf(), dev.pid(), w.pid()));
        panic!("test failure while a call hangs");
    });
    assert!(result.is_err());
    let (mountpoint, server, workload) = seen.lock().unwrap().clone().unwrap();
    assert!(!procfs::is_mount_point(&mountpoint).unwrap());
    assert!(!mountpoint.exists(), "temp dir removed");
    for pid in [server, workload] {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} still there"
        );
    }
}

#[test]
fn invalid_flags_and_no_gpus() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let dev = FakeDev::start(&artifacts, FakeDevConfig::default()).unwrap();
    let mut w = Workload::spawn_with_args(
        &dev,
        &artifacts,
        quick(Scenario::Success),
        &["--flags", "1"],
    )
    .unwrap();
    let out = w.wait_timeout(WAIT).unwrap();
    assert_eq!(rcs(&out), [1], "{out:?}");
    assert!(
        !dev.log().contains("open node="),
        "no syscall for bad flags"
    );

    let none = WorkloadConfig {
        gpus: 0,
        ..quick(Scenario::Success)
    };
    let (_, out) = run(&dev, &artifacts, none);
    assert_eq!(rcs(&out), [nv::CUDA_ERROR_NO_DEVICE], "{out:?}");
}

#[test]
fn open_fds_resolve_to_the_real_device_paths() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=hang".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let mut w = Workload::spawn(&dev, &artifacts, quick(Scenario::HangRegisterGpu)).unwrap();
    procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();
    let mut targets: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", w.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.starts_with("/dev/nvidia"))
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        [
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/nvidiactl"
        ]
    );
    dev.release().unwrap();
    assert_eq!(rcs(&w.wait_timeout(WAIT).unwrap()), [0]);
}

// ---- Replays of real captures (testbed/replays/, uvmwatch_testbed::replay) ----

use uvmwatch_testbed::replay::{self as rp, Call, ServerCall, Target};

use uvmwatch_testbed::replay::CUINIT_LAYOUT as LAYOUT;

fn replay_run(name: &str) -> ReplayRun {
    ReplayRun::new(Replay::load(name).unwrap(), LAYOUT).unwrap()
}

/// Runs `run` against nodes served as `cfg` says and checks, against
/// [`ReplayRun::expected`]: `cuInit`'s result, every call the library made (its trace), the
/// opens and ioctls the server saw with their sizes, in order, and each planted status: in
/// the bytes the server received (RM requests) and read back by the caller (all).
fn check_replay(
    artifacts: &Artifacts,
    run: &ReplayRun,
    cfg: FakeDevConfig,
    scenario: Scenario,
) -> rp::Expected {
    let cfg = FakeDevConfig {
        dump_params: true,
        ..cfg
    };
    let dev = FakeDev::start(artifacts, cfg.clone()).unwrap();
    let mut w = Workload::spawn_replay(&dev, artifacts, quick(scenario), run).unwrap();
    let pid = w.pid();
    let out = w.wait_timeout(WAIT).unwrap();
    let expected = run.expected(&cfg, scenario);
    assert_eq!(rcs(&out), [expected.cuinit_rc], "{out:?}");
    let (calls, rc) = w.replay_calls().unwrap();
    assert_eq!(rc, Some(expected.cuinit_rc));
    assert_eq!(calls, expected.calls, "the library's calls");
    let log = dev.log();
    let seen: Vec<rp::ServerLogEntry> = rp::parse_server_log(&log)
        .into_iter()
        .filter(|e| e.pid == pid)
        .collect();
    let seen_calls: Vec<ServerCall> = seen.iter().map(|e| e.call.clone()).collect();
    assert_eq!(
        seen_calls,
        expected.server_calls(&cfg),
        "server log:\n{log}"
    );
    // Planted statuses at their offsets: in what the server got (RM) and what the caller
    // read back (every call with an offset).
    let mut on_server = seen
        .iter()
        .filter(|e| matches!(e.call, ServerCall::Ioctl { .. }));
    for call in &expected.calls {
        let Call::Ioctl {
            target: Target::Node(_),
            request,
            size,
            status_offset,
            status,
            ..
        } = call
        else {
            continue;
        };
        let got = on_server.next().expect("server saw the ioctl");
        let params = got.params.as_deref().unwrap_or_default();
        if rp::ioc_dir(*request) == 0 {
            assert!(
                params.is_empty(),
                "plain-integer request {request:#x} carries no bytes"
            );
            continue;
        }
        assert_eq!(params.len(), *size as usize, "{request:#x}");
        let at = status_offset.map(|o| o as usize);
        for (i, b) in params.iter().enumerate() {
            if at.is_some_and(|o| (o..o + 4).contains(&i)) {
                continue;
            }
            assert_eq!(*b, 0xEE, "{request:#x} byte {i}");
        }
        if let (Some(o), Some(s)) = (at, status) {
            assert_eq!(
                params[o..o + 4],
                s.to_le_bytes(),
                "{request:#x} status at {o}"
            );
        }
    }
    expected
}

#[test]
fn replays_issue_the_recorded_calls() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let e = check_replay(
        &artifacts,
        &replay_run("535.104.05-h100-cumemory"),
        FakeDevConfig::default(),
        Scenario::Success,
    );
    assert_eq!((e.cuinit_rc, e.ioctls().count()), (0, 93));
    let e = check_replay(
        &artifacts,
        &replay_run("555.42.02-gtx1080ti-fragment"),
        FakeDevConfig::default(),
        Scenario::Success,
    );
    assert_eq!((e.cuinit_rc, e.ioctls().count()), (0, 10));
    // The failing capture, against a UVM node that fails as it did: both opens, then
    // UVM_DEINITIALIZE on -EIO.
    let eio = FakeDevConfig {
        deny: vec!["nvidia-uvm=EIO".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let e = check_replay(
        &artifacts,
        &replay_run("580.95.05-rtx3060-uvm-eio"),
        eio,
        Scenario::Success,
    );
    assert_eq!(e.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    assert!(matches!(
        e.calls.last(),
        Some(Call::Ioctl {
            target: Target::Fd(-5),
            request: 0x3000_0002,
            result: Err(9),
            ..
        })
    ));
}

#[test]
fn replay_scenarios_on_the_535_capture() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let run = replay_run("535.104.05-h100-cumemory");
    // NV_ERR_NO_MEMORY at UVM_REGISTER_GPU's offset: cuInit stops there with 3.
    let e = check_replay(
        &artifacts,
        &run,
        FakeDevConfig::default(),
        Scenario::RegisterGpuNoMemory,
    );
    assert_eq!(e.cuinit_rc, nv::CUDA_ERROR_NOT_INITIALIZED);
    assert!(e.calls.iter().any(|c| matches!(
        c,
        Call::Ioctl {
            request: 0x25,
            status: Some(0x51),
            status_offset: Some(36),
            ..
        }
    )));
    assert!(!e
        .calls
        .iter()
        .any(|c| matches!(c, Call::Ioctl { request: 0x17, .. })));
    // A status planted in an RM call reaches the server at the layout's offset.
    let planted = run.clone().plant(nv::NV_ESC_RM_ALLOC, 0x1f);
    let e = check_replay(
        &artifacts,
        &planted,
        FakeDevConfig::default(),
        Scenario::Success,
    );
    assert_eq!(e.cuinit_rc, nv::CUDA_ERROR_NOT_INITIALIZED);
    // Missing and denied /dev/nvidia-uvm: retried without O_CLOEXEC, UVM_DEINITIALIZE on
    // -errno, 999.
    for (cfg, errno) in [
        (
            FakeDevConfig {
                omit: vec!["nvidia-uvm".into()],
                ..FakeDevConfig::default()
            },
            libc::ENOENT,
        ),
        (
            FakeDevConfig {
                deny: vec!["nvidia-uvm=EPERM".parse().unwrap()],
                ..FakeDevConfig::default()
            },
            libc::EPERM,
        ),
    ] {
        let e = check_replay(&artifacts, &run, cfg, Scenario::MissingNode);
        assert_eq!(e.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
        let uvm_opens = e
            .calls
            .iter()
            .filter(|c| matches!(c, Call::Open { path, result: Err(_), .. } if path == "/dev/nvidia-uvm"))
            .count();
        assert_eq!(uvm_opens, 2);
        assert!(e.calls.iter().any(|c| matches!(
            c,
            Call::Ioctl { target: Target::Fd(fd), request: 0x3000_0002, .. } if *fd == -errno
        )));
    }
}

#[test]
fn replay_hangs_in_register_gpu_until_released() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    let config = FakeDevConfig {
        ioctl_rules: vec!["0x25=hang".parse().unwrap()],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(&artifacts, config).unwrap();
    let run = replay_run("535.104.05-h100-cumemory");
    let mut w =
        Workload::spawn_replay(&dev, &artifacts, quick(Scenario::HangRegisterGpu), &run).unwrap();
    procfs::wait_for_thread(w.pid(), WAIT, in_ioctl(nv::UVM_REGISTER_GPU)).unwrap();
    assert!(w.try_wait().unwrap().is_none(), "must still hang");
    dev.release().unwrap();
    assert_eq!(rcs(&w.wait_timeout(WAIT).unwrap()), [0]);
    assert!(dev.log().contains("release cmd=0x25"));
}

#[test]
fn replay_opens_through_open_and_openat2() {
    let Some((_out, artifacts)) = setup() else {
        return;
    };
    // Synthetic, not a capture: the 535 replay with its opens switched to open(2) (as
    // glibc < 2.26 issues them) and to openat2(2), to exercise those system calls.
    let text = rp::REPLAY_FILES
        .iter()
        .find(|(n, _)| *n == "535.104.05-h100-cumemory")
        .unwrap()
        .1;
    for syscall in ["open", "openat2"] {
        let changed = text.replace(" openat -> ", &format!(" {syscall} -> "));
        let replay = Replay::parse("synthetic", "synthetic.replay", &changed).unwrap();
        let run = ReplayRun::new(replay, LAYOUT).unwrap();
        let e = check_replay(
            &artifacts,
            &run,
            FakeDevConfig::default(),
            Scenario::Success,
        );
        assert_eq!(e.cuinit_rc, 0);
        assert!(e
            .calls
            .iter()
            .all(|c| !matches!(c, Call::Open { syscall: s, .. } if s.as_str() != syscall)));
    }
}

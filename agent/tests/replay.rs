//! The real agent against replays of real recorded CUDA starts (`testbed/replays/`, whose
//! headers cite each capture): the fake library issues a capture's opens, closes and ioctls
//! with their real request numbers and params sizes, every params buffer filled with 0xEE and
//! its status planted at the offset of the driver version under test. The agent, told that
//! version with `--driver-version`, must name every ioctl, put it on the right node, and read
//! each status at that version's offset (NV_OK where one was planted, OK where the command has
//! none): an offset off by even four bytes reads 0xEEEEEEEE. A replay checked with another
//! driver's layouts must show that it is wrong. Root only; single-threaded.

mod common;

use std::time::Duration;

use common::{artifacts, metric, Agent};
use serde_json::Value;
use uvmwatch::decode::layouts::{self, DriverVersion};
use uvmwatch_testbed::{
    replay::{Call, Expected, Replay, ReplayRun, Target},
    FakeDev, FakeDevConfig, Scenario, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(30);

/// `NV_ERR_NO_MEMORY` (`nvstatuscodes.h`).
const NV_ERR_NO_MEMORY: u32 = 0x51;

/// The name NVIDIA's headers give each request the replays issue, written here from the
/// headers (not from the agent's table): UVM numbers from `kernel-open/nvidia-uvm/uvm_ioctl.h`
/// and `uvm_linux_ioctl.h`, RM escapes by `_IOC_NR` from
/// `kernel-open/common/inc/nv-ioctl-numbers.h` and
/// `src/nvidia/arch/nvalloc/unix/include/nv_escape.h` (545.29.06); 0xca from NVIDIA's
/// proprietary `nv.h` (no open-module header defines it).
const UVM_NAMES: &[(u32, &str)] = &[
    (0x3000_0001, "UVM_INITIALIZE"),
    (0x3000_0002, "UVM_DEINITIALIZE"),
    (0x17, "UVM_CREATE_RANGE_GROUP"),
    (0x19, "UVM_REGISTER_GPU_VASPACE"),
    (0x1b, "UVM_REGISTER_CHANNEL"),
    (0x21, "UVM_MAP_EXTERNAL_ALLOCATION"),
    (0x22, "UVM_FREE"),
    (0x25, "UVM_REGISTER_GPU"),
    (0x27, "UVM_PAGEABLE_MEM_ACCESS"),
    (0x41, "UVM_MAP_DYNAMIC_PARALLELISM_REGION"),
    (0x44, "UVM_ALLOC_SEMAPHORE_POOL"),
    (0x46, "UVM_PAGEABLE_MEM_ACCESS_ON_GPU"),
    (0x48, "UVM_VALIDATE_VA_RANGE"),
    (0x49, "UVM_CREATE_EXTERNAL_RANGE"),
    (0x4b, "UVM_MM_INITIALIZE"),
];
const RM_NAMES: &[(u32, &str)] = &[
    (0x27, "NV_ESC_RM_ALLOC_MEMORY"),
    (0x29, "NV_ESC_RM_FREE"),
    (0x2a, "NV_ESC_RM_CONTROL"),
    (0x2b, "NV_ESC_RM_ALLOC"),
    (0x4e, "NV_ESC_RM_MAP_MEMORY"),
    (0x5e, "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO"),
    (0xc8, "NV_ESC_CARD_INFO"),
    (0xc9, "NV_ESC_REGISTER_FD"),
    (0xca, "NV_ESC_ENV_INFO"),
    (0xce, "NV_ESC_ALLOC_OS_EVENT"),
    (0xd2, "NV_ESC_CHECK_VERSION_STR"),
    (0xd6, "NV_ESC_SYS_PARAMS"),
    (0xd7, "NV_ESC_NUMA_INFO"),
];

/// The header name of `request` on `target`.
fn header_name(target: &Target, request: u32) -> &'static str {
    let uvm = || UVM_NAMES.iter().find(|(c, _)| *c == request);
    let found = match target {
        Target::Node(p) if p.starts_with("/dev/nvidia-uvm") => uvm(),
        Target::Fd(_) => uvm(),
        Target::Node(_) => RM_NAMES.iter().find(|(nr, _)| *nr == request & 0xff),
    };
    found
        .map(|(_, n)| *n)
        .unwrap_or_else(|| panic!("no header name written here for {request:#x} on {target:?}"))
}

/// The layout table of driver `version` as the agent has it, in the replay's terms.
fn layout_table(version: &DriverVersion) -> Vec<(u32, u32, Option<u32>)> {
    let l = layouts::layout_for(Some(version));
    l.uvm()
        .map(|e| (e.cmd, e.params_size, e.status_offset))
        .chain(
            l.rm()
                .map(|e| (e.request(), e.params_size, e.status_offset)),
        )
        .collect()
}

fn version(v: &str) -> DriverVersion {
    v.parse().unwrap()
}

/// A run of replay `name` with the layouts of `driver` (its own when `None`).
fn replay_run(name: &str, driver: Option<&str>) -> ReplayRun {
    let replay = Replay::load(name).unwrap();
    let v = version(driver.unwrap_or(&replay.driver));
    ReplayRun::new(replay, &layout_table(&v)).unwrap()
}

/// What the agent said about one replayed workload.
struct Seen {
    pid: u32,
    expected: Expected,
    /// The `driver_ioctl` records of the workload, in order.
    ioctls: Vec<Value>,
    end: Value,
}

/// Replays `run` against nodes served as `dev` says, under `agent`; waits for its cuInit to
/// end in the agent's log.
fn replay(agent: &Agent, run: &ReplayRun, dev: FakeDevConfig, scenario: Scenario) -> Seen {
    let fake = FakeDev::start(artifacts(), dev.clone()).unwrap();
    let mut w = Workload::spawn_replay(
        &fake,
        artifacts(),
        WorkloadConfig {
            scenario,
            // The host's installed library, probed from the agent's start.
            lib_location: common::host_lib().location(),
            ..WorkloadConfig::default()
        },
        run,
    )
    .unwrap();
    let pid = w.pid();
    let expected = run.expected(&dev, scenario);
    let line = w.next_cuinit_line(T).unwrap();
    assert_eq!(line.rc, expected.cuinit_rc, "the replay's cuInit result");
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && v["pid"].as_u64() == Some(pid as u64),
        T,
    );
    let ioctls = agent
        .events("driver_ioctl")
        .into_iter()
        .filter(|v| v["pid"].as_u64() == Some(pid as u64))
        .collect();
    Seen {
        pid,
        expected,
        ioctls,
        end,
    }
}

/// The node field the agent gives a call on `target`.
fn node_field(target: &Target) -> String {
    match target {
        Target::Node(p) => p.clone(),
        Target::Fd(_) => "invalid_fd".into(),
    }
}

/// The result the agent must report for an expected call: the errno of a failed syscall, the
/// planted status's name where the layout has a status, else `OK`.
fn result_field(
    status_offset: Option<u32>,
    status: Option<u32>,
    result: Result<(), i32>,
) -> String {
    match (result, status_offset) {
        (Err(e), _) => uvmwatch::decode::errno::label(e as u32).to_string(),
        (Ok(()), Some(_)) => match status.unwrap_or(0) {
            0 => "NV_OK".into(),
            NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY".into(),
            s => panic!("no name written here for status {s:#x}"),
        },
        (Ok(()), None) => "OK".into(),
    }
}

/// Every ioctl the replay issued is in the agent's log, in order, with its header name, node
/// and result.
fn check_every_ioctl(seen: &Seen, log: &str) {
    let want: Vec<(String, String, String)> = seen
        .expected
        .calls
        .iter()
        .filter_map(|c| match c {
            Call::Ioctl {
                target,
                request,
                status_offset,
                status,
                result,
                ..
            } => Some((
                header_name(target, *request).to_string(),
                node_field(target),
                result_field(*status_offset, *status, *result),
            )),
            _ => None,
        })
        .collect();
    let got: Vec<(String, String, String)> = seen
        .ioctls
        .iter()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (s("ioctl"), s("node"), s("result"))
        })
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "ioctls seen of pid {}; log:\n{log}",
        seen.pid
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "ioctl {i} of pid {}", seen.pid);
    }
}

fn agent_with(driver: &str) -> Agent {
    let a = Agent::start(&["--driver-version", driver]);
    let said = a.expect_event("driver_layout", |v| v["event"] == "driver_layout", T);
    assert_eq!(said["driver_version"], driver);
    a
}

#[test]
fn every_ioctl_of_the_real_captures_is_named_and_its_status_read_at_its_drivers_offset() {
    require_env!(
        "every_ioctl_of_the_real_captures_is_named_and_its_status_read_at_its_drivers_offset"
    );
    for (name, layout, selection) in [
        ("535.104.05-h100-cumemory", "535.104.05", "exact"),
        ("535.261.03-gpuless-qemu-cuinit", "535.261.03", "exact"),
        ("550.163.01-gpuless-qemu-cuinit", "550.163.01", "exact"),
        ("545.29.06-gtx1650ti-primer", "545.29.06", "exact"),
        ("555.42.02-gtx1080ti-fragment", "555.42.02", "exact"),
    ] {
        let run = replay_run(name, None);
        let driver = run.replay().driver.clone();
        let agent = agent_with(&driver);
        let said = agent.events("driver_layout").remove(0);
        assert_eq!(
            (said["layout"].as_str(), said["selection"].as_str()),
            (Some(layout), Some(selection))
        );
        let seen = replay(&agent, &run, FakeDevConfig::default(), Scenario::Success);
        check_every_ioctl(&seen, &agent.raw_log());
        assert_eq!(seen.end["result"], "CUDA_SUCCESS", "{name}");
        // Metrics: every call counted under a name, none unknown, no unread status.
        let m = agent.metrics();
        let counted: f64 = m
            .lines()
            .filter(|l| l.starts_with("uvmwatch_driver_ioctl_calls_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert_eq!(counted as usize, seen.ioctls.len(), "{name}:\n{m}");
        assert!(!m.contains("ioctl=\"unknown\""), "{name}:\n{m}");
        assert!(!m.contains("NV_STATUS_0x"), "{name}:\n{m}");
        assert_eq!(
            metric(
                &m,
                "uvmwatch_ioctl_layout_info",
                &[
                    ("driver_version", driver.as_str()),
                    ("layout", layout),
                    ("selection", selection)
                ]
            ),
            Some(1.0),
            "{m}"
        );
        assert!(agent.stop());
    }
}

/// The 545 run with the layouts of 590.48.01: UVM_FREE's status is read at 8, where the
/// 545 driver's 24-byte params hold the fill, so the agent reports no NV_OK there: the
/// offsets the agent loads decide what it reports. (That its table is right is checked by
/// the next test, against offsets written here from the headers, and by the unit tests of
/// `decode::layouts` against the headers and gVisor.)
#[test]
fn a_replay_read_with_another_drivers_layouts_shows_wrong_statuses() {
    require_env!("a_replay_read_with_another_drivers_layouts_shows_wrong_statuses");
    // Issued as 545 lays the params out ...
    let run = replay_run("545.29.06-gtx1650ti-primer", None);
    // ... read by an agent that believes the driver is 590.48.01.
    let agent = agent_with("590.48.01");
    let seen = replay(&agent, &run, FakeDevConfig::default(), Scenario::Success);
    let free = seen
        .ioctls
        .iter()
        .find(|v| v["ioctl"] == "UVM_FREE")
        .unwrap_or_else(|| panic!("no UVM_FREE; log:\n{}", agent.raw_log()));
    assert_eq!(free["result"], "NV_STATUS_0xeeeeeeee", "{free}");
}

/// The two commands whose layout differs between 535, 550 and 590, as
/// `(request, params size, rmStatus offset)`, worked out here from the headers
/// (`kernel-open/nvidia-uvm/uvm_ioctl.h` and `uvm_types.h` at each tag), not from the agent:
/// - `UVM_FREE_PARAMS` (0x22): `{NvU64 base; NvU64 length; NV_STATUS rmStatus;}` = 24/16
///   at 535.104.05 and 550.54.14; `{NvU64 base; NV_STATUS rmStatus;}` = 16/8 at 590.48.01.
/// - `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` (0x21): `base, length, offset` (24), then
///   `perGpuAttributes[UVM_MAX_GPUS]` of 36-byte `UvmGpuMappingAttributes`, then
///   `gpuAttributesCount` (8), `rmCtrlFd`, `hClient`, `hMemory` (12), `rmStatus`: 32 GPUs at
///   535.104.05 (24 + 1152 + 8 + 12 = 1196, size 1200), 256 (`UVM_MAX_GPUS_V2`) at
///   550.54.14 and 590.48.01 (24 + 9216 + 8 + 12 = 9260, size 9264).
fn from_the_headers(driver: &str) -> [(u32, u32, Option<u32>); 2] {
    match driver {
        "535.104.05" => [(0x22, 24, Some(16)), (0x21, 1200, Some(1196))],
        "550.54.14" => [(0x22, 24, Some(16)), (0x21, 9264, Some(9260))],
        "590.48.01" => [(0x22, 16, Some(8)), (0x21, 9264, Some(9260))],
        _ => unreachable!(),
    }
}

/// A status planted at the offset of each of three driver branches (535, 550, 590) in the
/// commands whose layout differs between them is reported with its name by an agent told
/// that version. The replay plants at the offsets written above from the headers, so a
/// wrong entry in the agent's table makes it read the fill instead.
#[test]
fn a_status_planted_at_the_535_550_and_590_offsets_is_reported_by_name() {
    require_env!("a_status_planted_at_the_535_550_and_590_offsets_is_reported_by_name");
    for driver in ["535.104.05", "550.54.14", "590.48.01"] {
        let agent = agent_with(driver);
        let headers = from_the_headers(driver);
        let mut table = layout_table(&version(driver));
        table.retain(|(r, _, _)| headers.iter().all(|(h, _, _)| h != r));
        table.extend(headers);
        for (request, name) in [(0x22, "UVM_FREE"), (0x21, "UVM_MAP_EXTERNAL_ALLOCATION")] {
            let capture = Replay::load("545.29.06-gtx1650ti-primer").unwrap();
            let run = ReplayRun::new(capture, &table)
                .unwrap()
                .plant(request, NV_ERR_NO_MEMORY);
            let seen = replay(&agent, &run, FakeDevConfig::default(), Scenario::Success);
            check_every_ioctl(&seen, &agent.raw_log());
            let failed = seen.ioctls.last().unwrap();
            assert_eq!(
                (
                    failed["ioctl"].as_str(),
                    failed["result"].as_str(),
                    failed["level"].as_str()
                ),
                (Some(name), Some("NV_ERR_NO_MEMORY"), Some("WARN")),
                "{driver}: {failed}"
            );
        }
        assert!(agent.stop());
    }
}

/// Real failing starts: `/dev/nvidia-uvm` fails (EIO on 580.95.05; EPERM in a CentOS 7
/// image on 450.80.02, whose opens are `open(2)`), is retried without `O_CLOEXEC`, and
/// `UVM_DEINITIALIZE` goes to fd = -errno. The agent sees the opens whatever the system call,
/// counts the call on `invalid_fd` with its `EBADF`, and keeps the open as the cuInit's
/// failure. 450 is older than every release in the table: the nearest one is used, and said.
#[test]
fn real_failing_starts_keep_the_failed_open_as_the_cause() {
    require_env!("real_failing_starts_keep_the_failed_open_as_the_cause");
    for (name, deny, errno, layout) in [
        (
            "580.95.05-rtx3060-uvm-eio",
            "nvidia-uvm=EIO",
            "EIO",
            "580.95.05",
        ),
        (
            "450.80.02-t4-centos7-uvm-eperm",
            "nvidia-uvm=EPERM",
            "EPERM",
            "515.43.04",
        ),
        (
            "535.261.03-gpuless-qemu-uvm-eacces",
            "nvidia-uvm=EACCES",
            "EACCES",
            "535.261.03",
        ),
    ] {
        let run = replay_run(name, None);
        let driver = run.replay().driver.clone();
        let agent = agent_with(&driver);
        let said = agent.events("driver_layout").remove(0);
        assert_eq!(said["layout"], layout, "{said}");
        let dev = FakeDevConfig {
            deny: vec![deny.parse().unwrap()],
            ..FakeDevConfig::default()
        };
        let seen = replay(&agent, &run, dev, Scenario::Success);
        check_every_ioctl(&seen, &agent.raw_log());
        let deinit = seen
            .ioctls
            .iter()
            .find(|v| v["ioctl"] == "UVM_DEINITIALIZE")
            .unwrap();
        assert_eq!(
            (
                deinit["ioctl"].as_str(),
                deinit["node"].as_str(),
                deinit["result"].as_str()
            ),
            (Some("UVM_DEINITIALIZE"), Some("invalid_fd"), Some("EBADF"))
        );
        let failed_opens: Vec<Value> = agent
            .events("device_open_failed")
            .into_iter()
            .filter(|v| v["pid"].as_u64() == Some(seen.pid as u64))
            .collect();
        assert_eq!(failed_opens.len(), 2, "{}", agent.raw_log());
        assert!(failed_opens.iter().all(|v| v["errno"] == errno));
        assert_eq!(
            seen.end["failed_call"], "open /dev/nvidia-uvm",
            "{}",
            seen.end
        );
        assert_eq!(seen.end["failed_result"], errno);
        let m = agent.metrics();
        let uvm_opens = metric(
            &m,
            "uvmwatch_device_opens_total",
            &[("node", "nvidia-uvm"), ("result", errno)],
        );
        assert_eq!(uvm_opens, Some(2.0), "{m}");
        assert_eq!(
            metric(
                &m,
                "uvmwatch_driver_ioctl_calls_total",
                &[
                    ("node", "invalid_fd"),
                    ("ioctl", "UVM_DEINITIALIZE"),
                    ("result", "EBADF")
                ]
            ),
            Some(1.0),
            "{m}"
        );
        assert!(agent.stop());
    }
}

/// Writes the open module's version line for `version` below the fake host root `root`, or
/// removes it (`None`: the driver unloaded).
fn write_version_file(root: &std::path::Path, version: Option<&str>) {
    let dir = root.join("proc/driver/nvidia");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("version");
    match version {
        Some(v) => {
            // Written whole then renamed: the agent never reads half a line.
            let tmp = dir.join(".version.tmp");
            std::fs::write(
                &tmp,
                format!("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\nGCC version:  gcc version 12.3.0\n"),
            )
            .unwrap();
            std::fs::rename(&tmp, &file).unwrap();
        }
        None => {
            let _ = std::fs::remove_file(&file);
        }
    }
}

/// The series of `uvmwatch_ioctl_layout_info` in `m`.
fn layout_series(m: &str) -> Vec<String> {
    m.lines()
        .filter(|l| l.starts_with("uvmwatch_ioctl_layout_info{"))
        .map(str::to_string)
        .collect()
}

/// A driver reload seen through the version file below `--host-root`: the kernel side reads
/// UVM_FREE's status at the new driver's offset (16 on 580, 8 on 590) once the agent has
/// seen the new version, `uvmwatch_ioctl_layout_info` keeps exactly one series through every
/// change, and an unloaded driver is said as `unknown` / `newest`.
#[test]
fn a_driver_reload_changes_the_layouts_the_kernel_reads_with() {
    require_env!("a_driver_reload_changes_the_layouts_the_kernel_reads_with");
    let root = tempfile::tempdir().unwrap();
    write_version_file(root.path(), Some("580.95.05"));
    let agent = Agent::start(&["--host-root", root.path().to_str().unwrap()]);
    let said = agent.expect_event("driver_layout", |v| v["event"] == "driver_layout", T);
    assert_eq!(
        (said["driver_version"].as_str(), said["selection"].as_str()),
        (Some("580.95.05"), Some("exact")),
        "{said}"
    );
    for (driver, n) in [("580.95.05", 1), ("590.48.01", 2)] {
        if n > 1 {
            write_version_file(root.path(), Some(driver));
            agent.expect_event(
                "driver_layout",
                |v| v["event"] == "driver_layout" && v["driver_version"] == driver,
                Duration::from_secs(10),
            );
        }
        let run =
            replay_run("545.29.06-gtx1650ti-primer", Some(driver)).plant(0x22, NV_ERR_NO_MEMORY);
        let seen = replay(&agent, &run, FakeDevConfig::default(), Scenario::Success);
        check_every_ioctl(&seen, &agent.raw_log());
        let failed = seen.ioctls.last().unwrap();
        assert_eq!(
            (failed["ioctl"].as_str(), failed["result"].as_str()),
            (Some("UVM_FREE"), Some("NV_ERR_NO_MEMORY")),
            "{driver}: {failed}"
        );
        let m = agent.metrics();
        assert_eq!(
            layout_series(&m),
            [format!(
                "uvmwatch_ioctl_layout_info{{driver_version=\"{driver}\",layout=\"{driver}\",selection=\"exact\"}} 1"
            )],
            "{m}"
        );
        assert_eq!(agent.events("driver_layout").len(), n);
    }
    // Unloaded: the newest layouts, the version unknown, still one series.
    write_version_file(root.path(), None);
    let said = agent.expect_event(
        "driver_layout",
        |v| v["event"] == "driver_layout" && v["driver_version"] == "unknown",
        Duration::from_secs(10),
    );
    assert_eq!(said["selection"], "newest", "{said}");
    std::thread::sleep(Duration::from_millis(200));
    let m = agent.metrics();
    let series = layout_series(&m);
    assert_eq!(series.len(), 1, "{m}");
    assert!(
        series[0].contains("driver_version=\"unknown\"")
            && series[0].contains("selection=\"newest\""),
        "{m}"
    );
    assert!(agent.stop());
}

/// A command the new driver no longer dispatches reads no status after the reload: 595
/// removed `UVM_ENABLE_SYSTEM_WIDE_ATOMICS` (0x36, status at 16 on 590), so once the agent
/// has moved from 590.48.01 to 595.45.04 its `CMDS` entry must be gone and the call, issued
/// with the 0xEE fill and no status planted, reported `OK` rather than `NV_STATUS_0xeeeeeeee`.
/// A hand-written sequence (not a capture), only for this check.
#[test]
fn a_command_gone_from_the_new_driver_reads_no_stale_status() {
    require_env!("a_command_gone_from_the_new_driver_reads_no_stale_status");
    const ATOMICS: u32 = 0x36;
    let text = "source https://github.com/NVIDIA/open-gpu-kernel-modules hand-written for a test\n\
                driver 590.48.01\nrecorder hand\ncoverage partial\n\
                open /dev/nvidiactl O_RDWR openat -> fd 3\n\
                open /dev/nvidia-uvm O_RDWR|O_CLOEXEC openat -> fd 4\n\
                ioctl 4 0x30000001 size 16\n\
                ioctl 4 0x36 size 20\n";
    let run_for = |driver: &str| {
        let replay = Replay::parse("atomics", "atomics.replay", text).unwrap();
        ReplayRun::new(replay, &layout_table(&version(driver)))
            .unwrap()
            .plant(ATOMICS, NV_ERR_NO_MEMORY)
    };
    let root = tempfile::tempdir().unwrap();
    write_version_file(root.path(), Some("590.48.01"));
    let agent = Agent::start(&["--host-root", root.path().to_str().unwrap()]);
    agent.expect_event(
        "driver_layout",
        |v| v["event"] == "driver_layout" && v["driver_version"] == "590.48.01",
        T,
    );
    for (driver, want) in [("590.48.01", "NV_ERR_NO_MEMORY"), ("595.45.04", "OK")] {
        if driver != "590.48.01" {
            write_version_file(root.path(), Some(driver));
            agent.expect_event(
                "driver_layout",
                |v| v["event"] == "driver_layout" && v["driver_version"] == driver,
                Duration::from_secs(10),
            );
        }
        let seen = replay(
            &agent,
            &run_for(driver),
            FakeDevConfig::default(),
            Scenario::Success,
        );
        let call = seen
            .ioctls
            .iter()
            .find(|v| v["ioctl"] == "UVM_ENABLE_SYSTEM_WIDE_ATOMICS")
            .unwrap_or_else(|| panic!("{driver}: no 0x36 call; log:\n{}", agent.raw_log()));
        assert_eq!(call["result"], want, "{driver}: {call}");
    }
    assert!(agent.stop());
}

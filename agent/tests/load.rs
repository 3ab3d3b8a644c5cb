//! The agent under load: a process flooding it with failed driver calls (an ioctl the VFS
//! refuses before any driver sees it, on a tracked `/dev/nvidia-uvm` fd, as fast as one core
//! issues it) while another process hangs in `UVM_REGISTER_GPU`. The hang must be reported
//! within its threshold plus 250 ms, `/healthz` must stay 200 and `/readyz` ready, and the
//! flood must not turn into one log line per call. Root only; single-threaded. The figures
//! (flood rate, detection delay, log lines) are printed; `cargo xtask soak` runs more of this
//! for longer.

mod common;

use std::time::{Duration, Instant};

use common::{artifacts, metric, Agent};
use uvmwatch_testbed::{FakeDev, FakeDevConfig, IoctlAction, IoctlRule, Scenario, Workload};

const T: Duration = Duration::from_secs(30);

fn spawn(dev: &FakeDev, scenario: Scenario, args: &[&str]) -> Workload {
    common::spawn_workload(dev, scenario, 1500, args)
}

#[test]
fn a_hang_is_reported_in_time_under_a_flood_of_failed_calls() {
    require_env!("a_hang_is_reported_in_time_under_a_flood_of_failed_calls");
    let agent = Agent::start(&["--ioctl-stall", "1s", "--cuinit-stall", "2s"]);
    let flood_dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let hang_dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut flood = spawn(&flood_dev, Scenario::Success, &["--flood-ms", "7000"]);
    let flood_pid = flood.pid();
    assert_eq!(flood.next_cuinit_line(T).unwrap().rc, 0);
    // The flood runs; a second process hangs in UVM_REGISTER_GPU meanwhile.
    let hang = spawn(&hang_dev, Scenario::HangRegisterGpu, &[]);
    let hang_pid = hang.pid();
    let start = Instant::now();
    let mut health = Vec::new();
    let stall = loop {
        health.push((agent.get("/healthz").0, agent.get("/readyz").0));
        if let Some(v) = agent.wait_event(
            |v| {
                v["event"] == "stall"
                    && v["pid"].as_u64() == Some(hang_pid as u64)
                    && v["call"] == "UVM_REGISTER_GPU"
            },
            Duration::ZERO,
        ) {
            break v;
        }
        assert!(
            start.elapsed() < T,
            "no stall of the hung call within {T:?}:\n{}",
            agent
                .raw_log()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = flood.wait_timeout(T).unwrap();
    let rate = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("flood="))
        .unwrap_or_else(|| panic!("no flood line: {out:?}"))
        .to_string();
    let delay_ms = stall["detect_delay_ms"].as_f64().unwrap();
    let m = agent.metrics();
    let flood_calls = metric(
        &m,
        "uvmwatch_driver_ioctl_calls_total",
        &[
            ("node", "nvidia-uvm"),
            ("ioctl", "unknown"),
            ("result", "EBADF"),
        ],
    )
    .unwrap_or(0.0);
    let lines = agent.count(|v| v["pid"].as_u64() == Some(flood_pid as u64));
    let dropped = metric(&m, "uvmwatch_events_dropped_total", &[]).unwrap_or(0.0);
    eprintln!(
        "load: flood={rate}; counted {flood_calls} failed calls; stall reported {delay_ms:.0} ms \
         after its threshold; {lines} log records of the flooding process; {dropped} events dropped"
    );
    assert!(
        delay_ms <= 250.0,
        "stall reported {delay_ms} ms after its threshold: {stall}"
    );
    assert!(
        health.iter().all(|(h, r)| *h == 200 && *r == 200),
        "health during the flood (healthz, readyz): {health:?}"
    );
    assert!(
        lines < 1000,
        "{lines} log records for one flooding process (calls: {flood_calls})"
    );
    drop(hang);
    hang_dev.release().unwrap();
    assert!(agent.stop());
}

//! Every way the kernel side could lose something, provoked, and the counter that says so:
//! an open whose path is not paged in at entry (identified at exit by the file it returned:
//! seen, not lost), thousands of distinct ioctl numbers (they share one aggregate key:
//! nothing fills, a real failure after them is still counted), and more copies of NVIDIA fds
//! than any kernel map holds (no fd is tracked: each is identified by its file, and nothing
//! fills). The event flood and its throttle are in `load.rs`. Root only; single-threaded.

mod common;

use std::time::Duration;

use common::{artifacts, metric, Agent};
use uvmwatch_testbed::{FakeDev, FakeDevConfig, Scenario, Workload};

const T: Duration = Duration::from_secs(30);

fn run(dev: &FakeDev, scenario: Scenario, args: &[&str]) -> String {
    let mut w = common::spawn_workload(dev, scenario, 1500, args);
    w.next_cuinit_line(T).expect("cuInit line");
    let out = w.wait_timeout(T).expect("workload exits");
    out.stdout
}

/// The sum of a family's series whose labels include `labels`.
fn sum(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            let rest = rest.trim_end_matches('}');
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.split(',').any(|p| p == format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// Waits until the metrics satisfy `ok` (the kernel's aggregates are read at each scrape).
fn metrics_when(agent: &Agent, ok: impl Fn(&str) -> bool) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let m = agent.metrics();
        if ok(&m) || std::time::Instant::now() > end {
            return m;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Successful opens of `/dev/nvidia-uvm` counted so far.
fn uvm_opens(agent: &Agent) -> f64 {
    metric(
        &agent.metrics(),
        "uvmwatch_device_opens_total",
        &[("node", "nvidia-uvm"), ("result", "success")],
    )
    .unwrap_or(0.0)
}

#[test]
fn an_open_whose_path_is_not_paged_in_is_still_seen() {
    require_env!("an_open_whose_path_is_not_paged_in_is_still_seen");
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    // The same start-up without and then with the cold open: the second counts exactly one
    // open of /dev/nvidia-uvm more than the first.
    run(&dev, Scenario::Success, &[]);
    std::thread::sleep(Duration::from_millis(200));
    let plain = uvm_opens(&agent);
    assert!(plain > 0.0, "the start-up's own opens were not counted");
    let out = run(&dev, Scenario::Success, &["--cold-open"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("cold_open "))
        .unwrap_or_else(|| panic!("no cold_open line: {out}"));
    assert!(line.ends_with("ioctl_errno=9"), "{line}");
    // The only EBADF on /dev/nvidia-uvm is the FICLONE on the fd of the cold open: seen
    // only if the open was.
    let m = metrics_when(&agent, |m| {
        metric(
            m,
            "uvmwatch_driver_ioctl_calls_total",
            &[("node", "nvidia-uvm"), ("result", "EBADF")],
        )
        .is_some()
    });
    assert_eq!(
        metric(
            &m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("node", "nvidia-uvm"),
                ("ioctl", "unknown"),
                ("result", "EBADF")
            ]
        ),
        Some(1.0),
        "the call on the cold open's fd:\n{m}"
    );
    assert_eq!(
        metric(&m, "uvmwatch_device_open_paths_unreadable_total", &[]),
        Some(0.0)
    );
    let with_cold = uvm_opens(&agent) - plain;
    assert_eq!(
        with_cold,
        plain + 1.0,
        "the cold open was not counted: {plain} opens without it, {with_cold} with it"
    );
    assert!(agent.stop());
}

#[test]
fn thousands_of_distinct_ioctl_numbers_fill_nothing_and_later_failures_are_counted() {
    require_env!("thousands_of_distinct_ioctl_numbers_fill_nothing_and_later_failures_are_counted");
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let out = run(&dev, Scenario::Success, &["--distinct-cmds", "3000"]);
    assert!(out.contains("distinct_cmds=3000"), "{out}");
    // Then a real failure: UVM_REGISTER_GPU -> NV_ERR_NO_MEMORY.
    let out = run(&dev, Scenario::RegisterGpuNoMemory, &[]);
    assert!(out.contains("cuInit=3"), "{out}");
    let m = metrics_when(&agent, |m| {
        metric(
            m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("ioctl", "UVM_REGISTER_GPU"),
                ("result", "NV_ERR_NO_MEMORY"),
            ],
        )
        .is_some()
    });
    let unknown = sum(
        &m,
        "uvmwatch_driver_ioctl_calls_total",
        &[("node", "nvidia-uvm"), ("ioctl", "unknown")],
    );
    eprintln!("measured: 3000 distinct numbers counted as {unknown} unknown calls");
    assert_eq!(unknown, 3000.0, "{m}");
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
    for map in uvmwatch_common::counter::MAP_FULL.map(|(_, m)| m) {
        assert_eq!(
            metric(&m, "uvmwatch_kernel_map_full_total", &[("map", map)]),
            Some(0.0),
            "map {map}"
        );
    }
    assert!(agent.stop());
}

#[test]
fn more_fd_copies_than_any_map_holds_are_each_identified() {
    require_env!("more_fd_copies_than_any_map_holds_are_each_identified");
    let agent = Agent::start(&[]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    // 120000 copies of /dev/nvidia-uvm fds held at once (more than any map of the kernel
    // side holds); one process may hold only RLIMIT_NOFILE's hard limit (root here cannot
    // raise it: no CAP_SYS_RESOURCE), so four processes hold theirs at once. Each then calls
    // FICLONE on its last copy.
    let mut ws: Vec<Workload> = (0..4)
        .map(|_| {
            common::spawn_workload(
                &dev,
                Scenario::Success,
                1500,
                &["--dup-fds", "30000", "--hold-ms", "4000"],
            )
        })
        .collect();
    let mut held = 0u64;
    for w in &mut ws {
        w.next_cuinit_line(T).expect("cuInit line");
        let out = w.wait_timeout(T).expect("workload exits");
        held += out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("dup_fds="))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no dup_fds line: {}", out.stdout));
        let ioctl = out
            .stdout
            .lines()
            .find(|l| l.starts_with("dup_ioctl "))
            .unwrap_or_else(|| panic!("no dup_ioctl line: {}", out.stdout));
        assert!(ioctl.ends_with("errno=9"), "{ioctl}");
    }
    assert!(held > 70_000, "only {held} fds held");
    // The only EBADFs on /dev/nvidia-uvm are the four FICLONEs on the last copies, each
    // seen only if its fd (tens of thousands after the open) was identified.
    let ebadf = |m: &str| {
        metric(
            m,
            "uvmwatch_driver_ioctl_calls_total",
            &[
                ("node", "nvidia-uvm"),
                ("ioctl", "unknown"),
                ("result", "EBADF"),
            ],
        )
        .unwrap_or(0.0)
    };
    let m = metrics_when(&agent, |m| ebadf(m) >= 4.0);
    eprintln!(
        "measured: {held} fds held at once, {} calls on the last copies seen",
        ebadf(&m)
    );
    assert_eq!(ebadf(&m), 4.0, "{m}");
    for map in uvmwatch_common::counter::MAP_FULL.map(|(_, m)| m) {
        assert_eq!(
            metric(&m, "uvmwatch_kernel_map_full_total", &[("map", map)]),
            Some(0.0),
            "map {map}"
        );
    }
    assert!(agent.stop());
}

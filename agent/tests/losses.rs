//! Every way the kernel side could lose something, provoked, and the counter that says so:
//! an open whose path is not paged in at entry (identified at exit by the file it returned:
//! seen, not lost), thousands of distinct ioctl numbers (they share one aggregate key:
//! nothing fills, a real failure after them is still counted), and more copies of NVIDIA fds
//! than any kernel map holds (no fd is tracked: each is identified by its file, and nothing
//! fills), and more threads holding an open than the map of opens in flight has entries (an
//! open whose start was recycled is counted at its exit). The event flood and its throttle
//! are in `load.rs`. Root only; single-threaded.

mod common;

use std::{
    sync::atomic::{AtomicI32, AtomicUsize, Ordering},
    time::Duration,
};

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

/// Entries of the kernel side's `PENDING_OPEN` (agent-ebpf/src/maps.rs), and threads enough
/// past it that the map must recycle the oldest entries.
const PENDING_OPEN_ENTRIES: usize = 16384;
const FLOOD_THREADS: usize = PENDING_OPEN_ENTRIES + 4096;

extern "C" fn on_usr1(_: libc::c_int) {}

static FLOOD_OPENED: AtomicUsize = AtomicUsize::new(0);
static FLOOD_PIPE: AtomicI32 = AtomicI32::new(-1);

/// One thread of the flood: an open (its start stays in the map while the thread lives),
/// then a read that returns when the pipe's write end is closed.
extern "C" fn flood_thread(_: *mut libc::c_void) -> *mut libc::c_void {
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        libc::close(fd);
        FLOOD_OPENED.fetch_add(1, Ordering::SeqCst);
        let mut b = 0u8;
        libc::read(
            FLOOD_PIPE.load(Ordering::SeqCst),
            (&mut b as *mut u8).cast(),
            1,
        );
    }
    std::ptr::null_mut()
}

#[test]
fn an_open_whose_start_the_map_recycled_is_counted_at_its_exit() {
    require_env!("an_open_whose_start_the_map_recycled_is_counted_at_its_exit");
    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let in_use = std::fs::read_dir("/proc")
        .map(|d| d.count())
        .unwrap_or(usize::MAX / 2);
    if pid_max < FLOOD_THREADS + in_use * 4 + 2048 {
        uvmwatch_testbed::skip(
            "an_open_whose_start_the_map_recycled_is_counted_at_its_exit",
            &format!("kernel.pid_max is {pid_max}: too few for {FLOOD_THREADS} threads"),
        );
        return;
    }
    let agent = Agent::start(&[]);
    let unfollowed =
        |m: &str| metric(m, "uvmwatch_opens_unfollowed_total", &[]).expect("the family");
    let before = unfollowed(&agent.metrics());

    // A thread blocked in its open (a FIFO's read end waits for a writer), its start in the
    // map; SIGUSR1, with a handler and no SA_RESTART, later ends the open with EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let blocked = std::thread::spawn(move || {
        tx.send(unsafe { (libc::pthread_self(), libc::gettid()) })
            .unwrap();
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) };
        (fd, std::io::Error::last_os_error().raw_os_error())
    });
    let (handle, tid) = rx.recv().unwrap();
    // Until it sits in the open (`openat`, the syscall glibc's `open` makes).
    let end = std::time::Instant::now() + T;
    let in_open = format!("{} ", libc::SYS_openat);
    while !std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
        .is_ok_and(|s| s.starts_with(&in_open))
    {
        assert!(std::time::Instant::now() < end, "the open never blocked");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Live threads, each with an open of its own in the map, more than it holds: plain
    // pthreads on the smallest stack (Rust's threads add a signal stack each, two more
    // mappings: past `vm.max_map_count`), blocked reading a pipe until it is closed.
    let mut pipe = [0; 2];
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    FLOOD_PIPE.store(pipe[0], Ordering::SeqCst);
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, libc::PTHREAD_STACK_MIN);
    }
    let flood: Vec<libc::pthread_t> = (0..FLOOD_THREADS)
        .map(|i| {
            let mut t: libc::pthread_t = 0;
            let rc =
                unsafe { libc::pthread_create(&mut t, &attr, flood_thread, std::ptr::null_mut()) };
            assert_eq!(rc, 0, "thread {i} of {FLOOD_THREADS}");
            t
        })
        .collect();
    while FLOOD_OPENED.load(Ordering::SeqCst) < FLOOD_THREADS {
        assert!(
            std::time::Instant::now() < end + T,
            "the threads did not open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    unsafe { libc::pthread_kill(handle, libc::SIGUSR1) };
    let (fd, errno) = blocked.join().unwrap();
    assert_eq!((fd, errno), (-1, Some(libc::EINTR)));
    unsafe { libc::close(pipe[1]) };
    for t in flood {
        unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
    }
    unsafe { libc::close(pipe[0]) };

    let m = metrics_when(&agent, |m| unfollowed(m) > before);
    let counted = unfollowed(&m) - before;
    eprintln!("measured: {FLOOD_THREADS} threads with an open each; {counted} opens unfollowed");
    assert!(
        counted >= 1.0,
        "the interrupted open, its start recycled, was not counted:\n{m}"
    );
    assert!(agent.stop());
}

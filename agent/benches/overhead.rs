//! `cargo bench -p uvmwatch --bench overhead`: what the agent costs the rest of the host,
//! against what its kernel mechanism costs at least.
//!
//! Three modes side by side in one run, in interleaved rounds (the order rotates each round,
//! so drift on a busy machine spreads over all three):
//! - **no agent**;
//! - **the agent**: the real `uvmwatch run` binary;
//! - **the floor** of the same backend: `uvmwatch bench-floor`, the agent's loader attaching
//!   one program that does one map operation (`agent-ebpf/src/probes/floor.rs`) to every
//!   tracepoint the agent attaches. Floor/no-agent is what the mechanism costs; agent/floor
//!   is what the agent's program bodies add on top.
//!
//! Each mode runs four syscall loops that any process on the host makes (`getpid` through
//! `syscall(2)`, a 1-byte `read` of `/dev/zero`, `ioctl(FIONREAD)` on a pipe, `open`+`close`
//! of `/dev/null`) and, with the test doubles (`uvmwatch-testbed`: the FUSE nodes at
//! `/dev/nvidia*` in a private mount namespace and the fake libcuda), one `cuda-workload`
//! whose `cuInit` replays a real start and which then floods its tracked `/dev/nvidia-uvm` fd
//! with `ioctl(FIONREAD)` (answered by the VFS: a traced driver call without driver time).
//! The agent's CPU (utime+stime) and peak RSS (VmHWM) are read from `/proc` before it stops.
//!
//! Prints ns per call (medians over rounds, with the range), then one line per backend
//! `overhead <kernel> <backend>: getpid R, read R, ioctl R, open+close R` (agent/no agent),
//! the same for `floor` and `agent/floor`. Needs root; without root it says so and exits 0.
//! `UVMWATCH_BENCH_ROUNDS` and `UVMWATCH_BENCH_ITERS` change the rounds (5) and the calls
//! per loop (200000). docs/testing.md says how to read it.
//!
//! Then, per backend, the agent's lifecycle ([`lifecycle`]): attach time of new libcuda files
//! and stop time with them probed. `UVMWATCH_BENCH_LIBCUDAS` sets how many files (100),
//! `UVMWATCH_BENCH_LIBCUDA` the library copied (the test double's by default).

use std::{
    ffi::CString,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

#[path = "overhead/lifecycle.rs"]
mod lifecycle;

use uvmwatch_testbed::{
    build_artifacts, check_environment, Artifacts, FakeDev, FakeDevConfig, Workload, WorkloadConfig,
};

/// Loop repetitions per mode and round; the round keeps their median.
const REPS: usize = 3;
/// How long each workload floods its `/dev/nvidia-uvm` fd.
const FLOOD_MS: u64 = 500;
/// Between the library's load and `cuInit`: the agent attaches its uprobes when it sees the
/// library mapped, which can take up to a second (`testbed::WorkloadConfig`).
const WAIT_MS: u64 = 1500;
/// How long a stopping agent may take (docs/probes.md#attaching-and-detaching-libcuda-files).
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// A kernel-side backend of the agent: the flags that select it for `uvmwatch run` and for
/// its floor `uvmwatch bench-floor`. A second backend is one more entry, and one more
/// column and `overhead` line.
struct Backend {
    name: &'static str,
    run_args: &'static [&'static str],
    floor_args: &'static [&'static str],
}

/// The backends measured: fentry/fexit on the kernel functions (where the kernel allows
/// trampolines; a kernel that refuses them is said and the backend left out) and the
/// syscall tracepoints.
const BACKENDS: &[Backend] = &[
    Backend {
        name: "fentry",
        run_args: &["--probe-backend", "fentry"],
        floor_args: &["--probe-backend", "fentry"],
    },
    Backend {
        name: "tracepoint",
        run_args: &["--probe-backend", "tracepoint"],
        floor_args: &["--probe-backend", "tracepoint"],
    },
];

/// Whether `backend` attaches here: its floor starts and says so (`Err`: the kernel's
/// refusal, as `uvmwatch bench-floor` prints it).
fn backend_attaches(bin: &str, backend: &Backend) -> Result<(), String> {
    let out = Command::new(bin)
        .args(["--log-format", "json", "bench-floor"])
        .args(backend.floor_args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = out;
    let mut first = String::new();
    if let Some(o) = out.stdout.take() {
        let _ = BufReader::new(o).read_line(&mut first);
    }
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(out.id() as i32, libc::SIGTERM) };
    let _ = out.wait();
    if first.starts_with("floor: attached ") {
        Ok(())
    } else {
        Err(first.trim().trim_start_matches("floor: ").to_string())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Bare,
    /// The agent with `BACKENDS[i]`.
    Agent(usize),
    /// The floor of `BACKENDS[i]`.
    Floor(usize),
}

impl Mode {
    fn label(self) -> String {
        match self {
            Mode::Bare => "no agent".into(),
            Mode::Agent(b) => format!("agent ({})", BACKENDS[b].name),
            Mode::Floor(b) => format!("floor ({})", BACKENDS[b].name),
        }
    }
}

/// A syscall loop: `iters` calls, returning ns per call.
type Loop = fn(usize) -> f64;

/// One figure of a [`Sample`], when it was measured.
type Measure = Box<dyn Fn(&Sample) -> Option<f64>>;

/// The syscall loops.
const LOOPS: [(&str, Loop); 4] = [
    ("getpid", getpid),
    ("read", read_byte),
    ("ioctl", ioctl_pipe),
    ("open+close", open_close),
];

fn per_call(t: Instant, iters: usize) -> f64 {
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// `syscall(SYS_getpid)`: the raw syscall, not a cached libc value.
fn getpid(iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: getpid takes no arguments.
        std::hint::black_box(unsafe { libc::syscall(libc::SYS_getpid) });
    }
    per_call(t, iters)
}

/// `read` of 1 byte from `/dev/zero`.
fn read_byte(iters: usize) -> f64 {
    let p = CString::new("/dev/zero").unwrap();
    // SAFETY: valid path; the fd is closed below.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open /dev/zero");
    let mut b = 0u8;
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: one byte into `b`.
        unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
    }
    let ns = per_call(t, iters);
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
    ns
}

/// `ioctl(FIONREAD)` on a pipe (an fd the agent does not track).
fn ioctl_pipe(iters: usize) -> f64 {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let mut n: libc::c_int = 0;
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(fds[0], libc::FIONREAD, &mut n) };
    }
    let ns = per_call(t, iters);
    // SAFETY: closing our own pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    ns
}

/// `openat("/dev/null")` + `close`.
fn open_close(iters: usize) -> f64 {
    let p = CString::new("/dev/null").unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: valid path; the fd is closed right away.
        unsafe {
            let fd = libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            libc::close(fd);
        }
    }
    per_call(t, iters)
}

/// The middle value (the upper middle of an even count); NaN for none.
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// What one mode measured in one round.
#[derive(Clone, Default)]
struct Sample {
    /// ns per call of each of [`LOOPS`].
    loops: [f64; 4],
    /// ns per successful ioctl on a tracked `/dev/nvidia-uvm` fd.
    nv_ioctl: Option<f64>,
    /// ns of one fake `cuInit` (its opens and driver calls on the FUSE nodes).
    cuinit: Option<f64>,
    /// The agent's CPU while measured and in its start, its peak RSS, whether its uprobes
    /// attached before the workload's `cuInit`; the floor's program runs.
    proc_info: Option<ProcInfo>,
}

#[derive(Clone, Default)]
struct ProcInfo {
    start_cpu_s: f64,
    cpu_s: f64,
    wall_s: f64,
    hwm_kib: Option<u64>,
    /// VmRSS just before the stop: what the agent holds while it runs.
    rss_kib: Option<u64>,
    libcuda_attached: bool,
    floor_hits: Option<u64>,
}

/// `uvmwatch run` or `uvmwatch bench-floor`, started and ready.
struct Running {
    child: Child,
    ready_at: Instant,
    ready_cpu_s: f64,
    libcuda_attached: Arc<AtomicUsize>,
    floor_out: Option<mpsc::Receiver<String>>,
}

/// utime+stime of `pid` in seconds, from `/proc/<pid>/stat` (fields 14 and 15, in clock
/// ticks: proc(5)).
fn cpu_s(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    f.iter().sum::<u64>() as f64 / hz
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`: peak resident memory).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A free TCP port on loopback, for an agent's `--listen`.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(mode: Mode, bin: &str) -> Option<Running> {
    let libcuda_attached = Arc::new(AtomicUsize::new(0));
    let (child, floor_out) = match mode {
        Mode::Bare => return None,
        Mode::Agent(b) => {
            let port = free_port();
            let mut child = Command::new(bin)
                .args(["--log-format", "json", "run", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(BACKENDS[b].run_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start uvmwatch run");
            let (tx, rx) = mpsc::channel();
            let seen = libcuda_attached.clone();
            let stderr = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if l.contains("\"event\":\"started\"") {
                        let _ = tx.send(());
                    } else if l.contains("\"event\":\"libcuda_attached\"") {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            rx.recv_timeout(Duration::from_secs(60))
                .expect("uvmwatch run did not log `started` within 60 s");
            (child, None)
        }
        Mode::Floor(b) => {
            let mut child = Command::new(bin)
                .args(["--log-format", "json", "bench-floor"])
                .args(BACKENDS[b].floor_args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start uvmwatch bench-floor");
            let (tx, rx) = mpsc::channel();
            let stdout = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            let first = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("uvmwatch bench-floor did not attach within 60 s");
            assert!(
                first.starts_with("floor: attached "),
                "bench-floor: {first}"
            );
            eprintln!("  ({first})");
            (child, Some(rx))
        }
    };
    // Let the agent's start-up work (process scan, first reads) settle.
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id();
    Some(Running {
        child,
        ready_at: Instant::now(),
        ready_cpu_s: cpu_s(pid),
        libcuda_attached,
        floor_out,
    })
}

fn stop(mut r: Running) -> ProcInfo {
    let pid = r.child.id();
    let cpu = cpu_s(pid);
    let info = ProcInfo {
        start_cpu_s: r.ready_cpu_s,
        cpu_s: cpu - r.ready_cpu_s,
        wall_s: r.ready_at.elapsed().as_secs_f64(),
        hwm_kib: status_kib(pid, "VmHWM:"),
        rss_kib: status_kib(pid, "VmRSS:"),
        libcuda_attached: r.libcuda_attached.load(Ordering::SeqCst) > 0,
        floor_hits: None,
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let end = Instant::now() + STOP_WITHIN;
    while r.child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = r.child.kill();
            panic!("{pid} still running {STOP_WITHIN:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let floor_hits = r.floor_out.and_then(|rx| {
        rx.iter()
            .find_map(|l| l.strip_prefix("floor: hits ")?.parse().ok())
    });
    ProcInfo { floor_hits, ..info }
}

/// The test doubles: one FUSE server for the whole run, a workload per mode and round.
struct Testbed {
    _dir: tempfile::TempDir,
    artifacts: Artifacts,
    dev: FakeDev,
}

impl Testbed {
    fn new() -> Result<Testbed, String> {
        check_environment()?;
        let dir = tempfile::Builder::new()
            .prefix("uvmwatch-bench-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let artifacts = build_artifacts(dir.path()).map_err(|e| format!("{e:#}"))?;
        let dev =
            FakeDev::start(&artifacts, FakeDevConfig::default()).map_err(|e| format!("{e:#}"))?;
        Ok(Testbed {
            _dir: dir,
            artifacts,
            dev,
        })
    }

    /// One workload: (ns per traced ioctl, ns of `cuInit`).
    fn run(&self) -> (f64, f64) {
        let mut w = Workload::spawn_with_args(
            &self.dev,
            &self.artifacts,
            WorkloadConfig {
                wait_ms: WAIT_MS,
                ..WorkloadConfig::default()
            },
            &[
                "--time-init",
                "--flood-ok",
                "--flood-ms",
                &FLOOD_MS.to_string(),
            ],
        )
        .expect("spawn cuda-workload");
        let out = w.wait_timeout(Duration::from_secs(60)).expect("workload");
        assert!(out.status.success(), "cuda-workload: {out:?}");
        let field = |line: &str, key: &str| -> Option<f64> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(key))?
                .parse()
                .ok()
        };
        let lines: Vec<&str> = out.stdout.lines().collect();
        let init_ns = lines
            .iter()
            .find_map(|l| field(l, "init_ns="))
            .expect("init_ns line");
        let per_second = lines
            .iter()
            .filter(|l| l.starts_with("flood="))
            .find_map(|l| field(l, "per_second="))
            .expect("flood line");
        (1e9 / per_second, init_ns)
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn main() {
    // cargo bench passes --bench; nothing else is read from the arguments.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("overhead: SKIPPED (needs root to load the agent's eBPF programs)");
        return;
    }
    // UVMWATCH_BENCH_AGENT: another uvmwatch binary (vm-test runs this bench inside its VMs).
    let bin_path = std::env::var("UVMWATCH_BENCH_AGENT")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_uvmwatch").to_string());
    let bin = bin_path.as_str();
    let rounds = env_usize("UVMWATCH_BENCH_ROUNDS", 5);
    let iters = env_usize("UVMWATCH_BENCH_ITERS", 200_000);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let testbed = match Testbed::new() {
        Ok(t) => Some(t),
        Err(why) => {
            println!("overhead: traced ioctl and cuInit SKIPPED ({why})");
            None
        }
    };

    let mut modes = vec![Mode::Bare];
    for (b, backend) in BACKENDS.iter().enumerate() {
        match backend_attaches(bin, backend) {
            Ok(()) => modes.extend([Mode::Agent(b), Mode::Floor(b)]),
            Err(why) => println!("overhead {kernel} {}: SKIPPED ({why})", backend.name),
        }
    }
    // samples[mode][round]
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); modes.len()];
    let t0 = Instant::now();
    for round in 0..rounds {
        for k in 0..modes.len() {
            let m = (round + k) % modes.len();
            let running = start(modes[m], bin);
            let mut s = Sample::default();
            for (i, (_, f)) in LOOPS.iter().enumerate() {
                s.loops[i] = median((0..REPS).map(|_| f(iters)).collect());
            }
            if let Some(tb) = &testbed {
                let (ioctl, cuinit) = tb.run();
                s.nv_ioctl = Some(ioctl);
                s.cuinit = Some(cuinit);
            }
            s.proc_info = running.map(stop);
            samples[m].push(s);
        }
        eprintln!(
            "  round {}/{rounds} done ({:.0} s)",
            round + 1,
            t0.elapsed().as_secs_f64()
        );
    }
    report(&kernel, &modes, &samples, rounds, iters);

    let lib = std::env::var_os("UVMWATCH_BENCH_LIBCUDA")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| testbed.as_ref().map(|t| t.artifacts.libcuda.clone()));
    let Some(lib) = lib else {
        println!("lifecycle {kernel}: SKIPPED (no libcuda to copy: set UVMWATCH_BENCH_LIBCUDA)");
        return;
    };
    let files = env_usize("UVMWATCH_BENCH_LIBCUDAS", 100);
    for m in &modes {
        if let Mode::Agent(b) = *m {
            let backend = &BACKENDS[b];
            lifecycle::run(&kernel, backend.name, bin, backend.run_args, &lib, files);
        }
    }
}

/// A measure of every round of one mode.
fn series(samples: &[Sample], measure: &dyn Fn(&Sample) -> Option<f64>) -> Vec<f64> {
    samples.iter().filter_map(measure).collect()
}

/// `measure` of mode `a` over mode `b`: the ratio of the medians, and the range of the
/// per-round ratios (both modes ran in the same round, next to each other).
fn ratio(a: &[Sample], b: &[Sample], measure: &dyn Fn(&Sample) -> Option<f64>) -> (f64, f64, f64) {
    let r = median(series(a, measure)) / median(series(b, measure));
    let per_round: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some(measure(x)? / measure(y)?))
        .collect();
    let (lo, hi) = min_max(&per_round);
    (r, lo, hi)
}

fn report(kernel: &str, modes: &[Mode], samples: &[Vec<Sample>], rounds: usize, iters: usize) {
    let loop_measure = |i: usize| move |s: &Sample| Some(s.loops[i]);
    let mut rows: Vec<(String, Measure)> = LOOPS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.to_string(), Box::new(loop_measure(i)) as Measure))
        .collect();
    rows.push((
        "nv ioctl (traced)".into(),
        Box::new(|s: &Sample| s.nv_ioctl),
    ));
    rows.push(("cuInit (fake)".into(), Box::new(|s: &Sample| s.cuinit)));

    println!(
        "overhead: {rounds} rounds, modes interleaved (order rotated each round); per round \
         each loop {REPS} x {iters} calls (median kept); ns per call: median [min-max over rounds]"
    );
    print!("  {:<18}", "");
    for m in modes {
        print!("  {:>26}", m.label());
    }
    println!();
    for (name, f) in &rows {
        print!("  {name:<18}");
        for s in samples {
            let v = series(s, f.as_ref());
            if v.is_empty() {
                print!("  {:>26}", "-");
                continue;
            }
            let (lo, hi) = min_max(&v);
            print!(
                "  {:>26}",
                format!("{:.1} [{lo:.1}-{hi:.1}]", median(v.clone()))
            );
        }
        println!();
    }
    println!(
        "  (nv ioctl: ioctl(FIONREAD) on a tracked /dev/nvidia-uvm fd of the testbed's FUSE \
         node, answered by the VFS; cuInit: the fake libcuda's whole cuInit, its opens and \
         driver calls served over FUSE, one per round; the floor has no uprobes)"
    );

    for (b, backend) in BACKENDS.iter().enumerate() {
        if !modes.contains(&Mode::Agent(b)) {
            continue;
        }
        let idx = |m: Mode| modes.iter().position(|x| *x == m).unwrap();
        let (bare, agent, floor) = (
            &samples[idx(Mode::Bare)],
            &samples[idx(Mode::Agent(b))],
            &samples[idx(Mode::Floor(b))],
        );
        let line = |x: &[Sample], y: &[Sample]| -> (String, String) {
            let parts: Vec<(String, String)> = LOOPS
                .iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let (r, lo, hi) = ratio(x, y, &loop_measure(i));
                    (format!("{name} {r:.2}"), format!("{name} {lo:.2}-{hi:.2}"))
                })
                .collect();
            (
                parts
                    .iter()
                    .map(|p| p.0.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
                parts
                    .iter()
                    .map(|p| p.1.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        };
        let name = backend.name;
        for (label, x, y) in [
            ("overhead", agent, bare),
            ("floor", floor, bare),
            ("agent/floor", agent, floor),
        ] {
            let (ratios, spread) = line(x, y);
            println!("{label} {kernel} {name}: {ratios}");
            println!("  per-round range: {spread}");
        }
        if name == "fentry" {
            println!(
                "  (targets against no agent, issue 12: getpid and read <= 1.01, open+close <= 1.03, ioctl <= 1.10)"
            );
        } else {
            println!("  (agent/floor target: <= 1.05 on each, issue 12)");
        }
        let traced = |f: &dyn Fn(&Sample) -> Option<f64>, what: &str| {
            if series(bare, f).is_empty() {
                return;
            }
            let (ra, lo_a, hi_a) = ratio(agent, bare, f);
            let (rf, lo_f, hi_f) = ratio(floor, bare, f);
            println!(
                "traced {kernel} {name}: {what}: agent {ra:.2} [{lo_a:.2}-{hi_a:.2}], \
                 floor {rf:.2} [{lo_f:.2}-{hi_f:.2}], agent/floor {:.2}",
                ra / rf
            );
        };
        traced(&|s: &Sample| s.nv_ioctl, "nv ioctl");
        traced(&|s: &Sample| s.cuinit, "cuInit");
        let infos: Vec<&ProcInfo> = agent.iter().filter_map(|s| s.proc_info.as_ref()).collect();
        let cpu_pct = median(infos.iter().map(|p| 100.0 * p.cpu_s / p.wall_s).collect());
        let start_cpu = median(infos.iter().map(|p| p.start_cpu_s * 1e3).collect());
        let hwm = infos.iter().filter_map(|p| p.hwm_kib).max();
        let rss = infos.iter().filter_map(|p| p.rss_kib).max();
        let mib = |k: Option<u64>| {
            k.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "unknown".into())
        };
        let attached = infos.iter().filter(|p| p.libcuda_attached).count();
        println!(
            "agent {kernel} {name}: cpu {cpu_pct:.1}% of one core while measured (median of \
             {} runs), {start_cpu:.0} ms to start; RSS while running (VmRSS) {}, peak (VmHWM) {}; \
             libcuda probed in {attached} of {} runs",
            infos.len(),
            mib(rss),
            mib(hwm),
            infos.len()
        );
        let hits: Vec<f64> = floor
            .iter()
            .filter_map(|s| s.proc_info.as_ref()?.floor_hits)
            .map(|h| h as f64)
            .collect();
        println!(
            "floor {kernel} {name}: program runs per floor round: median {:.0}",
            median(hits)
        );
    }
}

//! `cargo bench -p uvmwatch --bench overhead`: what the agent costs the rest of the host.
//!
//! Every process on the host pays for the agent's tracepoints on `openat`, `ioctl` and
//! `close`, even when it never touches an NVIDIA node. This bench measures that cost side by
//! side in one run: the same syscall loops without the agent, with the agent running, and
//! without it again, and reports the ratio of medians. It also reports the agent's resident
//! memory. Needs root (the agent loads eBPF); without root it says so and exits 0.

use std::{
    ffi::CString,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const ITERS: usize = 200_000;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// ns per `openat("/dev/null") + close`.
fn open_close() -> f64 {
    let p = CString::new("/dev/null").unwrap();
    let t = Instant::now();
    for _ in 0..ITERS {
        // SAFETY: valid path; the fd is closed right away.
        unsafe {
            let fd = libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            libc::close(fd);
        }
    }
    t.elapsed().as_nanos() as f64 / ITERS as f64
}

/// ns per `ioctl(FIONREAD)` on a pipe (an fd the agent does not track).
fn ioctl_untracked() -> f64 {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    unsafe { libc::pipe(fds.as_mut_ptr()) };
    let mut n: libc::c_int = 0;
    let t = Instant::now();
    for _ in 0..ITERS {
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(fds[0], libc::FIONREAD, &mut n) };
    }
    let ns = t.elapsed().as_nanos() as f64 / ITERS as f64;
    // SAFETY: closing our own pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    ns
}

fn measure() -> (f64, f64) {
    let mut o = Vec::new();
    let mut i = Vec::new();
    for _ in 0..ROUNDS {
        o.push(open_close());
        i.push(ioctl_untracked());
    }
    (median(o), median(i))
}

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn main() {
    // cargo bench passes --bench; nothing else is accepted.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("overhead: SKIPPED (needs root to load the agent's eBPF programs)");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_uvmwatch");
    let base1 = measure();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut agent = Command::new(bin)
        .args(["--log-format", "json", "run", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start agent");
    let stderr = agent.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let started = Instant::now();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("\"started\"") => break,
            Some(_) if started.elapsed() < Duration::from_secs(30) => continue,
            _ => panic!("agent did not start"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    std::thread::sleep(Duration::from_millis(300));
    let with = measure();
    let rss = rss_kib(agent.id());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    let base2 = measure();

    let b_open = (base1.0 + base2.0) / 2.0;
    let b_ioctl = (base1.1 + base2.1) / 2.0;
    println!("overhead: {ITERS} calls x {ROUNDS} rounds, medians (ns per call)");
    println!(
        "  openat+close /dev/null   without {:>8.1}  with agent {:>8.1}  ratio {:.2}",
        b_open,
        with.0,
        with.0 / b_open
    );
    println!(
        "  ioctl(FIONREAD) on pipe  without {:>8.1}  with agent {:>8.1}  ratio {:.2}",
        b_ioctl,
        with.1,
        with.1 / b_ioctl
    );
    println!(
        "  baselines before/after: open {:.1}/{:.1}, ioctl {:.1}/{:.1} (drift check)",
        base1.0, base2.0, base1.1, base2.1
    );
    match rss {
        Some(k) => println!("  agent resident memory: {:.1} MiB", k as f64 / 1024.0),
        None => println!("  agent resident memory: unknown"),
    }
}

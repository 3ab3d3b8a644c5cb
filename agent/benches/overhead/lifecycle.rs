//! The agent's lifecycle, per backend: how soon a new libcuda file's probes are attached and
//! how long a stop takes with many files probed, beside a stop with none.
//!
//! `files` copies of a libcuda (the test double, or `UVMWATCH_BENCH_LIBCUDA`) are made, each a
//! new file (device, inode) to the agent, as the libraries of many container images are. With
//! the agent running, this process opens them one at a time, as a loader does, and waits for
//! each one's `libcuda_attached` record: its `attach_seconds` is the time from that open (in
//! the kernel) to the file's probes attached. Then `SIGTERM`, timed to the agent's exit
//! (every program, link and map gone with the process), and the same with no file probed.
//!
//! Prints `lifecycle <kernel> <backend>: attach median M ms, worst W ms over N new libcuda
//! files; stop S s with N libcudas, B s with none; VmHWM H MiB`.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

/// How long one file may take to be attached before the bench gives up on it.
const ATTACH_WITHIN: Duration = Duration::from_secs(60);
/// How long a stop may take before the bench kills the agent and says so.
const STOP_WITHIN: Duration = Duration::from_secs(300);

/// What the agent's log says, line by line.
enum Line {
    Started,
    Attached { host_path: String, seconds: f64 },
}

struct Agent {
    child: Child,
    lines: mpsc::Receiver<Line>,
}

fn start(bin: &str, run_args: &[&str]) -> Agent {
    let port = super::free_port();
    let mut child = Command::new(bin)
        .args(["--log-format", "json", "run", "--no-proc-scan", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(run_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uvmwatch run");
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) else {
                continue;
            };
            let line = match v["event"].as_str() {
                Some("started") => Line::Started,
                Some("libcuda_attached") => Line::Attached {
                    host_path: v["host_path"].as_str().unwrap_or("").to_string(),
                    seconds: v["attach_seconds"].as_f64().unwrap_or(f64::NAN),
                },
                _ => continue,
            };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let a = Agent { child, lines };
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        match a
            .lines
            .recv_timeout(end.saturating_duration_since(Instant::now()))
        {
            Ok(Line::Started) => break,
            Ok(_) => {}
            Err(_) => panic!("uvmwatch run did not log `started` within 120 s"),
        }
    }
    a
}

/// SIGTERM and the time to the agent's exit, in seconds.
fn stop(mut a: Agent) -> f64 {
    let pid = a.child.id();
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    while a.child.try_wait().unwrap().is_none() {
        if t.elapsed() > STOP_WITHIN {
            let _ = a.child.kill();
            panic!("{pid} still running {STOP_WITHIN:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed().as_secs_f64()
}

/// Opens `path` read-only and closes it: what a loader's first step tells the agent.
fn open_close(path: &Path) {
    drop(std::fs::File::open(path).expect("open a libcuda copy"));
}

/// `files` new copies of `lib`, each `libcuda.so.1` in a directory of its own.
fn copies(dir: &Path, lib: &Path, files: usize) -> Vec<PathBuf> {
    (0..files)
        .map(|i| {
            let d = dir.join(i.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("libcuda.so.1");
            std::fs::copy(lib, &p).expect("copy the libcuda");
            p
        })
        .collect()
}

/// Measures one backend; prints its `lifecycle` line.
pub fn run(kernel: &str, backend: &str, bin: &str, run_args: &[&str], lib: &Path, files: usize) {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-lifecycle-")
        .tempdir()
        .expect("temporary directory");
    let paths = copies(dir.path(), lib, files);

    let a = start(bin, run_args);
    std::thread::sleep(Duration::from_millis(300));
    let mut attach: Vec<f64> = Vec::with_capacity(files);
    for p in &paths {
        open_close(p);
        let want = p.display().to_string();
        let end = Instant::now() + ATTACH_WITHIN;
        loop {
            match a
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(Line::Attached { host_path, seconds }) if host_path.ends_with(&want) => {
                    attach.push(seconds);
                    break;
                }
                Ok(_) => {}
                Err(_) => panic!("{want}: not attached within {ATTACH_WITHIN:?}"),
            }
        }
    }
    let hwm_kib = super::status_kib(a.child.id(), "VmHWM:");
    let stop_many = stop(a);
    let stop_none = stop(start(bin, run_args));

    attach.sort_by(f64::total_cmp);
    let median = attach[attach.len() / 2] * 1e3;
    let worst = attach.last().copied().unwrap_or(f64::NAN) * 1e3;
    println!(
        "lifecycle {kernel} {backend}: attach median {median:.1} ms, worst {worst:.1} ms over \
         {files} new libcuda files; stop {stop_many:.2} s with {files} libcudas, \
         {stop_none:.2} s with none; VmHWM {}",
        hwm_kib.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
    );
}

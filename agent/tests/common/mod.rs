//! Shared harness for the agent's root integration tests: starts the real `uvmwatch` binary
//! (real eBPF programs, real probes) and reads its JSON log and `/metrics`.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use serde_json::Value;
use uvmwatch_testbed::{
    build_artifacts, Artifacts, FakeDev, LibLocation, Scenario, Workload, WorkloadConfig,
};

/// Whether the root eBPF tests can run here; `Err(reason)` otherwise.
pub fn environment() -> Result<(), String> {
    uvmwatch_testbed::check_environment()?;
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        return Err("kernel has no uprobe PMU".into());
    }
    Ok(())
}

/// Skips the calling test (counted by `cargo xtask test`) when the environment lacks what
/// the root tests need.
#[macro_export]
macro_rules! require_env {
    ($name:expr) => {
        if let Err(why) = common::environment() {
            uvmwatch_testbed::skip($name, &why);
            return;
        }
    };
}

/// Test doubles, built once per test binary.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("uvmwatch-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        build_artifacts(&dir).expect("building the test doubles")
    })
}

/// The fake library installed at a host path before any agent starts, as a host's driver
/// library is: every agent [`Agent::start`] starts probes it from its start (`--libcuda`),
/// so every `cuInit` of a workload on [`HostLib::location`] is seen whole. One per test
/// binary ([`host_lib`]). A workload on [`LibLocation::PrivateNamespace`] has a library of
/// its own instead, which an agent meets only when it is opened.
pub struct HostLib {
    pub path: PathBuf,
}

impl HostLib {
    /// `--libcuda <path>` for an agent.
    pub fn flags(&self) -> [String; 2] {
        ["--libcuda".into(), self.path.display().to_string()]
    }

    pub fn location(&self) -> LibLocation {
        LibLocation::Installed(self.path.clone())
    }
}

/// The host's installed library of this test binary (next to the test doubles).
pub fn host_lib() -> &'static HostLib {
    static L: OnceLock<HostLib> = OnceLock::new();
    L.get_or_init(|| {
        let a = artifacts();
        let path = a
            .libcuda
            .parent()
            .expect("artifacts dir")
            .join("host-lib")
            .join("libcuda.so.1");
        uvmwatch_testbed::install_libcuda(a, &path).expect("install libcuda");
        HostLib { path }
    })
}

/// A workload on one GPU with its library in a private mount namespace, waiting `wait_ms`
/// before `cuInit`, with `args` for `cuda-workload` (`--flood-ms`, `--lib`, ...).
#[allow(dead_code)] // not every test binary spawns workloads this way
pub fn spawn_workload(dev: &FakeDev, scenario: Scenario, wait_ms: u64, args: &[&str]) -> Workload {
    Workload::spawn_with_args(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            gpus: 1,
            wait_ms,
            lib_location: LibLocation::PrivateNamespace,
            fork_child: false,
            extra_env: vec![],
        },
        args,
    )
    .expect("spawn workload")
}

/// Compiles a C fixture from `tests/fixtures` once; returns the binary.
pub fn fixture_binary(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.c"));
    let out = artifacts().workload.parent().unwrap().join(name);
    if !out.exists() {
        let st = Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc");
        assert!(st.success(), "compiling {}", src.display());
    }
    out
}

/// An executable on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running agent.
pub struct Agent {
    child: Child,
    pub port: u16,
    log: Arc<Mutex<Vec<(Instant, Value)>>>,
    raw: Arc<Mutex<Vec<String>>>,
}

/// How long a stopping agent may take: Kubernetes' default `terminationGracePeriodSeconds`.
/// About a second on a kernel with multi-uprobe links whatever the libcuda files probed; on
/// one without, about 0.7 s more per file (docs/probes.md#attaching-and-detaching-libcuda-files).
const STOP_WITHIN: Duration = Duration::from_secs(30);

impl Agent {
    /// Starts `uvmwatch run` with JSON logs and `extra` flags; waits until it is running.
    pub fn start(extra: &[&str]) -> Agent {
        Agent::start_with_env(extra, &[])
    }

    /// [`Agent::start`] with these environment variables set too.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
            .args([
                "--log-format",
                "json",
                "--log-level",
                "debug",
                "run",
                "--listen",
                &listen,
            ])
            .args(extra)
            .args(host_lib().flags())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uvmwatch");
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<(Instant, Value)>>> = Default::default();
        let raw: Arc<Mutex<Vec<String>>> = Default::default();
        let (l2, r2) = (log.clone(), raw.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                r2.lock().unwrap().push(line.clone());
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l2.lock().unwrap().push((Instant::now(), v));
                }
            }
        });
        let a = Agent {
            child,
            port,
            log,
            raw,
        };
        if a.wait_event(|v| v["event"] == "started", Duration::from_secs(30))
            .is_none()
        {
            panic!("agent did not start:\n{}", a.raw_log());
        }
        a
    }

    /// Every log line so far (for failure messages).
    pub fn raw_log(&self) -> String {
        self.raw.lock().unwrap().join("\n")
    }

    /// Log records so far.
    pub fn records(&self) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Records with `"event": name`.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["event"] == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// How many records match `pred` (without copying them: cheap under a flood).
    pub fn count(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| pred(v))
            .count()
    }

    /// Waits for a record matching `pred`; returns it with the time it was read.
    pub fn wait_event_at(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<(Instant, Value)> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(x) = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|(_, v)| pred(v))
                .cloned()
            {
                return Some(x);
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for a record matching `pred`.
    pub fn wait_event(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        self.wait_event_at(pred, timeout).map(|(_, v)| v)
    }

    /// Like [`Agent::wait_event`] but panics with the log on timeout.
    pub fn expect_event(
        &self,
        what: &str,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Value {
        match self.wait_event(pred, timeout) {
            Some(v) => v,
            None => panic!(
                "no {what} within {timeout:?}; agent log:\n{}",
                self.raw_log()
            ),
        }
    }

    /// `GET path` on the agent's HTTP server: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).unwrap();
        let status = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        let (st, body) = self.get("/metrics");
        assert_eq!(st, 200, "GET /metrics");
        body
    }

    /// SIGKILL, and waits until it is reaped (a crash: nothing is flushed or detached by
    /// the agent itself).
    pub fn kill_hard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (10 s at most); returns whether it exited successfully.
    pub fn stop(mut self) -> bool {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + STOP_WITHIN;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Like [`Agent::stop`], and every log record, the last ones (`stopped`) included.
    pub fn stop_with_records(mut self) -> (bool, Vec<Value>) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + STOP_WITHIN;
        let ok = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.success();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread sees the pipe close after the last line.
        std::thread::sleep(Duration::from_millis(200));
        (ok, self.records())
    }

    /// Process id of the agent.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of the series `name{labels}` in an exposition (labels as `k="v"` pairs, all of
/// which must be present), summed over every series that has them (as PromQL's `sum`), or
/// `None` when none has.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum: Option<f64> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (n, rest) = match series.split_once('{') {
            Some((n, r)) => (n, r.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| rest.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        {
            if let Ok(v) = value.parse::<f64>() {
                *sum.get_or_insert(0.0) += v;
            }
        }
    }
    sum
}

/// A unique host path for a copy of the fake libcuda (removed by the caller's `TempDir`).
pub fn host_lib_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("uvmwatch-e2e-lib")
        .tempdir()
        .unwrap()
}

/// The first Python of: `$<env>`, the virtual environment `venv` (relative to the
/// workspace, where `cargo xtask setup` installs a test's PyPI packages), and `python3` on
/// `PATH` when `path_too`, that runs `import` (e.g. `import hta.trace_analysis`). `None`
/// when none does.
pub fn tool_python(env: &str, venv: &str, import: &str, path_too: bool) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os(env) {
        candidates.push(p.into());
    }
    candidates.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(venv)
            .join("bin/python3"),
    );
    if path_too {
        candidates.push("python3".into());
    }
    candidates.into_iter().find(|c| {
        std::process::Command::new(c)
            .args(["-c", import])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

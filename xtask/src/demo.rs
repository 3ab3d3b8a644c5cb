//! `cargo xtask demo`: the real agent against simulated NVIDIA device nodes.
//!
//! Starts `uvmwatch run` with short stall thresholds, then runs the fake `libcuda.so.1`
//! (from `uvmwatch-testbed`) through six scenarios, each in a private mount namespace whose
//! `/dev` holds FUSE-backed `/dev/nvidia*` nodes. The agent's log is shown live
//! (`agent | …`); at the end the interesting `/metrics` lines are printed and the agent is
//! stopped with `SIGTERM`. Exit status 1 when a scenario's `cuInit` result is not the
//! expected one.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use uvmwatch_testbed::{
    build_artifacts_with_fakedev, check_environment, nv, procfs, Artifacts, FakeDev, FakeDevConfig,
    LibLocation, OpenDenial, Scenario, Workload, WorkloadConfig, FAKEDEV_BIN,
};

use crate::{setup, util};

/// Where the demo agent listens.
const LISTEN: &str = "127.0.0.1:19400";
/// How long to hold the hung `UVM_REGISTER_GPU` (past both stall thresholds, 2 s and 3 s).
const HANG_FOR: Duration = Duration::from_millis(4500);
/// How long the container-like workload goes on after its start-up (as an application
/// does), so the agent can still read its root to attach to the library it found.
const HOLD_MS: &str = "2000";
/// `/metrics` families worth showing after the scenarios.
const METRIC_PREFIXES: &[&str] = &[
    "uvmwatch_cuinit",
    "uvmwatch_stall",
    "uvmwatch_driver_ioctl_calls_total",
    "uvmwatch_device_opens_total",
    "uvmwatch_probe_attached",
    "uvmwatch_libcuda_targets",
    "uvmwatch_events_dropped_total",
    "uvmwatch_diagnosis",
];

/// The host facts the demo's agent diagnoses with (`--evidence-root`): a snapshot of the
/// motivating incident's machine (open module 590 on a 6.8 kernel, HMM on, KASLR on, no HMM
/// device memory set up), kept in the repository and checked against the generator by
/// `agent/tests/diagnosis.rs`. This machine has no NVIDIA driver, so its own facts would
/// give the rules nothing to go on.
const INCIDENT_SNAPSHOT: &str = "testbed/fixtures/incident-host";

/// The agent, its log shown live and kept for checks.
struct Agent {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    fn start(bin: &Path, host_lib: &Path) -> Result<Agent> {
        let mut cmd = Command::new(bin);
        cmd.args([
            "run",
            "--libcuda",
            &host_lib.display().to_string(),
            "--listen",
            LISTEN,
            "--log-format",
            "text",
            "--cuinit-stall",
            "3s",
            "--ioctl-stall",
            "2s",
            "--evidence-root",
        ])
        .arg(util::workspace_root().join(INCIDENT_SNAPSHOT))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        println!("demo: starting {}", util::describe(&cmd));
        // SAFETY: prctl is async-signal-safe; the agent gets SIGTERM if xtask dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().expect("piped");
        let out = child.stdout.take().expect("piped");
        show(err, log.clone());
        show(out, log.clone());
        Ok(Agent { child, log })
    }

    fn log_len(&self) -> usize {
        self.log.lock().map(|l| l.len()).unwrap_or(0)
    }

    /// Waits up to `timeout` for a log line after `since` that contains every needle.
    fn saw(&self, since: usize, needles: &[&str], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(l) = self.log.lock() {
                if l.iter()
                    .skip(since)
                    .any(|line| needles.iter().all(|n| line.contains(n)))
                {
                    return true;
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_healthy(&mut self, addr: SocketAddr, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the agent exited before serving /healthz ({status}); its log is above");
            }
            if let Ok((200, _)) = util::http_get(addr, "/healthz", Duration::from_secs(1)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the agent did not answer http://{addr}/healthz within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `SIGTERM`, then up to 10 s for it to exit (`SIGKILL` after that).
    fn stop(&mut self) -> Result<ExitStatus> {
        if let Some(s) = self.child.try_wait()? {
            return Ok(s);
        }
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait()? {
                // Let the readers print the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Ok(s);
            }
            if Instant::now() >= deadline {
                println!("demo: the agent did not stop within 10 s of SIGTERM; killing it");
                self.child.kill()?;
                return Ok(self.child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Prints every line of `r` as `agent | line` and keeps it.
fn show(r: impl Read + Send + 'static, log: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            println!("agent | {line}");
            if let Ok(mut l) = log.lock() {
                l.push(line);
            }
        }
    });
}

/// Something the agent's log should show during a scenario (checked, reported, not fatal).
struct Expect {
    what: &'static str,
    needles: &'static [&'static str],
    /// Looked for from the agent's start, not from the scenario's: what the agent does
    /// before any workload (the installed library, probed as it starts).
    from_agent_start: bool,
}

/// One demo scenario.
struct Case {
    key: char,
    title: &'static str,
    dev: FakeDevConfig,
    scenario: Scenario,
    /// The library exists only inside the workload's namespace; otherwise it lives at a host
    /// path of its own in the demo's temp dir.
    private_lib: bool,
    /// Hold `UVM_REGISTER_GPU` for [`HANG_FOR`], then release it.
    hang: bool,
    expect_rc: i32,
    agent: &'static [Expect],
}

fn cases() -> Vec<Case> {
    let dev = FakeDevConfig::default;
    vec![
        Case {
            key: 'a',
            title: "success: cuInit runs its driver calls and returns 0",
            dev: dev(),
            scenario: Scenario::Success,
            private_lib: false,
            hang: false,
            expect_rc: nv::CUDA_SUCCESS,
            agent: &[
                Expect {
                    from_agent_start: true,
                    what: "cuInit probes attached to the library",
                    needles: &["cuInit probes attached"],
                },
                Expect {
                    from_agent_start: false,
                    what: "cuInit returned CUDA_SUCCESS",
                    needles: &["cuInit returned", "CUDA_SUCCESS"],
                },
            ],
        },
        Case {
            key: 'b',
            title: "register_gpu_no_memory: UVM_REGISTER_GPU reports rmStatus NV_ERR_NO_MEMORY",
            dev: dev(),
            scenario: Scenario::RegisterGpuNoMemory,
            private_lib: false,
            hang: false,
            expect_rc: nv::CUDA_ERROR_NOT_INITIALIZED,
            agent: &[
                Expect {
                    from_agent_start: false,
                    what: "driver call failed: UVM_REGISTER_GPU NV_ERR_NO_MEMORY",
                    needles: &["driver call failed", "UVM_REGISTER_GPU", "NV_ERR_NO_MEMORY"],
                },
                Expect {
                    from_agent_start: false,
                    what: "cuInit failed with CUDA_ERROR_NOT_INITIALIZED",
                    needles: &["cuInit failed", "CUDA_ERROR_NOT_INITIALIZED"],
                },
            ],
        },
        Case {
            key: 'c',
            title: "hang: UVM_REGISTER_GPU does not return until released (4.5 s)",
            dev: FakeDevConfig {
                ioctl_rules: vec!["0x25=hang".parse().expect("valid rule")],
                ..dev()
            },
            scenario: Scenario::HangRegisterGpu,
            private_lib: false,
            hang: true,
            expect_rc: nv::CUDA_SUCCESS,
            agent: &[
                Expect {
                    from_agent_start: false,
                    what: "stall of UVM_REGISTER_GPU (after 2 s)",
                    needles: &["call stalled", "call=UVM_REGISTER_GPU"],
                },
                Expect {
                    from_agent_start: false,
                    what: "stall of cuInit (after 3 s)",
                    needles: &["call stalled", "call=cuInit"],
                },
                Expect {
                    from_agent_start: false,
                    what: "the stalled cuInit returned after the release",
                    needles: &["stalled cuInit returned"],
                },
            ],
        },
        Case {
            key: 'd',
            title: "missing node: /dev/nvidia-uvm does not exist (ENOENT)",
            dev: FakeDevConfig {
                omit: vec!["nvidia-uvm".into()],
                ..dev()
            },
            scenario: Scenario::MissingNode,
            private_lib: false,
            hang: false,
            expect_rc: nv::CUDA_ERROR_UNKNOWN,
            agent: &[Expect {
                from_agent_start: false,
                what: "device open failed with ENOENT",
                needles: &["NVIDIA device open failed", "ENOENT"],
            }],
        },
        Case {
            key: 'e',
            title: "denied node: opening /dev/nvidia-uvm fails with EPERM",
            dev: FakeDevConfig {
                deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
                ..dev()
            },
            scenario: Scenario::Success,
            private_lib: false,
            hang: false,
            expect_rc: nv::CUDA_ERROR_UNKNOWN,
            agent: &[Expect {
                from_agent_start: false,
                what: "device open failed with EPERM",
                needles: &["NVIDIA device open failed", "EPERM"],
            }],
        },
        Case {
            key: 'f',
            title:
                "private library: libcuda.so.1 exists only inside the workload's mount namespace, and cuInit runs at once",
            dev: dev(),
            scenario: Scenario::Success,
            private_lib: true,
            hang: false,
            expect_rc: nv::CUDA_SUCCESS,
            agent: &[
                Expect {
                    from_agent_start: false,
                    what: "cuInit probes attached to /usr/local/nvidia/lib64/libcuda.so.1",
                    needles: &[
                        "cuInit probes attached",
                        "/usr/local/nvidia/lib64/libcuda.so.1",
                    ],
                },
                // Called before the probes were attached: found from its driver calls
                // (docs/probes.md#late-cuinit), its result unknown unless they tell it.
                Expect {
                    from_agent_start: false,
                    what: "cuInit returned (found from its driver calls unless the probes won the race)",
                    needles: &["cuInit returned"],
                },
            ],
        },
    ]
}

/// What one scenario gave.
struct Outcome {
    key: char,
    title: &'static str,
    expected: i32,
    got: Option<i32>,
    agent_missed: Vec<&'static str>,
}

fn run_case(agent: &Agent, artifacts: &Artifacts, host_lib: &Path, case: &Case) -> Result<Outcome> {
    println!();
    println!("=== ({}) {}", case.key, case.title);
    let dev = FakeDev::start(artifacts, case.dev.clone()).context("start uvmwatch-fakedev")?;
    // The host's installed library (probed since the agent started), or one only the
    // workload's namespace has.
    let (lib_location, hold): (_, &[&str]) = if case.private_lib {
        (LibLocation::PrivateNamespace, &["--hold-ms", HOLD_MS])
    } else {
        (LibLocation::Installed(host_lib.to_path_buf()), &[])
    };
    let config = WorkloadConfig {
        scenario: case.scenario,
        lib_location: lib_location.clone(),
        ..WorkloadConfig::default()
    };
    let since = agent.log_len();
    let mut w =
        Workload::spawn_with_args(&dev, artifacts, config, hold).context("start the workload")?;
    let shown = match &lib_location {
        LibLocation::HostPath(p) | LibLocation::Installed(p) => p.display().to_string(),
        LibLocation::PrivateNamespace => format!(
            "{}/libcuda.so.1 (only inside its namespace)",
            uvmwatch_testbed::PRIVATE_LIB_DIR
        ),
    };
    println!(
        "demo: workload pid {} loads {shown} and calls cuInit at once",
        w.pid()
    );
    if case.hang {
        let t = procfs::wait_for_thread(w.pid(), Duration::from_secs(15), |t| {
            t.blocked_ioctl_cmd() == Some(nv::UVM_REGISTER_GPU)
        })
        .context("waiting for the workload to block in UVM_REGISTER_GPU")?;
        println!(
            "demo: thread {} is blocked in UVM_REGISTER_GPU (wchan {}); holding it {:.1} s",
            t.tid,
            t.wchan,
            HANG_FOR.as_secs_f64()
        );
        std::thread::sleep(HANG_FOR);
        println!("demo: releasing the held ioctl");
        dev.release()?;
    }
    let out = w
        .wait_timeout(Duration::from_secs(20))
        .context("waiting for the workload")?;
    let got = out.cuinit_lines().first().map(|l| l.rc);
    let mut agent_missed = Vec::new();
    for e in case.agent {
        let from = if e.from_agent_start { 0 } else { since };
        if agent.saw(from, e.needles, Duration::from_secs(2)) {
            println!("demo: agent reported: {}", e.what);
        } else {
            println!("demo: warn: agent did not report: {}", e.what);
            agent_missed.push(e.what);
        }
    }
    match got {
        Some(rc) if rc == case.expect_rc => {
            println!(
                "demo: cuInit returned {rc} (expected {}): ok",
                case.expect_rc
            )
        }
        Some(rc) => println!(
            "demo: FAIL: cuInit returned {rc}, expected {}",
            case.expect_rc
        ),
        None => println!(
            "demo: FAIL: no cuInit result from the workload ({}); stdout: {:?}",
            out.status, out.stdout
        ),
    }
    drop(dev);
    Ok(Outcome {
        key: case.key,
        title: case.title,
        expected: case.expect_rc,
        got,
        agent_missed,
    })
}

/// `cargo xtask demo`.
///
/// # Errors
/// Set-up or build failed, or the agent could not be started.
pub fn run() -> Result<ExitCode> {
    setup::ensure()?;
    let root = util::workspace_root();
    // Default members only: `--workspace` would build agent-ebpf for the host and fail.
    println!("demo: cargo build --bins");
    util::run_inherit(
        Command::new("cargo")
            .current_dir(&root)
            .args(["build", "--bins"]),
    )?;
    if !util::is_root() {
        println!(
            "demo: needs root: the agent loads eBPF programs and the fake device nodes need \
             mounts and a mount namespace. Run `cargo xtask demo` as root."
        );
        return Ok(ExitCode::from(1));
    }
    if let Err(reason) = check_environment() {
        println!("demo: cannot simulate NVIDIA devices here: {reason}");
        return Ok(ExitCode::from(1));
    }
    // The binaries are built next to this one (same target dir and profile).
    let bin_dir: PathBuf = std::env::current_exe()?
        .parent()
        .context("xtask has no directory")?
        .to_path_buf();
    let tmp = tempfile::Builder::new()
        .prefix("uvmwatch-demo-")
        .tempdir()
        .context("create temp dir")?;
    let artifacts =
        build_artifacts_with_fakedev(&tmp.path().join("doubles"), bin_dir.join(FAKEDEV_BIN))
            .context("build the fake libcuda and cuda-workload")?;

    // The host's driver library, installed before the agent starts (as on a GPU host).
    let host_lib = tmp.path().join("host-lib").join("libcuda.so.1");
    uvmwatch_testbed::install_libcuda(&artifacts, &host_lib).context("install libcuda")?;
    let addr: SocketAddr = LISTEN.parse()?;
    let mut agent = Agent::start(&bin_dir.join("uvmwatch"), &host_lib)?;
    agent.wait_healthy(addr, Duration::from_secs(60))?;
    println!("demo: agent is up (http://{addr}/healthz answered 200)");

    let mut outcomes = Vec::new();
    for case in cases() {
        outcomes.push(run_case(&agent, &artifacts, &host_lib, &case)?);
    }

    println!();
    println!("=== metrics (http://{addr}/metrics; histogram buckets left out)");
    match util::http_get(addr, "/metrics", Duration::from_secs(5)) {
        Ok((200, body)) => {
            for line in body.lines().filter(|l| {
                METRIC_PREFIXES.iter().any(|p| l.starts_with(p)) && !l.contains("_bucket{")
            }) {
                println!("{line}");
            }
        }
        Ok((code, body)) => println!("demo: /metrics answered {code}: {body}"),
        Err(e) => println!("demo: /metrics failed: {e:#}"),
    }

    println!();
    println!("=== stopping the agent (SIGTERM)");
    let status = agent.stop()?;
    println!("demo: agent exited: {status}");

    println!();
    println!("=== summary");
    let mut failed = 0;
    for o in &outcomes {
        let got = o.got.map_or("none".to_string(), |rc| rc.to_string());
        let verdict = if o.got == Some(o.expected) {
            "ok"
        } else {
            failed += 1;
            "FAIL"
        };
        let title = o.title.split(':').next().unwrap_or(o.title);
        let missed = if o.agent_missed.is_empty() {
            String::new()
        } else {
            format!("  (agent did not report: {})", o.agent_missed.join("; "))
        };
        println!(
            "({}) {title:<24} cuInit={got:<4} expected {:<4} {verdict}{missed}",
            o.key, o.expected
        );
    }
    if failed > 0 {
        println!("demo: {failed} scenario(s) gave an unexpected cuInit result");
        return Ok(ExitCode::from(1));
    }
    println!(
        "demo: all {} scenarios gave the expected cuInit result",
        outcomes.len()
    );
    Ok(ExitCode::SUCCESS)
}

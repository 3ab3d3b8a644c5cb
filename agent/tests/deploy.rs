//! The deployment files (`deploy/`) against real tools:
//! - the systemd unit: `systemd-analyze verify` and `systemd-analyze security --offline`;
//! - the capabilities it grants: the real agent run with exactly that set (and with each one
//!   taken away) under `setpriv`, in a private mount namespace where `/`, `/sys` and tracefs
//!   are read-only as the unit makes them, and under the unit's system call filter
//!   (`deploy/systemd/syscall-filter.py`, libseccomp), through the e2e scenarios (root only);
//! - the Kubernetes manifests: `kubectl kustomize` on the base and the example overlay, then
//!   the rendered objects against the Kubernetes schemas (`kubernetes-validate`, strict) and
//!   the Prometheus Operator's (`cloudcoil-models-prometheus-operator`, unknown fields
//!   refused) with `deploy/kubernetes/validate.py`;
//! - the container build file: its structure (building it needs registries this machine
//!   cannot reach).
//!
//! Each test skips with the reason (`uvmwatch_testbed::skip`) when its tool is missing.
//!
//! One file for one feature (what `deploy/` ships), in four sections in the order above; the
//! capability section is most of it because each capability is checked by taking it away.

mod common;
mod observability;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{artifacts, metric};
use observability::{free_port, http_get, repo_root, which};
use serde_json::Value;
use uvmwatch_testbed::{
    FakeDev, FakeDevConfig, IoctlAction, IoctlRule, OpenDenial, Scenario, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);
const UNIT: &str = "deploy/systemd/uvmwatch.service";

fn unit_text() -> String {
    std::fs::read_to_string(repo_root().join(UNIT)).unwrap()
}

/// The unit's `CapabilityBoundingSet=`, e.g. `["CAP_BPF", "CAP_PERFMON", ...]`.
fn unit_capabilities() -> Vec<String> {
    let text = unit_text();
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .collect();
    assert_eq!(lines.len(), 1, "one CapabilityBoundingSet= line in {UNIT}");
    lines[0].split_whitespace().map(String::from).collect()
}

/// The unit with `ExecStart` pointing at this build's binary (verify checks it exists).
fn unit_for_this_build(dir: &Path) -> PathBuf {
    let text = unit_text().replace("/usr/local/bin/uvmwatch", env!("CARGO_BIN_EXE_uvmwatch"));
    let path = dir.join("uvmwatch.service");
    std::fs::write(&path, text).unwrap();
    path
}

// ---------------------------------------------------------------------------------------
// systemd

#[test]
fn systemd_unit_passes_systemd_analyze_verify_and_security() {
    let test = "systemd_unit_passes_systemd_analyze_verify_and_security";
    let Some(sa) = which("systemd-analyze") else {
        uvmwatch_testbed::skip(
            test,
            "systemd-analyze not installed (Debian package systemd)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_build(dir.path());
    let out = Command::new(&sa).arg("verify").arg(&unit).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify:\n{text}"
    );

    // Offline: no running systemd needed. Exposure at most 4.0 ("OK") on systemd's 0-10 scale.
    let out = Command::new(&sa)
        .args(["security", "--offline=true", "--threshold=40", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let level = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("")
        .to_string();
    eprintln!("measured: systemd-analyze security: {}", level.trim());
    assert!(
        out.status.success(),
        "systemd-analyze security above the threshold 4.0:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the agent needs must not be sandboxed away.
    let unit = unit_text();
    for needed in [
        "ProtectProc=default",
        "ProcSubset=all",
        "PrivateDevices=no",
        "ProtectKernelLogs=no",
        "SystemCallFilter=@system-service bpf perf_event_open",
    ] {
        assert!(unit.contains(needed), "{UNIT} must keep {needed}");
    }
}

// ---------------------------------------------------------------------------------------
// Capabilities, measured

/// What the agent could do under one capability set.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Abilities {
    /// `uvmwatch run` started (its "started" record).
    started: bool,
    /// Every required probe attached (uvmwatch_probe_attached).
    required_probes: bool,
    /// A cuInit in a library that exists only in the workload's mount namespace was seen
    /// (cuinit_end with CUDA_SUCCESS): /proc/<pid>/root.
    container_libcuda: bool,
    /// A failed open (EPERM) was reported.
    failed_open: bool,
    /// The stall report has the process's executable (readlink /proc/<pid>/exe).
    stall_exe: bool,
    /// ... its wchan (/proc/<pid>/task/<tid>/wchan).
    stall_wchan: bool,
    /// ... its kernel stack (/proc/<pid>/task/<tid>/stack).
    stall_stack: bool,
    /// `uvmwatch doctor` read the kernel log (/dev/kmsg).
    kernel_log: bool,
    /// `/readyz` answered 200 once the agent had started.
    ready: bool,
    /// Features `uvmwatch_feature_enabled` says are off.
    features_off: BTreeSet<String>,
    /// Features the log said were off (`feature_off` at WARN).
    features_warned: BTreeSet<String>,
}

impl Abilities {
    fn lost(&self, full: &Abilities) -> Vec<&'static str> {
        let mut out = Vec::new();
        let pairs = [
            ("agent starts", self.started, full.started),
            (
                "required probes attach",
                self.required_probes,
                full.required_probes,
            ),
            (
                "cuInit in a container's libcuda",
                self.container_libcuda,
                full.container_libcuda,
            ),
            ("failed opens", self.failed_open, full.failed_open),
            ("stall report: exe", self.stall_exe, full.stall_exe),
            ("stall report: wchan", self.stall_wchan, full.stall_wchan),
            (
                "stall report: kernel stack",
                self.stall_stack,
                full.stall_stack,
            ),
            ("doctor: kernel log", self.kernel_log, full.kernel_log),
        ];
        for (what, have, want) in pairs {
            if want && !have {
                out.push(what);
            }
        }
        out
    }
}

/// The command prefix that runs the agent as the unit would: a private mount namespace
/// with `/`, `/sys` and tracefs read-only (ProtectSystem=strict, ProtectKernelTunables=yes),
/// then `setpriv` with only `caps` (None: all of root's) and no_new_privs, then, with
/// `filter` (a Python with pyseccomp), the unit's SystemCallFilter=
/// (`deploy/systemd/syscall-filter.py`).
fn sandbox(caps: Option<&[String]>, filter: Option<&Path>) -> Vec<String> {
    let filter = filter
        .map(|py| {
            format!(
                "'{}' '{}' '{}' -- ",
                py.display(),
                repo_root()
                    .join("deploy/systemd/syscall-filter.py")
                    .display(),
                repo_root().join(UNIT).display()
            )
        })
        .unwrap_or_default();
    let mut script = String::from(
        "set -e; mount -o remount,bind,ro / 2>/dev/null || true; \
         mount -o remount,bind,ro /sys; \
         if mountpoint -q /sys/kernel/tracing; then mount -o remount,bind,ro /sys/kernel/tracing; fi; ",
    );
    match caps {
        Some(caps) => {
            let list: Vec<String> = caps
                .iter()
                .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
                .collect();
            script.push_str(&format!(
                "exec setpriv --bounding-set=-all,{} --inh-caps=-all --ambient-caps=-all --no-new-privs -- {filter}\"$@\"",
                list.join(",")
            ));
        }
        None => script.push_str("exec \"$@\""),
    }
    vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        script,
        "uvmwatch-sandbox".into(),
    ]
}

struct Running {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<Value>>>,
    raw: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn start(prefix: &[String], extra: &[&str]) -> Running {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..])
            .arg(env!("CARGO_BIN_EXE_uvmwatch"))
            .args([
                "--log-format",
                "json",
                "--log-level",
                "debug",
                "run",
                "--listen",
                &listen,
            ])
            .args(common::host_lib().flags())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the sandboxed agent");
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<Value>>> = Default::default();
        let raw: Arc<Mutex<Vec<String>>> = Default::default();
        let (l2, r2) = (log.clone(), raw.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                r2.lock().unwrap().push(line.clone());
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l2.lock().unwrap().push(v);
                }
            }
        });
        Running {
            child,
            port,
            log,
            raw,
        }
    }

    fn wait(&mut self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = self.log.lock().unwrap().iter().find(|v| pred(v)).cloned() {
                return Some(v);
            }
            if Instant::now() > end || matches!(self.child.try_wait(), Ok(Some(_))) {
                // One last look: the record may have come with the exit.
                std::thread::sleep(Duration::from_millis(100));
                return self.log.lock().unwrap().iter().find(|v| pred(v)).cloned();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn metrics(&self) -> String {
        http_get(self.port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(10);
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

fn pid_is(v: &Value, pid: u32) -> bool {
    v["pid"].as_u64() == Some(pid as u64)
}

fn spawn(dev: &FakeDev, scenario: Scenario) -> Workload {
    Workload::spawn(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            lib_location: common::host_lib().location(),
            ..WorkloadConfig::default()
        },
    )
    .expect("spawn workload")
}

/// Runs the agent (and `uvmwatch doctor`) under `caps` (and the unit's system call filter
/// when `filter` names a Python with pyseccomp) through the scenarios.
fn measure(caps: Option<&[String]>, filter: Option<&Path>) -> Abilities {
    let mut a = Abilities::default();
    let prefix = sandbox(caps, filter);
    let mut agent = Running::start(&prefix, &["--ioctl-stall", "1s", "--cuinit-stall", "2s"]);
    if agent
        .wait(|v| v["event"] == "started", Duration::from_secs(30))
        .is_none()
    {
        let raw = agent.raw.lock().unwrap().join("\n");
        eprintln!(
            "  agent did not start: {}",
            raw.lines().last().unwrap_or("")
        );
        drop(agent);
        a.kernel_log = doctor_reads_kernel_log(&prefix);
        return a;
    }
    a.started = true;
    // Readiness a moment after start: the probe table is said with "started".
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = http_get(agent.port, "/readyz").unwrap_or((0, String::new()));
    a.ready = code == 200;
    if !a.ready {
        eprintln!("  /readyz {code}: {}", body.trim());
    }
    if filter.is_some() {
        let raw = agent.raw.lock().unwrap().join("\n");
        let line = raw.lines().find(|l| l.starts_with("syscall-filter.py:"));
        assert!(
            line.is_some(),
            "the system call filter was not loaded:\n{raw}"
        );
        eprintln!("  {}", line.unwrap());
    }
    let m = agent.metrics();
    a.features_off = m
        .lines()
        .filter_map(|l| l.strip_prefix("uvmwatch_feature_enabled{feature=\""))
        .filter_map(|l| l.strip_suffix("\"} 0"))
        .map(String::from)
        .collect();
    a.features_warned = agent
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|v| v["event"] == "feature_off" && v["level"] == "WARN")
        .filter_map(|v| v["feature"].as_str().map(String::from))
        .collect();
    // The required probes of the backend the agent chose (the other one's are on standby).
    let chosen = if metric(&m, "uvmwatch_probe_backend_info", &[("backend", "fentry")]) == Some(1.0)
    {
        uvmwatch::kernel::registry::Backend::Fentry
    } else {
        uvmwatch::kernel::registry::Backend::Tracepoint
    };
    a.required_probes = uvmwatch::kernel::registry::REGISTRY
        .iter()
        .filter(|p| p.required && p.backend.is_none_or(|b| b == chosen))
        .all(|p| metric(&m, "uvmwatch_probe_attached", &[("probe", p.label)]) == Some(1.0));

    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = spawn(&dev, Scenario::Success);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let pid = w.pid();
    a.container_libcuda = agent
        .wait(
            |v| v["event"] == "cuinit_end" && pid_is(v, pid) && v["result"] == "CUDA_SUCCESS",
            Duration::from_secs(3),
        )
        .is_some();
    if !a.container_libcuda {
        for v in agent.log.lock().unwrap().iter() {
            if v["level"] == "WARN" || v["level"] == "ERROR" {
                eprintln!("  agent: {v}");
            }
        }
    }
    drop(w);
    drop(dev);

    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = spawn(&dev, Scenario::MissingNode);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 999);
    let pid = w.pid();
    a.failed_open = agent
        .wait(
            |v| v["event"] == "device_open_failed" && pid_is(v, pid) && v["errno"] == "EPERM",
            Duration::from_secs(3),
        )
        .is_some();
    drop(w);
    drop(dev);

    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = spawn(&dev, Scenario::HangRegisterGpu);
    let pid = w.pid();
    if let Some(stall) = agent.wait(
        |v| v["event"] == "stall" && v["call"] == "UVM_REGISTER_GPU" && pid_is(v, pid),
        Duration::from_secs(8),
    ) {
        let nonempty = |k: &str| stall[k].as_str().is_some_and(|s| !s.is_empty() && s != "?");
        a.stall_exe = stall["exe"]
            .as_str()
            .is_some_and(|s| s.ends_with("cuda-workload"));
        a.stall_wchan = nonempty("wchan");
        a.stall_stack = stall["kernel_stack"]
            .as_str()
            .is_some_and(|s| s.contains("ioctl"));
        eprintln!(
            "  stall report: exe={} wchan={} kernel_stack={:.60}",
            stall["exe"], stall["wchan"], stall["kernel_stack"]
        );
    }
    dev.release().unwrap();
    let _ = w.next_cuinit_line(T);
    drop(w);
    drop(dev);
    drop(agent);

    a.kernel_log = doctor_reads_kernel_log(&prefix);
    a
}

/// Whether `uvmwatch doctor`, run under `prefix`, read the kernel log.
fn doctor_reads_kernel_log(prefix: &[String]) -> bool {
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--format", "json"])
        .output()
        .unwrap();
    let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
        eprintln!(
            "  doctor gave no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return false;
    };
    let ok = v["evidence"]["kernel_log"]["value"].get("Ok").is_some();
    if !ok {
        eprintln!("  doctor kernel_log: {}", v["evidence"]["kernel_log"]);
    }
    ok
}

#[test]
fn the_agent_runs_with_exactly_the_units_capabilities() {
    let test = "the_agent_runs_with_exactly_the_units_capabilities";
    require_env!(test);
    for tool in ["setpriv", "unshare", "mountpoint"] {
        if which(tool).is_none() {
            uvmwatch_testbed::skip(test, &format!("{tool} not installed (util-linux)"));
            return;
        }
    }
    let started = Instant::now();
    let caps = unit_capabilities();
    eprintln!("all of root's capabilities:");
    let full = measure(None, None);
    eprintln!("  {full:?}");
    assert!(
        full.started && full.required_probes && full.container_libcuda && full.failed_open,
        "the agent does not work even with every capability: {full:?}"
    );
    assert!(full.ready, "not ready with every capability: {full:?}");
    let kernel_off: BTreeSet<String> = (!uvmwatch::kernel::kprobes_supported())
        .then(|| "kernel_functions".to_string())
        .into_iter()
        .collect();
    assert_eq!(
        full.features_off, kernel_off,
        "with every capability only what the kernel lacks is off"
    );
    says_each_feature_off(&full);
    // The unit's set with its system call filter, when pyseccomp is there to build it.
    let python = deploy_python();
    match &python {
        Some(_) => eprintln!("the unit's set {caps:?} and its SystemCallFilter=:"),
        None => {
            // Not a skip of the whole test (the summary counts skipped tests, not parts).
            eprintln!(
                "the unit's set {caps:?}, WITHOUT its system call filter: {NO_PYTHON_PACKAGES}"
            );
        }
    }
    let unit = measure(Some(&caps), python.as_deref());
    eprintln!("  {unit:?}");
    let mut table = BTreeMap::new();
    // UVMWATCH_CAPS_ONLY=CAP_X: measure only the set without CAP_X (for investigating).
    let only = std::env::var("UVMWATCH_CAPS_ONLY").ok();
    for drop in &caps {
        if only.as_ref().is_some_and(|o| o != drop) {
            continue;
        }
        let fewer: Vec<String> = caps.iter().filter(|c| *c != drop).cloned().collect();
        eprintln!("without {drop}:");
        let a = measure(Some(&fewer), None);
        let lost = a.lost(&unit);
        eprintln!("  lost: {lost:?}; features off: {:?}", a.features_off);
        if a.started {
            says_each_feature_off(&a);
            let off = |f: &str| a.features_off.contains(f);
            match drop.as_str() {
                "CAP_SYS_PTRACE" => {
                    assert!(off("container_libcuda") && off("kernel_stacks"), "{a:?}")
                }
                "CAP_SYSLOG" => assert_eq!(off("kernel_log"), dmesg_restricted(), "{a:?}"),
                _ => {}
            }
        }
        table.insert(drop.clone(), lost);
    }
    // The reduced variant docs/capabilities.md describes: CAP_BPF and CAP_PERFMON instead of
    // CAP_SYS_ADMIN. Tracepoints (opens, driver ioctls, their stalls) still work.
    let reduced_caps: Vec<String> = ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_SYSLOG"]
        .map(String::from)
        .into();
    let reduced = if only.is_none() {
        eprintln!("reduced variant {reduced_caps:?}:");
        let r = measure(Some(&reduced_caps), None);
        eprintln!("  {r:?}");
        Some(r)
    } else {
        None
    };
    eprintln!(
        "measured: capabilities ({:.0}s):",
        started.elapsed().as_secs_f64()
    );
    for (cap, lost) in &table {
        eprintln!(
            "  without {cap}: {}",
            if lost.is_empty() {
                "nothing lost".to_string()
            } else {
                lost.join(", ")
            }
        );
    }
    if let Some(r) = &reduced {
        eprintln!(
            "  reduced variant {reduced_caps:?}: loses {}",
            r.lost(&unit).join(", ")
        );
        assert!(
            r.started
                && r.required_probes
                && r.failed_open
                && r.stall_exe
                && r.stall_wchan
                && r.kernel_log
                && r.ready,
            "the reduced variant (docs/capabilities.md) no longer keeps what it promises: {r:?}"
        );
        says_each_feature_off(r);
        for f in ["cuinit_calls", "kernel_stacks"] {
            assert!(
                r.features_off.contains(f),
                "reduced variant: {f} not off: {r:?}"
            );
        }
        // CAP_BPF alone: the programs load, nothing attaches. Alive, never ready.
        eprintln!("CAP_BPF only:");
        let b = measure(Some(&["CAP_BPF".to_string()]), None);
        eprintln!("  {b:?}");
        assert!(
            b.started && !b.required_probes && !b.ready && b.features_off.contains("driver_calls"),
            "with CAP_BPF only the agent must say it is not ready: {b:?}"
        );
        says_each_feature_off(&b);
    }
    assert!(
        unit.lost(&full).is_empty(),
        "with the unit's capabilities the agent loses {:?} ({unit:?} vs {full:?})",
        unit.lost(&full)
    );
    let unneeded: Vec<&String> = table
        .iter()
        .filter(|(_, l)| l.is_empty())
        .map(|(c, _)| c)
        .collect();
    assert!(
        unneeded.is_empty(),
        "the unit grants capabilities nothing measured needs: {unneeded:?}"
    );
}

/// Every feature off was said once at WARN, and none that is on.
fn says_each_feature_off(a: &Abilities) {
    assert_eq!(
        a.features_warned, a.features_off,
        "the log's feature_off records and uvmwatch_feature_enabled disagree: {a:?}"
    );
}

/// `kernel.dmesg_restrict=1`: reading /dev/kmsg needs CAP_SYSLOG.
fn dmesg_restricted() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|s| s.trim() != "0")
}

// ---------------------------------------------------------------------------------------
// Kubernetes

/// The DaemonSet's `capabilities.add`, as `CAP_*` names.
fn daemonset_capabilities() -> Vec<String> {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/base/daemonset.yaml")).unwrap();
    let at = text
        .find("add:")
        .expect("capabilities.add in the DaemonSet");
    text[at + 4..]
        .lines()
        .skip(1)
        .map(str::trim)
        .take_while(|l| l.starts_with("- "))
        .map(|l| format!("CAP_{}", l.trim_start_matches("- ").trim()))
        .collect()
}

#[test]
fn daemonset_grants_the_same_capabilities_as_the_unit() {
    let mut a = daemonset_capabilities();
    let mut b = unit_capabilities();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "DaemonSet capabilities.add vs the unit's CapabilityBoundingSet"
    );
}

/// The Python with the deploy/ check packages (`kubernetes-validate`,
/// `cloudcoil-models-prometheus-operator`, `dockerfile`): `$UVMWATCH_DEPLOY_PYTHON`, the
/// set-up's venv (`target/tools/deploy-venv`, `cargo xtask setup`), or python3.
fn deploy_python() -> Option<PathBuf> {
    let candidates = std::env::var_os("UVMWATCH_DEPLOY_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([repo_root().join("target/tools/deploy-venv/bin/python3")])
        .chain(which("python3"));
    candidates.into_iter().find(|p| {
        p.is_file()
            && Command::new(p)
                .args([
                    "-c",
                    "import kubernetes_validate, yaml, dockerfile, pyseccomp, cloudcoil.models.prometheus_operator.v1",
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    })
}

const NO_PYTHON_PACKAGES: &str = "kubernetes-validate, cloudcoil-models-prometheus-operator, \
     dockerfile and pyseccomp (PyPI) not installed: `cargo xtask setup` puts them in \
     target/tools/deploy-venv";

#[test]
fn kubernetes_manifests_build_with_kustomize_and_match_the_schemas() {
    let test = "kubernetes_manifests_build_with_kustomize_and_match_the_schemas";
    let Some(kubectl) = which("kubectl") else {
        uvmwatch_testbed::skip(
            test,
            "kubectl (with kustomize) not installed; no registry this project uses ships it",
        );
        return;
    };
    let Some(python) = deploy_python() else {
        uvmwatch_testbed::skip(test, NO_PYTHON_PACKAGES);
        return;
    };
    let root = repo_root();
    let validate = root.join("deploy/kubernetes/validate.py");
    for dir in [
        "deploy/kubernetes/base",
        "deploy/kubernetes/overlays/example",
    ] {
        let out = Command::new(&kubectl)
            .arg("kustomize")
            .arg(root.join(dir))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(rendered.path(), &out.stdout).unwrap();
        let v = Command::new(&python)
            .arg(&validate)
            .arg(rendered.path())
            .output()
            .unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
        eprintln!("{dir}:\n{report}");
        assert!(v.status.success(), "{dir} does not validate:\n{report}");
    }
}

// ---------------------------------------------------------------------------------------
// Container build file

/// `const NAME: &str = "VALUE";` from a source file.
fn const_str(text: &str, name: &str) -> String {
    let at = text
        .find(&format!("const {name}: &str = \""))
        .unwrap_or_else(|| panic!("const {name} not found"));
    let rest = &text[at..];
    let start = rest.find('"').unwrap() + 1;
    let end = start + rest[start..].find('"').unwrap();
    rest[start..end].to_string()
}

#[test]
fn containerfile_builds_the_release_binary_into_a_slim_runtime() {
    let test = "containerfile_builds_the_release_binary_into_a_slim_runtime";
    let root = repo_root();
    let path = root.join("deploy/container/Containerfile");
    let Some(python) = deploy_python() else {
        uvmwatch_testbed::skip(test, NO_PYTHON_PACKAGES);
        return;
    };
    // BuildKit's own parser (PyPI `dockerfile`), one JSON object per instruction.
    let out = Command::new(&python)
        .args([
            "-c",
            "import dockerfile, json, sys\n\
             for c in dockerfile.parse_file(sys.argv[1]):\n\
             \x20   print(json.dumps({'cmd': c.cmd, 'flags': list(c.flags), 'value': list(c.value), 'json': c.json}))",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "BuildKit's parser rejects the Containerfile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cmds: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    const KNOWN: &[&str] = &[
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    ];
    let of = |cmd: &str| -> Vec<&Value> { cmds.iter().filter(|c| c["cmd"] == cmd).collect() };
    let words = |c: &Value| -> Vec<String> {
        c["value"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for c in &cmds {
        assert!(
            KNOWN.contains(&c["cmd"].as_str().unwrap()),
            "unknown instruction {c}"
        );
    }
    // Two stages: build with the pinned toolchain, run on Debian 12 slim.
    let froms = of("FROM");
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage");
    let toolchain = std::fs::read_to_string(root.join("rust-toolchain.toml")).unwrap();
    let stable = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .map(|s| s.trim_matches('"').to_string())
        .unwrap();
    assert_eq!(
        words(froms[0]),
        [
            format!("docker.io/library/rust:{stable}-bookworm"),
            "AS".into(),
            "build".into()
        ]
    );
    assert_eq!(words(froms[1]), ["docker.io/library/debian:bookworm-slim"]);
    // The eBPF nightly and bpf-linker of agent/build.rs and xtask/src/setup.rs.
    let setup = std::fs::read_to_string(root.join("xtask/src/setup.rs")).unwrap();
    let build_rs = std::fs::read_to_string(root.join("agent/build.rs")).unwrap();
    let args: Vec<String> = of("ARG").iter().flat_map(|c| words(c)).collect();
    assert!(
        args.contains(&format!(
            "NIGHTLY={}",
            const_str(&build_rs, "EBPF_TOOLCHAIN")
        )),
        "{args:?}"
    );
    assert!(
        args.contains(&format!(
            "BPF_LINKER_VERSION={}",
            const_str(&setup, "BPF_LINKER_VERSION")
        )),
        "{args:?}"
    );
    // Every workspace member is copied (cargo needs them all), and target/ is not.
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members_line = workspace
        .lines()
        .find(|l| l.starts_with("members = "))
        .unwrap();
    let copies: Vec<Vec<String>> = of("COPY").iter().map(|c| words(c)).collect();
    for m in members_line.split('"').skip(1).step_by(2) {
        assert!(
            copies.iter().any(|c| c[0] == m),
            "workspace member {m} not copied"
        );
    }
    assert!(
        !copies.iter().any(|c| c[0] == "." || c[0] == "target"),
        "the whole context is copied"
    );
    let runs: String = of("RUN")
        .iter()
        .flat_map(|c| words(c))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        runs.contains("cargo build --release --locked -p uvmwatch"),
        "{runs}"
    );
    let from_build = of("COPY")
        .into_iter()
        .find(|c| {
            c["flags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "--from=build")
        })
        .expect("COPY --from=build");
    assert_eq!(
        words(from_build),
        ["/out/uvmwatch", "/usr/local/bin/uvmwatch"]
    );
    let entry = of("ENTRYPOINT");
    assert!(
        entry.len() == 1 && entry[0]["json"] == true,
        "ENTRYPOINT in exec (JSON) form"
    );
    assert_eq!(words(entry[0]), ["/usr/local/bin/uvmwatch"]);
    assert_eq!(words(of("EXPOSE")[0]), ["19400"]);
}

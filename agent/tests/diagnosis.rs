//! Live diagnosis end to end: the real agent (and `doctor --probe`) with the scenarios of the
//! e2e tests, and the host's facts from a snapshot tree (`--evidence-root` / `--root`) that
//! describes the machine of the motivating incident. Root only; single-threaded.

mod common;

use std::time::{Duration, Instant};

use common::{artifacts, host_lib, metric, Agent, HostLib};
use serde_json::Value;
use uvmwatch_testbed::{
    snapshot::{driver_refused_no_gpu, gpuless_535, gpuless_550, smi_q, SmiGpu},
    write_snapshot_fixture, ContextLine, FakeDev, FakeDevConfig, IoctlAction, IoctlRule,
    OpenDenial, Scenario, SnapshotSpec, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);

/// The motivating machine: open module 590 on a 6.8 kernel, HMM on, KASLR on, HMM device
/// memory never set up (no `nvidia-uvm-hmm` in /proc/iomem), kernel log silent.
fn incident_host(disable_hmm: bool) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-snapshot")
        .tempdir()
        .unwrap();
    let spec = SnapshotSpec {
        iomem_hmm: false,
        uvm_disable_hmm: disable_hmm,
        ..SnapshotSpec::default()
    };
    assert_eq!(spec.kernel_release, "6.8.0-45-generic");
    assert!(!spec.nokaslr && spec.hmm_config);
    write_snapshot_fixture(dir.path(), &spec).unwrap();
    dir
}

/// A workload on the host's installed library `lib` (the agent probes it from its start:
/// started with `lib.flags()`).
fn workload(dev: &FakeDev, lib: &HostLib, scenario: Scenario, fork_child: bool) -> Workload {
    Workload::spawn(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            fork_child,
            lib_location: lib.location(),
            ..WorkloadConfig::default()
        },
    )
    .expect("spawn workload")
}

fn pid_is(v: &Value, pid: u32) -> bool {
    v["pid"].as_u64() == Some(pid as u64)
}

#[test]
fn motivating_case_error_3_is_named_hmm_setup_with_the_host_fix_within_a_second() {
    require_env!("motivating_case_error_3_is_named_hmm_setup_with_the_host_fix_within_a_second");
    let snap = incident_host(false);
    let root = snap.path().to_str().unwrap();
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", root]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(&dev, lib, Scenario::RegisterGpuNoMemory, false);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
    let failed_at = Instant::now();
    let pid = w.pid();
    let (seen_at, end) = agent
        .wait_event_at(|v| v["event"] == "cuinit_end" && pid_is(v, pid), T)
        .unwrap_or_else(|| panic!("no cuinit_end; log:\n{}", agent.raw_log()));
    assert!(
        seen_at.saturating_duration_since(failed_at) < Duration::from_secs(1),
        "diagnosis came {:?} after the failure",
        seen_at.saturating_duration_since(failed_at)
    );
    assert_eq!(end["result"], "CUDA_ERROR_NOT_INITIALIZED");
    let rules = end["diagnosis"].as_str().unwrap();
    assert!(rules.starts_with("hmm_setup_failure"), "{end}");
    let fix = end["diagnosis_fix"].as_str().unwrap();
    assert!(
        fix.contains("[host]") && fix.contains("uvm_disable_hmm=1"),
        "{fix}"
    );
    assert_eq!(end["runbook"], "docs/runbooks/hmm_setup_failure.md");
    let d = agent.expect_event(
        "diagnosis record",
        |v| v["event"] == "diagnosis" && v["rule"] == "hmm_setup_failure" && pid_is(v, pid),
        T,
    );
    assert_eq!(d["severity"], "critical");
    assert_eq!(d["trigger"], "cuinit_end");
    let ev = d["evidence"].as_str().unwrap();
    assert!(ev.contains("NV_ERR_NO_MEMORY"), "{ev}");
    assert!(ev.contains("/sys/module/nvidia_uvm/parameters"), "{ev}");
    let m = agent.metrics();
    assert_eq!(
        metric(
            &m,
            "uvmwatch_diagnosis",
            &[("rule", "hmm_setup_failure"), ("severity", "critical")]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(agent.stop());
}

#[test]
fn motivating_case_hang_is_named_while_the_call_is_still_stuck() {
    require_env!("motivating_case_hang_is_named_while_the_call_is_still_stuck");
    let snap = incident_host(false);
    let root = snap.path().to_str().unwrap();
    let lib = host_lib();
    let agent = Agent::start(&[
        "--evidence-root",
        root,
        "--ioctl-stall",
        "1s",
        "--cuinit-stall",
        "2s",
    ]);
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    let mut w = workload(&dev, lib, Scenario::HangRegisterGpu, false);
    let pid = w.pid();
    let st = agent.expect_event(
        "cuInit stall",
        |v| v["event"] == "stall" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    // Still stuck: nothing has returned yet.
    assert!(w.try_wait().unwrap().is_none());
    assert!(
        st["diagnosis"]
            .as_str()
            .unwrap()
            .starts_with("hmm_setup_failure"),
        "{st}"
    );
    assert!(st["diagnosis_fix"]
        .as_str()
        .unwrap()
        .contains("uvm_disable_hmm=1"));
    assert_eq!(st["inside"], "UVM_REGISTER_GPU on /dev/nvidia-uvm");
    dev.release().unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    assert!(agent.stop());
}

#[test]
fn error_3_with_hmm_disabled_is_not_blamed_on_hmm() {
    require_env!("error_3_with_hmm_disabled_is_not_blamed_on_hmm");
    let snap = incident_host(true);
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", snap.path().to_str().unwrap()]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(&dev, lib, Scenario::RegisterGpuNoMemory, false);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
    let pid = w.pid();
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    assert!(
        !end["diagnosis"]
            .as_str()
            .unwrap()
            .contains("hmm_setup_failure"),
        "{end}"
    );
    let m = agent.metrics();
    assert_eq!(
        metric(
            &m,
            "uvmwatch_diagnosis",
            &[("rule", "hmm_setup_failure"), ("severity", "critical")]
        ),
        None,
        "{m}"
    );
    assert!(agent.stop());
}

#[test]
fn a_denied_open_is_named_a_device_permission_problem() {
    require_env!("a_denied_open_is_named_a_device_permission_problem");
    let snap = incident_host(false);
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", snap.path().to_str().unwrap()]);
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = workload(&dev, lib, Scenario::MissingNode, false);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 999);
    let pid = w.pid();
    let open = agent.expect_event(
        "device_open_failed",
        |v| v["event"] == "device_open_failed" && pid_is(v, pid),
        T,
    );
    assert!(
        open["diagnosis"]
            .as_str()
            .unwrap()
            .starts_with("device_permission"),
        "{open}"
    );
    assert!(agent.stop());
}

#[test]
fn a_child_forked_after_init_is_named_fork_after_init() {
    require_env!("a_child_forked_after_init_is_named_fork_after_init");
    let snap = incident_host(false);
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", snap.path().to_str().unwrap()]);
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(&dev, lib, Scenario::Success, true);
    let parent = w.next_cuinit_line(T).unwrap();
    assert_eq!(parent.rc, 0);
    let child = w.next_cuinit_line(T).unwrap();
    assert_eq!(child.rc, 3);
    let end = agent.expect_event(
        "child's cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, child.pid),
        T,
    );
    assert_eq!(end["result"], "CUDA_ERROR_NOT_INITIALIZED");
    assert!(
        end["diagnosis"]
            .as_str()
            .unwrap()
            .starts_with("fork_after_init"),
        "{end}"
    );
    assert!(agent.stop());
}

/// A snapshot of the default machine (two H200s) with every GPU in `compute_mode`.
fn host_in_compute_mode(compute_mode: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-snapshot")
        .tempdir()
        .unwrap();
    let mut spec = SnapshotSpec::default();
    let version = spec.driver.as_ref().unwrap().version.clone();
    let gpus: Vec<SmiGpu> = (0..2)
        .map(|i| SmiGpu {
            compute_mode: compute_mode.into(),
            ..SmiGpu::h200(i)
        })
        .collect();
    spec.smi = Some(smi_q(&version, &gpus));
    write_snapshot_fixture(dir.path(), &spec).unwrap();
    dir
}

/// Runs a workload on `gpus` fake GPUs that, after `cuInit`, asks for the device count and
/// calls `call` on device 0 (`--ctx`), with `env` set, then lives a second more (as an
/// application goes on); returns its pid and `--ctx` lines. The library is `lib`, one host
/// file for every workload of a test: one libcuda probed (each costs the agent 14 uprobe
/// detaches at its stop, about 0.3 s each here).
/// Held by each test that counts context calls: the counters are the kernel's, for every
/// process on the host's library, so two such tests at once would count each other's.
static CONTEXT_CALLS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn context_workload(
    lib: &HostLib,
    gpus: u32,
    call: &str,
    env: &[(&str, &str)],
) -> (u32, Vec<ContextLine>) {
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            gpus,
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = Workload::spawn_with_args(
        &dev,
        artifacts(),
        WorkloadConfig {
            gpus,
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            lib_location: lib.location(),
            ..WorkloadConfig::default()
        },
        &["--ctx", call, "--hold-ms", "1000"],
    )
    .expect("spawn workload");
    let pid = w.pid();
    let out = w.wait_timeout(T).unwrap();
    assert_eq!(out.cuinit_lines().first().map(|l| l.rc), Some(0), "{out:?}");
    (pid, out.context_lines())
}

fn diagnosis_of(agent: &Agent, pid: u32, rule: &str) -> Vec<Value> {
    agent
        .events("diagnosis")
        .into_iter()
        .filter(|v| pid_is(v, pid) && v["rule"] == rule)
        .collect()
}

#[test]
fn a_context_creation_refused_by_exclusive_process_mode_is_named_policy_live() {
    require_env!("a_context_creation_refused_by_exclusive_process_mode_is_named_policy_live");
    let _serial = CONTEXT_CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let snap = host_in_compute_mode("Exclusive_Process");
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", snap.path().to_str().unwrap()]);
    let held = [("UVMWATCH_FAKE_COMPUTE_MODE", "exclusive_process_held")];
    for call in ["cuCtxCreate_v2", "cuDevicePrimaryCtxRetain"] {
        let (pid, lines) = context_workload(lib, 1, call, &held);
        assert_eq!(lines[1].call, call);
        assert_eq!(lines[1].rc, 46);
        let rec = agent.expect_event(
            "failed context_call",
            |v| v["event"] == "context_call" && v["level"] == "ERROR" && pid_is(v, pid),
            T,
        );
        assert_eq!(rec["call"], call);
        assert_eq!(rec["device"], "0");
        assert_eq!(rec["result"], "CUDA_ERROR_DEVICE_UNAVAILABLE");
        assert!(
            rec["diagnosis"]
                .as_str()
                .unwrap()
                .starts_with("policy_or_partition"),
            "{rec}"
        );
        let d = agent.expect_event(
            "policy_or_partition diagnosis",
            |v| v["event"] == "diagnosis" && v["rule"] == "policy_or_partition" && pid_is(v, pid),
            T,
        );
        assert_eq!(d["trigger"], "context_call");
        assert_eq!(d["severity"], "critical");
        assert_eq!(d["standing"], "leading", "{d}");
        assert!(d["evidence"]
            .as_str()
            .unwrap()
            .contains(&format!("symptom={call} returned 46")));
        assert!(d["evidence"]
            .as_str()
            .unwrap()
            .contains(&format!("[probe:{call}]")));
        assert!(d["evidence"]
            .as_str()
            .unwrap()
            .contains("compute_exclusive=compute mode Exclusive on 2 of 2 GPU(s)"));
    }
    // Near miss: the same machine, the GPU free: the context is created, nothing is judged.
    let (pid, lines) = context_workload(lib, 1, "cuCtxCreate_v2", &[]);
    assert_eq!(lines[1].rc, 0);
    let ok = agent.expect_event(
        "successful context_call",
        |v| v["event"] == "context_call" && v["call"] == "cuCtxCreate_v2" && pid_is(v, pid),
        T,
    );
    assert_eq!(ok["level"], "DEBUG");
    assert_eq!(ok["result"], "CUDA_SUCCESS");
    std::thread::sleep(Duration::from_millis(300));
    assert!(diagnosis_of(&agent, pid, "policy_or_partition").is_empty());
    let m = agent.metrics();
    let calls = |call: &str, result: &str| {
        metric(
            &m,
            "uvmwatch_cuda_context_calls_total",
            &[("call", call), ("result", result)],
        )
    };
    assert_eq!(
        calls("cuCtxCreate_v2", "CUDA_ERROR_DEVICE_UNAVAILABLE"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(calls("cuCtxCreate_v2", "CUDA_SUCCESS"), Some(1.0), "{m}");
    assert_eq!(
        calls("cuDevicePrimaryCtxRetain", "CUDA_ERROR_DEVICE_UNAVAILABLE"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(calls("cuDeviceGetCount", "CUDA_SUCCESS"), Some(3.0), "{m}");
    assert_eq!(
        metric(
            &m,
            "uvmwatch_cuda_context_duration_seconds_count",
            &[("call", "cuCtxCreate_v2")]
        ),
        Some(2.0),
        "{m}"
    );
    for probe in ["uretprobe:cuCtxCreate_v4", "uprobe:cuDeviceGetCount"] {
        assert_eq!(
            metric(&m, "uvmwatch_probe_attached", &[("probe", probe)]),
            Some(1.0),
            "{m}"
        );
    }
    assert!(agent.stop());
}

#[test]
fn a_device_count_below_the_gpus_the_process_has_is_named_a_partition_live() {
    require_env!("a_device_count_below_the_gpus_the_process_has_is_named_a_partition_live");
    let _serial = CONTEXT_CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let snap = host_in_compute_mode("Default");
    let lib = host_lib();
    let agent = Agent::start(&["--evidence-root", snap.path().to_str().unwrap()]);
    // Two GPU nodes in the process's /dev, CUDA_VISIBLE_DEVICES=0,5: CUDA stops at the
    // entry that names no GPU and sees one of the two asked for; the setting explains it.
    let (pid, lines) = context_workload(
        lib,
        2,
        "cuDeviceGetCount",
        &[("CUDA_VISIBLE_DEVICES", "0,5")],
    );
    assert_eq!((lines[0].rc, lines[0].count), (0, Some(1)));
    let rec = agent.expect_event(
        "device_count",
        |v| v["event"] == "device_count" && pid_is(v, pid),
        T,
    );
    assert_eq!(rec["count"], "1");
    assert_eq!(rec["gpu_nodes"], "2");
    assert_eq!(rec["cuda_visible_devices"], "0,5");
    assert!(
        rec["diagnosis"]
            .as_str()
            .unwrap()
            .starts_with("visible_devices"),
        "{rec}"
    );
    let d = agent.expect_event(
        "visible_devices diagnosis",
        |v| v["event"] == "diagnosis" && v["rule"] == "visible_devices" && pid_is(v, pid),
        T,
    );
    assert_eq!(d["trigger"], "device_count");
    assert_eq!(d["severity"], "warning");
    assert_eq!(d["standing"], "leading");
    let ev = d["evidence"].as_str().unwrap();
    assert!(
        ev.contains(&format!(
            "visible_devices_narrow=CUDA_VISIBLE_DEVICES=0,5 names 1 of the 2 GPU(s) \
             [/proc/{pid}/environ]"
        )),
        "{ev}"
    );
    // Near miss: CUDA_VISIBLE_DEVICES=0 gives the process the one GPU it asked for (a
    // worker pinned to its GPU, as Ray and vLLM do): what it wanted, nothing judged.
    let (pid, lines) =
        context_workload(lib, 2, "cuDeviceGetCount", &[("CUDA_VISIBLE_DEVICES", "0")]);
    assert_eq!(lines[0].count, Some(1));
    agent.expect_event(
        "the pinned count seen",
        |v| v["event"] == "context_call" && v["call"] == "cuDeviceGetCount" && pid_is(v, pid),
        T,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        agent.count(|v| v["event"] == "device_count" && pid_is(v, pid)),
        0
    );
    // Near miss: both GPUs seen; no device_count record, no finding.
    let (pid, lines) = context_workload(lib, 2, "cuDeviceGetCount", &[]);
    assert_eq!(lines[0].count, Some(2));
    agent.expect_event(
        "the count seen",
        |v| v["event"] == "context_call" && v["call"] == "cuDeviceGetCount" && pid_is(v, pid),
        T,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        agent.count(|v| v["event"] == "device_count" && pid_is(v, pid)),
        0
    );
    assert!(diagnosis_of(&agent, pid, "policy_or_partition").is_empty());
    assert!(agent.stop());
}

#[test]
fn doctor_probe_names_the_cause_and_its_bundle_gives_the_same_findings() {
    require_env!("doctor_probe_names_the_cause_and_its_bundle_gives_the_same_findings");
    let snap = incident_host(false);
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("probed.tar.gz");
    // The testbed starts its "workload" as `<program> --lib <path> --wait-ms <n>` inside the
    // namespace with the fake nodes; this wrapper turns that into a doctor run.
    let script = dir.path().join("doctor-probe.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} doctor --json --probe --probe-timeout 10s --root {} --bundle {} \
             --libcuda \"$2\"\n",
            env!("CARGO_BIN_EXE_uvmwatch"),
            snap.path().display(),
            bundle.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut a = artifacts().clone();
    a.workload = script;
    let mut w = Workload::spawn(
        &dev,
        &a,
        WorkloadConfig {
            scenario: Scenario::RegisterGpuNoMemory,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let out = w.wait_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code 2 = critical\n{}",
        out.stdout
    );
    let probed: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(probed["observations"]["cuinit_result"], 3, "{}", out.stdout);
    assert_eq!(
        probed["observations"]["failed_call"]["call"],
        "UVM_REGISTER_GPU"
    );
    assert_eq!(probed["observations_source"]["from"], "probe");
    assert_eq!(
        probed["findings"][0]["rule"], "hmm_setup_failure",
        "{}",
        out.stdout
    );
    assert_eq!(probed["findings"][0]["severity"], "critical");

    // The bundle it wrote, diagnosed elsewhere without probes: the same findings from the
    // same observations, read from its observations.json.
    let (code, replayed, _) = doctor_json(&bundle);
    assert_eq!(code, Some(2));
    assert_eq!(replayed["observations_source"]["from"], "snapshot");
    assert_eq!(replayed["observations"], probed["observations"]);
    assert_eq!(replayed["findings"], probed["findings"]);
    assert_eq!(replayed["status"], probed["status"]);
}

/// `uvmwatch doctor --json --root <root>`: exit code, document, standard error.
fn doctor_json(root: &std::path::Path) -> (Option<i32>, Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--json", "--root"])
        .arg(root)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {stderr}{}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code(), v, stderr)
}

/// `uvmwatch doctor --root <root>` (text): exit code, standard output.
fn doctor_text(root: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--root"])
        .arg(root)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A snapshot tree of a healthy host ([`SnapshotSpec::default`]).
fn healthy_host() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-snapshot")
        .tempdir()
        .unwrap();
    write_snapshot_fixture(dir.path(), &SnapshotSpec::default()).unwrap();
    dir
}

/// `snapshot` carrying `observations` (the text of its observations.json).
fn observed(snapshot: tempfile::TempDir, observations: &str) -> tempfile::TempDir {
    std::fs::write(snapshot.path().join("observations.json"), observations).unwrap();
    snapshot
}

/// The motivating incident as `doctor --probe --bundle` saves it (docs/doctor-bundle.md).
const INCIDENT_OBSERVATIONS: &str = r#"{
  "format": 1,
  "pid": 2817,
  "cuinit_result": 3,
  "cuinit_seconds": 0.412,
  "failed_call": {"call": "UVM_REGISTER_GPU", "node": "/dev/nvidia-uvm",
                  "result": "NV_ERR_NO_MEMORY", "seconds": 0.05},
  "device_opens": 4
}"#;

#[test]
fn doctor_root_judges_the_observations_a_snapshot_carries() {
    // No root needed: only files are read.
    let snap = observed(incident_host(false), INCIDENT_OBSERVATIONS);
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(2), "{v:#}");
    assert_eq!(v["findings"][0]["rule"], "hmm_setup_failure");
    assert_eq!(v["findings"][0]["severity"], "critical");
    assert_eq!(v["observations"]["pid"], 2817);
    assert_eq!(v["observations_source"]["from"], "snapshot");
    assert_eq!(v["observations_source"]["snapshot_file"]["used"], true);
    let (_, text) = doctor_text(snap.path());
    assert!(
        text.contains(
            "judged with the probes' observations of pid 2817 (cuInit returned 3 \
             (CUDA_ERROR_NOT_INITIALIZED) after 0.41 s, failed call UVM_REGISTER_GPU on \
             /dev/nvidia-uvm -> NV_ERR_NO_MEMORY, 4 device opens), from the snapshot's \
             observations.json (format 1)"
        ),
        "{text}"
    );

    // The same machine without observations.json: the static HMM risk only, as before.
    let bare = incident_host(false);
    let (code, v, _) = doctor_json(bare.path());
    assert_eq!(code, Some(1), "{v:#}");
    assert_eq!(v["findings"][0]["severity"], "warning");
    assert_eq!(
        v["observations_source"],
        serde_json::json!({"from": "none", "snapshot_file": null,
                           "summary": "only static facts were judged (no probe observations)"})
    );
}

#[test]
fn doctor_root_never_calls_an_observed_failure_healthy() {
    // A healthy host whose cuInit returned 999 with every open fine: no rule names a cause.
    let snap = observed(
        healthy_host(),
        r#"{"format": 1, "pid": 51, "cuinit_result": 999, "cuinit_seconds": 0.08,
            "device_opens": 4}"#,
    );
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(2), "{v:#}");
    assert_eq!(v["status"], "critical");
    assert_eq!(v["findings"][0]["rule"], "unexplained_failure");
    let (_, text) = doctor_text(snap.path());
    assert!(!text.contains("healthy"), "{text}");
    assert!(
        text.starts_with("uvmwatch doctor: CRITICAL: cuInit returned 999 (CUDA_ERROR_UNKNOWN)"),
        "{text}"
    );
    assert!(
        text.contains("no known cause explains it: cuInit returned 999"),
        "{text}"
    );
    // The differential says why each cause is out.
    assert!(text.contains("  ruled out:\n"), "{text}");

    // Near miss: the same host, cuInit succeeded (a failed query on the way is normal).
    let snap = observed(
        healthy_host(),
        r#"{"format": 1, "pid": 51, "cuinit_result": 0, "cuinit_seconds": 0.31,
            "device_opens": 4,
            "failed_call": {"call": "NV_ESC_RM_CONTROL", "node": "/dev/nvidiactl",
                            "result": "NV_ERR_NOT_SUPPORTED", "seconds": 0.001}}"#,
    );
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(
        (v["status"].as_str(), v["findings"].clone()),
        (Some("healthy"), serde_json::json!([]))
    );
    assert_eq!(v["observations_source"]["from"], "snapshot");
    let (_, text) = doctor_text(snap.path());
    assert!(text.starts_with("uvmwatch doctor: healthy:"), "{text}");
    assert!(text.contains("judged with the probes' observations of pid 51 (cuInit returned 0"));
}

#[test]
fn doctor_root_reports_a_malformed_observations_file() {
    let snap = observed(healthy_host(), r#"{"pid": 51, "cuinit_result": "#);
    let (code, v, stderr) = doctor_json(snap.path());
    assert_eq!(code, Some(3), "{v:#}");
    assert_eq!(v["status"], "unknown");
    assert_eq!(v["observations_source"]["from"], "none");
    let file = &v["observations_source"]["snapshot_file"];
    assert_eq!(file["path"], "observations.json");
    assert_eq!(file["used"], false);
    assert!(
        file["error"]
            .as_str()
            .unwrap()
            .starts_with("not valid JSON: "),
        "{file}"
    );
    assert!(
        stderr.contains(
            "only static facts were judged: the snapshot's observations.json could not be used \
             (not valid JSON: "
        ),
        "{stderr}"
    );
    let (code, text) = doctor_text(snap.path());
    assert_eq!(code, Some(3));
    assert!(
        text.starts_with(
            "uvmwatch doctor: unknown: no known cause found in the static facts; the diagnosis \
             is incomplete.\n  only static facts were judged: the snapshot's observations.json \
             could not be used (not valid JSON: "
        ),
        "{text}"
    );

    // Fields this uvmwatch does not know are read past and named.
    let snap = observed(
        healthy_host(),
        r#"{"format": 1, "pid": 51, "cuinit_result": 0, "device_opens": 4,
            "context_create": {"result": 0}}"#,
    );
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(
        v["observations_source"]["snapshot_file"]["ignored_fields"],
        serde_json::json!(["context_create"])
    );
    assert!(v["observations_source"]["summary"]
        .as_str()
        .unwrap()
        .ends_with(
            "fields of observations.json this uvmwatch does not know were ignored: context_create"
        ));
}

#[test]
fn a_host_root_is_read_instead_of_the_containers_file_system() {
    // No root needed: only files are read. The snapshot tree stands for the host's `/`
    // mounted into a container.
    let snap = incident_host(false);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .arg("--host-root")
        .arg(snap.path())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let driver = &v["evidence"]["driver"];
    assert_eq!(driver["value"]["Ok"]["version"], "590.48.01", "{driver}");
    assert_eq!(driver["source"], "/proc/driver/nvidia/version");
    assert_eq!(
        v["evidence"]["uvm_params"]["value"]["Ok"]["uvm_disable_hmm"],
        "N"
    );
    // A missing host root is refused with a clear message, exit 2.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["--host-root", "/nonexistent-uvmwatch-host", "doctor"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--host-root"));
}

/// A snapshot tree of `spec` (one of the real GPU-less hosts of
/// `uvmwatch_testbed::snapshot::gpuless`, or a near miss).
fn host_of(spec: &SnapshotSpec) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-snapshot")
        .tempdir()
        .unwrap();
    write_snapshot_fixture(dir.path(), spec).unwrap();
    dir
}

/// What the agent saw on the 550.163.01 host without a GPU (Debian's real driver in a VM):
/// `cuInit` 999 after 80 ms, the only failed driver call `NV_ESC_RM_CONTROL` on
/// `/dev/nvidiactl` with `NV_ERR_INVALID_LOCK_STATE`, the nodes opened.
const GPULESS_OBSERVATIONS: &str = r#"{
  "format": 1,
  "pid": 3117,
  "cuinit_result": 999,
  "cuinit_seconds": 0.081,
  "failed_call": {"call": "NV_ESC_RM_CONTROL", "node": "/dev/nvidiactl",
                  "result": "NV_ERR_INVALID_LOCK_STATE", "seconds": 0.0004},
  "device_opens": 3
}"#;

#[test]
fn a_cuinit_999_on_a_driver_without_a_gpu_is_named_no_gpu_with_what_the_agent_saw() {
    // No root needed: only files are read.
    let snap = observed(host_of(&gpuless_550()), GPULESS_OBSERVATIONS);
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(2), "{v:#}");
    assert_eq!(v["status"], "critical");
    let f = &v["findings"][0];
    assert_eq!(f["rule"], "no_gpu", "{v:#}");
    assert_eq!(f["severity"], "critical");
    assert_eq!(f["confidence"], "high");
    assert_eq!(f["basis"], "observed");
    assert_eq!(f["runbook"], "docs/runbooks/no_gpu.md");
    let evidence = f["evidence"].as_array().unwrap();
    let from = |what: &str| {
        evidence
            .iter()
            .find(|i| i["what"] == what)
            .map(|i| (i["value"].as_str().unwrap(), i["source"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("no {what} in {evidence:#?}"))
    };
    let symptom = from("symptom");
    assert!(
        symptom.0.starts_with(
            "cuInit returned 999 (CUDA_ERROR_UNKNOWN) after 0.08 s; inside it: \
             NV_ESC_RM_CONTROL on /dev/nvidiactl -> NV_ERR_INVALID_LOCK_STATE"
        ),
        "{symptom:?}"
    );
    assert_eq!(symptom.1, "probe:cuInit");
    assert_eq!(
        from("driver_registered_no_gpu"),
        (
            "empty: the driver registered no GPU",
            "/proc/driver/nvidia/gpus"
        )
    );
    assert_eq!(
        from("smi_no_devices").0,
        "Failed to initialize NVML: No supported GPUs were found (exit status 255)"
    );
    assert_eq!(v["symptom"]["kind"], "cuinit_failed");
    // The failure is explained: no unexplained_failure beside it.
    assert_eq!(v["findings"].as_array().unwrap().len(), 1, "{v:#}");
    let (_, text) = doctor_text(snap.path());
    assert!(
        text.starts_with("uvmwatch doctor: CRITICAL: cuInit returned 999 (CUDA_ERROR_UNKNOWN)"),
        "{text}"
    );
    assert!(
        text.contains("CRITICAL no_gpu: the NVIDIA driver drives no GPU")
            && text.contains("(confidence: high)\n  leading; basis: observed"),
        "{text}"
    );

    // Near miss: the same observations on a host with its GPUs: no no_gpu, and the failure
    // stays unexplained rather than healthy.
    let snap = observed(healthy_host(), GPULESS_OBSERVATIONS);
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!(code, Some(2), "{v:#}");
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["unexplained_failure"], "{v:#}");
}

#[test]
fn a_driver_without_a_gpu_is_never_healthy_and_a_refused_one_is_no_nothing_to_diagnose() {
    // Case A, both releases: loaded, no GPU, plain doctor: critical, not healthy.
    for (spec, version) in [(gpuless_550(), "550.163.01"), (gpuless_535(), "535.261.03")] {
        let snap = host_of(&spec);
        let (code, text) = doctor_text(snap.path());
        assert_eq!(code, Some(2), "{text}");
        assert!(
            text.starts_with(
                "uvmwatch doctor: CRITICAL: driver_registered_no_gpu: empty: the driver \
                 registered no GPU\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("leading cause: no_gpu (high confidence)"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "driver_loaded  (needs) {version} (open kernel module)"
            )) || text.contains("CRITICAL no_gpu: the NVIDIA driver drives no GPU"),
            "{text}"
        );
        assert!(text.contains("$ lspci -nn -d 10de:"), "{text}");
        assert!(!text.contains("healthy"), "{text}");
    }
    // Case B: the driver refused to load; the kernel log says why.
    let snap = host_of(&driver_refused_no_gpu());
    let (code, text) = doctor_text(snap.path());
    assert_eq!(code, Some(2), "{text}");
    assert!(!text.contains("nothing to diagnose"), "{text}");
    assert!(
        text.contains("NVRM: No NVIDIA GPU found.  [dmesg]"),
        "{text}"
    );
    let (code, v, _) = doctor_json(snap.path());
    assert_eq!((code, v["status"].as_str()), (Some(2), Some("critical")));
    // NVIDIA's user space installed (nvidia-smi cannot reach a driver) and no driver: the
    // host wants one, so that is a symptom, never "nothing to diagnose".
    let wanted = SnapshotSpec {
        dmesg: Some("[    0.000000] Linux version 6.12.117+deb12-amd64\n".into()),
        ..driver_refused_no_gpu()
    };
    let snap = host_of(&wanted);
    let (code, text) = doctor_text(snap.path());
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.starts_with("uvmwatch doctor: CRITICAL: driver_absent: "),
        "{text}"
    );
    // Near miss: no driver, no NVIDIA software and nothing in the kernel log about it:
    // nothing to diagnose, exit 0.
    let silent = SnapshotSpec {
        dmesg: Some("[    0.000000] Linux version 6.12.117+deb12-amd64\n".into()),
        smi_failure: None,
        ..driver_refused_no_gpu()
    };
    let snap = host_of(&silent);
    let (code, text) = doctor_text(snap.path());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("nothing to diagnose on this machine"),
        "{text}"
    );
}

#[test]
fn the_demo_incident_snapshot_is_current() {
    // `cargo xtask demo` diagnoses with these facts (--evidence-root). Regenerate with
    // UVMWATCH_BLESS=1 after changing the fixture generator.
    let committed =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbed/fixtures/incident-host");
    let fresh = incident_host(false);
    if std::env::var_os("UVMWATCH_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&committed);
        copy_tree(fresh.path(), &committed);
    }
    let a = tree(fresh.path());
    let b = tree(&committed);
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "testbed/fixtures/incident-host is stale: run with UVMWATCH_BLESS=1"
    );
    for (k, v) in &a {
        assert_eq!(Some(v), b.get(k), "{k} differs: run with UVMWATCH_BLESS=1");
    }
}

fn tree(root: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for (rel, bytes) in tree(from) {
        let dst = to.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::write(dst, bytes).unwrap();
    }
}

//! The node verdict schedulers act on (docs/node-verdict.md): the real `uvmwatch doctor` run
//! as node-problem-detector runs its plugin from `deploy/node-problem-detector/`, the
//! NVSentinel health event it prints, and the pre-job gate's exit statuses, on snapshot trees
//! of a healthy host, the motivating incident and a driver that found no GPU. No root needed:
//! only files are read (`--pre-job` probes only as root, and these snapshots are judged from
//! their files either way).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use uvmwatch_testbed::snapshot::{write_snapshot_fixture, SnapshotSpec};

/// node-problem-detector's reading of a plugin run (kubernetes/node-problem-detector
/// v1.36.0, `pkg/custompluginmonitor/plugin/plugin.go` `run`): standard output trimmed and
/// cut at `max_output_length` bytes; exit 0 OK, 1 NonOK, anything else Unknown.
#[derive(Debug, PartialEq, Eq)]
enum NpdStatus {
    Ok,
    NonOk,
    Unknown,
}

fn npd_reads(code: Option<i32>, stdout: &[u8], max: usize) -> (NpdStatus, String) {
    let status = match code {
        Some(0) => NpdStatus::Ok,
        Some(1) => NpdStatus::NonOk,
        _ => NpdStatus::Unknown,
    };
    let text = String::from_utf8(stdout.to_vec()).expect("the plugin prints UTF-8");
    let mut msg = text.trim().to_string();
    msg.truncate(max.min(msg.len()));
    (status, msg)
}

fn config() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/node-problem-detector/uvmwatch-cuda-monitor.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).expect("the NPD config is JSON")
}

/// Seconds of an NPD duration string (`"60s"`, `"5m"`).
fn secs(d: &Value) -> u64 {
    let d = d.as_str().expect("a duration string");
    let (n, unit) = d.split_at(d.len() - 1);
    n.parse::<u64>().unwrap()
        * match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            _ => panic!("unit of {d}"),
        }
}

#[test]
fn npd_config_passes_the_checks_npd_makes_at_start() {
    // `Validate()` of pkg/custompluginmonitor/types/config.go (v1.36.0): the plugin is
    // "custom", a positive interval, no rule timeout above the global one, a permanent
    // rule's condition among the default conditions.
    let c = config();
    assert_eq!(c["plugin"], "custom");
    let global = &c["pluginConfig"];
    assert!(secs(&global["invoke_interval"]) > 0);
    let timeout = secs(&global["timeout"]);
    assert_eq!(global["max_output_length"], 80, "NPD's default, kept");
    let conditions: Vec<&str> = c["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    let rules = c["rules"].as_array().unwrap();
    assert!(!rules.is_empty());
    for r in rules {
        assert!(matches!(
            r["type"].as_str(),
            Some("temporary" | "permanent")
        ));
        assert!(
            secs(&r["timeout"]) <= timeout,
            "rule timeout above the global one"
        );
        if r["type"] == "permanent" {
            assert!(conditions.contains(&r["condition"].as_str().unwrap()));
        }
        assert!(r["path"].as_str().unwrap().ends_with("/uvmwatch"));
        let args: Vec<&str> = r["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let doctor = args.iter().position(|a| *a == "doctor").expect("doctor");
        assert!(args[doctor..].contains(&"--npd"), "{args:?}");
        // Static facts only: a plugin run every few minutes never starts CUDA on a node's
        // GPUs.
        assert!(!args.iter().any(|a| *a == "--probe" || *a == "--pre-job"));
    }
}

/// The plugin's command line from the config, with the binary built here and a snapshot
/// `root` in place of the host's root.
fn plugin_run(root: &Path) -> (Option<i32>, Vec<u8>) {
    let c = config();
    let rule = &c["rules"][0];
    let args: Vec<String> = rule["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .filter(|a| !a.starts_with("--host-root"))
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(&args)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap();
    (out.status.code(), out.stdout)
}

fn snapshot(spec: &SnapshotSpec, observations: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-verdict")
        .tempdir()
        .unwrap();
    write_snapshot_fixture(dir.path(), spec).unwrap();
    if let Some(o) = observations {
        std::fs::write(dir.path().join("observations.json"), o).unwrap();
    }
    dir
}

/// The motivating incident's observations (as `doctor --probe --bundle` saves them).
const REGISTER_GPU_NO_MEMORY: &str = r#"{"format": 1, "pid": 2817, "cuinit_result": 3,
  "cuinit_seconds": 0.41, "failed_call": {"call": "UVM_REGISTER_GPU",
  "node": "/dev/nvidia-uvm", "result": "NV_ERR_NO_MEMORY"}, "device_opens": 4}"#;

/// A driver loaded with no GPU registered (NVIDIA's real driver in a VM without one).
fn gpuless() -> SnapshotSpec {
    SnapshotSpec {
        gpus: Some(vec![]),
        pci_gpus: Some(vec![]),
        smi: None,
        ..SnapshotSpec::default()
    }
}

#[test]
fn npd_plugin_reads_ok_nonok_and_unknown() {
    let max = config()["pluginConfig"]["max_output_length"]
        .as_u64()
        .unwrap() as usize;
    let healthy = snapshot(&SnapshotSpec::default(), None);
    let (code, out) = plugin_run(healthy.path());
    let (status, msg) = npd_reads(code, &out, max);
    assert_eq!(status, NpdStatus::Ok, "{msg}");
    assert_eq!(msg, "CUDA can start: no finding");

    let incident = snapshot(&SnapshotSpec::default(), Some(REGISTER_GPU_NO_MEMORY));
    let (code, out) = plugin_run(incident.path());
    assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
    assert!(out.len() <= max + 1, "{} bytes", out.len());
    let (status, msg) = npd_reads(code, &out, max);
    assert_eq!(status, NpdStatus::NonOk, "{msg}");
    assert!(msg.starts_with("hmm_setup_failure: "), "{msg}");

    let (code, out) = plugin_run(snapshot(&gpuless(), None).path());
    let (status, msg) = npd_reads(code, &out, max);
    assert_eq!(status, NpdStatus::NonOk, "{msg}");
    assert!(msg.starts_with("no_gpu: "), "{msg}");

    // A snapshot whose device list is garbage: the doctor cannot judge it.
    let broken = snapshot(&SnapshotSpec::default(), None);
    std::fs::write(broken.path().join("dev/nodes.json"), b"\x00\x01 not json").unwrap();
    let (code, out) = plugin_run(broken.path());
    let (status, msg) = npd_reads(code, &out, max);
    assert_eq!(status, NpdStatus::Unknown, "{msg}");
    assert!(msg.starts_with("unknown: "), "{msg}");

    // No snapshot at all: still a line and Unknown, never a crash NPD cannot read.
    let (code, out) = plugin_run(Path::new("/nonexistent/uvmwatch-snapshot"));
    let (status, msg) = npd_reads(code, &out, max);
    assert_eq!(status, NpdStatus::Unknown, "{msg}");
    assert!(!msg.is_empty());
}

/// The fields of NVSentinel's `HealthEvent` (data-models/protobufs/health_event.proto at
/// NVIDIA/NVSentinel 3b7f63904f12, fields 1 to 18) and the `RecommendedAction` values common
/// to every version of the enum seen.
const HEALTH_EVENT_FIELDS: &[&str] = &[
    "version",
    "agent",
    "componentClass",
    "checkName",
    "isFatal",
    "isHealthy",
    "message",
    "recommendedAction",
    "errorCode",
    "entitiesImpacted",
    "metadata",
    "generatedTimestamp",
    "nodeName",
    "quarantineOverrides",
    "drainOverrides",
    "processingStrategy",
    "id",
    "customRecommendedAction",
];
const ACTIONS: &[&str] = &[
    "NONE",
    "COMPONENT_RESET",
    "CONTACT_SUPPORT",
    "RUN_FIELDDIAG",
    "RESTART_VM",
    "RESTART_BM",
    "REPLACE_VM",
    "RUN_DCGMEUD",
    "UNKNOWN",
];

fn health_event(root: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--format", "health-event", "--root"])
        .arg(root)
        .args(extra)
        .env("NODE_NAME", "gpu-node-7")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code(), v)
}

#[test]
fn health_event_is_nvsentinels_message_in_its_json_mapping() {
    let incident = snapshot(&SnapshotSpec::default(), Some(REGISTER_GPU_NO_MEMORY));
    let (code, doc) = health_event(incident.path(), &[]);
    assert_eq!(code, Some(2), "the doctor's own exit status: {doc:#}");
    assert_eq!(doc["version"], 1);
    let events = doc["events"].as_array().unwrap();
    assert!(!events.is_empty());
    for ev in events {
        for key in ev.as_object().unwrap().keys() {
            assert!(
                HEALTH_EVENT_FIELDS.contains(&key.as_str()),
                "{key} is no HealthEvent field"
            );
        }
        assert!(ACTIONS.contains(&ev["recommendedAction"].as_str().unwrap()));
        assert_eq!(
            ev["processingStrategy"], "STORE_ONLY",
            "observe-only by default"
        );
        assert_eq!(ev["nodeName"], "gpu-node-7");
        assert!(ev["metadata"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_string));
        // RFC 3339, UTC.
        let t = ev["generatedTimestamp"].as_str().unwrap();
        assert!(
            t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{t}"
        );
    }
    assert_eq!(events[0]["isFatal"], true);
    assert_eq!(events[0]["errorCode"][0], "hmm_setup_failure");
    assert_eq!(events[0]["entitiesImpacted"][0]["entityType"], "PCI");

    let (_, doc) = health_event(
        snapshot(&SnapshotSpec::default(), None).path(),
        &["--remediate"],
    );
    let events = doc["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{doc:#}");
    assert_eq!(events[0]["isHealthy"], true);
    assert_eq!(events[0]["recommendedAction"], "NONE");
    assert_eq!(events[0]["processingStrategy"], "EXECUTE_REMEDIATION");
}

#[test]
fn pre_job_gate_exit_statuses() {
    // As root, --pre-job would also probe a cuInit on this machine, whose libcuda (if any)
    // is no business of this test: run it as nobody, on the snapshot's facts alone.
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    let gate = |root: &Path| {
        let mut cmd = if as_root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_uvmwatch"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        };
        let out = cmd
            .args(["doctor", "--pre-job", "--root"])
            .arg(root)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains("not root: no cuInit probed"), "{stderr}");
        out.status.code()
    };
    // Readable to nobody.
    let readable = |d: tempfile::TempDir| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    };
    // Go: a healthy host.
    let healthy = readable(snapshot(&SnapshotSpec::default(), None));
    assert_eq!(gate(healthy.path()), Some(0));
    // No-go: a driver without a GPU.
    let no_gpu = readable(snapshot(&gpuless(), None));
    assert_eq!(gate(no_gpu.path()), Some(1));
    // Could not check.
    assert_eq!(gate(Path::new("/nonexistent/uvmwatch-snapshot")), Some(3));
}

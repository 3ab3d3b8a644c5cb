//! Live trace annotation end to end: the real agent with `--otlp-endpoint` pointing at an
//! OTLP/HTTP receiver in this test, which decodes every `ExportTraceServiceRequest` with the
//! official OTLP protobuf definitions (the `opentelemetry-proto` crate) and keeps the spans
//! with the time each arrived. The testbed drives the scenarios of the e2e tests (success,
//! error 3, a hang in `UVM_REGISTER_GPU`); the spans are checked for names, parentage,
//! attributes and timestamps, against the agent's own JSON log for the same calls, and the
//! hang's stall must arrive while `cuInit` is still stuck. Root only; single-threaded.
//!
//! One file because the receiver, the agent run and the span checks are one fixture that every
//! test here uses; the span shapes themselves are unit-tested in `export/otlp/tests/`.

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::{artifacts, Agent};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
    common::v1::{any_value::Value as Any, KeyValue},
    trace::v1::{span::SpanKind, status::StatusCode, Span},
};
use prost::Message;
use serde_json::Value;
use uvmwatch_testbed::{
    nv, write_snapshot_fixture, FakeDev, FakeDevConfig, IoctlAction, IoctlRule, Scenario,
    SnapshotSpec, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);

/// The cuInit sequence of the test library on `/dev/nvidia-uvm` (as in e2e.rs).
const UVM_SEQUENCE: &[&str] = &[
    "UVM_INITIALIZE",
    "UVM_MM_INITIALIZE",
    "UVM_PAGEABLE_MEM_ACCESS",
    "UVM_REGISTER_GPU",
    "UVM_CREATE_RANGE_GROUP",
];

// --- the receiver -----------------------------------------------------------------------------

/// One decoded export request and when it arrived.
struct Received {
    at: Instant,
    req: ExportTraceServiceRequest,
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces` with a protobuf body (gzip
/// accepted), keep-alive, answers `200` with an empty `ExportTraceServiceResponse`.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Received>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let r = Receiver {
            port,
            got: Default::default(),
            errors: Default::default(),
        };
        let (got, errors) = (r.got.clone(), r.errors.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { break };
                let (got, errors) = (got.clone(), errors.clone());
                std::thread::spawn(move || {
                    if let Err(e) = serve(s, &got) {
                        errors.lock().unwrap().push(e);
                    }
                });
            }
        });
        r
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span so far with its arrival time.
    fn spans(&self) -> Vec<(Instant, Span)> {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "receiver errors: {errors:?}");
        self.got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.req
                    .resource_spans
                    .iter()
                    .flat_map(|rs| rs.scope_spans.iter())
                    .flat_map(|ss| ss.spans.iter())
                    .map(|s| (r.at, s.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Spans of process `pid` (every span carries `process.pid`).
    fn of(&self, pid: u32) -> Vec<(Instant, Span)> {
        self.spans()
            .into_iter()
            .filter(|(_, s)| int(&s.attributes, "process.pid") == Some(pid as i64))
            .collect()
    }

    /// Waits until the spans of `pid` satisfy `pred`.
    fn wait(
        &self,
        what: &str,
        pid: u32,
        pred: impl Fn(&[(Instant, Span)]) -> bool,
        agent: &Agent,
    ) -> Vec<(Instant, Span)> {
        let end = Instant::now() + T;
        loop {
            let s = self.of(pid);
            if pred(&s) {
                return s;
            }
            if Instant::now() > end {
                panic!(
                    "no {what} within {T:?}; spans: {:#?}\nagent log:\n{}",
                    s.iter().map(|(_, s)| &s.name).collect::<Vec<_>>(),
                    agent.raw_log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Resource attributes of the first request.
    fn resource(&self) -> Vec<KeyValue> {
        let got = self.got.lock().unwrap();
        got[0].req.resource_spans[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .clone()
    }
}

fn serve(s: TcpStream, got: &Mutex<Vec<Received>>) -> Result<(), String> {
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Ok(());
        }
        if !line.starts_with("POST /v1/traces HTTP/1.1") {
            return Err(format!("unexpected request line {line:?}"));
        }
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).map_err(|e| e.to_string())?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').ok_or(format!("bad header {h:?}"))?;
            headers.insert(k.to_ascii_lowercase(), v.trim().to_string());
        }
        if headers.get("content-type").map(String::as_str) != Some("application/x-protobuf") {
            return Err(format!("content-type: {headers:?}"));
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or(format!("no content-length: {headers:?}"))?;
        let mut body = vec![0; len];
        r.read_exact(&mut body).map_err(|e| e.to_string())?;
        if headers.get("content-encoding").map(String::as_str) == Some("gzip") {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .map_err(|e| e.to_string())?;
            body = out;
        }
        let req = ExportTraceServiceRequest::decode(&body[..])
            .map_err(|e| format!("not an ExportTraceServiceRequest: {e}"))?;
        got.lock().unwrap().push(Received {
            at: Instant::now(),
            req,
        });
        let resp = ExportTraceServiceResponse::default().encode_to_vec();
        write!(
            w,
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            resp.len()
        )
        .map_err(|e| e.to_string())?;
        w.write_all(&resp).map_err(|e| e.to_string())?;
    }
}

// --- helpers ----------------------------------------------------------------------------------

fn attr<'a>(a: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    a.iter()
        .find(|k| k.key == key)
        .and_then(|k| k.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr<'a>(a: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(a, key) {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int(a: &[KeyValue], key: &str) -> Option<i64> {
    match attr(a, key) {
        Some(Any::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn pid_is(v: &Value, pid: u32) -> bool {
    v["pid"].as_u64() == Some(pid as u64)
}

/// The environment the workload gets: what the workload identity reads from `environ`.
fn identity_env() -> Vec<(String, String)> {
    vec![
        ("RANK".into(), "3".into()),
        ("POD_NAME".into(), "infer-0".into()),
        ("POD_NAMESPACE".into(), "llm".into()),
        ("HF_TOKEN".into(), "hf_secret_never_exported".into()),
    ]
}

fn workload(dev: &FakeDev, scenario: Scenario) -> Workload {
    Workload::spawn(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            lib_location: common::host_lib().location(),
            extra_env: identity_env(),
            ..WorkloadConfig::default()
        },
    )
    .expect("spawn workload")
}

/// The host of diagnosis.rs's motivating incident (HMM on, its device memory never set up),
/// so that the failure and the hang get a diagnosis (`hmm_setup_failure`).
fn incident_host() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-otlp-snapshot")
        .tempdir()
        .unwrap();
    let spec = SnapshotSpec {
        iomem_hmm: false,
        uvm_disable_hmm: false,
        ..SnapshotSpec::default()
    };
    write_snapshot_fixture(dir.path(), &spec).unwrap();
    dir
}

/// Whether `s` carries a `uvmwatch.diagnosis` event for `rule`.
fn has_diagnosis(s: &Span, rule: &str) -> bool {
    s.events.iter().any(|e| {
        e.name == "uvmwatch.diagnosis"
            && str_attr(&e.attributes, "uvmwatch.diagnosis.rule") == Some(rule)
    })
}

/// `UVM_INITIALIZE` answered after this long: the call stays in `cuInit` long enough for the
/// agent to read the process's identity from procfs even on a loaded machine (the workload
/// exits right after `cuInit`), and the span must show the time.
const INIT_DELAY: Duration = Duration::from_millis(300);

fn slow_init_dev() -> FakeDev {
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(
            nv::UVM_INITIALIZE,
            IoctlAction::Delay(INIT_DELAY),
        )],
        ..FakeDevConfig::default()
    };
    FakeDev::start(artifacts(), cfg).unwrap()
}

/// The `UVM_INITIALIZE` span lasts at least [`INIT_DELAY`].
fn check_init_delay(spans: &[Span]) {
    let s = spans
        .iter()
        .find(|s| s.name == "UVM_INITIALIZE")
        .expect("UVM_INITIALIZE span");
    assert!(
        s.end_time_unix_nano - s.start_time_unix_nano >= INIT_DELAY.as_nanos() as u64,
        "UVM_INITIALIZE span shorter than the fake driver's delay"
    );
}

fn start_agent(r: &Receiver, extra: &[&str]) -> Agent {
    let url = r.url();
    let mut args = vec!["--otlp-endpoint", url.as_str(), "--node-name", "test-node"];
    args.extend_from_slice(extra);
    Agent::start(&args)
}

/// Checks shared by every scenario: the `cuInit` span's shape and attributes, and that its
/// children are its children (same trace, inside it in time, in order).
fn check_cuinit_tree(spans: &[Span], pid: u32, wall_before: u64) -> Span {
    let cus: Vec<&Span> = spans.iter().filter(|s| s.name == "cuInit").collect();
    assert_eq!(cus.len(), 1, "one cuInit span");
    let cu = cus[0].clone();
    assert!(cu.parent_span_id.is_empty(), "cuInit is a root span");
    assert_eq!(cu.kind, SpanKind::Internal as i32);
    assert_eq!(cu.trace_id.len(), 16);
    assert_eq!(cu.span_id.len(), 8);
    assert!(cu.trace_id.iter().any(|b| *b != 0));
    // Unix-epoch nanoseconds, taken during this test.
    assert!(
        cu.start_time_unix_nano >= wall_before - 1_000_000_000,
        "start {} before the test began {}",
        cu.start_time_unix_nano,
        wall_before
    );
    assert!(cu.end_time_unix_nano <= unix_now() + 1_000_000_000);
    assert!(cu.start_time_unix_nano < cu.end_time_unix_nano);
    let a = &cu.attributes;
    assert_eq!(int(a, "process.pid"), Some(pid as i64));
    assert_eq!(
        str_attr(a, "process.executable.name"),
        Some("cuda-workload")
    );
    let cmd = str_attr(a, "process.command_line").unwrap();
    assert!(cmd.contains("cuda-workload --lib"), "{cmd}");
    assert!(int(a, "thread.id").is_some());
    // Workload identity, from the workload's environ.
    assert_eq!(int(a, "uvmwatch.tp_rank"), Some(3));
    assert_eq!(str_attr(a, "k8s.pod.name"), Some("infer-0"));
    assert_eq!(str_attr(a, "k8s.namespace.name"), Some("llm"));
    assert_eq!(
        str_attr(a, "uvmwatch.engine"),
        None,
        "a C program is no engine"
    );
    for s in spans.iter().flat_map(|s| s.attributes.iter()) {
        if let Some(Any::StringValue(v)) = s.value.as_ref().and_then(|v| v.value.as_ref()) {
            assert!(!v.contains("hf_secret"), "environment leaked: {}", s.key);
        }
    }
    // Children: same trace, parent = cuInit, inside it, not overlapping one another (one
    // thread), process.pid on each.
    let mut kids: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name != "cuInit" && !s.name.starts_with("uvmwatch."))
        .collect();
    kids.sort_by_key(|s| s.start_time_unix_nano);
    assert!(!kids.is_empty());
    for k in &kids {
        assert_eq!(k.trace_id, cu.trace_id, "{} in the cuInit trace", k.name);
        assert_eq!(k.parent_span_id, cu.span_id, "{} child of cuInit", k.name);
        assert!(
            k.start_time_unix_nano >= cu.start_time_unix_nano,
            "{}",
            k.name
        );
        assert!(k.end_time_unix_nano <= cu.end_time_unix_nano, "{}", k.name);
        assert!(k.start_time_unix_nano <= k.end_time_unix_nano, "{}", k.name);
        assert_eq!(k.kind, SpanKind::Internal as i32);
        assert_eq!(int(&k.attributes, "process.pid"), Some(pid as i64));
        assert_eq!(int(&k.attributes, "thread.id"), int(a, "thread.id"));
    }
    for w in kids.windows(2) {
        assert!(
            w[0].end_time_unix_nano <= w[1].start_time_unix_nano,
            "{} and {} overlap on one thread",
            w[0].name,
            w[1].name
        );
    }
    // The UVM calls, in the library's order.
    let uvm: Vec<&str> = kids
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| n.starts_with("UVM_"))
        .collect();
    let expected: Vec<&str> = UVM_SEQUENCE
        .iter()
        .copied()
        .filter(|n| uvm.contains(n))
        .collect();
    assert_eq!(uvm, expected, "UVM calls in order");
    for k in kids.iter().filter(|s| s.name.starts_with("UVM_")) {
        assert_eq!(
            str_attr(&k.attributes, "uvmwatch.ioctl.node"),
            Some("/dev/nvidia-uvm")
        );
        assert!(str_attr(&k.attributes, "uvmwatch.ioctl.result").is_some());
    }
    cu
}

fn check_resource(r: &Receiver) {
    let res = r.resource();
    assert_eq!(str_attr(&res, "service.name"), Some("uvmwatch"));
    assert_eq!(
        str_attr(&res, "service.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(str_attr(&res, "host.name"), Some(host.trim()));
    assert_eq!(str_attr(&res, "k8s.node.name"), Some("test-node"));
}

// --- scenarios --------------------------------------------------------------------------------

#[test]
fn otlp_success_exports_cuinit_with_every_driver_call_as_a_child() {
    require_env!("otlp_success_exports_cuinit_with_every_driver_call_as_a_child");
    let r = Receiver::start();
    let agent = start_agent(&r, &[]);
    let wall_before = unix_now();
    let dev = slow_init_dev();
    let mut w = workload(&dev, Scenario::Success);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let pid = w.pid();
    let end = agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    let calls = end["driver_calls"].as_u64().unwrap() as usize;
    let opens = end["device_opens"].as_u64().unwrap() as usize;
    let spans: Vec<Span> = r
        .wait(
            "cuInit and its children",
            pid,
            |s| s.iter().any(|(_, s)| s.name == "cuInit") && s.len() > calls + opens,
            &agent,
        )
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    let cu = check_cuinit_tree(&spans, pid, wall_before);
    check_init_delay(&spans);
    assert!(cu.status.is_none(), "success leaves the status unset");
    assert_eq!(
        str_attr(&cu.attributes, "uvmwatch.cuinit.result"),
        Some("CUDA_SUCCESS")
    );
    // Same call as the log: duration to the nanosecond (both from the kernel's clock), one
    // span per driver call and device open counted there.
    let log_ns = (end["duration_seconds"].as_f64().unwrap() * 1e9).round() as i64;
    let span_ns = (cu.end_time_unix_nano - cu.start_time_unix_nano) as i64;
    assert!(
        (log_ns - span_ns).abs() <= 1_000,
        "log {log_ns} ns, span {span_ns} ns"
    );
    let ioctls = spans
        .iter()
        .filter(|s| s.name != "cuInit" && !s.name.starts_with("open "))
        .count();
    let open_spans: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("open "))
        .collect();
    assert_eq!(ioctls, calls, "one span per driver call");
    assert_eq!(open_spans.len(), opens, "one span per device open");
    for o in &open_spans {
        let path = str_attr(&o.attributes, "file.path").unwrap();
        assert_eq!(o.name, format!("open {path}"));
        assert!(path.starts_with("/dev/nvidia"), "{path}");
        assert!(o.status.is_none());
    }
    for n in UVM_SEQUENCE {
        let s = spans
            .iter()
            .find(|s| s.name == *n)
            .unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(
            str_attr(&s.attributes, "uvmwatch.ioctl.rm_status"),
            Some("NV_OK")
        );
        assert!(s.status.is_none());
    }
    for n in [
        "NV_ESC_SYS_PARAMS",
        "NV_ESC_CARD_INFO",
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_CONTROL",
        "NV_ESC_RM_FREE",
    ] {
        assert!(
            spans.iter().any(|s| s.name == n
                && str_attr(&s.attributes, "uvmwatch.ioctl.node") == Some("/dev/nvidiactl")),
            "{n} on nvidiactl"
        );
    }
    check_resource(&r);
    assert!(agent.stop());
}

#[test]
fn otlp_error_3_marks_cuinit_and_the_failing_call_as_errors() {
    require_env!("otlp_error_3_marks_cuinit_and_the_failing_call_as_errors");
    let r = Receiver::start();
    let snap = incident_host();
    let agent = start_agent(&r, &["--evidence-root", snap.path().to_str().unwrap()]);
    let wall_before = unix_now();
    let dev = slow_init_dev();
    let mut w = workload(&dev, Scenario::RegisterGpuNoMemory);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
    let pid = w.pid();
    agent.expect_event(
        "cuinit_end",
        |v| v["event"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    let spans: Vec<Span> = r
        .wait(
            "cuInit",
            pid,
            |s| s.iter().any(|(_, s)| s.name == "cuInit"),
            &agent,
        )
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    let cu = check_cuinit_tree(&spans, pid, wall_before);
    check_init_delay(&spans);
    let st = cu.status.as_ref().expect("status");
    assert_eq!(st.code, StatusCode::Error as i32);
    assert_eq!(st.message, "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(int(&cu.attributes, "uvmwatch.cuinit.result_code"), Some(3));
    assert_eq!(
        str_attr(&cu.attributes, "error.type"),
        Some("CUDA_ERROR_NOT_INITIALIZED")
    );
    let reg = spans
        .iter()
        .find(|s| s.name == "UVM_REGISTER_GPU")
        .expect("UVM_REGISTER_GPU span");
    assert_eq!(reg.parent_span_id, cu.span_id);
    let st = reg.status.as_ref().expect("status");
    assert_eq!(st.code, StatusCode::Error as i32);
    assert_eq!(st.message, "NV_ERR_NO_MEMORY");
    assert_eq!(
        str_attr(&reg.attributes, "uvmwatch.ioctl.rm_status"),
        Some("NV_ERR_NO_MEMORY")
    );
    assert_eq!(
        str_attr(&reg.attributes, "error.type"),
        Some("NV_ERR_NO_MEMORY")
    );
    // The diagnosis of this failure rides on the cuInit span (or on a uvmwatch.diagnosis
    // span under it when the cuInit span had already left).
    let d = agent.expect_event(
        "diagnosis",
        |v| v["event"] == "diagnosis" && v["trigger"] == "cuinit_end" && pid_is(v, pid),
        T,
    );
    let rule = d["rule"].as_str().unwrap().to_string();
    assert_eq!(rule, "hmm_setup_failure");
    let spans = r.wait(
        "diagnosis event",
        pid,
        |s| {
            s.iter().any(|(_, s)| {
                (s.span_id == cu.span_id || s.parent_span_id == cu.span_id)
                    && has_diagnosis(s, &rule)
            })
        },
        &agent,
    );
    let (_, carrier) = spans.iter().find(|(_, s)| has_diagnosis(s, &rule)).unwrap();
    let ev = carrier
        .events
        .iter()
        .find(|e| e.name == "uvmwatch.diagnosis")
        .unwrap();
    assert_eq!(
        str_attr(&ev.attributes, "uvmwatch.diagnosis.severity"),
        d["severity"].as_str()
    );
    assert_eq!(
        str_attr(&ev.attributes, "uvmwatch.diagnosis.runbook"),
        Some("docs/runbooks/hmm_setup_failure.md")
    );
    assert!(str_attr(&ev.attributes, "uvmwatch.diagnosis.fix")
        .unwrap()
        .contains("uvm_disable_hmm=1"));
    assert!(ev.time_unix_nano >= cu.end_time_unix_nano);
    assert!(agent.stop());
}

#[test]
fn otlp_stall_is_exported_while_cuinit_hangs_and_ids_match_when_it_ends() {
    require_env!("otlp_stall_is_exported_while_cuinit_hangs_and_ids_match_when_it_ends");
    let r = Receiver::start();
    let snap = incident_host();
    let agent = start_agent(
        &r,
        &[
            "--evidence-root",
            snap.path().to_str().unwrap(),
            "--ioctl-stall",
            "1s",
            "--cuinit-stall",
            "2s",
        ],
    );
    let wall_before = unix_now();
    let cfg = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
        ..FakeDevConfig::default()
    };
    let dev = FakeDev::start(artifacts(), cfg).unwrap();
    let started = Instant::now();
    let mut w = workload(&dev, Scenario::HangRegisterGpu);
    let pid = w.pid();

    // The stall, as the agent logs it, and as it reaches the receiver.
    let (logged_at, stall) = agent
        .wait_event_at(
            |v| v["event"] == "stall" && v["call"] == "cuInit" && pid_is(v, pid),
            T,
        )
        .unwrap_or_else(|| panic!("no cuInit stall; log:\n{}", agent.raw_log()));
    let stall_call = |s: &Span| {
        s.events
            .iter()
            .find(|e| e.name == "uvmwatch.stall")
            .and_then(|e| str_attr(&e.attributes, "uvmwatch.stall.call"))
            .map(str::to_string)
    };
    let early = r.wait(
        "uvmwatch.stall spans of the ioctl and of cuInit",
        pid,
        |s| {
            s.iter()
                .any(|(_, s)| stall_call(s).as_deref() == Some("cuInit"))
                && s.iter()
                    .any(|(_, s)| stall_call(s).as_deref() == Some("UVM_REGISTER_GPU"))
        },
        &agent,
    );
    let (arrived, marker) = early
        .iter()
        .find(|(_, s)| s.name == "uvmwatch.stall" && stall_call(s).as_deref() == Some("cuInit"))
        .cloned()
        .unwrap();
    let (_, io_marker) = early
        .iter()
        .find(|(_, s)| {
            s.name == "uvmwatch.stall" && stall_call(s).as_deref() == Some("UVM_REGISTER_GPU")
        })
        .cloned()
        .unwrap();
    // Still hung: nothing released yet, and cuInit has not been exported.
    assert!(
        !r.of(pid).iter().any(|(_, s)| s.name == "cuInit"),
        "cuInit exported before it ended"
    );
    assert!(
        !r.of(pid).iter().any(|(_, s)| s.name == "UVM_REGISTER_GPU"),
        "the hung ioctl exported before it ended"
    );
    let lag = arrived.saturating_duration_since(logged_at);
    eprintln!("measured: stall span arrived {lag:?} after the agent logged the stall");
    assert!(lag < Duration::from_secs(1), "stall exported {lag:?} late");
    assert_eq!(marker.parent_span_id.len(), 8, "marker has a parent");
    assert_eq!(marker.start_time_unix_nano, marker.end_time_unix_nano);
    let ev = marker
        .events
        .iter()
        .find(|e| e.name == "uvmwatch.stall")
        .expect("stall event on the marker");
    assert_eq!(
        str_attr(&ev.attributes, "uvmwatch.stall.call"),
        Some("cuInit")
    );
    assert_eq!(
        str_attr(&ev.attributes, "uvmwatch.stall.inside"),
        stall["inside"].as_str()
    );
    assert_eq!(
        str_attr(&ev.attributes, "uvmwatch.thread.wchan"),
        stall["wchan"].as_str()
    );
    assert_eq!(ev.time_unix_nano, marker.start_time_unix_nano);

    // Released about 4 s into cuInit (the workload calls it 1.5 s after it starts): the
    // ioctl and cuInit return.
    let hold = Duration::from_millis(1500 + 4000).saturating_sub(started.elapsed());
    std::thread::sleep(hold);
    dev.release().unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let all: Vec<(Instant, Span)> = r.wait(
        "cuInit after release",
        pid,
        |s| s.iter().any(|(_, s)| s.name == "cuInit"),
        &agent,
    );
    let cu_arrived = all.iter().find(|(_, s)| s.name == "cuInit").unwrap().0;
    assert!(
        arrived < cu_arrived,
        "the stall arrived before cuInit ended"
    );
    let spans: Vec<Span> = all.into_iter().map(|(_, s)| s).collect();
    let tree: Vec<Span> = spans
        .iter()
        .filter(|s| s.name != "uvmwatch.stall" && s.name != "uvmwatch.diagnosis")
        .cloned()
        .collect();
    let cu = check_cuinit_tree(&tree, pid, wall_before);
    // The ids chosen at cuInit's start are those of the span that ended.
    assert_eq!(
        marker.parent_span_id, cu.span_id,
        "marker under the cuInit span"
    );
    assert_eq!(marker.trace_id, cu.trace_id);
    assert!(marker.start_time_unix_nano >= cu.start_time_unix_nano + 2_000_000_000);
    assert!(marker.start_time_unix_nano <= cu.end_time_unix_nano);
    assert!(cu.end_time_unix_nano - cu.start_time_unix_nano >= 3_000_000_000);
    let end_log = agent.expect_event(
        "stall_end",
        |v| v["event"] == "stall_end" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    let log_ns = (end_log["duration_seconds"].as_f64().unwrap() * 1e9).round() as i64;
    let span_ns = (cu.end_time_unix_nano - cu.start_time_unix_nano) as i64;
    assert!(
        (log_ns - span_ns).abs() <= 1_000,
        "log {log_ns} ns, span {span_ns} ns"
    );
    let names: Vec<&str> = cu.events.iter().map(|e| e.name.as_str()).collect();
    let stall_at = names.iter().position(|n| *n == "uvmwatch.stall");
    let end_at = names.iter().position(|n| *n == "uvmwatch.stall_end");
    assert!(
        matches!((stall_at, end_at), (Some(a), Some(b)) if a < b),
        "{names:?}"
    );
    let end_ev = cu
        .events
        .iter()
        .find(|e| e.name == "uvmwatch.stall_end")
        .unwrap();
    assert_eq!(
        str_attr(&end_ev.attributes, "uvmwatch.stall.outcome"),
        Some("returned")
    );
    let times: Vec<u64> = cu.events.iter().map(|e| e.time_unix_nano).collect();
    assert!(times.is_sorted(), "events in time order");
    assert!(times
        .iter()
        .all(|t| *t >= cu.start_time_unix_nano && *t <= cu.end_time_unix_nano));
    let reg = tree
        .iter()
        .find(|s| s.name == "UVM_REGISTER_GPU")
        .expect("UVM_REGISTER_GPU span");
    assert!(
        reg.end_time_unix_nano - reg.start_time_unix_nano >= 1_500_000_000,
        "the hung ioctl's span covers the hang"
    );
    // The ioctl's own stall hangs under the ioctl's span, fixed when that stall was seen.
    assert_eq!(
        io_marker.parent_span_id, reg.span_id,
        "ioctl marker under its span"
    );
    assert_eq!(io_marker.trace_id, cu.trace_id);
    assert_eq!(reg.parent_span_id, cu.span_id);
    assert!(io_marker.start_time_unix_nano >= reg.start_time_unix_nano + 1_000_000_000);
    assert_eq!(
        reg.events.first().map(|e| e.name.as_str()),
        Some("uvmwatch.stall")
    );
    // The diagnosis made at the stall left while cuInit was stuck (on the marker or on a
    // uvmwatch.diagnosis span under cuInit), and is on the cuInit span too.
    let rules: Vec<String> = agent
        .events("diagnosis")
        .into_iter()
        .filter(|v| pid_is(v, pid) && v["trigger"] == "stall")
        .filter_map(|v| v["rule"].as_str().map(str::to_string))
        .collect();
    assert!(
        rules.iter().any(|r| r == "hmm_setup_failure"),
        "diagnosed at the stall: {rules:?}"
    );
    for rule in &rules {
        assert!(has_diagnosis(&cu, rule), "{rule} on the cuInit span");
        let live = spans.iter().find(|s| {
            s.name.starts_with("uvmwatch.") && s.trace_id == cu.trace_id && has_diagnosis(s, rule)
        });
        let live = live.unwrap_or_else(|| panic!("{rule} exported live"));
        let at = r
            .of(pid)
            .into_iter()
            .find(|(_, s)| s.span_id == live.span_id)
            .map(|(at, _)| at)
            .unwrap();
        assert!(at < cu_arrived, "{rule} arrived before cuInit ended");
    }
    check_resource(&r);
    assert!(agent.stop());
}

// --- joining the workload's own trace ---------------------------------------------------------

/// A Python with the OpenTelemetry SDK and its OTLP/HTTP exporter (`cargo xtask setup`
/// installs them in target/tools/otel-venv; `$UVMWATCH_OTEL_PYTHON` overrides), or why none.
fn otel_python() -> Result<std::path::PathBuf, String> {
    common::tool_python(
        "UVMWATCH_OTEL_PYTHON",
        "target/tools/otel-venv",
        "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter",
        false,
    )
    .ok_or_else(|| {
        "no Python with opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http \
         (cargo xtask setup installs them in target/tools/otel-venv)"
            .into()
    })
}

#[test]
fn otlp_cuinit_joins_the_trace_its_parent_passed_in_traceparent() {
    let name = "otlp_cuinit_joins_the_trace_its_parent_passed_in_traceparent";
    require_env!(name);
    let python = match otel_python() {
        Ok(p) => p,
        Err(why) => {
            uvmwatch_testbed::skip(name, &why);
            return;
        }
    };
    let r = Receiver::start();
    let agent = start_agent(&r, &[]);
    // The parent: a real OpenTelemetry SDK opens its start-up span and gives the context a
    // child gets in TRACEPARENT (OpenTelemetry's environment carrier).
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/otel/startup_parent.py");
    let mut parent = std::process::Command::new(&python)
        .arg(&script)
        .arg(format!("{}/v1/traces", r.url()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the instrumented parent");
    let mut out = BufReader::new(parent.stdout.take().unwrap());
    let mut traceparent = String::new();
    out.read_line(&mut traceparent).unwrap();
    let traceparent = traceparent.trim().to_string();
    assert!(traceparent.starts_with("00-"), "{traceparent:?}");
    // The CUDA workload, started with it.
    let dev = slow_init_dev();
    let mut w = Workload::spawn(
        &dev,
        artifacts(),
        WorkloadConfig {
            scenario: Scenario::Success,
            lib_location: common::host_lib().location(),
            extra_env: vec![("TRACEPARENT".into(), traceparent.clone())],
            ..WorkloadConfig::default()
        },
    )
    .expect("spawn workload");
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    let pid = w.pid();
    // The parent's start-up ends: its span is exported by the SDK.
    parent.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let mut ids = String::new();
    out.read_line(&mut ids).unwrap();
    assert!(parent.wait().unwrap().success());
    let (trace_hex, span_hex) = ids.trim().split_once(' ').expect("trace and span ids");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    // Flags: sampled, and (Trace Context Level 2) the random trace id bit the SDK sets.
    assert!(
        traceparent.starts_with(&format!("00-{trace_hex}-{span_hex}-")),
        "{traceparent}"
    );

    let spans = r.wait(
        "the cuInit span",
        pid,
        |s| s.iter().any(|(_, s)| s.name == "cuInit"),
        &agent,
    );
    let cu = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "cuInit")
        .unwrap();
    // One trace: the SDK's span, and the agent's cuInit under it.
    let theirs = r
        .spans()
        .into_iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "Init device")
        .expect("the parent's span reached the receiver");
    assert_eq!(hex(&theirs.trace_id), trace_hex);
    assert_eq!(hex(&theirs.span_id), span_hex);
    assert_eq!(
        hex(&cu.trace_id),
        trace_hex,
        "cuInit is in the parent's trace"
    );
    assert_eq!(
        hex(&cu.parent_span_id),
        span_hex,
        "cuInit is under the parent's span"
    );
    assert_eq!(
        str_attr(&cu.attributes, "uvmwatch.trace.parent_from"),
        Some("TRACEPARENT")
    );
    // Its driver calls under it, in the same trace.
    for (_, s) in spans.iter().filter(|(_, s)| s.name != "cuInit") {
        assert_eq!(s.trace_id, cu.trace_id, "{}", s.name);
    }
    assert!(cu.start_time_unix_nano >= theirs.start_time_unix_nano);
    assert!(cu.end_time_unix_nano <= theirs.end_time_unix_nano);
    agent.stop();
}

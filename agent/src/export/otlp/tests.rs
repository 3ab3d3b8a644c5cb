//! The exporter against a minimal OTLP/HTTP receiver that decodes with the official
//! definitions: spans, ids, attributes, stalls and findings, retries, drops, shutdown.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{atomic::Ordering, Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span};
use prost::Message;

use super::client::Endpoint;
use super::exporter::Ids;
use super::*;
use crate::doctor::finding::{Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use crate::event::{testing as mk, Event, Kind, Process, StallOutcome, Trigger};

/// A minimal OTLP/HTTP receiver: decodes every `ExportTraceServiceRequest` with the
/// official definitions and answers with the queued status codes (then 200).
struct Collector {
    port: u16,
    got: Arc<Mutex<Vec<(Instant, ExportTraceServiceRequest)>>>,
    statuses: Arc<Mutex<VecDeque<u16>>>,
    encodings: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    fn start() -> Collector {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = Collector {
            port,
            got: Default::default(),
            statuses: Default::default(),
            encodings: Default::default(),
        };
        let (got, statuses, enc) = (c.got.clone(), c.statuses.clone(), c.encodings.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { break };
                let (got, statuses, enc) = (got.clone(), statuses.clone(), enc.clone());
                std::thread::spawn(move || serve(s, got, statuses, enc));
            }
        });
        c
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Span> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, r)| r.resource_spans.iter())
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }

    fn wait(&self, what: &str, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.spans();
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < end, "no {what}; got {s:#?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn serve(
    s: std::net::TcpStream,
    got: Arc<Mutex<Vec<(Instant, ExportTraceServiceRequest)>>>,
    statuses: Arc<Mutex<VecDeque<u16>>>,
    enc: Arc<Mutex<Vec<String>>>,
) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/traces HTTP/1.1"), "{line}");
        let (mut len, mut encoding) = (0usize, String::new());
        let mut ctype = String::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse().unwrap(),
                "content-encoding" => encoding = v.trim().to_string(),
                "content-type" => ctype = v.trim().to_string(),
                _ => {}
            }
        }
        assert_eq!(ctype, "application/x-protobuf");
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        if encoding == "gzip" {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .unwrap();
            body = out;
        }
        enc.lock().unwrap().push(encoding);
        let status = statuses.lock().unwrap().pop_front().unwrap_or(200);
        if status == 200 {
            let req = ExportTraceServiceRequest::decode(&body[..]).expect("valid OTLP");
            got.lock().unwrap().push((Instant::now(), req));
        }
        let resp = ExportTraceServiceResponse::default().encode_to_vec();
        write!(
            w,
            "HTTP/1.1 {status} X\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            resp.len()
        )
        .unwrap();
        w.write_all(&resp).unwrap();
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|k| k.key == key)
        .and_then(|k| k.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn s_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn i_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

/// A procfs-like tree with a vLLM server as pid 4242 (thread 4243 alive).
fn fake_proc() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("4242");
    std::fs::create_dir_all(d.join("task/4243")).unwrap();
    std::fs::write(
        d.join("cmdline"),
        "/usr/bin/python3\0/usr/local/bin/vllm\0serve\0nvidia/Llama-3.1-8B-Instruct-FP4\0--api-key\0sk-123\0",
    )
    .unwrap();
    std::fs::write(
        d.join("environ"),
        "RANK=1\0POD_NAMESPACE=llm\0HOSTNAME=vllm-0\0",
    )
    .unwrap();
    std::fs::write(d.join("stat"), "4242 (python3) S 1 1 1").unwrap();
    std::fs::write(d.join("cgroup"), "0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n").unwrap();
    t
}

/// The vLLM server of [`fake_proc`], as the observer's identity of it reads.
fn proc_info(root: &Path) -> Arc<Process> {
    Arc::new(Process {
        pid: 4242,
        ns_pid: Some(7),
        comm: "python3".into(),
        exe: "/usr/bin/python3.12".into(),
        cmdline: [
            "/usr/bin/python3",
            "/usr/local/bin/vllm",
            "serve",
            "nvidia/Llama-3.1-8B-Instruct-FP4",
            "--api-key",
            "sk-123",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        container_id: Some(
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        ),
        workload: crate::host::workload::identify(root, 4242),
    })
}

fn send(sink: &mut OtlpListener, e: Event) {
    sink.event(&Arc::new(e));
}

/// A failure or stall with its findings, then the findings, as the observer sends them.
fn send_with_findings(
    sink: &mut OtlpListener,
    mut e: Event,
    findings: &[Finding],
    trigger: Trigger,
) {
    let fs: Vec<Arc<Finding>> = findings.iter().cloned().map(Arc::new).collect();
    match &mut e.kind {
        Kind::CuinitEnd(c) => c.findings = fs.clone(),
        Kind::Open(o) => o.findings = fs.clone(),
        Kind::Stall(st) => st.findings = fs.clone(),
        _ => panic!("no findings on {:?}", e.kind),
    }
    let (p, ts) = (e.process.clone().unwrap(), e.ts_ns);
    send(sink, e);
    for f in findings {
        send(sink, mk::diagnosis(&p, ts, f, trigger));
    }
}

fn config(c: &Collector, root: &Path) -> OtlpConfig {
    let mut cfg = OtlpConfig::new(c.endpoint());
    cfg.proc_root = root.to_path_buf();
    cfg.export_interval = Duration::from_secs(30);
    cfg.host_name = Some("gpu-node-1".into());
    cfg.node_name = Some("node-a".into());
    cfg
}

fn finding() -> Finding {
    Finding {
        rule: "uvm_register_gpu_no_memory".into(),
        title: "UVM could not register the GPU".into(),
        severity: Severity::Critical,
        confidence: Confidence::High,
        evidence: vec![EvidenceItem {
            what: "UVM_REGISTER_GPU".into(),
            value: "NV_ERR_NO_MEMORY".into(),
            source: "probe:ioctl".into(),
        }],
        unchecked: vec![],
        fix: vec![FixStep {
            where_: Where::Host,
            commands: vec!["nvidia-smi -q".into()],
            note: "look".into(),
        }],
        runbook: "docs/runbooks/uvm_register_gpu_no_memory.md".into(),
    }
}

struct Seq {
    t: u64,
}
impl Seq {
    fn new() -> Seq {
        Seq {
            t: crate::clock::monotonic_ns(),
        }
    }
    fn at(&mut self, ms: u64) -> u64 {
        self.t += ms * 1_000_000;
        self.t
    }
}

#[allow(clippy::too_many_arguments)]
fn ioctl(
    sink: &mut OtlpListener,
    p: &Arc<Process>,
    tid: u32,
    s: u64,
    e: u64,
    name: &str,
    result: &str,
    failed: bool,
    in_cuinit: bool,
) {
    send(
        sink,
        mk::ioctl(
            p,
            tid,
            s,
            e,
            name,
            "/dev/nvidia-uvm",
            result,
            failed,
            in_cuinit,
        ),
    );
}

#[test]
fn cuinit_is_a_root_span_with_its_driver_calls_as_children() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    let mut t = Seq::new();
    let t0 = t.at(0);
    let wall_before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    send(&mut sink, mk::cuinit_start(&p, 4243, t0));
    let (o1, o2) = (t.at(1), t.at(1));
    send(
        &mut sink,
        mk::open(&p, 4243, o1, o2, "/dev/nvidiactl", None, true),
    );
    let mut names = Vec::new();
    for n in ["UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU"] {
        let (s, e) = (t.at(1), t.at(2));
        ioctl(&mut sink, &p, 4243, s, e, n, "NV_OK", false, true);
        names.push(n);
    }
    let end = t.at(3);
    send(
        &mut sink,
        mk::cuinit_end(&p, 4243, t0, end, 0, "CUDA_SUCCESS"),
    );
    sink.flush();
    let spans = c.wait("5 spans", |s| s.len() >= 5);
    drop(sink);
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
    assert!(cu.parent_span_id.is_empty());
    assert_eq!(cu.kind, span::SpanKind::Internal as i32);
    assert_eq!(cu.trace_id.len(), 16);
    assert_eq!(cu.span_id.len(), 8);
    assert!(cu.status.is_none(), "success leaves the status unset");
    assert_eq!(cu.end_time_unix_nano - cu.start_time_unix_nano, end - t0);
    // Wall clock: the monotonic times were converted (within a second of now).
    assert!(cu.start_time_unix_nano + 1_000_000_000 > wall_before);
    assert!(cu.start_time_unix_nano < wall_before + 1_000_000_000);
    let a = &cu.attributes;
    assert_eq!(i_attr(a, "process.pid"), Some(4242));
    assert_eq!(i_attr(a, "process.vpid"), Some(7));
    assert_eq!(i_attr(a, "thread.id"), Some(4243));
    assert_eq!(s_attr(a, "process.executable.name"), Some("python3.12"));
    assert_eq!(
        s_attr(a, "process.command_line"),
        Some("/usr/bin/python3 /usr/local/bin/vllm serve nvidia/Llama-3.1-8B-Instruct-FP4 --api-key [REDACTED]")
    );
    assert_eq!(s_attr(a, "uvmwatch.engine"), Some("vllm"));
    assert_eq!(
        s_attr(a, "uvmwatch.model"),
        Some("nvidia/Llama-3.1-8B-Instruct-FP4")
    );
    assert_eq!(s_attr(a, "uvmwatch.quantization"), Some("nvfp4"));
    assert_eq!(i_attr(a, "uvmwatch.tp_rank"), Some(1));
    assert_eq!(s_attr(a, "k8s.namespace.name"), Some("llm"));
    assert_eq!(s_attr(a, "k8s.pod.name"), Some("vllm-0"));
    assert_eq!(
        s_attr(a, "k8s.pod.uid"),
        Some("11111111-2222-3333-4444-555555555555")
    );
    assert!(s_attr(a, "container.id").unwrap().starts_with("0123"));
    assert_eq!(s_attr(a, "uvmwatch.cuinit.result"), Some("CUDA_SUCCESS"));
    for s in spans.iter().filter(|s| s.name != "cuInit") {
        assert_eq!(s.trace_id, cu.trace_id, "{}", s.name);
        assert_eq!(s.parent_span_id, cu.span_id, "{}", s.name);
        assert!(s.start_time_unix_nano >= cu.start_time_unix_nano);
        assert!(s.end_time_unix_nano <= cu.end_time_unix_nano);
        assert!(s.start_time_unix_nano <= s.end_time_unix_nano);
        assert_eq!(i_attr(&s.attributes, "process.pid"), Some(4242));
        assert_eq!(s_attr(&s.attributes, "uvmwatch.engine"), None);
    }
    let open = spans
        .iter()
        .find(|s| s.name == "open /dev/nvidiactl")
        .unwrap();
    assert_eq!(
        s_attr(&open.attributes, "file.path"),
        Some("/dev/nvidiactl")
    );
    let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
    assert_eq!(
        s_attr(&reg.attributes, "uvmwatch.ioctl.node"),
        Some("/dev/nvidia-uvm")
    );
    assert_eq!(
        s_attr(&reg.attributes, "uvmwatch.ioctl.rm_status"),
        Some("NV_OK")
    );
    // Span ids unique.
    let mut ids: Vec<_> = spans.iter().map(|s| s.span_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), spans.len());
    // Resource.
    let got = c.got.lock().unwrap();
    let res = got[0].1.resource_spans[0].resource.as_ref().unwrap();
    assert_eq!(s_attr(&res.attributes, "service.name"), Some("uvmwatch"));
    assert_eq!(
        s_attr(&res.attributes, "service.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(s_attr(&res.attributes, "host.name"), Some("gpu-node-1"));
    assert_eq!(s_attr(&res.attributes, "k8s.node.name"), Some("node-a"));
    let scope = got[0].1.resource_spans[0].scope_spans[0].scope.as_ref();
    assert_eq!(scope.unwrap().name, "uvmwatch");
}

#[test]
fn a_failed_cuinit_is_an_error_and_its_diagnosis_rides_on_it() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    let mut t = Seq::new();
    let t0 = t.at(0);
    send(&mut sink, mk::cuinit_start(&p, 4243, t0));
    let (s, e) = (t.at(1), t.at(1));
    ioctl(
        &mut sink,
        &p,
        4243,
        s,
        e,
        "UVM_REGISTER_GPU",
        "NV_ERR_NO_MEMORY",
        true,
        true,
    );
    let end = t.at(1);
    let f = finding();
    send_with_findings(
        &mut sink,
        mk::cuinit_end(&p, 4243, t0, end, 3, "CUDA_ERROR_NOT_INITIALIZED"),
        std::slice::from_ref(&f),
        Trigger::CuinitEnd,
    );
    let spans = c.wait("2 spans", |s| s.len() >= 2);
    let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
    let st = cu.status.as_ref().unwrap();
    assert_eq!(st.code, status::StatusCode::Error as i32);
    assert_eq!(st.message, "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(
        s_attr(&cu.attributes, "error.type"),
        Some("CUDA_ERROR_NOT_INITIALIZED")
    );
    assert_eq!(
        i_attr(&cu.attributes, "uvmwatch.cuinit.result_code"),
        Some(3)
    );
    let ev = cu.events.iter().find(|e| e.name == DIAGNOSIS).unwrap();
    assert_eq!(
        s_attr(&ev.attributes, "uvmwatch.diagnosis.rule"),
        Some("uvm_register_gpu_no_memory")
    );
    assert_eq!(
        s_attr(&ev.attributes, "uvmwatch.diagnosis.severity"),
        Some("critical")
    );
    assert!(ev.time_unix_nano >= cu.end_time_unix_nano);
    let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
    assert_eq!(reg.status.as_ref().unwrap().message, "NV_ERR_NO_MEMORY");
    assert_eq!(reg.parent_span_id, cu.span_id);
    // A diagnosis arriving after the span left goes on a child span of it.
    send(
        &mut sink,
        mk::diagnosis(&p, t.at(5), &f, Trigger::CuinitEnd),
    );
    let spans = c.wait("diagnosis span", |s| s.iter().any(|s| s.name == DIAGNOSIS));
    let d = spans.iter().find(|s| s.name == DIAGNOSIS).unwrap();
    assert_eq!(d.parent_span_id, cu.span_id);
    assert_eq!(d.trace_id, cu.trace_id);
    assert_eq!(d.events[0].name, DIAGNOSIS);
}

#[test]
fn a_stall_is_exported_while_the_call_is_still_stuck() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    let mut t = Seq::new();
    let t0 = t.at(0);
    send(&mut sink, mk::cuinit_start(&p, 4243, t0));
    let (s, e) = (t.at(1), t.at(1));
    ioctl(
        &mut sink,
        &p,
        4243,
        s,
        e,
        "UVM_INITIALIZE",
        "NV_OK",
        false,
        true,
    );
    let reg_start = t.at(1);
    // The ioctl stalls first (threshold 1 s), then cuInit (2 s).
    let det_io = t.at(1000);
    send(
        &mut sink,
        mk::stall(
            &p,
            4243,
            "UVM_REGISTER_GPU",
            reg_start,
            det_io,
            None,
            "S (sleeping)",
            "request_wait_answer",
        ),
    );
    let det_cu = t.at(1000);
    let f = finding();
    send_with_findings(
        &mut sink,
        mk::stall(
            &p,
            4243,
            "cuInit",
            t0,
            det_cu,
            Some(("UVM_REGISTER_GPU", "/dev/nvidia-uvm")),
            "S (sleeping)",
            "request_wait_answer",
        ),
        std::slice::from_ref(&f),
        Trigger::Stall,
    );
    // Export interval is 30 s: only the stall's urgency sends these now.
    let early = c.wait("stall markers", |s| {
        s.iter().filter(|s| s.name == STALL).count() >= 2
            && s.iter()
                .any(|s| s.events.iter().any(|e| e.name == DIAGNOSIS))
    });
    assert!(
        !early.iter().any(|s| s.name == "cuInit"),
        "cuInit not ended yet"
    );
    assert!(!early.iter().any(|s| s.name == "UVM_REGISTER_GPU"));
    let cu_marker = early
        .iter()
        .find(|s| {
            s.name == STALL
                && s_attr(&s.events[0].attributes, "uvmwatch.stall.call") == Some("cuInit")
        })
        .unwrap();
    let io_marker = early
        .iter()
        .find(|s| {
            s.name == STALL
                && s_attr(&s.events[0].attributes, "uvmwatch.stall.call")
                    == Some("UVM_REGISTER_GPU")
        })
        .unwrap();
    let ev = &cu_marker.events[0];
    assert_eq!(
        s_attr(&ev.attributes, "uvmwatch.stall.inside"),
        Some("UVM_REGISTER_GPU on /dev/nvidia-uvm")
    );
    assert_eq!(
        s_attr(&ev.attributes, "uvmwatch.thread.wchan"),
        Some("request_wait_answer")
    );
    assert!(cu_marker.events.iter().any(|e| e.name == DIAGNOSIS));
    assert_eq!(cu_marker.start_time_unix_nano, cu_marker.end_time_unix_nano);
    // Released: the ioctl returns, then cuInit.
    let reg_end = t.at(1500);
    send(
        &mut sink,
        mk::stall_end(
            &p,
            4243,
            "UVM_REGISTER_GPU",
            reg_start,
            reg_end,
            StallOutcome::Returned,
        ),
    );
    ioctl(
        &mut sink,
        &p,
        4243,
        reg_start,
        reg_end,
        "UVM_REGISTER_GPU",
        "NV_OK",
        false,
        true,
    );
    let end = t.at(1);
    send(
        &mut sink,
        mk::stall_end(&p, 4243, "cuInit", t0, end, StallOutcome::Returned),
    );
    send(
        &mut sink,
        mk::cuinit_end(&p, 4243, t0, end, 0, "CUDA_SUCCESS"),
    );
    drop(sink);
    let spans = c.spans();
    let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
    let reg = spans.iter().find(|s| s.name == "UVM_REGISTER_GPU").unwrap();
    // The ids fixed early are the ones the ended spans carry.
    assert_eq!(cu_marker.parent_span_id, cu.span_id);
    assert_eq!(cu_marker.trace_id, cu.trace_id);
    assert_eq!(io_marker.parent_span_id, reg.span_id);
    assert_eq!(reg.parent_span_id, cu.span_id);
    assert_eq!(reg.trace_id, cu.trace_id);
    let names: Vec<&str> = cu.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [STALL, DIAGNOSIS, STALL_END], "{:#?}", cu.events);
    let names: Vec<&str> = reg.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [STALL, STALL_END]);
    // Markers lie inside their parents.
    assert!(cu_marker.start_time_unix_nano >= cu.start_time_unix_nano);
    assert!(cu_marker.start_time_unix_nano <= cu.end_time_unix_nano);
    assert!(io_marker.start_time_unix_nano >= reg.start_time_unix_nano);
    assert!(io_marker.start_time_unix_nano <= reg.end_time_unix_nano);
}

#[test]
fn calls_outside_cuinit_are_root_spans_and_thread_exit_ends_a_stalled_cuinit() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    let mut t = Seq::new();
    let (s, e) = (t.at(0), t.at(2000));
    ioctl(
        &mut sink,
        &p,
        4243,
        s,
        e,
        "NV_ESC_RM_CONTROL",
        "NV_ERR_TIMEOUT",
        true,
        false,
    );
    let (s, e) = (t.at(1), t.at(1));
    send(
        &mut sink,
        mk::open(&p, 4243, s, e, "/dev/nvidia0", Some("EACCES"), false),
    );
    let t0 = t.at(1);
    send(&mut sink, mk::cuinit_start(&p, 4243, t0));
    let gone = t.at(3000);
    send(
        &mut sink,
        mk::stall_end(&p, 4243, "cuInit", t0, gone, StallOutcome::ThreadExited),
    );
    let spans = c.wait("3 spans", |s| s.len() >= 3);
    let io = spans
        .iter()
        .find(|s| s.name == "NV_ESC_RM_CONTROL")
        .unwrap();
    assert!(io.parent_span_id.is_empty());
    assert_eq!(s_attr(&io.attributes, "uvmwatch.engine"), Some("vllm"));
    assert_eq!(s_attr(&io.attributes, "error.type"), Some("NV_ERR_TIMEOUT"));
    let open = spans
        .iter()
        .find(|s| s.name == "open /dev/nvidia0")
        .unwrap();
    assert!(open.parent_span_id.is_empty());
    assert_ne!(open.trace_id, io.trace_id);
    assert_eq!(open.status.as_ref().unwrap().message, "EACCES");
    let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
    assert_eq!(
        cu.status.as_ref().unwrap().message,
        "thread exited inside cuInit"
    );
    assert_eq!(
        s_attr(&cu.attributes, "uvmwatch.outcome"),
        Some("thread_exited")
    );
    assert_eq!(cu.events[0].name, STALL_END);
}

#[test]
fn a_stalled_ioctl_outside_cuinit_carries_its_stall_and_diagnosis() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    let mut t = Seq::new();
    let s0 = t.at(0);
    let det = t.at(5000);
    let f = finding();
    send_with_findings(
        &mut sink,
        mk::stall(
            &p,
            4243,
            "NV_ESC_RM_CONTROL",
            s0,
            det,
            None,
            "D (disk sleep)",
            "os_acquire_mutex",
        ),
        std::slice::from_ref(&f),
        Trigger::Stall,
    );
    let early = c.wait("stall marker", |s| {
        s.iter().any(|s| s.name == STALL && s.events.len() == 2)
    });
    let marker = early.iter().find(|s| s.name == STALL).unwrap();
    let end = t.at(100);
    ioctl(
        &mut sink,
        &p,
        4243,
        s0,
        end,
        "NV_ESC_RM_CONTROL",
        "NV_OK",
        false,
        false,
    );
    sink.flush();
    let spans = c.wait("ioctl span", |s| {
        s.iter().any(|s| s.name == "NV_ESC_RM_CONTROL")
    });
    let io = spans
        .iter()
        .find(|s| s.name == "NV_ESC_RM_CONTROL")
        .unwrap();
    assert!(io.parent_span_id.is_empty());
    assert_eq!(marker.parent_span_id, io.span_id);
    assert_eq!(marker.trace_id, io.trace_id);
    let names: Vec<&str> = io.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [STALL, DIAGNOSIS]);
    assert_eq!(s_attr(&io.attributes, "uvmwatch.engine"), Some("vllm"));
}

#[test]
fn a_thread_that_vanished_mid_cuinit_is_closed_by_housekeeping() {
    let c = Collector::start();
    let root = fake_proc();
    let mut cfg = config(&c, root.path());
    cfg.housekeeping_interval = Duration::from_millis(50);
    cfg.export_interval = Duration::from_millis(50);
    let mut sink = OtlpListener::start(cfg).unwrap();
    let p = proc_info(root.path());
    // Thread 9999 does not exist under the fake root.
    send(
        &mut sink,
        mk::cuinit_start(&p, 9999, crate::clock::monotonic_ns()),
    );
    // Thread 4243 exists: its cuInit stays open.
    send(
        &mut sink,
        mk::cuinit_start(&p, 4243, crate::clock::monotonic_ns()),
    );
    let spans = c.wait("closed cuInit", |s| s.iter().any(|s| s.name == "cuInit"));
    assert_eq!(spans.len(), 1);
    assert_eq!(i_attr(&spans[0].attributes, "thread.id"), Some(9999));
    assert_eq!(
        s_attr(&spans[0].attributes, "uvmwatch.outcome"),
        Some("thread_exited")
    );
    // At shutdown the open one leaves as incomplete.
    drop(sink);
    let spans = c.spans();
    let open = spans
        .iter()
        .find(|s| i_attr(&s.attributes, "thread.id") == Some(4243))
        .unwrap();
    assert_eq!(open.name, "cuInit");
    assert_eq!(
        attr(&open.attributes, "uvmwatch.incomplete"),
        Some(&any_value::Value::BoolValue(true))
    );
    assert_eq!(
        s_attr(&open.attributes, "uvmwatch.outcome"),
        Some("agent_stopped")
    );
}

#[test]
fn the_identity_of_a_process_that_exits_at_once_is_kept() {
    let c = Collector::start();
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    // The identity the observer reads at a process's first event.
    let p = Arc::new(crate::host::identity::read(root.path(), 4242, "python3"));
    let t0 = crate::clock::monotonic_ns();
    send(&mut sink, mk::cuinit_start(&p, 4243, t0));
    // Gone before the exporting thread may have looked.
    std::fs::remove_dir_all(root.path().join("4242")).unwrap();
    send(
        &mut sink,
        mk::cuinit_end(&p, 4243, t0, t0 + 1000, 0, "CUDA_SUCCESS"),
    );
    sink.flush();
    let spans = c.wait("cuInit", |s| !s.is_empty());
    let a = &spans[0].attributes;
    assert_eq!(i_attr(a, "uvmwatch.tp_rank"), Some(1), "from environ");
    assert_eq!(s_attr(a, "k8s.namespace.name"), Some("llm"));
    assert_eq!(s_attr(a, "uvmwatch.engine"), Some("vllm"));
}

fn one_span(sink: &mut OtlpListener, p: &Arc<Process>) {
    let now = crate::clock::monotonic_ns();
    ioctl(
        sink,
        p,
        4243,
        now,
        now + 10,
        "NV_ESC_RM_ALLOC",
        "NV_ERR_INVALID_ARGUMENT",
        true,
        false,
    );
    sink.flush();
}

#[test]
fn retryable_failures_are_retried_with_backoff() {
    let c = Collector::start();
    c.statuses.lock().unwrap().extend([503, 429]);
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    let start = Instant::now();
    one_span(&mut sink, &p);
    c.wait("the span after two refusals", |s| s.len() == 1);
    // 0.5 s then 1 s of backoff.
    assert!(
        start.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(stats.export_failures.load(Ordering::Relaxed), 2);
    assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 1);
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 0);
}

#[test]
fn refused_batches_are_dropped_and_counted() {
    let c = Collector::start();
    c.statuses.lock().unwrap().push_back(400);
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    one_span(&mut sink, &p);
    let end = Instant::now() + Duration::from_secs(5);
    while stats.spans_dropped.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
    // The next one goes through.
    one_span(&mut sink, &p);
    c.wait("next span", |s| s.len() == 1);
}

#[test]
fn gzip_bodies() {
    let c = Collector::start();
    let root = fake_proc();
    let mut cfg = config(&c, root.path());
    cfg.compression = Compression::Gzip;
    cfg.headers = vec![("X-Scope-OrgID".into(), "tenant-1".into())];
    let mut sink = OtlpListener::start(cfg).unwrap();
    one_span(&mut sink, &proc_info(root.path()));
    c.wait("gzip span", |s| s.len() == 1);
    assert_eq!(c.encodings.lock().unwrap()[0], "gzip");
}

#[test]
fn the_agent_loop_never_waits_on_a_hung_endpoint() {
    // Accepts connections and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            held.push(s);
        }
    });
    let root = fake_proc();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
    cfg.proc_root = root.path().to_path_buf();
    cfg.queue_capacity = 64;
    cfg.timeout = Duration::from_secs(3);
    cfg.shutdown_timeout = Duration::from_millis(200);
    let mut sink = OtlpListener::start(cfg).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    let n = 20_000u64;
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        ioctl(
            &mut sink,
            &p,
            4243,
            i,
            i + 1,
            "NV_ESC_RM_CONTROL",
            "NV_ERR_TIMEOUT",
            true,
            false,
        );
        if i % 100 == 0 {
            sink.flush();
        }
        worst = worst.max(t.elapsed());
    }
    let total = start.elapsed();
    eprintln!("{n} events: {total:?}, worst {worst:?}");
    assert!(total < Duration::from_secs(2), "{total:?}");
    assert!(worst < Duration::from_millis(50), "{worst:?}");
    assert!(stats.events_dropped.load(Ordering::Relaxed) > 0);
    let t = Instant::now();
    drop(sink);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn an_unreachable_endpoint_is_not_an_error_at_start() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let root = fake_proc();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
    cfg.shutdown_timeout = Duration::from_millis(300);
    let mut sink = OtlpListener::start(cfg).unwrap();
    let stats = sink.stats();
    one_span(&mut sink, &proc_info(root.path()));
    let end = Instant::now() + Duration::from_secs(5);
    while stats.export_failures.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stats.export_failures.load(Ordering::Relaxed) >= 1);
    drop(sink);
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
}

#[test]
fn endpoints() {
    let p = |s: &str| Endpoint::parse(s).unwrap();
    assert_eq!(p("http://collector:4318").path, "/v1/traces");
    assert_eq!(p("http://collector:4318/").path, "/v1/traces");
    assert_eq!(p("http://collector:4318").port, 4318);
    assert_eq!(p("http://gw/otlp").path, "/otlp/v1/traces");
    assert_eq!(p("http://gw/otlp").port, 80);
    assert_eq!(p("http://gw:1/v1/traces").path, "/v1/traces");
    let v6 = p("http://[::1]:4318");
    assert_eq!(
        (v6.host.as_str(), v6.authority.as_str()),
        ("::1", "[::1]:4318")
    );
    assert!(Endpoint::parse("https://collector:4318").is_err());
    assert!(Endpoint::parse("collector:4318").is_err());
    assert!(Endpoint::parse("http://u:p@collector:4318").is_err());
    let mut cfg = OtlpConfig::new("http://h:1");
    cfg.headers = vec![("bad header".into(), "v".into())];
    assert!(OtlpListener::start(cfg).is_err());
}

#[test]
fn flag_parsers() {
    assert_eq!(Compression::parse("gzip"), Ok(Compression::Gzip));
    assert_eq!(Compression::parse("none"), Ok(Compression::None));
    assert!(Compression::parse("zstd").is_err());
    assert_eq!(
        parse_header("X-Scope-OrgID=team-a"),
        Ok(("X-Scope-OrgID".to_string(), "team-a".to_string()))
    );
    assert_eq!(
        parse_header("Authorization=Basic a=="),
        Ok(("Authorization".to_string(), "Basic a==".to_string()))
    );
    assert!(parse_header("novalue").is_err());
    assert!(parse_header("bad name=x").is_err());
}

#[test]
fn command_lines_are_redacted_and_bounded() {
    let a = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
    assert_eq!(
        command_line(
            &a("vllm serve m --api-key sk-1 --hf-token=hf_x --tokenizer t"),
            1024
        ),
        "vllm serve m --api-key [REDACTED] --hf-token=[REDACTED] --tokenizer t"
    );
    assert_eq!(
        command_line(&a("x --max-num-batched-tokens 8192 --password p"), 1024),
        "x --max-num-batched-tokens 8192 --password [REDACTED]"
    );
    assert_eq!(
        command_line(&a("x --db postgres://user:pw@db:5432/x"), 1024),
        "x --db postgres://[REDACTED]@db:5432/x"
    );
    let long = command_line(&a(&"é".repeat(2000)), 1024);
    assert!(long.len() <= 1024 && long.ends_with("..."));
}

#[test]
fn ids_are_random_and_nonzero() {
    let mut a = Ids::new();
    let mut b = Ids::new();
    let (x, y) = (a.trace_id(), b.trace_id());
    assert_ne!(x, y);
    assert_ne!(x, [0; 16]);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        assert!(seen.insert(a.span_id()));
    }
}

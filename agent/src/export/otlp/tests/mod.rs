//! The exporter against a minimal OTLP/HTTP receiver that decodes with the official
//! definitions: how events become spans ([`spans`]), and how they travel: retries, drops,
//! shutdown, endpoints ([`transport`]). The receiver and the event builders are here.

mod spans;
mod transport;

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
use crate::doctor::cause::CauseId;
use crate::doctor::finding::{
    Confidence, EvidenceItem, Finding, FixStep, Severity, Stance, Standing, Where,
};
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

/// A receiver, the fake procfs tree (keep it while the listener runs), a listener
/// exporting to the receiver, and the tree's vLLM server.
fn exporting_vllm() -> (Collector, tempfile::TempDir, OtlpListener, Arc<Process>) {
    let c = Collector::start();
    let root = fake_proc();
    let sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let p = proc_info(root.path());
    (c, root, sink, p)
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
        Kind::ContextCall(c) => c.findings = fs.clone(),
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
        rule: CauseId::HmmSetupFailure,
        standing: Standing::Leading,
        title: "UVM could not register the GPU".into(),
        severity: Severity::Critical,
        confidence: Confidence::High,
        basis: Default::default(),
        evidence: vec![EvidenceItem {
            what: "UVM_REGISTER_GPU".into(),
            value: "NV_ERR_NO_MEMORY".into(),
            source: "probe:ioctl".into(),
            stance: Stance::For,
            signal: None,
        }],
        unchecked: vec![],
        fix: vec![FixStep {
            where_: Where::Host,
            commands: vec!["nvidia-smi -q".into()],
            note: "look".into(),
        }],
        runbook: "docs/runbooks/hmm_setup_failure.md".into(),
        tell_apart: None,
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

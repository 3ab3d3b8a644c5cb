//! How events become spans: parents, ids, attributes, stalls and findings.

use super::*;

#[test]
fn cuinit_is_a_root_span_with_its_driver_calls_as_children() {
    let (c, _root, mut sink, p) = exporting_vllm();
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
    let (c, _root, mut sink, p) = exporting_vllm();
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
        Some("hmm_setup_failure")
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
    let (c, _root, mut sink, p) = exporting_vllm();
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
fn a_context_creation_is_a_root_span_an_error_on_46_and_its_diagnosis_rides_on_it() {
    let (c, _root, mut sink, p) = exporting_vllm();
    let mut t = Seq::new();
    let (s, e) = (t.at(0), t.at(2));
    send(
        &mut sink,
        mk::context_call(
            &p,
            4243,
            s,
            e,
            "cuDeviceGetCount",
            0,
            "CUDA_SUCCESS",
            Some(2),
        ),
    );
    let (s, e) = (t.at(1), t.at(4));
    let f = finding();
    send_with_findings(
        &mut sink,
        mk::context_call(
            &p,
            4243,
            s,
            e,
            "cuCtxCreate_v2",
            46,
            "CUDA_ERROR_DEVICE_UNAVAILABLE",
            None,
        ),
        std::slice::from_ref(&f),
        Trigger::ContextCall,
    );
    let spans = c.wait("2 spans", |s| s.len() >= 2);
    let count = spans.iter().find(|s| s.name == "cuDeviceGetCount").unwrap();
    assert!(count.parent_span_id.is_empty());
    assert_eq!(
        i_attr(&count.attributes, "uvmwatch.cuda.device_count"),
        Some(2)
    );
    assert_eq!(i_attr(&count.attributes, "uvmwatch.cuda.device"), None);
    assert_eq!(s_attr(&count.attributes, "error.type"), None);
    let ctx = spans.iter().find(|s| s.name == "cuCtxCreate_v2").unwrap();
    assert!(ctx.parent_span_id.is_empty());
    assert_ne!(ctx.trace_id, count.trace_id);
    assert_eq!(s_attr(&ctx.attributes, "uvmwatch.engine"), Some("vllm"));
    assert_eq!(
        i_attr(&ctx.attributes, "uvmwatch.cuda.result_code"),
        Some(46)
    );
    assert_eq!(i_attr(&ctx.attributes, "uvmwatch.cuda.device"), Some(0));
    let st = ctx.status.as_ref().unwrap();
    assert_eq!(st.code, status::StatusCode::Error as i32);
    assert_eq!(st.message, "CUDA_ERROR_DEVICE_UNAVAILABLE");
    assert_eq!(ctx.end_time_unix_nano - ctx.start_time_unix_nano, e - s);
    let ev = ctx.events.iter().find(|e| e.name == DIAGNOSIS).unwrap();
    assert_eq!(
        s_attr(&ev.attributes, "uvmwatch.diagnosis.severity"),
        Some("critical")
    );
}

#[test]
fn calls_outside_cuinit_are_root_spans_and_thread_exit_ends_a_stalled_cuinit() {
    let (c, _root, mut sink, p) = exporting_vllm();
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
    let (c, _root, mut sink, p) = exporting_vllm();
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

#[test]
fn start_up_spans_join_the_trace_the_process_was_started_in() {
    use crate::host::workload::TraceParent;
    let (c, _root, mut sink, p) = exporting_vllm();
    // The server started this worker inside its start-up span (vLLM's "Init device").
    let tp = TraceParent::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vllm=1"),
    )
    .unwrap();
    let mut joined = (*p).clone();
    joined.workload.trace_parent = Some(tp.clone());
    let joined = Arc::new(joined);
    let mut t = Seq::new();
    let t0 = t.at(0);
    send(&mut sink, mk::cuinit_start(&joined, 4243, t0));
    let (s, e) = (t.at(1), t.at(2));
    ioctl(
        &mut sink,
        &joined,
        4243,
        s,
        e,
        "UVM_INITIALIZE",
        "NV_OK",
        false,
        true,
    );
    let end = t.at(3);
    send(
        &mut sink,
        mk::cuinit_end(&joined, 4243, t0, end, 0, "CUDA_SUCCESS"),
    );
    let (s, e) = (t.at(4), t.at(5));
    send(
        &mut sink,
        mk::context_call(
            &joined,
            4243,
            s,
            e,
            "cuDevicePrimaryCtxRetain",
            0,
            "CUDA_SUCCESS",
            None,
        ),
    );
    // A failed call long after start-up, outside cuInit: a trace of its own.
    let (s, e) = (t.at(6), t.at(7));
    ioctl(
        &mut sink,
        &joined,
        4243,
        s,
        e,
        "UVM_FREE",
        "NV_ERR_INVALID_ARGUMENT",
        true,
        false,
    );
    sink.flush();
    let spans = c.wait("4 spans", |s| s.len() >= 4);
    drop(sink);
    let cu = spans.iter().find(|s| s.name == "cuInit").unwrap();
    assert_eq!(cu.trace_id, tp.trace_id.to_vec());
    assert_eq!(cu.parent_span_id, tp.span_id.to_vec());
    assert_eq!(cu.trace_state, "vllm=1");
    assert_eq!(
        s_attr(&cu.attributes, "uvmwatch.trace.parent_from"),
        Some("TRACEPARENT")
    );
    // Still a root among uvmwatch's spans: the process's attributes are on it.
    assert_eq!(s_attr(&cu.attributes, "uvmwatch.engine"), Some("vllm"));
    let init = spans.iter().find(|s| s.name == "UVM_INITIALIZE").unwrap();
    assert_eq!(init.trace_id, cu.trace_id);
    assert_eq!(init.parent_span_id, cu.span_id);
    let ctx = spans
        .iter()
        .find(|s| s.name == "cuDevicePrimaryCtxRetain")
        .unwrap();
    assert_eq!(ctx.trace_id, tp.trace_id.to_vec());
    assert_eq!(ctx.parent_span_id, tp.span_id.to_vec());
    let free = spans.iter().find(|s| s.name == "UVM_FREE").unwrap();
    assert_ne!(free.trace_id, tp.trace_id.to_vec(), "not a start-up span");
    assert!(free.parent_span_id.is_empty());
}

#[test]
fn an_unsampled_start_up_trace_is_not_joined() {
    use crate::host::workload::TraceParent;
    let (c, _root, mut sink, p) = exporting_vllm();
    let tp = TraceParent::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        None,
    )
    .unwrap();
    let mut q = (*p).clone();
    q.workload.trace_parent = Some(tp.clone());
    let q = Arc::new(q);
    let mut t = Seq::new();
    let t0 = t.at(0);
    send(&mut sink, mk::cuinit_start(&q, 4243, t0));
    let end = t.at(1);
    send(
        &mut sink,
        mk::cuinit_end(&q, 4243, t0, end, 0, "CUDA_SUCCESS"),
    );
    sink.flush();
    let spans = c.wait("1 span", |s| !s.is_empty());
    drop(sink);
    assert_ne!(spans[0].trace_id, tp.trace_id.to_vec());
    assert!(spans[0].parent_span_id.is_empty());
    assert_eq!(
        s_attr(&spans[0].attributes, "uvmwatch.trace.parent_from"),
        None
    );
}

//! A fixed story (a containerised process, a hang, stalls, a diagnosis, a drop) recorded into
//! a capture, and what both formats must show of it.

use super::*;

/// Monotonic 1000 s at wall clock 1 750 000 000 s (2025-06-15).
pub(crate) fn story_clock() -> Clock {
    Clock {
        offset_ns: 1_750_000_000_000_000_000i128 - 1_000_000_000_000,
        mono_ns: 1_000_000_000_000,
        unix_ns: 1_750_000_000_000_000_000,
    }
}

/// A containerised `python3` (host pid 4242, pid 7 inside): two ioctls, then a cuInit
/// with an open and five ioctls on its main thread, a failed ioctl after it, and a worker thread whose
/// cuInit hangs in UVM_REGISTER_GPU (both stalls, a diagnosis) and is still running when
/// the capture ends; one drop report.
pub(crate) fn story() -> Capture {
    let clock = story_clock();
    let mut meta = Meta::starting(clock, clock.mono_ns + 5 * S, "comm=python3".into(), 999);
    meta.version = "uvmwatch (test)".into();
    let mut r = TraceBuilder::new(
        meta,
        1000,
        Box::new(|pid, tid| (pid != tid).then(|| format!("pt_worker_{tid}"))),
    );
    let p = Arc::new(Process {
        pid: 4242,
        ns_pid: Some(7),
        comm: "python3".into(),
        exe: "/usr/bin/python3.11".into(),
        cmdline: vec![
            "python3".into(),
            "serve.py".into(),
            "--tp".into(),
            "1".into(),
        ],
        container_id: Some(
            "3f1c0ffee0ddba11c0ffee0ddba11c0ffee0ddba11c0ffee0ddba11c0ffee0d".into(),
        ),
        workload: Default::default(),
    });
    let at = |tid: u32, ts_ns: u64, kind: Kind| Event {
        ts_ns,
        process: Some(p.clone()),
        tid,
        comm: p.comm.clone(),
        kind,
    };
    let ioctl = |start_ns: u64, name: &str, node: &str, result: &str, failed, in_cuinit| {
        Kind::Ioctl(Ioctl {
            start_ns,
            cmd: 0,
            name: name.into(),
            label: "unknown",
            node: node.into(),
            result: result.into(),
            ret: 0,
            failed,
            slow: false,
            in_cuinit,
        })
    };
    let t0 = clock.mono_ns;
    let main = 4242;
    // Two driver calls before the profiler's base time (monotonic 1001 s in the Kineto
    // fixture): one well before, one slow one running across it.
    for (start, dur, name) in [
        (800 * MS, 10 * MS, "NV_ESC_CHECK_VERSION_STR"),
        (950 * MS, 100 * MS, "NV_ESC_RM_ALLOC"),
    ] {
        let k = ioctl(t0 + start, name, "/dev/nvidiactl", "NV_OK", false, false);
        r.record(&at(main, t0 + start + dur, k), 0);
    }
    let cuinit_start = t0 + 1_200 * MS;
    r.record(
        &at(
            main,
            cuinit_start,
            Kind::CuinitStart {
                start_ns: cuinit_start,
                flags: 0,
                late: false,
            },
        ),
        0,
    );
    let open = Kind::Open(Open {
        start_ns: t0 + 1_201 * MS,
        path: "/dev/nvidia-uvm".into(),
        node: "nvidia-uvm".into(),
        errno: None,
        ret: 3,
        fd: Some(3),
        timed: true,
        in_cuinit: true,
        findings: vec![],
    });
    r.record(&at(main, t0 + 1_201 * MS + 40_000, open), 0);
    for (i, name) in UVM_SEQUENCE.iter().enumerate() {
        let s = t0 + 1_210 * MS + i as u64 * 15 * MS;
        let k = ioctl(s, name, "/dev/nvidia-uvm", "NV_OK", false, true);
        r.record(&at(main, s + 4 * MS + 123, k), 0);
    }
    let end = Kind::CuinitEnd(CuinitEnd {
        start_ns: cuinit_start,
        code: 0,
        result: "CUDA_SUCCESS".into(),
        seen: Seen::Whole,
        late: None,
        call: CallSummary::default(),
        findings: vec![],
    });
    r.record(&at(main, t0 + 1_300 * MS, end), 0);
    let k = ioctl(
        t0 + 1_500 * MS,
        "NV_ESC_RM_CONTROL",
        "/dev/nvidiactl",
        "NV_ERR_INVALID_ARGUMENT",
        true,
        false,
    );
    r.record(&at(main, t0 + 1_500 * MS + 250_000, k), 0);
    let w = 4250;
    r.record(
        &at(
            w,
            t0 + 2 * S,
            Kind::CuinitStart {
                start_ns: t0 + 2 * S,
                flags: 0,
                late: false,
            },
        ),
        0,
    );
    for call in ["UVM_REGISTER_GPU", "cuInit"] {
        let (kind, start) = if call == "cuInit" {
            (CallKind::Cuinit, t0 + 2 * S)
        } else {
            (CallKind::Ioctl, t0 + 2 * S + 10 * MS)
        };
        let stall = Kind::Stall(Box::new(Stall {
            kind,
            call: call.into(),
            label: call.into(),
            start_ns: start,
            threshold_ns: 0,
            node: "/dev/nvidia-uvm".into(),
            inside: Some(Inside {
                call: "UVM_REGISTER_GPU".into(),
                node: "/dev/nvidia-uvm".into(),
                start_ns: t0 + 2 * S + 10 * MS,
            }),
            cuinit_start_ns: Some(t0 + 2 * S),
            thread: ThreadSnapshot {
                read: true,
                state: "D (disk sleep)".into(),
                wchan: "uvm_gpu_retain_by_uuid".into(),
                ..ThreadSnapshot::default()
            },
            call_so_far: None,
            findings: vec![],
        }));
        r.record(&at(w, t0 + 3 * S + 60 * MS, stall), 0);
    }
    let finding = Finding {
        rule: CauseId::HmmSetupFailure,
        standing: Standing::Leading,
        title: "cuInit hangs registering the GPU with nvidia-uvm".into(),
        severity: Severity::Critical,
        confidence: Confidence::High,
        basis: Default::default(),
        evidence: vec![],
        unchecked: vec![],
        fix: vec![],
        runbook: "docs/runbooks/hmm_setup_failure.md".into(),
        tell_apart: None,
    };
    let d = Kind::Diagnosis(Diagnosis {
        finding: Arc::new(finding.clone()),
        trigger: Trigger::Stall,
        differential: Arc::new(Differential {
            symptom: None,
            findings: vec![finding],
            ruled_out: Vec::new(),
            also: Vec::new(),
        }),
    });
    r.record(&at(4242, t0 + 3 * S + 61 * MS, d), 0);
    let scan = Event::agent(
        t0 + 3 * S + 500 * MS,
        Kind::Scan(Scan {
            cuinit_in_flight: 1,
            dropped_total: 3,
            undecodable_total: 0,
            received_total: 0,
            identities_unread_total: 0,
            caught_up: true,
        }),
    );
    r.record(&scan, t0 + 3 * S + 500 * MS);
    r.build(t0 + 4 * S)
}

/// The story's calls as both formats show them, checked against the model.
pub(crate) fn check_story_view(view: &View, c: &Capture) {
    assert_eq!(
        view.processes.get(&4242).map(String::as_str),
        Some("python3")
    );
    assert_eq!(
        view.processes.get(&999).map(String::as_str),
        Some("uvmwatch capture")
    );
    assert_eq!(view.threads.get(&(4242, 4250)).unwrap(), "pt_worker_4250");
    let model_slices = c
        .events
        .iter()
        .filter(|e| matches!(e.kind, capture::model::Kind::Slice { .. }))
        .count();
    assert_eq!(view.slices.len(), model_slices);
    for e in &c.events {
        if let capture::model::Kind::Slice { .. } = e.kind {
            assert!(
                view.slices.iter().any(|s| s.name == e.name
                    && s.pid == e.pid
                    && Some(s.tid) == e.tid
                    && s.start == e.ts_ns as i128
                    && s.end == e.end_ns() as i128),
                "slice {e:?} not decoded as such"
            );
        }
    }
    let cu = view
        .slices_named(4242, "cuInit")
        .into_iter()
        .find(|s| s.tid == 4242)
        .unwrap();
    for name in UVM_SEQUENCE {
        let s = view
            .slices_named(4242, name)
            .into_iter()
            .find(|s| s.tid == 4242)
            .unwrap();
        assert!(
            s.start >= cu.start && s.end <= cu.end,
            "{name} inside cuInit"
        );
        assert_eq!(s.args["node"], "/dev/nvidia-uvm");
        assert_eq!(s.args["result"], "NV_OK");
        assert_eq!(s.args["failed"], false);
    }
    let stall = view.instant(4242, "stall: cuInit").unwrap();
    assert_eq!(stall.tid, Some(4250));
    assert_eq!(stall.args["wchan"], "uvm_gpu_retain_by_uuid");
    assert_eq!(stall.args["age_ms"], 1060);
    let d = view.instant(4242, "diagnosis: hmm_setup_failure").unwrap();
    assert_eq!(d.tid, None);
    assert_eq!(d.args["severity"], "critical");
    assert_eq!(d.args["runbook"], "docs/runbooks/hmm_setup_failure.md");
    let f = view.instant(4242, "failed: NV_ESC_RM_CONTROL").unwrap();
    assert_eq!(f.args["result"], "NV_ERR_INVALID_ARGUMENT");
    assert_eq!(
        view.counter_values(Some(999), "dropped events"),
        vec![0, 3, 3]
    );
    assert_eq!(
        view.counter_values(Some(999), "events lost by the capture"),
        vec![0, 0]
    );
    assert_eq!(
        view.counter_values(Some(4242), "ioctls per 100 ms"),
        vec![0, 1, 1, 0, 5, 0, 1, 0]
    );
    let started = view.instant(999, "capture started").unwrap();
    assert_eq!(
        started.args["clock_offset_ns"].as_i64().unwrap() as i128,
        c.meta.clock.offset_ns
    );
    let ended = view.instant(999, "capture ended").unwrap();
    assert_eq!(ended.args["dropped_events"], 3);
    assert_eq!(ended.args["lost_events"], 0);
}

// --- Tests without root ----------------------------------------------------------------------

//! Test fixtures of the capture: a fixed clock, the test workload, and [`story`], a short
//! capture recorded through the [`TraceBuilder`] that the format and annotate tests share.

use super::builder::TraceBuilder;
use super::model::{Capture, Meta};
use crate::doctor::cause::CauseId;
use crate::doctor::finding::{Confidence, Finding, Severity, Standing};
use crate::event::{testing as ev, Clock, Process, Trigger};

/// A fixed clock: monotonic 1000 s, wall clock 2025-06-15 (1 750 000 000 s).
pub fn test_clock() -> Clock {
    Clock {
        offset_ns: 1_750_000_000_000_000_000i128 - 1_000_000_000_000,
        mono_ns: 1_000_000_000_000,
        unix_ns: 1_750_000_000_000_000_000,
    }
}

/// The test workload process (`python3`, host pid 4242, pid 7 in its container).
pub fn workload() -> std::sync::Arc<Process> {
    ev::process()
}

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// A short story: a cuInit with three ioctls and one open, a failed ioctl outside it,
/// a second thread whose cuInit hangs in UVM_REGISTER_GPU (stalls, a diagnosis) and
/// is still running at the end, and one drop report.
pub fn story() -> Capture {
    let clock = test_clock();
    let meta = Meta::starting(clock, clock.mono_ns + 5 * S, "comm=python3".into(), 999);
    let mut r = TraceBuilder::new(
        meta,
        1000,
        Box::new(|pid, tid| (pid != tid).then(|| format!("worker-{tid}"))),
    );
    let p = workload();
    let t0 = clock.mono_ns;
    let main = 4242;
    r.record(&ev::cuinit_start(&p, main, t0 + 1_200 * MS), 0);
    r.record(
        &ev::open(
            &p,
            main,
            t0 + 1_201 * MS,
            t0 + 1_202 * MS,
            "/dev/nvidia-uvm",
            None,
            true,
        ),
        0,
    );
    for (i, name) in ["UVM_INITIALIZE", "UVM_MM_INITIALIZE", "UVM_REGISTER_GPU"]
        .iter()
        .enumerate()
    {
        let s = t0 + 1_210 * MS + i as u64 * 20 * MS;
        r.record(
            &ev::ioctl(
                &p,
                main,
                s,
                s + 5 * MS,
                name,
                "/dev/nvidia-uvm",
                "NV_OK",
                false,
                true,
            ),
            0,
        );
    }
    r.record(
        &ev::cuinit_end(
            &p,
            main,
            t0 + 1_200 * MS,
            t0 + 1_300 * MS,
            0,
            "CUDA_SUCCESS",
        ),
        0,
    );
    r.record(
        &ev::ioctl(
            &p,
            main,
            t0 + 1_500 * MS,
            t0 + 1_501 * MS,
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            "NV_ERR_INVALID_ARGUMENT",
            true,
            false,
        ),
        0,
    );
    let w = 4250;
    r.record(&ev::cuinit_start(&p, w, t0 + 2 * S), 0);
    let inside = Some(("UVM_REGISTER_GPU", "/dev/nvidia-uvm"));
    r.record(
        &ev::stall(
            &p,
            w,
            "UVM_REGISTER_GPU",
            t0 + 2 * S + 10 * MS,
            t0 + 3 * S + 60 * MS,
            inside,
            "S (sleeping)",
            "request_wait_answer",
        ),
        0,
    );
    r.record(
        &ev::stall(
            &p,
            w,
            "cuInit",
            t0 + 2 * S,
            t0 + 3 * S + 60 * MS,
            inside,
            "S (sleeping)",
            "request_wait_answer",
        ),
        0,
    );
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
    r.record(
        &ev::diagnosis(&p, t0 + 3 * S + 61 * MS, &finding, Trigger::Stall),
        0,
    );
    r.record(&ev::scan(0, 3), t0 + 3 * S + 500 * MS);
    r.build(t0 + 4 * S)
}

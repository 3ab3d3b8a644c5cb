//! `cuInit` calls the probes did not see enter: a process loaded a libcuda the agent had
//! not attached to yet and called `cuInit` at once, before the uprobes were in place. The
//! kernel side starts such a call at the process's first driver call (a *late* call,
//! `agent-ebpf/src/probes/cuinit.rs`), so its driver calls, failures and stalls are the
//! call's like a seen one's. This module says how one ended and, when its return was not
//! seen either, what its result was, from what its driver calls told.
//!
//! The result comes from what NVIDIA's own libcuda was seen to return after the same driver
//! calls: in `cargo xtask vm-test`'s nvidia series (Debian's libcuda1 and
//! nvidia-open-kernel-dkms 535.261.03-1 and 550.163.01-2, docs/compatibility.md), and on the
//! HMM set-up incident's hosts (`UVM_REGISTER_GPU` failing, README). Where the calls do not
//! tell, the result is `unknown`, never a guess.

use uvmwatch_common::{LATE_END_EXEC, LATE_END_NEXT_CALL, LATE_END_NEXT_CUINIT, LATE_END_RETURN};

use crate::event::CallSummary;

/// How long a late call with no driver call in flight may stay without a new one before it
/// is taken as returned (its return is not seen: its thread went on to work that makes no
/// driver call). A real `cuInit` spends its time inside driver calls (GPU bring-up is in
/// the kernel), with gaps of milliseconds between them.
pub const QUIET_NS: u64 = 1_000_000_000;

/// The system calls (x86-64 numbers) a thread is inside while it waits on the driver:
/// `ioctl` (16), `open` (2), `openat` (257), `openat2` (437). A late call whose thread is in
/// one is not quiet.
pub const IN_DRIVER_SYSCALLS: [i64; 4] = [16, 2, 257, 437];

/// `CUDA_ERROR_NOT_INITIALIZED` (`cuda.h`).
const NOT_INITIALIZED: i64 = 3;
/// `CUDA_ERROR_NO_DEVICE` (`cuda.h`).
const NO_DEVICE: i64 = 100;
/// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH` (`cuda.h`).
const SYSTEM_DRIVER_MISMATCH: i64 = 803;
/// `CUDA_ERROR_UNKNOWN` (`cuda.h`).
const UNKNOWN: i64 = 999;

/// A release's numbers for ordering (`535.261.03` before `550.163.01`).
fn release_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// What the kernel's `LATE_END_*` value of an exit record says of how the call ended.
pub fn ended(late_end: u32) -> &'static str {
    match late_end {
        LATE_END_RETURN => "returned",
        LATE_END_NEXT_CUINIT => "next_cuinit",
        LATE_END_NEXT_CALL => "next_call",
        LATE_END_EXEC => "exec",
        _ => "ended",
    }
}

/// A late call's result when its return was not seen: the `CUresult` and what it rests on,
/// or `None` when its driver calls do not tell. `libcuda` is the version in the name of the
/// library the process loaded, `driver` the running kernel module's.
pub fn infer(
    call: &CallSummary,
    ended: &str,
    libcuda: Option<&str>,
    driver: Option<&str>,
) -> Option<(i64, String)> {
    if let (Some(lib), Some(drv)) = (libcuda, driver) {
        // Only an older library is refused so: 550.163.01's on the 535.261.03 module went
        // on and failed as the module's own does (999).
        if release_key(lib) < release_key(drv) {
            return Some((
                SYSTEM_DRIVER_MISMATCH,
                format!(
                    "libcuda {lib} with the newer kernel module {drv}: libcuda returns \
                     CUDA_ERROR_SYSTEM_DRIVER_MISMATCH then (seen: 535.261.03 on 550.163.01)"
                ),
            ));
        }
    }
    let ctl_open_failed = call
        .failed_opens
        .iter()
        .find(|(path, _)| path.ends_with("/nvidiactl"));
    if let Some((path, errno)) = ctl_open_failed {
        return Some((
            NO_DEVICE,
            format!(
                "open {path} failed ({errno}): libcuda returns CUDA_ERROR_NO_DEVICE without \
                 the control node (seen: 535.261.03)"
            ),
        ));
    }
    if let Some(f) = call
        .last_failure
        .as_ref()
        .filter(|f| f.call == "UVM_REGISTER_GPU")
    {
        return Some((
            NOT_INITIALIZED,
            format!(
                "{} failed ({}): libcuda returns CUDA_ERROR_NOT_INITIALIZED when nvidia_uvm cannot \
                 register the GPU (the HMM set-up incident, README)",
                f.what, f.result
            ),
        ));
    }
    let uvm_open_failed = call
        .failed_opens
        .iter()
        .find(|(path, _)| path.ends_with("/nvidia-uvm"));
    if let Some((path, errno)) = uvm_open_failed {
        return Some((
            UNKNOWN,
            format!(
                "open {path} failed ({errno}): libcuda returns CUDA_ERROR_UNKNOWN without the \
                 UVM node (seen: 535.261.03 and 550.163.01 with EACCES, EPERM, ENXIO, ENOENT)"
            ),
        ));
    }
    // A call that went on to a context or device call had returned success: a failed RM
    // control inside it was one the library tolerates.
    if ended == "next_call" && call.driver_calls > 0 {
        return Some((
            0,
            "the thread went on to a context or device call, and no node open failed".to_string(),
        ));
    }
    if let Some(f) = &call.last_failure {
        return Some((
            UNKNOWN,
            format!(
                "{} failed ({}): libcuda returns CUDA_ERROR_UNKNOWN when a driver call fails \
                 and it goes on to no context call (seen: 535.261.03 and 550.163.01 without a \
                 GPU: NV_ERR_INVALID_LOCK_STATE)",
                f.what, f.result
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::FailedStep;

    fn failed(what: &str, result: &str) -> Option<FailedStep> {
        Some(FailedStep {
            what: what.into(),
            call: "open".into(),
            node: "nvidia-uvm".into(),
            result: result.into(),
        })
    }

    #[test]
    fn the_driver_calls_of_the_real_libcuda_give_its_result() {
        // 535.261.03's libcuda on the 550.163.01 module: five RM escapes, all NV_OK, 803.
        let ok = CallSummary {
            driver_calls: 5,
            device_opens: 1,
            ..CallSummary::default()
        };
        let (code, why) = infer(&ok, "thread_exited", Some("535.261.03"), Some("550.163.01"))
            .expect("a mismatch tells");
        assert_eq!(code, 803);
        assert!(
            why.contains("535.261.03 with the newer kernel module 550.163.01"),
            "{why}"
        );
        // 550.163.01's libcuda on the 535.261.03 module: no mismatch to tell (it returned
        // 999 after the GPU-less RM control failed, which is a failure below).
        assert_eq!(
            infer(&ok, "quiet", Some("550.163.01"), Some("535.261.03")),
            None
        );
        // The same calls with matching releases tell nothing (the GPU-less 999 fails an RM
        // control, which is a failure below).
        assert_eq!(
            infer(&ok, "quiet", Some("550.163.01"), Some("550.163.01")),
            None
        );
        assert_eq!(infer(&ok, "quiet", None, None), None);
        // /dev/nvidiactl denied: 100.
        let ctl = CallSummary {
            failed_opens: vec![("/dev/nvidiactl".into(), "EACCES".into())],
            last_failure: failed("open /dev/nvidiactl", "EACCES"),
            ..CallSummary::default()
        };
        assert_eq!(infer(&ctl, "thread_exited", None, None).unwrap().0, 100);
        // /dev/nvidia-uvm denied, twice, then UVM_DEINITIALIZE on the negative fd: 999.
        let uvm = CallSummary {
            driver_calls: 13,
            device_opens: 4,
            failed_opens: vec![
                ("/dev/nvidia-uvm".into(), "EACCES".into()),
                ("/dev/nvidia-uvm".into(), "EACCES".into()),
            ],
            last_failure: failed("open /dev/nvidia-uvm", "EACCES"),
            ..CallSummary::default()
        };
        let (code, why) = infer(&uvm, "quiet", Some("535.261.03"), Some("535.261.03")).unwrap();
        assert_eq!(code, 999);
        assert!(
            why.starts_with("open /dev/nvidia-uvm failed (EACCES)"),
            "{why}"
        );
        // UVM_REGISTER_GPU failing (the incident): 3.
        let reg = CallSummary {
            driver_calls: 20,
            last_failure: Some(FailedStep {
                what: "UVM_REGISTER_GPU on /dev/nvidia-uvm".into(),
                call: "UVM_REGISTER_GPU".into(),
                node: "nvidia-uvm".into(),
                result: "NV_ERR_NO_MEMORY".into(),
            }),
            ..CallSummary::default()
        };
        assert_eq!(infer(&reg, "quiet", None, None).unwrap().0, 3);
        // A failed RM control, then a context call: tolerated, it succeeded.
        let rm = CallSummary {
            driver_calls: 20,
            last_failure: Some(FailedStep {
                what: "NV_ESC_RM_CONTROL on /dev/nvidiactl".into(),
                call: "NV_ESC_RM_CONTROL".into(),
                node: "nvidiactl".into(),
                result: "NV_ERR_NOT_SUPPORTED".into(),
            }),
            ..CallSummary::default()
        };
        assert_eq!(infer(&rm, "next_call", None, None).unwrap().0, 0);
        assert_eq!(infer(&rm, "thread_exited", None, None).unwrap().0, 999);
        // No failure, then a context call: it succeeded. Without driver calls, nothing.
        assert_eq!(infer(&ok, "next_call", None, None).unwrap().0, 0);
        assert_eq!(
            infer(&CallSummary::default(), "next_call", None, None),
            None
        );
    }

    #[test]
    fn every_end_has_a_name() {
        for (v, n) in [
            (LATE_END_RETURN, "returned"),
            (LATE_END_NEXT_CUINIT, "next_cuinit"),
            (LATE_END_NEXT_CALL, "next_call"),
            (LATE_END_EXEC, "exec"),
        ] {
            assert_eq!(ended(v), n);
        }
    }
}

//! Kernel and driver functions: kprobe/kretprobe pairs, and for the core-kernel functions on
//! the fentry backend fentry/fexit pairs (the same bodies).
//!
//! One pair of each per row of [`uvmwatch_common::kernel_fns!`]: the entry stores the time in
//! `KF_START`, the return adds the latency to `KF_HIST` and the return value (`NV_STATUS`,
//! an `ERR_PTR` or an errno) to `KF_RESULTS`, and reports the call only when it failed. Only
//! return values are read, never arguments (the fexit reads it with `bpf_get_func_ret`,
//! Linux 5.17+, so it need not know the function's argument count).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{fentry, fexit, kprobe, kretprobe},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use uvmwatch_common::{
    counter, hist_bucket, kernel_fn, node, result, KernelFnEvent, KernelFnKey, KernelFnResultKey,
    EVENT_KERNEL_FN,
};

use crate::helpers::{add_sample, config, count, emit, failed, header, ids};
use crate::maps::{INFLIGHT_IOCTL, KF_HIST, KF_RESULTS, KF_START};

/// Whether the current thread is inside an ioctl on a UVM node.
#[inline(always)]
fn in_uvm_ioctl(tid: u32) -> bool {
    match unsafe { INFLIGHT_IOCTL.get(&tid) } {
        Some(i) => node::is_uvm(i.node),
        None => false,
    }
}

/// Entry of function `func`; `scope` (one of [`kernel_fn::scope`]) says which calls count.
#[inline(always)]
fn kf_enter(func: u32, scope: u8) {
    if config().is_none() {
        return;
    }
    let (_, tid) = ids();
    if scope == kernel_fn::scope::UVM_IOCTL && !in_uvm_ioctl(tid) {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = KF_START.insert(&KernelFnKey { tid, func }, &now, 0);
}

/// Return of function `func` with `raw`, read as `ret_kind` ([`kernel_fn::ret`]).
#[inline(always)]
fn kf_exit(raw: u64, func: u32, ret_kind: u8) {
    let (tgid, tid) = ids();
    let key = KernelFnKey { tid, func };
    let Some(start) = (unsafe { KF_START.get(&key) }).copied() else {
        return;
    };
    let _ = KF_START.remove(&key);
    let now = unsafe { bpf_ktime_get_ns() };
    let dur = now.saturating_sub(start);
    let (kind, code) = match ret_kind {
        kernel_fn::ret::NV_STATUS => {
            let st = raw as u32;
            (result::NV_STATUS, st)
        }
        kernel_fn::ret::ERR_PTR => {
            let v = raw as i64;
            if (-4095..0).contains(&v) {
                (result::ERRNO, (-v) as u32)
            } else {
                (result::OK, 0)
            }
        }
        kernel_fn::ret::ERRNO => {
            let v = raw as i32;
            if v < 0 {
                (result::ERRNO, v.unsigned_abs())
            } else {
                (result::OK, 0)
            }
        }
        _ => (result::OK, 0),
    };
    if let Some(h) = KF_HIST.get_ptr_mut(func) {
        add_sample(h, hist_bucket(dur), dur);
    }
    let rk = KernelFnResultKey {
        func,
        kind,
        _pad: [0; 3],
        code,
    };
    count(&KF_RESULTS, &rk, counter::KF_RESULTS_FULL);
    if failed(kind, code) {
        let ev = KernelFnEvent {
            header: header(EVENT_KERNEL_FN, tgid, tid, now),
            start_ns: start,
            ret: raw as i64,
            func,
            code,
            kind,
            in_uvm_ioctl: in_uvm_ioctl(tid) as u8,
            _pad: [0; 6],
        };
        emit(&ev);
    }
}

/// One kprobe, kretprobe, fentry and fexit program per function: the program itself says
/// which function fired (aya 0.14 kprobes take no attach cookie, and a trampoline program is
/// loaded for one function).
macro_rules! kernel_fn_programs {
    ($(($id:ident = $n:literal, $sym:literal, $module:expr, $ret:ident, $scope:ident,
        $enter:ident, $exit:ident, $fentry:ident, $fexit:ident, $lives:literal, $purpose:literal)),* $(,)?) => {
        $(
            #[doc = concat!("Kprobe on `", $sym, "` (", $lives, "): its entry time.")]
            #[kprobe]
            pub fn $enter(_ctx: ProbeContext) -> u32 {
                kf_enter(kernel_fn::$id, kernel_fn::scope::$scope);
                0
            }

            #[doc = concat!("Kretprobe on `", $sym, "`: latency and result.")]
            #[kretprobe]
            pub fn $exit(ctx: RetProbeContext) -> u32 {
                kf_exit(ctx.ret(), kernel_fn::$id, kernel_fn::ret::$ret);
                0
            }

            #[doc = concat!("Fentry on `", $sym, "` (core kernel, fentry backend): its entry time.")]
            #[fentry(function = $sym)]
            pub fn $fentry(_ctx: FEntryContext) -> u32 {
                kf_enter(kernel_fn::$id, kernel_fn::scope::$scope);
                0
            }

            #[doc = concat!("Fexit on `", $sym, "`: latency and result.")]
            #[fexit(function = $sym)]
            pub fn $fexit(ctx: FExitContext) -> u32 {
                kf_exit(ctx.ret::<u64>().unwrap_or(0), kernel_fn::$id, kernel_fn::ret::$ret);
                0
            }
        )*
    };
}

uvmwatch_common::kernel_fns!(kernel_fn_programs);

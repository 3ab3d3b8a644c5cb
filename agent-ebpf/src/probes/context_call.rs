//! CUDA context and device calls: uprobes and uretprobes on `cuCtxCreate`,
//! `cuCtxCreate_v2`, `_v3`, `_v4`, `cuDevicePrimaryCtxRetain` and `cuDeviceGetCount`,
//! attached by user space to each libcuda that exports them (one pair of programs per
//! symbol: a uprobe cannot tell which symbol it was attached to).
//!
//! The entry keeps its time, the `CUdevice` argument and, for `cuDeviceGetCount`, the
//! `int *count` pointer in `INFLIGHT_CTX`; the return adds the latency to `CTX_HIST` and the
//! `CUresult` to `CTX_RESULTS`, reads the count the call wrote, and sends a `ContextCallEvent`: for
//! every context creation, and for `cuDeviceGetCount` when it failed or returned a count
//! not yet sent for the process (`DEVCOUNT_SENT`), so a process that asks again and again
//! costs no record. The `cuCtxCreate` versions share one in-flight slot per thread: a
//! version that calls another (or two names at one address) is counted once, as the
//! outermost call.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use uvmwatch_common::{
    context_call, counter, hist_bucket, ContextCallEvent, ContextCallKey, ContextCallResultKey,
    InflightContextCall, CTX_COUNT_READ, CTX_ENTRY_SEEN, EVENT_CONTEXT_CALL, LATE_END_NEXT_CALL,
};

use super::cuinit::{end_late, probed_call};
use crate::helpers::{add_sample, bump, config, count, emit, header, ids};
use crate::maps::{CTX_HIST, CTX_RESULTS, DEVCOUNT_SENT, INFLIGHT_CTX};

/// An in-flight entry older than this (60 s) is taken for one whose return was lost.
const STALE_NS: u64 = 60_000_000_000;

/// Entry of `call`: its time and arguments, unless a call of the same slot is already in
/// progress on the thread (then this one is nested and not counted).
#[inline(always)]
fn enter(ctx: &ProbeContext, call: u32) -> Option<()> {
    config()?;
    let (tgid, tid) = ids();
    let key = ContextCallKey {
        tid,
        slot: context_call::slot(call),
    };
    let now = unsafe { bpf_ktime_get_ns() };
    // The thread is past a late cuInit it had, and the library is probed now.
    end_late(tgid, tid, now, LATE_END_NEXT_CALL);
    probed_call(tgid);
    if let Some(e) = unsafe { INFLIGHT_CTX.get(&key) } {
        // An entry this old is one whose return was never seen (its thread died, or a
        // new thread has the tid): replaced. A younger one is the call this one is in.
        if now.saturating_sub(e.start_ns) < STALE_NS {
            return None;
        }
    }
    let device: i32 = match context_call::DEVICE_ARG
        .get(call as usize)
        .copied()
        .flatten()
    {
        Some(i) => ctx.arg(i).unwrap_or(-1),
        None => -1,
    };
    let out_ptr: u64 = if call == context_call::DEVICE_GET_COUNT {
        ctx.arg(0).unwrap_or(0)
    } else {
        0
    };
    let e = InflightContextCall {
        start_ns: now,
        out_ptr,
        call,
        device,
    };
    if INFLIGHT_CTX.insert(&key, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    }
    Some(())
}

/// Return of `call`: counted, and sent when user space must see it.
#[inline(always)]
fn exit(ctx: &RetProbeContext, call: u32) -> Option<()> {
    config()?;
    let (tgid, tid) = ids();
    let now = unsafe { bpf_ktime_get_ns() };
    let key = ContextCallKey {
        tid,
        slot: context_call::slot(call),
    };
    let (start, out_ptr, device, flags) = match unsafe { INFLIGHT_CTX.get(&key) } {
        // The return of a nested call of the same slot: the outer one counts.
        Some(e) if e.call != call => return None,
        Some(e) => (e.start_ns, e.out_ptr, e.device, CTX_ENTRY_SEEN),
        None => (now, 0, -1, 0),
    };
    let _ = INFLIGHT_CTX.remove(&key);
    let ret: i32 = ctx.ret();
    let dur = now.saturating_sub(start);
    if let Some(h) = CTX_HIST.get_ptr_mut(call) {
        add_sample(h, hist_bucket(dur), dur);
    }
    count(
        &CTX_RESULTS,
        &ContextCallResultKey {
            call,
            code: ret as u32,
        },
        counter::CTX_RESULTS_FULL,
    );
    let mut ev = ContextCallEvent {
        header: header(EVENT_CONTEXT_CALL, tgid, tid, now),
        start_ns: start,
        ret: ret as i64,
        call,
        device,
        count: 0,
        flags,
    };
    if call == context_call::DEVICE_GET_COUNT && ret == 0 {
        if out_ptr != 0 {
            if let Ok(n) = unsafe { bpf_probe_read_user::<i32>(out_ptr as *const i32) } {
                ev.count = n;
                ev.flags |= CTX_COUNT_READ;
            }
        }
        if ev.flags & CTX_COUNT_READ != 0 {
            if let Some(sent) = unsafe { DEVCOUNT_SENT.get(&tgid) } {
                if *sent == ev.count {
                    return Some(());
                }
            }
            let _ = DEVCOUNT_SENT.insert(&tgid, &ev.count, 0);
        }
    }
    emit(&ev);
    Some(())
}

/// The uprobe and uretprobe programs of each call id.
macro_rules! context_call_programs {
    ($(($enter:ident, $exit:ident, $id:ident, $sym:literal)),* $(,)?) => {
        $(
            #[doc = concat!("Uprobe on `", $sym, "`: its entry.")]
            #[uprobe]
            pub fn $enter(ctx: ProbeContext) -> u32 {
                let _ = enter(&ctx, context_call::$id);
                0
            }

            #[doc = concat!("Uretprobe on `", $sym, "`: its result and latency.")]
            #[uretprobe]
            pub fn $exit(ctx: RetProbeContext) -> u32 {
                let _ = exit(&ctx, context_call::$id);
                0
            }
        )*
    };
}

context_call_programs!(
    (cuctx_v1_enter, cuctx_v1_exit, CTX_CREATE, "cuCtxCreate"),
    (
        cuctx_v2_enter,
        cuctx_v2_exit,
        CTX_CREATE_V2,
        "cuCtxCreate_v2"
    ),
    (
        cuctx_v3_enter,
        cuctx_v3_exit,
        CTX_CREATE_V3,
        "cuCtxCreate_v3"
    ),
    (
        cuctx_v4_enter,
        cuctx_v4_exit,
        CTX_CREATE_V4,
        "cuCtxCreate_v4"
    ),
    (
        cuprimctx_enter,
        cuprimctx_exit,
        PRIMARY_CTX_RETAIN,
        "cuDevicePrimaryCtxRetain"
    ),
    (
        cudevcnt_enter,
        cudevcnt_exit,
        DEVICE_GET_COUNT,
        "cuDeviceGetCount"
    ),
);

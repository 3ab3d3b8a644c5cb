//! Signals of what the probes saw of one process ([`Observations`]): its `cuInit`, the
//! driver calls and device opens inside it, the thread stuck in one, a fork after its
//! parent's `cuInit`, its device count and `CUDA_VISIBLE_DEVICES`. For a plain `doctor`,
//! which watched no process, they are unknown.

use super::super::facts::{Observations, SeenCall};
use super::nodes::is_gpu_node;
use super::{Input, Reading, Source, State};

/// The UVM ioctl in which UVM brings a GPU up, HMM device memory included (`uvm_ioctl.h`).
pub const REGISTER_GPU: &str = "UVM_REGISTER_GPU";

/// `NV_STATUS` of a failed HMM set-up (`nvstatuscodes.h`, 0x51).
const NV_ERR_NO_MEMORY: &str = "NV_ERR_NO_MEMORY";

/// A failing `cuInit` that returns within this many seconds "returned quickly".
const QUICK_SECONDS: f64 = 1.0;

/// Slow-init threshold: this many seconds, plus [`SLOW_INIT_PER_GPU_SECONDS`] per GPU (a
/// heuristic: `cuInit` on a host with persistence takes well under a second; without it each
/// GPU is brought up on first open). The live agent judges a successful `cuInit` only when
/// it took at least this long.
pub const SLOW_INIT_BASE_SECONDS: f64 = 2.0;

/// See [`SLOW_INIT_BASE_SECONDS`].
pub const SLOW_INIT_PER_GPU_SECONDS: f64 = 0.5;

/// A first open of a GPU node this long brought the GPU up: without persistence the driver
/// initializes the GPU in the first open after the last close (NVIDIA driver persistence
/// documentation). The live agent also judges a successful `cuInit` whose first GPU open
/// took this long.
pub const SLOW_FIRST_OPEN_SECONDS: f64 = 1.0;

/// Errnos of an open of a node that is missing or has no driver behind it.
const MISSING_ERRNOS: &[&str] = &["ENOENT", "ENXIO", "ENODEV"];

/// Errnos of an open refused by policy: `EPERM` (device cgroup, LXC allow-list), `EACCES`
/// (mode bits, user namespace, a security module).
const DENIED_ERRNOS: &[&str] = &["EPERM", "EACCES"];

/// Frames of HMM device-memory set-up (`uvm_pmm_gpu.c`: `uvm_pmm_devmem_init`,
/// `devmem_alloc_pagemap`; Linux: `memremap_pages`, `request_free_mem_region`).
const HMM_FRAMES: &[&str] = &[
    "uvm_pmm_devmem",
    "devmem_alloc_pagemap",
    "memremap_pages",
    "request_free_mem_region",
    "memmap_init_zone_device",
];

/// Whether the probes saw anything of a process (false for a plain `doctor`).
pub fn observed_any(o: &Observations) -> bool {
    o.pid.is_some()
        || o.cuinit_result.is_some()
        || o.cuinit_in_flight
        || o.stuck_in.is_some()
        || o.failed_call.is_some()
        || !o.failed_opens.is_empty()
        || o.device_opens > 0
        || o.forked_after_parent_init
        || !o.kernel_signals.is_empty()
        || o.context_result.is_some()
        || o.device_count_seen.is_some()
}

/// A probe's source.
fn probe(name: &str) -> Source {
    Source::probe(format!("probe:{name}"))
}

/// Unknown: no process was observed.
fn unobserved(name: &str) -> Reading {
    Reading::unknown("no process observed", probe(name))
}

/// The probe of `label` (a substring of an unavailable probe's entry) is not attached.
fn unavailable<'a>(o: &'a Observations, label: &str) -> Option<&'a str> {
    o.unavailable_probes
        .iter()
        .find(|p| p.contains(label))
        .map(String::as_str)
}

/// `UVM_REGISTER_GPU on /dev/nvidia-uvm -> NV_ERR_NO_MEMORY (0.050 s)`.
pub fn call_text(c: &SeenCall) -> String {
    if c.result.is_empty() {
        format!("{}, in flight for {:.1} s", c.what(), c.seconds)
    } else {
        format!("{} -> {} ({:.3} s)", c.what(), c.result, c.seconds)
    }
}

pub(super) fn observed(i: &Input) -> Reading {
    let o = i.o;
    match o.pid {
        _ if observed_any(o) => Reading::holds(
            o.pid
                .map(|p| format!("pid {p}"))
                .unwrap_or_else(|| "a process".into()),
            probe("cuInit"),
        ),
        _ => Reading::fails("no process observed (a plain doctor)", probe("cuInit")),
    }
}

pub(super) fn opens_ok(i: &Input) -> Reading {
    let o = i.o;
    if !observed_any(o) {
        return unobserved("openat");
    }
    if let Some(why) = unavailable(o, "openat") {
        return Reading::unknown(format!("opens not seen: {why}"), probe("openat"));
    }
    Reading::either(
        o.device_opens > 0 && o.failed_opens.is_empty(),
        format!(
            "{} device opens succeeded (the nodes are fine)",
            o.device_opens
        ),
        format!(
            "{} succeeded, {} failed",
            o.device_opens,
            o.failed_opens.len()
        ),
        probe("openat"),
    )
}

pub(super) fn no_opens(i: &Input) -> Reading {
    let o = i.o;
    if !observed_any(o) {
        return unobserved("openat");
    }
    if let Some(why) = unavailable(o, "openat") {
        return Reading::unknown(format!("opens not seen: {why}"), probe("openat"));
    }
    // A driver call seen (a failed or stuck ioctl, a kernel function inside one) was made
    // on an open node, whether its open was seen or came before the agent.
    if o.failed_call.is_some() || o.stuck_in.is_some() || !o.kernel_signals.is_empty() {
        return Reading::fails(
            "driver calls were seen: the driver was reached",
            probe("ioctl"),
        );
    }
    Reading::either(
        o.device_opens == 0 && o.failed_opens.is_empty(),
        "no device open: the driver was never reached",
        format!(
            "{} device opens, {} failed",
            o.device_opens,
            o.failed_opens.len()
        ),
        probe("openat"),
    )
}

/// The failed opens with one of `errnos` (on the nodes `which` admits).
fn failed_opens(i: &Input, errnos: &[&str], which: fn(&str) -> bool) -> Reading {
    let o = i.o;
    if !observed_any(o) {
        return unobserved("openat");
    }
    let bad: Vec<String> = o
        .failed_opens
        .iter()
        .filter(|(p, e)| errnos.contains(&e.as_str()) && which(p))
        .map(|(p, e)| format!("{p}: {e}"))
        .collect();
    if !bad.is_empty() {
        return Reading::holds(bad.join(", "), probe("openat"));
    }
    match unavailable(o, "openat") {
        Some(why) => Reading::unknown(format!("opens not seen: {why}"), probe("openat")),
        None => Reading::fails(
            format!("no open failed with {}", errnos.join("/")),
            probe("openat"),
        ),
    }
}

pub(super) fn open_missing(i: &Input) -> Reading {
    failed_opens(i, MISSING_ERRNOS, |_| true)
}

pub(super) fn uvm_open_missing(i: &Input) -> Reading {
    let r = failed_opens(i, MISSING_ERRNOS, |p| p == "/dev/nvidia-uvm");
    // A node made with another major gives ENXIO too: that is a mismatched node, not a
    // missing one (node_number_mismatch).
    if r.state == State::Holds && super::nodes::uvm_major_wrong(i.e) {
        return Reading::fails(
            format!("{}, but the node's major is not nvidia-uvm's", r.value),
            probe("openat"),
        );
    }
    r
}

pub(super) fn open_denied(i: &Input) -> Reading {
    failed_opens(i, DENIED_ERRNOS, |_| true)
}

pub(super) fn open_eio(i: &Input) -> Reading {
    // /dev/nvidia-uvm too: uvm_open returns the errno of UVM's global fatal error (an ECC
    // or RC error, NV_ERR_ECC_ERROR -> EIO: uvm_common.c, uvm_global.c).
    failed_opens(i, &["EIO"], |p| {
        is_gpu_node(p) || p == "/dev/nvidiactl" || p == "/dev/nvidia-uvm"
    })
}

/// The last failed driver call, when it is `UVM_REGISTER_GPU`.
fn register_call(o: &Observations) -> Option<&SeenCall> {
    o.failed_call.as_ref().filter(|c| {
        c.call == REGISTER_GPU && !c.result.is_empty() && c.result != "OK" && c.result != "NV_OK"
    })
}

/// What the ioctl probes saw: unknown without a process or without the probes.
fn calls(i: &Input, found: Option<String>, none: &str) -> Reading {
    let o = i.o;
    if let Some(f) = found {
        return Reading::holds(f, probe("ioctl"));
    }
    if !observed_any(o) {
        return unobserved("ioctl");
    }
    match unavailable(o, "ioctl") {
        Some(why) => Reading::unknown(format!("driver calls not seen: {why}"), probe("ioctl")),
        None => Reading::fails(none, probe("ioctl")),
    }
}

pub(super) fn register_failed(i: &Input) -> Reading {
    calls(
        i,
        register_call(i.o).map(call_text),
        "UVM_REGISTER_GPU did not fail",
    )
}

pub(super) fn register_no_memory(i: &Input) -> Reading {
    calls(
        i,
        register_call(i.o)
            .filter(|c| c.result == NV_ERR_NO_MEMORY)
            .map(call_text),
        "UVM_REGISTER_GPU did not return NV_ERR_NO_MEMORY",
    )
}

/// The call a thread is stuck in.
fn stuck(o: &Observations) -> Option<&SeenCall> {
    o.stuck_in.as_ref().filter(|c| c.result.is_empty())
}

pub(super) fn register_hung(i: &Input) -> Reading {
    calls(
        i,
        stuck(i.o).filter(|c| c.call == REGISTER_GPU).map(call_text),
        "no thread stuck in UVM_REGISTER_GPU",
    )
}

pub(super) fn call_hung(i: &Input) -> Reading {
    calls(
        i,
        stuck(i.o).map(call_text),
        "no thread stuck in a driver call",
    )
}

/// A frame or wchan in nvidia code (`uvm_*`, `nv_*`, `_nv0*`, `os_*`, `[nvidia]`).
fn nvidia_symbol(s: &str) -> bool {
    s.contains("uvm_")
        || s.contains("nv_")
        || s.contains("_nv0")
        || s.contains("nvidia")
        || s.contains("os_")
}

/// What was read of the stuck thread: unknown without one.
fn thread(i: &Input, found: impl FnOnce(&Observations) -> Option<String>, none: &str) -> Reading {
    let o = i.o;
    let src = Source::probe(format!("{}/stack", o.stuck_thread_dir()));
    if o.stuck_in.is_none()
        && !o.cuinit_in_flight
        && o.stuck_state.is_none()
        && o.stuck_wchan.is_none()
        && o.stuck_stack.is_empty()
    {
        return Reading::unknown("no stuck thread", src);
    }
    if let Some(f) = found(o) {
        return Reading::holds(f, src);
    }
    if o.stuck_wchan.is_none() && o.stuck_stack.is_empty() && o.stuck_state.is_none() {
        return Reading::unknown(
            format!("{}/stack not readable (needs root)", o.stuck_thread_dir()),
            src,
        );
    }
    Reading::fails(none, src)
}

pub(super) fn thread_in_driver(i: &Input) -> Reading {
    thread(
        i,
        |o| {
            let d = o.stuck_state.as_deref().filter(|s| s.starts_with('D'));
            let w = o.stuck_wchan.as_deref().filter(|w| nvidia_symbol(w));
            let f = o.stuck_stack.iter().find(|s| nvidia_symbol(s));
            match (d, w, f) {
                (None, None, None) => None,
                _ => Some(
                    [
                        d.map(|d| format!("state {d}")),
                        w.map(|w| format!("wchan {w}")),
                        f.map(|f| format!("frame {f}")),
                    ]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(", "),
                ),
            }
        },
        "the thread is not sleeping in nvidia code",
    )
}

pub(super) fn stack_in_hmm(i: &Input) -> Reading {
    thread(
        i,
        |o| {
            o.stuck_stack
                .iter()
                .chain(o.stuck_wchan.iter())
                .find(|s| HMM_FRAMES.iter().any(|f| s.contains(f)))
                .cloned()
        },
        "no HMM set-up frame on the stack",
    )
}

pub(super) fn stack_outside_hmm(i: &Input) -> Reading {
    let o = i.o;
    let src = Source::probe(format!("{}/stack", o.stuck_thread_dir()));
    if o.stuck_stack.is_empty() {
        return Reading::unknown("no stack read", src);
    }
    // A thread in nvidia_uvm (uvm_* frames) may wait for the global lock another thread
    // holds in HMM set-up: only a stack in RM alone speaks against HMM.
    let in_uvm = o
        .stuck_stack
        .iter()
        .any(|s| s.contains("uvm_") || HMM_FRAMES.iter().any(|f| s.contains(f)));
    match o.stuck_stack.iter().find(|s| nvidia_symbol(s)) {
        Some(f) if !in_uvm => Reading::holds(format!("{f}, no nvidia_uvm frame"), src),
        _ => Reading::fails(
            if in_uvm {
                "nvidia_uvm frames on the stack"
            } else {
                "no nvidia frame on the stack"
            },
            src,
        ),
    }
}

/// `cuInit`'s result as the cuInit probe saw it: unknown when it did not return.
fn cuinit(i: &Input, pred: impl FnOnce(i64, Option<f64>) -> bool, yes: &str, no: &str) -> Reading {
    let o = i.o;
    match o.cuinit_result {
        Some(r) => Reading::either(
            pred(r, o.cuinit_seconds),
            format!("{r}: {yes}"),
            format!("{r}: {no}"),
            probe("cuInit"),
        ),
        None if o.cuinit_in_flight => Reading::fails("cuInit has not returned", probe("cuInit")),
        None => match unavailable(o, "cuInit") {
            Some(why) => Reading::unknown(format!("cuInit not seen: {why}"), probe("cuInit")),
            None => Reading::unknown("no cuInit seen", probe("cuInit")),
        },
    }
}

pub(super) fn cuinit_ok(i: &Input) -> Reading {
    cuinit(i, |r, _| r == 0, "returned 0", "failed")
}

pub(super) fn quick(i: &Input) -> Reading {
    cuinit(
        i,
        |r, s| r != 0 && s.is_some_and(|s| s <= QUICK_SECONDS),
        "failed within a second",
        "did not fail quickly (or its time is unknown)",
    )
}

pub(super) fn ioctls_unseen(i: &Input) -> Reading {
    let o = i.o;
    if !observed_any(o) {
        return unobserved("ioctl");
    }
    match unavailable(o, "ioctl") {
        Some(why) => Reading::holds(why.to_string(), probe("ioctl")),
        None => Reading::fails("the ioctl probes ran", probe("ioctl")),
    }
}

pub(super) fn forked(i: &Input) -> Reading {
    let o = i.o;
    if o.forked_after_parent_init {
        return Reading::holds(
            "forked without exec after its parent's cuInit",
            probe("fork"),
        );
    }
    if !observed_any(o) {
        return unobserved("fork");
    }
    match unavailable(o, "fork") {
        Some(why) => Reading::unknown(format!("forks not seen: {why}"), probe("fork")),
        None => Reading::fails("not forked after a cuInit", probe("fork")),
    }
}

/// The GPUs the process has: the GPU nodes in its root, else those `nvidia-smi` lists,
/// else those the driver registered.
fn gpu_count(i: &Input) -> Option<u32> {
    let e = i.e;
    i.o.gpu_nodes_visible
        .filter(|n| *n > 0)
        .or_else(|| e.smi.get().map(|s| s.gpus).filter(|n| *n > 0))
        .or_else(|| e.gpus.get().map(|g| g.len() as u32).filter(|n| *n > 0))
}

pub(super) fn slow(i: &Input) -> Reading {
    let o = i.o;
    let gpus = gpu_count(i).unwrap_or(1);
    let threshold = SLOW_INIT_BASE_SECONDS + SLOW_INIT_PER_GPU_SECONDS * f64::from(gpus);
    match (o.cuinit_result, o.cuinit_seconds) {
        (Some(0), Some(s)) => Reading::either(
            s >= threshold,
            format!("{s:.1} s ({gpus} GPU(s), threshold {threshold:.1} s)"),
            format!("{s:.2} s"),
            probe("cuInit"),
        ),
        _ => Reading::unknown("no successful cuInit timed", probe("cuInit")),
    }
}

pub(super) fn first_open_slow(i: &Input) -> Reading {
    match i.o.first_gpu_open_seconds {
        Some(s) => Reading::either(
            s >= SLOW_FIRST_OPEN_SECONDS,
            format!("{s:.3} s: the driver brought the GPU up in it"),
            format!("{s:.3} s: the GPU was up already"),
            probe("openat"),
        ),
        None => Reading::unknown(
            "how long the first GPU open took was not seen",
            probe("openat"),
        ),
    }
}

/// The devices a process should see, for its device count to be held against, and what
/// they are: the GPU nodes in its own root (what its container was given); when those were
/// not read, and only with MIG on (a host's GPU count says nothing of what one container
/// was given), the devices of `nvidia-smi -q`: each MIG device, and each GPU with MIG off.
/// Under MIG, CUDA enumerates a single MIG device per process (NVIDIA's MIG User Guide, CUDA
/// Device Enumeration: "a single CUDA process can only enumerate a single MIG device"), so a
/// process that meant to use several sees one: the count is low. `CUDA_VISIBLE_DEVICES`
/// caps it at the entries it lists (a process given one GPU on purpose sees one: not low).
/// More devices than GPUs is MIG partitioning at work, not a loss.
pub fn device_count_disagrees(
    smi: Option<&super::super::facts::SmiInfo>,
    gpu_nodes: Option<u32>,
    cuda_visible_devices: Option<&str>,
    count: i32,
) -> Option<(u32, &'static str)> {
    let (mut want, what) = match gpu_nodes.filter(|&n| n > 0) {
        Some(n) => (n, "GPU(s)"),
        None => {
            let s = smi.filter(|s| s.mig_mode.iter().any(|m| m == "Enabled"))?;
            let devices: u32 = (0..s.gpus as usize)
                .map(|g| match s.mig_mode.get(g).map(String::as_str) {
                    Some("Enabled") => s.mig_devices.get(g).copied().unwrap_or(0),
                    _ => 1,
                })
                .sum();
            (devices.max(s.gpus), "MIG device(s) and GPU(s) without MIG")
        }
    };
    if let Some(v) = cuda_visible_devices {
        let listed = v.split(',').filter(|e| !e.trim().is_empty()).count() as u32;
        want = want.min(listed);
    }
    (i64::from(count) < i64::from(want)).then_some((want, what))
}

pub(super) fn count_low(i: &Input) -> Reading {
    let o = i.o;
    let src = probe("cuDeviceGetCount");
    let Some(count) = o.device_count_seen.filter(|_| {
        o.context_call.as_deref() != Some("cuDeviceGetCount") || o.context_result == Some(0)
    }) else {
        return Reading::unknown("no device count seen", src);
    };
    match device_count_disagrees(
        i.e.smi.get(),
        o.gpu_nodes_visible,
        o.cuda_visible_devices.as_deref(),
        count,
    ) {
        Some((n, what)) => Reading::holds(
            format!("{count} device(s) where the process has {n} {what}"),
            src,
        ),
        // No device at all on a host with a GPU: low whatever the process was given.
        None if count <= 0 && gpu_count(i).is_some() => Reading::holds(
            format!(
                "{count} device(s) on a host with {} GPU(s)",
                gpu_count(i).unwrap_or(0)
            ),
            src,
        ),
        None => Reading::fails(format!("{count} device(s)"), src),
    }
}

pub(super) fn visible_set(i: &Input) -> Reading {
    let o = i.o;
    let src = Source::probe(format!(
        "/proc/{}/environ",
        o.pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "<pid>".into())
    ));
    match &o.cuda_visible_devices {
        Some(v) => Reading::holds(format!("CUDA_VISIBLE_DEVICES={v}"), src),
        None if observed_any(o) => {
            Reading::fails("CUDA_VISIBLE_DEVICES not set (initial environment)", src)
        }
        None => Reading::unknown("no process observed", src),
    }
}

pub(super) fn visible_narrow(i: &Input) -> Reading {
    let r = visible_set(i);
    if r.state != State::Holds {
        return r;
    }
    let v = i.o.cuda_visible_devices.clone().unwrap_or_default();
    let Some(gpus) = gpu_count(i) else {
        return Reading::unknown("how many GPUs the process has is not known", r.source);
    };
    // The entries CUDA takes: indexes below the GPU count and UUIDs, up to the first that
    // names none.
    let mut named = 0u32;
    for e in v.split(',').map(str::trim) {
        let lower = e.to_ascii_lowercase();
        let ok = match e.parse::<i64>() {
            Ok(n) => n >= 0 && n < i64::from(gpus),
            Err(_) => lower.starts_with("gpu-") || lower.starts_with("mig-"),
        };
        if !ok {
            break;
        }
        named += 1;
    }
    Reading::either(
        named < gpus,
        format!("CUDA_VISIBLE_DEVICES={v} names {named} of the {gpus} GPU(s)"),
        format!("CUDA_VISIBLE_DEVICES={v} names every one of the {gpus} GPU(s)"),
        r.source,
    )
}

pub(super) fn visible_several(i: &Input) -> Reading {
    let r = visible_set(i);
    if r.state != State::Holds {
        return r;
    }
    let v = i.o.cuda_visible_devices.clone().unwrap_or_default();
    let n = v.split(',').filter(|e| !e.trim().is_empty()).count();
    Reading::either(
        n > 1,
        format!("CUDA_VISIBLE_DEVICES={v}: {n} devices"),
        format!("CUDA_VISIBLE_DEVICES={v}: {n} device(s)"),
        r.source,
    )
}

pub(super) fn visible_parent_under_mig(i: &Input) -> Reading {
    let r = visible_set(i);
    if r.state != State::Holds {
        return r;
    }
    let Some(smi) = i.e.smi.get() else {
        return Reading::of_unread(&i.e.smi);
    };
    let mig = smi.mig_mode.iter().any(|m| m == "Enabled");
    let v = i.o.cuda_visible_devices.clone().unwrap_or_default();
    let parents: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|e| e.to_ascii_lowercase().starts_with("gpu-") && !e.contains('/'))
        .collect();
    Reading::either(
        mig && !parents.is_empty(),
        format!(
            "CUDA_VISIBLE_DEVICES={v} names the GPU {} itself, with MIG on",
            parents.join(", ")
        ),
        if mig {
            format!("CUDA_VISIBLE_DEVICES={v} names no parent GPU")
        } else {
            "MIG off".to_string()
        },
        r.source,
    )
}

pub(super) fn visible_none(i: &Input) -> Reading {
    let r = visible_set(i);
    if r.state != State::Holds {
        return r;
    }
    let v = i.o.cuda_visible_devices.clone().unwrap_or_default();
    let first = v.split(',').next().unwrap_or("").trim().to_string();
    let gpus = gpu_count(i);
    let lower = first.to_ascii_lowercase();
    let verdict = if first.is_empty() || lower == "none" || lower == "void" || lower == "-1" {
        Some(true)
    } else if let Ok(n) = first.parse::<i64>() {
        gpus.map(|g| n < 0 || n >= i64::from(g))
    } else if lower.starts_with("gpu-") || lower.starts_with("mig-") {
        // A UUID: whether a GPU has it is not read here.
        None
    } else {
        // Not an index nor a UUID: CUDA stops at it.
        Some(true)
    };
    let src = r.source;
    match verdict {
        Some(true) => Reading::holds(
            format!(
                "CUDA_VISIBLE_DEVICES={v}: its first entry names no GPU{}",
                gpus.map(|g| format!(" of the {g}")).unwrap_or_default()
            ),
            src,
        ),
        Some(false) => Reading::fails(format!("CUDA_VISIBLE_DEVICES={v} names a GPU"), src),
        None => Reading::unknown(
            format!("CUDA_VISIBLE_DEVICES={v}: cannot tell which GPU it names"),
            src,
        ),
    }
}

//! Prometheus metrics.
//!
//! Two kinds of sources:
//! * counters, gauges and histograms kept from the observer's events (`cuInit` results and
//!   durations, stalls, diagnoses, probe states), held in [`Metrics`] and updated by its
//!   [`Listener`];
//! * per-call aggregates kept **in the kernel** (ioctl latency histograms and results,
//!   device opens, dropped events), read from the maps at scrape time by
//!   [`kernel::KernelCollector`] so user space is never on the per-call path.
//!
//! Naming follows Prometheus conventions: `uvmwatch_` prefix, base units (seconds),
//! `_total` for counters. No pid labels: label values are bounded (names from the driver
//! headers, errno names, `unknown`).

pub mod kernel;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, Weak},
};

use prometheus::{
    core::Collector, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};

use crate::{
    event::{Event, Kind, Listener},
    kernel::{registry::ProbeState, Kernel},
};

/// Bucket upper bounds (seconds) of `uvmwatch_cuinit_duration_seconds`: 1 ms to 10 minutes,
/// since a healthy `cuInit` takes 0.1–5 s and a hung one is the point of the agent.
pub const CUINIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0,
];

/// Bucket upper bounds (seconds) of `uvmwatch_libcuda_attach_seconds`: 1 ms to 10 s (a
/// file's probes attach in milliseconds; seconds mean a queue or a slow kernel).
pub const ATTACH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Metrics maintained by the agent from events.
#[derive(Clone)]
pub struct Metrics {
    /// Registry served on `/metrics`.
    pub registry: Registry,
    /// `uvmwatch_cuinit_calls_total{result,seen}`.
    pub cuinit_calls: IntCounterVec,
    /// `uvmwatch_cuinit_failures_total{result,call,node,call_result,rule}`.
    pub cuinit_failures: IntCounterVec,
    /// `uvmwatch_cuinit_duration_seconds`.
    pub cuinit_duration: Histogram,
    /// `uvmwatch_cuinit_in_flight`.
    pub cuinit_in_flight: IntGauge,
    /// `uvmwatch_stalls_total{call}`.
    pub stalls: IntCounterVec,
    /// `uvmwatch_stalled_calls{call}`.
    pub stalled: IntGaugeVec,
    /// `uvmwatch_probe_attached{probe,backend}`.
    pub probe_attached: IntGaugeVec,
    /// `uvmwatch_probe_backend_info{backend,reason}`.
    pub probe_backend: IntGaugeVec,
    /// `uvmwatch_libcuda_targets`.
    pub libcuda_targets: IntGauge,
    /// `uvmwatch_libcuda_attach_seconds`.
    pub libcuda_attach: Histogram,
    /// `uvmwatch_feature_enabled{feature}`.
    pub feature_enabled: IntGaugeVec,
    /// `uvmwatch_diagnosis{rule,severity}`.
    pub diagnosis: IntGaugeVec,
    /// `uvmwatch_ioctl_layout_info{driver_version,layout,selection}`.
    pub ioctl_layout: IntGaugeVec,
    /// Records lost in user space (undecodable); added to the kernel's drops.
    pub user_drops: IntCounter,
    /// `uvmwatch_events_received_total`.
    pub received: IntCounter,
    /// `uvmwatch_process_identities_unread_total`.
    pub identities_unread: IntCounter,
    /// Whether `uvmwatch_cuinit_calls_total` and `uvmwatch_stalls_total` carry the opt-in
    /// workload labels (`engine`, `namespace`, `pod`).
    pub workload_labels: bool,
}

/// The opt-in workload labels (bounded: an engine name, a Kubernetes namespace and pod).
pub const WORKLOAD_LABELS: [&str; 3] = ["engine", "namespace", "pod"];

/// Every metric family name the agent exports, with its type and help text.
/// The metrics reference in `docs/metrics.md` is checked against this list by a test.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    ("uvmwatch_build_info", "gauge", "Always 1; labels carry the agent version and kernel release."),
    ("uvmwatch_ioctl_layout_info", "gauge", "Always 1, one series: the running driver's version (unknown when none is loaded or readable), the driver release whose ioctl params layouts statuses are read with, and how it was chosen (exact, nearest for a version the table does not know, newest when no version is known). docs/compatibility.md lists the releases."),
    ("uvmwatch_cuinit_calls_total", "counter", "cuInit calls that ended, by result (CUresult name from cuda.h, thread_exited when the calling thread died inside the call, unknown when only its driver calls were seen and they do not tell) and by how much of the call the probes saw (seen: whole, return, driver_calls: its libcuda was loaded and the call made before the probes were attached, its result inferred from its driver calls)."),
    ("uvmwatch_cuinit_failures_total", "counter", "Failed cuInit calls in which a driver call or device open failed, by the cuInit result, the last failed call (call: the ioctl name, or open; node; call_result: its NV_ERR_* or errno name) and the worst diagnosis rule (none without one)."),
    ("uvmwatch_cuinit_duration_seconds", "histogram", "Time from cuInit entry to return, seconds."),
    ("uvmwatch_cuinit_in_flight", "gauge", "cuInit calls currently running."),
    ("uvmwatch_stalls_total", "counter", "Calls that crossed their stall threshold (--cuinit-stall, --ioctl-stall), by call (cuInit or the driver ioctl name)."),
    ("uvmwatch_stalled_calls", "gauge", "Calls currently past their stall threshold, by call."),
    ("uvmwatch_driver_ioctl_calls_total", "counter", "Ioctls on NVIDIA device nodes, by node, ioctl name and result (NV_OK or an NV_ERR_* name read from the params' rmStatus, OK when no status was read: the command has none, or its number or params size is not in the running driver's layout table; an errno name when the syscall failed; PARAMS_UNREADABLE when the params could not be read)."),
    ("uvmwatch_driver_ioctl_duration_seconds", "histogram", "Ioctl latency on NVIDIA device nodes, seconds, aggregated in the kernel in log2 buckets."),
    ("uvmwatch_kernel_function_calls_total", "counter", "Calls of the traced kernel and nvidia_uvm functions (HMM set-up, GPU registration, HMM faults, GPU fault batches; docs/probes.md), by function and result (NV_STATUS name, errno name, or OK). nvidia_uvm functions only where the kernel has kprobes, the core-kernel ones where it has kprobes or fentry; request_free_mem_region and memremap_pages only inside UVM ioctls."),
    ("uvmwatch_kernel_function_duration_seconds", "histogram", "Latency of the traced kernel and nvidia_uvm functions, seconds, aggregated in the kernel in log2 buckets."),
    ("uvmwatch_cuda_context_calls_total", "counter", "Calls of the CUDA context and device functions probed in libcuda (cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4, cuDevicePrimaryCtxRetain, cuDeviceGetCount, as each libcuda exports them; docs/probes.md), by call and result (CUresult name from cuda.h, e.g. CUDA_ERROR_DEVICE_UNAVAILABLE for 46; CUDA_ERROR_<code> for a code the table does not name). Counted in the kernel; a cuCtxCreate version called from another counts once."),
    ("uvmwatch_cuda_context_duration_seconds", "histogram", "Latency of the CUDA context and device functions probed in libcuda, by call, seconds, aggregated in the kernel in log2 buckets."),
    ("uvmwatch_device_opens_total", "counter", "Opens (open, openat, openat2) of NVIDIA device nodes, by node and result (success or errno name)."),
    ("uvmwatch_events_received_total", "counter", "Event records the agent took from the kernel's ring buffer (what decoding handled: compare with uvmwatch_events_dropped_total)."),
    ("uvmwatch_events_dropped_total", "counter", "Event records lost: ring buffer full in the kernel, or undecodable in user space."),
    ("uvmwatch_events_throttled_total", "counter", "Failure records (a failed driver call or open outside cuInit) not sent to the agent because their process sent more than 200 in one second; the calls are counted in uvmwatch_driver_ioctl_calls_total and uvmwatch_device_opens_total all the same, and the log sums repeated failures up."),
    ("uvmwatch_kernel_map_full_total", "counter", "Entries a kernel map refused because it was full, by map: inflight (calls in flight), procs (processes whose ioctls are looked at), pending_open (opens between enter and exit), ioctl_hist, ioctl_results, opens, kf_results, ctx_results (aggregates: a call not counted). Unknown ioctl numbers share one aggregate key per node and result, so no process fills the aggregates by inventing numbers."),
    ("uvmwatch_device_open_paths_unreadable_total", "counter", "Failed opens whose path could not be read at their exit (a bad address, which the kernel could not read either): such a failure is not classified. Successful opens are identified by the file they return, not by their path."),
    ("uvmwatch_opens_unfollowed_total", "counter", "Opens the kernel side could not follow to their exit, where it needed their start: a failed open (not classified: it may have been of an NVIDIA node), a successful open of an NVIDIA node (counted in uvmwatch_device_opens_total all the same) or of a libcuda (its cuInit probes wait for the next process that loads it). Their start was recycled by the per-thread map of opens in flight (16384 threads), or they began before the agent attached; a few at the agent's start are expected."),
    ("uvmwatch_process_identities_unread_total", "counter", "Times the agent needed a process's identity and could not read it from /proc/<pid>: the process had exited before the agent reached its event (the agent was that far behind its events, or the event came after the process's exit), or its /proc entry could not be read. The records it was needed for carry only the pid and comm the kernel gave: no executable, command line, container, workload, trace context or opt-in workload labels."),
    ("uvmwatch_tracked_processes", "gauge", "Processes whose ioctls the kernel side looks at: those that opened an NVIDIA node or libcuda, held an NVIDIA fd when the agent started, or were forked from one (each ioctl of any other process costs one map lookup); removed at their exit."),
    ("uvmwatch_diagnosis", "gauge", "1 while a cause (rule) has an active finding of this severity and standing in the differential (leading: the most likely cause of a symptom; possible: another cause still possible; hazard: the host's state before anything failed), from the host's state or from a stall or failure within --diagnosis-ttl; 0 after it cleared; no series before the first finding. Causes and runbooks: docs/doctor.md."),
    ("uvmwatch_probe_attached", "gauge", "1 when the probe is attached, else 0 (see `uvmwatch probes` for the reason); backend: the syscall backend the probe belongs to (fentry, tracepoint), or both for the probes every backend uses."),
    ("uvmwatch_probe_backend_info", "gauge", "Always 1, one series: how the opens and ioctls are hooked (backend: fentry or tracepoint) and why (reason: trampolines_allowed, fentry_refused, flag); `uvmwatch probes` and the started record give the kernel's words."),
    ("uvmwatch_libcuda_targets", "gauge", "Distinct libcuda files (device, inode) with cuInit probes attached."),
    ("uvmwatch_libcuda_attach_seconds", "histogram", "Time from a libcuda file being found (the kernel's time of the open that made the agent find it; the attach's start for a file found at start or by a scan) to its probes attached, seconds. A process's first cuInit is seen whole when it comes later than this after the library's load."),
    ("uvmwatch_feature_enabled", "gauge", "1 when the feature works on this host, 0 when it is off (a probe the kernel refused, a capability not held; the log says why once, event feature_off): driver_calls, cuinit_calls, container_libcuda, kernel_stacks, kernel_log, kernel_functions (docs/capabilities.md)."),
];

/// Labels of each family, for the reference page.
const FAMILY_LABELS: &[(&str, &str)] = &[
    ("uvmwatch_build_info", "version, kernel"),
    (
        "uvmwatch_ioctl_layout_info",
        "driver_version, layout, selection",
    ),
    (
        "uvmwatch_cuinit_calls_total",
        "result, seen (+ engine, namespace, pod with --workload-labels)",
    ),
    (
        "uvmwatch_cuinit_failures_total",
        "result, call, node, call_result, rule",
    ),
    ("uvmwatch_cuinit_duration_seconds", ""),
    ("uvmwatch_cuinit_in_flight", ""),
    (
        "uvmwatch_stalls_total",
        "call (+ engine, namespace, pod with --workload-labels)",
    ),
    ("uvmwatch_stalled_calls", "call"),
    ("uvmwatch_driver_ioctl_calls_total", "node, ioctl, result"),
    ("uvmwatch_driver_ioctl_duration_seconds", "node, ioctl"),
    ("uvmwatch_cuda_context_calls_total", "call, result"),
    ("uvmwatch_cuda_context_duration_seconds", "call"),
    ("uvmwatch_device_opens_total", "node, result"),
    ("uvmwatch_kernel_function_calls_total", "function, result"),
    ("uvmwatch_kernel_function_duration_seconds", "function"),
    ("uvmwatch_events_received_total", ""),
    ("uvmwatch_events_dropped_total", ""),
    ("uvmwatch_events_throttled_total", ""),
    ("uvmwatch_kernel_map_full_total", "map"),
    ("uvmwatch_device_open_paths_unreadable_total", ""),
    ("uvmwatch_opens_unfollowed_total", ""),
    ("uvmwatch_process_identities_unread_total", ""),
    ("uvmwatch_tracked_processes", ""),
    ("uvmwatch_diagnosis", "rule, severity, standing"),
    ("uvmwatch_probe_attached", "probe, backend"),
    ("uvmwatch_probe_backend_info", "backend, reason"),
    ("uvmwatch_libcuda_targets", ""),
    ("uvmwatch_libcuda_attach_seconds", ""),
    ("uvmwatch_feature_enabled", "feature"),
];

/// The metrics reference (`docs/metrics.md`), generated from [`FAMILIES`] so it cannot drift
/// (a test compares the file with this text).
pub fn reference_markdown() -> String {
    let mut s = String::from(
        "# Metrics reference\n\n\
         Generated from `agent/src/export/metrics/mod.rs` by `uvmwatch metrics-doc`; a test keeps this file \
         equal to the output. Served on `/metrics` (Prometheus text format 0.0.4).\n\n\
         Label values are bounded: node names (`nvidiactl`, `nvidia<N>`, `nvidia-uvm`, \
         `nvidia-uvm-tools`, and `invalid_fd` for a call on a negative fd), ioctl names from the driver headers (`unknown` for others), \
         `NV_STATUS` names from `nvstatuscodes.h`, Linux errno names, `CUresult` names from \
         `cuda.h`. There are no pid labels.\n\n\
         | metric | type | labels | meaning |\n|---|---|---|---|\n",
    );
    for (name, ty, help) in FAMILIES {
        let labels = FAMILY_LABELS
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| *l)
            .unwrap_or("");
        let labels = if labels.is_empty() {
            "-".to_string()
        } else {
            labels
                .split(", ")
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        s.push_str(&format!("| `{name}` | {ty} | {labels} | {help} |\n"));
    }
    s.push_str(
        "\nHistogram buckets: `uvmwatch_cuinit_duration_seconds` uses fixed bounds from 1 ms to \
         600 s; `uvmwatch_driver_ioctl_duration_seconds`, \
         `uvmwatch_kernel_function_duration_seconds` and `uvmwatch_cuda_context_duration_seconds` \
         export the kernel's log2 buckets as bounds 2^(i+1) ns (about 1 µs to 137 s).\n",
    );
    s
}

pub(crate) fn help(name: &str) -> String {
    FAMILIES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, h)| h.to_string())
        .unwrap_or_default()
}

impl Metrics {
    /// Creates and registers the agent-side metrics.
    ///
    /// # Errors
    /// Only on a programming error (duplicate registration).
    pub fn new() -> prometheus::Result<Metrics> {
        Metrics::with_workload_labels(false)
    }

    /// Like [`Metrics::new`]; with `workload_labels` the `cuInit` call and stall counters
    /// also carry [`WORKLOAD_LABELS`] (`--workload-labels`, off by default: pod names make
    /// series churn with every rollout).
    pub fn with_workload_labels(workload_labels: bool) -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let extra: &[&str] = if workload_labels {
            &WORKLOAD_LABELS
        } else {
            &[]
        };
        let cuinit_labels: Vec<&str> = ["result", "seen"].iter().chain(extra).copied().collect();
        let stall_labels: Vec<&str> = ["call"].iter().chain(extra).copied().collect();
        let cuinit_calls = IntCounterVec::new(
            Opts::new(
                "uvmwatch_cuinit_calls_total",
                help("uvmwatch_cuinit_calls_total"),
            ),
            &cuinit_labels,
        )?;
        let cuinit_failures = IntCounterVec::new(
            Opts::new(
                "uvmwatch_cuinit_failures_total",
                help("uvmwatch_cuinit_failures_total"),
            ),
            &["result", "call", "node", "call_result", "rule"],
        )?;
        let cuinit_duration = Histogram::with_opts(
            HistogramOpts::new(
                "uvmwatch_cuinit_duration_seconds",
                help("uvmwatch_cuinit_duration_seconds"),
            )
            .buckets(CUINIT_BUCKETS.to_vec()),
        )?;
        let cuinit_in_flight = IntGauge::new(
            "uvmwatch_cuinit_in_flight",
            help("uvmwatch_cuinit_in_flight"),
        )?;
        let stalls = IntCounterVec::new(
            Opts::new("uvmwatch_stalls_total", help("uvmwatch_stalls_total")),
            &stall_labels,
        )?;
        let stalled = IntGaugeVec::new(
            Opts::new("uvmwatch_stalled_calls", help("uvmwatch_stalled_calls")),
            &["call"],
        )?;
        let probe_attached = IntGaugeVec::new(
            Opts::new("uvmwatch_probe_attached", help("uvmwatch_probe_attached")),
            &["probe", "backend"],
        )?;
        let probe_backend = IntGaugeVec::new(
            Opts::new(
                "uvmwatch_probe_backend_info",
                help("uvmwatch_probe_backend_info"),
            ),
            &["backend", "reason"],
        )?;
        let libcuda_targets =
            IntGauge::new("uvmwatch_libcuda_targets", help("uvmwatch_libcuda_targets"))?;
        let libcuda_attach = Histogram::with_opts(
            HistogramOpts::new(
                "uvmwatch_libcuda_attach_seconds",
                help("uvmwatch_libcuda_attach_seconds"),
            )
            .buckets(ATTACH_BUCKETS.to_vec()),
        )?;
        let feature_enabled = IntGaugeVec::new(
            Opts::new("uvmwatch_feature_enabled", help("uvmwatch_feature_enabled")),
            &["feature"],
        )?;
        let diagnosis = IntGaugeVec::new(
            Opts::new("uvmwatch_diagnosis", help("uvmwatch_diagnosis")),
            &["rule", "severity", "standing"],
        )?;
        let build = IntGaugeVec::new(
            Opts::new("uvmwatch_build_info", help("uvmwatch_build_info")),
            &["version", "kernel"],
        )?;
        build
            .with_label_values(&[env!("CARGO_PKG_VERSION"), &kernel_release()])
            .set(1);
        let ioctl_layout = IntGaugeVec::new(
            Opts::new(
                "uvmwatch_ioctl_layout_info",
                help("uvmwatch_ioctl_layout_info"),
            ),
            &["driver_version", "layout", "selection"],
        )?;
        // The call label always has its cuInit series, so dashboards never see "no data".
        if !workload_labels {
            cuinit_calls.with_label_values(&["CUDA_SUCCESS", "whole"]);
            stalls.with_label_values(&["cuInit"]);
        }
        stalled.with_label_values(&["cuInit"]);
        for c in [
            Box::new(cuinit_calls.clone()) as Box<dyn Collector>,
            Box::new(cuinit_failures.clone()),
            Box::new(cuinit_duration.clone()),
            Box::new(cuinit_in_flight.clone()),
            Box::new(stalls.clone()),
            Box::new(stalled.clone()),
            Box::new(probe_attached.clone()),
            Box::new(probe_backend.clone()),
            Box::new(libcuda_targets.clone()),
            Box::new(libcuda_attach.clone()),
            Box::new(feature_enabled.clone()),
            Box::new(diagnosis.clone()),
            Box::new(ioctl_layout.clone()),
            Box::new(build),
        ] {
            registry.register(c)?;
        }
        let user_drops = IntCounter::new("uvmwatch_user_drops", "internal")?;
        let received = IntCounter::new(
            "uvmwatch_events_received_total",
            help("uvmwatch_events_received_total"),
        )?;
        registry.register(Box::new(received.clone()))?;
        let identities_unread = IntCounter::new(
            "uvmwatch_process_identities_unread_total",
            help("uvmwatch_process_identities_unread_total"),
        )?;
        registry.register(Box::new(identities_unread.clone()))?;
        Ok(Metrics {
            registry,
            cuinit_calls,
            cuinit_failures,
            cuinit_duration,
            cuinit_in_flight,
            stalls,
            stalled,
            probe_attached,
            probe_backend,
            libcuda_targets,
            libcuda_attach,
            feature_enabled,
            diagnosis,
            ioctl_layout,
            user_drops,
            received,
            identities_unread,
            workload_labels,
        })
    }

    /// Counts one ended `cuInit` with `result`, `seen` as much of it as the probes saw
    /// ([`crate::event::Seen::name`]); `wl` are the workload label values (engine,
    /// namespace, pod), used only with workload labels on.
    pub fn count_cuinit(&self, result: &str, seen: &str, wl: [&str; 3]) {
        let mut v = vec![result, seen];
        if self.workload_labels {
            v.extend(wl);
        }
        self.cuinit_calls.with_label_values(&v).inc();
    }

    /// Counts one stall of `call`; see [`Metrics::count_cuinit`] for `wl`.
    pub fn count_stall(&self, call: &str, wl: [&str; 3]) {
        let mut v = vec![call];
        if self.workload_labels {
            v.extend(wl);
        }
        self.stalls.with_label_values(&v).inc();
    }

    /// Sets `uvmwatch_probe_attached` from the probe table.
    pub fn set_probes(&self, rows: &[(crate::kernel::registry::ProbeSpec, ProbeState)]) {
        for (spec, st) in rows {
            let backend = spec.backend.map(|b| b.name()).unwrap_or("both");
            self.probe_attached
                .with_label_values(&[spec.label, backend])
                .set(st.gauge());
        }
    }

    /// Also exports the kernel's aggregates (read from `kernel` at each scrape).
    ///
    /// # Errors
    /// Only on a programming error (registered twice).
    pub fn collect_kernel(&self, kernel: Weak<Mutex<Kernel>>) -> prometheus::Result<()> {
        self.registry
            .register(Box::new(kernel::KernelCollector::new(
                kernel,
                self.user_drops.clone(),
            )?))
    }

    /// The listener that keeps these metrics from the observer's events.
    pub fn listener(&self) -> MetricsListener {
        MetricsListener {
            m: self.clone(),
            stalled: BTreeMap::new(),
        }
    }

    /// Renders the registry in the text exposition format (0.0.4).
    pub fn render(&self) -> String {
        let enc = prometheus::TextEncoder::new();
        enc.encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
    }
}

/// Keeps [`Metrics`] from the observer's events.
pub struct MetricsListener {
    m: Metrics,
    /// Calls past their stall threshold now, by label.
    stalled: BTreeMap<String, i64>,
}

impl MetricsListener {
    /// `uvmwatch_stalled_calls`: every series reset first so a label that dropped to 0
    /// leaves (the `cuInit` series stays, at 0).
    fn set_stalled(&self) {
        let g = &self.m.stalled;
        g.reset();
        g.with_label_values(&["cuInit"]).set(0);
        for (label, n) in self.stalled.iter().filter(|(_, n)| **n > 0) {
            g.with_label_values(&[label.as_str()]).set(*n);
        }
    }
}

/// Raises `counter` to `total`, a running total kept elsewhere (a scan's figures); a counter
/// never goes down, so a lower total changes nothing.
fn raise_to(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

impl Listener for MetricsListener {
    fn event(&mut self, ev: &Arc<Event>) {
        let m = &self.m;
        let workload = || {
            ev.process
                .as_ref()
                .map(|p| p.workload.metric_labels().map(|(_, v)| v.to_string()))
                .unwrap_or_default()
        };
        match &ev.kind {
            Kind::CuinitStart { .. } => m.cuinit_in_flight.inc(),
            Kind::CuinitEnd(c) => {
                let [e, n, p] = workload();
                m.count_cuinit(&c.result, c.seen.name(), [&e, &n, &p]);
                if let Some(f) = c.call.last_failure.as_ref().filter(|_| c.code > 0) {
                    let rule = c
                        .findings
                        .first()
                        .map(|f| f.rule.as_str())
                        .unwrap_or("none");
                    m.cuinit_failures
                        .with_label_values(&[&c.result, &f.call, &f.node, &f.result, rule])
                        .inc();
                }
                // Only a call seen from entry to return has its duration.
                if c.seen == crate::event::Seen::Whole {
                    m.cuinit_duration
                        .observe(ev.ts_ns.saturating_sub(c.start_ns) as f64 / 1e9);
                }
                if c.start_reported() {
                    dec(&m.cuinit_in_flight);
                }
            }
            Kind::DiedInCall(d) if d.cuinit_seen => {
                let [e, n, p] = workload();
                m.count_cuinit("thread_exited", "whole", [&e, &n, &p]);
                dec(&m.cuinit_in_flight);
            }
            Kind::Stall(s) => {
                let [e, n, p] = workload();
                m.count_stall(&s.label, [&e, &n, &p]);
                *self.stalled.entry(s.label.clone()).or_default() += 1;
                self.set_stalled();
            }
            Kind::StallEnd(s) => {
                if let Some(n) = self.stalled.get_mut(&s.label) {
                    *n -= 1;
                }
                self.set_stalled();
            }
            Kind::DriverLayout(d) => {
                m.ioctl_layout.reset();
                m.ioctl_layout
                    .with_label_values(&[
                        d.driver.as_deref().unwrap_or("unknown"),
                        d.layout.as_str(),
                        d.selection,
                    ])
                    .set(1);
            }
            Kind::ProbesChanged {
                probes,
                libcuda_targets,
                features,
                backend,
            } => {
                m.set_probes(probes);
                m.probe_backend.reset();
                m.probe_backend
                    .with_label_values(&[backend.backend.name(), backend.cause])
                    .set(1);
                m.libcuda_targets.set(*libcuda_targets as i64);
                for f in features {
                    m.feature_enabled
                        .with_label_values(&[f.name])
                        .set(f.on as i64);
                }
            }
            Kind::LibcudaAttached { attach_seconds, .. } => {
                m.libcuda_attach.observe(*attach_seconds);
            }
            Kind::ActiveFindings(a) => {
                for (rule, sev, standing) in &a.cleared {
                    m.diagnosis
                        .with_label_values(&[rule.as_str(), sev.as_str(), standing.as_str()])
                        .set(0);
                }
                for (rule, sev, standing) in &a.active {
                    m.diagnosis
                        .with_label_values(&[rule.as_str(), sev.as_str(), standing.as_str()])
                        .set(1);
                }
            }
            Kind::Scan(s) => {
                m.cuinit_in_flight.set(s.cuinit_in_flight as i64);
                raise_to(&m.received, s.received_total);
                raise_to(&m.identities_unread, s.identities_unread_total);
                raise_to(&m.user_drops, s.undecodable_total);
            }
            _ => {}
        }
    }
}

/// Decrements a gauge that must not go below 0.
fn dec(g: &IntGauge) {
    if g.get() > 0 {
        g.dec();
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_buckets_are_cumulative_and_in_seconds() {
        use super::kernel::log2_to_buckets;
        use uvmwatch_common::HIST_BUCKETS;
        let mut b = [0u64; HIST_BUCKETS];
        b[0] = 1; // < 2 ns
        b[10] = 2; // [1024, 2048) ns
        b[20] = 3; // ~1 ms
        b[HIST_BUCKETS - 1] = 4; // open-ended
        let out = log2_to_buckets(&b);
        assert_eq!(out[0].0, 1024.0 / 1e9);
        assert_eq!(out[0].1, 1); // fast calls folded into the first bucket
        let at = |ub: f64| out.iter().find(|(u, _)| (*u - ub).abs() < 1e-15).unwrap().1;
        assert_eq!(at(2048.0 / 1e9), 3);
        assert_eq!(at((1u64 << 21) as f64 / 1e9), 6);
        assert_eq!(out.last().unwrap().1, 6); // open-ended bucket only in +Inf
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    }

    #[test]
    fn reference_page_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == reference_markdown(),
            "docs/metrics.md is stale: run `cargo run -p uvmwatch -- metrics-doc > docs/metrics.md`"
        );
        for (name, _, _) in FAMILIES {
            assert!(
                FAMILY_LABELS.iter().any(|(n, _)| n == name),
                "{name} has no label entry"
            );
        }
    }

    #[test]
    fn agent_metrics_render() {
        let m = Metrics::new().unwrap();
        m.cuinit_calls
            .with_label_values(&["CUDA_ERROR_NOT_INITIALIZED", "whole"])
            .inc();
        m.cuinit_duration.observe(1.5);
        let text = m.render();
        assert!(text.contains(
            "uvmwatch_cuinit_calls_total{result=\"CUDA_ERROR_NOT_INITIALIZED\",seen=\"whole\"} 1"
        ));
        assert!(text.contains("uvmwatch_cuinit_duration_seconds_bucket{le=\"600\"} 1"));
        assert!(text.contains("uvmwatch_build_info{"));
        for (name, _, _) in FAMILIES {
            assert!(name.starts_with("uvmwatch_"));
        }
    }
}

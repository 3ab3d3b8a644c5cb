//! The aggregates the kernel programs keep (driver ioctls by node, name and result with
//! their latency histograms, device opens, probed kernel functions, CUDA context and device
//! calls, losses, tracked processes), read
//! from the maps on every scrape so user space is never on the per-call path.

use std::sync::{Mutex, Weak};

use prometheus::{
    core::{Collector, Desc},
    proto::{self, LabelPair, MetricFamily, MetricType},
    IntCounter,
};
use uvmwatch_common::{context_call, counter, IoctlKey, LatencyHist, HIST_BUCKETS};

use super::help;
use crate::{decode::nvidia, kernel::Kernel};

/// First kernel log2 bucket exported as its own `le` (2^10 ns ≈ 1 µs); faster calls fall in
/// the first exported bucket.
const FIRST_EXPORTED_BUCKET: usize = 9;

/// Reads the kernel's aggregates on every scrape.
pub struct KernelCollector {
    /// Weak, so dropping the agent's handle at shutdown really detaches the programs.
    kernel: Weak<Mutex<Kernel>>,
    user_drops: IntCounter,
    descs: Vec<Desc>,
}

const KERNEL_FAMILIES: &[(&str, &[&str])] = &[
    (
        "uvmwatch_driver_ioctl_calls_total",
        &["node", "ioctl", "result"],
    ),
    ("uvmwatch_driver_ioctl_duration_seconds", &["node", "ioctl"]),
    ("uvmwatch_device_opens_total", &["node", "result"]),
    (
        "uvmwatch_kernel_function_calls_total",
        &["function", "result"],
    ),
    ("uvmwatch_kernel_function_duration_seconds", &["function"]),
    ("uvmwatch_cuda_context_calls_total", &["call", "result"]),
    ("uvmwatch_cuda_context_duration_seconds", &["call"]),
    ("uvmwatch_events_dropped_total", &[]),
    ("uvmwatch_kernel_map_full_total", &["map"]),
    ("uvmwatch_device_open_paths_unreadable_total", &[]),
    ("uvmwatch_tracked_processes", &[]),
];

impl KernelCollector {
    /// A collector over `kernel`'s maps; `user_drops` is added to the dropped-events count.
    pub fn new(kernel: Weak<Mutex<Kernel>>, user_drops: IntCounter) -> prometheus::Result<Self> {
        let descs = KERNEL_FAMILIES
            .iter()
            .map(|(n, l)| {
                Desc::new(
                    n.to_string(),
                    help(n),
                    l.iter().map(|s| s.to_string()).collect(),
                    Default::default(),
                )
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(KernelCollector {
            kernel,
            user_drops,
            descs,
        })
    }
}

fn labels(pairs: &[(&str, String)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name(k.to_string());
            l.set_value(v.clone());
            l
        })
        .collect()
}

fn family(name: &str, t: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut mf = MetricFamily::default();
    mf.set_name(name.to_string());
    mf.set_help(help(name));
    mf.set_field_type(t);
    mf.set_metric(metrics);
    mf
}

fn counter_metric(l: Vec<LabelPair>, v: f64) -> proto::Metric {
    let mut c = proto::Counter::default();
    c.set_value(v);
    let mut m = proto::Metric::from_label(l);
    m.set_counter(c);
    m
}

/// A histogram series from a kernel log2 histogram (see [`log2_to_buckets`]).
fn histogram_metric(l: Vec<LabelPair>, h: &LatencyHist) -> proto::Metric {
    let mut ph = proto::Histogram::default();
    ph.set_sample_count(h.count);
    ph.set_sample_sum(h.sum_ns as f64 / 1e9);
    ph.set_bucket(
        log2_to_buckets(&h.buckets)
            .into_iter()
            .map(|(ub, c)| {
                let mut bk = proto::Bucket::default();
                bk.set_upper_bound(ub);
                bk.set_cumulative_count(c);
                bk
            })
            .collect(),
    );
    let mut m = proto::Metric::from_label(l);
    m.set_histogram(ph);
    m
}

fn gauge_metric(v: f64) -> proto::Metric {
    let mut g = proto::Gauge::default();
    g.set_value(v);
    proto::Metric::from_gauge(g)
}

/// Converts a kernel log2 histogram into Prometheus cumulative buckets (upper bounds in
/// seconds: 2^(i+1) ns for kernel bucket i, from `FIRST_EXPORTED_BUCKET`).
pub fn log2_to_buckets(b: &[u64; HIST_BUCKETS]) -> Vec<(f64, u64)> {
    let mut out = Vec::new();
    let mut cum: u64 = b[..FIRST_EXPORTED_BUCKET].iter().sum();
    for (i, n) in b.iter().enumerate().skip(FIRST_EXPORTED_BUCKET) {
        cum += n;
        if i == HIST_BUCKETS - 1 {
            break; // the last kernel bucket is open-ended: only +Inf covers it
        }
        out.push(((1u64 << (i + 1)) as f64 / 1e9, cum));
    }
    out
}

impl Collector for KernelCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(kernel) = self.kernel.upgrade() else {
            return Vec::new();
        };
        let k = match kernel.lock() {
            Ok(k) => k,
            Err(p) => p.into_inner(),
        };
        let mut out = Vec::new();

        let results = k.ioctl_results().unwrap_or_default();
        let ms = results
            .iter()
            .map(|(key, n)| {
                let IoctlKey {
                    cmd,
                    node,
                    minor,
                    result_kind,
                    code,
                    ..
                } = *key;
                counter_metric(
                    labels(&[
                        ("node", nvidia::node_label(node, minor)),
                        ("ioctl", nvidia::ioctl_label(node, cmd).to_string()),
                        ("result", nvidia::ioctl_result_label(result_kind, code)),
                    ]),
                    *n as f64,
                )
            })
            .collect();
        out.push(family(
            "uvmwatch_driver_ioctl_calls_total",
            MetricType::COUNTER,
            merge_same_labels(ms),
        ));

        let hists = k.ioctl_hist().unwrap_or_default();
        let mut hm: Vec<proto::Metric> = Vec::new();
        // Unknown commands share the `unknown` label: merge them into one series.
        let mut merged: std::collections::BTreeMap<
            (String, String),
            ([u64; HIST_BUCKETS], u64, u64),
        > = Default::default();
        for (key, h) in &hists {
            let e = merged
                .entry((
                    nvidia::node_label(key.node, key.minor),
                    nvidia::ioctl_label(key.node, key.cmd).to_string(),
                ))
                .or_insert(([0; HIST_BUCKETS], 0, 0));
            for (i, n) in h.buckets.iter().enumerate() {
                e.0[i] += n;
            }
            e.1 += h.sum_ns;
            e.2 += h.count;
        }
        for ((node, ioctl), (b, sum_ns, count)) in merged {
            let h = LatencyHist {
                buckets: b,
                sum_ns,
                count,
            };
            hm.push(histogram_metric(
                labels(&[("node", node), ("ioctl", ioctl)]),
                &h,
            ));
        }
        out.push(family(
            "uvmwatch_driver_ioctl_duration_seconds",
            MetricType::HISTOGRAM,
            hm,
        ));

        let opens = k.opens().unwrap_or_default();
        let om = opens
            .iter()
            .map(|(key, n)| {
                let res = if key.errno == 0 {
                    "success".to_string()
                } else {
                    crate::decode::errno::label(key.errno)
                };
                counter_metric(
                    labels(&[
                        ("node", nvidia::node_label(key.node, key.minor)),
                        ("result", res),
                    ]),
                    *n as f64,
                )
            })
            .collect();
        out.push(family(
            "uvmwatch_device_opens_total",
            MetricType::COUNTER,
            merge_same_labels(om),
        ));

        // Kernel functions: only those probed here (or with counts from earlier).
        let khist = k.kernel_fn_hist().unwrap_or_default();
        let mut km = Vec::new();
        for (id, h) in khist.iter().enumerate() {
            if h.count == 0 && !k.kernel_fn_attached(id as u32) {
                continue;
            }
            km.push(histogram_metric(
                labels(&[(
                    "function",
                    crate::kernel::registry::kernel_fn_name(id as u32).to_string(),
                )]),
                h,
            ));
        }
        out.push(family(
            "uvmwatch_kernel_function_duration_seconds",
            MetricType::HISTOGRAM,
            km,
        ));
        let kres = k.kernel_fn_results().unwrap_or_default();
        let krm = kres
            .iter()
            .map(|(key, n)| {
                counter_metric(
                    labels(&[
                        (
                            "function",
                            crate::kernel::registry::kernel_fn_name(key.func).to_string(),
                        ),
                        ("result", nvidia::ioctl_result_label(key.kind, key.code)),
                    ]),
                    *n as f64,
                )
            })
            .collect();
        out.push(family(
            "uvmwatch_kernel_function_calls_total",
            MetricType::COUNTER,
            merge_same_labels(krm),
        ));

        // CUDA context and device calls: those probed here (or with counts from earlier).
        let chist = k.context_call_hist().unwrap_or_default();
        let mut cm = Vec::new();
        for (id, h) in chist.iter().enumerate() {
            if h.count == 0 && !k.context_call_attached(id as u32) {
                continue;
            }
            cm.push(histogram_metric(
                labels(&[("call", context_call::name(id as u32).to_string())]),
                h,
            ));
        }
        out.push(family(
            "uvmwatch_cuda_context_duration_seconds",
            MetricType::HISTOGRAM,
            cm,
        ));
        let cres = k.context_call_results().unwrap_or_default();
        // Every call has its CUDA_SUCCESS series from the start, so dashboards and alerts
        // never see "no data" before the first context is made.
        let seeded = (0..context_call::COUNT).map(|call| {
            (
                uvmwatch_common::ContextCallResultKey { call, code: 0 },
                0u64,
            )
        });
        let crm = cres
            .iter()
            .copied()
            .chain(seeded)
            .map(|(key, n)| {
                counter_metric(
                    labels(&[
                        ("call", context_call::name(key.call).to_string()),
                        ("result", nvidia::cu_result_name(key.code as i32 as i64)),
                    ]),
                    n as f64,
                )
            })
            .collect();
        out.push(family(
            "uvmwatch_cuda_context_calls_total",
            MetricType::COUNTER,
            merge_same_labels(crm),
        ));

        let c = k.counters().unwrap_or_default();
        out.push(family(
            "uvmwatch_events_dropped_total",
            MetricType::COUNTER,
            vec![counter_metric(
                vec![],
                (c[counter::RINGBUF_DROPS as usize] + self.user_drops.get()) as f64,
            )],
        ));
        out.push(family(
            "uvmwatch_events_throttled_total",
            MetricType::COUNTER,
            vec![counter_metric(
                vec![],
                c[counter::THROTTLED as usize] as f64,
            )],
        ));
        out.push(family(
            "uvmwatch_kernel_map_full_total",
            MetricType::COUNTER,
            counter::MAP_FULL
                .iter()
                .map(|(i, map)| {
                    counter_metric(labels(&[("map", (*map).into())]), c[*i as usize] as f64)
                })
                .collect(),
        ));
        out.push(family(
            "uvmwatch_device_open_paths_unreadable_total",
            MetricType::COUNTER,
            vec![counter_metric(
                vec![],
                c[counter::PATH_UNREADABLE as usize] as f64,
            )],
        ));
        out.push(family(
            "uvmwatch_opens_unfollowed_total",
            MetricType::COUNTER,
            vec![counter_metric(
                vec![],
                c[counter::OPEN_UNFOLLOWED as usize] as f64,
            )],
        ));
        out.push(family(
            "uvmwatch_tracked_processes",
            MetricType::GAUGE,
            vec![gauge_metric(k.tracked_processes() as f64)],
        ));
        out
    }
}

/// Sums counters whose label sets are equal (several kernel keys can map to one label set,
/// e.g. unknown commands) so the exposition has no duplicate series.
fn merge_same_labels(ms: Vec<proto::Metric>) -> Vec<proto::Metric> {
    let mut map: std::collections::BTreeMap<Vec<(String, String)>, f64> = Default::default();
    for m in ms {
        let key: Vec<(String, String)> = m
            .get_label()
            .iter()
            .map(|l| (l.name().to_string(), l.value().to_string()))
            .collect();
        *map.entry(key).or_default() += m.get_counter().get_value();
    }
    map.into_iter()
        .map(|(k, v)| {
            let l = k
                .into_iter()
                .map(|(n, v)| {
                    let mut p = LabelPair::default();
                    p.set_name(n);
                    p.set_value(v);
                    p
                })
                .collect();
            counter_metric(l, v)
        })
        .collect()
}

//! Signals of `nvidia-smi -q` (what it lists of each GPU, and how it ended) and of the host's
//! NVIDIA daemons.

use super::super::collect::smi::SMI_AMBIGUOUS_NO_GPU;
use super::super::facts::{Evidence, SmiInfo, SmiOutcome, SmiVerdict};
use super::super::root;
use super::{Input, Reading, Source};

/// NVML's words for a user-space library that does not match the kernel module
/// (`nvmlInit` returning `NVML_ERROR_LIB_RM_VERSION_MISMATCH`).
const NVML_MISMATCH: &str = "Driver/library version mismatch";

fn smi(e: &Evidence) -> Option<&SmiInfo> {
    e.smi.get()
}

fn outcome(e: &Evidence) -> Option<&SmiOutcome> {
    e.smi_outcome.get()
}

/// `message (status)` of an outcome.
fn said(o: &SmiOutcome) -> String {
    let mut s = o
        .message
        .clone()
        .unwrap_or_else(|| o.verdict.as_str().to_string());
    if let Some(st) = &o.status {
        s.push_str(&format!(" ({st})"));
    }
    s
}

/// A reading of the outcome: holds when `pred`, fails otherwise; unknown when `nvidia-smi`
/// could not run.
fn of_outcome(i: &Input, pred: impl Fn(&SmiOutcome) -> bool) -> Reading {
    let e = i.e;
    match outcome(e) {
        Some(o) => Reading::either(
            pred(o),
            said(o),
            said(o),
            Source::host(&e.smi_outcome.source),
        ),
        None => Reading::of_unread(&e.smi_outcome),
    }
}

fn message_has(o: &SmiOutcome, p: &str) -> bool {
    o.message.as_deref().is_some_and(|m| m.contains(p))
}

pub(super) fn lists_gpus(i: &Input) -> Reading {
    of_outcome(i, |o| o.verdict == SmiVerdict::GpusListed)
}

pub(super) fn no_devices(i: &Input) -> Reading {
    of_outcome(i, |o| {
        o.verdict == SmiVerdict::NoGpu && !message_has(o, SMI_AMBIGUOUS_NO_GPU)
    })
}

pub(super) fn no_driver(i: &Input) -> Reading {
    of_outcome(i, |o| o.verdict == SmiVerdict::NoDriver)
}

pub(super) fn version_mismatch(i: &Input) -> Reading {
    let e = i.e;
    // A run that failed keeps its output in the outcome; a capture may keep only the
    // reason in the fact.
    if let Some(u) = e
        .smi
        .value
        .as_ref()
        .err()
        .filter(|u| u.why.contains(NVML_MISMATCH))
    {
        return Reading::holds(u.why.clone(), Source::host(&e.smi.source));
    }
    of_outcome(i, |o| message_has(o, NVML_MISMATCH))
}

pub(super) fn unknown_error(i: &Input) -> Reading {
    of_outcome(i, |o| message_has(o, SMI_AMBIGUOUS_NO_GPU))
}

pub(super) fn timed_out(i: &Input) -> Reading {
    let e = i.e;
    let src = Source::host(&e.smi.source);
    match &e.smi.value {
        Err(u) if self::timed_out_why(&u.why) => Reading::holds(u.why.clone(), src),
        Err(u) if u.why.starts_with("not present") => Reading::unknown(u.why.clone(), src),
        _ => Reading::fails("nvidia-smi answered", src),
    }
}

fn timed_out_why(why: &str) -> bool {
    root::timed_out(why)
}

pub(super) fn version_differs(i: &Input) -> Reading {
    let e = i.e;
    match (
        smi(e).and_then(|s| s.driver_version.as_deref()),
        e.driver.get(),
    ) {
        (Some(s), Some(d)) => Reading::either(
            s != d.version,
            format!("NVML {s}, kernel module {}", d.version),
            format!("NVML and the kernel module both {s}"),
            Source::host(&e.smi.source),
        ),
        (None, _) => Reading::of_unread(&e.smi),
        (_, None) => Reading::of_unread(&e.driver),
    }
}

/// Holds when some GPU's `field` value satisfies `pred`; `what` names it.
fn per_gpu(
    i: &Input,
    field: fn(&SmiInfo) -> &Vec<String>,
    pred: fn(&str) -> bool,
    what: &str,
) -> Reading {
    let e = i.e;
    let src = Source::host(&e.smi.source);
    match smi(e) {
        Some(s) => {
            let v = field(s);
            let n = v.iter().filter(|x| pred(x)).count();
            Reading::either(
                n > 0,
                format!("{what} on {n} of {} GPU(s) ({})", v.len(), v.join(", ")),
                format!("{what} on no GPU ({})", v.join(", ")),
                src,
            )
        }
        None => Reading::of_unread(&e.smi),
    }
}

pub(super) fn persistence_off(i: &Input) -> Reading {
    per_gpu(
        i,
        |s| &s.persistence_mode,
        |m| m == "Disabled",
        "persistence mode Disabled",
    )
}

/// Whether a host daemon runs: unknown from inside a container (it does not see the host's
/// processes).
fn daemon_not_running(i: &Input, name: &str) -> Reading {
    let e = i.e;
    if e.container.get().is_some_and(|c| c.kind != "host") {
        return Reading::unknown(
            format!("{name} runs on the host; this is a container"),
            Source::host(&e.daemons.source),
        );
    }
    match e.daemons.get() {
        Some(d) => Reading::either(
            !d.iter().any(|x| x == name),
            format!("{name} not running"),
            format!("{name} running"),
            Source::host(&e.daemons.source),
        ),
        None => Reading::of_unread(&e.daemons),
    }
}

pub(super) fn persistenced_not_running(i: &Input) -> Reading {
    daemon_not_running(i, "nvidia-persistenced")
}

pub(super) fn prohibited(i: &Input) -> Reading {
    per_gpu(
        i,
        |s| &s.compute_mode,
        |m| m == "Prohibited",
        "compute mode Prohibited",
    )
}

pub(super) fn exclusive(i: &Input) -> Reading {
    per_gpu(
        i,
        |s| &s.compute_mode,
        |m| m.starts_with("Exclusive"),
        "compute mode Exclusive",
    )
}

pub(super) fn other_processes(i: &Input) -> Reading {
    let e = i.e;
    match e.libcuda.get() {
        Some(l) => {
            let others: Vec<String> = l
                .iter()
                .filter(|m| Some(m.pid) != i.o.pid)
                .map(|m| format!("{} (pid {})", m.comm, m.pid))
                .collect();
            Reading::either(
                !others.is_empty(),
                others.join(", "),
                "no other process has libcuda mapped",
                Source::host(&e.libcuda.source),
            )
        }
        None => Reading::of_unread(&e.libcuda),
    }
}

pub(super) fn mig_on(i: &Input) -> Reading {
    per_gpu(i, |s| &s.mig_mode, |m| m == "Enabled", "MIG mode Enabled")
}

pub(super) fn mig_without_devices(i: &Input) -> Reading {
    let e = i.e;
    let src = Source::host(&e.smi.source);
    match smi(e) {
        Some(s) => {
            let bare: Vec<usize> = s
                .mig_mode
                .iter()
                .enumerate()
                .filter(|(n, m)| {
                    *m == "Enabled" && s.mig_devices.get(*n).copied().unwrap_or(0) == 0
                })
                .map(|(n, _)| n)
                .collect();
            Reading::either(
                !bare.is_empty(),
                format!("MIG on with no MIG device on GPU(s) {bare:?}"),
                "every GPU with MIG on has a MIG device (or none has MIG on)",
                src,
            )
        }
        None => Reading::of_unread(&e.smi),
    }
}

/// The fabric states that name a fabric (not `N/A`, empty or `Not Supported`).
fn fabric_states(s: &SmiInfo) -> Vec<&str> {
    s.fabric_state
        .iter()
        .map(String::as_str)
        .filter(|x| {
            !x.is_empty()
                && !x.eq_ignore_ascii_case("N/A")
                && !x.eq_ignore_ascii_case("Not Supported")
        })
        .collect()
}

/// Whether a product name is an SXM data-center part of the generations HGX boards carry
/// with NVSwitch (A100-SXM, H100 SXM, H200, H800, B200, B300, GB200): four or eight of them
/// in one machine sit on an NVSwitch baseboard (NVIDIA HGX platform). PCIe and NVL cards
/// (`PCIe`, `NVL`) do not.
fn hgx_part(product: &str) -> bool {
    let p = product.to_ascii_uppercase();
    if p.contains("PCIE") || p.contains("NVL") {
        return false;
    }
    [
        "A100-SXM",
        "H100 80GB HBM3",
        "H100 SXM",
        "H200",
        "H800",
        "H20",
        "B200",
        "B300",
        "GB200",
        "GB300",
    ]
    .iter()
    .any(|x| p.contains(x))
}

pub(super) fn nvswitch(i: &Input) -> Reading {
    let e = i.e;
    if let Some(n) = e.nvswitch_nodes.get().filter(|n| !n.is_empty()) {
        return Reading::holds(n.join(", "), Source::host(&e.nvswitch_nodes.source));
    }
    match smi(e) {
        Some(s) => {
            let states = fabric_states(s);
            let hgx = s.product_name.iter().filter(|p| hgx_part(p)).count();
            if !states.is_empty() {
                Reading::holds(
                    format!("fabric state {}", states.join(", ")),
                    Source::host(&e.smi.source),
                )
            } else if hgx >= 8 {
                // Fourth- and fifth-generation NVSwitch systems have no nodes, and a driver
                // before 535 prints no fabric state: the board tells. Eight SXM GPUs are an
                // NVSwitch baseboard (HGX/DGX 8-GPU); four-GPU boards (HGX A100 4-GPU, HGX
                // H100 4-GPU, DGX Station A100) link their GPUs directly, without NVSwitch
                // or Fabric Manager (Fabric Manager User Guide, supported platforms).
                Reading::holds(
                    format!(
                        "{hgx} HGX parts ({}): an NVSwitch baseboard",
                        s.product_name[0]
                    ),
                    Source::host(&e.smi.source),
                )
            } else {
                Reading::fails(
                    "no NVSwitch node, no fabric state, no HGX board",
                    Source::host(&e.smi.source),
                )
            }
        }
        None => Reading::of_unread(&e.smi),
    }
}

pub(super) fn fabric_complete(i: &Input) -> Reading {
    let e = i.e;
    match smi(e) {
        Some(s) => {
            let states = fabric_states(s);
            if states.is_empty() {
                Reading::unknown("no fabric state printed", Source::host(&e.smi.source))
            } else {
                Reading::either(
                    states.iter().all(|x| *x == "Completed"),
                    format!("fabric state {}", states.join(", ")),
                    format!("fabric state {}", states.join(", ")),
                    Source::host(&e.smi.source),
                )
            }
        }
        None => Reading::of_unread(&e.smi),
    }
}

pub(super) fn fabric_incomplete(i: &Input) -> Reading {
    let e = i.e;
    match smi(e) {
        Some(s) => {
            let states = fabric_states(s);
            Reading::either(
                states.iter().any(|x| *x != "Completed"),
                format!("fabric state {}", states.join(", ")),
                if states.is_empty() {
                    "no fabric state".to_string()
                } else {
                    format!("fabric state {}", states.join(", "))
                },
                Source::host(&e.smi.source),
            )
        }
        None => Reading::of_unread(&e.smi),
    }
}

pub(super) fn fm_not_running(i: &Input) -> Reading {
    daemon_not_running(i, "nv-fabricmanager")
}

pub(super) fn geforce(i: &Input) -> Reading {
    per_gpu(
        i,
        |s| &s.product_brand,
        |b| b.contains("GeForce"),
        "brand GeForce",
    )
}

//! Signals of the nvidia module, the GPUs it registered and the PCI bus: read from
//! `/proc/driver/nvidia/{version,params,gpus}`, `/proc/modules` and `/sys/bus/pci/devices`.

use super::super::facts::{Evidence, PciGpu, SmiVerdict};
use super::{Input, Reading, Source};

/// `nvidia` is among the loaded modules.
fn in_modules(e: &Evidence) -> Option<bool> {
    e.modules.get().map(|m| m.iter().any(|n| n == "nvidia"))
}

pub(super) fn loaded(i: &Input) -> Reading {
    let e = i.e;
    if let Some(d) = e.driver.get() {
        let flavor = if d.open_module { "open" } else { "proprietary" };
        return Reading::holds(
            format!("{} ({flavor} kernel module)", d.version),
            Source::host(&e.driver.source),
        );
    }
    match in_modules(e) {
        Some(true) => Reading::holds("nvidia listed", Source::host(&e.modules.source)),
        Some(false) => Reading::fails(
            format!(
                "no nvidia module ({}; /proc/modules lists none)",
                e.driver
                    .value
                    .as_ref()
                    .err()
                    .map(|u| u.why.as_str())
                    .unwrap_or("")
            ),
            Source::host(&e.modules.source),
        ),
        None => Reading::of_unread(&e.driver),
    }
}

pub(super) fn absent(i: &Input) -> Reading {
    loaded(i).negated()
}

pub(super) fn open_module(i: &Input) -> Reading {
    match i.e.driver.get() {
        Some(d) => Reading::either(
            d.open_module,
            format!("{} open kernel module", d.version),
            format!("{} proprietary kernel module", d.version),
            Source::host(&i.e.driver.source),
        ),
        None => Reading::of_unread(&i.e.driver),
    }
}

pub(super) fn uvm_loaded(i: &Input) -> Reading {
    let e = i.e;
    match e.modules.get() {
        Some(m) => Reading::either(
            m.iter().any(|n| n == "nvidia_uvm"),
            "nvidia_uvm listed",
            "nvidia_uvm not listed",
            Source::host(&e.modules.source),
        ),
        None => Reading::of_unread(&e.modules),
    }
}

pub(super) fn cuda_module_absent(i: &Input) -> Reading {
    let driver = absent(i);
    if driver.state == super::State::Holds {
        return driver;
    }
    let uvm = uvm_not_loaded(i);
    match (driver.state, uvm.state) {
        (_, super::State::Holds) => uvm,
        (super::State::Fails, super::State::Fails) => Reading::fails(
            "nvidia and nvidia_uvm loaded",
            Source::host(&i.e.modules.source),
        ),
        _ => Reading::unknown(
            "which nvidia modules are loaded is not known",
            Source::host(&i.e.modules.source),
        ),
    }
}

pub(super) fn uvm_not_loaded(i: &Input) -> Reading {
    match in_modules(i.e) {
        Some(false) => Reading::fails(
            "the nvidia module itself is not loaded",
            Source::host(&i.e.modules.source),
        ),
        _ => uvm_loaded(i).negated(),
    }
}

pub(super) fn registered_no_gpu(i: &Input) -> Reading {
    let f = &i.e.gpus;
    match f.get() {
        Some(g) => Reading::either(
            g.is_empty(),
            "empty: the driver registered no GPU",
            format!("{} GPU(s): {}", g.len(), g.join(", ")),
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

pub(super) fn excluded(i: &Input) -> Reading {
    let f = &i.e.driver_params;
    let Some(params) = f.get() else {
        return Reading::of_unread(f);
    };
    let named: Vec<String> = ["ExcludedGpus", "GpuBlacklist"]
        .iter()
        .filter_map(|k| {
            let v = params.get(*k)?;
            (!v.trim_matches('"').trim().is_empty()).then(|| format!("{k}: {v}"))
        })
        .collect();
    Reading::either(
        !named.is_empty(),
        named.join("; "),
        "no GPU excluded",
        Source::host(&f.source),
    )
}

fn pci<'a>(i: &'a Input) -> Option<&'a Vec<PciGpu>> {
    i.e.pci_gpus.get()
}

pub(super) fn on_pci(i: &Input) -> Reading {
    let f = &i.e.pci_gpus;
    match pci(i) {
        Some(g) => Reading::either(
            !g.is_empty(),
            g.iter()
                .map(|g| g.address.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            "no NVIDIA GPU on the bus (vendor 10de, display class)",
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

pub(super) fn none_on_pci(i: &Input) -> Reading {
    on_pci(i).negated()
}

pub(super) fn without_driver(i: &Input) -> Reading {
    let f = &i.e.pci_gpus;
    match pci(i) {
        Some(g) => {
            let bare: Vec<&str> = g
                .iter()
                .filter(|g| g.driver.is_none())
                .map(|g| g.address.as_str())
                .collect();
            Reading::either(
                !bare.is_empty(),
                format!("{}: no kernel driver bound", bare.join(", ")),
                "every NVIDIA GPU has a driver bound (or there is none)",
                Source::host(&f.source),
            )
        }
        None => Reading::of_unread(f),
    }
}

/// The NVIDIA GPUs on the bus bound to `nvidia`, by address.
fn bound_to_nvidia(g: &[PciGpu]) -> Vec<&str> {
    g.iter()
        .filter(|g| g.driver.as_deref() == Some("nvidia"))
        .map(|g| g.address.as_str())
        .collect()
}

/// The first PCI device ID of the GPUs after Ada: in the compatible-GPU table of
/// open-gpu-kernel-modules' README (595.45.04) every ID from 0x2900 is Blackwell or later
/// (B200 0x2901, GB200 0x2941, RTX 5090 0x2b85, RTX PRO 6000 0x2bb1-0x2bb5, GB10 0x2e12,
/// B300 0x3182) and every ID below is Ada or earlier. NVIDIA drives them with the open
/// kernel modules only (the proprietary module prints "requires use of the NVIDIA open
/// kernel modules" and fails RmInitAdapter).
pub const FIRST_OPEN_ONLY_DEVICE: u16 = 0x2900;

pub(super) fn needs_open(i: &Input) -> Reading {
    let logged = super::kernel_log::needs_open(i);
    if logged.state == super::State::Holds {
        return logged;
    }
    let e = i.e;
    let (Some(d), Some(g)) = (e.driver.get(), pci(i)) else {
        return logged;
    };
    let open_only: Vec<String> = g
        .iter()
        .filter_map(|g| {
            g.device
                .filter(|id| *id >= FIRST_OPEN_ONLY_DEVICE)
                .map(|id| format!("{} (10de:{id:04x})", g.address))
        })
        .collect();
    if d.open_module || open_only.is_empty() {
        return logged;
    }
    Reading::holds(
        format!(
            "{} is Blackwell or later, and the {} module loaded is the proprietary one",
            open_only.join(", "),
            d.version
        ),
        Source::host(&e.pci_gpus.source),
    )
}

pub(super) fn holds_every_gpu(i: &Input) -> Reading {
    let f = &i.e.pci_gpus;
    let Some(g) = pci(i) else {
        return Reading::of_unread(f);
    };
    let bound = bound_to_nvidia(g);
    let others: Vec<String> = g
        .iter()
        .filter(|g| g.driver.as_deref() != Some("nvidia"))
        .map(|g| {
            format!(
                "{} bound to {}",
                g.address,
                g.driver.as_deref().unwrap_or("no driver")
            )
        })
        .collect();
    if !others.is_empty() {
        return Reading::fails(others.join(", "), Source::host(&f.source));
    }
    // An excluded GPU stays bound to nvidia, unused (`NVreg_ExcludedGpus`).
    let excluded = excluded(i);
    if !bound.is_empty() && excluded.state == super::State::Holds {
        return Reading::unknown(
            format!(
                "{} bound to nvidia, but {}",
                bound.join(", "),
                excluded.value
            ),
            Source::host(&f.source),
        );
    }
    Reading::either(
        !bound.is_empty(),
        format!("{} bound to nvidia", bound.join(", ")),
        "no NVIDIA GPU bound to nvidia",
        Source::host(&f.source),
    )
}

pub(super) fn bound_not_listed(i: &Input) -> Reading {
    let e = i.e;
    let Some(g) = pci(i) else {
        return Reading::of_unread(&e.pci_gpus);
    };
    let bound = bound_to_nvidia(g).len();
    // What the driver can use: nvidia-smi's list when it answered, else the GPUs the driver
    // registered.
    let listed = match e.smi_outcome.get().map(|o| o.verdict) {
        Some(SmiVerdict::GpusListed) => e
            .smi
            .get()
            .map(|s| (s.gpus as usize, "nvidia-smi lists", &e.smi.source)),
        Some(SmiVerdict::NoGpu) => Some((0, "nvidia-smi lists", &e.smi_outcome.source)),
        _ => None,
    }
    .or_else(|| {
        e.gpus
            .get()
            .map(|r| (r.len(), "the driver registered", &e.gpus.source))
    });
    let Some((n, who, src)) = listed else {
        return Reading::unknown(
            "neither nvidia-smi's list nor the driver's GPUs were read",
            Source::host(&e.smi_outcome.source),
        );
    };
    Reading::either(
        bound > n,
        format!("{bound} GPU(s) bound to nvidia, {who} {n}"),
        format!("{bound} GPU(s) bound to nvidia, {who} {n}"),
        Source::host(src),
    )
}

pub(super) fn held_elsewhere(i: &Input) -> Reading {
    // The driver's own line names the holder even when the bus was not read.
    if let Some(line) = i.log.as_ref().and_then(|l| l.bound_elsewhere.first()) {
        return Reading::holds(line.clone(), Source::host(&i.e.kernel_log.source));
    }
    let f = &i.e.pci_gpus;
    match pci(i) {
        Some(g) => {
            let other: Vec<String> = g
                .iter()
                .filter_map(|g| {
                    g.driver
                        .as_deref()
                        .filter(|d| *d != "nvidia")
                        .map(|d| format!("{} bound to {d}", g.address))
                })
                .collect();
            Reading::either(
                !other.is_empty(),
                other.join(", "),
                "no NVIDIA GPU bound to another driver",
                Source::host(&f.source),
            )
        }
        None => Reading::of_unread(f),
    }
}

/// Why no NVIDIA driver is present at all, when that is so: no
/// `/proc/driver/nvidia/version`, no `nvidia` module in `/proc/modules` and no `/dev/nvidia*`
/// node (a report then says "no NVIDIA driver present", not "healthy"). `None` when any trace
/// of the driver exists, on WSL2 (the driver is the Windows host's), or when it cannot be
/// told.
pub fn no_driver(e: &Evidence) -> Option<String> {
    if super::platform::is_wsl(e) {
        return None;
    }
    let why = match &e.driver.value {
        Ok(_) => return None,
        Err(u) => u.why.clone(),
    };
    if in_modules(e) == Some(true) || e.dev_nodes.get().is_some_and(|n| !n.is_empty()) {
        return None;
    }
    Some(format!("{}: {}", e.driver.source, why))
}

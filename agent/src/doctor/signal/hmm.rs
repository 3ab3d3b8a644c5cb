//! Signals of nvidia_uvm's HMM device-memory set-up and what it needs: the module
//! parameters (`/sys/module/nvidia_uvm/parameters`), the kernel's configuration and command
//! line, `/proc/iomem`, the addressing mode `nvidia-smi -q` prints, and what the probes saw of
//! the set-up.

use super::super::facts::Evidence;
use super::{Input, Reading, Source, State};

/// First mainline release with commit ea72ce5da228 (the x86/kaslr fix).
const KASLR_FIX_KERNEL: (u32, u32) = (6, 11);

/// First release whose nvidia_uvm turns HMM on by default on x86_64 (before it,
/// `uvm_disable_hmm` defaulted to true: HMM was an opt-in alpha, `uvm_hmm.c` of the 525
/// branch).
const HMM_DEFAULT_DRIVER: u32 = 535;

/// The kernel function whose failure is the known HMM set-up failure (called by
/// `devmem_alloc_pagemap`, `uvm_pmm_gpu.c`).
const FREE_MEM_REGION: &str = "request_free_mem_region";

/// A module parameter of nvidia_uvm.
fn uvm_param<'a>(e: &'a Evidence, name: &str) -> Option<&'a str> {
    e.uvm_params.get()?.get(name).map(|s| s.trim())
}

/// A boolean parameter as sysfs prints it (`Y`/`N`, `1`/`0`).
fn param_bool(v: &str) -> Option<bool> {
    match v {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// A kernel config option: `Some(true)` when `=y`, `Some(false)` when not set, `None` when
/// the config is unknown.
fn config_y(e: &Evidence, key: &str) -> Option<bool> {
    Some(e.kernel_config.get()?.get(key).is_some_and(|v| v == "y"))
}

/// The machine's architecture: the sysctl, else the driver's version line.
pub(super) fn arch(e: &Evidence) -> Option<(String, String)> {
    if let Some(a) = e.arch.get() {
        return Some((a.clone(), e.arch.source.clone()));
    }
    let d = e.driver.get()?;
    Some((d.arch.clone()?, e.driver.source.clone()))
}

pub(super) fn allowed(i: &Input) -> Reading {
    let e = i.e;
    if let Some(v) = uvm_param(e, "uvm_disable_hmm") {
        let src = Source::host(&e.uvm_params.source);
        return match param_bool(v) {
            Some(false) => Reading::holds(format!("uvm_disable_hmm={v} (HMM allowed)"), src),
            Some(true) => Reading::fails(format!("uvm_disable_hmm={v} (HMM disabled)"), src),
            None => Reading::unknown(format!("uvm_disable_hmm={v}: not a boolean"), src),
        };
    }
    // The parameter could not be read: its default, where that is known.
    if let Some((a, src)) = arch(e).filter(|(a, _)| a != "x86_64") {
        return Reading::fails(
            format!("{a}: nvidia_uvm leaves HMM off by default off x86_64 (uvm_hmm.c)"),
            Source::host(src),
        );
    }
    if let Some(d) = e.driver.get() {
        let major = d
            .version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        if major.is_some_and(|m| m < HMM_DEFAULT_DRIVER) {
            return Reading::fails(
                format!("driver {}: HMM is off by default before 535", d.version),
                Source::host(&e.driver.source),
            );
        }
    }
    Reading::of_unread(&e.uvm_params)
}

pub(super) fn kernel_hmm(i: &Input) -> Reading {
    let e = i.e;
    let src = Source::host(&e.kernel_config.source);
    match (
        config_y(e, "CONFIG_HMM_MIRROR"),
        config_y(e, "CONFIG_DEVICE_PRIVATE"),
    ) {
        (Some(true), Some(true)) => {
            Reading::holds("CONFIG_HMM_MIRROR=y CONFIG_DEVICE_PRIVATE=y", src)
        }
        (Some(m), Some(p)) => {
            let missing: Vec<&str> = [(m, "CONFIG_HMM_MIRROR"), (p, "CONFIG_DEVICE_PRIVATE")]
                .iter()
                .filter(|(set, _)| !set)
                .map(|(_, k)| *k)
                .collect();
            // What ran beats what the config file says: a config read from another kernel's
            // file (a container's /boot, a stand-in module) can say HMM is compiled out while
            // nvidia_uvm's HMM set-up is seen running.
            match seen_running(i) {
                Some(seen) => Reading::holds(
                    format!(
                        "{} not set in the config read, but {seen}",
                        missing.join(", ")
                    ),
                    src,
                ),
                None => Reading::fails(format!("{} not set", missing.join(", ")), src),
            }
        }
        _ => Reading::of_unread(&e.kernel_config),
    }
}

/// What shows nvidia_uvm's HMM set-up ran on this kernel, whatever its config says: an
/// HMM set-up error it logged, `request_free_mem_region` failing inside its ioctl, or an
/// `nvidia-uvm-hmm` region it made.
fn seen_running(i: &Input) -> Option<String> {
    for (seen, how) in [
        (error_logged(i), "nvidia_uvm logged its HMM set-up"),
        (failure_probed(i), "the probes saw its HMM set-up"),
    ] {
        if seen.state == State::Holds {
            return Some(format!("{how}: {}", seen.value));
        }
    }
    let regions = i.e.iomem_hmm.get().map_or(0, |l| l.len());
    (regions > 0).then(|| format!("/proc/iomem holds {regions} nvidia-uvm-hmm region(s)"))
}

/// The addressing modes `nvidia-smi -q` printed (drivers before 550 print none).
fn addressing(e: &Evidence) -> Option<Vec<&str>> {
    let modes: Vec<&str> = e
        .smi
        .get()?
        .addressing_mode
        .iter()
        .map(String::as_str)
        .filter(|m| !m.is_empty())
        .collect();
    (!modes.is_empty()).then_some(modes)
}

pub(super) fn ats(i: &Input) -> Reading {
    let e = i.e;
    let src = Source::host(&e.smi.source);
    match addressing(e) {
        Some(m) => Reading::either(
            m.iter().all(|x| *x == "ATS"),
            format!("addressing mode {}", m.join(", ")),
            format!("addressing mode {}", m.join(", ")),
            src,
        ),
        None if e.smi.get().is_some() => {
            Reading::unknown("nvidia-smi prints no addressing mode (before 550)", src)
        }
        None => Reading::of_unread(&e.smi),
    }
}

pub(super) fn memory_set_up(i: &Input) -> Reading {
    let f = &i.e.iomem_hmm;
    let Some(l) = f.get() else {
        return Reading::of_unread(f);
    };
    // One region per GPU whose UVM_REGISTER_GPU set it up (`uvm_pmm_devmem_init`): fewer
    // regions than GPUs is a set-up that failed (or never ran) on some.
    let gpus =
        i.e.gpus
            .get()
            .map(|g| g.len())
            .filter(|n| *n > 0)
            .or_else(|| i.e.smi.get().map(|s| s.gpus as usize).filter(|n| *n > 0))
            .unwrap_or(1);
    Reading::either(
        l.len() >= gpus,
        format!("{} nvidia-uvm-hmm region(s) for {gpus} GPU(s)", l.len()),
        if l.is_empty() {
            "no nvidia-uvm-hmm region".to_string()
        } else {
            format!(
                "{} nvidia-uvm-hmm region(s) for {gpus} GPU(s): set up on some only",
                l.len()
            )
        },
        Source::host(&f.source),
    )
}

pub(super) fn memory_missing(i: &Input) -> Reading {
    memory_set_up(i).negated()
}

pub(super) fn kaslr_on(i: &Input) -> Reading {
    let e = i.e;
    let Some(cmdline) = e.cmdline.get() else {
        return Reading::of_unread(&e.cmdline);
    };
    if cmdline.split_whitespace().any(|w| w == "nokaslr") {
        return Reading::fails(
            "nokaslr on the command line",
            Source::host(&e.cmdline.source),
        );
    }
    if let Some(cfg) = e.kernel_config.get() {
        let key = if cfg.contains_key("CONFIG_RANDOMIZE_MEMORY") {
            "CONFIG_RANDOMIZE_MEMORY"
        } else {
            "CONFIG_RANDOMIZE_BASE"
        };
        if cfg.get(key).is_none_or(|v| v != "y") {
            return Reading::fails(
                format!("{key} not set"),
                Source::host(&e.kernel_config.source),
            );
        }
    }
    Reading::holds(
        "no nokaslr on the command line",
        Source::host(&e.cmdline.source),
    )
}

pub(super) fn lacks_fix(i: &Input) -> Reading {
    let f = &i.e.kernel;
    match f.get() {
        Some(k) => Reading::either(
            k.version < KASLR_FIX_KERNEL,
            format!(
                "{} (older than 6.11; a distribution may carry a backport)",
                k.release
            ),
            format!("{} (6.11 or later: has the fix)", k.release),
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

pub(super) fn error_logged(i: &Input) -> Reading {
    let src = Source::host(&i.e.kernel_log.source);
    match &i.log {
        Some(c) => match c.hmm_errors.first() {
            Some(l) => Reading::holds(l.clone(), src),
            None => Reading::fails("no HMM set-up error line", src),
        },
        None => Reading::of_unread(&i.e.kernel_log),
    }
}

pub(super) fn failure_probed(i: &Input) -> Reading {
    let o = i.o;
    let src = Source::probe("probe:kprobe");
    match o
        .kernel_signals
        .iter()
        .find(|s| s.contains(FREE_MEM_REGION))
    {
        Some(s) => Reading::holds(s.clone(), src),
        None if o
            .unavailable_probes
            .iter()
            .any(|p| p.contains(FREE_MEM_REGION) || p.contains("kprobe")) =>
        {
            Reading::unknown("the kprobe on request_free_mem_region is not attached", src)
        }
        None if o.kernel_signals.is_empty() => {
            Reading::unknown("no kernel-side signal recorded", src)
        }
        None => Reading::fails("request_free_mem_region did not fail", src),
    }
}

pub(super) fn silent_with_prints(i: &Input) -> Reading {
    let e = i.e;
    let prints = uvm_param(e, "uvm_debug_prints").and_then(param_bool);
    match (prints, &i.log) {
        (Some(true), Some(c)) => Reading::either(
            c.hmm_errors.is_empty(),
            "uvm_debug_prints=1 and no HMM set-up error in the kernel log",
            "uvm_debug_prints=1 and an HMM set-up error logged",
            Source::host(&e.kernel_log.source),
        ),
        (Some(false), _) => Reading::fails(
            "uvm_debug_prints=0: nvidia_uvm prints no set-up error",
            Source::host(&e.uvm_params.source),
        ),
        (_, None) => Reading::of_unread(&e.kernel_log),
        (None, _) => Reading::of_unread(&e.uvm_params),
    }
}

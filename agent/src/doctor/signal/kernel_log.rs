//! Signals of the kernel log: the lines the collector kept (`collect::kernel_log`),
//! classified once ([`classify`]) into what each says. Every pattern here is a line of
//! Linux's or NVIDIA's source (or of `modprobe`, which users paste beside them), cited where
//! it is matched. Several generations of the driver say the same thing in different words
//! (a GPU lost: Xid 79, `GPU has fallen off the bus`); each is a pattern of the one signal.

use super::super::facts::KernelLog;
use super::{Input, Reading, Source};

/// The kernel log's lines, by what they say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Classified {
    /// A module refused for its signature or by lockdown.
    pub refused_signature: Vec<String>,
    /// The nvidia module built for another kernel.
    pub refused_other_kernel: Vec<String>,
    /// No nvidia module for the running kernel.
    pub not_built: Vec<String>,
    /// A security module refused the load.
    pub refused_security: Vec<String>,
    /// modprobe could not insert an nvidia module for another reason.
    pub load_failed: Vec<String>,
    /// The open module refused a GPU without GSP.
    pub open_unsupported: Vec<String>,
    /// The driver refused to load for want of a GPU.
    pub found_no_gpu: Vec<String>,
    /// `NVRM: GPU ... is already bound to <driver>.`
    pub bound_elsewhere: Vec<String>,
    /// `RmInitAdapter failed`.
    pub adapter_failed: Vec<String>,
    /// A GPU fell off the bus.
    pub fell_off_bus: Vec<String>,
    /// GSP firmware failed.
    pub gsp: Vec<String>,
    /// WPR2 already up.
    pub wpr2: Vec<String>,
    /// A PCI BAR invalid or unassignable.
    pub bar: Vec<String>,
    /// The probe could not enable the GPU or claim its interrupt or registers.
    pub probe_failed: Vec<String>,
    /// The GPU needs the open kernel modules.
    pub needs_open: Vec<String>,
    /// The GPU is supported by a legacy branch only.
    pub legacy: Vec<String>,
    /// Lockups, RCU stalls, hung tasks in nvidia code.
    pub lockups: Vec<String>,
    /// Oops, BUG, general protection faults in nvidia code.
    pub oops: Vec<String>,
    /// WARNINGs in nvidia code.
    pub warns: Vec<String>,
    /// `NVRM: API mismatch`.
    pub api_mismatch: Option<String>,
    /// nvidia_uvm's HMM set-up errors.
    pub hmm_errors: Vec<String>,
    /// A resume after nvidia_uvm was loaded.
    pub resumed: bool,
    /// Every Xid, in order.
    pub xids: Vec<u32>,
}

/// modprobe's words for `ENODEV` (`modprobe: ERROR: could not insert 'nvidia': No such
/// device`): `nvidia_init_module` found no GPU to drive (`nv.c`).
const INSERT_NO_DEVICE: &str = "could not insert 'nvidia': No such device";

/// modprobe's refusal of any other reason.
const INSERT_FAILED: &str = "could not insert 'nvidia";

/// Xids after which the GPU needs a reset or is gone (`nverror.h`, 595.45.04):
/// `ROBUST_CHANNEL_GPU_ECC_DBE` 48, `PMU_HALT_ERROR` 62, `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`
/// 79, `ROBUST_CHANNEL_UNCONTAINED_ERROR` 95, `GSP_RPC_TIMEOUT` 119, `GSP_ERROR` 120,
/// `UNRECOVERABLE_ECC_ERROR_ESCAPE` 140, `GPU_INIT_ERROR` 143, `GPU_RECOVERY_ACTION_CHANGED`
/// 154 (NVIDIA's Xid catalog: a GPU reset or a reboot is the immediate action).
pub const XID_FATAL: &[u32] = &[48, 62, 79, 95, 119, 120, 140, 143, 154];

/// Signature enforcement and lockdown (`kernel/module/signing.c`, `module_sig_check`:
/// "Loading of unsigned module is rejected", "Loading of module with unavailable key is
/// rejected"; `security/lockdown/lockdown.c`: "Lockdown: modprobe: unsigned module loading is
/// restricted"), and what `modprobe` prints for the same refusal (`EKEYREJECTED`: "Key was
/// rejected by service", `ENOKEY`: "Required key not available").
const SIGNATURE: &[&str] = &[
    "Loading of unsigned module is rejected",
    "Loading of module with unavailable key is rejected",
    "unsigned module loading is restricted",
    "Key was rejected by service",
    "Required key not available",
];

/// A module built for another kernel (`kernel/module/main.c`, `version.c`: "nvidia: Unknown
/// symbol", "disagrees about version of symbol", "version magic '...' should be '...'",
/// ".gnu.linkonce.this_module section size must match"), and `modprobe`'s `ENOEXEC`
/// ("Invalid module format", "Exec format error").
const OTHER_KERNEL: &[&str] = &[
    ": Unknown symbol ",
    ": disagrees about version of symbol ",
    ": version magic '",
    "section size must match the kernel's built struct module size",
    "Invalid module format",
    "Exec format error",
];

/// `modprobe: FATAL: Module nvidia not found in directory /lib/modules/<release>`
/// (kmod's `modprobe.c`): nothing built for this kernel.
const NOT_BUILT: &str = "not found in directory /lib/modules/";

/// Security modules refusing a module load: LoadPin (`security/loadpin/loadpin.c`, "LoadPin:
/// kernel-module pinning-ignored obj=..." / "... denied obj="), SELinux and AppArmor audit
/// records of `module_load` / `module_request` denied.
const SECURITY: &[&str] = &[
    "LoadPin:",
    "denied  { module_load }",
    "operation=\"module_load\"",
];

/// The open module's refusal of a GPU without GSP (`kernel-open/nvidia/nv-pci.c`,
/// 580.65.06: "NVRM: ... installed in this system is not supported by open nvidia.ko because
/// it does not include the required GPU System Processor (GSP).").
const OPEN_UNSUPPORTED: &str = "is not supported by open";

/// A GPU lost: the driver's own words (`nv.c` / RM: "GPU has fallen off the bus.", "The
/// GPU has fallen off the bus"; NVML and newer drivers: "GPU is lost").
const FELL_OFF: &[&str] = &["fallen off the bus", "GPU is lost"];

/// Xid of a GPU fallen off the bus (`ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`,
/// `src/common/sdk/nvidia/inc/nverror.h`).
const XID_OFF_THE_BUS: u32 = 79;

/// Xids of GSP firmware failing: 119 `GSP_RPC_TIMEOUT`, 120 `GSP_ERROR` (`nverror.h`).
const XID_GSP: &[u32] = &[119, 120];

/// GSP lines (`kernel_gsp.c`, `_kgspLogXid119`: "Timeout after %llus of waiting for RPC
/// response from GPU%d GSP!"; `osinit.c`: "Cannot initialize GSP firmware RM").
const GSP: &[&str] = &[
    "waiting for RPC response from GPU",
    "Cannot initialize GSP firmware RM",
];

/// `kernel_gsp.c`, `_kgspBootGspRm`: "unexpected WPR2 already up, cannot proceed with booting
/// GSP".
const WPR2: &str = "WPR2 already up";

/// `nv-pci.c`: `nv_pci_validate_bars` ("This PCI I/O region assigned to your NVIDIA device
/// is invalid:"), `nv_resize_pcie_bars` ("No address space to allocate resized BAR1.",
/// "FATAL: Failed to re-allocate BAR1.").
const BAR: &[&str] = &[
    "PCI I/O region assigned to your NVIDIA device is invalid",
    "No address space to allocate resized BAR1",
    "Failed to re-allocate BAR1",
    "Fatal Error while attempting to resize PCIe BARs",
];

/// `nv-pci.c`, `nv_pci_probe` (595.45.04): "pci_enable_device failed, aborting", "Can't
/// find an IRQ for your NVIDIA card!", "request_mem_region failed for ..."; `nv.c`: "No
/// interrupts of any type are available. Cannot use this GPU.".
const PROBE: &[&str] = &[
    "pci_enable_device failed",
    "Can't find an IRQ for your NVIDIA card",
    "request_mem_region failed for",
    "No interrupts of any type are available",
];

/// The proprietary module on a GPU only the open modules support (printed by the
/// proprietary module; public reports of 580.105.08 on PCI ID 10de:2c58).
const NEEDS_OPEN: &str = "requires use of the NVIDIA open kernel modules";

/// `nv.c`: "NVRM: The NVIDIA %s GPU installed in this system is supported through the NVIDIA
/// %s Legacy drivers." (the line may be cut after "is").
const LEGACY: &[&str] = &["Legacy drivers", "GPU installed in this system is"];

/// `initStatus` of `RmInitAdapter failed! (initStatus:rmStatus:line)` (`osinit.c`):
/// `RM_INIT_GPU_GPUMGR_ATTACH_GPU_FAILED` 0x22 with `NV_ERR_NOT_SUPPORTED` 0x56 (the
/// proprietary module's attach of a GPU it does not support), `RM_INIT_FIRMWARE_INIT_FAILED`
/// 0x62.
const INIT_ATTACH_FAILED: u32 = 0x22;
const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
const INIT_FIRMWARE_FAILED: u32 = 0x62;

/// nvidia_uvm's HMM set-up errors, printed with `uvm_debug_prints=1` (`uvm_pmm_gpu.c`,
/// 590.48.01: "request_free_mem_region() err %ld", "memremap_pages() err %ld", "failed to
/// intialize device private memory: %s, GPU %s" (NVIDIA's spelling)).
const HMM_ERRORS: &[&str] = &[
    "request_free_mem_region() err",
    "memremap_pages() err",
    "failed to intialize device private memory",
    "failed to initialize device private memory",
];

/// nv.c's lines after probes that ran and failed.
const PROBED_BUT_FAILED: &[&str] = &[
    "None of the NVIDIA devices were initialized",
    "probe routine failed for",
    // modprobe's ENODEV for the same load (nvidia_init_module).
    INSERT_NO_DEVICE,
];

/// `(initStatus, rmStatus)` of `RmInitAdapter failed! (0x22:0x56:884)`.
fn init_code(line: &str) -> Option<(u32, u32)> {
    let rest = &line[line.find("RmInitAdapter failed! (")? + "RmInitAdapter failed! (".len()..];
    let mut parts = rest.split(':');
    let hex = |p: Option<&str>| u32::from_str_radix(p?.trim().strip_prefix("0x")?, 16).ok();
    Some((hex(parts.next())?, hex(parts.next())?))
}

/// What a kernel report is, from its first line. A lockup line also says `BUG:` (`watchdog:
/// BUG: soft lockup`), so stalls are recognized first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Report {
    Lockup,
    Oops,
    Warn,
}

fn report_kind(line: &str) -> Report {
    let l = line.to_ascii_lowercase();
    if ["lockup", "rcu", "blocked for more than", "hung task"]
        .iter()
        .any(|k| l.contains(k))
    {
        Report::Lockup
    } else if ["oops", "bug:", "kernel bug", "general protection"]
        .iter()
        .any(|k| l.contains(k))
    {
        Report::Oops
    } else {
        Report::Warn
    }
}

/// Classifies the kept lines of a kernel log.
pub fn classify(log: &KernelLog) -> Classified {
    let mut c = Classified {
        api_mismatch: log.api_mismatch.clone(),
        resumed: log.resumed_after_uvm_load,
        xids: log.xids.clone(),
        ..Classified::default()
    };
    let has = |l: &str, ps: &[&str]| ps.iter().any(|p| l.contains(p));
    for l in &log.module_refused {
        if has(l, SIGNATURE) {
            c.refused_signature.push(l.clone());
        } else if l.contains(NOT_BUILT) {
            c.not_built.push(l.clone());
        } else if has(l, SECURITY) {
            c.refused_security.push(l.clone());
        } else if l.contains(OPEN_UNSUPPORTED) {
            c.open_unsupported.push(l.clone());
        } else if has(l, OTHER_KERNEL) {
            c.refused_other_kernel.push(l.clone());
        } else if l.contains(INSERT_NO_DEVICE) {
            c.found_no_gpu.push(l.clone());
        } else if l.contains(INSERT_FAILED) {
            c.load_failed.push(l.clone());
        }
    }
    for l in &log.no_gpu {
        if l.contains("is already bound to") {
            c.bound_elsewhere.push(l.clone());
        } else {
            c.found_no_gpu.push(l.clone());
        }
    }
    for l in &log.adapter_init_failed {
        c.adapter_failed.push(l.clone());
        match init_code(l) {
            Some((INIT_FIRMWARE_FAILED, _)) => c.gsp.push(l.clone()),
            Some((INIT_ATTACH_FAILED, NV_ERR_NOT_SUPPORTED)) => c.needs_open.push(l.clone()),
            _ => {}
        }
    }
    for l in log.adapter_causes.iter().chain(&log.nvidia_lines) {
        let bucket = if has(l, GSP) {
            &mut c.gsp
        } else if l.contains(WPR2) {
            &mut c.wpr2
        } else if has(l, BAR) {
            &mut c.bar
        } else if has(l, PROBE) {
            &mut c.probe_failed
        } else if l.contains(NEEDS_OPEN) {
            &mut c.needs_open
        } else if has(l, LEGACY) && !l.contains("requires use of") {
            &mut c.legacy
        } else if has(l, FELL_OFF) {
            &mut c.fell_off_bus
        } else if has(l, HMM_ERRORS) {
            &mut c.hmm_errors
        } else {
            continue;
        };
        if !bucket.contains(l) {
            bucket.push(l.clone());
        }
    }
    for l in &log.hmm_errors {
        if !c.hmm_errors.contains(l) {
            c.hmm_errors.push(l.clone());
        }
    }
    for l in &log.nvidia_lines {
        if log.xids.contains(&XID_OFF_THE_BUS)
            && l.contains("Xid")
            && l.contains(": 79")
            && !c.fell_off_bus.contains(l)
        {
            c.fell_off_bus.push(l.clone());
        }
        if l.contains("Xid")
            && XID_GSP.iter().any(|x| l.contains(&format!(": {x},")))
            && !c.gsp.contains(l)
        {
            c.gsp.push(l.clone());
        }
    }
    // "The NVIDIA probe routine failed for N device(s)" / "None of the NVIDIA devices were
    // initialized" (nv.c) follow the line that says why each probe failed: a GPU there that
    // did not come up, not a bus without one. With that reason logged, they are its echo.
    if !(c.bar.is_empty()
        && c.probe_failed.is_empty()
        && c.needs_open.is_empty()
        && c.wpr2.is_empty())
    {
        c.found_no_gpu
            .retain(|l| !PROBED_BUT_FAILED.iter().any(|p| l.contains(p)));
    }
    for l in &log.driver_hangs {
        match report_kind(l) {
            Report::Lockup => c.lockups.push(l.clone()),
            Report::Oops => c.oops.push(l.clone()),
            Report::Warn => c.warns.push(l.clone()),
        }
    }
    c
}

/// The log as read, for the readers: classified, or why unknown.
fn with<'a>(
    i: &'a Input,
    lines: impl FnOnce(&'a Classified) -> &'a [String],
    none: &str,
) -> Reading {
    let src = Source::host(&i.e.kernel_log.source);
    match &i.log {
        Some(c) => {
            let l = lines(c);
            match l.first() {
                Some(first) if l.len() > 1 => {
                    Reading::holds(format!("{first} (and {} more)", l.len() - 1), src)
                }
                Some(first) => Reading::holds(first.clone(), src),
                None => Reading::fails(none, src),
            }
        }
        None => Reading::of_unread(&i.e.kernel_log),
    }
}

pub(super) fn lockdown_on(i: &Input) -> Reading {
    let f = &i.e.lockdown;
    match f.get() {
        Some(l) => Reading::either(
            l != "none",
            format!("lockdown {l}"),
            format!("lockdown {l}"),
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

pub(super) fn secure_boot_on(i: &Input) -> Reading {
    let f = &i.e.secure_boot;
    match f.get() {
        Some(on) => Reading::either(
            *on,
            "Secure Boot on",
            "Secure Boot off",
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

pub(super) fn refused_signature(i: &Input) -> Reading {
    with(
        i,
        |c| &c.refused_signature,
        "no signature or lockdown refusal",
    )
}

pub(super) fn other_kernel(i: &Input) -> Reading {
    with(
        i,
        |c| &c.refused_other_kernel,
        "no unknown-symbol or version-magic refusal",
    )
}

pub(super) fn not_built(i: &Input) -> Reading {
    with(i, |c| &c.not_built, "no 'module not found' line")
}

pub(super) fn load_failed(i: &Input) -> Reading {
    with(i, |c| &c.load_failed, "no other 'could not insert' refusal")
}

pub(super) fn probe_failed(i: &Input) -> Reading {
    with(
        i,
        |c| &c.probe_failed,
        "no PCI enable, IRQ or register-claim failure",
    )
}

pub(super) fn fatal_xid(i: &Input) -> Reading {
    let src = Source::host(&i.e.kernel_log.source);
    match &i.log {
        Some(c) => {
            let fatal: Vec<String> = c
                .xids
                .iter()
                .filter(|x| XID_FATAL.contains(x))
                .map(u32::to_string)
                .collect();
            Reading::either(
                !fatal.is_empty(),
                format!("Xid {}", fatal.join(", ")),
                "no Xid that needs a GPU reset",
                src,
            )
        }
        None => Reading::of_unread(&i.e.kernel_log),
    }
}

pub(super) fn refused_by_security(i: &Input) -> Reading {
    with(i, |c| &c.refused_security, "no security-module refusal")
}

pub(super) fn open_unsupported(i: &Input) -> Reading {
    with(
        i,
        |c| &c.open_unsupported,
        "no GSP refusal of the open module",
    )
}

pub(super) fn found_no_gpu(i: &Input) -> Reading {
    with(
        i,
        |c| &c.found_no_gpu,
        "no 'no GPU' refusal since the last load",
    )
}

pub(super) fn adapter_failed(i: &Input) -> Reading {
    with(i, |c| &c.adapter_failed, "no RmInitAdapter failure")
}

pub(super) fn fell_off_bus(i: &Input) -> Reading {
    with(i, |c| &c.fell_off_bus, "no Xid 79 or 'fallen off the bus'")
}

pub(super) fn gsp_failed(i: &Input) -> Reading {
    with(i, |c| &c.gsp, "no GSP failure")
}

pub(super) fn wpr2_up(i: &Input) -> Reading {
    with(i, |c| &c.wpr2, "no 'WPR2 already up'")
}

pub(super) fn bar_invalid(i: &Input) -> Reading {
    with(i, |c| &c.bar, "no BAR error")
}

pub(super) fn needs_open(i: &Input) -> Reading {
    with(
        i,
        |c| &c.needs_open,
        "no 'requires the open kernel modules'",
    )
}

pub(super) fn legacy(i: &Input) -> Reading {
    with(i, |c| &c.legacy, "no 'Legacy drivers' line")
}

pub(super) fn lockup(i: &Input) -> Reading {
    with(i, |c| &c.lockups, "no lockup or hung task in nvidia code")
}

pub(super) fn oops(i: &Input) -> Reading {
    with(i, |c| &c.oops, "no oops in nvidia code")
}

pub(super) fn warn(i: &Input) -> Reading {
    with(i, |c| &c.warns, "no WARNING in nvidia code")
}

pub(super) fn api_mismatch(i: &Input) -> Reading {
    with(i, |c| c.api_mismatch.as_slice(), "no API mismatch line")
}

pub(super) fn resumed(i: &Input) -> Reading {
    let src = Source::host(&i.e.kernel_log.source);
    match &i.log {
        Some(c) => Reading::either(
            c.resumed,
            "a resume from suspend after nvidia-uvm was loaded",
            "no resume since nvidia-uvm was loaded",
            src,
        ),
        None => Reading::of_unread(&i.e.kernel_log),
    }
}

pub(super) fn xid(i: &Input) -> Reading {
    let src = Source::host(&i.e.kernel_log.source);
    match &i.log {
        Some(c) => Reading::either(
            !c.xids.is_empty(),
            format!(
                "Xid {}",
                c.xids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "no Xid",
            src,
        ),
        None => Reading::of_unread(&i.e.kernel_log),
    }
}

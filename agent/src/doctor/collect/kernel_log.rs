//! The kernel log (`/dev/kmsg` or `dmesg`): the NVIDIA lines, Xids, API mismatches, adapter
//! failures, HMM set-up errors, resumes, a driver load refused for want of a GPU, and
//! reports (lockups, hung tasks, oops) in NVIDIA code.

use super::super::facts::{Fact, KernelLog};
use super::super::input::clip;
use super::super::root::Root;

/// Most `nvidia_lines` kept from the kernel log (the last ones); also the most
/// `adapter_init_failed`, `hmm_errors` and `driver_hangs` lines.
pub const MAX_NVIDIA_LINES: usize = 200;

/// Longest kernel-log line kept whole (the kernel's records are at most 1 KiB of text);
/// a longer one is cut ([`clip`]).
pub const MAX_KEPT_LINE_BYTES: usize = 1024;

/// The kernel log through [`Root::kernel_log`], parsed ([`parse_kernel_log`]).
pub(super) fn collect_kernel_log(root: &Root) -> Fact<KernelLog> {
    match root.kernel_log() {
        Ok(log) => {
            let mut parsed = parse_kernel_log(&log.text);
            parsed.dropped_bytes = log.dropped_bytes;
            Fact::ok(parsed, log.source)
        }
        Err(err) => Fact::unavailable(err.to_string(), "/dev/kmsg, dmesg"),
    }
}

/// Why a GPU did not come up, as the driver's own kernel-log lines say it
/// ([`ADAPTER_CAUSES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterCause {
    /// The proprietary `nvidia.ko` on a GPU that only the open module supports.
    Flavor,
    /// The GPU's WPR2 region is still up from an earlier boot of GSP: it needs a reset.
    Wpr2,
    /// A PCI BAR the firmware did not assign (BIOS Above 4G decoding, BAR size).
    Bar,
    /// GSP firmware that timed out or could not be initialized.
    Gsp,
    /// The probe could not enable the GPU on the PCI bus or claim its interrupt or
    /// registers.
    Pci,
}

/// Substrings of the driver's kernel-log lines that name why a GPU did not come up, with
/// where each comes from (NVIDIA open-gpu-kernel-modules at tag 580.65.06 unless noted).
pub const ADAPTER_CAUSES: &[(&str, AdapterCause)] = &[
    // Printed by the proprietary module only (not in the open source); public reports
    // (driver 580.105.08, PCI ID 10de:2c58) show it on two lines, "NVRM: The NVIDIA GPU
    // 0000:02:00.0 (PCI ID: 10de:2c58)" / "NVRM: installed in this system requires use of
    // the NVIDIA open kernel modules.", then "RmInitAdapter failed! (0x22:0x56:884)".
    (
        "requires use of the NVIDIA open kernel modules",
        AdapterCause::Flavor,
    ),
    // src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c, _kgspBootGspRm: "unexpected WPR2 already
    // up, cannot proceed with booting GSP" and "(the GPU is likely in a bad state and may
    // need to be reset)".
    ("WPR2 already up", AdapterCause::Wpr2),
    // kernel-open/nvidia/nv-pci.c, nv_pci_validate_bars: "This PCI I/O region assigned to
    // your NVIDIA device is invalid:" then "BAR%d is %lluM @ 0x%llx (PCI:...)".
    (
        "PCI I/O region assigned to your NVIDIA device is invalid",
        AdapterCause::Bar,
    ),
    // kernel-open/nvidia/nv-pci.c, nv_resize_pcie_bars: "No address space to allocate
    // resized BAR1." and "FATAL: Failed to re-allocate BAR1.".
    (
        "No address space to allocate resized BAR1",
        AdapterCause::Bar,
    ),
    ("Failed to re-allocate BAR1", AdapterCause::Bar),
    // kernel_gsp.c, _kgspLogXid119 (Xid 119, GSP_RPC_TIMEOUT in nverror.h): "Timeout after
    // %llus of waiting for RPC response from GPU%d GSP! Expected function %d (%s) ...".
    ("waiting for RPC response from GPU", AdapterCause::Gsp),
    // src/nvidia/arch/nvalloc/unix/src/osinit.c, RmInitAdapter: "Cannot initialize GSP
    // firmware RM" (with RM_INIT_FIRMWARE_INIT_FAILED, initStatus 0x62).
    ("Cannot initialize GSP firmware RM", AdapterCause::Gsp),
    // kernel-open/nvidia/nv-pci.c (595.45.04), nv_pci_probe: "NVRM: pci_enable_device
    // failed, aborting", "NVRM: Can't find an IRQ for your NVIDIA card!", "NVRM:
    // request_mem_region failed for %lluM @ 0x%llx. This can", "NVRM: Fatal Error while
    // attempting to resize PCIe BARs."; nv.c, nv_start_device: "No interrupts of any type
    // are available. Cannot use this GPU.".
    ("pci_enable_device failed", AdapterCause::Pci),
    ("Can't find an IRQ for your NVIDIA card", AdapterCause::Pci),
    ("request_mem_region failed for", AdapterCause::Pci),
    ("No interrupts of any type are available", AdapterCause::Pci),
    (
        "Fatal Error while attempting to resize PCIe BARs",
        AdapterCause::Bar,
    ),
];

/// Most [`KernelLog::adapter_causes`] lines kept (the first ones: the earliest says why).
pub const MAX_ADAPTER_CAUSE_LINES: usize = 20;

/// The cause a kernel-log line names, when it is one of [`ADAPTER_CAUSES`].
pub fn adapter_cause(line: &str) -> Option<AdapterCause> {
    ADAPTER_CAUSES
        .iter()
        .find(|(pattern, _)| line.contains(pattern))
        .map(|(_, cause)| *cause)
}

/// Substrings of the lines `nvidia.ko` prints when it refuses to load because it has no GPU
/// to drive (NVIDIA open-gpu-kernel-modules, `kernel-open/nvidia/nv.c`,
/// `nvidia_init_module`, which then fails with `-ENODEV`, unless an NVSwitch is present):
/// no NVIDIA PCI device at all; devices another driver took (the probe routine not called,
/// then none probed); devices probed but none initialized (the lines before it say why).
/// The last one, `NVRM: GPU <pci> is already bound to vfio-pci.`, names the driver that
/// holds a GPU (as public kernel logs of passthrough set-ups show it, just before the probe
/// line).
pub const NO_GPU_LINES: &[&str] = &[
    "NVRM: No NVIDIA GPU found.",
    // nv.c, nv_drivers_init (595.45.04): the PCI driver registered no device.
    "NVRM: No NVIDIA PCI devices found.",
    "NVRM: The NVIDIA probe routine was not called for",
    "NVRM: No NVIDIA devices probed.",
    "NVRM: None of the NVIDIA devices were initialized.",
    "is already bound to",
];

/// Most [`KernelLog::no_gpu`] lines kept (the first after the last successful load).
pub const MAX_NO_GPU_LINES: usize = 20;

/// Distinct Xid numbers kept (nverror.h defines about 150): a log of a storm of one Xid, or
/// of made-up ones, stays a short list.
pub const MAX_XIDS: usize = 64;

/// Start of the line `nvidia.ko` prints once it has loaded (`nvidia_init_module`).
const DRIVER_LOADED: &str = "NVRM: loading ";

/// Whether a kernel message is one of [`NO_GPU_LINES`] (the `already bound` line only with
/// its `NVRM: GPU` start).
pub fn is_no_gpu_line(msg: &str) -> bool {
    NO_GPU_LINES.iter().any(|p| match *p {
        "is already bound to" => msg.starts_with("NVRM: GPU ") && msg.contains(p),
        p => msg.contains(p),
    })
}

/// Kernel lines of a module load refused by the kernel itself, before the driver ran:
/// - signature enforcement (`kernel/module/signing.c`, `module_sig_check`: `Loading of
///   unsigned module is rejected`, `... of module with unavailable key is rejected`; Secure
///   Boot with `module.sig_enforce`);
/// - lockdown (`security/lockdown/lockdown.c`: `Lockdown: modprobe: unsigned module loading
///   is restricted; see man kernel_lockdown.7`);
/// - a module built for another kernel (`kernel/module/main.c`, `kernel/module/version.c`:
///   `nvidia: Unknown symbol ... (err -2)`, `nvidia: disagrees about version of symbol ...`,
///   `nvidia: version magic '...' should be '...'`, `module nvidia: .gnu.linkonce.this_module
///   section size must match ...`);
/// - the open module on a GPU without GSP (pre-Turing), which fails its probe so that the
///   module does not load (`kernel-open/nvidia/nv-pci.c`, 580.65.06: `NVRM: installed in this
///   system is not supported by open` / `NVRM: nvidia.ko because it does not include the
///   required GPU` / `NVRM: System Processor (GSP).`).
///
/// The signature and lockdown lines name no module: the rule weighs them with the rest.
pub const MODULE_REFUSED_LINES: &[&str] = &[
    "Loading of unsigned module is rejected",
    "Loading of module with unavailable key is rejected",
    "unsigned module loading is restricted",
    ": Unknown symbol ",
    ": disagrees about version of symbol ",
    ": version magic '",
    "section size must match the kernel's built struct module size",
    "is not supported by open",
    // What kmod's modprobe prints for the same refusals, which users paste beside the
    // kernel's lines (and journald keeps): EKEYREJECTED, ENOKEY, ENOEXEC, and no module
    // for the running kernel.
    "Key was rejected by service",
    "Required key not available",
    "Invalid module format",
    "Exec format error",
    "not found in directory /lib/modules/",
    // Any other refusal as modprobe words it (`modprobe: ERROR: could not insert
    // 'nvidia_uvm': <strerror>`): the reason is the errno's text.
    "could not insert '",
    // Security modules refusing a load (security/loadpin/loadpin.c; SELinux and AppArmor
    // audit records).
    "LoadPin:",
    "denied  { module_load }",
    "operation=\"module_load\"",
];

/// Whether a kernel message is one of [`MODULE_REFUSED_LINES`]; those that name a module
/// only for an `nvidia*` module.
pub fn is_module_refused_line(msg: &str) -> bool {
    MODULE_REFUSED_LINES.iter().any(|p| {
        msg.contains(p)
            && match *p {
                ": Unknown symbol "
                | ": disagrees about version of symbol "
                | ": version magic '" => msg.starts_with("nvidia"),
                "section size must match the kernel's built struct module size" => {
                    msg.starts_with("module nvidia")
                }
                // modprobe's: `could not insert 'nvidia'`, `Module nvidia not found`.
                "Key was rejected by service"
                | "Required key not available"
                | "Invalid module format"
                | "Exec format error"
                | "not found in directory /lib/modules/" => msg.contains("nvidia"),
                "could not insert '" => msg.contains("could not insert 'nvidia"),
                _ => true,
            }
    })
}

/// Whether a kernel message may be one of [`ADAPTER_CAUSES`], [`NO_GPU_LINES`] or
/// [`MODULE_REFUSED_LINES`]: the driver prints each of its lines with `NVRM: ` (`nv_printf`),
/// the module refusals name a module (`module`, `nvidia`) or come from LoadPin.
fn may_be_classified(msg: &str) -> bool {
    ["NVRM", "nvidia", "module", "LoadPin"]
        .iter()
        .any(|k| msg.contains(k))
}

/// Most [`KernelLog::module_refused`] lines kept.
pub const MAX_MODULE_REFUSED_LINES: usize = 20;

/// Most lines of a kernel report (after its first line) searched for nvidia frames.
const MAX_REPORT_LINES: usize = 120;

/// Parses the kernel log (`dmesg` text; `[timestamp]` prefixes and `journalctl -k`
/// `... kernel: ` prefixes are allowed) into the [`KernelLog`] fields:
/// - `nvidia_lines`: messages starting with `NVRM:` or containing `nvidia-uvm:` or `nvidia:`
///   (the last [`MAX_NVIDIA_LINES`]);
/// - `xids`: the number after `Xid (<pci>):` (`nv_report_error`), in order;
/// - `api_mismatch`: the last `API mismatch` line;
/// - `adapter_init_failed`: `RmInitAdapter failed` / `rm_init_adapter failed` lines;
/// - `adapter_causes`: lines that say why a GPU did not come up ([`ADAPTER_CAUSES`], the
///   first [`MAX_ADAPTER_CAUSE_LINES`]);
/// - `driver_hangs`: the first line of each soft lockup, hard lockup, RCU stall, hung task,
///   oops, BUG, general protection fault or WARNING report whose lines name an nvidia
///   symbol (see [`names_nvidia_symbol`]);
/// - `hmm_errors`: `request_free_mem_region() err` lines (`uvm_debug_prints=1`);
/// - `resumed_after_uvm_load`: a `PM: suspend exit`, `PM: hibernation: hibernation exit` or
///   `ACPI: PM: Waking up` line after the last `nvidia-uvm: Loaded the UVM driver` line;
/// - `no_gpu`: the lines of a driver load refused for want of a GPU ([`NO_GPU_LINES`]) after
///   the last `NVRM: loading ...` line (a later successful load makes them history), the
///   first [`MAX_NO_GPU_LINES`];
/// - `module_refused`: the lines of a module load the kernel refused
///   ([`MODULE_REFUSED_LINES`]) after the last `NVRM: loading ...` line, the first
///   [`MAX_MODULE_REFUSED_LINES`].
///
/// Lines are kept as they were read (with their timestamps), a line longer than
/// [`MAX_KEPT_LINE_BYTES`] cut by [`clip`]; of `adapter_init_failed`, `hmm_errors` and
/// `driver_hangs` the last [`MAX_NVIDIA_LINES`] are kept.
pub fn parse_kernel_log(text: &str) -> KernelLog {
    let keep = |line: &str| {
        if line.len() <= MAX_KEPT_LINE_BYTES {
            line.to_string()
        } else {
            clip(line, MAX_KEPT_LINE_BYTES)
        }
    };
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let mut log = KernelLog::default();
    let mut last_load = None;
    let mut last_resume = None;
    for (i, line) in lines.iter().enumerate() {
        let msg = kernel_message(line);
        if msg.starts_with(DRIVER_LOADED) {
            log.no_gpu.clear();
            log.module_refused.clear();
        }
        // Most lines of a busy host's log are nobody's here: the classifiers below test tens
        // of patterns each, and only lines that may name the driver or a module reach them.
        let candidate = may_be_classified(msg);
        if candidate
            && log.module_refused.len() < MAX_MODULE_REFUSED_LINES
            && is_module_refused_line(msg)
        {
            log.module_refused.push(keep(line));
        }
        if candidate && log.no_gpu.len() < MAX_NO_GPU_LINES && is_no_gpu_line(msg) {
            log.no_gpu.push(keep(line));
        }
        if msg.starts_with("NVRM:") || msg.contains("nvidia-uvm:") || msg.contains("nvidia:") {
            log.nvidia_lines.push(keep(line));
        }
        if let Some(xid) = parse_xid(msg) {
            if log.xids.len() < MAX_XIDS && !log.xids.contains(&xid) {
                log.xids.push(xid);
            }
        }
        if msg.contains("API mismatch") {
            log.api_mismatch = Some(keep(line));
        }
        if msg.contains("RmInitAdapter failed") || msg.contains("rm_init_adapter failed") {
            log.adapter_init_failed.push(keep(line));
        }
        if candidate
            && log.adapter_causes.len() < MAX_ADAPTER_CAUSE_LINES
            && adapter_cause(msg).is_some()
        {
            log.adapter_causes.push(keep(line));
        }
        if msg.contains("request_free_mem_region() err") {
            log.hmm_errors.push(keep(line));
        }
        if msg.contains("nvidia-uvm: Loaded the UVM driver") {
            last_load = Some(i);
        }
        if msg.contains("PM: suspend exit")
            || msg.contains("PM: hibernation: hibernation exit")
            || msg.contains("ACPI: PM: Waking up")
        {
            last_resume = Some(i);
        }
    }
    for kept in [
        &mut log.nvidia_lines,
        &mut log.adapter_init_failed,
        &mut log.hmm_errors,
    ] {
        keep_last(kept, MAX_NVIDIA_LINES);
    }
    log.resumed_after_uvm_load = matches!((last_load, last_resume), (Some(l), Some(r)) if r > l);
    log.driver_hangs = hang_reports(&lines).iter().map(|l| keep(l)).collect();
    keep_last(&mut log.driver_hangs, MAX_NVIDIA_LINES);
    log
}

/// Drops all but the last `max` of `lines`.
fn keep_last(lines: &mut Vec<String>, max: usize) {
    if lines.len() > max {
        lines.drain(..lines.len() - max);
    }
}

/// The message of a kernel log line: without a leading `[...]` timestamp (`dmesg`,
/// `dmesg -T`) or a `journalctl` prefix up to `kernel: `.
fn kernel_message(line: &str) -> &str {
    let mut msg = line.trim_start();
    if msg.starts_with('[') {
        if let Some(end) = msg.find(']') {
            msg = &msg[end + 1..];
        }
    } else if let Some(pos) = msg.find(" kernel: ") {
        msg = &msg[pos + " kernel: ".len()..];
    }
    msg.trim_start()
}

/// Xid number of an `NVRM: Xid (PCI:0000:17:00): 79, pid=...` message.
fn parse_xid(msg: &str) -> Option<u32> {
    let rest = &msg[msg.find("Xid (")? + "Xid (".len()..];
    let rest = &rest[rest.find(')')? + 1..];
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Whether a message opens a kernel report: soft/hard lockup, RCU stall, hung task, oops,
/// BUG, general protection fault, WARNING.
fn is_report_start(msg: &str) -> bool {
    msg.contains("soft lockup")
        || msg.contains("hard LOCKUP")
        || (msg.contains("INFO: task ") && msg.contains("blocked for more than"))
        || msg.contains("self-detected stall")
        || msg.contains("detected stalls on CPUs/tasks")
        || msg.contains("detected expedited stalls")
        || msg.starts_with("BUG: ")
        || msg.starts_with("kernel BUG at")
        || msg.starts_with("Oops:")
        || msg.starts_with("general protection fault")
        || msg.starts_with("WARNING: CPU:")
        || msg.starts_with("WARNING: at ")
}

/// Whether a report line names an nvidia symbol: a `[nvidia...]` module tag, or a frame
/// `name+0x../0x..` whose name starts with `uvm_`, `nv_`, `os_` or `_nv0` (the prefixes
/// of nvidia.ko and nvidia-uvm.ko functions). The `Modules linked in:` line never counts.
pub fn names_nvidia_symbol(msg: &str) -> bool {
    if msg.contains("Modules linked in") {
        return false;
    }
    if msg.contains("[nvidia") {
        return true;
    }
    msg.split(|c: char| c.is_whitespace() || c == ':')
        .map(|t| t.trim_start_matches('?'))
        .any(|t| {
            (t.starts_with("uvm_")
                || t.starts_with("nv_")
                || t.starts_with("os_")
                || t.starts_with("_nv0"))
                && t.contains("+0x")
        })
}

/// First lines of the reports that name an nvidia symbol. A report runs from its first line
/// to `---[ end trace`, `</TASK>`, the next report or [`MAX_REPORT_LINES`] lines; a report
/// line met before any frame (`Oops:` after `BUG: unable to handle ...`) continues the same
/// report.
fn hang_reports(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let msg = kernel_message(lines[i]);
        if !is_report_start(msg) {
            i += 1;
            continue;
        }
        let start = i;
        let mut nvidia = names_nvidia_symbol(msg);
        let mut seen_frames = false;
        let mut j = i + 1;
        while j < lines.len() && j - start <= MAX_REPORT_LINES {
            let m = kernel_message(lines[j]);
            if is_report_start(m) {
                if seen_frames {
                    break;
                }
                nvidia |= names_nvidia_symbol(m);
                j += 1;
                continue;
            }
            if m.starts_with("Call Trace") || m.starts_with("RIP:") || m.contains("+0x") {
                seen_frames = true;
            }
            nvidia |= names_nvidia_symbol(m);
            j += 1;
            if m.starts_with("---[ end trace") || m.starts_with("</TASK>") {
                break;
            }
        }
        if nvidia {
            out.push(lines[start].to_string());
        }
        i = j.max(start + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn kernel_log_fields() {
        let driver = DriverSpec::open("590.48.01");
        let boot = boot_dmesg(&driver, 508);
        let log = parse_kernel_log(&boot);
        assert!(log.xids.is_empty());
        assert!(log.driver_hangs.is_empty());
        assert!(!log.resumed_after_uvm_load);
        assert_eq!(log.api_mismatch, None);
        assert!(log
            .nvidia_lines
            .iter()
            .any(|l| l.contains("nvidia-uvm: Loaded the UVM driver")));
        assert!(log.nvidia_lines.iter().any(|l| l.contains("NVRM: loading")));
        assert!(!log
            .nvidia_lines
            .iter()
            .any(|l| l.contains("enabling device")));

        let text = format!(
            "{boot}{DMESG_API_MISMATCH}{DMESG_ADAPTER_INIT_FAILED}{DMESG_XID_79}{DMESG_HMM_ERR_34}{DMESG_HUNG_TASK_OTHER}{DMESG_HUNG_TASK_UVM}{DMESG_SOFT_LOCKUP_UVM}{DMESG_RESUME}"
        );
        let log = parse_kernel_log(&text);
        assert_eq!(log.xids, [79]);
        assert!(log
            .api_mismatch
            .as_deref()
            .unwrap()
            .contains("NVRM: API mismatch: the client has the version 550.54.15"));
        assert_eq!(log.adapter_init_failed.len(), 2);
        assert_eq!(log.hmm_errors.len(), 1);
        assert!(log.hmm_errors[0].contains("err -34"));
        assert_eq!(log.driver_hangs.len(), 2, "{:#?}", log.driver_hangs);
        assert!(log.driver_hangs[0].contains("INFO: task python3:2817 blocked"));
        assert!(log.driver_hangs[1].contains("soft lockup"));
        assert!(log.resumed_after_uvm_load);

        // Reloading nvidia_uvm after the resume clears the condition.
        let reloaded = format!(
            "{text}[ 9100.000000] nvidia-uvm: Loaded the UVM driver, major device number 508.\n"
        );
        assert!(!parse_kernel_log(&reloaded).resumed_after_uvm_load);
        // A resume before the driver was loaded does not count.
        assert!(!parse_kernel_log(&format!("{DMESG_RESUME}{boot}")).resumed_after_uvm_load);
    }

    #[test]
    fn kernel_log_reports_and_formats() {
        // Oops following its BUG line is one report; journalctl prefixes; WARN with tag.
        let text = "\
Jan 15 09:41:27 gpu17 kernel: BUG: kernel NULL pointer dereference, address: 0000000000000008
Jan 15 09:41:27 gpu17 kernel: #PF: supervisor read access in kernel mode
Jan 15 09:41:27 gpu17 kernel: Oops: 0000 [#1] PREEMPT SMP NOPTI
Jan 15 09:41:27 gpu17 kernel: RIP: 0010:_nv012345rm+0x1d/0x30 [nvidia]
Jan 15 09:41:27 gpu17 kernel: Call Trace:
Jan 15 09:41:27 gpu17 kernel:  <TASK>
Jan 15 09:41:27 gpu17 kernel:  os_acquire_spinlock+0x12/0x30 [nvidia]
Jan 15 09:41:27 gpu17 kernel:  </TASK>
Jan 15 09:41:30 gpu17 kernel: WARNING: CPU: 3 PID: 2817 at /var/lib/dkms/nvidia/590.48.01/build/nvidia-uvm/uvm_va_space.c:412 uvm_va_space_destroy+0x3a1/0x3f0 [nvidia_uvm]
Jan 15 09:41:30 gpu17 kernel: ---[ end trace 0000000000000000 ]---
Jan 15 09:41:31 gpu17 kernel: WARNING: CPU: 1 PID: 1 at mm/page_alloc.c:4410 __alloc_pages+0x2d5/0x350
Jan 15 09:41:31 gpu17 kernel: Modules linked in: nvidia_uvm(OE) nvidia(OE)
Jan 15 09:41:31 gpu17 kernel: Call Trace:
Jan 15 09:41:31 gpu17 kernel:  alloc_pages_mpol+0x91/0x1f0
Jan 15 09:41:31 gpu17 kernel: ---[ end trace 0000000000000000 ]---
Jan 15 09:41:40 gpu17 kernel: NVRM: Xid (0000:18:00): 13, Graphics SM Warp Exception
[Thu Jan 15 09:42:00 2026] NVRM: Xid (PCI:0000:2a:00): 119, pid=912, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU1 GSP!
";
        let log = parse_kernel_log(text);
        assert_eq!(log.driver_hangs.len(), 2, "{:#?}", log.driver_hangs);
        assert!(log.driver_hangs[0].contains("BUG: kernel NULL pointer"));
        assert!(log.driver_hangs[1].contains("uvm_va_space_destroy"));
        assert_eq!(log.xids, [13, 119]);
        assert_eq!(log.nvidia_lines.len(), 2);

        assert!(names_nvidia_symbol(" ? nv_ioctl+0x5a/0x80"));
        assert!(!names_nvidia_symbol(
            "Modules linked in: nvidia_uvm(OE) [nvidia]"
        ));
        assert!(!names_nvidia_symbol(" nvme_poll+0x12/0x30"));
        assert!(!names_nvidia_symbol(" osq_lock+0x12/0x30"));

        // Only the last MAX_NVIDIA_LINES lines are kept.
        let many: String = (0..250)
            .map(|i| format!("[ {i}.000000] NVRM: line {i}\n"))
            .collect();
        let log = parse_kernel_log(&many);
        assert_eq!(log.nvidia_lines.len(), MAX_NVIDIA_LINES);
        assert!(log.nvidia_lines[0].ends_with("line 50"));
    }

    #[test]
    fn kernel_log_module_refusals_after_the_last_load() {
        // Secure Boot with an unsigned DKMS build (lockdown and signature lines, as public
        // reports of Ubuntu and Fedora hosts show them), then a build for another kernel.
        let refused = "\
[    5.101002] Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7
[    5.101010] Loading of unsigned module is rejected
[    6.220001] nvidia: Unknown symbol drm_gem_prime_export (err -2)
[    6.220002] nvidia_uvm: disagrees about version of symbol nvUvmInterfaceRegisterGpu
[    6.220003] nvme: Unknown symbol foo (err -2)
[    6.220004] nvidia: module verification failed: signature and/or required key missing - tainting kernel
";
        let log = parse_kernel_log(refused);
        assert_eq!(log.module_refused.len(), 4, "{:#?}", log.module_refused);
        assert!(log.module_refused[0].contains("Lockdown: modprobe"));
        assert!(log.module_refused[3].contains("nvidia_uvm: disagrees"));
        // A load that went through later makes them history; the taint notice of an
        // unsigned module that did load is never a refusal.
        let later = format!(
            "{refused}[   90.000000] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (buildd@debian)  Mon Jul 21 21:45:24 UTC 2025\n"
        );
        assert!(parse_kernel_log(&later).module_refused.is_empty());
        assert!(!is_module_refused_line(
            "nvidia: module verification failed: signature and/or required key missing - tainting kernel"
        ));
        let many = "[ 1.0] Loading of unsigned module is rejected\n".repeat(50);
        assert_eq!(
            parse_kernel_log(&many).module_refused.len(),
            MAX_MODULE_REFUSED_LINES
        );
    }

    #[test]
    fn kernel_log_no_gpu_lines_after_the_last_load() {
        // A load refused on a machine without a GPU (nvidia_init_module's message).
        let refused = "\
[    4.210331] nvidia: loading out-of-tree module taints kernel.
[    4.290117] nvidia-nvlink: Nvlink Core is being initialized, major device number 244
[    4.291002] NVRM: No NVIDIA GPU found.
[    4.292180] nvidia-nvlink: Unregistered Nvlink Core, major device number 244
";
        let log = parse_kernel_log(refused);
        assert_eq!(log.no_gpu, ["[    4.291002] NVRM: No NVIDIA GPU found."]);
        // The GPU held by vfio-pci (public kernel logs of passthrough hosts).
        let vfio = "\
[ 3641.841149] NVRM: GPU 0000:01:00.0 is already bound to vfio-pci.
[ 3641.845221] NVRM: The NVIDIA probe routine was not called for 1 device(s).
[ 3641.845223] NVRM: This can occur when another driver was loaded and
               NVRM: obtained ownership of the NVIDIA device(s).
[ 3641.845224] NVRM: No NVIDIA devices probed.
";
        let log = parse_kernel_log(vfio);
        assert_eq!(log.no_gpu.len(), 3, "{:#?}", log.no_gpu);
        assert!(log.no_gpu[0].contains("already bound to vfio-pci"));
        assert!(log.no_gpu[2].ends_with("NVRM: No NVIDIA devices probed."));
        // A successful load after them makes them history.
        let later = format!(
            "{refused}[   90.000000] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (buildd@debian)  Mon Jul 21 21:45:24 UTC 2025\n"
        );
        assert!(parse_kernel_log(&later).no_gpu.is_empty());
        // A clean boot has none; another driver's "already bound" is not the driver's.
        let boot = boot_dmesg(&DriverSpec::open("590.48.01"), 508);
        assert!(parse_kernel_log(&boot).no_gpu.is_empty());
        assert!(!is_no_gpu_line(
            "vfio-pci 0000:01:00.0: is already bound to vfio-pci"
        ));
        // Bounded.
        let many = "[ 1.0] NVRM: No NVIDIA GPU found.\n".repeat(100);
        assert_eq!(parse_kernel_log(&many).no_gpu.len(), MAX_NO_GPU_LINES);
    }

    #[test]
    fn kernel_log_xids_are_kept_once_each_and_bounded() {
        // A GPU lost early, then a storm of Xid 13 (a faulting kernel relaunched in a loop):
        // the 79 stays, the storm is one entry.
        let mut text = String::from(
            "[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n",
        );
        text.push_str(
            &"[ 2.0] NVRM: Xid (PCI:0000:2a:00): 13, Graphics SM Warp Exception\n".repeat(10_000),
        );
        assert_eq!(parse_kernel_log(&text).xids, [79, 13]);
        // Made-up numbers: the first MAX_XIDS distinct.
        let made_up: String = (0..1000)
            .map(|x| format!("[ 3.0] NVRM: Xid (PCI:0000:18:00): {x}, junk\n"))
            .collect();
        let xids = parse_kernel_log(&made_up).xids;
        assert_eq!(xids.len(), MAX_XIDS);
        assert_eq!(xids[..3], [0, 1, 2]);
    }

    #[test]
    fn kernel_log_adapter_causes_are_kept_and_classified() {
        let text = "\
[    5.559842] NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)
               NVRM: installed in this system requires use of the NVIDIA open kernel modules.
[    5.559858] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)
[   12.100100] NVRM: _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP
[    4.620311] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:
[    4.620312] NVRM: BAR1 is 0M @ 0x0 (PCI:0000:18:00.0)
[    4.620313] NVRM: 0000:18:00.0: Attempting to resize BAR1.
";
        let log = parse_kernel_log(text);
        let causes: Vec<_> = log
            .adapter_causes
            .iter()
            .map(|l| adapter_cause(l).unwrap())
            .collect();
        assert_eq!(
            causes,
            [AdapterCause::Flavor, AdapterCause::Wpr2, AdapterCause::Bar]
        );
        assert_eq!(log.adapter_init_failed.len(), 1);
        // Bounded: a log that repeats a cause keeps the first lines only.
        let many = "[ 1.0] NVRM: unexpected WPR2 already up\n".repeat(100);
        assert_eq!(
            parse_kernel_log(&many).adapter_causes.len(),
            MAX_ADAPTER_CAUSE_LINES
        );
    }
}

//! Rule `adapter_init_failure`: a GPU fails to initialize in the kernel (one row of the rules table
//! in `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in
//! code to snapshot trees read back by the collectors.

use super::super::collect::kernel_log::{adapter_cause, AdapterCause};
use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, EvidenceItem, Finding, FixStep, Severity, Where};
use super::{
    driver, finding, host_only_note, is_gpu_node, item, klog, push_cuinit, step, unknown,
    SRC_OPENAT,
};

/// Xids of a GPU lost or failing to come up: 79 fallen off the bus, 119 GSP RPC timeout,
/// 120 GSP error (NVIDIA Xid catalog; `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`,
/// `GSP_RPC_TIMEOUT`, `GSP_ERROR` in `src/common/sdk/nvidia/inc/nverror.h`).
const ADAPTER_XIDS: &[u32] = &[79, 119, 120];

/// `initStatus` of `RmInitAdapter failed! (0x%x:0x%x:%d)` (`initStatus:rmStatus:line`,
/// `src/nvidia/arch/nvalloc/unix/src/osinit.c`): `RM_INIT_GPU_GPUMGR_ATTACH_GPU_FAILED`.
const INIT_ATTACH_FAILED: u32 = 0x22;

/// `initStatus` `RM_INIT_FIRMWARE_INIT_FAILED` (osinit.c): GSP firmware RM did not start.
const INIT_FIRMWARE_FAILED: u32 = 0x62;

/// `rmStatus` `NV_ERR_NOT_SUPPORTED` (`nvstatuscodes.h`, 0x56).
const NV_ERR_NOT_SUPPORTED: u32 = 0x56;

/// Which failure of a GPU's bring-up the evidence names, each with its own fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    /// Xid 79: the GPU fell off the bus.
    OffTheBus,
    /// The proprietary module on a GPU only the open module supports.
    Flavor,
    /// WPR2 already up: the GPU was left in a bad state and needs a reset.
    Wpr2,
    /// A PCI BAR not assigned: BIOS Above 4G decoding / BAR settings.
    Bar,
    /// GSP firmware timed out (Xid 119), failed (Xid 120) or did not start (0x62).
    Gsp,
    /// None of the above: read the code.
    Generic,
}

/// Adapter init failure: a GPU fails to initialize in the kernel. Signals: kernel log
/// `RmInitAdapter failed` / `rm_init_adapter failed`, Xid 79/119/120, the driver's lines
/// that say why ([`AdapterCause`]); an open of `/dev/nvidia<N>` failing with `EIO`.
///
/// The finding names the sub-diagnosis ([`Sub`]) with its own fix: Xid 79; the open-module
/// notice, or `RmInitAdapter failed! (0x22:0x56:...)` (attach refused, not supported) on
/// the proprietary module (public reports show that code after the notice); `WPR2 already
/// up`; an invalid or unassignable BAR; a GSP timeout, error or start failure.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    let log = klog(e);
    let lines = log.map(|l| l.adapter_init_failed.as_slice()).unwrap_or(&[]);
    let cause_lines = log.map(|l| l.adapter_causes.as_slice()).unwrap_or(&[]);
    let xids: Vec<u32> = log
        .map(|l| {
            l.xids
                .iter()
                .copied()
                .filter(|x| ADAPTER_XIDS.contains(x))
                .collect()
        })
        .unwrap_or_default();
    // EIO on a GPU or control node: seen by the probes, or by uvmwatch's own open.
    let rm_node = |p: &str| is_gpu_node(p) || p == "/dev/nvidiactl";
    let mut eio: Vec<(&str, EvidenceItem)> = o
        .failed_opens
        .iter()
        .filter(|(p, err)| err == "EIO" && rm_node(p))
        .map(|(p, _)| (p.as_str(), item("open", format!("{p}: EIO"), SRC_OPENAT)))
        .collect();
    let own = e.dev_nodes.get().map(|n| n.as_slice()).unwrap_or(&[]);
    eio.extend(
        own.iter()
            .filter(|n| rm_node(&n.path) && n.open == Some(Err("EIO".to_string())))
            .map(|n| {
                let p = n.path.as_str();
                (p, item("open by uvmwatch", format!("{p}: EIO"), p))
            }),
    );
    if lines.is_empty() && xids.is_empty() && eio.is_empty() && cause_lines.is_empty() {
        return None;
    }
    let causes: Vec<AdapterCause> = cause_lines
        .iter()
        .filter_map(|l| adapter_cause(l))
        .collect();
    let codes: Vec<(u32, u32)> = lines.iter().filter_map(|l| init_code(l)).collect();
    let proprietary = driver(e).is_some_and(|d| !d.open_module);
    let attach_unsupported = codes.contains(&(INIT_ATTACH_FAILED, NV_ERR_NOT_SUPPORTED));
    let has = |c: AdapterCause| causes.contains(&c);
    let sub = if xids.contains(&79) {
        Sub::OffTheBus
    } else if has(AdapterCause::Flavor) || (proprietary && attach_unsupported) {
        Sub::Flavor
    } else if has(AdapterCause::Wpr2) {
        Sub::Wpr2
    } else if has(AdapterCause::Bar) {
        Sub::Bar
    } else if has(AdapterCause::Gsp)
        || xids.iter().any(|x| *x == 119 || *x == 120)
        || codes.iter().any(|c| c.0 == INIT_FIRMWARE_FAILED)
    {
        Sub::Gsp
    } else {
        Sub::Generic
    };
    // The driver's own line (or Xid 79) is direct; the attach code alone on the proprietary
    // module, without the driver's notice, is not.
    let direct = !lines.is_empty() || !cause_lines.is_empty() || xids.contains(&79);
    let confidence = if sub == Sub::Flavor && !has(AdapterCause::Flavor) {
        Confidence::Medium
    } else if direct || (!eio.is_empty() && !xids.is_empty()) {
        Confidence::High
    } else {
        Confidence::Medium
    };
    let title = match sub {
        Sub::OffTheBus => "a GPU has fallen off the bus (Xid 79)".to_string(),
        Sub::Flavor => "the proprietary NVIDIA kernel module cannot drive this GPU: it needs \
                        the open kernel module"
            .to_string(),
        Sub::Wpr2 => {
            "a GPU was left in a bad state (WPR2 already up): it needs a GPU reset".to_string()
        }
        Sub::Bar => "a GPU's PCI memory region (BAR) is not assigned: BIOS Above 4G decoding \
                     or BAR settings"
            .to_string(),
        Sub::Gsp if !xids.is_empty() => format!(
            "GSP firmware timed out or failed on a GPU (Xid {})",
            xids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Sub::Gsp => "the GPU's GSP firmware did not start (RmInitAdapter)".to_string(),
        Sub::Generic if !lines.is_empty() => {
            "a GPU failed to initialize in the kernel (RmInitAdapter failed)".to_string()
        }
        Sub::Generic => match eio.first() {
            Some((p, _)) => format!("{p} returned EIO: the GPU did not initialize"),
            None => "a GPU failed to initialize in the kernel".to_string(),
        },
    };
    let mut f = finding(
        "adapter_init_failure",
        Severity::Critical,
        confidence,
        title,
    );
    push_cuinit(&mut f, o);
    f.evidence.extend(eio.into_iter().map(|(_, i)| i));
    for l in cause_lines.iter().take(3).chain(lines.iter().take(3)) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if !xids.is_empty() {
        let v: Vec<String> = xids.iter().map(u32::to_string).collect();
        f.evidence
            .push(item("Xid", v.join(", "), e.kernel_log.source.clone()));
    }
    if sub == Sub::Flavor {
        if let Some(d) = driver(e).filter(|d| !d.open_module) {
            f.evidence.push(item(
                "driver",
                format!("{} proprietary kernel module", d.version),
                e.driver.source.clone(),
            ));
        }
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (needs root or CAP_SYSLOG)") {
        f.unchecked
            .push(format!("{s}: cannot see RmInitAdapter failures or Xids"));
    }
    f.fix = fix(e, sub, proprietary);
    Some(f)
}

/// `(initStatus, rmStatus)` of an `RmInitAdapter failed! (0x22:0x56:884)` line.
fn init_code(line: &str) -> Option<(u32, u32)> {
    let rest = &line[line.find("RmInitAdapter failed! (")? + "RmInitAdapter failed! (".len()..];
    let mut parts = rest.split(':');
    let hex = |p: Option<&str>| u32::from_str_radix(p?.trim().strip_prefix("0x")?, 16).ok();
    Some((hex(parts.next())?, hex(parts.next())?))
}

/// The fix of each sub-diagnosis.
fn fix(e: &Evidence, sub: Sub, proprietary: bool) -> Vec<FixStep> {
    let host = host_only_note(e);
    let version = driver(e).map(|d| d.version.clone());
    let fw = match &version {
        Some(v) => format!("ls /lib/firmware/nvidia/{v}/"),
        None => "ls /lib/firmware/nvidia/".into(),
    };
    let read = step(
        Where::Any,
        "Read the failure code: RmInitAdapter failed! (0xAA:0xBB:NNN) and the Xid name the \
         cause.",
        &[
            "sudo dmesg -T | grep -E 'RmInitAdapter|rm_init_adapter|Xid|NVRM'",
            "sudo nvidia-bug-report.sh",
        ],
    );
    match sub {
        Sub::OffTheBus => vec![
            step(
                Where::Host,
                format!(
                    "The GPU no longer answers on PCIe; only a reboot brings it back. Look for \
                     PCIe errors first.{host}"
                ),
                &[
                    "sudo dmesg -T | grep -iE 'AER|pcieport|fallen off'",
                    "sudo reboot",
                ],
            ),
            step(
                Where::Host,
                "If it repeats: check the GPU's power cables and supply, cooling \
                 (nvidia-smi -q -d TEMPERATURE,POWER before it fails) and seating; a GPU that \
                 keeps falling off the bus is a hardware case for the vendor.",
                &["nvidia-smi -q -d TEMPERATURE,POWER"],
            ),
        ],
        Sub::Flavor => vec![
            step(
                Where::Host,
                format!(
                    "Install the open flavor of the same driver version in place of the \
                     proprietary one (Ubuntu: the -open package of the branch; RHEL: the \
                     open-dkms module stream; the .run installer: --kernel-module-type=open), \
                     then reboot. GPUs from Blackwell on are supported by the open module \
                     only.{host}"
                ),
                &[
                    "sudo apt install nvidia-driver-<branch>-open",
                    "sudo dnf module install nvidia-driver:open-dkms",
                    "sudo reboot",
                ],
            ),
            step(
                Where::Any,
                "Verify: the first line must name the Open Kernel Module.",
                &["head -1 /proc/driver/nvidia/version"],
            ),
        ],
        Sub::Wpr2 => vec![
            step(
                Where::Host,
                format!(
                    "The GPU kept its GSP state (WPR2) from an earlier driver load: reset it. \
                     Stop everything that uses the GPU first; if the reset is refused, reset \
                     the PCI function, or power the machine off and on (a warm reboot may not \
                     clear it).{host}"
                ),
                &[
                    "sudo fuser -v /dev/nvidia*",
                    "sudo nvidia-smi -r",
                    "echo 1 | sudo tee /sys/bus/pci/devices/<0000:BB:DD.F>/reset",
                ],
            ),
            step(
                Where::Host,
                "Then load the driver again (or reboot) and check that the GPU is listed.",
                &[
                    "sudo modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia",
                    "nvidia-smi -L",
                ],
            ),
        ],
        Sub::Bar => vec![
            step(
                Where::Host,
                format!(
                    "The firmware left a GPU BAR unassigned or too small. In the BIOS/UEFI set \
                     'Above 4G Decoding' on (and 'Resizable BAR' where offered), or let Linux \
                     reassign PCI resources with the kernel parameter pci=realloc, then \
                     reboot.{host}"
                ),
                &[
                    "sudo lspci -vv -d 10de: | grep -E 'Region|BAR'",
                    "sudo dmesg -T | grep -E 'BAR|PCI I/O region'",
                ],
            ),
            read,
        ],
        Sub::Gsp => {
            let mut steps = vec![
                step(
                    Where::Host,
                    format!(
                        "GSP, the GPU's own firmware processor, did not answer. Reset the GPU \
                         (or reboot), and check that this driver's GSP firmware files are \
                         installed; if it repeats, update the driver.{host}"
                    ),
                    &["sudo nvidia-smi -r", &fw, "sudo reboot"],
                ),
                read,
            ];
            if proprietary {
                steps.push(step(
                    Where::Host,
                    "With the proprietary module only, and for GPUs that do not require GSP \
                     (before Blackwell): running without GSP firmware avoids it.",
                    &["echo 'options nvidia NVreg_EnableGpuFirmware=0' | sudo tee /etc/modprobe.d/nvidia-gsp.conf"],
                ));
            }
            steps
        }
        Sub::Generic => vec![
            read,
            step(
                Where::Host,
                format!(
                    "Depends on the code: RmInitAdapter failures: BIOS settings (Above 4G \
                     decoding, BAR size), the GSP firmware files of this driver, and a driver \
                     flavor that supports the GPU (Blackwell needs the open module).{host}"
                ),
                &[&fw, "sudo reboot"],
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn adapter_init_failure_from_log() {
        let e = healthy_open_host().log(|l| {
            l.adapter_init_failed =
                vec!["NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)".into()]
        });
        let f = run("adapter_init_failure", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "/lib/firmware/nvidia/590.48.01/"));
    }

    #[test]
    fn adapter_init_failure_from_eio() {
        let o = watched()
            .cuinit(100, 3.2)
            .opens(1)
            .failed_open("/dev/nvidia1", "EIO");
        let f = run("adapter_init_failure", &healthy_open_host(), &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
    }

    #[test]
    fn adapter_init_failure_from_own_open() {
        let e = healthy_open_host().with(|e| {
            if let Ok(n) = &mut e.dev_nodes.value {
                n[1].open = Some(Err("EIO".into()));
            }
        });
        let f = run("adapter_init_failure", &e, &plain()).expect("finding");
        assert_eq!(
            f.title,
            "/dev/nvidia0 returned EIO: the GPU did not initialize"
        );
        assert_eq!(f.evidence[0].source, "/dev/nvidia0");
    }

    #[test]
    fn adapter_init_failure_not_for_application_xids() {
        let e = healthy_open_host().log(|l| l.xids = vec![13, 31, 43]);
        assert_eq!(run("adapter_init_failure", &e, &plain()), None);
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn adapter_init_failure_rm_init_adapter_failed_in_the_kernel_log_is_critical_high() {
        let spec = with_kernel_log(DMESG_ADAPTER_INIT_FAILED);
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("RmInitAdapter"), "{}", f.title);
        assert!(evidence_from(f, "kernel log", DMESG).contains("RmInitAdapter failed!"));
        assert!(has_fix(f, Where::Host, "/lib/firmware/nvidia/590.48.01/"));
    }

    #[test]
    fn adapter_init_failure_xid_79_fallen_off_the_bus_is_critical_high() {
        let spec = with_kernel_log(DMESG_XID_79);
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("Xid 79"), "{}", f.title);
        assert_eq!(evidence_from(f, "Xid", DMESG), "79");
    }

    #[test]
    fn adapter_init_failure_eio_on_a_gpu_node_seen_by_the_probe_is_critical_medium() {
        let o = watched()
            .cuinit(100, 3.2)
            .opens(1)
            .failed_open("/dev/nvidia1", "EIO");
        let fs = diagnose_spec(&SnapshotSpec::default(), &o);
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "open", "probe:openat"),
            "/dev/nvidia1: EIO"
        );
        // EIO is neither a missing node nor a denial.
        absent(&fs, "node_or_module_missing");
        absent(&fs, "device_permission");
    }

    #[test]
    fn adapter_init_failure_eio_recorded_for_the_collectors_own_open_is_critical() {
        let nodes = nodes_opened_except("/dev/nvidia0", "EIO");
        let spec = SnapshotSpec {
            nodes,
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            f.title,
            "/dev/nvidia0 returned EIO: the GPU did not initialize"
        );
        assert_eq!(
            evidence_from(f, "open by uvmwatch", "/dev/nvidia0"),
            "/dev/nvidia0: EIO"
        );
    }

    #[test]
    fn adapter_init_failure_not_for_application_xids_13_31_43() {
        let app_xids = "\
[ 7001.100200] NVRM: Xid (PCI:0000:18:00): 13, pid=2817, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
[ 7002.200300] NVRM: Xid (PCI:0000:18:00): 31, pid=2817, name=python3, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ
[ 7003.300400] NVRM: Xid (PCI:0000:2a:00): 43, pid=2817, name=python3, Ch 00000008
";
        let spec = with_kernel_log(app_xids);
        let e = snapshot_evidence(&spec);
        assert_eq!(
            e.kernel_log.get().map(|l| l.xids.clone()),
            Some(vec![13, 31, 43])
        );
        absent(&diagnose(&e, &plain()), "adapter_init_failure");
        absent(
            &diagnose(&e, &watched().cuinit(0, 0.3).opens(4)),
            "adapter_init_failure",
        );
    }

    #[test]
    fn adapter_init_failure_not_for_eio_on_the_uvm_node() {
        // Only /dev/nvidiactl and /dev/nvidia<N> are brought up by RM.
        let o = watched()
            .cuinit(999, 0.01)
            .opens(3)
            .failed_open("/dev/nvidia-uvm", "EIO");
        absent(
            &diagnose_spec(&SnapshotSpec::default(), &o),
            "adapter_init_failure",
        );
    }

    // Sub-diagnoses, each from the driver's own lines (formats from the NVIDIA sources and
    // public reports cited in `collect/kernel_log.rs`), each with a near miss.

    /// A snapshot whose driver is `driver` and whose kernel log is its boot plus `extra`.
    fn with_driver_and_log(driver: DriverSpec, extra: &str) -> SnapshotSpec {
        SnapshotSpec {
            dmesg: Some(boot_dmesg(&driver, 508) + extra),
            driver: Some(driver),
            ..SnapshotSpec::default()
        }
    }

    /// A Blackwell GPU under the proprietary module (driver 580.105.08's lines).
    const DMESG_NEEDS_OPEN: &str = "\
[    5.559842] NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)
               NVRM: installed in this system requires use of the NVIDIA open kernel modules.
[    5.559858] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)
[    5.560313] NVRM: GPU 0000:02:00.0: rm_init_adapter failed, device minor number 0
";

    #[test]
    fn adapter_init_failure_proprietary_module_on_an_open_only_gpu_says_install_the_open_module() {
        let spec = with_driver_and_log(DriverSpec::proprietary(DRIVER), DMESG_NEEDS_OPEN);
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(
            f.title.contains("needs the open kernel module"),
            "{}",
            f.title
        );
        assert!(evidence_from(f, "kernel log", DMESG).contains("requires use of the NVIDIA open"));
        assert!(evidence_from(f, "driver", "/proc/driver/nvidia/version").contains("proprietary"));
        assert!(has_fix(f, Where::Host, "-open"));
        assert!(has_fix(f, Where::Any, "/proc/driver/nvidia/version"));
        // Without the notice, the attach code alone on the proprietary module: medium.
        let code_only = with_driver_and_log(
            DriverSpec::proprietary(DRIVER),
            "[    5.559858] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)\n",
        );
        let fs = diagnose_spec(&code_only, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::Medium,
        );
        assert!(f.title.contains("open kernel module"), "{}", f.title);
    }

    #[test]
    fn adapter_init_failure_near_miss_attach_code_on_the_open_module_is_not_the_flavor() {
        // The same code on the open module: no flavor to change; the generic reading.
        let spec = with_kernel_log(
            "[    5.559858] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)\n",
        );
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("RmInitAdapter failed"), "{}", f.title);
        assert!(!has_fix(f, Where::Host, "nvidia-driver:open-dkms"));
    }

    #[test]
    fn adapter_init_failure_wpr2_already_up_says_reset_the_gpu() {
        let spec = with_kernel_log(
            "\
[   12.100100] NVRM: _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP
[   12.100104] NVRM: _kgspBootGspRm: (the GPU is likely in a bad state and may need to be reset)
[   12.100210] NVRM: RmInitAdapter: Cannot initialize GSP firmware RM
[   12.100950] NVRM: GPU 0000:18:00.0: RmInitAdapter failed! (0x62:0x40:1860)
",
        );
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("WPR2"), "{}", f.title);
        assert!(has_fix(f, Where::Host, "nvidia-smi -r"));
        assert!(has_fix(f, Where::Host, "/reset"));
        // Near miss: GSP that did not start, without WPR2, is the GSP case, not a reset one.
        let spec = with_kernel_log(
            "\
[  903.609564] NVRM: RmInitAdapter: Cannot initialize GSP firmware RM
[  903.610907] NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)
",
        );
        let f = expect(
            &diagnose_spec(&spec, &plain()),
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        )
        .clone();
        assert!(
            f.title.contains("GSP firmware did not start"),
            "{}",
            f.title
        );
        assert!(!f.title.contains("WPR2"));
    }

    #[test]
    fn adapter_init_failure_invalid_bar_says_above_4g_decoding() {
        let spec = with_kernel_log(
            "\
[    4.620311] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:
[    4.620312] NVRM: BAR1 is 0M @ 0x0 (PCI:0000:18:00.0)
[    4.620590] NVRM: The NVIDIA probe routine failed for 1 device(s).
",
        );
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("BAR"), "{}", f.title);
        assert!(has_fix(f, Where::Host, "lspci -vv -d 10de:"));
        assert!(f.fix[0].note.contains("Above 4G Decoding"));
        // Near miss: the driver's BAR1 resize notes at info level are no failure.
        let spec = with_kernel_log(
            "\
[    4.620311] NVRM: 0000:18:00.0: Attempting to resize BAR1.
[    4.620312] NVRM: 0000:18:00.0: BAR1 already at requested size.
",
        );
        absent(&diagnose_spec(&spec, &plain()), "adapter_init_failure");
    }

    #[test]
    fn adapter_init_failure_xid_119_gsp_timeout_says_reset_and_firmware() {
        let spec = with_kernel_log(
            "\
[ 5012.300100] NVRM: Xid (PCI:0000:18:00): 119, pid=2817, name=python3, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).
",
        );
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "adapter_init_failure",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("Xid 119"), "{}", f.title);
        assert_eq!(evidence_from(f, "Xid", DMESG), "119");
        assert!(has_fix(f, Where::Host, "nvidia-smi -r"));
        assert!(has_fix(f, Where::Host, "/lib/firmware/nvidia/590.48.01/"));
        // The open module needs GSP: no advice to run without it.
        assert!(!has_fix(f, Where::Host, "NVreg_EnableGpuFirmware=0"));
        // Near miss: application Xids beside it do not change the reading, and alone are
        // nothing (adapter_init_failure_not_for_application_xids_13_31_43).
        let spec = with_kernel_log(
            "[ 5012.300100] NVRM: Xid (PCI:0000:18:00): 31, pid=2817, name=python3, Ch 00000010, intr 10000000. MMU Fault\n",
        );
        absent(&diagnose_spec(&spec, &plain()), "adapter_init_failure");
    }
}

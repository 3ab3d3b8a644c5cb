//! Rule `adapter_init_failure`: a GPU fails to initialize in the kernel (one row of
//! `shared/reference/failure-classes.md`); [`check`] says when it applies, and its tests
//! go from evidence built in code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, EvidenceItem, Finding, Severity, Where};
use super::{
    driver, finding, host_only_note, is_gpu_node, item, klog, push_cuinit, step, unknown,
    SRC_OPENAT,
};

/// Xids of a GPU lost or failing to come up: 79 fallen off the bus, 119 GSP RPC timeout,
/// 120 GSP error (NVIDIA Xid catalog).
const ADAPTER_XIDS: &[u32] = &[79, 119, 120];

/// Adapter init failure: a GPU fails to initialize in the kernel. Signals: kernel log
/// `RmInitAdapter failed` / `rm_init_adapter failed`, Xid 79/119/120; an open of
/// `/dev/nvidia<N>` failing with `EIO`.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    let log = klog(e);
    let lines = log.map(|l| l.adapter_init_failed.as_slice()).unwrap_or(&[]);
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
    if lines.is_empty() && xids.is_empty() && eio.is_empty() {
        return None;
    }
    let confidence =
        if !lines.is_empty() || xids.contains(&79) || (!eio.is_empty() && !xids.is_empty()) {
            Confidence::High
        } else {
            Confidence::Medium
        };
    let title = if xids.contains(&79) {
        "a GPU has fallen off the bus (Xid 79)".to_string()
    } else if !lines.is_empty() {
        "a GPU failed to initialize in the kernel (RmInitAdapter failed)".to_string()
    } else if let Some((p, _)) = eio.first() {
        format!("{p} returned EIO: the GPU did not initialize")
    } else {
        format!(
            "GSP firmware error on a GPU (Xid {})",
            xids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut f = finding(
        "adapter_init_failure",
        Severity::Critical,
        confidence,
        title,
    );
    push_cuinit(&mut f, o);
    f.evidence.extend(eio.into_iter().map(|(_, i)| i));
    for l in lines.iter().take(3) {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if !xids.is_empty() {
        let v: Vec<String> = xids.iter().map(u32::to_string).collect();
        f.evidence
            .push(item("Xid", v.join(", "), e.kernel_log.source.clone()));
    }
    if let Some(s) = unknown(&e.kernel_log, "kernel log (needs root or CAP_SYSLOG)") {
        f.unchecked
            .push(format!("{s}: cannot see RmInitAdapter failures or Xids"));
    }
    let fw = driver(e)
        .map(|d| format!("ls /lib/firmware/nvidia/{}/", d.version))
        .unwrap_or_else(|| "ls /lib/firmware/nvidia/".into());
    f.fix = vec![
        step(
            Where::Any,
            "Read the failure code: RmInitAdapter failed! (0xAA:0xBB:NNN) and the Xid name the \
             cause.",
            &[
                "sudo dmesg -T | grep -E 'RmInitAdapter|rm_init_adapter|Xid'",
                "sudo nvidia-bug-report.sh",
            ],
        ),
        step(
            Where::Host,
            format!(
                "Depends on the code: Xid 79 (fell off the bus) needs a reboot and a check of \
                 power, cooling and seating; RmInitAdapter failures: BIOS settings (Above 4G \
                 decoding, BAR size), the GSP firmware files of this driver, and a driver \
                 flavor that supports the GPU (Blackwell needs the open module); Xid 119/120: \
                 GPU reset or reboot, then a driver update.{}",
                host_only_note(e)
            ),
            &[&fw, "sudo reboot"],
        ),
    ];
    Some(f)
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
}

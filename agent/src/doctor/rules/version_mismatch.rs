//! Rule `version_mismatch`: user-space driver library and kernel module differ (one row of the
//! rules table in `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence
//! built in code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{cu, driver, finding, host_only_note, item, klog, push_cuinit, smi, step, unknown};

/// Version mismatch: the user-space driver library and the kernel module differ, or a
/// forward-compatibility library is used where it is not supported. Signals: `cuInit`
/// 803/804, an `API mismatch` kernel log line, NVML's "Driver/library version mismatch", a
/// mapped `libcuda.so.<ver>` other than `/proc/driver/nvidia/version`, a `compat/` library on
/// a GeForce GPU.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    if o.cuinit_result == Some(cu::SUCCESS) {
        return None;
    }
    let drv = driver(e).map(|d| d.version.as_str());
    let code = o
        .cuinit_result
        .filter(|r| *r == cu::SYSTEM_DRIVER_MISMATCH || *r == cu::COMPAT_NOT_SUPPORTED_ON_DEVICE);
    let api = klog(e).and_then(|l| l.api_mismatch.as_ref());
    let nvml = e
        .smi
        .value
        .as_ref()
        .err()
        .filter(|u| u.why.to_ascii_lowercase().contains("mismatch"));
    let smi_ver = smi(e)
        .and_then(|s| s.driver_version.as_deref())
        .zip(drv)
        .filter(|(s, d)| s != d);
    let geforce = smi(e).is_some_and(|s| s.product_brand.iter().any(|b| b.contains("GeForce")));
    let libs = e.libcuda.get().map(|l| l.as_slice()).unwrap_or(&[]);
    // Only the diagnosed process's libraries when one is observed.
    let relevant = |pid: u32| o.pid.is_none_or(|p| p == pid);
    let plain_diff: Vec<_> = libs
        .iter()
        .filter(|l| relevant(l.pid) && !l.compat)
        .filter(|l| matches!((l.version.as_deref(), drv), (Some(v), Some(d)) if v != d))
        .collect();
    let compat_bad: Vec<_> = libs
        .iter()
        .filter(|l| relevant(l.pid) && l.compat)
        .filter(|l| {
            geforce
                || matches!((l.version.as_deref(), drv),
                    (Some(v), Some(d)) if version_key(v) < version_key(d))
        })
        .collect();
    let compat_any = libs.iter().any(|l| relevant(l.pid) && l.compat);

    let corroborated =
        api.is_some() || nvml.is_some() || !plain_diff.is_empty() || !compat_bad.is_empty();
    let (severity, confidence) = if code.is_some() {
        (
            Severity::Critical,
            if corroborated
                || (code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) && (geforce || compat_any))
            {
                Confidence::High
            } else {
                Confidence::Medium
            },
        )
    } else if api.is_some() || nvml.is_some() {
        (Severity::Critical, Confidence::High)
    } else if !plain_diff.is_empty() || smi_ver.is_some() {
        (Severity::Critical, Confidence::Medium)
    } else if !compat_bad.is_empty() {
        (
            if geforce {
                Severity::Critical
            } else {
                Severity::Warning
            },
            Confidence::Medium,
        )
    } else {
        return None;
    };

    let title = match code {
        Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) => {
            "cuInit returned 804: the forward-compatibility library is not supported on this GPU"
                .to_string()
        }
        Some(c) => format!("cuInit returned {c}: user-space driver and kernel module differ"),
        None if !compat_bad.is_empty() && plain_diff.is_empty() && api.is_none() => {
            "a CUDA forward-compatibility library is used where it is not supported".to_string()
        }
        None => format!(
            "user-space driver and kernel module ({}) differ",
            drv.unwrap_or("version unknown")
        ),
    };
    let mut f = finding("version_mismatch", severity, confidence, title);
    push_cuinit(&mut f, o);
    if let Some(d) = drv {
        f.evidence
            .push(item("kernel module", d, e.driver.source.clone()));
    }
    if let Some(l) = api {
        f.evidence
            .push(item("kernel log", l.clone(), e.kernel_log.source.clone()));
    }
    if let Some(u) = nvml {
        f.evidence
            .push(item("nvidia-smi", u.why.clone(), e.smi.source.clone()));
    }
    if let Some((s, _)) = smi_ver {
        f.evidence
            .push(item("NVML driver version", s, e.smi.source.clone()));
    }
    for l in plain_diff.iter().chain(compat_bad.iter()) {
        let kind = if l.compat { " (forward-compat)" } else { "" };
        f.evidence.push(item(
            "libcuda mapped",
            format!(
                "{} by {} (pid {}): {}{kind}",
                l.path,
                l.comm,
                l.pid,
                l.version.as_deref().unwrap_or("version unknown")
            ),
            format!("/proc/{}/maps", l.pid),
        ));
    }
    if geforce && (compat_any || code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE)) {
        f.evidence.push(item(
            "GPU brand",
            "GeForce: forward compatibility is for data-center GPUs",
            e.smi.source.clone(),
        ));
    }
    f.unchecked.extend(
        [
            unknown(&e.driver, "kernel module version"),
            unknown(&e.libcuda, "mapped libcuda"),
            unknown(&e.kernel_log, "kernel log (API mismatch lines)"),
        ]
        .into_iter()
        .flatten(),
    );

    let pid = o
        .pid
        .map(|p| p.to_string())
        .unwrap_or_else(|| "<pid>".into());
    let maps = format!("grep libcuda /proc/{pid}/maps");
    if !plain_diff.is_empty()
        || api.is_some()
        || nvml.is_some()
        || smi_ver.is_some()
        || code == Some(cu::SYSTEM_DRIVER_MISMATCH)
    {
        f.fix.push(step(
            Where::Host,
            format!(
                "After a driver upgrade the old module stays loaded until a reboot (or until \
                 every nvidia module is unloaded and reloaded): reboot so the module matches \
                 the libraries.{}",
                host_only_note(e)
            ),
            &["cat /proc/driver/nvidia/version", "sudo reboot"],
        ));
        f.fix.push(step(
            Where::Container,
            "Use the host's driver library: the NVIDIA Container Toolkit mounts it; a libcuda \
             baked into the image or found first on LD_LIBRARY_PATH shadows it.",
            &["ldconfig -p | grep libcuda", &maps],
        ));
    }
    if compat_any || code == Some(cu::COMPAT_NOT_SUPPORTED_ON_DEVICE) {
        f.fix.push(step(
            Where::Container,
            "Drop the CUDA forward-compatibility library (a compat/ directory) from the library \
             path, or remove the cuda-compat package: forward compatibility works only on \
             data-center GPUs and with a driver older than the compat library.",
            &["echo $LD_LIBRARY_PATH", &maps],
        ));
    }
    Some(f)
}

/// Splits `590.48.01` into numbers for comparison.
fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::MappedLibcuda;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    fn lib(version: &str, path: &str, compat: bool) -> MappedLibcuda {
        MappedLibcuda {
            pid: 4242,
            comm: "python3".into(),
            path: path.into(),
            version: Some(version.into()),
            compat,
        }
    }

    #[test]
    fn version_mismatch_803_with_api_line() {
        let e = healthy_open_host().log(|l| {
            l.api_mismatch = Some(
                "NVRM: API mismatch: the client has the version 590.48.01, but this kernel \
                 module has the version 580.95.05."
                    .into(),
            )
        });
        let o = watched().cuinit(803, 0.1).opens(1);
        let f = run("version_mismatch", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "sudo reboot"));
    }

    #[test]
    fn version_mismatch_from_mapped_library() {
        let e = healthy_open_host().libcuda(vec![lib(
            "580.95.05",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            false,
        )]);
        let f = run("version_mismatch", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        assert!(f.evidence.iter().any(|i| i.source == "/proc/4242/maps"));
    }

    #[test]
    fn version_mismatch_compat_804_on_geforce() {
        let e = healthy_open_host()
            .smi(|s| s.product_brand = vec!["GeForce".into()])
            .libcuda(vec![lib(
                "595.45.04",
                "/usr/local/cuda-13.1/compat/libcuda.so.1",
                true,
            )]);
        let o = watched().cuinit(804, 0.05).opens(2);
        let f = run("version_mismatch", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f
            .fix
            .iter()
            .any(|s| s.note.contains("forward-compatibility")));
    }

    #[test]
    fn version_mismatch_near_misses() {
        // Same version everywhere, error 3: not a mismatch.
        assert_eq!(
            run(
                "version_mismatch",
                &motivating_host(),
                &register_gpu_no_memory()
            ),
            None
        );
        // Forward compat newer than the driver on a data-center GPU: supported.
        let dc = healthy_open_host().libcuda(vec![lib(
            "595.45.04",
            "/usr/local/cuda-13.1/compat/libcuda.so.1",
            true,
        )]);
        assert_eq!(run("version_mismatch", &dc, &plain()), None);
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn version_mismatch_803_with_api_mismatch_in_the_kernel_log_is_critical_high() {
        let spec = with_kernel_log(DMESG_API_MISMATCH);
        let fs = diagnose_spec(&spec, &watched().cuinit(803, 0.1).opens(1));
        assert_eq!(fs[0].rule, "version_mismatch");
        let f = expect(
            &fs,
            "version_mismatch",
            Severity::Critical,
            Confidence::High,
        );
        assert!(evidence_from(f, "kernel log", DMESG).contains("API mismatch"));
        assert_eq!(
            evidence_from(f, "kernel module", "/proc/driver/nvidia/version"),
            DRIVER
        );
        evidence_from(f, "cuInit returned", "probe:cuInit");
        assert!(has_fix(f, Where::Host, "sudo reboot"));
    }

    #[test]
    fn version_mismatch_process_mapping_an_older_libcuda_is_critical_medium_from_static_evidence() {
        let spec = SnapshotSpec {
            processes: vec![ProcessSpec::python3(
                PID,
                &["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"],
            )],
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "version_mismatch",
            Severity::Critical,
            Confidence::Medium,
        );
        let lib = evidence_from(f, "libcuda mapped", "/proc/4242/maps");
        assert!(lib.contains("580.95.05"), "{lib}");
        assert!(has_fix(
            f,
            Where::Container,
            "grep libcuda /proc/<pid>/maps"
        ));
    }

    #[test]
    fn version_mismatch_804_with_a_compat_library_on_geforce_is_critical_high() {
        let spec = SnapshotSpec {
            smi: smi_h200(1, |g| {
                g.product_name = "NVIDIA GeForce RTX 4090".into();
                g.product_brand = "GeForce".into();
                g.fabric_state = None;
            }),
            nodes: standard_nodes(1, 508),
            processes: vec![ProcessSpec::python3(
                PID,
                &["/usr/local/cuda-13.1/compat/libcuda.so.595.45.04"],
            )],
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &watched().cuinit(804, 0.05).opens(2));
        let f = expect(
            &fs,
            "version_mismatch",
            Severity::Critical,
            Confidence::High,
        );
        assert!(evidence_from(f, "libcuda mapped", "/proc/4242/maps").contains("(forward-compat)"));
        assert!(evidence_from(f, "GPU brand", "nvidia-smi -q").starts_with("GeForce"));
        assert!(f
            .fix
            .iter()
            .any(|s| s.where_ == Where::Container && s.note.contains("forward-compatibility")));
    }

    #[test]
    fn version_mismatch_compat_library_newer_than_the_driver_on_a_datacenter_gpu_is_not_mismatch() {
        let spec = SnapshotSpec {
            processes: vec![ProcessSpec::python3(
                PID,
                &["/usr/local/cuda-13.1/compat/libcuda.so.595.45.04"],
            )],
            ..SnapshotSpec::default()
        };
        let e = snapshot_evidence(&spec);
        assert!(e
            .libcuda
            .get()
            .is_some_and(|l| l.iter().any(|m| m.compat && m.pid == PID)));
        absent(&diagnose(&e, &plain()), "version_mismatch");
        absent(
            &diagnose(&e, &watched().cuinit(0, 0.3).opens(4)),
            "version_mismatch",
        );
    }

    #[test]
    fn version_mismatch_compat_library_older_than_the_driver_on_a_datacenter_gpu_is_a_warning() {
        let spec = SnapshotSpec {
            processes: vec![ProcessSpec::python3(
                PID,
                &["/usr/local/cuda-12.8/compat/libcuda.so.570.86.15"],
            )],
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        expect(
            &fs,
            "version_mismatch",
            Severity::Warning,
            Confidence::Medium,
        );
    }

    #[test]
    fn version_mismatch_not_for_error_3_with_matching_versions_or_another_processs_library() {
        // Same version everywhere, error 3: not a mismatch.
        let same = SnapshotSpec {
            processes: vec![ProcessSpec::python3(
                PID,
                &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"],
            )],
            ..incident_spec()
        };
        absent(
            &diagnose_spec(&same, &register_gpu_no_memory()),
            "version_mismatch",
        );
        // An old library in some other process is not this process's problem.
        let other = SnapshotSpec {
            processes: vec![
                ProcessSpec::python3(PID, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
                ProcessSpec::python3(5151, &["/opt/old/libcuda.so.580.95.05"]),
            ],
            ..SnapshotSpec::default()
        };
        absent(
            &diagnose_spec(&other, &watched().cuinit(999, 0.2).opens(4)),
            "version_mismatch",
        );
    }
}

//! Rule `wsl2`: CUDA on Windows Subsystem for Linux 2 (one row of the rules table in
//! `docs/doctor.md`). There the GPU belongs to the Windows driver: Linux has no nvidia module,
//! no `/proc/driver/nvidia`, no `/dev/nvidia*`; it reaches the GPU through `/dev/dxg` with the
//! `libcuda.so*` the Windows driver mounts in `/usr/lib/wsl/lib`, and a Linux NVIDIA driver
//! installed inside the distribution shadows that library and breaks CUDA (NVIDIA, "CUDA on
//! WSL User Guide": "Once a Windows NVIDIA GPU driver is installed on the system, CUDA becomes
//! available within WSL 2 ... users must not install any NVIDIA GPU Linux driver within WSL
//! 2"). The module, node and version checks of the other rules do not apply there; this rule
//! checks what does.

use super::super::collect::wsl::{DXG, WSL_LIB};
use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, FixStep, Severity, Where};
use super::{cu, finding, item, push_cuinit, step, wsl2};

/// WSL2: a Linux libcuda mapped instead of WSL's, `/dev/dxg` missing, or no libcuda in
/// `/usr/lib/wsl/lib` (each high: the guide's own conditions), or a Linux driver's libcuda
/// installed but not seen mapped (medium), critical when CUDA was seen
/// failing and a warning otherwise; a `cuInit` failure without any of them is critical with
/// low confidence (the cause is on the Windows side, which uvmwatch cannot read). Never off
/// WSL2, and nothing on a WSL2 distribution where all of it holds and CUDA did not fail.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    if !wsl2(e) {
        return None;
    }
    let w = e.wsl.get().cloned().unwrap_or_default();
    let failed = o.cuinit_result.is_some_and(|r| r != cu::SUCCESS) || o.cuinit_in_flight;
    let linux_libs: Vec<String> = e
        .libcuda
        .get()
        .map(|l| {
            l.iter()
                .filter(|m| !m.path.starts_with(WSL_LIB))
                .map(|m| match &m.version {
                    Some(v) => format!("{} ({v}, pid {})", m.path, m.pid),
                    None => format!("{} (pid {})", m.path, m.pid),
                })
                .collect()
        })
        .unwrap_or_default();
    let severity = if failed {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let (confidence, title) = if !linux_libs.is_empty() {
        (
            Confidence::High,
            "WSL2: a Linux NVIDIA driver's libcuda is in use instead of WSL's: CUDA cannot \
             reach the Windows driver",
        )
    } else if !w.linux_libcuda.is_empty() {
        // Installed but not seen mapped: which copy a program loads depends on the linker
        // cache and its search path, so less sure than a mapped one.
        (
            Confidence::Medium,
            "WSL2: a Linux NVIDIA driver's libcuda is installed in the distribution: it can \
             shadow WSL's and CUDA then cannot reach the Windows driver",
        )
    } else if !w.dxg {
        (
            Confidence::High,
            "WSL2: no /dev/dxg: the GPU is not shared with this distribution",
        )
    } else if w.libcuda.is_empty() {
        (
            Confidence::High,
            "WSL2: no libcuda in /usr/lib/wsl/lib: the Windows NVIDIA driver gives this \
             distribution no CUDA",
        )
    } else if failed {
        (
            Confidence::Low,
            "WSL2: CUDA fails with WSL's own libcuda and /dev/dxg in place: the cause is on \
             the Windows side (driver, GPU)",
        )
    } else {
        return None;
    };
    let mut f = finding("wsl2", severity, confidence, title.to_string());
    if o.cuinit_result.is_some() {
        push_cuinit(&mut f, o);
    }
    for l in &linux_libs {
        f.evidence
            .push(item("libcuda mapped", l.clone(), e.libcuda.source.clone()));
    }
    for l in &w.linux_libcuda {
        f.evidence
            .push(item("libcuda installed", l.clone(), e.wsl.source.clone()));
    }
    f.evidence.push(item(
        DXG,
        if w.dxg {
            "present"
        } else {
            "absent: no GPU interface from Windows"
        },
        e.wsl.source.clone(),
    ));
    f.evidence.push(item(
        "WSL libcuda",
        if w.libcuda.is_empty() {
            format!("no libcuda* file in {WSL_LIB}")
        } else {
            w.libcuda.join(", ")
        },
        e.wsl.source.clone(),
    ));
    if let Some(k) = e.kernel.get() {
        f.evidence
            .push(item("kernel", k.release.clone(), e.kernel.source.clone()));
    }
    f.unchecked.push(
        "the Windows side (its NVIDIA driver version, the GPU): run nvidia-smi.exe on Windows"
            .to_string(),
    );
    let linux_lib = !linux_libs.is_empty() || !w.linux_libcuda.is_empty();
    f.fix = fix(linux_lib, w.dxg, !w.libcuda.is_empty());
    Some(f)
}

fn fix(linux_lib: bool, dxg: bool, wsl_lib: bool) -> Vec<FixStep> {
    let mut steps = Vec::new();
    if linux_lib {
        steps.push(step(
            Where::Any,
            "Remove the Linux NVIDIA driver from the distribution (NVIDIA: install the CUDA \
             toolkit's WSL-Ubuntu package or cuda-toolkit-<version>, never a package with a \
             driver) and rebuild the linker cache, so that WSL's libcuda is the one found.",
            &[
                "sudo apt-get remove --purge '^nvidia-.*' '^libnvidia-.*'",
                "sudo ldconfig",
                "ldconfig -p | grep libcuda",
            ],
        ));
    }
    if !dxg || !wsl_lib {
        steps.push(step(
            Where::Host,
            "On Windows: install a current NVIDIA driver with WSL support, make sure this \
             distribution runs as WSL 2 (not 1), and restart WSL.",
            &["wsl.exe -l -v", "wsl.exe --update", "wsl.exe --shutdown"],
        ));
    }
    steps.push(step(
        Where::Any,
        "Verify: WSL's nvidia-smi lists the GPU and only WSL's libcuda is found.",
        &[
            "/usr/lib/wsl/lib/nvidia-smi -L",
            "ldconfig -p | grep libcuda",
        ],
    ));
    steps
}

#[cfg(test)]
mod tests {
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::{Fact, MappedLibcuda, WslInfo};
    use crate::doctor::fixtures::*;

    fn wsl_host(dxg: bool, libs: &[&str], mapped: &[&str]) -> Evidence {
        let mut e = no_driver_host().kernel("5.15.153.1-microsoft-standard-WSL2");
        e.wsl = Fact::ok(
            WslInfo {
                dxg,
                libcuda: libs.iter().map(|l| l.to_string()).collect(),
                linux_libcuda: vec![],
            },
            WSL_LIB,
        );
        e.pci_gpus = Fact::ok(vec![], "/sys/bus/pci/devices");
        e.libcuda = Fact::ok(
            mapped
                .iter()
                .map(|p| MappedLibcuda {
                    pid: 42,
                    comm: "python3".into(),
                    path: p.to_string(),
                    version: p.rsplit_once(".so.").map(|(_, v)| v.to_string()),
                    compat: false,
                })
                .collect(),
            "/proc/*/maps",
        );
        e
    }

    const WSL_LIBCUDA: &str = "/usr/lib/wsl/lib/libcuda.so.1";

    #[test]
    fn wsl2_linux_driver_inside_wsl_is_critical_high_and_nothing_else_fires() {
        let e = wsl_host(
            true,
            &[WSL_LIBCUDA],
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"],
        );
        let fs = super::super::diagnose(&e, &watched().cuinit(100, 0.1));
        let f = expect(&fs, "wsl2", Severity::Critical, Confidence::High);
        assert!(f.fix_text().contains("apt-get remove"));
        assert_eq!(fs.len(), 1, "{fs:#?}");
    }

    #[test]
    fn wsl2_linux_driver_installed_but_not_seen_mapped_is_medium() {
        let mut e = wsl_host(true, &[WSL_LIBCUDA], &[]);
        if let Ok(w) = e.wsl.value.as_mut() {
            w.linux_libcuda = vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14".into()];
        }
        let fs = super::super::diagnose(&e, &plain());
        let f = expect(&fs, "wsl2", Severity::Warning, Confidence::Medium);
        assert!(f.fix_text().contains("apt-get remove"));
        // The same distribution without it: nothing to say while CUDA was not seen failing.
        let fs = super::super::diagnose(&wsl_host(true, &[WSL_LIBCUDA], &[]), &plain());
        absent(&fs, "wsl2");
    }

    #[test]
    fn wsl2_missing_dxg_or_library_and_blind_failure() {
        let fs = super::super::diagnose(&wsl_host(false, &[WSL_LIBCUDA], &[]), &plain());
        expect(&fs, "wsl2", Severity::Warning, Confidence::High);
        let fs = super::super::diagnose(&wsl_host(true, &[], &[]), &watched().cuinit(100, 0.1));
        expect(&fs, "wsl2", Severity::Critical, Confidence::High);
        let fs = super::super::diagnose(
            &wsl_host(true, &[WSL_LIBCUDA], &[WSL_LIBCUDA]),
            &watched().cuinit(999, 0.2),
        );
        let f = expect(&fs, "wsl2", Severity::Critical, Confidence::Low);
        assert!(f.tell_apart.is_some());
    }

    #[test]
    fn wsl2_near_misses_working_wsl_and_a_linux_host() {
        // CUDA works with WSL's library: nothing, and no "no driver" either.
        let e = wsl_host(true, &[WSL_LIBCUDA], &[WSL_LIBCUDA]);
        let fs = super::super::diagnose(&e, &watched().cuinit(0, 0.4));
        assert!(fs.is_empty(), "{fs:#?}");
        assert!(super::super::no_driver(&e).is_none());
        // A Linux host is never WSL2.
        absent(
            &super::super::diagnose(&healthy_open_host(), &watched().cuinit(100, 0.1)),
            "wsl2",
        );
    }
}

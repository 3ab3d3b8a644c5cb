//! Rule `node_or_module_missing`: nvidia_uvm not loaded or an NVIDIA device node missing (one row
//! of the rules table in `docs/doctor.md`); [`check`] says when it applies, and its tests go from
//! evidence built in code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, EvidenceItem, Finding, Severity, Where};
use super::{
    container_kind, cu, cuinit_is, finding, host_only_note, item, no_driver, probe_unavailable,
    push_cuinit, push_cuinit_unchecked, quick, step, unknown, wsl2, SRC_CUINIT, SRC_OPENAT,
};

/// Errnos of an `open()` of a node that is missing or has no driver behind it.
const MISSING_ERRNOS: &[&str] = &["ENOENT", "ENXIO", "ENODEV"];

/// Whether a missing node follows from a stronger cause on this host (its
/// [`Rule::yield_when`](super::Rule::yield_when)): the nvidia module is not loaded at all
/// (refused, or no GPU to drive: every node is missing because of it), or this container was
/// given no NVIDIA node at all (no GPU given to it). With the driver loaded, a missing
/// `/dev/nvidia-uvm` is a problem of its own (nvidia_uvm not loaded, its node not made),
/// named beside a GPU-less driver, not hidden behind it.
pub(super) fn explained_by_an_absent_driver(e: &Evidence) -> bool {
    let no_nodes_in_container =
        container_kind(e).is_some() && e.dev_nodes.get().is_some_and(|n| n.is_empty());
    !super::nvidia_loaded(e) || no_nodes_in_container
}

/// Node or module missing: `nvidia_uvm` not loaded, or its node not created or not passed
/// into the container. Observed: an `openat` of a `/dev/nvidia*` node returning `ENOENT`
/// (or `ENXIO`/`ENODEV`: a node with no driver behind it). Static: `/proc/modules`,
/// `/proc/devices` and `/dev` disagree.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    // WSL2 has neither the module nor the nodes: CUDA uses /dev/dxg there (rule `wsl2`).
    if wsl2(e) {
        return None;
    }
    let missing: Vec<&(String, String)> = o
        .failed_opens
        .iter()
        .filter(|(_, err)| MISSING_ERRNOS.contains(&err.as_str()))
        .collect();
    let modules = e.modules.get();
    let nvidia_loaded = modules.map(|m| m.iter().any(|n| n == "nvidia"));
    let uvm_loaded = modules.map(|m| m.iter().any(|n| n == "nvidia_uvm"));
    let uvm_major = e.devices.get().and_then(|d| d.get("nvidia-uvm")).copied();
    let has_node = |p: &str| e.dev_nodes.get().map(|n| n.iter().any(|d| d.path == p));
    let container = container_kind(e);
    let driver_present = no_driver(e).is_none();

    // Static: what is missing, if anything. /proc/modules is global, so a container sees
    // the host's modules; its /dev is its own.
    let mut gaps: Vec<EvidenceItem> = Vec::new();
    if driver_present && nvidia_loaded != Some(false) {
        match uvm_loaded {
            Some(false) => gaps.push(item("nvidia_uvm", "not loaded", e.modules.source.clone())),
            None if e.devices.get().is_some() && uvm_major.is_none() => gaps.push(item(
                "nvidia-uvm",
                "no character major registered",
                e.devices.source.clone(),
            )),
            _ => {}
        }
        for node in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
            if has_node(node) == Some(false) {
                gaps.push(item(node, "absent", e.dev_nodes.source.clone()));
            }
        }
    }
    let works = o.cuinit_result == Some(cu::SUCCESS);
    if missing.is_empty() && (gaps.is_empty() || works) {
        return None;
    }
    let gap_list = gaps
        .iter()
        .map(|g| format!("{} {}", g.what, g.value))
        .collect::<Vec<_>>()
        .join(", ");

    let (severity, confidence, title) = if let Some((path, err)) = missing.first() {
        let title = if driver_present {
            format!("{path} is missing: open() returned {err}")
        } else {
            format!("no NVIDIA driver loaded: open({path}) returned {err}")
        };
        (Severity::Critical, Confidence::High, title)
    } else if container.is_some() {
        (
            Severity::Critical,
            Confidence::Medium,
            format!("{gap_list}: CUDA cannot start in this container"),
        )
    } else {
        // On a host, CUDA loads nvidia_uvm and creates the nodes through the setuid
        // nvidia-modprobe on first use.
        (
            Severity::Warning,
            Confidence::Low,
            format!("{gap_list}: CUDA relies on nvidia-modprobe to fix this on first use"),
        )
    };
    let mut f = finding("node_or_module_missing", severity, confidence, title);
    for (path, err) in &missing {
        f.evidence
            .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
    }
    push_cuinit(&mut f, o);
    if cuinit_is(o, &[cu::UNKNOWN, cu::NO_DEVICE]) && quick(o) {
        f.evidence.push(item(
            "cuInit",
            "failed quickly, as with a missing node",
            SRC_CUINIT,
        ));
    }
    f.evidence.extend(gaps);
    if let Some(why) = no_driver(e) {
        f.evidence.push(item("driver", "not present", why));
    }
    if let Some(kind) = container {
        f.evidence
            .push(item("runs in", kind, e.container.source.clone()));
    }
    f.unchecked.extend(
        [
            unknown(&e.modules, "loaded modules"),
            unknown(&e.dev_nodes, "device nodes"),
        ]
        .into_iter()
        .flatten(),
    );
    if missing.is_empty() {
        if let Some(why) = probe_unavailable(o, "openat") {
            f.unchecked.push(format!("device opens not seen: {why}"));
        }
        push_cuinit_unchecked(&mut f, o);
    }

    if !driver_present {
        f.fix.push(step(
            Where::Host,
            format!(
                "Load (or install) the NVIDIA driver; the version file must exist afterwards.{}",
                host_only_note(e)
            ),
            &["sudo modprobe nvidia", "cat /proc/driver/nvidia/version"],
        ));
    }
    f.fix.push(step(
        Where::Host,
        format!(
            "Load nvidia_uvm and create /dev/nvidia-uvm and /dev/nvidia-uvm-tools with the \
             current major (nvidia-modprobe is what CUDA runs on first use).{}",
            host_only_note(e)
        ),
        &["sudo modprobe nvidia_uvm", "sudo nvidia-modprobe -u -c 0"],
    ));
    if container.is_some() {
        f.fix.push(step(
            Where::Host,
            "Pass every node into the container: with the NVIDIA Container Toolkit use \
             `--gpus` / the nvidia runtime or CDI; by hand, as below. Recreate the container \
             after the host nodes exist.",
            &["docker run --device /dev/nvidiactl --device /dev/nvidia0 --device /dev/nvidia-uvm --device /dev/nvidia-uvm-tools <image>"],
        ));
    }
    f.fix.push(step(
        Where::Any,
        "Verify: the nodes exist and nvidia-uvm has a major.",
        &["ls -l /dev/nvidia*", "grep nvidia /proc/devices"],
    ));
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
    fn node_or_module_missing_node_from_enoent() {
        let o = watched()
            .cuinit(999, 0.004)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let e = healthy_open_host().without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-modprobe -u -c 0"));
        assert_eq!(run("device_permission", &e, &o), None);
    }

    #[test]
    fn node_or_module_missing_node_in_container_from_static_evidence() {
        let e = healthy_open_host()
            .container("docker", None)
            .without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        assert!(has_fix(&f, Where::Host, "--device /dev/nvidia-uvm"));
        // On the host nvidia-modprobe creates it on first use: only a low warning.
        let host = healthy_open_host().without_node("/dev/nvidia-uvm");
        let f = run("node_or_module_missing", &host, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Warning, Confidence::Low)
        );
        // ...and none once cuInit is seen working.
        let ok = watched().cuinit(0, 0.4).opens(4);
        assert_eq!(run("node_or_module_missing", &host, &ok), None);
    }

    #[test]
    fn node_or_module_missing_driver_when_a_process_tries() {
        let o = watched()
            .cuinit(100, 0.002)
            .failed_open("/dev/nvidiactl", "ENOENT");
        let f = run("node_or_module_missing", &no_driver_host(), &o).expect("finding");
        assert!(f.title.contains("no NVIDIA driver"), "{}", f.title);
        assert!(has_fix(&f, Where::Host, "modprobe nvidia"));
    }

    #[test]
    fn node_or_module_missing_not_for_eperm() {
        let o = watched()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        assert_eq!(
            run("node_or_module_missing", &healthy_open_host(), &o),
            None
        );
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn node_or_module_missing_uvm_node_enoent_with_module_unloaded_is_critical_high() {
        let spec = SnapshotSpec {
            uvm_loaded: false,
            nodes: nodes_without("/dev/nvidia-uvm")
                .into_iter()
                .filter(|n| n.path != "/dev/nvidia-uvm-tools")
                .collect(),
            ..SnapshotSpec::default()
        };
        let o = watched()
            .cuinit(999, 0.004)
            .opens(1)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let fs = diagnose_spec(&spec, &o);
        let f = expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "open", "probe:openat"),
            "/dev/nvidia-uvm: ENOENT"
        );
        assert_eq!(
            evidence_from(f, "nvidia_uvm", "/proc/modules"),
            "not loaded"
        );
        assert_eq!(
            evidence_from(f, "/dev/nvidia-uvm", "/dev/nvidia*"),
            "absent"
        );
        evidence_from(f, "cuInit", "probe:cuInit");
        assert!(has_fix(f, Where::Host, "nvidia-modprobe -u -c 0"));
        // ENOENT is not a permission problem.
        absent(&fs, "device_permission");
    }

    #[test]
    fn node_or_module_missing_uvm_node_in_docker_from_static_evidence_is_critical_medium() {
        let spec = SnapshotSpec {
            container: ContainerSpec::Docker,
            nodes: nodes_without("/dev/nvidia-uvm"),
            ..SnapshotSpec::default()
        };
        let e = snapshot_evidence(&spec);
        let fs = diagnose(&e, &plain());
        let f = expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "/dev/nvidia-uvm", "/dev/nvidia*"),
            "absent"
        );
        assert_eq!(evidence_from(f, "runs in", &e.container.source), "docker");
        assert!(has_fix(f, Where::Host, "--device /dev/nvidia-uvm"));
    }

    #[test]
    fn node_or_module_missing_uvm_module_on_the_host_from_static_evidence_is_only_a_low_warning() {
        let spec = SnapshotSpec {
            uvm_loaded: false,
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "node_or_module_missing",
            Severity::Warning,
            Confidence::Low,
        );
        assert_eq!(
            evidence_from(f, "nvidia_uvm", "/proc/modules"),
            "not loaded"
        );
        // ...and none once cuInit is seen working (nvidia-modprobe loaded it).
        absent(
            &diagnose_spec(&spec, &watched().cuinit(0, 0.4).opens(4)),
            "node_or_module_missing",
        );
    }

    #[test]
    fn node_or_module_missing_driver_entirely_when_a_process_opens_nvidiactl() {
        let spec = SnapshotSpec {
            driver: None,
            uvm_loaded: false,
            nodes: Vec::new(),
            smi: None,
            dmesg: Some("[    0.000000] Linux version 6.8.0-45-generic\n".into()),
            daemons: Vec::new(),
            ..SnapshotSpec::default()
        };
        let o = watched()
            .cuinit(100, 0.002)
            .failed_open("/dev/nvidiactl", "ENOENT");
        let fs = diagnose_spec(&spec, &o);
        let f = expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("no NVIDIA driver"), "{}", f.title);
        assert!(has_fix(f, Where::Host, "modprobe nvidia"));
        // A plain doctor on a machine without any driver claims nothing.
        assert_eq!(
            rules_of(&diagnose_spec(&spec, &plain())),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn node_or_module_missing_not_for_eperm_on_a_present_node() {
        let o = watched()
            .cuinit(999, 0.003)
            .opens(2)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        let fs = diagnose_spec(&SnapshotSpec::default(), &o);
        absent(&fs, "node_or_module_missing");
        expect(
            &fs,
            "device_permission",
            Severity::Critical,
            Confidence::High,
        );
    }
}

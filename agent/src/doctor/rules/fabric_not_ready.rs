//! Rule `fabric_not_ready`: NVSwitch fabric not ready (Fabric Manager) (one row of the rules table
//! in `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in
//! code to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{
    container_kind, cu, cuinit_is, driver, finding, host_daemon, host_only_note, item, push_cuinit,
    smi, step, unknown,
};

/// Fabric not ready: an NVSwitch system without a running Fabric Manager. Needs NVSwitch
/// evidence (`/dev/nvidia-nvswitch*`, or a fabric state other than `N/A` in `nvidia-smi -q`):
/// without NVSwitch, 802 points elsewhere. Signals: `cuInit` 802 (later processes 304), fabric
/// state not `Completed`, no `nv-fabricmanager` process.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    let switch_nodes = e.nvswitch_nodes.get();
    let states: Vec<&String> = smi(e)
        // "" for a GPU without a Fabric section (older drivers), N/A without NVSwitch;
        // NVML's NOT_SUPPORTED fabric state reads "Not Supported": no NVSwitch either.
        .map(|s| {
            s.fabric_state
                .iter()
                .filter(|x| {
                    !x.is_empty()
                        && !x.eq_ignore_ascii_case("N/A")
                        && !x.eq_ignore_ascii_case("Not Supported")
                })
                .collect()
        })
        .unwrap_or_default();
    // Fourth-generation NVSwitch systems have no /dev/nvidia-nvswitch* nodes: only a
    // fabric state from nvidia-smi rules NVSwitch out.
    let nvswitch = if switch_nodes.is_some_and(|n| !n.is_empty()) || !states.is_empty() {
        Some(true)
    } else if smi(e).is_some() {
        Some(false)
    } else {
        None
    };
    // A driver with no GPU at all (an NVSwitch-only node, or GPUs not there) has no fabric
    // to wait for: that is `no_gpu`, and Fabric Manager would not help.
    let no_gpu_registered = e.gpus.get().is_some_and(|g| g.is_empty());
    if nvswitch == Some(false) || o.cuinit_result == Some(cu::SUCCESS) || no_gpu_registered {
        return None;
    }
    let code = cuinit_is(o, &[cu::SYSTEM_NOT_READY, cu::OPERATING_SYSTEM]);
    let incomplete = states.iter().any(|s| *s != "Completed");
    let fm = host_daemon(e, "nv-fabricmanager");
    // Every GPU registered with the fabric: ready, whether or not the manager is seen.
    let complete = !states.is_empty() && !incomplete;
    let problem = incomplete || (fm == Some(false) && !complete);

    let confidence = match nvswitch {
        None if code => Confidence::Low,
        None => return None,
        Some(_) if code && problem => Confidence::High,
        Some(_) if incomplete && fm == Some(false) => Confidence::High,
        Some(_) if problem => Confidence::Medium,
        // NVSwitch and the code, but nothing known about the fabric.
        Some(_) if code && fm.is_none() && states.is_empty() => Confidence::Low,
        Some(_) => return None,
    };
    let title = if code {
        format!(
            "cuInit returned {} on an NVSwitch system whose fabric is not ready",
            o.cuinit_result.unwrap_or_default()
        )
    } else {
        "NVSwitch fabric not ready: CUDA will fail with 802".to_string()
    };
    let mut f = finding("fabric_not_ready", Severity::Critical, confidence, title);
    push_cuinit(&mut f, o);
    if let Some(n) = switch_nodes.filter(|n| !n.is_empty()) {
        f.evidence.push(item(
            "NVSwitch nodes",
            n.join(", "),
            e.nvswitch_nodes.source.clone(),
        ));
    }
    if !states.is_empty() {
        let v: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        f.evidence
            .push(item("fabric state", v.join(", "), e.smi.source.clone()));
    }
    if let Some(kind) = container_kind(e) {
        f.unchecked.push(format!(
            "whether nv-fabricmanager runs: it runs on the host, and this is a container ({kind})"
        ));
    }
    match fm {
        Some(false) => f.evidence.push(item(
            "nv-fabricmanager",
            "not running",
            e.daemons.source.clone(),
        )),
        Some(true) => f.evidence.push(item(
            "nv-fabricmanager",
            "running",
            e.daemons.source.clone(),
        )),
        None => {}
    }
    f.unchecked.extend(
        [
            unknown(&e.nvswitch_nodes, "NVSwitch nodes"),
            unknown(&e.smi, "fabric state (nvidia-smi -q)"),
            unknown(&e.daemons, "running Fabric Manager"),
        ]
        .into_iter()
        .flatten(),
    );
    let ver = driver(e)
        .map(|d| d.version.clone())
        .unwrap_or_else(|| "the driver's".into());
    f.fix = vec![
        step(
            Where::Host,
            format!(
                "Start NVIDIA Fabric Manager. It must be the same version as the driver ({ver}): \
                 install the nvidia-fabricmanager package of that exact version.{}",
                host_only_note(e)
            ),
            &[
                "sudo systemctl enable --now nvidia-fabricmanager",
                "systemctl status nvidia-fabricmanager",
            ],
        ),
        step(
            Where::Any,
            "Verify: every GPU's fabric state must be Completed before CUDA starts.",
            &["nvidia-smi -q | grep -A 3 -i fabric"],
        ),
    ];
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::facts::Fact;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    fn nvswitch_host() -> Evidence {
        healthy_open_host()
            .with(|e| {
                e.nvswitch_nodes = Fact::ok(
                    vec![
                        "/dev/nvidia-nvswitch0".into(),
                        "/dev/nvidia-nvswitch1".into(),
                    ],
                    "/dev/nvidia-nvswitch*",
                )
            })
            .smi(|s| {
                s.gpus = 8;
                s.fabric_state = vec!["In Progress".into(); 8];
            })
            .daemons(&["nvidia-persistenced"])
    }

    #[test]
    fn fabric_not_ready_802_on_nvswitch() {
        let o = watched().cuinit(802, 0.8).opens(10);
        let f = run("fabric_not_ready", &nvswitch_host(), &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-fabricmanager"));
        // Static: fabric not started and no manager.
        let f = run("fabric_not_ready", &nvswitch_host(), &plain()).expect("finding");
        assert_eq!(f.confidence, Confidence::High);
    }

    #[test]
    fn fabric_not_ready_not_without_nvswitch() {
        let o = watched().cuinit(802, 0.8).opens(4);
        assert_eq!(run("fabric_not_ready", &healthy_open_host(), &o), None);
        // Fabric complete: ready, even where the manager is not seen (a container, or a
        // manager outside this PID namespace).
        let complete = nvswitch_host().smi(|s| s.fabric_state = vec!["Completed".into(); 8]);
        assert_eq!(run("fabric_not_ready", &complete, &plain()), None);
        // Older drivers print no Fabric section ("" per GPU): not NVSwitch evidence.
        let old = healthy_open_host().smi(|s| s.fabric_state = vec!["".into()]);
        assert_eq!(run("fabric_not_ready", &old, &o), None);
        // NVSwitch, fabric complete, manager running: fine.
        let ready = nvswitch_host()
            .smi(|s| s.fabric_state = vec!["Completed".into(); 8])
            .daemons(&["nv-fabricmanager"]);
        assert_eq!(run("fabric_not_ready", &ready, &plain()), None);
        assert_eq!(run("fabric_not_ready", &ready, &o), None);
        // 802 where nothing tells whether NVSwitch is there: low, and it says why.
        let blind = healthy_open_host()
            .with(|e| e.smi = Fact::unavailable("nvidia-smi not present", "nvidia-smi -q"));
        let f = run("fabric_not_ready", &blind, &o).expect("finding");
        assert_eq!(f.confidence, Confidence::Low);
        assert!(unchecked_mentions(&f, "nvidia-smi not present"));
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    /// An HGX board whose NVSwitch fabric is still being set up, without a Fabric Manager.
    fn nvswitch_not_ready() -> SnapshotSpec {
        let mut nodes = standard_nodes(2, 508);
        nodes.push(NodeSpec::char("/dev/nvidia-nvswitch0", 234, 0));
        nodes.push(NodeSpec::char("/dev/nvidia-nvswitch1", 234, 1));
        SnapshotSpec {
            smi: smi_h200(2, |g| g.fabric_state = Some("In Progress".into())),
            nodes,
            ..SnapshotSpec::default()
        }
    }

    #[test]
    fn fabric_not_ready_802_on_nvswitch_without_fabric_manager_is_critical_high() {
        let e = snapshot_evidence(&nvswitch_not_ready());
        let fs = diagnose(&e, &watched().cuinit(802, 0.8).opens(6));
        assert_eq!(fs[0].rule, "fabric_not_ready");
        let f = expect(
            &fs,
            "fabric_not_ready",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "NVSwitch nodes", "/dev/nvidia-nvswitch*"),
            "/dev/nvidia-nvswitch0, /dev/nvidia-nvswitch1"
        );
        assert_eq!(
            evidence_from(f, "fabric state", "nvidia-smi -q"),
            "In Progress, In Progress"
        );
        assert_eq!(
            evidence_from(f, "nv-fabricmanager", &e.daemons.source),
            "not running"
        );
        evidence_from(f, "cuInit returned", "probe:cuInit");
        assert!(has_fix(f, Where::Host, "nvidia-fabricmanager"));
        // A later process gets 304: the same cause.
        let fs = diagnose(&e, &watched().cuinit(304, 0.5).opens(6));
        expect(
            &fs,
            "fabric_not_ready",
            Severity::Critical,
            Confidence::High,
        );
    }

    #[test]
    fn fabric_not_ready_in_progress_without_manager_from_static_evidence_is_critical_high() {
        let fs = diagnose_spec(&nvswitch_not_ready(), &plain());
        let f = expect(
            &fs,
            "fabric_not_ready",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.title.contains("802"), "{}", f.title);
    }

    #[test]
    fn fabric_not_ready_802_on_a_machine_without_nvswitch_is_not_fabric_not_ready() {
        let o = watched().cuinit(802, 0.8).opens(4);
        // PCIe GPUs: no Fabric section at all, no NVSwitch nodes.
        let pcie = SnapshotSpec {
            smi: smi_h200(2, |g| g.fabric_state = None),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&pcie, &o), "fabric_not_ready");
        // Fabric state N/A: no NVSwitch either.
        let na = SnapshotSpec {
            smi: smi_h200(2, |g| g.fabric_state = Some("N/A".into())),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&na, &o), "fabric_not_ready");
    }

    #[test]
    fn fabric_not_ready_not_when_completed_with_manager_running_or_cuinit_works() {
        let o = watched().cuinit(802, 0.8).opens(6);
        // Completed and the manager running.
        let ready = SnapshotSpec {
            smi: smi_h200(2, |_| {}),
            daemons: vec!["nvidia-persistenced".into(), "nv-fabricmanager".into()],
            ..nvswitch_not_ready()
        };
        absent(&diagnose_spec(&ready, &plain()), "fabric_not_ready");
        absent(&diagnose_spec(&ready, &o), "fabric_not_ready");
        // Completed, manager not seen (it may run outside this PID namespace): ready anyway.
        let complete = SnapshotSpec {
            smi: smi_h200(2, |_| {}),
            ..nvswitch_not_ready()
        };
        absent(&diagnose_spec(&complete, &plain()), "fabric_not_ready");
        // cuInit works: whatever the fabric says, it is not failing CUDA.
        absent(
            &diagnose_spec(&nvswitch_not_ready(), &watched().cuinit(0, 0.4).opens(6)),
            "fabric_not_ready",
        );
    }

    #[test]
    fn fabric_not_ready_not_on_an_nvswitch_node_whose_driver_has_no_gpu() {
        // NVSwitch nodes, no manager, 802 even: with no GPU registered there is no fabric to
        // wait for (no_gpu says what is wrong).
        let e = nvswitch_host().with(|e| e.gpus = Fact::ok(vec![], "/proc/driver/nvidia/gpus"));
        assert_eq!(run("fabric_not_ready", &e, &plain()), None);
        let o = watched().cuinit(802, 0.8).opens(3);
        assert_eq!(run("fabric_not_ready", &e, &o), None);
        // The list unreadable: judged as before.
        let blind = nvswitch_host()
            .with(|e| e.gpus = Fact::unavailable("not readable", "/proc/driver/nvidia/gpus"));
        assert!(run("fabric_not_ready", &blind, &o).is_some());
    }

    #[test]
    fn fabric_not_ready_802_without_nvidia_smi_is_low_and_says_why() {
        let spec = SnapshotSpec {
            smi: None,
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &watched().cuinit(802, 0.8).opens(4));
        let f = expect(&fs, "fabric_not_ready", Severity::Critical, Confidence::Low);
        assert!(unchecked_mentions(f, "nvidia-smi"), "{:?}", f.unchecked);
    }
}

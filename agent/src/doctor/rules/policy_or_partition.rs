//! Rule `policy_or_partition`: compute mode or MIG refuses the work (one row of the rules table in
//! `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built in code
//! to snapshot trees read back by the collectors.

use super::super::facts::{Evidence, Observations, SmiInfo};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{cu, finding, host_only_note, item, observed, push_cuinit, smi, step, unknown};

/// The context creations probed (`cuDeviceGetCount` is the sixth context-and-device probe).
const CONTEXT_CREATIONS: [&str; 5] = [
    "cuCtxCreate",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuDevicePrimaryCtxRetain",
];

/// `cuDeviceGetCount`.
const DEVICE_GET_COUNT: &str = "cuDeviceGetCount";

/// Source label of what the uprobe of a context or device call saw: `probe:<call>`.
fn src(call: &str) -> String {
    format!("probe:{call}")
}

/// The GPUs a process has, for its device count to be held against, when its count
/// (`cuDeviceGetCount`) is below them: the GPU nodes (`/dev/nvidia<N>`) it sees in its own
/// root (what its container was given: `NVIDIA_VISIBLE_DEVICES`, the device cgroup); when
/// those were not read (the process was gone, a snapshot without them), the GPUs
/// `nvidia-smi` lists, but only with MIG on (a host's GPU count says nothing of what one
/// container was given). CUDA enumerates one device per GPU it may use, fewer under
/// `CUDA_VISIBLE_DEVICES`, and with MIG on one per MIG device (a GPU instance with a compute
/// instance) in place of the GPU, none for a GPU without one. More devices than GPUs is MIG
/// partitioning at work, not this class.
pub fn device_count_disagrees(
    smi: Option<&SmiInfo>,
    gpu_nodes: Option<u32>,
    count: i32,
) -> Option<u32> {
    let gpus = gpu_nodes.filter(|&n| n > 0).or_else(|| {
        smi.filter(|s| s.mig_mode.iter().any(|m| m == "Enabled"))
            .map(|s| s.gpus)
            .filter(|&g| g > 0)
    })?;
    (i64::from(count) < i64::from(gpus)).then_some(gpus)
}

/// How many devices a `CUDA_VISIBLE_DEVICES` value names (comma-separated indexes or
/// UUIDs; CUDA stops at the first invalid entry, which is not checked here).
fn visible_entries(v: &str) -> usize {
    v.split(',').filter(|e| !e.trim().is_empty()).count()
}

/// Policy or partition: CUDA starts but the GPU refuses the work: a compute mode of
/// `Prohibited` or `Exclusive_Process` held by another process (CUDA error 46 from
/// `cuInit` or, live, from a context creation: `cuCtxCreate*`, `cuDevicePrimaryCtxRetain`),
/// or MIG on with no MIG device visible to CUDA (`cuInit` 100 with every open succeeding)
/// or fewer CUDA devices than GPUs (`cuDeviceGetCount` against `nvidia-smi -q`). Static
/// only for `Prohibited`: an exclusive GPU held by one process, or MIG on, is a deliberate
/// set-up until something fails.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    let s = smi(e);
    let modes = s.map(|s| s.compute_mode.as_slice()).unwrap_or(&[]);
    let prohibited = modes.iter().filter(|m| *m == "Prohibited").count();
    let exclusive = modes.iter().filter(|m| m.starts_with("Exclusive")).count();
    let mig_on = s.is_some_and(|s| s.mig_mode.iter().any(|m| m == "Enabled"));
    let others: Vec<u32> = e
        .libcuda
        .get()
        .map(|l| {
            l.iter()
                .map(|m| m.pid)
                .filter(|p| Some(*p) != o.pid)
                .collect()
        })
        .unwrap_or_default();
    // The context creation that returned 46, if that is what was seen.
    let ctx46 = o.context_call.as_deref().filter(|c| {
        CONTEXT_CREATIONS.contains(c) && o.context_result == Some(cu::DEVICE_UNAVAILABLE)
    });
    let code46 = o.cuinit_result == Some(cu::DEVICE_UNAVAILABLE) || ctx46.is_some();
    let what46 = ctx46.unwrap_or("cuInit");
    let holder = exclusive > 0 && !others.is_empty();
    let mig100 = mig_on
        && o.cuinit_result == Some(cu::NO_DEVICE)
        && o.failed_opens.is_empty()
        && o.device_opens > 0;
    // A successful count below the GPUs the process has (a failed one has no count).
    let count_off = o
        .device_count_seen
        .filter(|_| {
            o.context_call.as_deref() != Some(DEVICE_GET_COUNT)
                || o.context_result == Some(cu::SUCCESS)
        })
        .and_then(|c| device_count_disagrees(s, o.gpu_nodes_visible, c).map(|g| (c, g)));
    let cvd = o.cuda_visible_devices.as_deref();
    // A context creation on a device past the count CUDA gave the process.
    let past_count = o
        .context_call
        .as_deref()
        .filter(|c| CONTEXT_CREATIONS.contains(c) && o.context_result == Some(cu::INVALID_DEVICE))
        .zip(o.context_device.zip(o.device_count_seen))
        .filter(|(_, (d, n))| d >= n)
        .map(|(c, (d, n))| (c, d, n));

    let (severity, confidence, title) = if code46 && (prohibited > 0 || holder) {
        (
            Severity::Critical,
            Confidence::High,
            format!("CUDA error 46 from {what46}: the GPU's compute mode refuses this process"),
        )
    } else if code46 && exclusive > 0 {
        (
            Severity::Critical,
            Confidence::Medium,
            format!(
                "CUDA error 46 from {what46} with compute mode Exclusive_Process: another process \
                 holds the GPU (none seen with libcuda mapped)"
            ),
        )
    } else if code46 && mig_on {
        // MIG on with no GPU instance (or none given to the process): CUDA has no device it
        // may use and answers "all CUDA-capable devices are busy or unavailable"
        // (NVIDIA/gpu-operator#129 and #132: "there are no devices configured").
        (
            Severity::Critical,
            Confidence::Medium,
            format!(
                "CUDA error 46 from {what46} with MIG on: no MIG device exists or none was \
                 given to this process"
            ),
        )
    } else if code46 && s.is_none() {
        (
            Severity::Critical,
            Confidence::Low,
            format!(
                "CUDA error 46 (device unavailable) from {what46}; the compute mode could not be read"
            ),
        )
    } else if mig100 {
        (
            Severity::Critical,
            Confidence::Medium,
            "cuInit returned 100 with MIG on: CUDA sees MIG devices only".to_string(),
        )
    } else if let Some((call, device, n)) = past_count {
        (
            Severity::Critical,
            Confidence::High,
            format!(
                "{call} on device {device} returned 101 (CUDA_ERROR_INVALID_DEVICE): CUDA gave \
                 this process {n} device(s)"
            ),
        )
    } else if let Some((count, gpus)) = count_off {
        if count <= 0 {
            (
                Severity::Critical,
                Confidence::Medium,
                format!("cuDeviceGetCount found no device where the process has {gpus} GPU(s)"),
            )
        } else if mig_on {
            (
                Severity::Warning,
                Confidence::Medium,
                format!(
                    "CUDA sees {count} device(s) where the process has {gpus} GPU(s) with MIG on: \
                     CUDA enumerates MIG devices, not the GPUs"
                ),
            )
        } else if let Some(v) = cvd.filter(|v| visible_entries(v) <= count as usize) {
            (
                Severity::Info,
                Confidence::High,
                format!(
                    "CUDA_VISIBLE_DEVICES={v} narrows the process to {count} of its {gpus} GPU(s)"
                ),
            )
        } else {
            (
                Severity::Warning,
                Confidence::Low,
                format!(
                    "CUDA sees {count} device(s) where the process has {gpus} GPU(s): a GPU CUDA \
                     cannot use, or a partition set after start"
                ),
            )
        }
    } else if !observed(o) && prohibited > 0 {
        (
            if prohibited == modes.len() {
                Severity::Critical
            } else {
                Severity::Warning
            },
            Confidence::Medium,
            format!("compute mode Prohibited on {prohibited} GPU(s): no CUDA context can be created there"),
        )
    } else {
        return None;
    };
    let about_mig = (code46 && mig_on && prohibited == 0 && exclusive == 0)
        || (!code46 && (mig100 || (mig_on && count_off.is_some())));
    let about_count = !code46 && !about_mig && (count_off.is_some() || past_count.is_some());
    let mut f = finding("policy_or_partition", severity, confidence, title);
    push_cuinit(&mut f, o);
    if let (Some(call), Some(r)) = (o.context_call.as_deref(), o.context_result) {
        let what = if call == DEVICE_GET_COUNT {
            "device count"
        } else {
            "context creation"
        };
        f.evidence
            .push(item(what, context_text(o, call, r), src(call)));
    }
    let pid = o
        .pid
        .map(|p| p.to_string())
        .unwrap_or_else(|| "<pid>".into());
    if count_off.is_some() || past_count.is_some() {
        if let Some(n) = o.gpu_nodes_visible {
            f.evidence.push(item(
                "GPU nodes the process sees",
                n.to_string(),
                format!("/proc/{pid}/root/dev"),
            ));
        }
        if let Some(s) = s {
            f.evidence.push(item(
                "GPUs (nvidia-smi)",
                format!(
                    "{} ({} with MIG on)",
                    s.gpus,
                    s.mig_mode.iter().filter(|m| *m == "Enabled").count()
                ),
                e.smi.source.clone(),
            ));
        }
        if let Some(v) = cvd {
            f.evidence.push(item(
                "CUDA_VISIBLE_DEVICES",
                v,
                format!("/proc/{pid}/environ"),
            ));
        }
    }
    if !modes.is_empty() {
        f.evidence
            .push(item("compute mode", modes.join(", "), e.smi.source.clone()));
    }
    // A GPU without MIG prints `N/A`: no fact, so not cited.
    let mig: Vec<&str> = s
        .map(|s| {
            s.mig_mode
                .iter()
                .map(String::as_str)
                .filter(|m| *m != "N/A")
                .collect()
        })
        .unwrap_or_default();
    if !mig.is_empty() {
        f.evidence
            .push(item("MIG mode", mig.join(", "), e.smi.source.clone()));
    }
    if exclusive > 0 && !others.is_empty() {
        let v: Vec<String> = others.iter().map(u32::to_string).collect();
        f.evidence.push(item(
            "other CUDA processes (pid)",
            v.join(", "),
            e.libcuda.source.clone(),
        ));
    }
    if let Some(s) = unknown(&e.smi, "compute and MIG mode (nvidia-smi -q)") {
        f.unchecked.push(s);
    }
    if let Some(s) = context_unchecked(o) {
        f.unchecked.push(s);
    }
    if (count_off.is_some() || past_count.is_some()) && cvd.is_none() {
        f.unchecked.push(
            "only the process's initial environment is read (/proc/<pid>/environ): a \
             CUDA_VISIBLE_DEVICES it set itself before cuInit is not seen"
                .into(),
        );
    }
    let compute_mode = step(
        Where::Host,
        format!(
            "If an exclusive or prohibited compute mode is not intended, set it back to \
             Default (per GPU with -i).{}",
            host_only_note(e)
        ),
        &[
            "nvidia-smi --query-gpu=index,compute_mode --format=csv",
            "sudo nvidia-smi -c DEFAULT",
        ],
    );
    let mig_devices = step(
        Where::Container,
        "With MIG on, select MIG devices by UUID (CUDA_VISIBLE_DEVICES=MIG-<uuid>) and make \
         sure GPU and compute instances exist.",
        &["nvidia-smi -L"],
    );
    let environ = format!("tr '\\0' '\\n' < /proc/{pid}/environ | grep VISIBLE_DEVICES");
    let visible_devices = step(
        Where::Container,
        "Give the process the devices it needs: CUDA_VISIBLE_DEVICES must name each of them \
         (or be unset), and the container must be given each GPU (NVIDIA_VISIBLE_DEVICES, \
         --gpus, the pod's nvidia.com/gpu).",
        &["nvidia-smi -L", &environ],
    );
    f.fix = if about_count {
        vec![visible_devices, mig_devices]
    } else if about_mig {
        vec![
            mig_devices,
            step(
                Where::Host,
                format!(
                    "If no MIG device exists, create GPU instances with their default compute \
                     instances from a profile nvidia-smi lists (MIG User Guide).{}",
                    host_only_note(e)
                ),
                &[
                    "nvidia-smi mig -lgip",
                    "sudo nvidia-smi mig -cgi <profile> -C",
                ],
            ),
        ]
    } else if code46 {
        vec![
            step(
                Where::Any,
                "See which processes hold the GPU: under Exclusive_Process only one may have \
                 a context.",
                &["nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid --format=csv"],
            ),
            compute_mode,
            mig_devices,
        ]
    } else {
        vec![compute_mode, mig_devices]
    };
    Some(f)
}

/// `cuCtxCreate_v2 on device 0 -> 46 (CUDA_ERROR_DEVICE_UNAVAILABLE) after 0.004 s`, or for
/// a count `cuDeviceGetCount -> 1 device(s) after 0.001 s`.
fn context_text(o: &Observations, call: &str, r: i64) -> String {
    let after = o
        .context_seconds
        .map(|s| format!(" after {s:.3} s"))
        .unwrap_or_default();
    let device = o
        .context_device
        .map(|d| format!(" on device {d}"))
        .unwrap_or_default();
    match o.device_count_seen {
        Some(n) if call == DEVICE_GET_COUNT && r == cu::SUCCESS => {
            format!("{call} -> {n} device(s){after}")
        }
        _ => format!(
            "{call}{device} -> {r} ({}){after}",
            crate::decode::nvidia::cu_result_name(r)
        ),
    }
}

/// What the rule could not see of context creation, when nothing of it was observed: a
/// plain `doctor` sees no process, and a process whose libcuda exports none of the
/// context creations probed (or whose probes were refused) is not seen creating one.
fn context_unchecked(o: &Observations) -> Option<String> {
    if o.context_result.is_some() {
        return None;
    }
    if !observed(o) {
        return Some(
            "context creation (a CUDA error 46 after a successful cuInit) is seen only while \
             the agent runs (`uvmwatch run`)"
                .into(),
        );
    }
    let off: Vec<&String> = o
        .unavailable_probes
        .iter()
        .filter(|p| {
            CONTEXT_CREATIONS
                .iter()
                .any(|c| p.starts_with(&format!("uretprobe:{c}:")))
        })
        .collect();
    (off.len() == CONTEXT_CREATIONS.len())
        .then(|| format!("context creation not probed here ({}, ...)", off[0]))
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn policy_or_partition_exclusive_mode_46() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Exclusive_Process".into()]);
        let o = watched().cuinit(46, 0.2).opens(4);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(has_fix(&f, Where::Host, "nvidia-smi -c DEFAULT"));
    }

    #[test]
    fn policy_or_partition_mig_without_instances_100() {
        let e = healthy_open_host().smi(|s| s.mig_mode = vec!["Enabled".into()]);
        let o = watched().cuinit(100, 0.2).opens(3);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 100 with a missing node is the missing node, not MIG.
        let missing = watched()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        assert_eq!(run("policy_or_partition", &e, &missing), None);
        // MIG on, nothing failing: a deliberate set-up.
        assert_eq!(run("policy_or_partition", &e, &plain()), None);
    }

    #[test]
    fn policy_or_partition_46_with_mig_on_and_default_compute_mode_is_mig_medium() {
        let e = healthy_open_host().smi(|s| s.mig_mode = vec!["Enabled".into()]);
        let o = watched().cuinit(46, 0.2).opens(4);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        assert!(f.title.contains("MIG"), "{}", f.title);
        assert!(has_fix(&f, Where::Host, "nvidia-smi mig -cgi"));
        // The same 46 with MIG off and compute mode Default: not this rule.
        let off = healthy_open_host().smi(|s| s.mig_mode = vec!["Disabled".into()]);
        assert_eq!(run("policy_or_partition", &off, &o), None);
    }

    #[test]
    fn policy_or_partition_prohibited_compute_mode_static() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Prohibited".into()]);
        let f = run("policy_or_partition", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // 46 with Default compute mode: not policy (memory pressure, other causes).
        let o = watched().cuinit(46, 0.2).opens(4);
        assert_eq!(run("policy_or_partition", &healthy_open_host(), &o), None);
    }

    #[test]
    fn policy_or_partition_46_from_a_context_creation_under_exclusive_process() {
        let e = healthy_open_host().smi(|s| s.compute_mode = vec!["Exclusive_Process".into()]);
        for call in CONTEXT_CREATIONS {
            let o = watched().cuinit(0, 0.2).context(call, 46, 0.004);
            let f = run("policy_or_partition", &e, &o).expect("finding");
            // The fixture host has another process with libcuda mapped: the holder.
            assert_eq!(
                (f.severity, f.confidence),
                (Severity::Critical, Confidence::High),
                "{call}"
            );
            assert!(f.title.contains(call), "{}", f.title);
            assert_eq!(
                evidence_from(&f, "context creation", &src(call)),
                format!("{call} on device 0 -> 46 (CUDA_ERROR_DEVICE_UNAVAILABLE) after 0.004 s")
            );
            assert!(has_fix(&f, Where::Any, "--query-compute-apps"));
        }
        // Near misses: the context was created; 46 with compute mode Default.
        let ok = watched().cuinit(0, 0.2).context("cuCtxCreate_v2", 0, 0.004);
        assert_eq!(run("policy_or_partition", &e, &ok), None);
        let default = watched()
            .cuinit(0, 0.2)
            .context("cuDevicePrimaryCtxRetain", 46, 0.004);
        assert_eq!(
            run("policy_or_partition", &healthy_open_host(), &default),
            None
        );
        // 46 from cuDeviceGetCount is not a context creation refused by the compute mode.
        let count = watched()
            .cuinit(0, 0.2)
            .context("cuDeviceGetCount", 46, 0.001);
        assert_eq!(run("policy_or_partition", &e, &count), None);
    }

    #[test]
    fn policy_or_partition_device_count_below_the_gpus_the_process_has() {
        let e = healthy_open_host();
        // Two GPU nodes, one device, nothing explains it.
        let o = watched().cuinit(0, 0.2).device_count(1).gpu_nodes(2);
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Warning, Confidence::Low)
        );
        assert_eq!(
            evidence_from(
                &f,
                "GPU nodes the process sees",
                &format!("/proc/{PID}/root/dev")
            ),
            "2"
        );
        assert_eq!(
            evidence_from(&f, "device count", "probe:cuDeviceGetCount"),
            "cuDeviceGetCount -> 1 device(s) after 0.001 s"
        );
        assert!(has_fix(&f, Where::Container, "VISIBLE_DEVICES"));
        assert!(f
            .unchecked
            .iter()
            .any(|u| u.contains("initial environment")));
        // CUDA_VISIBLE_DEVICES naming one device accounts for it: information.
        let narrowed = o.clone().visible_devices("0");
        let f = run("policy_or_partition", &e, &narrowed).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Info, Confidence::High)
        );
        assert_eq!(
            evidence_from(&f, "CUDA_VISIBLE_DEVICES", &format!("/proc/{PID}/environ")),
            "0"
        );
        // It names two, CUDA found one: not accounted for.
        let f = run("policy_or_partition", &e, &o.clone().visible_devices("0,1")).unwrap();
        assert_eq!(f.severity, Severity::Warning);
        // No device at all.
        let none = watched().cuinit(0, 0.2).device_count(0).gpu_nodes(2);
        let f = run("policy_or_partition", &e, &none).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        // Near misses: the count matches the nodes, or exceeds them (MIG devices); without
        // the nodes read and MIG off, nvidia-smi's GPUs are no measure (a container may
        // have been given fewer).
        for ok in [
            watched().cuinit(0, 0.2).device_count(2).gpu_nodes(2),
            watched().cuinit(0, 0.2).device_count(7).gpu_nodes(2),
            watched().cuinit(0, 0.2).device_count(0),
        ] {
            assert_eq!(run("policy_or_partition", &e, &ok), None, "{ok:?}");
        }
    }

    #[test]
    fn policy_or_partition_context_creation_on_a_device_past_the_count() {
        let e = healthy_open_host();
        let o = watched()
            .cuinit(0, 0.2)
            .device_count(1)
            .gpu_nodes(1)
            .context("cuCtxCreate_v4", 101, 0.001)
            .with(|o| o.context_device = Some(1));
        let f = run("policy_or_partition", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f.title.contains("device 1"), "{}", f.title);
        // Device 0 of 1 failing with 101 is something else.
        let inside = o.clone().with(|o| o.context_device = Some(0));
        assert_eq!(run("policy_or_partition", &e, &inside), None);
    }

    #[test]
    fn policy_or_partition_device_count_mismatch_from_snapshots_with_mig_on_and_off() {
        let mig = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            ..SnapshotSpec::default()
        };
        let one = watched().cuinit(0, 0.3).device_count(1);
        let fs = diagnose_spec(&mig, &one);
        let f = expect(
            &fs,
            "policy_or_partition",
            Severity::Warning,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "GPUs (nvidia-smi)", "nvidia-smi -q"),
            "2 (2 with MIG on)"
        );
        assert!(has_fix(f, Where::Container, "nvidia-smi -L"));
        // The same count on two GPUs without MIG: the host's GPUs are no measure, the
        // process's GPU nodes are (two of them, unexplained: a warning of low confidence).
        let plain_two = SnapshotSpec {
            smi: smi_h200(2, |_| {}),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&plain_two, &one), "policy_or_partition");
        expect(
            &diagnose_spec(&plain_two, &one.clone().gpu_nodes(2)),
            "policy_or_partition",
            Severity::Warning,
            Confidence::Low,
        );
        // Near miss: both devices seen.
        absent(
            &diagnose_spec(&mig, &watched().cuinit(0, 0.3).device_count(2)),
            "policy_or_partition",
        );
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    #[test]
    fn policy_or_partition_exclusive_process_46_with_another_holder_is_critical_high() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
            processes: vec![
                ProcessSpec::python3(5151, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
                ProcessSpec::python3(PID, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
            ],
            ..SnapshotSpec::default()
        };
        let e = snapshot_evidence(&spec);
        let fs = diagnose(&e, &watched().cuinit(46, 0.2).opens(4));
        let f = expect(
            &fs,
            "policy_or_partition",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "compute mode", "nvidia-smi -q"),
            "Exclusive_Process, Exclusive_Process"
        );
        assert_eq!(
            evidence_from(f, "other CUDA processes (pid)", &e.libcuda.source),
            "5151"
        );
        assert!(has_fix(f, Where::Host, "nvidia-smi -c DEFAULT"));
    }

    #[test]
    fn policy_or_partition_mig_on_and_cuinit_100_with_every_open_succeeding_is_critical_medium() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &watched().cuinit(100, 0.2).opens(3));
        let f = expect(
            &fs,
            "policy_or_partition",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "MIG mode", "nvidia-smi -q"),
            "Enabled, Enabled"
        );
        assert!(has_fix(f, Where::Container, "nvidia-smi -L"));
    }

    #[test]
    fn policy_or_partition_prohibited_compute_mode_from_static_evidence() {
        let all = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Prohibited".into()),
            ..SnapshotSpec::default()
        };
        expect(
            &diagnose_spec(&all, &plain()),
            "policy_or_partition",
            Severity::Critical,
            Confidence::Medium,
        );
        // Prohibited on one GPU of two: the other still works, a warning.
        let one = SnapshotSpec {
            smi: Some(smi_q(
                DRIVER,
                &[SmiGpu::h200(0), {
                    let mut g = SmiGpu::h200(1);
                    g.compute_mode = "Prohibited".into();
                    g
                }],
            )),
            ..SnapshotSpec::default()
        };
        expect(
            &diagnose_spec(&one, &plain()),
            "policy_or_partition",
            Severity::Warning,
            Confidence::Medium,
        );
    }

    #[test]
    fn policy_or_partition_mig_on_without_a_failure_is_not_policy_or_partition() {
        let spec = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&spec, &plain()), "policy_or_partition");
        absent(
            &diagnose_spec(&spec, &watched().cuinit(0, 0.3).opens(4)),
            "policy_or_partition",
        );
        // Exclusive mode held by one process is a deliberate set-up until something fails.
        let exclusive = SnapshotSpec {
            smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&exclusive, &plain()), "policy_or_partition");
    }

    #[test]
    fn policy_or_partition_not_for_100_with_a_missing_node_or_46_in_default_compute_mode() {
        let mig = SnapshotSpec {
            smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
            nodes: nodes_without("/dev/nvidia-uvm"),
            ..SnapshotSpec::default()
        };
        let missing = watched()
            .cuinit(100, 0.01)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let fs = diagnose_spec(&mig, &missing);
        absent(&fs, "policy_or_partition");
        expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::High,
        );
        // 46 with compute mode Default: memory pressure or another cause, not policy.
        absent(
            &diagnose_spec(
                &SnapshotSpec::default(),
                &watched().cuinit(46, 0.2).opens(4),
            ),
            "policy_or_partition",
        );
    }
}

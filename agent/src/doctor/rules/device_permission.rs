//! Rule `device_permission`: NVIDIA device node present but access denied (one row of the rules
//! table in `docs/doctor.md`); [`check`] says when it applies, and its tests go from evidence built
//! in code to snapshot trees read back by the collectors.

use super::super::facts::{DevNode, Evidence, Observations};
use super::super::finding::{Confidence, Finding, Severity, Where};
use super::{cu, finding, item, push_cuinit, step, unknown, SRC_OPENAT};

/// The fixed major of `/dev/nvidiactl` and `/dev/nvidia<N>` (`NV_MAJOR_DEVICE_NUMBER` in NVIDIA's
/// `kernel-open/common/inc/nv-chardev-numbers.h`; registered as `nvidia-frontend` in
/// `/proc/devices`).
const NVIDIA_MAJOR: u32 = 195;

/// Errnos of an `open()` refused by policy: `EPERM` (device cgroup / LXC allow-list),
/// `EACCES` (mode bits, user namespace).
const DENIED_ERRNOS: &[&str] = &["EPERM", "EACCES"];

/// Device permission: the node exists but `open()` is refused, with `EPERM` (device cgroup /
/// LXC allow-list, e.g. a stale dynamic major) or `EACCES` (mode bits, user namespace).
/// Observed through `probe:openat`; static through the cgroup v1 allow-list against the
/// `nvidia-uvm` major of `/proc/devices`, and the collector's own open of each node.
pub(super) fn check(e: &Evidence, o: &Observations) -> Option<Finding> {
    let denied: Vec<&(String, String)> = o
        .failed_opens
        .iter()
        .filter(|(_, err)| DENIED_ERRNOS.contains(&err.as_str()))
        .collect();
    let collector_denied: Vec<(&DevNode, &str)> = e
        .dev_nodes
        .get()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| match &n.open {
                    Some(Err(err)) if DENIED_ERRNOS.contains(&err.as_str()) => {
                        Some((n, err.as_str()))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let uvm_major = e.devices.get().and_then(|d| d.get("nvidia-uvm")).copied();
    let allow = e.container.get().and_then(|c| c.device_allow.as_ref());
    // The allow-list lets in the RM control node (so the container is meant to use GPUs)
    // but not the current UVM major: written for an earlier boot or module load.
    let rm_major = e
        .devices
        .get()
        .and_then(|d| d.get("nvidia-frontend"))
        .copied()
        .unwrap_or(NVIDIA_MAJOR);
    let stale = match (allow, uvm_major) {
        (Some(lines), Some(major))
            if lines.iter().any(|l| allow_line_permits(l, rm_major, 255))
                && !lines.iter().any(|l| allow_line_permits(l, major, 0)) =>
        {
            Some(major)
        }
        _ => None,
    };
    if denied.is_empty() && collector_denied.is_empty() && stale.is_none() {
        return None;
    }
    let works = o.cuinit_result == Some(cu::SUCCESS);
    if denied.is_empty() && works {
        return None;
    }

    let eperm = denied.iter().any(|(_, e)| e == "EPERM")
        || collector_denied.iter().any(|(_, e)| *e == "EPERM")
        || stale.is_some();
    let (confidence, title) = if let Some((path, err)) = denied.first() {
        (
            Confidence::High,
            format!("access to {path} denied: open() returned {err}"),
        )
    } else if let Some((n, err)) = collector_denied.first() {
        (
            Confidence::Medium,
            format!("access to {} denied here: open() returned {err}", n.path),
        )
    } else {
        (
            Confidence::Medium,
            format!(
                "the device allow-list does not include the current nvidia-uvm major ({})",
                stale.unwrap_or_default()
            ),
        )
    };
    let mut f = finding("device_permission", Severity::Critical, confidence, title);
    for (path, err) in &denied {
        f.evidence
            .push(item("open", format!("{path}: {err}"), SRC_OPENAT));
    }
    push_cuinit(&mut f, o);
    for (n, err) in &collector_denied {
        let dev = n
            .dev
            .map(|(ma, mi)| format!(" (char {ma}:{mi})"))
            .unwrap_or_default();
        f.evidence.push(item(
            "open by uvmwatch",
            format!("{}{dev}: {err}", n.path),
            n.path.clone(),
        ));
    }
    if let Some(major) = uvm_major {
        f.evidence.push(item(
            "nvidia-uvm major",
            major.to_string(),
            e.devices.source.clone(),
        ));
        // A node made for another major (before a reboot or reload) is stale too.
        if let Some((node_major, _)) = e
            .dev_nodes
            .get()
            .and_then(|n| n.iter().find(|d| d.path == "/dev/nvidia-uvm"))
            .and_then(|d| d.dev)
            .filter(|(ma, _)| *ma != major)
        {
            f.evidence.push(item(
                "/dev/nvidia-uvm",
                format!("made for major {node_major}, not {major}: stale node"),
                e.dev_nodes.source.clone(),
            ));
        }
    }
    if let Some(lines) = allow {
        let value = if let Some(major) = stale {
            format!("{} (nothing for c {major}:*)", lines.join("; "))
        } else {
            lines.join("; ")
        };
        f.evidence
            .push(item("device allow-list", value, e.container.source.clone()));
    } else if e.container.get().is_some_and(|c| c.kind != "host") {
        f.unchecked.push(
            "device allow-list not readable (cgroup v2: the policy is an eBPF program): cannot check for a stale major"
                .into(),
        );
    }
    if let Some(s) = unknown(&e.container, "container / device cgroup") {
        f.unchecked.push(s);
    }
    if let Some(s) = unknown(&e.devices, "nvidia-uvm major") {
        f.unchecked.push(s);
    }

    let major = uvm_major
        .map(|m| m.to_string())
        .unwrap_or_else(|| "<major>".into());
    if eperm {
        f.fix.push(step(
            Where::Host,
            format!(
                "Allow the current nvidia-uvm major ({major}) in the container's device policy; \
                 the major is dynamic and can change at each reboot or module reload. LXC: \
                 `lxc.cgroup2.devices.allow: c {major}:* rwm` (cgroup v1: \
                 `lxc.cgroup.devices.allow`) in the container config, then restart it. \
                 Docker/Kubernetes: recreate the container or pod so the runtime re-reads the \
                 nodes."
            ),
            &[
                "grep nvidia-uvm /proc/devices",
                "ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools",
            ],
        ));
    }
    if !eperm || denied.iter().any(|(_, e)| e == "EACCES") {
        f.fix.push(step(
            Where::Host,
            "EACCES: fix the node's mode or owner (NVIDIA nodes are normally crw-rw-rw-), or \
             the user-namespace mapping of the container; nvidia-modprobe recreates the UVM \
             nodes.",
            &["ls -l /dev/nvidia*", "sudo nvidia-modprobe -u -c 0"],
        ));
    }
    Some(f)
}

/// A device allow-list line (`devices.list`: `c 195:* rwm`, `a *:* rwm`) that lets a
/// character device `major:minor` be read and written.
fn allow_line_permits(line: &str, major: u32, minor: u32) -> bool {
    let mut parts = line.split_whitespace();
    let (Some(kind), Some(dev), Some(access)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if kind == "a" {
        return true;
    }
    if kind != "c" || !(access.contains('r') && access.contains('w')) {
        return false;
    }
    let Some((ma, mi)) = dev.split_once(':') else {
        return false;
    };
    let num_ok = |s: &str, n: u32| s == "*" || s.parse::<u32>() == Ok(n);
    num_ok(ma, major) && num_ok(mi, minor)
}

#[cfg(test)]
mod tests {
    use super::super::diagnose;
    use super::super::finding_checks::*;
    use super::*;
    use crate::doctor::fixtures::*;
    use uvmwatch_testbed::snapshot::*;

    #[test]
    fn device_permission_eperm_with_stale_major() {
        let e = healthy_open_host().container("lxc", Some(STALE_ALLOW));
        let o = watched()
            .cuinit(999, 0.003)
            .opens(2)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        let f = run("device_permission", &e, &o).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::High)
        );
        assert!(f
            .evidence
            .iter()
            .any(|i| i.value.contains("nothing for c 508:*")));
        assert!(f.fix.iter().any(|s| s.note.contains("c 508:* rwm")));
        assert_eq!(run("node_or_module_missing", &e, &o), None);
        assert_eq!(run("stale_after_suspend", &e, &o), None);
    }

    #[test]
    fn device_permission_stale_allow_list_from_static_evidence() {
        let e = healthy_open_host().container("lxc", Some(STALE_ALLOW));
        let f = run("device_permission", &e, &plain()).expect("finding");
        assert_eq!(
            (f.severity, f.confidence),
            (Severity::Critical, Confidence::Medium)
        );
        let good = healthy_open_host().container("lxc", Some(&["c 195:* rwm", "c 508:* rwm"]));
        assert_eq!(run("device_permission", &good, &plain()), None);
        // A container not meant to have GPUs (no NVIDIA major at all): not stale.
        let no_gpu = healthy_open_host().container("docker", Some(&["c 1:3 rwm", "c 5:0 rwm"]));
        assert_eq!(run("device_permission", &no_gpu, &plain()), None);
        // cgroup v2: no list to check, nothing claimed.
        let v2 = healthy_open_host().container("docker", None);
        assert_eq!(run("device_permission", &v2, &plain()), None);
    }

    #[test]
    fn device_permission_eacces_suggests_modes() {
        let o = watched()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia0", "EACCES");
        let f = run("device_permission", &healthy_open_host(), &o).expect("finding");
        assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
    }

    #[test]
    fn device_permission_allow_lines() {
        assert!(allow_line_permits("a *:* rwm", 508, 0));
        assert!(allow_line_permits("c 508:* rwm", 508, 0));
        assert!(allow_line_permits("c 508:0 rw", 508, 0));
        assert!(!allow_line_permits("c 508:1 rw", 508, 0));
        assert!(!allow_line_permits("c 508:* r", 508, 0));
        assert!(!allow_line_permits("b 508:* rwm", 508, 0));
        assert!(!allow_line_permits("c 195:* rwm", 508, 0));
        assert!(!allow_line_permits("garbage", 508, 0));
    }

    // On snapshot trees: the machine laid out on disk, read back by the collectors.

    /// An LXC allow-list written for an earlier boot: nvidia-uvm was 507 then, 508 now.
    fn stale_lxc() -> SnapshotSpec {
        SnapshotSpec {
            container: ContainerSpec::Lxc,
            device_allow: Some(STALE_ALLOW.iter().map(|l| l.to_string()).collect()),
            ..SnapshotSpec::default()
        }
    }

    #[test]
    fn device_permission_eperm_on_uvm_with_a_stale_lxc_allow_list_is_critical_high() {
        let e = snapshot_evidence(&stale_lxc());
        assert_eq!(e.container.get().map(|c| c.kind.as_str()), Some("lxc"));
        let o = watched()
            .cuinit(999, 0.003)
            .opens(2)
            .failed_open("/dev/nvidia-uvm", "EPERM");
        let fs = diagnose(&e, &o);
        assert_eq!(fs[0].rule, "device_permission");
        let f = expect(
            &fs,
            "device_permission",
            Severity::Critical,
            Confidence::High,
        );
        assert_eq!(
            evidence_from(f, "open", "probe:openat"),
            "/dev/nvidia-uvm: EPERM"
        );
        assert_eq!(evidence_from(f, "nvidia-uvm major", "/proc/devices"), "508");
        assert!(evidence_from(f, "device allow-list", &e.container.source)
            .contains("nothing for c 508:*"));
        assert!(f.fix.iter().any(|s| s.note.contains("c 508:* rwm")));
        absent(&fs, "node_or_module_missing");
        absent(&fs, "stale_after_suspend");
    }

    #[test]
    fn device_permission_stale_lxc_allow_list_from_static_evidence_is_critical_medium() {
        let fs = diagnose_spec(&stale_lxc(), &plain());
        let f = expect(
            &fs,
            "device_permission",
            Severity::Critical,
            Confidence::Medium,
        );
        assert!(f.title.contains("(508)"), "{}", f.title);
        // Once cuInit is seen working, the list is evidently good enough.
        absent(
            &diagnose_spec(&stale_lxc(), &watched().cuinit(0, 0.3).opens(4)),
            "device_permission",
        );
    }

    #[test]
    fn device_permission_denied_to_the_collectors_own_open_is_recorded_in_the_snapshot() {
        let nodes = nodes_opened_except("/dev/nvidia-uvm", "EACCES");
        let spec = SnapshotSpec {
            nodes,
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(
            &fs,
            "device_permission",
            Severity::Critical,
            Confidence::Medium,
        );
        assert_eq!(
            evidence_from(f, "open by uvmwatch", "/dev/nvidia-uvm"),
            "/dev/nvidia-uvm (char 508:0): EACCES"
        );
        assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
    }

    #[test]
    fn device_permission_eacces_seen_by_the_probe_suggests_modes() {
        let o = watched()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia0", "EACCES");
        let fs = diagnose_spec(&SnapshotSpec::default(), &o);
        let f = expect(
            &fs,
            "device_permission",
            Severity::Critical,
            Confidence::High,
        );
        assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
    }

    #[test]
    fn device_permission_not_for_enoent_a_good_allow_list_cgroup_v2_or_a_container_without_gpus() {
        // ENOENT (EPERM's near miss): the node is missing, not denied.
        let enoent = watched()
            .cuinit(999, 0.003)
            .failed_open("/dev/nvidia-uvm", "ENOENT");
        let spec = SnapshotSpec {
            nodes: nodes_without("/dev/nvidia-uvm"),
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &enoent);
        absent(&fs, "device_permission");
        expect(
            &fs,
            "node_or_module_missing",
            Severity::Critical,
            Confidence::High,
        );
        // The allow-list has the current major.
        let good = SnapshotSpec {
            device_allow: Some(vec!["c 195:* rwm".into(), "c 508:* rwm".into()]),
            ..stale_lxc()
        };
        absent(&diagnose_spec(&good, &plain()), "device_permission");
        // cgroup v2: no list to read, nothing claimed.
        let v2 = SnapshotSpec {
            device_allow: None,
            ..stale_lxc()
        };
        absent(&diagnose_spec(&v2, &plain()), "device_permission");
        // A container not meant to have GPUs (no NVIDIA major in its list).
        let no_gpu = SnapshotSpec {
            container: ContainerSpec::Docker,
            device_allow: Some(vec!["c 1:3 rwm".into(), "c 5:0 rwm".into()]),
            ..SnapshotSpec::default()
        };
        absent(&diagnose_spec(&no_gpu, &plain()), "device_permission");
    }
}

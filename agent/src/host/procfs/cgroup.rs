//! Which container and which Kubernetes pod a process is in, from its
//! `/proc/<pid>/cgroup` file.

/// Container id of a process from the contents of its `/proc/<pid>/cgroup` file.
///
/// Each line is `hierarchy-id:controllers:path` (cgroup v1 lines and the v2 `0::` line are
/// treated alike). Recognised, deepest path component winning (so docker-in-docker gives
/// the inner container), first matching line winning:
/// - a component that is exactly 64 lowercase hex digits: docker cgroupfs
///   (`/docker/<id>`), Kubernetes cgroupfs driver (`/kubepods/<qos>/pod<uid>/<id>`);
/// - `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
///   `libpod-<id>.scope` (systemd driver; the `.scope` suffix is optional). The
///   `crio-conmon-` / `libpod-conmon-` scopes hold the monitor, not the container, and do
///   not match;
/// - LXC/LXD: `/lxc/<name>`, `lxc.payload.<name>` or `lxc.payload/<name>`, returned as
///   `lxc:<name>` (`lxc.monitor.<name>` holds the monitor and does not match).
///
/// Returns the 64-hex id (or `lxc:<name>`), or `None` for host processes and processes in
/// a private cgroup namespace (whose paths read `/`).
pub fn container_id(cgroup_file_contents: &str) -> Option<String> {
    paths(cgroup_file_contents).find_map(container_id_of_path)
}

/// The cgroup path of each line `hierarchy-id:controllers:path` (the path itself may
/// contain `:`); lines with fewer than two `:` are skipped.
fn paths(cgroup_file_contents: &str) -> impl Iterator<Item = &str> {
    cgroup_file_contents
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
}

fn container_id_of_path(path: &str) -> Option<String> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for i in (0..comps.len()).rev() {
        let comp = comps[i];
        if is_hex64(comp) {
            return Some(comp.to_string());
        }
        let stem = comp.strip_suffix(".scope").unwrap_or(comp);
        for prefix in ["docker-", "cri-containerd-", "crio-", "libpod-"] {
            if let Some(id) = stem.strip_prefix(prefix) {
                if is_hex64(id) {
                    return Some(id.to_string());
                }
            }
        }
        if let Some(name) = comp.strip_prefix("lxc.payload.") {
            if !name.is_empty() {
                return Some(format!("lxc:{name}"));
            }
        }
        if i > 0 && (comps[i - 1] == "lxc" || comps[i - 1] == "lxc.payload") {
            return Some(format!("lxc:{comp}"));
        }
    }
    None
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Kubernetes pod UID of a process from the contents of its `/proc/<pid>/cgroup` file,
/// with dashes (`8f3c2b1a-4d5e-4f60-9a7b-1c2d3e4f5a6b`).
///
/// Only the pod cgroups the kubelet creates under a `kubepods` path count, deepest
/// component winning, first matching line winning:
/// - cgroupfs driver: a component `pod<uid>` (`/kubepods/<qos>/pod<uid>/<container>`, or
///   `/kubepods/pod<uid>/...` for a Guaranteed pod);
/// - systemd driver: a slice `kubepods[-<qos>]-pod<uid>.slice` whose UID has `_` for each
///   `-` (a kubelet prefix such as `kubelet-kubepods-...` is allowed).
///
/// The UID must be 8-4-4-4-12 hex digits; anything else gives `None`.
pub fn pod_uid(cgroup_file_contents: &str) -> Option<String> {
    paths(cgroup_file_contents)
        .filter(|path| path.contains("kubepods"))
        .find_map(|path| path.split('/').rev().find_map(pod_uid_of_component))
}

fn pod_uid_of_component(comp: &str) -> Option<String> {
    if let Some(uid) = comp.strip_prefix("pod") {
        return is_uid(uid).then(|| uid.to_string());
    }
    let (head, pod) = comp.strip_suffix(".slice")?.rsplit_once('-')?;
    if !head.split('-').any(|part| part == "kubepods") {
        return None;
    }
    let uid = pod.strip_prefix("pod")?.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// 8-4-4-4-12 hex digits, as Kubernetes writes a UID.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use uvmwatch_testbed::snapshot::{FIXTURE_CONTAINER_ID, FIXTURE_POD_UID};

    const ID: &str = "3f8c2a9d0e71b4c6a5d2e9f0817c3b4a6d5e2f1098a7b6c5d4e3f2a1b0c9d8e7";
    /// A pod's container under the systemd driver (cgroup v2).
    pub(crate) const KUBE_SYSTEMD: &str = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8f3c2b1a_4d5e_4f60_9a7b_1c2d3e4f5a6b.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
    /// A pod's container under the cgroupfs driver (cgroup v1 line first).
    pub(crate) const KUBE_CGROUPFS: &str = "12:pids:/kubepods/burstable/pod0d3c2b1a-4d5e-4f60-9a7b-1c2d3e4f5a6b/fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\n0::/\n";

    #[test]
    fn pod_uid_from_both_cgroup_drivers() {
        assert_eq!(
            pod_uid(KUBE_SYSTEMD).as_deref(),
            Some("8f3c2b1a-4d5e-4f60-9a7b-1c2d3e4f5a6b")
        );
        assert_eq!(
            pod_uid(KUBE_CGROUPFS).as_deref(),
            Some("0d3c2b1a-4d5e-4f60-9a7b-1c2d3e4f5a6b")
        );
        // Guaranteed QoS pods have no QoS level in the path.
        assert_eq!(
            pod_uid("0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-ab.scope").as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(pod_uid("0::/system.slice/docker-abc.scope"), None);
        assert_eq!(pod_uid("0::/kubepods/besteffort/podnotauid/x"), None);
        // What the doctor reads about its own pod (the snapshot fixture's UID).
        assert_eq!(
            pod_uid(&format!(
                "0::/kubepods/pod{FIXTURE_POD_UID}/{FIXTURE_CONTAINER_ID}\n"
            ))
            .as_deref(),
            Some(FIXTURE_POD_UID)
        );
        assert_eq!(pod_uid("0::/system.slice/pod.service\n"), None);
        // A kubelet with a cgroup root of its own (kind, kubeadm `--cgroup-root`).
        assert_eq!(
            pod_uid("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-ab.scope\n").as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        // Hex and dashes that are no UID; a UID outside a kubepods slice; underscores in a
        // cgroupfs name.
        assert_eq!(pod_uid("0::/kubepods/burstable/podabc-def/x\n"), None);
        assert_eq!(
            pod_uid("0::/kubepods.slice/other-pod11111111_2222_3333_4444_555555555555.slice\n"),
            None
        );
        assert_eq!(
            pod_uid("0::/kubepods/pod11111111_2222_3333_4444_555555555555/x\n"),
            None
        );
    }

    #[test]
    fn container_ids() {
        let pod = "pod0f3c3c51-5b0e-4a4e-9d7e-2b0d9d7c1a11";
        let cases: Vec<(String, Option<String>)> = vec![
            // docker, cgroup v1 cgroupfs driver
            (
                format!("12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n0::/\n"),
                Some(ID.into()),
            ),
            // docker, cgroup v2 systemd driver
            (format!("0::/system.slice/docker-{ID}.scope\n"), Some(ID.into())),
            // docker, v1 hybrid name=systemd line first
            (
                format!("1:name=systemd:/system.slice/docker-{ID}.scope\n0::/system.slice/docker-{ID}.scope\n"),
                Some(ID.into()),
            ),
            // containerd CRI, systemd driver, v2
            (
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-{}.slice/cri-containerd-{ID}.scope\n", pod.replace('-', "_")),
                Some(ID.into()),
            ),
            // Kubernetes cgroupfs driver, v1 (containerd or docker)
            (
                format!("4:memory:/kubepods/burstable/{pod}/{ID}\n3:cpuset:/kubepods/burstable/{pod}/{ID}\n"),
                Some(ID.into()),
            ),
            // cri-o, systemd driver
            (
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-{}.slice/crio-{ID}.scope\n", pod.replace('-', "_")),
                Some(ID.into()),
            ),
            // cri-o monitor is not the container
            (format!("0::/system.slice/crio-conmon-{ID}.scope\n"), None),
            // podman rootful, v2, with crun's inner "container" cgroup
            (format!("0::/machine.slice/libpod-{ID}.scope/container\n"), Some(ID.into())),
            // podman rootless
            (
                format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"),
                Some(ID.into()),
            ),
            (format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"), None),
            // docker in docker: the innermost wins
            (
                format!("0::/docker/{}/docker/{ID}\n", "a".repeat(64)),
                Some(ID.into()),
            ),
            // LXC v1, LXC 4+/LXD v2, LXC 3 v2
            ("10:devices:/lxc/gpu-box\n".into(), Some("lxc:gpu-box".into())),
            ("0::/lxc.payload.trainer/system.slice/cron.service\n".into(), Some("lxc:trainer".into())),
            ("0::/lxc.payload/trainer\n".into(), Some("lxc:trainer".into())),
            ("0::/lxc.monitor.trainer\n".into(), None),
            // host and private-namespace processes
            ("0::/user.slice/user-0.slice/session-3.scope\n".into(), None),
            ("0::/\n".into(), None),
            ("4:memory:/process_api/c611f00ce5b6fbd1459612c23601358b\n0::/\n".into(), None),
            // upper-case or short ids are not container ids
            (format!("0::/docker/{}\n", ID.to_uppercase()), None),
            (format!("0::/docker/{}\n", &ID[..63]), None),
            (String::new(), None),
            ("garbage without colons\n".into(), None),
        ];
        for (contents, expected) in cases {
            assert_eq!(container_id(&contents), expected, "{contents}");
        }
        // The real file parses (whatever this machine is).
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let _ = container_id(&own);
    }
}

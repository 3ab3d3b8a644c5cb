//! Where the doctor runs: host, container runtime, Kubernetes pod, LXC, and the cgroup v1
//! device allow-list.

use super::super::facts::{ContainerInfo, Fact};
use super::super::root::Root;

/// Sources of the container detection, as [`Evidence::container`](super::super::facts::Evidence::container) names them when no single
/// one decided.
pub const CONTAINER_SOURCES: &str =
    "/proc/1/cgroup, /proc/self/cgroup, /.dockerenv, /run/.containerenv, /proc/1/environ";

/// The container detection ([`detect_container`]) on what this root shows: both cgroup
/// files, the runtime marker files, init's filtered environment and the v1 allow-list.
pub(super) fn collect_container(root: &Root) -> Fact<ContainerInfo> {
    let pid1 = root.read_to_string("/proc/1/cgroup");
    let own = root.read_to_string("/proc/self/cgroup");
    if let (Err(e1), Err(e2)) = (&pid1, &own) {
        return Fact::unavailable(
            format!("not readable: /proc/1/cgroup: {e1}; /proc/self/cgroup: {e2}"),
            CONTAINER_SOURCES,
        );
    }
    let environ = root
        .read_filtered("/proc/1/environ", 0, &keep_environ)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let own = own.ok();
    let devices_list = read_devices_list(root, own.as_deref());
    let inputs = ContainerInputs {
        pid1_cgroup: pid1.ok(),
        self_cgroup: own,
        dockerenv: root.exists("/.dockerenv"),
        containerenv: root.exists("/run/.containerenv"),
        pid1_environ: environ,
        devices_list,
    };
    let (info, source) = detect_container(&inputs);
    Fact::ok(info, source)
}

/// Keeps the `/proc/1/environ` entries the detection uses: `container=<runtime>` as is,
/// `KUBERNETES_SERVICE_HOST` with its value replaced by `<redacted>`.
fn keep_environ(entry: &[u8]) -> Option<Vec<u8>> {
    if entry.starts_with(b"container=") {
        Some(entry.to_vec())
    } else if entry.starts_with(b"KUBERNETES_SERVICE_HOST=") {
        Some(b"KUBERNETES_SERVICE_HOST=<redacted>".to_vec())
    } else {
        None
    }
}

/// cgroup v1 `devices.list` of the doctor's own cgroup: under the `devices` controller's
/// path from `/proc/self/cgroup`, else at the controller's root (what a container sees).
fn read_devices_list(root: &Root, self_cgroup: Option<&str>) -> Option<String> {
    let mut candidates = Vec::new();
    if let Some(text) = self_cgroup {
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            if let (Some(controllers), Some(path)) = (controllers, path) {
                if controllers.split(',').any(|c| c == "devices") && path != "/" {
                    candidates.push(format!("/sys/fs/cgroup/devices{path}/devices.list"));
                }
            }
        }
    }
    candidates.push("/sys/fs/cgroup/devices/devices.list".to_string());
    candidates.iter().find_map(|p| root.read_to_string(p).ok())
}

/// What the container detection looks at ([`detect_container`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInputs {
    /// `/proc/1/cgroup`.
    pub pid1_cgroup: Option<String>,
    /// `/proc/self/cgroup` (the doctor's own).
    pub self_cgroup: Option<String>,
    /// `/.dockerenv` exists (Docker creates it in every container).
    pub dockerenv: bool,
    /// `/run/.containerenv` exists (Podman; CRI-O too).
    pub containerenv: bool,
    /// `/proc/1/environ` (NUL-separated; only `container=` and `KUBERNETES_SERVICE_HOST`
    /// matter).
    pub pid1_environ: Option<String>,
    /// cgroup v1 `devices.list` contents, when readable.
    pub devices_list: Option<String>,
}

/// Decides where the doctor runs, and names the source that decided.
///
/// In order: a `kubepods` cgroup path or `KUBERNETES_SERVICE_HOST` in init's environment
/// (`kubernetes`, with the pod UID from the cgroup path, see
/// [`crate::host::procfs::cgroup::pod_uid`]); the runtime named by the cgroup
/// path that holds a container id (`docker`, `containerd`, `cri-o`, `podman`, `lxc`, see
/// [`crate::host::procfs::container_id`]); `/.dockerenv` (`docker`); `/run/.containerenv`
/// (`podman`); `container=` in init's environment (`lxc`, `docker`, `podman`, else
/// `container`); a container id alone (`container`); else `host`. The doctor's own cgroup
/// is looked at before init's.
pub fn detect_container(inputs: &ContainerInputs) -> (ContainerInfo, String) {
    let cgroups: Vec<(&str, &str)> = [
        ("/proc/self/cgroup", inputs.self_cgroup.as_deref()),
        ("/proc/1/cgroup", inputs.pid1_cgroup.as_deref()),
    ]
    .into_iter()
    .filter_map(|(source, text)| text.map(|t| (source, t)))
    .collect();
    let id_and_runtime = cgroups.iter().find_map(|(source, text)| {
        text.lines().find_map(|line| {
            crate::host::procfs::container_id(line)
                .map(|id| (id, runtime_of_cgroup_line(line), *source))
        })
    });
    let env: Vec<&str> = inputs
        .pid1_environ
        .as_deref()
        .unwrap_or("")
        .split('\0')
        .collect();
    let env_container = env
        .iter()
        .find_map(|e| e.strip_prefix("container="))
        .filter(|v| !v.is_empty());
    let k8s_env = env
        .iter()
        .any(|e| e.starts_with("KUBERNETES_SERVICE_HOST="));
    let k8s_cgroup = cgroups
        .iter()
        .find(|(_, text)| text.contains("kubepods"))
        .map(|(source, _)| *source);
    let pod_uid = cgroups
        .iter()
        .find_map(|(_, text)| crate::host::procfs::cgroup::pod_uid(text));

    let (kind, source) = if let Some(source) = k8s_cgroup {
        ("kubernetes".to_string(), source.to_string())
    } else if k8s_env {
        ("kubernetes".to_string(), "/proc/1/environ".to_string())
    } else if let Some((_, Some(runtime), source)) = &id_and_runtime {
        (runtime.to_string(), source.to_string())
    } else if inputs.dockerenv {
        ("docker".to_string(), "/.dockerenv".to_string())
    } else if inputs.containerenv {
        ("podman".to_string(), "/run/.containerenv".to_string())
    } else if let Some(value) = env_container {
        let kind = match value {
            "lxc" | "lxc-libvirt" => "lxc",
            "docker" => "docker",
            "podman" => "podman",
            _ => "container",
        };
        (kind.to_string(), "/proc/1/environ".to_string())
    } else if let Some((_, None, source)) = &id_and_runtime {
        ("container".to_string(), source.to_string())
    } else {
        ("host".to_string(), CONTAINER_SOURCES.to_string())
    };
    let id = id_and_runtime.map(|(id, _, _)| match id.strip_prefix("lxc:") {
        Some(name) => name.to_string(),
        None => id,
    });
    let device_allow = inputs.devices_list.as_ref().map(|t| {
        t.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    });
    (
        ContainerInfo {
            kind,
            id,
            pod_uid,
            device_allow,
        },
        source,
    )
}

/// Runtime named by one `/proc/<pid>/cgroup` line whose path holds a container id.
fn runtime_of_cgroup_line(line: &str) -> Option<&'static str> {
    let path = line.splitn(3, ':').nth(2)?;
    if path.contains("cri-containerd-") || path.contains("/containerd/") {
        Some("containerd")
    } else if path.contains("crio-") {
        Some("cri-o")
    } else if path.contains("libpod-") || path.contains("/libpod_parent/") {
        Some("podman")
    } else if path.contains("docker") {
        Some("docker")
    } else if path.contains("lxc") {
        Some("lxc")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uvmwatch_testbed::snapshot::{FIXTURE_CONTAINER_ID, FIXTURE_POD_UID};

    #[test]
    fn container_detection() {
        let host = ContainerInputs {
            pid1_cgroup: Some("0::/init.scope\n".into()),
            self_cgroup: Some("0::/user.slice/user-0.slice/session-4.scope\n".into()),
            ..ContainerInputs::default()
        };
        let (info, source) = detect_container(&host);
        assert_eq!(info.kind, "host");
        assert_eq!(
            (info.id, info.pod_uid, info.device_allow),
            (None, None, None)
        );
        assert_eq!(source, CONTAINER_SOURCES);

        let k8s_cgroupfs = ContainerInputs {
            self_cgroup: Some(format!(
                "12:devices:/kubepods/burstable/pod{FIXTURE_POD_UID}/{FIXTURE_CONTAINER_ID}\n0::/\n"
            )),
            devices_list: Some("c 195:* rwm\nc 508:* rwm\n".into()),
            ..ContainerInputs::default()
        };
        let (info, _) = detect_container(&k8s_cgroupfs);
        assert_eq!(info.kind, "kubernetes");
        assert_eq!(info.pod_uid.as_deref(), Some(FIXTURE_POD_UID));
        assert_eq!(info.id.as_deref(), Some(FIXTURE_CONTAINER_ID));
        assert_eq!(info.device_allow.unwrap(), ["c 195:* rwm", "c 508:* rwm"]);

        let crio = ContainerInputs {
            self_cgroup: Some(format!(
                "0::/system.slice/crio-{FIXTURE_CONTAINER_ID}.scope\n"
            )),
            ..ContainerInputs::default()
        };
        assert_eq!(detect_container(&crio).0.kind, "cri-o");

        // Private cgroup namespace: the marker files and init's environment decide.
        let ns = |dockerenv, containerenv, environ: &str| ContainerInputs {
            pid1_cgroup: Some("0::/\n".into()),
            self_cgroup: Some("0::/\n".into()),
            dockerenv,
            containerenv,
            pid1_environ: Some(environ.into()),
            devices_list: None,
        };
        assert_eq!(detect_container(&ns(true, false, "")).0.kind, "docker");
        assert_eq!(detect_container(&ns(true, false, "")).1, "/.dockerenv");
        assert_eq!(detect_container(&ns(false, true, "")).0.kind, "podman");
        assert_eq!(
            detect_container(&ns(false, false, "container=lxc\0"))
                .0
                .kind,
            "lxc"
        );
        assert_eq!(
            detect_container(&ns(false, false, "container=systemd-nspawn\0"))
                .0
                .kind,
            "container"
        );
        assert_eq!(
            detect_container(&ns(false, false, "KUBERNETES_SERVICE_HOST=<redacted>\0"))
                .0
                .kind,
            "kubernetes"
        );
        // The host's own docker.service is not a container.
        let dockerd_host = ContainerInputs {
            self_cgroup: Some("0::/system.slice/docker.service\n".into()),
            ..ContainerInputs::default()
        };
        assert_eq!(detect_container(&dockerd_host).0.kind, "host");
    }
}

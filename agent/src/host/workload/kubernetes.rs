//! Kubernetes pod name and namespace of a process (its pod UID comes from the cgroup path,
//! [`crate::host::procfs::cgroup::pod_uid`]).

use super::{ProcFacts, WorkloadInfo};

/// Pod name and namespace. Namespace: `POD_NAMESPACE` (downward API), else the
/// service-account namespace file. Pod name, only for a process in a pod (pod UID known or
/// namespace found): `POD_NAME`, else the pod's hostname (`/etc/hostname` in its root, then
/// `HOSTNAME`), which the kubelet sets to the pod name unless the pod sets
/// `spec.hostname`.
pub(super) fn kubernetes(f: &ProcFacts, info: &mut WorkloadInfo) {
    let env = |k: &str| f.env.get(k).and_then(|v| clean_k8s_name(v));
    info.k8s_namespace = env("POD_NAMESPACE").or_else(|| f.sa_namespace.clone());
    let in_pod = info.pod_uid.is_some() || info.k8s_namespace.is_some();
    info.k8s_pod_name = env("POD_NAME").or_else(|| {
        in_pod
            .then(|| f.root_hostname.clone().or_else(|| env("HOSTNAME")))
            .flatten()
    });
}

/// A DNS-1123 name as Kubernetes uses for pods and namespaces (≤ 253 bytes of
/// `[a-z0-9.-]`), trimmed; anything else is rejected.
pub(super) fn clean_k8s_name(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'))
    .then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::identify_facts;
    use super::super::tests::{env, facts};
    use crate::host::procfs::cgroup::tests::KUBE_SYSTEMD;

    #[test]
    fn kubernetes_identity() {
        let mut f = facts("/usr/bin/python3 /usr/local/bin/vllm serve m");
        f.cgroup = KUBE_SYSTEMD.to_string();
        env(&mut f, &[("HOSTNAME", "vllm-7f9c-abcde")]);
        f.sa_namespace = Some("inference".into());
        let i = identify_facts(&f);
        assert_eq!(i.k8s_namespace.as_deref(), Some("inference"));
        assert_eq!(i.k8s_pod_name.as_deref(), Some("vllm-7f9c-abcde"));
        assert_eq!(
            i.container_id.as_deref(),
            Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        );
        // Downward API variables win; the pod's /etc/hostname beats HOSTNAME.
        f.root_hostname = Some("from-etc-hostname".into());
        let i = identify_facts(&f);
        assert_eq!(i.k8s_pod_name.as_deref(), Some("from-etc-hostname"));
        env(&mut f, &[("POD_NAME", "p-1"), ("POD_NAMESPACE", "ns-1")]);
        let i = identify_facts(&f);
        assert_eq!(i.k8s_pod_name.as_deref(), Some("p-1"));
        assert_eq!(i.k8s_namespace.as_deref(), Some("ns-1"));
        // Outside a pod HOSTNAME is the machine's name, not a pod's.
        let mut f = facts("/usr/bin/python3 /usr/local/bin/vllm serve m");
        env(&mut f, &[("HOSTNAME", "gpu-node-1")]);
        assert_eq!(identify_facts(&f).k8s_pod_name, None);
        assert_eq!(
            identify_facts(&f).metric_labels(),
            [("engine", "vllm"), ("namespace", ""), ("pod", "")]
        );
    }
}

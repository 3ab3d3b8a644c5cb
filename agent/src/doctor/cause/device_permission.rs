//! `device_permission`: a device node exists, but its open is refused.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::DevicePermission,
    title: "a /dev/nvidia* node is there but its open is refused (device cgroup, mode bits, user namespace, security module)",
    doc: "open(2) of a node returns EPERM when a device cgroup refuses it (cgroup v1 \
          devices.list, or the eBPF program of cgroup v2: Documentation/admin-guide/cgroup-v1/\
          devices.rst), as when a container's rules were written for an earlier nvidia-uvm \
          major or were dropped by a systemd daemon-reload; EACCES for mode bits, a user \
          namespace that maps the owning group away, or SELinux/AppArmor. NVML then says \
          'Insufficient Permissions' or 'Unknown Error', and cuInit returns 999.",
    produces: &[
        (Fits::Open(&["EPERM", "EACCES"]), Strong),
        (Fits::Host(HostSymptom::NodeDenied), Strong),
        (Fits::Host(HostSymptom::SmiUnknownError), Weak),
        (Fits::Cuinit(&[999, 100, 3]), Weak),
        (Fits::StartCall(&[]), Weak),
        (Fits::DeviceCountLow, Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[
        (OpenDenied, Decisive),
        (NodeOpenDenied, Strong),
        (AllowListMissesUvm, Strong),
        (InContainer, Weak),
    ],
    // A node made for another major is refused by an allow-list of the current one: the
    // number, not the policy, is what is wrong.
    against: &[(DeviceOpensOk, Weak), (NodeNumberMismatch, Strong)],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "ls -l /dev/nvidia* && id: each node's owner and mode against your user and groups (in a cgroup v1 container also cat /sys/fs/cgroup/devices/devices.list)",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let major =
        c.e.devices
            .get()
            .and_then(|d| d.get("nvidia-uvm"))
            .map(u32::to_string)
            .unwrap_or_else(|| "<major>".into());
    vec![
        step(
            Where::Host,
            format!(
                "Allow the current nvidia-uvm major ({major}) in the container's device policy; \
                 the major is dynamic and can change at each reboot or module reload. LXC: \
                 `lxc.cgroup2.devices.allow: c {major}:* rwm` in the container config, then \
                 restart it. Docker/Kubernetes: recreate the container or pod so the runtime \
                 re-reads the nodes (after a systemd daemon-reload dropped them: the NVIDIA \
                 Container Toolkit's nvidia-ctk system create-dev-char-symlinks)."
            ),
            &[
                "grep nvidia-uvm /proc/devices",
                "ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools",
            ],
        ),
        step(
            Where::Host,
            "EACCES: fix the node's mode or owner (NVIDIA nodes are normally crw-rw-rw-), the \
             user-namespace mapping or the groups of the container (rootless podman: \
             --group-add keep-groups), or the security module's policy.",
            &["ls -l /dev/nvidia*", "sudo nvidia-modprobe -u -c 0"],
        ),
    ]
}

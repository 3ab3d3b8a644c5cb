//! `device_node_mismatch`: a device node made for another major.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::DeviceNodeMismatch,
    title: "a /dev/nvidia* node's device number is not the one the kernel registered (made for another boot, module load or host)",
    doc: "nvidia-uvm's major is dynamic: the kernel gives it one at each module load \
          (/proc/devices). A node made for an earlier load, copied into a container image or \
          written into a CDI spec or an LXC config keeps the old number: its open reaches no \
          driver (ENXIO, ENODEV), another device, or a device rule written for the new number \
          refuses it (EPERM); cuInit then returns 999. /dev/nvidiactl and /dev/nvidia<N> have \
          the fixed major 195 (nv-chardev-numbers.h).",
    produces: &[
        (Fits::Host(HostSymptom::NodeNumberMismatch), Strong),
        (Fits::Open(&["ENXIO", "ENODEV", "EPERM", "EACCES", "ENOENT"]), Strong),
        (Fits::Cuinit(&[999, 100, 3]), Weak),
        (Fits::Host(HostSymptom::SmiUnknownError), Weak),
        (Fits::Host(HostSymptom::NodeDenied), Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[(NodeNumberMismatch, Decisive)],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "grep nvidia /proc/devices && ls -l /dev/nvidia-uvm*: the node's major must be nvidia-uvm's",
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
                "Recreate the nodes with the current major ({major}): nvidia-modprobe makes them \
                 as CUDA would. Regenerate a CDI spec (nvidia-ctk cdi generate) or fix the \
                 LXC/device-plugin configuration that holds the old number, then recreate the \
                 container.{}",
                c.host_only()
            ),
            &[
                "grep nvidia /proc/devices",
                "sudo nvidia-modprobe -u -c 0",
                "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
            ],
        ),
        step(
            Where::Any,
            "Verify: each node's major matches /proc/devices.",
            &["ls -l /dev/nvidia*"],
        ),
    ]
}

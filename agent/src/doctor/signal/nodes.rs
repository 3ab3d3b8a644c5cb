//! Signals of the device nodes where the process runs (`/dev/nvidia*`, with their device
//! numbers and uvmwatch's own open of each), of the majors the kernel registered
//! (`/proc/devices`), and of the container and its device policy.

use super::super::facts::{DevNode, Evidence};
use super::{Input, Reading, Source, State};

/// The fixed major of `/dev/nvidiactl` and `/dev/nvidia<N>` (`NV_MAJOR_DEVICE_NUMBER`,
/// `kernel-open/common/inc/nv-chardev-numbers.h`; `nvidia-frontend` in `/proc/devices`).
pub const NVIDIA_MAJOR: u32 = 195;

/// `/dev/nvidia<N>` (a GPU node, not `nvidiactl`, UVM or NVSwitch).
pub fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The container kind, when not the host.
pub fn container_kind(e: &Evidence) -> Option<&str> {
    e.container
        .get()
        .map(|c| c.kind.as_str())
        .filter(|k| *k != "host")
}

fn nodes(e: &Evidence) -> Option<&Vec<DevNode>> {
    e.dev_nodes.get()
}

pub(super) fn in_container(i: &Input) -> Reading {
    let f = &i.e.container;
    match f.get() {
        Some(c) => Reading::either(
            c.kind != "host",
            c.kind.clone(),
            "the host",
            Source::host(&f.source),
        ),
        None => Reading::of_unread(f),
    }
}

/// Whether the nvidia module is loaded at all (a node missing on a host without the
/// driver is the driver's absence, read by other signals).
fn node_absent(i: &Input, path: &str) -> Reading {
    let e = i.e;
    match nodes(e) {
        Some(n) => Reading::either(
            !n.iter().any(|d| d.path == path),
            format!("{path} absent"),
            format!("{path} present"),
            Source::host(&e.dev_nodes.source),
        ),
        None => Reading::of_unread(&e.dev_nodes),
    }
}

pub(super) fn ctl_absent(i: &Input) -> Reading {
    node_absent(i, "/dev/nvidiactl")
}

pub(super) fn uvm_absent(i: &Input) -> Reading {
    let r = node_absent(i, "/dev/nvidia-uvm");
    match r.state {
        State::Fails => node_absent(i, "/dev/nvidia-uvm-tools"),
        _ => r,
    }
}

pub(super) fn gpu_nodes_absent(i: &Input) -> Reading {
    let e = i.e;
    match nodes(e) {
        Some(n) => {
            let gpus: Vec<&str> = n
                .iter()
                .filter(|d| is_gpu_node(&d.path))
                .map(|d| d.path.as_str())
                .collect();
            Reading::either(
                gpus.is_empty(),
                "no /dev/nvidia<N>",
                gpus.join(", "),
                Source::host(&e.dev_nodes.source),
            )
        }
        None => Reading::of_unread(&e.dev_nodes),
    }
}

pub(super) fn container_without_gpu(i: &Input) -> Reading {
    let e = i.e;
    let Some(kind) = container_kind(e) else {
        return match e.container.get() {
            Some(_) => Reading::fails("not a container", Source::host(&e.container.source)),
            None => Reading::of_unread(&e.container),
        };
    };
    let host_gpus = e.gpus.get().map(|g| g.len());
    match (nodes(e), host_gpus) {
        (Some(n), Some(g)) => {
            // No GPU node: the runtime gave it none (NVIDIA_VISIBLE_DEVICES=none or void,
            // no --gpus), whatever control and UVM nodes it has.
            let gpu_nodes = n.iter().filter(|d| is_gpu_node(&d.path)).count();
            Reading::either(
                gpu_nodes == 0 && g > 0,
                format!(
                    "{kind} container with no /dev/nvidia<N> node; the host's driver has {g} GPU(s)"
                ),
                format!("{kind} container with {gpu_nodes} GPU node(s)"),
                Source::host(&e.dev_nodes.source),
            )
        }
        (Some(n), None) if !n.is_empty() => Reading::fails(
            format!("{kind} container with {} NVIDIA node(s)", n.len()),
            Source::host(&e.dev_nodes.source),
        ),
        (None, _) => Reading::of_unread(&e.dev_nodes),
        (_, None) => Reading::of_unread(&e.gpus),
    }
}

pub(super) fn uvm_major_missing(i: &Input) -> Reading {
    let e = i.e;
    let nvidia = e.modules.get().map(|m| m.iter().any(|n| n == "nvidia"));
    match (e.devices.get(), nvidia) {
        (_, Some(false)) => Reading::fails(
            "the nvidia module is not loaded",
            Source::host(&e.modules.source),
        ),
        (Some(d), _) => Reading::either(
            !d.contains_key("nvidia-uvm"),
            "no nvidia-uvm major",
            format!(
                "nvidia-uvm major {}",
                d.get("nvidia-uvm").copied().unwrap_or_default()
            ),
            Source::host(&e.devices.source),
        ),
        (None, _) => Reading::of_unread(&e.devices),
    }
}

/// The NVIDIA nodes whose major is not the one the kernel registered for their driver:
/// `(path, major, minor, the kernel's major)`; `Err` with the reading of what could not be
/// read.
fn wrong_majors(e: &Evidence) -> Result<Vec<(&str, u32, u32, u32)>, Reading> {
    let (Some(n), Some(devices)) = (nodes(e), e.devices.get()) else {
        return Err(match nodes(e) {
            None => Reading::of_unread(&e.dev_nodes),
            Some(_) => Reading::of_unread(&e.devices),
        });
    };
    let rm = devices
        .get("nvidia-frontend")
        .copied()
        .unwrap_or(NVIDIA_MAJOR);
    let uvm = devices.get("nvidia-uvm").copied();
    Ok(n.iter()
        .filter_map(|d| {
            let (ma, mi) = d.dev?;
            let want = if d.path.starts_with("/dev/nvidia-uvm") {
                uvm?
            } else if d.path == "/dev/nvidiactl" || is_gpu_node(&d.path) {
                rm
            } else {
                return None;
            };
            (ma != want).then_some((d.path.as_str(), ma, mi, want))
        })
        .collect())
}

/// Whether `/dev/nvidia-uvm` itself was made with a major that is not nvidia-uvm's.
pub(super) fn uvm_major_wrong(e: &Evidence) -> bool {
    wrong_majors(e).is_ok_and(|w| w.iter().any(|(p, ..)| *p == "/dev/nvidia-uvm"))
}

pub(super) fn number_mismatch(i: &Input) -> Reading {
    let e = i.e;
    let wrong = match wrong_majors(e) {
        Ok(w) => w,
        Err(r) => return r,
    };
    Reading::either(
        !wrong.is_empty(),
        wrong
            .iter()
            .map(|(p, ma, mi, want)| format!("{p} is {ma}:{mi}, the kernel's major is {want}"))
            .collect::<Vec<_>>()
            .join("; "),
        "every node has the kernel's major",
        Source::host(&e.dev_nodes.source),
    )
}

/// A cgroup v1 allow-list line (`c 195:* rwm`, `a *:* rwm`) that lets `major:minor` be read
/// and written (`Documentation/admin-guide/cgroup-v1/devices.rst`).
pub fn allow_line_permits(line: &str, major: u32, minor: u32) -> bool {
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

pub(super) fn allow_list_misses_uvm(i: &Input) -> Reading {
    let e = i.e;
    let allow = e.container.get().and_then(|c| c.device_allow.as_ref());
    let devices = e.devices.get();
    let src = Source::host(&e.container.source);
    match (allow, devices.and_then(|d| d.get("nvidia-uvm"))) {
        (Some(lines), Some(&major)) => {
            let rm = devices
                .and_then(|d| d.get("nvidia-frontend"))
                .copied()
                .unwrap_or(NVIDIA_MAJOR);
            let for_gpus = lines.iter().any(|l| allow_line_permits(l, rm, 255));
            let uvm = lines.iter().any(|l| allow_line_permits(l, major, 0));
            Reading::either(
                for_gpus && !uvm,
                format!("{} (nothing for c {major}:*)", lines.join("; ")),
                lines.join("; "),
                src,
            )
        }
        (None, _) if e.container.get().is_some_and(|c| c.kind == "host") => {
            Reading::fails("the host: no device allow-list", src)
        }
        (None, _) => Reading::unknown(
            "no cgroup v1 allow-list to read (cgroup v2: the policy is an eBPF program)",
            src,
        ),
        (_, None) => Reading::of_unread(&e.devices),
    }
}

/// uvmwatch's own open of the nodes: those that failed with one of `errnos` (on the nodes
/// `which` admits).
fn own_open(i: &Input, errnos: &[&str], which: fn(&str) -> bool, what: &str) -> Reading {
    let e = i.e;
    match nodes(e) {
        Some(n) => {
            let tried = n.iter().any(|d| d.open.is_some());
            let bad: Vec<String> = n
                .iter()
                .filter(|d| which(&d.path))
                .filter_map(|d| match &d.open {
                    Some(Err(err)) if errnos.contains(&err.as_str()) => {
                        Some(format!("{}: {err}", d.path))
                    }
                    _ => None,
                })
                .collect();
            let src = Source::host(&e.dev_nodes.source);
            if !bad.is_empty() {
                Reading::holds(bad.join(", "), src)
            } else if tried {
                Reading::fails(format!("no {what}"), src)
            } else {
                Reading::unknown(
                    "uvmwatch did not open the nodes (an observer, or a snapshot)",
                    src,
                )
            }
        }
        None => Reading::of_unread(&e.dev_nodes),
    }
}

pub(super) fn open_denied(i: &Input) -> Reading {
    own_open(i, &["EPERM", "EACCES"], |_| true, "open refused")
}

pub(super) fn uvm_unreachable(i: &Input) -> Reading {
    const UVM: &str = "/dev/nvidia-uvm";
    // The process's own open of it, refused or failed.
    if let Some((p, err)) = i.o.failed_opens.iter().find(|(p, _)| p == UVM) {
        return Reading::holds(
            format!("the process's open of {p}: {err}"),
            Source::probe("probe:openat"),
        );
    }
    let uvm = super::driver::uvm_not_loaded(i);
    if uvm.state == State::Holds {
        return uvm;
    }
    let absent = node_absent(i, UVM);
    if absent.state == State::Holds {
        return absent;
    }
    let denied = own_open(
        i,
        &["EPERM", "EACCES", "ENXIO", "ENODEV"],
        |p| p == UVM,
        "refusal of /dev/nvidia-uvm",
    );
    if denied.state == State::Holds {
        return denied;
    }
    match (absent.state, uvm.state) {
        (State::Fails, State::Fails) => Reading::fails(
            format!("{UVM} there and nvidia_uvm loaded"),
            Source::host(&i.e.dev_nodes.source),
        ),
        _ => Reading::unknown(
            format!("whether {UVM} can be reached is not known"),
            Source::host(&i.e.dev_nodes.source),
        ),
    }
}

pub(super) fn open_eio(i: &Input) -> Reading {
    own_open(
        i,
        &["EIO"],
        |p| is_gpu_node(p) || p == "/dev/nvidiactl",
        "EIO",
    )
}

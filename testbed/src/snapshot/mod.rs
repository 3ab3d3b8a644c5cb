//! Snapshot trees of machines for the doctor's tests: [`write_snapshot_fixture`] lays out,
//! from a small [`SnapshotSpec`], the files the doctor's snapshot reader (`uvmwatch doctor
//! --root DIR`) reads, as a bundle of that machine would hold them (layout:
//! `docs/doctor-bundle.md`). [`SnapshotSpec::default`] is a healthy host: open driver
//! 590.48.01 with HMM on, two H200 GPUs, KASLR on, persistence daemon running. Change the
//! fields to describe a failure; [`smi_q`] and [`boot_dmesg`] plus the `DMESG_*` excerpts
//! build the command outputs. [`gpuless`] has real hosts whose driver finds no GPU.
//!
//! This crate does not depend on the agent: `dev/nodes.json` is written from the format
//! documented in `docs/doctor-bundle.md` ([`NodesFile`] here), and the agent's tests read
//! every tree back through the real collectors.

mod dmesg;
pub mod gpuless;
mod smi;

use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;

pub use dmesg::{
    boot_dmesg, DMESG_ADAPTER_INIT_FAILED, DMESG_API_MISMATCH, DMESG_HMM_ERR_34,
    DMESG_HUNG_TASK_OTHER, DMESG_HUNG_TASK_UVM, DMESG_RESUME, DMESG_SOFT_LOCKUP_UVM, DMESG_XID_79,
};
pub use gpuless::{driver_refused_no_gpu, gpuless_535, gpuless_550};
pub use smi::{smi_q, SmiGpu};

/// Snapshot file describing the device nodes, relative to the snapshot root.
pub const NODES_FILE: &str = "dev/nodes.json";

/// Resource name nvidia_uvm gives HMM device memory in `/proc/iomem`.
const UVM_HMM_RESOURCE: &str = "nvidia-uvm-hmm";

/// Container id used by the container fixtures (64 hex digits).
pub const FIXTURE_CONTAINER_ID: &str =
    "3f8c2a9d0e71b4c6a5d2e9f0817c3b4a6d5e2f1098a7b6c5d4e3f2a1b0c9d8e7";
/// Pod UID used by [`ContainerSpec::Kubernetes`].
pub const FIXTURE_POD_UID: &str = "0f2b6a0e-1c1e-4b9d-9c39-1d9d2b1f4c55";
/// LXC container name used by [`ContainerSpec::Lxc`].
pub const FIXTURE_LXC_NAME: &str = "gpu-ct";

/// The loaded nvidia kernel module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverSpec {
    /// Open kernel module (true) or proprietary.
    pub open: bool,
    /// Version, e.g. `590.48.01`.
    pub version: String,
    /// The architecture it was built for, as its version line names it (`x86_64`,
    /// `aarch64`).
    pub arch: String,
}

impl DriverSpec {
    /// The open kernel module of `version`.
    pub fn open(version: &str) -> Self {
        DriverSpec {
            open: true,
            version: version.to_string(),
            arch: "x86_64".to_string(),
        }
    }

    /// The proprietary kernel module of `version`.
    pub fn proprietary(version: &str) -> Self {
        DriverSpec {
            open: false,
            version: version.to_string(),
            arch: "x86_64".to_string(),
        }
    }

    /// First line of `/proc/driver/nvidia/version` for this module.
    pub fn version_line(&self) -> String {
        if self.open {
            format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for {}  {}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025",
                self.arch, self.version
            )
        } else {
            format!(
                "NVRM version: NVIDIA UNIX {} Kernel Module  {}  Sun May 12 19:39:15 UTC 2024",
                self.arch, self.version
            )
        }
    }
}

/// One `/dev` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Path, e.g. `/dev/nvidia-uvm`.
    pub path: String,
    /// `(major, minor)` of a character device; `None` makes it a plain file (a bind
    /// mount of a node that was missing).
    pub dev: Option<(u32, u32)>,
    /// Recorded open result (`Err("EPERM")`...); `None` = not tried.
    pub open: Option<Result<(), String>>,
}

impl NodeSpec {
    /// A character device node, open not tried.
    pub fn char(path: &str, major: u32, minor: u32) -> Self {
        NodeSpec {
            path: path.to_string(),
            dev: Some((major, minor)),
            open: None,
        }
    }

    /// A plain file where a node should be.
    pub fn file(path: &str) -> Self {
        NodeSpec {
            path: path.to_string(),
            dev: None,
            open: None,
        }
    }

    /// The same node with a recorded open result.
    pub fn with_open(mut self, open: Result<(), &str>) -> Self {
        self.open = Some(open.map_err(str::to_string));
        self
    }
}

/// Where the snapshot's doctor ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerSpec {
    /// On the host (`0::/init.scope`).
    Host,
    /// Docker (`/.dockerenv`, `docker-<id>.scope`).
    Docker,
    /// Podman (`/run/.containerenv`, `container=podman`, private cgroup namespace).
    Podman,
    /// A Kubernetes pod (systemd cgroup driver, containerd).
    Kubernetes,
    /// An LXC container (`container=lxc`, `lxc.payload.<name>`).
    Lxc,
}

/// A process to put in `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Process id.
    pub pid: u32,
    /// Name (`comm`; cut to 15 bytes as the kernel does).
    pub comm: String,
    /// libcuda paths mapped (inside its mount namespace), e.g.
    /// `/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01`.
    pub libcuda: Vec<String>,
}

impl ProcessSpec {
    /// A `python3` process `pid` with these libcuda paths mapped.
    pub fn python3(pid: u32, libcuda: &[&str]) -> Self {
        ProcessSpec {
            pid,
            comm: "python3".to_string(),
            libcuda: libcuda.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// An NVIDIA GPU on the PCI bus of a [`SnapshotSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciGpuSpec {
    /// `0000:01:00.0`.
    pub address: String,
    /// The bound driver (`nvidia`, `vfio-pci`), `None` for none.
    pub driver: Option<String>,
    /// The PCI device ID (`0x2bb5`), `None` = its `device` file not written.
    pub device: Option<u16>,
}

/// A machine to lay out as a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSpec {
    /// Loaded nvidia module; `None` = not loaded (no `/proc/driver/nvidia`, no nvidia
    /// lines in `/proc/modules` and `/proc/devices`).
    pub driver: Option<DriverSpec>,
    /// `nvidia_uvm` loaded (`/sys/module/nvidia_uvm`, `/proc/modules`, `/proc/devices`).
    pub uvm_loaded: bool,
    /// `uvm_disable_hmm` parameter: `Y` when true, `N` when false.
    pub uvm_disable_hmm: bool,
    /// Dynamic major of `nvidia-uvm` in `/proc/devices`.
    pub uvm_major: u32,
    /// `/proc/sys/kernel/osrelease`; `/boot/config-<release>` holds the config.
    pub kernel_release: String,
    /// `/proc/sys/kernel/arch` (`uname -m`: `x86_64`, `aarch64`).
    pub arch: String,
    /// `CONFIG_HMM_MIRROR` and `CONFIG_DEVICE_PRIVATE` set (else "is not set").
    pub hmm_config: bool,
    /// `CONFIG_KPROBES` set.
    pub kprobes: bool,
    /// `nokaslr` on the kernel command line.
    pub nokaslr: bool,
    /// `/proc/iomem` has `nvidia-uvm-hmm` regions (one per GPU node).
    pub iomem_hmm: bool,
    /// `/proc/iomem` is written at all (`false`: not recorded, as a report that does not
    /// show it).
    pub iomem_recorded: bool,
    /// `nvidia-smi -q` output (`commands/nvidia-smi.txt`); `None` = not captured (or
    /// failed, with [`SnapshotSpec::smi_failure`]).
    pub smi: Option<String>,
    /// `nvidia-smi -q` failed: its exit status (`exit status 255`) and output, kept in
    /// `manifest.json` as the doctor's bundles keep a failed command (`command_errors`).
    pub smi_failure: Option<(String, String)>,
    /// Entries of `/proc/driver/nvidia/gpus/` (PCI addresses, `0000:18:00.0`), each a
    /// directory with its `information` file, written when the driver is loaded; `None` =
    /// no such directory (a snapshot that did not record it). Empty: the driver has no GPU.
    pub gpus: Option<Vec<String>>,
    /// Kernel log (`commands/dmesg.txt`); `None` = not captured.
    pub dmesg: Option<String>,
    /// `/dev` entries (`dev/nodes.json`), NVSwitch nodes included.
    pub nodes: Vec<NodeSpec>,
    /// Where the doctor ran.
    pub container: ContainerSpec,
    /// cgroup v1 `devices.list` lines of the doctor's cgroup; `None` = cgroup v2.
    pub device_allow: Option<Vec<String>>,
    /// Daemons running (full names, e.g. `nvidia-persistenced`).
    pub daemons: Vec<String>,
    /// Processes with libcuda mapped.
    pub processes: Vec<ProcessSpec>,
    /// NVIDIA GPUs on the PCI bus, written as `sys/bus/pci/devices/<address>/{vendor,class,
    /// device}` and a `driver` link (none when the driver is `None`); `None` = no
    /// `sys/bus/pci` (a snapshot that did not record it).
    pub pci_gpus: Option<Vec<PciGpuSpec>>,
    /// WSL2: the `libcuda*` file names in `usr/lib/wsl/lib` (an empty directory when
    /// empty); `None` = not WSL2. `/dev/dxg` is a [`SnapshotSpec::nodes`] entry.
    pub wsl_libs: Option<Vec<String>>,
    /// More files `(absolute path, contents)`, written last: they replace what the other
    /// fields wrote (a real host's exact `/proc/devices`, say).
    pub files: Vec<(String, String)>,
}

impl Default for SnapshotSpec {
    fn default() -> Self {
        let driver = DriverSpec::open("590.48.01");
        SnapshotSpec {
            smi: Some(smi_q(&driver.version, &[SmiGpu::h200(0), SmiGpu::h200(1)])),
            dmesg: Some(boot_dmesg(&driver, 508)),
            driver: Some(driver),
            uvm_loaded: true,
            uvm_disable_hmm: false,
            uvm_major: 508,
            kernel_release: "6.8.0-45-generic".to_string(),
            arch: "x86_64".to_string(),
            hmm_config: true,
            kprobes: true,
            nokaslr: false,
            iomem_hmm: true,
            iomem_recorded: true,
            nodes: standard_nodes(2, 508),
            container: ContainerSpec::Host,
            device_allow: None,
            daemons: vec!["nvidia-persistenced".to_string()],
            processes: Vec::new(),
            smi_failure: None,
            gpus: Some(gpu_addresses(2)),
            pci_gpus: None,
            wsl_libs: None,
            files: Vec::new(),
        }
    }
}

/// The PCI addresses of the first `n` GPUs of [`SmiGpu::h200`] as the driver names its
/// `/proc/driver/nvidia/gpus/` entries (`0000:18:00.0`, `0000:2a:00.0`, ...).
pub fn gpu_addresses(n: u32) -> Vec<String> {
    (0..n)
        .map(|i| {
            let bus = SmiGpu::h200(i).bus_id;
            // `00000000:18:00.0` in nvidia-smi, `0000:18:00.0` (lower case) in procfs.
            bus[4..].to_lowercase()
        })
        .collect()
}

/// Contents of `dev/nodes.json` (`docs/doctor-bundle.md`, "Device nodes").
#[derive(Serialize)]
pub struct NodesFile {
    /// One entry per node, in [`SnapshotSpec::nodes`] order.
    pub nodes: Vec<NodeRecord>,
}

/// One entry of `dev/nodes.json`: what `stat(2)` and the collector's `open(2)` said of a
/// path. Absent fields are left out of the JSON.
#[derive(Serialize)]
pub struct NodeRecord {
    /// Absolute path, e.g. `/dev/nvidia-uvm`.
    pub path: String,
    /// File type after following links: `char` (a node) or `file`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Device major number (character devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    /// Device minor number (character devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// Permission bits in octal, e.g. `"0666"`.
    pub mode: &'static str,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Result of the collector's open: `"ok"` or an errno name; absent when not tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open: Option<String>,
}

impl NodeRecord {
    /// The entry of a [`NodeSpec`]: a character device (or a plain file without a device
    /// number), mode 0666, owned by root.
    pub fn of(n: &NodeSpec) -> Self {
        NodeRecord {
            path: n.path.clone(),
            kind: if n.dev.is_some() { "char" } else { "file" },
            major: n.dev.map(|d| d.0),
            minor: n.dev.map(|d| d.1),
            mode: "0666",
            uid: 0,
            gid: 0,
            open: n.open.as_ref().map(|o| match o {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            }),
        }
    }
}

/// `/dev/nvidiactl` (195:255), `/dev/nvidia0..gpus-1` (195:N), `/dev/nvidia-uvm`
/// (`uvm_major`:0) and `/dev/nvidia-uvm-tools` (`uvm_major`:1), opens not tried.
pub fn standard_nodes(gpus: u32, uvm_major: u32) -> Vec<NodeSpec> {
    let mut nodes = vec![NodeSpec::char("/dev/nvidiactl", 195, 255)];
    nodes.extend((0..gpus).map(|n| NodeSpec::char(&format!("/dev/nvidia{n}"), 195, n)));
    nodes.push(NodeSpec::char("/dev/nvidia-uvm", uvm_major, 0));
    nodes.push(NodeSpec::char("/dev/nvidia-uvm-tools", uvm_major, 1));
    nodes
}

/// Writes the snapshot tree of `spec` under `dir` (created if needed). Files written:
/// `proc/sys/kernel/osrelease`, `boot/config-<release>`, `proc/cmdline`, `proc/iomem`,
/// `proc/modules`, `proc/devices`, `proc/driver/nvidia/{version,params}` (driver
/// loaded), `sys/module/nvidia_uvm/parameters/*` (uvm loaded), `dev/nodes.json`,
/// `proc/driver/nvidia/gpus/<pci>/information` (driver loaded, [`SnapshotSpec::gpus`]),
/// `commands/{nvidia-smi,dmesg}.txt` (when given), `manifest.json` (a failed
/// `nvidia-smi`), `proc/{1,self}/cgroup`,
/// `proc/1/environ`, `/.dockerenv` or `/run/.containerenv` (by container),
/// `sys/fs/cgroup/devices/devices.list` (cgroup v1), `sys/bus/pci/devices/<address>/`
/// ([`SnapshotSpec::pci_gpus`]), `usr/lib/wsl/lib/` ([`SnapshotSpec::wsl_libs`]) and
/// `proc/<pid>/{comm,maps}` of the daemons (pids from 1000) and processes, then
/// [`SnapshotSpec::files`].
///
/// Errors: writing under `dir` failed.
pub fn write_snapshot_fixture(dir: &Path, spec: &SnapshotSpec) -> io::Result<()> {
    let put = |path: &str, contents: &[u8]| -> io::Result<()> {
        let p = dir.join(path.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(p, contents)
    };
    let release = &spec.kernel_release;
    put(
        "/proc/sys/kernel/osrelease",
        format!("{release}\n").as_bytes(),
    )?;
    put(
        "/proc/sys/kernel/arch",
        format!("{}\n", spec.arch).as_bytes(),
    )?;
    put(
        &format!("/boot/config-{release}"),
        kernel_config(spec).as_bytes(),
    )?;
    let mut cmdline = format!(
        "BOOT_IMAGE=/vmlinuz-{release} root=UUID=3b6c0f0e-8d2a-4c51-9e1f-5a7b2c9d4e10 ro quiet splash"
    );
    if spec.nokaslr {
        cmdline.push_str(" nokaslr");
    }
    put("/proc/cmdline", format!("{cmdline}\n").as_bytes())?;
    if spec.iomem_recorded {
        put("/proc/iomem", iomem(spec).as_bytes())?;
    }
    put("/proc/modules", modules(spec).as_bytes())?;
    put("/proc/devices", devices(spec).as_bytes())?;
    if let Some(driver) = &spec.driver {
        put(
            "/proc/driver/nvidia/version",
            format!(
                "{}\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n",
                driver.version_line()
            )
            .as_bytes(),
        )?;
        put("/proc/driver/nvidia/params", DRIVER_PARAMS.as_bytes())?;
        if let Some(gpus) = &spec.gpus {
            fs::create_dir_all(dir.join("proc/driver/nvidia/gpus"))?;
            for (minor, pci) in gpus.iter().enumerate() {
                put(
                    &format!("/proc/driver/nvidia/gpus/{pci}/information"),
                    gpu_information(pci, minor).as_bytes(),
                )?;
            }
        }
    }
    if spec.uvm_loaded {
        let hmm = if spec.uvm_disable_hmm { "Y" } else { "N" };
        for (name, value) in [
            ("uvm_disable_hmm", hmm),
            ("uvm_debug_prints", "0"),
            ("uvm_ats_mode", "1"),
            ("uvm_perf_prefetch_enable", "1"),
            ("uvm_global_oversubscription", "1"),
            ("uvm_page_table_location", "(null)"),
            ("uvm_enable_builtin_tests", "0"),
        ] {
            put(
                &format!("/sys/module/nvidia_uvm/parameters/{name}"),
                format!("{value}\n").as_bytes(),
            )?;
        }
    }
    let nodes = NodesFile {
        nodes: spec.nodes.iter().map(NodeRecord::of).collect(),
    };
    put(
        NODES_FILE,
        &serde_json::to_vec_pretty(&nodes).map_err(io::Error::other)?,
    )?;
    if let Some(smi) = &spec.smi {
        put("/commands/nvidia-smi.txt", smi.as_bytes())?;
    }
    if let Some(dmesg) = &spec.dmesg {
        put("/commands/dmesg.txt", dmesg.as_bytes())?;
    }
    if let Some((status, output)) = &spec.smi_failure {
        // The manifest of docs/doctor-bundle.md, with only the failed command in it.
        let manifest = serde_json::json!({
            "format": 1,
            "command_errors": {
                "nvidia-smi": {
                    "kind": "failed",
                    "command": "nvidia-smi -q",
                    "status": status,
                    "output": output,
                }
            }
        });
        put(
            "/manifest.json",
            &serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?,
        )?;
    }
    if let Some(gpus) = &spec.pci_gpus {
        fs::create_dir_all(dir.join("sys/bus/pci/devices"))?;
        for PciGpuSpec {
            address,
            driver,
            device,
        } in gpus
        {
            let d = format!("/sys/bus/pci/devices/{address}");
            put(&format!("{d}/vendor"), b"0x10de\n")?;
            put(&format!("{d}/class"), b"0x030200\n")?;
            if let Some(device) = device {
                put(
                    &format!("{d}/device"),
                    format!("0x{device:04x}\n").as_bytes(),
                )?;
            }
            if let Some(driver) = driver {
                std::os::unix::fs::symlink(
                    format!("../../../../bus/pci/drivers/{driver}"),
                    dir.join(d.trim_start_matches('/')).join("driver"),
                )?;
            }
        }
    }
    if let Some(libs) = &spec.wsl_libs {
        fs::create_dir_all(dir.join("usr/lib/wsl/lib"))?;
        for lib in libs {
            put(&format!("/usr/lib/wsl/lib/{lib}"), b"")?;
        }
    }
    write_container(spec, &put)?;
    put("/proc/1/comm", b"systemd\n")?;
    for (i, name) in spec.daemons.iter().enumerate() {
        let pid = 1000 + i as u32;
        put(&format!("/proc/{pid}/comm"), comm(name).as_bytes())?;
        put(&format!("/proc/{pid}/maps"), maps(&[]).as_bytes())?;
    }
    for p in &spec.processes {
        put(&format!("/proc/{}/comm", p.pid), comm(&p.comm).as_bytes())?;
        put(
            &format!("/proc/{}/maps", p.pid),
            maps(&p.libcuda).as_bytes(),
        )?;
    }
    for (path, contents) in &spec.files {
        put(path, contents.as_bytes())?;
    }
    Ok(())
}

/// `/proc/driver/nvidia/gpus/<pci>/information` of an H200, in the driver's format
/// (`nv_procfs_read_gpu_info`, `kernel-open/nvidia/nv-procfs.c`).
fn gpu_information(pci: &str, minor: usize) -> String {
    format!(
        "Model: \t\t NVIDIA H200\n\
         IRQ:   \t\t {irq}\n\
         GPU UUID: \t GPU-5f3c2a9d-0e71-b4c6-a5d2-e9f0817c3b{minor:02x}\n\
         Video BIOS: \t 96.00.a5.00.01\n\
         Bus Type: \t PCIe\n\
         DMA Size: \t 52 bits\n\
         DMA Mask: \t 0xfffffffffffff\n\
         Bus Location: \t {pci}\n\
         Device Minor: \t {minor}\n\
         GPU Firmware: \t 590.48.01\n\
         GPU Excluded:\t No\n",
        irq = 400 + minor
    )
}

fn comm(name: &str) -> String {
    let cut: String = name.chars().take(15).collect();
    format!("{cut}\n")
}

fn maps(libcuda: &[String]) -> String {
    let mut out = String::from(
        "5581d0a00000-5581d0a01000 r--p 00000000 fd:01 1311 /usr/bin/python3.11\n\
         7f3a5c000000-7f3a5c028000 r--p 00000000 fd:01 2203 /usr/lib/x86_64-linux-gnu/libc.so.6\n",
    );
    for (i, path) in libcuda.iter().enumerate() {
        let base = 0x7f3a_6000_0000u64 + (i as u64) * 0x0400_0000;
        out.push_str(&format!(
            "{:x}-{:x} r--p 00000000 fd:01 {} {path}\n{:x}-{:x} r-xp 00400000 fd:01 {} {path}\n",
            base,
            base + 0x40_0000,
            4400 + i,
            base + 0x40_0000,
            base + 0x100_0000,
            4400 + i
        ));
    }
    out.push_str(
        "7f3a6f000000-7f3a6f100000 r-xp 00000000 fd:01 5120 /usr/local/cuda/lib64/libcudart.so.12.8.90\n\
         7ffd4c893000-7ffd4c8b4000 rw-p 00000000 00:00 0                          [stack]\n",
    );
    out
}

fn write_container(
    spec: &SnapshotSpec,
    put: &dyn Fn(&str, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let id = FIXTURE_CONTAINER_ID;
    let (pid1, own, environ): (String, String, &str) = match spec.container {
        ContainerSpec::Host => (
            "0::/init.scope\n".into(),
            "0::/user.slice/user-0.slice/session-4.scope\n".into(),
            "HOME=/\0TERM=linux\0",
        ),
        ContainerSpec::Docker => {
            put("/.dockerenv", b"")?;
            let line = format!("0::/system.slice/docker-{id}.scope\n");
            (line.clone(), line, "PATH=/usr/bin\0HOSTNAME=3f8c2a9d0e71\0")
        }
        ContainerSpec::Podman => {
            put(
                "/run/.containerenv",
                b"engine=\"podman-4.3.1\"\nname=\"train\"\nrootless=0\n",
            )?;
            (
                "0::/\n".into(),
                "0::/\n".into(),
                "container=podman\0HOME=/root\0",
            )
        }
        ContainerSpec::Kubernetes => {
            let uid = FIXTURE_POD_UID.replace('-', "_");
            let line = format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{id}.scope\n"
            );
            (
                line.clone(),
                line,
                "KUBERNETES_SERVICE_HOST=10.96.0.1\0KUBERNETES_PORT=tcp://10.96.0.1:443\0",
            )
        }
        ContainerSpec::Lxc => {
            let line = format!("0::/lxc.payload.{FIXTURE_LXC_NAME}/init.scope\n");
            (line.clone(), line, "container=lxc\0PATH=/usr/bin\0")
        }
    };
    let (pid1, own) = match &spec.device_allow {
        // cgroup v1: a devices controller line ahead of the v2 one.
        Some(allow) => {
            put(
                "/sys/fs/cgroup/devices/devices.list",
                format!("{}\n", allow.join("\n")).as_bytes(),
            )?;
            let v1 = |text: &str| {
                let path = text.trim().trim_start_matches("0::");
                format!("12:devices:{path}\n11:memory:{path}\n{text}")
            };
            (v1(&pid1), v1(&own))
        }
        None => {
            put(
                "/sys/fs/cgroup/cgroup.controllers",
                b"cpuset cpu io memory hugetlb pids rdma misc\n",
            )?;
            (pid1, own)
        }
    };
    put("/proc/1/cgroup", pid1.as_bytes())?;
    put("/proc/self/cgroup", own.as_bytes())?;
    put("/proc/1/environ", environ.as_bytes())
}

fn kernel_config(spec: &SnapshotSpec) -> String {
    let opt = |key: &str, on: bool| {
        if on {
            format!("{key}=y\n")
        } else {
            format!("# {key} is not set\n")
        }
    };
    let mut out = format!(
        "#\n# Automatically generated file; DO NOT EDIT.\n# Linux/x86 {} Kernel Configuration\n#\n",
        spec.kernel_release
    );
    out.push_str("CONFIG_CC_VERSION_TEXT=\"x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0\"\n");
    out.push_str("CONFIG_64BIT=y\nCONFIG_X86_64=y\n");
    out.push_str(&opt("CONFIG_RANDOMIZE_BASE", true));
    out.push_str(&opt("CONFIG_RANDOMIZE_MEMORY", true));
    out.push_str("CONFIG_MMU_NOTIFIER=y\n");
    out.push_str(&opt("CONFIG_ZONE_DEVICE", true));
    out.push_str(&opt("CONFIG_HMM_MIRROR", spec.hmm_config));
    out.push_str(&opt("CONFIG_DEVICE_PRIVATE", spec.hmm_config));
    out.push_str(&opt("CONFIG_KPROBES", spec.kprobes));
    out.push_str("CONFIG_MODULES=y\nCONFIG_LOCALVERSION=\"\"\n");
    out
}

fn iomem(spec: &SnapshotSpec) -> String {
    let mut out = String::from(
        "00000000-00000fff : Reserved\n\
         00001000-0009ffff : System RAM\n\
         00100000-5fffffff : System RAM\n\
         \x20 0a000000-0b7fffff : Kernel code\n\
         \x20 0b800000-0c2fffff : Kernel rodata\n\
         e0000000-efffffff : PCI MMCONFIG 0000 [bus 00-ff]\n\
         100000000-207fffffff : System RAM\n",
    );
    if spec.iomem_hmm {
        let gpus = spec
            .nodes
            .iter()
            .filter(|n| {
                n.path
                    .strip_prefix("/dev/nvidia")
                    .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            })
            .count()
            .max(1);
        for g in 0..gpus as u64 {
            let start = 0x3ff0_0000_0000u64 - (g + 1) * 0x20_0000_0000;
            out.push_str(&format!(
                "{:x}-{:x} : {}\n",
                start,
                start + 0x1f_ffff_ffff,
                UVM_HMM_RESOURCE
            ));
        }
    }
    out
}

fn modules(spec: &SnapshotSpec) -> String {
    let mut out = String::new();
    if spec.driver.is_some() {
        if spec.uvm_loaded {
            out.push_str("nvidia_uvm 2084864 4 - Live 0xffffffffc2a00000 (OE)\n");
        }
        out.push_str("nvidia_drm 122880 0 - Live 0xffffffffc29d0000 (OE)\n");
        out.push_str("nvidia_modeset 1556480 1 nvidia_drm, Live 0xffffffffc2850000 (OE)\n");
        out.push_str(
            "nvidia 11513856 32 nvidia_uvm,nvidia_modeset, Live 0xffffffffc1c00000 (OE)\n",
        );
    }
    out.push_str("ext4 1114112 2 - Live 0xffffffffc0a00000\n");
    out.push_str("overlay 212992 4 - Live 0xffffffffc09c0000\n");
    out
}

fn devices(spec: &SnapshotSpec) -> String {
    let mut out = String::from(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n  5 /dev/console\n 10 misc\n 13 input\n 89 i2c\n",
    );
    if spec.driver.is_some() {
        out.push_str("195 nvidia-frontend\n");
        if spec
            .nodes
            .iter()
            .any(|n| n.path.starts_with("/dev/nvidia-nvswitch"))
        {
            out.push_str("234 nvidia-nvswitch\n");
        }
        out.push_str("235 nvidia-caps\n");
    }
    out.push_str("226 drm\n");
    if spec.driver.is_some() && spec.uvm_loaded {
        out.push_str(&format!("{} nvidia-uvm\n", spec.uvm_major));
    }
    if spec.driver.is_some() {
        out.push_str("509 nvidia-nvlink\n");
    }
    out.push_str("\nBlock devices:\n  7 loop\n  8 sd\n  9 md\n259 blkext\n");
    out
}

const DRIVER_PARAMS: &str = "ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
CoherentGPUMemoryMode: 
RegistryDwords: \"\"
RegistryDwordsPerDevice: \"\"
RmMsg: \"\"
GpuBlacklist: \"\"
TemporaryFilePath: \"\"
ExcludedGpus: \"\"
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_file_has_the_documented_fields() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = SnapshotSpec::default();
        spec.nodes.push(NodeSpec::file("/dev/nvidia-modeset"));
        spec.nodes[0] = spec.nodes[0].clone().with_open(Err("EPERM"));
        write_snapshot_fixture(dir.path(), &spec).unwrap();
        let text = fs::read_to_string(dir.path().join(NODES_FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), spec.nodes.len());
        assert_eq!(
            nodes[0],
            serde_json::json!({
                "path": "/dev/nvidiactl", "type": "char", "major": 195, "minor": 255,
                "mode": "0666", "uid": 0, "gid": 0, "open": "EPERM"
            })
        );
        assert_eq!(
            nodes.last().unwrap(),
            &serde_json::json!({
                "path": "/dev/nvidia-modeset", "type": "file", "mode": "0666", "uid": 0, "gid": 0
            })
        );
        // Keys in the documented order, as the agent's bundles write them.
        assert!(text.find("\"path\"").unwrap() < text.find("\"type\"").unwrap());
        assert!(text.find("\"gid\"").unwrap() < text.find("\"open\"").unwrap());
    }
}

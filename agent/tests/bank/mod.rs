//! The bank's case format, shared by the incident bank (`incidents.rs`) and the causes'
//! golden cases (`causes.rs`): a host as a report tells it ([`Host`], every field left out
//! the healthy host of [`SnapshotSpec::default`]) laid out as a snapshot tree the real
//! `uvmwatch doctor --root` reads, with a process's observations when there are any
//! (`docs/testing.md`, "The incident bank").

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use uvmwatch_testbed::snapshot::gpuless::SMI_NO_DRIVER;
use uvmwatch_testbed::snapshot::{
    boot_dmesg, gpu_addresses, smi_q, standard_nodes, ContainerSpec, DriverSpec, NodeSpec,
    PciGpuSpec, ProcessSpec, SmiGpu,
};
use uvmwatch_testbed::{write_snapshot_fixture, SnapshotSpec};

/// Every id a case may name first or absent: the causes (`uvmwatch::doctor::cause::CAUSES`,
/// the one list) and `unexplained_failure`.
pub fn cause_ids() -> Vec<&'static str> {
    uvmwatch::doctor::cause::CAUSES
        .iter()
        .map(|c| c.id.as_str())
        .chain(["unexplained_failure"])
        .collect()
}

/// The host, as far as the report tells it; every field left out is the healthy host of
/// [`SnapshotSpec::default`] (or of WSL2 for `environment: "wsl2"`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    environment: Option<String>,
    /// `x86_64` (default) or `aarch64`.
    arch: Option<String>,
    /// Kernel lockdown: `none`, `integrity`, `confidentiality` (not recorded by default).
    lockdown: Option<String>,
    /// UEFI Secure Boot on (not recorded by default).
    secure_boot: Option<bool>,
    kernel: Option<String>,
    kernel_hmm: Option<bool>,
    nokaslr: Option<bool>,
    /// Absent: the default driver; `null`: not loaded.
    #[serde(default, deserialize_with = "present")]
    driver: Option<Option<Driver>>,
    uvm_loaded: Option<bool>,
    uvm_disable_hmm: Option<bool>,
    hmm_regions: Option<bool>,
    /// The `nvidia-uvm` major of `/proc/devices`.
    uvm_major: Option<u32>,
    pci_gpus: Option<Vec<PciGpu>>,
    registered_gpus: Option<u32>,
    smi: Option<String>,
    gpu: Option<Gpu>,
    nvswitch: Option<bool>,
    daemons: Option<Vec<String>>,
    dmesg: Option<Vec<String>>,
    missing_nodes: Option<Vec<String>>,
    denied_nodes: Option<BTreeMap<String, String>>,
    /// Device numbers of nodes as `ls -l` shows them (`MAJ:MIN`), where they differ from
    /// the driver's, or nodes the default set lacks.
    node_numbers: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "present")]
    device_allow: Option<Option<Vec<String>>>,
    libcuda: Option<Vec<String>>,
    /// WSL2 only: the `libcuda*` names in `/usr/lib/wsl/lib` (default: WSL's three).
    wsl_libs: Option<Vec<String>>,
    /// WSL2 only: `/dev/dxg` there (default: yes).
    dxg: Option<bool>,
    /// More files, absolute path to contents.
    files: Option<BTreeMap<String, String>>,
}

/// A field that may be `null` (`Some(None)`) as opposed to absent (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Driver {
    version: String,
    /// `open` or `proprietary`; left out: open (the healthy host's).
    flavor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PciGpu {
    address: String,
    driver: Option<String>,
    /// `10de:2bb1`, as `lspci -nn` shows it.
    device_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Gpu {
    product: Option<String>,
    count: Option<u32>,
    persistence: Option<bool>,
    compute_mode: Option<String>,
    mig: Option<bool>,
    /// MIG devices per GPU (with MIG on).
    mig_instances: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    fabric_state: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    addressing: Option<Option<String>>,
}

/// WSL2's kernel when a WSL2 case gives none.
const WSL_KERNEL: &str = "5.15.153.1-microsoft-standard-WSL2";

/// The snapshot of a case's host: [`SnapshotSpec::default`] with what the case says.
pub fn spec_of(h: &Host) -> SnapshotSpec {
    let mut s = SnapshotSpec::default();
    let wsl = h.environment.as_deref() == Some("wsl2");
    s.container = match h.environment.as_deref() {
        None | Some("bare_metal") | Some("wsl2") => ContainerSpec::Host,
        Some("docker") => ContainerSpec::Docker,
        Some("podman") => ContainerSpec::Podman,
        Some("kubernetes") => ContainerSpec::Kubernetes,
        Some("lxc") => ContainerSpec::Lxc,
        Some(other) => panic!("unknown environment {other}"),
    };
    if wsl {
        s.kernel_release = WSL_KERNEL.to_string();
        s.driver = None;
        s.uvm_loaded = false;
        s.hmm_config = false;
        s.iomem_hmm = false;
        s.smi = None;
        s.gpus = None;
        s.daemons = Vec::new();
        s.pci_gpus = Some(Vec::new());
        s.wsl_libs = Some(h.wsl_libs.clone().unwrap_or_else(|| {
            ["libcuda.so", "libcuda.so.1", "libcuda.so.1.1"]
                .map(String::from)
                .to_vec()
        }));
        s.nodes = if h.dxg.unwrap_or(true) {
            vec![NodeSpec::char("/dev/dxg", 10, 125)]
        } else {
            Vec::new()
        };
        s.dmesg = Some(format!(
            "[    0.000000] Linux version {WSL_KERNEL} (root@1b4e3f) (gcc (GCC) 11.2.0) #1 SMP\n"
        ));
        s.processes = h
            .libcuda
            .clone()
            .map(|l| {
                vec![ProcessSpec::python3(
                    4242,
                    &l.iter().map(String::as_str).collect::<Vec<_>>(),
                )]
            })
            .unwrap_or_default();
        if let Some(k) = &h.kernel {
            s.kernel_release = k.clone();
        }
        if let Some(files) = &h.files {
            s.files = files.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        return s;
    }
    if let Some(k) = &h.kernel {
        s.kernel_release = k.clone();
    }
    if let Some(a) = &h.arch {
        assert!(
            ["x86_64", "aarch64"].contains(&a.as_str()),
            "arch {a}: x86_64 or aarch64"
        );
        s.arch = a.clone();
    }
    if let Some(v) = h.kernel_hmm {
        s.hmm_config = v;
    }
    if let Some(v) = h.nokaslr {
        s.nokaslr = v;
    }
    match &h.driver {
        None => {}
        Some(Some(d)) => {
            s.driver = Some(DriverSpec {
                open: match d.flavor.as_deref().unwrap_or("open") {
                    "open" => true,
                    "proprietary" => false,
                    other => panic!("flavor {other}: open or proprietary"),
                },
                version: d.version.clone(),
                arch: s.arch.clone(),
            })
        }
        Some(None) => {
            s.driver = None;
            s.uvm_loaded = false;
            s.gpus = None;
            s.nodes = Vec::new();
            s.smi = None;
            s.smi_failure = Some(("exit status 9".into(), SMI_NO_DRIVER.into()));
            s.daemons = Vec::new();
        }
    }
    if let Some(v) = h.uvm_loaded {
        s.uvm_loaded = v;
    }
    // Left out: what nvidia_uvm defaults to for this driver and architecture (`uvm_hmm.c`:
    // HMM off by default off x86_64, and before 535).
    s.uvm_disable_hmm = match h.uvm_disable_hmm {
        Some(v) => v,
        None => {
            let major = s
                .driver
                .as_ref()
                .and_then(|d| d.version.split('.').next()?.parse::<u32>().ok());
            s.arch != "x86_64" || major.is_some_and(|m| m < 535)
        }
    };
    if let Some(v) = h.hmm_regions {
        s.iomem_hmm = v;
    }
    if let Some(m) = h.uvm_major {
        s.uvm_major = m;
    }
    let gpu = h.gpu.as_ref();
    let count = h
        .registered_gpus
        .or(gpu.and_then(|g| g.count))
        .unwrap_or(if s.driver.is_some() { 2 } else { 0 });
    if s.driver.is_some() {
        s.gpus = Some(gpu_addresses(count));
        s.nodes = standard_nodes(count, s.uvm_major);
        if !s.uvm_loaded {
            s.nodes.retain(|n| !n.path.starts_with("/dev/nvidia-uvm"));
        }
    }
    if let Some(pci) = &h.pci_gpus {
        s.pci_gpus = Some(
            pci.iter()
                .map(|g| PciGpuSpec {
                    address: g.address.clone(),
                    driver: g.driver.clone(),
                    device: g.device_id.as_deref().map(|id| {
                        let hex = id.strip_prefix("10de:").expect("device_id 10de:xxxx");
                        u16::from_str_radix(hex, 16).expect("device_id hex")
                    }),
                })
                .collect(),
        );
    }
    let version = s
        .driver
        .as_ref()
        .map(|d| d.version.clone())
        .unwrap_or_else(|| "590.48.01".into());
    if let Some(driver) = &s.driver {
        let gpus: Vec<SmiGpu> = (0..count.max(1))
            .take(count as usize)
            .map(|i| smi_gpu(i, gpu))
            .collect();
        s.dmesg = Some(boot_dmesg(driver, s.uvm_major));
        s.smi = Some(smi_q(&version, &gpus));
    }
    match h.smi.as_deref() {
        None | Some("gpus") => {}
        Some("not_captured") => s.smi = None,
        Some(other) => {
            let (status, out) = match other {
                "no_devices" => ("exit status 6", "No devices were found\n"),
                "no_driver" => ("exit status 9", SMI_NO_DRIVER),
                "nvml_mismatch" => (
                    "exit status 18",
                    "Failed to initialize NVML: Driver/library version mismatch\n",
                ),
                "nvml_unknown_error" => (
                    "exit status 255",
                    "Failed to initialize NVML: Unknown Error\n",
                ),
                other => panic!("smi {other}"),
            };
            s.smi = None;
            s.smi_failure = Some((status.into(), out.into()));
        }
    }
    if h.nvswitch == Some(true) {
        for n in 0..4 {
            s.nodes
                .push(NodeSpec::char(&format!("/dev/nvidia-nvswitch{n}"), 509, n));
        }
    }
    if let Some(d) = &h.daemons {
        s.daemons = d.clone();
    }
    if let Some(lines) = &h.dmesg {
        let mut log = s.dmesg.take().unwrap_or_default();
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with('[') {
                log.push_str(l);
            } else {
                log.push_str(&format!("[ {:>4}.{:06}] {l}", 600 + i, 0));
            }
            log.push('\n');
        }
        s.dmesg = Some(log);
    }
    if let Some(missing) = &h.missing_nodes {
        s.nodes.retain(|n| !missing.contains(&n.path));
    }
    if let Some(numbers) = &h.node_numbers {
        for (path, dev) in numbers {
            let (ma, mi) = dev
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or_else(|| panic!("node_numbers {path}: {dev} is not MAJ:MIN"));
            match s.nodes.iter_mut().find(|n| &n.path == path) {
                Some(n) => n.dev = Some((ma, mi)),
                None => s.nodes.push(NodeSpec::char(path, ma, mi)),
            }
        }
    }
    if let Some(denied) = &h.denied_nodes {
        for n in &mut s.nodes {
            if let Some(errno) = denied.get(&n.path) {
                n.open = Some(Err(errno.clone()));
            }
        }
    }
    if let Some(allow) = &h.device_allow {
        s.device_allow = allow.clone();
    }
    if let Some(l) = &h.libcuda {
        s.processes = vec![ProcessSpec::python3(
            4242,
            &l.iter().map(String::as_str).collect::<Vec<_>>(),
        )];
    }
    if let Some(l) = &h.lockdown {
        // `security/lockdown/lockdown.c` lists every level and brackets the current one.
        let line = ["none", "integrity", "confidentiality"]
            .map(|x| {
                if x == l {
                    format!("[{x}]")
                } else {
                    x.to_string()
                }
            })
            .join(" ");
        s.files.push((LOCKDOWN.to_string(), format!("{line}\n")));
    }
    if let Some(on) = h.secure_boot {
        // The efivar: 4 bytes of attributes, then the value byte.
        let value = if on {
            "\u{6}\0\0\0\u{1}"
        } else {
            "\u{6}\0\0\0\0"
        };
        s.files.push((SECURE_BOOT.to_string(), value.to_string()));
    }
    if let Some(files) = &h.files {
        s.files
            .extend(files.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    s
}

/// Where the kernel says its lockdown level.
const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

/// UEFI's `SecureBoot` variable (the EFI global variable GUID).
const SECURE_BOOT: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

fn smi_gpu(i: u32, g: Option<&Gpu>) -> SmiGpu {
    let mut s = SmiGpu::h200(i);
    let Some(g) = g else { return s };
    if let Some(p) = &g.product {
        s.product_name = p.clone();
    }
    if let Some(p) = g.persistence {
        s.persistence_mode = if p { "Enabled" } else { "Disabled" }.into();
    }
    if let Some(c) = &g.compute_mode {
        s.compute_mode = c.clone();
    }
    if let Some(m) = g.mig {
        s.mig_mode = if m { "Enabled" } else { "Disabled" }.into();
    }
    // A MIG instance count the report does not give: one per GPU with MIG on (a MIG set-up
    // in use; "MIG on with no instance" is a fact a case states).
    match (g.mig, g.mig_instances) {
        (_, Some(n)) => s.mig_devices = n,
        (Some(true), None) => s.mig_devices = 1,
        _ => {}
    }
    if let Some(f) = &g.fabric_state {
        s.fabric_state = f.clone();
    }
    if let Some(a) = &g.addressing {
        s.addressing_mode = a.clone();
    }
    s
}

/// Lays out `host` (and `observations`, as the snapshot's `observations.json`) under `dir`.
pub fn write_case(dir: &Path, host: &Host, observations: Option<&Value>) {
    let mut spec = spec_of(host);
    // HMM device memory the report does not show: set up (the healthy default), but not
    // where the process's CUDA start failed or hangs, whose set-up may be what failed:
    // there it is not recorded, as the report does not say.
    if host.hmm_regions.is_none() && observations.is_some_and(cuda_start_failed) {
        spec.iomem_recorded = false;
    }
    write_snapshot_fixture(dir, &spec).unwrap();
    if let Some(o) = observations {
        let mut o = o.clone();
        // A report that shows no device open says nothing of them: the opens were not seen
        // (not "none were made").
        if let Some(m) = o.as_object_mut() {
            if !m.contains_key("device_opens") && !m.contains_key("failed_opens") {
                m.entry("unavailable_probes")
                    .or_insert_with(|| Value::Array(Vec::new()))
                    .as_array_mut()
                    .expect("unavailable_probes: a list")
                    .push(Value::from("openat: not in the report"));
            }
        }
        fs::write(
            dir.join("observations.json"),
            serde_json::to_vec_pretty(&o).unwrap(),
        )
        .unwrap();
    }
}

/// Whether `observations` record `cuInit` failing or hanging.
fn cuda_start_failed(o: &Value) -> bool {
    o["cuinit_result"].as_i64().is_some_and(|r| r != 0)
        || o["cuinit_in_flight"] == Value::Bool(true)
        || o["stuck_in"].is_object()
}

/// `uvmwatch doctor --root dir` in `format` (`json`, `text`): its standard output.
pub fn doctor(dir: &Path, format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--format", format, "--root"])
        .arg(dir)
        .output()
        .expect("run uvmwatch doctor");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

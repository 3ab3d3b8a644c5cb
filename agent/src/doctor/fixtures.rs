//! Evidence and observations for the doctor's unit tests, built once for all of them:
//! - typed [`Evidence`] built in code: [`healthy_open_host`], [`motivating_host`],
//!   [`no_driver_host`] and their [`Tweak`]s, for the rules' logic and the report;
//! - evidence read back by the real collectors from a snapshot tree written by
//!   `uvmwatch_testbed::snapshot` ([`snapshot_evidence`], [`incident_spec`] and the helpers
//!   for its command outputs), for the rules on what a machine's files say;
//! - what the probes saw for one process: [`watched`] and its [`Saw`] changes, [`plain`]
//!   for a plain `uvmwatch doctor`, [`register_gpu_no_memory`] for the motivating incident.

use std::collections::BTreeMap;
use std::path::Path;

use uvmwatch_testbed::snapshot::{write_snapshot_fixture, SnapshotSpec};

use super::collect::collect;
use super::facts::{
    ContainerInfo, DevNode, DriverInfo, Evidence, Fact, KernelInfo, KernelLog, MappedLibcuda,
    Observations, PciGpu, SeenCall, SmiInfo, SmiOutcome, SmiVerdict,
};
use super::root::Root;

// ---------------------------------------------------------------------------------------
// Evidence built in code

/// The reason a collector gives for a file that is not there.
pub const NO_FILE: &str = "not readable: No such file or directory (os error 2)";

fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn node(path: &str, major: u32, minor: u32) -> DevNode {
    DevNode {
        path: path.into(),
        dev: Some((major, minor)),
        open: Some(Ok(())),
    }
}

fn kernel_config(release: &str) -> Fact<BTreeMap<String, String>> {
    Fact::ok(
        map(&[
            ("CONFIG_HMM_MIRROR", "y"),
            ("CONFIG_DEVICE_PRIVATE", "y"),
            ("CONFIG_RANDOMIZE_BASE", "y"),
            ("CONFIG_RANDOMIZE_MEMORY", "y"),
            ("CONFIG_KPROBES", "y"),
            ("CONFIG_ZONE_DEVICE", "y"),
        ]),
        format!("/boot/config-{release}"),
    )
}

/// A working host: open module 590.48.01, HMM on (`uvm_disable_hmm=N`), KASLR on, one
/// GPU (registered, listed by nvidia-smi, its node there), persistence on, on a 6.12 kernel
/// (which has the x86/kaslr fix). No rule fires.
pub fn healthy_open_host() -> Evidence {
    let release = "6.12.0-55-generic";
    Evidence {
        driver: Fact::ok(
            DriverInfo {
                version: "590.48.01".into(),
                open_module: true,
                arch: Some("x86_64".into()),
                line: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  \
                           Release Build  (dvs-builder@U22-I3-AF03-09-1)"
                    .into(),
            },
            "/proc/driver/nvidia/version",
        ),
        driver_params: Fact::ok(
            map(&[("ModifyDeviceFiles", "1")]),
            "/proc/driver/nvidia/params",
        ),
        uvm_params: Fact::ok(
            map(&[("uvm_disable_hmm", "N"), ("uvm_debug_prints", "N")]),
            "/sys/module/nvidia_uvm/parameters",
        ),
        modules: Fact::ok(
            vec![
                "nvidia_uvm".into(),
                "nvidia_drm".into(),
                "nvidia_modeset".into(),
                "nvidia".into(),
            ],
            "/proc/modules",
        ),
        devices: Fact::ok(
            [
                ("nvidia-frontend".to_string(), 195),
                ("nvidia-uvm".to_string(), 508),
            ]
            .into_iter()
            .collect(),
            "/proc/devices",
        ),
        dev_nodes: Fact::ok(
            vec![
                node("/dev/nvidiactl", 195, 255),
                node("/dev/nvidia0", 195, 0),
                node("/dev/nvidia-uvm", 508, 0),
                node("/dev/nvidia-uvm-tools", 508, 1),
            ],
            "/dev",
        ),
        nvswitch_nodes: Fact::ok(vec![], "/dev/nvidia-nvswitch*"),
        container: Fact::ok(
            ContainerInfo {
                kind: "host".into(),
                id: None,
                pod_uid: None,
                device_allow: None,
            },
            "/proc/1/cgroup",
        ),
        kernel: Fact::ok(
            KernelInfo {
                release: release.into(),
                version: (6, 12),
            },
            "/proc/sys/kernel/osrelease",
        ),
        arch: Fact::ok("x86_64".to_string(), "/proc/sys/kernel/arch"),
        lockdown: Fact::ok("none".to_string(), "/sys/kernel/security/lockdown"),
        secure_boot: Fact::ok(false, "/sys/firmware/efi/efivars"),
        kernel_config: kernel_config(release),
        cmdline: Fact::ok(
            format!("BOOT_IMAGE=/vmlinuz-{release} root=/dev/mapper/vg-root ro quiet splash"),
            "/proc/cmdline",
        ),
        iomem_hmm: Fact::unavailable("addresses hidden: needs root", "/proc/iomem"),
        smi: Fact::ok(
            SmiInfo {
                gpus: 1,
                addressing_mode: vec!["HMM".into()],
                persistence_mode: vec!["Enabled".into()],
                compute_mode: vec!["Default".into()],
                mig_mode: vec!["N/A".into()],
                mig_devices: vec![0],
                fabric_state: vec!["N/A".into()],
                product_brand: vec!["NVIDIA".into()],
                product_name: vec!["NVIDIA H200".into()],
                driver_version: Some("590.48.01".into()),
            },
            "nvidia-smi -q",
        ),
        smi_outcome: Fact::ok(
            SmiOutcome {
                verdict: SmiVerdict::GpusListed,
                status: None,
                message: None,
            },
            "nvidia-smi -q",
        ),
        gpus: Fact::ok(vec!["0000:18:00.0".into()], "/proc/driver/nvidia/gpus"),
        kernel_log: Fact::ok(KernelLog::default(), "/dev/kmsg"),
        daemons: Fact::ok(vec!["nvidia-persistenced".into()], "/proc/*/comm"),
        libcuda: Fact::ok(
            vec![MappedLibcuda {
                pid: 1234,
                comm: "python3".into(),
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                version: Some("590.48.01".into()),
                compat: false,
            }],
            "/proc/*/maps",
        ),
        pci_gpus: Fact::ok(
            vec![PciGpu {
                address: "0000:18:00.0".into(),
                class: "0x030200".into(),
                driver: Some("nvidia".into()),
                // NVIDIA H200 (open-gpu-kernel-modules README, compatible GPUs).
                device: Some(0x2335),
            }],
            "/sys/bus/pci/devices",
        ),
        wsl: Fact::unavailable(
            "not present: not WSL2 (no /dev/dxg, no /usr/lib/wsl/lib)",
            "/usr/lib/wsl/lib",
        ),
    }
}

/// The motivating incident's host: as [`healthy_open_host`] on Ubuntu's 6.8 kernel, which
/// has no x86/kaslr fix.
pub fn motivating_host() -> Evidence {
    healthy_open_host().kernel("6.8.0-45-generic")
}

/// A machine without any NVIDIA driver.
pub fn no_driver_host() -> Evidence {
    let mut e = healthy_open_host();
    e.driver = Fact::unavailable(NO_FILE, "/proc/driver/nvidia/version");
    e.driver_params = Fact::unavailable(NO_FILE, "/proc/driver/nvidia/params");
    e.uvm_params = Fact::unavailable(NO_FILE, "/sys/module/nvidia_uvm/parameters");
    e.modules = Fact::ok(vec![], "/proc/modules");
    e.devices = Fact::ok(BTreeMap::new(), "/proc/devices");
    e.dev_nodes = Fact::ok(vec![], "/dev");
    e.smi = Fact::unavailable("nvidia-smi not present", "nvidia-smi -q");
    e.smi_outcome = Fact::unavailable("nvidia-smi not present", "nvidia-smi -q");
    e.gpus = Fact::unavailable(NO_FILE, "/proc/driver/nvidia/gpus");
    e.daemons = Fact::ok(vec![], "/proc/*/comm");
    e.libcuda = Fact::ok(vec![], "/proc/*/maps");
    if let Ok(gpus) = &mut e.pci_gpus.value {
        gpus.iter_mut().for_each(|g| g.driver = None);
    }
    e
}

/// Tweaks of an [`Evidence`], chained: `motivating_host().hmm_param("Y")`.
pub trait Tweak: Sized {
    /// Any change.
    fn with(self, f: impl FnOnce(&mut Evidence)) -> Self;

    /// Kernel release (version parsed from it).
    fn kernel(self, release: &str) -> Self {
        let mut it = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        let release = release.to_string();
        self.with(move |e| {
            e.kernel = Fact::ok(
                KernelInfo {
                    release: release.clone(),
                    version,
                },
                "/proc/sys/kernel/osrelease",
            );
            let cfg = kernel_config(&release);
            e.kernel_config = Fact {
                value: e.kernel_config.value.clone(),
                source: cfg.source,
            };
        })
    }
    /// `uvm_disable_hmm` as sysfs prints it.
    fn hmm_param(self, v: &str) -> Self {
        let v = v.to_string();
        self.with(|e| {
            if let Ok(m) = &mut e.uvm_params.value {
                m.insert("uvm_disable_hmm".into(), v);
            }
        })
    }
    /// A kernel config option (`None` removes it: "is not set").
    fn config(self, key: &str, v: Option<&str>) -> Self {
        self.with(|e| {
            if let Ok(m) = &mut e.kernel_config.value {
                match v {
                    Some(v) => m.insert(key.into(), v.into()),
                    None => m.remove(key),
                };
            }
        })
    }
    /// `/proc/cmdline`.
    fn cmdline(self, s: &str) -> Self {
        self.with(|e| e.cmdline = Fact::ok(s.to_string(), "/proc/cmdline"))
    }
    /// The proprietary kernel module instead of the open one.
    fn proprietary(self) -> Self {
        self.with(|e| {
            if let Ok(d) = &mut e.driver.value {
                d.open_module = false;
                d.line =
                    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.48.01  Fri Nov 21 2025"
                        .into();
            }
        })
    }
    /// Runs in a container of `kind`, with a cgroup v1 allow-list when given.
    fn container(self, kind: &str, allow: Option<&[&str]>) -> Self {
        self.with(|e| {
            e.container = Fact::ok(
                ContainerInfo {
                    kind: kind.into(),
                    id: Some("c0ffee".into()),
                    pod_uid: None,
                    device_allow: allow.map(|a| a.iter().map(|s| s.to_string()).collect()),
                },
                "/proc/1/cgroup",
            )
        })
    }
    /// Changes the kernel log.
    fn log(self, f: impl FnOnce(&mut KernelLog)) -> Self {
        self.with(|e| {
            if let Ok(l) = &mut e.kernel_log.value {
                f(l)
            }
        })
    }
    /// Changes what nvidia-smi says.
    fn smi(self, f: impl FnOnce(&mut SmiInfo)) -> Self {
        self.with(|e| {
            if let Ok(s) = &mut e.smi.value {
                f(s)
            }
        })
    }
    /// Removes a device node.
    fn without_node(self, path: &str) -> Self {
        self.with(|e| {
            if let Ok(n) = &mut e.dev_nodes.value {
                n.retain(|d| d.path != path)
            }
        })
    }
    /// Replaces the mapped libcuda list.
    fn libcuda(self, libs: Vec<MappedLibcuda>) -> Self {
        self.with(|e| e.libcuda = Fact::ok(libs, "/proc/*/maps"))
    }
    /// Running daemons.
    fn daemons(self, names: &[&str]) -> Self {
        self.with(|e| {
            e.daemons = Fact::ok(
                names.iter().map(|s| s.to_string()).collect(),
                "/proc/*/comm",
            )
        })
    }
}

impl Tweak for Evidence {
    fn with(mut self, f: impl FnOnce(&mut Evidence)) -> Self {
        f(&mut self);
        self
    }
}

/// An LXC allow-list written for an earlier boot: nvidia-uvm was 507 then, 508 now.
pub const STALE_ALLOW: &[&str] = &["c 195:* rwm", "c 507:* rwm", "c 1:3 rwm"];

// ---------------------------------------------------------------------------------------
// Evidence from snapshot trees

/// Writes `spec`, then lets `extra` add files the fixture has no knob for, then collects.
pub fn snapshot_evidence_with(spec: &SnapshotSpec, extra: impl FnOnce(&Path)) -> Evidence {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-rules")
        .tempdir()
        .expect("tempdir");
    write_snapshot_fixture(dir.path(), spec).expect("write snapshot");
    extra(dir.path());
    collect(&Root::Snapshot(dir.path().to_path_buf()))
}

/// The evidence the collectors read from the snapshot tree of `spec`.
pub fn snapshot_evidence(spec: &SnapshotSpec) -> Evidence {
    snapshot_evidence_with(spec, |_| {})
}

/// The motivating machine: the healthy default (open 590 on Ubuntu's 6.8 kernel, HMM on,
/// KASLR on, two H200s) except that UVM never set up HMM device memory (no
/// `nvidia-uvm-hmm` in /proc/iomem).
pub fn incident_spec() -> SnapshotSpec {
    SnapshotSpec {
        iomem_hmm: false,
        ..SnapshotSpec::default()
    }
}

// ---------------------------------------------------------------------------------------
// What the probes saw

/// The pid the probes watched.
pub const PID: u32 = 4242;

/// What the probes saw for process [`PID`], before any tweak: nothing yet.
pub fn watched() -> Observations {
    Observations {
        pid: Some(PID),
        ..Observations::default()
    }
}

/// A plain `uvmwatch doctor`: no process observed.
pub fn plain() -> Observations {
    Observations::default()
}

/// Tweaks of an [`Observations`], chained.
pub trait Saw: Sized {
    /// Any change.
    fn with(self, f: impl FnOnce(&mut Observations)) -> Self;

    /// `cuInit` returned `r` after `secs`.
    fn cuinit(self, r: i64, secs: f64) -> Self {
        self.with(|o| {
            o.cuinit_result = Some(r);
            o.cuinit_seconds = Some(secs);
        })
    }
    /// `cuInit` still running after `secs`.
    fn in_flight(self, secs: f64) -> Self {
        self.with(|o| {
            o.cuinit_in_flight = true;
            o.cuinit_seconds = Some(secs);
        })
    }
    /// `n` successful opens of NVIDIA nodes.
    fn opens(self, n: u32) -> Self {
        self.with(|o| o.device_opens = n)
    }
    /// A failed open.
    fn failed_open(self, path: &str, errno: &str) -> Self {
        self.with(|o| o.failed_opens.push((path.into(), errno.into())))
    }
    /// A driver call that returned `result`.
    fn failed_call(self, call: &str, node: &str, result: &str) -> Self {
        self.with(|o| {
            o.failed_call = Some(SeenCall {
                call: call.into(),
                node: node.into(),
                result: result.into(),
                seconds: 0.05,
            })
        })
    }
    /// A driver call in flight for `secs`, the thread in `state`.
    fn stuck(self, call: &str, node: &str, secs: f64, state: &str) -> Self {
        self.with(|o| {
            o.stuck_in = Some(SeenCall {
                call: call.into(),
                node: node.into(),
                result: String::new(),
                seconds: secs,
            });
            o.stuck_state = Some(state.into());
        })
    }
    /// Forked without exec after the parent's cuInit.
    fn forked(self) -> Self {
        self.with(|o| o.forked_after_parent_init = true)
    }
    /// A probe that is not attached, with why.
    fn unavailable(self, probe: &str) -> Self {
        self.with(|o| o.unavailable_probes.push(probe.into()))
    }
    /// A context or device call `call` (on device 0, unless `cuDeviceGetCount`) that
    /// returned `r` after `secs`.
    fn context(self, call: &str, r: i64, secs: f64) -> Self {
        self.with(|o| {
            o.context_call = Some(call.into());
            o.context_result = Some(r);
            o.context_seconds = Some(secs);
            o.context_device = (call != "cuDeviceGetCount").then_some(0);
        })
    }
    /// The process was started with `CUDA_VISIBLE_DEVICES=v`.
    fn visible_devices(self, v: &str) -> Self {
        self.with(|o| o.cuda_visible_devices = Some(v.into()))
    }
}

impl Saw for Observations {
    fn with(mut self, f: impl FnOnce(&mut Observations)) -> Self {
        f(&mut self);
        self
    }
}

/// The motivating incident: cuInit 3 after UVM_REGISTER_GPU returned NV_ERR_NO_MEMORY,
/// every open having succeeded.
pub fn register_gpu_no_memory() -> Observations {
    watched().cuinit(3, 0.412).opens(4).failed_call(
        "UVM_REGISTER_GPU",
        "/dev/nvidia-uvm",
        "NV_ERR_NO_MEMORY",
    )
}

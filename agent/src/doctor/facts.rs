//! Typed evidence for the diagnosis rules, each fact with where it came from.
//!
//! Collectors (`collect/`) fill an [`Evidence`] from the live system or from a snapshot
//! directory; rules (`rules/`) read it together with what the probes saw
//! ([`Observations`]) and return findings. A source that is missing or malformed is a fact
//! too: [`Fact::value`] is then `Err(Unavailable)` with the reason, never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why a fact could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// Human reason, e.g. "not readable: No such file or directory (os error 2)".
    pub why: String,
}

/// One fact and its source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fact<T> {
    /// The value, or why it is unknown.
    pub value: Result<T, Unavailable>,
    /// Where it came from: a path (`/proc/driver/nvidia/version`) or a command
    /// (`nvidia-smi -q`), as seen on the machine diagnosed (not the snapshot path).
    pub source: String,
}

impl<T> Fact<T> {
    /// A known value from `source`.
    pub fn ok(value: T, source: impl Into<String>) -> Self {
        Fact {
            value: Ok(value),
            source: source.into(),
        }
    }

    /// An unknown value from `source`, with the reason.
    pub fn unavailable(why: impl Into<String>, source: impl Into<String>) -> Self {
        Fact {
            value: Err(Unavailable { why: why.into() }),
            source: source.into(),
        }
    }

    /// The value, if known.
    pub fn get(&self) -> Option<&T> {
        self.value.as_ref().ok()
    }
}

pub use crate::host::driver::DriverInfo;

/// One `/dev/nvidia*` node as found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevNode {
    /// Path, e.g. `/dev/nvidia-uvm`.
    pub path: String,
    /// `(major, minor)` when it is a character device; `None` for other file types.
    pub dev: Option<(u32, u32)>,
    /// Result of `open(O_RDWR)` by the collector: `None` = not tried (snapshot),
    /// `Some(Ok(()))` = opened, `Some(Err(errno name))` = refused.
    pub open: Option<Result<(), String>>,
}

/// Where the diagnosed process (or the doctor itself) runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// `host`, `docker`, `containerd`, `cri-o`, `podman`, `lxc`, `kubernetes` (a pod, any
    /// runtime), `container` (unknown runtime).
    pub kind: String,
    /// Container id or LXC name when known.
    pub id: Option<String>,
    /// Kubernetes pod UID from the cgroup path, when present.
    pub pod_uid: Option<String>,
    /// cgroup v1 `devices.list` lines when readable (`c 195:* rwm`, ...); `None` on cgroup v2
    /// (the device policy is an eBPF program there and cannot be read from inside).
    pub device_allow: Option<Vec<String>>,
}

/// Kernel identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// `uname -r`, e.g. `6.8.0-45-generic`.
    pub release: String,
    /// `(major, minor)` parsed from the release.
    pub version: (u32, u32),
}

/// What `nvidia-smi -q` says (only the fields the rules use).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiInfo {
    /// Number of `GPU 0000:...` sections.
    pub gpus: u32,
    /// `Addressing Mode` of each GPU (`HMM`, `ATS`, `None`), in order.
    pub addressing_mode: Vec<String>,
    /// `Persistence Mode` of each GPU (`Enabled`/`Disabled`).
    pub persistence_mode: Vec<String>,
    /// `Compute Mode` of each GPU (`Default`, `Exclusive_Process`, `Prohibited`).
    pub compute_mode: Vec<String>,
    /// `MIG Mode / Current` of each GPU (`Enabled`/`Disabled`/`N/A`).
    pub mig_mode: Vec<String>,
    /// `MIG Device` blocks of each GPU: the MIG devices (a GPU instance with a compute
    /// instance) that exist on it.
    #[serde(default)]
    pub mig_devices: Vec<u32>,
    /// `Fabric / State` of each GPU (`Completed`, `In Progress`, `Not Started`, `N/A`).
    pub fabric_state: Vec<String>,
    /// `Product Brand` of each GPU (`NVIDIA`, `GeForce`, `Tesla`, ...).
    pub product_brand: Vec<String>,
    /// `Product Name` of each GPU (`NVIDIA H200`, `NVIDIA GeForce RTX 3090`).
    #[serde(default)]
    pub product_name: Vec<String>,
    /// `Driver Version` line.
    pub driver_version: Option<String>,
}

/// What `nvidia-smi -q` said about the GPUs as a whole: whether it listed them, found none,
/// could not reach the driver, or failed otherwise. Read from its exit status and output
/// (`collect::smi::classify_smi`); the rules tell "the driver reports no GPU" from the rest
/// by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmiVerdict {
    /// It ran and listed at least one GPU.
    GpusListed,
    /// The driver answers but reports no GPU: `No devices were found` (exit 6 on most
    /// releases), `Failed to initialize NVML: No supported GPUs were found` (550, exit 255),
    /// `Failed to initialize NVML: Unknown Error` (535 without a GPU, exit 255; also what
    /// NVML says when device access is denied), or a listing with no GPU in it.
    NoGpu,
    /// `NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`
    /// (exit 9): no driver loaded.
    NoDriver,
    /// Any other failure (`Driver/library version mismatch`, `Insufficient Permissions`, a
    /// signal, ...).
    Failed,
}

impl SmiVerdict {
    /// The name used in JSON (`no_gpu`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SmiVerdict::GpusListed => "gpus_listed",
            SmiVerdict::NoGpu => "no_gpu",
            SmiVerdict::NoDriver => "no_driver",
            SmiVerdict::Failed => "failed",
        }
    }
}

/// How `nvidia-smi -q` ended ([`Evidence::smi_outcome`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiOutcome {
    /// What it said about the GPUs.
    pub verdict: SmiVerdict,
    /// `exit status 255`, `signal 9`, ...; `None` when it exited 0 (or when a snapshot kept
    /// only its output).
    pub status: Option<String>,
    /// The line the verdict rests on (`Failed to initialize NVML: No supported GPUs were
    /// found`), or the first line of a failure's output; `None` for a listing.
    pub message: Option<String>,
}

/// Lines of interest from the kernel log, with their text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLog {
    /// Every line starting with `NVRM:` or containing `nvidia-uvm:` / `nvidia:` (last 200).
    pub nvidia_lines: Vec<String>,
    /// Xid numbers seen (`NVRM: Xid (PCI:...): 79, ...`), each once, in the order first seen
    /// (the first [`MAX_XIDS`](crate::doctor::collect::kernel_log::MAX_XIDS) distinct).
    pub xids: Vec<u32>,
    /// An `API mismatch` line (user-space / kernel module version differ).
    pub api_mismatch: Option<String>,
    /// `RmInitAdapter failed` / `rm_init_adapter failed` lines.
    pub adapter_init_failed: Vec<String>,
    /// Lines that say why a GPU did not come up (`collect::kernel_log::ADAPTER_CAUSES`:
    /// the open-module notice, WPR2, BAR, GSP), the first 20.
    #[serde(default)]
    pub adapter_causes: Vec<String>,
    /// Soft lockup, RCU stall, hung task, oops, BUG or WARN lines whose report names an
    /// nvidia symbol (`uvm_`, `nv_`, `_nv0`, `nvidia`).
    pub driver_hangs: Vec<String>,
    /// `request_free_mem_region() err` lines from `uvm_debug_prints` (HMM set-up failure).
    pub hmm_errors: Vec<String>,
    /// A resume from suspend logged after `nvidia-uvm` was loaded.
    pub resumed_after_uvm_load: bool,
    /// The driver's own lines saying, as it failed to load, that it found no GPU to drive
    /// (`collect::kernel_log::NO_GPU_LINES`: `NVRM: No NVIDIA GPU found.`, `NVRM: No NVIDIA
    /// devices probed.`, `NVRM: None of the NVIDIA devices were initialized.`, `NVRM: The
    /// NVIDIA probe routine was not called for N device(s).`, `NVRM: GPU ... is already bound
    /// to vfio-pci.`), those after the last successful load (`NVRM: loading ...`), the first
    /// 20.
    #[serde(default)]
    pub no_gpu: Vec<String>,
    /// Lines of an nvidia module load the kernel refused before the driver ran
    /// (`collect::kernel_log::MODULE_REFUSED_LINES`: signature, lockdown, unknown symbols,
    /// version magic), those after the last successful load, the first 20.
    #[serde(default)]
    pub module_refused: Vec<String>,
    /// Bytes of older log left out: only the newest
    /// [`KERNEL_LOG_LIMIT`](crate::doctor::input::KERNEL_LOG_LIMIT) are read (0 when the
    /// log was read whole).
    #[serde(default)]
    pub dropped_bytes: u64,
}

/// An NVIDIA GPU on the PCI bus (`/sys/bus/pci/devices/<address>/`), whichever driver holds
/// it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciGpu {
    /// PCI address, `0000:01:00.0`.
    pub address: String,
    /// PCI class code (`0x030000` VGA, `0x030200` 3D controller).
    pub class: String,
    /// Kernel driver bound to it (`nvidia`, `vfio-pci`, `nouveau`), the last part of its
    /// `driver` link; `None` when no driver is bound.
    pub driver: Option<String>,
    /// Its PCI device ID (`device`: `0x2bb5`), when read.
    #[serde(default)]
    pub device: Option<u16>,
}

/// Windows Subsystem for Linux 2: the GPU is the Windows host's, shared through `/dev/dxg`,
/// and its user-space driver is in `/usr/lib/wsl/lib` (NVIDIA, "CUDA on WSL User Guide").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WslInfo {
    /// `/dev/dxg` (the DirectX kernel interface WSL2 gives a GPU through) is there.
    pub dxg: bool,
    /// `libcuda*` files in `/usr/lib/wsl/lib`, sorted.
    pub libcuda: Vec<String>,
    /// `libcuda.so*` files a Linux NVIDIA driver package installed in the distribution's own
    /// library directories (`/usr/lib/x86_64-linux-gnu`, `/usr/lib64`, ...), which shadow
    /// WSL's.
    #[serde(default)]
    pub linux_libcuda: Vec<String>,
}

/// `libcuda` a CUDA process has mapped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedLibcuda {
    /// Process id.
    pub pid: u32,
    /// Process name.
    pub comm: String,
    /// Path inside the process's mount namespace.
    pub path: String,
    /// Version from the file name the path resolves to (`libcuda.so.590.48.01`), if any.
    pub version: Option<String>,
    /// The path is under a `compat/` directory (CUDA forward compatibility package).
    pub compat: bool,
}

/// Everything the collectors read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// `/proc/driver/nvidia/version`.
    pub driver: Fact<DriverInfo>,
    /// `/proc/driver/nvidia/params` as `key -> value`.
    pub driver_params: Fact<BTreeMap<String, String>>,
    /// `/sys/module/nvidia_uvm/parameters/*` as `name -> value` (`uvm_disable_hmm` -> `N`).
    pub uvm_params: Fact<BTreeMap<String, String>>,
    /// Module names from `/proc/modules` that start with `nvidia`.
    pub modules: Fact<Vec<String>>,
    /// Character majors by name from `/proc/devices` (`nvidia-uvm` -> 508,
    /// `nvidia-frontend` -> 195, ...), nvidia entries only.
    pub devices: Fact<BTreeMap<String, u32>>,
    /// `/dev/nvidia*` nodes (not `/dev/nvidia-caps/`).
    pub dev_nodes: Fact<Vec<DevNode>>,
    /// `/dev/nvidia-nvswitch*` nodes (NVSwitch systems).
    pub nvswitch_nodes: Fact<Vec<String>>,
    /// Container / LXC / Kubernetes detection (from `/proc/1/cgroup`, `/proc/self/cgroup`,
    /// `/.dockerenv`, `/run/.containerenv`, environment files).
    pub container: Fact<ContainerInfo>,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: Fact<KernelInfo>,
    /// `/proc/sys/kernel/arch` (`uname -m`: `x86_64`, `aarch64`; Linux's
    /// `kernel/utsname_sysctl.c`).
    #[serde(default = "absent_arch")]
    pub arch: Fact<String>,
    /// `CONFIG_*` values from `/proc/config.gz` or `/boot/config-<release>` (only
    /// `CONFIG_HMM_MIRROR`, `CONFIG_DEVICE_PRIVATE`, `CONFIG_RANDOMIZE_BASE`,
    /// `CONFIG_RANDOMIZE_MEMORY`, `CONFIG_KPROBES`, `CONFIG_ZONE_DEVICE`).
    pub kernel_config: Fact<BTreeMap<String, String>>,
    /// `/proc/cmdline`.
    pub cmdline: Fact<String>,
    /// The kernel's lockdown level (`/sys/kernel/security/lockdown`: `none`, `integrity`,
    /// `confidentiality`, the bracketed one of `security/lockdown/lockdown.c`'s list).
    #[serde(default = "absent_lockdown")]
    pub lockdown: Fact<String>,
    /// UEFI Secure Boot on: the value byte of the `SecureBoot` EFI variable
    /// (`/sys/firmware/efi/efivars/SecureBoot-8be4df61-...`, after 4 bytes of attributes).
    #[serde(default = "absent_secure_boot")]
    pub secure_boot: Fact<bool>,
    /// `/proc/iomem` lines naming `nvidia-uvm-hmm` (root only; addresses are zero otherwise).
    pub iomem_hmm: Fact<Vec<String>>,
    /// `nvidia-smi -q`.
    pub smi: Fact<SmiInfo>,
    /// How `nvidia-smi -q` ended: it listed GPUs, found none, could not reach the driver, or
    /// failed otherwise (unknown, with the same reason as [`Evidence::smi`], when it could
    /// not run or was not captured).
    #[serde(default = "absent_smi_outcome")]
    pub smi_outcome: Fact<SmiOutcome>,
    /// Entries of `/proc/driver/nvidia/gpus/`: one directory per GPU the driver registered,
    /// named by its PCI address (`0000:18:00.0`), sorted. Empty: the driver is loaded and has
    /// no GPU. Global (procfs of the driver): a container sees the host's GPUs here, whatever
    /// it was given.
    #[serde(default = "absent_gpus")]
    pub gpus: Fact<Vec<String>>,
    /// `/dev/kmsg` (or `dmesg`).
    pub kernel_log: Fact<KernelLog>,
    /// Names of running processes of interest that were found (`nv-fabricmanager`,
    /// `nvidia-persistenced`).
    pub daemons: Fact<Vec<String>>,
    /// libcuda mapped by each process that has one mapped.
    pub libcuda: Fact<Vec<MappedLibcuda>>,
    /// NVIDIA GPUs on the PCI bus (vendor `0x10de`, display class), with the driver bound
    /// to each: what the hardware has, whether or not a driver took it.
    #[serde(default = "absent_pci_gpus")]
    pub pci_gpus: Fact<Vec<PciGpu>>,
    /// WSL2's GPU interface and libraries; unavailable (not present) off WSL2.
    #[serde(default = "absent_wsl")]
    pub wsl: Fact<WslInfo>,
}

/// [`Evidence::smi_outcome`] of an `evidence.json` written before the fact existed.
fn absent_smi_outcome() -> Fact<SmiOutcome> {
    Fact::unavailable(NOT_RECORDED, "nvidia-smi -q")
}

/// [`Evidence::gpus`] of an `evidence.json` written before the fact existed.
fn absent_gpus() -> Fact<Vec<String>> {
    Fact::unavailable(NOT_RECORDED, "/proc/driver/nvidia/gpus")
}

/// [`Evidence::pci_gpus`] of an `evidence.json` written before the fact existed.
fn absent_pci_gpus() -> Fact<Vec<PciGpu>> {
    Fact::unavailable(NOT_RECORDED, "/sys/bus/pci/devices")
}

/// [`Evidence::lockdown`] of an `evidence.json` written before the fact existed.
fn absent_lockdown() -> Fact<String> {
    Fact::unavailable(NOT_RECORDED, "/sys/kernel/security/lockdown")
}

/// [`Evidence::secure_boot`] of an `evidence.json` written before the fact existed.
fn absent_secure_boot() -> Fact<bool> {
    Fact::unavailable(NOT_RECORDED, "/sys/firmware/efi/efivars")
}

/// [`Evidence::arch`] of an `evidence.json` written before the fact existed.
fn absent_arch() -> Fact<String> {
    Fact::unavailable(NOT_RECORDED, "/proc/sys/kernel/arch")
}

/// [`Evidence::wsl`] of an `evidence.json` written before the fact existed.
fn absent_wsl() -> Fact<WslInfo> {
    Fact::unavailable(NOT_RECORDED, "/usr/lib/wsl/lib")
}

/// Why a fact is unknown in an `evidence.json` written by a uvmwatch that did not read it.
const NOT_RECORDED: &str = "not recorded: written by a uvmwatch that did not read it";

/// A field of an `observations.json` that may be `null` or missing: either reads as the
/// type's default (an empty string, list or `false`, zero), so that a file written by
/// another tool, or with a value its writer did not know, is judged rather than refused.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A driver call the probes saw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeenCall {
    /// Ioctl name (`UVM_REGISTER_GPU`) or hex number: the one field a recorded call needs.
    pub call: String,
    /// Device node path (empty when not known).
    #[serde(default, deserialize_with = "null_as_default")]
    pub node: String,
    /// Result label (`NV_ERR_NO_MEMORY`, `EAGAIN`, ...); empty while in flight.
    #[serde(default, deserialize_with = "null_as_default")]
    pub result: String,
    /// Seconds in the call (so far, when in flight).
    #[serde(default, deserialize_with = "null_as_default")]
    pub seconds: f64,
}

impl SeenCall {
    /// The call and its node (`UVM_REGISTER_GPU on /dev/nvidia-uvm`), or the call alone when
    /// the node is not known.
    pub fn what(&self) -> String {
        if self.node.is_empty() {
            self.call.clone()
        } else {
            format!("{} on {}", self.call, self.node)
        }
    }
}

/// What the probes saw for one process (empty for a plain `uvmwatch doctor`). Saved as a
/// bundle's `observations.json` (`docs/doctor-bundle.md`); a field missing there, or `null`,
/// reads as its default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Observations {
    /// Process id, when about one process.
    pub pid: Option<u32>,
    /// `cuInit` return code, when it returned.
    pub cuinit_result: Option<i64>,
    /// Seconds `cuInit` took (returned) or has been running (in flight).
    pub cuinit_seconds: Option<f64>,
    /// `cuInit` is still running (a hang or stall).
    #[serde(deserialize_with = "null_as_default")]
    pub cuinit_in_flight: bool,
    /// Driver call the thread is inside now, for an in-flight `cuInit` or stalled ioctl.
    pub stuck_in: Option<SeenCall>,
    /// Thread id of the stuck thread (it may not be the process's main thread, which may
    /// even have exited).
    pub stuck_tid: Option<u32>,
    /// `wchan` and state of the stuck thread (`/proc`), e.g. `uvm_...` / `D (disk sleep)`.
    pub stuck_wchan: Option<String>,
    /// State of the stuck thread.
    pub stuck_state: Option<String>,
    /// Kernel stack of the stuck thread when readable.
    #[serde(deserialize_with = "null_as_default")]
    pub stuck_stack: Vec<String>,
    /// Last failed driver call (non-zero `rmStatus` or errno) seen in this `cuInit`.
    pub failed_call: Option<SeenCall>,
    /// Failed opens of NVIDIA nodes: (node path, errno name).
    #[serde(deserialize_with = "null_as_default")]
    pub failed_opens: Vec<(String, String)>,
    /// Successful opens of NVIDIA nodes inside this `cuInit`.
    #[serde(deserialize_with = "null_as_default")]
    pub device_opens: u32,
    /// The process was forked (without exec) from a process that had already run `cuInit`.
    #[serde(deserialize_with = "null_as_default")]
    pub forked_after_parent_init: bool,
    /// Kernel-side signals (kprobes), e.g. `request_free_mem_region = -34 (ERANGE)`.
    #[serde(deserialize_with = "null_as_default")]
    pub kernel_signals: Vec<String>,
    /// Probes that were not available, with why (a rule then lists what it could not see).
    #[serde(deserialize_with = "null_as_default")]
    pub unavailable_probes: Vec<String>,
    /// Seconds the first successful open of a GPU node (`/dev/nvidia<N>`) inside this
    /// `cuInit` took: without persistence the driver brings the GPU up in that open.
    #[serde(default)]
    pub first_gpu_open_seconds: Option<f64>,
    /// The CUDA context or device call the observation is about, when it is about one
    /// (`cuCtxCreate_v2`, `cuDevicePrimaryCtxRetain`, `cuDeviceGetCount`, ...).
    #[serde(default)]
    pub context_call: Option<String>,
    /// Its `CUresult` (46: `CUDA_ERROR_DEVICE_UNAVAILABLE`).
    #[serde(default)]
    pub context_result: Option<i64>,
    /// Seconds it took.
    #[serde(default)]
    pub context_seconds: Option<f64>,
    /// The `CUdevice` it was for, when it takes one.
    #[serde(default)]
    pub context_device: Option<i32>,
    /// The device count `cuDeviceGetCount` last returned in this process.
    #[serde(default)]
    pub device_count_seen: Option<i32>,
    /// The GPU nodes (`/dev/nvidia<N>`) the process saw in its root
    /// (`/proc/<pid>/root/dev`), read with a context or device call.
    #[serde(default)]
    pub gpu_nodes_visible: Option<u32>,
    /// `CUDA_VISIBLE_DEVICES` in the process's initial environment (`/proc/<pid>/environ`).
    #[serde(default)]
    pub cuda_visible_devices: Option<String>,
}

impl Observations {
    /// The stuck thread's procfs directory, for the report's sources and commands:
    /// `/proc/<pid>/task/<tid>` (its own `stack`, `wchan`, `stat`, also when the main thread
    /// has exited), `/proc/<pid>` without a thread id.
    pub fn stuck_thread_dir(&self) -> String {
        match (self.pid, self.stuck_tid) {
            (Some(pid), Some(tid)) => format!("/proc/{pid}/task/{tid}"),
            (Some(pid), None) => format!("/proc/{pid}"),
            (None, _) => "/proc/<pid>".to_string(),
        }
    }
}

//! Typed signals, read once: every source the doctor has (the host's facts in [`Evidence`],
//! what the probes saw of a process in [`Observations`]) turned into named propositions, each
//! holding, failing or unknown, with what was read and where. Causes (`cause/`) are declared
//! over these names; no cause reads a raw line or matches a string. The readers are the one
//! place that does, grouped by source: [`driver`] (the module, its GPUs, the PCI bus),
//! [`hmm`] (nvidia_uvm's HMM and what it needs), [`kernel_log`] (the kernel's and the
//! driver's lines, classified), [`smi`] (`nvidia-smi -q` and how it ended), [`nodes`]
//! (device nodes, containers, device policies), [`platform`] (architecture, WSL, the
//! libcuda a process mapped) and [`process`] (what the probes saw).
//!
//! A signal's polarity is in its name: `uvm_node_absent` holds when the node is missing.
//! `Unknown` says the source could not be read (or does not apply), with why; a cause that
//! needs an unknown signal is not ruled out by it, only less sure.
//!
//! [`SIGNALS`] is the one list: the enum, the names, the documentation and the readers are
//! generated from it (`docs/doctor.md`'s signal table is generated from it too).

mod driver;
mod hmm;
pub mod kernel_log;
mod nodes;
mod platform;
mod process;
mod smi;

pub use driver::no_driver;
pub use nodes::{allow_line_permits, container_kind, is_gpu_node, NVIDIA_MAJOR};
pub use platform::is_wsl;
pub use process::{
    call_text, device_count_disagrees, observed_any, REGISTER_GPU, SLOW_FIRST_OPEN_SECONDS,
    SLOW_INIT_BASE_SECONDS, SLOW_INIT_PER_GPU_SECONDS,
};

use serde::Serialize;

use super::facts::{Evidence, Fact, Observations};
use super::finding::Basis;

/// Whether a signal holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The proposition is true.
    Holds,
    /// It is false.
    Fails,
    /// It could not be told (the source is missing, unreadable, or says nothing of it).
    Unknown,
}

/// Where a reading came from: the host's state or what the probes saw of a process, and
/// the path, command or probe (`/proc/driver/nvidia/version`, `nvidia-smi -q`,
/// `probe:ioctl`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Source {
    /// The host's state (`static`) or the probes (`observed`).
    pub basis: Basis,
    /// The path, command or probe label.
    pub label: String,
}

impl Source {
    /// A file or command of the host.
    pub fn host(label: impl Into<String>) -> Source {
        Source {
            basis: Basis::Static,
            label: label.into(),
        }
    }

    /// What the probes saw (`probe:<name>`), or a file of the observed process
    /// (`/proc/<pid>/...`).
    pub fn probe(label: impl Into<String>) -> Source {
        Source {
            basis: Basis::Observed,
            label: label.into(),
        }
    }
}

/// One signal as read: its state, what was read (the value that decided it, or why it is
/// unknown), and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reading {
    /// Holds, fails or unknown.
    pub state: State,
    /// What was read: `N (HMM allowed)`, `0000:01:00.0 bound to vfio-pci`; for an unknown
    /// signal, why.
    pub value: String,
    /// Where.
    pub source: Source,
}

impl Reading {
    /// The signal holds: `value` is what was read.
    pub fn holds(value: impl Into<String>, source: Source) -> Reading {
        Reading {
            state: State::Holds,
            value: value.into(),
            source,
        }
    }

    /// It fails: `value` is what was read instead.
    pub fn fails(value: impl Into<String>, source: Source) -> Reading {
        Reading {
            state: State::Fails,
            value: value.into(),
            source,
        }
    }

    /// It is unknown: `why`.
    pub fn unknown(why: impl Into<String>, source: Source) -> Reading {
        Reading {
            state: State::Unknown,
            value: why.into(),
            source,
        }
    }

    /// `holds(yes)` when `cond`, `fails(no)` otherwise.
    pub fn either(
        cond: bool,
        yes: impl Into<String>,
        no: impl Into<String>,
        source: Source,
    ) -> Reading {
        if cond {
            Reading::holds(yes, source)
        } else {
            Reading::fails(no, source)
        }
    }

    /// The reading of a fact that could not be read: unknown, with its reason.
    pub fn of_unread<T>(f: &Fact<T>) -> Reading {
        let why = f
            .value
            .as_ref()
            .err()
            .map(|u| u.why.clone())
            .unwrap_or_default();
        Reading::unknown(why, Source::host(f.source.clone()))
    }

    /// The same reading, negated (holds and fails swapped), with `value` when it is not
    /// unknown.
    pub fn negated(self) -> Reading {
        let state = match self.state {
            State::Holds => State::Fails,
            State::Fails => State::Holds,
            State::Unknown => State::Unknown,
        };
        Reading { state, ..self }
    }
}

/// What the readers read from: the facts, the observations, and what is derived from them
/// once for several readers (the classified kernel log).
pub struct Input<'a> {
    /// The host's facts.
    pub e: &'a Evidence,
    /// What the probes saw of one process (defaults for a plain `doctor`).
    pub o: &'a Observations,
    /// The kernel log's lines, classified ([`kernel_log::Classified`]).
    pub log: Option<kernel_log::Classified>,
}

impl<'a> Input<'a> {
    /// The input of `e` and `o`, with the kernel log classified.
    pub fn new(e: &'a Evidence, o: &'a Observations) -> Input<'a> {
        Input {
            e,
            o,
            log: e.kernel_log.get().map(kernel_log::classify),
        }
    }
}

/// Declares the signals: for each, its variant, its name (as reports and the generated
/// docs write it), its reader, and its documentation (what it says and where it is read
/// from, with the source of each fact). The one list of signals.
macro_rules! signals {
    ($( $(#[doc = $doc:literal])+ $id:ident = $name:literal => $read:path; )+) => {
        /// A named signal. The list is [`SIGNALS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Sig {
            $( $(#[doc = $doc])+ $id, )+
        }

        /// Every signal, in declaration order.
        pub const SIGNALS: &[Sig] = &[$(Sig::$id),+];

        impl Sig {
            /// Its name: `hmm_allowed`.
            pub fn name(self) -> &'static str {
                match self { $(Sig::$id => $name,)+ }
            }

            /// Its documentation (first line: what it says).
            pub fn doc(self) -> &'static str {
                match self { $(Sig::$id => concat!($($doc, "\n"),+),)+ }
            }

            /// Reads it.
            fn read(self, i: &Input) -> Reading {
                match self { $(Sig::$id => $read(i),)+ }
            }
        }
    };
}

signals! {
    // ----- the driver, its GPUs, the PCI bus (driver.rs)
    /// The nvidia kernel module is loaded: `/proc/driver/nvidia/version` exists, or
    /// `/proc/modules` lists `nvidia`. Fails when neither does (and `/proc/modules` was read).
    DriverLoaded = "driver_loaded" => driver::loaded;
    /// The nvidia module is not loaded (the negation of `driver_loaded`, for causes that
    /// need it absent).
    DriverAbsent = "driver_absent" => driver::absent;
    /// The loaded module is the open flavour (`NVIDIA UNIX Open Kernel Module` in its
    /// version line, `nv-procfs.c`); fails for the proprietary one.
    OpenModule = "open_module" => driver::open_module;
    /// `nvidia_uvm` is loaded (`/proc/modules`).
    UvmLoaded = "uvm_loaded" => driver::uvm_loaded;
    /// `nvidia_uvm` is not loaded while `nvidia` is.
    UvmNotLoaded = "uvm_not_loaded" => driver::uvm_not_loaded;
    /// A module CUDA needs is not loaded: `nvidia`, or `nvidia_uvm` while `nvidia` is.
    CudaModuleAbsent = "cuda_module_absent" => driver::cuda_module_absent;
    /// The driver registered no GPU: `/proc/driver/nvidia/gpus/` is empty (`nv-procfs.c`
    /// makes one entry per GPU it drives).
    DriverRegisteredNoGpu = "driver_registered_no_gpu" => driver::registered_no_gpu;
    /// The driver was told to leave GPUs alone: `ExcludedGpus` (or `GpuBlacklist`) in
    /// `/proc/driver/nvidia/params` names some.
    GpusExcluded = "gpus_excluded" => driver::excluded;
    /// An NVIDIA GPU is on the PCI bus (vendor 0x10de, display class,
    /// `/sys/bus/pci/devices`); fails when the bus was read and has none.
    GpuOnPci = "gpu_on_pci" => driver::on_pci;
    /// No NVIDIA GPU is on the PCI bus (the bus was read).
    NoGpuOnPci = "no_gpu_on_pci" => driver::none_on_pci;
    /// An NVIDIA GPU on the PCI bus has no kernel driver bound.
    GpuWithoutDriver = "gpu_without_driver" => driver::without_driver;
    /// An NVIDIA GPU is bound to another kernel driver (`vfio-pci`, `nouveau`), on the PCI
    /// bus, or as the driver's own `NVRM: GPU ... is already bound to ...` line says.
    GpuHeldElsewhere = "gpu_held_elsewhere" => driver::held_elsewhere;
    /// Every NVIDIA GPU on the PCI bus is bound to `nvidia` (its probe succeeded: the
    /// driver has it), and `ExcludedGpus` names none; unknown when it names some.
    DriverHoldsEveryGpu = "driver_holds_every_gpu" => driver::holds_every_gpu;
    /// More GPUs are bound to `nvidia` than `nvidia-smi` lists (else than the driver
    /// registered): the driver has a GPU it could not bring up (`RmInitAdapter` runs at the
    /// first open, after the probe bound it).
    BoundGpuNotListed = "bound_gpu_not_listed" => driver::bound_not_listed;

    // ----- nvidia_uvm's HMM (hmm.rs)
    /// nvidia_uvm may use HMM: `uvm_disable_hmm` is `N`. When the parameter cannot be read,
    /// its default: true only on x86_64 from driver 535 (`uvm_hmm.c`: HMM is off by default
    /// on other architectures, and was an opt-in alpha before 535).
    HmmAllowed = "hmm_allowed" => hmm::allowed;
    /// The kernel has what HMM needs: `CONFIG_HMM_MIRROR` and `CONFIG_DEVICE_PRIVATE`; or,
    /// whatever the config file read says, nvidia_uvm's HMM set-up was seen running (its
    /// set-up error logged, `request_free_mem_region` failing in its ioctl, an
    /// `nvidia-uvm-hmm` region in `/proc/iomem`).
    KernelHmm = "kernel_hmm" => hmm::kernel_hmm;
    /// Every GPU `nvidia-smi -q` gives an addressing mode for uses ATS (Grace): ATS excludes
    /// HMM (`uvm_hmm_is_enabled_system_wide`).
    AtsAddressing = "ats_addressing" => hmm::ats;
    /// HMM device memory is set up for every GPU: `/proc/iomem` has an `nvidia-uvm-hmm`
    /// region (the name `uvm_pmm_devmem_init` gives `request_free_mem_region`) for each GPU
    /// the driver registered.
    HmmMemorySetUp = "hmm_memory_set_up" => hmm::memory_set_up;
    /// HMM device memory is missing for some GPU: fewer `nvidia-uvm-hmm` regions in
    /// `/proc/iomem` than GPUs (none at all before the first CUDA start).
    HmmMemoryMissing = "hmm_memory_missing" => hmm::memory_missing;
    /// KASLR randomizes the memory layout: no `nokaslr` on the command line and the kernel
    /// is built with it.
    KaslrOn = "kaslr_on" => hmm::kaslr_on;
    /// The kernel is older than 6.11, the first mainline release with commit ea72ce5da228
    /// (x86/kaslr: "Expose and use the end of the physical memory address space"), the
    /// kernel side of NVIDIA's known issue "CUDA initialization can fail on certain Linux
    /// kernels with KASLR enabled".
    KernelLacksKaslrFix = "kernel_lacks_kaslr_fix" => hmm::lacks_fix;
    /// nvidia_uvm logged its HMM set-up failing (`uvm_debug_prints=1`):
    /// `request_free_mem_region() err`, `memremap_pages() err`, `failed to intialize device
    /// private memory` (`uvm_pmm_gpu.c`, 590.48.01).
    HmmErrorLogged = "hmm_error_logged" => hmm::error_logged;
    /// A kprobe saw `request_free_mem_region` fail inside a UVM call.
    HmmFailureProbed = "hmm_failure_probed" => hmm::failure_probed;
    /// `uvm_debug_prints=1` and the kernel log holds no HMM set-up error: nvidia_uvm would
    /// have printed one.
    HmmSilentWithPrints = "hmm_silent_with_prints" => hmm::silent_with_prints;

    // ----- the kernel log (kernel_log.rs)
    /// The kernel refused a module for its signature: `Loading of unsigned module is
    /// rejected`, `... with unavailable key is rejected` (`kernel/module/signing.c`), a
    /// lockdown refusal (`security/lockdown/lockdown.c`), or modprobe's `Key was rejected by
    /// service` / `Required key not available`.
    ModuleRefusedSignature = "module_refused_signature" => kernel_log::refused_signature;
    /// The nvidia module was built for another kernel: `nvidia: Unknown symbol`,
    /// `disagrees about version of symbol`, `version magic` (`kernel/module/`), modprobe's
    /// `Invalid module format` or `Exec format error`.
    ModuleBuiltForOtherKernel = "module_built_for_other_kernel" => kernel_log::other_kernel;
    /// modprobe found no nvidia module for the running kernel (`Module nvidia not found in
    /// directory /lib/modules/<release>`): it was not built for it (DKMS).
    ModuleNotBuilt = "module_not_built" => kernel_log::not_built;
    /// A security module refused the load (`LoadPin`, an SELinux or AppArmor denial of
    /// `module_load`).
    ModuleRefusedBySecurity = "module_refused_by_security" => kernel_log::refused_by_security;
    /// `modprobe` could not insert an nvidia module for another reason than those above
    /// (`modprobe: ERROR: could not insert 'nvidia_uvm': Cannot allocate memory`): the
    /// module's own init failed.
    ModuleLoadFailed = "module_load_failed" => kernel_log::load_failed;
    /// Kernel lockdown is on (`integrity` or `confidentiality`): only signed modules load
    /// (`security/lockdown/lockdown.c`).
    LockdownOn = "lockdown_on" => kernel_log::lockdown_on;
    /// UEFI Secure Boot is on: with it, distribution kernels enforce module signatures.
    SecureBootOn = "secure_boot_on" => kernel_log::secure_boot_on;
    /// The open module refused a GPU without GSP (`NVRM: ... is not supported by open
    /// nvidia.ko`, `kernel-open/nvidia/nv-pci.c`, 580.65.06).
    OpenModuleUnsupportedGpu = "open_module_unsupported_gpu" => kernel_log::open_unsupported;
    /// The driver refused to load for want of a GPU: `NVRM: No NVIDIA GPU found.`, `No
    /// NVIDIA devices probed.`, `None of the NVIDIA devices were initialized.`, `The NVIDIA
    /// probe routine was not called` (`kernel-open/nvidia/nv.c`).
    DriverFoundNoGpu = "driver_found_no_gpu" => kernel_log::found_no_gpu;
    /// `RmInitAdapter failed` / `rm_init_adapter failed`: a GPU did not initialize
    /// (`osinit.c`).
    AdapterInitFailed = "adapter_init_failed" => kernel_log::adapter_failed;
    /// A GPU fell off the bus: Xid 79 (`ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`,
    /// `nverror.h`), or the driver's `GPU has fallen off the bus` / `GPU is lost` lines.
    GpuFellOffBus = "gpu_fell_off_bus" => kernel_log::fell_off_bus;
    /// GSP firmware failed: Xid 119 (RPC timeout) or 120, `Cannot initialize GSP firmware
    /// RM`, `RmInitAdapter failed! (0x62:...)` (`kernel_gsp.c`, `osinit.c`).
    GspFailed = "gsp_failed" => kernel_log::gsp_failed;
    /// `WPR2 already up`: the GPU was left in a bad state and needs a reset
    /// (`kernel_gsp.c`).
    Wpr2Up = "wpr2_up" => kernel_log::wpr2_up;
    /// A PCI BAR of the GPU is invalid or could not be assigned (`nv-pci.c`:
    /// `nv_pci_validate_bars`, `nv_resize_pcie_bars`).
    BarInvalid = "bar_invalid" => kernel_log::bar_invalid;
    /// The driver's probe could not enable the GPU on the PCI bus or claim its interrupt
    /// or registers (`nv-pci.c`: `pci_enable_device failed`, `Can't find an IRQ for your
    /// NVIDIA card`, `request_mem_region failed`; `nv.c`: `No interrupts of any type are
    /// available`).
    ProbeFailed = "probe_failed" => kernel_log::probe_failed;
    /// The GPU needs the open kernel modules (`requires use of the NVIDIA open kernel
    /// modules`, proprietary module, Blackwell and later), or the proprietary module's attach
    /// refused it (`RmInitAdapter failed! (0x22:0x56:...)`); or, the log silent or unread,
    /// the proprietary module is loaded beside a GPU whose PCI device ID is of Blackwell or
    /// later (from 0x2900: open-gpu-kernel-modules README, compatible GPUs).
    NeedsOpenModule = "needs_open_module" => driver::needs_open;
    /// This driver branch does not support the GPU: `NVRM: The NVIDIA <GPU> GPU installed in
    /// this system is supported through the NVIDIA <branch> Legacy drivers` (`nv.c`).
    LegacyGpu = "legacy_gpu" => kernel_log::legacy;
    /// A soft or hard lockup, RCU stall or hung task whose report names nvidia code.
    DriverLockupLogged = "driver_lockup_logged" => kernel_log::lockup;
    /// An oops, BUG or general protection fault in nvidia code: the driver stays wedged
    /// until reboot.
    DriverOopsLogged = "driver_oops_logged" => kernel_log::oops;
    /// A WARNING whose report names nvidia code.
    DriverWarnLogged = "driver_warn_logged" => kernel_log::warn;
    /// `NVRM: API mismatch`: the user-space driver and the kernel module differ
    /// (`nv.c`).
    ApiMismatchLogged = "api_mismatch_logged" => kernel_log::api_mismatch;
    /// A resume from suspend or hibernation after `nvidia-uvm: Loaded the UVM driver`.
    ResumedAfterUvmLoad = "resumed_after_uvm_load" => kernel_log::resumed;
    /// Any Xid in the kernel log (`NVRM: Xid (PCI:...): N`).
    XidLogged = "xid_logged" => kernel_log::xid;
    /// An Xid after which the GPU needs a reset or is gone (`nverror.h`): 48
    /// `ROBUST_CHANNEL_GPU_ECC_DBE`, 62 `PMU_HALT_ERROR`, 79 fallen off the bus, 95
    /// `ROBUST_CHANNEL_UNCONTAINED_ERROR`, 119 `GSP_RPC_TIMEOUT`, 120 `GSP_ERROR`, 140
    /// `UNRECOVERABLE_ECC_ERROR_ESCAPE`, 143 `GPU_INIT_ERROR`, 154
    /// `GPU_RECOVERY_ACTION_CHANGED` (a reset or reboot required).
    GpuFatalXid = "gpu_fatal_xid" => kernel_log::fatal_xid;

    // ----- nvidia-smi (smi.rs)
    /// `nvidia-smi -q` lists at least one GPU.
    SmiListsGpus = "smi_lists_gpus" => smi::lists_gpus;
    /// `nvidia-smi` says the driver has no GPU: `No devices were found`, `No supported GPUs
    /// were found`, or a listing without one.
    SmiNoDevices = "smi_no_devices" => smi::no_devices;
    /// `nvidia-smi` cannot reach a driver: `NVIDIA-SMI has failed because it couldn't
    /// communicate with the NVIDIA driver` (NVIDIA's user space is installed).
    SmiNoDriver = "smi_no_driver" => smi::no_driver;
    /// `Failed to initialize NVML: Driver/library version mismatch`.
    SmiVersionMismatch = "smi_version_mismatch" => smi::version_mismatch;
    /// `Failed to initialize NVML: Unknown Error` (535 without a GPU; also a device node
    /// NVML may not open, as in a container whose device rules were lost).
    SmiUnknownError = "smi_unknown_error" => smi::unknown_error;
    /// `nvidia-smi -q` did not answer within the doctor's 10 s.
    SmiTimedOut = "smi_timed_out" => smi::timed_out;
    /// NVML's `Driver Version` differs from the kernel module's.
    SmiDriverVersionDiffers = "smi_driver_version_differs" => smi::version_differs;
    /// Persistence mode is `Disabled` on some GPU.
    PersistenceOff = "persistence_off" => smi::persistence_off;
    /// `nvidia-persistenced` is not running on the host (unknown from inside a container).
    PersistencedNotRunning = "persistenced_not_running" => smi::persistenced_not_running;
    /// Compute mode `Prohibited` on some GPU: no context can be created there.
    ComputeProhibited = "compute_prohibited" => smi::prohibited;
    /// Compute mode `Exclusive_Process` on some GPU.
    ComputeExclusive = "compute_exclusive" => smi::exclusive;
    /// Another process has libcuda mapped (a holder of an exclusive GPU).
    OtherCudaProcesses = "other_cuda_processes" => smi::other_processes;
    /// MIG mode is enabled on some GPU.
    MigOn = "mig_on" => smi::mig_on;
    /// A GPU has MIG on and no MIG device (GPU instance with a compute instance): CUDA
    /// enumerates MIG devices only, so it has none there.
    MigWithoutDevices = "mig_without_devices" => smi::mig_without_devices;
    /// An NVSwitch system: `/dev/nvidia-nvswitch*` nodes, a fabric state other than `N/A`
    /// (fourth-generation NVSwitch systems have no nodes), or eight SXM data-center GPUs of
    /// the HGX generations (an 8-GPU NVSwitch baseboard; 4-GPU boards have no NVSwitch).
    NvswitchPresent = "nvswitch_present" => smi::nvswitch;
    /// Some GPU's fabric registration is not `Completed`.
    FabricIncomplete = "fabric_incomplete" => smi::fabric_incomplete;
    /// Every GPU's fabric registration is `Completed`.
    FabricComplete = "fabric_complete" => smi::fabric_complete;
    /// `nv-fabricmanager` is not running on the host (unknown from a container).
    FabricManagerNotRunning = "fabric_manager_not_running" => smi::fm_not_running;
    /// A GeForce GPU (`Product Brand`): no forward compatibility, no MIG.
    GeforceGpu = "geforce_gpu" => smi::geforce;

    // ----- device nodes and containers (nodes.rs)
    /// The process (and the doctor) runs in a container (docker, podman, Kubernetes, LXC).
    InContainer = "in_container" => nodes::in_container;
    /// `/dev/nvidiactl` is missing where the process runs.
    CtlNodeAbsent = "ctl_node_absent" => nodes::ctl_absent;
    /// `/dev/nvidia-uvm` or `/dev/nvidia-uvm-tools` is missing where the process runs (a
    /// container runtime passes both).
    UvmNodeAbsent = "uvm_node_absent" => nodes::uvm_absent;
    /// No GPU node (`/dev/nvidia<N>`) where the process runs.
    GpuNodesAbsent = "gpu_nodes_absent" => nodes::gpu_nodes_absent;
    /// A container with no GPU node (`/dev/nvidia<N>`) while the host's driver has GPUs: no
    /// GPU was given to it (control and UVM nodes or not).
    ContainerWithoutGpu = "container_without_gpu" => nodes::container_without_gpu;
    /// `nvidia-uvm` has no character major in `/proc/devices` while `nvidia` is loaded.
    UvmMajorMissing = "uvm_major_missing" => nodes::uvm_major_missing;
    /// A node's device number is not the one the kernel registered for its driver: a
    /// `/dev/nvidia-uvm*` whose major is not `nvidia-uvm`'s in `/proc/devices`, or a
    /// `/dev/nvidiactl` / `/dev/nvidia<N>` whose major is not 195 (`nv-chardev-numbers.h`):
    /// made for another boot or module load.
    NodeNumberMismatch = "node_number_mismatch" => nodes::number_mismatch;
    /// The container's cgroup v1 device allow-list admits `/dev/nvidiactl` but not the
    /// current `nvidia-uvm` major.
    AllowListMissesUvm = "allow_list_misses_uvm" => nodes::allow_list_misses_uvm;
    /// uvmwatch's own open of a node was refused (`EPERM`, `EACCES`).
    NodeOpenDenied = "node_open_denied" => nodes::open_denied;
    /// No UVM call can be made where the process runs: nvidia_uvm is not loaded,
    /// `/dev/nvidia-uvm` is missing, or its open (the process's, or uvmwatch's own) is
    /// refused or finds no driver. What happens in `UVM_REGISTER_GPU` cannot be the cause.
    UvmUnreachable = "uvm_unreachable" => nodes::uvm_unreachable;
    /// uvmwatch's own open of a GPU or control node failed with `EIO`.
    NodeOpenIoError = "node_open_io_error" => nodes::open_eio;

    // ----- platform and libraries (platform.rs)
    /// Windows Subsystem for Linux 2: `/dev/dxg`, WSL's libraries, or its kernel.
    Wsl = "wsl" => platform::wsl;
    /// WSL2 without `/dev/dxg`: no GPU shared with the distribution.
    DxgAbsent = "dxg_absent" => platform::dxg_absent;
    /// WSL2 without a `libcuda*` in `/usr/lib/wsl/lib`.
    WslLibcudaAbsent = "wsl_libcuda_absent" => platform::wsl_libcuda_absent;
    /// WSL2 with a Linux driver's libcuda mapped by a process (not WSL's).
    LinuxLibcudaMappedInWsl = "linux_libcuda_mapped_in_wsl" => platform::linux_libcuda_mapped;
    /// WSL2 with a Linux driver's libcuda installed in the distribution's library
    /// directories, where it can shadow WSL's.
    LinuxLibcudaInstalledInWsl = "linux_libcuda_installed_in_wsl" => platform::linux_libcuda_installed;
    /// The machine is x86_64 (`/proc/sys/kernel/arch`, else the driver's version line).
    X86_64 = "x86_64" => platform::x86_64;
    /// A process mapped a `libcuda.so.<version>` other than the kernel module's version.
    LibcudaVersionDiffers = "libcuda_version_differs" => platform::libcuda_differs;
    /// A process mapped a CUDA forward-compatibility libcuda (a `compat/` directory).
    CompatLibcuda = "compat_libcuda" => platform::compat;
    /// That forward-compatibility library cannot work here: a GeForce GPU, or a library
    /// older than the driver (CUDA Compatibility guide).
    CompatUnsupported = "compat_unsupported" => platform::compat_unsupported;

    // ----- what the probes saw (process.rs)
    /// The probes saw a process (a `cuInit`, a call, an open, a fork).
    ProcessObserved = "process_observed" => process::observed;
    /// Device opens succeeded and none failed: the nodes are fine.
    DeviceOpensOk = "device_opens_ok" => process::opens_ok;
    /// No device open at all, and none failed, with the open probe attached: the driver
    /// was never reached.
    NoDeviceOpens = "no_device_opens" => process::no_opens;
    /// An open of a `/dev/nvidia*` node failed with `ENOENT`, `ENXIO` or `ENODEV`: missing,
    /// or no driver behind it.
    OpenMissing = "open_missing" => process::open_missing;
    /// An open of `/dev/nvidia-uvm` failed with `ENOENT`, `ENXIO` or `ENODEV`: its node is
    /// missing, or no driver is behind its major (nvidia_uvm unloaded under it: `chrdev_open`
    /// gives ENXIO). nvidia_uvm loads and makes no GPU node of its own, so a driver without a
    /// GPU does not explain it.
    UvmOpenMissing = "uvm_open_missing" => process::uvm_open_missing;
    /// An open of a `/dev/nvidia*` node failed with `EPERM` or `EACCES`.
    OpenDenied = "open_denied" => process::open_denied;
    /// An open of a GPU, control or UVM node failed with `EIO` (on `/dev/nvidia-uvm`: UVM's
    /// global fatal error, an ECC or RC error).
    OpenIoError = "open_io_error" => process::open_eio;
    /// `UVM_REGISTER_GPU` returned a status other than `NV_OK`.
    RegisterGpuFailed = "register_gpu_failed" => process::register_failed;
    /// `UVM_REGISTER_GPU` returned `NV_ERR_NO_MEMORY` (what a failed HMM set-up returns,
    /// 570.123 and later) or an errno-mapped status of an older release.
    RegisterGpuNoMemory = "register_gpu_no_memory" => process::register_no_memory;
    /// A thread is inside `UVM_REGISTER_GPU` and has not returned.
    RegisterGpuHung = "register_gpu_hung" => process::register_hung;
    /// A thread is inside a driver call and has not returned.
    CallHung = "call_hung" => process::call_hung;
    /// The stuck thread sleeps in the driver: state `D`, or a `wchan`/stack frame in nvidia
    /// code (`uvm_*`, `nv_*`, `_nv0*`, `os_*`).
    ThreadInDriver = "thread_in_driver" => process::thread_in_driver;
    /// The stuck thread's stack is in HMM device-memory set-up (`uvm_pmm_devmem_init`,
    /// `devmem_alloc_pagemap`, `memremap_pages`, `request_free_mem_region`).
    StackInHmmSetup = "stack_in_hmm_setup" => process::stack_in_hmm;
    /// The stuck thread's stack was read: it is in RM (nvidia code), with no nvidia_uvm
    /// frame (a thread in nvidia_uvm may wait on the lock HMM set-up holds).
    StackOutsideHmm = "stack_outside_hmm" => process::stack_outside_hmm;
    /// `cuInit` returned 0.
    CuinitOk = "cuinit_ok" => process::cuinit_ok;
    /// `cuInit` failed within a second.
    CuinitQuick = "cuinit_quick" => process::quick;
    /// The ioctl probes did not run: the driver calls of the process were not seen.
    IoctlsUnseen = "ioctls_unseen" => process::ioctls_unseen;
    /// The process was forked without exec from one that had initialized CUDA.
    ForkedAfterInit = "forked_after_init" => process::forked;
    /// `cuInit` took longer than 2 s plus 0.5 s per GPU.
    CuinitSlow = "cuinit_slow" => process::slow;
    /// The first open of a GPU node took a second or more: the GPU was brought up in it.
    FirstGpuOpenSlow = "first_gpu_open_slow" => process::first_open_slow;
    /// `cuDeviceGetCount` returned fewer devices than the process has: its GPU nodes, or
    /// under MIG the MIG devices (CUDA enumerates one a process), at most as many as
    /// `CUDA_VISIBLE_DEVICES` lists.
    DeviceCountLow = "device_count_low" => process::count_low;
    /// `CUDA_VISIBLE_DEVICES` is set in the process's environment.
    VisibleDevicesSet = "visible_devices_set" => process::visible_set;
    /// `CUDA_VISIBLE_DEVICES` names no GPU the process has: empty, `-1`, `none`, `void`,
    /// an index past the GPUs, or a UUID no GPU has (CUDA stops at the first invalid entry).
    VisibleDevicesNameNone = "visible_devices_name_none" => process::visible_none;
    /// `CUDA_VISIBLE_DEVICES` names fewer GPUs than the process has: fewer entries, or an
    /// entry that names no GPU ends the list early.
    VisibleDevicesNarrow = "visible_devices_narrow" => process::visible_narrow;
    /// `CUDA_VISIBLE_DEVICES` lists more than one device: the process means to use several
    /// (under MIG, CUDA enumerates one MIG device a process).
    VisibleDevicesSeveral = "visible_devices_several" => process::visible_several;
    /// With MIG on, `CUDA_VISIBLE_DEVICES` names a GPU by its `GPU-<uuid>` alone: under MIG
    /// the parent GPU is no CUDA device (MIG User Guide, CUDA Device Enumeration: a MIG
    /// device is named `MIG-<uuid>` or `GPU-<uuid>/<gi>/<ci>`), so CUDA finds none.
    VisibleDevicesParentUnderMig = "visible_devices_parent_under_mig" => process::visible_parent_under_mig;
}

/// Every signal read once for one judgement.
#[derive(Clone, Debug, PartialEq)]
pub struct Signals {
    readings: Vec<Reading>,
}

impl Signals {
    /// Reads every signal from the facts and the observations.
    pub fn read(e: &Evidence, o: &Observations) -> Signals {
        let input = Input::new(e, o);
        Signals {
            readings: SIGNALS.iter().map(|s| s.read(&input)).collect(),
        }
    }

    /// The reading of `s`.
    pub fn get(&self, s: Sig) -> &Reading {
        &self.readings[s as usize]
    }

    /// The state of `s`.
    pub fn state(&self, s: Sig) -> State {
        self.get(s).state
    }

    /// `s` holds.
    pub fn holds(&self, s: Sig) -> bool {
        self.state(s) == State::Holds
    }

    /// Every signal with its reading.
    pub fn iter(&self) -> impl Iterator<Item = (Sig, &Reading)> {
        SIGNALS.iter().copied().zip(self.readings.iter())
    }
}

#[cfg(test)]
mod tests;

//! Real hosts whose NVIDIA driver finds no GPU, as snapshot specs, for the `no_gpu` rule.
//!
//! Built from what Debian's real NVIDIA packages showed in uvmwatch's vm-test (qemu, no GPU
//! passed through): `nvidia-open-kernel-dkms` 550.163.01-2 on the 6.12 kernel and 535.261.03-1
//! on 6.1, with `nvidia-smi` of the same versions. The driver loaded through its GPU-less
//! (NVSwitch) path: `/proc/driver/nvidia/gpus/` empty, no `/dev/nvidia<N>`, `nvidia-smi`
//! exiting 255, `cuInit` returning 999. On the same kind of machine the driver refuses to
//! load when it takes no such path (`NVRM: No NVIDIA GPU found.`, `nvidia_init_module` in
//! `kernel-open/nvidia/nv.c`): [`driver_refused_no_gpu`].
//!
//! Quoted as they were read: the version line of 550.163.01, the `nvidia-smi` outputs and
//! exit statuses, the NVRM lines of the kernel log, the `nvidia-uvm` major of 550 (241), the
//! names in `/proc/devices` and `/proc/modules`, the device nodes, `ExcludedGpus: ""`. Not
//! recorded there and filled in here: the other dynamic majors (535's `nvidia-uvm` among
//! them, given 550's), module sizes and addresses,
//! kernel-log timestamps, the 535 build's date (left out of its version line), the GCC
//! line, and the kernel config beyond `CONFIG_DEVICE_PRIVATE` unset (written here with
//! `CONFIG_HMM_MIRROR` unset too, [`SnapshotSpec::hmm_config`]).

use super::{DriverSpec, NodeSpec, SnapshotSpec};

/// `/proc/driver/nvidia/version` of Debian's 550.163.01 open module.
pub const VERSION_550: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (buildd@debian)  Mon Jul 21 21:45:24 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n";

/// `/proc/driver/nvidia/version` of Debian's 535.261.03 open module (its build date was not
/// recorded and is left out).
pub const VERSION_535: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build  (buildd@debian)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n";

/// What `nvidia-smi -q` 550.163.01 prints without a GPU (exit status 255).
pub const SMI_NO_GPU_550: &str =
    "Failed to initialize NVML: No supported GPUs were found\nUnable to determine the number of GPUs\n";

/// What `nvidia-smi -q` 535.261.03 prints without a GPU (exit status 255).
pub const SMI_NO_GPU_535: &str = "Failed to initialize NVML: Unknown Error\n";

/// What `nvidia-smi` prints when no driver is loaded (exit status 9).
pub const SMI_NO_DRIVER: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n";

/// The `nvidia-uvm` major 550.163.01 got in the VM.
pub const UVM_MAJOR_550: u32 = 241;

/// Kernel releases of the VMs (`docs/vm-test.md`, "Kernels tested").
pub const KERNEL_6_12: &str = "6.12.117+deb12-amd64";
/// See [`KERNEL_6_12`].
pub const KERNEL_6_1: &str = "6.1.0-57-amd64";

/// The 550.163.01 host: driver and `nvidia_uvm` loaded, no GPU.
pub fn gpuless_550() -> SnapshotSpec {
    let dmesg = format!(
        "[    0.000000] Linux version {KERNEL_6_12} (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1~deb12u1\n\
         [    3.412801] nvidia: loading out-of-tree module taints kernel.\n\
         [    3.498113] nvidia-nvlink: Nvlink Core is being initialized, major device number 244\n\
         [    3.612650] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (buildd@debian)  Mon Jul 21 21:45:24 UTC 2025\n\
         [    3.904377] nvidia-uvm: Loaded the UVM driver, major device number {UVM_MAJOR_550}.\n\
         [   21.377012] NVRM: nvAssertFailedNoLog: Assertion failed: rmapiLockIsOwner() && rmGpuLockIsOwner() @ conf_compute_api.c:77\n"
    );
    gpuless(
        "550.163.01",
        KERNEL_6_12,
        VERSION_550,
        // 550 registers its char regions as `nvidia` and `nvidiactl` (nv.c).
        "195 nvidia\n195 nvidiactl\n",
        SMI_NO_GPU_550,
        dmesg,
    )
}

/// The 535.261.03 host: driver and `nvidia_uvm` loaded, no GPU.
pub fn gpuless_535() -> SnapshotSpec {
    let dmesg = format!(
        "[    0.000000] Linux version {KERNEL_6_1} (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3\n\
         [    3.398112] nvidia: loading out-of-tree module taints kernel.\n\
         [    3.471005] nvidia-nvlink: Nvlink Core is being initialized, major device number 244\n\
         [    3.590218] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build  (buildd@debian)\n\
         [    3.880411] nvidia-uvm: Loaded the UVM driver, major device number {UVM_MAJOR_550}.\n"
    );
    gpuless(
        "535.261.03",
        KERNEL_6_1,
        VERSION_535,
        "195 nvidia-frontend\n",
        SMI_NO_GPU_535,
        dmesg,
    )
}

fn gpuless(
    version: &str,
    release: &str,
    version_file: &str,
    rm_majors: &str,
    smi: &str,
    dmesg: String,
) -> SnapshotSpec {
    let uvm = UVM_MAJOR_550;
    let devices = format!(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n  5 /dev/console\n 10 misc\n 13 input\n{rm_majors}226 drm\n{uvm} nvidia-uvm\n242 nvidia-nvswitch\n243 nvidia-caps\n244 nvidia-nvlink\n\nBlock devices:\n  7 loop\n  8 sd\n254 virtblk\n259 blkext\n"
    );
    let modules = "nvidia_uvm 1925120 0 - Live 0xffffffffc0e00000 (OE)\n\
                   nvidia 60395520 1 nvidia_uvm, Live 0xffffffffc0400000 (OE)\n\
                   ext4 1114112 1 - Live 0xffffffffc0080000\n";
    SnapshotSpec {
        driver: Some(DriverSpec::open(version)),
        uvm_loaded: true,
        uvm_major: uvm,
        kernel_release: release.to_string(),
        hmm_config: false,
        iomem_hmm: false,
        smi: None,
        smi_failure: Some(("exit status 255".to_string(), smi.to_string())),
        dmesg: Some(dmesg),
        nodes: vec![
            NodeSpec::char("/dev/nvidia-uvm", uvm, 0),
            NodeSpec::char("/dev/nvidia-uvm-tools", uvm, 1),
            NodeSpec::char("/dev/nvidiactl", 195, 255),
        ],
        gpus: Some(Vec::new()),
        daemons: Vec::new(),
        files: vec![
            ("/proc/driver/nvidia/version".into(), version_file.into()),
            ("/proc/devices".into(), devices),
            ("/proc/modules".into(), modules.into()),
        ],
        ..SnapshotSpec::default()
    }
}

/// The 550.163.01 machine where `modprobe nvidia` failed with `ENODEV` (`NVRM: No NVIDIA GPU
/// found.`): no driver loaded, `nvidia-smi` exiting 9.
pub fn driver_refused_no_gpu() -> SnapshotSpec {
    let dmesg = format!(
        "[    0.000000] Linux version {KERNEL_6_12} (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1~deb12u1\n\
         [    3.412801] nvidia: loading out-of-tree module taints kernel.\n\
         [    3.498113] nvidia-nvlink: Nvlink Core is being initialized, major device number 244\n\
         [    3.499020] NVRM: No NVIDIA GPU found.\n\
         [    3.500184] nvidia-nvlink: Unregistered Nvlink Core, major device number 244\n"
    );
    SnapshotSpec {
        driver: None,
        uvm_loaded: false,
        kernel_release: KERNEL_6_12.to_string(),
        hmm_config: false,
        iomem_hmm: false,
        smi: None,
        smi_failure: Some(("exit status 9".to_string(), SMI_NO_DRIVER.to_string())),
        dmesg: Some(dmesg),
        nodes: Vec::new(),
        gpus: None,
        daemons: Vec::new(),
        ..SnapshotSpec::default()
    }
}

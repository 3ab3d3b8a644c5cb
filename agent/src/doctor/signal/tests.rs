//! Each signal on the forms of its source: the lines and outputs the drivers, the kernel and
//! NVML really print (each cited), holding; a clean source, failing; an unreadable one,
//! unknown.

use super::*;
use crate::doctor::collect::kernel_log::parse_kernel_log;
use crate::doctor::collect::smi::classify_smi;
use crate::doctor::facts::{Fact, KernelLog, PciGpu, SmiOutcome, SmiVerdict};
use crate::doctor::fixtures::*;

fn with_log(text: &str) -> Evidence {
    healthy_open_host().with(|e| e.kernel_log = Fact::ok(parse_kernel_log(text), "dmesg"))
}

fn state(e: &Evidence, o: &Observations, s: Sig) -> State {
    Signals::read(e, o).state(s)
}

/// `(signal, log text, where the text comes from)`: each must make its signal hold.
const LOG_FORMS: &[(Sig, &str, &str)] = &[
    (
        Sig::ModuleRefusedSignature,
        "[    5.101] Loading of unsigned module is rejected",
        "kernel/module/signing.c, module_sig_check",
    ),
    (
        Sig::ModuleRefusedSignature,
        "[    5.101] Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7",
        "security/lockdown/lockdown.c",
    ),
    (
        Sig::ModuleRefusedSignature,
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service",
        "kmod's modprobe, EKEYREJECTED (Secure Boot, reports pasted beside dmesg)",
    ),
    (
        Sig::ModuleBuiltForOtherKernel,
        "[    6.2] nvidia: Unknown symbol drm_gem_object_free (err -2)",
        "kernel/module/main.c, resolve_symbol",
    ),
    (
        Sig::ModuleBuiltForOtherKernel,
        "modprobe: ERROR: could not insert 'nvidia': Invalid module format",
        "kmod's modprobe, ENOEXEC",
    ),
    (
        Sig::ModuleNotBuilt,
        "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.8.0-50-generic",
        "kmod's modprobe.c",
    ),
    (
        Sig::OpenModuleUnsupportedGpu,
        "[  3.1] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80)\n[  3.1] NVRM: installed in this system is not supported by open\n[  3.1] NVRM: nvidia.ko because it does not include the required GPU",
        "kernel-open/nvidia/nv-pci.c, 580.65.06",
    ),
    (
        Sig::DriverFoundNoGpu,
        "[    3.499020] NVRM: No NVIDIA GPU found.",
        "kernel-open/nvidia/nv.c, nvidia_init_module (Debian 550.163.01 in a VM without a GPU)",
    ),
    (
        Sig::GpuHeldElsewhere,
        "[    3.4] NVRM: GPU 0000:01:00.0 is already bound to vfio-pci.",
        "kernel-open/nvidia/nv-pci.c, passthrough hosts",
    ),
    (
        Sig::AdapterInitFailed,
        "[  12.3] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1127)",
        "src/nvidia/arch/nvalloc/unix/src/osinit.c",
    ),
    (
        Sig::GpuFellOffBus,
        "[ 9999.1] NVRM: Xid (PCI:0000:0b:00): 79, pid=1234, GPU has fallen off the bus.",
        "nverror.h ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, nv_report_error",
    ),
    (
        Sig::GpuFellOffBus,
        "[ 9999.1] NVRM: GPU at PCI:0000:0b:00: GPU-6f0c2d1e-8a4b-4c3d-9e2f-1a7b5c3d2e10\n[ 9999.1] NVRM: GPU Board Serial Number: 1652324011187\n[ 9999.1] NVRM: The GPU has fallen off the bus.",
        "RM's lost-GPU notice, without the Xid line",
    ),
    (
        Sig::GspFailed,
        "[  20.1] NVRM: Xid (PCI:0000:17:00): 119, pid=2817, name=python3, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)",
        "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c, _kgspLogXid119",
    ),
    (
        Sig::Wpr2Up,
        "[  8.0] NVRM: _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
        "kernel_gsp.c, _kgspBootGspRm",
    ),
    (
        Sig::BarInvalid,
        "[  4.0] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:",
        "kernel-open/nvidia/nv-pci.c, nv_pci_validate_bars",
    ),
    (
        Sig::NeedsOpenModule,
        "[  3.0] NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)\n[  3.0] NVRM: installed in this system requires use of the NVIDIA open kernel modules.\n[  3.0] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)",
        "the proprietary module 580.105.08 on a Blackwell GPU (public reports)",
    ),
    (
        Sig::LegacyGpu,
        "[  568.286327] NVRM: The NVIDIA GRID K520 GPU installed in this system is\n[  568.286328] NVRM:  supported through the NVIDIA 367.xx Legacy drivers.",
        "kernel-open/nvidia/nv.c, the legacy-branch notice",
    ),
    (
        Sig::DriverLockupLogged,
        "[ 245.1] watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [UVM GPU1 BH:1234]\n[ 245.1] Call Trace:\n[ 245.1]  uvm_spin_loop+0x3c/0x80 [nvidia_uvm]\n[ 245.1] ---[ end trace 0000000000000000 ]---",
        "kernel/watchdog.c; nvidia_uvm frames (open-gpu-kernel-modules issue 1223)",
    ),
    (
        Sig::DriverOopsLogged,
        "[ 88.0] BUG: unable to handle page fault for address: 0000000000001000\n[ 88.0] Oops: 0000 [#1] SMP NOPTI\n[ 88.0] RIP: 0010:_nv012345rm+0x1f/0x40 [nvidia]\n[ 88.0] ---[ end trace 0000000000000000 ]---",
        "arch/x86/mm/fault.c, an oops in nvidia.ko",
    ),
    (
        Sig::ApiMismatchLogged,
        "[ 70.0] NVRM: API mismatch: the client has the version 570.148.08, but\n[ 70.0] NVRM: this kernel module has the version 570.148.06.",
        "kernel-open/nvidia/nv.c, nvidia_ioctl's version check",
    ),
    (
        Sig::HmmErrorLogged,
        "[ 61.2] nvidia-uvm: uvm_pmm_gpu.c:3176 devmem_alloc_pagemap[pid:92821] request_free_mem_region() err -34",
        "NVIDIA CUDA 13.2 release notes, known issues; uvm_pmm_gpu.c",
    ),
    (
        Sig::HmmErrorLogged,
        "[ 61.2] nvidia-uvm: uvm_pmm_gpu.c:3190 devmem_alloc_pagemap[pid:92821] memremap_pages() err -12",
        "uvm_pmm_gpu.c, 590.48.01",
    ),
    (
        Sig::ModuleBuiltForOtherKernel,
        "[  410.2] nvidia_uvm: module uses symbols from proprietary module nvidia, inheriting taint.\n[  410.2] nvidia_uvm: Unknown symbol radix_tree_preloads (err -2)",
        "kernel/module/main.c, resolve_symbol: nvidia_uvm 455.38 on Linux 5.9, a GPL-only symbol (AOSC-Dev/aosc-os-abbs issue 2594)",
    ),
    (
        Sig::ModuleLoadFailed,
        "modprobe: ERROR: could not insert 'nvidia_uvm': Cannot allocate memory",
        "kmod's modprobe, \"could not insert '%s': %s\" with strerror(ENOMEM) from nvidia_uvm's init",
    ),
    (
        Sig::DriverFoundNoGpu,
        "modprobe: ERROR: could not insert 'nvidia': No such device",
        "kmod's modprobe with strerror(ENODEV): nvidia_init_module found no GPU (nv.c)",
    ),
    (
        Sig::DriverFoundNoGpu,
        "[    3.1] NVRM: No NVIDIA PCI devices found.",
        "kernel-open/nvidia/nv.c, nv_drivers_init (595.45.04)",
    ),
    (
        Sig::ProbeFailed,
        "[    3.2] NVRM: pci_enable_device failed, aborting",
        "kernel-open/nvidia/nv-pci.c, nv_pci_probe (595.45.04)",
    ),
    (
        Sig::ProbeFailed,
        "[    3.2] NVRM: Can't find an IRQ for your NVIDIA card!\n[    3.2] NVRM: Please check your BIOS settings.",
        "kernel-open/nvidia/nv-pci.c, nv_pci_probe (595.45.04)",
    ),
    (
        Sig::BarInvalid,
        "[    3.2] NVRM: Fatal Error while attempting to resize PCIe BARs.",
        "kernel-open/nvidia/nv-pci.c, nv_pci_probe (595.45.04)",
    ),
    (
        Sig::GpuFatalXid,
        "[ 5120.4] NVRM: Xid (PCI:0000:3b:00): 48, pid=4021, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU (0x3b00)",
        "nverror.h ROBUST_CHANNEL_GPU_ECC_DBE; NVIDIA's Dynamic Page Retirement guide (Visibility: XID 48)",
    ),
    (
        Sig::GpuFatalXid,
        "[ 7001.0] NVRM: Xid (PCI:0000:9b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "nverror.h GPU_RECOVERY_ACTION_CHANGED; NVIDIA's Xid catalog (Xid 154 linkage)",
    ),
    (
        Sig::ResumedAfterUvmLoad,
        "[   9.0] nvidia-uvm: Loaded the UVM driver, major device number 508.\n[3600.0] PM: suspend exit",
        "kernel-open/nvidia-uvm/uvm.c; kernel/power/suspend.c",
    ),
];

#[test]
fn each_kernel_log_signal_holds_on_its_real_lines_and_fails_on_a_clean_log() {
    for (sig, text, from) in LOG_FORMS {
        let e = with_log(text);
        assert_eq!(
            state(&e, &plain(), *sig),
            State::Holds,
            "{} on {text:?} ({from})",
            sig.name()
        );
        let clean = with_log("[    0.000000] Linux version 6.8.0-45-generic\n");
        assert_eq!(
            state(&clean, &plain(), *sig),
            State::Fails,
            "{}",
            sig.name()
        );
        // Unreadable: unknown, but for a signal with a second source (the PCI bus says
        // which driver holds a GPU).
        let unread = healthy_open_host()
            .with(|e| e.kernel_log = Fact::unavailable("Operation not permitted", "/dev/kmsg"));
        if *sig != Sig::GpuHeldElsewhere {
            assert_eq!(
                state(&unread, &plain(), *sig),
                State::Unknown,
                "{}",
                sig.name()
            );
        }
    }
}

#[test]
fn a_refusal_before_the_last_successful_load_is_history() {
    let e = with_log(
        "[ 5.1] Loading of unsigned module is rejected\n[ 9.0] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  590.48.01",
    );
    assert_eq!(
        state(&e, &plain(), Sig::ModuleRefusedSignature),
        State::Fails
    );
}

/// `(signal, exit status, output, where it comes from)`.
const SMI_FORMS: &[(Sig, &str, &str, &str)] = &[
    (
        Sig::SmiNoDevices,
        "exit status 6",
        "No devices were found\n",
        "nvidia-smi on a loaded driver without a GPU",
    ),
    (
        Sig::SmiNoDevices,
        "exit status 255",
        "Failed to initialize NVML: No supported GPUs were found\n",
        "nvidia-smi of 550.163.01 loaded without a GPU",
    ),
    (
        Sig::SmiNoDriver,
        "exit status 9",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
        "nvidia-smi without a driver",
    ),
    (
        Sig::SmiVersionMismatch,
        "exit status 18",
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.148\n",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    ),
    (
        Sig::SmiUnknownError,
        "exit status 255",
        "Failed to initialize NVML: Unknown Error\n",
        "535.261.03 without a GPU; NVML denied the nodes (a container after a daemon-reload)",
    ),
];

#[test]
fn each_nvidia_smi_signal_holds_on_its_real_output() {
    for (sig, status, out, from) in SMI_FORMS {
        let e = healthy_open_host().with(|e| {
            e.smi = Fact::unavailable(format!("failed: {status}"), "nvidia-smi -q");
            e.smi_outcome = Fact::ok(classify_smi(Some(status), out), "nvidia-smi -q");
        });
        assert_eq!(
            state(&e, &plain(), *sig),
            State::Holds,
            "{} ({from})",
            sig.name()
        );
        // The healthy listing: every failure signal fails, the listing holds.
        assert_eq!(state(&healthy_open_host(), &plain(), *sig), State::Fails);
    }
    assert_eq!(
        state(&healthy_open_host(), &plain(), Sig::SmiListsGpus),
        State::Holds
    );
}

#[test]
fn hmm_allowed_from_the_parameter_or_the_drivers_default() {
    let e = healthy_open_host();
    assert_eq!(state(&e, &plain(), Sig::HmmAllowed), State::Holds);
    assert_eq!(
        state(&e.clone().hmm_param("Y"), &plain(), Sig::HmmAllowed),
        State::Fails
    );
    // The parameter unread: the default, off x86_64 (uvm_hmm.c) and before 535.
    let unread = e.clone().with(|e| {
        e.uvm_params = Fact::unavailable("not present", "/sys/module/nvidia_uvm/parameters")
    });
    assert_eq!(state(&unread, &plain(), Sig::HmmAllowed), State::Unknown);
    let arm = unread
        .clone()
        .with(|e| e.arch = Fact::ok("aarch64".into(), "/proc/sys/kernel/arch"));
    assert_eq!(state(&arm, &plain(), Sig::HmmAllowed), State::Fails);
    let old = unread.with(|e| {
        if let Ok(d) = &mut e.driver.value {
            d.version = "525.147.05".into();
        }
    });
    assert_eq!(state(&old, &plain(), Sig::HmmAllowed), State::Fails);
}

#[test]
fn a_node_made_for_another_major_and_an_allow_list_without_the_uvm_major() {
    let e = healthy_open_host();
    assert_eq!(state(&e, &plain(), Sig::NodeNumberMismatch), State::Fails);
    let stale = e.clone().with(|e| {
        if let Ok(n) = &mut e.dev_nodes.value {
            for d in n.iter_mut().filter(|d| d.path == "/dev/nvidia-uvm") {
                d.dev = Some((507, 0));
            }
        }
    });
    let r = Signals::read(&stale, &plain());
    assert_eq!(r.state(Sig::NodeNumberMismatch), State::Holds);
    assert!(r.get(Sig::NodeNumberMismatch).value.contains("507:0"));
    let lxc = e.container("lxc", Some(STALE_ALLOW));
    assert_eq!(state(&lxc, &plain(), Sig::AllowListMissesUvm), State::Holds);
    assert!(allow_line_permits("c 195:* rwm", 195, 255));
    assert!(allow_line_permits("a *:* rwm", 508, 0));
    assert!(!allow_line_permits("c 195:* r", 195, 255));
}

#[test]
fn visible_devices_that_name_no_gpu() {
    let e = healthy_open_host();
    for (v, none) in [
        ("", true),
        ("-1", true),
        ("none", true),
        ("5", true),
        ("0", false),
        ("GPU-1234", false),
    ] {
        let o = watched().cuinit(100, 0.01).visible_devices(v);
        let want = if v == "GPU-1234" {
            State::Unknown
        } else if none {
            State::Holds
        } else {
            State::Fails
        };
        assert_eq!(state(&e, &o, Sig::VisibleDevicesNameNone), want, "{v:?}");
    }
    assert_eq!(
        state(&e, &watched().cuinit(100, 0.01), Sig::VisibleDevicesSet),
        State::Fails
    );
    assert_eq!(state(&e, &plain(), Sig::VisibleDevicesSet), State::Unknown);
}

#[test]
fn what_the_probes_saw_is_unknown_without_a_process() {
    let e = healthy_open_host();
    for s in [
        Sig::DeviceOpensOk,
        Sig::OpenDenied,
        Sig::RegisterGpuFailed,
        Sig::ForkedAfterInit,
        Sig::ThreadInDriver,
    ] {
        assert_eq!(state(&e, &plain(), s), State::Unknown, "{}", s.name());
    }
    let o = watched().cuinit(3, 0.4).opens(4);
    assert_eq!(state(&e, &o, Sig::DeviceOpensOk), State::Holds);
    assert_eq!(state(&e, &o, Sig::RegisterGpuFailed), State::Fails);
    // Without the ioctl probes, a driver call's failure is unknown, not absent.
    let blind = o.unavailable("tracepoint:ioctl: refused");
    assert_eq!(state(&e, &blind, Sig::RegisterGpuFailed), State::Unknown);
    assert_eq!(
        state(&e, &register_gpu_no_memory(), Sig::RegisterGpuNoMemory),
        State::Holds
    );
}

#[test]
fn an_hgx_board_is_an_nvswitch_system_without_nodes_or_fabric_state() {
    let e = healthy_open_host().smi(|s| {
        s.gpus = 8;
        s.product_name = vec!["NVIDIA B200".into(); 8];
        s.fabric_state = vec![String::new(); 8];
    });
    let e = e.with(|e| e.nvswitch_nodes = Fact::ok(vec![], "/dev/nvidia-nvswitch*"));
    assert_eq!(state(&e, &plain(), Sig::NvswitchPresent), State::Holds);
    let pcie = e.smi(|s| s.product_name = vec!["NVIDIA H100 PCIe".into(); 8]);
    assert_eq!(state(&pcie, &plain(), Sig::NvswitchPresent), State::Fails);
}

#[test]
fn the_kernel_log_is_classified_once_for_every_reader() {
    let log: KernelLog = parse_kernel_log(LOG_FORMS[0].1);
    let c = kernel_log::classify(&log);
    assert_eq!(c.refused_signature.len(), 1);
    assert!(c.refused_other_kernel.is_empty());
}

#[test]
fn a_gpu_bound_to_nvidia_that_nvidia_smi_does_not_list() {
    let e = healthy_open_host();
    assert_eq!(state(&e, &plain(), Sig::DriverHoldsEveryGpu), State::Holds);
    assert_eq!(state(&e, &plain(), Sig::BoundGpuNotListed), State::Fails);
    // nvidia-smi: "No devices were found" with the GPU bound (RmInitAdapter at first open).
    let none = e.clone().with(|e| {
        e.smi_outcome = Fact::ok(
            SmiOutcome {
                verdict: SmiVerdict::NoGpu,
                status: Some("exit status 6".into()),
                message: Some("No devices were found".into()),
            },
            "nvidia-smi -q",
        );
        e.smi = Fact::unavailable("No devices were found", "nvidia-smi -q");
    });
    assert_eq!(state(&none, &plain(), Sig::BoundGpuNotListed), State::Holds);
    // Eight bound, seven listed: one GPU the driver could not bring up.
    let eight = e.clone().with(|e| {
        e.pci_gpus = Fact::ok(
            (0..8)
                .map(|n| PciGpu {
                    address: format!("0000:{:02x}:00.0", 0x18 + n),
                    class: "0x030200".into(),
                    driver: Some("nvidia".into()),
                    device: Some(0x2335),
                })
                .collect(),
            "/sys/bus/pci/devices",
        );
        if let Ok(s) = &mut e.smi.value {
            s.gpus = 7;
        }
    });
    assert_eq!(
        state(&eight, &plain(), Sig::BoundGpuNotListed),
        State::Holds
    );
    // Bound to vfio-pci: the driver holds none; an excluded GPU leaves it unknown.
    let vfio = e.clone().with(|e| {
        e.pci_gpus = Fact::ok(
            vec![PciGpu {
                address: "0000:18:00.0".into(),
                class: "0x030200".into(),
                driver: Some("vfio-pci".into()),
                device: Some(0x2335),
            }],
            "/sys/bus/pci/devices",
        )
    });
    assert_eq!(
        state(&vfio, &plain(), Sig::DriverHoldsEveryGpu),
        State::Fails
    );
    let excluded = e.with(|e| {
        e.driver_params = Fact::ok(
            [("ExcludedGpus".to_string(), "\"0000:18:00.0\"".to_string())]
                .into_iter()
                .collect(),
            "/proc/driver/nvidia/params",
        )
    });
    assert_eq!(
        state(&excluded, &plain(), Sig::DriverHoldsEveryGpu),
        State::Unknown
    );
}

#[test]
fn a_cuda_module_absent_is_nvidia_or_nvidia_uvm() {
    let e = healthy_open_host();
    assert_eq!(state(&e, &plain(), Sig::CudaModuleAbsent), State::Fails);
    let no_uvm = e
        .clone()
        .with(|e| e.modules = Fact::ok(vec!["nvidia".into()], "/proc/modules"));
    assert_eq!(
        state(&no_uvm, &plain(), Sig::CudaModuleAbsent),
        State::Holds
    );
    assert_eq!(
        state(&no_driver_host(), &plain(), Sig::CudaModuleAbsent),
        State::Holds
    );
}

#[test]
fn under_mig_a_process_sees_one_mig_device() {
    // One A100 with two MIG devices (pytorch/pytorch issue 130181: "a single CUDA process can
    // only enumerate a single MIG device").
    let mig = healthy_open_host().with(|e| {
        if let Ok(s) = &mut e.smi.value {
            s.mig_mode = vec!["Enabled".into()];
            s.mig_devices = vec![2];
        }
    });
    let one = watched()
        .cuinit(0, 0.3)
        .with(|o| o.device_count_seen = Some(1));
    assert_eq!(state(&mig, &one, Sig::DeviceCountLow), State::Holds);
    // Given one MIG device on purpose: what it asked for.
    let pinned = one
        .clone()
        .visible_devices("MIG-4f1c2b3a-0d9e-5a6b-8c7d-1e2f3a4b5c6d");
    assert_eq!(state(&mig, &pinned, Sig::DeviceCountLow), State::Fails);
    // One GPU given on purpose on a host of several: not low either.
    assert_eq!(
        device_count_disagrees(None, Some(8), Some("3"), 1),
        None,
        "CUDA_VISIBLE_DEVICES=3 on eight GPUs"
    );
    assert_eq!(
        device_count_disagrees(None, Some(8), Some("0,1,9"), 2),
        Some((3, "GPU(s)"))
    );
    let several = watched().visible_devices("0,1,2,3");
    assert_eq!(
        state(&mig, &several, Sig::VisibleDevicesSeveral),
        State::Holds
    );
    assert_eq!(
        state(
            &mig,
            &watched().visible_devices("0"),
            Sig::VisibleDevicesSeveral
        ),
        State::Fails
    );
}

#[test]
fn a_blackwell_gpu_beside_the_proprietary_module_needs_the_open_one() {
    // PCI device IDs of open-gpu-kernel-modules' README (595.45.04, compatible GPUs).
    let host = |id: u16, open: bool| {
        let e = healthy_open_host().with(|e| {
            if let Ok(p) = &mut e.pci_gpus.value {
                p[0].device = Some(id);
            }
        });
        if open {
            e
        } else {
            e.proprietary()
        }
    };
    for (id, name) in [
        (0x2901, "NVIDIA B200"),
        (0x2941, "NVIDIA GB200"),
        (0x2bb5, "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        (0x2b85, "NVIDIA GeForce RTX 5090"),
        (0x2e12, "NVIDIA GB10"),
        (0x3182, "NVIDIA B300 SXM6 AC"),
    ] {
        assert_eq!(
            state(&host(id, false), &plain(), Sig::NeedsOpenModule),
            State::Holds,
            "{name}"
        );
        assert_eq!(
            state(&host(id, true), &plain(), Sig::NeedsOpenModule),
            State::Fails,
            "{name} on the open module"
        );
    }
    for (id, name) in [
        (0x2335, "NVIDIA H200"),
        (0x26b9, "NVIDIA L40S"),
        (0x28e3, "NVIDIA GeForce RTX 3050 A Laptop GPU"),
        (0x20b2, "NVIDIA A100-SXM4-80GB"),
    ] {
        assert_eq!(
            state(&host(id, false), &plain(), Sig::NeedsOpenModule),
            State::Fails,
            "{name}"
        );
    }
}

#[test]
fn hmm_memory_is_set_up_for_each_gpu_or_missing_for_some() {
    let regions = |n: usize, gpus: usize| {
        healthy_open_host().with(|e| {
            e.iomem_hmm = Fact::ok(
                (0..n)
                    .map(|g| format!("3fe0{g:08x}-3fffffffffff : nvidia-uvm-hmm"))
                    .collect(),
                "/proc/iomem",
            );
            e.gpus = Fact::ok(
                (0..gpus)
                    .map(|g| format!("0000:{:02x}:00.0", 0x18 + g))
                    .collect(),
                "/proc/driver/nvidia/gpus",
            );
        })
    };
    assert_eq!(
        state(&regions(8, 8), &plain(), Sig::HmmMemorySetUp),
        State::Holds
    );
    // Seven of eight: the eighth GPU's set-up failed (the motivating incident's picture).
    assert_eq!(
        state(&regions(7, 8), &plain(), Sig::HmmMemorySetUp),
        State::Fails
    );
    assert_eq!(
        state(&regions(7, 8), &plain(), Sig::HmmMemoryMissing),
        State::Holds
    );
}

#[test]
fn uvm_unreachable_when_its_module_node_or_open_is_not_there() {
    let e = healthy_open_host();
    assert_eq!(
        state(&e, &watched().cuinit(3, 0.2), Sig::UvmUnreachable),
        State::Fails
    );
    let denied = watched()
        .cuinit(3, 0.02)
        .failed_open("/dev/nvidia-uvm", "EACCES");
    assert_eq!(state(&e, &denied, Sig::UvmUnreachable), State::Holds);
    let no_node = e.clone().without_node("/dev/nvidia-uvm");
    assert_eq!(state(&no_node, &plain(), Sig::UvmUnreachable), State::Holds);
    let no_module = e.with(|e| e.modules = Fact::ok(vec!["nvidia".into()], "/proc/modules"));
    assert_eq!(
        state(&no_module, &plain(), Sig::UvmUnreachable),
        State::Holds
    );
}

#[test]
fn a_stack_in_rm_alone_is_outside_hmm_and_one_in_nvidia_uvm_is_not() {
    let e = healthy_open_host();
    let stack = |frames: &[&str]| {
        watched().in_flight(200.0).with(|o| {
            o.stuck_state = Some("D (disk sleep)".into());
            o.stuck_stack = frames.iter().map(|f| f.to_string()).collect();
        })
    };
    let rm = stack(&[
        "__down_common+0x116/0x200",
        "os_acquire_mutex+0x37/0x50 [nvidia]",
        "rm_ioctl+0x63/0xb0 [nvidia]",
    ]);
    assert_eq!(state(&e, &rm, Sig::StackOutsideHmm), State::Holds);
    // Waiting in nvidia_uvm for the lock another thread holds in HMM set-up.
    let uvm = stack(&["uvm_gpu_retain_by_uuid+0x40/0x1a0 [nvidia_uvm]"]);
    assert_eq!(state(&e, &uvm, Sig::StackOutsideHmm), State::Fails);
    assert_eq!(
        state(&e, &watched().in_flight(9.0), Sig::StackOutsideHmm),
        State::Unknown
    );
}

#[test]
fn a_container_given_no_gpu_node_and_a_parent_gpu_named_under_mig() {
    // NVIDIA_VISIBLE_DEVICES=none: control and UVM nodes, no /dev/nvidia<N>.
    let none = healthy_open_host().without_node("/dev/nvidia0").with(|e| {
        if let Ok(c) = &mut e.container.value {
            c.kind = "docker".into();
        }
    });
    assert_eq!(
        state(&none, &plain(), Sig::ContainerWithoutGpu),
        State::Holds
    );
    let mig = healthy_open_host().smi(|s| {
        s.mig_mode = vec!["Enabled".into()];
        s.mig_devices = vec![1];
    });
    let parent = watched()
        .cuinit(100, 0.02)
        .visible_devices("GPU-7327fca2-18fa-b021-ba3d-8499a04c9c81");
    assert_eq!(
        state(&mig, &parent, Sig::VisibleDevicesParentUnderMig),
        State::Holds
    );
    let mig_device = watched()
        .cuinit(0, 0.3)
        .visible_devices("MIG-4f1c2b3a-0d9e-5a6b-8c7d-1e2f3a4b5c6d");
    assert_eq!(
        state(&mig, &mig_device, Sig::VisibleDevicesParentUnderMig),
        State::Fails
    );
    assert_eq!(
        state(
            &healthy_open_host(),
            &parent,
            Sig::VisibleDevicesParentUnderMig
        ),
        State::Fails
    );
}

#[test]
fn driver_calls_seen_mean_the_driver_was_reached() {
    let e = healthy_open_host();
    let no_opens = watched().cuinit(3, 0.2);
    assert_eq!(state(&e, &no_opens, Sig::NoDeviceOpens), State::Holds);
    let called = no_opens.failed_call("UVM_REGISTER_GPU", "/dev/nvidia-uvm", "NV_ERR_NO_MEMORY");
    assert_eq!(state(&e, &called, Sig::NoDeviceOpens), State::Fails);
}

#[test]
fn four_sxm_gpus_are_no_nvswitch_board_and_eight_are() {
    let board = |n: usize| {
        healthy_open_host().smi(|s| {
            s.gpus = n as u32;
            s.product_name = vec!["NVIDIA H100 80GB HBM3".into(); n];
            s.fabric_state = vec![];
        })
    };
    assert_eq!(
        state(&board(4), &plain(), Sig::NvswitchPresent),
        State::Fails
    );
    assert_eq!(
        state(&board(8), &plain(), Sig::NvswitchPresent),
        State::Holds
    );
}

#[test]
fn hmm_seen_running_outweighs_a_config_that_compiles_it_out() {
    // Debian's 6.1 package config has CONFIG_DEVICE_PRIVATE off (the vm-test's kernel_facts).
    let off = healthy_open_host().config("CONFIG_DEVICE_PRIVATE", None);
    assert_eq!(state(&off, &plain(), Sig::KernelHmm), State::Fails);
    // ...but nvidia_uvm's HMM set-up was seen running: the config read is not this kernel's.
    let probed = register_gpu_no_memory().with(|o| {
        o.kernel_signals
            .push("request_free_mem_region = -34 (ERANGE) in UVM_REGISTER_GPU".into())
    });
    assert_eq!(state(&off, &probed, Sig::KernelHmm), State::Holds);
    let logged = off.clone().with(|e| {
        e.kernel_log = Fact::ok(
            parse_kernel_log(
                "[  9.1] nvidia-uvm: uvm_pmm_gpu.c:320 devmem_alloc_pagemap[pid:511] request_free_mem_region() err -34",
            ),
            "dmesg",
        )
    });
    assert_eq!(state(&logged, &plain(), Sig::KernelHmm), State::Holds);
}

#[test]
fn a_uvm_open_missing_its_node_or_module_but_not_one_of_another_major() {
    let e = healthy_open_host();
    let enxio = watched()
        .cuinit(999, 0.02)
        .failed_open("/dev/nvidia-uvm", "ENXIO");
    assert_eq!(state(&e, &enxio, Sig::UvmOpenMissing), State::Holds);
    // Another node's failure is not the UVM node's.
    let ctl = watched()
        .cuinit(999, 0.02)
        .failed_open("/dev/nvidiactl", "ENOENT");
    assert_eq!(state(&e, &ctl, Sig::UvmOpenMissing), State::Fails);
    assert_eq!(state(&e, &plain(), Sig::UvmOpenMissing), State::Unknown);
}

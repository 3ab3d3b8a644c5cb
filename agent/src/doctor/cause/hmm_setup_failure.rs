//! `hmm_setup_failure`: nvidia_uvm's HMM device-memory set-up fails or hangs on this kernel.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

/// The file the HMM fix writes.
pub const HMM_CONF: &str = "/etc/modprobe.d/uvmwatch-disable-hmm.conf";

/// `cuInit`'s codes of a failed set-up: 3 (NVIDIA open-gpu-kernel-modules issues 797, 901,
/// 947), 100 where the framework reports "no CUDA device" after it.
const CODES: &[i64] = &[3, 100];

pub const CAUSE: Cause = Cause {
    id: CauseId::HmmSetupFailure,
    title: "nvidia_uvm HMM set-up fails or hangs on this kernel",
    doc: "The first UVM_REGISTER_GPU (ioctl 37) for each GPU runs uvm_pmm_devmem_init under \
          nvidia_uvm's global lock: request_free_mem_region for the GPU's whole memory, then \
          memremap_pages of device-private pages (open-gpu-kernel-modules uvm_pmm_gpu.c, \
          570.124 and later). When it fails, UVM_REGISTER_GPU returns NV_ERR_NO_MEMORY (an \
          errno-mapped status before 570.123) and cuInit returns 3; when it stalls, the call \
          never returns and blocks every other registration. The error prints only with \
          uvm_debug_prints=1, so the kernel log stays silent. HMM runs only on the open \
          module with uvm_disable_hmm=N, a kernel with CONFIG_HMM_MIRROR and \
          CONFIG_DEVICE_PRIVATE, and no ATS (uvm_hmm.c). NVIDIA's CUDA release notes (known \
          issue: CUDA initialization can fail on certain Linux kernels with KASLR enabled) \
          name KASLR, fixed upstream by ea72ce5da228 (6.11); the 535.216.03 data-center \
          release notes (known issue) add MIG: UVM may fail to initialize when both MIG and \
          HMM are used on systems with many large-memory GPUs.",
    produces: &[
        (Fits::CallFailed(Some("UVM_REGISTER_GPU")), Strong),
        (Fits::CallHung(Some("UVM_REGISTER_GPU")), Strong),
        (Fits::Cuinit(CODES), Weak),
        (Fits::CuinitHung, Weak),
        (Fits::Host(HostSymptom::HmmErrorLogged), Decisive),
    ],
    needs: &[OpenModule, HmmAllowed, KernelHmm],
    rules_out: &[AtsAddressing, UvmUnreachable, NoDeviceOpens, GpuNodesAbsent],
    supports: &[
        (HmmErrorLogged, Decisive),
        (HmmFailureProbed, Decisive),
        (StackInHmmSetup, Decisive),
        (RegisterGpuNoMemory, Decisive),
        (RegisterGpuFailed, Weak),
        (HmmMemoryMissing, Weak),
        (KaslrOn, Weak),
        (KernelLacksKaslrFix, Weak),
        (MigOn, Weak),
    ],
    against: &[
        (HmmMemorySetUp, Strong),
        (HmmSilentWithPrints, Strong),
        (StackOutsideHmm, Strong),
        (GpuFellOffBus, Strong),
        (AdapterInitFailed, Strong),
        (ForkedAfterInit, Strong),
    ],
    generic: false,
    yields_to: &[],
    hazards: &[Hazard {
        when: &[
            OpenModule,
            HmmAllowed,
            KernelHmm,
            KaslrOn,
            KernelLacksKaslrFix,
        ],
        severity: Severity::Warning,
    }],
    tell_apart: "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm uvm_disable_hmm=1, then start the failing program again: it starts now if HMM set-up was the cause (reload without the parameter to undo)",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let echo = format!("echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee {HMM_CONF}");
    let mut steps = vec![
        step(
            Where::Host,
            format!(
                "Disable HMM in nvidia_uvm. Module parameters are host state.{}",
                c.host_only()
            ),
            &[&echo],
        ),
        step(
            Where::Host,
            "Stop everything that uses the GPU (workloads, containers, nvidia-persistenced, \
             DCGM), then reload nvidia_uvm so the option takes effect, or reboot. If nvidia_uvm \
             is loaded from the initramfs, rebuild it first (update-initramfs -u or dracut -f).",
            &[
                "sudo fuser -v /dev/nvidia-uvm",
                "sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            ],
        ),
        step(
            Where::Any,
            "Verify: must print Y. Then run cuInit again (or `uvmwatch doctor`).",
            &["cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"],
        ),
    ];
    if !c.holds(HmmErrorLogged) {
        steps.push(step(
            Where::Host,
            "Optional, to confirm the cause: turn on UVM's error prints (writable at runtime), \
             run the failing program once, and look for request_free_mem_region() err in the \
             kernel log.",
            &[
                "echo 1 | sudo tee /sys/module/nvidia_uvm/parameters/uvm_debug_prints",
                "sudo dmesg | grep -E 'nvidia-uvm|request_free_mem_region'",
            ],
        ));
    }
    // nokaslr and a newer kernel help only where the known KASLR cause can apply.
    if c.s.state(KaslrOn) != super::super::signal::State::Fails
        && c.s.state(KernelLacksKaslrFix) != super::super::signal::State::Fails
    {
        steps.extend([
            step(
                Where::Host,
                "Alternative: boot with nokaslr (Debian/Ubuntu GRUB shown; RHEL/Fedora: \
                 sudo grubby --update-kernel=ALL --args=nokaslr), then reboot. This turns off a \
                 kernel hardening feature.",
                &["sudo sed -i 's/^GRUB_CMDLINE_LINUX_DEFAULT=\"/&nokaslr /' /etc/default/grub && sudo update-grub"],
            ),
            step(
                Where::Host,
                "Alternative: boot a kernel with upstream commit ea72ce5da228 (\"x86/kaslr: Expose \
                 and use the end of the physical memory address space\", mainline 6.11 and later, \
                 backported by some distributions).",
                &[],
            ),
        ]);
    }
    steps
}

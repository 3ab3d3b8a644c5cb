//! `version_mismatch`: the user-space driver and the kernel module differ.

use super::super::finding::{FixStep, Severity, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Hazard, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::VersionMismatch,
    title: "the user-space driver library and the kernel module differ, or a forward-compatibility library is used where it cannot work",
    doc: "libcuda and NVML talk to the kernel module of their own version: after a driver \
          upgrade the old module stays loaded until a reboot, and the kernel logs 'NVRM: API \
          mismatch' (nv.c) while NVML fails with 'Driver/library version mismatch' and cuInit \
          returns 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: the code names the cause, cuda.h). A \
          libcuda baked into a container image shadows the host's. A CUDA \
          forward-compatibility library (compat/) works only on data-center GPUs with an older \
          driver (CUDA Compatibility guide): elsewhere cuInit returns 804 \
          (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE).",
    produces: &[
        (Fits::Cuinit(&[803, 804]), Decisive),
        (Fits::StartCall(&[803, 804]), Decisive),
        (Fits::Host(HostSymptom::VersionMismatch), Strong),
        (Fits::Cuinit(&[999, 3]), Weak),
    ],
    needs: &[],
    rules_out: &[Wsl],
    supports: &[
        (ApiMismatchLogged, Decisive),
        (SmiVersionMismatch, Decisive),
        (LibcudaVersionDiffers, Strong),
        (SmiDriverVersionDiffers, Strong),
        (CompatUnsupported, Strong),
        (CompatLibcuda, Weak),
        (GeforceGpu, Weak),
    ],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[
        Hazard {
            when: &[LibcudaVersionDiffers],
            severity: Severity::Critical,
        },
        Hazard {
            when: &[CompatUnsupported],
            severity: Severity::Warning,
        },
    ],
    tell_apart: "cat /proc/driver/nvidia/version && ls -l /usr/lib/x86_64-linux-gnu/libcuda.so.*: the kernel module's version against the library's",
    fix,
};

fn fix(c: &Ctx) -> Vec<FixStep> {
    let pid =
        c.o.pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "<pid>".into());
    let maps = format!("grep libcuda /proc/{pid}/maps");
    let mut steps = Vec::new();
    if !c.holds(CompatLibcuda) || c.holds(LibcudaVersionDiffers) || c.holds(ApiMismatchLogged) {
        steps.push(step(
            Where::Host,
            format!(
                "After a driver upgrade the old module stays loaded until a reboot (or until \
                 every nvidia module is unloaded and reloaded): reboot so the module matches \
                 the libraries; finish a half-done package upgrade first.{}",
                c.host_only()
            ),
            &["cat /proc/driver/nvidia/version", "sudo reboot"],
        ));
        steps.push(step(
            Where::Container,
            "Use the host's driver library: the NVIDIA Container Toolkit mounts it; a libcuda \
             baked into the image or found first on LD_LIBRARY_PATH shadows it.",
            &["ldconfig -p | grep libcuda", &maps],
        ));
    }
    let code_804 = c.o.cuinit_result == Some(804) || c.o.context_result == Some(804);
    if c.holds(CompatLibcuda) || c.holds(CompatUnsupported) || code_804 {
        steps.push(step(
            Where::Container,
            "Drop the CUDA forward-compatibility library (a compat/ directory) from the library \
             path, or remove the cuda-compat package: forward compatibility works only on \
             data-center GPUs and with a driver older than the compat library.",
            &["echo $LD_LIBRARY_PATH", &maps],
        ));
    }
    steps
}

//! `wsl_linux_driver`: a Linux NVIDIA driver inside WSL2 shadows WSL's own library.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::WslLinuxDriver,
    title: "a Linux NVIDIA driver installed inside WSL2 shadows WSL's own libcuda",
    doc: "NVIDIA, CUDA on WSL User Guide: 'users must not install any NVIDIA GPU Linux driver \
          within WSL 2': a Linux driver package puts its own libcuda.so in the distribution's \
          library directories, where the loader finds it before /usr/lib/wsl/lib; that \
          library looks for /dev/nvidiactl, which WSL has not, and CUDA fails. A packaging \
          mismatch, not a missing GPU.",
    produces: &[
        (Fits::Host(HostSymptom::WslBroken), Strong),
        (Fits::Cuinit(&[]), Weak),
        (Fits::StartCall(&[]), Weak),
    ],
    needs: &[Wsl],
    rules_out: &[],
    supports: &[
        (LinuxLibcudaMappedInWsl, Decisive),
        (LinuxLibcudaInstalledInWsl, Strong),
    ],
    against: &[],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "ldconfig -p | grep libcuda: only /usr/lib/wsl/lib's copies must be listed",
    fix,
};

fn fix(_: &Ctx) -> Vec<FixStep> {
    vec![
        step(
            Where::Any,
            "Remove the Linux NVIDIA driver from the distribution (install the CUDA toolkit's \
             WSL-Ubuntu package, never a package with a driver) and rebuild the linker cache, so \
             that WSL's libcuda is the one found.",
            &[
                "sudo apt-get remove --purge '^nvidia-.*' '^libnvidia-.*'",
                "sudo ldconfig",
                "ldconfig -p | grep libcuda",
            ],
        ),
        step(
            Where::Any,
            "Verify: WSL's nvidia-smi lists the GPU.",
            &["/usr/lib/wsl/lib/nvidia-smi -L"],
        ),
    ]
}

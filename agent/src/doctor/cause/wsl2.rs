//! `wsl2`: CUDA on WSL2 cannot reach the Windows driver's GPU.

use super::super::finding::{FixStep, Where};
use super::super::signal::Sig::*;
use super::super::symptom::{Fits, HostSymptom};
use super::{step, Cause, CauseId, Ctx, Weight::*};

pub const CAUSE: Cause = Cause {
    id: CauseId::Wsl2,
    title: "CUDA on WSL2 cannot reach the Windows driver's GPU (no /dev/dxg, no WSL libcuda, or the Windows side)",
    doc: "On WSL2 the GPU belongs to the Windows driver: Linux has no nvidia module and no \
          /dev/nvidia*; CUDA reaches the GPU through /dev/dxg with the libcuda.so* the Windows \
          driver mounts in /usr/lib/wsl/lib (NVIDIA, CUDA on WSL User Guide). Without \
          /dev/dxg (WSL 1, no GPU support in that Windows build) or without WSL's libcuda \
          (a Windows driver without WSL support), CUDA finds no device; with both in place, a \
          failure's cause is still WSL's GPU path (the Windows driver, WSL's own set-up), \
          which uvmwatch cannot read from inside.",
    produces: &[
        (Fits::Host(HostSymptom::WslBroken), Strong),
        (Fits::Cuinit(&[]), Weak),
        (Fits::StartCall(&[]), Weak),
        (Fits::CuinitHung, Weak),
    ],
    needs: &[Wsl],
    rules_out: &[],
    supports: &[
        (DxgAbsent, Decisive),
        (WslLibcudaAbsent, Decisive),
        (Wsl, Strong),
    ],
    against: &[
        (LinuxLibcudaMappedInWsl, Strong),
        (LinuxLibcudaInstalledInWsl, Weak),
    ],
    generic: false,
    yields_to: &[],
    hazards: &[],
    tell_apart: "/usr/lib/wsl/lib/nvidia-smi -L && ls -l /dev/dxg: the GPU through WSL's own tools",
    fix,
};

fn fix(_: &Ctx) -> Vec<FixStep> {
    vec![
        step(
            Where::Host,
            "On Windows: install a current NVIDIA driver with WSL support, make sure this \
             distribution runs as WSL 2 (not 1), update WSL and restart it.",
            &["wsl.exe -l -v", "wsl.exe --update", "wsl.exe --shutdown"],
        ),
        step(
            Where::Any,
            "Verify: WSL's nvidia-smi lists the GPU and /dev/dxg exists.",
            &["/usr/lib/wsl/lib/nvidia-smi -L", "ls -l /dev/dxg"],
        ),
    ]
}

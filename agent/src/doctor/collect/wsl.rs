//! Windows Subsystem for Linux 2: `/dev/dxg` and the libraries in `/usr/lib/wsl/lib`.
//!
//! On WSL2 the GPU belongs to the Windows driver: Linux sees it through `/dev/dxg` (the
//! `dxgkrnl` DirectX interface), has no nvidia kernel module, no `/proc/driver/nvidia` and no
//! `/dev/nvidia*`, and runs the `libcuda.so*` Windows's driver mounts in `/usr/lib/wsl/lib`
//! (NVIDIA, "CUDA on WSL User Guide", sections "Getting Started" and "Known Limitations").

use super::super::facts::{Fact, WslInfo};
use super::super::root::Root;
use super::why_unreadable;
use crate::host::discovery::DRIVER_DIRS;

/// WSL's own directory: its loader (`lib/`) and the Windows driver store it maps
/// (`drivers/<inf>/`, CUDA on WSL User Guide).
pub const WSL_DIR: &str = "/usr/lib/wsl";

/// Where WSL2 mounts the Windows driver's Linux libraries.
pub const WSL_LIB: &str = "/usr/lib/wsl/lib";

/// The DirectX kernel interface node.
pub const DXG: &str = "/dev/dxg";

/// Driver directories a Linux NVIDIA driver package installs `libcuda.so*` into: on WSL2 a
/// file there shadows WSL's own (the guide's "must not install any NVIDIA GPU Linux driver
/// within WSL 2"). The CUDA forward-compatibility directory is not one: it is opt-in through
/// `LD_LIBRARY_PATH`.
fn linux_driver_dirs() -> impl Iterator<Item = &'static str> {
    DRIVER_DIRS
        .iter()
        .copied()
        .filter(|d| *d != WSL_LIB && !d.ends_with("/compat"))
}

/// WSL2's traces: `/dev/dxg` and the `libcuda*` files of [`WSL_LIB`], and on WSL2 the
/// `libcuda.so*` files a Linux driver package put in its usual directories. Not present (an
/// unavailable fact) when neither trace is there: not WSL2.
pub(super) fn collect_wsl(root: &Root) -> Fact<WslInfo> {
    let dxg = root.exists(DXG);
    let libcuda = match root.read_dir(WSL_LIB) {
        Ok(names) => names
            .into_iter()
            .filter(|n| n.starts_with("libcuda"))
            .map(|n| format!("{WSL_LIB}/{n}"))
            .collect(),
        Err(err) if !dxg => {
            return Fact::unavailable(
                why_unreadable(&err, Some("not WSL2 (no /dev/dxg, no /usr/lib/wsl/lib)")),
                WSL_LIB,
            )
        }
        Err(_) => Vec::new(),
    };
    let mut linux_libcuda = Vec::new();
    for dir in linux_driver_dirs() {
        if let Ok(names) = root.read_dir(dir) {
            linux_libcuda.extend(
                names
                    .into_iter()
                    .filter(|n| n.starts_with("libcuda.so"))
                    .map(|n| format!("{dir}/{n}")),
            );
        }
    }
    Fact::ok(
        WslInfo {
            dxg,
            libcuda,
            linux_libcuda,
        },
        WSL_LIB,
    )
}

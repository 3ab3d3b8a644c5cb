//! Test doubles that let integration tests drive the real uvmwatch agent on a machine
//! without a GPU or an NVIDIA driver.
//!
//! Three parts:
//! - a fake `libcuda.so.1` (`c/fake_libcuda.c`) whose `cuInit` replays the opens and driver
//!   ioctls of a real `cuInit`, with NVIDIA's real ioctl numbers (see [`nv`]);
//! - `cuda-workload` (`c/cuda_workload.c`), a program that loads it and calls `cuInit`;
//! - `uvmwatch-fakedev`, a FUSE server that serves the device nodes and can fail, delay or
//!   hold any ioctl ([`FakeDev`]).
//!
//! [`spawn_workload`] runs the workload in a private mount namespace whose `/dev` is a tmpfs
//! holding the fake nodes at their real paths (`/dev/nvidiactl`, `/dev/nvidia0`,
//! `/dev/nvidia-uvm`, ...), so an agent tracing `openat`/`ioctl` sees what it would see on
//! a GPU machine. The host's `/dev` is never touched.
//!
//! Everything here needs root, `/dev/fuse`, `unshare` and `mount` (util-linux) and a C
//! compiler; [`check_environment`] says what is missing so a test can print
//! `SKIPPED: <reason>` and return.
//!
//! ```no_run
//! use uvmwatch_testbed::*;
//! # fn main() -> anyhow::Result<()> {
//! if let Err(reason) = check_environment() {
//!     println!("SKIPPED: {reason}");
//!     return Ok(());
//! }
//! let out = tempfile::tempdir()?;
//! let artifacts = build_artifacts(out.path())?;
//! let dev = FakeDev::start(&artifacts, FakeDevConfig::default())?;
//! let mut workload = Workload::spawn(&dev, &artifacts, WorkloadConfig::default())?;
//! let output = workload.wait_timeout(std::time::Duration::from_secs(10))?;
//! assert_eq!(output.cuinit_lines()[0].rc, 0);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod artifacts;
mod fakedev;
pub mod nv;
pub mod procfs;
pub mod rules;
mod workload;

pub use artifacts::{
    build_artifacts, build_artifacts_with_fakedev, check_environment, locate_fakedev, Artifacts,
    CUDA_WORKLOAD_C, FAKEDEV_BIN, FAKEDEV_ENV, FAKE_LIBCUDA_C,
};
pub use fakedev::{FakeDev, FakeDevConfig, FAKEDEV_FSTYPE};
pub use rules::{IoctlAction, IoctlRule, OpenDenial};
pub use workload::{
    parse_cuinit_lines, spawn_workload, spawn_workload_with_args, CuInitLine, LibLocation,
    Scenario, Workload, WorkloadConfig, WorkloadOutput, PRIVATE_LIB_DIR,
};

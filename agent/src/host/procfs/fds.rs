//! Open NVIDIA device nodes of a process: `/proc/<pid>/fd` and `fdinfo`.

use std::fs;
use std::io;
use std::path::Path;

use anyhow::{anyhow, Context, Result};

use super::parse_decimal_u32;

/// `O_CLOEXEC` as printed (octal) on the `flags:` line of `/proc/<pid>/fdinfo/<fd>`
/// (x86_64 and aarch64 value, `include/uapi/asm-generic/fcntl.h`).
pub const O_CLOEXEC_FDINFO: u32 = 0o2_000_000;

/// Kind of NVIDIA character device an fd refers to (numbers as [`uvmwatch_common::NV_MAJOR`],
/// [`uvmwatch_common::NV_CTL_MINOR`], [`uvmwatch_common::UVM_TOOLS_MINOR`], from NVIDIA's
/// `nv-chardev-numbers.h` and `uvm_common.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// `/dev/nvidiactl` (major 195, minor 255): RM control node.
    Ctl,
    /// `/dev/nvidia<N>` (major 195, minor N, 0..=254): one GPU; the value is N.
    Gpu(u32),
    /// `/dev/nvidia-uvm` (dynamic major, minor 0).
    Uvm,
    /// `/dev/nvidia-uvm-tools` (dynamic major, minor 1): profiler/event interface.
    UvmTools,
}

impl NodeKind {
    /// Recognises exactly `/dev/nvidiactl`, `/dev/nvidia<N>` (N decimal without leading
    /// zeros, 0..=254), `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`. Every other path
    /// (`/dev/nvidia-modeset`, `/dev/nvidia-caps/...`, `/dev/nvidia-nvswitch0`,
    /// `/dev/nvidiactlx`, `/dev/nvidia255`, relative paths, ...) gives `None`.
    pub fn from_dev_path(path: &str) -> Option<NodeKind> {
        let name = path.strip_prefix("/dev/")?;
        match name {
            "nvidiactl" => Some(NodeKind::Ctl),
            "nvidia-uvm" => Some(NodeKind::Uvm),
            "nvidia-uvm-tools" => Some(NodeKind::UvmTools),
            _ => {
                let digits = name.strip_prefix("nvidia")?;
                let minor = parse_decimal_u32(digits)?;
                (minor <= 254).then_some(NodeKind::Gpu(minor))
            }
        }
    }

    /// Basename of the device node: `nvidiactl`, `nvidia<N>`, `nvidia-uvm` or
    /// `nvidia-uvm-tools`.
    pub fn label(&self) -> String {
        match self {
            NodeKind::Ctl => "nvidiactl".to_string(),
            NodeKind::Gpu(n) => format!("nvidia{n}"),
            NodeKind::Uvm => "nvidia-uvm".to_string(),
            NodeKind::UvmTools => "nvidia-uvm-tools".to_string(),
        }
    }
}

/// One open file descriptor of a process that refers to an NVIDIA device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpenNvidiaFd {
    /// File descriptor number in the process.
    pub fd: u32,
    /// Which node the fd's link names.
    pub node: NodeKind,
    /// Whether `O_CLOEXEC` ([`O_CLOEXEC_FDINFO`]) is set on the `flags:` line of
    /// `fdinfo/<fd>`.
    pub cloexec: bool,
}

/// Open NVIDIA device fds of process `pid`, sorted by fd number.
///
/// Source: `readlink(<proc_root>/<pid>/fd/<fd>)`, matched with [`NodeKind::from_dev_path`]
/// after removing a `" (deleted)"` suffix (a node unlinked and re-created while open), and
/// the octal `flags:` line of `<proc_root>/<pid>/fdinfo/<fd>`. Reading another user's fds
/// needs ptrace access (root).
///
/// Errors: the `fd` directory cannot be listed (process gone, no permission), or an
/// NVIDIA fd's `fdinfo` exists but has no parsable `flags:` line. Fds closed while the
/// directory is walked are skipped.
pub fn nvidia_fds(proc_root: &Path, pid: u32) -> Result<Vec<OpenNvidiaFd>> {
    let proc_dir = proc_root.join(pid.to_string());
    let fd_dir = proc_dir.join("fd");
    let entries = fs::read_dir(&fd_dir).with_context(|| format!("listing {}", fd_dir.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) if is_gone(&err) => continue,
            Err(err) => return Err(err).with_context(|| format!("listing {}", fd_dir.display())),
        };
        let Some(fd) = entry.file_name().to_str().and_then(parse_decimal_u32) else {
            continue;
        };
        let target = match fs::read_link(entry.path()) {
            Ok(target) => target,
            Err(err) if is_gone(&err) => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("reading link {}", entry.path().display()))
            }
        };
        let Some(target) = target.to_str() else {
            continue;
        };
        let target = target.strip_suffix(" (deleted)").unwrap_or(target);
        let Some(node) = NodeKind::from_dev_path(target) else {
            continue;
        };

        let info_path = proc_dir.join("fdinfo").join(fd.to_string());
        let info = match fs::read_to_string(&info_path) {
            Ok(info) => info,
            Err(err) if is_gone(&err) => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("reading {}", info_path.display()))
            }
        };
        let flags = info
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .ok_or_else(|| anyhow!("no valid octal flags: line in {}", info_path.display()))?;
        out.push(OpenNvidiaFd {
            fd,
            node,
            cloexec: flags & O_CLOEXEC_FDINFO != 0,
        });
    }
    out.sort_unstable_by_key(|f| f.fd);
    Ok(out)
}

/// `ENOENT` or `ESRCH`: what procfs returns for a task or fd that went away.
fn is_gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(path: &Path, contents: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    #[test]
    fn node_kinds() {
        let good = [
            ("/dev/nvidiactl", NodeKind::Ctl, "nvidiactl"),
            ("/dev/nvidia0", NodeKind::Gpu(0), "nvidia0"),
            ("/dev/nvidia3", NodeKind::Gpu(3), "nvidia3"),
            ("/dev/nvidia254", NodeKind::Gpu(254), "nvidia254"),
            ("/dev/nvidia-uvm", NodeKind::Uvm, "nvidia-uvm"),
            (
                "/dev/nvidia-uvm-tools",
                NodeKind::UvmTools,
                "nvidia-uvm-tools",
            ),
        ];
        for (path, kind, label) in good {
            assert_eq!(NodeKind::from_dev_path(path), Some(kind), "{path}");
            assert_eq!(kind.label(), label);
        }
        for bad in [
            "/dev/nvidia-modeset",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/nvidia-nvswitch0",
            "/dev/nvidia-nvlink",
            "/dev/nvidiactlx",
            "/dev/nvidia",
            "/dev/nvidia255",
            "/dev/nvidia01",
            "/dev/nvidia+1",
            "/dev/nvidia-1",
            "/dev/nvidia 1",
            "/dev/nvidia-uvm-toolsx",
            "/dev/nvidia-uvm (deleted)",
            "dev/nvidia0",
            "nvidia0",
            "/dev//nvidia0",
            "/dev/dri/nvidia0",
            "/host/dev/nvidia0",
            "",
        ] {
            assert_eq!(NodeKind::from_dev_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn nvidia_fds_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("300");
        fs::create_dir_all(p.join("fd")).unwrap();
        fs::create_dir_all(p.join("fdinfo")).unwrap();
        let fds: [(u32, &str, Option<&str>); 8] = [
            (0, "/dev/pts/0", Some("02")),
            (3, "/dev/nvidiactl", Some("02100002")),
            (4, "/dev/nvidia0", Some("0100002")),
            (12, "/dev/nvidia-uvm", Some("02100002")),
            (13, "/dev/nvidia-uvm (deleted)", Some("0100002")),
            (14, "/dev/nvidia-uvm-tools", Some("02000002")),
            (15, "/dev/nvidia-modeset", Some("02")),
            // closed between readdir and fdinfo: skipped
            (16, "/dev/nvidia1", None),
        ];
        for (fd, target, flags) in fds {
            symlink(target, p.join("fd").join(fd.to_string())).unwrap();
            if let Some(flags) = flags {
                write(
                    &p.join("fdinfo").join(fd.to_string()),
                    format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t25\nino:\t1043\n").as_bytes(),
                );
            }
        }
        let got = nvidia_fds(dir.path(), 300).unwrap();
        let want = vec![
            OpenNvidiaFd {
                fd: 3,
                node: NodeKind::Ctl,
                cloexec: true,
            },
            OpenNvidiaFd {
                fd: 4,
                node: NodeKind::Gpu(0),
                cloexec: false,
            },
            OpenNvidiaFd {
                fd: 12,
                node: NodeKind::Uvm,
                cloexec: true,
            },
            OpenNvidiaFd {
                fd: 13,
                node: NodeKind::Uvm,
                cloexec: false,
            },
            OpenNvidiaFd {
                fd: 14,
                node: NodeKind::UvmTools,
                cloexec: true,
            },
        ];
        assert_eq!(got, want);

        // Malformed flags on an NVIDIA fd: error naming the file.
        write(&p.join("fdinfo/4"), b"pos:\t0\nflags:\tnine\n");
        let err = nvidia_fds(dir.path(), 300).unwrap_err();
        assert!(format!("{err:#}").contains("fdinfo"), "{err:#}");
        // Missing process: error.
        assert!(nvidia_fds(dir.path(), 301).is_err());
    }

    #[test]
    fn nvidia_fds_real_process() {
        // No NVIDIA node exists here; the reader must walk real fds and fdinfo cleanly.
        let _null = fs::File::open("/dev/null").unwrap();
        let got = nvidia_fds(Path::new("/proc"), std::process::id()).unwrap();
        assert!(got.is_empty(), "{got:?}");
    }
}

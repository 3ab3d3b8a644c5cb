//! What the observer finds when it starts, and each libcuda it attaches to later: the
//! libcuda files to probe (flags, the host's linker cache and driver directories, the maps
//! of running processes), NVIDIA fds opened before the agent started (from
//! `/proc/<pid>/fd`), and threads already blocked inside a driver call (from
//! `/proc/<pid>/task/<tid>/syscall`).

use std::{collections::HashMap, path::Path};

use uvmwatch_common::{node, InflightIoctl};

use super::{KernelSide, Observer};
use crate::{
    clock,
    decode::nvidia,
    event::{Event, Kind},
    host::{
        discovery::{self, LibTarget},
        procfs,
    },
};

impl<K: KernelSide> Observer<K> {
    /// Attaches the `cuInit` probes to a newly found libcuda file, found by an open at
    /// `opened_ns` (the kernel's clock) or, with `None`, now.
    pub(super) fn attach(&mut self, t: LibTarget, opened_ns: Option<u64>) {
        let found_ns = opened_ns.unwrap_or_else(clock::monotonic_ns);
        let r = self.kernel().attach_libcuda(&t.host_path, t.dev, t.ino);
        let kind = match r {
            Ok(()) => Kind::LibcudaAttached {
                path: t.path_in_ns.display().to_string(),
                host_path: t.host_path.display().to_string(),
                source: format!("{:?}", t.source),
                attach_seconds: clock::monotonic_ns().saturating_sub(found_ns) as f64 / 1e9,
            },
            Err(e) => {
                self.discovery.forget(t.dev, t.ino);
                Kind::LibcudaAttachFailed {
                    path: t.host_path.display().to_string(),
                    error: format!("{e:#}"),
                }
            }
        };
        self.dispatch(Event::agent(clock::monotonic_ns(), kind));
        self.probes_changed();
    }

    /// The libcuda files known at start: `--libcuda`, the host's, and (unless
    /// `--no-proc-scan`) those mapped by running processes.
    pub(super) fn discover_initial(&mut self) {
        for r in self.discovery.from_flags(&self.cfg.libcuda) {
            match r {
                Ok(t) => self.attach(t, None),
                Err(e) => self.dispatch(Event::agent(
                    clock::monotonic_ns(),
                    Kind::LibcudaFlagUnusable {
                        error: format!("{e:#}"),
                    },
                )),
            }
        }
        let host = self.discovery.from_host(
            &self.cfg.proc_root,
            Path::new("/etc/ld.so.cache"),
            discovery::DRIVER_DIRS,
        );
        for t in host {
            self.attach(t, None);
        }
        if self.cfg.proc_scan {
            for t in self.discovery.scan_all(&self.cfg.proc_root) {
                self.attach(t, None);
            }
        }
        if self.kernel().libcuda_targets() == 0 {
            self.dispatch(Event::agent(clock::monotonic_ns(), Kind::LibcudaNotFound));
        }
    }

    /// Processes holding NVIDIA fds opened before the agent started, from `/proc/<pid>/fd`:
    /// their ioctls are looked at from now on (their files identify them; a double's
    /// (device, inode) is handed over), and the threads blocked in a call on one of them are
    /// put in flight.
    pub(super) fn seed_fds(&mut self) {
        let pids = procfs::list_pids(&self.cfg.proc_root).unwrap_or_default();
        let me = std::process::id();
        let mut n = 0;
        for pid in pids {
            if pid == me {
                continue;
            }
            let Ok(fds) = procfs::nvidia_fds(&self.cfg.proc_root, pid) else {
                continue;
            };
            let mut kinds = HashMap::new();
            for f in fds {
                let (kind, minor) = match f.node {
                    procfs::NodeKind::Ctl => (node::CTL, 0),
                    procfs::NodeKind::Gpu(m) => (node::GPU, m as u8),
                    procfs::NodeKind::Uvm => (node::UVM, 0),
                    procfs::NodeKind::UvmTools => (node::UVM_TOOLS, 0),
                };
                kinds.insert(f.fd, (kind, minor));
                self.seed_dev_file(pid, f.fd, kind, minor);
            }
            if kinds.is_empty() {
                continue;
            }
            match self.kernel().seed_proc(pid) {
                Ok(()) => n += kinds.len(),
                Err(e) => tracing::debug!(error = %format!("{e:#}"), pid, "PROCS not seeded"),
            }
            self.seed_blocked_ioctls(pid, &kinds);
        }
        if n > 0 {
            self.dispatch(Event::agent(
                clock::monotonic_ns(),
                Kind::FdsLearned { count: n },
            ));
        }
    }

    /// An fd at a `/dev/nvidia*` name whose file is not a character device (a test double):
    /// its (device, inode), from `stat` of `/proc/<pid>/fd/<fd>`, go to the kernel so ioctls
    /// on it are identified. A character device needs nothing: its number identifies it.
    fn seed_dev_file(&mut self, pid: u32, fd: u32, kind: u8, minor: u8) {
        use std::os::unix::fs::MetadataExt;
        let p = self
            .cfg
            .proc_root
            .join(pid.to_string())
            .join("fd")
            .join(fd.to_string());
        let Ok(m) = std::fs::metadata(&p) else {
            return;
        };
        if m.mode() & libc::S_IFMT == libc::S_IFCHR {
            return;
        }
        if let Err(e) = self.kernel().seed_dev_file(m.dev(), m.ino(), kind, minor) {
            tracing::debug!(error = %format!("{e:#}"), path = %p.display(), "DEVFILES not seeded");
        }
    }

    /// Threads of `pid` already blocked in an ioctl on one of its NVIDIA fds when the agent
    /// starts: their entry was never seen, so they are put in the kernel's in-flight map with
    /// the agent's start as their start. The stall scan then reports them (their age is a
    /// lower bound) and the exit probe ends them.
    fn seed_blocked_ioctls(&mut self, pid: u32, fds: &HashMap<u32, (u8, u8)>) {
        let now = clock::monotonic_ns();
        for tid in procfs::list_threads(&self.cfg.proc_root, pid).unwrap_or_default() {
            let Some((nr, args)) = procfs::syscall_of(&self.cfg.proc_root, pid, tid) else {
                continue;
            };
            if nr != libc::SYS_ioctl {
                continue;
            }
            let fd = args[0] as u32;
            let Some(&(kind, minor)) = fds.get(&fd) else {
                continue;
            };
            let e = InflightIoctl {
                start_ns: now,
                arg: args[2],
                tgid: pid,
                fd,
                cmd: args[1] as u32,
                node: kind,
                minor,
                in_cuinit: 0,
                _pad: 0,
            };
            if self.kernel().seed_inflight_ioctl(tid, e).is_ok() {
                let ev = Event {
                    ts_ns: now,
                    process: Some(self.identities.get(pid, "")),
                    tid,
                    comm: String::new(),
                    kind: Kind::InFlightAtStart {
                        ioctl: nvidia::ioctl_display(kind, args[1] as u32),
                        node: nvidia::node_path(kind, minor),
                    },
                };
                self.dispatch(ev);
            }
        }
    }
}

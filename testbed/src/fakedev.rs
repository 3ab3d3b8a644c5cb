//! [`FakeDev`]: a running `uvmwatch-fakedev` FUSE server, mounted on a fresh temp dir.

use std::ffi::{CString, OsString};
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::artifacts::Artifacts;
use crate::procfs;
use crate::rules::{all_node_names, IoctlRule, OpenDenial};

/// File system type the server mounts with (as `/proc/self/mountinfo` shows it).
pub const FAKEDEV_FSTYPE: &str = "fuse.uvmwatch-fakedev";

/// How long [`FakeDev::start`] waits for the server's `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`FakeDev`]'s drop waits for the server to exit after `SIGTERM`.
const STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// What the fake device nodes look like and how they behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDevConfig {
    /// Number of GPU nodes, `nvidia0`..`nvidia{gpus-1}`.
    pub gpus: u32,
    /// Nodes to leave out (names without `/dev/`, e.g. `nvidia-uvm`): absent inside the
    /// workload's `/dev`, so opening them fails with `ENOENT`.
    pub omit: Vec<String>,
    /// Nodes whose `open` fails with the given errno (e.g. `nvidia-uvm` with `EPERM`).
    pub deny: Vec<OpenDenial>,
    /// Ioctl rules; commands without one succeed.
    pub ioctl_rules: Vec<IoctlRule>,
    /// End each ioctl line of [`FakeDev::log`] with ` params=<hex>`, the params bytes the
    /// server received (`--dump-params`).
    pub dump_params: bool,
}

impl Default for FakeDevConfig {
    /// One GPU, every node present, everything succeeds.
    fn default() -> Self {
        FakeDevConfig {
            gpus: 1,
            omit: Vec::new(),
            deny: Vec::new(),
            ioctl_rules: Vec::new(),
            dump_params: false,
        }
    }
}

impl FakeDevConfig {
    /// The server's command-line arguments after the mount point (always with `--verbose`,
    /// so that [`FakeDev::log`] shows every call).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--gpus".into(), self.gpus.to_string().into()];
        for name in &self.omit {
            args.push("--omit".into());
            args.push(name.into());
        }
        for deny in &self.deny {
            args.push("--deny".into());
            args.push(deny.to_string().into());
        }
        for rule in &self.ioctl_rules {
            args.push("--ioctl".into());
            args.push(rule.to_string().into());
        }
        args.push("--verbose".into());
        if self.dump_params {
            args.push("--dump-params".into());
        }
        args
    }

    /// Names of the nodes the server serves (all of them less `omit`).
    pub fn node_names(&self) -> Vec<String> {
        all_node_names(self.gpus)
            .into_iter()
            .filter(|n| !self.omit.contains(n))
            .collect()
    }
}

/// A running `uvmwatch-fakedev`, mounted on a fresh temporary directory.
///
/// Dropping it stops the server (`SIGTERM`, then `SIGKILL` after 3 s) and lazily unmounts
/// the directory if the server could not, so no mount is left behind even when a test
/// panics. The server also gets `SIGTERM` if the thread that started it dies
/// (`PR_SET_PDEATHSIG`). Stopping it fails every request still pending (the caller's
/// syscall returns `ENOTCONN`).
#[derive(Debug)]
pub struct FakeDev {
    child: Child,
    dir: tempfile::TempDir,
    mountpoint: PathBuf,
    log_path: PathBuf,
    config: FakeDevConfig,
    workloads: AtomicU32,
}

impl FakeDev {
    /// Starts the server from `artifacts.fakedev`, mounts it on a new temp dir and waits (up
    /// to 10 s) until it prints `ready`. The server's stderr goes to a log file
    /// ([`FakeDev::log`]).
    ///
    /// # Errors
    /// The binary cannot be started, rejects the configuration, or does not become ready in
    /// time (the error includes its log).
    pub fn start(artifacts: &Artifacts, config: FakeDevConfig) -> Result<FakeDev> {
        let dir = tempfile::Builder::new()
            .prefix("uvmwatch-fakedev-")
            .tempdir()
            .context("create temp dir")?;
        let mountpoint = dir.path().join("mnt");
        fs::create_dir(&mountpoint)?;
        let log_path = dir.path().join("fakedev.log");
        let log = File::create(&log_path)?;

        let mut cmd = Command::new(&artifacts.fakedev);
        cmd.arg(&mountpoint)
            .args(config.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("start {}", artifacts.fakedev.display()))?;

        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });

        let mut dev = FakeDev {
            child,
            dir,
            mountpoint,
            log_path,
            config,
            workloads: AtomicU32::new(0),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.trim() == "ready" => return Ok(dev),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = dev.child.wait().ok();
                    bail!(
                        "uvmwatch-fakedev exited before ready ({status:?}):\n{}",
                        dev.log()
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let log = dev.log();
                    dev.shutdown();
                    bail!("uvmwatch-fakedev not ready within {READY_TIMEOUT:?}:\n{log}");
                }
            }
        }
    }

    /// The directory the nodes are mounted in (host side), e.g. `<tmp>/mnt/nvidiactl`.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &FakeDevConfig {
        &self.config
    }

    /// Names of the nodes served (without `/dev/`).
    pub fn node_names(&self) -> Vec<String> {
        self.config.node_names()
    }

    /// Process id of the server.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's stderr so far: one line per open, ioctl, interrupt and release, e.g.
    /// `uvmwatch-fakedev: ioctl node=nvidia-uvm cmd=0x25 in=0 out=0 pid=1234: hang`.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Answers every held (`hang` or `delay`) ioctl with success, by sending `SIGUSR1`. The
    /// server handles it asynchronously: wait for the caller, not for this call.
    ///
    /// # Errors
    /// The server is no longer running.
    pub fn release(&self) -> Result<()> {
        // SAFETY: sending a signal to our own child, which has not been reaped.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGUSR1) } != 0 {
            return Err(std::io::Error::last_os_error()).context("signal uvmwatch-fakedev");
        }
        Ok(())
    }

    /// A fresh directory for one workload's private files, inside this server's temp dir.
    pub(crate) fn new_work_dir(&self) -> Result<PathBuf> {
        let n = self.workloads.fetch_add(1, Ordering::Relaxed);
        let dir = self.dir.path().join(format!("work-{n}"));
        fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(dir)
    }

    /// Stops the server and makes sure nothing stays mounted. Same as dropping it, but
    /// reports a mount that could not be removed.
    ///
    /// # Errors
    /// The mount point is still mounted afterwards.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown();
        if procfs::is_mount_point(&self.mountpoint).unwrap_or(false) {
            bail!("{} is still mounted", self.mountpoint.display());
        }
        Ok(())
    }

    fn shutdown(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while let Ok(None) = self.child.try_wait() {
                if Instant::now() >= deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if procfs::is_mount_point(&self.mountpoint).unwrap_or(true) {
            if let Ok(path) = CString::new(self.mountpoint.as_os_str().as_bytes()) {
                // SAFETY: valid NUL-terminated path.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

impl Drop for FakeDev {
    fn drop(&mut self) {
        self.shutdown();
    }
}

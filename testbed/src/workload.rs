//! Running `cuda-workload` in a private mount namespace whose `/dev` holds the fake nodes.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::artifacts::Artifacts;
use crate::fakedev::FakeDev;
use crate::replay::{parse_trace, Call, ReplayRun};

/// Where [`LibLocation::PrivateNamespace`] puts `libcuda.so.1` inside the namespace: the
/// directory NVIDIA's container tooling and GKE use. It must not exist on the host; inside
/// the namespace `/usr/local` is replaced by a tmpfs to create it.
pub const PRIVATE_LIB_DIR: &str = "/usr/local/nvidia/lib64";

/// A behaviour of the fake `libcuda.so.1` (`UVMWATCH_FAKE_SCENARIO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scenario {
    /// The whole sequence succeeds; `cuInit` returns 0.
    #[default]
    Success,
    /// `UVM_REGISTER_GPU` reports `rmStatus` `NV_ERR_NO_MEMORY` (0x51); `cuInit` returns 3
    /// right after it.
    RegisterGpuNoMemory,
    /// Same calls as `Success`; pair it with an `0x25=hang` rule on the [`FakeDev`].
    HangRegisterGpu,
    /// Same calls as `Success`; pair it with an omitted node. A failed open returns 999.
    MissingNode,
}

impl Scenario {
    /// The value of `UVMWATCH_FAKE_SCENARIO`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Success => "success",
            Scenario::RegisterGpuNoMemory => "register_gpu_no_memory",
            Scenario::HangRegisterGpu => "hang_register_gpu",
            Scenario::MissingNode => "missing_node",
        }
    }
}

/// Where the workload loads `libcuda.so.1` from (always passed with `--lib`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibLocation {
    /// Copied to this host path (parent directories are created; the caller removes what it
    /// asked for). The copy replaces a file already there by rename, so a process still
    /// mapping the old one is not disturbed.
    HostPath(PathBuf),
    /// Copied to `/usr/local/nvidia/lib64/libcuda.so.1` ([`PRIVATE_LIB_DIR`]), which exists
    /// only inside the workload's mount namespace (like a library in a container image):
    /// a new file for every workload, so an agent sees its first `cuInit` late.
    PrivateNamespace,
    /// Used where it is, as the host's installed driver library is: put there before with
    /// [`install_libcuda`], so an agent started after that probes it from the start.
    Installed(PathBuf),
}

/// Installs the fake library at `path` (a host's driver library, there before any agent or
/// workload starts; see [`LibLocation::Installed`]).
pub fn install_libcuda(artifacts: &Artifacts, path: &Path) -> Result<()> {
    copy_replacing(&artifacts.libcuda, path)
}

/// How to run one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadConfig {
    /// Behaviour of the fake library.
    pub scenario: Scenario,
    /// GPUs the library expects (`UVMWATCH_FAKE_GPUS`): normally the [`FakeDev`]'s count;
    /// more than the nodes served makes an open fail (999).
    pub gpus: u32,
    /// Milliseconds between loading the library and calling `cuInit` (`--wait-ms`); 0, as a
    /// real program does, unless a test needs the process held between the two.
    pub wait_ms: u64,
    /// Where the library lives.
    pub lib_location: LibLocation,
    /// After its own `cuInit`, fork (no exec) and call `cuInit` again in the child, which
    /// gets 3 (`--fork-child`).
    pub fork_child: bool,
    /// More environment variables for the workload (e.g. `UVMWATCH_FAKE_UVM_FLAGS`).
    pub extra_env: Vec<(String, String)>,
}

impl Default for WorkloadConfig {
    /// `Success`, one GPU, no wait, private-namespace library, no fork.
    fn default() -> Self {
        WorkloadConfig {
            scenario: Scenario::Success,
            gpus: 1,
            wait_ms: 0,
            lib_location: LibLocation::PrivateNamespace,
            fork_child: false,
            extra_env: Vec::new(),
        }
    }
}

/// The namespace set-up, run by `sh` inside `unshare --mount --propagation private`. It
/// ends by exec-ing the workload, so the child's pid is the workload's pid.
const NAMESPACE_SCRIPT: &str = r#"set -eu
fuse=$UVMWATCH_TB_FUSE work=$UVMWATCH_TB_WORK nodes=$UVMWATCH_TB_NODES private_lib=$UVMWATCH_TB_PRIVATE_LIB
unset UVMWATCH_TB_FUSE UVMWATCH_TB_WORK UVMWATCH_TB_NODES UVMWATCH_TB_PRIVATE_LIB
mount --bind /dev "$work/hostdev"
mount -t tmpfs -o mode=0755,size=1m,nosuid uvmwatch-dev /dev
if [ -n "$(ls -A /dev)" ]; then
    echo "uvmwatch-testbed: /dev is not a fresh tmpfs, refusing to touch it" >&2
    exit 97
fi
for n in null zero full random urandom tty; do
    [ -e "$work/hostdev/$n" ] || continue
    : > "/dev/$n"
    mount --bind "$work/hostdev/$n" "/dev/$n"
done
mkdir /dev/shm /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev uvmwatch-shm /dev/shm
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
for n in $nodes; do
    # Create the mount point under another name and rename it: opening /dev/<node> itself
    # would show up as a device open to a tracer watching openat.
    : > "/dev/.placeholder-$n"
    mv "/dev/.placeholder-$n" "/dev/$n"
    mount --bind "$fuse/$n" "/dev/$n"
done
umount -l "$work/hostdev"
if [ -n "$private_lib" ]; then
    mount -t tmpfs -o mode=0755,size=16m uvmwatch-lib /usr/local
    mkdir -p "$(dirname "$private_lib")"
    cp "$work/libcuda.so.1" "$private_lib"
fi
exec "$@"
"#;

/// Starts `cuda-workload` for `dev` in a private mount namespace and returns its process
/// (stdout piped: one `cuInit=<rc> pid=<pid>` line per call; stderr inherited).
///
/// Inside the namespace `/dev` is a tmpfs holding `null`, `zero`, `full`, `random`,
/// `urandom`, `tty` (bound from the real `/dev`), `shm`, `fd` links and the fake nodes at
/// their real paths (`/dev/nvidiactl`, `/dev/nvidia0`, ..., omitted ones absent). The host's
/// `/dev` is not changed. The returned child's pid is the workload's pid.
///
/// # Errors
/// `unshare` cannot be started, the library cannot be copied, or
/// [`PRIVATE_LIB_DIR`] exists on the host (the test would then prove nothing).
pub fn spawn_workload(
    dev: &FakeDev,
    artifacts: &Artifacts,
    config: WorkloadConfig,
) -> Result<Child> {
    spawn_workload_with_args(dev, artifacts, config, &[])
}

/// Like [`spawn_workload`], with more `cuda-workload` arguments appended, e.g.
/// `["--repeat", "2"]` (later calls return the cached result without any syscall) or
/// `["--flags", "1"]` (`cuInit` then returns 1, INVALID_VALUE).
///
/// # Errors
/// As [`spawn_workload`].
pub fn spawn_workload_with_args(
    dev: &FakeDev,
    artifacts: &Artifacts,
    config: WorkloadConfig,
    extra_args: &[&str],
) -> Result<Child> {
    let work = dev.new_work_dir()?;
    spawn_in(dev, artifacts, config, extra_args, &work, &[])
}

/// Files of a replay run inside the workload's work directory.
const REPLAY_STEPS_FILE: &str = "replay.steps";
const REPLAY_TRACE_FILE: &str = "replay.trace";

/// Like [`spawn_workload`], with the fake library replaying `run` instead of its own
/// sequence. Returns the process and the trace file it writes (see
/// [`crate::replay::parse_trace`]).
///
/// # Errors
/// As [`spawn_workload`]; also when `config.scenario` needs a status the run cannot plant
/// (`RegisterGpuNoMemory` without a status offset for `UVM_REGISTER_GPU`).
pub fn spawn_workload_replay(
    dev: &FakeDev,
    artifacts: &Artifacts,
    config: WorkloadConfig,
    run: &ReplayRun,
    extra_args: &[&str],
) -> Result<(Child, PathBuf)> {
    if !run.supports(config.scenario) {
        bail!(
            "replay {}: scenario {} needs a status offset for UVM_REGISTER_GPU in the layout table",
            run.replay().name,
            config.scenario.as_str()
        );
    }
    let work = dev.new_work_dir()?;
    let steps = work.join(REPLAY_STEPS_FILE);
    let trace = work.join(REPLAY_TRACE_FILE);
    fs::write(&steps, run.step_file(config.scenario))
        .with_context(|| format!("write {}", steps.display()))?;
    let env = [
        (REPLAY_ENV.to_string(), steps.to_string_lossy().into_owned()),
        (
            REPLAY_TRACE_ENV.to_string(),
            trace.to_string_lossy().into_owned(),
        ),
    ];
    let child = spawn_in(dev, artifacts, config, extra_args, &work, &env)?;
    Ok((child, trace))
}

/// Environment variable naming the step file the fake library replays.
pub const REPLAY_ENV: &str = "UVMWATCH_FAKE_REPLAY";
/// Environment variable naming the file the fake library writes its replay trace to.
pub const REPLAY_TRACE_ENV: &str = "UVMWATCH_FAKE_REPLAY_TRACE";

fn spawn_in(
    dev: &FakeDev,
    artifacts: &Artifacts,
    config: WorkloadConfig,
    extra_args: &[&str],
    work: &Path,
    env: &[(String, String)],
) -> Result<Child> {
    fs::create_dir(work.join("hostdev"))?;

    let (lib_arg, private_lib) = match &config.lib_location {
        LibLocation::HostPath(path) => {
            copy_replacing(&artifacts.libcuda, path)?;
            (path.clone(), String::new())
        }
        LibLocation::Installed(path) => {
            if !path.is_file() {
                bail!("{} is not installed (install_libcuda)", path.display());
            }
            (path.clone(), String::new())
        }
        LibLocation::PrivateNamespace => {
            let lib = Path::new(PRIVATE_LIB_DIR).join("libcuda.so.1");
            if Path::new(PRIVATE_LIB_DIR).exists() {
                bail!(
                    "{PRIVATE_LIB_DIR} exists on the host; a private library would not be private"
                );
            }
            fs::copy(&artifacts.libcuda, work.join("libcuda.so.1"))
                .context("stage libcuda.so.1")?;
            (lib.clone(), lib.to_string_lossy().into_owned())
        }
    };

    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(NAMESPACE_SCRIPT)
        .arg("uvmwatch-testbed-ns")
        .arg(&artifacts.workload)
        .arg("--lib")
        .arg(&lib_arg)
        .args(["--wait-ms", &config.wait_ms.to_string()]);
    if config.fork_child {
        cmd.arg("--fork-child");
    }
    cmd.args(extra_args);
    cmd.env("UVMWATCH_TB_FUSE", dev.mountpoint())
        .env("UVMWATCH_TB_WORK", work)
        .env("UVMWATCH_TB_NODES", dev.node_names().join(" "))
        .env("UVMWATCH_TB_PRIVATE_LIB", private_lib)
        .env("UVMWATCH_FAKE_SCENARIO", config.scenario.as_str())
        .env("UVMWATCH_FAKE_GPUS", config.gpus.to_string())
        .envs(config.extra_env.iter().map(|(k, v)| (k, v)))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn().context("start unshare (util-linux)")
}

/// Copies `from` to `to` through a temporary file and a rename.
fn copy_replacing(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    let mut tmp = to.as_os_str().to_owned();
    tmp.push(".uvmwatch-tmp");
    fs::copy(from, &tmp).with_context(|| format!("copy libcuda to {}", to.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("rename onto {}", to.display()))?;
    Ok(())
}

/// One `cuInit=<rc> pid=<pid>` line of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuInitLine {
    /// `CUresult` returned by `cuInit`.
    pub rc: i32,
    /// Process that called it.
    pub pid: u32,
}

/// Parses every `cuInit=<rc> pid=<pid>` line of `stdout`, in order; other lines are skipped.
pub fn parse_cuinit_lines(stdout: &str) -> Vec<CuInitLine> {
    stdout.lines().filter_map(parse_cuinit_line).collect()
}

fn parse_cuinit_line(line: &str) -> Option<CuInitLine> {
    let mut fields = line.split_whitespace();
    let rc = fields.next()?.strip_prefix("cuInit=")?.parse().ok()?;
    let pid = fields.next()?.strip_prefix("pid=")?.parse().ok()?;
    fields.next().is_none().then_some(CuInitLine { rc, pid })
}

/// One line of `--ctx CALL`: `cuDeviceGetCount=<rc> count=<n> pid=<pid>` or
/// `<CALL>=<rc> pid=<pid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextLine {
    /// The libcuda function called (`cuDeviceGetCount`, `cuCtxCreate_v2`, ...).
    pub call: String,
    /// `CUresult` it returned.
    pub rc: i32,
    /// The count a `cuDeviceGetCount` wrote (-1 when it wrote none).
    pub count: Option<i32>,
    /// Process that called it.
    pub pid: u32,
}

/// Parses the `--ctx` lines of `stdout` (calls whose name starts with `cu` other than
/// `cuInit`), in order; other lines are skipped.
pub fn parse_context_lines(stdout: &str) -> Vec<ContextLine> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (call, rc) = fields.next()?.split_once('=')?;
            if !call.starts_with("cu") || call == "cuInit" {
                return None;
            }
            let rc = rc.parse().ok()?;
            let mut next = fields.next()?;
            let count = match next.strip_prefix("count=") {
                Some(n) => {
                    next = fields.next()?;
                    Some(n.parse().ok()?)
                }
                None => None,
            };
            let pid = next.strip_prefix("pid=")?.parse().ok()?;
            fields.next().is_none().then(|| ContextLine {
                call: call.to_string(),
                rc,
                count,
                pid,
            })
        })
        .collect()
}

/// What a finished workload printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadOutput {
    /// Exit status: 0 when the parent's `cuInit` returned 0, 1 when not, 2 on a set-up error,
    /// 97 when the namespace script refused to run, or killed by a signal.
    pub status: ExitStatus,
    /// Everything printed on stdout.
    pub stdout: String,
}

impl WorkloadOutput {
    /// The `cuInit` lines of [`WorkloadOutput::stdout`].
    pub fn cuinit_lines(&self) -> Vec<CuInitLine> {
        parse_cuinit_lines(&self.stdout)
    }

    /// The `--ctx` lines of [`WorkloadOutput::stdout`].
    pub fn context_lines(&self) -> Vec<ContextLine> {
        parse_context_lines(&self.stdout)
    }
}

/// A running workload: [`spawn_workload`] plus a stdout reader, a wait with a timeout, and a
/// drop that kills the process if it still runs (so a failing test leaves nothing behind).
#[derive(Debug)]
pub struct Workload {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    trace: Option<PathBuf>,
}

impl Workload {
    /// Starts a workload; see [`spawn_workload`].
    ///
    /// # Errors
    /// As [`spawn_workload`].
    pub fn spawn(dev: &FakeDev, artifacts: &Artifacts, config: WorkloadConfig) -> Result<Self> {
        Self::spawn_with_args(dev, artifacts, config, &[])
    }

    /// Starts a workload with more arguments; see [`spawn_workload_with_args`].
    ///
    /// # Errors
    /// As [`spawn_workload`].
    pub fn spawn_with_args(
        dev: &FakeDev,
        artifacts: &Artifacts,
        config: WorkloadConfig,
        extra_args: &[&str],
    ) -> Result<Self> {
        let child = spawn_workload_with_args(dev, artifacts, config, extra_args)?;
        Ok(Self::from_child(child, None))
    }

    /// Starts a workload whose fake library replays `run` (see
    /// [`spawn_workload_replay`]); [`Workload::replay_calls`] then reads what it did.
    ///
    /// # Errors
    /// As [`spawn_workload_replay`].
    pub fn spawn_replay(
        dev: &FakeDev,
        artifacts: &Artifacts,
        config: WorkloadConfig,
        run: &ReplayRun,
    ) -> Result<Self> {
        let (child, trace) = spawn_workload_replay(dev, artifacts, config, run, &[])?;
        Ok(Self::from_child(child, Some(trace)))
    }

    /// The calls the fake library made while replaying, with node paths, and the
    /// `cuInit` result it wrote (`None` before `cuInit` returned), from its trace file.
    ///
    /// # Errors
    /// Not a replay workload, or the trace cannot be read or parsed.
    pub fn replay_calls(&self) -> Result<(Vec<Call>, Option<i32>)> {
        let Some(trace) = &self.trace else {
            bail!("workload {} is not a replay", self.pid());
        };
        let text = fs::read_to_string(trace).unwrap_or_default();
        parse_trace(&text).map_err(|e| anyhow::anyhow!("{}: {e}", trace.display()))
    }

    fn from_child(mut child: Child, trace: Option<PathBuf>) -> Self {
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Workload {
            child,
            lines,
            seen: Vec::new(),
            trace,
        }
    }

    /// The workload's process id (the one that calls `cuInit` first).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the next `cuInit` line, while the workload runs.
    ///
    /// # Errors
    /// No such line in time, or stdout closed first.
    pub fn next_cuinit_line(&mut self, timeout: Duration) -> Result<CuInitLine> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let parsed = parse_cuinit_line(&line);
                    self.seen.push(line);
                    if let Some(parsed) = parsed {
                        return Ok(parsed);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!(
                        "no cuInit line within {timeout:?} (so far: {:?})",
                        self.seen
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("workload stdout closed (so far: {:?})", self.seen)
                }
            }
        }
    }

    /// Waits up to `timeout` for the workload to exit and returns what it printed (including
    /// lines already returned by [`Workload::next_cuinit_line`]).
    ///
    /// # Errors
    /// It did not exit in time (it keeps running; dropping the `Workload` kills it).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<WorkloadOutput> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                bail!("workload {} still running after {timeout:?}", self.pid());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Output written before exit is in the pipe; a forked child still holding it open
        // (it should not) only delays this by up to a second.
        let drain_deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let left = drain_deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => break,
            }
        }
        let mut stdout = self.seen.join("\n");
        if !stdout.is_empty() {
            stdout.push('\n');
        }
        Ok(WorkloadOutput { status, stdout })
    }

    /// Sends `SIGKILL` to the workload (not waiting for it).
    ///
    /// # Errors
    /// The signal could not be sent (it was already reaped).
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill().context("kill workload")
    }

    /// Whether it has exited (without blocking).
    ///
    /// # Errors
    /// `waitpid` failed.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cuinit_lines() {
        let out =
            "noise\ncuInit=0 pid=12\ncuInit=3 pid=13\ncuInit=x pid=1\ncuInit=999 pid=14 extra\n";
        assert_eq!(
            parse_cuinit_lines(out),
            [CuInitLine { rc: 0, pid: 12 }, CuInitLine { rc: 3, pid: 13 }]
        );
        assert_eq!(
            parse_cuinit_line("cuInit=-1 pid=7"),
            Some(CuInitLine { rc: -1, pid: 7 })
        );
    }

    #[test]
    fn parses_context_lines() {
        let out = "cuInit=0 pid=12\ncuDeviceGetCount=0 count=2 pid=12\ncuCtxCreate_v2=46 pid=12\n\
                   cuDeviceGetCount=3 count=-1 pid=13\ncuCtxCreate=x pid=1\nflood=1 pid=2\n";
        let line = |call: &str, rc, count, pid| ContextLine {
            call: call.into(),
            rc,
            count,
            pid,
        };
        assert_eq!(
            parse_context_lines(out),
            [
                line("cuDeviceGetCount", 0, Some(2), 12),
                line("cuCtxCreate_v2", 46, None, 12),
                line("cuDeviceGetCount", 3, Some(-1), 13),
            ]
        );
    }

    #[test]
    fn the_workload_and_library_know_every_context_call() {
        for call in [
            "cuCtxCreate",
            "cuCtxCreate_v2",
            "cuCtxCreate_v3",
            "cuCtxCreate_v4",
            "cuDevicePrimaryCtxRetain",
            "cuDeviceGetCount",
        ] {
            assert!(
                crate::FAKE_LIBCUDA_C.contains(&format!("CUresult {call}(")),
                "{call}"
            );
            assert!(
                crate::CUDA_WORKLOAD_C.contains(&format!("\"{call}\"")),
                "{call}"
            );
        }
    }

    #[test]
    fn scenario_names_match_the_c_library() {
        for s in [
            Scenario::Success,
            Scenario::RegisterGpuNoMemory,
            Scenario::HangRegisterGpu,
            Scenario::MissingNode,
        ] {
            assert!(crate::FAKE_LIBCUDA_C.contains(&format!("\"{}\"", s.as_str())));
        }
    }
}

//! Readers for the parts of procfs the agent reports on: processes, threads, their
//! containers and their open NVIDIA device nodes.
//!
//! Every reader takes `proc_root` (normally `/proc`) so that it also runs on fixture trees
//! laid out like procfs. A missing or malformed file is an error carrying the file's path;
//! a process or thread that exits while it is being read gives an error, never a panic.
//! Field layouts follow the kernel's `Documentation/filesystems/proc.rst` and
//! `fs/proc/array.c`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// `O_CLOEXEC` as printed (octal) on the `flags:` line of `/proc/<pid>/fdinfo/<fd>`
/// (x86_64 and aarch64 value, `include/uapi/asm-generic/fcntl.h`).
pub const O_CLOEXEC_FDINFO: u32 = 0o2_000_000;

/// Lists the numeric entries (process ids, i.e. thread-group ids) of `proc_root`.
///
/// Returns the ids sorted ascending. Non-numeric entries (`self`, `sys`, ...) are skipped.
/// Errors: `proc_root` cannot be read as a directory. Entries that disappear while the
/// directory is read are skipped, as the kernel does not list them again.
pub fn list_pids(proc_root: &Path) -> Result<Vec<u32>> {
    let dir = fs::read_dir(proc_root)
        .with_context(|| format!("listing processes in {}", proc_root.display()))?;
    let mut pids = Vec::new();
    for entry in dir {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("listing {}", proc_root.display()))
            }
        };
        if let Some(pid) = entry.file_name().to_str().and_then(parse_decimal_u32) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// One thread of a process, as procfs shows it at the time of the read.
///
/// Source: `<proc_root>/<pid>/task/<tid>/{stat,wchan,stack}` for the per-thread fields and
/// `<proc_root>/<pid>/{exe,cmdline,cgroup}` for the per-process ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Process id (thread-group id, `Tgid`).
    pub pid: u32,
    /// Thread id (kernel task id; equals `pid` for the main thread).
    pub tid: u32,
    /// Thread name (`comm`, at most 15 bytes in the kernel; invalid UTF-8 replaced by U+FFFD).
    /// May contain spaces and parentheses.
    pub comm: String,
    /// One-letter scheduler state from field 3 of `stat` (`R`, `S`, `D`, `T`, `t`, `Z`, `X`,
    /// `I`, `P`, ...).
    pub state: char,
    /// Kernel name of [`Self::state`] (see [`state_name`]): `"running"`, `"sleeping"`,
    /// `"disk sleep"`, ...
    pub state_name: &'static str,
    /// Kernel function the thread sleeps in, from `task/<tid>/wchan`; `None` when the file
    /// reads `0` or empty (running, or not sleeping in a named place) or cannot be read.
    pub wchan: Option<String>,
    /// Target of the `exe` link, as the kernel prints it for the reader (may end in
    /// `" (deleted)"`); `None` for kernel threads, zombies or when unreadable.
    pub exe: Option<PathBuf>,
    /// Arguments from `cmdline`, split on NUL (invalid UTF-8 replaced by U+FFFD); empty for
    /// kernel threads and zombies.
    pub cmdline: Vec<String>,
    /// Container the process runs in, from `cgroup` (see [`container_id`]).
    pub container_id: Option<String>,
    /// Kernel stack of the thread, function names only (innermost first), from
    /// `task/<tid>/stack`; `None` when that file is absent or unreadable (it needs root and
    /// `CONFIG_STACKTRACE`).
    pub kernel_stack: Option<Vec<String>>,
}

/// Linux name of a one-letter task state, as `fs/proc/array.c` (`task_state_array`) prints
/// it on the `State:` line of `status`. Letters from older kernels (`x`, `K`, `W`) are
/// included; anything else gives `"unknown"`.
pub fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk sleep",
        'T' => "stopped",
        't' => "tracing stop",
        'X' | 'x' => "dead",
        'Z' => "zombie",
        'P' => "parked",
        'I' => "idle",
        'K' => "wakekill",
        'W' => "waking",
        _ => "unknown",
    }
}

/// Reads one thread of process `pid`.
///
/// Errors: `task/<tid>/stat` or `cmdline` cannot be read or parsed (the usual case: the
/// thread or process has exited), or the thread's directory is gone after the optional
/// fields were read. Optional fields (`wchan`, `exe`, `stack`, `cgroup`) that cannot be read
/// become `None`.
pub fn read_thread(proc_root: &Path, pid: u32, tid: u32) -> Result<ThreadInfo> {
    let proc_dir = proc_root.join(pid.to_string());
    let task_dir = proc_dir.join("task").join(tid.to_string());

    let stat_path = task_dir.join("stat");
    let stat = fs::read(&stat_path).with_context(|| {
        format!(
            "reading {} (thread {tid} of process {pid})",
            stat_path.display()
        )
    })?;
    let (comm, state) =
        parse_stat_comm_state(&stat).with_context(|| format!("parsing {}", stat_path.display()))?;

    let cmdline_path = proc_dir.join("cmdline");
    let cmdline =
        fs::read(&cmdline_path).with_context(|| format!("reading {}", cmdline_path.display()))?;
    let cmdline = split_cmdline(&cmdline);

    let wchan = read_optional(&task_dir.join("wchan")).and_then(|w| {
        let w = w.trim();
        (!w.is_empty() && w != "0").then(|| w.to_string())
    });
    let exe = fs::read_link(proc_dir.join("exe")).ok();
    let container_id = read_optional(&proc_dir.join("cgroup")).and_then(|c| container_id(&c));
    let kernel_stack = read_optional(&task_dir.join("stack")).map(|s| parse_kernel_stack(&s));

    // The optional reads above swallow errors; make sure they did not describe a thread
    // that exited half-way (procfs keeps no state once the task is reaped).
    if let Err(err) = fs::symlink_metadata(&task_dir) {
        return Err(err).with_context(|| {
            format!(
                "thread {tid} of process {pid} exited while being read ({})",
                task_dir.display()
            )
        });
    }

    Ok(ThreadInfo {
        pid,
        tid,
        comm,
        state,
        state_name: state_name(state),
        wchan,
        exe,
        cmdline,
        container_id,
        kernel_stack,
    })
}

/// Whether thread `tid` of process `tgid` still exists (`<proc_root>/<tgid>/task/<tid>`).
pub fn thread_alive(proc_root: &Path, tgid: u32, tid: u32) -> bool {
    proc_root
        .join(tgid.to_string())
        .join("task")
        .join(tid.to_string())
        .exists()
}

/// The process's id inside its innermost pid namespace (last entry of `NSpid:` in
/// `<proc_root>/<pid>/status`), or `None` when it lives in the init pid namespace.
///
/// Errors: the status file cannot be read (the process exited).
pub fn ns_pid(proc_root: &Path, pid: u32) -> Result<Option<u32>> {
    let p = proc_root.join(pid.to_string()).join("status");
    let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("NSpid:") {
            let ids: Vec<u32> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            return Ok(if ids.len() > 1 {
                ids.last().copied()
            } else {
                None
            });
        }
    }
    Ok(None)
}

/// Thread ids of process `pid` (`<proc_root>/<pid>/task`), sorted.
///
/// Errors: the directory cannot be read (the process exited).
pub fn list_threads(proc_root: &Path, pid: u32) -> Result<Vec<u32>> {
    let dir = proc_root.join(pid.to_string()).join("task");
    let mut out: Vec<u32> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The system call thread `tid` of `pid` is blocked in, from
/// `<proc_root>/<pid>/task/<tid>/syscall` (`nr arg0 .. arg5 sp pc`, arguments in hex):
/// `(nr, [arg0..arg5])`. `None` when running, not in a system call, or unreadable (needs
/// ptrace access to the process).
pub fn syscall_of(proc_root: &Path, pid: u32, tid: u32) -> Option<(i64, [u64; 6])> {
    let p = proc_root
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string())
        .join("syscall");
    parse_syscall(&fs::read_to_string(p).ok()?)
}

/// Parses the text of a `syscall` file (see [`syscall_of`]).
pub fn parse_syscall(text: &str) -> Option<(i64, [u64; 6])> {
    let mut it = text.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let mut args = [0u64; 6];
    for a in args.iter_mut() {
        let v = it.next()?;
        *a = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
    }
    Some((nr, args))
}

/// Thread-group id (process id) of thread `tid`, from the `Tgid:` line of
/// `<proc_root>/<tid>/status` (procfs resolves any thread id at the top level, though
/// only thread-group leaders are listed).
///
/// Errors: the file cannot be read (thread gone) or has no parsable `Tgid:` line.
pub fn tgid_of(proc_root: &Path, tid: u32) -> Result<u32> {
    let path = proc_root.join(tid.to_string()).join("status");
    let status =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|v| parse_decimal_u32(v.trim()))
        .ok_or_else(|| anyhow!("no valid Tgid: line in {}", path.display()))
}

/// Container id of a process from the contents of its `/proc/<pid>/cgroup` file.
///
/// Each line is `hierarchy-id:controllers:path` (cgroup v1 lines and the v2 `0::` line are
/// treated alike). Recognised, deepest path component winning (so docker-in-docker gives
/// the inner container), first matching line winning:
/// - a component that is exactly 64 lowercase hex digits: docker cgroupfs
///   (`/docker/<id>`), Kubernetes cgroupfs driver (`/kubepods/<qos>/pod<uid>/<id>`);
/// - `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
///   `libpod-<id>.scope` (systemd driver; the `.scope` suffix is optional). The
///   `crio-conmon-` / `libpod-conmon-` scopes hold the monitor, not the container, and do
///   not match;
/// - LXC/LXD: `/lxc/<name>`, `lxc.payload.<name>` or `lxc.payload/<name>`, returned as
///   `lxc:<name>` (`lxc.monitor.<name>` holds the monitor and does not match).
///
/// Returns the 64-hex id (or `lxc:<name>`), or `None` for host processes and processes in
/// a private cgroup namespace (whose paths read `/`).
pub fn container_id(cgroup_file_contents: &str) -> Option<String> {
    cgroup_file_contents.lines().find_map(|line| {
        // hierarchy-id ":" controllers ":" path — the path itself may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (_, _, path) = (parts.next()?, parts.next()?, parts.next()?);
        container_id_of_path(path)
    })
}

fn container_id_of_path(path: &str) -> Option<String> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for i in (0..comps.len()).rev() {
        let comp = comps[i];
        if is_hex64(comp) {
            return Some(comp.to_string());
        }
        let stem = comp.strip_suffix(".scope").unwrap_or(comp);
        for prefix in ["docker-", "cri-containerd-", "crio-", "libpod-"] {
            if let Some(id) = stem.strip_prefix(prefix) {
                if is_hex64(id) {
                    return Some(id.to_string());
                }
            }
        }
        if let Some(name) = comp.strip_prefix("lxc.payload.") {
            if !name.is_empty() {
                return Some(format!("lxc:{name}"));
            }
        }
        if i > 0 && (comps[i - 1] == "lxc" || comps[i - 1] == "lxc.payload") {
            return Some(format!("lxc:{comp}"));
        }
    }
    None
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Kind of NVIDIA character device an fd refers to (see the device-node table of
/// `shared/reference/nvidia-uvm.md`).
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

/// Decimal `u32` without sign, spaces or leading zeros (except `"0"` itself).
fn parse_decimal_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

fn read_optional(path: &Path) -> Option<String> {
    match fs::read(path) {
        Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        Err(err) => {
            tracing::trace!(path = %path.display(), %err, "optional procfs file unreadable");
            None
        }
    }
}

/// `pid (comm) S ...`: comm is everything between the first `(` and the last `)`, since
/// comm itself may hold parentheses and spaces while no later field does.
fn parse_stat_comm_state(stat: &[u8]) -> Result<(String, char)> {
    let open = stat
        .iter()
        .position(|&b| b == b'(')
        .ok_or_else(|| anyhow!("no '(' in stat"))?;
    let close = stat
        .iter()
        .rposition(|&b| b == b')')
        .ok_or_else(|| anyhow!("no ')' in stat"))?;
    if close < open {
        bail!("unbalanced parentheses in stat");
    }
    let comm = String::from_utf8_lossy(&stat[open + 1..close]).into_owned();
    let state = stat[close + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .map(|&b| b as char)
        .filter(|c| c.is_ascii_alphabetic())
        .ok_or_else(|| anyhow!("no state letter after comm in stat"))?;
    Ok((comm, state))
}

fn split_cmdline(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Lines like `[<0>] ep_poll+0x2ab/0x2f0` become `ep_poll`.
fn parse_kernel_stack(stack: &str) -> Vec<String> {
    stack
        .lines()
        .filter_map(|line| {
            let frame = match line.find("] ") {
                Some(i) => &line[i + 2..],
                None => line,
            };
            let frame = frame.trim();
            let sym = frame.split('+').next().unwrap_or(frame).trim();
            (!sym.is_empty()).then(|| sym.to_string())
        })
        .collect()
}

#[cfg(test)]
mod syscall_tests {
    use super::*;

    #[test]
    fn parses_blocked_and_running_threads() {
        let (nr, a) =
            parse_syscall("16 0x5 0x25 0x7ffc6a1b2c30 0x0 0x0 0x0 0x7ffc6a1b2c08 0x7f3e2a91b94b\n")
                .unwrap();
        assert_eq!((nr, a[0], a[1], a[2]), (16, 5, 0x25, 0x7ffc6a1b2c30));
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffc 0x7f3e\n"), None);
        assert_eq!(parse_syscall(""), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::mpsc;

    const ID: &str = "3f8c2a9d0e71b4c6a5d2e9f0817c3b4a6d5e2f1098a7b6c5d4e3f2a1b0c9d8e7";

    fn write(path: &Path, contents: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    /// A fixture process directory `<root>/<pid>` with one thread `tid`.
    fn fixture_thread(root: &Path, pid: u32, tid: u32, stat: &str) {
        let p = root.join(pid.to_string());
        let t = p.join("task").join(tid.to_string());
        write(&t.join("stat"), stat.as_bytes());
        write(&t.join("wchan"), b"futex_wait_queue");
        write(&t.join("stack"), b"[<0>] futex_wait_queue+0x5e/0x90\n[<0>] __futex_wait+0x15e/0x1d0\n[<0>] do_syscall_64+0x82/0x190\n[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n");
        write(&p.join("cmdline"), b"python3\0train.py\0--epochs\0\0x\0");
        write(
            &p.join("cgroup"),
            format!("0::/system.slice/docker-{ID}.scope\n").as_bytes(),
        );
        symlink("/usr/bin/python3.11", p.join("exe")).unwrap();
        write(
            &p.join("status"),
            format!("Name:\tx\nTgid:\t{pid}\nPid:\t{tid}\n").as_bytes(),
        );
    }

    #[test]
    fn list_pids_fixture_and_real() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["1", "42", "self", "sys", "007", "4294967296", "17"] {
            fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(list_pids(dir.path()).unwrap(), vec![1, 17, 42]);
        assert!(list_pids(&dir.path().join("missing")).is_err());

        let real = list_pids(Path::new("/proc")).unwrap();
        assert!(real.contains(&std::process::id()));
        assert!(real.contains(&1));
    }

    #[test]
    fn read_thread_fixture_odd_comm() {
        let dir = tempfile::tempdir().unwrap();
        fixture_thread(
            dir.path(),
            100,
            103,
            "103 (a) (b) c ) D 1 100 100 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0\n",
        );
        let t = read_thread(dir.path(), 100, 103).unwrap();
        assert_eq!(t.pid, 100);
        assert_eq!(t.tid, 103);
        assert_eq!(t.comm, "a) (b) c ");
        assert_eq!(t.state, 'D');
        assert_eq!(t.state_name, "disk sleep");
        assert_eq!(t.wchan.as_deref(), Some("futex_wait_queue"));
        assert_eq!(t.exe, Some(PathBuf::from("/usr/bin/python3.11")));
        assert_eq!(t.cmdline, vec!["python3", "train.py", "--epochs", "", "x"]);
        assert_eq!(t.container_id.as_deref(), Some(ID));
        assert_eq!(
            t.kernel_stack.unwrap(),
            vec![
                "futex_wait_queue",
                "__futex_wait",
                "do_syscall_64",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
    }

    #[test]
    fn read_thread_fixture_minimal_and_broken() {
        let dir = tempfile::tempdir().unwrap();
        // Kernel-thread-like: empty cmdline, no exe, wchan "0", no stack, no cgroup.
        let t = dir.path().join("2/task/2");
        write(&t.join("stat"), b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0\n");
        write(&t.join("wchan"), b"0");
        write(&dir.path().join("2/cmdline"), b"");
        let info = read_thread(dir.path(), 2, 2).unwrap();
        assert_eq!(info.comm, "kthreadd");
        assert_eq!(info.state_name, "sleeping");
        assert_eq!(info.wchan, None);
        assert_eq!(info.exe, None);
        assert!(info.cmdline.is_empty());
        assert_eq!(info.container_id, None);
        assert_eq!(info.kernel_stack, None);

        // Missing thread, missing cmdline, malformed stat: errors, no panic.
        assert!(read_thread(dir.path(), 2, 3).is_err());
        let t = dir.path().join("5/task/5");
        write(&t.join("stat"), b"5 (x) S 1\n");
        let err = read_thread(dir.path(), 5, 5).unwrap_err();
        assert!(format!("{err:#}").contains("cmdline"), "{err:#}");
        write(&dir.path().join("5/cmdline"), b"x\0");
        for bad in [&b""[..], b"5 x S", b"5 (x)", b"5 (x) 9", b"5 )x( S"] {
            write(&t.join("stat"), bad);
            assert!(read_thread(dir.path(), 5, 5).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn state_names() {
        let expected = [
            ('R', "running"),
            ('S', "sleeping"),
            ('D', "disk sleep"),
            ('T', "stopped"),
            ('t', "tracing stop"),
            ('Z', "zombie"),
            ('X', "dead"),
            ('I', "idle"),
            ('P', "parked"),
            ('?', "unknown"),
        ];
        for (c, name) in expected {
            assert_eq!(state_name(c), name);
        }
    }

    #[test]
    fn read_thread_real_named_thread() {
        let (tid_tx, tid_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("uvm) w (x".into())
            .spawn(move || {
                tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = tid_rx.recv().unwrap();
        let pid = std::process::id();
        // Give the thread time to block in recv.
        let mut info = read_thread(Path::new("/proc"), pid, tid).unwrap();
        for _ in 0..100 {
            if info.state == 'S' {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            info = read_thread(Path::new("/proc"), pid, tid).unwrap();
        }
        assert_eq!(info.comm, "uvm) w (x");
        assert_eq!(info.state, 'S');
        assert_eq!(info.state_name, "sleeping");
        assert_eq!(info.exe, Some(fs::read_link("/proc/self/exe").unwrap()));
        assert_eq!(info.cmdline, std::env::args().collect::<Vec<_>>());
        assert_eq!(tgid_of(Path::new("/proc"), tid).unwrap(), pid);
        assert_eq!(tgid_of(Path::new("/proc"), pid).unwrap(), pid);
        // As root with CONFIG_STACKTRACE the stack names a futex wait.
        if let Some(stack) = &info.kernel_stack {
            assert!(
                stack
                    .iter()
                    .all(|s| !s.contains('+') && !s.starts_with('[')),
                "{stack:?}"
            );
        }
        stop_tx.send(()).unwrap();
        handle.join().unwrap();
        // The thread is gone now: an error, not a panic.
        assert!(read_thread(Path::new("/proc"), pid, tid).is_err());
    }

    #[test]
    fn read_thread_real_exited_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Right after fork the child may not have exec'd yet: wait for its new image.
        let mut info = read_thread(Path::new("/proc"), pid, pid).unwrap();
        for _ in 0..200 {
            if info.cmdline.len() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            info = read_thread(Path::new("/proc"), pid, pid).unwrap();
        }
        assert_eq!(info.comm, "sleep");
        assert_eq!(info.cmdline, vec!["sleep", "30"]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(read_thread(Path::new("/proc"), pid, pid).is_err());
        assert!(tgid_of(Path::new("/proc"), pid).is_err());
        assert!(nvidia_fds(Path::new("/proc"), pid).is_err());
    }

    #[test]
    fn tgid_of_fixture() {
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join("7/status"),
            b"Name:\tx\nUmask:\t0022\nTgid:\t5\nNgid:\t0\n",
        );
        assert_eq!(tgid_of(dir.path(), 7).unwrap(), 5);
        write(&dir.path().join("8/status"), b"Name:\tx\nTgid:\tfive\n");
        assert!(tgid_of(dir.path(), 8).is_err());
        write(&dir.path().join("9/status"), b"Name:\tx\n");
        assert!(tgid_of(dir.path(), 9).is_err());
        assert!(tgid_of(dir.path(), 10).is_err());
    }

    #[test]
    fn container_ids() {
        let pod = "pod0f3c3c51-5b0e-4a4e-9d7e-2b0d9d7c1a11";
        let cases: Vec<(String, Option<String>)> = vec![
            // docker, cgroup v1 cgroupfs driver
            (
                format!("12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n0::/\n"),
                Some(ID.into()),
            ),
            // docker, cgroup v2 systemd driver
            (format!("0::/system.slice/docker-{ID}.scope\n"), Some(ID.into())),
            // docker, v1 hybrid name=systemd line first
            (
                format!("1:name=systemd:/system.slice/docker-{ID}.scope\n0::/system.slice/docker-{ID}.scope\n"),
                Some(ID.into()),
            ),
            // containerd CRI, systemd driver, v2
            (
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-{}.slice/cri-containerd-{ID}.scope\n", pod.replace('-', "_")),
                Some(ID.into()),
            ),
            // Kubernetes cgroupfs driver, v1 (containerd or docker)
            (
                format!("4:memory:/kubepods/burstable/{pod}/{ID}\n3:cpuset:/kubepods/burstable/{pod}/{ID}\n"),
                Some(ID.into()),
            ),
            // cri-o, systemd driver
            (
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-{}.slice/crio-{ID}.scope\n", pod.replace('-', "_")),
                Some(ID.into()),
            ),
            // cri-o monitor is not the container
            (format!("0::/system.slice/crio-conmon-{ID}.scope\n"), None),
            // podman rootful, v2, with crun's inner "container" cgroup
            (format!("0::/machine.slice/libpod-{ID}.scope/container\n"), Some(ID.into())),
            // podman rootless
            (
                format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"),
                Some(ID.into()),
            ),
            (format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"), None),
            // docker in docker: the innermost wins
            (
                format!("0::/docker/{}/docker/{ID}\n", "a".repeat(64)),
                Some(ID.into()),
            ),
            // LXC v1, LXC 4+/LXD v2, LXC 3 v2
            ("10:devices:/lxc/gpu-box\n".into(), Some("lxc:gpu-box".into())),
            ("0::/lxc.payload.trainer/system.slice/cron.service\n".into(), Some("lxc:trainer".into())),
            ("0::/lxc.payload/trainer\n".into(), Some("lxc:trainer".into())),
            ("0::/lxc.monitor.trainer\n".into(), None),
            // host and private-namespace processes
            ("0::/user.slice/user-0.slice/session-3.scope\n".into(), None),
            ("0::/\n".into(), None),
            ("4:memory:/process_api/c611f00ce5b6fbd1459612c23601358b\n0::/\n".into(), None),
            // upper-case or short ids are not container ids
            (format!("0::/docker/{}\n", ID.to_uppercase()), None),
            (format!("0::/docker/{}\n", &ID[..63]), None),
            (String::new(), None),
            ("garbage without colons\n".into(), None),
        ];
        for (contents, expected) in cases {
            assert_eq!(container_id(&contents), expected, "{contents}");
        }
        // The real file parses (whatever this machine is).
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let _ = container_id(&own);
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

    #[test]
    fn kernel_stack_lines() {
        let s = "[<0>] ep_poll+0x2ab/0x2f0\n[<0>] 0xffffffffc0a01234\nbare_sym+0x1/0x2\n\n";
        assert_eq!(
            parse_kernel_stack(s),
            vec!["ep_poll", "0xffffffffc0a01234", "bare_sym"]
        );
    }
}

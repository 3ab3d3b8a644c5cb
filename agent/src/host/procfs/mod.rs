//! Readers for the parts of procfs the agent reports on: processes and threads (here),
//! their containers and pods ([`cgroup`]), their open NVIDIA device nodes
//! ([`nvidia_fds`]) and the files they have mapped ([`maps`]); the character majors of the
//! NVIDIA modules ([`devices`]).
//!
//! Every reader takes `proc_root` (normally `/proc`) so that it also runs on fixture trees
//! laid out like procfs. A missing or malformed file is an error carrying the file's path;
//! a process or thread that exits while it is being read gives an error, never a panic.
//! Field layouts follow the kernel's `Documentation/filesystems/proc.rst` and
//! `fs/proc/array.c`.

pub mod cgroup;
pub mod devices;
mod fds;
pub mod maps;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

pub use cgroup::container_id;
pub use fds::{nvidia_fds, NodeKind, OpenNvidiaFd, O_CLOEXEC_FDINFO};

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

    // The thread's own view of the process (`task/<tid>/`): the process's directory shows
    // its main thread's, which has no `exe` nor `cmdline` once that thread has exited while
    // others run on.
    // (Each read falls back to the process's directory.)
    let in_task_else_process = |name: &str| [task_dir.join(name), proc_dir.join(name)];
    let [task_cmdline, cmdline_path] = in_task_else_process("cmdline");
    let cmdline = read_first(&task_cmdline)
        .or_else(|_| read_first(&cmdline_path))
        .with_context(|| format!("reading {}", cmdline_path.display()))?;
    let cmdline = split_nul(&cmdline);

    let wchan = read_optional(&task_dir.join("wchan")).and_then(|w| {
        let w = w.trim();
        (!w.is_empty() && w != "0").then(|| w.to_string())
    });
    let exe = in_task_else_process("exe")
        .iter()
        .find_map(|p| fs::read_link(p).ok());
    let container_id = in_task_else_process("cgroup")
        .iter()
        .find_map(|p| read_optional(p))
        .and_then(|c| container_id(&c));
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

/// Decimal `u32` without sign, spaces or leading zeros (except `"0"` itself).
pub(super) fn parse_decimal_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

/// Most of one per-thread procfs file kept (`cmdline`, `wchan`, `stack`, `cgroup`): their
/// start is what is reported, and a `cmdline` can be as long as `ARG_MAX` allows.
const THREAD_FILE_MAX: u64 = 64 * 1024;

/// The first [`THREAD_FILE_MAX`] bytes of `path`.
fn read_first(path: &Path) -> io::Result<Vec<u8>> {
    crate::host::files::read_file_limited(
        path,
        crate::host::files::ReadLimit {
            bytes: THREAD_FILE_MAX,
            overflow: crate::host::files::Overflow::KeepFirst,
        },
    )
    .map(|read| read.bytes)
}

fn read_optional(path: &Path) -> Option<String> {
    crate::host::files::read_capped(path, THREAD_FILE_MAX)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
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

/// The GPU nodes (`/dev/nvidia<N>`, see [`NodeKind`]) process `pid` sees in its own root
/// (`/proc/<pid>/root/dev`: its container's `/dev`); `None` when that cannot be read.
pub fn gpu_nodes(proc_root: &Path, pid: u32) -> Option<u32> {
    let dir = fs::read_dir(proc_root.join(pid.to_string()).join("root/dev")).ok()?;
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name().to_str().is_some_and(|name| {
                matches!(
                    NodeKind::from_dev_path(&format!("/dev/{name}")),
                    Some(NodeKind::Gpu(_))
                )
            })
        })
        .count();
    Some(n as u32)
}

/// Most of `/proc/<pid>/environ` read by [`environ_var`] (environments are a few KiB).
const ENVIRON_MAX: u64 = 256 * 1024;

/// The value of `name` in process `pid`'s initial environment (`/proc/<pid>/environ`: what
/// it was started with, not what it set since); `None` when unset or unreadable.
pub fn environ_var(proc_root: &Path, pid: u32, name: &str) -> Option<String> {
    let bytes = crate::host::files::read_capped(
        &proc_root.join(pid.to_string()).join("environ"),
        ENVIRON_MAX,
    )?;
    split_nul(&bytes).into_iter().find_map(|kv| {
        kv.split_once('=')
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
}

/// Splits NUL-separated fields (`cmdline`, `environ`): one trailing NUL is dropped, empty
/// input gives no field, invalid UTF-8 becomes U+FFFD.
pub fn split_nul(bytes: &[u8]) -> Vec<String> {
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
    fn a_thread_whose_main_thread_exited_is_read_through_its_own_directory() {
        // As procfs shows a zombie leader: no exe nor cmdline in the process's directory,
        // the running thread's own in task/<tid>/.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("300");
        let t = p.join("task").join("301");
        write(
            &p.join("task/300/stat"),
            b"300 (launcher) Z 1 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 2 0\n",
        );
        write(&p.join("cmdline"), b"");
        write(
            &t.join("stat"),
            b"301 (worker) S 1 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 2 0\n",
        );
        write(&t.join("cmdline"), b"python3\0serve.py\0");
        write(
            &t.join("cgroup"),
            format!("0::/system.slice/docker-{ID}.scope\n").as_bytes(),
        );
        symlink("/usr/bin/python3.11", t.join("exe")).unwrap();
        let w = read_thread(dir.path(), 300, 301).unwrap();
        assert_eq!(w.exe, Some(PathBuf::from("/usr/bin/python3.11")));
        assert_eq!(w.cmdline, vec!["python3", "serve.py"]);
        assert_eq!(w.container_id.as_deref(), Some(ID));
        let leader = read_thread(dir.path(), 300, 300).unwrap();
        assert_eq!((leader.state, leader.exe), ('Z', None));
        // The process's identity comes through the live thread, named as the process.
        let id = crate::host::identity::read(dir.path(), 300, "");
        assert_eq!(
            (id.comm.as_str(), id.exe.as_str()),
            ("launcher", "/usr/bin/python3.11")
        );
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
    fn nul_separated_fields() {
        assert_eq!(split_nul(b"a\0\0b c\0"), vec!["a", "", "b c"]);
        assert_eq!(split_nul(b"a\0b"), vec!["a", "b"]);
        assert_eq!(split_nul(b"\xff\0"), vec!["\u{fffd}"]);
        assert!(split_nul(b"").is_empty());
        assert!(split_nul(b"\0").is_empty());
    }

    #[test]
    fn gpu_nodes_and_environment_of_a_process() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("7/root/dev");
        for n in [
            "nvidia0",
            "nvidia1",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-modeset",
            "null",
        ] {
            write(&dev.join(n), b"");
        }
        fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
        assert_eq!(gpu_nodes(dir.path(), 7), Some(2));
        assert_eq!(gpu_nodes(dir.path(), 8), None);
        write(
            &dir.path().join("7/environ"),
            b"PATH=/bin\0CUDA_VISIBLE_DEVICES=0\0X_CUDA_VISIBLE_DEVICES=1,2\0",
        );
        assert_eq!(
            environ_var(dir.path(), 7, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("0")
        );
        assert_eq!(environ_var(dir.path(), 7, "HOME"), None);
        assert_eq!(environ_var(dir.path(), 8, "PATH"), None);
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

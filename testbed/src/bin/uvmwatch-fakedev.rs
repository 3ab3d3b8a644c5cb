//! `uvmwatch-fakedev`: a FUSE file system that stands in for NVIDIA's device nodes.
//!
//! ```text
//! uvmwatch-fakedev MOUNTPOINT [--gpus N] [--omit NAME]... [--deny NAME=ERRNO]...
//!                  [--ioctl CMD=ACTION]... [--verbose [--dump-params]]
//! ```
//!
//! It mounts a directory holding regular files named `nvidiactl`, `nvidia0`..`nvidia{N-1}`,
//! `nvidia-uvm` and `nvidia-uvm-tools` (less the `--omit`ted ones). A test bind-mounts them
//! at their real `/dev` paths inside a private mount namespace (see the library's
//! `spawn_workload`). Opens succeed unless `--deny`; ioctls follow the `--ioctl` rules
//! (`ok`, `errno:NAME|N`, `delay:MS`, `hang`), unknown commands succeed. For `_IOC`-encoded
//! commands (the RM ioctls) the kernel copies the parameters in and out and the server echoes
//! them back unchanged, whatever the command's type byte, so a status the caller wrote into
//! them survives; plain-integer UVM commands carry no data through FUSE. `--dump-params`
//! logs the bytes received.
//!
//! It prints `ready` on stdout once mounted. `SIGUSR1` answers every held (`hang` or
//! `delay`) ioctl with success; `SIGTERM`, `SIGINT` or `SIGHUP` unmount and exit.
//!
//! fuser 0.18 answers `FUSE_INTERRUPT` with `ENOSYS` (which makes the kernel stop sending
//! them), so the server sits between `/dev/fuse` and fuser: a relay thread passes every
//! request on to fuser through a `SOCK_SEQPACKET` socket pair except `FUSE_INTERRUPT`, which
//! it answers itself by failing the held ioctl with `EINTR`. That is what lets a caller
//! killed while inside a `hang` ioctl exit: a fatal signal does not end a FUSE request that
//! the server has already read.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Parser;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, OpenFlags, ReplyAttr, ReplyDirectory, ReplyEntry, ReplyIoctl, ReplyOpen, Request,
    SessionACL,
};
use uvmwatch_testbed::rules::{all_node_names, IoctlAction, IoctlRule, OpenDenial};

/// How long the kernel may cache names and attributes; the tree never changes.
const TTL: Duration = Duration::from_secs(3600);
/// Largest write the kernel may send (bytes); kept small so requests fit the relay buffer.
const MAX_WRITE: u32 = 64 * 1024;
/// Relay buffer (bytes). The kernel wants at least `max_write` + 80 header bytes and 8 KiB.
const RELAY_BUF: usize = 256 * 1024;
/// `FUSE_INTERRUPT` opcode (include/uapi/linux/fuse.h).
const FUSE_INTERRUPT: u32 = 36;
/// `sizeof(struct fuse_in_header)`.
const FUSE_IN_HEADER_LEN: usize = 40;
/// Interrupts that arrived before fuser handed their request to us; bounded so a long run
/// cannot grow it without end.
const EARLY_INTERRUPTS_MAX: usize = 1024;

#[derive(Parser, Debug)]
#[command(
    name = "uvmwatch-fakedev",
    about = "FUSE stand-in for the NVIDIA device nodes (nvidiactl, nvidiaN, nvidia-uvm, nvidia-uvm-tools)"
)]
struct Args {
    /// Existing empty directory to mount on.
    mountpoint: PathBuf,
    /// Number of GPU nodes (nvidia0..nvidia{N-1}).
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Leave this node out (repeatable), e.g. `--omit nvidia-uvm`.
    #[arg(long = "omit", value_name = "NAME")]
    omit: Vec<String>,
    /// Fail opens of NAME with ERRNO (name or number; repeatable), e.g. `nvidia-uvm=EPERM`.
    #[arg(long = "deny", value_name = "NAME=ERRNO")]
    deny: Vec<OpenDenial>,
    /// Ioctl rule (repeatable): CMD (hex 0x25, 0x30000001, or decimal) = ok | errno:NAME|N |
    /// delay:MS | hang. Unknown commands get `ok`.
    #[arg(long = "ioctl", value_name = "CMD=ACTION")]
    ioctl: Vec<IoctlRule>,
    /// Log every open, ioctl, interrupt and release on stderr.
    #[arg(long)]
    verbose: bool,
    /// With --verbose: end each ioctl line with ` params=<hex>`, the bytes the kernel
    /// copied in (empty for commands without `_IOC` size bits).
    #[arg(long)]
    dump_params: bool,
}

/// An ioctl whose answer is held back (`hang`, `delay`).
struct HeldIoctl {
    reply: ReplyIoctl,
    echo: Vec<u8>,
    cmd: u32,
    pid: u32,
}

#[derive(Default)]
struct HeldState {
    by_unique: HashMap<u64, HeldIoctl>,
    early_interrupts: HashSet<u64>,
}

/// Ioctls waiting for `SIGUSR1`, their delay, or an interrupt; keyed by FUSE request id.
#[derive(Default)]
struct HeldIoctls {
    state: Mutex<HeldState>,
    verbose: bool,
}

impl HeldIoctls {
    fn lock(&self) -> MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `held`, or gives it back when its interrupt already arrived.
    fn hold(&self, unique: u64, held: HeldIoctl) -> Option<HeldIoctl> {
        let mut state = self.lock();
        if state.early_interrupts.remove(&unique) {
            return Some(held);
        }
        state.by_unique.insert(unique, held);
        None
    }

    fn take(&self, unique: u64) -> Option<HeldIoctl> {
        self.lock().by_unique.remove(&unique)
    }

    /// Answers a held ioctl whose caller got a signal with `EINTR`; remembers interrupts for
    /// requests not held (yet).
    fn interrupt(&self, unique: u64) {
        let held = {
            let mut state = self.lock();
            let held = state.by_unique.remove(&unique);
            if held.is_none() {
                if state.early_interrupts.len() >= EARLY_INTERRUPTS_MAX {
                    state.early_interrupts.clear();
                }
                state.early_interrupts.insert(unique);
            }
            held
        };
        if let Some(h) = held {
            if self.verbose {
                eprintln!(
                    "uvmwatch-fakedev: interrupt cmd={:#x} pid={} unique={unique}: EINTR",
                    h.cmd, h.pid
                );
            }
            h.reply.error(Errno::EINTR);
        }
    }

    /// Answers every held ioctl with success; returns how many.
    fn release_all(&self) -> usize {
        let held: Vec<HeldIoctl> = self.lock().by_unique.drain().map(|(_, h)| h).collect();
        let n = held.len();
        for h in held {
            if self.verbose {
                eprintln!("uvmwatch-fakedev: release cmd={:#x} pid={}", h.cmd, h.pid);
            }
            h.reply.ioctl(0, &h.echo);
        }
        n
    }
}

struct FakeDevFs {
    /// Node names; the node at index i has inode i + 2 (1 is the root directory).
    nodes: Vec<String>,
    deny: HashMap<String, i32>,
    rules: HashMap<u32, IoctlAction>,
    held: Arc<HeldIoctls>,
    verbose: bool,
    dump_params: bool,
    created: SystemTime,
}

const ROOT_INO: u64 = 1;

impl FakeDevFs {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, nlink) = if ino == ROOT_INO {
            (FileType::Directory, 0o755, 2)
        } else if self.node_name(ino).is_some() {
            (FileType::RegularFile, 0o666, 1)
        } else {
            return None;
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            crtime: self.created,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn node_name(&self, ino: u64) -> Option<&str> {
        let index = usize::try_from(ino.checked_sub(2)?).ok()?;
        self.nodes.get(index).map(String::as_str)
    }
}

impl fuser::Filesystem for FakeDevFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        config
            .set_max_write(MAX_WRITE)
            .map_err(|_| io::Error::other("kernel refused max_write"))?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent.0 == ROOT_INO)
            .then(|| self.nodes.iter().position(|n| OsStr::new(n) == name))
            .flatten();
        match found.and_then(|i| self.attr(i as u64 + 2)) {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT_INO {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let mut entries = vec![
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
        ];
        for (i, name) in self.nodes.iter().enumerate() {
            entries.push((i as u64 + 2, FileType::RegularFile, name.as_str()));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(name) = self.node_name(ino.0) else {
            reply.opened(FileHandle(0), FopenFlags::empty());
            return;
        };
        let denied = self.deny.get(name).copied();
        if self.verbose {
            let outcome = match denied {
                Some(e) => format!("errno {e}"),
                None => "ok".to_string(),
            };
            eprintln!(
                "uvmwatch-fakedev: open node={name} flags={:#x} pid={}: {outcome}",
                flags.0,
                req.pid()
            );
        }
        match denied {
            Some(e) => reply.error(Errno::from_i32(e)),
            None => reply.opened(FileHandle(0), FopenFlags::empty()),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let action = self.rules.get(&cmd).copied().unwrap_or(IoctlAction::Ok);
        if self.verbose {
            let params = if self.dump_params {
                let hex: String = in_data.iter().map(|b| format!("{b:02x}")).collect();
                format!(" params={hex}")
            } else {
                String::new()
            };
            eprintln!(
                "uvmwatch-fakedev: ioctl node={} cmd={cmd:#x} in={} out={out_size} pid={}: {action}{params}",
                self.node_name(ino.0).unwrap_or("?"),
                in_data.len(),
                req.pid()
            );
        }
        // Echo the caller's parameters: the kernel copied `_IOC_SIZE(cmd)` bytes in for
        // write-direction commands and copies up to `out_size` back for read-direction ones.
        let mut echo = in_data.to_vec();
        echo.resize(out_size as usize, 0);
        let unique = req.unique().0;
        let held = HeldIoctl {
            reply,
            echo,
            cmd,
            pid: req.pid(),
        };
        match action {
            IoctlAction::Ok => held.reply.ioctl(0, &held.echo),
            IoctlAction::Errno(e) => held.reply.error(Errno::from_i32(e)),
            IoctlAction::Hang | IoctlAction::Delay(_) => {
                if let Some(early) = self.held.hold(unique, held) {
                    // The caller was interrupted before we got here.
                    early.reply.error(Errno::EINTR);
                    return;
                }
                if let IoctlAction::Delay(delay) = action {
                    let held = Arc::clone(&self.held);
                    thread::spawn(move || {
                        thread::sleep(delay);
                        if let Some(h) = held.take(unique) {
                            h.reply.ioctl(0, &h.echo);
                        }
                    });
                }
            }
        }
    }
}

/// Mounts a FUSE file system on `mountpoint` with the already opened `/dev/fuse` `dev`.
fn mount_fuse(dev: &File, mountpoint: &Path) -> Result<()> {
    let target = CString::new(mountpoint.as_os_str().as_bytes())?;
    let source = CString::new("uvmwatch-fakedev")?;
    let fstype = CString::new("fuse.uvmwatch-fakedev")?;
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let data = CString::new(format!(
        "fd={},rootmode=40755,user_id={uid},group_id={gid},allow_other",
        dev.as_raw_fd()
    ))?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("mount fuse on {}", mountpoint.display()));
    }
    Ok(())
}

fn unmount(mountpoint: &Path) -> io::Result<()> {
    let target = CString::new(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    // Busy (a caller still has a node open): detach it now, the kernel frees it later.
    // SAFETY: as above.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// Starts the relay between `/dev/fuse` and fuser; returns fuser's end of the socket pair.
fn start_relay(dev: File, held: Arc<HeldIoctls>) -> Result<OwnedFd> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("socketpair");
    }
    // SAFETY: socketpair just returned these two descriptors, owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let ours = Arc::new(ours);
    let dev = Arc::new(dev);

    let (dev_in, sock_in) = (Arc::clone(&dev), Arc::clone(&ours));
    thread::Builder::new()
        .name("relay-kernel".into())
        .spawn(move || relay_from_kernel(&dev_in, &sock_in, &held))?;
    thread::Builder::new()
        .name("relay-fuser".into())
        .spawn(move || relay_to_kernel(&ours, &dev))?;
    Ok(theirs)
}

/// Kernel → fuser: passes requests on, answers `FUSE_INTERRUPT` itself.
fn relay_from_kernel(dev: &File, sock: &OwnedFd, held: &HeldIoctls) {
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // Request already gone, or a signal: read again.
                Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                // ENODEV: unmounted. Anything else: nothing sensible left to do.
                _ => break,
            },
        };
        let msg = &buf[..n];
        if n >= FUSE_IN_HEADER_LEN + 8 && u32_at(msg, 4) == FUSE_INTERRUPT {
            held.interrupt(u64_at(msg, FUSE_IN_HEADER_LEN));
            continue;
        }
        // SAFETY: `msg` is valid for `n` bytes; `sock` is an open socket.
        let sent = unsafe {
            libc::send(
                sock.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            break;
        }
    }
    // SAFETY: shutting down our own socket; fuser then sees end of file and stops.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
}

/// fuser → kernel: passes each reply on as one write.
fn relay_to_kernel(sock: &OwnedFd, dev: &File) {
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        // SAFETY: `buf` is valid for its length; `sock` is an open socket.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        match (&*dev).write(&buf[..n as usize]) {
            Ok(_) => {}
            // ENOENT: the request was already answered (interrupt) or aborted.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => break,
        }
    }
}

fn u32_at(buf: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(buf[off..off + 8].try_into().expect("8 bytes"))
}

/// Blocks the signals the main thread handles with `sigwait`, for this thread and every
/// thread started after it.
fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; the calls only write to `set`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGUSR1, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!("pthread_sigmask: {}", io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

fn run(args: Args) -> Result<()> {
    let all = all_node_names(args.gpus);
    for name in args.omit.iter().chain(args.deny.iter().map(|d| &d.node)) {
        if !all.contains(name) {
            bail!("unknown node '{name}' (nodes: {})", all.join(", "));
        }
    }
    let nodes: Vec<String> = all.into_iter().filter(|n| !args.omit.contains(n)).collect();
    let signals = block_signals()?;

    let held = Arc::new(HeldIoctls {
        verbose: args.verbose,
        ..HeldIoctls::default()
    });
    let fs = FakeDevFs {
        nodes,
        deny: args
            .deny
            .iter()
            .map(|d| (d.node.clone(), d.errno))
            .collect(),
        rules: args.ioctl.iter().map(|r| (r.cmd, r.action)).collect(),
        held: Arc::clone(&held),
        verbose: args.verbose,
        dump_params: args.dump_params,
        created: SystemTime::now(),
    };

    let mountpoint = args
        .mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", args.mountpoint.display()))?;
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .context("open /dev/fuse")?;
    mount_fuse(&dev, &mountpoint)?;
    let session = (|| -> Result<fuser::BackgroundSession> {
        let fuser_end = start_relay(dev, Arc::clone(&held))?;
        let session =
            fuser::Session::from_fd(fs, fuser_end, SessionACL::All, fuser::Config::default())
                .context("FUSE handshake")?;
        Ok(session.spawn()?)
    })();
    let _session = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = unmount(&mountpoint);
            return Err(e);
        }
    };

    let mut stdout = io::stdout().lock();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    drop(stdout);
    if args.verbose {
        eprintln!("uvmwatch-fakedev: mounted on {}", mountpoint.display());
    }

    loop {
        let mut sig = 0;
        // SAFETY: `signals` is an initialised set, `sig` a valid out-pointer.
        let rc = unsafe { libc::sigwait(&signals, &mut sig) };
        if rc != 0 {
            continue;
        }
        if sig == libc::SIGUSR1 {
            let n = held.release_all();
            if args.verbose {
                eprintln!("uvmwatch-fakedev: SIGUSR1 released {n} held ioctl(s)");
            }
            continue;
        }
        if args.verbose {
            eprintln!("uvmwatch-fakedev: signal {sig}, unmounting");
        }
        unmount(&mountpoint).with_context(|| format!("unmount {}", mountpoint.display()))?;
        // Exiting closes /dev/fuse: the kernel then fails whatever is still pending.
        return Ok(());
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("uvmwatch-fakedev: {e:#}");
        std::process::exit(1);
    }
}

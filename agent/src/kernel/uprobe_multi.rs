//! Multi-uprobe links (`BPF_LINK_TYPE_UPROBE_MULTI`, Linux 6.6+) for the libcuda uprobes,
//! where the kernel has them; perf-event uprobes (aya's `UProbe::attach`) elsewhere.
//!
//! What they change is the cost of detaching. A perf-event uprobe is destroyed under the
//! global `event_mutex`, waiting there for a tracepoint grace period
//! (kernel/trace/trace_event_perf.c, `perf_uprobe_destroy` → `perf_trace_event_unreg` →
//! `tracepoint_synchronize_unregister`, v6.1–v6.18), so detaches run one after another,
//! each a grace period: the agent's stop grew by seconds per libcuda file. A multi link's
//! release (kernel/trace/bpf_trace.c, `bpf_uprobe_multi_link_release`) takes no global lock:
//! links closed from several threads wait for their grace periods together
//! ([`drop_in_parallel`]).
//!
//! The kernel attaches a multi link only to a program loaded with the expected attach type
//! `BPF_TRACE_UPROBE_MULTI` (`bpf_uprobe_multi_link_attach`), which aya 0.14 does not set for
//! a uprobe. So the uprobe programs are loaded a second time here: the same object, parsed
//! and relocated by aya-obj against the maps aya created, loaded with that type.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use anyhow::{anyhow, Context, Result};
use aya::{maps::Map, Ebpf};
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};

/// `BPF_F_UPROBE_MULTI_RETURN` (include/uapi/linux/bpf.h, v6.6): the link's probes are
/// uretprobes.
const UPROBE_MULTI_RETURN: u32 = 1;

/// The uprobe programs, loaded for multi links; absent where the kernel has none.
pub(super) struct MultiPrograms {
    programs: StdHashMap<&'static str, OwnedFd>,
}

impl MultiPrograms {
    /// Loads `programs` (the uprobe programs' names in `object`) for multi links, with the
    /// maps `bpf` created. `None` where this kernel has no multi-uprobe links ([`supported`]).
    ///
    /// # Errors
    /// The object cannot be relocated, or the kernel refuses a program it accepted from aya.
    pub fn load(bpf: &Ebpf, object: &[u8], programs: &[&'static str]) -> Result<Option<Self>> {
        let mut obj = aya_obj::Object::parse(object).context("parsing the eBPF object")?;
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        let map_objs = std::mem::take(&mut obj.maps);
        let mut maps = Vec::new();
        for (name, map_obj) in &map_objs {
            if let Some(fd) = bpf.map(name).map(map_fd) {
                maps.push((name.as_str(), fd, map_obj));
            }
        }
        obj.relocate_maps(maps.into_iter(), &text_sections)
            .context("relocating the uprobe programs' maps")?;
        obj.relocate_calls(&text_sections)
            .context("relocating the uprobe programs' calls")?;
        obj.sanitize_functions(aya::features());
        let mut loaded = StdHashMap::new();
        for &name in programs {
            let program = obj
                .programs
                .get(name)
                .ok_or_else(|| anyhow!("program {name} not in the object"))?;
            let function = obj
                .functions
                .get(&program.function_key())
                .ok_or_else(|| anyhow!("program {name} has no code"))?;
            let fd = load_program(name, &function.instructions, &program.license)
                .with_context(|| format!("loading {name} for multi-uprobe links"))?;
            if loaded.is_empty() && !supported(fd.as_fd()) {
                return Ok(None);
            }
            loaded.insert(name, fd);
        }
        Ok(Some(MultiPrograms { programs: loaded }))
    }

    /// Attaches `program` at file offset `offset` of `path` (a uretprobe when `ret`) for
    /// every process: one link, closed to detach.
    ///
    /// # Errors
    /// The program is not loaded here, or the kernel refuses the link (its errno).
    pub fn attach(&self, program: &str, path: &Path, offset: u64, ret: bool) -> Result<OwnedFd> {
        let prog = self
            .programs
            .get(program)
            .ok_or_else(|| anyhow!("program {program} not loaded for multi-uprobe links"))?;
        let path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| anyhow!("{} has a NUL byte", path.display()))?;
        link_create(prog.as_fd().as_raw_fd(), &path, offset, ret)
            .map_err(|e| anyhow!("BPF_LINK_CREATE (uprobe_multi): {e}"))
    }
}

/// Whether the kernel makes multi-uprobe links: as libbpf probes it
/// (`probe_uprobe_multi_link`), a link on `/` is refused with `EBADF` (not a regular file)
/// by a kernel that has them, with `EINVAL` (unknown attach type) by one that has not.
fn supported(prog: std::os::fd::BorrowedFd<'_>) -> bool {
    let root = CString::new("/").expect("no NUL");
    match link_create(prog.as_raw_fd(), &root, 0, false) {
        Ok(_) => true, // never on a directory; the link is closed at once
        Err(e) => e.raw_os_error() == Some(libc::EBADF),
    }
}

/// The fd of a map aya created.
fn map_fd(map: &Map) -> RawFd {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd().as_raw_fd()
}

/// The `bpf(2)` syscall with `attr` (zeroed past what the caller set).
fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid bpf_attr for cmd, its pointers outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// `BPF_PROG_LOAD` of a kprobe-type program with the expected attach type
/// `BPF_TRACE_UPROBE_MULTI`, without BTF (the agent's programs need none: no CO-RE, no
/// global functions). A refusal is retried with the verifier's log, which the error carries.
fn load_program(name: &str, insns: &[bpf_insn], license: &CString) -> Result<OwnedFd> {
    let load = |log: Option<&mut Vec<u8>>| {
        // SAFETY: an all-zero bpf_attr is the kernel's "nothing set".
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the union's prog-load member.
        let u = unsafe { &mut attr.__bindgen_anon_3 };
        u.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
        u.expected_attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
        u.insns = insns.as_ptr() as u64;
        u.insn_cnt = insns.len() as u32;
        u.license = license.as_ptr() as u64;
        for (dst, src) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
            *dst = src as libc::c_char;
        }
        if let Some(log) = log {
            u.log_level = 1;
            u.log_buf = log.as_mut_ptr() as u64;
            u.log_size = log.len() as u32;
        }
        sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    load(None).or_else(|e| {
        let mut log = vec![0u8; 1 << 20];
        load(Some(&mut log)).map_err(|_| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            anyhow!(
                "{e}: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join("; ")
            )
        })
    })
}

/// `BPF_LINK_CREATE` of one multi-uprobe link: `prog` at `offset` in `path`, any process.
fn link_create(prog: RawFd, path: &CString, offset: u64, ret: bool) -> io::Result<OwnedFd> {
    let offsets = [offset];
    // SAFETY: an all-zero bpf_attr is the kernel's "nothing set".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the union's link-create member.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog as u32;
    l.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    // SAFETY: writing the link-create union's uprobe_multi member.
    let m = unsafe { &mut l.__bindgen_anon_3.uprobe_multi };
    m.path = path.as_ptr() as u64;
    m.offsets = offsets.as_ptr() as u64;
    m.cnt = 1;
    m.flags = if ret { UPROBE_MULTI_RETURN } else { 0 };
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// Drops `links` (each detaching in its `Drop`: a closed fd, a perf event destroyed) from
/// several threads at once, so that their grace periods overlap where the kernel lets them
/// (multi links; perf-event uprobes are detached one at a time by the kernel whatever the
/// threads). Returns once every link is gone.
pub(super) fn drop_in_parallel<T: Send>(links: Vec<T>) {
    /// Threads at most: enough that a few hundred links wait a few grace periods each.
    const THREADS: usize = 1024;
    if links.len() <= 1 {
        drop(links);
        return;
    }
    let per_thread = links.len().div_ceil(THREADS);
    let mut chunks: Vec<Vec<T>> = Vec::new();
    let mut rest = links.into_iter();
    loop {
        let chunk: Vec<T> = rest.by_ref().take(per_thread).collect();
        if chunk.is_empty() {
            break;
        }
        chunks.push(chunk);
    }
    std::thread::scope(|s| {
        for chunk in chunks {
            // Where no thread can be started, the closure and its links are dropped here,
            // by this thread.
            let _ = std::thread::Builder::new()
                .name("uvmwatch-detach".into())
                .stack_size(64 * 1024)
                .spawn_scoped(s, move || drop(chunk));
        }
    });
}

//! The programs, one file per hook group. Program names (the functions marked `#[tracepoint]`,
//! `#[uprobe]`, `#[kprobe]`, ...) are what the agent's registry
//! (`agent/src/kernel/registry.rs`) loads and attaches: rename one only together with it.
//! Adding a probe, file by file: `docs/probes.md#adding-a-probe`.
//!
//! Each tracepoint reads its record through a `#[repr(C)]` struct whose doc holds the
//! tracepoint's `format` as `/sys/kernel/tracing/events/<category>/<name>/format` gives it
//! on 6.18 (the `syscalls:*` records have the same layout on 6.1 and 6.12, where
//! `cargo xtask vm-test` loads these programs). The `sched` programs are raw tracepoints:
//! their docs hold each one's `TP_PROTO` instead (`sched.rs`).

pub mod context_call;
pub mod cuinit;
pub mod floor;
pub mod ioctl;
pub mod kernel_fn;
pub mod open;
pub mod sched;

use aya_ebpf::{programs::TracePointContext, EbpfContext};

/// The record of tracepoint `ctx` as its format struct `T`, in place: a tracepoint program
/// loads the fields it reads straight from its record (the verifier checks each load's
/// offset), one instruction each, where `TracePointContext::read_at` copies the whole struct
/// with a `bpf_probe_read_kernel` call (on every open of the host).
///
/// # Safety
/// `T` must be the tracepoint's record layout, as in the `format` each struct's doc holds.
#[inline(always)]
pub unsafe fn tp_record<T>(ctx: &TracePointContext) -> &T {
    unsafe { &*(ctx.as_ptr() as *const T) }
}

/// The fields every tracepoint record starts with (`struct trace_entry`):
///
/// ```text
/// field:unsigned short common_type;  offset:0;  size:2;  signed:0;
/// field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
/// field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
/// field:int common_pid;  offset:4;  size:4;  signed:1;
/// ```
#[repr(C)]
#[allow(dead_code)] // the layout of the record; the programs read what follows
pub struct TraceEntry {
    pub common_type: u16,
    pub common_flags: u8,
    pub common_preempt_count: u8,
    pub common_pid: i32,
}

/// The start of every `syscalls:*` record: [`TraceEntry`], then the syscall number. The
/// arguments follow at offset 16, 8 bytes each whatever their C type.
///
/// ```text
/// field:int __syscall_nr;  offset:8;  size:4;  signed:1;
/// ```
#[repr(C)]
#[allow(dead_code)] // the layout of the record; the programs read what follows
pub struct SyscallHead {
    pub entry: TraceEntry,
    pub syscall_nr: i32,
    _pad: u32,
}

/// `syscalls:sys_exit_openat`, and the same for `sys_exit_open`, `sys_exit_openat2` and
/// `sys_exit_ioctl` (each `format` is this one with its own name and ID), 6.18:
///
/// ```text
/// name: sys_exit_openat
/// ID: 781
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:long ret;  offset:16;  size:8;  signed:1;
///
/// print fmt: "0x%lx", REC->ret
/// ```
#[repr(C)]
pub struct SysExitArgs {
    pub head: SyscallHead,
    /// The syscall's return value: a result, or `-errno`.
    pub ret: i64,
}

//! `ioctl` enter and exit, for the processes in `PROCS` only, on either backend: the
//! `syscalls:sys_{enter,exit}_ioctl` tracepoints, or fentry/fexit on the syscall's own
//! function (`__x64_sys_ioctl`, whose `struct pt_regs` holds the fd, the request and the
//! params' address), which runs for `ioctl(2)` only instead of putting every syscall of
//! every thread on the tracepoints' slow path. The bodies are the same: on an fd whose file is an
//! NVIDIA node (a character device by its number, a double by `DEVFILES`), and on a negative
//! fd as [`node::INVALID_FD`]. Enter puts the call in `INFLIGHT_IOCTL`; exit
//! removes it, adds the latency to `IOCTL_HIST` and the result to `IOCTL_RESULTS` (the errno,
//! else the `rmStatus` read from the caller's params at the offset `CMDS` gives, else `OK`),
//! and reports calls that failed, were slow or ran inside `cuInit`.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{fentry, fexit, tracepoint},
    programs::{FEntryContext, FExitContext, TracePointContext},
};
use uvmwatch_common::{
    counter, hist_bucket, node, result, rm_cmd_key, CmdKey, InflightIoctl, IoctlEvent, IoctlKey,
    EVENT_IOCTL, IOCTL_FAILED, IOCTL_IN_CUINIT, IOCTL_SLOW, NV_IOCTL_MAGIC, UNKNOWN_CMD,
};

use super::cuinit::in_cuinit;
use super::{tp_record, SysExitArgs, SyscallHead};
use crate::helpers::{
    add_sample, bump, config, count, emit, failed, failure_allowed, header, ids, kread,
    maybe_tracked, node_of_fd,
};
use crate::maps::{
    CMDS, INFLIGHT_CUINIT, INFLIGHT_IOCTL, IOCTL_HIST, IOCTL_RESULTS, NAMED_CMDS, PROCS, ZERO_HIST,
};

/// `syscalls:sys_enter_ioctl`, 6.18:
///
/// ```text
/// name: sys_enter_ioctl
/// ID: 898
/// format:
///   field:unsigned short common_type;  offset:0;  size:2;  signed:0;
///   field:unsigned char common_flags;  offset:2;  size:1;  signed:0;
///   field:unsigned char common_preempt_count;  offset:3;  size:1;  signed:0;
///   field:int common_pid;  offset:4;  size:4;  signed:1;
///
///   field:int __syscall_nr;  offset:8;  size:4;  signed:1;
///   field:unsigned int fd;  offset:16;  size:8;  signed:0;
///   field:unsigned int cmd;  offset:24;  size:8;  signed:0;
///   field:unsigned long arg;  offset:32;  size:8;  signed:0;
///
/// print fmt: "fd: 0x%08lx, cmd: 0x%08lx, arg: 0x%08lx", ...
/// ```
#[repr(C)]
#[allow(dead_code)] // every field of the record, read or not
struct SysEnterIoctlArgs {
    head: SyscallHead,
    fd: u64,
    /// The request number.
    cmd: u64,
    /// User-space address of the params.
    arg: u64,
}

/// `syscalls:sys_enter_ioctl` ([`SysEnterIoctlArgs`]).
#[tracepoint]
pub fn ioctl_enter(ctx: TracePointContext) -> u32 {
    // The gate before the arguments: an ioctl of a process not looked at reads nothing.
    let (tgid, tid) = ids();
    if maybe_tracked(tgid) {
        let args = unsafe { tp_record::<SysEnterIoctlArgs>(&ctx) };
        let _ = enter(tgid, tid, args.fd, args.cmd, args.arg);
    }
    0
}

/// fentry on `__x64_sys_ioctl(const struct pt_regs *regs)`: the call's arguments, read from
/// the registers at the offsets of `Config::fentry`.
#[fentry(function = "__x64_sys_ioctl")]
pub fn ioctl_fentry(ctx: FEntryContext) -> u32 {
    // The gate before the registers: an ioctl of a process not looked at reads nothing.
    let (tgid, tid) = ids();
    if maybe_tracked(tgid) {
        let _ =
            syscall_args(ctx.arg::<u64>(0)).map(|(fd, cmd, arg)| enter(tgid, tid, fd, cmd, arg));
    }
    0
}

/// The ioctl's `(fd, cmd, arg)` from its `struct pt_regs *`.
#[inline(always)]
fn syscall_args(regs: u64) -> Option<(u64, u64, u64)> {
    let o = &config()?.fentry;
    if o.ready == 0 {
        return None;
    }
    Some((
        kread(regs + o.regs_arg0 as u64)?,
        kread(regs + o.regs_arg1 as u64)?,
        kread(regs + o.regs_arg2 as u64)?,
    ))
}

/// What both enters do, for a process the gate lets through (`maybe_tracked`: one array
/// lookup for every process that never touched an NVIDIA node, the host's other ioctls on
/// terminals, sockets and block devices, instead of its arguments and fd table): put the
/// call in `INFLIGHT_IOCTL` when it is on an NVIDIA node of a process in `PROCS`.
#[inline(always)]
fn enter(tgid: u32, tid: u32, fd: u64, cmd: u64, arg: u64) -> Option<()> {
    unsafe { PROCS.get(&tgid) }?;
    let cfg = config()?;
    let fd = fd as u32;
    let (node, minor) = if (fd as i32) < 0 {
        // Not a node, but a call the process meant for one (`UVM_DEINITIALIZE` on -errno).
        (node::INVALID_FD, 0)
    } else {
        node_of_fd(cfg, fd)?
    };
    if node == node::NONE {
        return None;
    }
    let start_ns = unsafe { bpf_ktime_get_ns() };
    // A call on a negative fd never starts a late cuInit (it reached no driver).
    let in_cuinit = if node == node::INVALID_FD {
        unsafe { INFLIGHT_CUINIT.get(&tid) }.is_some()
    } else {
        in_cuinit(tgid, tid, start_ns)
    };
    let e = InflightIoctl {
        start_ns,
        arg,
        tgid,
        fd,
        cmd: cmd as u32,
        node,
        minor,
        in_cuinit: in_cuinit as u8,
        _pad: 0,
    };
    if INFLIGHT_IOCTL.insert(&tid, &e, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    }
    Some(())
}

/// Whether user space can name request `cmd` on a node of kind `node_kind` (as
/// `decode::nvidia::ioctl_name` does): UVM by request number, RM by `_IOC_NR`, and on a
/// negative fd either, an RM escape only with NVIDIA's type byte.
#[inline(always)]
fn named(node_kind: u8, cmd: u32) -> bool {
    let uvm = || unsafe { NAMED_CMDS.get(&CmdKey { uvm: 1, cmd }) }.is_some();
    let rm = || {
        unsafe {
            NAMED_CMDS.get(&CmdKey {
                uvm: 0,
                cmd: cmd & 0xff,
            })
        }
        .is_some()
    };
    if node::is_uvm(node_kind) {
        uvm()
    } else if node_kind == node::INVALID_FD {
        uvm() || ((cmd >> 8) & 0xff == NV_IOCTL_MAGIC && rm())
    } else {
        rm()
    }
}

/// `syscalls:sys_exit_ioctl` ([`SysExitArgs`]).
#[tracepoint]
pub fn ioctl_exit(ctx: TracePointContext) -> u32 {
    // The call in flight before the return value: an ioctl not followed reads nothing.
    let Some(call) = in_flight() else {
        return 0;
    };
    let _ = exit(call, unsafe { tp_record::<SysExitArgs>(&ctx) }.ret);
    0
}

/// fexit on `__x64_sys_ioctl`: its return value follows its one argument.
#[fexit(function = "__x64_sys_ioctl")]
pub fn ioctl_fexit(ctx: FExitContext) -> u32 {
    if let Some(call) = in_flight() {
        let _ = exit(call, ctx.arg::<i64>(1));
    }
    0
}

/// The call this thread has in flight, taken out of `INFLIGHT_IOCTL`. Not gated: a call in
/// flight outlives its process's gate when the leader exits first.
#[inline(always)]
fn in_flight() -> Option<InflightIoctl> {
    let tid = ids().1;
    let call = *unsafe { INFLIGHT_IOCTL.get(&tid) }?;
    let _ = INFLIGHT_IOCTL.remove(&tid);
    Some(call)
}

/// What both exits do with `call`, the call in flight on this thread, which returned `ret`.
#[inline(always)]
fn exit(call: InflightIoctl, ret: i64) -> Option<()> {
    let (tgid, tid) = ids();
    let now = unsafe { bpf_ktime_get_ns() };
    let dur = now.saturating_sub(call.start_ns);

    // Result: errno, else the rmStatus at the command's offset, else plain OK.
    let (kind, code) = if ret < 0 {
        (result::ERRNO, (-ret) as u32)
    } else {
        let uvm = node::is_uvm(call.node);
        let ck = CmdKey {
            uvm: uvm as u32,
            cmd: if uvm { call.cmd } else { rm_cmd_key(call.cmd) },
        };
        match unsafe { CMDS.get(&ck) } {
            // User space never loads an offset outside the params; checked again so a bad
            // entry cannot make this read past what the caller passed.
            Some(ci) if ci.status_offset.saturating_add(4) <= ci.params_size => {
                let at = call.arg.wrapping_add(ci.status_offset as u64) as *const u32;
                match unsafe { bpf_probe_read_user::<u32>(at) } {
                    Ok(s) => (result::NV_STATUS, s),
                    Err(_) => (result::UNREADABLE, 0),
                }
            }
            _ => (result::OK, 0),
        }
    };

    let hk = IoctlKey {
        cmd: if named(call.node, call.cmd) {
            call.cmd
        } else {
            UNKNOWN_CMD
        },
        node: call.node,
        minor: call.minor,
        result_kind: 0,
        _pad: 0,
        code: 0,
    };
    let b = hist_bucket(dur);
    match IOCTL_HIST.get_ptr_mut(&hk) {
        Some(h) => add_sample(h, b, dur),
        None => {
            if let Some(z) = ZERO_HIST.get_ptr(0) {
                if IOCTL_HIST.insert(&hk, unsafe { &*z }, 0).is_err() {
                    bump(counter::IOCTL_HIST_FULL);
                }
                if let Some(h) = IOCTL_HIST.get_ptr_mut(&hk) {
                    add_sample(h, b, dur);
                }
            }
        }
    }
    let rk = IoctlKey {
        result_kind: kind,
        code,
        ..hk
    };
    count(&IOCTL_RESULTS, &rk, counter::IOCTL_RESULTS_FULL);

    let failed = failed(kind, code);
    let slow = config().map(|c| dur >= c.slow_ioctl_ns).unwrap_or(false);
    // A failure outside cuInit, neither slow nor part of a start-up: subject to the process's
    // failure-record budget (the aggregates above counted it already).
    if failed && !slow && call.in_cuinit == 0 && !failure_allowed(tgid, now) {
        return Some(());
    }
    if failed || slow || call.in_cuinit != 0 {
        let mut flags = 0;
        if failed {
            flags |= IOCTL_FAILED;
        }
        if slow {
            flags |= IOCTL_SLOW;
        }
        if call.in_cuinit != 0 {
            flags |= IOCTL_IN_CUINIT;
        }
        let ev = IoctlEvent {
            header: header(EVENT_IOCTL, tgid, tid, now),
            start_ns: call.start_ns,
            ret,
            cmd: call.cmd,
            fd: call.fd,
            status: code,
            flags,
            node: call.node,
            minor: call.minor,
            result_kind: kind,
            _pad: [0; 5],
        };
        emit(&ev);
    }
    Some(())
}

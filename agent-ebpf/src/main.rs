//! uvmwatch kernel programs.
//!
//! Read-only observers: nothing here changes what a traced process sees. Per-call work is done
//! in the kernel (identifying files, latency histograms, result counters); only failures, slow calls,
//! calls inside `cuInit` and lifecycle changes of tracked processes reach user space.
//!
//! The tree follows the data path:
//! * [`probes`]: the programs, one file per hook group, each on both backends where it has
//!   two (the syscall tracepoints, or fentry/fexit on the kernel functions): `open` (device
//!   opens, libcuda loads), `ioctl` (driver calls), `cuinit` (the `cuInit` uprobes), `ctx`
//!   (the context and device-count uprobes), `sched` (fork, exec, exit), `kernel_fn` (the
//!   kprobe/kretprobe and fentry/fexit pairs, one per row of `uvmwatch_common::kernel_fns!`),
//!   `floor` (the overhead benchmark's floor reference, which the agent itself never loads);
//! * [`maps`]: every map, with what it holds;
//! * [`helpers`]: what the programs share: ids, counters, record headers and sending, the
//!   processes looked at (`PROCS`, `PROC_GATE`), and the file behind an fd and what it is.
#![no_std]
#![no_main]

mod helpers;
mod maps;
mod probes;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

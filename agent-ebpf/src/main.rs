//! uvmwatch kernel programs.
//!
//! Read-only observers: nothing here changes what a traced process sees. Per-call work is done
//! in the kernel (fd tracking, latency histograms, result counters); only failures, slow calls,
//! calls inside `cuInit` and lifecycle changes of tracked processes reach user space.
//!
//! The tree follows the data path:
//! * [`probes`]: the programs, one file per hook group: `open` (`open`, `openat`, `openat2`: device opens, libcuda
//!   loads), `fd` (`close`, `dup*`, `fcntl`), `ioctl` (driver calls), `cuinit` (the `cuInit`
//!   uprobes), `ctx` (the context and device-count uprobes), `sched` (fork, exec, exit), `kfunc` (the kprobe/kretprobe pairs, one per row
//!   of `uvmwatch_common::kfuncs!`), `floor` (the overhead benchmark's floor reference, which
//!   the agent itself never loads);
//! * [`maps`]: every map, with what it holds;
//! * [`helpers`]: what the programs share: ids, counters, record headers and sending, and the
//!   fd table with its `fork` inheritance.
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

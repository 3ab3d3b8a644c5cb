//! `uvmwatch bench-floor` (hidden): the floor reference of the overhead benchmark
//! (`agent/benches/overhead.rs`, docs/testing.md). It loads the agent's eBPF object with the
//! agent's loader ([`kernel::Kernel::load_floor`]) and its choice of backend
//! (`--probe-backend`), and attaches a floor program, one per-CPU counter increment, to every
//! hook the agent attaches on that backend (tracepoints, or fentry/fexit functions), then
//! waits for SIGTERM or SIGINT. Measured against `uvmwatch run`, the difference is what the
//! agent's program bodies cost; measured against no agent, what the mechanism costs.

use std::{io::Write, process::ExitCode};

use anyhow::{anyhow, Result};

use crate::kernel;

/// Runs the floor until SIGTERM or SIGINT. Prints `floor: attached N of M probes (<backend>
/// backend)` once attached (the benchmark waits for that line), and `floor: hits N` (the
/// program's runs, summed over CPUs) when it stops; exit 0. When a probe does not attach it
/// prints `floor: refused: <backend> backend: <probe> <state>` and exits 1 at once.
///
/// # Errors
/// Not root, or the object could not be loaded.
pub fn bench_floor(g: &super::Global) -> Result<ExitCode> {
    if !kernel::is_root() {
        return Err(anyhow!(
            "loading eBPF programs needs root (CAP_SYS_ADMIN; docs/capabilities.md); run as root"
        ));
    }
    // Blocked before anything else starts a thread, so every thread inherits the mask and
    // the signals stay pending for sigwait below.
    let set = termination_signals();
    // SAFETY: `set` is an initialised signal set.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return Err(anyhow!(
            "pthread_sigmask: {}",
            std::io::Error::last_os_error()
        ));
    }
    let (_, layout) = super::probes::driver_layout(g)?;
    let k = kernel::Kernel::load_floor(&kernel::KernelSettings {
        slow_ioctl_ns: 1_000_000_000,
        layout: &layout,
        failure_events_per_second: kernel::FAILURE_EVENTS_PER_SECOND,
        backend: g.probe_backend,
        absence_facts: kernel::registry::AbsenceFacts::default,
    })?;
    let b = k.backend().clone();
    let rows: Vec<_> = k
        .probe_states()
        .into_iter()
        .filter(|(_, st)| !matches!(st, kernel::registry::ProbeState::Standby(_)))
        .collect();
    let attached = rows.iter().filter(|(_, st)| st.gauge() == 1).count();
    for (s, st) in rows.iter().filter(|(_, st)| st.gauge() == 0) {
        eprintln!("uvmwatch bench-floor: {} {st}", s.label);
    }
    let mut out = std::io::stdout();
    if let Some((s, st)) = rows.iter().find(|(_, st)| st.gauge() == 0) {
        // The backend asked for is refused here: nothing to measure it by.
        writeln!(
            out,
            "floor: refused: {} backend: {} {st}",
            b.backend.name(),
            s.label
        )?;
        return Ok(ExitCode::from(1));
    }
    writeln!(
        out,
        "floor: attached {attached} of {} probes ({} backend)",
        rows.len(),
        b.backend.name()
    )?;
    out.flush()?;
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised and `sig` is a valid out pointer.
    let rc = unsafe { libc::sigwait(&set, &mut sig) };
    if rc != 0 {
        return Err(anyhow!(
            "sigwait: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    writeln!(out, "floor: hits {}", k.floor_hits()?)?;
    drop(k);
    Ok(if attached == rows.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// SIGTERM and SIGINT.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

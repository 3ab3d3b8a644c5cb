//! `uvmwatch probes`: what can attach on this host, and why not; and `uvmwatch probes-doc`,
//! the probe table of `docs/probes.md`.

use std::{path::PathBuf, process::ExitCode};

use crate::event::DriverLayout;
use crate::kernel::registry as probes;
use crate::observer::driver::DriverWatch;
use crate::{host::discovery, kernel};

/// `uvmwatch probes`: loads and attaches for real, prints the table, detaches.
/// Exit 0 when every required probe attached, 1 otherwise, 2 when it could not run.
pub fn probes(libcuda: Vec<PathBuf>, g: &super::Global) -> anyhow::Result<ExitCode> {
    let (said, layout) = driver_layout(g)?;
    println!("{}", driver_line(&said));
    if !kernel::is_root() {
        let rows: Vec<_> = probes::REGISTRY
            .iter()
            .map(|s| {
                (
                    *s,
                    probes::ProbeState::Unavailable("needs root to check".into()),
                )
            })
            .collect();
        print!("{}", probes::render_table(&rows));
        eprintln!("uvmwatch: not root: cannot load eBPF programs (run as root to check for real)");
        return Ok(ExitCode::from(1));
    }
    let mut k = kernel::Kernel::load(&kernel::KernelSettings {
        slow_ioctl_ns: 1_000_000_000,
        layout: &layout,
        failure_events_per_second: kernel::FAILURE_EVENTS_PER_SECOND,
        backend: g.probe_backend,
        absence_facts: crate::observer::diagnosis::probe_absence_facts,
    })?;
    let mut d = discovery::Discovery::new();
    let mut targets: Vec<discovery::LibTarget> = Vec::new();
    for r in d.from_flags(&libcuda) {
        match r {
            Ok(t) => targets.push(t),
            Err(e) => eprintln!("uvmwatch: --libcuda: {e:#}"),
        }
    }
    let proc_root = PathBuf::from("/proc");
    targets.extend(d.from_host(
        &proc_root,
        std::path::Path::new("/etc/ld.so.cache"),
        discovery::DRIVER_DIRS,
    ));
    targets.extend(d.scan_all(&proc_root));
    for t in &targets {
        match k.attach_libcuda(&t.host_path, t.dev, t.ino) {
            Ok(()) => println!("libcuda: {} (probes attach)", t.host_path.display()),
            Err(e) => println!("libcuda: {} (cannot probe: {e:#})", t.host_path.display()),
        }
    }
    if targets.is_empty() {
        println!("libcuda: none found (host ld cache, driver directories, running processes)");
    }
    let b = k.backend();
    println!("syscall hooks: {} backend ({})", b.backend.name(), b.why);
    let rows = k.probe_states();
    print!("{}", probes::render_table(&rows));
    let ok = rows.iter().all(|(s, st)| {
        !s.required || st.gauge() == 1 || matches!(st, probes::ProbeState::Standby(_))
    });
    drop(k);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The driver (as `--driver-version` or the version file gives it) and the ioctl layouts its
/// statuses are read with: what [`kernel::KernelSettings`] needs, for a one-off load.
///
/// # Errors
/// As [`DriverWatch::check`].
pub fn driver_layout(
    g: &super::Global,
) -> anyhow::Result<(DriverLayout, crate::decode::layouts::Layout)> {
    let mut layout = None;
    let said = DriverWatch::new(g.driver(), None)
        .check(|l| {
            layout = Some(l.clone());
            Ok(())
        })?
        .expect("a first check loads");
    Ok((said, layout.expect("chosen by the first check")))
}

/// `uvmwatch probes-doc`: prints the probe table of `docs/probes.md`, or with `update` puts it
/// in that file in place of the one there.
pub fn probes_doc(update: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let Some(path) = update else {
        print!("{}", probes::reference_table());
        return Ok(ExitCode::SUCCESS);
    };
    let page =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let new = probes::with_reference_table(&page).with_context(|| {
        format!(
            "{}: no generated probe table (its marker lines) to replace",
            path.display()
        )
    })?;
    std::fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// The first line of `uvmwatch probes`: the driver and the ioctl layouts its statuses are
/// read with.
fn driver_line(d: &DriverLayout) -> String {
    match (d.driver.as_deref(), d.selection) {
        (Some(v), "exact") => format!("driver: {v} ({}); ioctl layouts: {}", d.source, d.layout),
        (Some(v), _) => format!(
            "driver: {v} ({}); ioctl layouts: {} (nearest known release: {v} is not in the table)",
            d.source, d.layout
        ),
        (None, _) => format!(
            "driver: unknown ({}); ioctl layouts: {} (newest known release)",
            d.source, d.layout
        ),
    }
}

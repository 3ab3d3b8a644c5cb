//! `uvmwatch doctor --probe`: one real `cuInit` under the probes.
//!
//! Loads the agent's kernel programs, attaches the `cuInit` probes to the host's libcuda,
//! runs `cuInit(0)` in a child process (`uvmwatch __cuinit-child <lib>`, which `dlopen`s the
//! library) and records what the probes saw for that child into [`Observations`]. A child
//! still inside `cuInit` at the deadline is a hang: the driver call it is in, its thread
//! state, `wchan` and kernel stack are recorded, then it is killed.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use uvmwatch_common::{DIED_IN_CUINIT, IOCTL_FAILED, OPEN_IN_CUINIT, OPEN_LIBCUDA};

use super::facts::{Observations, SeenCall};
use crate::{
    decode::{
        nvidia,
        record::{self, cstr, Event},
    },
    host::{
        discovery::{self, Discovery},
        procfs,
    },
    kernel::{Kernel, KernelSettings},
};

/// How the probe went, besides the observations.
#[derive(Debug)]
pub struct ProbeRun {
    /// What the probes saw for the child.
    pub observations: Observations,
    /// The library `cuInit` was called through, if one was found.
    pub library: Option<PathBuf>,
    /// One line per notable step, for the report.
    pub notes: Vec<String>,
}

/// Runs the live check. `deadline`: how long `cuInit` may take before it counts as hung.
///
/// # Errors
/// The probes cannot load (not root, no BPF) or the child cannot be started.
pub fn run(libcuda: &[PathBuf], deadline: Duration) -> Result<ProbeRun> {
    let mut notes = Vec::new();
    let mut obs = Observations::default();
    let mut kernel = Kernel::load(&KernelSettings {
        slow_ioctl_ns: 100_000_000,
    })
    .context("loading the probes (doctor --probe needs root)")?;
    for (spec, st) in kernel.probe_states() {
        if st.gauge() == 0 && !matches!(spec.attach, crate::kernel::registry::Attach::Uprobe { .. })
        {
            obs.unavailable_probes.push(format!("{}: {st}", spec.label));
        }
    }
    let mut d = Discovery::new();
    let mut targets: Vec<discovery::LibTarget> = d
        .from_flags(libcuda)
        .into_iter()
        .filter_map(|r| r.ok())
        .collect();
    targets.extend(d.from_host(
        Path::new("/proc"),
        Path::new("/etc/ld.so.cache"),
        discovery::DRIVER_DIRS,
    ));
    let mut lib = None;
    for t in &targets {
        match kernel.attach_libcuda(&t.host_path, t.dev, t.ino) {
            Ok(()) => {
                if lib.is_none() {
                    lib = Some(t.host_path.clone());
                }
            }
            Err(e) => notes.push(format!("cannot probe {}: {e:#}", t.host_path.display())),
        }
    }
    let Some(lib) = lib else {
        obs.unavailable_probes
            .push("uprobe:cuInit: no libcuda found on this host: no cuInit was run".into());
        notes.push("no libcuda.so found (ld cache, driver directories): nothing to run".into());
        return Ok(ProbeRun {
            observations: obs,
            library: None,
            notes,
        });
    };
    let mut ring = kernel.take_events()?;
    let exe = std::env::current_exe().context("locating the uvmwatch binary")?;
    let mut child: Child = Command::new(exe)
        .arg("__cuinit-child")
        .arg(&lib)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the cuInit child")?;
    let pid = child.id();
    obs.pid = Some(pid);
    notes.push(format!(
        "cuInit(0) through {} in child pid {pid}",
        lib.display()
    ));
    let start = Instant::now();
    let mut exited = false;
    loop {
        while let Some(item) = ring.next() {
            if let Ok(ev) = record::decode(&item) {
                record(&mut obs, pid, &ev);
            }
        }
        if !exited {
            if let Ok(Some(_)) = child.try_wait() {
                exited = true;
                // Let the last records arrive.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        } else {
            break;
        }
        if start.elapsed() > deadline {
            hung(&mut obs, &kernel, pid, start.elapsed());
            let _ = child.kill();
            let _ = child.wait();
            notes.push(format!(
                "cuInit still running after {:.0} s: stopped it",
                deadline.as_secs_f64()
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(ring);
    drop(kernel);
    Ok(ProbeRun {
        observations: obs,
        library: Some(lib),
        notes,
    })
}

/// Folds one event of the child into the observations.
fn record(obs: &mut Observations, pid: u32, ev: &Event) {
    match ev {
        Event::CuinitExit(e) if e.header.tgid == pid => {
            obs.cuinit_result = Some(e.ret);
            obs.cuinit_seconds = Some(e.header.ts_ns.saturating_sub(e.start_ns) as f64 / 1e9);
            obs.cuinit_in_flight = false;
        }
        Event::Ioctl(e) if e.header.tgid == pid && e.flags & IOCTL_FAILED != 0 => {
            obs.failed_call = Some(SeenCall {
                call: nvidia::ioctl_display(e.node, e.cmd),
                node: nvidia::node_path(e.node, e.minor),
                result: nvidia::ioctl_result_label(e.result_kind, e.status),
                seconds: e.header.ts_ns.saturating_sub(e.start_ns) as f64 / 1e9,
            });
        }
        Event::Open(e) if e.header.tgid == pid && e.flags & OPEN_LIBCUDA == 0 => {
            if e.ret < 0 {
                obs.failed_opens
                    .push((cstr(&e.path), crate::decode::errno::label((-e.ret) as u32)));
            } else if e.flags & OPEN_IN_CUINIT != 0 {
                obs.device_opens += 1;
            }
        }
        Event::Kfunc(e) if e.header.tgid == pid => {
            let res = if e.kind == uvmwatch_common::result::ERRNO {
                format!("-{} ({})", e.code, crate::decode::errno::label(e.code))
            } else {
                nvidia::nv_status_label(e.code)
            };
            obs.kernel_signals.push(format!(
                "{} = {res}",
                crate::kernel::registry::kfunc_name(e.func)
            ));
        }
        Event::DiedInCall(e) if e.header.tgid == pid && e.what & DIED_IN_CUINIT != 0 => {
            obs.cuinit_in_flight = true;
        }
        _ => {}
    }
}

/// Records a hang: the call the child's thread is inside, and its state in `/proc`.
fn hung(obs: &mut Observations, kernel: &Kernel, pid: u32, elapsed: Duration) {
    obs.cuinit_in_flight = true;
    obs.cuinit_seconds = Some(elapsed.as_secs_f64());
    let cu = kernel.inflight_cuinit().unwrap_or_default();
    let io = kernel.inflight_ioctls().unwrap_or_default();
    let tid = cu
        .iter()
        .find(|(_, c)| c.tgid == pid)
        .map(|(t, _)| *t)
        .or_else(|| io.iter().find(|(_, i)| i.tgid == pid).map(|(t, _)| *t))
        .unwrap_or(pid);
    if let Some((_, i)) = io.iter().find(|(t, _)| *t == tid) {
        obs.stuck_in = Some(SeenCall {
            call: nvidia::ioctl_display(i.node, i.cmd),
            node: nvidia::node_path(i.node, i.minor),
            result: String::new(),
            seconds: crate::clock::monotonic_ns().saturating_sub(i.start_ns) as f64 / 1e9,
        });
    }
    if let Ok(t) = procfs::read_thread(Path::new("/proc"), pid, tid) {
        obs.stuck_wchan = t.wchan;
        obs.stuck_state = Some(format!("{} ({})", t.state, t.state_name));
        obs.stuck_stack = t.kernel_stack.unwrap_or_default();
    }
}

/// Body of the hidden `__cuinit-child LIB` subcommand: `dlopen` the library, call
/// `cuInit(0)` and exit with its result (truncated to 8 bits; 255 when the library or
/// symbol could not be loaded).
pub fn cuinit_child(lib: &Path) -> u8 {
    let Ok(c) = std::ffi::CString::new(lib.as_os_str().as_encoded_bytes()) else {
        return 255;
    };
    // SAFETY: dlopen/dlsym with valid NUL-terminated strings; cuInit has the C signature
    // `CUresult cuInit(unsigned int)` (cuda.h).
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
        if h.is_null() {
            return 255;
        }
        let sym = libc::dlsym(h, c"cuInit".as_ptr());
        if sym.is_null() {
            return 255;
        }
        let f: extern "C" fn(u32) -> i32 = std::mem::transmute(sym);
        let rc = f(0);
        (rc & 0xff) as u8
    }
}

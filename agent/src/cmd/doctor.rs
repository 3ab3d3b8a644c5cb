//! `uvmwatch doctor`: collect the host's facts, diagnose, report; with `--probe`, one real
//! `cuInit` under the observer first ([`probe`]).

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::ValueEnum;

use super::{probe_flags::LibcudaArgs, Global};
use crate::{
    doctor::{facts::Observations, verdict},
    event::{Event, Kind, Listener},
    kernel::registry::Attach,
    observer::{diagnosis, Observer, RunConfig},
};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// The report for people.
    Text,
    /// The report as one JSON document (docs/doctor.md).
    Json,
    /// One line for node-problem-detector, with its exit statuses (same as --npd).
    Npd,
    /// An NVIDIA NVSentinel HealthEvents document (docs/node-verdict.md).
    HealthEvent,
}

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Diagnose a snapshot instead of this machine: a bundle (.tar.gz) or a directory laid
    /// out like the diagnosed machine's file system. Its observations.json (what the probes
    /// saw there), if any, is judged too.
    #[arg(long, value_name = "DIR|FILE")]
    pub root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub format: ReportFormat,
    /// Same as --format json.
    #[arg(long)]
    pub json: bool,
    /// Also save what was read into this bundle (.tar.gz) to re-run elsewhere with --root.
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,
    /// Also run one real cuInit under the probes (root) and diagnose what they saw. With
    /// --root the facts come from the snapshot and the probes still watch this machine (the
    /// snapshot's observations.json is then not used).
    #[arg(long)]
    pub probe: bool,
    /// How long the probed cuInit may take before it counts as hung.
    #[arg(long, default_value = "30s", value_parser = super::positive_duration)]
    pub probe_timeout: Duration,
    /// With --probe: the libcuda to call (default: the host's, from the ld cache).
    #[command(flatten)]
    pub libcuda: LibcudaArgs,
    /// No colour in the text report.
    #[arg(long)]
    pub no_color: bool,
    /// Run as a node-problem-detector custom plugin: print one line (the worst finding) and
    /// exit 0 (ready), 1 (a critical finding) or 2 (could not judge). Same as --format npd.
    #[arg(long)]
    pub npd: bool,
    /// With --npd: most bytes printed (NPD's max_output_length).
    #[arg(long, default_value_t = verdict::NPD_MAX_OUTPUT, value_name = "BYTES")]
    pub npd_max_output: usize,
    /// With --format health-event: ask NVSentinel to act on the events
    /// (EXECUTE_REMEDIATION) instead of only recording them (STORE_ONLY, the default).
    #[arg(long)]
    pub remediate: bool,
    /// Gate a job on this node: run one real cuInit under the probes when root and a libcuda
    /// is found (as --probe), then exit 0 (go: no critical finding), 1 (no-go) or 3 (could
    /// not check).
    #[arg(long)]
    pub pre_job: bool,
}

/// `uvmwatch doctor`: collect, diagnose, report. Exit codes: 0 healthy, 1 warning,
/// 2 critical, 3 could not run or, without a critical finding, the snapshot's
/// observations.json could not be used (docs/doctor.md).
///
/// The observations judged: those of `--probe`; else, with `--root`, the snapshot's
/// `observations.json` (an unusable one is reported and the static facts are judged alone);
/// else none. A bundle written with `--bundle` keeps the observations judged.
pub fn doctor(a: DoctorArgs, g: &Global) -> anyhow::Result<ExitCode> {
    use crate::doctor::{
        bundle, collect, engine, observed::ObservationsSource, report, root::ReadLog, root::Root,
    };
    use std::io::IsTerminal;
    let format = if a.npd {
        ReportFormat::Npd
    } else if a.json {
        ReportFormat::Json
    } else {
        a.format
    };
    // A pre-job check probes where it can: as root, with a libcuda to call.
    let probe_wanted = a.probe || (a.pre_job && pre_job_can_probe());
    let run = || -> anyhow::Result<(engine::Differential, _, _, _, Vec<String>)> {
        let recorder = ReadLog::new();
        let (_tmp, root) = match &a.root {
            Some(p) => bundle::open_bundle(p)?,
            None => (None, Root::live(g.host_root.as_deref())),
        };
        // The snapshot's own observations.json: `None` for this machine or without one.
        let saved = match &root {
            Root::Snapshot(dir) => bundle::read_saved_observations(dir).transpose(),
            _ => None,
        };
        // Its other files that cannot be used, named after what the user gave.
        let snapshot_problems = match (&root, &a.root) {
            (Root::Snapshot(dir), Some(shown)) => bundle::snapshot_problems(dir, shown),
            _ => Vec::new(),
        };
        let root = if a.bundle.is_some() {
            root.recording(&recorder)
        } else {
            root
        };
        let evidence = collect::collect(&root);
        let probed = if probe_wanted {
            let r = probe(&a.libcuda.libcuda, a.probe_timeout, g)?;
            for n in &r.notes {
                eprintln!("uvmwatch doctor --probe: {n}");
            }
            Some(r.observations)
        } else {
            None
        };
        let (observations, source) = ObservationsSource::choose(probed, saved);
        if source.incomplete() {
            eprintln!("uvmwatch doctor: {}", source.summary(&observations));
        }
        if let Some(out) = &a.bundle {
            bundle::write_bundle(
                &recorder,
                &evidence,
                source.kept_in_bundle(&observations),
                out,
            )?;
            eprintln!("uvmwatch doctor: bundle written to {}", out.display());
        }
        let differential = engine::diagnose(&evidence, &observations);
        Ok((
            differential,
            evidence,
            observations,
            source,
            snapshot_problems,
        ))
    };
    match run() {
        Ok((differential, evidence, observations, source, snapshot_problems)) => {
            let r = report::Report {
                differential: &differential,
                evidence: &evidence,
                observations: &observations,
                source: &source,
                snapshot_problems: &snapshot_problems,
            };
            let v = verdict::Verdict::of(&r);
            match format {
                ReportFormat::Json => {
                    let v = report::render_json(&r);
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                ReportFormat::Text => {
                    let color = !a.no_color && std::io::stdout().is_terminal();
                    print!("{}", report::render_text(&r, color));
                }
                ReportFormat::Npd => {
                    println!("{}", verdict::npd_message(&r, a.npd_max_output));
                    return Ok(ExitCode::from(v.npd_exit()));
                }
                ReportFormat::HealthEvent => {
                    let processing = if a.remediate {
                        verdict::Processing::Remediate
                    } else {
                        verdict::Processing::StoreOnly
                    };
                    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
                    let doc =
                        verdict::health_events(&r, &node_name(), &now.to_string(), processing);
                    println!("{}", serde_json::to_string_pretty(&doc)?);
                }
            }
            Ok(ExitCode::from(if a.pre_job {
                v.gate_exit()
            } else {
                r.exit_code()
            }))
        }
        Err(e) => {
            eprintln!("uvmwatch doctor: could not run: {e:#}");
            if format == ReportFormat::Npd {
                // NPD shows standard output as the condition's message.
                println!("unknown: uvmwatch doctor could not run");
                return Ok(ExitCode::from(verdict::Verdict::Unknown.npd_exit()));
            }
            Ok(ExitCode::from(report::EXIT_COULD_NOT_RUN))
        }
    }
}

/// Whether `doctor --pre-job` can run a real `cuInit` here: as root (the probes need it;
/// without a libcuda found the probe says so and the facts are judged alone). Says why not
/// on standard error otherwise.
fn pre_job_can_probe() -> bool {
    let root = crate::kernel::is_root();
    if !root {
        eprintln!("uvmwatch doctor --pre-job: not root: no cuInit probed, the host's facts alone");
    }
    root
}

/// The Kubernetes node name (`NODE_NAME`, set from `spec.nodeName` by the DaemonSet), else
/// the host name.
fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

/// How `doctor --probe` went, besides the observations.
#[derive(Debug)]
pub struct ProbeRun {
    /// What the probes saw of the child.
    pub observations: Observations,
    /// The library `cuInit` was called through, if one was found.
    pub library: Option<PathBuf>,
    /// One line per notable step, for the report.
    pub notes: Vec<String>,
}

/// What the probe's listener keeps: the library to call, and the child's story.
#[derive(Default)]
struct Seen {
    library: Option<PathBuf>,
    notes: Vec<String>,
    /// Probes not attached (uprobes aside: they attach per library).
    unavailable: Vec<String>,
    child: Option<u32>,
    observations: Option<Observations>,
    in_flight_at_exit: bool,
    stalled: bool,
}

/// The listener of `doctor --probe`: the same events as the agent's log, folded into the
/// observations of one process.
struct ProbeListener(Arc<Mutex<Seen>>);

impl Listener for ProbeListener {
    fn event(&mut self, ev: &Arc<Event>) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &ev.kind {
            Kind::LibcudaAttached { host_path, .. } if s.library.is_none() => {
                s.library = Some(PathBuf::from(host_path));
            }
            Kind::LibcudaAttachFailed { path, error } => {
                s.notes.push(format!("cannot probe {path}: {error}"));
            }
            Kind::ProbesChanged { probes, .. } if s.child.is_none() => {
                s.unavailable = probes
                    .iter()
                    .filter(|(spec, st)| {
                        st.gauge() == 0 && !matches!(spec.attach, Attach::Uprobe { .. })
                    })
                    .map(|(spec, st)| format!("{}: {st}", spec.label))
                    .collect();
            }
            _ if s.child.is_none() || ev.pid() != s.child => {}
            Kind::DiedInCall(d) if d.calls.iter().any(|c| c == "cuInit") => {
                s.in_flight_at_exit = true;
            }
            _ => {
                // A `cuInit` that ended, or a stall: each tells the whole story so far.
                if let Some(o) = diagnosis::observations(ev, Vec::new) {
                    s.stalled |= matches!(ev.kind, Kind::Stall(_));
                    s.observations = Some(o);
                }
            }
        }
    }
}

/// `doctor --probe`: loads the observer, attaches the `cuInit` probes to the host's libcuda
/// (or `libcuda`), runs `cuInit(0)` in a child (`uvmwatch __cuinit-child <lib>`, which
/// `dlopen`s the library) and keeps what the probes saw of it. A child still inside `cuInit`
/// after `deadline` is a hang: its stall report (the driver call it is in, its thread state,
/// `wchan` and kernel stack) is kept, then it is killed.
///
/// # Errors
/// The probes cannot load (not root, no BPF) or the child cannot be started.
pub fn probe(libcuda: &[PathBuf], deadline: Duration, g: &Global) -> anyhow::Result<ProbeRun> {
    let cfg = RunConfig {
        driver: g.driver(),
        backend: g.probe_backend,
        cuinit_stall: deadline,
        ioctl_stall: deadline,
        slow_ioctl: Duration::from_millis(100),
        libcuda: libcuda.to_vec(),
        proc_scan: false,
        facts: None,
        ..RunConfig::new()
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let shared = seen.clone();
    let library = rt.block_on(async move {
        let mut observer =
            Observer::load(cfg).context("loading the probes (doctor --probe needs root)")?;
        observer.start(vec![Box::new(ProbeListener(shared.clone()))], "none");
        let lib = shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .library
            .clone();
        let Some(lib) = lib else {
            return anyhow::Ok(None);
        };
        let exe = std::env::current_exe().context("locating the uvmwatch binary")?;
        let mut child = Command::new(exe)
            .arg("__cuinit-child")
            .arg(&lib)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the cuInit child")?;
        let pid = child.id();
        {
            let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
            s.child = Some(pid);
            s.notes.push(format!(
                "cuInit(0) through {} in child pid {pid}",
                lib.display()
            ));
        }
        let start = Instant::now();
        let watch = shared.clone();
        observer
            .run(async move {
                loop {
                    if let Ok(Some(_)) = child.try_wait() {
                        // Let the last records arrive.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        return "child exited";
                    }
                    let stalled = watch.lock().map(|s| s.stalled).unwrap_or(false);
                    // The stall report comes at the deadline; a second more in case the
                    // thread could not be read.
                    if stalled || start.elapsed() > deadline + Duration::from_secs(1) {
                        let _ = child.kill();
                        let _ = child.wait();
                        watch
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .notes
                            .push(format!(
                                "cuInit still running after {:.0} s: stopped it",
                                deadline.as_secs_f64()
                            ));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        return "deadline";
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await?;
        Ok(Some(lib))
    })?;
    let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
    let mut obs = s.observations.take().unwrap_or_default();
    obs.pid = s.child;
    if s.in_flight_at_exit || s.stalled {
        obs.cuinit_in_flight = true;
    }
    obs.unavailable_probes = std::mem::take(&mut s.unavailable);
    if library.is_none() {
        obs.unavailable_probes
            .push("uprobe:cuInit: no libcuda found on this host: no cuInit was run".into());
        s.notes
            .push("no libcuda.so found (ld cache, driver directories): nothing to run".into());
    }
    Ok(ProbeRun {
        observations: obs,
        library,
        notes: std::mem::take(&mut s.notes),
    })
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

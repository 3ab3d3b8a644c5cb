//! `uvmwatch capture`: the agent with a capture file as its only output.

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{probe_flags::ProbeArgs, Global};
use crate::{
    event::Listener,
    export::{
        capture::{CaptureListener, Filter, Format, Progress, DEFAULT_MAX_EVENTS},
        log::LogListener,
    },
    observer::{Observer, RunConfig},
};

/// Arguments of `uvmwatch capture`.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("target").args(["pid", "comm", "container"])))]
pub struct CaptureArgs {
    /// Only this process (host pid).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only processes with this name (`comm`, or the executable's file name).
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Only processes in this container (its id, or a prefix such as the 12 characters
    /// `docker ps` shows).
    #[arg(long, value_name = "ID")]
    pub container: Option<String>,
    /// Stop after this long (e.g. 30s, 5m); without it, capture until Ctrl-C.
    #[arg(long, value_parser = super::positive_duration)]
    pub duration: Option<Duration>,
    /// File format.
    #[arg(long, value_enum, default_value_t = Format::Perfetto)]
    pub format: Format,
    /// The trace file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Keep at most this many events; more are counted as lost (and said so in the trace).
    #[arg(long, default_value_t = DEFAULT_MAX_EVENTS)]
    pub max_events: usize,
}

impl CaptureArgs {
    /// The process filter.
    pub fn filter(&self) -> Filter {
        Filter {
            pid: self.pid,
            comm: self.comm.clone(),
            container: self.container.clone(),
        }
    }
}

/// Redraws one progress line on stderr until `stop` is set. The cursor is left at the
/// start of the line, so a log record printed meanwhile overwrites it instead of being
/// appended to it.
fn progress_loop(p: Arc<Progress>, stop: Arc<AtomicBool>, out: PathBuf) {
    let start = Instant::now();
    let mut err = std::io::stderr();
    while !stop.load(Ordering::Relaxed) {
        let _ = write!(
            err,
            "\r\x1b[2Kuvmwatch capture: {:.1} s, {} events from {} processes, {} dropped{} -> {} (Ctrl-C to stop)\r",
            start.elapsed().as_secs_f64(),
            p.events.load(Ordering::Relaxed),
            p.processes.load(Ordering::Relaxed),
            p.dropped.load(Ordering::Relaxed),
            match p.lost.load(Ordering::Relaxed) {
                0 => String::new(),
                n => format!(", {n} over --max-events"),
            },
            out.display(),
        );
        let _ = err.flush();
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = write!(err, "\r\x1b[2K");
    let _ = err.flush();
}

/// Runs the observer with `listeners` until the duration ends or a signal comes.
async fn run_until_stopped(
    cfg: RunConfig,
    listeners: Vec<Box<dyn Listener>>,
    duration: Option<Duration>,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Our handlers are installed before the observer loads, so an early Ctrl-C does not
    // kill the process before the file is written: the observer stops on the signals it
    // sees once its loop runs; one that came earlier is passed on again until it does.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let run = async move {
        let mut observer = Observer::load(cfg)?;
        observer.start(listeners, "none");
        observer
            .run(async move {
                match duration {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending::<()>().await,
                }
                "duration"
            })
            .await
    };
    tokio::pin!(run);
    let sig = tokio::select! {
        r = &mut run => return r,
        _ = sigint.recv() => libc::SIGINT,
        _ = sigterm.recv() => libc::SIGTERM,
    };
    let mut again = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            r = &mut run => return r,
            _ = again.tick() => {
                // SAFETY: signalling our own process, whose handler is installed above.
                unsafe { libc::kill(libc::getpid(), sig) };
            }
        }
    }
}

/// `uvmwatch capture`: runs the observer with a [`CaptureListener`], shows progress on a
/// terminal, writes the trace at the end. Exit 0 when the file was written.
///
/// # Errors
/// The agent could not start (not root, eBPF load) or the file could not be written.
pub fn capture(args: CaptureArgs, g: &Global) -> Result<ExitCode> {
    let sink = CaptureListener::new(
        args.filter(),
        args.format,
        args.output.clone(),
        args.max_events,
        PathBuf::from("/proc"),
    );
    let progress = sink.progress();
    let cfg = args.probe.run_config(g);
    let listeners: Vec<Box<dyn Listener>> =
        vec![Box::new(sink), Box::new(LogListener::new(g.log_format))];
    let stop = Arc::new(AtomicBool::new(false));
    let shower = std::io::stderr().is_terminal().then(|| {
        let (p, s, o) = (progress.clone(), stop.clone(), args.output.clone());
        std::thread::spawn(move || progress_loop(p, s, o))
    });
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run_until_stopped(cfg, listeners, args.duration)));
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = shower {
        let _ = h.join();
    }
    let written = progress
        .written
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    match (r, written) {
        (Err(e), _) => Err(e),
        (Ok(()), Some(Ok(w))) => {
            crate::write_record!(
                crate::export::log::schema::CAPTURE_WRITTEN,
                path = %w.path.display(),
                events = w.events,
                processes = w.processes,
                dropped_events = w.dropped,
                lost_events = w.lost,
                bytes = w.bytes,
            );
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "uvmwatch capture: wrote {} ({} events, {} processes, {} dropped, {} lost, {} bytes)",
                    w.path.display(),
                    w.events,
                    w.processes,
                    w.dropped,
                    w.lost,
                    w.bytes
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        (Ok(()), Some(Err(e))) => Err(anyhow::anyhow!("writing the capture: {e}")),
        (Ok(()), None) => Err(anyhow::anyhow!(
            "the agent stopped without writing the capture"
        )),
    }
}

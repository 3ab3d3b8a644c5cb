//! `uvmwatch annotate`: merge a capture into a PyTorch profiler (Kineto) trace.

use std::{io::Write, path::PathBuf, process::ExitCode};

use anyhow::{Context, Result};

use crate::export::{
    annotate::{annotate_stream, open_maybe_gz, Options},
    capture,
};

/// Arguments of `uvmwatch annotate`.
#[derive(clap::Args, Debug, Clone)]
pub struct AnnotateArgs {
    /// The PyTorch profiler (Kineto) trace: Chrome JSON, gzip-compressed or not.
    #[arg(long, value_name = "PROFILER.json")]
    pub trace: PathBuf,
    /// The `uvmwatch capture` file of the same run (chrome-json or perfetto).
    #[arg(long, value_name = "FILE")]
    pub capture: PathBuf,
    /// Where to write the annotated trace (gzip-compressed when the name ends in `.gz`).
    #[arg(short = 'o', long = "output", value_name = "OUT.json")]
    pub output: PathBuf,
    /// Use only this captured process (host pid), e.g. when several match the trace.
    #[arg(long, value_name = "HOST_PID")]
    pub pid: Option<u32>,
    /// With --pid: put its events under this pid of the trace instead of the pid the
    /// process sees for itself.
    #[arg(long, value_name = "PID", requires = "pid")]
    pub trace_pid: Option<u32>,
    /// Keep only the uvmwatch events that overlap the profiler's recorded window.
    #[arg(long)]
    pub window_only: bool,
    /// Keep events from before the trace's baseTimeNanoseconds as negative timestamps
    /// (chrome://tracing shows them, Perfetto drops them). By default they are left out,
    /// and slices running across it start at it.
    #[arg(long)]
    pub keep_before_base: bool,
}

/// `uvmwatch annotate`: reads the capture, streams the trace through (twice: surveyed,
/// then copied with the capture's events inserted; memory bounded by the capture whatever
/// the trace's size), writes the output through a temporary file, and says on stderr which
/// process went where.
///
/// # Errors
/// As [`annotate_stream`], or a file cannot be read or written.
pub fn annotate(a: AnnotateArgs) -> Result<ExitCode> {
    let cap = capture::read_capture(&a.capture)?;
    let opts = Options {
        pid: a.pid,
        trace_pid: a.trace_pid,
        window_only: a.window_only,
        keep_before_base: a.keep_before_base,
        capture_name: a
            .capture
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let gz = a.output.extension().is_some_and(|e| e == "gz");
    let mut summary = None;
    capture::write_atomically_with(&a.output, |f| {
        let out = std::io::BufWriter::with_capacity(1 << 16, f);
        let open = || open_maybe_gz(&a.trace);
        let s = if gz {
            let mut z = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            let s = annotate_stream(open, &mut z, &cap, &opts)?;
            z.finish()?.flush()?;
            s
        } else {
            let mut out = out;
            let s = annotate_stream(open, &mut out, &cap, &opts)?;
            out.flush()?;
            s
        };
        summary = Some(s);
        Ok(())
    })
    .with_context(|| format!("annotating {}", a.trace.display()))?;
    let summary = summary.expect("set when the output was written");
    for m in &summary.mapped {
        eprintln!(
            "uvmwatch annotate: {} (host pid {}) -> trace pid {}: {} events",
            m.comm, m.host_pid, m.trace_pid, m.events
        );
    }
    for (pid, why) in &summary.skipped {
        eprintln!("uvmwatch annotate: host pid {pid} left out: {why}");
    }
    if summary.before_base > 0 || summary.clipped > 0 {
        eprintln!(
            "uvmwatch annotate: {} events before the trace's baseTimeNanoseconds left out, {} slices drawn from it (--keep-before-base keeps them as negative times, which Perfetto drops)",
            summary.before_base, summary.clipped
        );
    }
    if summary.outside_window > 0 {
        eprintln!(
            "uvmwatch annotate: {} events outside the profiler's window left out",
            summary.outside_window
        );
    }
    for w in &summary.warnings {
        eprintln!("uvmwatch annotate: warning: {w}");
    }
    eprintln!("uvmwatch annotate: wrote {}", a.output.display());
    Ok(ExitCode::SUCCESS)
}

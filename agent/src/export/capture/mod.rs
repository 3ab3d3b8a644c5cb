//! `uvmwatch capture`: record what the agent observes about some processes into a trace
//! file (Perfetto protobuf or Chrome JSON) to open in ui.perfetto.dev or `chrome://tracing`.
//!
//! The observer runs as in `uvmwatch run` (probes, stall detection, diagnosis) without the
//! HTTP server, for `--duration` or until SIGINT/SIGTERM (`cmd/capture.rs`). A
//! [`CaptureListener`] keeps the events of the processes that match the [`Filter`] in a
//! [`TraceBuilder`] (`builder.rs`), which builds the trace model (`model.rs`); at the end it
//! writes the file, Perfetto protobuf (`perfetto.rs`) or Chrome JSON (`chrome.rs`), through
//! a temporary file and a rename, so an interrupted capture still leaves a complete, valid
//! trace. See `docs/capture.md`.

pub mod builder;
pub mod chrome;
pub mod model;
pub mod perfetto;
#[cfg(test)]
pub(crate) mod testing;

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use anyhow::{Context, Result};

use crate::event::{Clock, Event, Listener, Process};
use builder::TraceBuilder;
use model::{Capture, Meta};

/// Events a capture keeps at most by default; more are counted as lost.
pub const DEFAULT_MAX_EVENTS: usize = 2_000_000;

/// Trace file format.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Perfetto protobuf trace (`.pftrace`).
    Perfetto,
    /// Chrome JSON trace (Trace Event Format).
    ChromeJson,
}

/// Which processes a capture keeps. Empty: all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Host pid.
    pub pid: Option<u32>,
    /// `comm`, or the executable's file name.
    pub comm: Option<String>,
    /// Container id, or a prefix of it (`lxc:<name>` for LXC).
    pub container: Option<String>,
}

/// `comm` as the kernel keeps it: at most 15 bytes.
fn comm_of(name: &str) -> &str {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl Filter {
    /// Whether the process is one to keep.
    pub fn matches(&self, p: &Process) -> bool {
        if let Some(pid) = self.pid {
            if p.pid != pid {
                return false;
            }
        }
        if let Some(c) = &self.comm {
            let exe_name = Path::new(&p.exe)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if p.comm != *c && p.comm != comm_of(c) && exe_name != *c {
                return false;
            }
        }
        if let Some(want) = &self.container {
            match &p.container_id {
                Some(id) if !want.is_empty() && id.starts_with(want.as_str()) => {}
                _ => return false,
            }
        }
        true
    }

    /// The filter as written into the trace: `all`, or `pid=…`, `comm=…`, `container=…`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.pid {
            parts.push(format!("pid={p}"));
        }
        if let Some(c) = &self.comm {
            parts.push(format!("comm={c}"));
        }
        if let Some(c) = &self.container {
            parts.push(format!("container={c}"));
        }
        if parts.is_empty() {
            "all".into()
        } else {
            parts.join(",")
        }
    }
}

/// Counters shared with the progress display, and the result of the last write.
#[derive(Debug, Default)]
pub struct Progress {
    /// Events kept.
    pub events: AtomicU64,
    /// Processes seen.
    pub processes: AtomicU64,
    /// Drop total reported by the agent.
    pub dropped: AtomicU64,
    /// Events over the limit.
    pub lost: AtomicU64,
    /// Outcome of the last write (`None` before the first).
    pub written: Mutex<Option<std::result::Result<Written, String>>>,
}

/// What a write put in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The file.
    pub path: PathBuf,
    /// Events in it (all kinds, the capture's own records included).
    pub events: usize,
    /// Processes in it.
    pub processes: usize,
    /// Events dropped before user space (all processes).
    pub dropped: u64,
    /// Events over the limit.
    pub lost: u64,
    /// File size in bytes.
    pub bytes: u64,
}

/// The [`Listener`] of `uvmwatch capture`: filters, records, and writes the file on
/// [`Listener::flush`].
pub struct CaptureListener {
    filter: Filter,
    builder: TraceBuilder,
    format: Format,
    out: PathBuf,
    progress: Arc<Progress>,
}

/// Reads `/proc/<pid>/task/<tid>/comm` under `proc_root`.
fn thread_name(proc_root: &Path, pid: u32, tid: u32) -> Option<String> {
    let p = proc_root
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string())
        .join("comm");
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// `CLOCK_BOOTTIME - CLOCK_MONOTONIC` now, in ns.
fn boottime_minus_monotonic() -> i128 {
    let read = |id| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid pointer to a timespec.
        unsafe { libc::clock_gettime(id, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let mono = read(libc::CLOCK_MONOTONIC);
    let boot = read(libc::CLOCK_BOOTTIME);
    boot - mono
}

impl CaptureListener {
    /// A sink writing `out` in `format`; measures the clock offset now. Thread names are
    /// read from `proc_root` (`/proc`).
    pub fn new(
        filter: Filter,
        format: Format,
        out: PathBuf,
        max_events: usize,
        proc_root: PathBuf,
    ) -> CaptureListener {
        let clock = Clock::measure();
        let boottime = (clock.mono_ns as i128 + boottime_minus_monotonic()).max(0) as u64;
        let meta = Meta::starting(clock, boottime, filter.describe(), std::process::id());
        let namer = Box::new(move |pid, tid| thread_name(&proc_root, pid, tid));
        CaptureListener::with_builder(
            filter,
            format,
            out,
            TraceBuilder::new(meta, max_events, namer),
        )
    }

    /// A sink around a given trace builder (tests: fixed clock and thread names).
    pub fn with_builder(
        filter: Filter,
        format: Format,
        out: PathBuf,
        builder: TraceBuilder,
    ) -> CaptureListener {
        CaptureListener {
            filter,
            builder,
            format,
            out,
            progress: Arc::new(Progress::default()),
        }
    }

    /// The counters and write outcome, shared.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// The capture as it stands, ended at `end_ns`.
    pub fn capture(&self, end_ns: u64) -> Capture {
        self.builder.build(end_ns)
    }

    /// Records one event when its process matches (drop totals always), dated `now_ns`.
    pub fn record(&mut self, ev: &Event, now_ns: u64) {
        if let Some(p) = &ev.process {
            if !self.filter.matches(p) {
                return;
            }
        }
        self.builder.record(ev, now_ns);
        let p = &self.progress;
        p.events
            .store(self.builder.recorded() as u64, Ordering::Relaxed);
        p.processes
            .store(self.builder.process_count() as u64, Ordering::Relaxed);
        p.dropped.store(self.builder.dropped(), Ordering::Relaxed);
        p.lost.store(self.builder.lost(), Ordering::Relaxed);
    }

    /// Writes the capture, ended at `end_ns`, to the output file.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&self, end_ns: u64) -> Result<Written> {
        let c = self.capture(end_ns);
        let bytes = encode(&c, self.format);
        write_atomically(&self.out, &bytes)?;
        Ok(Written {
            path: self.out.clone(),
            events: c.events.len(),
            processes: c.processes.len(),
            dropped: c.meta.dropped_events,
            lost: c.meta.lost_events,
            bytes: bytes.len() as u64,
        })
    }
}

impl Listener for CaptureListener {
    fn event(&mut self, ev: &std::sync::Arc<Event>) {
        self.record(ev, crate::clock::monotonic_ns());
    }

    fn flush(&mut self) {
        let r = self
            .write(crate::clock::monotonic_ns())
            .map_err(|e| format!("{e:#}"));
        if let Err(e) = &r {
            crate::write_record!(
                crate::export::log::schema::CAPTURE_WRITE_FAILED,
                path = %self.out.display(),
                error = %e,
            );
        }
        *self
            .progress
            .written
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(r);
    }
}

/// The capture in `format`.
pub fn encode(c: &Capture, format: Format) -> Vec<u8> {
    match format {
        Format::Perfetto => perfetto::encode(c),
        Format::ChromeJson => chrome::encode(c).into_bytes(),
    }
}

/// Reads a capture file in either format (told apart by content; gzip accepted).
///
/// # Errors
/// Unreadable, or not a uvmwatch capture.
pub fn read_capture(path: &Path) -> Result<Capture> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    decode_capture(&bytes).with_context(|| format!("{}", path.display()))
}

/// [`read_capture`] on bytes.
///
/// # Errors
/// Not a uvmwatch capture.
pub fn decode_capture(bytes: &[u8]) -> Result<Capture> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out)
            .context("gzip")?;
        return decode_capture(&out);
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        let text = std::str::from_utf8(bytes).context("JSON capture is not UTF-8")?;
        chrome::decode(text)
    } else {
        perfetto::decode(bytes)
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`: readers
/// never see a partial file.
///
/// # Errors
/// The directory is not writable, or the disk is full.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically_with(path, |f| f.write_all(bytes).map_err(Into::into))
}

/// [`write_atomically`] of what `write` writes to the temporary file (a stream of any
/// size): renamed over `path` only when `write` succeeds.
///
/// # Errors
/// `write` fails, or the file cannot be created, synced or renamed.
pub fn write_atomically_with(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "capture".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let r = (|| -> Result<()> {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        write(&mut f).with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::testing as ev;
    use crate::export::capture::testing::{test_clock, workload};

    fn proc(pid: u32, comm: &str, exe: &str, container: Option<&str>) -> Process {
        Process {
            pid,
            comm: comm.into(),
            exe: exe.into(),
            container_id: container.map(str::to_string),
            ..Process::default()
        }
    }

    #[test]
    fn filter_by_pid_comm_and_container() {
        let a = proc(10, "cuda-workload", "/opt/cuda-workload", None);
        let b = proc(
            11,
            "python3",
            "/usr/bin/python3.11",
            Some("3f1c0ffee0ddba11"),
        );
        let c = proc(
            12,
            "very-long-name-",
            "/opt/very-long-name-of-a-binary",
            None,
        );
        assert!(Filter::default().matches(&a));
        let f = Filter {
            pid: Some(11),
            ..Filter::default()
        };
        assert!(!f.matches(&a) && f.matches(&b));
        let f = Filter {
            comm: Some("cuda-workload".into()),
            ..Filter::default()
        };
        assert!(f.matches(&a) && !f.matches(&b));
        let f = Filter {
            comm: Some("python3.11".into()),
            ..Filter::default()
        };
        assert!(f.matches(&b), "executable file name");
        let f = Filter {
            comm: Some("very-long-name-of-a-binary".into()),
            ..Filter::default()
        };
        assert!(f.matches(&c), "comm truncated to 15 bytes, or the exe name");
        let f = Filter {
            container: Some("3f1c0ffee0dd".into()),
            ..Filter::default()
        };
        assert!(f.matches(&b) && !f.matches(&a));
        let f = Filter {
            container: Some(String::new()),
            ..Filter::default()
        };
        assert!(!f.matches(&b));
        assert_eq!(Filter::default().describe(), "all");
        assert_eq!(
            Filter {
                comm: Some("x".into()),
                ..Filter::default()
            }
            .describe(),
            "comm=x"
        );
    }

    fn sink(dir: &Path, format: Format, filter: Filter) -> CaptureListener {
        let clock = test_clock();
        let meta = Meta::starting(clock, clock.mono_ns, filter.describe(), 1);
        let ext = match format {
            Format::Perfetto => "pftrace",
            Format::ChromeJson => "json",
        };
        CaptureListener::with_builder(
            filter,
            format,
            dir.join(format!("out.{ext}")),
            TraceBuilder::new(meta, 100, Box::new(|_, _| None)),
        )
    }

    #[test]
    fn sink_filters_writes_atomically_and_reads_back_in_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        for format in [Format::Perfetto, Format::ChromeJson] {
            let mut s = sink(
                dir.path(),
                format,
                Filter {
                    pid: Some(4242),
                    ..Filter::default()
                },
            );
            let p = workload();
            let other = std::sync::Arc::new(proc(1, "init", "/sbin/init", None));
            let t = test_clock().mono_ns;
            for who in [&p, &other] {
                s.record(
                    &ev::ioctl(
                        who,
                        who.pid,
                        t + 10,
                        t + 20,
                        "UVM_INITIALIZE",
                        "/dev/nvidia-uvm",
                        "NV_OK",
                        false,
                        false,
                    ),
                    t,
                );
            }
            s.record(&ev::scan(t + 30, 2), t + 30);
            let progress = s.progress();
            s.flush();
            let w = progress.written.lock().unwrap().clone().unwrap().unwrap();
            assert_eq!(w.processes, 1);
            assert_eq!(w.dropped, 2);
            let c = read_capture(&w.path).unwrap();
            assert_eq!(c.processes.len(), 1);
            assert_eq!(c.processes[0].pid, 4242);
            assert_eq!(c.meta.dropped_events, 2);
            assert!(c.events.iter().any(|e| e.name == "UVM_INITIALIZE"));
            let leftovers: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect();
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }

    #[test]
    fn a_write_failure_is_reported() {
        let s = CaptureListener::with_builder(
            Filter::default(),
            Format::ChromeJson,
            PathBuf::from("/nonexistent-dir/x.json"),
            TraceBuilder::new(
                Meta::starting(test_clock(), 0, "all".into(), 1),
                10,
                Box::new(|_, _| None),
            ),
        );
        assert!(s.write(test_clock().mono_ns).is_err());
    }

    #[test]
    fn gzip_captures_are_read() {
        let c = crate::export::capture::testing::story();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&encode(&c, Format::ChromeJson)).unwrap();
        let bytes = gz.finish().unwrap();
        assert_eq!(decode_capture(&bytes).unwrap(), c);
        assert_eq!(decode_capture(&encode(&c, Format::Perfetto)).unwrap(), c);
    }
}

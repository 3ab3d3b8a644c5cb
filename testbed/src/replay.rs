//! Replays of real recorded CUDA starts (`testbed/replays/*.replay`): the parser, and
//! ([`run`]) what a run of one needs: parameter layouts per driver version, statuses to
//! plant, the step file the fake `libcuda.so.1` reads, and the calls a run is expected to
//! make.
//!
//! The line format is defined in `testbed/replays/README.md`. Every error names the file
//! and line ([`ParseError`]).
//!
//! Over 800 lines: the line model (a replay, its steps) and its one parser, which checks
//! every kind of line against the others (sources, coverage, opens, ioctls, statuses) and
//! so reads as one piece; what a run needs is in `replay/run.rs`, the unit tests in
//! `replay/tests.rs`, the replays run end to end in `testbed/tests/testbed.rs`.
//!
//! ```
//! use uvmwatch_testbed::replay::Replay;
//! let r = Replay::load("535.104.05-h100-cumemory").unwrap();
//! assert_eq!(r.driver, "535.104.05");
//! assert!(r.ioctls().any(|(_, i)| i.request == 0x25));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::rules::parse_errno;

pub mod run;

pub use run::{
    parse_server_log, parse_trace, Call, Expected, IoctlLayout, PlannedIoctl, ReplayRun,
    ServerCall, ServerLogEntry, Target, CUINIT_LAYOUT,
};

/// Every replay file of `testbed/replays/`, by name (the file stem), embedded so that any
/// crate can load them wherever it runs.
pub const REPLAY_FILES: &[(&str, &str)] = &[
    (
        "450.80.02-t4-centos7-uvm-eperm",
        include_str!("../replays/450.80.02-t4-centos7-uvm-eperm.replay"),
    ),
    (
        "535.104.05-h100-cumemory",
        include_str!("../replays/535.104.05-h100-cumemory.replay"),
    ),
    (
        "535.261.03-gpuless-qemu-cuinit",
        include_str!("../replays/535.261.03-gpuless-qemu-cuinit.replay"),
    ),
    (
        "535.261.03-gpuless-qemu-uvm-eacces",
        include_str!("../replays/535.261.03-gpuless-qemu-uvm-eacces.replay"),
    ),
    (
        "550.163.01-gpuless-qemu-cuinit",
        include_str!("../replays/550.163.01-gpuless-qemu-cuinit.replay"),
    ),
    (
        "545.29.06-gtx1650ti-primer",
        include_str!("../replays/545.29.06-gtx1650ti-primer.replay"),
    ),
    (
        "555.42.02-gtx1080ti-fragment",
        include_str!("../replays/555.42.02-gtx1080ti-fragment.replay"),
    ),
    (
        "580.95.05-rtx3060-uvm-eio",
        include_str!("../replays/580.95.05-rtx3060-uvm-eio.replay"),
    ),
];

/// The directory of the replay files in this repository.
pub const REPLAY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/replays");

/// `_IOC_NR` of `NV_ESC_RM_CONTROL`.
const NV_ESC_RM_CONTROL_NR: u32 = 0x2a;

/// A parse error: file, 1-based line (0 when the file as a whole is wrong) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// File name as given to the parser, e.g. `testbed/replays/x.replay`.
    pub file: String,
    /// 1-based line number; 0 for an error about the whole file.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// A `source` line: where the capture is, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `https://` address.
    pub url: String,
    /// Free text after the address (may be empty).
    pub what: String,
}

/// How much of the recorded run is replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every device call of the run.
    Whole,
    /// Only some (the notes say which).
    Partial,
}

/// Whether the request numbers are the recorder's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requests {
    /// As recorded.
    Recorded,
    /// Rebuilt: the recorder did not show full request numbers (the notes say how).
    Derived,
}

/// The system call an open was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenSyscall {
    /// `open(2)` (glibc before 2.26, e.g. CentOS 7 images).
    Open,
    /// `openat(2)`.
    Openat,
    /// `openat2(2)`.
    Openat2,
}

impl OpenSyscall {
    /// The name used in replay files and step files.
    pub fn as_str(self) -> &'static str {
        match self {
            OpenSyscall::Open => "open",
            OpenSyscall::Openat => "openat",
            OpenSyscall::Openat2 => "openat2",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "open" => Some(OpenSyscall::Open),
            "openat" => Some(OpenSyscall::Openat),
            "openat2" => Some(OpenSyscall::Openat2),
            _ => None,
        }
    }
}

/// What an open returned in the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenResult {
    /// A descriptor (the capture's own number).
    Fd(i32),
    /// A failure with this errno (positive).
    Errno(i32),
}

/// An `open` step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStep {
    /// Node path, e.g. `/dev/nvidia-uvm`.
    pub path: String,
    /// Flags as numbers (`O_RDWR | O_CLOEXEC` = `0x80002`).
    pub flags: i32,
    /// Flags as written in the file.
    pub flags_text: String,
    /// The system call.
    pub syscall: OpenSyscall,
    /// The recorded result.
    pub result: OpenResult,
}

/// An `ioctl` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlStep {
    /// Descriptor (the capture's own number; negative: `-errno` of a failed open).
    pub fd: i32,
    /// Request number.
    pub request: u32,
    /// Params size the capture shows, for a plain-integer request (`Some(0)`: NULL).
    pub size: Option<u32>,
    /// `NV_ESC_RM_CONTROL` command the capture shows.
    pub ctrl: Option<u32>,
    /// This call is the driver version query.
    pub version_query: bool,
    /// The request number was rebuilt, not recorded.
    pub derived: bool,
}

impl IoctlStep {
    /// Whether the request is `_IOC`-encoded with a direction (an RM request): then its
    /// params size is `_IOC_SIZE(request)`.
    pub fn is_ioc_encoded(&self) -> bool {
        ioc_dir(self.request) != 0
    }
}

/// `_IOC_DIR` of a request (0: none).
pub fn ioc_dir(request: u32) -> u32 {
    request >> 30
}

/// `_IOC_SIZE` of a request.
pub fn ioc_size(request: u32) -> u32 {
    (request >> 16) & 0x3fff
}

/// One step of a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// `open <path> <flags> <syscall> -> ...`.
    Open(OpenStep),
    /// `close <fd>`.
    Close {
        /// The capture's descriptor.
        fd: i32,
    },
    /// `ioctl <fd> <request> ...`.
    Ioctl(IoctlStep),
}

/// A step and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1-based line in the file.
    pub line: usize,
    /// The step or, for an open, its result, was deduced rather than recorded.
    pub inferred: bool,
    /// What it does.
    pub kind: StepKind,
}

/// A parsed replay file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Name (the file stem), e.g. `535.104.05-h100-cumemory`.
    pub name: String,
    /// File name used in error messages.
    pub file: String,
    /// `source` lines.
    pub sources: Vec<Source>,
    /// Driver version, e.g. `535.104.05`.
    pub driver: String,
    /// GPU model(s).
    pub gpu: Option<String>,
    /// What recorded it (`strace`, `nvtrace`, ...).
    pub recorder: String,
    /// The traced program.
    pub process: Option<String>,
    /// Whole or partial.
    pub coverage: Coverage,
    /// Whether request numbers are recorded or rebuilt.
    pub requests: Requests,
    /// `note` lines.
    pub notes: Vec<String>,
    /// The steps, in recorded order.
    pub steps: Vec<Step>,
}

impl Replay {
    /// Loads an embedded replay by name (see [`REPLAY_FILES`]).
    ///
    /// # Errors
    /// No such replay, or it does not parse.
    pub fn load(name: &str) -> Result<Replay, ParseError> {
        let file = format!("testbed/replays/{name}.replay");
        let (_, text) = REPLAY_FILES
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ParseError {
                file: file.clone(),
                line: 0,
                message: format!(
                    "no replay named '{name}' (known: {})",
                    Self::names().join(", ")
                ),
            })?;
        Self::parse(name, &file, text)
    }

    /// Reads and parses a replay file from disk.
    ///
    /// # Errors
    /// It cannot be read, or does not parse.
    pub fn load_file(path: &Path) -> Result<Replay, ParseError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ParseError {
            file: file.clone(),
            line: 0,
            message: format!("cannot read: {e}"),
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::parse(&name, &file, &text)
    }

    /// The names of the embedded replays.
    pub fn names() -> Vec<&'static str> {
        REPLAY_FILES.iter().map(|(n, _)| *n).collect()
    }

    /// Every embedded replay, parsed.
    ///
    /// # Errors
    /// One does not parse.
    pub fn all() -> Result<Vec<Replay>, ParseError> {
        Self::names().into_iter().map(Self::load).collect()
    }

    /// Parses `text`; `name` and `file` go into the result and the error messages.
    ///
    /// # Errors
    /// The first bad line, as `file:line: message`.
    pub fn parse(name: &str, file: &str, text: &str) -> Result<Replay, ParseError> {
        Parser::new(file).parse(name, text)
    }

    /// The ioctl steps with their lines.
    pub fn ioctls(&self) -> impl Iterator<Item = (usize, &IoctlStep)> {
        self.steps.iter().filter_map(|s| match &s.kind {
            StepKind::Ioctl(i) => Some((s.line, i)),
            _ => None,
        })
    }

    /// The open steps with their lines.
    pub fn opens(&self) -> impl Iterator<Item = (usize, &OpenStep)> {
        self.steps.iter().filter_map(|s| match &s.kind {
            StepKind::Open(o) => Some((s.line, o)),
            _ => None,
        })
    }

    /// The node each capture descriptor names at each ioctl step, in order: `(line, path or
    /// None for a negative descriptor, step)`.
    pub fn ioctl_nodes(&self) -> Vec<(usize, Option<String>, IoctlStep)> {
        let mut open: BTreeMap<i32, String> = BTreeMap::new();
        let mut out = Vec::new();
        for step in &self.steps {
            match &step.kind {
                StepKind::Open(o) => {
                    if let OpenResult::Fd(fd) = o.result {
                        open.insert(fd, o.path.clone());
                    }
                }
                StepKind::Close { fd } => {
                    open.remove(fd);
                }
                StepKind::Ioctl(i) => out.push((step.line, open.get(&i.fd).cloned(), *i)),
            }
        }
        out
    }
}

struct Parser<'a> {
    file: &'a str,
}

/// Header values seen so far.
#[derive(Default)]
struct Header {
    sources: Vec<Source>,
    driver: Option<String>,
    gpu: Option<String>,
    recorder: Option<String>,
    process: Option<String>,
    coverage: Option<Coverage>,
    requests: Option<Requests>,
    notes: Vec<String>,
}

impl<'a> Parser<'a> {
    fn new(file: &'a str) -> Self {
        Parser { file }
    }

    fn err(&self, line: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    fn parse(&self, name: &str, text: &str) -> Result<Replay, ParseError> {
        let mut h = Header::default();
        let mut steps: Vec<Step> = Vec::new();
        // Descriptors open at this point (capture numbers), and errnos of failed opens.
        let mut open_fds: BTreeMap<i32, String> = BTreeMap::new();
        let mut failed_errnos: Vec<i32> = Vec::new();
        let mut last_line = 0;
        for (index, raw) in text.lines().enumerate() {
            let n = index + 1;
            last_line = n;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim();
            let is_step = matches!(keyword, "open" | "close" | "ioctl");
            if !is_step && !steps.is_empty() {
                return Err(self.err(n, format!("header line '{keyword}' after the first step")));
            }
            match keyword {
                "source" => {
                    let (url, what) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                    if !url.starts_with("https://") || url.len() <= "https://".len() {
                        return Err(
                            self.err(n, format!("source needs an https:// address, got '{url}'"))
                        );
                    }
                    h.sources.push(Source {
                        url: url.to_string(),
                        what: what.trim().to_string(),
                    });
                }
                "driver" => {
                    self.once(n, "driver", h.driver.is_some())?;
                    if !is_version(rest) {
                        return Err(self.err(
                            n,
                            format!(
                                "bad driver version '{rest}' (digits and dots, e.g. 535.104.05)"
                            ),
                        ));
                    }
                    h.driver = Some(rest.to_string());
                }
                "gpu" => {
                    self.once(n, "gpu", h.gpu.is_some())?;
                    self.nonempty(n, "gpu", rest)?;
                    h.gpu = Some(rest.to_string());
                }
                "recorder" => {
                    self.once(n, "recorder", h.recorder.is_some())?;
                    if rest.is_empty()
                        || !rest
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    {
                        return Err(self.err(n, format!("bad recorder '{rest}' (one word: strace, gvisor-strace, nvtrace, ...)")));
                    }
                    h.recorder = Some(rest.to_string());
                }
                "process" => {
                    self.once(n, "process", h.process.is_some())?;
                    self.nonempty(n, "process", rest)?;
                    h.process = Some(rest.to_string());
                }
                "coverage" => {
                    self.once(n, "coverage", h.coverage.is_some())?;
                    h.coverage = Some(match rest {
                        "whole" => Coverage::Whole,
                        "partial" => Coverage::Partial,
                        _ => {
                            return Err(self.err(
                                n,
                                format!("coverage must be 'whole' or 'partial', got '{rest}'"),
                            ))
                        }
                    });
                }
                "requests" => {
                    self.once(n, "requests", h.requests.is_some())?;
                    h.requests = Some(match rest {
                        "recorded" => Requests::Recorded,
                        "derived" => Requests::Derived,
                        _ => {
                            return Err(self.err(
                                n,
                                format!("requests must be 'recorded' or 'derived', got '{rest}'"),
                            ))
                        }
                    });
                }
                "note" => {
                    self.nonempty(n, "note", rest)?;
                    h.notes.push(rest.to_string());
                }
                "open" | "close" | "ioctl" => {
                    if steps.is_empty() {
                        self.check_header(n, &h)?;
                    }
                    let step = self.step(n, keyword, rest)?;
                    self.track(&step, &mut open_fds, &mut failed_errnos)?;
                    steps.push(step);
                }
                other => return Err(self.err(n, format!("unknown keyword '{other}'"))),
            }
        }
        if steps.is_empty() {
            self.check_header(last_line.max(1), &h)?;
            return Err(self.err(last_line.max(1), "no steps (open, close, ioctl)"));
        }
        Ok(Replay {
            name: name.to_string(),
            file: self.file.to_string(),
            sources: h.sources,
            driver: h.driver.expect("checked"),
            gpu: h.gpu,
            recorder: h.recorder.expect("checked"),
            process: h.process,
            coverage: h.coverage.expect("checked"),
            requests: h.requests.unwrap_or(Requests::Recorded),
            notes: h.notes,
            steps,
        })
    }

    fn once(&self, n: usize, what: &str, seen: bool) -> Result<(), ParseError> {
        if seen {
            return Err(self.err(n, format!("second '{what}' line")));
        }
        Ok(())
    }

    fn nonempty(&self, n: usize, what: &str, rest: &str) -> Result<(), ParseError> {
        if rest.is_empty() {
            return Err(self.err(n, format!("'{what}' needs a text")));
        }
        Ok(())
    }

    fn check_header(&self, n: usize, h: &Header) -> Result<(), ParseError> {
        let missing = [
            ("source", h.sources.is_empty()),
            ("driver", h.driver.is_none()),
            ("recorder", h.recorder.is_none()),
            ("coverage", h.coverage.is_none()),
        ];
        if let Some((what, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(self.err(
                n,
                format!("header has no '{what}' line before the first step"),
            ));
        }
        Ok(())
    }

    fn step(&self, n: usize, keyword: &str, rest: &str) -> Result<Step, ParseError> {
        let mut words: Vec<&str> = rest.split_whitespace().collect();
        let inferred = words.last() == Some(&"inferred");
        if inferred {
            words.pop();
        }
        let kind = match keyword {
            "open" => StepKind::Open(self.open(n, &words)?),
            "close" => {
                let [fd] = words[..] else {
                    return Err(self.err(n, "close takes one descriptor: close <fd> [inferred]"));
                };
                StepKind::Close {
                    fd: self.fd(n, fd)?,
                }
            }
            _ => StepKind::Ioctl(self.ioctl(n, &words)?),
        };
        Ok(Step {
            line: n,
            inferred,
            kind,
        })
    }

    fn open(&self, n: usize, words: &[&str]) -> Result<OpenStep, ParseError> {
        let usage = "open <path> <flags> <open|openat|openat2> -> fd <N> | -> <ERRNO> [inferred]";
        enum Written<'w> {
            Fd(&'w str),
            Errno(&'w str),
        }
        let (path, flags_text, syscall, result) = match words {
            [p, f, s, "->", "fd", fd] => (p, f, s, Written::Fd(fd)),
            [p, f, s, "->", errno] => (p, f, s, Written::Errno(errno)),
            _ => return Err(self.err(n, format!("bad open step; expected: {usage}"))),
        };
        if !path.starts_with("/dev/") || path.len() <= 5 {
            return Err(self.err(
                n,
                format!("open path must be a node under /dev/, got '{path}'"),
            ));
        }
        let flags = parse_flags(flags_text).map_err(|m| self.err(n, m))?;
        let syscall = OpenSyscall::parse(syscall).ok_or_else(|| {
            self.err(
                n,
                format!("unknown open system call '{syscall}' (open, openat, openat2)"),
            )
        })?;
        let result = match result {
            Written::Fd(fd) => {
                let fd = self.fd(n, fd)?;
                if fd < 0 {
                    return Err(self.err(n, format!("an open returns a descriptor >= 0, got {fd}")));
                }
                OpenResult::Fd(fd)
            }
            Written::Errno(errno) => {
                if !errno.starts_with('E') {
                    return Err(self.err(
                        n,
                        format!("open result must be 'fd <N>' or an errno name, got '{errno}'"),
                    ));
                }
                OpenResult::Errno(parse_errno(errno).map_err(|e| self.err(n, e.to_string()))?)
            }
        };
        Ok(OpenStep {
            path: path.to_string(),
            flags,
            flags_text: flags_text.to_string(),
            syscall,
            result,
        })
    }

    fn ioctl(&self, n: usize, words: &[&str]) -> Result<IoctlStep, ParseError> {
        let usage =
            "ioctl <fd> <request> [size <bytes>] [ctrl <cmd>] [version-query] [derived] [inferred]";
        let [fd, request, rest @ ..] = words else {
            return Err(self.err(n, format!("bad ioctl step; expected: {usage}")));
        };
        let fd = self.fd(n, fd)?;
        let request = self.hex(n, "request", request)?;
        let mut step = IoctlStep {
            fd,
            request,
            size: None,
            ctrl: None,
            version_query: false,
            derived: false,
        };
        let mut i = 0;
        while i < rest.len() {
            match rest[i] {
                "size" | "ctrl" => {
                    let Some(value) = rest.get(i + 1) else {
                        return Err(self.err(n, format!("'{}' needs a value", rest[i])));
                    };
                    if rest[i] == "size" {
                        self.once(n, "size", step.size.is_some())?;
                        let size: u32 = value.parse().map_err(|_| {
                            self.err(n, format!("bad size '{value}' (bytes, decimal)"))
                        })?;
                        step.size = Some(size);
                    } else {
                        self.once(n, "ctrl", step.ctrl.is_some())?;
                        step.ctrl = Some(self.hex(n, "ctrl", value)?);
                    }
                    i += 2;
                }
                "version-query" => {
                    step.version_query = true;
                    i += 1;
                }
                "derived" => {
                    step.derived = true;
                    i += 1;
                }
                other => {
                    return Err(self.err(
                        n,
                        format!("unknown ioctl field '{other}'; expected: {usage}"),
                    ))
                }
            }
        }
        if step.is_ioc_encoded() && step.size.is_some() {
            return Err(self.err(
                n,
                format!(
                    "size given for {request:#x}, whose size is in the request ({} bytes); size is only for plain-integer (UVM) requests",
                    ioc_size(request)
                ),
            ));
        }
        if step.ctrl.is_some()
            && !(step.is_ioc_encoded()
                && request & 0xff == NV_ESC_RM_CONTROL_NR
                && (request >> 8) & 0xff == u32::from(b'F'))
        {
            return Err(self.err(
                n,
                format!("ctrl given for {request:#x}, which is not NV_ESC_RM_CONTROL"),
            ));
        }
        Ok(step)
    }

    fn fd(&self, n: usize, s: &str) -> Result<i32, ParseError> {
        s.parse()
            .map_err(|_| self.err(n, format!("bad descriptor '{s}' (a decimal number)")))
    }

    fn hex(&self, n: usize, what: &str, s: &str) -> Result<u32, ParseError> {
        s.strip_prefix("0x")
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.err(n, format!("bad {what} '{s}' (hex with 0x, 32 bits)")))
    }

    /// Checks descriptor use against what is open, and records the step's effect.
    fn track(
        &self,
        step: &Step,
        open: &mut BTreeMap<i32, String>,
        failed: &mut Vec<i32>,
    ) -> Result<(), ParseError> {
        let n = step.line;
        let usable = |fd: i32, open: &BTreeMap<i32, String>| {
            if fd >= 0 {
                open.contains_key(&fd)
            } else {
                failed.contains(&-fd)
            }
        };
        match &step.kind {
            StepKind::Open(o) => match o.result {
                OpenResult::Fd(fd) => {
                    if let Some(path) = open.get(&fd) {
                        return Err(self.err(
                            n,
                            format!("open returns fd {fd}, which is still open ({path})"),
                        ));
                    }
                    open.insert(fd, o.path.clone());
                }
                OpenResult::Errno(e) => failed.push(e),
            },
            StepKind::Close { fd } => {
                if open.remove(fd).is_none() {
                    return Err(self.err(n, format!("close of fd {fd}, which is not open")));
                }
            }
            StepKind::Ioctl(i) => {
                if !usable(i.fd, open) {
                    return Err(self.err(
                        n,
                        if i.fd >= 0 {
                            format!("ioctl on fd {}, which is not open", i.fd)
                        } else {
                            format!(
                                "ioctl on fd {}, but no earlier open failed with errno {}",
                                i.fd, -i.fd
                            )
                        },
                    ));
                }
            }
        }
        Ok(())
    }
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Open flag names a replay may use, with their Linux x86-64 values.
const FLAG_NAMES: &[(&str, i32)] = &[
    ("O_RDONLY", libc::O_RDONLY),
    ("O_WRONLY", libc::O_WRONLY),
    ("O_RDWR", libc::O_RDWR),
    ("O_CLOEXEC", libc::O_CLOEXEC),
    ("O_NONBLOCK", libc::O_NONBLOCK),
    ("O_NOFOLLOW", libc::O_NOFOLLOW),
    ("O_NOCTTY", libc::O_NOCTTY),
    ("O_SYNC", libc::O_SYNC),
];

/// Parses `O_RDWR|O_CLOEXEC` or `0x80002`.
fn parse_flags(s: &str) -> Result<i32, String> {
    let value = if let Some(hex) = s.strip_prefix("0x") {
        i32::from_str_radix(hex, 16).map_err(|_| format!("bad flags '{s}'"))?
    } else {
        let mut value = 0;
        let mut modes = 0;
        for name in s.split('|') {
            let &(_, v) = FLAG_NAMES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
                format!(
                    "unknown open flag '{name}' (known: {})",
                    FLAG_NAMES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            if matches!(name, "O_RDONLY" | "O_WRONLY" | "O_RDWR") {
                modes += 1;
            }
            value |= v;
        }
        if modes != 1 {
            return Err(format!(
                "flags '{s}' need exactly one of O_RDONLY, O_WRONLY, O_RDWR"
            ));
        }
        value
    };
    if value & libc::O_ACCMODE == libc::O_ACCMODE {
        return Err(format!("flags '{s}' have no valid access mode"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests;

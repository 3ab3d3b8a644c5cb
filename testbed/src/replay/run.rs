//! One run of a replay: the layout table of the driver version being checked, the statuses
//! to plant, the step file the fake `libcuda.so.1` reads, the calls the run is expected to
//! make ([`ReplayRun::expected`]) and the calls it made ([`parse_trace`]).
//!
//! What the fake library does with a step file (mirrored by [`ReplayRun::expected`]):
//! - An open is issued with the recorded path, flags and system call. Recorded success,
//!   real success: the capture's descriptor maps to the real one. Recorded failure, real
//!   failure: the capture's `-errno` maps to the real `-errno`, and `cuInit` will return 999
//!   at the end. Recorded success, real failure: for `/dev/nvidia-uvm`, what real failing
//!   captures show: the open again without `O_CLOEXEC`, then `UVM_DEINITIALIZE` on
//!   `-errno` (NULL argument), then `cuInit` returns 999; for other nodes it returns 999 at
//!   once. Recorded failure, real success: the run diverged; the descriptor is closed and
//!   `cuInit` returns 999.
//! - An ioctl gets a params buffer of exactly its size filled with `0xEE`, with the status
//!   planted at the layout's offset (`NV_OK` unless asked otherwise), and is issued with the
//!   recorded request on the mapped descriptor (a negative one as mapped, or as recorded).
//!   A failed syscall on a real descriptor makes `cuInit` return 999; a status other than
//!   `NV_OK` read back makes it return 3. Both close every mapped descriptor first.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{ioc_dir, ioc_size, OpenSyscall, ParseError, Replay, StepKind};
use crate::fakedev::FakeDevConfig;
use crate::nv;
use crate::rules::IoctlAction;
use crate::workload::Scenario;

/// `UVM_DEINITIALIZE`: issued (NULL argument) after a failed `/dev/nvidia-uvm` open.
pub const UVM_DEINITIALIZE: u32 = 0x3000_0002;
/// The node whose failed open libcuda retries without `O_CLOEXEC`.
pub const UVM_NODE: &str = "/dev/nvidia-uvm";
/// Byte the fake library fills every params buffer with before planting the status.
pub const PARAMS_FILL: u8 = 0xEE;

/// A layout table for the commands of the short replays (`cuInit` up to
/// `UVM_CREATE_RANGE_GROUP`): their params sizes and status offsets, the same in every
/// driver from 535 to 595 (`agent/src/decode/layouts/nvidia-layouts.tsv`). For the testbed's
/// own tests; the agent's tests pass the agent's table of the version they check.
pub const CUINIT_LAYOUT: &[(u32, u32, Option<u32>)] = &[
    (crate::nv::UVM_INITIALIZE, 16, Some(8)),
    (crate::nv::UVM_MM_INITIALIZE, 8, Some(4)),
    (crate::nv::UVM_PAGEABLE_MEM_ACCESS, 8, Some(4)),
    (crate::nv::UVM_REGISTER_GPU, 40, Some(36)),
    (crate::nv::UVM_CREATE_RANGE_GROUP, 16, Some(8)),
    (crate::nv::NV_ESC_RM_CONTROL, 32, Some(28)),
    (crate::nv::NV_ESC_RM_ALLOC, 48, Some(40)),
    (crate::nv::NV_ESC_RM_FREE, 16, Some(12)),
];

/// One row of a layout table: a request, the size of its params struct and the offset of
/// its `rmStatus` (`None`: it has none), for one driver version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlLayout {
    /// Request number as passed to `ioctl(2)`.
    pub request: u32,
    /// Params size in bytes.
    pub params_size: u32,
    /// Offset of the `NV_STATUS`.
    pub status_offset: Option<u32>,
}

/// An ioctl step as the run will issue it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedIoctl {
    /// Line in the replay file.
    pub line: usize,
    /// The node the capture's descriptor names (`None`: a negative descriptor).
    pub node: Option<String>,
    /// The capture's descriptor.
    pub fd: i32,
    /// Request number.
    pub request: u32,
    /// Params size (0: NULL argument).
    pub size: u32,
    /// Offset of the status planted in the params, from the layout table.
    pub status_offset: Option<u32>,
}

/// A replay with the layouts of one driver version and the statuses to plant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRun {
    replay: Replay,
    layout: Vec<IoctlLayout>,
    planned: Vec<PlannedIoctl>,
    plants: BTreeMap<u32, u32>,
}

/// What an ioctl or close is issued on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// A descriptor of this node (`/dev/...`).
    Node(String),
    /// A negative descriptor (`-errno` of a failed open).
    Fd(i32),
}

/// One system call of a run, with node paths instead of descriptor numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// An open and its result (`Err(errno)`).
    Open {
        /// Node path.
        path: String,
        /// Flags as passed.
        flags: i32,
        /// System call used.
        syscall: OpenSyscall,
        /// `Ok` or `Err(errno)`.
        result: Result<(), i32>,
    },
    /// A close of a descriptor of this node.
    Close {
        /// Node path.
        path: String,
    },
    /// An ioctl.
    Ioctl {
        /// Where.
        target: Target,
        /// Request number.
        request: u32,
        /// Params size (0: NULL argument).
        size: u32,
        /// Offset of the planted status.
        status_offset: Option<u32>,
        /// The status at that offset: planted (expected) or read back after the call
        /// (trace).
        status: Option<u32>,
        /// `Ok` or `Err(errno)` of the syscall.
        result: Result<(), i32>,
    },
}

/// The calls a run is expected to make and what `cuInit` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Every open, close and ioctl, in order.
    pub calls: Vec<Call>,
    /// `cuInit`'s result.
    pub cuinit_rc: i32,
}

/// A call as the FUSE server logs it: what reaches it (opens of nodes it serves, ioctls on
/// its descriptors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCall {
    /// `open node=<node>` with `None` (ok) or the errno it answered.
    Open {
        /// Node name without `/dev/`.
        node: String,
        /// Errno answered, if denied.
        errno: Option<i32>,
    },
    /// `ioctl node=<node> cmd=<request> in=<in> out=<out>`.
    Ioctl {
        /// Node name without `/dev/`.
        node: String,
        /// Request number.
        request: u32,
        /// Bytes the kernel copied in.
        in_size: u32,
        /// Bytes it may copy out.
        out_size: u32,
    },
}

impl Expected {
    /// The ioctls of [`Expected::calls`].
    pub fn ioctls(&self) -> impl Iterator<Item = &Call> {
        self.calls
            .iter()
            .filter(|c| matches!(c, Call::Ioctl { .. }))
    }

    /// What the FUSE server's verbose log should show, in order: opens that reach it
    /// (served nodes, denied or not) and ioctls on node descriptors, with the sizes the
    /// kernel passes (`_IOC_SIZE` in the directions the request has; 0 for plain-integer
    /// requests, whose params never reach the server).
    pub fn server_calls(&self, dev: &FakeDevConfig) -> Vec<ServerCall> {
        let served = dev.node_names();
        let mut out = Vec::new();
        for call in &self.calls {
            match call {
                Call::Open { path, result, .. } => {
                    let Some(node) = path.strip_prefix("/dev/") else {
                        continue;
                    };
                    if !served.iter().any(|n| n == node) {
                        continue;
                    }
                    out.push(ServerCall::Open {
                        node: node.to_string(),
                        errno: result.err(),
                    });
                }
                Call::Ioctl {
                    target: Target::Node(path),
                    request,
                    ..
                } => {
                    let node = path.strip_prefix("/dev/").unwrap_or(path).to_string();
                    let size = ioc_size(*request);
                    let dir = ioc_dir(*request);
                    out.push(ServerCall::Ioctl {
                        node,
                        request: *request,
                        in_size: if dir & 1 != 0 { size } else { 0 },
                        out_size: if dir & 2 != 0 { size } else { 0 },
                    });
                }
                _ => {}
            }
        }
        out
    }
}

impl ReplayRun {
    /// Checks `replay` against a layout table of `(request, params_size, status_offset)`
    /// rows (the driver version's own, from the agent's layout module) and builds the run.
    ///
    /// A plain-integer request takes its size from the replay (`size`) or, if the replay
    /// has none, from the table; an `_IOC` request's size is in its number. Every status
    /// offset comes from the table.
    ///
    /// # Errors
    /// A plain-integer request with no size from either, a table size that disagrees with
    /// the replay or with `_IOC_SIZE`, a status offset past the params, or two table rows
    /// for one request (as `file:line: message`).
    pub fn new(replay: Replay, layout: &[(u32, u32, Option<u32>)]) -> Result<Self, ParseError> {
        let err = |line: usize, message: String| ParseError {
            file: replay.file.clone(),
            line,
            message,
        };
        let mut table: BTreeMap<u32, IoctlLayout> = BTreeMap::new();
        for &(request, params_size, status_offset) in layout {
            let row = IoctlLayout {
                request,
                params_size,
                status_offset,
            };
            if table.insert(request, row).is_some() {
                return Err(err(
                    0,
                    format!("layout table has two rows for request {request:#x}"),
                ));
            }
        }
        let mut planned = Vec::new();
        for (line, node, step) in replay.ioctl_nodes() {
            let row = table.get(&step.request);
            let size = if step.is_ioc_encoded() {
                let size = ioc_size(step.request);
                if let Some(row) = row.filter(|r| r.params_size != size) {
                    return Err(err(
                        line,
                        format!(
                            "layout table gives {:#x} {} bytes, its request number encodes {size}",
                            step.request, row.params_size
                        ),
                    ));
                }
                size
            } else {
                match (step.size, row) {
                    (Some(s), Some(r)) if r.params_size != s => {
                        return Err(err(
                            line,
                            format!(
                                "the capture shows {s} bytes for {:#x}, the layout table {}",
                                step.request, r.params_size
                            ),
                        ))
                    }
                    (Some(s), _) => s,
                    (None, Some(r)) => r.params_size,
                    (None, None) => {
                        return Err(err(
                            line,
                            format!(
                                "no params size for {:#x}: the capture does not show it and the layout table has no row for it",
                                step.request
                            ),
                        ))
                    }
                }
            };
            let status_offset = row.and_then(|r| r.status_offset);
            if let Some(off) = status_offset {
                if off.checked_add(4).is_none_or(|end| end > size) {
                    return Err(err(
                        line,
                        format!(
                            "status offset {off} of {:#x} is past its {size} params bytes",
                            step.request
                        ),
                    ));
                }
            }
            planned.push(PlannedIoctl {
                line,
                node,
                fd: step.fd,
                request: step.request,
                size,
                status_offset,
            });
        }
        Ok(ReplayRun {
            replay,
            layout: table.into_values().collect(),
            planned,
            plants: BTreeMap::new(),
        })
    }

    /// Plants `status` (instead of `NV_OK`) in every call of `request` that has a status
    /// offset.
    pub fn plant(mut self, request: u32, status: u32) -> Self {
        self.plants.insert(request, status);
        self
    }

    /// The replay.
    pub fn replay(&self) -> &Replay {
        &self.replay
    }

    /// The layout table, one row per request.
    pub fn layout(&self) -> &[IoctlLayout] {
        &self.layout
    }

    /// Every ioctl step as it will be issued (as recorded; a scenario may stop the run
    /// earlier, see [`ReplayRun::expected`]).
    pub fn planned_ioctls(&self) -> &[PlannedIoctl] {
        &self.planned
    }

    /// The statuses planted in this run: the explicit ones and the scenario's
    /// (`RegisterGpuNoMemory`: `NV_ERR_NO_MEMORY` in `UVM_REGISTER_GPU`).
    pub fn plants(&self, scenario: Scenario) -> BTreeMap<u32, u32> {
        let mut plants = self.plants.clone();
        if scenario == Scenario::RegisterGpuNoMemory {
            plants.insert(nv::UVM_REGISTER_GPU, nv::NV_ERR_NO_MEMORY);
        }
        plants
    }

    /// Whether some planned call carries the status `scenario` needs to plant.
    pub fn supports(&self, scenario: Scenario) -> bool {
        scenario != Scenario::RegisterGpuNoMemory
            || self
                .planned
                .iter()
                .any(|p| p.request == nv::UVM_REGISTER_GPU && p.status_offset.is_some())
    }

    /// The step file the fake library reads (`UVMWATCH_FAKE_REPLAY`), one step a line:
    ///
    /// ```text
    /// uvmwatch-replay 1
    /// O <syscall> <flags> <fd | -errno> <recorded ok: 1|0> <on failure: uvm|stop> <path>
    /// C <fd>
    /// I <fd> <request> <size> <status offset | -1> <status>
    /// ```
    pub fn step_file(&self, scenario: Scenario) -> String {
        let plants = self.plants(scenario);
        let mut planned = self.planned.iter();
        let mut out = String::from("uvmwatch-replay 1\n");
        for step in &self.replay.steps {
            match &step.kind {
                StepKind::Open(o) => {
                    let (fd, ok) = match o.result {
                        super::OpenResult::Fd(fd) => (fd, 1),
                        super::OpenResult::Errno(e) => (-e, 0),
                    };
                    let on_fail = if o.path == UVM_NODE { "uvm" } else { "stop" };
                    let _ = writeln!(
                        out,
                        "O {} {} {fd} {ok} {on_fail} {}",
                        o.syscall.as_str(),
                        o.flags,
                        o.path
                    );
                }
                StepKind::Close { fd } => {
                    let _ = writeln!(out, "C {fd}");
                }
                StepKind::Ioctl(_) => {
                    let p = planned.next().expect("one plan per ioctl step");
                    let (off, status) = match p.status_offset {
                        Some(off) => (
                            i64::from(off),
                            plants.get(&p.request).copied().unwrap_or(nv::NV_OK),
                        ),
                        None => (-1, nv::NV_OK),
                    };
                    let _ = writeln!(
                        out,
                        "I {} {:#x} {} {off} {status:#x}",
                        p.fd, p.request, p.size
                    );
                }
            }
        }
        out
    }

    /// The calls a run against nodes served as `dev` says makes, and what `cuInit`
    /// returns, for `scenario` (see the module documentation for the rules).
    pub fn expected(&self, dev: &FakeDevConfig, scenario: Scenario) -> Expected {
        let plants = self.plants(scenario);
        let mut calls = Vec::new();
        // Capture descriptor -> node, in the order they were opened.
        let mut open: Vec<(i32, String)> = Vec::new();
        let mut negative: BTreeMap<i32, i32> = BTreeMap::new();
        let mut failed = false;
        let mut planned = self.planned.iter();
        let close_all = |open: &mut Vec<(i32, String)>, calls: &mut Vec<Call>| {
            for (_, path) in open.drain(..) {
                calls.push(Call::Close { path });
            }
        };
        for step in &self.replay.steps {
            match &step.kind {
                StepKind::Open(o) => {
                    let real = node_open(dev, &o.path);
                    calls.push(Call::Open {
                        path: o.path.clone(),
                        flags: o.flags,
                        syscall: o.syscall,
                        result: real,
                    });
                    match (o.result, real) {
                        (super::OpenResult::Fd(fd), Ok(())) => open.push((fd, o.path.clone())),
                        (super::OpenResult::Errno(e), Err(real)) => {
                            negative.insert(-e, -real);
                            failed = true;
                        }
                        (super::OpenResult::Errno(_), Ok(())) => {
                            calls.push(Call::Close {
                                path: o.path.clone(),
                            });
                            close_all(&mut open, &mut calls);
                            return Expected {
                                calls,
                                cuinit_rc: nv::CUDA_ERROR_UNKNOWN,
                            };
                        }
                        (super::OpenResult::Fd(_), Err(errno)) => {
                            if o.path == UVM_NODE {
                                let mut errno = errno;
                                if o.flags & libc::O_CLOEXEC != 0 {
                                    let retry = node_open(dev, &o.path);
                                    calls.push(Call::Open {
                                        path: o.path.clone(),
                                        flags: o.flags & !libc::O_CLOEXEC,
                                        syscall: o.syscall,
                                        result: retry,
                                    });
                                    // The node answers a retry as it answered the first try.
                                    errno = retry.err().unwrap_or(errno);
                                }
                                calls.push(Call::Ioctl {
                                    target: Target::Fd(-errno),
                                    request: UVM_DEINITIALIZE,
                                    size: 0,
                                    status_offset: None,
                                    status: None,
                                    result: Err(libc::EBADF),
                                });
                            }
                            close_all(&mut open, &mut calls);
                            return Expected {
                                calls,
                                cuinit_rc: nv::CUDA_ERROR_UNKNOWN,
                            };
                        }
                    }
                }
                StepKind::Close { fd } => {
                    if let Some(i) = open.iter().position(|(f, _)| f == fd) {
                        let (_, path) = open.remove(i);
                        calls.push(Call::Close { path });
                    }
                }
                StepKind::Ioctl(_) => {
                    let p = planned.next().expect("one plan per ioctl step");
                    let status = p
                        .status_offset
                        .map(|_| plants.get(&p.request).copied().unwrap_or(nv::NV_OK));
                    let target = if p.fd >= 0 {
                        match open.iter().find(|(f, _)| *f == p.fd) {
                            Some((_, path)) => Target::Node(path.clone()),
                            None => {
                                // Its open did not happen as recorded: the run diverged.
                                close_all(&mut open, &mut calls);
                                return Expected {
                                    calls,
                                    cuinit_rc: nv::CUDA_ERROR_UNKNOWN,
                                };
                            }
                        }
                    } else {
                        Target::Fd(negative.get(&p.fd).copied().unwrap_or(p.fd))
                    };
                    let result = match &target {
                        Target::Fd(_) => Err(libc::EBADF),
                        Target::Node(_) => match rule_for(dev, p.request) {
                            IoctlAction::Errno(e) => Err(e),
                            _ => Ok(()),
                        },
                    };
                    let node_failed = matches!(target, Target::Node(_)) && result.is_err();
                    // The status is read back only from a call that succeeded.
                    let status = status.filter(|_| result.is_ok());
                    calls.push(Call::Ioctl {
                        target,
                        request: p.request,
                        size: p.size,
                        status_offset: p.status_offset,
                        status,
                        result,
                    });
                    if node_failed {
                        close_all(&mut open, &mut calls);
                        return Expected {
                            calls,
                            cuinit_rc: nv::CUDA_ERROR_UNKNOWN,
                        };
                    }
                    if status.is_some_and(|s| s != nv::NV_OK) {
                        close_all(&mut open, &mut calls);
                        return Expected {
                            calls,
                            cuinit_rc: nv::CUDA_ERROR_NOT_INITIALIZED,
                        };
                    }
                }
            }
        }
        let cuinit_rc = if failed {
            close_all(&mut open, &mut calls);
            nv::CUDA_ERROR_UNKNOWN
        } else {
            nv::CUDA_SUCCESS
        };
        Expected { calls, cuinit_rc }
    }
}

/// How the FUSE nodes of `dev` answer an open of `path`.
fn node_open(dev: &FakeDevConfig, path: &str) -> Result<(), i32> {
    let Some(name) = path.strip_prefix("/dev/") else {
        return Err(libc::ENOENT);
    };
    if !dev.node_names().iter().any(|n| n == name) {
        return Err(libc::ENOENT);
    }
    match dev.deny.iter().rev().find(|d| d.node == name) {
        Some(d) => Err(d.errno),
        None => Ok(()),
    }
}

/// The server's action for `request` (the last rule wins, as in the server's map).
fn rule_for(dev: &FakeDevConfig, request: u32) -> IoctlAction {
    dev.ioctl_rules
        .iter()
        .rev()
        .find(|r| r.cmd == request)
        .map(|r| r.action)
        .unwrap_or(IoctlAction::Ok)
}

/// Parses the trace the fake library writes in replay mode (`UVMWATCH_FAKE_REPLAY_TRACE`)
/// into calls with node paths, and `cuInit`'s result (`None` if the trace has no `result`
/// line). Lines:
///
/// ```text
/// open <syscall> <flags> <path> <fd | -errno>
/// close <fd> <rc>
/// ioctl <fd> <request> <size> <0 | -errno> <status offset | -1> <status | ->
/// result <rc>
/// ```
///
/// # Errors
/// A line that is not of this form, or a descriptor no earlier open returned.
pub fn parse_trace(text: &str) -> Result<(Vec<Call>, Option<i32>), String> {
    let mut fds: BTreeMap<i32, String> = BTreeMap::new();
    let mut calls = Vec::new();
    let mut rc = None;
    for (i, line) in text.lines().enumerate() {
        let bad = || format!("trace line {}: bad line '{line}'", i + 1);
        let w: Vec<&str> = line.split_whitespace().collect();
        let int = |s: &str| s.parse::<i64>().map_err(|_| bad());
        let hex = |s: &str| {
            s.strip_prefix("0x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        };
        match w.as_slice() {
            ["open", syscall, flags, path, ret] => {
                let syscall = OpenSyscall::parse(syscall).ok_or_else(bad)?;
                let ret = int(ret)? as i32;
                let result = if ret >= 0 {
                    fds.insert(ret, path.to_string());
                    Ok(())
                } else {
                    Err(-ret)
                };
                calls.push(Call::Open {
                    path: path.to_string(),
                    flags: int(flags)? as i32,
                    syscall,
                    result,
                });
            }
            ["close", fd, _rc] => {
                let fd = int(fd)? as i32;
                let path = fds
                    .remove(&fd)
                    .ok_or_else(|| format!("trace line {}: close of unknown fd {fd}", i + 1))?;
                calls.push(Call::Close { path });
            }
            ["ioctl", fd, request, size, ret, off, status] => {
                let fd = int(fd)? as i32;
                let target =
                    if fd < 0 {
                        Target::Fd(fd)
                    } else {
                        Target::Node(fds.get(&fd).cloned().ok_or_else(|| {
                            format!("trace line {}: ioctl on unknown fd {fd}", i + 1)
                        })?)
                    };
                let ret = int(ret)? as i32;
                let off = int(off)?;
                calls.push(Call::Ioctl {
                    target,
                    request: hex(request)?,
                    size: int(size)? as u32,
                    status_offset: u32::try_from(off).ok(),
                    status: if *status == "-" {
                        None
                    } else {
                        Some(hex(status)?)
                    },
                    result: if ret == 0 { Ok(()) } else { Err(-ret) },
                });
            }
            ["result", value] => rc = Some(int(value)? as i32),
            _ => return Err(bad()),
        }
    }
    Ok((calls, rc))
}

/// One open or ioctl line of the FUSE server's verbose log ([`crate::FakeDev::log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLogEntry {
    /// Process that made the call.
    pub pid: u32,
    /// The call.
    pub call: ServerCall,
    /// The params bytes received (with [`FakeDevConfig::dump_params`]).
    pub params: Option<Vec<u8>>,
}

/// Parses the open and ioctl lines of the server's verbose log, in order; other lines
/// (interrupts, releases, start-up) are skipped.
pub fn parse_server_log(log: &str) -> Vec<ServerLogEntry> {
    log.lines().filter_map(parse_server_line).collect()
}

fn parse_server_line(line: &str) -> Option<ServerLogEntry> {
    let rest = line.strip_prefix("uvmwatch-fakedev: ")?;
    let (kind, rest) = rest.split_once(' ')?;
    let (fields, outcome) = rest.split_once(": ")?;
    let field = |name: &str| {
        fields
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
    };
    let pid = field("pid")?.parse().ok()?;
    let node = field("node")?.to_string();
    match kind {
        "open" => {
            let errno = match outcome.trim() {
                "ok" => None,
                other => Some(other.strip_prefix("errno ")?.parse().ok()?),
            };
            Some(ServerLogEntry {
                pid,
                call: ServerCall::Open { node, errno },
                params: None,
            })
        }
        "ioctl" => {
            let request = u32::from_str_radix(field("cmd")?.strip_prefix("0x")?, 16).ok()?;
            let params = outcome.split_once(" params=").map(|(_, hex)| {
                (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                    .collect()
            });
            Some(ServerLogEntry {
                pid,
                call: ServerCall::Ioctl {
                    node,
                    request,
                    in_size: field("in")?.parse().ok()?,
                    out_size: field("out")?.parse().ok()?,
                },
                params,
            })
        }
        _ => None,
    }
}

//! The observer's handlers without root: kernel records go in, the events every listener
//! gets come out (recorded), over a stand-in kernel side whose in-flight maps the tests set,
//! a procfs-like tree for the processes, and the motivating incident's machine as the facts
//! (`testbed/fixtures/incident-host`).
//!
//! Over 800 lines: one file of tests of the observer's handlers, sharing the stand-in
//! kernel side and the recorded listener set up at its top; each test is one story of
//! records in and events out.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Result;
use uvmwatch_common::{
    counter, node, result, CuinitEvent, EventHeader, InflightCuinit, InflightIoctl, IoctlEvent,
    KernelFnEvent, OpenEvent, TaskEvent, DIED_IN_CUINIT, DIED_IN_IOCTL, EVENT_CUINIT_ENTER,
    EVENT_CUINIT_EXIT, EVENT_DIED_IN_CALL, EVENT_EXEC, EVENT_IOCTL, EVENT_KERNEL_FN, EVENT_OPEN,
    IOCTL_FAILED, IOCTL_IN_CUINIT, OPEN_IN_CUINIT, OPEN_LIBCUDA,
};
use uvmwatch_common::{CUINIT_LATE, DIED_IN_LATE_CUINIT, LATE_END_RETURN, OPEN_NO_START};

use super::{diagnosis::FactsFrom, driver::DriverFrom, KernelSide, Observer, RunConfig};
use crate::{
    clock,
    decode::record::KernelRecord,
    doctor::finding::Basis,
    event::{CallKind, Event, Kind, Listener, Seen, StallOutcome, Trigger},
    kernel::registry::{self, Attach, ProbeSpec, ProbeState},
};

const PID: u32 = 4242;
const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// The kernel side: in-flight maps the test fills, attaches that always work.
#[derive(Default)]
struct FakeKernel {
    cuinit: Vec<(u32, InflightCuinit)>,
    ioctls: Vec<(u32, InflightIoctl)>,
    attached: Vec<PathBuf>,
    forgotten: Vec<u32>,
    drops: u64,
    /// The layouts loaded, by tag.
    layouts: Vec<String>,
    /// `seed_dev_file` calls: (dev, ino, node, minor).
    dev_files: Vec<(u64, u64, u8, u8)>,
}

impl KernelSide for FakeKernel {
    fn probe_states(&self) -> Vec<(ProbeSpec, ProbeState)> {
        registry::all()
            .into_iter()
            .map(|s| {
                let st = match s.attach {
                    Attach::Kprobe { .. } => ProbeState::Unavailable("no kprobes here".into()),
                    Attach::Uprobe { .. } if self.attached.is_empty() => {
                        ProbeState::Waiting("no libcuda found yet".into())
                    }
                    _ => ProbeState::Attached(1),
                };
                (s, st)
            })
            .collect()
    }
    fn libcuda_targets(&self) -> usize {
        self.attached.len()
    }
    fn backend(&self) -> registry::BackendChosen {
        registry::BackendChosen {
            backend: registry::Backend::Tracepoint,
            cause: "flag",
            why: "the observer's tests".into(),
        }
    }
    fn attach_libcuda(&mut self, path: &Path, _dev: u64, _ino: u64) -> Result<()> {
        self.attached.push(path.to_path_buf());
        Ok(())
    }
    fn inflight_cuinit(&self) -> Result<Vec<(u32, InflightCuinit)>> {
        Ok(self.cuinit.clone())
    }
    fn inflight_ioctls(&self) -> Result<Vec<(u32, InflightIoctl)>> {
        Ok(self.ioctls.clone())
    }
    fn forget_thread(&mut self, tid: u32) {
        self.forgotten.push(tid);
        self.cuinit.retain(|(t, _)| *t != tid);
        self.ioctls.retain(|(t, _)| *t != tid);
    }
    fn end_late_cuinit(&mut self, tid: u32) -> bool {
        let had = self.cuinit.iter().any(|(t, c)| *t == tid && c.late != 0);
        self.cuinit.retain(|(t, c)| !(*t == tid && c.late != 0));
        had
    }
    fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        let mut c = [0; counter::COUNT as usize];
        c[counter::RINGBUF_DROPS as usize] = self.drops;
        Ok(c)
    }
    fn refresh_module(&mut self) -> Option<bool> {
        None
    }
    fn sweep(&mut self, _alive: &dyn Fn(u32) -> bool) -> Result<usize> {
        Ok(0)
    }
    fn seed_proc(&mut self, _: u32) -> Result<()> {
        Ok(())
    }
    fn seed_dev_file(&mut self, dev: u64, ino: u64, node: u8, minor: u8) -> Result<()> {
        self.dev_files.push((dev, ino, node, minor));
        Ok(())
    }
    fn seed_inflight_ioctl(&mut self, tid: u32, e: InflightIoctl) -> Result<()> {
        self.ioctls.push((tid, e));
        Ok(())
    }
    fn load_layout(&mut self, layout: &crate::decode::layouts::Layout) -> Result<()> {
        self.layouts.push(layout.tag().to_string());
        Ok(())
    }
}

/// Keeps every event it gets.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Arc<Event>>>>);

impl Listener for Recording {
    fn event(&mut self, ev: &Arc<Event>) {
        self.0.lock().unwrap().push(ev.clone());
    }
}

impl Recording {
    /// The events so far, emptied.
    fn take(&self) -> Vec<Arc<Event>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A procfs-like tree: pid 4242 (`cuda-workload`, pid 7 in its namespace) sleeping in
/// `uvm_gpu_retain_by_uuid`.
fn fake_proc() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join(PID.to_string());
    let task = d.join("task").join(PID.to_string());
    std::fs::create_dir_all(&task).unwrap();
    std::fs::write(d.join("cmdline"), "./cuda-workload\0--wait-ms\0\x31500\0").unwrap();
    std::fs::write(d.join("status"), "Name:\tcuda-workload\nNSpid:\t4242\t7\n").unwrap();
    std::fs::write(d.join("stat"), "4242 (cuda-workload) D 1 1 1").unwrap();
    std::fs::write(task.join("stat"), "4242 (cuda-workload) D 1 1 1").unwrap();
    std::fs::write(task.join("wchan"), "uvm_gpu_retain_by_uuid").unwrap();
    std::fs::write(
        task.join("stack"),
        "[<0>] uvm_gpu_retain_by_uuid+0x1c/0x90 [nvidia_uvm]\n[<0>] uvm_api_register_gpu+0x40/0x120 [nvidia_uvm]\n",
    )
    .unwrap();
    t
}

fn incident_host() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbed/fixtures/incident-host")
}

/// An observer over the stand-in, with thresholds 3 s (`cuInit`) and 2 s (ioctls), and the
/// incident's facts; started, with its start-up events taken.
fn observer(proc_root: &Path) -> (Observer<FakeKernel>, Recording) {
    observer_with_facts(proc_root, incident_host())
}

/// [`observer`] with the facts of the snapshot at `facts`.
fn observer_with_facts(proc_root: &Path, facts: PathBuf) -> (Observer<FakeKernel>, Recording) {
    let cfg = RunConfig {
        cuinit_stall: Duration::from_secs(3),
        ioctl_stall: Duration::from_secs(2),
        proc_root: proc_root.to_path_buf(),
        proc_scan: false,
        facts: Some(FactsFrom::Snapshot(facts)),
        driver: DriverFrom::LiveElseSnapshot {
            host_root: Some(std::path::PathBuf::from("/nonexistent")),
        },
        ..RunConfig::new()
    };
    let mut o = Observer::over(cfg, FakeKernel::default()).unwrap();
    // No host libcuda discovery in unit tests: nothing under the fake proc root's host.
    let rec = Recording::default();
    o.start(vec![Box::new(rec.clone())], "none");
    rec.take();
    (o, rec)
}

fn header(kind: u32, tid: u32, ts_ns: u64) -> EventHeader {
    let mut comm = [0u8; 16];
    comm[..13].copy_from_slice(b"cuda-workload");
    EventHeader {
        kind,
        tgid: PID,
        tid,
        ts_ns,
        comm,
        ..EventHeader::default()
    }
}

fn cuinit_enter(tid: u32, t: u64) -> KernelRecord {
    KernelRecord::CuinitEnter(CuinitEvent {
        header: header(EVENT_CUINIT_ENTER, tid, t),
        start_ns: t,
        entry_seen: 1,
        ..CuinitEvent::default()
    })
}

fn cuinit_exit(tid: u32, start: u64, end: u64, ret: i64) -> KernelRecord {
    KernelRecord::CuinitExit(CuinitEvent {
        header: header(EVENT_CUINIT_EXIT, tid, end),
        start_ns: start,
        ret,
        entry_seen: 1,
        ..CuinitEvent::default()
    })
}

/// An ioctl on `/dev/nvidia-uvm` inside `cuInit`, with its `rmStatus`.
fn uvm_ioctl(tid: u32, cmd: u32, start: u64, end: u64, status: u32) -> KernelRecord {
    KernelRecord::Ioctl(IoctlEvent {
        header: header(EVENT_IOCTL, tid, end),
        start_ns: start,
        cmd,
        status,
        result_kind: result::NV_STATUS,
        node: node::UVM,
        flags: IOCTL_IN_CUINIT | if status != 0 { IOCTL_FAILED } else { 0 },
        ..IoctlEvent::default()
    })
}

fn open(tid: u32, path: &str, t: u64, ret: i64, flags: u32) -> KernelRecord {
    let mut o = OpenEvent {
        header: header(EVENT_OPEN, tid, t + 1000),
        start_ns: t,
        ret,
        flags,
        node: node::UVM,
        ..OpenEvent::default()
    };
    o.path[..path.len()].copy_from_slice(path.as_bytes());
    KernelRecord::Open(o)
}

fn kinds(evs: &[Arc<Event>]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            let k = format!("{:?}", e.kind);
            k.split(['(', ' ', '{']).next().unwrap().to_string()
        })
        .collect()
}

#[test]
fn a_failed_cuinit_carries_what_it_did_and_its_diagnosis_then_its_findings() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(cuinit_enter(PID, t));
    o.handle(open(PID, "/dev/nvidia-uvm", t + MS, 3, OPEN_IN_CUINIT));
    o.handle(uvm_ioctl(PID, 0x3000_0001, t + 2 * MS, t + 3 * MS, 0));
    o.handle(uvm_ioctl(PID, 0x25, t + 4 * MS, t + 5 * MS, 0x51));
    o.handle(cuinit_exit(PID, t, t + 6 * MS, 3));
    let evs = rec.take();
    assert_eq!(
        kinds(&evs)[..5],
        ["CuinitStart", "Open", "Ioctl", "Ioctl", "CuinitEnd"]
    );
    // Identity read once, shared by every event of the process.
    let p = evs[0].process.clone().unwrap();
    assert_eq!(
        (p.pid, p.ns_pid, p.comm.as_str()),
        (PID, Some(7), "cuda-workload")
    );
    assert!(evs[..5]
        .iter()
        .all(|e| Arc::ptr_eq(e.process.as_ref().unwrap(), &p)));
    let Kind::Ioctl(io) = &evs[3].kind else {
        panic!()
    };
    assert_eq!(
        (io.name.as_str(), io.node.as_str(), io.result.as_str()),
        ("UVM_REGISTER_GPU", "/dev/nvidia-uvm", "NV_ERR_NO_MEMORY")
    );
    assert!(io.failed && io.in_cuinit);
    let Kind::CuinitEnd(end) = &evs[4].kind else {
        panic!()
    };
    assert_eq!(end.result, "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!((end.call.driver_calls, end.call.device_opens), (2, 1));
    let f = end.call.last_failure.clone().unwrap();
    assert_eq!(
        (
            f.what.as_str(),
            f.call.as_str(),
            f.node.as_str(),
            f.result.as_str()
        ),
        (
            "UVM_REGISTER_GPU on /dev/nvidia-uvm",
            "UVM_REGISTER_GPU",
            "nvidia-uvm",
            "NV_ERR_NO_MEMORY"
        )
    );
    // The incident's machine: the HMM set-up, critical, first.
    assert_eq!(end.findings[0].rule, "hmm_setup_failure");
    // Then one event per finding, the same findings, then the active set.
    let after: Vec<&Arc<Event>> = evs[5..].iter().collect();
    assert_eq!(after.len(), end.findings.len() + 1, "{:?}", kinds(&evs));
    for (ev, f) in after.iter().zip(&end.findings) {
        let Kind::Diagnosis(d) = &ev.kind else {
            panic!("{:?}", ev.kind)
        };
        assert!(Arc::ptr_eq(&d.finding, f));
        assert_eq!(d.trigger, Trigger::CuinitEnd);
        assert_eq!(ev.pid(), Some(PID));
    }
    let Kind::ActiveFindings(a) = &after.last().unwrap().kind else {
        panic!()
    };
    assert!(a.active.iter().any(|(r, _, _)| r == "hmm_setup_failure"));
}

/// The kernel side reads statuses with the layouts of the facts' driver (the incident host
/// runs 590.48.01) before any record, and the start says which, before `started`.
#[test]
fn the_snapshots_driver_layouts_are_loaded_and_said_at_start() {
    let root = fake_proc();
    let cfg = RunConfig {
        proc_root: root.path().to_path_buf(),
        proc_scan: false,
        facts: Some(FactsFrom::Snapshot(incident_host())),
        driver: DriverFrom::LiveElseSnapshot {
            host_root: Some(std::path::PathBuf::from("/nonexistent")),
        },
        ..RunConfig::new()
    };
    let mut o = Observer::over(cfg, FakeKernel::default()).unwrap();
    assert_eq!(o.kernel().layouts, ["590.48.01"]);
    let rec = Recording::default();
    o.start(vec![Box::new(rec.clone())], "none");
    let evs = rec.take();
    let said = evs
        .iter()
        .position(|e| matches!(&e.kind, Kind::DriverLayout(d) if d.driver.as_deref() == Some("590.48.01") && d.selection == "exact"))
        .expect("driver layout said");
    let started = evs
        .iter()
        .position(|e| matches!(e.kind, Kind::Started(_)))
        .unwrap();
    assert!(said < started);
    // Said once: a check with the same version says nothing and loads nothing.
    o.check_driver();
    assert!(rec.take().is_empty());
    assert_eq!(o.kernel().layouts.len(), 1);
}

/// The end of a real failing cuInit (driver 535.261.03,
/// `testbed/replays/535.261.03-gpuless-qemu-uvm-eacces.replay`): the `/dev/nvidia-uvm` open fails,
/// is retried without `O_CLOEXEC`, and `UVM_DEINITIALIZE` goes to fd = -errno. That call is logged
/// on `invalid_fd` with its `EBADF`, but the cuInit's failure stays the open, and it is no driver
/// call.
#[test]
fn a_uvm_call_on_a_negative_fd_is_not_the_cuinits_failure() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(cuinit_enter(PID, t));
    o.handle(open(PID, "/dev/nvidia-uvm", t + MS, -2, OPEN_IN_CUINIT));
    o.handle(open(PID, "/dev/nvidia-uvm", t + 2 * MS, -2, OPEN_IN_CUINIT));
    o.handle(KernelRecord::Ioctl(IoctlEvent {
        header: header(EVENT_IOCTL, PID, t + 3 * MS),
        start_ns: t + 3 * MS - 1000,
        cmd: 0x3000_0002,
        fd: -2i32 as u32,
        ret: -9,
        status: 9,
        result_kind: result::ERRNO,
        node: node::INVALID_FD,
        flags: IOCTL_IN_CUINIT | IOCTL_FAILED,
        ..IoctlEvent::default()
    }));
    o.handle(cuinit_exit(PID, t, t + 4 * MS, 999));
    let evs = rec.take();
    let io = evs
        .iter()
        .find_map(|e| match &e.kind {
            Kind::Ioctl(io) => Some(io),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (io.name.as_str(), io.node.as_str(), io.result.as_str()),
        ("UVM_DEINITIALIZE", "invalid_fd", "EBADF")
    );
    let end = evs
        .iter()
        .find_map(|e| match &e.kind {
            Kind::CuinitEnd(end) => Some(end),
            _ => None,
        })
        .unwrap();
    assert_eq!((end.call.driver_calls, end.call.device_opens), (0, 2));
    let f = end.call.last_failure.clone().unwrap();
    assert_eq!(
        (f.what.as_str(), f.call.as_str(), f.result.as_str()),
        ("open /dev/nvidia-uvm", "open", "ENOENT")
    );
    assert!(end.call.failed_call.is_none());
}

#[test]
fn a_failed_open_is_judged_and_a_good_one_is_not() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(open(PID, "/dev/nvidia-uvm", t, 5, 0));
    o.handle(open(PID, "/dev/nvidia-uvm", t, -2, 0));
    let evs = rec.take();
    let Kind::Open(good) = &evs[0].kind else {
        panic!()
    };
    assert!(good.errno.is_none() && good.findings.is_empty());
    let Kind::Open(bad) = &evs[1].kind else {
        panic!()
    };
    assert_eq!(bad.errno.as_deref(), Some("ENOENT"));
    assert_eq!(bad.node, "nvidia-uvm");
    assert_eq!(bad.findings[0].rule, "node_or_module_missing");
    // The incident host has the static HMM risk profile: that finding is no cause of this
    // ENOENT and is not attached to it (nor any other finding from the host's state alone).
    assert!(
        bad.findings.iter().all(|f| f.basis == Basis::Observed),
        "{:#?}",
        bad.findings
    );
    assert!(bad.findings.iter().all(|f| f.rule != "hmm_setup_failure"));
    assert!(matches!(
        &evs[2].kind,
        Kind::Diagnosis(d) if d.trigger == Trigger::DeviceOpenFailed
    ));
}

/// A successful cuInit whose first GPU-node open took 1.5 s (the GPU brought up in it) is
/// judged as a slow start; a quick one is not judged at all.
#[test]
fn a_successful_cuinit_with_a_slow_first_gpu_open_is_judged_slow() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    let gpu_open = |tid: u32, start: u64, end: u64| {
        let mut e = OpenEvent {
            header: header(EVENT_OPEN, tid, end),
            start_ns: start,
            ret: 7,
            flags: OPEN_IN_CUINIT,
            node: node::GPU,
            ..OpenEvent::default()
        };
        e.path[.."/dev/nvidia0".len()].copy_from_slice(b"/dev/nvidia0");
        KernelRecord::Open(e)
    };
    o.handle(cuinit_enter(PID, t));
    o.handle(gpu_open(PID, t + MS, t + MS + 1500 * MS));
    o.handle(cuinit_exit(PID, t, t + 1600 * MS, 0));
    // Another process: the same start with a 2 ms open.
    o.handle(cuinit_enter(PID + 1, t));
    o.handle(gpu_open(PID + 1, t + MS, t + 3 * MS));
    o.handle(cuinit_exit(PID + 1, t, t + 5 * MS, 0));
    let evs = rec.take();
    let ends: Vec<_> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::CuinitEnd(end) => Some(end),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 2);
    assert_eq!(ends[0].call.first_gpu_open_seconds, Some(1.5));
    let rules: Vec<&str> = ends[0].findings.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(rules, ["slow_init"], "{:#?}", ends[0].findings);
    assert!(ends[0].findings[0].rests_on(crate::doctor::signal::Sig::FirstGpuOpenSlow));
    assert!(ends[1].findings.is_empty(), "{:#?}", ends[1].findings);
}

#[test]
fn a_stall_is_reported_once_with_its_thread_and_ends_when_the_call_returns() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let now = clock::monotonic_ns();
    let (cu_start, io_start) = (now - 3 * S - 10 * MS, now - 2 * S - 20 * MS);
    o.handle(cuinit_enter(PID, cu_start));
    {
        let mut k = o.kernel();
        k.cuinit.push((
            PID,
            InflightCuinit {
                start_ns: cu_start,
                tgid: PID,
                ..InflightCuinit::default()
            },
        ));
        k.ioctls.push((
            PID,
            InflightIoctl {
                start_ns: io_start,
                tgid: PID,
                cmd: 0x25,
                node: node::UVM,
                ..InflightIoctl::default()
            },
        ));
    }
    rec.take();
    o.scan();
    o.scan();
    let evs = rec.take();
    let stalls: Vec<_> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::Stall(s) => Some((e, s)),
            _ => None,
        })
        .collect();
    assert_eq!(stalls.len(), 2, "once each: {:?}", kinds(&evs));
    let (ev, cu) = stalls
        .iter()
        .find(|(_, s)| s.kind == CallKind::Cuinit)
        .unwrap();
    assert_eq!(cu.call, "cuInit");
    let inside = cu.inside.as_ref().unwrap();
    assert_eq!(inside.text(), "UVM_REGISTER_GPU on /dev/nvidia-uvm");
    assert_eq!(cu.node, "/dev/nvidia-uvm");
    assert_eq!(cu.thread.state, "D (disk sleep)");
    assert_eq!(cu.thread.wchan, "uvm_gpu_retain_by_uuid");
    assert_eq!(cu.thread.stack[0], "uvm_gpu_retain_by_uuid");
    assert!(cu.age_ns(ev.ts_ns) >= 3 * S);
    assert!(cu.call_so_far.is_some(), "its cuInit was seen starting");
    assert!(cu.findings.iter().any(|f| f.rule == "hmm_setup_failure"));
    let (_, io) = stalls
        .iter()
        .find(|(_, s)| s.kind == CallKind::Ioctl)
        .unwrap();
    assert_eq!(
        (io.call.as_str(), io.label.as_str()),
        ("UVM_REGISTER_GPU", "UVM_REGISTER_GPU")
    );
    // The scan's figures go out on every pass.
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(&e.kind, Kind::Scan(s) if s.cuinit_in_flight == 1))
            .count(),
        2
    );
    // The ioctl returns: its stall ends with its result, then the call itself is reported.
    o.kernel().ioctls.clear();
    o.handle(uvm_ioctl(PID, 0x25, io_start, now + S, 0));
    let evs = rec.take();
    assert_eq!(kinds(&evs), ["StallEnd", "Ioctl"]);
    let Kind::StallEnd(end) = &evs[0].kind else {
        panic!()
    };
    assert_eq!(end.outcome, StallOutcome::Returned);
    assert_eq!(end.result.as_deref(), Some("NV_OK"));
    assert_eq!(end.node.as_deref(), Some("/dev/nvidia-uvm"));
    // The cuInit leaves the kernel's map with no exit record: ended after two scans.
    o.kernel().cuinit.clear();
    o.scan();
    assert!(!kinds(&rec.take()).contains(&"StallEnd".to_string()));
    o.scan();
    let evs = rec.take();
    let end = evs
        .iter()
        .find_map(|e| match &e.kind {
            Kind::StallEnd(s) => Some(s),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (end.call.as_str(), end.outcome),
        ("cuInit", StallOutcome::Ended)
    );
}

#[test]
fn a_thread_dying_in_a_stalled_call_ends_the_stall_and_counts_its_cuinit() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let now = clock::monotonic_ns();
    let start = now - 4 * S;
    o.handle(cuinit_enter(PID, start));
    o.kernel().cuinit.push((
        PID,
        InflightCuinit {
            start_ns: start,
            tgid: PID,
            ..InflightCuinit::default()
        },
    ));
    o.scan();
    o.kernel().cuinit.clear();
    rec.take();
    o.handle(KernelRecord::DiedInCall(TaskEvent {
        header: header(EVENT_DIED_IN_CALL, PID, now),
        what: DIED_IN_CUINIT | DIED_IN_IOCTL,
        aux: 0x25,
        node: node::UVM,
        ..TaskEvent::default()
    }));
    let evs = rec.take();
    assert_eq!(kinds(&evs), ["StallEnd", "DiedInCall"]);
    let Kind::StallEnd(end) = &evs[0].kind else {
        panic!()
    };
    assert_eq!(end.outcome, StallOutcome::ThreadExited);
    let Kind::DiedInCall(d) = &evs[1].kind else {
        panic!()
    };
    assert_eq!(d.calls, ["cuInit", "UVM_REGISTER_GPU"]);
    assert!(d.cuinit_seen);
}

#[test]
fn a_child_forked_after_its_parent_initialised_is_flagged() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(cuinit_enter(PID, t));
    o.handle(cuinit_exit(PID, t, t + MS, 0));
    let child = |kind, ts, ret| {
        let mut h = header(kind, 5000, ts);
        h.tgid = 5000;
        CuinitEvent {
            header: h,
            start_ns: t + 2 * MS,
            ret,
            entry_seen: 1,
            forked_from: PID,
            ..CuinitEvent::default()
        }
    };
    o.handle(KernelRecord::CuinitEnter(child(
        EVENT_CUINIT_ENTER,
        t + 2 * MS,
        0,
    )));
    o.handle(KernelRecord::CuinitExit(child(
        EVENT_CUINIT_EXIT,
        t + 3 * MS,
        3,
    )));
    let evs = rec.take();
    let ends: Vec<_> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::CuinitEnd(c) => Some(c),
            _ => None,
        })
        .collect();
    assert!(!ends[0].call.forked_after_parent_init);
    assert!(ends[1].call.forked_after_parent_init);
    assert!(ends[1].findings.iter().any(|f| f.rule == "fork_after_init"));
    // After the parent execs a new image, its children are no longer "forked after init".
    o.handle(KernelRecord::Exec(TaskEvent {
        header: header(EVENT_EXEC, PID, t + 4 * MS),
        ..TaskEvent::default()
    }));
    o.handle(KernelRecord::CuinitEnter(child(
        EVENT_CUINIT_ENTER,
        t + 5 * MS,
        0,
    )));
    o.handle(KernelRecord::CuinitExit(child(
        EVENT_CUINIT_EXIT,
        t + 6 * MS,
        3,
    )));
    let last = rec
        .take()
        .into_iter()
        .filter_map(|e| match &e.kind {
            Kind::CuinitEnd(c) => Some(c.clone()),
            _ => None,
        })
        .next_back()
        .unwrap();
    assert!(!last.call.forked_after_parent_init);
}

#[test]
fn a_kernel_signal_is_kept_with_the_threads_cuinit() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(cuinit_enter(PID, t));
    o.handle(KernelRecord::KernelFn(KernelFnEvent {
        header: header(EVENT_KERNEL_FN, PID, t + MS),
        start_ns: t,
        ret: -34,
        func: uvmwatch_common::kernel_fn::REQUEST_FREE_MEM_REGION,
        code: 34,
        kind: result::ERRNO,
        in_uvm_ioctl: 1,
        ..KernelFnEvent::default()
    }));
    o.handle(cuinit_exit(PID, t, t + 2 * MS, 3));
    let evs = rec.take();
    let Kind::KernelSignal(s) = &evs[1].kind else {
        panic!()
    };
    assert_eq!(s.text(), "request_free_mem_region = -34 (ERANGE)");
    let Kind::CuinitEnd(end) = &evs[2].kind else {
        panic!()
    };
    assert_eq!(
        end.call.kernel_signals,
        ["request_free_mem_region = -34 (ERANGE)"]
    );
    assert_eq!(end.findings[0].rule, "hmm_setup_failure");
}

#[test]
fn a_libcuda_a_process_opens_gets_probed() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    // The library inside the process's root: `<proc>/4242/root/...`.
    let lib_dir = root.path().join("4242/root/usr/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::write(
        lib_dir.join("libcuda.so.1"),
        b"not an ELF, the stand-in attaches anyway",
    )
    .unwrap();
    o.handle(open(
        PID,
        "/usr/lib/libcuda.so.1",
        clock::monotonic_ns(),
        5,
        OPEN_LIBCUDA,
    ));
    let evs = rec.take();
    assert_eq!(kinds(&evs), ["LibcudaAttached", "ProbesChanged"], "{evs:?}");
    let Kind::LibcudaAttached { path, .. } = &evs[0].kind else {
        panic!()
    };
    assert_eq!(path, "/usr/lib/libcuda.so.1");
    let Kind::ProbesChanged {
        libcuda_targets, ..
    } = &evs[1].kind
    else {
        panic!()
    };
    assert_eq!(*libcuda_targets, 1);
}

/// A `cuInit` whose libcuda was loaded before the probes were attached: the kernel starts it
/// at the first driver call (`late`), its records are the call's.
fn late_enter(tid: u32, t: u64) -> KernelRecord {
    KernelRecord::CuinitEnter(CuinitEvent {
        header: header(EVENT_CUINIT_ENTER, tid, t),
        start_ns: t,
        late: CUINIT_LATE,
        ..CuinitEvent::default()
    })
}

fn rm_ioctl(tid: u32, start: u64, end: u64, status: u32) -> KernelRecord {
    KernelRecord::Ioctl(IoctlEvent {
        header: header(EVENT_IOCTL, tid, end),
        start_ns: start,
        cmd: 0xc020_462a,
        status,
        result_kind: result::NV_STATUS,
        node: node::CTL,
        minor: 255,
        flags: IOCTL_IN_CUINIT | if status != 0 { IOCTL_FAILED } else { 0 },
        ..IoctlEvent::default()
    })
}

fn the_end(evs: &[Arc<Event>]) -> crate::event::CuinitEnd {
    evs.iter()
        .find_map(|e| match &e.kind {
            Kind::CuinitEnd(c) => Some(c.clone()),
            _ => None,
        })
        .expect("a cuinit_end")
}

/// The real libcuda 535.261.03 with `/dev/nvidia-uvm` at mode 000 and a non-root caller
/// (`cargo xtask vm-test`, nvidia series): the control node opens, RM escapes succeed, the
/// UVM node is refused twice (on the fentry backend with no start: the permission check
/// fails before any driver code), `UVM_DEINITIALIZE` goes to fd -13, and cuInit returns
/// 999. Seen only through its driver calls, the call still names the refused open, carries
/// its diagnosis and the result those calls tell; the thread's exit is no death inside it.
#[test]
fn a_cuinit_the_probes_missed_is_told_by_its_driver_calls() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(late_enter(PID, t));
    let mut ctl = OpenEvent {
        header: header(EVENT_OPEN, PID, t + MS),
        start_ns: t,
        ret: 0,
        flags: OPEN_IN_CUINIT,
        node: node::CTL,
        minor: 255,
        ..OpenEvent::default()
    };
    ctl.path[..14].copy_from_slice(b"/dev/nvidiactl");
    o.handle(KernelRecord::Open(ctl));
    o.handle(rm_ioctl(PID, t + 2 * MS, t + 3 * MS, 0));
    for i in 0..2 {
        o.handle(open(
            PID,
            "/dev/nvidia-uvm",
            t + (4 + i) * MS,
            -13,
            OPEN_IN_CUINIT | OPEN_NO_START,
        ));
    }
    o.handle(KernelRecord::Ioctl(IoctlEvent {
        header: header(EVENT_IOCTL, PID, t + 7 * MS),
        start_ns: t + 7 * MS - 1000,
        cmd: 0x3000_0002,
        fd: -13i32 as u32,
        ret: -9,
        status: 9,
        result_kind: result::ERRNO,
        node: node::INVALID_FD,
        flags: IOCTL_IN_CUINIT | IOCTL_FAILED,
        ..IoctlEvent::default()
    }));
    o.handle(KernelRecord::DiedInCall(TaskEvent {
        header: header(EVENT_DIED_IN_CALL, PID, t + 9 * MS),
        start_ns: t,
        what: DIED_IN_CUINIT | DIED_IN_LATE_CUINIT,
        ..TaskEvent::default()
    }));
    let evs = rec.take();
    assert!(
        matches!(evs[0].kind, Kind::CuinitStart { late: true, .. }),
        "{:?}",
        kinds(&evs)
    );
    assert!(!evs.iter().any(|e| matches!(e.kind, Kind::DiedInCall(_))));
    let end = the_end(&evs);
    assert_eq!(end.seen, Seen::DriverCalls);
    assert_eq!((end.code, end.result.as_str()), (999, "CUDA_ERROR_UNKNOWN"));
    let late = end.late.clone().unwrap();
    assert_eq!(late.ended, "thread_exited");
    assert!(
        late.result_basis.contains("EACCES"),
        "{}",
        late.result_basis
    );
    assert_eq!((end.call.driver_calls, end.call.device_opens), (1, 3));
    let f = end.call.last_failure.clone().unwrap();
    assert_eq!(
        (f.what.as_str(), f.result.as_str()),
        ("open /dev/nvidia-uvm", "EACCES")
    );
    assert!(
        end.findings.iter().any(|f| f.rule == "device_permission"),
        "{:?}",
        end.findings.iter().map(|f| &f.rule).collect::<Vec<_>>()
    );
}

/// A late call whose thread goes quiet (no driver call in flight, none for a second) is
/// taken out of the kernel's map and ends at its last driver call; with no failure and no
/// later call its result is unknown, and nothing says it failed.
#[test]
fn a_quiet_late_cuinit_ends_at_its_last_driver_call() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let now = clock::monotonic_ns();
    let t = now - 3 * S;
    o.handle(late_enter(PID, t));
    o.kernel().cuinit.push((
        PID,
        InflightCuinit {
            start_ns: t,
            tgid: PID,
            late: 1,
            ..InflightCuinit::default()
        },
    ));
    o.handle(rm_ioctl(PID, t + MS, t + 2 * MS, 0));
    rec.take();
    o.scan();
    let evs = rec.take();
    let end = the_end(&evs);
    assert!(
        o.kernel().cuinit.is_empty(),
        "taken out of the kernel's map"
    );
    assert_eq!((end.code, end.result.as_str()), (-1, "unknown"));
    assert_eq!(end.late.as_ref().unwrap().ended, "quiet");
    let at = evs
        .iter()
        .find(|e| matches!(e.kind, Kind::CuinitEnd(_)))
        .unwrap()
        .ts_ns;
    assert_eq!(at, t + 2 * MS);
    // Never a stall: its thread was in no driver call.
    assert!(!evs.iter().any(|e| matches!(e.kind, Kind::Stall(_))));
}

/// The uretprobe attached while a late call ran, in time for its return: the real result,
/// its start that of its first driver call.
#[test]
fn a_late_cuinit_seen_returning_has_its_real_result() {
    let root = fake_proc();
    let (mut o, rec) = observer(root.path());
    let t = clock::monotonic_ns();
    o.handle(late_enter(PID, t));
    o.handle(rm_ioctl(PID, t + MS, t + 2 * MS, 0));
    o.handle(KernelRecord::CuinitExit(CuinitEvent {
        header: header(EVENT_CUINIT_EXIT, PID, t + 3 * MS),
        start_ns: t,
        ret: 803,
        late: LATE_END_RETURN,
        ..CuinitEvent::default()
    }));
    let end = the_end(&rec.take());
    assert_eq!(end.seen, Seen::Return);
    assert_eq!(end.code, 803);
    assert_eq!(end.late.as_ref().unwrap().ended, "returned");
    assert!(end.late.unwrap().result_basis.is_empty());
    assert_eq!(end.call.driver_calls, 1);
}

/// Debian's real driver 550.163.01 loaded on a VM without a GPU (`cargo xtask vm-test`; the
/// facts are `uvmwatch_testbed::snapshot::gpuless_550`): the control and UVM nodes open, one
/// `NV_ESC_RM_CONTROL` on `/dev/nvidiactl` fails with `NV_ERR_INVALID_LOCK_STATE` (0x2f),
/// and `cuInit` returns 999 after 80 ms. The host's facts explain it: `no_gpu` rides on the
/// `cuinit_end`, observed, with the result and the failed call among its evidence; the static
/// finding of the same rule was reported at start. A successful `cuInit` there is not judged.
#[test]
fn a_cuinit_999_on_a_driver_without_a_gpu_is_named_no_gpu() {
    let facts = tempfile::tempdir().unwrap();
    uvmwatch_testbed::write_snapshot_fixture(
        facts.path(),
        &uvmwatch_testbed::snapshot::gpuless_550(),
    )
    .unwrap();
    let root = fake_proc();
    let (mut o, rec) = observer_with_facts(root.path(), facts.path().to_path_buf());
    let t = clock::monotonic_ns();
    o.handle(cuinit_enter(PID, t));
    let mut ctl = OpenEvent {
        header: header(EVENT_OPEN, PID, t + MS),
        start_ns: t,
        ret: 3,
        flags: OPEN_IN_CUINIT,
        node: node::CTL,
        minor: 255,
        ..OpenEvent::default()
    };
    ctl.path[..14].copy_from_slice(b"/dev/nvidiactl");
    o.handle(KernelRecord::Open(ctl));
    o.handle(rm_ioctl(PID, t + 2 * MS, t + 3 * MS, 0));
    o.handle(rm_ioctl(PID, t + 4 * MS, t + 5 * MS, 0x2f));
    o.handle(open(PID, "/dev/nvidia-uvm", t + 6 * MS, 4, OPEN_IN_CUINIT));
    o.handle(cuinit_exit(PID, t, t + 80 * MS, 999));
    let evs = rec.take();
    let end = the_end(&evs);
    assert_eq!((end.code, end.result.as_str()), (999, "CUDA_ERROR_UNKNOWN"));
    let failure = end.call.last_failure.clone().unwrap();
    assert_eq!(
        (failure.what.as_str(), failure.result.as_str()),
        (
            "NV_ESC_RM_CONTROL on /dev/nvidiactl",
            "NV_ERR_INVALID_LOCK_STATE"
        )
    );
    let rules: Vec<&str> = end.findings.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(rules, ["no_gpu"]);
    let f = &end.findings[0];
    assert_eq!(f.basis, Basis::Observed);
    // The driver registered no GPU: the cause's decisive signal.
    assert!(
        f.rests_on(crate::doctor::signal::Sig::DriverRegisteredNoGpu),
        "{f:#?}"
    );
    let ev = f.evidence_text();
    for needle in [
        "symptom=cuInit returned 999 (CUDA_ERROR_UNKNOWN) after 0.08 s; inside it: \
         NV_ESC_RM_CONTROL on /dev/nvidiactl -> NV_ERR_INVALID_LOCK_STATE",
        "[probe:cuInit]",
        "driver_registered_no_gpu=empty: the driver registered no GPU [/proc/driver/nvidia/gpus]",
        "Failed to initialize NVML: No supported GPUs were found (exit status 255) [nvidia-smi -q]",
    ] {
        assert!(ev.contains(needle), "{needle}: {ev}");
    }
    // One diagnosis event for it, triggered by the cuInit.
    let d: Vec<_> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::Diagnosis(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].finding.rule.as_str(), d[0].trigger),
        ("no_gpu", Trigger::CuinitEnd)
    );

    // Near miss: a cuInit that succeeds there is not judged.
    o.handle(cuinit_enter(PID, t + S));
    o.handle(cuinit_exit(PID, t + S, t + S + 300 * MS, 0));
    let end = the_end(&rec.take());
    assert_eq!(end.code, 0);
    assert!(end.findings.is_empty());
}

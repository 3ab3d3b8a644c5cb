//! The `cuInit` calls in progress, per thread: what each did so far (driver calls, opens,
//! failures, kernel-side signals), kept from its start to its end so the end record and the
//! diagnosis can tell the whole story ([`CallSummary`]); which processes' `cuInit`
//! succeeded (a child forked from one without exec cannot use CUDA); and the device count
//! each process was last told (`cuDeviceGetCount`), for a failed context creation's
//! diagnosis.

use std::collections::{HashMap, HashSet};

use crate::{
    doctor::{facts::SeenCall, signal::is_gpu_node},
    event::{CallSummary, FailedStep, Ioctl, Open},
};

/// Kernel-side signals kept per call at most.
const MAX_SIGNALS: usize = 16;

#[derive(Debug, Default)]
struct Call {
    tgid: u32,
    /// Parent this process was forked from without exec (0: none).
    forked_from: u32,
    /// Found at its first driver call, its entry not seen (a late call).
    late: bool,
    /// Its start (ns): its entry, or a late call's first driver call.
    start_ns: u64,
    /// When it started, or its last driver call or open ended (ns): a late call with no
    /// call in flight that has been quiet for a while is over.
    last_activity_ns: u64,
    summary: CallSummary,
}

/// The calls in progress, the initialised processes, the device count each process was
/// last told, and the version of the libcuda each process loaded while it was not probed.
#[derive(Debug, Default)]
pub struct Calls {
    by_thread: HashMap<u32, Call>,
    initialized: HashSet<u32>,
    device_counts: HashMap<u32, i32>,
    libcuda_versions: HashMap<u32, String>,
}

impl Calls {
    /// A `cuInit` started on `tid` at `start_ns`; `late`: found at its first driver call.
    pub fn start(&mut self, tgid: u32, tid: u32, forked_from: u32, late: bool, start_ns: u64) {
        self.by_thread.insert(
            tid,
            Call {
                tgid,
                forked_from,
                late,
                start_ns,
                last_activity_ns: start_ns,
                ..Call::default()
            },
        );
    }

    /// The late calls (found at their first driver call) of threads not in `busy` whose
    /// last driver call ended before `quiet_since_ns`, as (tgid, tid, last activity ns).
    pub fn quiet_late(&self, quiet_since_ns: u64, busy: &HashSet<u32>) -> Vec<(u32, u32, u64)> {
        let mut out: Vec<(u32, u32, u64)> = self
            .by_thread
            .iter()
            .filter(|(tid, c)| c.late && c.last_activity_ns < quiet_since_ns && !busy.contains(tid))
            .map(|(tid, c)| (c.tgid, *tid, c.last_activity_ns))
            .collect();
        out.sort_unstable();
        out
    }

    /// When the thread's `cuInit` in progress started.
    pub fn start_of(&self, tid: u32) -> Option<u64> {
        self.by_thread.get(&tid).map(|c| c.start_ns)
    }

    /// `tgid`'s `cuInit` is known to have succeeded though its return was not seen.
    pub fn set_initialized(&mut self, tgid: u32) {
        self.initialized.insert(tgid);
    }

    /// The version in the name of the libcuda file `tgid` loaded before it was probed
    /// (`libcuda.so.535.261.03`), for a late call's result.
    pub fn loaded_libcuda(&mut self, tgid: u32, version: String) {
        self.libcuda_versions.insert(tgid, version);
    }

    /// See [`Calls::loaded_libcuda`].
    pub fn libcuda_version(&self, tgid: u32) -> Option<&str> {
        self.libcuda_versions.get(&tgid).map(String::as_str)
    }

    /// The thread's `cuInit` ended (returned, or its thread died): its summary, when its
    /// start was seen. A process whose `cuInit` returned 0 is remembered as initialised.
    pub fn end(&mut self, tgid: u32, tid: u32, succeeded: bool) -> Option<CallSummary> {
        if succeeded {
            self.initialized.insert(tgid);
        }
        let c = self.by_thread.remove(&tid)?;
        Some(self.summary_of(c))
    }

    /// What the thread's `cuInit` did so far (a stall report), when one is in progress.
    pub fn so_far(&self, tid: u32) -> Option<CallSummary> {
        let c = self.by_thread.get(&tid)?;
        Some(CallSummary {
            forked_after_parent_init: self.forked_after_init(c.forked_from),
            ..c.summary.clone()
        })
    }

    fn summary_of(&self, c: Call) -> CallSummary {
        CallSummary {
            forked_after_parent_init: self.forked_after_init(c.forked_from),
            ..c.summary
        }
    }

    /// Whether a `cuInit` of `tgid` was seen returning 0 (since its last exec).
    pub fn initialized(&self, tgid: u32) -> bool {
        self.initialized.contains(&tgid)
    }

    /// `cuDeviceGetCount` returned `count` in `tgid`.
    pub fn device_count(&mut self, tgid: u32, count: i32) {
        self.device_counts.insert(tgid, count);
    }

    /// The device count `tgid` was last told (since its last exec).
    pub fn device_count_seen(&self, tgid: u32) -> Option<i32> {
        self.device_counts.get(&tgid).copied()
    }

    /// Whether a `cuInit` succeeded in `parent` (0: no parent).
    pub fn forked_after_init(&self, parent: u32) -> bool {
        parent != 0 && self.initialized.contains(&parent)
    }

    /// A driver call inside the thread's `cuInit`, which ended at `end_ns`.
    pub fn ioctl(&mut self, tid: u32, io: &Ioctl, seconds: f64, end_ns: u64) {
        if let Some(c) = self.by_thread.get_mut(&tid) {
            c.summary.driver_calls += 1;
            c.last_activity_ns = c.last_activity_ns.max(end_ns);
            if io.failed {
                c.summary.last_failure = Some(FailedStep {
                    what: format!("{} on {}", io.name, io.node),
                    call: io.label.to_string(),
                    node: io.node.trim_start_matches("/dev/").to_string(),
                    result: io.result.clone(),
                });
                c.summary.failed_call = Some(SeenCall {
                    call: io.name.clone(),
                    node: io.node.clone(),
                    result: io.result.clone(),
                    seconds,
                });
            }
        }
    }

    /// A device open inside the thread's `cuInit`, which ended at `end_ns` and took
    /// `seconds` (`None`: its start was not seen). The first successful open of a GPU node
    /// is timed for the diagnosis (slow without persistence); a failed one is the call's
    /// failure whether it was timed or not.
    pub fn open(&mut self, tid: u32, o: &Open, seconds: Option<f64>, end_ns: u64) {
        if let Some(c) = self.by_thread.get_mut(&tid) {
            c.summary.device_opens += 1;
            c.last_activity_ns = c.last_activity_ns.max(end_ns);
            if let Some(errno) = &o.errno {
                c.summary.last_failure = Some(FailedStep {
                    what: format!("open {}", o.path),
                    call: "open".into(),
                    node: o.node.clone(),
                    result: errno.clone(),
                });
                c.summary.failed_opens.push((o.path.clone(), errno.clone()));
            } else if c.summary.first_gpu_open_seconds.is_none() && is_gpu_node(&o.path) {
                c.summary.first_gpu_open_seconds = seconds;
            }
        }
    }

    /// A kernel-side signal on the thread (kept with its `cuInit`, if one runs).
    pub fn kernel_signal(&mut self, tid: u32, signal: String) {
        if let Some(c) = self.by_thread.get_mut(&tid) {
            if c.summary.kernel_signals.len() < MAX_SIGNALS {
                c.summary.kernel_signals.push(signal);
            }
        }
    }

    /// The process exec'ed: its CUDA state is gone.
    pub fn exec(&mut self, tgid: u32) {
        self.initialized.remove(&tgid);
        self.device_counts.remove(&tgid);
        self.libcuda_versions.remove(&tgid);
    }

    /// The process exited: its calls in progress are dropped; returns its late calls still
    /// open (tid, start ns, what they did), which end here.
    pub fn exit(&mut self, tgid: u32) -> Vec<(u32, u64, CallSummary)> {
        let late: Vec<u32> = self
            .by_thread
            .iter()
            .filter(|(_, c)| c.tgid == tgid && c.late)
            .map(|(tid, _)| *tid)
            .collect();
        let mut out = Vec::new();
        for tid in late {
            if let Some(c) = self.by_thread.remove(&tid) {
                let start = c.start_ns;
                out.push((tid, start, self.summary_of(c)));
            }
        }
        out.sort_by_key(|(tid, _, _)| *tid);
        self.by_thread.retain(|_, c| c.tgid != tgid);
        self.device_counts.remove(&tgid);
        self.libcuda_versions.remove(&tgid);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ioctl(name: &str, result: &str, failed: bool) -> Ioctl {
        Ioctl {
            start_ns: 0,
            cmd: 0x25,
            name: name.into(),
            label: "UVM_REGISTER_GPU",
            node: "/dev/nvidia-uvm".into(),
            result: result.into(),
            ret: 0,
            failed,
            slow: false,
            in_cuinit: true,
        }
    }

    #[test]
    fn a_call_sums_up_what_it_did_and_its_last_failure() {
        let mut c = Calls::default();
        c.start(10, 11, 0, false, 0);
        c.ioctl(11, &ioctl("UVM_INITIALIZE", "NV_OK", false), 0.001, 1);
        c.ioctl(
            11,
            &ioctl("UVM_REGISTER_GPU", "NV_ERR_NO_MEMORY", true),
            0.5,
            1,
        );
        let open = |path: &str, errno: Option<&str>| Open {
            start_ns: 0,
            path: path.into(),
            node: path.trim_start_matches("/dev/").into(),
            errno: errno.map(str::to_string),
            ret: if errno.is_some() { -1 } else { 5 },
            fd: errno.is_none().then_some(5),
            timed: true,
            in_cuinit: true,
            findings: vec![],
        };
        // The first successful open of a GPU node is timed; nvidiactl, a failed open and
        // later opens are not.
        c.open(11, &open("/dev/nvidiactl", None), Some(0.001), 1);
        c.open(11, &open("/dev/nvidia1", Some("EIO")), None, 1);
        c.open(11, &open("/dev/nvidia0", None), Some(1.5), 1);
        c.open(11, &open("/dev/nvidia1", None), Some(0.004), 1);
        c.kernel_signal(11, "request_free_mem_region = -34 (ERANGE)".into());
        c.ioctl(99, &ioctl("UVM_FREE", "NV_OK", false), 0.0, 1);
        let s = c.so_far(11).unwrap();
        assert_eq!(s.driver_calls, 2);
        assert_eq!(s.device_opens, 4);
        assert_eq!(s.first_gpu_open_seconds, Some(1.5));
        let f = s.last_failure.clone().unwrap();
        assert_eq!(
            (f.what.as_str(), f.call.as_str()),
            ("open /dev/nvidia1", "open")
        );
        assert_eq!((f.node.as_str(), f.result.as_str()), ("nvidia1", "EIO"));
        assert_eq!(
            s.failed_call.as_ref().map(|c| c.call.as_str()),
            Some("UVM_REGISTER_GPU")
        );
        assert_eq!(s.failed_call.unwrap().seconds, 0.5);
        assert_eq!(s.kernel_signals.len(), 1);
        assert_eq!(c.end(10, 11, false).unwrap().driver_calls, 2);
        assert!(c.end(10, 11, false).is_none());
        assert!(c.so_far(99).is_none());
    }

    #[test]
    fn a_child_forked_after_its_parent_initialised_is_flagged_until_the_parent_execs() {
        let mut c = Calls::default();
        c.end(10, 10, true);
        c.start(20, 20, 10, false, 0);
        assert!(c.so_far(20).unwrap().forked_after_parent_init);
        c.exec(10);
        assert!(!c.end(20, 20, false).unwrap().forked_after_parent_init);
        c.start(30, 31, 0, false, 0);
        c.exit(30);
        assert!(c.so_far(31).is_none());
    }

    #[test]
    fn a_process_keeps_its_last_device_count_until_it_execs_or_exits() {
        let mut c = Calls::default();
        assert_eq!(c.device_count_seen(10), None);
        c.device_count(10, 2);
        c.device_count(10, 1);
        c.device_count(20, 8);
        assert_eq!(c.device_count_seen(10), Some(1));
        c.exec(10);
        assert_eq!(c.device_count_seen(10), None);
        c.exit(20);
        assert_eq!(c.device_count_seen(20), None);
        assert!(!c.initialized(30));
        c.end(30, 30, true);
        assert!(c.initialized(30));
    }
}

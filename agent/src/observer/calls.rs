//! The `cuInit` calls in progress, per thread: what each did so far (driver calls, opens,
//! failures, kernel-side signals), kept from its start to its end so the end record and the
//! diagnosis can tell the whole story ([`CallSummary`]); which processes' `cuInit`
//! succeeded (a child forked from one without exec cannot use CUDA); and the device count
//! each process was last told (`cuDeviceGetCount`), for a failed context creation's
//! diagnosis.

use std::collections::{HashMap, HashSet};

use crate::{
    doctor::{facts::SeenCall, rules::is_gpu_node},
    event::{CallSummary, Ioctl, Open},
};

/// Kernel-side signals kept per call at most.
const MAX_SIGNALS: usize = 16;

#[derive(Debug, Default)]
struct Call {
    tgid: u32,
    /// Parent this process was forked from without exec (0: none).
    forked_from: u32,
    summary: CallSummary,
}

/// The calls in progress, the initialised processes, and the device count each process
/// was last told.
#[derive(Debug, Default)]
pub struct Calls {
    by_thread: HashMap<u32, Call>,
    initialized: HashSet<u32>,
    device_counts: HashMap<u32, i32>,
}

impl Calls {
    /// A `cuInit` started on `tid`.
    pub fn start(&mut self, tgid: u32, tid: u32, forked_from: u32) {
        self.by_thread.insert(
            tid,
            Call {
                tgid,
                forked_from,
                ..Call::default()
            },
        );
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

    /// A driver call inside the thread's `cuInit`.
    pub fn ioctl(&mut self, tid: u32, io: &Ioctl, seconds: f64) {
        if let Some(c) = self.by_thread.get_mut(&tid) {
            c.summary.driver_calls += 1;
            if io.failed {
                c.summary.last_failure =
                    Some((format!("{} on {}", io.name, io.node), io.result.clone()));
                c.summary.failed_call = Some(SeenCall {
                    call: io.name.clone(),
                    node: io.node.clone(),
                    result: io.result.clone(),
                    seconds,
                });
            }
        }
    }

    /// A device open inside the thread's `cuInit`, which took `seconds`. The first
    /// successful open of a GPU node is timed for the diagnosis (slow without persistence).
    pub fn open(&mut self, tid: u32, o: &Open, seconds: f64) {
        if let Some(c) = self.by_thread.get_mut(&tid) {
            c.summary.device_opens += 1;
            if let Some(errno) = &o.errno {
                c.summary.last_failure = Some((format!("open {}", o.path), errno.clone()));
                c.summary.failed_opens.push((o.path.clone(), errno.clone()));
            } else if c.summary.first_gpu_open_seconds.is_none() && is_gpu_node(&o.path) {
                c.summary.first_gpu_open_seconds = Some(seconds);
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
    }

    /// The process exited: its calls in progress are dropped.
    pub fn exit(&mut self, tgid: u32) {
        self.by_thread.retain(|_, c| c.tgid != tgid);
        self.device_counts.remove(&tgid);
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
        c.start(10, 11, 0);
        c.ioctl(11, &ioctl("UVM_INITIALIZE", "NV_OK", false), 0.001);
        c.ioctl(
            11,
            &ioctl("UVM_REGISTER_GPU", "NV_ERR_NO_MEMORY", true),
            0.5,
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
        c.open(11, &open("/dev/nvidiactl", None), 0.001);
        c.open(11, &open("/dev/nvidia1", Some("EIO")), 0.002);
        c.open(11, &open("/dev/nvidia0", None), 1.5);
        c.open(11, &open("/dev/nvidia1", None), 0.004);
        c.kernel_signal(11, "request_free_mem_region = -34 (ERANGE)".into());
        c.ioctl(99, &ioctl("UVM_FREE", "NV_OK", false), 0.0);
        let s = c.so_far(11).unwrap();
        assert_eq!(s.driver_calls, 2);
        assert_eq!(s.device_opens, 4);
        assert_eq!(s.first_gpu_open_seconds, Some(1.5));
        assert_eq!(
            s.last_failure,
            Some(("open /dev/nvidia1".into(), "EIO".into()))
        );
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
        c.start(20, 20, 10);
        assert!(c.so_far(20).unwrap().forked_after_parent_init);
        c.exec(10);
        assert!(!c.end(20, 20, false).unwrap().forked_after_parent_init);
        c.start(30, 31, 0);
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

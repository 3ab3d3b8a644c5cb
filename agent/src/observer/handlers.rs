//! One handler per kind of kernel record: each builds its [`Event`] once, with the names
//! resolved, the process's identity attached and what the thread's `cuInit` did so far, and
//! emits it; and the stall scan, which reports the calls in flight past their threshold.

use std::sync::Arc;

use uvmwatch_common::{
    context_call, node, result, ContextCallEvent, CuinitEvent, EventHeader, IoctlEvent,
    KernelFnEvent, OpenEvent, TaskEvent, CTX_COUNT_READ, CTX_ENTRY_SEEN, CUINIT_LATE,
    DIED_IN_CUINIT, DIED_IN_IOCTL, DIED_IN_LATE_CUINIT, IOCTL_FAILED, IOCTL_IN_CUINIT, IOCTL_SLOW,
    LATE_END_RETURN, OPEN_FD_UNKNOWN, OPEN_IN_CUINIT, OPEN_LIBCUDA, OPEN_LIBCUDA_UNPROBED,
    OPEN_NO_START,
};

use super::{
    late,
    stall::{CallKey, CallKind, InFlight},
    KernelSide, Observer,
};
use crate::{
    clock,
    decode::{
        errno, nvidia,
        record::{cstr, KernelRecord},
    },
    event::{
        ContextCall, CuinitEnd, DiedInCall, Event, Inside, Ioctl, KernelSignal, Kind, LateCall,
        Open, Process, Seen, Stall, StallEnd, StallOutcome, ThreadSnapshot,
    },
    host::procfs,
    kernel::registry::kernel_fn_name,
};

/// A thread in flight for longer than this that `/proc` no longer shows is forgotten (it
/// vanished without an exit record, e.g. before the agent started): never a phantom stall.
const GONE_AFTER_NS: u64 = 1_000_000_000;

impl<K: KernelSide> Observer<K> {
    /// Handles one decoded record.
    pub(super) fn handle(&mut self, r: KernelRecord) {
        match r {
            KernelRecord::CuinitEnter(e) => self.on_cuinit_enter(&e),
            KernelRecord::CuinitExit(e) => self.on_cuinit_exit(&e),
            KernelRecord::Ioctl(e) => self.on_ioctl(&e),
            KernelRecord::Open(e) => self.on_open(&e),
            KernelRecord::KernelFn(e) => self.on_kernel_fn(&e),
            KernelRecord::ContextCall(e) => self.on_context_call(&e),
            KernelRecord::DiedInCall(e) => self.on_died(&e),
            KernelRecord::Fork(e) => {
                let ev = self.bare(&e.header, Kind::Fork { child: e.aux });
                self.dispatch(ev);
            }
            KernelRecord::Exec(e) => {
                // A new image: its CUDA state and the identity read before are gone.
                self.calls.exec(e.header.tgid);
                self.identities.forget(e.header.tgid);
                let ev = self.bare(&e.header, Kind::Exec);
                self.dispatch(ev);
            }
            KernelRecord::ProcExit(e) => {
                // A late cuInit still open ends with its process (its thread's exit record
                // normally ended it first).
                for (tid, start_ns, call) in self.calls.exit(e.header.tgid) {
                    let h = EventHeader { tid, ..e.header };
                    self.end_late(&h, start_ns, "process_exited", call);
                }
                self.identities.forget(e.header.tgid);
                let ev = self.bare(&e.header, Kind::ProcessExit);
                self.dispatch(ev);
            }
        }
    }

    /// An event about the record's process and thread, at the record's time.
    fn about(&mut self, h: &EventHeader, kind: Kind) -> Event {
        let comm = cstr(&h.comm);
        Event {
            ts_ns: h.ts_ns,
            process: Some(self.identities.get(h.tgid, &comm)),
            tid: h.tid,
            comm,
            kind,
        }
    }

    /// Like [`Observer::about`], without reading the process's identity (it is exec'ing,
    /// exiting, or only forking).
    fn bare(&self, h: &EventHeader, kind: Kind) -> Event {
        let comm = cstr(&h.comm);
        Event {
            ts_ns: h.ts_ns,
            process: Some(Arc::new(Process::named(h.tgid, &comm))),
            tid: h.tid,
            comm,
            kind,
        }
    }

    fn on_cuinit_enter(&mut self, e: &CuinitEvent) {
        let h = &e.header;
        self.check_driver_if_unknown();
        let late = e.late == CUINIT_LATE;
        self.calls
            .start(h.tgid, h.tid, e.forked_from, late, e.start_ns);
        let ev = self.about(
            h,
            Kind::CuinitStart {
                start_ns: e.start_ns,
                flags: e.flags,
                late,
            },
        );
        self.dispatch(ev);
    }

    fn on_cuinit_exit(&mut self, e: &CuinitEvent) {
        let h = &e.header;
        let call = self
            .calls
            .end(h.tgid, h.tid, e.late <= LATE_END_RETURN && e.ret == 0);
        // A late call user space already ended (found quiet) is not ended twice.
        if e.late != 0 && call.is_none() {
            return;
        }
        let mut call = call.unwrap_or_default();
        call.forked_after_parent_init = self.calls.forked_after_init(e.forked_from);
        match e.late {
            0 => {
                let seen = if e.entry_seen == 1 {
                    Seen::Whole
                } else {
                    Seen::Return
                };
                self.end_cuinit(h, e.start_ns, e.ret, seen, None, call);
            }
            LATE_END_RETURN => {
                let late = LateCall {
                    ended: late::ended(e.late),
                    result_basis: String::new(),
                };
                self.end_cuinit(
                    h,
                    e.start_ns,
                    e.ret,
                    Seen::Return,
                    Some(Box::new(late)),
                    call,
                );
            }
            why => self.end_late(h, e.start_ns, late::ended(why), call),
        }
    }

    /// A late call that started at `start_ns` and whose return was not seen ended at the
    /// record's time, for `ended`: its result from its driver calls ([`late::infer`]),
    /// `unknown` when they do not tell.
    fn end_late(
        &mut self,
        h: &EventHeader,
        start_ns: u64,
        ended: &'static str,
        call: crate::event::CallSummary,
    ) {
        let inferred = late::infer(
            &call,
            ended,
            self.calls.libcuda_version(h.tgid),
            self.driver.version(),
        );
        let (code, result_basis) = inferred.unwrap_or((-1, String::new()));
        if code == 0 {
            self.calls.set_initialized(h.tgid);
        }
        let late = LateCall {
            ended,
            result_basis,
        };
        self.end_cuinit(
            h,
            start_ns,
            code,
            Seen::DriverCalls,
            Some(Box::new(late)),
            call,
        );
    }

    /// A `cuInit` ended: its stall, if it had one, ends with it, then the `CuinitEnd`
    /// event (judged) with what it did.
    fn end_cuinit(
        &mut self,
        h: &EventHeader,
        start_ns: u64,
        code: i64,
        seen: Seen,
        late: Option<Box<LateCall>>,
        mut call: crate::event::CallSummary,
    ) {
        let result = if code < 0 {
            "unknown".to_string()
        } else {
            nvidia::cu_result_name(code)
        };
        let key = CallKey {
            kind: CallKind::Cuinit,
            tid: h.tid,
            start_ns,
        };
        call.stalled = self.detector.end(&key).is_some();
        if call.stalled {
            let ev = self.about(
                h,
                Kind::StallEnd(StallEnd {
                    kind: CallKind::Cuinit,
                    call: "cuInit".into(),
                    label: "cuInit".into(),
                    start_ns,
                    outcome: StallOutcome::Returned,
                    node: None,
                    result: Some(result.clone()),
                    code: (code >= 0).then_some(code),
                }),
            );
            self.dispatch(ev);
        }
        let ev = self.about(
            h,
            Kind::CuinitEnd(CuinitEnd {
                start_ns,
                code,
                result,
                seen,
                late,
                call,
                findings: Vec::new(),
            }),
        );
        self.emit(ev);
    }

    fn on_ioctl(&mut self, e: &IoctlEvent) {
        let h = &e.header;
        let io = Ioctl {
            start_ns: e.start_ns,
            cmd: e.cmd,
            name: nvidia::ioctl_display(e.node, e.cmd),
            label: nvidia::ioctl_label(e.node, e.cmd),
            node: nvidia::node_path(e.node, e.minor),
            result: nvidia::ioctl_result_label(e.result_kind, e.status),
            ret: e.ret,
            failed: e.flags & IOCTL_FAILED != 0,
            slow: e.flags & IOCTL_SLOW != 0,
            in_cuinit: e.flags & IOCTL_IN_CUINIT != 0,
        };
        // A call on a negative fd never reached a driver: it is counted and logged as what it
        // is, but is neither a driver call of the cuInit nor its failure (the failed open
        // before it is).
        if io.in_cuinit && e.node != node::INVALID_FD {
            let secs = h.ts_ns.saturating_sub(e.start_ns) as f64 / 1e9;
            self.calls.ioctl(h.tid, &io, secs, h.ts_ns);
        }
        let key = CallKey {
            kind: CallKind::Ioctl,
            tid: h.tid,
            start_ns: e.start_ns,
        };
        if self.detector.end(&key).is_some() {
            let ev = self.about(
                h,
                Kind::StallEnd(StallEnd {
                    kind: CallKind::Ioctl,
                    call: io.name.clone(),
                    label: io.label.to_string(),
                    start_ns: e.start_ns,
                    outcome: StallOutcome::Returned,
                    node: Some(io.node.clone()),
                    result: Some(io.result.clone()),
                    code: None,
                }),
            );
            self.dispatch(ev);
        }
        let ev = self.about(h, Kind::Ioctl(io));
        self.dispatch(ev);
    }

    fn on_open(&mut self, e: &OpenEvent) {
        let h = &e.header;
        let path = cstr(&e.path);
        if e.flags & OPEN_LIBCUDA != 0 {
            // Loaded before it is probed: a cuInit made at once is found from its driver
            // calls, and its result may rest on the library's release, read from its content
            // when its name lacks it: opened now, while the process runs, read after the
            // attach, which comes first since the process may call cuInit at once.
            let unprobed = if e.flags & OPEN_LIBCUDA_UNPROBED != 0 {
                self.discovery
                    .open_opened_libcuda(&self.cfg.proc_root, h.tgid, &path)
            } else {
                None
            };
            match self
                .discovery
                .from_opened_path(&self.cfg.proc_root, h.tgid, &path)
            {
                Ok(Some(t)) => self.attach(t, Some(h.ts_ns)),
                Ok(None) => {}
                Err(err) => {
                    let error = format!("{err:#}");
                    let ev = self.bare(h, Kind::LibcudaUnresolved { path, error });
                    self.dispatch(ev);
                }
            }
            if let Some(v) = unprobed.and_then(|f| self.discovery.opened_libcuda_version(f)) {
                self.calls.loaded_libcuda(h.tgid, v);
            }
            return;
        }
        if e.ret >= 0 {
            self.check_driver_if_unknown();
        }
        // A successful open is identified by its file, not its path: it is named by the
        // node's /dev path.
        let path = if path.is_empty() {
            nvidia::node_path(e.node, e.minor)
        } else {
            path
        };
        let o = Open {
            start_ns: e.start_ns,
            node: nvidia::node_label(e.node, e.minor),
            errno: (e.ret < 0).then(|| errno::label((-e.ret) as u32)),
            path,
            ret: e.ret,
            fd: (e.ret >= 0 && e.flags & OPEN_FD_UNKNOWN == 0).then_some(e.ret),
            timed: e.flags & OPEN_NO_START == 0,
            in_cuinit: e.flags & OPEN_IN_CUINIT != 0,
            findings: Vec::new(),
        };
        // An open whose start was not seen has no duration to judge, but its failure is the
        // call's all the same.
        if o.in_cuinit {
            let secs = h.ts_ns.saturating_sub(e.start_ns) as f64 / 1e9;
            self.calls.open(h.tid, &o, o.timed.then_some(secs), h.ts_ns);
        }
        let ev = self.about(h, Kind::Open(o));
        self.emit(ev);
    }

    /// A probed kernel or driver function failed: kept as a kernel-side signal of the
    /// thread's `cuInit` for the diagnosis rules.
    fn on_kernel_fn(&mut self, e: &KernelFnEvent) {
        let h = &e.header;
        let result = if e.kind == result::ERRNO {
            format!("-{} ({})", e.code, errno::label(e.code))
        } else {
            nvidia::nv_status_label(e.code)
        };
        let s = KernelSignal {
            start_ns: e.start_ns,
            function: kernel_fn_name(e.func),
            result,
            in_uvm_ioctl: e.in_uvm_ioctl == 1,
        };
        self.calls.kernel_signal(h.tid, s.text());
        let ev = self.about(h, Kind::KernelSignal(s));
        self.dispatch(ev);
    }

    /// A context creation or `cuDeviceGetCount` returned: with what the process's `cuInit`
    /// and device count were, judged when it failed or when its count is below the GPUs
    /// the process has.
    fn on_context_call(&mut self, e: &ContextCallEvent) {
        let h = &e.header;
        let count = (e.call == context_call::DEVICE_GET_COUNT && e.flags & CTX_COUNT_READ != 0)
            .then_some(e.count);
        if let Some(n) = count {
            self.calls.device_count(h.tgid, n);
        }
        // What the process was given, for a count to be judged against and for a failure's
        // diagnosis (read once per count the process is told, or per failure).
        let (gpu_nodes, cuda_visible_devices) = if count.is_some() || e.ret != 0 {
            (
                procfs::gpu_nodes(&self.cfg.proc_root, h.tgid),
                procfs::environ_var(&self.cfg.proc_root, h.tgid, "CUDA_VISIBLE_DEVICES"),
            )
        } else {
            (None, None)
        };
        let count_disagrees = match (count, self.diagnosis.as_ref()) {
            (Some(n), Some(d)) if e.ret == 0 => {
                d.device_count_disagrees(n, gpu_nodes, cuda_visible_devices.as_deref())
            }
            _ => false,
        };
        let c = ContextCall {
            start_ns: e.start_ns,
            call: context_call::name(e.call),
            code: e.ret,
            result: nvidia::cu_result_name(e.ret),
            device: (e.device >= 0 && context_call::creates_context(e.call)).then_some(e.device),
            count,
            entry_seen: e.flags & CTX_ENTRY_SEEN != 0,
            cuinit_succeeded: self.calls.initialized(h.tgid),
            device_count_seen: self.calls.device_count_seen(h.tgid),
            gpu_nodes,
            cuda_visible_devices,
            count_disagrees,
            findings: Vec::new(),
        };
        let ev = self.about(h, Kind::ContextCall(c));
        self.emit(ev);
    }

    fn on_died(&mut self, e: &TaskEvent) {
        let h = &e.header;
        // A late cuInit with no driver call in flight, not stalled, was most likely over
        // before its thread exited (its return was not seen): it ends here, no death
        // inside it. A stalled one died in it.
        let stalled = self.detector.is_reported(&CallKey {
            kind: CallKind::Cuinit,
            tid: h.tid,
            start_ns: e.start_ns,
        });
        if e.what & DIED_IN_LATE_CUINIT != 0 && e.what & DIED_IN_IOCTL == 0 && !stalled {
            if let Some(call) = self.calls.end(h.tgid, h.tid, false) {
                self.end_late(h, e.start_ns, "thread_exited", call);
            }
            return;
        }
        let mut calls = Vec::new();
        let mut cuinit_seen = false;
        if e.what & DIED_IN_CUINIT != 0 {
            calls.push("cuInit".to_string());
            cuinit_seen = self.calls.end(h.tgid, h.tid, false).is_some();
        }
        if e.what & DIED_IN_IOCTL != 0 {
            calls.push(nvidia::ioctl_display(e.node, e.aux));
        }
        for c in self.detector.end_thread(h.tid) {
            let ev = self.about(
                h,
                Kind::StallEnd(StallEnd {
                    kind: c.key.kind,
                    call: c.call,
                    label: c.label,
                    start_ns: c.key.start_ns,
                    outcome: StallOutcome::ThreadExited,
                    node: None,
                    result: None,
                    code: None,
                }),
            );
            self.dispatch(ev);
        }
        let ev = self.about(h, Kind::DiedInCall(DiedInCall { calls, cuinit_seen }));
        self.dispatch(ev);
    }

    // --- stalls --------------------------------------------------------------------------

    /// Everything in flight now, from the kernel's maps; threads gone without an exit record
    /// are dropped from the maps.
    fn snapshot(&mut self, now: u64) -> Vec<InFlight> {
        let (cu, io) = {
            let k = self.kernel();
            (
                k.inflight_cuinit().unwrap_or_default(),
                k.inflight_ioctls().unwrap_or_default(),
            )
        };
        let calls = cu
            .into_iter()
            .map(|(tid, c)| InFlight {
                key: CallKey {
                    kind: CallKind::Cuinit,
                    tid,
                    start_ns: c.start_ns,
                },
                tgid: c.tgid,
                call: "cuInit".into(),
                label: "cuInit".into(),
                node: node::NONE,
                minor: 0,
                late: c.late != 0,
            })
            .chain(io.into_iter().map(|(tid, i)| InFlight {
                key: CallKey {
                    kind: CallKind::Ioctl,
                    tid,
                    start_ns: i.start_ns,
                },
                tgid: i.tgid,
                call: nvidia::ioctl_display(i.node, i.cmd),
                label: nvidia::ioctl_label(i.node, i.cmd).to_string(),
                node: i.node,
                minor: i.minor,
                late: false,
            }));
        let mut out = Vec::new();
        let mut dead = Vec::new();
        for c in calls {
            if now.saturating_sub(c.key.start_ns) > GONE_AFTER_NS
                && !procfs::thread_alive(&self.cfg.proc_root, c.tgid, c.key.tid)
            {
                dead.push(c.key.tid);
                continue;
            }
            out.push(c);
        }
        if !dead.is_empty() {
            let mut k = self.kernel();
            for tid in dead {
                k.forget_thread(tid);
            }
        }
        out
    }

    /// Ends the late calls that have been quiet for [`late::QUIET_NS`] with no driver
    /// call in flight (`snap`): taken out of the kernel's map (unless a probe ended them
    /// meanwhile) and reported as ended at their last driver call.
    fn end_quiet_late(&mut self, snap: &[InFlight], now: u64) {
        let busy: std::collections::HashSet<u32> = snap
            .iter()
            .filter(|c| c.key.kind == CallKind::Ioctl)
            .map(|c| c.key.tid)
            .collect();
        for (tgid, tid, last_ns) in self
            .calls
            .quiet_late(now.saturating_sub(late::QUIET_NS), &busy)
        {
            // A thread inside an open (the first open of a GPU node can take seconds without
            // persistence) or an ioctl is not quiet, whatever the in-flight maps say.
            if let Some((nr, _)) = procfs::syscall_of(&self.cfg.proc_root, tgid, tid) {
                if late::IN_DRIVER_SYSCALLS.contains(&nr) {
                    continue;
                }
            }
            // Taken out of the kernel's map, or already gone from it without a record (an
            // LRU eviction, an exec from another thread): user space ends it either way, and
            // a kernel record of its end that comes after finds no call and is dropped.
            self.kernel().end_late_cuinit(tid);
            let start_ns = self.calls.start_of(tid).unwrap_or(last_ns);
            if let Some(call) = self.calls.end(tgid, tid, false) {
                let h = EventHeader {
                    kind: 0,
                    tgid,
                    tid,
                    _pad: 0,
                    ts_ns: last_ns,
                    comm: [0; uvmwatch_common::COMM_LEN],
                };
                self.end_late(&h, start_ns, "quiet", call);
            }
        }
    }

    /// One pass of the stall scan: new stalls, stalls that vanished, the scan's figures.
    pub(super) fn scan(&mut self) {
        let now = clock::monotonic_ns();
        let snap = self.snapshot(now);
        if self.caught_up {
            self.end_quiet_late(&snap, now);
        }
        let r = self.detector.scan(&snap, now, self.caught_up);
        for c in &r.new_stalls {
            let ev = self.stall_report(c, &snap, now);
            self.emit(ev);
        }
        for c in r.vanished {
            let ev = Event {
                ts_ns: now,
                process: Some(self.identities.get(c.tgid, "")),
                tid: c.key.tid,
                comm: String::new(),
                kind: Kind::StallEnd(StallEnd {
                    kind: c.key.kind,
                    call: c.call,
                    label: c.label,
                    start_ns: c.key.start_ns,
                    outcome: StallOutcome::Ended,
                    node: None,
                    result: None,
                    code: None,
                }),
            };
            self.dispatch(ev);
        }
        let cuinit_in_flight = snap
            .iter()
            .filter(|c| c.key.kind == CallKind::Cuinit)
            .count();
        let figures = self.scan_figures(cuinit_in_flight);
        self.dispatch(Event::agent(now, Kind::Scan(figures)));
    }

    /// The stall of `c`: the driver call its thread is inside, what `/proc` shows of the
    /// thread, what its `cuInit` did so far.
    fn stall_report(&mut self, c: &InFlight, snap: &[InFlight], now: u64) -> Event {
        let tid = c.key.tid;
        let inner = snap
            .iter()
            .find(|o| o.key.kind == CallKind::Ioctl && o.key.tid == tid);
        let node = inner
            .map(|i| nvidia::node_path(i.node, i.minor))
            .unwrap_or_default();
        let inside = inner.map(|i| Inside {
            call: i.call.clone(),
            node: node.clone(),
            start_ns: i.key.start_ns,
        });
        let cuinit_start_ns = snap
            .iter()
            .find(|o| o.key.kind == CallKind::Cuinit && o.key.tid == tid)
            .map(|o| o.key.start_ns);
        let thread = match procfs::read_thread(&self.cfg.proc_root, c.tgid, tid) {
            Ok(t) => ThreadSnapshot {
                read: true,
                state: format!("{} ({})", t.state, t.state_name),
                wchan: t.wchan.unwrap_or_default(),
                exe: t.exe.map(|p| p.display().to_string()).unwrap_or_default(),
                container_id: t.container_id.unwrap_or_default(),
                stack: t.kernel_stack.unwrap_or_default(),
                comm: t.comm,
            },
            Err(_) => ThreadSnapshot::default(),
        };
        let stall = Stall {
            kind: c.key.kind,
            call: c.call.clone(),
            label: c.label.clone(),
            start_ns: c.key.start_ns,
            threshold_ns: self.detector.threshold_ns(c.key.kind),
            node,
            inside,
            cuinit_start_ns,
            call_so_far: self.calls.so_far(tid),
            findings: Vec::new(),
            thread,
        };
        let comm = stall.thread.comm.clone();
        Event {
            ts_ns: now,
            process: Some(self.identities.get(c.tgid, &comm)),
            tid,
            comm,
            kind: Kind::Stall(Box::new(stall)),
        }
    }
}

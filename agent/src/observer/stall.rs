//! Stall detection: which calls in flight crossed their threshold, and which stalls ended.
//!
//! Pure logic over snapshots of the kernel's in-flight maps, so it is tested without a
//! kernel. The agent scans every [`SCAN_INTERVAL`]; a call is reported at most one scan
//! interval (plus the time to read `/proc`) after it crosses its threshold.

use std::{collections::HashMap, time::Duration};

/// How often the in-flight maps are scanned. 50 ms keeps the report within the 250 ms the
/// agent promises with room for reading `/proc`.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(50);

/// How many scans a reported stall may be missing from the maps before it is declared
/// ended without an event (covers the window between the kernel removing the entry and
/// its exit event reaching user space).
const MISSING_SCANS_BEFORE_END: u32 = 2;

pub use crate::event::CallKind;

/// Identity of one call: kind, thread and entry time (a thread makes many calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub kind: CallKind,
    pub tid: u32,
    /// Entry time, ns of `CLOCK_MONOTONIC`.
    pub start_ns: u64,
}

/// One call in flight, from the kernel maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub key: CallKey,
    pub tgid: u32,
    /// `cuInit`, or the ioctl's name (or hex number).
    pub call: String,
    /// Label used in metrics (`cuInit` or the ioctl label, `unknown` for unnamed commands).
    pub label: String,
    /// For an ioctl: the node's kind (`uvmwatch_common::node`) and minor, so a report needs
    /// no second read of the kernel's map.
    pub node: u8,
    pub minor: u8,
    /// A `cuInit` found at its first driver call (its entry not seen): it stalls only while
    /// its thread is stuck in a driver call (one past the ioctl threshold), for its age is
    /// that of its first driver call and its return may simply not have been seen.
    pub late: bool,
}

/// A stall that has been reported and not yet ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    pub call: InFlight,
    /// Scans in a row in which the call was absent from the maps.
    missing: u32,
}

/// Thresholds and the set of reported stalls.
#[derive(Debug)]
pub struct StallDetector {
    cuinit_ns: u64,
    ioctl_ns: u64,
    reported: HashMap<CallKey, Reported>,
}

/// What one scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScanResult {
    /// Calls that crossed their threshold since the last scan.
    pub new_stalls: Vec<InFlight>,
    /// Reported stalls no longer in flight, with no exit event seen.
    pub vanished: Vec<InFlight>,
}

impl StallDetector {
    /// A detector with thresholds for `cuInit` and for driver ioctls.
    pub fn new(cuinit: Duration, ioctl: Duration) -> Self {
        StallDetector {
            cuinit_ns: cuinit.as_nanos() as u64,
            ioctl_ns: ioctl.as_nanos() as u64,
            reported: HashMap::new(),
        }
    }

    /// Threshold for a kind of call, ns.
    pub fn threshold_ns(&self, kind: CallKind) -> u64 {
        match kind {
            CallKind::Cuinit => self.cuinit_ns,
            CallKind::Ioctl => self.ioctl_ns,
        }
    }

    /// Compares a snapshot of everything in flight at `now_ns` with what was reported. A
    /// reported call missing from the snapshot counts towards "vanished" only when
    /// `caught_up` (every record sent so far was handled: its exit record is not queued).
    pub fn scan(&mut self, inflight: &[InFlight], now_ns: u64, caught_up: bool) -> ScanResult {
        let mut out = ScanResult::default();
        // Threads stuck in a driver call: one in flight past the ioctl threshold. A late
        // cuInit's age is that of its first driver call and its return may simply not have
        // been seen, so it stalls only while its thread is stuck so.
        let stuck: std::collections::HashSet<u32> = inflight
            .iter()
            .filter(|c| {
                c.key.kind == CallKind::Ioctl
                    && now_ns.saturating_sub(c.key.start_ns) >= self.ioctl_ns
            })
            .map(|c| c.key.tid)
            .collect();
        for c in inflight {
            if let Some(r) = self.reported.get_mut(&c.key) {
                r.missing = 0;
                continue;
            }
            if c.late && !stuck.contains(&c.key.tid) {
                continue;
            }
            if now_ns.saturating_sub(c.key.start_ns) >= self.threshold_ns(c.key.kind) {
                self.reported.insert(
                    c.key,
                    Reported {
                        call: c.clone(),
                        missing: 0,
                    },
                );
                out.new_stalls.push(c.clone());
            }
        }
        let present: std::collections::HashSet<CallKey> = inflight.iter().map(|c| c.key).collect();
        let mut gone = Vec::new();
        for (k, r) in self.reported.iter_mut() {
            // Not caught up: its exit record may still be queued.
            if !present.contains(k) && caught_up {
                r.missing += 1;
                if r.missing >= MISSING_SCANS_BEFORE_END {
                    gone.push(*k);
                }
            }
        }
        for k in gone {
            if let Some(r) = self.reported.remove(&k) {
                out.vanished.push(r.call);
            }
        }
        out
    }

    /// Whether the call has been reported as stalled (and has not ended).
    pub fn is_reported(&self, key: &CallKey) -> bool {
        self.reported.contains_key(key)
    }

    /// Ends the stall of a call that returned or whose thread died; `None` when that call
    /// was never reported as stalled.
    pub fn end(&mut self, key: &CallKey) -> Option<InFlight> {
        self.reported.remove(key).map(|r| r.call)
    }

    /// Ends every reported stall of a thread (it died).
    pub fn end_thread(&mut self, tid: u32) -> Vec<InFlight> {
        let keys: Vec<CallKey> = self
            .reported
            .keys()
            .filter(|k| k.tid == tid)
            .copied()
            .collect();
        keys.into_iter().filter_map(|k| self.end(&k)).collect()
    }

    /// Reported stalls now, by metric label.
    pub fn stalled_by_label(&self) -> HashMap<String, i64> {
        let mut m = HashMap::new();
        for r in self.reported.values() {
            *m.entry(r.call.label.clone()).or_default() += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn call(kind: CallKind, tid: u32, start: u64) -> InFlight {
        let label = match kind {
            CallKind::Cuinit => "cuInit",
            CallKind::Ioctl => "UVM_REGISTER_GPU",
        };
        InFlight {
            key: CallKey {
                kind,
                tid,
                start_ns: start,
            },
            tgid: 1,
            call: label.into(),
            label: label.into(),
            node: 0,
            minor: 0,
            late: false,
        }
    }

    #[test]
    fn a_late_cuinit_stalls_only_inside_a_driver_call() {
        let mut d = StallDetector::new(Duration::from_secs(20), Duration::from_secs(5));
        let late = InFlight {
            late: true,
            ..call(CallKind::Cuinit, 10, 100 * S)
        };
        // Its thread has no call in flight: its return may just not have been seen.
        assert!(d
            .scan(std::slice::from_ref(&late), 130 * S, true)
            .new_stalls
            .is_empty());
        // A short call in flight now is no reason.
        let quick = call(CallKind::Ioctl, 10, 130 * S);
        assert!(d
            .scan(&[late.clone(), quick], 130 * S + 1000, true)
            .new_stalls
            .is_empty());
        // Stuck in a driver call: the cuInit is stalled too.
        let io = call(CallKind::Ioctl, 10, 125 * S);
        let r = d.scan(&[late.clone(), io.clone()], 131 * S, true);
        assert_eq!(r.new_stalls, vec![late, io]);
    }

    #[test]
    fn reports_once_after_threshold() {
        let mut d = StallDetector::new(Duration::from_secs(20), Duration::from_secs(5));
        let cu = call(CallKind::Cuinit, 10, 100 * S);
        let io = call(CallKind::Ioctl, 10, 101 * S);
        let snap = vec![cu.clone(), io.clone()];
        assert!(d.scan(&snap, 105 * S, true).new_stalls.is_empty());
        let r = d.scan(&snap, 106 * S, true);
        assert_eq!(r.new_stalls, vec![io.clone()]);
        assert!(d.scan(&snap, 110 * S, true).new_stalls.is_empty());
        let r = d.scan(&snap, 120 * S, true);
        assert_eq!(r.new_stalls, vec![cu.clone()]);
        assert_eq!(d.stalled_by_label().get("cuInit"), Some(&1));
        assert_eq!(d.stalled_by_label().get("UVM_REGISTER_GPU"), Some(&1));
    }

    #[test]
    fn end_by_event_and_by_thread() {
        let mut d = StallDetector::new(Duration::from_secs(1), Duration::from_secs(1));
        let cu = call(CallKind::Cuinit, 7, 0);
        let io = call(CallKind::Ioctl, 7, S / 2);
        d.scan(&[cu.clone(), io.clone()], 10 * S, true);
        assert_eq!(d.end(&io.key), Some(io.clone()));
        assert_eq!(d.end(&io.key), None);
        assert_eq!(d.end_thread(7), vec![cu]);
        assert!(d.stalled_by_label().is_empty());
    }

    #[test]
    fn vanished_needs_two_missing_scans() {
        let mut d = StallDetector::new(Duration::from_secs(1), Duration::from_secs(1));
        let io = call(CallKind::Ioctl, 3, 0);
        d.scan(std::slice::from_ref(&io), 2 * S, true);
        assert!(d.scan(&[], 3 * S, true).vanished.is_empty());
        assert_eq!(d.scan(&[], 4 * S, true).vanished, vec![io.clone()]);
        assert!(d.scan(&[], 5 * S, true).vanished.is_empty());
    }

    #[test]
    fn a_new_call_on_the_same_thread_is_a_new_stall() {
        let mut d = StallDetector::new(Duration::from_secs(1), Duration::from_secs(1));
        let a = call(CallKind::Ioctl, 3, 0);
        let b = call(CallKind::Ioctl, 3, 5 * S);
        assert_eq!(
            d.scan(std::slice::from_ref(&a), 2 * S, true)
                .new_stalls
                .len(),
            1
        );
        d.end(&a.key);
        assert_eq!(
            d.scan(std::slice::from_ref(&b), 7 * S, true).new_stalls,
            vec![b]
        );
    }

    /// While records are still queued (a flood), a call missing from the maps is not taken
    /// for vanished: its exit record may be among them.
    #[test]
    fn a_missing_call_is_not_vanished_while_records_are_queued() {
        let mut d = StallDetector::new(Duration::from_secs(20), Duration::from_secs(1));
        let io = call(CallKind::Ioctl, 7, 0);
        d.scan(std::slice::from_ref(&io), 2 * S, true);
        for t in 3..10 {
            assert!(d.scan(&[], t * S, false).vanished.is_empty());
        }
        assert!(d.scan(&[], 10 * S, true).vanished.is_empty());
        assert_eq!(d.scan(&[], 11 * S, true).vanished.len(), 1);
    }
}

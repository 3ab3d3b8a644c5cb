//! The agent's health, as a listener of the observer's events: alive while the observer's
//! loop runs (a scan at least every 5 s); ready while alive, with the required probes
//! attached (the `driver_calls` feature), the ring buffer emptied in the last 5 s (decoding
//! keeps up) and no record lost in the last 10 s. `/healthz` and `/readyz` serve it
//! ([`super::http`]), and so does the systemd notification ([`super::systemd`]).

use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc, Mutex,
};

use crate::{
    clock::monotonic_ns,
    event::{Event, Kind, Listener},
    kernel::features::DRIVER_CALLS,
};

/// `/healthz` fails when the main loop has not run for this long (ns).
const STALE_AFTER_NS: u64 = 5_000_000_000;
/// `/readyz` fails when the ring buffer has not been emptied for this long (ns): decoding
/// does not keep up with the records.
const BEHIND_AFTER_NS: u64 = 5_000_000_000;
/// `/readyz` fails for this long after records were lost (ns).
const DROPS_FAIL_FOR_NS: u64 = 10_000_000_000;

/// What `/healthz` and `/readyz` judge, kept by the listener on the observer's loop.
#[derive(Debug)]
struct Vitals {
    /// `CLOCK_MONOTONIC` ns of the last scan.
    last_scan_ns: AtomicU64,
    /// Of the last scan that found the ring buffer emptied.
    last_caught_up_ns: AtomicU64,
    /// Of the last scan that found more records lost than the one before (0: never).
    last_drop_ns: AtomicU64,
    /// Records lost so far, as the last scan said.
    dropped_total: AtomicU64,
    /// A probe-table change was seen (before it, the probes are not attached yet).
    probes_known: AtomicBool,
    /// Why the driver calls are not seen (a required probe not attached); empty when they are.
    probes_missing: Mutex<String>,
}

/// The agent's vitals, as a listener of the observer's events.
#[derive(Clone, Debug)]
pub struct Health(Arc<Vitals>);

impl Health {
    /// Vitals as of now: the loop just ran, nothing known of the probes yet.
    pub fn new() -> Health {
        let now = monotonic_ns();
        Health(Arc::new(Vitals {
            last_scan_ns: AtomicU64::new(now),
            last_caught_up_ns: AtomicU64::new(now),
            last_drop_ns: AtomicU64::new(0),
            dropped_total: AtomicU64::new(0),
            probes_known: AtomicBool::new(false),
            probes_missing: Mutex::new(String::new()),
        }))
    }

    /// `None` when alive, else why not.
    pub fn alive(&self, now: u64) -> Option<String> {
        let age = now.saturating_sub(self.0.last_scan_ns.load(Ordering::Relaxed));
        (age > STALE_AFTER_NS).then(|| format!("main loop stalled for {:.1}s", age as f64 / 1e9))
    }

    /// Every reason the agent is not ready; empty when it is.
    pub fn unready(&self, now: u64) -> Vec<String> {
        let v = &self.0;
        let mut why: Vec<String> = self.alive(now).into_iter().collect();
        if !v.probes_known.load(Ordering::Relaxed) {
            why.push("probes not attached yet".into());
        }
        let missing = v.probes_missing.lock().unwrap_or_else(|e| e.into_inner());
        if !missing.is_empty() {
            why.push(format!("driver calls not seen: {missing}"));
        }
        let behind = now.saturating_sub(v.last_caught_up_ns.load(Ordering::Relaxed));
        if behind > BEHIND_AFTER_NS {
            why.push(format!(
                "event decoding behind: ring buffer not emptied for {:.1}s",
                behind as f64 / 1e9
            ));
        }
        let drop = v.last_drop_ns.load(Ordering::Relaxed);
        if drop != 0 && now.saturating_sub(drop) < DROPS_FAIL_FOR_NS {
            why.push(format!(
                "events dropped {:.1}s ago ({} in all: uvmwatch_events_dropped_total)",
                now.saturating_sub(drop) as f64 / 1e9,
                v.dropped_total.load(Ordering::Relaxed)
            ));
        }
        why
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

impl Listener for Health {
    fn event(&mut self, ev: &Arc<Event>) {
        let v = &self.0;
        match &ev.kind {
            Kind::Scan(s) => {
                let now = monotonic_ns();
                v.last_scan_ns.store(now, Ordering::Relaxed);
                if s.caught_up {
                    v.last_caught_up_ns.store(now, Ordering::Relaxed);
                }
                if s.dropped_total > v.dropped_total.swap(s.dropped_total, Ordering::Relaxed) {
                    v.last_drop_ns.store(now, Ordering::Relaxed);
                }
            }
            Kind::ProbesChanged { features, .. } => {
                let missing = features
                    .iter()
                    .find(|f| f.name == DRIVER_CALLS && !f.on)
                    .map(|f| f.why.clone())
                    .unwrap_or_default();
                *v.probes_missing.lock().unwrap_or_else(|e| e.into_inner()) = missing;
                v.probes_known.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::Scan,
        kernel::features::{self, Feature},
    };

    fn scan(h: &mut Health, dropped_total: u64, caught_up: bool) {
        h.event(&Arc::new(Event::agent(
            0,
            Kind::Scan(Scan {
                cuinit_in_flight: 0,
                dropped_total,
                undecodable_total: 0,
                received_total: 0,
                identities_unread_total: 0,
                caught_up,
            }),
        )));
    }

    fn probes(h: &mut Health, driver_calls: bool) {
        let features = vec![Feature {
            name: features::DRIVER_CALLS,
            on: driver_calls,
            lost: "driver ioctls",
            why: if driver_calls {
                String::new()
            } else {
                "required probe ioctl_enter unavailable: Permission denied".into()
            },
        }];
        h.event(&Arc::new(Event::agent(
            0,
            Kind::ProbesChanged {
                probes: vec![],
                libcuda_targets: 0,
                features,
                backend: crate::kernel::registry::BackendChosen {
                    backend: crate::kernel::registry::Backend::Tracepoint,
                    cause: "flag",
                    why: "test".into(),
                },
            },
        )));
    }

    #[test]
    fn ready_once_the_required_probes_attached_and_not_while_they_are_missing() {
        let mut h = Health::new();
        let now = monotonic_ns();
        assert_eq!(h.unready(now), ["probes not attached yet"]);
        probes(&mut h, false);
        let why = h.unready(now);
        assert!(
            why.len() == 1 && why[0].contains("Permission denied"),
            "{why:?}"
        );
        assert!(h.alive(now).is_none(), "alive all the same");
        probes(&mut h, true);
        scan(&mut h, 0, true);
        assert!(h.unready(monotonic_ns()).is_empty());
    }

    #[test]
    fn drops_make_it_unready_for_ten_seconds_and_a_backlog_after_five() {
        let mut h = Health::new();
        probes(&mut h, true);
        scan(&mut h, 0, true);
        scan(&mut h, 0, true);
        assert!(h.unready(monotonic_ns()).is_empty(), "no drops: ready");
        scan(&mut h, 7, true);
        let now = monotonic_ns();
        let why = h.unready(now);
        assert!(why.len() == 1 && why[0].contains("7 in all"), "{why:?}");
        assert!(h
            .unready(now + DROPS_FAIL_FOR_NS + 1)
            .iter()
            .all(|w| !w.contains("dropped")));
        // The same total again is no new drop.
        scan(&mut h, 7, false);
        let later = h.0.last_scan_ns.load(Ordering::Relaxed) + DROPS_FAIL_FOR_NS + 1;
        let why = h.unready(later);
        assert!(why.iter().all(|w| !w.contains("dropped")), "{why:?}");
        assert!(why.iter().any(|w| w.contains("not emptied")), "{why:?}");
        assert!(why.iter().any(|w| w.contains("stalled")), "{why:?}");
    }
}

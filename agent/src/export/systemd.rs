//! The systemd notification protocol (`sd_notify(3)`), for `Type=notify` units
//! (`deploy/systemd/uvmwatch.service`): `READY=1` once the observer has started, `STATUS=`
//! saying whether the agent is ready and why not (`systemctl status` shows it), and
//! `WATCHDOG=1` while the observer's loop is alive, so a stalled agent is restarted
//! (`WatchdogSec=`). Nothing is sent without `NOTIFY_SOCKET`.

use std::time::Duration;

use crate::{clock::monotonic_ns, export::health::Health};

/// Tells systemd the agent started, then keeps its status and watchdog current from
/// `health` until the task is aborted.
pub async fn notify(health: Health) {
    use sd_notify::NotifyState;
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    // Twice per watchdog period (systemd's advice), and at least every second for the status.
    let every = watchdog
        .map(|w| (w / 2).min(Duration::from_secs(1)))
        .unwrap_or(Duration::from_secs(1));
    let send = |states: &[NotifyState]| {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "systemd notification not sent");
        }
    };
    let mut said = String::new();
    let mut first = true;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let now = monotonic_ns();
        let why = health.unready(now);
        let status = if why.is_empty() {
            "ready".to_string()
        } else {
            format!("not ready: {}", why.join("; "))
        };
        let mut states = Vec::new();
        if first {
            states.push(NotifyState::Ready);
            first = false;
        }
        if status != said {
            states.push(NotifyState::Status(&status));
        }
        if watchdog.is_some() && health.alive(now).is_none() {
            states.push(NotifyState::Watchdog);
        }
        if !states.is_empty() {
            send(&states);
        }
        said = status;
    }
}

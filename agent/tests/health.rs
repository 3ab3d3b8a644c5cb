//! The agent's health as its supervisors see it: `/healthz` and `/readyz` over HTTP, and the
//! systemd notification protocol (`READY=1`, `STATUS=`, `WATCHDOG=1`) on a `NOTIFY_SOCKET`
//! this test binds, as systemd does for a `Type=notify` unit. Root only. Readiness lost to a
//! missing capability is measured in `deploy.rs`, under a flood in `load.rs`.

mod common;

use std::{
    os::unix::net::UnixDatagram,
    time::{Duration, Instant},
};

use common::Agent;

#[test]
fn ready_when_started_and_systemd_hears_ready_status_and_watchdog() {
    require_env!("ready_when_started_and_systemd_hears_ready_status_and_watchdog");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let agent = Agent::start_with_env(
        &[],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            // 2 s: the agent must send WATCHDOG=1 at least every second.
            ("WATCHDOG_USEC", "2000000"),
        ],
    );
    let (code, body) = agent.get("/healthz");
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, body) = agent.get("/readyz");
    assert_eq!((code, body.trim()), (200, "ready"), "/readyz");

    let mut messages = Vec::new();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < Duration::from_secs(4) {
        if let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    let lines: Vec<&str> = messages.iter().flat_map(|m| m.lines()).collect();
    let first = messages.first().map(String::as_str).unwrap_or("");
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "first message: {messages:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| **l == "READY=1").count(),
        1,
        "{messages:?}"
    );
    assert!(lines.contains(&"STATUS=ready"), "{messages:?}");
    let watchdogs = lines.iter().filter(|l| **l == "WATCHDOG=1").count();
    assert!(
        watchdogs >= 3,
        "{watchdogs} WATCHDOG=1 in 4 s: {messages:?}"
    );
    assert!(agent.stop());
}

#[test]
fn without_notify_socket_nothing_is_sent_and_readyz_answers() {
    require_env!("without_notify_socket_nothing_is_sent_and_readyz_answers");
    // The near miss: no NOTIFY_SOCKET (a plain `uvmwatch run`, a container); the agent runs
    // and /readyz still answers.
    let agent = Agent::start(&[]);
    assert_eq!(agent.get("/readyz").0, 200);
    assert!(
        agent.count(|v| v["message"].as_str().is_some_and(|m| m.contains("systemd"))) == 0,
        "{}",
        agent.raw_log()
    );
    assert!(agent.stop());
}

//! The syscall backend the agent runs on (`--probe-backend`), as its users see it: the choice
//! and its reason in `uvmwatch probes`, the `started` record and
//! `uvmwatch_probe_backend_info`, the probes of the other backend on standby, and readiness.
//! Root only. Whether this kernel allows BPF trampolines is asked of the real loader (the
//! first line of `uvmwatch probes --probe-backend fentry`), so the same test measures a
//! kernel that refuses them (this machine: `BPF_PROG_LOAD` fails with `EPERM` before
//! verification) and one that allows them (the vm-test kernels, where `init/tests.sh`
//! checks the same per backend). The e2e scenarios on the fentry backend are run by
//! `cargo xtask test` when the kernel allows it (`UVMWATCH_PROBE_BACKEND=fentry`).

mod common;

use std::{process::Command, time::Duration};

use common::{metric, Agent};

/// `uvmwatch probes` with `args`: (exit status, stdout).
fn probes(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(args)
        .arg("probes")
        .env_remove("UVMWATCH_PROBE_BACKEND")
        .output()
        .expect("run uvmwatch probes");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The `syscall hooks: ...` line of a probes table.
fn hooks_line(table: &str) -> String {
    table
        .lines()
        .find(|l| l.starts_with("syscall hooks: "))
        .unwrap_or_else(|| panic!("no syscall hooks line:\n{table}"))
        .to_string()
}

/// Whether the kernel allows the fentry backend, from the loader itself.
fn fentry_allowed() -> (bool, String) {
    let (_, table) = probes(&["--probe-backend", "fentry"]);
    let line = hooks_line(&table);
    (
        line == "syscall hooks: fentry backend (the kernel allows trampolines)",
        line,
    )
}

fn started(agent: &Agent) -> serde_json::Value {
    agent
        .wait_event(|v| v["event"] == "started", Duration::from_secs(30))
        .expect("a started record")
}

#[test]
fn auto_takes_fentry_where_allowed_and_else_says_why_it_fell_back() {
    require_env!("auto_takes_fentry_where_allowed_and_else_says_why_it_fell_back");
    let (allowed, fentry_line) = fentry_allowed();
    let (code, table) = probes(&[]);
    assert_eq!(code, 0, "{table}");
    let line = hooks_line(&table);
    let agent = Agent::start_with_env(&[], &[("UVMWATCH_PROBE_BACKEND", "auto")]);
    let s = started(&agent);
    let m = agent.metrics();
    let (code, ready) = agent.get("/readyz");
    if allowed {
        assert_eq!(
            line,
            "syscall hooks: fentry backend (the kernel allows trampolines)"
        );
        assert_eq!(s["backend"], "fentry", "{s}");
        assert_eq!(
            metric(
                &m,
                "uvmwatch_probe_backend_info",
                &[("backend", "fentry"), ("reason", "trampolines_allowed")]
            ),
            Some(1.0)
        );
        assert!(
            table.contains("not used: the fentry backend is attached"),
            "{table}"
        );
    } else {
        // The kernel's own words for the refusal, and the fallback said with them.
        let why = fentry_line
            .split_once("refused: ")
            .map(|(_, w)| w.trim_end_matches(')').to_string())
            .unwrap_or_else(|| panic!("no refusal in: {fentry_line}"));
        assert!(why.contains("BPF_PROG_LOAD failed with E"), "{why}");
        assert_eq!(
            line,
            format!("syscall hooks: tracepoint backend (fentry refused: {why})")
        );
        assert_eq!(s["backend"], "tracepoint", "{s}");
        assert_eq!(s["backend_reason"], format!("fentry refused: {why}"), "{s}");
        assert_eq!(
            metric(
                &m,
                "uvmwatch_probe_backend_info",
                &[("backend", "tracepoint"), ("reason", "fentry_refused")]
            ),
            Some(1.0)
        );
        // Each fentry probe is on standby with the reason, none is an error.
        assert!(
            table.contains(&format!(
                "not used: fentry refused: {why}; the syscall tracepoints and kprobes are used"
            )),
            "{table}"
        );
        for p in ["fentry:__x64_sys_ioctl", "fexit:do_filp_open"] {
            assert_eq!(
                metric(
                    &m,
                    "uvmwatch_probe_attached",
                    &[("probe", p), ("backend", "fentry")]
                ),
                Some(0.0),
                "{p}"
            );
        }
    }
    assert_eq!(
        metric(
            &m,
            "uvmwatch_probe_attached",
            &[("probe", "sched:sched_process_exit"), ("backend", "both")]
        ),
        Some(1.0)
    );
    // Either way the driver calls are seen and the agent is ready: a backend on standby is
    // not a missing probe.
    assert_eq!((code, ready.trim()), (200, "ready"), "{ready}");
    assert_eq!(
        metric(
            &m,
            "uvmwatch_feature_enabled",
            &[("feature", "driver_calls")]
        ),
        Some(1.0)
    );
    assert!(agent.stop());
}

#[test]
fn the_flag_forces_a_backend_and_a_refused_one_is_not_ready() {
    require_env!("the_flag_forces_a_backend_and_a_refused_one_is_not_ready");
    let (allowed, _) = fentry_allowed();
    // Forced tracepoints: the reason is the flag, the fentry probes are not used.
    let (code, table) = probes(&["--probe-backend", "tracepoint"]);
    assert_eq!(code, 0, "{table}");
    assert_eq!(
        hooks_line(&table),
        "syscall hooks: tracepoint backend (--probe-backend tracepoint)"
    );
    assert!(
        table.contains("not used: --probe-backend tracepoint"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("syscalls:sys_enter_ioctl ") && l.contains(" attached ")),
        "{table}"
    );

    // Forced fentry where the kernel refuses it: nothing of the syscalls is seen, and the
    // agent says so (not ready, driver_calls off with the kernel's reason, probes exit 1).
    let agent = Agent::start(&["--probe-backend", "fentry"]);
    let s = started(&agent);
    assert_eq!(s["backend"], "fentry", "{s}");
    let m = agent.metrics();
    let (code, body) = agent.get("/readyz");
    let feature = metric(
        &m,
        "uvmwatch_feature_enabled",
        &[("feature", "driver_calls")],
    );
    let (probes_code, fentry_table) = probes(&["--probe-backend", "fentry"]);
    if allowed {
        assert_eq!((code, feature, probes_code), (200, Some(1.0), 0), "{body}");
    } else {
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains("fentry refused: the kernel refused fentry"),
            "{body}"
        );
        assert_eq!(feature, Some(0.0));
        assert_eq!(probes_code, 1, "{fentry_table}");
        assert!(
            fentry_table
                .lines()
                .any(|l| l.starts_with("fentry:__x64_sys_ioctl ")
                    && l.contains("unavailable: fentry refused: ")),
            "{fentry_table}"
        );
    }
    assert_eq!(
        metric(
            &m,
            "uvmwatch_probe_backend_info",
            &[("backend", "fentry"), ("reason", "flag")]
        ),
        Some(1.0)
    );
    assert!(agent.stop());
}

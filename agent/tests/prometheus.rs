//! The Grafana dashboards (`dashboards/`) and the alert rules (`deploy/prometheus/`) against
//! real tools: `promtool check rules` and `promtool test rules`, and a real Prometheus server
//! (the Debian `prometheus` package) on loopback that scrapes the real agent while the e2e
//! scenarios run. Every dashboard query and alert expression must parse there, and the ones
//! the scenarios exercise must return data; the cuInit stall alert must go pending, then
//! firing. Grafana itself is not run (it cannot be installed here): the dashboards' structure
//! is checked from their JSON.
//!
//! The scenario test needs root (the agent); the others only promtool/prometheus. Each
//! skips with a reason (`uvmwatch_testbed::skip`) when what it needs is missing.

mod common;
mod observability;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{artifacts, Agent};
use observability::*;
use serde_json::Value;
use uvmwatch_testbed::{
    write_snapshot_fixture, FakeDev, FakeDevConfig, IoctlAction, IoctlRule, OpenDenial, Scenario,
    SnapshotSpec, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);
const PROMETHEUS_RULE: &str = "deploy/kubernetes/base/prometheusrule.yaml";

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn promtool_or_skip(test: &str) -> Option<std::path::PathBuf> {
    let p = which("promtool");
    if p.is_none() {
        uvmwatch_testbed::skip(
            test,
            "promtool not installed (Debian package prometheus; `cargo xtask setup`)",
        );
    }
    p
}

fn prometheus_or_skip(test: &str) -> Option<std::path::PathBuf> {
    let p = which("prometheus");
    if p.is_none() {
        uvmwatch_testbed::skip(
            test,
            "prometheus not installed (Debian package prometheus; `cargo xtask setup`)",
        );
    }
    p
}

// ---------------------------------------------------------------------------------------
// Alert rules: promtool, the PrometheusRule copy, the required probes.

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let test = "alert_rules_pass_promtool_check_and_their_unit_tests";
    let Some(promtool) = promtool_or_skip(test) else {
        return;
    };
    let out = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(rule_file())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules:\n{text}");
    assert!(text.contains("SUCCESS: 20 rules found"), "{text}");

    let tests_dir = repo_root().join("deploy/prometheus/tests");
    let mut files: Vec<_> = std::fs::read_dir(&tests_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no rule unit tests in {}",
        tests_dir.display()
    );
    let out = std::process::Command::new(&promtool)
        .args(["test", "rules"])
        .args(&files)
        .current_dir(&tests_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every alert of the rule file has at least one unit test case that expects it firing.
    let tests: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for name in alert_names(&std::fs::read_to_string(rule_file()).unwrap()) {
        let firing = tests.split("- eval_time:").any(|case| {
            case.contains(&format!("alertname: {name}\n")) && case.contains("exp_labels:")
        });
        assert!(firing, "no promtool test case expects {name} to fire");
    }
}

/// `alert: NAME` lines of a rule file.
fn alert_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|s| s.trim().to_string())
        .collect()
}

/// `record: NAME` lines of a rule file.
fn record_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(|s| s.trim().to_string())
        .collect()
}

/// The loaded recording rules: (name, health, lastError).
fn recording_rules(prom: &Prometheus) -> Vec<(String, String, String)> {
    let d = prom.api("rules?type=record").expect("GET /api/v1/rules");
    let mut out = Vec::new();
    for g in d["groups"].as_array().cloned().unwrap_or_default() {
        for r in g["rules"].as_array().cloned().unwrap_or_default() {
            out.push((
                r["name"].as_str().unwrap_or("").to_string(),
                r["health"].as_str().unwrap_or("").to_string(),
                r["lastError"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    out
}

/// The PrometheusRule for the Prometheus Operator: a fixed header, then the rule file's
/// lines indented under `spec:`.
fn prometheus_rule_text(rules: &str) -> String {
    let mut out = String::from(
        "# Generated from deploy/prometheus/uvmwatch-alerts.yaml (the same groups under `spec`);\n\
         # do not edit. Regenerate with\n\
         #   UVMWATCH_BLESS=1 cargo test -p uvmwatch --test prometheus prometheus_rule\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n\
         \x20 name: uvmwatch\n\
         \x20 labels:\n\
         \x20   app.kubernetes.io/name: uvmwatch\n\
         \x20   app.kubernetes.io/component: alerting\n\
         spec:\n",
    );
    for line in rules.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn prometheus_rule_for_the_operator_has_the_same_rules() {
    let rules = std::fs::read_to_string(rule_file()).unwrap();
    let want = prometheus_rule_text(&rules);
    let path = repo_root().join(PROMETHEUS_RULE);
    if std::env::var_os("UVMWATCH_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{PROMETHEUS_RULE} differs from what deploy/prometheus/uvmwatch-alerts.yaml gives; \
         regenerate: UVMWATCH_BLESS=1 cargo test -p uvmwatch --test prometheus prometheus_rule"
    );
}

#[test]
fn required_probes_in_alerts_and_dashboards_match_the_agent() {
    let required: Vec<&str> = uvmwatch::kernel::registry::REGISTRY
        .iter()
        .filter(|p| p.required)
        .map(|p| p.label)
        .collect();
    let want = format!("probe=~\"{}\"", required.join("|"));
    let rules = std::fs::read_to_string(rule_file()).unwrap();
    assert!(
        rules.contains(&want),
        "UvmwatchProbesNotAttached must select exactly the required probes: {want}"
    );
    let agent = dashboards()
        .into_iter()
        .find(|(n, _)| n == "uvmwatch-agent.json")
        .expect("dashboards/uvmwatch-agent.json")
        .1;
    assert!(
        agent.to_string().contains(&want.replace('"', "\\\"")),
        "the agent dashboard's required-probe panel must select {want} (dashboards/generate.py)"
    );
}

// ---------------------------------------------------------------------------------------
// Dashboards: generated, well formed, only metrics that exist.

#[test]
fn dashboards_are_generated_and_well_formed() {
    if let Some(py) = which("python3") {
        let out = std::process::Command::new(py)
            .arg(repo_root().join("dashboards/generate.py"))
            .arg("--check")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dashboards/*.json are not what dashboards/generate.py writes:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    } else {
        // Only this part is left out (the summary counts skipped tests, not parts).
        eprintln!("note: python3 not installed: generate.py --check not run");
    }

    let known: BTreeSet<String> = uvmwatch::export::metrics::FAMILIES
        .iter()
        .flat_map(|(name, kind, _)| {
            if *kind == "histogram" {
                vec![
                    format!("{name}_bucket"),
                    format!("{name}_sum"),
                    format!("{name}_count"),
                ]
            } else {
                vec![name.to_string()]
            }
        })
        .collect();
    let histograms: Vec<&str> = uvmwatch::export::metrics::FAMILIES
        .iter()
        .filter(|(_, k, _)| *k == "histogram")
        .map(|(n, _, _)| *n)
        .collect();

    let boards = dashboards();
    let names: Vec<&str> = boards.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "uvmwatch-agent.json",
            "uvmwatch-cuinit.json",
            "uvmwatch-fleet.json",
            "uvmwatch-ioctls.json"
        ]
    );
    let mut uids = BTreeSet::new();
    let mut problems = Vec::new();
    for (name, d) in &boards {
        // Stable uid: the file name without .json.
        let uid = d["uid"].as_str().unwrap_or("");
        if format!("{uid}.json") != *name {
            problems.push(format!("{name}: uid {uid:?} is not the file name"));
        }
        if uid.len() > 40 || !uids.insert(uid.to_string()) {
            problems.push(format!("{name}: uid {uid:?} too long or not unique"));
        }
        if !d["id"].is_null() {
            problems.push(format!("{name}: id must be null (Grafana assigns it)"));
        }
        if d["title"].as_str().unwrap_or("").is_empty()
            || d["description"].as_str().unwrap_or("").is_empty()
        {
            problems.push(format!("{name}: no title or description"));
        }
        // Variables: datasource (prometheus), job, node, instance.
        let vars = d["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let var = |n: &str| vars.iter().find(|v| v["name"] == n).cloned();
        match var("datasource") {
            Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
            _ => problems.push(format!("{name}: no datasource variable of type prometheus")),
        }
        for n in ["job", "node", "instance"] {
            match var(n) {
                Some(v) if v["type"] == "query" && v["datasource"]["uid"] == "${datasource}" => {}
                _ => problems.push(format!("{name}: no query variable {n} on ${{datasource}}")),
            }
        }
        // Annotations: a Prometheus query on the stall metrics.
        let annos = d["annotations"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !annos.iter().any(|a| {
            a["datasource"]["type"] == "prometheus"
                && a["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("uvmwatch_stall"))
        }) {
            problems.push(format!(
                "{name}: no stall annotation from a Prometheus query"
            ));
        }
        let mut ids = BTreeSet::new();
        for p in panels(d) {
            let title = p["title"].as_str().unwrap_or("").to_string();
            if !ids.insert(p["id"].as_i64().unwrap_or(-1)) {
                problems.push(format!("{name}: panel id {} repeated", p["id"]));
            }
            if p["type"] == "row" {
                continue;
            }
            let gp = &p["gridPos"];
            if gp["w"].as_i64().unwrap_or(0) <= 0
                || gp["h"].as_i64().unwrap_or(0) <= 0
                || gp["x"].as_i64().unwrap_or(-1) + gp["w"].as_i64().unwrap_or(0) > 24
            {
                problems.push(format!("{name}: panel {title:?}: bad gridPos {gp}"));
            }
            if title.is_empty() || p["description"].as_str().unwrap_or("").len() < 20 {
                problems.push(format!(
                    "{name}: panel {title:?} has no title or description"
                ));
            }
            if p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .unwrap_or("")
                .is_empty()
            {
                problems.push(format!("{name}: panel {title:?} has no unit"));
            }
            if p["datasource"]["uid"] != "${datasource}" {
                problems.push(format!("{name}: panel {title:?} not on ${{datasource}}"));
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                problems.push(format!("{name}: panel {title:?} has no query"));
            }
            for t in targets {
                if t["datasource"]["uid"] != "${datasource}" {
                    problems.push(format!(
                        "{name}: panel {title:?}: target not on ${{datasource}}"
                    ));
                }
                let expr = t["expr"].as_str().unwrap_or("");
                for h in &histograms {
                    // A histogram is read through histogram_quantile over rate(_bucket), or
                    // its buckets' increase (heatmap), or _sum/_count.
                    if expr.contains(&format!("{h}_bucket"))
                        && !(expr.contains("histogram_quantile(") || p["type"] == "heatmap")
                    {
                        problems.push(format!("{name}: panel {title:?}: {h}_bucket outside histogram_quantile/heatmap"));
                    }
                    if expr.contains("histogram_quantile(")
                        && !(expr.contains("rate(") || expr.contains("increase("))
                    {
                        problems.push(format!(
                            "{name}: panel {title:?}: histogram_quantile without rate()"
                        ));
                    }
                }
                if !expr.contains("job=~\"$job\", hostname=~\"$node\", instance=~\"$instance\"") {
                    problems.push(format!("{name}: panel {title:?}: query not filtered by $job, $node, $instance: {expr}"));
                }
            }
        }
    }
    // Only metrics that exist.
    for q in dashboard_queries() {
        for m in uvmwatch_metrics_in(&q.expr) {
            if !known.contains(&m) {
                problems.push(format!("{} {}: unknown metric {m}", q.dashboard, q.what));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "dashboard problems:\n{}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// A real Prometheus.

/// Test values of the dashboards' variables: `All` (what a dashboard opens with) or one
/// concrete choice of each.
fn vars_all() -> Vec<(&'static str, String)> {
    vec![
        ("job", ".+".into()),
        ("node", ".*".into()),
        ("instance", ".+".into()),
        ("device", ".+".into()),
        ("ioctl", ".+".into()),
        ("__rate_interval", "10s".into()),
        ("__interval", "2s".into()),
        ("__range", "5m".into()),
    ]
}

fn vars_selected(instance: &str) -> Vec<(&'static str, String)> {
    vec![
        ("job", "uvmwatch".into()),
        ("node", "testhost".into()),
        ("instance", instance.into()),
        ("device", "nvidia-uvm|nvidiactl|nvidia0".into()),
        ("ioctl", ".+".into()),
        ("__rate_interval", "10s".into()),
        ("__interval", "2s".into()),
        ("__range", "5m".into()),
    ]
}

fn subst(expr: &str, vars: &[(&'static str, String)]) -> String {
    let v: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (*n, v.as_str())).collect();
    substitute(expr, &v)
}

fn prometheus_config(target: Option<u16>, rules: &str) -> String {
    let mut c = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n"
    );
    if let Some(port) = target {
        c.push_str(&format!(
            "scrape_configs:\n  - job_name: uvmwatch\n    static_configs:\n      - targets: \
             ['127.0.0.1:{port}']\n        labels:\n          hostname: testhost\n"
        ));
    }
    c
}

#[test]
fn every_dashboard_query_and_alert_parses_in_prometheus() {
    let test = "every_dashboard_query_and_alert_parses_in_prometheus";
    let Some(bin) = prometheus_or_skip(test) else {
        return;
    };
    let rules = std::fs::read_to_string(rule_file()).unwrap();
    let prom = Prometheus::start(
        &bin,
        &prometheus_config(None, "rules.yaml"),
        &[("rules.yaml", &rules)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The real rule file loads, every rule healthy after an evaluation.
    std::thread::sleep(Duration::from_millis(2500));
    let loaded = prom.alerting_rules();
    assert_eq!(
        loaded.iter().map(|r| r.0.clone()).collect::<BTreeSet<_>>(),
        alert_names(&rules).into_iter().collect::<BTreeSet<_>>()
    );
    for (name, _, health, err) in &loaded {
        assert!(
            health == "ok" || health == "unknown",
            "{name}: {health} {err}"
        );
    }
    // The recording rules (uvmwatch-fleet) load healthy too.
    let recorded = recording_rules(&prom);
    assert_eq!(
        recorded
            .iter()
            .map(|r| r.0.clone())
            .collect::<BTreeSet<_>>(),
        record_names(&rules).into_iter().collect::<BTreeSet<_>>()
    );
    for (name, health, err) in &recorded {
        assert!(
            health == "ok" || health == "unknown",
            "{name}: {health} {err}"
        );
    }
    let mut bad = Vec::new();
    for q in dashboard_queries() {
        for vars in [vars_all(), vars_selected("127.0.0.1:19400")] {
            let expr = subst(&q.expr, &vars);
            if let Err(e) = prom.query(&expr, None) {
                bad.push(format!("{} {}: {e}\n    {expr}", q.dashboard, q.what));
            }
        }
    }
    for (name, query, _, _) in &loaded {
        if let Err(e) = prom.query(query, None) {
            bad.push(format!("alert {name}: {e}"));
        }
    }
    assert!(
        bad.is_empty(),
        "queries Prometheus rejects:\n{}",
        bad.join("\n")
    );
}

fn incident_snapshot() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-snapshot")
        .tempdir()
        .unwrap();
    let spec = SnapshotSpec {
        iomem_hmm: false,
        ..SnapshotSpec::default()
    };
    write_snapshot_fixture(dir.path(), &spec).unwrap();
    dir
}

fn workload(dev: &FakeDev, scenario: Scenario) -> Workload {
    Workload::spawn(
        dev,
        artifacts(),
        WorkloadConfig {
            scenario,
            lib_location: common::host_lib().location(),
            ..WorkloadConfig::default()
        },
    )
    .expect("spawn workload")
}

fn pid_is(v: &Value, pid: u32) -> bool {
    v["pid"].as_u64() == Some(pid as u64)
}

/// Waits until the instant query returns data; panics with `what` otherwise.
fn wait_data(prom: &Prometheus, expr: &str, timeout: Duration, what: &str) {
    let end = Instant::now() + timeout;
    loop {
        if prom.query(expr, None).is_ok_and(|d| has_data(&d)) {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: no data for {expr} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Alerts the scenarios must make fire, and those expected to stay silent, with why.
/// (UvmwatchAgentAbsent returns data too: the range starts before the first scrape, when
/// the job had no `up` series yet. UvmwatchAgentDown is checked by stopping the agent.)
const SILENT_ALERTS: &[(&str, &str)] = &[
    (
        "UvmwatchEventsDropped",
        "no event is lost at the scenarios' rate; covered by its promtool unit test",
    ),
    (
        "UvmwatchKernelMapFull",
        "the scenarios track a few fds and calls, far below the maps' sizes; promtool unit test",
    ),
    (
        "UvmwatchProbesNotAttached",
        "every required probe attaches on this kernel; promtool unit test",
    ),
    (
        "UvmwatchNodeCuInitSlowerThanFleet",
        "one agent is no fleet (quorum: 5 nodes); promtool unit tests on made-up fleets",
    ),
    (
        "UvmwatchNodeCuInitFailingMoreThanFleet",
        "one agent is no fleet (quorum: 5 nodes); promtool unit tests on made-up fleets",
    ),
];

/// Dashboard queries allowed to return no data in the scenarios, with why.
const EMPTY_PANELS_ALLOWED: &[(&str, &str)] = &[];

#[test]
fn a_real_prometheus_scraping_the_agent_through_the_scenarios() {
    let test = "a_real_prometheus_scraping_the_agent_through_the_scenarios";
    require_env!(test);
    let Some(bin) = prometheus_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let t_start = now();

    let snap = incident_snapshot();
    let agent = Agent::start(&[
        "--ioctl-stall",
        "1s",
        "--cuinit-stall",
        "2s",
        "--evidence-root",
        snap.path().to_str().unwrap(),
    ]);
    let instance = format!("127.0.0.1:{}", agent.port);
    let rules = rules_with_short_for(&std::fs::read_to_string(rule_file()).unwrap());
    let prom = Prometheus::start(
        &bin,
        &prometheus_config(Some(agent.port), "rules-test-copy.yaml"),
        &[("rules-test-copy.yaml", &rules)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    wait_data(&prom, "up{job=\"uvmwatch\"} == 1", T, "first scrape");
    let t_ready = started.elapsed();

    // 1. Success.
    let dev = FakeDev::start(artifacts(), FakeDevConfig::default()).unwrap();
    let mut w = workload(&dev, Scenario::Success);
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    drop(w);
    // 2. cuInit error 3 (UVM_REGISTER_GPU -> NV_ERR_NO_MEMORY), twice: a counter seen for
    //    the first time only moves rate()/increase() from its second sample on.
    for _ in 0..2 {
        let mut w = workload(&dev, Scenario::RegisterGpuNoMemory);
        assert_eq!(w.next_cuinit_line(T).unwrap().rc, 3);
        let pid = w.pid();
        agent.expect_event(
            "cuinit_end",
            |v| v["event"] == "cuinit_end" && pid_is(v, pid),
            T,
        );
        std::thread::sleep(Duration::from_millis(1200));
    }
    drop(dev);
    // 3. EPERM on /dev/nvidia-uvm, twice.
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    for _ in 0..2 {
        let mut w = workload(&dev, Scenario::MissingNode);
        assert_eq!(w.next_cuinit_line(T).unwrap().rc, 999);
        let pid = w.pid();
        agent.expect_event(
            "EPERM open",
            |v| v["event"] == "device_open_failed" && pid_is(v, pid),
            T,
        );
        std::thread::sleep(Duration::from_millis(1200));
    }
    drop(dev);
    let t_quick = started.elapsed();

    // 4. A hang in UVM_REGISTER_GPU: the cuInit stall alert goes pending, then firing.
    let dev = FakeDev::start(
        artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap();
    let mut w = workload(&dev, Scenario::HangRegisterGpu);
    let pid = w.pid();
    agent.expect_event(
        "cuInit stall",
        |v| v["event"] == "stall" && v["call"] == "cuInit" && pid_is(v, pid),
        T,
    );
    let stall_seen = Instant::now();
    let mut states: Vec<String> = Vec::new();
    let mut ioctl_firing = false;
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let alerts = prom.alerts();
        if let Some((_, state, labels)) = alerts.iter().find(|a| a.0 == "UvmwatchCuInitStalled") {
            assert_eq!(labels["instance"], instance.as_str());
            assert_eq!(labels["hostname"], "testhost");
            assert_eq!(labels["severity"], "critical");
            if states.last() != Some(state) {
                states.push(state.clone());
            }
        }
        ioctl_firing |= alerts.iter().any(|a| {
            a.0 == "UvmwatchDriverIoctlStalled"
                && a.1 == "firing"
                && a.2["call"] == "UVM_REGISTER_GPU"
        });
        if states.last().map(String::as_str) == Some("firing") && ioctl_firing {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let to_firing = stall_seen.elapsed();
    assert_eq!(
        states,
        ["pending", "firing"],
        "UvmwatchCuInitStalled states seen (for: 1m in the file, {}s in the test copy)",
        60 / FOR_DIVISOR
    );
    assert!(
        ioctl_firing,
        "UvmwatchDriverIoctlStalled never fired for UVM_REGISTER_GPU"
    );
    // The other incident alerts, active now.
    let active: BTreeSet<(String, String)> =
        prom.alerts().into_iter().map(|(n, s, _)| (n, s)).collect();
    for name in ["UvmwatchCuInitFailing", "UvmwatchDeviceOpenDenied"] {
        assert!(
            active.contains(&(name.to_string(), "firing".to_string())),
            "{name} not firing: {active:?}"
        );
    }
    let diagnoses: Vec<Value> = prom
        .alerts()
        .into_iter()
        .filter(|a| a.0 == "UvmwatchDiagnosisActive" && a.1 == "firing")
        .map(|a| a.2)
        .collect();
    assert!(
        diagnoses
            .iter()
            .any(|l| l["rule"] == "hmm_setup_failure" && l["severity"] == "critical"),
        "no firing UvmwatchDiagnosisActive for hmm_setup_failure: {diagnoses:?}"
    );
    dev.release().unwrap();
    assert_eq!(w.next_cuinit_line(T).unwrap().rc, 0);
    drop(w);
    drop(dev);
    // Let the last state be scraped and every rate window see it.
    wait_data(
        &prom,
        "uvmwatch_stalled_calls{call=\"cuInit\"} == 0 and on (instance) uvmwatch_cuinit_in_flight == 0",
        T,
        "stall cleared",
    );
    std::thread::sleep(Duration::from_secs(2));
    // The fleet recording rules on this one agent: a fleet of one node, with a p95 and a
    // failure ratio (errors 3 and 999 above); its alerts need 5 nodes (SILENT_ALERTS).
    wait_data(
        &prom,
        "job:uvmwatch_cuinit_duration_seconds:p95_1h_nodes == 1 \
         and on (job) job:uvmwatch_cuinit_duration_seconds:p95_1h_mad == 0",
        T,
        "fleet latency recording rules",
    );
    wait_data(
        &prom,
        "instance:uvmwatch_cuinit_calls:failure_ratio_1h > 0 \
         and on (job) job:uvmwatch_cuinit_calls:failure_ratio_1h_nodes == 1",
        T,
        "fleet failure-ratio recording rules",
    );
    for (name, health, err) in recording_rules(&prom) {
        assert_eq!(health, "ok", "{name}: {err}");
    }
    let t_scenarios = started.elapsed();

    // Every dashboard query, over the test's time range, with the variables set to this
    // agent and to All.
    let t_end = now();
    let mut bad = Vec::new();
    let mut empty = Vec::new();
    let mut evaluated = 0;
    for q in dashboard_queries() {
        for (which, vars) in [("selected", vars_selected(&instance)), ("All", vars_all())] {
            let expr = subst(&q.expr, &vars);
            evaluated += 1;
            match prom.query_range(&expr, t_start, t_end, 1.0) {
                Err(e) => bad.push(format!("{} {}: {e}\n    {expr}", q.dashboard, q.what)),
                Ok(d) if !has_data(&d) => {
                    empty.push(format!("{} {} ({which})", q.dashboard, q.what))
                }
                Ok(d) => {
                    if let Some(label) = &q.label {
                        // A variable must list values.
                        let listed = d["result"].as_array().is_some_and(|r| {
                            r.iter()
                                .any(|s| s["metric"][label].as_str().is_some_and(|v| !v.is_empty()))
                        });
                        if !listed {
                            empty.push(format!(
                                "{} {} ({which}): no {label} values",
                                q.dashboard, q.what
                            ));
                        }
                    }
                }
            }
        }
    }
    let allowed = |e: &String| EMPTY_PANELS_ALLOWED.iter().any(|(p, _)| e.contains(p));
    let unexpected: Vec<&String> = empty.iter().filter(|e| !allowed(e)).collect();

    // Every alert expression parses; those the scenarios exercise returned data.
    let mut alert_empty = Vec::new();
    for (name, query, health, err) in prom.alerting_rules() {
        assert_eq!(health, "ok", "{name}: {err}");
        match prom.query_range(&query, t_start, t_end, 1.0) {
            Err(e) => bad.push(format!("alert {name}: {e}")),
            Ok(d) if !has_data(&d) => alert_empty.push(name),
            Ok(_) => {}
        }
    }
    let silent: BTreeSet<String> = SILENT_ALERTS.iter().map(|(n, _)| n.to_string()).collect();

    // Agent down: stop it; up == 0 at the next scrape.
    assert!(agent.stop());
    wait_data(&prom, "up{job=\"uvmwatch\"} == 0", T, "agent stopped");
    let down = prom
        .query("up{job=\"uvmwatch\"} == 0", None)
        .map(|d| has_data(&d))
        .unwrap_or(false);
    alert_empty.retain(|n| !(n == "UvmwatchAgentDown" && down));

    eprintln!(
        "measured: prometheus test: first scrape after {:.1}s, quick scenarios done at {:.1}s, \
         stall alert pending->firing {:.1}s after the stall was logged, scenarios done at \
         {:.1}s, {evaluated} dashboard query evaluations, total {:.1}s",
        t_ready.as_secs_f64(),
        t_quick.as_secs_f64(),
        to_firing.as_secs_f64(),
        t_scenarios.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for (p, why) in EMPTY_PANELS_ALLOWED {
        eprintln!("allowed empty: {p}: {why}");
    }
    for (a, why) in SILENT_ALERTS {
        eprintln!("alert expected silent: {a}: {why}");
    }
    assert!(
        bad.is_empty(),
        "queries Prometheus rejects:\n{}",
        bad.join("\n")
    );
    assert!(
        unexpected.is_empty(),
        "dashboard queries without data:\n{}\nprometheus log:\n{}",
        unexpected
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        prom.log()
    );
    assert_eq!(
        alert_empty.into_iter().collect::<BTreeSet<_>>(),
        silent,
        "alert expressions without data (left) vs expected silent (right)"
    );
}

//! Helpers for the tests of the observability files (`dashboards/`, `deploy/prometheus/`):
//! a real Prometheus server on loopback, a small HTTP client, the dashboards' queries with
//! their variables substituted, and the test copy of the alert rules.
#![allow(dead_code)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The alert rule file.
pub fn rule_file() -> PathBuf {
    repo_root().join("deploy/prometheus/uvmwatch-alerts.yaml")
}

// Shared with the other root tests.
pub use super::common::{free_port, which};

/// Percent-encodes a query-string value.
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `GET path` over HTTP/1.0 (no chunked answers): (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A Prometheus server (the Debian `prometheus` binary) on loopback with its own data
/// directory; stopped on drop.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` with `config` (YAML text) and the extra files written next to it
    /// (name, text); waits until `/-/ready` answers. `Err` when it does not come up.
    pub fn start(
        binary: &Path,
        config: &str,
        files: &[(&str, &str)],
    ) -> Result<Prometheus, String> {
        let dir = tempfile::Builder::new()
            .prefix("uvmwatch-prometheus")
            .tempdir()
            .map_err(|e| e.to_string())?;
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).map_err(|e| e.to_string())?;
        }
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).map_err(|e| e.to_string())?;
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let mut p = Prometheus { child, port, dir };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = http_get(port, "/-/ready") {
                return Ok(p);
            }
            if let Ok(Some(st)) = p.child.try_wait() {
                return Err(format!("prometheus exited with {st}:\n{}", p.log()));
            }
            if Instant::now() > end {
                return Err(format!("prometheus not ready after 30 s:\n{}", p.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>`; the `data` of a `success` answer, else the error text.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) =
            http_get(self.port, &format!("/api/v1/{path}")).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or(&body)
            ))
        }
    }

    /// An instant query at `time` (Unix seconds) or now.
    pub fn query(&self, expr: &str, time: Option<f64>) -> Result<Value, String> {
        let mut path = format!("query?query={}", urlencode(expr));
        if let Some(t) = time {
            path.push_str(&format!("&time={t:.3}"));
        }
        self.api(&path)
    }

    /// A range query.
    pub fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Value, String> {
        self.api(&format!(
            "query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            urlencode(expr)
        ))
    }

    /// Alerts pending or firing now: (alertname, state, labels).
    pub fn alerts(&self) -> Vec<(String, String, Value)> {
        let Ok(d) = self.api("alerts") else {
            return vec![];
        };
        d["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }

    /// The loaded alerting rules: (name, query, health, lastError).
    pub fn alerting_rules(&self) -> Vec<(String, String, String, String)> {
        let d = self.api("rules?type=alert").expect("GET /api/v1/rules");
        let mut out = Vec::new();
        for g in d["groups"].as_array().cloned().unwrap_or_default() {
            for r in g["rules"].as_array().cloned().unwrap_or_default() {
                out.push((
                    r["name"].as_str().unwrap_or("").to_string(),
                    r["query"].as_str().unwrap_or("").to_string(),
                    r["health"].as_str().unwrap_or("").to_string(),
                    r["lastError"].as_str().unwrap_or("").to_string(),
                ));
            }
        }
        out
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a query result (`data` of /api/v1/query or query_range) holds at least one
/// sample that is a number (not NaN).
pub fn has_data(data: &Value) -> bool {
    let num = |v: &Value| {
        v.get(1)
            .and_then(|s| s.as_str())
            .and_then(|s| s.parse::<f64>().ok())
            .is_some_and(|f| !f.is_nan())
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .is_some_and(|r| r.iter().any(|s| num(&s["value"]))),
        Some("matrix") => data["result"].as_array().is_some_and(|r| {
            r.iter()
                .any(|s| s["values"].as_array().is_some_and(|vs| vs.iter().any(num)))
        }),
        Some("scalar") => num(&data["result"]),
        _ => false,
    }
}

/// A PromQL query found in a dashboard.
#[derive(Debug, Clone)]
pub struct DashQuery {
    /// File name, e.g. `uvmwatch-fleet.json`.
    pub dashboard: String,
    /// `panel "<title>" <refId>`, `annotation "<name>"` or `variable <name>`.
    pub what: String,
    /// The expression as written (variables not substituted). For a variable's
    /// `label_values(SELECTOR, LABEL)`, `count by (LABEL) (SELECTOR)`.
    pub expr: String,
    /// For a variable: the label whose values it lists.
    pub label: Option<String>,
}

/// Every dashboard JSON file in `dashboards/`, parsed, sorted by name.
pub fn dashboards() -> Vec<(String, Value)> {
    let dir = repo_root().join("dashboards");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|err| panic!("{name}: {err}"));
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every panel of a dashboard, rows' nested panels included.
pub fn panels(d: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().cloned().unwrap_or_default() {
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter().cloned());
        }
        out.push(p);
    }
    out
}

/// Every PromQL query of every dashboard: panel targets, annotations and query variables.
pub fn dashboard_queries() -> Vec<DashQuery> {
    let mut out = Vec::new();
    for (name, d) in dashboards() {
        for p in panels(&d) {
            for t in p["targets"].as_array().cloned().unwrap_or_default() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push(DashQuery {
                        dashboard: name.clone(),
                        what: format!(
                            "panel {:?} {}",
                            p["title"].as_str().unwrap_or(""),
                            t["refId"].as_str().unwrap_or("")
                        ),
                        expr: expr.to_string(),
                        label: None,
                    });
                }
            }
        }
        for a in d["annotations"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if let Some(expr) = a["expr"].as_str() {
                out.push(DashQuery {
                    dashboard: name.clone(),
                    what: format!("annotation {:?}", a["name"].as_str().unwrap_or("")),
                    expr: expr.to_string(),
                    label: None,
                });
            }
        }
        for v in d["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if v["type"] != "query" {
                continue;
            }
            let q = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .unwrap_or("");
            let (sel, label) = parse_label_values(q).unwrap_or_else(|| {
                panic!("{name}: variable {}: not label_values(): {q}", v["name"])
            });
            out.push(DashQuery {
                dashboard: name.clone(),
                what: format!("variable {}", v["name"].as_str().unwrap_or("")),
                expr: format!("count by ({label}) ({sel})"),
                label: Some(label),
            });
        }
    }
    out
}

/// `label_values(SELECTOR, LABEL)` → (SELECTOR, LABEL).
pub fn parse_label_values(q: &str) -> Option<(String, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (sel, label) = inner.rsplit_once(',')?;
    Some((sel.trim().to_string(), label.trim().to_string()))
}

/// Replaces Grafana variables (`$name`, `${name}`, `${name:fmt}`, `[[name]]`) by values;
/// panics on a variable not in `vars`.
pub fn substitute(expr: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let (name, next) = if b[i] == b'$' && i + 1 < b.len() && b[i + 1] == b'{' {
            let end = expr[i..].find('}').map(|e| i + e).expect("unclosed ${");
            let name = expr[i + 2..end].split(':').next().unwrap();
            (name.to_string(), end + 1)
        } else if b[i] == b'$' {
            let len = expr[i + 1..]
                .bytes()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                .count();
            (expr[i + 1..i + 1 + len].to_string(), i + 1 + len)
        } else if expr[i..].starts_with("[[") {
            let end = expr[i..].find("]]").map(|e| i + e).expect("unclosed [[");
            (expr[i + 2..end].to_string(), end + 2)
        } else {
            out.push(b[i] as char);
            i += 1;
            continue;
        };
        let value = vars
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("variable ${name} has no test value in {expr:?}"));
        out.push_str(value);
        i = next;
    }
    out
}

/// Parses a Prometheus duration made of `<n><unit>` parts (`1m`, `1h30m`, `0s`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut num = String::new();
    let mut chars = s.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push(chars.next().unwrap());
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        total += match unit.as_str() {
            "ms" => n,
            "s" => n * 1000,
            "m" => n * 60_000,
            "h" => n * 3_600_000,
            "d" => n * 86_400_000,
            "w" => n * 7 * 86_400_000,
            "y" => n * 365 * 86_400_000,
            _ => return None,
        };
    }
    if !num.is_empty() {
        return None;
    }
    Some(Duration::from_millis(total))
}

/// How much the test copy of the rules shortens every `for:`.
pub const FOR_DIVISOR: u32 = 15;

/// The test copy of the alert rules: the real file with every `for: D` replaced by
/// `for: D/15` (whole seconds, at least 1 s unless D is 0), everything else unchanged.
pub fn rules_with_short_for(text: &str) -> String {
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(d) = trimmed.strip_prefix("for:") {
            let indent = &line[..line.len() - trimmed.len()];
            let d = parse_duration(d.trim()).unwrap_or_else(|| panic!("bad for: {line}"));
            let secs = if d.is_zero() {
                0
            } else {
                (d.as_secs() / u64::from(FOR_DIVISOR)).max(1)
            };
            out.push_str(&format!("{indent}for: {secs}s\n"));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// The metric names (`uvmwatch_*`) a PromQL expression mentions.
pub fn uvmwatch_metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("uvmwatch_") {
        let before_ok = at == 0
            || !rest.as_bytes()[at - 1].is_ascii_alphanumeric() && rest.as_bytes()[at - 1] != b'_';
        let len = rest[at..]
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        // Inside a URL or a quoted label value (runbook links), not a metric.
        let quoted = rest[..at].ends_with('/') || rest[..at].ends_with('"');
        if before_ok && !quoted {
            out.push(rest[at..at + len].to_string());
        }
        rest = &rest[at + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_for_scaling() {
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0m"), Some(Duration::ZERO));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(
            rules_with_short_for("  a: 1\n        for: 1m\n    for: 15m\n  for: 0m\nx"),
            "  a: 1\n        for: 4s\n    for: 60s\n  for: 0s\nx"
        );
    }
}

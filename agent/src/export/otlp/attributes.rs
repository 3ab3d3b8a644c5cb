//! Span attributes: typed key-values, the process and workload attributes of root spans,
//! and command lines with secrets redacted.

use std::path::Path;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

use crate::event::Process;

pub(super) fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..KeyValue::default()
    }
}

pub(super) fn kv_str(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

pub(super) fn kv_int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}

pub(super) fn kv_f64(key: &str, v: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(v))
}

pub(super) fn kv_bool(key: &str, v: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(v))
}

/// Words in an option name that mark its value as a secret (`--api-key`, `--hf-token`,
/// `--password`); `--tokenizer` and `--max-num-batched-tokens` do not match.
const SECRET_WORDS: &[&str] = &[
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pass",
    "credential",
    "credentials",
    "auth",
    "authorization",
];

fn is_secret_flag(flag: &str) -> bool {
    flag.trim_start_matches('-')
        .to_ascii_lowercase()
        .split(['-', '_', '.'])
        .any(|w| SECRET_WORDS.contains(&w))
}

/// `process.command_line`: arguments joined by spaces, values of secret-looking options
/// and URL user-info replaced by `[REDACTED]`, cut at `max` bytes (`...` marks a cut).
pub fn command_line(args: &[String], max: usize) -> String {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for a in args {
        if hide_next {
            out.push("[REDACTED]".into());
            hide_next = false;
            continue;
        }
        if a.starts_with('-') {
            if let Some((f, _)) = a.split_once('=') {
                if is_secret_flag(f) {
                    out.push(format!("{f}=[REDACTED]"));
                    continue;
                }
            } else if is_secret_flag(a) {
                hide_next = true;
            }
        }
        out.push(redact_userinfo(a));
    }
    let s = out.join(" ");
    if s.len() <= max {
        return s;
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// `scheme://user:pass@host` → `scheme://[REDACTED]@host`.
fn redact_userinfo(a: &str) -> String {
    if let Some(i) = a.find("://") {
        let rest = &a[i + 3..];
        let host_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..host_end].rfind('@') {
            return format!("{}://[REDACTED]@{}", &a[..i], &rest[at + 1..]);
        }
    }
    a.to_string()
}

/// The span attributes describing a process and its workload (on root spans).
pub(super) fn process_attributes(p: &Process, max_cmd: usize) -> Vec<KeyValue> {
    let w = &p.workload;
    let mut a = vec![kv_int("process.pid", p.pid as i64)];
    if let Some(v) = p.ns_pid {
        a.push(kv_int("process.vpid", v as i64));
    }
    let exe_name = Path::new(p.exe.trim_end_matches(" (deleted)"))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| p.comm.clone());
    if !exe_name.is_empty() {
        a.push(kv_str("process.executable.name", exe_name));
    }
    if !p.exe.is_empty() {
        a.push(kv_str("process.executable.path", p.exe.clone()));
    }
    if !p.cmdline.is_empty() {
        a.push(kv_str(
            "process.command_line",
            command_line(&p.cmdline, max_cmd),
        ));
    }
    if let Some(c) = p.container_id.as_ref().or(w.container_id.as_ref()) {
        a.push(kv_str("container.id", c.clone()));
    }
    if let Some(v) = &w.pod_uid {
        a.push(kv_str("k8s.pod.uid", v.clone()));
    }
    if let Some(v) = &w.k8s_pod_name {
        a.push(kv_str("k8s.pod.name", v.clone()));
    }
    if let Some(v) = &w.k8s_namespace {
        a.push(kv_str("k8s.namespace.name", v.clone()));
    }
    if let Some(v) = &w.engine {
        a.push(kv_str("uvmwatch.engine", v.clone()));
    }
    if let Some(v) = &w.model {
        a.push(kv_str("uvmwatch.model", v.clone()));
    }
    if let Some(v) = &w.quantization {
        a.push(kv_str("uvmwatch.quantization", v.clone()));
    }
    if let Some(v) = w.tp_rank {
        a.push(kv_int("uvmwatch.tp_rank", v as i64));
    }
    if let Some(v) = w.tensor_parallel_size {
        a.push(kv_int("uvmwatch.tp_size", v as i64));
    }
    a
}

//! The node verdict schedulers act on, from the same findings as the report: whether CUDA
//! can start here, in the three forms schedulers and node-health systems read.
//!
//! - **node-problem-detector custom plugin** (`doctor --npd`): NPD runs a plugin, takes its
//!   exit status as the condition (0 OK, 1 NonOK, anything else Unknown) and its standard
//!   output, trimmed and cut at `max_output_length` bytes (default 80), as the condition's
//!   message (kubernetes/node-problem-detector v1.36.0,
//!   `pkg/custompluginmonitor/plugin/plugin.go` `run` and
//!   `pkg/custompluginmonitor/types/config.go`, `defaultMaxOutputLength = 80`).
//! - **NVSentinel health event** (`doctor --format health-event`): a `HealthEvents` message
//!   of NVIDIA NVSentinel's `data-models/protobufs/health_event.proto` in the protobuf JSON
//!   mapping (field names as declared, enums by name, the timestamp in RFC 3339), read from
//!   NVIDIA/NVSentinel at 3b7f63904f12 (through its fork dims/NVSentinel). NVSentinel takes
//!   it over gRPC only (`datamodels.PlatformConnector/HealthEventOccurredV1` on its Unix
//!   socket), so this is the document a forwarder sends (docs/node-verdict.md).
//! - **pre-job gate** (`doctor --pre-job`): an exit status an init container or a
//!   scheduler's prolog can gate on.
//!
//! All three say "not ready" only for a critical finding (CUDA cannot start or hangs): a
//! warning (a risk, a slow start) leaves a node schedulable.

use serde_json::{json, Map, Value};

use super::cause::CauseId;
use super::finding::{Finding, Severity, Standing};
use super::report::Report;
use super::signal::Sig;

/// A node's readiness for CUDA work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No critical finding: CUDA can start (warnings aside).
    Ready,
    /// At least one critical finding.
    NotReady,
    /// The doctor could not judge (its input could not be used) and found nothing critical.
    Unknown,
}

impl Verdict {
    /// The verdict of a report.
    pub fn of(r: &Report) -> Verdict {
        match r.status() {
            "critical" => Verdict::NotReady,
            "unknown" => Verdict::Unknown,
            _ => Verdict::Ready,
        }
    }

    /// The exit status node-problem-detector reads: 0 OK, 1 NonOK, 2 Unknown (any status
    /// but 0 and 1 is Unknown there; 2 is its own examples' value, `config/plugin/check_ntp.sh`).
    pub fn npd_exit(self) -> u8 {
        match self {
            Verdict::Ready => 0,
            Verdict::NotReady => 1,
            Verdict::Unknown => 2,
        }
    }

    /// The exit status of `doctor --pre-job`: 0 go, 1 no-go, 3 could not check (the
    /// doctor's own "could not run").
    pub fn gate_exit(self) -> u8 {
        match self {
            Verdict::Ready => 0,
            Verdict::NotReady => 1,
            Verdict::Unknown => super::report::EXIT_COULD_NOT_RUN,
        }
    }
}

/// NPD's default `max_output_length`.
pub const NPD_MAX_OUTPUT: usize = 80;

/// The one line an NPD plugin prints: the leading cause and the symptom (`<cause>:
/// <symptom>`, and how many causes are still possible), or the worst hazard (`<cause>:
/// <title>`), else what was judged; printable ASCII only (NPD cuts bytes, so a multi-byte
/// character could be split), at most `max` bytes.
pub fn npd_message(r: &Report, max: usize) -> String {
    let serious: Vec<&Finding> = r
        .findings()
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect();
    let line = match (Verdict::of(r), serious.first()) {
        (Verdict::Unknown, _) => format!("unknown: {}", r.source.summary(r.observations)),
        (_, Some(f)) => {
            let more = match serious.len() {
                1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            let what = match &r.differential.symptom {
                Some(s) => s.what.as_str(),
                None => f.title.as_str(),
            };
            format!("{}: {what}{more}", f.rule)
        }
        (_, None) if r.status() == "no_driver" => "no NVIDIA driver on this node".to_string(),
        (_, None) => "CUDA can start: no finding".to_string(),
    };
    ascii_cut(&line, max)
}

/// `s` with every character outside printable ASCII replaced by `?`, cut to `max` bytes.
fn ascii_cut(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(max)
        .collect()
}

/// The `checkName` of every event: NVSentinel makes it the node condition's type, and a
/// healthy event of the same name clears it (NVSentinel, `docs/tutorials/writing-a-health-
/// monitor.md`).
pub const CHECK_NAME: &str = "UvmwatchCudaStartup";

/// NVSentinel's `RecommendedAction` for a finding: a reboot for a driver stuck in a call or
/// left stale by a suspend (only a fresh driver clears it), a GPU reset for a GPU that failed
/// to initialize (a reboot for one that fell off the bus, Xid 79), otherwise a person (the
/// fix is the finding's own: a module parameter, a package, a container's devices), which
/// NVSentinel calls `CONTACT_SUPPORT`. Only values present in every version of the enum seen
/// are used (0, 2, 5, 24).
fn recommended_action(f: &Finding) -> &'static str {
    match f.rule {
        CauseId::DriverHang | CauseId::StaleAfterSuspend => "RESTART_BM",
        CauseId::AdapterInitFailure if f.rests_on(Sig::GpuFellOffBus) => "RESTART_BM",
        CauseId::AdapterInitFailure => "COMPONENT_RESET",
        _ => "CONTACT_SUPPORT",
    }
}

/// How NVSentinel should treat the events: `STORE_ONLY` (observe only: recorded, no
/// cordon or drain) unless the operator opts in to `EXECUTE_REMEDIATION`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processing {
    /// `STORE_ONLY`.
    StoreOnly,
    /// `EXECUTE_REMEDIATION`.
    Remediate,
}

/// The `HealthEvents` document: one event per finding of warning or worse (fatal when
/// critical), or one healthy event (`isHealthy`, `recommendedAction` `NONE`) that clears the
/// condition, or none when the doctor could not judge. `generated` is the RFC 3339 time of the run, `node` the Kubernetes node name.
pub fn health_events(r: &Report, node: &str, generated: &str, processing: Processing) -> Value {
    let gpus: Vec<Value> = r
        .evidence
        .gpus
        .get()
        .into_iter()
        .flatten()
        .map(|addr| json!({"entityType": "PCI", "entityValue": addr}))
        .collect();
    let driver = r
        .evidence
        .driver
        .get()
        .map(|d| d.version.clone())
        .unwrap_or_default();
    let strategy = match processing {
        Processing::StoreOnly => "STORE_ONLY",
        Processing::Remediate => "EXECUTE_REMEDIATION",
    };
    let event = |healthy: bool,
                 fatal: bool,
                 message: String,
                 action: &str,
                 codes: Vec<String>,
                 metadata: Map<String, Value>| {
        json!({
            "version": 1,
            "agent": "uvmwatch",
            "componentClass": "GPU",
            "checkName": CHECK_NAME,
            "isFatal": fatal,
            "isHealthy": healthy,
            "message": message,
            "recommendedAction": action,
            "errorCode": codes,
            "entitiesImpacted": gpus,
            "metadata": metadata,
            "generatedTimestamp": generated,
            "nodeName": node,
            "processingStrategy": strategy,
        })
    };
    let base = |m: &mut Map<String, Value>| {
        if !driver.is_empty() {
            m.insert("driver_version".into(), json!(driver));
        }
        m.insert("status".into(), json!(r.status()));
    };
    let mut events: Vec<Value> = r
        .findings()
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| {
            let mut m = Map::new();
            base(&mut m);
            m.insert("severity".into(), json!(f.severity.as_str()));
            m.insert("confidence".into(), json!(f.confidence.as_str()));
            m.insert("standing".into(), json!(f.standing.as_str()));
            if let Some(s) = &r.differential.symptom {
                m.insert("symptom".into(), json!(s.what));
            }
            if f.standing == Standing::Leading {
                let ruled: Vec<String> = r
                    .differential
                    .ruled_out
                    .iter()
                    .map(|o| format!("{}: {}", o.rule, o.why))
                    .collect();
                // NVSentinel's metadata is a map of strings.
                m.insert("ruled_out".into(), json!(ruled.join("; ")));
            }
            m.insert("runbook".into(), json!(f.runbook));
            if let Some(step) = f.fix.first() {
                m.insert("fix".into(), json!(step.note));
            }
            event(
                false,
                f.severity == Severity::Critical,
                match &r.differential.symptom {
                    Some(s) => format!("{}: {} ({})", f.rule, s.what, f.standing.as_str()),
                    None => format!("{}: {}", f.rule, f.title),
                },
                recommended_action(f),
                vec![f.rule.as_str().to_string()],
                m,
            )
        })
        .collect();
    // Nothing to raise: a healthy event clears the condition, unless the doctor could not
    // judge (then no event: it neither raises nor clears).
    if events.is_empty() && Verdict::of(r) == Verdict::Ready {
        let mut m = Map::new();
        base(&mut m);
        let message = "CUDA can start: no finding of warning or worse".to_string();
        events.push(event(true, false, message, "NONE", vec![], m));
    }
    json!({"version": 1, "events": events})
}

#[cfg(test)]
mod tests {
    use super::super::engine::diagnose;
    use super::super::facts::{Evidence, Observations};
    use super::super::fixtures::*;
    use super::super::observed::ObservationsSource;
    use super::*;

    /// The verdict forms of a diagnosis of `e` with `o` (probed unless empty), with
    /// `problems` as the snapshot's unusable files.
    fn with_report<T>(
        e: &Evidence,
        o: &Observations,
        problems: &[String],
        f: impl FnOnce(&Report) -> T,
    ) -> T {
        let d = diagnose(e, o);
        let src = if *o == plain() {
            ObservationsSource::none()
        } else {
            ObservationsSource::choose(Some(o.clone()), None).1
        };
        f(&Report {
            differential: &d,
            evidence: e,
            observations: o,
            source: &src,
            snapshot_problems: problems,
        })
    }

    #[test]
    fn npd_line_and_exit_for_a_critical_a_healthy_and_an_unjudged_node() {
        let (v, line) = with_report(&motivating_host(), &register_gpu_no_memory(), &[], |r| {
            (Verdict::of(r), npd_message(r, NPD_MAX_OUTPUT))
        });
        assert_eq!((v, v.npd_exit(), v.gate_exit()), (Verdict::NotReady, 1, 1));
        assert!(
            line.starts_with("hmm_setup_failure: cuInit returned 3 (CUDA_ERROR_NOT_INITIALIZED)"),
            "{line}"
        );
        assert!(line.len() <= NPD_MAX_OUTPUT, "{line}");
        let (v, line) = with_report(&healthy_open_host(), &plain(), &[], |r| {
            (Verdict::of(r), npd_message(r, NPD_MAX_OUTPUT))
        });
        assert_eq!((v, v.npd_exit(), v.gate_exit()), (Verdict::Ready, 0, 0));
        assert_eq!(line, "CUDA can start: no finding");
        let problems = ["dev/nodes.json of /snap: malformed".to_string()];
        let (v, line) = with_report(&healthy_open_host(), &plain(), &problems, |r| {
            (Verdict::of(r), npd_message(r, NPD_MAX_OUTPUT))
        });
        assert_eq!((v, v.npd_exit(), v.gate_exit()), (Verdict::Unknown, 2, 3));
        assert!(line.starts_with("unknown: "), "{line}");
        // A warning alone leaves the node ready, and is what the line says.
        let (v, line) = with_report(
            &healthy_open_host(),
            &watched().cuinit(0, 9.0).opens(4),
            &[],
            |r| (Verdict::of(r), npd_message(r, 200)),
        );
        assert_eq!(v, Verdict::Ready, "{line}");
    }

    #[test]
    fn npd_line_is_printable_ascii_cut_at_its_bound() {
        assert_eq!(ascii_cut("GPU  café\tok", 64), "GPU  caf??ok");
        assert_eq!(ascii_cut("abcdef", 4), "abcd");
        assert_eq!(ascii_cut("ééé", 2), "??");
    }

    #[test]
    fn health_events_fatal_healthy_and_none() {
        let doc = with_report(&motivating_host(), &register_gpu_no_memory(), &[], |r| {
            health_events(
                r,
                "gpu-node-42",
                "2026-12-03T07:00:00Z",
                Processing::StoreOnly,
            )
        });
        assert_eq!(doc["version"], 1);
        let ev = &doc["events"][0];
        assert_eq!(ev["agent"], "uvmwatch");
        assert_eq!(ev["componentClass"], "GPU");
        assert_eq!(ev["checkName"], CHECK_NAME);
        assert_eq!(ev["isFatal"], true);
        assert_eq!(ev["isHealthy"], false);
        assert_eq!(ev["recommendedAction"], "CONTACT_SUPPORT");
        assert_eq!(ev["errorCode"], json!(["hmm_setup_failure"]));
        assert_eq!(ev["processingStrategy"], "STORE_ONLY");
        assert_eq!(ev["nodeName"], "gpu-node-42");
        assert_eq!(ev["generatedTimestamp"], "2026-12-03T07:00:00Z");
        assert_eq!(ev["metadata"]["severity"], "critical");
        assert!(ev["metadata"]["fix"]
            .as_str()
            .is_some_and(|f| !f.is_empty()));
        let entities = ev["entitiesImpacted"].as_array().unwrap();
        assert!(!entities.is_empty());
        assert!(entities.iter().all(|e| e["entityType"] == "PCI"));
        // Healthy: one event that clears the condition.
        let doc = with_report(&healthy_open_host(), &plain(), &[], |r| {
            health_events(r, "n", "t", Processing::Remediate)
        });
        let evs = doc["events"].as_array().unwrap();
        assert_eq!(evs.len(), 1, "{doc:#}");
        assert_eq!(evs[0]["isHealthy"], true);
        assert_eq!(evs[0]["isFatal"], false);
        assert_eq!(evs[0]["recommendedAction"], "NONE");
        assert_eq!(evs[0]["processingStrategy"], "EXECUTE_REMEDIATION");
        // Not judged: nothing raised, nothing cleared.
        let problems = ["manifest.json of /snap: malformed".to_string()];
        let doc = with_report(&healthy_open_host(), &plain(), &problems, |r| {
            health_events(r, "n", "t", Processing::StoreOnly)
        });
        assert_eq!(doc["events"], json!([]));
    }

    #[test]
    fn health_event_actions_follow_the_cause() {
        let hang = with_report(
            &healthy_open_host(),
            &watched()
                .in_flight(40.0)
                .stuck("UVM_REGISTER_GPU", "/dev/nvidia-uvm", 40.0, "D"),
            &[],
            |r| health_events(r, "n", "t", Processing::StoreOnly),
        );
        assert_eq!(
            hang["events"][0]["errorCode"],
            json!(["driver_hang"]),
            "{hang:#}"
        );
        assert_eq!(hang["events"][0]["recommendedAction"], "RESTART_BM");
    }
}

//! Output of `uvmwatch doctor`: a short text report, a JSON document and the exit code, of
//! one [`Report`] (the findings, the facts, the observations judged and where those came
//! from).
//!
//! The JSON schema and the exit codes are documented in `docs/doctor.md`; change them only
//! together with [`SCHEMA_VERSION`] and that document.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::facts::{Evidence, Fact, Observations};
use super::finding::{Finding, Severity};
use super::input::{clip, KERNEL_LOG_LIMIT};
use super::observed::ObservationsSource;
use super::rules::no_driver;

/// Version of the JSON document [`render_json`] returns. Bumped on any change that is not a
/// pure addition of a field.
pub const SCHEMA_VERSION: u32 = 1;

/// Exit code: no finding, or informational findings only.
pub const EXIT_HEALTHY: u8 = 0;
/// Exit code: the worst finding is a warning.
pub const EXIT_WARNING: u8 = 1;
/// Exit code: at least one critical finding (CUDA cannot start or hangs).
pub const EXIT_CRITICAL: u8 = 2;
/// Exit code: the doctor could not run (bad arguments, unreadable snapshot or bundle; set by
/// the command line), or it ran on the static facts alone because the snapshot's
/// `observations.json` could not be used and no finding is critical ([`Report::exit_code`]).
pub const EXIT_COULD_NOT_RUN: u8 = 3;

/// One diagnosis as `uvmwatch doctor` reports it.
#[derive(Clone, Copy, Debug)]
pub struct Report<'a> {
    /// The findings, worst first (`observed::judge`).
    pub findings: &'a [Finding],
    /// The facts read.
    pub evidence: &'a Evidence,
    /// The observations judged (all defaults when none).
    pub observations: &'a Observations,
    /// Where they came from.
    pub source: &'a ObservationsSource,
    /// The snapshot's own files that could not be used (`bundle::snapshot_problems`:
    /// a malformed `manifest.json` or `dev/nodes.json`); empty for this machine.
    pub snapshot_problems: &'a [String],
}

impl Report<'_> {
    /// The diagnosis is incomplete: the snapshot's `observations.json` could not be used
    /// ([`ObservationsSource::incomplete`]) or another of its files is malformed
    /// ([`Report::snapshot_problems`]).
    pub fn incomplete(&self) -> bool {
        self.source.incomplete() || !self.snapshot_problems.is_empty()
    }

    /// The process exit code: [`EXIT_CRITICAL`] with a critical finding; otherwise
    /// [`EXIT_COULD_NOT_RUN`] (UNKNOWN) when the diagnosis is incomplete
    /// ([`Report::incomplete`]); otherwise [`exit_code`] of the findings.
    pub fn exit_code(&self) -> u8 {
        match exit_code(self.findings) {
            EXIT_CRITICAL => EXIT_CRITICAL,
            _ if self.incomplete() => EXIT_COULD_NOT_RUN,
            code => code,
        }
    }

    /// The `status` of the JSON document: `critical` with a critical finding; otherwise
    /// `unknown` when the diagnosis is incomplete ([`Report::incomplete`]); otherwise
    /// [`status`] of the findings.
    pub fn status(&self) -> &'static str {
        match worst(self.findings) {
            Some(Severity::Critical) => Severity::Critical.as_str(),
            _ if self.incomplete() => "unknown",
            _ => status(self.findings, self.evidence),
        }
    }

    /// The report's line about the observations judged.
    pub fn observations_line(&self) -> String {
        self.source.summary(self.observations)
    }
}

/// The exit code for these findings: [`EXIT_HEALTHY`] (none, or info only),
/// [`EXIT_WARNING`], or [`EXIT_CRITICAL`], after the worst severity. The same levels as the
/// Nagios plugin convention (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).
pub fn exit_code(findings: &[Finding]) -> u8 {
    match worst(findings) {
        None | Some(Severity::Info) => EXIT_HEALTHY,
        Some(Severity::Warning) => EXIT_WARNING,
        Some(Severity::Critical) => EXIT_CRITICAL,
    }
}

/// The `status` of the JSON document: `healthy` (no findings), `no_driver` (no findings and
/// no NVIDIA driver at all), or the worst severity: `info`, `warning`, `critical`.
pub fn status(findings: &[Finding], evidence: &Evidence) -> &'static str {
    match worst(findings) {
        Some(s) => s.as_str(),
        None if no_driver(evidence).is_some() => "no_driver",
        None => "healthy",
    }
}

fn worst(findings: &[Finding]) -> Option<Severity> {
    findings.iter().map(|f| f.severity).max()
}

/// The JSON document of one diagnosis (schema in `docs/doctor.md`, version
/// [`SCHEMA_VERSION`]). `observations` is all defaults when nothing was observed;
/// `observations_source` says where they came from.
pub fn render_json(r: &Report) -> Value {
    let findings = r.findings;
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    let mut source = to_value(r.source);
    if let Value::Object(m) = &mut source {
        m.insert("summary".into(), Value::String(r.observations_line()));
    }
    json!({
        "schema_version": SCHEMA_VERSION,
        "status": r.status(),
        "exit_code": r.exit_code(),
        "counts": {
            "critical": count(Severity::Critical),
            "warning": count(Severity::Warning),
            "info": count(Severity::Info),
        },
        "findings": to_value(findings),
        "evidence": to_value(r.evidence),
        "observations": to_value(r.observations),
        "observations_source": source,
        "snapshot_problems": r.snapshot_problems,
    })
}

/// Serializes one of the doctor types; they hold only strings, numbers, maps with string
/// keys and sequences, so this cannot fail, but a failure would still not panic.
fn to_value<T: serde::Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({ "serialization_error": e.to_string() }))
}

/// ANSI styling, or none.
struct Paint {
    color: bool,
}

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn severity(&self, s: Severity) -> String {
        let code = match s {
            Severity::Critical => "1;31",
            Severity::Warning => "1;33",
            Severity::Info => "1;36",
        };
        self.wrap(code, &s.as_str().to_ascii_uppercase())
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }
}

/// The text report: a headline (counts worst first, or "healthy", or "no NVIDIA driver
/// present"; "diagnosis incomplete" when the snapshot's `observations.json` could not be
/// used), the line saying which observations were judged, then one block per finding,
/// worst first (severity, title, confidence; evidence with sources; what could not be
/// checked; fix steps tagged `[host]`/`[container]`/`[any]`; runbook). With no finding: the
/// driver seen and what could not be checked. `color` adds ANSI colors (for a terminal).
pub fn render_text(r: &Report, color: bool) -> String {
    let p = Paint { color };
    let mut out = String::new();
    let findings = r.findings;
    if findings.is_empty() {
        render_healthy(&mut out, r, &p);
        return out;
    }
    let mut counts = Vec::new();
    for s in [Severity::Critical, Severity::Warning, Severity::Info] {
        let n = findings.iter().filter(|f| f.severity == s).count();
        if n > 0 {
            counts.push(format!("{n} {}", s.as_str()));
        }
    }
    let incomplete = if r.status() == "unknown" {
        format!("; {}", p.bold("diagnosis incomplete"))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "uvmwatch doctor: {} (worst first){incomplete}",
        counts.join(", ")
    );
    let _ = writeln!(out, "  {}", r.observations_line());
    render_snapshot_problems(&mut out, r);
    render_candidates(&mut out, findings);
    for f in findings {
        out.push('\n');
        render_finding(&mut out, f, &p);
    }
    out
}

/// Longest value (evidence, reason, fix step) the text report prints whole; longer ones
/// are cut ([`clip`], which also escapes control characters: no input reaches the terminal
/// raw).
const TEXT_VALUE_MAX_CHARS: usize = 1000;

/// A value for the text report ([`TEXT_VALUE_MAX_CHARS`]).
fn shown(value: &str) -> String {
    clip(value, TEXT_VALUE_MAX_CHARS)
}

/// The snapshot files that could not be used, under the convention of the report's other
/// gaps (`could not check: ...`).
fn render_snapshot_problems(out: &mut String, r: &Report) {
    if r.snapshot_problems.is_empty() {
        return;
    }
    let _ = writeln!(out, "  could not use the snapshot's own files:");
    for problem in r.snapshot_problems {
        let _ = writeln!(out, "    - {}", shown(problem));
    }
}

/// When more than one cause of warning or worse fits and one of them is uncertain: the
/// causes, most likely first, each with the command that tells it apart
/// ([`Finding::tell_apart`]), so the reader runs one command instead of guessing.
fn render_candidates(out: &mut String, findings: &[Finding]) {
    // Causes of the same thing: of warning or worse, and resting on what the first rests on
    // (a static risk is no candidate for a failure the probes saw).
    let Some(first) = findings.first() else {
        return;
    };
    let fit: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning && f.basis == first.basis)
        .collect();
    if fit.len() < 2 || fit.iter().all(|f| f.tell_apart.is_none()) {
        return;
    }
    let _ = writeln!(
        out,
        "  {} causes fit, most likely first; what tells them apart:",
        fit.len()
    );
    for (n, f) in fit.iter().enumerate() {
        let how = f
            .tell_apart
            .as_deref()
            .map(shown)
            .unwrap_or_else(|| "(high confidence: its defining signal was seen)".to_string());
        let _ = writeln!(
            out,
            "    {}. {} ({}, {}): {how}",
            n + 1,
            f.rule,
            f.severity.as_str(),
            f.confidence.as_str()
        );
    }
}

fn render_finding(out: &mut String, f: &Finding, p: &Paint) {
    let _ = writeln!(
        out,
        "{} {}: {} (confidence: {})",
        p.severity(f.severity),
        p.bold(&f.rule),
        f.title,
        f.confidence.as_str()
    );
    // What it rests on: observed (the probes) or static (the host's state alone).
    let _ = writeln!(out, "  basis: {} ({})", f.basis.as_str(), f.basis.meaning());
    if !f.evidence.is_empty() {
        let _ = writeln!(out, "  evidence:");
        let width = f
            .evidence
            .iter()
            .map(|i| i.what.chars().count())
            .max()
            .unwrap_or(0)
            .min(28);
        for i in &f.evidence {
            let _ = writeln!(
                out,
                "    {:<width$}  {}  {}",
                i.what,
                shown(&i.value),
                p.dim(&format!("[{}]", shown(&i.source)))
            );
        }
    }
    if !f.unchecked.is_empty() {
        let _ = writeln!(out, "  could not check:");
        for u in &f.unchecked {
            let _ = writeln!(out, "    - {}", shown(u));
        }
    }
    if !f.fix.is_empty() {
        let _ = writeln!(out, "  fix:");
        for (n, s) in f.fix.iter().enumerate() {
            let _ = writeln!(
                out,
                "    {}. {} {}",
                n + 1,
                p.bold(&format!("[{}]", s.where_.as_str())),
                shown(&s.note)
            );
            for c in &s.commands {
                let _ = writeln!(out, "         $ {}", shown(c));
            }
        }
    }
    if let Some(how) = &f.tell_apart {
        let _ = writeln!(out, "  to tell it apart: {}", shown(how));
    }
    let _ = writeln!(out, "  runbook: {}", f.runbook);
}

fn render_healthy(out: &mut String, r: &Report, p: &Paint) {
    let e = r.evidence;
    if r.incomplete() {
        let _ = writeln!(
            out,
            "uvmwatch doctor: {}: no known cause found in the static facts; the diagnosis is \
             incomplete.",
            p.wrap("1;35", "unknown")
        );
    } else if let Some(why) = no_driver(e) {
        let _ = writeln!(
            out,
            "uvmwatch doctor: {} ({why}): nothing to diagnose on this machine.",
            p.bold("no NVIDIA driver present")
        );
    } else {
        let _ = writeln!(
            out,
            "uvmwatch doctor: {}: no known cause of a CUDA init failure or hang found.",
            p.wrap("1;32", "healthy")
        );
    }
    let _ = writeln!(out, "  {}", r.observations_line());
    render_snapshot_problems(out, r);
    if let Some(d) = e.driver.get() {
        let flavor = if d.open_module { "open" } else { "proprietary" };
        let _ = writeln!(
            out,
            "  driver: {} ({flavor} kernel module)  {}",
            shown(&d.version),
            p.dim(&format!("[{}]", e.driver.source))
        );
    }
    let missing = unavailable_facts(e);
    if !missing.is_empty() {
        let _ = writeln!(out, "  could not check:");
        for m in missing {
            let _ = writeln!(out, "    - {}", shown(&m));
        }
    }
}

/// Every fact that could not be read, as "what: why (source)", and a kernel log read only
/// in part.
fn unavailable_facts(e: &Evidence) -> Vec<String> {
    fn one<T>(out: &mut Vec<String>, f: &Fact<T>, what: &str) {
        if let Err(u) = &f.value {
            out.push(format!("{what}: {} ({})", u.why, f.source));
        }
    }
    let mut out = Vec::new();
    one(&mut out, &e.driver, "driver version");
    one(&mut out, &e.driver_params, "driver parameters");
    one(&mut out, &e.gpus, "GPUs the driver registered");
    one(&mut out, &e.uvm_params, "nvidia_uvm parameters");
    one(&mut out, &e.modules, "loaded modules");
    one(&mut out, &e.devices, "device majors");
    one(&mut out, &e.dev_nodes, "device nodes");
    one(&mut out, &e.nvswitch_nodes, "NVSwitch nodes");
    one(&mut out, &e.container, "container");
    one(&mut out, &e.kernel, "kernel version");
    one(&mut out, &e.kernel_config, "kernel config");
    one(&mut out, &e.cmdline, "kernel command line");
    one(&mut out, &e.iomem_hmm, "HMM memory regions");
    // `smi_outcome` is unknown only when `smi` is, for the same reason: not repeated.
    one(&mut out, &e.smi, "nvidia-smi");
    one(&mut out, &e.kernel_log, "kernel log");
    one(&mut out, &e.daemons, "daemons");
    one(&mut out, &e.libcuda, "mapped libcuda");
    if let Some(log) = e.kernel_log.get().filter(|l| l.dropped_bytes > 0) {
        out.push(format!(
            "kernel log: only its newest {} bytes were read ({} older bytes left out) ({})",
            KERNEL_LOG_LIMIT.bytes, log.dropped_bytes, e.kernel_log.source
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::facts::{Fact, Observations};
    use super::super::finding::Confidence;
    use super::super::fixtures::*;
    use super::super::rules::diagnose;
    use super::*;

    /// The text of a diagnosis with no observations.
    fn text_of(findings: &[Finding], e: &Evidence, color: bool) -> String {
        let src = ObservationsSource::none();
        render_text(
            &Report {
                findings,
                evidence: e,
                observations: &plain(),
                source: &src,
                snapshot_problems: &[],
            },
            color,
        )
    }

    /// The JSON document of a diagnosis with observations `o` (from `--probe` unless `o`
    /// is empty).
    fn json_of(findings: &[Finding], e: &Evidence, o: &Observations) -> Value {
        let src = if *o == plain() {
            ObservationsSource::none()
        } else {
            ObservationsSource::choose(Some(o.clone()), None).1
        };
        render_json(&Report {
            findings,
            evidence: e,
            observations: o,
            source: &src,
            snapshot_problems: &[],
        })
    }

    /// A GPU fallen off the bus (Xid 79 in the kernel log) and a `cuInit` that returned 3
    /// after good opens: the Xid is the sure cause, HMM set-up a weaker one that also fits.
    fn xid79_host() -> Evidence {
        healthy_open_host().log(|l| {
            l.xids = vec![79];
            l.nvidia_lines =
                vec!["NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.".into()];
        })
    }

    #[test]
    fn text_lists_the_causes_that_fit_in_order_with_what_tells_them_apart() {
        let e = xid79_host();
        let o = watched().cuinit(3, 0.2).opens(3);
        let findings = diagnose(&e, &o);
        let src = ObservationsSource::choose(Some(o.clone()), None).1;
        let text = render_text(
            &Report {
                findings: &findings,
                evidence: &e,
                observations: &o,
                source: &src,
                snapshot_problems: &[],
            },
            false,
        );
        let head = text
            .split_once("2 causes fit, most likely first; what tells them apart:\n")
            .unwrap_or_else(|| panic!("no list of causes: {text}"))
            .1;
        let lines: Vec<&str> = head.lines().take(2).collect();
        assert!(
            lines[0].starts_with("    1. adapter_init_failure (critical, high): "),
            "{text}"
        );
        assert!(
            lines[1].starts_with("    2. hmm_setup_failure (critical, low): ")
                && lines[1].contains("uvm_disable_hmm=1"),
            "{text}"
        );
        // Each finding below high confidence says it again under its own heading.
        assert!(
            text.contains("  to tell it apart: sudo modprobe -r nvidia_uvm"),
            "{text}"
        );
        let json = json_of(&findings, &e, &o);
        let found = json["findings"].as_array().unwrap();
        assert_eq!(found[0]["tell_apart"], Value::Null, "{json:#}");
        assert!(found[1]["tell_apart"].as_str().is_some(), "{json:#}");
    }

    #[test]
    fn one_cause_or_a_static_risk_beside_an_observed_failure_is_no_list() {
        let o = watched().cuinit(3, 0.2).opens(3);
        // HMM set-up alone: nothing to tell apart from.
        let e = healthy_open_host();
        let findings = diagnose(&e, &o);
        assert_eq!(findings.len(), 1, "{findings:#?}");
        assert!(!text_of(&findings, &e, false).contains("causes fit"));
        // The Xid with a plain doctor: a static finding alone.
        let e = xid79_host();
        let findings = diagnose(&e, &plain());
        assert!(!text_of(&findings, &e, false).contains("causes fit"));
    }

    #[test]
    fn text_of_the_motivating_case() {
        let e = motivating_host();
        let findings = diagnose(&e, &register_gpu_no_memory());
        let text = text_of(&findings, &e, false);
        assert!(!text.contains('\x1b'), "{text}");
        assert!(
            text.starts_with("uvmwatch doctor: 1 critical (worst first)\n"),
            "{text}"
        );
        for needle in [
            "CRITICAL hmm_setup_failure: nvidia_uvm HMM set-up failed: UVM_REGISTER_GPU returned NV_ERR_NO_MEMORY",
            "(confidence: high)",
            "[probe:ioctl]",
            "[/sys/module/nvidia_uvm/parameters]",
            "could not check:",
            "request_free_mem_region",
            "1. [host] Disable HMM in nvidia_uvm",
            "$ echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee /etc/modprobe.d/uvmwatch-disable-hmm.conf",
            "$ sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            "[any] Verify",
            "runbook: docs/runbooks/hmm_setup_failure.md",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        let colored = text_of(&findings, &e, true);
        assert!(colored.contains("\x1b[1;31mCRITICAL\x1b[0m"), "{colored}");
    }

    #[test]
    fn text_worst_first() {
        let e = motivating_host().container("lxc", Some(&["c 195:* rwm"]));
        let findings = diagnose(&e, &Observations::default());
        let text = text_of(&findings, &e, false);
        assert!(
            text.starts_with("uvmwatch doctor: 1 critical, 1 warning"),
            "{text}"
        );
        let crit = text
            .find("CRITICAL device_permission")
            .expect("critical block");
        let warn = text
            .find("WARNING hmm_setup_failure")
            .expect("warning block");
        assert!(crit < warn);
    }

    #[test]
    fn text_when_healthy_or_no_driver() {
        let e = healthy_open_host().with(|e| {
            e.kernel_log = Fact::unavailable("Operation not permitted (os error 1)", "/dev/kmsg")
        });
        let text = text_of(&[], &e, false);
        assert!(
            text.starts_with(
                "uvmwatch doctor: healthy: no known cause of a CUDA init failure or hang \
                 found.\n  only static facts were judged (no probe observations)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("driver: 590.48.01 (open kernel module)"),
            "{text}"
        );
        assert!(
            text.contains("kernel log: Operation not permitted (os error 1) (/dev/kmsg)"),
            "{text}"
        );
        assert!(
            text.contains("HMM memory regions: addresses hidden"),
            "{text}"
        );

        let text = text_of(&[], &no_driver_host(), false);
        assert!(
            text.starts_with(
                "uvmwatch doctor: no NVIDIA driver present (/proc/driver/nvidia/version: not \
                 readable: No such file or directory (os error 2)): nothing to diagnose on \
                 this machine.\n  only static facts were judged (no probe observations)\n  \
                 could not check:\n"
            ),
            "{text}"
        );
        assert!(text.contains("    - nvidia-smi: nvidia-smi not present (nvidia-smi -q)\n"));
    }

    #[test]
    fn json_document() {
        let e = motivating_host();
        let o = register_gpu_no_memory();
        let findings = diagnose(&e, &o);
        let v = json_of(&findings, &e, &o);
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["status"], "critical");
        assert_eq!(v["exit_code"], 2);
        assert_eq!(v["counts"], json!({"critical": 1, "warning": 0, "info": 0}));
        let f = &v["findings"][0];
        assert_eq!(f["rule"], "hmm_setup_failure");
        assert_eq!(f["severity"], "critical");
        assert_eq!(f["confidence"], "high");
        assert_eq!(f["runbook"], "docs/runbooks/hmm_setup_failure.md");
        assert_eq!(f["fix"][0]["where"], "host");
        assert!(f["fix"][0]["commands"][0]
            .as_str()
            .unwrap()
            .contains("uvm_disable_hmm=1"));
        assert_eq!(f["evidence"][0]["source"], "probe:ioctl");
        assert!(f["unchecked"].as_array().is_some_and(|u| !u.is_empty()));
        assert_eq!(
            v["evidence"]["driver"]["value"]["Ok"]["version"],
            "590.48.01"
        );
        assert_eq!(
            v["evidence"]["driver"]["source"],
            "/proc/driver/nvidia/version"
        );
        assert_eq!(
            v["evidence"]["iomem_hmm"]["value"]["Err"]["why"],
            "addresses hidden: needs root"
        );
        assert_eq!(v["observations"]["cuinit_result"], 3);
        assert_eq!(
            v["observations"]["failed_call"]["result"],
            "NV_ERR_NO_MEMORY"
        );
        // The document reads back into the same types.
        let back: Vec<Finding> = serde_json::from_value(v["findings"].clone()).unwrap();
        assert_eq!(back, findings);
        let back: Evidence = serde_json::from_value(v["evidence"].clone()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn json_status_without_findings() {
        let o = Observations::default();
        let v = json_of(&[], &no_driver_host(), &o);
        assert_eq!(
            (v["status"].as_str(), v["exit_code"].as_u64()),
            (Some("no_driver"), Some(0))
        );
        let v = json_of(&[], &healthy_open_host(), &o);
        assert_eq!(v["status"], "healthy");
        assert_eq!(v["findings"], json!([]));
        assert_eq!(v["observations"]["pid"], Value::Null);
    }

    #[test]
    fn exit_codes() {
        let e = motivating_host();
        let f = |sev: Severity| Finding {
            rule: "slow_init".into(),
            title: "t".into(),
            severity: sev,
            confidence: Confidence::Low,
            basis: Default::default(),
            evidence: vec![],
            unchecked: vec![],
            fix: vec![],
            runbook: "docs/runbooks/slow_init.md".into(),
            tell_apart: None,
        };
        assert_eq!(exit_code(&[]), EXIT_HEALTHY);
        assert_eq!(exit_code(&[f(Severity::Info)]), EXIT_HEALTHY);
        assert_eq!(
            exit_code(&[f(Severity::Info), f(Severity::Warning)]),
            EXIT_WARNING
        );
        assert_eq!(
            exit_code(&[f(Severity::Warning), f(Severity::Critical)]),
            EXIT_CRITICAL
        );
        assert_eq!(status(&[f(Severity::Info)], &e), "info");
        assert_ne!(EXIT_COULD_NOT_RUN, EXIT_CRITICAL);
    }

    #[test]
    fn a_driver_that_sees_no_gpu_is_never_healthy_nor_nothing_to_diagnose() {
        use uvmwatch_testbed::snapshot::{driver_refused_no_gpu, gpuless_535, gpuless_550};
        for (what, spec, headline) in [
            (
                "550 loaded without a GPU",
                gpuless_550(),
                "CRITICAL no_gpu: the NVIDIA driver 550.163.01 is loaded but sees no GPU",
            ),
            (
                "535 loaded without a GPU",
                gpuless_535(),
                "CRITICAL no_gpu: the NVIDIA driver 535.261.03 is loaded but sees no GPU",
            ),
            (
                "driver refused to load",
                driver_refused_no_gpu(),
                "CRITICAL no_gpu: the NVIDIA driver refused to load: it found no NVIDIA GPU",
            ),
        ] {
            let e = snapshot_evidence(&spec);
            let findings = diagnose(&e, &plain());
            let text = text_of(&findings, &e, false);
            assert!(
                text.starts_with("uvmwatch doctor: 1 critical (worst first)\n"),
                "{what}: {text}"
            );
            assert!(text.contains(headline), "{what}: {text}");
            assert!(!text.contains("healthy"), "{what}: {text}");
            assert!(!text.contains("nothing to diagnose"), "{what}: {text}");
            let v = json_of(&findings, &e, &plain());
            assert_eq!(
                (v["status"].as_str(), v["exit_code"].as_u64()),
                (Some("critical"), Some(u64::from(EXIT_CRITICAL))),
                "{what}"
            );
        }
        // The new facts in the JSON document, as documented.
        let e = snapshot_evidence(&gpuless_550());
        let v = json_of(&[], &e, &plain());
        assert_eq!(v["evidence"]["gpus"]["value"]["Ok"], json!([]));
        assert_eq!(v["evidence"]["gpus"]["source"], "/proc/driver/nvidia/gpus");
        assert_eq!(
            v["evidence"]["smi_outcome"]["value"]["Ok"],
            json!({"verdict": "no_gpu", "status": "exit status 255",
                   "message": "Failed to initialize NVML: No supported GPUs were found"})
        );
        let e = snapshot_evidence(&driver_refused_no_gpu());
        let v = json_of(&[], &e, &plain());
        assert_eq!(
            v["evidence"]["kernel_log"]["value"]["Ok"]["no_gpu"][0],
            "[    3.499020] NVRM: No NVIDIA GPU found."
        );
        assert_eq!(
            v["evidence"]["smi_outcome"]["value"]["Ok"]["verdict"],
            "no_driver"
        );
    }

    /// A report of `findings` with observations `o` read from a snapshot's file.
    fn from_snapshot<'a>(
        findings: &'a [Finding],
        e: &'a Evidence,
        o: &'a Observations,
        src: &'a ObservationsSource,
    ) -> Report<'a> {
        Report {
            findings,
            evidence: e,
            observations: o,
            source: src,
            snapshot_problems: &[],
        }
    }

    fn saved(o: &Observations) -> Option<anyhow::Result<crate::doctor::bundle::SavedObservations>> {
        Some(Ok(crate::doctor::bundle::SavedObservations {
            observations: o.clone(),
            format: 1,
            ignored_fields: Vec::new(),
        }))
    }

    #[test]
    fn the_report_says_which_observations_it_judged() {
        let e = motivating_host();
        let (o, src) = ObservationsSource::choose(None, saved(&register_gpu_no_memory()));
        let findings = crate::doctor::observed::judge(&e, &o);
        let r = from_snapshot(&findings, &e, &o, &src);
        let text = render_text(&r, false);
        assert!(
            text.starts_with(
                "uvmwatch doctor: 1 critical (worst first)\n  judged with the probes' \
                 observations of pid 4242 (cuInit returned 3 (CUDA_ERROR_NOT_INITIALIZED) after \
                 0.41 s, failed call UVM_REGISTER_GPU on /dev/nvidia-uvm -> NV_ERR_NO_MEMORY, 4 \
                 device opens), from the snapshot's observations.json (format 1)\n\nCRITICAL \
                 hmm_setup_failure"
            ),
            "{text}"
        );
        let v = render_json(&r);
        assert_eq!(v["observations_source"]["from"], "snapshot");
        assert_eq!(
            v["observations_source"]["snapshot_file"],
            json!({"path": "observations.json", "format": 1, "used": true, "error": null,
                   "ignored_fields": []})
        );
        assert!(v["observations_source"]["summary"]
            .as_str()
            .unwrap()
            .starts_with("judged with the probes' observations of pid 4242"));
        assert_eq!((v["status"].as_str(), r.exit_code()), (Some("critical"), 2));

        // Without observations.
        let v = json_of(&[], &healthy_open_host(), &plain());
        assert_eq!(
            v["observations_source"],
            json!({"from": "none", "snapshot_file": null,
                   "summary": "only static facts were judged (no probe observations)"})
        );
    }

    #[test]
    fn unusable_observations_make_the_report_incomplete_not_healthy() {
        let e = healthy_open_host();
        let (o, src) = ObservationsSource::choose(
            None,
            Some(Err(anyhow::anyhow!("not valid JSON: EOF while parsing"))),
        );
        let findings = crate::doctor::observed::judge(&e, &o);
        assert!(findings.is_empty());
        let r = from_snapshot(&findings, &e, &o, &src);
        let text = render_text(&r, false);
        assert!(
            text.starts_with(
                "uvmwatch doctor: unknown: no known cause found in the static facts; the \
                 diagnosis is incomplete.\n  only static facts were judged: the snapshot's \
                 observations.json could not be used (not valid JSON: EOF while parsing)\n  \
                 driver: 590.48.01"
            ),
            "{text}"
        );
        assert!(!text.contains("healthy"), "{text}");
        assert_eq!((r.status(), r.exit_code()), ("unknown", EXIT_COULD_NOT_RUN));
        let v = render_json(&r);
        assert_eq!(v["status"], "unknown");
        assert_eq!(v["exit_code"], 3);
        assert_eq!(
            v["observations_source"]["snapshot_file"]["error"],
            "not valid JSON: EOF while parsing"
        );
        assert_eq!(v["observations_source"]["snapshot_file"]["used"], false);

        // A static warning: still unknown (3); a critical finding: critical (2).
        let e = motivating_host();
        let findings = crate::doctor::observed::judge(&e, &o);
        assert_eq!(findings[0].severity, Severity::Warning);
        let r = from_snapshot(&findings, &e, &o, &src);
        assert_eq!((r.status(), r.exit_code()), ("unknown", 3));
        assert!(render_text(&r, false).starts_with(
            "uvmwatch doctor: 1 warning (worst first); diagnosis incomplete\n  only static \
             facts were judged: the snapshot's observations.json could not be used (not valid \
             JSON: EOF while parsing)\n"
        ));
        let e = motivating_host().container("lxc", Some(&["c 195:* rwm"]));
        let findings = crate::doctor::observed::judge(&e, &o);
        let r = from_snapshot(&findings, &e, &o, &src);
        assert_eq!((r.status(), r.exit_code()), ("critical", 2));
    }

    #[test]
    fn an_observed_failure_no_rule_explains_is_not_healthy() {
        let e = healthy_open_host();
        let (o, src) =
            ObservationsSource::choose(None, saved(&watched().cuinit(999, 0.1).opens(4)));
        let findings = crate::doctor::observed::judge(&e, &o);
        let r = from_snapshot(&findings, &e, &o, &src);
        let text = render_text(&r, false);
        assert!(!text.contains("healthy"), "{text}");
        assert!(
            text.contains(
                "CRITICAL unexplained_failure: a failure was observed that no rule explains: \
                 cuInit returned 999 (CUDA_ERROR_UNKNOWN) (confidence: low)"
            ),
            "{text}"
        );
        assert_eq!((r.status(), r.exit_code()), ("critical", EXIT_CRITICAL));
    }
}

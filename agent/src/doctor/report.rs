//! Output of `uvmwatch doctor`: a short text report, a JSON document and the exit code, of
//! one [`Report`] (the findings, the facts, the observations judged and where those came
//! from).
//!
//! The JSON schema and the exit codes are documented in `docs/doctor.md`; change them only
//! together with [`SCHEMA_VERSION`] and that document.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::engine::Differential;
use super::facts::{Evidence, Fact, Observations};
use super::finding::{Finding, Severity, Stance, Standing};
use super::input::{clip, KERNEL_LOG_LIMIT};
use super::observed::ObservationsSource;
use super::signal::no_driver;

/// Version of the JSON document [`render_json`] returns. Bumped on any change that is not a
/// pure addition of a field (2: the differential: `symptom`, each finding's `standing`,
/// `ruled_out`, evidence `stance`; findings leading first).
pub const SCHEMA_VERSION: u32 = 2;

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
    /// The engine's differential: the symptom, the findings (leading first), the causes
    /// ruled out.
    pub differential: &'a Differential,
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
    /// The findings, leading first, then those of the other failures the host recorded.
    pub fn findings(&self) -> Vec<&Finding> {
        self.differential.all_findings().collect()
    }

    /// The diagnosis is incomplete: the snapshot's `observations.json` could not be used
    /// ([`ObservationsSource::incomplete`]) or another of its files is malformed
    /// ([`Report::snapshot_problems`]).
    pub fn incomplete(&self) -> bool {
        self.source.incomplete() || !self.snapshot_problems.is_empty()
    }

    /// The process exit code: [`EXIT_CRITICAL`] when the symptom or a hazard is critical;
    /// otherwise [`EXIT_COULD_NOT_RUN`] (UNKNOWN) when the diagnosis is incomplete
    /// ([`Report::incomplete`]); otherwise [`exit_code`] of the worst severity.
    pub fn exit_code(&self) -> u8 {
        match exit_code(self.differential.severity()) {
            EXIT_CRITICAL => EXIT_CRITICAL,
            _ if self.incomplete() => EXIT_COULD_NOT_RUN,
            code => code,
        }
    }

    /// The `status` of the JSON document: `critical` when the symptom or a hazard is;
    /// otherwise `unknown` when the diagnosis is incomplete ([`Report::incomplete`]);
    /// otherwise the worst severity (`info`, `warning`), `no_driver` (nothing at all and no
    /// NVIDIA driver) or `healthy`.
    pub fn status(&self) -> &'static str {
        match self.differential.severity() {
            Some(Severity::Critical) => Severity::Critical.as_str(),
            _ if self.incomplete() => "unknown",
            Some(s) => s.as_str(),
            None if no_driver(self.evidence).is_some() => "no_driver",
            None => "healthy",
        }
    }

    /// The report's line about the observations judged.
    pub fn observations_line(&self) -> String {
        self.source.summary(self.observations)
    }
}

/// The exit code for this worst severity: [`EXIT_HEALTHY`] (none, or info only),
/// [`EXIT_WARNING`], or [`EXIT_CRITICAL`]. The same levels as the Nagios plugin convention
/// (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).
pub fn exit_code(worst: Option<Severity>) -> u8 {
    match worst {
        None | Some(Severity::Info) => EXIT_HEALTHY,
        Some(Severity::Warning) => EXIT_WARNING,
        Some(Severity::Critical) => EXIT_CRITICAL,
    }
}

/// The JSON document of one diagnosis (schema in `docs/doctor.md`, version
/// [`SCHEMA_VERSION`]): the symptom, the findings (the leading cause first, then those
/// still possible; without a symptom, the hazards), the causes ruled out, the facts, the
/// observations and where they came from.
pub fn render_json(r: &Report) -> Value {
    let d = r.differential;
    let count = |s: Severity| d.all_findings().filter(|f| f.severity == s).count();
    let mut source = to_value(r.source);
    if let Value::Object(m) = &mut source {
        m.insert("summary".into(), Value::String(r.observations_line()));
    }
    json!({
        "schema_version": SCHEMA_VERSION,
        "status": r.status(),
        "exit_code": r.exit_code(),
        "symptom": to_value(&d.symptom),
        "counts": {
            "critical": count(Severity::Critical),
            "warning": count(Severity::Warning),
            "info": count(Severity::Info),
        },
        "findings": to_value(&d.findings),
        "ruled_out": to_value(&d.ruled_out),
        "also": to_value(&d.also),
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

/// The text report: the symptom first (what failed or hung, where, and inside what), the
/// line saying which observations were judged, the differential (the leading cause; the
/// others still possible, each with what tells it apart; the causes ruled out and by what),
/// then one block per finding (severity, title, confidence; evidence with sources and its
/// stance; what could not be checked; fix steps tagged `[host]`/`[container]`/`[any]`;
/// runbook). Without a symptom: the hazards, or "healthy" with the driver seen and what
/// could not be checked. `color` adds ANSI colors (for a terminal).
pub fn render_text(r: &Report, color: bool) -> String {
    let p = Paint { color };
    let mut out = String::new();
    let d = r.differential;
    let incomplete = if r.status() == "unknown" {
        format!("; {}", p.bold("diagnosis incomplete"))
    } else {
        String::new()
    };
    match &d.symptom {
        Some(sym) => {
            let _ = writeln!(
                out,
                "uvmwatch doctor: {}: {}{incomplete}",
                p.severity(sym.severity),
                shown(&sym.what)
            );
            if let Some(inside) = &sym.inside {
                let _ = writeln!(out, "  inside it: {}", shown(inside));
            }
            let _ = writeln!(out, "  {}", p.dim(&format!("[{}]", sym.source.label)));
        }
        None if d.findings.is_empty() => {
            render_healthy(&mut out, r, &p);
            return out;
        }
        None => {
            let _ = writeln!(
                out,
                "uvmwatch doctor: no failure recorded; {} hazard(s), worst {}{incomplete}",
                d.findings.len(),
                p.severity(d.findings[0].severity)
            );
        }
    }
    let _ = writeln!(out, "  {}", r.observations_line());
    render_snapshot_problems(&mut out, r);
    render_differential(&mut out, d);
    for also in &d.also {
        if let Some(sym) = &also.symptom {
            let _ = writeln!(
                out,
                "\nuvmwatch doctor: also recorded, {}: {}",
                p.severity(sym.severity),
                shown(&sym.what)
            );
        }
        render_differential(&mut out, also);
    }
    for f in d.all_findings() {
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

/// The differential in a few lines: the leading cause, the others still possible with the
/// command that tells each apart, and the causes ruled out with what ruled each out.
fn render_differential(out: &mut String, d: &Differential) {
    let Some(first) = d.leading() else {
        return;
    };
    if d.symptom.is_some() {
        let _ = writeln!(
            out,
            "  leading cause: {} ({} confidence)",
            first.rule,
            first.confidence.as_str()
        );
        let others: Vec<&Finding> = d
            .findings
            .iter()
            .filter(|f| f.standing == Standing::Possible)
            .collect();
        if !others.is_empty() {
            let _ = writeln!(out, "  also possible, and what tells each apart:");
            for f in others {
                let how = f.tell_apart.as_deref().map(shown).unwrap_or_default();
                let _ = writeln!(out, "    - {} ({}): {how}", f.rule, f.confidence.as_str());
            }
        }
    }
    if !d.ruled_out.is_empty() {
        let _ = writeln!(out, "  ruled out:");
        for o in &d.ruled_out {
            let src = if o.source.is_empty() {
                String::new()
            } else {
                format!(" [{}]", o.source)
            };
            let _ = writeln!(out, "    - {}: {}{src}", o.rule, shown(&o.why));
        }
    }
}

fn render_finding(out: &mut String, f: &Finding, p: &Paint) {
    let _ = writeln!(
        out,
        "{} {}: {} (confidence: {})",
        p.severity(f.severity),
        p.bold(f.rule.as_str()),
        f.title,
        f.confidence.as_str()
    );
    // Where it stands, and what it rests on: observed (the probes) or static (the host's
    // state alone).
    let _ = writeln!(
        out,
        "  {}; basis: {} ({})",
        f.standing.as_str(),
        f.basis.as_str(),
        f.basis.meaning()
    );
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
            let stance = match i.stance {
                Stance::For => "",
                Stance::Needs => "(needs) ",
                Stance::Against => "(against) ",
            };
            let _ = writeln!(
                out,
                "    {:<width$}  {stance}{}  {}",
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
    use super::super::engine::diagnose;
    use super::super::facts::{Fact, Observations};
    use super::super::fixtures::*;
    use super::*;

    /// The report of a diagnosis of `e` with `o` (from `--probe` unless `o` is empty).
    fn with<T>(e: &Evidence, o: &Observations, f: impl FnOnce(&Report) -> T) -> T {
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
            snapshot_problems: &[],
        })
    }

    fn text_of(e: &Evidence, o: &Observations, color: bool) -> String {
        with(e, o, |r| render_text(r, color))
    }

    fn json_of(e: &Evidence, o: &Observations) -> Value {
        with(e, o, render_json)
    }

    /// A GPU fallen off the bus (Xid 79 in the kernel log) and a `cuInit` that returned 3
    /// after good opens: the Xid is the sure cause; HMM set-up, which needs the GPU, is
    /// weighed against it.
    fn xid79_host() -> Evidence {
        healthy_open_host().log(|l| {
            l.xids = vec![79];
            l.nvidia_lines =
                vec!["NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.".into()];
        })
    }

    #[test]
    fn the_symptom_comes_first_then_the_differential() {
        let e = xid79_host();
        let o = watched().cuinit(3, 0.2).opens(3);
        let text = text_of(&e, &o, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "uvmwatch doctor: CRITICAL: cuInit returned 3 (CUDA_ERROR_NOT_INITIALIZED) after 0.20 s",
            "{text}"
        );
        assert!(
            text.contains("  leading cause: adapter_init_failure (high confidence)\n"),
            "{text}"
        );
        assert!(text.contains("  ruled out:\n"), "{text}");
        // Each cause ruled out says by what.
        assert!(
            text.contains("    - fork_after_init: needs forked_after_init: "),
            "{text}"
        );
        assert!(
            text.contains("    - slow_init: cannot produce it: cuInit returned 3"),
            "{text}"
        );
        assert!(
            text.contains("    - hmm_setup_failure: too little speaks for it: ")
                && text.contains("against it: gpu_fell_off_bus"),
            "{text}"
        );
        let json = json_of(&e, &o);
        assert_eq!(json["symptom"]["kind"], "cuinit_failed");
        assert_eq!(json["symptom"]["code"], 3);
        assert_eq!(json["findings"][0]["standing"], "leading");
        assert!(json["ruled_out"].as_array().is_some_and(|r| !r.is_empty()));
    }

    #[test]
    fn text_of_the_motivating_case() {
        let e = motivating_host();
        let text = text_of(&e, &register_gpu_no_memory(), false);
        assert!(!text.contains('\x1b'), "{text}");
        assert!(
            text.starts_with(
                "uvmwatch doctor: CRITICAL: cuInit returned 3 (CUDA_ERROR_NOT_INITIALIZED) after \
                 0.41 s\n  inside it: UVM_REGISTER_GPU on /dev/nvidia-uvm -> NV_ERR_NO_MEMORY"
            ),
            "{text}"
        );
        for needle in [
            "leading cause: hmm_setup_failure",
            "CRITICAL hmm_setup_failure: nvidia_uvm HMM set-up fails or hangs on this kernel",
            "  leading; basis: observed",
            "register_gpu_no_memory",
            "[probe:ioctl]",
            "(needs) uvm_disable_hmm=N (HMM allowed)",
            "[/sys/module/nvidia_uvm/parameters]",
            "1. [host] Disable HMM in nvidia_uvm",
            "$ echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee /etc/modprobe.d/uvmwatch-disable-hmm.conf",
            "$ sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
            "[any] Verify",
            "runbook: docs/runbooks/hmm_setup_failure.md",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        let colored = text_of(&e, &register_gpu_no_memory(), true);
        assert!(colored.contains("\x1b[1;31mCRITICAL\x1b[0m"), "{colored}");
    }

    #[test]
    fn hazards_without_a_symptom() {
        let e = motivating_host();
        let text = text_of(&e, &plain(), false);
        assert!(
            text.starts_with("uvmwatch doctor: no failure recorded; 1 hazard(s), worst WARNING\n"),
            "{text}"
        );
        assert!(text.contains("WARNING hmm_setup_failure"), "{text}");
        assert!(text.contains("  hazard; basis: static"), "{text}");
    }

    #[test]
    fn text_when_healthy_or_no_driver() {
        let e = healthy_open_host().with(|e| {
            e.kernel_log = Fact::unavailable("Operation not permitted (os error 1)", "/dev/kmsg")
        });
        let text = text_of(&e, &plain(), false);
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

        let text = text_of(&no_driver_host(), &plain(), false);
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
        let v = json_of(&e, &o);
        assert_eq!(v["schema_version"], 2);
        assert_eq!(v["status"], "critical");
        assert_eq!(v["exit_code"], 2);
        assert_eq!(v["symptom"]["kind"], "cuinit_failed");
        assert_eq!(v["symptom"]["severity"], "critical");
        assert_eq!(v["symptom"]["source"]["label"], "probe:cuInit");
        let f = &v["findings"][0];
        assert_eq!(f["rule"], "hmm_setup_failure");
        assert_eq!(f["standing"], "leading");
        assert_eq!(f["severity"], "critical");
        assert_eq!(f["confidence"], "high");
        assert_eq!(f["runbook"], "docs/runbooks/hmm_setup_failure.md");
        assert_eq!(f["fix"][0]["where"], "host");
        assert!(f["fix"][0]["commands"][0]
            .as_str()
            .unwrap()
            .contains("uvm_disable_hmm=1"));
        assert_eq!(f["evidence"][0]["what"], "symptom");
        assert!(f["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["signal"] == "register_gpu_no_memory" && i["stance"] == "for"));
        assert_eq!(
            v["evidence"]["driver"]["value"]["Ok"]["version"],
            "590.48.01"
        );
        assert_eq!(
            v["evidence"]["iomem_hmm"]["value"]["Err"]["why"],
            "addresses hidden: needs root"
        );
        assert_eq!(v["observations"]["cuinit_result"], 3);
        // The document reads back into the same types.
        let d = diagnose(&e, &o);
        let back: Vec<Finding> = serde_json::from_value(v["findings"].clone()).unwrap();
        assert_eq!(back, d.findings);
        let back: Evidence = serde_json::from_value(v["evidence"].clone()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn json_status_without_findings() {
        let o = Observations::default();
        let v = json_of(&no_driver_host(), &o);
        assert_eq!(
            (v["status"].as_str(), v["exit_code"].as_u64()),
            (Some("no_driver"), Some(0))
        );
        let v = json_of(&healthy_open_host(), &o);
        assert_eq!(v["status"], "healthy");
        assert_eq!(v["symptom"], Value::Null);
        assert_eq!(v["findings"], json!([]));
        assert_eq!(v["observations"]["pid"], Value::Null);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(None), EXIT_HEALTHY);
        assert_eq!(exit_code(Some(Severity::Info)), EXIT_HEALTHY);
        assert_eq!(exit_code(Some(Severity::Warning)), EXIT_WARNING);
        assert_eq!(exit_code(Some(Severity::Critical)), EXIT_CRITICAL);
        assert_ne!(EXIT_COULD_NOT_RUN, EXIT_CRITICAL);
        // A slow start is an info: healthy exit, status info.
        let o = watched().cuinit(0, 12.0).opens(4);
        let e = healthy_open_host().smi(|s| s.persistence_mode = vec!["Disabled".into()]);
        with(&e, &o, |r| {
            assert_eq!((r.status(), r.exit_code()), ("info", EXIT_HEALTHY));
        });
    }

    #[test]
    fn a_driver_that_sees_no_gpu_is_never_healthy_nor_nothing_to_diagnose() {
        use uvmwatch_testbed::snapshot::{driver_refused_no_gpu, gpuless_535, gpuless_550};
        for (what, spec) in [
            ("550 loaded without a GPU", gpuless_550()),
            ("535 loaded without a GPU", gpuless_535()),
            ("driver refused to load", driver_refused_no_gpu()),
        ] {
            let e = snapshot_evidence(&spec);
            let text = text_of(&e, &plain(), false);
            assert!(
                text.starts_with("uvmwatch doctor: CRITICAL: "),
                "{what}: {text}"
            );
            assert!(text.contains("leading cause: no_gpu"), "{what}: {text}");
            assert!(!text.contains("healthy"), "{what}: {text}");
            assert!(!text.contains("nothing to diagnose"), "{what}: {text}");
            let v = json_of(&e, &plain());
            assert_eq!(
                (v["status"].as_str(), v["exit_code"].as_u64()),
                (Some("critical"), Some(u64::from(EXIT_CRITICAL))),
                "{what}"
            );
        }
        let e = snapshot_evidence(&gpuless_550());
        let v = json_of(&e, &plain());
        assert_eq!(v["evidence"]["gpus"]["value"]["Ok"], json!([]));
        assert_eq!(
            v["evidence"]["smi_outcome"]["value"]["Ok"],
            json!({"verdict": "no_gpu", "status": "exit status 255",
                   "message": "Failed to initialize NVML: No supported GPUs were found"})
        );
    }

    fn saved(o: &Observations) -> Option<anyhow::Result<crate::doctor::bundle::SavedObservations>> {
        Some(Ok(crate::doctor::bundle::SavedObservations {
            observations: o.clone(),
            format: 1,
            ignored_fields: Vec::new(),
        }))
    }

    /// The report of `e` with the observations and source of a snapshot's file.
    fn from_snapshot<T>(
        e: &Evidence,
        (o, src): (Observations, ObservationsSource),
        f: impl FnOnce(&Report) -> T,
    ) -> T {
        let d = diagnose(e, &o);
        f(&Report {
            differential: &d,
            evidence: e,
            observations: &o,
            source: &src,
            snapshot_problems: &[],
        })
    }

    #[test]
    fn the_report_says_which_observations_it_judged() {
        let e = motivating_host();
        let chosen = ObservationsSource::choose(None, saved(&register_gpu_no_memory()));
        from_snapshot(&e, chosen, |r| {
            let text = render_text(r, false);
            assert!(
                text.contains(
                    "  judged with the probes' observations of pid 4242 (cuInit returned 3 \
                     (CUDA_ERROR_NOT_INITIALIZED) after 0.41 s, failed call UVM_REGISTER_GPU on \
                     /dev/nvidia-uvm -> NV_ERR_NO_MEMORY, 4 device opens), from the snapshot's \
                     observations.json (format 1)\n"
                ),
                "{text}"
            );
            let v = render_json(r);
            assert_eq!(v["observations_source"]["from"], "snapshot");
            assert_eq!(
                v["observations_source"]["snapshot_file"],
                json!({"path": "observations.json", "format": 1, "used": true, "error": null,
                       "ignored_fields": []})
            );
            assert_eq!((v["status"].as_str(), r.exit_code()), (Some("critical"), 2));
        });
        let v = json_of(&healthy_open_host(), &plain());
        assert_eq!(
            v["observations_source"],
            json!({"from": "none", "snapshot_file": null,
                   "summary": "only static facts were judged (no probe observations)"})
        );
    }

    #[test]
    fn unusable_observations_make_the_report_incomplete_not_healthy() {
        let bad = || {
            ObservationsSource::choose(
                None,
                Some(Err(anyhow::anyhow!("not valid JSON: EOF while parsing"))),
            )
        };
        from_snapshot(&healthy_open_host(), bad(), |r| {
            let text = render_text(r, false);
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
            let v = render_json(r);
            assert_eq!(v["status"], "unknown");
            assert_eq!(v["exit_code"], 3);
            assert_eq!(v["observations_source"]["snapshot_file"]["used"], false);
        });
        // A hazard (a warning): still unknown (3); a critical host symptom: critical (2).
        from_snapshot(&motivating_host(), bad(), |r| {
            assert_eq!((r.status(), r.exit_code()), ("unknown", 3));
            assert!(render_text(r, false).contains("; diagnosis incomplete\n"));
        });
        let e = motivating_host().container("lxc", Some(&["c 195:* rwm"]));
        from_snapshot(&e, bad(), |r| {
            assert_eq!((r.status(), r.exit_code()), ("critical", 2));
        });
    }

    #[test]
    fn a_failure_no_cause_explains_is_not_healthy() {
        let chosen = ObservationsSource::choose(None, saved(&watched().cuinit(999, 0.1).opens(4)));
        from_snapshot(&healthy_open_host(), chosen, |r| {
            let text = render_text(r, false);
            assert!(!text.contains("healthy"), "{text}");
            assert!(
                text.contains(
                    "CRITICAL unexplained_failure: no known cause explains it: cuInit returned \
                     999 (CUDA_ERROR_UNKNOWN) after 0.10 s (confidence: low)"
                ),
                "{text}"
            );
            assert_eq!((r.status(), r.exit_code()), ("critical", EXIT_CRITICAL));
        });
    }
}

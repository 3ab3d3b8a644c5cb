//! The text format, for people: one line per record (`HH:MM:SS.mmm LEVEL message k=v ...`,
//! UTC) with the fields the schema marks for text, in its order, empty ones left out,
//! durations written as durations; what the text log already showed ([`Seen`]): each
//! finding in full once per process and rule, and failures that repeat summed up.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tracing::{field::Field, Level, Subscriber};
use tracing_subscriber::{
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    registry::LookupSpan,
};

use super::{schema, DiagnosisFields, TARGET};
use crate::doctor::finding::Finding;

/// The line formatter of the text format.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compact;

/// A record's fields as text, in the order they were given.
#[derive(Default)]
struct Fields(Vec<(&'static str, String)>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push((field.name(), format!("{value:?}")));
    }
}

impl Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl<S, N> FormatEvent<S, N> for Compact
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let color = w.has_ansi_escapes();
        write!(w, "{} ", clock(SystemTime::now()))?;
        write_level(&mut w, *meta.level(), color)?;
        let message = fields.get("message").unwrap_or("").to_string();
        let schema = match (meta.target() == TARGET, fields.get("event")) {
            (true, Some(e)) => schema::find(e, &message),
            _ => None,
        };
        match schema {
            Some(r) => {
                write!(w, " {message}")?;
                for f in r.fields.iter().filter(|f| f.text) {
                    if let Some(v) = fields.get(f.name) {
                        write_field(&mut w, f.name, v)?;
                    }
                }
            }
            None => {
                write!(w, " {}: {message}", meta.target())?;
                for (name, v) in &fields.0 {
                    if *name != "message" {
                        write_field(&mut w, name, v)?;
                    }
                }
            }
        }
        writeln!(w)
    }
}

fn write_level(w: &mut Writer<'_>, level: Level, color: bool) -> fmt::Result {
    let (name, code) = match level {
        Level::ERROR => ("ERROR", "31"),
        Level::WARN => (" WARN", "33"),
        Level::INFO => (" INFO", "32"),
        Level::DEBUG => ("DEBUG", "34"),
        Level::TRACE => ("TRACE", "35"),
    };
    if color {
        write!(w, "\x1b[{code}m{name}\x1b[0m")
    } else {
        w.write_str(name)
    }
}

/// ` name=value`, nothing for an empty value; `*_seconds` as a duration under the name
/// without the suffix; values with spaces quoted.
fn write_field(w: &mut Writer<'_>, name: &str, value: &str) -> fmt::Result {
    if value.is_empty() {
        return Ok(());
    }
    if let Some(base) = name.strip_suffix("_seconds") {
        if let Ok(s) = value.parse::<f64>() {
            return write!(w, " {base}={}", duration(s));
        }
    }
    if value.contains(char::is_whitespace) {
        write!(w, " {name}={value:?}")
    } else {
        write!(w, " {name}={value}")
    }
}

/// A duration for people: `87µs`, `4.5ms`, `2.51s`, `3m05s`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return format!("{seconds}s");
    }
    if seconds < 1e-3 {
        format!("{:.0}µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.1}ms", seconds * 1e3)
    } else if seconds < 60.0 {
        format!("{seconds:.2}s")
    } else {
        let s = seconds.round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// `HH:MM:SS.mmm` (UTC) of a time.
fn clock(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_millis()
    )
}

/// Processes and rules kept at most before the memory of what was shown starts over.
const MAX_SEEN: usize = 4096;
/// How long a repeated failure is summed up before the sum is printed (`--log-repeat-window`
/// sets it for a run).
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// A failure as the log sums it up: the process, the call (with its node) and the result.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailureKey {
    pub pid: u32,
    /// `UVM_REGISTER_GPU on /dev/nvidia-uvm`, `open /dev/nvidia-uvm`, a kernel function.
    pub call: String,
    /// The result label (`NV_ERR_NO_MEMORY`, `EPERM`, ...).
    pub result: String,
}

impl std::fmt::Display for FailureKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid={} {} -> {}", self.pid, self.call, self.result)
    }
}

/// A failure that came again, summed up: (key, times, seconds the sum spans).
pub type Repeated = (FailureKey, u64, f64);

/// What the log showed already.
pub struct Seen {
    /// (pid, rule) whose finding was printed in full.
    findings: HashSet<(u32, String)>,
    /// (rule, title) of findings from the host's state, printed at start (or when the facts
    /// changed): the same finding about a process is not printed again.
    host_findings: HashSet<(String, String)>,
    /// Failures printed once, and how often they came again since.
    repeats: HashMap<FailureKey, Repeat>,
    /// Failures that came again while [`MAX_SEEN`] others were being summed up: counted
    /// here, printed as one sum.
    overflow: Repeat,
    /// How long a failure is summed up before its sum is printed.
    window: Duration,
}

impl Default for Seen {
    fn default() -> Self {
        Seen::with_window(REPEAT_WINDOW)
    }
}

#[derive(Debug, Default)]
struct Repeat {
    /// Times it came again since it was last printed or summed up.
    again: u64,
    /// When the sum started (monotonic ns).
    since_ns: u64,
}

impl Seen {
    /// Sums of repeated failures printed every `window`.
    pub fn with_window(window: Duration) -> Seen {
        Seen {
            findings: HashSet::new(),
            host_findings: HashSet::new(),
            repeats: HashMap::new(),
            overflow: Repeat::default(),
            window,
        }
    }

    /// The diagnosis fields a failure or stall line shows: the rules and runbook; the title
    /// and fix are the finding's own line's (printed once per process and rule).
    pub fn summary(&self, f: DiagnosisFields) -> DiagnosisFields {
        DiagnosisFields {
            title: String::new(),
            fix: String::new(),
            ..f
        }
    }

    /// Whether `f` is shown for `pid` for the first time (then it is printed in full); a
    /// finding the host's state already gave is not.
    pub fn first_time(&mut self, pid: u32, f: &Finding) -> bool {
        if self
            .host_findings
            .contains(&(f.rule.as_str().to_string(), f.title.clone()))
        {
            return false;
        }
        if self.findings.len() >= MAX_SEEN {
            self.findings.clear();
        }
        self.findings.insert((pid, f.rule.as_str().to_string()))
    }

    /// A finding from the host's state was printed.
    pub fn host_finding(&mut self, f: &Finding) {
        if self.host_findings.len() >= MAX_SEEN {
            self.host_findings.clear();
        }
        self.host_findings
            .insert((f.rule.as_str().to_string(), f.title.clone()));
    }

    /// Whether the failure `key` is to be printed now: the first time, yes; again before its
    /// sum was printed, no (it is counted). At most [`MAX_SEEN`] failures are summed one by
    /// one; a new one beyond them is printed, and its repeats are summed with the others'.
    pub fn print_failure(&mut self, key: FailureKey, now_ns: u64) -> bool {
        if let Some(r) = self.repeats.get_mut(&key) {
            r.again += 1;
            return false;
        }
        if self.repeats.len() >= MAX_SEEN {
            if self.overflow.again == 0 {
                self.overflow.since_ns = now_ns;
            }
            self.overflow.again += 1;
            // The first of a new failure is still worth a line; its repeats are not.
            return self.overflow.again == 1;
        }
        self.repeats.insert(
            key,
            Repeat {
                again: 0,
                since_ns: now_ns,
            },
        );
        true
    }

    /// The failures that came again and whose window is over (or all of them, with `all`):
    /// their counts start over. Failures that did not come again in a whole window are
    /// forgotten (their next occurrence is printed again). The overflow's sum comes last,
    /// with pid 0 and call `other failures`.
    pub fn repeated(&mut self, now_ns: u64, all: bool) -> Vec<Repeated> {
        let window = self.window.as_nanos() as u64;
        let mut out = Vec::new();
        self.repeats.retain(|k, r| {
            let age = now_ns.saturating_sub(r.since_ns);
            if r.again > 0 && (all || age >= window) {
                out.push((k.clone(), r.again, age as f64 / 1e9));
                r.again = 0;
                r.since_ns = now_ns;
                return true;
            }
            r.again > 0 || age < window
        });
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let age = now_ns.saturating_sub(self.overflow.since_ns);
        if self.overflow.again > 0 && (all || age >= window) {
            out.push((
                FailureKey {
                    pid: 0,
                    call: "other failures".into(),
                    result: "various".into(),
                },
                self.overflow.again,
                age as f64 / 1e9,
            ));
            self.overflow = Repeat::default();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_durations() {
        assert_eq!(duration(0.000_086_913), "87µs");
        assert_eq!(duration(0.0045), "4.5ms");
        assert_eq!(duration(4.508_298), "4.51s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(
            clock(UNIX_EPOCH + Duration::from_millis(30_611_679)),
            "08:30:11.679"
        );
    }

    fn key(call: &str) -> FailureKey {
        FailureKey {
            pid: 7,
            call: call.into(),
            result: "EBADF".into(),
        }
    }

    #[test]
    fn a_repeated_failure_is_printed_once_then_summed_up() {
        let mut s = Seen::default();
        let s1 = 1_000_000_000;
        assert!(s.print_failure(key("a"), s1));
        assert!(!s.print_failure(key("a"), s1 + 1));
        assert!(!s.print_failure(key("a"), s1 + 2));
        assert!(s.print_failure(key("b"), s1 + 3));
        assert!(s.repeated(s1 + 5, false).is_empty(), "window not over");
        let r = s.repeated(s1 + 11_000_000_000, false);
        assert_eq!((r.len(), r[0].0.call.as_str(), r[0].1), (1, "a", 2));
        // "a" keeps being summed while it comes again ...
        assert!(!s.print_failure(key("a"), s1 + 12_000_000_000));
        assert_eq!(s.repeated(s1 + 12_000_000_001, true)[0].1, 1);
        // ... and a failure quiet for a whole window is printed again when it comes back.
        assert!(s.repeated(s1 + 40_000_000_000, false).is_empty());
        assert!(s.print_failure(key("a"), s1 + 41_000_000_000));
    }

    /// However many distinct failures come, the memory of them is bounded: beyond
    /// `MAX_SEEN` the first of each is printed, and their repeats are one sum.
    #[test]
    fn distinct_failures_beyond_the_bound_are_summed_together() {
        let mut s = Seen::default();
        for i in 0..MAX_SEEN {
            assert!(s.print_failure(key(&format!("c{i}")), 1));
        }
        assert!(s.print_failure(key("new"), 2));
        assert!(!s.print_failure(key("newer"), 3));
        assert!(!s.print_failure(key("new"), 4));
        let r = s.repeated(20_000_000_000, true);
        let other = r.last().unwrap();
        assert_eq!((other.0.call.as_str(), other.1), ("other failures", 3));
        assert!(s.repeats.len() <= MAX_SEEN);
    }
}

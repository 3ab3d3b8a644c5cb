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
/// How long a repeated failure is summed up before the sum is printed.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// What the text log showed already.
#[derive(Default)]
pub struct Seen {
    /// (pid, rule) whose finding was printed in full.
    findings: HashSet<(u32, String)>,
    /// (rule, title) of findings from the host's state, printed at start (or when the facts
    /// changed): the same finding about a process is not printed again.
    host_findings: HashSet<(String, String)>,
    /// Failures printed once, and how often they came again since.
    repeats: HashMap<String, Repeat>,
}

#[derive(Debug)]
struct Repeat {
    /// Times it came again since it was last printed or summed up.
    again: u64,
    /// When the sum started (monotonic ns).
    since_ns: u64,
}

impl Seen {
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
            .contains(&(f.rule.clone(), f.title.clone()))
        {
            return false;
        }
        if self.findings.len() >= MAX_SEEN {
            self.findings.clear();
        }
        self.findings.insert((pid, f.rule.clone()))
    }

    /// A finding from the host's state was printed.
    pub fn host_finding(&mut self, f: &Finding) {
        if self.host_findings.len() >= MAX_SEEN {
            self.host_findings.clear();
        }
        self.host_findings.insert((f.rule.clone(), f.title.clone()));
    }

    /// Whether the failure `key` (process, call, result) is to be printed now: the first
    /// time, yes; again within the window, no (it is counted).
    pub fn print_failure(&mut self, key: String, now_ns: u64) -> bool {
        if self.repeats.len() >= MAX_SEEN && !self.repeats.contains_key(&key) {
            self.repeats.clear();
        }
        match self.repeats.get_mut(&key) {
            None => {
                self.repeats.insert(
                    key,
                    Repeat {
                        again: 0,
                        since_ns: now_ns,
                    },
                );
                true
            }
            Some(r) => {
                r.again += 1;
                false
            }
        }
    }

    /// The failures that came again and whose window is over (or all of them, with
    /// `all`): (key, times, seconds summed over); their counts start over.
    pub fn repeated(&mut self, now_ns: u64, all: bool) -> Vec<(String, u64, f64)> {
        let window = REPEAT_WINDOW.as_nanos() as u64;
        let mut out = Vec::new();
        for (k, r) in self.repeats.iter_mut() {
            let age = now_ns.saturating_sub(r.since_ns);
            if r.again > 0 && (all || age >= window) {
                out.push((k.clone(), r.again, age as f64 / 1e9));
                r.again = 0;
                r.since_ns = now_ns;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
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

    #[test]
    fn a_repeated_failure_is_printed_once_then_summed_up() {
        let mut s = Seen::default();
        let s1 = 1_000_000_000;
        assert!(s.print_failure("a".into(), s1));
        assert!(!s.print_failure("a".into(), s1 + 1));
        assert!(!s.print_failure("a".into(), s1 + 2));
        assert!(s.print_failure("b".into(), s1 + 3));
        assert!(s.repeated(s1 + 5, false).is_empty(), "window not over");
        let r = s.repeated(s1 + 11_000_000_000, false);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0.as_str(), r[0].1), ("a", 2));
        assert!(
            s.repeated(s1 + 30_000_000_000, true).is_empty(),
            "nothing new"
        );
        assert!(!s.print_failure("a".into(), s1 + 31_000_000_000));
        assert_eq!(s.repeated(s1 + 31_000_000_001, true)[0].1, 1);
    }
}

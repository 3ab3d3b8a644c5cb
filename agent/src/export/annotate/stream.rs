//! The profiler's trace read as a stream, twice, so that a trace of any size is annotated
//! in memory bounded by the capture, never by the trace (a Kineto trace of a long run is
//! gigabytes):
//!
//! 1. [`survey`]: one pass through serde_json's streaming deserializer checks that the trace
//!    is JSON and reads what placing the events needs: `baseTimeNanoseconds`, whether it
//!    is already annotated, and of each trace event only its `ph`, `pid`, `ts` and `dur`
//!    (one event held at a time).
//! 2. [`splice`]: a second pass copies the bytes through unchanged and inserts the new
//!    events right after the last element of `traceEvents` and the `uvmwatch` member right
//!    after the last member of the top-level object (before the white space that closes
//!    them, held back in a bounded buffer), so every other byte stays as it was.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{self, BufRead, Write};

use anyhow::{bail, Context, Result};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::export::capture::chrome;

/// What the profiler's trace holds, as far as placing events goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// `[start, end)` of its events, ns on its own time base.
    pub window: Option<(i128, i128)>,
    /// Integer pids of its events.
    pub pids: BTreeSet<u32>,
    /// `baseTimeNanoseconds`, when it has one.
    pub base_ns: Option<u64>,
    /// A top-level object (`{"traceEvents": [...], ...}`) rather than a bare array.
    pub object: bool,
}

/// The few fields of a trace event read to place the uvmwatch events.
#[derive(Deserialize)]
struct Peek {
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    ts: Option<Value>,
    #[serde(default)]
    dur: Option<Value>,
}

/// Running bounds and pids of the events seen.
struct Acc {
    lo: i128,
    hi: i128,
    pids: BTreeSet<u32>,
}

impl Acc {
    fn add(&mut self, p: Peek) {
        if let Some(pid) = p.pid.as_ref().and_then(Value::as_u64) {
            self.pids.insert(pid as u32);
        }
        if p.ph.as_deref() == Some("M") {
            return;
        }
        if let Some(ts) = p.ts.as_ref().and_then(chrome::nanos) {
            let dur = p.dur.as_ref().and_then(chrome::nanos).unwrap_or(0);
            self.lo = self.lo.min(ts);
            self.hi = self.hi.max(ts + dur.max(0));
        }
    }
}

/// The trace's events, one at a time.
struct Events<'a>(&'a mut Acc);

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("traceEvents as an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(p) = seq.next_element::<Peek>()? {
            self.0.add(p);
        }
        Ok(())
    }
}

/// The top level: an object with `traceEvents`, or a bare array of events.
struct Top<'a> {
    acc: &'a mut Acc,
    base_ns: &'a mut Option<u64>,
}

impl<'de> Visitor<'de> for Top<'_> {
    /// Whether it was an object, and then whether it had `traceEvents`.
    type Value = (bool, bool);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object with traceEvents, or an array of trace events")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(bool, bool), A::Error> {
        let mut events = false;
        while let Some(key) = m.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => {
                    m.next_value_seed(Events(self.acc))?;
                    events = true;
                }
                "baseTimeNanoseconds" => {
                    let v: Value = m.next_value()?;
                    let raw = match &v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    *self.base_ns = Some(raw.parse().map_err(|_| {
                        de::Error::custom(format!("baseTimeNanoseconds {raw:?} is not a number"))
                    })?);
                }
                "uvmwatch" => {
                    return Err(de::Error::custom(
                        "the trace is already annotated by uvmwatch",
                    ))
                }
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((true, events))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(bool, bool), A::Error> {
        while let Some(p) = seq.next_element::<Peek>()? {
            self.acc.add(p);
        }
        Ok((false, true))
    }
}

/// Pass 1: checks the trace and reads what placing events needs (module documentation).
///
/// # Errors
/// Not JSON, neither an object with a `traceEvents` array nor an array, a
/// `baseTimeNanoseconds` that is not a number, or already annotated.
pub fn survey(r: impl io::Read) -> Result<Survey> {
    let mut acc = Acc {
        lo: i128::MAX,
        hi: i128::MIN,
        pids: BTreeSet::new(),
    };
    let mut base_ns = None;
    let mut de = serde_json::Deserializer::from_reader(r);
    let (object, events) = de::Deserializer::deserialize_any(
        &mut de,
        Top {
            acc: &mut acc,
            base_ns: &mut base_ns,
        },
    )
    .map_err(|e| anyhow::anyhow!("the profiler trace is not a trace: {e}"))?;
    de.end()
        .map_err(|e| anyhow::anyhow!("the profiler trace is not valid JSON: {e}"))?;
    if !events {
        bail!("the trace has no traceEvents array");
    }
    Ok(Survey {
        window: (acc.lo <= acc.hi).then_some((acc.lo, acc.hi)),
        pids: acc.pids,
        base_ns,
        object,
    })
}

/// Most white space held back before a closing bracket; past it the white space is written
/// and the insertion goes right before the bracket instead (still valid JSON).
const MAX_HELD_WS: usize = 1 << 20;

/// Where the copy is in the trace's structure.
struct Splicer<W: Write> {
    out: W,
    /// Nesting depth (1 inside the top-level value).
    depth: u32,
    /// The top-level value is an object.
    object: bool,
    in_string: bool,
    escaped: bool,
    /// Inside the top-level object, at depth 1: the next string is a key.
    key_next: bool,
    /// The key being read at depth 1 (`None` once longer than any key of interest).
    key: Option<Vec<u8>>,
    /// The last key read at depth 1.
    last_key: Vec<u8>,
    /// Depth of the events array's inside (2 in an object, 1 for a bare array).
    events_depth: Option<u32>,
    /// The events array has an element.
    had_element: bool,
    /// White space held back at the events array's or the object's own level.
    held: Vec<u8>,
    /// The events to insert (already joined), and the `uvmwatch` member.
    events: Option<String>,
    meta: Option<String>,
    done_events: bool,
    done_meta: bool,
}

impl<W: Write> Splicer<W> {
    fn flush_held(&mut self) -> io::Result<()> {
        if !self.held.is_empty() {
            self.out.write_all(&self.held)?;
            self.held.clear();
        }
        Ok(())
    }

    fn hold(&mut self, b: u8) -> io::Result<()> {
        if self.held.len() >= MAX_HELD_WS {
            self.flush_held()?;
        }
        self.held.push(b);
        Ok(())
    }

    fn byte(&mut self, b: u8) -> io::Result<()> {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(k) = self.key.take() {
                    self.last_key = k;
                }
            } else if let Some(k) = self.key.as_mut() {
                if k.len() < 32 {
                    k.push(b);
                } else {
                    self.key = None;
                }
            }
            return self.out.write_all(&[b]);
        }
        let at_events_level = self.events_depth == Some(self.depth);
        let at_object_level = self.object && self.depth == 1;
        match b {
            b' ' | b'\t' | b'\n' | b'\r' if at_events_level || at_object_level => self.hold(b),
            b']' if at_events_level => {
                if let Some(ev) = self.events.take() {
                    if self.had_element {
                        self.out.write_all(b",\n")?;
                        self.out.write_all(ev.as_bytes())?;
                        self.flush_held()?;
                    } else {
                        self.flush_held()?;
                        self.out.write_all(b"\n")?;
                        self.out.write_all(ev.as_bytes())?;
                        self.out.write_all(b"\n")?;
                    }
                }
                self.flush_held()?;
                self.done_events = true;
                self.events_depth = None;
                self.depth -= 1;
                self.out.write_all(&[b])
            }
            b'}' if at_object_level => {
                if let Some(m) = self.meta.take() {
                    self.out.write_all(b",\n  \"uvmwatch\": ")?;
                    self.out.write_all(m.as_bytes())?;
                }
                self.flush_held()?;
                self.done_meta = true;
                self.depth -= 1;
                self.out.write_all(&[b])
            }
            _ => {
                self.flush_held()?;
                if at_events_level && !matches!(b, b',' | b' ' | b'\t' | b'\n' | b'\r') {
                    self.had_element = true;
                }
                match b {
                    b'"' => {
                        self.in_string = true;
                        if at_object_level && self.key_next {
                            self.key = Some(Vec::new());
                            self.key_next = false;
                        }
                    }
                    b'{' | b'[' => {
                        if self.depth == 0 {
                            if b == b'[' {
                                self.events_depth = Some(1);
                            } else {
                                self.object = true;
                                self.key_next = true;
                            }
                        } else if b == b'['
                            && at_object_level
                            && !self.done_events
                            && self.last_key == b"traceEvents"
                        {
                            self.events_depth = Some(2);
                        }
                        self.depth += 1;
                    }
                    b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                    b',' if at_object_level => {
                        self.key_next = true;
                        self.last_key.clear();
                    }
                    _ => {}
                }
                self.out.write_all(&[b])
            }
        }
    }
}

/// Pass 2: copies the trace from `r` to `w`, inserting `events` (trace event lines, each
/// already indented, joined with `,\n`) at the end of `traceEvents` and, for a top-level
/// object, `meta` as its `uvmwatch` member. The trace must be the one [`survey`] read.
///
/// # Errors
/// Reading or writing fails, or the trace changed since [`survey`] (its `traceEvents` or its
/// end were not found where they were).
pub fn splice(
    mut r: impl BufRead,
    w: &mut impl Write,
    events: Option<String>,
    meta: Option<String>,
) -> Result<()> {
    let want_events = events.is_some();
    let want_meta = meta.is_some();
    let mut s = Splicer {
        // The copy goes byte by byte: buffered here whatever `w` is (a gzip encoder called
        // per byte is slow).
        out: io::BufWriter::with_capacity(1 << 16, w),
        depth: 0,
        object: false,
        in_string: false,
        escaped: false,
        key_next: false,
        key: None,
        last_key: Vec::new(),
        events_depth: None,
        had_element: false,
        held: Vec::new(),
        events,
        meta,
        done_events: false,
        done_meta: false,
    };
    loop {
        let buf = r.fill_buf().context("reading the profiler trace")?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        for &b in buf {
            s.byte(b).context("writing the annotated trace")?;
        }
        r.consume(n);
    }
    s.flush_held()
        .and_then(|()| s.out.flush())
        .context("writing the annotated trace")?;
    if (want_events && !s.done_events) || (want_meta && !s.done_meta) {
        bail!("the profiler trace changed while it was read: its traceEvents or its end moved");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spliced(text: &str, events: Option<&str>, meta: Option<&str>) -> String {
        let mut out = Vec::new();
        splice(
            text.as_bytes(),
            &mut out,
            events.map(str::to_string),
            meta.map(str::to_string),
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn inserts_after_the_last_event_and_the_last_member() {
        let t =
            "{\"traceEvents\": [ {\"a\": \"]}\\\"\"} ,\n 3 \n], \"x\": {\"traceEvents\": []} \n}\n";
        assert_eq!(
            spliced(t, Some("  E"), Some("{}")),
            "{\"traceEvents\": [ {\"a\": \"]}\\\"\"} ,\n 3,\n  E \n], \"x\": {\"traceEvents\": []},\n  \"uvmwatch\": {} \n}\n"
        );
        // An empty array gets its events after its white space, on lines of their own.
        assert_eq!(
            spliced("{\"traceEvents\":[ ]}", Some("  E"), Some("{}")),
            "{\"traceEvents\":[ \n  E\n],\n  \"uvmwatch\": {}}"
        );
        // A bare array: events, no member.
        assert_eq!(spliced("[1,2]\n", Some("  E"), None), "[1,2,\n  E]\n");
        // Nothing to insert: the same bytes.
        let t = "{ \"k\" : [1, {\"traceEvents\": [9]}], \"traceEvents\" : [ ] }";
        assert_eq!(spliced(t, None, None), t);
    }

    #[test]
    fn a_key_only_at_the_top_level_and_only_once() {
        // `traceEvents` as a string value, or a key of a nested object, is not the array.
        let t = "{\"a\": \"traceEvents\", \"b\": {\"traceEvents\": [1]}, \"traceEvents\": [2]}";
        assert_eq!(
            spliced(t, Some("  E"), None),
            "{\"a\": \"traceEvents\", \"b\": {\"traceEvents\": [1]}, \"traceEvents\": [2,\n  E]}"
        );
        // A trace that changed between the passes (no traceEvents now) is an error.
        let mut out = Vec::new();
        assert!(splice(&b"{\"x\": []}"[..], &mut out, Some("E".into()), None).is_err());
    }

    #[test]
    fn white_space_held_back_is_bounded() {
        let ws = " ".repeat(MAX_HELD_WS + 10);
        let t = format!("{{\"traceEvents\": [1{ws}]}}");
        let out = spliced(&t, Some("  0"), None);
        // Still every input byte, and valid JSON.
        assert_eq!(out.len(), t.len() + ",\n  0".len());
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
    }

    #[test]
    fn survey_reads_base_pids_and_window_and_refuses_what_is_not_a_trace() {
        let t = r#"{"baseTimeNanoseconds": "1000", "traceEvents": [
            {"ph": "X", "pid": 7, "ts": 1.5, "dur": 2},
            {"ph": "M", "pid": 8, "ts": 99},
            {"ph": "i", "pid": "gpu", "ts": 4}], "extra": {"deep": [1, 2, {"x": null}]}}"#;
        let s = survey(t.as_bytes()).unwrap();
        assert_eq!(s.base_ns, Some(1000));
        assert!(s.object);
        assert_eq!(s.pids.iter().copied().collect::<Vec<_>>(), vec![7, 8]);
        assert_eq!(s.window, Some((1_500, 4_000)));
        let bare = survey(&br#"[{"ph": "X", "pid": 1, "ts": 0, "dur": 1}]"#[..]).unwrap();
        assert!(!bare.object);
        for bad in [
            "nope",
            "{\"a\": 1}",
            "{\"traceEvents\": 3}",
            "{\"traceEvents\": []",
            "{\"traceEvents\": []} trailing",
            "{\"traceEvents\": [], \"uvmwatch\": {}}",
            "{\"traceEvents\": [], \"baseTimeNanoseconds\": \"soon\"}",
        ] {
            assert!(survey(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}

//! The trace context a workload was started in: `TRACEPARENT` and `TRACESTATE` in its
//! environment, the carrier OpenTelemetry specifies for processes ("Environment Variables as
//! Context Propagation Carriers", opentelemetry.io; the values are W3C Trace Context
//! headers, w3.org/TR/trace-context). vLLM hands its start-up trace to its workers this way
//! (vllm-project/vllm, `vllm/tracing`), so a worker's `cuInit` span can join the server's
//! trace.
//!
//! The environment is the one the process was started with (`/proc/<pid>/environ`): a
//! start-up context, which only start-up spans join (`export/otlp`).

/// A parsed `TRACEPARENT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace the process was started in.
    pub trace_id: [u8; 16],
    /// The span that started it (the parent of the spans that join).
    pub span_id: [u8; 8],
    /// The `sampled` flag: whether the parent's trace is recorded.
    pub sampled: bool,
    /// `TRACESTATE`, when present and well-formed (kept verbatim).
    pub trace_state: Option<String>,
}

/// Longest `TRACESTATE` kept: W3C Trace Context asks vendors to propagate at least 512
/// characters; a longer one is dropped rather than cut (a cut list is malformed).
const MAX_TRACE_STATE: usize = 512;

impl TraceParent {
    /// `TRACEPARENT` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`) and `TRACESTATE`.
    /// `None` when the first is malformed, of version `ff`, or has an all-zero id (W3C Trace
    /// Context, "traceparent Header"); a later version is read by its first four fields, as
    /// the specification asks.
    pub fn parse(traceparent: &str, trace_state: Option<&str>) -> Option<TraceParent> {
        let t = traceparent.trim();
        let mut parts = t.splitn(5, '-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        if version.len() != 2 || version.eq_ignore_ascii_case("ff") {
            return None;
        }
        let v = u8::from_str_radix(version, 16).ok()?;
        if (v == 0 && rest.is_some()) || !is_lower_hex(version) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?.try_into().ok()?;
        let span_id: [u8; 8] = hex(span)?.try_into().ok()?;
        let flags: [u8; 1] = hex(flags)?.try_into().ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let trace_state = trace_state
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACE_STATE)
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(str::to_string);
        Some(TraceParent {
            trace_id,
            span_id,
            sampled: flags[0] & 1 == 1,
            trace_state,
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Lowercase hex digits to bytes (W3C: uppercase is invalid).
fn hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) || !is_lower_hex(s) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w3c_examples_and_refusals() {
        // W3C Trace Context's own example.
        let t = TraceParent::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("congo=t61rcWkgMzE"),
        )
        .unwrap();
        assert_eq!(t.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert!(t.sampled);
        assert_eq!(t.trace_state.as_deref(), Some("congo=t61rcWkgMzE"));
        let unsampled = TraceParent::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            None,
        )
        .unwrap();
        assert!(!unsampled.sampled);
        // A later version: its first four fields.
        assert!(TraceParent::parse(
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            None
        )
        .is_some());
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz",
        ] {
            assert_eq!(TraceParent::parse(bad, None), None, "{bad}");
        }
        // A state too long or not printable is dropped, the parent kept.
        let long = "a=".to_string() + &"b".repeat(MAX_TRACE_STATE);
        let t = TraceParent::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some(&long),
        )
        .unwrap();
        assert_eq!(t.trace_state, None);
    }
}

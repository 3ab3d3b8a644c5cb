//! Byte ranges of JSON values in a text already known to be valid JSON: what lets
//! [`super::annotate`] insert its events into the profiler's file without re-serialising it.

use anyhow::{bail, Result};

/// `[start, end)` of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// The first byte at or after `i` that is not JSON white space.
pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// End (exclusive) of the string starting at `i` (a `"`).
fn string_end(b: &[u8], mut i: usize) -> Result<usize> {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    bail!("unterminated string")
}

/// End (exclusive) of the value starting at `i`.
pub fn value_end(b: &[u8], i: usize) -> Result<usize> {
    match b.get(i) {
        Some(b'"') => string_end(b, i),
        Some(b'{') | Some(b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            bail!("unterminated object or array")
        }
        Some(_) => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            Ok(j)
        }
        None => bail!("unexpected end"),
    }
}

/// Members of the object at `i` (a `{`): (raw key including quotes, value span), and
/// the position of its closing `}`.
pub fn members(b: &[u8], i: usize) -> Result<(Vec<(Span, Span)>, usize)> {
    let mut out = Vec::new();
    let mut j = skip_ws(b, i + 1);
    if b.get(j) == Some(&b'}') {
        return Ok((out, j));
    }
    loop {
        let ks = j;
        let ke = string_end(b, ks)?;
        j = skip_ws(b, ke);
        if b.get(j) != Some(&b':') {
            bail!("expected ':' at byte {j}");
        }
        let vs = skip_ws(b, j + 1);
        let ve = value_end(b, vs)?;
        out.push((Span { start: ks, end: ke }, Span { start: vs, end: ve }));
        j = skip_ws(b, ve);
        match b.get(j) {
            Some(b',') => j = skip_ws(b, j + 1),
            Some(b'}') => return Ok((out, j)),
            _ => bail!("expected ',' or '}}' at byte {j}"),
        }
    }
}

/// Elements of the array at `i` (a `[`), and the position of its closing `]`.
pub fn elements(b: &[u8], i: usize) -> Result<(Vec<Span>, usize)> {
    let mut out = Vec::new();
    let mut j = skip_ws(b, i + 1);
    if b.get(j) == Some(&b']') {
        return Ok((out, j));
    }
    loop {
        let e = value_end(b, j)?;
        out.push(Span { start: j, end: e });
        j = skip_ws(b, e);
        match b.get(j) {
            Some(b',') => j = skip_ws(b, j + 1),
            Some(b']') => return Ok((out, j)),
            _ => bail!("expected ',' or ']' at byte {j}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_spans() {
        let t = r#" { "a" : [1, {"b":"]}\"x"}, [ ] ] , "c":-1.5e3 } "#;
        let b = t.as_bytes();
        let (m, close) = members(b, 1).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(&t[m[0].1.start..m[0].1.end], r#"[1, {"b":"]}\"x"}, [ ] ]"#);
        assert_eq!(&t[m[1].1.start..m[1].1.end], "-1.5e3");
        assert_eq!(b[close], b'}');
        let (e, _) = elements(b, m[0].1.start).unwrap();
        assert_eq!(e.len(), 3);
        let (e, _) = elements(b"[ ]", 0).unwrap();
        assert!(e.is_empty());
    }
}

//! How a value read from the host or from a file is shown in a record, a report or an error
//! message: bounded, quoted or clipped, never raw bytes to a terminal. The doctor's reads
//! (`doctor::input`) and the host readers (`host/`) both show their input this way.

/// Most characters of an input [`quote`] and [`clip`] show.
pub const QUOTE_MAX_CHARS: usize = 200;

/// A value read from an input, for a report or an error message: in double quotes, at most
/// [`QUOTE_MAX_CHARS`] characters, then `…` and the value's whole size in bytes when cut
/// (`"NVRM garbage…" (1073741824 bytes)`). Control characters, quotes, backslashes and
/// bytes that are not UTF-8 are escaped (`\n`, `\u{1b}`, `\"`, `\xff`).
pub fn quote(value: impl AsRef<[u8]>) -> String {
    let value = value.as_ref();
    let (shown, cut) = escape_prefix(value, QUOTE_MAX_CHARS, true);
    if cut {
        format!("\"{shown}…\" ({} bytes)", value.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// Like [`quote`] without the quotes (and with `"` and `\` as they are), with at most
/// `max_chars` characters shown: for a value printed on its own (an evidence value in the
/// text report, a kept kernel-log line, an error message that may hold input).
pub fn clip(value: impl AsRef<[u8]>, max_chars: usize) -> String {
    let value = value.as_ref();
    let (shown, cut) = escape_prefix(value, max_chars, false);
    if cut {
        format!("{shown}… ({} bytes)", value.len())
    } else {
        shown
    }
}

/// The escaped text of the first `max_chars` characters of `value` (each invalid byte
/// counts as one), and whether there was more. `quoted`: `"` and `\` are escaped too.
fn escape_prefix(value: &[u8], max_chars: usize, quoted: bool) -> (String, bool) {
    let mut out = String::new();
    let mut chars = 0usize;
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            if chars == max_chars {
                return (out, true);
            }
            chars += 1;
            // `escape_debug` escapes `"`, `\\`, control and other unprintable characters.
            match c {
                '\'' => out.push(c),
                '"' | '\\' if !quoted => out.push(c),
                c => out.extend(c.escape_debug()),
            }
        }
        for b in chunk.invalid() {
            if chars == max_chars {
                return (out, true);
            }
            chars += 1;
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    (out, false)
}

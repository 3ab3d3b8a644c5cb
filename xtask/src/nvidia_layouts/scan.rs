//! Reading C headers and sources as text: comments out, `#include`s, object-like
//! `#define`s, where a typedef'd struct is defined, and where a command is dispatched.
//! Deliberately small: it only has to find NVIDIA's own one-line definitions; the compiler
//! does the real work (sizes, offsets, values).

use std::collections::BTreeMap;

/// `text` with `/* */` and `//` comments replaced by spaces (newlines kept), string and
/// character literals left alone.
pub fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                out.extend_from_slice(b"  ");
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
                i = (i + 2).min(b.len());
                out.extend_from_slice(b"  ");
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            }
            q @ (b'"' | b'\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push(b[i]);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The preprocessor directive of a line (`define X 1` for `#  define X 1`), if it is one.
fn directive(line: &str) -> Option<&str> {
    line.trim_start().strip_prefix('#').map(str::trim_start)
}

/// The names of every `#include "x"` / `#include <x>` (any branch of any conditional).
pub fn includes(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = directive(line).and_then(|d| d.strip_prefix("include")) else {
            continue;
        };
        let rest = rest.trim_start();
        let close = match rest.chars().next() {
            Some('"') => '"',
            Some('<') => '>',
            _ => continue,
        };
        if let Some(end) = rest[1..].find(close) {
            out.push(rest[1..1 + end].to_string());
        }
    }
    out
}

/// Every object-like `#define NAME VALUE` (not `NAME(args)`), as `(NAME, VALUE)` with the
/// value's whitespace collapsed; comments must already be stripped.
pub fn defines(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = directive(line).and_then(|d| d.strip_prefix("define")) else {
            continue;
        };
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let rest = rest.trim_start();
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (name, value) = rest.split_at(name_len);
        if name.is_empty() || value.starts_with('(') {
            continue;
        }
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push((name.to_string(), value));
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Whether `text` has `ident` as a whole identifier.
pub fn has_ident(text: &str, ident: &str) -> bool {
    find_ident(text, ident, 0).is_some()
}

/// The first position at or after `from` where `ident` occurs as a whole identifier.
pub fn find_ident(text: &str, ident: &str, from: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut start = from;
    while let Some(p) = text.get(start..)?.find(ident) {
        let at = start + p;
        let end = at + ident.len();
        let before_ok = at == 0 || !is_ident(b[at - 1]);
        let after_ok = end >= b.len() || !is_ident(b[end]);
        if before_ok && after_ok {
            return Some(at);
        }
        start = at + 1;
    }
    None
}

/// How a typedef name is defined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Typedef {
    /// `typedef struct { BODY } NAME;` (the body's text, without the braces).
    Body(String),
    /// `typedef OTHER NAME;`
    Alias(String),
}

/// Every `} NAME;` that closes a brace block (a typedef'd struct or union) and every
/// `typedef OTHER NAME;`, by NAME; comments must already be stripped. The first definition
/// of a name wins.
pub fn typedefs(text: &str) -> BTreeMap<String, Typedef> {
    let b = text.as_bytes();
    let mut out = BTreeMap::new();
    for (close, _) in text.match_indices('}') {
        // `}` ws NAME ws `;`
        let mut i = close + 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let name_start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        let name_end = i;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if name_end == name_start || b.get(i) != Some(&b';') {
            continue;
        }
        let mut depth = 0usize;
        let mut open = None;
        for j in (0..close).rev() {
            match b[j] {
                b'}' => depth += 1,
                b'{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                b'{' => depth -= 1,
                _ => {}
            }
        }
        if let Some(open) = open {
            out.entry(text[name_start..name_end].to_string())
                .or_insert_with(|| Typedef::Body(text[open + 1..close].to_string()));
        }
    }
    for line in text.split(';') {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [.., "typedef", other, name] = words.as_slice() {
            if [other, name]
                .iter()
                .all(|w| w.bytes().all(is_ident) && !w.is_empty())
            {
                out.entry(name.to_string())
                    .or_insert_with(|| Typedef::Alias(other.to_string()));
            }
        }
    }
    out
}

/// The body of `name`, following aliases.
pub fn struct_body<'a>(defs: &'a BTreeMap<String, Typedef>, name: &str) -> Option<&'a str> {
    let mut name = name;
    for _ in 0..8 {
        match defs.get(name)? {
            Typedef::Body(b) => return Some(b),
            Typedef::Alias(other) => name = other,
        }
    }
    None
}

/// Where `text` dispatches on `name`: `case NAME:`, `== NAME`, or (UVM)
/// `UVM_ROUTE_CMD_...(NAME, ...)`. Returns the offset just after each site.
pub fn dispatch_sites(text: &str, name: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find_ident(text, name, from) {
        from = at + name.len();
        let before = text[..at].trim_end();
        let after = text[from..].trim_start();
        let is_case = before.ends_with("case")
            && before.len() >= 4
            && (before.len() == 4 || !is_ident(b[before.len() - 5]))
            && after.starts_with(':');
        let is_compare = before.ends_with("==");
        let is_route = before.ends_with('(') && {
            let head = before[..before.len() - 1].trim_end();
            let start = head
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |p| p + 1);
            head[start..].starts_with("UVM_ROUTE_CMD_")
        };
        if is_case || is_compare || is_route {
            out.push(from);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_literals_stay() {
        let s = strip_comments("a /* x\ny */ b // c\n\"//\" '/'");
        assert_eq!(s.lines().count(), 3);
        assert!(!s.contains('x') && !s.contains('c'));
        assert!(s.contains("\"//\"") && s.contains("'/'"));
    }

    #[test]
    fn includes_and_defines() {
        let t = "#include \"a.h\"\n#  include <b/c.h>\n#define X UVM_IOCTL_BASE(3)\n#define F(x) x\n#   define  Y   0x30000001\n";
        assert_eq!(includes(t), ["a.h", "b/c.h"]);
        assert_eq!(
            defines(t),
            [
                ("X".to_string(), "UVM_IOCTL_BASE(3)".to_string()),
                ("Y".to_string(), "0x30000001".to_string())
            ]
        );
    }

    #[test]
    fn typedef_bodies_and_aliases() {
        let t = "typedef struct { NvU64 a; struct { int b; } in; NV_STATUS rmStatus; } A_PARAMS;\ntypedef A_PARAMS B_PARAMS;\n";
        let d = typedefs(t);
        assert!(struct_body(&d, "A_PARAMS").unwrap().contains("rmStatus"));
        assert_eq!(struct_body(&d, "B_PARAMS"), struct_body(&d, "A_PARAMS"));
        // `} in;` closes a member, not a typedef; recording it is harmless (lookups are by
        // the `_PARAMS` / `_PARAMETERS` names).
        assert!(has_ident(struct_body(&d, "B_PARAMS").unwrap(), "rmStatus"));
        assert!(!has_ident("xrmStatus", "rmStatus"));
    }

    #[test]
    fn dispatch_forms() {
        let t = "switch (c) { case UVM_X: break; }\nUVM_ROUTE_CMD_STACK_INIT_CHECK(UVM_Y, f);\nif (cmd == NV_ESC_Z)\n#define UVM_W 3\nnotcase UVM_V:";
        assert_eq!(dispatch_sites(t, "UVM_X").len(), 1);
        assert_eq!(dispatch_sites(t, "UVM_Y").len(), 1);
        assert_eq!(dispatch_sites(t, "NV_ESC_Z").len(), 1);
        assert!(dispatch_sites(t, "UVM_W").is_empty());
        assert!(dispatch_sites(t, "UVM_V").is_empty());
    }
}

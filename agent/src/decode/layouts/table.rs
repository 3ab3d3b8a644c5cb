//! Reading `nvidia-layouts.tsv` (written by `cargo xtask nvidia-layouts`; its header says
//! how) and checking what the kernel side relies on: a status field lies inside its params,
//! an RM params struct fits `_IOC_SIZE`, at one tag a number has one name and one layout per
//! struct.

use std::collections::BTreeMap;

use super::DriverVersion;

/// `_IOC_SIZE` is 14 bits.
pub const IOC_SIZE_MAX: u32 = (1 << 14) - 1;

/// Which kind of command a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A UVM command (request number as passed to `ioctl(2)`).
    Uvm,
    /// An RM escape (`_IOC_NR`).
    Rm,
}

/// A release tag and its commit.
#[derive(Clone, Debug)]
pub struct Tag {
    pub version: DriverVersion,
    pub commit: &'static str,
}

/// One row: a command with one params struct over the tags `first..=last` (indexes into
/// [`Table::tags`]).
#[derive(Clone, Debug)]
pub struct Row {
    pub kind: Kind,
    pub cmd: u32,
    pub name: &'static str,
    pub first: usize,
    pub last: usize,
    pub size: u32,
    pub status: Option<u32>,
    /// The status field's name (`rmStatus`, `status`, `params.status`, ...).
    pub field: Option<&'static str>,
    /// The params typedef.
    pub params: Option<&'static str>,
    /// The driver files that dispatch the command; `None`: defined but not dispatched.
    pub via: Option<&'static str>,
}

impl Row {
    /// Whether the row covers tag `i`.
    pub fn covers(&self, i: usize) -> bool {
        self.first <= i && i <= self.last
    }
}

/// The whole file.
#[derive(Debug)]
pub struct Table {
    /// In version order.
    pub tags: Vec<Tag>,
    pub rows: Vec<Row>,
}

fn dash(s: &'static str) -> Option<&'static str> {
    (s != "-").then_some(s)
}

fn number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses and checks the file's text.
pub fn parse(text: &'static str) -> Result<Table, String> {
    let mut tags: Vec<Tag> = Vec::new();
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |what: String| format!("nvidia-layouts.tsv line {}: {what}", n + 1);
        if let Some(rest) = line.strip_prefix("# tag\t") {
            let (v, commit) = rest
                .split_once('\t')
                .ok_or_else(|| at("tag line without a commit".into()))?;
            let version: DriverVersion = v.parse().map_err(|e| at(format!("{e}")))?;
            if version.to_string() != v {
                return Err(at(format!("tag {v} does not read back as itself")));
            }
            if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(at(format!("bad commit {commit:?}")));
            }
            if tags.last().is_some_and(|t| t.version >= version) {
                return Err(at(format!("tag {v} out of order")));
            }
            index.insert(v, tags.len());
            tags.push(Tag { version, commit });
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let f: Vec<&'static str> = line.split('\t').collect();
        let [kind, cmd, name, first, last, size, status, field, params, via] = f[..] else {
            return Err(at(format!("{} fields, not 10", f.len())));
        };
        let kind = match kind {
            "uvm" => Kind::Uvm,
            "rm" => Kind::Rm,
            k => return Err(at(format!("unknown kind {k:?}"))),
        };
        let tag = |t: &str| {
            index
                .get(t)
                .copied()
                .ok_or_else(|| at(format!("{t} is not a listed tag")))
        };
        let row = Row {
            kind,
            cmd: number(cmd).ok_or_else(|| at(format!("bad number {cmd:?}")))?,
            name,
            first: tag(first)?,
            last: tag(last)?,
            size: size.parse().map_err(|_| at(format!("bad size {size:?}")))?,
            status: match status {
                "-" => None,
                s => Some(s.parse().map_err(|_| at(format!("bad offset {s:?}")))?),
            },
            field: dash(field),
            params: dash(params),
            via: dash(via),
        };
        check_row(&row).map_err(at)?;
        rows.push(row);
    }
    if tags.is_empty() {
        return Err("nvidia-layouts.tsv lists no tags".into());
    }
    check_tags(&tags, &rows)?;
    Ok(Table { tags, rows })
}

/// What every row must satisfy on its own.
fn check_row(r: &Row) -> Result<(), String> {
    if r.first > r.last {
        return Err(format!("{}: first tag after last", r.name));
    }
    if let Some(off) = r.status {
        if r.params.is_none() || r.field.is_none() {
            return Err(format!("{}: a status offset without params", r.name));
        }
        if off.checked_add(4).is_none_or(|end| end > r.size) {
            return Err(format!(
                "{}: status at {off} does not fit {} bytes",
                r.name, r.size
            ));
        }
    }
    if r.kind == Kind::Rm {
        if r.cmd > 0xff {
            return Err(format!("{}: {:#x} is not an _IOC_NR", r.name, r.cmd));
        }
        if r.params.is_some() && (r.size == 0 || r.size > IOC_SIZE_MAX) {
            return Err(format!("{}: {} bytes do not fit _IOC_SIZE", r.name, r.size));
        }
    }
    Ok(())
}

/// At each tag: one name per number, one row per number and struct.
fn check_tags(tags: &[Tag], rows: &[Row]) -> Result<(), String> {
    for (i, t) in tags.iter().enumerate() {
        let mut names: BTreeMap<(Kind, u32), &str> = BTreeMap::new();
        let mut seen: BTreeMap<(Kind, u32, Option<&str>), ()> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.covers(i)) {
            if *names.entry((r.kind, r.cmd)).or_insert(r.name) != r.name {
                return Err(format!("{}: {:#x} has two names", t.version, r.cmd));
            }
            if seen.insert((r.kind, r.cmd, r.params), ()).is_some() {
                return Err(format!("{}: {} has two rows", t.version, r.name));
            }
        }
    }
    Ok(())
}

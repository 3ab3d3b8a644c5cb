//! One tag: find its commands in the headers, write the headers they need into a temporary
//! directory, compile a C program that prints `sizeof` and `offsetof` of each params
//! struct with the host's `gcc`, and run it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use super::escapes;
use super::git::Reader;
use super::scan;

/// Where the UVM commands and their params are defined.
pub const UVM_HEADERS: [&str; 2] = [
    "kernel-open/nvidia-uvm/uvm_ioctl.h",
    "kernel-open/nvidia-uvm/uvm_linux_ioctl.h",
];
/// Include path of the UVM program, in order.
const UVM_INCLUDE: [&str; 2] = ["kernel-open/nvidia-uvm", "kernel-open/common/inc"];
/// The files that dispatch UVM commands, and the short name the table gives each.
pub const UVM_DISPATCH: [(&str, &str); 2] = [
    ("kernel-open/nvidia-uvm/uvm.c", "uvm.c"),
    ("kernel-open/nvidia-uvm/uvm_tools.c", "uvm_tools.c"),
];

/// The RM program's headers: the NVOS structs, the escape numbers and the `nv_ioctl_*`
/// structs, the wrappers and the lockless-diagnostic (earlier: nvlog) params, where the tag
/// has them.
const RM_PRELUDE: &str = r#"#include "nvos.h"
#include "nv-ioctl.h"
#include "nv_escape.h"
#if __has_include("nv-ioctl-numa.h")
#include "nv-ioctl-numa.h"
#endif
#if __has_include("nv-unix-nvos-params-wrappers.h")
#include "nv-unix-nvos-params-wrappers.h"
#endif
#if __has_include("nv-ioctl-lockless-diag.h")
#include "nv-ioctl-lockless-diag.h"
#endif
#if __has_include("nv-ioctl-nvlog.h")
#include "nv-ioctl-nvlog.h"
#endif
"#;
/// Include path of the RM program: the SDK first (as RM itself is built), then the unix
/// layer, then the kernel interface's copies (`nv-ioctl-numa.h` is only there before 545).
const RM_INCLUDE: [&str; 3] = [
    "src/common/sdk/nvidia/inc",
    "src/nvidia/arch/nvalloc/unix/include",
    "kernel-open/common/inc",
];
/// The files that dispatch RM escapes.
pub const RM_DISPATCH: [(&str, &str); 3] = [
    ("kernel-open/nvidia/nv.c", "nv.c"),
    ("src/nvidia/arch/nvalloc/unix/src/escape.c", "escape.c"),
    ("src/nvidia/arch/nvalloc/unix/src/osapi.c", "osapi.c"),
];

/// `_IOC_SIZE` is 14 bits.
pub const IOC_SIZE_MAX: u32 = (1 << 14) - 1;

/// Which table a fact belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` commands.
    Uvm,
    /// RM escapes on `/dev/nvidiactl` and the GPU nodes, by `_IOC_NR`.
    Rm,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Uvm => "uvm",
            Kind::Rm => "rm",
        }
    }
}

/// What one tag says about one command and one of its params structs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fact {
    pub kind: Kind,
    /// UVM: the request number; RM: `_IOC_NR`.
    pub cmd: u32,
    pub name: String,
    /// The params typedef; `None` when the command takes none or none is known.
    pub params: Option<String>,
    /// `sizeof` the params (0 when there are none).
    pub size: u32,
    /// The status field and its offset.
    pub status: Option<(String, u32)>,
    /// The files that dispatch the command at this tag (`-` when none does).
    pub via: String,
}

/// Everything one tag gives.
#[derive(Debug, Default)]
pub struct TagFacts {
    pub facts: Vec<Fact>,
    /// Repository paths of the headers the programs were compiled from.
    pub headers: BTreeSet<String>,
}

/// Reads `path` at `commit`, comments stripped; an error when missing.
fn must_read(r: &mut Reader, commit: &str, path: &str) -> Result<String> {
    r.read(commit, path)?
        .map(|t| scan::strip_comments(&t))
        .with_context(|| format!("{path} is missing at {commit}"))
}

/// `a/b/../c` -> `a/c`.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The headers reachable from `root` (a program's text) through `#include`s, resolved
/// against the including file's directory and then `include` in order; names the tag does
/// not have (system headers, other platforms' headers) are skipped. Returns path -> text.
fn closure(
    r: &mut Reader,
    commit: &str,
    root: &str,
    include: &[&str],
) -> Result<BTreeMap<String, String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut missing: BTreeSet<String> = BTreeSet::new();
    let mut queue: VecDeque<(Option<String>, String)> = scan::includes(root)
        .into_iter()
        .map(|n| (None, n))
        .collect();
    while let Some((dir, name)) = queue.pop_front() {
        let mut candidates: Vec<String> = Vec::new();
        if let Some(d) = &dir {
            candidates.push(normalize(&format!("{d}/{name}")));
        }
        candidates.extend(include.iter().map(|i| normalize(&format!("{i}/{name}"))));
        for c in candidates {
            if files.contains_key(&c) {
                break;
            }
            if missing.contains(&c) {
                continue;
            }
            match r.read(commit, &c)? {
                Some(text) => {
                    let d = c.rsplit_once('/').map(|(d, _)| d.to_string());
                    queue.extend(scan::includes(&text).into_iter().map(|n| (d.clone(), n)));
                    files.insert(c, text);
                    break;
                }
                None => {
                    missing.insert(c);
                }
            }
        }
        ensure!(files.len() < 1000, "include closure runs away");
    }
    Ok(files)
}

/// Writes `files` under `dir`, compiles `program` against `include` and runs it.
fn compile_and_run(
    dir: &Path,
    name: &str,
    files: &BTreeMap<String, String>,
    include: &[&str],
    program: &str,
) -> Result<String> {
    for (path, text) in files {
        let p = dir.join(path);
        fs::create_dir_all(p.parent().unwrap())?;
        fs::write(&p, text)?;
    }
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    fs::write(&src, program)?;
    let mut cc = Command::new("gcc");
    cc.args(["-std=gnu11", "-m64", "-w", "-o"]).arg(&exe);
    for i in include {
        cc.arg(format!("-I{}", dir.join(i).display()));
    }
    cc.arg(&src);
    let out = cc.output().context("cannot run gcc")?;
    if !out.status.success() {
        bail!(
            "gcc failed on {name}.c:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let run = Command::new(&exe).output()?;
    ensure!(run.status.success(), "{name} failed: {}", run.status);
    Ok(String::from_utf8_lossy(&run.stdout).into_owned())
}

/// The short names of the files in `sources` that dispatch `name`, joined by `+`, or `-`.
fn via(sources: &[(String, &str)], name: &str) -> String {
    let v: Vec<&str> = sources
        .iter()
        .filter(|(text, _)| !scan::dispatch_sites(text, name).is_empty())
        .map(|(_, short)| *short)
        .collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join("+")
    }
}

/// A printf line of the program: `KIND LABEL VALUE SIZE OFFSET`, the value being the
/// macro `name`'s, the size and offset those of `params` and its `field` (0 and -1 when
/// absent). Only where the preprocessor defines `name` for Linux (the headers define some
/// commands for Windows only): a label missing from the output is a command this tag does
/// not have.
fn print_line(
    p: &mut String,
    kind: &str,
    label: &str,
    name: &str,
    params: Option<&str>,
    field: Option<&str>,
) {
    let size = params.map_or("0".to_string(), |t| format!("sizeof({t})"));
    let off = match (params, field) {
        (Some(t), Some(f)) => format!("(long)offsetof({t}, {f})"),
        _ => "-1L".to_string(),
    };
    let _ = writeln!(
        p,
        "#ifdef {name}\n    printf(\"{kind} {label} %lu %lu %ld\\n\", (unsigned long)({name}), (unsigned long){size}, {off});\n#endif"
    );
}

/// One line of a program's output: the macro's value, the size and the status offset.
type Printed = (u64, u32, Option<u32>);

/// The program's lines back, by label.
fn parse_output(out: &str, kind: &str) -> Result<BTreeMap<String, Printed>> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        ensure!(f.len() == 5 && f[0] == kind, "unexpected line {line:?}");
        let off: i64 = f[4].parse()?;
        m.insert(
            f[1].to_string(),
            (
                f[2].parse()?,
                f[3].parse()?,
                (off >= 0).then_some(off as u32),
            ),
        );
    }
    Ok(m)
}

/// Everything about the tag at `commit`, using `work` as scratch space.
pub fn probe(r: &mut Reader, commit: &str, work: &Path) -> Result<TagFacts> {
    let mut tf = TagFacts::default();
    probe_uvm(r, commit, &work.join("uvm"), &mut tf).context("UVM commands")?;
    probe_rm(r, commit, &work.join("rm"), &mut tf).context("RM escapes")?;
    tf.facts.sort();
    Ok(tf)
}

fn probe_uvm(r: &mut Reader, commit: &str, work: &Path, tf: &mut TagFacts) -> Result<()> {
    let [ioctl_h, linux_h] = UVM_HEADERS;
    let base = must_read(r, commit, ioctl_h)?;
    let linux = must_read(r, commit, linux_h)?;
    // `#define UVM_X UVM_IOCTL_BASE(n)` in uvm_ioctl.h; plain numbers in uvm_linux_ioctl.h
    // (UVM_INITIALIZE, UVM_DEINITIALIZE; uvm_ioctl.h's plain numbers are flags and limits).
    let mut names: Vec<String> = Vec::new();
    for (n, v) in scan::defines(&base) {
        if n.starts_with("UVM_") && n != "UVM_IOCTL_BASE" && v.starts_with("UVM_IOCTL_BASE(") {
            names.push(n);
        }
    }
    for (n, v) in scan::defines(&linux) {
        let numeric = v.starts_with("0x") || v.bytes().all(|b| b.is_ascii_digit());
        if n.starts_with("UVM_") && !v.is_empty() && numeric {
            names.push(n);
        }
    }
    ensure!(!names.is_empty(), "no UVM commands found");
    let defs = scan::typedefs(&format!("{base}\n{linux}"));
    let sources: Vec<(String, &str)> = UVM_DISPATCH
        .iter()
        .map(|(p, short)| Ok((must_read(r, commit, p)?, *short)))
        .collect::<Result<_>>()?;

    let mut program = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"uvm_linux_ioctl.h\"\nint main(void)\n{\n",
    );
    let mut plan = Vec::new();
    for n in &names {
        let t = format!("{n}_PARAMS");
        let params = defs.contains_key(&t).then_some(t);
        let field = params.as_deref().and_then(|t| {
            let body = scan::struct_body(&defs, t)?;
            scan::has_ident(body, "rmStatus").then_some("rmStatus")
        });
        print_line(&mut program, "U", n, n, params.as_deref(), field);
        plan.push((n.clone(), params, field));
    }
    program.push_str("    return 0;\n}\n");
    let files = closure(r, commit, &program, &UVM_INCLUDE)?;
    let out = compile_and_run(work, "uvm_layouts", &files, &UVM_INCLUDE, &program)?;
    let got = parse_output(&out, "U")?;
    for (name, params, field) in plan {
        let Some(&(value, size, off)) = got.get(&name) else {
            continue;
        };
        tf.facts.push(Fact {
            kind: Kind::Uvm,
            cmd: u32::try_from(value).context("command number")?,
            via: via(&sources, &name),
            name,
            params,
            size,
            status: field.map(|f| f.to_string()).zip(off),
        });
    }
    tf.headers.extend(files.into_keys());
    Ok(())
}

fn probe_rm(r: &mut Reader, commit: &str, work: &Path, tf: &mut TagFacts) -> Result<()> {
    let headers = closure(r, commit, RM_PRELUDE, &RM_INCLUDE)?;
    let mut all = String::new();
    for text in headers.values() {
        all.push_str(&scan::strip_comments(text));
        all.push('\n');
    }
    let mut names: BTreeSet<String> = BTreeSet::new();
    for (n, v) in scan::defines(&all) {
        if n.starts_with("NV_ESC_") && !v.is_empty() {
            names.insert(n);
        }
    }
    ensure!(!names.is_empty(), "no RM escapes found");
    let defs = scan::typedefs(&all);
    let sources: Vec<(String, &str)> = RM_DISPATCH
        .iter()
        .map(|(p, short)| Ok((must_read(r, commit, p)?, *short)))
        .collect::<Result<_>>()?;

    let mut program =
        format!("#include <stdio.h>\n#include <stddef.h>\n{RM_PRELUDE}int main(void)\n{{\n");
    struct Planned<'a> {
        label: String,
        name: String,
        params: Option<String>,
        field: Option<&'a str>,
        via: String,
    }
    let mut plan: Vec<Planned> = Vec::new();
    for n in &names {
        let forms: Vec<(&str, Option<&str>)> = escapes::forms(n)
            .iter()
            .filter_map(|f| {
                let t = f.types.iter().find(|t| defs.contains_key(**t))?;
                Some((*t, f.status))
            })
            .collect();
        let v = via(&sources, n);
        if v != "-" {
            check_dispatch(&sources, n, escapes::forms(n), &forms)?;
        }
        if forms.is_empty() {
            print_line(&mut program, "R", n, n, None, None);
            plan.push(Planned {
                label: n.clone(),
                name: n.clone(),
                params: None,
                field: None,
                via: v.clone(),
            });
        }
        for (i, (t, field)) in forms.into_iter().enumerate() {
            let label = format!("{n}#{i}");
            print_line(&mut program, "R", &label, n, Some(t), field);
            plan.push(Planned {
                label,
                name: n.clone(),
                params: Some(t.to_string()),
                field,
                via: v.clone(),
            });
        }
    }
    program.push_str("    return 0;\n}\n");
    let out = compile_and_run(work, "rm_layouts", &headers, &RM_INCLUDE, &program)?;
    let got = parse_output(&out, "R")?;
    for Planned {
        label,
        name,
        params,
        field,
        via,
    } in plan
    {
        let Some(&(value, size, off)) = got.get(&label) else {
            continue;
        };
        ensure!(value <= 0xff, "{name} = {value:#x} is not an _IOC_NR");
        if params.is_some() {
            ensure!(
                size <= IOC_SIZE_MAX,
                "{name}: {size} bytes do not fit _IOC_SIZE"
            );
        }
        tf.facts.push(Fact {
            kind: Kind::Rm,
            cmd: value as u32,
            name,
            params,
            size,
            status: field.map(|f| f.to_string()).zip(off),
            via,
        });
    }
    tf.headers.extend(headers.into_keys());
    Ok(())
}

/// Where `name` is dispatched, the code that handles it must name the struct types the table
/// gives it with a status field (else the table is stale for this tag). Forms without a
/// status are not checked: some handlers pass the buffer on untyped (the version check).
fn check_dispatch(
    sources: &[(String, &str)],
    name: &str,
    table: &[escapes::Form],
    present: &[(&str, Option<&str>)],
) -> Result<()> {
    if table.is_empty() {
        return Ok(());
    }
    for (t, _) in present.iter().filter(|(_, st)| st.is_some()) {
        let form = table.iter().find(|f| f.types.contains(t)).unwrap();
        let named = sources.iter().any(|(text, _)| {
            scan::dispatch_sites(text, name).into_iter().any(|at| {
                let rest = &text[at..];
                let end = scan::find_ident(rest, "case", 0).unwrap_or(rest.len());
                form.types
                    .iter()
                    .any(|ty| scan::has_ident(&rest[..end], ty))
            })
        });
        ensure!(
            named,
            "{name} is dispatched but its handler does not name {t}: update escapes.rs"
        );
    }
    Ok(())
}

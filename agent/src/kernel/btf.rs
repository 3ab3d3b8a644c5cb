//! Struct member offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`), for the
//! kernel programs that walk `task_struct -> files_struct -> fdtable -> file -> inode`
//! (aya's Rust programs get no CO-RE relocations, so user space finds the offsets and writes
//! them into `Config`).
//!
//! aya-obj parses BTF but keeps struct members crate-private, so this is a small reader of
//! the type section: the header and type encoding of `include/uapi/linux/btf.h` and
//! Documentation/bpf/btf.rst (kinds 1..=19 as of 6.18). Members of anonymous structs and
//! unions are searched through, with their offsets added.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use uvmwatch_common::{FentryOffsets, FileOffsets};

/// `BTF_MAGIC` (`include/uapi/linux/btf.h`).
const BTF_MAGIC: u16 = 0xeb9f;
/// `BTF_KIND_STRUCT`, `BTF_KIND_UNION`, `BTF_KIND_FUNC`.
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;
/// `BTF_KIND_TYPEDEF`, `BTF_KIND_VOLATILE`, `BTF_KIND_CONST`, `BTF_KIND_RESTRICT`,
/// `BTF_KIND_TYPE_TAG`: modifiers, skipped to reach the member's struct or union.
const MODIFIERS: [u32; 5] = [8, 9, 10, 11, 18];

/// The file and where each type is in it: nothing is copied out (a vmlinux BTF is some
/// 6 MB with hundreds of thousands of members; the agent asks for a few dozen, once, at
/// start, and its peak memory is what it holds here).
#[derive(Debug)]
pub struct Btf {
    data: Vec<u8>,
    /// Where each type's `struct btf_type` starts in `data`, by id (id 0 is `void`).
    types: Vec<u32>,
    /// The string section's place in `data`.
    strs: std::ops::Range<usize>,
}

/// One `struct btf_type`: its name, kind, `vlen`, `kind_flag` and `size`/`type`.
struct TypeHead {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
}

fn u16_at(d: &[u8], at: usize) -> Result<u16> {
    d.get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| anyhow!("BTF truncated at {at}"))
}

fn u32_at(d: &[u8], at: usize) -> Result<u32> {
    d.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| anyhow!("BTF truncated at {at}"))
}

fn head_at(d: &[u8], at: usize) -> Result<TypeHead> {
    let info = u32_at(d, at + 4)?;
    Ok(TypeHead {
        name_off: u32_at(d, at)?,
        kind: (info >> 24) & 0x1f,
        vlen: (info & 0xffff) as usize,
        kind_flag: info >> 31 != 0,
        size_or_type: u32_at(d, at + 8)?,
    })
}

impl Btf {
    /// Reads and parses a BTF file (little-endian, as on x86_64 and aarch64).
    pub fn from_file(path: &Path) -> Result<Btf> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Btf::parse(data).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses BTF bytes: `struct btf_header`, then the type and string sections; every type
    /// and its trailing records must lie inside the type section.
    pub fn parse(d: Vec<u8>) -> Result<Btf> {
        if u16_at(&d, 0)? != BTF_MAGIC {
            bail!("not BTF (magic {:#x})", u16_at(&d, 0)?);
        }
        let hdr_len = u32_at(&d, 4)? as usize;
        let type_off = u32_at(&d, 8)? as usize;
        let type_len = u32_at(&d, 12)? as usize;
        let str_off = u32_at(&d, 16)? as usize;
        let str_len = u32_at(&d, 20)? as usize;
        let types_at = hdr_len + type_off;
        let strs = hdr_len + str_off..hdr_len + str_off + str_len;
        if strs.end > d.len() {
            bail!("string section out of the file");
        }
        let end = types_at + type_len;
        if end > d.len() {
            bail!("type section out of the file");
        }
        let mut types = vec![0u32];
        let mut at = types_at;
        while at < end {
            let h = head_at(&d, at)?;
            let extra = match h.kind {
                1 | 14 | 17 => 4,               // INT, VAR, DECL_TAG
                3 => 12,                        // ARRAY
                4 | 5 | 15 | 19 => h.vlen * 12, // STRUCT, UNION, DATASEC, ENUM64
                6 | 13 => h.vlen * 8,           // ENUM, FUNC_PROTO
                2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, modifiers, FUNC, FLOAT, TYPE_TAG
                k => bail!("unknown BTF kind {k} at type {}", types.len()),
            };
            if at + 12 + extra > end {
                bail!("type {} runs past the type section", types.len());
            }
            types.push(at as u32);
            at += 12 + extra;
        }
        Ok(Btf {
            data: d,
            types,
            strs,
        })
    }

    /// The NUL-terminated string at `off` of the string section (empty when out of it).
    fn name(&self, off: u32) -> &[u8] {
        let s = self.data[self.strs.clone()]
            .get(off as usize..)
            .unwrap_or(&[]);
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        &s[..end]
    }

    /// The head of type `id` (`None` for `void` and ids past the last).
    fn head(&self, id: u32) -> Option<TypeHead> {
        let at = *self.types.get(id as usize).filter(|_| id > 0)?;
        head_at(&self.data, at as usize).ok()
    }

    /// The first type of `kind` named `name`.
    fn id_of(&self, kind: u32, name: &str) -> Option<u32> {
        (1..self.types.len() as u32).find(|&id| {
            self.head(id)
                .is_some_and(|h| h.kind == kind && self.name(h.name_off) == name.as_bytes())
        })
    }

    /// The type ids of the functions `names` (`BTF_KIND_FUNC`), in the order of `names`; a
    /// function the kernel's BTF does not have is left out.
    pub fn func_ids<'a>(&self, names: &[&'a str]) -> Vec<(&'a str, u32)> {
        names
            .iter()
            .filter_map(|&n| self.id_of(KIND_FUNC, n).map(|id| (n, id)))
            .collect()
    }

    /// Byte offset of `member` in `struct name`, looking into anonymous struct and union
    /// members.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = self
            .id_of(KIND_STRUCT, name)
            .ok_or_else(|| anyhow!("no struct {name} in BTF"))?;
        let bits = self
            .find(id, member, 0)
            .ok_or_else(|| anyhow!("no member {member} in struct {name}"))?;
        if bits % 8 != 0 {
            bail!("{name}.{member} is a bitfield");
        }
        Ok(bits / 8)
    }

    /// The members of struct or union `id`: name offset, type id, offset in bits.
    fn members(&self, id: u32) -> Vec<(u32, u32, u32)> {
        let Some(h) = self
            .head(id)
            .filter(|h| h.kind == KIND_STRUCT || h.kind == KIND_UNION)
        else {
            return Vec::new();
        };
        let at = self.types[id as usize] as usize + 12;
        (0..h.vlen)
            .filter_map(|i| {
                let m = at + i * 12;
                let off = u32_at(&self.data, m + 8).ok()?;
                Some((
                    u32_at(&self.data, m).ok()?,
                    u32_at(&self.data, m + 4).ok()?,
                    // With kind_flag, the high 8 bits are a bitfield's size.
                    if h.kind_flag { off & 0xff_ffff } else { off },
                ))
            })
            .collect()
    }

    fn find(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        if depth > 8 {
            return None;
        }
        let members = self.members(id);
        for &(name_off, _, bit_offset) in &members {
            if self.name(name_off) == member.as_bytes() {
                return Some(bit_offset);
            }
        }
        for &(_, type_id, bit_offset) in members.iter().filter(|m| self.name(m.0).is_empty()) {
            let inner = self.strip(type_id);
            if let Some(b) = self.find(inner, member, depth + 1) {
                return Some(bit_offset + b);
            }
        }
        None
    }

    /// The type behind typedefs and modifiers.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.head(id) {
                Some(h) if MODIFIERS.contains(&h.kind) => id = h.size_or_type,
                _ => break,
            }
        }
        id
    }
}

/// The offsets the kernel programs use to identify the file behind an fd, from `btf`.
/// Every one is needed: a missing struct or member is an error naming it.
pub fn file_offsets(btf: &Btf) -> Result<FileOffsets> {
    let o = |s: &str, m: &str| btf.member_offset(s, m);
    let path_dentry = o("path", "dentry")?;
    let path_mnt = o("path", "mnt")?;
    let f_path = o("file", "f_path")?;
    let d_name = o("dentry", "d_name")?;
    Ok(FileOffsets {
        task_files: o("task_struct", "files")?,
        files_fdt: o("files_struct", "fdt")?,
        fdt_max_fds: o("fdtable", "max_fds")?,
        fdt_fd: o("fdtable", "fd")?,
        file_inode: o("file", "f_inode")?,
        file_dentry: f_path + path_dentry,
        file_mnt: f_path + path_mnt,
        inode_mode: o("inode", "i_mode")?,
        inode_rdev: o("inode", "i_rdev")?,
        inode_ino: o("inode", "i_ino")?,
        inode_sb: o("inode", "i_sb")?,
        sb_dev: o("super_block", "s_dev")?,
        dentry_name: d_name + o("qstr", "name")?,
        dentry_parent: o("dentry", "d_parent")?,
        vfsmount_root: o("vfsmount", "mnt_root")?,
        mount_mnt: o("mount", "mnt")?,
        mount_mountpoint: o("mount", "mnt_mountpoint")?,
        mount_parent: o("mount", "mnt_parent")?,
        ready: 1,
        _pad: 0,
    })
}

/// The argument offsets of the fentry/fexit programs, from `btf`: the syscall registers
/// (x86-64 `struct pt_regs`: `di`, `si`, `dx`), `filename.name`, `open_flags.open_flag` and
/// `file.f_flags`.
/// An error (another architecture, a kernel without these members) keeps the fentry
/// backend off.
pub fn fentry_offsets(btf: &Btf) -> Result<FentryOffsets> {
    let o = |s: &str, m: &str| btf.member_offset(s, m);
    Ok(FentryOffsets {
        regs_arg0: o("pt_regs", "di")?,
        regs_arg1: o("pt_regs", "si")?,
        regs_arg2: o("pt_regs", "dx")?,
        filename_name: o("filename", "name")?,
        open_flags_flag: o("open_flags", "open_flag")?,
        file_flags: o("file", "f_flags")?,
        ready: 1,
        _pad: 0,
    })
}

/// What the `sched` raw tracepoints (`agent-ebpf/src/probes/sched.rs`) need of the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedOffsets {
    /// `task_struct.pid` (`include/linux/sched.h`): the child's tid, read in
    /// `sched_process_fork`.
    pub task_pid: u32,
    /// `sched_process_exit` passes `group_dead` as its second argument: its record struct
    /// `trace_event_raw_sched_process_exit` has the member (both come from one `TRACE_EVENT`
    /// in `include/trace/events/sched.h`; 6.18 has it, 6.1 and 6.12 do not).
    pub exit_group_dead: bool,
}

/// [`SchedOffsets`] from `btf`. An error (no `task_struct.pid`) leaves forks unfollowed.
pub fn sched_offsets(btf: &Btf) -> Result<SchedOffsets> {
    Ok(SchedOffsets {
        task_pid: btf.member_offset("task_struct", "pid")?,
        exit_group_dead: btf
            .member_offset("trace_event_raw_sched_process_exit", "group_dead")
            .is_ok(),
    })
}

/// [`file_offsets`] of the running kernel.
pub fn running_kernel_offsets() -> Result<FileOffsets> {
    file_offsets(&running_kernel()?)
}

/// The running kernel's BTF (`/sys/kernel/btf/vmlinux`).
pub fn running_kernel() -> Result<Btf> {
    Btf::from_file(Path::new(VMLINUX_BTF))
}

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `struct outer { int a; union { int b; struct { int c; int d; }; }; }`
    /// built by hand (types: 1 int, 2 anonymous struct {c@0, d@32}, 3 anonymous union
    /// {b@0, <2>@0}, 4 struct outer {a@0, <3>@64}, 5 typedef of 3 not used).
    fn fixture() -> Vec<u8> {
        let strs = b"\0int\0outer\0a\0b\0c\0d\0";
        let s = |n: &str| -> u32 {
            let pos = strs
                .windows(n.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=n.len()] == n.as_bytes() && w[n.len() + 1] == 0)
                .unwrap();
            pos as u32 + 1
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: INT "int" size 4, encoding word
        t.extend([s("int"), 1 << 24, 4, 32]);
        // 2: anonymous STRUCT size 8, 2 members
        t.extend([0, (4 << 24) | 2, 8, s("c"), 1, 0, s("d"), 1, 32]);
        // 3: anonymous UNION size 8, 2 members
        t.extend([0, (5 << 24) | 2, 8, s("b"), 1, 0, 0, 2, 0]);
        // 4: STRUCT outer size 16, 2 members
        t.extend([s("outer"), (4 << 24) | 2, 16, s("a"), 1, 0, 0, 3, 64]);
        // 5: TYPEDEF of 3
        t.extend([0, 8 << 24, 3]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut d = Vec::new();
        d.extend(BTF_MAGIC.to_le_bytes());
        d.push(1); // version
        d.push(0); // flags
        d.extend(24u32.to_le_bytes()); // hdr_len
        d.extend(0u32.to_le_bytes()); // type_off
        d.extend((types.len() as u32).to_le_bytes());
        d.extend((types.len() as u32).to_le_bytes()); // str_off
        d.extend((strs.len() as u32).to_le_bytes());
        d.extend(&types);
        d.extend(strs);
        d
    }

    #[test]
    fn members_through_anonymous_unions() {
        let b = Btf::parse(fixture()).unwrap();
        assert_eq!(b.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(b.member_offset("outer", "b").unwrap(), 8);
        assert_eq!(b.member_offset("outer", "c").unwrap(), 8);
        assert_eq!(b.member_offset("outer", "d").unwrap(), 12);
        let e = b.member_offset("outer", "e").unwrap_err().to_string();
        assert!(e.contains("no member e in struct outer"), "{e}");
        assert!(b.member_offset("inner", "a").is_err());
    }

    #[test]
    fn malformed_blobs_refused() {
        let mut d = fixture();
        assert!(Btf::parse(d[..30].to_vec()).is_err());
        d[0] = 0;
        assert!(Btf::parse(d.clone())
            .unwrap_err()
            .to_string()
            .contains("not BTF"));
        let mut d = fixture();
        // kind 31 in type 1
        d[24 + 7] = 31;
        assert!(Btf::parse(d.clone())
            .unwrap_err()
            .to_string()
            .contains("kind 31"));
    }

    /// Against this machine's kernel: offsets that `include/linux/*.h` fixes for x86_64 on
    /// every kernel since long before 6.1 (`dentry.d_parent` follows `d_flags`, `d_seq`
    /// and `d_hash` = 24; `path` is `{mnt, dentry}`; `qstr.name` follows the 8-byte
    /// `hash_len`) and the rest checked for plausibility only (inside their structs).
    #[test]
    fn running_kernel() {
        let p = Path::new("/sys/kernel/btf/vmlinux");
        if !p.exists() {
            eprintln!("skipped: no {}", p.display());
            return;
        }
        let b = Btf::from_file(p).unwrap();
        assert_eq!(b.member_offset("path", "mnt").unwrap(), 0);
        assert_eq!(b.member_offset("path", "dentry").unwrap(), 8);
        assert_eq!(b.member_offset("qstr", "name").unwrap(), 8);
        assert_eq!(b.member_offset("qstr", "len").unwrap(), 4);
        assert_eq!(b.member_offset("dentry", "d_parent").unwrap(), 24);
        assert_eq!(b.member_offset("vfsmount", "mnt_root").unwrap(), 0);
        let o = file_offsets(&b).unwrap();
        assert_eq!(o.ready, 1);
        assert_eq!(o.file_mnt + 8, o.file_dentry);
        assert!(o.task_files > 0 && o.task_files < 16384, "{o:?}");
        assert!(o.fdt_fd > o.fdt_max_fds, "{o:?}");
        // `struct mount` (fs/mount.h) starts with `mnt_hash`, then `mnt_parent`,
        // `mnt_mountpoint`, `mnt`.
        assert_eq!(o.mount_parent, 16, "{o:?}");
        assert_eq!(o.mount_mountpoint, 24, "{o:?}");
        assert_eq!(o.mount_mnt, 32, "{o:?}");
        assert!(o.inode_rdev > o.inode_mode, "{o:?}");
        let s = sched_offsets(&b).unwrap();
        assert!(s.task_pid > 0 && s.task_pid < 16384, "{s:?}");
        // `pid_t pid; pid_t tgid;` (include/linux/sched.h)
        assert_eq!(
            b.member_offset("task_struct", "tgid").unwrap(),
            s.task_pid + 4
        );
        // Whether the raw tracepoint passes `group_dead` is read from BTF; tracefs says it
        // too, in the event's record format, where tracefs is mounted.
        let format = super::super::tracefs::find().and_then(|t| {
            std::fs::read_to_string(t.join("events/sched/sched_process_exit/format")).ok()
        });
        if let Some(f) = format {
            assert_eq!(s.exit_group_dead, f.contains("group_dead"), "{f}");
        }
    }
}

//! Uprobes on libcuda files: `cuInit` and the CUDA context and device calls each file
//! exports, attached per file (by device and inode) as discovery finds them, detached when
//! the file goes; `LIBCUDA_PROBED` tells the programs which files are probed (an open of
//! any other starts a late cuInit, docs/probes.md#late-cuinit). Each probe is a multi-uprobe
//! link where the kernel has them, else a perf-event uprobe ([`super::uprobe_multi`]).

use std::{
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{HashMap, MapData},
    programs::{
        uprobe::{UProbeLink, UProbeLinkId, UProbeScope},
        UProbe,
    },
};
use uvmwatch_common::{kdev_from, DevFileKey};

use super::{
    registry::{self as probes, Attach, ProbeState},
    uprobe_multi::drop_in_parallel,
    Kernel,
};

/// A libcuda file with uprobes attached.
#[derive(Debug)]
pub(super) struct LibcudaTarget {
    /// Path used to attach (host view, e.g. `/proc/<pid>/root/usr/lib/.../libcuda.so.1`).
    pub path: PathBuf,
    /// The links, by registry index of their probe.
    links: Vec<(usize, UprobeLink)>,
    /// The registry's uprobes not attached to this file, and why.
    missing: Vec<(usize, MissingSymbol)>,
}

/// One uprobe attached to a libcuda file.
#[derive(Debug)]
enum UprobeLink {
    /// A multi-uprobe link (its fd: closing it detaches).
    Multi(OwnedFd),
    /// A perf-event uprobe, owned by its program in aya.
    Perf(UProbeLinkId),
}

/// A uprobe link taken out of its owner, detached when dropped.
enum OwnedUprobeLink {
    Multi(#[allow(dead_code)] OwnedFd),
    Perf(#[allow(dead_code)] UProbeLink),
}

/// Why a uprobe of the registry is not attached to a libcuda file.
#[derive(Clone, Debug)]
enum MissingSymbol {
    /// The file does not export the symbol (an older or newer driver).
    NotExported,
    /// The kernel refused the probe.
    Refused(String),
}

impl Kernel {
    /// Attaches the uprobes of the registry to `path` (a file already known to be new by
    /// device and inode): the `cuInit` pair, which the file must export, and the pairs of
    /// the context and device calls it exports. A call the file does not export (another
    /// driver version), or whose probes the kernel refuses, is left out; the probe's state
    /// says why.
    ///
    /// # Errors
    /// The file is not an ELF exporting `cuInit`, or the kernel refuses its probes.
    pub fn attach_libcuda(&mut self, path: &Path, dev: u64, ino: u64) -> Result<()> {
        if self.targets.contains_key(&(dev, ino)) {
            return Ok(());
        }
        let wanted: Vec<&'static str> = self.uprobe_symbols();
        let defined = symbol_offsets(path, &wanted)?;
        if !defined
            .iter()
            .any(|(s, _)| *s == probes::LIBCUDA_REQUIRED_SYMBOL)
        {
            return Err(anyhow!(
                "{} does not define {}",
                path.display(),
                probes::LIBCUDA_REQUIRED_SYMBOL
            ));
        }
        let mut t = LibcudaTarget {
            path: path.to_path_buf(),
            links: Vec::new(),
            missing: Vec::new(),
        };
        for symbol in wanted {
            let pair: Vec<usize> = (0..self.specs.len())
                .filter(|&i| {
                    matches!(self.specs[i].attach, Attach::Uprobe { symbol: s, .. } if s == symbol)
                })
                .collect();
            if pair.iter().any(|&i| self.program_rejected(i)) {
                continue; // its state says so already
            }
            let Some(&(_, offset)) = defined.iter().find(|(s, _)| *s == symbol) else {
                t.missing
                    .extend(pair.iter().map(|&i| (i, MissingSymbol::NotExported)));
                continue;
            };
            match self.attach_pair(&pair, symbol, offset, path) {
                Ok(links) => t.links.extend(links),
                Err(e) if symbol == probes::LIBCUDA_REQUIRED_SYMBOL => {
                    self.detach_links(t.links);
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(library = %path.display(), symbol, error = %format!("{e:#}"), "uprobe not attached");
                    let why = format!("{e:#}");
                    t.missing.extend(
                        pair.iter()
                            .map(|&i| (i, MissingSymbol::Refused(why.clone()))),
                    );
                }
            }
        }
        self.targets.insert((dev, ino), t);
        // From now on a process that opens this file needs no late cuInit to be seen.
        if let Err(e) = self.mark_probed(dev, ino, true) {
            tracing::warn!(library = %path.display(), error = %format!("{e:#}"), "LIBCUDA_PROBED not updated");
        }
        self.refresh_uprobe_states();
        Ok(())
    }

    /// Adds (or removes) a libcuda file, by `stat`'s device and inode, to `LIBCUDA_PROBED`.
    fn mark_probed(&mut self, dev: u64, ino: u64, probed: bool) -> Result<()> {
        let mut m: HashMap<&mut MapData, DevFileKey, u8> = HashMap::try_from(
            self.bpf
                .map_mut("LIBCUDA_PROBED")
                .context("map LIBCUDA_PROBED")?,
        )?;
        let key = DevFileKey {
            dev: kdev_from(libc::major(dev), libc::minor(dev)),
            _pad: 0,
            ino,
        };
        if probed {
            m.insert(key, 1, 0)?;
        } else {
            let _ = m.remove(&key);
        }
        Ok(())
    }

    /// The symbols the registry's uprobes attach to, each once, in registry order.
    fn uprobe_symbols(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for s in &self.specs {
            if let Attach::Uprobe { symbol, .. } = s.attach {
                if !out.contains(&symbol) {
                    out.push(symbol);
                }
            }
        }
        out
    }

    pub(super) fn program_rejected(&self, i: usize) -> bool {
        matches!(self.states[i], ProbeState::Unavailable(ref s) if s.starts_with("program rejected"))
    }

    /// Attaches the probes `pair` (registry indexes) to `symbol` in `path`: all or none, the
    /// uretprobe first. A call that starts between the two attaches is then one the entry
    /// probe missed (a process that loaded the library before it was probed: a late cuInit,
    /// ended with its real result by the uretprobe), never an entry whose return nobody
    /// sees (in flight until its thread exits).
    fn attach_pair(
        &mut self,
        pair: &[usize],
        symbol: &str,
        offset: u64,
        path: &Path,
    ) -> Result<Vec<(usize, UprobeLink)>> {
        let mut order = pair.to_vec();
        order.sort_by_key(|&i| !matches!(self.specs[i].attach, Attach::Uprobe { ret: true, .. }));
        let mut links = Vec::new();
        for i in order {
            match self.attach_uprobe(i, symbol, offset, path) {
                Ok(l) => links.push((i, l)),
                Err(e) => {
                    self.detach_links(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    /// Attaches probe `i` (a uprobe of the registry) to `symbol`, at file `offset` of `path`:
    /// a multi-uprobe link where the kernel has them, else a perf-event uprobe.
    fn attach_uprobe(
        &mut self,
        i: usize,
        symbol: &str,
        offset: u64,
        path: &Path,
    ) -> Result<UprobeLink> {
        let program = self.specs[i].program;
        let ret = matches!(self.specs[i].attach, Attach::Uprobe { ret: true, .. });
        let context = || format!("attaching {program} to {symbol} in {}", path.display());
        if let Some(multi) = &self.multi {
            return multi
                .attach(program, path, offset, ret)
                .map(UprobeLink::Multi)
                .with_context(context);
        }
        let p: &mut UProbe = self
            .bpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("program {program} missing"))?
            .try_into()?;
        // At the offset found already: by symbol, aya would map and parse the file again.
        p.attach(offset, path, UProbeScope::AllProcesses)
            .map(UprobeLink::Perf)
            .with_context(context)
    }

    /// Takes uprobe links (registry index, link) out of their owners, to be dropped.
    fn take_links(&mut self, links: Vec<(usize, UprobeLink)>) -> Vec<OwnedUprobeLink> {
        let mut owned = Vec::with_capacity(links.len());
        for (i, link) in links {
            match link {
                UprobeLink::Multi(fd) => owned.push(OwnedUprobeLink::Multi(fd)),
                UprobeLink::Perf(id) => {
                    let taken = self
                        .bpf
                        .program_mut(self.specs[i].program)
                        .and_then(|p| <&mut UProbe>::try_from(p).ok())
                        .map(|p| p.take_link(id));
                    if let Some(Ok(l)) = taken {
                        owned.push(OwnedUprobeLink::Perf(l));
                    }
                }
            }
        }
        owned
    }

    /// Detaches uprobe links (registry index, link), several at once
    /// ([`drop_in_parallel`]); errors are ignored (the link is gone).
    fn detach_links(&mut self, links: Vec<(usize, UprobeLink)>) {
        let owned = self.take_links(links);
        drop_in_parallel(owned);
    }

    /// Detaches every libcuda file's probes, several at once: the agent's stop.
    pub(super) fn detach_all_libcudas(&mut self) {
        let targets: Vec<LibcudaTarget> = self.targets.drain().map(|(_, t)| t).collect();
        let links: Vec<(usize, UprobeLink)> = targets.into_iter().flat_map(|t| t.links).collect();
        self.detach_links(links);
    }

    /// Detaches the probes from one libcuda file (e.g. when it was deleted).
    pub fn detach_libcuda(&mut self, dev: u64, ino: u64) -> Result<()> {
        let Some(t) = self.targets.remove(&(dev, ino)) else {
            return Ok(());
        };
        self.mark_probed(dev, ino, false)?;
        self.detach_links(t.links);
        self.refresh_uprobe_states();
        Ok(())
    }

    /// Each uprobe's state from the files probed: attached to how many, else why not
    /// (waiting for a first libcuda, or not exported by any of them).
    fn refresh_uprobe_states(&mut self) {
        let n = self.targets.len();
        for i in 0..self.specs.len() {
            let Attach::Uprobe { symbol, .. } = self.specs[i].attach else {
                continue;
            };
            if self.program_rejected(i) {
                continue;
            }
            let attached = self
                .targets
                .values()
                .filter(|t| t.links.iter().any(|(j, _)| *j == i))
                .count();
            let refused = self.targets.values().find_map(|t| {
                t.missing.iter().find_map(|(j, m)| match m {
                    MissingSymbol::Refused(why) if *j == i => Some(why.clone()),
                    _ => None,
                })
            });
            self.states[i] = if attached > 0 {
                ProbeState::Attached(attached)
            } else if n == 0 {
                ProbeState::Waiting("no libcuda found yet".into())
            } else if let Some(why) = refused {
                ProbeState::Unavailable(why)
            } else if n == 1 {
                ProbeState::Unavailable(format!(
                    "{symbol} not exported by the libcuda probed (another driver version)"
                ))
            } else {
                ProbeState::Unavailable(format!(
                    "{symbol} not exported by any of the {n} libcuda files probed (another driver version)"
                ))
            };
        }
    }

    /// Number of libcuda files with probes attached.
    pub fn libcuda_targets(&self) -> usize {
        self.targets.len()
    }

    /// Paths of the libcuda files with probes attached.
    pub fn libcuda_paths(&self) -> Vec<PathBuf> {
        self.targets.values().map(|t| t.path.clone()).collect()
    }

    /// Whether the uretprobe of context or device call `id` (`uvmwatch_common::context_call`) is
    /// attached to at least one libcuda now.
    pub fn context_call_attached(&self, id: u32) -> bool {
        let symbol = uvmwatch_common::context_call::name(id);
        self.specs.iter().enumerate().any(|(i, s)| {
            matches!(s.attach, Attach::Uprobe { ret: true, symbol: sy } if sy == symbol)
                && matches!(self.states[i], ProbeState::Attached(_))
        })
    }
}

/// Which of `names` the ELF shared object `path` defines (in its dynamic or static symbol
/// table), in the order of `names`, each with its file offset (where a uprobe goes: the
/// address less its section's, plus the section's offset in the file, as aya resolves a
/// symbol for a uprobe).
///
/// Only the ELF headers and the symbol and string tables are read, not the whole file: a
/// real libcuda is about 100 MiB (580.159.04's `libcuda.so.1`), and reading it whole set the
/// agent's peak memory (`VmHWM` 103.6 MiB on an H200 machine with two of them,
/// docs/validation/2026-12-04-h200).
///
/// # Errors
/// Unreadable file, or not an ELF.
pub fn symbol_offsets(path: &Path, names: &[&'static str]) -> Result<Vec<(&'static str, u64)>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    symbol_offsets_in(file, names).with_context(|| format!("reading {}", path.display()))
}

/// [`symbol_offsets`] of an ELF read from `source`, a range at a time.
fn symbol_offsets_in(
    source: impl std::io::Read + std::io::Seek,
    names: &[&'static str],
) -> Result<Vec<(&'static str, u64)>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = object::ReadCache::new(Blocks::new(source)?);
    let file = object::File::parse(&data).context("not an ELF object")?;
    let mut found: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if found.contains_key(name) || !names.contains(&name) {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            continue;
        };
        let Some((file_offset, _)) = section.file_range() else {
            continue;
        };
        found.insert(name, sym.address() - section.address() + file_offset);
    }
    Ok(names
        .iter()
        .filter_map(|n| found.get(n).map(|&o| (*n, o)))
        .collect())
}

/// How much of a libcuda [`Blocks`] reads at a time, and how many such blocks it keeps.
const BLOCK: usize = 64 * 1024;
const BLOCKS_KEPT: usize = 16;

/// A file read a [`BLOCK`] at a time, the last [`BLOCKS_KEPT`] kept (1 MiB at most): the
/// parse of an ELF's symbols reads each name on its own (object's `ReadCache`, 256 bytes a
/// read, in the string table's order, not the file's), two system calls a symbol, and a real
/// libcuda exports over a thousand; this turns them into a few reads.
struct Blocks<R> {
    inner: R,
    len: u64,
    pos: u64,
    /// Blocks by where they start in the file (a multiple of [`BLOCK`]), the oldest first.
    kept: std::collections::VecDeque<(u64, Vec<u8>)>,
}

impl<R: std::io::Read + std::io::Seek> Blocks<R> {
    fn new(mut inner: R) -> std::io::Result<Self> {
        let len = inner.seek(std::io::SeekFrom::End(0))?;
        Ok(Blocks {
            inner,
            len,
            pos: 0,
            kept: std::collections::VecDeque::with_capacity(BLOCKS_KEPT),
        })
    }

    /// The block holding `pos`: where it starts, and its bytes.
    fn block(&mut self) -> std::io::Result<&(u64, Vec<u8>)> {
        let start = self.pos - self.pos % BLOCK as u64;
        if let Some(i) = self.kept.iter().position(|(s, _)| *s == start) {
            return Ok(&self.kept[i]);
        }
        if self.kept.len() == BLOCKS_KEPT {
            self.kept.pop_front();
        }
        self.inner.seek(std::io::SeekFrom::Start(start))?;
        let mut bytes = Vec::with_capacity(BLOCK);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut self.inner, BLOCK as u64),
            &mut bytes,
        )?;
        self.kept.push_back((start, bytes));
        Ok(self.kept.back().expect("just pushed"))
    }
}

impl<R: std::io::Read + std::io::Seek> std::io::Read for Blocks<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let pos = self.pos;
        let (start, bytes) = self.block()?;
        let at = (pos - start) as usize;
        let n = buf.len().min(bytes.len().saturating_sub(at));
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R> std::io::Seek for Blocks<R> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            std::io::SeekFrom::Start(p) => Some(p),
            std::io::SeekFrom::End(d) => self.len.checked_add_signed(d),
            std::io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        io::{Read, Seek, SeekFrom},
        sync::{
            atomic::{AtomicU64, Ordering},
            Arc,
        },
    };

    /// An ELF relocatable object with `cuInit` and `cuDeviceGetCount` in its 150 KiB `.text`,
    /// at 0x10 and 0x24030, among 5000 other symbols (tables over several [`BLOCK`]s, as a
    /// real libcuda's are), and the file offset of `.text`.
    fn elf_with_symbols() -> (Vec<u8>, u64) {
        use object::write::{Object, Symbol, SymbolSection};
        use object::{
            Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope,
        };
        let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let text = obj.section_id(object::write::StandardSection::Text);
        obj.append_section_data(text, &vec![0x90; 150 * 1024], 16);
        let others = (0..5000).map(|i| (format!("cuOther{i}"), 0x40 + i));
        let wanted = [("cuInit", 0x10), ("cuDeviceGetCount", 0x24030)];
        let all = others.chain(wanted.map(|(n, v)| (n.to_string(), v)));
        for (name, value) in all {
            obj.add_symbol(Symbol {
                name: name.into_bytes(),
                value,
                size: 8,
                kind: SymbolKind::Text,
                scope: SymbolScope::Dynamic,
                weak: false,
                section: SymbolSection::Section(text),
                flags: SymbolFlags::None,
            });
        }
        let bytes = obj.write().unwrap();
        let parsed = object::File::parse(&*bytes).unwrap();
        use object::{Object as _, ObjectSection};
        let text_offset = parsed
            .section_by_name(".text")
            .unwrap()
            .file_range()
            .unwrap()
            .0;
        (bytes, text_offset)
    }

    /// `elf` followed by zeros up to `len` bytes (a file as large as a real libcuda, without
    /// the memory), counting the bytes read from it.
    struct Padded {
        elf: Vec<u8>,
        len: u64,
        pos: u64,
        read: Arc<AtomicU64>,
    }

    impl Read for Padded {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.len.saturating_sub(self.pos) as usize);
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = self.elf.get(self.pos as usize + i).copied().unwrap_or(0);
            }
            self.pos += n as u64;
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            Ok(n)
        }
    }

    impl Seek for Padded {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.pos = match to {
                SeekFrom::Start(p) => p,
                SeekFrom::End(d) => self.len.saturating_add_signed(d),
                SeekFrom::Current(d) => self.pos.saturating_add_signed(d),
            };
            Ok(self.pos)
        }
    }

    #[test]
    fn symbols_are_found_at_their_file_offsets() {
        let (elf, text) = elf_with_symbols();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libcuda.so.1");
        std::fs::write(&path, &elf).unwrap();
        let found = symbol_offsets(&path, &["cuDeviceGetCount", "cuCtxCreate", "cuInit"]).unwrap();
        assert_eq!(
            found,
            [
                ("cuDeviceGetCount", text + 0x24030),
                ("cuInit", text + 0x10)
            ]
        );
        std::fs::write(&path, b"not an ELF").unwrap();
        let err = format!("{:#}", symbol_offsets(&path, &["cuInit"]).unwrap_err());
        assert!(err.contains("not an ELF object"), "{err}");
    }

    /// A 1 GiB file (a real libcuda is about 100 MiB) is read only where its headers and
    /// symbols are: the whole file read at once set the agent's peak memory on a GPU machine.
    #[test]
    fn a_large_library_is_read_only_where_its_symbols_are() {
        let (elf, text) = elf_with_symbols();
        let read = Arc::new(AtomicU64::new(0));
        let source = Padded {
            len: 1 << 30,
            elf,
            pos: 0,
            read: read.clone(),
        };
        let found = symbol_offsets_in(source, &["cuInit"]).unwrap();
        assert_eq!(found, [("cuInit", text + 0x10)]);
        let read = read.load(Ordering::Relaxed);
        assert!(read < 1 << 20, "{read} bytes read of a 1 GiB file");
    }
}

//! Uprobes on libcuda files: `cuInit` and the CUDA context and device calls each file
//! exports, attached per file (by device and inode) as discovery finds them, detached when
//! the file goes; `LIBCUDA_PROBED` tells the programs which files are probed (an open of
//! any other starts a late cuInit, docs/probes.md#late-cuinit).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{HashMap, MapData},
    programs::{
        uprobe::{UProbeLinkId, UProbeScope},
        UProbe,
    },
};
use uvmwatch_common::{kdev_from, DevFileKey};

use super::{
    registry::{self as probes, Attach, ProbeState},
    Kernel,
};

/// A libcuda file with uprobes attached.
#[derive(Debug)]
pub(super) struct LibcudaTarget {
    /// Path used to attach (host view, e.g. `/proc/<pid>/root/usr/lib/.../libcuda.so.1`).
    pub path: PathBuf,
    /// The links, by registry index of their probe.
    links: Vec<(usize, UProbeLinkId)>,
    /// The registry's uprobes not attached to this file, and why.
    missing: Vec<(usize, MissingSymbol)>,
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
        let defined = defined_symbols(path, &wanted)?;
        if !defined.contains(&probes::LIBCUDA_REQUIRED_SYMBOL) {
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
            if !defined.contains(&symbol) {
                t.missing
                    .extend(pair.iter().map(|&i| (i, MissingSymbol::NotExported)));
                continue;
            }
            match self.attach_pair(&pair, symbol, path) {
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

    fn program_rejected(&self, i: usize) -> bool {
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
        path: &Path,
    ) -> Result<Vec<(usize, UProbeLinkId)>> {
        let mut order = pair.to_vec();
        order.sort_by_key(|&i| !matches!(self.specs[i].attach, Attach::Uprobe { ret: true, .. }));
        let mut links = Vec::new();
        for i in order {
            let program = self.specs[i].program;
            match self.attach_uprobe(program, symbol, path) {
                Ok(l) => links.push((i, l)),
                Err(e) => {
                    self.detach_links(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    fn attach_uprobe(&mut self, program: &str, symbol: &str, path: &Path) -> Result<UProbeLinkId> {
        let p: &mut UProbe = self
            .bpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("program {program} missing"))?
            .try_into()?;
        p.attach(symbol, path, UProbeScope::AllProcesses)
            .with_context(|| format!("attaching {program} to {symbol} in {}", path.display()))
    }

    /// Detaches uprobe links (registry index, link); errors are ignored (the link is gone).
    /// Each detach waits for an RCU tasks-trace grace period in the kernel
    /// (`uprobe_unregister_sync`, under a lock: detaches cannot overlap).
    fn detach_links(&mut self, links: Vec<(usize, UProbeLinkId)>) {
        for (i, link) in links {
            let program = self.specs[i].program;
            if let Some(p) = self.bpf.program_mut(program) {
                if let Ok(p) = <&mut UProbe>::try_from(p) {
                    let _ = p.detach(link);
                }
            }
        }
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
/// table), in the order of `names`.
///
/// # Errors
/// Unreadable file, or not an ELF.
pub fn defined_symbols(path: &Path, names: &[&'static str]) -> Result<Vec<&'static str>> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF object", path.display()))?;
    let defined: std::collections::HashSet<&str> = file
        .dynamic_symbols()
        .chain(file.symbols())
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok())
        .collect();
    Ok(names
        .iter()
        .copied()
        .filter(|n| defined.contains(n))
        .collect())
}

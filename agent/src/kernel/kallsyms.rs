//! Resolving kernel and module function names in `/proc/kallsyms`.
//!
//! Kprobes attach by symbol name. gcc may emit a static function only as a clone with a
//! suffix (`uvm_ioctl.part.0`, `foo.isra.0`, `bar.constprop.0`), so a name is looked up
//! exactly first and then by those clone suffixes. `.cold` parts are not entry points and
//! are never chosen. Module symbols carry their module in brackets: `uvm_api_register_gpu
//! [nvidia_uvm]`.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    path::Path,
};

use anyhow::{Context, Result};

/// One text symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Name as in kallsyms, clone suffix included.
    pub name: String,
    /// Module name, `None` for the core kernel.
    pub module: Option<String>,
}

/// The text (function) symbols of kallsyms that some names ask for, and the modules listed.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    syms: Vec<Symbol>,
    modules: BTreeSet<String>,
}

/// Suffixes gcc gives clones of a function that are still entry points.
const CLONE_MARKERS: &[&str] = &[".part.", ".isra.", ".constprop.", ".llvm."];

impl Kallsyms {
    /// Parses the text of `/proc/kallsyms`; keeps the text symbols (`t`/`T`) named by
    /// `wanted` or by a name that starts with one of them (its clones).
    pub fn parse(text: &str, wanted: &[&str]) -> Kallsyms {
        let mut k = Kallsyms::default();
        for l in text.lines() {
            k.add_line(l, wanted);
        }
        k
    }

    /// Reads a kallsyms file (normally `/proc/kallsyms`) line by line, keeping what
    /// [`Kallsyms::parse`] keeps. The file is 5-10 MB on a distribution kernel (some 200 000
    /// symbols): read whole and kept whole, it was most of the agent's peak memory where
    /// the kernel has kprobes (issue 21).
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn read(path: &Path, wanted: &[&str]) -> Result<Kallsyms> {
        let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        let mut r = BufReader::new(f);
        let mut k = Kallsyms::default();
        let mut line = String::new();
        loop {
            line.clear();
            let n = r
                .read_line(&mut line)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                return Ok(k);
            }
            k.add_line(&line, wanted);
        }
    }

    fn add_line(&mut self, l: &str, wanted: &[&str]) {
        let mut it = l.split_whitespace();
        let (Some(_addr), Some(ty), Some(name)) = (it.next(), it.next(), it.next()) else {
            return;
        };
        if !matches!(ty, "t" | "T") {
            return;
        }
        let module = it
            .next()
            .map(|m| m.trim_start_matches('[').trim_end_matches(']'));
        if let Some(m) = module {
            if !self.modules.contains(m) {
                self.modules.insert(m.to_string());
            }
        }
        if wanted.iter().any(|w| name.starts_with(w)) {
            self.syms.push(Symbol {
                name: name.to_string(),
                module: module.map(str::to_string),
            });
        }
    }

    /// The name to attach to for function `name` (in `module`, or the core kernel when
    /// `None`): the exact symbol, else its first clone. `None` when absent.
    pub fn resolve(&self, name: &str, module: Option<&str>) -> Option<String> {
        let in_module = |s: &&Symbol| s.module.as_deref() == module;
        if self.syms.iter().filter(in_module).any(|s| s.name == name) {
            return Some(name.to_string());
        }
        self.syms
            .iter()
            .filter(in_module)
            .find(|s| {
                s.name
                    .strip_prefix(name)
                    .is_some_and(|rest| CLONE_MARKERS.iter().any(|m| rest.starts_with(m)))
            })
            .map(|s| s.name.clone())
    }

    /// Whether any text symbol of `module` is listed (the module is loaded).
    pub fn has_module(&self, module: &str) -> bool {
        self.modules.contains(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffff81234560 T request_free_mem_region
ffffffff81234600 T memremap_pages
ffffffff81234700 t hmm_range_fault
ffffffff81234800 t migrate_vma_setup.constprop.0
ffffffff81234900 t migrate_vma_pages.cold
ffffffff81234a00 d some_data
ffffffffc0a01000 t uvm_ioctl.part.0\t[nvidia_uvm]
ffffffffc0a02000 t uvm_api_register_gpu\t[nvidia_uvm]
ffffffffc0a03000 t uvm_gpu_retain_by_uuid.isra.0\t[nvidia_uvm]
ffffffffc0b00000 t nv_open\t[nvidia]
ffffffffc0a04000 t uvm_va_space_register_gpu.cold\t[nvidia_uvm]
";

    #[test]
    fn resolves_exact_clone_and_module_names() {
        let wanted = [
            "request_free_mem_region",
            "migrate_vma_setup",
            "migrate_vma_pages",
            "uvm_ioctl",
            "uvm_gpu_retain_by_uuid",
            "uvm_va_space_register_gpu",
            "some_data",
            "uvm_api_register",
            "hmm_range_fault",
        ];
        let k = Kallsyms::parse(SAMPLE, &wanted);
        assert_eq!(
            k.resolve("request_free_mem_region", None).as_deref(),
            Some("request_free_mem_region")
        );
        assert_eq!(
            k.resolve("migrate_vma_setup", None).as_deref(),
            Some("migrate_vma_setup.constprop.0")
        );
        assert_eq!(
            k.resolve("uvm_ioctl", Some("nvidia_uvm")).as_deref(),
            Some("uvm_ioctl.part.0")
        );
        assert_eq!(
            k.resolve("uvm_gpu_retain_by_uuid", Some("nvidia_uvm"))
                .as_deref(),
            Some("uvm_gpu_retain_by_uuid.isra.0")
        );
        // .cold parts are not entry points; data symbols are not functions.
        assert_eq!(k.resolve("migrate_vma_pages", None), None);
        assert_eq!(
            k.resolve("uvm_va_space_register_gpu", Some("nvidia_uvm")),
            None
        );
        assert_eq!(k.resolve("some_data", None), None);
        // Module matters: a core lookup does not find a module symbol and vice versa.
        assert_eq!(k.resolve("uvm_api_register_gpu", None), None);
        assert_eq!(k.resolve("hmm_range_fault", Some("nvidia_uvm")), None);
        // A name that is only a prefix of another is not a clone.
        assert_eq!(k.resolve("uvm_api_register", Some("nvidia_uvm")), None);
        assert!(k.has_module("nvidia_uvm"));
        // A module is listed whether or not one of its symbols was asked for.
        assert!(k.has_module("nvidia"));
        assert!(!k.has_module("nvidia_modeset"));
        // Only what was asked for is kept.
        assert_eq!(k.resolve("memremap_pages", None), None);
        assert_eq!(k.resolve("nv_open", Some("nvidia")), None);
        assert_eq!(k.syms.len(), 8);
    }

    #[test]
    fn reads_this_kernels_kallsyms() {
        let k = Kallsyms::read(Path::new("/proc/kallsyms"), &["do_sys_open"]).unwrap();
        // Present on every kernel this agent supports.
        assert!(
            k.resolve("do_sys_openat2", None).is_some() || k.resolve("do_sys_open", None).is_some()
        );
    }
}

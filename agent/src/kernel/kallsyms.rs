//! Resolving kernel and module function names in `/proc/kallsyms`.
//!
//! Kprobes attach by symbol name. gcc may emit a static function only as a clone with a
//! suffix (`uvm_ioctl.part.0`, `foo.isra.0`, `bar.constprop.0`), so a name is looked up
//! exactly first and then by those clone suffixes. `.cold` parts are not entry points and
//! are never chosen. Module symbols carry their module in brackets: `uvm_api_register_gpu
//! [nvidia_uvm]`.

use std::path::Path;

use anyhow::{Context, Result};

/// One text symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Name as in kallsyms, clone suffix included.
    pub name: String,
    /// Module name, `None` for the core kernel.
    pub module: Option<String>,
}

/// Text (function) symbols from kallsyms.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    syms: Vec<Symbol>,
}

/// Suffixes gcc gives clones of a function that are still entry points.
const CLONE_MARKERS: &[&str] = &[".part.", ".isra.", ".constprop.", ".llvm."];

impl Kallsyms {
    /// Parses the text of `/proc/kallsyms`; keeps text symbols (`t`/`T`).
    pub fn parse(text: &str) -> Kallsyms {
        let syms = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let _addr = it.next()?;
                let ty = it.next()?;
                let name = it.next()?;
                if !matches!(ty, "t" | "T") {
                    return None;
                }
                let module = it
                    .next()
                    .map(|m| m.trim_start_matches('[').trim_end_matches(']').to_string());
                Some(Symbol {
                    name: name.to_string(),
                    module,
                })
            })
            .collect();
        Kallsyms { syms }
    }

    /// Reads and parses a kallsyms file (normally `/proc/kallsyms`).
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn read(path: &Path) -> Result<Kallsyms> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Kallsyms::parse(&text))
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

    /// Whether any symbol of `module` is listed (the module is loaded).
    pub fn has_module(&self, module: &str) -> bool {
        self.syms
            .iter()
            .any(|s| s.module.as_deref() == Some(module))
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
        let k = Kallsyms::parse(SAMPLE);
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
        assert!(!k.has_module("nvidia_modeset"));
    }

    #[test]
    fn reads_this_kernels_kallsyms() {
        let k = Kallsyms::read(Path::new("/proc/kallsyms")).unwrap();
        // Present on every kernel this agent supports.
        assert!(
            k.resolve("do_sys_openat2", None).is_some() || k.resolve("do_sys_open", None).is_some()
        );
    }
}

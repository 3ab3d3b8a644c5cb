//! Ollama model names: a runner is given its model as a blob path; the manifests under the
//! process's root name it.

use std::fs;
use std::path::Path;

use super::quantization::quant_from_model_name;
use super::{base, truncate, WorkloadInfo, ENGINE_OLLAMA};
use crate::host::files::{self, read_capped};

/// For an Ollama runner whose model is a blob path (`.../models/blobs/sha256-<hex>`): the
/// `name:tag` whose manifest (`.../models/manifests/<registry>/<namespace>/<name>/<tag>`)
/// lists that digest, read through the process's root. `library/` and the default registry
/// are left out of the name as Ollama prints it. `None` when not found.
pub fn ollama_model_name(proc_root: &Path, pid: u32, blob: &str) -> Option<String> {
    let blob_path = Path::new(blob);
    let file = blob_path.file_name()?.to_str()?;
    let digest = file.strip_prefix("sha256-")?;
    let models = blob_path.parent()?.parent()?;
    let root = proc_root.join(pid.to_string()).join("root");
    let manifests = files::resolve(&root, None, &models.join("manifests")).ok()?;
    let needle = format!("sha256:{digest}");
    let mut budget = 2000usize;
    find_manifest(&manifests, &manifests, &needle, 0, &mut budget)
}

fn find_manifest(
    top: &Path,
    dir: &Path,
    needle: &str,
    depth: usize,
    budget: &mut usize,
) -> Option<String> {
    let rd = fs::read_dir(dir).ok()?;
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        let Ok(ft) = e.file_type() else { continue };
        let path = e.path();
        if ft.is_dir() && depth < 3 {
            if let Some(n) = find_manifest(top, &path, needle, depth + 1, budget) {
                return Some(n);
            }
        } else if ft.is_file() && depth == 3 {
            let Some(text) = read_capped(&path, 256 << 10) else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
                continue;
            };
            let hit = v["layers"].as_array().is_some_and(|ls| {
                ls.iter().any(|l| {
                    l["digest"] == needle
                        && l["mediaType"]
                            .as_str()
                            .is_some_and(|m| m.ends_with(".model"))
                })
            });
            if hit {
                let rel = path.strip_prefix(top).ok()?;
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let [registry, ns, name, tag] = parts.as_slice() else {
                    continue;
                };
                let mut full = String::new();
                if registry != "registry.ollama.ai" {
                    full.push_str(&format!("{registry}/{ns}/"));
                } else if ns != "library" {
                    full.push_str(&format!("{ns}/"));
                }
                full.push_str(&format!("{name}:{tag}"));
                return Some(full);
            }
        }
    }
    None
}

/// An Ollama runner's model given as a blob path becomes the `name:tag` it belongs to
/// ([`ollama_model_name`]), or `sha256-<12 hex>` when no manifest names it.
pub(super) fn resolve_ollama_blob(proc_root: &Path, pid: u32, info: &mut WorkloadInfo) {
    if info.engine.as_deref() != Some(ENGINE_OLLAMA) {
        return;
    }
    let Some(m) = info.model.clone() else { return };
    if !m.contains("/blobs/sha256-") {
        return;
    }
    match ollama_model_name(proc_root, pid, &m) {
        Some(name) => {
            if info.quantization.is_none() {
                info.quantization = quant_from_model_name(&name);
            }
            info.model = Some(name);
        }
        None => info.model = Some(truncate(base(&m), 19).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_blob_resolves_to_name_through_the_manifests() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("4242/root");
        let models = root.join("root/.ollama/models");
        let digest = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa";
        let man = models.join("manifests/registry.ollama.ai/library/llama3.1");
        fs::create_dir_all(&man).unwrap();
        fs::write(
            man.join("8b-instruct-q4_K_M"),
            format!(
                r#"{{"schemaVersion":2,"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{digest}","size":1}},{{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:00","size":1}}]}}"#
            ),
        )
        .unwrap();
        let other = models.join("manifests/registry.ollama.ai/library/qwen2/latest");
        fs::create_dir_all(other.parent().unwrap()).unwrap();
        fs::write(&other, r#"{"layers":[]}"#).unwrap();
        let blob = format!("/root/.ollama/models/blobs/sha256-{digest}");
        let name = ollama_model_name(t.path(), 4242, &blob);
        assert_eq!(name.as_deref(), Some("llama3.1:8b-instruct-q4_K_M"));
        assert_eq!(
            quant_from_model_name(name.as_deref().unwrap()).as_deref(),
            Some("q4_k_m")
        );
        assert_eq!(
            ollama_model_name(t.path(), 4242, "/elsewhere/blobs/sha256-00"),
            None
        );
    }
}

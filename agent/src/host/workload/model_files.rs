//! Quantization a local model directory states in its own files: the checkpoint that is
//! loaded, whatever its name says.
//!
//! When the model is a path (`vllm serve /models/llama-fp4`, `--model-path ./ckpt`), the
//! engines read its quantization from that directory, and so does this, as vLLM does
//! (vllm-project/vllm, `vllm/transformers_utils/config.py` `get_config` and
//! `model_arch_config_convertor.py` `_normalize_quantization_config`):
//!
//! - `config.json`'s `quantization_config` (or `compression_config`, its older
//!   compressed-tensors name): `quant_method` (`fp8`, `fbgemm_fp8`, `awq`, `gptq`, `mxfp4`,
//!   `bitsandbytes`, ...); `modelopt` with its `quant_algo` (`NVFP4`, `FP8`, ...); or, for
//!   `compressed-tensors` checkpoints, the `format` of the checkpoint or of its
//!   `config_groups` (`nvfp4-pack-quantized`, `float-quantized`, ...), else the groups'
//!   weights (`float` 4 bits in groups of 16 is NVFP4: vLLM's `_is_fp4a4_nvfp4`);
//! - only without it, `hf_quant_config.json`, which NVIDIA's TensorRT Model Optimizer
//!   (modelopt) 0.29 and older write beside the checkpoint: `{"producer": {"name":
//!   "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}`, read only when the producer is
//!   modelopt.
//!
//! Mixed checkpoints (NVFP4 layers beside FP8 ones) are named by their narrowest format:
//! NVFP4 is what needs Blackwell's FP4 kernels.
//!
//! Only those two files are read, below the process's own root, each refused past
//! [`MAX_CONFIG_FILE`] (a cut JSON file says nothing); nothing else of the directory (no
//! weights, no tokenizer) is touched.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::super::files::{read_below, Overflow, ReadLimit};
use super::quantization::normalised;

/// Most of a configuration file read: real ones are a few KiB (a long `exclude_modules`
/// list of a large MoE model some tens of KiB); a larger one is not a configuration file.
pub const MAX_CONFIG_FILE: u64 = 1 << 20;

/// The quantization stated by the model directory `model` of process `pid`, read below
/// `<proc_root>/<pid>/root`: `config.json`'s, else `hf_quant_config.json`'s. `None` when
/// `model` is not a local path (a Hugging Face id, an Ollama name), when neither file is
/// there or readable, or when they state no quantization.
pub fn quantization_from_model_files(proc_root: &Path, pid: u32, model: &str) -> Option<String> {
    let dir = local_model_dir(proc_root, pid, model)?;
    let root = proc_root.join(pid.to_string()).join("root");
    let read = |name: &str| -> Option<Value> {
        let limit = ReadLimit {
            bytes: MAX_CONFIG_FILE,
            overflow: Overflow::Refuse,
        };
        let file = read_below(&root, &dir.join(name), limit).ok()?;
        serde_json::from_slice(&file.bytes).ok()
    };
    match read("config.json").and_then(|c| {
        c.get("quantization_config")
            .or_else(|| c.get("compression_config"))
            .cloned()
    }) {
        Some(q) => from_quantization_config(&q),
        None => read("hf_quant_config.json").and_then(|q| from_quantization_config(&q)),
    }
}

/// `model` as a directory path in the process's file system: absolute as it is, relative
/// (`./ckpt`, `models/x`) against the process's working directory. A Hugging Face id
/// (`org/name`) is relative too: it is a model directory only where the process has one of
/// that name, as the engines themselves decide (a local directory wins over the hub).
fn local_model_dir(proc_root: &Path, pid: u32, model: &str) -> Option<PathBuf> {
    if model.is_empty() || model.contains("://") || model.contains('\0') {
        return None;
    }
    let path = Path::new(model);
    if path.is_absolute() {
        return Some(path.to_path_buf());
    }
    let cwd = std::fs::read_link(proc_root.join(pid.to_string()).join("cwd")).ok()?;
    cwd.is_absolute().then(|| cwd.join(path))
}

/// A `quantization_config` object, or the whole of `hf_quant_config.json`.
fn from_quantization_config(q: &Value) -> Option<String> {
    // modelopt's own shape: its producer and the algorithm under `quantization`.
    if let Some(nested) = q.get("quantization").filter(|n| n.is_object()) {
        let producer = q.get("producer").and_then(|p| p.get("name"));
        return if producer.and_then(Value::as_str) == Some("modelopt") {
            nested.get("quant_algo").and_then(modelopt_algo)
        } else {
            None
        };
    }
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase();
    if method.starts_with("modelopt") {
        return q.get("quant_algo").and_then(modelopt_algo);
    }
    match method.as_str() {
        "compressed-tensors" | "compressed_tensors" => compressed_tensors(q),
        "" => None,
        other => normalised(other),
    }
}

/// modelopt's algorithm names: `NVFP4` and `W4A16_NVFP4` (vLLM's `ModelOptNvFp4Config`
/// takes any name with `FP4`), `FP8`, `FP8_PER_CHANNEL_PER_TOKEN`, `FP8_PB_WO`, `MXFP8`,
/// `MIXED_PRECISION` (vllm `modelopt.py`, `QUANT_ALGOS`).
fn modelopt_algo(v: &Value) -> Option<String> {
    let a = v.as_str()?.to_ascii_uppercase();
    Some(
        if a.contains("FP4") {
            "nvfp4"
        } else if a == "MXFP8" {
            "mxfp8"
        } else if a.starts_with("FP8") {
            "fp8"
        } else if a == "MIXED_PRECISION" {
            "mixed"
        } else {
            return normalised(&a.to_ascii_lowercase());
        }
        .to_string(),
    )
}

/// Formats from narrowest to widest: a mixed checkpoint is named by the first it has.
const NARROWEST_FIRST: &[&str] = &["nvfp4", "mxfp4", "int4", "fp8", "int8"];

/// A compressed-tensors `quantization_config`: the narrowest of the checkpoint's `format`
/// and its `config_groups`' formats (a group without one: its weights).
fn compressed_tensors(q: &Value) -> Option<String> {
    let format_of = |f: &str| -> Option<&'static str> {
        Some(match f {
            "nvfp4-pack-quantized" => "nvfp4",
            "mxfp4-pack-quantized" => "mxfp4",
            "float-quantized" | "naive-quantized-fp8" => "fp8",
            "int-quantized" => "int8",
            "pack-quantized" | "marlin-24" => "int4",
            _ => return None,
        })
    };
    let mut found: Vec<&'static str> = Vec::new();
    if let Some(f) = q.get("format").and_then(Value::as_str).and_then(format_of) {
        found.push(f);
    }
    let groups = q.get("config_groups").and_then(Value::as_object);
    for group in groups.into_iter().flat_map(|g| g.values()) {
        let f = group
            .get("format")
            .and_then(Value::as_str)
            .and_then(format_of);
        if let Some(f) = f.or_else(|| weights_of(group)) {
            found.push(f);
        }
    }
    NARROWEST_FIRST
        .iter()
        .find(|n| found.contains(n))
        .map(|n| n.to_string())
}

/// A compressed-tensors group's weights: `float` 4 bits in groups of 16 is NVFP4 (32:
/// MXFP4), `float` 8 is FP8, `int` 4 or 8 the integer formats.
fn weights_of(group: &Value) -> Option<&'static str> {
    let w = group.get("weights")?;
    let bits = w.get("num_bits")?.as_u64()?;
    let kind = w.get("type").and_then(Value::as_str).unwrap_or("int");
    let group_size = w.get("group_size").and_then(Value::as_u64);
    Some(match (kind, bits) {
        ("float", 4) if group_size == Some(32) => "mxfp4",
        ("float", 4) => "nvfp4",
        ("float", 8) => "fp8",
        ("int", 4) => "int4",
        ("int", 8) => "int8",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    //! Real checkpoints' quantization, each from its source. A `config.json` case keeps the
    //! file's `quantization_config` (or `compression_config`) verbatim inside a minimal
    //! `config.json` (its other keys say nothing of quantization and are left out).

    use super::*;
    use std::fs;

    /// `hf_quant_config.json` of nvidia's Llama-3.1-8B NVFP4 (modelopt 0.37), whole file: a
    /// copy in sgl-project/ome, `pkg/modelconfig/testdata/quant/nvidia-llama-3-1-8b-nvfp4/
    /// hf_quant_config.json` at 8925392756c1.
    const LLAMA_8B_NVFP4: &str = r#"{
    "producer": {
        "name": "modelopt",
        "version": "0.37.0.dev5+g76fb12d47.d20250905"
    },
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
        "group_size": 16,
        "exclude_modules": [
            "lm_head"
        ]
    }
}"#;

    /// `hf_quant_config.json` of nvidia/Llama-3.3-70B-Instruct-FP4 (modelopt 0.23), quoted
    /// "verbatim" in sgl-project/ome `pkg/modelconfig/quant_config_test.go` at 015070c9661c.
    const LLAMA_70B_FP4: &str = r#"{
    "producer": {"name": "modelopt", "version": "0.23.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                     "exclude_modules": ["lm_head"]}
}"#;

    /// `hf_quant_config.json` of nvidia/Llama-3.1-*-Instruct-FP8 (modelopt 0.23.0rc1), quoted
    /// in NVIDIA/TensorRT-LLM `docs/source/performance/perf-benchmarking.md` at 04276b44f20b
    /// (the quote lacks its closing brace, added here).
    const LLAMA_FP8_MODELOPT: &str = r#"{
    "producer": {
        "name": "modelopt",
        "version": "0.23.0rc1"
    },
    "quantization": {
        "quant_algo": "FP8",
        "kv_cache_quant_algo": null
    }
}"#;

    /// A near miss: the modelopt shape from another producer
    /// (huggingface.co/GadflyII/MiniMax-M2.1-NVFP4, `hf_quant_config.json`): vLLM gives it no
    /// quantization method (`producer.name` is not `modelopt`), so neither does this.
    const OTHER_PRODUCER: &str = r#"{
    "producer": {"name": "shared-scales-nvfp4", "version": "1.0.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16}
}"#;

    /// compressed-tensors NVFP4 (auto-round), whole `quantization_config.json` of
    /// huggingface.co/BrainForge/Devstral-2-123B-Instruct-2512-NVFP4: the object a
    /// compressed-tensors `config.json` carries as `quantization_config`.
    const DEVSTRAL_NVFP4: &str = r#"{
  "config_groups": {
    "group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
        "strategy": "tensor_group", "block_structure": null, "dynamic": false, "actorder": null,
        "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": null, "observer": "static_minmax",
        "observer_kwargs": {}},
      "input_activations": {"num_bits": 4, "type": "float", "symmetric": true,
        "group_size": 16, "strategy": "tensor_group", "block_structure": null,
        "dynamic": "local", "actorder": null, "scale_dtype": "torch.float8_e4m3fn",
        "zp_dtype": null, "observer": "static_minmax", "observer_kwargs": {}},
      "output_activations": null,
      "format": null
    }
  },
  "quant_method": "compressed-tensors",
  "kv_cache_scheme": null,
  "format": "nvfp4-pack-quantized",
  "quantization_status": "compressed",
  "global_compression_ratio": null,
  "ignore": [],
  "provider": "auto-round"
}"#;

    /// Block FP8 (Qwen3-8B-FP8; the same block in DeepSeek-V3's README_WEIGHTS.md at
    /// 0b39205aed0d): `quantization_config` of sgl-project/ome
    /// `pkg/hfutil/modelconfig/testdata/qwen3_8b_fp8.json` at 17b77edad23b.
    const QWEN3_FP8: &str = r#"{
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  }"#;

    /// compressed-tensors FP8 with the groups' weights only (`naive-quantized`):
    /// Llama-3.1-8B-Instruct, sgl-project/ome
    /// `pkg/modelconfig/testdata/quant/compressed-tensors-llama-3-1-8b/config.json` at
    /// 7a831ab04504.
    const LLAMA_CT_FP8: &str = r#"{
    "config_groups": {
      "group_0": {
        "input_activations": {"block_structure": null, "dynamic": true, "group_size": null,
          "num_bits": 8, "observer": "memoryless", "observer_kwargs": {}, "strategy": "token",
          "symmetric": true, "type": "float"},
        "output_activations": null,
        "targets": ["Linear"],
        "weights": {"block_structure": null, "dynamic": false, "group_size": null,
          "num_bits": 8, "observer": "minmax", "observer_kwargs": {}, "strategy": "channel",
          "symmetric": true, "type": "float"}
      }
    },
    "format": "naive-quantized",
    "global_compression_ratio": 1.239290831149584,
    "ignore": ["lm_head"],
    "kv_cache_scheme": null,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed"
  }"#;

    /// fbgemm FP8: meta-llama/Meta-Llama-3.1-405B-Instruct-FP8, sgl-project/ome
    /// `pkg/hfutil/modelconfig/testdata/llama3_1_405b.json` at 17b77edad23b
    /// (`modules_to_not_convert` cut to two entries).
    const LLAMA_405B_FBGEMM: &str = r#"{
    "activation_scale_ub": 1200.0,
    "modules_to_not_convert": ["model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj"],
    "quant_method": "fbgemm_fp8"
  }"#;

    /// AWQ and GPTQ Llama-2-7B: sgl-project/ome `pkg/modelconfig/testdata/quant/
    /// {awq,gptq}-llama-2-7b/config.json` at 8925392756c1.
    const LLAMA2_AWQ: &str = r#"{"quant_method": "awq", "zero_point": true, "group_size": 128,
    "bits": 4, "version": "gemm"}"#;
    const LLAMA2_GPTQ: &str = r#"{"bits": 4, "group_size": 128, "damp_percent": 0.01,
    "desc_act": false, "sym": true, "true_sequential": true, "model_name_or_path": null,
    "model_file_base_name": "model", "quant_method": "gptq"}"#;

    /// A model directory `dir` (absolute in the process's file system) of process 4242 below
    /// a fake `/proc`, its working directory `cwd`, with `files`.
    fn proc_with_model(dir: &str, cwd: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let proc_root = tempfile::tempdir().unwrap();
        let root = proc_root.path().join("4242/root");
        let model = root.join(dir.trim_start_matches('/'));
        fs::create_dir_all(&model).unwrap();
        for (name, text) in files {
            fs::write(model.join(name), text).unwrap();
        }
        std::os::unix::fs::symlink(cwd, proc_root.path().join("4242/cwd")).unwrap();
        proc_root
    }

    fn quant(files: &[(&str, &str)]) -> Option<String> {
        let p = proc_with_model("/models/ckpt", "/", files);
        quantization_from_model_files(p.path(), 4242, "/models/ckpt")
    }

    fn config_with(key: &str, q: &str) -> String {
        format!(r#"{{"model_type": "llama", "{key}": {q}}}"#)
    }

    #[test]
    fn nvfp4_from_modelopt_hf_quant_config_files() {
        let plain = r#"{"model_type": "llama", "torch_dtype": "bfloat16"}"#;
        for f in [LLAMA_8B_NVFP4, LLAMA_70B_FP4] {
            assert_eq!(
                quant(&[("hf_quant_config.json", f)]).as_deref(),
                Some("nvfp4")
            );
            // Beside a config.json without a quantization_config, as modelopt <= 0.29 writes.
            assert_eq!(
                quant(&[("config.json", plain), ("hf_quant_config.json", f)]).as_deref(),
                Some("nvfp4")
            );
        }
        assert_eq!(
            quant(&[("hf_quant_config.json", LLAMA_FP8_MODELOPT)]).as_deref(),
            Some("fp8")
        );
        assert_eq!(quant(&[("hf_quant_config.json", OTHER_PRODUCER)]), None);
    }

    #[test]
    fn quantization_config_of_config_json() {
        let cases = [
            (config_with("quantization_config", DEVSTRAL_NVFP4), "nvfp4"),
            (config_with("quantization_config", QWEN3_FP8), "fp8"),
            (config_with("quantization_config", LLAMA_CT_FP8), "fp8"),
            (config_with("quantization_config", LLAMA_405B_FBGEMM), "fp8"),
            (config_with("quantization_config", LLAMA2_AWQ), "awq"),
            (config_with("quantization_config", LLAMA2_GPTQ), "gptq"),
            // The older compressed-tensors key (vllm-project/llm-compressor
            // TinyLlama-1.1B-Chat-v1.0-fp8/fp8-config.json at f76ead6b2f96: the same
            // "format": "float-quantized" object under compression_config).
            (
                config_with(
                    "compression_config",
                    r#"{"format": "float-quantized", "quant_method": "compressed-tensors"}"#,
                ),
                "fp8",
            ),
        ];
        for (config, want) in cases {
            assert_eq!(
                quant(&[("config.json", &config)]).as_deref(),
                Some(want),
                "{config}"
            );
        }
        // config.json's own quantization_config wins over hf_quant_config.json (vLLM reads
        // the latter only without the former).
        let fp8 = config_with("quantization_config", QWEN3_FP8);
        assert_eq!(
            quant(&[
                ("config.json", &fp8),
                ("hf_quant_config.json", LLAMA_8B_NVFP4)
            ])
            .as_deref(),
            Some("fp8")
        );
        // Unquantized.
        assert_eq!(
            quant(&[(
                "config.json",
                r#"{"model_type": "qwen3", "torch_dtype": "bfloat16"}"#
            )]),
            None
        );
    }

    #[test]
    fn a_mixed_checkpoint_is_named_by_its_narrowest_format() {
        // nm-testing/Meta-Llama-3-8B-Instruct-NVFP4-FP8-Dynamic: group_0
        // "nvfp4-pack-quantized", group_1 "float-quantized" (huggingface.co config.json; the
        // groups' other keys left out).
        let q = r#"{"quant_method": "compressed-tensors", "config_groups": {
            "group_0": {"format": "nvfp4-pack-quantized", "targets": ["re:.*mlp.gate_proj.*"]},
            "group_1": {"format": "float-quantized", "targets": ["re:.*mlp.down_proj.*"]}}}"#;
        assert_eq!(
            quant(&[("config.json", &config_with("quantization_config", q))]).as_deref(),
            Some("nvfp4")
        );
    }

    #[test]
    fn only_a_local_directory_and_only_bounded_json() {
        let files = [("hf_quant_config.json", LLAMA_8B_NVFP4)];
        // Relative to the process's working directory.
        let p = proc_with_model("/srv/models/ckpt", "/srv", &files);
        assert_eq!(
            quantization_from_model_files(p.path(), 4242, "models/ckpt").as_deref(),
            Some("nvfp4")
        );
        // A hub id with no such directory, a URL, another process: nothing.
        assert_eq!(
            quantization_from_model_files(p.path(), 4242, "nvidia/Llama-3.1-8B-Instruct-FP4"),
            None
        );
        assert_eq!(
            quantization_from_model_files(p.path(), 4242, "s3://b/ckpt"),
            None
        );
        assert_eq!(
            quantization_from_model_files(p.path(), 1, "/srv/models/ckpt"),
            None
        );
        // Garbage and a file past the bound say nothing.
        assert_eq!(quant(&[("config.json", "\u{0}\u{1}not json")]), None);
        let huge = format!(
            r#"{{"quantization_config": {{"quant_method": "fp8"}}, "pad": "{}"}}"#,
            "x".repeat(MAX_CONFIG_FILE as usize)
        );
        assert_eq!(quant(&[("config.json", &huge)]), None);
        // A link out of the process's root is followed inside it, never on the agent's side.
        let p = proc_with_model("/models/ckpt", "/", &[]);
        let escape = p.path().join("4242/root/models/ckpt/config.json");
        let outside = p.path().join("outside.json");
        fs::write(&outside, config_with("quantization_config", QWEN3_FP8)).unwrap();
        std::os::unix::fs::symlink(&outside, &escape).unwrap();
        assert_eq!(
            quantization_from_model_files(p.path(), 4242, "/models/ckpt"),
            None
        );
    }
}

//! Weight quantization, normalised from the engine's `--quantization` flag and the model
//! name.

/// Longest unknown `--quantization` value kept verbatim.
const MAX_QUANT_LEN: usize = 32;

/// Normalised quantization from a flag value and the model name: a specific flag value
/// wins; a generic one (`modelopt`, `compressed-tensors`, ...) gives way to what the model
/// name says; without a flag, the model name decides.
pub fn quantization(flag: Option<&str>, model: Option<&str>) -> Option<String> {
    let from_name = model.and_then(quant_from_model_name);
    match flag.map(|f| f.trim().to_ascii_lowercase()) {
        Some(f) if !f.is_empty() && f != "none" => match quant_from_flag(&f) {
            FlagQuant::Known(q) => Some(q.to_string()),
            FlagQuant::Generic => from_name.or_else(|| sanitized(&f)),
            FlagQuant::Other => sanitized(&f),
        },
        _ => from_name,
    }
}

enum FlagQuant {
    Known(&'static str),
    /// A framework name that does not say the format.
    Generic,
    Other,
}

/// `--quantization` values of vLLM and SGLang to the normalised names.
fn quant_from_flag(f: &str) -> FlagQuant {
    use FlagQuant::*;
    if f.contains("nvfp4") || f == "modelopt_fp4" || f == "fp4" {
        Known("nvfp4")
    } else if f.contains("mxfp4") {
        Known("mxfp4")
    } else if f.contains("fp8") {
        Known("fp8")
    } else if f.starts_with("awq") {
        Known("awq")
    } else if f.starts_with("gptq") {
        Known("gptq")
    } else if f == "bitsandbytes" || f == "bnb" {
        Known("bitsandbytes")
    } else if f == "gguf" {
        Known("gguf")
    } else if f.contains("int8") || f == "smoothquant" {
        Known("int8")
    } else if f == "int4" || f == "w4a16" {
        Known("int4")
    } else if matches!(
        f,
        "modelopt"
            | "compressed-tensors"
            | "compressed_tensors"
            | "quark"
            | "torchao"
            | "auto-round"
            | "inc"
    ) {
        Generic
    } else {
        Other
    }
}

/// A quantization name as written by a checkpoint's own files (`quant_method`, modelopt's
/// `quant_algo`), lowercase, to the normalised names: a known one, `None` for a framework
/// name that does not say the format, else the name itself when short and plain.
pub(super) fn normalised(name: &str) -> Option<String> {
    match quant_from_flag(name) {
        FlagQuant::Known(q) => Some(q.to_string()),
        FlagQuant::Generic => None,
        FlagQuant::Other => sanitized(name),
    }
}

fn sanitized(f: &str) -> Option<String> {
    (f.len() <= MAX_QUANT_LEN
        && f.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'))
    .then(|| f.to_string())
}

/// GGUF quantization types as they appear in file names and Ollama tags.
const GGUF_TYPES: &[&str] = &[
    "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs", "iq3_s", "iq3_m",
    "iq4_nl", "iq4_xs", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_0", "q4_1", "q4_k_s", "q4_k_m",
    "q5_0", "q5_1", "q5_k_s", "q5_k_m", "q6_k", "q8_0",
];

/// Quantization named in a model id or path (its last component), e.g.
/// `nvidia/Llama-3.1-8B-Instruct-FP4` → `nvfp4`, `...-AWQ` → `awq`, `...Q4_K_M.gguf` →
/// `q4_k_m`. `FP4` alone means NVFP4: NVIDIA publishes its NVFP4 checkpoints so named, and
/// MXFP4 ones say `MXFP4`.
pub fn quant_from_model_name(model: &str) -> Option<String> {
    let name = model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    // GGUF types contain '_', so look for them before splitting into tokens.
    let is_sep = |c: Option<char>| c.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
    for t in GGUF_TYPES.iter().rev() {
        let mut from = 0;
        while let Some(p) = name[from..].find(t) {
            let s = from + p;
            let e = s + t.len();
            let before = name[..s].chars().next_back();
            let after = name[e..].chars().next();
            if is_sep(before) && is_sep(after) {
                return Some((*t).to_string());
            }
            from = s + 1;
        }
    }
    let tokens: Vec<&str> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .collect();
    let has = |t: &str| tokens.contains(&t);
    let found = if has("nvfp4") {
        "nvfp4"
    } else if has("mxfp4") {
        "mxfp4"
    } else if has("fp4") {
        "nvfp4"
    } else if has("fp8") || has("f8") {
        "fp8"
    } else if has("awq") {
        "awq"
    } else if has("gptq") {
        "gptq"
    } else if has("int4") || has("w4a16") {
        "int4"
    } else if has("int8") || has("w8a8") {
        "int8"
    } else if has("bnb") || has("bitsandbytes") {
        "bitsandbytes"
    } else if has("gguf") {
        "gguf"
    } else {
        return None;
    };
    Some(found.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_name_quantization() {
        let cases = [
            ("nvidia/Llama-3.1-8B-Instruct-FP4", Some("nvfp4")),
            ("nvidia/Llama-3.3-70B-Instruct-NVFP4", Some("nvfp4")),
            ("openai/gpt-oss-120b-MXFP4", Some("mxfp4")),
            (
                "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic",
                Some("fp8"),
            ),
            (
                "RedHatAI/Llama-3.1-8B-Instruct-quantized.w8a8",
                Some("int8"),
            ),
            (
                "RedHatAI/Llama-3.1-8B-Instruct-quantized.w4a16",
                Some("int4"),
            ),
            ("TheBloke/Llama-2-7B-GPTQ", Some("gptq")),
            (
                "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
                Some("awq"),
            ),
            ("unsloth/llama-3-8b-bnb-4bit", Some("bitsandbytes")),
            (
                "/models/Meta-Llama-3-8B-Instruct.Q5_K_M.gguf",
                Some("q5_k_m"),
            ),
            ("/models/model.IQ4_XS.gguf", Some("iq4_xs")),
            ("/models/model.gguf", Some("gguf")),
            ("meta-llama/Llama-3.1-8B-Instruct", None),
            // Only the last component counts: an org called "fp8-lab" says nothing.
            ("fp8-lab/llama", None),
            // "q4_0" inside a longer token is not a GGUF type.
            ("org/xq4_0y", None),
        ];
        for (model, want) in cases {
            assert_eq!(quant_from_model_name(model).as_deref(), want, "{model}");
        }
    }

    #[test]
    fn unknown_quantization_values_are_bounded() {
        assert_eq!(quantization(Some("HQQ"), None).as_deref(), Some("hqq"));
        assert_eq!(
            quantization(Some("none"), Some("a/b-AWQ")).as_deref(),
            Some("awq")
        );
        assert_eq!(quantization(Some("bad value!"), None), None);
        assert_eq!(quantization(Some(&"x".repeat(40)), None), None);
    }
}

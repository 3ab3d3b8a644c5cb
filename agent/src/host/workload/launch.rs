//! How a process was launched: the process title an engine sets, the Python or shell
//! command line, the engine these name, the engine's flags (model, tensor-parallel size,
//! quantization) and the rank the launcher's environment gives.

use std::collections::HashMap;

use super::{
    base, ProcFacts, WorkloadInfo, ENGINE_OLLAMA, ENGINE_PYTORCH, ENGINE_SGLANG,
    ENGINE_TENSORRT_LLM, ENGINE_VLLM,
};

/// A process title set by an engine (`setproctitle`): replaces the whole command line.
pub(super) struct Title {
    /// The engine that sets it.
    pub(super) engine: &'static str,
    /// `TP<n>` in the title.
    pub(super) tp_rank: Option<u32>,
    /// A worker rank that is not explicitly TP (`VllmWorker-3`).
    pub(super) worker_rank: Option<u32>,
}

/// Recognises `VLLM::EngineCore`, `VLLM::Worker_PP0_TP1` (prefix from
/// `VLLM_PROCESS_NAME_PREFIX`), `sglang::scheduler_DP0_TP2`, and the older
/// `VllmWorker TP3` / `VllmWorker-3` / `VllmWorkerProcess`.
pub(super) fn process_title(args: &[String], env: &HashMap<String, String>) -> Option<Title> {
    // A title is one argument (setproctitle overwrote argv); a few implementations pad
    // with spaces.
    let t = args.first()?.trim();
    if args.iter().skip(1).any(|a| !a.trim().is_empty()) {
        return None;
    }
    let vllm_prefix = env
        .get("VLLM_PROCESS_NAME_PREFIX")
        .map(|p| format!("{p}::"))
        .unwrap_or_else(|| "VLLM::".to_string());
    let (engine, rest) = if let Some(r) = t.strip_prefix(vllm_prefix.as_str()) {
        (ENGINE_VLLM, r)
    } else if let Some(r) = t.strip_prefix("VLLM::") {
        (ENGINE_VLLM, r)
    } else if let Some(r) = t.strip_prefix("sglang::") {
        (ENGINE_SGLANG, r)
    } else if let Some(r) = t.strip_prefix("VllmWorker") {
        let worker_rank = r
            .strip_prefix('-')
            .and_then(|n| n.parse().ok())
            .or_else(|| r.strip_prefix(" rank=").and_then(|n| n.parse().ok()));
        return Some(Title {
            engine: ENGINE_VLLM,
            tp_rank: tp_token(r),
            worker_rank,
        });
    } else {
        return None;
    };
    Some(Title {
        engine,
        tp_rank: tp_token(rest),
        worker_rank: None,
    })
}

/// `TP<n>` as a token of a title (separated by `_`, space or `-`).
fn tp_token(s: &str) -> Option<u32> {
    s.split(['_', ' ', '-'])
        .find_map(|tok| tok.strip_prefix("TP").and_then(|n| n.parse().ok()))
}

/// How a process was started when it is Python: where the arguments after the module or
/// script begin, and the module or script.
#[derive(Debug)]
pub(super) struct Launch {
    /// `-m` module, if any.
    module: Option<String>,
    /// Script path (the console-script wrapper, e.g. `/usr/local/bin/vllm`), if any.
    script: Option<String>,
    /// Index in argv of the first argument after the module / script.
    rest_at: usize,
}

fn is_python_name(s: &str) -> bool {
    let b = base(s);
    b.starts_with("python") || b == "pypy3" || b == "pt_main_thread"
}

pub(super) fn is_python(f: &ProcFacts) -> bool {
    f.exe
        .as_ref()
        .and_then(|e| e.file_name())
        .map(|n| is_python_name(&n.to_string_lossy()))
        .unwrap_or(false)
        || f.cmdline.first().is_some_and(|a| is_python_name(a))
        || is_python_name(&f.comm)
}

fn is_shell_name(s: &str) -> bool {
    matches!(base(s), "sh" | "bash" | "dash")
}

/// Parses `python [opts] (-m MODULE | -c CODE | SCRIPT) args...`, and `sh|bash [opts]
/// SCRIPT args...` (shell wrappers such as `trtllm-llmapi-launch`).
pub(super) fn python_launch(f: &ProcFacts) -> Option<Launch> {
    let args = &f.cmdline;
    let argv0 = args.first()?;
    let python = is_python_name(argv0);
    if !python && !is_shell_name(argv0) {
        return None;
    }
    let mut i = 1;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-m" if python => {
                return Some(Launch {
                    module: args.get(i + 1).cloned(),
                    script: None,
                    rest_at: i + 2,
                })
            }
            "-c" => {
                return Some(Launch {
                    module: None,
                    script: None,
                    rest_at: i + 2,
                })
            }
            // Interpreter options that take a separate value.
            "-W" | "-X" | "--check-hash-based-pycs" if python => i += 2,
            "-o" | "-O" | "+O" if !python => i += 2,
            _ if python && a.starts_with("-m") && a.len() > 2 => {
                return Some(Launch {
                    module: Some(a[2..].to_string()),
                    script: None,
                    rest_at: i + 1,
                })
            }
            _ if a.starts_with('-') || a.starts_with('+') => i += 1,
            _ => {
                return Some(Launch {
                    module: None,
                    script: Some(a.to_string()),
                    rest_at: i + 1,
                })
            }
        }
    }
    Some(Launch {
        module: None,
        script: None,
        rest_at: args.len(),
    })
}

/// Engine from the program itself: a `-m` module, a console script, or the executable.
pub(super) fn engine_of_launch(f: &ProcFacts, launch: &Option<Launch>) -> Option<&'static str> {
    if let Some(l) = launch {
        if let Some(m) = &l.module {
            let top = m.split('.').next().unwrap_or("");
            return match top {
                "vllm" => Some(ENGINE_VLLM),
                "sglang" => Some(ENGINE_SGLANG),
                "tensorrt_llm" => Some(ENGINE_TENSORRT_LLM),
                _ => None,
            };
        }
        if let Some(s) = &l.script {
            return engine_of_program(base(s), &f.cmdline[l.rest_at.min(f.cmdline.len())..]);
        }
        return None;
    }
    let argv0 = f.cmdline.first().map(|a| base(a)).unwrap_or("");
    let exe = f
        .exe
        .as_ref()
        .and_then(|e| e.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let exe = exe.trim_end_matches(" (deleted)");
    let rest = f.cmdline.get(1..).unwrap_or(&[]);
    engine_of_program(argv0, rest).or_else(|| engine_of_program(exe, rest))
}

/// Engine from a program name and its arguments.
fn engine_of_program(prog: &str, rest: &[String]) -> Option<&'static str> {
    match prog {
        "vllm" => Some(ENGINE_VLLM),
        "sglang" => Some(ENGINE_SGLANG),
        "trtllm-serve" | "trtllm-bench" | "trtllm-build" => Some(ENGINE_TENSORRT_LLM),
        "trtllm-llmapi-launch" => rest
            .iter()
            .any(|a| base(a).starts_with("trtllm-"))
            .then_some(ENGINE_TENSORRT_LLM),
        // `ollama serve` and `ollama runner`; the CLI client (`ollama run`, `ollama pull`)
        // does not touch the GPU but is still Ollama.
        "ollama" | "ollama_llama_server" => Some(ENGINE_OLLAMA),
        _ => None,
    }
}

/// Engine from the libraries a Python process maps (offline `vllm.LLM(...)` scripts and
/// plain PyTorch programs).
pub(super) fn engine_of_maps(f: &ProcFacts) -> Option<&'static str> {
    let m = f.mapped;
    if m.vllm {
        Some(ENGINE_VLLM)
    } else if m.sglang {
        Some(ENGINE_SGLANG)
    } else if m.tensorrt_llm {
        Some(ENGINE_TENSORRT_LLM)
    } else if m.torch && is_python(f) {
        Some(ENGINE_PYTORCH)
    } else {
        None
    }
}

/// The model, tensor-parallel size and quantization flag (as given; normalised later by
/// [`super::quantization()`]) from the command line `args` of a process of `engine`,
/// started as `launch` shows.
pub(super) fn read_engine_flags(
    engine: &str,
    args: &[String],
    launch: &Option<Launch>,
    info: &mut WorkloadInfo,
) {
    // The arguments after the program: for `python -m M ...` / `python script ...` those
    // after M / script, otherwise those after argv[0].
    let rest: &[String] = match launch {
        Some(l) => &args[l.rest_at.min(args.len())..],
        None => args.get(1..).unwrap_or(&[]),
    };
    match engine {
        ENGINE_VLLM => {
            info.model = subcommand_positional(rest, &["serve"])
                .or_else(|| flag_value(rest, &["--model"]).map(str::to_string));
            info.tensor_parallel_size = flag_u32(rest, &["--tensor-parallel-size", "-tp"]);
            info.quantization = flag_value(rest, &["--quantization", "-q"]).map(str::to_string);
        }
        ENGINE_SGLANG => {
            info.model = flag_value(rest, &["--model-path", "--model"])
                .map(str::to_string)
                .or_else(|| subcommand_positional(rest, &["serve"]));
            info.tensor_parallel_size =
                flag_u32(rest, &["--tp-size", "--tp", "--tensor-parallel-size"]);
            info.quantization = flag_value(rest, &["--quantization"]).map(str::to_string);
        }
        ENGINE_TENSORRT_LLM => {
            // `trtllm-serve [serve] MODEL --tp_size N`; the launch wrapper
            // `trtllm-llmapi-launch trtllm-serve ...` puts the real command after it.
            let r = match rest.iter().position(|a| base(a) == "trtllm-serve") {
                Some(i) => &rest[i + 1..],
                None => rest,
            };
            let r = match r.first() {
                Some(a) if a == "serve" => &r[1..],
                _ => r,
            };
            info.model = flag_value(r, &["--model"])
                .map(str::to_string)
                .or_else(|| first_positional(r));
            info.tensor_parallel_size = flag_u32(r, &["--tp-size", "--tensor-parallel-size"]);
            info.quantization = flag_value(r, &["--quantization"]).map(str::to_string);
        }
        ENGINE_OLLAMA => {
            info.model = flag_value(rest, &["--model"]).map(str::to_string);
        }
        _ => {
            info.model = flag_value(
                rest,
                &[
                    "--model",
                    "--model-path",
                    "--model-name-or-path",
                    "--model-id",
                ],
            )
            .map(str::to_string);
        }
    }
}

/// Value of the first of `names` present as `--name value` or `--name=value`. Flag names
/// compare with `_` and `-` alike (vLLM and TensorRT-LLM accept both spellings).
fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let norm = |s: &str| {
        let dashes = s.len() - s.trim_start_matches('-').len();
        format!("{}{}", &s[..dashes], s[dashes..].replace('_', "-"))
    };
    for (i, a) in args.iter().enumerate() {
        if !a.starts_with('-') {
            continue;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (a.as_str(), None),
        };
        let flag = norm(flag);
        if names.iter().any(|n| *n == flag) {
            let v = match inline {
                Some(v) => v,
                None => args.get(i + 1).map(String::as_str)?,
            };
            if v.is_empty() || (inline.is_none() && v.starts_with('-')) {
                return None;
            }
            return Some(v);
        }
    }
    None
}

fn flag_u32(args: &[String], names: &[&str]) -> Option<u32> {
    flag_value(args, names)?.parse().ok()
}

/// The positional argument after one of `subcommands` (`vllm serve MODEL`); `None` without
/// the subcommand.
fn subcommand_positional(args: &[String], subcommands: &[&str]) -> Option<String> {
    let at = args
        .iter()
        .position(|a| subcommands.contains(&a.as_str()))?;
    first_positional(&args[at + 1..])
}

/// The argument right after the start when it is not an option, or else the first argument
/// that is neither an option nor the value of the option before it (an option followed by
/// a non-option is taken to have a value: a boolean flag right before the model hides it,
/// and then `None` is returned rather than a wrong name).
fn first_positional(args: &[String]) -> Option<String> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return args.get(i + 1).cloned();
        }
        if a.starts_with('-') {
            if !a.contains('=') && args.get(i + 1).is_some_and(|n| !n.starts_with('-')) {
                i += 2;
            } else {
                i += 1;
            }
            continue;
        }
        return Some(a.clone());
    }
    None
}

/// Rank from the launcher's environment: `RANK` (torchrun), `OMPI_COMM_WORLD_RANK`,
/// `PMI_RANK`, `PMIX_RANK` (MPI, as TensorRT-LLM uses), `LOCAL_RANK`. With the tensor-parallel
/// size known the global rank is reduced modulo it (tensor parallelism is the innermost
/// dimension in vLLM, SGLang, TensorRT-LLM and Megatron); without it `LOCAL_RANK` is
/// preferred, which equals the TP rank for the usual one-node tensor parallelism.
pub(super) fn rank_from_env(env: &HashMap<String, String>, tp_size: Option<u32>) -> Option<u32> {
    let get = |k: &str| env.get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let global = get("RANK")
        .or_else(|| get("OMPI_COMM_WORLD_RANK"))
        .or_else(|| get("PMI_RANK"))
        .or_else(|| get("PMIX_RANK"));
    match tp_size {
        Some(n) if n > 0 => global.or_else(|| get("LOCAL_RANK")).map(|r| r % n),
        _ => get("LOCAL_RANK").or(global),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{env, facts};
    use super::super::{identify_facts, Mapped};
    use super::*;

    #[test]
    fn vllm_openai_api_server_module() {
        let f = facts(
            "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model \
             meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --port 8000 \
             --quantization fp8 --max-model-len 8192",
        );
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(
            i.model.as_deref(),
            Some("meta-llama/Llama-3.1-70B-Instruct")
        );
        assert_eq!(i.tensor_parallel_size, Some(4));
        assert_eq!(i.quantization.as_deref(), Some("fp8"));
        assert_eq!(i.tp_rank, None);
    }

    #[test]
    fn vllm_serve_console_script_with_nvfp4_model() {
        // A console script: the kernel runs the interpreter with the script as argv[1].
        let f = facts(
            "/usr/bin/python3 /usr/local/bin/vllm serve nvidia/Llama-3.1-8B-Instruct-FP4 \
             --tensor-parallel-size=2 --gpu-memory-utilization 0.9",
        );
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(i.model.as_deref(), Some("nvidia/Llama-3.1-8B-Instruct-FP4"));
        assert_eq!(i.quantization.as_deref(), Some("nvfp4"));
        assert_eq!(i.tensor_parallel_size, Some(2));
    }

    #[test]
    fn vllm_serve_options_before_the_model_and_underscore_flags() {
        let f = facts(
            "/opt/venv/bin/python /opt/venv/bin/vllm serve --port 8000 \
             Qwen/Qwen2.5-72B-Instruct-AWQ --tensor_parallel_size 8",
        );
        let i = identify_facts(&f);
        assert_eq!(i.model.as_deref(), Some("Qwen/Qwen2.5-72B-Instruct-AWQ"));
        assert_eq!(i.quantization.as_deref(), Some("awq"));
        assert_eq!(i.tensor_parallel_size, Some(8));
        // argv[0] is the script when exec'd directly (no interpreter shown).
        let f = facts("/usr/local/bin/vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-NVFP4");
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(i.quantization.as_deref(), Some("nvfp4"));
    }

    #[test]
    fn vllm_generic_quantization_flag_defers_to_the_model_name() {
        let f = facts(
            "python3 -m vllm.entrypoints.openai.api_server --model \
             nvidia/DeepSeek-R1-NVFP4 --quantization modelopt -tp 8",
        );
        let i = identify_facts(&f);
        assert_eq!(i.quantization.as_deref(), Some("nvfp4"));
        assert_eq!(i.tensor_parallel_size, Some(8));
        let f = facts("vllm serve some/model --quantization modelopt_fp4");
        assert_eq!(identify_facts(&f).quantization.as_deref(), Some("nvfp4"));
        let f = facts("vllm serve some/model --quantization=gptq_marlin");
        assert_eq!(identify_facts(&f).quantization.as_deref(), Some("gptq"));
        let f = facts("vllm serve some/model -q compressed-tensors");
        assert_eq!(
            identify_facts(&f).quantization.as_deref(),
            Some("compressed-tensors")
        );
    }

    #[test]
    fn vllm_worker_titles_give_rank() {
        let mut f = facts("VLLM::Worker_TP3");
        f.exe = Some("/usr/bin/python3.12".into());
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(i.tp_rank, Some(3));
        let i = identify_facts(&facts("VLLM::Worker_DP1_PP0_TP6_EP14"));
        assert_eq!(i.tp_rank, Some(6));
        let i = identify_facts(&facts("VLLM::EngineCore"));
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(i.tp_rank, None);
        // Before init_device the title has no rank yet.
        assert_eq!(identify_facts(&facts("VLLM::Worker")).tp_rank, None);
        // Older releases.
        let title = |t: &str| ProcFacts {
            cmdline: vec![t.to_string()],
            ..ProcFacts::default()
        };
        assert_eq!(identify_facts(&title("VllmWorker TP2")).tp_rank, Some(2));
        // setproctitle may leave padding after the title.
        assert_eq!(
            identify_facts(&title("VLLM::Worker_TP4   ")).tp_rank,
            Some(4)
        );
        let mut f = ProcFacts {
            cmdline: vec!["VllmWorker-5".into()],
            ..ProcFacts::default()
        };
        assert_eq!(identify_facts(&f).tp_rank, Some(5));
        // Custom prefix.
        f.cmdline = vec!["myorg::Worker_TP1".into()];
        env(&mut f, &[("VLLM_PROCESS_NAME_PREFIX", "myorg")]);
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("vllm"));
        assert_eq!(i.tp_rank, Some(1));
    }

    #[test]
    fn sglang_launch_server_and_scheduler_titles() {
        let f = facts(
            "python3 -m sglang.launch_server --model-path \
             deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code --quantization fp8 --port 30000",
        );
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("sglang"));
        assert_eq!(i.model.as_deref(), Some("deepseek-ai/DeepSeek-V3"));
        assert_eq!(i.tensor_parallel_size, Some(8));
        assert_eq!(i.quantization.as_deref(), Some("fp8"));
        let f = facts("python -m sglang.launch_server --model meta-llama/Llama-3.2-1B --tp-size 2");
        let i = identify_facts(&f);
        assert_eq!(i.model.as_deref(), Some("meta-llama/Llama-3.2-1B"));
        assert_eq!(i.tensor_parallel_size, Some(2));
        let i = identify_facts(&facts("sglang::scheduler_DP0_TP5"));
        assert_eq!(i.engine.as_deref(), Some("sglang"));
        assert_eq!(i.tp_rank, Some(5));
        let i = identify_facts(&facts("sglang::scheduler_PP1_TP2_EP0"));
        assert_eq!(i.tp_rank, Some(2));
        let i = identify_facts(&facts("sglang::detokenizer"));
        assert_eq!(i.engine.as_deref(), Some("sglang"));
    }

    #[test]
    fn tensorrt_llm_serve() {
        let f = facts(
            "/usr/bin/python3 /usr/local/bin/trtllm-serve \
             nvidia/Llama-3.3-70B-Instruct-FP8 --backend pytorch --tp_size 4 --port 8000",
        );
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("tensorrt-llm"));
        assert_eq!(
            i.model.as_deref(),
            Some("nvidia/Llama-3.3-70B-Instruct-FP8")
        );
        assert_eq!(i.tensor_parallel_size, Some(4));
        assert_eq!(i.quantization.as_deref(), Some("fp8"));
        let f = facts("trtllm-serve serve TinyLlama/TinyLlama-1.1B-Chat-v1.0 --tp_size=2");
        let i = identify_facts(&f);
        assert_eq!(
            i.model.as_deref(),
            Some("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
        );
        assert_eq!(i.tensor_parallel_size, Some(2));
        // Launched per rank under MPI through the wrapper.
        let mut f = facts(
            "/bin/bash /usr/local/bin/trtllm-llmapi-launch trtllm-serve \
             nvidia/DeepSeek-R1-FP4 --tp_size 8",
        );
        env(&mut f, &[("OMPI_COMM_WORLD_RANK", "11")]);
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("tensorrt-llm"));
        assert_eq!(i.model.as_deref(), Some("nvidia/DeepSeek-R1-FP4"));
        assert_eq!(i.quantization.as_deref(), Some("nvfp4"));
        assert_eq!(i.tp_rank, Some(3));
        let f = facts("python3 -m tensorrt_llm.commands.serve meta/llama --tp_size 2");
        assert_eq!(identify_facts(&f).engine.as_deref(), Some("tensorrt-llm"));
        let f = facts("python3 -m tensorrt_llm.llmapi.mgmn_worker_node");
        assert_eq!(identify_facts(&f).engine.as_deref(), Some("tensorrt-llm"));
        // Other shell scripts are not engines.
        assert_eq!(
            identify_facts(&facts("/bin/sh /entrypoint.sh serve")).engine,
            None
        );
    }

    #[test]
    fn ollama_serve_and_runner() {
        let i = identify_facts(&facts("/usr/local/bin/ollama serve"));
        assert_eq!(i.engine.as_deref(), Some("ollama"));
        assert_eq!(i.model, None);
        let f = facts(
            "/usr/local/bin/ollama runner --ollama-engine --model \
             /root/.ollama/models/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa \
             --ctx-size 8192 --batch-size 512 --n-gpu-layers 33 --threads 8 --parallel 4 --port 41235",
        );
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("ollama"));
        assert!(i.model.as_deref().unwrap().contains("/blobs/sha256-6a07"));
        let f = facts(
            "/tmp/ollama123/runners/cuda_v12/ollama_llama_server --model \
             /models/blobs/sha256-abc --ctx-size 2048",
        );
        assert_eq!(identify_facts(&f).engine.as_deref(), Some("ollama"));
    }

    #[test]
    fn pytorch_only_when_torch_is_mapped() {
        let mut f = facts("/usr/bin/python3 train.py --model_name_or_path gpt2 --epochs 3");
        assert_eq!(identify_facts(&f).engine, None);
        f.mapped.torch = true;
        env(&mut f, &[("RANK", "5"), ("LOCAL_RANK", "1")]);
        let i = identify_facts(&f);
        assert_eq!(i.engine.as_deref(), Some("pytorch"));
        assert_eq!(i.model.as_deref(), Some("gpt2"));
        // No tensor-parallel size known: the node-local rank.
        assert_eq!(i.tp_rank, Some(1));
        // Not Python: a C++ program linking libtorch is not "pytorch" here.
        let mut f = facts("/opt/app/server --port 1");
        f.mapped.torch = true;
        assert_eq!(identify_facts(&f).engine, None);
        // An offline vLLM script is recognised by vLLM's extension.
        let mut f = facts("python3 offline.py");
        f.mapped = Mapped {
            torch: true,
            vllm: true,
            ..Mapped::default()
        };
        assert_eq!(identify_facts(&f).engine.as_deref(), Some("vllm"));
    }

    #[test]
    fn rank_env_reduced_by_tp_size() {
        let mut f = facts("python3 -m vllm.entrypoints.openai.api_server --model m -tp 4");
        env(&mut f, &[("RANK", "6"), ("LOCAL_RANK", "6")]);
        assert_eq!(identify_facts(&f).tp_rank, Some(2));
        let mut e = HashMap::new();
        e.insert("PMI_RANK".to_string(), "3".to_string());
        assert_eq!(rank_from_env(&e, None), Some(3));
        e.insert("RANK".to_string(), "x".to_string());
        assert_eq!(rank_from_env(&e, Some(2)), Some(1));
    }
}

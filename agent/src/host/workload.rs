//! Workload identity: which inference server (or plain PyTorch program) a traced process
//! is, and what users search it by: engine, model, quantization, tensor-parallel rank,
//! container and Kubernetes pod.
//!
//! Everything comes from procfs, read once per process: `exe`, `cmdline` (which is also
//! where `setproctitle` titles such as `VLLM::Worker_TP1` appear), selected variables of
//! `environ` (never the whole environment: it holds tokens), `cgroup` (container id, pod
//! UID), `maps` (only for Python processes no command line identified: is `torch` loaded),
//! the parent chain (a spawned vLLM worker inherits the server's model), and files resolved
//! inside the process's own root (`/proc/<pid>/root`, see [`super::in_root`]): the
//! service-account namespace file, `/etc/hostname` and Ollama's manifests. What is
//! recognised, from where and the limits are in `docs/workload-identity.md`.
//!
//! Values are bounded: the engine and the quantization come from fixed vocabularies (an
//! unknown `--quantization` value is kept only when short and made of `[a-z0-9_-]`), the
//! model name is cut at [`MAX_MODEL_LEN`] bytes.

use std::collections::HashMap;
use std::fs;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::in_root;
use super::procfs::{cgroup, maps, read_capped, split_nul};

/// Engine names (the `uvmwatch.engine` span attribute and the opt-in `engine` label).
pub const ENGINE_VLLM: &str = "vllm";
/// SGLang (`python -m sglang.launch_server`, `sglang::scheduler*` titles).
pub const ENGINE_SGLANG: &str = "sglang";
/// TensorRT-LLM (`trtllm-serve`, `tensorrt_llm` modules).
pub const ENGINE_TENSORRT_LLM: &str = "tensorrt-llm";
/// Ollama (`ollama serve`, `ollama runner`, the older `ollama_llama_server`).
pub const ENGINE_OLLAMA: &str = "ollama";
/// A Python program with `libtorch` mapped and no engine recognised.
pub const ENGINE_PYTORCH: &str = "pytorch";

/// Longest model name kept (longer ones are cut at a character boundary).
pub const MAX_MODEL_LEN: usize = 256;
/// Longest unknown `--quantization` value kept verbatim.
const MAX_QUANT_LEN: usize = 32;
/// How far up the parent chain a spawned worker looks for its server.
const MAX_ANCESTORS: usize = 6;
/// Cap on the bytes read from `environ`, `cmdline` and single small files.
const MAX_SMALL_FILE: u64 = 1 << 20;
/// Cap on the bytes of a file read in the process's root (namespace, hostname).
const MAX_ROOT_FILE: u64 = 4096;

/// What a traced process is, as far as procfs tells. Every field is optional: a field that
/// cannot be found stays `None` rather than being guessed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkloadInfo {
    /// `vllm`, `sglang`, `tensorrt-llm`, `ollama` or `pytorch` (the `ENGINE_*` constants).
    pub engine: Option<String>,
    /// Model as given to the server (Hugging Face id or path), or the Ollama `name:tag`.
    pub model: Option<String>,
    /// Weight quantization, normalised: `nvfp4`, `mxfp4`, `fp8`, `awq`, `gptq`, `int4`,
    /// `int8`, `bitsandbytes`, `gguf`, a GGUF type (`q4_k_m`), or a short unknown flag value.
    pub quantization: Option<String>,
    /// Tensor-parallel degree from the server's flags.
    pub tensor_parallel_size: Option<u32>,
    /// Tensor-parallel rank of this process (process title, or launcher environment).
    pub tp_rank: Option<u32>,
    /// Container id (64 hex digits, or `lxc:<name>`), from the cgroup path.
    pub container_id: Option<String>,
    /// Kubernetes pod UID, from a `kubepods` cgroup path.
    pub pod_uid: Option<String>,
    /// Kubernetes pod name (`POD_NAME`, or the pod's hostname; see the docs for limits).
    pub k8s_pod_name: Option<String>,
    /// Kubernetes namespace (`POD_NAMESPACE`, or the service-account namespace file).
    pub k8s_namespace: Option<String>,
}

impl WorkloadInfo {
    /// Values for the opt-in bounded metric labels `engine`, `namespace`, `pod` (empty
    /// string when unknown, as Prometheus treats an empty label as absent).
    pub fn metric_labels(&self) -> [(&'static str, &str); 3] {
        [
            ("engine", self.engine.as_deref().unwrap_or("")),
            ("namespace", self.k8s_namespace.as_deref().unwrap_or("")),
            ("pod", self.k8s_pod_name.as_deref().unwrap_or("")),
        ]
    }
}

/// What [`identify_facts`] works from: the raw readings of one process. Public so that
/// callers holding some of it already (and tests) need not read procfs again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcFacts {
    /// `/proc/<pid>/exe` target (may end in ` (deleted)`).
    pub exe: Option<PathBuf>,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    /// `/proc/<pid>/cmdline`, split at NULs (a `setproctitle` title is one element).
    pub cmdline: Vec<String>,
    /// The variables of `environ` this module uses (see [`ENV_KEYS`]); nothing else is kept.
    pub env: HashMap<String, String>,
    /// `/proc/<pid>/cgroup` contents.
    pub cgroup: String,
    /// Libraries of interest mapped (filled from `maps` only when needed).
    pub mapped: Mapped,
    /// Namespace from the service-account file under the process's root.
    pub sa_namespace: Option<String>,
    /// `/etc/hostname` under the process's root.
    pub root_hostname: Option<String>,
}

/// Libraries of interest found in `/proc/<pid>/maps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    /// `libtorch*` / `libc10_cuda`.
    pub torch: bool,
    /// vLLM's compiled extension (`vllm/_C.abi3.so`, `vllm/_moe_C`).
    pub vllm: bool,
    /// SGLang's kernels (`sgl_kernel/`).
    pub sglang: bool,
    /// TensorRT-LLM (`libtensorrt_llm`, `tensorrt_llm/libs/`).
    pub tensorrt_llm: bool,
}

/// Environment variables read from `environ` (only these are kept, never exported as such).
pub const ENV_KEYS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "POD_NAME",
    "POD_NAMESPACE",
    "HOSTNAME",
    "VLLM_PROCESS_NAME_PREFIX",
];

/// Identifies process `pid` from `<proc_root>/<pid>` (normally `/proc`).
///
/// Never fails: what cannot be read (process gone, permission) leaves fields `None`. Reads
/// at most a few small files, plus `maps` for a Python process no command line identified,
/// plus the command lines of up to six ancestors for a worker whose own command line lacks
/// the model. About 0.1 ms for an ordinary process; still, call it off any
/// latency-critical loop, or split it: [`read_facts`] early, [`identify_from`] later.
pub fn identify(proc_root: &Path, pid: u32) -> WorkloadInfo {
    identify_from(proc_root, pid, read_facts(proc_root, pid))
}

/// The identification from facts read earlier by [`read_facts`] (for callers that capture
/// the facts as soon as they see a process, which may exit soon after, and finish the work
/// elsewhere), completed with what is still readable then: `maps` for a Python process the
/// facts did not identify, the parent chain for a worker, Ollama's manifests.
pub fn identify_from(proc_root: &Path, pid: u32, mut facts: ProcFacts) -> WorkloadInfo {
    let mut info = identify_facts(&facts);
    if info.engine.is_none() && is_python(&facts) {
        facts.mapped = read_mapped(proc_root, pid);
        info = identify_facts(&facts);
    }
    inherit_from_ancestors(proc_root, pid, &facts, &mut info);
    resolve_ollama_blob(proc_root, pid, &mut info);
    info
}

/// Reads everything [`identify_facts`] uses except `maps` (see [`read_mapped`]).
pub fn read_facts(proc_root: &Path, pid: u32) -> ProcFacts {
    let dir = proc_root.join(pid.to_string());
    let cmdline = read_capped(&dir.join("cmdline"), MAX_SMALL_FILE)
        .map(|b| split_nul(&b))
        .unwrap_or_default();
    let env = read_capped(&dir.join("environ"), MAX_SMALL_FILE)
        .map(|b| pick_env(&b))
        .unwrap_or_default();
    let cgroup = read_capped(&dir.join("cgroup"), MAX_SMALL_FILE)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let comm = read_capped(&dir.join("comm"), 64)
        .map(|b| String::from_utf8_lossy(&b).trim_end().to_string())
        .unwrap_or_default();
    let root = dir.join("root");
    let read_in_root = |path: &str| {
        in_root::read_capped(&root, Path::new(path), MAX_ROOT_FILE)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let sa_namespace = [
        "/run/secrets/kubernetes.io/serviceaccount/namespace",
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
    ]
    .into_iter()
    .find_map(read_in_root)
    .and_then(|s| clean_k8s_name(&s));
    let root_hostname = read_in_root("/etc/hostname").and_then(|s| clean_k8s_name(&s));
    ProcFacts {
        exe: fs::read_link(dir.join("exe")).ok(),
        comm,
        cmdline,
        env,
        cgroup,
        mapped: Mapped::default(),
        sa_namespace,
        root_hostname,
    }
}

/// Scans `/proc/<pid>/maps` for the libraries of [`Mapped`] (stops early once torch and an
/// engine are both seen; reads at most [`maps::MAX_MAPS_BYTES`]).
pub fn read_mapped(proc_root: &Path, pid: u32) -> Mapped {
    let mut m = Mapped::default();
    // What was seen before an error (process gone) still counts.
    let _ = maps::scan(proc_root, pid, |file| {
        mark_mapped(&mut m, &file.path.to_string_lossy());
        if m.torch && (m.vllm || m.sglang || m.tensorrt_llm) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    m
}

fn mark_mapped(m: &mut Mapped, path: &str) {
    let file = path.rsplit('/').next().unwrap_or("");
    if file.starts_with("libtorch") || file.starts_with("libc10_cuda") {
        m.torch = true;
    }
    if path.contains("/vllm/_C.") || path.contains("/vllm/_moe_C.") {
        m.vllm = true;
    }
    if path.contains("/sgl_kernel/") {
        m.sglang = true;
    }
    if file.starts_with("libtensorrt_llm") || path.contains("/tensorrt_llm/libs/") {
        m.tensorrt_llm = true;
    }
}

/// The identification itself, from facts already read (pure; used by the unit tests).
pub fn identify_facts(f: &ProcFacts) -> WorkloadInfo {
    let args = &f.cmdline;
    let mut info = WorkloadInfo {
        container_id: cgroup::container_id(&f.cgroup),
        pod_uid: cgroup::pod_uid(&f.cgroup),
        ..WorkloadInfo::default()
    };

    let title = process_title(args, &f.env);
    let launch = python_launch(f);
    let engine = title
        .as_ref()
        .map(|t| t.engine)
        .or_else(|| engine_of_launch(f, &launch))
        .or_else(|| engine_of_maps(f));
    info.engine = engine.map(str::to_string);

    // The arguments after the program: for `python -m M ...` / `python script ...` those
    // after M / script, otherwise those after argv[0].
    let rest: &[String] = match &launch {
        Some(l) => &args[l.rest_at.min(args.len())..],
        None => args.get(1..).unwrap_or(&[]),
    };
    match engine {
        Some(ENGINE_VLLM) => {
            info.model = subcommand_positional(rest, &["serve"])
                .or_else(|| flag_value(rest, &["--model"]).map(str::to_string));
            info.tensor_parallel_size = flag_u32(rest, &["--tensor-parallel-size", "-tp"]);
            info.quantization = flag_value(rest, &["--quantization", "-q"]).map(str::to_string);
        }
        Some(ENGINE_SGLANG) => {
            info.model = flag_value(rest, &["--model-path", "--model"])
                .map(str::to_string)
                .or_else(|| subcommand_positional(rest, &["serve"]));
            info.tensor_parallel_size =
                flag_u32(rest, &["--tp-size", "--tp", "--tensor-parallel-size"]);
            info.quantization = flag_value(rest, &["--quantization"]).map(str::to_string);
        }
        Some(ENGINE_TENSORRT_LLM) => {
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
        Some(ENGINE_OLLAMA) => {
            info.model = flag_value(rest, &["--model"]).map(str::to_string);
        }
        Some(_) => {
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
        None => {}
    }
    if let Some(t) = &title {
        info.tp_rank = t.tp_rank;
    }
    info.model = info.model.as_deref().and_then(clean_model);
    info.quantization = quantization(info.quantization.as_deref(), info.model.as_deref());
    if info.tp_rank.is_none() {
        info.tp_rank = rank_from_env(&f.env, info.tensor_parallel_size);
    }
    if let Some(t) = &title {
        if info.tp_rank.is_none() {
            info.tp_rank = t.worker_rank.map(|r| match info.tensor_parallel_size {
                Some(n) if n > 0 => r % n,
                _ => r,
            });
        }
    }
    kubernetes(f, &mut info);
    info
}

/// For a worker that is a spawned child or carries only a title: takes the engine, model,
/// quantization and tensor-parallel size it lacks from the nearest ancestor that has them
/// (the server that started it).
fn inherit_from_ancestors(proc_root: &Path, pid: u32, f: &ProcFacts, info: &mut WorkloadInfo) {
    let spawned = is_spawned_child(&f.cmdline);
    let needs = |i: &WorkloadInfo| {
        (i.engine.is_none() && spawned)
            || (i.engine.is_some() && (i.model.is_none() || i.tensor_parallel_size.is_none()))
    };
    if !needs(info) {
        return;
    }
    let mut cur = pid;
    for _ in 0..MAX_ANCESTORS {
        let Some(ppid) = parent_pid(proc_root, cur) else {
            return;
        };
        if ppid <= 1 {
            return;
        }
        cur = ppid;
        let dir = proc_root.join(ppid.to_string());
        let cmdline = read_capped(&dir.join("cmdline"), MAX_SMALL_FILE)
            .map(|b| split_nul(&b))
            .unwrap_or_default();
        let pf = ProcFacts {
            exe: fs::read_link(dir.join("exe")).ok(),
            cmdline,
            ..ProcFacts::default()
        };
        let p = identify_facts(&pf);
        let Some(pe) = p.engine.as_deref() else {
            continue;
        };
        match info.engine.as_deref() {
            None if spawned => info.engine = Some(pe.to_string()),
            Some(e) if e == pe => {}
            _ => continue,
        }
        if info.model.is_none() {
            info.model = p.model.clone();
        }
        if info.quantization.is_none() {
            info.quantization = p.quantization.clone();
        }
        if info.tensor_parallel_size.is_none() {
            info.tensor_parallel_size = p.tensor_parallel_size;
        }
        if p.model.is_some() {
            return;
        }
    }
}

/// Parent pid from `/proc/<pid>/stat` (the field after the state, after the last `)`).
fn parent_pid(proc_root: &Path, pid: u32) -> Option<u32> {
    let stat = read_capped(&proc_root.join(pid.to_string()).join("stat"), 4096)?;
    let s = String::from_utf8_lossy(&stat);
    let after = &s[s.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the command line is that of a Python `multiprocessing` child (spawn or
/// forkserver), an `mpi4py.futures` worker, or a title only (`X::Y`).
fn is_spawned_child(args: &[String]) -> bool {
    args.iter().any(|a| {
        a.contains("multiprocessing.spawn")
            || a.contains("multiprocessing.forkserver")
            || a == "--multiprocessing-fork"
            || a == "mpi4py.futures.server"
    }) || (args.len() == 1 && args[0].contains("::"))
}

/// A process title set by an engine (`setproctitle`): replaces the whole command line.
struct Title {
    engine: &'static str,
    /// `TP<n>` in the title.
    tp_rank: Option<u32>,
    /// A worker rank that is not explicitly TP (`VllmWorker-3`).
    worker_rank: Option<u32>,
}

/// Recognises `VLLM::EngineCore`, `VLLM::Worker_PP0_TP1` (prefix from
/// `VLLM_PROCESS_NAME_PREFIX`), `sglang::scheduler_DP0_TP2`, and the older
/// `VllmWorker TP3` / `VllmWorker-3` / `VllmWorkerProcess`.
fn process_title(args: &[String], env: &HashMap<String, String>) -> Option<Title> {
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
struct Launch {
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

fn is_python(f: &ProcFacts) -> bool {
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
fn python_launch(f: &ProcFacts) -> Option<Launch> {
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
fn engine_of_launch(f: &ProcFacts, launch: &Option<Launch>) -> Option<&'static str> {
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
fn engine_of_maps(f: &ProcFacts) -> Option<&'static str> {
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

/// Model name as exported: trimmed, no control characters, at most [`MAX_MODEL_LEN`] bytes.
/// Ollama blob paths become `sha256-<first 12 hex>` unless resolved to a name elsewhere.
fn clean_model(m: &str) -> Option<String> {
    let m = m.trim();
    if m.is_empty() || m.chars().any(char::is_control) {
        return None;
    }
    Some(truncate(m, MAX_MODEL_LEN).to_string())
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

// --- quantization ------------------------------------------------------------------------

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

// --- ranks ----------------------------------------------------------------------------------

/// Rank from the launcher's environment: `RANK` (torchrun), `OMPI_COMM_WORLD_RANK`,
/// `PMI_RANK`, `PMIX_RANK` (MPI, as TensorRT-LLM uses), `LOCAL_RANK`. With the tensor-parallel
/// size known the global rank is reduced modulo it (tensor parallelism is the innermost
/// dimension in vLLM, SGLang, TensorRT-LLM and Megatron); without it `LOCAL_RANK` is
/// preferred, which equals the TP rank for the usual one-node tensor parallelism.
fn rank_from_env(env: &HashMap<String, String>, tp_size: Option<u32>) -> Option<u32> {
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

// --- Kubernetes -------------------------------------------------------------------------------

/// Pod name and namespace. Namespace: `POD_NAMESPACE` (downward API), else the
/// service-account namespace file. Pod name, only for a process in a pod (pod UID known or
/// namespace found): `POD_NAME`, else the pod's hostname (`/etc/hostname` in its root, then
/// `HOSTNAME`), which the kubelet sets to the pod name unless the pod sets
/// `spec.hostname`.
fn kubernetes(f: &ProcFacts, info: &mut WorkloadInfo) {
    let env = |k: &str| f.env.get(k).and_then(|v| clean_k8s_name(v));
    info.k8s_namespace = env("POD_NAMESPACE").or_else(|| f.sa_namespace.clone());
    let in_pod = info.pod_uid.is_some() || info.k8s_namespace.is_some();
    info.k8s_pod_name = env("POD_NAME").or_else(|| {
        in_pod
            .then(|| f.root_hostname.clone().or_else(|| env("HOSTNAME")))
            .flatten()
    });
}

/// A DNS-1123 name as Kubernetes uses for pods and namespaces (≤ 253 bytes of
/// `[a-z0-9.-]`), trimmed; anything else is rejected.
fn clean_k8s_name(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'))
    .then(|| s.to_string())
}

// --- file reading -----------------------------------------------------------------------------

fn pick_env(b: &[u8]) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for kv in b.split(|&c| c == 0) {
        let kv = String::from_utf8_lossy(kv);
        if let Some((k, v)) = kv.split_once('=') {
            if ENV_KEYS.contains(&k) {
                m.insert(k.to_string(), v.to_string());
            }
        }
    }
    m
}

// --- Ollama model names -------------------------------------------------------------------------

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
    let manifests = in_root::resolve(&root, None, &models.join("manifests")).ok()?;
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
fn resolve_ollama_blob(proc_root: &Path, pid: u32, info: &mut WorkloadInfo) {
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
    use crate::host::procfs::cgroup::tests::{KUBE_CGROUPFS, KUBE_SYSTEMD};

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn facts(cmd: &str) -> ProcFacts {
        let args = argv(cmd);
        ProcFacts {
            exe: args.first().map(PathBuf::from),
            comm: args
                .first()
                .map(|a| base(a).chars().take(15).collect())
                .unwrap_or_default(),
            cmdline: args,
            ..ProcFacts::default()
        }
    }

    fn env(f: &mut ProcFacts, kv: &[(&str, &str)]) {
        for (k, v) in kv {
            f.env.insert(k.to_string(), v.to_string());
        }
    }

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
    fn maps_markers() {
        let mut m = Mapped::default();
        mark_mapped(
            &mut m,
            "/usr/local/lib/python3.12/dist-packages/torch/lib/libtorch_cuda.so",
        );
        mark_mapped(
            &mut m,
            "/usr/local/lib/python3.12/dist-packages/vllm/_C.abi3.so",
        );
        assert!(m.torch && m.vllm && !m.sglang);
        mark_mapped(
            &mut m,
            "/x/site-packages/tensorrt_llm/libs/libtensorrt_llm.so",
        );
        assert!(m.tensorrt_llm);
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

    #[test]
    fn model_name_quantization() {
        let q = |m: &str| quant_from_model_name(m);
        assert_eq!(
            q("nvidia/Llama-3.1-8B-Instruct-FP4").as_deref(),
            Some("nvfp4")
        );
        assert_eq!(
            q("nvidia/Llama-3.3-70B-Instruct-NVFP4").as_deref(),
            Some("nvfp4")
        );
        assert_eq!(q("openai/gpt-oss-120b-MXFP4").as_deref(), Some("mxfp4"));
        assert_eq!(
            q("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic").as_deref(),
            Some("fp8")
        );
        assert_eq!(
            q("RedHatAI/Llama-3.1-8B-Instruct-quantized.w8a8").as_deref(),
            Some("int8")
        );
        assert_eq!(
            q("RedHatAI/Llama-3.1-8B-Instruct-quantized.w4a16").as_deref(),
            Some("int4")
        );
        assert_eq!(q("TheBloke/Llama-2-7B-GPTQ").as_deref(), Some("gptq"));
        assert_eq!(
            q("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4").as_deref(),
            Some("awq")
        );
        assert_eq!(
            q("unsloth/llama-3-8b-bnb-4bit").as_deref(),
            Some("bitsandbytes")
        );
        assert_eq!(
            q("/models/Meta-Llama-3-8B-Instruct.Q5_K_M.gguf").as_deref(),
            Some("q5_k_m")
        );
        assert_eq!(q("/models/model.IQ4_XS.gguf").as_deref(), Some("iq4_xs"));
        assert_eq!(q("/models/model.gguf").as_deref(), Some("gguf"));
        assert_eq!(q("meta-llama/Llama-3.1-8B-Instruct"), None);
        // Only the last component counts: an org called "fp8-lab" says nothing.
        assert_eq!(q("fp8-lab/llama"), None);
        // "q4_0" inside a longer token is not a GGUF type.
        assert_eq!(q("org/xq4_0y"), None);
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

    #[test]
    fn unknown_processes_stay_unknown() {
        let i = identify_facts(&facts("/usr/bin/cuda-workload --lib /x/libcuda.so.1"));
        assert_eq!(i, WorkloadInfo::default());
        let i = identify_facts(&facts("/usr/bin/python3 -c import torch"));
        assert_eq!(i.engine, None);
        let i = identify_facts(&ProcFacts::default());
        assert_eq!(i, WorkloadInfo::default());
    }

    #[test]
    fn model_values_are_cleaned() {
        let long = format!("org/{}", "m".repeat(400));
        let f = facts(&format!("vllm serve {long}"));
        assert_eq!(identify_facts(&f).model.unwrap().len(), MAX_MODEL_LEN);
        assert_eq!(clean_model("a\u{7}b"), None);
    }

    #[test]
    fn kubernetes_identity() {
        let mut f = facts("/usr/bin/python3 /usr/local/bin/vllm serve m");
        f.cgroup = KUBE_SYSTEMD.to_string();
        env(&mut f, &[("HOSTNAME", "vllm-7f9c-abcde")]);
        f.sa_namespace = Some("inference".into());
        let i = identify_facts(&f);
        assert_eq!(i.k8s_namespace.as_deref(), Some("inference"));
        assert_eq!(i.k8s_pod_name.as_deref(), Some("vllm-7f9c-abcde"));
        assert_eq!(
            i.container_id.as_deref(),
            Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        );
        // Downward API variables win; the pod's /etc/hostname beats HOSTNAME.
        f.root_hostname = Some("from-etc-hostname".into());
        let i = identify_facts(&f);
        assert_eq!(i.k8s_pod_name.as_deref(), Some("from-etc-hostname"));
        env(&mut f, &[("POD_NAME", "p-1"), ("POD_NAMESPACE", "ns-1")]);
        let i = identify_facts(&f);
        assert_eq!(i.k8s_pod_name.as_deref(), Some("p-1"));
        assert_eq!(i.k8s_namespace.as_deref(), Some("ns-1"));
        // Outside a pod HOSTNAME is the machine's name, not a pod's.
        let mut f = facts("/usr/bin/python3 /usr/local/bin/vllm serve m");
        env(&mut f, &[("HOSTNAME", "gpu-node-1")]);
        assert_eq!(identify_facts(&f).k8s_pod_name, None);
        assert_eq!(
            identify_facts(&f).metric_labels(),
            [("engine", "vllm"), ("namespace", ""), ("pod", "")]
        );
    }

    /// A procfs-like tree with a vLLM server and a spawned worker titled `VLLM::Worker`.
    fn fake_proc(t: &Path) {
        let mk = |pid: u32, ppid: u32, cmd: &[&str], env: &str| {
            let d = t.join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            let mut c = cmd.join("\0");
            c.push('\0');
            fs::write(d.join("cmdline"), c).unwrap();
            fs::write(
                d.join("stat"),
                format!("{pid} (py thon) S {ppid} 1 1 0 -1 4194560 0 0"),
            )
            .unwrap();
            fs::write(d.join("environ"), env).unwrap();
            fs::write(d.join("comm"), "python3\n").unwrap();
            fs::write(d.join("cgroup"), KUBE_CGROUPFS).unwrap();
            fs::write(d.join("maps"), "").unwrap();
        };
        mk(
            100,
            1,
            &[
                "/usr/bin/python3",
                "/usr/local/bin/vllm",
                "serve",
                "nvidia/Llama-3.1-8B-Instruct-FP8",
                "--tensor-parallel-size",
                "2",
            ],
            "PATH=/usr/bin\0HF_TOKEN=secret\0HOSTNAME=vllm-0\0POD_NAMESPACE=llm\0",
        );
        mk(101, 100, &["VLLM::EngineCore"], "HOSTNAME=vllm-0\0");
        mk(102, 101, &["VLLM::Worker_TP1"], "HOSTNAME=vllm-0\0");
        mk(
            103,
            101,
            &[
                "/usr/bin/python3",
                "-c",
                "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
                "--multiprocessing-fork",
            ],
            "",
        );
        // A program the server runs: not vLLM.
        mk(104, 100, &["/usr/bin/nvidia-smi", "-L"], "");
        // A python script with torch mapped.
        mk(105, 1, &["python3", "bench.py"], "RANK=3\0");
        fs::write(
            t.join("105/maps"),
            "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/python3/dist-packages/torch/lib/libtorch_cuda.so\n",
        )
        .unwrap();
    }

    #[test]
    fn identify_reads_procfs_and_inherits_from_the_server() {
        let t = tempfile::tempdir().unwrap();
        fake_proc(t.path());
        let server = identify(t.path(), 100);
        assert_eq!(server.engine.as_deref(), Some("vllm"));
        assert_eq!(
            server.model.as_deref(),
            Some("nvidia/Llama-3.1-8B-Instruct-FP8")
        );
        assert_eq!(server.quantization.as_deref(), Some("fp8"));
        assert_eq!(server.k8s_namespace.as_deref(), Some("llm"));
        assert_eq!(server.k8s_pod_name.as_deref(), Some("vllm-0"));
        assert_eq!(
            server.pod_uid.as_deref(),
            Some("0d3c2b1a-4d5e-4f60-9a7b-1c2d3e4f5a6b")
        );
        let worker = identify(t.path(), 102);
        assert_eq!(worker.engine.as_deref(), Some("vllm"));
        assert_eq!(worker.tp_rank, Some(1));
        assert_eq!(
            worker.model.as_deref(),
            Some("nvidia/Llama-3.1-8B-Instruct-FP8")
        );
        assert_eq!(worker.quantization.as_deref(), Some("fp8"));
        assert_eq!(worker.tensor_parallel_size, Some(2));
        let spawned = identify(t.path(), 103);
        assert_eq!(spawned.engine.as_deref(), Some("vllm"));
        assert_eq!(
            spawned.model.as_deref(),
            Some("nvidia/Llama-3.1-8B-Instruct-FP8")
        );
        assert_eq!(identify(t.path(), 104).engine, None);
        let script = identify(t.path(), 105);
        assert_eq!(script.engine.as_deref(), Some("pytorch"));
        assert_eq!(script.tp_rank, Some(3));
        // Gone: nothing, no panic.
        assert_eq!(identify(t.path(), 999), WorkloadInfo::default());
    }

    #[test]
    fn environ_keeps_only_the_listed_keys() {
        let e = pick_env(b"HF_TOKEN=hf_x\0RANK=2\0AWS_SECRET_ACCESS_KEY=y\0POD_NAME=p\0");
        assert_eq!(e.len(), 2);
        assert!(!e.contains_key("HF_TOKEN"));
    }

    #[test]
    fn identify_on_this_process_is_quick() {
        // The test binary itself: not an engine; whatever it reads must be quick.
        let pid = std::process::id();
        let start = std::time::Instant::now();
        let n = 50;
        for _ in 0..n {
            let i = identify(Path::new("/proc"), pid);
            assert_eq!(i.engine, None);
        }
        let per = start.elapsed() / n;
        eprintln!("identify(self): {per:?} per call");
        assert!(per < std::time::Duration::from_millis(20), "{per:?}");
    }
}

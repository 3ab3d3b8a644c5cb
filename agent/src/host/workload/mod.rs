//! Workload identity: which inference server (or plain PyTorch program) a traced process
//! is, and what users search it by: engine, model, quantization, tensor-parallel rank,
//! container and Kubernetes pod.
//!
//! Everything comes from procfs, read once per process: `exe`, `cmdline` (which is also
//! where `setproctitle` titles such as `VLLM::Worker_TP1` appear), selected variables of
//! `environ` (never the whole environment: it holds tokens), `cgroup` (container id, pod
//! UID), `maps` (only for Python processes no command line identified: is `torch` loaded),
//! the parent chain (a spawned vLLM worker inherits the server's model), and files resolved
//! inside the process's own root (`/proc/<pid>/root`, see [`super::files`]): the
//! service-account namespace file, `/etc/hostname`, Ollama's manifests and a local model
//! directory's `hf_quant_config.json` / `config.json` (`model_files.rs`). What is
//! recognised, from where and the limits are in `docs/workload-identity.md`.
//!
//! Values are bounded: the engine and the quantization come from fixed vocabularies (an
//! unknown `--quantization` value is kept only when short and made of `[a-z0-9_-]`), the
//! model name is cut at [`MAX_MODEL_LEN`] bytes.
//!
//! Here: what is read ([`read_facts`], [`read_mapped`]), the identification that puts it
//! together ([`identify_facts`]) and the inheritance from a worker's server; in
//! `launch.rs` the process title, command line and engine flags; in `quantization.rs` the
//! normalised quantization; in `model_files.rs` the quantization a local model directory
//! states; in `kubernetes.rs` the pod name and namespace; in `ollama.rs`
//! the model name from Ollama's manifests.

mod kubernetes;
mod launch;
mod model_files;
mod ollama;
mod quantization;
mod trace_context;

use std::collections::HashMap;
use std::fs;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::files::{read_capped, read_capped_below};
use super::procfs::{cgroup, maps, split_nul};

use kubernetes::{clean_k8s_name, kubernetes};
use launch::{
    engine_of_launch, engine_of_maps, is_python, process_title, python_launch, rank_from_env,
    read_engine_flags,
};
pub use model_files::quantization_from_model_files;
pub use ollama::ollama_model_name;
use ollama::resolve_ollama_blob;
pub use quantization::{quant_from_model_name, quantization};
pub use trace_context::TraceParent;

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
    /// The trace the process was started in (`TRACEPARENT`, `TRACESTATE`), which its start-up
    /// spans join; never inherited from another process.
    #[serde(skip)]
    pub trace_parent: Option<TraceParent>,
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
    "TRACEPARENT",
    "TRACESTATE",
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
    // What the checkpoint itself states beats its name and a generic flag: it is what the
    // engine loads (and an engine refuses a flag that contradicts it).
    if let Some(q) = info
        .model
        .as_deref()
        .and_then(|m| quantization_from_model_files(proc_root, pid, m))
    {
        info.quantization = Some(q);
    }
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
        read_capped_below(&root, Path::new(path), MAX_ROOT_FILE)
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

    if let Some(engine) = engine {
        read_engine_flags(engine, args, &launch, &mut info);
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
    info.trace_parent = f
        .env
        .get("TRACEPARENT")
        .and_then(|t| TraceParent::parse(t, f.env.get("TRACESTATE").map(String::as_str)));
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

/// Model name as exported: trimmed, no control characters, at most [`MAX_MODEL_LEN`] bytes.
/// Ollama blob paths become `sha256-<first 12 hex>` unless resolved to a name elsewhere.
fn clean_model(m: &str) -> Option<String> {
    let m = m.trim();
    if m.is_empty() || m.chars().any(char::is_control) {
        return None;
    }
    Some(truncate(m, MAX_MODEL_LEN).to_string())
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(super) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Last component of a `/`-separated path.
pub(super) fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::host::procfs::cgroup::tests::KUBE_CGROUPFS;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    pub(super) fn facts(cmd: &str) -> ProcFacts {
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

    pub(super) fn env(f: &mut ProcFacts, kv: &[(&str, &str)]) {
        for (k, v) in kv {
            f.env.insert(k.to_string(), v.to_string());
        }
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
    fn a_local_model_directory_says_its_own_quantization() {
        // `vllm serve /models/llama` with a generic flag, and a worker that inherits the
        // model: the checkpoint's hf_quant_config.json names NVFP4.
        let t = tempfile::tempdir().unwrap();
        let mk = |pid: u32, ppid: u32, args: &[&str]| {
            let d = t.path().join(pid.to_string());
            fs::create_dir_all(d.join("root/models/llama")).unwrap();
            fs::write(d.join("cmdline"), args.join("\0") + "\0").unwrap();
            fs::write(
                d.join("stat"),
                format!("{pid} (python3) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0"),
            )
            .unwrap();
            fs::write(
                d.join("root/models/llama/hf_quant_config.json"),
                r#"{"producer": {"name": "modelopt", "version": "0.23.0"},
                    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                                     "group_size": 16, "exclude_modules": ["lm_head"]}}"#,
            )
            .unwrap();
            std::os::unix::fs::symlink("/", d.join("cwd")).unwrap();
        };
        mk(
            200,
            1,
            &[
                "/usr/bin/python3",
                "/usr/local/bin/vllm",
                "serve",
                "/models/llama",
                "--quantization",
                "modelopt",
            ],
        );
        mk(201, 200, &["VLLM::Worker_TP0"]);
        for pid in [200, 201] {
            let i = identify(t.path(), pid);
            assert_eq!(i.model.as_deref(), Some("/models/llama"), "{pid}");
            assert_eq!(i.quantization.as_deref(), Some("nvfp4"), "{pid}");
        }
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

//! Evidence collectors: read the diagnosed machine through a [`Root`] and fill an
//! [`Evidence`].
//!
//! [`collect`] never fails and never panics on what it reads: each source that is missing or
//! malformed becomes a [`Fact`] whose value is `Err(Unavailable)` with a reason a user can act
//! on (`not present: the nvidia kernel module is not loaded ...`, `not readable: Permission
//! denied (os error 13)`, `malformed: ...`). Text parsers are small pure functions (`parse_*`)
//! tested on realistic text.

use std::collections::BTreeMap;
use std::io::{self, Read};

use super::facts::{
    ContainerInfo, DevNode, DriverInfo, Evidence, Fact, KernelInfo, KernelLog, MappedLibcuda,
    SmiInfo,
};
use super::root::{FileKind, Root};

/// `/proc/driver/nvidia/version` (nvidia module, `nv-procfs.c`).
pub const DRIVER_VERSION_PATH: &str = "/proc/driver/nvidia/version";
/// `/proc/driver/nvidia/params` (nvidia module parameters as `Key: value`).
pub const DRIVER_PARAMS_PATH: &str = "/proc/driver/nvidia/params";
/// `/sys/module/nvidia_uvm/parameters` (one file per `nvidia_uvm` module parameter).
pub const UVM_PARAMS_DIR: &str = "/sys/module/nvidia_uvm/parameters";
/// `/proc/modules` (`kernel/module/procfs.c`).
pub const MODULES_PATH: &str = "/proc/modules";
/// `/proc/devices` (`fs/proc/devices.c`).
pub const DEVICES_PATH: &str = "/proc/devices";
/// `/proc/sys/kernel/osrelease` (`uname -r`).
pub const OSRELEASE_PATH: &str = "/proc/sys/kernel/osrelease";
/// `/proc/config.gz` (`CONFIG_IKCONFIG_PROC`).
pub const CONFIG_GZ_PATH: &str = "/proc/config.gz";
/// `/proc/cmdline`.
pub const CMDLINE_PATH: &str = "/proc/cmdline";
/// `/proc/iomem`.
pub const IOMEM_PATH: &str = "/proc/iomem";

/// Resource name nvidia_uvm gives `request_free_mem_region()` for HMM device memory
/// (`kernel-open/nvidia-uvm/uvm_pmm_gpu.c`); present in `/proc/iomem` once HMM set-up worked.
pub const UVM_HMM_RESOURCE: &str = "nvidia-uvm-hmm";

/// The only kernel configuration options kept ([`Evidence::kernel_config`]).
pub const KERNEL_CONFIG_KEYS: [&str; 6] = [
    "CONFIG_HMM_MIRROR",
    "CONFIG_DEVICE_PRIVATE",
    "CONFIG_RANDOMIZE_BASE",
    "CONFIG_RANDOMIZE_MEMORY",
    "CONFIG_KPROBES",
    "CONFIG_ZONE_DEVICE",
];

/// Daemons looked for by process name ([`Evidence::daemons`]).
pub const DAEMONS: [&str; 2] = ["nv-fabricmanager", "nvidia-persistenced"];

/// Most `nvidia_lines` kept from the kernel log (the last ones).
pub const MAX_NVIDIA_LINES: usize = 200;

/// Sources of the container detection, as [`Evidence::container`] names them when no single
/// one decided.
pub const CONTAINER_SOURCES: &str =
    "/proc/1/cgroup, /proc/self/cgroup, /.dockerenv, /run/.containerenv, /proc/1/environ";

/// Biggest decompressed `/proc/config.gz` accepted (real ones are about 300 KiB).
const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Most symbolic links followed when resolving a libcuda path (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Reads every source through `root` and returns the evidence. Never panics and never
/// fails; see the module documentation for how failures are reported.
///
/// Live ([`Root::Live`]) this also runs `nvidia-smi -q` (at most 10 s) and, where the root
/// allows it ([`Root::live`] without a host root), opens each `/dev/nvidia*` node once (see
/// [`Root::open_device`]).
pub fn collect(root: &Root) -> Evidence {
    let kernel = collect_kernel(root);
    let kernel_config = collect_kernel_config(root, kernel.get().map(|k| k.release.as_str()));
    let (dev_nodes, nvswitch_nodes) = collect_dev_nodes(root);
    let (daemons, libcuda) = collect_processes(root);
    Evidence {
        driver: collect_driver(root),
        driver_params: collect_driver_params(root),
        uvm_params: collect_uvm_params(root),
        modules: read_fact(
            root.read_to_string(MODULES_PATH),
            MODULES_PATH,
            Some("the kernel has no loadable module support (no /proc/modules), so no nvidia module can be loaded"),
        )
        .map_ok(|t| parse_modules(&t)),
        devices: read_fact(root.read_to_string(DEVICES_PATH), DEVICES_PATH, None)
            .map_ok(|t| parse_devices(&t)),
        dev_nodes,
        nvswitch_nodes,
        container: collect_container(root),
        kernel,
        kernel_config,
        cmdline: read_fact(root.read_to_string(CMDLINE_PATH), CMDLINE_PATH, None)
            .map_ok(|t| t.trim_end_matches(['\n', '\0']).to_string()),
        iomem_hmm: collect_iomem(root),
        smi: collect_smi(root),
        kernel_log: collect_kernel_log(root),
        daemons,
        libcuda,
    }
}

/// `Fact` helpers local to the collectors.
trait FactExt<T> {
    fn map_ok<U>(self, f: impl FnOnce(T) -> U) -> Fact<U>;
}

impl<T> FactExt<T> for Fact<T> {
    fn map_ok<U>(self, f: impl FnOnce(T) -> U) -> Fact<U> {
        Fact {
            value: self.value.map(f),
            source: self.source,
        }
    }
}

/// A read as a fact: a missing file is `not present: <absent>` when that explains it, any
/// other error `not readable: <error>`.
fn read_fact<T>(res: io::Result<T>, source: &str, absent: Option<&str>) -> Fact<T> {
    match res {
        Ok(v) => Fact::ok(v, source),
        Err(err) => Fact::unavailable(why_unreadable(&err, absent), source),
    }
}

fn why_unreadable(err: &io::Error, absent: Option<&str>) -> String {
    match absent {
        Some(absent) if err.kind() == io::ErrorKind::NotFound => format!("not present: {absent}"),
        _ => format!("not readable: {err}"),
    }
}

/// Parses a fact's text, turning a parse error into `malformed: <why>`.
fn parse_fact<T>(text: Fact<String>, parse: impl FnOnce(&str) -> Result<T, String>) -> Fact<T> {
    match text.value {
        Ok(t) => match parse(&t) {
            Ok(v) => Fact::ok(v, text.source),
            Err(why) => Fact::unavailable(format!("malformed: {why}"), text.source),
        },
        Err(u) => Fact {
            value: Err(u),
            source: text.source,
        },
    }
}

fn collect_driver(root: &Root) -> Fact<DriverInfo> {
    let text = read_fact(
        root.read_to_string(DRIVER_VERSION_PATH),
        DRIVER_VERSION_PATH,
        Some("the nvidia kernel module is not loaded (no /proc/driver/nvidia/version)"),
    );
    parse_fact(text, parse_driver_version)
}

fn collect_driver_params(root: &Root) -> Fact<BTreeMap<String, String>> {
    read_fact(
        root.read_to_string(DRIVER_PARAMS_PATH),
        DRIVER_PARAMS_PATH,
        Some("the nvidia kernel module is not loaded (no /proc/driver/nvidia/params)"),
    )
    .map_ok(|t| parse_key_values(&t))
}

fn collect_uvm_params(root: &Root) -> Fact<BTreeMap<String, String>> {
    let names = match root.read_dir(UVM_PARAMS_DIR) {
        Ok(names) => names,
        Err(err) => return Fact::unavailable(
            why_unreadable(
                &err,
                Some("the nvidia_uvm module is not loaded (no /sys/module/nvidia_uvm/parameters)"),
            ),
            UVM_PARAMS_DIR,
        ),
    };
    let mut params = BTreeMap::new();
    for name in names {
        // A parameter that cannot be read (mode 0400 as non-root) is left out.
        if let Ok(value) = root.read_to_string(&format!("{UVM_PARAMS_DIR}/{name}")) {
            params.insert(name, value.trim_end_matches('\n').to_string());
        }
    }
    Fact::ok(params, UVM_PARAMS_DIR)
}

fn collect_kernel(root: &Root) -> Fact<KernelInfo> {
    let text = read_fact(root.read_to_string(OSRELEASE_PATH), OSRELEASE_PATH, None);
    parse_fact(text, parse_kernel_release)
}

fn collect_kernel_config(root: &Root, release: Option<&str>) -> Fact<BTreeMap<String, String>> {
    let gz_err = match root.read_bytes(CONFIG_GZ_PATH) {
        Ok(bytes) => match gunzip(&bytes) {
            Ok(text) => return Fact::ok(parse_kernel_config(&text), CONFIG_GZ_PATH),
            Err(err) => Err(format!("{CONFIG_GZ_PATH}: malformed: {err}")),
        },
        Err(err) => Ok(err),
    };
    let Some(release) = release else {
        let gz = match &gz_err {
            Ok(err) => format!("{CONFIG_GZ_PATH}: {err}"),
            Err(text) => text.clone(),
        };
        return Fact::unavailable(
            format!("not readable: {gz}; the kernel release is unknown, so /boot/config-<release> was not tried"),
            CONFIG_GZ_PATH,
        );
    };
    let boot = format!("/boot/config-{release}");
    match root.read_to_string(&boot) {
        Ok(text) => Fact::ok(parse_kernel_config(&text), boot),
        Err(boot_err) => {
            let source = format!("{CONFIG_GZ_PATH}, {boot}");
            let why = match &gz_err {
                Ok(gz)
                    if gz.kind() == io::ErrorKind::NotFound
                        && boot_err.kind() == io::ErrorKind::NotFound =>
                {
                    format!("not present: the kernel has no {CONFIG_GZ_PATH} (CONFIG_IKCONFIG_PROC) and {boot} is missing")
                }
                Ok(gz) => format!("not readable: {CONFIG_GZ_PATH}: {gz}; {boot}: {boot_err}"),
                Err(gz) => format!("not readable: {gz}; {boot}: {boot_err}"),
            };
            Fact::unavailable(why, source)
        }
    }
}

fn gunzip(bytes: &[u8]) -> io::Result<String> {
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn collect_iomem(root: &Root) -> Fact<Vec<String>> {
    let keep = |line: &[u8]| {
        String::from_utf8_lossy(line)
            .contains(UVM_HMM_RESOURCE)
            .then(|| line.to_vec())
    };
    read_fact(
        root.read_filtered(IOMEM_PATH, b'\n', &keep),
        IOMEM_PATH,
        None,
    )
    .map_ok(|b| {
        String::from_utf8_lossy(&b)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    })
}

fn collect_smi(root: &Root) -> Fact<SmiInfo> {
    const SOURCE: &str = "nvidia-smi -q";
    match root.command("nvidia-smi", &["-q"]) {
        Ok(text) => match parse_smi(&text) {
            Ok(info) => Fact::ok(info, SOURCE),
            Err(why) => Fact::unavailable(format!("malformed: {why}"), SOURCE),
        },
        Err(err) => Fact::unavailable(err.to_string(), SOURCE),
    }
}

fn collect_kernel_log(root: &Root) -> Fact<KernelLog> {
    match root.kernel_log() {
        Ok((text, source)) => Fact::ok(parse_kernel_log(&text), source),
        Err(err) => Fact::unavailable(err.to_string(), "/dev/kmsg, dmesg"),
    }
}

fn collect_dev_nodes(root: &Root) -> (Fact<Vec<DevNode>>, Fact<Vec<String>>) {
    const NODES: &str = "/dev/nvidia*";
    const SWITCHES: &str = "/dev/nvidia-nvswitch*";
    let names = match root.read_dir("/dev") {
        Ok(names) => names,
        Err(err) => {
            let why = why_unreadable(&err, None);
            return (
                Fact::unavailable(why.clone(), NODES),
                Fact::unavailable(why, SWITCHES),
            );
        }
    };
    let mut nodes = Vec::new();
    let mut switches = Vec::new();
    for name in names.iter().filter(|n| n.starts_with("nvidia")) {
        let path = format!("/dev/{name}");
        if name.starts_with("nvidia-nvswitch") {
            // Not opened (the fabric manager owns them); the stat keeps them in a bundle.
            let _ = root.metadata(&path);
            switches.push(path);
            continue;
        }
        // `/dev/nvidia-caps/` and `/dev/nvidia-caps-imex-channels/` hold capability nodes.
        if name.starts_with("nvidia-caps") {
            continue;
        }
        let dev = match root.metadata(&path) {
            Ok(meta) if meta.kind == FileKind::Char => meta.dev,
            _ => None,
        };
        // Tried for every entry: a directory or plain file where a node should be (a bind
        // mount of a missing node) or a dangling link gives a telling errno too.
        let open = root.open_device(&path);
        nodes.push(DevNode { path, dev, open });
    }
    (Fact::ok(nodes, NODES), Fact::ok(switches, SWITCHES))
}

fn collect_container(root: &Root) -> Fact<ContainerInfo> {
    let pid1 = root.read_to_string("/proc/1/cgroup");
    let own = root.read_to_string("/proc/self/cgroup");
    if let (Err(e1), Err(e2)) = (&pid1, &own) {
        return Fact::unavailable(
            format!("not readable: /proc/1/cgroup: {e1}; /proc/self/cgroup: {e2}"),
            CONTAINER_SOURCES,
        );
    }
    let environ = root
        .read_filtered("/proc/1/environ", 0, &keep_environ)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let own = own.ok();
    let devices_list = read_devices_list(root, own.as_deref());
    let inputs = ContainerInputs {
        pid1_cgroup: pid1.ok(),
        self_cgroup: own,
        dockerenv: root.exists("/.dockerenv"),
        containerenv: root.exists("/run/.containerenv"),
        pid1_environ: environ,
        devices_list,
    };
    let (info, source) = detect_container(&inputs);
    Fact::ok(info, source)
}

/// Keeps the `/proc/1/environ` entries the detection uses: `container=<runtime>` as is,
/// `KUBERNETES_SERVICE_HOST` with its value replaced by `<redacted>`.
fn keep_environ(entry: &[u8]) -> Option<Vec<u8>> {
    if entry.starts_with(b"container=") {
        Some(entry.to_vec())
    } else if entry.starts_with(b"KUBERNETES_SERVICE_HOST=") {
        Some(b"KUBERNETES_SERVICE_HOST=<redacted>".to_vec())
    } else {
        None
    }
}

/// cgroup v1 `devices.list` of the doctor's own cgroup: under the `devices` controller's
/// path from `/proc/self/cgroup`, else at the controller's root (what a container sees).
fn read_devices_list(root: &Root, self_cgroup: Option<&str>) -> Option<String> {
    let mut candidates = Vec::new();
    if let Some(text) = self_cgroup {
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            if let (Some(controllers), Some(path)) = (controllers, path) {
                if controllers.split(',').any(|c| c == "devices") && path != "/" {
                    candidates.push(format!("/sys/fs/cgroup/devices{path}/devices.list"));
                }
            }
        }
    }
    candidates.push("/sys/fs/cgroup/devices/devices.list".to_string());
    candidates.iter().find_map(|p| root.read_to_string(p).ok())
}

/// What the container detection looks at ([`detect_container`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInputs {
    /// `/proc/1/cgroup`.
    pub pid1_cgroup: Option<String>,
    /// `/proc/self/cgroup` (the doctor's own).
    pub self_cgroup: Option<String>,
    /// `/.dockerenv` exists (Docker creates it in every container).
    pub dockerenv: bool,
    /// `/run/.containerenv` exists (Podman; CRI-O too).
    pub containerenv: bool,
    /// `/proc/1/environ` (NUL-separated; only `container=` and `KUBERNETES_SERVICE_HOST`
    /// matter).
    pub pid1_environ: Option<String>,
    /// cgroup v1 `devices.list` contents, when readable.
    pub devices_list: Option<String>,
}

/// Decides where the doctor runs, and names the source that decided.
///
/// In order: a `kubepods` cgroup path or `KUBERNETES_SERVICE_HOST` in init's environment
/// (`kubernetes`, with the pod UID from the cgroup path); the runtime named by the cgroup
/// path that holds a container id (`docker`, `containerd`, `cri-o`, `podman`, `lxc`, see
/// [`crate::host::procfs::container_id`]); `/.dockerenv` (`docker`); `/run/.containerenv`
/// (`podman`); `container=` in init's environment (`lxc`, `docker`, `podman`, else
/// `container`); a container id alone (`container`); else `host`. The doctor's own cgroup
/// is looked at before init's.
pub fn detect_container(inputs: &ContainerInputs) -> (ContainerInfo, String) {
    let cgroups: Vec<(&str, &str)> = [
        ("/proc/self/cgroup", inputs.self_cgroup.as_deref()),
        ("/proc/1/cgroup", inputs.pid1_cgroup.as_deref()),
    ]
    .into_iter()
    .filter_map(|(source, text)| text.map(|t| (source, t)))
    .collect();
    let id_and_runtime = cgroups.iter().find_map(|(source, text)| {
        text.lines().find_map(|line| {
            crate::host::procfs::container_id(line)
                .map(|id| (id, runtime_of_cgroup_line(line), *source))
        })
    });
    let env: Vec<&str> = inputs
        .pid1_environ
        .as_deref()
        .unwrap_or("")
        .split('\0')
        .collect();
    let env_container = env
        .iter()
        .find_map(|e| e.strip_prefix("container="))
        .filter(|v| !v.is_empty());
    let k8s_env = env
        .iter()
        .any(|e| e.starts_with("KUBERNETES_SERVICE_HOST="));
    let k8s_cgroup = cgroups
        .iter()
        .find(|(_, text)| text.contains("kubepods"))
        .map(|(source, _)| *source);
    let pod_uid = cgroups.iter().find_map(|(_, text)| pod_uid(text));

    let (kind, source) = if let Some(source) = k8s_cgroup {
        ("kubernetes".to_string(), source.to_string())
    } else if k8s_env {
        ("kubernetes".to_string(), "/proc/1/environ".to_string())
    } else if let Some((_, Some(runtime), source)) = &id_and_runtime {
        (runtime.to_string(), source.to_string())
    } else if inputs.dockerenv {
        ("docker".to_string(), "/.dockerenv".to_string())
    } else if inputs.containerenv {
        ("podman".to_string(), "/run/.containerenv".to_string())
    } else if let Some(value) = env_container {
        let kind = match value {
            "lxc" | "lxc-libvirt" => "lxc",
            "docker" => "docker",
            "podman" => "podman",
            _ => "container",
        };
        (kind.to_string(), "/proc/1/environ".to_string())
    } else if let Some((_, None, source)) = &id_and_runtime {
        ("container".to_string(), source.to_string())
    } else {
        ("host".to_string(), CONTAINER_SOURCES.to_string())
    };
    let id = id_and_runtime.map(|(id, _, _)| match id.strip_prefix("lxc:") {
        Some(name) => name.to_string(),
        None => id,
    });
    let device_allow = inputs.devices_list.as_ref().map(|t| {
        t.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    });
    (
        ContainerInfo {
            kind,
            id,
            pod_uid,
            device_allow,
        },
        source,
    )
}

/// Runtime named by one `/proc/<pid>/cgroup` line whose path holds a container id.
fn runtime_of_cgroup_line(line: &str) -> Option<&'static str> {
    let path = line.splitn(3, ':').nth(2)?;
    if path.contains("cri-containerd-") || path.contains("/containerd/") {
        Some("containerd")
    } else if path.contains("crio-") {
        Some("cri-o")
    } else if path.contains("libpod-") || path.contains("/libpod_parent/") {
        Some("podman")
    } else if path.contains("docker") {
        Some("docker")
    } else if path.contains("lxc") {
        Some("lxc")
    } else {
        None
    }
}

/// Kubernetes pod UID from `/proc/<pid>/cgroup` contents: the `pod<uid>` component of a
/// `kubepods` path (cgroupfs driver: `/kubepods/burstable/pod<uid>/...`; systemd driver:
/// `kubepods-burstable-pod<uid with _ for ->.slice`), with dashes.
pub fn pod_uid(cgroup_text: &str) -> Option<String> {
    cgroup_text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        if !path.contains("kubepods") {
            return None;
        }
        path.split('/').find_map(|comp| {
            let stem = comp.strip_suffix(".slice").unwrap_or(comp);
            let raw = stem
                .strip_prefix("pod")
                .or_else(|| stem.rsplit('-').next()?.strip_prefix("pod"))?;
            let uid = raw.replace('_', "-");
            (!uid.is_empty() && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
                .then_some(uid)
        })
    })
}

/// Lists processes once and fills [`Evidence::daemons`] and [`Evidence::libcuda`].
fn collect_processes(root: &Root) -> (Fact<Vec<String>>, Fact<Vec<MappedLibcuda>>) {
    const DAEMON_SOURCE: &str = "/proc/<pid>/comm";
    const LIBCUDA_SOURCE: &str = "/proc/<pid>/maps";
    let proc_dir = root.fs_path("/proc");
    let pids = match crate::host::procfs::list_pids(&proc_dir) {
        Ok(pids) => pids,
        Err(err) => {
            let why = format!("not readable: cannot list processes: {}", err.root_cause());
            return (
                Fact::unavailable(why.clone(), DAEMON_SOURCE),
                Fact::unavailable(why, LIBCUDA_SOURCE),
            );
        }
    };
    let keep_daemon =
        |comm: &[u8]| daemon_of_comm(String::from_utf8_lossy(comm).trim()).map(|_| comm.to_vec());
    let mut daemons = Vec::new();
    let mut libcuda = Vec::new();
    for pid in pids {
        if let Ok(comm) = root.scan_filtered(&format!("/proc/{pid}/comm"), b'\n', &keep_daemon) {
            if let Some(name) = daemon_of_comm(String::from_utf8_lossy(&comm).trim()) {
                daemons.push(name.to_string());
            }
        }
        let maps = root.scan_filtered(&format!("/proc/{pid}/maps"), b'\n', &keep_libcuda_line);
        if !matches!(&maps, Ok(kept) if !kept.is_empty()) {
            continue;
        }
        // The process may have exited since: skip it then.
        let Ok(paths) = crate::host::discovery::mapped_libcuda(&proc_dir, pid) else {
            continue;
        };
        let comm = root
            .read_to_string(&format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end_matches('\n').to_string())
            .unwrap_or_default();
        for path in paths {
            let path = path.to_string_lossy().into_owned();
            libcuda.push(MappedLibcuda {
                pid,
                comm: comm.clone(),
                version: resolve_libcuda_version(root, pid, &path),
                compat: is_compat_path(&path),
                path,
            });
        }
    }
    daemons.sort();
    daemons.dedup();
    (
        Fact::ok(daemons, DAEMON_SOURCE),
        Fact::ok(libcuda, LIBCUDA_SOURCE),
    )
}

/// Which of [`DAEMONS`] a process name (`/proc/<pid>/comm`) is. The kernel keeps at most 15
/// bytes of a name (`TASK_COMM_LEN` is 16), so `nvidia-persiste` is `nvidia-persistenced`.
pub fn daemon_of_comm(comm: &str) -> Option<&'static str> {
    DAEMONS
        .into_iter()
        .find(|d| comm == *d || (comm.len() == 15 && d.starts_with(comm)))
}

/// Keeps a `/proc/<pid>/maps` line whose path names libcuda
/// ([`crate::host::discovery::is_libcuda_name`]); the path is everything from the first `/` (the
/// fields before it hold none).
fn keep_libcuda_line(line: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(line);
    let path = &text[text.find('/')?..];
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    crate::host::discovery::is_libcuda_name(path).then(|| line.to_vec())
}

/// Driver version in a libcuda file name: `libcuda.so.590.48.01` gives `590.48.01`; names
/// without a dotted version (`libcuda.so`, `libcuda.so.1`) give `None`.
pub fn libcuda_version(file_name: &str) -> Option<String> {
    let rest = file_name.strip_prefix("libcuda.so.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    (parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| rest.to_string())
}

/// Whether a path lies in a `compat` directory (the CUDA forward-compatibility package,
/// e.g. `/usr/local/cuda-12.8/compat/libcuda.so.570.86.15`).
pub fn is_compat_path(path: &str) -> bool {
    path.split('/').any(|c| c == "compat")
}

/// Version of the libcuda file `path` (inside process `pid`'s mount namespace) resolves to:
/// the file name if it carries a version, else the targets of its symbolic links read
/// through `/proc/<pid>/root`. `None` when no name on the way has a version or a link
/// cannot be read.
fn resolve_libcuda_version(root: &Root, pid: u32, path: &str) -> Option<String> {
    let ns_root = format!("/proc/{pid}/root");
    let mut current = normalize(path);
    for _ in 0..=MAX_LINKS {
        let name = current.rsplit('/').next().unwrap_or(&current);
        if let Some(version) = libcuda_version(name) {
            return Some(version);
        }
        let target = root.read_link(&format!("{ns_root}{current}")).ok()?;
        current = if target.starts_with('/') {
            normalize(&target)
        } else {
            let parent = current.rsplit_once('/').map_or("", |(p, _)| p);
            normalize(&format!("{parent}/{target}"))
        };
    }
    None
}

/// Lexically normalised absolute path: `.` dropped, `..` applied (never above `/`).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Parses the first line of `/proc/driver/nvidia/version`:
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (...)`
/// (open module) or `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  <date>`
/// (proprietary). The version is the first word made of digits and dots with at least one
/// dot.
///
/// Errors: the first line does not start with `NVRM version:` or has no version.
pub fn parse_driver_version(text: &str) -> Result<DriverInfo, String> {
    let line = text.lines().next().unwrap_or("").trim_end();
    if !line.starts_with("NVRM version:") {
        return Err(format!("first line is not `NVRM version: ...`: {line:?}"));
    }
    let version = line
        .split_whitespace()
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && !w.ends_with('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .ok_or_else(|| format!("no version number in {line:?}"))?;
    Ok(DriverInfo {
        version: version.to_string(),
        open_module: line.contains("Open Kernel Module"),
        line: line.to_string(),
    })
}

/// Parses `Key: value` lines (`/proc/driver/nvidia/params`): key and value trimmed, value
/// kept as printed (quotes included, may be empty). Lines without `:` are skipped.
pub fn parse_key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            let key = key.trim();
            (!key.is_empty()).then(|| (key.to_string(), value.trim().to_string()))
        })
        .collect()
}

/// Names of the modules in `/proc/modules` (`name size refcount deps state address`) that
/// start with `nvidia` (`nvidia`, `nvidia_uvm`, `nvidia_modeset`, `nvidia_drm`,
/// `nvidia_peermem`), in file order.
pub fn parse_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with("nvidia"))
        .map(str::to_string)
        .collect()
}

/// Majors by name from the `Character devices:` section of `/proc/devices`, for names
/// starting with `nvidia` (`nvidia-frontend` 195, `nvidia-uvm` (dynamic), `nvidia-nvswitch`,
/// `nvidia-caps`, ...). The `Block devices:` section is ignored.
pub fn parse_devices(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, name)) = line.split_once(char::is_whitespace) {
            let name = name.trim();
            if let (Ok(major), true) = (major.parse::<u32>(), name.starts_with("nvidia")) {
                out.insert(name.to_string(), major);
            }
        }
    }
    out
}

/// Parses a kernel release (`/proc/sys/kernel/osrelease`, e.g. `6.8.0-45-generic`): the
/// `(major, minor)` are the leading digits of its first two dot-separated parts.
///
/// Errors: empty, or no `major.minor` at the start.
pub fn parse_kernel_release(text: &str) -> Result<KernelInfo, String> {
    let release = text.trim();
    let mut parts = release.split('.');
    let leading = |s: Option<&str>| -> Option<u32> {
        let s = s?;
        let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    };
    match (leading(parts.next()), leading(parts.next())) {
        (Some(major), Some(minor)) => Ok(KernelInfo {
            release: release.to_string(),
            version: (major, minor),
        }),
        _ => Err(format!("no major.minor version in {release:?}")),
    }
}

/// The [`KERNEL_CONFIG_KEYS`] options of a kernel `.config`: `CONFIG_X=y` gives `y` (quotes
/// removed from string values), `# CONFIG_X is not set` gives `n`. Options absent from the
/// text are absent from the map.
pub fn parse_kernel_config(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(key) = line
            .strip_prefix("# ")
            .and_then(|r| r.strip_suffix(" is not set"))
        {
            if KERNEL_CONFIG_KEYS.contains(&key) {
                out.insert(key.to_string(), "n".to_string());
            }
        } else if let Some((key, value)) = line.split_once('=') {
            if KERNEL_CONFIG_KEYS.contains(&key) {
                out.insert(key.to_string(), value.trim_matches('"').to_string());
            }
        }
    }
    out
}

/// Parses `nvidia-smi -q` text.
///
/// The format is indented `Key : value` lines (4 spaces a level); a line without ` : ` opens
/// a section (`MIG Mode`, `Fabric`), and each `GPU <bus id>` line at the left margin starts
/// a GPU. Per GPU it takes `Product Brand`, `Persistence Mode`, `Addressing Mode`,
/// `Compute Mode`, `MIG Mode / Current` and `Fabric / State`; a GPU whose section lacks one
/// (older drivers print no `Addressing Mode` or `Fabric`) gets an empty string there, so
/// that the lists stay aligned with the GPUs. `Driver Version` comes from the top level.
///
/// Errors: neither a `Driver Version` line nor a GPU section.
pub fn parse_smi(text: &str) -> Result<SmiInfo, String> {
    let mut info = SmiInfo::default();
    let mut gpus: Vec<BTreeMap<String, String>> = Vec::new();
    // (indent, section name) of the open sections inside the current GPU.
    let mut stack: Vec<(usize, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let content = line.trim_start();
        let kv = split_smi_kv(content);
        if indent == 0 && kv.is_none() && content.starts_with("GPU ") {
            gpus.push(BTreeMap::new());
            stack.clear();
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        match kv {
            Some(("Driver Version", value)) if indent == 0 => {
                info.driver_version = Some(value.to_string());
            }
            Some(_) if indent == 0 => {}
            Some((key, value)) => {
                if let Some(gpu) = gpus.last_mut() {
                    let mut path: Vec<&str> = stack.iter().map(|(_, n)| n.as_str()).collect();
                    path.push(key);
                    gpu.entry(path.join(" / "))
                        .or_insert_with(|| value.to_string());
                }
            }
            None if indent > 0 => stack.push((indent, content.to_string())),
            None => {}
        }
    }
    if gpus.is_empty() && info.driver_version.is_none() {
        return Err("no `Driver Version` line and no `GPU <bus id>` section".to_string());
    }
    let field = |key: &str| -> Vec<String> {
        gpus.iter()
            .map(|g| g.get(key).cloned().unwrap_or_default())
            .collect()
    };
    info.gpus = gpus.len() as u32;
    info.addressing_mode = field("Addressing Mode");
    info.persistence_mode = field("Persistence Mode");
    info.compute_mode = field("Compute Mode");
    info.mig_mode = field("MIG Mode / Current");
    info.fabric_state = field("Fabric / State");
    info.product_brand = field("Product Brand");
    Ok(info)
}

/// `Key    : value` (or `Key    :` with an empty value) split and trimmed.
fn split_smi_kv(content: &str) -> Option<(&str, &str)> {
    if let Some((key, value)) = content.split_once(" : ") {
        return Some((key.trim(), value.trim()));
    }
    content.strip_suffix(" :").map(|key| (key.trim(), ""))
}

/// Most lines of a kernel report (after its first line) searched for nvidia frames.
const MAX_REPORT_LINES: usize = 120;

/// Parses the kernel log (`dmesg` text; `[timestamp]` prefixes and `journalctl -k`
/// `... kernel: ` prefixes are allowed) into the [`KernelLog`] fields:
/// - `nvidia_lines`: messages starting with `NVRM:` or containing `nvidia-uvm:` or `nvidia:`
///   (the last [`MAX_NVIDIA_LINES`]);
/// - `xids`: the number after `Xid (<pci>):` (`nv_report_error`), in order;
/// - `api_mismatch`: the last `API mismatch` line;
/// - `adapter_init_failed`: `RmInitAdapter failed` / `rm_init_adapter failed` lines;
/// - `driver_hangs`: the first line of each soft lockup, hard lockup, RCU stall, hung task,
///   oops, BUG, general protection fault or WARNING report whose lines name an nvidia
///   symbol (see [`names_nvidia_symbol`]);
/// - `hmm_errors`: `request_free_mem_region() err` lines (`uvm_debug_prints=1`);
/// - `resumed_after_uvm_load`: a `PM: suspend exit`, `PM: hibernation: hibernation exit` or
///   `ACPI: PM: Waking up` line after the last `nvidia-uvm: Loaded the UVM driver` line.
///
/// Lines are kept as they were read (with their timestamps).
pub fn parse_kernel_log(text: &str) -> KernelLog {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let mut log = KernelLog::default();
    let mut last_load = None;
    let mut last_resume = None;
    for (i, line) in lines.iter().enumerate() {
        let msg = kernel_message(line);
        if msg.starts_with("NVRM:") || msg.contains("nvidia-uvm:") || msg.contains("nvidia:") {
            log.nvidia_lines.push(line.to_string());
        }
        if let Some(xid) = parse_xid(msg) {
            log.xids.push(xid);
        }
        if msg.contains("API mismatch") {
            log.api_mismatch = Some(line.to_string());
        }
        if msg.contains("RmInitAdapter failed") || msg.contains("rm_init_adapter failed") {
            log.adapter_init_failed.push(line.to_string());
        }
        if msg.contains("request_free_mem_region() err") {
            log.hmm_errors.push(line.to_string());
        }
        if msg.contains("nvidia-uvm: Loaded the UVM driver") {
            last_load = Some(i);
        }
        if msg.contains("PM: suspend exit")
            || msg.contains("PM: hibernation: hibernation exit")
            || msg.contains("ACPI: PM: Waking up")
        {
            last_resume = Some(i);
        }
    }
    if log.nvidia_lines.len() > MAX_NVIDIA_LINES {
        log.nvidia_lines
            .drain(..log.nvidia_lines.len() - MAX_NVIDIA_LINES);
    }
    log.resumed_after_uvm_load = matches!((last_load, last_resume), (Some(l), Some(r)) if r > l);
    log.driver_hangs = hang_reports(&lines);
    log
}

/// The message of a kernel log line: without a leading `[...]` timestamp (`dmesg`,
/// `dmesg -T`) or a `journalctl` prefix up to `kernel: `.
fn kernel_message(line: &str) -> &str {
    let mut msg = line.trim_start();
    if msg.starts_with('[') {
        if let Some(end) = msg.find(']') {
            msg = &msg[end + 1..];
        }
    } else if let Some(pos) = msg.find(" kernel: ") {
        msg = &msg[pos + " kernel: ".len()..];
    }
    msg.trim_start()
}

/// Xid number of an `NVRM: Xid (PCI:0000:17:00): 79, pid=...` message.
fn parse_xid(msg: &str) -> Option<u32> {
    let rest = &msg[msg.find("Xid (")? + "Xid (".len()..];
    let rest = &rest[rest.find(')')? + 1..];
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Whether a message opens a kernel report: soft/hard lockup, RCU stall, hung task, oops,
/// BUG, general protection fault, WARNING.
fn is_report_start(msg: &str) -> bool {
    msg.contains("soft lockup")
        || msg.contains("hard LOCKUP")
        || (msg.contains("INFO: task ") && msg.contains("blocked for more than"))
        || msg.contains("self-detected stall")
        || msg.contains("detected stalls on CPUs/tasks")
        || msg.contains("detected expedited stalls")
        || msg.starts_with("BUG: ")
        || msg.starts_with("kernel BUG at")
        || msg.starts_with("Oops:")
        || msg.starts_with("general protection fault")
        || msg.starts_with("WARNING: CPU:")
        || msg.starts_with("WARNING: at ")
}

/// Whether a report line names an nvidia symbol: a `[nvidia...]` module tag, or a frame
/// `name+0x../0x..` whose name starts with `uvm_`, `nv_`, `os_` or `_nv0` (the prefixes
/// of nvidia.ko and nvidia-uvm.ko functions). The `Modules linked in:` line never counts.
pub fn names_nvidia_symbol(msg: &str) -> bool {
    if msg.contains("Modules linked in") {
        return false;
    }
    if msg.contains("[nvidia") {
        return true;
    }
    msg.split(|c: char| c.is_whitespace() || c == ':')
        .map(|t| t.trim_start_matches('?'))
        .any(|t| {
            (t.starts_with("uvm_")
                || t.starts_with("nv_")
                || t.starts_with("os_")
                || t.starts_with("_nv0"))
                && t.contains("+0x")
        })
}

/// First lines of the reports that name an nvidia symbol. A report runs from its first line
/// to `---[ end trace`, `</TASK>`, the next report or [`MAX_REPORT_LINES`] lines; a report
/// line met before any frame (`Oops:` after `BUG: unable to handle ...`) continues the same
/// report.
fn hang_reports(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let msg = kernel_message(lines[i]);
        if !is_report_start(msg) {
            i += 1;
            continue;
        }
        let start = i;
        let mut nvidia = names_nvidia_symbol(msg);
        let mut seen_frames = false;
        let mut j = i + 1;
        while j < lines.len() && j - start <= MAX_REPORT_LINES {
            let m = kernel_message(lines[j]);
            if is_report_start(m) {
                if seen_frames {
                    break;
                }
                nvidia |= names_nvidia_symbol(m);
                j += 1;
                continue;
            }
            if m.starts_with("Call Trace") || m.starts_with("RIP:") || m.contains("+0x") {
                seen_frames = true;
            }
            nvidia |= names_nvidia_symbol(m);
            j += 1;
            if m.starts_with("---[ end trace") || m.starts_with("</TASK>") {
                break;
            }
        }
        if nvidia {
            out.push(lines[start].to_string());
        }
        i = j.max(start + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use uvmwatch_testbed::snapshot::*;

    fn collect_spec(spec: &SnapshotSpec) -> (tempfile::TempDir, Evidence) {
        let dir = tempfile::tempdir().unwrap();
        write_snapshot_fixture(dir.path(), spec).unwrap();
        let ev = collect(&Root::Snapshot(dir.path().to_path_buf()));
        (dir, ev)
    }

    fn why<T: std::fmt::Debug>(fact: &Fact<T>) -> String {
        fact.value.as_ref().unwrap_err().why.clone()
    }

    #[test]
    fn driver_version_lines() {
        let open = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n",
        )
        .unwrap();
        assert_eq!(open.version, "590.48.01");
        assert!(open.open_module);
        assert!(open.line.starts_with("NVRM version: NVIDIA UNIX Open"));
        assert!(!open.line.contains("GCC"));

        let prop = parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        )
        .unwrap();
        assert_eq!(prop.version, "535.183.01");
        assert!(!prop.open_module);

        let arm = parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (dvs-builder@U16-T02-35-3)  Wed Feb 26 01:38:54 UTC 2025",
        )
        .unwrap();
        assert_eq!(arm.version, "570.124.06");

        assert!(parse_driver_version("").is_err());
        assert!(parse_driver_version("GCC version: 12").is_err());
        assert!(parse_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module").is_err());
    }

    #[test]
    fn key_values_modules_devices() {
        let params = parse_key_values(
            "ResmanDebugLevel: 4294967295\nEnableMSI: 1\nCoherentGPUMemoryMode: \nRegistryDwords: \"\"\nnot a pair\n",
        );
        assert_eq!(params["EnableMSI"], "1");
        assert_eq!(params["CoherentGPUMemoryMode"], "");
        assert_eq!(params["RegistryDwords"], "\"\"");
        assert_eq!(params.len(), 4);

        let modules = parse_modules(
            "nvidia_uvm 2084864 4 - Live 0xffffffffc2a00000 (OE)\next4 1114112 2 - Live 0x0\nnvidia_modeset 1556480 1 nvidia_drm, Live 0x0 (OE)\nnvidia 11513856 32 nvidia_uvm,nvidia_modeset, Live 0x0 (OE)\nnvidiafb 1 0 - Live 0x0\n",
        );
        assert_eq!(
            modules,
            ["nvidia_uvm", "nvidia_modeset", "nvidia", "nvidiafb"]
        );

        let devices = parse_devices(
            "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-nvswitch\n235 nvidia-caps\n508 nvidia-uvm\n509 nvidia-nvlink\n\nBlock devices:\n  8 sd\n259 nvidia-fake-block\n",
        );
        assert_eq!(devices.len(), 5);
        assert_eq!(devices["nvidia-uvm"], 508);
        assert_eq!(devices["nvidia-frontend"], 195);
        assert!(!devices.contains_key("nvidia-fake-block"));
    }

    #[test]
    fn kernel_release_and_config() {
        assert_eq!(
            parse_kernel_release("6.8.0-45-generic\n").unwrap(),
            KernelInfo {
                release: "6.8.0-45-generic".into(),
                version: (6, 8)
            }
        );
        assert_eq!(
            parse_kernel_release("6.18.44-fc-v657").unwrap().version,
            (6, 18)
        );
        assert_eq!(parse_kernel_release("6.10-rc3").unwrap().version, (6, 10));
        assert!(parse_kernel_release("").is_err());
        assert!(parse_kernel_release("linux").is_err());

        let cfg = parse_kernel_config(
            "CONFIG_HMM_MIRROR=y\n# CONFIG_DEVICE_PRIVATE is not set\nCONFIG_RANDOMIZE_BASE=y\nCONFIG_64BIT=y\n# CONFIG_KPROBES is not set\nCONFIG_ZONE_DEVICE=\"y\"\n",
        );
        assert_eq!(cfg["CONFIG_HMM_MIRROR"], "y");
        assert_eq!(cfg["CONFIG_DEVICE_PRIVATE"], "n");
        assert_eq!(cfg["CONFIG_KPROBES"], "n");
        assert_eq!(cfg["CONFIG_ZONE_DEVICE"], "y");
        assert!(!cfg.contains_key("CONFIG_64BIT"));
        assert!(!cfg.contains_key("CONFIG_RANDOMIZE_MEMORY"));
    }

    #[test]
    fn smi_h200_and_variants() {
        let text = smi_q("590.48.01", &[SmiGpu::h200(0), SmiGpu::h200(1)]);
        let info = parse_smi(&text).unwrap();
        assert_eq!(info.gpus, 2);
        assert_eq!(info.driver_version.as_deref(), Some("590.48.01"));
        assert_eq!(info.addressing_mode, ["HMM", "HMM"]);
        assert_eq!(info.persistence_mode, ["Enabled", "Enabled"]);
        assert_eq!(info.compute_mode, ["Default", "Default"]);
        assert_eq!(info.mig_mode, ["Disabled", "Disabled"]);
        assert_eq!(info.fabric_state, ["Completed", "Completed"]);
        assert_eq!(info.product_brand, ["NVIDIA", "NVIDIA"]);

        let mut odd = SmiGpu::h200(1);
        odd.mig_mode = "Enabled".into();
        odd.compute_mode = "Exclusive_Process".into();
        odd.fabric_state = Some("In Progress".into());
        odd.persistence_mode = "Disabled".into();
        let info = parse_smi(&smi_q("590.48.01", &[SmiGpu::h200(0), odd])).unwrap();
        assert_eq!(info.mig_mode, ["Disabled", "Enabled"]);
        assert_eq!(info.compute_mode, ["Default", "Exclusive_Process"]);
        assert_eq!(info.fabric_state, ["Completed", "In Progress"]);
        assert_eq!(info.persistence_mode, ["Enabled", "Disabled"]);
    }

    #[test]
    fn smi_older_geforce_without_new_fields() {
        // 535-era GeForce output: no Addressing Mode, no Fabric; a nested `Current` of
        // another section must not be taken for MIG's.
        let text = "
==============NVSMI LOG==============

Timestamp                                 : Tue Mar 18 14:08:47 2025
Driver Version                            : 535.161.08
CUDA Version                              : 12.2

Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA GeForce RTX 3090
    Product Brand                         : GeForce
    Product Architecture                  : Ampere
    Display Mode                          : Enabled
    Persistence Mode                      : Disabled
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
    Platform Info
        Chassis Serial Number             :
        Slot Number                       : 0
    Compute Mode                          : Default
    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 2817
            Type                          : C
            Name                          : python3
            Used GPU Memory               : 1024 MiB
";
        let info = parse_smi(text).unwrap();
        assert_eq!(info.gpus, 1);
        assert_eq!(info.driver_version.as_deref(), Some("535.161.08"));
        assert_eq!(info.addressing_mode, [""]);
        assert_eq!(info.fabric_state, [""]);
        assert_eq!(info.mig_mode, ["N/A"]);
        assert_eq!(info.product_brand, ["GeForce"]);
        assert_eq!(info.persistence_mode, ["Disabled"]);
        assert_eq!(info.compute_mode, ["Default"]);

        assert!(parse_smi(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        )
        .is_err());
        let none =
            parse_smi("Timestamp : x\nDriver Version : 590.48.01\nAttached GPUs : 0\n").unwrap();
        assert_eq!(none.gpus, 0);
        assert!(none.addressing_mode.is_empty());
    }

    #[test]
    fn kernel_log_fields() {
        let driver = DriverSpec::open("590.48.01");
        let boot = boot_dmesg(&driver, 508);
        let log = parse_kernel_log(&boot);
        assert!(log.xids.is_empty());
        assert!(log.driver_hangs.is_empty());
        assert!(!log.resumed_after_uvm_load);
        assert_eq!(log.api_mismatch, None);
        assert!(log
            .nvidia_lines
            .iter()
            .any(|l| l.contains("nvidia-uvm: Loaded the UVM driver")));
        assert!(log.nvidia_lines.iter().any(|l| l.contains("NVRM: loading")));
        assert!(!log
            .nvidia_lines
            .iter()
            .any(|l| l.contains("enabling device")));

        let text = format!(
            "{boot}{DMESG_API_MISMATCH}{DMESG_ADAPTER_INIT_FAILED}{DMESG_XID_79}{DMESG_HMM_ERR_34}{DMESG_HUNG_TASK_OTHER}{DMESG_HUNG_TASK_UVM}{DMESG_SOFT_LOCKUP_UVM}{DMESG_RESUME}"
        );
        let log = parse_kernel_log(&text);
        assert_eq!(log.xids, [79]);
        assert!(log
            .api_mismatch
            .as_deref()
            .unwrap()
            .contains("NVRM: API mismatch: the client has the version 550.54.15"));
        assert_eq!(log.adapter_init_failed.len(), 2);
        assert_eq!(log.hmm_errors.len(), 1);
        assert!(log.hmm_errors[0].contains("err -34"));
        assert_eq!(log.driver_hangs.len(), 2, "{:#?}", log.driver_hangs);
        assert!(log.driver_hangs[0].contains("INFO: task python3:2817 blocked"));
        assert!(log.driver_hangs[1].contains("soft lockup"));
        assert!(log.resumed_after_uvm_load);

        // Reloading nvidia_uvm after the resume clears the condition.
        let reloaded = format!(
            "{text}[ 9100.000000] nvidia-uvm: Loaded the UVM driver, major device number 508.\n"
        );
        assert!(!parse_kernel_log(&reloaded).resumed_after_uvm_load);
        // A resume before the driver was loaded does not count.
        assert!(!parse_kernel_log(&format!("{DMESG_RESUME}{boot}")).resumed_after_uvm_load);
    }

    #[test]
    fn kernel_log_reports_and_formats() {
        // Oops following its BUG line is one report; journalctl prefixes; WARN with tag.
        let text = "\
Jan 15 09:41:27 gpu17 kernel: BUG: kernel NULL pointer dereference, address: 0000000000000008
Jan 15 09:41:27 gpu17 kernel: #PF: supervisor read access in kernel mode
Jan 15 09:41:27 gpu17 kernel: Oops: 0000 [#1] PREEMPT SMP NOPTI
Jan 15 09:41:27 gpu17 kernel: RIP: 0010:_nv012345rm+0x1d/0x30 [nvidia]
Jan 15 09:41:27 gpu17 kernel: Call Trace:
Jan 15 09:41:27 gpu17 kernel:  <TASK>
Jan 15 09:41:27 gpu17 kernel:  os_acquire_spinlock+0x12/0x30 [nvidia]
Jan 15 09:41:27 gpu17 kernel:  </TASK>
Jan 15 09:41:30 gpu17 kernel: WARNING: CPU: 3 PID: 2817 at /var/lib/dkms/nvidia/590.48.01/build/nvidia-uvm/uvm_va_space.c:412 uvm_va_space_destroy+0x3a1/0x3f0 [nvidia_uvm]
Jan 15 09:41:30 gpu17 kernel: ---[ end trace 0000000000000000 ]---
Jan 15 09:41:31 gpu17 kernel: WARNING: CPU: 1 PID: 1 at mm/page_alloc.c:4410 __alloc_pages+0x2d5/0x350
Jan 15 09:41:31 gpu17 kernel: Modules linked in: nvidia_uvm(OE) nvidia(OE)
Jan 15 09:41:31 gpu17 kernel: Call Trace:
Jan 15 09:41:31 gpu17 kernel:  alloc_pages_mpol+0x91/0x1f0
Jan 15 09:41:31 gpu17 kernel: ---[ end trace 0000000000000000 ]---
Jan 15 09:41:40 gpu17 kernel: NVRM: Xid (0000:18:00): 13, Graphics SM Warp Exception
[Thu Jan 15 09:42:00 2026] NVRM: Xid (PCI:0000:2a:00): 119, pid=912, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU1 GSP!
";
        let log = parse_kernel_log(text);
        assert_eq!(log.driver_hangs.len(), 2, "{:#?}", log.driver_hangs);
        assert!(log.driver_hangs[0].contains("BUG: kernel NULL pointer"));
        assert!(log.driver_hangs[1].contains("uvm_va_space_destroy"));
        assert_eq!(log.xids, [13, 119]);
        assert_eq!(log.nvidia_lines.len(), 2);

        assert!(names_nvidia_symbol(" ? nv_ioctl+0x5a/0x80"));
        assert!(!names_nvidia_symbol(
            "Modules linked in: nvidia_uvm(OE) [nvidia]"
        ));
        assert!(!names_nvidia_symbol(" nvme_poll+0x12/0x30"));
        assert!(!names_nvidia_symbol(" osq_lock+0x12/0x30"));

        // Only the last MAX_NVIDIA_LINES lines are kept.
        let many: String = (0..250)
            .map(|i| format!("[ {i}.000000] NVRM: line {i}\n"))
            .collect();
        let log = parse_kernel_log(&many);
        assert_eq!(log.nvidia_lines.len(), MAX_NVIDIA_LINES);
        assert!(log.nvidia_lines[0].ends_with("line 50"));
    }

    #[test]
    fn container_detection() {
        let host = ContainerInputs {
            pid1_cgroup: Some("0::/init.scope\n".into()),
            self_cgroup: Some("0::/user.slice/user-0.slice/session-4.scope\n".into()),
            ..ContainerInputs::default()
        };
        let (info, source) = detect_container(&host);
        assert_eq!(info.kind, "host");
        assert_eq!(
            (info.id, info.pod_uid, info.device_allow),
            (None, None, None)
        );
        assert_eq!(source, CONTAINER_SOURCES);

        let k8s_cgroupfs = ContainerInputs {
            self_cgroup: Some(format!(
                "12:devices:/kubepods/burstable/pod{FIXTURE_POD_UID}/{FIXTURE_CONTAINER_ID}\n0::/\n"
            )),
            devices_list: Some("c 195:* rwm\nc 508:* rwm\n".into()),
            ..ContainerInputs::default()
        };
        let (info, _) = detect_container(&k8s_cgroupfs);
        assert_eq!(info.kind, "kubernetes");
        assert_eq!(info.pod_uid.as_deref(), Some(FIXTURE_POD_UID));
        assert_eq!(info.id.as_deref(), Some(FIXTURE_CONTAINER_ID));
        assert_eq!(info.device_allow.unwrap(), ["c 195:* rwm", "c 508:* rwm"]);

        let crio = ContainerInputs {
            self_cgroup: Some(format!(
                "0::/system.slice/crio-{FIXTURE_CONTAINER_ID}.scope\n"
            )),
            ..ContainerInputs::default()
        };
        assert_eq!(detect_container(&crio).0.kind, "cri-o");

        // Private cgroup namespace: the marker files and init's environment decide.
        let ns = |dockerenv, containerenv, environ: &str| ContainerInputs {
            pid1_cgroup: Some("0::/\n".into()),
            self_cgroup: Some("0::/\n".into()),
            dockerenv,
            containerenv,
            pid1_environ: Some(environ.into()),
            devices_list: None,
        };
        assert_eq!(detect_container(&ns(true, false, "")).0.kind, "docker");
        assert_eq!(detect_container(&ns(true, false, "")).1, "/.dockerenv");
        assert_eq!(detect_container(&ns(false, true, "")).0.kind, "podman");
        assert_eq!(
            detect_container(&ns(false, false, "container=lxc\0"))
                .0
                .kind,
            "lxc"
        );
        assert_eq!(
            detect_container(&ns(false, false, "container=systemd-nspawn\0"))
                .0
                .kind,
            "container"
        );
        assert_eq!(
            detect_container(&ns(false, false, "KUBERNETES_SERVICE_HOST=<redacted>\0"))
                .0
                .kind,
            "kubernetes"
        );
        // The host's own docker.service is not a container.
        let dockerd_host = ContainerInputs {
            self_cgroup: Some("0::/system.slice/docker.service\n".into()),
            ..ContainerInputs::default()
        };
        assert_eq!(detect_container(&dockerd_host).0.kind, "host");

        assert_eq!(
            pod_uid(&format!(
                "0::/kubepods/pod{FIXTURE_POD_UID}/{FIXTURE_CONTAINER_ID}\n"
            ))
            .as_deref(),
            Some(FIXTURE_POD_UID)
        );
        assert_eq!(pod_uid("0::/system.slice/pod.service\n"), None);
    }

    #[test]
    fn libcuda_names_and_daemons() {
        assert_eq!(
            libcuda_version("libcuda.so.590.48.01").as_deref(),
            Some("590.48.01")
        );
        assert_eq!(libcuda_version("libcuda.so.1"), None);
        assert_eq!(libcuda_version("libcuda.so"), None);
        assert_eq!(libcuda_version("libcuda.so.590..01"), None);
        assert!(is_compat_path(
            "/usr/local/cuda-12.8/compat/libcuda.so.570.86.15"
        ));
        assert!(!is_compat_path("/usr/lib/compatibility/libcuda.so.1"));
        assert_eq!(
            daemon_of_comm("nvidia-persiste"),
            Some("nvidia-persistenced")
        );
        assert_eq!(daemon_of_comm("nv-fabricmanage"), Some("nv-fabricmanager"));
        assert_eq!(daemon_of_comm("nvidia-pers"), None);
        assert_eq!(daemon_of_comm("python3"), None);
        assert_eq!(normalize("/a/./b/../../../c//d"), "/c/d");
        assert!(
            keep_libcuda_line(b"7f00-7f01 r--p 0 fd:01 12 /usr/lib/libcuda.so.1 (deleted)")
                .is_some()
        );
        assert!(keep_libcuda_line(b"7f00-7f01 r--p 0 fd:01 12 /usr/lib/libcudart.so.12").is_none());
        assert!(keep_libcuda_line(b"7ffd-7ffe rw-p 0 00:00 0 [stack]").is_none());
    }

    #[test]
    fn snapshot_healthy_host() {
        let spec = SnapshotSpec {
            processes: vec![ProcessSpec {
                pid: 2817,
                comm: "python3".into(),
                libcuda: vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01".into()],
            }],
            ..SnapshotSpec::default()
        };
        let (_dir, ev) = collect_spec(&spec);
        let driver = ev.driver.get().unwrap();
        assert_eq!(
            (driver.version.as_str(), driver.open_module),
            ("590.48.01", true)
        );
        assert_eq!(ev.driver.source, DRIVER_VERSION_PATH);
        assert_eq!(ev.driver_params.get().unwrap()["ModifyDeviceFiles"], "1");
        assert_eq!(ev.uvm_params.get().unwrap()["uvm_disable_hmm"], "N");
        assert_eq!(
            ev.modules.get().unwrap(),
            &["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"]
        );
        assert_eq!(ev.devices.get().unwrap()["nvidia-uvm"], 508);
        let nodes = ev.dev_nodes.get().unwrap();
        let paths: Vec<&str> = nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidiactl"
            ]
        );
        assert_eq!(nodes[0].dev, Some((508, 0)));
        assert_eq!(nodes[4].dev, Some((195, 255)));
        assert!(nodes.iter().all(|n| n.open.is_none()));
        assert!(ev.nvswitch_nodes.get().unwrap().is_empty());
        let c = ev.container.get().unwrap();
        assert_eq!((c.kind.as_str(), c.device_allow.as_ref()), ("host", None));
        assert_eq!(ev.kernel.get().unwrap().version, (6, 8));
        let cfg = ev.kernel_config.get().unwrap();
        assert_eq!(ev.kernel_config.source, "/boot/config-6.8.0-45-generic");
        assert_eq!(cfg.len(), 6);
        assert_eq!(cfg["CONFIG_HMM_MIRROR"], "y");
        assert!(!ev.cmdline.get().unwrap().contains("nokaslr"));
        assert!(!ev.cmdline.get().unwrap().ends_with('\n'));
        assert_eq!(ev.iomem_hmm.get().unwrap().len(), 2);
        assert!(ev.iomem_hmm.get().unwrap()[0].ends_with(": nvidia-uvm-hmm"));
        let smi = ev.smi.get().unwrap();
        assert_eq!((smi.gpus, smi.addressing_mode[0].as_str()), (2, "HMM"));
        assert_eq!(ev.smi.source, "nvidia-smi -q");
        assert_eq!(ev.kernel_log.source, "dmesg");
        assert!(!ev.kernel_log.get().unwrap().nvidia_lines.is_empty());
        assert_eq!(ev.daemons.get().unwrap(), &["nvidia-persistenced"]);
        assert_eq!(
            ev.libcuda.get().unwrap(),
            &[MappedLibcuda {
                pid: 2817,
                comm: "python3".into(),
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01".into(),
                version: Some("590.48.01".into()),
                compat: false,
            }]
        );
    }

    #[test]
    fn snapshot_failure_variants() {
        // No driver at all, nothing captured, nothing in /dev.
        let spec = SnapshotSpec {
            driver: None,
            uvm_loaded: false,
            smi: None,
            dmesg: None,
            nodes: Vec::new(),
            daemons: Vec::new(),
            iomem_hmm: false,
            ..SnapshotSpec::default()
        };
        let (_dir, ev) = collect_spec(&spec);
        assert_eq!(
            why(&ev.driver),
            "not present: the nvidia kernel module is not loaded (no /proc/driver/nvidia/version)"
        );
        assert!(why(&ev.driver_params).starts_with("not present: the nvidia kernel module"));
        assert!(why(&ev.uvm_params).starts_with("not present: the nvidia_uvm module is not loaded"));
        assert!(ev.modules.get().unwrap().is_empty());
        assert!(ev.devices.get().unwrap().is_empty());
        assert!(ev.dev_nodes.get().unwrap().is_empty());
        assert!(ev.iomem_hmm.get().unwrap().is_empty());
        assert_eq!(
            why(&ev.smi),
            "not captured: the snapshot has no output of `nvidia-smi -q`"
        );
        assert!(why(&ev.kernel_log).starts_with("not captured"));
        assert!(ev.daemons.get().unwrap().is_empty());

        // Proprietary driver, HMM switched off, nokaslr, no HMM in the kernel, EPERM on the
        // uvm node (stale major in the allow-list), a bogus plain file, NVSwitch nodes,
        // fabric manager running, compat libcuda in a docker container on cgroup v1.
        let mut nodes = standard_nodes(1, 511);
        nodes[2] = NodeSpec::char("/dev/nvidia-uvm", 511, 0).with_open(Err("EPERM"));
        nodes[1] = nodes[1].clone().with_open(Ok(()));
        nodes.push(NodeSpec::file("/dev/nvidia-modeset"));
        nodes.push(NodeSpec::char("/dev/nvidia-nvswitch0", 234, 0));
        nodes.push(NodeSpec::char("/dev/nvidia-nvswitchctl", 234, 255));
        nodes.push(NodeSpec::char("/dev/nvidia-caps/nvidia-cap1", 235, 1));
        let spec = SnapshotSpec {
            driver: Some(DriverSpec::proprietary("535.183.01")),
            uvm_disable_hmm: true,
            uvm_major: 511,
            hmm_config: false,
            nokaslr: true,
            nodes,
            container: ContainerSpec::Docker,
            device_allow: Some(vec!["c 195:* rwm".into(), "c 508:* rwm".into()]),
            daemons: vec!["nv-fabricmanager".into()],
            processes: vec![ProcessSpec {
                pid: 31,
                comm: "a-very-long-process-name".into(),
                libcuda: vec!["/usr/local/cuda-12.8/compat/libcuda.so.570.86.15".into()],
            }],
            ..SnapshotSpec::default()
        };
        let (_dir, ev) = collect_spec(&spec);
        assert!(!ev.driver.get().unwrap().open_module);
        assert_eq!(ev.uvm_params.get().unwrap()["uvm_disable_hmm"], "Y");
        assert_eq!(ev.devices.get().unwrap()["nvidia-uvm"], 511);
        assert_eq!(ev.devices.get().unwrap()["nvidia-nvswitch"], 234);
        let nodes = ev.dev_nodes.get().unwrap();
        let by = |p: &str| nodes.iter().find(|n| n.path == p).unwrap().clone();
        assert_eq!(by("/dev/nvidia-uvm").open, Some(Err("EPERM".into())));
        assert_eq!(by("/dev/nvidia0").open, Some(Ok(())));
        assert_eq!(by("/dev/nvidia-modeset").dev, None);
        assert!(nodes
            .iter()
            .all(|n| !n.path.contains("nvswitch") && !n.path.contains("caps")));
        assert_eq!(
            ev.nvswitch_nodes.get().unwrap(),
            &["/dev/nvidia-nvswitch0", "/dev/nvidia-nvswitchctl"]
        );
        assert_eq!(ev.kernel_config.get().unwrap()["CONFIG_HMM_MIRROR"], "n");
        assert!(ev.cmdline.get().unwrap().ends_with(" nokaslr"));
        let c = ev.container.get().unwrap();
        assert_eq!(c.kind, "docker");
        assert_eq!(c.id.as_deref(), Some(FIXTURE_CONTAINER_ID));
        assert_eq!(
            c.device_allow.as_ref().unwrap(),
            &["c 195:* rwm", "c 508:* rwm"]
        );
        assert_eq!(ev.daemons.get().unwrap(), &["nv-fabricmanager"]);
        let lib = &ev.libcuda.get().unwrap()[0];
        assert!(lib.compat);
        assert_eq!(lib.version.as_deref(), Some("570.86.15"));
        assert_eq!(lib.comm, "a-very-long-pro");

        for (container, kind) in [
            (ContainerSpec::Kubernetes, "kubernetes"),
            (ContainerSpec::Podman, "podman"),
            (ContainerSpec::Lxc, "lxc"),
        ] {
            let (_dir, ev) = collect_spec(&SnapshotSpec {
                container,
                ..SnapshotSpec::default()
            });
            let c = ev.container.get().unwrap();
            assert_eq!(c.kind, kind);
            match container {
                ContainerSpec::Kubernetes => {
                    assert_eq!(c.pod_uid.as_deref(), Some(FIXTURE_POD_UID));
                    assert_eq!(c.id.as_deref(), Some(FIXTURE_CONTAINER_ID));
                }
                ContainerSpec::Lxc => assert_eq!(c.id.as_deref(), Some(FIXTURE_LXC_NAME)),
                _ => assert_eq!(c.id, None),
            }
        }
    }

    #[test]
    fn snapshot_links_config_gz_and_malformed() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let spec = SnapshotSpec {
            processes: vec![ProcessSpec {
                pid: 77,
                comm: "python3".into(),
                libcuda: vec!["/usr/lib64/libcuda.so.1".into()],
            }],
            ..SnapshotSpec::default()
        };
        write_snapshot_fixture(dir.path(), &spec).unwrap();
        // The mapped name has no version: it resolves through links saved in the manifest.
        let manifest = crate::doctor::root::Manifest {
            links: [
                (
                    "/proc/77/root/usr/lib64/libcuda.so.1",
                    "libcuda.so.580.105.08",
                ),
                // never reached
                ("/proc/77/root/usr/lib64/libcuda.so.580.105.08", "../x"),
            ]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
            ..Default::default()
        };
        std::fs::write(
            dir.path().join("manifest.json"),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        // /proc/config.gz wins over /boot.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"CONFIG_HMM_MIRROR=y\n# CONFIG_DEVICE_PRIVATE is not set\n")
            .unwrap();
        std::fs::write(dir.path().join("proc/config.gz"), gz.finish().unwrap()).unwrap();
        std::fs::write(dir.path().join("proc/driver/nvidia/version"), "garbage\n").unwrap();
        std::fs::write(
            dir.path().join("commands/nvidia-smi.txt"),
            "NVIDIA-SMI has failed\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/osrelease"), "???\n").unwrap();

        let ev = collect(&Root::Snapshot(dir.path().to_path_buf()));
        assert_eq!(
            ev.libcuda.get().unwrap()[0].version.as_deref(),
            Some("580.105.08")
        );
        assert_eq!(ev.kernel_config.source, "/proc/config.gz");
        assert_eq!(
            ev.kernel_config.get().unwrap()["CONFIG_DEVICE_PRIVATE"],
            "n"
        );
        assert!(why(&ev.driver).starts_with("malformed: first line"));
        assert!(why(&ev.smi).starts_with("malformed: "));
        assert!(why(&ev.kernel).starts_with("malformed: "));

        // Garbage config.gz and no release: both reasons.
        std::fs::write(dir.path().join("proc/config.gz"), b"not gzip").unwrap();
        let ev = collect(&Root::Snapshot(dir.path().to_path_buf()));
        let w = why(&ev.kernel_config);
        assert!(w.contains("/proc/config.gz: malformed"), "{w}");
        assert!(w.contains("release is unknown"), "{w}");
        std::fs::remove_file(dir.path().join("proc/config.gz")).unwrap();
        std::fs::write(
            dir.path().join("proc/sys/kernel/osrelease"),
            "6.1.0-9-amd64\n",
        )
        .unwrap();
        let ev = collect(&Root::Snapshot(dir.path().to_path_buf()));
        assert_eq!(
            why(&ev.kernel_config),
            "not present: the kernel has no /proc/config.gz (CONFIG_IKCONFIG_PROC) and /boot/config-6.1.0-9-amd64 is missing"
        );

        // An empty directory: every fact unavailable, no panic.
        let empty = tempfile::tempdir().unwrap();
        let ev = collect(&Root::Snapshot(empty.path().to_path_buf()));
        assert!(ev.dev_nodes.value.is_err());
        assert!(ev.container.value.is_err());
        assert!(why(&ev.daemons).starts_with("not readable: cannot list processes"));
        assert!(!why(&ev.daemons).contains(&empty.path().display().to_string()));
        assert!(ev.kernel.value.is_err());
    }

    #[test]
    fn live_machine_without_driver() {
        let ev = collect(&Root::live(None));
        // This project's machines have no NVIDIA driver; on one that has, skip the checks
        // that assume its absence.
        if Path::new("/proc/driver/nvidia/version").exists() {
            uvmwatch_testbed::skip(
                "collect::live_machine_without_driver (absence checks)",
                "an NVIDIA driver is loaded here",
            );
            return;
        }
        assert_eq!(
            why(&ev.driver),
            "not present: the nvidia kernel module is not loaded (no /proc/driver/nvidia/version)"
        );
        assert!(why(&ev.uvm_params).starts_with("not present: the nvidia_uvm module"));
        // This project's kernels have CONFIG_MODULES off: no /proc/modules at all.
        match ev.modules.get() {
            Some(modules) => assert!(modules.is_empty()),
            None => assert!(why(&ev.modules)
                .starts_with("not present: the kernel has no loadable module support")),
        }
        assert!(ev.devices.get().unwrap().is_empty());
        assert!(ev.dev_nodes.get().unwrap().is_empty());
        assert!(ev.kernel.get().is_some());
        assert!(ev.cmdline.get().is_some());
        assert!(ev.container.get().is_some());
        assert!(ev.daemons.get().unwrap().is_empty());
        assert!(ev.libcuda.get().unwrap().is_empty());
        if ev.smi.value.is_err() {
            assert!(
                why(&ev.smi).starts_with("not present: nvidia-smi is not installed")
                    || why(&ev.smi).starts_with("failed:")
            );
        }
    }
}

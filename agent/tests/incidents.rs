//! The incident bank: public reports of CUDA failing to start, each rebuilt as a snapshot of
//! the host it happened on (`agent/tests/incidents/<id>.json`, one file per incident, with its
//! URL, what the report shows, who confirmed the cause and what the case fills in from a
//! healthy host), judged by the real `uvmwatch doctor --root`. Each case names the rule that
//! must come first (or `healthy`) and the near-miss rules that must not appear; a case with a
//! recorded failure must never read healthy. Kept apart from the rules' unit tests: these are
//! data, the rules' own tests are logic. `docs/testing.md` says how to add a case. No root.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use uvmwatch_testbed::snapshot::gpuless::SMI_NO_DRIVER;
use uvmwatch_testbed::snapshot::{
    boot_dmesg, gpu_addresses, smi_q, standard_nodes, ContainerSpec, DriverSpec, NodeSpec,
    ProcessSpec, SmiGpu,
};
use uvmwatch_testbed::{write_snapshot_fixture, SnapshotSpec};

/// At least this many cases (issue 19).
const MIN_CASES: usize = 40;

/// Every rule a case may name (`uvmwatch doctor`'s rules and `unexplained_failure`), and
/// `healthy` for a host with nothing wrong.
const RULES: &[&str] = &[
    "hmm_setup_failure",
    "driver_hang",
    "module_refused",
    "no_gpu",
    "wsl2",
    "node_or_module_missing",
    "device_permission",
    "stale_after_suspend",
    "fabric_not_ready",
    "version_mismatch",
    "slow_init",
    "adapter_init_failure",
    "fork_after_init",
    "policy_or_partition",
    "wsl_linux_driver",
    "device_node_mismatch",
    "visible_devices",
    "unexplained_failure",
];

/// One incident (`docs/testing.md`, "Incident bank").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    id: String,
    source: String,
    kind: String,
    title: String,
    shows: String,
    cause: String,
    confirmed: String,
    filled: String,
    #[serde(default)]
    host: Host,
    #[serde(default)]
    observations: Option<Value>,
    first: String,
    #[serde(default)]
    absent: Vec<String>,
    /// A class the bank showed that no rule had when the case was written.
    #[serde(default)]
    new_class: Option<String>,
}

/// The host, as far as the report tells it; every field left out is the healthy host of
/// [`SnapshotSpec::default`] (or of WSL2 for `environment: "wsl2"`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Host {
    environment: Option<String>,
    /// `x86_64` (default) or `aarch64`.
    arch: Option<String>,
    /// Kernel lockdown: `none`, `integrity`, `confidentiality` (not recorded by default).
    lockdown: Option<String>,
    /// UEFI Secure Boot on (not recorded by default).
    secure_boot: Option<bool>,
    kernel: Option<String>,
    kernel_hmm: Option<bool>,
    nokaslr: Option<bool>,
    /// Absent: the default driver; `null`: not loaded.
    #[serde(default, deserialize_with = "present")]
    driver: Option<Option<Driver>>,
    uvm_loaded: Option<bool>,
    uvm_disable_hmm: Option<bool>,
    hmm_regions: Option<bool>,
    /// The `nvidia-uvm` major of `/proc/devices`.
    uvm_major: Option<u32>,
    pci_gpus: Option<Vec<PciGpu>>,
    registered_gpus: Option<u32>,
    smi: Option<String>,
    gpu: Option<Gpu>,
    nvswitch: Option<bool>,
    daemons: Option<Vec<String>>,
    dmesg: Option<Vec<String>>,
    missing_nodes: Option<Vec<String>>,
    denied_nodes: Option<BTreeMap<String, String>>,
    /// Device numbers of nodes as `ls -l` shows them (`MAJ:MIN`), where they differ from
    /// the driver's, or nodes the default set lacks.
    node_numbers: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "present")]
    device_allow: Option<Option<Vec<String>>>,
    libcuda: Option<Vec<String>>,
    /// WSL2 only: the `libcuda*` names in `/usr/lib/wsl/lib` (default: WSL's three).
    wsl_libs: Option<Vec<String>>,
    /// WSL2 only: `/dev/dxg` there (default: yes).
    dxg: Option<bool>,
    /// More files, absolute path to contents.
    files: Option<BTreeMap<String, String>>,
}

/// A field that may be `null` (`Some(None)`) as opposed to absent (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Driver {
    version: String,
    /// `open` or `proprietary`; left out: open (the healthy host's).
    flavor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PciGpu {
    address: String,
    driver: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Gpu {
    product: Option<String>,
    count: Option<u32>,
    persistence: Option<bool>,
    compute_mode: Option<String>,
    mig: Option<bool>,
    /// MIG devices per GPU (with MIG on).
    mig_instances: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    fabric_state: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    addressing: Option<Option<String>>,
}

/// The bank, or the directory `UVMWATCH_INCIDENT_DIR` names: a new batch is scored from
/// where it was built, before it joins the bank and before any rule changes
/// (`docs/testing.md`, "Held-out batches").
fn cases_dir() -> PathBuf {
    match std::env::var_os("UVMWATCH_INCIDENT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/incidents"),
    }
}

/// Every case file, sorted by name, parsed (a file that does not parse fails the test with
/// its name).
fn cases() -> Vec<(String, Case)> {
    let mut files: Vec<PathBuf> = fs::read_dir(cases_dir())
        .expect("agent/tests/incidents")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&p).unwrap();
            let case: Case =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, case)
        })
        .collect()
}

/// WSL2's kernel when a WSL2 case gives none.
const WSL_KERNEL: &str = "5.15.153.1-microsoft-standard-WSL2";

/// The snapshot of a case's host: [`SnapshotSpec::default`] with what the case says.
fn spec_of(h: &Host) -> SnapshotSpec {
    let mut s = SnapshotSpec::default();
    let wsl = h.environment.as_deref() == Some("wsl2");
    s.container = match h.environment.as_deref() {
        None | Some("bare_metal") | Some("wsl2") => ContainerSpec::Host,
        Some("docker") => ContainerSpec::Docker,
        Some("podman") => ContainerSpec::Podman,
        Some("kubernetes") => ContainerSpec::Kubernetes,
        Some("lxc") => ContainerSpec::Lxc,
        Some(other) => panic!("unknown environment {other}"),
    };
    if wsl {
        s.kernel_release = WSL_KERNEL.to_string();
        s.driver = None;
        s.uvm_loaded = false;
        s.hmm_config = false;
        s.iomem_hmm = false;
        s.smi = None;
        s.gpus = None;
        s.daemons = Vec::new();
        s.pci_gpus = Some(Vec::new());
        s.wsl_libs = Some(h.wsl_libs.clone().unwrap_or_else(|| {
            ["libcuda.so", "libcuda.so.1", "libcuda.so.1.1"]
                .map(String::from)
                .to_vec()
        }));
        s.nodes = if h.dxg.unwrap_or(true) {
            vec![NodeSpec::char("/dev/dxg", 10, 125)]
        } else {
            Vec::new()
        };
        s.dmesg = Some(format!(
            "[    0.000000] Linux version {WSL_KERNEL} (root@1b4e3f) (gcc (GCC) 11.2.0) #1 SMP\n"
        ));
        s.processes = h
            .libcuda
            .clone()
            .map(|l| {
                vec![ProcessSpec::python3(
                    4242,
                    &l.iter().map(String::as_str).collect::<Vec<_>>(),
                )]
            })
            .unwrap_or_default();
        if let Some(k) = &h.kernel {
            s.kernel_release = k.clone();
        }
        if let Some(files) = &h.files {
            s.files = files.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        return s;
    }
    if let Some(k) = &h.kernel {
        s.kernel_release = k.clone();
    }
    if let Some(a) = &h.arch {
        assert!(
            ["x86_64", "aarch64"].contains(&a.as_str()),
            "arch {a}: x86_64 or aarch64"
        );
        s.arch = a.clone();
    }
    if let Some(v) = h.kernel_hmm {
        s.hmm_config = v;
    }
    if let Some(v) = h.nokaslr {
        s.nokaslr = v;
    }
    match &h.driver {
        None => {}
        Some(Some(d)) => {
            s.driver = Some(DriverSpec {
                open: match d.flavor.as_deref().unwrap_or("open") {
                    "open" => true,
                    "proprietary" => false,
                    other => panic!("flavor {other}: open or proprietary"),
                },
                version: d.version.clone(),
                arch: s.arch.clone(),
            })
        }
        Some(None) => {
            s.driver = None;
            s.uvm_loaded = false;
            s.gpus = None;
            s.nodes = Vec::new();
            s.smi = None;
            s.smi_failure = Some(("exit status 9".into(), SMI_NO_DRIVER.into()));
            s.daemons = Vec::new();
        }
    }
    if let Some(v) = h.uvm_loaded {
        s.uvm_loaded = v;
    }
    // Left out: what nvidia_uvm defaults to for this driver and architecture (`uvm_hmm.c`:
    // HMM off by default off x86_64, and before 535).
    s.uvm_disable_hmm = match h.uvm_disable_hmm {
        Some(v) => v,
        None => {
            let major = s
                .driver
                .as_ref()
                .and_then(|d| d.version.split('.').next()?.parse::<u32>().ok());
            s.arch != "x86_64" || major.is_some_and(|m| m < 535)
        }
    };
    if let Some(v) = h.hmm_regions {
        s.iomem_hmm = v;
    }
    if let Some(m) = h.uvm_major {
        s.uvm_major = m;
    }
    let gpu = h.gpu.as_ref();
    let count = h
        .registered_gpus
        .or(gpu.and_then(|g| g.count))
        .unwrap_or(if s.driver.is_some() { 2 } else { 0 });
    if s.driver.is_some() {
        s.gpus = Some(gpu_addresses(count));
        s.nodes = standard_nodes(count, s.uvm_major);
        if !s.uvm_loaded {
            s.nodes.retain(|n| !n.path.starts_with("/dev/nvidia-uvm"));
        }
    }
    if let Some(pci) = &h.pci_gpus {
        s.pci_gpus = Some(
            pci.iter()
                .map(|g| (g.address.clone(), g.driver.clone()))
                .collect(),
        );
    }
    let version = s
        .driver
        .as_ref()
        .map(|d| d.version.clone())
        .unwrap_or_else(|| "590.48.01".into());
    if let Some(driver) = &s.driver {
        let gpus: Vec<SmiGpu> = (0..count.max(1))
            .take(count as usize)
            .map(|i| smi_gpu(i, gpu))
            .collect();
        s.dmesg = Some(boot_dmesg(driver, s.uvm_major));
        s.smi = Some(smi_q(&version, &gpus));
    }
    match h.smi.as_deref() {
        None | Some("gpus") => {}
        Some("not_captured") => s.smi = None,
        Some(other) => {
            let (status, out) = match other {
                "no_devices" => ("exit status 6", "No devices were found\n"),
                "no_driver" => ("exit status 9", SMI_NO_DRIVER),
                "nvml_mismatch" => (
                    "exit status 18",
                    "Failed to initialize NVML: Driver/library version mismatch\n",
                ),
                "nvml_unknown_error" => (
                    "exit status 255",
                    "Failed to initialize NVML: Unknown Error\n",
                ),
                other => panic!("smi {other}"),
            };
            s.smi = None;
            s.smi_failure = Some((status.into(), out.into()));
        }
    }
    if h.nvswitch == Some(true) {
        for n in 0..4 {
            s.nodes
                .push(NodeSpec::char(&format!("/dev/nvidia-nvswitch{n}"), 509, n));
        }
    }
    if let Some(d) = &h.daemons {
        s.daemons = d.clone();
    }
    if let Some(lines) = &h.dmesg {
        let mut log = s.dmesg.take().unwrap_or_default();
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with('[') {
                log.push_str(l);
            } else {
                log.push_str(&format!("[ {:>4}.{:06}] {l}", 600 + i, 0));
            }
            log.push('\n');
        }
        s.dmesg = Some(log);
    }
    if let Some(missing) = &h.missing_nodes {
        s.nodes.retain(|n| !missing.contains(&n.path));
    }
    if let Some(numbers) = &h.node_numbers {
        for (path, dev) in numbers {
            let (ma, mi) = dev
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or_else(|| panic!("node_numbers {path}: {dev} is not MAJ:MIN"));
            match s.nodes.iter_mut().find(|n| &n.path == path) {
                Some(n) => n.dev = Some((ma, mi)),
                None => s.nodes.push(NodeSpec::char(path, ma, mi)),
            }
        }
    }
    if let Some(denied) = &h.denied_nodes {
        for n in &mut s.nodes {
            if let Some(errno) = denied.get(&n.path) {
                n.open = Some(Err(errno.clone()));
            }
        }
    }
    if let Some(allow) = &h.device_allow {
        s.device_allow = allow.clone();
    }
    if let Some(l) = &h.libcuda {
        s.processes = vec![ProcessSpec::python3(
            4242,
            &l.iter().map(String::as_str).collect::<Vec<_>>(),
        )];
    }
    if let Some(l) = &h.lockdown {
        // `security/lockdown/lockdown.c` lists every level and brackets the current one.
        let line = ["none", "integrity", "confidentiality"]
            .map(|x| {
                if x == l {
                    format!("[{x}]")
                } else {
                    x.to_string()
                }
            })
            .join(" ");
        s.files.push((LOCKDOWN.to_string(), format!("{line}\n")));
    }
    if let Some(on) = h.secure_boot {
        // The efivar: 4 bytes of attributes, then the value byte.
        let value = if on {
            "\u{6}\0\0\0\u{1}"
        } else {
            "\u{6}\0\0\0\0"
        };
        s.files.push((SECURE_BOOT.to_string(), value.to_string()));
    }
    if let Some(files) = &h.files {
        s.files
            .extend(files.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    s
}

/// Where the kernel says its lockdown level.
const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

/// UEFI's `SecureBoot` variable (the EFI global variable GUID).
const SECURE_BOOT: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

fn smi_gpu(i: u32, g: Option<&Gpu>) -> SmiGpu {
    let mut s = SmiGpu::h200(i);
    let Some(g) = g else { return s };
    if let Some(p) = &g.product {
        s.product_name = p.clone();
    }
    if let Some(p) = g.persistence {
        s.persistence_mode = if p { "Enabled" } else { "Disabled" }.into();
    }
    if let Some(c) = &g.compute_mode {
        s.compute_mode = c.clone();
    }
    if let Some(m) = g.mig {
        s.mig_mode = if m { "Enabled" } else { "Disabled" }.into();
    }
    if let Some(n) = g.mig_instances {
        s.mig_devices = n;
    }
    if let Some(f) = &g.fabric_state {
        s.fabric_state = f.clone();
    }
    if let Some(a) = &g.addressing {
        s.addressing_mode = a.clone();
    }
    s
}

/// What the doctor said of one case.
struct Verdict {
    status: String,
    /// Whether it named a symptom.
    symptom: bool,
    /// The findings' causes: the leading one first, then those still possible; without a
    /// symptom, the hazards, worst first.
    rules: Vec<String>,
    /// Whether a hazard of warning or worse was found (a host without a symptom).
    serious_hazard: bool,
}

fn judge(case: &Case) -> Verdict {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-incident")
        .tempdir()
        .unwrap();
    write_snapshot_fixture(dir.path(), &spec_of(&case.host)).unwrap();
    if let Some(o) = &case.observations {
        fs::write(
            dir.path().join("observations.json"),
            serde_json::to_vec_pretty(o).unwrap(),
        )
        .unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args(["doctor", "--format", "json", "--root"])
        .arg(dir.path())
        .output()
        .expect("run uvmwatch doctor");
    // `UVMWATCH_INCIDENT_KEEP=<id>`: keep that case's snapshot tree to read or rerun by hand.
    if std::env::var("UVMWATCH_INCIDENT_KEEP").is_ok_and(|id| id == case.id) {
        eprintln!("{}: snapshot kept at {}", case.id, dir.keep().display());
    }
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: doctor printed no JSON ({e}): {}{}",
            case.id,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let findings = report["findings"].as_array().cloned().unwrap_or_default();
    Verdict {
        status: report["status"].as_str().unwrap_or_default().to_string(),
        symptom: report["symptom"].is_object(),
        rules: findings
            .iter()
            .filter_map(|f| f["rule"].as_str().map(str::to_string))
            .collect(),
        serious_hazard: findings.iter().any(|f| f["severity"] != "info"),
    }
}

/// A recorded failure or hazard in a case's observations: a `cuInit` that did not return 0
/// or is still running, a failed context call, open or driver call, a fork after `cuInit`.
fn records_failure(o: &Value) -> bool {
    let nonzero = |k: &str| o[k].as_i64().is_some_and(|r| r != 0);
    nonzero("cuinit_result")
        || o["cuinit_in_flight"] == true
        || nonzero("context_result")
        || o["failed_opens"].as_array().is_some_and(|a| !a.is_empty())
        || o["failed_call"].is_object()
        || o["forked_after_parent_init"] == true
}

#[test]
fn incident_bank_cases_are_cited_and_well_formed() {
    let cases = cases();
    // A batch scored from elsewhere is checked for form, not size.
    let bank = std::env::var_os("UVMWATCH_INCIDENT_DIR").is_none();
    assert!(
        !bank || cases.len() >= MIN_CASES,
        "{} cases, at least {MIN_CASES} wanted",
        cases.len()
    );
    let mut near = 0;
    for (name, c) in &cases {
        assert_eq!(name, &c.id, "file name and id differ");
        assert!(
            c.source.starts_with("https://"),
            "{name}: source {}",
            c.source
        );
        for (field, v) in [
            ("title", &c.title),
            ("shows", &c.shows),
            ("cause", &c.cause),
            ("confirmed", &c.confirmed),
            ("filled", &c.filled),
        ] {
            assert!(!v.trim().is_empty(), "{name}: empty {field}");
        }
        assert!(
            c.first == "healthy" || RULES.contains(&c.first.as_str()),
            "{name}: first {} is no rule",
            c.first
        );
        for a in &c.absent {
            assert!(RULES.contains(&a.as_str()), "{name}: absent {a} is no rule");
            assert_ne!(a, &c.first, "{name}: {a} both first and absent");
        }
        assert!(
            c.new_class.is_none() || RULES.contains(&c.first.as_str()),
            "{name}: new class without a rule"
        );
        match c.kind.as_str() {
            "incident" => {}
            "near_miss" => near += 1,
            k => panic!("{name}: kind {k}"),
        }
    }
    assert!(!bank || near >= 5, "{near} near misses, at least 5 wanted");
}

#[test]
fn incident_bank_each_case_gets_its_rule_first_and_no_near_miss() {
    let mut failures = Vec::new();
    let mut table = String::new();
    let cases = cases();
    let total = cases.len();
    for (name, c) in cases {
        let v = judge(&c);
        let got = v.rules.first().map(String::as_str).unwrap_or("healthy");
        let mut wrong = Vec::new();
        if c.first == "healthy" {
            // Healthy: no symptom, and no hazard of warning or worse (an info, such as
            // persistence off, is advice).
            if v.symptom || v.serious_hazard {
                wrong.push(format!("status {} (rules {:?})", v.status, v.rules));
            }
        } else if got != c.first {
            wrong.push(format!("first {got}, want {}", c.first));
        }
        for a in &c.absent {
            if v.rules.contains(a) {
                wrong.push(format!("{a} present"));
            }
        }
        if c.observations.as_ref().is_some_and(records_failure) && v.status == "healthy" {
            wrong.push("healthy over a recorded failure".into());
        }
        table.push_str(&format!(
            "{:<4} {name:<44} {:<24} {}\n",
            if wrong.is_empty() { "ok" } else { "FAIL" },
            c.first,
            v.rules.join(",")
        ));
        if !wrong.is_empty() {
            failures.push(format!("{name} ({}): {}", c.source, wrong.join("; ")));
        }
    }
    println!("{table}");
    println!(
        "{} of {total} cases right ({})",
        total - failures.len(),
        cases_dir().display()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! Every diagnosis rule on snapshot trees: each case lays out a machine on disk with
//! `write_snapshot_fixture`, reads it back with `collect(&Root::Snapshot(..))` (the same
//! collectors a bundle replay uses), and diagnoses it together with what the probes would
//! have seen for one process (`Observations`, built here: they come from the probes, not
//! from the host's files). Each rule has positive cases and the near misses it documents.
//! No root, no GPU, no eBPF.

use std::path::Path;

use uvmwatch::doctor::collect::collect;
use uvmwatch::doctor::facts::{Evidence, Observations, SeenCall};
use uvmwatch::doctor::finding::*;
use uvmwatch::doctor::root::Root;
use uvmwatch::doctor::rules::{diagnose, RULES};
use uvmwatch_testbed::snapshot::*;

// ---------------------------------------------------------------------------------------
// Snapshot trees

const DRIVER: &str = "590.48.01";
/// Source of the kernel log in a snapshot (`commands/dmesg.txt`, no manifest).
const DMESG: &str = "dmesg";
/// The pid the probes watched.
const PID: u32 = 4242;

/// Writes `spec`, then lets `extra` add files the fixture has no knob for, then collects.
fn evidence_with(spec: &SnapshotSpec, extra: impl FnOnce(&Path)) -> Evidence {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-rules")
        .tempdir()
        .expect("tempdir");
    write_snapshot_fixture(dir.path(), spec).expect("write snapshot");
    extra(dir.path());
    collect(&Root::Snapshot(dir.path().to_path_buf()))
}

fn evidence(spec: &SnapshotSpec) -> Evidence {
    evidence_with(spec, |_| {})
}

/// Diagnoses the snapshot of `spec` with what the probes saw.
fn diagnose_spec(spec: &SnapshotSpec, o: &Observations) -> Vec<Finding> {
    diagnose(&evidence(spec), o)
}

/// The motivating machine: the healthy default (open 590 on Ubuntu's 6.8 kernel, HMM on,
/// KASLR on, two H200s) except that UVM never set up HMM device memory (no
/// `nvidia-uvm-hmm` in /proc/iomem).
fn incident_spec() -> SnapshotSpec {
    SnapshotSpec {
        iomem_hmm: false,
        ..SnapshotSpec::default()
    }
}

/// `nvidia-smi -q` of `n` H200s, each changed by `f`.
fn smi_h200(n: u32, f: impl Fn(&mut SmiGpu)) -> Option<String> {
    let gpus: Vec<SmiGpu> = (0..n)
        .map(|i| {
            let mut g = SmiGpu::h200(i);
            f(&mut g);
            g
        })
        .collect();
    Some(smi_q(DRIVER, &gpus))
}

/// The default boot log followed by `extra`.
fn dmesg_after_boot(extra: &str) -> Option<String> {
    Some(format!(
        "{}{extra}",
        boot_dmesg(&DriverSpec::open(DRIVER), 508)
    ))
}

fn nodes_without(path: &str) -> Vec<NodeSpec> {
    standard_nodes(2, 508)
        .into_iter()
        .filter(|n| n.path != path)
        .collect()
}

fn process(pid: u32, libcuda: &[&str]) -> ProcessSpec {
    ProcessSpec {
        pid,
        comm: "python3".to_string(),
        libcuda: libcuda.iter().map(|s| s.to_string()).collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Observations (what the probes saw)

/// Process [`PID`], nothing seen yet.
fn watched() -> Observations {
    Observations {
        pid: Some(PID),
        ..Observations::default()
    }
}

/// A plain `uvmwatch doctor`: no process observed.
fn plain() -> Observations {
    Observations::default()
}

trait Saw: Sized {
    fn with(self, f: impl FnOnce(&mut Observations)) -> Self;

    fn cuinit(self, r: i64, secs: f64) -> Self {
        self.with(|o| {
            o.cuinit_result = Some(r);
            o.cuinit_seconds = Some(secs);
        })
    }
    fn in_flight(self, secs: f64) -> Self {
        self.with(|o| {
            o.cuinit_in_flight = true;
            o.cuinit_seconds = Some(secs);
        })
    }
    fn opens(self, n: u32) -> Self {
        self.with(|o| o.device_opens = n)
    }
    fn failed_open(self, path: &str, errno: &str) -> Self {
        self.with(|o| o.failed_opens.push((path.into(), errno.into())))
    }
    fn failed_call(self, call: &str, node: &str, result: &str) -> Self {
        self.with(|o| {
            o.failed_call = Some(SeenCall {
                call: call.into(),
                node: node.into(),
                result: result.into(),
                seconds: 0.05,
            })
        })
    }
    fn stuck(self, call: &str, node: &str, secs: f64, state: &str) -> Self {
        self.with(|o| {
            o.stuck_in = Some(SeenCall {
                call: call.into(),
                node: node.into(),
                result: String::new(),
                seconds: secs,
            });
            o.stuck_state = Some(state.into());
        })
    }
    fn forked(self) -> Self {
        self.with(|o| o.forked_after_parent_init = true)
    }
    fn unavailable(self, probe: &str) -> Self {
        self.with(|o| o.unavailable_probes.push(probe.into()))
    }
}

impl Saw for Observations {
    fn with(mut self, f: impl FnOnce(&mut Observations)) -> Self {
        f(&mut self);
        self
    }
}

/// The motivating incident: cuInit 3 after UVM_REGISTER_GPU returned NV_ERR_NO_MEMORY,
/// every open having succeeded.
fn register_gpu_no_memory() -> Observations {
    watched().cuinit(3, 0.412).opens(4).failed_call(
        "UVM_REGISTER_GPU",
        "/dev/nvidia-uvm",
        "NV_ERR_NO_MEMORY",
    )
}

// ---------------------------------------------------------------------------------------
// Assertions

fn find<'a>(fs: &'a [Finding], rule: &str) -> Option<&'a Finding> {
    fs.iter().find(|f| f.rule == rule)
}

/// The finding of `rule`, with the severity and confidence expected, and what every finding
/// must carry (runbook, evidence with sources, a fix).
fn expect<'a>(fs: &'a [Finding], rule: &str, sev: Severity, conf: Confidence) -> &'a Finding {
    let f = find(fs, rule).unwrap_or_else(|| panic!("no {rule} finding in {fs:#?}"));
    assert_eq!((f.severity, f.confidence), (sev, conf), "{f:#?}");
    assert_eq!(f.runbook, format!("docs/runbooks/{rule}.md"));
    assert!(!f.title.is_empty());
    assert!(!f.evidence.is_empty(), "{rule}: no evidence");
    for i in &f.evidence {
        assert!(!i.source.is_empty(), "{rule}: {:?} has no source", i.what);
        assert!(!i.value.is_empty(), "{rule}: {:?} has no value", i.what);
    }
    assert!(!f.fix.is_empty(), "{rule}: no fix");
    f
}

fn absent(fs: &[Finding], rule: &str) {
    assert!(find(fs, rule).is_none(), "unexpected {rule}: {fs:#?}");
}

/// `rule` absent, or at most `sev`.
fn at_most(fs: &[Finding], rule: &str, sev: Severity) {
    if let Some(f) = find(fs, rule) {
        assert!(f.severity <= sev, "{rule} above {sev:?}: {f:#?}");
    }
}

/// The evidence item `what` has `source`; returns its value.
fn evidence_from<'a>(f: &'a Finding, what: &str, source: &str) -> &'a str {
    let i = f
        .evidence
        .iter()
        .find(|i| i.what == what)
        .unwrap_or_else(|| panic!("{}: no evidence {what:?} in {:#?}", f.rule, f.evidence));
    assert_eq!(i.source, source, "{}: source of {what:?}", f.rule);
    &i.value
}

fn has_fix(f: &Finding, w: Where, needle: &str) -> bool {
    f.fix
        .iter()
        .any(|s| s.where_ == w && s.commands.iter().any(|c| c.contains(needle)))
}

fn unchecked_mentions(f: &Finding, needle: &str) -> bool {
    f.unchecked.iter().any(|u| u.contains(needle))
}

fn rules_of(fs: &[Finding]) -> Vec<&str> {
    fs.iter().map(|f| f.rule.as_str()).collect()
}

// ---------------------------------------------------------------------------------------
// Coverage and the healthy machine

/// Rule ids this file has positive and negative cases for, in [`RULES`] order. Test names
/// start with the rule they are about: `hmm_`, `driver_hang_`, `missing_`, `permission_`,
/// `stale_after_suspend_`, `fabric_`, `version_`, `slow_init_`, `adapter_`,
/// `fork_after_init_`, `policy_`. A new rule fails this until it has cases here.
const COVERED: [&str; 11] = [
    "hmm_setup_failure",
    "driver_hang",
    "node_or_module_missing",
    "device_permission",
    "stale_after_suspend",
    "fabric_not_ready",
    "version_mismatch",
    "slow_init",
    "adapter_init_failure",
    "fork_after_init",
    "policy_or_partition",
];

#[test]
fn every_rule_of_rules_is_covered_here() {
    let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
    assert_eq!(ids, COVERED);
}

#[test]
fn healthy_default_snapshot_plain_doctor_has_no_critical_finding() {
    let fs = diagnose_spec(&SnapshotSpec::default(), &plain());
    assert!(
        fs.iter().all(|f| f.severity != Severity::Critical),
        "{fs:#?}"
    );
    // Nothing at all, in fact: HMM memory is set up, fabric complete, persistence on.
    assert_eq!(rules_of(&fs), Vec::<&str>::new());
}

#[test]
fn healthy_default_snapshot_with_a_working_cuinit_has_no_finding() {
    let fs = diagnose_spec(
        &SnapshotSpec::default(),
        &watched().cuinit(0, 0.31).opens(5),
    );
    assert_eq!(rules_of(&fs), Vec::<&str>::new());
}

// ---------------------------------------------------------------------------------------
// hmm_setup_failure

#[test]
fn hmm_register_gpu_no_memory_on_incident_host_is_critical_high_with_host_fix() {
    let fs = diagnose_spec(&incident_spec(), &register_gpu_no_memory());
    assert_eq!(rules_of(&fs), ["hmm_setup_failure"]);
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("NV_ERR_NO_MEMORY"), "{}", f.title);
    let reg = evidence_from(f, "GPU registration in UVM", "probe:ioctl");
    assert!(reg.contains("UVM_REGISTER_GPU on /dev/nvidia-uvm"), "{reg}");
    evidence_from(f, "cuInit returned", "probe:cuInit");
    evidence_from(f, "device opens", "probe:openat");
    assert!(
        evidence_from(f, "driver", "/proc/driver/nvidia/version").contains("open kernel module")
    );
    assert!(
        evidence_from(f, "uvm_disable_hmm", "/sys/module/nvidia_uvm/parameters").starts_with('N')
    );
    assert!(evidence_from(f, "KASLR", "/proc/cmdline").starts_with("on"));
    evidence_from(f, "kernel HMM support", "/boot/config-6.8.0-45-generic");
    assert!(evidence_from(f, "kernel", "/proc/sys/kernel/osrelease").contains("older than 6.11"));
    assert_eq!(
        evidence_from(f, "addressing mode", "nvidia-smi -q"),
        "HMM, HMM"
    );
    assert!(has_fix(f, Where::Host, "uvm_disable_hmm=1"));
    // No kprobe result: said, not claimed.
    assert!(unchecked_mentions(f, "request_free_mem_region"));
}

#[test]
fn hmm_register_gpu_hang_names_hmm_before_driver_hang() {
    let hang = watched().in_flight(45.0).opens(4).stuck(
        "UVM_REGISTER_GPU",
        "/dev/nvidia-uvm",
        44.5,
        "D (disk sleep)",
    );
    let fs = diagnose_spec(&incident_spec(), &hang);
    assert_eq!(rules_of(&fs), ["hmm_setup_failure", "driver_hang"]);
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("hangs"), "{}", f.title);
    evidence_from(f, "GPU registration in UVM", "probe:ioctl");
    evidence_from(f, "cuInit", "probe:cuInit");
}

#[test]
fn hmm_request_free_mem_region_err_34_in_kernel_log_is_critical_without_probes() {
    // The error line is printed only with uvm_debug_prints=1; the fixture always writes 0,
    // so the parameter is rewritten in the tree.
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_HMM_ERR_34),
        ..incident_spec()
    };
    let e = evidence_with(&spec, |dir| {
        std::fs::write(
            dir.join("sys/module/nvidia_uvm/parameters/uvm_debug_prints"),
            "1\n",
        )
        .unwrap();
    });
    let fs = diagnose(&e, &plain());
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::High,
    );
    assert!(evidence_from(f, "kernel log", DMESG).contains("request_free_mem_region() err -34"));
}

#[test]
fn hmm_request_free_mem_region_kprobe_is_critical_high() {
    let o = watched().cuinit(3, 0.4).opens(4).with(|o| {
        o.kernel_signals
            .push("request_free_mem_region = -34 (ERANGE)".into())
    });
    let fs = diagnose_spec(&incident_spec(), &o);
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::High,
    );
    evidence_from(f, "kernel signal", "probe:kprobe");
    assert!(!unchecked_mentions(f, "cannot see request_free_mem_region"));
}

#[test]
fn hmm_risk_profile_with_plain_doctor_is_only_a_medium_warning() {
    let fs = diagnose_spec(&incident_spec(), &plain());
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Warning,
        Confidence::Medium,
    );
    assert!(unchecked_mentions(f, "--probe"), "{:?}", f.unchecked);
    assert!(has_fix(f, Where::Host, "uvm_disable_hmm=1"));
}

#[test]
fn hmm_error_3_with_uvm_disable_hmm_y_is_not_hmm_setup_failure() {
    let spec = SnapshotSpec {
        uvm_disable_hmm: true,
        ..incident_spec()
    };
    absent(
        &diagnose_spec(&spec, &register_gpu_no_memory()),
        "hmm_setup_failure",
    );
    absent(&diagnose_spec(&spec, &plain()), "hmm_setup_failure");
}

#[test]
fn hmm_error_3_on_proprietary_module_is_not_hmm_setup_failure() {
    let driver = DriverSpec::proprietary(DRIVER);
    let spec = SnapshotSpec {
        dmesg: Some(boot_dmesg(&driver, 508)),
        driver: Some(driver),
        ..incident_spec()
    };
    absent(
        &diagnose_spec(&spec, &register_gpu_no_memory()),
        "hmm_setup_failure",
    );
    assert_eq!(
        rules_of(&diagnose_spec(&spec, &plain())),
        Vec::<&str>::new()
    );
}

#[test]
fn hmm_kernel_without_hmm_config_or_with_ats_addressing_is_not_hmm_setup_failure() {
    let no_hmm = SnapshotSpec {
        hmm_config: false,
        ..incident_spec()
    };
    absent(
        &diagnose_spec(&no_hmm, &register_gpu_no_memory()),
        "hmm_setup_failure",
    );
    let ats = SnapshotSpec {
        smi: smi_h200(2, |g| g.addressing_mode = Some("ATS".into())),
        ..incident_spec()
    };
    absent(
        &diagnose_spec(&ats, &register_gpu_no_memory()),
        "hmm_setup_failure",
    );
}

#[test]
fn hmm_nokaslr_lowers_the_register_gpu_failure_to_medium() {
    let spec = SnapshotSpec {
        nokaslr: true,
        ..incident_spec()
    };
    let fs = diagnose_spec(&spec, &register_gpu_no_memory());
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::Medium,
    );
    assert!(evidence_from(f, "KASLR", "/proc/cmdline").starts_with("off (nokaslr"));
    // And no static warning with nokaslr.
    absent(&diagnose_spec(&spec, &plain()), "hmm_setup_failure");
}

#[test]
fn hmm_no_warning_on_a_fixed_kernel_or_with_hmm_memory_already_set_up() {
    let fixed = SnapshotSpec {
        kernel_release: "6.12.0-55-generic".into(),
        ..incident_spec()
    };
    absent(&diagnose_spec(&fixed, &plain()), "hmm_setup_failure");
    // /proc/iomem shows nvidia-uvm-hmm regions: set-up worked on this boot.
    absent(
        &diagnose_spec(&SnapshotSpec::default(), &plain()),
        "hmm_setup_failure",
    );
    // cuInit seen working on the risky host.
    absent(
        &diagnose_spec(&incident_spec(), &watched().cuinit(0, 0.3).opens(4)),
        "hmm_setup_failure",
    );
}

#[test]
fn hmm_error_3_with_every_ioctl_seen_succeeding_is_not_critical_but_blind_ioctls_are_low() {
    let only3 = watched().cuinit(3, 0.3).opens(4);
    at_most(
        &diagnose_spec(&incident_spec(), &only3),
        "hmm_setup_failure",
        Severity::Warning,
    );
    let blind = only3.unavailable("syscalls:sys_exit_ioctl: tracefs not mounted");
    let fs = diagnose_spec(&incident_spec(), &blind);
    let f = expect(
        &fs,
        "hmm_setup_failure",
        Severity::Critical,
        Confidence::Low,
    );
    assert!(unchecked_mentions(f, "UVM_REGISTER_GPU result not seen"));
}

// ---------------------------------------------------------------------------------------
// driver_hang

#[test]
fn driver_hang_thread_stuck_in_rm_control_in_d_state_is_critical_high() {
    let o = watched()
        .in_flight(60.0)
        .opens(2)
        .stuck(
            "NV_ESC_RM_CONTROL",
            "/dev/nvidiactl",
            59.0,
            "D (disk sleep)",
        )
        .with(|o| o.stuck_wchan = Some("os_acquire_mutex".into()));
    let fs = diagnose_spec(&SnapshotSpec::default(), &o);
    assert_eq!(fs[0].rule, "driver_hang");
    let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::High);
    evidence_from(f, "call in flight", "probe:ioctl");
    evidence_from(f, "thread state", "/proc/4242/stat");
    evidence_from(f, "wchan", "/proc/4242/wchan");
    assert!(has_fix(f, Where::Any, "/proc/4242/stack"));
    // Not the HMM set-up: that is UVM_REGISTER_GPU, not an RM control call.
    at_most(&fs, "hmm_setup_failure", Severity::Warning);
}

#[test]
fn driver_hang_hung_task_or_soft_lockup_with_uvm_frames_in_kernel_log_is_critical_medium() {
    for (needle, excerpt) in [
        ("blocked for more than", DMESG_HUNG_TASK_UVM),
        ("soft lockup", DMESG_SOFT_LOCKUP_UVM),
    ] {
        let spec = SnapshotSpec {
            dmesg: dmesg_after_boot(excerpt),
            ..SnapshotSpec::default()
        };
        let fs = diagnose_spec(&spec, &plain());
        let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::Medium);
        let line = evidence_from(f, "kernel log", DMESG);
        assert!(line.contains(needle), "{needle}: {line}");
    }
}

#[test]
fn driver_hang_oops_in_nvidia_uvm_means_wedged_until_reboot() {
    let oops = "\
[ 4410.100001] BUG: kernel NULL pointer dereference, address: 0000000000000008
[ 4410.100010] #PF: supervisor read access in kernel mode
[ 4410.100020] Oops: 0000 [#1] PREEMPT SMP NOPTI
[ 4410.100030] RIP: 0010:uvm_va_space_register_gpu+0x1f/0x300 [nvidia_uvm]
[ 4410.100040] Call Trace:
[ 4410.100041]  <TASK>
[ 4410.100050]  uvm_api_register_gpu+0x5a/0x80 [nvidia_uvm]
[ 4410.100060]  </TASK>
";
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(oops),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(&fs, "driver_hang", Severity::Critical, Confidence::High);
    assert!(f.title.contains("wedged"), "{}", f.title);
    assert!(evidence_from(f, "kernel log", DMESG).contains("NULL pointer"));
    assert!(has_fix(f, Where::Host, "sudo reboot"));
}

#[test]
fn driver_hang_not_for_a_hung_task_outside_nvidia() {
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_HUNG_TASK_OTHER),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&spec, &plain()), "driver_hang");
    absent(
        &diagnose_spec(&spec, &watched().cuinit(0, 0.3).opens(4)),
        "driver_hang",
    );
}

#[test]
fn driver_hang_not_for_slow_cuinit_without_a_call_in_flight_nor_for_a_returned_failure() {
    // cuInit still running, ioctl probes working, no driver call in flight.
    let slow = watched().in_flight(30.0).opens(4);
    absent(
        &diagnose_spec(&SnapshotSpec::default(), &slow),
        "driver_hang",
    );
    // A call that failed and returned is not a hang.
    absent(
        &diagnose_spec(&incident_spec(), &register_gpu_no_memory()),
        "driver_hang",
    );
    // Blind to ioctls: only a low warning that says so.
    let blind = slow.unavailable("syscalls:sys_enter_ioctl: tracefs not mounted");
    let fs = diagnose_spec(&SnapshotSpec::default(), &blind);
    let f = expect(&fs, "driver_hang", Severity::Warning, Confidence::Low);
    assert!(unchecked_mentions(f, "driver call in flight not seen"));
}

// ---------------------------------------------------------------------------------------
// node_or_module_missing

#[test]
fn missing_uvm_node_enoent_with_module_unloaded_is_critical_high() {
    let spec = SnapshotSpec {
        uvm_loaded: false,
        nodes: nodes_without("/dev/nvidia-uvm")
            .into_iter()
            .filter(|n| n.path != "/dev/nvidia-uvm-tools")
            .collect(),
        ..SnapshotSpec::default()
    };
    let o = watched()
        .cuinit(999, 0.004)
        .opens(1)
        .failed_open("/dev/nvidia-uvm", "ENOENT");
    let fs = diagnose_spec(&spec, &o);
    let f = expect(
        &fs,
        "node_or_module_missing",
        Severity::Critical,
        Confidence::High,
    );
    assert_eq!(
        evidence_from(f, "open", "probe:openat"),
        "/dev/nvidia-uvm: ENOENT"
    );
    assert_eq!(
        evidence_from(f, "nvidia_uvm", "/proc/modules"),
        "not loaded"
    );
    assert_eq!(
        evidence_from(f, "/dev/nvidia-uvm", "/dev/nvidia*"),
        "absent"
    );
    evidence_from(f, "cuInit", "probe:cuInit");
    assert!(has_fix(f, Where::Host, "nvidia-modprobe -u -c 0"));
    // ENOENT is not a permission problem.
    absent(&fs, "device_permission");
}

#[test]
fn missing_uvm_node_in_a_docker_container_from_static_evidence_is_critical_medium() {
    let spec = SnapshotSpec {
        container: ContainerSpec::Docker,
        nodes: nodes_without("/dev/nvidia-uvm"),
        ..SnapshotSpec::default()
    };
    let e = evidence(&spec);
    let fs = diagnose(&e, &plain());
    let f = expect(
        &fs,
        "node_or_module_missing",
        Severity::Critical,
        Confidence::Medium,
    );
    assert_eq!(
        evidence_from(f, "/dev/nvidia-uvm", "/dev/nvidia*"),
        "absent"
    );
    assert_eq!(evidence_from(f, "runs in", &e.container.source), "docker");
    assert!(has_fix(f, Where::Host, "--device /dev/nvidia-uvm"));
}

#[test]
fn missing_uvm_module_on_the_host_from_static_evidence_is_only_a_low_warning() {
    let spec = SnapshotSpec {
        uvm_loaded: false,
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "node_or_module_missing",
        Severity::Warning,
        Confidence::Low,
    );
    assert_eq!(
        evidence_from(f, "nvidia_uvm", "/proc/modules"),
        "not loaded"
    );
    // ...and none once cuInit is seen working (nvidia-modprobe loaded it).
    absent(
        &diagnose_spec(&spec, &watched().cuinit(0, 0.4).opens(4)),
        "node_or_module_missing",
    );
}

#[test]
fn missing_driver_entirely_when_a_process_opens_nvidiactl() {
    let spec = SnapshotSpec {
        driver: None,
        uvm_loaded: false,
        nodes: Vec::new(),
        smi: None,
        dmesg: Some("[    0.000000] Linux version 6.8.0-45-generic\n".into()),
        daemons: Vec::new(),
        ..SnapshotSpec::default()
    };
    let o = watched()
        .cuinit(100, 0.002)
        .failed_open("/dev/nvidiactl", "ENOENT");
    let fs = diagnose_spec(&spec, &o);
    let f = expect(
        &fs,
        "node_or_module_missing",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("no NVIDIA driver"), "{}", f.title);
    assert!(has_fix(f, Where::Host, "modprobe nvidia"));
    // A plain doctor on a machine without any driver claims nothing.
    assert_eq!(
        rules_of(&diagnose_spec(&spec, &plain())),
        Vec::<&str>::new()
    );
}

#[test]
fn missing_not_for_eperm_on_a_present_node() {
    let o = watched()
        .cuinit(999, 0.003)
        .opens(2)
        .failed_open("/dev/nvidia-uvm", "EPERM");
    let fs = diagnose_spec(&SnapshotSpec::default(), &o);
    absent(&fs, "node_or_module_missing");
    expect(
        &fs,
        "device_permission",
        Severity::Critical,
        Confidence::High,
    );
}

// ---------------------------------------------------------------------------------------
// device_permission

/// An LXC allow-list written for an earlier boot: nvidia-uvm was 507 then, 508 now.
fn stale_lxc() -> SnapshotSpec {
    SnapshotSpec {
        container: ContainerSpec::Lxc,
        device_allow: Some(vec![
            "c 195:* rwm".into(),
            "c 507:* rwm".into(),
            "c 1:3 rwm".into(),
        ]),
        ..SnapshotSpec::default()
    }
}

#[test]
fn permission_eperm_on_uvm_with_a_stale_lxc_allow_list_is_critical_high() {
    let e = evidence(&stale_lxc());
    assert_eq!(e.container.get().map(|c| c.kind.as_str()), Some("lxc"));
    let o = watched()
        .cuinit(999, 0.003)
        .opens(2)
        .failed_open("/dev/nvidia-uvm", "EPERM");
    let fs = diagnose(&e, &o);
    assert_eq!(fs[0].rule, "device_permission");
    let f = expect(
        &fs,
        "device_permission",
        Severity::Critical,
        Confidence::High,
    );
    assert_eq!(
        evidence_from(f, "open", "probe:openat"),
        "/dev/nvidia-uvm: EPERM"
    );
    assert_eq!(evidence_from(f, "nvidia-uvm major", "/proc/devices"), "508");
    assert!(
        evidence_from(f, "device allow-list", &e.container.source).contains("nothing for c 508:*")
    );
    assert!(f.fix.iter().any(|s| s.note.contains("c 508:* rwm")));
    absent(&fs, "node_or_module_missing");
    absent(&fs, "stale_after_suspend");
}

#[test]
fn permission_stale_lxc_allow_list_from_static_evidence_is_critical_medium() {
    let fs = diagnose_spec(&stale_lxc(), &plain());
    let f = expect(
        &fs,
        "device_permission",
        Severity::Critical,
        Confidence::Medium,
    );
    assert!(f.title.contains("(508)"), "{}", f.title);
    // Once cuInit is seen working, the list is evidently good enough.
    absent(
        &diagnose_spec(&stale_lxc(), &watched().cuinit(0, 0.3).opens(4)),
        "device_permission",
    );
}

#[test]
fn permission_denied_to_the_collectors_own_open_is_recorded_in_the_snapshot() {
    let mut nodes = standard_nodes(2, 508);
    for n in nodes.iter_mut() {
        n.open = Some(if n.path == "/dev/nvidia-uvm" {
            Err("EACCES".into())
        } else {
            Ok(())
        });
    }
    let spec = SnapshotSpec {
        nodes,
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "device_permission",
        Severity::Critical,
        Confidence::Medium,
    );
    assert_eq!(
        evidence_from(f, "open by uvmwatch", "/dev/nvidia-uvm"),
        "/dev/nvidia-uvm (char 508:0): EACCES"
    );
    assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
}

#[test]
fn permission_eacces_seen_by_the_probe_suggests_modes() {
    let o = watched()
        .cuinit(999, 0.003)
        .failed_open("/dev/nvidia0", "EACCES");
    let fs = diagnose_spec(&SnapshotSpec::default(), &o);
    let f = expect(
        &fs,
        "device_permission",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.fix.iter().any(|s| s.note.starts_with("EACCES")));
}

#[test]
fn permission_not_for_enoent_a_good_allow_list_cgroup_v2_or_a_container_without_gpus() {
    // ENOENT (EPERM's near miss): the node is missing, not denied.
    let enoent = watched()
        .cuinit(999, 0.003)
        .failed_open("/dev/nvidia-uvm", "ENOENT");
    let spec = SnapshotSpec {
        nodes: nodes_without("/dev/nvidia-uvm"),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &enoent);
    absent(&fs, "device_permission");
    expect(
        &fs,
        "node_or_module_missing",
        Severity::Critical,
        Confidence::High,
    );
    // The allow-list has the current major.
    let good = SnapshotSpec {
        device_allow: Some(vec!["c 195:* rwm".into(), "c 508:* rwm".into()]),
        ..stale_lxc()
    };
    absent(&diagnose_spec(&good, &plain()), "device_permission");
    // cgroup v2: no list to read, nothing claimed.
    let v2 = SnapshotSpec {
        device_allow: None,
        ..stale_lxc()
    };
    absent(&diagnose_spec(&v2, &plain()), "device_permission");
    // A container not meant to have GPUs (no NVIDIA major in its list).
    let no_gpu = SnapshotSpec {
        container: ContainerSpec::Docker,
        device_allow: Some(vec!["c 1:3 rwm".into(), "c 5:0 rwm".into()]),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&no_gpu, &plain()), "device_permission");
}

// ---------------------------------------------------------------------------------------
// stale_after_suspend

fn resumed() -> SnapshotSpec {
    SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_RESUME),
        ..SnapshotSpec::default()
    }
}

#[test]
fn stale_after_suspend_resume_after_uvm_load_then_quick_999_is_critical_high() {
    let o = watched().cuinit(999, 0.02).opens(4);
    let fs = diagnose_spec(&resumed(), &o);
    assert_eq!(fs[0].rule, "stale_after_suspend");
    let f = expect(
        &fs,
        "stale_after_suspend",
        Severity::Critical,
        Confidence::High,
    );
    assert_eq!(
        evidence_from(f, "kernel log", DMESG),
        "resume from suspend after nvidia_uvm was loaded"
    );
    evidence_from(f, "cuInit returned", "probe:cuInit");
    evidence_from(f, "device opens", "probe:openat");
    assert!(has_fix(f, Where::Host, "modprobe -r nvidia_uvm"));
    // A slow 999 after the resume: still this, less sure.
    let fs = diagnose_spec(&resumed(), &watched().cuinit(999, 4.0).opens(4));
    expect(
        &fs,
        "stale_after_suspend",
        Severity::Critical,
        Confidence::Medium,
    );
}

#[test]
fn stale_after_suspend_resume_with_plain_doctor_is_a_low_warning() {
    let fs = diagnose_spec(&resumed(), &plain());
    expect(
        &fs,
        "stale_after_suspend",
        Severity::Warning,
        Confidence::Low,
    );
}

#[test]
fn stale_after_suspend_not_for_resume_before_load_reload_after_resume_or_working_cuinit() {
    let o = watched().cuinit(999, 0.02).opens(4);
    // Resume logged before nvidia_uvm was loaded.
    let before = SnapshotSpec {
        dmesg: Some(format!(
            "{DMESG_RESUME}{}",
            boot_dmesg(&DriverSpec::open(DRIVER), 508)
        )),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&before, &o), "stale_after_suspend");
    // nvidia_uvm reloaded after the resume.
    let reloaded = SnapshotSpec {
        dmesg: dmesg_after_boot(&format!(
            "{DMESG_RESUME}[ 9100.000000] nvidia-uvm: Loaded the UVM driver, major device number 508.\n"
        )),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&reloaded, &o), "stale_after_suspend");
    // No resume in a readable log.
    absent(
        &diagnose_spec(&SnapshotSpec::default(), &o),
        "stale_after_suspend",
    );
    // Resumed, but CUDA works.
    absent(
        &diagnose_spec(&resumed(), &watched().cuinit(0, 0.3).opens(4)),
        "stale_after_suspend",
    );
    // Resumed, 999, but an open failed: the missing node explains it.
    let enoent = watched()
        .cuinit(999, 0.004)
        .failed_open("/dev/nvidia-uvm", "ENOENT");
    absent(&diagnose_spec(&resumed(), &enoent), "stale_after_suspend");
}

#[test]
fn stale_after_suspend_999_without_a_kernel_log_is_low_and_says_why() {
    let spec = SnapshotSpec {
        dmesg: None,
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &watched().cuinit(999, 0.02).opens(4));
    let f = expect(
        &fs,
        "stale_after_suspend",
        Severity::Critical,
        Confidence::Low,
    );
    assert!(unchecked_mentions(f, "CAP_SYSLOG"), "{:?}", f.unchecked);
}

// ---------------------------------------------------------------------------------------
// fabric_not_ready

/// An HGX board whose NVSwitch fabric is still being set up, without a Fabric Manager.
fn nvswitch_not_ready() -> SnapshotSpec {
    let mut nodes = standard_nodes(2, 508);
    nodes.push(NodeSpec::char("/dev/nvidia-nvswitch0", 234, 0));
    nodes.push(NodeSpec::char("/dev/nvidia-nvswitch1", 234, 1));
    SnapshotSpec {
        smi: smi_h200(2, |g| g.fabric_state = Some("In Progress".into())),
        nodes,
        ..SnapshotSpec::default()
    }
}

#[test]
fn fabric_802_on_nvswitch_without_fabric_manager_is_critical_high() {
    let e = evidence(&nvswitch_not_ready());
    let fs = diagnose(&e, &watched().cuinit(802, 0.8).opens(6));
    assert_eq!(fs[0].rule, "fabric_not_ready");
    let f = expect(
        &fs,
        "fabric_not_ready",
        Severity::Critical,
        Confidence::High,
    );
    assert_eq!(
        evidence_from(f, "NVSwitch nodes", "/dev/nvidia-nvswitch*"),
        "/dev/nvidia-nvswitch0, /dev/nvidia-nvswitch1"
    );
    assert_eq!(
        evidence_from(f, "fabric state", "nvidia-smi -q"),
        "In Progress, In Progress"
    );
    assert_eq!(
        evidence_from(f, "nv-fabricmanager", &e.daemons.source),
        "not running"
    );
    evidence_from(f, "cuInit returned", "probe:cuInit");
    assert!(has_fix(f, Where::Host, "nvidia-fabricmanager"));
    // A later process gets 304: the same cause.
    let fs = diagnose(&e, &watched().cuinit(304, 0.5).opens(6));
    expect(
        &fs,
        "fabric_not_ready",
        Severity::Critical,
        Confidence::High,
    );
}

#[test]
fn fabric_in_progress_without_manager_from_static_evidence_is_critical_high() {
    let fs = diagnose_spec(&nvswitch_not_ready(), &plain());
    let f = expect(
        &fs,
        "fabric_not_ready",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("802"), "{}", f.title);
}

#[test]
fn fabric_802_on_a_machine_without_nvswitch_is_not_fabric_not_ready() {
    let o = watched().cuinit(802, 0.8).opens(4);
    // PCIe GPUs: no Fabric section at all, no NVSwitch nodes.
    let pcie = SnapshotSpec {
        smi: smi_h200(2, |g| g.fabric_state = None),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&pcie, &o), "fabric_not_ready");
    // Fabric state N/A: no NVSwitch either.
    let na = SnapshotSpec {
        smi: smi_h200(2, |g| g.fabric_state = Some("N/A".into())),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&na, &o), "fabric_not_ready");
}

#[test]
fn fabric_not_when_completed_with_manager_running_or_cuinit_works() {
    let o = watched().cuinit(802, 0.8).opens(6);
    // Completed and the manager running.
    let ready = SnapshotSpec {
        smi: smi_h200(2, |_| {}),
        daemons: vec!["nvidia-persistenced".into(), "nv-fabricmanager".into()],
        ..nvswitch_not_ready()
    };
    absent(&diagnose_spec(&ready, &plain()), "fabric_not_ready");
    absent(&diagnose_spec(&ready, &o), "fabric_not_ready");
    // Completed, manager not seen (it may run outside this PID namespace): ready anyway.
    let complete = SnapshotSpec {
        smi: smi_h200(2, |_| {}),
        ..nvswitch_not_ready()
    };
    absent(&diagnose_spec(&complete, &plain()), "fabric_not_ready");
    // cuInit works: whatever the fabric says, it is not failing CUDA.
    absent(
        &diagnose_spec(&nvswitch_not_ready(), &watched().cuinit(0, 0.4).opens(6)),
        "fabric_not_ready",
    );
}

#[test]
fn fabric_802_without_nvidia_smi_is_low_and_says_why() {
    let spec = SnapshotSpec {
        smi: None,
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &watched().cuinit(802, 0.8).opens(4));
    let f = expect(&fs, "fabric_not_ready", Severity::Critical, Confidence::Low);
    assert!(unchecked_mentions(f, "nvidia-smi"), "{:?}", f.unchecked);
}

// ---------------------------------------------------------------------------------------
// version_mismatch

#[test]
fn version_803_with_api_mismatch_in_the_kernel_log_is_critical_high() {
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_API_MISMATCH),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &watched().cuinit(803, 0.1).opens(1));
    assert_eq!(fs[0].rule, "version_mismatch");
    let f = expect(
        &fs,
        "version_mismatch",
        Severity::Critical,
        Confidence::High,
    );
    assert!(evidence_from(f, "kernel log", DMESG).contains("API mismatch"));
    assert_eq!(
        evidence_from(f, "kernel module", "/proc/driver/nvidia/version"),
        DRIVER
    );
    evidence_from(f, "cuInit returned", "probe:cuInit");
    assert!(has_fix(f, Where::Host, "sudo reboot"));
}

#[test]
fn version_process_mapping_an_older_libcuda_is_critical_medium_from_static_evidence() {
    let spec = SnapshotSpec {
        processes: vec![process(
            PID,
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"],
        )],
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "version_mismatch",
        Severity::Critical,
        Confidence::Medium,
    );
    let lib = evidence_from(f, "libcuda mapped", "/proc/4242/maps");
    assert!(lib.contains("580.95.05"), "{lib}");
    assert!(has_fix(
        f,
        Where::Container,
        "grep libcuda /proc/<pid>/maps"
    ));
}

#[test]
fn version_804_with_a_compat_library_on_geforce_is_critical_high() {
    let spec = SnapshotSpec {
        smi: smi_h200(1, |g| {
            g.product_name = "NVIDIA GeForce RTX 4090".into();
            g.product_brand = "GeForce".into();
            g.fabric_state = None;
        }),
        nodes: standard_nodes(1, 508),
        processes: vec![process(
            PID,
            &["/usr/local/cuda-13.1/compat/libcuda.so.595.45.04"],
        )],
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &watched().cuinit(804, 0.05).opens(2));
    let f = expect(
        &fs,
        "version_mismatch",
        Severity::Critical,
        Confidence::High,
    );
    assert!(evidence_from(f, "libcuda mapped", "/proc/4242/maps").contains("(forward-compat)"));
    assert!(evidence_from(f, "GPU brand", "nvidia-smi -q").starts_with("GeForce"));
    assert!(f
        .fix
        .iter()
        .any(|s| s.where_ == Where::Container && s.note.contains("forward-compatibility")));
}

#[test]
fn version_compat_library_newer_than_the_driver_on_a_datacenter_gpu_is_not_mismatch() {
    let spec = SnapshotSpec {
        processes: vec![process(
            PID,
            &["/usr/local/cuda-13.1/compat/libcuda.so.595.45.04"],
        )],
        ..SnapshotSpec::default()
    };
    let e = evidence(&spec);
    assert!(e
        .libcuda
        .get()
        .is_some_and(|l| l.iter().any(|m| m.compat && m.pid == PID)));
    absent(&diagnose(&e, &plain()), "version_mismatch");
    absent(
        &diagnose(&e, &watched().cuinit(0, 0.3).opens(4)),
        "version_mismatch",
    );
}

#[test]
fn version_compat_library_older_than_the_driver_on_a_datacenter_gpu_is_only_a_warning() {
    let spec = SnapshotSpec {
        processes: vec![process(
            PID,
            &["/usr/local/cuda-12.8/compat/libcuda.so.570.86.15"],
        )],
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    expect(
        &fs,
        "version_mismatch",
        Severity::Warning,
        Confidence::Medium,
    );
}

#[test]
fn version_not_for_error_3_with_matching_versions_or_another_processs_library() {
    // Same version everywhere, error 3: not a mismatch.
    let same = SnapshotSpec {
        processes: vec![process(
            PID,
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"],
        )],
        ..incident_spec()
    };
    absent(
        &diagnose_spec(&same, &register_gpu_no_memory()),
        "version_mismatch",
    );
    // An old library in some other process is not this process's problem.
    let other = SnapshotSpec {
        processes: vec![
            process(PID, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
            process(5151, &["/opt/old/libcuda.so.580.95.05"]),
        ],
        ..SnapshotSpec::default()
    };
    absent(
        &diagnose_spec(&other, &watched().cuinit(999, 0.2).opens(4)),
        "version_mismatch",
    );
}

// ---------------------------------------------------------------------------------------
// slow_init

fn persistence_off() -> SnapshotSpec {
    SnapshotSpec {
        smi: smi_h200(2, |g| g.persistence_mode = "Disabled".into()),
        daemons: Vec::new(),
        ..SnapshotSpec::default()
    }
}

#[test]
fn slow_init_9_seconds_with_persistence_off_is_info_medium() {
    let e = evidence(&persistence_off());
    let fs = diagnose(&e, &watched().cuinit(0, 9.5).opens(4));
    assert_eq!(rules_of(&fs), ["slow_init"]);
    let f = expect(&fs, "slow_init", Severity::Info, Confidence::Medium);
    assert!(evidence_from(f, "persistence mode", "nvidia-smi -q").starts_with("Disabled on 2"));
    assert_eq!(
        evidence_from(f, "nvidia-persistenced", &e.daemons.source),
        "not running"
    );
    evidence_from(f, "cuInit returned", "probe:cuInit");
    assert!(has_fix(f, Where::Host, "nvidia-persistenced"));
}

#[test]
fn slow_init_with_persistence_on_is_info_low() {
    let fs = diagnose_spec(&SnapshotSpec::default(), &watched().cuinit(0, 9.5).opens(4));
    let f = expect(&fs, "slow_init", Severity::Info, Confidence::Low);
    assert!(unchecked_mentions(f, "no baseline"));
}

#[test]
fn slow_init_threshold_grows_with_the_gpu_count() {
    let o = watched().cuinit(0, 2.8).opens(3);
    // Two GPUs: 2 s + 0.5 s each = 3 s; 2.8 s is fine.
    absent(&diagnose_spec(&persistence_off(), &o), "slow_init");
    // The same 2.8 s on one GPU (2.5 s) is slow.
    let one = SnapshotSpec {
        smi: smi_h200(1, |g| g.persistence_mode = "Disabled".into()),
        nodes: standard_nodes(1, 508),
        ..persistence_off()
    };
    expect(
        &diagnose_spec(&one, &o),
        "slow_init",
        Severity::Info,
        Confidence::Medium,
    );
}

#[test]
fn slow_init_not_for_a_failed_cuinit_a_fast_one_or_a_plain_doctor() {
    // A failed cuInit is not slow_init, however long it took.
    absent(
        &diagnose_spec(&persistence_off(), &watched().cuinit(3, 9.5).opens(4)),
        "slow_init",
    );
    absent(
        &diagnose_spec(&persistence_off(), &watched().cuinit(999, 9.5).opens(4)),
        "slow_init",
    );
    absent(
        &diagnose_spec(&persistence_off(), &watched().cuinit(0, 0.3).opens(4)),
        "slow_init",
    );
    absent(&diagnose_spec(&persistence_off(), &plain()), "slow_init");
    // Still running is a hang question, not slow init.
    absent(
        &diagnose_spec(&persistence_off(), &watched().in_flight(9.5).opens(4)),
        "slow_init",
    );
}

// ---------------------------------------------------------------------------------------
// adapter_init_failure

#[test]
fn adapter_rm_init_adapter_failed_in_the_kernel_log_is_critical_high() {
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_ADAPTER_INIT_FAILED),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "adapter_init_failure",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("RmInitAdapter"), "{}", f.title);
    assert!(evidence_from(f, "kernel log", DMESG).contains("RmInitAdapter failed!"));
    assert!(has_fix(f, Where::Host, "/lib/firmware/nvidia/590.48.01/"));
}

#[test]
fn adapter_xid_79_fallen_off_the_bus_is_critical_high() {
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(DMESG_XID_79),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "adapter_init_failure",
        Severity::Critical,
        Confidence::High,
    );
    assert!(f.title.contains("Xid 79"), "{}", f.title);
    assert_eq!(evidence_from(f, "Xid", DMESG), "79");
}

#[test]
fn adapter_eio_on_a_gpu_node_seen_by_the_probe_is_critical_medium() {
    let o = watched()
        .cuinit(100, 3.2)
        .opens(1)
        .failed_open("/dev/nvidia1", "EIO");
    let fs = diagnose_spec(&SnapshotSpec::default(), &o);
    let f = expect(
        &fs,
        "adapter_init_failure",
        Severity::Critical,
        Confidence::Medium,
    );
    assert_eq!(
        evidence_from(f, "open", "probe:openat"),
        "/dev/nvidia1: EIO"
    );
    // EIO is neither a missing node nor a denial.
    absent(&fs, "node_or_module_missing");
    absent(&fs, "device_permission");
}

#[test]
fn adapter_eio_recorded_for_the_collectors_own_open_is_critical() {
    let mut nodes = standard_nodes(2, 508);
    for n in nodes.iter_mut() {
        n.open = Some(if n.path == "/dev/nvidia0" {
            Err("EIO".into())
        } else {
            Ok(())
        });
    }
    let spec = SnapshotSpec {
        nodes,
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &plain());
    let f = expect(
        &fs,
        "adapter_init_failure",
        Severity::Critical,
        Confidence::Medium,
    );
    assert_eq!(
        f.title,
        "/dev/nvidia0 returned EIO: the GPU did not initialize"
    );
    assert_eq!(
        evidence_from(f, "open by uvmwatch", "/dev/nvidia0"),
        "/dev/nvidia0: EIO"
    );
}

#[test]
fn adapter_not_for_application_xids_13_31_43() {
    let app_xids = "\
[ 7001.100200] NVRM: Xid (PCI:0000:18:00): 13, pid=2817, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
[ 7002.200300] NVRM: Xid (PCI:0000:18:00): 31, pid=2817, name=python3, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ
[ 7003.300400] NVRM: Xid (PCI:0000:2a:00): 43, pid=2817, name=python3, Ch 00000008
";
    let spec = SnapshotSpec {
        dmesg: dmesg_after_boot(app_xids),
        ..SnapshotSpec::default()
    };
    let e = evidence(&spec);
    assert_eq!(
        e.kernel_log.get().map(|l| l.xids.clone()),
        Some(vec![13, 31, 43])
    );
    absent(&diagnose(&e, &plain()), "adapter_init_failure");
    absent(
        &diagnose(&e, &watched().cuinit(0, 0.3).opens(4)),
        "adapter_init_failure",
    );
}

#[test]
fn adapter_not_for_eio_on_the_uvm_node() {
    // Only /dev/nvidiactl and /dev/nvidia<N> are brought up by RM.
    let o = watched()
        .cuinit(999, 0.01)
        .opens(3)
        .failed_open("/dev/nvidia-uvm", "EIO");
    absent(
        &diagnose_spec(&SnapshotSpec::default(), &o),
        "adapter_init_failure",
    );
}

// ---------------------------------------------------------------------------------------
// fork_after_init

#[test]
fn fork_after_init_child_error_3_in_microseconds_without_opens_is_critical_high() {
    let o = watched().forked().cuinit(3, 0.00002);
    // On the HMM-risky host too: error 3 in the child is not the HMM failure.
    let fs = diagnose_spec(&incident_spec(), &o);
    assert_eq!(fs[0].rule, "fork_after_init");
    let f = expect(&fs, "fork_after_init", Severity::Critical, Confidence::High);
    evidence_from(f, "process", "probe:fork");
    evidence_from(f, "cuInit returned", "probe:cuInit");
    assert!(evidence_from(f, "device opens", "probe:openat").starts_with("none"));
    assert!(f.fix.iter().all(|s| s.where_ == Where::Container));
    at_most(&fs, "hmm_setup_failure", Severity::Warning);
}

#[test]
fn fork_after_init_not_for_a_fork_with_device_opens() {
    let o = watched().forked().cuinit(3, 0.2).opens(3);
    absent(
        &diagnose_spec(&SnapshotSpec::default(), &o),
        "fork_after_init",
    );
}

#[test]
fn fork_after_init_not_without_a_fork_nor_when_the_child_succeeds_or_an_open_failed() {
    let e = SnapshotSpec::default();
    absent(
        &diagnose_spec(&e, &watched().cuinit(3, 0.00002)),
        "fork_after_init",
    );
    absent(
        &diagnose_spec(&e, &watched().forked().cuinit(0, 0.2).opens(4)),
        "fork_after_init",
    );
    let denied = watched()
        .forked()
        .cuinit(3, 0.001)
        .failed_open("/dev/nvidia-uvm", "EPERM");
    absent(&diagnose_spec(&e, &denied), "fork_after_init");
}

#[test]
fn fork_after_init_slow_or_with_blind_opens_is_only_medium() {
    let blind = watched()
        .forked()
        .cuinit(3, 0.00002)
        .unavailable("syscalls:sys_exit_openat: tracefs not mounted");
    let fs = diagnose_spec(&SnapshotSpec::default(), &blind);
    let f = expect(
        &fs,
        "fork_after_init",
        Severity::Critical,
        Confidence::Medium,
    );
    assert!(unchecked_mentions(f, "device opens not seen"));
}

// ---------------------------------------------------------------------------------------
// policy_or_partition

#[test]
fn policy_exclusive_process_46_with_another_holder_is_critical_high() {
    let spec = SnapshotSpec {
        smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
        processes: vec![
            process(5151, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
            process(PID, &["/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01"]),
        ],
        ..SnapshotSpec::default()
    };
    let e = evidence(&spec);
    let fs = diagnose(&e, &watched().cuinit(46, 0.2).opens(4));
    let f = expect(
        &fs,
        "policy_or_partition",
        Severity::Critical,
        Confidence::High,
    );
    assert_eq!(
        evidence_from(f, "compute mode", "nvidia-smi -q"),
        "Exclusive_Process, Exclusive_Process"
    );
    assert_eq!(
        evidence_from(f, "other CUDA processes (pid)", &e.libcuda.source),
        "5151"
    );
    assert!(has_fix(f, Where::Host, "nvidia-smi -c DEFAULT"));
}

#[test]
fn policy_mig_on_and_cuinit_100_with_every_open_succeeding_is_critical_medium() {
    let spec = SnapshotSpec {
        smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
        ..SnapshotSpec::default()
    };
    let fs = diagnose_spec(&spec, &watched().cuinit(100, 0.2).opens(3));
    let f = expect(
        &fs,
        "policy_or_partition",
        Severity::Critical,
        Confidence::Medium,
    );
    assert_eq!(
        evidence_from(f, "MIG mode", "nvidia-smi -q"),
        "Enabled, Enabled"
    );
    assert!(has_fix(f, Where::Container, "nvidia-smi -L"));
}

#[test]
fn policy_prohibited_compute_mode_from_static_evidence() {
    let all = SnapshotSpec {
        smi: smi_h200(2, |g| g.compute_mode = "Prohibited".into()),
        ..SnapshotSpec::default()
    };
    expect(
        &diagnose_spec(&all, &plain()),
        "policy_or_partition",
        Severity::Critical,
        Confidence::Medium,
    );
    // Prohibited on one GPU of two: the other still works, a warning.
    let one = SnapshotSpec {
        smi: Some(smi_q(
            DRIVER,
            &[SmiGpu::h200(0), {
                let mut g = SmiGpu::h200(1);
                g.compute_mode = "Prohibited".into();
                g
            }],
        )),
        ..SnapshotSpec::default()
    };
    expect(
        &diagnose_spec(&one, &plain()),
        "policy_or_partition",
        Severity::Warning,
        Confidence::Medium,
    );
}

#[test]
fn policy_mig_on_without_a_failure_is_not_policy_or_partition() {
    let spec = SnapshotSpec {
        smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&spec, &plain()), "policy_or_partition");
    absent(
        &diagnose_spec(&spec, &watched().cuinit(0, 0.3).opens(4)),
        "policy_or_partition",
    );
    // Exclusive mode held by one process is a deliberate set-up until something fails.
    let exclusive = SnapshotSpec {
        smi: smi_h200(2, |g| g.compute_mode = "Exclusive_Process".into()),
        ..SnapshotSpec::default()
    };
    absent(&diagnose_spec(&exclusive, &plain()), "policy_or_partition");
}

#[test]
fn policy_not_for_100_with_a_missing_node_or_46_in_default_compute_mode() {
    let mig = SnapshotSpec {
        smi: smi_h200(2, |g| g.mig_mode = "Enabled".into()),
        nodes: nodes_without("/dev/nvidia-uvm"),
        ..SnapshotSpec::default()
    };
    let missing = watched()
        .cuinit(100, 0.01)
        .failed_open("/dev/nvidia-uvm", "ENOENT");
    let fs = diagnose_spec(&mig, &missing);
    absent(&fs, "policy_or_partition");
    expect(
        &fs,
        "node_or_module_missing",
        Severity::Critical,
        Confidence::High,
    );
    // 46 with compute mode Default: memory pressure or another cause, not policy.
    absent(
        &diagnose_spec(
            &SnapshotSpec::default(),
            &watched().cuinit(46, 0.2).opens(4),
        ),
        "policy_or_partition",
    );
}

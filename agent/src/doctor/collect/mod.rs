//! Evidence collectors: read the diagnosed machine through a [`Root`] and fill an
//! [`Evidence`].
//!
//! [`collect`] never fails and never panics on what it reads: each source that is missing or
//! malformed becomes a [`Fact`] whose value is `Err(Unavailable)` with a reason a user can act
//! on (`not present: the nvidia kernel module is not loaded ...`, `not readable: Permission
//! denied (os error 13)`, `malformed: ...`). Text parsers are small pure functions (`parse_*`)
//! tested on realistic text.
//!
//! One module per group of sources: [`driver`] (version, parameters, GPUs), [`modules`]
//! (`/proc/modules`, `/proc/devices`), [`dev_nodes`] (`/dev/nvidia*`), [`container`]
//! (cgroups, runtime markers), [`kernel`] (release, config, command line, `/proc/iomem`),
//! [`smi`] (`nvidia-smi -q` and how it ended), [`kernel_log`], [`processes`] (daemons,
//! mapped libcuda), [`pci`] (NVIDIA GPUs on the PCI bus and their drivers), [`wsl`] (WSL2's
//! GPU interface and libraries).

pub mod container;
pub mod dev_nodes;
pub mod driver;
pub mod kernel;
pub mod kernel_log;
pub mod modules;
pub mod pci;
pub mod processes;
pub mod smi;
pub mod wsl;

use std::io;

use super::facts::{Evidence, Fact};
use super::input;
use super::root::Root;

/// Reads every source through `root` and returns the evidence. Never panics and never
/// fails; see the module documentation for how failures are reported.
///
/// Live ([`Root::Live`]) this also runs `nvidia-smi -q` (at most 10 s) and, where the root
/// allows it ([`Root::live`] without a host root), opens each `/dev/nvidia*` node once (see
/// [`Root::open_device`]).
pub fn collect(root: &Root) -> Evidence {
    let kernel = kernel::collect_kernel(root);
    let kernel_config =
        kernel::collect_kernel_config(root, kernel.get().map(|k| k.release.as_str()));
    let (dev_nodes, nvswitch_nodes) = dev_nodes::collect_dev_nodes(root);
    let (daemons, libcuda) = processes::collect_processes(root);
    let (smi, smi_outcome) = smi::collect_smi(root);
    Evidence {
        driver: driver::collect_driver(root),
        driver_params: driver::collect_driver_params(root),
        uvm_params: driver::collect_uvm_params(root),
        modules: modules::collect_modules(root),
        devices: modules::collect_devices(root),
        dev_nodes,
        nvswitch_nodes,
        container: container::collect_container(root),
        kernel,
        arch: kernel::collect_arch(root),
        kernel_config,
        cmdline: kernel::collect_cmdline(root),
        lockdown: kernel::collect_lockdown(root),
        secure_boot: kernel::collect_secure_boot(root),
        iomem_hmm: kernel::collect_iomem(root),
        smi,
        smi_outcome,
        gpus: driver::collect_gpus(root),
        kernel_log: kernel_log::collect_kernel_log(root),
        daemons,
        libcuda,
        pci_gpus: pci::collect_pci_gpus(root),
        wsl: wsl::collect_wsl(root),
    }
}

/// `Fact` helpers local to the collectors.
pub(super) trait FactExt<T> {
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
pub(super) fn read_fact<T>(res: io::Result<T>, source: &str, absent: Option<&str>) -> Fact<T> {
    match res {
        Ok(v) => Fact::ok(v, source),
        Err(err) => Fact::unavailable(why_unreadable(&err, absent), source),
    }
}

/// Why a read failed: `not present: <absent>` for a missing file when `absent` explains it,
/// `too large (N bytes, limit L)` or `malformed: the snapshot's <file>: ...` for an input
/// refused by its limit or a malformed snapshot file ([`input::verdict`]), else
/// `not readable: <error>`.
pub(super) fn why_unreadable(err: &io::Error, absent: Option<&str>) -> String {
    if let Some(verdict) = input::verdict(err) {
        return verdict;
    }
    match absent {
        Some(absent) if err.kind() == io::ErrorKind::NotFound => format!("not present: {absent}"),
        _ => format!("not readable: {err}"),
    }
}

/// Parses a fact's text, turning a parse error into `malformed: <why>`.
pub(super) fn parse_fact<T>(
    text: Fact<String>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Fact<T> {
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

#[cfg(test)]
mod tests {
    use super::driver::DRIVER_VERSION_PATH;
    use super::*;
    use crate::doctor::facts::MappedLibcuda;
    use crate::doctor::fixtures::snapshot_evidence;
    use std::path::Path;
    use uvmwatch_testbed::snapshot::*;

    fn why<T: std::fmt::Debug>(fact: &Fact<T>) -> String {
        fact.value.as_ref().unwrap_err().why.clone()
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
        let ev = snapshot_evidence(&spec);
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
        let ev = snapshot_evidence(&spec);
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
        let ev = snapshot_evidence(&spec);
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
            let ev = snapshot_evidence(&SnapshotSpec {
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

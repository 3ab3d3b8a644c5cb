//! The maps the programs read their settings from, written by user space: `CONFIG` (the
//! thresholds, struct offsets and the `sched` tracepoints' arguments from BTF, `nvidia-uvm`'s
//! major), `CMDS` (where each driver call's status sits at the running release's layout) and
//! `NAMED_CMDS` (the requests user space has names for).

use anyhow::{anyhow, Context, Result};
use aya::maps::{Array, HashMap, MapData};
use uvmwatch_common::{CmdInfo, CmdKey, Config};

use super::{btf, registry::Attach, Kernel, KernelSettings};
use crate::decode::layouts::Layout;

/// `nvidia-uvm`'s character major as `/proc/devices` lists it now (`None` while it is not
/// registered, or when the file cannot be read).
pub fn uvm_major() -> Option<u32> {
    let text = std::fs::read_to_string(crate::host::procfs::devices::DEVICES_PATH).ok()?;
    crate::host::procfs::devices::parse_devices(&text)
        .ok()?
        .get("nvidia-uvm")
        .copied()
}

/// The `CMDS` entries of `layout`: every command with a status, UVM by request number, RM by
/// [`uvmwatch_common::rm_cmd_key`] of its `_IOWR('F', nr, size)`.
fn status_entries(layout: &Layout) -> Vec<(CmdKey, CmdInfo)> {
    let uvm = layout.uvm().filter_map(|e| {
        let status_offset = e.status_offset?;
        let key = CmdKey { uvm: 1, cmd: e.cmd };
        Some((
            key,
            CmdInfo {
                status_offset,
                params_size: e.params_size,
            },
        ))
    });
    let rm = layout.rm().filter_map(|e| {
        let status_offset = e.status_offset?;
        let key = CmdKey {
            uvm: 0,
            cmd: uvmwatch_common::rm_cmd_key(e.request()),
        };
        Some((
            key,
            CmdInfo {
                status_offset,
                params_size: e.params_size,
            },
        ))
    });
    uvm.chain(rm).collect()
}

impl Kernel {
    /// Fills `NAMED_CMDS` with every request user space names (in any known driver), so the
    /// aggregates keep the others under one key ([`uvmwatch_common::UNKNOWN_CMD`]).
    pub(super) fn load_named_cmds(&mut self) -> Result<()> {
        let mut named: HashMap<&mut MapData, CmdKey, u8> =
            HashMap::try_from(self.bpf.map_mut("NAMED_CMDS").context("map NAMED_CMDS")?)?;
        for (uvm, cmd) in crate::decode::nvidia::named_requests() {
            let key = CmdKey {
                uvm: uvm as u32,
                cmd,
            };
            named
                .insert(key, 1, 0)
                .with_context(|| format!("NAMED_CMDS[{cmd:#x}]"))?;
        }
        Ok(())
    }

    /// Replaces the status locations in `CMDS` by `layout`'s: UVM commands by request
    /// number, RM escapes by `_IOC_NR` and `_IOC_SIZE` of each params form
    /// ([`uvmwatch_common::rm_cmd_key`]). Entries of the old layout that the new one lacks
    /// are removed, so a command gone from a driver reads no status.
    pub fn load_layout(&mut self, layout: &Layout) -> Result<()> {
        let mut cmds: HashMap<&mut MapData, CmdKey, CmdInfo> =
            HashMap::try_from(self.bpf.map_mut("CMDS").context("map CMDS")?)?;
        let entries = status_entries(layout);
        // New entries first, then the stale ones out: no command loses its status between.
        for (k, v) in &entries {
            cmds.insert(k, v, 0)?;
        }
        let stale: Vec<CmdKey> = cmds
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !entries.iter().any(|(e, _)| e == k))
            .collect();
        for k in stale {
            cmds.remove(&k)?;
        }
        tracing::debug!(layout = %layout, commit = layout.commit(), "ioctl status table loaded");
        Ok(())
    }

    /// Writes `CONFIG`; returns what the `sched` raw tracepoints need of the kernel's BTF
    /// (default where it cannot be read), for [`Kernel::fit_sched_probes`].
    pub(super) fn write_config(&mut self, s: &KernelSettings) -> Result<btf::SchedOffsets> {
        let btf = btf::running_kernel();
        let files = match btf
            .as_ref()
            .map_err(|e| anyhow!("{e:#}"))
            .and_then(btf::file_offsets)
        {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "no struct offsets from the kernel's BTF: successful device opens and driver calls cannot be identified (failed opens and cuInit still are)");
                Default::default()
            }
        };
        let sched = btf
            .as_ref()
            .map_err(|e| anyhow!("{e:#}"))
            .and_then(btf::sched_offsets);
        if let Err(e) = &sched {
            tracing::warn!(error = %format!("{e:#}"), "no task_struct.pid offset from the kernel's BTF: children of NVIDIA processes are not followed across fork");
        }
        let sched: btf::SchedOffsets = sched.unwrap_or_default();
        // Missing, these only keep the fentry backend off (`choose_backend` says why).
        let fentry = btf
            .as_ref()
            .ok()
            .and_then(|b| btf::fentry_offsets(b).ok())
            .unwrap_or_default();
        let functions: Vec<&'static str> = self
            .specs
            .iter()
            .filter_map(|s| match s.attach {
                Attach::Fentry { function, .. } => Some(function),
                _ => None,
            })
            .collect();
        self.trampoline_func_ids = btf
            .as_ref()
            .map(|b| b.func_ids(&functions))
            .unwrap_or_default();
        drop(btf);
        let cfg = Config {
            slow_ioctl_ns: s.slow_ioctl_ns,
            agent_tgid: std::process::id(),
            task_pid_off: sched.task_pid,
            ready: 1,
            failure_events_per_second: s.failure_events_per_second,
            uvm_major: uvm_major().unwrap_or(0),
            _pad: 0,
            files,
            fentry,
        };
        self.set_config(cfg)?;
        Ok(sched)
    }

    fn set_config(&mut self, cfg: Config) -> Result<()> {
        let mut a: Array<&mut MapData, Config> =
            Array::try_from(self.bpf.map_mut("CONFIG").context("map CONFIG")?)?;
        a.set(0, cfg, 0)?;
        self.config = cfg;
        Ok(())
    }

    /// Re-reads `nvidia-uvm`'s major from `/proc/devices` and hands it to the programs when
    /// it changed (a module reload may register another one). Returns the new major then.
    pub fn refresh_uvm_major(&mut self) -> Option<u32> {
        let major = uvm_major().unwrap_or(0);
        if major == self.config.uvm_major {
            return None;
        }
        let cfg = Config {
            uvm_major: major,
            ..self.config
        };
        match self.set_config(cfg) {
            Ok(()) => Some(major),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "writing nvidia-uvm's major to CONFIG");
                None
            }
        }
    }
}

//! Which ioctl layouts the kernel side reads statuses with: those of the running driver.
//!
//! The version comes from `--driver-version`, else from `/proc/driver/nvidia/version` below
//! `--host-root`, which is read again every second and whenever a process opens a device
//! node or enters `cuInit` while no version is known (a driver loaded on demand): a reload
//! that changes the version changes the layouts. With `--evidence-root`, the snapshot's
//! version file stands in only while this machine's cannot be read (the probes watch this
//! machine, so its driver decides). A version that is not a known release gets the nearest
//! known one, and no version at all the newest; each choice is reported once, as a
//! [`DriverLayout`] event, when it has been loaded.

use std::path::PathBuf;

use anyhow::Result;

use crate::{
    decode::layouts::{self, DriverVersion, Layout, Selection},
    event::DriverLayout,
    host::driver::{self, DriverInfo},
};

/// Where the driver's version comes from.
#[derive(Clone, Debug)]
pub enum DriverFrom {
    /// `--driver-version` (replays, tests, a host whose version file is not visible).
    Given(DriverVersion),
    /// `/proc/driver/nvidia/version` below a host root (this machine's `/` when `None`).
    Live { host_root: Option<PathBuf> },
    /// As [`DriverFrom::Live`], but the version file of the facts' snapshot
    /// (`--evidence-root`) while this machine's cannot be read.
    LiveElseSnapshot { host_root: Option<PathBuf> },
}

/// What one read of the version found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reading {
    version: Option<DriverVersion>,
    /// The version as the driver wrote it (`540.4.0`; [`DriverVersion`]'s display pads the
    /// patch to two digits, as NVIDIA's x86 releases write it).
    text: Option<String>,
    /// Where from, or why there is no version.
    source: String,
}

impl Reading {
    fn of(r: Result<DriverInfo, String>, source: String) -> Reading {
        match r {
            Ok(info) => match info.driver_version() {
                Ok(v) => Reading {
                    version: Some(v),
                    text: Some(info.version.clone()),
                    source,
                },
                Err(e) => Reading {
                    version: None,
                    text: None,
                    source: format!("{source}: {e}"),
                },
            },
            Err(why) => Reading {
                version: None,
                text: None,
                source: why,
            },
        }
    }
}

/// Follows the driver's version and says when the layouts change.
pub struct DriverWatch {
    from: DriverFrom,
    /// For [`DriverFrom::LiveElseSnapshot`]: the snapshot's version file as the facts read
    /// it.
    snapshot: Option<Result<DriverInfo, String>>,
    /// The reading whose layouts are loaded.
    loaded: Option<Reading>,
}

impl DriverWatch {
    /// A watch over `from`; `snapshot` is the snapshot's driver fact for
    /// [`DriverFrom::LiveElseSnapshot`] (ignored otherwise).
    pub fn new(from: DriverFrom, snapshot: Option<Result<DriverInfo, String>>) -> DriverWatch {
        DriverWatch {
            from,
            snapshot,
            loaded: None,
        }
    }

    fn read(&self) -> Reading {
        let live = |host_root: &Option<PathBuf>| {
            Reading::of(
                driver::read_version_file(host_root.as_deref()),
                driver::version_path(host_root.as_deref())
                    .display()
                    .to_string(),
            )
        };
        match &self.from {
            DriverFrom::Given(v) => Reading {
                version: Some(*v),
                text: Some(v.to_string()),
                source: "--driver-version".into(),
            },
            DriverFrom::Live { host_root } => live(host_root),
            DriverFrom::LiveElseSnapshot { host_root } => {
                let here = live(host_root);
                if here.version.is_some() {
                    return here;
                }
                let snap = Reading::of(
                    self.snapshot
                        .clone()
                        .unwrap_or_else(|| Err("no snapshot facts".into())),
                    format!("the snapshot's {} ({})", driver::VERSION_PATH, here.source),
                );
                if snap.version.is_some() {
                    snap
                } else {
                    here
                }
            }
        }
    }

    /// Whether the loaded layouts are those of a known driver version.
    pub fn knows_version(&self) -> bool {
        self.loaded.as_ref().is_some_and(|r| r.version.is_some())
    }

    /// The version of the driver whose layouts are loaded (`550.163.01`), when known.
    pub fn version(&self) -> Option<&str> {
        self.loaded
            .as_ref()
            .filter(|r| r.version.is_some())
            .and_then(|r| r.text.as_deref())
    }

    /// Reads the version again. On the first call, and whenever the reading differs from the
    /// one whose layouts are loaded, hands the new layouts to `load`; when that succeeds,
    /// returns the event that says so. A failed load is returned as the error, and the next
    /// call tries again.
    pub fn check(
        &mut self,
        load: impl FnOnce(&Layout) -> Result<()>,
    ) -> Result<Option<DriverLayout>> {
        let now = self.read();
        if self.loaded.as_ref() == Some(&now) {
            return Ok(None);
        }
        let layout = layouts::layout_for(now.version.as_ref());
        load(&layout)?;
        let ev = DriverLayout {
            driver: now.text.clone(),
            source: now.source.clone(),
            layout: layout.tag().to_string(),
            selection: selection_label(layout.selection()),
        };
        self.loaded = Some(now);
        Ok(Some(ev))
    }
}

/// The label of a [`Selection`] (`uvmwatch_ioctl_layout_info{selection}`, the log).
pub fn selection_label(s: Selection) -> &'static str {
    match s {
        Selection::Exact => "exact",
        Selection::Nearest => "nearest",
        Selection::Newest => "newest",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_version(root: &std::path::Path, version: &str) {
        let dir = root.join("proc/driver/nvidia");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("version"),
            format!("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\n"),
        )
        .unwrap();
    }

    fn live(root: &std::path::Path) -> DriverWatch {
        DriverWatch::new(
            DriverFrom::Live {
                host_root: Some(root.to_path_buf()),
            },
            None,
        )
    }

    /// Checks, keeping the layout that was loaded.
    fn check(w: &mut DriverWatch) -> Option<(Option<Layout>, DriverLayout)> {
        let mut got = None;
        let ev = w
            .check(|l| {
                got = Some(l.clone());
                Ok(())
            })
            .unwrap()?;
        Some((got, ev))
    }

    #[test]
    fn the_running_drivers_layouts_and_a_reload_that_changes_them() {
        let root = tempfile::tempdir().unwrap();
        let mut w = live(root.path());
        // No driver yet: the newest layouts, said once.
        let (_, ev) = check(&mut w).unwrap();
        assert_eq!((ev.driver.as_deref(), ev.selection), (None, "newest"));
        assert!(ev.source.contains("not loaded"), "{}", ev.source);
        assert!(!w.knows_version());
        assert!(check(&mut w).is_none());
        // The driver loads: its own layouts (UVM_FREE's status at 16 on 535).
        write_version(root.path(), "535.104.05");
        let (l, ev) = check(&mut w).unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.layout.as_str(), ev.selection),
            (Some("535.104.05"), "535.104.05", "exact")
        );
        assert_eq!(l.unwrap().uvm_entry(0x22).unwrap().status_offset, Some(16));
        assert!(w.knows_version());
        assert!(check(&mut w).is_none());
        // Reloaded as a release the table does not know: the nearest of its branch.
        write_version(root.path(), "590.99.01");
        let (l, ev) = check(&mut w).unwrap();
        assert_eq!((ev.layout.as_str(), ev.selection), ("590.48.01", "nearest"));
        assert_eq!(l.unwrap().uvm_entry(0x22).unwrap().status_offset, Some(8));
    }

    /// A load that fails is not taken for done: nothing is said, and the next check loads
    /// again.
    #[test]
    fn a_failed_load_is_tried_again() {
        let root = tempfile::tempdir().unwrap();
        write_version(root.path(), "580.95.05");
        let mut w = live(root.path());
        assert!(w.check(|_| Err(anyhow::anyhow!("map full"))).is_err());
        assert!(!w.knows_version());
        let (_, ev) = check(&mut w).expect("loaded on the next check");
        assert_eq!(ev.driver.as_deref(), Some("580.95.05"));
    }

    /// The version is said as the driver wrote it: Jetson's `540.4.0`, not `540.4.00`.
    #[test]
    fn the_version_is_said_as_the_file_writes_it() {
        let root = tempfile::tempdir().unwrap();
        write_version(root.path(), "540.4.0");
        let (_, ev) = check(&mut live(root.path())).unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.selection),
            (Some("540.4.0"), "nearest")
        );
    }

    #[test]
    fn a_given_version() {
        let v: DriverVersion = "550.54.14".parse().unwrap();
        let (_, ev) = check(&mut DriverWatch::new(DriverFrom::Given(v), None)).unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.source.as_str(), ev.selection),
            (Some("550.54.14"), "--driver-version", "exact")
        );
    }

    /// With `--evidence-root`, this machine's driver decides while its version file can be
    /// read; the snapshot's stands in only when it cannot.
    #[test]
    fn the_snapshots_version_only_while_this_machines_is_unknown() {
        let root = tempfile::tempdir().unwrap();
        let info = crate::host::driver::parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        );
        let mut w = DriverWatch::new(
            DriverFrom::LiveElseSnapshot {
                host_root: Some(root.path().to_path_buf()),
            },
            Some(info),
        );
        let (_, ev) = check(&mut w).unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.selection),
            (Some("535.183.01"), "exact")
        );
        assert!(ev.source.starts_with("the snapshot's"), "{}", ev.source);
        write_version(root.path(), "580.95.05");
        let (_, ev) = check(&mut w).unwrap();
        assert_eq!(ev.driver.as_deref(), Some("580.95.05"));
        assert!(
            ev.source.ends_with("proc/driver/nvidia/version"),
            "{}",
            ev.source
        );
        // Neither known: the newest.
        let mut w = DriverWatch::new(
            DriverFrom::LiveElseSnapshot {
                host_root: Some(tempfile::tempdir().unwrap().path().to_path_buf()),
            },
            Some(Err("absent".into())),
        );
        let (_, ev) = check(&mut w).unwrap();
        assert_eq!((ev.driver, ev.selection), (None, "newest"));
    }
}

//! Which ioctl layouts the kernel side reads statuses with: those of the running driver.
//!
//! The version comes from `--driver-version`, from the facts' snapshot (`--evidence-root`),
//! or from `/proc/driver/nvidia/version` below `--host-root`, which is read again every
//! second (a small procfs file): a driver reload that changes the version changes the
//! layouts. A version that is not a known release gets the nearest known one, and no
//! version at all (no driver loaded yet) the newest; each choice is reported once, as a
//! [`DriverLayout`] event, when it changes.

use std::path::PathBuf;

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
    /// The version file of the facts' snapshot (`--evidence-root`), read once with them.
    Snapshot,
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

/// Follows the driver's version and says when the layouts change.
pub struct DriverWatch {
    from: DriverFrom,
    /// For [`DriverFrom::Snapshot`]: the snapshot's version file as the facts read it.
    snapshot: Option<Result<DriverInfo, String>>,
    last: Option<Reading>,
}

impl DriverWatch {
    /// A watch over `from`; `snapshot` is the snapshot's driver fact for
    /// [`DriverFrom::Snapshot`] (ignored otherwise).
    pub fn new(from: DriverFrom, snapshot: Option<Result<DriverInfo, String>>) -> DriverWatch {
        DriverWatch {
            from,
            snapshot,
            last: None,
        }
    }

    fn read(&self) -> Reading {
        let parsed = |r: Result<DriverInfo, String>, source: String| match r {
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
        };
        match &self.from {
            DriverFrom::Given(v) => Reading {
                version: Some(*v),
                text: Some(v.to_string()),
                source: "--driver-version".into(),
            },
            DriverFrom::Live { host_root } => {
                let path = match host_root {
                    Some(r) => r.join(driver::VERSION_PATH.trim_start_matches('/')),
                    None => PathBuf::from(driver::VERSION_PATH),
                };
                parsed(
                    driver::read_version_file(host_root.as_deref()),
                    path.display().to_string(),
                )
            }
            DriverFrom::Snapshot => parsed(
                self.snapshot
                    .clone()
                    .unwrap_or_else(|| Err("no snapshot facts".into())),
                format!("snapshot {}", driver::VERSION_PATH),
            ),
        }
    }

    /// Reads the version again. The first call, and every call whose reading differs from
    /// the last, returns the layout to load and the event that says so.
    pub fn check(&mut self) -> Option<(Layout, DriverLayout)> {
        let now = self.read();
        if self.last.as_ref() == Some(&now) {
            return None;
        }
        let layout = layouts::layout_for(now.version.as_ref());
        let ev = DriverLayout {
            driver: now.text.clone(),
            source: now.source.clone(),
            layout: layout.tag().to_string(),
            selection: selection_label(layout.selection()),
        };
        self.last = Some(now);
        Some((layout, ev))
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

    #[test]
    fn the_running_drivers_layouts_and_a_reload_that_changes_them() {
        let root = tempfile::tempdir().unwrap();
        let mut w = DriverWatch::new(
            DriverFrom::Live {
                host_root: Some(root.path().to_path_buf()),
            },
            None,
        );
        // No driver yet: the newest layouts, said once.
        let (_, ev) = w.check().unwrap();
        assert_eq!((ev.driver.as_deref(), ev.selection), (None, "newest"));
        assert!(ev.source.contains("not loaded"), "{}", ev.source);
        assert!(w.check().is_none());
        // The driver loads: its own layouts (UVM_FREE's status at 16 on 535).
        write_version(root.path(), "535.104.05");
        let (l, ev) = w.check().unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.layout.as_str(), ev.selection),
            (Some("535.104.05"), "535.104.05", "exact")
        );
        assert_eq!(l.uvm_entry(0x22).unwrap().status_offset, Some(16));
        assert!(w.check().is_none());
        // Reloaded as a release the table does not know: the nearest of its branch.
        write_version(root.path(), "590.99.01");
        let (l, ev) = w.check().unwrap();
        assert_eq!((ev.layout.as_str(), ev.selection), ("590.48.01", "nearest"));
        assert_eq!(l.uvm_entry(0x22).unwrap().status_offset, Some(8));
    }

    /// The version is said as the driver wrote it: Jetson's `540.4.0`, not `540.4.00`.
    #[test]
    fn the_version_is_said_as_the_file_writes_it() {
        let root = tempfile::tempdir().unwrap();
        write_version(root.path(), "540.4.0");
        let mut w = DriverWatch::new(
            DriverFrom::Live {
                host_root: Some(root.path().to_path_buf()),
            },
            None,
        );
        let (_, ev) = w.check().unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.selection),
            (Some("540.4.0"), "nearest")
        );
    }

    #[test]
    fn a_given_version_and_a_snapshots() {
        let v: DriverVersion = "550.54.14".parse().unwrap();
        let (_, ev) = DriverWatch::new(DriverFrom::Given(v), None)
            .check()
            .unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.source.as_str(), ev.selection),
            (Some("550.54.14"), "--driver-version", "exact")
        );
        let info = crate::host::driver::parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        );
        let (_, ev) = DriverWatch::new(DriverFrom::Snapshot, Some(info))
            .check()
            .unwrap();
        assert_eq!(
            (ev.driver.as_deref(), ev.selection),
            (Some("535.183.01"), "exact")
        );
        let (_, ev) = DriverWatch::new(DriverFrom::Snapshot, Some(Err("absent".into())))
            .check()
            .unwrap();
        assert_eq!((ev.driver, ev.selection), (None, "newest"));
    }
}

//! The causes, as declarations: each says what it is, the symptoms it can produce (from
//! NVIDIA's source and documents), the signals it needs (one of them failing rules it out),
//! the signals that rule it out, those for it and against it, the cause that explains it
//! away, the host state that makes it a hazard before anything fails, its fix and the
//! command that tells it apart. One file a cause; [`CAUSES`] is the one list (the engine,
//! `docs/doctor.md`'s table and the runbooks follow it). A reader checks a cause by reading
//! its declaration: no cause holds decision logic of its own; the engine (`engine.rs`)
//! weighs them all the same way.

mod adapter_init_failure;
mod device_node_mismatch;
mod device_permission;
pub mod doc;
mod driver_hang;
mod fabric_not_ready;
mod fork_after_init;
mod hmm_setup_failure;
mod module_refused;
mod no_gpu;
mod node_or_module_missing;
mod policy_or_partition;
mod slow_init;
mod stale_after_suspend;
mod version_mismatch;
mod visible_devices;
mod wsl2;
mod wsl_linux_driver;

use serde::{Deserialize, Serialize};

use super::facts::{Evidence, Observations};
use super::finding::{FixStep, Severity, Where};
use super::signal::{container_kind, Sig, Signals};
use super::symptom::Fits;

pub use hmm_setup_failure::HMM_CONF;

/// How much a signal (or the symptom) weighs for or against a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weight {
    /// Consistent with the cause, not specific to it.
    Weak,
    /// Specific to the cause.
    Strong,
    /// The cause's own mark: seen, it settles the cause.
    Decisive,
}

impl Weight {
    /// Its points in the engine's score: one decisive signal outweighs two strong ones, one
    /// strong outweighs two weak.
    pub fn points(self) -> i32 {
        match self {
            Weight::Weak => 1,
            Weight::Strong => 3,
            Weight::Decisive => 9,
        }
    }

    /// Lower-case name, as the generated docs write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Weight::Weak => "weak",
            Weight::Strong => "strong",
            Weight::Decisive => "decisive",
        }
    }
}

/// A hazard: the host state that makes a cause likely before anything fails (all of
/// `when` hold), and how bad that is.
#[derive(Clone, Copy, Debug)]
pub struct Hazard {
    /// Signals that must all hold.
    pub when: &'static [Sig],
    /// The hazard's severity.
    pub severity: Severity,
}

/// What a fix step is given: the signals, and the facts and observations they were read
/// from (for the numbers a command needs: a major, a version, a pid).
pub struct Ctx<'a> {
    /// The signals.
    pub s: &'a Signals,
    /// The facts.
    pub e: &'a Evidence,
    /// The observations.
    pub o: &'a Observations,
}

impl Ctx<'_> {
    /// `s` holds.
    pub fn holds(&self, s: Sig) -> bool {
        self.s.holds(s)
    }

    /// " This runs inside a container (kind): do it on the host; a container cannot." for
    /// host-only steps, empty on the host.
    pub fn host_only(&self) -> String {
        match container_kind(self.e) {
            Some(kind) => format!(
                " This runs inside a container ({kind}): do it on the host; a container cannot."
            ),
            None => String::new(),
        }
    }

    /// The driver's version, or `fallback`.
    pub fn driver_version(&self, fallback: &str) -> String {
        self.e
            .driver
            .get()
            .map(|d| d.version.clone())
            .unwrap_or_else(|| fallback.to_string())
    }
}

/// A cause, declared.
pub struct Cause {
    /// Its id.
    pub id: CauseId,
    /// What it is, in one line.
    pub title: &'static str,
    /// What happens, and where that is written (NVIDIA's source, documents, Linux).
    pub doc: &'static str,
    /// The symptoms it can produce, each with how telling it is of this cause.
    pub produces: &'static [(Fits, Weight)],
    /// Signals it needs: one that fails rules it out; an unknown one makes it less sure.
    pub needs: &'static [Sig],
    /// Signals that rule it out when they hold.
    pub rules_out: &'static [Sig],
    /// Signals for it.
    pub supports: &'static [(Sig, Weight)],
    /// Signals against it.
    pub against: &'static [(Sig, Weight)],
    /// Causes that explain it away: when one of them has its decisive signal, this one is
    /// ruled out unless it has a decisive signal of its own (a missing GPU node on a host
    /// whose driver found no GPU).
    pub yields_to: &'static [CauseId],
    /// A generic cause names the class of a symptom, not a mechanism (a thread stuck in the
    /// driver): it stays a candidate on a strong fit with the symptom alone, and on equal
    /// score comes after a specific cause.
    pub generic: bool,
    /// The host states that make it a hazard before anything fails.
    pub hazards: &'static [Hazard],
    /// The one command whose output confirms it or rules it out.
    pub tell_apart: &'static str,
    /// Its fix.
    pub fix: fn(&Ctx) -> Vec<FixStep>,
}

/// Declares the cause ids, in the order of [`CAUSES`] (on equal score the engine keeps it:
/// the more specific cause of two first).
macro_rules! causes {
    ($($id:ident = $name:literal => $module:ident,)+) => {
        /// A cause's id; also its runbook's name (`docs/runbooks/<id>.md`). `Unexplained` is
        /// no cause: it names a symptom no cause explains.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum CauseId {
            $( #[doc = $name] $id, )+
            /// A symptom no cause explains.
            UnexplainedFailure,
        }

        /// Every cause, in order.
        pub const CAUSES: &[&Cause] = &[$( &$module::CAUSE, )+];

        impl CauseId {
            /// Its name: `hmm_setup_failure`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( CauseId::$id => $name, )+
                    CauseId::UnexplainedFailure => "unexplained_failure",
                }
            }

            /// The id of a name, when it is one.
            pub fn from_name(name: &str) -> Option<CauseId> {
                match name {
                    $( $name => Some(CauseId::$id), )+
                    "unexplained_failure" => Some(CauseId::UnexplainedFailure),
                    _ => None,
                }
            }
        }
    };
}

causes! {
    HmmSetupFailure = "hmm_setup_failure" => hmm_setup_failure,
    DriverHang = "driver_hang" => driver_hang,
    ModuleRefused = "module_refused" => module_refused,
    NoGpu = "no_gpu" => no_gpu,
    Wsl2 = "wsl2" => wsl2,
    WslLinuxDriver = "wsl_linux_driver" => wsl_linux_driver,
    DeviceNodeMismatch = "device_node_mismatch" => device_node_mismatch,
    NodeOrModuleMissing = "node_or_module_missing" => node_or_module_missing,
    DevicePermission = "device_permission" => device_permission,
    StaleAfterSuspend = "stale_after_suspend" => stale_after_suspend,
    FabricNotReady = "fabric_not_ready" => fabric_not_ready,
    VersionMismatch = "version_mismatch" => version_mismatch,
    SlowInit = "slow_init" => slow_init,
    AdapterInitFailure = "adapter_init_failure" => adapter_init_failure,
    ForkAfterInit = "fork_after_init" => fork_after_init,
    PolicyOrPartition = "policy_or_partition" => policy_or_partition,
    VisibleDevices = "visible_devices" => visible_devices,
}

impl std::fmt::Display for CauseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for CauseId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl CauseId {
    /// Its declaration (`None` for [`CauseId::UnexplainedFailure`]).
    pub fn cause(self) -> Option<&'static Cause> {
        CAUSES.iter().copied().find(|c| c.id == self)
    }

    /// Its runbook: `docs/runbooks/<id>.md`.
    pub fn runbook(self) -> String {
        format!("docs/runbooks/{}.md", self.as_str())
    }
}

/// A fix step.
pub fn step(where_: Where, note: impl Into<String>, commands: &[&str]) -> FixStep {
    FixStep {
        where_,
        commands: commands.iter().map(|c| c.to_string()).collect(),
        note: note.into(),
    }
}

#[cfg(test)]
mod tests;

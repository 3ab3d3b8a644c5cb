//! `uvmwatch doctor` and live diagnosis: why CUDA initialisation failed or hangs.
//!
//! [`collect`] reads evidence (live or from a snapshot, through [`root`]) into
//! [`facts::Evidence`]; [`rules`] turn evidence plus what the probes saw
//! ([`facts::Observations`]) into [`finding::Finding`]s (which render themselves on one line
//! for logs and exporters); [`observed`] says where the observations came from (`--probe`,
//! a snapshot's `observations.json`) and adds a finding for an observed failure no rule
//! explains; [`report`] renders them for `uvmwatch doctor`; [`input`] bounds every read
//! and quotes what was read; [`bundle`]
//! saves what was read so the diagnosis can be re-run elsewhere (`doctor --probe`, one real
//! `cuInit` under the observer, is `cmd/doctor.rs`). The unit tests share one set of
//! evidence and observation builders (`fixtures.rs`, test builds only).

pub mod bundle;
pub mod cause;
pub mod collect;
pub mod engine;
pub mod facts;
pub mod finding;
#[cfg(test)]
mod fixtures;
pub mod input;
pub mod observed;
pub mod report;
pub mod root;
pub mod signal;
pub mod symptom;
pub mod verdict;

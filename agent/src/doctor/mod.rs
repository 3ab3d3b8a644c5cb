//! `uvmwatch doctor` and live diagnosis: why CUDA initialisation failed or hangs.
//!
//! [`collect`] reads evidence (live or from a snapshot, through [`root`]) into
//! [`facts::Evidence`]; [`rules`] turn evidence plus what the probes saw
//! ([`facts::Observations`]) into [`finding::Finding`]s; [`report`] renders them; [`bundle`]
//! saves what was read so the diagnosis can be re-run elsewhere; [`probe`] runs one real
//! `cuInit` under the probes (`doctor --probe`).

pub mod bundle;
pub mod collect;
pub mod facts;
pub mod finding;
pub mod report;
pub mod root;
pub mod rules;

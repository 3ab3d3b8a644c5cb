//! uvmwatch agent library: probes, event decoding, stall detection, metrics.
//!
//! The data path reads top to bottom: [`kernel`] loads and attaches the eBPF programs
//! (listed in [`probes`]); [`events`] decodes what they send; [`agent`] keeps per-call state,
//! finds stalls with [`stall`] and enriches them from [`procfs`]; [`discovery`] finds every
//! libcuda to probe; [`metrics`] and [`http`] export the result.

pub mod agent;
pub mod annotate;
pub mod capture;
pub mod config;
pub mod discovery;
pub mod doctor;
pub mod events;
pub mod http;
pub mod kallsyms;
pub mod kernel;
pub mod metrics;
pub mod nvidia;
pub mod otlp;
pub mod probes;
pub mod procfs;
pub mod sink;
pub mod stall;
pub mod tracefs;
pub mod workload;

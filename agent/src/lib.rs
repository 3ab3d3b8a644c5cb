//! uvmwatch agent library: probes, event decoding, stall detection, diagnosis, exports.
//!
//! The modules read as the data path: [`kernel`] loads and attaches the eBPF programs;
//! [`decode`] turns their records into typed records with names; [`host`] reads procfs,
//! finds libcuda and identifies workloads; [`observer`] keeps per-call state, finds stalls
//! and diagnoses them with [`doctor`]; [`event`] is what it hands on; [`export`] turns that
//! into logs, metrics, traces and capture files; [`cmd`] holds the commands.

pub mod clock;
pub mod cmd;
pub mod decode;
pub mod doctor;
pub mod event;
pub mod export;
pub mod host;
pub mod kernel;
pub mod observer;

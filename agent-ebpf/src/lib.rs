//! Empty host-side library so the agent's build script can depend on this crate (which makes
//! cargo rebuild the agent when the kernel programs change). The programs are built from
//! `main.rs` and its modules (`probes/`, `maps.rs`, `helpers.rs`).
#![no_std]

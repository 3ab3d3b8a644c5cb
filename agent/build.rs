//! Builds the kernel programs (`agent-ebpf`) for `bpfel-unknown-none` with the pinned nightly
//! toolchain and bpf-linker, and leaves the object in `OUT_DIR/uvmwatch-ebpf` for
//! `include_bytes_aligned!` in `src/kernel/mod.rs`.

/// Nightly used for the eBPF crate (needs `rust-src`: aya-build builds `core` with
/// `-Z build-std=core`; the same pin as `NIGHTLY` in `xtask/src/setup.rs`).
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("agent-ebpf");
    let root = root.canonicalize()?;
    let root = root
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "uvmwatch-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )
}

//! Fails early, with a clear message, when bpf-linker (needed to link BPF objects) is missing.
fn main() {
    // Only the bpfel/bpfeb build links with bpf-linker; the host build of this crate's
    // (empty) library needs nothing.
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.starts_with("bpf") {
        return;
    }
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => panic!("bpf-linker not found ({e}); run `cargo xtask setup`"),
    }
}

//! `uvmwatch`: an eBPF agent that watches how CUDA starts. The command line is
//! [`uvmwatch::cmd`]; the logic lives in the library.

fn main() -> std::process::ExitCode {
    uvmwatch::cmd::main()
}

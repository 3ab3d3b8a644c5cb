//! What the agent reads about the host and its processes: the capabilities it holds
//! ([`caps`]), the NVIDIA driver's version ([`driver`]), procfs ([`procfs`]: processes,
//! threads, cgroups, NVIDIA fds, mapped files), host files, below a root as a process with that
//! `/` sees them and bounded ([`files`]), the libcuda files to probe ([`discovery`]), which
//! inference workload a process is ([`workload`]) and the identity every event carries
//! ([`identity`]).

pub mod caps;
pub mod discovery;
pub mod driver;
pub mod files;
pub mod identity;
pub mod procfs;
pub mod workload;

//! What the agent reads about the host and its processes: the capabilities it holds
//! ([`caps`]), the NVIDIA driver's version ([`driver`]), procfs ([`procfs`]: processes,
//! threads, cgroups, NVIDIA fds, mapped files), files inside a process's root resolved as
//! that process sees them ([`in_root`]), the libcuda files to probe ([`discovery`]), which
//! inference workload a process is ([`workload`]) and the identity every event carries
//! ([`identity`]).

pub mod caps;
pub mod discovery;
pub mod driver;
pub mod identity;
pub mod in_root;
pub mod procfs;
pub mod workload;

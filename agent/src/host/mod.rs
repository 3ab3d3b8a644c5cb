//! What the agent reads about the host and its processes: procfs ([`procfs`]), the libcuda
//! files to probe ([`discovery`]) and which inference workload a process is ([`workload`]).

pub mod discovery;
pub mod procfs;
pub mod workload;

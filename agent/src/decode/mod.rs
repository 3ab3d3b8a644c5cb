//! Decoding what the kernel programs send, and the names of what they saw: ioctl requests,
//! `NV_STATUS` and `CUresult` codes ([`nvidia`]), errno
//! values ([`errno`]), ring-buffer records ([`record`]).

pub mod errno;
pub mod nvidia;
pub mod record;

//! Decoding what the kernel programs send, and the names of what they saw: ioctl requests,
//! `NV_STATUS` and `CUresult` codes ([`nvidia`]), ring-buffer records ([`record`]).

pub mod nvidia;
pub mod record;

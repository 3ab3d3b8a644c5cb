//! Decoding what the kernel programs send, and the names of what they saw: ioctl requests,
//! `NV_STATUS` and `CUresult` codes ([`nvidia`]), errno
//! values ([`errno`]), ring-buffer records ([`record`]); where each driver version keeps a
//! call's status ([`layouts`]); how a value read from the host is shown ([`text`]).

pub mod errno;
pub mod layouts;
pub mod nvidia;
pub mod record;
pub mod text;

//! Linux errno names: every code of the C library's `errno.h` (through `nix`, which keeps
//! Linux's list), and the kernel-internal codes that a syscall exit tracepoint can still see
//! before the kernel turns them into a restart or `EINTR` (`include/linux/errno.h`: a
//! signal interrupting a driver call shows as `-ERESTARTSYS`).

use std::{collections::BTreeMap, sync::OnceLock};

/// Kernel-internal codes, `include/linux/errno.h` ("should never be seen by user programs";
/// a tracepoint on the syscall's exit runs before that rewriting).
const KERNEL_INTERNAL: &[(i32, &str)] = &[
    (512, "ERESTARTSYS"),
    (513, "ERESTARTNOINTR"),
    (514, "ERESTARTNOHAND"),
    (515, "ENOIOCTLCMD"),
    (516, "ERESTART_RESTARTBLOCK"),
];

/// Highest errno value the kernel returns (`MAX_ERRNO`, `include/linux/err.h`).
const MAX_ERRNO: i32 = 4095;

fn names() -> &'static BTreeMap<i32, String> {
    static NAMES: OnceLock<BTreeMap<i32, String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut m: BTreeMap<i32, String> = (1..=MAX_ERRNO)
            .map(nix::errno::Errno::from_raw)
            .filter(|e| *e != nix::errno::Errno::UnknownErrno)
            .map(|e| (e as i32, format!("{e:?}")))
            .collect();
        for (n, name) in KERNEL_INTERNAL {
            m.entry(*n).or_insert_with(|| name.to_string());
        }
        m
    })
}

/// The symbolic name of an errno value (`EPERM` for 1), or `None` for a value Linux does
/// not define.
pub fn name(errno: i32) -> Option<&'static str> {
    names().get(&errno).map(String::as_str)
}

/// The name as a label: the symbolic name, or `E<n>` for an unknown value (so label values
/// stay bounded and recognisable).
pub fn label(errno: u32) -> String {
    match i32::try_from(errno).ok().and_then(name) {
        Some(n) => n.to_string(),
        None => format!("E{errno}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_codes_nvidia_nodes_return() {
        assert_eq!(name(libc::EPERM), Some("EPERM"));
        assert_eq!(name(libc::ENOENT), Some("ENOENT"));
        assert_eq!(name(libc::ENXIO), Some("ENXIO"));
        assert_eq!(name(libc::EAGAIN), Some("EAGAIN"));
        assert_eq!(name(libc::ENOTTY), Some("ENOTTY"));
        assert_eq!(name(libc::ENOSYS), Some("ENOSYS"));
        assert_eq!(name(libc::ERANGE), Some("ERANGE"));
        assert_eq!(name(libc::EOPNOTSUPP), Some("EOPNOTSUPP"));
        assert_eq!(name(libc::ETIMEDOUT), Some("ETIMEDOUT"));
        assert_eq!(name(512), Some("ERESTARTSYS"));
        assert_eq!(name(0), None);
        assert_eq!(name(4095), None);
        assert_eq!(label(1), "EPERM");
        assert_eq!(label(2), "ENOENT");
        assert_eq!(label(4095), "E4095");
        assert_eq!(label(u32::MAX), "E4294967295");
    }
}

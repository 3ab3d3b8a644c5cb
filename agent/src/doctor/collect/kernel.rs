//! The running kernel: release, configuration, command line and the HMM regions of
//! `/proc/iomem`.

use std::collections::BTreeMap;
use std::io;

use super::super::facts::{Fact, KernelInfo};
use super::super::input::{self, quote};
use super::super::root::Root;
use super::{parse_fact, read_fact, FactExt};

/// `/proc/sys/kernel/osrelease` (`uname -r`).
pub const OSRELEASE_PATH: &str = "/proc/sys/kernel/osrelease";

/// `/proc/sys/kernel/arch` (`uname -m`).
pub const ARCH_PATH: &str = "/proc/sys/kernel/arch";

/// The kernel's lockdown level (securityfs).
pub const LOCKDOWN_PATH: &str = "/sys/kernel/security/lockdown";

/// UEFI's `SecureBoot` variable (EFI global variable GUID).
pub const SECURE_BOOT_PATH: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// `/proc/config.gz` (`CONFIG_IKCONFIG_PROC`).
pub const CONFIG_GZ_PATH: &str = "/proc/config.gz";

/// `/proc/cmdline`.
pub const CMDLINE_PATH: &str = "/proc/cmdline";

/// `/proc/iomem`.
pub const IOMEM_PATH: &str = "/proc/iomem";

/// Resource name nvidia_uvm gives `request_free_mem_region()` for HMM device memory
/// (`kernel-open/nvidia-uvm/uvm_pmm_gpu.c`); present in `/proc/iomem` once HMM set-up worked.
pub const UVM_HMM_RESOURCE: &str = "nvidia-uvm-hmm";

/// The only kernel configuration options kept ([`Evidence::kernel_config`](super::super::facts::Evidence::kernel_config)).
pub const KERNEL_CONFIG_KEYS: [&str; 6] = [
    "CONFIG_HMM_MIRROR",
    "CONFIG_DEVICE_PRIVATE",
    "CONFIG_RANDOMIZE_BASE",
    "CONFIG_RANDOMIZE_MEMORY",
    "CONFIG_KPROBES",
    "CONFIG_ZONE_DEVICE",
];

/// The kernel's configuration as [`collect_kernel_config`] reads it, for the running
/// release (the probe registry's reasons, `agent/src/kernel/`).
pub fn kernel_config_of(root: &Root) -> Fact<BTreeMap<String, String>> {
    let kernel = collect_kernel(root);
    collect_kernel_config(root, kernel.get().map(|k| k.release.as_str()))
}

/// `/proc/sys/kernel/osrelease` ([`parse_kernel_release`]).
pub(super) fn collect_kernel(root: &Root) -> Fact<KernelInfo> {
    let text = read_fact(root.read_to_string(OSRELEASE_PATH), OSRELEASE_PATH, None);
    parse_fact(text, parse_kernel_release)
}

/// The machine's architecture, [`ARCH_PATH`] (`x86_64`, `aarch64`), trimmed; a kernel
/// before it existed leaves it unknown.
pub(super) fn collect_arch(root: &Root) -> Fact<String> {
    let text = read_fact(
        root.read_to_string(ARCH_PATH),
        ARCH_PATH,
        Some("this kernel has no kernel.arch sysctl"),
    );
    parse_fact(text, |t| {
        let a = t.trim();
        if a.is_empty() || !a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            Err(format!("not an architecture name: {}", quote(a)))
        } else {
            Ok(a.to_string())
        }
    })
}

/// The lockdown level: the bracketed word of [`LOCKDOWN_PATH`] (`none [integrity]
/// confidentiality`).
pub(super) fn collect_lockdown(root: &Root) -> Fact<String> {
    let text = read_fact(
        root.read_to_string(LOCKDOWN_PATH),
        LOCKDOWN_PATH,
        Some("no lockdown LSM, or securityfs not mounted"),
    );
    parse_fact(text, |t| {
        t.split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
            .map(str::to_string)
            .ok_or_else(|| format!("no bracketed level in {}", quote(t.trim())))
    })
}

/// Secure Boot: the fifth byte of [`SECURE_BOOT_PATH`] (the first four are the variable's
/// attributes), 1 when on.
pub(super) fn collect_secure_boot(root: &Root) -> Fact<bool> {
    match root.read_bytes(SECURE_BOOT_PATH) {
        Ok(b) if b.len() >= 5 => Fact::ok(b[4] == 1, SECURE_BOOT_PATH),
        Ok(b) => Fact::unavailable(
            format!("malformed: {} bytes, 5 expected", b.len()),
            SECURE_BOOT_PATH,
        ),
        Err(err) => Fact::unavailable(
            super::why_unreadable(
                &err,
                Some("no EFI variables (booted without UEFI, or efivarfs not mounted)"),
            ),
            SECURE_BOOT_PATH,
        ),
    }
}

/// The [`KERNEL_CONFIG_KEYS`] from `/proc/config.gz`, else `/boot/config-<release>`; when
/// neither can be read, both reasons.
pub(super) fn collect_kernel_config(
    root: &Root,
    release: Option<&str>,
) -> Fact<BTreeMap<String, String>> {
    let gz_err = match root.read_bytes(CONFIG_GZ_PATH) {
        Ok(bytes) => match gunzip(&bytes) {
            Ok(text) => return Fact::ok(parse_kernel_config(&text), CONFIG_GZ_PATH),
            Err(err) => Err(match input::verdict(&err) {
                Some(verdict) => format!("{CONFIG_GZ_PATH}: {verdict}"),
                None => format!("{CONFIG_GZ_PATH}: malformed: {err}"),
            }),
        },
        Err(err) => Ok(err),
    };
    let Some(release) = release else {
        let gz = match &gz_err {
            Ok(err) => format!("{CONFIG_GZ_PATH}: {err}"),
            Err(text) => text.clone(),
        };
        return Fact::unavailable(
            format!("not readable: {gz}; the kernel release is unknown, so /boot/config-<release> was not tried"),
            CONFIG_GZ_PATH,
        );
    };
    let boot = format!("/boot/config-{release}");
    match root.read_to_string(&boot) {
        Ok(text) => Fact::ok(parse_kernel_config(&text), boot),
        Err(boot_err) => {
            let source = format!("{CONFIG_GZ_PATH}, {boot}");
            let why = match &gz_err {
                Ok(gz)
                    if gz.kind() == io::ErrorKind::NotFound
                        && boot_err.kind() == io::ErrorKind::NotFound =>
                {
                    format!("not present: the kernel has no {CONFIG_GZ_PATH} (CONFIG_IKCONFIG_PROC) and {boot} is missing")
                }
                Ok(gz) => format!("not readable: {CONFIG_GZ_PATH}: {gz}; {boot}: {boot_err}"),
                Err(gz) => format!("not readable: {gz}; {boot}: {boot_err}"),
            };
            Fact::unavailable(why, source)
        }
    }
}

/// `/proc/config.gz` decompressed, at most [`KERNEL_CONFIG_LIMIT`].
fn gunzip(bytes: &[u8]) -> io::Result<String> {
    let read = input::read_stream_limited(
        flate2::read::MultiGzDecoder::new(bytes),
        input::KERNEL_CONFIG_LIMIT,
    )?;
    String::from_utf8(read.bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `/proc/cmdline`, without its trailing newline or NUL.
pub(super) fn collect_cmdline(root: &Root) -> Fact<String> {
    read_fact(root.read_to_string(CMDLINE_PATH), CMDLINE_PATH, None)
        .map_ok(|t| t.trim_end_matches(['\n', '\0']).to_string())
}

/// The `/proc/iomem` lines naming [`UVM_HMM_RESOURCE`] (the only ones a recorder keeps).
pub(super) fn collect_iomem(root: &Root) -> Fact<Vec<String>> {
    let keep = |line: &[u8]| {
        String::from_utf8_lossy(line)
            .contains(UVM_HMM_RESOURCE)
            .then(|| line.to_vec())
    };
    read_fact(
        root.read_filtered(IOMEM_PATH, b'\n', &keep),
        IOMEM_PATH,
        None,
    )
    .map_ok(|b| {
        String::from_utf8_lossy(&b)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    })
}

/// Parses a kernel release (`/proc/sys/kernel/osrelease`, e.g. `6.8.0-45-generic`): the
/// `(major, minor)` are the leading digits of its first two dot-separated parts.
///
/// Errors: empty, or no `major.minor` at the start.
pub fn parse_kernel_release(text: &str) -> Result<KernelInfo, String> {
    let release = text.trim();
    let mut parts = release.split('.');
    let leading = |s: Option<&str>| -> Option<u32> {
        let s = s?;
        let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    };
    match (leading(parts.next()), leading(parts.next())) {
        (Some(major), Some(minor)) => Ok(KernelInfo {
            release: release.to_string(),
            version: (major, minor),
        }),
        _ => Err(format!("no major.minor version in {}", quote(release))),
    }
}

/// The [`KERNEL_CONFIG_KEYS`] options of a kernel `.config`: `CONFIG_X=y` gives `y` (quotes
/// removed from string values), `# CONFIG_X is not set` gives `n`. Options absent from the
/// text are absent from the map.
pub fn parse_kernel_config(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(key) = line
            .strip_prefix("# ")
            .and_then(|r| r.strip_suffix(" is not set"))
        {
            if KERNEL_CONFIG_KEYS.contains(&key) {
                out.insert(key.to_string(), "n".to_string());
            }
        } else if let Some((key, value)) = line.split_once('=') {
            if KERNEL_CONFIG_KEYS.contains(&key) {
                out.insert(key.to_string(), value.trim_matches('"').to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_release_and_config() {
        assert_eq!(
            parse_kernel_release("6.8.0-45-generic\n").unwrap(),
            KernelInfo {
                release: "6.8.0-45-generic".into(),
                version: (6, 8)
            }
        );
        assert_eq!(
            parse_kernel_release("6.18.44-fc-v657").unwrap().version,
            (6, 18)
        );
        assert_eq!(parse_kernel_release("6.10-rc3").unwrap().version, (6, 10));
        assert!(parse_kernel_release("").is_err());
        assert!(parse_kernel_release("linux").is_err());

        let cfg = parse_kernel_config(
            "CONFIG_HMM_MIRROR=y\n# CONFIG_DEVICE_PRIVATE is not set\nCONFIG_RANDOMIZE_BASE=y\nCONFIG_64BIT=y\n# CONFIG_KPROBES is not set\nCONFIG_ZONE_DEVICE=\"y\"\n",
        );
        assert_eq!(cfg["CONFIG_HMM_MIRROR"], "y");
        assert_eq!(cfg["CONFIG_DEVICE_PRIVATE"], "n");
        assert_eq!(cfg["CONFIG_KPROBES"], "n");
        assert_eq!(cfg["CONFIG_ZONE_DEVICE"], "y");
        assert!(!cfg.contains_key("CONFIG_64BIT"));
        assert!(!cfg.contains_key("CONFIG_RANDOMIZE_MEMORY"));
    }
}

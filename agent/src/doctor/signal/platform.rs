//! Signals of the platform: the architecture, WSL2 (NVIDIA, "CUDA on WSL User Guide": the
//! GPU is the Windows driver's, shared through `/dev/dxg`, with the `libcuda.so*` the Windows
//! driver mounts in `/usr/lib/wsl/lib`; "users must not install any NVIDIA GPU Linux driver
//! within WSL 2"), and the libcuda a process mapped against the kernel module (CUDA
//! Compatibility guide: forward compatibility is for data-center GPUs, with a driver older
//! than the compat library).

use super::super::collect::wsl::{WSL_DIR, WSL_LIB};
use super::super::facts::{Evidence, MappedLibcuda};
use super::{hmm, Input, Reading, Source};

/// Whether this is WSL2, and what says so.
fn wsl_why(e: &Evidence) -> Option<(String, String)> {
    if let Some(w) = e.wsl.get() {
        if w.dxg {
            return Some(("/dev/dxg present".into(), e.wsl.source.clone()));
        }
        if !w.libcuda.is_empty() {
            return Some((
                format!("{} in {WSL_LIB}", w.libcuda.join(", ")),
                e.wsl.source.clone(),
            ));
        }
    }
    e.kernel
        .get()
        .filter(|k| k.release.contains("microsoft-standard-WSL2"))
        .map(|k| (k.release.clone(), e.kernel.source.clone()))
}

/// WSL2, as [`wsl_why`] tells it.
pub fn is_wsl(e: &Evidence) -> bool {
    wsl_why(e).is_some()
}

pub(super) fn wsl(i: &Input) -> Reading {
    let e = i.e;
    match wsl_why(e) {
        Some((why, src)) => Reading::holds(why, Source::host(src)),
        None if e.kernel.get().is_some() || e.wsl.get().is_some() => {
            Reading::fails("not WSL2", Source::host(&e.kernel.source))
        }
        None => Reading::of_unread(&e.kernel),
    }
}

/// A reading that applies only on WSL2: fails elsewhere.
fn on_wsl(i: &Input, read: impl FnOnce(&Evidence) -> Reading) -> Reading {
    if is_wsl(i.e) {
        read(i.e)
    } else {
        Reading::fails("not WSL2", Source::host(&i.e.wsl.source))
    }
}

pub(super) fn dxg_absent(i: &Input) -> Reading {
    on_wsl(i, |e| match e.wsl.get() {
        Some(w) => Reading::either(
            !w.dxg,
            "/dev/dxg absent",
            "/dev/dxg present",
            Source::host(&e.wsl.source),
        ),
        None => Reading::of_unread(&e.wsl),
    })
}

pub(super) fn wsl_libcuda_absent(i: &Input) -> Reading {
    on_wsl(i, |e| match e.wsl.get() {
        Some(w) => Reading::either(
            w.libcuda.is_empty(),
            format!("no libcuda* in {WSL_LIB}"),
            w.libcuda.join(", "),
            Source::host(&e.wsl.source),
        ),
        None => Reading::of_unread(&e.wsl),
    })
}

pub(super) fn linux_libcuda_mapped(i: &Input) -> Reading {
    on_wsl(i, |e| match e.libcuda.get() {
        Some(l) => {
            let linux: Vec<String> = l
                .iter()
                // WSL's loader in /usr/lib/wsl/lib loads the Windows driver's own libcuda
                // from its driver store, /usr/lib/wsl/drivers/<inf>/ (CUDA on WSL User
                // Guide): both are WSL's.
                .filter(|m| !std::path::Path::new(&m.path).starts_with(WSL_DIR))
                .map(|m| format!("{} (pid {})", m.path, m.pid))
                .collect();
            Reading::either(
                !linux.is_empty(),
                linux.join(", "),
                "only WSL's libcuda mapped (or none)",
                Source::host(&e.libcuda.source),
            )
        }
        None => Reading::of_unread(&e.libcuda),
    })
}

pub(super) fn linux_libcuda_installed(i: &Input) -> Reading {
    on_wsl(i, |e| match e.wsl.get() {
        Some(w) => Reading::either(
            !w.linux_libcuda.is_empty(),
            w.linux_libcuda.join(", "),
            "no Linux driver's libcuda installed",
            Source::host(&e.wsl.source),
        ),
        None => Reading::of_unread(&e.wsl),
    })
}

pub(super) fn x86_64(i: &Input) -> Reading {
    match hmm::arch(i.e) {
        Some((a, src)) => Reading::either(a == "x86_64", a.clone(), a, Source::host(src)),
        None => Reading::of_unread(&i.e.arch),
    }
}

/// The libcuda the diagnosed process mapped (every process's for a plain `doctor`).
fn relevant<'a>(i: &'a Input) -> Option<Vec<&'a MappedLibcuda>> {
    let pid = i.o.pid;
    Some(
        i.e.libcuda
            .get()?
            .iter()
            .filter(|m| pid.is_none_or(|p| p == m.pid))
            .collect(),
    )
}

/// Splits `590.48.01` into numbers for comparison.
fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

fn lib(m: &MappedLibcuda) -> String {
    format!(
        "{} by {} (pid {}): {}",
        m.path,
        m.comm,
        m.pid,
        m.version.as_deref().unwrap_or("version unknown")
    )
}

pub(super) fn libcuda_differs(i: &Input) -> Reading {
    let e = i.e;
    let (Some(libs), Some(d)) = (relevant(i), e.driver.get()) else {
        return match e.driver.get() {
            None => Reading::of_unread(&e.driver),
            Some(_) => Reading::of_unread(&e.libcuda),
        };
    };
    let diff: Vec<String> = libs
        .iter()
        .filter(|m| !m.compat && m.version.as_deref().is_some_and(|v| v != d.version))
        .map(|m| lib(m))
        .collect();
    Reading::either(
        !diff.is_empty(),
        format!("{} (kernel module {})", diff.join("; "), d.version),
        format!("every mapped libcuda is {} (or none is)", d.version),
        Source::host(&e.libcuda.source),
    )
}

pub(super) fn compat(i: &Input) -> Reading {
    let e = i.e;
    match relevant(i) {
        Some(libs) => {
            let c: Vec<String> = libs.iter().filter(|m| m.compat).map(|m| lib(m)).collect();
            Reading::either(
                !c.is_empty(),
                c.join("; "),
                "no forward-compatibility libcuda mapped",
                Source::host(&e.libcuda.source),
            )
        }
        None => Reading::of_unread(&e.libcuda),
    }
}

pub(super) fn compat_unsupported(i: &Input) -> Reading {
    let e = i.e;
    let Some(libs) = relevant(i) else {
        return Reading::of_unread(&e.libcuda);
    };
    let geforce = e
        .smi
        .get()
        .is_some_and(|s| s.product_brand.iter().any(|b| b.contains("GeForce")));
    let drv = e.driver.get().map(|d| d.version.as_str());
    let bad: Vec<String> = libs
        .iter()
        .filter(|m| m.compat)
        .filter(|m| {
            geforce
                || matches!((m.version.as_deref(), drv),
                    (Some(v), Some(d)) if version_key(v) < version_key(d))
        })
        .map(|m| {
            if geforce {
                format!("{} on a GeForce GPU", lib(m))
            } else {
                format!("{} older than the driver", lib(m))
            }
        })
        .collect();
    Reading::either(
        !bad.is_empty(),
        bad.join("; "),
        "no forward-compatibility library where it cannot work",
        Source::host(&e.libcuda.source),
    )
}

//! The kernels: which Debian releases a series means, and their packages downloaded
//! (cached) and extracted under `target/vmtest/`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::*;

pub(super) fn apt_pkgnames(prefix: &str) -> Vec<String> {
    util::output("apt-cache", ["pkgnames", prefix])
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Package names already downloaded (offline use).
pub(super) fn cached_image_names(debs: &Path) -> Vec<String> {
    fs::read_dir(debs)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.strip_suffix(".deb")?;
                    Some(n.split('_').next()?.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn resolve_kernels(spec: &str, paths: &Paths) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut updated = false;
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let wanted: Vec<&Series> = match item {
            "all" => SERIES.iter().collect(),
            _ => SERIES.iter().filter(|s| s.name == item).collect(),
        };
        if wanted.is_empty() {
            if item.ends_with("-amd64") {
                out.push(item.to_string());
                continue;
            }
            bail!("unknown --kernel {item:?}: use 6.1, 6.12, all or a release like 6.1.0-57-amd64");
        }
        for s in wanted {
            let prefix = format!("linux-image-{}", s.prefix);
            let mut found = newest_in_series(s, &apt_pkgnames(&prefix));
            if found.is_none() && !updated {
                println!("vm-test: no {prefix}* in the apt lists; apt-get update");
                let _ = util::run_inherit(
                    Command::new("apt-get")
                        .arg("update")
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                );
                updated = true;
                found = newest_in_series(s, &apt_pkgnames(&prefix));
            }
            if found.is_none() {
                found = newest_in_series(s, &cached_image_names(&paths.debs));
            }
            match found {
                Some(r) => {
                    println!(
                        "vm-test: {} series: newest available is linux-image-{r}",
                        s.name
                    );
                    out.push(r);
                }
                None => bail!("no linux-image-{}N{} package found", s.prefix, s.suffix),
            }
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|r| seen.insert(r.clone()));
    Ok(out)
}

/// How `apt-get download` is run: with the machine's configuration (the kernels), or with a
/// private one (the NVIDIA packages, see `nvidia.rs`) given as `-o` options.
#[derive(Clone, Debug, Default)]
pub(super) struct Apt {
    /// `-o Name=value` pairs put before the command.
    pub(super) opts: Vec<String>,
}

impl Apt {
    /// `tool` (`apt-get`, `apt-cache`) with this configuration.
    pub(super) fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        for o in &self.opts {
            c.arg("-o").arg(o);
        }
        c
    }
}

/// The cached `.deb` of `pkg` (at `version` when given), downloading it when absent.
/// Returns the file and whether it was downloaded now. A download goes to a temporary
/// directory first and is moved into `debs` only when apt-get is done with it.
pub(super) fn fetch_deb(
    debs: &Path,
    pkg: &str,
    version: Option<&str>,
    apt: &Apt,
) -> Result<(PathBuf, bool)> {
    let matches = |p: &Path| -> bool {
        let n = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let mut parts = n.split('_');
        parts.next() == Some(pkg)
            && version.is_none_or(|v| parts.next() == Some(&v.replace(':', "%3a")))
            && n.ends_with(".deb")
    };
    let find = |dir: &Path| -> Option<PathBuf> {
        let mut hits: Vec<PathBuf> = fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_file() && matches(p))
            .collect();
        hits.sort();
        hits.pop()
    };
    if let Some(p) = find(debs) {
        return Ok((p, false));
    }
    let spec = match version {
        Some(v) => format!("{pkg}={v}"),
        None => pkg.to_string(),
    };
    println!("vm-test: apt-get download {spec}");
    let tmp = cache::temp_beside(&debs.join(format!(".download-{}", cache::component(pkg))))?;
    let r = util::run_inherit(
        apt.command("apt-get")
            .current_dir(&tmp)
            .args(["download", "-q", &spec]),
    );
    let got = find(&tmp);
    let out = match (r, got) {
        (Ok(()), Some(p)) => {
            let dst = debs.join(p.file_name().unwrap_or_default());
            fs::rename(&p, &dst).with_context(|| format!("move {} into the cache", p.display()))?;
            Ok((dst, true))
        }
        (Ok(()), None) => Err(anyhow::anyhow!(
            "apt-get download {spec} left no .deb in {}",
            tmp.display()
        )),
        (Err(e), _) => Err(e),
    };
    let _ = fs::remove_dir_all(&tmp);
    out
}

pub(super) fn deb_field(deb: &Path, field: &str) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .context("run dpkg-deb")?;
    if !out.status.success() {
        bail!("dpkg-deb -f {} {field} failed", deb.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(super) fn sh(script: &str) -> Result<()> {
    util::run_inherit(Command::new("sh").args(["-ec", script]))
}

pub(super) fn q(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The `.deb`s of one kernel: image, headers, common headers, kbuild.
pub(super) struct KernelDebs {
    pub(super) image: PathBuf,
    pub(super) headers: Vec<PathBuf>,
}

/// Fetches (cached) the kernel's packages; returns them and whether any was downloaded.
pub(super) fn fetch_kernel(paths: &Paths, release: &str) -> Result<(KernelDebs, bool)> {
    let apt = Apt::default();
    let mut downloaded = false;
    let (image, d) = fetch_deb(&paths.debs, &format!("linux-image-{release}"), None, &apt)?;
    downloaded |= d;
    let hdr_pkg = format!("linux-headers-{release}");
    let (hdr, d) = fetch_deb(&paths.debs, &hdr_pkg, None, &apt)?;
    downloaded |= d;
    let hdr_version = deb_field(&hdr, "Version")?;
    let mut headers = vec![hdr.clone()];
    for (name, version) in depends_entries(&deb_field(&hdr, "Depends")?) {
        let is_common = name.starts_with("linux-headers-") && name.ends_with("-common");
        if is_common || name.starts_with("linux-kbuild-") {
            let v = version.unwrap_or_else(|| hdr_version.clone());
            let (p, d) = fetch_deb(&paths.debs, &name, Some(&v), &apt)?;
            downloaded |= d;
            headers.push(p);
        }
    }
    if headers.len() < 3 {
        bail!("{hdr_pkg} does not name its -common headers and kbuild packages");
    }
    Ok((KernelDebs { image, headers }, downloaded))
}

/// Extracts vmlinuz and the headers (once); returns (vmlinuz, kbuild dir).
pub(super) fn extract_kernel(
    kdir: &Path,
    release: &str,
    debs: &KernelDebs,
    keep: bool,
) -> Result<(PathBuf, PathBuf)> {
    let vmlinuz = kdir.join("vmlinuz");
    let image_stamp = kdir.join("vmlinuz.from");
    let image_name = debs
        .image
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    if !vmlinuz.is_file() || fs::read_to_string(&image_stamp).ok().as_deref() != Some(&image_name) {
        let img = kdir.join("image");
        let _ = fs::remove_dir_all(&img);
        fs::create_dir_all(&img)?;
        sh(&format!(
            "dpkg-deb --fsys-tarfile {} | tar -xf - -C {} ./boot/vmlinuz-{release} ./boot/config-{release}",
            q(&debs.image),
            q(&img)
        ))?;
        fs::copy(img.join(format!("boot/vmlinuz-{release}")), &vmlinuz)?;
        fs::copy(
            img.join(format!("boot/config-{release}")),
            kdir.join("config"),
        )?;
        if !keep {
            fs::remove_dir_all(&img)?;
        }
        fs::write(&image_stamp, &image_name)?;
    }

    let hroot = kdir.join("headers");
    let kbuild = hroot.join(format!("usr/src/linux-headers-{release}"));
    let stamp = hroot.join(".extracted-from");
    let names: Vec<String> = debs
        .headers
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string()
        })
        .collect();
    if fs::read_to_string(&stamp).ok().as_deref() != Some(&names.join("\n")) {
        let _ = fs::remove_dir_all(&hroot);
        fs::create_dir_all(&hroot)?;
        for d in &debs.headers {
            util::run_inherit(Command::new("dpkg-deb").arg("-x").arg(d).arg(&hroot))?;
        }
        // The arch Makefile includes the common one by its absolute /usr/src path.
        let mk = kbuild.join("Makefile");
        let text = fs::read_to_string(&mk).with_context(|| format!("read {}", mk.display()))?;
        let fixed = text.replace(
            "include /usr/src/",
            &format!("include {}/usr/src/", hroot.display()),
        );
        fs::write(&mk, fixed)?;
        fs::write(&stamp, names.join("\n"))?;
    }
    Ok((vmlinuz, kbuild))
}

//! The `nvidia` series: NVIDIA's real open kernel modules and real `libcuda` (Debian's
//! packages) in a second VM per kernel.
//!
//! - The packages come from Debian's archive through a private apt configuration in the
//!   cache (`<cache>/vmtest/apt/`: its own `sources.list`, lists and package cache; the
//!   machine's `/etc/apt` is not touched), the release of each branch picked from
//!   `apt-cache madison` ([`pick_release`]), the `.deb`s kept in `<cache>/vmtest/debs/`.
//! - `nvidia-open-kernel-dkms`'s source is built against the kernel's extracted headers
//!   with the patches of `vmtest/nvidia/patches/` ([`PATCHES`]), once per (driver version,
//!   kernel, patches and build recipe): `<cache>/vmtest/nvidia/<key>/` ([`build_modules`]).
//! - `libcuda1`, `nvidia-smi` and `libnvidia-ml1` are extracted (never installed) under
//!   `target/vmtest/nvidia-<version>/`; the modules `nvidia.ko` depends on (`drm`) come
//!   from the kernel's own image package.
//! - The VM runs `vmtest/init/nvidia.sh`; the lines it prints with a known prefix
//!   (`strace| `, `smi| `, ...) are saved as files under `target/vmtest/<k>/nvidia/`
//!   ([`artifact_of`]).
//!
//! Over 800 lines, a sixth of them tests: download, build and image of the series depend
//! on one another's cache keys and paths, so the recipe is read in one place.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::*;

/// One NVIDIA driver branch this harness runs, and on which kernel series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NvidiaBranch {
    /// The release's first number (`535`); the newest release of it is taken.
    pub(super) branch: &'static str,
    /// Debian suites it is taken from (`apt-cache madison`'s `<suite>/<component>`).
    pub(super) suites: &'static [&'static str],
    /// The kernel series (`Series::name`) whose VM runs this branch's modules.
    pub(super) kernel_series: &'static str,
    /// The branch whose `libcuda` that VM carries too, at `/opt/nvidia-<branch>/` (a
    /// release mismatch: the library of one release on the modules of another).
    pub(super) other: &'static str,
}

/// Which release goes with which kernel. Debian ships NVIDIA's open modules in these two
/// branches only (bookworm: 535, trixie: 550; bookworm-security and -backports have only
/// the proprietary `nvidia-kernel-source`).
pub(super) const NVIDIA_BRANCHES: &[NvidiaBranch] = &[
    NvidiaBranch {
        branch: "535",
        suites: &["bookworm", "bookworm-updates", "bookworm-security"],
        kernel_series: "6.1",
        other: "550",
    },
    NvidiaBranch {
        branch: "550",
        suites: &["trixie"],
        kernel_series: "6.12",
        other: "535",
    },
];

/// The packages of one release: the module source, then the user-space parts. A release is
/// usable when all four exist at the same version.
pub(super) const NVIDIA_PACKAGES: [&str; 4] = [
    "nvidia-open-kernel-dkms",
    "libcuda1",
    "nvidia-smi",
    "libnvidia-ml1",
];

/// The private apt `sources.list` (contrib and non-free hold the NVIDIA packages).
pub(super) const SOURCES_LIST: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main contrib non-free
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie contrib non-free
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://security.debian.org/debian-security bookworm-security main contrib non-free
";

/// How long the private apt lists are used before `apt-get update` runs again.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The patches of `vmtest/nvidia/patches/`, in order, each with the condition under which
/// it applies: `(file in the kernel's -common headers, string it must contain)`, or always.
pub(super) const PATCHES: &[(&str, Option<(&str, &str)>)] = &[
    (
        "0001-pci_resize_resource-exclude_bars.patch",
        Some(("include/linux/pci.h", "exclude_bars")),
    ),
    ("0002-assume-nvswitch-parameter.patch", None),
];

/// The modules NVIDIA's tree builds that the VM does not need (display and peer memory).
const NV_EXCLUDE: &str = "nvidia-drm nvidia-modeset nvidia-peermem";

/// Part of the build key: change it when the recipe in [`build_modules`] changes.
const BUILD_RECIPE: &str = "make modules SYSSRC=<common> SYSOUT=<kbuild> \
NV_EXCLUDE_KERNEL_MODULES=nvidia-drm nvidia-modeset nvidia-peermem; strip --strip-debug nvidia.ko nvidia-uvm.ko; v1";

/// A release picked for a branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct NvidiaRelease {
    pub(super) branch: &'static str,
    /// Debian's version, e.g. `535.261.03-1`.
    pub(super) deb_version: String,
    /// NVIDIA's, e.g. `535.261.03` (what `/proc/driver/nvidia/version` says).
    pub(super) version: String,
    /// Where it was found (`bookworm/contrib`), or `cached .debs`.
    pub(super) origin: String,
}

/// The branch of a kernel release (`6.1.0-57-amd64` -> the 535 entry).
pub(super) fn branch_for_kernel(release: &str) -> Option<&'static NvidiaBranch> {
    let series = SERIES.iter().find(|s| {
        release
            .strip_prefix(s.prefix)
            .and_then(|r| r.strip_suffix(s.suffix))
            .is_some_and(|n| n.parse::<u32>().is_ok())
    })?;
    NVIDIA_BRANCHES
        .iter()
        .find(|b| b.kernel_series == series.name)
}

fn branch(name: &str) -> Option<&'static NvidiaBranch> {
    NVIDIA_BRANCHES.iter().find(|b| b.branch == name)
}

/// The NVIDIA releases of one vm-test run, and the apt configuration they come from.
pub(super) struct NvidiaPlan {
    apt: Apt,
    releases: BTreeMap<&'static str, NvidiaRelease>,
}

impl NvidiaPlan {
    /// Picks the release of every branch the `kernels` need (their own and the `other`
    /// one). Checks the host tools the build needs first.
    pub(super) fn resolve(paths: &Paths, kernels: &[String]) -> Result<NvidiaPlan> {
        for (tool, pkg) in [
            ("patch", "patch"),
            ("objcopy", "binutils"),
            ("xz", "xz-utils"),
        ] {
            if util::output(tool, ["--version"]).is_none() {
                bail!("the nvidia series needs `{tool}` (apt-get install {pkg})");
            }
        }
        let mut branches = BTreeSet::new();
        for k in kernels {
            match branch_for_kernel(k) {
                Some(b) => {
                    branches.insert(b.branch);
                    branches.insert(b.other);
                }
                None => println!(
                    "vm-test: {k}: no NVIDIA branch goes with this kernel (NVIDIA_BRANCHES)"
                ),
            }
        }
        let apt = private_apt(&paths.cache)?;
        let releases = resolve_releases(&apt, &paths.debs, &branches)?;
        Ok(NvidiaPlan { apt, releases })
    }

    /// The release whose modules the VM of kernel `release` runs.
    pub(super) fn release_for(&self, release: &str) -> Option<&NvidiaRelease> {
        self.releases.get(branch_for_kernel(release)?.branch)
    }
}

/// The `nvidia` series of one kernel: fetch, build (or take the cached build), assemble
/// the initramfs, boot with `vmtest.series=nvidia`.
pub(super) fn run_nvidia(
    args: &VmTestArgs,
    paths: &Paths,
    us: &Userspace,
    accel: &str,
    kp: &KernelPrep,
    plan: &NvidiaPlan,
    run: &mut KernelRun,
) -> Result<()> {
    let release = run.release.clone();
    let b = branch_for_kernel(&release)
        .with_context(|| format!("no NVIDIA branch for kernel {release} (NVIDIA_BRANCHES)"))?;
    let rel = &plan.releases[b.branch];
    let other = &plan.releases[b.other];
    let t = Instant::now();
    let (debs, d1) = fetch_release(&paths.debs, &plan.apt, rel, &NVIDIA_PACKAGES)?;
    let (other_debs, d2) = fetch_release(&paths.debs, &plan.apt, other, &["libcuda1"])?;
    run.download += t.elapsed();
    run.downloaded |= d1 || d2;

    let t = Instant::now();
    let header_names: Vec<String> = kp
        .debs
        .headers
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string()
        })
        .collect();
    let built = build_modules(
        paths,
        rel,
        &debs[0],
        &kp.kdir,
        &release,
        &kp.kbuild,
        &header_names,
    )?;
    run.module = t.elapsed();
    run.module_cached = built.cached;
    println!(
        "vm-test: {}: modules {} (patches: {})",
        run.name(),
        built.dir.display(),
        built.patches.join(", ")
    );

    let t = Instant::now();
    let ours = [built.dir.join("nvidia.ko"), built.dir.join("nvidia-uvm.ko")];
    let deps = kernel_deps(&kp.kdir, &release, &kp.debs.image, &ours)?;
    let files = extract_release(&paths.work, rel, &debs[1..])?;
    let ofiles = extract_release(&paths.work, other, &other_debs)?;
    let smi = files
        .smi
        .as_ref()
        .context("no nvidia-smi in the nvidia-smi package")?;
    let nvml = files
        .nvml
        .as_ref()
        .context("no libnvidia-ml.so.<v> in libnvidia-ml1")?;

    let lib = "usr/lib/x86_64-linux-gnu";
    let mut img = Image {
        dir: run.dir.clone(),
        script: "nvidia.sh",
        bench: false,
        files: Vec::new(),
        links: Vec::new(),
        passwd: vec!["user:x:1000:1000::/tmp:/bin/sh".into()],
        group: vec!["user:x:1000:".into()],
    };
    let order = run.dir.join("deps");
    let mut order_text = String::new();
    for d in &deps {
        let n = d
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        order_text.push_str(&n);
        order_text.push('\n');
        img.files
            .push((format!("vmtest/nvidia/{n}"), d.clone(), 0o644));
    }
    fs::write(&order, order_text)?;
    img.files.push(("vmtest/nvidia/deps".into(), order, 0o644));
    for ko in &ours {
        let n = ko
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        img.files
            .push((format!("vmtest/nvidia/{n}"), ko.clone(), 0o644));
    }
    // As Debian's alternatives leave them: the versioned file and its soname link.
    let v = &rel.version;
    img.files.push((
        format!("{lib}/libcuda.so.{v}"),
        files.libcuda.clone(),
        0o755,
    ));
    img.links
        .push((format!("{lib}/libcuda.so.1"), format!("libcuda.so.{v}")));
    img.files
        .push((format!("{lib}/libnvidia-ml.so.{v}"), nvml.clone(), 0o755));
    img.links.push((
        format!("{lib}/libnvidia-ml.so.1"),
        format!("libnvidia-ml.so.{v}"),
    ));
    img.files
        .push(("usr/bin/nvidia-smi".into(), smi.clone(), 0o755));
    // The other release's libcuda, for the release-mismatch test.
    let ov = &other.version;
    let odir = format!("opt/nvidia-{}", other.branch);
    img.files.push((
        format!("{odir}/libcuda.so.{ov}"),
        ofiles.libcuda.clone(),
        0o755,
    ));
    img.links
        .push((format!("{odir}/libcuda.so.1"), format!("libcuda.so.{ov}")));
    let mut bins = vec![
        files.libcuda.clone(),
        nvml.clone(),
        smi.clone(),
        ofiles.libcuda.clone(),
    ];
    let strace = Path::new("/usr/bin/strace");
    if strace.is_file() {
        img.files
            .push(("usr/bin/strace".into(), strace.to_path_buf(), 0o755));
        bins.push(strace.to_path_buf());
    } else {
        println!("vm-test: no /usr/bin/strace on this machine (apt-get install strace): the strace test is skipped");
    }
    for (inside, from) in libraries(&bins)? {
        if !us.files.iter().any(|(i, _)| *i == inside) {
            img.files.push((inside, from, 0o755));
        }
    }
    let initrd = build_initramfs(paths, &kp.kdir, &release, us, &img, args.keep)?;
    run.initramfs = t.elapsed();
    run.initramfs_bytes = fs::metadata(&initrd)?.len();
    print_prepared(run);
    let extra = format!(
        "vmtest.series=nvidia NVIDIA_VERSION={} NVIDIA_OTHER={}",
        rel.version, other.version
    );
    // The real libcuda and the modules' memory: 1 GiB is not enough.
    boot_vm(args, accel, &kp.vmlinuz, &initrd, 2048, &extra, run)
}

// --- versions --------------------------------------------------------------------------------

/// dpkg's comparison of two version strings (`[epoch:]upstream[-revision]`).
pub(super) fn deb_version_cmp(a: &str, b: &str) -> Ordering {
    fn split(v: &str) -> (u64, &str, &str) {
        let (epoch, rest) = match v.split_once(':') {
            Some((e, r)) if e.chars().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
            _ => (0, v),
        };
        match rest.rsplit_once('-') {
            Some((u, r)) => (epoch, u, r),
            None => (epoch, rest, ""),
        }
    }
    fn order(c: Option<u8>) -> i32 {
        match c {
            None => 0,
            Some(c) if c.is_ascii_digit() => 0,
            Some(c) if c.is_ascii_alphabetic() => i32::from(c),
            Some(b'~') => -1,
            Some(c) => i32::from(c) + 256,
        }
    }
    fn verrevcmp(a: &[u8], b: &[u8]) -> Ordering {
        let (mut i, mut j) = (0, 0);
        let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
        while i < a.len() || j < b.len() {
            while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
                let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
                if ac != bc {
                    return ac.cmp(&bc);
                }
                i += 1;
                j += 1;
            }
            while a.get(i) == Some(&b'0') {
                i += 1;
            }
            while b.get(j) == Some(&b'0') {
                j += 1;
            }
            let mut first_diff = Ordering::Equal;
            while digit(a, i) && digit(b, j) {
                if first_diff == Ordering::Equal {
                    first_diff = a[i].cmp(&b[j]);
                }
                i += 1;
                j += 1;
            }
            if digit(a, i) {
                return Ordering::Greater;
            }
            if digit(b, j) {
                return Ordering::Less;
            }
            if first_diff != Ordering::Equal {
                return first_diff;
            }
        }
        Ordering::Equal
    }
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| verrevcmp(ua.as_bytes(), ub.as_bytes()))
        .then_with(|| verrevcmp(ra.as_bytes(), rb.as_bytes()))
}

/// NVIDIA's version in a Debian one: `535.261.03-1` -> `535.261.03`.
pub(super) fn upstream_version(deb_version: &str) -> &str {
    let v = deb_version.split_once(':').map_or(deb_version, |(_, r)| r);
    v.rsplit_once('-').map_or(v, |(u, _)| u)
}

/// One line of `apt-cache madison`: `pkg | version | url suite/component arch Packages`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Madison {
    pub(super) pkg: String,
    pub(super) version: String,
    /// `bookworm-security/non-free`
    pub(super) origin: String,
}

/// The binary (amd64 or all) package lines of `apt-cache madison` output.
pub(super) fn madison_entries(text: &str) -> Vec<Madison> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            let (pkg, version, from) = (f.next()?, f.next()?, f.next()?);
            let w: Vec<&str> = from.split_whitespace().collect();
            // url suite/component arch Packages
            if w.len() < 4 || w[3] != "Packages" || !matches!(w[2], "amd64" | "all") {
                return None;
            }
            Some(Madison {
                pkg: pkg.to_string(),
                version: version.to_string(),
                origin: w[1].to_string(),
            })
        })
        .collect()
}

/// The newest release of `b` that `entries` offer, from its suites, with all of
/// [`NVIDIA_PACKAGES`] at that version: `(Debian version, origin of the module source)`.
pub(super) fn pick_release(entries: &[Madison], b: &NvidiaBranch) -> Option<(String, String)> {
    let in_suites = |m: &Madison| {
        let suite = m.origin.split('/').next().unwrap_or("");
        b.suites.contains(&suite)
    };
    let prefix = format!("{}.", b.branch);
    entries
        .iter()
        .filter(|m| m.pkg == NVIDIA_PACKAGES[0] && in_suites(m))
        .filter(|m| upstream_version(&m.version).starts_with(&prefix))
        .filter(|m| {
            NVIDIA_PACKAGES[1..].iter().all(|p| {
                entries
                    .iter()
                    .any(|o| o.pkg == *p && o.version == m.version && in_suites(o))
            })
        })
        .max_by(|x, y| deb_version_cmp(&x.version, &y.version))
        .map(|m| (m.version.clone(), m.origin.clone()))
}

/// The newest version of `b` among cached `.deb` file names that has all four packages
/// (offline use).
pub(super) fn pick_cached(names: &[String], b: &NvidiaBranch) -> Option<String> {
    let versions_of = |pkg: &str| -> BTreeSet<String> {
        names
            .iter()
            .filter_map(|n| {
                let mut p = n.strip_suffix(".deb")?.split('_');
                (p.next()? == pkg).then(|| p.next().map(|v| v.replace("%3a", ":")))?
            })
            .collect()
    };
    let mut common = versions_of(NVIDIA_PACKAGES[0]);
    for p in &NVIDIA_PACKAGES[1..] {
        let v = versions_of(p);
        common.retain(|x| v.contains(x));
    }
    let prefix = format!("{}.", b.branch);
    common
        .into_iter()
        .filter(|v| upstream_version(v).starts_with(&prefix))
        .max_by(|x, y| deb_version_cmp(x, y))
}

// --- the private apt ---------------------------------------------------------------------------

/// The private apt configuration under `<cache>/vmtest/apt/`, its lists updated when older
/// than a day (or when the sources changed); an update that fails leaves the old lists.
pub(super) fn private_apt(cache: &Path) -> Result<Apt> {
    let dir = cache.join("vmtest/apt");
    for d in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(dir.join(d))?;
    }
    let sources = dir.join("sources.list");
    let changed = fs::read_to_string(&sources).ok().as_deref() != Some(SOURCES_LIST);
    if changed {
        fs::write(&sources, SOURCES_LIST)?;
    }
    let apt = Apt {
        opts: vec![
            format!("Dir::Etc::SourceList={}", sources.display()),
            "Dir::Etc::SourceParts=-".into(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            format!("Dir::Cache={}", dir.join("cache").display()),
            "Dir::State::Status=/var/lib/dpkg/status".into(),
        ],
    };
    let stamp = dir.join("updated");
    let age = fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok());
    if changed || age.is_none_or(|a| a > LISTS_MAX_AGE) {
        println!(
            "vm-test: apt-get update (private lists in {})",
            dir.display()
        );
        match util::run_inherit(apt.command("apt-get").args(["update", "-q"])) {
            Ok(()) => fs::write(&stamp, "")?,
            Err(e) => println!("vm-test: apt-get update failed ({e:#}); using the lists there are"),
        }
    }
    Ok(apt)
}

/// The release of each branch in `branches`: from the private apt lists, else from the
/// cached `.deb`s. Prints which.
pub(super) fn resolve_releases(
    apt: &Apt,
    debs: &Path,
    branches: &BTreeSet<&'static str>,
) -> Result<BTreeMap<&'static str, NvidiaRelease>> {
    let out = apt
        .command("apt-cache")
        .arg("madison")
        .args(NVIDIA_PACKAGES)
        .output()
        .context("run apt-cache madison")?;
    let entries = madison_entries(&String::from_utf8_lossy(&out.stdout));
    let cached = cached_deb_names(debs);
    let mut found = BTreeMap::new();
    for name in branches {
        let b = branch(name).with_context(|| format!("no NVIDIA branch {name} in the table"))?;
        let (deb_version, origin) = match pick_release(&entries, b) {
            Some(p) => p,
            None => match pick_cached(&cached, b) {
                Some(v) => (v, "cached .debs".to_string()),
                None => bail!(
                    "no NVIDIA {} release with all of {} in {} (apt lists: {}) nor in the cache",
                    b.branch,
                    NVIDIA_PACKAGES.join(", "),
                    b.suites.join(", "),
                    debs.display()
                ),
            },
        };
        let r = NvidiaRelease {
            branch: b.branch,
            version: upstream_version(&deb_version).to_string(),
            deb_version,
            origin,
        };
        println!(
            "vm-test: NVIDIA {} branch: {} ({}; open kernel modules, libcuda, nvidia-smi)",
            r.branch, r.deb_version, r.origin
        );
        found.insert(*name, r);
    }
    Ok(found)
}

fn cached_deb_names(debs: &Path) -> Vec<String> {
    fs::read_dir(debs)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.ends_with(".deb"))
                .collect()
        })
        .unwrap_or_default()
}

/// Fetches `pkgs` of `rel` (cached); returns them in order and whether any was downloaded.
pub(super) fn fetch_release(
    debs: &Path,
    apt: &Apt,
    rel: &NvidiaRelease,
    pkgs: &[&str],
) -> Result<(Vec<PathBuf>, bool)> {
    let mut out = Vec::new();
    let mut downloaded = false;
    for p in pkgs {
        let (deb, d) = fetch_deb(debs, p, Some(&rel.deb_version), apt)?;
        downloaded |= d;
        out.push(deb);
    }
    Ok((out, downloaded))
}

// --- the module build --------------------------------------------------------------------------

/// The `linux-headers-*-common` directory among `names` (entries of the extracted
/// `usr/src/`) that goes with kernel `release`: `linux-headers-<release less its flavour>-common`
/// when present, else the only `-common` one.
pub(super) fn common_headers_name(names: &[String], release: &str) -> Option<String> {
    let base = release.rsplit_once('-').map_or(release, |(b, _)| b);
    let want = format!("linux-headers-{base}-common");
    let commons: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("linux-headers-") && n.ends_with("-common"))
        .collect();
    if let Some(n) = commons.iter().find(|n| ***n == want) {
        return Some((*n).clone());
    }
    match commons.as_slice() {
        [one] => Some((*one).clone()),
        _ => None,
    }
}

/// The build key: `<Debian version>-<kernel release>-<16 hex digits>` over the patches,
/// the recipe, the header packages and the compiler.
pub(super) fn build_key(
    deb_version: &str,
    release: &str,
    patches: &[(String, Vec<u8>)],
    headers: &[String],
    compiler: &str,
) -> String {
    let mut parts: Vec<&[u8]> = vec![BUILD_RECIPE.as_bytes(), compiler.as_bytes()];
    for (name, text) in patches {
        parts.push(name.as_bytes());
        parts.push(text);
    }
    for h in headers {
        parts.push(h.as_bytes());
    }
    format!(
        "{}-{}-{:016x}",
        cache::component(deb_version),
        cache::component(release),
        cache::fnv1a(&parts)
    )
}

/// The built modules of one (release, kernel).
pub(super) struct Built {
    /// Holds `nvidia.ko`, `nvidia-uvm.ko`, `build.log`, `key.txt`.
    pub(super) dir: PathBuf,
    pub(super) cached: bool,
    pub(super) patches: Vec<String>,
}

/// Builds NVIDIA's open modules of `rel` (its `nvidia-open-kernel-dkms` `.deb`) against the
/// headers extracted under `kdir/headers`, or takes the cached build of the same key.
pub(super) fn build_modules(
    paths: &Paths,
    rel: &NvidiaRelease,
    dkms_deb: &Path,
    kdir: &Path,
    release: &str,
    kbuild: &Path,
    header_debs: &[String],
) -> Result<Built> {
    let src_root = kdir.join("headers/usr/src");
    let names: Vec<String> = fs::read_dir(&src_root)
        .with_context(|| format!("read {}", src_root.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    let common = src_root.join(
        common_headers_name(&names, release)
            .with_context(|| format!("no linux-headers-*-common in {}", src_root.display()))?,
    );
    // The patches that apply to these headers.
    let pdir = paths.root.join("vmtest/nvidia/patches");
    let mut patches = Vec::new();
    for (file, cond) in PATCHES {
        let applies = match cond {
            None => true,
            Some((hdr, needle)) => fs::read_to_string(common.join(hdr))
                .with_context(|| format!("read {}", common.join(hdr).display()))?
                .contains(needle),
        };
        if applies {
            let p = pdir.join(file);
            let text = fs::read(&p).with_context(|| format!("read {}", p.display()))?;
            patches.push((file.to_string(), text));
        }
    }
    let compiler = util::output("gcc", ["--version"])
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let key = build_key(&rel.deb_version, release, &patches, header_debs, &compiler);
    let builds = paths.cache.join("vmtest/nvidia");
    fs::create_dir_all(&builds)?;
    let fin = builds.join(&key);
    let patch_names: Vec<String> = patches.iter().map(|(n, _)| n.clone()).collect();
    let complete = |d: &Path| {
        ["nvidia.ko", "nvidia-uvm.ko", "key.txt"]
            .iter()
            .all(|f| d.join(f).is_file())
    };
    if complete(&fin) {
        println!(
            "vm-test: {release}: NVIDIA {} modules cached ({})",
            rel.version,
            fin.display()
        );
        return Ok(Built {
            dir: fin,
            cached: true,
            patches: patch_names,
        });
    }
    let _ = fs::remove_dir_all(&fin);
    let tmp = cache::temp_beside(&fin)?;
    let log = tmp.join("build.log");
    let r = build_in(&tmp, rel, dkms_deb, &common, kbuild, &patches, &pdir, &log);
    if let Err(e) = r {
        let failed = builds.join(format!("{key}.failed.log"));
        let _ = fs::copy(&log, &failed);
        let _ = fs::remove_dir_all(&tmp);
        let tail = fs::read_to_string(&failed).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(30).collect();
        for l in tail.iter().rev() {
            println!("  build| {l}");
        }
        return Err(e.context(format!(
            "NVIDIA module build failed (log: {})",
            failed.display()
        )));
    }
    fs::write(
        tmp.join("key.txt"),
        format!(
            "driver {}\nkernel {release}\nheaders {}\npatches {}\ncompiler {compiler}\nrecipe {BUILD_RECIPE}\n",
            rel.deb_version,
            header_debs.join(" "),
            patch_names.join(" ")
        ),
    )?;
    cache::publish(&tmp, &fin)?;
    Ok(Built {
        dir: fin,
        cached: false,
        patches: patch_names,
    })
}

#[allow(clippy::too_many_arguments)]
fn build_in(
    tmp: &Path,
    rel: &NvidiaRelease,
    dkms_deb: &Path,
    common: &Path,
    kbuild: &Path,
    patches: &[(String, Vec<u8>)],
    pdir: &Path,
    log: &Path,
) -> Result<()> {
    let pkg = tmp.join("pkg");
    util::run_inherit(Command::new("dpkg-deb").arg("-x").arg(dkms_deb).arg(&pkg))?;
    let usr_src = pkg.join("usr/src");
    let src = fs::read_dir(&usr_src)
        .with_context(|| format!("read {}", usr_src.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            let n = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            n.contains("open") && n.ends_with(&format!("-{}", rel.version)) && p.is_dir()
        })
        .with_context(|| format!("no nvidia-*open*-{} in {}", rel.version, usr_src.display()))?;
    let mut logf = fs::File::create(log)?;
    let run_logged = |cmd: &mut Command, logf: &mut fs::File| -> Result<()> {
        use std::io::Write as _;
        writeln!(logf, "$ {}", util::describe(cmd))?;
        let o = cmd
            .output()
            .with_context(|| format!("run {}", util::describe(cmd)))?;
        logf.write_all(&o.stdout)?;
        logf.write_all(&o.stderr)?;
        if !o.status.success() {
            bail!("`{}` failed ({})", util::describe(cmd), o.status);
        }
        Ok(())
    };
    for (name, _) in patches {
        run_logged(
            Command::new("patch")
                .current_dir(&src)
                .args([
                    "-p1",
                    "--forward",
                    "--batch",
                    "--no-backup-if-mismatch",
                    "-i",
                ])
                .arg(pdir.join(name)),
            &mut logf,
        )?;
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "vm-test: building NVIDIA {} open modules against {} (make -j{jobs}, several minutes; log {})",
        rel.version,
        kbuild.file_name().unwrap_or_default().to_string_lossy(),
        log.display()
    );
    let t = Instant::now();
    run_logged(
        Command::new("make")
            .current_dir(&src)
            .arg(format!("-j{jobs}"))
            .arg("modules")
            .arg(format!("SYSSRC={}", common.display()))
            .arg(format!("SYSOUT={}", kbuild.display()))
            .arg(format!("NV_EXCLUDE_KERNEL_MODULES={NV_EXCLUDE}")),
        &mut logf,
    )?;
    println!("vm-test: make took {}", secs(t.elapsed()));
    for ko in ["nvidia.ko", "nvidia-uvm.ko"] {
        run_logged(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(tmp.join(ko))
                .arg(src.join(ko)),
            &mut logf,
        )?;
    }
    drop(logf);
    fs::remove_dir_all(&pkg)?;
    Ok(())
}

// --- modules from the kernel's image ----------------------------------------------------------

/// The `depends=` of a module's `.modinfo` section bytes (NUL-separated `key=value`).
pub(super) fn modinfo_depends(modinfo: &[u8]) -> Vec<String> {
    modinfo
        .split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix("depends="))
        .flat_map(|d| d.split(','))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect()
}

fn module_depends(ko: &Path, scratch: &Path) -> Result<Vec<String>> {
    let out = scratch.join("modinfo.bin");
    util::run_inherit(
        Command::new("objcopy")
            .args([
                "-O",
                "binary",
                "-j",
                ".modinfo",
                "--set-section-flags",
                ".modinfo=alloc",
            ])
            .arg(ko)
            .arg(&out),
    )?;
    let deps = modinfo_depends(&fs::read(&out)?);
    let _ = fs::remove_file(&out);
    Ok(deps)
}

/// The module `name` (`-` and `_` alike) in a listing of the image package.
pub(super) fn module_in_listing<'a>(
    listing: &'a [String],
    release: &str,
    name: &str,
) -> Option<&'a str> {
    let norm = |s: &str| s.replace('-', "_");
    let want = norm(name);
    let dir = format!("./lib/modules/{release}/kernel/");
    listing
        .iter()
        .map(String::as_str)
        .filter(|p| p.starts_with(&dir))
        .find(|p| {
            let file = p.rsplit('/').next().unwrap_or("");
            let stem = file
                .strip_suffix(".ko")
                .or_else(|| file.strip_suffix(".ko.xz"))
                .or_else(|| file.strip_suffix(".ko.zst"))
                .or_else(|| file.strip_suffix(".ko.gz"));
            stem.is_some_and(|s| norm(s) == want)
        })
}

/// The kernel modules `mods` need (transitively, from the kernel's image package),
/// decompressed into `kdir/nvidia-deps/`, in load order (dependencies first). Cached per
/// image package.
pub(super) fn kernel_deps(
    kdir: &Path,
    release: &str,
    image_deb: &Path,
    mods: &[PathBuf],
) -> Result<Vec<PathBuf>> {
    let dir = kdir.join("nvidia-deps");
    let stamp = dir.join(".from");
    let image_name = image_deb
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let order_file = dir.join("order");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(&image_name) {
        if let Ok(order) = fs::read_to_string(&order_file) {
            let files: Vec<PathBuf> = order
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| dir.join(l))
                .collect();
            if files.iter().all(|f| f.is_file()) {
                return Ok(files);
            }
        }
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let listing_out = Command::new("sh")
        .args([
            "-ec",
            &format!("dpkg-deb --fsys-tarfile {} | tar -t", q(image_deb)),
        ])
        .output()
        .context("list the image package")?;
    if !listing_out.status.success() {
        bail!("listing {} failed", image_deb.display());
    }
    let listing: Vec<String> = String::from_utf8_lossy(&listing_out.stdout)
        .lines()
        .map(String::from)
        .collect();
    let ours: BTreeSet<String> = ["nvidia", "nvidia_uvm"].map(String::from).into();
    // name -> its dependencies; extracted breadth-first, one tar pass per level.
    let mut deps_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for m in mods {
        for d in module_depends(m, &dir)? {
            wanted.insert(d.replace('-', "_"));
        }
    }
    wanted.retain(|w| !ours.contains(w));
    while !wanted.is_empty() {
        let mut members = Vec::new();
        for w in &wanted {
            let p = module_in_listing(&listing, release, w).with_context(|| {
                format!(
                    "module {w} (a dependency of nvidia.ko) is not in {}",
                    image_deb.display()
                )
            })?;
            members.push((w.clone(), p.to_string()));
        }
        let extract = dir.join("x");
        fs::create_dir_all(&extract)?;
        let list: Vec<String> = members.iter().map(|(_, p)| format!("'{p}'")).collect();
        sh(&format!(
            "dpkg-deb --fsys-tarfile {} | tar -xf - -C {} {}",
            q(image_deb),
            q(&extract),
            list.join(" ")
        ))?;
        let mut next = BTreeSet::new();
        for (name, member) in members {
            let from = extract.join(&member);
            let ko = dir.join(format!("{name}.ko"));
            let m = member.as_str();
            let tool = if m.ends_with(".xz") {
                Some("xz")
            } else if m.ends_with(".zst") {
                Some("zstd")
            } else if m.ends_with(".gz") {
                Some("gzip")
            } else {
                None
            };
            match tool {
                Some(t) => sh(&format!("{t} -dc {} > {}", q(&from), q(&ko)))?,
                None => {
                    fs::copy(&from, &ko)?;
                }
            }
            let d: Vec<String> = module_depends(&ko, &dir)?
                .into_iter()
                .map(|d| d.replace('-', "_"))
                .collect();
            for x in &d {
                if !deps_of.contains_key(x) && !ours.contains(x) {
                    next.insert(x.clone());
                }
            }
            deps_of.insert(name, d);
        }
        fs::remove_dir_all(&extract)?;
        next.retain(|n| !deps_of.contains_key(n));
        wanted = next;
    }
    let order = load_order(&deps_of);
    fs::write(
        &order_file,
        order
            .iter()
            .map(|n| format!("{n}.ko\n"))
            .collect::<String>(),
    )?;
    fs::write(&stamp, &image_name)?;
    Ok(order.iter().map(|n| dir.join(format!("{n}.ko"))).collect())
}

/// Module names in an order where each comes after its dependencies.
pub(super) fn load_order(deps_of: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    fn visit(
        n: &str,
        deps_of: &BTreeMap<String, Vec<String>>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) {
        if !seen.insert(n.to_string()) {
            return;
        }
        for d in deps_of.get(n).into_iter().flatten() {
            if deps_of.contains_key(d) {
                visit(d, deps_of, seen, out);
            }
        }
        out.push(n.to_string());
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for n in deps_of.keys() {
        visit(n, deps_of, &mut seen, &mut out);
    }
    out
}

// --- user space ----------------------------------------------------------------------------------

/// The user-space files of one release, extracted from its `.deb`s.
pub(super) struct NvFiles {
    pub(super) libcuda: PathBuf,
    pub(super) smi: Option<PathBuf>,
    pub(super) nvml: Option<PathBuf>,
}

/// Extracts `debs` of `rel` under `work/nvidia-<version>/` (once each) and finds
/// `libcuda.so.<v>`, `nvidia-smi` and `libnvidia-ml.so.<v>` there.
pub(super) fn extract_release(
    work: &Path,
    rel: &NvidiaRelease,
    debs: &[PathBuf],
) -> Result<NvFiles> {
    let root = work.join(format!("nvidia-{}", cache::component(&rel.deb_version)));
    fs::create_dir_all(&root)?;
    cache::remove_stale_temps(&root);
    for deb in debs {
        let stem = deb
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let fin = root.join(&stem);
        if fin.is_dir() {
            continue;
        }
        let tmp = cache::temp_beside(&fin)?;
        util::run_inherit(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tmp))?;
        cache::publish(&tmp, &fin)?;
    }
    let find = |name: &str| find_file(&root, name);
    Ok(NvFiles {
        libcuda: find(&format!("libcuda.so.{}", rel.version))
            .with_context(|| format!("no libcuda.so.{} in {}", rel.version, root.display()))?,
        smi: find("nvidia-smi"),
        nvml: find(&format!("libnvidia-ml.so.{}", rel.version)),
    })
}

/// A regular file named `name` below `dir` (symlinks not followed), the shortest path first.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() && e.file_name() == name {
                hits.push(e.path());
            }
        }
    }
    hits.sort_by_key(|p| (p.components().count(), p.clone()));
    hits.into_iter().next()
}

// --- what the VM prints for the host ----------------------------------------------------------

/// The file a console line's content goes to, and the content: `strace| ...` ->
/// `strace.txt`, `agent.log[fentry]| ...` -> `agent-fentry.log`, `capture| ` (base64) ->
/// `capture.json.b64` (decoded into `capture.json` at the end), ...
pub(super) fn artifact_of(line: &str) -> Option<(String, &str)> {
    const FIXED: &[(&str, &str)] = &[
        ("strace| ", "strace.txt"),
        ("smi| ", "smi.txt"),
        ("kallsyms| ", "kallsyms.txt"),
        ("capture| ", "capture.json.b64"),
        ("probes| ", "probes.txt"),
        ("dmesg| ", "dmesg.txt"),
    ];
    for (prefix, file) in FIXED {
        if let Some(rest) = line.strip_prefix(prefix) {
            return Some((file.to_string(), rest));
        }
    }
    let rest = line.strip_prefix("agent.log[")?;
    let (backend, rest) = rest.split_once("]| ")?;
    if backend.is_empty()
        || !backend
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return None;
    }
    Some((format!("agent-{backend}.log"), rest))
}

/// Decodes standard base64 (whitespace ignored); `None` on a character outside the alphabet.
pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            c if c.is_ascii_whitespace() => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The console lines meant for files, collected while the VM runs and written at the end.
#[derive(Default)]
pub(super) struct Artifacts {
    files: BTreeMap<String, String>,
}

impl Artifacts {
    /// Keeps `line` when it carries a known prefix; returns whether it did.
    pub(super) fn take(&mut self, line: &str) -> bool {
        match artifact_of(line) {
            Some((file, rest)) => {
                let f = self.files.entry(file).or_default();
                f.push_str(rest);
                f.push('\n');
                true
            }
            None => false,
        }
    }

    /// Writes the files into `dir` (the capture decoded); returns their names.
    pub(super) fn write(&self, dir: &Path) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for (name, text) in &self.files {
            if let Some(json) = name.strip_suffix(".b64") {
                match base64_decode(text) {
                    Some(bytes) => {
                        fs::write(dir.join(json), bytes)?;
                        names.push(json.to_string());
                        continue;
                    }
                    None => println!("vm-test: {name}: not base64; kept as it came"),
                }
            }
            fs::write(dir.join(name), text)?;
            names.push(name.clone());
        }
        Ok(names)
    }
}

/// Removes what an earlier run left in `dir` for these files.
pub(super) fn clear_artifacts(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().to_string();
        let known = matches!(
            n.as_str(),
            "strace.txt"
                | "smi.txt"
                | "kallsyms.txt"
                | "capture.json"
                | "capture.json.b64"
                | "probes.txt"
                | "dmesg.txt"
        ) || (n.starts_with("agent-") && n.ends_with(".log"));
        if known {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MADISON: &str = "\
nvidia-open-kernel-dkms | 550.163.01-2 | http://deb.debian.org/debian trixie/contrib amd64 Packages
nvidia-open-kernel-dkms | 535.261.03-1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages
  libcuda1 | 550.163.01-2 | http://deb.debian.org/debian trixie/non-free amd64 Packages
  libcuda1 | 535.309.01-0+deb12u1 | http://security.debian.org/debian-security bookworm-security/non-free amd64 Packages
  libcuda1 | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
  libcuda1 | 535.216.03-2~bpo12+1 | http://deb.debian.org/debian bookworm-backports/non-free amd64 Packages
  libcuda1 | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free i386 Packages
nvidia-smi | 550.163.01-2 | http://deb.debian.org/debian trixie/non-free amd64 Packages
nvidia-smi | 535.309.01-0+deb12u1 | http://security.debian.org/debian-security bookworm-security/non-free amd64 Packages
nvidia-smi | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
libnvidia-ml1 | 550.163.01-2 | http://deb.debian.org/debian trixie/non-free amd64 Packages
libnvidia-ml1 | 535.309.01-0+deb12u1 | http://security.debian.org/debian-security bookworm-security/non-free amd64 Packages
libnvidia-ml1 | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
nvidia-graphics-drivers | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free Sources
";

    #[test]
    fn versions_from_madison() {
        let e = madison_entries(MADISON);
        assert_eq!(e.len(), 12, "the i386 and Sources lines are left out");
        assert_eq!(
            pick_release(&e, &NVIDIA_BRANCHES[0]),
            Some(("535.261.03-1".into(), "bookworm/contrib".into())),
            "535.309.01 in bookworm-security has no open module source"
        );
        assert_eq!(
            pick_release(&e, &NVIDIA_BRANCHES[1]),
            Some(("550.163.01-2".into(), "trixie/contrib".into()))
        );
        // A newer complete release in a suite of the branch wins; one outside its suites not.
        let mut more = MADISON.to_string();
        for p in NVIDIA_PACKAGES {
            more.push_str(&format!(
                "{p} | 535.309.01-0+deb12u1 | http://security.debian.org/debian-security bookworm-security/contrib amd64 Packages\n\
                 {p} | 550.999.01-1 | http://deb.debian.org/debian sid/contrib amd64 Packages\n"
            ));
        }
        let e = madison_entries(&more);
        assert_eq!(
            pick_release(&e, &NVIDIA_BRANCHES[0]).unwrap().0,
            "535.309.01-0+deb12u1"
        );
        assert_eq!(
            pick_release(&e, &NVIDIA_BRANCHES[1]).unwrap().0,
            "550.163.01-2"
        );
        assert_eq!(pick_release(&[], &NVIDIA_BRANCHES[0]), None);
    }

    #[test]
    fn versions_from_cached_debs() {
        let names: Vec<String> = [
            "nvidia-open-kernel-dkms_535.261.03-1_amd64.deb",
            "libcuda1_535.261.03-1_amd64.deb",
            "nvidia-smi_535.261.03-1_amd64.deb",
            "libnvidia-ml1_535.261.03-1_amd64.deb",
            "libcuda1_535.309.01-0+deb12u1_amd64.deb",
            "nvidia-open-kernel-dkms_550.163.01-2_amd64.deb",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            pick_cached(&names, &NVIDIA_BRANCHES[0]).as_deref(),
            Some("535.261.03-1")
        );
        assert_eq!(pick_cached(&names, &NVIDIA_BRANCHES[1]), None);
    }

    #[test]
    fn dpkg_order() {
        use Ordering::*;
        for (a, b, want) in [
            ("535.261.03-1", "535.261.03-1", Equal),
            ("535.309.01-0+deb12u1", "535.261.03-1", Greater),
            ("535.216.03-2~bpo12+1", "535.216.03-2", Less),
            ("550.163.01-2", "550.163.01-10", Less),
            ("1:1.0", "2.0", Greater),
            ("1.0~rc1", "1.0", Less),
            ("1.0a", "1.0", Greater),
            ("6.1.192-3", "6.1.99-1", Greater),
        ] {
            assert_eq!(deb_version_cmp(a, b), want, "{a} vs {b}");
            assert_eq!(deb_version_cmp(b, a), want.reverse(), "{b} vs {a}");
        }
        assert_eq!(upstream_version("535.261.03-1"), "535.261.03");
        assert_eq!(upstream_version("1:550.163.01-2"), "550.163.01");
        assert_eq!(upstream_version("535.216.03-2~bpo12+1"), "535.216.03");
    }

    #[test]
    fn kernels_and_branches() {
        assert_eq!(branch_for_kernel("6.1.0-57-amd64").unwrap().branch, "535");
        assert_eq!(
            branch_for_kernel("6.12.117+deb12-amd64").unwrap().branch,
            "550"
        );
        assert_eq!(branch_for_kernel("6.1.0-57-rt-amd64"), None);
        assert_eq!(branch_for_kernel("5.10.0-30-amd64"), None);
        // Every branch names an existing kernel series and another branch of the table.
        for b in NVIDIA_BRANCHES {
            assert!(SERIES.iter().any(|s| s.name == b.kernel_series), "{b:?}");
            assert!(
                branch(b.other).is_some_and(|o| o.branch != b.branch),
                "{b:?}"
            );
        }
    }

    #[test]
    fn common_headers() {
        let names: Vec<String> = [
            "linux-headers-6.1.0-57-amd64",
            "linux-headers-6.1.0-57-common",
            "linux-kbuild-6.1",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            common_headers_name(&names, "6.1.0-57-amd64").as_deref(),
            Some("linux-headers-6.1.0-57-common")
        );
        let names: Vec<String> = [
            "linux-headers-6.12.117+deb12-amd64",
            "linux-headers-6.12.117+deb12-common",
            "linux-headers-6.12.99+deb12-common",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            common_headers_name(&names, "6.12.117+deb12-amd64").as_deref(),
            Some("linux-headers-6.12.117+deb12-common")
        );
        assert_eq!(
            common_headers_name(&names, "6.12.5+deb12-amd64"),
            None,
            "two candidates, neither named"
        );
    }

    #[test]
    fn build_keys() {
        let p = vec![("0002.patch".to_string(), b"x".to_vec())];
        let h = vec!["linux-headers-6.1.0-57-amd64_6.1.192-3_amd64.deb".to_string()];
        let k = build_key("535.261.03-1", "6.1.0-57-amd64", &p, &h, "gcc 12");
        assert!(k.starts_with("535.261.03-1-6.1.0-57-amd64-"), "{k}");
        assert_eq!(k.len(), "535.261.03-1-6.1.0-57-amd64-".len() + 16);
        assert_eq!(
            k,
            build_key("535.261.03-1", "6.1.0-57-amd64", &p, &h, "gcc 12")
        );
        let p2 = vec![("0002.patch".to_string(), b"y".to_vec())];
        assert_ne!(
            k,
            build_key("535.261.03-1", "6.1.0-57-amd64", &p2, &h, "gcc 12")
        );
        assert_ne!(
            k,
            build_key("535.261.03-1", "6.1.0-57-amd64", &[], &h, "gcc 12")
        );
        assert_ne!(
            k,
            build_key("535.261.03-1", "6.1.0-57-amd64", &p, &[], "gcc 12")
        );
        assert_ne!(
            k,
            build_key("535.261.03-1", "6.1.0-57-amd64", &p, &h, "gcc 14")
        );
    }

    #[test]
    fn the_patches_exist_and_explain_themselves() {
        let dir = util::workspace_root().join("vmtest/nvidia/patches");
        let mut on_disk: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        on_disk.sort();
        let listed: Vec<String> = PATCHES.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(on_disk, listed, "every patch file is in PATCHES, in order");
        for f in &listed {
            let text = fs::read_to_string(dir.join(f)).unwrap();
            let (why, _) = text.split_once("\n--- a/").expect("a unified diff");
            assert!(
                why.split_whitespace().count() > 20,
                "{f}: say why before the diff"
            );
        }
    }

    #[test]
    fn modinfo() {
        let mi = b"license=Dual MIT/GPL\0depends=drm\0retpoline=Y\0name=nvidia\0";
        assert_eq!(modinfo_depends(mi), vec!["drm".to_string()]);
        assert_eq!(
            modinfo_depends(b"depends=\0name=drm\0"),
            Vec::<String>::new()
        );
        assert_eq!(
            modinfo_depends(b"depends=a,b_c\0"),
            vec!["a".to_string(), "b_c".to_string()]
        );
        let listing: Vec<String> = [
            "./lib/modules/6.12.117+deb12-amd64/kernel/drivers/gpu/drm/drm.ko.xz",
            "./lib/modules/6.12.117+deb12-amd64/kernel/drivers/gpu/drm/drm_kms_helper.ko.xz",
            "./usr/share/doc/drm.ko",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            module_in_listing(&listing, "6.12.117+deb12-amd64", "drm"),
            Some("./lib/modules/6.12.117+deb12-amd64/kernel/drivers/gpu/drm/drm.ko.xz")
        );
        assert_eq!(
            module_in_listing(&listing, "6.12.117+deb12-amd64", "drm-kms-helper"),
            Some("./lib/modules/6.12.117+deb12-amd64/kernel/drivers/gpu/drm/drm_kms_helper.ko.xz")
        );
        assert_eq!(module_in_listing(&listing, "6.1.0-57-amd64", "drm"), None);
        let mut deps = BTreeMap::new();
        deps.insert(
            "a".to_string(),
            vec!["b".to_string(), "builtin".to_string()],
        );
        deps.insert("b".to_string(), vec!["c".to_string()]);
        deps.insert("c".to_string(), vec![]);
        assert_eq!(load_order(&deps), ["c", "b", "a"]);
    }

    #[test]
    fn console_artifacts() {
        assert_eq!(
            artifact_of("strace| 123 openat(AT_FDCWD, \"/dev/nvidiactl\", O_RDWR) = 3"),
            Some((
                "strace.txt".into(),
                "123 openat(AT_FDCWD, \"/dev/nvidiactl\", O_RDWR) = 3"
            ))
        );
        assert_eq!(
            artifact_of("agent.log[tracepoint]| {\"event\":\"started\"}"),
            Some(("agent-tracepoint.log".into(), "{\"event\":\"started\"}"))
        );
        assert_eq!(artifact_of("smi| "), Some(("smi.txt".into(), "")));
        assert_eq!(artifact_of("agent.log[../x]| y"), None);
        assert_eq!(artifact_of("agent.log| y"), None);
        assert_eq!(artifact_of("VMTEST x PASS"), None);
        assert_eq!(artifact_of(" strace| indented"), None);

        assert_eq!(base64_decode("aGVsbG8sIHdvcmxk").unwrap(), b"hello, world");
        assert_eq!(base64_decode("aGVs\nbG8=\n").unwrap(), b"hello");
        assert_eq!(base64_decode("eyJ4Ijox\nfQ==").unwrap(), b"{\"x\":1}");
        assert_eq!(base64_decode(""), Some(vec![]));
        assert_eq!(base64_decode("a*b"), None);

        let d = tempfile::tempdir().unwrap();
        let mut a = Artifacts::default();
        for l in [
            "capture| eyJ4Ijox",
            "capture| fQ==",
            "kallsyms| t uvm_ioctl",
            "other",
            "kallsyms| T uvm_api_initialize",
        ] {
            a.take(l);
        }
        let names = a.write(d.path()).unwrap();
        assert_eq!(names, ["capture.json", "kallsyms.txt"]);
        assert_eq!(
            fs::read_to_string(d.path().join("capture.json")).unwrap(),
            "{\"x\":1}"
        );
        assert_eq!(
            fs::read_to_string(d.path().join("kallsyms.txt")).unwrap(),
            "t uvm_ioctl\nT uvm_api_initialize\n"
        );
        clear_artifacts(d.path());
        assert!(!d.path().join("capture.json").exists());
    }
}

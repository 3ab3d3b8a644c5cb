//! Doctor bundles: one `.tar.gz` with what the collectors read on a machine, laid out as a
//! snapshot ([`Root::Snapshot`]) so that `uvmwatch doctor --root FILE.tar.gz` diagnoses
//! that machine again elsewhere. Layout and privacy notes: `docs/doctor-bundle.md`.
//!
//! [`write_bundle`] writes what a [`Recorder`] kept (only the files and parts of files the
//! collectors read, never whole directories), plus `evidence.json` and `manifest.json`.
//! [`open_bundle`] unpacks one into a private temporary directory, accepting only regular
//! files and directories whose paths stay inside it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;

use super::facts::{Evidence, Observations};
use super::root::{
    Manifest, Recorded, Recorder, Root, COMMANDS_DIR, EVIDENCE_FILE, MANIFEST_FILE, NODES_FILE,
    OBSERVATIONS_FILE, SNAPSHOT_FORMAT,
};

/// Most bytes [`open_bundle`] unpacks (1 GiB; a real bundle is well under 10 MiB).
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;

/// Most archive entries [`open_bundle`] accepts.
pub const MAX_ENTRIES: usize = 100_000;

/// Where the host name in the manifest comes from.
const HOSTNAME_PATH: &str = "/proc/sys/kernel/hostname";

/// Writes a bundle of what `recorder` kept while `evidence` was collected to `out`, a
/// gzip-compressed tar archive (the file is written under a temporary name next to `out`
/// and renamed, so `out` never holds half a bundle).
///
/// Archive members: each recorded file under its absolute path without the leading `/`
/// (`proc/cmdline`), each listed directory, `commands/<name>.txt` per captured command,
/// `dev/nodes.json`, `manifest.json` (see [`manifest_of`]), `evidence.json` and, when
/// given, `observations.json` (what the probes saw). Members are owned by root, mode 0644
/// (directories 0755), time-stamped now.
///
/// Errors: `out`'s directory is not writable, or writing fails.
pub fn write_bundle(
    recorder: &Recorder,
    evidence: &Evidence,
    observations: Option<&Observations>,
    out: &Path,
) -> Result<()> {
    let members = members(&recorder.recorded(), evidence, observations)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".uvmwatch-bundle-")
        .tempfile_in(parent)
        .with_context(|| format!("creating a temporary file in {}", parent.display()))?;
    let mtime = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    {
        let gz = flate2::write::GzEncoder::new(tmp.as_file(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for dir in &members.dirs {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            header.set_mtime(mtime);
            tar.append_data(&mut header, format!("{dir}/"), io::empty())
                .with_context(|| format!("adding {dir}/"))?;
        }
        for (path, bytes) in &members.files {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(bytes.len() as u64);
            header.set_mtime(mtime);
            tar.append_data(&mut header, path, bytes.as_slice())
                .with_context(|| format!("adding {path}"))?;
        }
        tar.into_inner()
            .context("finishing the archive")?
            .finish()
            .context("finishing the compression")?;
    }
    tmp.as_file().sync_all().context("flushing the bundle")?;
    tmp.persist(out)
        .map_err(|e| e.error)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// Writes the same snapshot as [`write_bundle`] as a plain directory tree under `dir`
/// (created if missing; existing files of the same names are replaced).
///
/// Errors: creating or writing under `dir` fails.
pub fn write_snapshot_dir(
    recorder: &Recorder,
    evidence: &Evidence,
    observations: Option<&Observations>,
    dir: &Path,
) -> Result<()> {
    let members = members(&recorder.recorded(), evidence, observations)?;
    for d in &members.dirs {
        fs::create_dir_all(dir.join(d)).with_context(|| format!("creating {d}"))?;
    }
    for (path, bytes) in &members.files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&target, bytes).with_context(|| format!("writing {}", target.display()))?;
    }
    Ok(())
}

/// The manifest of a bundle of `recorded`: format version, this uvmwatch's version, the
/// time now (RFC 3339, UTC), this machine's host name (`/proc/sys/kernel/hostname`), the
/// commands captured and those that failed, the links read, failed reads, missing paths and
/// filtered files.
pub fn manifest_of(recorded: &Recorded) -> Manifest {
    Manifest {
        format: SNAPSHOT_FORMAT,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        hostname: fs::read_to_string(HOSTNAME_PATH)
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        commands: recorded
            .commands
            .values()
            .map(|(entry, _)| entry.clone())
            .collect(),
        command_errors: recorded.command_errors.clone(),
        links: recorded.links.clone(),
        errors: recorded.errors.values().cloned().collect(),
        missing: recorded.missing.iter().cloned().collect(),
        filtered: recorded.filtered.iter().cloned().collect(),
    }
}

/// Archive members: directories (parents first) and files, by relative path.
struct Members {
    dirs: BTreeSet<String>,
    files: BTreeMap<String, Vec<u8>>,
}

impl Members {
    fn add_file(&mut self, rel: String, bytes: Vec<u8>) {
        let mut parent = Path::new(&rel).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            self.dirs.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
        self.files.insert(rel, bytes);
    }
}

fn members(
    recorded: &Recorded,
    evidence: &Evidence,
    observations: Option<&Observations>,
) -> Result<Members> {
    let mut m = Members {
        dirs: BTreeSet::new(),
        files: BTreeMap::new(),
    };
    for dir in &recorded.dirs {
        if let Some(rel) = machine_rel(dir) {
            if !rel.is_empty() {
                let mut p = Some(Path::new(&rel));
                while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
                    m.dirs.insert(d.to_string_lossy().into_owned());
                    p = d.parent();
                }
            }
        }
    }
    for (path, bytes) in &recorded.files {
        match machine_rel(path) {
            Some(rel) if !rel.is_empty() => m.add_file(rel, bytes.clone()),
            _ => tracing::debug!(path, "not saved in the bundle: not a plain absolute path"),
        }
    }
    m.dirs.insert(COMMANDS_DIR.to_string());
    for (entry, text) in recorded.commands.values() {
        m.add_file(entry.file.clone(), text.as_bytes().to_vec());
    }
    m.add_file(
        NODES_FILE.to_string(),
        serde_json::to_vec_pretty(&recorded.nodes_file())?,
    );
    m.add_file(
        MANIFEST_FILE.to_string(),
        serde_json::to_vec_pretty(&manifest_of(recorded))?,
    );
    m.add_file(
        EVIDENCE_FILE.to_string(),
        serde_json::to_vec_pretty(evidence)?,
    );
    if let Some(observations) = observations {
        m.add_file(
            OBSERVATIONS_FILE.to_string(),
            serde_json::to_vec_pretty(observations)?,
        );
    }
    Ok(m)
}

/// `path` of the diagnosed machine as an archive path (no leading `/`), or `None` when it
/// is not a plain absolute path or would land on one of the bundle's own files.
fn machine_rel(path: &str) -> Option<String> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return None;
    }
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => parts.push(n.to_str()?),
            _ => return None,
        }
    }
    let rel = parts.join("/");
    let reserved = rel == MANIFEST_FILE
        || rel == EVIDENCE_FILE
        || rel == OBSERVATIONS_FILE
        || rel == NODES_FILE
        || rel == COMMANDS_DIR
        || rel.starts_with(&format!("{COMMANDS_DIR}/"));
    (!reserved).then_some(rel)
}

/// Opens a bundle for diagnosis: a snapshot directory as it is, or a `.tar.gz` (or plain
/// `.tar`) unpacked into a new private temporary directory. Returns that directory's guard
/// (it is deleted when dropped; `None` for a directory) and the [`Root`] to collect from.
///
/// Unpacking accepts only regular files and directories whose paths are relative and free
/// of `..`, at most [`MAX_ENTRIES`] of them holding at most [`MAX_UNPACKED_BYTES`]; links,
/// devices and anything else make it fail, as does a directory that holds neither
/// `manifest.json`, `proc/` nor `dev/nodes.json`.
///
/// Errors: the path cannot be read, the archive is corrupt or refused (the reason names the
/// entry), or the directory does not look like a snapshot.
pub fn open_bundle(path: &Path) -> Result<(Option<TempDir>, Root)> {
    let meta = fs::metadata(path).with_context(|| format!("opening {}", path.display()))?;
    if meta.is_dir() {
        check_snapshot_dir(path)?;
        return Ok((None, Root::Snapshot(path.to_path_buf())));
    }
    let tmp = tempfile::Builder::new()
        .prefix("uvmwatch-doctor-")
        .tempdir()
        .context("creating a temporary directory")?;
    unpack(path, tmp.path()).with_context(|| format!("unpacking {}", path.display()))?;
    check_snapshot_dir(tmp.path()).with_context(|| format!("reading {}", path.display()))?;
    let root = Root::Snapshot(tmp.path().to_path_buf());
    Ok((Some(tmp), root))
}

/// The `evidence.json` a bundle was written with (what the machine showed at the time).
///
/// Errors: the snapshot has no `evidence.json` or it does not parse.
pub fn read_saved_evidence(dir: &Path) -> Result<Evidence> {
    let path = dir.join(EVIDENCE_FILE);
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

/// The `observations.json` a bundle was written with: `Ok(None)` when it has none.
///
/// Errors: the file exists but cannot be read or parsed.
pub fn read_saved_observations(dir: &Path) -> Result<Option<Observations>> {
    let path = dir.join(OBSERVATIONS_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("parsing {}", path.display())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

fn check_snapshot_dir(dir: &Path) -> Result<()> {
    if [MANIFEST_FILE, "proc", NODES_FILE]
        .iter()
        .any(|p| dir.join(p).exists())
    {
        Ok(())
    } else {
        bail!(
            "{} is not a doctor snapshot (no manifest.json, proc/ or dev/nodes.json)",
            dir.display()
        )
    }
}

fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let mut file = fs::File::open(archive)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut tar = tar::Archive::new(reader);
    let mut total = 0u64;
    for (count, entry) in tar.entries()?.enumerate() {
        if count >= MAX_ENTRIES {
            bail!("more than {MAX_ENTRIES} entries");
        }
        let mut entry = entry?;
        let name = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        let rel = safe_relative(&name)?;
        match kind {
            tar::EntryType::Directory => {
                if let Some(rel) = rel {
                    fs::create_dir_all(dest.join(rel))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let rel = rel.ok_or_else(|| anyhow!("file entry without a name"))?;
                let target = dest.join(&rel);
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent)
                        .with_context(|| format!("creating the directory of {}", rel.display()))?;
                }
                // Nothing in `dest` is a link (none are ever created), so this cannot be
                // redirected outside it.
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o644)
                    .open(&target)
                    .with_context(|| format!("creating {}", rel.display()))?;
                let budget = MAX_UNPACKED_BYTES - total;
                total += io::copy(&mut (&mut entry).take(budget + 1), &mut out)?;
                if total > MAX_UNPACKED_BYTES {
                    bail!("more than {MAX_UNPACKED_BYTES} bytes unpacked");
                }
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
            other => bail!(
                "refusing entry {} of type {other:?}: a bundle holds only files and directories",
                name.display()
            ),
        }
    }
    Ok(())
}

/// `name` as a relative path of plain components (`.` dropped); `None` for `.` itself.
fn safe_relative(name: &Path) -> Result<Option<PathBuf>> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => bail!(
                "refusing entry {}: its path leaves the bundle",
                name.display()
            ),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::collect::collect;
    use crate::doctor::root::{Op, ReadError};
    use uvmwatch_testbed::snapshot::*;

    /// Member names of a `.tar.gz`.
    fn member_names(path: &Path) -> Vec<String> {
        let gz = flate2::read::GzDecoder::new(fs::File::open(path).unwrap());
        let mut tar = tar::Archive::new(gz);
        tar.entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn live_round_trip() {
        let rec = Recorder::new();
        let root = Root::live(None).recording(&rec);
        let live = collect(&root);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("doctor.tar.gz");
        write_bundle(&rec, &live, None, &out).unwrap();

        let (guard, replay_root) = open_bundle(&out).unwrap();
        let snapshot_dir = guard.as_ref().unwrap().path().to_path_buf();
        let replay = collect(&replay_root);
        assert_eq!(replay, live);
        assert_eq!(read_saved_evidence(&snapshot_dir).unwrap(), live);
        assert_eq!(read_saved_observations(&snapshot_dir).unwrap(), None);

        let manifest = crate::doctor::root::read_manifest(&snapshot_dir);
        assert_eq!(manifest.format, SNAPSHOT_FORMAT);
        assert_eq!(manifest.agent_version, env!("CARGO_PKG_VERSION"));
        assert!(manifest.created.ends_with('Z'), "{}", manifest.created);
        if live.driver.get().is_none() {
            assert!(manifest
                .missing
                .contains(&"/proc/driver/nvidia/version".to_string()));
        }

        // Only what the collectors read: no whole /proc, no full environment, no maps of
        // processes without libcuda, no other process's name.
        let names = member_names(&out);
        assert!(names.contains(&"manifest.json".to_string()), "{names:?}");
        assert!(names.contains(&"evidence.json".to_string()));
        assert!(names.contains(&"dev/nodes.json".to_string()));
        assert!(names.contains(&"proc/cmdline".to_string()));
        assert!(
            names.contains(&"commands/dmesg.txt".to_string()) || live.kernel_log.value.is_err()
        );
        for name in &names {
            assert!(
                !name.ends_with("/maps") || !live.libcuda.get().unwrap().is_empty(),
                "{name}"
            );
            // A comm is kept for the daemons and for processes with libcuda mapped.
            assert!(
                !name.ends_with("/comm")
                    || !live.daemons.get().unwrap().is_empty()
                    || !live.libcuda.get().unwrap().is_empty(),
                "{name}"
            );
        }
        let environ = fs::read(snapshot_dir.join("proc/1/environ")).unwrap_or_default();
        for entry in environ.split(|&b| b == 0).filter(|e| !e.is_empty()) {
            assert!(
                entry.starts_with(b"container=") || entry == b"KUBERNETES_SERVICE_HOST=<redacted>",
                "{}",
                String::from_utf8_lossy(entry)
            );
        }
        drop(guard);
        assert!(!snapshot_dir.exists());
    }

    #[test]
    fn fixture_round_trip_keeps_every_fact() {
        let src = tempfile::tempdir().unwrap();
        let mut nodes = standard_nodes(2, 511);
        nodes[3] = NodeSpec::char("/dev/nvidia-uvm", 511, 0).with_open(Err("EPERM"));
        nodes.push(NodeSpec::char("/dev/nvidia-nvswitch0", 234, 0));
        let mut dmesg = boot_dmesg(&DriverSpec::open("590.48.01"), 511);
        dmesg.push_str(DMESG_HUNG_TASK_UVM);
        dmesg.push_str(DMESG_XID_79);
        let spec = SnapshotSpec {
            nodes,
            uvm_major: 511,
            dmesg: Some(dmesg),
            container: ContainerSpec::Kubernetes,
            device_allow: Some(vec!["c 195:* rwm".into(), "c 508:* rwm".into()]),
            daemons: vec!["nvidia-persistenced".into(), "nv-fabricmanager".into()],
            processes: vec![ProcessSpec {
                pid: 77,
                comm: "python3".into(),
                libcuda: vec!["/usr/lib64/libcuda.so.1".into()],
            }],
            ..SnapshotSpec::default()
        };
        write_snapshot_fixture(src.path(), &spec).unwrap();
        // A link to resolve and an unreadable file, as a live capture would have saved.
        let manifest = Manifest {
            links: BTreeMap::from([(
                "/proc/77/root/usr/lib64/libcuda.so.1".to_string(),
                "libcuda.so.590.48.01".to_string(),
            )]),
            errors: vec![ReadError {
                op: Op::Read,
                path: "/proc/iomem".into(),
                errno: Some(libc::EACCES),
                error: "Permission denied (os error 13)".into(),
            }],
            ..Manifest::default()
        };
        fs::write(
            src.path().join(MANIFEST_FILE),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        fs::remove_file(src.path().join("proc/iomem")).unwrap();

        let rec = Recorder::new();
        let original = collect(&Root::Snapshot(src.path().to_path_buf()).recording(&rec));
        assert_eq!(
            original.libcuda.get().unwrap()[0].version.as_deref(),
            Some("590.48.01")
        );
        assert_eq!(
            original.iomem_hmm.value.as_ref().unwrap_err().why,
            "not readable: Permission denied (os error 13)"
        );
        assert_eq!(original.kernel_log.get().unwrap().xids, [79]);

        let out = tempfile::tempdir().unwrap();
        let bundle = out.path().join("b.tar.gz");
        let observations = Observations {
            pid: Some(2817),
            cuinit_result: Some(3),
            failed_opens: vec![("/dev/nvidia-uvm".into(), "EPERM".into())],
            ..Observations::default()
        };
        write_bundle(&rec, &original, Some(&observations), &bundle).unwrap();
        let (guard, root) = open_bundle(&bundle).unwrap();
        assert_eq!(collect(&root), original);
        let unpacked = guard.as_ref().unwrap().path();
        assert_eq!(
            read_saved_observations(unpacked).unwrap(),
            Some(observations)
        );
        // The bundle's own files are not files of the machine.
        assert!(!root.exists("/observations.json"));

        // The same as an unpacked directory.
        let tree = out.path().join("tree");
        write_snapshot_dir(&rec, &original, None, &tree).unwrap();
        let (guard, root) = open_bundle(&tree).unwrap();
        assert!(guard.is_none());
        assert_eq!(collect(&root), original);
        // Processes of no interest were not saved.
        assert!(!tree.join("proc/1/comm").exists());
        assert!(tree.join("proc/1000/comm").exists());
        assert!(tree.join("proc/77/maps").exists());
        let maps = fs::read_to_string(tree.join("proc/77/maps")).unwrap();
        assert_eq!(maps.lines().count(), 2, "{maps}");
    }

    /// A tar archive with one raw entry (name and type written as given, no checks).
    fn raw_tar(name: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        let bytes = header.as_mut_bytes();
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            bytes[157..157 + link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_cksum();
        let mut tar = tar::Builder::new(Vec::new());
        tar.append(&header, data).unwrap();
        tar.into_inner().unwrap()
    }

    #[test]
    fn hostile_archives_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("../escape", tar::EntryType::Regular, None),
            ("proc/../../escape", tar::EntryType::Regular, None),
            ("/tmp/uvmwatch-absolute", tar::EntryType::Regular, None),
            ("proc/link", tar::EntryType::Symlink, Some("/etc/passwd")),
            ("proc/hard", tar::EntryType::Link, Some("etc/passwd")),
            ("dev/nvidia0", tar::EntryType::Char, None),
            ("proc/fifo", tar::EntryType::Fifo, None),
        ];
        for (name, kind, link) in cases {
            let path = dir.path().join("bad.tar");
            fs::write(&path, raw_tar(name, kind, b"x", link)).unwrap();
            let err = open_bundle(&path).unwrap_err();
            assert!(format!("{err:#}").contains("refusing"), "{name}: {err:#}");
        }
        assert!(!Path::new("/tmp/uvmwatch-absolute").exists());
        assert!(!dir.path().join("escape").exists());

        // A plain tar with a `./` prefix is fine.
        let path = dir.path().join("ok.tar");
        fs::write(
            &path,
            raw_tar("./proc/cmdline", tar::EntryType::Regular, b"ro\n", None),
        )
        .unwrap();
        let (_guard, root) = open_bundle(&path).unwrap();
        assert_eq!(root.read_to_string("/proc/cmdline").unwrap(), "ro\n");

        // Not an archive, not a snapshot, not there.
        fs::write(dir.path().join("junk.tar.gz"), b"\x1f\x8bjunk").unwrap();
        assert!(open_bundle(&dir.path().join("junk.tar.gz")).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(format!("{:#}", open_bundle(empty.path()).unwrap_err())
            .contains("not a doctor snapshot"));
        assert!(open_bundle(&dir.path().join("missing.tar.gz")).is_err());
    }

    #[test]
    fn reserved_and_odd_paths_are_not_archived() {
        assert_eq!(
            machine_rel("/proc/cmdline").as_deref(),
            Some("proc/cmdline")
        );
        assert_eq!(machine_rel("/manifest.json"), None);
        assert_eq!(machine_rel("/observations.json"), None);
        assert_eq!(machine_rel("/commands/x.txt"), None);
        assert_eq!(machine_rel("/dev/nodes.json"), None);
        assert_eq!(machine_rel("/proc/../etc"), None);
        assert_eq!(machine_rel("proc/cmdline"), None);
        assert_eq!(machine_rel("/commandsx").as_deref(), Some("commandsx"));
    }
}

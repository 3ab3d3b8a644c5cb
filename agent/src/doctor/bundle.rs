//! Doctor bundles: one `.tar.gz` with what the collectors read on a machine, laid out as a
//! snapshot ([`Root::Snapshot`]) so that `uvmwatch doctor --root FILE.tar.gz` diagnoses
//! that machine again elsewhere. Layout and privacy notes: `docs/doctor-bundle.md`.
//!
//! [`write_bundle`] writes what a [`ReadLog`] kept (only the files and parts of files the
//! collectors read, never whole directories), plus `evidence.json` and `manifest.json`.
//! [`open_bundle`] unpacks one into a private temporary directory, accepting only regular
//! files and directories whose paths stay inside it.
//!
//! Over 800 lines, half of them tests: writing and opening are one format and are kept
//! together, so that a change to the layout and its refusal tests (paths out of the
//! directory, links, devices, oversized members) are read side by side.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;

use super::facts::{Evidence, Observations};
use super::input::{self, clip, quote, read_file_limited, OBSERVATIONS_LIMIT};
use super::root::{
    Manifest, ReadLog, Recorded, Root, COMMANDS_DIR, EVIDENCE_FILE, MANIFEST_FILE, NODES_FILE,
    OBSERVATIONS_FILE, OBSERVATIONS_FORMAT, SNAPSHOT_FORMAT,
};

/// Most bytes [`open_bundle`] writes to disk in all (1 GiB; a real bundle is well under
/// 10 MiB).
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;

/// Most bytes of one archive entry [`open_bundle`] writes to disk (64 MiB, the largest
/// read limit of [`crate::doctor::input`]). Of a larger entry only its last 64 MiB are
/// written, at their offset, after a hole: the file keeps its size (reported as too large)
/// and its newest part (what the kernel log keeps), and takes no more disk.
pub const MAX_ENTRY_STORED_BYTES: u64 = 64 << 20;

/// Most bytes the entries of an archive may hold in all, written or skipped (4 GiB): this
/// bounds the time spent decompressing one.
pub const MAX_ARCHIVE_BYTES: u64 = 4 << 30;

/// Most archive entries [`open_bundle`] accepts.
pub const MAX_ENTRIES: usize = 100_000;

/// Most bytes of `observations.json` [`read_saved_observations`] reads
/// ([`OBSERVATIONS_LIMIT`]: 1 MiB; one written by uvmwatch holds a few KiB).
pub const MAX_OBSERVATIONS_BYTES: u64 = OBSERVATIONS_LIMIT.bytes;

/// Where the host name in the manifest comes from.
const HOSTNAME_PATH: &str = "/proc/sys/kernel/hostname";

/// Writes a bundle of what `recorder` kept while `evidence` was collected to `out`, a
/// gzip-compressed tar archive (the file is written under a temporary name next to `out`
/// and renamed, so `out` never holds half a bundle).
///
/// Archive members: each recorded file under its absolute path without the leading `/`
/// (`proc/cmdline`), each listed directory, `commands/<name>.txt` per captured command,
/// `dev/nodes.json`, `manifest.json` (see [`manifest_of`]), `evidence.json` and, when
/// given, `observations.json` (what the probes saw, [`observations_json`]). Members are
/// owned by root, mode 0644 (directories 0755), time-stamped now.
///
/// Errors: `out`'s directory is not writable, or writing fails.
pub fn write_bundle(
    recorder: &ReadLog,
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
    recorder: &ReadLog,
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
            observations_json(observations)?,
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
/// of `..`, at most [`MAX_ENTRIES`] of them holding at most [`MAX_ARCHIVE_BYTES`], of which
/// at most [`MAX_UNPACKED_BYTES`] are written ([`MAX_ENTRY_STORED_BYTES`] an entry); links,
/// devices and anything else make it fail, as does an empty file and a directory that
/// holds neither `manifest.json`, `proc/` nor `dev/nodes.json`.
///
/// Errors: the path cannot be read, is empty, the archive is corrupt or refused (the reason
/// names the entry), or it does not look like a snapshot. Every message names `path` as
/// given, never the temporary directory.
pub fn open_bundle(path: &Path) -> Result<(Option<TempDir>, Root)> {
    let meta = fs::metadata(path).with_context(|| format!("opening {}", path.display()))?;
    if meta.is_dir() {
        check_snapshot_dir(path, path)?;
        return Ok((None, Root::Snapshot(path.to_path_buf())));
    }
    if meta.len() == 0 {
        bail!(
            "{} is empty (0 bytes): not a doctor bundle (a .tar.gz written by `uvmwatch doctor \
             --bundle`)",
            path.display()
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("uvmwatch-doctor-")
        .tempdir()
        .context("creating a temporary directory")?;
    unpack(path, tmp.path()).with_context(|| format!("unpacking {}", path.display()))?;
    check_snapshot_dir(tmp.path(), path)?;
    let root = Root::Snapshot(tmp.path().to_path_buf());
    Ok((Some(tmp), root))
}

/// The snapshot files of `dir` that are there but cannot be used (`manifest.json`,
/// `dev/nodes.json`: not JSON, wrong types, too large), one line each, naming the file as
/// `<file> of <shown>` (`shown`: the bundle or directory the user gave). Empty when all
/// can be used. The reads that depend on such a file fail with the same reason
/// ([`crate::doctor::root`]); the report lists these lines too.
pub fn snapshot_problems(dir: &Path, shown: &Path) -> Vec<String> {
    use crate::doctor::root::{read_manifest, read_nodes};
    let mut out = Vec::new();
    let problems = [
        read_manifest(dir).err().map(|e| (MANIFEST_FILE, e)),
        read_nodes(dir).err().map(|e| (NODES_FILE, e)),
    ];
    for (file, err) in problems.into_iter().flatten() {
        let why = input::verdict(&err).unwrap_or_else(|| err.to_string());
        let why = why
            .strip_prefix(&format!("malformed: the snapshot's {file}: "))
            .map(|rest| format!("malformed: {rest}"))
            .unwrap_or(why);
        out.push(format!("{file} of {}: {why}", shown.display()));
    }
    out
}

/// The `evidence.json` a bundle was written with (what the machine showed at the time).
///
/// Errors: the snapshot has no `evidence.json` or it does not parse.
pub fn read_saved_evidence(dir: &Path) -> Result<Evidence> {
    let path = dir.join(EVIDENCE_FILE);
    let read = read_file_limited(&path, input::SNAPSHOT_METADATA_LIMIT)
        .with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&read.bytes).with_context(|| format!("parsing {}", path.display()))
}

/// The `observations.json` of a snapshot as read.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedObservations {
    /// What the probes saw.
    pub observations: Observations,
    /// The schema version the file declares (1 when it has no `format` field).
    pub format: u32,
    /// Fields of the file this uvmwatch does not know, as dotted paths (`ctx.flags`): a
    /// newer uvmwatch of the same format added them; they were ignored.
    pub ignored_fields: Vec<String>,
}

/// The contents of `observations.json` for `observations`: the `observations` object of
/// `uvmwatch doctor --json` with `"format": OBSERVATIONS_FORMAT` first.
///
/// Errors: only if serialization fails (it holds strings, numbers and sequences).
pub fn observations_json(observations: &Observations) -> Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct File<'a> {
        format: u32,
        #[serde(flatten)]
        observations: &'a Observations,
    }
    let mut bytes = serde_json::to_vec_pretty(&File {
        format: OBSERVATIONS_FORMAT,
        observations,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Reads the text of an `observations.json` ([`observations_json`]; schema in
/// `docs/doctor-bundle.md`). A file without `format` is version 1 (as written before the
/// field existed). A field missing from the file reads as its default; a field this
/// uvmwatch does not know is ignored and named in [`SavedObservations::ignored_fields`].
///
/// Errors (each message starts with what is wrong, never with a path): not JSON, not a JSON
/// object, a `format` that is not a positive integer or is newer than
/// [`OBSERVATIONS_FORMAT`], or a field of the wrong type or a nested one missing (with its
/// line and column).
pub fn parse_observations(bytes: &[u8]) -> Result<SavedObservations> {
    use serde_json::Value;
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| anyhow!("not valid JSON: {}", clip(e.to_string(), 300)))?;
    let Value::Object(mut object) = value else {
        bail!("not a JSON object (found {})", json_kind(&value));
    };
    let format = match object.remove("format") {
        None => 1,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v >= 1) => {
            u32::try_from(n.as_u64().unwrap_or(u64::MAX)).unwrap_or(u32::MAX)
        }
        Some(other) => bail!(
            "format must be a positive integer, found {}",
            clip(other.to_string(), 100)
        ),
    };
    if format > OBSERVATIONS_FORMAT {
        bail!(
            "format {format} is newer than this uvmwatch ({}) reads (format {OBSERVATIONS_FORMAT} \
             and older): use a newer uvmwatch",
            env!("CARGO_PKG_VERSION")
        );
    }
    // From the text again, so that a type error says where it is.
    let observations: Observations = serde_json::from_slice(bytes).map_err(|e| {
        anyhow!(
            "does not match the format {format} schema: {}",
            clip(e.to_string(), 300)
        )
    })?;
    let known = serde_json::to_value(&observations)?;
    let mut ignored_fields = Vec::new();
    unknown_fields(&Value::Object(object), &known, "", &mut ignored_fields);
    Ok(SavedObservations {
        observations,
        format,
        ignored_fields,
    })
}

/// The keys of `read` (recursively, through objects) that `known` lacks, as dotted paths.
fn unknown_fields(
    read: &serde_json::Value,
    known: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<String>,
) {
    let (Some(read), Some(known)) = (read.as_object(), known.as_object()) else {
        return;
    };
    for (key, value) in read {
        let path = format!("{prefix}{key}");
        match known.get(key) {
            None => out.push(path),
            Some(k) => unknown_fields(value, k, &format!("{path}."), out),
        }
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The `observations.json` of the snapshot in `dir` ([`parse_observations`]): `Ok(None)`
/// when it has none.
///
/// Errors: the file exists but cannot be read, is larger than [`MAX_OBSERVATIONS_BYTES`],
/// or [`parse_observations`] refuses it. The message says what is wrong; the caller names
/// the file (as `observations.json`, not by its temporary path).
pub fn read_saved_observations(dir: &Path) -> Result<Option<SavedObservations>> {
    let read = match read_file_limited(&dir.join(OBSERVATIONS_FILE), OBSERVATIONS_LIMIT) {
        Ok(read) => read,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => match input::verdict(&err) {
            Some(verdict) => bail!("{verdict}: not a file uvmwatch wrote"),
            None => bail!("cannot be read: {err}"),
        },
    };
    parse_observations(&read.bytes).map(Some)
}

/// Fails unless `dir` looks like a snapshot; the message names `shown`, the directory or
/// bundle the user gave.
fn check_snapshot_dir(dir: &Path, shown: &Path) -> Result<()> {
    if [MANIFEST_FILE, "proc", NODES_FILE]
        .iter()
        .any(|p| dir.join(p).exists())
    {
        Ok(())
    } else {
        bail!(
            "{} is not a doctor snapshot (no manifest.json, proc/ or dev/nodes.json)",
            shown.display()
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
    let mut declared = 0u64;
    for (count, entry) in tar.entries()?.enumerate() {
        if count >= MAX_ENTRIES {
            bail!("more than {MAX_ENTRIES} entries");
        }
        let mut entry = entry?;
        let name = entry.path()?.into_owned();
        let size = entry.size();
        declared = declared.saturating_add(size);
        if declared > MAX_ARCHIVE_BYTES {
            bail!(
                "more than {MAX_ARCHIVE_BYTES} bytes in its entries (at {})",
                quote(name.as_os_str().as_encoded_bytes())
            );
        }
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
                if size > MAX_ENTRY_STORED_BYTES {
                    // Only the newest part is kept, at its offset; the file keeps its size.
                    let skipped = size - MAX_ENTRY_STORED_BYTES;
                    io::copy(&mut (&mut entry).take(skipped), &mut io::sink())?;
                    out.set_len(size)?;
                    out.seek(SeekFrom::Start(skipped))?;
                }
                let budget = MAX_UNPACKED_BYTES - total;
                total += io::copy(&mut (&mut entry).take(budget + 1), &mut out)?;
                if total > MAX_UNPACKED_BYTES {
                    bail!("more than {MAX_UNPACKED_BYTES} bytes unpacked");
                }
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
            other => bail!(
                "refusing entry {} of type {other:?}: a bundle holds only files and directories",
                quote(name.as_os_str().as_encoded_bytes())
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
                quote(name.as_os_str().as_encoded_bytes())
            ),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::cause::CauseId;
    use crate::doctor::collect::collect;
    use crate::doctor::engine::diagnose;
    use crate::doctor::finding::{Finding, Severity};
    use crate::doctor::observed::{ObservationsSource, Origin};
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
        let rec = ReadLog::new();
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

        let manifest = crate::doctor::root::read_manifest(&snapshot_dir).unwrap();
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

        let rec = ReadLog::new();
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
        let saved = read_saved_observations(unpacked).unwrap().unwrap();
        assert_eq!(saved.observations, observations);
        assert_eq!(
            (saved.format, saved.ignored_fields.len()),
            (OBSERVATIONS_FORMAT, 0)
        );
        let text = fs::read_to_string(unpacked.join(OBSERVATIONS_FILE)).unwrap();
        assert!(text.starts_with("{\n  \"format\": 1,\n"), "{text}");
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
    fn a_large_entry_keeps_its_size_and_newest_part_but_not_the_disk() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let size = MAX_ENTRY_STORED_BYTES + (8 << 20);
        let tail = b"\n[ 9999.000000] NVRM: the newest line\n";
        let path = dir.path().join("big.tar");
        {
            let mut tar = tar::Builder::new(fs::File::create(&path).unwrap());
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(size);
            header.set_cksum();
            let body = io::repeat(b'x')
                .take(size - tail.len() as u64)
                .chain(&tail[..]);
            tar.append_data(&mut header, "commands/dmesg.txt", body)
                .unwrap();
            tar.append_data(
                &mut header.clone(),
                "proc/cmdline",
                io::repeat(b'y').take(size),
            )
            .unwrap();
            tar.into_inner().unwrap();
        }
        let (guard, root) = open_bundle(&path).unwrap();
        let unpacked = guard.as_ref().unwrap().path().join("commands/dmesg.txt");
        let meta = fs::metadata(&unpacked).unwrap();
        assert_eq!(meta.len(), size);
        assert!(
            meta.blocks() * 512 <= MAX_ENTRY_STORED_BYTES + (1 << 20),
            "{}",
            meta.blocks()
        );
        let log = root.kernel_log().unwrap();
        assert!(log.text.ends_with("[ 9999.000000] NVRM: the newest line\n"));
        assert_eq!(log.dropped_bytes + log.text.len() as u64, size);
        assert_eq!(
            crate::doctor::input::verdict(&root.read_bytes("/proc/cmdline").unwrap_err()).unwrap(),
            format!("too large ({size} bytes, limit 1048576)")
        );
        // The bytes an archive holds are bounded too (at MAX_ARCHIVE_BYTES), and an empty
        // file is refused by its name.
        let empty = dir.path().join("empty.tar.gz");
        fs::write(&empty, b"").unwrap();
        assert_eq!(
            open_bundle(&empty).unwrap_err().to_string(),
            format!(
                "{} is empty (0 bytes): not a doctor bundle (a .tar.gz written by `uvmwatch \
                 doctor --bundle`)",
                empty.display()
            )
        );
    }

    #[test]
    fn malformed_snapshot_files_are_named_with_the_users_path() {
        let dir = tempfile::tempdir().unwrap();
        let shown = Path::new("/home/me/incident.tar.gz");
        assert!(snapshot_problems(dir.path(), shown).is_empty());
        fs::create_dir_all(dir.path().join("dev")).unwrap();
        fs::write(dir.path().join(super::NODES_FILE), b"[1, 2]").unwrap();
        fs::write(dir.path().join(super::MANIFEST_FILE), b"{}").unwrap();
        assert_eq!(
            snapshot_problems(dir.path(), shown),
            [
                "dev/nodes.json of /home/me/incident.tar.gz: malformed: not valid: invalid type: \
              integer `1`, expected a sequence at line 1 column 2"
            ]
        );
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

    #[test]
    fn observations_files_are_read_by_their_format_and_unknown_fields_named() {
        // As written.
        let o = Observations {
            pid: Some(7),
            cuinit_result: Some(3),
            failed_opens: vec![("/dev/nvidia-uvm".into(), "EPERM".into())],
            ..Observations::default()
        };
        let saved = parse_observations(&observations_json(&o).unwrap()).unwrap();
        assert_eq!(
            saved,
            SavedObservations {
                observations: o,
                format: OBSERVATIONS_FORMAT,
                ignored_fields: vec![],
            }
        );
        // Without `format` (written before the field existed), fields missing: version 1,
        // defaults.
        let saved = parse_observations(br#"{"pid": 9, "cuinit_in_flight": true}"#).unwrap();
        assert_eq!(saved.format, 1);
        assert_eq!(
            saved.observations,
            Observations {
                pid: Some(9),
                cuinit_in_flight: true,
                ..Observations::default()
            }
        );
        // Fields of a newer uvmwatch of the same format: read, and named as ignored.
        let saved = parse_observations(
            br#"{"format": 1, "cuinit_result": 46, "context_create": {"result": 46},
                 "stuck_in": {"call": "UVM_REGISTER_GPU", "node": "/dev/nvidia-uvm",
                              "result": "", "seconds": 3.0, "tid": 12}}"#,
        )
        .unwrap();
        assert_eq!(saved.observations.cuinit_result, Some(46));
        assert_eq!(saved.observations.stuck_in.unwrap().seconds, 3.0);
        assert_eq!(saved.ignored_fields, ["context_create", "stuck_in.tid"]);
    }

    #[test]
    fn malformed_observations_files_are_refused_with_what_is_wrong() {
        let cases: [(&[u8], &str); 8] = [
            (b"", "not valid JSON: EOF while parsing"),
            (b"{\"pid\": 1,", "not valid JSON"),
            (b"[1, 2]", "not a JSON object (found an array)"),
            (
                b"{\"format\": \"1\"}",
                "format must be a positive integer, found \"1\"",
            ),
            (
                b"{\"format\": 0}",
                "format must be a positive integer, found 0",
            ),
            (b"{\"format\": 2}", "format 2 is newer than this uvmwatch"),
            (
                b"{\"cuinit_result\": \"three\"}",
                "does not match the format 1 schema: invalid type: string \"three\"",
            ),
            (
                b"{\"failed_call\": {\"node\": \"/dev/nvidia-uvm\"}}",
                "does not match the format 1 schema: missing field `call`",
            ),
        ];
        for (bytes, want) in cases {
            let err = format!("{:#}", parse_observations(bytes).unwrap_err());
            assert!(
                err.starts_with(want),
                "{:?}: {err}",
                String::from_utf8_lossy(bytes)
            );
        }
        // Through the snapshot directory: absent, too large, unreadable.
        let dir = tempfile::tempdir().unwrap();
        assert!(read_saved_observations(dir.path()).unwrap().is_none());
        let path = dir.path().join(OBSERVATIONS_FILE);
        let mut big = b"{\"kernel_signals\": [\"".to_vec();
        big.resize(MAX_OBSERVATIONS_BYTES as usize + 10, b'x');
        big.extend_from_slice(b"\"]}");
        fs::write(&path, &big).unwrap();
        let err = format!("{:#}", read_saved_observations(dir.path()).unwrap_err());
        assert_eq!(
            err,
            "too large (1048589 bytes, limit 1048576): not a file uvmwatch wrote"
        );
        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        let err = format!("{:#}", read_saved_observations(dir.path()).unwrap_err());
        assert!(err.starts_with("cannot be read: "), "{err}");
    }

    /// Optional fields may be `null` or missing (another tool's file, or a value its writer
    /// did not know): they read as empty, and the file is judged, not refused.
    #[test]
    fn null_and_missing_optional_fields_are_read_as_empty() {
        let saved = parse_observations(
            b"{\"pid\": 7, \"cuinit_result\": null, \"failed_opens\": null, \
              \"kernel_signals\": null, \"cuinit_in_flight\": null, \"device_opens\": null, \
              \"failed_call\": {\"call\": \"UVM_REGISTER_GPU\", \"node\": null, \
              \"result\": \"NV_ERR_NO_MEMORY\", \"seconds\": null}, \
              \"stuck_in\": {\"call\": \"UVM_FREE\"}}",
        )
        .unwrap();
        let o = &saved.observations;
        assert_eq!(o.pid, Some(7));
        assert!(o.failed_opens.is_empty() && o.kernel_signals.is_empty());
        assert!(!o.cuinit_in_flight && o.device_opens == 0);
        let c = o.failed_call.as_ref().unwrap();
        assert_eq!(
            (
                c.call.as_str(),
                c.node.as_str(),
                c.result.as_str(),
                c.seconds
            ),
            ("UVM_REGISTER_GPU", "", "NV_ERR_NO_MEMORY", 0.0)
        );
        assert_eq!(c.what(), "UVM_REGISTER_GPU");
        assert_eq!(o.stuck_in.as_ref().unwrap().what(), "UVM_FREE");
    }

    /// The diagnosis of the snapshot tree of `spec` with the observations of `--probe`
    /// (`None`: a plain run), and the diagnosis of the bundle that run wrote, read back: the
    /// library calls of `doctor [--probe] --bundle`, then of `doctor --root` on the bundle.
    fn diagnosis_before_and_after_a_bundle(
        spec: &SnapshotSpec,
        probed: Option<Observations>,
    ) -> (Vec<Finding>, Vec<Finding>, ObservationsSource) {
        let src = tempfile::tempdir().unwrap();
        write_snapshot_fixture(src.path(), spec).unwrap();
        let rec = ReadLog::new();
        let evidence = collect(&Root::Snapshot(src.path().to_path_buf()).recording(&rec));
        let (judged, source) = ObservationsSource::choose(probed, None);
        let before = diagnose(&evidence, &judged).findings;

        let out = tempfile::tempdir().unwrap();
        let bundle = out.path().join("b.tar.gz");
        write_bundle(&rec, &evidence, source.kept_in_bundle(&judged), &bundle).unwrap();
        let (guard, root) = open_bundle(&bundle).unwrap();
        let saved = read_saved_observations(guard.as_ref().unwrap().path()).transpose();
        let (read_back, source) = ObservationsSource::choose(None, saved);
        assert_eq!(read_back, judged);
        let after = diagnose(&collect(&root), &read_back).findings;
        (before, after, source)
    }

    #[test]
    fn a_bundle_keeps_the_gpu_list_and_how_nvidia_smi_ended() {
        for spec in [
            SnapshotSpec::default(),
            gpuless_550(),
            driver_refused_no_gpu(),
        ] {
            let src = tempfile::tempdir().unwrap();
            write_snapshot_fixture(src.path(), &spec).unwrap();
            let rec = ReadLog::new();
            let original = collect(&Root::Snapshot(src.path().to_path_buf()).recording(&rec));
            let out = tempfile::tempdir().unwrap();
            let bundle = out.path().join("b.tar.gz");
            write_bundle(&rec, &original, None, &bundle).unwrap();
            let (_guard, root) = open_bundle(&bundle).unwrap();
            let replayed = collect(&root);
            assert_eq!(replayed.gpus, original.gpus);
            assert_eq!(replayed.smi_outcome, original.smi_outcome);
            assert_eq!(replayed, original);
            // Only the directories are kept, not the files the driver has in them.
            let names = member_names(&bundle);
            assert!(
                names.iter().all(|n| !n.ends_with("/information")),
                "{names:?}"
            );
        }
        // Two GPUs listed, the empty list of a GPU-less host, the verdicts.
        let e = |spec: &SnapshotSpec| {
            let src = tempfile::tempdir().unwrap();
            write_snapshot_fixture(src.path(), spec).unwrap();
            collect(&Root::Snapshot(src.path().to_path_buf()))
        };
        assert_eq!(
            e(&SnapshotSpec::default()).gpus.get().unwrap(),
            &["0000:18:00.0", "0000:2a:00.0"]
        );
        assert_eq!(e(&gpuless_550()).gpus.get().unwrap(), &Vec::<String>::new());
        let (before, after, _) = diagnosis_before_and_after_a_bundle(&gpuless_550(), None);
        assert_eq!(before[0].rule, "no_gpu");
        assert_eq!(after, before);
        let (before, after, _) =
            diagnosis_before_and_after_a_bundle(&driver_refused_no_gpu(), None);
        assert_eq!(before[0].rule, "no_gpu");
        assert_eq!(after, before);
    }

    #[test]
    fn a_bundle_with_observations_gives_the_findings_of_the_run_that_wrote_it() {
        use crate::doctor::fixtures::{incident_spec, register_gpu_no_memory, watched, Saw};
        // The motivating incident, observed: hmm_setup_failure, critical.
        let (before, after, source) =
            diagnosis_before_and_after_a_bundle(&incident_spec(), Some(register_gpu_no_memory()));
        assert_eq!(before[0].rule, "hmm_setup_failure");
        assert_eq!(before[0].severity, Severity::Critical);
        assert_eq!(after, before);
        assert_eq!(source.from, Origin::Snapshot);
        assert!(source.snapshot_file.unwrap().used);

        // A failure no rule explains on a healthy host: still there after the round trip.
        let (before, after, _) = diagnosis_before_and_after_a_bundle(
            &SnapshotSpec::default(),
            Some(watched().cuinit(999, 0.1).opens(4)),
        );
        assert_eq!(before.len(), 1, "{before:#?}");
        assert_eq!(before[0].rule, CauseId::UnexplainedFailure);
        assert_eq!(after, before);

        // Near miss: only successes were observed: no finding before or after.
        let (before, after, source) = diagnosis_before_and_after_a_bundle(
            &SnapshotSpec::default(),
            Some(watched().cuinit(0, 0.3).opens(4)),
        );
        assert_eq!((before.as_slice(), after.as_slice()), (&[][..], &[][..]));
        assert_eq!(source.from, Origin::Snapshot);

        // Nothing observed (a plain `doctor --bundle` of the incident): a bundle without
        // observations.json, judged on the static facts alone, as before.
        let (before, after, source) = diagnosis_before_and_after_a_bundle(&incident_spec(), None);
        assert_eq!(after, before);
        assert!(before.iter().all(|f| f.rule != CauseId::UnexplainedFailure));
        assert_eq!(source.from, Origin::None);
    }
}

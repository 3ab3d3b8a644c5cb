//! `uvmwatch doctor --root` on hostile input: a 1 GiB fact file in a snapshot directory and
//! in a bundle, random bytes in the snapshot's own JSON files, binary content, empty and
//! foreign bundles. The real binary runs; its peak memory (`wait4`'s `ru_maxrss`), output
//! size and time are measured and printed. No root needed.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::Instant;

use serde_json::Value;
use uvmwatch_testbed::{write_snapshot_fixture, SnapshotSpec};

/// Peak memory `doctor` may take on any snapshot (issue 11: under 200 MB).
const MAX_RSS_BYTES: u64 = 200 * 1000 * 1000;
/// Most output (stdout and stderr) `doctor` may print on any snapshot (under 1 MB).
const MAX_OUTPUT_BYTES: usize = 1000 * 1000;

const ONE_GIB: u64 = 1 << 30;

/// One run of the real binary and what it cost.
struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    max_rss_bytes: u64,
    seconds: f64,
}

impl Run {
    fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr)
        )
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    /// Asserts the bounds of issue 11 and prints the figures.
    fn within_bounds(&self, what: &str) {
        let output = self.stdout.len() + self.stderr.len();
        eprintln!(
            "doctor_input {what}: max RSS {:.1} MB, output {output} bytes, {:.2} s, exit {:?}",
            self.max_rss_bytes as f64 / 1e6,
            self.seconds,
            self.status.code()
        );
        assert!(
            self.max_rss_bytes < MAX_RSS_BYTES,
            "{what}: max RSS {} bytes",
            self.max_rss_bytes
        );
        assert!(
            output < MAX_OUTPUT_BYTES,
            "{what}: {output} bytes of output"
        );
        assert!(self.status.signal().is_none(), "{what}: {:?}", self.status);
    }
}

/// `uvmwatch doctor <args>`, reaped with `wait4` so that its own peak memory is known.
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also gives its rusage"
)]
fn doctor(args: &[&str], root: &Path) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .arg("doctor")
        .args(args)
        .arg("--root")
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let collect = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            pipe.read_to_end(&mut buf).unwrap();
            buf
        })
    };
    let stdout = collect(Box::new(child.stdout.take().unwrap()));
    let stderr = collect(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; `pid` is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", io::Error::last_os_error());
    Run {
        status: ExitStatus::from_raw(status),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        // Linux reports ru_maxrss in KiB.
        max_rss_bytes: usage.ru_maxrss as u64 * 1024,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn healthy_snapshot() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("uvmwatch-input")
        .tempdir()
        .unwrap();
    write_snapshot_fixture(dir.path(), &SnapshotSpec::default()).unwrap();
    dir
}

/// The `evidence.<name>` fact's reason for being unknown in a JSON report.
fn why(report: &Value, fact: &str) -> String {
    report["evidence"][fact]["value"]["Err"]["why"]
        .as_str()
        .unwrap_or_else(|| panic!("{fact} is known: {}", report["evidence"][fact]))
        .to_string()
}

#[test]
fn a_1_gib_fact_file_in_a_snapshot_is_reported_too_large_in_bounded_memory_and_output() {
    let dir = healthy_snapshot();
    let version = dir.path().join("proc/driver/nvidia/version");
    // Sparse: 1 GiB long, no disk taken.
    fs::File::create(&version)
        .unwrap()
        .set_len(ONE_GIB)
        .unwrap();

    let run = doctor(&["--json"], dir.path());
    run.within_bounds("snapshot dir, 1 GiB version file (json)");
    let report = run.json();
    assert_eq!(
        why(&report, "driver"),
        "too large (1073741824 bytes, limit 1048576)"
    );
    assert_eq!(
        report["evidence"]["driver"]["source"],
        "/proc/driver/nvidia/version"
    );

    let run = doctor(&["--no-color"], dir.path());
    run.within_bounds("snapshot dir, 1 GiB version file (text)");
    let text = run.text();
    assert!(
        text.contains("too large (1073741824 bytes, limit 1048576)")
            && text.contains("/proc/driver/nvidia/version"),
        "{text}"
    );

    // A 1 GiB kernel log: only its newest part is read, and the report says so.
    fs::write(&version, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  (dvs-builder@U16)  Tue Dec  2 01:12:40 UTC 2025\n").unwrap();
    let dmesg = dir.path().join("commands/dmesg.txt");
    let mut log = fs::OpenOptions::new().append(true).open(&dmesg).unwrap();
    log.set_len(ONE_GIB).unwrap();
    log.write_all(b"\n[ 9999.000000] NVRM: the newest line\n")
        .unwrap();
    drop(log);
    let run = doctor(&["--json"], dir.path());
    run.within_bounds("snapshot dir, 1 GiB kernel log (json)");
    let report = run.json();
    let kernel_log = &report["evidence"]["kernel_log"]["value"]["Ok"];
    assert!(kernel_log["dropped_bytes"].as_u64().unwrap() > ONE_GIB - (16 << 20));
    assert_eq!(
        kernel_log["nvidia_lines"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        "[ 9999.000000] NVRM: the newest line"
    );
}

/// A `.tar.gz` of the snapshot in `dir` with `big` (a path inside it) replaced by `size`
/// bytes of `x`, streamed through the archive without being held in memory.
fn bundle_with_a_large_entry(dir: &Path, big: &str, size: u64, out: &Path) {
    fs::remove_file(dir.join(big)).unwrap();
    let gz =
        flate2::write::GzEncoder::new(fs::File::create(out).unwrap(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all(".", dir).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(size);
    header.set_cksum();
    tar.append_data(&mut header, big, io::repeat(b'x').take(size))
        .unwrap();
    tar.into_inner().unwrap().finish().unwrap();
}

#[test]
fn a_bundle_with_a_1_gib_entry_is_unpacked_in_bounded_memory_and_disk() {
    let dir = healthy_snapshot();
    let out = tempfile::tempdir().unwrap();
    let bundle = out.path().join("big.tar.gz");
    let started = Instant::now();
    bundle_with_a_large_entry(dir.path(), "proc/driver/nvidia/version", ONE_GIB, &bundle);
    eprintln!(
        "doctor_input: bundle of {} bytes written in {:.1} s",
        fs::metadata(&bundle).unwrap().len(),
        started.elapsed().as_secs_f64()
    );

    let run = doctor(&["--json"], &bundle);
    run.within_bounds("bundle, 1 GiB version entry (json)");
    let report = run.json();
    assert_eq!(
        why(&report, "driver"),
        "too large (1073741824 bytes, limit 1048576)"
    );
    // Everything else of the snapshot was read.
    assert!(report["evidence"]["kernel"]["value"]["Ok"].is_object());
    assert!(report["evidence"]["dev_nodes"]["value"]["Ok"].is_array());
}

#[test]
fn random_bytes_in_the_snapshots_own_files_are_reported_malformed() {
    let dir = healthy_snapshot();
    // Deterministic noise (xorshift), binary and control bytes included.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    };
    fs::write(dir.path().join("dev/nodes.json"), noise(4096)).unwrap();
    fs::write(dir.path().join("manifest.json"), noise(4096)).unwrap();

    let run = doctor(&["--json"], dir.path());
    run.within_bounds("random dev/nodes.json and manifest.json (json)");
    assert_eq!(run.status.code(), Some(3), "{}", run.text());
    let report = run.json();
    assert_eq!(report["status"], "unknown");
    // Never an empty list of nodes: the fact is unknown, with the file named.
    let nodes = why(&report, "dev_nodes");
    assert!(
        nodes.starts_with("malformed: the snapshot's dev/nodes.json: not valid: "),
        "{nodes}"
    );
    let problems: Vec<&str> = report["snapshot_problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let shown = dir.path().display().to_string();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with(&format!("manifest.json of {shown}: malformed: not valid: ")),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with(&format!(
            "dev/nodes.json of {shown}: malformed: not valid: "
        )),
        "{problems:?}"
    );

    let run = doctor(&["--no-color"], dir.path());
    run.within_bounds("random dev/nodes.json and manifest.json (text)");
    let text = run.text();
    assert!(
        text.contains("could not use the snapshot's own files:")
            && text.contains("manifest.json of ")
            && text.contains("dev/nodes.json of "),
        "{text}"
    );
}

#[test]
fn binary_content_is_never_echoed_raw() {
    let dir = healthy_snapshot();
    let mut binary = b"\x1b[2J\x1b]0;pwned\x07NVRM\x00\xff\xfe".to_vec();
    binary.extend(std::iter::repeat_n(b'\x9b', 5000));
    fs::write(dir.path().join("proc/driver/nvidia/version"), &binary).unwrap();
    fs::write(dir.path().join("proc/devices"), &binary).unwrap();

    for args in [&["--no-color"][..], &["--json"][..]] {
        let run = doctor(args, dir.path());
        run.within_bounds("binary version and devices files");
        let out = [run.stdout.as_slice(), run.stderr.as_slice()].concat();
        let text = String::from_utf8(out).expect("the report is UTF-8");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?}: {text:?}"
        );
        // Escaped and cut, with the file's size.
        assert!(
            text.contains(r"\u{1b}[2J") || text.contains(r"\\u{1b}[2J"),
            "{text}"
        );
        assert!(text.contains("…") && text.contains(" bytes)"), "{text}");
    }
    let report = doctor(&["--json"], dir.path()).json();
    assert!(
        why(&report, "devices").starts_with("malformed: line 1 is not `<major> <name>`"),
        "{}",
        why(&report, "devices")
    );
}

#[test]
fn empty_and_foreign_bundles_are_refused_naming_the_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.tar.gz");
    fs::write(&empty, b"").unwrap();
    let run = doctor(&[], &empty);
    run.within_bounds("empty bundle");
    assert_eq!(run.status.code(), Some(3));
    let text = run.text();
    assert!(
        text.contains(&format!("{} is empty (0 bytes)", empty.display())),
        "{text}"
    );

    // A valid archive of something else: named by the user's path, not the unpacking
    // directory.
    let foreign = dir.path().join("photos.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        fs::File::create(&foreign).unwrap(),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "cat.jpg", &b"jpg"[..])
        .unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    let run = doctor(&[], &foreign);
    let text = run.text();
    assert_eq!(run.status.code(), Some(3));
    assert!(
        text.contains(&format!("{} is not a doctor snapshot", foreign.display())),
        "{text}"
    );
    assert!(!text.contains("uvmwatch-doctor-"), "{text}");
    // The time an archive takes is bounded too: well under a minute here.
    assert!(run.seconds < 60.0);
}

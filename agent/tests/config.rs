//! `uvmwatch run --config FILE`: precedence defaults < file < environment < flags, and
//! clear errors for bad files. No root needed (`--print-config` exits before loading).

use std::process::Command;

fn print_config(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uvmwatch"));
    c.arg("run").args(args).arg("--print-config");
    for k in [
        "UVMWATCH_LISTEN",
        "UVMWATCH_IOCTL_STALL",
        "UVMWATCH_CONFIG",
        "UVMWATCH_LOG",
        "UVMWATCH_LIBCUDA",
        "UVMWATCH_NO_PROC_SCAN",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("{key} missing:\n{out}"))
}

#[test]
fn file_sits_between_defaults_and_environment_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("uvmwatch.toml");
    std::fs::write(
        &f,
        "listen = \"127.0.0.1:19999\"\ncuinit-stall = \"7s\"\nioctl-stall = \"9s\"\n\
         slow-ioctl = \"4s\"\nlibcuda = [\"/a/libcuda.so.1\", \"/b/libcuda.so.1\"]\n\
         no-proc-scan = true\nlog-level = \"debug\"\n",
    )
    .unwrap();
    let path = f.to_str().unwrap();
    let (rc, out, err) = print_config(
        &["--config", path, "--slow-ioctl", "2s"],
        &[("UVMWATCH_IOCTL_STALL", "3s")],
    );
    assert_eq!(rc, 0, "{err}");
    assert_eq!(line(&out, "listen"), "listen = \"127.0.0.1:19999\"  # file");
    assert_eq!(line(&out, "cuinit-stall"), "cuinit-stall = \"7s\"  # file");
    assert_eq!(
        line(&out, "ioctl-stall"),
        "ioctl-stall = \"3s\"  # env:UVMWATCH_IOCTL_STALL"
    );
    assert_eq!(line(&out, "slow-ioctl"), "slow-ioctl = \"2s\"  # flag");
    assert_eq!(
        line(&out, "libcuda"),
        "libcuda = \"/a/libcuda.so.1,/b/libcuda.so.1\"  # file"
    );
    assert_eq!(
        line(&out, "no-proc-scan"),
        "no-proc-scan = \"true\"  # file"
    );
    assert_eq!(line(&out, "log-level"), "log-level = \"debug\"  # file");
    assert_eq!(
        line(&out, "diagnosis-ttl"),
        "diagnosis-ttl = \"10m\"  # default"
    );
    // The file can also come from UVMWATCH_CONFIG.
    let (rc, out, _) = print_config(&[], &[("UVMWATCH_CONFIG", path)]);
    assert_eq!(rc, 0);
    assert_eq!(line(&out, "cuinit-stall"), "cuinit-stall = \"7s\"  # file");
}

/// The probe flags (declared once for run, capture, probes and doctor) take their
/// variables: the libcuda paths `:`-separated, the switch as a boolean.
#[test]
fn probe_flags_come_from_the_environment() {
    let (rc, out, err) = print_config(
        &[],
        &[
            ("UVMWATCH_LIBCUDA", "/a/libcuda.so.1:/b/libcuda.so.1"),
            ("UVMWATCH_NO_PROC_SCAN", "true"),
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        line(&out, "libcuda"),
        "libcuda = \"/a/libcuda.so.1,/b/libcuda.so.1\"  # env:UVMWATCH_LIBCUDA"
    );
    assert_eq!(
        line(&out, "no-proc-scan"),
        "no-proc-scan = \"true\"  # env:UVMWATCH_NO_PROC_SCAN"
    );
    assert_eq!(
        line(&out, "cuinit-stall"),
        "cuinit-stall = \"20s\"  # default"
    );
}

#[test]
fn bad_files_are_refused_with_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("lisen = \"x\"\n", "unknown key `lisen`"),
        ("listen = \n", "not valid TOML"),
        ("no-proc-scan = \"yes\"\n", "key `no-proc-scan` is a switch"),
        ("cuinit-stall = \"soon\"\n", "key `cuinit-stall`"),
        // Durations are thresholds and intervals: zero is meaningless.
        (
            "cuinit-stall = \"0s\"\n",
            "key `cuinit-stall`: invalid value '0s'",
        ),
        ("log-repeat-window = \"0ms\"\n", "must be more than zero"),
        ("ioctl-stall = \"-1s\"\n", "key `ioctl-stall`"),
        // A number is not a path, nor a duration without its unit.
        (
            "libcuda = 5\n",
            "key `libcuda`: expected a string, not the number 5",
        ),
        ("cuinit-stall = 20\n", "cuinit-stall = \"20s\""),
        ("listen = 19400\n", "key `listen`: expected a string"),
        ("listen = \"localhost\"\n", "key `listen`: invalid value"),
        ("libcuda = true\n", "key `libcuda` takes a value"),
        // A header is sent to an OTLP endpoint: without one it means nothing.
        (
            "otlp-header = [\"a=b\"]\n",
            "keys from the file: `otlp-header`",
        ),
        ("[run]\nlisten = \"x\"\n", "key `run`"),
        // A float would lose digits (535.10 is 535.1).
        ("driver-version = 535.10\n", "write the version as a string"),
    ];
    for (text, want) in cases {
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, text).unwrap();
        let (rc, _, err) = print_config(&["--config", f.to_str().unwrap()], &[]);
        assert_eq!(rc, 2, "{text}: {err}");
        assert!(err.contains(want), "{text}: {err}");
        assert!(err.contains("bad.toml"), "{text}: {err}");
    }
    // The same checks for flags and the environment (clap names the flag there).
    for (args, env, want) in [
        (
            vec!["--cuinit-stall", "0s"],
            vec![],
            "must be more than zero",
        ),
        (
            vec![],
            vec![("UVMWATCH_IOCTL_STALL", "0s")],
            "must be more than zero",
        ),
        (vec!["--otlp-header", "a=b"], vec![], "--otlp-endpoint"),
    ] {
        let (rc, _, err) = print_config(&args, &env);
        assert_eq!(rc, 2, "{args:?} {env:?}: {err}");
        assert!(err.contains(want), "{args:?} {env:?}: {err}");
    }
    let (rc, _, err) = print_config(&["--config", "/nonexistent/uvmwatch.toml"], &[]);
    assert_eq!(rc, 2);
    assert!(err.contains("/nonexistent/uvmwatch.toml"), "{err}");
}

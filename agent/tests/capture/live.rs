//! The real agent (root only) captures the testbed's success and hang scenarios, and a capture
//! interrupted by SIGINT still leaves a valid file.

use super::*;

/// The command line refuses two process filters at once (no root needed).
#[test]
fn capture_cli_takes_one_process_filter() {
    let o = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
        .args([
            "capture",
            "--pid",
            "1",
            "--comm",
            "x",
            "-o",
            "/tmp/never-written",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
}

/// A running `uvmwatch capture`, its JSON log read as it comes.
struct CaptureRun {
    child: Child,
    log: Arc<Mutex<Vec<Value>>>,
    raw: Arc<Mutex<Vec<String>>>,
    out: PathBuf,
    started: Instant,
}

impl CaptureRun {
    fn start(out: &Path, format: &str, extra: &[&str]) -> CaptureRun {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uvmwatch"))
            .args(["--log-format", "json", "--log-level", "info", "capture"])
            .args(["--format", format, "-o"])
            .arg(out)
            .args(["--cuinit-stall", "1s", "--ioctl-stall", "1s"])
            .args(common::host_lib().flags())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uvmwatch capture");
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<Value>>> = Default::default();
        let raw: Arc<Mutex<Vec<String>>> = Default::default();
        let (l2, r2) = (log.clone(), raw.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                r2.lock().unwrap().push(line.clone());
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l2.lock().unwrap().push(v);
                }
            }
        });
        let mut c = CaptureRun {
            child,
            log,
            raw,
            out: out.to_path_buf(),
            started: Instant::now(),
        };
        c.wait_log(
            "started",
            |v| v["event"] == "started",
            Duration::from_secs(30),
        );
        c.started = Instant::now();
        c
    }

    fn raw_log(&self) -> String {
        self.raw.lock().unwrap().join("\n")
    }

    fn wait_log(&self, what: &str, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = self.log.lock().unwrap().iter().find(|v| pred(v)) {
                return v.clone();
            }
            if Instant::now() > end {
                panic!(
                    "no {what} within {timeout:?}; capture log:\n{}",
                    self.raw_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit; returns whether it succeeded.
    fn wait(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!(
                    "capture still running after {timeout:?}:\n{}",
                    self.raw_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// The written file as a [`View`] (Perfetto: through Perfetto's definitions), and the
    /// capture as uvmwatch reads it back.
    fn view(&self, python: Option<&Path>) -> (View, Capture) {
        let bytes = std::fs::read(&self.out)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", self.out.display(), self.raw_log()));
        let leftovers: Vec<_> = std::fs::read_dir(self.out.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let back = capture::decode_capture(&bytes).expect("uvmwatch reads its capture back");
        let view = match python {
            Some(py) => View::from_perfetto(&decode_with_perfetto(py, &self.out)),
            None => View::from_chrome(&serde_json::from_slice(&bytes).unwrap()),
        };
        (view, back)
    }
}

impl Drop for CaptureRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn workload(dev: &FakeDev, scenario: Scenario) -> Workload {
    Workload::spawn(
        dev,
        common::artifacts(),
        WorkloadConfig {
            scenario,
            gpus: 1,
            wait_ms: 0,
            lib_location: common::host_lib().location(),
            fork_child: false,
            extra_env: vec![],
        },
    )
    .expect("spawn workload")
}

fn hang_dev() -> FakeDev {
    FakeDev::start(
        common::artifacts(),
        FakeDevConfig {
            ioctl_rules: vec![IoctlRule::new(0x25, IoctlAction::Hang)],
            ..FakeDevConfig::default()
        },
    )
    .unwrap()
}

/// The format's name on the command line and, for Perfetto, the decoder (or why not).
fn format_setup(test: &str, format: Format) -> Option<(&'static str, Option<PathBuf>)> {
    match format {
        Format::ChromeJson => Some(("chrome-json", None)),
        Format::Perfetto => match perfetto_python() {
            Ok(p) => Some(("perfetto", Some(p))),
            Err(why) => {
                uvmwatch_testbed::skip(test, &why);
                None
            }
        },
    }
}

/// Captures the success and the hang scenario at once for 6 s, the hang released 3.5 s
/// after its workload started; checks tracks, nesting, stalls and the drop counter.
fn success_and_hang(test: &str, format: Format) {
    let Some((fmt, python)) = format_setup(test, format) else {
        return;
    };
    let ok_dev = FakeDev::start(common::artifacts(), FakeDevConfig::default()).unwrap();
    let hang = hang_dev();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("capture.{fmt}"));
    let mut cap = CaptureRun::start(&out, fmt, &["--duration", "6s", "--comm", "cuda-workload"]);
    let mut ok = workload(&ok_dev, Scenario::Success);
    let spawned = Instant::now();
    let mut hung = workload(&hang, Scenario::HangRegisterGpu);
    assert_eq!(ok.next_cuinit_line(T).unwrap().rc, 0);
    cap.wait_log(
        "the hang's stall",
        |v| {
            v["event"] == "stall"
                && v["call"] == "UVM_REGISTER_GPU"
                && v["pid"].as_u64() == Some(hung.pid() as u64)
        },
        T,
    );
    let release_at = spawned + Duration::from_millis(3500);
    std::thread::sleep(release_at.saturating_duration_since(Instant::now()));
    hang.release().unwrap();
    assert_eq!(hung.next_cuinit_line(T).unwrap().rc, 0);
    let ended_before = cap.started.elapsed();
    assert!(
        ended_before < Duration::from_millis(5500),
        "the hang ended {ended_before:?} after the capture started: too late for a 6 s capture"
    );
    assert!(
        cap.wait(Duration::from_secs(30)),
        "capture failed:\n{}",
        cap.raw_log()
    );
    assert!(
        !cap.raw_log().contains("events from"),
        "no progress line when stderr is not a terminal"
    );
    let written = cap.wait_log("capture_written", |v| v["event"] == "capture_written", T);
    assert_eq!(written["dropped_events"], 0);
    let (view, back) = cap.view(python.as_deref());

    let (okp, hp) = (ok.pid(), hung.pid());
    for pid in [okp, hp] {
        assert_eq!(
            view.processes.get(&pid).map(String::as_str),
            Some("cuda-workload"),
            "process track of {pid}: {:?}",
            view.processes
        );
        assert!(
            view.threads.contains_key(&(pid, pid)),
            "thread track of {pid}"
        );
        assert_eq!(back.process(pid).unwrap().name, "cuda-workload");
    }
    // Only processes that pass the filter (other tests' workloads may run meanwhile).
    let agent = cap.child.id();
    for (pid, name) in &view.processes {
        assert!(
            *pid == agent || name == "cuda-workload",
            "process {pid} ({name}) does not match --comm cuda-workload"
        );
    }
    // Success: a cuInit slice holding the UVM_* ioctls, each on nvidia-uvm.
    let cu = view.slices_named(okp, "cuInit");
    assert_eq!(cu.len(), 1, "{:?}", view.slices);
    let cu = cu[0];
    assert_eq!(cu.args["result"], "CUDA_SUCCESS");
    for name in UVM_SEQUENCE {
        let s = view
            .slices_named(okp, name)
            .into_iter()
            .find(|s| s.tid == cu.tid)
            .unwrap_or_else(|| panic!("{name} slice missing: {:?}", view.slices));
        assert!(
            s.start >= cu.start && s.end <= cu.end,
            "{name} inside cuInit"
        );
        assert_eq!(s.args["node"], "/dev/nvidia-uvm");
        assert_eq!(s.args["result"], "NV_OK");
        assert_eq!(s.args["in_cuinit"], true);
    }
    assert!(
        view.counter_values(Some(okp), "ioctls per 100 ms")
            .iter()
            .sum::<i64>()
            >= UVM_SEQUENCE.len() as i64
    );
    // Hang: stall instants at detection time, inside the calls, before they ended.
    let hcu = view.slices_named(hp, "cuInit");
    assert_eq!(hcu.len(), 1);
    let hcu = hcu[0];
    assert_eq!(hcu.args["result"], "CUDA_SUCCESS");
    assert!(hcu.args.get("unfinished").is_none());
    let reg = view
        .slices_named(hp, "UVM_REGISTER_GPU")
        .into_iter()
        .find(|s| s.tid == hcu.tid)
        .unwrap();
    assert!(reg.start >= hcu.start && reg.end <= hcu.end);
    assert!(reg.end - reg.start >= S as i128, "the hang lasted");
    for (call, span) in [("cuInit", hcu), ("UVM_REGISTER_GPU", reg)] {
        let st = view
            .instant(hp, &format!("stall: {call}"))
            .unwrap_or_else(|| panic!("no stall instant for {call}: {:?}", view.instants));
        assert_eq!(st.tid, Some(hcu.tid));
        assert!(
            st.ts >= span.start + S as i128,
            "{call}: detected after the 1 s threshold"
        );
        assert!(st.ts < span.end, "{call}: detected before the call ended");
        assert_eq!(st.args["wchan"], "request_wait_answer");
        assert!(st.args["thread_state"].as_str().unwrap().starts_with('S'));
        let end = view.instant(hp, &format!("stall ended: {call}")).unwrap();
        assert_eq!(end.args["outcome"], "returned");
        assert_eq!(end.ts, span.end);
    }
    assert_eq!(
        view.instant(hp, "stall: cuInit").unwrap().args["inside"],
        "UVM_REGISTER_GPU on /dev/nvidia-uvm"
    );
    // The drop counter is there, at 0, and so is the metadata.
    let dropped = view.counter_values(None, "dropped events");
    assert!(!dropped.is_empty(), "dropped-events counter");
    assert!(dropped.iter().all(|v| *v == 0), "{dropped:?}");
    assert_eq!(back.meta.dropped_events, 0);
    assert_eq!(back.meta.lost_events, 0);
    assert_eq!(back.meta.filter, "comm=cuda-workload");
    let ended = view
        .instants
        .iter()
        .find(|p| p.name == "capture ended")
        .unwrap();
    assert_eq!(ended.args["dropped_events"], 0);
}

/// SIGINT while a cuInit hangs: exit 0 and a valid file whose hung calls are drawn up to
/// the end, marked unfinished.
fn sigint_mid_capture(test: &str, format: Format) {
    let Some((fmt, python)) = format_setup(test, format) else {
        return;
    };
    let hang = hang_dev();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("interrupted.{fmt}"));
    let mut cap = CaptureRun::start(&out, fmt, &["--duration", "60s"]);
    let hung = workload(&hang, Scenario::HangRegisterGpu);
    let hp = hung.pid();
    cap.wait_log(
        "stall",
        |v| {
            v["event"] == "stall"
                && v["call"] == "UVM_REGISTER_GPU"
                && v["pid"].as_u64() == Some(hp as u64)
        },
        T,
    );
    std::thread::sleep(
        Duration::from_secs(2).saturating_sub(cap.started.elapsed()) + Duration::from_millis(200),
    );
    cap.signal(libc::SIGINT);
    assert!(
        cap.wait(Duration::from_secs(20)),
        "capture failed:\n{}",
        cap.raw_log()
    );
    let (view, back) = cap.view(python.as_deref());
    hang.release().unwrap();
    let cu = view.slices_named(hp, "cuInit");
    assert_eq!(cu.len(), 1, "{:?}", view.slices);
    assert_eq!(cu[0].args["unfinished"], true);
    let reg = view.slices_named(hp, "UVM_REGISTER_GPU");
    assert_eq!(reg.len(), 1);
    assert_eq!(reg[0].args["unfinished"], true);
    assert_eq!(reg[0].args["node"], "/dev/nvidia-uvm");
    assert!(view.instant(hp, "stall: UVM_REGISTER_GPU").is_some());
    assert!(!view.counter_values(None, "dropped events").is_empty());
    assert!(view.instants.iter().any(|p| p.name == "capture ended"));
    assert!(back.meta.end_ns > back.meta.start_ns);
    assert_eq!(cu[0].end, back.meta.end_ns as i128);
}

#[test]
fn capture_perfetto_success_and_hang() {
    require_env!("capture_perfetto_success_and_hang");
    success_and_hang("capture_perfetto_success_and_hang", Format::Perfetto);
}

#[test]
fn capture_chrome_json_success_and_hang() {
    require_env!("capture_chrome_json_success_and_hang");
    success_and_hang("capture_chrome_json_success_and_hang", Format::ChromeJson);
}

#[test]
fn capture_perfetto_sigint_leaves_a_valid_file() {
    require_env!("capture_perfetto_sigint_leaves_a_valid_file");
    sigint_mid_capture(
        "capture_perfetto_sigint_leaves_a_valid_file",
        Format::Perfetto,
    );
}

#[test]
fn capture_chrome_json_sigint_leaves_a_valid_file() {
    require_env!("capture_chrome_json_sigint_leaves_a_valid_file");
    sigint_mid_capture(
        "capture_chrome_json_sigint_leaves_a_valid_file",
        Format::ChromeJson,
    );
}

use super::run::{parse_server_log, parse_trace, Call, ServerCall, Target, UVM_DEINITIALIZE};
use super::*;
use crate::fakedev::FakeDevConfig;
use crate::nv;
use crate::rules::{IoctlAction, IoctlRule, OpenDenial};
use crate::workload::Scenario;

use super::run::CUINIT_LAYOUT as LAYOUT;

const HEADER: &str = "source https://example.org/capture strace of x\n\
                      driver 535.104.05\n\
                      recorder strace\n\
                      coverage partial\n";

fn parse(body: &str) -> Result<Replay, ParseError> {
    Replay::parse("t", "t.replay", &format!("{HEADER}{body}"))
}

/// The error message for `body` (after the 4-line header), checking it names `t.replay:line`.
fn error_at(body: &str, line: usize) -> String {
    let e = parse(body).expect_err("must not parse");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("t.replay:{line}: ")),
        "expected an error at line {line}, got: {shown}"
    );
    e.message
}

#[test]
fn every_embedded_replay_parses_and_every_file_is_embedded() {
    for replay in Replay::all().unwrap() {
        assert!(!replay.steps.is_empty(), "{}", replay.name);
        assert!(!replay.sources.is_empty());
        assert!(
            replay.name.starts_with(&replay.driver),
            "{}: name starts with the driver",
            replay.name
        );
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(REPLAY_DIR)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".replay").map(str::to_string)
        })
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = Replay::names().into_iter().map(str::to_string).collect();
    embedded.sort();
    assert_eq!(
        on_disk, embedded,
        "REPLAY_FILES must list every file of {REPLAY_DIR}"
    );
    // The embedded text is the file's.
    for name in Replay::names() {
        let from_disk =
            Replay::load_file(&Path::new(REPLAY_DIR).join(format!("{name}.replay"))).unwrap();
        assert_eq!(from_disk.steps, Replay::load(name).unwrap().steps);
    }
}

#[test]
fn the_535_capture_has_the_real_order() {
    let r = Replay::load("535.104.05-h100-cumemory").unwrap();
    assert_eq!(r.driver, "535.104.05");
    assert_eq!(r.recorder, "nvtrace");
    assert_eq!(r.requests, Requests::Derived);
    let opens: Vec<&str> = r.opens().map(|(_, o)| o.path.as_str()).collect();
    assert_eq!(
        opens,
        [
            "/dev/nvidiactl",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/nvidia0",
            "/dev/nvidia0",
            "/dev/nvidia0",
            "/dev/nvidia0"
        ]
    );
    assert_eq!(r.ioctls().count(), 93);
    let nodes = r.ioctl_nodes();
    // The version query is the first session's RM_CONTROL, before the close and reopen.
    let (vq_line, vq_node, vq) = nodes.iter().find(|(_, _, i)| i.version_query).unwrap();
    assert_eq!(vq_node.as_deref(), Some("/dev/nvidiactl"));
    assert_eq!(vq.ctrl, Some(0x101));
    let close_line = r
        .steps
        .iter()
        .find(|s| matches!(s.kind, StepKind::Close { fd: 3 }))
        .unwrap()
        .line;
    assert!(vq_line < &close_line);
    // UVM_PAGEABLE_MEM_ACCESS before any ioctl on a GPU node; 0xC9 and 0xD7 on /dev/nvidia0;
    // UVM_REGISTER_GPU after them.
    let pos = |pred: &dyn Fn(Option<&str>, &IoctlStep) -> bool| {
        nodes
            .iter()
            .position(|(_, n, i)| pred(n.as_deref(), i))
            .unwrap()
    };
    let gpu = Some("/dev/nvidia0");
    let pma = pos(&|_, i| i.request == nv::UVM_PAGEABLE_MEM_ACCESS);
    let first_gpu = pos(&|n, _| n == gpu);
    let numa = pos(&|n, i| n == gpu && i.request & 0xff == 0xd7);
    let register = pos(&|_, i| i.request == nv::UVM_REGISTER_GPU);
    assert!(pma < first_gpu && first_gpu < numa && numa < register);
    assert_eq!(nodes[first_gpu].2.request, 0xC004_46C9);
    assert_eq!(nodes[numa].2.request, 0xC230_46D7);
}

#[test]
fn parse_errors_name_file_and_line() {
    // Header problems.
    assert!(error_at("bogus 1\n", 5).contains("unknown keyword 'bogus'"));
    assert!(error_at("driver 550.1\n", 5).contains("second 'driver'"));
    let e = Replay::parse("t", "t.replay", "driver 5x5\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.replay:1: bad driver version '5x5' (digits and dots, e.g. 535.104.05)"
    );
    let e = Replay::parse("t", "t.replay", "source http://x\n").unwrap_err();
    assert_eq!((e.line, e.message.contains("https://")), (1, true));
    let e = Replay::parse(
        "t",
        "t.replay",
        "# c\nsource https://x y\ndriver 1.2\n\nopen /dev/nvidiactl O_RDWR openat -> fd 3\n",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.replay:5: header has no 'recorder' line before the first step"
    );
    assert!(error_at("", 4).contains("no steps"));
    assert!(
        error_at("open /dev/nvidiactl O_RDWR openat -> fd 3\nnote late\n", 6)
            .contains("after the first step")
    );
    // Step problems.
    assert!(error_at("open nvidiactl O_RDWR openat -> fd 3\n", 5).contains("under /dev/"));
    assert!(
        error_at("open /dev/nvidiactl O_RDWR|O_WRONLY openat -> fd 3\n", 5).contains("exactly one")
    );
    assert!(error_at("open /dev/nvidiactl O_FOO openat -> fd 3\n", 5)
        .contains("unknown open flag 'O_FOO'"));
    assert!(error_at("open /dev/nvidiactl O_RDWR creat -> fd 3\n", 5)
        .contains("unknown open system call"));
    assert!(error_at("open /dev/nvidiactl O_RDWR openat = 3\n", 5).contains("bad open step"));
    assert!(
        error_at("open /dev/nvidiactl O_RDWR openat -> EWHAT\n", 5).contains("unknown errno name")
    );
    assert!(error_at(
        "open /dev/nvidiactl O_RDWR openat -> fd 3\nopen /dev/nvidia0 O_RDWR openat -> fd 3\n",
        6
    )
    .contains("still open"));
    assert!(error_at("ioctl 3 0x25\n", 5).contains("fd 3, which is not open"));
    assert!(error_at("close 4\n", 5).contains("not open"));
    assert!(
        error_at("ioctl -5 0x30000002 size 0\n", 5).contains("no earlier open failed with errno 5")
    );
    let body = "open /dev/nvidiactl O_RDWR openat -> fd 3\n";
    assert!(error_at(&format!("{body}ioctl 3 0xc020462a size 32\n"), 6)
        .contains("size is only for plain-integer"));
    assert!(
        error_at(&format!("{body}ioctl 3 0xc030462b ctrl 0x101\n"), 6)
            .contains("not NV_ESC_RM_CONTROL")
    );
    assert!(error_at(&format!("{body}ioctl 3 25\n"), 6).contains("bad request '25'"));
    assert!(error_at(&format!("{body}ioctl 3 0x25 size\n"), 6).contains("'size' needs a value"));
    assert!(
        error_at(&format!("{body}ioctl 3 0x25 fast\n"), 6).contains("unknown ioctl field 'fast'")
    );
    // A failed open's -errno is a usable descriptor; a flagged step parses.
    let r = parse("open /dev/nvidia-uvm O_RDWR|O_CLOEXEC openat -> EIO inferred\nioctl -5 0x30000002 size 0\n").unwrap();
    assert!(r.steps[0].inferred);
    assert_eq!(
        r.steps[0].kind,
        StepKind::Open(OpenStep {
            path: "/dev/nvidia-uvm".into(),
            flags: libc::O_RDWR | libc::O_CLOEXEC,
            flags_text: "O_RDWR|O_CLOEXEC".into(),
            syscall: OpenSyscall::Openat,
            result: OpenResult::Errno(libc::EIO),
        })
    );
    assert!(Replay::load("nope")
        .unwrap_err()
        .to_string()
        .starts_with("testbed/replays/nope.replay:0: no replay named"));
}

#[test]
fn layout_tables_are_checked() {
    let r = Replay::load("535.104.05-h100-cumemory").unwrap();
    let run = ReplayRun::new(r.clone(), LAYOUT).unwrap();
    let reg = run
        .planned_ioctls()
        .iter()
        .find(|p| p.request == nv::UVM_REGISTER_GPU)
        .unwrap();
    assert_eq!(
        (reg.size, reg.status_offset, reg.node.as_deref()),
        (40, Some(36), Some("/dev/nvidia-uvm"))
    );
    let card = run
        .planned_ioctls()
        .iter()
        .find(|p| p.request & 0xff == 0xc8)
        .unwrap();
    assert_eq!((card.size, card.status_offset), (0x900, None));

    let no_pma: Vec<_> = LAYOUT
        .iter()
        .copied()
        .filter(|r| r.0 != nv::UVM_PAGEABLE_MEM_ACCESS)
        .collect();
    let e = ReplayRun::new(r.clone(), &no_pma).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("testbed/replays/535.104.05-h100-cumemory.replay:"),
        "{e}"
    );
    assert!(e.message.contains("no params size for 0x27"), "{e}");
    let mut wrong = LAYOUT.to_vec();
    wrong.push((0xC004_46C9, 8, None));
    assert!(ReplayRun::new(r.clone(), &wrong)
        .unwrap_err()
        .message
        .contains("encodes 4"));
    let mut past = LAYOUT.to_vec();
    past[3] = (nv::UVM_REGISTER_GPU, 40, Some(38));
    assert!(ReplayRun::new(r.clone(), &past)
        .unwrap_err()
        .message
        .contains("past its 40"));
    let mut twice = LAYOUT.to_vec();
    twice.push(LAYOUT[0]);
    assert!(ReplayRun::new(r, &twice)
        .unwrap_err()
        .message
        .contains("two rows"));
    // A recorded size must agree with the table.
    let eio = Replay::load("580.95.05-rtx3060-uvm-eio").unwrap();
    ReplayRun::new(eio.clone(), LAYOUT).unwrap();
    assert!(ReplayRun::new(eio, &[(UVM_DEINITIALIZE, 16, None)])
        .unwrap_err()
        .message
        .contains("shows 0 bytes"));
}

#[test]
fn step_files_carry_sizes_offsets_and_planted_statuses() {
    let run = ReplayRun::new(Replay::load("535.104.05-h100-cumemory").unwrap(), LAYOUT).unwrap();
    let file = run.step_file(Scenario::Success);
    let lines: Vec<&str> = file.lines().collect();
    assert_eq!(lines[0], "uvmwatch-replay 1");
    assert_eq!(lines[1], "O openat 2 3 1 stop /dev/nvidiactl");
    assert_eq!(lines[2], "I 3 0xc00846d6 8 -1 0x0");
    assert!(lines.contains(&"C 3"));
    assert!(lines.contains(&"O openat 524290 4 1 uvm /dev/nvidia-uvm"));
    assert!(lines.contains(&"I 4 0x30000001 16 8 0x0"));
    assert!(lines.contains(&"I 4 0x25 40 36 0x0"));
    assert_eq!(lines.len(), 1 + run.replay().steps.len());
    let failing = run.step_file(Scenario::RegisterGpuNoMemory);
    assert!(failing.contains("I 4 0x25 40 36 0x51\n"));
    let planted = run
        .clone()
        .plant(nv::NV_ESC_RM_ALLOC, 0x1f)
        .step_file(Scenario::Success);
    assert!(planted.contains("I 3 0xc030462b 48 40 0x1f\n"));
    let eio = ReplayRun::new(Replay::load("580.95.05-rtx3060-uvm-eio").unwrap(), LAYOUT).unwrap();
    assert_eq!(
        eio.step_file(Scenario::Success),
        "uvmwatch-replay 1\nO openat 524290 -5 0 uvm /dev/nvidia-uvm\nO openat 2 -5 0 uvm /dev/nvidia-uvm\nI -5 0x30000002 0 -1 0x0\n"
    );
}

fn ioctl_requests(calls: &[Call]) -> Vec<u32> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Ioctl { request, .. } => Some(*request),
            _ => None,
        })
        .collect()
}

#[test]
fn expected_calls_follow_the_scenario() {
    let run = ReplayRun::new(Replay::load("535.104.05-h100-cumemory").unwrap(), LAYOUT).unwrap();
    let dev = FakeDevConfig::default();
    let ok = run.expected(&dev, Scenario::Success);
    assert_eq!(ok.cuinit_rc, 0);
    assert_eq!(ok.ioctls().count(), 93);
    assert_eq!(
        ok.calls
            .iter()
            .filter(|c| matches!(c, Call::Close { .. }))
            .count(),
        2
    );
    let server = ok.server_calls(&dev);
    assert_eq!(
        server[0],
        ServerCall::Open {
            node: "nvidiactl".into(),
            errno: None
        }
    );
    assert!(server.contains(&ServerCall::Ioctl {
        node: "nvidia0".into(),
        request: 0xC230_46D7,
        in_size: 0x230,
        out_size: 0x230
    }));
    assert!(server.contains(&ServerCall::Ioctl {
        node: "nvidia-uvm".into(),
        request: nv::UVM_INITIALIZE,
        in_size: 0,
        out_size: 0
    }));

    // NV_ERR_NO_MEMORY in UVM_REGISTER_GPU: stops there with 3, closing what is open.
    let nomem = run.expected(&dev, Scenario::RegisterGpuNoMemory);
    assert_eq!(nomem.cuinit_rc, nv::CUDA_ERROR_NOT_INITIALIZED);
    assert_eq!(
        ioctl_requests(&nomem.calls).last(),
        Some(&nv::UVM_REGISTER_GPU)
    );
    assert!(matches!(nomem.calls.last(), Some(Call::Close { .. })));

    // A missing /dev/nvidia-uvm: retried without O_CLOEXEC, UVM_DEINITIALIZE on -ENOENT, 999.
    let omit = FakeDevConfig {
        omit: vec!["nvidia-uvm".into()],
        ..FakeDevConfig::default()
    };
    let missing = run.expected(&omit, Scenario::MissingNode);
    assert_eq!(missing.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    let uvm: Vec<&Call> = missing
        .calls
        .iter()
        .filter(|c| match c {
            Call::Open { path, .. } => path == "/dev/nvidia-uvm",
            Call::Ioctl { target, .. } => matches!(target, Target::Fd(_)),
            _ => false,
        })
        .collect();
    assert_eq!(
        uvm,
        [
            &Call::Open {
                path: "/dev/nvidia-uvm".into(),
                flags: libc::O_RDWR | libc::O_CLOEXEC,
                syscall: OpenSyscall::Openat,
                result: Err(libc::ENOENT)
            },
            &Call::Open {
                path: "/dev/nvidia-uvm".into(),
                flags: libc::O_RDWR,
                syscall: OpenSyscall::Openat,
                result: Err(libc::ENOENT)
            },
            &Call::Ioctl {
                target: Target::Fd(-libc::ENOENT),
                request: UVM_DEINITIALIZE,
                size: 0,
                status_offset: None,
                status: None,
                result: Err(libc::EBADF)
            }
        ]
    );
    // Denied: the same with EPERM, and the server sees both opens.
    let deny = FakeDevConfig {
        deny: vec![OpenDenial::new("nvidia-uvm", libc::EPERM)],
        ..FakeDevConfig::default()
    };
    let denied = run.expected(&deny, Scenario::Success);
    assert_eq!(denied.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    assert!(denied.calls.iter().any(|c| matches!(
        c,
        Call::Ioctl {
            target: Target::Fd(-1),
            ..
        }
    )));
    let denied_opens = denied
        .server_calls(&deny)
        .into_iter()
        .filter(|c| matches!(c, ServerCall::Open { errno: Some(e), .. } if *e == libc::EPERM))
        .count();
    assert_eq!(denied_opens, 2);

    // A failing ioctl syscall stops with 999.
    let eagain = FakeDevConfig {
        ioctl_rules: vec![IoctlRule::new(
            nv::UVM_INITIALIZE,
            IoctlAction::Errno(libc::EAGAIN),
        )],
        ..FakeDevConfig::default()
    };
    let failed = run.expected(&eagain, Scenario::Success);
    assert_eq!(failed.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    assert_eq!(
        ioctl_requests(&failed.calls).last(),
        Some(&nv::UVM_INITIALIZE)
    );

    // The recorded failing capture: as recorded when the node fails the same way; diverged
    // (999 right after the open) when it opens.
    let eio = ReplayRun::new(Replay::load("580.95.05-rtx3060-uvm-eio").unwrap(), LAYOUT).unwrap();
    let eio_dev = FakeDevConfig {
        deny: vec![OpenDenial::new("nvidia-uvm", libc::EIO)],
        ..FakeDevConfig::default()
    };
    let e = eio.expected(&eio_dev, Scenario::Success);
    assert_eq!(e.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    assert_eq!(e.calls.len(), 3);
    assert!(matches!(
        &e.calls[2],
        Call::Ioctl {
            target: Target::Fd(-5),
            request: UVM_DEINITIALIZE,
            ..
        }
    ));
    let diverged = eio.expected(&dev, Scenario::Success);
    assert_eq!(diverged.cuinit_rc, nv::CUDA_ERROR_UNKNOWN);
    assert_eq!(diverged.calls.len(), 2, "{:?}", diverged.calls);
}

#[test]
fn traces_and_server_logs_parse() {
    let trace = "open openat 2 /dev/nvidiactl 7\n\
                 ioctl 7 0xc020462a 32 0 28 0x0\n\
                 open openat 524290 /dev/nvidia-uvm -2\n\
                 ioctl -2 0x30000002 0 -9 -1 -\n\
                 close 7 0\n\
                 result 999\n";
    let (calls, rc) = parse_trace(trace).unwrap();
    assert_eq!(rc, Some(999));
    assert_eq!(
        calls[1],
        Call::Ioctl {
            target: Target::Node("/dev/nvidiactl".into()),
            request: nv::NV_ESC_RM_CONTROL,
            size: 32,
            status_offset: Some(28),
            status: Some(0),
            result: Ok(())
        }
    );
    assert!(matches!(
        &calls[3],
        Call::Ioctl {
            target: Target::Fd(-2),
            result: Err(9),
            status: None,
            ..
        }
    ));
    assert_eq!(
        calls[4],
        Call::Close {
            path: "/dev/nvidiactl".into()
        }
    );
    assert!(parse_trace("ioctl 9 0x25 40 0 36 0x0\n")
        .unwrap_err()
        .contains("unknown fd 9"));
    assert!(parse_trace("frob\n").unwrap_err().contains("trace line 1"));

    let log = "uvmwatch-fakedev: mounted on /tmp/x\n\
               uvmwatch-fakedev: open node=nvidia-uvm flags=0x8002 pid=12: errno 1\n\
               uvmwatch-fakedev: ioctl node=nvidiactl cmd=0xc020462a in=32 out=32 pid=12: ok params=eeee0000\n\
               uvmwatch-fakedev: ioctl node=nvidia-uvm cmd=0x25 in=0 out=0 pid=12: hang\n";
    let entries = parse_server_log(log);
    assert_eq!(entries.len(), 3);
    assert_eq!(
        entries[0].call,
        ServerCall::Open {
            node: "nvidia-uvm".into(),
            errno: Some(1)
        }
    );
    assert_eq!(entries[1].params.as_deref(), Some(&[0xee, 0xee, 0, 0][..]));
    assert_eq!(entries[2].params, None);
    assert_eq!(entries[2].pid, 12);
}

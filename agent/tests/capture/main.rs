//! `uvmwatch capture` and `uvmwatch annotate`, one module per concern:
//!
//! - `view`: what a file shows. Perfetto captures are decoded with Perfetto's own proto
//!   definitions: the generated `perfetto_trace_pb2` module that the PyPI `perfetto` package
//!   ships (found through `$UVMWATCH_PERFETTO_PYTHON`, `target/tools/perfetto-venv/bin/python3`
//!   or `python3`; the test skips with the install command when none has it). Every byte must
//!   be known to those definitions (no unknown fields). Chrome JSON is read as plain JSON
//!   (Trace Event Format).
//! - `fixed_story`: one recorded story and what both formats must show of it.
//! - `files`: the story through both decoders and against the golden files
//!   (`tests/fixtures/annotate/`; `UVMWATCH_BLESS=1` rewrites them).
//! - `trace_annotation`: `annotate` on a synthetic Kineto trace (golden) and on a trace of
//!   another process.
//! - `live`: root only, the real agent captures the testbed's success and hang scenarios, and a
//!   capture interrupted by SIGINT still leaves a valid file.

#[path = "../common/mod.rs"]
mod common;

mod files;
mod fixed_story;
mod live;
mod trace_annotation;
mod view;

use files::story_fixtures;
use fixed_story::*;
use view::*;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;
use uvmwatch::{
    clock::Clock,
    doctor::{
        cause::CauseId,
        engine::Differential,
        finding::{Confidence, Finding, Severity, Standing},
    },
    event::{
        CallKind, CallSummary, CuinitEnd, Diagnosis, Event, Inside, Ioctl, Kind, Open, Process,
        Scan, Seen, Stall, ThreadSnapshot, Trigger,
    },
    export::{
        annotate::{self, TRACK_TID_BASE},
        capture::{
            self,
            builder::TraceBuilder,
            chrome,
            model::{Capture, Meta},
            perfetto, Format,
        },
    },
};
use uvmwatch_testbed::{
    FakeDev, FakeDevConfig, IoctlAction, IoctlRule, Scenario, Workload, WorkloadConfig,
};

const T: Duration = Duration::from_secs(20);
const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// The cuInit sequence of the test library on nvidia-uvm (as in e2e.rs).
const UVM_SEQUENCE: &[&str] = &[
    "UVM_INITIALIZE",
    "UVM_MM_INITIALIZE",
    "UVM_PAGEABLE_MEM_ACCESS",
    "UVM_REGISTER_GPU",
    "UVM_CREATE_RANGE_GROUP",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/annotate")
}

fn bless() -> bool {
    std::env::var_os("UVMWATCH_BLESS").is_some_and(|v| v == "1")
}

/// Compares `got` with the golden file `name` (rewritten under `UVMWATCH_BLESS=1`).
fn golden(name: &str, got: &[u8]) {
    let path = fixtures().join(name);
    if bless() {
        std::fs::create_dir_all(fixtures()).unwrap();
        std::fs::write(&path, got).unwrap();
        eprintln!("blessed {}", path.display());
        return;
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UVMWATCH_BLESS=1 writes it)", path.display()));
    if want != got {
        let out = std::env::temp_dir().join(format!("uvmwatch-golden-{name}"));
        std::fs::write(&out, got).unwrap();
        panic!(
            "{} differs from the golden file; got written to {} (UVMWATCH_BLESS=1 accepts it)",
            path.display(),
            out.display()
        );
    }
}

//! The log's stable schema: every record the agent writes about what it observed, with its
//! `event`, level, message and fields. JSON lines carry every field of a record (also when
//! empty); the text format shows the fields marked for people, in this order, and leaves out
//! empty ones. `docs/log-schema.md` is generated from this table (a test keeps it current)
//! and a test checks it against records the agent really wrote
//! (`agent/tests/fixtures/contract/log-records.json`).
//!
//! Every record also has `timestamp`, `level`, `message` and `target` (`uvmwatch::agent`).
//! Field names are kept across versions; a rename is a documented change.

/// One field of a record.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    /// Shown in the text format.
    pub text: bool,
    pub meaning: &'static str,
}

/// One kind of record.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// The `event` field.
    pub event: &'static str,
    pub level: &'static str,
    /// The `message`.
    pub message: &'static str,
    pub fields: &'static [Field],
}

const fn f(name: &'static str, meaning: &'static str) -> Field {
    Field {
        name,
        text: true,
        meaning,
    }
}

/// A field only JSON shows (the text format leaves it out).
const fn j(name: &'static str, meaning: &'static str) -> Field {
    Field {
        name,
        text: false,
        meaning,
    }
}

const PID: Field = f("pid", "process id (init pid namespace)");
const TID: Field = j("tid", "thread id");
const COMM: Field = f("comm", "thread name when the kernel saw the event");
const EXE: Field = j("exe", "executable path");
const RESULT_CU: Field = f("result", "CUresult name (cuda.h)");
const CODE: Field = j("code", "CUresult code");
const CUINIT_RESULT: Field = f(
    "result",
    "CUresult name (cuda.h); for a call whose return was not seen, the one its driver calls tell, or unknown",
);
const CUINIT_CODE: Field = j("code", "CUresult code (-1: unknown)");
const DURATION: Field = f("duration_seconds", "time in the call, seconds");
const DRIVER_CALLS: Field = f("driver_calls", "driver ioctls made inside cuInit");
const DEVICE_OPENS: Field = j("device_opens", "NVIDIA device opens made inside cuInit");
const IOCTL: Field = f(
    "ioctl",
    "ioctl name from the driver headers, or its number in hex",
);
const NODE_PATH: Field = f("node", "device node path");
const RESULT_IO: Field = f(
    "result",
    "NV_OK, an NV_ERR_* name read from the params' rmStatus, OK when the command has no status, an errno name, PARAMS_UNREADABLE",
);
const IN_CUINIT: Field = j("in_cuinit", "made inside cuInit");
const CALL: Field = f("call", "cuInit, or the driver call's name");
const OUTCOME: Field = f(
    "outcome",
    "returned, thread_exited or ended (gone from the kernel's map without an exit record)",
);
const DIAGNOSIS: Field = f(
    "diagnosis",
    "rule ids of the findings, worst first (docs/doctor.md)",
);
const DIAGNOSIS_TITLE: Field = j("diagnosis_title", "title of the worst finding");
const DIAGNOSIS_FIX: Field = j("diagnosis_fix", "fix of the worst finding, numbered steps");
const RUNBOOK: Field = f("runbook", "runbook of the worst finding");
const ENGINE: Field = f(
    "engine",
    "inference engine (vllm, sglang, tensorrt-llm, ollama, pytorch)",
);
const MODEL: Field = f("model", "model the server was started with");
const POD: Field = f("pod", "Kubernetes pod name");
const NAMESPACE: Field = f("namespace", "Kubernetes namespace");
const CONTAINER: Field = f(
    "container_id",
    "container id, or lxc:<name>; empty on the host",
);
const PATH: Field = f("path", "file path");
const CTX_CALL: Field = f(
    "call",
    "the libcuda export called: cuCtxCreate, cuCtxCreate_v2, _v3, _v4, cuDevicePrimaryCtxRetain, cuDeviceGetCount",
);
const CTX_DEVICE: Field = f(
    "device",
    "the CUdevice argument of a context creation; empty for cuDeviceGetCount",
);
const CTX_COUNT: Field = f(
    "count",
    "the device count cuDeviceGetCount returned; empty for a context creation",
);

const ERROR: Field = f("error", "what went wrong");
const SEEN: Field = j(
    "seen",
    "how much of the call the probes saw: whole (entry and return), return (the return, not the entry), driver_calls (only its driver calls: its libcuda was loaded and the call made before the cuInit probes were attached)",
);
const ENDED: Field = j(
    "ended",
    "for a call found at its first driver call: how its end was known (returned, next_cuinit, next_call, exec, thread_exited, process_exited, quiet: no driver call for 1 s); empty otherwise",
);
const RESULT_BASIS: Field = f(
    "result_inferred_from",
    "when the return was not seen: what the result was inferred from (docs/probes.md#late-cuinit); empty when the return was seen or nothing told (result unknown, code -1)",
);

/// Every record kind, grouped by the data path: calls, stalls, processes, diagnosis, agent.
/// The fields of both `driver_layout` records.
const DRIVER_LAYOUT: [Field; 4] = [
    f(
        "driver_version",
        "the running driver's version (`/proc/driver/nvidia/version`), or `unknown`",
    ),
    f(
        "layout",
        "the driver release whose ioctl params layouts are used (docs/compatibility.md)",
    ),
    f(
        "selection",
        "`exact` (the driver's own), `nearest` (a version the table does not know), `newest` (no version known)",
    ),
    f(
        "source",
        "where the version came from (a path, `--driver-version`, the snapshot), or why it is not known",
    ),
];

pub const RECORDS: &[Record] = &[
    Record {
        event: "cuinit_start",
        level: "INFO",
        message: "cuInit entered",
        fields: &[
            PID,
            TID,
            ENGINE,
            MODEL,
            f("quantization", "weight quantization (nvfp4, fp8, awq, ...)"),
            f("tp_rank", "tensor-parallel rank"),
            POD,
            NAMESPACE,
            COMM,
            EXE,
            j("flags", "the Flags argument"),
            j(
                "late",
                "found at its first driver call (its libcuda was loaded before the probes were attached): its entry was not seen, the time is that call's",
            ),
        ],
    },
    Record {
        event: "cuinit_end",
        level: "INFO",
        message: "cuInit returned",
        fields: &[
            PID,
            TID,
            COMM,
            CUINIT_RESULT,
            CUINIT_CODE,
            DURATION,
            DRIVER_CALLS,
            DEVICE_OPENS,
            SEEN,
            ENDED,
            RESULT_BASIS,
        ],
    },
    Record {
        event: "cuinit_end",
        level: "ERROR",
        message: "cuInit failed",
        fields: &[
            PID,
            TID,
            COMM,
            CUINIT_RESULT,
            CUINIT_CODE,
            DURATION,
            DRIVER_CALLS,
            DEVICE_OPENS,
            SEEN,
            ENDED,
            RESULT_BASIS,
            f("failed_call", "the last failed driver call or open inside cuInit (calls on a negative fd left out: they follow a failed open)"),
            f("failed_result", "its result"),
            DIAGNOSIS,
            DIAGNOSIS_TITLE,
            DIAGNOSIS_FIX,
            RUNBOOK,
        ],
    },
    Record {
        event: "driver_ioctl",
        level: "WARN",
        message: "driver call failed",
        fields: &[
            PID,
            TID,
            COMM,
            IOCTL,
            j("cmd", "request number, hex"),
            NODE_PATH,
            RESULT_IO,
            j("ret", "the syscall's return value"),
            DURATION,
            IN_CUINIT,
        ],
    },
    Record {
        event: "driver_ioctl",
        level: "INFO",
        message: "slow driver call",
        fields: &[PID, TID, COMM, IOCTL, NODE_PATH, RESULT_IO, DURATION, IN_CUINIT],
    },
    Record {
        event: "driver_ioctl",
        level: "DEBUG",
        message: "driver call inside cuInit",
        fields: &[PID, TID, IOCTL, NODE_PATH, RESULT_IO, DURATION],
    },
    Record {
        event: "device_open_failed",
        level: "WARN",
        message: "NVIDIA device open failed",
        fields: &[
            DIAGNOSIS,
            DIAGNOSIS_TITLE,
            DIAGNOSIS_FIX,
            RUNBOOK,
            PID,
            TID,
            COMM,
            f("node", "node label (nvidiactl, nvidia<N>, nvidia-uvm, nvidia-uvm-tools)"),
            PATH,
            f("errno", "errno name"),
            CONTAINER,
            IN_CUINIT,
        ],
    },
    Record {
        event: "device_open",
        level: "DEBUG",
        message: "NVIDIA device opened",
        fields: &[PID, PATH, f("fd", "the file descriptor")],
    },
    Record {
        event: "kernel_signal",
        level: "WARN",
        message: "kernel function failed",
        fields: &[
            PID,
            TID,
            COMM,
            f("function", "kprobed kernel or nvidia_uvm function (docs/probes.md)"),
            f("result", "NV_STATUS name, or -<errno> (<name>)"),
            j("in_uvm_ioctl", "called inside an ioctl on a UVM node"),
            DURATION,
        ],
    },
    Record {
        event: "died_in_call",
        level: "INFO",
        message: "thread exited with a driver call in flight",
        fields: &[
            PID,
            TID,
            COMM,
            f("calls", "the calls it was inside, outermost first, joined by ' > '"),
        ],
    },
    Record {
        event: "context_call",
        level: "ERROR",
        message: "CUDA context or device call failed",
        fields: &[
            PID,
            TID,
            COMM,
            CTX_CALL,
            CTX_DEVICE,
            RESULT_CU,
            CODE,
            DURATION,
            DIAGNOSIS,
            DIAGNOSIS_TITLE,
            DIAGNOSIS_FIX,
            RUNBOOK,
        ],
    },
    Record {
        event: "context_call",
        level: "DEBUG",
        message: "CUDA context or device call returned",
        fields: &[
            PID,
            TID,
            CTX_CALL,
            CTX_DEVICE,
            CTX_COUNT,
            RESULT_CU,
            DURATION,
        ],
    },
    Record {
        event: "device_count",
        level: "WARN",
        message: "CUDA sees fewer devices than the process has GPUs",
        fields: &[
            PID,
            TID,
            COMM,
            CTX_COUNT,
            f(
                "gpu_nodes",
                "GPU nodes (/dev/nvidia<N>) in the process's root (/proc/<pid>/root/dev); empty when unreadable",
            ),
            f(
                "cuda_visible_devices",
                "CUDA_VISIBLE_DEVICES of the process's initial environment (/proc/<pid>/environ)",
            ),
            DIAGNOSIS,
            DIAGNOSIS_TITLE,
            DIAGNOSIS_FIX,
            RUNBOOK,
        ],
    },
    Record {
        event: "stall",
        level: "ERROR",
        message: "call stalled",
        fields: &[
            ENGINE,
            MODEL,
            POD,
            NAMESPACE,
            DIAGNOSIS,
            DIAGNOSIS_TITLE,
            DIAGNOSIS_FIX,
            RUNBOOK,
            CALL,
            j("kind", "cuInit or driver ioctl"),
            PID,
            TID,
            COMM,
            EXE,
            CONTAINER,
            f("age_seconds", "how long the call has been running"),
            j("threshold_seconds", "the stall threshold it crossed"),
            j("detect_delay_ms", "how late after the threshold it was reported"),
            f("inside", "for cuInit: the driver call it waits in, on which node"),
            j("inside_age_seconds", "how long that driver call has been running"),
            NODE_PATH,
            f("thread_state", "state of the thread in /proc (D (disk sleep), S (sleeping), ...)"),
            f("wchan", "kernel function the thread sleeps in"),
            j("kernel_stack", "kernel stack of the thread, innermost first, joined by ' < '"),
        ],
    },
    Record {
        event: "stall_end",
        level: "WARN",
        message: "stalled cuInit returned",
        fields: &[CALL, OUTCOME, PID, TID, COMM, RESULT_CU, CODE, DURATION],
    },
    Record {
        event: "stall_end",
        level: "WARN",
        message: "stalled driver call returned",
        fields: &[CALL, NODE_PATH, OUTCOME, PID, TID, COMM, RESULT_IO, DURATION],
    },
    Record {
        event: "stall_end",
        level: "WARN",
        message: "thread died inside a stalled call",
        fields: &[CALL, OUTCOME, PID, TID, COMM],
    },
    Record {
        event: "stall_end",
        level: "WARN",
        message: "stalled call is no longer in flight (no exit event seen)",
        fields: &[CALL, OUTCOME, PID, TID],
    },
    Record {
        event: "fork",
        level: "DEBUG",
        message: "tracked process forked",
        fields: &[PID, f("child", "pid of the new process")],
    },
    Record {
        event: "exec",
        level: "DEBUG",
        message: "tracked process exec'ed",
        fields: &[PID],
    },
    Record {
        event: "process_exit",
        level: "DEBUG",
        message: "tracked process exited",
        fields: &[PID],
    },
    Record {
        event: "diagnosis",
        level: "WARN",
        message: "diagnosis",
        fields: &[
            f("trigger", "the record that caused it: cuinit_end, device_open_failed, stall, context_call, device_count"),
            PID,
            f("rule", "rule id (docs/doctor.md)"),
            f("severity", "critical, warning, info"),
            f(
                "basis",
                "observed (rests on what the probes saw of this process); the agent attaches only observed findings to a failure",
            ),
            j("confidence", "High, Medium, Low"),
            f("title", "what is wrong"),
            j("evidence", "what=value [source]; ..."),
            j("unchecked", "what the rule could not check, and why"),
            f("fix", "the fix, numbered steps with where to run them ([host], [container], [any])"),
            RUNBOOK,
        ],
    },
    Record {
        event: "diagnosis",
        level: "INFO",
        message: "finding from the host's state",
        fields: &[
            f("trigger", "evidence: the host's facts alone"),
            f("rule", "rule id"),
            f("severity", "critical, warning, info"),
            j("basis", "static: the host's state alone"),
            f("title", "what is wrong"),
            RUNBOOK,
        ],
    },
    Record {
        event: "repeated",
        level: "WARN",
        message: "failure repeated",
        fields: &[
            f("pid", "the process (0 for the sum of failures beyond the 4096 summed one by one)"),
            f("call", "the call and its node (`UVM_REGISTER_GPU on /dev/nvidia-uvm`, `open /dev/nvidia-uvm`), or the kernel function"),
            f("result", "the result label it failed with"),
            f("times", "how often it came again since it was printed or last summed up"),
            f("over_seconds", "over how long"),
        ],
    },
    Record {
        event: "started",
        level: "INFO",
        message: "uvmwatch agent running",
        fields: &[
            f("listen", "address of /metrics and /healthz, or none"),
            f("probes_attached", "probes attached"),
            f("probes_total", "probes in the registry"),
            f("libcuda_targets", "libcuda files with cuInit probes"),
            f("cuinit_stall_seconds", "--cuinit-stall"),
            f("ioctl_stall_seconds", "--ioctl-stall"),
            f(
                "backend",
                "how opens and ioctls are hooked: fentry or tracepoint (docs/probes.md#backends)",
            ),
            f(
                "backend_reason",
                "why: the kernel allows trampolines, the kernel's refusal of fentry, or the flag",
            ),
        ],
    },
    Record {
        event: "stopped",
        level: "INFO",
        message: "probes detached, agent stopped",
        fields: &[f("signal", "what stopped it: SIGTERM, SIGINT, duration")],
    },
    Record {
        event: "libcuda_attached",
        level: "INFO",
        message: "cuInit probes attached",
        fields: &[
            f("path", "the library as its process sees it"),
            j("host_path", "the path the probes were attached through"),
            j("source", "how it was found"),
        ],
    },
    Record {
        event: "libcuda_attach_failed",
        level: "WARN",
        message: "could not probe cuInit in this library",
        fields: &[PATH, ERROR],
    },
    Record {
        event: "libcuda_not_found",
        level: "ERROR",
        message: "--libcuda path unusable",
        fields: &[ERROR],
    },
    Record {
        event: "libcuda_not_found",
        level: "WARN",
        message: "no libcuda.so found on the host or in any running process; cuInit probes attach as soon as a process loads one (or pass --libcuda PATH)",
        fields: &[],
    },
    Record {
        event: "libcuda_open",
        level: "DEBUG",
        message: "library opened but not resolvable",
        fields: &[PID, PATH, ERROR],
    },
    Record {
        event: "fds_learned",
        level: "INFO",
        message: "NVIDIA fds opened before the agent started are identified",
        fields: &[f("count", "fds learned from /proc/<pid>/fd")],
    },
    Record {
        event: "in_flight_at_start",
        level: "WARN",
        message: "a thread was already inside a driver call when the agent started; its age counts from now",
        fields: &[PID, TID, IOCTL, NODE_PATH],
    },
    Record {
        event: "module_loaded",
        level: "INFO",
        message: "kprobes on the module's functions attached",
        fields: &[f("module", "nvidia_uvm")],
    },
    Record {
        event: "module_unloaded",
        level: "INFO",
        message: "kprobes on the module's functions detached",
        fields: &[f("module", "nvidia_uvm")],
    },
    Record {
        event: "driver_layout",
        level: "INFO",
        message: "ioctl statuses read with the layouts of this driver release",
        fields: &DRIVER_LAYOUT,
    },
    Record {
        event: "driver_layout",
        level: "WARN",
        message: "driver version not in the layout table: statuses read with the layouts of the nearest known release",
        fields: &DRIVER_LAYOUT,
    },
    Record {
        event: "feature_off",
        level: "WARN",
        message: "a feature is off: what it gives is not seen",
        fields: &[
            f("feature", "the feature (the `feature` label of `uvmwatch_feature_enabled`)"),
            f("lost", "what the agent does not see while it is off"),
            f("reason", "why: the probe the kernel refused, or the capability not held"),
        ],
    },
    Record {
        event: "evidence_changed",
        level: "DEBUG",
        message: "diagnosis facts changed",
        fields: &[],
    },
    Record {
        event: "sweep",
        level: "DEBUG",
        message: "stale process entries removed",
        fields: &[f("removed", "entries removed")],
    },
];

/// The schema record of a written record (by its `event` and message).
pub fn find(event: &str, message: &str) -> Option<&'static Record> {
    RECORDS
        .iter()
        .find(|r| r.event == event && r.message == message)
}

/// The schema page, `docs/log-schema.md`.
pub fn reference_markdown() -> String {
    let mut s = String::from(
        "# Log schema\n\n\
         Generated from `agent/src/export/log/schema.rs` by `uvmwatch log-schema-doc`; a test \
         keeps this file equal to the output, and another checks the table against records \
         the agent wrote in the demo's scenarios.\n\n\
         `--log-format json` writes one JSON object per record and line, with every field of \
         the record, also when it is empty. Every record has `timestamp` (RFC 3339, UTC), \
         `level`, `message`, `target` (`uvmwatch::agent` for the records below) and `event`. \
         Field names are kept across versions: a rename is announced here first. The text \
         format (`--log-format text`, the default on a terminal) shows the fields marked \
         *text*, leaves out empty ones, prints a finding in full once per process and rule \
         (later records name its rule and runbook). Both formats sum up a failure outside \
         `cuInit` that repeats (same process, call and result) instead of writing it again \
         (`repeated`, per `--log-repeat-window`).\n\n\
         Records other than these (from the loader, the exporters, at `debug` level) have no \
         `event` field and no stable schema.\n",
    );
    for r in RECORDS {
        s.push_str(&format!(
            "\n## `{}` ({}): {}\n\n",
            r.event, r.level, r.message
        ));
        if r.fields.is_empty() {
            s.push_str("No fields besides the common ones.\n");
            continue;
        }
        s.push_str("| field | text | meaning |\n|---|---|---|\n");
        for fl in r.fields {
            s.push_str(&format!(
                "| `{}` | {} | {} |\n",
                fl.name,
                if fl.text { "yes" } else { "" },
                fl.meaning
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn every_record_is_unique_and_documented() {
        let mut seen = BTreeSet::new();
        for r in RECORDS {
            assert!(
                seen.insert((r.event, r.message)),
                "{} {}",
                r.event,
                r.message
            );
            let mut names = BTreeSet::new();
            for fl in r.fields {
                assert!(names.insert(fl.name), "{}: {} twice", r.event, fl.name);
                assert!(!fl.meaning.is_empty());
            }
        }
    }

    /// The schema says what the agent wrote in the demo's scenarios (recorded by
    /// `agent/tests/log_schema.rs`).
    #[test]
    fn the_schema_matches_the_records_the_agent_wrote() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/contract/log-records.json"
        );
        let written: BTreeMap<String, BTreeSet<String>> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (key, fields) in &written {
            let mut parts = key.splitn(3, ' ');
            let (event, level, message) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let r = find(event, message).unwrap_or_else(|| panic!("{key} not in the schema"));
            assert_eq!(r.level, level, "{key}");
            let mut want: BTreeSet<String> = r.fields.iter().map(|f| f.name.to_string()).collect();
            for common in ["event", "level", "message", "target"] {
                want.insert(common.into());
            }
            assert_eq!(&want, fields, "{key}");
        }
    }

    #[test]
    fn reference_page_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/log-schema.md");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == reference_markdown(),
            "docs/log-schema.md is stale: run `cargo run -p uvmwatch -- log-schema-doc > docs/log-schema.md`"
        );
    }
}

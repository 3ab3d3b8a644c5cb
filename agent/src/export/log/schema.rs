//! The log's stable schema: every record the agent writes about what it observed, with its
//! `event`, level, message and fields. JSON lines carry every field of a record (also when
//! empty); the text format shows the fields marked for people, in this order, and leaves out
//! empty ones. `docs/log-schema.md` is generated from this table (a test keeps it current)
//! and a test checks it against records the agent really wrote
//! (`agent/tests/fixtures/contract/log-records.json`).
//!
//! Every record also has `timestamp`, `level`, `message` and `target` (`uvmwatch::agent`).
//! Field names are kept across versions; a rename is a documented change.
//!
//! Each record is described once, here, as a named [`Record`]; the writer names it in
//! [`write_record!`](crate::write_record) and gives the values of its fields, in its order:
//! the event, level and message come from the description, and a field list that differs
//! from it does not compile ([`fields_are`]).
//!
//! Over 800 lines: it is the table of every record the agent writes (49 of them, each field
//! with its meaning), kept whole so that the schema page is generated from one place; the
//! check of the writer, the page's generator and the tests take the last 130.

use tracing::Level;

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
    pub level: Level,
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
const CONTEXT_CALL: Field = f(
    "call",
    "the libcuda export called: cuCtxCreate, cuCtxCreate_v2, _v3, _v4, cuDevicePrimaryCtxRetain, cuDeviceGetCount",
);
const CONTEXT_DEVICE: Field = f(
    "device",
    "the CUdevice argument of a context creation; empty for cuDeviceGetCount",
);
const CONTEXT_COUNT: Field = f(
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

pub const CUINIT_START: Record = Record {
    event: "cuinit_start",
    level: Level::INFO,
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
};
pub const CUINIT_RETURNED: Record = Record {
    event: "cuinit_end",
    level: Level::INFO,
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
};
pub const CUINIT_FAILED: Record = Record {
    event: "cuinit_end",
    level: Level::ERROR,
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
};
pub const IOCTL_FAILED: Record = Record {
    event: "driver_ioctl",
    level: Level::WARN,
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
};
pub const IOCTL_SLOW: Record = Record {
    event: "driver_ioctl",
    level: Level::INFO,
    message: "slow driver call",
    fields: &[
        PID, TID, COMM, IOCTL, NODE_PATH, RESULT_IO, DURATION, IN_CUINIT,
    ],
};
pub const IOCTL_IN_CUINIT: Record = Record {
    event: "driver_ioctl",
    level: Level::DEBUG,
    message: "driver call inside cuInit",
    fields: &[PID, TID, IOCTL, NODE_PATH, RESULT_IO, DURATION],
};
pub const DEVICE_OPEN_FAILED: Record = Record {
    event: "device_open_failed",
    level: Level::WARN,
    message: "NVIDIA device open failed",
    fields: &[
        DIAGNOSIS,
        DIAGNOSIS_TITLE,
        DIAGNOSIS_FIX,
        RUNBOOK,
        PID,
        TID,
        COMM,
        f(
            "node",
            "node label (nvidiactl, nvidia<N>, nvidia-uvm, nvidia-uvm-tools)",
        ),
        PATH,
        f("errno", "errno name"),
        CONTAINER,
        IN_CUINIT,
    ],
};
pub const DEVICE_OPENED: Record = Record {
    event: "device_open",
    level: Level::DEBUG,
    message: "NVIDIA device opened",
    fields: &[PID, PATH, f("fd", "the file descriptor")],
};
pub const KERNEL_FUNCTION_FAILED: Record = Record {
    event: "kernel_signal",
    level: Level::WARN,
    message: "kernel function failed",
    fields: &[
        PID,
        TID,
        COMM,
        f(
            "function",
            "the traced kernel or nvidia_uvm function that failed (kprobe, or fexit on the fentry backend; docs/probes.md)",
        ),
        f("result", "NV_STATUS name, or -<errno> (<name>)"),
        j("in_uvm_ioctl", "called inside an ioctl on a UVM node"),
        DURATION,
    ],
};
pub const DIED_IN_CALL: Record = Record {
    event: "died_in_call",
    level: Level::INFO,
    message: "thread exited with a driver call in flight",
    fields: &[
        PID,
        TID,
        COMM,
        f(
            "calls",
            "the calls it was inside, outermost first, joined by ' > '",
        ),
    ],
};
pub const CONTEXT_CALL_FAILED: Record = Record {
    event: "context_call",
    level: Level::ERROR,
    message: "CUDA context or device call failed",
    fields: &[
        PID,
        TID,
        COMM,
        CONTEXT_CALL,
        CONTEXT_DEVICE,
        RESULT_CU,
        CODE,
        DURATION,
        DIAGNOSIS,
        DIAGNOSIS_TITLE,
        DIAGNOSIS_FIX,
        RUNBOOK,
    ],
};
pub const CONTEXT_CALL_RETURNED: Record = Record {
    event: "context_call",
    level: Level::DEBUG,
    message: "CUDA context or device call returned",
    fields: &[
        PID,
        TID,
        CONTEXT_CALL,
        CONTEXT_DEVICE,
        CONTEXT_COUNT,
        RESULT_CU,
        DURATION,
    ],
};
pub const DEVICE_COUNT_LOW: Record = Record {
    event: "device_count",
    level: Level::WARN,
    message: "CUDA sees fewer devices than the process has GPUs",
    fields: &[
        PID,
        TID,
        COMM,
        CONTEXT_COUNT,
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
};
pub const STALL: Record = Record {
    event: "stall",
    level: Level::ERROR,
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
        j(
            "detect_delay_ms",
            "how late after the threshold it was reported",
        ),
        f(
            "inside",
            "for cuInit: the driver call it waits in, on which node",
        ),
        j(
            "inside_age_seconds",
            "how long that driver call has been running",
        ),
        NODE_PATH,
        f(
            "thread_state",
            "state of the thread in /proc (D (disk sleep), S (sleeping), ...)",
        ),
        f("wchan", "kernel function the thread sleeps in"),
        j(
            "kernel_stack",
            "kernel stack of the thread, innermost first, joined by ' < '",
        ),
    ],
};
pub const STALL_END_CUINIT: Record = Record {
    event: "stall_end",
    level: Level::WARN,
    message: "stalled cuInit returned",
    fields: &[CALL, OUTCOME, PID, TID, COMM, RESULT_CU, CODE, DURATION],
};
pub const STALL_END_IOCTL: Record = Record {
    event: "stall_end",
    level: Level::WARN,
    message: "stalled driver call returned",
    fields: &[
        CALL, NODE_PATH, OUTCOME, PID, TID, COMM, RESULT_IO, DURATION,
    ],
};
pub const STALL_END_THREAD_EXITED: Record = Record {
    event: "stall_end",
    level: Level::WARN,
    message: "thread died inside a stalled call",
    fields: &[CALL, OUTCOME, PID, TID, COMM],
};
pub const STALL_END_NOT_IN_FLIGHT: Record = Record {
    event: "stall_end",
    level: Level::WARN,
    message: "stalled call is no longer in flight (no exit event seen)",
    fields: &[CALL, OUTCOME, PID, TID],
};
pub const FORK: Record = Record {
    event: "fork",
    level: Level::DEBUG,
    message: "tracked process forked",
    fields: &[PID, f("child", "pid of the new process")],
};
pub const EXEC: Record = Record {
    event: "exec",
    level: Level::DEBUG,
    message: "tracked process exec'ed",
    fields: &[PID],
};
pub const PROCESS_EXIT: Record = Record {
    event: "process_exit",
    level: Level::DEBUG,
    message: "tracked process exited",
    fields: &[PID],
};
pub const DIAGNOSIS_OBSERVED: Record = Record {
    event: "diagnosis",
    level: Level::WARN,
    message: "diagnosis",
    fields: &[
        f("trigger", "the record that caused it: cuinit_end, device_open_failed, stall, context_call, device_count"),
        PID,
        f("rule", "the cause's id (docs/doctor.md)"),
        f("standing", "leading (the most likely cause of the symptom) or possible (still possible; tell_apart says how to tell)"),
        f("severity", "critical, warning, info (the symptom's)"),
        f(
            "basis",
            "observed (rests on what the probes saw of this process); the agent attaches only observed findings to a failure",
        ),
        j("confidence", "High, Medium, Low"),
        f("title", "what is wrong"),
        j("symptom", "what failed or hung, and where, as the differential names it"),
        j("evidence", "what=value [source]; ... (against ... for a signal against the cause)"),
        j("unchecked", "what the cause needs that could not be checked, and why"),
        f("fix", "the fix, numbered steps with where to run them ([host], [container], [any])"),
        j("tell_apart", "the command that tells this cause from the others (empty when certain)"),
        j("ruled_out", "the causes ruled out, each with what ruled it out: cause: why; ..."),
        RUNBOOK,
    ],
};
pub const DIAGNOSIS_HOST: Record = Record {
    event: "diagnosis",
    level: Level::INFO,
    message: "finding from the host's state",
    fields: &[
        f("trigger", "evidence: the host's facts alone"),
        f("rule", "the cause's id"),
        f("standing", "leading, possible (causes of what the host recorded failing), hazard (nothing failed yet)"),
        f("severity", "critical, warning, info"),
        j("basis", "static: the host's state alone"),
        f("title", "what is wrong"),
        RUNBOOK,
    ],
};
pub const REPEATED: Record = Record {
    event: "repeated",
    level: Level::WARN,
    message: "failure repeated",
    fields: &[
        f("pid", "the process (0 for the sum of failures beyond the 4096 summed one by one)"),
        f("call", "the call and its node (`UVM_REGISTER_GPU on /dev/nvidia-uvm`, `open /dev/nvidia-uvm`), or the kernel function"),
        f("result", "the result label it failed with"),
        f("times", "how often it came again since it was printed or last summed up"),
        f("over_seconds", "over how long"),
    ],
};
pub const STARTED: Record = Record {
    event: "started",
    level: Level::INFO,
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
};
pub const STOPPED: Record = Record {
    event: "stopped",
    level: Level::INFO,
    message: "probes detached, agent stopped",
    fields: &[f("signal", "what stopped it: SIGTERM, SIGINT, duration")],
};
pub const LIBCUDA_ATTACHED: Record = Record {
    event: "libcuda_attached",
    level: Level::INFO,
    message: "cuInit probes attached",
    fields: &[
        f("path", "the library as its process sees it"),
        j("host_path", "the path the probes were attached through"),
        j("source", "how it was found"),
        j(
            "attach_seconds",
            "seconds from when it was found (the open that made the agent find it, or the attach's start for a file found at start or by a scan) to its probes attached",
        ),
    ],
};
pub const LIBCUDA_ATTACH_FAILED: Record = Record {
    event: "libcuda_attach_failed",
    level: Level::WARN,
    message: "could not probe cuInit in this library",
    fields: &[PATH, ERROR],
};
pub const LIBCUDA_FLAG_UNUSABLE: Record = Record {
    event: "libcuda_not_found",
    level: Level::ERROR,
    message: "--libcuda path unusable",
    fields: &[ERROR],
};
pub const LIBCUDA_NOT_FOUND: Record = Record {
    event: "libcuda_not_found",
    level: Level::WARN,
    message: "no libcuda.so found on the host or in any running process; cuInit probes attach as soon as a process loads one (or pass --libcuda PATH)",
    fields: &[],
};
pub const LIBCUDA_UNRESOLVED: Record = Record {
    event: "libcuda_open",
    level: Level::DEBUG,
    message: "library opened but not resolvable",
    fields: &[PID, PATH, ERROR],
};
pub const FDS_LEARNED: Record = Record {
    event: "fds_learned",
    level: Level::INFO,
    message: "NVIDIA fds opened before the agent started are identified",
    fields: &[f("count", "fds learned from /proc/<pid>/fd")],
};
pub const IN_FLIGHT_AT_START: Record = Record {
    event: "in_flight_at_start",
    level: Level::WARN,
    message:
        "a thread was already inside a driver call when the agent started; its age counts from now",
    fields: &[PID, TID, IOCTL, NODE_PATH],
};
pub const MODULE_LOADED: Record = Record {
    event: "module_loaded",
    level: Level::INFO,
    message: "kprobes on the module's functions attached",
    fields: &[f("module", "nvidia_uvm")],
};
pub const MODULE_UNLOADED: Record = Record {
    event: "module_unloaded",
    level: Level::INFO,
    message: "kprobes on the module's functions detached",
    fields: &[f("module", "nvidia_uvm")],
};
pub const DRIVER_LAYOUT_EXACT: Record = Record {
    event: "driver_layout",
    level: Level::INFO,
    message: "ioctl statuses read with the layouts of this driver release",
    fields: &DRIVER_LAYOUT,
};
pub const DRIVER_LAYOUT_NEAREST: Record = Record {
    event: "driver_layout",
    level: Level::WARN,
    message: "driver version not in the layout table: statuses read with the layouts of the nearest known release",
    fields: &DRIVER_LAYOUT,
};
pub const FEATURE_OFF: Record = Record {
    event: "feature_off",
    level: Level::WARN,
    message: "a feature is off: what it gives is not seen",
    fields: &[
        f(
            "feature",
            "the feature (the `feature` label of `uvmwatch_feature_enabled`)",
        ),
        f("lost", "what the agent does not see while it is off"),
        f(
            "reason",
            "why: the probe the kernel refused, or the capability not held",
        ),
    ],
};
pub const EVIDENCE_CHANGED: Record = Record {
    event: "evidence_changed",
    level: Level::DEBUG,
    message: "diagnosis facts changed",
    fields: &[],
};
pub const SWEEP: Record = Record {
    event: "sweep",
    level: Level::DEBUG,
    message: "stale process entries removed",
    fields: &[f("removed", "entries removed")],
};

// The exporters' records: about the agent's own outputs, not what it observed.

pub const OTLP_STARTED: Record = Record {
    event: "otlp_started",
    level: Level::INFO,
    message: "exporting spans over OTLP/HTTP",
    fields: &[f(
        "endpoint",
        "the traces URL (`<--otlp-endpoint>/v1/traces`)",
    )],
};
pub const OTLP_DROPPED: Record = Record {
    event: "otlp_dropped",
    level: Level::WARN,
    message: "OTLP exporter dropped data (queue full or endpoint failing)",
    fields: &[
        f(
            "events_dropped_total",
            "events dropped since start (queue full)",
        ),
        f(
            "spans_dropped_total",
            "spans dropped since start (endpoint failing)",
        ),
        f(
            "events_dropped",
            "events dropped since the last such record",
        ),
        f("spans_dropped", "spans dropped since the last such record"),
    ],
};
pub const OTLP_EXPORT_RECOVERED: Record = Record {
    event: "otlp_export_recovered",
    level: Level::INFO,
    message: "OTLP export works again",
    fields: &[f("previous_error", "why the exports before failed")],
};
pub const OTLP_EXPORT_RETRYING: Record = Record {
    event: "otlp_export_failed",
    level: Level::WARN,
    message: "OTLP export failed; retrying",
    fields: &[
        ERROR,
        f(
            "retry_in_seconds",
            "when the batch is sent again (backoff, or the endpoint's Retry-After)",
        ),
    ],
};
pub const OTLP_EXPORT_DROPPED: Record = Record {
    event: "otlp_export_failed",
    level: Level::WARN,
    message: "OTLP export failed; spans dropped",
    fields: &[ERROR, f("spans", "spans of the batch, dropped")],
};
pub const OTLP_EXPORTER_FAILED: Record = Record {
    event: "otlp_exporter_failed",
    level: Level::ERROR,
    message: "OTLP exporter could not start; no spans will be sent",
    fields: &[ERROR],
};
pub const OTLP_SHUTDOWN: Record = Record {
    event: "otlp_shutdown",
    level: Level::WARN,
    message: "OTLP exporter still sending at shutdown; abandoning what is left",
    fields: &[],
};
pub const CAPTURE_WRITTEN: Record = Record {
    event: "capture_written",
    level: Level::INFO,
    message: "capture written",
    fields: &[
        PATH,
        f("events", "events in the trace"),
        f("processes", "processes in the trace"),
        f(
            "dropped_events",
            "events the kernel side dropped (ring buffer full) while capturing",
        ),
        f(
            "lost_events",
            "events over --max-events, counted and left out",
        ),
        f("bytes", "size of the file"),
    ],
};
pub const CAPTURE_WRITE_FAILED: Record = Record {
    event: "capture_write_failed",
    level: Level::ERROR,
    message: "could not write the capture",
    fields: &[PATH, ERROR],
};

/// Every record kind, grouped by the data path: calls, stalls, processes, diagnosis, agent,
/// exporters.
pub const RECORDS: &[Record] = &[
    CUINIT_START,
    CUINIT_RETURNED,
    CUINIT_FAILED,
    IOCTL_FAILED,
    IOCTL_SLOW,
    IOCTL_IN_CUINIT,
    DEVICE_OPEN_FAILED,
    DEVICE_OPENED,
    KERNEL_FUNCTION_FAILED,
    DIED_IN_CALL,
    CONTEXT_CALL_FAILED,
    CONTEXT_CALL_RETURNED,
    DEVICE_COUNT_LOW,
    STALL,
    STALL_END_CUINIT,
    STALL_END_IOCTL,
    STALL_END_THREAD_EXITED,
    STALL_END_NOT_IN_FLIGHT,
    FORK,
    EXEC,
    PROCESS_EXIT,
    DIAGNOSIS_OBSERVED,
    DIAGNOSIS_HOST,
    REPEATED,
    STARTED,
    STOPPED,
    LIBCUDA_ATTACHED,
    LIBCUDA_ATTACH_FAILED,
    LIBCUDA_FLAG_UNUSABLE,
    LIBCUDA_NOT_FOUND,
    LIBCUDA_UNRESOLVED,
    FDS_LEARNED,
    IN_FLIGHT_AT_START,
    MODULE_LOADED,
    MODULE_UNLOADED,
    DRIVER_LAYOUT_EXACT,
    DRIVER_LAYOUT_NEAREST,
    FEATURE_OFF,
    EVIDENCE_CHANGED,
    SWEEP,
    OTLP_STARTED,
    OTLP_DROPPED,
    OTLP_EXPORT_RECOVERED,
    OTLP_EXPORT_RETRYING,
    OTLP_EXPORT_DROPPED,
    OTLP_EXPORTER_FAILED,
    OTLP_SHUTDOWN,
    CAPTURE_WRITTEN,
    CAPTURE_WRITE_FAILED,
];

/// Whether `names` are the names of `record`'s fields, in its order: the compile-time check
/// of [`write_record!`](crate::write_record).
pub const fn fields_are(record: &Record, names: &[&str]) -> bool {
    if record.fields.len() != names.len() {
        return false;
    }
    let mut i = 0;
    while i < names.len() {
        let (a, b) = (record.fields[i].name.as_bytes(), names[i].as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut j = 0;
        while j < a.len() {
            if a[j] != b[j] {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

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
         Records other than these (from the loader, at `debug` level) have no `event` field \
         and no stable schema.\n",
    );
    for r in RECORDS {
        s.push_str(&format!(
            "\n## `{}` ({}): {}\n\n",
            r.event,
            r.level.as_str(),
            r.message
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
            assert_eq!(r.level.as_str(), level, "{key}");
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

//! Perfetto trace files: a [`Capture`] written as protobuf `Trace` packets and read back.
//!
//! The messages below are hand-written [`prost`] structs holding only the fields this
//! writer uses. Field numbers and types are Perfetto's, from its proto definitions
//! (`protos/perfetto/trace/...` in the Perfetto repository, merged into
//! `protos/perfetto/trace/perfetto_trace.proto`); each struct names its source file. The
//! tests decode what is written here with the definitions Perfetto ships
//! (`perfetto_trace_pb2` of the PyPI `perfetto` package) and check that no field is
//! unknown to them.
//!
//! Layout: one packet sequence. A `ClockSnapshot` (BOOTTIME, MONOTONIC, REALTIME read at
//! the same moment; MONOTONIC is the trace's primary clock), a `TrackDescriptor` per
//! process, thread and counter track, then `TrackEvent` packets in time order, each
//! stamped `timestamp_clock_id = MONOTONIC` so times are the agent's own. Names are plain
//! strings (no interning), arguments are debug annotations.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use prost::Message;

use super::model::{Arg, Capture, Event, Kind, Meta, Process, Thread, AGENT_PROCESS_NAME};
use super::model::{CAPTURE_ENDED, CAPTURE_STARTED};

/// `BuiltinClock` values (`protos/perfetto/common/builtin_clock.proto`).
pub mod clock_id {
    /// `BUILTIN_CLOCK_REALTIME`.
    pub const REALTIME: u32 = 1;
    /// `BUILTIN_CLOCK_MONOTONIC`.
    pub const MONOTONIC: u32 = 3;
    /// `BUILTIN_CLOCK_BOOTTIME`.
    pub const BOOTTIME: u32 = 6;
}

/// `TrackEvent.Type` values (`protos/perfetto/trace/track_event/track_event.proto`).
pub mod event_type {
    /// `TYPE_SLICE_BEGIN`.
    pub const SLICE_BEGIN: i32 = 1;
    /// `TYPE_SLICE_END`.
    pub const SLICE_END: i32 = 2;
    /// `TYPE_INSTANT`.
    pub const INSTANT: i32 = 3;
    /// `TYPE_COUNTER`.
    pub const COUNTER: i32 = 4;
}

/// `TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED`
/// (`protos/perfetto/trace/trace_packet.proto`).
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
/// `CounterDescriptor.Unit.UNIT_COUNT`
/// (`protos/perfetto/trace/track_event/counter_descriptor.proto`).
pub const UNIT_COUNT: i32 = 2;
/// The one packet sequence of a capture.
pub const SEQUENCE_ID: u32 = 1;

/// `Trace` (`protos/perfetto/trace/trace.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct Trace {
    /// `repeated TracePacket packet = 1`.
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// `TracePacket` (`protos/perfetto/trace/trace_packet.proto`), the fields used here.
#[derive(Clone, PartialEq, Message)]
pub struct TracePacket {
    /// `ClockSnapshot clock_snapshot = 6` (in the `data` oneof).
    #[prost(message, optional, tag = "6")]
    pub clock_snapshot: Option<ClockSnapshot>,
    /// `uint64 timestamp = 8`.
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    /// `uint32 trusted_packet_sequence_id = 10`.
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    /// `TrackEvent track_event = 11` (in the `data` oneof).
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    /// `uint32 sequence_flags = 13`.
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    /// `bool incremental_state_cleared = 41`.
    #[prost(bool, optional, tag = "41")]
    pub incremental_state_cleared: Option<bool>,
    /// `uint32 timestamp_clock_id = 58`.
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    /// `TrackDescriptor track_descriptor = 60` (in the `data` oneof).
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
    /// `bool first_packet_on_sequence = 87`.
    #[prost(bool, optional, tag = "87")]
    pub first_packet_on_sequence: Option<bool>,
}

/// `ClockSnapshot` (`protos/perfetto/trace/clock_snapshot.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct ClockSnapshot {
    /// `repeated Clock clocks = 1`.
    #[prost(message, repeated, tag = "1")]
    pub clocks: Vec<SnapshotClock>,
    /// `BuiltinClock primary_trace_clock = 2`.
    #[prost(int32, optional, tag = "2")]
    pub primary_trace_clock: Option<i32>,
}

/// `ClockSnapshot.Clock` (`protos/perfetto/trace/clock_snapshot.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct SnapshotClock {
    /// `uint32 clock_id = 1`.
    #[prost(uint32, optional, tag = "1")]
    pub clock_id: Option<u32>,
    /// `uint64 timestamp = 2`.
    #[prost(uint64, optional, tag = "2")]
    pub timestamp: Option<u64>,
}

/// `TrackDescriptor` (`protos/perfetto/trace/track_event/track_descriptor.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct TrackDescriptor {
    /// `uint64 uuid = 1`.
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    /// `string name = 2` (in the `static_or_dynamic_name` oneof).
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// `ProcessDescriptor process = 3`.
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    /// `ThreadDescriptor thread = 4`.
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    /// `uint64 parent_uuid = 5`.
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    /// `CounterDescriptor counter = 8`.
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

/// `ProcessDescriptor` (`protos/perfetto/trace/track_event/process_descriptor.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct ProcessDescriptor {
    /// `int32 pid = 1`.
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// `repeated string cmdline = 2`.
    #[prost(string, repeated, tag = "2")]
    pub cmdline: Vec<String>,
    /// `string process_name = 6`.
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
    /// `repeated string process_labels = 8`.
    #[prost(string, repeated, tag = "8")]
    pub process_labels: Vec<String>,
}

/// `ThreadDescriptor` (`protos/perfetto/trace/track_event/thread_descriptor.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct ThreadDescriptor {
    /// `int32 pid = 1`.
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// `int64 tid = 2`.
    #[prost(int64, optional, tag = "2")]
    pub tid: Option<i64>,
    /// `string thread_name = 5`.
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// `CounterDescriptor` (`protos/perfetto/trace/track_event/counter_descriptor.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct CounterDescriptor {
    /// `Unit unit = 3`.
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
    /// `string unit_name = 6`.
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
}

/// `TrackEvent` (`protos/perfetto/trace/track_event/track_event.proto`), the fields used.
#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    /// `repeated DebugAnnotation debug_annotations = 4`.
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// `Type type = 9`.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    /// `uint64 track_uuid = 11`.
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    /// `repeated string categories = 22`.
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    /// `string name = 23` (in the `name_field` oneof).
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    /// `int64 counter_value = 30` (in the `counter_value_field` oneof).
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
}

/// `DebugAnnotation` (`protos/perfetto/trace/track_event/debug_annotation.proto`): a
/// named argument; one of the value fields is set.
#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotation {
    /// `bool bool_value = 2`.
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    /// `uint64 uint_value = 3`.
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    /// `int64 int_value = 4`.
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    /// `string string_value = 6`.
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    /// `string name = 10` (in the `name_field` oneof).
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

/// Track uuid of a process.
fn process_uuid(pid: u32) -> u64 {
    (1u64 << 48) | pid as u64
}

/// Track uuid of a thread.
fn thread_uuid(pid: u32, tid: u32) -> u64 {
    (2u64 << 48) | ((pid as u64) << 24) | (tid as u64 & 0xff_ffff)
}

/// Track uuid of the `n`-th counter track.
fn counter_uuid(n: u64) -> u64 {
    (3u64 << 48) | n
}

fn process_labels(p: &Process) -> Vec<String> {
    let mut l = Vec::new();
    if let Some(n) = p.ns_pid {
        l.push(format!("ns_pid={n}"));
    }
    if let Some(c) = &p.container_id {
        l.push(format!("container={c}"));
    }
    if !p.exe.is_empty() {
        l.push(format!("exe={}", p.exe));
    }
    l
}

fn annotation(name: &str, v: &Arg) -> DebugAnnotation {
    let mut a = DebugAnnotation {
        name: Some(name.to_string()),
        ..DebugAnnotation::default()
    };
    match v {
        Arg::Str(s) => a.string_value = Some(s.clone()),
        Arg::Int(i) => a.int_value = Some(*i),
        Arg::Uint(u) => a.uint_value = Some(*u),
        Arg::Bool(b) => a.bool_value = Some(*b),
    }
    a
}

fn seq_packet() -> TracePacket {
    TracePacket {
        trusted_packet_sequence_id: Some(SEQUENCE_ID),
        ..TracePacket::default()
    }
}

fn descriptor_packet(d: TrackDescriptor) -> TracePacket {
    TracePacket {
        track_descriptor: Some(d),
        ..seq_packet()
    }
}

fn event_packet(ts: u64, e: TrackEvent) -> TracePacket {
    TracePacket {
        timestamp: Some(ts),
        timestamp_clock_id: Some(clock_id::MONOTONIC),
        track_event: Some(e),
        ..seq_packet()
    }
}

/// The capture as a Perfetto `Trace`.
pub fn to_trace(c: &Capture) -> Trace {
    let m = &c.meta;
    let mut packets = vec![TracePacket {
        clock_snapshot: Some(ClockSnapshot {
            clocks: [
                (clock_id::BOOTTIME, m.boottime_ns),
                (clock_id::MONOTONIC, m.clock.mono_ns),
                (clock_id::REALTIME, m.clock.unix_ns),
            ]
            .into_iter()
            .map(|(id, ts)| SnapshotClock {
                clock_id: Some(id),
                timestamp: Some(ts),
            })
            .collect(),
            primary_trace_clock: Some(clock_id::MONOTONIC as i32),
        }),
        sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
        incremental_state_cleared: Some(true),
        first_packet_on_sequence: Some(true),
        ..seq_packet()
    }];

    packets.push(descriptor_packet(TrackDescriptor {
        uuid: Some(process_uuid(m.agent_pid)),
        process: Some(ProcessDescriptor {
            pid: Some(m.agent_pid as i32),
            process_name: Some(AGENT_PROCESS_NAME.into()),
            ..ProcessDescriptor::default()
        }),
        ..TrackDescriptor::default()
    }));
    for p in &c.processes {
        packets.push(descriptor_packet(TrackDescriptor {
            uuid: Some(process_uuid(p.pid)),
            process: Some(ProcessDescriptor {
                pid: Some(p.pid as i32),
                cmdline: p.cmdline.clone(),
                process_name: Some(p.name.clone()),
                process_labels: process_labels(p),
            }),
            ..TrackDescriptor::default()
        }));
    }
    for t in &c.threads {
        packets.push(descriptor_packet(TrackDescriptor {
            uuid: Some(thread_uuid(t.pid, t.tid)),
            thread: Some(ThreadDescriptor {
                pid: Some(t.pid as i32),
                tid: Some(t.tid as i64),
                thread_name: Some(t.name.clone()),
            }),
            ..TrackDescriptor::default()
        }));
    }
    let mut counters: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for e in &c.events {
        if let Kind::Counter { .. } = e.kind {
            let n = counters.len() as u64;
            counters.entry((e.pid, e.name.clone())).or_insert(n);
        }
    }
    for ((pid, name), n) in &counters {
        packets.push(descriptor_packet(TrackDescriptor {
            uuid: Some(counter_uuid(*n)),
            name: Some(name.clone()),
            parent_uuid: Some(process_uuid(*pid)),
            counter: Some(CounterDescriptor {
                unit: Some(UNIT_COUNT),
                unit_name: None,
            }),
            ..TrackDescriptor::default()
        }));
    }

    // Slices become begin/end pairs, properly nested per track; then everything is
    // merged in time order (a stable sort keeps each track's own order for equal times).
    let track_of = |e: &Event| match e.tid {
        Some(tid) => thread_uuid(e.pid, tid),
        None => process_uuid(e.pid),
    };
    let mut timed: Vec<(u64, TracePacket)> = Vec::new();
    let mut by_track: BTreeMap<u64, Vec<&Event>> = BTreeMap::new();
    for e in &c.events {
        if let Kind::Slice { .. } = e.kind {
            by_track.entry(track_of(e)).or_default().push(e);
        }
    }
    for (track, slices) in by_track {
        let end = |ts: u64| {
            (
                ts,
                event_packet(
                    ts,
                    TrackEvent {
                        r#type: Some(event_type::SLICE_END),
                        track_uuid: Some(track),
                        ..TrackEvent::default()
                    },
                ),
            )
        };
        // Ends of the open slices, innermost last; a slice that would outlive its parent
        // is cut at the parent's end so the nesting stays valid.
        let mut stack: Vec<u64> = Vec::new();
        for e in slices {
            while let Some(&top) = stack.last() {
                if top > e.ts_ns {
                    break;
                }
                timed.push(end(top));
                stack.pop();
            }
            let mut stop = e.end_ns();
            if let Some(&top) = stack.last() {
                stop = stop.min(top);
            }
            timed.push((
                e.ts_ns,
                event_packet(e.ts_ns, named(e, event_type::SLICE_BEGIN, track)),
            ));
            stack.push(stop);
        }
        while let Some(top) = stack.pop() {
            timed.push(end(top));
        }
    }
    for e in &c.events {
        match e.kind {
            Kind::Slice { .. } => {}
            Kind::Instant => timed.push((
                e.ts_ns,
                event_packet(e.ts_ns, named(e, event_type::INSTANT, track_of(e))),
            )),
            Kind::Counter { value } => {
                let uuid = counter_uuid(counters[&(e.pid, e.name.clone())]);
                timed.push((
                    e.ts_ns,
                    event_packet(
                        e.ts_ns,
                        TrackEvent {
                            r#type: Some(event_type::COUNTER),
                            track_uuid: Some(uuid),
                            counter_value: Some(value),
                            ..TrackEvent::default()
                        },
                    ),
                ))
            }
        }
    }
    timed.sort_by_key(|(ts, _)| *ts);
    packets.extend(timed.into_iter().map(|(_, p)| p));
    Trace { packet: packets }
}

fn named(e: &Event, ty: i32, track: u64) -> TrackEvent {
    TrackEvent {
        debug_annotations: e.args.iter().map(|(k, v)| annotation(k, v)).collect(),
        r#type: Some(ty),
        track_uuid: Some(track),
        categories: vec![e.cat.clone()],
        name: Some(e.name.clone()),
        counter_value: None,
    }
}

/// The capture as Perfetto protobuf bytes.
pub fn encode(c: &Capture) -> Vec<u8> {
    to_trace(c).encode_to_vec()
}

/// What a track is, read back.
enum TrackInfo {
    Process(u32),
    Thread(u32, u32),
    Counter(u32, String),
}

/// Reads a capture written by [`encode`] back.
///
/// # Errors
/// Not protobuf, or not a uvmwatch capture (no capture-started record, a timestamp in
/// another clock, an event on an unknown track).
pub fn decode(bytes: &[u8]) -> Result<Capture> {
    let trace = Trace::decode(bytes).context("not a Perfetto protobuf trace")?;
    let mut tracks: BTreeMap<u64, TrackInfo> = BTreeMap::new();
    let mut processes = Vec::new();
    let mut threads = Vec::new();
    for p in &trace.packet {
        let Some(d) = &p.track_descriptor else {
            continue;
        };
        let uuid = d.uuid.unwrap_or(0);
        if let Some(pd) = &d.process {
            let pid = pd.pid.unwrap_or(0) as u32;
            tracks.insert(uuid, TrackInfo::Process(pid));
            let mut proc = Process {
                pid,
                name: pd.process_name.clone().unwrap_or_default(),
                cmdline: pd.cmdline.clone(),
                ..Process::default()
            };
            for l in &pd.process_labels {
                if let Some(v) = l.strip_prefix("ns_pid=") {
                    proc.ns_pid = v.parse().ok();
                } else if let Some(v) = l.strip_prefix("container=") {
                    proc.container_id = Some(v.to_string());
                } else if let Some(v) = l.strip_prefix("exe=") {
                    proc.exe = v.to_string();
                }
            }
            processes.push(proc);
        } else if let Some(td) = &d.thread {
            let (pid, tid) = (td.pid.unwrap_or(0) as u32, td.tid.unwrap_or(0) as u32);
            tracks.insert(uuid, TrackInfo::Thread(pid, tid));
            threads.push(Thread {
                pid,
                tid,
                name: td.thread_name.clone().unwrap_or_default(),
            });
        } else if d.counter.is_some() {
            let pid = match d.parent_uuid.and_then(|u| tracks.get(&u)) {
                Some(TrackInfo::Process(pid)) => *pid,
                _ => bail!("counter track {uuid} has no process"),
            };
            tracks.insert(
                uuid,
                TrackInfo::Counter(pid, d.name.clone().unwrap_or_default()),
            );
        }
    }

    let mut events = Vec::new();
    let mut open: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    for p in &trace.packet {
        let Some(te) = &p.track_event else {
            continue;
        };
        if p.timestamp_clock_id != Some(clock_id::MONOTONIC) {
            bail!("event not timed with CLOCK_MONOTONIC: not a uvmwatch capture");
        }
        let ts = p.timestamp.unwrap_or(0);
        let uuid = te.track_uuid.unwrap_or(0);
        let track = tracks
            .get(&uuid)
            .with_context(|| format!("event on unknown track {uuid}"))?;
        let (pid, tid) = match track {
            TrackInfo::Process(pid) => (*pid, None),
            TrackInfo::Thread(pid, tid) => (*pid, Some(*tid)),
            TrackInfo::Counter(pid, name) => {
                events.push(Event {
                    ts_ns: ts,
                    pid: *pid,
                    tid: None,
                    name: name.clone(),
                    cat: super::model::cat::COUNTER.into(),
                    kind: Kind::Counter {
                        value: te.counter_value.unwrap_or(0),
                    },
                    args: Vec::new(),
                });
                continue;
            }
        };
        let ev = || Event {
            ts_ns: ts,
            pid,
            tid,
            name: te.name.clone().unwrap_or_default(),
            cat: te.categories.first().cloned().unwrap_or_default(),
            kind: Kind::Instant,
            args: te.debug_annotations.iter().map(read_annotation).collect(),
        };
        match te.r#type {
            Some(event_type::SLICE_BEGIN) => open.entry(uuid).or_default().push(ev()),
            Some(event_type::SLICE_END) => {
                let mut e = open
                    .get_mut(&uuid)
                    .and_then(Vec::pop)
                    .with_context(|| format!("slice end without a begin on track {uuid}"))?;
                e.kind = Kind::Slice {
                    dur_ns: ts.saturating_sub(e.ts_ns),
                };
                events.push(e);
            }
            Some(event_type::INSTANT) => events.push(ev()),
            other => bail!("unexpected track event type {other:?}"),
        }
    }
    let started = events
        .iter()
        .find(|e| e.name == CAPTURE_STARTED && e.cat == super::model::cat::CAPTURE)
        .context("no capture-started record: not a uvmwatch capture")?;
    let ended = events
        .iter()
        .find(|e| e.name == CAPTURE_ENDED && e.cat == super::model::cat::CAPTURE);
    let mut meta =
        Meta::from_instants(started, ended).context("capture-started record without the clock")?;
    if let Some(snap) = trace.packet.iter().find_map(|p| p.clock_snapshot.as_ref()) {
        if let Some(b) = snap
            .clocks
            .iter()
            .find(|c| c.clock_id == Some(clock_id::BOOTTIME))
        {
            meta.boottime_ns = b.timestamp.unwrap_or(meta.boottime_ns);
        }
    }
    processes.retain(|p| p.pid != meta.agent_pid);
    Ok(Capture::normalized(meta, processes, threads, events))
}

fn read_annotation(a: &DebugAnnotation) -> (String, Arg) {
    let v = if let Some(s) = &a.string_value {
        Arg::Str(s.clone())
    } else if let Some(i) = a.int_value {
        Arg::Int(i)
    } else if let Some(u) = a.uint_value {
        Arg::from(u)
    } else if let Some(b) = a.bool_value {
        Arg::Bool(b)
    } else {
        Arg::Str(String::new())
    };
    (a.name.clone().unwrap_or_default(), v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::capture::testing::story;

    #[test]
    fn round_trips() {
        let c = story();
        let back = decode(&encode(&c)).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn starts_with_a_clock_snapshot_and_times_events_in_monotonic() {
        let c = story();
        let t = to_trace(&c);
        let snap = t.packet[0].clock_snapshot.as_ref().unwrap();
        let ids: Vec<u32> = snap.clocks.iter().map(|c| c.clock_id.unwrap()).collect();
        assert_eq!(ids, vec![6, 3, 1]);
        assert_eq!(snap.clocks[2].timestamp, Some(c.meta.clock.unix_ns));
        assert_eq!(t.packet[0].sequence_flags, Some(1));
        let mut last = 0;
        for p in &t.packet {
            assert_eq!(p.trusted_packet_sequence_id, Some(SEQUENCE_ID));
            if p.track_event.is_some() {
                assert_eq!(p.timestamp_clock_id, Some(3));
                let ts = p.timestamp.unwrap();
                assert!(ts >= last, "packets in time order");
                last = ts;
            }
        }
    }

    #[test]
    fn slices_nest_per_track() {
        let t = to_trace(&story());
        let mut depth: BTreeMap<u64, i32> = BTreeMap::new();
        let mut max_depth = 0;
        for p in &t.packet {
            let Some(e) = &p.track_event else { continue };
            let d = depth.entry(e.track_uuid.unwrap()).or_default();
            match e.r#type {
                Some(event_type::SLICE_BEGIN) => *d += 1,
                Some(event_type::SLICE_END) => *d -= 1,
                _ => {}
            }
            assert!(*d >= 0);
            max_depth = max_depth.max(*d);
        }
        assert!(depth.values().all(|d| *d == 0));
        assert_eq!(max_depth, 2, "ioctls inside cuInit");
    }

    #[test]
    fn a_child_outliving_its_parent_is_cut_at_the_parent_end() {
        let mut c = story();
        let cu = c
            .events
            .iter()
            .position(|e| e.name == "cuInit" && e.tid == Some(4242))
            .unwrap();
        let (start, end) = (c.events[cu].ts_ns, c.events[cu].end_ns());
        let mut child = c.events[cu].clone();
        child.name = "late".into();
        child.ts_ns = start + 1;
        child.kind = Kind::Slice {
            dur_ns: end - start + 100,
        };
        c.events.push(child);
        c.normalize();
        let back = decode(&encode(&c)).unwrap();
        let late = back.events.iter().find(|e| e.name == "late").unwrap();
        assert_eq!(late.end_ns(), end);
    }

    #[test]
    fn rejects_what_is_not_a_capture() {
        assert!(decode(b"{\"traceEvents\":[]}").is_err());
        assert!(decode(&Trace { packet: vec![] }.encode_to_vec()).is_err());
    }
}

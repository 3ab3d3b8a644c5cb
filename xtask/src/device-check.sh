#!/usr/bin/env bash
# uvmwatch device check: run the release agent on a real NVIDIA machine while PyTorch
# initialises CUDA, and keep what it saw. Written by `cargo xtask device-check`.
#
# Usage (as root): bash target/device-check/run.sh
# Results: flat files in $OUT (default ./device-check-out):
#   host.txt             kernel, driver, nvidia_uvm parameters, nvidia-smi -q (first 100 lines), tools
#   probes.txt           `uvmwatch probes` (its first lines: the driver and the ioctl layouts
#                        chosen, the syscall backend this kernel allows and why), then the
#                        overhead benchmark's output (`overhead <kernel> <backend>: ...` per
#                        backend the kernel allows, against no agent and the floor)
#   workload.txt         the PyTorch workload: 3 runs without any agent (the baseline), 3 under
#                        `uvmwatch run`, one with CUDA_VISIBLE_DEVICES unset, one captured
#   agent.log            the agent's JSON log, then the capture's
#   metrics.txt          /metrics after the runs under the agent
#   capture.json         `uvmwatch capture` (Chrome JSON) of the last run: every driver call of it
#   report.txt           torch.cuda.init() and matmul times without and with the agent (medians,
#                        ratios), then every driver call of the capture by name, node and result,
#                        the ones the agent could not name first
#   summary.txt          every step with its exit status and duration, then a quick look
# (8 files: what the device tool brings back.)
# Every step has a timeout inside one deadline ($BUDGET, 360 s by default); a missing tool is
# written down, never fatal. About 2-3 minutes normally.
set -u

OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE" || exit 2
LISTEN=127.0.0.1:19400
T0=$(date +%s)
# The whole run's deadline (seconds): every step gets at most what is left of it less
# RESERVE, kept for the report and the summary, so a hang (what the agent is for) still
# leaves them written.
BUDGET="${BUDGET:-360}"
RESERVE=45
left() { echo $((T0 + BUDGET - $(date +%s))); }
# fd 3: the terminal, whatever a step's output is redirected to.
exec 3>&1

note() { echo "$*" | tee -a "$OUT/summary.txt" >&3; }
have() { command -v "$1" >/dev/null 2>&1; }
# t SECONDS CMD...: CMD with a time limit when `timeout` exists.
t() {
    local s=$1
    shift
    if have timeout; then timeout -k 5 "$s" "$@"; else "$@"; fi
}
# step NAME SECONDS CMD...: runs CMD for at most SECONDS (and never past the deadline less
# $RESERVE), records its exit status and duration.
step() {
    local name=$1 s=$2 start rc room
    shift 2
    room=$(($(left) - RESERVE))
    if [ "$room" -le 0 ]; then
        note "step $name: skipped (out of time)"
        return 124
    fi
    [ "$room" -lt "$s" ] && s=$room
    start=$(date +%s)
    t "$s" "$@"
    rc=$?
    note "step $name: exit $rc, $(($(date +%s) - start))s$([ "$rc" = 124 ] && echo " (timed out after ${s}s)")"
    return $rc
}
if have curl; then
    FETCH=(curl -fsS --max-time 5)
else
    FETCH=(python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())')
fi

: >"$OUT/summary.txt"
note "uvmwatch device check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
[ "$(id -u)" = 0 ] || note "warning: not root; the agent needs root"

host_info() {
    echo "== build"
    cat "$HERE/build-info.txt" 2>/dev/null || echo "(no build-info.txt)"
    echo "== uname -a"
    uname -a
    echo "== /proc/cmdline"
    cat /proc/cmdline 2>&1
    echo "== /proc/driver/nvidia/version"
    cat /proc/driver/nvidia/version 2>&1
    echo "== /sys/module/nvidia_uvm/parameters"
    if [ -d /sys/module/nvidia_uvm/parameters ]; then
        for f in /sys/module/nvidia_uvm/parameters/*; do
            echo "$(basename "$f")=$(cat "$f" 2>&1)"
        done
    else
        echo "(absent: nvidia_uvm not loaded, or not visible here)"
    fi
    echo "== nvidia modules (/proc/modules), devices (/proc/devices), nodes"
    grep -i nvidia /proc/modules 2>&1
    grep -i nvidia /proc/devices 2>&1
    ls -l /dev/nvidia* 2>&1
    echo "== kernel features the agent uses"
    for p in /sys/kernel/btf/vmlinux /sys/kernel/tracing/events /sys/kernel/debug/tracing/events \
        /sys/bus/event_source/devices/uprobe /sys/bus/event_source/devices/kprobe; do
        if [ -e "$p" ]; then echo "present: $p"; else echo "absent: $p"; fi
    done
    grep -E '^(nodev)?[[:space:]]*tracefs' /proc/filesystems 2>&1
    echo "== libcuda"
    (ldconfig -p 2>/dev/null | grep -i libcuda) || echo "(not in ldconfig -p)"
    ls -l /usr/local/nvidia/lib64/libcuda* /usr/lib/x86_64-linux-gnu/libcuda* 2>&1
    echo "== tools"
    for x in curl python3 nvidia-smi timeout; do
        if have "$x"; then echo "$x: $(command -v "$x")"; else echo "$x: missing"; fi
    done
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
    echo "== nvidia-smi -q (first 100 lines)"
    if have nvidia-smi; then nvidia-smi -q 2>&1 | head -100; else echo "nvidia-smi: missing"; fi
    echo "== kernel log (nvidia lines, last 40)"
    (dmesg 2>&1 | grep -iE 'nvidia|nvrm|uvm' | tail -40) || true
}
export HERE
export -f have host_info
step host-info 60 bash -c host_info >"$OUT/host.txt" 2>&1

step probes 60 ./uvmwatch probes >"$OUT/probes.txt" 2>&1
# What the agent costs the host here, both backends where the kernel allows them (3 short
# rounds; agent/benches/overhead.rs, docs/testing.md), then its lifecycle with 50 copies of
# this machine's own libcuda (attach time of each new file, stop time, peak memory).
LIBCUDA=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
[ -e "${LIBCUDA:-}" ] || LIBCUDA=$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -1)
step overhead 150 env UVMWATCH_BENCH_AGENT="$HERE/uvmwatch" UVMWATCH_BENCH_ROUNDS=3 \
    UVMWATCH_BENCH_ITERS=100000 UVMWATCH_BENCH_LIBCUDA="${LIBCUDA:-}" UVMWATCH_BENCH_LIBCUDAS=50 \
    ./uvmwatch-overhead --bench >>"$OUT/probes.txt" 2>&1

WORKLOAD='
import json, os, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.cuda.init()
torch.cuda.synchronize()
t2 = time.perf_counter()
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
y = x @ x
torch.cuda.synchronize()
t3 = time.perf_counter()
for _ in range(20):
    y = x @ x
torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
    "import_s": t1 - t0, "cuda_init_s": t2 - t1, "first_matmul_s": t3 - t2,
    "matmul_20_s": t4 - t3, "norm": float(y.float().norm().item())}), flush=True)
'
# runs N LABEL: the workload N times, one JSON line each under "== LABEL run I"; after a run
# that timed out (a hang), no more of them, so the deadline is left to the others.
runs() {
    local n=$1 label=$2 i
    for i in $(seq 1 "$n"); do
        echo "== $label run $i"
        step "$label-$i" 90 python3 -c "$WORKLOAD"
        [ $? = 124 ] && break
    done
}

# 1. The baseline: no agent at all.
runs 3 bare >"$OUT/workload.txt" 2>&1

# 2. Under the agent.
./uvmwatch run --listen "$LISTEN" --log-format json >"$OUT/agent.log" 2>&1 &
AGENT=$!
note "agent started: pid $AGENT"
healthy=no
for _ in $(seq 1 120); do
    [ "$(left)" -gt "$RESERVE" ] || break
    if ! kill -0 "$AGENT" 2>/dev/null; then
        note "agent exited before serving /healthz (see agent.log)"
        break
    fi
    if "${FETCH[@]}" "http://$LISTEN/healthz" >/dev/null 2>&1; then
        healthy=yes
        break
    fi
    sleep 0.5
done
note "agent healthy: $healthy"
{
    runs 3 agent
    echo "== unset run 1 (CUDA_VISIBLE_DEVICES unset)"
    step workload-unset 90 env -u CUDA_VISIBLE_DEVICES python3 -c "$WORKLOAD"
} >>"$OUT/workload.txt" 2>&1

sleep 2
step metrics 15 "${FETCH[@]}" "http://$LISTEN/metrics" >"$OUT/metrics.txt" 2>&1

if kill -0 "$AGENT" 2>/dev/null; then
    kill -TERM "$AGENT"
    for _ in $(seq 1 40); do kill -0 "$AGENT" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$AGENT" 2>/dev/null; then
        note "agent still running 20s after SIGTERM: SIGKILL"
        kill -KILL "$AGENT"
    fi
fi
wait "$AGENT"
note "agent exit status: $?"

# 3. A capture of one more run with every driver call in it (--slow-ioctl 1ns: every call
# counts as slow, so calls outside cuInit are kept too; 0 is refused, as for every duration).
CAPLOG=$(mktemp)
./uvmwatch --log-format json capture --comm python3 --slow-ioctl 1ns --format chrome-json \
    -o "$OUT/capture.json" --duration 100s >"$CAPLOG" 2>&1 &
CAPTURE=$!
for _ in $(seq 1 60); do grep -q '"event":"started"' "$CAPLOG" 2>/dev/null && break; sleep 0.5; done
runs 1 capture >>"$OUT/workload.txt" 2>&1
kill -INT "$CAPTURE" 2>/dev/null
# The capture writes its file on SIGINT; give it 20 s.
for _ in $(seq 1 40); do kill -0 "$CAPTURE" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$CAPTURE" 2>/dev/null; then
    note "capture still running 20s after SIGINT: SIGKILL"
    kill -KILL "$CAPTURE"
fi
wait "$CAPTURE"
note "capture exit status: $?"
{ echo "== uvmwatch capture's log"; cat "$CAPLOG"; } >>"$OUT/agent.log"
rm -f "$CAPLOG"

summarise() {
    python3 - "$OUT" <<'PY'
import json, statistics, sys, collections
out = sys.argv[1]
def runs():
    # One JSON line per run, under its "== <label> run <n>" header.
    rows, label = [], None
    for line in open(f"{out}/workload.txt", errors="replace"):
        line = line.strip()
        if line.startswith("== "):
            label = line.split()[1]
        elif line.startswith("{"):
            try:
                rows.append((label, json.loads(line)))
            except ValueError:
                pass
    return rows
report = open(f"{out}/report.txt", "w")
with report as f:
    rows = runs()
    bare = [r for l, r in rows if l == "bare"]
    agent = [r for l, r in rows if l in ("agent", "capture")]
    f.write(f"runs: {len(bare)} without the agent, {len(agent)} with it (the captured run counts as with)\n")
    for key in ("cuda_init_s", "first_matmul_s", "matmul_20_s"):
        b = [r[key] for r in bare if key in r]
        a = [r[key] for r in agent if key in r]
        if b and a:
            mb, ma = statistics.median(b), statistics.median(a)
            f.write(f"{key:15} without {mb:.4f}s  with {ma:.4f}s  ratio {ma / mb:.3f}  "
                    f"(without: {', '.join(f'{x:.4f}' for x in b)}; with: {', '.join(f'{x:.4f}' for x in a)})\n")
        else:
            f.write(f"{key:15} missing runs\n")
with open(f"{out}/report.txt", "a") as f:
    try:
        events = json.load(open(f"{out}/capture.json"))["traceEvents"]
    except Exception as e:
        f.write(f"capture.json unreadable: {e}\n")
        sys.exit(0)
    calls = collections.Counter()
    unnamed = collections.Counter()
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") != "X" or e.get("cat") != "ioctl":
            continue
        key = (e["name"], a.get("node"), a.get("result"))
        calls[key] += 1
        if e["name"].startswith("0x"):
            unnamed[(e["name"], a.get("node"))] += 1
    f.write(f"{sum(calls.values())} driver calls in the capture, {len(calls)} kinds\n")
    f.write(f"not named by the agent: {sum(unnamed.values())} calls, {len(unnamed)} kinds\n")
    for (name, node), n in sorted(unnamed.items()):
        f.write(f"  UNNAMED {name} on {node}: {n}\n")
    f.write("by name, node and result:\n")
    for (name, node, result), n in sorted(calls.items(), key=lambda kv: -kv[1]):
        f.write(f"  {n:6}  {name} on {node}: {result}\n")
PY
}
export OUT
export -f summarise
RESERVE=0 step summarise 30 bash -c summarise

note "-- quick look"
note "driver and layouts: $(head -1 "$OUT/probes.txt" 2>/dev/null)"
note "layout metric: $(grep -E '^uvmwatch_ioctl_layout_info' "$OUT/metrics.txt" 2>/dev/null)"
note "$(grep -E '^not named' "$OUT/report.txt" 2>/dev/null)"
while IFS= read -r l; do note "overhead: $l"; done < <(grep -E 'ratio|missing' "$OUT/report.txt" 2>/dev/null)
note "cuInit results: $(grep -E '^uvmwatch_cuinit_calls_total' "$OUT/metrics.txt" 2>/dev/null | tr '\n' ' ')"
note "libcuda targets: $(grep -E '^uvmwatch_libcuda_targets' "$OUT/metrics.txt" 2>/dev/null)"
note "probes not attached: $(grep -E '^uvmwatch_probe_attached.* 0$' "$OUT/metrics.txt" 2>/dev/null | wc -l)"
note "agent log: $(wc -l <"$OUT/agent.log") lines, $(grep -c '"event":"cuinit_end"' "$OUT/agent.log") cuinit_end, $(grep -c '"event":"stall"' "$OUT/agent.log") stall, $(grep -c '"level":"ERROR"' "$OUT/agent.log") ERROR"
note "total: $(($(date +%s) - T0))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"

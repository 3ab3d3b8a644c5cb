#!/usr/bin/env bash
# uvmwatch device check: run the release agent on a real NVIDIA machine while PyTorch
# initialises CUDA, and keep what it saw. Written by `cargo xtask device-check`.
#
# Usage (as root): bash target/device-check/run.sh
# Results: six flat files in $OUT (default ./device-check-out):
#   host.txt      kernel, driver, nvidia_uvm parameters, nvidia-smi -q (first 100 lines), tools
#   probes.txt    `uvmwatch probes`
#   agent.log     the agent's JSON log
#   workload.txt  the PyTorch runs (default environment, then CUDA_VISIBLE_DEVICES unset)
#   metrics.txt   /metrics after the runs
#   summary.txt   every step with its exit status and duration
# Every step has a timeout; a missing tool is written down, never fatal. About 1-2 minutes
# normally, under 5 at worst.
set -u

OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE" || exit 2
LISTEN=127.0.0.1:19400
T0=$(date +%s)
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
# step NAME SECONDS CMD...: runs CMD, records its exit status and duration.
step() {
    local name=$1 s=$2 start rc
    shift 2
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

./uvmwatch run --listen "$LISTEN" --log-format json >"$OUT/agent.log" 2>&1 &
AGENT=$!
note "agent started: pid $AGENT"
healthy=no
for _ in $(seq 1 120); do
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

WORKLOAD='
import os, time
t0 = time.time()
import torch
t1 = time.time()
print("torch", torch.__version__, "cuda", torch.version.cuda, "pid", os.getpid(),
      "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
torch.cuda.init()
t2 = time.time()
print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count(), flush=True)
x = torch.randn(4096, 4096, device="cuda")
y = x @ x
torch.cuda.synchronize()
t3 = time.time()
print(f"import {t1-t0:.2f}s cuda.init {t2-t1:.2f}s matmul+sync {t3-t2:.2f}s "
      f"y.norm {y.norm().item():.1f}", flush=True)
'
{
    echo "== run 1: default environment"
    step workload-1 90 python3 -c "$WORKLOAD"
    echo "== run 2: CUDA_VISIBLE_DEVICES unset"
    step workload-2 90 env -u CUDA_VISIBLE_DEVICES python3 -c "$WORKLOAD"
} >"$OUT/workload.txt" 2>&1

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

note "-- quick look"
note "cuInit results: $(grep -E '^uvmwatch_cuinit_calls_total' "$OUT/metrics.txt" 2>/dev/null | tr '\n' ' ')"
note "libcuda targets: $(grep -E '^uvmwatch_libcuda_targets' "$OUT/metrics.txt" 2>/dev/null)"
note "probes not attached: $(grep -E '^uvmwatch_probe_attached.* 0$' "$OUT/metrics.txt" 2>/dev/null | wc -l)"
note "agent log: $(wc -l <"$OUT/agent.log") lines, $(grep -c '"event":"cuinit_end"' "$OUT/agent.log") cuinit_end, $(grep -c '"event":"stall"' "$OUT/agent.log") stall, $(grep -c '"level":"ERROR"' "$OUT/agent.log") ERROR"
note "total: $(($(date +%s) - T0))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"

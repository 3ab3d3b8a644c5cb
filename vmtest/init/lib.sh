# Helpers for vmtest/init/tests.sh and nvidia.sh (busybox sh). Sourced by /init, before the
# series' script (which may set LIBCUDA: the library agent_start gives `--libcuda`).
#
# A test is a shell function `test_<name>` listed in VMTEST_TESTS. It records checks with
# `check DESC CMD...` (or `note TEXT`, `bad TEXT`) and may end early with `skip REASON`; the
# runner prints exactly one line per test:
#     VMTEST <name> PASS <notes>
#     VMTEST <name> FAIL <failed checks>; <notes>
#     VMTEST <name> SKIP <reason>
# Test-local files live in /tmp/<name>/; the console (ttyS0) is the host's only channel.

AGENT_LOG=/tmp/agent.log
AGENT_PIDFILE=/tmp/agent.pid
# The libcuda agent_start probes (`--libcuda`) and run_workload loads: the testbed's fake in
# the stub series; nvidia.sh sets the real one.
LIBCUDA=/opt/fakecuda/libcuda.so.1
MODDIR=/vmtest/modules
# The nvidia series: NVIDIA's modules, and `deps` (the kernel modules nvidia.ko needs, in
# load order, from the kernel's own package).
NVDIR=/vmtest/nvidia
UVM_PARAMS=/sys/module/nvidia_uvm/parameters

say() { echo "$*"; }

# --- per-test state ------------------------------------------------------------------------
t_reset() { T_FAILS=""; T_NOTES=""; T_SKIP=""; }
note() { T_NOTES="${T_NOTES:+$T_NOTES; }$*"; }
bad() { T_FAILS="${T_FAILS:+$T_FAILS; }$*"; }
# check DESC CMD...: runs CMD; a non-zero status records DESC as failed.
check() {
	_d=$1
	shift
	if "$@" >/dev/null 2>&1; then return 0; fi
	bad "$_d"
	return 1
}
skip() { T_SKIP="$*"; }

one_line() { tr '\n\t' '  ' | sed 's/  */ /g; s/ *$//'; }

# run_test NAME [SUFFIX]: runs test_NAME, its result line named NAME SUFFIX (the backend).
run_test() {
	_fn=$1
	_name=$1$2
	t_reset
	rm -rf "/tmp/$_fn"
	mkdir -p "/tmp/$_fn"
	_t0=$(date +%s)
	say "--- test $_name"
	"test_$_fn"
	_dt=$(($(date +%s) - _t0))
	if [ -n "$T_SKIP" ]; then
		say "VMTEST $_name SKIP $(echo "$T_SKIP" | one_line)"
	elif [ -n "$T_FAILS" ]; then
		say "VMTEST $_name FAIL $(echo "$T_FAILS${T_NOTES:+; $T_NOTES} (${_dt}s)" | one_line)"
	else
		say "VMTEST $_name PASS $(echo "${T_NOTES:-ok} (${_dt}s)" | one_line)"
	fi
}

# Runs the tests named in VMTEST_TESTS, or only those in `vmtest.only=a,b` on the kernel
# command line: those of VMTEST_ONCE once, every other once per backend of VMTEST_BACKENDS
# (the agent's `--probe-backend`, through UVMWATCH_PROBE_BACKEND; result names get
# `[<backend>]`), then VMTEST_FINAL once.
vmtest_main() {
	_only=$(sed -n 's/.*vmtest\.only=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' ')
	say ""
	say "VMTEST-BEGIN kernel=$(uname -r) series=${VMTEST_SERIES:-stub} cpus=$(nproc) mem_kb=$(sed -n 's/MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
	_first=1
	for _b in $VMTEST_BACKENDS; do
		export UVMWATCH_PROBE_BACKEND="$_b"
		for _t in $VMTEST_TESTS; do
			if [ -n "$_only" ]; then
				case " $_only " in *" $_t "*) ;; *) continue ;; esac
			fi
			case " $(echo $VMTEST_ONCE) " in
			*" $_t "*) [ "$_first" = 1 ] && run_test "$_t" ;;
			*) run_test "$_t" "[$_b]" ;;
			esac
		done
		vmtest_pass_done "$_b"
		_first=0
	done
	unset UVMWATCH_PROBE_BACKEND
	for _t in $VMTEST_FINAL; do
		if [ -n "$_only" ]; then
			case " $_only " in *" $_t "*) ;; *) continue ;; esac
		fi
		run_test "$_t"
	done
	vmtest_finish
	say "VMTEST-END uptime=$(cut -d' ' -f1 /proc/uptime)"
}

# --- waiting -------------------------------------------------------------------------------
# wait_for SECONDS CMD...: polls CMD every 0.2 s until it succeeds; status 1 on timeout.
wait_for() {
	_limit=$(($1 * 5))
	shift
	_i=0
	while [ "$_i" -lt "$_limit" ]; do
		"$@" >/dev/null 2>&1 && return 0
		usleep 200000
		_i=$((_i + 1))
	done
	return 1
}

# --- the agent's JSON log (one record per line; matched with grep, no JSON parser) ----------
# log_lines PATTERN...: the agent log lines that contain every fixed string given.
log_lines() {
	cp "$AGENT_LOG" /tmp/.ll.0
	_n=0
	for _p in "$@"; do
		grep -F -e "$_p" "/tmp/.ll.$_n" >"/tmp/.ll.$((_n + 1))"
		_n=$((_n + 1))
	done
	cat "/tmp/.ll.$_n"
}
# log_has PATTERN...: some line of the agent log contains every fixed string given.
log_has() { [ -n "$(log_lines "$@")" ]; }
# json_field LINE KEY: the value of "KEY" (string or number) in one JSON record.
json_field() {
	echo "$1" | sed -n "s/.*\"$2\":\"\\([^\"]*\\)\".*/\\1/p; t; s/.*\"$2\":\\([^,}]*\\).*/\\1/p" | head -n1
}
pid_key() { echo "\"pid\":$1,"; }

agent_alive() { [ -f "$AGENT_PIDFILE" ] && kill -0 "$(cat "$AGENT_PIDFILE")" 2>/dev/null; }

# agent_start [EXTRA ARGS]: starts `uvmwatch run` in the background and waits for its
# "started" record (eBPF verification under TCG takes a few seconds).
agent_start() {
	: >"$AGENT_LOG"
	uvmwatch --log-format json --log-level "${AGENT_LOG_LEVEL:-info}" run \
		--listen 127.0.0.1:19400 --ioctl-stall 1s --cuinit-stall 2s \
		--libcuda "$LIBCUDA" "$@" >/tmp/agent.stdout 2>>"$AGENT_LOG" &
	echo $! >"$AGENT_PIDFILE"
	wait_for 120 log_has '"event":"started"'
}

agent_stop() {
	agent_alive || return 0
	_p=$(cat "$AGENT_PIDFILE")
	kill -TERM "$_p"
	wait_for 30 sh -c "! kill -0 $_p 2>/dev/null"
	wait "$_p" 2>/dev/null
	_rc=$?
	rm -f "$AGENT_PIDFILE"
	return $_rc
}

# http_get PATH: body of GET http://127.0.0.1:19400/PATH (busybox nc, no wget).
http_get() {
	# nc stops reading when its stdin ends: keep it open until the answer is in.
	(printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1"; sleep 2) |
		nc -w 5 127.0.0.1 19400 | tr -d '\r' | sed '1,/^$/d'
}

# metric SERIES: the value of one /metrics series, e.g.
#   metric 'uvmwatch_probe_attached{probe="uprobe:cuInit"}'
# (the whole series as printed, labels in the agent's order); empty when absent.
metric() { http_get /metrics | grep -F "$1 " | grep -v '^#' | head -n1 | sed 's/.* //'; }

# kallsyms_missing MODULE NAME...: prints the NAMEs that are not text symbols of MODULE
# ("" for the kernel itself) in kallsyms, in one pass over a snapshot (/proc/kallsyms is
# slow to read under TCG; load_uvm refreshes the snapshot).
KALLSYMS=/tmp/kallsyms.text
kallsyms_refresh() { grep ' [tT] ' /proc/kallsyms >"$KALLSYMS"; }
kallsyms_missing() {
	[ -s "$KALLSYMS" ] || kallsyms_refresh
	_mod=$1
	shift
	awk -v want="$*" -v mod="${_mod:+[$_mod]}" '
		BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
		($3 in need) && $4 == mod { found[$3] = 1 }
		END { for (i = 1; i <= n; i++) if (!(w[i] in found)) printf " %s", w[i] }
	' "$KALLSYMS"
}
# kallsyms_has NAME [MODULE]: NAME is a text symbol (of MODULE) in kallsyms.
kallsyms_has() { [ -z "$(kallsyms_missing "$2" "$1")" ]; }

# --- the test module --------------------------------------------------------------------------
uvm_mode() { echo "$1" >"$UVM_PARAMS/mode"; }
uvm_stat() { tr ' ' '\n' <"$UVM_PARAMS/stats" | sed -n "s/^$1=//p"; }

# make_nodes [nogpu]: mknod the device nodes from /proc/devices, as nvidia-modprobe does on a
# real host; with `nogpu` (the real driver without a GPU) no /dev/nvidia0.
make_nodes() {
	rm -f /dev/nvidiactl /dev/nvidia0 /dev/nvidia-uvm /dev/nvidia-uvm-tools
	mknod -m 666 /dev/nvidiactl c 195 255
	[ "$1" = nogpu ] || mknod -m 666 /dev/nvidia0 c 195 0
	_maj=$(sed -n 's/^ *\([0-9]*\) nvidia-uvm$/\1/p' /proc/devices)
	[ -n "$_maj" ] || return 1
	mknod -m 666 /dev/nvidia-uvm c "$_maj" 0
	mknod -m 666 /dev/nvidia-uvm-tools c "$_maj" 1
}

load_uvm() { insmod "$MODDIR/nvidia-uvm.ko" "$@" && make_nodes && kallsyms_refresh; }

# --- NVIDIA's real modules (the nvidia series) ---------------------------------------------
# mod_loaded FILE.ko: the module of that file is loaded.
mod_loaded() { [ -d "/sys/module/$(basename "$1" .ko | tr - _)" ]; }
# load_nvidia_deps: the kernel modules nvidia.ko needs (drm), in the order of $NVDIR/deps.
load_nvidia_deps() {
	for _m in $(cat "$NVDIR/deps" 2>/dev/null); do
		mod_loaded "$_m" || insmod "$NVDIR/$_m" || return 1
	done
}
# load_nvidia [NVIDIA.KO PARAMS]: the dependencies, nvidia.ko with assume_nvswitch=1 (the
# patched-in parameter that lets it load without a GPU, vmtest/nvidia/patches/0002-*), then
# nvidia-uvm.ko; the nodes as nvidia-modprobe makes them, without /dev/nvidia0.
load_nvidia() {
	load_nvidia_deps || return 1
	mod_loaded nvidia.ko || insmod "$NVDIR/nvidia.ko" assume_nvswitch=1 "$@" || return 1
	mod_loaded nvidia-uvm.ko || insmod "$NVDIR/nvidia-uvm.ko" || return 1
	make_nodes nogpu && kallsyms_refresh
}
# dmesg_since N: the kernel log after its first N lines (N from `dmesg | wc -l`), times cut.
dmesg_since() { dmesg | tail -n +$(($1 + 1)) | sed 's/^\[[^]]*\] //'; }
# print_file PREFIX FILE: FILE's lines with PREFIX, a last line without newline included.
print_file() {
	sed "s/^/$1/" "$2"
	[ -n "$(tail -c1 "$2" 2>/dev/null)" ] && echo
	return 0
}

# run_workload OUT [ARGS]: the unchanged test workload against the fake libcuda, in the
# background; sets WL_PID. Its stdout/stderr go to OUT.
run_workload() {
	_out=$1
	shift
	cuda-workload --lib "$LIBCUDA" "$@" >"$_out" 2>&1 &
	WL_PID=$!
}
# workload_result OUT: the N of the last `cuInit=N` line.
workload_result() { sed -n 's/^cuInit=\([0-9-]*\) .*/\1/p' "$1" | tail -n1; }

# proc_state PID: the one-letter state of PID (R, S, D, ...).
proc_state() { sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null; }

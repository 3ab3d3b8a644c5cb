# The in-VM tests of the nvidia series of `cargo xtask vm-test` (busybox sh, sourced by /init
# after lib.sh, instead of tests.sh, when the kernel command line has vmtest.series=nvidia).
#
# What runs here is NVIDIA's own code: the open kernel modules of Debian's
# nvidia-open-kernel-dkms (built by xtask against this kernel, with the two patches of
# vmtest/nvidia/patches/: a kernel API fix and the assume_nvswitch parameter that lets
# nvidia.ko load without a GPU) and Debian's libcuda1, nvidia-smi and libnvidia-ml1. There is
# no GPU: the driver loads as on an NVSwitch-only host, and cuInit fails with 999 after its
# RM and UVM ioctls.
#
# From the kernel command line (environment): NVIDIA_VERSION, the release of the modules
# and of /usr/lib/x86_64-linux-gnu/libcuda.so.1; NVIDIA_OTHER, another release whose libcuda
# is at /opt/nvidia-<branch>/libcuda.so.1 (a library that does not match the modules).
#
# Same conventions as tests.sh (lib.sh's runner): test_<name> functions in VMTEST_TESTS,
# once per backend of VMTEST_BACKENDS except those of VMTEST_ONCE, then VMTEST_FINAL.
# Lines with these prefixes are saved by the host into target/vmtest/<k>/nvidia/ (fixtures):
#   strace| -> strace.txt       smi| -> smi.txt          kallsyms| -> kallsyms.txt
#   capture| (base64) -> capture.json                    agent.log[<backend>]| -> agent-<backend>.log
#   dmesg| -> dmesg.txt

VMTEST_TESTS="nvidia_refused nvidia_load nvidia_symbols nvidia_strace nvidia_smi
nvidia_mismatch agent_start nvidia_cuinit agent_stop"
VMTEST_BACKENDS="fentry tracepoint"
VMTEST_ONCE="nvidia_refused nvidia_load nvidia_symbols nvidia_strace nvidia_smi nvidia_mismatch"
# After every backend's pass.
VMTEST_FINAL="nvidia_capture"

# The real libcuda, as Debian's alternatives leave it (agent_start's --libcuda).
LIBCUDA=/usr/lib/x86_64-linux-gnu/libcuda.so.1
NVIDIA_OTHER_LIBCUDA=/opt/nvidia-${NVIDIA_OTHER%%.*}/libcuda.so.1

# [nvidia_uvm] text symbols printed for the host (kallsyms.txt), by name prefix.
NVIDIA_SYMBOL_PREFIXES="uvm_api_ uvm_va_space_ uvm_gpu_ uvm_parent_gpu_ uvm_hmm_ uvm_va_block_
uvm_isr_ uvm_ioctl uvm_unlocked_ioctl"
# The module functions the agent's kprobe registry names (agent/src/kernel/), to note which
# this release has.
AGENT_KPROBE_FUNCTIONS="uvm_api_register_gpu uvm_va_space_register_gpu uvm_gpu_retain_by_uuid
uvm_gpu_service_replayable_faults uvm_gpu_service_non_replayable_fault_buffer
uvm_parent_gpu_service_replayable_faults uvm_parent_gpu_service_non_replayable_fault_buffer
uvm_hmm_va_block_service_locked uvm_hmm_migrate_ranges"

need_agent() {
	agent_alive && return 0
	skip "agent not running"
	return 1
}
need_driver() {
	[ -c /dev/nvidiactl ] && [ -d /sys/module/nvidia_uvm ] && return 0
	skip "the driver is not loaded (nvidia_load failed or did not run)"
	return 1
}
config_of() { _v=$(sed -n "s/^CONFIG_$1=//p" "/boot/config-$(uname -r)" 2>/dev/null); echo "${_v:-n}"; }

# The unpatched driver's refusal: without the parameter, nvidia.ko finds no GPU (and no
# NVSwitch) and nvidia_init_module returns -ENODEV.
test_nvidia_refused() {
	if [ -d /sys/module/nvidia ]; then
		skip "nvidia already loaded"
		return
	fi
	check "insmod of nvidia.ko's dependencies ($(cat "$NVDIR/deps" | one_line)) failed" load_nvidia_deps || return
	_n=$(dmesg | wc -l)
	insmod "$NVDIR/nvidia.ko" >/tmp/nvidia_refused/out 2>&1
	_rc=$?
	dmesg_since "$_n" >/tmp/nvidia_refused/dmesg
	[ "$_rc" = 19 ] || bad "insmod nvidia.ko exited $_rc (want 19, ENODEV): $(one_line </tmp/nvidia_refused/out)"
	[ -d /sys/module/nvidia ] && bad "nvidia.ko loaded without a GPU"
	_l=$(grep -F "NVRM: No NVIDIA GPU found." /tmp/nvidia_refused/dmesg | head -n1)
	[ -n "$_l" ] || bad "the kernel log lacks 'NVRM: No NVIDIA GPU found.': $(grep NVRM /tmp/nvidia_refused/dmesg | tail -n3 | one_line)"
	note "insmod status $_rc; kernel log: $(grep NVRM /tmp/nvidia_refused/dmesg | one_line)"
}

# The patched parameter: nvidia.ko loads without a GPU, nvidia-uvm.ko on top.
test_nvidia_load() {
	_n=$(dmesg | wc -l)
	if ! load_nvidia; then
		bad "load_nvidia failed: $(dmesg_since "$_n" | grep -iE 'nvrm|nvidia|uvm' | tail -n5 | one_line)"
		return
	fi
	_v=$(head -n1 /proc/driver/nvidia/version 2>/dev/null)
	case "$_v" in *" $NVIDIA_VERSION "*) ;; *) bad "/proc/driver/nvidia/version does not name $NVIDIA_VERSION: '$_v'" ;; esac
	case "$_v" in *"Open Kernel Module"*) ;; *) bad "not the open kernel module: '$_v'" ;; esac
	check "no 'nvidia-uvm' in /proc/devices" grep -q " nvidia-uvm\$" /proc/devices
	# Major 195 is `nvidia-frontend` in 535, `nvidia` and `nvidiactl` in 550.
	check "major 195 not in /proc/devices" grep -qE "^195 nvidia(-frontend|ctl)?\$" /proc/devices
	check "no /dev/nvidiactl" test -c /dev/nvidiactl
	check "no /dev/nvidia-uvm" test -c /dev/nvidia-uvm
	check "no /dev/nvidia-uvm-tools" test -c /dev/nvidia-uvm-tools
	[ -e /dev/nvidia0 ] && bad "/dev/nvidia0 exists (there is no GPU)"
	check "no /proc/driver/nvidia/gpus" test -d /proc/driver/nvidia/gpus
	_g=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -w)
	[ "$_g" = 0 ] || bad "$_g entries in /proc/driver/nvidia/gpus (want none)"
	_h=$(cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null)
	[ "$_h" = N ] || bad "uvm_disable_hmm is '$_h' (want N)"
	note "$(echo "$_v" | sed 's/^NVRM version: //; s/  */ /g; s/ Release Build.*//')"
	note "devices: $(grep -E '^ *[0-9]+ nvidia' /proc/devices | one_line)"
	note "uvm_disable_hmm=$_h; kernel log: $(dmesg_since "$_n" | grep -E 'NVRM|nvidia-uvm' | one_line)"
}

# The [nvidia_uvm] functions, for the host to compare with the agent's kprobe registry.
test_nvidia_symbols() {
	[ -d /sys/module/nvidia_uvm ] || { skip "nvidia_uvm not loaded"; return; }
	kallsyms_refresh
	_re=$(echo $NVIDIA_SYMBOL_PREFIXES | sed 's/ /|/g')
	awk -v re="^($_re)" '$4 == "[nvidia_uvm]" && $3 ~ re { print $2, $3 }' "$KALLSYMS" |
		sort -k2 -u >/tmp/nvidia_symbols/list
	print_file "kallsyms| " /tmp/nvidia_symbols/list
	_n=$(wc -l </tmp/nvidia_symbols/list)
	[ "$_n" -gt 0 ] || bad "no [nvidia_uvm] text symbol with those prefixes"
	_hmm=$(awk '$2 ~ /^uvm_hmm_/ { print $2 }' /tmp/nvidia_symbols/list | one_line)
	# The fault-batch functions are uvm_gpu_service_* up to 550 and uvm_parent_gpu_service_*
	# after it; 535 and 550 already have a few other uvm_parent_gpu_* helpers.
	_pgs=$(awk '$2 ~ /^uvm_parent_gpu_service_/ { print $2 }' /tmp/nvidia_symbols/list | one_line)
	_pg=$(awk '$2 ~ /^uvm_parent_gpu_/ { print $2 }' /tmp/nvidia_symbols/list | one_line)
	[ -z "$_hmm" ] || bad "uvm_hmm_* symbols present (HMM compiled in?): $_hmm"
	[ -z "$_pgs" ] || bad "uvm_parent_gpu_service_* present in $NVIDIA_VERSION: $_pgs"
	for _fn in uvm_gpu_service_replayable_faults uvm_gpu_service_non_replayable_fault_buffer; do
		kallsyms_has "$_fn" nvidia_uvm || bad "$_fn (the $NVIDIA_VERSION fault-batch name) missing"
	done
	note "$_n symbols"
	note "no uvm_hmm_*: CONFIG_DEVICE_PRIVATE=$(config_of DEVICE_PRIVATE), so UVM compiles its HMM code out"
	note "no uvm_parent_gpu_service_* (names after 550), fault batches are uvm_gpu_service_*; uvm_parent_gpu_* helpers: ${_pg:-none}"
	_missing=$(kallsyms_missing nvidia_uvm $AGENT_KPROBE_FUNCTIONS)
	note "agent kprobe functions absent:${_missing:- none}"
	kallsyms_has uvm_unlocked_ioctl nvidia_uvm || note "no uvm_unlocked_ioctl (inlined): $(awk '$2 ~ /^uvm_unlocked_ioctl/ { print $2 }' /tmp/nvidia_symbols/list | one_line)"
	note "compiler-split: $(grep -cE '\.(cold|part|isra|constprop)' /tmp/nvidia_symbols/list)"
}

# strace of one cuInit against NVIDIA's driver (no agent running), and nvidia-smi's output.
test_nvidia_strace() {
	need_driver || return
	_dir=/tmp/nvidia_strace
	if command -v strace >/dev/null; then
		strace -f -tt -e trace=openat,open,ioctl,close -X raw -o "$_dir/trace" \
			cuda-workload --wait-ms 0 >"$_dir/out" 2>&1
		_rc=$?
		print_file "strace| " "$_dir/trace"
		_line=$(grep '^cuInit=' "$_dir/out" | tail -n1)
		say "strace| $_line"
		_r=$(workload_result "$_dir/out")
		[ "$_r" = 999 ] || bad "cuInit=$_r (want 999): $(one_line <"$_dir/out")"
		note "$_line (exit $_rc); $(grep -c ' ioctl(' "$_dir/trace") ioctls, opens: $(grep -o 'open[a-z]*([^"]*"/dev/nvidia[^"]*"' "$_dir/trace" | sed 's/.*"\(.*\)"/\1/' | sort | uniq -c | one_line)"
	else
		skip "no strace in this image (apt-get install strace on the host)"
	fi
	nvidia-smi >"$_dir/smi" 2>&1
	_s1=$?
	nvidia-smi -q >"$_dir/smiq" 2>&1
	_s2=$?
	say 'smi| $ nvidia-smi'
	print_file "smi| " "$_dir/smi"
	say "smi| (exit status $_s1)"
	say 'smi| $ nvidia-smi -q'
	print_file "smi| " "$_dir/smiq"
	say "smi| (exit status $_s2)"
}

# nvidia-smi without a GPU: NVML does not initialize.
test_nvidia_smi() {
	nvidia-smi >/tmp/nvidia_smi/out 2>&1
	_rc=$?
	[ "$_rc" != 0 ] || bad "nvidia-smi exited 0 without a GPU"
	grep -q "Failed to initialize NVML" /tmp/nvidia_smi/out ||
		bad "no 'Failed to initialize NVML': $(one_line </tmp/nvidia_smi/out)"
	note "exit $_rc: $(one_line </tmp/nvidia_smi/out)"
}

# The other release's libcuda on these modules (no agent). An older libcuda on newer
# modules gets 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH; seen: 535 on 550); a newer one on
# older modules got 999 like the matching one (550 on 535), so that case is only noted.
test_nvidia_mismatch() {
	need_driver || return
	[ -f "$NVIDIA_OTHER_LIBCUDA" ] || { skip "no $NVIDIA_OTHER_LIBCUDA in this image"; return; }
	_n=$(dmesg | wc -l)
	cuda-workload --lib "$NVIDIA_OTHER_LIBCUDA" --wait-ms 0 >/tmp/nvidia_mismatch/out 2>&1
	_r=$(workload_result /tmp/nvidia_mismatch/out)
	[ -n "$_r" ] || bad "no cuInit result: $(one_line </tmp/nvidia_mismatch/out)"
	if [ "${NVIDIA_OTHER%%.*}" -lt "${NVIDIA_VERSION%%.*}" ]; then
		[ "$_r" = 803 ] || bad "cuInit=$_r with the older libcuda $NVIDIA_OTHER on modules $NVIDIA_VERSION (want 803)"
	fi
	note "libcuda $NVIDIA_OTHER on modules $NVIDIA_VERSION: cuInit=$_r; kernel log: $(dmesg_since "$_n" | grep NVRM | head -n3 | one_line)"
}

# The agent with the real libcuda probed.
test_agent_start() {
	if ! agent_start; then
		bad "agent did not log \"started\" within 120 s"
		sed 's/^/agent.log-start| /' "$AGENT_LOG" | tail -n 30
		return
	fi
	_l=$(log_lines '"event":"started"')
	_b=$(json_field "$_l" backend)
	[ "$_b" = "$UVMWATCH_PROBE_BACKEND" ] || bad "backend '$_b' (asked for $UVMWATCH_PROBE_BACKEND)"
	note "backend=$_b probes_attached=$(json_field "$_l" probes_attached)/$(json_field "$_l" probes_total) libcuda_targets=$(json_field "$_l" libcuda_targets)"
	_dl=$(log_lines '"event":"driver_layout"' | head -n1)
	[ -n "$_dl" ] && note "ioctl layouts: $(json_field "$_dl" layout) ($(json_field "$_dl" selection)) for driver $(json_field "$_dl" driver_version)"
	log_has '"event":"libcuda_attached"' "\"path\":\"$LIBCUDA\"" || bad "no libcuda_attached for $LIBCUDA"
	_m=$(http_get /metrics)
	echo "$_m" | grep -q '^uvmwatch_probe_attached' || bad "/metrics has no uvmwatch_probe_attached"
}

# cuInit against the real stack with the agent running: 999, and the agent says so.
test_nvidia_cuinit() {
	need_agent || return
	need_driver || return
	cuda-workload --wait-ms 0 >/tmp/nvidia_cuinit/out 2>&1 &
	_wp=$!
	wait "$_wp"
	_r=$(workload_result /tmp/nvidia_cuinit/out)
	[ "$_r" = 999 ] || bad "cuInit=$_r (want 999, CUDA_ERROR_UNKNOWN: no GPU)"
	_k=$(pid_key "$_wp")
	wait_for 20 log_has '"event":"cuinit_end"' "$_k" '"code":999' ||
		bad "no cuinit_end with code 999 for pid $_wp: $(log_lines '"event":"cuinit_end"' "$_k" | head -n1)"
	_l=$(log_lines '"event":"cuinit_end"' "$_k" | head -n1)
	note "cuInit=$_r; cuinit_end: result=$(json_field "$_l" result) driver_calls=$(json_field "$_l" driver_calls) device_opens=$(json_field "$_l" device_opens) failed_call='$(json_field "$_l" failed_call)' failed_result='$(json_field "$_l" failed_result)' diagnosis='$(json_field "$_l" diagnosis)'"
	_f=$(log_lines '"event":"driver_ioctl"' "$_k" | while read -r _x; do
		echo "$(json_field "$_x" ioctl)=$(json_field "$_x" result)"
	done | sort | uniq -c | one_line)
	note "driver_ioctl records: ${_f:-none}"
}

test_agent_stop() {
	need_agent || return
	agent_stop
	_rc=$?
	[ "$_rc" = 0 ] || bad "agent exited $_rc on SIGTERM"
	check "no \"stopped\" record" log_has '"event":"stopped"'
	note "agent log: $(wc -l <"$AGENT_LOG") records, $(grep -c '"level":"ERROR"' "$AGENT_LOG") at ERROR, $(grep -c '"level":"WARN"' "$AGENT_LOG") at WARN"
}

# `uvmwatch capture` of one cuInit, Chrome JSON, printed base64 for the host (capture.json).
test_nvidia_capture() {
	need_driver || return
	agent_stop >/dev/null 2>&1
	_dir=/tmp/nvidia_capture
	uvmwatch --log-format json capture --comm cuda-workload --format chrome-json \
		-o "$_dir/capture.json" --libcuda "$LIBCUDA" --duration 300s >"$_dir/stdout" 2>"$_dir/log" &
	_cp=$!
	if ! wait_for 120 grep -q '"event":"started"' "$_dir/log"; then
		bad "capture did not log \"started\" within 120 s"
		kill -INT "$_cp" 2>/dev/null
		wait "$_cp"
		sed 's/^/capture-log| /' "$_dir/log" | tail -n 20
		return
	fi
	cuda-workload --wait-ms 0 >"$_dir/out" 2>&1
	_r=$(workload_result "$_dir/out")
	sleep 2
	kill -INT "$_cp"
	wait_for 60 sh -c "! kill -0 $_cp 2>/dev/null"
	wait "$_cp"
	_rc=$?
	[ "$_rc" = 0 ] || bad "uvmwatch capture exited $_rc"
	[ "$_r" = 999 ] || bad "cuInit=$_r (want 999)"
	if [ ! -s "$_dir/capture.json" ]; then
		bad "no capture file: $(tail -n 3 "$_dir/log" | one_line)"
		return
	fi
	base64 "$_dir/capture.json" | sed 's/^/capture| /'
	check "no capture_written record" grep -q '"event":"capture_written"' "$_dir/log"
	grep -q 'cuInit' "$_dir/capture.json" || bad "no cuInit in the capture"
	_w=$(grep '"event":"capture_written"' "$_dir/log" | head -n1)
	note "cuInit=$_r; $(wc -c <"$_dir/capture.json") bytes, events=$(json_field "$_w" events) processes=$(json_field "$_w" processes) dropped=$(json_field "$_w" dropped_events)"
}

# After each backend's pass: its agent log goes to the console (agent-<backend>.log).
vmtest_pass_done() {
	agent_stop >/dev/null 2>&1
	sed "s/^/agent.log[$1]| /" "$AGENT_LOG" 2>/dev/null
	: >"$AGENT_LOG"
}

# After the tests: the kernel log (dmesg.txt), without the early boot.
vmtest_finish() {
	agent_stop >/dev/null 2>&1
	dmesg | grep -v "^\[ *0\.\|ACPI\|PCI\|pci " | tail -n 200 | sed 's/^/dmesg| /'
}

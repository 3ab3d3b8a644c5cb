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

VMTEST_TESTS="nvidia_refused nvidia_doctor_refused nvidia_load nvidia_symbols nvidia_strace
nvidia_smi nvidia_mismatch nvidia_doctor agent_start nvidia_probes nvidia_cuinit nvidia_calls
nvidia_failures nvidia_first_cuinit agent_stop"
VMTEST_BACKENDS="fentry tracepoint"
VMTEST_ONCE="nvidia_refused nvidia_doctor_refused nvidia_load nvidia_symbols nvidia_strace
nvidia_smi nvidia_mismatch nvidia_doctor"
# How many new libraries nvidia_first_cuinit loads per backend (each a 29 MB copy).
FIRST_CUINIT_N=${VMTEST_FIRST_CUINIT_N:-5}
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

# doctor_run OUT [ARGS]: `uvmwatch doctor --format json ARGS` into OUT; its exit status.
doctor_run() {
	_o=$1
	shift
	uvmwatch --log-format json doctor --format json "$@" >"$_o" 2>"$_o.log"
}
# doctor_rules OUT: the causes the doctor JSON report names (its findings, and those of the
# other failures in `also`), worst first; not the ruled-out ones. A finding's own fields are
# two levels below its `"findings": [` line.
doctor_rules() {
	awk '
	/"findings": \[/ { match($0, /^ */); d = RLENGTH; inf = 1; next }
	inf && match($0, /^ *\]/) && RLENGTH - 1 == d { inf = 0; next }
	inf && match($0, /^ *"rule": "/) && RLENGTH - 9 == d + 4 {
		v = substr($0, RLENGTH + 1); sub(/".*/, "", v); print v
	}' "$1" | one_line
}

# The doctor on the refused driver: not "nothing to diagnose", but why it is not there.
test_nvidia_doctor_refused() {
	[ -d /sys/module/nvidia ] && { skip "nvidia loaded"; return; }
	doctor_run /tmp/nvidia_doctor_refused/out
	_rc=$?
	_r=$(doctor_rules /tmp/nvidia_doctor_refused/out)
	[ "$_rc" = 2 ] || bad "doctor exited $_rc (want 2, critical)"
	case " $_r " in *" no_gpu "*) ;; *) bad "no no_gpu finding: rules '$_r'" ;; esac
	grep -q 'NVRM: No NVIDIA GPU found' /tmp/nvidia_doctor_refused/out ||
		bad "the finding does not cite the kernel log line"
	grep -q 'no NVIDIA GPU on the bus' /tmp/nvidia_doctor_refused/out || bad "no_gpu does not cite the PCI bus"
	case " $_r " in *" module_refused "*) bad "module_refused on a load refused for want of a GPU" ;; esac
	note "doctor exit $_rc, rules: $_r"
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

# The doctor on the loaded driver without a GPU, from the real host's facts: never healthy;
# the module parameters from the real /sys/module/nvidia_uvm/parameters, nvidia-smi's
# verdict from Debian's nvidia-smi of the same release; and with --probe, the real cuInit.
test_nvidia_doctor() {
	need_driver || return
	_d=/tmp/nvidia_doctor
	doctor_run "$_d/out"
	_rc=$?
	_r=$(doctor_rules "$_d/out")
	[ "$_rc" = 2 ] || bad "doctor exited $_rc (want 2, critical)"
	case " $_r " in *" no_gpu "*) ;; *) bad "no no_gpu finding: rules '$_r'" ;; esac
	grep -q '"status": "healthy"' "$_d/out" && bad "doctor says healthy"
	grep -q '"uvm_disable_hmm": "N"' "$_d/out" ||
		bad "uvm_disable_hmm=N not read from /sys/module/nvidia_uvm/parameters"
	grep -q '"verdict": "no_gpu"' "$_d/out" || bad "nvidia-smi's outcome is not no_gpu"
	grep -q "\"version\": \"$NVIDIA_VERSION\"" "$_d/out" || bad "driver version $NVIDIA_VERSION not read"
	# The VM's real /sys/bus/pci has no NVIDIA device: the finding says so.
	grep -q 'no NVIDIA GPU on the bus' "$_d/out" || bad "no_gpu does not cite the PCI bus"
	note "doctor exit $_rc, rules: $_r"
	doctor_run "$_d/probe" --probe --libcuda "$LIBCUDA"
	_rc=$?
	_r=$(doctor_rules "$_d/probe")
	case " $_r " in *" no_gpu "*) ;; *) bad "doctor --probe: no no_gpu finding: rules '$_r' (exit $_rc)" ;; esac
	grep -q '"basis": "observed"' "$_d/probe" || bad "doctor --probe: no observed finding"
	note "doctor --probe exit $_rc, rules: $_r"
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

# The kprobe registry against the real module's kallsyms: the driver's functions attach,
# and those this release or this kernel lacks say which of the two reasons keeps them off.
test_nvidia_probes() {
	need_driver || return
	_t=/tmp/nvidia_probes/table
	uvmwatch probes --libcuda "$LIBCUDA" >"$_t" 2>/tmp/nvidia_probes/err
	_rc=$?
	sed 's/^/probes| /' "$_t"
	for _fn in uvm_api_register_gpu uvm_va_space_register_gpu uvm_gpu_retain_by_uuid \
		uvm_gpu_service_replayable_faults uvm_gpu_service_non_replayable_fault_buffer; do
		grep -qE "^kprobe:$_fn +kprobe +no +attached" "$_t" || bad "kprobe:$_fn not attached"
	done
	for _fn in uvm_hmm_va_block_service_locked uvm_hmm_migrate_ranges; do
		grep -A1 "$_fn not in /proc/kallsyms: compiled out" "$_t" | grep -q "CONFIG_DEVICE_PRIVATE off" ||
			bad "$_fn: not said to be compiled out without CONFIG_DEVICE_PRIVATE"
	done
	for _fn in uvm_parent_gpu_service_replayable_faults uvm_parent_gpu_service_non_replayable_fault_buffer; do
		grep -q "$_fn not in /proc/kallsyms: not in driver $NVIDIA_VERSION, added in 560" "$_t" ||
			bad "$_fn: not said to come with 560"
	done
	grep -q "^uprobe:cuInit .* attached" "$_t" || bad "cuInit uprobe not attached to the real libcuda"
	note "uvmwatch probes exit $_rc; $(grep -c '  attached' "$_t") attached"
}

# end_of PID: the agent's cuinit_end record of PID (waits 20 s).
end_of() {
	wait_for 20 log_has '"event":"cuinit_end"' "$(pid_key "$1")" || return 1
	log_lines '"event":"cuinit_end"' "$(pid_key "$1")" | head -n1
}
# printed_pid OUT: the pid of the workload's `cuInit=N pid=P` line.
printed_pid() { sed -n 's/^cuInit=[0-9-]* pid=\([0-9]*\).*/\1/p' "$1" | tail -n1; }

# ioctl_name REQUEST: the name of a request number strace printed (the ones NVIDIA's libcuda
# makes in cuInit: nv-ioctl-numbers.h, nv_escape.h, uvm_ioctl.h, uvm_linux_ioctl.h).
ioctl_name() {
	case "$1" in
	0xc00846d6) echo NV_ESC_SYS_PARAMS ;;
	0xc90046c8) echo NV_ESC_CARD_INFO ;;
	0xc020462b | 0xc030462b | 0xc028462b) echo NV_ESC_RM_ALLOC ;;
	0xc020462a) echo NV_ESC_RM_CONTROL ;;
	0xc0104629) echo NV_ESC_RM_FREE ;;
	0x30000001) echo UVM_INITIALIZE ;;
	0x30000002) echo UVM_DEINITIALIZE ;;
	0x4b) echo UVM_MM_INITIALIZE ;;
	0x27) echo UVM_PAGEABLE_MEM_ACCESS ;;
	*) echo "$1" ;;
	esac
}
# ioctl_counts METRICS: `name count` per ioctl label of uvmwatch_driver_ioctl_calls_total.
ioctl_counts() {
	grep '^uvmwatch_driver_ioctl_calls_total{' "$1" |
		sed -n 's/.*ioctl="\([^"]*\)".* \([0-9.e+]*\)$/\1 \2/p' |
		awk '{ n[$1] += $2 } END { for (k in n) printf "%s %d\n", k, n[k] }' | sort
}

# The agent's view of one real cuInit against strace's of the same process: every open and
# ioctl of an NVIDIA node, named and counted alike, the failing RM control's status read at
# this release's offset.
test_nvidia_calls() {
	need_agent || return
	need_driver || return
	command -v strace >/dev/null || { skip "no strace in this image"; return; }
	_d=/tmp/nvidia_calls
	http_get /metrics >"$_d/m0"
	strace -f -X raw -e trace=openat,open,ioctl,close -o "$_d/trace" \
		cuda-workload --wait-ms 0 >"$_d/out" 2>&1
	_p=$(printed_pid "$_d/out")
	_l=$(end_of "$_p") || { bad "no cuinit_end for pid $_p"; return; }
	sleep 1
	http_get /metrics >"$_d/m1"
	# strace's side: the fds of /dev/nvidia* opens, then the ioctls on them (or on a
	# negative fd), by name.
	awk '
		/open(at)?\(.*"\/dev\/nvidia/ { n = split($0, a, "= "); r = a[n] + 0; opens++; if (r >= 0) fd[r] = 1; next }
		/ close\(/ { match($0, /close\([0-9]+/); c = substr($0, RSTART + 6, RLENGTH - 6) + 0; delete fd[c]; next }
		/ ioctl\(/ { match($0, /ioctl\(-?[0-9]+, 0x[0-9a-f]+/); x = substr($0, RSTART + 6, RLENGTH - 6); split(x, b, ", ");
			if ((b[1] + 0) in fd || b[1] + 0 < 0) print b[2] }
		END { print "opens", opens + 0 > "/dev/stderr" }' "$_d/trace" >"$_d/reqs" 2>"$_d/opens"
	while read -r _q; do ioctl_name "$_q"; done <"$_d/reqs" | sort | uniq -c |
		awk '{ print $2, $1 }' >"$_d/strace_counts"
	ioctl_counts "$_d/m0" >"$_d/a0"
	ioctl_counts "$_d/m1" >"$_d/a1"
	awk 'NR == FNR { b[$1] = $2; next } { d = $2 - b[$1]; if (d > 0) print $1, d }' \
		"$_d/a0" "$_d/a1" | sort >"$_d/agent_counts"
	diff "$_d/strace_counts" "$_d/agent_counts" >"$_d/diff" ||
		bad "per-name ioctl counts differ (strace < > agent): $(one_line <"$_d/diff")"
	_so=$(sed -n 's/^opens //p' "$_d/opens")
	_si=$(grep -vc '^0x30000002$' "$_d/reqs")
	_ai=$(json_field "$_l" driver_calls)
	_ao=$(json_field "$_l" device_opens)
	# UVM_DEINITIALIZE on a valid fd is a driver call too; on a negative one it is not.
	[ "$_ao" = "$_so" ] || bad "device_opens=$_ao, strace saw $_so opens of /dev/nvidia*"
	_all=$(wc -l <"$_d/reqs")
	[ "$_ai" = "$_all" ] || [ "$_ai" = "$_si" ] || bad "driver_calls=$_ai, strace saw $_all ioctls on NVIDIA fds"
	grep -q 'ioctl="NV_ESC_RM_CONTROL",result="NV_ERR_INVALID_LOCK_STATE"' "$_d/m1" ||
		bad "the failing RM control's status is not NV_ERR_INVALID_LOCK_STATE"
	note "strace: $_so opens, $_all ioctls; agent: device_opens=$_ao driver_calls=$_ai; per name: $(one_line <"$_d/agent_counts")"
}

# fail_case NAME WANT_RESULT WANT_ERRNO RULE CMD...: runs CMD (a cuda-workload that prints
# its pid), then checks the agent named the failed open on its cuinit_end with its errno,
# the result and the diagnosis rule.
fail_case() {
	_fc=$1 _want=$2 _errno=$3 _rule=$4
	shift 4
	"$@" >"/tmp/nvidia_failures/$_fc.out" 2>&1
	_p=$(printed_pid "/tmp/nvidia_failures/$_fc.out")
	_r=$(workload_result "/tmp/nvidia_failures/$_fc.out")
	if [ -z "$_p" ]; then
		bad "$_fc: no cuInit line: $(one_line <"/tmp/nvidia_failures/$_fc.out")"
		return
	fi
	[ "$_r" = "$_want" ] || bad "$_fc: cuInit=$_r (want $_want)"
	_l=$(end_of "$_p") || { bad "$_fc: no cuinit_end for pid $_p"; return; }
	[ "$(json_field "$_l" code)" = "$_r" ] || bad "$_fc: cuinit_end code $(json_field "$_l" code), cuInit returned $_r"
	case "$(json_field "$_l" failed_call)" in
	"open /dev/nvidia"*) ;;
	*) bad "$_fc: failed_call '$(json_field "$_l" failed_call)'" ;;
	esac
	[ "$(json_field "$_l" failed_result)" = "$_errno" ] ||
		bad "$_fc: failed_result '$(json_field "$_l" failed_result)' (want $_errno)"
	case ",$(json_field "$_l" diagnosis)," in
	*",$_rule,"*) ;;
	*) bad "$_fc: diagnosis '$(json_field "$_l" diagnosis)' lacks $_rule" ;;
	esac
	note "$_fc: cuInit=$_r, $(json_field "$_l" failed_call) $(json_field "$_l" failed_result), diagnosis $(json_field "$_l" diagnosis)"
}
# doctor_names NAME RULE CMD...: CMD (a doctor --format json run, as some user or in some
# cgroup) finds RULE.
doctor_names() {
	_fc=$1 _rule=$2
	shift 2
	"$@" >"/tmp/nvidia_failures/$_fc.doctor" 2>"/tmp/nvidia_failures/$_fc.doctor.log"
	_r=$(doctor_rules "/tmp/nvidia_failures/$_fc.doctor")
	case " $_r " in
	*" $_rule "*) note "doctor: $_r" ;;
	*) bad "$_fc: the doctor found '$_r', not $_rule" ;;
	esac
}
uvm_major() { sed -n 's/^ *\([0-9]*\) nvidia-uvm$/\1/p' /proc/devices; }

# Real failures of a real cuInit, each named on the cuInit it broke (failed call, errno,
# result, diagnosis) and by the doctor: the node denied to a non-root user (EACCES) and by
# the device cgroup (EPERM), the stale node after rmmod (ENXIO), nvidia_uvm not loaded
# (ENOENT), the control node denied (EACCES, 100), the older release's libcuda (803).
test_nvidia_failures() {
	need_agent || return
	need_driver || return
	_d=/tmp/nvidia_failures
	chmod 000 /dev/nvidia-uvm
	fail_case eacces 999 EACCES device_permission su -s /bin/sh user -c "cuda-workload --wait-ms 0"
	doctor_names eacces device_permission su -s /bin/sh user -c "uvmwatch --log-format json doctor --format json"
	chmod 666 /dev/nvidia-uvm
	chmod 000 /dev/nvidiactl
	fail_case ctl_eacces 100 EACCES device_permission su -s /bin/sh user -c "cuda-workload --wait-ms 0"
	chmod 666 /dev/nvidiactl
	# The device controller of cgroup v1 (LXC and runc on v1 hosts write devices.deny).
	mkdir -p "$_d/cg"
	if mount -t cgroup -o devices none "$_d/cg" 2>/dev/null; then
		mkdir -p "$_d/cg/deny"
		echo "c $(uvm_major):* rwm" >"$_d/cg/deny/devices.deny"
		fail_case eperm 999 EPERM device_permission sh -c "echo \$\$ >$_d/cg/deny/cgroup.procs; exec cuda-workload --wait-ms 0"
		doctor_names eperm device_permission sh -c "echo \$\$ >$_d/cg/deny/cgroup.procs; exec uvmwatch --log-format json doctor --format json --probe --libcuda $LIBCUDA"
		umount "$_d/cg"
	else
		note "no cgroup v1 devices controller: EPERM not checked"
	fi
	# The module unloaded under its node (the agent sees the module go).
	if rmmod nvidia_uvm; then
		fail_case enxio 999 ENXIO node_or_module_missing cuda-workload --wait-ms 0
		doctor_names enxio node_or_module_missing uvmwatch --log-format json doctor --format json --probe --libcuda "$LIBCUDA"
		rm -f /dev/nvidia-uvm /dev/nvidia-uvm-tools
		fail_case enoent 999 ENOENT node_or_module_missing cuda-workload --wait-ms 0
		doctor_names enoent node_or_module_missing uvmwatch --log-format json doctor --format json
		insmod "$NVDIR/nvidia-uvm.ko" || bad "insmod nvidia-uvm.ko again failed"
		make_nodes nogpu
		wait_for 30 log_has '"event":"module_loaded"' || note "no module_loaded record"
	else
		bad "rmmod nvidia_uvm failed"
	fi
	# The older release's libcuda, not probed before: its first cuInit, from its driver calls.
	if [ -f "$NVIDIA_OTHER_LIBCUDA" ] && [ "${NVIDIA_OTHER%%.*}" -lt "${NVIDIA_VERSION%%.*}" ]; then
		cuda-workload --lib "$NVIDIA_OTHER_LIBCUDA" --wait-ms 0 >"$_d/mismatch.out" 2>&1
		_p=$(printed_pid "$_d/mismatch.out")
		_l=$(end_of "$_p") || { bad "mismatch: no cuinit_end for pid $_p"; return; }
		[ "$(json_field "$_l" code)" = 803 ] || bad "mismatch: cuinit_end code $(json_field "$_l" code) (cuInit returned $(workload_result "$_d/mismatch.out"))"
		case ",$(json_field "$_l" diagnosis)," in *",version_mismatch,"*) ;; *) bad "mismatch: diagnosis '$(json_field "$_l" diagnosis)'" ;; esac
		note "mismatch: code $(json_field "$_l" code) seen=$(json_field "$_l" seen) from '$(json_field "$_l" result_inferred_from)', diagnosis $(json_field "$_l" diagnosis)"
		doctor_names mismatch version_mismatch uvmwatch --log-format json doctor --format json --probe --libcuda "$NVIDIA_OTHER_LIBCUDA"
	fi
}

# A process that loads a libcuda the agent has never seen (a new file each time) and calls
# cuInit at once, with both vCPUs busy: every first cuInit reported, with its driver calls
# and the result the process printed.
test_nvidia_first_cuinit() {
	need_agent || return
	need_driver || return
	_d=/tmp/nvidia_first_cuinit
	_real=$(readlink -f "$LIBCUDA")
	yes >/dev/null &
	_y1=$!
	yes >/dev/null &
	_y2=$!
	_ok=0 _late=0 _whole=0 _i=0
	while [ "$_i" -lt "$FIRST_CUINIT_N" ]; do
		_i=$((_i + 1))
		mkdir -p "$_d/$_i"
		cp "$_real" "$_d/$_i/"
		ln -s "$(basename "$_real")" "$_d/$_i/libcuda.so.1"
		cuda-workload --lib "$_d/$_i/libcuda.so.1" --wait-ms 0 >"$_d/$_i.out" 2>&1
		_p=$(printed_pid "$_d/$_i.out")
		_r=$(workload_result "$_d/$_i.out")
		_l=$(end_of "$_p")
		if [ -z "$_l" ]; then
			bad "library $_i: no cuinit_end for pid $_p (cuInit=$_r)"
			continue
		fi
		_c=$(json_field "$_l" code)
		_s=$(json_field "$_l" seen)
		[ "$_s" = whole ] && _whole=$((_whole + 1)) || _late=$((_late + 1))
		if [ "$_c" = "$_r" ] && [ "$(json_field "$_l" driver_calls)" -ge 15 ]; then
			_ok=$((_ok + 1))
		else
			bad "library $_i: cuinit_end code $_c seen=$_s driver_calls=$(json_field "$_l" driver_calls) (cuInit=$_r)"
		fi
		rm -f "$_d/$_i/"*
	done
	kill "$_y1" "$_y2"
	note "first cuInit of a new library under load: $_ok of $FIRST_CUINIT_N reported with their result ($_late from their driver calls, $_whole whole)"
	say "first_cuinit| $UVMWATCH_PROBE_BACKEND $_ok/$FIRST_CUINIT_N late=$_late whole=$_whole"
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

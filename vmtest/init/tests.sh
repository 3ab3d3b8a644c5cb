# The in-VM tests of `cargo xtask vm-test` (busybox sh, sourced by /init after lib.sh).
#
# One function per test, run in the order of VMTEST_TESTS. Each test sets up what it needs
# (need_module, need_agent, probes_table below), so each runs alone with
# `cargo xtask vm-test --only <name>`; in a whole run the later ones reuse the module and the
# agent the earlier ones started. A test is named after the probe group it checks
# (agent-ebpf/src/probes/<group>.rs: cuinit, ioctl, kernel_fn, ...) or the agent's part
# (registry, backend, module_watch, agent). To add one, write `test_<name>` and list it here;
# see lib.sh for the helpers, docs/probes.md#adding-a-probe for the whole recipe.

VMTEST_TESTS="kernel_facts module_load kernel_fn_symbols registry_attach backend_choice
agent_start cuinit_ok cuinit_fail_register cuinit_hang_register kernel_fn_hmm_faults
kernel_fn_metrics module_watch_rmmod agent_stop"
# Every test of VMTEST_TESTS runs once per backend (lib.sh's vmtest_main), except these.
VMTEST_BACKENDS="fentry tracepoint"
VMTEST_ONCE="kernel_facts kernel_fn_symbols"
# After every backend's pass.
VMTEST_FINAL="overhead"

# Probed functions the test module does not have: the 535/550 names of the fault batch
# handlers (the module implements the 560+ names). Their probes must say why they are off.
KPROBE_ABSENT="uvm_gpu_service_replayable_faults uvm_gpu_service_non_replayable_fault_buffer"

# Kernel functions the agent's kprobes will need (the core-kernel rows, `module` None, of
# `kernel_fns!` in common/src/kernel_fn.rs).
KERNEL_SYMBOLS="request_free_mem_region memremap_pages hmm_range_fault migrate_vma_setup
migrate_vma_pages migrate_vma_finalize"
# Functions of the test module, named as in nvidia_uvm.
MODULE_SYMBOLS="uvm_unlocked_ioctl_entry uvm_unlocked_ioctl uvm_ioctl uvm_api_initialize
uvm_va_space_create uvm_api_register_gpu uvm_va_space_register_gpu uvm_gpu_retain_by_uuid
add_gpu uvm_pmm_devmem_init devmem_alloc_pagemap uvm_va_block_service_locked
uvm_hmm_va_block_service_locked uvm_parent_gpu_service_replayable_faults
uvm_parent_gpu_service_non_replayable_fault_buffer uvm_api_migrate uvm_hmm_migrate_ranges"

# (a) What the kernel offers for kprobes, BTF and the HMM paths.
test_kernel_facts() {
	note "kernel $(uname -r)"
	check "no kprobe PMU (/sys/bus/event_source/devices/kprobe)" \
		test -d /sys/bus/event_source/devices/kprobe
	check "no uprobe PMU" test -d /sys/bus/event_source/devices/uprobe
	check "no BTF (/sys/kernel/btf/vmlinux)" test -f /sys/kernel/btf/vmlinux
	check "tracefs not mounted" test -d /sys/kernel/tracing/events/syscalls
	_missing=$(kallsyms_missing "" $KERNEL_SYMBOLS)
	[ -z "$_missing" ] || bad "kallsyms lacks:$_missing"
	# From the kernel package's config (put in /boot as on a Debian host). DEVICE_PRIVATE
	# decides whether a real nvidia_uvm would enable HMM on this kernel at all; FPROBE
	# whether multi-kprobe links (BPF_TRACE_KPROBE_MULTI) exist.
	_cfg=/boot/config-$(uname -r)
	if [ -f "$_cfg" ]; then
		_c=""
		for _o in KPROBES FPROBE HMM_MIRROR DEVICE_PRIVATE ZONE_DEVICE GET_FREE_REGION RANDOMIZE_MEMORY; do
			_v=$(sed -n "s/^CONFIG_$_o=//p" "$_cfg")
			_c="$_c $_o=${_v:-n}"
		done
		note "config:$_c"
	fi
}

# need_module: the test modules loaded and their nodes made, as nvidia-modprobe would
# (kept loaded for the tests after); a failure is the test's.
need_module() {
	[ -d /sys/module/nvidia ] || insmod "$MODDIR/nvidia.ko" || { bad "insmod nvidia.ko failed"; return 1; }
	[ -d /sys/module/nvidia_uvm ] || load_uvm || { bad "insmod nvidia-uvm.ko failed"; return 1; }
	[ -c /dev/nvidia-uvm ] || make_nodes || { bad "no nvidia-uvm in /proc/devices"; return 1; }
}

# need_agent: the module (need_module), then `uvmwatch run` on this pass's backend, started
# unless it runs already.
need_agent() {
	need_module || return 1
	agent_alive && return 0
	agent_start && return 0
	bad "agent did not log \"started\" within 120 s"
	sed 's/^/agent.log| /' "$AGENT_LOG" | tail -n 30
	return 1
}

# probes_table: the file holding `uvmwatch probes --libcuda ...` of this pass's backend, made
# on first use (with the module loaded: its kprobes are in the table); its stderr beside it.
probes_table() {
	_pt=/tmp/probes-table.${UVMWATCH_PROBE_BACKEND:-auto}
	if [ ! -f "$_pt" ]; then
		uvmwatch probes --libcuda "$LIBCUDA" >"$_pt.tmp" 2>"$_pt.err"
		echo $? >"$_pt.rc"
		mv "$_pt.tmp" "$_pt"
	fi
	echo "$_pt"
}

# The test modules load; the nodes are made as nvidia-modprobe would.
test_module_load() {
	if [ -d /sys/module/nvidia_uvm ]; then
		note "already loaded (an earlier backend's pass)"
	else
		check "insmod nvidia.ko" insmod "$MODDIR/nvidia.ko" || return
		check "insmod nvidia-uvm.ko" load_uvm || return
	fi
	check "no 'nvidia-uvm' in /proc/devices" grep -q " nvidia-uvm\$" /proc/devices
	check "no /dev/nvidia-uvm" test -c /dev/nvidia-uvm
	check "mode parameter not writable" test -w "$UVM_PARAMS/mode"
	check "/proc/driver/nvidia/version missing" test -f /proc/driver/nvidia/version
	note "uvm major $(sed -n 's/^ *\([0-9]*\) nvidia-uvm$/\1/p' /proc/devices)"
}

# (a) The module's functions the kernel_fn kprobes need are in kallsyms under [nvidia_uvm],
# as the real driver's are.
test_kernel_fn_symbols() {
	need_module || return
	[ -s "$KALLSYMS" ] || kallsyms_refresh
	grep "\[nvidia_uvm\]" "$KALLSYMS" >/tmp/kernel_fn_symbols/all
	_missing=$(kallsyms_missing nvidia_uvm $MODULE_SYMBOLS)
	[ -z "$_missing" ] && note "${_missing:-all $(echo $MODULE_SYMBOLS | wc -w) functions present}"
	[ -z "$_missing" ] || bad "missing [nvidia_uvm] symbols:$_missing"
	_clones=$(grep -E " [A-Za-z_0-9]+\.(cold|part|isra|constprop)[.0-9]*[[:space:]]" /tmp/kernel_fn_symbols/all |
		awk '{print $3}' | tr '\n' ' ')
	[ -n "$_clones" ] && note "compiler-split symbols: $_clones"
	say "kallsyms sample: $(grep -E ' (uvm_api_register_gpu|devmem_alloc_pagemap)' /tmp/kernel_fn_symbols/all | one_line)"
}

# (b) `uvmwatch probes` loads and attaches for real; its table goes to the console log. It
# prints a row for each attached (or required) probe, then lists the others under one line
# per reason: "not attached: N of M probes, by reason", "  <state>: <reason>", then
# "    <kinds>: fn, fn, ..." (a kprobe and its kretprobe as "kprobe+kretprobe:").
test_registry_attach() {
	need_module || return
	_tab=$(probes_table)
	_rc=$(cat "$_tab.rc")
	sed 's/^/probes| /' "$_tab"
	sed 's/^/probes-stderr| /' "$_tab.err" | head -n 20
	[ "$_rc" = 0 ] || bad "uvmwatch probes exited $_rc"
	_n=$(grep -c "  attached" "$_tab")
	_u=$(sed -n 's/^not attached: \([0-9]*\) of .*/\1/p' "$_tab")
	note "$_n attached, ${_u:-0} not attached"
	check "cuInit uprobe not attached" grep -q "^uprobe:cuInit .* attached" "$_tab"
	# The three sched raw tracepoints, on both backends: on these kernels sched_process_exit
	# has no group_dead argument, and a program reading one is refused at attach.
	for _tp in sched_process_fork sched_process_exec sched_process_exit; do
		check "sched:$_tp not attached (its reason in the probes| lines)" \
			grep -qE "^sched:$_tp +raw_tracepoint +no +attached" "$_tab"
	done
	# Every kprobe and kretprobe of the registry attaches (a row each), except those on
	# functions this module does not have, which must be listed, both probes, under a reason
	# saying why.
	_kp=$(grep -cE "^k(ret)?probe:[^ ]+ +k(ret)?probe +no +attached" "$_tab")
	# One "<kinds>: <function>|<state>" line per function listed as not attached.
	awk '/^not attached:/ { g = 1; next }
		g && /^  [^ ]/ { r = substr($0, 3); next }
		g && /^    / {
			for (i = 1; i <= NF; i++) {
				w = $i
				if (w ~ /:$/) { k = w; continue }
				sub(/,$/, "", w)
				print k " " w "|" r
			}
		}' "$_tab" >/tmp/registry_attach/off
	while IFS='|' read -r _what _why; do
		_kinds=${_what%% *}
		_fn=${_what#* }
		case "$_kinds" in *kprobe*) ;; *) continue ;; esac
		# On the fentry backend the core-kernel functions are on their trampolines instead.
		if [ "$UVMWATCH_PROBE_BACKEND" = fentry ] && [ "$_why" = "not used: the fentry backend is attached" ]; then
			case " $(echo $KERNEL_SYMBOLS) " in *" $_fn "*) continue ;; esac
		fi
		case " $(echo $KPROBE_ABSENT) " in
		*" $_fn "*)
			[ "$_kinds" = "kprobe+kretprobe:" ] || bad "$_fn: only '$_kinds' under '$_why'"
			echo "$_why" | grep -q "not in /proc/kallsyms" ||
				bad "$_kinds $_fn: '$_why' (want: not in /proc/kallsyms)"
			;;
		*) bad "$_kinds $_fn: $_why" ;;
		esac
	done </tmp/registry_attach/off
	for _fn in $KPROBE_ABSENT; do
		grep -q "probe: $_fn|" /tmp/registry_attach/off || bad "$_fn: neither attached nor listed with a reason"
	done
	if [ "$UVMWATCH_PROBE_BACKEND" = fentry ]; then
		# The 6 core-kernel functions on fentry/fexit (12), the module ones on kprobes (14: 9
		# functions, 2 of them absent from the test module).
		_tr=$(grep -cE "^f(entry|exit):[^ ]+ +f(entry|exit) +no +attached" "$_tab")
		for _fn in $KERNEL_SYMBOLS; do
			grep -qE "^fexit:$_fn +fexit +no +attached" "$_tab" || bad "fexit:$_fn not attached"
		done
		[ "$_kp" -ge 14 ] || bad "only $_kp kprobes attached (want 14)"
		[ "$_tr" -ge 12 ] || bad "only $_tr kernel-function trampolines attached (want 12)"
		note "$_kp kprobes and $_tr trampolines attached"
	else
		[ "$_kp" -ge 26 ] || bad "only $_kp kprobes attached (want 26)"
		note "$_kp kprobes attached"
	fi
}

# The backend the agent chose is the one asked for, said by `uvmwatch probes` and exported;
# on fentry the five trampolines are attached and the syscall tracepoints are not used.
test_backend_choice() {
	need_module || return
	_tab=$(probes_table)
	_b=$UVMWATCH_PROBE_BACKEND
	_line=$(grep "^syscall hooks: " "$_tab")
	note "$_line"
	case "$_line" in
	"syscall hooks: $_b backend"*) ;;
	*) bad "asked for $_b: '$_line'" ;;
	esac
	if [ "$_b" = fentry ]; then
		for _p in "fentry:__x64_sys_ioctl" "fexit:__x64_sys_ioctl" "fentry:chrdev_open" "fexit:chrdev_open" "fexit:do_filp_open"; do
			grep -qE "^$_p +f(entry|exit) +yes +attached" "$_tab" || bad "$_p not attached"
		done
		grep -qE "^syscalls:" "$_tab" && bad "a syscall tracepoint is listed as attached"
		grep -q "not used: the fentry backend is attached" "$_tab" ||
			bad "the tracepoints are not said to be unused"
	else
		grep -qE "^syscalls:sys_enter_ioctl +tracepoint +yes +attached" "$_tab" ||
			bad "sys_enter_ioctl not attached"
		grep -qE "^f(entry|exit):" "$_tab" && bad "an fentry probe is listed as attached"
	fi
}

# The overhead benchmark (agent/benches/overhead.rs) inside this VM, both backends side by
# side in one run (TCG: compare its ratios, never its times), then its lifecycle part (attach
# and stop times with VMTEST_BENCH_LIBCUDAS copies of the stub libcuda). Its lines go to the
# console; `cargo xtask vm-test` repeats the `overhead <kernel> <backend>: ...` and
# `lifecycle ...` ones in its summary.
test_overhead() {
	command -v uvmwatch-overhead >/dev/null || { skip "no benchmark in this image (--no-bench)"; return; }
	agent_stop >/dev/null 2>&1
	UVMWATCH_BENCH_AGENT=/usr/bin/uvmwatch-release UVMWATCH_BENCH_ROUNDS=${VMTEST_BENCH_ROUNDS:-5} \
		UVMWATCH_BENCH_ITERS=${VMTEST_BENCH_ITERS:-100000} \
		UVMWATCH_BENCH_LIBCUDA=$LIBCUDA UVMWATCH_BENCH_LIBCUDAS=${VMTEST_BENCH_LIBCUDAS:-50} \
		uvmwatch-overhead --bench >/tmp/overhead/out 2>/tmp/overhead/err
	_rc=$?
	cat /tmp/overhead/out
	sed 's/^/overhead-stderr| /' /tmp/overhead/err | tail -n 20
	[ "$_rc" = 0 ] || bad "benchmark exited $_rc"
	for _b in $VMTEST_BACKENDS; do
		grep -q "^overhead $(uname -r) $_b: getpid " /tmp/overhead/out || bad "no overhead line for $_b"
		grep -q "^lifecycle $(uname -r) $_b: attach " /tmp/overhead/out || bad "no lifecycle line for $_b"
	done
	note "$(grep -c '^overhead ' /tmp/overhead/out) overhead lines"
}

test_agent_start() {
	need_module || return
	agent_stop >/dev/null 2>&1
	if ! agent_start; then
		bad "agent did not log \"started\" within 120 s"
		sed 's/^/agent.log| /' "$AGENT_LOG" | tail -n 30
		return
	fi
	_l=$(log_lines '"event":"started"')
	note "probes_attached=$(json_field "$_l" probes_attached)/$(json_field "$_l" probes_total) libcuda_targets=$(json_field "$_l" libcuda_targets)"
	_m=$(http_get /metrics)
	echo "$_m" | grep -q '^uvmwatch_probe_attached' || bad "/metrics has no uvmwatch_probe_attached"
}

# (c) mode ok: cuInit succeeds and the agent logs cuinit_end CUDA_SUCCESS.
test_cuinit_ok() {
	need_agent || return
	uvm_mode ok
	_calls=$(uvm_stat request_free_mem_region_calls)
	run_workload /tmp/cuinit_ok/out
	wait "$WL_PID"
	_r=$(workload_result /tmp/cuinit_ok/out)
	[ "$_r" = 0 ] || bad "cuInit=$_r (want 0): $(one_line </tmp/cuinit_ok/out)"
	_k=$(pid_key "$WL_PID")
	wait_for 20 log_has '"event":"cuinit_end"' "$_k" '"result":"CUDA_SUCCESS"' ||
		bad "no cuinit_end CUDA_SUCCESS for pid $WL_PID"
	[ "$(uvm_stat request_free_mem_region_calls)" -gt "$_calls" ] ||
		bad "request_free_mem_region was not called"
	_l=$(log_lines '"event":"cuinit_end"' "$_k")
	[ "$(json_field "$_l" driver_calls)" -gt 0 ] 2>/dev/null ||
		bad "the agent counted no driver calls in cuInit"
	[ "$(json_field "$_l" device_opens)" -gt 0 ] 2>/dev/null ||
		bad "the agent counted no device opens in cuInit"
	note "cuInit=$_r driver_calls=$(json_field "$_l" driver_calls) device_opens=$(json_field "$_l" device_opens) duration=$(json_field "$_l" duration_seconds)s"
}

# (c) mode fail_register: the kernel's request_free_mem_region really returns -34, the module
# writes NV_ERR_NO_MEMORY into the caller's params, and the agent reads it from there.
test_cuinit_fail_register() {
	need_agent || return
	dmesg -c >/dev/null
	echo 1 >"$UVM_PARAMS/uvm_debug_prints"
	uvm_mode fail_register
	run_workload /tmp/cuinit_fail_register/out
	wait "$WL_PID"
	uvm_mode ok
	echo 0 >"$UVM_PARAMS/uvm_debug_prints"
	_r=$(workload_result /tmp/cuinit_fail_register/out)
	[ "$_r" = 3 ] || bad "cuInit=$_r (want 3)"
	_k=$(pid_key "$WL_PID")
	wait_for 20 log_has '"event":"driver_ioctl"' "$_k" '"ioctl":"UVM_REGISTER_GPU"' \
		'"result":"NV_ERR_NO_MEMORY"' ||
		bad "no driver_ioctl UVM_REGISTER_GPU NV_ERR_NO_MEMORY for pid $WL_PID"
	wait_for 10 log_has '"event":"cuinit_end"' "$_k" '"failed_result":"NV_ERR_NO_MEMORY"' ||
		bad "no cuinit_end naming NV_ERR_NO_MEMORY"
	_e=$(uvm_stat last_request_free_mem_region_err)
	[ "$_e" = -34 ] || bad "request_free_mem_region returned $_e (want -34)"
	_d=$(dmesg | grep "request_free_mem_region() err")
	echo "$_d" | grep -q "nvidia-uvm: uvm_pmm_gpu.c:[0-9]* devmem_alloc_pagemap\[pid:$WL_PID\] request_free_mem_region() err -34" ||
		bad "dmesg lacks the driver's debug print: $_d"
	note "cuInit=$_r; kernel returned $_e; dmesg: $(echo "$_d" | sed 's/^\[[^]]*\] //' | head -n1)"
	# The kretprobe saw the -34 inside the UVM ioctl, and the diagnosis used it.
	wait_for 10 log_has '"event":"kernel_signal"' "$_k" '"function":"request_free_mem_region"' \
		'"result":"-34 (ERANGE)"' '"in_uvm_ioctl":true' ||
		bad "no kernel_signal request_free_mem_region -34 for pid $WL_PID"
	wait_for 10 log_has '"event":"cuinit_end"' "$_k" '"diagnosis":"hmm_setup_failure' ||
		bad "cuinit_end does not name hmm_setup_failure: $(log_lines '"event":"cuinit_end"' "$_k" | head -n1)"
	wait_for 10 log_has '"event":"diagnosis"' "$_k" '"rule":"hmm_setup_failure"' \
		'request_free_mem_region = -34 (ERANGE)' ||
		bad "the hmm_setup_failure finding does not carry the kernel evidence"
	_dl=$(log_lines '"event":"diagnosis"' "$_k" '"rule":"hmm_setup_failure"' | head -n1)
	note "diagnosis: $(json_field "$_dl" severity) $(json_field "$_dl" confidence)"
}

# (c) mode hang_register: a real D-state sleep inside the driver, reported as a stall with
# the thread state and wchan; a second process blocks on the global lock; released by the
# parameter, the calls return and the agent logs stall_end.
test_cuinit_hang_register() {
	need_agent || return
	uvm_mode hang_register
	run_workload /tmp/cuinit_hang_register/out
	_p1=$WL_PID
	if ! wait_for 30 sh -c "[ \"\$(cat $UVM_PARAMS/waiting)\" -ge 1 ]"; then
		bad "the workload never reached the hang"
		hang_release "$_p1"
		return
	fi
	run_workload /tmp/cuinit_hang_register/out2
	_p2=$WL_PID
	_k1=$(pid_key "$_p1")
	_k2=$(pid_key "$_p2")
	if ! wait_for 20 log_has '"event":"stall"' "$_k1" '"call":"UVM_REGISTER_GPU"'; then
		bad "no stall of UVM_REGISTER_GPU for pid $_p1 (process: state $(proc_state "$_p1"), wchan $(cat /proc/$_p1/wchan 2>/dev/null))"
		hang_release "$_p1" "$_p2"
		return
	fi
	_l=$(log_lines '"event":"stall"' "$_k1" '"call":"UVM_REGISTER_GPU"' | head -n1)
	_st=$(json_field "$_l" thread_state)
	_wc=$(json_field "$_l" wchan)
	_ks=$(json_field "$_l" kernel_stack)
	case "$_st" in D*) ;; *) bad "thread_state '$_st' (want D)" ;; esac
	[ "$_wc" = devmem_alloc_pagemap ] || bad "wchan '$_wc' (want devmem_alloc_pagemap)"
	echo "$_ks" | grep -q "devmem_alloc_pagemap" || note "kernel_stack lacks devmem_alloc_pagemap: '$_ks'"
	echo "$_ks" | grep -q "uvm_gpu_retain_by_uuid" && note "kernel stack names the driver path"
	# The second process waits for the global lock that the first holds.
	wait_for 20 log_has '"event":"stall"' "$_k2" '"call":"UVM_REGISTER_GPU"' ||
		bad "no stall for the second process (pid $_p2)"
	_l2=$(log_lines '"event":"stall"' "$_k2" '"call":"UVM_REGISTER_GPU"' | head -n1)
	_wc2=$(json_field "$_l2" wchan)
	case "$(json_field "$_l2" thread_state)" in D*) ;; *) bad "second thread not in D" ;; esac
	wait_for 10 log_has '"event":"stall"' "$_k1" '"call":"cuInit"' ||
		bad "no cuInit stall for pid $_p1"
	note "state=$_st wchan=$_wc; second waiter wchan=$_wc2"
	say "stall record: $_l"
	# Release: the calls continue in mode ok.
	hang_release "$_p1" "$_p2"
	_r1=$(workload_result /tmp/cuinit_hang_register/out)
	_r2=$(workload_result /tmp/cuinit_hang_register/out2)
	[ "$_r1" = 0 ] && [ "$_r2" = 0 ] || bad "after release cuInit=$_r1,$_r2 (want 0,0)"
	wait_for 20 log_has '"event":"stall_end"' "$_k1" '"call":"UVM_REGISTER_GPU"' '"outcome":"returned"' ||
		bad "no stall_end for UVM_REGISTER_GPU (pid $_p1)"
	wait_for 10 log_has '"event":"stall_end"' "$_k1" '"call":"cuInit"' ||
		bad "no stall_end for cuInit (pid $_p1)"
	wait_for 10 log_has '"event":"cuinit_end"' "$_k1" '"result":"CUDA_SUCCESS"' ||
		bad "no cuinit_end CUDA_SUCCESS after release"
	_le=$(log_lines '"event":"stall_end"' "$_k1" '"call":"UVM_REGISTER_GPU"' | head -n1)
	note "released after $(json_field "$_le" duration_seconds)s, cuInit=$_r1,$_r2"
}

# hang_release PID...: mode back to ok (the sleepers continue) and wait for the workloads.
hang_release() {
	uvm_mode ok
	for _p in "$@"; do wait "$_p"; done
}

# The HMM paths of the module call the kernel's hmm_range_fault and migrate_vma_*.
test_kernel_fn_hmm_faults() {
	need_module || return
	uvm_mode ok
	uvm-hmm-test --pages 256 >/tmp/kernel_fn_hmm_faults/out 2>&1
	_rc=$?
	sed 's/^/uvm-hmm-test| /' /tmp/kernel_fn_hmm_faults/out
	if grep -q "^fault_read .*rm_status=0x56" /tmp/kernel_fn_hmm_faults/out; then
		skip "kernel without CONFIG_HMM_MIRROR"
		return
	fi
	[ "$_rc" = 0 ] || bad "uvm-hmm-test exited $_rc"
	check "register did not reserve nvidia-uvm-hmm in /proc/iomem" \
		grep -q "^register ret=0 rm_status=0x0 iomem_hmm=1" /tmp/kernel_fn_hmm_faults/out
	check "hmm_range_fault (read) did not make 256 pages present" \
		grep -q "^fault_read ret=0 rm_status=0x0 pages=256 " /tmp/kernel_fn_hmm_faults/out
	check "hmm_range_fault (write, UVM GPU1 BH kthread) did not make 256 pages present" \
		grep -q "^fault_write_bh ret=0 rm_status=0x0 pages=256 " /tmp/kernel_fn_hmm_faults/out
	check "hmm_range_fault (non-replayable batch) did not find 256 pages present" \
		grep -q "^fault_read_nr ret=0 rm_status=0x0 pages=256 " /tmp/kernel_fn_hmm_faults/out
	check "UVM_MIGRATE failed" grep -q "^migrate ret=0 rm_status=0x0" /tmp/kernel_fn_hmm_faults/out
	grep -q "nvidia-uvm-hmm" /proc/iomem && bad "nvidia-uvm-hmm still reserved after exit"
	note "$(cat $UVM_PARAMS/stats | tr ' ' '\n' | grep -E '^(fault|migrate)' | tr '\n' ' ')"
}

# The kernel_fn aggregates move when the module is exercised: this test exercises it itself
# (a cuInit that works, one whose UVM_REGISTER_GPU fails with -34, the HMM fault paths).
test_kernel_fn_metrics() {
	need_agent || return
	uvm_mode ok
	run_workload /tmp/kernel_fn_metrics/ok
	wait "$WL_PID"
	uvm_mode fail_register
	run_workload /tmp/kernel_fn_metrics/fail
	wait "$WL_PID"
	uvm_mode ok
	uvm-hmm-test --pages 16 >/tmp/kernel_fn_metrics/hmm 2>&1 || bad "uvm-hmm-test exited $?"
	_moved=""
	for _fn in uvm_api_register_gpu uvm_va_space_register_gpu uvm_gpu_retain_by_uuid \
		request_free_mem_region hmm_range_fault migrate_vma_setup migrate_vma_pages \
		migrate_vma_finalize uvm_parent_gpu_service_replayable_faults \
		uvm_parent_gpu_service_non_replayable_fault_buffer; do
		_c=$(metric "uvmwatch_kernel_function_duration_seconds_count{function=\"$_fn\"}")
		case "$_c" in "" | 0) bad "$_fn: no calls counted" ;; *) _moved="$_moved $_fn=$_c" ;; esac
	done
	_ok=$(metric 'uvmwatch_kernel_function_calls_total{function="uvm_api_register_gpu",result="NV_OK"}')
	case "$_ok" in "" | 0) bad "no uvm_api_register_gpu NV_OK" ;; esac
	_err=$(metric 'uvmwatch_kernel_function_calls_total{function="request_free_mem_region",result="ERANGE"}')
	case "$_err" in "" | 0) bad "request_free_mem_region ERANGE not counted" ;; esac
	for _fn in memremap_pages uvm_hmm_va_block_service_locked uvm_hmm_migrate_ranges; do
		_moved="$_moved $_fn=$(metric "uvmwatch_kernel_function_duration_seconds_count{function=\"$_fn\"}")"
	done
	note "counts:$_moved"
}

# (d) rmmod nvidia_uvm while the agent runs: the agent keeps running; the stale node then
# fails to open (ENXIO, seen by the agent); after reloading, cuInit works and is seen again.
test_module_watch_rmmod() {
	need_agent || return
	check "rmmod nvidia_uvm failed" rmmod nvidia_uvm || return
	wait_for 10 log_has '"event":"module_unloaded"' ||
		bad "the agent did not notice nvidia_uvm being unloaded"
	sleep 2
	agent_alive || { bad "agent died after rmmod"; return; }
	run_workload /tmp/module_watch_rmmod/out
	wait "$WL_PID"
	_r=$(workload_result /tmp/module_watch_rmmod/out)
	_k=$(pid_key "$WL_PID")
	[ "$_r" != 0 ] || bad "cuInit succeeded with the module unloaded"
	wait_for 20 log_has '"event":"device_open_failed"' "$_k" '"path":"/dev/nvidia-uvm"' ||
		bad "no device_open_failed for /dev/nvidia-uvm"
	_l=$(log_lines '"event":"device_open_failed"' "$_k" | head -n1)
	note "unloaded: cuInit=$_r, open errno $(json_field "$_l" errno)"
	check "reload failed" load_uvm || return
	wait_for 10 log_has '"event":"module_loaded"' ||
		bad "the agent did not notice nvidia_uvm being loaded again"
	run_workload /tmp/module_watch_rmmod/out2
	wait "$WL_PID"
	_r=$(workload_result /tmp/module_watch_rmmod/out2)
	[ "$_r" = 0 ] || bad "cuInit=$_r after reload"
	wait_for 20 log_has '"event":"cuinit_end"' "$(pid_key "$WL_PID")" '"result":"CUDA_SUCCESS"' ||
		bad "agent did not see cuInit after reload"
	agent_alive || bad "agent died"
	note "reloaded: cuInit=$_r"
}

test_agent_stop() {
	need_agent || return
	agent_stop
	_rc=$?
	[ "$_rc" = 0 ] || bad "agent exited $_rc on SIGTERM"
	check "no \"stopped\" record" log_has '"event":"stopped"'
	_errs=$(grep -c '"level":"ERROR"' "$AGENT_LOG")
	note "agent log: $(wc -l <"$AGENT_LOG") records, $_errs at ERROR (the stall reports)"
}

# After the tests: the kernel log goes to the console log (not parsed).
# After each backend's pass: its agent log goes to the console log (not parsed).
vmtest_pass_done() {
	agent_stop >/dev/null 2>&1
	sed "s/^/agent.log[$1]| /" "$AGENT_LOG" 2>/dev/null
	: >"$AGENT_LOG"
}

vmtest_finish() {
	agent_stop >/dev/null 2>&1
	dmesg | grep -v "^\[ *0\.\|ACPI\|PCI\|pci " | tail -n 80 | sed 's/^/dmesg| /'
}

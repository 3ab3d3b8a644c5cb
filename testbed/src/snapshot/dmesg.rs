//! Kernel log text for snapshot trees: a clean boot ([`boot_dmesg`]) and excerpts of the
//! failures the doctor recognises (`DMESG_*`).

use super::DriverSpec;

/// Kernel log of a boot that loaded `driver` and nvidia_uvm (major `uvm_major`) cleanly.
pub fn boot_dmesg(driver: &DriverSpec, uvm_major: u32) -> String {
    let taint = if driver.open {
        ""
    } else {
        "[    4.501112] nvidia: module license 'NVIDIA' taints kernel.\n\
         [    4.501115] Disabling lock debugging due to kernel taint\n"
    };
    let flavor = if driver.open {
        "NVIDIA UNIX Open Kernel Module for x86_64"
    } else {
        "NVIDIA UNIX x86_64 Kernel Module"
    };
    let modeset = if driver.open {
        "NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64"
    } else {
        "NVIDIA UNIX x86_64 Kernel Mode Setting Driver"
    };
    let v = &driver.version;
    format!(
        "[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #45~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC Wed Sep 11 15:25:05 UTC 2\n\
         [    0.000000] Command line: BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=3b6c0f0e-8d2a-4c51-9e1f-5a7b2c9d4e10 ro quiet splash\n\
         [    0.412337] PCI: Using configuration type 1 for base access\n\
         [    4.498310] nvidia: loading out-of-tree module taints kernel.\n\
         {taint}\
         [    4.612901] nvidia-nvlink: Nvlink Core is being initialized, major device number 509\n\
         [    4.620311] nvidia 0000:18:00.0: enabling device (0000 -> 0002)\n\
         [    4.688120] nvidia 0000:2a:00.0: enabling device (0000 -> 0002)\n\
         [    4.760542] NVRM: loading {flavor}  {v}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:12:40 UTC 2025\n\
         [    4.902113] nvidia-modeset: Loading {modeset}  {v}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Dec  2 01:00:21 UTC 2025\n\
         [    5.004121] nvidia-uvm: Loaded the UVM driver, major device number {uvm_major}.\n\
         [    5.210377] [drm] [nvidia-drm] [GPU ID 0x00001800] Loading driver\n\
         [    7.301554] systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence Daemon.\n"
    )
}

/// Xid 79 (GPU fell off the bus) on GPU 0000:18:00.
pub const DMESG_XID_79: &str = "\
[ 8123.441902] NVRM: GPU at PCI:0000:18:00: GPU-6f0c2d1e-8a4b-4c3d-9e2f-1a7b5c3d2e10
[ 8123.441910] NVRM: GPU Board Serial Number: 1652324011187
[ 8123.441913] NVRM: Xid (PCI:0000:18:00): 79, pid=2817, name=python3, GPU has fallen off the bus.
[ 8123.441920] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.
";

/// User-space driver 550.54.15 talking to kernel module 535.161.08.
pub const DMESG_API_MISMATCH: &str = "\
[  612.118230] NVRM: API mismatch: the client has the version 550.54.15, but
[  612.118232] NVRM: this kernel module has the version 535.161.08.  Please
[  612.118233] NVRM: make sure that this kernel module and all NVIDIA driver
[  612.118234] NVRM: components have the same version.
";

/// A GPU that fails to initialise in the kernel.
pub const DMESG_ADAPTER_INIT_FAILED: &str = "\
[  301.552071] NVRM: GPU 0000:18:00.0: RmInitAdapter failed! (0x62:0x65:2401)
[  301.552560] NVRM: GPU 0000:18:00.0: rm_init_adapter failed, device minor number 0
";

/// A thread stuck in `UVM_REGISTER_GPU` (hung-task report with nvidia_uvm frames).
pub const DMESG_HUNG_TASK_UVM: &str = "\
[ 1230.112233] INFO: task python3:2817 blocked for more than 122 seconds.
[ 1230.112240]       Tainted: G           OE      6.8.0-45-generic #45~22.04.1-Ubuntu
[ 1230.112242] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
[ 1230.112244] task:python3         state:D stack:0     pid:2817  tgid:2817  ppid:2790   flags:0x00004002
[ 1230.112249] Call Trace:
[ 1230.112251]  <TASK>
[ 1230.112255]  __schedule+0x27c/0x6b0
[ 1230.112262]  schedule+0x33/0x110
[ 1230.112265]  schedule_preempt_disabled+0x15/0x30
[ 1230.112268]  rwsem_down_write_slowpath+0x2a0/0x620
[ 1230.112272]  down_write+0x5c/0x80
[ 1230.112275]  uvm_gpu_retain_by_uuid+0x3a/0xd0 [nvidia_uvm]
[ 1230.112390]  uvm_va_space_register_gpu+0x4c/0x6a0 [nvidia_uvm]
[ 1230.112460]  uvm_api_register_gpu+0x5a/0x80 [nvidia_uvm]
[ 1230.112520]  uvm_ioctl+0x1b4d/0x1e90 [nvidia_uvm]
[ 1230.112600]  uvm_unlocked_ioctl_entry.part.0+0x7b/0xf0 [nvidia_uvm]
[ 1230.112660]  uvm_unlocked_ioctl_entry+0x6b/0x90 [nvidia_uvm]
[ 1230.112700]  __x64_sys_ioctl+0xa3/0xf0
[ 1230.112705]  x64_sys_call+0x11ad/0x25f0
[ 1230.112709]  do_syscall_64+0x7e/0x170
[ 1230.112720]  entry_SYSCALL_64_after_hwframe+0x78/0x80
[ 1230.112725] RIP: 0033:0x7f3a5c11a94f
[ 1230.112730] RSP: 002b:00007ffd4c8b1e10 EFLAGS: 00000246 ORIG_RAX: 0000000000000010
[ 1230.112740]  </TASK>
";

/// A soft lockup whose RIP is in nvidia_uvm's HMM fault path.
pub const DMESG_SOFT_LOCKUP_UVM: &str = "\
[ 2210.004411] watchdog: BUG: soft lockup - CPU#12 stuck for 26s! [python3:2817]
[ 2210.004418] Modules linked in: nvidia_uvm(OE) nvidia_drm(OE) nvidia_modeset(OE) nvidia(OE) overlay ext4
[ 2210.004460] CPU: 12 PID: 2817 Comm: python3 Tainted: G           OE      6.8.0-45-generic #45~22.04.1-Ubuntu
[ 2210.004463] Hardware name: Supermicro SYS-821GE-TNHR/X13DEG-OAD, BIOS 2.1 04/02/2024
[ 2210.004465] RIP: 0010:uvm_hmm_va_block_service_locked+0x2f1/0x9c0 [nvidia_uvm]
[ 2210.004520] Code: 48 8b 45 c8 48 8b 40 08 48 85 c0 74 0a 48 8b 7d c8 e8 ab cd ef ff
[ 2210.004530] Call Trace:
[ 2210.004531]  <IRQ>
[ 2210.004535]  ? show_regs+0x6d/0x80
[ 2210.004540]  ? watchdog_timer_fn+0x206/0x290
[ 2210.004560]  </IRQ>
[ 2210.004561]  <TASK>
[ 2210.004570]  uvm_va_block_service_locked+0x9f/0x2a0 [nvidia_uvm]
[ 2210.004580]  uvm_parent_gpu_service_replayable_faults+0x5a1/0xf80 [nvidia_uvm]
[ 2210.004600]  </TASK>
";

/// A hung task that has nothing to do with nvidia (journal commit), for negative tests.
/// Its `Modules linked in:` line lists the nvidia modules, which must not count.
pub const DMESG_HUNG_TASK_OTHER: &str = "\
[ 3301.220011] INFO: task jbd2/nvme0n1p2-8:412 blocked for more than 122 seconds.
[ 3301.220020]       Not tainted 6.8.0-45-generic #45~22.04.1-Ubuntu
[ 3301.220022] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
[ 3301.220024] task:jbd2/nvme0n1p2- state:D stack:0     pid:412   tgid:412   ppid:2      flags:0x00004000
[ 3301.220025] Modules linked in: nvidia_uvm(OE) nvidia(OE) ext4
[ 3301.220029] Call Trace:
[ 3301.220030]  <TASK>
[ 3301.220033]  __schedule+0x27c/0x6b0
[ 3301.220036]  schedule+0x33/0x110
[ 3301.220040]  jbd2_journal_commit_transaction+0x2bc/0x1a60
[ 3301.220045]  kjournald2+0xab/0x280
[ 3301.220048]  kthread+0xef/0x120
[ 3301.220052]  ret_from_fork+0x44/0x70
[ 3301.220058]  </TASK>
";

/// nvidia_uvm's HMM set-up failing with -34 (ERANGE), printed with `uvm_debug_prints=1`.
pub const DMESG_HMM_ERR_34: &str = "\
[  845.330127] nvidia-uvm: uvm_pmm_gpu.c:3482 devmem_alloc_pagemap[pid:2817] request_free_mem_region() err -34
";

/// A suspend/resume cycle (place it after the UVM load line).
pub const DMESG_RESUME: &str = "\
[ 9000.000101] PM: suspend entry (deep)
[ 9000.012442] Filesystems sync: 0.012 seconds
[ 9000.221907] ACPI: PM: Preparing to enter system sleep state S3
[ 9030.004112] ACPI: PM: Waking up from system sleep state S3
[ 9031.771230] OOM killer enabled.
[ 9031.802200] PM: suspend exit
";

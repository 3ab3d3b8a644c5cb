// SPDX-License-Identifier: GPL-2.0
/*
 * uvm_stub.c - module "nvidia_uvm" (file nvidia-uvm.ko): a test stand-in for NVIDIA's
 * Unified Memory driver at the kernel boundary, for uvmwatch's VM tests. There is no GPU.
 *
 * What is real here:
 *   - the character device: /proc/devices line "nvidia-uvm" with a dynamic major, minor 0
 *     /dev/nvidia-uvm and minor 1 /dev/nvidia-uvm-tools (the test's /init makes the nodes
 *     with mknod from /proc/devices, as nvidia-modprobe does);
 *   - the UVM command numbers, params sizes and rmStatus offsets of driver 590.48.01
 *     (kernel-open/nvidia-uvm/uvm_ioctl.h at tag 590.48.01; the 590.48.01 rows of
 *     agent/src/decode/layouts/nvidia-layouts.tsv): params are copied in, handled, and
 *     copied back with rmStatus written where the real driver writes it; the syscall
 *     returns 0 when the command ran, as the real driver does;
 *   - the call path and the function names of the driver, so kprobes, /proc/<pid>/wchan,
 *     /proc/<pid>/stack and /proc/kallsyms ("uvm_api_register_gpu [nvidia_uvm]") look as on
 *     a host with the real module:
 *       uvm_unlocked_ioctl_entry > uvm_unlocked_ioctl > uvm_ioctl > uvm_api_register_gpu >
 *       uvm_va_space_register_gpu > uvm_gpu_retain_by_uuid (global lock) > add_gpu >
 *       uvm_pmm_devmem_init > devmem_alloc_pagemap > request_free_mem_region (the kernel's)
 *   - the kernel functions it calls are the kernel's own: request_free_mem_region,
 *     release_mem_region, hmm_range_fault (with an mmu interval notifier),
 *     migrate_vma_setup/pages/finalize.
 *
 * Module parameters (/sys/module/nvidia_uvm/parameters/):
 *   mode            ok | fail_register | hang_register (writable at run time)
 *       ok             UVM_REGISTER_GPU reserves "nvidia-uvm-hmm" physical address space
 *                      with request_free_mem_region (devmem_size_mb), kept until the GPU is
 *                      released (visible in /proc/iomem), and returns NV_OK.
 *       fail_register  request_free_mem_region is asked for a region as large as the whole
 *                      physical address space, so the kernel's own search finds no free
 *                      candidate and returns ERR_PTR(-ERANGE) (-34, the error of NVIDIA's
 *                      KASLR known issue); rmStatus NV_ERR_NO_MEMORY (0x51).
 *       hang_register  the registering thread sleeps TASK_UNINTERRUPTIBLE (D state) in
 *                      devmem_alloc_pagemap while holding the global UVM lock (further
 *                      registrations block on that lock, also in D state), until mode is
 *                      written to something else (the call then proceeds in that mode) or
 *                      hang_timeout_s passes (rmStatus NV_ERR_TIMEOUT).
 *   hang_timeout_s  seconds before a hang gives up (default 60), so a VM never wedges
 *   devmem_size_mb  size reserved in ok mode (default 1024)
 *   uvm_debug_prints  print init errors as the real driver does with it set (default N:
 *                   like the real driver, a failed HMM set-up leaves dmesg silent)
 *   uvm_disable_hmm read-only, as in the real driver: Y skips the HMM device-memory set-up
 *   waiting         read-only: threads asleep in the hang right now
 *   stats           read-only: counters (registrations by outcome, faults, migrations)
 *
 * A test-only command (not a UVM command; the agent shows it as an unknown number):
 *   UVMWATCH_VMTEST_SERVICE_FAULTS 0x7f000001, params 32 bytes:
 *     u64 base @0, u64 length @8, u32 flags @16 (bit 0: write; bit 1: service as a
 *     replayable fault batch, bit 2: as a non-replayable one, both in the "UVM GPU1 BH"
 *     kthread as the real bottom half does), u32 pages_out @20 (pages made present),
 *     s32 errno_out @24, NV_STATUS rmStatus @28.
 *   It runs [uvm_parent_gpu_service_replayable_faults | ..._non_replayable_fault_buffer] >
 *   uvm_va_block_service_locked > uvm_hmm_va_block_service_locked > hmm_range_fault on the
 *   caller's memory.
 * UVM_MIGRATE (0x33) with a zero destination UUID (the CPU) runs uvm_api_migrate >
 * uvm_hmm_migrate_ranges > migrate_vma_setup/migrate_vma_pages/migrate_vma_finalize on the
 * range, selecting system pages and giving them no destination, so they stay where they are.
 */
#define pr_fmt(fmt) "nvidia-uvm: " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/fs.h>
#include <linux/cdev.h>
#include <linux/uaccess.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/wait.h>
#include <linux/ioport.h>
#include <linux/kthread.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/mmzone.h>
#include <linux/version.h>
#if IS_ENABLED(CONFIG_HMM_MIRROR)
#include <linux/hmm.h>
#include <linux/mmu_notifier.h>
#endif
#if IS_ENABLED(CONFIG_DEVICE_MIGRATION)
#include <linux/migrate.h>
#endif

/* Probe points: never inlined, never cloned (so kallsyms has exactly these names). */
#define UVM_PROBE_POINT noinline __attribute__((__noclone__))

typedef u32 NV_STATUS;
#define NV_OK 0x00000000u
#define NV_ERR_ILLEGAL_ACTION 0x00000016u
#define NV_ERR_INVALID_ADDRESS 0x0000001eu
#define NV_ERR_INVALID_ARGUMENT 0x0000001fu
#define NV_ERR_INVALID_DEVICE 0x00000026u
#define NV_ERR_NO_MEMORY 0x00000051u
#define NV_ERR_NOT_SUPPORTED 0x00000056u
#define NV_ERR_TIMEOUT 0x00000065u

#define UVM_INITIALIZE 0x30000001u
#define UVM_DEINITIALIZE 0x30000002u
#define UVM_CREATE_RANGE_GROUP 0x17u
#define UVM_DESTROY_RANGE_GROUP 0x18u
#define UVM_REGISTER_GPU 0x25u
#define UVM_UNREGISTER_GPU 0x26u
#define UVM_PAGEABLE_MEM_ACCESS 0x27u
#define UVM_MIGRATE 0x33u
#define UVM_MM_INITIALIZE 0x4bu
#define UVMWATCH_VMTEST_SERVICE_FAULTS 0x7f000001u

#define UVM_INIT_FLAGS_DISABLE_HMM 0x1ull
#define UVM_MAX_GPUS 8
#define UVM_FAULT_MAX_PAGES 16384 /* 64 MiB of 4 KiB pages per call */

/* Every command 590.48.01 dispatches, with x86_64 params size and rmStatus offset. */
struct uvm_ioctl_desc {
	u32 cmd;
	u16 size;
	u16 status_off;
};

static const struct uvm_ioctl_desc uvm_ioctls[] = {
	{ 0x30000001, 16, 8 },	 { 0x17, 16, 8 },	{ 0x18, 16, 8 },
	{ 0x19, 32, 28 },	 { 0x1a, 20, 16 },	{ 0x1b, 56, 48 },
	{ 0x1c, 12, 8 },	 { 0x1d, 36, 32 },	{ 0x1e, 36, 32 },
	{ 0x1f, 32, 24 },	 { 0x21, 9264, 9260 }, { 0x22, 16, 8 },
	{ 0x25, 40, 36 },	 { 0x26, 20, 16 },	{ 0x27, 8, 4 },
	{ 0x28, 272, 264 },	 { 0x29, 272, 264 },	{ 0x2a, 40, 36 },
	{ 0x2b, 24, 16 },	 { 0x2c, 24, 16 },	{ 0x2d, 24, 16 },
	{ 0x2e, 40, 32 },	 { 0x2f, 40, 32 },	{ 0x33, 80, 72 },
	{ 0x35, 32, 24 },	 { 0x36, 20, 16 },	{ 0x37, 20, 16 },
	{ 0x3e, 40, 32 },	 { 0x3f, 40, 32 },	{ 0x40, 16, 8 },
	{ 0x41, 40, 32 },	 { 0x42, 40, 32 },	{ 0x43, 4, 0 },
	{ 0x44, 9248, 9240 }, { 0x45, 4, 0 },	{ 0x46, 24, 20 },
	{ 0x47, 24, 20 },	 { 0x48, 24, 16 },	{ 0x49, 24, 16 },
	{ 0x4a, 40, 32 },	 { 0x4b, 8, 4 },	{ 0x4d, 16, 8 },
	{ 0x4e, 56, 52 },	 { 0x4f, 4, 0 },	{ 0x50, 32, 24 },
	{ UVMWATCH_VMTEST_SERVICE_FAULTS, 32, 28 },
};

/* ---- parameters ------------------------------------------------------------------- */

enum uvm_stub_mode { MODE_OK, MODE_FAIL_REGISTER, MODE_HANG_REGISTER };
static const char *const mode_names[] = { "ok", "fail_register", "hang_register" };
static int uvm_mode = MODE_OK;
static DECLARE_WAIT_QUEUE_HEAD(g_hang_wq);
static atomic_t g_hang_waiting = ATOMIC_INIT(0);

static int mode_set(const char *val, const struct kernel_param *kp)
{
	int i;

	for (i = 0; i < ARRAY_SIZE(mode_names); i++) {
		if (sysfs_streq(val, mode_names[i])) {
			WRITE_ONCE(uvm_mode, i);
			wake_up_all(&g_hang_wq);
			return 0;
		}
	}
	return -EINVAL;
}

static int mode_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%s\n", mode_names[READ_ONCE(uvm_mode)]);
}

static const struct kernel_param_ops mode_ops = { .set = mode_set, .get = mode_get };
module_param_cb(mode, &mode_ops, NULL, 0644);
MODULE_PARM_DESC(mode, "ok | fail_register | hang_register");

static unsigned int hang_timeout_s = 60;
module_param(hang_timeout_s, uint, 0644);
MODULE_PARM_DESC(hang_timeout_s, "seconds a hang_register sleep lasts at most (default 60)");

static unsigned long devmem_size_mb = 1024;
module_param(devmem_size_mb, ulong, 0644);
MODULE_PARM_DESC(devmem_size_mb, "physical address space reserved per GPU in ok mode (MiB)");

static bool uvm_debug_prints;
module_param(uvm_debug_prints, bool, 0644);
MODULE_PARM_DESC(uvm_debug_prints, "print init errors (as the real driver's parameter)");

static bool uvm_disable_hmm;
module_param(uvm_disable_hmm, bool, 0444);
MODULE_PARM_DESC(uvm_disable_hmm, "skip the HMM device-memory set-up (as the real driver's)");

static struct {
	atomic_t register_ok, register_fail, register_timeout, hangs;
	atomic_t fault_calls, fault_pages, migrate_calls, migrate_pages;
	atomic_t rfmr_calls, rfmr_errors;
	long last_rfmr_err;
} g_stats;

static int waiting_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&g_hang_waiting));
}

static const struct kernel_param_ops waiting_ops = { .get = waiting_get };
module_param_cb(waiting, &waiting_ops, NULL, 0444);
MODULE_PARM_DESC(waiting, "threads asleep in hang_register now");

static int stats_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf,
			  "register_ok=%d register_fail=%d register_timeout=%d hangs=%d "
			  "request_free_mem_region_calls=%d request_free_mem_region_errors=%d "
			  "last_request_free_mem_region_err=%ld fault_calls=%d fault_pages=%d "
			  "migrate_calls=%d migrate_pages=%d\n",
			  atomic_read(&g_stats.register_ok), atomic_read(&g_stats.register_fail),
			  atomic_read(&g_stats.register_timeout), atomic_read(&g_stats.hangs),
			  atomic_read(&g_stats.rfmr_calls), atomic_read(&g_stats.rfmr_errors),
			  READ_ONCE(g_stats.last_rfmr_err), atomic_read(&g_stats.fault_calls),
			  atomic_read(&g_stats.fault_pages), atomic_read(&g_stats.migrate_calls),
			  atomic_read(&g_stats.migrate_pages));
}

static const struct kernel_param_ops stats_ops = { .get = stats_get };
module_param_cb(stats, &stats_ops, NULL, 0444);
MODULE_PARM_DESC(stats, "counters");

/* As UVM_ERR_PRINT: "nvidia-uvm: <file>:<line> <function>[pid:<pid>] <message>". */
#define UVM_ERR_PRINT(file, fmt, ...)                                                     \
	do {                                                                              \
		if (READ_ONCE(uvm_debug_prints))                                          \
			pr_err("%s:%d %s[pid:%d] " fmt, file, __LINE__, __func__,         \
			       current->pid, ##__VA_ARGS__);                              \
	} while (0)

/* ---- state ---------------------------------------------------------------------------- */

struct uvm_gpu {
	bool present;
	u8 uuid[16];
	int refcount;
	struct resource *devmem; /* from request_free_mem_region; NULL with HMM off */
};

struct uvm_va_space {
	struct mutex lock;
	u64 init_flags;
	DECLARE_BITMAP(registered, UVM_MAX_GPUS);
	u64 next_range_group;
};

enum uvm_fd_type { UVM_FD_UNINITIALIZED, UVM_FD_VA_SPACE, UVM_FD_MM };

struct uvm_fd {
	struct mutex lock;
	enum uvm_fd_type type;
	struct uvm_va_space *va_space;
	unsigned int minor;
};

static struct {
	struct mutex global_lock;
	struct rw_semaphore pm_lock;
	struct uvm_gpu gpus[UVM_MAX_GPUS];
	dev_t dev;
	struct cdev cdev;
	struct kthread_worker *bh_worker;
} g_uvm_global;

struct uvm_gpu;
struct uvm_va_space;
struct uvm_fd;
/* Global (not static) as in the real driver; declared here for -Wmissing-prototypes. */
NV_STATUS uvm_gpu_retain_by_uuid(const u8 *uuid, u64 init_flags, struct uvm_gpu **out);
NV_STATUS uvm_va_space_register_gpu(struct uvm_va_space *va_space, const u8 *uuid);
NV_STATUS uvm_api_register_gpu(u8 *p, struct uvm_fd *fd);

/* ---- HMM device memory set-up (uvm_pmm_gpu.c in the real driver) ---------------------- */

/* A region as large as the whole physical address space (iomem_resource) cannot be free.
 * get_free_mem_region() searches downwards from min(iomem end, PHYSMEM_END) - size + 1:
 * with this size the start is 0 (no candidate: the loop does not run) or, where PHYSMEM_END
 * is lower, wraps below 0, and the one candidate is refused by __request_resource() (end <
 * start). Either way the kernel's own code returns ERR_PTR(-ERANGE) and reserves nothing. */
static unsigned long devmem_impossible_size(void)
{
	u64 end = iomem_resource.end;
	u64 section = 1ull << PA_SECTION_SHIFT;

	if (end >= (1ull << 62))
		return 1ul << 62;
	return (unsigned long)ALIGN(end + 1, section);
}

static UVM_PROBE_POINT struct resource *devmem_alloc_pagemap(unsigned long size)
{
	struct resource *res;
	int mode = READ_ONCE(uvm_mode);

	if (mode == MODE_HANG_REGISTER) {
		long left;

		atomic_inc(&g_stats.hangs);
		atomic_inc(&g_hang_waiting);
		/* TASK_UNINTERRUPTIBLE: the thread shows as D, wchan devmem_alloc_pagemap. */
		left = wait_event_timeout(g_hang_wq, READ_ONCE(uvm_mode) != MODE_HANG_REGISTER,
					  (long)READ_ONCE(hang_timeout_s) * HZ);
		atomic_dec(&g_hang_waiting);
		if (!left) {
			UVM_ERR_PRINT("uvm_pmm_gpu.c", "HMM set-up still blocked after %us\n",
				      hang_timeout_s);
			return ERR_PTR(-ETIMEDOUT);
		}
		mode = READ_ONCE(uvm_mode);
	}
	if (mode == MODE_FAIL_REGISTER)
		size = devmem_impossible_size();

	atomic_inc(&g_stats.rfmr_calls);
	res = request_free_mem_region(&iomem_resource, size, "nvidia-uvm-hmm");
	if (IS_ERR(res)) {
		atomic_inc(&g_stats.rfmr_errors);
		WRITE_ONCE(g_stats.last_rfmr_err, PTR_ERR(res));
		UVM_ERR_PRINT("uvm_pmm_gpu.c", "request_free_mem_region() err %ld\n", PTR_ERR(res));
		return res;
	}
	if (mode == MODE_FAIL_REGISTER) {
		/* Not expected: the size cannot fit. Give it back and fail anyway. */
		pr_warn("request_free_mem_region(%lu) unexpectedly succeeded at %pR\n", size, res);
		release_mem_region(res->start, resource_size(res));
		return ERR_PTR(-ERANGE);
	}
	/* The real driver now calls memremap_pages(MEMORY_DEVICE_PRIVATE); Debian's kernels
	 * have no CONFIG_DEVICE_PRIVATE, and there is no device memory to map: skipped. */
	return res;
}

static UVM_PROBE_POINT NV_STATUS uvm_pmm_devmem_init(struct uvm_gpu *gpu, u64 init_flags)
{
	struct resource *res;

	if (READ_ONCE(uvm_disable_hmm) || (init_flags & UVM_INIT_FLAGS_DISABLE_HMM)) {
		/* HMM off (module switch, or the process's flag as 595.45.04+ honour it). */
		gpu->devmem = NULL;
		return NV_OK;
	}
	res = devmem_alloc_pagemap(READ_ONCE(devmem_size_mb) << 20);
	if (IS_ERR(res))
		return PTR_ERR(res) == -ETIMEDOUT ? NV_ERR_TIMEOUT : NV_ERR_NO_MEMORY;
	gpu->devmem = res;
	return NV_OK;
}

static void uvm_pmm_devmem_deinit(struct uvm_gpu *gpu)
{
	if (gpu->devmem) {
		release_mem_region(gpu->devmem->start, resource_size(gpu->devmem));
		gpu->devmem = NULL;
	}
}

/* ---- GPUs (uvm_gpu.c) ------------------------------------------------------------------ */

static UVM_PROBE_POINT NV_STATUS add_gpu(const u8 *uuid, u64 init_flags, struct uvm_gpu **out)
{
	int i;
	NV_STATUS status;

	for (i = 0; i < UVM_MAX_GPUS; i++)
		if (!g_uvm_global.gpus[i].present)
			break;
	if (i == UVM_MAX_GPUS)
		return NV_ERR_INVALID_DEVICE;
	status = uvm_pmm_devmem_init(&g_uvm_global.gpus[i], init_flags);
	if (status != NV_OK)
		return status;
	memcpy(g_uvm_global.gpus[i].uuid, uuid, 16);
	g_uvm_global.gpus[i].present = true;
	g_uvm_global.gpus[i].refcount = 1;
	*out = &g_uvm_global.gpus[i];
	return NV_OK;
}

UVM_PROBE_POINT NV_STATUS uvm_gpu_retain_by_uuid(const u8 *uuid, u64 init_flags,
						 struct uvm_gpu **out)
{
	NV_STATUS status = NV_OK;
	int i;

	/* Held across the whole bring-up, as g_uvm_global.global_lock in the real driver:
	 * a second registration waits here (D state) while the first is stuck. */
	mutex_lock(&g_uvm_global.global_lock);
	for (i = 0; i < UVM_MAX_GPUS; i++) {
		struct uvm_gpu *gpu = &g_uvm_global.gpus[i];

		if (gpu->present && !memcmp(gpu->uuid, uuid, 16)) {
			gpu->refcount++;
			*out = gpu;
			goto out;
		}
	}
	status = add_gpu(uuid, init_flags, out);
out:
	mutex_unlock(&g_uvm_global.global_lock);
	return status;
}

static UVM_PROBE_POINT void uvm_gpu_release(struct uvm_gpu *gpu)
{
	mutex_lock(&g_uvm_global.global_lock);
	if (--gpu->refcount == 0) {
		uvm_pmm_devmem_deinit(gpu);
		gpu->present = false;
	}
	mutex_unlock(&g_uvm_global.global_lock);
}

/* ---- VA spaces (uvm_va_space.c) -------------------------------------------------------- */

static UVM_PROBE_POINT struct uvm_va_space *uvm_va_space_create(u64 flags)
{
	struct uvm_va_space *va_space = kzalloc(sizeof(*va_space), GFP_KERNEL);

	if (!va_space)
		return NULL;
	mutex_init(&va_space->lock);
	va_space->init_flags = flags;
	va_space->next_range_group = 1;
	return va_space;
}

static UVM_PROBE_POINT void uvm_va_space_destroy(struct uvm_va_space *va_space)
{
	int i;

	for_each_set_bit(i, va_space->registered, UVM_MAX_GPUS)
		uvm_gpu_release(&g_uvm_global.gpus[i]);
	kfree(va_space);
}

UVM_PROBE_POINT NV_STATUS uvm_va_space_register_gpu(struct uvm_va_space *va_space,
						    const u8 *uuid)
{
	struct uvm_gpu *gpu = NULL;
	NV_STATUS status;
	int idx;

	status = uvm_gpu_retain_by_uuid(uuid, va_space->init_flags, &gpu);
	if (status != NV_OK)
		return status;
	idx = gpu - g_uvm_global.gpus;
	mutex_lock(&va_space->lock);
	if (test_and_set_bit(idx, va_space->registered)) {
		mutex_unlock(&va_space->lock);
		uvm_gpu_release(gpu);
		return NV_ERR_INVALID_DEVICE;
	}
	mutex_unlock(&va_space->lock);
	return NV_OK;
}

static UVM_PROBE_POINT NV_STATUS uvm_va_space_unregister_gpu(struct uvm_va_space *va_space,
							     const u8 *uuid)
{
	int i;

	mutex_lock(&va_space->lock);
	for_each_set_bit(i, va_space->registered, UVM_MAX_GPUS) {
		if (!memcmp(g_uvm_global.gpus[i].uuid, uuid, 16)) {
			clear_bit(i, va_space->registered);
			mutex_unlock(&va_space->lock);
			uvm_gpu_release(&g_uvm_global.gpus[i]);
			return NV_OK;
		}
	}
	mutex_unlock(&va_space->lock);
	return NV_ERR_INVALID_DEVICE;
}

/* ---- HMM faults and migration (uvm_hmm.c, uvm_va_block.c, uvm_gpu_replayable_faults.c) - */

#if IS_ENABLED(CONFIG_HMM_MIRROR)
static DEFINE_MUTEX(g_hmm_range_lock);

static bool uvm_hmm_invalidate(struct mmu_interval_notifier *mni,
			       const struct mmu_notifier_range *range, unsigned long cur_seq)
{
	if (mmu_notifier_range_blockable(range))
		mutex_lock(&g_hmm_range_lock);
	else if (!mutex_trylock(&g_hmm_range_lock))
		return false;
	mmu_interval_set_seq(mni, cur_seq);
	mutex_unlock(&g_hmm_range_lock);
	return true;
}

static const struct mmu_interval_notifier_ops uvm_hmm_notifier_ops = {
	.invalidate = uvm_hmm_invalidate,
};

/* Makes [start, end) of mm present (and writable with write) through hmm_range_fault;
 * returns the number of pages present afterwards, or a negative errno. */
static UVM_PROBE_POINT long uvm_hmm_va_block_service_locked(struct mm_struct *mm,
							    unsigned long start,
							    unsigned long end, bool write)
{
	unsigned long npages = (end - start) >> PAGE_SHIFT;
	struct mmu_interval_notifier notifier;
	unsigned long timeout;
	unsigned long *pfns;
	long ret, present = 0;
	unsigned long i;
	struct hmm_range range = {
		.notifier = &notifier,
		.start = start,
		.end = end,
		.default_flags = HMM_PFN_REQ_FAULT | (write ? HMM_PFN_REQ_WRITE : 0),
		.dev_private_owner = &g_uvm_global,
	};

	pfns = kvcalloc(npages, sizeof(*pfns), GFP_KERNEL);
	if (!pfns)
		return -ENOMEM;
	range.hmm_pfns = pfns;
	ret = mmu_interval_notifier_insert(&notifier, mm, start, end - start,
					   &uvm_hmm_notifier_ops);
	if (ret) {
		kvfree(pfns);
		return ret;
	}
	timeout = jiffies + msecs_to_jiffies(HMM_RANGE_DEFAULT_TIMEOUT);
	for (;;) {
		if (time_after(jiffies, timeout)) {
			ret = -EBUSY;
			break;
		}
		range.notifier_seq = mmu_interval_read_begin(&notifier);
		mmap_read_lock(mm);
		ret = hmm_range_fault(&range);
		mmap_read_unlock(mm);
		if (ret == -EBUSY)
			continue;
		if (ret)
			break;
		mutex_lock(&g_hmm_range_lock);
		if (mmu_interval_read_retry(&notifier, range.notifier_seq)) {
			mutex_unlock(&g_hmm_range_lock);
			continue;
		}
		for (i = 0; i < npages; i++)
			if (pfns[i] & HMM_PFN_VALID)
				present++;
		mutex_unlock(&g_hmm_range_lock);
		break;
	}
	mmu_interval_notifier_remove(&notifier);
	kvfree(pfns);
	return ret ? ret : present;
}
#else
static UVM_PROBE_POINT long uvm_hmm_va_block_service_locked(struct mm_struct *mm,
							    unsigned long start,
							    unsigned long end, bool write)
{
	return -EOPNOTSUPP;
}
#endif

static UVM_PROBE_POINT long uvm_va_block_service_locked(struct mm_struct *mm,
							unsigned long start, unsigned long end,
							bool write)
{
	long r = uvm_hmm_va_block_service_locked(mm, start, end, write);

	atomic_inc(&g_stats.fault_calls);
	if (r > 0)
		atomic_add((int)r, &g_stats.fault_pages);
	return r;
}

struct uvm_fault_batch {
	struct kthread_work work;
	struct mm_struct *mm;
	unsigned long start, end;
	bool write;
	long result;
	struct completion done;
};

static void uvm_service_fault_batch(struct uvm_fault_batch *b)
{
	if (mmget_not_zero(b->mm)) {
		b->result = uvm_va_block_service_locked(b->mm, b->start, b->end, b->write);
		mmput(b->mm);
	} else {
		b->result = -ESRCH;
	}
	complete(&b->done);
}

/* Run in the "UVM GPU1 BH" kthread, as the real bottom half that services fault batches
 * (the 560+ names; 535/550 call them uvm_gpu_service_*, not present here). */
static UVM_PROBE_POINT void uvm_parent_gpu_service_replayable_faults(struct kthread_work *work)
{
	uvm_service_fault_batch(container_of(work, struct uvm_fault_batch, work));
}

static UVM_PROBE_POINT void
uvm_parent_gpu_service_non_replayable_fault_buffer(struct kthread_work *work)
{
	uvm_service_fault_batch(container_of(work, struct uvm_fault_batch, work));
}

static UVM_PROBE_POINT NV_STATUS uvm_test_service_faults(u8 *p)
{
	u64 base, length;
	u32 flags, pages = 0;
	s32 err = 0;
	long r;

	memcpy(&base, p + 0, 8);
	memcpy(&length, p + 8, 8);
	memcpy(&flags, p + 16, 4);
	if (!length || !PAGE_ALIGNED(base) || !PAGE_ALIGNED(length) ||
	    length > (u64)UVM_FAULT_MAX_PAGES << PAGE_SHIFT || base + length < base)
		return NV_ERR_INVALID_ARGUMENT;
	if (!current->mm)
		return NV_ERR_INVALID_ADDRESS;

	if (flags & 0x6) {
		struct uvm_fault_batch b = {
			.mm = current->mm,
			.start = base,
			.end = base + length,
			.write = flags & 0x1,
		};

		if (!g_uvm_global.bh_worker)
			return NV_ERR_NOT_SUPPORTED;
		init_completion(&b.done);
		kthread_init_work(&b.work, (flags & 0x4) ?
						   uvm_parent_gpu_service_non_replayable_fault_buffer :
						   uvm_parent_gpu_service_replayable_faults);
		kthread_queue_work(g_uvm_global.bh_worker, &b.work);
		wait_for_completion(&b.done);
		r = b.result;
	} else {
		r = uvm_va_block_service_locked(current->mm, base, base + length, flags & 0x1);
	}
	if (r < 0)
		err = (s32)r;
	else
		pages = (u32)r;
	memcpy(p + 20, &pages, 4);
	memcpy(p + 24, &err, 4);
	if (r == -EOPNOTSUPP)
		return NV_ERR_NOT_SUPPORTED;
	if (r == -EFAULT || r == -EINVAL)
		return NV_ERR_INVALID_ADDRESS;
	return r < 0 ? NV_ERR_NO_MEMORY : NV_OK;
}

#if IS_ENABLED(CONFIG_DEVICE_MIGRATION)
static UVM_PROBE_POINT long uvm_hmm_migrate_ranges(struct mm_struct *mm, unsigned long start,
						   unsigned long end)
{
	unsigned long npages = (end - start) >> PAGE_SHIFT;
	struct migrate_vma args = { 0 };
	struct vm_area_struct *vma;
	unsigned long *src, *dst;
	long ret;

	src = kvcalloc(npages, sizeof(*src), GFP_KERNEL);
	dst = kvcalloc(npages, sizeof(*dst), GFP_KERNEL);
	if (!src || !dst) {
		ret = -ENOMEM;
		goto out;
	}
	mmap_read_lock(mm);
	vma = find_vma(mm, start);
	if (!vma || start < vma->vm_start || end > vma->vm_end) {
		mmap_read_unlock(mm);
		ret = -EFAULT;
		goto out;
	}
	args.vma = vma;
	args.start = start;
	args.end = end;
	args.src = src;
	args.dst = dst;
	args.pgmap_owner = &g_uvm_global;
	args.flags = MIGRATE_VMA_SELECT_SYSTEM;
	ret = migrate_vma_setup(&args);
	if (!ret) {
		/* No destination pages: nothing moves, finalize puts every page back. */
		migrate_vma_pages(&args);
		migrate_vma_finalize(&args);
		ret = args.cpages;
	}
	mmap_read_unlock(mm);
out:
	kvfree(src);
	kvfree(dst);
	return ret;
}
#else
static UVM_PROBE_POINT long uvm_hmm_migrate_ranges(struct mm_struct *mm, unsigned long start,
						   unsigned long end)
{
	return -EOPNOTSUPP;
}
#endif

static UVM_PROBE_POINT NV_STATUS uvm_api_migrate(u8 *p)
{
	static const u8 cpu_uuid[16];
	u64 base, length;
	long r;

	memcpy(&base, p + 0, 8);
	memcpy(&length, p + 8, 8);
	if (memcmp(p + 16, cpu_uuid, 16))
		return NV_ERR_INVALID_DEVICE; /* only "to the CPU": there is no GPU */
	if (!length || !PAGE_ALIGNED(base) || !PAGE_ALIGNED(length) ||
	    length > (u64)UVM_FAULT_MAX_PAGES << PAGE_SHIFT || base + length < base)
		return NV_ERR_INVALID_ARGUMENT;
	if (!current->mm)
		return NV_ERR_INVALID_ADDRESS;
	r = uvm_hmm_migrate_ranges(current->mm, base, base + length);
	atomic_inc(&g_stats.migrate_calls);
	if (r > 0)
		atomic_add((int)r, &g_stats.migrate_pages);
	if (r == -EOPNOTSUPP)
		return NV_ERR_NOT_SUPPORTED;
	return r < 0 ? NV_ERR_INVALID_ADDRESS : NV_OK;
}

/* ---- ioctl handlers (uvm.c, uvm_api.h) ------------------------------------------------- */

static UVM_PROBE_POINT NV_STATUS uvm_api_initialize(u8 *p, struct uvm_fd *fd)
{
	u64 flags;

	memcpy(&flags, p, 8);
	if (flags & ~0x3ull)
		return NV_ERR_INVALID_ARGUMENT;
	if (fd->type == UVM_FD_MM)
		return NV_ERR_ILLEGAL_ACTION;
	if (fd->type == UVM_FD_VA_SPACE)
		return fd->va_space->init_flags == flags ? NV_OK : NV_ERR_INVALID_ARGUMENT;
	fd->va_space = uvm_va_space_create(flags);
	if (!fd->va_space)
		return NV_ERR_NO_MEMORY;
	fd->type = UVM_FD_VA_SPACE;
	return NV_OK;
}

static UVM_PROBE_POINT NV_STATUS uvm_api_mm_initialize(u8 *p, struct uvm_fd *fd)
{
	if (fd->type != UVM_FD_UNINITIALIZED)
		return NV_ERR_INVALID_ARGUMENT;
	fd->type = UVM_FD_MM;
	return NV_OK;
}

static UVM_PROBE_POINT NV_STATUS uvm_api_pageable_mem_access(u8 *p, struct uvm_fd *fd)
{
	/* NvBool pageableMemAccess @0: true where HMM would be on. */
	p[0] = IS_ENABLED(CONFIG_HMM_MIRROR) && !READ_ONCE(uvm_disable_hmm) &&
	       !(fd->va_space->init_flags & UVM_INIT_FLAGS_DISABLE_HMM);
	return NV_OK;
}

/* UVM_REGISTER_GPU_PARAMS: NvProcessorUuid gpu_uuid @0, NvBool numaEnabled @16,
 * NvS32 numaNodeId @20, NvS32 rmCtrlFd @24, NvHandle hClient @28, hSmcPartRef @32,
 * NV_STATUS rmStatus @36. */
UVM_PROBE_POINT NV_STATUS uvm_api_register_gpu(u8 *p, struct uvm_fd *fd)
{
	NV_STATUS status = uvm_va_space_register_gpu(fd->va_space, p);

	if (status == NV_OK) {
		s32 node = -1;

		p[16] = 0;
		memcpy(p + 20, &node, 4);
		atomic_inc(&g_stats.register_ok);
	} else if (status == NV_ERR_TIMEOUT) {
		atomic_inc(&g_stats.register_timeout);
	} else {
		atomic_inc(&g_stats.register_fail);
	}
	return status;
}

static UVM_PROBE_POINT NV_STATUS uvm_api_unregister_gpu(u8 *p, struct uvm_fd *fd)
{
	return uvm_va_space_unregister_gpu(fd->va_space, p);
}

static UVM_PROBE_POINT NV_STATUS uvm_api_create_range_group(u8 *p, struct uvm_fd *fd)
{
	u64 id;

	mutex_lock(&fd->va_space->lock);
	id = fd->va_space->next_range_group++;
	mutex_unlock(&fd->va_space->lock);
	memcpy(p, &id, 8);
	return NV_OK;
}

static const struct uvm_ioctl_desc *uvm_ioctl_find(u32 cmd)
{
	int i;

	for (i = 0; i < ARRAY_SIZE(uvm_ioctls); i++)
		if (uvm_ioctls[i].cmd == cmd)
			return &uvm_ioctls[i];
	return NULL;
}

static UVM_PROBE_POINT long uvm_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct uvm_fd *fd = filp->private_data;
	const struct uvm_ioctl_desc *d;
	void __user *uarg = (void __user *)arg;
	NV_STATUS status;
	u8 *p;

	if (cmd == UVM_DEINITIALIZE)
		return 0;
	d = uvm_ioctl_find(cmd);
	if (!d)
		return -ENOSYS;
	p = kzalloc(d->size, GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	if (copy_from_user(p, uarg, d->size)) {
		kfree(p);
		return -EFAULT;
	}

	mutex_lock(&fd->lock);
	if (cmd == UVM_INITIALIZE) {
		status = uvm_api_initialize(p, fd);
	} else if (cmd == UVM_MM_INITIALIZE) {
		status = uvm_api_mm_initialize(p, fd);
	} else if (fd->type != UVM_FD_VA_SPACE) {
		status = NV_ERR_ILLEGAL_ACTION;
	} else {
		/* The fd lock is not held across the calls that may sleep for long. */
		mutex_unlock(&fd->lock);
		switch (cmd) {
		case UVM_PAGEABLE_MEM_ACCESS:
			status = uvm_api_pageable_mem_access(p, fd);
			break;
		case UVM_REGISTER_GPU:
			status = uvm_api_register_gpu(p, fd);
			break;
		case UVM_UNREGISTER_GPU:
			status = uvm_api_unregister_gpu(p, fd);
			break;
		case UVM_CREATE_RANGE_GROUP:
			status = uvm_api_create_range_group(p, fd);
			break;
		case UVM_DESTROY_RANGE_GROUP:
			status = NV_OK;
			break;
		case UVM_MIGRATE:
			status = uvm_api_migrate(p);
			break;
		case UVMWATCH_VMTEST_SERVICE_FAULTS:
			status = uvm_test_service_faults(p);
			break;
		default:
			status = NV_ERR_NOT_SUPPORTED; /* dispatched by the real driver, not here */
			break;
		}
		mutex_lock(&fd->lock);
	}
	mutex_unlock(&fd->lock);

	memcpy(p + d->status_off, &status, sizeof(status));
	if (copy_to_user(uarg, p, d->size)) {
		kfree(p);
		return -EFAULT;
	}
	kfree(p);
	return 0;
}

static UVM_PROBE_POINT long uvm_unlocked_ioctl(struct file *filp, unsigned int cmd,
					       unsigned long arg)
{
	long ret;

	/* The power-management lock the real driver takes (EAGAIN during suspend). */
	if (!down_read_trylock(&g_uvm_global.pm_lock))
		return -EAGAIN;
	ret = uvm_ioctl(filp, cmd, arg);
	up_read(&g_uvm_global.pm_lock);
	return ret;
}

static UVM_PROBE_POINT long uvm_unlocked_ioctl_entry(struct file *filp, unsigned int cmd,
						     unsigned long arg)
{
	struct uvm_fd *fd = filp->private_data;

	if (fd->minor != 0)
		return -EINVAL; /* nvidia-uvm-tools: no tools commands here */
	return uvm_unlocked_ioctl(filp, cmd, arg);
}

static int uvm_open(struct inode *inode, struct file *filp)
{
	struct uvm_fd *fd = kzalloc(sizeof(*fd), GFP_KERNEL);

	if (!fd)
		return -ENOMEM;
	mutex_init(&fd->lock);
	fd->type = UVM_FD_UNINITIALIZED;
	fd->minor = iminor(inode);
	filp->private_data = fd;
	return 0;
}

static int uvm_release(struct inode *inode, struct file *filp)
{
	struct uvm_fd *fd = filp->private_data;

	if (fd->va_space)
		uvm_va_space_destroy(fd->va_space);
	kfree(fd);
	return 0;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
	.release = uvm_release,
	.unlocked_ioctl = uvm_unlocked_ioctl_entry,
	.compat_ioctl = uvm_unlocked_ioctl_entry,
};

static int __init uvm_init(void)
{
	int ret;

	mutex_init(&g_uvm_global.global_lock);
	init_rwsem(&g_uvm_global.pm_lock);
	ret = alloc_chrdev_region(&g_uvm_global.dev, 0, 2, "nvidia-uvm");
	if (ret)
		return ret;
	cdev_init(&g_uvm_global.cdev, &uvm_fops);
	g_uvm_global.cdev.owner = THIS_MODULE;
	ret = cdev_add(&g_uvm_global.cdev, g_uvm_global.dev, 2);
	if (ret) {
		unregister_chrdev_region(g_uvm_global.dev, 2);
		return ret;
	}
	g_uvm_global.bh_worker = kthread_create_worker(0, "UVM GPU1 BH");
	if (IS_ERR(g_uvm_global.bh_worker))
		g_uvm_global.bh_worker = NULL;
	pr_info("vmtest stub loaded: major %d, mode %s, hmm_mirror %d, device_migration %d\n",
		MAJOR(g_uvm_global.dev), mode_names[uvm_mode], IS_ENABLED(CONFIG_HMM_MIRROR),
		IS_ENABLED(CONFIG_DEVICE_MIGRATION));
	return 0;
}

static void __exit uvm_exit(void)
{
	int i;

	if (g_uvm_global.bh_worker)
		kthread_destroy_worker(g_uvm_global.bh_worker);
	cdev_del(&g_uvm_global.cdev);
	unregister_chrdev_region(g_uvm_global.dev, 2);
	for (i = 0; i < UVM_MAX_GPUS; i++)
		if (g_uvm_global.gpus[i].present)
			uvm_pmm_devmem_deinit(&g_uvm_global.gpus[i]);
}

module_init(uvm_init);
module_exit(uvm_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("uvmwatch vmtest: stand-in for nvidia_uvm at the kernel boundary (no GPU)");

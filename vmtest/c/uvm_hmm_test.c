/*
 * uvm_hmm_test.c - drives the HMM paths of the vmtest nvidia_uvm stub (vmtest/module).
 *
 * usage: uvm-hmm-test [--pages N] [--hold-ms N]
 *
 * Opens /dev/nvidia-uvm, UVM_INITIALIZE, UVM_REGISTER_GPU (reports whether /proc/iomem then
 * shows the "nvidia-uvm-hmm" reservation), then on a fresh anonymous mapping of N pages
 * (default 256), never touched from user space:
 *   1. UVMWATCH_VMTEST_SERVICE_FAULTS read   (hmm_range_fault, in this thread)
 *   2. UVMWATCH_VMTEST_SERVICE_FAULTS write  (hmm_range_fault in the "UVM GPU1 BH" kthread,
 *                                             as a replayable fault batch)
 *   3. UVMWATCH_VMTEST_SERVICE_FAULTS read   (the same, as a non-replayable batch, on the
 *                                             pages 2. made present)
 *   4. UVM_MIGRATE to the CPU                (migrate_vma_setup/pages/finalize, no-op move)
 * and prints one `key=value` line per step, e.g.
 *   register rm_status=0x0 iomem_hmm=1
 *   fault_read ret=0 rm_status=0x0 pages=256 errno=0
 *   fault_write_bh ret=0 rm_status=0x0 pages=256 errno=0
 *   fault_read_nr ret=0 rm_status=0x0 pages=256 errno=0
 *   migrate ret=0 rm_status=0x0
 * With --hold-ms it sleeps that long (fds open, GPU registered) before exiting.
 * Exit status 0 when every step gave NV_OK, 1 otherwise, 2 on a setup error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define UVM_INITIALIZE 0x30000001u
#define UVM_REGISTER_GPU 0x25u
#define UVM_MIGRATE 0x33u
#define UVMWATCH_VMTEST_SERVICE_FAULTS 0x7f000001u

static uint32_t get_u32(const unsigned char *p, size_t off)
{
	uint32_t v;
	memcpy(&v, p + off, sizeof v);
	return v;
}

static void put_u32(unsigned char *p, size_t off, uint32_t v)
{
	memcpy(p + off, &v, sizeof v);
}

static void put_u64(unsigned char *p, size_t off, uint64_t v)
{
	memcpy(p + off, &v, sizeof v);
}

static int iomem_has_hmm(void)
{
	FILE *f = fopen("/proc/iomem", "r");
	char line[256];
	int found = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (strstr(line, "nvidia-uvm-hmm"))
			found = 1;
	fclose(f);
	return found;
}

static int fault(int fd, const char *name, void *base, size_t len, uint32_t flags)
{
	unsigned char p[32] = {0};
	put_u64(p, 0, (uint64_t)(uintptr_t)base);
	put_u64(p, 8, len);
	put_u32(p, 16, flags);
	put_u32(p, 28, 0xffffffffu);
	int r = ioctl(fd, UVMWATCH_VMTEST_SERVICE_FAULTS, p);
	printf("%s ret=%d rm_status=0x%x pages=%u errno=%d\n", name, r < 0 ? -errno : r,
	       get_u32(p, 28), get_u32(p, 20), (int32_t)get_u32(p, 24));
	return r == 0 && get_u32(p, 28) == 0;
}

int main(int argc, char **argv)
{
	unsigned long pages = 256, hold_ms = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--pages") == 0 && i + 1 < argc)
			pages = strtoul(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--hold-ms") == 0 && i + 1 < argc)
			hold_ms = strtoul(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "usage: uvm-hmm-test [--pages N] [--hold-ms N]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	int fd = open("/dev/nvidia-uvm", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		printf("open errno=%d\n", errno);
		return 2;
	}
	unsigned char init[16] = {0};
	if (ioctl(fd, UVM_INITIALIZE, init) != 0 || get_u32(init, 8) != 0) {
		printf("initialize ret=%d rm_status=0x%x\n", -errno, get_u32(init, 8));
		return 2;
	}

	int ok = 1;
	unsigned char reg[40] = {0};
	memcpy(reg, "GPU-vmtest-hmm-0", 16);
	int r = ioctl(fd, UVM_REGISTER_GPU, reg);
	printf("register ret=%d rm_status=0x%x iomem_hmm=%d\n", r < 0 ? -errno : r,
	       get_u32(reg, 36), iomem_has_hmm());
	ok &= r == 0 && get_u32(reg, 36) == 0;

	size_t len = pages * (size_t)sysconf(_SC_PAGESIZE);
	void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED || b == MAP_FAILED) {
		printf("mmap errno=%d\n", errno);
		return 2;
	}
	ok &= fault(fd, "fault_read", a, len, 0);
	ok &= fault(fd, "fault_write_bh", b, len, 0x1 | 0x2);
	ok &= fault(fd, "fault_read_nr", b, len, 0x4);

	/* The pages of b are now present (written by the kernel's fault path): migrate them. */
	unsigned char mig[80] = {0};
	put_u64(mig, 0, (uint64_t)(uintptr_t)b);
	put_u64(mig, 8, len);
	put_u32(mig, 72, 0xffffffffu);
	r = ioctl(fd, UVM_MIGRATE, mig);
	printf("migrate ret=%d rm_status=0x%x\n", r < 0 ? -errno : r, get_u32(mig, 72));
	ok &= r == 0 && get_u32(mig, 72) == 0;

	if (hold_ms) {
		struct timespec ts = {.tv_sec = hold_ms / 1000, .tv_nsec = (hold_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	return ok ? 0 : 1;
}

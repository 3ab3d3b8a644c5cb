/*
 * fake_libcuda.c - a stand-in for NVIDIA's libcuda.so.1, for uvmwatch tests.
 *
 * Built as a shared library named libcuda.so.1. It exports cuInit,
 * cuDriverGetVersion, cuDeviceGetCount and the context creations cuCtxCreate,
 * cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4 and cuDevicePrimaryCtxRetain
 * (with the signatures of cuda.h, CUDA 13). cuInit replays the system calls a real cuInit makes on
 * its way to a usable GPU (file opens and driver ioctls on /dev/nvidia*, with
 * the real ioctl numbers), so that a tracing agent sees the same sequence it
 * would see on a machine with an NVIDIA driver. The device nodes are expected
 * to be served by uvmwatch-fakedev (a FUSE file system).
 *
 * Sources of the numbers (NVIDIA open-gpu-kernel-modules):
 *   kernel-open/common/inc/nv-ioctl-numbers.h  NV_IOCTL_MAGIC 'F', NV_ESC_* (nr)
 *   kernel-open/common/inc/nv-ioctl.h          nv_ioctl_* parameter structs
 *   src/nvidia/arch/nvalloc/unix/include/nv_escape.h  NV_ESC_RM_ALLOC/CONTROL/FREE
 *   kernel-open/nvidia-uvm/uvm_ioctl.h         UVM_* command numbers and params
 *   kernel-open/nvidia-uvm/uvm_linux_ioctl.h   UVM_INITIALIZE 0x30000001
 *   kernel-open/common/inc/nvstatuscodes.h     NV_OK 0, NV_ERR_NO_MEMORY 0x51
 *
 * Environment:
 *   UVMWATCH_FAKE_SCENARIO  success (default) | register_gpu_no_memory |
 *                           hang_register_gpu | missing_node
 *   UVMWATCH_FAKE_GPUS      number of GPUs (/dev/nvidia0..N-1), default 1, max 32
 *   UVMWATCH_FAKE_UVM_FLAGS flags for UVM_INITIALIZE (0x1 disable HMM,
 *                           0x2 multi-process sharing), default 0
 *   UVMWATCH_FAKE_CUDA_DEVICES  devices cuDeviceGetCount reports (as CUDA does
 *                           with MIG on), default UVMWATCH_FAKE_GPUS narrowed by
 *                           CUDA_VISIBLE_DEVICES (indexes, up to the first
 *                           invalid one, as CUDA reads it)
 *   UVMWATCH_FAKE_COMPUTE_MODE  default | exclusive_process_held: with the
 *                           latter every context creation returns 46
 *                           (CUDA_ERROR_DEVICE_UNAVAILABLE), as on a GPU in
 *                           compute mode Exclusive_Process whose context
 *                           another process holds
 *
 * After a successful cuInit, cuDeviceGetCount writes the device count; a
 * context creation on a device below it opens that GPU's node
 * (/dev/nvidia<dev>) and keeps it open as the context, returns 101
 * (CUDA_ERROR_INVALID_DEVICE) on a device past it, and 3 before cuInit.
 *
 * UVM commands are plain integers (no _IOC size bits), so the FUSE server
 * cannot copy parameters back. Before each UVM ioctl this library writes the
 * rmStatus a real driver would write into the parameters, and reads it back
 * after the call as a real caller would.
 *
 * Replay mode (UVMWATCH_FAKE_REPLAY=<step file>, written by the Rust side from a
 * testbed/replays/<name>.replay capture, see testbed/src/replay/run.rs): cuInit
 * issues exactly the steps of the file instead of the sequence above, and
 * writes what it did to UVMWATCH_FAKE_REPLAY_TRACE. Step lines:
 *   O <open|openat|openat2> <flags> <fd|-errno> <recorded ok 1|0> <uvm|stop> <path>
 *   C <fd>
 *   I <fd> <request> <size> <status offset|-1> <status>
 * Descriptors are the capture's; they map to the real ones. Each ioctl gets a
 * params buffer of exactly <size> bytes (NULL for 0) filled with 0xEE, with
 * <status> planted at the offset; a status other than NV_OK read back makes
 * cuInit return 3. A recorded-successful open that fails here is handled as
 * real failing captures show for /dev/nvidia-uvm (again without O_CLOEXEC,
 * then UVM_DEINITIALIZE on -errno), and cuInit returns 999.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

typedef int CUresult;

/* CUDA driver API error codes (cuda.h). */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_UNKNOWN 999

/* CUDA 12.9 reports 12090 from cuDriverGetVersion. */
#define FAKE_DRIVER_VERSION 12090

/* NV_STATUS values (nvstatuscodes.h). */
#define NV_OK 0x00000000u
#define NV_ERR_NO_MEMORY 0x00000051u

/* RM ioctls on /dev/nvidiactl: _IOWR(NV_IOCTL_MAGIC, nr, size). */
#define NV_IOCTL_MAGIC 'F'
#define NV_RM_IOWR(nr, size) _IOC(_IOC_READ | _IOC_WRITE, NV_IOCTL_MAGIC, (nr), (size))

#define NV_ESC_CARD_INFO 0xC8        /* NV_IOCTL_BASE (200) + 0 */
#define NV_ESC_SYS_PARAMS 0xD6       /* NV_IOCTL_BASE + 14 */
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B

/* sizeof(nv_ioctl_sys_params_t): u64 memblock_size. */
#define SYS_PARAMS_SIZE 8
/* sizeof(nv_ioctl_card_info_t) is 72; libcuda passes an array of
 * NV_MAX_DEVICES (32) of them: 2304 bytes (0x900). */
#define CARD_INFO_SIZE (72 * 32)
/* NVOS64 (RM_ALLOC), NVOS54 (RM_CONTROL), NVOS00 (RM_FREE) sizes and the
 * offset of their status field. They give 0xC030462B, 0xC020462A, 0xC0104629. */
#define RM_ALLOC_SIZE 48
#define RM_ALLOC_STATUS_OFF 40
/* NVOS21, RM_ALLOC's 32-byte form (0xC020462B), status at 28. */
#define RM_ALLOC32_SIZE 32
#define RM_ALLOC32_STATUS_OFF 28
#define RM_CONTROL_SIZE 32
#define RM_CONTROL_STATUS_OFF 28
#define RM_FREE_SIZE 16
#define RM_FREE_STATUS_OFF 12

/* UVM commands (uvm_ioctl.h, uvm_linux_ioctl.h) with params size / rmStatus offset. */
#define UVM_INITIALIZE 0x30000001u          /* 16 / 8 */
#define UVM_CREATE_RANGE_GROUP 0x17u        /* 16 / 8 */
#define UVM_REGISTER_GPU 0x25u              /* 40 / 36 */
#define UVM_PAGEABLE_MEM_ACCESS 0x27u       /* 8 / 4 */
#define UVM_MM_INITIALIZE 0x4bu             /* 8 / 4 */

#define MAX_GPUS 32

enum scenario {
    SCENARIO_SUCCESS,
    SCENARIO_REGISTER_GPU_NO_MEMORY,
    SCENARIO_HANG_REGISTER_GPU,
    SCENARIO_MISSING_NODE,
    SCENARIO_INVALID,
};

/* Per-process state, as real libcuda keeps it. */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_done;
static pid_t init_pid;
static CUresult init_result;
/* Descriptors kept open after a successful init, as a real driver would. */
static int ctl_fd = -1;
static int uvm_fd = -1;
static int uvm_mm_fd = -1;
static int gpu_fds[MAX_GPUS];
static int gpu_fd_count;

static enum scenario read_scenario(void)
{
    const char *s = getenv("UVMWATCH_FAKE_SCENARIO");
    if (s == NULL || *s == '\0' || strcmp(s, "success") == 0)
        return SCENARIO_SUCCESS;
    if (strcmp(s, "register_gpu_no_memory") == 0)
        return SCENARIO_REGISTER_GPU_NO_MEMORY;
    if (strcmp(s, "hang_register_gpu") == 0)
        return SCENARIO_HANG_REGISTER_GPU;
    if (strcmp(s, "missing_node") == 0)
        return SCENARIO_MISSING_NODE;
    fprintf(stderr, "fake libcuda: unknown UVMWATCH_FAKE_SCENARIO '%s'\n", s);
    return SCENARIO_INVALID;
}

static int read_gpu_count(void)
{
    const char *s = getenv("UVMWATCH_FAKE_GPUS");
    if (s == NULL || *s == '\0')
        return 1;
    char *end = NULL;
    long n = strtol(s, &end, 10);
    if (end == s || *end != '\0' || n < 0)
        return 1;
    return n > MAX_GPUS ? MAX_GPUS : (int)n;
}

static uint64_t read_uvm_flags(void)
{
    const char *s = getenv("UVMWATCH_FAKE_UVM_FLAGS");
    if (s == NULL || *s == '\0')
        return 0;
    return strtoull(s, NULL, 0);
}

static void put_u32(unsigned char *p, size_t off, uint32_t v)
{
    memcpy(p + off, &v, sizeof v);
}

static void put_u64(unsigned char *p, size_t off, uint64_t v)
{
    memcpy(p + off, &v, sizeof v);
}

static uint32_t get_u32(const unsigned char *p, size_t off)
{
    uint32_t v;
    memcpy(&v, p + off, sizeof v);
    return v;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static void close_all(void)
{
    close_fd(&uvm_mm_fd);
    close_fd(&uvm_fd);
    for (int i = 0; i < gpu_fd_count; i++)
        close_fd(&gpu_fds[i]);
    gpu_fd_count = 0;
    close_fd(&ctl_fd);
}

/* Reads /proc/driver/nvidia/params like libcuda does; absence is not an error. */
static void read_driver_params(void)
{
    int fd = open("/proc/driver/nvidia/params", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
}

static int open_node_flags(const char *path, int flags)
{
    return open(path, flags);
}

static int open_node(const char *path)
{
    return open_node_flags(path, O_RDWR | O_CLOEXEC);
}

/* One ioctl; -1 means the system call itself failed (EINTR included: a
 * real caller interrupted inside the driver does not retry either). */
static int do_ioctl(int fd, unsigned long cmd, void *params)
{
    return ioctl(fd, cmd, params);
}

/* An RM ioctl with a zeroed parameter block of `size` bytes; `status_off` is
 * the offset of the NV_STATUS the driver writes, or -1 if it has none.
 * Returns CUDA_SUCCESS, or the error cuInit should return. */
static CUresult rm_ioctl(int fd, unsigned nr, size_t size, long status_off,
                         void (*fill)(unsigned char *))
{
    unsigned char *params = calloc(1, size);
    if (params == NULL)
        return CUDA_ERROR_UNKNOWN;
    if (fill != NULL)
        fill(params);
    CUresult result = CUDA_SUCCESS;
    if (do_ioctl(fd, NV_RM_IOWR(nr, size), params) < 0)
        result = CUDA_ERROR_UNKNOWN;
    else if (status_off >= 0 && get_u32(params, (size_t)status_off) != NV_OK)
        result = CUDA_ERROR_NOT_INITIALIZED;
    free(params);
    return result;
}

static void fill_sys_params(unsigned char *p)
{
    put_u64(p, 0, 128u << 20); /* memblock_size: 128 MiB */
}

/* A UVM ioctl: params of `size` bytes, rmStatus (u32) at `status_off`, which
 * is pre-set to `preset` (what the real driver would write back). */
static CUresult uvm_ioctl(int fd, unsigned long cmd, unsigned char *params,
                          size_t status_off, uint32_t preset)
{
    put_u32(params, status_off, preset);
    if (do_ioctl(fd, cmd, params) < 0)
        return CUDA_ERROR_UNKNOWN;
    if (get_u32(params, status_off) != NV_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

/* The two control-node passes NVIDIA's libcuda makes (535.261.03 and 550.163.01, strace
 * in `cargo xtask vm-test`'s nvidia series, testbed/replays/README.md): the first queries
 * the system and frees what it made, then closes the node; the second opens it again for
 * the client the rest of cuInit uses (RM_ALLOC in its 32-byte form, two controls, then the
 * 48-byte form). Returns CUDA_SUCCESS, or the error cuInit returns. */
static CUresult control_node_passes(void)
{
    CUresult r;
    for (int pass = 0; pass < 2; pass++) {
        read_driver_params();
        ctl_fd = open_node_flags("/dev/nvidiactl", O_RDWR);
        /* The real library returns 100 without the control node (535.261.03, EACCES). */
        if (ctl_fd < 0)
            return CUDA_ERROR_NO_DEVICE;
        if ((r = rm_ioctl(ctl_fd, NV_ESC_SYS_PARAMS, SYS_PARAMS_SIZE, -1, fill_sys_params)))
            return r;
        if ((r = rm_ioctl(ctl_fd, NV_ESC_CARD_INFO, CARD_INFO_SIZE, -1, NULL)))
            return r;
        if ((r = rm_ioctl(ctl_fd, NV_ESC_RM_ALLOC, RM_ALLOC32_SIZE, RM_ALLOC32_STATUS_OFF, NULL)))
            return r;
        if ((r = rm_ioctl(ctl_fd, NV_ESC_RM_CONTROL, RM_CONTROL_SIZE, RM_CONTROL_STATUS_OFF, NULL)))
            return r;
        if (pass == 0) {
            if ((r = rm_ioctl(ctl_fd, NV_ESC_RM_FREE, RM_FREE_SIZE, RM_FREE_STATUS_OFF, NULL)))
                return r;
            close(ctl_fd);
            ctl_fd = -1;
        }
    }
    if ((r = rm_ioctl(ctl_fd, NV_ESC_RM_CONTROL, RM_CONTROL_SIZE, RM_CONTROL_STATUS_OFF, NULL)))
        return r;
    return rm_ioctl(ctl_fd, NV_ESC_RM_ALLOC, RM_ALLOC_SIZE, RM_ALLOC_STATUS_OFF, NULL);
}

/* /dev/nvidia-uvm as the real library opens it: with O_CLOEXEC, again without it when that
 * fails, and on a second failure UVM_DEINITIALIZE on the negative "fd" it got, then two
 * RM_FREEs of its client (535.261.03 and 550.163.01 with the node at mode 000, refused by
 * the device cgroup, after rmmod, or missing). Returns the fd, or -1. */
static int open_uvm(void)
{
    int fd = open_node("/dev/nvidia-uvm");
    if (fd >= 0)
        return fd;
    fd = open_node_flags("/dev/nvidia-uvm", O_RDWR);
    if (fd >= 0)
        return fd;
    int negative = -errno;
    do_ioctl(negative, 0x30000002u /* UVM_DEINITIALIZE */, NULL);
    for (int i = 0; i < 2; i++)
        rm_ioctl(ctl_fd, NV_ESC_RM_FREE, RM_FREE_SIZE, RM_FREE_STATUS_OFF, NULL);
    return -1;
}

static CUresult run_init_sequence(void)
{
    enum scenario sc = read_scenario();
    if (sc == SCENARIO_INVALID)
        return CUDA_ERROR_UNKNOWN;
    int gpus = read_gpu_count();
    CUresult r;

    if ((r = control_node_passes()))
        return r;

    if (gpus == 0)
        return CUDA_ERROR_NO_DEVICE;

    /* UVM before any GPU node, as the real library does. */
    uvm_fd = open_uvm();
    if (uvm_fd < 0)
        return CUDA_ERROR_UNKNOWN;
    uvm_mm_fd = open_uvm();
    if (uvm_mm_fd < 0)
        return CUDA_ERROR_UNKNOWN;

    /* UVM_INITIALIZE_PARAMS: NvU64 flags @0, NV_STATUS rmStatus @8. */
    unsigned char init_params[16] = {0};
    put_u64(init_params, 0, read_uvm_flags());
    if ((r = uvm_ioctl(uvm_fd, UVM_INITIALIZE, init_params, 8, NV_OK)))
        return r;

    /* UVM_MM_INITIALIZE_PARAMS: NvS32 uvmFd @0, NV_STATUS rmStatus @4. */
    unsigned char mm_params[8] = {0};
    put_u32(mm_params, 0, (uint32_t)uvm_fd);
    if ((r = uvm_ioctl(uvm_mm_fd, UVM_MM_INITIALIZE, mm_params, 4, NV_OK)))
        return r;

    /* UVM_PAGEABLE_MEM_ACCESS_PARAMS: NvBool pageableMemAccess @0, rmStatus @4. */
    unsigned char pma_params[8] = {0};
    if ((r = uvm_ioctl(uvm_fd, UVM_PAGEABLE_MEM_ACCESS, pma_params, 4, NV_OK)))
        return r;

    for (int i = 0; i < gpus; i++) {
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%d", i);
        int fd = open_node(path);
        if (fd < 0)
            return CUDA_ERROR_UNKNOWN;
        gpu_fds[gpu_fd_count++] = fd;
    }

    /* UVM_REGISTER_GPU_PARAMS: NvProcessorUuid gpu_uuid @0 (16 bytes),
     * NvBool numaEnabled @16, NvS32 numaNodeId @20, NvS32 rmCtrlFd @24,
     * NvHandle hClient @28, NvHandle hSmcPartRef @32, NV_STATUS rmStatus @36. */
    uint32_t register_status =
        sc == SCENARIO_REGISTER_GPU_NO_MEMORY ? NV_ERR_NO_MEMORY : NV_OK;
    for (int i = 0; i < gpus; i++) {
        unsigned char reg_params[40] = {0};
        memcpy(reg_params, "GPU-fake-uvmw-00", 16);
        reg_params[15] = (unsigned char)('0' + i % 10);
        put_u32(reg_params, 20, (uint32_t)-1);
        put_u32(reg_params, 24, (uint32_t)ctl_fd);
        put_u32(reg_params, 28, 0xc1d00001u);
        if ((r = uvm_ioctl(uvm_fd, UVM_REGISTER_GPU, reg_params, 36, register_status)))
            return r;
    }

    /* UVM_CREATE_RANGE_GROUP_PARAMS: NvU64 rangeGroupId @0, rmStatus @8. */
    unsigned char rg_params[16] = {0};
    if ((r = uvm_ioctl(uvm_fd, UVM_CREATE_RANGE_GROUP, rg_params, 8, NV_OK)))
        return r;

    return CUDA_SUCCESS;
}

/* ---- Replay mode ------------------------------------------------------- */

#define UVM_DEINITIALIZE 0x30000002u
#define REPLAY_MAX_STEPS 8192
#define REPLAY_MAX_FDS 256
#define REPLAY_PATH_MAX 128

#ifndef SYS_openat2
#define SYS_openat2 437 /* x86_64, aarch64 and most others */
#endif

/* struct open_how from linux/openat2.h, which older headers lack. */
struct replay_open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};

enum replay_syscall { RS_OPEN, RS_OPENAT, RS_OPENAT2 };

struct replay_step {
    char kind;               /* 'O', 'C' or 'I' */
    enum replay_syscall sc;  /* O */
    int flags;               /* O */
    int fd;                  /* O: capture fd or -errno; C, I: capture fd */
    int recorded_ok;         /* O */
    int on_fail_uvm;         /* O */
    char path[REPLAY_PATH_MAX];
    unsigned long request;   /* I */
    unsigned long size;      /* I */
    long status_off;         /* I */
    uint32_t status;         /* I */
};

/* A capture descriptor and the real one it maps to (real < 0 for a failed
 * open's -errno). Kept in the order they were opened. */
struct replay_fd {
    int cap;
    int real;
    char path[REPLAY_PATH_MAX];
};

static struct replay_fd replay_fds[REPLAY_MAX_FDS];
static int replay_fd_count;
static int replay_trace = -1;

static const char *replay_sc_name(enum replay_syscall sc)
{
    return sc == RS_OPEN ? "open" : sc == RS_OPENAT ? "openat" : "openat2";
}

static int replay_parse_sc(const char *s, enum replay_syscall *sc)
{
    if (strcmp(s, "open") == 0)
        *sc = RS_OPEN;
    else if (strcmp(s, "openat") == 0)
        *sc = RS_OPENAT;
    else if (strcmp(s, "openat2") == 0)
        *sc = RS_OPENAT2;
    else
        return -1;
    return 0;
}

/* Reads the step file; returns the number of steps or -1. */
static int replay_load(const char *file, struct replay_step *steps, int max)
{
    FILE *f = fopen(file, "re");
    if (f == NULL) {
        fprintf(stderr, "fake libcuda: replay: cannot open %s: %s\n", file, strerror(errno));
        return -1;
    }
    char line[512];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (lineno == 1) {
            if (strncmp(line, "uvmwatch-replay 1", 17) != 0)
                goto bad;
            continue;
        }
        if (n >= max) {
            fprintf(stderr, "fake libcuda: replay: more than %d steps\n", max);
            goto fail;
        }
        struct replay_step *st = &steps[n];
        memset(st, 0, sizeof *st);
        char sc[16], onfail[8];
        switch (line[0]) {
        case 'O':
            if (sscanf(line, "O %15s %i %i %i %7s %127s", sc, &st->flags, &st->fd,
                       &st->recorded_ok, onfail, st->path) != 6
                || replay_parse_sc(sc, &st->sc) != 0)
                goto bad;
            st->on_fail_uvm = strcmp(onfail, "uvm") == 0;
            break;
        case 'C':
            if (sscanf(line, "C %i", &st->fd) != 1)
                goto bad;
            break;
        case 'I': {
            unsigned long status = 0;
            if (sscanf(line, "I %i %li %lu %li %li", &st->fd, (long *)&st->request, &st->size,
                       &st->status_off, (long *)&status) != 5)
                goto bad;
            st->status = (uint32_t)status;
            break;
        }
        default:
            goto bad;
        }
        st->kind = line[0];
        n++;
    }
    fclose(f);
    return n;
bad:
    fprintf(stderr, "fake libcuda: replay: %s:%d: bad step line\n", file, lineno);
fail:
    fclose(f);
    return -1;
}

static int replay_open_real(enum replay_syscall sc, const char *path, int flags)
{
    switch (sc) {
    case RS_OPEN:
#ifdef SYS_open
        return (int)syscall(SYS_open, path, flags, 0);
#else
        errno = ENOSYS;
        return -1;
#endif
    case RS_OPENAT:
        return openat(AT_FDCWD, path, flags);
    case RS_OPENAT2: {
        struct replay_open_how how = {.flags = (uint64_t)(unsigned)flags};
        return (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    }
    }
    errno = EINVAL;
    return -1;
}

/* Opens as recorded and writes the trace line; returns fd or -errno. */
static int replay_open(enum replay_syscall sc, const char *path, int flags)
{
    int fd = replay_open_real(sc, path, flags);
    int ret = fd >= 0 ? fd : -errno;
    if (replay_trace >= 0)
        dprintf(replay_trace, "open %s %d %s %d\n", replay_sc_name(sc), flags, path, ret);
    return ret;
}

static void replay_map(int cap, int real, const char *path)
{
    if (replay_fd_count >= REPLAY_MAX_FDS)
        return;
    struct replay_fd *m = &replay_fds[replay_fd_count++];
    m->cap = cap;
    m->real = real;
    snprintf(m->path, sizeof m->path, "%s", path);
}

static struct replay_fd *replay_lookup(int cap)
{
    for (int i = 0; i < replay_fd_count; i++)
        if (replay_fds[i].cap == cap)
            return &replay_fds[i];
    return NULL;
}

static void replay_close_real(int fd)
{
    int rc = close(fd);
    if (replay_trace >= 0)
        dprintf(replay_trace, "close %d %d\n", fd, rc == 0 ? 0 : -errno);
}

/* Closes one mapping (capture fd), keeping the others in order. */
static void replay_unmap(int cap)
{
    for (int i = 0; i < replay_fd_count; i++) {
        if (replay_fds[i].cap != cap)
            continue;
        if (replay_fds[i].real >= 0)
            replay_close_real(replay_fds[i].real);
        memmove(&replay_fds[i], &replay_fds[i + 1],
                (size_t)(replay_fd_count - i - 1) * sizeof replay_fds[0]);
        replay_fd_count--;
        return;
    }
}

/* Closes every real descriptor still mapped, in the order they were opened. */
static void replay_close_all(void)
{
    for (int i = 0; i < replay_fd_count; i++)
        if (replay_fds[i].real >= 0)
            replay_close_real(replay_fds[i].real);
    replay_fd_count = 0;
}

/* One ioctl as recorded. Returns 0 (rc 0), or -errno; *status gets the status
 * read back when the call succeeded and has a status offset. */
static int replay_ioctl(int fd, unsigned long request, unsigned long size, long status_off,
                        uint32_t planted, int *have_status, uint32_t *status)
{
    unsigned char *params = NULL;
    if (size > 0) {
        params = malloc(size);
        if (params == NULL)
            return -ENOMEM;
        memset(params, 0xEE, size);
        if (status_off >= 0)
            put_u32(params, (size_t)status_off, planted);
    }
    int rc = ioctl(fd, request, params);
    int ret = rc < 0 ? -errno : 0;
    *have_status = 0;
    if (ret == 0 && status_off >= 0 && params != NULL) {
        *status = get_u32(params, (size_t)status_off);
        *have_status = 1;
    }
    if (replay_trace >= 0) {
        if (*have_status)
            dprintf(replay_trace, "ioctl %d 0x%lx %lu %d %ld 0x%x\n", fd, request, size, ret,
                    status_off, *status);
        else
            dprintf(replay_trace, "ioctl %d 0x%lx %lu %d %ld -\n", fd, request, size, ret,
                    status_off);
    }
    free(params);
    return ret;
}

static CUresult replay_fail(CUresult r)
{
    replay_close_all();
    return r;
}

static CUresult run_replay_steps(struct replay_step *steps, int n)
{
    int failed_open = 0;
    for (int i = 0; i < n; i++) {
        struct replay_step *st = &steps[i];
        if (st->kind == 'O') {
            int ret = replay_open(st->sc, st->path, st->flags);
            if (st->recorded_ok && ret >= 0) {
                replay_map(st->fd, ret, st->path);
            } else if (!st->recorded_ok && ret < 0) {
                /* Failed as recorded: its -errno stands for the real one. */
                replay_map(st->fd, ret, st->path);
                failed_open = 1;
            } else if (!st->recorded_ok) {
                fprintf(stderr, "fake libcuda: replay diverged at step %d: %s opened, the capture failed\n",
                        i + 1, st->path);
                replay_close_real(ret);
                return replay_fail(CUDA_ERROR_UNKNOWN);
            } else {
                /* Recorded success, real failure: what failing captures show. */
                if (st->on_fail_uvm) {
                    if (st->flags & O_CLOEXEC) {
                        int again = replay_open(st->sc, st->path, st->flags & ~O_CLOEXEC);
                        if (again >= 0) {
                            replay_map(st->fd, again, st->path);
                            continue;
                        }
                        ret = again;
                    }
                    int have = 0;
                    uint32_t status = 0;
                    replay_ioctl(ret, UVM_DEINITIALIZE, 0, -1, NV_OK, &have, &status);
                }
                return replay_fail(CUDA_ERROR_UNKNOWN);
            }
        } else if (st->kind == 'C') {
            replay_unmap(st->fd);
        } else {
            int fd = st->fd;
            struct replay_fd *m = replay_lookup(st->fd);
            if (m != NULL) {
                fd = m->real;
            } else if (st->fd >= 0) {
                fprintf(stderr, "fake libcuda: replay diverged at step %d: fd %d is not open\n",
                        i + 1, st->fd);
                return replay_fail(CUDA_ERROR_UNKNOWN);
            }
            int have = 0;
            uint32_t status = 0;
            int ret = replay_ioctl(fd, st->request, st->size, st->status_off, st->status, &have,
                                   &status);
            if (ret < 0 && fd >= 0)
                return replay_fail(CUDA_ERROR_UNKNOWN);
            if (have && status != NV_OK)
                return replay_fail(CUDA_ERROR_NOT_INITIALIZED);
        }
    }
    if (failed_open)
        return replay_fail(CUDA_ERROR_UNKNOWN);
    return CUDA_SUCCESS;
}

static CUresult run_replay(const char *file)
{
    struct replay_step *steps = calloc(REPLAY_MAX_STEPS, sizeof *steps);
    if (steps == NULL)
        return CUDA_ERROR_UNKNOWN;
    int n = replay_load(file, steps, REPLAY_MAX_STEPS);
    if (n < 0) {
        free(steps);
        return CUDA_ERROR_UNKNOWN;
    }
    const char *trace = getenv("UVMWATCH_FAKE_REPLAY_TRACE");
    if (trace != NULL && *trace != '\0')
        replay_trace = open(trace, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CUresult r = run_replay_steps(steps, n);
    free(steps);
    if (replay_trace >= 0) {
        dprintf(replay_trace, "result %d\n", r);
        close(replay_trace);
        replay_trace = -1;
    }
    return r;
}

/* Initializes the fake driver. flags must be 0, as for the real cuInit. */
CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;

    pthread_mutex_lock(&init_lock);
    CUresult result;
    if (init_done && init_pid != getpid()) {
        /* Forked after init without exec: CUDA state is not usable here. */
        result = CUDA_ERROR_NOT_INITIALIZED;
    } else if (init_done) {
        result = init_result;
    } else if (getenv("UVMWATCH_FAKE_REPLAY") != NULL && *getenv("UVMWATCH_FAKE_REPLAY") != '\0') {
        result = run_replay(getenv("UVMWATCH_FAKE_REPLAY"));
        init_done = 1;
        init_pid = getpid();
        init_result = result;
    } else {
        result = run_init_sequence();
        if (result != CUDA_SUCCESS)
            close_all();
        init_done = 1;
        init_pid = getpid();
        init_result = result;
    }
    pthread_mutex_unlock(&init_lock);
    return result;
}

/* Reports the CUDA version the fake driver claims to support (12.9). */
CUresult cuDriverGetVersion(int *driver_version)
{
    if (driver_version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driver_version = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---- devices and contexts ------------------------------------------------ */

typedef int CUdevice;
typedef struct fake_ctx *CUcontext;

/* A context: the GPU node it keeps open, as a real one keeps its channels. */
struct fake_ctx {
    int fd;
    CUdevice dev;
};

static int env_number(const char *name, int fallback)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return fallback;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > MAX_GPUS)
        return fallback;
    return (int)n;
}

/* CUDA_SUCCESS when cuInit succeeded in this process. */
static CUresult initialized(void)
{
    pthread_mutex_lock(&init_lock);
    int ok = init_done && init_pid == getpid() && init_result == CUDA_SUCCESS;
    pthread_mutex_unlock(&init_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* The devices CUDA enumerates: UVMWATCH_FAKE_CUDA_DEVICES when set; else the GPUs, or
 * under CUDA_VISIBLE_DEVICES its entries up to the first that names no GPU (CUDA's rule
 * for indexes; UUIDs are not modelled). */
static int cuda_devices(void)
{
    int forced = env_number("UVMWATCH_FAKE_CUDA_DEVICES", -1);
    if (forced >= 0)
        return forced;
    int gpus = env_number("UVMWATCH_FAKE_GPUS", 1);
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL)
        return gpus;
    int n = 0;
    while (*v != '\0') {
        char *end = NULL;
        long i = strtol(v, &end, 10);
        if (end == v || (*end != ',' && *end != '\0') || i < 0 || i >= gpus)
            break;
        n++;
        v = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* Reports the devices CUDA may use: UVMWATCH_FAKE_CUDA_DEVICES. */
CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = initialized();
    if (r != CUDA_SUCCESS)
        return r;
    *count = cuda_devices();
    return CUDA_SUCCESS;
}

/* The context creations' common part. */
static CUresult create_context(CUcontext *pctx, CUdevice dev)
{
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = initialized();
    if (r != CUDA_SUCCESS)
        return r;
    if (dev < 0 || dev >= cuda_devices())
        return CUDA_ERROR_INVALID_DEVICE;
    const char *mode = getenv("UVMWATCH_FAKE_COMPUTE_MODE");
    if (mode != NULL && strcmp(mode, "exclusive_process_held") == 0)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    char path[32];
    snprintf(path, sizeof path, "/dev/nvidia%d", dev);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_UNKNOWN;
    struct fake_ctx *c = malloc(sizeof *c);
    if (c == NULL) {
        close(fd);
        return CUDA_ERROR_UNKNOWN;
    }
    c->fd = fd;
    c->dev = dev;
    *pctx = c;
    return CUDA_SUCCESS;
}

/* cuda.h before CUDA 3.2 (still exported for old binaries). */
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return create_context(pctx, dev);
}

/* What cuda.h of CUDA 3.2 to 12 maps cuCtxCreate to. */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return create_context(pctx, dev);
}

/* CUDA 11.4+: with execution affinity parameters (not looked at here). */
CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int num_params, unsigned int flags,
                        CUdevice dev)
{
    (void)params;
    (void)num_params;
    (void)flags;
    return create_context(pctx, dev);
}

/* CUDA 12.5+ (what cuda.h of CUDA 13 maps cuCtxCreate to). */
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctx_create_params, unsigned int flags,
                        CUdevice dev)
{
    (void)ctx_create_params;
    (void)flags;
    return create_context(pctx, dev);
}

/* The primary context, one per device and process, as the CUDA runtime uses it. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static CUcontext primary[MAX_GPUS];
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult r = CUDA_SUCCESS;
    if (dev >= 0 && dev < MAX_GPUS && primary[dev] != NULL)
        *pctx = primary[dev];
    else if ((r = create_context(pctx, dev)) == CUDA_SUCCESS)
        primary[dev] = *pctx;
    pthread_mutex_unlock(&lock);
    return r;
}

/*
 * cuda_workload.c - a minimal CUDA "application" for uvmwatch tests.
 *
 * usage: cuda-workload [--lib PATH] [--wait-ms N] [--flags N] [--fork-child] [--repeat N]
 *                      [--flood-ms N [--flood-ok]] [--ctx CALL [--device N]] [--hold-ms N]
 *                      [--leader-exits] [--cold-open] [--distinct-cmds N] [--dup-fds N]
 *                      [--time-init]
 *
 * Loads libcuda (PATH, or "libcuda.so.1" through the dynamic linker's search)
 * with dlopen(RTLD_NOW), waits --wait-ms milliseconds (default 0: a CUDA program
 * calls cuInit right after loading the library; a test that needs a process held
 * between the two says so), then calls cuInit(--flags) --repeat times (default 1)
 * and prints one line per call:
 *
 *     cuInit=<rc> pid=<pid>
 *
 * With --time-init each cuInit call is also timed (CLOCK_MONOTONIC around the call) and
 * followed by
 *
 *     init_ns=<ns> pid=<pid>
 *
 * With --fork-child the process then forks (no exec); the child calls cuInit
 * once and prints its own line, and the parent waits for it.
 *
 * With --flood-ms N the process then floods the agent for N milliseconds: it opens
 * /dev/nvidia-uvm and issues, as fast as it can, an ioctl the kernel's VFS refuses
 * before any driver sees it (FICLONE from fd -1: EBADF), every one a failed driver
 * call on a tracked fd, and prints
 *
 *     flood=<calls> per_second=<rate> pid=<pid>
 *
 * With --flood-ok the flood issues FIONREAD instead, which the VFS answers itself for a
 * regular file (the fake nodes are FUSE regular files): every one a successful call on a
 * tracked fd that no driver (and no FUSE server) sees, so its time is the syscall's and the
 * tracing's only.
 *
 * With --ctx CALL the process then asks for the device count and creates a
 * context on --device N (default 0) with CALL (cuCtxCreate, cuCtxCreate_v2,
 * cuCtxCreate_v3, cuCtxCreate_v4 or cuDevicePrimaryCtxRetain; cuDeviceGetCount
 * asks for the count only), printing
 *
 *     cuDeviceGetCount=<rc> count=<n> pid=<pid>
 *     <CALL>=<rc> pid=<pid>
 *
 * With --hold-ms N the process stays N milliseconds more before it exits (as an
 * application goes on after its start-up), so a tracer can still read its /proc.
 *
 * The kernel side's losses, each provoked after the cuInit calls:
 * --cold-open opens /dev/nvidia-uvm through a path in a file mapping never touched
 * before (its page not mapped: a tracepoint program cannot read it at the open's entry)
 * and issues one FICLONE on the fd (EBADF at the VFS); prints
 *     cold_open fd=<fd> ioctl_errno=<errno>
 * --distinct-cmds N issues N distinct request numbers no driver defines (_IOC_NR 0xfe,
 * sizes 0..N-1, type 'x') on a /dev/nvidia-uvm fd; prints distinct_cmds=<N>.
 * --dup-fds N dups one /dev/nvidia-uvm fd up to N times (RLIMIT_NOFILE raised to its hard
 * limit), keeps them until exit, and issues one FICLONE on the last copy (EBADF at the
 * VFS); prints
 *     dup_fds=<done>
 *     dup_ioctl fd=<fd> errno=<errno>
 *
 * With --leader-exits all of the above runs in a second thread and the main thread
 * exits at once (pthread_exit): the process lives on with a zombie leader, whose
 * /proc/<pid>/exe and cmdline are gone, as a launcher's worker thread would.
 *
 * Exit status: 0 if the parent's last cuInit returned 0, 1 if it did not,
 * 2 on a usage, dlopen or dlsym error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_ctx_fn)(void **, unsigned int, int);
typedef int (*cu_ctx_v3_fn)(void **, void *, int, unsigned int, int);
typedef int (*cu_ctx_v4_fn)(void **, void *, unsigned int, int);
typedef int (*cu_primary_fn)(void **, int);

static void usage(void)
{
    fprintf(stderr, "usage: cuda-workload [--lib PATH] [--wait-ms N] [--flags N] "
                    "[--fork-child] [--repeat N] [--flood-ms N [--flood-ok]] [--ctx CALL [--device N]] "
                    "[--hold-ms N] [--leader-exits] [--cold-open] [--distinct-cmds N] [--dup-fds N] "
                    "[--time-init]\n");
    exit(2);
}

static unsigned long parse_number(const char *opt, const char *value)
{
    if (value == NULL)
        usage();
    char *end = NULL;
    errno = 0;
    unsigned long n = strtoul(value, &end, 0);
    if (errno != 0 || end == value || *end != '\0') {
        fprintf(stderr, "cuda-workload: bad number for %s: '%s'\n", opt, value);
        exit(2);
    }
    return n;
}

static void sleep_ms(unsigned long ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Failed ioctls (FICLONE: EBADF), or with `ok` successful ones (FIONREAD), on
 * /dev/nvidia-uvm for `ms` milliseconds; returns 0, or 2 when the node cannot be opened. */
static int flood(unsigned long ms, int ok)
{
    int fd = open("/dev/nvidia-uvm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("cuda-workload: open /dev/nvidia-uvm");
        return 2;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long long calls = 0;
    double elapsed = 0;
    int unread = 0;
    do {
        if (ok)
            for (int i = 0; i < 1024; i++)
                (void)ioctl(fd, FIONREAD, &unread);
        else
            for (int i = 0; i < 1024; i++)
                (void)ioctl(fd, FICLONE, -1);
        calls += 1024;
        clock_gettime(CLOCK_MONOTONIC, &t);
        elapsed = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
    } while (elapsed * 1000.0 < (double)ms);
    printf("flood=%llu per_second=%.0f pid=%d\n", calls, (double)calls / elapsed, (int)getpid());
    fflush(stdout);
    close(fd);
    return 0;
}

static void *symbol(void *handle, const char *name)
{
    void *f = dlsym(handle, name);
    if (f == NULL) {
        fprintf(stderr, "cuda-workload: dlsym(%s): %s\n", name, dlerror());
        exit(2);
    }
    return f;
}

/* cuDeviceGetCount, then the context creation `call` on `dev`; returns 0, or 2 for an
 * unknown call. */
static int contexts(void *handle, const char *call, int dev)
{
    int count = -1;
    int rc = ((cu_count_fn)symbol(handle, "cuDeviceGetCount"))(&count);
    printf("cuDeviceGetCount=%d count=%d pid=%d\n", rc, count, (int)getpid());
    fflush(stdout);
    if (strcmp(call, "cuDeviceGetCount") == 0)
        return 0;
    void *ctx = NULL;
    if (strcmp(call, "cuCtxCreate") == 0 || strcmp(call, "cuCtxCreate_v2") == 0)
        rc = ((cu_ctx_fn)symbol(handle, call))(&ctx, 0, dev);
    else if (strcmp(call, "cuCtxCreate_v3") == 0)
        rc = ((cu_ctx_v3_fn)symbol(handle, call))(&ctx, NULL, 0, 0, dev);
    else if (strcmp(call, "cuCtxCreate_v4") == 0)
        rc = ((cu_ctx_v4_fn)symbol(handle, call))(&ctx, NULL, 0, dev);
    else if (strcmp(call, "cuDevicePrimaryCtxRetain") == 0)
        rc = ((cu_primary_fn)symbol(handle, call))(&ctx, dev);
    else {
        fprintf(stderr, "cuda-workload: unknown --ctx call '%s'\n", call);
        return 2;
    }
    printf("%s=%d pid=%d\n", call, rc, (int)getpid());
    fflush(stdout);
    return 0;
}

static int cold_open(void)
{
    char tmpl[] = "/tmp/cuda-workload-path-XXXXXX";
    int t = mkstemp(tmpl);
    if (t < 0) {
        perror("cuda-workload: mkstemp");
        return 2;
    }
    static const char node[] = "/dev/nvidia-uvm";
    if (write(t, node, sizeof node) != (ssize_t)sizeof node) {
        perror("cuda-workload: write");
        return 2;
    }
    /* Out of the page cache's mappings too: the first touch must fault. */
    fsync(t);
    posix_fadvise(t, 0, 0, POSIX_FADV_DONTNEED);
    const char *path = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, t, 0);
    unlink(tmpl);
    close(t);
    if (path == MAP_FAILED) {
        perror("cuda-workload: mmap");
        return 2;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("cuda-workload: open (cold path)");
        return 2;
    }
    int rc = ioctl(fd, FICLONE, -1);
    printf("cold_open fd=%d ioctl_errno=%d\n", fd, rc < 0 ? errno : 0);
    fflush(stdout);
    close(fd);
    munmap((void *)path, 4096);
    return 0;
}

static int distinct_cmds(unsigned long n)
{
    int fd = open("/dev/nvidia-uvm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("cuda-workload: open /dev/nvidia-uvm");
        return 2;
    }
    char buf[1];
    for (unsigned long i = 0; i < n; i++)
        (void)ioctl(fd, _IOC(_IOC_NONE, 'x', 0xfe, i & _IOC_SIZEMASK), buf);
    printf("distinct_cmds=%lu\n", n);
    fflush(stdout);
    close(fd);
    return 0;
}

static int dup_fds(unsigned long n)
{
    /* Up to the hard limit (raising it needs CAP_SYS_RESOURCE). */
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
        r.rlim_cur = r.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &r);
    }
    int fd = open("/dev/nvidia-uvm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("cuda-workload: open /dev/nvidia-uvm");
        return 2;
    }
    unsigned long done = 0;
    int last = fd;
    while (done < n) {
        int d = dup(fd);
        if (d < 0)
            break;
        last = d;
        done++;
    }
    printf("dup_fds=%lu\n", done);
    int rc = ioctl(last, FICLONE, -1);
    printf("dup_ioctl fd=%d errno=%d\n", last, rc < 0 ? errno : 0);
    fflush(stdout);
    return 0;
}

static int time_init;

static int call_and_report(cu_init_fn cu_init, unsigned int flags)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cu_init(flags);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("cuInit=%d pid=%d\n", rc, (int)getpid());
    if (time_init)
        printf("init_ns=%lld pid=%d\n",
               (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec),
               (int)getpid());
    fflush(stdout);
    return rc;
}

static struct {
    const char *lib;
    const char *ctx_call;
    unsigned long wait_ms, flags, repeat, flood_ms, distinct_cmds, dup_fds, device, hold_ms;
    int fork_child, cold_open, flood_ok;
} opt = {.lib = "libcuda.so.1", .wait_ms = 0, .repeat = 1};

/* Everything after the arguments; returns the exit status. */
static int run(void)
{
    const char *lib = opt.lib;
    unsigned long wait_ms = opt.wait_ms, flags = opt.flags, repeat = opt.repeat;
    unsigned long flood_ms = opt.flood_ms;
    int fork_child = opt.fork_child;

    void *handle = dlopen(lib, RTLD_NOW);
    if (handle == NULL) {
        fprintf(stderr, "cuda-workload: dlopen(%s): %s\n", lib, dlerror());
        return 2;
    }
    cu_init_fn cu_init = (cu_init_fn)dlsym(handle, "cuInit");
    if (cu_init == NULL) {
        fprintf(stderr, "cuda-workload: dlsym(cuInit): %s\n", dlerror());
        return 2;
    }

    sleep_ms(wait_ms);

    int rc = 0;
    for (unsigned long n = 0; n < repeat; n++)
        rc = call_and_report(cu_init, (unsigned int)flags);

    if (fork_child) {
        fflush(stdout);
        pid_t child = fork();
        if (child < 0) {
            perror("cuda-workload: fork");
            return 2;
        }
        if (child == 0) {
            int child_rc = call_and_report(cu_init, (unsigned int)flags);
            _exit(child_rc == 0 ? 0 : 1);
        }
        int status = 0;
        while (waitpid(child, &status, 0) < 0 && errno == EINTR)
            ;
    }

    if (opt.ctx_call != NULL && contexts(handle, opt.ctx_call, (int)opt.device) != 0)
        return 2;

    if (flood_ms > 0 && flood(flood_ms, opt.flood_ok) != 0)
        return 2;
    if (opt.cold_open && cold_open() != 0)
        return 2;
    if (opt.distinct_cmds > 0 && distinct_cmds(opt.distinct_cmds) != 0)
        return 2;
    if (opt.dup_fds > 0 && dup_fds(opt.dup_fds) != 0)
        return 2;

    sleep_ms(opt.hold_ms);

    return rc == 0 ? 0 : 1;
}

static void *run_thread(void *unused)
{
    (void)unused;
    exit(run());
}

int main(int argc, char **argv)
{
    int leader_exits = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--lib") == 0) {
            if (++i >= argc)
                usage();
            opt.lib = argv[i];
        } else if (strcmp(a, "--wait-ms") == 0) {
            opt.wait_ms = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--flags") == 0) {
            opt.flags = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--repeat") == 0) {
            opt.repeat = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--fork-child") == 0) {
            opt.fork_child = 1;
        } else if (strcmp(a, "--flood-ms") == 0) {
            opt.flood_ms = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--flood-ok") == 0) {
            opt.flood_ok = 1;
        } else if (strcmp(a, "--time-init") == 0) {
            time_init = 1;
        } else if (strcmp(a, "--ctx") == 0) {
            if (++i >= argc)
                usage();
            opt.ctx_call = argv[i];
        } else if (strcmp(a, "--hold-ms") == 0) {
            opt.hold_ms = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--device") == 0) {
            opt.device = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--cold-open") == 0) {
            opt.cold_open = 1;
        } else if (strcmp(a, "--distinct-cmds") == 0) {
            opt.distinct_cmds = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--dup-fds") == 0) {
            opt.dup_fds = parse_number(a, i + 1 < argc ? argv[++i] : NULL);
        } else if (strcmp(a, "--leader-exits") == 0) {
            leader_exits = 1;
        } else {
            usage();
        }
    }
    if (!leader_exits)
        return run();
    pthread_t t;
    if (pthread_create(&t, NULL, run_thread, NULL) != 0) {
        fprintf(stderr, "cuda-workload: pthread_create failed\n");
        return 2;
    }
    pthread_exit(NULL);
}

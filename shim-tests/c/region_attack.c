/* region_attack: what a process of a container can do to the usage file every process of it must be able to
 * write (issue #11 class 7). One subcommand per attack; prints key=value lines for the test that runs it.
 *
 *   region_attack truncate SIZE PATH     ftruncate PATH to SIZE bytes (the other processes mapping it fault)
 *   region_attack garbage PATH           overwrite its 64-byte header with 0xa5 bytes
 *   region_attack zero PATH              overwrite the whole file with zeros (erases every charge)
 *   region_attack fill SECONDS PATH      for SECONDS, every 0.5 ms, store 0 ("never used": a full bucket) into the
 *                                        SM-time bucket word of every device entry: a bucket that never empties
 *   region_attack flap SECONDS PATH      for SECONDS, truncate PATH to 0 and extend it back to its size, flat out:
 *                                        whoever maps it in between (the node agent reading it) faults
 *   region_attack own_handler PATH MIB   a program with its own SIGBUS handler (installed before its first CUDA
 *                                        call): allocates MIB, truncates PATH to 0 itself, allocates MIB again
 *                                        (second=<CUresult>), then faults on a truncated mapping of its own, which
 *                                        its handler must still get (own_handler=1)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuquota.h"

static int open_or_die(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    return fd;
}

static int attack_truncate(const char *path, long long size) {
    int fd = open_or_die(path);
    int r = ftruncate(fd, (off_t)size);
    printf("truncate=%d\ndone=1\n", r);
    return r != 0;
}

static int attack_write(const char *path, int byte, size_t len) {
    int fd = open_or_die(path);
    if (len == 0) len = (size_t)lseek(fd, 0, SEEK_END);
    char *buf = malloc(len);
    memset(buf, byte, len);
    ssize_t n = pwrite(fd, buf, len, 0);
    printf("written=%zd\ndone=1\n", n);
    return n != (ssize_t)len;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int attack_fill(const char *path, double seconds) {
    int fd = open_or_die(path);
    struct cuquota_usage_file *f = mmap(NULL, sizeof *f, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    printf("ready=1\n");
    unsigned long long fills = 0;
    struct timespec pause = {0, 500000};
    for (double end = now_s() + seconds; now_s() < end; fills++) {
        for (int d = 0; d < CUQUOTA_MAX_DEVICES; d++) __atomic_store_n(&f->devices[d].throttle[0], 0, __ATOMIC_SEQ_CST);
        nanosleep(&pause, NULL);
    }
    printf("fills=%llu\ndone=1\n", fills);
    return 0;
}

static int attack_flap(const char *path, double seconds) {
    int fd = open_or_die(path);
    off_t size = lseek(fd, 0, SEEK_END);
    printf("ready=1\n");
    unsigned long long flaps = 0;
    for (double end = now_s() + seconds; now_s() < end; flaps++) {
        if (ftruncate(fd, 0) || ftruncate(fd, size)) return 2;
    }
    printf("flaps=%llu\ndone=1\n", flaps);
    return 0;
}

static sigjmp_buf g_jmp;
static volatile sig_atomic_t g_own;
static char *g_own_map;
static void on_bus(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    if ((char *)si->si_addr >= g_own_map && (char *)si->si_addr < g_own_map + 4096) {
        g_own = 1;
        siglongjmp(g_jmp, 1);
    }
    _exit(3); /* a SIGBUS that is neither ours nor cuquota's */
}

static int own_handler(const char *path, unsigned long long mib) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, NULL);

    CUcontext ctx;
    CUdevice dev;
    CUdeviceptr p1 = 0, p2 = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        printf("error=init\n");
        return 1;
    }
    printf("first=%d\n", (int)cuMemAlloc(&p1, mib << 20));
    fflush(stdout);
    attack_truncate(path, 0);
    printf("second=%d\n", (int)cuMemAlloc(&p2, mib << 20));
    fflush(stdout);

    char tmpl[] = "/tmp/region_attack_XXXXXX";
    int fd = mkstemp(tmpl);
    unlink(tmpl);
    if (fd < 0 || ftruncate(fd, 4096)) return 2;
    g_own_map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g_own_map == MAP_FAILED) return 2;
    if (ftruncate(fd, 0)) return 2;
    if (sigsetjmp(g_jmp, 1) == 0) {
        volatile char c = g_own_map[0];
        (void)c;
    }
    printf("own_handler=%d\n", (int)g_own);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "truncate") == 0) return attack_truncate(argv[3], atoll(argv[2]));
    if (argc == 3 && strcmp(argv[1], "garbage") == 0) return attack_write(argv[2], 0xa5, 64);
    if (argc == 3 && strcmp(argv[1], "zero") == 0) return attack_write(argv[2], 0, 0);
    if (argc == 4 && strcmp(argv[1], "flap") == 0) return attack_flap(argv[3], atof(argv[2]));
    if (argc == 4 && strcmp(argv[1], "fill") == 0) return attack_fill(argv[3], atof(argv[2]));
    if (argc == 4 && strcmp(argv[1], "own_handler") == 0) return own_handler(argv[2], strtoull(argv[3], NULL, 10));
    fprintf(stderr, "usage: region_attack truncate SIZE PATH | garbage PATH | zero PATH | fill SECONDS PATH | flap SECONDS PATH | own_handler PATH MIB\n");
    return 2;
}

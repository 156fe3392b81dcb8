/* refresh_race: a device learned (Devices::learn) while another thread refreshes the limits keeps the limits
 * of before the change. `learn` computes the device's policy, then logs (CUQUOTA_LOG=info: a write(2) to fd 2),
 * then publishes the table slot; a refresh that runs in between skips the slot (not set yet) and stores the
 * file's seq as seen, so nothing re-reads it: the device runs under the old (looser) limits until the next change.
 * The window is widened here by a full pipe on stderr (the program's own fd, its own choice); CQ_NO_STALL=1:
 * the same steps without it (control).
 *
 *   refresh_race GOFILE BYTES        (memory: allocate BYTES at the end)
 *   refresh_race GOFILE sm SECS      (SM time: launch 1 ms kernels back to back for SECS at the end;
 *                                         pid=, t0_ns=, end_ns= for the simulator's timeline)
 *
 * Fills a pipe, puts it on fd 2, starts a thread that makes the cuInit (which learns device 0 and stalls on
 * its log line), prints stalled=1, waits until GOFILE exists (the agent tightened the cap meanwhile), asks NVML
 * for the memory info in another thread (a refresh; it may stall on a log line too once the device is known),
 * drains the pipe once that call returned or after 2 s, then allocates BYTES on
 * device 0: alloc=<result>, used=<the simulator's own used bytes>.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nvml.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cq_driver.h"

#define PROG "refresh_race"
#include "cq_fill.h"

static volatile int t1_done;
static CUresult t1_rc;
static CUcontext ctx;

static void *first_alloc(void *arg) {
    (void)arg;
    CUdevice d;
    cuInit(0); /* learns every device: stalls on device 0's log line, its policy already computed */
    cuDeviceGet(&d, 0);
    cuDevicePrimaryCtxRetain(&ctx, d);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p;
    t1_rc = cuMemAlloc(&p, 1 << 20);
    __atomic_store_n(&t1_done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static nvmlDevice_t nd;
static volatile int nv_done;
static nvmlReturn_t nv_rc;
static nvmlMemory_t nv_mem;

/* The NVML call that refreshes; it may itself stall on a log line (a device known by then): main drains after
 * it returned, or after 2 s. */
static void *nvml_info(void *arg) {
    (void)arg;
    nv_rc = nvmlDeviceGetMemoryInfo(nd, &nv_mem);
    __atomic_store_n(&nv_done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void drain(int rfd, int to) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(rfd, buf, sizeof buf);
        if (n <= 0) return;
        /* only the shim's lines, not the filler */
        for (ssize_t i = 0; i < n;) {
            char *nl = memchr(buf + i, '\n', n - i);
            ssize_t end = nl ? nl - buf + 1 : n;
            if (buf[i] != 'x') (void)!write(to, buf + i, end - i);
            i = end;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int sm = strcmp(argv[2], "sm") == 0;
    unsigned long long bytes = sm ? 0 : cq_size(argv[2]);
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &nd) != NVML_SUCCESS) return 3;
    int saved = dup(2);
    int p[2];
    if (pipe(p)) return 4;
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    char line[64];
    memset(line, 'x', sizeof line);
    line[63] = '\n';
    while (write(p[1], line, sizeof line) > 0) {
    }
    fcntl(p[1], F_SETFL, 0);
    if (!getenv("CQ_NO_STALL")) dup2(p[1], 2); /* control: the same steps, no stall */
    pthread_t t;
    pthread_create(&t, NULL, first_alloc, NULL);
    usleep(500000);
    printf("stalled=%d\n", !__atomic_load_n(&t1_done, __ATOMIC_SEQ_CST));
    fflush(stdout);
    while (access(argv[1], F_OK) != 0) usleep(10000);
    pthread_t tn;
    pthread_create(&tn, NULL, nvml_info, NULL);
    for (int i = 0; i < 200 && !__atomic_load_n(&nv_done, __ATOMIC_SEQ_CST); i++) usleep(10000);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    while (!__atomic_load_n(&t1_done, __ATOMIC_SEQ_CST) || !__atomic_load_n(&nv_done, __ATOMIC_SEQ_CST)) {
        drain(p[0], saved);
        usleep(1000);
    }
    pthread_join(t, NULL);
    pthread_join(tn, NULL);
    printf("nvml=%d\nnvml.total=%llu\n", (int)nv_rc, (unsigned long long)nv_mem.total);
    fflush(stdout);
    dup2(saved, 2);
    drain(p[0], 2);
    printf("first=%s\n", cq_err(t1_rc));
    CK(cuCtxSetCurrent(ctx));
    if (sm) {
        CUmodule mod;
        CK(cuModuleLoadData(&mod, "CUDASIM-MODULE 1\nkernel k 1000000 0\n"));
        CUfunction f;
        CK(cuModuleGetFunction(&f, mod, "k"));
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        unsigned long long t0 = ts.tv_sec * 1000000000ull + ts.tv_nsec, now = t0;
        unsigned long long until = t0 + (unsigned long long)(atof(argc > 3 ? argv[3] : "3") * 1e9);
        int n = 0;
        while (now < until) {
            CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            if (++n % 4 == 0) CK(cuCtxSynchronize());
            clock_gettime(CLOCK_MONOTONIC, &ts);
            now = ts.tv_sec * 1000000000ull + ts.tv_nsec;
        }
        CK(cuCtxSynchronize());
        printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%d\n", (int)getpid(), t0, until, n);
        return 0;
    }
    CUdeviceptr big;
    CUresult r = cuMemAlloc(&big, bytes);
    printf("alloc=%s\n", cq_err(r));
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo(&free_b, &total_b);
    printf("info.total=%zu\n", total_b);
    used(0, "used");
    return 0;
}

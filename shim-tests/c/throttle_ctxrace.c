/* throttle_ctxrace.c (issue 21 item 5, a hostile review's attack; held): tries to wedge the device's probe for good. Phase 1 (WEDGE_S
 * seconds): helper threads launch tiny kernels flat out on the primary context (every admission polls the
 * outstanding probe while it is `ending`, taking `outstanding` for an instant) while the main thread creates a
 * context, launches one kernel there (a probe when due) and destroys the context. Engine::context_ended used to
 * try_lock `outstanding`: had a helper held it at that instant the probe stayed `ending` for ever — poll returns
 * at once, probe_claimed stays true, no launch of this device is measured again.
 * Phase 2 (SECONDS): every launch a never-seen shape of a long kernel on the primary context (throttle_shapes.c holds
 * the limit when probes work).
 *
 *   throttle_ctxrace WEDGE_S SECONDS KERNEL_NS
 * Output: pid, t0_ns, end_ns (phase 2), launches (phase 2), destroys. */
#include <cuda.h>
#include "cq_kernel.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static CUcontext prim;
static CUfunction tiny;
static volatile int stop;
static int sms;

static void *helper(void *arg) {
    (void)arg;
    CK(cuCtxSetCurrent(prim));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    while (!stop) CK(cuLaunchKernel(tiny, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    double wedge = atof(argv[1]), secs = atof(argv[2]);
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %s\nkernel tiny 1000\nkernel mid 2000000\n", argv[3]);
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CK(cuDevicePrimaryCtxRetain(&prim, d));
    CK(cuCtxSetCurrent(prim));
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f, m, "k"));
    CK(cuModuleGetFunction(&tiny, m, "tiny"));
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, helper, NULL);
    uint64_t w_until = now_ns() + (uint64_t)(wedge * 1e9);
    unsigned long destroys = 0;
    while (now_ns() < w_until) {
        CUcontext c;
        CK(cuCtxCreate(&c, NULL, 0, d));
        CUmodule mm;
        CUfunction g;
        CK(cuModuleLoadData(&mm, image));
        CK(cuModuleGetFunction(&g, mm, "mid"));
        CK(cuLaunchKernel(g, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxDestroy(c));
        destroys++;
    }
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CK(cuCtxSetCurrent(prim));
    CK(cuCtxSynchronize());
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        unsigned bx = 1 + (unsigned)(n % 1024), by = 1 + (unsigned)(n / 1024);
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, bx, by, 1, 0, NULL, NULL, NULL));
        n++;
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\ndestroys=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n, destroys);
    fflush(stdout);
    _exit(0);
}

/* priority_threads.c: a best-effort tenant launching from THREADS threads, each on its own stream of the
 * primary context (an ordinary multi-threaded producer), kernels of random [KMIN_NS, KMAX_NS].
 *   priority_threads SECONDS KMIN_NS KMAX_NS SEED START_AT_NS THREADS
 * The budget check (be_admit: reap, then launch, then track) reserves nothing between the check and the
 * launch, so threads admitted together each count only what was queued before them. */
#include "cq_kernel.h"
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static CUcontext ctx;
static CUfunction fn;
static int sms = 1;
static uint64_t kmin, kmax, unit, until;

static void *worker(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg * 7919 + 11;
    CK(cuCtxSetCurrent(ctx));
    CUstream st;
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    while (now_ns() < until) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        uint64_t ns = kmin + (rng * 0x2545F4914F6CDD1Dull) % (kmax - kmin + 1);
        CK(cuLaunchKernel(fn, (unsigned)((ns / unit) * (uint64_t)sms), 1, 1, 32, 1, 1, 0, st, NULL, NULL));
    }
    CK(cuStreamSynchronize(st));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 7) return 2;
    double seconds = atof(argv[1]);
    kmin = strtoull(argv[2], NULL, 10);
    kmax = strtoull(argv[3], NULL, 10);
    uint64_t start_at = strtoull(argv[5], NULL, 10);
    int threads = atoi(argv[6]);
    unit = kmin / 10;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel spin %llu\n", (unsigned long long)unit);
    CUmodule m;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&fn, m, "spin"));
    struct timespec ts = {(time_t)(start_at / 1000000000ull), (long)(start_at % 1000000000ull)};
    if (start_at > now_ns()) clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    uint64_t t0 = now_ns();
    until = t0 + (uint64_t)(seconds * 1e9);
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    return 0;
}

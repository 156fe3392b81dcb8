/* alloc_bench: time cuMemAlloc_v2 + cuMemFree_v2 pairs, or cuMemGetInfo_v2 calls, on T threads.
 *
 *   alloc_bench pair|info THREADS ITERS [SIZE]
 *
 * Each thread makes the primary context current, warms up, then times ITERS operations. Prints
 * cpu_ns_per_op (mean over threads of thread CPU time / ITERS: the work each call costs, immune to the
 * oversubscription of 8 threads on a small machine) and wall_ns_per_op (wall time × THREADS / total ops).
 * Linked with -lcuda; run with and without LD_PRELOAD=libcuquota.so by cuquota-bench.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static CUcontext ctx;
static int mode_pair, iters;
static size_t size = 1 << 20;
static pthread_barrier_t barrier;
static double cpu_ns[256];
static volatile int failed;

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void op(void) {
    if (mode_pair) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, size) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) failed = 1;
    } else {
        size_t f, t;
        if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) failed = 1;
    }
}

static void *worker(void *arg) {
    int id = (int)(long)arg;
    cuCtxSetCurrent(ctx);
    for (int i = 0; i < iters / 10 + 10; i++) op();
    pthread_barrier_wait(&barrier);
    double t0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < iters; i++) op();
    cpu_ns[id] = (now(CLOCK_THREAD_CPUTIME_ID) - t0) / iters;
    pthread_barrier_wait(&barrier);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: alloc_bench pair|info THREADS ITERS [SIZE_BYTES]\n");
        return 2;
    }
    mode_pair = strcmp(argv[1], "pair") == 0;
    int threads = atoi(argv[2]);
    iters = atoi(argv[3]);
    if (argc > 4) size = strtoull(argv[4], NULL, 0);
    if (threads < 1 || threads > 256 || iters < 1) return 2;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "driver init failed\n");
        return 1;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    pthread_t th[256];
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)(long)i);
    pthread_barrier_wait(&barrier);
    double w0 = now(CLOCK_MONOTONIC);
    pthread_barrier_wait(&barrier);
    double wall = now(CLOCK_MONOTONIC) - w0;
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    double cpu = 0;
    for (int i = 0; i < threads; i++) cpu += cpu_ns[i];
    printf("cpu_ns_per_op=%.1f\nwall_ns_per_op=%.1f\nfailed=%d\n", cpu / threads, wall * threads / ((double)iters * threads),
           failed);
    return failed;
}

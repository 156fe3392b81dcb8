/* Review: more live allocations than the ledger's lock-free table holds (8192), made and freed by several
 * threads at once, in a shuffled order, with frees of addresses never allocated and double frees mixed in.
 * Prints base.free=, held.free=, end.free= (the shim's cuMemGetInfo), sim.base=, sim.end= (the simulator's),
 * ok=, oom=, err=. */
#include "cq_driver.h"
#include <pthread.h>

#define PER 6000
#define THREADS 4
static CUcontext ctx;
static CUdeviceptr ptrs[THREADS][PER];
static int oks[THREADS], ooms[THREADS], errs[THREADS];
static pthread_barrier_t bar;

static void *worker(void *a) {
    int t = (int)(intptr_t)a;
    cuCtxSetCurrent(ctx);
    unsigned s = 12345u + t;
    for (int i = 0; i < PER; i++) {
        CUresult r = cuMemAlloc(&ptrs[t][i], 48 << 10);
        if (r == CUDA_SUCCESS) oks[t]++; else { ptrs[t][i] = 0; if (r == CUDA_ERROR_OUT_OF_MEMORY) ooms[t]++; else errs[t]++; }
    }
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    for (int i = PER - 1; i > 0; i--) { s = s * 1103515245u + 12345u; int j = s % (i + 1); CUdeviceptr x = ptrs[t][i]; ptrs[t][i] = ptrs[t][j]; ptrs[t][j] = x; }
    for (int i = 0; i < PER; i++) {
        if (!ptrs[t][i]) continue;
        cuMemFree(ptrs[t][i]);
        cuMemFree(ptrs[t][i]);                /* double free: refused by the driver */
        cuMemFree(ptrs[t][i] + 4096);         /* interior address: never allocated */
    }
    return NULL;
}

int main(void) {
    CUdevice dev;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    size_t f, total;
    cq_rawmem m;
    cuMemGetInfo(&f, &total);
    printf("base.free=%zu\n", f);
    if (cq_raw_nvml_mem(0, &m) == 0) printf("sim.base=%llu\n", m.used);
    pthread_barrier_init(&bar, NULL, THREADS + 1);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    pthread_barrier_wait(&bar);
    cuMemGetInfo(&f, &total);
    printf("held.free=%zu\n", f);
    if (cq_raw_nvml_mem(0, &m) == 0) printf("sim.held=%llu\n", m.used);
    pthread_barrier_wait(&bar);
    int ok = 0, oom = 0, err = 0;
    for (int t = 0; t < THREADS; t++) { pthread_join(th[t], NULL); ok += oks[t]; oom += ooms[t]; err += errs[t]; }
    cuMemGetInfo(&f, &total);
    printf("end.free=%zu\n", f);
    if (cq_raw_nvml_mem(0, &m) == 0) printf("sim.end=%llu\n", m.used);
    printf("ok=%d\noom=%d\nerr=%d\ndone=1\n", ok, oom, err);
    return 0;
}

/* Review of h29-hot (ledger insert fast path, inlined charge, HAMi words kept): charges lost or doubled under
 * threads and address reuse, judged against the simulator's own figures.
 *
 *   alloc_churn churn HOLD THREADS ITERS   HOLD 64 KiB allocations held by the main thread (the ledger's
 *       8192-record table near full, so inserts flip between the fast path and the overflow maps), then THREADS
 *       threads alloc/free through one shared array of 512 cells (a free often on another thread than the
 *       allocation; the simulator's first-fit heap hands the freed address straight out again). A sampler
 *       thread keeps the simulator's peak. Then the held ones are compared, then everything freed.
 *   alloc_churn ctx ROUNDS PER            cuCtxCreate, PER allocations, cuCtxDestroy without freeing, ROUNDS
 *       times, while a primary-context allocation is held (addresses reused across contexts).
 *
 * Prints base.free=, post.free=, end.free= (shim cuMemGetInfo) and sim.base=, sim.post=, sim.end=, sim.peak=,
 * ok=, oom=, err=. */
#include "cq_driver.h"
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

#define CELLS 512
static CUcontext ctx;
static _Atomic(CUdeviceptr) cells[CELLS];
static atomic_int oks, ooms, errs, stop;
static _Atomic unsigned long long peak;
static int iters;

static unsigned long long simused(void) {
    cq_rawmem m;
    return cq_raw_nvml_mem(0, &m) == 0 ? m.used : 0;
}

static void *sampler(void *a) {
    (void)a;
    while (!atomic_load(&stop)) {
        unsigned long long u = simused(), p = atomic_load(&peak);
        while (u > p && !atomic_compare_exchange_weak(&peak, &p, u)) {}
        usleep(200);
    }
    return NULL;
}

static void *worker(void *a) {
    unsigned s = 777u + (unsigned)(intptr_t)a * 7919u;
    cuCtxSetCurrent(ctx);
    static const size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 2 << 20, 96 << 10};
    for (int i = 0; i < iters; i++) {
        s = s * 1103515245u + 12345u;
        int k = (s >> 8) % CELLS;
        CUdeviceptr p = atomic_exchange(&cells[k], 0);
        if (p) {
            if (cuMemFree(p) != CUDA_SUCCESS) atomic_fetch_add(&errs, 1);
            continue;
        }
        CUresult r = cuMemAlloc(&p, sizes[(s >> 20) % 5]);
        if (r == CUDA_SUCCESS) {
            atomic_fetch_add(&oks, 1);
            CUdeviceptr old = atomic_exchange(&cells[k], p);
            if (old && cuMemFree(old) != CUDA_SUCCESS) atomic_fetch_add(&errs, 1);
        } else if (r == CUDA_ERROR_OUT_OF_MEMORY) atomic_fetch_add(&ooms, 1);
        else atomic_fetch_add(&errs, 1);
    }
    return NULL;
}

static void report(const char *what) {
    size_t f, t;
    cuMemGetInfo(&f, &t);
    printf("%s.free=%zu\nsim.%s=%llu\n", what, f, what, simused());
    fflush(stdout);
}

int main(int argc, char **argv) {
    CUdevice dev;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    report("base");
    if (argc >= 5 && !strcmp(argv[1], "churn")) {
        int hold = atoi(argv[2]), threads = atoi(argv[3]);
        iters = atoi(argv[4]);
        CUdeviceptr *held = calloc(hold, sizeof *held);
        for (int i = 0; i < hold; i++)
            if (cuMemAlloc(&held[i], 64 << 10) != CUDA_SUCCESS) held[i] = 0;
        /* Every other one back: free ways scattered over the table, overflow records left. */
        for (int i = 0; i < hold; i += 2)
            if (held[i]) { cuMemFree(held[i]); held[i] = 0; }
        pthread_t sm, th[64];
        pthread_create(&sm, NULL, sampler, NULL);
        for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        atomic_store(&stop, 1);
        pthread_join(sm, NULL);
        report("post");
        for (int k = 0; k < CELLS; k++) { CUdeviceptr p = atomic_exchange(&cells[k], 0); if (p) cuMemFree(p); }
        for (int i = 0; i < hold; i++) if (held[i]) cuMemFree(held[i]);
    } else if (argc >= 4 && !strcmp(argv[1], "ctx")) {
        int rounds = atoi(argv[2]), per = atoi(argv[3]);
        CUdeviceptr keep;
        cuMemAlloc(&keep, 1 << 20);
        for (int r = 0; r < rounds; r++) {
            CUcontext c;
            if (cuCtxCreate(&c, NULL, 0, dev) != CUDA_SUCCESS) { atomic_fetch_add(&errs, 1); continue; }
            for (int i = 0; i < per; i++) {
                CUdeviceptr p;
                CUresult rr = cuMemAlloc(&p, (size_t)(1 + (i % 3)) << 20);
                if (rr == CUDA_SUCCESS) atomic_fetch_add(&oks, 1); else if (rr == CUDA_ERROR_OUT_OF_MEMORY) atomic_fetch_add(&ooms, 1); else atomic_fetch_add(&errs, 1);
            }
            cuCtxDestroy(c);
            cuCtxSetCurrent(ctx);
            /* Addresses the destroyed context held, handed out again in the primary context and freed. */
            for (int i = 0; i < per; i++) {
                CUdeviceptr p;
                if (cuMemAlloc(&p, (size_t)(1 + (i % 3)) << 20) == CUDA_SUCCESS) cuMemFree(p);
            }
        }
        report("post");
        cuMemFree(keep);
    } else if (argc >= 2 && !strcmp(argv[1], "ctxoom")) {
        /* A context allocates 1.5 GiB and is destroyed without freeing (the primary context retained); then
         * the primary context asks for 1 GiB. */
        CUcontext c;
        cuCtxCreate(&c, NULL, 0, dev);
        for (int i = 0; i < 6; i++) { CUdeviceptr p; if (cuMemAlloc(&p, 256 << 20) == CUDA_SUCCESS) atomic_fetch_add(&oks, 1); }
        cuCtxDestroy(c);
        cuCtxSetCurrent(ctx);
        report("post");
        CUdeviceptr p;
        CUresult r = cuMemAlloc(&p, 1 << 30);
        printf("after.rc=%d\n", (int)r);
        size_t f, t;
        cuMemGetInfo(&f, &t);
        CUresult r2 = cuMemAlloc(&p, 1 << 30);
        printf("after_info.free=%zu\nafter2.rc=%d\n", f, (int)r2);
        if (r2 == CUDA_SUCCESS) cuMemFree(p);
    }
    report("end");
    printf("sim.peak=%llu\nok=%d\noom=%d\nerr=%d\ndone=1\n", atomic_load(&peak), oks, ooms, errs);
    return 0;
}

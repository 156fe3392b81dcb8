/* Review repro: cuMemPoolDestroy's ledger scan (retag_pool) racing a cuMemFreeAsync that the driver refuses
 * (bad stream). The free takes the record out of the ledger before the driver call and puts it back after the
 * refusal; a scan passing the record's slot in between misses it, so the destroyed pool counts no allocation
 * still out and its whole charge is given back while the driver keeps the pool (and the allocation) alive.
 * Prints: iters= escaped= and sim.used.0= (the simulator's own figure) and cap=. */
#include "cq_driver.h"
#include <pthread.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(1); } } while (0)

static volatile int stop;
static volatile CUdeviceptr target;
static CUcontext ctx;

static void *spin(void *a) {
    (void)a;
    cuCtxSetCurrent(ctx);
    while (!stop) cuMemFreeAsync(target, (CUstream)(uintptr_t)0xdead00); /* refused: invalid stream */
    return NULL;
}

int main(int argc, char **argv) {
    unsigned long long chunk = (argc > 1 ? strtoull(argv[1], 0, 0) : 512) << 20;
    int max_iters = argc > 2 ? atoi(argv[2]) : 400;
    int want = argc > 3 ? atoi(argv[3]) : 6;
    int mode = argc > 4 ? atoi(argv[4]) : 1; /* 1: race; 0: no refused frees; 2: refused frees, all done before the destroy */
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    size_t free0, total;
    CK(cuMemGetInfo(&free0, &total));
    printf("cap=%zu\n", total);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    int escaped = 0, it = 0;
    for (; it < max_iters && escaped < want; it++) {
        CUmemoryPool pool;
        CUdeviceptr p;
        CK(cuMemPoolCreate(&pool, &props));
        CUresult r = cuMemAllocFromPoolAsync(&p, chunk, pool, 0);
        if (r) {
            printf("alloc.refused.iter=%d rc=%d\n", it, (int)r);
            cuMemPoolDestroy(pool);
            break;
        }
        CK(cuCtxSynchronize());
        target = p;
        stop = 0;
        pthread_t t;
        if (mode) {
            pthread_create(&t, NULL, spin, NULL);
            usleep(200);
        }
        if (mode == 2) {
            stop = 1;
            pthread_join(t, NULL);
        }
        CK(cuMemPoolDestroy(pool));
        stop = 1;
        if (mode == 1) pthread_join(t, NULL);
        size_t f;
        CK(cuMemGetInfo(&f, &total));
        if (f + (64ull << 20) >= free0) {
            escaped++; /* the shim gave the pool's charge back: p (and the pool) stay with the driver */
            printf("escaped.iter=%d\n", it);
        } else {
            CK(cuMemFreeAsync(p, 0));
            CK(cuCtxSynchronize());
        }
    }
    printf("iters=%d\nescaped=%d\n", it, escaped);
    cq_rawmem m;
    if (cq_raw_nvml_mem(0, &m) == 0) printf("sim.used.0=%llu\n", m.used);
    size_t f;
    cuMemGetInfo(&f, &total);
    printf("shim.free=%zu\n", f);
    /* A near-cap admission reconciles with NVML's figure for the process (reconcile.rs): does it see them? */
    CUdeviceptr q;
    CUresult r2 = cuMemAlloc(&q, 800ull << 20);
    printf("nearcap.alloc.rc=%d\n", (int)r2);
    if (cq_raw_nvml_mem(0, &m) == 0) printf("sim.used.end=%llu\n", m.used);
    printf("done=1\n");
    return 0;
}

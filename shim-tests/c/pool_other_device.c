/* Review repro: allocations from device 1's pool made on device 0's stream (charged to device 1, as issue 21
 * item 3 wants) are forgotten when a context of device 1 ends: `forget_context_allocations` removes every
 * non-VMM record charged to the device once this process has no context left there, though the driver freed
 * none of them (they belong to the pool, made from device 0's context). cuMemPoolDestroy then finds no
 * allocation still out, and gives the whole pool's charge back while the driver keeps it.
 * Each round: pool on device 1, CHUNK from it on device 0's NULL stream, a context of device 1 created and
 * destroyed, the pool destroyed. Prints round.N.rc=, sim.used.1= (the simulator's own figure), info1.free=. */
#include "cq_driver.h"

#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(1); } } while (0)

int main(int argc, char **argv) {
    unsigned long long chunk = (argc > 1 ? strtoull(argv[1], 0, 0) : 768) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 4;
    CUdevice d0, d1;
    CUcontext c0, c1;
    CK(cuInit(0));
    CK(cuDeviceGet(&d0, 0));
    CK(cuDeviceGet(&d1, 1));
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuCtxSetCurrent(c0));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    for (int i = 0; i < rounds; i++) {
        CUmemoryPool pool;
        CUdeviceptr p;
        CK(cuMemPoolCreate(&pool, &props));
        CUresult r = cuMemAllocFromPoolAsync(&p, chunk, pool, 0);
        printf("round.%d.rc=%d\n", i, (int)r);
        if (r) break;
        CK(cuCtxSynchronize());
        CK(cuCtxCreate(&c1, NULL, 0, d1));
        CK(cuCtxDestroy(c1));
        CK(cuCtxSetCurrent(c0));
        CK(cuMemPoolDestroy(pool));
        /* p stays allocated: the driver keeps the destroyed pool until it is freed */
    }
    cq_rawmem m;
    if (cq_raw_nvml_mem(1, &m) == 0) printf("sim.used.1=%llu\n", m.used);
    CK(cuCtxCreate(&c1, NULL, 0, d1));
    size_t f, t;
    CK(cuMemGetInfo(&f, &t));
    printf("info1.free=%zu\ninfo1.total=%zu\n", f, t);
    printf("done=1\n");
    return 0;
}

/* Review repro: the first-use seen set (and the per-thread cache over it) is keyed by (kernel, context) and is
 * not forgotten at cuDevicePrimaryCtxReset. The primary context keeps its handle across a reset and a CUkernel
 * (cuLibraryLoad*, context-independent) keeps its handle too, so the kernel's first launch in the re-created
 * context is taken as already seen: the stack the driver grows for it is neither admitted nor measured.
 *   reset_relaunch LOCAL MODE   MODE: reset (cuDevicePrimaryCtxReset between the launches) | shrink
 *                                      (cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024) between them) | control
 *                                      | multi N (shrink, in the primary and in N contexts made with cuCtxCreate:
 *                                      each relaunch after the fill grows one more stack)
 * Steps: launch k once (stack grows: admitted, measured), [reset], fill 64 MiB pieces until refused, launch k
 * again. Prints launch.0=, fill.count=, launch.1=, sim.used.0= (the simulator's own figure), info.free=. */
#include "cq_driver.h"

#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(1); } } while (0)

static unsigned long long sim_used(void) {
    cq_rawmem m;
    return cq_raw_nvml_mem(0, &m) == 0 ? m.used : 0;
}

int main(int argc, char **argv) {
    unsigned long long local = argc > 1 ? strtoull(argv[1], 0, 0) : 3010;
    int reset = argc > 2 && strcmp(argv[2], "reset") == 0;
    int shrink = argc > 2 && strcmp(argv[2], "shrink") == 0;
    int multi = argc > 2 && strcmp(argv[2], "multi") == 0 ? (argc > 3 ? atoi(argv[3]) : 6) : 0;
    if (multi > 32) multi = 32;
    CUcontext ctxs[32];
    CUdevice d0;
    CUcontext c0;
    CK(cuInit(0));
    CK(cuDeviceGet(&d0, 0));
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuCtxSetCurrent(c0));
    char image[256];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000 %llu\n", local);
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CK(cuLibraryGetKernel(&k, lib, "k"));
    CUresult r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    printf("launch.0=%d\nsim.after0=%llu\n", (int)r, sim_used());
    if (reset) {
        CK(cuDevicePrimaryCtxReset(d0));
        CUcontext again;
        CK(cuDevicePrimaryCtxRetain(&again, d0));
        printf("same.handle=%d\n", again == c0);
        CK(cuCtxSetCurrent(again));
        printf("sim.afterreset=%llu\n", sim_used());
    }
    if (shrink || multi) {
        /* the stack limit set back down: the driver gives the grown stack back, and grows it again at the next
         * launch of a kernel that needs it */
        CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024));
        printf("sim.aftershrink=%llu\n", sim_used());
    }
    for (int i = 0; i < multi; i++) {
        /* each context: the kernel's first launch (its stack grows: admitted), then the stack given back */
        CK(cuCtxCreate(&ctxs[i], NULL, 0, d0));
        CUresult rr = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024));
        printf("multi.%d.launch=%d\n", i, (int)rr);
        CK(cuCtxSetCurrent(c0));
    }
    int n = 0;
    CUdeviceptr p;
    while (n < 1000 && cuMemAlloc(&p, 64ull << 20) == CUDA_SUCCESS) n++;
    printf("fill.count=%d\nsim.afterfill=%llu\n", n, sim_used());
    r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    printf("launch.1=%d\n", (int)r);
    for (int i = 0; i < multi; i++) {
        CK(cuCtxSetCurrent(ctxs[i]));
        CUresult rr = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        printf("multi.%d.relaunch=%d\n", i, (int)rr);
    }
    CK(cuCtxSetCurrent(c0));
    printf("sim.used.0=%llu\n", sim_used());
    size_t f, t;
    cuMemGetInfo(&f, &t);
    printf("info.free=%zu\ndone=1\n", f);
    return 0;
}

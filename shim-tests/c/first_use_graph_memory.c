/* first_use_graph_memory: a graph's first launch with memory nodes (found by a review of ab2165e)
 *   first_use_graph_memory MODE A G
 * 1 GiB cap. Graph X: one alloc node of 300 MiB (not freed in the graph), launched once: its allocation px live.
 * Graph Y: a kernel node of a library kernel with a 700 MiB lazily loaded global + an alloc node of 300 MiB.
 *   race: with CUDA_DEVICE_SM_LIMIT the budget is spent by a 50 ms kernel; Y is launched (held by the throttle);
 *         thread B frees px 100 ms later (during the throttle's wait): the pool's unused 300 MiB back Y's alloc.
 *   seq (CONTROL): B frees px before Y is launched.
 * Then fill: cuMemAlloc 64 MiB until refused; used.0= (simulator's figure).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_graph_memory"
#include "cq_fill.h"

static CUdeviceptr g_px;
static CUcontext g_c0;
static int g_delay_ms;

static void *free_thread(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_c0);
    usleep(g_delay_ms * 1000);
    CUresult r = cuMemFree(g_px);
    printf("b.free=%s\n", cq_err(r));
    used(0, "used.b");
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUgraphNode add_alloc(CUgraph g, size_t bytes, CUdeviceptr *out) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CUgraphNode n;
    CK(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    if (out) *out = p.dptr;
    return n;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "race";
    unsigned long long A = (argc > 2 ? atoll(argv[2]) : 300) << 20;
    unsigned long long G = (argc > 3 ? atoll(argv[3]) : 700) << 20;
    CUdevice d0;
    g_c0 = primary0(&d0);
    /* X */
    CUgraph gx;
    CK(cuGraphCreate(&gx, 0));
    add_alloc(gx, A, &g_px);
    CUgraphExec ex;
    CK(cuGraphInstantiate(&ex, gx, 0));
    CUresult r = cuGraphLaunch(ex, NULL);
    cuCtxSynchronize();
    printf("x.launch=%s\n", cq_err(r));
    used(0, "used.0");
    /* Y */
    char image[256];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %d\nglobal g %llu\n", 1000, G);
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CK(cuLibraryGetKernel(&k, lib, "k"));
    CUgraph gy;
    CK(cuGraphCreate(&gy, 0));
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = (CUfunction)k;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    CUgraphNode kn;
    CK(cuGraphAddKernelNode(&kn, gy, NULL, 0, &kp));
    add_alloc(gy, A, NULL);
    CUgraphExec ey;
    CK(cuGraphInstantiate(&ey, gy, 0));
    /* spend the SM budget */
    CUlibrary l0;
    CK(cuLibraryLoadData(&l0, "CUDASIM-MODULE 1\nkernel k 50000000\n", NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k0;
    CK(cuLibraryGetKernel(&k0, l0, "k"));
    int spend = getenv("SPEND") ? atoi(getenv("SPEND")) : 4;
    for (int i = 0; i < spend; i++) {
        double t1 = now_ms();
        CK(cuLaunchKernel((CUfunction)k0, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        printf("k0.%d.ms=%.0f\n", i, now_ms() - t1);
    }
    used(0, "used.0");
    pthread_t t;
    int seq = strcmp(mode, "seq") == 0;
    g_delay_ms = seq ? 0 : (getenv("DELAY") ? atoi(getenv("DELAY")) : 15);
    pthread_create(&t, NULL, free_thread, NULL);
    if (seq) pthread_join(t, NULL);
    double t0 = now_ms();
    r = cuGraphLaunch(ey, NULL);
    printf("y.launch=%s\ny.ms=%.0f\n", cq_err(r), now_ms() - t0);
    cuCtxSynchronize();
    if (!seq) pthread_join(t, NULL);
    used(0, "used.0");
    int n = 0;
    for (; n < 256; n++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 64ull << 20) != CUDA_SUCCESS) break;
    }
    printf("fill=%d\n", n);
    used(0, "used.0");
    return 0;
}

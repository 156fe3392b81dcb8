/* priority_attack_graph.c (hostile review 29): a best-effort tenant (priority low) that submits its work as CUDA
 * graphs of N chained kernels of KERNEL_NS each (what PyTorch's CUDA graphs do with a training step), one
 * cuGraphLaunch after another on one stream.
 *   priority_attack_graph SECONDS KERNEL_NS N START_AT_NS
 * A graph launch is one unit for be_admit (src/throttle/priority.rs), estimated at its measured duration: a
 * burst may wait for one whole graph (N × KERNEL_NS), never for several.
 * Prints pid, t0_ns, end_ns, launches. */
#include "cq_kernel.h"
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    double seconds = atof(argv[1]);
    uint64_t kns = strtoull(argv[2], NULL, 10);
    unsigned n = (unsigned)atoi(argv[3]);
    uint64_t start_at = strtoull(argv[4], NULL, 10);
    uint64_t unit = kns / 10;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    int sms = 1;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel spin %llu\n", (unsigned long long)unit);
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f, m, "spin"));
    CUstream st;
    CK(cuStreamCreate(&st, 0));
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUgraphNode prev = NULL;
    for (unsigned i = 0; i < n; i++) {
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        p.gridDimX = (unsigned)(10 * sms);
        p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphNode nd;
        CK(cuGraphAddKernelNode(&nd, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
        prev = nd;
    }
    CUgraphExec exec;
    CK(cuGraphInstantiate(&exec, g, 0));
    struct timespec ts = {(time_t)(start_at / 1000000000ull), (long)(start_at % 1000000000ull)};
    if (start_at > now_ns()) clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
    uint64_t launches = 0;
    while (now_ns() < until) {
        CK(cuGraphLaunch(exec, st));
        launches++;
    }
    CK(cuStreamSynchronize(st));
    printf("launches=%llu\n", (unsigned long long)launches);
    return 0;
}

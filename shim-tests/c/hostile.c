/* hostile: what a tenant who wants more than its limits can do in a few lines of ordinary CUDA driver code. One
 * subcommand per attack (issue #11); each prints key=value lines for the test that runs it.
 *
 *   hostile stream_device PATH SECONDS KERNEL_NS
 *       Launches onto a stream of device 1's context while device 0's context is current, flat out for SECONDS:
 *       a throttle that charges the *current* context's device charges device 0 while the work runs on device 1.
 *       PATH kernel: a context-less CUkernel (cuLibraryLoadData + cuLibraryGetKernel), which the driver runs in
 *       the stream's context; graph: a one-kernel graph instantiated in device 1's context, cuGraphLaunch'ed.
 *       Prints pid=, t0_ns=, end_ns= (CLOCK_MONOTONIC launch window, for the simulator's timeline), launches=.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, CUresult r) {
    fprintf(stderr, "hostile: %s failed: %d\n", what, (int)r);
    exit(2);
}
#define CK(call)                                                                                                \
    do {                                                                                                        \
        CUresult r_ = (call);                                                                                   \
        if (r_ != CUDA_SUCCESS) die(#call, r_);                                                                 \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int stream_device(const char *path, double seconds, unsigned long long kernel_ns) {
    CK(cuInit(0));
    CUdevice d0, d1;
    CK(cuDeviceGet(&d0, 0));
    CK(cuDeviceGet(&d1, 1));
    CUcontext c0, c1;
    CK(cuDevicePrimaryCtxRetain(&c1, d1));
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    /* Everything the launches use is made in device 1's context... */
    CK(cuCtxSetCurrent(c1));
    CUstream s1;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\n", kernel_ns);
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CK(cuLibraryGetKernel(&k, lib, "k"));
    CUgraphExec exec = NULL;
    int graph = strcmp(path, "graph") == 0;
    if (graph) {
        CUmodule m;
        CK(cuModuleLoadData(&m, image));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        CUgraph g;
        CK(cuGraphCreate(&g, 0));
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphNode n;
        CK(cuGraphAddKernelNode(&n, g, NULL, 0, &p));
        CK(cuGraphInstantiate(&exec, g, 0));
    } else if (strcmp(path, "kernel") != 0) {
        fprintf(stderr, "unknown path %s\n", path);
        return 2;
    }
    /* ...and device 0's context is current while they are made. */
    CK(cuCtxSetCurrent(c0));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9), launches = 0;
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
    while (now_ns() < until) {
        if (graph)
            CK(cuGraphLaunch(exec, s1));
        else
            CK(cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, s1, NULL, NULL));
        launches++;
    }
    CK(cuStreamSynchronize(s1));
    printf("launches=%llu\n", (unsigned long long)launches);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "stream_device") == 0)
        return stream_device(argv[2], atof(argv[3]), strtoull(argv[4], NULL, 10));
    fprintf(stderr, "usage: hostile stream_device kernel|graph SECONDS KERNEL_NS\n");
    return 2;
}

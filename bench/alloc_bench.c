/* alloc_bench: time cuMemAlloc_v2 + cuMemFree_v2 pairs, cuMemGetInfo_v2 calls, cuLaunchKernel calls of an
 * empty kernel, or cuGraphLaunch calls of a graph of one such kernel node (each thread on its own stream,
 * synchronised every 256 launches; one exec per thread), on T threads.
 *
 *   alloc_bench pair|info|launch|graph THREADS ITERS [SIZE]
 *
 * Each thread makes the primary context current, warms up, then times ITERS operations. Prints
 * cpu_ns_per_op (mean over threads of thread CPU time / ITERS: the work each call costs, immune to the
 * oversubscription of 8 threads on a small machine) and wall_ns_per_op (wall time × THREADS / total ops).
 * Linked with -lcuda; run with and without LD_PRELOAD=libcuquota.so by cuquota-bench.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static CUcontext ctx;
static CUfunction nop;
static int mode_pair, mode_launch, mode_graph, iters;
static __thread CUstream stream;
static __thread CUgraphExec exec;
static __thread int launched;

/* The empty kernel: PTX on a GPU, a text module on the simulator (which exports cudasimDeviceBusyNs). */
static const char PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry nop()\n{\n  ret;\n}\n";
static const char SIM_MODULE[] = "CUDASIM-MODULE 1\nkernel nop 1\n";
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
    if (mode_graph) {
        if (cuGraphLaunch(exec, stream) != CUDA_SUCCESS) failed = 1;
        if (++launched % 256 == 0 && cuStreamSynchronize(stream) != CUDA_SUCCESS) failed = 1;
    } else if (mode_launch) {
        if (cuLaunchKernel(nop, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL) != CUDA_SUCCESS) failed = 1;
        if (++launched % 256 == 0 && cuStreamSynchronize(stream) != CUDA_SUCCESS) failed = 1;
    } else if (mode_pair) {
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
    if (mode_launch && cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) failed = 1;
    if (mode_graph) {
        CUgraph g;
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = nop;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphNode n;
        if (cuGraphCreate(&g, 0) || cuGraphAddKernelNode(&n, g, NULL, 0, &p) || cuGraphInstantiateWithFlags(&exec, g, 0))
            failed = 1;
    }
    for (int i = 0; i < iters / 10 + 10; i++) op();
    pthread_barrier_wait(&barrier);
    double t0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < iters; i++) op();
    if ((mode_launch || mode_graph) && cuStreamSynchronize(stream) != CUDA_SUCCESS) failed = 1;
    cpu_ns[id] = (now(CLOCK_THREAD_CPUTIME_ID) - t0) / iters;
    pthread_barrier_wait(&barrier);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: alloc_bench pair|info|launch|graph THREADS ITERS [SIZE_BYTES]\n");
        return 2;
    }
    mode_pair = strcmp(argv[1], "pair") == 0;
    mode_graph = strcmp(argv[1], "graph") == 0;
    mode_launch = mode_graph || strcmp(argv[1], "launch") == 0;
    int threads = atoi(argv[2]);
    iters = atoi(argv[3]);
    if (argc > 4) size = strtoull(argv[4], NULL, 0);
    if (threads < 1 || threads > 256 || iters < 1) return 2;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "driver init failed\n");
        return 1;
    }
    if (mode_launch) {
        CUmodule mod;
        const char *image = dlsym(RTLD_DEFAULT, "cudasimDeviceBusyNs") ? SIM_MODULE : PTX;
        if (cuModuleLoadData(&mod, image) || cuModuleGetFunction(&nop, mod, "nop")) {
            fprintf(stderr, "loading the empty kernel failed\n");
            return 1;
        }
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

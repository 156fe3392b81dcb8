/* first_use: memory the driver takes at first use on the paths a hostile review of issue #21 found (launch-time
 * stack growth and lazy loading outside the plain first launch). Each mode takes memory, then prints the
 * simulator's own used bytes (used=).
 *
 *   first_use stack_retry LOCAL     launch a kernel with LOCAL bytes of local memory; refused? launch again.
 *   first_use stack_ctx LOCAL N     N more contexts created (cuCtxCreate); one CUkernel (library) launched in
 *                                       the primary context, then in each of them: each grows its own stack.
 *   first_use stack_graph LOCAL     kernel node in a graph (cuGraphAddKernelNode), instantiated and launched.
 *   first_use stack_capture LOCAL   the kernel's first launch made under stream capture (no stack grows then),
 *                                       the graph instantiated and launched (the stack grows now).
 *   first_use stack_multi LOCAL     cuLaunchCooperativeKernelMultiDevice, one entry on device 0.
 *   first_use global_null SIZE N    one library with N `__device__` globals of SIZE each, looked up with
 *                                       cuLibraryGetGlobal(NULL, &bytes, ...) (dptr is optional in cuda.h).
 *   first_use global_threads SIZE N N libraries with one SIZE global each, loaded first; then N threads look
 *                                       their global up at once (cuLibraryGetGlobal with a dptr).
 *   first_use pool_created N CHUNK  a pool created on device 1 (cuMemPoolCreate), N CHUNK allocations from it
 *                                       on device 0's NULL stream. Prints pool.ok=, used1=.
 *   first_use bypass_hold SIZE SECS libcuda's own cuMemAlloc_v2 (no interposer sees it), then sleeps.
 * Then always: fill CHUNK (argv[4] or 64m) until refused, used=, info.free=.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use"
#include "cq_fill.h"

static CUcontext g_ctx;
static pthread_barrier_t g_bar;
static CUlibrary g_libs[64];
static CUresult g_res[64];
static void *lookup(void *arg) {
    long i = (long)arg;
    cuCtxSetCurrent(g_ctx);
    pthread_barrier_wait(&g_bar);
    CUdeviceptr p;
    size_t n;
    g_res[i] = cuLibraryGetGlobal(&p, &n, g_libs[i], "g");
    return NULL;
}

static CUkernel g_kernel;
static CUdevice g_dev;
/* review: a worker thread with its own context (created through the hook) launches g_kernel there. */
static void *other_ctx_launch(void *arg) {
    (void)arg;
    CUcontext d;
    g_res[0] = cuCtxCreate(&d, NULL, 0, g_dev);
    if (g_res[0]) return NULL;
    g_res[0] = cuLaunchKernel((CUfunction)g_kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: first_use MODE A [B] [CHUNK]\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long a = cq_size(argv[2]);
    unsigned long long chunk = argc > 4 ? cq_size(argv[4]) : (64ull << 20);
    CUdevice d0;
    CUcontext c0 = primary0(&d0);
    used(0, "used");
    char image[256];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000 %llu\n", a);
    if (strcmp(mode, "stack_retry") == 0) {
        CUmodule m;
        CK(cuModuleLoadData(&m, image));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        for (int i = 0; i < 2; i++) {
            CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuCtxSynchronize();
            used(0, "used");
        }
    } else if (strcmp(mode, "stack_ctx") == 0) {
        int n = argc > 3 ? atoi(argv[3]) : 2;
        if (n > 15) n = 15;
        CUlibrary lib;
        CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
        CUkernel k;
        CK(cuLibraryGetKernel(&k, lib, "k"));
        CUcontext ctx[16];
        ctx[0] = c0;
        int made = 1;
        for (int i = 1; i <= n; i++, made++) {
            CUresult r = cuCtxCreate(&ctx[i], NULL, 0, d0);
            printf("ctx.%d=%s\n", i, cq_err(r));
            if (r) break;
        }
        for (int i = 0; i < made; i++) {
            CK(cuCtxSetCurrent(ctx[i]));
            CUresult r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuCtxSynchronize();
            used(0, "used");
        }
        CK(cuCtxSetCurrent(c0));
    } else if (strcmp(mode, "stack_graph") == 0) {
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
        p.blockDimX = p.blockDimY = p.blockDimZ = 1;
        CUgraphNode node;
        CK(cuGraphAddKernelNode(&node, g, NULL, 0, &p));
        CUgraphExec e;
        CUresult r = cuGraphInstantiate(&e, g, 0);
        printf("instantiate=%s\n", cq_err(r));
        if (!r) {
            r = cuGraphLaunch(e, NULL);
            printf("launch=%s\n", cq_err(r));
        }
        cuCtxSynchronize();
        used(0, "used");
    } else if (strcmp(mode, "reset_pop") == 0 || strcmp(mode, "reset_thread") == 0) {
        /* review (issue 22 launch fast path): the primary context reset (it stays retained and current: the
         * driver reinitialises it at its next use) leaves the shim's known contexts; a CUkernel launched in
         * another context (created through the hook) then counts as launched everywhere, and its launch back in
         * the primary context (made current again by cuCtxPopCurrent, which no hook sees; or still current to
         * the main thread while another thread launched it in its own context) skips the first-use check. */
        CUlibrary lib;
        CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
        CUkernel k;
        CK(cuLibraryGetKernel(&k, lib, "k"));
        CK(cuDevicePrimaryCtxReset(d0));
        CUresult r;
        if (strcmp(mode, "reset_thread") == 0) {
            g_kernel = k;
            g_dev = d0;
            pthread_t t;
            pthread_create(&t, NULL, other_ctx_launch, NULL);
            pthread_join(t, NULL);
            printf("launch.other=%s\n", cq_err(g_res[0]));
            used(0, "used");
        } else {
            CUcontext d;
            CK(cuCtxCreate(&d, NULL, 0, d0));
            r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            printf("launch.other=%s\n", cq_err(r));
            cuCtxSynchronize();
            used(0, "used");
            CUcontext popped;
            CK(cuCtxPopCurrent(&popped));
        }
        CUcontext cur = NULL;
        cuCtxGetCurrent(&cur);
        printf("primary_current=%d\n", cur == c0);
        r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        printf("launch.primary=%s\n", cq_err(r));
        cuCtxSynchronize();
        used(0, "used");
    } else if (strcmp(mode, "graph_update") == 0) {
        /* review (issue 22 launch fast path): a graph exec launched once (a kernel with no local memory), then
         * cuGraphExecUpdate to a graph of the same shape whose kernel needs LOCAL bytes of local memory, launched
         * again: the exec handle counts as launched everywhere, so the new kernel's stack growth is not admitted. */
        char img2[256];
        snprintf(img2, sizeof img2, "CUDASIM-MODULE 1\nkernel k 1000 0\nkernel big 1000 %llu\n", a);
        CUmodule m;
        CK(cuModuleLoadData(&m, img2));
        CUfunction fk, fb;
        CK(cuModuleGetFunction(&fk, m, "k"));
        CK(cuModuleGetFunction(&fb, m, "big"));
        CUgraph g1, g2;
        CK(cuGraphCreate(&g1, 0));
        CK(cuGraphCreate(&g2, 0));
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = p.blockDimY = p.blockDimZ = 1;
        CUgraphNode n1, n2;
        p.func = fk;
        CK(cuGraphAddKernelNode(&n1, g1, NULL, 0, &p));
        p.func = fb;
        CK(cuGraphAddKernelNode(&n2, g2, NULL, 0, &p));
        CUgraphExec e;
        CK(cuGraphInstantiate(&e, g1, 0));
        CUresult r = cuGraphLaunch(e, NULL);
        printf("launch.0=%s\n", cq_err(r));
        cuCtxSynchronize();
        used(0, "used");
        CUgraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        r = cuGraphExecUpdate(e, g2, &info);
        printf("update=%s\n", cq_err(r));
        r = cuGraphLaunch(e, NULL);
        printf("launch.1=%s\n", cq_err(r));
        cuCtxSynchronize();
        used(0, "used");
    } else if (strcmp(mode, "stack_capture") == 0) {
        CUmodule m;
        CK(cuModuleLoadData(&m, image));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        CUstream s;
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        printf("capture_launch=%s\n", cq_err(r));
        CUgraph g;
        CK(cuStreamEndCapture(s, &g));
        used(0, "used");
        CUgraphExec e;
        CK(cuGraphInstantiate(&e, g, 0));
        r = cuGraphLaunch(e, s);
        printf("launch=%s\n", cq_err(r));
        CK(cuStreamSynchronize(s));
        used(0, "used");
    } else if (strcmp(mode, "stack_multi") == 0) {
        CUmodule m;
        CK(cuModuleLoadData(&m, image));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        CUstream s;
        CK(cuStreamCreate(&s, 0));
        CUDA_LAUNCH_PARAMS lp;
        memset(&lp, 0, sizeof lp);
        lp.function = f;
        lp.gridDimX = lp.gridDimY = lp.gridDimZ = 1;
        lp.blockDimX = lp.blockDimY = lp.blockDimZ = 1;
        lp.hStream = s;
        CUresult r = cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0);
        printf("launch=%s\n", cq_err(r));
        cuCtxSynchronize();
        used(0, "used");
    } else if (strcmp(mode, "global_null") == 0) {
        int n = argc > 3 ? atoi(argv[3]) : 4;
        char big[4096];
        int off = snprintf(big, sizeof big, "CUDASIM-MODULE 1\nkernel k 1000\n");
        for (int i = 0; i < n && off < 4000; i++) off += snprintf(big + off, sizeof big - off, "global g%d %llu\n", i, a);
        CUlibrary lib;
        CK(cuLibraryLoadData(&lib, big, NULL, NULL, 0, NULL, NULL, 0));
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "g%d", i);
            size_t bytes = 0;
            CUresult r = cuLibraryGetGlobal(NULL, &bytes, lib, name);
            printf("global.%d=%s\n", i, cq_err(r));
            used(0, "used");
        }
    } else if (strcmp(mode, "global_threads") == 0) {
        int n = argc > 3 ? atoi(argv[3]) : 4;
        if (n > 64) n = 64;
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000\nglobal g %llu\n", a);
        for (int i = 0; i < n; i++) CK(cuLibraryLoadData(&g_libs[i], image, NULL, NULL, 0, NULL, NULL, 0));
        g_ctx = c0;
        pthread_barrier_init(&g_bar, NULL, n);
        pthread_t t[64];
        for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, lookup, (void *)i);
        int ok = 0;
        for (int i = 0; i < n; i++) {
            pthread_join(t[i], NULL);
            ok += g_res[i] == CUDA_SUCCESS;
        }
        printf("global.ok=%d\n", ok);
        used(0, "used");
    } else if (strcmp(mode, "pool_created") == 0) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 1;
        CUmemoryPool pool;
        CK(cuMemPoolCreate(&pool, &props));
        int ok = 0;
        for (unsigned long long i = 0; i < a; i++) {
            CUdeviceptr p;
            if (cuMemAllocFromPoolAsync(&p, chunk, pool, NULL) != CUDA_SUCCESS) break;
            ok++;
        }
        CK(cuCtxSynchronize());
        printf("pool.ok=%d\n", ok);
        used(1, "used1");
        return 0;
    } else if (strcmp(mode, "bypass_hold") == 0) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*alloc)(CUdeviceptr *, size_t) =
            cuda ? (CUresult(*)(CUdeviceptr *, size_t))cq_elf_sym(cuda, "cuMemAlloc_v2") : NULL;
        if (!alloc) return 2;
        CUdeviceptr p;
        printf("bypass=%s\n", cq_err(alloc(&p, a)));
        used(0, "used");
        sleep(argc > 3 ? atoi(argv[3]) : 5);
        return 0;
    } else {
        fprintf(stderr, "first_use: unknown mode %s\n", mode);
        return 2;
    }
    fill(chunk);
    return 0;
}

/* first_use_races: first uses that race (threads, the throttle's wait, a reset meanwhile, several entries of one
 * call) and first launches onto other contexts' streams (found by a hostile review of the stream-context fix).
 *
 *   first_use_races MODE N G
 * One device (plus device 1 where said), one library with one kernel k and a G-byte __device__ global (lazily
 * loaded into each context at k's first launch there), N contexts (cuCtxCreate) with a non-blocking stream each.
 *   seq      CONTROL: k launched onto each stream in turn, that stream's context current.
 *   parthr   N threads, each with its own context current, wait on a barrier, then launch k onto their stream,
 *            after a 50 ms kernel spent the SM budget (run with CUDA_DEVICE_SM_LIMIT): each is held by the
 *            throttle after its admission.
 *   multi    one cuLaunchCooperativeKernelMultiDevice with N entries (k onto each context's stream).
 *   ex       cuLaunchKernelEx, config.hStream = each stream, the primary context current.
 *   unloadrace / unloadseq (N=1): see the mode's comment.
 *   gdev1    two devices: a graph of each of N libraries' kernels launched onto device 1's stream, device 0 current.
 *   unknown / knownmod  two devices: see the mode's comment.
 *   ctxcheck one cross launch (primary current, stream of ctx 1): prints whether the current context after the
 *            launch is still the primary one (cur.same=1).
 * Prints launch.i=, used.0= after each, then fill=: cuMemAlloc 64 MiB on the primary until refused, used.0=.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_races"
#include "cq_fill.h"

#define MAXN 32
static CUcontext g_ctx[MAXN];
static CUstream g_st[MAXN];
static CUkernel g_k;
static CUresult g_res[MAXN];
static pthread_barrier_t g_bar;

static void *par_thread(void *arg) {
    long i = (long)arg;
    cuCtxSetCurrent(g_ctx[i]);
    pthread_barrier_wait(&g_bar);
    g_res[i] = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, g_st[i], NULL, NULL);
    cuStreamSynchronize(g_st[i]);
    return NULL;
}

static CUlibrary g_lib;
static int g_delay_ms;
static int g_warm;
static void *unload_thread(void *arg) {
    (void)arg;
    usleep(g_delay_ms * 1000);
    CUresult r = cuDevicePrimaryCtxReset(0); /* frees the primary's code and globals; the shim forgets */
    printf("b.reset=%s\n", cq_err(r));
    used(0, "used.0");
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: first_use_races MODE N G\n");
        return 2;
    }
    const char *mode = argv[1];
    int n = atoi(argv[2]);
    if (n > MAXN) n = MAXN;
    unsigned long long g = cq_size(argv[3]);
    CUdevice d0;
    CUcontext c0 = primary0(&d0);
    char image[256];
    int race = strncmp(mode, "unload", 6) == 0 || strcmp(mode, "parthr") == 0;
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %d\nglobal g %llu\n", race ? 50000000 : 1000, g);
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    g_lib = lib;
    CK(cuLibraryGetKernel(&g_k, lib, "k"));
    int made = 0;
    for (int i = 0; i < n; i++) {
        CUresult r = cuCtxCreate(&g_ctx[i], NULL, 0, d0);
        if (r) {
            printf("ctx.%d=%s\n", i, cq_err(r));
            break;
        }
        CK(cuStreamCreate(&g_st[i], CU_STREAM_NON_BLOCKING));
        made++;
    }
    CK(cuCtxSetCurrent(c0));
    used(0, "used.0");
    if (strcmp(mode, "seq") == 0) {
        for (int i = 0; i < made; i++) {
            CK(cuCtxSetCurrent(g_ctx[i]));
            CUresult r = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, g_st[i], NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuStreamSynchronize(g_st[i]);
            used(0, "used.0");
        }
    } else if (strcmp(mode, "parthr") == 0) {
        /* par with an SM limit: k0 (another library, 50 ms, no global) launched once to spend the budget, then
         * the N threads' first launches of k (50 ms) are each admitted, then wait in the throttle, then load. */
        CUlibrary l0;
        CK(cuLibraryLoadData(&l0, "CUDASIM-MODULE 1\nkernel k 50000000\n", NULL, NULL, 0, NULL, NULL, 0));
        CUkernel k0;
        CK(cuLibraryGetKernel(&k0, l0, "k"));
        CK(cuCtxSetCurrent(c0));
        for (int i = 0; i < 2; i++) {
            CK(cuLaunchKernel((CUfunction)k0, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            cuCtxSynchronize();
        }
        used(0, "used.0");
        pthread_barrier_init(&g_bar, NULL, made);
        pthread_t t[MAXN];
        for (long i = 0; i < made; i++) pthread_create(&t[i], NULL, par_thread, (void *)i);
        for (int i = 0; i < made; i++) {
            pthread_join(t[i], NULL);
            printf("launch.%d=%s\n", i, cq_err(g_res[i]));
        }
        used(0, "used.0");
    } else if (strcmp(mode, "multi") == 0) {
        CUDA_LAUNCH_PARAMS lp[MAXN];
        memset(lp, 0, sizeof lp);
        for (int i = 0; i < made; i++) {
            lp[i].function = (CUfunction)g_k;
            lp[i].gridDimX = lp[i].gridDimY = lp[i].gridDimZ = 1;
            lp[i].blockDimX = lp[i].blockDimY = lp[i].blockDimZ = 1;
            lp[i].hStream = g_st[i];
        }
        CUresult r = cuLaunchCooperativeKernelMultiDevice(lp, made, 0);
        printf("launch.0=%s\n", cq_err(r));
        for (int i = 0; i < made; i++) cuStreamSynchronize(g_st[i]);
        used(0, "used.0");
    } else if (strcmp(mode, "ex") == 0) {
        for (int i = 0; i < made; i++) {
            CK(cuCtxSetCurrent(c0));
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = g_st[i];
            CUresult r = cuLaunchKernelEx(&cfg, (CUfunction)g_k, NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuStreamSynchronize(g_st[i]);
            used(0, "used.0");
        }
    } else if (race) {
        /* unloadrace: k (50 ms a launch) launched onto the primary's NULL stream, the primary current: first
         * (measured), then a second one (on which the SM throttle waits ~460 ms) while thread B, 100 ms later,
         * resets the primary context (its code and globals freed, the seen set forgotten, the shim measures; a
         * created context stays live so nothing re-adopts the device). The last launch took the fast path before
         * the throttle's wait and reloads the library after the reset: never measured. unloadseq (CONTROL): B
         * runs and is joined before the last launch. Then the fill (on the primary). */
        int seq = strcmp(mode, "unloadseq") == 0;
        g_delay_ms = seq ? 0 : 100;
        CK(cuCtxSetCurrent(c0));
        for (int i = 0; i < 1; i++) {
            double t0 = now_ms();
            CUresult r = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            cuCtxSynchronize();
            printf("warm.%d=%s %.0f ms\n", i, cq_err(r), now_ms() - t0);
        }
        used(0, "used.0");
        pthread_t t;
        pthread_create(&t, NULL, unload_thread, NULL);
        if (seq) pthread_join(t, NULL);
        CK(cuCtxSetCurrent(c0));
        double t0 = now_ms();
        CUresult r = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        printf("launch.0=%s\nlaunch.ms=%.0f\n", cq_err(r), now_ms() - t0);
        cuCtxSynchronize();
        if (!seq) pthread_join(t, NULL);
        used(0, "used.0");
    } else if (strcmp(mode, "gdev1") == 0) {
        /* two devices: N libraries (G each), a graph of each kernel instantiated with device 0's primary
         * current, launched onto a stream of device 1's primary with device 0's current. used.1= after each. */
        CUdevice d1;
        CK(cuDeviceGet(&d1, 1));
        CUcontext c1;
        CK(cuDevicePrimaryCtxRetain(&c1, d1));
        CK(cuCtxSetCurrent(c1));
        CUstream s1;
        CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        CK(cuCtxSetCurrent(c0));
        for (int i = 0; i < n; i++) {
            CUlibrary l;
            CK(cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0));
            CUkernel kk;
            CK(cuLibraryGetKernel(&kk, l, "k"));
            CUgraph gr;
            CK(cuGraphCreate(&gr, 0));
            CUDA_KERNEL_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.func = (CUfunction)kk;
            p.gridDimX = p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = p.blockDimY = p.blockDimZ = 1;
            CUgraphNode node;
            CK(cuGraphAddKernelNode(&node, gr, NULL, 0, &p));
            CUgraphExec e;
            CK(cuGraphInstantiate(&e, gr, 0));
            CUresult r = cuGraphLaunch(e, s1);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuStreamSynchronize(s1);
            used(1, "used.1");
        }
        CK(cuCtxSetCurrent(c1));
        int k = 0;
        for (; k < 256; k++) {
            CUdeviceptr p;
            if (cuMemAlloc(&p, 64ull << 20) != CUDA_SUCCESS) break;
        }
        printf("fill=%d\n", k);
        used(1, "used.1");
        return 0;
    } else if (strcmp(mode, "unknown") == 0 || strcmp(mode, "knownmod") == 0) {
        /* two devices: device 0 put over its cap by one lazy load (k launched, G bytes); then on device 1 (empty)
         * a function looked up in a module of device 1: from cuLibraryGetModule (unknown) or cuModuleLoadData
         * (known, CONTROL). Prints lookup=. */
        CUresult r = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        printf("launch.0=%s\n", cq_err(r));
        used(0, "used.0");
        CUdevice d1;
        CK(cuDeviceGet(&d1, 1));
        CUcontext c1;
        CK(cuDevicePrimaryCtxRetain(&c1, d1));
        CK(cuCtxSetCurrent(c1));
        const char *small = "CUDASIM-MODULE 1\nkernel k 1000\nglobal g 1048576\n";
        CUmodule m;
        if (strcmp(mode, "unknown") == 0) {
            CUlibrary l;
            CK(cuLibraryLoadData(&l, small, NULL, NULL, 0, NULL, NULL, 0));
            CK(cuLibraryGetModule(&m, l));
        } else {
            CK(cuModuleLoadData(&m, small));
        }
        CUfunction f;
        r = cuModuleGetFunction(&f, m, "k");
        printf("lookup=%s\n", cq_err(r));
        used(1, "used.1");
        return 0;
    } else if (strcmp(mode, "ctxcheck") == 0) {
        CK(cuCtxSetCurrent(c0));
        CUresult r = cuLaunchKernel((CUfunction)g_k, 1, 1, 1, 1, 1, 1, 0, g_st[made - 1], NULL, NULL);
        CUcontext cur = NULL;
        cuCtxGetCurrent(&cur);
        CUcontext popped = NULL;
        CUresult pr = cuCtxPopCurrent(&popped);
        CUcontext after = (CUcontext)1;
        cuCtxGetCurrent(&after);
        printf("launch.0=%s\ncur.same=%d\npop=%s popped.same=%d after.null=%d\n", cq_err(r), cur == c0, cq_err(pr),
               popped == c0, after == NULL);
        CK(cuCtxSetCurrent(c0));
        used(0, "used.0");
    }
    CK(cuCtxSetCurrent(c0));
    int k = 0;
    for (; k < 256; k++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 64ull << 20) != CUDA_SUCCESS) break;
    }
    printf("fill=%d\n", k);
    used(0, "used.0");
    return 0;
}

/* first_use_streams: the driver runs a launch, and lazily loads a library's code and globals (and grows the
 * stack), in the context of the launch's STREAM, and a module's globals in the MODULE's context, whatever
 * context is current (hooks/context.rs `first_launch`, `first_use`; found by a hostile review: keyed and
 * measured by the current context, a CUkernel launched onto another context's stream was measured once, or never).
 *
 *   first_use_streams same G N own|cross   one device: a library with one kernel and a G-byte __device__ global;
 *                                            N contexts (cuCtxCreate) with a stream each; the kernel launched onto
 *                                            each stream with that stream's context current (own) or with the
 *                                            primary context current throughout (cross).
 *   first_use_streams dev1 G M own|cross   two devices: M libraries with a G-byte global each, all loaded first; each kernel
 *                                            launched onto a stream of device 1's primary context with device 1's
 *                                            context current (own) or device 0's (cross).
 *   first_use_streams modglobal G M own|cross  two devices: M modules (cuModuleLoadData of PTX with one G-byte
 *                                            .global each, which the driver allocates in the module's context at
 *                                            its first cuModuleGetGlobal) loaded in device 1's primary context;
 *                                            each global looked up with device 1's context current (own) or
 *                                            device 0's (cross).
 * An optional 5th argument L gives the kernel L bytes of local memory a thread (G may then be 0: no global):
 * its first launch in each context grows that context's stack.
 * Prints launch.i=, used.d= (the simulator's own used bytes after each launch), then fill=: cuMemAlloc 64 MiB
 * on the stream's device until refused, and used.d= again.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_streams"
#include "cq_fill.h"

static unsigned long long g_local; /* argv[5]: local memory per thread of the kernel (stack growth), or 0 */
static CUkernel load_kernel(unsigned long long g) {
    char image[256];
    if (g)
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000 %llu\nglobal g %llu\n", g_local, g);
    else
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000 %llu\n", g_local);
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CK(cuLibraryGetKernel(&k, lib, "k"));
    return k;
}

static void fill_on(CUcontext ctx, unsigned dev, const char *key) {
    CK(cuCtxSetCurrent(ctx));
    int n = 0;
    for (; n < 256; n++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 64ull << 20) != CUDA_SUCCESS) break;
    }
    printf("fill=%d\n", n);
    used(dev, key);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: first_use_streams same|dev1|modglobal G N own|cross [L]\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long g = cq_size(argv[2]);
    int n = atoi(argv[3]);
    if (n > 15) n = 15;
    int cross = strcmp(argv[4], "cross") == 0;
    g_local = argc > 5 ? cq_size(argv[5]) : 0;
    CUdevice d0;
    CUcontext c0 = primary0(&d0);
    if (strcmp(mode, "same") == 0) {
        CUkernel k = load_kernel(g);
        CUcontext ctx[16];
        CUstream st[16];
        int made = 0;
        for (int i = 0; i < n; i++) {
            CUresult r = cuCtxCreate(&ctx[i], NULL, 0, d0);
            printf("ctx.%d=%s\n", i, cq_err(r));
            if (r) break;
            CK(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
            made++;
        }
        used(0, "used.0");
        for (int i = 0; i < made; i++) {
            CK(cuCtxSetCurrent(cross ? c0 : ctx[i]));
            CUresult r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, st[i], NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuStreamSynchronize(st[i]);
            used(0, "used.0");
        }
        fill_on(c0, 0, "used.0");
    } else if (strcmp(mode, "modglobal") == 0) {
        CUdevice d1;
        CK(cuDeviceGet(&d1, 1));
        CUcontext c1;
        CK(cuDevicePrimaryCtxRetain(&c1, d1));
        CK(cuCtxSetCurrent(c1));
        CUmodule ms[16];
        char ptx[512];
        snprintf(ptx, sizeof ptx,
                 ".version 8.0\n.target sm_90\n.address_size 64\n.visible .global .align 8 .b8 g[%llu];\n"
                 ".visible .entry k() { ret; }\n", g);
        for (int i = 0; i < n; i++) CK(cuModuleLoadData(&ms[i], ptx));
        used(1, "used.1");
        for (int i = 0; i < n; i++) {
            CK(cuCtxSetCurrent(cross ? c0 : c1));
            CUdeviceptr p;
            size_t bytes;
            CUresult r = cuModuleGetGlobal(&p, &bytes, ms[i], "g");
            printf("global.%d=%s\n", i, cq_err(r));
            used(1, "used.1");
        }
        fill_on(c1, 1, "used.1");
    } else {
        CUdevice d1;
        CK(cuDeviceGet(&d1, 1));
        CUcontext c1;
        CK(cuDevicePrimaryCtxRetain(&c1, d1));
        CK(cuCtxSetCurrent(c1));
        CUstream s1;
        CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        used(1, "used.1");
        CUkernel ks[16];
        for (int i = 0; i < n; i++) ks[i] = load_kernel(g); /* all loaded (lazily: nothing taken yet) first */
        for (int i = 0; i < n; i++) {
            CK(cuCtxSetCurrent(cross ? c0 : c1));
            CUresult r = cuLaunchKernel((CUfunction)ks[i], 1, 1, 1, 1, 1, 1, 0, s1, NULL, NULL);
            printf("launch.%d=%s\n", i, cq_err(r));
            cuStreamSynchronize(s1);
            used(1, "used.1");
        }
        fill_on(c1, 1, "used.1");
    }
    return 0;
}

/* reconcile: memory the driver takes on paths no allocation call names (issue #21, items 1-3). One subcommand per
 * way; each takes it, then fills the device with CHUNK-sized cuMemAlloc calls until one fails (at most 256), and
 * prints the simulator's own used bytes (NVML, past any interposer) as used= lines, so a test can compare them
 * with the cap.
 *
 *   reconcile lazy_global SIZE CHUNK N   N libraries, each with a SIZE `__device__` global, loaded lazily
 *                                        (cuLibraryLoadData): the driver takes the memory at cuLibraryGetGlobal.
 *                                        Prints load.I=, global.I=<result> (a failed load's).
 *   reconcile lazy_launch SIZE CHUNK     a library whose global takes SIZE when its kernel is first launched
 *                                        (a CUkernel, as the CUDA runtime launches).             launch=<result>
 *   reconcile stack LOCAL CHUNK          a kernel with LOCAL bytes of local memory per thread: its first launch
 *                                        makes the driver grow the stack for every thread.       launch=<result>
 *   reconcile pool_other N CHUNK         N allocations of CHUNK from device 1's default pool on device 0's stream
 *                                        (device 0 current). Prints pool.ok=, used1=<device 1's used bytes>.
 *   reconcile bypass SIZE CHUNK          SIZE taken through libcuda's own cuMemAlloc_v2 (found in its ELF symbol
 *                                        table: no interposer sees it).                          bypass=<result>
 * Always: fill.count=, fill.rc=, used=, info.free= (cuMemGetInfo after the fill).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "reconcile"
#include "cq_fill.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: reconcile MODE A B [N]\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long a = cq_size(argv[2]), chunk = cq_size(argv[3]);
    CUdevice d0;
    primary0(&d0);
    used(0, "used");
    char image[256];
    if (strcmp(mode, "lazy_global") == 0) {
        int libs = argc > 4 ? atoi(argv[4]) : 1;
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000\nglobal g %llu\n", a);
        for (int i = 0; i < libs; i++) {
            CUlibrary lib;
            CUresult r = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
            printf("load.%d=%s\n", i, cq_err(r));
            CUdeviceptr g;
            size_t n;
            printf("global.%d=%s\n", i, r ? cq_err(r) : cq_err(cuLibraryGetGlobal(&g, &n, lib, "g")));
            used(0, "used");
        }
    } else if (strcmp(mode, "lazy_launch") == 0) {
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000\nglobal g %llu\n", a);
        CUlibrary lib;
        CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
        CUkernel k;
        CK(cuLibraryGetKernel(&k, lib, "k"));
        CUresult r = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        printf("launch=%s\n", cq_err(r));
        CK(cuCtxSynchronize());
        used(0, "used");
    } else if (strcmp(mode, "stack") == 0) {
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000 %llu\n", a);
        CUmodule m;
        CK(cuModuleLoadData(&m, image));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        printf("launch=%s\n", cq_err(r));
        CK(cuCtxSynchronize());
        used(0, "used");
    } else if (strcmp(mode, "pool_other") == 0) {
        CUmemoryPool pool;
        CK(cuDeviceGetDefaultMemPool(&pool, 1));
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
    } else if (strcmp(mode, "bypass") == 0) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*alloc)(CUdeviceptr *, size_t) =
            cuda ? (CUresult(*)(CUdeviceptr *, size_t))cq_elf_sym(cuda, "cuMemAlloc_v2") : NULL;
        if (!alloc) {
            fprintf(stderr, "reconcile: libcuda's own cuMemAlloc_v2 not found\n");
            return 2;
        }
        CUdeviceptr p;
        printf("bypass=%s\n", cq_err(alloc(&p, a)));
        used(0, "used");
    } else {
        fprintf(stderr, "reconcile: unknown mode %s\n", mode);
        return 2;
    }
    fill(chunk);
    return 0;
}

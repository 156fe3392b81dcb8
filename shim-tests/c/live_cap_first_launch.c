/* live_cap_first_launch: a module loaded while no limit applies (launches forwarded by the exports' pass-through), then
 * a memory cap set live by the agent, then the kernels' FIRST launches, each through another entry point; every
 * kernel has LOCAL bytes of local memory (the simulator grows the context's stack at its first launch).
 *
 *   live_cap_first_launch LOCAL GOFILE
 *
 * Prints ready=1, waits until GOFILE exists, then for each path launch.PATH=<result> and used= (the simulator's
 * own used bytes, past any interposer).
 */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "live_cap_first_launch"
#include "cq_fill.h"

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    unsigned long long local = cq_size(argv[1]);
    CUdevice d0;
    primary0(&d0);
    char image[512];
    snprintf(image, sizeof image,
             "CUDASIM-MODULE 1\nkernel a 1000 %llu\nkernel b 1000 %llu\nkernel c 1000 %llu\nkernel d 1000 %llu\n",
             local, local, local, local);
    CUmodule m;
    CK(cuModuleLoadData(&m, image));
    CUfunction fa, fb, fc, fd;
    CK(cuModuleGetFunction(&fa, m, "a"));
    CK(cuModuleGetFunction(&fb, m, "b"));
    CK(cuModuleGetFunction(&fc, m, "c"));
    CK(cuModuleGetFunction(&fd, m, "d"));
    /* Resolved while unlimited, as the runtime does. */
    CUresult (*gpa_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                         void **, void **) = NULL;
    CUdriverProcAddressQueryResult st;
    CK(cuGetProcAddress_v2("cuLaunchKernel", (void **)&gpa_ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                           &st));
    CUresult (*dl_ex)(const CUlaunchConfig *, CUfunction, void **, void **) =
        (CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **))dlsym(RTLD_DEFAULT, "cuLaunchKernelEx");
    used(0, "used");
    printf("ready=1\n");
    fflush(stdout);
    while (access(argv[2], F_OK) != 0) usleep(10000);
    CUresult r = cuLaunchKernel(fa, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("launch.kernel=%s\n", cq_err(r));
    cuCtxSynchronize();
    used(0, "used");
    r = gpa_ptsz(fb, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("launch.gpa_ptsz=%s\n", cq_err(r));
    cuCtxSynchronize();
    used(0, "used");
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = c.blockDimY = c.blockDimZ = 1;
    r = dl_ex ? dl_ex(&c, fc, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
    printf("launch.dlsym_ex=%s\n", cq_err(r));
    cuCtxSynchronize();
    used(0, "used");
    CK(cuFuncSetBlockShape(fd, 1, 1, 1));
    r = cuLaunchGrid(fd, 1, 1);
    printf("launch.grid=%s\n", cq_err(r));
    cuCtxSynchronize();
    used(0, "used");
    return 0;
}

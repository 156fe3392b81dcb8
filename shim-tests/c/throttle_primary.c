/* throttle_primary.c (issue 21 item 5): long kernels on a context made by cuCtxCreate; after each launch the
 * (idle) primary context of the same device is retained+released (MODE release) or reset (MODE reset). Before the
 * fix, the release or reset of a primary context ended the probe of every context of the device (charged the wall
 * time until the idle context ended, while the kernel ran on): a 30 % tenant got 100 %. Now only probes recorded
 * in the primary context itself end (its handle is learnt at its retain).
 *
 *   throttle_primary MODE SECONDS KERNEL_NS
 * Output: pid, t0_ns, end_ns, launches. */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int reset = !strcmp(argv[1], "reset"), none = !strcmp(argv[1], "none");
    double secs = atof(argv[2]);
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %s\n", argv[3]);
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    int sms;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CUcontext a;
    CK(cuCtxCreate(&a, NULL, 0, d));
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f, m, "k"));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        n++;
        if (none) continue;
        if (reset) {
            CK(cuDevicePrimaryCtxReset(d));
        } else {
            CUcontext p;
            CK(cuDevicePrimaryCtxRetain(&p, d));
            CK(cuDevicePrimaryCtxRelease(d));
        }
        CK(cuCtxSetCurrent(a));
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    fflush(stdout);
    _exit(0);
}

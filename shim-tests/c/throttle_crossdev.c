/* throttle_crossdev.c (issue 21 item 5): one CUkernel launched on two devices whose kernels take different times
 * (device 1 has fewer SMs). Before the fix the estimate was keyed (function, grid, block) with no device and a
 * probe below half the estimate replaced it at once (a longer one moved it a quarter of the way), so device 0's
 * short probes kept it short and device 1's long launches went at ~the fast time: a 30 % tenant got 100 % there.
 *
 *   throttle_crossdev MODE SECONDS NS_PER_WAVE
 * MODE both: alternate launches on device 0 and device 1; only1: device 1 alone (control).
 * Output: pid, t0_ns, end_ns, launches (as throttle_debt.c). */
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
    int both = !strcmp(argv[1], "both");
    double secs = atof(argv[2]);
    unsigned long long ns = strtoull(argv[3], NULL, 10);
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\n", ns);
    CK(cuInit(0));
    CUdevice d0, d1;
    CK(cuDeviceGet(&d0, 0));
    CK(cuDeviceGet(&d1, 1));
    int sms0;
    CK(cuDeviceGetAttribute(&sms0, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d0));
    CUcontext c0, c1;
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuDevicePrimaryCtxRetain(&c1, d1));
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CK(cuLibraryGetKernel(&k, lib, "k"));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long launches = 0;
    while (now_ns() < until) {
        if (both) {
            CK(cuCtxSetCurrent(c0));
            CK(cuLaunchKernel((CUfunction)k, (unsigned)sms0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        }
        CK(cuCtxSetCurrent(c1));
        CK(cuLaunchKernel((CUfunction)k, (unsigned)sms0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        launches++;
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, launches);
    fflush(stdout);
    _exit(0);
}

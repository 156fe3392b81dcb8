/* cq_kernel.h: what the throttle test programs share: a monotonic clock, a checked driver call, and the
 * simulator's kernels (a CUDASIM-MODULE text module) loaded in the primary context of device 0. */
#ifndef CQ_KERNEL_H
#define CQ_KERNEL_H
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define CK(x)                                                                                                     \
    do {                                                                                                          \
        CUresult r_ = (x);                                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                                 \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, (int)r_);                                 \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* cuInit, device 0 (its SM count in *sms), its primary context made current, `image` loaded. */
static inline CUmodule cq_primary_module(const char *image, int *sms) {
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    CK(cuDeviceGetAttribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CUcontext c;
    CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    CUmodule m;
    CK(cuModuleLoadData(&m, image));
    return m;
}
#endif

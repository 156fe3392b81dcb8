/* cq_elastic.h: what the elastic tenants share (shim-tests/c/elastic_tenant.c, bench/elastic_goals.c): a checked
 * driver call that prints which one failed (`fail=<call>:<line>:<error>`) and exits 1, and the simulator's
 * memory-touching kernel, loaded in device 0's primary context. Linked with -lcuda (the simulator). */
#ifndef CQ_ELASTIC_H
#define CQ_ELASTIC_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "cq_driver.h"
#include "cq_vmm.h"

#define CK(x)                                                                                                     \
    do {                                                                                                          \
        CUresult r_ = (x);                                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                                 \
            printf("fail=%s:%d:%s\n", #x, __LINE__, cq_err(r_));                                                 \
            fflush(stdout);                                                                                       \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* cuInit, device 0's primary context made current; returns the kernel that adds 1 to every byte of a buffer. */
static inline CUfunction cq_elastic_init(void) {
    static const char *module = "CUDASIM-MODULE 1\n"
                                "kernel inc 1000\n"
                                "touch inc add p0 p1 1\n";
    CK(cuInit(0));
    CK(cq_use_device(0));
    CUmodule m;
    CK(cuModuleLoadData(&m, module));
    CUfunction inc;
    CK(cuModuleGetFunction(&inc, m, "inc"));
    return inc;
}

/* Launches `inc` on the `n` bytes at `p` (on the legacy stream; not waited for). */
static inline void cq_inc(CUfunction inc, CUdeviceptr p, size_t n) {
    void *args[] = {&p, &n};
    CK(cuLaunchKernel(inc, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
}
#endif

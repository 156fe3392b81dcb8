/* elastic_common.h: what bench/driver_facts.c and bench/evict_restore.c share: clocks, error names, VMM helpers
 * (with shim-tests/c/cq_vmm.h, which the simulator's elastic.c also uses) and the memory-touching kernel, as PTX
 * on a GPU and as a text module on the simulator (which exports cudasimDeviceBusyNs). Linked with -lcuda (the
 * simulator in tests, a stub at staging, NVIDIA's driver on a GPU). */
#ifndef ELASTIC_COMMON_H
#define ELASTIC_COMMON_H
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../shim-tests/c/cq_vmm.h"

#define MIB ((size_t)1 << 20)

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline const char *ename(CUresult r) {
    const char *s = NULL;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "an unknown error";
}

/* Exits the program (a fact's child, or the bench) naming the call that failed. */
#define CK(x)                                                                                                     \
    do {                                                                                                          \
        CUresult r_ = (x);                                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                                 \
            fprintf(stderr, "%s:%d: %s = %s\n", __FILE__, __LINE__, #x, ename(r_));                               \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* `s` (a setting or argument named `what`) as a whole number in [lo, hi]; anything else exits 2 saying so. */
static inline unsigned long long parse_num(const char *what, const char *s, unsigned long long lo,
                                           unsigned long long hi) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = s && *s && *s != '-' ? strtoull(s, &end, 10) : 0;
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "invalid %s=%s: a whole number from %llu to %llu\n", what, s ? s : "", lo, hi);
        exit(2);
    }
    return v;
}

static inline int on_simulator(void) { return dlsym(RTLD_DEFAULT, "cudasimDeviceBusyNs") != NULL; }

/* Read-write access for device `dev` to [p, p + n). */
static inline CUresult vmm_access(CUdeviceptr p, size_t n, CUdevice dev) {
    return cq_vmm_set_access(p, n, dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

/* The minimum granularity of allocations at `type`/`id` (0 when the driver refuses the location). */
static inline size_t vmm_granularity(CUmemLocationType type, int id) {
    CUmemAllocationProp p = cq_vmm_prop_at(type, id);
    size_t g = 0;
    return cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS ? g : 0;
}

static inline size_t round_up(size_t n, size_t g) { return g ? (n + g - 1) / g * g : n; }

/* touch_add(p, n, spin_ns): spins spin_ns (GPU: %globaltimer), then adds 1 to each of the n bytes at p. */
static const char TOUCH_PTX[] = ".version 7.0\n"
                                ".target sm_50\n"
                                ".address_size 64\n"
                                ".visible .entry touch_add(.param .u64 p, .param .u64 n, .param .u64 ns)\n"
                                "{\n"
                                "  .reg .u64 %a, %n, %ns, %t0, %t1, %d, %i, %stride, %addr;\n"
                                "  .reg .u32 %r<6>;\n"
                                "  .reg .u16 %b;\n"
                                "  .reg .pred %p;\n"
                                "  ld.param.u64 %a, [p];\n"
                                "  ld.param.u64 %n, [n];\n"
                                "  ld.param.u64 %ns, [ns];\n"
                                "  cvta.to.global.u64 %a, %a;\n"
                                "  mov.u64 %t0, %globaltimer;\n"
                                "SPIN:\n"
                                "  mov.u64 %t1, %globaltimer;\n"
                                "  sub.u64 %d, %t1, %t0;\n"
                                "  setp.lt.u64 %p, %d, %ns;\n"
                                "  @%p bra SPIN;\n"
                                "  mov.u32 %r1, %ctaid.x;\n"
                                "  mov.u32 %r2, %ntid.x;\n"
                                "  mov.u32 %r3, %tid.x;\n"
                                "  mad.lo.u32 %r4, %r1, %r2, %r3;\n"
                                "  cvt.u64.u32 %i, %r4;\n"
                                "  mov.u32 %r5, %nctaid.x;\n"
                                "  mul.lo.u32 %r5, %r5, %r2;\n"
                                "  cvt.u64.u32 %stride, %r5;\n"
                                "LOOP:\n"
                                "  setp.ge.u64 %p, %i, %n;\n"
                                "  @%p bra DONE;\n"
                                "  add.u64 %addr, %a, %i;\n"
                                "  ld.global.u8 %b, [%addr];\n"
                                "  add.u16 %b, %b, 1;\n"
                                "  st.global.u8 [%addr], %b;\n"
                                "  add.u64 %i, %i, %stride;\n"
                                "  bra LOOP;\n"
                                "DONE:\n"
                                "  ret;\n"
                                "}\n";

/* The simulator's touch_add: 1 us a wave, adding 1 to p1 bytes at p0 at its end on the timeline; spin touches
 * nothing (while a touch kernel is pending the simulator moves copies' bytes at their end instead of at the call). */
static const char TOUCH_SIM[] = "CUDASIM-MODULE 1\n"
                                "kernel touch_add 1000\n"
                                "touch touch_add add p0 p1 1\n"
                                "kernel spin 1000\n";

static inline CUfunction load_kernel(const char *sim_name) {
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, on_simulator() ? TOUCH_SIM : TOUCH_PTX));
    CK(cuModuleGetFunction(&f, m, on_simulator() ? sim_name : "touch_add"));
    return f;
}

static inline CUfunction touch_kernel(void) { return load_kernel("touch_add"); }

/* A kernel that only takes time: launch it with launch_touch(f, s, dev, 0, 0, ns) (on a GPU, touch_add of 0 bytes). */
static inline CUfunction spin_kernel(void) { return load_kernel("spin"); }

/* Launches touch_add on `s`: on a GPU 2 blocks of 256 threads per SM that spin spin_ns; on the simulator as many
 * 1 us waves as make spin_ns (its kernels last waves x ns per wave). */
static inline CUresult launch_touch(CUfunction f, CUstream s, CUdevice dev, CUdeviceptr p, uint64_t n,
                                    uint64_t spin_ns) {
    int sms = 1;
    CUresult r = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    if (r != CUDA_SUCCESS) return r;
    uint64_t ptr = p, ns = spin_ns;
    void *params[] = {&ptr, &n, &ns};
    if (on_simulator()) {
        uint64_t waves = spin_ns / 1000 + 1;
        return cuLaunchKernel(f, (unsigned)(sms * waves), 1, 1, 1, 1, 1, 0, s, params, NULL);
    }
    return cuLaunchKernel(f, (unsigned)sms * 2, 1, 1, 256, 1, 1, 0, s, params, NULL);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static inline uint64_t median_u64(uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return v[n / 2];
}

/* cuInit, device 0, its primary context current. */
static inline CUdevice primary_device(void) {
    CUdevice d;
    CUcontext c;
    CK(cuInit(0));
    CK(cuDeviceGet(&d, 0));
    CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    return d;
}
#endif

/* cq_fill.h: what the memory attack programs (reconcile.c, first_use.c) print after taking memory, judged by the
 * simulator's own figures. Include after cuda.h, cq_driver.h and cq_elf.h; the includer defines PROG (its name,
 * for error messages).
 */
#ifndef CQ_FILL_H
#define CQ_FILL_H

static void die(const char *what, CUresult r) {
    fprintf(stderr, "%s: %s failed: %d\n", PROG, what, (int)r);
    exit(2);
}
#define CK(call)                                                                                                \
    do {                                                                                                        \
        CUresult r_ = (call);                                                                                   \
        if (r_ != CUDA_SUCCESS) die(#call, r_);                                                                 \
    } while (0)

/* cuInit, then device 0's primary context retained and made current (its device in *dev). */
static inline CUcontext primary0(CUdevice *dev) {
    CK(cuInit(0));
    CK(cuDeviceGet(dev, 0));
    CUcontext c;
    CK(cuDevicePrimaryCtxRetain(&c, *dev));
    CK(cuCtxSetCurrent(c));
    return c;
}

/* The simulator's used bytes of device `dev` (its NVML, past any interposer), as `key=`. */
static void used(unsigned dev, const char *key) {
    cq_rawmem m;
    if (cq_raw_nvml_mem(dev, &m)) {
        fprintf(stderr, "%s: simulator NVML unreachable\n", PROG);
        exit(2);
    }
    printf("%s=%llu\n", key, m.used);
    fflush(stdout);
}

/* cuMemAlloc of `chunk` until one fails (at most 256), then fill.count=, fill.rc=, used=, info.rc=, info.free=. */
static void fill(unsigned long long chunk) {
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    for (; n < 256; n++) {
        CUdeviceptr p;
        r = cuMemAlloc(&p, chunk);
        if (r != CUDA_SUCCESS) break;
    }
    printf("fill.count=%d\nfill.rc=%s\n", n, cq_err(r));
    used(0, "used");
    size_t f = 0, t = 0;
    r = cuMemGetInfo(&f, &t);
    printf("info.rc=%s\ninfo.free=%zu\n", cq_err(r), f);
}

#endif

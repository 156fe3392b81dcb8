/* alloc_probe: the demo. Shows the GPU memory a program sees and how much it can allocate.
 *
 *   alloc_probe [CHUNK]     (default 256m; k/m/g suffixes)
 *
 * Prints what cuMemGetInfo / cuDeviceTotalMem report, then allocates CHUNK-sized pieces with cuMemAlloc until
 * the driver (or cuquota) refuses, and frees them. Linked with -lcuda, like most driver-API programs.
 * Output lines are `key=value` so tests can read them too.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static const char *name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) {
        static char buf[32];
        snprintf(buf, sizeof buf, "CUresult %d", (int)r);
        return buf;
    }
    return s;
}

#define CHECK(call)                                                                                           \
    do {                                                                                                      \
        CUresult r_ = (call);                                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                                             \
            printf("error=%s failed: %s\n", #call, name(r_));                                                 \
            return 1;                                                                                         \
        }                                                                                                     \
    } while (0)

int main(int argc, char **argv) {
    unsigned long long chunk = 256ull << 20;
    if (argc > 1) {
        char *end = NULL;
        chunk = strtoull(argv[1], &end, 0);
        switch (*end) {
        case 'g': case 'G': chunk <<= 10; /* fall through */
        case 'm': case 'M': chunk <<= 10; /* fall through */
        case 'k': case 'K': chunk <<= 10; break;
        default: break;
        }
    }
    CUdevice dev;
    CUcontext ctx;
    char devname[128] = "?";
    size_t free_b = 0, total_b = 0, devtotal = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    cuDeviceGetName(devname, sizeof devname, dev);
    CHECK(cuDeviceTotalMem(&devtotal, dev));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("device=%s\n", devname);
    printf("device_total_mib=%llu\n", (unsigned long long)(devtotal >> 20));
    printf("meminfo_total_mib=%llu\nmeminfo_free_mib=%llu\n", (unsigned long long)(total_b >> 20),
           (unsigned long long)(free_b >> 20));

    static CUdeviceptr ptrs[1 << 16];
    int n = 0;
    CUresult last = CUDA_SUCCESS;
    while (n < (int)(sizeof ptrs / sizeof ptrs[0])) {
        last = cuMemAlloc(&ptrs[n], chunk);
        if (last != CUDA_SUCCESS) break;
        n++;
    }
    printf("chunk_mib=%llu\nallocated_chunks=%d\nallocated_mib=%llu\nstopped_by=%s\n",
           chunk >> 20, n, (unsigned long long)n * chunk >> 20, name(last));
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("meminfo_free_mib_when_full=%llu\n", (unsigned long long)(free_b >> 20));
    for (int i = 0; i < n; i++) CHECK(cuMemFree(ptrs[i]));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

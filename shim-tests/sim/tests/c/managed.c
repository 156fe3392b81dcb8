/* Unified memory as the baseline elastic memory is measured against (issue 39 item 1), run by tests/smoke.rs
 * with CUDASIM_MANAGED=migrate and without (the control: managed memory resident and charged whole):
 *   managed pages — prints "A B C first second": device bytes used (MiB, cuMemGetInfo; NVML's used memory must
 *                   agree) after cuMemAllocManaged of 16 MiB, after a kernel read 3 MiB of it across two 2 MiB
 *                   units, after a kernel read all of it; then the ms (events) of a kernel reading all 16 MiB
 *                   after the partial read only (6 units to migrate) and of the same kernel again;
 *   managed evict — 480 MiB managed, written by a kernel, its first 64 MiB touched again (most recently used);
 *                   then another process (this program, `alloc`) creates a context and cuMemAlloc's 400 MiB on
 *                   the 1 GiB device. Prints "rc evicted recent all own again": the child's cuMemAlloc result,
 *                   the MiB this process's usage dropped by, the ms of a kernel reading the first 64 MiB again
 *                   and of one adding 1 to all 480 MiB; then this process's own cuMemAlloc of 400 MiB (freed at
 *                   once) and the ms of adding 1 to all again; every byte is checked after (written + 3).
 * Prints "OK" last when every check passed. */
#include <cuda.h>
#include <nvml.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static const char *MODULE =
    "CUDASIM-MODULE 1\n"
    "kernel rd 1000\n"
    "touch rd read p0 p1\n"
    "kernel inc 1000\n"
    "touch inc add p0 p1 1\n"
    "kernel spin 1000000\n";

static CUfunction fn(CUmodule m, const char *name) {
    CUfunction f = NULL;
    CU(cuModuleGetFunction(&f, m, name));
    return f;
}

static CUresult launch(CUfunction f, uint64_t a, uint64_t b) {
    void *params[] = {&a, &b};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
}

/* Device memory used, MiB, by cuMemGetInfo; checks that NVML says the same. */
static double used_mib(void) {
    size_t free_b = 0, total = 0;
    CU(cuMemGetInfo(&free_b, &total));
    nvmlDevice_t d;
    nvmlMemory_t mem;
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetMemoryInfo(d, &mem) == NVML_SUCCESS);
    CHECK(mem.used == total - free_b);
    return (double)(total - free_b) / MB;
}

/* The ms, on the device timeline, of launching f over [p, p+n): queued behind a 200 ms kernel so the host's
 * speed at issuing the calls does not enter the figure. */
static double timed(CUmodule m, CUfunction f, CUdeviceptr p, size_t n) {
    CUevent a, b;
    CU(cuEventCreate(&a, 0));
    CU(cuEventCreate(&b, 0));
    CU(cuLaunchKernel(fn(m, "spin"), 800, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(cuEventRecord(a, NULL));
    CU(launch(f, p, n));
    CU(cuEventRecord(b, NULL));
    CU(cuCtxSynchronize());
    float ms = -1;
    CU(cuEventElapsedTime(&ms, a, b));
    CU(cuEventDestroy(a));
    CU(cuEventDestroy(b));
    return ms;
}

static void pages(CUmodule m) {
    const size_t N = 16 * MB;
    CUdeviceptr p = 0;
    double before = used_mib();
    CU(cuMemAllocManaged(&p, N, CU_MEM_ATTACH_GLOBAL));
    double a = used_mib() - before;
    CU(launch(fn(m, "rd"), p + 1 * MB, 3 * MB));
    CU(cuCtxSynchronize());
    double b = used_mib() - before;
    double first = timed(m, fn(m, "rd"), p, N);
    double c = used_mib() - before;
    double second = timed(m, fn(m, "rd"), p, N);
    printf("%.0f %.0f %.0f %.3f %.3f\n", a, b, c, first, second);
    CU(cuMemFree(p));
    CHECK(used_mib() == before);
}

static unsigned char at(size_t i) { return (unsigned char)(i * 31 + (i >> 20)); }

static void evict(CUmodule m, const char *self) {
    const size_t N = 480 * MB;
    CUdeviceptr p = 0;
    CU(cuMemAllocManaged(&p, N, CU_MEM_ATTACH_GLOBAL));
    unsigned char *h = malloc(N);
    for (size_t i = 0; i < N; i++) h[i] = at(i);
    CU(cuMemcpyHtoD(p, h, N));
    CU(launch(fn(m, "inc"), p, N));
    CU(launch(fn(m, "rd"), p, 64 * MB));
    CU(cuCtxSynchronize());
    double before = used_mib();
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        execl(self, self, "alloc", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status));
    int rc = WEXITSTATUS(status);
    double evicted = before - used_mib();
    double recent = timed(m, fn(m, "rd"), p, 64 * MB);
    double all = timed(m, fn(m, "inc"), p, N);
    /* This process's own allocation evicts its own managed units the same way. */
    CUdeviceptr q = 0;
    CUresult own = cuMemAlloc(&q, 400 * MB);
    if (own == CUDA_SUCCESS) CU(cuMemFree(q));
    double again = timed(m, fn(m, "inc"), p, N);
    printf("%d %.0f %.3f %.3f %d %.3f\n", rc, evicted, recent, all, (int)own, again);
    memset(h, 0, N);
    CU(cuMemcpyDtoH(h, p, N));
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) bad += h[i] != (unsigned char)(at(i) + 3);
    CHECK(bad == 0);
    free(h);
    CU(cuMemFree(p));
}

/* The other process: a context and 400 MiB; exits with the cuMemAlloc result (memory freed at exit). */
static int alloc_other(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 126;
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc(&d, 400 * MB);
    if (r == CUDA_SUCCESS) {
        /* The memory is usable. */
        if (cuMemsetD8(d, 1, 400 * MB) || cuMemFree(d)) return 125;
    }
    return (int)r;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "alloc")) return alloc_other();
    CUdevice dev;
    CUcontext ctx;
    CUmodule m;
    CU(cuInit(0));
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuModuleLoadData(&m, MODULE));
    if (!strcmp(argv[1], "pages")) pages(m);
    else if (!strcmp(argv[1], "evict")) evict(m, argv[0]);
    else return 2;
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    if (failures == 0) printf("OK\n");
    return failures != 0;
}

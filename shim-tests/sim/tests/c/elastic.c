/* What elastic memory is tested against (issue 39 item 1), run by tests/smoke.rs:
 *   elastic touch   — kernels that touch memory: their writes are seen through copies (in stream order, at their
 *                     time on the timeline), and one that reads an unmapped, inaccessible or read-only-for-a-
 *                     write address fails its context with CUDA_ERROR_ILLEGAL_ADDRESS, sticky, while another
 *                     context goes on; unmapping after the synchronisation (the control) is fine;
 *   elastic host    — host VMM allocations (not charged to the device: cuMemGetInfo and NVML's usedGpuMemory
 *                     count device bytes only) and same-address remapping: device memory evicted to a host
 *                     allocation and restored at the same address, kernels and copies seeing each backing,
 *                     every byte checked;
 *   elastic peer    — VMM access is per device (2 devices): a kernel on device 1 touching device 0's VMM range
 *                     granted to device 0 only fails with CUDA_ERROR_ILLEGAL_ADDRESS although peer access is
 *                     enabled (it does not cover VMM memory); the control, granted to both, works, before and
 *                     after the range is remapped onto a host backing at the same address;
 *   elastic engines — copies per direction on their engines (CUDASIM_H2D_GBPS / CUDASIM_D2H_GBPS = 0.025),
 *                     figures from events: prints "h2d d2h h2d2 kernel" ends (ms after the start); the test
 *                     checks them (with engines: overlapped; without, the control: serialised).
 * Prints "OK" last when every check passed. */
#include <cuda.h>
#include <nvml.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../../../c/cq_vmm.h"
#include "check.h"

static const char *MODULE =
    "CUDASIM-MODULE 1\n"
    "kernel inc 1000\n"
    "touch inc add p0 p1 1\n"
    "kernel slow_inc 1000000\n"
    "touch slow_inc add p0 p1 1\n"
    "kernel rd 1000\n"
    "touch rd read p0 p1\n"
    "kernel slow_rd 1000000\n"
    "touch slow_rd read p0 p1\n"
    "kernel wr 1000\n"
    "touch wr fill p0 p1 p2\n"
    "kernel cp 1000\n"
    "touch cp copy p0 p1 p2\n"
    "kernel spin 1000000\n";

static CUfunction fn(CUmodule m, const char *name) {
    CUfunction f = NULL;
    CU(cuModuleGetFunction(&f, m, name));
    return f;
}

/* Launches f with 64-bit parameters on stream s; `blocks` waves of 4 SMs. */
static CUresult launch(CUfunction f, CUstream s, unsigned waves, uint64_t a, uint64_t b, uint64_t c) {
    void *params[] = {&a, &b, &c};
    return cuLaunchKernel(f, 4 * waves, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static void touch(CUmodule m) {
    const size_t N = 4 * MB;
    unsigned char *h = NULL;
    CU(cuMemAllocHost((void **)&h, N));
    CUdeviceptr a = 0, b = 0;
    CU(cuMemAlloc(&a, N));
    CU(cuMemAlloc(&b, N));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* A write through a kernel, seen by a synchronous copy right after the launch (stream order). */
    cq_pattern(h, N, 1);
    CU(cuMemcpyHtoD(a, h, N));
    CU(launch(fn(m, "inc"), NULL, 1, a, N, 0));
    memset(h, 0, N);
    CU(cuMemcpyDtoH(h, a, N));
    CHECK(cq_pattern_diff(h, N, 1, 1) == N);

    /* A slow kernel (50 ms) then an async copy into pinned memory: nothing moves before the kernel's time. */
    CU(launch(fn(m, "slow_inc"), s, 50, a, N, 0));
    CU(launch(fn(m, "cp"), s, 1, b, a, N));
    CU(cuMemcpyDtoHAsync(h, b, N, s));
    CU(cuStreamSynchronize(s));
    CHECK(cq_pattern_diff(h, N, 1, 2) == N);
    CU(launch(fn(m, "wr"), s, 1, b, N, 7));
    CU(cuMemcpyDtoHAsync(h, b, N, s));
    CU(cuStreamSynchronize(s));
    CHECK(h[0] == 7 && h[N - 1] == 7 && h[N / 2] == 7);

    /* In a graph a touch kernel is not modelled: launching it says so (the captured parameters are gone). */
    CUgraph gr;
    CUgraphExec ge;
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU(launch(fn(m, "inc"), s, 1, a, N, 0));
    CU(cuStreamEndCapture(s, &gr));
    CU(cuGraphInstantiateWithFlags(&ge, gr, 0));
    CHECK(cuGraphLaunch(ge, s) == CUDA_ERROR_NOT_SUPPORTED);
    CU(cuGraphExecDestroy(ge));
    CU(cuGraphDestroy(gr));

    /* A VMM range: readable-only refuses a write, accessible takes both. */
    size_t g = 0;
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CU(cuMemGetAllocationGranularity(&g, &dp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle hd;
    CUdeviceptr va = 0;
    CU(cuMemCreate(&hd, N, &dp, 0));
    CU(cuMemAddressReserve(&va, N, 0, 0, 0));
    CU(cuMemMap(va, N, 0, hd, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(launch(fn(m, "wr"), s, 1, va, N, 9));
    CU(launch(fn(m, "rd"), s, 1, va, N, 0));
    CU(cuStreamSynchronize(s));
    /* The control: a slow kernel reads the range, the range is unmapped only after the synchronisation. */
    CU(launch(fn(m, "slow_rd"), s, 20, va, N, 0));
    CU(cuStreamSynchronize(s));
    CU(cuMemUnmap(va, N));
    CU(cuMemMap(va, N, 0, hd, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
    CU(launch(fn(m, "rd"), s, 1, va, N, 0));
    CU(cuStreamSynchronize(s));
    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CU(cuMemGetAccess(&flags, &loc, va));
    CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READ);
    CU(cuMemUnmap(va, N));

    /* cuMemFree waits for the queued kernel that touches the memory, as the driver's synchronises. */
    CUdeviceptr z = 0;
    CU(cuMemAlloc(&z, N));
    CU(launch(fn(m, "slow_inc"), s, 20, z, N, 0));
    CU(cuMemFree(z));
    CU(cuStreamSynchronize(s));

    /* Faults, each in a context of its own (the error is sticky for the context). */
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CU(cuCtxGetCurrent(&primary));
    for (int attack = 0; attack < 4; attack++) {
        CUcontext c;
        CU(cuCtxCreate(&c, NULL, 0, dev));
        CUmodule cm;
        CU(cuModuleLoadData(&cm, MODULE));
        CUstream cs;
        CU(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
        CU(cuMemMap(va, N, 0, hd, 0));
        CUmemAccess_flags flags = attack == 2 ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cq_vmm_set_access(va, N, 0, flags));
        CUdeviceptr x = 0;
        CU(cuMemAlloc(&x, N));
        switch (attack) {
        case 0: /* unmapped while a queued kernel has yet to read it (300 ms from now: a stalled host is in time) */
            CU(launch(fn(cm, "slow_rd"), cs, 300, va, N, 0));
            CU(cuMemUnmap(va, N));
            break;
        case 1: /* mapped but never made accessible */
            CU(cuMemUnmap(va, N));
            CU(cuMemMap(va, N, 0, hd, 0));
            CU(launch(fn(cm, "rd"), cs, 1, va, N, 0));
            break;
        case 2: /* a write to a read-only mapping */
            CU(launch(fn(cm, "wr"), cs, 1, va, N, 1));
            break;
        default: /* an address nothing maps */
            CU(launch(fn(cm, "rd"), cs, 1, 0x1000, 64, 0));
            break;
        }
        /* Work queued behind the fault does not run: x keeps its bytes (checked below). */
        CUresult r = cuMemsetD8Async(x, 5, N, cs); /* the fault may be seen here already */
        CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_ILLEGAL_ADDRESS);
        CHECK(cuStreamSynchronize(cs) == CUDA_ERROR_ILLEGAL_ADDRESS);
        CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
        CUdeviceptr y = 0;
        CHECK(cuMemAlloc(&y, N) == CUDA_ERROR_ILLEGAL_ADDRESS);
        CHECK(launch(fn(cm, "rd"), cs, 1, x, N, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
        CHECK(cuMemcpyDtoH(h, x, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);
        if (attack != 0) CU(cuMemUnmap(va, N));
        /* The primary context goes on. */
        CU(cuCtxSetCurrent(primary));
        memset(h, 1, 16);
        CU(cuMemcpyDtoH(h, x, 16));
        CHECK(h[0] == 0 && h[15] == 0);
        CU(cuCtxDestroy(c));
        CU(cuCtxSetCurrent(primary));
        CU(launch(fn(m, "rd"), s, 1, a, N, 0));
        CU(cuStreamSynchronize(s));
    }
    CU(cuMemRelease(hd));
    CU(cuMemAddressFree(va, N));
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    CU(cuMemFreeHost(h));
    (void)g;
}

/* A kernel on device 1 adding 1 to [va, va + n) (peer access to device 0's context enabled): its answer at
 * synchronisation, in a context of its own (an illegal address is sticky). */
static CUresult peer_inc(CUcontext ctx0, CUdeviceptr va, size_t n) {
    CUdevice d1;
    CUcontext c1;
    CUmodule m1;
    CU(cuDeviceGet(&d1, 1));
    CU(cuCtxCreate(&c1, NULL, 0, d1));
    CU(cuCtxEnablePeerAccess(ctx0, 0));
    CU(cuModuleLoadData(&m1, MODULE));
    CUresult r = launch(fn(m1, "inc"), NULL, 1, va, n, 0);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    CU(cuCtxDestroy(c1));
    CU(cuCtxSetCurrent(ctx0));
    return r;
}

static void peer(void) {
    const size_t N = 4 * MB;
    CUcontext ctx0;
    CU(cuCtxGetCurrent(&ctx0));
    int can = 0;
    CU(cuDeviceCanAccessPeer(&can, 1, 0));
    CHECK(can == 1);
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemAllocationProp hp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_HOST, 0);
    CUmemGenericAllocationHandle hd, hh;
    CUdeviceptr va = 0;
    unsigned char *h = malloc(N);
    CU(cuMemCreate(&hd, N, &dp, 0));
    CU(cuMemAddressReserve(&va, N, 0, 0, 0));
    CU(cuMemMap(va, N, 0, hd, 0));
    /* Device 0 only: device 1's kernel faults, peer access notwithstanding; device 0 copies. */
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    cq_pattern(h, N, 3);
    CU(cuMemcpyHtoD(va, h, N));
    unsigned long long flags = 9;
    CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    CU(cuMemGetAccess(&flags, &l1, va));
    CHECK(flags == 0);
    CHECK(peer_inc(ctx0, va, N) == CUDA_ERROR_ILLEGAL_ADDRESS);
    /* The control: granted to device 1 too. */
    CU(cq_vmm_set_access(va, N, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemGetAccess(&flags, &l1, va));
    CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(peer_inc(ctx0, va, N) == CUDA_SUCCESS);
    /* Remapped onto host memory at the same address: the grant is the new mapping's, so again per device. */
    CU(cuMemCreate(&hh, N, &hp, 0));
    CU(cuMemUnmap(va, N));
    CU(cuMemMap(va, N, 0, hh, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemcpyHtoD(va, h, N));
    CHECK(peer_inc(ctx0, va, N) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CU(cq_vmm_set_access(va, N, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CHECK(peer_inc(ctx0, va, N) == CUDA_SUCCESS);
    memset(h, 0, N);
    CU(cuMemcpyDtoH(h, va, N));
    CHECK(cq_pattern_diff(h, N, 3, 1) == N);
    CU(cuMemUnmap(va, N));
    CU(cuMemRelease(hd));
    CU(cuMemRelease(hh));
    CU(cuMemAddressFree(va, N));
    free(h);
}

/* This process's usedGpuMemory on device 0 (NVML). */
static unsigned long long nvml_used(void) {
    nvmlDevice_t d;
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
    nvmlProcessInfo_t p[16];
    unsigned n = 16;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p) == NVML_SUCCESS);
    for (unsigned i = 0; i < n; i++)
        if (p[i].pid == (unsigned)getpid()) return p[i].usedGpuMemory;
    return 0;
}

static void host(CUmodule m) {
    const size_t N = 8 * MB;
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    unsigned char *h = malloc(N);
    size_t free0, total, free1;
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemGenericAllocationHandle dev_h, host_h, back_h;
    CUdeviceptr va = 0, tmp = 0;
    CU(cuMemAddressReserve(&va, N, 0, 0, 0));
    CU(cuMemAddressReserve(&tmp, N, 0, 0, 0));
    CU(cuMemCreate(&dev_h, N, &dp, 0));
    CU(cuMemMap(va, N, 0, dev_h, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    cq_pattern(h, N, 3);
    CU(cuMemcpyHtoD(va, h, N));
    CU(launch(fn(m, "inc"), NULL, 1, va, N, 0));

    /* Host allocations of each host location type: no device memory. */
    CU(cuMemGetInfo(&free0, &total));
    unsigned long long used0 = nvml_used();
    CUmemLocationType types[] = {CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
                                 CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT};
    for (int i = 0; i < 3; i++) {
        CUmemAllocationProp hp = cq_vmm_prop_at(types[i], 0);
        CU(cuMemCreate(&host_h, N, &hp, 0));
        CUmemAllocationProp got;
        CU(cuMemGetAllocationPropertiesFromHandle(&got, host_h));
        CHECK(got.location.type == CU_MEM_LOCATION_TYPE_HOST || got.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA);
        if (i < 2) CU(cuMemRelease(host_h));
    }
    CUmemAllocationProp bad = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_HOST_NUMA, 7);
    CUmemGenericAllocationHandle unused;
    CHECK(cuMemCreate(&unused, N, &bad, 0) == CUDA_ERROR_INVALID_VALUE);
    CU(cuMemGetInfo(&free1, &total));
    CHECK(free1 == free0);
    CHECK(nvml_used() == used0);

    /* Evict: copy to the host allocation (mapped elsewhere), unmap and release the device memory, map the host
     * copy at the same address. */
    CU(cuMemMap(tmp, N, 0, host_h, 0));
    CU(cq_vmm_set_access(tmp, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemcpyDtoD(tmp, va, N));
    CU(cuCtxSynchronize());
    CU(cuMemUnmap(va, N));
    CU(cuMemRelease(dev_h));
    CU(cuMemGetInfo(&free1, &total));
    CHECK(free1 == free0 + N);
    CHECK(nvml_used() == used0 - N);
    CU(cuMemUnmap(tmp, N));
    CU(cuMemMap(va, N, 0, host_h, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    /* Kernels and copies see the host backing at the old address. */
    CU(launch(fn(m, "inc"), NULL, 1, va, N, 0));
    memset(h, 0, N);
    CU(cuMemcpyDtoH(h, va, N));
    CHECK(cq_pattern_diff(h, N, 3, 2) == N);

    /* Restore: new device memory, copy back, map it at the same address. */
    CU(cuMemCreate(&back_h, N, &dp, 0));
    CU(cuMemMap(tmp, N, 0, back_h, 0));
    CU(cq_vmm_set_access(tmp, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemcpyDtoD(tmp, va, N));
    CU(cuCtxSynchronize());
    CU(cuMemUnmap(tmp, N));
    CU(cuMemUnmap(va, N));
    CU(cuMemRelease(host_h));
    CU(cuMemMap(va, N, 0, back_h, 0));
    CU(cq_vmm_set_access(va, N, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CU(cuMemGetInfo(&free1, &total));
    CHECK(free1 == free0);
    CHECK(nvml_used() == used0);
    CU(launch(fn(m, "inc"), NULL, 1, va, N, 0));
    memset(h, 0, N);
    CU(cuMemcpyDtoH(h, va, N));
    CHECK(cq_pattern_diff(h, N, 3, 3) == N);
    CU(cuMemUnmap(va, N));
    CU(cuMemRelease(back_h));
    CU(cuMemAddressFree(va, N));
    CU(cuMemAddressFree(tmp, N));
    free(h);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

static double ms_between(CUevent a, CUevent b) {
    float ms = -1;
    CU(cuEventElapsedTime(&ms, a, b));
    return ms;
}

static void engines(CUmodule m) {
    const size_t N = 1 * MB; /* 41.9 ms at 0.025 GB/s */
    unsigned char *h1 = NULL, *h2 = NULL, *h3 = NULL;
    CU(cuMemAllocHost((void **)&h1, N));
    CU(cuMemAllocHost((void **)&h2, N));
    CU(cuMemAllocHost((void **)&h3, N));
    CUdeviceptr d1 = 0, d2 = 0, d3 = 0;
    CU(cuMemAlloc(&d1, N));
    CU(cuMemAlloc(&d2, N));
    CU(cuMemAlloc(&d3, N));
    cq_pattern(h1, N, 5);
    cq_pattern(h3, N, 6);
    CU(cuMemcpyHtoD(d2, h1, N));
    /* Pages touched before the timed part: the bytes of a copy move on the host at its call, and first-touch
     * page faults would delay the next call. */
    CU(cuMemsetD8(d1, 0, N));
    CU(cuMemsetD8(d3, 0, N));
    memset(h2, 0, N);
    CUstream s[4];
    CUevent start, end[4];
    for (int i = 0; i < 4; i++) {
        CU(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
        CU(cuEventCreate(&end[i], 0));
    }
    CU(cuEventCreate(&start, 0));
    CU(cuCtxSynchronize());
    /* Everything below waits for a 200 ms kernel (the start), so the figures are the timeline's, not the host's
     * speed at issuing them. */
    CU(cuLaunchKernel(fn(m, "spin"), 800, 1, 1, 1, 1, 1, 0, s[3], NULL, NULL));
    CU(cuEventRecord(start, s[3]));
    for (int i = 0; i < 3; i++) CU(cuStreamWaitEvent(s[i], start, 0));
    /* A 100 ms kernel, an H2D and a D2H copy, and a second H2D on a stream of its own. */
    CU(cuLaunchKernel(fn(m, "spin"), 400, 1, 1, 1, 1, 1, 0, s[3], NULL, NULL));
    CU(cuEventRecord(end[3], s[3]));
    CU(cuMemcpyHtoDAsync(d1, h1, N, s[0]));
    CU(cuEventRecord(end[0], s[0]));
    CU(cuMemcpyDtoHAsync(h2, d2, N, s[1]));
    CU(cuEventRecord(end[1], s[1]));
    CU(cuMemcpyHtoDAsync(d3, h3, N, s[2]));
    CU(cuEventRecord(end[2], s[2]));
    CU(cuCtxSynchronize());
    printf("%.3f %.3f %.3f %.3f\n", ms_between(start, end[0]), ms_between(start, end[1]),
           ms_between(start, end[2]), ms_between(start, end[3]));
    /* The bytes moved. */
    unsigned char *back = malloc(N);
    CU(cuMemcpyDtoH(back, d1, N));
    CHECK(cq_pattern_diff(back, N, 5, 0) == N);
    CU(cuMemcpyDtoH(back, d3, N));
    CHECK(cq_pattern_diff(back, N, 6, 0) == N);
    CHECK(cq_pattern_diff(h2, N, 5, 0) == N);
    free(back);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUdevice dev;
    CUcontext ctx;
    CUmodule m;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuModuleLoadData(&m, MODULE));
    if (!strcmp(argv[1], "touch")) touch(m);
    else if (!strcmp(argv[1], "host")) host(m);
    else if (!strcmp(argv[1], "engines")) engines(m);
    else if (!strcmp(argv[1], "peer")) peer();
    else return 2;
    if (failures == 0) printf("OK\n");
    return failures != 0;
}

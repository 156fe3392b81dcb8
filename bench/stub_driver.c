/* stub_driver: a minimal libcuda.so.1 whose own calls cost a few nanoseconds, so that the bench sees the cost
 * libcuquota.so adds instead of the simulator's noise. One device of 80 GiB with one primary context;
 * allocations hand out addresses from a counter and track nothing; launches do nothing. Built by cuquota-bench
 * against NVIDIA's cuda.h, so every signature here is the header's. Not a driver for anything but the bench:
 * every other function is simply absent (the shim treats a missing symbol as an error code).
 */
#include <cuda.h>
#include <stdatomic.h>
#include <string.h>

#define TOTAL (80ull << 30)
#define GRANULARITY (2ull << 20)

static int ctx_token;
static _Atomic unsigned long long next_addr = 1ull << 40;
static _Atomic unsigned long long used;
static __thread CUcontext current;

#define EXPORT __attribute__((visibility("default")))

EXPORT CUresult cuInit(unsigned int flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { return v ? (*v = 13000, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuDeviceGetCount(int *n) { return n ? (*n = 1, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!d || ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    if (!u || d != 0) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 16; i++) u->bytes[i] = (char)(0x51 + i);
    return CUDA_SUCCESS;
}
#undef cuDeviceGetUuid
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d);
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!name || len < 1 || d != 0) return CUDA_ERROR_INVALID_VALUE;
    strncpy(name, "cuquota stub driver", (size_t)len - 1);
    name[len - 1] = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    return b && d == 0 ? (*b = TOTAL, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    if (!v || d != 0) return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!c || d != 0) return CUDA_ERROR_INVALID_VALUE;
    *c = (CUcontext)&ctx_token;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { return current = c, CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { return c ? (*c = current, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    *d = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (!p || !bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long size = (bytes + GRANULARITY - 1) & ~(GRANULARITY - 1);
    if (atomic_fetch_add_explicit(&used, size, memory_order_relaxed) + size > TOTAL) {
        atomic_fetch_sub_explicit(&used, size, memory_order_relaxed);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)atomic_fetch_add_explicit(&next_addr, size, memory_order_relaxed);
    return CUDA_SUCCESS;
}
/* The bench frees what it allocated, one block at a time: the block's size is the bench's (1 MiB rounded). */
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p) return CUDA_SUCCESS;
    atomic_fetch_sub_explicit(&used, GRANULARITY, memory_order_relaxed);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    unsigned long long u = atomic_load_explicit(&used, memory_order_relaxed);
    if (free) *free = TOTAL - u;
    if (total) *total = TOTAL;
    return CUDA_SUCCESS;
}
static int module_token, function_token, stream_token;
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)&module_token;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    *f = (CUfunction)&function_token;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = (CUstream)&stream_token;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return (void)s, CUDA_SUCCESS; }
/* Every kernel has no local memory: a capped first launch reads CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES and refuses
 * the launch when the driver will not say. */
EXPORT CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
    (void)a, (void)f;
    return v ? (*v = 0, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params,
        (void)extra;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = r == CUDA_SUCCESS ? "no error" : "stub driver error";
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_STUB";
    return CUDA_SUCCESS;
}
/* No graphs (alloc_bench's graph mode runs on the simulator): these only let it link against the stub. */
EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    (void)g, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    (void)n, (void)g, (void)deps, (void)ndeps, (void)p;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)e, (void)g, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    (void)e, (void)s;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Fidelity checks of the simulator against the documented behaviour of NVIDIA's driver and NVML (cuda.h /
 * nvml.h comments), one case per function below. Run by tests/smoke.rs; prints "OK" on success, every failed
 * check prints its line. */
#include <cuda.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "check.h"


/* cuCtxDestroy: "If ctx is current to other threads, then ctx will remain current to those threads, and
 * attempting to access ctx from those threads will result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED." */
static CUcontext other_ctx;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stage = 0;

static void wait_stage(int s) {
    pthread_mutex_lock(&mu);
    while (stage < s) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void set_stage(int s) {
    pthread_mutex_lock(&mu);
    stage = s;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void *other_thread(void *arg) {
    CUdeviceptr p = 0;
    CUcontext cur = NULL;
    size_t f = 0, t = 0;
    (void)arg;
    CU(cuCtxSetCurrent(other_ctx));
    set_stage(1);
    wait_stage(2);
    CU(cuCtxGetCurrent(&cur));
    CHECK(cur == other_ctx);
    CHECK(cuMemAlloc(&p, 4096) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(cuMemGetInfo(&f, &t) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    /* Unbinding it works, and then there is simply no context. */
    CU(cuCtxSetCurrent(NULL));
    CHECK(cuMemAlloc(&p, 4096) == CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static void destroyed_context(void) {
    CUcontext cur = NULL;
    pthread_t t;
    CU(cuCtxCreate(&other_ctx, NULL, 0, 0));
    CU(cuCtxPopCurrent(NULL));
    pthread_create(&t, NULL, other_thread, NULL);
    wait_stage(1);
    CU(cuCtxDestroy(other_ctx));
    set_stage(2);
    pthread_join(t, NULL);
    CU(cuCtxGetCurrent(&cur));
    CHECK(cur == NULL);
}

/* cuDevicePrimaryCtxRelease "does not pop the context from stack in any circumstances": after the last
 * release the thread's current context is an uninitialised primary context, and using it is
 * CUDA_ERROR_CONTEXT_IS_DESTROYED ("... or is a primary context which has not yet been initialized"). */
static void released_primary_still_current(void) {
    CUcontext ctx, cur = NULL;
    CUdeviceptr p = 0;
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    CU(cuDevicePrimaryCtxRelease(0));
    CU(cuCtxGetCurrent(&cur));
    CHECK(cur == ctx);
    CHECK(cuMemAlloc(&p, 4096) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(cuDevicePrimaryCtxRelease(0) == CUDA_ERROR_INVALID_CONTEXT);
    /* Retained again, the same handle works again. */
    CU(cuDevicePrimaryCtxRetain(&cur, 0));
    CHECK(cur == ctx);
    CU(cuMemAlloc(&p, 4096));
    CU(cuMemFree(p));
    CU(cuCtxSetCurrent(NULL));
    CU(cuDevicePrimaryCtxRelease(0));
}

/* nvmlDeviceGetComputeRunningProcesses: "call this function with *infoCount = 0 ... For this call infos is
 * allowed to be NULL"; otherwise INVALID_ARGUMENT "if ... either of infoCount or infos is NULL". */
static void nvml_process_count(void) {
    nvmlDevice_t dev;
    unsigned int n = 0;
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &dev) == NVML_SUCCESS);
    n = 0;
    CHECK(nvmlDeviceGetComputeRunningProcesses(dev, &n, NULL) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(n == 1);
    n = 5;
    CHECK(nvmlDeviceGetComputeRunningProcesses(dev, &n, NULL) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    CU(cuDevicePrimaryCtxRelease(0));
}

/* cuMemPoolTrimTo: "Otherwise the pool will be guaranteed to have at least minBytesToKeep bytes reserved
 * after the operation." */
static void pool_trim_keeps_at_least(void) {
    CUcontext ctx;
    CUmemoryPool pool;
    CUstream s;
    CUdeviceptr a, b;
    cuuint64_t v = 0, threshold = 64 * MB;
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(cuMemPoolCreate(&pool, &(CUmemPoolProps){.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}}));
    CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CU(cuMemAllocFromPoolAsync(&a, 10 * MB, pool, s));
    CU(cuMemAllocFromPoolAsync(&b, 4 * MB, pool, s));
    CU(cuMemFreeAsync(a, s));
    CU(cuMemFreeAsync(b, s));
    CU(cuStreamSynchronize(s));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    CHECK(v == 14 * MB);
    /* Keeping 1 MiB: the 10 MiB segment can go, the 4 MiB one must stay. */
    CU(cuMemPoolTrimTo(pool, 1 * MB));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    CHECK(v == 4 * MB);
    /* Keeping 3 MiB of 4 MiB: nothing can go. */
    CU(cuMemPoolTrimTo(pool, 3 * MB));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    CHECK(v == 4 * MB);
    /* A threshold of 3 MiB: a synchronisation keeps the 4 MiB too. */
    threshold = 3 * MB;
    CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CU(cuStreamSynchronize(s));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    CHECK(v == 4 * MB);
    CU(cuMemPoolTrimTo(pool, 0));
    CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    CHECK(v == 0);
    CU(cuMemPoolDestroy(pool));
    CU(cuStreamDestroy(s));
    CU(cuCtxSetCurrent(NULL));
    CU(cuDevicePrimaryCtxRelease(0));
}

int main(void) {
    CU(cuInit(0));
    destroyed_context();
    released_primary_still_current();
    nvml_process_count();
    pool_trim_keeps_at_least();
    if (failures == 0) printf("OK\n");
    return failures != 0;
}

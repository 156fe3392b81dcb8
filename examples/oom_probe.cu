// oom_probe: for each way of taking device memory, allocate fixed chunks until the device (or cuquota's cap)
// says out of memory, report how far it got, free everything, and go on with the next API. validate.sh compares
// `metric <api>.stopped_at_bytes=` with the device memory or the cap.
//
// Managed memory can oversubscribe on a real GPU, so no API is taken beyond the device's total memory (reported
// as error=limit).
#include <cuda.h>
#include "common.h"

static const size_t MiB = 1 << 20;
static const size_t CHUNK = 64 * MiB;

typedef CUresult (*PFN_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*PFN_release)(CUmemGenericAllocationHandle);
typedef CUresult (*PFN_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
static PFN_create p_create;
static PFN_release p_release;
static PFN_granularity p_gran;
static CUmemAllocationProp vmm_prop;

struct Probe {
    const char *name;
    // Takes one chunk; returns the bytes it stands for (0 = failed, *err set) and a handle to free.
    size_t (*take)(void **handle, int *err);
    void (*give_back)(void *handle);
};

static cudaStream_t stream;
static cudaMemPool_t pool;

static size_t take_malloc(void **h, int *err) {
    *err = cudaMalloc(h, CHUNK);
    return *err ? 0 : CHUNK;
}
static void free_malloc(void *h) { cudaFree(h); }

static size_t take_pitch(void **h, int *err) {
    size_t pitch = 0;
    *err = cudaMallocPitch(h, &pitch, 8192, CHUNK / 8192);
    return *err ? 0 : pitch * (CHUNK / 8192);
}

static size_t take_managed(void **h, int *err) {
    *err = cudaMallocManaged(h, CHUNK, cudaMemAttachGlobal);
    return *err ? 0 : CHUNK;
}

static size_t take_async(void **h, int *err) {
    *err = cudaMallocAsync(h, CHUNK, stream);
    if (!*err) *err = cudaStreamSynchronize(stream);
    return *err ? 0 : CHUNK;
}
static void free_async(void *h) { cudaFreeAsync(h, stream); }

static size_t take_pool(void **h, int *err) {
    *err = cudaMallocFromPoolAsync(h, CHUNK, pool, stream);
    if (!*err) *err = cudaStreamSynchronize(stream);
    return *err ? 0 : CHUNK;
}

static size_t take_vmm(void **h, int *err) {
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = p_create(&handle, CHUNK, &vmm_prop, 0);
    *err = (int)r;
    *h = (void *)(uintptr_t)handle;
    return r == CUDA_SUCCESS ? CHUNK : 0;
}
static void free_vmm(void *h) { p_release((CUmemGenericAllocationHandle)(uintptr_t)h); }

static size_t take_array(void **h, int *err) {
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float4>();
    *err = cudaMallocArray((cudaArray_t *)h, &d, 2048, CHUNK / (2048 * 16));
    return *err ? 0 : CHUNK;
}
static void free_array(void *h) { cudaFreeArray((cudaArray_t)h); }

static size_t take_3d(void **h, int *err) {
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    *err = cudaMalloc3DArray((cudaArray_t *)h, &d, make_cudaExtent(256, 256, CHUNK / (256 * 256 * 4)));
    return *err ? 0 : CHUNK;
}

static size_t take_mipmap(void **h, int *err) {
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    *err = cudaMallocMipmappedArray((cudaMipmappedArray_t *)h, &d, make_cudaExtent(4096, CHUNK / (4096 * 4), 0), 1);
    return *err ? 0 : CHUNK;
}
static void free_mipmap(void *h) { cudaFreeMipmappedArray((cudaMipmappedArray_t)h); }

static const char *err_name(const char *api, int err) {
    if (strcmp(api, "cuMemCreate") == 0) {
        const char *s = NULL;
        return err == CUDA_ERROR_OUT_OF_MEMORY ? "cudaErrorMemoryAllocation" : (s ? s : "driver-error");
    }
    return cudaGetErrorName((cudaError_t)err);
}

int main(int argc, char **argv) {
    print_header("oom_probe");
    CUDA_TRY(cudaFree(0));
    CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CUDA_TRY(cudaMemPoolCreate(&pool, &props));
    cudaDriverEntryPointQueryResult q;
    CUDA_TRY(cudaGetDriverEntryPointByVersion("cuMemCreate", (void **)&p_create, 10020, cudaEnableDefault, &q));
    CUDA_TRY(cudaGetDriverEntryPointByVersion("cuMemRelease", (void **)&p_release, 10020, cudaEnableDefault, &q));
    memset(&vmm_prop, 0, sizeof vmm_prop);
    vmm_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    vmm_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    vmm_prop.location.id = 0;

    size_t free0, total;
    CUDA_TRY(cudaMemGetInfo(&free0, &total));
    printf("metric mem_total=%zu\nmetric mem_free_start=%zu\nmetric chunk=%zu\n", total, free0, CHUNK);
    const size_t max_chunks = total / CHUNK + 2;

    const Probe probes[] = {
        {"cudaMalloc", take_malloc, free_malloc},
        {"cudaMallocPitch", take_pitch, free_malloc},
        {"cudaMallocManaged", take_managed, free_malloc},
        {"cudaMallocAsync", take_async, free_async},
        {"cudaMallocFromPoolAsync", take_pool, free_async},
        {"cuMemCreate", take_vmm, free_vmm},
        {"cudaMallocArray", take_array, free_array},
        {"cudaMalloc3DArray", take_3d, free_array},
        {"cudaMallocMipmappedArray", take_mipmap, free_mipmap},
    };
    void **handles = (void **)calloc(max_chunks, sizeof(void *));
    for (const Probe &p : probes) {
        if (argc > 1 && !strstr(argv[1], p.name)) continue;
        size_t taken = 0, n = 0;
        int err = 0;
        double t0 = now_s();
        while (n < max_chunks) {
            size_t got = p.take(&handles[n], &err);
            if (!got) break;
            taken += got;
            n++;
        }
        cudaGetLastError();  // clear the (non-sticky) allocation error
        const char *why = n == max_chunks ? "limit" : err_name(p.name, err);
        printf("metric %s.stopped_at_bytes=%zu\nmetric %s.error=%s\n", p.name, taken, p.name, why);
        bool oom = strcmp(why, "cudaErrorMemoryAllocation") == 0;
        char exp[96];
        snprintf(exp, sizeof exp, "cudaErrorMemoryAllocation after >0 bytes");
        char obs[128];
        snprintf(obs, sizeof obs, "%s after %zu bytes (%.0f ms)", why, taken, (now_s() - t0) * 1e3);
        char name[96];
        snprintf(name, sizeof name, "%s_stops_with_oom", p.name);
        // A GPU's driver oversubscribes managed memory: stopping at the device's size is no failure here
        // (validate.sh accepts it only without cuquota; under a cap the probe must stop at the cap).
        bool managed_limit = strcmp(p.name, "cudaMallocManaged") == 0 && strcmp(why, "limit") == 0;
        if (managed_limit) snprintf(exp, sizeof exp, "cudaErrorMemoryAllocation, or the device's size (managed)");
        check_bool(name, exp, (oom && taken > 0) || managed_limit, obs);
        for (size_t i = 0; i < n; i++) p.give_back(handles[i]);
        CUDA_TRY(cudaStreamSynchronize(stream));
        // Pools keep freed memory reserved: hand it back before the next API.
        cudaMemPool_t def;
        CUDA_TRY(cudaDeviceGetDefaultMemPool(&def, 0));
        CUDA_TRY(cudaMemPoolTrimTo(def, 0));
        CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
        size_t f, t;
        CUDA_TRY(cudaMemGetInfo(&f, &t));
        snprintf(name, sizeof name, "%s_memory_returned", p.name);
        snprintf(exp, sizeof exp, ">=%zu (start - 1 chunk)", free0 - CHUNK);
        snprintf(obs, sizeof obs, "%zu", f);
        check_bool(name, exp, f + CHUNK >= free0, obs);
    }
    CUDA_TRY(cudaMemPoolDestroy(pool));
    free(handles);
    return finish("oom_probe");
}

// mempool_async: stream-ordered allocation. The device's default pool (cudaMallocAsync), then an explicit pool
// with a release threshold (cudaMallocFromPoolAsync): reserved memory stays up to the threshold after frees,
// trimming returns it. Checks pool attributes and copies through pool memory.
#include "common.h"

static unsigned long long pool_attr(cudaMemPool_t p, cudaMemPoolAttr a) {
    unsigned long long v = 0;
    CUDA_TRY(cudaMemPoolGetAttribute(p, a, &v));
    return v;
}

int main() {
    print_header("mempool_async");
    const size_t MiB = 1 << 20, chunk = 32 * MiB, threshold = 64 * MiB;
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int supported = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
    check_ull("memory_pools_supported", 1, supported);

    // Default pool.
    void *p = NULL;
    CUDA_TRY(cudaMallocAsync(&p, chunk, s));
    unsigned char *h = (unsigned char *)malloc(chunk), *back = (unsigned char *)malloc(chunk);
    fill_pattern(h, chunk, 3);
    CUDA_TRY(cudaMemcpyAsync(p, h, chunk, cudaMemcpyHostToDevice, s));
    CUDA_TRY(cudaMemcpyAsync(back, p, chunk, cudaMemcpyDeviceToHost, s));
    CUDA_TRY(cudaFreeAsync(p, s));
    CUDA_TRY(cudaStreamSynchronize(s));
    check_bool("default_pool_round_trip", "equal", memcmp(h, back, chunk) == 0,
               memcmp(h, back, chunk) == 0 ? "equal" : "different");

    // Explicit pool with a release threshold.
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    CUDA_TRY(cudaMemPoolCreate(&pool, &props));
    unsigned long long thr = threshold;
    CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    check_ull("release_threshold", threshold, pool_attr(pool, cudaMemPoolAttrReleaseThreshold));

    size_t free0, total;
    CUDA_TRY(cudaMemGetInfo(&free0, &total));
    void *q[4];
    for (int i = 0; i < 4; i++) CUDA_TRY(cudaMallocFromPoolAsync(&q[i], chunk, pool, s));
    CUDA_TRY(cudaStreamSynchronize(s));
    unsigned long long used = pool_attr(pool, cudaMemPoolAttrUsedMemCurrent);
    unsigned long long reserved = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    printf("metric pool_used=%llu\nmetric pool_reserved=%llu\n", used, reserved);
    char obs[64];
    snprintf(obs, sizeof obs, "%llu", used);
    check_bool("pool_used_after_alloc", ">=134217728", used >= 4 * chunk, obs);
    snprintf(obs, sizeof obs, "%llu", reserved);
    check_bool("pool_reserved_ge_used", ">=used", reserved >= used, obs);
    size_t free1;
    CUDA_TRY(cudaMemGetInfo(&free1, &total));
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free0 - free1));
    check_bool("mem_free_drops_by_pool", ">=134217728", free0 >= free1 && free0 - free1 >= 4 * chunk, obs);

    for (int i = 0; i < 4; i++) CUDA_TRY(cudaFreeAsync(q[i], s));
    CUDA_TRY(cudaStreamSynchronize(s));
    used = pool_attr(pool, cudaMemPoolAttrUsedMemCurrent);
    reserved = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    check_ull("pool_used_after_free", 0, used);
    snprintf(obs, sizeof obs, "%llu", reserved);
    check_bool("pool_keeps_at_most_threshold", "<=67108864", reserved <= threshold, obs);
    printf("metric pool_reserved_after_free=%llu\n", reserved);

    CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
    check_ull("pool_reserved_after_trim", 0, pool_attr(pool, cudaMemPoolAttrReservedMemCurrent));
    size_t free2;
    CUDA_TRY(cudaMemGetInfo(&free2, &total));
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free2 - free1));
    check_bool("mem_free_recovers_after_trim", ">=134217728", free2 >= free1 + 4 * chunk, obs);

    CUDA_TRY(cudaMemPoolDestroy(pool));
    CUDA_TRY(cudaStreamDestroy(s));
    free(h), free(back);
    return finish("mempool_async");
}

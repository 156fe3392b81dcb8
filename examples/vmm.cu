// vmm: the driver's virtual memory management API, reached as frameworks do (PyTorch expandable segments, NCCL):
// through cudaGetDriverEntryPointByVersion, without linking libcuda. Creates physical allocations, reserves a VA
// range, maps, sets access, copies through the mapping, then unmaps and releases. Checks granularity rounding
// and that free memory follows cuMemCreate/cuMemRelease.
#include <cuda.h>
#include "common.h"

#define GET(name, ver)                                                                                   \
    do {                                                                                                 \
        cudaDriverEntryPointQueryResult q_;                                                              \
        CUDA_TRY(cudaGetDriverEntryPointByVersion(#name, (void **)&p_##name, ver, cudaEnableDefault, &q_)); \
        if (q_ != cudaDriverEntryPointSuccess || !p_##name) {                                           \
            printf("check entry_point_%s: expected found observed missing FAIL\n", #name);               \
            return 2;                                                                                    \
        }                                                                                                \
    } while (0)

#define CU_TRY(call)                                                                                     \
    do {                                                                                                 \
        CUresult r_ = (call);                                                                            \
        if (r_ != CUDA_SUCCESS) {                                                                        \
            printf("check %s: expected CUDA_SUCCESS observed %d FAIL\n", #call, (int)r_);                \
            return 2;                                                                                    \
        }                                                                                                \
    } while (0)

int main() {
    print_header("vmm");
    CUDA_TRY(cudaFree(0));  // initialise the primary context
    CUresult (*p_cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*p_cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*p_cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*p_cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*p_cuMemAddressFree)(CUdeviceptr, size_t);
    CUresult (*p_cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*p_cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*p_cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*p_cuMemGetInfo)(size_t *, size_t *);
    GET(cuMemGetAllocationGranularity, 10020);
    GET(cuMemCreate, 10020);
    GET(cuMemRelease, 10020);
    GET(cuMemAddressReserve, 10020);
    GET(cuMemAddressFree, 10020);
    GET(cuMemMap, 10020);
    GET(cuMemUnmap, 10020);
    GET(cuMemSetAccess, 10020);
    GET(cuMemGetInfo, 3020);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CU_TRY(p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("metric granularity=%zu\n", gran);
    check_bool("granularity_power_of_two", "nonzero power of 2", gran && !(gran & (gran - 1)),
               gran && !(gran & (gran - 1)) ? "nonzero power of 2" : "other");

    const int pieces = 4;
    const size_t piece = 8 * gran, total_va = pieces * piece;
    size_t free0, tot;
    CU_TRY(p_cuMemGetInfo(&free0, &tot));
    CUmemGenericAllocationHandle h[pieces];
    for (int i = 0; i < pieces; i++) CU_TRY(p_cuMemCreate(&h[i], piece, &prop, 0));
    size_t free1;
    CU_TRY(p_cuMemGetInfo(&free1, &tot));
    char obs[64];
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free0 - free1));
    char exp[64];
    snprintf(exp, sizeof exp, ">=%zu", pieces * piece);
    check_bool("mem_free_drops_by_cuMemCreate", exp, free0 >= free1 && free0 - free1 >= pieces * piece, obs);

    CUdeviceptr va = 0;
    CU_TRY(p_cuMemAddressReserve(&va, total_va, gran, 0, 0));
    for (int i = 0; i < pieces; i++) CU_TRY(p_cuMemMap(va + i * piece, piece, 0, h[i], 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_TRY(p_cuMemSetAccess(va, total_va, &acc, 1));

    unsigned char *hbuf = (unsigned char *)malloc(total_va), *back = (unsigned char *)malloc(total_va);
    fill_pattern(hbuf, total_va, 11);
    CUDA_TRY(cudaMemcpy((void *)va, hbuf, total_va, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(back, (void *)va, total_va, cudaMemcpyDeviceToHost));
    check_bool("mapped_round_trip", "equal", memcmp(hbuf, back, total_va) == 0,
               memcmp(hbuf, back, total_va) == 0 ? "equal" : "different");

    CU_TRY(p_cuMemUnmap(va, total_va));
    CU_TRY(p_cuMemAddressFree(va, total_va));
    for (int i = 0; i < pieces; i++) CU_TRY(p_cuMemRelease(h[i]));
    size_t free2;
    CU_TRY(p_cuMemGetInfo(&free2, &tot));
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free2 - free1));
    check_bool("mem_free_recovers_after_release", exp, free2 >= free1 + pieces * piece, obs);
    free(hbuf), free(back);
    return finish("vmm");
}

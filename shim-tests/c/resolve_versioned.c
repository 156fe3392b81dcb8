/* resolve_versioned: a library that defines cuMemAlloc_v2 under a symbol version (linked with a version script
 * naming CUQUOTA_TEST_1), so that glibc's dlvsym finds it: what dlvsym returns for a hooked name in a library
 * with version definitions. It never allocates (returns CUDA_ERROR_NOT_SUPPORTED). */
#include <cuda.h>
#include <stddef.h>

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    (void)dptr;
    (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* resolve_lib: a small shared library linked with -lcuda that calls the driver itself (resolve.c loads it with
 * dlmopen(LM_ID_NEWLM) or dlopen(RTLD_DEEPBIND), where its references would bind to libcuda rather than to the
 * preloaded interposer). Returns how many of COUNT allocations of SIZE bytes succeeded (-1: no context). */
#include <cuda.h>
#include <stddef.h>

int resolve_lib_alloc(size_t size, int count) {
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) return -1;
    int ok = 0;
    for (int i = 0; i < count; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, size) == CUDA_SUCCESS) ok++;
    }
    return ok;
}

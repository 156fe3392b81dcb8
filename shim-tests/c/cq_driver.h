/* cq_driver.h: how a test program reaches the CUDA driver, in each of the ways real programs do.
 *
 *   direct      compiled with -DCQ_DIRECT and linked with -lcuda: calls the versioned symbols cuda.h names
 *               (cuMemAlloc -> cuMemAlloc_v2; with CUDA_API_PER_THREAD_DEFAULT_STREAM the _ptsz forms).
 *   dlsym       dlopen("libcuda.so.1") + dlsym() of the versioned names (cuMemAlloc_v2, ...).
 *   dlsym-ptsz  same, with the per-thread-default-stream names (cuMemAllocAsync_ptsz, ...).
 *   gpa:V:F     dlopen + dlsym("cuGetProcAddress_v2") and every other function resolved through it with
 *               cudaVersion V and flags F, exactly as the CUDA runtime does.
 *   gpa1:V:F    same through the bare cuGetProcAddress (no symbolStatus argument).
 *
 * Only the functions under test (allocation, free, cuMemGetInfo, cuDeviceTotalMem) are resolved at V; the
 * plumbing (cuInit, contexts, streams, pools' attributes) is resolved at max(V, 12000), as the runtime does.
 * With V < 3020 the driver hands out the v1 ABI (32-bit sizes and pointers) of cuMemAlloc, cuMemFree,
 * cuMemAllocPitch, cuMemGetInfo and cuDeviceTotalMem; the table records that in `abi_v1`.
 *
 * It also offers `raw`: the simulator's own NVML entry points, read from the simulator's own dynamic symbol
 * table (cq_elf_sym; libcuquota.so hooks dlsym and dlvsym, not the ELF), so a test can see what the driver
 * really holds, bypassing libcuquota.so.
 */
#ifndef CQ_DRIVER_H
#define CQ_DRIVER_H
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int abi_v1;
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*CtxSetLimit)(CUlimit, size_t);
    CUresult (*CtxGetLimit)(size_t *, CUlimit);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
} cq_driver;

/* one row per function: offset in cq_driver, base name (for cuGetProcAddress), versioned name, _ptsz name */
typedef struct {
    size_t off;
    const char *base;
    const char *versioned;
    const char *ptsz;
    int probed; /* 1: resolved at the requested cudaVersion; 0: plumbing, resolved at >= 12000 */
} cq_fn;

#define CQ_FN(field, base, ver, ptsz) {offsetof(cq_driver, field), base, ver, ptsz, 0}
#define CQ_FNP(field, base, ver, ptsz) {offsetof(cq_driver, field), base, ver, ptsz, 1}
static const cq_fn cq_fns[] = {
    CQ_FN(Init, "cuInit", "cuInit", NULL),
    CQ_FN(DriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", NULL),
    CQ_FN(DeviceGet, "cuDeviceGet", "cuDeviceGet", NULL),
    CQ_FN(DeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", NULL),
    CQ_FN(DeviceGetUuid, "cuDeviceGetUuid", "cuDeviceGetUuid_v2", NULL),
    CQ_FNP(DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2", NULL),
    CQ_FN(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", NULL),
    CQ_FN(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", NULL),
    CQ_FN(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", NULL),
    CQ_FN(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", NULL),
    CQ_FN(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", NULL),
    CQ_FN(CtxSetLimit, "cuCtxSetLimit", "cuCtxSetLimit", NULL),
    CQ_FN(CtxGetLimit, "cuCtxGetLimit", "cuCtxGetLimit", NULL),
    CQ_FNP(MemGetInfo, "cuMemGetInfo", "cuMemGetInfo_v2", NULL),
    CQ_FNP(MemAlloc, "cuMemAlloc", "cuMemAlloc_v2", NULL),
    CQ_FNP(MemFree, "cuMemFree", "cuMemFree_v2", NULL),
    CQ_FNP(MemAllocPitch, "cuMemAllocPitch", "cuMemAllocPitch_v2", NULL),
    CQ_FNP(MemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged", NULL),
    CQ_FNP(MemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
    CQ_FNP(MemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
    CQ_FNP(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync",
          "cuMemAllocFromPoolAsync_ptsz"),
    CQ_FN(MemPoolCreate, "cuMemPoolCreate", "cuMemPoolCreate", NULL),
    CQ_FN(MemPoolDestroy, "cuMemPoolDestroy", "cuMemPoolDestroy", NULL),
    CQ_FN(MemPoolTrimTo, "cuMemPoolTrimTo", "cuMemPoolTrimTo", NULL),
    CQ_FN(MemPoolGetAttribute, "cuMemPoolGetAttribute", "cuMemPoolGetAttribute", NULL),
    CQ_FN(MemPoolSetAttribute, "cuMemPoolSetAttribute", "cuMemPoolSetAttribute", NULL),
    CQ_FN(StreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", "cuStreamSynchronize_ptsz"),
    CQ_FNP(MemCreate, "cuMemCreate", "cuMemCreate", NULL),
    CQ_FNP(MemRelease, "cuMemRelease", "cuMemRelease", NULL),
    CQ_FN(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", NULL),
    CQ_FNP(ArrayCreate, "cuArrayCreate", "cuArrayCreate_v2", NULL),
    CQ_FNP(Array3DCreate, "cuArray3DCreate", "cuArray3DCreate_v2", NULL),
    CQ_FNP(ArrayDestroy, "cuArrayDestroy", "cuArrayDestroy", NULL),
    CQ_FNP(MipmappedArrayCreate, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", NULL),
    CQ_FNP(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", NULL),
    CQ_FN(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", NULL),
    CQ_FN(ModuleUnload, "cuModuleUnload", "cuModuleUnload", NULL),
};
#define CQ_NFNS (sizeof(cq_fns) / sizeof(cq_fns[0]))

typedef CUresult (*cq_gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*cq_gpa1_t)(const char *, void **, int, cuuint64_t);

static inline void cq_set(cq_driver *d, size_t off, void *p) { memcpy((char *)d + off, &p, sizeof p); }

#ifdef CQ_DIRECT
static int cq_load_direct(cq_driver *d) {
    memset(d, 0, sizeof *d);
    d->Init = cuInit;
    d->DriverGetVersion = cuDriverGetVersion;
    d->DeviceGet = cuDeviceGet;
    d->DeviceGetCount = cuDeviceGetCount;
    d->DeviceGetUuid = cuDeviceGetUuid;
    d->DeviceTotalMem = cuDeviceTotalMem;
    d->DevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain;
    d->DevicePrimaryCtxRelease = cuDevicePrimaryCtxRelease;
    d->DeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool;
    d->CtxSetCurrent = cuCtxSetCurrent;
    d->CtxSynchronize = cuCtxSynchronize;
    d->CtxSetLimit = cuCtxSetLimit;
    d->CtxGetLimit = cuCtxGetLimit;
    d->MemGetInfo = cuMemGetInfo;
    d->MemAlloc = cuMemAlloc;
    d->MemFree = cuMemFree;
    d->MemAllocPitch = cuMemAllocPitch;
    d->MemAllocManaged = cuMemAllocManaged;
    d->MemAllocAsync = cuMemAllocAsync;
    d->MemFreeAsync = cuMemFreeAsync;
    d->MemAllocFromPoolAsync = cuMemAllocFromPoolAsync;
    d->MemPoolCreate = cuMemPoolCreate;
    d->MemPoolDestroy = cuMemPoolDestroy;
    d->MemPoolTrimTo = cuMemPoolTrimTo;
    d->MemPoolGetAttribute = cuMemPoolGetAttribute;
    d->MemPoolSetAttribute = cuMemPoolSetAttribute;
    d->StreamSynchronize = cuStreamSynchronize;
    d->MemCreate = cuMemCreate;
    d->MemRelease = cuMemRelease;
    d->MemGetAllocationGranularity = cuMemGetAllocationGranularity;
    d->ArrayCreate = cuArrayCreate;
    d->Array3DCreate = cuArray3DCreate;
    d->ArrayDestroy = cuArrayDestroy;
    d->MipmappedArrayCreate = cuMipmappedArrayCreate;
    d->MipmappedArrayDestroy = cuMipmappedArrayDestroy;
    d->ModuleLoadData = cuModuleLoadData;
    d->ModuleUnload = cuModuleUnload;
    return 0;
}
#endif

/* Loads the driver table in `style`. Prints `load.unresolved=<name>` for each function the style could not
 * resolve (left NULL). Returns 0, or -1 when the library or the entry point itself is missing. */
static int cq_load(cq_driver *d, const char *style) {
    if (strcmp(style, "direct") == 0) {
#ifdef CQ_DIRECT
        return cq_load_direct(d);
#else
        fprintf(stderr, "this binary was not linked with -lcuda; style direct unavailable\n");
        return -1;
#endif
    }
    memset(d, 0, sizeof *d);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "dlopen(libcuda.so.1): %s\n", dlerror());
        return -1;
    }
    int ptsz = strcmp(style, "dlsym-ptsz") == 0;
    if (ptsz || strcmp(style, "dlsym") == 0) {
        for (size_t i = 0; i < CQ_NFNS; i++) {
            const char *name = (ptsz && cq_fns[i].ptsz) ? cq_fns[i].ptsz : cq_fns[i].versioned;
            void *p = dlsym(h, name);
            if (!p) printf("load.unresolved=%s\n", name);
            cq_set(d, cq_fns[i].off, p);
        }
        return 0;
    }
    int v1 = strncmp(style, "gpa1:", 5) == 0;
    if (!v1 && strncmp(style, "gpa:", 4) != 0) {
        fprintf(stderr, "unknown style %s\n", style);
        return -1;
    }
    const char *rest = style + (v1 ? 5 : 4);
    int version = atoi(rest);
    const char *colon = strchr(rest, ':');
    unsigned long long flags = colon ? strtoull(colon + 1, NULL, 0) : 0;
    void *gpa = dlsym(h, v1 ? "cuGetProcAddress" : "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "dlsym(cuGetProcAddress%s) failed\n", v1 ? "" : "_v2");
        return -1;
    }
    d->abi_v1 = version < 3020;
    for (size_t i = 0; i < CQ_NFNS; i++) {
        void *p = NULL;
        CUresult r;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        int ver = (cq_fns[i].probed || version >= 12000) ? version : 12000;
        if (v1)
            r = ((cq_gpa1_t)gpa)(cq_fns[i].base, &p, ver, flags);
        else
            r = ((cq_gpa2_t)gpa)(cq_fns[i].base, &p, ver, flags, &st);
        if (r != CUDA_SUCCESS || !p) {
            printf("load.unresolved=%s\n", cq_fns[i].base);
            p = NULL;
        }
        cq_set(d, cq_fns[i].off, p);
    }
    return 0;
}

/* v1 ABI (cudaVersion < 3020) */
typedef CUresult (*cq_memalloc_v1_t)(unsigned int *, unsigned int);
typedef CUresult (*cq_memfree_v1_t)(unsigned int);
typedef CUresult (*cq_memgetinfo_v1_t)(unsigned int *, unsigned int *);
typedef CUresult (*cq_totalmem_v1_t)(unsigned int *, CUdevice);
typedef CUresult (*cq_allocpitch_v1_t)(unsigned int *, unsigned int *, unsigned int, unsigned int, unsigned int);

/* --- the simulator itself, bypassing any interposer --- */
#include "cq_elf.h"

typedef void *(*cq_dlsym_t)(void *, const char *);
static cq_dlsym_t cq_real_dlsym(void) {
    return cq_elf_sym;
}

typedef struct {
    unsigned long long total, free, used;
} cq_rawmem;

/* The simulator's own view of NVML device `index` (physical, all processes). Returns NVML's return code, or
 * -1 when the simulator could not be reached. */
static int cq_raw_nvml_mem(unsigned int index, cq_rawmem *out) {
    static void *h;
    static int (*init)(void);
    static int (*by_index)(unsigned int, void **);
    static int (*meminfo)(void *, cq_rawmem *);
    if (!h) {
        cq_dlsym_t real = cq_real_dlsym();
        const char *lib = getenv("CQ_SIM_LIB");
        h = dlopen(lib ? lib : "libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!h || !real) return -1;
        init = (int (*)(void))real(h, "nvmlInit_v2");
        by_index = (int (*)(unsigned int, void **))real(h, "nvmlDeviceGetHandleByIndex_v2");
        meminfo = (int (*)(void *, cq_rawmem *))real(h, "nvmlDeviceGetMemoryInfo");
        if (!init || !by_index || !meminfo) return -1;
        int r = init();
        if (r) return r;
    }
    if (!meminfo) return -1;
    void *dev = NULL;
    int r = by_index(index, &dev);
    if (r) return r;
    return meminfo(dev, out);
}

static const char *cq_err(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: {
        static __thread char buf[32];
        snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)r);
        return buf;
    }
    }
}

/* "512m", "1g", "0x1000", "4096" -> bytes (k/m/g/t = x1024^n) */
static unsigned long long cq_size(const char *s) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    switch (end && *end ? *end : 0) {
    case 't': case 'T': v <<= 10; /* fall through */
    case 'g': case 'G': v <<= 10; /* fall through */
    case 'm': case 'M': v <<= 10; /* fall through */
    case 'k': case 'K': v <<= 10; break;
    default: break;
    }
    return v;
}
#endif

/* vmm_lifetime: the lifetime of virtual-memory-management allocations, as a hostile tenant uses it (#11 class 1).
 * cuMemRelease does not free memory that is still mapped (cuda.h): a tenant that creates, maps and releases
 * keeps the memory; a shim that un-charges at the release lets it allocate the same amount again.
 *
 *   vmm_lifetime CMD...        on the primary context of device 0; every command prints key=value lines:
 *     create:I:SIZE     cuMemCreate of SIZE (k/m/g) into handle slot I                        create.I=<result>
 *     map:M:I           reserve SIZE(I) of address space, cuMemMap handle I there, read-write access,
 *                       write a byte through it: mapping slot M                                  map.M=<result>
 *     unmap:M           cuMemUnmap + cuMemAddressFree of mapping M                            unmap.M=<result>
 *     release:I         cuMemRelease of handle slot I                                       release.I=<result>
 *     retain:I:M        cuMemRetainAllocationHandle of an address inside mapping M into slot I
 *                                                                          retain.I=<result> retain.I.same=0|1
 *     sparse:A:I        a sparse 2D array in array slot A, handle I bound to its level 0 with
 *                       cuMemMapArrayAsync (a stream sync after)                              sparse.A=<result>
 *     tileunmap:A       cuMemMapArrayAsync's unmap of that tile                             tileunmap.A=<result>
 *     arraydestroy:A    cuArrayDestroy of array slot A                                   arraydestroy.A=<result>
 *     mcbind:M:I        a multicast object of SIZE(I) on device 0 in slot M, handle I bound
 *                       at offset 0 (cuMulticastBindMem)                                      mcbind.M=<result>
 *     mcbindaddr:M:N    as mcbind, binding the memory mapped at mapping N (cuMulticastBindAddr) mcbind.M=<result>
 *     mcunbind:M        cuMulticastUnbind of that range                                     mcunbind.M=<result>
 *     alloc:SIZE        cuMemAlloc (kept until exit)                                           alloc=<result>
 *     used              the simulator's own used bytes on device 0 (NVML, past any interposer)     used=
 *     charged           cuMemGetInfo's total − free: what the shim has charged the container        charged=
 *   and done=1 at the end.
 */
#include "cq_driver.h"
#include "cq_vmm.h"

#define SLOTS 16
static CUmemGenericAllocationHandle handles[SLOTS];
static size_t sizes[SLOTS];
static CUdeviceptr maps[SLOTS];
static size_t map_sizes[SLOTS];

static int slot(const char *s) {
    int i = atoi(s);
    if (i < 0 || i >= SLOTS) {
        fprintf(stderr, "vmm_lifetime: slot %d out of range\n", i);
        exit(2);
    }
    return i;
}

static CUarray arrays[SLOTS];
static CUarrayMapInfo tiles[SLOTS];
static CUmemGenericAllocationHandle mcs[SLOTS];
static size_t mc_sizes[SLOTS];

static CUresult map(int m, int i) {
    CUdeviceptr va = 0;
    CUresult r = cuMemAddressReserve(&va, sizes[i], 0, 0, 0);
    if (r) return r;
    r = cuMemMap(va, sizes[i], 0, handles[i], 0);
    if (r) {
        cuMemAddressFree(va, sizes[i]);
        return r;
    }
    CUmemAccessDesc acc = cq_vmm_access(0);
    r = cuMemSetAccess(va, sizes[i], &acc, 1);
    if (r) return r;
    maps[m] = va;
    map_sizes[m] = sizes[i];
    /* The memory is usable: the tenant really holds it. */
    return cuMemsetD8(va, 0x5a, 4096);
}

static CUresult sparse(int a, int i) {
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 1024;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d.NumChannels = 1;
    d.Flags = CUDA_ARRAY3D_SPARSE;
    CUresult r = cuArray3DCreate(&arrays[a], &d);
    if (r) return r;
    CUarrayMapInfo *m = &tiles[a];
    memset(m, 0, sizeof *m);
    m->resourceType = CU_RESOURCE_TYPE_ARRAY;
    m->resource.array = arrays[a];
    m->subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    m->subresource.sparseLevel.extentWidth = 1024;
    m->subresource.sparseLevel.extentHeight = 1024;
    m->subresource.sparseLevel.extentDepth = 1;
    m->memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    m->memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    m->memHandle.memHandle = handles[i];
    m->deviceBitMask = 1;
    r = cuMemMapArrayAsync(m, 1, 0);
    return r ? r : cuStreamSynchronize(0);
}

static CUresult mcbind(int m, int i, CUdeviceptr at) {
    CUmulticastObjectProp p;
    memset(&p, 0, sizeof p);
    p.numDevices = 1;
    p.size = sizes[i];
    mc_sizes[m] = sizes[i];
    CUresult r = cuMulticastCreate(&mcs[m], &p);
    if (!r) r = cuMulticastAddDevice(mcs[m], 0);
    if (r) return r;
    return at ? cuMulticastBindAddr(mcs[m], 0, at, sizes[i], 0) : cuMulticastBindMem(mcs[m], 0, handles[i], 0, sizes[i], 0);
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "vmm_lifetime: no context\n");
        return 2;
    }
    for (int a = 1; a < argc; a++) {
        const char *c = argv[a];
        char x[64] = "", y[64] = "";
        if (sscanf(c, "create:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            CUmemAllocationProp p = cq_vmm_prop(0, 0);
            sizes[i] = (size_t)cq_size(y);
            printf("create.%d=%s\n", i, cq_err(cuMemCreate(&handles[i], sizes[i], &p, 0)));
        } else if (sscanf(c, "map:%63[^:]:%63s", x, y) == 2) {
            int m = slot(x);
            printf("map.%d=%s\n", m, cq_err(map(m, slot(y))));
        } else if (sscanf(c, "unmap:%63s", x) == 1) {
            int m = slot(x);
            CUresult r = cuMemUnmap(maps[m], map_sizes[m]);
            if (!r) r = cuMemAddressFree(maps[m], map_sizes[m]);
            printf("unmap.%d=%s\n", m, cq_err(r));
        } else if (sscanf(c, "release:%63s", x) == 1) {
            int i = slot(x);
            printf("release.%d=%s\n", i, cq_err(cuMemRelease(handles[i])));
        } else if (sscanf(c, "retain:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x), m = slot(y);
            CUmemGenericAllocationHandle h = 0;
            CUresult r = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)(maps[m] + map_sizes[m] / 2));
            int same = 0;
            for (int j = 0; j < SLOTS; j++) same |= handles[j] && handles[j] == h;
            if (!r) {
                handles[i] = h;
            }
            printf("retain.%d=%s\nretain.%d.same=%d\n", i, cq_err(r), i, same);
        } else if (sscanf(c, "sparse:%63[^:]:%63s", x, y) == 2) {
            int a2 = slot(x);
            printf("sparse.%d=%s\n", a2, cq_err(sparse(a2, slot(y))));
        } else if (sscanf(c, "tileunmap:%63s", x) == 1) {
            int a2 = slot(x);
            tiles[a2].memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
            tiles[a2].memHandle.memHandle = 0;
            CUresult r = cuMemMapArrayAsync(&tiles[a2], 1, 0);
            if (!r) r = cuStreamSynchronize(0);
            printf("tileunmap.%d=%s\n", a2, cq_err(r));
        } else if (sscanf(c, "arraydestroy:%63s", x) == 1) {
            int a2 = slot(x);
            printf("arraydestroy.%d=%s\n", a2, cq_err(cuArrayDestroy(arrays[a2])));
        } else if (sscanf(c, "mcbind:%63[^:]:%63s", x, y) == 2) {
            int m = slot(x);
            printf("mcbind.%d=%s\n", m, cq_err(mcbind(m, slot(y), 0)));
        } else if (sscanf(c, "mcbindaddr:%63[^:]:%63s", x, y) == 2) {
            int m = slot(x), n = slot(y);
            /* The mapping's handle slot: the one whose size matches is enough for these tests. */
            int i = 0;
            while (i < SLOTS && sizes[i] != map_sizes[n]) i++;
            printf("mcbind.%d=%s\n", m, cq_err(i < SLOTS ? mcbind(m, i, maps[n]) : CUDA_ERROR_INVALID_VALUE));
        } else if (sscanf(c, "mcunbind:%63s", x) == 1) {
            int m = slot(x);
            printf("mcunbind.%d=%s\n", m, cq_err(cuMulticastUnbind(mcs[m], 0, 0, mc_sizes[m])));
        } else if (sscanf(c, "alloc:%63s", x) == 1) {
            CUdeviceptr p = 0;
            printf("alloc=%s\n", cq_err(cuMemAlloc(&p, (size_t)cq_size(x))));
        } else if (strcmp(c, "charged") == 0) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo(&f, &t);
            if (r) {
                fprintf(stderr, "vmm_lifetime: cuMemGetInfo: %s\n", cq_err(r));
                return 2;
            }
            printf("charged=%zu\n", t - f);
        } else if (strcmp(c, "used") == 0) {
            cq_rawmem m;
            if (cq_raw_nvml_mem(0, &m)) {
                fprintf(stderr, "vmm_lifetime: simulator NVML unreachable\n");
                return 2;
            }
            printf("used=%llu\n", m.used);
        } else {
            fprintf(stderr, "vmm_lifetime: bad command %s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    printf("done=1\n");
    return 0;
}

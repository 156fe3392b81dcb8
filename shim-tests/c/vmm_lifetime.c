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
 *     alloc:SIZE        cuMemAlloc (kept until exit)                                           alloc=<result>
 *     used              the simulator's own used bytes on device 0 (NVML, past any interposer)     used=
 *     charged           cuMemGetInfo's total − free: what the shim has charged the container        charged=
 *   and done=1 at the end.
 */
#include "cq_driver.h"

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

static CUmemAllocationProp prop0(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static CUresult map(int m, int i) {
    CUdeviceptr va = 0;
    CUresult r = cuMemAddressReserve(&va, sizes[i], 0, 0, 0);
    if (r) return r;
    r = cuMemMap(va, sizes[i], 0, handles[i], 0);
    if (r) {
        cuMemAddressFree(va, sizes[i]);
        return r;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop0().location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemSetAccess(va, sizes[i], &acc, 1);
    if (r) return r;
    maps[m] = va;
    map_sizes[m] = sizes[i];
    /* The memory is usable: the tenant really holds it. */
    return cuMemsetD8(va, 0x5a, 4096);
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
            CUmemAllocationProp p = prop0();
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

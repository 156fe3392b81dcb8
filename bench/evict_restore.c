/* evict_restore: elastic memory's mechanism done by hand with the driver API (issue 39 items 3 and 5), so its
 * cost is known before the library automates it. A device range of SIZE_MIB (cuMemAddressReserve + cuMemCreate
 * + cuMemMap) is, CYCLES times:
 *   evicted:  cuMemCreate(HOST), mapped at a staging address, cuMemcpyAsync device -> host, synchronised;
 *             the device memory unmapped and released; the staging mapping unmapped; the host allocation mapped
 *             at the range's own address, access set;
 *   restored: cuMemCreate(device), mapped at the staging address, cuMemcpyAsync host -> device, synchronised;
 *             both unmapped; the device allocation mapped at the range's address, access set; the host
 *             allocation released.
 * Every byte is compared after the first and the last restore. For reference, plain copies of the same size
 * between the device range and a cuMemAllocHost buffer.
 *
 *   evict_restore SIZE_MIB CYCLES [pool]
 *
 * `pool`: one host allocation, created (and written once) before the cycles, serves every eviction and is kept
 * after each restore, as a pinned-memory budget kept by the agent would; its create and release steps are 0.
 *
 * Prints key=value lines, medians over the cycles, in ns: evict_ns / restore_ns (wall clock, whole sequence),
 * evict_copy_ns / restore_copy_ns (events around the copy alone), plain_d2h_ns / plain_h2d_ns (events),
 * plain_d2h_wall_ns / plain_h2d_wall_ns, and evict_steps_ns / restore_steps_ns (create, map+access, copy,
 * unmap+release, remap+access), bytes and intact=1.
 *
 *   evict_restore managed TENANT_MIB TENANTS ROUNDS
 *
 * The unified-memory baseline (issue 39 item 5; on the simulator with CUDASIM_MANAGED=migrate): TENANTS managed
 * allocations of TENANT_MIB in one process, woken round-robin ROUNDS times (each wake-up a kernel that adds 1 to
 * every byte of one tenant's memory, which pages it in and evicts the least recently used), so on a device
 * smaller than the sum every wake-up finds its memory gone. Prints wake_ns (median, events around the wake-up
 * kernel), wake_bytes, wakeups, failures (launches or synchronisations that failed) and intact (every byte equal
 * to its tenant's wake-up count, read with copies, which do not migrate). Linked with -lcuda. */
#include "elastic_common.h"

#define MAXC 256

enum { CREATE, MAP, COPY, UNMAP, REMAP, NSTEPS };

/* What an eviction and a restore both use: the range, the staging address, the copy's stream and events. */
struct mover {
    CUdeviceptr va, stage;
    size_t n;
    CUdevice d;
    CUstream s;
    CUevent a, b;
};

/* A move's first steps, timed in t[0..3] (create, map + access, copy): `to`, created from `prop` unless that is
 * NULL (a kept allocation), mapped at the staging address and the range's bytes copied into it. */
static void stage_copy(const struct mover *m, CUmemGenericAllocationHandle *to, const CUmemAllocationProp *prop,
                       uint64_t *t) {
    t[0] = now_ns();
    if (prop) CK(cuMemCreate(to, m->n, prop, 0));
    t[1] = now_ns();
    CK(cuMemMap(m->stage, m->n, 0, *to, 0));
    CK(vmm_access(m->stage, m->n, m->d));
    t[2] = now_ns();
    CK(cuEventRecord(m->a, m->s));
    CK(cuMemcpyAsync(m->stage, m->va, m->n, m->s));
    CK(cuEventRecord(m->b, m->s));
    CK(cuStreamSynchronize(m->s));
    t[3] = now_ns();
}

/* Ends cycle i's move at t[5]: its copy's time (events), its whole time and each step's. */
static void record(const struct mover *m, uint64_t *t, int i, uint64_t *copy, uint64_t *total,
                   uint64_t steps[][MAXC]) {
    float ms = 0;
    t[5] = now_ns();
    CK(cuEventElapsedTime(&ms, m->a, m->b));
    copy[i] = (uint64_t)(ms * 1e6);
    total[i] = t[5] - t[0];
    for (int k = 0; k < NSTEPS; k++) steps[k][i] = t[k + 1] - t[k];
}

static int managed(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: evict_restore managed TENANT_MIB TENANTS ROUNDS\n");
        return 2;
    }
    size_t n = parse_num("TENANT_MIB", argv[2], 1, 1 << 20) * MIB;
    int tenants = (int)parse_num("TENANTS", argv[3], 1, 64), rounds = (int)parse_num("ROUNDS", argv[4], 1, MAXC);
    CUdevice d = primary_device();
    CUfunction f = touch_kernel();
    CUdeviceptr t[64];
    for (int i = 0; i < tenants; i++) CK(cuMemAllocManaged(&t[i], n, CU_MEM_ATTACH_GLOBAL));
    for (int i = 0; i < tenants; i++) CK(cuMemsetD8(t[i], 0, n));
    CUstream s;
    CUevent a, b;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    static uint64_t wake[MAXC];
    int failures = 0;
    for (int r = 0; r < rounds; r++) {
        CK(cuEventRecord(a, s));
        CUresult res = launch_touch(f, s, d, t[r % tenants], n, 0);
        if (res == CUDA_SUCCESS) res = cuEventRecord(b, s);
        if (res == CUDA_SUCCESS) res = cuStreamSynchronize(s);
        float ms = 0;
        if (res == CUDA_SUCCESS) res = cuEventElapsedTime(&ms, a, b);
        if (res != CUDA_SUCCESS) {
            fprintf(stderr, "evict_restore managed: wake-up %d: %s\n", r, ename(res));
            failures++;
        }
        wake[r] = (uint64_t)(ms * 1e6);
    }
    int intact = failures == 0;
    unsigned char *buf = malloc(n);
    for (int i = 0; i < tenants && intact; i++) {
        unsigned want = (unsigned)(rounds / tenants + (i < rounds % tenants));
        CK(cuMemcpyDtoH(buf, t[i], n));
        for (size_t k = 0; k < n; k++)
            if (buf[k] != (unsigned char)want) {
                fprintf(stderr, "evict_restore managed: tenant %d byte %zu is %u, not %u\n", i, k, buf[k], want);
                intact = 0;
                break;
            }
    }
    printf("wake_bytes=%zu\nwakeups=%d\nwake_ns=%llu\nfailures=%d\nintact=%d\n", n, rounds,
           (unsigned long long)median_u64(wake, rounds), failures, intact);
    return intact ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "managed")) return managed(argc, argv);
    int pool = argc == 4 && !strcmp(argv[3], "pool");
    if (argc != 3 && !pool) {
        fprintf(stderr, "usage: evict_restore SIZE_MIB CYCLES [pool]\n");
        return 2;
    }
    int cycles = (int)parse_num("CYCLES", argv[2], 1, MAXC);
    size_t mib = parse_num("SIZE_MIB", argv[1], 1, 1 << 20);
    CUdevice d = primary_device();
    size_t g = vmm_granularity(CU_MEM_LOCATION_TYPE_DEVICE, d);
    size_t gh = vmm_granularity(CU_MEM_LOCATION_TYPE_HOST, 0);
    if (!g || !gh) {
        fprintf(stderr, "evict_restore: no VMM granularity for the %s\n", g ? "host" : "device");
        return 1;
    }
    size_t n = round_up(round_up(mib * MIB, g), gh);
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, d);
    CUmemAllocationProp hp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_HOST, 0);
    CUdeviceptr va = 0, stage = 0;
    CUmemGenericAllocationHandle dev_h, host_h;
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    CK(cuMemAddressReserve(&stage, n, 0, 0, 0));
    CK(cuMemCreate(&dev_h, n, &dp, 0));
    CK(cuMemMap(va, n, 0, dev_h, 0));
    CK(vmm_access(va, n, d));
    unsigned char *buf = NULL;
    CK(cuMemAllocHost((void **)&buf, n));
    CUstream s;
    CUevent a, b;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    if (pool) {
        CK(cuMemCreate(&host_h, n, &hp, 0));
        CK(cuMemMap(stage, n, 0, host_h, 0));
        CK(vmm_access(stage, n, d));
        CK(cuMemsetD8(stage, 0, n));
        CK(cuCtxSynchronize());
        CK(cuMemUnmap(stage, n));
    }

    /* The reference: plain copies of the same size to and from pinned memory. */
    static uint64_t pd[MAXC], ph[MAXC], pdw[MAXC], phw[MAXC];
    for (int i = 0; i < cycles; i++)
        for (int dir = 0; dir < 2; dir++) {
            uint64_t t0 = now_ns();
            CK(cuEventRecord(a, s));
            if (dir == 0)
                CK(cuMemcpyDtoHAsync(buf, va, n, s));
            else
                CK(cuMemcpyHtoDAsync(va, buf, n, s));
            CK(cuEventRecord(b, s));
            CK(cuStreamSynchronize(s));
            uint64_t w = now_ns() - t0;
            float ms = 0;
            CK(cuEventElapsedTime(&ms, a, b));
            if (dir == 0)
                pd[i] = (uint64_t)(ms * 1e6), pdw[i] = w;
            else
                ph[i] = (uint64_t)(ms * 1e6), phw[i] = w;
        }
    cq_pattern(buf, n, 11);
    CK(cuMemcpyHtoD(va, buf, n));

    static uint64_t ev[MAXC], re[MAXC], evc[MAXC], rec[MAXC], evs[NSTEPS][MAXC], res[NSTEPS][MAXC];
    int intact = 1;
    struct mover m = {va, stage, n, d, s, a, b};
    for (int i = 0; i < cycles; i++) {
        uint64_t t[NSTEPS + 1];
        /* evict */
        stage_copy(&m, &host_h, pool ? NULL : &hp, t);
        CK(cuMemUnmap(va, n));
        CK(cuMemRelease(dev_h));
        t[4] = now_ns();
        CK(cuMemUnmap(stage, n));
        CK(cuMemMap(va, n, 0, host_h, 0));
        CK(vmm_access(va, n, d));
        record(&m, t, i, evc, ev, evs);
        /* restore */
        stage_copy(&m, &dev_h, &dp, t);
        CK(cuMemUnmap(va, n));
        CK(cuMemUnmap(stage, n));
        t[4] = now_ns();
        CK(cuMemMap(va, n, 0, dev_h, 0));
        CK(vmm_access(va, n, d));
        if (!pool) CK(cuMemRelease(host_h));
        record(&m, t, i, rec, re, res);
        if (i == 0 || i == cycles - 1) {
            memset(buf, 0, n);
            CK(cuMemcpyDtoH(buf, va, n));
            size_t bad = cq_pattern_diff(buf, n, 11, 0);
            if (bad != n) {
                fprintf(stderr, "evict_restore: cycle %d: byte %zu of %zu differs after the restore\n", i, bad, n);
                intact = 0;
            }
        }
    }
    printf("bytes=%zu\ncycles=%d\n", n, cycles);
    printf("evict_ns=%llu\nrestore_ns=%llu\n", (unsigned long long)median_u64(ev, cycles),
           (unsigned long long)median_u64(re, cycles));
    printf("evict_copy_ns=%llu\nrestore_copy_ns=%llu\n", (unsigned long long)median_u64(evc, cycles),
           (unsigned long long)median_u64(rec, cycles));
    printf("plain_d2h_ns=%llu\nplain_h2d_ns=%llu\n", (unsigned long long)median_u64(pd, cycles),
           (unsigned long long)median_u64(ph, cycles));
    printf("plain_d2h_wall_ns=%llu\nplain_h2d_wall_ns=%llu\n", (unsigned long long)median_u64(pdw, cycles),
           (unsigned long long)median_u64(phw, cycles));
    for (int r = 0; r < 2; r++) {
        printf("%s_steps_ns=", r ? "restore" : "evict");
        for (int k = 0; k < NSTEPS; k++)
            printf("%llu%s", (unsigned long long)median_u64(r ? res[k] : evs[k], cycles), k + 1 < NSTEPS ? "," : "\n");
    }
    printf("intact=%d\n", intact);
    return intact ? 0 : 1;
}

/* driver_facts: the driver facts elastic memory rests on (issue 39), printed as one table, each answer with how
 * it was measured. Run first whenever a GPU is available (bench/real_gpu.sh), and on the simulator by
 * bench/tests/driver_facts.rs, which checks that the table is complete and the answers are the modelled ones.
 *
 *   driver_facts            every fact, each in a child process of its own (a fact that faults the context, or
 *                           hangs, costs only its own rows: they say "no answer" and why)
 *   driver_facts FACT       one fact's rows as `row|KEY|ANSWER|HOW` lines
 *
 * Facts: device (name, driver, VMM support, granularities); remap_host, remap_host_numa (a device range moved to a
 * HOST / HOST_NUMA allocation at the same address and back, content compared); kernel_host (a kernel touching
 * the range while host memory backs it); unmap_sync (does cuMemUnmap wait for a kernel that has yet to touch
 * the range); costs (cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease, device and host, 2 MiB,
 * 64 MiB, 1 GiB); bandwidth (H2D / D2H, pinned and pageable).
 * Environment: FACTS_REPS (default 9: the median of that many), FACTS_BW_MIB (default 256), FACTS_TIMEOUT
 * (seconds per fact, default 120). Linked with -lcuda. */
#include "elastic_common.h"
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

static int reps = 9;

static void row(const char *key, const char *how, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void row(const char *key, const char *how, const char *fmt, ...) {
    char answer[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(answer, sizeof answer, fmt, ap);
    va_end(ap);
    printf("row|%s|%s|%s\n", key, answer, how);
    fflush(stdout);
}

/* A step of a fact that may be refused: on failure the fact's answer is "no" with the step and the error. */
#define STEP(key, how, what, x)                                                                                   \
    do {                                                                                                          \
        CUresult r_ = (x);                                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                                 \
            row(key, how, "no: %s: %s", what, ename(r_));                                                         \
            return;                                                                                               \
        }                                                                                                         \
    } while (0)

static int host_numa_id(CUdevice d) {
    int id = -1;
    if (cuDeviceGetAttribute(&id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, d) != CUDA_SUCCESS || id < 0) return 0;
    return id;
}

static void fact_device(void) {
    int drv = 0, vmm = 0, sms = 0, numa = -1;
    char name[256] = "?";
    CUdevice d = primary_device();
    CK(cuDriverGetVersion(&drv));
    CK(cuDeviceGetName(name, sizeof name, d));
    CK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, d);
    size_t total = 0;
    CK(cuDeviceTotalMem(&total, d));
    row("device", "cuDeviceGetName, cuDriverGetVersion, cuDeviceTotalMem, device attributes",
        "%s, driver %d.%d, %zu MiB, %d SMs, %s, host NUMA id %d", name, drv / 1000, drv % 1000 / 10, total / MIB,
        sms, vmm ? "VMM supported" : "**no VMM**", numa);
    row("granularity", "cuMemGetAllocationGranularity(MINIMUM) per location (0: refused)",
        "device %zu KiB, HOST %zu KiB, HOST_NUMA %zu KiB", vmm_granularity(CU_MEM_LOCATION_TYPE_DEVICE, d) >> 10,
        vmm_granularity(CU_MEM_LOCATION_TYPE_HOST, 0) >> 10,
        vmm_granularity(CU_MEM_LOCATION_TYPE_HOST_NUMA, host_numa_id(d)) >> 10);
}

/* Moves an 8 MiB device range to a host allocation of `type` at the same address and back; every byte compared
 * after each move, device free memory read around the host allocation. */
static void remap(const char *key, CUmemLocationType type) {
    CUdevice d = primary_device();
    int id = type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? host_numa_id(d) : 0;
    const char *how = type == CU_MEM_LOCATION_TYPE_HOST
                          ? "8 MiB device range (cuMemCreate + cuMemMap) copied (cuMemcpy) to a HOST allocation "
                            "mapped elsewhere; device memory unmapped and released, the HOST allocation mapped at "
                            "the same address and read back (cuMemcpyDtoH); then a new device allocation filled "
                            "from it and mapped back there; every byte compared; cuMemGetInfo around the host "
                            "allocation"
                          : "as remap_host, with a HOST_NUMA allocation on the device's host NUMA node "
                            "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0 without NUMA)";
    size_t g = vmm_granularity(CU_MEM_LOCATION_TYPE_DEVICE, d), gh = vmm_granularity(type, id);
    if (!g || !gh) {
        row(key, how, "no: cuMemGetAllocationGranularity refuses the %s location", g ? "host" : "device");
        return;
    }
    size_t n = round_up(round_up(8 * MIB, g), gh);
    unsigned char *buf = NULL;
    CK(cuMemAllocHost((void **)&buf, n));
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, d), hp = cq_vmm_prop_at(type, id);
    CUmemGenericAllocationHandle dev_h, host_h, back_h;
    CUdeviceptr va = 0, tmp = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    CK(cuMemAddressReserve(&tmp, n, 0, 0, 0));
    CK(cuMemCreate(&dev_h, n, &dp, 0));
    CK(cuMemMap(va, n, 0, dev_h, 0));
    CK(vmm_access(va, n, d));
    cq_pattern(buf, n, 7);
    CK(cuMemcpyHtoD(va, buf, n));
    CK(cuMemGetInfo(&free0, &total));
    STEP(key, how, "cuMemCreate of the host allocation", cuMemCreate(&host_h, n, &hp, 0));
    CK(cuMemGetInfo(&free1, &total));
    long long charged = (long long)free0 - (long long)free1;
    STEP(key, how, "cuMemMap of the host allocation", cuMemMap(tmp, n, 0, host_h, 0));
    STEP(key, how, "cuMemSetAccess on the host allocation", vmm_access(tmp, n, d));
    STEP(key, how, "cuMemcpy device -> host allocation", cuMemcpy(tmp, va, n));
    CK(cuCtxSynchronize());
    CK(cuMemUnmap(va, n));
    CK(cuMemRelease(dev_h));
    CK(cuMemUnmap(tmp, n));
    STEP(key, how, "cuMemMap of the host allocation at the same address", cuMemMap(va, n, 0, host_h, 0));
    STEP(key, how, "cuMemSetAccess at the same address", vmm_access(va, n, d));
    memset(buf, 0, n);
    STEP(key, how, "cuMemcpyDtoH from the host-backed address", cuMemcpyDtoH(buf, va, n));
    size_t bad = cq_pattern_diff(buf, n, 7, 0);
    if (bad != n) {
        row(key, how, "no: mapped at the same address, but byte %zu of %zu differs there", bad, n);
        return;
    }
    STEP(key, how, "cuMemCreate of the device allocation to restore into", cuMemCreate(&back_h, n, &dp, 0));
    CK(cuMemMap(tmp, n, 0, back_h, 0));
    CK(vmm_access(tmp, n, d));
    STEP(key, how, "cuMemcpy host allocation -> device", cuMemcpy(tmp, va, n));
    CK(cuCtxSynchronize());
    CK(cuMemUnmap(tmp, n));
    CK(cuMemUnmap(va, n));
    CK(cuMemRelease(host_h));
    STEP(key, how, "cuMemMap of device memory back at the address", cuMemMap(va, n, 0, back_h, 0));
    CK(vmm_access(va, n, d));
    memset(buf, 0, n);
    CK(cuMemcpyDtoH(buf, va, n));
    bad = cq_pattern_diff(buf, n, 7, 0);
    if (bad != n) {
        row(key, how, "no: back on the device at the same address, but byte %zu of %zu differs", bad, n);
        return;
    }
    row(key, how,
        "yes: same address to host and back, %zu MiB intact both ways; the host allocation took %lld MiB of "
        "device memory",
        n / MIB, charged / (long long)MIB);
}

/* Maps a host allocation at a device range and lets a kernel add 1 to every byte there. */
static void fact_kernel_host(void) {
    const char *key = "kernel_host";
    const char *how = "2 MiB HOST allocation mapped with device read-write access; touch_add (adds 1 to every byte: "
                      "PTX on a GPU, a touch module on the simulator) launched on it, cuCtxSynchronize, bytes read "
                      "back and compared";
    CUdevice d = primary_device();
    size_t n = round_up(round_up(2 * MIB, vmm_granularity(CU_MEM_LOCATION_TYPE_DEVICE, d)),
                        vmm_granularity(CU_MEM_LOCATION_TYPE_HOST, 0));
    CUfunction f = touch_kernel();
    unsigned char *buf = malloc(n);
    CUmemAllocationProp hp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_HOST, 0);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    STEP(key, how, "cuMemCreate(HOST)", cuMemCreate(&h, n, &hp, 0));
    STEP(key, how, "cuMemMap", cuMemMap(va, n, 0, h, 0));
    STEP(key, how, "cuMemSetAccess", vmm_access(va, n, d));
    cq_pattern(buf, n, 3);
    CK(cuMemcpyHtoD(va, buf, n));
    CUresult r = launch_touch(f, NULL, d, va, n, 0);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
        row(key, how, "faults: %s", ename(r));
        return;
    }
    CK(cuMemcpyDtoH(buf, va, n));
    size_t bad = cq_pattern_diff(buf, n, 3, 1);
    if (bad != n)
        row(key, how, "no: the kernel ran, but byte %zu of %zu is not the kernel's", bad, n);
    else
        row(key, how, "works: every byte of %zu MiB written by the kernel", n / MIB);
}

/* A kernel that touches a range after 1 s; the range unmapped 20 ms after the launch. */
static void fact_unmap_sync(void) {
    const char *key = "unmap_sync";
    const char *how = "touch_add on a 2 MiB device range, spinning 1 s before it touches it; cuMemUnmap 20 ms "
                      "after the launch (wall clock around the call), then cuStreamSynchronize";
    CUdevice d = primary_device();
    size_t n = round_up(2 * MIB, vmm_granularity(CU_MEM_LOCATION_TYPE_DEVICE, d));
    CUfunction f = touch_kernel();
    CUmemAllocationProp dp = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, d);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va = 0;
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    CK(cuMemCreate(&h, n, &dp, 0));
    CK(cuMemMap(va, n, 0, h, 0));
    CK(vmm_access(va, n, d));
    CK(cuMemsetD8(va, 0, n));
    const uint64_t spin = 1000000000;
    uint64_t t0 = now_ns();
    CK(launch_touch(f, s, d, va, n, spin));
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    uint64_t t1 = now_ns();
    CUresult ur = cuMemUnmap(va, n);
    uint64_t t2 = now_ns();
    CUresult sr = cuStreamSynchronize(s);
    uint64_t t3 = now_ns();
    double took = (t2 - t1) / 1e6, left = ((double)spin - (double)(t1 - t0)) / 1e6, end = (t3 - t0) / 1e6;
    if (ur != CUDA_SUCCESS)
        row(key, how, "refused: cuMemUnmap = %s (kernel then: %s)", ename(ur), ename(sr));
    else if (took >= left / 2)
        row(key, how,
            "yes: returned after %.1f ms, the kernel had %.0f ms left; kernel then: %s (done %.0f ms after the "
            "launch)",
            took, left, sr == CUDA_SUCCESS ? "completed" : ename(sr), end);
    else
        row(key, how,
            "no: returned after %.3f ms with the kernel %.0f ms from touching the range; kernel then: %s (seen "
            "%.0f ms after the launch)",
            took, left, sr == CUDA_SUCCESS ? "completed" : ename(sr), end);
}

/* Median cost of each VMM call for one location and size. */
static void costs_row(CUdevice d, CUmemLocationType type, const char *where, size_t size, const char *label) {
    char key[64];
    snprintf(key, sizeof key, "cost_%s_%s", where, label);
    char how[256];
    snprintf(how, sizeof how,
             "median of %d rounds, wall clock around each call: cuMemCreate, cuMemMap, cuMemSetAccess (device "
             "read-write), cuMemUnmap, cuMemRelease of one %s allocation of %s (untouched)",
             reps, where, label);
    int id = type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? host_numa_id(d) : type == CU_MEM_LOCATION_TYPE_DEVICE ? d : 0;
    size_t n = round_up(size, vmm_granularity(type, id));
    CUmemAllocationProp p = cq_vmm_prop_at(type, id);
    uint64_t t[5][64];
    CUdeviceptr va = 0;
    STEP(key, how, "cuMemAddressReserve", cuMemAddressReserve(&va, n, 0, 0, 0));
    for (int i = 0; i < reps; i++) {
        CUmemGenericAllocationHandle h;
        uint64_t a = now_ns();
        STEP(key, how, "cuMemCreate", cuMemCreate(&h, n, &p, 0));
        uint64_t b = now_ns();
        STEP(key, how, "cuMemMap", cuMemMap(va, n, 0, h, 0));
        uint64_t c = now_ns();
        STEP(key, how, "cuMemSetAccess", vmm_access(va, n, d));
        uint64_t e = now_ns();
        STEP(key, how, "cuMemUnmap", cuMemUnmap(va, n));
        uint64_t f = now_ns();
        STEP(key, how, "cuMemRelease", cuMemRelease(h));
        uint64_t g = now_ns();
        t[0][i] = b - a, t[1][i] = c - b, t[2][i] = e - c, t[3][i] = f - e, t[4][i] = g - f;
    }
    CK(cuMemAddressFree(va, n));
    double m[5];
    for (int k = 0; k < 5; k++) m[k] = median_u64(t[k], reps) / 1e3;
    row(key, how, "create %.1f, map %.1f, access %.1f, unmap %.1f, release %.1f us", m[0], m[1], m[2], m[3], m[4]);
}

static void fact_costs(void) {
    CUdevice d = primary_device();
    struct {
        size_t size;
        const char *label;
    } sizes[] = {{2 * MIB, "2MiB"}, {64 * MIB, "64MiB"}, {1024 * MIB, "1GiB"}};
    for (int i = 0; i < 3; i++) costs_row(d, CU_MEM_LOCATION_TYPE_DEVICE, "device", sizes[i].size, sizes[i].label);
    for (int i = 0; i < 3; i++) costs_row(d, CU_MEM_LOCATION_TYPE_HOST, "host", sizes[i].size, sizes[i].label);
}

/* Copy bandwidth per direction, pinned and pageable. Events: the copy queued behind a 100 ms kernel, so the host's
 * speed at issuing it does not count; wall: the copy alone, from the call to cuStreamSynchronize's return. */
static void fact_bandwidth(void) {
    CUdevice d = primary_device();
    CUfunction blocker = spin_kernel();
    const char *e = getenv("FACTS_BW_MIB");
    size_t n = (e ? parse_num("FACTS_BW_MIB", e, 1, 65536) : 256) * MIB;
    void *pinned = NULL, *pageable = malloc(n);
    CK(cuMemAllocHost(&pinned, n));
    memset(pinned, 1, n);
    memset(pageable, 1, n);
    CUdeviceptr dev = 0;
    CK(cuMemAlloc(&dev, n));
    CK(cuMemsetD8(dev, 2, n));
    CUstream s;
    CUevent a, b;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    for (int dir = 0; dir < 2; dir++)
        for (int pin = 1; pin >= 0; pin--) {
            void *h = pin ? pinned : pageable;
            uint64_t ev[64], wall[64];
            for (int i = 0; i < reps; i++) {
                for (int blocked = 1; blocked >= 0; blocked--) {
                    CK(cuStreamSynchronize(s));
                    if (blocked) CK(launch_touch(blocker, s, d, 0, 0, 100000000));
                    uint64_t t0 = now_ns();
                    CK(cuEventRecord(a, s));
                    if (dir == 0)
                        CK(cuMemcpyHtoDAsync(dev, h, n, s));
                    else
                        CK(cuMemcpyDtoHAsync(h, dev, n, s));
                    CK(cuEventRecord(b, s));
                    CK(cuStreamSynchronize(s));
                    wall[i] = now_ns() - t0;
                    float ms = 0;
                    CK(cuEventElapsedTime(&ms, a, b));
                    if (blocked) ev[i] = (uint64_t)(ms * 1e6);
                }
            }
            double gb_ev = n / (double)median_u64(ev, reps), gb_wall = n / (double)median_u64(wall, reps);
            char key[32], how[320];
            snprintf(key, sizeof key, "bw_%s_%s", dir == 0 ? "h2d" : "d2h", pin ? "pinned" : "pageable");
            snprintf(how, sizeof how,
                     "%zu MiB cuMemcpy%sAsync %s %s memory (%s), median of %d: events around the copy queued "
                     "behind a 100 ms kernel; wall: the copy alone, from the call to cuStreamSynchronize's return",
                     n / MIB, dir == 0 ? "HtoD" : "DtoH", dir == 0 ? "from" : "to", pin ? "pinned" : "pageable",
                     pin ? "cuMemAllocHost" : "malloc, touched first", reps);
            row(key, how, "%.2f GB/s (events), %.2f GB/s (wall)", gb_ev, gb_wall);
        }
}

static const struct {
    const char *name;
    const char *rows; /* the keys it answers, space-separated */
} FACTS[] = {
    {"device", "device granularity"},
    {"remap_host", "remap_host"},
    {"remap_host_numa", "remap_host_numa"},
    {"kernel_host", "kernel_host"},
    {"unmap_sync", "unmap_sync"},
    {"costs", "cost_device_2MiB cost_device_64MiB cost_device_1GiB cost_host_2MiB cost_host_64MiB cost_host_1GiB"},
    {"bandwidth", "bw_h2d_pinned bw_h2d_pageable bw_d2h_pinned bw_d2h_pageable"},
};
#define NFACTS (sizeof FACTS / sizeof FACTS[0])

static int run_one(const char *name) {
    if (!strcmp(name, "device")) fact_device();
    else if (!strcmp(name, "remap_host")) remap("remap_host", CU_MEM_LOCATION_TYPE_HOST);
    else if (!strcmp(name, "remap_host_numa")) remap("remap_host_numa", CU_MEM_LOCATION_TYPE_HOST_NUMA);
    else if (!strcmp(name, "kernel_host")) fact_kernel_host();
    else if (!strcmp(name, "unmap_sync")) fact_unmap_sync();
    else if (!strcmp(name, "costs")) fact_costs();
    else if (!strcmp(name, "bandwidth")) fact_bandwidth();
    else {
        fprintf(stderr, "driver_facts: no fact %s\n", name);
        return 2;
    }
    return 0;
}

/* Runs `driver_facts FACT` as a child with a timeout; its row lines are appended to `out` (size `cap`). Returns
 * a reason when it did not end well ("" when it did). */
static const char *run_child(const char *name, unsigned timeout_s, char *out, size_t cap, char *why, size_t wcap) {
    int fd[2];
    if (pipe(fd)) return "pipe failed";
    pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        alarm(timeout_s); /* kept across exec: SIGALRM ends a hung fact */
        execl("/proc/self/exe", "driver_facts", name, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t len = strlen(out);
    ssize_t r;
    while (len + 1 < cap && (r = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)r;
    out[len] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    why[0] = 0;
    if (WIFSIGNALED(st))
        snprintf(why, wcap, "killed by signal %d%s", WTERMSIG(st),
                 WTERMSIG(st) == SIGALRM ? " (the fact's timeout)" : "");
    else if (WEXITSTATUS(st) != 0)
        snprintf(why, wcap, "exit %d (its stderr says why)", WEXITSTATUS(st));
    return why;
}

/* Prints the row for `key` found in `out`, or a "no answer" row. Returns 1 when answered. */
static int print_row(const char *out, const char *key, const char *why) {
    char pat[80];
    snprintf(pat, sizeof pat, "row|%s|", key);
    const char *p = strstr(out, pat);
    if (p && (p == out || p[-1] == '\n')) {
        p += strlen(pat);
        const char *bar = strchr(p, '|'), *nl = strchr(p, '\n');
        if (bar && nl && bar < nl) {
            printf("| %s | %.*s | %.*s |\n", key, (int)(bar - p), p, (int)(nl - bar - 1), bar + 1);
            return 1;
        }
    }
    printf("| %s | no answer: %s | - |\n", key, why[0] ? why : "the fact printed no row for it");
    return 0;
}

int main(int argc, char **argv) {
    const char *e = getenv("FACTS_REPS");
    if (e) reps = (int)parse_num("FACTS_REPS", e, 1, 64);
    if ((e = getenv("FACTS_BW_MIB"))) parse_num("FACTS_BW_MIB", e, 1, 65536);
    if (argc == 2) return run_one(argv[1]);
    if (argc != 1) {
        fprintf(stderr, "usage: driver_facts [FACT]\n");
        return 2;
    }
    e = getenv("FACTS_TIMEOUT");
    unsigned timeout_s = e ? (unsigned)parse_num("FACTS_TIMEOUT", e, 1, 86400) : 120;
    static char out[1 << 16];
    printf("| fact | answer | how it was measured |\n| --- | --- | --- |\n");
    int rows = 0, answered = 0;
    for (size_t i = 0; i < NFACTS; i++) {
        char why[128];
        out[0] = 0;
        run_child(FACTS[i].name, timeout_s, out, sizeof out, why, sizeof why);
        char keys[256];
        snprintf(keys, sizeof keys, "%s", FACTS[i].rows);
        for (char *save = NULL, *k = strtok_r(keys, " ", &save); k; k = strtok_r(NULL, " ", &save)) {
            rows++;
            answered += print_row(out, k, why);
        }
        fflush(stdout);
    }
    printf("\nfacts: %d rows, %d answered, %d without an answer (median of %d where timed)\n", rows, answered,
           rows - answered, reps);
    return answered == rows ? 0 : 1;
}

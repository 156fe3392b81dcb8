/* priority_tenant.c: the two tenants of the priority benchmark (bench-throttle --only priority) and tests.
 *
 *   priority_tenant hp SECONDS KERNELS KERNEL_NS GAP_MIN_NS GAP_MAX_NS SEED [START_AT_NS]
 *       A latency-critical tenant: bursts of KERNELS kernels of KERNEL_NS each, launched back to back on one
 *       stream, then cuStreamSynchronize; then idle for a random gap in [GAP_MIN_NS, GAP_MAX_NS]; until SECONDS
 *       have passed. Prints lat_ns=<one latency per burst>: from just before the first launch to the end of the
 *       burst's last kernel.
 *   priority_tenant be SECONDS KMIN_NS KMAX_NS SEED [START_AT_NS]
 *       A best-effort tenant: kernels of a random length in [KMIN_NS, KMAX_NS] launched as fast as the driver
 *       (and cuquota) accept them, until SECONDS have passed; then cuCtxSynchronize. PT_BE_DEPTH=N (environment)
 *       synchronises after every N launches, as a training loop does (default: never; a real GPU then queues
 *       seconds of work, which no tenant's latency figure is about). PT_BE_MULTI=1 launches through
 *       cuLaunchCooperativeKernelMultiDevice (one entry: this device) instead of cuLaunchKernel.
 *       PT_BE_COPY=copy or =set issues no kernel: each "kernel" is a device-to-device cuMemcpyDtoDAsync or a
 *       cuMemsetD32Async of as many bytes as take its length at CUDASIM_COPY_GBPS (simulator only).
 *
 * Both print pid, t0_ns and end_ns (CLOCK_MONOTONIC: the window they worked in), mode, kernels and busy_ns
 * (the device time of what they launched).
 *
 * On the simulator (it exports cudasimDeviceBusyNs) kernels come from a CUDASIM-MODULE text module and take
 * waves x ns-per-wave; a burst's end is read from the device timeline (the time the process's busy time
 * reached the burst's total), so a slow wake-up of this process after the synchronisation does not count.
 * On a real GPU (mode=real) the kernel is a PTX spin loop on %globaltimer, one block per SM, and a burst ends
 * when cuStreamSynchronize returns. The driver is reached through dlopen + dlsym, as the CUDA runtime does.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*LaunchMulti)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned); /* PT_BE_MULTI only */
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);                       /* PT_BE_COPY only */
    CUresult (*CopyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*SetAsync)(CUdeviceptr, unsigned, size_t, CUstream);
    unsigned (*BusyNs)(unsigned, unsigned, unsigned long long, unsigned long long, unsigned long long *);
} d;

static int sms = 1;
static CUmodule mod;
static CUfunction spin_fn;
static CUstream stream;
/* PT_BE_COPY: 'c' (copies) or 's' (memsets) instead of kernels, bytes per ns, and the two buffers. */
static char copy_mode;
static double copy_gbps = 1; /* bytes per ns */
static CUdeviceptr buf[2];
/* priority_copy_estimates.rs: PT_BE_COPY=fresh: 4-byte memsets (their measured ~0 ns drag the process's estimate of unseen keys
 * down), and once, at volley_at, one copy of each size class 2^17..2^22 bytes never used before (each estimated at
 * that mean: the budget lets all of them queue). */
static uint64_t volley_at;
/* priority_copy_estimates.rs: PT_BE_COPY=graph: one exec of a captured 1-copy graph, switched by cuGraphExecUpdate between a
 * 4-byte copy (launched, spaced, until measured: a sample below half the estimate replaces it) and a 2^19-byte one
 * (5.2 ms at 0.1 GB/s; launched 12 times at the small estimate). */
static void *g_small, *g_big, *g_exec;
/* priority_copy_estimates.rs: PT_BE_COPY=race: a 2D copy keyed by the struct as the shim reads it on entry (1 row of 64 B),
 * whose Height another thread raises to 8192 rows (5.2 ms) 20 us later: the driver reads the struct again when
 * the gate lets the call go. */
#include <pthread.h>
static CUDA_MEMCPY2D rc_p;
static volatile int rc_go;
static CUresult (*Copy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
static void *rc_flipper(void *arg) {
    (void)arg;
    for (;;) {
        while (!__atomic_load_n(&rc_go, __ATOMIC_ACQUIRE)) {
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        __atomic_store_n((volatile size_t *)&rc_p.Height, (size_t)8192, __ATOMIC_RELEASE);
        __atomic_store_n(&rc_go, 0, __ATOMIC_RELEASE);
    }
    return NULL;
}
static int g_phase;
static CUresult (*BeginCapture)(CUstream, int);
static CUresult (*EndCapture)(CUstream, void **);
static CUresult (*Instantiate)(void **, void *, unsigned long long);
static CUresult (*ExecUpdate)(void *, void *, void *);
static CUresult (*GraphLaunch)(void *, CUstream);
static CUdeviceptr big[2];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static void die(const char *what, CUresult r) {
    fprintf(stderr, "priority_tenant: %s failed: %d\n", what, (int)r);
    exit(2);
}
#define CK(call)                                                                                                \
    do {                                                                                                        \
        CUresult r_ = (call);                                                                                   \
        if (r_ != CUDA_SUCCESS) die(#call, r_);                                                                 \
    } while (0)

static uint64_t rng;
static uint64_t next_rand(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static uint64_t uniform(uint64_t lo, uint64_t hi) { return hi <= lo ? lo : lo + next_rand() % (hi - lo + 1); }

/* A real GPU's kernel: spin until `ns` of %globaltimer have passed. */
static const char PTX[] = ".version 7.0\n"
                          ".target sm_50\n"
                          ".address_size 64\n"
                          ".visible .entry spin(.param .u64 ns)\n"
                          "{\n"
                          "  .reg .u64 %t0, %t1, %d, %n;\n"
                          "  .reg .pred %p;\n"
                          "  ld.param.u64 %n, [ns];\n"
                          "  mov.u64 %t0, %globaltimer;\n"
                          "LOOP:\n"
                          "  mov.u64 %t1, %globaltimer;\n"
                          "  sub.u64 %d, %t1, %t0;\n"
                          "  setp.lt.u64 %p, %d, %n;\n"
                          "  @%p bra LOOP;\n"
                          "  ret;\n"
                          "}\n";

/* The simulator's kernels: waves x `unit` ns each. */
static uint64_t unit_ns;

static void setup(uint64_t unit) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
#define R(field, sym)                                                                                           \
    do {                                                                                                        \
        *(void **)&d.field = dlsym(lib, sym);                                                                   \
        if (!d.field) {                                                                                         \
            fprintf(stderr, "no %s\n", sym);                                                                    \
            exit(2);                                                                                            \
        }                                                                                                       \
    } while (0)
    R(Init, "cuInit");
    R(DeviceGet, "cuDeviceGet");
    R(DeviceGetAttribute, "cuDeviceGetAttribute");
    R(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(CtxSetCurrent, "cuCtxSetCurrent");
    R(CtxSynchronize, "cuCtxSynchronize");
    R(ModuleLoadData, "cuModuleLoadData");
    R(ModuleGetFunction, "cuModuleGetFunction");
    R(StreamCreate, "cuStreamCreate");
    R(StreamSynchronize, "cuStreamSynchronize");
    R(LaunchKernel, "cuLaunchKernel");
    if (getenv("PT_BE_MULTI")) R(LaunchMulti, "cuLaunchCooperativeKernelMultiDevice");
    if (getenv("PT_BE_COPY")) {
        copy_mode = getenv("PT_BE_COPY")[0];
        R(MemAlloc, "cuMemAlloc_v2");
        R(CopyAsync, "cuMemcpyDtoDAsync_v2");
        R(SetAsync, "cuMemsetD32Async");
        const char *g = getenv("CUDASIM_COPY_GBPS");
        if (g) copy_gbps = atof(g);
        if (copy_gbps <= 0) copy_gbps = 1;
    }
#undef R
    *(void **)&d.BusyNs = dlsym(lib, "cudasimDeviceBusyNs"); /* NULL on a real driver */
    CK(d.Init(0));
    CUdevice dev;
    CK(d.DeviceGet(&dev, 0));
    CUcontext ctx;
    CK(d.PrimaryCtxRetain(&ctx, dev));
    CK(d.CtxSetCurrent(ctx));
    CK(d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    if (d.BusyNs) {
        char image[128];
        unit_ns = unit ? unit : 1;
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel spin %llu\n", (unsigned long long)unit_ns);
        CK(d.ModuleLoadData(&mod, image));
    } else {
        CK(d.ModuleLoadData(&mod, PTX));
    }
    CK(d.ModuleGetFunction(&spin_fn, mod, "spin"));
    CK(d.StreamCreate(&stream, 0));
}

/* Launches one kernel of about `ns` (PT_BE_COPY: a copy or memset of that length); returns the device time it
 * takes. */
static uint64_t launch(uint64_t ns) {
    if (copy_mode == 'r' && d.BusyNs) {
        __atomic_store_n((volatile size_t *)&rc_p.Height, (size_t)1, __ATOMIC_RELEASE);
        __atomic_store_n(&rc_go, 1, __ATOMIC_RELEASE);
        CK(Copy2DAsync(&rc_p, stream));
        while (__atomic_load_n(&rc_go, __ATOMIC_ACQUIRE)) {
        }
        return (uint64_t)(64.0 * 8192 / copy_gbps); /* at most */
    }
    if (copy_mode == 'g' && d.BusyNs) {
        char info[64];
        CK(d.StreamSynchronize(stream));
        int bigonly = getenv("PT_BE_GRAPH_BIGONLY") != NULL; /* the control: never updated to the small one */
        CK(ExecUpdate(g_exec, bigonly ? g_big : g_small, info));
        for (int i = 0; i < 6; i++) {
            if (!bigonly) CK(GraphLaunch(g_exec, stream));
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        CK(d.StreamSynchronize(stream));
        CK(ExecUpdate(g_exec, g_big, info));
        for (int i = 0; i < 12; i++) CK(GraphLaunch(g_exec, stream));
        g_phase++;
        return (uint64_t)(12.0 * (double)(1 << 19) / copy_gbps);
    }
    if (copy_mode == 'f' && d.BusyNs) {
        if (volley_at && now_ns() >= volley_at) {
            volley_at = 0;
            uint64_t t = 0;
            for (int k = 17; k <= 22; k++) {
                CK(d.CopyAsync(big[1], big[0], (size_t)1 << k, stream));
                t += (uint64_t)((double)((size_t)1 << k) / copy_gbps);
            }
            fprintf(stderr, "volley issued: %llu ns of copies\n", (unsigned long long)t);
            return t;
        }
        CK(d.SetAsync(buf[0], 0x5a5a5a5au, 1, stream));
        return (uint64_t)(4.0 / copy_gbps);
    }
    if (copy_mode && d.BusyNs) {
        size_t bytes = (size_t)((double)ns * copy_gbps) & ~(size_t)3;
        if (copy_mode == 's')
            CK(d.SetAsync(buf[0], 0x5a5a5a5au, bytes / 4, stream));
        else
            CK(d.CopyAsync(buf[1], buf[0], bytes, stream));
        return (uint64_t)((double)bytes / copy_gbps);
    }
    if (d.BusyNs) {
        uint64_t waves = ns / unit_ns;
        if (waves == 0) waves = 1;
        if (d.LaunchMulti) {
            CUDA_LAUNCH_PARAMS lp;
            memset(&lp, 0, sizeof lp);
            lp.function = spin_fn;
            lp.gridDimX = (unsigned)(waves * (uint64_t)sms);
            lp.gridDimY = lp.gridDimZ = 1;
            lp.blockDimX = 32;
            lp.blockDimY = lp.blockDimZ = 1;
            lp.hStream = stream;
            CK(d.LaunchMulti(&lp, 1, 0));
            return waves * unit_ns;
        }
        CK(d.LaunchKernel(spin_fn, (unsigned)(waves * (uint64_t)sms), 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        return waves * unit_ns;
    }
    void *args[] = {&ns};
    CK(d.LaunchKernel(spin_fn, (unsigned)sms, 1, 1, 32, 1, 1, 0, stream, args, NULL));
    return ns;
}

/* On the simulator: when this process's device time since `from` reached `total` (the end of its last
 * kernel), searched between `from` and `to` to the nanosecond. */
static uint64_t done_at(uint64_t from, uint64_t to, uint64_t total) {
    unsigned pid = (unsigned)getpid();
    uint64_t lo = from, hi = to;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        unsigned long long b = 0;
        if (d.BusyNs(0, pid, from, mid, &b) != 0) return to;
        if (b >= total)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

static void header(uint64_t t0, uint64_t until) {
    printf("pid=%d\nmode=%s\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), d.BusyNs ? "sim" : "real",
           (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
}

static int hp(int argc, char **argv) {
    if (argc < 8) return 2;
    double seconds = atof(argv[2]);
    int kernels = atoi(argv[3]);
    uint64_t kernel_ns = strtoull(argv[4], NULL, 10);
    uint64_t gmin = strtoull(argv[5], NULL, 10), gmax = strtoull(argv[6], NULL, 10);
    rng = strtoull(argv[7], NULL, 10) | 1;
    uint64_t start_at = argc > 8 ? strtoull(argv[8], NULL, 10) : 0;
    setup(kernel_ns);
    launch(kernel_ns); /* load and warm up (and let cuquota measure the kernel) */
    CK(d.StreamSynchronize(stream));
    if (start_at > now_ns()) sleep_until(start_at);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    header(t0, until);
    uint64_t busy = 0, n = 0;
    size_t cap = 1024, len = 0;
    uint64_t *lat = malloc(cap * sizeof *lat);
    while (now_ns() < until) {
        uint64_t b0 = now_ns(), total = 0;
        for (int i = 0; i < kernels; i++) total += launch(kernel_ns);
        CK(d.StreamSynchronize(stream));
        uint64_t b1 = now_ns();
        uint64_t end = d.BusyNs ? done_at(b0, b1, total) : b1;
        if (len == cap) lat = realloc(lat, (cap *= 2) * sizeof *lat);
        lat[len++] = end - b0;
        busy += total;
        n += (uint64_t)kernels;
        sleep_until(now_ns() + uniform(gmin, gmax));
    }
    printf("kernels=%llu\nbusy_ns=%llu\nbursts=%zu\nlat_ns=", (unsigned long long)n, (unsigned long long)busy, len);
    for (size_t i = 0; i < len; i++) printf("%s%llu", i ? "," : "", (unsigned long long)lat[i]);
    printf("\n");
    return 0;
}

static int be(int argc, char **argv) {
    if (argc < 6) return 2;
    double seconds = atof(argv[2]);
    uint64_t kmin = strtoull(argv[3], NULL, 10), kmax = strtoull(argv[4], NULL, 10);
    rng = strtoull(argv[5], NULL, 10) | 1;
    uint64_t start_at = argc > 6 ? strtoull(argv[6], NULL, 10) : 0;
    /* Lengths in steps of kmin/10 (the simulator's wave), so [kmin, kmax] is covered evenly. */
    setup(kmin / 10);
    if (copy_mode) {
        CK(d.MemAlloc(&buf[0], (size_t)((double)kmax * copy_gbps) + 4));
        CK(d.MemAlloc(&buf[1], (size_t)((double)kmax * copy_gbps) + 4));
        if (copy_mode == 'r') {
            void *lib = dlopen("libcuda.so.1", RTLD_NOW);
            *(void **)&Copy2DAsync = dlsym(lib, "cuMemcpy2DAsync_v2");
            CK(d.MemAlloc(&big[0], (size_t)1 << 19));
            CK(d.MemAlloc(&big[1], (size_t)1 << 19));
            memset(&rc_p, 0, sizeof rc_p);
            rc_p.srcMemoryType = rc_p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
            rc_p.srcDevice = big[0];
            rc_p.dstDevice = big[1];
            rc_p.srcPitch = rc_p.dstPitch = 64;
            rc_p.WidthInBytes = 64;
            rc_p.Height = 1;
            pthread_t th;
            pthread_create(&th, NULL, rc_flipper, NULL);
        }
        if (copy_mode == 'g') {
            void *lib = dlopen("libcuda.so.1", RTLD_NOW);
            *(void **)&BeginCapture = dlsym(lib, "cuStreamBeginCapture_v2");
            *(void **)&EndCapture = dlsym(lib, "cuStreamEndCapture");
            *(void **)&Instantiate = dlsym(lib, "cuGraphInstantiateWithFlags");
            *(void **)&ExecUpdate = dlsym(lib, "cuGraphExecUpdate_v2");
            *(void **)&GraphLaunch = dlsym(lib, "cuGraphLaunch");
            CK(d.MemAlloc(&big[0], (size_t)1 << 19));
            CK(d.MemAlloc(&big[1], (size_t)1 << 19));
            CK(BeginCapture(stream, 2));
            if (getenv("PT_BE_GRAPH_KERNEL"))
                CK(d.LaunchKernel(spin_fn, (unsigned)sms, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            else
                CK(d.CopyAsync(big[1], big[0], 4, stream));
            CK(EndCapture(stream, &g_small));
            CK(BeginCapture(stream, 2));
            if (getenv("PT_BE_GRAPH_KERNEL")) /* 50 waves of kmin/10: the same 5.2 ms order */
                CK(d.LaunchKernel(spin_fn, (unsigned)(52 * sms), 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            else
                CK(d.CopyAsync(big[1], big[0], (size_t)1 << 19, stream));
            CK(EndCapture(stream, &g_big));
            CK(Instantiate(&g_exec, g_small, 0));
        }
        if (copy_mode == 'f') {
            CK(d.MemAlloc(&big[0], (size_t)1 << 22));
            CK(d.MemAlloc(&big[1], (size_t)1 << 22));
            const char *v = getenv("PT_BE_VOLLEY_NS");
            volley_at = (start_at > now_ns() ? start_at : now_ns()) + (v ? strtoull(v, NULL, 10) : 1500000000ull);
        }
    }
    if (start_at > now_ns()) sleep_until(start_at);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    header(t0, until);
    uint64_t busy = 0, n = 0;
    const char *depth_env = getenv("PT_BE_DEPTH");
    uint64_t depth = depth_env ? strtoull(depth_env, NULL, 10) : 0;
    while (now_ns() < until) {
        busy += launch(uniform(kmin, kmax));
        n++;
        if (depth && n % depth == 0) CK(d.StreamSynchronize(stream));
    }
    CK(d.CtxSynchronize());
    printf("kernels=%llu\nbusy_ns=%llu\ndone_ns=%llu\n", (unsigned long long)n, (unsigned long long)busy,
           (unsigned long long)now_ns());
    return 0;
}

int main(int argc, char **argv) {
    int r = 2;
    if (argc > 1 && strcmp(argv[1], "hp") == 0) r = hp(argc, argv);
    if (argc > 1 && strcmp(argv[1], "be") == 0) r = be(argc, argv);
    if (r == 2)
        fprintf(stderr, "usage: priority_tenant hp SECONDS KERNELS KERNEL_NS GAP_MIN_NS GAP_MAX_NS SEED [START_AT_NS]\n"
                        "       priority_tenant be SECONDS KMIN_NS KMAX_NS SEED [START_AT_NS]\n");
    return r;
}

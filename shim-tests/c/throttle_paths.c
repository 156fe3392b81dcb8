/* throttle_paths.c: drives one kernel-launch path flat out for a while and reports the share of the (simulated)
 * device its kernels took, so a test can check that libcuquota.so throttles that path.
 *
 *   throttle_paths PATH STYLE SECONDS KERNEL_NS [BLOCKS] [START_AT_NS]
 *
 * PATH   kernel | kernel_ex | coop | coop_multi | graph | launch | grid | grid_async
 * STYLE  direct (linked -lcuda, compiled -DTHR_DIRECT; with -DCUDA_API_PER_THREAD_DEFAULT_STREAM the _ptsz forms)
 *        dlsym | dlsym_ptsz (dlopen("libcuda.so.1") + dlsym of the versioned / _ptsz names)
 *        gpa | gpa_ptsz (everything through cuGetProcAddress_v2, version 13000, flags 0 / PER_THREAD)
 * KERNEL_NS  device time of one kernel (a CUDASIM-MODULE text module sets ns per wave so that BLOCKS blocks take
 *            that long on this device's SM count)
 * START_AT_NS  CLOCK_MONOTONIC time to start at (lets several processes run the same window)
 * THR_STREAMS=N (environment)  launch round-robin on N streams (default 1): N full launch queues
 *
 * Output (one key=value a line): pid, t0_ns and end_ns (CLOCK_MONOTONIC: the launch loop ran from t0 until end,
 * so tests read the achieved share from the simulator's timeline over that window), then path, style, kernels=N,
 * kernel_ns=D, busy_ns=B, wall_ns=W, share=S — the program's own count: S = B / W in percent, where W runs from
 * the start to the moment every launched kernel has completed (cuCtxSynchronize).
 *
 * Overhead mode:  throttle_paths overhead STYLE N  — times N launches of a 0-ns kernel through the function
 * pointer the program resolves (hooked when libcuquota.so is preloaded) and through the simulator's own
 * cuLaunchKernel (read from the simulator's dynamic symbol table, which the preload cannot shadow), interleaved in batches, and
 * prints the median ns per launch of each.
 */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* the legacy launch calls are what we test */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cq_elf.h"

typedef CUresult (*pfn_LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, CUstream, void **, void **);
typedef CUresult (*pfn_LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*pfn_LaunchCoop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, CUstream, void **);
typedef CUresult (*pfn_LaunchCoopMulti)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
typedef CUresult (*pfn_GraphLaunch)(CUgraphExec, CUstream);
typedef CUresult (*pfn_Launch)(CUfunction);
typedef CUresult (*pfn_LaunchGrid)(CUfunction, int, int);
typedef CUresult (*pfn_LaunchGridAsync)(CUfunction, int, int, CUstream);
typedef CUresult (*pfn_GetProcAddress)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

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
    CUresult (*FuncSetBlockShape)(CUfunction, int, int, int);
    CUresult (*ParamSetSize)(CUfunction, unsigned);
    CUresult (*GraphCreate)(CUgraph *, unsigned);
    CUresult (*GraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                   const CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    pfn_LaunchKernel LaunchKernel;
    pfn_LaunchKernelEx LaunchKernelEx;
    pfn_LaunchCoop LaunchCoop;
    pfn_LaunchCoopMulti LaunchCoopMulti;
    pfn_GraphLaunch GraphLaunch;
    pfn_Launch Launch;
    pfn_LaunchGrid LaunchGrid;
    pfn_LaunchGridAsync LaunchGridAsync;
} d;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, CUresult r) {
    fprintf(stderr, "throttle_paths: %s failed: %d\n", what, (int)r);
    exit(2);
}
#define CK(call)                                                                                                \
    do {                                                                                                        \
        CUresult r_ = (call);                                                                                   \
        if (r_ != CUDA_SUCCESS) die(#call, r_);                                                                 \
    } while (0)

static void *lib;
static pfn_GetProcAddress gpa;
static int gpa_flags;
static int use_gpa;

/* Resolve `base` (name for cuGetProcAddress) / `sym` (versioned symbol) / `ptsz` (per-thread symbol or NULL). */
__attribute__((unused)) static void *resolve(const char *base, const char *sym, const char *ptsz, int want_ptsz) {
    void *p = NULL;
    if (use_gpa) {
        CUdriverProcAddressQueryResult st;
        if (gpa(base, &p, 13000, (cuuint64_t)gpa_flags, &st) != CUDA_SUCCESS) p = NULL;
    } else {
        p = dlsym(lib, (want_ptsz && ptsz) ? ptsz : sym);
    }
    return p;
}

static void load(const char *style) {
#ifdef THR_DIRECT
    (void)style;
    d.Init = cuInit;
    d.DeviceGet = cuDeviceGet;
    d.DeviceGetAttribute = cuDeviceGetAttribute;
    d.PrimaryCtxRetain = cuDevicePrimaryCtxRetain;
    d.CtxSetCurrent = cuCtxSetCurrent;
    d.CtxSynchronize = cuCtxSynchronize;
    d.ModuleLoadData = cuModuleLoadData;
    d.ModuleGetFunction = cuModuleGetFunction;
    d.StreamCreate = cuStreamCreate;
    d.FuncSetBlockShape = cuFuncSetBlockShape;
    d.ParamSetSize = cuParamSetSize;
    d.GraphCreate = cuGraphCreate;
    d.GraphAddKernelNode = cuGraphAddKernelNode;
    d.GraphInstantiate = cuGraphInstantiate;
    d.LaunchKernel = cuLaunchKernel;
    d.LaunchKernelEx = cuLaunchKernelEx;
    d.LaunchCoop = cuLaunchCooperativeKernel;
    d.LaunchCoopMulti = cuLaunchCooperativeKernelMultiDevice;
    d.GraphLaunch = cuGraphLaunch;
    d.Launch = cuLaunch;
    d.LaunchGrid = cuLaunchGrid;
    d.LaunchGridAsync = cuLaunchGridAsync;
#else
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    int ptsz = strstr(style, "ptsz") != NULL;
    if (strncmp(style, "gpa", 3) == 0) {
        use_gpa = 1;
        gpa_flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
        gpa = (pfn_GetProcAddress)dlsym(lib, "cuGetProcAddress_v2");
        if (!gpa) {
            fprintf(stderr, "no cuGetProcAddress_v2\n");
            exit(2);
        }
    }
#define R(field, base, sym, pt) *(void **)&d.field = resolve(base, sym, pt, ptsz)
    R(Init, "cuInit", "cuInit", NULL);
    R(DeviceGet, "cuDeviceGet", "cuDeviceGet", NULL);
    R(DeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute", NULL);
    R(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", NULL);
    R(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", NULL);
    R(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", NULL);
    R(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", NULL);
    R(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", NULL);
    R(StreamCreate, "cuStreamCreate", "cuStreamCreate", NULL);
    R(FuncSetBlockShape, "cuFuncSetBlockShape", "cuFuncSetBlockShape", NULL);
    R(ParamSetSize, "cuParamSetSize", "cuParamSetSize", NULL);
    R(GraphCreate, "cuGraphCreate", "cuGraphCreate", NULL);
    R(GraphAddKernelNode, "cuGraphAddKernelNode", "cuGraphAddKernelNode_v2", NULL);
    R(GraphInstantiate, "cuGraphInstantiate", "cuGraphInstantiateWithFlags", NULL);
    R(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz");
    R(LaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz");
    R(LaunchCoop, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz");
    R(LaunchCoopMulti, "cuLaunchCooperativeKernelMultiDevice", "cuLaunchCooperativeKernelMultiDevice", NULL);
    R(GraphLaunch, "cuGraphLaunch", "cuGraphLaunch", "cuGraphLaunch_ptsz");
    R(Launch, "cuLaunch", "cuLaunch", NULL);
    R(LaunchGrid, "cuLaunchGrid", "cuLaunchGrid", NULL);
    R(LaunchGridAsync, "cuLaunchGridAsync", "cuLaunchGridAsync", NULL);
#undef R
#endif
}

static CUfunction make_kernel(CUdevice dev, uint64_t kernel_ns, unsigned blocks, unsigned *waves_out) {
    int sms = 1;
    CK(d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    unsigned waves = (blocks + (unsigned)sms - 1) / (unsigned)sms;
    if (waves == 0) waves = 1;
    uint64_t per_wave = kernel_ns / waves;
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\n", (unsigned long long)per_wave);
    CUmodule m;
    CK(d.ModuleLoadData(&m, image));
    CUfunction f;
    CK(d.ModuleGetFunction(&f, m, "k"));
    *waves_out = waves;
    return f;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int overhead(const char *style, long n) {
    load(style);
    /* The simulator's own cuLaunchKernel, read from its dynamic symbol table (past libcuquota's dlsym/dlvsym). */
    void *simlib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    pfn_LaunchKernel raw = simlib ? (pfn_LaunchKernel)cq_elf_sym(simlib, "cuLaunchKernel") : NULL;
    if (!raw) {
        fprintf(stderr, "cannot find the simulator's own cuLaunchKernel\n");
        return 2;
    }
    CK(d.Init(0));
    CUdevice dev;
    CK(d.DeviceGet(&dev, 0));
    CUcontext ctx;
    CK(d.PrimaryCtxRetain(&ctx, dev));
    CK(d.CtxSetCurrent(ctx));
    unsigned waves;
    CUfunction f = make_kernel(dev, 0, 1, &waves);
    CUstream s;
    CK(d.StreamCreate(&s, 0));
    enum { BATCH = 100 };
    long batches = n / BATCH;
    if (batches < 1) batches = 1;
    uint64_t *th = malloc(sizeof(uint64_t) * (size_t)batches), *tr = malloc(sizeof(uint64_t) * (size_t)batches);
    for (int i = 0; i < 1000; i++) { /* warm up both, and let the throttle measure the kernel */
        CK(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CK(raw(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    }
    CK(d.CtxSynchronize());
    for (long b = 0; b < batches; b++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < BATCH; i++) CK(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        uint64_t t1 = now_ns();
        for (int i = 0; i < BATCH; i++) CK(raw(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        uint64_t t2 = now_ns();
        th[b] = t1 - t0;
        tr[b] = t2 - t1;
    }
    CK(d.CtxSynchronize());
    qsort(th, (size_t)batches, sizeof(uint64_t), cmp_u64);
    qsort(tr, (size_t)batches, sizeof(uint64_t), cmp_u64);
    double mh = (double)th[batches / 2] / BATCH, mr = (double)tr[batches / 2] / BATCH;
    printf("hook_ns=%.1f\ndirect_ns=%.1f\nadded_ns=%.1f\nlaunches=%ld\n", mh, mr, mh - mr, batches * BATCH);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "overhead") == 0) return overhead(argv[2], atol(argv[3]));
    if (argc < 5) {
        fprintf(stderr, "usage: throttle_paths PATH STYLE SECONDS KERNEL_NS [BLOCKS] [START_AT_NS]\n");
        return 2;
    }
    const char *path = argv[1], *style = argv[2];
    double seconds = atof(argv[3]);
    uint64_t kernel_ns = strtoull(argv[4], NULL, 10);
    unsigned blocks = argc > 5 ? (unsigned)atoi(argv[5]) : 1;
    uint64_t start_at = argc > 6 ? strtoull(argv[6], NULL, 10) : 0;
    load(style);
    CK(d.Init(0));
    CUdevice dev;
    CK(d.DeviceGet(&dev, 0));
    CUcontext ctx;
    CK(d.PrimaryCtxRetain(&ctx, dev));
    CK(d.CtxSetCurrent(ctx));
    unsigned waves;
    CUfunction f = make_kernel(dev, kernel_ns, blocks, &waves);
    uint64_t one = (kernel_ns / waves) * waves; /* what one kernel really takes */
    /* THR_STREAMS=N: launch round-robin on N streams (each queues up to the driver's limit: deep queues). */
    int nstreams = getenv("THR_STREAMS") ? atoi(getenv("THR_STREAMS")) : 1;
    if (nstreams < 1 || nstreams > 64) nstreams = 1;
    CUstream streams[64];
    for (int i = 0; i < nstreams; i++) CK(d.StreamCreate(&streams[i], 0));
    CUstream s = streams[0];

    CUgraphExec exec = NULL;
    unsigned per_launch = 1;
    if (strcmp(path, "graph") == 0) {
        CUgraph g;
        CK(d.GraphCreate(&g, 0));
        CUgraphNode prev = NULL;
        per_launch = 4;
        for (unsigned i = 0; i < per_launch; i++) {
            CUDA_KERNEL_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.func = f;
            p.gridDimX = blocks;
            p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = 32;
            p.blockDimY = p.blockDimZ = 1;
            CUgraphNode n;
            CK(d.GraphAddKernelNode(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
            prev = n;
        }
        CK(d.GraphInstantiate(&exec, g, 0));
    }
    int legacy = strcmp(path, "launch") == 0 || strcmp(path, "grid") == 0 || strcmp(path, "grid_async") == 0;
    if (legacy) {
        CK(d.FuncSetBlockShape(f, 32, 1, 1));
        CK(d.ParamSetSize(f, 0));
        if (strcmp(path, "launch") == 0) blocks = 1; /* cuLaunch runs a 1x1 grid */
    }

    if (start_at) {
        uint64_t n = now_ns();
        if (start_at > n) {
            struct timespec ts = {(time_t)((start_at - n) / 1000000000ull), (long)((start_at - n) % 1000000000ull)};
            nanosleep(&ts, NULL);
        }
    }
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    uint64_t launches = 0;
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
    for (;;) {
        if (now_ns() >= until) break;
        s = streams[launches % (uint64_t)nstreams];
        CUresult r;
        if (strcmp(path, "kernel") == 0) {
            r = d.LaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
        } else if (strcmp(path, "kernel_ex") == 0) {
            CUlaunchConfig c;
            memset(&c, 0, sizeof c);
            c.gridDimX = blocks;
            c.gridDimY = c.gridDimZ = 1;
            c.blockDimX = 32;
            c.blockDimY = c.blockDimZ = 1;
            c.hStream = s;
            r = d.LaunchKernelEx(&c, f, NULL, NULL);
        } else if (strcmp(path, "coop") == 0) {
            r = d.LaunchCoop(f, blocks, 1, 1, 32, 1, 1, 0, s, NULL);
        } else if (strcmp(path, "coop_multi") == 0) {
            CUDA_LAUNCH_PARAMS p;
            memset(&p, 0, sizeof p);
            p.function = f;
            p.gridDimX = blocks;
            p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = 32;
            p.blockDimY = p.blockDimZ = 1;
            p.hStream = s;
            r = d.LaunchCoopMulti(&p, 1, 0);
        } else if (strcmp(path, "graph") == 0) {
            r = d.GraphLaunch(exec, s);
        } else if (strcmp(path, "launch") == 0) {
            r = d.Launch(f);
        } else if (strcmp(path, "grid") == 0) {
            r = d.LaunchGrid(f, (int)blocks, 1);
        } else if (strcmp(path, "grid_async") == 0) {
            r = d.LaunchGridAsync(f, (int)blocks, 1, s);
        } else {
            fprintf(stderr, "unknown path %s\n", path);
            return 2;
        }
        if (r != CUDA_SUCCESS) die(path, r);
        launches++;
    }
    CK(d.CtxSynchronize());
    uint64_t wall = now_ns() - t0;
    uint64_t busy = launches * per_launch * one;
    printf("path=%s\nstyle=%s\nkernels=%llu\nkernel_ns=%llu\nbusy_ns=%llu\nwall_ns=%llu\nshare=%.2f\n", path, style,
           (unsigned long long)(launches * per_launch), (unsigned long long)one, (unsigned long long)busy,
           (unsigned long long)wall, 100.0 * (double)busy / (double)wall);
    return 0;
}

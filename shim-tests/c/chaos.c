/* chaos.c: the hardening workloads (shim-tests/tests/{chaos,storm,fork_exec}.rs). Linked with -lcuda; NVML is
 * reached with dlopen + dlsym (through libcuquota.so's dlsym when it is preloaded), the simulator's own NVML
 * (past any interposer) with cq_driver.h's cq_raw_nvml_mem. Every mode prints key=value lines.
 *
 *   chaos worker SECONDS SEED
 *       one process of the kill-chaos test: allocates and frees at random through every allocation API (plain,
 *       pitch, managed, async, pool, VMM, array, 3D array, mipmap), launches kernels and queries memory, for
 *       SECONDS, then frees everything and prints chaos.ops= chaos.allocs= chaos.oom= chaos.err= (a non-OOM
 *       failure: chaos.errmsg=<op>:<result>). It is usually SIGKILLed long before. CHAOS_KINDS="0,1,…" limits
 *       the allocation kinds (indices into kind_name).
 *   chaos observe CAP_BYTES INTERVAL_US
 *       run WITHOUT the shim: every INTERVAL_US until stdin closes, sums the simulator's NVML per-process device
 *       memory over the processes that have not exited; prints obs.samples= obs.max= obs.over= (samples above
 *       CAP_BYTES) obs.first_over=<bytes> (and the process list of that sample) obs.max_procs= obs.exited_seen=
 *       obs.torn= (reads retried because the list changed while it was read: see observe()).
 *   chaos storm THREADS SECONDS SEED
 *       THREADS threads allocate, free, launch and query (cuMemGetInfo, NVML memory and process list) at once
 *       for SECONDS; every eighth thread exits (pthread_exit) mid-work, leaving its allocations to the process.
 *       A watchdog prints storm.stall=1 and exits 3 if no thread made progress for 10 s. Then prints
 *       storm.ops= storm.exited= storm.err= storm.charged= storm.held= (what the shim charges the container,
 *       cap − cuMemGetInfo free, and what the simulator holds), frees everything, and prints storm.charged_end=
 *       storm.held_end=.
 *   chaos forks THREADS ROUNDS EXEC_EVERY
 *       THREADS threads hammer the shim (alloc/free, pool alloc, launches, cuMemGetInfo, NVML, module
 *       load/unload) while the main thread forks ROUNDS times. A child either re-enters the shim at once (alloc,
 *       free of 64 addresses, cuMemGetInfo, a launch, NVML) and exits, or — every EXEC_EVERY-th — execs
 *       `chaos child` (own process: cuInit, a 64 MiB allocation, exit). A child not done within 10 s is stuck on
 *       a lock its parent's threads held: killed and counted. Prints forks.ok= forks.stuck= forks.exec_ok=.
 *   chaos child          (the exec'd child) cuInit, context, cuMemAlloc 64 MiB, free, exit 0 on success.
 *   chaos hold MIB       cuInit, context, allocate MIB, print held=1, wait for stdin, free, exit.
 *   chaos forkhold MIB   cuInit, context, allocate MIB, fork: the child (no exec) tries to allocate through the
 *                        shim, prints child.alloc=<result> and exits with exit(); the parent prints fork.child=ok
 *                        then held=1, waits for stdin, frees, exits. With `exec`, the child execs `chaos hold MIB`.
 */
#define _GNU_SOURCE
#include "cq_driver.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: per-thread streams */
static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* A chaos worker joining a full container may be refused its context, module or pool: out of memory there is a
 * clean refusal, not a failure. */
static int g_refusal_ok;

#define CK_INIT(call)                                                                                         \
    do {                                                                                                      \
        CUresult r_ = (call);                                                                                 \
        if (r_ == CUDA_ERROR_OUT_OF_MEMORY && g_refusal_ok) {                                                 \
            printf("chaos.refused=%s\nchaos.ops=0\nchaos.allocs=0\nchaos.oom=1\nchaos.err=0\n", #call);      \
            exit(0);                                                                                          \
        }                                                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                                             \
            printf("setup.fail=%s:%s\n", #call, cq_err(r_));                                                  \
            exit(2);                                                                                          \
        }                                                                                                     \
    } while (0)

/* ---- the device ---- */
static CUdevice g_dev;
static CUcontext g_ctx;
static CUfunction g_fn;
static CUmemoryPool g_pool;

static const char MODULE[] = "CUDASIM-MODULE 1\nkernel spin 20000\n";

static void setup(void) {
    CK_INIT(cuInit(0));
    CK_INIT(cuDeviceGet(&g_dev, 0));
    CK_INIT(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CK_INIT(cuCtxSetCurrent(g_ctx));
    CUmodule m;
    CK_INIT(cuModuleLoadData(&m, MODULE));
    CK_INIT(cuModuleGetFunction(&g_fn, m, "spin"));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = g_dev;
    CK_INIT(cuMemPoolCreate(&g_pool, &props));
    cuuint64_t keep = ~0ull;
    CK_INIT(cuMemPoolSetAttribute(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
}

/* ---- NVML through dlsym (the shim's hooks when preloaded) ---- */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvproc;
static struct {
    int (*Init)(void);
    int (*HandleByIndex)(unsigned int, void **);
    int (*MemInfo)(void *, cq_rawmem *);
    int (*Procs)(void *, unsigned int *, nvproc *);
    void *dev;
} N;

static void nvml_setup(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return;
    N.Init = (int (*)(void))dlsym(h, "nvmlInit_v2");
    N.HandleByIndex = (int (*)(unsigned int, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    N.MemInfo = (int (*)(void *, cq_rawmem *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    N.Procs = (int (*)(void *, unsigned int *, nvproc *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (N.Init && N.Init() == 0 && N.HandleByIndex) N.HandleByIndex(0, &N.dev);
}

static int nvml_query(void) {
    if (!N.dev || !N.MemInfo || !N.Procs) return 0;
    cq_rawmem m;
    nvproc p[64];
    unsigned int n = 64;
    int r = N.MemInfo(N.dev, &m);
    int q = N.Procs(N.dev, &n, p);
    return r != 0 ? r : (q == 7 /* INSUFFICIENT_SIZE */ ? 0 : q);
}

/* ---- allocations of every kind ---- */
enum kind { K_MEM, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_ARRAY3D, K_MIPMAP, NKINDS };
static const char *kind_name[] = {"mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"};

typedef struct {
    enum kind kind;
    CUdeviceptr ptr;
    CUmemGenericAllocationHandle vmm;
    CUarray arr;
    CUmipmappedArray mip;
} alloc_t;

#define ROW (8192ull * 16ull) /* float4, 8192 wide */

static CUresult do_alloc(enum kind k, unsigned long long size, CUstream s, alloc_t *a) {
    memset(a, 0, sizeof *a);
    a->kind = k;
    switch (k) {
    case K_MEM: return cuMemAlloc(&a->ptr, size);
    case K_PITCH: {
        size_t pitch = 0;
        return cuMemAllocPitch(&a->ptr, &pitch, 65536, (size + 65535) / 65536, 16);
    }
    case K_MANAGED: return cuMemAllocManaged(&a->ptr, size, CU_MEM_ATTACH_GLOBAL);
    case K_ASYNC: return cuMemAllocAsync(&a->ptr, size, s);
    case K_POOL: return cuMemAllocFromPoolAsync(&a->ptr, size, g_pool, s);
    case K_VMM: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g_dev;
        size_t gran = 2 * MIB;
        cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (!gran) gran = 2 * MIB;
        return cuMemCreate(&a->vmm, (size + gran - 1) / gran * gran, &prop, 0);
    }
    case K_ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {0};
        d.Width = 8192;
        d.Height = (size + ROW - 1) / ROW;
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        return cuArrayCreate(&a->arr, &d);
    }
    case K_ARRAY3D: {
        CUDA_ARRAY3D_DESCRIPTOR d = {0};
        d.Width = 8192;
        d.Height = 16;
        d.Depth = (size + ROW * 16 - 1) / (ROW * 16);
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        return cuArray3DCreate(&a->arr, &d);
    }
    case K_MIPMAP: {
        CUDA_ARRAY3D_DESCRIPTOR d = {0};
        d.Width = 8192;
        d.Height = (size + ROW - 1) / ROW;
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        return cuMipmappedArrayCreate(&a->mip, &d, 2);
    }
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult do_free(alloc_t *a, CUstream s) {
    switch (a->kind) {
    case K_MEM:
    case K_PITCH:
    case K_MANAGED: return cuMemFree(a->ptr);
    case K_ASYNC:
    case K_POOL: return cuMemFreeAsync(a->ptr, s);
    case K_VMM: return cuMemRelease(a->vmm);
    case K_ARRAY:
    case K_ARRAY3D: return cuArrayDestroy(a->arr);
    case K_MIPMAP: return cuMipmappedArrayDestroy(a->mip);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult launch(CUstream s) { return cuLaunchKernel(g_fn, 4, 1, 1, 32, 1, 1, 0, s, NULL, NULL); }

/* ---- worker: one process of the kill chaos ---- */
#define MAXLIVE 48

static int worker(double secs, uint64_t seed) {
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + (uint64_t)getpid();
    if (!rs) rs = 1;
    /* CHAOS_KINDS: the allocation kinds to use, as indices into kind_name (e.g. "0,1,5"); default all. */
    enum kind kinds[NKINDS];
    int nkinds = 0;
    const char *ks = getenv("CHAOS_KINDS");
    for (const char *c = ks && *ks ? ks : ""; *c && nkinds < NKINDS;) {
        long v = strtol(c, (char **)&c, 10);
        if (v >= 0 && v < NKINDS) kinds[nkinds++] = (enum kind)v;
        while (*c == ',' || *c == ' ') c++;
    }
    if (!nkinds)
        for (int i = 0; i < NKINDS; i++) kinds[nkinds++] = (enum kind)i;
    g_refusal_ok = 1;
    setup();
    CUstream s;
    CK_INIT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    alloc_t live[MAXLIVE];
    int n = 0;
    long ops = 0, allocs = 0, oom = 0, err = 0;
    uint64_t end = now_ns() + (uint64_t)(secs * 1e9);
    while (now_ns() < end) {
        unsigned op = rnd(&rs) % 100;
        CUresult r = CUDA_SUCCESS;
        const char *what = "";
        if (op < 40 && n < MAXLIVE) {
            enum kind k = kinds[rnd(&rs) % (uint64_t)nkinds];
            unsigned long long size = (1 + rnd(&rs) % 24) * MIB;
            what = kind_name[k];
            r = do_alloc(k, size, s, &live[n]);
            if (r == CUDA_SUCCESS) {
                n++;
                allocs++;
            } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                oom++;
                r = CUDA_SUCCESS;
            }
        } else if (op < 75 && n > 0) {
            int i = (int)(rnd(&rs) % (uint64_t)n);
            what = "free";
            r = do_free(&live[i], s);
            live[i] = live[--n];
        } else if (op < 92) {
            what = "launch";
            r = launch(s);
        } else if (op < 96) {
            size_t f, t;
            what = "info";
            r = cuMemGetInfo(&f, &t);
        } else if (op < 98) {
            what = "sync";
            r = cuStreamSynchronize(s);
        } else {
            what = "trim";
            r = cuMemPoolTrimTo(g_pool, 0);
        }
        ops++;
        if (r != CUDA_SUCCESS) {
            if (err++ < 5) printf("chaos.errmsg=%s:%s\n", what, cq_err(r));
        }
        if (rnd(&rs) % 4 == 0) usleep((useconds_t)(rnd(&rs) % 400));
    }
    while (n > 0) {
        CUresult r = do_free(&live[--n], s);
        if (r != CUDA_SUCCESS && err++ < 5) printf("chaos.errmsg=final-free:%s\n", cq_err(r));
    }
    cuStreamSynchronize(s);
    printf("chaos.ops=%ld\nchaos.allocs=%ld\nchaos.oom=%ld\nchaos.err=%ld\n", ops, allocs, oom, err);
    return 0;
}

/* ---- observer (no shim) ---- */
/* Ground truth: the simulator's NVML per-process list (past any interposer), summed over the processes that
 * have not exited. A zombie is left out: a real driver frees a process's memory while it exits, before it
 * becomes a zombie, and so judges cuquota (a zombie is dead to it); the simulator notices a zombie up to 20 ms
 * late (its liveness cache). */
static int raw_procs(nvproc *p, unsigned int *n) {
    static int (*procs)(void *, unsigned int *, nvproc *);
    static void *dev;
    if (!procs) {
        cq_rawmem m;
        if (cq_raw_nvml_mem(0, &m) != 0) return -1; /* loads and initialises the simulator's NVML */
        cq_dlsym_t real = cq_real_dlsym();
        const char *lib = getenv("CQ_SIM_LIB");
        void *h = dlopen(lib ? lib : "libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
        int (*by_index)(unsigned int, void **) = (int (*)(unsigned int, void **))real(h, "nvmlDeviceGetHandleByIndex_v2");
        procs = (int (*)(void *, unsigned int *, nvproc *))real(h, "nvmlDeviceGetComputeRunningProcesses_v3");
        if (!by_index || !procs || by_index(0, &dev) != 0) return -1;
    }
    return procs(dev, n, p);
}

static int exited(unsigned int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    char *rp = strrchr(buf, ')');
    return !rp || rp[1] == 0 || rp[2] == 'Z' || rp[2] == 'X';
}

static int observe(unsigned long long cap, long interval_us) {
    int fl = fcntl(0, F_GETFL);
    fcntl(0, F_SETFL, fl | O_NONBLOCK);
    unsigned long long samples = 0, max = 0, over = 0, first_over = 0, max_procs = 0, zombies = 0;
    unsigned long long torn = 0;
    static nvproc p[1024], q[1024];
    for (;;) {
        /* Double collect: the simulator's list is read process by process, so one read can pair a process's
         * value from before a free with another's from after the allocation that free made room for — a sum
         * that never existed. Two identical consecutive reads are taken as one point in time. */
        unsigned int n = 1024, m = 1024;
        int r = raw_procs(p, &n);
        for (int tries = 0; r == 0; tries++) {
            m = 1024;
            r = raw_procs(q, &m);
            if (r != 0 || (m == n && !memcmp(p, q, n * sizeof *p)) || tries == 1000) break;
            torn++;
            memcpy(p, q, m * sizeof *p);
            n = m;
        }
        if (r != 0) {
            printf("obs.error=%d\n", r);
            return 1;
        }
        unsigned long long used = 0;
        for (unsigned int i = 0; i < n; i++) {
            if (exited(p[i].pid)) {
                zombies++;
                continue;
            }
            used += p[i].usedGpuMemory;
        }
        samples++;
        if (n > max_procs) max_procs = n;
        if (used > max) max = used;
        if (used > cap) {
            if (!over) {
                first_over = used;
                for (unsigned int i = 0; i < n; i++)
                    printf("obs.first_over_proc=%u:%llu%s\n", p[i].pid, p[i].usedGpuMemory,
                           exited(p[i].pid) ? ":exited" : "");
            }
            over++;
        }
        char buf[64];
        ssize_t k = read(0, buf, sizeof buf);
        if (k >= 0 || errno != EAGAIN) break; /* a line, EOF or an error: stop */
        usleep((useconds_t)interval_us);
    }
    printf("obs.samples=%llu\nobs.max=%llu\nobs.over=%llu\nobs.first_over=%llu\nobs.max_procs=%llu\n"
           "obs.exited_seen=%llu\nobs.torn=%llu\n",
           samples, max, over, first_over, max_procs, zombies, torn);
    return 0;
}

/* ---- storm: many threads in one process ---- */
#define STORM_MAXT 256
#define STORM_LIVE 16
typedef struct {
    alloc_t live[STORM_LIVE];
    int n;
    CUstream s;
} tstate;
static tstate T[STORM_MAXT];
static atomic_long st_ops, st_err, st_exited, st_progress;
static atomic_int st_active;
static double st_secs;
static uint64_t st_seed;
static atomic_int st_lastop[STORM_MAXT];

static void *storm_thread(void *arg) {
    int id = (int)(intptr_t)arg;
    tstate *t = &T[id];
    uint64_t rs = st_seed * 0x9E3779B97F4A7C15ull + (uint64_t)id * 7919 + 1;
    int exits_early = id % 8 == 7;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || cuStreamCreate(&t->s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        atomic_fetch_add(&st_err, 1);
        atomic_fetch_sub(&st_active, 1);
        return NULL;
    }
    uint64_t end = now_ns() + (uint64_t)(st_secs * 1e9);
    uint64_t exit_at = now_ns() + (uint64_t)(st_secs * 1e9 * (double)(rnd(&rs) % 100) / 100.0);
    while (now_ns() < end) {
        if (exits_early && now_ns() >= exit_at) {
            atomic_fetch_add(&st_exited, 1);
            atomic_fetch_sub(&st_active, 1);
            pthread_exit(NULL); /* mid-work: its allocations stay with the process */
        }
        unsigned op = rnd(&rs) % 100;
        CUresult r = CUDA_SUCCESS;
        atomic_store(&st_lastop[id], (int)op);
        if (op < 35 && t->n < STORM_LIVE) {
            /* no pool kind here: one shared pool's reservation is what pools.rs charges, tested elsewhere */
            static const enum kind kinds[] = {K_MEM, K_PITCH, K_MANAGED, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP};
            enum kind k = kinds[rnd(&rs) % (sizeof kinds / sizeof kinds[0])];
            r = do_alloc(k, (1 + rnd(&rs) % 4) * MIB, t->s, &t->live[t->n]);
            if (r == CUDA_SUCCESS) t->n++;
            if (r == CUDA_ERROR_OUT_OF_MEMORY) r = CUDA_SUCCESS;
        } else if (op < 65 && t->n > 0) {
            int i = (int)(rnd(&rs) % (uint64_t)t->n);
            r = do_free(&t->live[i], t->s);
            if (r == CUDA_SUCCESS) t->live[i] = t->live[--t->n];
        } else if (op < 85) {
            r = launch(t->s);
        } else if (op < 92) {
            size_t f, tt;
            r = cuMemGetInfo(&f, &tt);
        } else if (op < 97) {
            r = nvml_query() ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
        } else {
            r = cuStreamSynchronize(t->s);
        }
        atomic_fetch_add(&st_ops, 1);
        atomic_fetch_add(&st_progress, 1);
        if (r != CUDA_SUCCESS && atomic_fetch_add(&st_err, 1) < 5) printf("storm.errmsg=%d:%s\n", (int)op, cq_err(r));
    }
    cuStreamSynchronize(t->s);
    atomic_fetch_sub(&st_active, 1);
    return NULL;
}

static void *watchdog(void *arg) {
    (void)arg;
    long last = -1;
    uint64_t still_since = now_ns();
    while (atomic_load(&st_active) > 0) {
        usleep(200000);
        long p = atomic_load(&st_progress);
        if (p != last) {
            last = p;
            still_since = now_ns();
        } else if (now_ns() - still_since > 10000000000ull) {
            printf("storm.stall=1\nstorm.active=%d\n", atomic_load(&st_active));
            for (int i = 0; i < STORM_MAXT; i++)
                if (atomic_load(&st_lastop[i])) printf("storm.lastop.%d=%d\n", i, atomic_load(&st_lastop[i]));
            fflush(stdout);
            _exit(3);
        }
    }
    return NULL;
}

static void charged_held(const char *tag, unsigned long long cap) {
    size_t f = 0, t = 0;
    cq_rawmem m = {0};
    CUresult r = cuMemGetInfo(&f, &t);
    int q = cq_raw_nvml_mem(0, &m);
    printf("storm.info_rc%s=%s\nstorm.charged%s=%llu\nstorm.held%s=%llu\nstorm.raw_rc%s=%d\n", tag, cq_err(r), tag,
           cap - (unsigned long long)f, tag, m.used, tag, q);
}

static int storm(int threads, double secs, uint64_t seed) {
    if (threads <= 0 || threads > STORM_MAXT) return 2;
    setup();
    nvml_setup();
    size_t f0, cap;
    CK_INIT(cuMemGetInfo(&f0, &cap));
    st_secs = secs;
    st_seed = seed;
    atomic_store(&st_active, threads);
    pthread_t th[STORM_MAXT], wd;
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, storm_thread, (void *)(intptr_t)i);
    pthread_create(&wd, NULL, watchdog, NULL);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    pthread_join(wd, NULL);
    cuCtxSynchronize();
    long left = 0;
    for (int i = 0; i < threads; i++) left += T[i].n;
    printf("storm.ops=%ld\nstorm.exited=%ld\nstorm.err=%ld\nstorm.left=%ld\n", atomic_load(&st_ops),
           atomic_load(&st_exited), atomic_load(&st_err), left);
    charged_held("", cap);
    long bad = 0;
    for (int i = 0; i < threads; i++)
        while (T[i].n > 0)
            if (do_free(&T[i].live[--T[i].n], NULL) != CUDA_SUCCESS) bad++;
    cuCtxSynchronize();
    cuMemPoolTrimTo(g_pool, 0);
    CUmemoryPool def;
    if (cuDeviceGetDefaultMemPool(&def, g_dev) == CUDA_SUCCESS) cuMemPoolTrimTo(def, 0);
    printf("storm.free_err=%ld\n", bad);
    charged_held("_end", cap);
    return 0;
}

/* ---- forks ---- */
static atomic_int f_stop;
static unsigned long long f_size = 2 * MIB;

static void *hammer(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t rs = 0x1234567ull + (uint64_t)id;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) return NULL;
    CUstream s;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return NULL;
    while (!atomic_load(&f_stop)) {
        switch (rnd(&rs) % 7) {
        case 0: {
            CUdeviceptr p;
            if (cuMemAlloc(&p, f_size) == CUDA_SUCCESS) cuMemFree(p);
            break;
        }
        case 1: {
            CUdeviceptr p;
            if (cuMemAllocFromPoolAsync(&p, f_size, g_pool, s) == CUDA_SUCCESS) cuMemFreeAsync(p, s);
            break;
        }
        case 2: launch(s); break;
        case 3: {
            size_t f, t;
            cuMemGetInfo(&f, &t);
            break;
        }
        case 4: nvml_query(); break;
        case 5: {
            CUmodule m;
            if (cuModuleLoadData(&m, MODULE) == CUDA_SUCCESS) cuModuleUnload(m);
            break;
        }
        default: cuStreamSynchronize(s); break;
        }
    }
    cuStreamSynchronize(s);
    return NULL;
}

/* In a child forked without exec: CUDA itself refuses (the driver was initialised by the parent), but every
 * call still runs through the shim's hooks and locks. */
static void fork_child_calls(void) {
    CUdeviceptr p = 0;
    size_t f = 0, t = 0;
    cuCtxSetCurrent(g_ctx);
    cuMemAlloc(&p, f_size);
    for (int i = 0; i < 64; i++) cuMemFree((CUdeviceptr)0x7f0000000000ULL + ((CUdeviceptr)i << 21));
    cuMemGetInfo(&f, &t);
    launch(NULL);
    nvml_query();
    CUmodule m;
    cuModuleLoadData(&m, MODULE);
}

static int child_done(pid_t pid) {
    for (int i = 0; i < 1000; i++) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (r < 0) return 0;
        usleep(10000);
    }
    if (getenv("CHAOS_GDB")) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex 'thread apply all bt' 2>&1 | grep -E '^#|Thread' 1>&2", (int)pid);
        if (system(cmd)) {
        }
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static int forks(const char *self, int threads, int rounds, int exec_every) {
    setup();
    nvml_setup();
    pthread_t th[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)i);
    int ok = 0, stuck = 0, failed = 0, exec_ok = 0;
    for (int i = 0; i < rounds; i++) {
        int ex = exec_every > 0 && i % exec_every == exec_every - 1;
        pid_t pid = fork();
        if (pid == 0) {
            if (ex) {
                execl("/proc/self/exe", self, "child", (char *)NULL);
                _exit(127);
            }
            fork_child_calls();
            exit(0); /* exit(), not _exit: the shim's exit path runs in the child too */
        }
        int r = pid > 0 ? child_done(pid) : 0;
        if (r == 1) {
            ok++;
            exec_ok += ex;
        } else if (r < 0) {
            stuck++;
            printf("forks.stuck_round=%d%s\n", i, ex ? ":exec" : "");
        } else {
            failed++;
            printf("forks.failed_round=%d%s\n", i, ex ? ":exec" : "");
        }
    }
    atomic_store(&f_stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    printf("forks.ok=%d\nforks.stuck=%d\nforks.failed=%d\nforks.exec_ok=%d\n", ok, stuck, failed, exec_ok);
    return 0;
}

static int child(void) {
    CUdeviceptr p;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&g_dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&g_ctx, g_dev) != CUDA_SUCCESS || cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        return 2;
    if (cuMemAlloc(&p, 64 * MIB) != CUDA_SUCCESS) return 3;
    if (cuMemFree(p) != CUDA_SUCCESS) return 4;
    return 0;
}

static void wait_stdin(void) {
    char line[64];
    printf("held=1\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) { /* EOF */
    }
}

static int hold(unsigned long long mib) {
    CK_INIT(cuInit(0));
    CK_INIT(cuDeviceGet(&g_dev, 0));
    CK_INIT(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CK_INIT(cuCtxSetCurrent(g_ctx));
    CUdeviceptr p;
    CK_INIT(cuMemAlloc(&p, mib * MIB));
    printf("pid=%d\n", (int)getpid());
    wait_stdin();
    CK_INIT(cuMemFree(p));
    printf("done=1\n");
    return 0;
}

static int forkhold(const char *self, unsigned long long mib, int ex) {
    CK_INIT(cuInit(0));
    CK_INIT(cuDeviceGet(&g_dev, 0));
    CK_INIT(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CK_INIT(cuCtxSetCurrent(g_ctx));
    CUdeviceptr p;
    CK_INIT(cuMemAlloc(&p, mib * MIB));
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (ex) {
            char arg[32];
            snprintf(arg, sizeof arg, "%llu", mib);
            execl("/proc/self/exe", self, "hold", arg, (char *)NULL);
            _exit(127);
        }
        CUdeviceptr q = 0;
        printf("child.alloc=%s\n", cq_err(cuMemAlloc(&q, mib * MIB)));
        fflush(stdout);
        exit(0);
    }
    printf("child.pid=%d\n", (int)pid);
    if (!ex) {
        int st = 0;
        waitpid(pid, &st, 0);
        printf("fork.child=%s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed");
    }
    wait_stdin();
    if (ex) {
        int st = 0;
        waitpid(pid, &st, 0);
        printf("exec.child=%s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed");
    }
    CK_INIT(cuMemFree(p));
    printf("done=1\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    (void)cq_load; /* cq_driver.h's loader: this program links -lcuda and calls cuda.h's names */
    if (argc < 2) return 2;
    const char *m = argv[1];
    if (!strcmp(m, "worker") && argc == 4) return worker(atof(argv[2]), strtoull(argv[3], NULL, 10));
    if (!strcmp(m, "observe") && argc == 4) return observe(cq_size(argv[2]), atol(argv[3]));
    if (!strcmp(m, "storm") && argc == 5)
        return storm(atoi(argv[2]), atof(argv[3]), strtoull(argv[4], NULL, 10));
    if (!strcmp(m, "forks") && argc == 5) return forks(argv[0], atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (!strcmp(m, "child")) return child();
    if (!strcmp(m, "hold") && argc == 3) return hold(strtoull(argv[2], NULL, 10));
    if (!strcmp(m, "forkhold") && argc >= 3)
        return forkhold(argv[0], strtoull(argv[2], NULL, 10), argc > 3 && !strcmp(argv[3], "exec"));
    fprintf(stderr, "chaos: bad arguments (see the top of chaos.c)\n");
    return 2;
}

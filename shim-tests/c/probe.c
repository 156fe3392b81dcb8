/* probe: a tiny interpreter of driver operations, so integration tests describe scenarios on the command line.
 *
 *   probe [--style S] CMD...      (S: see cq_driver.h; default "dlsym", or "direct" in the -lcuda build)
 *
 * Every command prints `key=value` lines on stdout (flushed), which the Rust tests parse. Commands:
 *   init                 cuInit(0), retain + make current the primary context of ordinal 0   init=, ctx=
 *   dev:N                retain + make current the primary context of ordinal N              dev.N=
 *   release              cuDevicePrimaryCtxRelease of the current ordinal (the last release ends the context:
 *                        its memory and limits go with it; `dev:N` retains it again)           release=
 *   alloc:KIND:SIZE      KIND: mem pitch managed async pool vmm array array3d mipmap       alloc.I=<result>
 *                        (async: the device's default pool, release threshold 0, so memory returns at the
 *                        stream sync; pool: the probe's own pool with release threshold UINT64_MAX, so freed
 *                        memory stays reserved until `trim`)
 *                        (I = index of this allocation, counted from 0 in order; the result is printed even
 *                        when it fails, so indices stay predictable)
 *   free:I               free/destroy/release allocation I with the matching call              free.I=
 *   freeall              free every live allocation                                          freeall=<count>
 *   fill:KIND:CHUNK      allocate CHUNK-sized pieces until one fails              fill.count=, fill.rc=
 *   trim                 trim the probe's pool and the device's default pool to 0              trim=
 *   info                 cuMemGetInfo                                   info.rc= info.free= info.total=
 *   infonull             cuMemGetInfo with NULL out-pointers       infonull.free= .total= .both=
 *   totalmem             cuDeviceTotalMem of the current ordinal                   totalmem.rc= totalmem=
 *   count                cuDeviceGetCount                                          count.rc= count=
 *   uuid                 cuDeviceGetUuid of the current ordinal                    uuid=GPU-xxxxxxxx-...
 *   module               cuModuleLoadData of a simulator module image                          module=
 *   bogusfree            cuMemFree of an address nobody allocated                           bogusfree=
 *   simused              the simulator's own used bytes of each NVML device    sim.count= sim.used.N=
 *   threads:N:ITERS:SIZE N threads each doing ITERS cuMemAlloc+cuMemFree of SIZE
 *                                                     threads.ok= threads.oom= threads.err= threads.maxheld=
 *   forks:T:N:SIZE       T threads allocate and free SIZE in a loop while the main thread forks N times; each
 *                        child calls cuMemAlloc, cuMemFree (64 addresses), cuMemGetInfo and exits (killed after
 *                        10 s and counted as stuck: a child waiting for a lock its parent's threads held)
 *                                                                                forks.ok= forks.stuck=
 *   wait                 print ready=1 and block until a line (or EOF) arrives on stdin
 *   sleep:MS             sleep
 *   pid                  pid=
 *   setenv:NAME=VALUE    setenv(NAME, VALUE, 1), as a program may before cuInit                 setenv=
 *   setlimit:L:BYTES     cuCtxSetLimit(L, BYTES), L: stack | fifo | heap | pending (the device runtime's
 *                        pending launch count, a number of launches)                    setlimit.L=<result>
 *   getlimit:L           cuCtxGetLimit(L)                                  getlimit.L.rc= getlimit.L=
 */
#include "cq_driver.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static cq_driver D;
static CUcontext g_ctx;
static CUdevice g_dev;
static int g_ordinal;
static CUmemoryPool g_pool;

enum kind { K_MEM, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_ARRAY3D, K_MIPMAP, K_MEM_V1 };
static const char *kind_names[] = {"mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"};

typedef struct {
    int live;
    enum kind kind;
    CUdeviceptr ptr;
    unsigned int ptr_v1;
    CUmemGenericAllocationHandle vmm;
    CUarray arr;
    CUmipmappedArray mip;
} slot;

#define MAX_SLOTS 4096
static slot slots[MAX_SLOTS];
static int nslots;

#define NEED(fn)                                                                                              \
    do {                                                                                                      \
        if (!D.fn) {                                                                                          \
            printf("%s=unresolved:%s\n", tag, #fn);                                                          \
            return CUDA_ERROR_NOT_FOUND;                                                                      \
        }                                                                                                     \
    } while (0)

static CUresult make_current(int ordinal) {
    const char *tag = "ctx";
    NEED(DeviceGet);
    NEED(DevicePrimaryCtxRetain);
    NEED(CtxSetCurrent);
    CUresult r = D.DeviceGet(&g_dev, ordinal);
    if (r) return r;
    r = D.DevicePrimaryCtxRetain(&g_ctx, g_dev);
    if (r) return r;
    g_ordinal = ordinal;
    g_pool = NULL;
    return D.CtxSetCurrent(g_ctx);
}

static CUresult ensure_pool(void) {
    const char *tag = "pool";
    if (g_pool) return CUDA_SUCCESS;
    NEED(MemPoolCreate);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = g_dev;
    CUresult r = D.MemPoolCreate(&g_pool, &props);
    if (r) return r;
    /* keep freed memory reserved until trimmed, as frameworks do: the reservation must stay charged */
    cuuint64_t keep = ~0ull;
    NEED(MemPoolSetAttribute);
    return D.MemPoolSetAttribute(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
}

static void vmm_prop(CUmemAllocationProp *prop) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = g_dev;
}

/* Arrays: float4 elements (16 bytes), 8192 wide = 128 KiB a row. */
#define ROW_BYTES (8192ull * 16ull)

static CUresult do_alloc(enum kind k, unsigned long long size, slot *s) {
    const char *tag = "alloc";
    CUresult r;
    memset(s, 0, sizeof *s);
    s->kind = k;
    switch (k) {
    case K_MEM:
        NEED(MemAlloc);
        if (D.abi_v1) {
            s->kind = K_MEM_V1;
            return ((cq_memalloc_v1_t)(void *)D.MemAlloc)(&s->ptr_v1, (unsigned int)size);
        }
        return D.MemAlloc(&s->ptr, size);
    case K_PITCH: {
        NEED(MemAllocPitch);
        /* 64 KiB wide rows, element size 16 */
        size_t width = 65536, height = (size + width - 1) / width, pitch = 0;
        if (D.abi_v1) {
            unsigned int p1 = 0, pitch1 = 0;
            s->kind = K_MEM_V1;
            r = ((cq_allocpitch_v1_t)(void *)D.MemAllocPitch)(&p1, &pitch1, (unsigned int)width,
                                                             (unsigned int)height, 16);
            s->ptr_v1 = p1;
            if (!r) printf("pitch=%u\n", pitch1);
            return r;
        }
        r = D.MemAllocPitch(&s->ptr, &pitch, width, height, 16);
        if (!r) printf("pitch=%zu\n", pitch);
        return r;
    }
    case K_MANAGED:
        NEED(MemAllocManaged);
        return D.MemAllocManaged(&s->ptr, size, CU_MEM_ATTACH_GLOBAL);
    case K_ASYNC:
        NEED(MemAllocAsync);
        NEED(StreamSynchronize);
        r = D.MemAllocAsync(&s->ptr, size, NULL);
        if (!r) r = D.StreamSynchronize(NULL);
        return r;
    case K_POOL:
        NEED(MemAllocFromPoolAsync);
        NEED(StreamSynchronize);
        r = ensure_pool();
        if (r) return r;
        r = D.MemAllocFromPoolAsync(&s->ptr, size, g_pool, NULL);
        if (!r) r = D.StreamSynchronize(NULL);
        return r;
    case K_VMM: {
        NEED(MemCreate);
        CUmemAllocationProp prop;
        vmm_prop(&prop);
        size_t gran = 0;
        if (D.MemGetAllocationGranularity &&
            D.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
            gran)
            size = (size + gran - 1) / gran * gran;
        return D.MemCreate(&s->vmm, size, &prop, 0);
    }
    case K_ARRAY: {
        NEED(ArrayCreate);
        CUDA_ARRAY_DESCRIPTOR desc;
        memset(&desc, 0, sizeof desc);
        desc.Width = 8192;
        desc.Height = (size + ROW_BYTES - 1) / ROW_BYTES;
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 4;
        return D.ArrayCreate(&s->arr, &desc);
    }
    case K_ARRAY3D: {
        NEED(Array3DCreate);
        CUDA_ARRAY3D_DESCRIPTOR desc;
        memset(&desc, 0, sizeof desc);
        desc.Width = 8192;
        desc.Height = 64;
        desc.Depth = (size + ROW_BYTES * 64 - 1) / (ROW_BYTES * 64);
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 4;
        return D.Array3DCreate(&s->arr, &desc);
    }
    case K_MIPMAP: {
        NEED(MipmappedArrayCreate);
        CUDA_ARRAY3D_DESCRIPTOR desc;
        memset(&desc, 0, sizeof desc);
        desc.Width = 8192;
        desc.Height = (size + ROW_BYTES - 1) / ROW_BYTES;
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 4;
        return D.MipmappedArrayCreate(&s->mip, &desc, 1);
    }
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult do_free(slot *s) {
    const char *tag = "free";
    CUresult r;
    switch (s->kind) {
    case K_MEM:
    case K_PITCH:
    case K_MANAGED:
        NEED(MemFree);
        return D.MemFree(s->ptr);
    case K_MEM_V1:
        NEED(MemFree);
        return ((cq_memfree_v1_t)(void *)D.MemFree)(s->ptr_v1);
    case K_ASYNC:
    case K_POOL:
        NEED(MemFreeAsync);
        r = D.MemFreeAsync(s->ptr, NULL);
        if (!r) r = D.StreamSynchronize(NULL);
        return r;
    case K_VMM:
        NEED(MemRelease);
        return D.MemRelease(s->vmm);
    case K_ARRAY:
    case K_ARRAY3D:
        NEED(ArrayDestroy);
        return D.ArrayDestroy(s->arr);
    case K_MIPMAP:
        NEED(MipmappedArrayDestroy);
        return D.MipmappedArrayDestroy(s->mip);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static int parse_kind(const char *s, enum kind *k) {
    for (int i = 0; i < (int)(sizeof kind_names / sizeof kind_names[0]); i++) {
        size_t n = strlen(kind_names[i]);
        if (strncmp(s, kind_names[i], n) == 0 && (s[n] == ':' || s[n] == 0)) {
            *k = (enum kind)i;
            return 0;
        }
    }
    return -1;
}

/* ---- threads ---- */
static atomic_long t_ok, t_oom, t_err, t_held, t_maxheld;
static unsigned long long t_size;
static int t_iters;

static void *worker(void *arg) {
    (void)arg;
    if (D.CtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
        atomic_fetch_add(&t_err, t_iters);
        return NULL;
    }
    for (int i = 0; i < t_iters; i++) {
        CUdeviceptr p = 0;
        CUresult r = D.MemAlloc(&p, t_size);
        if (r == CUDA_SUCCESS) {
            long held = atomic_fetch_add(&t_held, 1) + 1;
            long m = atomic_load(&t_maxheld);
            while (held > m && !atomic_compare_exchange_weak(&t_maxheld, &m, held)) {
            }
            atomic_fetch_add(&t_ok, 1);
            atomic_fetch_sub(&t_held, 1);
            if (D.MemFree(p) != CUDA_SUCCESS) atomic_fetch_add(&t_err, 1);
        } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            atomic_fetch_add(&t_oom, 1);
        } else {
            atomic_fetch_add(&t_err, 1);
        }
    }
    return NULL;
}

/* ---- forks ---- */
static atomic_int f_stop;

static void *churner(void *arg) {
    (void)arg;
    if (D.CtxSetCurrent(g_ctx) != CUDA_SUCCESS) return NULL;
    while (!atomic_load(&f_stop)) {
        CUdeviceptr p = 0;
        if (D.MemAlloc(&p, t_size) == CUDA_SUCCESS) D.MemFree(p);
    }
    return NULL;
}

/* The child's part. CUDA itself does not work in a forked child (the driver answers an error), but every call
 * still goes through the shim's hooks and locks: an allocation, frees of 64 addresses (every ledger shard),
 * cuMemGetInfo. Exit 0 when all returned. */
static void fork_child(void) {
    CUdeviceptr p = 0;
    size_t free_b = 0, total_b = 0;
    D.CtxSetCurrent(g_ctx);
    D.MemAlloc(&p, t_size);
    for (int i = 0; i < 64; i++) D.MemFree((CUdeviceptr)0x7f0000000000ULL + ((CUdeviceptr)i << 21));
    D.MemGetInfo(&free_b, &total_b);
    _exit(0);
}

/* Waits up to 10 s for `pid`; a child still running then is stuck (killed, and counted as such). */
static int child_done(pid_t pid) {
    for (int i = 0; i < 1000; i++) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (r < 0) return 0;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}

static void forks(int threads, int n) {
    int ok = 0, stuck = 0;
    pthread_t th[64];
    atomic_store(&f_stop, 0);
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, churner, NULL);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) fork_child();
        if (pid > 0 && child_done(pid)) {
            ok++;
        } else {
            stuck++;
        }
    }
    atomic_store(&f_stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    printf("forks.ok=%d\nforks.stuck=%d\n", ok, stuck);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef CQ_DIRECT
    const char *style = "direct";
#else
    const char *style = "dlsym";
#endif
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "--style") == 0) {
        style = argv[a + 1];
        a += 2;
    }
    if (cq_load(&D, style) != 0) {
        printf("load=failed\n");
        return 2;
    }
    printf("load=ok\nstyle=%s\n", style);

    for (; a < argc; a++) {
        const char *c = argv[a];
        const char *tag = c;
        if (strcmp(c, "init") == 0) {
            NEED(Init);
            CUresult r = D.Init(0);
            printf("init=%s\n", cq_err(r));
            if (r) continue;
            printf("ctx=%s\n", cq_err(make_current(0)));
        } else if (strncmp(c, "dev:", 4) == 0) {
            int n = atoi(c + 4);
            printf("dev.%d=%s\n", n, cq_err(make_current(n)));
        } else if (strcmp(c, "release") == 0) {
            NEED(DevicePrimaryCtxRelease);
            printf("release=%s\n", cq_err(D.DevicePrimaryCtxRelease(g_dev)));
        } else if (strncmp(c, "alloc:", 6) == 0) {
            enum kind k;
            const char *colon = strchr(c + 6, ':');
            if (parse_kind(c + 6, &k) || !colon) {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            int i = nslots++;
            CUresult r = do_alloc(k, cq_size(colon + 1), &slots[i]);
            slots[i].live = r == CUDA_SUCCESS;
            printf("alloc.%d=%s\n", i, cq_err(r));
        } else if (strncmp(c, "free:", 5) == 0) {
            int i = atoi(c + 5);
            if (i < 0 || i >= nslots || !slots[i].live) {
                printf("free.%d=not-live\n", i);
                continue;
            }
            CUresult r = do_free(&slots[i]);
            if (r == CUDA_SUCCESS) slots[i].live = 0;
            printf("free.%d=%s\n", i, cq_err(r));
        } else if (strcmp(c, "freeall") == 0) {
            int n = 0;
            for (int i = 0; i < nslots; i++)
                if (slots[i].live && do_free(&slots[i]) == CUDA_SUCCESS) {
                    slots[i].live = 0;
                    n++;
                }
            printf("freeall=%d\n", n);
        } else if (strncmp(c, "fill:", 5) == 0) {
            enum kind k;
            const char *colon = strchr(c + 5, ':');
            if (parse_kind(c + 5, &k) || !colon) {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            unsigned long long chunk = cq_size(colon + 1);
            int count = 0;
            CUresult r = CUDA_SUCCESS;
            while (nslots < MAX_SLOTS) {
                int i = nslots;
                r = do_alloc(k, chunk, &slots[i]);
                if (r != CUDA_SUCCESS) break;
                slots[i].live = 1;
                nslots++;
                count++;
            }
            printf("fill.count=%d\nfill.rc=%s\n", count, cq_err(r));
        } else if (strcmp(c, "trim") == 0) {
            CUresult r = CUDA_SUCCESS;
            if (g_pool && D.MemPoolTrimTo) r = D.MemPoolTrimTo(g_pool, 0);
            CUmemoryPool def = NULL;
            if (!r && D.DeviceGetDefaultMemPool && D.DeviceGetDefaultMemPool(&def, g_dev) == CUDA_SUCCESS && def)
                r = D.MemPoolTrimTo(def, 0);
            printf("trim=%s\n", cq_err(r));
        } else if (strcmp(c, "info") == 0) {
            NEED(MemGetInfo);
            if (D.abi_v1) {
                unsigned int f = 0, t = 0;
                CUresult r = ((cq_memgetinfo_v1_t)(void *)D.MemGetInfo)(&f, &t);
                printf("info.rc=%s\ninfo.free=%u\ninfo.total=%u\n", cq_err(r), f, t);
            } else {
                size_t f = 0, t = 0;
                CUresult r = D.MemGetInfo(&f, &t);
                printf("info.rc=%s\ninfo.free=%zu\ninfo.total=%zu\n", cq_err(r), f, t);
            }
        } else if (strcmp(c, "infonull") == 0) {
            NEED(MemGetInfo);
            size_t f = 0, t = 0;
            printf("infonull.free=%s\n", cq_err(D.MemGetInfo(NULL, &t)));
            printf("infonull.total=%s\n", cq_err(D.MemGetInfo(&f, NULL)));
            printf("infonull.both=%s\n", cq_err(D.MemGetInfo(NULL, NULL)));
        } else if (strcmp(c, "totalmem") == 0) {
            NEED(DeviceTotalMem);
            if (D.abi_v1) {
                unsigned int t = 0;
                CUresult r = ((cq_totalmem_v1_t)(void *)D.DeviceTotalMem)(&t, g_dev);
                printf("totalmem.rc=%s\ntotalmem=%u\n", cq_err(r), t);
            } else {
                size_t t = 0;
                CUresult r = D.DeviceTotalMem(&t, g_dev);
                printf("totalmem.rc=%s\ntotalmem=%zu\n", cq_err(r), t);
            }
        } else if (strcmp(c, "count") == 0) {
            NEED(DeviceGetCount);
            int n = 0;
            CUresult r = D.DeviceGetCount(&n);
            printf("count.rc=%s\ncount=%d\n", cq_err(r), n);
        } else if (strcmp(c, "uuid") == 0) {
            NEED(DeviceGetUuid);
            CUuuid u;
            memset(&u, 0, sizeof u);
            CUresult r = D.DeviceGetUuid(&u, g_dev);
            unsigned char *b = (unsigned char *)u.bytes;
            printf("uuid.rc=%s\nuuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
                   cq_err(r), b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                   b[13], b[14], b[15]);
        } else if (strcmp(c, "module") == 0) {
            NEED(ModuleLoadData);
            static const char image[] = "CUDASIM-MODULE 1\nkernel noop 1000\n";
            CUmodule m = NULL;
            printf("module=%s\n", cq_err(D.ModuleLoadData(&m, image)));
        } else if (strcmp(c, "bogusfree") == 0) {
            NEED(MemFree);
            printf("bogusfree=%s\n", cq_err(D.MemFree((CUdeviceptr)0xdead0000beef000ull)));
        } else if (strncmp(c, "setlimit:", 9) == 0 || strncmp(c, "getlimit:", 9) == 0) {
            NEED(CtxSetLimit);
            NEED(CtxGetLimit);
            const char *name = c + 9;
            size_t len = strcspn(name, ":");
            CUlimit l;
            if (len == 5 && strncmp(name, "stack", 5) == 0) {
                l = CU_LIMIT_STACK_SIZE;
            } else if (len == 4 && strncmp(name, "fifo", 4) == 0) {
                l = CU_LIMIT_PRINTF_FIFO_SIZE;
            } else if (len == 4 && strncmp(name, "heap", 4) == 0) {
                l = CU_LIMIT_MALLOC_HEAP_SIZE;
            } else if (len == 7 && strncmp(name, "pending", 7) == 0) {
                l = CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT;
            } else {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            if (c[0] == 's') {
                size_t v = (size_t)cq_size(name + len + (name[len] == ':'));
                printf("setlimit.%.*s=%s\n", (int)len, name, cq_err(D.CtxSetLimit(l, v)));
            } else {
                size_t v = 0;
                CUresult r = D.CtxGetLimit(&v, l);
                printf("getlimit.%.*s.rc=%s\ngetlimit.%.*s=%zu\n", (int)len, name, cq_err(r), (int)len, name, v);
            }
        } else if (strcmp(c, "simused") == 0) {
            unsigned int n = 0;
            for (; n < 64; n++) {
                cq_rawmem m;
                int r = cq_raw_nvml_mem(n, &m);
                if (r == -1) {
                    printf("sim.error=unreachable\n");
                    break;
                }
                if (r) break;
                printf("sim.used.%u=%llu\nsim.total.%u=%llu\n", n, m.used, n, m.total);
            }
            printf("sim.count=%u\n", n);
        } else if (strncmp(c, "threads:", 8) == 0) {
            int n = 0;
            char sz[64] = "";
            if (sscanf(c + 8, "%d:%d:%63s", &n, &t_iters, sz) != 3 || n <= 0 || n > 256) {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            NEED(MemAlloc);
            NEED(MemFree);
            t_size = cq_size(sz);
            pthread_t th[256];
            for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, worker, NULL);
            for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
            printf("threads.ok=%ld\nthreads.oom=%ld\nthreads.err=%ld\nthreads.maxheld=%ld\n", atomic_load(&t_ok),
                   atomic_load(&t_oom), atomic_load(&t_err), atomic_load(&t_maxheld));
        } else if (strncmp(c, "forks:", 6) == 0) {
            int t = 0, n = 0;
            char sz[64] = "";
            if (sscanf(c + 6, "%d:%d:%63s", &t, &n, sz) != 3 || t <= 0 || t > 64 || n <= 0) {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            NEED(MemAlloc);
            NEED(MemFree);
            NEED(MemGetInfo);
            t_size = cq_size(sz);
            forks(t, n);
        } else if (strcmp(c, "wait") == 0) {
            printf("ready=1\n");
            fflush(stdout);
            char line[64];
            if (!fgets(line, sizeof line, stdin)) { /* EOF: go on */
            }
        } else if (strncmp(c, "sleep:", 6) == 0) {
            usleep((useconds_t)atoi(c + 6) * 1000);
        } else if (strncmp(c, "setenv:", 7) == 0) { /* setenv:NAME=VALUE, as a program may before cuInit */
            char buf[512];
            snprintf(buf, sizeof buf, "%s", c + 7);
            char *eq = strchr(buf, '=');
            if (!eq) {
                fprintf(stderr, "bad command %s\n", c);
                return 2;
            }
            *eq = 0;
            printf("setenv=%d\n", setenv(buf, eq + 1, 1));
        } else if (strcmp(c, "pid") == 0) {
            printf("pid=%d\n", (int)getpid());
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
    }
    printf("done=1\n");
    return 0;
}

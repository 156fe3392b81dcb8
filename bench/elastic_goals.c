/* elastic_goals: an elastic tenant timed through libcuquota.so (issue 39 item 5; bench/tests/elastic_goals.rs).
 *
 *   elastic_goals COUNT SIZE_MIB
 *
 * Allocates COUNT buffers of SIZE_MIB with cuMemAlloc (movable when the tenant is elastic) and a pinned host
 * buffer of SIZE_MIB, writes a pattern into every buffer, prints `resident=<NVML used>` and `ready=1` (or, when an
 * allocation fails, `start_fail=<error>` and `ready=0`, and exits 1), then reads
 * commands from stdin, one a line:
 *   base       plain copies of every buffer through the pinned buffer, D2H then H2D back (bytes unchanged):
 *              d2h_ns=<wall of the D2H copies> h2d_ns=<wall of the H2D copies>
 *   evict LOW  polls the simulator's NVML (past any interposer) every 0.2 ms until resident <= LOW:
 *              evict_ns=<from the command to then>, or evict_ns=-1 after 60 s
 *   restore    launches the memory-touching kernel on every buffer (adds 1 to each byte):
 *              restore_ns=<the first launch's call> launches_ns=<every launch's calls> sync_ns=<then the sync>
 *              resident=<NVML used after>
 *   check      copies every buffer back and compares it with the pattern plus every add: ok=1, or
 *              bad=<buffer>/<offset> and ok=0
 *   wake MIB   a wake-up: allocates MIB (it may wait for the agent's reclaim), launches the kernel on every buffer
 *              (restoring them), synchronises, frees: alloc_ns=<the allocation's call> first_ns=<the first
 *              launch's call (the restore)> oom=<0, or 1 when the allocation failed> wake_ns=<its time>
 *   lat SECONDS NS
 *              a steady loop of kernels of NS on the legacy stream (a module of its own, one wave), each
 *              synchronised, for SECONDS: lat_ns=<per kernel, from just before its launch to its end on the
 *              simulator's device timeline (cudasimDeviceBusyNs), so a slow wake-up after the sync is not counted>
 *              wall_ns=<per kernel, launch to the sync's return>
 *   quit       frees everything; resident=<bytes>
 * Linked with -lcuda (the simulator). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cq_elastic.h"


#define MAXN 64

static CUfunction inc;
static CUdeviceptr buf[MAXN];
static unsigned adds[MAXN];
static unsigned char *host;
static size_t n;
static int count;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
}

static unsigned char pat(int b, size_t i) { return (unsigned char)(i * 131u + (i >> 12) + (unsigned)b * 7u); }

static unsigned long long resident(void) {
    cq_rawmem m;
    return cq_raw_nvml_mem(0, &m) == 0 ? m.used : 0ull;
}

typedef unsigned (*busy_fn)(unsigned, unsigned, unsigned long long, unsigned long long, unsigned long long *);

/* When this process's device time since `from` reached `total` (the end of its last kernel), searched between
 * `from` and `to` to the microsecond (shim-tests/c/priority_tenant.c's search); `to` if the simulator says no. */
static long long done_at(busy_fn busy, long long from, long long to, long long total) {
    long long lo = from, hi = to;
    while (hi - lo > 1000) { /* to the µs: fewer calls into the simulator's ring */
        long long mid = lo + (hi - lo) / 2;
        unsigned long long b = 0;
        if (busy(0, (unsigned)getpid(), (unsigned long long)from, (unsigned long long)mid, &b) != 0) return to;
        if ((long long)b >= total)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

static void print_list(const char *key, const long long *v, size_t len) {
    printf("%s=", key);
    for (size_t i = 0; i < len; i++) printf("%s%lld", i ? "," : "", v[i]);
    printf("\n");
}

/* `lat SECONDS NS`: see the header. */
static void lat(double seconds, long long ns) {
    busy_fn busy = (busy_fn)dlsym(RTLD_DEFAULT, "cudasimDeviceBusyNs");
    /* Kept loaded between calls (a module's memory changes what NVML counts, which `evict LOW` reads). */
    static CUmodule m;
    static CUfunction spin;
    static long long loaded_ns;
    if (loaded_ns != ns) {
        char text[128];
        snprintf(text, sizeof text, "CUDASIM-MODULE 1\nkernel spin %lld\n", ns);
        if (loaded_ns) CK(cuModuleUnload(m));
        CK(cuModuleLoadData(&m, text));
        CK(cuModuleGetFunction(&spin, m, "spin"));
        loaded_ns = ns;
    }
    CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)); /* warm up */
    CK(cuCtxSynchronize());
    size_t cap = 4096, len = 0;
    long long *tl = malloc(cap * sizeof *tl), *wall = malloc(cap * sizeof *wall);
    long long until = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < until) {
        long long b0 = now_ns();
        CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
        long long b1 = now_ns();
        if (len == cap) {
            cap *= 2;
            tl = realloc(tl, cap * sizeof *tl);
            wall = realloc(wall, cap * sizeof *wall);
        }
        tl[len] = (busy ? done_at(busy, b0, b1, ns) : b1) - b0;
        wall[len++] = b1 - b0;
    }
    print_list("lat_ns", tl, len);
    print_list("wall_ns", wall, len);
    free(tl);
    free(wall);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: elastic_goals COUNT SIZE_MIB\n");
        return 2;
    }
    count = atoi(argv[1]);
    n = (size_t)atoi(argv[2]) << 20;
    if (count < 1 || count > MAXN || n == 0) {
        fprintf(stderr, "invalid COUNT or SIZE_MIB\n");
        return 2;
    }
    inc = cq_elastic_init();
    CK(cuMemAllocHost((void **)&host, n));
    for (int b = 0; b < count; b++) {
        CUresult r = cuMemAlloc(&buf[b], n);
        if (r != CUDA_SUCCESS) {
            /* The bench counts it (a tenant that could not start): said, not a crash. */
            printf("start_fail=%s\nready=0\n", cq_err(r));
            fflush(stdout);
            return 1;
        }
        for (size_t i = 0; i < n; i++) host[i] = pat(b, i);
        CK(cuMemcpyHtoD(buf[b], host, n));
    }
    printf("resident=%llu\nready=1\n", resident());
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "base", 4)) {
            long long d2h = 0, h2d = 0;
            for (int b = 0; b < count; b++) {
                long long t0 = now_ns();
                CK(cuMemcpyDtoH(host, buf[b], n));
                long long t1 = now_ns();
                CK(cuMemcpyHtoD(buf[b], host, n));
                d2h += t1 - t0;
                h2d += now_ns() - t1;
            }
            printf("d2h_ns=%lld\nh2d_ns=%lld\n", d2h, h2d);
        } else if (!strncmp(line, "evict ", 6)) {
            unsigned long long low = strtoull(line + 6, NULL, 10);
            long long t0 = now_ns(), took = -1;
            while (now_ns() - t0 < 60000000000ll) {
                if (resident() <= low) {
                    took = now_ns() - t0;
                    break;
                }
                usleep(200);
            }
            printf("evict_ns=%lld\n", took);
        } else if (!strncmp(line, "restore", 7)) {
            long long t0 = now_ns(), first = 0;
            for (int b = 0; b < count; b++) {
                cq_inc(inc, buf[b], n);
                adds[b]++;
                if (b == 0) first = now_ns() - t0;
            }
            long long t1 = now_ns();
            CK(cuCtxSynchronize());
            long long t2 = now_ns();
            printf("restore_ns=%lld\nlaunches_ns=%lld\nsync_ns=%lld\nresident=%llu\n", first, t1 - t0, t2 - t1,
                   resident());
        } else if (!strncmp(line, "check", 5)) {
            int bad_b = -1;
            long bad_i = -1;
            for (int b = 0; b < count && bad_b < 0; b++) {
                CK(cuMemcpyDtoH(host, buf[b], n));
                for (size_t i = 0; i < n; i++)
                    if (host[i] != (unsigned char)(pat(b, i) + adds[b])) {
                        bad_b = b;
                        bad_i = (long)i;
                        break;
                    }
            }
            if (bad_b >= 0) printf("bad=%d/%ld\n", bad_b, bad_i);
            printf("ok=%d\n", bad_b < 0);
        } else if (!strncmp(line, "wake ", 5)) {
            size_t s = (size_t)atoi(line + 5) << 20;
            long long t0 = now_ns();
            CUdeviceptr scratch = 0;
            CUresult r = cuMemAlloc(&scratch, s);
            int oom = r != CUDA_SUCCESS;
            long long t1 = now_ns(), t2 = t1;
            for (int b = 0; b < count; b++) {
                cq_inc(inc, buf[b], n);
                adds[b]++;
                if (b == 0) t2 = now_ns();
            }
            CK(cuCtxSynchronize());
            if (r == CUDA_SUCCESS) CK(cuMemFree(scratch));
            printf("alloc_ns=%lld\nfirst_ns=%lld\noom=%d\nwake_ns=%lld\n", t1 - t0, t2 - t1, oom, now_ns() - t0);
        } else if (!strncmp(line, "lat ", 4)) {
            double secs = 0;
            long long ns = 0;
            if (sscanf(line + 4, "%lf %lld", &secs, &ns) != 2 || ns <= 0) {
                printf("fail=lat: SECONDS NS\n");
                fflush(stdout);
                return 1;
            }
            lat(secs, ns);
        } else if (!strncmp(line, "quit", 4)) {
            for (int b = 0; b < count; b++) CK(cuMemFree(buf[b]));
            CK(cuMemFreeHost(host));
            printf("resident=%llu\n", resident());
            fflush(stdout);
            return 0;
        }
        fflush(stdout);
    }
    return 0;
}

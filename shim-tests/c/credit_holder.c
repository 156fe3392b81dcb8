/* credit_holder: the per-process credit of commit ca6432f (src/memory/credit.rs), judged by the simulator.
 *
 *   credit_holder hold N        charges up to 32 MiB of credit (8 x 2 MiB, then 1 MiB: a 16 MiB chunk is
 *                                 charged ahead; the 8 x 2 MiB freed into the credit), prints held=1 and
 *                                 used.before=, waits for a line on stdin, then asks for up to N x 1 MiB and
 *                                 prints taken=K, rc=, used.after=; then waits for a line again.
 *   credit_holder bypass SIZE   takes SIZE through libcuda's own cuMemAlloc_v2 (no interposer sees it), then
 *                                 fills with 64 MiB through the shim until refused (the reconciliation near the
 *                                 cap catches the bypass: the ledger then says the container is over its cap);
 *                                 fill.count=, fill.rc=, used=; prints ready=1 and waits for a line.
 *   credit_holder holdlazy SIZE as hold, then (after the line) a library with a SIZE global loaded lazily
 *                                 (the driver takes it at cuLibraryGetGlobal): global=, used.after=; waits.
 *   credit_holder filllazy SIZE fills with 1 MiB pieces until refused, then the same lazy SIZE global:
 *                                 fill.count=, global=, used=; prints ready=1 and waits for a line.
 *   credit_holder race T K      T threads (started together) each ask for K x 1 MiB and keep them (credit runs
 *                                 out on several threads at once: each charges a chunk ahead); prints got=,
 *                                 used.race=, ready=1 and waits for a line (what it holds is allocations and
 *                                 credit).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "credit_holder"
#include "cq_fill.h"

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) return;
}

/* A library whose SIZE global the driver takes at cuLibraryGetGlobal (lazy loading), as reconcile.c. */
static CUresult lazy_global(unsigned long long size) {
    char image[256];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k 1000\nglobal g %llu\n", size);
    CUlibrary lib;
    CUresult r = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    CUdeviceptr g;
    size_t n;
    return cuLibraryGetGlobal(&g, &n, lib, "g");
}

static pthread_barrier_t g_bar;
static unsigned long long g_k;
static atomic_ullong g_got;
static CUcontext g_ctx;

static void *racer(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx);
    pthread_barrier_wait(&g_bar);
    for (unsigned long long i = 0; i < g_k; i++) {
        CUdeviceptr q;
        if (cuMemAlloc(&q, 1 << 20) == CUDA_SUCCESS) atomic_fetch_add(&g_got, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: credit_holder hold|holdlazy|bypass|filllazy|race ARG...\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long a = cq_size(argv[2]);
    CUdevice d0;
    CUcontext c0 = primary0(&d0);
    if (strcmp(mode, "hold") == 0 || strcmp(mode, "holdlazy") == 0) {
        CUdeviceptr p[9];
        for (int i = 0; i < 8; i++) CK(cuMemAlloc(&p[i], 2 << 20));
        CK(cuMemAlloc(&p[8], 1 << 20));
        for (int i = 0; i < 8; i++) CK(cuMemFree(p[i]));
        used(0, "used.before");
        printf("held=1\nready=1\n");
        fflush(stdout);
        wait_line();
        if (strcmp(mode, "holdlazy") == 0) {
            printf("global=%s\n", cq_err(lazy_global(a)));
            used(0, "used.after");
            printf("ready=1\n");
            fflush(stdout);
            wait_line();
            return 0;
        }
        unsigned long long k = 0;
        CUresult r = CUDA_SUCCESS;
        for (; k < a; k++) {
            CUdeviceptr q;
            r = cuMemAlloc(&q, 1 << 20);
            if (r != CUDA_SUCCESS) break;
        }
        printf("taken=%llu\nrc=%s\n", k, cq_err(r));
        used(0, "used.after");
        printf("ready=1\n");
        fflush(stdout);
        wait_line();
    } else if (strcmp(mode, "filllazy") == 0) {
        int n = 0;
        for (; n < 4096; n++) {
            CUdeviceptr q;
            if (cuMemAlloc(&q, 1 << 20) != CUDA_SUCCESS) break;
        }
        printf("fill.count=%d\n", n);
        printf("global=%s\n", cq_err(lazy_global(a)));
        used(0, "used");
        printf("ready=1\n");
        fflush(stdout);
        wait_line();
    } else if (strcmp(mode, "race") == 0) {
        unsigned t = (unsigned)a;
        g_k = argc > 3 ? cq_size(argv[3]) : 64;
        g_ctx = c0;
        pthread_t th[64];
        if (t > 64) t = 64;
        pthread_barrier_init(&g_bar, NULL, t);
        for (unsigned i = 0; i < t; i++) pthread_create(&th[i], NULL, racer, NULL);
        for (unsigned i = 0; i < t; i++) pthread_join(th[i], NULL);
        printf("got=%llu\n", (unsigned long long)atomic_load(&g_got));
        used(0, "used.race");
        printf("ready=1\n");
        fflush(stdout);
        wait_line();
    } else if (strcmp(mode, "bypass") == 0) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*alloc)(CUdeviceptr *, size_t) =
            cuda ? (CUresult(*)(CUdeviceptr *, size_t))cq_elf_sym(cuda, "cuMemAlloc_v2") : NULL;
        if (!alloc) {
            fprintf(stderr, "credit_holder: libcuda's own cuMemAlloc_v2 not found\n");
            return 2;
        }
        CUdeviceptr p;
        printf("bypass=%s\n", cq_err(alloc(&p, a)));
        fill(64 << 20);
        printf("ready=1\n");
        fflush(stdout);
        wait_line();
    } else {
        fprintf(stderr, "credit_holder: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}

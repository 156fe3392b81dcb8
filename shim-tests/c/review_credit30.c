/* review_credit30: the per-process credit of commit ca6432f (src/memory/credit.rs), judged by the simulator.
 *
 *   review_credit30 hold N        charges up to 32 MiB of credit (8 x 2 MiB, then 1 MiB: a 16 MiB chunk is
 *                                 charged ahead; the 8 x 2 MiB freed into the credit), prints held=1 and
 *                                 used.before=, waits for a line on stdin, then asks for up to N x 1 MiB and
 *                                 prints taken=K, rc=, used.after=; then waits for a line again.
 *   review_credit30 bypass SIZE   takes SIZE through libcuda's own cuMemAlloc_v2 (no interposer sees it), then
 *                                 fills with 64 MiB through the shim until refused (the reconciliation near the
 *                                 cap catches the bypass: the ledger then says the container is over its cap);
 *                                 fill.count=, fill.rc=, used=; prints ready=1 and waits for a line.
 *   review_credit30 idle N        N x 1 MiB then frees them all (a process that used small buffers and went
 *                                 idle); prints held=1 and waits for a line.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "review_credit30"
#include "cq_fill.h"

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) return;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: review_credit30 hold|bypass|idle ARG\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long a = cq_size(argv[2]);
    CK(cuInit(0));
    CUdevice d0;
    CK(cuDeviceGet(&d0, 0));
    CUcontext c0;
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuCtxSetCurrent(c0));
    if (strcmp(mode, "hold") == 0) {
        CUdeviceptr p[9];
        for (int i = 0; i < 8; i++) CK(cuMemAlloc(&p[i], 2 << 20));
        CK(cuMemAlloc(&p[8], 1 << 20));
        for (int i = 0; i < 8; i++) CK(cuMemFree(p[i]));
        used(0, "used.before");
        printf("held=1\nready=1\n");
        fflush(stdout);
        wait_line();
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
    } else if (strcmp(mode, "idle") == 0) {
        CUdeviceptr *p = calloc(a, sizeof *p);
        for (unsigned long long i = 0; i < a; i++) CK(cuMemAlloc(&p[i], 1 << 20));
        for (unsigned long long i = 0; i < a; i++) CK(cuMemFree(p[i]));
        used(0, "used.idle");
        printf("held=1\nready=1\n");
        fflush(stdout);
        wait_line();
    } else if (strcmp(mode, "bypass") == 0) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*alloc)(CUdeviceptr *, size_t) =
            cuda ? (CUresult(*)(CUdeviceptr *, size_t))cq_elf_sym(cuda, "cuMemAlloc_v2") : NULL;
        if (!alloc) {
            fprintf(stderr, "review_credit30: libcuda's own cuMemAlloc_v2 not found\n");
            return 2;
        }
        CUdeviceptr p;
        printf("bypass=%s\n", cq_err(alloc(&p, a)));
        fill(64 << 20);
        printf("ready=1\n");
        fflush(stdout);
        wait_line();
    } else {
        fprintf(stderr, "review_credit30: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}

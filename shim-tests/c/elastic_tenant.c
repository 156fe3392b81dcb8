/* elastic_tenant: an elastic tenant for the elastic memory tests (issue 39; shim-tests/tests/elastic_moves.rs).
 *
 *   elastic_tenant SIZE_MIB
 *
 * Allocates SIZE_MIB with cuMemAlloc (movable under an elastic policy) and 1 MiB (too small to move), writes a
 * pattern into both, prints `ready=1`, then reads commands from stdin, one a line, answering each:
 *   res        resident=<the simulator's NVML used bytes of device 0, past any interposer>
 *              info_used=<cuMemGetInfo's used bytes, what the tenant is charged>
 *   check      one memory-touching kernel adds 1 to every byte of both buffers; then both are copied back and
 *              compared with the pattern plus every add so far: ok=1, or bad=<offset> (and range=<0|1>: whether
 *              cuMemGetAddressRange still names the buffer)
 *   launch     the kernel on the big buffer once: launch=<its answer>
 *   storm N    N rounds of: the kernel on the big buffer, cuStreamSynchronize, 2 ms asleep (launches that
 *              race with evictions and restores); storm=done
 *   ctxreset   cuDevicePrimaryCtxReset of device 0 (both buffers go with the context), the context retained
 *              again: reset=<its answer>, then as `res`
 *   ipc        cuIpcGetMemHandle of the big buffer: ipc=<its answer>
 *   op NAME    one call of an entry point on a third 1 MiB buffer (scratch; the big buffer's first 4 KiB the
 *              source of copies), then its stream synchronised: op=<its answer>. NAME: peer (cuMemcpyPeer),
 *              peer_async (cuMemcpyPeerAsync), memset2d (cuMemsetD2D8), write32 (cuStreamWriteValue32),
 *              wait32 (cuStreamWaitValue32 on a word already set), prefetch (cuMemPrefetchAsync of the big buffer);
 *              on the big buffer's first word: bigwrite32 (cuStreamWriteValue32 of its complement; `peek` checks
 *              and mends it), bigwait32 (cuStreamWaitValue32 on its value), bigbatch (cuStreamBatchMemOp writing
 *              its value)
 *   peek       the big buffer's first word read back: peek=1 if it is what bigwrite32 wrote, else 0; the pattern
 *              written back
 *   hold       a new stream waits (cuStreamWaitValue32, EQ) for the big buffer's third word to become its
 *              complement: hold=<its answer> (the wait stays pending)
 *   release    that word set (cuMemcpyHtoD), the stream synchronised, the pattern written back: release=ok
 *   peerlaunch MS   device 1's primary context made current, peer access to device 0's enabled (once), an MS ms
 *              kernel adding 1 to every byte of the big buffer launched on its NULL stream (not waited for),
 *              device 0's context current again: peer=<the launch's answer>
 *   peersync   device 1's context synchronised: peersync=<its answer>
 *   quit       frees both (unless reset); resident=<bytes>, then exits
 * Linked with -lcuda (the simulator in tests). */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cq_elastic.h"


static CUfunction inc;
static CUdeviceptr big, small, scratch;
static size_t big_n, small_n = 1 << 20;
static unsigned adds_big, adds_small;
static int was_reset;
static CUstream held;

static unsigned char pat(size_t i) { return (unsigned char)(i * 131u + (i >> 12)); }

/* The big buffer's 4-byte word at `off` as the pattern (plus every add) has it. */
static unsigned expected_word(size_t off) {
    unsigned char b[4];
    for (size_t i = 0; i < 4; i++) b[i] = (unsigned char)(pat(off + i) + adds_big);
    unsigned w;
    memcpy(&w, b, 4);
    return w;
}

static long compare(CUdeviceptr p, size_t n, unsigned adds) {
    unsigned char *h = malloc(n);
    CK(cuMemcpyDtoH(h, p, n));
    long bad = -1;
    for (size_t i = 0; i < n; i++)
        if (h[i] != (unsigned char)(pat(i) + adds)) {
            bad = (long)i;
            break;
        }
    free(h);
    return bad;
}

static void fill(CUdeviceptr p, size_t n) {
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = pat(i);
    CK(cuMemcpyHtoD(p, h, n));
    free(h);
}

static void res(void) {
    cq_rawmem m;
    size_t f = 0, t = 0;
    CK(cuMemGetInfo(&f, &t));
    printf("resident=%llu\ninfo_used=%zu\n", cq_raw_nvml_mem(0, &m) == 0 ? m.used : 0ull, t - f);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    big_n = (size_t)atoi(argv[1]) << 20;
    inc = cq_elastic_init();
    res();
    CK(cuMemAlloc(&big, big_n));
    CK(cuMemAlloc(&small, small_n));
    fill(big, big_n);
    fill(small, small_n);
    res();
    printf("ready=1\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "res", 3)) {
            res();
        } else if (!strncmp(line, "check", 5)) {
            cq_inc(inc, big, big_n);
            cq_inc(inc, small, small_n);
            adds_big++;
            adds_small++;
            CK(cuCtxSynchronize());
            long b = compare(big, big_n, adds_big), s = compare(small, small_n, adds_small);
            CUdeviceptr base = 0;
            size_t size = 0;
            int range = cuMemGetAddressRange(&base, &size, big + 4096) == CUDA_SUCCESS && base == big &&
                        size >= big_n;
            printf("range=%d\n", range);
            if (b >= 0 || s >= 0)
                printf("bad=%ld/%ld\n", b, s);
            else
                printf("ok=1\n");
        } else if (!strncmp(line, "launch", 6)) {
            /* One launch on the big range, its answer printed. */
            void *args[] = {&big, &big_n};
            CUresult r = cuLaunchKernel(inc, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
            if (r == CUDA_SUCCESS) adds_big++;
            CK(cuCtxSynchronize());
            printf("launch=%s\n", cq_err(r));
        } else if (!strncmp(line, "storm ", 6)) {
            int n = atoi(line + 6);
            for (int i = 0; i < n; i++) {
                cq_inc(inc, big, big_n);
                adds_big++;
                CK(cuStreamSynchronize(NULL));
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
            }
            printf("storm=done\n");
        } else if (!strncmp(line, "ctxreset", 8)) {
            CUresult r = cuDevicePrimaryCtxReset(0);
            if (r == CUDA_SUCCESS) was_reset = 1;
            printf("reset=%s\n", cq_err(r));
            CK(cq_use_device(0));
            res();
        } else if (!strncmp(line, "ipc", 3)) {
            CUipcMemHandle h;
            printf("ipc=%s\n", cq_err(cuIpcGetMemHandle(&h, big)));
        } else if (!strncmp(line, "op ", 3)) {
            CUcontext ctx;
            CK(cuCtxGetCurrent(&ctx));
            if (!scratch) CK(cuMemAlloc(&scratch, 1 << 20));
            const char *w = line + 3;
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            if (!strncmp(w, "peer_async", 10))
                r = cuMemcpyPeerAsync(scratch, ctx, big, ctx, 4096, NULL);
            else if (!strncmp(w, "peer", 4))
                r = cuMemcpyPeer(scratch, ctx, big, ctx, 4096);
            else if (!strncmp(w, "memset2d", 8))
                r = cuMemsetD2D8(scratch, 4096, 7, 4096, 4);
            else if (!strncmp(w, "bigwrite32", 10))
                r = cuStreamWriteValue32(NULL, big, ~expected_word(0), 0);
            else if (!strncmp(w, "bigwait32", 9))
                r = cuStreamWaitValue32(NULL, big, expected_word(0), CU_STREAM_WAIT_VALUE_EQ);
            else if (!strncmp(w, "bigbatch", 8)) {
                CUstreamBatchMemOpParams op;
                memset(&op, 0, sizeof op);
                op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
                op.writeValue.address = big;
                op.writeValue.value = expected_word(0);
                r = cuStreamBatchMemOp(NULL, 1, &op, 0);
            } else if (!strncmp(w, "write32", 7))
                r = cuStreamWriteValue32(NULL, scratch, 1, 0);
            else if (!strncmp(w, "wait32", 6))
                r = cuStreamWaitValue32(NULL, scratch + 8192, 0, CU_STREAM_WAIT_VALUE_GEQ);
            else if (!strncmp(w, "prefetch", 8)) {
                CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
                r = cuMemPrefetchAsync(big, 4096, loc, 0, NULL);
            }
            CK(cuStreamSynchronize(NULL));
            printf("op=%s\n", cq_err(r));
        } else if (!strncmp(line, "peek", 4)) {
            unsigned v = 0, e = expected_word(0);
            CK(cuMemcpyDtoH(&v, big, 4));
            printf("peek=%d\n", v == ~e);
            CK(cuMemcpyHtoD(big, &e, 4));
        } else if (!strncmp(line, "hold", 4)) {
            CK(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
            printf("hold=%s\n", cq_err(cuStreamWaitValue32(held, big + 8, ~expected_word(8), CU_STREAM_WAIT_VALUE_EQ)));
        } else if (!strncmp(line, "release", 7)) {
            unsigned v = ~expected_word(8), e = expected_word(8);
            CK(cuMemcpyHtoD(big + 8, &v, 4));
            CK(cuStreamSynchronize(held));
            CK(cuMemcpyHtoD(big + 8, &e, 4));
            CK(cuStreamDestroy(held));
            printf("release=ok\n");
        } else if (!strncmp(line, "peerlaunch ", 11)) {
            char module[160];
            snprintf(module, sizeof module, "CUDASIM-MODULE 1\nkernel slowinc %lld\ntouch slowinc add p0 p1 1\n",
                     atoll(line + 11) * 1000000ll);
            CUcontext ctx0, ctx1;
            CUmodule m;
            CUfunction slow;
            CK(cuCtxGetCurrent(&ctx0));
            CK(cq_use_device(1));
            CK(cuCtxGetCurrent(&ctx1));
            CUresult pe = cuCtxEnablePeerAccess(ctx0, 0);
            if (pe != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) CK(pe);
            CK(cuModuleLoadData(&m, module));
            CK(cuModuleGetFunction(&slow, m, "slowinc"));
            void *args[] = {&big, &big_n};
            CUresult r = cuLaunchKernel(slow, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
            if (r == CUDA_SUCCESS) adds_big++;
            CK(cuCtxSetCurrent(ctx0));
            printf("peer=%s\n", cq_err(r));
        } else if (!strncmp(line, "peersync", 8)) {
            CUcontext ctx0;
            CK(cuCtxGetCurrent(&ctx0));
            CK(cq_use_device(1));
            CUresult r = cuCtxSynchronize();
            CK(cuCtxSetCurrent(ctx0));
            printf("peersync=%s\n", cq_err(r));
        } else if (!strncmp(line, "quit", 4)) {
            if (!was_reset) {
                CK(cuMemFree(big));
                CK(cuMemFree(small));
                if (scratch) CK(cuMemFree(scratch));
            }
            res();
            fflush(stdout);
            return 0;
        }
        fflush(stdout);
    }
    return 0;
}

/* priority_attack_manyctx.c (hostile review 29): a best-effort tenant (priority low) that launches from NCTX
 * contexts of the same device, round robin.
 *   priority_attack_manyctx SECONDS KMIN_NS KMAX_NS SEED NCTX K START_AT_NS
 * Each round: one kernel from each of the first NCTX-1 contexts, then K kernels from the last one (K = 1:
 * plain round robin). With NCTX = 5 the first four are the "anchors" that keep the tracker's 4 context
 * indices busy, and the K kernels of the fifth are never tracked.
 * The tracker (src/throttle/priority.rs, BeSlot::ctx_index) follows at most CTXS = 4 contexts; a launch from a
 * fifth context while the four have kernels queued is admitted by be_admit and then not tracked
 * (Completions::track returns false), so the next launch's budget does not count it.
 * With NCTX = 2 and K = 1 it alternates two contexts (an ordinary pattern: two libraries with their own
 * context): each launch must count what the other context queued (one queue per device for all contexts).
 * Prints pid, t0_ns, end_ns, kernels, busy_ns. */
#include "cq_kernel.h"
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng;
static uint64_t next_rand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

int main(int argc, char **argv) {
    if (argc < 8) return 2;
    double seconds = atof(argv[1]);
    uint64_t kmin = strtoull(argv[2], NULL, 10), kmax = strtoull(argv[3], NULL, 10);
    rng = strtoull(argv[4], NULL, 10) | 1;
    int nctx = atoi(argv[5]);
    if (nctx < 1 || nctx > 128) return 2;
    uint64_t k = strtoull(argv[6], NULL, 10);
    if (k < 1) k = 1;
    uint64_t start_at = strtoull(argv[7], NULL, 10);
    uint64_t unit = kmin / 10;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    int sms = 1;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUcontext ctx[128];
    CUstream st[128];
    CUfunction fn[128];
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel spin %llu\n", (unsigned long long)unit);
    CK(cuDevicePrimaryCtxRetain(&ctx[0], dev));
    for (int i = 1; i < nctx; i++) CK(cuCtxCreate(&ctx[i], NULL, 0, dev));
    for (int i = 0; i < nctx; i++) {
        CUmodule m;
        CK(cuCtxSetCurrent(ctx[i]));
        CK(cuModuleLoadData(&m, image));
        CK(cuModuleGetFunction(&fn[i], m, "spin"));
        CK(cuStreamCreate(&st[i], 0));
    }
    struct timespec ts = {(time_t)(start_at / 1000000000ull), (long)(start_at % 1000000000ull)};
    if (start_at > now_ns()) clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\n", (int)getpid(), (unsigned long long)t0, (unsigned long long)until);
    fflush(stdout);
    uint64_t n = 0, busy = 0;
    while (now_ns() < until) {
        uint64_t per = (uint64_t)nctx - 1 + k, r = n % per;
        int i = r < (uint64_t)nctx - 1 ? (int)r : nctx - 1;
        uint64_t ns = kmin + next_rand() % (kmax - kmin + 1);
        uint64_t waves = ns / unit;
        CK(cuCtxSetCurrent(ctx[i]));
        CK(cuLaunchKernel(fn[i], (unsigned)(waves * (uint64_t)sms), 1, 1, 32, 1, 1, 0, st[i], NULL, NULL));
        busy += waves * unit;
        n++;
    }
    for (int i = 0; i < nctx; i++) {
        CK(cuCtxSetCurrent(ctx[i]));
        CK(cuCtxSynchronize());
    }
    printf("kernels=%llu\nbusy_ns=%llu\n", (unsigned long long)n, (unsigned long long)busy);
    return 0;
}

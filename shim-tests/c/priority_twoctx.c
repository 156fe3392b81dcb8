/* priority_twoctx.c: a best-effort tenant (priority low) that launches from two contexts of the same device,
 * alternately (an ordinary pattern: two libraries with their own context; or a hostile one).
 *   priority_twoctx SECONDS KMIN_NS KMAX_NS SEED START_AT_NS
 * Each launch must count what the other context queued: the tracker (src/throttle/priority.rs) keeps one queue
 * per device for all contexts (it used to drop the queue on a context switch, so each launch found nothing).
 * Prints pid, t0_ns, end_ns, kernels, busy_ns. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#define CK(c)                                                                                                   \
    do {                                                                                                        \
        CUresult r_ = (c);                                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                               \
            fprintf(stderr, "%s failed: %d\n", #c, (int)r_);                                                   \
            exit(2);                                                                                            \
        }                                                                                                       \
    } while (0)
static uint64_t rng;
static uint64_t next_rand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

int main(int argc, char **argv) {
    if (argc < 6) return 2;
    double seconds = atof(argv[1]);
    uint64_t kmin = strtoull(argv[2], NULL, 10), kmax = strtoull(argv[3], NULL, 10);
    rng = strtoull(argv[4], NULL, 10) | 1;
    uint64_t start_at = strtoull(argv[5], NULL, 10);
    uint64_t unit = kmin / 10;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    int sms = 1;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUcontext ctx[2];
    CUstream st[2];
    CUfunction fn[2];
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel spin %llu\n", (unsigned long long)unit);
    CK(cuDevicePrimaryCtxRetain(&ctx[0], dev));
    CK(cuCtxCreate(&ctx[1], NULL, 0, dev));
    for (int i = 0; i < 2; i++) {
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
        int i = (int)(n & 1);
        uint64_t ns = kmin + next_rand() % (kmax - kmin + 1);
        uint64_t waves = ns / unit;
        CK(cuCtxSetCurrent(ctx[i]));
        CK(cuLaunchKernel(fn[i], (unsigned)(waves * (uint64_t)sms), 1, 1, 32, 1, 1, 0, st[i], NULL, NULL));
        busy += waves * unit;
        n++;
    }
    for (int i = 0; i < 2; i++) {
        CK(cuCtxSetCurrent(ctx[i]));
        CK(cuCtxSynchronize());
    }
    printf("kernels=%llu\nbusy_ns=%llu\n", (unsigned long long)n, (unsigned long long)busy);
    return 0;
}

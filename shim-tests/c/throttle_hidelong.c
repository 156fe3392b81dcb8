/* throttle_hidelong.c (issue 36 hostile review): one launch shape whose length is a parameter; a loop of 5 us
 * launches makes its estimate 5 us; then, each round, a 5 us launch (the probe, after a pause) and right behind it,
 * unprobed and charged the 5 us estimate, a LONG_NS launch; the program then makes no CUDA call for LONG_NS +
 * TAIL_MS. NVML's floor is taken when a later probe settles, over the window since the last one, from NVML's
 * samples, which cover the last second only: with TAIL_MS >= 1000 they show the process idle. MODE 0 is the
 * control (no 5 us launch before the long one: the long one is the probe).
 *
 *   throttle_hidelong SECONDS LONG_NS TAIL_MS MODE
 * Output: pid, t0_ns (after the warm-up), end_ns (after a last launch waited for what was owed), launches. */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void pause_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    double secs = atof(argv[1]);
    unsigned long long long_ns = strtoull(argv[2], NULL, 10), short_ns = 5000;
    uint64_t tail_ns = strtoull(argv[3], NULL, 10) * 1000000ull;
    int mode = atoi(argv[4]);
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\nlength k p0\n", short_ns);
    int sms;
    CUmodule m = cq_primary_module(image, &sms);
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "k"));
    void *sp[] = {&short_ns}, *lp[] = {&long_ns};
    for (int i = 0; i < 200; i++) {
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
        CK(cuCtxSynchronize());
        pause_ns(100000);
    }
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        pause_ns(3000000);
        if (mode == 1) CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, lp, NULL));
        n++;
        pause_ns(long_ns + tail_ns);
    }
    /* What was charged is paid before the window ends: this launch waits for it. */
    CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
    CK(cuCtxSynchronize());
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    fflush(stdout);
    _exit(0);
}

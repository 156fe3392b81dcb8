/* throttle_burst.c (issue 21 item 5, a hostile review's attack; held): never-measured shapes are charged the process's average
 * measurement (Estimator::fallback), and for PROBE_INTERVAL (2 ms) after a probe settles no launch is a probe and a
 * never-measured shape does not wait. Each round: one tiny kernel (probed: pulls the average to ~its 10 us), then,
 * right after its probe settles, a burst of K never-seen shapes of a long kernel, charged ~10 us each; the last
 * one is never measured either (the next probe is the tiny kernel again).
 *
 *   throttle_burst SECONDS KERNEL_NS K
 * Output: pid, t0_ns, end_ns, launches (long ones). */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


int main(int argc, char **argv) {
    if (argc < 4) return 2;
    double secs = atof(argv[1]);
    int k = atoi(argv[3]);
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %s\nkernel tiny 10000\n", argv[2]);
    int sms;
    CUmodule m = cq_primary_module(image, &sms);
    CUfunction f, tiny;
    CK(cuModuleGetFunction(&f, m, "k"));
    CK(cuModuleGetFunction(&tiny, m, "tiny"));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        CK(cuLaunchKernel(tiny, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
        for (int j = 0; j < k; j++) {
            unsigned bx = 1 + (unsigned)(n % 1024), by = 1 + (unsigned)(n / 1024);
            CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, bx, by, 1, 0, NULL, NULL, NULL));
            n++;
        }
        CK(cuCtxSynchronize());
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    fflush(stdout);
    _exit(0);
}

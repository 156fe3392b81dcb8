/* throttle_shapes.c (issue 21 item 5, a hostile review's attack; held): every launch a never-seen shape (block size varies, the
 * duration does not). One probe is out at a time per device; a never-measured key waits at most 200 ms for it and
 * then goes at the fallback (1 ms); followers are corrected only when they share the probe's key.
 *
 *   throttle_shapes SECONDS KERNEL_NS
 * Output: pid, t0_ns, end_ns, launches. */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


int main(int argc, char **argv) {
    if (argc < 3) return 2;
    double secs = atof(argv[1]);
    char image[128];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %s\n", argv[2]);
    int sms;
    CUmodule m = cq_primary_module(image, &sms);
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "k"));
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        unsigned bx = 1 + (unsigned)(n % 1024), by = 1 + (unsigned)(n / 1024);
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, bx, by, 1, 0, NULL, NULL, NULL));
        n++;
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    fflush(stdout);
    _exit(0);
}

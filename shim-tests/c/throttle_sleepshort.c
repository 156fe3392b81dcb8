/* throttle_sleepshort.c (issue 36): a data-dependent kernel (one launch shape, its length a parameter) made short
 * exactly on the launch after one whose call slept (the throttle's sleep shows in the call's duration): the
 * launch the throttle probed, so every probe measured the short variant and every other launch was charged it.
 * MODE 0 is the control (every launch long). The window reported starts after 1 s of warm-up (the first launches
 * are charged before any NVML window can have closed: a queue's depth of them may run ahead).
 *
 *   throttle_sleepshort SECONDS LONG_NS SHORT_NS MODE
 * Output: pid, t0_ns, end_ns, launches, short (how many were short). */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    double secs = atof(argv[1]);
    unsigned long long long_ns = strtoull(argv[2], NULL, 10), short_ns = strtoull(argv[3], NULL, 10);
    int mode = atoi(argv[4]);
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\nlength k p0\n", long_ns);
    int sms;
    CUmodule m = cq_primary_module(image, &sms);
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "k"));
    uint64_t start = now_ns(), t0 = start + 1000000000ull, until = start + (uint64_t)(secs * 1e9);
    unsigned long n = 0, shorts = 0;
    int slept = 0;
    while (now_ns() < until) {
        unsigned long long len = (mode == 1 && slept) ? short_ns : long_ns;
        shorts += len == short_ns;
        void *params[] = {&len};
        uint64_t a = now_ns();
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        /* A call that took over 200 us waited for the throttle (or for room in the queue). */
        slept = now_ns() - a > 200000;
        n++;
    }
    CK(cuCtxSynchronize());
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\nshort=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n, shorts);
    fflush(stdout);
    _exit(0);
}

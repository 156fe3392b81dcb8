/* throttle_hopshort.c (issue 36 hostile review): throttle_sleepshort's data-dependent kernel (short exactly on
 * the launch after one whose call slept, the launch the throttle probes) run by a chain of short-lived processes
 * of one container, each living CHILD_MS: NVML's floor on a process's charge needs a window that closes after a
 * baseline one, so a process that exits first never meets it. MODE 0 is the control (every launch long).
 * Children end with _exit (no exit handlers), as a hostile tenant would.
 *
 *   throttle_hopshort SECONDS CHILD_MS LONG_NS SHORT_NS MODE
 * Output: pid (the parent), t0_ns, end_ns (the parent's window, after 1 s of warm-up), launches (children). */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void child(uint64_t life_ns, unsigned long long long_ns, unsigned long long short_ns, int mode) {
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\nlength k p0\n", long_ns);
    int sms;
    CUmodule m = cq_primary_module(image, &sms);
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "k"));
    uint64_t until = now_ns() + life_ns;
    int slept = 0;
    while (now_ns() < until) {
        unsigned long long len = (mode == 1 && slept) ? short_ns : long_ns;
        void *params[] = {&len};
        uint64_t a = now_ns();
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        slept = now_ns() - a > 200000;
    }
    CK(cuCtxSynchronize());
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 6) return 2;
    double secs = atof(argv[1]);
    uint64_t life_ns = strtoull(argv[2], NULL, 10) * 1000000ull;
    unsigned long long long_ns = strtoull(argv[3], NULL, 10), short_ns = strtoull(argv[4], NULL, 10);
    int mode = atoi(argv[5]);
    uint64_t start = now_ns(), t0 = start + 1000000000ull, until = start + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        pid_t p = fork();
        if (p == 0) child(life_ns, long_ns, short_ns, mode);
        int st;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "child failed %d\n", st);
            return 1;
        }
        n++;
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    return 0;
}

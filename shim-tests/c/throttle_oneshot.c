/* throttle_oneshot.c (issue 21 item 5): short-lived processes of one container, each launching one long kernel,
 * waiting for it (cuCtxSynchronize) and exiting normally. Before the fix a probe was settled only by a later
 * launch of the same process, so each kernel was charged the 1 ms fallback (a 30 % container got 99 %); now it is
 * settled at the synchronize, and at exit (with what the process still owes).
 *
 *   throttle_oneshot parent SECONDS KERNEL_NS   (forks+execs `child` one after another until SECONDS passed)
 *   throttle_oneshot child KERNEL_NS
 * Output of the parent: pid, t0_ns, end_ns, launches (children). */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "child")) {
        char image[128];
        snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %s\n", argv[2]);
        int sms;
        CUmodule m = cq_primary_module(image, &sms);
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "k"));
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
        return 0;
    }
    if (argc < 4) return 2;
    double secs = atof(argv[2]);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    while (now_ns() < until) {
        pid_t p = fork();
        if (p == 0) {
            execl("/proc/self/exe", argv[0], "child", argv[3], (char *)NULL);
            _exit(127);
        }
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

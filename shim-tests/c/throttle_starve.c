/* throttle_starve.c (issue 36 hostile review of the NVML sampler): throttle_hidelong's attack (a 5 us probe, an
 * unprobed LONG_NS launch charged 5 us behind it, then no CUDA call for LONG_NS + TAIL_MS) by a tenant that
 * first tries to starve or stop the sampler thread. HOW:
 *   none     the attack alone (control: the sampler charges it);
 *   nothread RLIMIT_AS lowered to the current size + 64 KiB before the first launch: no thread can be created;
 *   sigblock every signal blocked in every thread;
 *   closefds every descriptor above 2 closed after the warm-up (the sampler's NVML ones included);
 *   fork     each round forks 40 children without exec (each calls a launch and exits), then attacks.
 *   mainexit the attack runs in a second thread; the main thread leaves by pthread_exit.
 *   idle     no attack: after the warm-up the process sleeps SECONDS; prints whether the sampler thread runs
 *            (sampler_thread=) and its CPU ns over that sleep (sampler_cpu_ns=, /proc schedstat).
 *
 *   throttle_starve SECONDS LONG_NS TAIL_MS HOW
 * Output: pid, t0_ns (after the warm-up), end_ns (after a last launch waited for what was owed), launches. */
#include <cuda.h>
#include "cq_kernel.h"
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pause_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double secs;
static unsigned long long long_ns, short_ns = 5000;
static uint64_t tail_ns;
static const char *how;
static CUfunction f;
static int sms;
static CUcontext ctx;

static void round_(void) {
    void *sp[] = {&short_ns}, *lp[] = {&long_ns};
    pause_ns(3000000);
    CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
    CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, lp, NULL));
    pause_ns(long_ns + tail_ns);
}

/* CPU ns (schedstat) of this process's thread named cuquota-nvml, or -1. */
static long long sampler_cpu_ns(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    struct dirent *e;
    long long r = -1;
    while ((e = readdir(d)) != NULL) {
        char path[300], comm[64] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *s = fopen(path, "r");
        if (!s) continue;
        size_t n = fread(comm, 1, sizeof comm - 1, s);
        fclose(s);
        comm[n] = 0;
        if (strncmp(comm, "cuquota-nvml", 12) != 0) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        s = fopen(path, "r");
        if (!s) continue;
        if (fscanf(s, "%lld", &r) != 1) r = -1;
        fclose(s);
    }
    closedir(d);
    return r;
}

static void *attack(void *arg) {
    (void)arg;
    void *sp[] = {&short_ns};
    CK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < 200; i++) {
        CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
        CK(cuCtxSynchronize());
        pause_ns(100000);
    }
    if (!strcmp(how, "closefds"))
        for (int fd = 3; fd < 65536; fd++) close(fd);
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long n = 0;
    if (!strcmp(how, "idle")) {
        long long a = sampler_cpu_ns();
        pause_ns((uint64_t)(secs * 1e9));
        long long b = sampler_cpu_ns();
        int alive = a >= 0 && b >= 0;
        printf("sampler_thread=%d\nsampler_cpu_ns=%lld\n", alive, alive ? b - a : 0);
        until = 0;
    }
    while (now_ns() < until) {
        if (!strcmp(how, "fork")) {
            /* A forked child cannot use CUDA (the driver's rule; the simulator's too): it only calls into the
             * shim, which must not hang on a lock the sampler held at the fork, then exits through atexit. */
            for (int k = 0; k < 40; k++) {
                pid_t c = fork();
                if (c == 0) {
                    void *sp[] = {&short_ns};
                    (void)cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL);
                    exit(0);
                }
                int st;
                waitpid(c, &st, 0);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    fprintf(stderr, "child failed: %d\n", st);
                    _exit(1);
                }
            }
            round_();
        } else {
            round_();
        }
        n++;
    }
    CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
    CK(cuCtxSynchronize());
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, n);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    secs = atof(argv[1]);
    long_ns = strtoull(argv[2], NULL, 10);
    tail_ns = strtoull(argv[3], NULL, 10) * 1000000ull;
    how = argv[4];
    char image[160];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\nlength k p0\n", short_ns);
    CUmodule m = cq_primary_module(image, &sms);
    CK(cuModuleGetFunction(&f, m, "k"));
    CK(cuCtxGetCurrent(&ctx));
    if (!strcmp(how, "sigblock")) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
    }
    if (!strcmp(how, "nothread")) {
        /* What is mapped now plus 64 KiB: no new thread stack fits. */
        FILE *s = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (!s || fscanf(s, "%lu", &pages) != 1) return 3;
        fclose(s);
        struct rlimit r = {pages * 4096ul + 65536ul, RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &r) != 0) return 4;
        pthread_t t;
        if (pthread_create(&t, NULL, attack, NULL) == 0) {
            fprintf(stderr, "a thread still starts\n");
            return 5;
        }
    }
    if (!strcmp(how, "mainexit")) {
        pthread_t t;
        if (pthread_create(&t, NULL, attack, NULL) != 0) return 6;
        pthread_exit(NULL);
    }
    attack(NULL);
    return 0;
}

// Shared helpers for the cuquota CUDA samples.
//
// Every sample prints one line per thing it checks:
//     check <name>: expected <x> observed <y> OK|FAIL
// and machine-readable results for the runner (validate.sh) as
//     metric <name>=<value>
// It exits 1 if any check failed, 2 if a CUDA call it cannot do without failed.
//
// Kernels do not compute on the simulator (they only take simulated time), so results of kernels are checked only
// on a real GPU: `results_checked()` is false when CQ_SAMPLES_SIMULATED=1 (validate.sh sets it) or when the
// device name says "Simulated".
#pragma once

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_failures = 0;

#define CUDA_TRY(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t err_ = (call);                                                                       \
        if (err_ != cudaSuccess) {                                                                       \
            printf("check %s: expected cudaSuccess observed %s (%d) FAIL\n", #call, cudaGetErrorName(err_), \
                   (int)err_);                                                                           \
            fflush(stdout);                                                                              \
            exit(2);                                                                                     \
        }                                                                                                \
    } while (0)

static inline void check_bool(const char *name, const char *expected, bool ok, const char *observed) {
    printf("check %s: expected %s observed %s %s\n", name, expected, observed, ok ? "OK" : "FAIL");
    if (!ok) g_failures++;
}

static inline void check_ull(const char *name, unsigned long long expected, unsigned long long observed) {
    char e[32], o[32];
    snprintf(e, sizeof e, "%llu", expected);
    snprintf(o, sizeof o, "%llu", observed);
    check_bool(name, e, expected == observed, o);
}

static inline void check_err(const char *name, cudaError_t expected, cudaError_t observed) {
    check_bool(name, cudaGetErrorName(expected), expected == observed, cudaGetErrorName(observed));
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline bool results_checked(void) {
    const char *sim = getenv("CQ_SAMPLES_SIMULATED");
    if (sim && *sim && strcmp(sim, "0") != 0) return false;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    return strstr(p.name, "Simulated") == NULL && strstr(p.name, "cudasim") == NULL;
}

// Fills a host buffer with a recognisable pattern (so a copy round trip is checked byte for byte).
static inline void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
}

// Prints the standard header: runtime and driver versions, device and memory.
static inline void print_header(const char *sample) {
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    printf("sample %s: runtime %d driver %d\n", sample, rt, drv);
    printf("metric runtime_version=%d\nmetric driver_version=%d\n", rt, drv);
}

static inline int finish(const char *sample) {
    printf("sample %s: %s (%d failed checks)\n", sample, g_failures ? "FAIL" : "OK", g_failures);
    return g_failures ? 1 : 0;
}

/* Many processes × many threads on one state file (run by tests/smoke.rs).
 * argv[1] = "stress": 4 threads allocate and free concurrently; prints "SMS <n> OOM <count>".
 * argv[1] = "check": after the stress processes are gone, this process must be the only user. */
#include <cuda.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB (1024ull * 1024ull)
static CUcontext ctx;
static int failures = 0;
static int ooms = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, int line) {
    pthread_mutex_lock(&mu);
    fprintf(stderr, "stress.c:%d: %s\n", line, what);
    failures++;
    pthread_mutex_unlock(&mu);
}
#define CHECK(c) do { if (!(c)) fail(#c, __LINE__); } while (0)

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 7919u + (unsigned)getpid();
    CUdeviceptr held[8] = {0};
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    for (int i = 0; i < 300; i++) {
        int k = rand_r(&seed) % 8;
        if (held[k]) {
            CHECK(cuMemFree(held[k]) == CUDA_SUCCESS);
            held[k] = 0;
        } else {
            size_t n = (size_t)(rand_r(&seed) % 8 + 1) * MB;
            CUresult r = cuMemAlloc(&held[k], n);
            if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                held[k] = 0;
                pthread_mutex_lock(&mu);
                ooms++;
                pthread_mutex_unlock(&mu);
            } else {
                CHECK(r == CUDA_SUCCESS);
                CHECK(cuMemsetD8(held[k], 0xab, 4096) == CUDA_SUCCESS && cuMemsetD8(held[k] + n - 4096, 0xcd, 4096) == CUDA_SUCCESS);
            }
        }
        size_t f = 0, t = 0;
        CHECK(cuMemGetInfo(&f, &t) == CUDA_SUCCESS && f <= t);
    }
    for (int k = 0; k < 8; k++)
        if (held[k]) CHECK(cuMemFree(held[k]) == CUDA_SUCCESS);
    return NULL;
}

int main(int argc, char **argv) {
    int sms = 0;
    if (cuInit(0) != CUDA_SUCCESS) return 2;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) == CUDA_SUCCESS);
    /* Other processes may hold all memory for a moment: the context's overhead must fit. */
    {
        CUresult r;
        for (int tries = 0; (r = cuDevicePrimaryCtxRetain(&ctx, 0)) == CUDA_ERROR_OUT_OF_MEMORY && tries < 5000; tries++)
            usleep(1000);
        CHECK(r == CUDA_SUCCESS);
    }
    if (argc > 1 && strcmp(argv[1], "check") == 0) {
        nvmlDevice_t d;
        nvmlMemory_t m;
        nvmlProcessInfo_t p[64];
        unsigned int n = 64;
        size_t f = 0, t = 0;
        CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
        CHECK(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
        CHECK(t - f == 4 * MB);
        CHECK(nvmlInit_v2() == NVML_SUCCESS);
        CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
        CHECK(nvmlDeviceGetMemoryInfo(d, &m) == NVML_SUCCESS && m.used == 4 * MB);
        CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p) == NVML_SUCCESS);
        CHECK(n == 1 && p[0].pid == (unsigned)getpid());
        if (failures == 0) printf("OK\n");
        return failures != 0;
    }
    pthread_t th[4];
    for (size_t i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    {
        size_t f = 0, t = 0;
        CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
        CHECK(cuMemGetInfo(&f, &t) == CUDA_SUCCESS && t == 512 * MB);
    }
    if (failures) return 1;
    printf("SMS %d OOM %d\n", sms, ooms);
    return 0;
}

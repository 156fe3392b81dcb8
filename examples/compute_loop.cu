// compute_loop: a compute-bound kernel launched back to back for a fixed wall time, for SM-limit checks.
// Prints the achieved kernels/s and the GPU time the kernels took (events), so validate.sh can compare the rate
// under a limit with the unlimited rate, and its pid and launch window (CLOCK_MONOTONIC), so that on the
// simulated GPU validate.sh reads the share from the device timeline instead.
//
//   compute_loop [seconds=2] [blocks=SMs*64 (also for 0)] [iterations=4096] [start_at_ns]
//
// The kernel's length is blocks x iterations on a GPU (0.40 ms on an H200 with the defaults), waves of blocks on
// the simulator (which ignores iterations). start_at_ns: CLOCK_MONOTONIC time to start launching at (after the
// warm-up), so several tenants start together.
#include "common.h"
#include <time.h>
#include <unistd.h>

static unsigned long long mono_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

__global__ void burn(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; i++) a = a * b + 1e-7f;
    if (a == -1.0f) out[blockIdx.x] = a;  // never true; keeps the loop alive
}

int main(int argc, char **argv) {
    print_header("compute_loop");
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    int sms = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int blocks = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : sms * 64;
    int iters = argc > 3 && atoi(argv[3]) > 0 ? atoi(argv[3]) : 4096;
    unsigned long long start_at = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    float *out;
    CUDA_TRY(cudaMalloc(&out, blocks * sizeof(float)));
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Warm-up: one kernel, timed by events, gives the kernel's own GPU time.
    cudaEvent_t a, b;
    CUDA_TRY(cudaEventCreate(&a));
    CUDA_TRY(cudaEventCreate(&b));
    CUDA_TRY(cudaEventRecord(a, s));
    burn<<<blocks, 256, 0, s>>>(out, iters);
    CUDA_TRY(cudaEventRecord(b, s));
    CUDA_TRY(cudaEventSynchronize(b));
    float one_ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&one_ms, a, b));

    // Batches of 8, four in flight: the queue stays short (the wall time measures execution, not queueing), and
    // the device does not idle while this process waits a while for a CPU to launch the next batch.
    enum { IN_FLIGHT = 4 };
    cudaEvent_t done[IN_FLIGHT];
    for (int i = 0; i < IN_FLIGHT; i++) CUDA_TRY(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    for (unsigned long long n; start_at > (n = mono_ns());) {
        unsigned long long w = start_at - n;
        struct timespec ts = {(time_t)(w / 1000000000ull), (long)(w % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    unsigned long long m0 = mono_ns();
    double t0 = now_s(), t, tw = 0;
    long launched = 0, launched_w = -1;  // launches when the 0.5 s warm-up ended
    int batch = 0;
    do {
        for (int k = 0; k < 8; k++) burn<<<blocks, 256, 0, s>>>(out, iters);
        launched += 8;
        CUDA_TRY(cudaEventRecord(done[batch % IN_FLIGHT], s));
        if (batch >= IN_FLIGHT - 1) CUDA_TRY(cudaEventSynchronize(done[(batch + 1) % IN_FLIGHT]));
        batch++;
        t = now_s() - t0;
        if (launched_w < 0 && t >= 0.5) launched_w = launched, tw = t;
    } while (t < seconds);
    // After the warm-up, the launch rate is the completion rate within 32 kernels (the queue's depth).
    if (launched_w >= 0 && t > tw)
        printf("metric steady_kernels_per_s=%.1f\nmetric steady_s=%.3f\n", (launched - launched_w) / (t - tw), t - tw);
    unsigned long long m1 = mono_ns();
    CUDA_TRY(cudaStreamSynchronize(s));
    t = now_s() - t0;
    printf("metric pid=%d\nmetric t0_mono_ns=%llu\nmetric t1_mono_ns=%llu\n", (int)getpid(), m0, m1);
    check_err("launches", cudaSuccess, cudaGetLastError());
    double rate = launched / t, busy = launched * one_ms / 1e3 / t;
    printf("metric kernel_ms=%.4f\nmetric kernels=%ld\nmetric wall_s=%.3f\nmetric kernels_per_s=%.1f\n"
           "metric busy_fraction=%.3f\n",
           one_ms, launched, t, rate, busy);
    char obs[64];
    snprintf(obs, sizeof obs, "%.4f ms", one_ms);
    check_bool("kernel_takes_time", ">0 ms", one_ms > 0, obs);
    CUDA_TRY(cudaFree(out));
    return finish("compute_loop");
}

// multi_stream: several non-blocking streams, each with pinned host memory, async copies in both directions and
// kernels, ordered by events across streams. Checks every stream's round trip, cross-stream event waits and
// stream queries.
#include "common.h"

__global__ void scale(float *x, int n, float f) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

int main() {
    print_header("multi_stream");
    const int nstreams = 4, n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    cudaStream_t s[nstreams];
    cudaEvent_t done[nstreams];
    float *h_in[nstreams], *h_out[nstreams], *d[nstreams];
    for (int i = 0; i < nstreams; i++) {
        CUDA_TRY(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        CUDA_TRY(cudaEventCreateWithFlags(&done[i], cudaEventDefault));
        CUDA_TRY(cudaMallocHost(&h_in[i], bytes));
        CUDA_TRY(cudaMallocHost(&h_out[i], bytes));
        CUDA_TRY(cudaMalloc(&d[i], bytes));
        // Finite floats: a kernel may rewrite a NaN's payload (x * 1.0f gives the canonical NaN on a GPU), so
        // random bytes would not survive the round trip.
        for (int k = 0; k < n; k++) h_in[i][k] = (float)((k * 7 + i) % 4096) * 0.25f;
        memset(h_out[i], 0, bytes);
    }
    int lo = 0, hi = 0;
    CUDA_TRY(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    printf("stream priorities: least %d greatest %d\n", lo, hi);

    double t0 = now_s();
    for (int i = 0; i < nstreams; i++) {
        CUDA_TRY(cudaMemcpyAsync(d[i], h_in[i], bytes, cudaMemcpyHostToDevice, s[i]));
        for (int k = 0; k < 8; k++) scale<<<(n + 255) / 256, 256, 0, s[i]>>>(d[i], n, 1.0f);
        CUDA_TRY(cudaEventRecord(done[i], s[i]));
    }
    check_err("launches", cudaSuccess, cudaGetLastError());
    // Stream 0 waits for every other stream before copying back.
    for (int i = 1; i < nstreams; i++) CUDA_TRY(cudaStreamWaitEvent(s[0], done[i], 0));
    for (int i = 0; i < nstreams; i++) CUDA_TRY(cudaMemcpyAsync(h_out[i], d[i], bytes, cudaMemcpyDeviceToHost, s[0]));
    CUDA_TRY(cudaStreamSynchronize(s[0]));
    double wall = now_s() - t0;
    printf("metric wall_ms=%.3f\n", wall * 1e3);

    int equal = 0;
    char obs[64];
    for (int i = 0; i < nstreams; i++) {
        if (memcmp(h_in[i], h_out[i], bytes) == 0) {
            equal++;
            continue;
        }
        size_t k = 0;
        while (k < bytes && ((unsigned char *)h_in[i])[k] == ((unsigned char *)h_out[i])[k]) k++;
        printf("stream %d: first difference at byte %zu of %zu\n", i, k, bytes);
    }
    snprintf(obs, sizeof obs, "%d of %d", equal, nstreams);
    check_bool("round_trips", "4 of 4", equal == nstreams, obs);
    for (int i = 0; i < nstreams; i++) {
        cudaError_t q = cudaStreamQuery(s[i]);
        if (i == 0) check_err("stream_query_after_sync", cudaSuccess, q);
        check_err("event_query_after_sync", cudaSuccess, cudaEventQuery(done[i]));
    }
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, done[0], done[nstreams - 1]));
    printf("metric event_gap_ms=%.4f\n", ms);
    CUDA_TRY(cudaDeviceSynchronize());
    for (int i = 0; i < nstreams; i++) {
        CUDA_TRY(cudaStreamDestroy(s[i]));
        CUDA_TRY(cudaEventDestroy(done[i]));
        CUDA_TRY(cudaFreeHost(h_in[i]));
        CUDA_TRY(cudaFreeHost(h_out[i]));
        CUDA_TRY(cudaFree(d[i]));
    }
    return finish("multi_stream");
}

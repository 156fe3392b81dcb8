// vector_add: the basic path of every CUDA program. Allocates, copies host->device->host (checked byte for
// byte), launches a kernel, synchronises, times it with events and queries memory before/after.
#include "common.h"

__global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main() {
    print_header("vector_add");
    int count = 0;
    CUDA_TRY(cudaGetDeviceCount(&count));
    check_bool("device_count", ">=1", count >= 1, count >= 1 ? "yes" : "0");
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, %d SMs, cc %d.%d, %llu bytes\n", prop.name, prop.multiProcessorCount, prop.major,
           prop.minor, (unsigned long long)prop.totalGlobalMem);

    size_t free0 = 0, total = 0;
    CUDA_TRY(cudaMemGetInfo(&free0, &total));
    printf("metric mem_total=%zu\nmetric mem_free_start=%zu\n", total, free0);
    check_bool("mem_free_le_total", "free<=total", free0 <= total, free0 <= total ? "free<=total" : "free>total");

    const int n = 1 << 22;
    const size_t bytes = n * sizeof(float);
    float *ha = (float *)malloc(bytes), *hb = (float *)malloc(bytes), *hc = (float *)malloc(bytes),
          *back = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) {
        ha[i] = (float)i;
        hb[i] = 2.0f * i;
    }
    float *da, *db, *dc;
    CUDA_TRY(cudaMalloc(&da, bytes));
    CUDA_TRY(cudaMalloc(&db, bytes));
    CUDA_TRY(cudaMalloc(&dc, bytes));
    size_t free1 = 0;
    CUDA_TRY(cudaMemGetInfo(&free1, &total));
    char obs[64];
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free0 - free1));
    check_bool("mem_free_drops_by_allocations", ">=50331648", free0 >= free1 && free0 - free1 >= 3 * bytes, obs);

    CUDA_TRY(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice));

    cudaEvent_t start, stop;
    CUDA_TRY(cudaEventCreate(&start));
    CUDA_TRY(cudaEventCreate(&stop));
    CUDA_TRY(cudaEventRecord(start));
    vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    check_err("launch", cudaSuccess, cudaGetLastError());
    CUDA_TRY(cudaEventRecord(stop));
    CUDA_TRY(cudaDeviceSynchronize());
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    snprintf(obs, sizeof obs, "%.4f ms", ms);
    check_bool("kernel_takes_time", ">0 ms", ms > 0, obs);

    CUDA_TRY(cudaMemcpy(back, da, bytes, cudaMemcpyDeviceToHost));
    check_bool("h2d_d2h_round_trip", "equal", memcmp(back, ha, bytes) == 0,
               memcmp(back, ha, bytes) == 0 ? "equal" : "different");
    if (results_checked()) {
        CUDA_TRY(cudaMemcpy(hc, dc, bytes, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += hc[i] != 3.0f * i;
        snprintf(obs, sizeof obs, "%d wrong", bad);
        check_bool("kernel_result", "0 wrong", bad == 0, obs);
    } else {
        printf("note: kernel results not checked (simulated device)\n");
    }

    // Device-to-device copy, then back to the host: b's pattern must survive both hops.
    CUDA_TRY(cudaMemcpy(dc, db, bytes, cudaMemcpyDeviceToDevice));
    CUDA_TRY(cudaMemcpy(back, dc, bytes, cudaMemcpyDeviceToHost));
    check_bool("d2d_round_trip", "equal", memcmp(back, hb, bytes) == 0,
               memcmp(back, hb, bytes) == 0 ? "equal" : "different");

    CUDA_TRY(cudaFree(da));
    CUDA_TRY(cudaFree(db));
    CUDA_TRY(cudaFree(dc));
    size_t free2 = 0;
    CUDA_TRY(cudaMemGetInfo(&free2, &total));
    // Lazily loaded modules (CUDA_MODULE_LOADING=LAZY, the default) may be charged by the first launch, after
    // free1 was taken: allow 16 MiB for them.
    snprintf(obs, sizeof obs, "%zd", (ssize_t)(free2 - free1));
    check_bool("mem_free_recovers_after_free", ">=50331648-16MiB", free2 + (16 << 20) >= free1 + 3 * bytes, obs);
    printf("metric mem_free_end=%zu\n", free2);
    free(ha), free(hb), free(hc), free(back);
    return finish("vector_add");
}

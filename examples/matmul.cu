// matmul: a tiled single-precision matrix multiply (shared memory, 2-D grid). Checks the copies on every
// device and C = A x B (against a host computation on a sample of entries) on a real GPU.
#include "common.h"

#define TILE 16

__global__ void matmul(const float *A, const float *B, float *C, int n) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? A[row * n + t + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? B[(t + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) C[row * n + col] = acc;
}

int main() {
    print_header("matmul");
    const int n = 1024;
    const size_t bytes = (size_t)n * n * sizeof(float);
    float *hA = (float *)malloc(bytes), *hB = (float *)malloc(bytes), *hC = (float *)malloc(bytes);
    for (int i = 0; i < n * n; i++) {
        hA[i] = (float)((i * 7) % 13) / 13.0f;
        hB[i] = (float)((i * 5) % 11) / 11.0f;
    }
    float *dA, *dB, *dC;
    CUDA_TRY(cudaMalloc(&dA, bytes));
    CUDA_TRY(cudaMalloc(&dB, bytes));
    CUDA_TRY(cudaMalloc(&dC, bytes));
    CUDA_TRY(cudaMemcpy(dA, hA, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(dB, hB, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemset(dC, 0, bytes));

    dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    cudaEvent_t start, stop;
    CUDA_TRY(cudaEventCreate(&start));
    CUDA_TRY(cudaEventCreate(&stop));
    const int reps = 10;
    CUDA_TRY(cudaEventRecord(start));
    for (int r = 0; r < reps; r++) matmul<<<grid, block>>>(dA, dB, dC, n);
    check_err("launch", cudaSuccess, cudaGetLastError());
    CUDA_TRY(cudaEventRecord(stop));
    CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    char obs[64];
    snprintf(obs, sizeof obs, "%.4f ms", ms);
    check_bool("kernels_take_time", ">0 ms", ms > 0, obs);
    printf("metric matmul_ms_per_kernel=%.4f\n", ms / reps);

    CUDA_TRY(cudaMemcpy(hC, dA, bytes, cudaMemcpyDeviceToHost));
    check_bool("round_trip_A", "equal", memcmp(hC, hA, bytes) == 0, memcmp(hC, hA, bytes) == 0 ? "equal" : "different");
    if (results_checked()) {
        CUDA_TRY(cudaMemcpy(hC, dC, bytes, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int s = 0; s < 64; s++) {
            int i = (s * 131) % n, j = (s * 197) % n;
            double ref = 0;
            for (int k = 0; k < n; k++) ref += (double)hA[i * n + k] * hB[k * n + j];
            if (fabs(ref - hC[i * n + j]) > 1e-3 * (1 + fabs(ref))) bad++;
        }
        snprintf(obs, sizeof obs, "%d of 64 wrong", bad);
        check_bool("matmul_result", "0 of 64 wrong", bad == 0, obs);
    } else {
        printf("note: kernel results not checked (simulated device)\n");
    }
    CUDA_TRY(cudaFree(dA));
    CUDA_TRY(cudaFree(dB));
    CUDA_TRY(cudaFree(dC));
    free(hA), free(hB), free(hC);
    return finish("matmul");
}

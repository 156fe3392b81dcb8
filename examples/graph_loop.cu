// graph_loop: capture a stream (copy in, kernels, copy out) into a CUDA graph, instantiate it and launch it in a
// loop; also build a small graph explicitly with a kernel node. Checks the copies made by the graph and the
// graph's execution time.
#include "common.h"

__global__ void step(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}

int main() {
    print_header("graph_loop");
    const int n = 1 << 20, iters = 200;
    const size_t bytes = n * sizeof(float);
    float *h_in, *h_out, *d;
    CUDA_TRY(cudaMallocHost(&h_in, bytes));
    CUDA_TRY(cudaMallocHost(&h_out, bytes));
    CUDA_TRY(cudaMalloc(&d, bytes));
    fill_pattern((unsigned char *)h_in, bytes, 7);
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // 1. Stream capture.
    cudaGraph_t g;
    CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_TRY(cudaMemcpyAsync(d, h_in, bytes, cudaMemcpyHostToDevice, s));
    step<<<(n + 255) / 256, 256, 0, s>>>(d, n);
    step<<<(n + 255) / 256, 256, 0, s>>>(d, n);
    CUDA_TRY(cudaMemcpyAsync(h_out, d, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_TRY(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CUDA_TRY(cudaGraphGetNodes(g, NULL, &nodes));
    check_ull("captured_nodes", 4, nodes);
    cudaGraphExec_t exec;
    CUDA_TRY(cudaGraphInstantiate(&exec, g, 0));

    cudaEvent_t a, b;
    CUDA_TRY(cudaEventCreate(&a));
    CUDA_TRY(cudaEventCreate(&b));
    double t0 = now_s();
    CUDA_TRY(cudaEventRecord(a, s));
    for (int i = 0; i < iters; i++) CUDA_TRY(cudaGraphLaunch(exec, s));
    CUDA_TRY(cudaEventRecord(b, s));
    CUDA_TRY(cudaStreamSynchronize(s));
    double wall = now_s() - t0;
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    printf("metric graph_launches_per_s=%.1f\nmetric graph_gpu_ms=%.3f\n", iters / wall, ms);
    char obs[64];
    snprintf(obs, sizeof obs, "%.4f ms", ms);
    check_bool("graph_launches_take_time", ">0 ms", ms > 0, obs);
    if (results_checked()) {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            float v = h_in[i] * 0.5f + 1.0f;
            v = v * 0.5f + 1.0f;
            bad += !(h_out[i] == v || (h_out[i] != h_out[i] && v != v));
        }
        snprintf(obs, sizeof obs, "%d wrong", bad);
        check_bool("graph_result", "0 wrong", bad == 0, obs);
    } else {
        // Kernels do not compute on the simulator: the graph's copy-in/copy-out is a round trip.
        check_bool("graph_round_trip", "equal", memcmp(h_in, h_out, bytes) == 0,
                   memcmp(h_in, h_out, bytes) == 0 ? "equal" : "different");
    }

    // 2. An explicitly built graph: one kernel node.
    cudaGraph_t g2;
    CUDA_TRY(cudaGraphCreate(&g2, 0));
    cudaKernelNodeParams kp;
    memset(&kp, 0, sizeof kp);
    int nn = n;
    void *args[] = {&d, &nn};
    kp.func = (void *)step;
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    cudaGraphNode_t node;
    CUDA_TRY(cudaGraphAddKernelNode(&node, g2, NULL, 0, &kp));
    cudaGraphExec_t exec2;
    CUDA_TRY(cudaGraphInstantiate(&exec2, g2, 0));
    for (int i = 0; i < 10; i++) CUDA_TRY(cudaGraphLaunch(exec2, s));
    CUDA_TRY(cudaStreamSynchronize(s));
    check_err("explicit_graph", cudaSuccess, cudaGetLastError());

    CUDA_TRY(cudaGraphExecDestroy(exec));
    CUDA_TRY(cudaGraphExecDestroy(exec2));
    CUDA_TRY(cudaGraphDestroy(g));
    CUDA_TRY(cudaGraphDestroy(g2));
    CUDA_TRY(cudaStreamDestroy(s));
    CUDA_TRY(cudaFree(d));
    CUDA_TRY(cudaFreeHost(h_in));
    CUDA_TRY(cudaFreeHost(h_out));
    return finish("graph_loop");
}

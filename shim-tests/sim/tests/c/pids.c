/* pids: the pid NVML knows this process by. Creates a context and allocates 1 MiB on device 0, prints
 * ctx= and alloc= (CUresult), procs= (the pids NVML lists on device 0), ready=1, then waits for a line or EOF
 * on stdin, so the caller can look the pid up while the process lives. */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>

int main(void) {
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGet(&dev, 0);
    if (r == CUDA_SUCCESS)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(ctx);
    printf("ctx=%d\n", (int)r);
    CUdeviceptr p = 0;
    printf("alloc=%d\n", r == CUDA_SUCCESS ? (int)cuMemAlloc(&p, 1 << 20) : (int)r);
    nvmlDevice_t h;
    nvmlProcessInfo_t info[16];
    unsigned int n = 16;
    printf("procs=");
    if (nvmlInit() == NVML_SUCCESS && nvmlDeviceGetHandleByIndex(0, &h) == NVML_SUCCESS &&
        nvmlDeviceGetComputeRunningProcesses(h, &n, info) == NVML_SUCCESS)
        for (unsigned int k = 0; k < n; k++)
            printf("%s%u", k ? "," : "", info[k].pid);
    printf("\nready=1\n");
    fflush(stdout);
    (void)getchar();
    return 0;
}

/* Interprocess memory on the simulator, between two processes of one state file: cuIpcGetMemHandle on
 * cuMemAlloc memory, cuIpcOpenMemHandle in another process (same bytes, a reference per open), the exporter's
 * cuMemFree before the importer closes (the memory stays, charged to the exporter, until the last close), and
 * the errors cuda.h documents; and an interprocess event (cuIpcGetEventHandle / cuIpcOpenEventHandle). Device 0 has 1 GiB and a 64 MiB context. Run by tests/smoke.rs; prints "OK". */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define SIZE (64 * MB)

static size_t used(void) {
    size_t f = 0, t = 0;
    CU(cuMemGetInfo(&f, &t));
    return t - f;
}

/* NVML's per-process figure for `pid` on device 0 (0 when not listed). */
static unsigned long long nvml_used(unsigned pid) {
    nvmlDevice_t d;
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
    nvmlProcessInfo_t p[64];
    unsigned n = 64;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p) == NVML_SUCCESS);
    for (unsigned i = 0; i < n; i++)
        if (p[i].pid == pid) return p[i].usedGpuMemory;
    return 0;
}

static void step(int fd, char c) { CHECK(write(fd, &c, 1) == 1); }
static char wait_for(int fd) {
    char c = 0;
    CHECK(read(fd, &c, 1) == 1);
    return c;
}

static void setup(CUcontext *ctx) {
    CUdevice dev;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(ctx, dev));
    CU(cuCtxSetCurrent(*ctx));
}

static int importer(int in, int out) {
    CUcontext ctx;
    setup(&ctx);
    step(out, 's');
    CUipcMemHandle h;
    CHECK(read(in, &h, sizeof h) == sizeof h);
    CUipcEventHandle eh;
    CHECK(read(in, &eh, sizeof eh) == sizeof eh);
    CUevent ev = NULL;
    CU(cuIpcOpenEventHandle(&ev, eh));
    CU(cuEventSynchronize(ev)); /* recorded by the exporter: done */
    CU(cuEventQuery(ev));
    CU(cuStreamWaitEvent(NULL, ev, 0));
    CU(cuEventRecord(ev, NULL)); /* an importer may record it too */
    CU(cuEventDestroy(ev));
    CUdeviceptr p = 0, q = 0;
    CU(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CU(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(p != 0 && q == p);
    CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
    unsigned char buf[4] = {0};
    CU(cuMemcpyDtoH(buf, p + SIZE - 4, 4));
    CHECK(buf[0] == 0x5a && buf[3] == 0x5a);
    CU(cuMemsetD8(p, 0xa5, 4)); /* the exporter reads this */
    CU(cuCtxSynchronize());
    step(out, 'o');
    CHECK(wait_for(in) == 'f'); /* the exporter freed */
    CU(cuMemcpyDtoH(buf, p + SIZE - 4, 4));
    CHECK(buf[0] == 0x5a);
    CU(cuIpcCloseMemHandle(p)); /* one reference left */
    CU(cuMemcpyDtoH(buf, p, 4));
    CHECK(buf[0] == 0xa5);
    step(out, '1');
    CHECK(wait_for(in) == 'c');
    CU(cuIpcCloseMemHandle(p));
    CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
    /* gone for good: opening it again fails */
    CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_HANDLE);
    step(out, 'c');
    CU(cuDevicePrimaryCtxRelease(0));
    return failures ? 1 : 0;
}

int main(void) {
    int down[2], up[2];
    CHECK(pipe(down) == 0 && pipe(up) == 0);
    pid_t child = fork();
    if (child == 0) {
        close(down[1]);
        close(up[0]);
        return importer(down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CUcontext ctx;
    setup(&ctx);
    unsigned me = (unsigned)getpid();
    CUdeviceptr p;
    CU(cuMemAlloc(&p, SIZE));
    CU(cuMemsetD8(p, 0x5a, SIZE));
    CUipcMemHandle h, h2;
    CHECK(cuIpcGetMemHandle(&h, p + 4096) == CUDA_ERROR_INVALID_VALUE);
    CU(cuIpcGetMemHandle(&h, p));
    CU(cuIpcGetMemHandle(&h2, p));
    CHECK(memcmp(&h, &h2, sizeof h) == 0);
    CUdeviceptr self;
    CHECK(cuIpcOpenMemHandle(&self, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
    unsigned char buf[4] = {0};
    CU(cuMemcpyDtoH(buf, p + 8, 4)); /* the exporter's pointer still works after the export */
    CHECK(buf[0] == 0x5a);
    CHECK(wait_for(up[0]) == 's'); /* the importer's context exists: `base` includes it */
    size_t base = used();
    unsigned long long mine = nvml_used(me);
    CHECK(mine >= SIZE);
    CUevent plain, ev;
    CUipcEventHandle eh;
    CU(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
    CHECK(cuIpcGetEventHandle(&eh, plain) == CUDA_ERROR_INVALID_VALUE); /* not CU_EVENT_INTERPROCESS */
    CU(cuEventDestroy(plain));
    CU(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    CU(cuEventRecord(ev, NULL));
    CU(cuIpcGetEventHandle(&eh, ev));
    CUevent self_ev;
    CHECK(cuIpcOpenEventHandle(&self_ev, eh) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(write(down[1], &h, sizeof h) == sizeof h);
    CHECK(write(down[1], &eh, sizeof eh) == sizeof eh);
    CHECK(wait_for(up[0]) == 'o');
    CHECK(used() == base); /* an importer adds nothing */
    CU(cuMemcpyDtoH(buf, p, 4));
    CHECK(buf[0] == 0xa5); /* the importer's write */
    CU(cuMemFree(p));
    CHECK(used() == base);          /* still held by the importer */
    CHECK(nvml_used(me) == mine);   /* and charged to the exporter */
    step(down[1], 'f');
    CHECK(wait_for(up[0]) == '1');
    CHECK(used() == base);
    step(down[1], 'c');
    CHECK(wait_for(up[0]) == 'c');
    CHECK(used() <= base - SIZE); /* the last close returned it (the importer may be exiting too) */
    CHECK(nvml_used(me) == mine - SIZE);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CU(cuDevicePrimaryCtxRelease(0));
    if (failures) return 1;
    printf("OK\n");
    return 0;
}

/* first_use_wait: a first launch blocked on the program's own progress must not hold anything another thread
 * needs (issue 35, item 4).
 *
 *   first_use_wait wait     a stream waits for a flag (cuStreamWaitValue32) and is filled with launches of `a`
 *                           (the queue holds 1024); the main thread's first launch of `b` onto it then blocks in
 *                           the driver until the flag is written. Another thread, once the main thread is in that
 *                           launch, makes its own first use (cuModuleGetFunction of `c`) and then writes the flag
 *                           (cuStreamWriteValue32 on its own stream). Prints lookup=, launch=, done=1.
 *   first_use_wait nowait   the same with the flag written before the stream waits (the control: nothing blocks).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_wait"
#include "cq_fill.h"

static CUcontext g_ctx;
static CUmodule g_mod;
static CUdeviceptr g_flag;
static volatile int g_entering;
static CUresult g_lookup = CUDA_ERROR_UNKNOWN, g_write = CUDA_ERROR_UNKNOWN;

static void *other(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx);
    while (!g_entering) usleep(1000);
    usleep(300 * 1000); /* ordering only: the main thread is inside its blocked launch by now */
    CUfunction c;
    g_lookup = cuModuleGetFunction(&c, g_mod, "c");
    CUstream s;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) g_write = cuStreamWriteValue32(s, g_flag, 1, 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: first_use_wait wait|nowait\n");
        return 2;
    }
    int wait = strcmp(argv[1], "wait") == 0;
    CUdevice d0;
    g_ctx = primary0(&d0);
    CK(cuModuleLoadData(&g_mod, "CUDASIM-MODULE 1\nkernel a 1000\nkernel b 1000\nkernel c 1000\n"));
    CUfunction a, b;
    CK(cuModuleGetFunction(&a, g_mod, "a"));
    CK(cuModuleGetFunction(&b, g_mod, "b"));
    CK(cuMemAlloc(&g_flag, 4));
    CK(cuMemsetD32(g_flag, wait ? 0 : 1, 1));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamWaitValue32(s, g_flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    for (int i = 0; i < 1024; i++) CK(cuLaunchKernel(a, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    pthread_t t;
    pthread_create(&t, NULL, other, NULL);
    g_entering = 1;
    CUresult r = cuLaunchKernel(b, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    pthread_join(t, NULL);
    printf("launch=%s\nlookup=%s\nwrite=%s\n", cq_err(r), cq_err(g_lookup), cq_err(g_write));
    CK(cuStreamSynchronize(s));
    printf("done=1\n");
    return 0;
}

/* throttle_debt.c: launches whose device time a sampled measurement could drop, flat out for a while, so a test
 * can check on the simulator's timeline that libcuquota.so charges all of it (issue 21, item 5).
 *
 *   throttle_debt MODE SECONDS KERNEL_NS [ITER]
 *
 * MODE  ctxkill: each round creates a context, launches one kernel of KERNEL_NS and destroys the context while
 *                the kernel runs (the driver finishes the kernel first), so the launch's measurement fails;
 *       reset:   the same with the primary context, reset (cuDevicePrimaryCtxReset) while the kernel runs;
 *       long:    one kernel of KERNEL_NS after another on the primary context (kernels longer than a measurement
 *                used to be waited for);
 *       while:   a graph whose conditional WHILE node runs its body (one kernel of KERNEL_NS) ITER times, the
 *                count set by a kernel before it (the simulator's model of cudaGraphSetConditional: a kernel node
 *                given the handle and the value), launched from the host one after another;
 *       device:  the WHILE graph (count: the handle's default value) instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH (and uploaded) and
 *                launched from the device: the host launches a one-kernel graph whose kernel is given its handle
 *                (the simulator's model of a kernel calling cudaGraphLaunch on it).
 * Kernels are one wave (as many blocks as the device has SMs) of KERNEL_NS.
 *
 * Output (key=value lines): pid, t0_ns and end_ns (CLOCK_MONOTONIC: the launch loop ran from t0 until end, the
 * test reads the share from the simulator's timeline over that window), launches=N. The program exits without
 * waiting for the queued kernels (the timeline keeps them).
 */
#include <cuda.h>
#include "cq_kernel.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>



static char image[128];
static int sms;

static CUfunction load(void) {
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f, m, "k"));
    return f;
}

static CUgraphExec while_graph(CUfunction f, unsigned iter, int device_launch) {
    CUgraph g, body;
    CUgraphConditionalHandle h;
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    CK(cuGraphCreate(&g, 0));
    /* The device graph's count is the handle's default; the host graph's is set by a kernel. */
    CK(cuGraphConditionalHandleCreate(&h, g, ctx, device_launch ? iter : 0,
                                      device_launch ? CU_GRAPH_COND_ASSIGN_DEFAULT : 0));
    CUDA_KERNEL_NODE_PARAMS k;
    memset(&k, 0, sizeof k);
    k.func = f;
    k.gridDimX = (unsigned)sms;
    k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = k.blockDimY = k.blockDimZ = 1;
    CUgraphNode setter;
    if (!device_launch) {
        void *sp[] = {&h, &iter};
        CUDA_KERNEL_NODE_PARAMS sk = k;
        sk.kernelParams = sp;
        CK(cuGraphAddKernelNode(&setter, g, NULL, 0, &sk));
    }
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = CU_GRAPH_COND_TYPE_WHILE;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUgraphNode n;
    CK(cuGraphAddNode(&n, g, device_launch ? NULL : &setter, NULL, device_launch ? 0 : 1, &p));
    body = p.conditional.phGraph_out[0];
    CUgraphNode kn;
    CK(cuGraphAddKernelNode(&kn, body, NULL, 0, &k));
    CUgraphExec e;
    CK(cuGraphInstantiateWithFlags(&e, g, device_launch ? CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH : 0));
    if (device_launch) {
        cuuint64_t flags = 0;
        CK(cuGraphExecGetFlags(e, &flags));
        if (!(flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)) {
            fprintf(stderr, "exec flags %llu\n", (unsigned long long)flags);
            exit(1);
        }
        CK(cuGraphUpload(e, NULL));
        /* The host's graph: one kernel that launches `e` from the device. */
        CUgraph hg;
        CK(cuGraphCreate(&hg, 0));
        void *params[] = {&e};
        k.kernelParams = params;
        CUgraphNode hn;
        CK(cuGraphAddKernelNode(&hn, hg, NULL, 0, &k));
        CUgraphExec he;
        CK(cuGraphInstantiateWithFlags(&he, hg, 0));
        return he;
    }
    return e;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: throttle_debt ctxkill|reset|long|while|device SECONDS KERNEL_NS [ITER]\n");
        return 2;
    }
    const char *mode = argv[1];
    double secs = atof(argv[2]);
    unsigned long long kernel_ns = strtoull(argv[3], NULL, 10);
    unsigned iter = argc > 4 ? (unsigned)strtoul(argv[4], NULL, 10) : 1;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel k %llu\n", kernel_ns);

    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    unsigned long launches = 0;
    if (!strcmp(mode, "ctxkill")) {
        while (now_ns() < until) {
            CUcontext c;
            CK(cuCtxCreate(&c, NULL, 0, dev));
            CUfunction f = load();
            CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            launches++;
            CK(cuCtxDestroy(c));
        }
    } else if (!strcmp(mode, "reset")) {
        while (now_ns() < until) {
            CUcontext c;
            CK(cuDevicePrimaryCtxRetain(&c, dev));
            CK(cuCtxSetCurrent(c));
            CUfunction f = load();
            CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            launches++;
            CK(cuDevicePrimaryCtxReset(dev));
            CK(cuDevicePrimaryCtxRelease(dev));
        }
    } else {
        CUcontext c;
        CK(cuDevicePrimaryCtxRetain(&c, dev));
        CK(cuCtxSetCurrent(c));
        CUfunction f = load();
        if (!strcmp(mode, "long")) {
            while (now_ns() < until) {
                CK(cuLaunchKernel(f, (unsigned)sms, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
                launches++;
            }
        } else if (!strcmp(mode, "while") || !strcmp(mode, "device")) {
            CUgraphExec e = while_graph(f, iter, !strcmp(mode, "device"));
            while (now_ns() < until) {
                CK(cuGraphLaunch(e, NULL));
                launches++;
            }
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            return 2;
        }
    }
    uint64_t end = now_ns();
    printf("pid=%d\nt0_ns=%llu\nend_ns=%llu\nlaunches=%lu\n", (int)getpid(), (unsigned long long)t0,
           (unsigned long long)end, launches);
    fflush(stdout);
    _exit(0);
}

/* graph_stack: a graph whose kernel needs KIND's local memory (big: LOCAL bytes a thread, ~4 GiB of stack for
 * 16384 on the simulator's device; small: none) reaches the driver by one path; the result of the call that
 * makes the stack grow (op=) and the simulator's used bytes after it (used=) are printed, then the fill.
 *
 *   graph_stack PATH KIND LOCAL
 *   PATH  launch          kernel node, instantiated, cuGraphLaunch
 *         launch_ptsz     the same through cuGraphLaunch_ptsz (dlsym)
 *         kernel_set      node made with the small kernel, cuGraphKernelNodeSetParams to KIND's before instantiation
 *         exec_update     exec of a small-kernel graph launched, cuGraphExecUpdate to KIND's graph, launched again
 *         exec_kernel_set exec launched, cuGraphExecKernelNodeSetParams to KIND's kernel, launched again
 *         exec_node_set   the same through cuGraphExecNodeSetParams
 *         exec_update_noctx, exec_kernel_set_noctx, exec_node_set_noctx
 *                         each of those three with no context current during the update (two devices: the
 *                         driver is asked which device is current)
 *         conditional     an IF conditional node (handle default 1) whose body holds KIND's kernel node
 *         conditional_off the same with default 0 (the body does not run this time; its stack is set up anyway)
 *         child           a child graph node (cuGraphAddChildGraphNode) holding KIND's kernel node
 *         child_cond      a child graph node whose graph holds the conditional node (bodies of a clone)
 *         upload          instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH, cuGraphUpload
 *         upload_ptsz     the same through cuGraphUpload_ptsz (dlsym)
 *         instantiate_upload  cuGraphInstantiateWithParams with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD (and DEVICE_LAUNCH):
 *                         uploaded inside the instantiation (op=; flags.kept= the struct's flags after it)
 *         device          that exec uploaded (result: upload=), then launched from the device by a host graph's
 *                         small kernel (op=: the host graph's launch)
 *         hidden_cond     the conditional node made by libcuda's own cuGraphAddNode (no interposer sees it: its
 *                         bodies cannot be listed), instantiated (instantiate=) and launched
 *         hidden_in_clone a child graph node cloned from a small-kernel graph, then that hidden conditional node
 *                         added to the node's own graph (cuGraphChildGraphNodeGetGraph), instantiated and launched
 *         direct          cuLaunchKernel of KIND's kernel
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "graph_stack"
#include "cq_fill.h"

static CUfunction f_small, f_big, f_kind;

static CUDA_KERNEL_NODE_PARAMS params(CUfunction f) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    return p;
}

static CUgraph kernel_graph(CUfunction f, CUgraphNode *node) {
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUDA_KERNEL_NODE_PARAMS p = params(f);
    CUgraphNode n;
    CK(cuGraphAddKernelNode(&n, g, NULL, 0, &p));
    if (node) *node = n;
    return g;
}

static int g_hidden;

/* An IF conditional node in g whose body holds f's kernel node; the handle's default value is `value`. Made by
 * libcuda's own cuGraphAddNode when g_hidden. */
static void add_conditional(CUgraph g, CUcontext ctx, CUfunction f, unsigned value) {
    CUgraphConditionalHandle h;
    CK(cuGraphConditionalHandleCreate(&h, g, ctx, value, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUgraphNode n;
    CUresult (*add)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                    CUgraphNodeParams *) = cuGraphAddNode;
    if (g_hidden) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        add = cuda ? (CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                                  CUgraphNodeParams *))cq_elf_sym(cuda, "cuGraphAddNode_v2")
                   : NULL;
        if (!add) die("libcuda's cuGraphAddNode_v2", CUDA_ERROR_NOT_FOUND);
    }
    CK(add(&n, g, NULL, NULL, 0, &p));
    CUDA_KERNEL_NODE_PARAMS k = params(f);
    CUgraphNode kn;
    CK(cuGraphAddKernelNode(&kn, p.conditional.phGraph_out[0], NULL, 0, &k));
}

static void report(const char *key, CUresult r) {
    printf("%s=%s\n", key, cq_err(r));
    cuCtxSynchronize();
    used(0, "used");
}

/* Instantiates g (`flags`) and launches it: op= is the instantiation's error or the launch's result. */
static void instantiate_launch(CUgraph g, unsigned long long flags) {
    CUgraphExec e;
    CUresult r = cuGraphInstantiateWithFlags(&e, g, flags);
    if (r) {
        printf("instantiate=%s\n", cq_err(r));
    } else {
        r = cuGraphLaunch(e, NULL);
    }
    report("op", r);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: graph_stack PATH small|big LOCAL\n");
        return 2;
    }
    const char *path = argv[1];
    int big = strcmp(argv[2], "big") == 0;
    unsigned long long local = cq_size(argv[3]);
    CUdevice d0;
    CUcontext c0 = primary0(&d0);
    used(0, "used");
    char image[256];
    snprintf(image, sizeof image, "CUDASIM-MODULE 1\nkernel small 1000 0\nkernel big 1000 %llu\n", local);
    CUmodule m;
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f_small, m, "small"));
    CK(cuModuleGetFunction(&f_big, m, "big"));
    f_kind = big ? f_big : f_small;

    if (!strcmp(path, "launch")) {
        instantiate_launch(kernel_graph(f_kind, NULL), 0);
    } else if (!strcmp(path, "launch_ptsz")) {
        CUresult (*launch)(CUgraphExec, CUstream) =
            (CUresult(*)(CUgraphExec, CUstream))dlsym(RTLD_DEFAULT, "cuGraphLaunch_ptsz");
        if (!launch) die("dlsym cuGraphLaunch_ptsz", CUDA_ERROR_NOT_FOUND);
        CUgraphExec e;
        CK(cuGraphInstantiateWithFlags(&e, kernel_graph(f_kind, NULL), 0));
        report("op", launch(e, NULL));
    } else if (!strcmp(path, "kernel_set")) {
        CUgraphNode n;
        CUgraph g = kernel_graph(f_small, &n);
        CUDA_KERNEL_NODE_PARAMS p = params(f_kind);
        CK(cuGraphKernelNodeSetParams(n, &p));
        instantiate_launch(g, 0);
    } else if (!strncmp(path, "exec_update", 11) || !strncmp(path, "exec_kernel_set", 15) ||
               !strncmp(path, "exec_node_set", 13)) {
        int noctx = strstr(path, "_noctx") != NULL;
        CUgraphNode n;
        CUgraphExec e;
        CK(cuGraphInstantiateWithFlags(&e, kernel_graph(f_small, &n), 0));
        report("first", cuGraphLaunch(e, NULL));
        CUgraph kind_graph = kernel_graph(f_kind, NULL);
        if (noctx) CK(cuCtxSetCurrent(NULL));
        CUresult r;
        if (!strncmp(path, "exec_update", 11)) {
            CUgraphExecUpdateResultInfo info;
            memset(&info, 0, sizeof info);
            r = cuGraphExecUpdate(e, kind_graph, &info);
        } else if (!strncmp(path, "exec_kernel_set", 15)) {
            CUDA_KERNEL_NODE_PARAMS p = params(f_kind);
            r = cuGraphExecKernelNodeSetParams(e, n, &p);
        } else {
            CUgraphNodeParams p;
            memset(&p, 0, sizeof p);
            p.type = CU_GRAPH_NODE_TYPE_KERNEL;
            CUDA_KERNEL_NODE_PARAMS k = params(f_kind);
            memcpy(&p.kernel, &k, sizeof k);
            r = cuGraphExecNodeSetParams(e, n, &p);
        }
        if (noctx) CK(cuCtxSetCurrent(c0));
        printf("update=%s\n", cq_err(r));
        report("op", cuGraphLaunch(e, NULL));
    } else if (!strcmp(path, "conditional") || !strcmp(path, "conditional_off") || !strcmp(path, "hidden_cond")) {
        CUgraph g;
        CK(cuGraphCreate(&g, 0));
        g_hidden = !strcmp(path, "hidden_cond");
        add_conditional(g, c0, f_kind, strcmp(path, "conditional_off") ? 1 : 0);
        instantiate_launch(g, 0);
    } else if (!strcmp(path, "child") || !strcmp(path, "child_cond")) {
        CUgraph child;
        if (!strcmp(path, "child")) {
            child = kernel_graph(f_kind, NULL);
        } else {
            CK(cuGraphCreate(&child, 0));
            add_conditional(child, c0, f_kind, 1);
        }
        CUgraph g;
        CK(cuGraphCreate(&g, 0));
        CUgraphNode n;
        CK(cuGraphAddChildGraphNode(&n, g, NULL, 0, child));
        instantiate_launch(g, 0);
    } else if (!strcmp(path, "hidden_in_clone")) {
        CUgraph g, embedded;
        CK(cuGraphCreate(&g, 0));
        CUgraphNode n;
        CK(cuGraphAddChildGraphNode(&n, g, NULL, 0, kernel_graph(f_small, NULL)));
        CK(cuGraphChildGraphNodeGetGraph(n, &embedded));
        g_hidden = 1;
        add_conditional(embedded, c0, f_kind, 1);
        instantiate_launch(g, 0);
    } else if (!strcmp(path, "upload") || !strcmp(path, "upload_ptsz") || !strcmp(path, "device")) {
        CUgraphExec e;
        CK(cuGraphInstantiateWithFlags(&e, kernel_graph(f_kind, NULL), CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH));
        CUresult (*upload)(CUgraphExec, CUstream) = cuGraphUpload;
        if (!strcmp(path, "upload_ptsz")) {
            upload = (CUresult(*)(CUgraphExec, CUstream))dlsym(RTLD_DEFAULT, "cuGraphUpload_ptsz");
            if (!upload) die("dlsym cuGraphUpload_ptsz", CUDA_ERROR_NOT_FOUND);
        }
        CUresult r = upload(e, NULL);
        if (strcmp(path, "device")) {
            report("op", r);
        } else {
            report("upload", r);
            /* The host's graph: one small kernel that launches `e` from the device. */
            CUgraph hg;
            CK(cuGraphCreate(&hg, 0));
            CUDA_KERNEL_NODE_PARAMS k = params(f_small);
            void *kp[] = {&e};
            k.kernelParams = kp;
            CUgraphNode hn;
            CK(cuGraphAddKernelNode(&hn, hg, NULL, 0, &k));
            instantiate_launch(hg, 0);
        }
    } else if (!strcmp(path, "instantiate_upload")) {
        CUDA_GRAPH_INSTANTIATE_PARAMS ip;
        memset(&ip, 0, sizeof ip);
        ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD | CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH;
        CUgraphExec e;
        CUresult r = cuGraphInstantiateWithParams(&e, kernel_graph(f_kind, NULL), &ip);
        printf("flags.kept=%d\nresult_out=%d\n", ip.flags == (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                                                CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH),
               (int)ip.result_out);
        report("op", r);
    } else if (!strcmp(path, "direct")) {
        report("op", cuLaunchKernel(f_kind, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    } else {
        fprintf(stderr, "unknown path %s\n", path);
        return 2;
    }
    fill(64ull << 20);
    return 0;
}

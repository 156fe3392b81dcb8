/* graph_mem_probe: CUDA graph memory nodes under a memory cap. Prints key=value lines.
 *   explicit: two graphs, each with a 600 MiB alloc node not freed in the graph; launches A then B.
 *   captured: a captured cuMemAllocAsync/cuMemFreeAsync of 600 MiB, launched 10 times, then destroyed + trimmed.
 *   child:    a child graph with a 1536 MiB alloc node moved into a parent graph's node (cuGraphAddNode,
 *             CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE); the parent is instantiated and launched.
 *   update:   a graph with a 64 MiB alloc node instantiated, then updated (cuGraphExecUpdate) from a graph of
 *             the same shape whose alloc node asks 1536 MiB, and launched.
 *   small:    as update without the update (the control: 64 MiB launched).
 * `reserved` / `used` are the driver's own CU_GRAPH_MEM_ATTR_*_MEM_CURRENT (not rewritten by the shim);
 * `sim.used` the simulator's own used bytes on device 0 (its NVML, past any interposer). */
#include "cq_driver.h"

#define MB (1024ull * 1024ull)

static unsigned long long gattr(CUgraphMem_attribute a) {
    cuuint64_t v = 0;
    cuDeviceGetGraphMemAttribute(0, a, &v);
    return v;
}

static unsigned long long free_mem(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}

static void state(const char *tag) {
    printf("%s.reserved=%llu\n%s.used=%llu\n%s.free=%llu\n", tag, gattr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), tag,
           gattr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), tag, free_mem());
    cq_rawmem m;
    if (cq_raw_nvml_mem(0, &m) == 0) printf("used=%llu\n", m.used);
}

/* A graph with one alloc node of `bytes` on device 0, not freed in the graph. */
static CUgraph alloc_node_graph(size_t bytes) {
    CUgraph g;
    cuGraphCreate(&g, 0);
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CUgraphNode n;
    printf("add_node=%d\n", (int)cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    return g;
}

static CUgraphExec alloc_graph(size_t bytes) {
    CUgraph g;
    cuGraphCreate(&g, 0);
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CUgraphNode n;
    printf("add_node=%d\n", (int)cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    CUgraphExec e = NULL;
    printf("instantiate=%d\n", (int)cuGraphInstantiate(&e, g, 0));
    return e;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "explicit";
    CUdevice dev;
    CUcontext ctx;
    printf("init=%d\n", (int)cuInit(0));
    cuDeviceGet(&dev, 0);
    printf("ctx=%d\n", (int)cuDevicePrimaryCtxRetain(&ctx, dev));
    cuCtxSetCurrent(ctx);
    state("start");
    if (strcmp(mode, "explicit") == 0) {
        CUgraphExec a = alloc_graph(600 * MB), b = alloc_graph(600 * MB);
        state("built");
        printf("launch_a=%d\n", (int)cuGraphLaunch(a, 0));
        state("after_a");
        printf("launch_b=%d\n", (int)cuGraphLaunch(b, 0));
        state("after_b");
    } else if (strcmp(mode, "child") == 0) {
        CUgraph child = alloc_node_graph(1536 * MB), parent;
        cuGraphCreate(&parent, 0);
        CUgraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_GRAPH;
        np.graph.graph = child;
        np.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
        CUgraphNode n;
        printf("child_add=%d\n", (int)cuGraphAddNode(&n, parent, NULL, NULL, 0, &np));
        CUgraphExec e = NULL;
        printf("instantiate=%d\n", (int)cuGraphInstantiate(&e, parent, 0));
        state("built");
        printf("launch=%d\n", (int)cuGraphLaunch(e, 0));
        cuStreamSynchronize(0);
        state("launched");
    } else if (strcmp(mode, "update") == 0 || strcmp(mode, "small") == 0) {
        CUgraph g = alloc_node_graph(64 * MB);
        CUgraphExec e = NULL;
        printf("instantiate=%d\n", (int)cuGraphInstantiate(&e, g, 0));
        if (strcmp(mode, "update") == 0) {
            CUgraph big = alloc_node_graph(1536 * MB);
            CUgraphExecUpdateResultInfo info;
            memset(&info, 0, sizeof info);
            printf("update=%d\nupdate.result=%d\n", (int)cuGraphExecUpdate(e, big, &info), (int)info.result);
        }
        state("built");
        printf("launch=%d\n", (int)cuGraphLaunch(e, 0));
        cuStreamSynchronize(0);
        state("launched");
    } else {
        CUstream s;
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        CUgraph g;
        CUdeviceptr p = 0;
        cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        printf("alloc_async=%d\n", (int)cuMemAllocAsync(&p, 600 * MB, s));
        printf("free_async=%d\n", (int)cuMemFreeAsync(p, s));
        printf("end_capture=%d\n", (int)cuStreamEndCapture(s, &g));
        CUgraphExec e = NULL;
        printf("instantiate=%d\n", (int)cuGraphInstantiate(&e, g, 0));
        state("built");
        int ok = 0;
        for (int i = 0; i < 10; i++) ok += cuGraphLaunch(e, s) == CUDA_SUCCESS;
        cuStreamSynchronize(s);
        printf("launches_ok=%d\n", ok);
        state("looped");
        printf("exec_destroy=%d\n", (int)cuGraphExecDestroy(e));
        cuGraphDestroy(g);
        printf("trim=%d\n", (int)cuDeviceGraphMemTrim(dev));
        state("trimmed");
    }
    printf("done=1\n");
    fflush(stdout);
    return 0;
}

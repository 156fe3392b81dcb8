/* Graph memory nodes on the simulator: alloc/free nodes, captured stream-ordered allocations, the per-device
 * graph pool (reserved at launch, reused, trimmed, released with its exec) and its attributes. Device 0 has 1 GiB
 * and a 64 MiB context. Run by tests/smoke.rs; prints "OK" on success. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include "check.h"


static cuuint64_t attr(CUgraphMem_attribute a) {
    cuuint64_t v = ~0ull;
    CU(cuDeviceGetGraphMemAttribute(0, a, &v));
    return v;
}

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    CU(cuMemGetInfo(&f, &t));
    return f;
}

/* A graph with one alloc node of `bytes` (not freed in the graph); returns the exec and the address. */
static CUgraphExec alloc_graph(size_t bytes, CUdeviceptr *ptr, CUgraph *graph) {
    CUgraph g;
    CU(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CUgraphNode n;
    CU(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    CHECK(p.dptr != 0);
    CUgraphNodeType ty;
    CU(cuGraphNodeGetType(n, &ty));
    CHECK(ty == CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    CUDA_MEM_ALLOC_NODE_PARAMS q;
    memset(&q, 0, sizeof q);
    CU(cuGraphMemAllocNodeGetParams(n, &q));
    CHECK(q.bytesize == bytes && q.dptr == p.dptr && q.poolProps.location.id == 0);
    CUgraphExec e;
    CU(cuGraphInstantiateWithFlags(&e, g, 0));
    *ptr = p.dptr;
    *graph = g;
    return e;
}

static void explicit_nodes(void) {
    size_t before = free_mem();
    CUdeviceptr a, b;
    CUgraph ga, gb;
    CUgraphExec ea = alloc_graph(600 * MB, &a, &ga);
    CHECK(free_mem() == before); /* nothing reserved before a launch */
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    CU(cuGraphLaunch(ea, 0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB);
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 600 * MB);
    CHECK(free_mem() == before - 600 * MB);
    CU(cuMemsetD8(a, 7, 600 * MB)); /* the memory is usable after the launch */
    /* Launching again while its allocation is live is an error. */
    CHECK(cuGraphLaunch(ea, 0) == CUDA_ERROR_INVALID_VALUE);
    /* A second graph needing another 600 MiB does not fit next to the first: nothing changes. */
    CUgraphExec eb = alloc_graph(600 * MB, &b, &gb);
    CHECK(a != b);
    CHECK(cuGraphLaunch(eb, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB);
    CHECK(free_mem() == before - 600 * MB);
    /* Freed (here by cuMemFreeAsync), the memory stays reserved and serves the second graph. */
    CU(cuMemFreeAsync(a, 0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0);
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB);
    CU(cuGraphLaunch(eb, 0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB);
    /* A free node in another graph frees it. */
    CUgraph gf;
    CUgraphNode fn;
    CU(cuGraphCreate(&gf, 0));
    CU(cuGraphAddMemFreeNode(&fn, gf, NULL, 0, b));
    CUdeviceptr got = 0;
    CU(cuGraphMemFreeNodeGetParams(fn, &got));
    CHECK(got == b);
    CUgraphExec ef;
    CU(cuGraphInstantiateWithFlags(&ef, gf, 0));
    CU(cuGraphLaunch(ef, 0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0);
    CHECK(cuGraphLaunch(ef, 0) == CUDA_ERROR_INVALID_VALUE); /* not live any more */
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == 600 * MB);
    cuuint64_t zero = 0;
    CU(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == 0);
    /* Trim returns the unused reservation to the device. */
    CU(cuDeviceGraphMemTrim(0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) == 600 * MB);
    CHECK(free_mem() == before);
    CU(cuGraphExecDestroy(ea));
    CU(cuGraphExecDestroy(eb));
    CU(cuGraphExecDestroy(ef));
    CU(cuGraphDestroy(ga));
    CU(cuGraphDestroy(gb));
    CU(cuGraphDestroy(gf));
}

static void captured(void) {
    size_t before = free_mem();
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUgraph g;
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr p = 0;
    CU(cuMemAllocAsync(&p, 600 * MB, s));
    CHECK(p != 0);
    CU(cuMemFreeAsync(p, s));
    CU(cuStreamEndCapture(s, &g));
    CHECK(free_mem() == before);
    size_t n = 0;
    CU(cuGraphGetNodes(g, NULL, &n));
    CHECK(n == 2);
    CUgraphNode nodes[2];
    CU(cuGraphGetNodes(g, nodes, &n));
    CUgraphNodeType t0, t1;
    CU(cuGraphNodeGetType(nodes[0], &t0));
    CU(cuGraphNodeGetType(nodes[1], &t1));
    CHECK(t0 == CU_GRAPH_NODE_TYPE_MEM_ALLOC && t1 == CU_GRAPH_NODE_TYPE_MEM_FREE);
    CUgraphExec e;
    CU(cuGraphInstantiateWithFlags(&e, g, 0));
    for (int i = 0; i < 5; i++) CU(cuGraphLaunch(e, s));
    CU(cuStreamSynchronize(s));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB); /* reserved once, reused */
    CHECK(attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0);
    CHECK(free_mem() == before - 600 * MB);
    /* Uploading reserves nothing more. */
    CU(cuGraphUpload(e, s));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 600 * MB);
    /* Destroying the exec releases what it reserved. */
    CU(cuGraphExecDestroy(e));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK(free_mem() == before);
    CU(cuGraphDestroy(g));
    /* Upload of a fresh exec reserves. */
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU(cuMemAllocAsync(&p, 100 * MB, s));
    CU(cuMemFreeAsync(p, s));
    CU(cuStreamEndCapture(s, &g));
    CU(cuGraphInstantiateWithFlags(&e, g, 0));
    CU(cuGraphUpload(e, s));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 100 * MB);
    CU(cuGraphDestroy(g)); /* the exec keeps the address */
    CU(cuGraphLaunch(e, s));
    CU(cuGraphExecDestroy(e));
    CU(cuDeviceGraphMemTrim(0));
    CHECK(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK(free_mem() == before);
    CU(cuStreamDestroy(s));
}

int main(void) {
    CU(cuInit(0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    explicit_nodes();
    captured();
    if (failures == 0) printf("OK\n");
    return failures != 0;
}

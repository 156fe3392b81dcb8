/* vmm_bindings: VMM memory held by bindings (sparse arrays, multicast objects) and graph execs updated to new
 * memory nodes, under a cap. Prints key=value lines; `used=` is the simulator's own used bytes on device 0 (its
 * NVML, read past any interposer), `charged=` what the shim charges the container (cuMemGetInfo total - free).
 *
 *   vmm_bindings MODE
 *     mcrange     two handles bound to one multicast object at offsets 0 (2 MiB) and 2 MiB (768 MiB); one
 *                 cuMulticastUnbind(offset 0, size 770 MiB); both handles released; then cuMemAlloc 768 MiB.
 *     mcexact     as mcrange, the unbind naming only the 2 MiB binding (offset 0, size 2 MiB).
 *     sparsefail  a 768 MiB handle bound to a sparse array's tile by a cuMemMapArrayAsync whose second entry
 *                 is invalid (the call fails after the first entry took effect); handle released; alloc 768 MiB.
 *     sparseok    the same list without the bad entry.
 *     sparsemip   a sparse mipmapped array (1344 MiB if it were dense) then alloc 512 MiB; a 256 MiB handle bound
 *                 to its level 0, released; alloc 768 MiB.
 *     hugecount   cuMemMapArrayAsync of a one-entry list said to hold 2^30 entries.
 *     deepupdate  exec of a graph [65 empty child graphs, 64 MiB alloc node]; cuGraphExecUpdate from a graph of
 *                 the same node-type sequence whose 1536 MiB alloc node sits 65 child graphs deep; launch.
 *     mcrelease   a 512 MiB handle bound to a multicast object, the handle then the object released (the
 *                 driver frees the memory); then alloc 768 MiB.
 */
#include "cq_driver.h"
#include "cq_vmm.h"

#define MB (1024ull * 1024ull)

static void used(const char *tag) {
    cq_rawmem m;
    if (cq_raw_nvml_mem(0, &m) == 0) printf("used=%llu\n%s.used=%llu\n", m.used, tag, m.used);
    size_t f = 0, t = 0;
    if (cuMemGetInfo(&f, &t) == 0) printf("%s.charged=%zu\n", tag, t - f);
    fflush(stdout);
}

static CUmemGenericAllocationHandle create(size_t bytes) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = cq_vmm_prop(0, 0);
    printf("create=%s\n", cq_err(cuMemCreate(&h, bytes, &p, 0)));
    return h;
}

static void alloc(size_t bytes) {
    CUdeviceptr p = 0;
    printf("alloc=%s\n", cq_err(cuMemAlloc(&p, bytes)));
}

static void multicast(int exact) {
    CUmemGenericAllocationHandle h1 = create(2 * MB), h2 = create(768 * MB), mc = 0;
    CUmulticastObjectProp p;
    memset(&p, 0, sizeof p);
    p.numDevices = 1;
    p.size = 770 * MB;
    printf("mccreate=%s\n", cq_err(cuMulticastCreate(&mc, &p)));
    printf("adddev=%s\n", cq_err(cuMulticastAddDevice(mc, 0)));
    printf("bind1=%s\n", cq_err(cuMulticastBindMem(mc, 0, h1, 0, 2 * MB, 0)));
    printf("bind2=%s\n", cq_err(cuMulticastBindMem(mc, 2 * MB, h2, 0, 768 * MB, 0)));
    used("bound");
    printf("unbind=%s\n", cq_err(cuMulticastUnbind(mc, 0, 0, exact ? 2 * MB : 770 * MB)));
    printf("release1=%s\n", cq_err(cuMemRelease(h1)));
    printf("release2=%s\n", cq_err(cuMemRelease(h2)));
    used("released");
    alloc(768 * MB);
    used("end");
}

static void sparse(int bad) {
    CUmemGenericAllocationHandle h = create(768 * MB);
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 1024;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d.NumChannels = 1;
    d.Flags = CUDA_ARRAY3D_SPARSE;
    CUarray a = NULL;
    printf("array=%s\n", cq_err(cuArray3DCreate(&a, &d)));
    CUarrayMapInfo m[2];
    memset(m, 0, sizeof m);
    m[0].resourceType = CU_RESOURCE_TYPE_ARRAY;
    m[0].resource.array = a;
    m[0].subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    m[0].subresource.sparseLevel.extentWidth = 1024;
    m[0].subresource.sparseLevel.extentHeight = 1024;
    m[0].subresource.sparseLevel.extentDepth = 1;
    m[0].memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    m[0].memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    m[0].memHandle.memHandle = h;
    m[0].deviceBitMask = 1;
    m[1] = m[0];
    m[1].memHandleType = (CUmemHandleType)1; /* not GENERIC: the driver refuses this entry */
    printf("maparray=%s\n", cq_err(cuMemMapArrayAsync(m, bad ? 2 : 1, 0)));
    cuStreamSynchronize(0);
    used("bound");
    printf("release=%s\n", cq_err(cuMemRelease(h)));
    used("released");
    alloc(768 * MB);
    used("end");
}

static void sparsemip(void) {
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 16384;
    d.Height = 16384;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d.NumChannels = 4;
    d.Flags = CUDA_ARRAY3D_SPARSE;
    CUmipmappedArray mip = NULL;
    printf("mipmap=%s\n", cq_err(cuMipmappedArrayCreate(&mip, &d, 3)));
    used("created");
    alloc(512 * MB);
    CUmemGenericAllocationHandle h = create(256 * MB);
    CUarrayMapInfo m;
    memset(&m, 0, sizeof m);
    m.resourceType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
    m.resource.mipmap = mip;
    m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    m.subresource.sparseLevel.extentWidth = 16384;
    m.subresource.sparseLevel.extentHeight = 16384;
    m.subresource.sparseLevel.extentDepth = 1;
    m.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    m.memHandle.memHandle = h;
    m.deviceBitMask = 1;
    printf("maparray=%s\n", cq_err(cuMemMapArrayAsync(&m, 1, 0)));
    cuStreamSynchronize(0);
    printf("release=%s\n", cq_err(cuMemRelease(h)));
    used("bound");
    CUdeviceptr p = 0;
    printf("alloc2=%s\n", cq_err(cuMemAlloc(&p, 768 * MB)));
    used("end");
}

static void hugecount(void) {
    CUarrayMapInfo m;
    memset(&m, 0, sizeof m);
    m.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    printf("maparray=%s\n", cq_err(cuMemMapArrayAsync(&m, 1u << 30, 0)));
    used("end");
}

static CUgraph alloc_node_graph(CUgraph g, size_t bytes) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CUgraphNode n;
    CUresult r = cuGraphAddMemAllocNode(&n, g, NULL, 0, &p);
    if (r) printf("add_alloc=%s\n", cq_err(r));
    return g;
}

static CUresult add_child(CUgraph parent, CUgraph child) {
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_GRAPH;
    np.graph.graph = child;
    np.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    CUgraphNode n;
    return cuGraphAddNode(&n, parent, NULL, NULL, 0, &np);
}

#define DEEP 65

static void deepupdate(void) {
    CUresult r = CUDA_SUCCESS;
    /* A: DEEP empty child graphs side by side, then a 64 MiB alloc node (node types: GRAPH x DEEP, MEM_ALLOC). */
    CUgraph a;
    cuGraphCreate(&a, 0);
    for (int i = 0; i < DEEP && !r; i++) {
        CUgraph e;
        cuGraphCreate(&e, 0);
        r = add_child(a, e);
    }
    printf("a_children=%s\n", cq_err(r));
    alloc_node_graph(a, 64 * MB);
    CUgraphExec exec = NULL;
    printf("instantiate=%s\n", cq_err(cuGraphInstantiate(&exec, a, 0)));
    /* B: the same sequence of node types, nested: c1 ⊃ c2 ⊃ ... ⊃ c_DEEP ⊃ 1536 MiB alloc node. */
    CUgraph inner;
    cuGraphCreate(&inner, 0);
    alloc_node_graph(inner, 1536 * MB);
    for (int i = 0; i < DEEP && !r; i++) {
        CUgraph outer;
        cuGraphCreate(&outer, 0);
        r = add_child(outer, inner);
        inner = outer;
    }
    printf("b_nest=%s\n", cq_err(r));
    CUgraphExecUpdateResultInfo info;
    memset(&info, 0, sizeof info);
    printf("update=%s\n", cq_err(cuGraphExecUpdate(exec, inner, &info)));
    used("updated");
    printf("launch=%s\n", cq_err(cuGraphLaunch(exec, 0)));
    cuStreamSynchronize(0);
    size_t v = 0;
    CUdevice dev = 0;
    cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
    printf("reserved=%zu\n", v);
    used("launched");
    alloc(256 * MB);
    used("end");
}

static void mcrelease(void) {
    CUmemGenericAllocationHandle h = create(512 * MB), mc = 0;
    CUmulticastObjectProp p;
    memset(&p, 0, sizeof p);
    p.numDevices = 1;
    p.size = 512 * MB;
    printf("mccreate=%s\n", cq_err(cuMulticastCreate(&mc, &p)));
    printf("adddev=%s\n", cq_err(cuMulticastAddDevice(mc, 0)));
    printf("bind=%s\n", cq_err(cuMulticastBindMem(mc, 0, h, 0, 512 * MB, 0)));
    printf("release=%s\n", cq_err(cuMemRelease(h)));
    printf("mcrel=%s\n", cq_err(cuMemRelease(mc)));
    used("released");
    alloc(768 * MB);
    used("end");
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (argc < 2 || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "vmm_bindings: no context\n");
        return 2;
    }
    const char *m = argv[1];
    if (!strcmp(m, "mcrange")) multicast(0);
    else if (!strcmp(m, "mcexact")) multicast(1);
    else if (!strcmp(m, "sparsefail")) sparse(1);
    else if (!strcmp(m, "sparseok")) sparse(0);
    else if (!strcmp(m, "sparsemip")) sparsemip();
    else if (!strcmp(m, "hugecount")) hugecount();
    else if (!strcmp(m, "deepupdate")) deepupdate();
    else if (!strcmp(m, "mcrelease")) mcrelease();
    else {
        fprintf(stderr, "vmm_bindings: bad mode %s\n", m);
        return 2;
    }
    printf("done=1\n");
    return 0;
}

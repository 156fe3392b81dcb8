//! CUDA graphs (cuGraph*): kernel and empty nodes, instantiate, launch.

use std::ffi::{c_char, c_void};

use super::{alias, cuda_fn, h, hp, out, read};
use crate::graph::{self, KernelLaunch, NodeKind};
use crate::objects::with;
use crate::sim::cuda;
use crate::types::*;

/// The dependency list of an add-node call.
///
/// # Safety
/// `deps` must hold `n` handles when `n > 0`.
unsafe fn deps(deps: *const Handle, n: usize) -> CuResult<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: n handles per the contract.
    Ok(unsafe { std::slice::from_raw_parts(deps, n) }
        .iter()
        .map(|&d| h(d))
        .collect())
}

fn add_kernel(node: *mut Handle, g: Handle, d: Vec<u64>, p: KernelNodeParams, v2: bool) -> CuResult<()> {
    cuda()?;
    if node.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let func = if p.func.is_null() && v2 { p.kern } else { p.func };
    if func.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::launch::validate_dims(p.grid, p.block)?;
    let k = KernelLaunch {
        func: h(func),
        grid: p.grid,
        block: p.block,
        params: crate::graph::NO_PARAMS,
    };
    // A first parameter that is an exec instantiated for device launch: the kernel launches it.
    let first = if p.kernel_params.is_null() {
        None
    } else {
        // SAFETY: kernelParams holds a pointer per parameter (the driver's contract); every handle is 8 bytes.
        unsafe {
            (*p.kernel_params)
                .cast::<u64>()
                .as_ref()
                .map(|v| std::ptr::read_unaligned(v))
        }
    };
    let n = with(|o| -> CuResult<u64> {
        if !o.functions.contains_key(&k.func) && !o.kernels.contains_key(&k.func) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = graph::add_node(o, h(g), &d, NodeKind::Kernel(k))?;
        if let Some(c) = first.filter(|c| o.cond_handles.contains_key(c)) {
            // A handle setter: (handle, unsigned value), the model's contract for such a kernel.
            // SAFETY: kernelParams holds a pointer per parameter; the second is an unsigned int here.
            let v = unsafe {
                (*p.kernel_params.add(1))
                    .cast::<u32>()
                    .as_ref()
                    .map(|v| std::ptr::read_unaligned(v))
            };
            o.cond_setters.insert(n, (c, v.unwrap_or(0)));
        }
        if let Some(e) = first.filter(|e| {
            o.execs
                .get(e)
                .is_some_and(|x| x.flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH != 0)
        }) {
            o.device_launches.insert(n, e);
        }
        Ok(n)
    })?;
    // SAFETY: checked non-NULL.
    unsafe { out(node, hp(n)) }
}

/// A child graph node: `child` moved into it (it may hold memory nodes) or cloned (it may not: cuda.h).
fn add_child(o: &mut crate::objects::Objects, g: u64, d: &[u64], child: u64, moved: bool) -> CuResult<u64> {
    let owned = if moved {
        if child == g
            || o.nodes
                .values()
                .any(|n| matches!(n.kind, NodeKind::Child(c) if c == child))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        child
    } else {
        graph::clone(o, child)?
    };
    graph::add_node(o, g, d, NodeKind::Child(owned)).inspect_err(|_| {
        if !moved {
            let _ = graph::destroy(o, owned);
        }
    })
}

/// cuGraphAddNode (CUgraphNodeParams: type at 0, the union at 16): kernel, conditional, empty and child graph
/// nodes.
///
/// # Safety
/// `params` is NULL or points to a CUgraphNodeParams (256 bytes).
unsafe fn add_node(node: *mut Handle, g: Handle, d: Vec<u64>, params: *mut u8) -> CuResult<()> {
    cuda()?;
    if node.is_null() || params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a CUgraphNodeParams by the caller's contract.
    let ty = unsafe { std::ptr::read_unaligned(params as *const u32) };
    // SAFETY: as above; the union starts at byte 16.
    let u = unsafe { params.add(16) };
    match ty {
        CU_GRAPH_NODE_TYPE_KERNEL => {
            // SAFETY: CUDA_KERNEL_NODE_PARAMS_v3 has the v2 layout.
            let p = unsafe { std::ptr::read_unaligned(u as *const KernelNodeParams) };
            add_kernel(node, g, d, p, true)
        }
        CU_GRAPH_NODE_TYPE_CONDITIONAL => {
            // SAFETY: CUDA_CONDITIONAL_NODE_PARAMS: handle (u64), type, size (u32), phGraph_out, ctx.
            let (handle, cty, size) = unsafe {
                (
                    std::ptr::read_unaligned(u as *const u64),
                    std::ptr::read_unaligned(u.add(8) as *const u32),
                    std::ptr::read_unaligned(u.add(12) as *const u32),
                )
            };
            if size != 1 {
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            let (n, body) = with(|o| graph::add_conditional(o, h(g), &d, handle, cty))?;
            // The driver owns the array of body graphs, valid for the node's lifetime: leaked (one word).
            let arr: &'static mut [Handle; 1] = Box::leak(Box::new([hp(body)]));
            // SAFETY: phGraph_out at byte 16 of the conditional params, written as the driver does.
            unsafe { std::ptr::write_unaligned(u.add(16) as *mut *mut Handle, arr.as_mut_ptr()) };
            // SAFETY: checked non-NULL.
            unsafe { out(node, hp(n)) }
        }
        CU_GRAPH_NODE_TYPE_EMPTY => {
            let n = with(|o| graph::add_node(o, h(g), &d, NodeKind::Empty))?;
            // SAFETY: checked non-NULL.
            unsafe { out(node, hp(n)) }
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: CUDA_CHILD_GRAPH_NODE_PARAMS: graph (8 bytes), ownership (u32).
            let (child, ownership) = unsafe {
                (
                    std::ptr::read_unaligned(u as *const u64),
                    std::ptr::read_unaligned(u.add(8) as *const u32),
                )
            };
            let moved = ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
            let n = with(|o| add_child(o, h(g), &d, h(child as usize as Handle), moved))?;
            // SAFETY: checked non-NULL.
            unsafe { out(node, hp(n)) }
        }
        // Other node types through this call are not modelled.
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// A kernel node's launch, and whether its handle is a library kernel (not a function).
fn kernel_node(node: Handle) -> CuResult<(KernelLaunch, bool)> {
    with(|o| match o.nodes.get(&h(node)).map(|n| n.kind) {
        Some(NodeKind::Kernel(k)) => Ok((k, o.kernels.contains_key(&k.func))),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// The kernel a node's parameters name (`kern` when `func` is NULL, in the v2 struct), checked.
fn node_launch(p: &KernelNodeParams, v2: bool) -> CuResult<KernelLaunch> {
    let func = if p.func.is_null() && v2 { p.kern } else { p.func };
    if func.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::launch::validate_dims(p.grid, p.block)?;
    let k = KernelLaunch {
        func: h(func),
        grid: p.grid,
        block: p.block,
        params: crate::graph::NO_PARAMS,
    };
    with(|o| {
        if o.functions.contains_key(&k.func) || o.kernels.contains_key(&k.func) {
            Ok(k)
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// A v1 `CUDA_KERNEL_NODE_PARAMS` (the v2 struct's first 56 bytes).
///
/// # Safety
/// `params` is NULL or points to such a struct.
unsafe fn read_v1(params: *const KernelNodeParams) -> CuResult<KernelNodeParams> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: zeroed is valid for this plain struct; 56 bytes readable by the contract.
    let mut p: KernelNodeParams = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(params as *const u8, &mut p as *mut _ as *mut u8, 56) };
    Ok(p)
}

/// cuGraphKernelNodeSetParams: the node of a graph (not of its execs) runs another kernel.
fn set_kernel_node(node: Handle, p: KernelNodeParams, v2: bool) -> CuResult<()> {
    cuda()?;
    let k = node_launch(&p, v2)?;
    with(|o| match o.nodes.get_mut(&h(node)) {
        Some(n) if matches!(n.kind, NodeKind::Kernel(_)) => {
            n.kind = NodeKind::Kernel(k);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// cuGraphExecKernelNodeSetParams: the exec's copy of a kernel node runs another kernel.
fn exec_set_kernel(exec: Handle, node: Handle, p: KernelNodeParams, v2: bool) -> CuResult<()> {
    cuda()?;
    let k = node_launch(&p, v2)?;
    with(|o| graph::exec_set_kernel(o, h(exec), h(node), k))
}

/// cuGraphUpload: sets up the exec's stack and graph memory in the stream's context; it may then be launched
/// from the device.
fn upload(exec: Handle, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    with(|o| {
        let st = crate::stream::resolve(o, sim, h(s))?;
        let ctx = o.streams[&st].ctx;
        graph::size_stack(o, sim, h(exec), ctx)?;
        crate::graph_mem::upload(o, sim, h(exec))?;
        if let Some(e) = o.execs.get_mut(&h(exec)) {
            e.uploaded = true;
        }
        Ok(())
    })
}

fn instantiate(pexec: *mut Handle, g: Handle, flags: u64) -> CuResult<()> {
    let sim = cuda()?;
    if pexec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = with(|o| graph::instantiate(o, sim, h(g), flags))?;
    // SAFETY: checked non-NULL.
    unsafe { out(pexec, hp(e)) }
}

cuda_fn! {
    fn cuGraphCreate(pg: *mut Handle, flags: u32) {
        cuda()?;
        if pg.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pg, hp(with(graph::create)))
    }

    fn cuGraphDestroy(g: Handle) {
        cuda()?;
        with(|o| graph::destroy(o, h(g)))
    }

    fn cuGraphAddKernelNode_v2(
        node: *mut Handle,
        g: Handle,
        dependencies: *const Handle,
        n: usize,
        params: *const KernelNodeParams,
    ) {
        add_kernel(node, g, deps(dependencies, n)?, read(params)?, true)
    }

    fn cuGraphAddKernelNode(
        node: *mut Handle,
        g: Handle,
        dependencies: *const Handle,
        n: usize,
        params: *const KernelNodeParams,
    ) {
        // The v1 struct is the v2 struct without its last two fields: read only the prefix.
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut p: KernelNodeParams = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(params as *const u8, &mut p as *mut _ as *mut u8, 56);
        add_kernel(node, g, deps(dependencies, n)?, p, false)
    }

    fn cuGraphAddEmptyNode(node: *mut Handle, g: Handle, dependencies: *const Handle, n: usize) {
        cuda()?;
        let d = deps(dependencies, n)?;
        out(node, hp(with(|o| graph::add_node(o, h(g), &d, NodeKind::Empty))?))
    }

    fn cuGraphGetNodes(g: Handle, nodes: *mut Handle, num: *mut usize) {
        cuda()?;
        if num.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let list = with(|o| o.graphs.get(&h(g)).map(|g| g.nodes.clone())).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if !nodes.is_null() {
            for (i, n) in list.iter().take(*num).enumerate() {
                *nodes.add(i) = hp(*n);
            }
        }
        *num = list.len();
        Ok(())
    }

    fn cuGraphNodeGetType(node: Handle, ty: *mut u32) {
        cuda()?;
        let k = with(|o| o.nodes.get(&h(node)).map(|n| n.kind)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(ty, graph::node_type(&k))
    }

    fn cuGraphAddChildGraphNode(node: *mut Handle, g: Handle, dependencies: *const Handle, n: usize, child: Handle) {
        cuda()?;
        let d = deps(dependencies, n)?;
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, hp(with(|o| add_child(o, h(g), &d, h(child), false))?))
    }

    fn cuGraphChildGraphNodeGetGraph(node: Handle, pg: *mut Handle) {
        cuda()?;
        let k = with(|o| o.nodes.get(&h(node)).map(|n| n.kind)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let NodeKind::Child(c) = k else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(pg, hp(c))
    }

    fn cuGraphExecUpdate_v2(exec: Handle, g: Handle, info: *mut GraphExecUpdateResultInfo) {
        cuda()?;
        let r = with(|o| graph::exec_update(o, h(exec), h(g)));
        if !info.is_null() {
            std::ptr::write(
                info,
                GraphExecUpdateResultInfo {
                    result: match r {
                        Ok(()) => CU_GRAPH_EXEC_UPDATE_SUCCESS,
                        Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) => CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                        Err(_) => CU_GRAPH_EXEC_UPDATE_ERROR,
                    },
                    error_node: std::ptr::null_mut(),
                    error_from_node: std::ptr::null_mut(),
                },
            );
        }
        r
    }

    fn cuGraphConditionalHandleCreate(handle: *mut u64, g: Handle, ctx: Handle, default: u32, flags: u32) {
        cuda()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(handle, with(|o| graph::cond_handle_create(o, h(g), default, flags))?)
    }

    fn cuGraphAddNode_v2(
        node: *mut Handle,
        g: Handle,
        dependencies: *const Handle,
        edge_data: *const c_void,
        n: usize,
        params: *mut u8,
    ) {
        add_node(node, g, deps(dependencies, n)?, params)
    }

    fn cuGraphAddNode(node: *mut Handle, g: Handle, dependencies: *const Handle, n: usize, params: *mut u8) {
        add_node(node, g, deps(dependencies, n)?, params)
    }

    fn cuGraphExecGetFlags(exec: Handle, flags: *mut u64) {
        cuda()?;
        let f = with(|o| o.execs.get(&h(exec)).map(|e| e.flags)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, f)
    }

    fn cuGraphInstantiateWithFlags(pexec: *mut Handle, g: Handle, flags: u64) {
        instantiate(pexec, g, flags)
    }

    fn cuGraphInstantiate(pexec: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize) {
        instantiate(pexec, g, 0)
    }

    fn cuGraphInstantiate_v2(pexec: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize) {
        instantiate(pexec, g, 0)
    }

    fn cuGraphInstantiateWithParams(pexec: *mut Handle, g: Handle, params: *mut GraphInstantiateParams) {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = *params;
        let mut r = instantiate(pexec, g, p.flags);
        if r.is_ok() && p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
            // Uploaded into the params' stream once instantiated (cuda.h); a failed upload leaves no exec.
            let e = *pexec;
            r = upload(e, p.upload_stream);
            if r.is_err() {
                let _ = with(|o| graph::exec_destroy(o, cuda()?, h(e)));
            }
        }
        (*params).result_out = if r.is_ok() { 0 } else { 1 };
        r
    }

    fn cuGraphUpload(exec: Handle, s: Handle) {
        upload(exec, s)
    }

    fn cuGraphLaunch(exec: Handle, s: Handle) {
        let sim = cuda()?;
        let (kernels, copies) = with(|o| {
            let k = graph::launch_kernels(o, h(exec))?;
            Ok::<_, CUresult>((k, o.execs[&h(exec)].copies.clone()))
        })?;
        with(|o| {
            let st = crate::stream::resolve(o, sim, h(s))?;
            let ctx = o.streams[&st].ctx;
            graph::size_stack(o, sim, h(exec), ctx)?;
            crate::graph_mem::launch(o, sim, h(exec))?;
            if let Some(e) = o.execs.get_mut(&h(exec)) {
                e.uploaded = true;
            }
            Ok::<(), CUresult>(())
        })?;
        super::memory::run_graph_copies(&copies)?;
        if kernels.is_empty() {
            return with(|o| crate::stream::resolve(o, sim, h(s)).map(|_| ()));
        }
        crate::launch::launch(sim, h(s), &kernels, false)
    }

    fn cuGraphKernelNodeGetParams_v2(node: Handle, params: *mut KernelNodeParams) {
        cuda()?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (k, is_kernel) = kernel_node(node)?;
        let mut p: KernelNodeParams = std::mem::zeroed();
        p.grid = k.grid;
        p.block = k.block;
        // A library kernel's node answers its CUkernel in `kern` (func NULL), a function's in `func`.
        if is_kernel {
            p.kern = hp(k.func);
        } else {
            p.func = hp(k.func);
        }
        std::ptr::write(params, p);
        Ok(())
    }

    fn cuGraphKernelNodeGetParams(node: Handle, params: *mut KernelNodeParams) {
        cuda()?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The v1 struct: the v2 one's first 56 bytes, the handle in `func` whatever it is.
        let (k, _) = kernel_node(node)?;
        let mut p: KernelNodeParams = std::mem::zeroed();
        p.func = hp(k.func);
        p.grid = k.grid;
        p.block = k.block;
        std::ptr::copy_nonoverlapping(&p as *const _ as *const u8, params as *mut u8, 56);
        Ok(())
    }

    fn cuGraphKernelNodeSetParams_v2(node: Handle, params: *const KernelNodeParams) {
        set_kernel_node(node, read(params)?, true)
    }

    fn cuGraphKernelNodeSetParams(node: Handle, params: *const KernelNodeParams) {
        set_kernel_node(node, read_v1(params)?, false)
    }

    fn cuGraphExecKernelNodeSetParams_v2(exec: Handle, node: Handle, params: *const KernelNodeParams) {
        exec_set_kernel(exec, node, read(params)?, true)
    }

    fn cuGraphExecKernelNodeSetParams(exec: Handle, node: Handle, params: *const KernelNodeParams) {
        exec_set_kernel(exec, node, read_v1(params)?, false)
    }

    fn cuGraphExecNodeSetParams(exec: Handle, node: Handle, params: *mut u8) {
        cuda()?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // CUgraphNodeParams: type at 0, the union at 16; kernel nodes only here.
        if std::ptr::read_unaligned(params as *const u32) != CU_GRAPH_NODE_TYPE_KERNEL {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let p = std::ptr::read_unaligned(params.add(16) as *const KernelNodeParams);
        exec_set_kernel(exec, node, p, true)
    }

    fn cuGraphExecDestroy(exec: Handle) {
        let sim = cuda()?;
        with(|o| graph::exec_destroy(o, sim, h(exec)))
    }

    fn cuGraphAddMemAllocNode(
        node: *mut Handle,
        g: Handle,
        dependencies: *const Handle,
        n: usize,
        params: *mut MemAllocNodeParams,
    ) {
        let sim = cuda()?;
        let d = deps(dependencies, n)?;
        if node.is_null() || params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = std::ptr::read(params);
        let loc = p.pool_props.location;
        if p.pool_props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED
            || loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE
            || p.pool_props.handle_types != 0
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ordinal = usize::try_from(loc.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        let (n, ptr) = with(|o| -> CuResult<(u64, u64)> {
            if !o.graphs.contains_key(&h(g)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let ctx = crate::context::current(o, sim)?;
            let ptr = crate::graph_mem::node_alloc(o, sim, ordinal, p.bytesize as u64, ctx)?;
            let kind = NodeKind::MemAlloc {
                ptr,
                bytes: p.bytesize as u64,
                props: std::mem::transmute::<MemPoolProps, [u8; 88]>(p.pool_props),
            };
            match graph::add_node(o, h(g), &d, kind) {
                Ok(n) => Ok((n, ptr)),
                Err(e) => {
                    crate::graph_mem::release_va(o, ptr);
                    Err(e)
                }
            }
        })?;
        (*params).dptr = ptr;
        out(node, hp(n))
    }

    fn cuGraphMemAllocNodeGetParams(node: Handle, params: *mut MemAllocNodeParams) {
        cuda()?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let k = with(|o| o.nodes.get(&h(node)).map(|n| n.kind)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let NodeKind::MemAlloc { ptr, bytes, props } = k else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        std::ptr::write(
            params,
            MemAllocNodeParams {
                pool_props: std::mem::transmute::<[u8; 88], MemPoolProps>(props),
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: bytes as usize,
                dptr: ptr,
            },
        );
        Ok(())
    }

    fn cuGraphAddMemFreeNode(node: *mut Handle, g: Handle, dependencies: *const Handle, n: usize, dptr: u64) {
        cuda()?;
        let d = deps(dependencies, n)?;
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = with(|o| -> CuResult<u64> {
            let a = o.mem.allocs.get(&dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if a.kind != crate::memory::AllocKind::Graph {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            graph::add_node(o, h(g), &d, NodeKind::MemFree(dptr))
        })?;
        out(node, hp(n))
    }

    fn cuGraphMemFreeNodeGetParams(node: Handle, dptr: *mut u64) {
        cuda()?;
        let k = with(|o| o.nodes.get(&h(node)).map(|n| n.kind)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let NodeKind::MemFree(p) = k else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(dptr, p)
    }

    fn cuDeviceGraphMemTrim(dev: CUdevice) {
        let sim = cuda()?;
        let d = usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        with(|o| crate::graph_mem::trim(o, sim, d))
    }

    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut c_void) {
        let sim = cuda()?;
        let d = usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = with(|o| crate::graph_mem::attribute(o, sim, d, attr))?;
        out(value as *mut u64, v)
    }

    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut c_void) {
        let sim = cuda()?;
        let d = usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        let v = read(value as *const u64)?;
        with(|o| crate::graph_mem::set_attribute(o, sim, d, attr, v))
    }
}

alias! {
    cuGraphInstantiateWithParams_ptsz => cuGraphInstantiateWithParams(
        pexec: *mut Handle, g: Handle, params: *mut GraphInstantiateParams);
    cuGraphUpload_ptsz => cuGraphUpload(exec: Handle, s: Handle);
    cuGraphLaunch_ptsz => cuGraphLaunch(exec: Handle, s: Handle);
}

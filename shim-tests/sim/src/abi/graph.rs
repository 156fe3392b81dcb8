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
    };
    let n = with(|o| -> CuResult<u64> {
        if !o.functions.contains_key(&k.func) && !o.kernels.contains_key(&k.func) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        graph::add_node(o, h(g), &d, NodeKind::Kernel(k))
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

fn instantiate(pexec: *mut Handle, g: Handle) -> CuResult<()> {
    let sim = cuda()?;
    if pexec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = with(|o| graph::instantiate(o, sim, h(g)))?;
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

    fn cuGraphAddNode_v2(
        node: *mut Handle,
        g: Handle,
        dependencies: *const Handle,
        edge_data: *const c_void,
        n: usize,
        params: *mut GraphNodeParams,
    ) {
        cuda()?;
        let d = deps(dependencies, n)?;
        if node.is_null() || params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = std::ptr::read(params);
        let kind = match p.type_ {
            CU_GRAPH_NODE_TYPE_EMPTY => NodeKind::Empty,
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let child = h(p.union_[0] as usize as Handle);
                let moved = p.union_[1] as u32 == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
                return out(node, hp(with(|o| add_child(o, h(g), &d, child, moved))?));
            }
            // Other node types through this call are not modelled.
            _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        out(node, hp(with(|o| graph::add_node(o, h(g), &d, kind))?))
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

    fn cuGraphInstantiateWithFlags(pexec: *mut Handle, g: Handle, flags: u64) {
        instantiate(pexec, g)
    }

    fn cuGraphInstantiate(pexec: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize) {
        instantiate(pexec, g)
    }

    fn cuGraphInstantiate_v2(pexec: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize) {
        instantiate(pexec, g)
    }

    fn cuGraphInstantiateWithParams(pexec: *mut Handle, g: Handle, params: *mut GraphInstantiateParams) {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = instantiate(pexec, g);
        (*params).result_out = if r.is_ok() { 0 } else { 1 };
        r
    }

    fn cuGraphUpload(exec: Handle, s: Handle) {
        let sim = cuda()?;
        with(|o| {
            crate::stream::resolve(o, sim, h(s))?;
            crate::graph_mem::upload(o, sim, h(exec))
        })
    }

    fn cuGraphLaunch(exec: Handle, s: Handle) {
        let sim = cuda()?;
        let (kernels, copies) = with(|o| o.execs.get(&h(exec)).map(|e| (e.kernels.clone(), e.copies.clone())))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with(|o| {
            crate::stream::resolve(o, sim, h(s))?;
            crate::graph_mem::launch(o, sim, h(exec))
        })?;
        super::memory::run_graph_copies(&copies)?;
        if kernels.is_empty() {
            return with(|o| crate::stream::resolve(o, sim, h(s)).map(|_| ()));
        }
        crate::launch::launch(sim, h(s), &kernels, false)
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

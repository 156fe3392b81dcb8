//! CUDA graphs: kernel nodes added explicitly or captured from a stream, instantiated and launched as their
//! kernels in order on one stream (each one a kernel on the device timeline, exactly as if launched alone).
//!
//! Conditional nodes (`cuGraphConditionalHandleCreate`, `CU_GRAPH_NODE_TYPE_CONDITIONAL`): a WHILE node runs its
//! body graph as many times as its handle's value when the node is reached; an IF node runs its body once when
//! that value is non-zero. The value is the default (with `CU_GRAPH_COND_ASSIGN_DEFAULT`, else 0) unless a kernel
//! node before it sets it: kernels compute nothing here, so a kernel node whose first two parameters are a
//! conditional handle and an `unsigned int` is the model of a kernel calling `cudaGraphSetConditional(handle,
//! value)`. The kernels a launch runs are fixed at instantiation. Execs
//! instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH` launch from the host like any other (their flags
//! are reported by `cuGraphExecGetFlags`), and from the device: a kernel node whose first parameter is such an
//! exec's handle launches it (a tail launch: its kernels run, as the exec is then, after the launching graph's,
//! and the launch completes with them) once the exec was uploaded (`cuGraphUpload` or a host launch; before, the
//! device-side launch fails and runs nothing, as cuda.h says).
//!
//! Stack: uploading or launching an exec grows its stream's context's stack to the largest local memory of
//! every kernel the exec may run (conditional bodies whether or not they run this time, child graphs), since
//! the device decides at run time which of them run; a device-side launch grows nothing (its exec's upload did).

use std::collections::HashMap;

use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

/// A kernel launch as a graph stores it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelLaunch {
    /// A CUfunction or CUkernel handle.
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// The launch's `kernelParams` (a `touch` kernel reads its operands there at launch), or `NO_PARAMS`.
    pub params: u64,
}

/// `KernelLaunch::params` of a graph's kernel node: a `touch` kernel in a graph is not modelled.
pub(crate) const NO_PARAMS: u64 = u64::MAX;

/// A copy captured from a stream: the bytes move each time the graph runs (which sides must be live device
/// memory was decided at capture; it is checked again at launch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyNode {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub dst_device: bool,
    pub src_device: bool,
}

/// What a node does.
#[derive(Clone, Copy)]
pub(crate) enum NodeKind {
    Kernel(KernelLaunch),
    Memcpy(CopyNode),
    Empty,
    /// A graph allocation: its address range (see `graph_mem`), the size asked for and the pool properties.
    MemAlloc {
        ptr: u64,
        bytes: u64,
        /// The CUmemPoolProps given, as bytes (they hold a pointer, which is not Send).
        props: [u8; 88],
    },
    /// Frees a graph allocation.
    MemFree(u64),
    /// Runs a child graph, which the node owns (cloned into it, or moved there with its memory nodes).
    Child(u64),
    /// A conditional node: its handle, its type (WHILE or IF) and its body graph.
    Conditional {
        handle: u64,
        ty: u32,
        body: u64,
    },
}

/// A conditional handle: the value a launch starts with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CondHandle {
    pub default: u32,
    pub assign_default: bool,
}

/// Most kernels one launch of an exec may run (conditional bodies repeated included).
const MAX_EXEC_KERNELS: usize = 1 << 20;

/// A node.
pub(crate) struct GraphNode {
    pub graph: u64,
    pub kind: NodeKind,
}

/// A graph: its nodes in insertion order (a valid topological order, since dependencies must exist first).
#[derive(Default)]
pub(crate) struct Graph {
    pub nodes: Vec<u64>,
}

/// An executable graph.
pub(crate) struct GraphExec {
    /// The node types of the graph it was instantiated from, child graphs included (what an update must match).
    pub shape: Vec<u32>,
    pub ctx: u64,
    pub kernels: Vec<KernelLaunch>,
    /// Captured copies, in capture order; run at launch before the kernels (kernels compute nothing, so the
    /// order between the two is not observable).
    pub copies: Vec<CopyNode>,
    /// Addresses of the alloc nodes and of the free nodes (graph memory; see `graph_mem`).
    pub mem_allocs: Vec<u64>,
    pub mem_frees: Vec<u64>,
    /// Per CUDA ordinal, graph memory this exec's launches reserved.
    pub grown: Vec<(usize, u64)>,
    /// The instantiation flags (`cuGraphExecGetFlags`).
    pub flags: u64,
    /// The node of each of `kernels` (0: none).
    pub kernel_nodes: Vec<u64>,
    /// Every kernel the exec may run, with its node: what its upload or launch sizes the stack for.
    pub stack_funcs: Vec<(u64, u64)>,
    /// Execs its kernels launch from the device (each run after its kernels, once uploaded).
    pub device_launches: Vec<u64>,
    /// Uploaded (`cuGraphUpload`) or launched from the host: launchable from the device.
    pub uploaded: bool,
}

/// cuGraphCreate.
pub(crate) fn create(o: &mut Objects) -> u64 {
    let h = new_handle(Kind::Graph);
    o.graphs.insert(h, Graph::default());
    h
}

/// Adds a node; dependencies must be nodes of the same graph.
pub(crate) fn add_node(o: &mut Objects, graph: u64, deps: &[u64], kind: NodeKind) -> CuResult<u64> {
    if !o.graphs.contains_key(&graph) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if deps
        .iter()
        .any(|d| o.nodes.get(d).is_none_or(|n| n.graph != graph))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle(Kind::GraphNode);
    o.nodes.insert(h, GraphNode { graph, kind });
    o.graphs
        .get_mut(&graph)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .nodes
        .push(h);
    Ok(h)
}

/// cuGraphDestroy. An alloc node's address range lives on while an exec holds it.
pub(crate) fn destroy(o: &mut Objects, graph: u64) -> CuResult<()> {
    let g = o.graphs.remove(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for n in g.nodes {
        match o.nodes.remove(&n).map(|n| n.kind) {
            Some(NodeKind::MemAlloc { ptr, .. }) => crate::graph_mem::release_va(o, ptr),
            Some(NodeKind::Child(c)) | Some(NodeKind::Conditional { body: c, .. }) => destroy(o, c)?,
            _ => {}
        }
    }
    Ok(())
}

/// cuGraphExecDestroy.
pub(crate) fn exec_destroy(o: &mut Objects, sim: &Sim, exec: u64) -> CuResult<()> {
    let e = o.execs.remove(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    crate::graph_mem::exec_destroyed(o, sim, &e);
    Ok(())
}

/// What an exec runs, flattened from a graph and its child graphs.
#[derive(Default)]
pub(crate) struct Flat {
    pub shape: Vec<u32>,
    pub kernels: Vec<KernelLaunch>,
    pub kernel_nodes: Vec<u64>,
    pub stack_funcs: Vec<(u64, u64)>,
    pub device_launches: Vec<u64>,
    pub copies: Vec<CopyNode>,
    pub mem_allocs: Vec<u64>,
    pub mem_frees: Vec<u64>,
}

/// The node type a node reports (cuGraphNodeGetType).
pub(crate) fn node_type(k: &NodeKind) -> u32 {
    match k {
        NodeKind::Kernel(_) => CU_GRAPH_NODE_TYPE_KERNEL,
        NodeKind::Memcpy(_) => CU_GRAPH_NODE_TYPE_MEMCPY,
        NodeKind::Empty => CU_GRAPH_NODE_TYPE_EMPTY,
        NodeKind::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        NodeKind::MemFree(_) => CU_GRAPH_NODE_TYPE_MEM_FREE,
        NodeKind::Child(_) => CU_GRAPH_NODE_TYPE_GRAPH,
        NodeKind::Conditional { .. } => CU_GRAPH_NODE_TYPE_CONDITIONAL,
    }
}

/// Flattens `graph`: its child graphs in place of their nodes, conditional bodies unrolled as often as they run
/// in one launch, device-side launches of other execs in place.
pub(crate) fn flatten(o: &Objects, graph: u64, f: &mut Flat) -> CuResult<()> {
    flatten_at(o, graph, 0, &mut HashMap::new(), f)
}

/// [`flatten`] at conditional nesting `depth`; `values`: the conditional handles' values so far in this launch.
fn flatten_at(
    o: &Objects,
    graph: u64,
    depth: u32,
    values: &mut HashMap<u64, u32>,
    f: &mut Flat,
) -> CuResult<()> {
    let g = o.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if depth > 8 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for n in &g.nodes {
        if f.kernels.len() > MAX_EXEC_KERNELS {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let Some(node) = o.nodes.get(n) else { continue };
        f.shape.push(node_type(&node.kind));
        match node.kind {
            NodeKind::Kernel(k) => {
                f.kernels.push(k);
                f.kernel_nodes.push(*n);
                f.stack_funcs.push((*n, k.func));
                if let Some(&(h, v)) = o.cond_setters.get(n) {
                    values.insert(h, v);
                }
                if let Some(&e) = o.device_launches.get(n) {
                    f.device_launches.push(e);
                }
            }
            NodeKind::Memcpy(c) => f.copies.push(c),
            NodeKind::MemAlloc { ptr, .. } => f.mem_allocs.push(ptr),
            NodeKind::MemFree(p) => f.mem_frees.push(p),
            NodeKind::Child(c) => flatten_at(o, c, depth, values, f)?,
            NodeKind::Conditional { handle, ty, body } => {
                // Whether or not the body runs this time, its kernels may: the stack is sized for them.
                let mut once = Flat::default();
                flatten_at(o, body, depth + 1, &mut values.clone(), &mut once)?;
                f.stack_funcs.extend(once.stack_funcs);
                let h = o.cond_handles.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let dflt = if h.assign_default { h.default } else { 0 };
                let value = *values.entry(handle).or_insert(dflt);
                let times = match ty {
                    CU_GRAPH_COND_TYPE_WHILE => value,
                    _ => (value != 0) as u32,
                };
                for _ in 0..times {
                    // Only the body's work: its node types are not part of the exec's shape.
                    let mut body_work = Flat::default();
                    flatten_at(o, body, depth + 1, values, &mut body_work)?;
                    f.kernels.extend(body_work.kernels);
                    f.kernel_nodes.extend(body_work.kernel_nodes);
                    f.device_launches.extend(body_work.device_launches);
                    f.copies.extend(body_work.copies);
                    if f.kernels.len() > MAX_EXEC_KERNELS {
                        return Err(CUDA_ERROR_OUT_OF_MEMORY);
                    }
                }
            }
            NodeKind::Empty => {}
        }
    }
    Ok(())
}

/// Whether `graph` (or a child graph of it) has memory alloc or free nodes.
pub(crate) fn has_memory_nodes(o: &Objects, graph: u64) -> CuResult<bool> {
    let mut f = Flat::default();
    flatten(o, graph, &mut f)?;
    Ok(!f.mem_allocs.is_empty() || !f.mem_frees.is_empty())
}

/// A copy of `graph` (cuGraphAddChildGraphNode clones): kernel, copy and empty nodes, child graphs cloned in
/// turn. Graphs with memory nodes cannot be cloned (cuda.h): CUDA_ERROR_INVALID_VALUE.
pub(crate) fn clone(o: &mut Objects, graph: u64) -> CuResult<u64> {
    if has_memory_nodes(o, graph)? {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = o
        .graphs
        .get(&graph)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .nodes
        .clone();
    let g = create(o);
    let mut prev: Option<u64> = None;
    for n in nodes {
        let Some(kind) = o.nodes.get(&n).map(|n| n.kind) else {
            continue;
        };
        let kind = match kind {
            NodeKind::Child(c) => NodeKind::Child(clone(o, c)?),
            NodeKind::Conditional { handle, ty, body } => NodeKind::Conditional {
                handle,
                ty,
                body: clone(o, body)?,
            },
            k => k,
        };
        // Insertion order is the order nodes run in: a chain keeps it.
        let deps: Vec<u64> = prev.into_iter().collect();
        prev = Some(add_node(o, g, &deps, kind)?);
    }
    Ok(g)
}

/// cuGraphInstantiate: snapshots the graph's work (child graphs flattened) for the current context.
pub(crate) fn instantiate(o: &mut Objects, sim: &Sim, graph: u64, flags: u64) -> CuResult<u64> {
    let ctx = crate::context::current(o, sim)?;
    let mut f = Flat::default();
    flatten(o, graph, &mut f)?;
    for &p in &f.mem_allocs {
        crate::graph_mem::retain_va(o, p);
    }
    let h = new_handle(Kind::GraphExec);
    o.execs.insert(
        h,
        GraphExec {
            shape: f.shape,
            ctx,
            kernels: f.kernels,
            copies: f.copies,
            mem_allocs: f.mem_allocs,
            mem_frees: f.mem_frees,
            grown: Vec::new(),
            flags,
            kernel_nodes: f.kernel_nodes,
            stack_funcs: f.stack_funcs,
            device_launches: f.device_launches,
            uploaded: false,
        },
    );
    Ok(h)
}

/// The kernels a host launch of `exec` runs: its own, then those of the execs they launch from the device that
/// were uploaded (one level: a device-launched graph's own device launches are its kernels' business).
pub(crate) fn launch_kernels(o: &Objects, exec: u64) -> CuResult<Vec<KernelLaunch>> {
    let e = o.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut k = e.kernels.clone();
    for d in &e.device_launches {
        if let Some(d) = o.execs.get(d).filter(|d| d.uploaded) {
            k.extend_from_slice(&d.kernels);
        }
    }
    Ok(k)
}

/// Before `exec`'s upload or launch on a stream of context `ctx`: the stack grows to the largest local memory
/// of every kernel the exec may run (`CUDA_ERROR_OUT_OF_MEMORY` when the device cannot hold it).
pub(crate) fn size_stack(o: &mut Objects, sim: &Sim, exec: u64, ctx: u64) -> CuResult<()> {
    let funcs: Vec<u64> = o
        .execs
        .get(&exec)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .stack_funcs
        .iter()
        .map(|f| f.1)
        .collect();
    let mut local = 0;
    for f in funcs {
        let (func, _) = crate::module::function_for(o, sim, f, ctx)?;
        local = o.functions.get(&func).map_or(0, |f| f.local).max(local);
    }
    crate::context::grow_stack(o, sim, ctx, local)
}

/// cuGraphExecKernelNodeSetParams / cuGraphExecNodeSetParams of a kernel node: `node` (a kernel node of the
/// graph `exec` was instantiated from) runs `k` from the exec's next launch.
pub(crate) fn exec_set_kernel(o: &mut Objects, exec: u64, node: u64, k: KernelLaunch) -> CuResult<()> {
    let e = o.execs.get_mut(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !e.stack_funcs.iter().any(|f| f.0 == node) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (i, n) in e.kernel_nodes.iter().enumerate() {
        if *n == node {
            e.kernels[i] = k;
        }
    }
    for f in e.stack_funcs.iter_mut().filter(|f| f.0 == node) {
        f.1 = k.func;
    }
    Ok(())
}

/// cuGraphExecUpdate: a graph of the same shape (node types, child graphs included) replaces the exec's
/// parameters, alloc nodes' sizes and addresses included (a driver that accepts that: what the exec's next
/// launch reserves changes with it). Another shape: CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, nothing changes.
pub(crate) fn exec_update(o: &mut Objects, exec: u64, graph: u64) -> CuResult<()> {
    let mut f = Flat::default();
    flatten(o, graph, &mut f)?;
    let e = o.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if e.shape != f.shape {
        return Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    }
    for &p in &f.mem_allocs {
        crate::graph_mem::retain_va(o, p);
    }
    let e = o.execs.get_mut(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    e.kernels = f.kernels;
    e.kernel_nodes = f.kernel_nodes;
    e.stack_funcs = f.stack_funcs;
    e.device_launches = f.device_launches;
    e.copies = f.copies;
    e.mem_frees = f.mem_frees;
    let old = std::mem::replace(&mut e.mem_allocs, f.mem_allocs);
    for p in old {
        crate::graph_mem::release_va(o, p);
    }
    Ok(())
}

/// Drops the executable graphs of a context being torn down.
pub(crate) fn destroy_for_context(o: &mut Objects, sim: &Sim, ctx: u64) {
    let mine: Vec<u64> = o
        .execs
        .iter()
        .filter(|(_, e)| e.ctx == ctx)
        .map(|(&h, _)| h)
        .collect();
    for h in mine {
        let _ = exec_destroy(o, sim, h);
    }
}

/// Appends a kernel launched on a capturing stream to the capture graph.
pub(crate) fn capture_kernel(o: &mut Objects, stream: u64, k: KernelLaunch) -> CuResult<()> {
    capture(o, stream, NodeKind::Kernel(k))
}

/// Appends work queued on a capturing stream to the capture graph, after the stream's last node.
pub(crate) fn capture(o: &mut Objects, stream: u64, kind: NodeKind) -> CuResult<()> {
    let (graph, last) = {
        let c = o
            .streams
            .get(&stream)
            .and_then(|s| s.capture.as_ref())
            .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        (c.graph, c.last_node)
    };
    let deps: Vec<u64> = last.into_iter().collect();
    let n = add_node(o, graph, &deps, kind)?;
    if let Some(c) = o.streams.get_mut(&stream).and_then(|s| s.capture.as_mut()) {
        c.last_node = Some(n);
    }
    Ok(())
}

/// cuGraphConditionalHandleCreate.
pub(crate) fn cond_handle_create(o: &mut Objects, graph: u64, default: u32, flags: u32) -> CuResult<u64> {
    if !o.graphs.contains_key(&graph) || flags & !CU_GRAPH_COND_ASSIGN_DEFAULT != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle(Kind::GraphNode);
    o.cond_handles.insert(
        h,
        CondHandle {
            default,
            assign_default: flags & CU_GRAPH_COND_ASSIGN_DEFAULT != 0,
        },
    );
    Ok(h)
}

/// Adds a conditional node of `ty` with a new, empty body graph; returns (node, body).
pub(crate) fn add_conditional(
    o: &mut Objects,
    graph: u64,
    deps: &[u64],
    handle: u64,
    ty: u32,
) -> CuResult<(u64, u64)> {
    if !o.cond_handles.contains_key(&handle) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ty != CU_GRAPH_COND_TYPE_WHILE && ty != CU_GRAPH_COND_TYPE_IF {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let body = create(o);
    match add_node(o, graph, deps, NodeKind::Conditional { handle, ty, body }) {
        Ok(n) => Ok((n, body)),
        Err(e) => {
            o.graphs.remove(&body);
            Err(e)
        }
    }
}

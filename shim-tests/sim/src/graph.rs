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
//! exec's handle launches it (a tail launch: its kernels run, as the exec was instantiated, after the launching
//! graph's, and the launch completes with them).

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
}

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
        if let Some(GraphNode {
            kind: NodeKind::MemAlloc { ptr, .. },
            ..
        }) = o.nodes.remove(&n)
        {
            crate::graph_mem::release_va(o, ptr);
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

/// The kernels one launch of `graph` runs, conditional bodies unrolled (`depth`: nesting so far).
/// `values`: the conditional handles' values so far in this launch.
fn kernels_of(
    o: &Objects,
    graph: u64,
    depth: u32,
    values: &mut HashMap<u64, u32>,
    out: &mut Vec<KernelLaunch>,
) -> CuResult<()> {
    let g = o.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if depth > 8 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for n in &g.nodes {
        if out.len() > MAX_EXEC_KERNELS {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        match o.nodes.get(n).map(|n| n.kind) {
            Some(NodeKind::Kernel(k)) => {
                out.push(k);
                if let Some(&(h, v)) = o.cond_setters.get(n) {
                    values.insert(h, v);
                }
                if let Some(e) = o.device_launches.get(n).and_then(|e| o.execs.get(e)) {
                    out.extend_from_slice(&e.kernels);
                }
            }
            Some(NodeKind::Conditional { handle, ty, body }) => {
                let h = o.cond_handles.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let dflt = if h.assign_default { h.default } else { 0 };
                let value = *values.entry(handle).or_insert(dflt);
                let times = match ty {
                    CU_GRAPH_COND_TYPE_WHILE => value,
                    _ => (value != 0) as u32,
                };
                for _ in 0..times {
                    kernels_of(o, body, depth + 1, values, out)?;
                    if out.len() > MAX_EXEC_KERNELS {
                        return Err(CUDA_ERROR_OUT_OF_MEMORY);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// cuGraphInstantiate: snapshots the kernel nodes for the current context.
pub(crate) fn instantiate(o: &mut Objects, sim: &Sim, graph: u64, flags: u64) -> CuResult<u64> {
    let ctx = crate::context::current(o, sim)?;
    let mut kernels = Vec::new();
    kernels_of(o, graph, 0, &mut HashMap::new(), &mut kernels)?;
    let g = o.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let copies = g
        .nodes
        .iter()
        .filter_map(|n| match o.nodes.get(n)?.kind {
            NodeKind::Memcpy(c) => Some(c),
            _ => None,
        })
        .collect();
    let mem_allocs: Vec<u64> = g
        .nodes
        .iter()
        .filter_map(|n| match o.nodes.get(n)?.kind {
            NodeKind::MemAlloc { ptr, .. } => Some(ptr),
            _ => None,
        })
        .collect();
    let mem_frees = g
        .nodes
        .iter()
        .filter_map(|n| match o.nodes.get(n)?.kind {
            NodeKind::MemFree(p) => Some(p),
            _ => None,
        })
        .collect();
    for &p in &mem_allocs {
        crate::graph_mem::retain_va(o, p);
    }
    let h = new_handle(Kind::GraphExec);
    o.execs.insert(
        h,
        GraphExec {
            ctx,
            kernels,
            copies,
            mem_allocs,
            mem_frees,
            grown: Vec::new(),
            flags,
        },
    );
    Ok(h)
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

//! CUDA graph memory nodes: charged like pools, by the device's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
//!
//! Alloc nodes (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured from a stream) take memory from the
//! device's graph pool when a graph exec is uploaded or launched; the pool keeps it reserved for later launches
//! until `cuDeviceGraphMemTrim` or the exec's destruction. At instantiation we walk the graph once
//! (`cuGraphGetNodes` / `cuGraphNodeGetType` / `cuGraphMemAllocNodeGetParams`) and record, for an exec with
//! alloc nodes, its footprint per device (the sizes summed, granularity-rounded). Uploading or launching such
//! an exec admits `footprint − (reserved − used)` first (refused → `CUDA_ERROR_OUT_OF_MEMORY`, driver not
//! called), then charges the real change of the reserved size and drops the provisional charge. Trim and exec
//! destruction re-read the reserved size. An exec without alloc nodes costs one lock-free probe per launch.

use crate::devices::Dev;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::charge::Charge;
use crate::memory::reconcile::Use;
use crate::state::Shim;

/// Child graphs nested deeper than this are not walked (fail closed: such a graph's instantiation is refused).
const MAX_DEPTH: u32 = 64;

/// Per device, what the alloc nodes of `graph` and of its child graphs (`CU_GRAPH_NODE_TYPE_GRAPH`, which may
/// hold memory nodes when moved into the node) add up to, granularity-rounded; empty without alloc nodes.
/// `None`: the driver could not list a graph, or the nesting is deeper than [`MAX_DEPTH`].
fn footprint(s: &Shim, graph: CUgraph) -> Option<Vec<(Dev, u64)>> {
    let mut out: Vec<(Dev, u64)> = Vec::new();
    walk(s, graph, 0, &mut out).then_some(out)
}

fn walk(s: &Shim, graph: CUgraph, depth: u32, out: &mut Vec<(Dev, u64)>) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let mut n: usize = 0;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    if !unsafe { s.cuda.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.ok() {
        return false;
    }
    if n == 0 {
        return true;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if !unsafe { s.cuda.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.ok() {
        return false;
    }
    for &node in nodes.iter().take(n) {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        if !unsafe { s.cuda.cuGraphNodeGetType(node, &mut ty) }.ok() {
            continue;
        }
        if ty == CU_GRAPH_NODE_TYPE_GRAPH {
            let mut child: CUgraph = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            if !unsafe { s.cuda.cuGraphChildGraphNodeGetGraph(node, &mut child) }.ok()
                || !walk(s, child, depth + 1, out)
            {
                return false;
            }
            continue;
        }
        if ty != CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer of the parameter struct.
        if !unsafe { s.cuda.cuGraphMemAllocNodeGetParams(node, &mut p) }.ok() {
            continue;
        }
        let loc = p.poolProps.location;
        if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            continue;
        }
        let Some(dev) = s.devices.device(&s.cuda, loc.id) else {
            continue;
        };
        let bytes = s.devices.round(&s.cuda, dev, p.bytesize as u64);
        match out.iter_mut().find(|e| e.0 == dev) {
            Some(e) => e.1 += bytes,
            None => out.push((dev, bytes)),
        }
    }
    true
}

/// `cuGraphInstantiate` (bare, `_v2`), `cuGraphInstantiateWithFlags`, `cuGraphInstantiateWithParams` (+ `_ptsz`):
/// records the exec's graph-memory footprint.
///
/// # Safety
/// `pexec` as the driver's contract says (written on success).
pub(crate) unsafe fn instantiate(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pexec: *mut CUgraphExec,
    graph: CUgraph,
) -> CUresult {
    let r = call();
    if r.ok() && !pexec.is_null() {
        // SAFETY: written by the driver on success.
        let exec = unsafe { *pexec };
        let Some(fp) = footprint(s, graph) else {
            // Memory nodes we cannot see would escape the cap: refuse the exec (fail closed).
            // SAFETY: destroying the exec the driver just made.
            unsafe { s.cuda.cuGraphExecDestroy(exec) };
            return CUresult::ERROR_NOT_SUPPORTED;
        };
        s.mem.graph().set_exec(exec as usize, fp);
    }
    r
}

/// `cuGraphExecUpdate` (`_v2`, and the 10.2 form): the exec now runs `graph`'s parameters, alloc nodes' sizes
/// included if the driver takes them; its footprint becomes, per device, the larger of the old and the new
/// (whichever the driver kept, the launch is admitted for it). The graph is walked before the call: one whose
/// memory nodes cannot be listed (nested past [`MAX_DEPTH`], or not a graph) is refused, as at instantiation.
/// `exec`'s work changed (updated, or destroyed: its handle may come back): its first launch is a first use
/// again, and its duration is measured again before priority trusts it.
fn exec_changed(s: &Shim, exec: CUgraphExec) {
    s.mem.forget_use(Use::Graph, exec as usize);
    s.throttle
        .work_changed(crate::throttle::estimate::graph_key(exec as usize));
}

pub(crate) fn exec_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    graph: CUgraph,
) -> CUresult {
    let Some(fp) = walked(s, "cuGraphExecUpdate", exec, graph) else {
        return CUresult::ERROR_NOT_SUPPORTED;
    };
    let r = call();
    if r.ok() {
        s.mem.graph().merge_exec(exec as usize, &fp, false);
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecKernelNodeSetParams` (+ `_v2`): a kernel node of the exec takes another kernel, whose stack
/// growth and lazy loading the exec's next launch must admit again (no memory node can change here).
pub(crate) fn exec_kernel_update(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec) -> CUresult {
    let r = call();
    if r.ok() {
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecChildGraphNodeSetParams`: a child graph node of the exec takes `child`'s parameters. cuda.h
/// allows no memory nodes there (the child is cloned); if a driver took some, they are added to the footprint.
pub(crate) fn exec_child_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    child: CUgraph,
) -> CUresult {
    let Some(fp) = walked(s, "cuGraphExecChildGraphNodeSetParams", exec, child) else {
        return CUresult::ERROR_NOT_SUPPORTED;
    };
    let r = call();
    if r.ok() {
        s.mem.graph().merge_exec(exec as usize, &fp, true);
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecNodeSetParams`: as [`exec_child_update`] for a child graph node (cuda.h refuses the call for
/// memory nodes).
///
/// # Safety
/// `params` as the driver's contract says.
pub(crate) unsafe fn exec_node_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    let child = if params.is_null() {
        None
    } else {
        // SAFETY: `CUgraphNodeParams` starts with its `CUgraphNodeType type` and holds its union at offset
        // 16, whose child-graph member starts with the `CUgraph` (cuda.h; checked by the driver list's
        // signature test only as a pointer, so read as such).
        unsafe {
            let p = params.cast::<u8>();
            (p.cast::<CUgraphNodeType>().read_unaligned() == CU_GRAPH_NODE_TYPE_GRAPH)
                .then(|| p.add(16).cast::<CUgraph>().read_unaligned())
        }
    };
    let Some(child) = child else {
        // A kernel (or other) node changed: the next launch is a first use of whatever it runs now.
        let r = call();
        if r.ok() {
            exec_changed(s, exec);
        }
        return r;
    };
    let Some(fp) = walked(s, "cuGraphExecNodeSetParams", exec, child) else {
        return CUresult::ERROR_NOT_SUPPORTED;
    };
    let r = call();
    if r.ok() {
        s.mem.graph().merge_exec(exec as usize, &fp, true);
        exec_changed(s, exec);
    }
    r
}

/// `graph`'s footprint, walked before `what` gives its memory nodes to `exec`; `None` (logged): the update is
/// refused, as an instantiation would be (fail closed: an exec whose footprint is unknown is never launched).
fn walked(s: &Shim, what: &str, exec: CUgraphExec, graph: CUgraph) -> Option<Vec<(Dev, u64)>> {
    let fp = footprint(s, graph);
    if fp.is_none() {
        log!(
            Level::Error,
            "{what} of graph exec {exec:p} refused: the memory nodes of graph {graph:p} cannot be listed \
             (child graphs nested deeper than {MAX_DEPTH}, or not a graph), so the memory cap could not be kept"
        );
    }
    fp
}

/// Upload or launch of an exec with alloc nodes: admit what its footprint may add, call, settle to the truth.
pub(crate) fn with_graph_memory(s: &Shim, exec: CUgraphExec, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(fp) = s.mem.graph().footprint(exec as usize) else {
        return call();
    };
    let mut charges: Vec<Charge<'_>> = Vec::with_capacity(fp.len());
    for &(dev, bytes) in &fp {
        let est = || bytes.saturating_sub(s.mem.graph_slack(&s.cuda, dev));
        let charge = s.mem.charge(dev, est(), &s.cuda, &s.nvml).or_else(|_| {
            // Memory may have been released behind our back (a context's teardown): re-read, retry once.
            s.mem.refresh_graph(&s.cuda, dev);
            s.mem.charge(dev, est(), &s.cuda, &s.nvml)
        });
        let Ok(charge) = charge else {
            return CUresult::ERROR_OUT_OF_MEMORY; // the charges so far go back with their guards
        };
        charges.push(charge);
    }
    let r = call();
    for charge in charges {
        // Charge the real growth first, then drop the provisional charge: the sum never dips below the truth.
        s.mem.refresh_graph(&s.cuda, charge.dev());
        drop(charge);
    }
    r
}

/// `cuGraphUpload` (+ `_ptsz`): uploading may reserve the exec's graph memory.
pub(crate) fn upload(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec) -> CUresult {
    if !s.mem.graph().has_memory(exec as usize) {
        return call();
    }
    with_graph_memory(s, exec, call)
}

/// `cuGraphExecDestroy`: the pool may release what the exec held.
pub(crate) fn exec_destroy(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec) -> CUresult {
    let had = s.mem.graph().has_memory(exec as usize);
    let r = call();
    if r.ok() {
        // An exec created later at this address is not this one.
        exec_changed(s, exec);
    }
    if r.ok() && had {
        s.mem.graph().forget_exec(exec as usize);
        s.mem.refresh_graph_all(&s.cuda);
    }
    r
}

/// `cuDeviceGraphMemTrim`.
pub(crate) fn trim(s: &Shim, call: impl FnOnce() -> CUresult, device: CUdevice) -> CUresult {
    let r = call();
    if r.ok() {
        if let Some(dev) = s.devices.device(&s.cuda, device) {
            s.mem.refresh_graph(&s.cuda, dev);
        }
    }
    r
}

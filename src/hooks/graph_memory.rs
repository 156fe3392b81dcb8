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
//!
//! The same walk lists the exec's kernels (kernel nodes, child graphs, conditional nodes' bodies, recorded when
//! `cuGraphAddNode` made them): the largest local memory per thread among them is the stack the exec's first
//! launch or upload in a context makes the driver grow, and each kernel's code is loaded before that launch (its
//! module's or library's footprint admitted as a direct first launch's is), both in `context::first_launch`,
//! one routine for every path. Updates (`cuGraphExecUpdate`, `cuGraphExec*SetParams`)
//! record the new need and make the next launch a first use again.

use crate::devices::Dev;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::charge::Charge;
use crate::memory::pools::Kernels;
use crate::memory::reconcile::Use;
use crate::state::Shim;

/// Child graphs and conditional bodies nested deeper than this are not walked (fail closed: such a graph's
/// instantiation is refused).
const MAX_DEPTH: u32 = 64;

/// Most body graphs of a conditional node we read (cuda.h: 1 or 2, any number for a SWITCH).
const MAX_BODIES: u32 = 4096;

/// What a walk of a graph found.
#[derive(Default)]
struct Walked {
    /// Per device, what its alloc nodes add up to, granularity-rounded; empty without alloc nodes.
    mem: Vec<(Dev, u64)>,
    /// The kernels it may run.
    kernels: Kernels,
    /// A node whose type, a kernel node whose kernel or a memory node whose size could not be read, or a
    /// conditional node whose bodies we never saw (made past cuquota, or a clone's not covered by the record
    /// made when cloned).
    unknown: bool,
}

/// The memory nodes and the kernels of `graph`, its child graphs (`CU_GRAPH_NODE_TYPE_GRAPH`, which may hold
/// memory nodes when moved into the node) and its conditional nodes' bodies (whether they run is decided on the
/// device). `None`: the driver could not list a graph, the nesting is deeper than [`MAX_DEPTH`], or, while a
/// memory cap may apply, a node's type, a kernel or memory node's parameters could not be read or a
/// conditional node's bodies are unknown (without a cap those price nothing: a cap set later measures the exec's first launch after it).
fn footprint(s: &Shim, graph: CUgraph) -> Option<Walked> {
    let w = walk(s, graph, 0)?;
    if w.unknown {
        s.devices.refresh_if_changed();
        if s.devices.memory_limited() {
            return None;
        }
    }
    Some(w)
}

fn walk(s: &Shim, graph: CUgraph, depth: u32) -> Option<Walked> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut out = Walked::default();
    let mut n: usize = 0;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    if !unsafe { s.cuda.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.ok() {
        return None;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if n > 0 && !unsafe { s.cuda.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.ok() {
        return None;
    }
    for &node in nodes.iter().take(n) {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        if !unsafe { s.cuda.cuGraphNodeGetType(node, &mut ty) }.ok() {
            // Any kind of node, a kernel or a memory node among them.
            out.unknown = true;
            continue;
        }
        match ty {
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                if !unsafe { s.cuda.cuGraphChildGraphNodeGetGraph(node, &mut child) }.ok() {
                    return None;
                }
                out.merge(walk(s, child, depth + 1)?);
            }
            CU_GRAPH_NODE_TYPE_CONDITIONAL => match s.mem.graph().bodies(node as usize) {
                Some(bodies) => {
                    for b in bodies {
                        out.merge(walk(s, b as CUgraph, depth + 1)?);
                    }
                }
                // A clone's: its bodies are the original's, as they were when cloned.
                None => match s.mem.graph().floor(node as usize) {
                    Some(floor) => out.kernels.merge(floor),
                    None => out.unknown = true,
                },
            },
            CU_GRAPH_NODE_TYPE_KERNEL => {
                match kernel_node(s, node).and_then(|(f, k)| Some((super::stack::node_local(s, f, k)?, f, k)))
                {
                    Some((local, f, k)) => out.kernels.merge(Kernels {
                        local,
                        funcs: handle(f, k),
                    }),
                    None => out.unknown = true,
                }
            }
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: zeroed is a valid value of this plain C struct.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: valid out-pointer of the parameter struct.
                if !unsafe { s.cuda.cuGraphMemAllocNodeGetParams(node, &mut p) }.ok() {
                    out.unknown = true;
                    continue;
                }
                let loc = p.poolProps.location;
                if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                    continue;
                }
                let Some(d) = s.devices.device(&s.cuda, loc.id) else {
                    continue;
                };
                let bytes = s.devices.round(&s.cuda, d, p.bytesize as u64);
                out.merge(Walked {
                    mem: vec![(d, bytes)],
                    ..Walked::default()
                });
            }
            _ => {}
        }
    }
    Some(out)
}

/// The handle a kernel node's parameters launch (`kern` when `func` is NULL), if any.
fn handle(func: CUfunction, kern: CUkernel) -> Vec<usize> {
    let f = if func.is_null() {
        kern as usize
    } else {
        func as usize
    };
    (f != 0).then_some(f).into_iter().collect()
}

/// The function and the library kernel (when the function is NULL) a kernel node runs; `None`: not readable.
fn kernel_node(s: &Shim, node: CUgraphNode) -> Option<(CUfunction, CUkernel)> {
    // SAFETY: zeroed is a valid value of these plain C structs.
    let mut p: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer of the v2 parameter struct.
    match unsafe { s.cuda.cuGraphKernelNodeGetParams_v2(node, &mut p) } {
        r if r.ok() => Some((p.func, p.kern)),
        // A driver older than CUDA 12.0: the v1 form (no library kernels then).
        CUresult::ERROR_NOT_FOUND => {
            // SAFETY: as above.
            let mut p1: CUDA_KERNEL_NODE_PARAMS_v1 = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointer of the v1 parameter struct.
            unsafe { s.cuda.cuGraphKernelNodeGetParams(node, &mut p1) }
                .ok()
                .then_some((p1.func, std::ptr::null_mut()))
        }
        _ => None,
    }
}

impl Walked {
    fn merge(&mut self, o: Walked) {
        for (dev, bytes) in o.mem {
            match self.mem.iter_mut().find(|e| e.0 == dev) {
                Some(e) => e.1 = e.1.saturating_add(bytes),
                None => self.mem.push((dev, bytes)),
            }
        }
        self.kernels.merge(o.kernels);
        self.unknown |= o.unknown;
    }
}

/// `cuGraphInstantiate` (bare, `_v2`), `cuGraphInstantiateWithFlags`, `cuGraphInstantiateWithParams` (+ `_ptsz`):
/// records the exec's graph-memory footprint and the stack its kernels need.
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
        let Some(fp) = walked(s, "cuGraphInstantiate", exec, graph) else {
            // Memory nodes or kernels we cannot see would escape the cap: refuse the exec (fail closed).
            // SAFETY: destroying the exec the driver just made.
            unsafe { s.cuda.cuGraphExecDestroy(exec) };
            return CUresult::ERROR_NOT_SUPPORTED;
        };
        s.mem.graph().set_exec(exec as usize, fp.mem);
        s.mem.graph().set_kernels(exec as usize, fp.kernels, false);
    }
    r
}

/// `cuGraphInstantiateWithParams` (+ `_ptsz`): as [`instantiate`]. With `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the
/// driver would upload the exec (its stack, its graph memory) inside the call, before any admission: it is
/// instantiated without the flag, then uploaded through [`upload`] into the params' stream (refused: the exec is
/// destroyed and the upload's error returned), and the program's flags are given back.
///
/// # Safety
/// `pexec` and `params` as the driver's contract says.
pub(crate) unsafe fn instantiate_with_params(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ds: DefaultStream,
) -> CUresult {
    // SAFETY: NULL or the program's struct (the driver's contract).
    let flags = unsafe { params.as_ref() }.map_or(0, |p| p.flags);
    if flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD == 0 {
        // SAFETY: the caller's contract.
        return unsafe { instantiate(s, call, pexec, graph) };
    }
    // SAFETY: non-NULL (its flags were read); the program's struct, read and written only during its call.
    let r = unsafe {
        (*params).flags = flags & !CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
        let r = instantiate(s, call, pexec, graph);
        (*params).flags = flags;
        r
    };
    if !r.ok() || pexec.is_null() {
        return r;
    }
    // SAFETY: written by the driver on success; the params' stream, as the program gave it.
    let (exec, stream) = unsafe { (*pexec, (*params).hUploadStream) };
    let real = || match ds {
        // SAFETY: the program's exec and stream, as cuGraphUpload takes them.
        DefaultStream::Legacy => unsafe { s.cuda.cuGraphUpload(exec, stream) },
        // SAFETY: as above.
        DefaultStream::PerThread => unsafe { s.cuda.cuGraphUpload_ptsz(exec, stream) },
    };
    let u = upload(s, real, exec, stream, ds);
    if !u.ok() {
        // SAFETY: destroying the exec just made.
        exec_destroy(s, || unsafe { s.cuda.cuGraphExecDestroy(exec) }, exec);
        // SAFETY: as above.
        unsafe { (*params).result_out = CUDA_GRAPH_INSTANTIATE_ERROR };
        return u;
    }
    r
}

/// `exec`'s work changed (updated, or destroyed: its handle may come back): its first launch is a first use
/// again, and its duration is measured again before priority trusts it.
fn exec_changed(s: &Shim, exec: CUgraphExec) {
    s.mem.forget_use(Use::Graph, exec as usize);
    s.throttle
        .work_changed(crate::throttle::estimate::graph_key(exec as usize));
}

/// `cuGraphExecUpdate` (`_v2`, and the 10.2 form): the exec now runs `graph`'s parameters, alloc nodes' sizes
/// included if the driver takes them; its footprint becomes, per device, the larger of the old and the new
/// (whichever the driver kept, the launch is admitted for it), its stack need the new graph's. The graph is walked
/// before the call: one that cannot be walked is refused, as at instantiation.
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
        s.mem.graph().merge_exec(exec as usize, &fp.mem, false);
        s.mem.graph().set_kernels(exec as usize, fp.kernels, false);
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecKernelNodeSetParams` (`_v2`: `v2`; the bare form takes the v1 struct): a kernel node of the
/// exec takes another kernel, whose stack the exec's next launch admits (the exec's need rises to it; no memory
/// node can change here).
///
/// # Safety
/// `params` as the driver's contract says.
pub(crate) unsafe fn exec_kernel_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    params: *const CUDA_KERNEL_NODE_PARAMS,
    v2: bool,
) -> CUresult {
    let (local, funcs) = if params.is_null() {
        (Some(0), Vec::new())
    } else {
        // SAFETY: the driver's contract: a v2 struct, or (bare form) a v1 struct, which is the v2 one's prefix.
        let (func, kern) = unsafe {
            let p = params.cast::<CUDA_KERNEL_NODE_PARAMS_v1>().read_unaligned();
            let kern = if v2 { (*params).kern } else { std::ptr::null_mut() };
            (p.func, kern)
        };
        (super::stack::node_local(s, func, kern), handle(func, kern))
    };
    let Some(local) = local.or_else(|| {
        s.devices.refresh_if_changed();
        (!s.devices.memory_limited()).then_some(0)
    }) else {
        log!(
            Level::Error,
            "kernel node update of graph exec {exec:p} refused: the driver will not give the new kernel's local \
             memory size, so the memory cap could not be kept"
        );
        return CUresult::ERROR_NOT_SUPPORTED;
    };
    let r = call();
    if r.ok() {
        s.mem
            .graph()
            .set_kernels(exec as usize, Kernels { local, funcs }, true);
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecChildGraphNodeSetParams`: a child graph node of the exec takes `child`'s parameters. cuda.h
/// allows no memory nodes there (the child is cloned); if a driver took some, they are added to the footprint.
/// The exec's stack need rises to the child's.
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
        s.mem.graph().merge_exec(exec as usize, &fp.mem, true);
        s.mem.graph().set_kernels(exec as usize, fp.kernels, true);
        exec_changed(s, exec);
    }
    r
}

/// `cuGraphExecNodeSetParams`: as [`exec_child_update`] for a child graph node, as [`exec_kernel_update`] for
/// a kernel node (cuda.h refuses the call for memory nodes).
///
/// # Safety
/// `params` as the driver's contract says.
pub(crate) unsafe fn exec_node_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    if params.is_null() {
        return call();
    }
    let p = params.cast::<u8>();
    // SAFETY: `CUgraphNodeParams` starts with its `CUgraphNodeType type` and holds its union at offset 16
    // (cuda.h; checked by the struct test of the simulator, here read by offset).
    let ty = unsafe { p.cast::<CUgraphNodeType>().read_unaligned() };
    match ty {
        // SAFETY: the union's kernel member, `CUDA_KERNEL_NODE_PARAMS_v3`, has the v2 layout.
        CU_GRAPH_NODE_TYPE_KERNEL => unsafe {
            exec_kernel_update(s, call, exec, p.add(16).cast::<CUDA_KERNEL_NODE_PARAMS>(), true)
        },
        // SAFETY: the union's child-graph member starts with its `CUgraph`.
        CU_GRAPH_NODE_TYPE_GRAPH => exec_child_update(s, call, exec, unsafe {
            p.add(16).cast::<CUgraph>().read_unaligned()
        }),
        _ => {
            // Another node changed: the next launch is a first use of whatever the exec runs now.
            let r = call();
            if r.ok() {
                exec_changed(s, exec);
            }
            r
        }
    }
}

/// `graph`'s walk, before or after `what` gives its memory nodes and kernels to `exec`; `None` (logged): the call
/// is refused (fail closed: an exec whose footprint or stack need is unknown is never launched).
fn walked(s: &Shim, what: &str, exec: CUgraphExec, graph: CUgraph) -> Option<Walked> {
    let fp = footprint(s, graph);
    if fp.is_none() {
        log!(
            Level::Error,
            "{what} of graph exec {exec:p} refused: the memory nodes or kernels of graph {graph:p} cannot be \
             listed (child graphs or conditional bodies nested deeper than {MAX_DEPTH}, a kernel node's parameters \
             refused, a conditional node made where cuquota did not see it, or not a graph), so the memory cap \
             could not be kept"
        );
    }
    fp
}

/// `cuGraphAddNode` (+ `_v2`): a conditional node's body graphs are recorded (cuda.h lists them only here, in
/// `phGraph_out`); a child graph node that clones its graph records what the clone's kernels need.
///
/// # Safety
/// `node` and `params` as the driver's contract says.
pub(crate) unsafe fn add_node(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    node: *mut CUgraphNode,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    let r = call();
    if !r.ok() || node.is_null() || params.is_null() {
        return r;
    }
    let p = params.cast::<u8>();
    // SAFETY: written by the driver on success; `CUgraphNodeParams`: the type at 0, the union at 16. Its
    // conditional member: handle (8 bytes), type, size (4 each), then `CUgraph *phGraph_out` (driver-owned,
    // `size` entries, valid for the node's lifetime); its child-graph member: the graph, then the ownership.
    unsafe {
        let n = *node;
        let u = p.add(16);
        match p.cast::<CUgraphNodeType>().read_unaligned() {
            CU_GRAPH_NODE_TYPE_CONDITIONAL => {
                let size = u.add(12).cast::<u32>().read_unaligned();
                let out = u.add(16).cast::<*const CUgraph>().read_unaligned();
                if !out.is_null() && size <= MAX_BODIES {
                    let bodies = std::slice::from_raw_parts(out, size as usize);
                    s.mem
                        .graph()
                        .set_bodies(n as usize, bodies.iter().map(|&b| b as usize).collect());
                }
            }
            CU_GRAPH_NODE_TYPE_GRAPH if u.add(8).cast::<u32>().read_unaligned() == CHILD_GRAPH_CLONE => {
                cloned_into(s, n, u.cast::<CUgraph>().read_unaligned());
            }
            _ => {}
        }
    }
    r
}

/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE` (cuda.h's default for a child graph node).
const CHILD_GRAPH_CLONE: u32 = 0;

/// `cuGraphAddChildGraphNode`: the node holds a clone of `child`.
///
/// # Safety
/// `node` as the driver's contract says (written on success).
pub(crate) unsafe fn add_child(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    node: *mut CUgraphNode,
    child: CUgraph,
) -> CUresult {
    let r = call();
    if r.ok() && !node.is_null() {
        // SAFETY: written by the driver on success.
        cloned_into(s, unsafe { *node }, child);
    }
    r
}

/// Child graph node `node` holds a clone of `original`: the clone's need is recorded.
fn cloned_into(s: &Shim, node: CUgraphNode, original: CUgraph) {
    let mut clone: CUgraph = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if unsafe { s.cuda.cuGraphChildGraphNodeGetGraph(node, &mut clone) }.ok() {
        clone_of(s, clone, original);
    }
}

/// `clone` is a copy of `original` (its conditional nodes new handles whose bodies no call lists): each of
/// those it holds now, in its child graphs too, needs at most what `original` does now. Nodes added to the clone
/// later are not covered (one made past cuquota stays unknown). An original that cannot be walked, or holds a
/// conditional node of unknown bodies, records nothing (the clone's conditional nodes then make its
/// instantiation refused under a cap).
fn clone_of(s: &Shim, clone: CUgraph, original: CUgraph) {
    if let Some(w) = footprint(s, original).filter(|w| !w.unknown) {
        cover(s, clone, &w.kernels, 0);
    }
}

/// Records `k` for the conditional nodes of unknown bodies in `graph` and its child graphs.
fn cover(s: &Shim, graph: CUgraph, k: &Kernels, depth: u32) {
    let mut n: usize = 0;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    if depth > MAX_DEPTH || !unsafe { s.cuda.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.ok() {
        return;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if n == 0 || !unsafe { s.cuda.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.ok() {
        return;
    }
    for &node in nodes.iter().take(n) {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        if !unsafe { s.cuda.cuGraphNodeGetType(node, &mut ty) }.ok() {
            continue;
        }
        match ty {
            CU_GRAPH_NODE_TYPE_CONDITIONAL if s.mem.graph().bodies(node as usize).is_none() => {
                s.mem.graph().set_floor(node as usize, k.clone());
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                if unsafe { s.cuda.cuGraphChildGraphNodeGetGraph(node, &mut child) }.ok() {
                    cover(s, child, k, depth + 1);
                }
            }
            _ => {}
        }
    }
}

/// `cuGraphClone`.
///
/// # Safety
/// `pclone` as the driver's contract says (written on success).
pub(crate) unsafe fn clone(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pclone: *mut CUgraph,
    original: CUgraph,
) -> CUresult {
    let r = call();
    if r.ok() && !pclone.is_null() {
        // SAFETY: written by the driver on success.
        clone_of(s, unsafe { *pclone }, original);
    }
    r
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

/// `cuGraphUpload` (+ `_ptsz`): uploading may reserve the exec's graph memory, and sets up its kernels' stack
/// in the stream's context (an exec instantiated for device launch is launched from the device, where no hook
/// sees it, only once uploaded): admitted as its first launch there is (`context::first_launch`).
pub(crate) fn upload(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if s.mem.first_use_armed() {
        let probe = super::probe_stream(stream, ds);
        let Ok(first) = super::context::first_launch(s, Use::Graph, exec as usize, probe) else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = upload_memory(s, call, exec);
        super::context::launched(s, first, probe, r);
        return r;
    }
    upload_memory(s, call, exec)
}

fn upload_memory(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec) -> CUresult {
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
        s.mem.graph().forget_stack(exec as usize);
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

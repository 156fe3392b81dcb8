//! CUDA graphs: the hooks. What a graph's memory nodes and kernels cost, the walk that prices them, what
//! instantiation, updates, added nodes and clones give an exec and the admission of an upload or launch are
//! memory policy (`memory::graphs`: [`Memory::graph_changed`], [`Memory::graph_exec`]); these hooks decode the
//! arguments, tell the throttle an exec's work changed, and destroy an exec memory cannot price.
//!
//! [`Memory::graph_changed`]: crate::memory::Memory::graph_changed
//! [`Memory::graph_exec`]: crate::memory::Memory::graph_exec

use crate::ffi::cuda::*;
use crate::memory::{ExecCall, GraphChange};
use crate::state::Shim;

/// Most body graphs of a conditional node we read (cuda.h: 1 or 2, any number for a SWITCH).
const MAX_BODIES: u32 = 4096;

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
        if s.mem
            .graph_changed(&s.cuda, GraphChange::Instantiated { exec, graph })
            .is_err()
        {
            // Memory nodes or kernels we cannot see would escape the cap: refuse the exec (fail closed).
            // SAFETY: destroying the exec the driver just made.
            unsafe { s.cuda.cuGraphExecDestroy(exec) };
            return CUresult::ERROR_NOT_SUPPORTED;
        }
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

/// `call` changes or destroys `exec` (its handle may come back): memory records it ([`ExecCall`]); once done,
/// the exec's duration is measured again before priority trusts it.
fn exec_call(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec, what: ExecCall) -> CUresult {
    let r = s.mem.graph_exec(&s.cuda, &s.nvml, exec, what, call);
    if r.ok() {
        s.throttle
            .work_changed(crate::throttle::estimate::graph_key(exec as usize));
    }
    r
}

/// `cuGraphExecUpdate` (`_v2`, and the 10.2 form): the exec now runs `graph`'s parameters, alloc nodes' sizes
/// included if the driver takes them (an update memory cannot price is refused, as at instantiation).
pub(crate) fn exec_update(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    graph: CUgraph,
) -> CUresult {
    exec_call(s, call, exec, ExecCall::Update(graph))
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
    let (func, kern) = if params.is_null() {
        (std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        // SAFETY: the driver's contract: a v2 struct, or (bare form) a v1 struct, which is the v2 one's prefix.
        unsafe {
            let p = params.cast::<CUDA_KERNEL_NODE_PARAMS_v1>().read_unaligned();
            let kern = if v2 { (*params).kern } else { std::ptr::null_mut() };
            (p.func, kern)
        }
    };
    exec_call(s, call, exec, ExecCall::KernelUpdate { func, kern })
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
    exec_call(s, call, exec, ExecCall::ChildUpdate(child))
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
        // Another node changed: the next launch is a first use of whatever the exec runs now.
        _ => exec_call(s, call, exec, ExecCall::OtherUpdate),
    }
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
                    let bodies = bodies.iter().map(|&b| b as usize).collect();
                    let _ = s
                        .mem
                        .graph_changed(&s.cuda, GraphChange::Bodies { node: n, bodies });
                }
            }
            CU_GRAPH_NODE_TYPE_GRAPH if u.add(8).cast::<u32>().read_unaligned() == CHILD_GRAPH_CLONE => {
                let original = u.cast::<CUgraph>().read_unaligned();
                let _ = s
                    .mem
                    .graph_changed(&s.cuda, GraphChange::ChildCloned { node: n, original });
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
        let node = unsafe { *node };
        let _ = s.mem.graph_changed(
            &s.cuda,
            GraphChange::ChildCloned {
                node,
                original: child,
            },
        );
    }
    r
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
        let clone = unsafe { *pclone };
        let _ = s
            .mem
            .graph_changed(&s.cuda, GraphChange::Cloned { clone, original });
    }
    r
}

/// `cuGraphUpload` (+ `_ptsz`): admitted as the exec's first launch on the stream would be
/// ([`ExecCall::Upload`]).
pub(crate) fn upload(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let stream = super::probe_stream(stream, ds);
    s.mem
        .graph_exec(&s.cuda, &s.nvml, exec, ExecCall::Upload { stream }, call)
}

/// `cuGraphExecDestroy`: the pool may release what the exec held.
pub(crate) fn exec_destroy(s: &Shim, call: impl FnOnce() -> CUresult, exec: CUgraphExec) -> CUresult {
    exec_call(s, call, exec, ExecCall::Destroy)
}

/// `cuDeviceGraphMemTrim`.
pub(crate) fn trim(s: &Shim, call: impl FnOnce() -> CUresult, device: CUdevice) -> CUresult {
    let r = call();
    if r.ok() {
        let _ = s.mem.graph_changed(&s.cuda, GraphChange::Trimmed(device));
    }
    r
}

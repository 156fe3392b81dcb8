//! CUDA graph memory and the stack and code a graph's kernels take: the state ([`GraphMem`]), the walk of a
//! graph that prices it, and the admission of an upload or launch ([`Memory::with_graph_memory`]).
//!
//! Alloc nodes (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured from a stream) take memory from the
//! device's graph pool when a graph exec is uploaded or launched; the pool keeps it reserved for later launches
//! until `cuDeviceGraphMemTrim` or the exec's destruction. At instantiation the graph is walked once
//! (`cuGraphGetNodes` / `cuGraphNodeGetType` / `cuGraphMemAllocNodeGetParams`: [`Memory::graph_walk`]) and,
//! for an exec with alloc nodes, its footprint per device recorded (the sizes summed, granularity-rounded).
//! Uploading or launching such an exec admits `footprint − (reserved − used)` first (refused →
//! `CUDA_ERROR_OUT_OF_MEMORY`, driver not called), then charges the real change of the reserved size
//! (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`) and drops the provisional charge. Trim and exec destruction
//! re-read the reserved size. An exec without alloc nodes costs one lock-free probe per launch.
//!
//! The same walk lists the exec's kernels (kernel nodes, child graphs, conditional nodes' bodies, recorded when
//! `cuGraphAddNode` made them): the largest local memory per thread among them is the stack the exec's first
//! launch or upload in a context makes the driver grow, and each kernel's code is loaded before that launch,
//! both in `Memory::first_launch` (`first_use`), one routine for every path.

use super::charge::Charge;
use super::{stack, Memory};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::locks::Lock;
use crate::log::{log, Level};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Slots of the lock-free set of graph execs with memory alloc nodes.
const EXEC_SLOTS: usize = 4096;
const EXEC_EMPTY: usize = 0;
const EXEC_GONE: usize = 1;

/// CUDA graph memory: per device, the graph pool's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` as charged, and the
/// graph execs that have alloc nodes with their footprint (bytes per device their launches may need).
///
/// Launch hot path: [`GraphMem::has_memory`] probes a fixed open-addressed table of atomics (no lock, no
/// allocation); only execs found there take the footprint lock.
pub(crate) struct GraphMem {
    pub(super) charged: Lock<HashMap<CUdevice, (Dev, u64)>>,
    execs: Box<[std::sync::atomic::AtomicUsize]>,
    /// The table was full once: lookups fall back to `footprints`.
    overflow: AtomicBool,
    pub(super) footprints: Lock<HashMap<usize, Vec<(Dev, u64)>>>,
    /// The kernels' side (the walk's), read at instantiation, updates and first launches only.
    kernels: Lock<GraphKernels>,
}

/// What a graph's kernels need that its first launch or upload must admit: the stack and their code's loading.
#[derive(Default)]
struct GraphKernels {
    /// Per exec, what its kernels need.
    stacks: HashMap<usize, Kernels>,
    /// Conditional node → its body graphs, recorded when it was added (no call of cuda.h lists them after).
    bodies: HashMap<usize, Vec<usize>>,
    /// Conditional node a clone came with → the stack need of the graph it was cloned from when cloned (such a
    /// node is a new handle whose bodies no call can list, and no call can change). Per node, not per graph:
    /// a node added to the clone later is not covered.
    floors: HashMap<usize, Kernels>,
}

/// The kernels a graph may run: the largest local memory per thread among them, and their handles (functions,
/// or library kernels), each once, whose code its first launch in a context loads first (as a direct launch's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Kernels {
    pub local: u64,
    pub funcs: Vec<usize>,
}

impl Kernels {
    /// `o`'s kernels too.
    pub(crate) fn merge(&mut self, o: Kernels) {
        self.local = self.local.max(o.local);
        self.funcs.extend(o.funcs);
        self.funcs.sort_unstable();
        self.funcs.dedup();
    }
}

fn exec_slot(exec: usize, i: usize) -> usize {
    let h = (exec as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52;
    (h as usize + i) % EXEC_SLOTS
}

impl GraphMem {
    pub(super) fn new() -> GraphMem {
        GraphMem {
            charged: Lock::new(HashMap::new()),
            execs: (0..EXEC_SLOTS)
                .map(|_| std::sync::atomic::AtomicUsize::new(EXEC_EMPTY))
                .collect(),
            overflow: AtomicBool::new(false),
            footprints: Lock::new(HashMap::new()),
            kernels: Lock::new(GraphKernels::default()),
        }
    }

    /// `exec` runs `k` (`raise`: on top of what it ran).
    pub(crate) fn set_kernels(&self, exec: usize, k: Kernels, raise: bool) {
        let mut g = self.kernels.lock();
        let e = g.stacks.entry(exec).or_default();
        if raise {
            e.merge(k);
        } else {
            *e = k;
        }
    }

    /// The stack per thread `exec`'s kernels need (0: unknown or none).
    pub(crate) fn stack(&self, exec: usize) -> u64 {
        self.kernels.lock().stacks.get(&exec).map_or(0, |k| k.local)
    }

    /// The kernels `exec` may run, as recorded at instantiation and updates.
    pub(crate) fn kernels(&self, exec: usize) -> Vec<usize> {
        self.kernels
            .lock()
            .stacks
            .get(&exec)
            .map_or_else(Vec::new, |k| k.funcs.clone())
    }

    /// `exec` was destroyed.
    pub(crate) fn forget_stack(&self, exec: usize) {
        self.kernels.lock().stacks.remove(&exec);
    }

    /// Conditional node `node` was added with `bodies`.
    pub(crate) fn set_bodies(&self, node: usize, bodies: Vec<usize>) {
        self.kernels.lock().bodies.insert(node, bodies);
    }

    /// The body graphs of conditional node `node`, if it was seen added.
    pub(crate) fn bodies(&self, node: usize) -> Option<Vec<usize>> {
        self.kernels.lock().bodies.get(&node).cloned()
    }

    /// Conditional node `node` came with a clone of a graph whose kernels were `k`.
    pub(crate) fn set_floor(&self, node: usize, k: Kernels) {
        self.kernels.lock().floors.insert(node, k);
    }

    /// What the original of the clone conditional node `node` came with ran (`None`: not such a node).
    pub(crate) fn floor(&self, node: usize) -> Option<Kernels> {
        self.kernels.lock().floors.get(&node).cloned()
    }

    /// Whether `exec` has memory alloc nodes (lock-free unless the table ever overflowed).
    #[inline]
    pub(crate) fn has_memory(&self, exec: usize) -> bool {
        if exec > EXEC_GONE {
            for i in 0..EXEC_SLOTS {
                match self.execs[exec_slot(exec, i)].load(Ordering::Acquire) {
                    EXEC_EMPTY => break,
                    v if v == exec => return true,
                    _ => {}
                }
            }
        }
        self.overflow.load(Ordering::Relaxed) && self.footprints.lock().contains_key(&exec)
    }

    fn unmark(&self, exec: usize) {
        for i in 0..EXEC_SLOTS {
            let slot = &self.execs[exec_slot(exec, i)];
            match slot.load(Ordering::Acquire) {
                EXEC_EMPTY => return,
                v if v == exec => {
                    slot.store(EXEC_GONE, Ordering::Release);
                }
                _ => {}
            }
        }
    }

    /// Records a freshly instantiated exec's footprint (empty: it has no alloc nodes; a reused handle value
    /// is forgotten).
    pub(crate) fn set_exec(&self, exec: usize, footprint: Vec<(Dev, u64)>) {
        self.forget_exec(exec);
        if footprint.is_empty() || exec <= EXEC_GONE {
            return;
        }
        self.footprints.lock().insert(exec, footprint);
        for i in 0..EXEC_SLOTS {
            let slot = &self.execs[exec_slot(exec, i)];
            let cur = slot.load(Ordering::Acquire);
            if (cur == EXEC_EMPTY || cur == EXEC_GONE)
                && slot
                    .compare_exchange(cur, exec, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return;
            }
        }
        self.overflow.store(true, Ordering::Relaxed);
    }

    /// Forgets an exec (destroyed).
    pub(crate) fn forget_exec(&self, exec: usize) {
        if exec > EXEC_GONE {
            self.unmark(exec);
        }
        self.footprints.lock().remove(&exec);
    }

    /// An exec's memory nodes changed (`cuGraphExecUpdate`, a child graph node's new parameters): per device,
    /// `fp` is added to its footprint (`add`) or replaces it where larger.
    pub(crate) fn merge_exec(&self, exec: usize, fp: &[(Dev, u64)], add: bool) {
        if fp.is_empty() {
            return;
        }
        let mut cur = self.footprint(exec).unwrap_or_default();
        for &(dev, bytes) in fp {
            match cur.iter_mut().find(|e| e.0 == dev) {
                Some(e) if add => e.1 = e.1.saturating_add(bytes),
                Some(e) => e.1 = e.1.max(bytes),
                None => cur.push((dev, bytes)),
            }
        }
        self.set_exec(exec, cur);
    }

    /// The footprint of an exec with alloc nodes.
    pub(crate) fn footprint(&self, exec: usize) -> Option<Vec<(Dev, u64)>> {
        self.footprints.lock().get(&exec).cloned()
    }
}

/// Child graphs and conditional bodies nested deeper than this are not walked (fail closed: such a graph's
/// instantiation is refused).
const MAX_DEPTH: u32 = 64;

/// What a walk of a graph found.
#[derive(Default)]
pub(crate) struct Walked {
    /// Per device, what its alloc nodes add up to, granularity-rounded; empty without alloc nodes.
    pub(crate) mem: Vec<(Dev, u64)>,
    /// The kernels it may run.
    pub(crate) kernels: Kernels,
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
fn footprint(m: &Memory, cuda: &CudaTable, graph: CUgraph) -> Option<Walked> {
    let w = walk(m, cuda, graph, 0)?;
    if w.unknown {
        m.devices.refresh_if_changed();
        if m.devices.memory_limited() {
            return None;
        }
    }
    Some(w)
}

fn walk(m: &Memory, cuda: &CudaTable, graph: CUgraph, depth: u32) -> Option<Walked> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut out = Walked::default();
    let mut n: usize = 0;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    if !unsafe { cuda.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.ok() {
        return None;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if n > 0 && !unsafe { cuda.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.ok() {
        return None;
    }
    for &node in nodes.iter().take(n) {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        if !unsafe { cuda.cuGraphNodeGetType(node, &mut ty) }.ok() {
            // Any kind of node, a kernel or a memory node among them.
            out.unknown = true;
            continue;
        }
        match ty {
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                if !unsafe { cuda.cuGraphChildGraphNodeGetGraph(node, &mut child) }.ok() {
                    return None;
                }
                out.merge(walk(m, cuda, child, depth + 1)?);
            }
            CU_GRAPH_NODE_TYPE_CONDITIONAL => match m.graph.bodies(node as usize) {
                Some(bodies) => {
                    for b in bodies {
                        out.merge(walk(m, cuda, b as CUgraph, depth + 1)?);
                    }
                }
                // A clone's: its bodies are the original's, as they were when cloned.
                None => match m.graph.floor(node as usize) {
                    Some(floor) => out.kernels.merge(floor),
                    None => out.unknown = true,
                },
            },
            CU_GRAPH_NODE_TYPE_KERNEL => {
                match kernel_node(cuda, node).and_then(|(f, k)| Some((stack::node_local(cuda, f, k)?, f, k)))
                {
                    Some((local, f, k)) => out.kernels.merge(Kernels {
                        local,
                        funcs: node_handle(f, k),
                    }),
                    None => out.unknown = true,
                }
            }
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: zeroed is a valid value of this plain C struct.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: valid out-pointer of the parameter struct.
                if !unsafe { cuda.cuGraphMemAllocNodeGetParams(node, &mut p) }.ok() {
                    out.unknown = true;
                    continue;
                }
                let loc = p.poolProps.location;
                if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                    continue;
                }
                let Some(d) = m.devices.device(cuda, loc.id) else {
                    continue;
                };
                let bytes = m.devices.round(cuda, d, p.bytesize as u64);
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
pub(crate) fn node_handle(func: CUfunction, kern: CUkernel) -> Vec<usize> {
    let f = if func.is_null() {
        kern as usize
    } else {
        func as usize
    };
    (f != 0).then_some(f).into_iter().collect()
}

/// The function and the library kernel (when the function is NULL) a kernel node runs; `None`: not readable.
fn kernel_node(cuda: &CudaTable, node: CUgraphNode) -> Option<(CUfunction, CUkernel)> {
    // SAFETY: zeroed is a valid value of these plain C structs.
    let mut p: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer of the v2 parameter struct.
    match unsafe { cuda.cuGraphKernelNodeGetParams_v2(node, &mut p) } {
        r if r.ok() => Some((p.func, p.kern)),
        // A driver older than CUDA 12.0: the v1 form (no library kernels then).
        CUresult::ERROR_NOT_FOUND => {
            // SAFETY: as above.
            let mut p1: CUDA_KERNEL_NODE_PARAMS_v1 = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointer of the v1 parameter struct.
            unsafe { cuda.cuGraphKernelNodeGetParams(node, &mut p1) }
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

/// `clone` is a copy of `original` (its conditional nodes new handles whose bodies no call lists): each of
/// those it holds now, in its child graphs too, needs at most what `original` does now. Nodes added to the clone
/// later are not covered (one made past cuquota stays unknown). An original that cannot be walked, or holds a
/// conditional node of unknown bodies, records nothing (the clone's conditional nodes then make its
/// instantiation refused under a cap).
pub(crate) fn clone_of(m: &Memory, cuda: &CudaTable, clone: CUgraph, original: CUgraph) {
    if let Some(w) = footprint(m, cuda, original).filter(|w| !w.unknown) {
        cover(m, cuda, clone, &w.kernels, 0);
    }
}

/// Records `k` for the conditional nodes of unknown bodies in `graph` and its child graphs.
fn cover(m: &Memory, cuda: &CudaTable, graph: CUgraph, k: &Kernels, depth: u32) {
    let mut n: usize = 0;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    if depth > MAX_DEPTH || !unsafe { cuda.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.ok() {
        return;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if n == 0 || !unsafe { cuda.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.ok() {
        return;
    }
    for &node in nodes.iter().take(n) {
        let mut ty = CUgraphNodeType::MAX;
        // SAFETY: valid out-pointer.
        if !unsafe { cuda.cuGraphNodeGetType(node, &mut ty) }.ok() {
            continue;
        }
        match ty {
            CU_GRAPH_NODE_TYPE_CONDITIONAL if m.graph.bodies(node as usize).is_none() => {
                m.graph.set_floor(node as usize, k.clone());
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                if unsafe { cuda.cuGraphChildGraphNodeGetGraph(node, &mut child) }.ok() {
                    cover(m, cuda, child, k, depth + 1);
                }
            }
            _ => {}
        }
    }
}

impl Memory {
    /// `graph`'s walk, before or after `what` gives its memory nodes and kernels to `exec`; `None` (logged): the call
    /// is refused (fail closed: an exec whose footprint or stack need is unknown is never launched).
    pub(crate) fn graph_walk(
        &self,
        cuda: &CudaTable,
        what: &str,
        exec: CUgraphExec,
        graph: CUgraph,
    ) -> Option<Walked> {
        let fp = footprint(self, cuda, graph);
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

    fn graph_attr(cuda: &CudaTable, ordinal: CUdevice, attr: CUgraphMem_attribute) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
        let r = unsafe { cuda.cuDeviceGetGraphMemAttribute(ordinal, attr, (&mut v as *mut u64).cast()) };
        r.ok().then_some(v)
    }

    /// Re-reads a device's reserved graph memory and charges (unconditionally) or releases the difference.
    pub(crate) fn refresh_graph(&self, cuda: &CudaTable, dev: Dev) {
        let mut charged = self.graph.charged.lock();
        let Some(reserved) = Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        else {
            return;
        };
        let e = charged.entry(dev.ordinal).or_insert((dev, 0));
        if reserved > e.1 {
            self.force(dev, reserved - e.1);
        } else {
            self.release(dev, e.1 - reserved);
        }
        e.1 = reserved;
    }

    /// Re-reads every device whose graph memory we charge.
    pub(crate) fn refresh_graph_all(&self, cuda: &CudaTable) {
        let devs: Vec<Dev> = self.graph.charged.lock().values().map(|e| e.0).collect();
        for d in devs {
            self.refresh_graph(cuda, d);
        }
    }

    /// Upload or launch (`call`) of graph exec `exec`: with alloc nodes, what its footprint may add on each
    /// device (`footprint − (reserved − used)`) is admitted first (refused: `CUDA_ERROR_OUT_OF_MEMORY`, the
    /// driver not called), then the real change of the graph pools' reserved size is charged and the
    /// provisional charge dropped. An exec without alloc nodes costs one lock-free probe.
    #[inline]
    pub(crate) fn with_graph_memory(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        exec: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.graph.has_memory(exec) {
            return call();
        }
        let Some(fp) = self.graph.footprint(exec) else {
            return call();
        };
        let mut charges: Vec<Charge<'_>> = Vec::with_capacity(fp.len());
        for &(dev, bytes) in &fp {
            let est = || bytes.saturating_sub(self.graph_slack(cuda, dev));
            let charge = self.charge(dev, est(), cuda, nvml).or_else(|_| {
                // Memory may have been released behind our back (a context's teardown): re-read, retry once.
                self.refresh_graph(cuda, dev);
                self.charge(dev, est(), cuda, nvml)
            });
            let Ok(charge) = charge else {
                return CUresult::ERROR_OUT_OF_MEMORY; // the charges so far go back with their guards
            };
            charges.push(charge);
        }
        let r = call();
        for charge in charges {
            // Charge the real growth first, then drop the provisional charge: the sum never dips below the truth.
            self.refresh_graph(cuda, charge.dev());
            drop(charge);
        }
        r
    }

    /// Graph memory reserved on `dev` but not in use, as far as we charged it: what a launch can reuse.
    fn graph_slack(&self, cuda: &CudaTable, dev: Dev) -> u64 {
        let charged = self.graph.charged.lock().get(&dev.ordinal).map_or(0, |e| e.1);
        if charged == 0 {
            return 0;
        }
        match (
            Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
            Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(r), Some(u)) => r.saturating_sub(u).min(charged),
            _ => 0,
        }
    }
}

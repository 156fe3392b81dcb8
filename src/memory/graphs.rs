//! CUDA graph memory and the stack and code a graph's kernels take: the family ([`Graphs`]: it owns its state,
//! asks the driver through [`Driver`] and moves the charge through [`Charges`]), the walk of a graph that
//! prices it, and the two doors hooks use, which compose it with first use and admission:
//! [`Memory::graph_changed`] (a graph or exec was made, a node added, a pool trimmed) and [`Memory::graph_exec`]
//! (an exec's update, upload, launch or destruction, around the driver's call), [`Graphs::with_memory`]
//! admitting an upload or launch.
//!
//! Alloc nodes (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured from a stream) take memory from the
//! device's graph pool when a graph exec is uploaded or launched; the pool keeps it reserved for later launches
//! until `cuDeviceGraphMemTrim` or the exec's destruction. At instantiation the graph is walked once
//! (`cuGraphGetNodes` / `cuGraphNodeGetType` / `cuGraphMemAllocNodeGetParams`: [`Graphs::walk`]) and,
//! for an exec with alloc nodes, its footprint per device recorded (the sizes summed, granularity-rounded).
//! Uploading or launching such an exec admits `footprint − (reserved − used)` first (refused →
//! `CUDA_ERROR_OUT_OF_MEMORY`, driver not called), then charges the real change of the reserved size
//! (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`) and drops the provisional charge. Trim and exec destruction
//! re-read the reserved size. An exec without alloc nodes costs one lock-free probe per launch.
//!
//! The same walk lists the exec's kernels (kernel nodes, child graphs, conditional nodes' bodies, recorded when
//! `cuGraphAddNode` made them): the largest local memory per thread among them is the stack the exec's first
//! launch or upload in a context makes the driver grow, and each kernel's code is loaded before that launch,
//! both in `FirstUse::first_launch` (`first_use`), one routine for every path.

use super::driver::Driver;
use super::first_use::Use;
use super::pools::Charges;
use super::{stack, Memory, OverCap};
use crate::devices::{Dev, Devices};
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::locks::{hold_all, release_all, Lock, Side};
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
/// Launch hot path: [`Graphs::has_memory`] probes a fixed open-addressed table of atomics (no lock, no
/// allocation); only execs found there take the footprint lock.
pub(super) struct Graphs {
    charged: Lock<HashMap<CUdevice, (Dev, u64)>>,
    execs: Box<[std::sync::atomic::AtomicUsize]>,
    /// The table was full once: lookups fall back to `footprints`.
    overflow: AtomicBool,
    footprints: Lock<HashMap<usize, Vec<(Dev, u64)>>>,
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
struct Kernels {
    local: u64,
    funcs: Vec<usize>,
}

impl Kernels {
    /// `o`'s kernels too.
    fn merge(&mut self, o: Kernels) {
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

impl Graphs {
    pub(super) fn new() -> Graphs {
        Graphs {
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
    fn set_kernels(&self, exec: usize, k: Kernels, raise: bool) {
        let mut g = self.kernels.lock();
        let e = g.stacks.entry(exec).or_default();
        if raise {
            e.merge(k);
        } else {
            *e = k;
        }
    }

    /// The stack per thread `exec`'s kernels need (0: unknown or none).
    pub(super) fn stack(&self, exec: usize) -> u64 {
        self.kernels.lock().stacks.get(&exec).map_or(0, |k| k.local)
    }

    /// The kernels `exec` may run, as recorded at instantiation and updates.
    pub(super) fn kernels(&self, exec: usize) -> Vec<usize> {
        self.kernels
            .lock()
            .stacks
            .get(&exec)
            .map_or_else(Vec::new, |k| k.funcs.clone())
    }

    /// `exec` was destroyed.
    fn forget_stack(&self, exec: usize) {
        self.kernels.lock().stacks.remove(&exec);
    }

    /// Conditional node `node` was added with `bodies`.
    fn set_bodies(&self, node: usize, bodies: Vec<usize>) {
        self.kernels.lock().bodies.insert(node, bodies);
    }

    /// The body graphs of conditional node `node`, if it was seen added.
    fn bodies(&self, node: usize) -> Option<Vec<usize>> {
        self.kernels.lock().bodies.get(&node).cloned()
    }

    /// Conditional node `node` came with a clone of a graph whose kernels were `k`.
    fn set_floor(&self, node: usize, k: Kernels) {
        self.kernels.lock().floors.insert(node, k);
    }

    /// What the original of the clone conditional node `node` came with ran (`None`: not such a node).
    fn floor(&self, node: usize) -> Option<Kernels> {
        self.kernels.lock().floors.get(&node).cloned()
    }

    /// Whether `exec` has memory alloc nodes (lock-free unless the table ever overflowed).
    #[inline]
    pub(super) fn has_memory(&self, exec: usize) -> bool {
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
    fn set_exec(&self, exec: usize, footprint: Vec<(Dev, u64)>) {
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
    fn forget_exec(&self, exec: usize) {
        if exec > EXEC_GONE {
            self.unmark(exec);
        }
        self.footprints.lock().remove(&exec);
    }

    /// An exec's memory nodes changed (`cuGraphExecUpdate`, a child graph node's new parameters): per device,
    /// `fp` is added to its footprint (`add`) or replaces it where larger.
    fn merge_exec(&self, exec: usize, fp: &[(Dev, u64)], add: bool) {
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
    fn footprint(&self, exec: usize) -> Option<Vec<(Dev, u64)>> {
        self.footprints.lock().get(&exec).cloned()
    }

    /// What this process charges for `dev`'s graph pool, if it charges it.
    pub(super) fn charges(&self, dev: Dev) -> bool {
        self.charged.lock().contains_key(&dev.ordinal)
    }

    /// Re-reads `dev`'s reserved graph memory; `settle(charged, reserved)` moves the charge to it (under the
    /// lock: two re-reads never settle the same difference twice). Nothing when the driver will not say.
    fn refresh(&self, d: &impl Driver, dev: Dev, settle: impl FnOnce(u64, u64)) {
        let mut charged = self.charged.lock();
        let Ok(reserved) = d.graph_mem_attribute(dev.ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) else {
            return;
        };
        let e = charged.entry(dev.ordinal).or_insert((dev, 0));
        settle(e.1, reserved);
        e.1 = reserved;
    }

    /// The devices whose graph memory we charge.
    fn charged_devices(&self) -> Vec<Dev> {
        self.charged.lock().values().map(|e| e.0).collect()
    }

    /// Graph memory reserved on `dev` but not in use, as far as we charged it: what a launch can reuse.
    fn slack(&self, d: &impl Driver, dev: Dev) -> u64 {
        let charged = self.charged.lock().get(&dev.ordinal).map_or(0, |e| e.1);
        if charged == 0 {
            return 0;
        }
        let attr = |a| d.graph_mem_attribute(dev.ordinal, a).ok();
        match (
            attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
            attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(r), Some(u)) => r.saturating_sub(u).min(charged),
            _ => 0,
        }
    }

    /// Forgets the parent's graph pools' charges in a forked child.
    pub(super) fn reset(&self) {
        self.charged.lock().clear();
    }

    /// Takes the family's locks the fork handlers hold, in their order.
    pub(super) fn fork_prepare(&self) {
        hold_all([&self.charged]);
        hold_all([&self.footprints]);
    }

    /// Takes the family's leaf lock (its holders take no other) for the fork, after every other group.
    pub(super) fn fork_prepare_leaves(&self) {
        hold_all([&self.kernels]);
    }

    /// Undoes [`Graphs::fork_prepare_leaves`].
    ///
    /// # Safety
    /// Only after `fork_prepare_leaves` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release_leaves(&self, side: Side) {
        // SAFETY: locked by fork_prepare_leaves (the caller's contract).
        unsafe { release_all([&self.kernels], side) };
    }

    /// Undoes [`Graphs::fork_prepare`].
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release(&self, side: Side) {
        // SAFETY: both locked by fork_prepare (the caller's contract).
        unsafe {
            release_all([&self.footprints], side);
            release_all([&self.charged], side);
        }
    }

    /// The memory nodes and the kernels of `graph`, its child graphs (`CU_GRAPH_NODE_TYPE_GRAPH`, which may hold
    /// memory nodes when moved into the node) and its conditional nodes' bodies (whether they run is decided on
    /// the device). `place(ordinal, bytes)`: an alloc node's device and its size rounded to the device's
    /// granularity (`None`: not a device we account). `None`: the driver could not list a graph, or the nesting
    /// is deeper than [`MAX_DEPTH`]; what could not be read is `unknown` in the answer.
    fn walk(
        &self,
        d: &impl Driver,
        graph: CUgraph,
        place: &impl Fn(CUdevice, u64) -> Option<(Dev, u64)>,
    ) -> Option<Walked> {
        self.walk_at(d, graph, place, 0)
    }

    fn walk_at(
        &self,
        d: &impl Driver,
        graph: CUgraph,
        place: &impl Fn(CUdevice, u64) -> Option<(Dev, u64)>,
        depth: u32,
    ) -> Option<Walked> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut out = Walked::default();
        for node in d.graph_nodes(graph).ok()? {
            let Ok(ty) = d.node_type(node) else {
                // Any kind of node, a kernel or a memory node among them.
                out.unknown = true;
                continue;
            };
            match ty {
                CU_GRAPH_NODE_TYPE_GRAPH => {
                    let child = d.child_graph(node).ok()?;
                    out.merge(self.walk_at(d, child, place, depth + 1)?);
                }
                CU_GRAPH_NODE_TYPE_CONDITIONAL => match self.bodies(node as usize) {
                    Some(bodies) => {
                        for b in bodies {
                            out.merge(self.walk_at(d, b as CUgraph, place, depth + 1)?);
                        }
                    }
                    // A clone's: its bodies are the original's, as they were when cloned.
                    None => match self.floor(node as usize) {
                        Some(floor) => out.kernels.merge(floor),
                        None => out.unknown = true,
                    },
                },
                CU_GRAPH_NODE_TYPE_KERNEL => {
                    let kernel = d.kernel_node(node).ok();
                    match kernel.and_then(|(f, k)| Some((stack::node_local(d, f, k)?, f, k))) {
                        Some((local, f, k)) => out.kernels.merge(Kernels {
                            local,
                            funcs: node_handle(f, k),
                        }),
                        None => out.unknown = true,
                    }
                }
                CU_GRAPH_NODE_TYPE_MEM_ALLOC => match d.alloc_node(node) {
                    Err(_) => out.unknown = true,
                    Ok((Some(ordinal), bytes)) => {
                        if let Some(at) = place(ordinal, bytes) {
                            out.merge(Walked {
                                mem: vec![at],
                                ..Walked::default()
                            });
                        }
                    }
                    Ok((None, _)) => {}
                },
                _ => {}
            }
        }
        Some(out)
    }

    /// Records `k` for the conditional nodes of unknown bodies in `graph` and its child graphs.
    fn cover(&self, d: &impl Driver, graph: CUgraph, k: &Kernels, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        for node in d.graph_nodes(graph).unwrap_or_default() {
            match d.node_type(node) {
                Ok(CU_GRAPH_NODE_TYPE_CONDITIONAL) if self.bodies(node as usize).is_none() => {
                    self.set_floor(node as usize, k.clone());
                }
                Ok(CU_GRAPH_NODE_TYPE_GRAPH) => {
                    if let Ok(child) = d.child_graph(node) {
                        self.cover(d, child, k, depth + 1);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Child graphs and conditional bodies nested deeper than this are not walked (fail closed: such a graph's
/// instantiation is refused).
const MAX_DEPTH: u32 = 64;

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

/// The handle a kernel node's parameters launch (`kern` when `func` is NULL), if any.
fn node_handle(func: CUfunction, kern: CUkernel) -> Vec<usize> {
    let f = if func.is_null() {
        kern as usize
    } else {
        func as usize
    };
    (f != 0).then_some(f).into_iter().collect()
}

/// A graph or exec memory cannot price: the call is refused (fail closed: an exec whose footprint or stack need
/// is unknown is never launched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpriced;

/// What a hook saw made, after the driver's call succeeded ([`Memory::graph_changed`]).
#[derive(Debug)]
pub(crate) enum GraphChange {
    /// `exec` was instantiated from `graph` (refused: the caller destroys it).
    Instantiated { exec: CUgraphExec, graph: CUgraph },
    /// Conditional node `node` was added with these body graphs (cuda.h lists them only when it is added).
    Bodies { node: CUgraphNode, bodies: Vec<usize> },
    /// `clone` is a copy of `original`.
    Cloned { clone: CUgraph, original: CUgraph },
    /// Child graph node `node` holds a clone of `original`.
    ChildCloned { node: CUgraphNode, original: CUgraph },
    /// `cuDeviceGraphMemTrim` of a device.
    Trimmed(CUdevice),
}

/// An exec's call that [`Memory::graph_exec`] wraps.
#[derive(Debug)]
pub(crate) enum ExecCall {
    /// `cuGraphExecUpdate`: the exec now runs `graph`'s parameters.
    Update(CUgraph),
    /// A child graph node of the exec takes `graph`'s parameters.
    ChildUpdate(CUgraph),
    /// A kernel node of the exec takes another kernel (`kern` when `func` is NULL).
    KernelUpdate { func: CUfunction, kern: CUkernel },
    /// Another node of the exec changed.
    OtherUpdate,
    /// `cuGraphUpload` on `stream` (the probe stream a first use is measured on).
    Upload { stream: usize },
    /// `cuGraphLaunch` (the call throttles and admits the first launch itself): its graph memory.
    Launch,
    /// `cuGraphExecDestroy`.
    Destroy,
}

/// What hooks' graph calls do to the family's state. The doors of [`Memory`] below compose it with the other
/// families (first use, admission): the charge moves through [`Charges`], an admission is a closure that returns
/// a guard, and the driver is asked through [`Driver`], so the family is tested with fakes of each.
impl Graphs {
    /// `graph`'s walk, before or after `what` gives its memory nodes and kernels to `exec` (`Err`, logged: the
    /// call is refused). While a memory cap may apply, a node that could not be read fails it; without a cap
    /// those price nothing (a cap set later measures the exec's first launch after it).
    fn priced(
        &self,
        cuda: &CudaTable,
        devices: &Devices,
        what: &str,
        exec: CUgraphExec,
        graph: CUgraph,
    ) -> Result<Walked, Unpriced> {
        let w = self.walk_placed(cuda, devices, graph);
        if w.is_none() {
            log!(
                Level::Error,
                "{what} of graph exec {exec:p} refused: the memory nodes or kernels of graph {graph:p} cannot be \
                 listed (child graphs or conditional bodies nested deeper than {MAX_DEPTH}, a kernel node's parameters \
                 refused, a conditional node made where cuquota did not see it, or not a graph), so the memory cap \
                 could not be kept"
            );
        }
        w.ok_or(Unpriced)
    }

    /// [`Graphs::walk`] with this process's devices, failed where it found what it could not read while a cap
    /// may apply.
    fn walk_placed(&self, cuda: &CudaTable, devices: &Devices, graph: CUgraph) -> Option<Walked> {
        let place = |ordinal, bytes| {
            let d = devices.device(cuda, ordinal)?;
            Some((d, devices.round(cuda, d, bytes)))
        };
        let w = self.walk(cuda, graph, &place)?;
        if w.unknown {
            devices.refresh_if_changed();
            if devices.memory_limited() {
                return None;
            }
        }
        Some(w)
    }

    /// Records what a hook saw made (a trim re-reads the pool, its charge moved through `c`). `Err` only for
    /// [`GraphChange::Instantiated`]: the exec cannot be priced.
    pub(super) fn changed(
        &self,
        cuda: &CudaTable,
        devices: &Devices,
        c: &impl Charges,
        change: GraphChange,
    ) -> Result<(), Unpriced> {
        match change {
            GraphChange::Instantiated { exec, graph } => {
                let w = self.priced(cuda, devices, "cuGraphInstantiate", exec, graph)?;
                self.set_exec(exec as usize, w.mem);
                self.set_kernels(exec as usize, w.kernels, false);
            }
            GraphChange::Bodies { node, bodies } => self.set_bodies(node as usize, bodies),
            GraphChange::Cloned { clone, original } => self.cloned(cuda, devices, clone, original),
            GraphChange::ChildCloned { node, original } => {
                if let Ok(clone) = cuda.child_graph(node) {
                    self.cloned(cuda, devices, clone, original);
                }
            }
            GraphChange::Trimmed(ordinal) => {
                if let Some(dev) = devices.device(cuda, ordinal) {
                    self.settle(cuda, c, dev);
                }
            }
        }
        Ok(())
    }

    /// `clone` is a copy of `original` (its conditional nodes new handles whose bodies no call lists): each of
    /// those it holds now, in its child graphs too, needs at most what `original` does now. Nodes added to the
    /// clone later are not covered (one made past cuquota stays unknown). An original that cannot be walked, or
    /// holds a conditional node of unknown bodies, records nothing (the clone's conditional nodes then make its
    /// instantiation refused under a cap).
    fn cloned(&self, cuda: &CudaTable, devices: &Devices, clone: CUgraph, original: CUgraph) {
        if let Some(w) = self.walk_placed(cuda, devices, original).filter(|w| !w.unknown) {
            self.cover(cuda, clone, &w.kernels, 0);
        }
    }

    /// `call`, an exec's update (`what`: not an upload, launch or destruction), recording the new need: the graph
    /// is walked before the call (refused as at instantiation: `CUDA_ERROR_NOT_SUPPORTED`, the driver not
    /// called), and after it the footprint becomes, per device, the larger of the old and the new (whichever the
    /// driver kept, the launch is admitted for it; a child graph's is added), the stack need the new graph's (a
    /// kernel or child node's raises it).
    fn updated(
        &self,
        cuda: &CudaTable,
        devices: &Devices,
        exec: CUgraphExec,
        what: ExecCall,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let update = match what {
            ExecCall::Update(g) => Some((self.priced(cuda, devices, "cuGraphExecUpdate", exec, g), false)),
            ExecCall::ChildUpdate(g) => Some((
                self.priced(cuda, devices, "cuGraphExecChildGraphNodeSetParams", exec, g),
                true,
            )),
            ExecCall::KernelUpdate { func, kern } => {
                Some((kernel_update(exec, cuda, devices, func, kern), true))
            }
            _ => None,
        };
        let (w, raise) = match update {
            Some((Ok(w), raise)) => (Some(w), raise),
            Some((Err(Unpriced), _)) => return CUresult::ERROR_NOT_SUPPORTED,
            None => (None, false),
        };
        let r = call();
        if let (true, Some(w)) = (r.ok(), w) {
            let e = exec as usize;
            self.merge_exec(e, &w.mem, raise);
            self.set_kernels(e, w.kernels, raise);
        }
        r
    }

    /// `cuGraphExecDestroy` of `exec` (`call`): once the driver destroyed it, `gone` runs and the exec is
    /// forgotten (one created later at this address is not this one), and with alloc nodes its devices' graph
    /// memory re-read (the charge moved through `c`).
    fn destroyed(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        exec: usize,
        call: impl FnOnce() -> CUresult,
        gone: impl FnOnce(),
    ) -> CUresult {
        let had = self.has_memory(exec);
        let r = call();
        if r.ok() {
            gone();
            self.forget_stack(exec);
            if had {
                self.forget_exec(exec);
                for dev in self.charged_devices() {
                    self.settle(d, c, dev);
                }
            }
        }
        r
    }

    /// Re-reads a device's reserved graph memory and charges (unconditionally) or releases the difference.
    pub(super) fn settle(&self, d: &impl Driver, c: &impl Charges, dev: Dev) {
        self.refresh(d, dev, |charged, reserved| {
            if reserved > charged {
                c.force(dev, reserved - charged);
            } else {
                c.release(dev, charged - reserved);
            }
        });
    }

    /// Upload or launch (`call`) of graph exec `exec`: with alloc nodes, what its footprint may add on each
    /// device (`footprint − (reserved − used)`) is admitted first (`admit`, a guard per device; refused:
    /// `CUDA_ERROR_OUT_OF_MEMORY`, the driver not called, the guards so far dropped), then the real change of
    /// the graph pools' reserved size is charged and the provisional charge dropped. An exec without alloc nodes
    /// costs one lock-free probe.
    #[inline(never)]
    fn with_memory<G>(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        exec: usize,
        admit: impl Fn(Dev, u64) -> Result<G, OverCap>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.has_memory(exec) {
            return call();
        }
        let Some(fp) = self.footprint(exec) else {
            return call();
        };
        let mut charges: Vec<(Dev, G)> = Vec::with_capacity(fp.len());
        for &(dev, bytes) in &fp {
            let est = || bytes.saturating_sub(self.slack(d, dev));
            let charge = admit(dev, est()).or_else(|_| {
                // Memory may have been released behind our back (a context's teardown): re-read, retry once.
                self.settle(d, c, dev);
                admit(dev, est())
            });
            let Ok(charge) = charge else {
                return CUresult::ERROR_OUT_OF_MEMORY; // the charges so far go back with their guards
            };
            charges.push((dev, charge));
        }
        let r = call();
        for (dev, charge) in charges {
            // Charge the real growth first, then drop the provisional charge: the sum never dips below the truth.
            self.settle(d, c, dev);
            drop(charge);
        }
        r
    }
}

/// What a kernel node's new kernel needs (no memory node can change there). Refused when the driver will not
/// give its local memory size while a cap may apply.
fn kernel_update(
    exec: CUgraphExec,
    cuda: &CudaTable,
    devices: &Devices,
    func: CUfunction,
    kern: CUkernel,
) -> Result<Walked, Unpriced> {
    let local = stack::node_local(cuda, func, kern).or_else(|| {
        devices.refresh_if_changed();
        (!devices.memory_limited()).then_some(0)
    });
    let Some(local) = local else {
        log!(
            Level::Error,
            "kernel node update of graph exec {exec:p} refused: the driver will not give the new kernel's local \
             memory size, so the memory cap could not be kept"
        );
        return Err(Unpriced);
    };
    Ok(Walked {
        kernels: Kernels {
            local,
            funcs: node_handle(func, kern),
        },
        ..Walked::default()
    })
}

/// The graph family's doors: hooks call these two; they compose [`Graphs`] with first use and admission.
impl Memory {
    /// Records what a hook saw made. `Err` only for [`GraphChange::Instantiated`]: the exec cannot be priced.
    pub(crate) fn graph_changed(&self, cuda: &CudaTable, change: GraphChange) -> Result<(), Unpriced> {
        self.graph.changed(cuda, &self.devices, self, change)
    }

    /// `call`, an exec's update, upload, launch or destruction, with what memory keeps of the exec
    /// ([`Graphs`]). An update or destruction makes the next launch a first use again. An upload is admitted as
    /// the exec's first launch there is, and its graph memory as a launch's ([`Graphs::with_memory`]).
    pub(crate) fn graph_exec(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        exec: CUgraphExec,
        what: ExecCall,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let e = exec as usize;
        match what {
            ExecCall::Upload { stream } => self.graph_upload(cuda, nvml, e, stream, call),
            // The probe inline, the work out of line: the launch hook inlines this twice (with and without elastic
            // memory's gate), and `#[inline]` alone then left all of it out of line (+27 per graph launch).
            ExecCall::Launch if !self.graph.has_memory(e) => call(),
            ExecCall::Launch => self.graph_memory(cuda, nvml, e, call),
            ExecCall::Destroy => self.graph.destroyed(cuda, self, e, call, || {
                self.first_use.forget(Use::Graph, e);
            }),
            update => {
                let r = self.graph.updated(cuda, &self.devices, exec, update, call);
                if r.ok() {
                    self.first_use.forget(Use::Graph, e);
                }
                r
            }
        }
    }

    /// `cuGraphUpload`: uploading may reserve the exec's graph memory, and sets up its kernels' stack in the
    /// stream's context (an exec instantiated for device launch is launched from the device, where no hook sees
    /// it, only once uploaded): admitted as its first launch there is (`FirstUse::first_launch`).
    fn graph_upload(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        exec: usize,
        stream: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.first_use.armed() {
            return self.graph_memory(cuda, nvml, exec, call);
        }
        let Ok(first) = self
            .first_use
            .first_launch(self, cuda, nvml, Use::Graph, exec, stream)
        else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = self.graph_memory(cuda, nvml, exec, call);
        self.first_use.launched(self, cuda, nvml, first, stream, r);
        r
    }

    /// An upload or launch of `exec` with its graph memory admitted against the cap ([`Graphs::with_memory`]).
    fn graph_memory(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        exec: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let admit = |dev, bytes| self.charge(dev, bytes, cuda, nvml);
        self.graph.with_memory(cuda, self, exec, admit, call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tests::device_id;
    use std::cell::Cell;

    const MIB: u64 = 1 << 20;

    /// A driver that knows a few graphs: their nodes, each node's type and parameters (absent: refused).
    #[derive(Default)]
    struct Fake {
        graphs: HashMap<usize, Vec<usize>>,
        types: HashMap<usize, CUgraphNodeType>,
        children: HashMap<usize, usize>,
        allocs: HashMap<usize, (Option<CUdevice>, u64)>,
        kernels: HashMap<usize, usize>,
        /// Local memory per thread of each function.
        local: HashMap<usize, i32>,
        reserved: Cell<Option<u64>>,
        used: Cell<u64>,
    }

    impl Fake {
        fn node(&mut self, graph: usize, node: usize, ty: CUgraphNodeType) {
            self.graphs.entry(graph).or_default().push(node);
            self.types.insert(node, ty);
        }
        fn alloc(&mut self, graph: usize, node: usize, ordinal: Option<CUdevice>, bytes: u64) {
            self.node(graph, node, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
            self.allocs.insert(node, (ordinal, bytes));
        }
        fn kernel(&mut self, graph: usize, node: usize, f: usize, local: i32) {
            self.node(graph, node, CU_GRAPH_NODE_TYPE_KERNEL);
            self.kernels.insert(node, f);
            self.local.insert(f, local);
        }
        fn child(&mut self, graph: usize, node: usize, child: usize) {
            self.node(graph, node, CU_GRAPH_NODE_TYPE_GRAPH);
            self.children.insert(node, child);
        }
    }

    const REFUSED: CUresult = CUresult::ERROR_INVALID_VALUE;

    impl Driver for Fake {
        fn device_attribute(&self, _: CUdevice_attribute, _: CUdevice) -> Result<i32, CUresult> {
            Err(REFUSED)
        }
        fn function_local_size(&self, f: CUfunction) -> Result<i32, CUresult> {
            self.local
                .get(&(f as usize))
                .copied()
                .ok_or(CUresult::ERROR_NOT_SUPPORTED)
        }
        fn kernel_local_size(&self, _: CUfunction, _: CUdevice) -> Result<i32, CUresult> {
            Err(REFUSED)
        }
        fn stack_size(&self) -> Result<usize, CUresult> {
            Err(REFUSED)
        }
        fn device_count(&self) -> Result<i32, CUresult> {
            Ok(1)
        }
        fn graph_nodes(&self, graph: CUgraph) -> Result<Vec<CUgraphNode>, CUresult> {
            let nodes = self.graphs.get(&(graph as usize)).ok_or(REFUSED)?;
            Ok(nodes.iter().map(|&n| n as CUgraphNode).collect())
        }
        fn node_type(&self, node: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
            self.types.get(&(node as usize)).copied().ok_or(REFUSED)
        }
        fn child_graph(&self, node: CUgraphNode) -> Result<CUgraph, CUresult> {
            self.children
                .get(&(node as usize))
                .map(|&g| g as CUgraph)
                .ok_or(REFUSED)
        }
        fn alloc_node(&self, node: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult> {
            self.allocs.get(&(node as usize)).copied().ok_or(REFUSED)
        }
        fn kernel_node(&self, node: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult> {
            let f = self.kernels.get(&(node as usize)).ok_or(REFUSED)?;
            Ok((*f as CUfunction, std::ptr::null_mut()))
        }
        fn graph_mem_attribute(&self, _: CUdevice, attr: CUgraphMem_attribute) -> Result<u64, CUresult> {
            let r = self.reserved.get().ok_or(REFUSED)?;
            Ok(if attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT {
                self.used.get()
            } else {
                r
            })
        }
        fn pool_attribute(&self, _: usize, _: CUmemPool_attribute) -> Result<u64, CUresult> {
            Err(REFUSED)
        }
        fn mem_pool(&self, _: CUdevice) -> Result<usize, CUresult> {
            Err(REFUSED)
        }
        fn default_mem_pool(&self, _: CUdevice) -> Result<usize, CUresult> {
            Err(REFUSED)
        }
        fn pointer_device(&self, _: u64) -> Result<i32, CUresult> {
            Err(REFUSED)
        }
        fn address_size(&self, _: u64) -> Result<usize, CUresult> {
            Err(REFUSED)
        }
    }

    fn g(n: usize) -> CUgraph {
        n as CUgraph
    }

    #[test]
    fn a_walk_sums_alloc_nodes_per_device_and_takes_the_largest_kernels_stack() {
        let (_t, id) = device_id();
        let dev = Dev { ordinal: 0, id };
        // Device 0 only, sizes rounded to 2 MiB.
        let place = |o: CUdevice, b: u64| (o == 0).then_some((dev, b.div_ceil(2 * MIB) * 2 * MIB));
        let mut d = Fake::default();
        d.alloc(1, 10, Some(0), 3 * MIB);
        d.kernel(1, 11, 0xf1, 1024);
        d.child(1, 12, 2);
        d.alloc(2, 20, Some(0), 5 * MIB);
        d.kernel(2, 21, 0xf2, 4096);
        d.alloc(2, 22, None, 64 * MIB); // host memory: not the device's
        d.alloc(2, 23, Some(3), 64 * MIB); // a device we do not account
        let graphs = Graphs::new();
        let w = graphs.walk(&d, g(1), &place).expect("walked");
        assert_eq!(w.mem, vec![(dev, 4 * MIB + 6 * MIB)]);
        assert_eq!(
            w.kernels,
            Kernels {
                local: 4096,
                funcs: vec![0xf1, 0xf2]
            }
        );
        assert!(!w.unknown);
        // A graph the driver will not list fails the walk.
        assert!(graphs.walk(&d, g(99), &place).is_none());
    }

    #[test]
    fn what_a_walk_cannot_read_is_unknown_and_endless_nesting_fails() {
        let place = |_: CUdevice, _: u64| None;
        let graphs = Graphs::new();
        let unknown = |d: &Fake, graph| graphs.walk(d, g(graph), &place).expect("walked").unknown;
        // A node whose type, a kernel node whose parameters, an alloc node whose size the driver refuses.
        let mut d = Fake::default();
        d.graphs.insert(1, vec![10]);
        assert!(unknown(&d, 1));
        let mut d = Fake::default();
        d.node(1, 10, CU_GRAPH_NODE_TYPE_KERNEL);
        assert!(unknown(&d, 1));
        let mut d = Fake::default();
        d.node(1, 10, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
        assert!(unknown(&d, 1));
        // A kernel whose local memory size the driver will not give.
        let mut d = Fake::default();
        d.kernel(1, 10, 0xf1, 0);
        d.local.clear();
        assert!(unknown(&d, 1));
        // A conditional node whose bodies were never seen added; once seen, its bodies are walked.
        let mut d = Fake::default();
        d.node(1, 10, CU_GRAPH_NODE_TYPE_CONDITIONAL);
        d.kernel(2, 20, 0xf2, 512);
        assert!(unknown(&d, 1));
        graphs.set_bodies(10, vec![2]);
        let w = graphs.walk(&d, g(1), &place).expect("walked");
        assert!(!w.unknown);
        assert_eq!(w.kernels.local, 512);
        // A graph nested in itself: deeper than MAX_DEPTH, refused.
        let mut d = Fake::default();
        d.child(1, 10, 1);
        assert!(graphs.walk(&d, g(1), &place).is_none());
    }

    #[test]
    fn a_clones_conditional_nodes_take_the_originals_need() {
        let place = |_: CUdevice, _: u64| None;
        let graphs = Graphs::new();
        let mut d = Fake::default();
        // The original: a conditional node whose body runs a kernel of 2048 bytes per thread.
        d.node(1, 10, CU_GRAPH_NODE_TYPE_CONDITIONAL);
        graphs.set_bodies(10, vec![2]);
        d.kernel(2, 20, 0xf2, 2048);
        // The clone: a new conditional node (bodies never listed), inside a child graph.
        d.child(3, 30, 4);
        d.node(4, 40, CU_GRAPH_NODE_TYPE_CONDITIONAL);
        assert!(graphs.walk(&d, g(3), &place).expect("walked").unknown);
        let original = graphs.walk(&d, g(1), &place).expect("walked");
        graphs.cover(&d, g(3), &original.kernels, 0);
        let w = graphs.walk(&d, g(3), &place).expect("walked");
        assert!(!w.unknown);
        assert_eq!(
            w.kernels,
            Kernels {
                local: 2048,
                funcs: vec![0xf2]
            }
        );
    }

    #[test]
    fn the_graph_pools_charge_follows_its_reserved_size_and_slack_never_exceeds_it() {
        let (_t, id) = device_id();
        let dev = Dev { ordinal: 0, id };
        let graphs = Graphs::new();
        let d = Fake::default();
        let settled = Cell::new(None);
        let settle = |was, now| settled.set(Some((was, now)));
        // The driver will not say: nothing charged, nothing reusable.
        graphs.refresh(&d, dev, settle);
        assert_eq!(settled.take(), None);
        assert!(!graphs.charges(dev));
        d.reserved.set(Some(8 * MIB));
        assert_eq!(graphs.slack(&d, dev), 0, "nothing charged yet: nothing to reuse");
        graphs.refresh(&d, dev, settle);
        assert_eq!(settled.take(), Some((0, 8 * MIB)));
        assert!(graphs.charges(dev));
        d.used.set(2 * MIB);
        assert_eq!(graphs.slack(&d, dev), 6 * MIB);
        // Reserved grew past what we charged (not re-read yet): only what we charged is reusable.
        d.reserved.set(Some(32 * MIB));
        assert_eq!(graphs.slack(&d, dev), 8 * MIB);
        d.reserved.set(Some(2 * MIB));
        graphs.refresh(&d, dev, settle);
        assert_eq!(settled.take(), Some((8 * MIB, 2 * MIB)));
        assert_eq!(graphs.charged_devices(), vec![dev]);
    }

    #[test]
    fn an_execs_footprint_is_replaced_raised_or_added_and_forgotten() {
        let (_t, id) = device_id();
        let dev = Dev { ordinal: 0, id };
        let graphs = Graphs::new();
        let exec = 0x5000;
        assert!(!graphs.has_memory(exec));
        graphs.set_exec(exec, vec![]);
        assert!(!graphs.has_memory(exec), "no alloc nodes: not marked");
        graphs.set_exec(exec, vec![(dev, 4 * MIB)]);
        assert!(graphs.has_memory(exec));
        // An update keeps the larger of the old and the new; a child graph's nodes add.
        graphs.merge_exec(exec, &[(dev, 2 * MIB)], false);
        assert_eq!(graphs.footprint(exec), Some(vec![(dev, 4 * MIB)]));
        graphs.merge_exec(exec, &[(dev, 2 * MIB)], true);
        assert_eq!(graphs.footprint(exec), Some(vec![(dev, 6 * MIB)]));
        graphs.forget_exec(exec);
        assert!(!graphs.has_memory(exec));
        assert_eq!(graphs.footprint(exec), None);
    }

    /// The process's charge as the family moves it: forced and released bytes, and admissions against `cap`
    /// that hand out a guard giving them back on drop (as `Memory::charge`'s `Charge`).
    #[derive(Default)]
    struct Net {
        cap: u64,
        charged: Cell<u64>,
        admissions: Cell<u32>,
    }

    impl Charges for Net {
        fn force(&self, _: Dev, bytes: u64) {
            self.charged.set(self.charged.get() + bytes);
        }
        fn release(&self, _: Dev, bytes: u64) {
            self.charged.set(self.charged.get() - bytes);
        }
    }

    struct Held<'a>(&'a Net, Dev, u64);

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.0.release(self.1, self.2);
        }
    }

    impl Net {
        fn admit(&self, dev: Dev, bytes: u64) -> Result<Held<'_>, OverCap> {
            self.admissions.set(self.admissions.get() + 1);
            if self.charged.get() + bytes > self.cap {
                return Err(OverCap);
            }
            self.force(dev, bytes);
            Ok(Held(self, dev, bytes))
        }
    }

    fn two_devices() -> (impl Drop, impl Drop, Dev, Dev) {
        let (t0, id0) = device_id();
        let (t1, id1) = device_id();
        (t0, t1, Dev { ordinal: 0, id: id0 }, Dev { ordinal: 1, id: id1 })
    }

    /// An exec whose footprint does not fit on one of its devices is refused before the driver is called (out of
    /// memory), and what the devices before it admitted goes back; control: under a cap that fits, the call is
    /// made. An exec without alloc nodes is not admitted at all.
    #[test]
    fn a_launch_over_the_cap_is_refused_before_the_driver_and_its_admissions_go_back() {
        let (_t0, _t1, dev0, dev1) = two_devices();
        let graphs = Graphs::new();
        let d = Fake::default();
        let exec = 0x5000;
        graphs.set_exec(exec, vec![(dev0, 4 * MIB), (dev1, 8 * MIB)]);
        let calls = Cell::new(0);
        let call = || {
            calls.set(calls.get() + 1);
            CUresult::SUCCESS
        };
        let net = Net {
            cap: 10 * MIB,
            ..Net::default()
        };
        let admit = |dev, bytes| net.admit(dev, bytes);
        let r = graphs.with_memory(&d, &net, exec, admit, call);
        assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
        assert_eq!(calls.get(), 0, "the driver is not called");
        assert_eq!(net.charged.get(), 0, "the first device's admission went back");
        assert_eq!(
            net.admissions.get(),
            3,
            "the refused device retried once after a re-read"
        );
        let net = Net {
            cap: 12 * MIB,
            ..Net::default()
        };
        let admit = |dev, bytes| net.admit(dev, bytes);
        assert_eq!(graphs.with_memory(&d, &net, exec, admit, call), CUresult::SUCCESS);
        assert_eq!(calls.get(), 1);
        // The driver reported no reserved graph memory: nothing stays charged once the launch returned.
        assert_eq!(net.charged.get(), 0);
        let admit = |dev, bytes| net.admit(dev, bytes);
        assert_eq!(
            graphs.with_memory(&d, &net, 0x6000, admit, call),
            CUresult::SUCCESS
        );
        assert_eq!(calls.get(), 2);
        assert_eq!(net.admissions.get(), 2, "no alloc nodes: nothing admitted");
    }

    /// A launch holds its footprint across the driver's call, then the pool's real growth is charged and the
    /// estimate goes back; the next launch reuses the pool's slack
    /// (reserved − used) and is admitted only for the rest. A failed launch gives its estimate back too.
    #[test]
    fn a_launch_charges_the_pools_real_growth_and_gives_its_estimate_back() {
        let (_t0, _t1, dev, _) = two_devices();
        let graphs = Graphs::new();
        let d = Fake::default();
        let exec = 0x5000;
        graphs.set_exec(exec, vec![(dev, 6 * MIB)]);
        let net = Net {
            cap: 64 * MIB,
            ..Net::default()
        };
        let admit = |dev, bytes| net.admit(dev, bytes);
        let r = graphs.with_memory(&d, &net, exec, admit, || {
            assert_eq!(
                net.charged.get(),
                6 * MIB,
                "the footprint is held across the call"
            );
            d.reserved.set(Some(8 * MIB)); // the pool grew by its granularity
            d.used.set(6 * MIB);
            CUresult::SUCCESS
        });
        assert_eq!(r, CUresult::SUCCESS);
        assert_eq!(
            net.charged.get(),
            8 * MIB,
            "the reserved size is charged, the estimate gone"
        );
        // The launch finished: its memory is back in the pool, which keeps it reserved.
        d.used.set(0);
        let admitted = Cell::new(u64::MAX);
        let admit = |dev, bytes| {
            admitted.set(bytes);
            net.admit(dev, bytes)
        };
        let r = graphs.with_memory(&d, &net, exec, admit, || CUresult::ERROR_INVALID_VALUE);
        assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
        assert_eq!(
            admitted.get(),
            0,
            "all 6 MiB come from the pool's 8 MiB reserved and unused"
        );
        assert_eq!(
            net.charged.get(),
            8 * MIB,
            "a failed launch leaves the pool's charge as it was"
        );
    }

    /// A destroyed exec is forgotten (no longer admitted at launch) and its devices' graph memory re-read (the
    /// pool released what it held: the charge goes back); a destroy the driver refused changes nothing.
    #[test]
    fn a_destroyed_exec_is_forgotten_and_its_pools_charge_follows() {
        let (_t0, _t1, dev, _) = two_devices();
        let graphs = Graphs::new();
        let d = Fake::default();
        let net = Net {
            cap: 64 * MIB,
            ..Net::default()
        };
        let exec = 0x5000;
        graphs.set_exec(exec, vec![(dev, 4 * MIB)]);
        d.reserved.set(Some(4 * MIB));
        graphs.settle(&d, &net, dev);
        assert_eq!(net.charged.get(), 4 * MIB);
        let gone = Cell::new(0);
        d.reserved.set(Some(0));
        let r = graphs.destroyed(
            &d,
            &net,
            exec,
            || CUresult::ERROR_INVALID_VALUE,
            || gone.set(gone.get() + 1),
        );
        assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
        assert_eq!(gone.get(), 0);
        assert!(graphs.has_memory(exec), "refused: still there");
        assert_eq!(net.charged.get(), 4 * MIB);
        let r = graphs.destroyed(&d, &net, exec, || CUresult::SUCCESS, || gone.set(gone.get() + 1));
        assert_eq!(r, CUresult::SUCCESS);
        assert_eq!(gone.get(), 1);
        assert!(!graphs.has_memory(exec));
        assert_eq!(graphs.footprint(exec), None);
        assert_eq!(net.charged.get(), 0, "the pool's release is given back");
    }
}

//! Graph memory nodes and the per-device graph memory pool.
//!
//! An alloc node (cuGraphAddMemAllocNode, or a captured cuMemAllocAsync) takes its granularity-rounded
//! virtual address range when it is created (the address stays fixed across instantiations and launches);
//! no device memory is charged until a graph exec holding it is uploaded or launched. Then the device's graph
//! pool must have `footprint` (the exec's alloc nodes, summed) bytes reserved and unused: what is missing is
//! reserved from the device (charged to this process; over capacity → CUDA_ERROR_OUT_OF_MEMORY, nothing
//! changes). A launch marks its allocations in use; a free node (in the same graph or another), cuMemFree or
//! cuMemFreeAsync marks them unused again, and the memory stays reserved for later launches.
//! cuDeviceGraphMemTrim releases all reserved-but-unused memory; destroying an exec releases, of the unused
//! memory, what that exec's launches reserved.

use std::collections::HashSet;

use crate::memory::{Alloc, AllocKind};
use crate::objects::Objects;
use crate::sim::Sim;
use crate::types::*;

/// The graph memory pool of one device (per process: what this process's graphs reserved).
#[derive(Default, Debug)]
pub(crate) struct GraphPool {
    pub phys: usize,
    pub reserved: u64,
    pub reserved_high: u64,
    /// Bytes of allocations currently live (launched, not yet freed).
    pub used: u64,
    pub used_high: u64,
    /// Live allocations (their addresses).
    pub live: HashSet<u64>,
}

impl GraphPool {
    /// Reserved memory not backing a live allocation.
    pub(crate) fn unused(&self) -> u64 {
        self.reserved - self.used
    }

    /// How much must be reserved from the device so that `footprint` bytes can be allocated.
    pub(crate) fn shortfall(&self, footprint: u64) -> u64 {
        footprint.saturating_sub(self.unused())
    }

    fn note_highs(&mut self) {
        self.reserved_high = self.reserved_high.max(self.reserved);
        self.used_high = self.used_high.max(self.used);
    }
}

/// The pool of CUDA ordinal `ordinal`, created on first use.
pub(crate) fn pool<'a>(o: &'a mut Objects, sim: &Sim, ordinal: usize) -> CuResult<&'a mut GraphPool> {
    let phys = *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    Ok(o.graph_pools.entry(ordinal).or_insert_with(|| GraphPool {
        phys,
        ..GraphPool::default()
    }))
}

/// Creates the address range of a new alloc node on `ordinal`: recorded as a graph allocation (so copies
/// and pointer queries know it) but charged nothing.
pub(crate) fn node_alloc(o: &mut Objects, sim: &Sim, ordinal: usize, bytes: u64, ctx: u64) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let phys = *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let len = sim.round(bytes);
    let ptr = o.mem.take_range(sim, phys, len, false)?;
    o.mem.record(
        ptr,
        Alloc {
            size: bytes,
            len,
            phys,
            ordinal,
            ctx,
            kind: AllocKind::Graph,
            buffer_id: 0,
        },
    );
    o.graph_vas.insert(ptr, 1);
    Ok(ptr)
}

/// Drops one reference (a node or an exec) to an alloc node's address range; the last one returns it.
pub(crate) fn release_va(o: &mut Objects, ptr: u64) {
    let Some(refs) = o.graph_vas.get_mut(&ptr) else {
        return;
    };
    *refs -= 1;
    if *refs > 0 {
        return;
    }
    o.graph_vas.remove(&ptr);
    if let Some(a) = o.mem.allocs.remove(&ptr) {
        if let Some(p) = o.graph_pools.get_mut(&a.ordinal) {
            if p.live.remove(&ptr) {
                p.used -= a.len;
            }
        }
        o.mem.give_range(a.phys, ptr, a.len);
    }
}

/// Adds a reference to an alloc node's address range (an exec instantiated from its graph).
pub(crate) fn retain_va(o: &mut Objects, ptr: u64) {
    if let Some(r) = o.graph_vas.get_mut(&ptr) {
        *r += 1;
    }
}

fn graph_alloc(o: &Objects, ptr: u64) -> CuResult<Alloc> {
    o.mem
        .allocs
        .get(&ptr)
        .filter(|a| a.kind == AllocKind::Graph)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Per device, the bytes an exec's alloc nodes need.
fn footprints(o: &Objects, allocs: &[u64]) -> CuResult<Vec<(usize, u64)>> {
    let mut out: Vec<(usize, u64)> = Vec::new();
    for &p in allocs {
        let a = graph_alloc(o, p)?;
        match out.iter_mut().find(|(d, _)| *d == a.ordinal) {
            Some(e) => e.1 += a.len,
            None => out.push((a.ordinal, a.len)),
        }
    }
    Ok(out)
}

/// Makes sure each device's pool can serve the exec's allocations, reserving what is missing. Returns the
/// bytes newly reserved per device. All or nothing.
fn reserve(o: &mut Objects, sim: &Sim, allocs: &[u64]) -> CuResult<Vec<(usize, u64)>> {
    let need = footprints(o, allocs)?;
    let mut grown: Vec<(usize, u64)> = Vec::new();
    for &(ordinal, bytes) in &need {
        let p = pool(o, sim, ordinal)?;
        let short = p.shortfall(bytes);
        if short == 0 {
            continue;
        }
        let phys = p.phys;
        if let Err(e) = sim.charge(phys, short) {
            for &(d, g) in &grown {
                let p = pool(o, sim, d)?;
                p.reserved -= g;
                sim.uncharge(p.phys, g);
            }
            return Err(e);
        }
        let p = pool(o, sim, ordinal)?;
        p.reserved += short;
        p.note_highs();
        grown.push((ordinal, short));
    }
    Ok(grown)
}

/// cuGraphUpload of an exec with alloc nodes: reserves what its launches will need.
pub(crate) fn upload(o: &mut Objects, sim: &Sim, exec: u64) -> CuResult<()> {
    let allocs = o
        .execs
        .get(&exec)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .mem_allocs
        .clone();
    if allocs.is_empty() {
        return Ok(());
    }
    let grown = reserve(o, sim, &allocs)?;
    note_grown(o, exec, &grown);
    Ok(())
}

fn note_grown(o: &mut Objects, exec: u64, grown: &[(usize, u64)]) {
    if let Some(e) = o.execs.get_mut(&exec) {
        for &(d, g) in grown {
            match e.grown.iter_mut().find(|(x, _)| *x == d) {
                Some(x) => x.1 += g,
                None => e.grown.push((d, g)),
            }
        }
    }
}

/// The memory side of cuGraphLaunch: the exec's allocations become live (reserving what the pool lacks),
/// then its free nodes run. An allocation of this exec still live from an earlier launch, or a free node of
/// a pointer that is not live, is CUDA_ERROR_INVALID_VALUE and nothing changes.
pub(crate) fn launch(o: &mut Objects, sim: &Sim, exec: u64) -> CuResult<()> {
    let e = o.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if e.mem_allocs.is_empty() && e.mem_frees.is_empty() {
        return Ok(());
    }
    let (allocs, frees) = (e.mem_allocs.clone(), e.mem_frees.clone());
    for &p in &allocs {
        let a = graph_alloc(o, p)?;
        if o.graph_pools.get(&a.ordinal).is_some_and(|g| g.live.contains(&p)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    for &p in &frees {
        let a = graph_alloc(o, p)?;
        let live = o.graph_pools.get(&a.ordinal).is_some_and(|g| g.live.contains(&p));
        if !live && !allocs.contains(&p) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let grown = reserve(o, sim, &allocs)?;
    note_grown(o, exec, &grown);
    for &p in &allocs {
        let a = graph_alloc(o, p)?;
        let g = pool(o, sim, a.ordinal)?;
        g.live.insert(p);
        g.used += a.len;
        g.note_highs();
    }
    for &p in &frees {
        free(o, p)?;
    }
    Ok(())
}

/// Frees a live graph allocation (free node, cuMemFree, cuMemFreeAsync): its memory stays reserved.
pub(crate) fn free(o: &mut Objects, ptr: u64) -> CuResult<()> {
    let a = graph_alloc(o, ptr)?;
    let g = o
        .graph_pools
        .get_mut(&a.ordinal)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !g.live.remove(&ptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    g.used -= a.len;
    Ok(())
}

/// Releases up to `max` bytes of a device's reserved-but-unused graph memory.
fn release(o: &mut Objects, sim: &Sim, ordinal: usize, max: u64) {
    if let Some(g) = o.graph_pools.get_mut(&ordinal) {
        let n = g.unused().min(max);
        g.reserved -= n;
        sim.uncharge(g.phys, n);
    }
}

/// cuDeviceGraphMemTrim.
pub(crate) fn trim(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<()> {
    if ordinal >= sim.visible.len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    release(o, sim, ordinal, u64::MAX);
    Ok(())
}

/// cuGraphExecDestroy (and context teardown): releases, of the unused reserved memory, what this exec's
/// launches reserved, and its references to alloc node addresses.
pub(crate) fn exec_destroyed(o: &mut Objects, sim: &Sim, e: &crate::graph::GraphExec) {
    for &(d, g) in &e.grown {
        release(o, sim, d, g);
    }
    for &p in &e.mem_allocs {
        release_va(o, p);
    }
}

/// cuDeviceGetGraphMemAttribute.
pub(crate) fn attribute(o: &mut Objects, sim: &Sim, ordinal: usize, attr: u32) -> CuResult<u64> {
    let g = pool(o, sim, ordinal)?;
    match attr {
        CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => Ok(g.used),
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => Ok(g.used_high),
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => Ok(g.reserved),
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => Ok(g.reserved_high),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// cuDeviceSetGraphMemAttribute: only the high watermarks, and only to zero (then they restart from the
/// current value).
pub(crate) fn set_attribute(o: &mut Objects, sim: &Sim, ordinal: usize, attr: u32, v: u64) -> CuResult<()> {
    let g = pool(o, sim, ordinal)?;
    if v != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match attr {
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => g.used_high = g.used,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => g.reserved_high = g.reserved,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortfall_uses_unused_reservation() {
        let mut g = GraphPool {
            reserved: 10,
            used: 4,
            ..GraphPool::default()
        };
        assert_eq!(g.unused(), 6);
        assert_eq!(g.shortfall(6), 0);
        assert_eq!(g.shortfall(9), 3);
        g.used = 10;
        assert_eq!(g.shortfall(2), 2);
        g.reserved_high = 0;
        g.note_highs();
        assert_eq!((g.reserved_high, g.used_high), (10, 10));
    }
}

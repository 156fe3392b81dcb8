//! Stream-ordered memory pools (cuMemPool*, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync).
//!
//! A pool reserves device memory in granularity-rounded segments (one allocation per segment) and keeps a
//! freed segment reserved for reuse: the device stays charged for everything reserved. Memory goes back to
//! the device only when trimmed (cuMemPoolTrimTo) or at a synchronisation point, down to the pool's
//! CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0), as the real driver does. RESERVED_MEM_CURRENT is therefore
//! exactly what the pool costs the device.

use crate::memory::{Alloc, AllocKind};
use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

/// A reserved range of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub ptr: u64,
    pub size: u64,
    pub in_use: bool,
}

/// One pool.
#[derive(Debug)]
pub(crate) struct Pool {
    pub ordinal: usize,
    pub phys: usize,
    pub segments: Vec<Segment>,
    pub release_threshold: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    /// CU_MEMPOOL_ATTR_REUSE_* (attributes 1..=3), all enabled by default.
    pub reuse: [i32; 3],
}

impl Pool {
    pub(crate) fn new(ordinal: usize, phys: usize) -> Pool {
        Pool {
            ordinal,
            phys,
            segments: Vec::new(),
            release_threshold: 0,
            reserved_high: 0,
            used_high: 0,
            reuse: [1, 1, 1],
        }
    }

    pub(crate) fn reserved(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    pub(crate) fn used(&self) -> u64 {
        self.segments.iter().filter(|s| s.in_use).map(|s| s.size).sum()
    }

    /// The smallest free segment of at least `len` bytes.
    pub(crate) fn best_fit(&self, len: u64) -> Option<usize> {
        self.segments
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.in_use && s.size >= len)
            .min_by_key(|(_, s)| s.size)
            .map(|(i, _)| i)
    }

    /// Free segments to release (largest first) while at least `keep` bytes stay reserved: cuMemPoolTrimTo
    /// guarantees the pool keeps at least minBytesToKeep (and the release threshold is the same floor).
    pub(crate) fn trim_plan(&self, keep: u64) -> Vec<usize> {
        let mut free: Vec<usize> = (0..self.segments.len())
            .filter(|&i| !self.segments[i].in_use)
            .collect();
        free.sort_by_key(|&i| std::cmp::Reverse(self.segments[i].size));
        let mut reserved = self.reserved();
        let mut out = Vec::new();
        for i in free {
            let size = self.segments[i].size;
            if reserved - size >= keep {
                reserved -= size;
                out.push(i);
            }
        }
        out
    }

    fn note_highs(&mut self) {
        self.reserved_high = self.reserved_high.max(self.reserved());
        self.used_high = self.used_high.max(self.used());
    }
}

/// cuMemPoolCreate (and the default pools).
pub(crate) fn create(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    let phys = *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let h = new_handle(Kind::Pool);
    o.pools.insert(h, Pool::new(ordinal, phys));
    Ok(h)
}

fn device_pools<'a>(o: &'a mut Objects, sim: &Sim, ordinal: usize) -> CuResult<&'a mut (u64, u64)> {
    if ordinal >= sim.visible.len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    while o.device_pools.len() < sim.visible.len() {
        o.device_pools.push((0, 0));
    }
    if o.device_pools[ordinal].0 == 0 {
        let p = create(o, sim, ordinal)?;
        o.device_pools[ordinal] = (p, p);
    }
    Ok(&mut o.device_pools[ordinal])
}

/// cuDeviceGetDefaultMemPool.
pub(crate) fn default_pool(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    Ok(device_pools(o, sim, ordinal)?.0)
}

/// cuDeviceGetMemPool.
pub(crate) fn current_pool(o: &mut Objects, sim: &Sim, ordinal: usize) -> CuResult<u64> {
    Ok(device_pools(o, sim, ordinal)?.1)
}

/// cuDeviceSetMemPool: the pool must belong to the device.
pub(crate) fn set_current_pool(o: &mut Objects, sim: &Sim, ordinal: usize, pool: u64) -> CuResult<()> {
    let p = o.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.ordinal != ordinal {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    device_pools(o, sim, ordinal)?.1 = pool;
    Ok(())
}

/// Allocates `bytes` from `pool`, reusing a free segment or reserving a new one.
pub(crate) fn alloc(o: &mut Objects, sim: &Sim, pool: u64, bytes: u64, ctx: u64) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = sim.round(bytes);
    let p = o.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (phys, ordinal) = (p.phys, p.ordinal);
    let ptr = if let Some(i) = p.best_fit(len) {
        let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.segments[i].in_use = true;
        p.segments[i].ptr
    } else {
        sim.charge(phys, len)?;
        let ptr = match o.mem.take_range(sim, phys, len, false) {
            Ok(ptr) => ptr,
            Err(e) => {
                sim.uncharge(phys, len);
                return Err(e);
            }
        };
        let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.segments.push(Segment {
            ptr,
            size: len,
            in_use: true,
        });
        ptr
    };
    let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    p.note_highs();
    let seg_len = p.segments.iter().find(|s| s.ptr == ptr).map_or(len, |s| s.size);
    o.mem.record(
        ptr,
        Alloc {
            size: bytes,
            len: seg_len,
            phys,
            ordinal,
            ctx,
            kind: AllocKind::Pool(pool),
            buffer_id: 0,
        },
    );
    Ok(ptr)
}

/// Frees a pool allocation: its segment stays reserved.
pub(crate) fn free(o: &mut Objects, _sim: &Sim, pool: u64, ptr: u64) -> CuResult<()> {
    let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let seg = p
        .segments
        .iter_mut()
        .find(|s| s.ptr == ptr && s.in_use)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    seg.in_use = false;
    o.mem.allocs.remove(&ptr);
    Ok(())
}

/// Releases free segments until at most `keep` bytes stay reserved.
pub(crate) fn trim(o: &mut Objects, sim: &Sim, pool: u64, keep: u64) -> CuResult<()> {
    let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut plan = p.trim_plan(keep);
    plan.sort_unstable_by(|a, b| b.cmp(a));
    let phys = p.phys;
    let released: Vec<Segment> = plan.into_iter().map(|i| p.segments.remove(i)).collect();
    for s in released {
        o.mem.give_range(phys, s.ptr, s.size);
        sim.uncharge(phys, s.size);
    }
    Ok(())
}

/// At a synchronisation point every pool gives back what exceeds its release threshold.
pub(crate) fn trim_all_to_threshold(o: &mut Objects, sim: &Sim) {
    let pools: Vec<(u64, u64)> = o.pools.iter().map(|(&h, p)| (h, p.release_threshold)).collect();
    for (h, keep) in pools {
        let _ = trim(o, sim, h, keep);
    }
}

/// cuMemPoolDestroy: releases everything (a default pool cannot be destroyed).
pub(crate) fn destroy(o: &mut Objects, sim: &Sim, pool: u64) -> CuResult<()> {
    if o.device_pools.iter().any(|d| d.0 == pool) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = o.pools.remove(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for s in p.segments {
        o.mem.allocs.remove(&s.ptr);
        o.mem.give_range(p.phys, s.ptr, s.size);
        sim.uncharge(p.phys, s.size);
    }
    for d in o.device_pools.iter_mut() {
        if d.1 == pool {
            d.1 = d.0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(ptr: u64, size: u64, in_use: bool) -> Segment {
        Segment { ptr, size, in_use }
    }

    #[test]
    fn reservation_accounting() {
        let mut p = Pool::new(0, 0);
        p.segments = vec![
            seg(0, 2, true),
            seg(10, 4, false),
            seg(20, 8, false),
            seg(30, 6, true),
        ];
        assert_eq!(p.reserved(), 20);
        assert_eq!(p.used(), 8);
        assert_eq!(p.best_fit(3), Some(1));
        assert_eq!(p.best_fit(5), Some(2));
        assert_eq!(p.best_fit(9), None);
        // Trim releases the largest free segments first, never below `keep`.
        assert_eq!(p.trim_plan(15), vec![1]);
        assert_eq!(p.trim_plan(12), vec![2]);
        assert_eq!(p.trim_plan(8), vec![2, 1]);
        assert_eq!(p.trim_plan(9), vec![2]);
        assert_eq!(p.trim_plan(0), vec![2, 1]);
        assert_eq!(p.trim_plan(17), Vec::<usize>::new());
        assert_eq!(p.trim_plan(20), Vec::<usize>::new());
    }
}

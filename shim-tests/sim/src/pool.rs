//! Stream-ordered memory pools (cuMemPool*, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync).
//!
//! A pool reserves device memory in granularity-rounded segments (one allocation per segment) and keeps a
//! freed segment reserved for reuse: the device stays charged for everything reserved. Memory goes back to
//! the device only when trimmed (cuMemPoolTrimTo) or at a synchronisation point, down to the pool's
//! CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0), as the real driver does. RESERVED_MEM_CURRENT is therefore
//! exactly what the pool costs the device. cuMemPoolDestroy with allocations still out returns at once and the
//! pool's memory goes back when the last of them is freed (cuda.h).
//!
//! Sharing between processes (cuMemPoolExportToShareableHandle / cuMemPoolImportFromShareableHandle /
//! cuMemPoolExportPointer / cuMemPoolImportPointer, POSIX descriptors): a pool created with handle types is
//! named by a memfd of its own (its inode is the pool's identity; it holds the device's physical index). An
//! exported pointer's segment is made memfd-backed and recorded as an interprocess export (`ipc`), so an
//! importer maps the same bytes and holds them: the segment's memory stays (charged to the exporter) until the
//! exporter's pool has let go of it (trimmed, destroyed) and every importer has freed its pointer.

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
    /// `CUmemPoolProps::handleTypes`: what it may be exported as (0: not shareable).
    pub handle_types: u32,
    /// The memfd naming this pool to other processes (made at its first export), else -1.
    share_fd: i32,
    /// An imported pool: the exporter's pool identity (its memfd's inode). It serves no allocations.
    pub imported: Option<u64>,
    /// Destroyed while allocations were out: lives on (under a handle nobody holds) until the last is freed.
    pub destroyed: bool,
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
            handle_types: 0,
            share_fd: -1,
            imported: None,
            destroyed: false,
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

/// cuMemPoolCreate (and the default pools: `handle_types` 0).
pub(crate) fn create(o: &mut Objects, sim: &Sim, ordinal: usize, handle_types: u32) -> CuResult<u64> {
    let phys = *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let h = new_handle(Kind::Pool);
    let mut p = Pool::new(ordinal, phys);
    p.handle_types = handle_types;
    o.pools.insert(h, p);
    Ok(h)
}

const POOL_MAGIC: &[u8; 8] = b"CUSIMPOL";
const PTR_MAGIC: &[u8; 8] = b"CUSIMPPT";

/// The memfd naming `pool` to other processes, made at the first export: it holds the magic and the device's
/// physical index.
fn share_fd(o: &mut Objects, pool: u64) -> CuResult<i32> {
    let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.imported.is_some() || p.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.share_fd < 0 {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(POOL_MAGIC);
        b[8..12].copy_from_slice(&(p.phys as u32).to_le_bytes());
        // SAFETY: memfd_create with a static name; pwrite of our own buffer into our own descriptor.
        let fd = unsafe {
            let fd = libc::memfd_create(c"cudasim-pool".as_ptr(), libc::MFD_CLOEXEC);
            if fd >= 0 && libc::pwrite(fd, b.as_ptr().cast(), b.len(), 0) != b.len() as isize {
                libc::close(fd);
                -1
            } else {
                fd
            }
        };
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        p.share_fd = fd;
    }
    Ok(p.share_fd)
}

/// cuMemPoolExportToShareableHandle (POSIX descriptor): a new descriptor naming the pool, which the caller owns.
pub(crate) fn export(o: &mut Objects, pool: u64, handle_type: u32) -> CuResult<i32> {
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let fd = share_fd(o, pool)?;
    // SAFETY: duplicating our memfd for the caller.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(dup)
}

/// cuMemPoolImportFromShareableHandle (POSIX descriptor): a pool of this process standing for the exporter's,
/// from which only exported pointers can be imported.
pub(crate) fn import(o: &mut Objects, sim: &Sim, fd: i32, handle_type: u32) -> CuResult<u64> {
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let mut b = [0u8; 16];
    // SAFETY: reading into our own buffer from the caller's descriptor.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize || &b[..8] != POOL_MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let phys = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
    let ordinal = sim
        .visible
        .iter()
        .position(|&v| v == phys)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let (ino, _) = crate::vmm::inode(fd).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = new_handle(Kind::Pool);
    let mut p = Pool::new(ordinal, phys);
    p.handle_types = handle_type;
    p.imported = Some(ino);
    o.pools.insert(h, p);
    Ok(h)
}

/// cuMemPoolExportPointer: `ptr` must be a live allocation of a shareable pool. Its segment becomes an
/// interprocess export (memfd-backed, same addresses here).
pub(crate) fn export_pointer(o: &mut Objects, sim: &Sim, ptr: u64) -> CuResult<[u8; 64]> {
    let a = o.mem.allocs.get(&ptr).cloned().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let AllocKind::Pool(pool) = a.kind else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let fd = share_fd(o, pool)?;
    let (ino, _) = crate::vmm::inode(fd).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut h = crate::ipc::export_range(o, sim, ptr, a.len, a.phys)?;
    h.pool = ino;
    Ok(crate::ipc::encode_as(PTR_MAGIC, &h))
}

/// cuMemPoolImportPointer: maps the exported allocation `data` names, from the pool it was exported from.
pub(crate) fn import_pointer(o: &mut Objects, sim: &Sim, pool: u64, data: &[u8; 64]) -> CuResult<u64> {
    let h = crate::ipc::decode_as(PTR_MAGIC, data).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let p = o.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.imported != Some(h.pool) || h.pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::ipc::open_export(o, sim, &h, AllocKind::PoolImport)
}

/// Gives a segment back to the device: an exported one through its export (the memory lives on while an
/// importer holds it).
fn release_segment(o: &mut Objects, sim: &Sim, phys: usize, s: &Segment) {
    let exported = crate::ipc::free_export(o, sim, s.ptr, s.size);
    o.mem.give_range(phys, s.ptr, s.size);
    if !exported {
        sim.uncharge(phys, s.size);
    }
}

fn device_pools<'a>(o: &'a mut Objects, sim: &Sim, ordinal: usize) -> CuResult<&'a mut (u64, u64)> {
    if ordinal >= sim.visible.len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    while o.device_pools.len() < sim.visible.len() {
        o.device_pools.push((0, 0));
    }
    if o.device_pools[ordinal].0 == 0 {
        let p = create(o, sim, ordinal, 0)?;
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
    if p.imported.is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE); // imported pools serve no allocations (cuda.h)
    }
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
pub(crate) fn free(o: &mut Objects, sim: &Sim, pool: u64, ptr: u64) -> CuResult<()> {
    let p = o.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let seg = p
        .segments
        .iter_mut()
        .find(|s| s.ptr == ptr && s.in_use)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    seg.in_use = false;
    o.mem.allocs.remove(&ptr);
    if p.destroyed && p.used() == 0 {
        if let Some(p) = o.pools.remove(&pool) {
            release_all(o, sim, p);
        }
    }
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
        release_segment(o, sim, phys, &s);
    }
    Ok(())
}

/// At a synchronisation point every pool gives back what exceeds its release threshold.
pub(crate) fn trim_all_to_threshold(o: &mut Objects, sim: &Sim) {
    let pools: Vec<(u64, u64)> = o
        .pools
        .iter()
        .filter(|(_, p)| !p.destroyed)
        .map(|(&h, p)| (h, p.release_threshold))
        .collect();
    for (h, keep) in pools {
        let _ = trim(o, sim, h, keep);
    }
}

/// cuMemPoolDestroy (a default pool cannot be destroyed). With allocations still out the pool lives on under a
/// handle nobody holds until the last of them is freed (cuda.h: its resources go back then).
pub(crate) fn destroy(o: &mut Objects, sim: &Sim, pool: u64) -> CuResult<()> {
    if o.device_pools.iter().any(|d| d.0 == pool) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut p = o.pools.remove(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.used() > 0 {
        let hidden = new_handle(Kind::Pool);
        for s in p.segments.iter().filter(|s| s.in_use) {
            if let Some(a) = o.mem.allocs.get_mut(&s.ptr) {
                a.kind = AllocKind::Pool(hidden);
            }
        }
        p.destroyed = true;
        o.pools.insert(hidden, p);
    } else {
        release_all(o, sim, p);
    }
    for d in o.device_pools.iter_mut() {
        if d.1 == pool {
            d.1 = d.0;
        }
    }
    Ok(())
}

/// Gives every segment of `p` back to the device.
fn release_all(o: &mut Objects, sim: &Sim, p: Pool) {
    for s in &p.segments {
        o.mem.allocs.remove(&s.ptr);
        release_segment(o, sim, p.phys, s);
    }
    if p.share_fd >= 0 {
        // SAFETY: closing the memfd `share_fd` made; descriptors handed out are the callers'.
        unsafe { libc::close(p.share_fd) };
    }
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

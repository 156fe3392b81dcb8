//! Device memory: where device pointers point, what each allocation charges, and moving bytes.
//!
//! Each device gets a large address-space reservation (`PROT_NONE`, `MAP_NORESERVE`); an allocation takes a
//! granularity-rounded range from it (first fit), made read-write, so pointers are unique in the process and
//! memcpy/memset really move bytes; a free returns the pages (`MADV_DONTNEED`) and the range. The rounded size
//! is charged to the device in the shared state (exact, across processes), which is what makes
//! CUDA_ERROR_OUT_OF_MEMORY and NVML's numbers right. The pre-3.2 ABI (`cuMemAlloc` with 32-bit pointers)
//! allocates from a small reservation below 4 GiB.

use std::collections::{BTreeMap, HashMap};

use crate::objects::Objects;
use crate::sim::Sim;
use crate::types::*;

/// A first-fit allocator over one address range.
#[derive(Default, Debug)]
pub(crate) struct Heap {
    pub base: u64,
    pub size: u64,
    /// Free ranges: start → length (coalesced).
    free: BTreeMap<u64, u64>,
}

impl Heap {
    pub(crate) fn new(base: u64, size: u64) -> Heap {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        Heap { base, size, free }
    }

    /// Takes `len` bytes aligned to `align` (a power of two).
    pub(crate) fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        let (start, flen, at) = self.free.iter().find_map(|(&s, &l)| {
            let at = s.div_ceil(align) * align;
            (at + len <= s + l).then_some((s, l, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + len < start + flen {
            self.free.insert(at + len, start + flen - at - len);
        }
        Some(at)
    }

    /// Returns a range taken by `alloc`.
    pub(crate) fn release(&mut self, start: u64, len: u64) {
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            l += nl;
        }
        self.free.insert(s, l);
    }

    pub(crate) fn contains(&self, p: u64) -> bool {
        p >= self.base && p < self.base + self.size
    }
}

/// What an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocKind {
    Device,
    Managed,
    /// From a memory pool (freed back to the pool; the pool owns the charge).
    Pool(u64),
    /// A module global (freed with its module).
    ModuleGlobal,
    /// The address range of a graph alloc node (memory comes from the device's graph pool when launched).
    Graph,
    /// Another process's allocation opened with cuIpcOpenMemHandle (closed with cuIpcCloseMemHandle).
    Ipc,
    /// Another process's pool allocation imported with cuMemPoolImportPointer (freed with cuMemFree(Async)).
    PoolImport,
}

/// One live device allocation.
#[derive(Clone, Debug)]
pub(crate) struct Alloc {
    /// Size asked for.
    pub size: u64,
    /// Address range taken (= bytes charged, unless the pool owns the charge).
    pub len: u64,
    pub phys: usize,
    pub ordinal: usize,
    pub ctx: u64,
    pub kind: AllocKind,
    pub buffer_id: u64,
}

/// The process's device and pinned-host allocations.
#[derive(Default)]
pub(crate) struct Memory {
    /// Per physical device, created on first allocation.
    heaps: HashMap<usize, Heap>,
    low: Option<Heap>,
    pub allocs: BTreeMap<u64, Alloc>,
    /// Pinned host allocations: address → size.
    pub host: BTreeMap<u64, u64>,
    /// Host ranges registered with cuMemHostRegister: address → size.
    pub registered: BTreeMap<u64, u64>,
    next_buffer_id: u64,
}

/// Reserves `size` bytes of address space (inaccessible until `commit`).
pub(crate) fn reserve_va(size: u64, hint: u64) -> Option<u64> {
    // SAFETY: an anonymous PROT_NONE mapping at a kernel-chosen (or hinted, non-fixed) address.
    let p = unsafe {
        libc::mmap(
            hint as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// Makes a reserved range readable and writable.
fn commit(p: u64, len: u64) -> bool {
    // SAFETY: [p, p+len) lies inside a reservation this module made.
    unsafe {
        libc::mprotect(
            p as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Drops the pages of a range and makes it inaccessible again.
pub(crate) fn decommit(p: u64, len: u64) {
    // SAFETY: [p, p+len) lies inside a reservation this module made and no longer holds an allocation.
    unsafe {
        libc::madvise(p as *mut libc::c_void, len as usize, libc::MADV_DONTNEED);
        libc::mprotect(p as *mut libc::c_void, len as usize, libc::PROT_NONE);
    }
}

impl Memory {
    fn heap(&mut self, sim: &Sim, phys: usize) -> CuResult<&mut Heap> {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.heaps.entry(phys) {
            // Four times the device memory: pools and fragmentation never run out of addresses first.
            let size = sim.cfg.devices[phys].memory.saturating_mul(4).max(1 << 30);
            let size = sim.round(size);
            // Over-reserve by one granule to align the base.
            let g = sim.cfg.granularity;
            let raw = reserve_va(size + g, 0).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            let base = raw.div_ceil(g) * g;
            slot.insert(Heap::new(base, size));
        }
        Ok(self.heaps.get_mut(&phys).expect("inserted above"))
    }

    fn low_heap(&mut self) -> CuResult<&mut Heap> {
        if self.low.is_none() {
            const LOW_SIZE: u64 = 1 << 30;
            let p = reserve_va(LOW_SIZE, 0x4000_0000).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            if p + LOW_SIZE > u32::MAX as u64 {
                // SAFETY: unmapping the reservation just made.
                unsafe { libc::munmap(p as *mut libc::c_void, LOW_SIZE as usize) };
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            self.low = Some(Heap::new(p, LOW_SIZE));
        }
        Ok(self.low.as_mut().expect("set above"))
    }

    /// Takes `len` bytes of address space on `phys` (no charge) and makes them accessible.
    pub(crate) fn take_range(&mut self, sim: &Sim, phys: usize, len: u64, low: bool) -> CuResult<u64> {
        let g = sim.cfg.granularity;
        let heap = if low {
            self.low_heap()?
        } else {
            self.heap(sim, phys)?
        };
        let p = heap.alloc(len, g).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if !commit(p, len) {
            heap.release(p, len);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(p)
    }

    /// Returns a range taken by `take_range`.
    pub(crate) fn give_range(&mut self, phys: usize, p: u64, len: u64) {
        decommit(p, len);
        if let Some(low) = self.low.as_mut().filter(|h| h.contains(p)) {
            low.release(p, len);
        } else if let Some(h) = self.heaps.get_mut(&phys) {
            h.release(p, len);
        }
    }

    /// Records an allocation.
    pub(crate) fn record(&mut self, p: u64, mut a: Alloc) {
        self.next_buffer_id += 1;
        a.buffer_id = self.next_buffer_id;
        self.allocs.insert(p, a);
    }

    /// The allocation containing `p`: (start, allocation).
    pub(crate) fn find(&self, p: u64) -> Option<(u64, &Alloc)> {
        let (&s, a) = self.allocs.range(..=p).next_back()?;
        (p < s + a.size.max(1)).then_some((s, a))
    }

    /// The pinned (allocated or registered) host range containing `p`: (start, size).
    pub(crate) fn find_host(&self, p: u64) -> Option<(u64, u64)> {
        [&self.host, &self.registered].into_iter().find_map(|m| {
            let (&s, &l) = m.range(..=p).next_back()?;
            (p < s + l.max(1)).then_some((s, l))
        })
    }
}

/// Allocates `bytes` of device memory in context `ctx` (cuMemAlloc, cuMemAllocManaged, …).
pub(crate) fn alloc(
    o: &mut Objects,
    sim: &Sim,
    ctx: u64,
    bytes: u64,
    kind: AllocKind,
    low: bool,
) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ordinal, phys) = crate::context::device_of(o, ctx)?;
    // Paged managed memory (`managed.rs`): whole units, charged as kernels make them resident.
    let paged = kind == AllocKind::Managed && crate::managed::on(sim);
    let (len, charged) = match paged {
        true => {
            let u = crate::managed::UNIT;
            let len = sim.round(bytes).div_ceil(u) * u;
            (len, 0)
        }
        false => (sim.round(bytes), sim.round(bytes)),
    };
    sim.charge(phys, charged)?;
    match o.mem.take_range(sim, phys, len, low) {
        Ok(p) => {
            if paged {
                crate::managed::on_alloc(o, p, len, phys);
            }
            o.mem.record(
                p,
                Alloc {
                    size: bytes,
                    len,
                    phys,
                    ordinal,
                    ctx,
                    kind,
                    buffer_id: 0,
                },
            );
            Ok(p)
        }
        Err(e) => {
            sim.uncharge(phys, charged);
            Err(e)
        }
    }
}

/// cuMemFree: unknown pointers (and pointers into the middle of an allocation) are CUDA_ERROR_INVALID_VALUE.
pub(crate) fn free(o: &mut Objects, sim: &Sim, p: u64) -> CuResult<()> {
    let a = o.mem.allocs.get(&p).cloned().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match a.kind {
        AllocKind::Pool(pool) => crate::pool::free(o, sim, pool, p),
        AllocKind::ModuleGlobal | AllocKind::Ipc => Err(CUDA_ERROR_INVALID_VALUE),
        AllocKind::Graph => crate::graph_mem::free(o, p),
        AllocKind::PoolImport => crate::ipc::close_mem_handle(o, sim, p),
        AllocKind::Device | AllocKind::Managed => {
            o.mem.allocs.remove(&p);
            let exported = crate::ipc::free_export(o, sim, p, a.len);
            o.mem.give_range(a.phys, p, a.len);
            if a.kind == AllocKind::Managed && crate::managed::on(sim) {
                crate::managed::on_free(o, sim, p, a.len, a.phys);
            } else if !exported {
                sim.uncharge(a.phys, a.len);
            }
            Ok(())
        }
    }
}

/// Frees every plain allocation of a context being destroyed (pool allocations belong to their pool).
pub(crate) fn free_for_context(o: &mut Objects, sim: &Sim, ctx: u64) {
    let mine: Vec<u64> = o
        .mem
        .allocs
        .iter()
        .filter(|(_, a)| a.ctx == ctx && matches!(a.kind, AllocKind::Device | AllocKind::Managed))
        .map(|(&p, _)| p)
        .collect();
    for p in mine {
        let _ = free(o, sim, p);
    }
}

/// cuMemAllocHost / cuMemHostAlloc: page-aligned host memory (not device memory).
pub(crate) fn host_alloc(o: &mut Objects, bytes: u64) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: an anonymous private read-write mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    o.mem.host.insert(p as u64, bytes);
    Ok(p as u64)
}

/// cuMemFreeHost.
pub(crate) fn host_free(o: &mut Objects, p: u64) -> CuResult<()> {
    let len = o.mem.host.remove(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: unmapping a mapping host_alloc made, which the program gave back.
    unsafe { libc::munmap(p as *mut libc::c_void, len as usize) };
    Ok(())
}

/// Checks that [p, p+len) is device-accessible memory of this process: a device allocation, a mapped VMM
/// range with access enabled, or pinned host memory.
pub(crate) fn check_device_range(o: &Objects, p: u64, len: u64) -> CuResult<()> {
    if len == 0 {
        return Ok(());
    }
    let end = p.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some((s, a)) = o.mem.find(p) {
        if end <= s + a.len {
            return Ok(());
        }
    }
    if let Some((s, l)) = o.mem.find_host(p) {
        if end <= s + l {
            return Ok(());
        }
    }
    if o.vmm.accessible(p, len) {
        return Ok(());
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// Whether `p` is device memory (for cuMemcpy's unified addressing).
pub(crate) fn is_device_memory(o: &Objects, p: u64) -> bool {
    o.mem.find(p).is_some() || o.mem.find_host(p).is_some() || o.vmm.accessible(p, 1)
}

/// Copies `len` bytes; the ranges have been validated (or are the program's host memory).
pub(crate) fn copy(dst: u64, src: u64, len: u64) {
    if len == 0 {
        return;
    }
    // SAFETY: device ranges were validated against live allocations; host ranges are the program's
    // responsibility, exactly as with a real driver's memcpy.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) }
}

/// Fills `count` elements of `width` bytes (1, 2 or 4) at `dst` with `value`.
pub(crate) fn fill(dst: u64, value: u32, width: u64, count: u64) {
    // SAFETY: [dst, dst + width*count) was validated against live allocations by the caller.
    unsafe {
        match width {
            1 => std::ptr::write_bytes(dst as *mut u8, value as u8, count as usize),
            2 => std::slice::from_raw_parts_mut(dst as *mut u16, count as usize).fill(value as u16),
            _ => std::slice::from_raw_parts_mut(dst as *mut u32, count as usize).fill(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_first_fit_and_coalescing() {
        let mut h = Heap::new(0x10000, 0x10000);
        let a = h.alloc(0x4000, 0x1000).unwrap();
        let b = h.alloc(0x4000, 0x1000).unwrap();
        assert_eq!(a, 0x10000);
        assert_eq!(b, 0x14000);
        h.release(a, 0x4000);
        let c = h.alloc(0x2000, 0x1000).unwrap();
        assert_eq!(c, 0x10000);
        h.release(c, 0x2000);
        h.release(b, 0x4000);
        assert_eq!(h.alloc(0x10000, 0x1000), Some(0x10000));
        assert_eq!(h.alloc(1, 1), None);
    }

    #[test]
    fn heap_alignment() {
        let mut h = Heap::new(0x1000, 0x100000);
        let a = h.alloc(0x1000, 0x10000).unwrap();
        assert_eq!(a % 0x10000, 0);
        h.release(a, 0x1000);
        assert_eq!(h.alloc(0x100000, 1), Some(0x1000));
    }
}

//! Interprocess memory (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle), between processes of
//! one state file.
//!
//! Exporting a cuMemAlloc allocation moves its bytes into a memfd mapped over the same addresses (so the
//! exporter's pointer keeps working) and records the export in the shared state (`state::IpcExport`). The
//! 64-byte handle names the export (entry, id) and where an importer finds the memfd (`/proc/<pid>/fd/<fd>`
//! of the exporter: same pid namespace). An importer maps the memfd at an address of its own; opening the
//! handle again in the same process counts a reference (cuda.h); the exporting process itself cannot open it
//! (CUDA_ERROR_INVALID_CONTEXT).
//!
//! Lifetime and charge (cuda.h calls a cuMemFree before the importers close undefined; the simulator models
//! what a reference-counting driver does): the bytes stay charged to the exporter's process (NVML reports them
//! there) until the exporter has freed the allocation *and* every importer has closed it. An importer that dies
//! lets go (its slot's opens are dropped when the slot is reclaimed); an exporter that dies takes the charge
//! with it (its slot's memory goes).

use std::collections::HashMap;

use crate::memory::{Alloc, AllocKind};
use crate::objects::Objects;
use crate::sim::Sim;
use crate::types::*;

const MAGIC: &[u8; 8] = b"CUSIMIPC";

/// An export of this process: allocation start → (entry, id, memfd).
#[derive(Default)]
pub(crate) struct Ipc {
    exports: HashMap<u64, (usize, u64, i32)>,
    /// Opened imports: (entry, id) → (address, opens).
    opened: HashMap<(usize, u64), (u64, u32)>,
}

/// What a 64-byte handle to exported memory says (IPC handles, VMM fabric handles, pool pointer exports):
/// which export entry, and where an importer finds the memory (`/proc/<pid>/fd/<fd>` of the exporter).
pub(crate) struct Handle {
    pub id: u64,
    pub entry: usize,
    pub pid: u32,
    pub fd: i32,
    pub len: u64,
    pub phys: usize,
    /// Pool pointer exports: the pool's identity (its shareable descriptor's inode); else 0.
    pub pool: u64,
}

fn encode(h: &Handle) -> [u8; 64] {
    encode_as(MAGIC, h)
}

fn decode(b: &[u8; 64]) -> Option<Handle> {
    decode_as(MAGIC, b)
}

/// A handle's 64 bytes, tagged with `magic` (one per kind of handle, so one kind is never taken for another).
pub(crate) fn encode_as(magic: &[u8; 8], h: &Handle) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(magic);
    b[8..16].copy_from_slice(&h.id.to_le_bytes());
    b[16..20].copy_from_slice(&(h.entry as u32).to_le_bytes());
    b[20..24].copy_from_slice(&h.pid.to_le_bytes());
    b[24..28].copy_from_slice(&h.fd.to_le_bytes());
    b[28..36].copy_from_slice(&h.len.to_le_bytes());
    b[36..40].copy_from_slice(&(h.phys as u32).to_le_bytes());
    b[40..48].copy_from_slice(&h.pool.to_le_bytes());
    b
}

/// The handle in `b`, if it carries `magic`.
pub(crate) fn decode_as(magic: &[u8; 8], b: &[u8; 64]) -> Option<Handle> {
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    (&b[..8] == magic).then(|| Handle {
        id: u64_at(8),
        entry: u32_at(16) as usize,
        pid: u32_at(20),
        fd: u32_at(24) as i32,
        len: u64_at(28),
        phys: u32_at(36) as usize,
        pool: u64_at(40),
    })
}

/// Maps `fd` over [p, p+len) (shared, read-write).
fn map_fd(p: u64, len: u64, fd: i32) -> bool {
    // SAFETY: [p, p+len) is a range of this process's device reservation that the caller owns.
    unsafe {
        libc::mmap(
            p as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        ) != libc::MAP_FAILED
    }
}

/// Puts an anonymous reservation back over [p, p+len) (dropping the memfd's mapping).
pub(crate) fn unmap_fd(p: u64, len: u64) {
    // SAFETY: as in `map_fd`; PROT_NONE, as the rest of the reservation.
    unsafe {
        libc::mmap(
            p as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// A memfd holding the bytes of [p, p+len) (resident pages only: untouched memory stays unallocated).
fn memfd_of(p: u64, len: u64) -> CuResult<i32> {
    // SAFETY: plain libc calls; [p, p+len) is a committed allocation of this process.
    unsafe {
        let fd = libc::memfd_create(c"cudasim-ipc".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        if libc::ftruncate(fd, len as libc::off_t) != 0 {
            libc::close(fd);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let page = 4096u64;
        let mut resident = vec![0u8; len.div_ceil(page) as usize];
        let probe = libc::mincore(p as *mut libc::c_void, len as usize, resident.as_mut_ptr()) == 0;
        for (i, r) in resident.iter().enumerate() {
            if probe && r & 1 == 0 {
                continue;
            }
            let off = i as u64 * page;
            let n = page.min(len - off) as usize;
            if libc::pwrite(fd, (p + off) as *const libc::c_void, n, off as libc::off_t) != n as isize {
                libc::close(fd);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        Ok(fd)
    }
}

/// cuIpcGetMemHandle: `p` must be the start of a cuMemAlloc allocation.
pub(crate) fn get_mem_handle(o: &mut Objects, sim: &Sim, p: u64) -> CuResult<[u8; 64]> {
    let a = o.mem.allocs.get(&p).cloned().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if a.kind != AllocKind::Device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    export_range(o, sim, p, a.len, a.phys).map(|h| encode(&h))
}

/// Makes [p, p+len) (a whole allocation of this process on `phys`) memfd-backed at the same addresses and
/// records it as an export: the handle an importer needs (its `pool` 0).
pub(crate) fn export_range(o: &mut Objects, sim: &Sim, p: u64, len: u64, phys: usize) -> CuResult<Handle> {
    let pid = std::process::id();
    if let Some(&(entry, id, fd)) = o.ipc.exports.get(&p) {
        return Ok(Handle {
            id,
            entry,
            pid,
            fd,
            len,
            phys,
            pool: 0,
        });
    }
    let fd = memfd_of(p, len)?;
    if !map_fd(p, len, fd) {
        // SAFETY: closing the memfd just made.
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let id = (u64::from(pid) << 32) | u64::from(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let slot = sim.slot()?;
    // A full table leaves the allocation as it was (now memfd-backed, which changes nothing for the exporter).
    let entry = sim
        .shared
        .ipc_export(id, slot, phys, len)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    o.ipc.exports.insert(p, (entry, id, fd));
    Ok(Handle {
        id,
        entry,
        pid,
        fd,
        len,
        phys,
        pool: 0,
    })
}

/// cuMemFree of an exported allocation: the address range goes now; the charge when the last importer closes.
/// False when `p` was not exported.
pub(crate) fn free_export(o: &mut Objects, sim: &Sim, p: u64, len: u64) -> bool {
    let Some((entry, id, fd)) = o.ipc.exports.remove(&p) else {
        return false;
    };
    unmap_fd(p, len);
    // SAFETY: closing this module's memfd; importers hold their own descriptions and mappings.
    unsafe { libc::close(fd) };
    sim.shared.ipc_drop(entry, id, None);
    true
}

/// cuIpcOpenMemHandle.
pub(crate) fn open_mem_handle(o: &mut Objects, sim: &Sim, b: &[u8; 64]) -> CuResult<u64> {
    let h = decode(b).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if h.pid == std::process::id() {
        crate::context::current(o, sim)?;
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    open_export(o, sim, &h, AllocKind::Ipc)
}

/// The exporter's memfd named by `h`, opened here (`/proc/<pid>/fd/<fd>`: same pid namespace); -1 if gone.
pub(crate) fn open_exporters_fd(h: &Handle) -> i32 {
    let path = std::ffi::CString::new(format!("/proc/{}/fd/{}", h.pid, h.fd)).expect("no NUL");
    // SAFETY: opening a path made above.
    unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }
}

/// Maps another process's export `h` at an address of this process, recorded as `kind` (IPC memory, an
/// imported pool pointer); opening it again counts a reference (closed by [`close_mem_handle`]).
pub(crate) fn open_export(o: &mut Objects, sim: &Sim, h: &Handle, kind: AllocKind) -> CuResult<u64> {
    let ctx = crate::context::current(o, sim)?;
    let ordinal = sim
        .visible
        .iter()
        .position(|&v| v == h.phys)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    if let Some((p, n)) = o.ipc.opened.get_mut(&(h.entry, h.id)) {
        *n += 1;
        return Ok(*p);
    }
    let slot = sim.slot()?;
    if !sim.shared.ipc_open(h.entry, h.id, slot) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let fd = open_exporters_fd(h);
    let mapped = (fd >= 0)
        .then(|| o.mem.take_range(sim, h.phys, h.len, false).ok())
        .flatten()
        .filter(|&p| {
            map_fd(p, h.len, fd) || {
                o.mem.give_range(h.phys, p, h.len);
                false
            }
        });
    if fd >= 0 {
        // SAFETY: the mapping keeps the memfd; this descriptor is ours.
        unsafe { libc::close(fd) };
    }
    let Some(p) = mapped else {
        sim.shared.ipc_drop(h.entry, h.id, Some(slot));
        return Err(CUDA_ERROR_MAP_FAILED);
    };
    o.mem.record(
        p,
        Alloc {
            size: h.len,
            len: h.len,
            phys: h.phys,
            ordinal,
            ctx,
            kind,
            buffer_id: 0,
        },
    );
    o.ipc.opened.insert((h.entry, h.id), (p, 1));
    Ok(p)
}

/// cuIpcCloseMemHandle: `p` as cuIpcOpenMemHandle returned it.
pub(crate) fn close_mem_handle(o: &mut Objects, sim: &Sim, p: u64) -> CuResult<()> {
    let key = o
        .ipc
        .opened
        .iter()
        .find(|(_, &(q, _))| q == p)
        .map(|(&k, _)| k)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let n = &mut o.ipc.opened.get_mut(&key).expect("found above").1;
    *n -= 1;
    if *n > 0 {
        return Ok(());
    }
    o.ipc.opened.remove(&key);
    if let Some(a) = o.mem.allocs.remove(&p) {
        unmap_fd(p, a.len);
        o.mem.give_range(a.phys, p, a.len);
    }
    sim.shared.ipc_drop(key.0, key.1, sim.slot().ok());
    Ok(())
}

// ---- interprocess events (cuIpcGetEventHandle / cuIpcOpenEventHandle) ----------------------------------------

const EVENT_MAGIC: &[u8; 8] = b"CUSIMEVT";

fn cell(at: usize) -> &'static std::sync::atomic::AtomicU64 {
    // SAFETY: `at` is an 8-byte shared mapping made by this module, unmapped only with its event (which is
    // then gone from the tables, so nothing reads it any more).
    unsafe { &*(at as *const std::sync::atomic::AtomicU64) }
}

fn map_cell(fd: i32) -> Option<usize> {
    // SAFETY: an 8-byte shared mapping of a memfd the caller holds.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// When `e`'s recorded work completes, as every process sharing it sees it.
pub(crate) fn event_time(e: &crate::stream::Event) -> Option<u64> {
    match e.ipc {
        Some((at, _)) => Some(cell(at).load(std::sync::atomic::Ordering::Acquire)).filter(|&t| t != 0),
        None => e.time,
    }
}

/// Makes a record of `e` visible to the other processes sharing it.
pub(crate) fn publish(e: &crate::stream::Event) {
    if let (Some((at, _)), Some(t)) = (e.ipc, e.time) {
        cell(at).store(t.max(1), std::sync::atomic::Ordering::Release);
    }
}

/// An event is destroyed: its shared time goes (other processes keep their own mapping).
pub(crate) fn event_destroyed(e: &crate::stream::Event) {
    if let Some((at, fd)) = e.ipc {
        // SAFETY: the mapping and descriptor this module made for the event.
        unsafe {
            libc::munmap(at as *mut libc::c_void, 8);
            if fd >= 0 {
                libc::close(fd);
            }
        }
    }
}

/// cuIpcGetEventHandle: for events created with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING.
pub(crate) fn get_event_handle(o: &mut Objects, ev: u64) -> CuResult<[u8; 64]> {
    let e = o.events.get_mut(&ev).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let need = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    if e.flags & need != need {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if e.ipc.is_none() {
        // SAFETY: memfd_create with a static name; ftruncate on the descriptor we own.
        let fd = unsafe { libc::memfd_create(c"cudasim-ipc-event".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: as above.
        if fd < 0 || unsafe { libc::ftruncate(fd, 8) } != 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let Some(at) = map_cell(fd) else {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        e.ipc = Some((at, fd));
        publish(e);
    }
    let fd = e.ipc.map(|(_, fd)| fd).unwrap_or(-1);
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(EVENT_MAGIC);
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..16].copy_from_slice(&fd.to_le_bytes());
    Ok(b)
}

/// cuIpcOpenEventHandle: an event of the current context that completes when the exporter's does.
pub(crate) fn open_event_handle(o: &mut Objects, sim: &Sim, b: &[u8; 64]) -> CuResult<u64> {
    if &b[..8] != EVENT_MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let fd = i32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    if pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let ctx = crate::context::current(o, sim)?;
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).expect("no NUL");
    // SAFETY: opening a path made above.
    let own = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if own < 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let at = map_cell(own);
    // SAFETY: the mapping keeps the memfd; this descriptor is ours.
    unsafe { libc::close(own) };
    let at = at.ok_or(CUDA_ERROR_MAP_FAILED)?;
    let h = crate::stream::event_create(o, ctx, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
    if let Some(e) = o.events.get_mut(&h) {
        e.ipc = Some((at, -1));
    }
    Ok(h)
}

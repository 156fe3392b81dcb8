//! Virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap / cuMemSetAccess / cuMemUnmap /
//! cuMemRelease / cuMemAddressFree), as PyTorch's expandable segments, NCCL and JAX use it.
//!
//! A physical allocation is a memfd of its size, charged to its device from cuMemCreate until every handle
//! reference is released (cuMemCreate's, and one more per cuMemRetainAllocationHandle) and every mapping is
//! unmapped (the real driver's lifetime rule, cuda.h on cuMemRelease). An address reservation is a `PROT_NONE`
//! range; cuMemMap maps the memfd there (`MAP_SHARED | MAP_FIXED`, so two mappings of one allocation share
//! bytes), cuMemSetAccess makes it accessible, cuMemUnmap puts the reservation back.

use std::collections::BTreeMap;

use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

/// A physical allocation (CUmemGenericAllocationHandle).
pub(crate) struct PhysAlloc {
    pub ordinal: usize,
    pub phys: usize,
    pub size: u64,
    fd: i32,
    maps: u32,
    /// Handle references not yet released (cuMemCreate: 1; each cuMemRetainAllocationHandle: +1).
    refs: u32,
    /// `CUmemAllocationProp::requestedHandleTypes` of cuMemCreate (what it may be exported as).
    handle_types: u32,
    /// Shared with other processes (`state::IpcExport` entry, id = the memfd's inode): exported by this process
    /// (`false`) or imported from another (`true`). Its charge lives with the export entry.
    shared: Option<(usize, u64, bool)>,
    /// The device file its POSIX exports are opened descriptions of (`CUDASIM_SHAREABLE_FD=device`), else -1.
    device_fd: i32,
    /// Host memory (`CU_MEM_LOCATION_TYPE_HOST*`): its location (type, id); charged to no device.
    pub host: Option<(u32, i32)>,
}

/// One mapping inside a reservation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapping {
    pub size: u64,
    pub handle: u64,
    /// Devices (bit = ordinal) with read-write access (cuMemSetAccess `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`):
    /// access is per device, and peer access enabled on a context does not grant it (VMM memory).
    pub rw: u64,
    /// Devices with read access (`PROT_READ` or `PROT_READWRITE`): what a kernel needs to load from it.
    pub read: u64,
}

impl Mapping {
    /// Read-write for device `dev` (`None`: for some device).
    pub(crate) fn writable_by(&self, dev: Option<usize>) -> bool {
        dev.map_or(self.rw != 0, |d| self.rw & bit(d) != 0)
    }

    /// Readable by device `dev` (`None`: by some device).
    pub(crate) fn readable_by(&self, dev: Option<usize>) -> bool {
        dev.map_or(self.read != 0, |d| self.read & bit(d) != 0)
    }
}

fn bit(ordinal: usize) -> u64 {
    1u64.checked_shl(ordinal as u32).unwrap_or(0)
}

/// The process's VMM objects.
#[derive(Default)]
pub(crate) struct Vmm {
    pub handles: BTreeMap<u64, PhysAlloc>,
    /// Reservation start → size.
    pub reservations: BTreeMap<u64, u64>,
    /// Mapping start → mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Bindings of physical allocations that are not mappings (each holds its memory like one): a sparse
    /// array's tile or mip tail (cuMemMapArrayAsync; key: the array and the subresource's bytes) or a range of
    /// a multicast object on one device (cuMulticastBindMem / BindAddr; key: the object, device, offset).
    pub bindings: BTreeMap<(u64, Vec<u8>), u64>,
    /// Multicast objects (cuMulticastCreate): handle → (size, handle references).
    pub multicasts: BTreeMap<u64, (u64, u32)>,
}

impl Vmm {
    /// Whether [p, p+len) lies in accessible mappings (contiguous).
    pub(crate) fn accessible(&self, p: u64, len: u64) -> bool {
        let end = p.saturating_add(len);
        let mut at = p;
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&s, m)) if at < s + m.size && m.writable_by(None) => at = s + m.size,
                _ => return false,
            }
        }
        true
    }

    /// Whether [p, p+len) lies in contiguous mappings a kernel on device `dev` (`None`: some device) may read
    /// (`write`: and write).
    pub(crate) fn kernel_access(&self, p: u64, len: u64, write: bool, dev: Option<usize>) -> bool {
        let end = p.saturating_add(len);
        let mut at = p;
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&s, m))
                    if at < s + m.size && (m.writable_by(dev) || (!write && m.readable_by(dev))) =>
                {
                    at = s + m.size
                }
                _ => return false,
            }
        }
        true
    }

    /// Whether `p` is mapped to host memory (a `CU_MEM_LOCATION_TYPE_HOST*` allocation).
    pub(crate) fn host_backed(&self, p: u64) -> bool {
        self.mapping_at(p)
            .and_then(|(_, m)| self.handles.get(&m.handle))
            .is_some_and(|a| a.host.is_some())
    }

    /// The mapping containing `p`: (start, mapping).
    pub(crate) fn mapping_at(&self, p: u64) -> Option<(u64, Mapping)> {
        let (&s, m) = self.mappings.range(..=p).next_back()?;
        (p < s + m.size).then_some((s, *m))
    }

    fn reservation_of(&self, p: u64, len: u64) -> Option<u64> {
        let (&s, &l) = self.reservations.range(..=p).next_back()?;
        (p + len <= s + l).then_some(s)
    }
}

fn check_granular(sim: &Sim, v: u64) -> CuResult<()> {
    if v == 0 || !v.is_multiple_of(sim.cfg.granularity) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// cuMemCreate: device memory (charged to the device), or pinned host memory (`CU_MEM_LOCATION_TYPE_HOST`,
/// `HOST_NUMA` node 0 — the simulator models one node —, `HOST_NUMA_CURRENT`), which no device is charged for.
pub(crate) fn create(o: &mut Objects, sim: &Sim, size: u64, prop: &MemAllocationProp) -> CuResult<u64> {
    check_granular(sim, size)?;
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let host = match (prop.location.type_, prop.location.id) {
        (CU_MEM_LOCATION_TYPE_DEVICE, _) => None,
        (CU_MEM_LOCATION_TYPE_HOST, _) => Some((CU_MEM_LOCATION_TYPE_HOST, 0)),
        (CU_MEM_LOCATION_TYPE_HOST_NUMA, 0) | (CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, _) => {
            Some((CU_MEM_LOCATION_TYPE_HOST_NUMA, 0))
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let (ordinal, phys) = match host {
        Some(_) => (0, 0),
        None => {
            let ordinal = usize::try_from(prop.location.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
            (
                ordinal,
                *sim.visible.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?,
            )
        }
    };
    let charge = |f: &dyn Fn(usize, u64) -> CuResult<()>| match host {
        Some(_) => Ok(()),
        None => f(phys, size),
    };
    charge(&|p, n| sim.charge(p, n))?;
    // SAFETY: memfd_create with a static NUL-terminated name; ftruncate on the fd we own.
    let fd = unsafe {
        let fd = libc::memfd_create(c"cudasim-vmm".as_ptr(), libc::MFD_CLOEXEC);
        if fd >= 0 && libc::ftruncate(fd, size as libc::off_t) != 0 {
            libc::close(fd);
            -1
        } else {
            fd
        }
    };
    if fd < 0 {
        charge(&|p, n| {
            sim.uncharge(p, n);
            Ok(())
        })?;
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let h = new_handle(Kind::VmmHandle);
    o.vmm.handles.insert(
        h,
        PhysAlloc {
            ordinal,
            phys,
            size,
            fd,
            maps: 0,
            refs: 1,
            handle_types: prop.requested_handle_types,
            shared: None,
            device_fd: -1,
            host,
        },
    );
    Ok(h)
}

pub(crate) fn inode(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; fstat on a descriptor the caller holds.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_ino, st.st_size as u64))
    }
}

/// Records `h` in the shared state at its first export: from then on its memory lives (charged to this process)
/// until every process holding it let go. Checks that it may be exported as `handle_type`.
fn share(o: &mut Objects, sim: &Sim, h: u64, handle_type: u32) -> CuResult<(usize, u64)> {
    let a = o
        .vmm
        .handles
        .get_mut(&h)
        .filter(|a| a.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if a.handle_types & handle_type == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if a.host.is_some() {
        // Host allocations are not shared between processes here (their charge model is the device's).
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if a.shared.is_none() {
        let (ino, _) = inode(a.fd).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let slot = sim.slot()?;
        let entry = sim
            .shared
            .ipc_export(ino, slot, a.phys, a.size)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        a.shared = Some((entry, ino, false));
    }
    let (entry, ino, _) = a.shared.expect("set above");
    Ok((entry, ino))
}

/// How POSIX exports are made (`CUDASIM_SHAREABLE_FD`): `memfd` (default), a descriptor of the allocation's
/// memfd, whose inode names it; `device`, as NVIDIA's driver makes them (an open of its control device, so every
/// export has the same inode), a new open description of one device file per allocation, which an importer
/// identifies by comparing open file descriptions with the exporter's (`kcmp`).
fn device_fds() -> CuResult<bool> {
    match std::env::var("CUDASIM_SHAREABLE_FD").ok().as_deref() {
        None | Some("memfd") => Ok(false),
        Some("device") => Ok(true),
        Some(v) => {
            eprintln!("cudasim: invalid CUDASIM_SHAREABLE_FD={v:?}: not memfd or device");
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

/// The device file `device` exports are opens of.
const DEVICE_FILE: &std::ffi::CStr = c"/dev/null";

/// cuMemExportToShareableHandle (POSIX file descriptor): a new descriptor, which the caller owns (see
/// [`device_fds`]).
pub(crate) fn export(o: &mut Objects, sim: &Sim, h: u64, handle_type: u32) -> CuResult<i32> {
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let device = device_fds()?;
    let (entry, _) = share(o, sim, h, handle_type)?;
    let a = o.vmm.handles.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if device && a.device_fd < 0 {
        // SAFETY: opening a constant path; the descriptor is ours.
        a.device_fd = unsafe { libc::open(DEVICE_FILE.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if a.device_fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let fds = (u64::from(a.fd as u32 + 1) << 32) | u64::from(a.device_fd as u32 + 1);
        sim.shared.ipc[entry]
            .device_fds
            .store(fds, std::sync::atomic::Ordering::Release);
    }
    let src = if device { a.device_fd } else { a.fd };
    // SAFETY: duplicating our descriptor (the same open description) for the caller.
    let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

/// The export a device descriptor `fd` is an open description of: a descriptor of its memfd, opened here.
fn memfd_of_device_fd(sim: &Sim, fd: i32) -> Option<i32> {
    use std::sync::atomic::Ordering::Acquire;
    // SAFETY: plain syscall on our pid and descriptor numbers; kcmp only compares.
    let same = |pid: u32, theirs: i32| unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            std::process::id() as libc::pid_t,
            pid as libc::pid_t,
            0, // KCMP_FILE
            fd,
            theirs,
        ) == 0
    };
    sim.shared.ipc.iter().find_map(|e| {
        let fds = e.device_fds.load(Acquire);
        if e.id.load(Acquire) == 0 || fds == 0 {
            return None;
        }
        let pid = sim.shared.procs[e.slot.load(Acquire) as usize].pid.load(Acquire);
        if !same(pid, (fds & 0xffff_ffff) as i32 - 1) {
            return None;
        }
        let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{}", (fds >> 32) as i32 - 1)).ok()?;
        // SAFETY: opening a path made above; the descriptor is ours.
        let own = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        (own >= 0).then_some(own)
    })
}

const FABRIC_MAGIC: &[u8; 8] = b"CUSIMFAB";

/// cuMemExportToShareableHandle (CU_MEM_HANDLE_TYPE_FABRIC): 64 bytes naming the allocation, which any process
/// on the node may import (as a node with IMEX channels for every process: the simulator checks no channel).
pub(crate) fn export_fabric(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<[u8; 64]> {
    let (entry, ino) = share(o, sim, h, CU_MEM_HANDLE_TYPE_FABRIC)?;
    let a = &o.vmm.handles[&h];
    Ok(crate::ipc::encode_as(
        FABRIC_MAGIC,
        &crate::ipc::Handle {
            id: ino,
            entry,
            pid: std::process::id(),
            fd: a.fd,
            len: a.size,
            phys: a.phys,
            pool: 0,
        },
    ))
}

/// cuMemImportFromShareableHandle (POSIX file descriptor from another process's export): a new handle to the
/// same memory, charged to nobody here (the exporter's charge lasts while any process holds it).
pub(crate) fn import(o: &mut Objects, sim: &Sim, fd: i32, handle_type: u32) -> CuResult<u64> {
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: stat is plain data; fstat only reads the caller's descriptor.
    let device = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR
    };
    let own = if device {
        memfd_of_device_fd(sim, fd).ok_or(CUDA_ERROR_INVALID_HANDLE)?
    } else {
        // SAFETY: duplicating the caller's descriptor; we own the copy.
        unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }
    };
    if let Some(h) = inode(own).and_then(|(ino, _)| imported_again(o, ino)) {
        // SAFETY: our copy, not kept: the allocation is here already.
        unsafe { libc::close(own) };
        return Ok(h);
    }
    import_own(o, sim, own, handle_type)
}

/// cuMemImportFromShareableHandle (CU_MEM_HANDLE_TYPE_FABRIC): the allocation the 64 bytes name.
pub(crate) fn import_fabric(o: &mut Objects, sim: &Sim, b: &[u8; 64]) -> CuResult<u64> {
    let h = crate::ipc::decode_as(FABRIC_MAGIC, b).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some(v) = imported_again(o, h.id) {
        return Ok(v);
    }
    let own = crate::ipc::open_exporters_fd(&h);
    if own >= 0 && inode(own).map(|(ino, _)| ino) != Some(h.id) {
        // SAFETY: our own descriptor, of another file than the export (the exporter's fd was reused).
        unsafe { libc::close(own) };
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    import_own(o, sim, own, CU_MEM_HANDLE_TYPE_FABRIC)
}

/// An allocation imported (or created) here already under identity `ino`: the same handle, one more reference.
fn imported_again(o: &mut Objects, ino: u64) -> Option<u64> {
    let (&h, a) = o
        .vmm
        .handles
        .iter_mut()
        .find(|(_, a)| a.shared.is_some_and(|s| s.1 == ino))?;
    a.refs += 1;
    Some(h)
}

/// Imports the exported allocation whose memfd this process now owns as `own` (-1: could not be opened).
fn import_own(o: &mut Objects, sim: &Sim, own: i32, handle_type: u32) -> CuResult<u64> {
    if own < 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let close = |e| {
        // SAFETY: our own descriptor, not kept.
        unsafe { libc::close(own) };
        Err(e)
    };
    let Some((ino, size)) = inode(own) else {
        return close(CUDA_ERROR_INVALID_HANDLE);
    };
    let Some(entry) = sim
        .shared
        .ipc
        .iter()
        .position(|e| e.id.load(std::sync::atomic::Ordering::Acquire) == ino)
    else {
        return close(CUDA_ERROR_INVALID_HANDLE);
    };
    let phys = sim.shared.ipc[entry]
        .phys
        .load(std::sync::atomic::Ordering::Relaxed) as usize;
    let Some(ordinal) = sim.visible.iter().position(|&v| v == phys) else {
        return close(CUDA_ERROR_INVALID_DEVICE);
    };
    let slot = match sim.slot() {
        Ok(s) => s,
        Err(e) => return close(e),
    };
    if !sim.shared.ipc_open(entry, ino, slot) {
        return close(CUDA_ERROR_INVALID_HANDLE);
    }
    let h = new_handle(Kind::VmmHandle);
    o.vmm.handles.insert(
        h,
        PhysAlloc {
            ordinal,
            phys,
            size,
            fd: own,
            maps: 0,
            refs: 1,
            handle_types: handle_type,
            shared: Some((entry, ino, true)),
            device_fd: -1,
            host: None,
        },
    );
    Ok(h)
}

fn drop_if_unused(o: &mut Objects, sim: &Sim, h: u64) {
    let done = o.vmm.handles.get(&h).is_some_and(|a| a.refs == 0 && a.maps == 0);
    if done {
        if let Some(a) = o.vmm.handles.remove(&h) {
            // SAFETY: closing the descriptors this module opened; no mapping uses them any more.
            unsafe {
                libc::close(a.fd);
                if a.device_fd >= 0 {
                    libc::close(a.device_fd);
                }
            }
            match a.shared {
                // Shared: the memory (and the exporter's charge) goes when the last process lets go.
                Some((entry, id, imported)) => {
                    sim.shared
                        .ipc_drop(entry, id, if imported { sim.slot().ok() } else { None })
                }
                None if a.host.is_none() => sim.uncharge(a.phys, a.size),
                None => {}
            }
        }
    }
}

/// cuMemRelease: drops one handle reference; the memory goes back once none is left and nothing maps it.
/// A multicast object's last release unbinds everything bound to it.
pub(crate) fn release(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    if let Some(m) = o.vmm.multicasts.get_mut(&h) {
        m.1 -= 1;
        if m.1 == 0 {
            o.vmm.multicasts.remove(&h);
            unbind_where(o, sim, |k| k.0 == h);
        }
        return Ok(());
    }
    let a = o
        .vmm
        .handles
        .get_mut(&h)
        .filter(|a| a.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    a.refs -= 1;
    drop_if_unused(o, sim, h);
    Ok(())
}

/// cuMemRetainAllocationHandle: the handle that maps `p` (the same value), with one more reference that needs
/// its own cuMemRelease.
pub(crate) fn retain(o: &mut Objects, p: u64) -> CuResult<u64> {
    let (_, m) = o.vmm.mapping_at(p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let a = o.vmm.handles.get_mut(&m.handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    a.refs += 1;
    Ok(m.handle)
}

/// cuMemAddressReserve: `size` bytes aligned to `align` (0 = granularity), at `addr` if given and free.
pub(crate) fn reserve(o: &mut Objects, sim: &Sim, size: u64, align: u64, addr: u64) -> CuResult<u64> {
    check_granular(sim, size)?;
    let align = if align == 0 { sim.cfg.granularity } else { align };
    if !align.is_power_of_two() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let raw = crate::memory::reserve_va(size + align, addr).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let start = if addr != 0 && raw == addr && addr.is_multiple_of(align) {
        addr
    } else {
        raw.div_ceil(align) * align
    };
    // SAFETY: trimming the parts of our own fresh PROT_NONE mapping outside [start, start+size).
    unsafe {
        if start > raw {
            libc::munmap(raw as *mut libc::c_void, (start - raw) as usize);
        }
        let tail = raw + size + align - (start + size);
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail as usize);
        }
    }
    o.vmm.reservations.insert(start, size);
    Ok(start)
}

/// cuMemAddressFree: the whole reservation, with nothing mapped in it.
pub(crate) fn address_free(o: &mut Objects, p: u64, size: u64) -> CuResult<()> {
    if o.vmm.reservations.get(&p) != Some(&size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if o.vmm.mappings.range(p..p + size).next().is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    o.vmm.reservations.remove(&p);
    // SAFETY: unmapping a reservation this module made, with no mappings left inside.
    unsafe { libc::munmap(p as *mut libc::c_void, size as usize) };
    Ok(())
}

/// cuMemMap.
pub(crate) fn map(o: &mut Objects, sim: &Sim, p: u64, size: u64, offset: u64, h: u64) -> CuResult<()> {
    check_granular(sim, size)?;
    if !offset.is_multiple_of(sim.cfg.granularity) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let a = o
        .vmm
        .handles
        .get(&h)
        .filter(|a| a.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if offset + size > a.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    o.vmm.reservation_of(p, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let overlaps = o
        .vmm
        .mappings
        .range(..p + size)
        .next_back()
        .is_some_and(|(&s, m)| s + m.size > p);
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: [p, p+size) is inside one of our reservations and not mapped; MAP_FIXED replaces only it.
    let r = unsafe {
        libc::mmap(
            p as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            a.fd,
            offset as libc::off_t,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    o.vmm.handles.get_mut(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?.maps += 1;
    o.vmm.mappings.insert(
        p,
        Mapping {
            size,
            handle: h,
            rw: 0,
            read: 0,
        },
    );
    Ok(())
}

/// cuMemUnmap: every mapping in [p, p+size), which must be covered exactly.
pub(crate) fn unmap(o: &mut Objects, sim: &Sim, p: u64, size: u64) -> CuResult<()> {
    let inside: Vec<(u64, Mapping)> = o.vmm.mappings.range(p..p + size).map(|(&s, m)| (s, *m)).collect();
    if inside.is_empty() || inside.iter().any(|(s, m)| s + m.size > p + size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (s, m) in inside {
        // SAFETY: putting our PROT_NONE reservation back over a mapping this module made.
        unsafe {
            libc::mmap(
                s as *mut libc::c_void,
                m.size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            );
        }
        o.vmm.mappings.remove(&s);
        if let Some(a) = o.vmm.handles.get_mut(&m.handle) {
            a.maps -= 1;
        }
        drop_if_unused(o, sim, m.handle);
    }
    Ok(())
}

/// cuMemSetAccess: for each (device ordinal, flags) of `grants`, flags 0 = none, 1 = read, 3 = read-write for
/// every mapping in [p, p+size); other devices' access is kept. The host protection is the union (what a copy,
/// which any device's engine may make, needs).
pub(crate) fn set_access(o: &mut Objects, p: u64, size: u64, grants: &[(usize, u32)]) -> CuResult<()> {
    let inside: Vec<u64> = o.vmm.mappings.range(p..p + size).map(|(&s, _)| s).collect();
    if inside.is_empty() || grants.iter().any(|&(_, f)| !matches!(f, 0 | 1 | 3)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for s in inside {
        if let Some(m) = o.vmm.mappings.get_mut(&s) {
            for &(dev, flags) in grants {
                let b = bit(dev);
                m.rw = if flags == 3 { m.rw | b } else { m.rw & !b };
                m.read = if flags != 0 { m.read | b } else { m.read & !b };
            }
            let prot = if m.rw != 0 {
                libc::PROT_READ | libc::PROT_WRITE
            } else if m.read != 0 {
                libc::PROT_READ
            } else {
                libc::PROT_NONE
            };
            // SAFETY: changing protection of a mapping this module made.
            unsafe { libc::mprotect(s as *mut libc::c_void, m.size as usize, prot) };
        }
    }
    Ok(())
}

/// Binds physical allocation `h` under `key` (it then holds the memory as a mapping does). A key already bound
/// is replaced.
pub(crate) fn bind(o: &mut Objects, sim: &Sim, key: (u64, Vec<u8>), h: u64) -> CuResult<()> {
    let a = o
        .vmm
        .handles
        .get_mut(&h)
        .filter(|a| a.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    a.maps += 1;
    if let Some(old) = o.vmm.bindings.insert(key, h) {
        drop_binding(o, sim, old);
    }
    Ok(())
}

fn drop_binding(o: &mut Objects, sim: &Sim, h: u64) {
    if let Some(a) = o.vmm.handles.get_mut(&h) {
        a.maps -= 1;
    }
    drop_if_unused(o, sim, h);
}

/// Removes every binding whose key matches; each one's memory goes if nothing else holds it.
pub(crate) fn unbind_where(o: &mut Objects, sim: &Sim, f: impl Fn(&(u64, Vec<u8>)) -> bool) -> usize {
    let keys: Vec<(u64, Vec<u8>)> = o.vmm.bindings.keys().filter(|k| f(k)).cloned().collect();
    for k in &keys {
        if let Some(h) = o.vmm.bindings.remove(k) {
            drop_binding(o, sim, h);
        }
    }
    keys.len()
}

/// The physical allocation mapped at `p` and the offset of `p` in it (cuMulticastBindAddr).
pub(crate) fn handle_at(o: &Objects, p: u64) -> CuResult<(u64, u64)> {
    let (s, m) = o.vmm.mapping_at(p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok((m.handle, p - s))
}

/// The ordinal a physical allocation lives on.
pub(crate) fn ordinal_of(o: &Objects, h: u64) -> CuResult<usize> {
    o.vmm
        .handles
        .get(&h)
        .map(|a| a.ordinal)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// cuMulticastCreate: the object itself holds no device memory here (what is bound to it does).
pub(crate) fn multicast_create(o: &mut Objects, sim: &Sim, size: u64, devices: u32) -> CuResult<u64> {
    check_granular(sim, size)?;
    if devices == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle(Kind::VmmHandle);
    o.vmm.multicasts.insert(h, (size, 1));
    Ok(h)
}

/// The size of multicast object `mc`.
pub(crate) fn multicast_size(o: &Objects, mc: u64) -> CuResult<u64> {
    o.vmm
        .multicasts
        .get(&mc)
        .map(|m| m.0)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

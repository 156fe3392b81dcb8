//! Virtual memory management (`cuMemCreate`, map, unmap, release, export and import of shareable handles,
//! sparse-array and multicast bindings): decoded here, accounted by `Memory::vmm`.

use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::{fd_key, shared_key, BindKey, Obj, VmmCall};
use crate::state::Shim;
use std::ffi::{c_int, c_uint, c_void};

/// `cuMemCreate`: charges `size` (granularity-aligned by contract) to `prop.location`, until the memory is
/// really gone: every reference released and every mapping unmapped (`memory::vmm`).
///
/// # Safety
/// `handle`, `prop` as the driver's contract says.
pub(crate) unsafe fn vmm_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
) -> CUresult {
    if prop.is_null() {
        return call();
    }
    // SAFETY: non-NULL, points to the caller's properties.
    let loc = unsafe { (*prop).location };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return call(); // host memory: not ours to count
    }
    let Some(dev) = s.devices.device(&s.cuda, loc.id) else {
        return s.mem.allocs().untracked(call);
    };
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!handle.is_null()).then(|| unsafe { *handle });
    let create = VmmCall::Create {
        dev,
        size: size as u64,
        out: &out,
    };
    s.mem.vmm(&s.cuda, &s.nvml, create, call)
}

/// A VMM call `what` through `call`.
fn vmm(s: &Shim, what: VmmCall<'_>, call: impl FnOnce() -> CUresult) -> CUresult {
    s.mem.vmm(&s.cuda, &s.nvml, what, call)
}

/// `cuMemRelease`: one reference fewer; the charge goes with the last one of an unmapped allocation (a
/// multicast object's bindings with its own).
pub(crate) fn vmm_release(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    vmm(s, VmmCall::Release(handle), call)
}

/// `cuMemRetainAllocationHandle`: one more reference to release.
///
/// # Safety
/// `handle` as the driver's contract says.
pub(crate) unsafe fn vmm_retain(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
) -> CUresult {
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!handle.is_null()).then(|| unsafe { *handle });
    vmm(s, VmmCall::Retain { out: &out }, call)
}

/// `cuMemMap`: a mapping keeps its allocation (and its charge) alive. The first mapping of memory imported from
/// another container charges its size to this process (no size is known before: fail closed from here on).
pub(crate) fn vmm_map(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let within = offset as u64..(offset as u64).saturating_add(size as u64);
    vmm(s, VmmCall::Map { ptr, within, handle }, call)
}

/// The identity both processes compute for a shareable handle of `handle_type` at `shareable` (the caller's
/// `int` descriptor for POSIX, 64 bytes for fabric): `None` for a type the shim cannot identify.
///
/// # Safety
/// `shareable` points to a handle of that type.
unsafe fn shareable_key(shareable: *const c_void, handle_type: c_uint) -> Option<u64> {
    match handle_type {
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR => {
            // SAFETY: an `int` descriptor there, as the function's contract says.
            fd_key(unsafe { *(shareable as *const c_int) })
        }
        CU_MEM_HANDLE_TYPE_FABRIC => {
            // SAFETY: a CUmemFabricHandle there (unaligned-tolerant read), as the contract says.
            let h = unsafe { (shareable as *const CUmemFabricHandle).read_unaligned() };
            Some(shared_key(&h.data))
        }
        _ => None,
    }
}

/// `cuMemExportToShareableHandle` (POSIX file descriptor, fabric handle): as `cuIpcGetMemHandle`, the
/// allocation's charge moves into the container's shared table, keyed by the descriptor's open file or the
/// fabric handle's bytes. Other handle types (Win32) are forwarded; their importers are charged as importers of
/// another container's memory (`vmm_import`).
///
/// # Safety
/// `shareable` as the driver's contract says (written on success: an `int` descriptor, a `CUmemFabricHandle`).
pub(crate) unsafe fn vmm_export(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_uint,
) -> CUresult {
    // SAFETY: non-NULL; the driver wrote a handle of this type there (read only on success).
    let key = || (!shareable.is_null()).then(|| unsafe { shareable_key(shareable, handle_type) })?;
    let undo = || {
        if handle_type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            // SAFETY: the descriptor the driver just made for this call, never handed to the caller.
            unsafe { libc::close(*(shareable as *const c_int)) };
        }
    };
    let export = VmmCall::Export {
        handle,
        key: &key,
        undo: &undo,
    };
    vmm(s, export, call)
}

/// `cuMemImportFromShareableHandle`: memory this container exported (a POSIX descriptor or fabric handle it
/// shared) is already charged (the new handle joins its shared entry); any other import — another container's
/// export, a handle type the shim cannot identify — is charged to this process from its first mapping
/// (`vmm_map`) until its last reference and mapping go.
///
/// # Safety
/// `handle`, `os_handle` as the driver's contract says (the handle written on success).
pub(crate) unsafe fn vmm_import(
    s: &Shim,
    real: impl Fn(*mut CUmemGenericAllocationHandle, *mut c_void, c_uint) -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CUresult {
    // A fabric handle is imported from a copy of the bytes keyed, which another thread cannot change in between.
    let mut fabric = (handle_type == CU_MEM_HANDLE_TYPE_FABRIC && !os_handle.is_null())
        // SAFETY: for fabric, `os_handle` points to the caller's CUmemFabricHandle.
        .then(|| unsafe { (os_handle as *const CUmemFabricHandle).read_unaligned() });
    let key = match (handle_type, &fabric) {
        (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, _) => fd_key(os_handle as usize as c_int),
        (_, Some(f)) => Some(shared_key(&f.data)),
        _ => None,
    };
    let os_handle = match fabric.as_mut() {
        Some(f) => (f as *mut CUmemFabricHandle).cast(),
        None => os_handle,
    };
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!handle.is_null()).then(|| unsafe { *handle });
    vmm(s, VmmCall::Import { out: &out, key }, || {
        real(handle, os_handle, handle_type)
    })
}

/// `cuMemUnmap`: the last mapping of a released allocation takes its charge with it.
pub(crate) fn vmm_unmap(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    let size = size as u64;
    vmm(s, VmmCall::Unmap { ptr, size }, call)
}

/// The binding key of a sparse array's tile or mip tail.
fn tile_key(m: &CUarrayMapInfo) -> BindKey {
    BindKey {
        obj: Obj::Array(m.resource as u64),
        dev: m.deviceBitMask as i64,
        off: m.subresourceType as u64,
        rest: m.subresource,
    }
}

/// Most entries of one `cuMemMapArrayAsync` list the shim copies (about 6 MiB); a longer list is refused.
const MAX_MAP_ENTRIES: c_uint = 1 << 16;

/// `cuMemMapArrayAsync` (+ `_ptsz`): a VMM handle bound to a sparse array's tile holds its memory as a mapping
/// does (a released handle stays charged while bound); an unmap entry lets go of it. cuda.h does not promise
/// a failed list changed nothing: on failure its map entries stay charged as bound and its unmap entries as
/// not undone (fail closed, until an unmap of the same tile or the array's destruction).
///
/// # Safety
/// `list` holds `count` entries, as the driver's contract says.
pub(crate) unsafe fn map_array_async(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    list: *mut CUarrayMapInfo,
    count: c_uint,
) -> CUresult {
    if list.is_null() || count == 0 {
        return call();
    }
    if count > MAX_MAP_ENTRIES {
        log!(
            Level::Error,
            "cuMemMapArrayAsync refused: {count} entries in one list, more than cuquota follows \
             ({MAX_MAP_ENTRIES}); split the list"
        );
        return CUresult::ERROR_INVALID_VALUE;
    }
    // SAFETY: `count` entries per the contract (bounded above); copied before the call.
    let entries: Vec<CUarrayMapInfo> = unsafe { std::slice::from_raw_parts(list, count as usize) }.to_vec();
    let of = |op| entries.iter().filter(move |m| m.memOperationType == op);
    let unmaps: Vec<BindKey> = of(CU_MEM_OPERATION_TYPE_UNMAP).map(tile_key).collect();
    let maps: Vec<(BindKey, u64)> = of(CU_MEM_OPERATION_TYPE_MAP)
        .map(|m| (tile_key(m), m.memHandle))
        .collect();
    let (maps, unmaps) = (&maps, &unmaps);
    vmm(s, VmmCall::MapArray { maps, unmaps }, call)
}

/// The binding key of a multicast range on the device that holds the memory: an unbind names the same
/// offset and size (cuda.h).
fn multicast_key(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize, size: usize) -> BindKey {
    BindKey {
        obj: Obj::Multicast(mc),
        dev: dev as i64,
        off: mc_offset as u64,
        rest: [size as u64, 0, 0, 0],
    }
}

/// `cuMulticastCreate`: the object's references and mappings are followed as a VMM handle's, so that its
/// last release lets go of what is bound to it.
///
/// # Safety
/// `mc` as the driver's contract says (written on success).
pub(crate) unsafe fn multicast_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: *mut CUmemGenericAllocationHandle,
) -> CUresult {
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!mc.is_null()).then(|| unsafe { *mc });
    vmm(s, VmmCall::MulticastCreate { out: &out }, call)
}

/// `cuMulticastBindMem` (`mem`) and `cuMulticastBindAddr` (the handle this process mapped at `memptr`): the
/// bound memory stays charged while bound, its handle released or not.
pub(crate) fn multicast_bind(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: Option<CUmemGenericAllocationHandle>,
    memptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    let key = |dev| multicast_key(mc, dev, mc_offset, size);
    let key = &key;
    vmm(s, VmmCall::MulticastBind { mem, memptr, key }, call)
}

/// `cuMulticastUnbind`: the binding of `dev`'s memory at exactly (`mc_offset`, `size`) lets go (cuda.h: they
/// must match the bind's; the driver unbinds nothing else).
pub(crate) fn multicast_unbind(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> CUresult {
    let key = multicast_key(mc, dev, mc_offset, size);
    vmm(s, VmmCall::MulticastUnbind(key), call)
}

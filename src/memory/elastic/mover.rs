//! One movable range's life over [`Driver`]: made (reserve, create, map, access), moved to another backing at
//! the same address (create, copy through a staging mapping, remap, access, release the old), unmade. Every
//! step that fails undoes what came before it: the old backing is released only once the new one is mapped,
//! so a failed create, map or copy leaves the range as it was (nothing lost, nothing leaked).
//!
//! Access: `access` lists the devices granted read-write, the owning device first, then the devices that can
//! access it as a peer. `cuMemAlloc` memory is reachable from a peer once the program enabled peer access, but
//! that does not cover VMM memory (access is per device, by `cuMemSetAccess` only), so each mapping grants
//! every peer up front; a driver refusing the peers' grant gets the owner's alone (what the range had before).

use super::super::driver::Driver;
use crate::ffi::cuda::*;

/// A range made: its address and its device backing.
pub(super) fn make(d: &impl Driver, size: u64, access: &[CUdevice]) -> Result<(CUdeviceptr, u64), CUresult> {
    let ptr = d.reserve(size)?;
    let handle = match d.create(size, Some(access[0])) {
        Ok(h) => h,
        Err(e) => {
            let _ = d.address_free(ptr, size);
            return Err(e);
        }
    };
    if let Err(e) = d.map(ptr, size, handle) {
        let _ = d.release(handle);
        let _ = d.address_free(ptr, size);
        return Err(e);
    }
    if let Err(e) = grant(d, ptr, size, access) {
        let _ = d.unmap(ptr, size);
        let _ = d.release(handle);
        let _ = d.address_free(ptr, size);
        return Err(e);
    }
    Ok((ptr, handle))
}

/// The range at `ptr` unmade (its backing `handle` released, its addresses given back). An unmap the driver
/// refuses changes nothing.
pub(super) fn unmake(d: &impl Driver, ptr: CUdeviceptr, size: u64, handle: u64) -> Result<(), CUresult> {
    d.unmap(ptr, size)?;
    let _ = d.release(handle);
    let _ = d.address_free(ptr, size);
    Ok(())
}

/// Read-write access to `[ptr, ptr + size)` for `access` (the owner first), else for the owner alone.
fn grant(d: &impl Driver, ptr: CUdeviceptr, size: u64, access: &[CUdevice]) -> Result<(), CUresult> {
    match d.set_access(ptr, size, access) {
        Err(_) if access.len() > 1 => d.set_access(ptr, size, &access[..1]),
        r => r,
    }
}

/// The range at `ptr` (backed by `old`, accessed by `access`, its device first) moved onto a new backing at `to` (a
/// device, or host memory for `None`), its bytes copied on `stream`: the new handle. `Err`: still on `old`.
pub(super) fn swap(
    d: &impl Driver,
    ptr: CUdeviceptr,
    size: u64,
    access: &[CUdevice],
    old: u64,
    to: Option<CUdevice>,
    stream: CUstream,
) -> Result<u64, CUresult> {
    let new = d.create(size, to)?;
    if let Err(e) = staged_copy(d, ptr, size, access[0], new, stream) {
        let _ = d.release(new);
        return Err(e);
    }
    // Every byte is in `new` now; `old` stays until `new` is in place.
    if let Err(e) = d.unmap(ptr, size) {
        let _ = d.release(new);
        return Err(e);
    }
    if let Err(e) = d.map(ptr, size, new).and_then(|()| grant(d, ptr, size, access)) {
        let _ = d.unmap(ptr, size);
        let _ = d.release(new);
        // Back on the old backing; if even that fails the bytes are still in `old` (kept), so a later try can
        // map it again.
        d.map(ptr, size, old).and_then(|()| grant(d, ptr, size, access))?;
        return Err(e);
    }
    let _ = d.release(old);
    Ok(new)
}

/// Copies `[ptr, ptr + size)` into `new` through a staging mapping of it.
fn staged_copy(
    d: &impl Driver,
    ptr: CUdeviceptr,
    size: u64,
    ordinal: CUdevice,
    new: u64,
    stream: CUstream,
) -> Result<(), CUresult> {
    let stage = d.reserve(size)?;
    let copied = d.map(stage, size, new).and_then(|()| {
        let r = d
            .set_access(stage, size, &[ordinal])
            .and_then(|()| d.copy(stage, ptr, size, stream));
        r.and(d.unmap(stage, size))
    });
    let freed = d.address_free(stage, size);
    copied.and(freed)
}

//! Every device-memory allocation and free path.
//!
//! The pattern of each allocation: find the device, admit an estimate (over the cap → `CUDA_ERROR_OUT_OF_MEMORY`
//! and the driver is not called), call the driver, then settle: on success record the object and correct the
//! charge to the exact size; on failure give the estimate back. A free removes the record *before* calling the
//! driver (so a racing allocation that reuses the address cannot be removed by mistake), and restores it if the
//! driver refuses. A free of something the ledger does not know goes to the driver unchanged.
//!
//! Sizes: linear and managed allocations are rounded up to the device's allocation granularity; pitched ones
//! charge pitch × height as returned (admitted as width rounded up to 512 × height); VMM handles charge their
//! size; arrays charge `cuArrayGetMemoryRequirements` / `cuMipmappedArrayGetMemoryRequirements` (admitted with
//! an estimate from the descriptor); stream-ordered pools charge their `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.

#![allow(non_snake_case)]

use crate::devices::Dev;
use crate::ffi::cuda::*;
use crate::memory::ledger::{Kind, Record, Space};
use crate::state::Shim;
use std::ffi::c_uint;

/// Upper bound the driver's pitch never exceeds (texture pitch alignment).
const PITCH_ALIGN: u64 = 512;

/// Admits `estimate` on `dev`, calls `call`; on success settles the charge to `exact()` and records `key`.
///
/// `exact` runs only after success and returns the exact byte count (already rounded) or `None` to keep the
/// estimate. Returns OOM without calling the driver when the estimate does not fit.
fn charged_call(
    s: &Shim,
    dev: Dev,
    estimate: u64,
    call: impl FnOnce() -> CUresult,
    exact: impl FnOnce() -> Option<(Space, u64, Option<u64>)>,
) -> CUresult {
    if s.mem.admit(dev, estimate).is_err() {
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if !r.ok() {
        s.mem.release(dev, estimate);
        return r;
    }
    match exact() {
        Some((space, key, bytes)) => {
            let bytes = bytes.unwrap_or(estimate);
            s.mem.settle(dev, estimate, bytes);
            let stale = s.mem.ledger.insert(
                space,
                key,
                Record {
                    entry: dev.id,
                    bytes,
                    kind: Kind::Direct,
                },
            );
            release_stale(s, stale);
        }
        None => s.mem.release(dev, estimate),
    }
    r
}

/// A key the driver handed out again still had a record: its old object was freed behind our back (a path we
/// do not hook, or a context that died while others lived), so its charge goes back instead of leaking.
fn release_stale(s: &Shim, stale: Option<Record>) {
    if let Some(Record {
        entry,
        bytes,
        kind: Kind::Direct,
    }) = stale
    {
        s.mem.release_entry(entry, bytes);
    }
}

/// Frees `key` through `call`, uncharging what the ledger holds for it; untracked → `call` alone.
fn tracked_free(s: &Shim, space: Space, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(rec) = s.mem.ledger.remove(space, key) else {
        return call();
    };
    let r = call();
    if r.ok() {
        match rec.kind {
            Kind::Direct => s.mem.release_entry(rec.entry, rec.bytes),
            Kind::Pool(pool) => s.mem.refresh_pool(&s.cuda, pool),
        }
    } else {
        s.mem.ledger.insert(space, key, rec);
    }
    r
}

/// An allocation whose device has no accounting identity. Without a context (or with a bad ordinal) the driver
/// gives its own error; a real device that found no room in the usage region is refused while memory limits
/// apply, so it can never become a way around the cap.
fn untracked(s: &Shim, call: impl FnOnce() -> CUresult) -> CUresult {
    if s.devices.refuse_unplaced() {
        CUresult::ERROR_OUT_OF_MEMORY
    } else {
        call()
    }
}

/// A linear allocation of `bytes` on the current context's device.
fn linear(s: &Shim, bytes: u64, call: impl FnOnce() -> CUresult, out: impl FnOnce() -> u64) -> CUresult {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    let est = s.devices.round(&s.cuda, dev, bytes);
    charged_call(s, dev, est, call, || Some((Space::Pointer, out(), None)))
}

/// Hook of `cuMemAlloc_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAlloc_v2(s: &Shim, dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    // SAFETY: forwarded; `dptr` is read only after the driver succeeded (it wrote it).
    linear(
        s,
        bytesize as u64,
        || unsafe { s.cuda.cuMemAlloc_v2(dptr, bytesize) },
        || unsafe { *dptr },
    )
}

/// Hook of legacy `cuMemAlloc` (32-bit sizes and addresses).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAlloc(s: &Shim, dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    // SAFETY: as for `cuMemAlloc_v2`.
    linear(
        s,
        bytesize as u64,
        || unsafe { s.cuda.cuMemAlloc(dptr, bytesize) },
        || unsafe { *dptr } as u64,
    )
}

/// Hook of `cuMemAllocManaged` (charged to the current device, like HAMi).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocManaged(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: as for `cuMemAlloc_v2`.
    linear(
        s,
        bytesize as u64,
        || unsafe { s.cuda.cuMemAllocManaged(dptr, bytesize, flags) },
        || unsafe { *dptr },
    )
}

fn pitched(
    s: &Shim,
    width: u64,
    height: u64,
    call: impl FnOnce() -> CUresult,
    out: impl FnOnce() -> (u64, u64),
) -> CUresult {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    let bound = width
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height);
    let est = s.devices.round(&s.cuda, dev, bound);
    charged_call(s, dev, est, call, || {
        let (ptr, pitch) = out();
        Some((
            Space::Pointer,
            ptr,
            Some(s.devices.round(&s.cuda, dev, pitch.saturating_mul(height))),
        ))
    })
}

/// Hook of `cuMemAllocPitch_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocPitch_v2(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
) -> CUresult {
    pitched(
        s,
        WidthInBytes as u64,
        Height as u64,
        // SAFETY: forwarded unchanged.
        || unsafe {
            s.cuda
                .cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)
        },
        // SAFETY: written by the driver on success.
        || unsafe { (*dptr, *pPitch as u64) },
    )
}

/// Hook of legacy `cuMemAllocPitch` (32-bit).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocPitch(
    s: &Shim,
    dptr: *mut CUdeviceptr_v1,
    pPitch: *mut c_uint,
    WidthInBytes: c_uint,
    Height: c_uint,
    ElementSizeBytes: c_uint,
) -> CUresult {
    pitched(
        s,
        WidthInBytes as u64,
        Height as u64,
        // SAFETY: forwarded unchanged.
        || unsafe {
            s.cuda
                .cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)
        },
        // SAFETY: written by the driver on success.
        || unsafe { (*dptr as u64, *pPitch as u64) },
    )
}

/// Hook of `cuMemFree_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemFree_v2(s: &Shim, dptr: CUdeviceptr) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Pointer, dptr, || unsafe { s.cuda.cuMemFree_v2(dptr) })
}

/// Hook of legacy `cuMemFree` (32-bit address).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemFree(s: &Shim, dptr: CUdeviceptr_v1) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Pointer, dptr as u64, || unsafe {
        s.cuda.cuMemFree(dptr)
    })
}

// ---- stream-ordered allocator -------------------------------------------------------------------------------

/// Which device a stream belongs to: `cuStreamGetDevice` (CUDA 12.8+), else the current context's device.
fn stream_device(s: &Shim, stream: CUstream, ptsz: bool) -> Option<Dev> {
    let mut d: CUdevice = 0;
    // SAFETY: valid out-pointer; stream handle forwarded.
    let r = unsafe {
        if ptsz {
            s.cuda.cuStreamGetDevice_ptsz(stream, &mut d)
        } else {
            s.cuda.cuStreamGetDevice(stream, &mut d)
        }
    };
    if r.ok() {
        s.devices.device(&s.cuda, d)
    } else {
        s.devices.current(&s.cuda)
    }
}

/// A pool allocation: admitted with the part of the request the pool's unused reserve cannot serve (the
/// reserve is already charged), then charged by the pool's reserved-size growth.
fn pool_alloc(
    s: &Shim,
    dev: Dev,
    pool: CUmemoryPool,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    out: impl FnOnce() -> u64,
) -> CUresult {
    // What the pool already holds reserved (and is charged for) but has not handed out serves the request first.
    let mut est = s
        .devices
        .round(&s.cuda, dev, bytes)
        .saturating_sub(s.mem.pool_slack(&s.cuda, pool as usize));
    if s.mem.admit(dev, est).is_err() {
        // The pools may have released memory at a synchronisation since we last looked: refresh, retry once.
        s.mem.refresh_pools_of(&s.cuda, dev.id);
        est = s
            .devices
            .round(&s.cuda, dev, bytes)
            .saturating_sub(s.mem.pool_slack(&s.cuda, pool as usize));
        if s.mem.admit(dev, est).is_err() {
            return CUresult::ERROR_OUT_OF_MEMORY;
        }
    }
    let r = call();
    if r.ok() {
        let stale = s.mem.ledger.insert(
            Space::Pointer,
            out(),
            Record {
                entry: dev.id,
                bytes: 0,
                kind: Kind::Pool(pool as usize),
            },
        );
        release_stale(s, stale);
        s.mem.track_pool(pool as usize, Some(dev));
        // Charge the real growth first, then drop the provisional charge: the sum never dips below the truth.
        s.mem.refresh_pool(&s.cuda, pool as usize);
    }
    s.mem.release(dev, est);
    r
}

fn alloc_async(s: &Shim, dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream, ptsz: bool) -> CUresult {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            if ptsz {
                s.cuda.cuMemAllocAsync_ptsz(dptr, bytesize, stream)
            } else {
                s.cuda.cuMemAllocAsync(dptr, bytesize, stream)
            }
        }
    };
    let Some(dev) = stream_device(s, stream, ptsz) else {
        return untracked(s, call);
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if !unsafe { s.cuda.cuDeviceGetMemPool(&mut pool, dev.ordinal) }.ok() || pool.is_null() {
        // Cannot see the pool: account it as a plain allocation instead.
        let est = s.devices.round(&s.cuda, dev, bytesize as u64);
        return charged_call(s, dev, est, call, || {
            // SAFETY: written by the driver on success.
            Some((Space::Pointer, unsafe { *dptr }, None))
        });
    }
    // SAFETY: as above.
    pool_alloc(s, dev, pool, bytesize as u64, call, || unsafe { *dptr })
}

/// Hook of `cuMemAllocAsync`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocAsync(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    alloc_async(s, dptr, bytesize, hStream, false)
}

/// Hook of `cuMemAllocAsync_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocAsync_ptsz(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    alloc_async(s, dptr, bytesize, hStream, true)
}

fn alloc_from_pool(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    ptsz: bool,
) -> CUresult {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            if ptsz {
                s.cuda.cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream)
            } else {
                s.cuda.cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream)
            }
        }
    };
    let dev = match s.mem.pool_device(pool as usize) {
        Some(Some(dev)) => dev,
        Some(None) => return call(), // a host pool: not device memory
        None => match stream_device(s, stream, ptsz) {
            Some(dev) => dev,
            None => return untracked(s, call),
        },
    };
    // SAFETY: as above.
    pool_alloc(s, dev, pool, bytesize as u64, call, || unsafe { *dptr })
}

/// Hook of `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocFromPoolAsync(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    alloc_from_pool(s, dptr, bytesize, pool, hStream, false)
}

/// Hook of `cuMemAllocFromPoolAsync_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemAllocFromPoolAsync_ptsz(
    s: &Shim,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    alloc_from_pool(s, dptr, bytesize, pool, hStream, true)
}

/// Hook of `cuMemFreeAsync`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemFreeAsync(s: &Shim, dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Pointer, dptr, || unsafe {
        s.cuda.cuMemFreeAsync(dptr, hStream)
    })
}

/// Hook of `cuMemFreeAsync_ptsz`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemFreeAsync_ptsz(s: &Shim, dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Pointer, dptr, || unsafe {
        s.cuda.cuMemFreeAsync_ptsz(dptr, hStream)
    })
}

/// Hook of `cuMemPoolCreate`: remembers the pool's device (or that it is a host pool).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemPoolCreate(
    s: &Shim,
    pool: *mut CUmemoryPool,
    poolProps: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuMemPoolCreate(pool, poolProps) };
    if r.ok() && !pool.is_null() && !poolProps.is_null() {
        // SAFETY: both valid (the driver just used them).
        let (p, loc) = unsafe { (*pool, (*poolProps).location) };
        if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            s.mem.track_pool(p as usize, None); // a host pool
        } else if let Some(dev) = s.devices.device(&s.cuda, loc.id) {
            s.mem.track_pool(p as usize, Some(dev));
        }
        // A device pool whose device has no accounting identity stays unknown: its allocations then go through
        // `untracked` (refused while limits apply), never through the host-pool pass-through.
    }
    r
}

/// Hook of `cuMemPoolTrimTo`: re-reads the pool's reserved size afterwards.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemPoolTrimTo(s: &Shim, pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuMemPoolTrimTo(pool, minBytesToKeep) };
    if r.ok() {
        s.mem.refresh_pool(&s.cuda, pool as usize);
    }
    r
}

/// Hook of `cuMemPoolDestroy`: gives the pool's whole charge back.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemPoolDestroy(s: &Shim, pool: CUmemoryPool) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuMemPoolDestroy(pool) };
    if r.ok() {
        s.mem.forget_pool(pool as usize);
    }
    r
}

// ---- virtual memory management ------------------------------------------------------------------------------

/// Hook of `cuMemCreate`: charges `size` (granularity-aligned by contract) to `prop.location`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemCreate(
    s: &Shim,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuMemCreate(handle, size, prop, flags) };
    if prop.is_null() {
        return call();
    }
    // SAFETY: non-NULL, points to the caller's properties.
    let loc = unsafe { (*prop).location };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return call(); // host memory: not ours to count
    }
    let Some(dev) = s.devices.device(&s.cuda, loc.id) else {
        return untracked(s, call);
    };
    let est = s.devices.round(&s.cuda, dev, size as u64);
    // SAFETY: written by the driver on success.
    charged_call(s, dev, est, call, || Some((Space::Vmm, unsafe { *handle }, None)))
}

/// Hook of `cuMemRelease`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMemRelease(s: &Shim, handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Vmm, handle, || unsafe { s.cuda.cuMemRelease(handle) })
}

// ---- arrays -------------------------------------------------------------------------------------------------

/// Estimated bytes of an array (all mip levels when `levels > 1`); 0 for sparse / deferred-mapping arrays,
/// which get their memory later through `cuMemMapArrayAsync` of VMM handles (charged at `cuMemCreate`).
pub fn array_estimate(
    w: u64,
    h: u64,
    d: u64,
    format: CUarray_format,
    channels: u32,
    flags: u32,
    levels: u32,
) -> u64 {
    const SPARSE: u32 = 0x40;
    const DEFERRED: u32 = 0x80;
    if flags & (SPARSE | DEFERRED) != 0 {
        return 0;
    }
    let elem = array_format_bytes(format).saturating_mul(channels.max(1) as u64);
    let mut total = 0u64;
    for l in 0..levels.clamp(1, 32) {
        let (lw, lh, ld) = ((w >> l).max(1), (h >> l).max(1), (d >> l).max(1));
        total = total.saturating_add(lw.saturating_mul(lh).saturating_mul(ld).saturating_mul(elem));
    }
    total
}

fn array_create(s: &Shim, estimate: u64, handle: *mut CUarray, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    let est = s.devices.round(&s.cuda, dev, estimate);
    charged_call(s, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let arr = unsafe { *handle };
        let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
        // SAFETY: valid out-pointer, a live array.
        let exact = unsafe { s.cuda.cuArrayGetMemoryRequirements(&mut req, arr, dev.ordinal) }
            .ok()
            .then(|| s.devices.round(&s.cuda, dev, req.size as u64));
        Some((Space::Array, arr as u64, exact))
    })
}

/// Hook of `cuArrayCreate_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuArrayCreate_v2(
    s: &Shim,
    pHandle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuArrayCreate_v2(pHandle, desc) };
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    // SAFETY: non-NULL caller descriptor.
    let d = unsafe { *desc };
    let est = array_estimate(d.Width as u64, d.Height as u64, 1, d.Format, d.NumChannels, 0, 1);
    array_create(s, est, pHandle, call)
}

/// Hook of legacy `cuArrayCreate` (32-bit descriptor).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuArrayCreate(
    s: &Shim,
    pHandle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuArrayCreate(pHandle, desc) };
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    // SAFETY: non-NULL caller descriptor.
    let d = unsafe { *desc };
    let est = array_estimate(d.Width as u64, d.Height as u64, 1, d.Format, d.NumChannels, 0, 1);
    array_create(s, est, pHandle, call)
}

/// Hook of `cuArray3DCreate_v2`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuArray3DCreate_v2(
    s: &Shim,
    pHandle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuArray3DCreate_v2(pHandle, desc) };
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    // SAFETY: non-NULL caller descriptor.
    let d = unsafe { *desc };
    let est = array_estimate(
        d.Width as u64,
        d.Height as u64,
        d.Depth as u64,
        d.Format,
        d.NumChannels,
        d.Flags,
        1,
    );
    array_create(s, est, pHandle, call)
}

/// Hook of legacy `cuArray3DCreate` (32-bit descriptor).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuArray3DCreate(
    s: &Shim,
    pHandle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuArray3DCreate(pHandle, desc) };
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    // SAFETY: non-NULL caller descriptor.
    let d = unsafe { *desc };
    let est = array_estimate(
        d.Width as u64,
        d.Height as u64,
        d.Depth as u64,
        d.Format,
        d.NumChannels,
        d.Flags,
        1,
    );
    array_create(s, est, pHandle, call)
}

/// Hook of `cuMipmappedArrayCreate`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMipmappedArrayCreate(
    s: &Shim,
    pHandle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    numMipmapLevels: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { s.cuda.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels) };
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    // SAFETY: non-NULL caller descriptor.
    let d = unsafe { *desc };
    let est = array_estimate(
        d.Width as u64,
        d.Height as u64,
        d.Depth as u64,
        d.Format,
        d.NumChannels,
        d.Flags,
        numMipmapLevels,
    );
    let est = s.devices.round(&s.cuda, dev, est);
    charged_call(s, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let m = unsafe { *pHandle };
        let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
        // SAFETY: valid out-pointer, a live mipmapped array.
        let exact = unsafe {
            s.cuda
                .cuMipmappedArrayGetMemoryRequirements(&mut req, m, dev.ordinal)
        }
        .ok()
        .then(|| s.devices.round(&s.cuda, dev, req.size as u64));
        Some((Space::Mipmapped, m as u64, exact))
    })
}

/// Hook of `cuArrayDestroy`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuArrayDestroy(s: &Shim, hArray: CUarray) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Array, hArray as u64, || unsafe {
        s.cuda.cuArrayDestroy(hArray)
    })
}

/// Hook of `cuMipmappedArrayDestroy`.
///
/// # Safety
/// Driver contract.
pub unsafe fn cuMipmappedArrayDestroy(s: &Shim, h: CUmipmappedArray) -> CUresult {
    // SAFETY: forwarded unchanged.
    tracked_free(s, Space::Mipmapped, h as u64, || unsafe {
        s.cuda.cuMipmappedArrayDestroy(h)
    })
}

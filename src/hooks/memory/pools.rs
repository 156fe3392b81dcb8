//! Stream-ordered allocation (`cuMemAllocAsync`, pools, their export and import) and the synchronisations
//! that let destroyed pools go: decoded here, accounted by `crate::memory::pools`.

use super::{export_pointer, hold_import, stream_key};
use crate::devices::Dev;
use crate::driver::cuda::in_context;
use crate::ffi::cuda::*;
use crate::memory::{shared_key, Space};
use crate::state::Shim;

/// Which device a stream belongs to: `cuStreamGetDevice` (CUDA 12.8+; its `_ptsz` form when the NULL stream
/// means the per-thread one), else the current context's device.
fn stream_device(s: &Shim, stream: CUstream, ds: DefaultStream) -> Option<Dev> {
    let mut d: CUdevice = 0;
    // SAFETY: valid out-pointer; stream handle forwarded.
    let r = unsafe {
        match ds {
            DefaultStream::PerThread => s.cuda.cuStreamGetDevice_ptsz(stream, &mut d),
            DefaultStream::Legacy => s.cuda.cuStreamGetDevice(stream, &mut d),
        }
    };
    if r.ok() {
        s.devices.device(&s.cuda, d)
    } else {
        s.devices.current(&s.cuda)
    }
}

/// `cuMemAllocAsync` (`pool` = `None`: the device's current pool) and `cuMemAllocFromPoolAsync`, each also
/// `_ptsz`.
///
/// # Safety
/// `dptr` as the driver's contract says (written on success).
pub(crate) unsafe fn alloc_async(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    // SAFETY: written by the driver on success.
    let out = || unsafe { *dptr };
    let (dev, pool) = match pool {
        Some(pool) => match s.mem.pool_device(pool as usize) {
            Some(Some(dev)) => (dev, pool),
            Some(None) => return call(), // a host pool: not device memory
            None => match pool_owner(s, pool).or_else(|| stream_device(s, stream, ds)) {
                Some(dev) => (dev, pool),
                None => return s.mem.untracked(call),
            },
        },
        None => {
            let Some(dev) = stream_device(s, stream, ds) else {
                return s.mem.untracked(call);
            };
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            if !unsafe { s.cuda.cuDeviceGetMemPool(&mut pool, dev.ordinal) }.ok() || pool.is_null() {
                // Cannot see the pool: account it as a plain allocation instead.
                let est = s.devices.round(&s.cuda, dev, bytesize as u64);
                return s.mem.charged_call(&s.cuda, &s.nvml, dev, est, call, || {
                    Some((Space::Pointer, out(), None))
                });
            }
            (dev, pool)
        }
    };
    s.mem
        .pool_alloc(&s.cuda, &s.nvml, dev, pool as usize, bytesize as u64, call, out)
}

/// The device whose default or current pool `pool` is (a pool this process did not create: from
/// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool` of any device, which may serve allocations on another
/// device's stream): remembered for the pool. The stream's device would charge the wrong one.
fn pool_owner(s: &Shim, pool: CUmemoryPool) -> Option<Dev> {
    let owns = |d: Dev| {
        let (mut dflt, mut cur): (CUmemoryPool, CUmemoryPool) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers.
        unsafe {
            (s.cuda.cuDeviceGetDefaultMemPool(&mut dflt, d.ordinal).ok() && dflt == pool)
                || (s.cuda.cuDeviceGetMemPool(&mut cur, d.ordinal).ok() && cur == pool)
        }
    };
    let devs: Vec<Dev> = s.devices.known().map(|(d, _)| d).collect();
    let dev = devs.into_iter().find(|&d| owns(d))?;
    s.mem.track_pool(pool as usize, Some(dev));
    Some(dev)
}

/// `cuMemPoolCreate`: remembers the pool's device (or that it is a host pool).
///
/// # Safety
/// `pool`, `poolProps` as the driver's contract says.
pub(crate) unsafe fn pool_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pool: *mut CUmemoryPool,
    poolProps: *const CUmemPoolProps,
) -> CUresult {
    let r = call();
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

/// `cuMemPoolTrimTo`: re-reads the pool's reserved size afterwards.
pub(crate) fn pool_trim(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.refresh_pool(&s.cuda, pool as usize);
    }
    r
}

/// `cuMemPoolDestroy`: gives the pool's charge back, or, while allocations of it are still out (cuda.h keeps
/// them valid and the pool's resources until the last is freed), when the last of them is freed.
pub(crate) fn pool_destroy(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
    // Its reserve as it is now: memory the destroyed pool may hold until frees run in stream order.
    s.mem.refresh_pool(&s.cuda, pool as usize);
    let r = call();
    if r.ok() {
        s.mem.destroy_pool(pool as usize);
    }
    r
}

/// `cuCtxSynchronize` (`ctx` = `None`: the current context) and `cuCtxSynchronize_v2`: once it returns, every
/// free enqueued on the context's device before it started has run, so destroyed pools waiting on such frees
/// give their charge back.
pub(crate) fn ctx_synchronize(s: &Shim, call: impl FnOnce() -> CUresult, ctx: Option<CUcontext>) -> CUresult {
    let call = || synced(s, call());
    let Some(start) = s.mem.sync_starts() else {
        return call();
    };
    let r = call();
    if !r.ok() {
        return r;
    }
    let dev = match ctx {
        Some(c) if !c.is_null() => {
            let mut d: CUdevice = -1;
            // SAFETY: valid out-pointer, asked in the caller's context.
            let ok = in_context(&s.cuda, c, || unsafe { s.cuda.cuCtxGetDevice(&mut d) }.ok());
            ok.unwrap_or(false)
                .then(|| s.devices.device(&s.cuda, d))
                .flatten()
        }
        _ => s.devices.current(&s.cuda),
    };
    if let Some(dev) = dev {
        s.mem.synchronized(dev, start, None);
    }
    r
}

/// `cuStreamSynchronize` (+ `_ptsz`): once it returns, the frees enqueued on the stream before it started have
/// run (destroyed pools waiting on them only: see `ctx_synchronize`).
pub(crate) fn stream_synchronize(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let call = || synced(s, call());
    let Some(start) = s.mem.sync_starts() else {
        return call();
    };
    let r = call();
    if r.ok() {
        if let Some(dev) = stream_device(s, stream, ds) {
            s.mem.synchronized(dev, start, Some(stream_key(stream, ds)));
        }
    }
    r
}

/// After a synchronize: the SM throttle charges the probes it waited for (`SmThrottle::synchronized`).
fn synced(s: &Shim, r: CUresult) -> CUresult {
    if r.ok() {
        s.throttle.synchronized(&s.nvml);
    }
    r
}

/// `cuMemPoolExportPointer`: as `cuIpcGetMemHandle`, the allocation's charge moves out of its pool's into the
/// container's shared table, keyed by the export data, until every process holding it let go.
///
/// # Safety
/// `data` as the driver's contract says (written on success).
pub(crate) unsafe fn pool_export_pointer(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    data: *mut CUmemPoolPtrExportData,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: a CUmemPoolPtrExportData is its 64 bytes; as the caller's contract says.
    unsafe { export_pointer(s, call, data.cast(), ptr, "cuMemPoolExportPointer") }
}

/// `cuMemPoolImportPointer`: as `cuIpcOpenMemHandle`; the import is let go by `cuMemFree` / `cuMemFreeAsync`.
///
/// # Safety
/// `ptr_out`, `data` as the driver's contract says.
pub(crate) unsafe fn pool_import_pointer(
    s: &Shim,
    real: impl Fn(*mut CUdeviceptr, CUmemoryPool, *mut CUmemPoolPtrExportData) -> CUresult,
    ptr_out: *mut CUdeviceptr,
    pool: CUmemoryPool,
    data: *mut CUmemPoolPtrExportData,
) -> CUresult {
    if data.is_null() {
        return real(ptr_out, pool, data);
    }
    // The driver imports the very bytes keyed: a copy, which another thread cannot change in between.
    // SAFETY: non-NULL, the caller's export data.
    let mut copy = unsafe { data.read_unaligned() };
    let key = shared_key(&copy.reserved);
    // SAFETY: as the caller's contract says.
    unsafe {
        hold_import(
            s,
            || real(ptr_out, pool, &mut copy),
            ptr_out,
            key,
            "cuMemPoolImportPointer",
            |p| {
                // SAFETY: freeing the import the driver just made for this call.
                s.cuda.cuMemFree_v2(p);
            },
        )
    }
}

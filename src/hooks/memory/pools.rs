//! Stream-ordered allocation (`cuMemAllocAsync`, pools, their export and import) and the synchronisations
//! that let destroyed pools go: decoded here, accounted by `Memory::pool`.

use super::{export_pointer, hold_import, stream_key};
use crate::devices::Dev;
use crate::driver::cuda::in_context;
use crate::ffi::cuda::*;
use crate::memory::{shared_key, PoolCall};
use crate::state::Shim;

/// A pool call `what` through `call`.
fn pool(s: &Shim, what: PoolCall<'_>, call: impl FnOnce() -> CUresult) -> CUresult {
    s.mem.pool(&s.cuda, &s.nvml, what, call)
}

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
    // SAFETY: written by the driver on success (read only then).
    let out = || unsafe { *dptr };
    let stream_dev = || stream_device(s, stream, ds);
    let alloc = PoolCall::Alloc {
        pool: pool.map(|p| p as usize),
        bytes: bytesize as u64,
        stream_dev: &stream_dev,
        out: &out,
    };
    self::pool(s, alloc, call)
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
    if poolProps.is_null() {
        return call();
    }
    // SAFETY: non-NULL, the caller's properties (the driver reads them too).
    let loc = unsafe { (*poolProps).location };
    let on = if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        Some(None) // a host pool
    } else {
        // A device pool whose device has no accounting identity stays unknown: its allocations then go through
        // `untracked` (refused while limits apply), never through the host-pool pass-through.
        s.devices.device(&s.cuda, loc.id).map(Some)
    };
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!pool.is_null()).then(|| unsafe { *pool } as usize);
    self::pool(s, PoolCall::Create { on, out: &out }, call)
}

/// `cuMemPoolTrimTo`: re-reads the pool's reserved size afterwards.
pub(crate) fn pool_trim(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
    self::pool(s, PoolCall::Trim(pool as usize), call)
}

/// `cuMemPoolDestroy`: gives the pool's charge back, or, while allocations of it are still out (cuda.h keeps
/// them valid and the pool's resources until the last is freed), when the last of them is freed.
pub(crate) fn pool_destroy(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
    self::pool(s, PoolCall::Destroy(pool as usize), call)
}

/// `cuCtxSynchronize` (`ctx` = `None`: the current context) and `cuCtxSynchronize_v2`: once it returns, every
/// free enqueued on the context's device before it started has run, so destroyed pools waiting on such frees
/// give their charge back.
pub(crate) fn ctx_synchronize(s: &Shim, call: impl FnOnce() -> CUresult, ctx: Option<CUcontext>) -> CUresult {
    let dev = || match ctx {
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
    let sync = PoolCall::Synchronize {
        dev: &dev,
        stream: None,
    };
    pool(s, sync, || synced(s, call()))
}

/// `cuStreamSynchronize` (+ `_ptsz`): once it returns, the frees enqueued on the stream before it started have
/// run (destroyed pools waiting on them only: see `ctx_synchronize`).
pub(crate) fn stream_synchronize(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let dev = || stream_device(s, stream, ds);
    let sync = PoolCall::Synchronize {
        dev: &dev,
        stream: Some(stream_key(stream, ds)),
    };
    pool(s, sync, || synced(s, call()))
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

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
//! size until the memory is really gone (every reference released, every mapping unmapped); arrays charge
//! `cuArrayGetMemoryRequirements` / `cuMipmappedArrayGetMemoryRequirements` (admitted with an estimate from the
//! descriptor); stream-ordered pools charge their `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.

#![allow(non_snake_case)]

use super::Width;
use crate::devices::Dev;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use crate::memory::ledger::{Kind, Record, Space};
use crate::memory::shared::{self, Closed, Export, Hold};
use crate::memory::vmm::{BindKey, Obj, Release, Unmapped};
use crate::state::Shim;
use std::ffi::{c_int, c_uint, c_void};

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
    let Ok(_admitted) = s.mem.admit(dev, estimate, &s.cuda, &s.nvml) else {
        return CUresult::ERROR_OUT_OF_MEMORY;
    };
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
/// `stream`: a stream-ordered free's stream key (`stream_key`), else `None`.
fn tracked_free(
    s: &Shim,
    space: Space,
    key: u64,
    stream: Option<usize>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(rec) = s.mem.ledger.remove(space, key) else {
        return call();
    };
    let r = call();
    if r.ok() {
        match rec.kind {
            Kind::Direct => s.mem.release_entry(rec.entry, rec.bytes),
            Kind::Pool(pool) => {
                s.mem.pool_freed(pool, key, rec.bytes, stream);
                s.mem.refresh_pool(&s.cuda, pool);
            }
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

/// `cuMemAlloc_v2`, legacy `cuMemAlloc` (32-bit size and address), `cuMemAllocManaged` (charged to the current
/// device, like HAMi): a linear allocation on the current context's device.
///
/// # Safety
/// `dptr` as the driver's contract says (written on success).
pub unsafe fn alloc<P: Width, N: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: *mut P,
    bytesize: N,
) -> CUresult {
    // SAFETY: `dptr` is read only after the driver succeeded (it wrote it).
    linear(s, bytesize.to_u64(), call, || unsafe { *dptr }.to_u64())
}

/// `cuMemAllocPitch_v2`, legacy `cuMemAllocPitch`: charges pitch × height as returned.
///
/// # Safety
/// `dptr`, `pPitch` as the driver's contract says (written on success).
pub unsafe fn alloc_pitch<P: Width, N: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: *mut P,
    pPitch: *mut N,
    width: N,
    height: N,
) -> CUresult {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    let height = height.to_u64();
    let bound = width
        .to_u64()
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height);
    let est = s.devices.round(&s.cuda, dev, bound);
    charged_call(s, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let (ptr, pitch) = unsafe { ((*dptr).to_u64(), (*pPitch).to_u64()) };
        let exact = s.devices.round(&s.cuda, dev, pitch.saturating_mul(height));
        Some((Space::Pointer, ptr, Some(exact)))
    })
}

/// `cuMemFree_v2`, legacy `cuMemFree`.
pub fn free<P: Width>(s: &Shim, call: impl FnOnce() -> CUresult, dptr: P) -> CUresult {
    free_in_order(s, call, dptr.to_u64(), None)
}

/// `cuMemFreeAsync` (+ `_ptsz`): the free runs later, in `stream`'s order.
pub fn free_async(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: CUdeviceptr,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    free_in_order(s, call, dptr, Some(stream_key(stream, ds)))
}

/// What names a stream in the order of frees and synchronisations: its handle, or which default stream NULL
/// means.
fn stream_key(stream: CUstream, ds: DefaultStream) -> usize {
    match (stream.is_null(), ds) {
        (false, _) => stream as usize,
        (true, DefaultStream::Legacy) => CU_STREAM_LEGACY,
        (true, DefaultStream::PerThread) => CU_STREAM_PER_THREAD,
    }
}

/// A free of the device address `p`: an export lets go of its shared entry, an import of its hold, anything else
/// of its record (`stream`: the stream key of a free in stream order).
fn free_in_order(s: &Shim, call: impl FnOnce() -> CUresult, p: u64, stream: Option<usize>) -> CUresult {
    if let Some(e) = s.mem.shared.take_export(p) {
        return free_exported(s, call, p, e, stream);
    }
    if s.mem.shared.imported(p) {
        // An imported pool allocation (`cuMemPoolImportPointer`): its hold goes with the free.
        let r = call();
        if r.ok() {
            let_go(s, s.mem.shared.close(p));
        }
        return r;
    }
    tracked_free(s, Space::Pointer, p, stream, call)
}

// ---- interprocess memory (memory::shared) -------------------------------------------------------------------

/// `cuMemFree` of an exported allocation: the charge lives in the container's shared table; this process lets
/// go of it there (importers may still hold the memory: the charge stays until the last of them closes it).
fn free_exported(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    p: u64,
    e: Export,
    stream: Option<usize>,
) -> CUresult {
    let rec = s.mem.ledger.remove(Space::Pointer, p);
    let r = call();
    if !r.ok() {
        if let Some(rec) = rec {
            s.mem.ledger.insert(Space::Pointer, p, rec);
        }
        s.mem.shared.export(p, e);
        return r;
    }
    s.mem.export_gone(&s.cuda, p, e, rec, stream);
    r
}

/// Moves the charge of the allocation at `p` (`rec`) into the container's shared table under `key` (an export
/// by `what`). A full table refuses the export.
fn share_export(s: &Shim, r: CUresult, p: u64, rec: Record, key: u64, what: &str) -> CUresult {
    match s.mem.share(rec.entry, key, rec.bytes) {
        Some((entry, moved)) => {
            s.mem.shared.export(p, Export { entry, key, moved });
            r
        }
        None => {
            log!(
                Level::Error,
                "{what} refused: the container's table of memory shared between processes is full \
                 ({} entries); free exported allocations first",
                cuquota_core::region::layout::MAX_SHARED
            );
            CUresult::ERROR_OUT_OF_MEMORY
        }
    }
}

/// An import's last reference is gone: its hold goes.
fn let_go(s: &Shim, closed: Closed) {
    match closed {
        Closed::Last(Hold::Shared { entry, key }) => s.mem.unshare(entry, key),
        Closed::Last(Hold::Charged { dev, bytes }) => s.mem.release_entry(dev, bytes),
        Closed::StillOpen | Closed::Unknown => {}
    }
}

/// An import by `what` (`call`, writing its address at `out`) of the memory exported under `key`: memory this
/// container exported is already charged (this process joins its shared entry); memory another container
/// exported is charged to this process until it lets go of it, and refused (`undo` gives it back to the driver)
/// when it does not fit.
///
/// # Safety
/// `out` NULL or writable, as the driver's contract says.
unsafe fn hold_import(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    out: *mut CUdeviceptr,
    key: u64,
    what: &str,
    undo: impl FnOnce(u64),
) -> CUresult {
    let r = call();
    if !r.ok() || out.is_null() {
        return r;
    }
    // SAFETY: non-NULL, written by the driver on success.
    let p = unsafe { *out };
    if s.mem.shared.open_again(p) {
        return r;
    }
    if let Some(entry) = s.mem.join_shared(key) {
        s.mem.shared.opened(p, Hold::Shared { entry, key });
        return r;
    }
    let refuse = |why: &str| {
        log!(Level::Error, "{what} refused: {why}");
        undo(p);
        CUresult::ERROR_OUT_OF_MEMORY
    };
    // The memory's own device: opened with peer access it need not be the current context's.
    let mut ordinal: c_int = -1;
    // SAFETY: valid out-pointer of the attribute's type (int); `p` is the import just made.
    let on = unsafe {
        s.cuda.cuPointerGetAttribute(
            (&mut ordinal as *mut c_int).cast(),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            p,
        )
    };
    let dev = if on.ok() {
        s.devices.device(&s.cuda, ordinal)
    } else {
        s.devices.current(&s.cuda)
    };
    let Some(dev) = dev else {
        return if s.devices.refuse_unplaced() {
            refuse("no accounting identity for the current device")
        } else {
            r
        };
    };
    let (mut base, mut size) = (0, 0usize);
    // SAFETY: valid out-pointers; `p` is the mapping just opened.
    if !unsafe { s.cuda.cuMemGetAddressRange_v2(&mut base, &mut size, p) }.ok() || size == 0 {
        return refuse("its size is unknown (cuMemGetAddressRange failed)");
    }
    let bytes = size as u64;
    let Ok(_admitted) = s.mem.admit(dev, bytes, &s.cuda, &s.nvml) else {
        return refuse(&format!(
            "{bytes} bytes from another container do not fit under the memory limit"
        ));
    };
    s.mem.shared.opened(p, Hold::Charged { dev: dev.id, bytes });
    r
}

/// `cuIpcGetMemHandle`: the allocation's charge moves into the container's shared table under the handle's
/// key, where an importer of the same container finds it. A full table refuses the export.
///
/// # Safety
/// `handle` as the driver's contract says (written on success).
pub unsafe fn ipc_get(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: a CUipcMemHandle is its 64 bytes; as the caller's contract says.
    unsafe { export_pointer(s, call, handle.cast(), dptr, "cuIpcGetMemHandle") }
}

/// An export by `what` of the allocation at `ptr`, whose handle's 64 bytes the driver writes at `bytes` (its
/// key): the allocation's charge moves into the container's shared table.
///
/// # Safety
/// `bytes` NULL or writable, as the driver's contract says.
unsafe fn export_pointer(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    bytes: *const [u8; 64],
    ptr: CUdeviceptr,
    what: &str,
) -> CUresult {
    let r = call();
    if !r.ok() || bytes.is_null() || s.mem.shared.exported(ptr).is_some() {
        return r;
    }
    let Some(rec) = s.mem.ledger.get(Space::Pointer, ptr) else {
        return r;
    };
    // SAFETY: non-NULL, written by the driver on success.
    let key = shared::key(unsafe { &*bytes });
    share_export(s, r, ptr, rec, key, what)
}

/// `cuIpcOpenMemHandle(_v2)`: memory this container exported is already charged (the importer joins its
/// shared entry); memory another container exported is charged to this process until it closes it (refused,
/// and closed again, when it does not fit).
///
/// # Safety
/// `pdptr` as the driver's contract says (written on success).
pub unsafe fn ipc_open(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
) -> CUresult {
    let key = shared::key(&handle.reserved);
    // SAFETY: as the caller's contract says.
    unsafe {
        hold_import(s, call, pdptr, key, "cuIpcOpenMemHandle", |p| {
            // SAFETY: closing the mapping the driver just opened for this call.
            s.cuda.cuIpcCloseMemHandle(p);
        })
    }
}

/// `cuIpcCloseMemHandle`: the last close lets go of the hold.
pub fn ipc_close(s: &Shim, call: impl FnOnce() -> CUresult, dptr: CUdeviceptr) -> CUresult {
    let r = call();
    if r.ok() {
        let_go(s, s.mem.shared.close(dptr));
    }
    r
}

// ---- stream-ordered allocator -------------------------------------------------------------------------------

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

/// A pool allocation. The pool may grow by the whole (rounded) request, so that is what is reserved in the
/// ledger before the driver is called: no moment exists when the pool holds more than the container was
/// admitted. Only when the whole request does not fit, and a block this process freed into the pool's reserve
/// (already charged) can serve it, is it admitted with what the unused reserve cannot cover (usually nothing).
/// Afterwards the charge settles to the pool's real `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
fn pool_alloc(
    s: &Shim,
    dev: Dev,
    pool: CUmemoryPool,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    out: impl FnOnce() -> u64,
) -> CUresult {
    let key = pool as usize;
    let len = s.devices.round(&s.cuda, dev, bytes);
    s.mem.track_pool(key, Some(dev));
    s.mem.pool_prepare(&s.cuda, key, len, false);
    // Held until the driver call returns (a reserved-memory announcement lives in the guard).
    let admit = |n| s.mem.admit(dev, n, &s.cuda, &s.nvml).ok();
    let full = admit(len).or_else(|| {
        // The pools may have released memory at a synchronisation since we last looked: refresh, retry once.
        s.mem.refresh_pools_of(&s.cuda, dev.id);
        admit(len)
    });
    let (est, claimed, _admitted) = if let Some(a) = full {
        (len, None, a)
    } else if let Some(block) = s.mem.pool_prepare(&s.cuda, key, len, true) {
        let est = len.saturating_sub(s.mem.pool_slack(&s.cuda, key));
        match admit(est) {
            Some(a) => (est, Some(block), a),
            None => {
                s.mem.pool_unclaim(key, block);
                return CUresult::ERROR_OUT_OF_MEMORY;
            }
        }
    } else {
        return CUresult::ERROR_OUT_OF_MEMORY;
    };
    let r = call();
    if !r.ok() {
        s.mem.release(dev, est);
        if let Some(block) = claimed {
            s.mem.pool_unclaim(key, block);
        }
        return r;
    }
    let addr = out();
    let stale = s.mem.ledger.insert(
        Space::Pointer,
        addr,
        Record {
            entry: dev.id,
            bytes: len,
            kind: Kind::Pool(key),
        },
    );
    release_stale(s, stale);
    let over = s.mem.pool_settle(&s.cuda, key, dev, est, len, addr, claimed);
    if over > 0 {
        // Only a driver that grows the pool although a free block of the size was in its reserve gets here.
        log!(
            Level::Warn,
            "pool {key:#x} grew {over} bytes beyond what was admitted for a {len}-byte allocation"
        );
    }
    r
}

/// `cuMemAllocAsync` (`pool` = `None`: the device's current pool) and `cuMemAllocFromPoolAsync`, each also
/// `_ptsz`.
///
/// # Safety
/// `dptr` as the driver's contract says (written on success).
pub unsafe fn alloc_async(
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
                None => return untracked(s, call),
            },
        },
        None => {
            let Some(dev) = stream_device(s, stream, ds) else {
                return untracked(s, call);
            };
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            if !unsafe { s.cuda.cuDeviceGetMemPool(&mut pool, dev.ordinal) }.ok() || pool.is_null() {
                // Cannot see the pool: account it as a plain allocation instead.
                let est = s.devices.round(&s.cuda, dev, bytesize as u64);
                return charged_call(s, dev, est, call, || Some((Space::Pointer, out(), None)));
            }
            (dev, pool)
        }
    };
    pool_alloc(s, dev, pool, bytesize as u64, call, out)
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
pub unsafe fn pool_create(
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
pub fn pool_trim(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.refresh_pool(&s.cuda, pool as usize);
    }
    r
}

/// `cuMemPoolDestroy`: gives the pool's charge back, or, while allocations of it are still out (cuda.h keeps
/// them valid and the pool's resources until the last is freed), when the last of them is freed.
pub fn pool_destroy(s: &Shim, call: impl FnOnce() -> CUresult, pool: CUmemoryPool) -> CUresult {
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
pub fn ctx_synchronize(s: &Shim, call: impl FnOnce() -> CUresult, ctx: Option<CUcontext>) -> CUresult {
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
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: the caller's context made current for one query, then popped; valid out-pointers.
            let ok = unsafe {
                s.cuda.cuCtxPushCurrent_v2(c).ok() && {
                    let got = s.cuda.cuCtxGetDevice(&mut d).ok();
                    s.cuda.cuCtxPopCurrent_v2(&mut popped);
                    got
                }
            };
            ok.then(|| s.devices.device(&s.cuda, d)).flatten()
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
pub fn stream_synchronize(
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
pub unsafe fn pool_export_pointer(
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
pub unsafe fn pool_import_pointer(
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
    let key = shared::key(&copy.reserved);
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

// ---- virtual memory management ------------------------------------------------------------------------------

/// `cuMemCreate`: charges `size` (granularity-aligned by contract) to `prop.location`, until the memory is
/// really gone: every reference released and every mapping unmapped (`memory::vmm`).
///
/// # Safety
/// `handle`, `prop` as the driver's contract says.
pub unsafe fn vmm_create(
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
        return untracked(s, call);
    };
    let est = s.devices.round(&s.cuda, dev, size as u64);
    let mut created = None;
    let r = charged_call(s, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let h = unsafe { *handle };
        created = Some(h);
        Some((Space::Vmm, h, None))
    });
    if let Some(h) = created {
        s.mem.vmm.created(h);
    }
    r
}

/// `cuMemRelease`: one reference fewer; the charge goes with the last one of an unmapped allocation (a
/// multicast object's bindings with its own).
pub fn vmm_release(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    match s.mem.vmm.release(handle) {
        Release::Untracked => tracked_free(s, Space::Vmm, handle, None, call),
        Release::Last => {
            // A multicast object's last reference unbinds what was bound to it.
            let u = s.mem.vmm.released_multicast(handle);
            unmapping(s, u, || {
                let rec = s.mem.ledger.remove(Space::Vmm, handle);
                let r = call();
                if r.ok() {
                    vmm_gone(s, handle, rec);
                } else {
                    if let Some(rec) = rec {
                        s.mem.ledger.insert(Space::Vmm, handle, rec);
                    }
                    s.mem.vmm.undo_release(handle, Release::Last);
                }
                r
            })
        }
        was @ (Release::Kept | Release::Again) => {
            let r = call();
            if !r.ok() {
                s.mem.vmm.undo_release(handle, was);
            }
            r
        }
    }
}

/// `cuMemRetainAllocationHandle`: one more reference to release.
///
/// # Safety
/// `handle` as the driver's contract says.
pub unsafe fn vmm_retain(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
) -> CUresult {
    let r = call();
    if r.ok() && !handle.is_null() {
        // SAFETY: non-NULL, written by the driver on success.
        s.mem.vmm.retained(unsafe { *handle });
    }
    r
}

/// `cuMemMap`: a mapping keeps its allocation (and its charge) alive. The first mapping of memory imported from
/// another container charges its size to this process (no size is known before: fail closed from here on).
pub fn vmm_map(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let foreign = match s.mem.shared.vmm_import(handle) {
        Some(None) => Some(0),
        Some(Some(Hold::Charged { bytes, .. })) if bytes < size as u64 => Some(bytes),
        _ => None,
    };
    let Some(had) = foreign else {
        let r = call();
        if r.ok() {
            s.mem.vmm.mapped(ptr, size as u64, handle);
        }
        return r;
    };
    // The memory's own device, which the mapping's context need not be on.
    // SAFETY: plain data the driver fills in on success.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `handle` forwarded.
    let on = unsafe { s.cuda.cuMemGetAllocationPropertiesFromHandle(&mut prop, handle) };
    let dev = if on.ok() && prop.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        s.devices.device(&s.cuda, prop.location.id)
    } else {
        s.devices.current(&s.cuda)
    };
    let Some(dev) = dev else {
        return untracked(s, call);
    };
    let more = size as u64 - had;
    let Ok(_admitted) = s.mem.admit(dev, more, &s.cuda, &s.nvml) else {
        return CUresult::ERROR_OUT_OF_MEMORY;
    };
    let r = call();
    if r.ok() {
        s.mem.vmm.mapped(ptr, size as u64, handle);
        s.mem.shared.vmm_imported(
            handle,
            Some(Hold::Charged {
                dev: dev.id,
                bytes: size as u64,
            }),
        );
    } else {
        s.mem.release(dev, more);
    }
    r
}

/// The memory of VMM handle `h` is gone from this process (last reference released, last mapping unmapped):
/// its charge (`rec`), or its share of the container's shared table, or its import's hold, goes.
fn vmm_gone(s: &Shim, h: u64, rec: Option<Record>) {
    if let Some(e) = s.mem.shared.take_vmm_export(h) {
        s.mem.export_gone(&s.cuda, h, e, rec, None);
        return;
    }
    if let Some(rec) = rec {
        s.mem.release_entry(rec.entry, rec.bytes);
    }
    match s.mem.shared.take_vmm_import(h) {
        Some(Some(Hold::Shared { entry, key })) => s.mem.unshare(entry, key),
        Some(Some(Hold::Charged { dev, bytes })) => s.mem.release_entry(dev, bytes),
        Some(None) | None => {}
    }
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
            shared::fd_key(unsafe { *(shareable as *const c_int) })
        }
        CU_MEM_HANDLE_TYPE_FABRIC => {
            // SAFETY: a CUmemFabricHandle there (unaligned-tolerant read), as the contract says.
            let h = unsafe { (shareable as *const CUmemFabricHandle).read_unaligned() };
            Some(shared::key(&h.data))
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
pub unsafe fn vmm_export(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_uint,
) -> CUresult {
    let r = call();
    if r.ok() {
        s.mem.vmm.exported(handle);
    }
    if !r.ok() || shareable.is_null() || s.mem.shared.vmm_exported(handle) {
        return r;
    }
    let Some(rec) = s.mem.ledger.get(Space::Vmm, handle) else {
        return r;
    };
    // SAFETY: non-NULL; the driver wrote a handle of this type there.
    let Some(key) = (unsafe { shareable_key(shareable, handle_type) }) else {
        return r;
    };
    match s.mem.share(rec.entry, key, rec.bytes) {
        Some((entry, moved)) => {
            s.mem.shared.vmm_export(handle, Export { entry, key, moved });
            r
        }
        None => {
            log!(
                Level::Error,
                "cuMemExportToShareableHandle refused: the container's table of memory shared between \
                 processes is full ({} entries); release exported allocations first",
                cuquota_core::region::layout::MAX_SHARED
            );
            if handle_type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
                // SAFETY: the descriptor the driver just made for this call, never handed to the caller.
                unsafe { libc::close(*(shareable as *const c_int)) };
            }
            CUresult::ERROR_OUT_OF_MEMORY
        }
    }
}

/// `cuMemImportFromShareableHandle`: memory this container exported (a POSIX descriptor or fabric handle it
/// shared) is already charged (the new handle joins its shared entry); any other import — another container's
/// export, a handle type the shim cannot identify — is charged to this process from its first mapping
/// (`vmm_map`) until its last reference and mapping go.
///
/// # Safety
/// `handle`, `os_handle` as the driver's contract says (the handle written on success).
pub unsafe fn vmm_import(
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
        (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, _) => shared::fd_key(os_handle as usize as c_int),
        (_, Some(f)) => Some(shared::key(&f.data)),
        _ => None,
    };
    let os_handle = match fabric.as_mut() {
        Some(f) => (f as *mut CUmemFabricHandle).cast(),
        None => os_handle,
    };
    let r = real(handle, os_handle, handle_type);
    if !r.ok() || handle.is_null() {
        return r;
    }
    // SAFETY: non-NULL, written by the driver on success.
    let h = unsafe { *handle };
    if s.mem.ledger.get(Space::Vmm, h).is_some() || s.mem.shared.vmm_import(h).is_some() {
        // A handle this process has already (the driver gave the same one again): one more reference.
        s.mem.vmm.retained(h);
        return r;
    }
    s.mem.vmm.created(h);
    let hold = key.and_then(|key| {
        Some(Hold::Shared {
            entry: s.mem.join_shared(key)?,
            key,
        })
    });
    s.mem.shared.vmm_imported(h, hold);
    r
}

/// `cuMemUnmap`: the last mapping of a released allocation takes its charge with it.
pub fn vmm_unmap(s: &Shim, call: impl FnOnce() -> CUresult, ptr: CUdeviceptr, size: usize) -> CUresult {
    let u = s.mem.vmm.unmap(ptr, size as u64);
    unmapping(s, u, call)
}

/// Runs `call`, which undoes the mappings or bindings `u` took: the memory that goes with them stops being
/// charged if the driver says yes; they are put back if it refuses.
fn unmapping(s: &Shim, u: Unmapped, call: impl FnOnce() -> CUresult) -> CUresult {
    // Records leave the ledger before the call, as in `tracked_free`: once the memory is gone the driver may
    // hand the handle value out again.
    let gone: Vec<(u64, Record)> = u
        .dead
        .iter()
        .filter_map(|&h| Some((h, s.mem.ledger.remove(Space::Vmm, h)?)))
        .collect();
    let r = call();
    if r.ok() {
        let charged: Vec<u64> = gone.iter().map(|&(h, _)| h).collect();
        for (h, rec) in gone {
            vmm_gone(s, h, Some(rec));
        }
        // Imports charge nothing in the ledger: their holds go too.
        for &h in u.dead.iter().filter(|h| !charged.contains(h)) {
            vmm_gone(s, h, None);
        }
    } else {
        for (h, rec) in gone {
            s.mem.ledger.insert(Space::Vmm, h, rec);
        }
        s.mem.vmm.undo_unmap(u);
    }
    r
}

/// Handles whose memory went with a binding the driver replaced.
fn gone_now(s: &Shim, dead: Vec<u64>) {
    for h in dead {
        let rec = s.mem.ledger.remove(Space::Vmm, h);
        vmm_gone(s, h, rec);
    }
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
pub unsafe fn map_array_async(
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
    let unmaps: Vec<BindKey> = entries
        .iter()
        .filter(|m| m.memOperationType == CU_MEM_OPERATION_TYPE_UNMAP)
        .map(tile_key)
        .collect();
    let u = s.mem.vmm.unbind(|k| unmaps.contains(k));
    let r = unmapping(s, u, call);
    for m in entries
        .iter()
        .filter(|m| m.memOperationType == CU_MEM_OPERATION_TYPE_MAP)
    {
        if r.ok() {
            gone_now(s, s.mem.vmm.bound(tile_key(m), m.memHandle));
        } else {
            s.mem.vmm.maybe_bound(tile_key(m), m.memHandle);
        }
    }
    r
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
pub unsafe fn multicast_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: *mut CUmemGenericAllocationHandle,
) -> CUresult {
    let r = call();
    if r.ok() && !mc.is_null() {
        // SAFETY: non-NULL, written by the driver on success.
        s.mem.vmm.multicast_created(unsafe { *mc });
    }
    r
}

/// `cuMulticastBindMem` (`mem`) and `cuMulticastBindAddr` (the handle this process mapped at `memptr`): the
/// bound memory stays charged while bound, its handle released or not.
pub fn multicast_bind(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: Option<CUmemGenericAllocationHandle>,
    memptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    let r = call();
    if !r.ok() {
        return r;
    }
    let Some(h) = mem.or_else(|| s.mem.vmm.handle_at(memptr)) else {
        return r;
    };
    // SAFETY: plain data the driver fills in on success.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; a handle the driver just bound.
    let on = unsafe { s.cuda.cuMemGetAllocationPropertiesFromHandle(&mut prop, h) };
    // Unknown device: no unbind names it, the binding stays charged until the object goes (fail closed).
    let dev = if on.ok() { prop.location.id } else { -1 };
    gone_now(s, s.mem.vmm.bound(multicast_key(mc, dev, mc_offset, size), h));
    r
}

/// `cuMulticastUnbind`: the binding of `dev`'s memory at exactly (`mc_offset`, `size`) lets go (cuda.h: they
/// must match the bind's; the driver unbinds nothing else).
pub fn multicast_unbind(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> CUresult {
    let key = multicast_key(mc, dev, mc_offset, size);
    let u = s.mem.vmm.unbind(|k| *k == key);
    unmapping(s, u, call)
}

// ---- arrays -------------------------------------------------------------------------------------------------

/// What an array descriptor (1D/2D or 3D, current or legacy ABI) says about its size.
pub trait ArrayDesc: Copy {
    /// `(width, height, depth, format, channels, flags)`.
    fn dims(&self) -> (u64, u64, u64, CUarray_format, u32, u32);
}

/// A 1D/2D descriptor: depth 1, no flags.
macro_rules! array_2d_desc {
    ($($t:ty),*) => {$(
        impl ArrayDesc for $t {
            fn dims(&self) -> (u64, u64, u64, CUarray_format, u32, u32) {
                (self.Width as u64, self.Height as u64, 1, self.Format, self.NumChannels, 0)
            }
        }
    )*};
}
array_2d_desc!(CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR_v1);

/// A 3D descriptor.
macro_rules! array_3d_desc {
    ($($t:ty),*) => {$(
        impl ArrayDesc for $t {
            fn dims(&self) -> (u64, u64, u64, CUarray_format, u32, u32) {
                let d = self;
                (d.Width as u64, d.Height as u64, d.Depth as u64, d.Format, d.NumChannels, d.Flags)
            }
        }
    )*};
}
array_3d_desc!(CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR_v1);

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
    if flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
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

/// An array or mipmapped array of `levels` levels described by `desc`, in ledger space `space`; `exact(handle,
/// ordinal)` asks the driver for its real size.
fn array_alloc<D: ArrayDesc>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pHandle: *mut *mut c_void,
    desc: *const D,
    levels: c_uint,
    space: Space,
    exact: impl FnOnce(*mut c_void, CUdevice, &mut CUDA_ARRAY_MEMORY_REQUIREMENTS) -> CUresult,
) -> CUresult {
    if desc.is_null() || pHandle.is_null() {
        return call();
    }
    let Some(dev) = s.devices.current(&s.cuda) else {
        return untracked(s, call);
    };
    // SAFETY: non-NULL caller descriptor.
    let (w, h, d, format, channels, flags) = unsafe { *desc }.dims();
    let est = array_estimate(w, h, d, format, channels, flags, levels);
    let est = s.devices.round(&s.cuda, dev, est);
    // A sparse or deferred-mapping array's requirements are what its bound VMM allocations (charged at
    // `cuMemCreate`) will back: the array itself holds nothing.
    let backed = flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0;
    charged_call(s, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let handle = unsafe { *pHandle };
        let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
        let exact = if backed {
            Some(0)
        } else {
            exact(handle, dev.ordinal, &mut req)
                .ok()
                .then(|| s.devices.round(&s.cuda, dev, req.size as u64))
        };
        Some((space, handle as u64, exact))
    })
}

/// `cuArrayCreate_v2`, `cuArray3DCreate_v2` and their legacy forms.
///
/// # Safety
/// `pHandle`, `desc` as the driver's contract says.
pub unsafe fn array_create<D: ArrayDesc>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pHandle: *mut CUarray,
    desc: *const D,
) -> CUresult {
    array_alloc(s, call, pHandle, desc, 1, Space::Array, |a, o, req| {
        // SAFETY: valid out-pointer, a live array.
        unsafe { s.cuda.cuArrayGetMemoryRequirements(req, a, o) }
    })
}

/// `cuMipmappedArrayCreate`.
///
/// # Safety
/// `pHandle`, `desc` as the driver's contract says.
pub unsafe fn mipmapped_create(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pHandle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    array_alloc(s, call, pHandle, desc, levels, Space::Mipmapped, |m, o, req| {
        // SAFETY: valid out-pointer, a live mipmapped array.
        unsafe { s.cuda.cuMipmappedArrayGetMemoryRequirements(req, m, o) }
    })
}

/// `cuArrayDestroy`: what was bound to a sparse array's tiles goes with it.
pub fn array_destroy(s: &Shim, call: impl FnOnce() -> CUresult, h: CUarray) -> CUresult {
    if !s.mem.vmm.has_binds() {
        return tracked_free(s, Space::Array, h as u64, None, call);
    }
    let u = s.mem.vmm.unbind(|k| k.obj == Obj::Array(h as u64));
    unmapping(s, u, || tracked_free(s, Space::Array, h as u64, None, call))
}

/// `cuMipmappedArrayDestroy`: as `cuArrayDestroy`.
pub fn mipmapped_destroy(s: &Shim, call: impl FnOnce() -> CUresult, h: CUmipmappedArray) -> CUresult {
    if !s.mem.vmm.has_binds() {
        return tracked_free(s, Space::Mipmapped, h as u64, None, call);
    }
    let u = s.mem.vmm.unbind(|k| k.obj == Obj::Array(h as u64));
    unmapping(s, u, || tracked_free(s, Space::Mipmapped, h as u64, None, call))
}

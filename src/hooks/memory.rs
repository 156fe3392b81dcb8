//! Every device-memory allocation and free path: each hook decodes its arguments and calls `crate::memory`'s
//! interface with the real call (`memory::charge`: admit, call, commit or give back; free; `interprocess`,
//! `vmm_ops`, `pools`).
//!
//! Sizes: linear and managed allocations are rounded up to the device's allocation granularity; pitched ones
//! charge pitch × height as returned (admitted as width rounded up to 512 × height); VMM handles charge their
//! size until the memory is really gone (every reference released, every mapping unmapped); arrays charge
//! `cuArrayGetMemoryRequirements` / `cuMipmappedArrayGetMemoryRequirements` (admitted with an estimate from the
//! descriptor); stream-ordered pools charge their `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.

#![allow(non_snake_case)]

use super::Width;
use crate::ffi::cuda::*;
use crate::memory::{shared_key, IpcCall, Space, VmmCall};
use crate::state::Shim;
use std::ffi::{c_uint, c_void};

mod pools;
mod vmm;
// The routing list (`abi::cuda`, src/abi/cuda.rs) names every memory hook `memory::<hook>`.
pub(crate) use pools::*;
pub(crate) use vmm::*;

/// Upper bound the driver's pitch never exceeds (texture pitch alignment).
const PITCH_ALIGN: u64 = 512;

/// A linear allocation of `bytes` on the current context's device. One the driver refuses for want of device
/// memory, though admitted within the limit, may wait for the agent's reclaim (`Elastic::reclaim_wait`).
fn linear(s: &Shim, bytes: u64, call: impl Fn() -> CUresult, out: impl FnOnce() -> u64) -> CUresult {
    let Some((dev, est)) = s.devices.current_rounded(&s.cuda, bytes) else {
        return s.mem.allocs().untracked(call);
    };
    let call = || {
        let r = call();
        if r == CUresult::ERROR_OUT_OF_MEMORY {
            return s.mem.elastic().reclaim_wait(dev, est, &call);
        }
        r
    };
    s.mem.allocs().charged_call(&s.cuda, &s.nvml, dev, est, call, || {
        Some((Space::Pointer, out(), None))
    })
}

/// `cuMemAlloc_v2`, legacy `cuMemAlloc` (32-bit size and address), `cuMemAllocManaged` (charged to the current
/// device, like HAMi): a linear allocation on the current context's device.
///
/// # Safety
/// `dptr` as the driver's contract says (written on success).
pub(crate) unsafe fn alloc<P: Width, N: Width>(
    s: &Shim,
    call: impl Fn() -> CUresult,
    dptr: *mut P,
    bytesize: N,
) -> CUresult {
    // SAFETY: `dptr` is read only after the driver succeeded (it wrote it).
    linear(s, bytesize.to_u64(), call, || unsafe { *dptr }.to_u64())
}

/// `cuMemAlloc_v2`: as [`alloc`]; an elastic tenant's allocation from `CUQUOTA_ELASTIC_MIN_BYTES` on is made
/// movable (`memory::elastic`), charged the same.
///
/// # Safety
/// `dptr` as the driver's contract says (written on success).
pub(crate) unsafe fn alloc_v2(
    s: &Shim,
    call: impl Fn() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    if bytesize as u64 >= s.devices.elastic_min_bytes() && !dptr.is_null() {
        if let Some(r) = alloc_movable(s, dptr, bytesize as u64) {
            return r;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { alloc(s, call, dptr, bytesize) }
}

/// Starts the thread that evicts and restores movable ranges (`memory::elastic`): an idle process makes no calls.
#[cold]
fn start_mover() {
    let spawned = std::thread::Builder::new()
        .name("cuquota-elastic".into())
        .spawn(|| loop {
            std::thread::sleep(crate::memory::ELASTIC_POLL);
            if let Some(s) = crate::state::active_cuda() {
                s.mem.elastic().tick(&s.cuda);
            }
        });
    if let Err(e) = spawned {
        crate::log::log!(
            crate::log::Level::Warn,
            "elastic: no mover thread ({e}): memory stays resident"
        );
    }
}

/// [`alloc_v2`] of an allocation large enough to move: `None` when its tenant is not elastic (out of line: small
/// allocations pay one comparison for it).
#[cold]
#[inline(never)]
fn alloc_movable(s: &Shim, dptr: *mut CUdeviceptr, bytes: u64) -> Option<CUresult> {
    let (dev, est) = s.devices.current_rounded(&s.cuda, bytes)?;
    if !s.mem.elastic().movable(dev, est) {
        return None;
    }
    let p = std::cell::Cell::new(0);
    let make = || match s.mem.elastic().alloc(&s.cuda, dev, est) {
        Ok(v) => {
            p.set(v);
            CUresult::SUCCESS
        }
        Err(e) => e,
    };
    // Within the request it waits for the reclaim like any allocation ([`linear`]).
    let call = || {
        let r = make();
        if r == CUresult::ERROR_OUT_OF_MEMORY {
            return s.mem.elastic().reclaim_wait(dev, est, &make);
        }
        r
    };
    let r = s.mem.allocs().charged_call(&s.cuda, &s.nvml, dev, est, call, || {
        Some((Space::Pointer, p.get(), None))
    });
    if r.ok() && s.mem.elastic().start_once() {
        start_mover();
    }
    if r.ok() {
        // SAFETY: non-NULL (checked by the caller), writable by the driver's contract.
        unsafe { *dptr = p.get() };
    }
    Some(r)
}

/// `cuMemAllocPitch_v2`, legacy `cuMemAllocPitch`: charges pitch × height as returned.
///
/// # Safety
/// `dptr`, `pPitch` as the driver's contract says (written on success).
pub(crate) unsafe fn alloc_pitch<P: Width, N: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: *mut P,
    pPitch: *mut N,
    width: N,
    height: N,
) -> CUresult {
    let Some(dev) = s.devices.current(&s.cuda) else {
        return s.mem.allocs().untracked(call);
    };
    let height = height.to_u64();
    let bound = width
        .to_u64()
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height);
    let est = s.devices.round(&s.cuda, dev, bound);
    s.mem.allocs().charged_call(&s.cuda, &s.nvml, dev, est, call, || {
        // SAFETY: written by the driver on success.
        let (ptr, pitch) = unsafe { ((*dptr).to_u64(), (*pPitch).to_u64()) };
        let exact = s.devices.round(&s.cuda, dev, pitch.saturating_mul(height));
        Some((Space::Pointer, ptr, Some(exact)))
    })
}

/// `cuMemFree_v2`, legacy `cuMemFree`.
pub(crate) fn free<P: Width>(s: &Shim, call: impl FnOnce() -> CUresult, dptr: P) -> CUresult {
    let p = dptr.to_u64();
    if s.mem.elastic().on() && s.mem.elastic().is_movable(p) {
        return s
            .mem
            .allocs()
            .free_pointer(&s.cuda, p, None, || s.mem.elastic().free(&s.cuda, p));
    }
    s.mem.allocs().free_pointer(&s.cuda, p, None, call)
}

/// `cuMemFreeAsync` (+ `_ptsz`): the free runs later, in `stream`'s order.
pub(crate) fn free_async(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    dptr: CUdeviceptr,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    s.mem
        .allocs()
        .free_pointer(&s.cuda, dptr, Some(stream_key(stream, ds)), call)
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

// ---- interprocess memory (memory::shared) -------------------------------------------------------------------

/// `cuIpcGetMemHandle`: the allocation's charge moves into the container's shared table under the handle's
/// key, where an importer of the same container finds it. A full table refuses the export.
///
/// # Safety
/// `handle` as the driver's contract says (written on success).
pub(crate) unsafe fn ipc_get(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    // Exported memory is mapped by another process: a movable range stays resident from now on.
    let pinned = s.mem.elastic().pin(&s.cuda, dptr);
    // SAFETY: a CUipcMemHandle is its 64 bytes; as the caller's contract says.
    let r = unsafe { export_pointer(s, call, handle.cast(), dptr, "cuIpcGetMemHandle") };
    if pinned && !r.ok() {
        // Refused (a driver may refuse VMM memory for legacy IPC): nothing exported, so it may move again.
        s.mem.elastic().unpin(dptr);
    }
    r
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
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let key = || (!bytes.is_null()).then(|| shared_key(unsafe { &*bytes }));
    let export = IpcCall::Export { what, ptr, key: &key };
    s.mem.ipc(&s.cuda, &s.nvml, export, call)
}

/// An import by `what` (`call`, writing its address at `out`) of the memory exported under `key`
/// (`Memory::imported_pointer`; `undo` gives a refused import back to the driver).
///
/// # Safety
/// `out` NULL or writable, as the driver's contract says.
unsafe fn hold_import(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    out: *mut CUdeviceptr,
    key: u64,
    what: &str,
    undo: impl Fn(u64),
) -> CUresult {
    // SAFETY: non-NULL, written by the driver on success (read only then).
    let out = || (!out.is_null()).then(|| unsafe { *out });
    let import = IpcCall::Import {
        what,
        key,
        out: &out,
        undo: &undo,
    };
    s.mem.ipc(&s.cuda, &s.nvml, import, call)
}

/// `cuIpcOpenMemHandle(_v2)`: memory this container exported is already charged (the importer joins its
/// shared entry); memory another container exported is charged to this process until it closes it (refused,
/// and closed again, when it does not fit).
///
/// # Safety
/// `pdptr` as the driver's contract says (written on success).
pub(crate) unsafe fn ipc_open(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
) -> CUresult {
    let key = shared_key(&handle.reserved);
    // SAFETY: as the caller's contract says.
    unsafe {
        hold_import(s, call, pdptr, key, "cuIpcOpenMemHandle", |p| {
            // SAFETY: closing the mapping the driver just opened for this call.
            s.cuda.cuIpcCloseMemHandle(p);
        })
    }
}

/// `cuIpcCloseMemHandle`: the last close lets go of the hold.
pub(crate) fn ipc_close(s: &Shim, call: impl FnOnce() -> CUresult, dptr: CUdeviceptr) -> CUresult {
    s.mem.ipc(&s.cuda, &s.nvml, IpcCall::Close(dptr), call)
}

// ---- arrays -------------------------------------------------------------------------------------------------

/// What an array descriptor (1D/2D or 3D, current or legacy ABI) says about its size.
pub(crate) trait ArrayDesc: Copy {
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
pub(crate) fn array_estimate(
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
        return s.mem.allocs().untracked(call);
    };
    // SAFETY: non-NULL caller descriptor.
    let (w, h, d, format, channels, flags) = unsafe { *desc }.dims();
    let est = array_estimate(w, h, d, format, channels, flags, levels);
    let est = s.devices.round(&s.cuda, dev, est);
    // A sparse or deferred-mapping array's requirements are what its bound VMM allocations (charged at
    // `cuMemCreate`) will back: the array itself holds nothing.
    let backed = flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0;
    s.mem.allocs().charged_call(&s.cuda, &s.nvml, dev, est, call, || {
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
pub(crate) unsafe fn array_create<D: ArrayDesc>(
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
pub(crate) unsafe fn mipmapped_create(
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
pub(crate) fn array_destroy(s: &Shim, call: impl FnOnce() -> CUresult, h: CUarray) -> CUresult {
    let destroy = VmmCall::ArrayDestroy {
        h: h as u64,
        mipmapped: false,
    };
    s.mem.vmm(&s.cuda, &s.nvml, destroy, call)
}

/// `cuMipmappedArrayDestroy`: as `cuArrayDestroy`.
pub(crate) fn mipmapped_destroy(s: &Shim, call: impl FnOnce() -> CUresult, h: CUmipmappedArray) -> CUresult {
    let destroy = VmmCall::ArrayDestroy {
        h: h as u64,
        mipmapped: true,
    };
    s.mem.vmm(&s.cuda, &s.nvml, destroy, call)
}

//! Copies and memsets: best-effort device work like kernels, so priority gates them (docs/priority.md).
//!
//! Paths: every `cuMemcpy*` / `cuMemset*` the routing list exports (v2, legacy 32-bit, `_ptds` / `_ptsz`, peer,
//! 2D/3D, batch): asynchronous forms on their stream, synchronous ones on the NULL stream (legacy, or per-thread
//! for `_ptds`). Without a priority file: one check and the real call (an SM limit or a memory cap alone adds
//! nothing: copies are not charged to the SM limit). With one: the copy is keyed by its size class and goes
//! through the throttle's priority judgement as a launch does (`SmThrottle::copy`), measured like a kernel.

use super::probe_stream;
use crate::ffi::cuda::*;
use crate::state::Shim;
use crate::throttle::estimate::launch_key;

/// Key tag of copies and memsets (a launch key's "function"): one estimate per power-of-two size class.
const COPY_TAG: usize = 0x636f_7079;

/// The key of a copy of `bytes`: its size class (bytes rounded down to a power of two; `u64::MAX`: not known).
fn copy_key(bytes: u64) -> u64 {
    let class = if bytes == u64::MAX {
        u64::MAX
    } else {
        u64::from(64 - bytes.leading_zeros())
    };
    launch_key(COPY_TAG, class, 0)
}

/// A copy or memset of `bytes` on `stream` (the NULL stream of `ds` for the synchronous forms).
#[inline]
pub(crate) fn flat(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    bytes: u64,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if s.mem.elastic().on() {
        let probe = probe_stream(stream, ds);
        return s
            .mem
            .elastic()
            .call(&s.cuda, &[probe], move || judged(s, call, bytes, stream, ds));
    }
    judged(s, call, bytes, stream, ds)
}

/// A stream memory operation (`cuStreamWriteValue*`, `cuStreamWaitValue*`, `cuStreamBatchMemOp`, each `_v2` and
/// `_ptsz`): it reads or writes device memory on its stream, so with movable ranges it passes elastic memory's
/// gate as a copy does (ranges brought back first, none moves while it is in flight, its stream then asked for
/// quiescence: a wait still pending keeps the process from being idle). Not judged by priority (no change).
#[inline]
pub(crate) fn mem_op(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if s.mem.elastic().on() {
        return s.mem.elastic().call(&s.cuda, &[probe_stream(stream, ds)], call);
    }
    call()
}

/// [`flat`] past elastic memory's gate.
#[inline(always)]
fn judged(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    bytes: u64,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if !s.devices.prioritised() {
        return call();
    }
    s.throttle
        .copy(&s.cuda, &s.nvml, copy_key(bytes), probe_stream(stream, ds), call)
}

/// A copy described by a parameter struct `p` (NULL or a `T`, the driver's contract), of `bytes(&*p)` bytes.
///
/// # Safety
/// `p` is NULL or points to a `T`.
unsafe fn described<T>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    p: *const T,
    bytes: impl FnOnce(&T) -> u64,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if p.is_null() || !(s.devices.prioritised() || s.mem.elastic().on()) {
        return call();
    }
    // SAFETY: non-NULL, a `T` by the caller's contract.
    let n = bytes(unsafe { &*p });
    flat(s, call, n, stream, ds)
}

/// `cuMemcpy2D*`.
///
/// # Safety
/// `p` is NULL or points to a `CUDA_MEMCPY2D`.
pub(crate) unsafe fn copy_2d(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    p: *const CUDA_MEMCPY2D,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let bytes = |c: &CUDA_MEMCPY2D| volume(c.WidthInBytes, c.Height, 1);
    // SAFETY: forwarded contract.
    unsafe { described(s, call, p, bytes, stream, ds) }
}

/// `cuMemcpy3D*`.
///
/// # Safety
/// `p` is NULL or points to a `CUDA_MEMCPY3D`.
pub(crate) unsafe fn copy_3d(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    p: *const CUDA_MEMCPY3D,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let bytes = |c: &CUDA_MEMCPY3D| volume(c.WidthInBytes, c.Height, c.Depth);
    // SAFETY: forwarded contract.
    unsafe { described(s, call, p, bytes, stream, ds) }
}

/// `cuMemcpy3DPeer*`.
///
/// # Safety
/// `p` is NULL or points to a `CUDA_MEMCPY3D_PEER`.
pub(crate) unsafe fn copy_3d_peer(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    p: *const CUDA_MEMCPY3D_PEER,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    let bytes = |c: &CUDA_MEMCPY3D_PEER| volume(c.WidthInBytes, c.Height, c.Depth);
    // SAFETY: forwarded contract.
    unsafe { described(s, call, p, bytes, stream, ds) }
}

fn volume(w: usize, h: usize, d: usize) -> u64 {
    (w as u64).saturating_mul(h as u64).saturating_mul(d as u64)
}

/// `cuMemcpyBatchAsync*`: the batch's total size (at most 2^20 entries read; more is sized as unknown).
///
/// # Safety
/// `sizes` is NULL or points to `count` sizes.
pub(crate) unsafe fn batch(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    sizes: *mut usize,
    count: usize,
    stream: CUstream,
    ds: DefaultStream,
) -> CUresult {
    if !(s.devices.prioritised() || s.mem.elastic().on()) {
        return call();
    }
    let bytes = if sizes.is_null() || count > 1 << 20 {
        u64::MAX
    } else {
        // SAFETY: `count` sizes by the caller's contract.
        let v = unsafe { std::slice::from_raw_parts(sizes, count) };
        v.iter().fold(0u64, |a, &b| a.saturating_add(b as u64))
    };
    flat(s, call, bytes, stream, ds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_of_one_size_class_share_a_key() {
        assert_eq!(copy_key(1 << 20), copy_key((2 << 20) - 1));
        assert_ne!(copy_key(1 << 20), copy_key(2 << 20));
        assert_ne!(copy_key(0), copy_key(1));
        assert_ne!(copy_key(u64::MAX), copy_key(u64::MAX - 1));
    }
}

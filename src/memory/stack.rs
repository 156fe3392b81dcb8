//! The stack the driver grows at a launch: a kernel's local memory per thread beyond the context's stack size,
//! for every thread the device holds. Priced alike for a direct launch, a graph's kernels and `cuCtxSetLimit`.

use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use std::ffi::c_int;

/// Device memory a per-thread stack of `per_thread` bytes takes: one for every thread the device can hold.
pub(crate) fn bytes(cuda: &CudaTable, dev: Dev, per_thread: u64) -> u64 {
    let attr = |a: CUdevice_attribute| {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let ok = unsafe { cuda.cuDeviceGetAttribute(&mut n, a, dev.ordinal) }.ok();
        (ok && n > 0).then_some(n as u64)
    };
    // Unknown: as many as today's largest GPUs hold (fail towards charging).
    let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(192);
    let threads = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR).unwrap_or(2048);
    per_thread.saturating_mul(sms * threads)
}

/// The local memory per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`) of `f`, a `CUfunction` or a `CUkernel`
/// (asked for device `ordinal`). `Some(0)` for a handle the driver knows as neither (its launch fails there
/// too); `None` when the driver will not say (fail closed: the caller refuses under a cap).
pub(crate) fn local_size(cuda: &CudaTable, f: CUfunction, ordinal: CUdevice) -> Option<u64> {
    let mut local: c_int = 0;
    // SAFETY: valid out-pointer; `f` is the program's handle, which the driver checks.
    let r = unsafe { cuda.cuFuncGetAttribute(&mut local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) };
    if r.ok() {
        return Some(local.max(0) as u64);
    }
    // SAFETY: as above.
    let k = unsafe { cuda.cuKernelGetAttribute(&mut local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f, ordinal) };
    if k.ok() {
        return Some(local.max(0) as u64);
    }
    let bad_handle =
        |r: CUresult| matches!(r, CUresult::ERROR_INVALID_HANDLE | CUresult::ERROR_INVALID_VALUE);
    (bad_handle(r) && bad_handle(k)).then_some(0)
}

/// The current context's stack size per thread; 0 when the driver will not say (the whole need is admitted).
pub(crate) fn size(cuda: &CudaTable) -> u64 {
    let mut stack: usize = 0;
    // SAFETY: valid out-pointer.
    if unsafe { cuda.cuCtxGetLimit(&mut stack, CU_LIMIT_STACK_SIZE) }.ok() {
        stack as u64
    } else {
        0
    }
}

/// The local memory per thread of the kernel a node's parameters name (`kern` when `func` is NULL), read as a
/// direct launch of it reads it ([`local_size`]), whether or not a context is current (an update needs
/// none): a library kernel's on every device, the largest. `None`: the driver will not say.
pub(crate) fn node_local(cuda: &CudaTable, func: CUfunction, kern: CUkernel) -> Option<u64> {
    let f = if func.is_null() { kern as CUfunction } else { func };
    if f.is_null() {
        return Some(0);
    }
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    if !unsafe { cuda.cuDeviceGetCount(&mut n) }.ok() || n < 1 {
        return local_size(cuda, f, 0);
    }
    (0..n)
        .map(|d| local_size(cuda, f, d))
        .try_fold(0, |m, l| Some(m.max(l?)))
}

/// What the first launch or upload of a graph exec in the current context makes the driver grow its stack by:
/// `local`, the largest local memory its kernels need (recorded at instantiation and update: `graphs`), beyond
/// the context's stack size, for every thread the device holds ([`bytes`], as a direct launch's growth and
/// `cuCtxSetLimit` are priced). Admitted by `Memory::first_launch`, the one routine every launch path takes.
pub(super) fn graph_growth(cuda: &CudaTable, dev: Dev, local: u64) -> u64 {
    if local == 0 {
        return 0;
    }
    bytes(cuda, dev, local.saturating_sub(size(cuda)))
}

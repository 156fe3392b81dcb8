//! The real `libcuda.so.1`: its table of functions ([`CudaTable`], generated in `ffi::cuda` from the list of
//! every CUDA function cuquota calls or exports, checked against NVIDIA's headers).

pub(crate) use crate::ffi::cuda::CudaTable;

use super::Library;
use crate::ffi::cuda::CUcontext;

/// Every function of the table, resolved in `lib` (a missing one returns `CUDA_ERROR_NOT_FOUND` when called).
pub(crate) fn load(lib: &Library) -> CudaTable {
    // SAFETY: `Library::symbol` returns NULL or the address of that name in a library never closed.
    unsafe { CudaTable::load(|name| lib.symbol(name)) }
}

/// Runs `f` with context `ctx` current on this thread: pushed for it and popped after when another one is current.
/// `None` (`f` not run): the current context is unknown or `ctx` could not be made current.
pub(crate) fn in_context<R>(cuda: &CudaTable, ctx: CUcontext, f: impl FnOnce() -> R) -> Option<R> {
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if !unsafe { cuda.cuCtxGetCurrent(&mut cur) }.ok() {
        return None;
    }
    if cur == ctx {
        return Some(f());
    }
    // SAFETY: the caller's live context, popped right after `f`.
    if !unsafe { cuda.cuCtxPushCurrent_v2(ctx) }.ok() {
        return None;
    }
    /// Pops the pushed context even if `f` panics (the export's guard catches it): the program's current
    /// context is never left changed.
    struct Pop<'a>(&'a CudaTable);
    impl Drop for Pop<'_> {
        fn drop(&mut self) {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: undoes the push above.
            let _ = unsafe { self.0.cuCtxPopCurrent_v2(&mut popped) };
        }
    }
    let _pop = Pop(cuda);
    Some(f())
}

//! `cuGetProcAddress` / `cuGetProcAddress_v2`: the CUDA runtime resolves every driver function through these.
//!
//! We call the real one first, so the symbol's version selection, the flags (`_ptsz`/`_ptds` variants) and
//! `symbolStatus` are exactly the driver's. Then the returned pointer is looked up in a reverse map
//! {real address of each name we export → our export of that name}, built once from the driver table: a pointer
//! we hook becomes ours, anything else passes through unchanged. No name parsing, no version tables to drift.

use crate::ffi::cuda::CUresult;
use crate::state::Shim;
use std::ffi::c_void;

/// Replaces `*pfn` with our hook when the driver returned a function we hook.
///
/// # Safety
/// `pfn` is NULL or valid for reads and writes.
unsafe fn redirect(s: &Shim, pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: non-NULL, valid per the caller's contract.
    let p = unsafe { *pfn };
    if let Some(ours) = s.proc_map.lookup(p as usize) {
        // SAFETY: as above.
        unsafe { *pfn = ours as *mut c_void };
    }
}

/// `cuGetProcAddress` (CUDA 11.3–11.8) and `cuGetProcAddress_v2` (12.0+, with `symbolStatus`).
///
/// # Safety
/// `pfn` as the driver's contract says (written on success).
pub(crate) unsafe fn get_proc_address(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    pfn: *mut *mut c_void,
) -> CUresult {
    let r = call();
    if r.ok() {
        // SAFETY: the driver wrote *pfn.
        unsafe { redirect(s, pfn) };
    }
    r
}

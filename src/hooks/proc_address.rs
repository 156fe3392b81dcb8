//! `cuGetProcAddress` / `cuGetProcAddress_v2`: the CUDA runtime resolves every driver function through these.
//!
//! We call the real one first, so the symbol's version selection, the flags (`_ptsz`/`_ptds` variants) and
//! `symbolStatus` are exactly the driver's. Then the returned pointer is looked up in a reverse map
//! {real address of each name we export → our export of that name}, built once from the driver table: a pointer
//! we hook becomes ours, anything else passes through unchanged. No name parsing, no version tables to drift.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use crate::state::Shim;
use std::ffi::{c_char, c_int, c_void};

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

/// Hook of `cuGetProcAddress` (CUDA 11.3–11.8 signature).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGetProcAddress(
    s: &Shim,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe { s.cuda.cuGetProcAddress(symbol, pfn, cudaVersion, flags) };
    if r.ok() {
        // SAFETY: the driver wrote *pfn.
        unsafe { redirect(s, pfn) };
    }
    r
}

/// Hook of `cuGetProcAddress_v2` (CUDA 12.0+, with `symbolStatus`).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuGetProcAddress_v2(
    s: &Shim,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
    symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let r = unsafe {
        s.cuda
            .cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus)
    };
    if r.ok() {
        // SAFETY: the driver wrote *pfn.
        unsafe { redirect(s, pfn) };
    }
    r
}

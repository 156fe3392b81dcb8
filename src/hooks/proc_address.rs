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

/// Sorted `(real address, our address)` pairs.
pub struct ProcMap {
    pairs: Vec<(usize, usize)>,
}

impl ProcMap {
    /// Builds the map from `(name, real address)` pairs, keeping only names we export. `ours` gives our export's
    /// address for a name. When two names share a real address, the first one wins.
    pub fn build<'a>(
        resolved: impl IntoIterator<Item = (&'a str, usize)>,
        ours: impl Fn(&[u8]) -> Option<usize>,
    ) -> Self {
        let mut pairs: Vec<(usize, usize)> = resolved
            .into_iter()
            .filter_map(|(name, real)| ours(name.as_bytes()).map(|o| (real, o)))
            .collect();
        pairs.sort_by_key(|p| p.0);
        pairs.dedup_by_key(|p| p.0);
        ProcMap { pairs }
    }

    /// Our replacement for a real function pointer, if we hook it.
    pub fn lookup(&self, real: usize) -> Option<usize> {
        self.pairs
            .binary_search_by_key(&real, |p| p.0)
            .ok()
            .map(|i| self.pairs[i].1)
    }

    /// Number of mapped functions.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when nothing is mapped (the driver table was empty).
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_map_maps_only_exported_names() {
        let ours = |n: &[u8]| match n {
            b"cuMemAlloc_v2" => Some(0x1000),
            b"cuMemFree_v2" => Some(0x2000),
            _ => None,
        };
        let m = ProcMap::build(
            [
                ("cuMemAlloc_v2", 0xa0),
                ("cuCtxGetDevice", 0xb0),
                ("cuMemFree_v2", 0x90),
            ],
            ours,
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.lookup(0xa0), Some(0x1000));
        assert_eq!(m.lookup(0x90), Some(0x2000));
        assert_eq!(m.lookup(0xb0), None);
        assert_eq!(m.lookup(0), None);
    }
}

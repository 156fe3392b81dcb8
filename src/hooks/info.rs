//! What a program is told about memory: `cuMemGetInfo` and `cuDeviceTotalMem` see the cap as the GPU's size.
//!
//! `cuMemGetInfo`: total = cap, free = cap − container usage, each never more than the real value. A NULL
//! out-pointer is tolerated (HAMi-core segfaults): whichever is non-NULL is filled; both NULL → the real
//! driver's answer for that. No limit on the device → pass-through. Dead processes' slots are reclaimed here at
//! most every 100 ms, so a crashed neighbour's memory shows up as free again.

#![allow(non_snake_case)]

use crate::ffi::cuda::*;
use crate::state::Shim;
use std::ffi::c_uint;

/// A value to write back in the caller's width (saturating for the legacy 32-bit ABI).
trait Width: Copy + Default {
    fn from_u64(v: u64) -> Self;
    fn to_u64(self) -> u64;
}
impl Width for usize {
    fn from_u64(v: u64) -> Self {
        usize::try_from(v).unwrap_or(usize::MAX)
    }
    fn to_u64(self) -> u64 {
        self as u64
    }
}
impl Width for c_uint {
    fn from_u64(v: u64) -> Self {
        c_uint::try_from(v).unwrap_or(c_uint::MAX)
    }
    fn to_u64(self) -> u64 {
        self as u64
    }
}

/// The (free, total) a capped device reports, given the real values.
pub fn capped_info(cap: u64, used: u64, real_free: u64, real_total: u64) -> (u64, u64) {
    (cap.saturating_sub(used).min(real_free), cap.min(real_total))
}

fn mem_get_info<T: Width>(
    s: &Shim,
    free: *mut T,
    total: *mut T,
    call: impl Fn(*mut T, *mut T) -> CUresult,
) -> CUresult {
    if free.is_null() && total.is_null() {
        return call(free, total);
    }
    let Some(dev) = s.devices.current(&s.cuda) else {
        return call(free, total);
    };
    let Some(cap) = s.mem.limit(dev) else {
        return call(free, total);
    };
    let (mut rf, mut rt) = (T::default(), T::default());
    let r = call(&mut rf, &mut rt);
    if !r.ok() {
        return r;
    }
    s.mem.maybe_reclaim();
    s.mem.refresh_pools_of(&s.cuda, dev.id);
    let (f, t) = capped_info(cap, s.mem.container_used(dev), rf.to_u64(), rt.to_u64());
    // SAFETY: each non-NULL pointer is the caller's out-parameter.
    unsafe {
        if !free.is_null() {
            *free = T::from_u64(f);
        }
        if !total.is_null() {
            *total = T::from_u64(t);
        }
    }
    r
}

/// Hook of `cuMemGetInfo_v2`.
///
/// # Safety
/// Driver contract (NULL out-pointers tolerated).
pub unsafe fn cuMemGetInfo_v2(s: &Shim, free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: forwarded with the caller's or our own valid pointers.
    mem_get_info(s, free, total, |f, t| unsafe { s.cuda.cuMemGetInfo_v2(f, t) })
}

/// Hook of legacy `cuMemGetInfo` (32-bit).
///
/// # Safety
/// Driver contract (NULL out-pointers tolerated).
pub unsafe fn cuMemGetInfo(s: &Shim, free: *mut c_uint, total: *mut c_uint) -> CUresult {
    // SAFETY: as above.
    mem_get_info(s, free, total, |f, t| unsafe { s.cuda.cuMemGetInfo(f, t) })
}

fn total_mem<T: Width>(s: &Shim, bytes: *mut T, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if !r.ok() || bytes.is_null() {
        return r;
    }
    if let Some(cap) = s.devices.device(&s.cuda, dev).and_then(|d| s.mem.limit(d)) {
        // SAFETY: written by the driver just now; ours to adjust.
        unsafe { *bytes = T::from_u64(cap.min((*bytes).to_u64())) };
    }
    r
}

/// Hook of `cuDeviceTotalMem_v2`: the cap (never more than the real size).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDeviceTotalMem_v2(s: &Shim, bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    total_mem(s, bytes, dev, || unsafe {
        s.cuda.cuDeviceTotalMem_v2(bytes, dev)
    })
}

/// Hook of legacy `cuDeviceTotalMem` (32-bit).
///
/// # Safety
/// Driver contract.
pub unsafe fn cuDeviceTotalMem(s: &Shim, bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged.
    total_mem(s, bytes, dev, || unsafe { s.cuda.cuDeviceTotalMem(bytes, dev) })
}

#[cfg(test)]
mod tests {
    use super::capped_info;

    #[test]
    fn capped_values() {
        const G: u64 = 1 << 30;
        assert_eq!(capped_info(G, 0, 16 * G, 16 * G), (G, G));
        assert_eq!(capped_info(G, G / 4, 16 * G, 16 * G), (3 * G / 4, G));
        // over-used (a limit lowered live) → 0 free, not underflow
        assert_eq!(capped_info(G, 2 * G, 16 * G, 16 * G), (0, G));
        // the real device is fuller than the cap says → real free wins
        assert_eq!(capped_info(G, 0, G / 2, 16 * G), (G / 2, G));
    }
}

//! What a program is told about memory: `cuMemGetInfo` and `cuDeviceTotalMem` see the cap as the GPU's size.
//!
//! `cuMemGetInfo`: total = cap, free = cap − container usage, each never more than the real value. A NULL
//! out-pointer is tolerated (HAMi-core segfaults): whichever is non-NULL is filled; both NULL → the real
//! driver's answer for that. No limit on the device → pass-through. Dead processes' slots are reclaimed here at
//! most every 100 ms, so a crashed neighbour's memory shows up as free again. Near the cap this process's charge
//! is first reconciled with NVML (`memory::reconcile`).

#![allow(non_snake_case)]

use super::Width;
use crate::ffi::cuda::*;
use crate::state::Shim;

/// The (free, total) a capped device reports, given the real values.
pub(crate) fn capped_info(cap: u64, used: u64, real_free: u64, real_total: u64) -> (u64, u64) {
    (cap.saturating_sub(used).min(real_free), cap.min(real_total))
}

/// `cuMemGetInfo_v2`, legacy `cuMemGetInfo` (32-bit).
///
/// # Safety
/// `free`, `total` NULL or valid (NULL is tolerated).
pub(crate) unsafe fn mem_get_info<T: Width>(
    s: &Shim,
    real: impl Fn(*mut T, *mut T) -> CUresult,
    free: *mut T,
    total: *mut T,
) -> CUresult {
    if free.is_null() && total.is_null() {
        return real(free, total);
    }
    let Some(dev) = s.devices.current(&s.cuda) else {
        return real(free, total);
    };
    let Some(cap) = s.devices.memory_cap(dev) else {
        return real(free, total);
    };
    let (mut rf, mut rt) = (T::default(), T::default());
    let r = real(&mut rf, &mut rt);
    if !r.ok() {
        return r;
    }
    s.devices.maybe_reclaim();
    let used = s.mem.allocs().info_used(&s.cuda, &s.nvml, dev, cap);
    let (f, t) = capped_info(cap, used, rf.to_u64(), rt.to_u64());
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

/// `cuDeviceTotalMem_v2`, legacy `cuDeviceTotalMem`: the cap (never more than the real size).
///
/// # Safety
/// `bytes` as the driver's contract says (written on success).
pub(crate) unsafe fn device_total_mem<T: Width>(
    s: &Shim,
    call: impl FnOnce() -> CUresult,
    bytes: *mut T,
    dev: CUdevice,
) -> CUresult {
    let r = call();
    if !r.ok() || bytes.is_null() {
        return r;
    }
    if let Some(cap) = s
        .devices
        .device(&s.cuda, dev)
        .and_then(|d| s.devices.memory_cap(d))
    {
        // SAFETY: written by the driver just now; ours to adjust.
        unsafe { *bytes = T::from_u64(cap.min((*bytes).to_u64())) };
    }
    r
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

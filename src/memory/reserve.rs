//! Memory kept free for high-priority tenants: a tenant whose limits carry `reserved_memory = R` (and that is
//! not itself high priority) may allocate on a device only while the device keeps at least R bytes free after
//! the allocation — free as the driver counts it, so every process of every container on the GPU is in it.
//!
//! Why the driver's free memory and not a sum of usage files: usage files are per container, and the
//! containers on one GPU live in different pid namespaces, so nobody could tell a dead process's bytes from a
//! live one's across them; the driver frees a dead process's memory itself. What the driver cannot see yet is
//! an allocation another tenant checked a moment ago and is about to make: every checker announces its bytes
//! in the priority file's in-flight slots first and counts the others' announcements, so of two racing
//! allocations each counts the other (an allocation already made and still announced is counted twice for a
//! moment: a conservative error). A process that dies between check and allocation leaves an announcement
//! that expires after `INFLIGHT_TTL_S`.

use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::CUdevice;
use crate::ffi::nvml::nvmlMemory_t;
use crate::log::{log, Level};
use crate::time::monotonic_ns;
use cuquota_core::region::{Inflight, PriorityEntry};

/// How long an allocation waits for a free in-flight slot (all taken by concurrent checks) before it is
/// refused.
const SLOT_WAIT_MS: u32 = 50;

/// An admitted allocation's announcement, withdrawn on drop (after the driver answered).
#[must_use = "hold it until the driver call returned"]
pub(crate) struct Announced<'a> {
    entry: PriorityEntry<'a>,
    inflight: Inflight,
}

impl Drop for Announced<'_> {
    fn drop(&mut self) {
        self.entry.release_inflight(self.inflight);
    }
}

/// Why an allocation is refused to keep the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The device would keep less than the reservation free.
    Reserved,
    /// The device's free memory cannot be read, or every in-flight slot stayed taken: refused (fail closed).
    Unknown,
}

/// Checks that `bytes` more on `dev` leave `reserved` free, given the device's free memory `free()` and the
/// other announcements in `e`; the announcement is held by the result.
pub(crate) fn check<'a>(
    e: PriorityEntry<'a>,
    bytes: u64,
    reserved: u64,
    free: impl FnOnce() -> Option<u64>,
) -> Result<Announced<'a>, Refused> {
    let mut claimed = None;
    for _ in 0..SLOT_WAIT_MS {
        claimed = e.claim_inflight(bytes, now_s());
        if claimed.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let announced = Announced {
        entry: e,
        inflight: claimed.ok_or(Refused::Unknown)?,
    };
    // Others' announcements first, then the driver: an allocation that completed and withdrew its
    // announcement in between is then in `free`.
    let others = e.inflight_bytes(Some(announced.inflight), now_s());
    let free = free().ok_or(Refused::Unknown)?;
    if free.saturating_sub(others).saturating_sub(bytes) < reserved {
        e.count_reserve_refusal();
        return Err(Refused::Reserved);
    }
    Ok(announced)
}

fn now_s() -> u32 {
    (monotonic_ns() / 1_000_000_000) as u32
}

/// Free bytes on `dev` as the driver counts them (every process): NVML by UUID, else `cuMemGetInfo_v2` when
/// `dev` is the current context's device.
pub(crate) fn device_free(cuda: &CudaTable, nvml: &Nvml, dev: Dev, uuid: Option<[u8; 16]>) -> Option<u64> {
    if let (Some(t), Some(h)) = (nvml.ready(), uuid.and_then(|u| nvml.handle_by_uuid(&u))) {
        let mut m = nvmlMemory_t::default();
        // SAFETY: NVML's handle for the device, a valid out-pointer.
        if unsafe { t.nvmlDeviceGetMemoryInfo(h, &mut m) }.ok() {
            return Some(m.free);
        }
    }
    let mut cur: CUdevice = -1;
    // SAFETY: valid out-pointer.
    if !unsafe { cuda.cuCtxGetDevice(&mut cur) }.ok() || cur != dev.ordinal {
        log!(
            Level::Warn,
            "device {}: free memory unknown (no NVML, not the current device): reserved memory refuses",
            dev.ordinal
        );
        return None;
    }
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers; the real driver function.
    unsafe { cuda.cuMemGetInfo_v2(&mut f, &mut t) }
        .ok()
        .then_some(f as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuquota_core::region::layout::PriorityDevice;

    const M: u64 = 1 << 20;

    fn entry() -> PriorityEntry<'static> {
        let layout = std::alloc::Layout::new::<PriorityDevice>();
        // SAFETY: all-zero is a valid PriorityDevice (atomics only); leaked for the test's lifetime.
        PriorityEntry::new(unsafe { &*(std::alloc::alloc_zeroed(layout) as *const PriorityDevice) })
    }

    #[test]
    fn keeps_the_reservation_free() {
        let e = entry();
        // 1000 MiB free, 400 kept: 600 may go, 601 may not.
        assert!(check(e, 600 * M, 400 * M, || Some(1000 * M)).is_ok());
        assert_eq!(
            check(e, 601 * M, 400 * M, || Some(1000 * M)).err(),
            Some(Refused::Reserved)
        );
        // Unknown free memory refuses.
        assert_eq!(check(e, M, 400 * M, || None).err(), Some(Refused::Unknown));
    }

    #[test]
    fn racing_allocations_count_each_other() {
        let e = entry();
        // Two allocations of 400 MiB checked against the same 1000 MiB free, 400 kept: only one may pass.
        let a = check(e, 400 * M, 400 * M, || Some(1000 * M)).expect("the first fits");
        assert_eq!(
            check(e, 400 * M, 400 * M, || Some(1000 * M)).err(),
            Some(Refused::Reserved),
            "the second one did not see the first's announcement"
        );
        drop(a);
        // Once the first one's allocation is made (the driver's free memory shows it), the announcement is gone.
        assert!(check(e, 200 * M, 400 * M, || Some(600 * M)).is_ok());
    }

    #[test]
    fn announcements_are_withdrawn_on_drop() {
        let e = entry();
        for _ in 0..100 {
            let _a = check(e, 10 * M, 0, || Some(1000 * M)).expect("slot");
        }
        assert_eq!(e.inflight_bytes(None, now_s()), 0);
    }
}

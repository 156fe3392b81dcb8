//! The clocks the policy code reads (vDSO calls on Linux: no syscall).

/// CLOCK_MONOTONIC in ns: system-wide, so every process of a container computes the same bucket level.
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_BOOTTIME in ns (the usage file's `last_use_ns`).
pub(crate) fn boottime_ns() -> u64 {
    read(libc::CLOCK_BOOTTIME)
}

/// CLOCK_REALTIME in µs (NVML's sample timestamps).
pub(crate) fn realtime_us() -> u64 {
    read(libc::CLOCK_REALTIME) / 1000
}

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

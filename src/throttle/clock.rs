//! Time for the throttle: a monotonic wall clock shared by every process on the host, and a sleep that never
//! spins.
//!
//! Why a trait: the bucket, the estimator and the burst controller are tested with a fake clock that the test
//! advances by hand, so the arithmetic is checked without sleeping and without a driver.

/// A monotonic clock in nanoseconds and a way to wait for it.
pub(crate) trait Clock {
    /// Nanoseconds on a clock every process of the host agrees on (CLOCK_MONOTONIC in production).
    fn now_ns(&self) -> u64;
    /// Sleep until `deadline_ns` on the same clock (or return early; callers re-check).
    fn sleep_until(&self, deadline_ns: u64);
}

/// CLOCK_MONOTONIC: system-wide, so every process of a container computes the same bucket level.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Monotonic;

/// Read CLOCK_MONOTONIC (a vDSO call, ~20 ns, no syscall).
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

impl Clock for Monotonic {
    #[inline]
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn sleep_until(&self, deadline_ns: u64) {
        let ts = libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME. An interrupted
        // sleep (EINTR) simply returns early and the caller re-checks the bucket.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A hand-driven clock for tests: `sleep_until` jumps the time forward.
    use super::Clock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Test clock; starts at `start`.
    #[derive(Debug)]
    pub(crate) struct FakeClock(pub AtomicU64);

    impl FakeClock {
        pub(crate) fn new(start: u64) -> Self {
            FakeClock(AtomicU64::new(start))
        }
        pub(crate) fn advance(&self, ns: u64) {
            self.0.fetch_add(ns, Ordering::SeqCst);
        }
    }

    impl Clock for FakeClock {
        fn now_ns(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
        fn sleep_until(&self, deadline_ns: u64) {
            self.0.fetch_max(deadline_ns, Ordering::SeqCst);
        }
    }
}

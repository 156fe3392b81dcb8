//! Per-process estimates of how long a launch occupies the device, keyed by (function, grid, block).
//!
//! Why estimates: a launch must be charged when it is made (the bucket is what makes it wait), but its real
//! duration is known only when it completes, possibly much later behind a deep queue. So a launch pre-charges the
//! estimate of its key, a sample of launches is measured on the device (see `probe`), and each measurement both
//! reconciles its own launch (charged − measured goes back to the bucket) and refines the estimate.
//!
//! The table is a fixed array of atomics (no allocation, no lock on the hot path): a key hashes to a home slot
//! and up to `PROBE` neighbours; a full neighbourhood evicts the home slot. A lost update between two threads is
//! harmless (the next measurement corrects it).

use std::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 1024;
const PROBE: usize = 4;

/// Fallback estimate before anything has been measured in this process: 1 ms. Conservative for short kernels
/// (they are measured and corrected within a few launches) and small enough that a first long kernel does not
/// make the program wait long.
pub(crate) const DEFAULT_EST_NS: u64 = 1_000_000;

/// A key measured longer ago than this is due for a new measurement (see [`Estimator::due`]).
pub(crate) const STALE_NS: u64 = 32_000_000;

/// Lock-free estimate table.
#[derive(Debug)]
pub(crate) struct Estimator {
    keys: [AtomicU64; SLOTS],
    vals: [AtomicU64; SLOTS],
    /// Per slot: the time of the key's last measurement << 2 | its number of measurements (saturating at 3).
    meta: [AtomicU64; SLOTS],
    /// Process-wide moving average of measured launches (for keys never measured).
    mean: AtomicU64,
}

/// Hash the identity of a launch into a non-zero key.
#[inline]
pub(crate) fn launch_key(func: usize, grid: u64, block: u64) -> u64 {
    let mut h = (func as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= grid.wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17);
    h ^= block.wrapping_mul(0x1656_67B1_9E37_79F9).rotate_left(41);
    h ^= h >> 29;
    h | 1
}

/// A graph exec's launch key: charged as one unit, its estimate is what its launches measured (all its nodes).
pub(crate) fn graph_key(exec: usize) -> u64 {
    launch_key(exec, u64::MAX, 0x0067_7261_7068)
}

/// `key` as launched on usage device `dev`: one kernel takes different times on devices of different speed, so
/// each device has its own estimate (device 0 keeps the key as it is; the key stays non-zero).
#[inline]
pub(crate) fn on_device(key: u64, dev: usize) -> u64 {
    key ^ ((dev as u64) << 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Default for Estimator {
    fn default() -> Self {
        Self::new()
    }
}

impl Estimator {
    /// An empty table (const so it can live in a `static`).
    pub(crate) const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const Z: AtomicU64 = AtomicU64::new(0);
        Estimator {
            keys: [Z; SLOTS],
            vals: [Z; SLOTS],
            meta: [Z; SLOTS],
            mean: AtomicU64::new(0),
        }
    }

    #[inline]
    fn home(key: u64) -> usize {
        (key >> 7) as usize % SLOTS
    }

    /// The estimate for `key`, if this key was measured.
    #[cfg(test)]
    pub(crate) fn get(&self, key: u64) -> Option<u64> {
        self.lookup(key).map(|(v, _)| v)
    }

    /// The estimate for `key` and its measurement record (for [`Estimator::due`]), if this key was measured.
    #[inline]
    pub(crate) fn lookup(&self, key: u64) -> Option<(u64, u64)> {
        let h = Self::home(key);
        for i in 0..PROBE {
            let s = (h + i) % SLOTS;
            let k = self.keys[s].load(Ordering::Acquire);
            if k == key {
                return Some((
                    self.vals[s].load(Ordering::Relaxed),
                    self.meta[s].load(Ordering::Relaxed),
                ));
            }
            if k == 0 {
                return None;
            }
        }
        None
    }

    /// Marks `key`'s estimate as not measured (its work changed: an updated graph): kept until the next
    /// measurement, which then replaces it whatever it is.
    pub(crate) fn unmeasure(&self, key: u64) {
        let h = Self::home(key);
        for i in 0..PROBE {
            let s = (h + i) % SLOTS;
            let k = self.keys[s].load(Ordering::Acquire);
            if k == key {
                self.meta[s].fetch_and(!3, Ordering::Relaxed);
                return;
            }
            if k == 0 {
                return;
            }
        }
    }

    /// Is a key with measurement record `meta` due for a new measurement at `now`? When measured only once (a
    /// first launch is often measured long: lazy loading puts the module's load between the probe's events) or
    /// not for [`STALE_NS`]. The periodic probe prefers due keys: in a loop of several kernels the launch that
    /// follows each throttle sleep is always the same one, and without this only that kernel would ever be
    /// measured again (measured on an H200: cuDNN's conv2d kept its first, lazily loaded, 1.2 ms measurement
    /// of a 156 µs kernel and ran at 8 % of its unlimited rate under a 30 % limit).
    #[inline]
    pub(crate) fn due(meta: u64, now: u64) -> bool {
        meta & 3 < 2 || now.saturating_sub(meta >> 2) >= STALE_NS
    }

    /// Estimate for a key never measured: the process's average, or `DEFAULT_EST_NS`.
    #[inline]
    pub(crate) fn fallback(&self) -> u64 {
        match self.mean.load(Ordering::Relaxed) {
            0 => DEFAULT_EST_NS,
            m => m,
        }
    }

    /// Degraded mode (no per-launch measurement): `avg`, the average device time of the launches of the last
    /// calibration window, becomes the estimate of launches never measured — at once when it is below half the
    /// current one (the 1 ms default against short kernels), else by 1/4 of the difference.
    pub(crate) fn calibrate(&self, avg: u64) {
        let avg = avg.clamp(1, super::bucket::MAX_MEASURE_NS);
        let m = self.fallback();
        let nm = if avg < m / 2 {
            avg
        } else {
            (m as i128 + (avg as i128 - m as i128) / 4) as u64
        };
        self.mean.store(nm.max(1), Ordering::Relaxed);
    }

    /// Record a measurement. The first sample of a key is taken as is. Later ones fail towards charging: a
    /// sample more than twice the estimate replaces it at once and a longer one moves it half of the way up,
    /// while a shorter one moves it only a quarter of the way down — launches that are not probes are charged
    /// the estimate, so one that lags behind longer launches lets them run beyond the limit, one that lags
    /// behind shorter ones only makes them wait. The one exception: a sample below half the estimate replaces
    /// it, because the first launch of a kernel is often measured long — with lazy loading the driver loads
    /// its module between the probe's start event and the kernel (tens of ms for a large fat binary) — and
    /// over-charging every launch while 1/4 steps converge cost PyTorch a third of its share at a 30 % limit.
    /// (A long sample is replaced at least as fast as a short one.)
    pub(crate) fn record(&self, key: u64, measured: u64, now: u64) {
        // Clamped: a nonsense measurement (a broken event pair) must neither overflow the averages below nor
        // charge later launches more than the longest single charge.
        let measured = measured.clamp(1, super::bucket::MAX_MEASURE_NS);
        let m = self.mean.load(Ordering::Relaxed);
        let nm = if m == 0 { measured } else { (m * 7 + measured) / 8 };
        self.mean.store(nm.max(1), Ordering::Relaxed);

        let h = Self::home(key);
        for i in 0..PROBE {
            let s = (h + i) % SLOTS;
            let k = self.keys[s].load(Ordering::Acquire);
            if k == key {
                let old = self.vals[s].load(Ordering::Relaxed);
                let fresh = self.meta[s].load(Ordering::Relaxed) & 3 == 0;
                let new = if fresh || measured < old / 2 || measured > old.saturating_mul(2) {
                    measured
                } else if measured >= old {
                    old + (measured - old) / 2
                } else {
                    old - (old - measured) / 4
                };
                self.vals[s].store(new.max(1), Ordering::Relaxed);
                let n = (self.meta[s].load(Ordering::Relaxed) & 3)
                    .saturating_add(1)
                    .min(3);
                self.meta[s].store(now << 2 | n, Ordering::Relaxed);
                return;
            }
            if k == 0 {
                self.vals[s].store(measured, Ordering::Relaxed);
                self.meta[s].store(now << 2 | 1, Ordering::Relaxed);
                if self.keys[s]
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return;
                }
            }
        }
        // Neighbourhood full: evict the home slot.
        self.keys[h].store(0, Ordering::Release);
        self.vals[h].store(measured, Ordering::Relaxed);
        self.meta[h].store(now << 2 | 1, Ordering::Relaxed);
        self.keys[h].store(key, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_then_measured_then_smoothed() {
        let e = Estimator::new();
        let k = launch_key(0x1000, 64, 256);
        assert_eq!(e.get(k), None);
        assert_eq!(e.fallback(), DEFAULT_EST_NS);
        e.record(k, 40_000, 0);
        assert_eq!(e.get(k), Some(40_000));
        e.record(k, 80_000, 0);
        assert_eq!(e.get(k), Some(60_000), "up: half of the way");
        assert_eq!(e.fallback(), 45_000);
        e.record(k, 40_000, 0);
        assert_eq!(e.get(k), Some(55_000), "down: a quarter of the way");
        e.record(k, 200_000, 0);
        assert_eq!(e.get(k), Some(200_000), "over twice: at once");
    }

    #[test]
    fn an_unmeasured_key_takes_its_next_measurement_as_is() {
        let e = Estimator::new();
        let k = launch_key(0x2000, 1, 1);
        e.record(k, 10_000, 0);
        e.record(k, 10_000, 0);
        e.unmeasure(k);
        assert_eq!(e.lookup(k).map(|(v, m)| (v, m & 3)), Some((10_000, 0)));
        e.record(k, 15_000, 0);
        assert_eq!(e.get(k), Some(15_000), "not half of the way: replaced");
    }

    #[test]
    fn each_device_has_its_own_estimate() {
        let e = Estimator::new();
        let k = launch_key(0x1000, 132, 1);
        assert_eq!(on_device(k, 0), k);
        e.record(on_device(k, 0), 100_000, 0);
        e.record(on_device(k, 1), 13_200_000, 0);
        e.record(on_device(k, 0), 100_000, 0);
        assert_eq!(e.get(on_device(k, 1)), Some(13_200_000));
        for d in 0..64 {
            assert_eq!(on_device(k, d) & 1, 1);
        }
    }

    #[test]
    fn an_inflated_first_sample_is_dropped_at_the_next_short_one() {
        let e = Estimator::new();
        let k = launch_key(0x1000, 1024, 128);
        e.record(k, 67_000_000, 0); // first launch: lazy module load between the events
        e.record(k, 160_000, 0);
        assert_eq!(e.get(k), Some(160_000));
        e.record(k, 200_000, 0); // jitter within 2x is smoothed
        assert_eq!(e.get(k), Some(180_000));
    }

    #[test]
    fn a_nonsense_measurement_is_clamped_and_does_not_overflow() {
        let e = Estimator::new();
        let k = launch_key(0x1000, 64, 256);
        e.record(k, u64::MAX, 0);
        e.record(k, u64::MAX, 0);
        e.record(launch_key(0x2000, 1, 1), u64::MAX, 0);
        assert_eq!(e.get(k), Some(super::super::bucket::MAX_MEASURE_NS));
        assert!(e.fallback() <= super::super::bucket::MAX_MEASURE_NS);
    }

    #[test]
    fn keys_differ_by_grid_and_function_and_survive_collisions() {
        let e = Estimator::new();
        for i in 0..5000u64 {
            e.record(launch_key(0x1000 + i as usize * 64, i, 128), 1000 + i, 0);
        }
        // The most recent ones are still there.
        for i in 4990..5000u64 {
            assert_eq!(
                e.get(launch_key(0x1000 + i as usize * 64, i, 128)),
                Some(1000 + i)
            );
        }
        assert_ne!(launch_key(1, 2, 3), launch_key(1, 3, 3));
        assert_ne!(launch_key(1, 2, 3), launch_key(2, 2, 3));
    }
}

//! The burst (work-conserving) controller: decides, every `SAMPLE_NS`, the effective rate of a container whose
//! policy is `burst`. Pure arithmetic on samples, so it is tested without a device.
//!
//! Inputs per interval: the container's own GPU time (what its processes charged, from the region) and the
//! other containers' use of the device over the same interval (NVML per-process utilisation of the processes
//! that are not in this container's usage region; on the simulator it follows the timeline). Rules, in order:
//! - nobody else uses the device (others < `OTHERS_IDLE`): run at the full device (the bucket still paces launches
//!   at 100 %, which keeps the queue ≤ ~10 ms deep, so a newcomer is served within one sample);
//! - others just appeared: fall back to the configured limit at once;
//! - others active and the device has idle time: grow into a share of it (weight / (weight + 100), so weight 100
//!   takes half of the idle time per sample, weight 1000 takes 91 %); two burst containers split spare time in
//!   rough proportion to their weights;
//! - others active and the device saturated: halve the distance to the configured limit each sample, so a
//!   container that needs its guaranteed share gets it back within a few samples.

/// Interval between samples.
pub(crate) const SAMPLE_NS: u64 = 50_000_000;
/// Others' use below this (per-mille of the device) counts as "no one else wants the device".
pub(crate) const OTHERS_IDLE: u64 = 20;
/// Idle below this (per-mille) counts as "device saturated".
pub(crate) const IDLE_MIN: u64 = 30;
/// Weight when none is configured.
pub(crate) const DEFAULT_WEIGHT: u64 = 100;

/// What the controller carries between samples (kept in the shared `throttle` words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct BurstState {
    /// Effective rate, per-mille (0 = not yet decided).
    pub eff: u64,
    /// Others used the device at the last sample.
    pub others_active: bool,
}

/// One sample: own and others' busy in per-mille of the interval, previous state → new state.
pub(crate) fn step(
    prev: BurstState,
    limit_pm: u64,
    weight: u64,
    own_pm: u64,
    others_pm: Option<u64>,
) -> BurstState {
    let full = super::bucket::FULL_RATE;
    let limit = limit_pm.clamp(1, full);
    let Some(others) = others_pm else {
        // No signal about the others: cannot tell spare time from their time; behave as hard.
        return BurstState {
            eff: limit,
            others_active: true,
        };
    };
    let own = own_pm.min(full);
    let others = others.min(full);
    let dev = (own + others).min(full);
    if others < OTHERS_IDLE {
        return BurstState {
            eff: full,
            others_active: false,
        };
    }
    if !prev.others_active || prev.eff == 0 {
        return BurstState {
            eff: limit,
            others_active: true,
        };
    }
    let idle = full - dev;
    let eff = if idle >= IDLE_MIN {
        let w = weight.clamp(1, 1000);
        let grow = idle * w / (w + DEFAULT_WEIGHT);
        (prev.eff.max(own).max(limit) + grow).min(full)
    } else {
        let e = prev.eff.max(limit);
        limit + (e - limit) / 2
    };
    BurstState {
        eff: eff.clamp(limit, full),
        others_active: true,
    }
}

/// Pack the state in one word: bits 0..16 eff, bit 16 others_active.
pub(crate) fn pack(s: BurstState) -> u64 {
    s.eff.min(0xffff) | ((s.others_active as u64) << 16)
}

/// Inverse of `pack`.
pub(crate) fn unpack(w: u64) -> BurstState {
    BurstState {
        eff: w & 0xffff,
        others_active: w & (1 << 16) != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_runs_at_full_device() {
        let s = step(BurstState::default(), 300, 100, 300, Some(5));
        assert_eq!(
            s,
            BurstState {
                eff: 1000,
                others_active: false
            }
        );
    }

    #[test]
    fn newcomer_makes_it_fall_back_at_once() {
        let s = BurstState {
            eff: 1000,
            others_active: false,
        };
        let s = step(s, 300, 100, 900, Some(100));
        assert_eq!(s.eff, 300);
    }

    #[test]
    fn grows_into_idle_time_and_backs_off_when_saturated() {
        let mut s = BurstState {
            eff: 300,
            others_active: true,
        };
        // The other container uses 400 and wants no more: we converge to fill the rest.
        for _ in 0..20 {
            let own = s.eff.min(600);
            s = step(s, 300, 100, own, Some(400));
        }
        assert!(s.eff >= 560, "{s:?}");
        // Now the other wants 700 (its own limit) and the device saturates: back to 300 within a few samples.
        for _ in 0..6 {
            s = step(s, 300, 100, s.eff.min(300), Some(700));
        }
        assert!(s.eff <= 310, "{s:?}");
    }

    #[test]
    fn a_heavier_weight_takes_spare_time_faster() {
        let grow = |w| {
            let s = BurstState {
                eff: 300,
                others_active: true,
            };
            step(s, 300, w, 300, Some(200)).eff // 50 % of the device idle
        };
        assert_eq!(grow(100), 300 + 250);
        assert!(
            grow(1000) > grow(100) && grow(100) > grow(10),
            "{} {} {}",
            grow(1000),
            grow(100),
            grow(10)
        );
    }

    #[test]
    fn no_device_signal_means_hard() {
        assert_eq!(step(BurstState::default(), 250, 100, 0, None).eff, 250);
    }

    #[test]
    fn pack_roundtrip() {
        let s = BurstState {
            eff: 733,
            others_active: true,
        };
        assert_eq!(unpack(pack(s)), s);
    }
}

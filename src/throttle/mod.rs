//! SM-time limiting: each container gets its percentage of a device's *time*, measured in GPU nanoseconds.
//!
//! Why GPU time and not thread blocks (HAMi-core's unit): a block's cost depends on the kernel and on how many
//! SMs the device has, so block tokens under-throttle big GPUs and mis-split mixed workloads. GPU time is what
//! time-slicing shares, so it is the one unit in which "30 %" means the same thing on every device.
//!
//! Pieces:
//! - [`bucket`]: the container's token bucket per device, one atomic word in the shared usage region
//!   (`throttle[8]`), earned at `limit × wall time`, burst bounded to 10 ms of wall time at the limit's rate;
//! - [`estimate`]: per-process duration estimates per (function, grid, block), refined by measurements;
//! - [`engine`]: admission of one launch (charge the estimate, sleep while the bucket is in debt), sampled
//!   measurement with CUDA events (probes) and reconciliation (measured − charged back to the bucket);
//! - [`burst`]: the work-conserving policy's controller (device utilisation minus own use → effective rate);
//! - [`clock`]: the monotonic clock and the sleeping wait, behind a trait for tests.
//!
//! The hook side (which launch paths, how a launch maps to a device, the event pool) is `src/hooks/launch.rs`.

pub mod bucket;
pub mod burst;
pub mod clock;
pub mod engine;
pub mod estimate;
pub mod probe;
pub mod shim;

/// How a limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Never above the limit.
    Hard,
    /// Work-conserving: above the limit while no one else on the device wants the time (the default).
    #[default]
    Burst,
    /// No SM limit at all (`GPU_CORE_UTILIZATION_POLICY=DISABLE`).
    Disabled,
}

/// The SM limit of one device for this container, as configured (env, config file, limits file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Percent of the device; 0 or ≥ 100 = unlimited.
    pub pct: u32,
    /// Enforcement policy.
    pub policy: Policy,
    /// Share of spare time in burst mode, 1–1000 (default 100).
    pub weight: u32,
}

impl Limit {
    /// No limit.
    pub const NONE: Limit = Limit {
        pct: 0,
        policy: Policy::Burst,
        weight: 100,
    };

    /// Does this limit throttle anything?
    #[inline]
    pub fn active(&self) -> bool {
        self.pct > 0 && self.pct < 100 && self.policy != Policy::Disabled
    }

    /// The configured rate in per-mille of the device.
    #[inline]
    pub fn rate_pm(&self) -> u64 {
        (self.pct.min(100) as u64) * 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_only_between_1_and_99() {
        for (pct, want) in [
            (0, false),
            (1, true),
            (50, true),
            (99, true),
            (100, false),
            (250, false),
        ] {
            assert_eq!(
                Limit {
                    pct,
                    policy: Policy::Hard,
                    weight: 100
                }
                .active(),
                want,
                "{pct}"
            );
        }
        assert!(!Limit {
            pct: 50,
            policy: Policy::Disabled,
            weight: 100
        }
        .active());
    }
}

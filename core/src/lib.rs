//! cuquota's shared pieces: the region files (limits written by the node agent, usage shared by a container's
//! processes) and configuration parsing. No CUDA and no exported C symbols live here.
//!
//! - [`config`]: environment variables (HAMi's names and ours) plus an optional TOML file → a validated
//!   [`config::Config`], or a typed [`config::ConfigError`] naming the offending variable and value.
//! - [`log`]: the one stderr logging path (shim and CLI): `cuquota[<pid>]: <level>: …`, allocation-free.
//! - [`units`]: HAMi's byte-size syntax (`3000m`, `0x10g`, `4GiB`).
//! - [`visible_devices`]: `CUDA_VISIBLE_DEVICES` parsing and NVML device → CUDA ordinal mapping.
//! - [`region`]: the two shared files (limits, usage). The only code that maps shared memory.
//!
//! The C mirror of the region layout is `include/cuquota.h`; `tests/header.rs` checks they agree.

pub mod config;
pub mod log;
pub mod region;
pub mod units;
pub mod visible_devices;

pub use config::{Config, ConfigError, DeviceLimits, LogLevel, Policy};
pub use region::{
    DeviceId, LimitsReader, LimitsRegion, LimitsSnapshot, LimitsWriter, OverLimit, RegionError, SlotId,
    UsageRegion,
};

/// The lower of two optional limits, `None` meaning "no limit" (∞).
///
/// This is how an environment/config limit and an agent-file limit combine: nothing a process sets for itself
/// can raise what the agent wrote.
pub fn min_limit<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::min_limit;

    #[test]
    fn min_limit_treats_none_as_infinity() {
        assert_eq!(min_limit(Some(3u64), None), Some(3));
        assert_eq!(min_limit(None, Some(4u64)), Some(4));
        assert_eq!(min_limit(Some(5u64), Some(2)), Some(2));
        assert_eq!(min_limit::<u64>(None, None), None);
    }
}

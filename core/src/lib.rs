//! cuquota's shared pieces: the region files (limits written by the node agent, usage shared by a container's
//! processes), configuration parsing, and the one type that says what a device may use.
//!
//! - [`policy`]: [`Policy`], a device's limits, and its one packing into region words.
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
pub mod policy;
pub mod region;
pub mod units;
pub mod visible_devices;

pub use config::{Config, ConfigError, LogLevel};
pub use policy::{min_limit, Policy, PolicyKind, PolicyRaw, Priority, RequestError};
pub use region::{
    DeviceId, LimitsReader, LimitsRegion, LimitsSnapshot, LimitsWriter, OverLimit, RegionError, SlotId,
    UsageRegion,
};

//! Configuration: environment variables (HAMi-core's names and ours) plus an optional TOML file, validated
//! into a [`Config`].
//!
//! Why this is strict: a limit that fails to parse must not silently become "no limit". Every bad value,
//! every HAMi/cuquota pair that disagrees and every unknown `CUQUOTA_*` name (a typo such as
//! `CUQUOTA_MEMORY_LIMT`) is a [`ConfigError`] that names the variable and its value; the shim then fails
//! closed. See `docs/configuration.md` for the user-facing reference.
//!
//! Precedence for a device's limit, most specific source first: env `_<i>` → env global → file `[[device]]` →
//! file global. The agent's limits file (see [`crate::region`]) is applied on top by the shim as a minimum.

mod env;
mod error;
mod file;
mod layer;
mod values;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use env::{KNOWN_VARIABLES, PROBED_ORDINALS, RESERVED_PREFIX};
pub use error::ConfigError;

use crate::policy::Policy;
use crate::visible_devices::VisibleDevices;

/// Default path of the shared usage region.
pub const DEFAULT_USAGE_PATH: &str = "/tmp/cuquota.usage";
/// HAMi-core's shared-region path when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset
/// (`MULTIPROCESS_SHARED_REGION_CACHE_DEFAULT`); cuquota writes HAMi's layout there (docs/hami.md).
pub const HAMI_DEFAULT_PATH: &str = "/tmp/cudevshr.cache";
/// Default path of the agent-written limits region (used only if it exists).
pub const DEFAULT_LIMITS_PATH: &str = "/etc/cuquota/limits";

/// Its existence declares an agent limits file required (a deployment mounts it read-only next to the limits
/// file, so a tenant cannot remove it): with no limits file to read, the shim refuses every CUDA call.
pub const LIMITS_REQUIRED_MARKER: &str = "/etc/cuquota/required";
/// Default path of the container's own priority file, the node directory at the same path + `.d` (used when it
/// exists; see [`Config::priority_path`]).
pub const DEFAULT_PRIORITY_PATH: &str = "/etc/cuquota/priority";
/// Highest CUDA ordinal accepted in a `_<i>` variable or `[[device]] index` (exclusive).
pub const MAX_ORDINAL: u32 = 1024;
/// The driver's time slice the SM throttle sizes its releases to when none is set, µs (the calibrated
/// simulator's quantum, shim-tests/sim/README.md; docs/sm-limit.md, *Tenants that really share*).
pub const DEFAULT_TIME_SLICE_US: u32 = 2000;
/// Default of [`Config::elastic_min_bytes`]: 2 MiB.
pub const DEFAULT_ELASTIC_MIN_BYTES: u64 = 2 << 20;
/// Largest time slice accepted, µs: the SM throttle's bucket holds 8 ms of GPU time.
pub const MAX_TIME_SLICE_US: u32 = 8000;
/// How long an allocation the full device refuses waits for the agent's reclaim by default, ms (issue 39).
pub const DEFAULT_RECLAIM_WAIT_MS: u32 = 3000;
/// Longest reclaim wait accepted, ms.
pub const MAX_RECLAIM_WAIT_MS: u32 = 60_000;
/// Weight range for burst mode.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

/// Verbosity of the shim's stderr log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Errors only (`LIBCUDA_LOG_LEVEL=0`).
    Error,
    /// Errors and warnings (`1`, the default).
    Warn,
    /// Plus informational messages (`2`).
    Info,
    /// Plus debugging detail (`3`).
    Debug,
    /// Everything (`4` and above).
    Trace,
}

impl LogLevel {
    /// Lower-case name as accepted by `CUQUOTA_LOG`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// Validated configuration of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The process's own limits per CUDA ordinal, fully resolved (a `None` limit here means "no limit for this
    /// ordinal", not "use the default"). Ordinals not present use [`Config::default_limits`]. The policy kind,
    /// weight and priority are the same for every ordinal; `GPU_CORE_UTILIZATION_POLICY=DISABLE` is
    /// [`PolicyKind::Disabled`](crate::PolicyKind::Disabled), which drops these SM shares.
    pub devices: BTreeMap<u32, Policy>,
    /// Limits of ordinals not in [`Config::devices`].
    pub default_limits: Policy,
    /// Shared usage region (`CUQUOTA_USAGE_FILE`, else [`usage_path_beside`] the HAMi file when
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is set, else the TOML `usage_file`, else [`DEFAULT_USAGE_PATH`]).
    pub usage_path: PathBuf,
    /// HAMi's shared region, written for HAMi's vGPU monitor (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, else
    /// [`HAMI_DEFAULT_PATH`]). Output only: never read for enforcement.
    pub hami_path: PathBuf,
    /// Agent-written limits regions to apply, all of them (the effective limit is the minimum over env and
    /// every file): [`DEFAULT_LIMITS_PATH`] when it exists, plus `CUQUOTA_LIMITS_FILE` (or the TOML
    /// `limits_file`) when set. The default file is never replaced by the variable, so a process cannot escape
    /// the agent's limits by pointing the variable elsewhere. Every listed file must open and validate, else
    /// the shim fails closed. Empty = no agent limits.
    pub limits_paths: Vec<PathBuf>,
    /// An agent limits file is required (`CUQUOTA_LIMITS_REQUIRED=1`, or [`LIMITS_REQUIRED_MARKER`] exists): with
    /// [`Config::limits_paths`] empty the shim fails closed, opt-out or not.
    pub limits_required: bool,
    /// The container's own priority file (the node's directory of every container's is beside it, + `.d`):
    /// [`DEFAULT_PRIORITY_PATH`] when it exists (a process cannot redirect it), else `CUQUOTA_PRIORITY_FILE` (or the TOML
    /// `priority_file`). `None` = no priority coordination (a priority set then is not enforced; the shim warns).
    pub priority_path: Option<PathBuf>,
    /// Log verbosity.
    pub log_level: LogLevel,
    /// The driver's time slice (µs) the SM throttle sizes the work it releases after a wait to
    /// (`CUQUOTA_TIME_SLICE_US`, TOML `time_slice_us`; 0 = release each launch as soon as the debt is repaid).
    pub time_slice_us: u32,
    /// Elastic tenants' linear allocations of at least this many bytes are movable (issue 39;
    /// `CUQUOTA_ELASTIC_MIN_BYTES`, default [`DEFAULT_ELASTIC_MIN_BYTES`]).
    pub elastic_min_bytes: u64,
    /// How long an allocation within the limit that the driver refuses (the device is full) waits, ms, while
    /// the agent reclaims idle elastic tenants' memory, before the refusal is returned (`CUQUOTA_RECLAIM_WAIT_MS`;
    /// 0 = no wait; only under an agent limits file).
    pub reclaim_wait_ms: u32,
    /// Opt-out requested (`CUDA_DISABLE_CONTROL=true` / `CUQUOTA_DISABLE=1`): pure pass-through, unless the
    /// agent's limits file forbids opting out.
    pub disabled: bool,
    /// Path of the real `libcuda.so.1` (`CUQUOTA_LIBCUDA`).
    pub libcuda_path: Option<PathBuf>,
    /// Path of the real `libnvidia-ml.so.1` (`CUQUOTA_LIBNVML`).
    pub libnvml_path: Option<PathBuf>,
    /// Parsed `CUDA_VISIBLE_DEVICES` (`None` when unset).
    pub visible_devices: Option<VisibleDevices>,
    /// The TOML file that was read, if any (`CUQUOTA_CONFIG`).
    pub config_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: BTreeMap::new(),
            default_limits: Policy::NONE,
            usage_path: PathBuf::from(DEFAULT_USAGE_PATH),
            hami_path: PathBuf::from(HAMI_DEFAULT_PATH),
            limits_paths: Vec::new(),
            limits_required: false,
            priority_path: None,
            log_level: LogLevel::Warn,
            time_slice_us: DEFAULT_TIME_SLICE_US,
            elastic_min_bytes: DEFAULT_ELASTIC_MIN_BYTES,
            reclaim_wait_ms: DEFAULT_RECLAIM_WAIT_MS,
            disabled: false,
            libcuda_path: None,
            libnvml_path: None,
            visible_devices: None,
            config_file: None,
        }
    }
}

/// The log level `CUQUOTA_LOG` (else HAMi's `LIBCUDA_LOG_LEVEL`) names, as `lookup` sees the environment;
/// `None` when neither is set. The same rule the full [`Config`] applies, for programs that need only this.
pub fn log_level_from(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<LogLevel>, ConfigError> {
    env::log_level(lookup)
}

impl Config {
    /// Reads the process environment (and the TOML file it names). Non-UTF-8 values of variables we read are
    /// errors.
    pub fn from_env() -> Result<Config, ConfigError> {
        env::from_vars_os(std::env::vars_os(), &|p| p.exists())
    }

    /// [`Config::from_env`] over a copy of the environment taken earlier (the shim takes one when it is
    /// loaded, so a program's later `setenv` cannot change its limits).
    pub fn from_vars_os(
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Config, ConfigError> {
        env::from_vars_os(vars.into_iter(), &|p| p.exists())
    }

    /// Builds a configuration from an explicit list of variables — the full check, including unknown
    /// `CUQUOTA_*` names. `path_exists` answers whether the default limits file exists (injectable for tests).
    pub fn from_vars<I, K, V>(
        vars: I,
        path_exists: &dyn Fn(&std::path::Path) -> bool,
    ) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        env::from_vars(vars.into_iter().map(|(k, v)| (k.into(), v.into())), path_exists)
    }

    /// Builds a configuration from a lookup function (`|name| std::env::var(name).ok()`-like). It probes the
    /// known names and the `_<i>` forms for ordinals below [`PROBED_ORDINALS`]; unlike
    /// [`Config::from_vars`] it cannot detect misspelt `CUQUOTA_*` names, since it cannot enumerate.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        env::from_lookup(&lookup, &|p| p.exists())
    }

    /// The process's own limits for CUDA ordinal `ordinal` (env/config; the agent's files tighten them).
    pub fn policy(&self, ordinal: u32) -> Policy {
        *self.devices.get(&ordinal).unwrap_or(&self.default_limits)
    }

    /// Memory cap of CUDA ordinal `ordinal` from env/config, `None` = no limit.
    pub fn memory_limit(&self, ordinal: u32) -> Option<u64> {
        self.policy(ordinal).memory
    }

    /// SM share (percent, 1–99) of CUDA ordinal `ordinal` from env/config; `None` when unlimited or when SM
    /// limiting is disabled.
    pub fn sm_limit(&self, ordinal: u32) -> Option<u32> {
        self.policy(ordinal).sm_share()
    }

    fn policies(&self) -> impl Iterator<Item = &Policy> {
        std::iter::once(&self.default_limits).chain(self.devices.values())
    }

    /// Whether any memory or SM limit is configured for any ordinal (the agent file may add more).
    pub fn has_limits(&self) -> bool {
        self.policies().any(|p| p.memory.is_some() || p.throttles())
    }

    /// Whether an SM limit is configured for any ordinal.
    pub fn has_sm_limits(&self) -> bool {
        self.policies().any(Policy::throttles)
    }

    /// Whether a memory cap is configured for some device.
    pub fn has_memory_limits(&self) -> bool {
        self.policies().any(|p| p.memory.is_some())
    }

    /// Whether a priority is configured (`CUDA_TASK_PRIORITY`, `CUQUOTA_PRIORITY`, the TOML `priority`).
    pub fn has_priorities(&self) -> bool {
        self.policies().any(|p| p.priority.is_some())
    }
}

#[cfg(test)]
mod tests;

/// The usage file cuquota keeps beside HAMi's file at `hami` (the monitor picks up only `*.cache` names and
/// `libvgpu.so`): `X.cache` → `X.cuquota-usage`, any other name gets `.cuquota-usage` appended.
pub fn usage_path_beside(hami: &std::path::Path) -> PathBuf {
    let mut s = hami.as_os_str().to_owned();
    let b = std::os::unix::ffi::OsStrExt::as_bytes(s.as_os_str());
    if b.ends_with(b".cache") && b.len() > ".cache".len() {
        let stem = b[..b.len() - ".cache".len()].to_vec();
        s = std::os::unix::ffi::OsStringExt::from_vec(stem);
    }
    s.push(".cuquota-usage");
    s.into()
}

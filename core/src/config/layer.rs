//! One source of settings (the environment, or the TOML file) before merging, and the merge into [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{
    Config, LogLevel, DEFAULT_LIMITS_PATH, DEFAULT_PRIORITY_PATH, DEFAULT_USAGE_PATH, LIMITS_REQUIRED_MARKER,
};
use crate::policy::{Policy, PolicyKind, Priority};
use crate::visible_devices::VisibleDevices;

/// Settings from one source. Limits of `0` were already dropped (0 = "not set here", HAMi's fallback rule).
#[derive(Debug, Default, Clone)]
pub(crate) struct Layer {
    pub memory: Option<u64>,
    /// `CUQUOTA_MEMORY_REQUEST` / the file's `memory_request` (every device).
    pub memory_request: Option<u64>,
    pub sm: Option<u32>,
    pub device_memory: BTreeMap<u32, u64>,
    pub device_sm: BTreeMap<u32, u32>,
    /// `Some(PolicyKind::Default)` is an explicit "cuquota's default".
    pub policy: Option<PolicyKind>,
    pub weight: Option<u32>,
    pub priority: Option<Priority>,
    pub usage_path: Option<PathBuf>,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` (env only).
    pub hami_path: Option<PathBuf>,
    pub limits_path: Option<PathBuf>,
    /// `CUQUOTA_LIMITS_REQUIRED` (env only: the TOML file is the tenant's to write).
    pub limits_required: Option<bool>,
    pub priority_path: Option<PathBuf>,
    pub log_level: Option<LogLevel>,
    pub time_slice_us: Option<u32>,
    /// `CUQUOTA_ELASTIC_MIN_BYTES` (env only).
    pub elastic_min_bytes: Option<u64>,
    /// `CUQUOTA_RECLAIM_WAIT_MS` (env only).
    pub reclaim_wait_ms: Option<u32>,
    pub libcuda: Option<PathBuf>,
    pub libnvml: Option<PathBuf>,
    pub disabled: Option<bool>,
}

/// The most specific setting of the strongest source: env `_<i>`, env global, file `[[device]]`, file global.
fn pick<T: Copy>(
    i: Option<u32>,
    env: (&BTreeMap<u32, T>, Option<T>),
    file: (&BTreeMap<u32, T>, Option<T>),
) -> Option<T> {
    let dev = |m: &BTreeMap<u32, T>| i.and_then(|i| m.get(&i).copied());
    dev(env.0).or(env.1).or(dev(file.0)).or(file.1)
}

/// Merges the environment layer over the file layer into a [`Config`].
pub(crate) fn resolve(
    env: Layer,
    file: Layer,
    visible_devices: Option<VisibleDevices>,
    config_file: Option<PathBuf>,
    path_exists: &dyn Fn(&Path) -> bool,
) -> Config {
    let ordinals: BTreeSet<u32> = env
        .device_memory
        .keys()
        .chain(env.device_sm.keys())
        .chain(file.device_memory.keys())
        .chain(file.device_sm.keys())
        .copied()
        .collect();
    let policy = |i: Option<u32>| Policy {
        memory: pick(
            i,
            (&env.device_memory, env.memory),
            (&file.device_memory, file.memory),
        ),
        sm: pick(i, (&env.device_sm, env.sm), (&file.device_sm, file.sm)).filter(|p| (1..100).contains(p)),
        kind: env.policy.or(file.policy).unwrap_or_default(),
        weight: env.weight.or(file.weight),
        priority: env.priority.or(file.priority),
        reserved_memory: None,
        memory_request: env.memory_request.or(file.memory_request),
    };
    let default_limits = policy(None);
    let devices = ordinals.into_iter().map(|i| (i, policy(Some(i)))).collect();
    let mut limits_paths = Vec::new();
    let default_limits_path = Path::new(DEFAULT_LIMITS_PATH);
    if path_exists(default_limits_path) {
        limits_paths.push(default_limits_path.to_path_buf());
    }
    if let Some(p) = env.limits_path.or(file.limits_path) {
        if !limits_paths.contains(&p) {
            limits_paths.push(p);
        }
    }
    // Like the limits file, the agent's default cannot be redirected: a best-effort process pointing the
    // variable at a file of its own would stop seeing the high-priority tenants it must yield to.
    let default_priority_path = Path::new(DEFAULT_PRIORITY_PATH);
    let priority_path = if path_exists(default_priority_path) {
        Some(default_priority_path.to_path_buf())
    } else {
        env.priority_path.or(file.priority_path)
    };
    Config {
        devices,
        default_limits,
        usage_path: env
            .usage_path
            .or_else(|| env.hami_path.as_deref().map(super::usage_path_beside))
            .or(file.usage_path)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_USAGE_PATH)),
        hami_path: env
            .hami_path
            .unwrap_or_else(|| PathBuf::from(super::HAMI_DEFAULT_PATH)),
        limits_paths,
        limits_required: env.limits_required.unwrap_or(false)
            || path_exists(Path::new(LIMITS_REQUIRED_MARKER)),
        priority_path,
        log_level: env.log_level.or(file.log_level).unwrap_or(LogLevel::Warn),
        time_slice_us: env
            .time_slice_us
            .or(file.time_slice_us)
            .unwrap_or(super::DEFAULT_TIME_SLICE_US),
        elastic_min_bytes: env.elastic_min_bytes.unwrap_or(super::DEFAULT_ELASTIC_MIN_BYTES),
        reclaim_wait_ms: env.reclaim_wait_ms.unwrap_or(super::DEFAULT_RECLAIM_WAIT_MS),
        disabled: env.disabled.or(file.disabled).unwrap_or(false),
        libcuda_path: env.libcuda.or(file.libcuda),
        libnvml_path: env.libnvml.or(file.libnvml),
        visible_devices,
        config_file,
    }
}

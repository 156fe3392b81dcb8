//! One source of settings (the environment, or the TOML file) before merging, and the merge into [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Config, DeviceLimits, LogLevel, Policy, DEFAULT_LIMITS_PATH, DEFAULT_USAGE_PATH};
use crate::visible_devices::VisibleDevices;

/// The SM policy as a source states it; `Default` is an explicit "cuquota's default".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicySetting {
    Default,
    Hard,
    Burst,
    Disabled,
}

/// Settings from one source. Limits of `0` were already dropped (0 = "not set here", HAMi's fallback rule).
#[derive(Debug, Default, Clone)]
pub(crate) struct Layer {
    pub memory: Option<u64>,
    pub sm: Option<u32>,
    pub device_memory: BTreeMap<u32, u64>,
    pub device_sm: BTreeMap<u32, u32>,
    pub policy: Option<PolicySetting>,
    pub weight: Option<u32>,
    pub usage_path: Option<PathBuf>,
    pub limits_path: Option<PathBuf>,
    pub log_level: Option<LogLevel>,
    pub libcuda: Option<PathBuf>,
    pub libnvml: Option<PathBuf>,
    pub disabled: Option<bool>,
}

fn sm_value(raw: Option<u32>) -> Option<u32> {
    raw.filter(|p| (1..100).contains(p))
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
    let default_limits = DeviceLimits {
        memory: env.memory.or(file.memory),
        sm: sm_value(env.sm.or(file.sm)),
    };
    let devices = ordinals
        .into_iter()
        .map(|i| {
            let memory = env
                .device_memory
                .get(&i)
                .copied()
                .or(env.memory)
                .or(file.device_memory.get(&i).copied())
                .or(file.memory);
            let sm = env
                .device_sm
                .get(&i)
                .copied()
                .or(env.sm)
                .or(file.device_sm.get(&i).copied())
                .or(file.sm);
            (
                i,
                DeviceLimits {
                    memory,
                    sm: sm_value(sm),
                },
            )
        })
        .collect();
    let policy = env.policy.or(file.policy);
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
    Config {
        devices,
        default_limits,
        policy: match policy {
            Some(PolicySetting::Hard) => Some(Policy::Hard),
            Some(PolicySetting::Burst) => Some(Policy::Burst),
            _ => None,
        },
        sm_disabled: policy == Some(PolicySetting::Disabled),
        weight: env.weight.or(file.weight),
        usage_path: env
            .usage_path
            .or(file.usage_path)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_USAGE_PATH)),
        limits_paths,
        log_level: env.log_level.or(file.log_level).unwrap_or(LogLevel::Warn),
        disabled: env.disabled.or(file.disabled).unwrap_or(false),
        libcuda_path: env.libcuda.or(file.libcuda),
        libnvml_path: env.libnvml.or(file.libnvml),
        visible_devices,
        config_file,
    }
}

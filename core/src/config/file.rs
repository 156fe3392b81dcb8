//! The optional TOML file named by `CUQUOTA_CONFIG`.
//!
//! ```toml
//! memory_limit = "4g"        # string in HAMi's size syntax, or an integer number of bytes
//! memory_request = "2g"      # guaranteed memory, at most memory_limit (every device)
//! sm_limit = 30              # percent
//! policy = "hard"            # hard | burst | disabled
//! weight = 100               # 1–1000
//! priority = "high"          # high | low (or 0 | 1)
//! usage_file = "/tmp/cuquota.usage"
//! limits_file = "/run/cuquota/limits"
//! priority_file = "/run/cuquota/priority"
//! log = "warn"
//! libcuda = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
//! libnvml = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
//! disable = false
//!
//! [[device]]
//! index = 1                  # CUDA ordinal
//! memory_limit = "3000m"
//! sm_limit = 50
//! ```
//!
//! Unknown keys are errors (`deny_unknown_fields`), like unknown `CUQUOTA_*` variables.

use std::path::Path;

use serde::Deserialize;

use super::layer::Layer;
use super::values::{
    parse_log_name, parse_memory, parse_path, parse_policy, parse_priority, parse_sm, parse_time_slice,
    parse_weight,
};
use super::{ConfigError, MAX_ORDINAL};

/// A size given either as a string (`"3000m"`) or an integer number of bytes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

/// An integer given as such or as a string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Int {
    Number(u64),
    Text(String),
}

impl Int {
    fn text(&self) -> String {
        match self {
            Int::Number(n) => n.to_string(),
            Int::Text(t) => t.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceSection {
    index: u32,
    memory_limit: Option<Size>,
    sm_limit: Option<Int>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    memory_limit: Option<Size>,
    memory_request: Option<Size>,
    sm_limit: Option<Int>,
    policy: Option<String>,
    weight: Option<Int>,
    priority: Option<Int>,
    usage_file: Option<String>,
    limits_file: Option<String>,
    priority_file: Option<String>,
    log: Option<String>,
    time_slice_us: Option<Int>,
    libcuda: Option<String>,
    libnvml: Option<String>,
    disable: Option<bool>,
    #[serde(default)]
    device: Vec<DeviceSection>,
}

/// Reads and validates the file into a [`Layer`].
pub(super) fn load(path: &Path) -> Result<Layer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::FileRead {
        path: path.to_path_buf(),
        error: e.to_string(),
    })?;
    parse(path, &text)
}

/// An environment parser's error, re-labelled with the file and key.
fn relabel(path: &Path, key: &str, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::InvalidValue { value, expected, .. } => ConfigError::FileValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            value: if value.is_empty() {
                "\"\"".to_string()
            } else {
                value
            },
            expected,
        },
        other => other,
    }
}

/// An optional text value (a key of the file) through the environment's parser for the same setting.
fn keyed<T>(
    path: &Path,
    key: &str,
    v: Option<String>,
    parse: fn(&str, &str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    v.map(|v| parse(key, &v).map_err(|e| relabel(path, key, e)))
        .transpose()
}

/// Parses file contents (separate from [`load`] for tests).
pub(super) fn parse(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let raw: FileConfig = toml::from_str(text).map_err(|e| ConfigError::FileParse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;

    let size = |key: String, s: &Size| -> Result<u64, ConfigError> {
        match s {
            Size::Bytes(b) => Ok(*b),
            Size::Text(t) => parse_memory(&key, t).map_err(|e| relabel(path, &key, e)),
        }
    };
    let sm = |key: String, s: &Int| -> Result<u32, ConfigError> {
        match s {
            Int::Number(n) => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
            Int::Text(t) => parse_sm(&key, t).map_err(|e| relabel(path, &key, e)),
        }
    };

    let mut layer = Layer {
        memory: raw
            .memory_limit
            .as_ref()
            .map(|s| size("memory_limit".into(), s))
            .transpose()?
            .filter(|&m| m != 0),
        memory_request: raw
            .memory_request
            .as_ref()
            .map(|s| size("memory_request".into(), s))
            .transpose()?
            .filter(|&m| m != 0),
        sm: raw
            .sm_limit
            .as_ref()
            .map(|s| sm("sm_limit".into(), s))
            .transpose()?
            .filter(|&p| p != 0),
        policy: keyed(path, "policy", raw.policy, parse_policy)?,
        weight: keyed(path, "weight", raw.weight.as_ref().map(Int::text), parse_weight)?,
        priority: keyed(
            path,
            "priority",
            raw.priority.as_ref().map(Int::text),
            parse_priority,
        )?,
        usage_path: keyed(path, "usage_file", raw.usage_file, parse_path)?,
        limits_path: keyed(path, "limits_file", raw.limits_file, parse_path)?,
        priority_path: keyed(path, "priority_file", raw.priority_file, parse_path)?,
        log_level: keyed(path, "log", raw.log, parse_log_name)?,
        time_slice_us: keyed(
            path,
            "time_slice_us",
            raw.time_slice_us.as_ref().map(Int::text),
            parse_time_slice,
        )?,
        libcuda: keyed(path, "libcuda", raw.libcuda, parse_path)?,
        libnvml: keyed(path, "libnvml", raw.libnvml, parse_path)?,
        disabled: raw.disable,
        ..Layer::default()
    };
    if let (Some(r), Some(m)) = (layer.memory_request, layer.memory) {
        if r > m {
            return Err(ConfigError::FileValue {
                path: path.to_path_buf(),
                key: "memory_request".into(),
                value: r.to_string(),
                expected: "a request at most memory_limit",
            });
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (n, dev) in raw.device.iter().enumerate() {
        let i = dev.index;
        if i >= MAX_ORDINAL || !seen.insert(i) {
            return Err(ConfigError::FileValue {
                path: path.to_path_buf(),
                key: format!("device[{n}].index"),
                value: i.to_string(),
                expected: "a CUDA ordinal below 1024, each listed once",
            });
        }
        if let Some(m) = &dev.memory_limit {
            let m = size(format!("device[{n}].memory_limit"), m)?;
            if m != 0 {
                layer.device_memory.insert(i, m);
            }
        }
        if let Some(s) = &dev.sm_limit {
            let s = sm(format!("device[{n}].sm_limit"), s)?;
            if s != 0 {
                layer.device_sm.insert(i, s);
            }
        }
    }
    Ok(layer)
}

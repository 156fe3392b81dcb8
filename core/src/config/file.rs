//! The optional TOML file named by `CUQUOTA_CONFIG`.
//!
//! ```toml
//! memory_limit = "4g"        # string in HAMi's size syntax, or an integer number of bytes
//! sm_limit = 30              # percent
//! policy = "hard"            # hard | burst | disabled
//! weight = 100               # 1–1000
//! priority = "high"          # high | low (or 0 | 1)
//! usage_file = "/tmp/cuquota.usage"
//! limits_file = "/run/cuquota/limits"
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

use super::env::{parse_log_name, parse_memory, parse_policy, parse_priority, parse_sm, parse_weight};
use super::layer::Layer;
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
    sm_limit: Option<Int>,
    policy: Option<String>,
    weight: Option<Int>,
    priority: Option<Int>,
    usage_file: Option<String>,
    limits_file: Option<String>,
    log: Option<String>,
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

/// Parses file contents (separate from [`load`] for tests).
pub(super) fn parse(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let raw: FileConfig = toml::from_str(text).map_err(|e| ConfigError::FileParse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;

    // Reuse the env parsers, then re-label their errors with the file and key.
    let relabel = |key: String| {
        move |e: ConfigError| match e {
            ConfigError::InvalidValue { value, expected, .. } => ConfigError::FileValue {
                path: path.to_path_buf(),
                key,
                value,
                expected,
            },
            other => other,
        }
    };
    let size = |key: String, s: &Size| -> Result<u64, ConfigError> {
        match s {
            Size::Bytes(b) => Ok(*b),
            Size::Text(t) => parse_memory(&key, t).map_err(relabel(key.clone())),
        }
    };
    let sm = |key: String, s: &Int| -> Result<u32, ConfigError> {
        match s {
            Int::Number(n) => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
            Int::Text(t) => parse_sm(&key, t).map_err(relabel(key.clone())),
        }
    };
    let path_value = |key: &str, s: &str| {
        if s.is_empty() {
            Err(ConfigError::FileValue {
                path: path.to_path_buf(),
                key: key.to_string(),
                value: "\"\"".to_string(),
                expected: "a file path",
            })
        } else {
            Ok(std::path::PathBuf::from(s))
        }
    };

    let mut layer = Layer {
        memory: raw
            .memory_limit
            .as_ref()
            .map(|s| size("memory_limit".into(), s))
            .transpose()?
            .filter(|&m| m != 0),
        sm: raw
            .sm_limit
            .as_ref()
            .map(|s| sm("sm_limit".into(), s))
            .transpose()?
            .filter(|&p| p != 0),
        policy: raw
            .policy
            .as_deref()
            .map(|p| parse_policy("policy", p).map_err(relabel("policy".into())))
            .transpose()?,
        weight: raw
            .weight
            .as_ref()
            .map(|w| parse_weight("weight", &w.text()).map_err(relabel("weight".into())))
            .transpose()?,
        priority: raw
            .priority
            .as_ref()
            .map(|p| parse_priority("priority", &p.text()).map_err(relabel("priority".into())))
            .transpose()?,
        usage_path: raw
            .usage_file
            .as_deref()
            .map(|s| path_value("usage_file", s))
            .transpose()?,
        limits_path: raw
            .limits_file
            .as_deref()
            .map(|s| path_value("limits_file", s))
            .transpose()?,
        log_level: raw
            .log
            .as_deref()
            .map(|l| parse_log_name("log", l).map_err(relabel("log".into())))
            .transpose()?,
        libcuda: raw
            .libcuda
            .as_deref()
            .map(|s| path_value("libcuda", s))
            .transpose()?,
        libnvml: raw
            .libnvml
            .as_deref()
            .map(|s| path_value("libnvml", s))
            .transpose()?,
        disabled: raw.disable,
        ..Layer::default()
    };
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

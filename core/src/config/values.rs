//! Parsing one setting's value, the same for a variable and a TOML key: errors name the variable (or key) and the
//! value, and say what is accepted.

use std::path::PathBuf;

use super::{ConfigError, LogLevel, WEIGHT_RANGE};
use crate::policy::{PolicyKind, Priority};
use crate::units::{parse_size, parse_unsigned};

const SIZE_EXPECTED: &str = "a byte size such as 3000m or 4g (0 = no limit)";
const SM_EXPECTED: &str = "an integer percentage such as 30 (0 or 100 = no limit)";

fn invalid(var: &str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::InvalidValue {
        var: var.to_string(),
        value: value.to_string(),
        expected,
    }
}

pub(super) fn parse_memory(var: &str, v: &str) -> Result<u64, ConfigError> {
    parse_size(v).map_err(|_| invalid(var, v, SIZE_EXPECTED))
}

pub(super) fn parse_sm(var: &str, v: &str) -> Result<u32, ConfigError> {
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, SM_EXPECTED))?;
    // ≥100 means "no limit"; clamp huge values instead of rejecting them (HAMi accepts any number).
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// A name from `parse`, or an error saying what the HAMi variable or ours (or the file key) accepts.
fn named<T>(
    var: &str,
    v: &str,
    parse: fn(&str) -> Option<T>,
    hami: (&str, &'static str),
    ours: &'static str,
) -> Result<T, ConfigError> {
    parse(v).ok_or_else(|| invalid(var, v, if var.starts_with(hami.0) { hami.1 } else { ours }))
}

pub(super) fn parse_policy(var: &str, v: &str) -> Result<PolicyKind, ConfigError> {
    named(
        var,
        v,
        PolicyKind::parse,
        ("GPU_", "FORCE, DISABLE or DEFAULT"),
        "hard, burst or disabled",
    )
}

/// HAMi's `CUDA_TASK_PRIORITY` is a number (0 high, 1 low); ours a name (either is accepted in both).
pub(super) fn parse_priority(var: &str, v: &str) -> Result<Priority, ConfigError> {
    named(
        var,
        v,
        Priority::parse,
        ("CUDA_", "0 (high) or 1 (low)"),
        "high or low",
    )
}

pub(super) fn parse_weight(var: &str, v: &str) -> Result<u32, ConfigError> {
    let expected = "an integer weight from 1 to 1000";
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, expected))?;
    u32::try_from(n)
        .ok()
        .filter(|w| WEIGHT_RANGE.contains(w))
        .ok_or_else(|| invalid(var, v, expected))
}

pub(super) fn parse_bool(var: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(var, v, "true or false (or 1 / 0)")),
    }
}

pub(super) fn parse_log_name(var: &str, v: &str) -> Result<LogLevel, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "error" | "0" => Ok(LogLevel::Error),
        "warn" | "warning" | "1" => Ok(LogLevel::Warn),
        "info" | "2" => Ok(LogLevel::Info),
        "debug" | "3" => Ok(LogLevel::Debug),
        "trace" | "4" => Ok(LogLevel::Trace),
        _ => Err(invalid(var, v, "error, warn, info, debug or trace")),
    }
}

pub(super) fn parse_log_number(var: &str, v: &str) -> Result<LogLevel, ConfigError> {
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, "a log level from 0 to 4"))?;
    Ok(match n {
        0 => LogLevel::Error,
        1 => LogLevel::Warn,
        2 => LogLevel::Info,
        3 => LogLevel::Debug,
        _ => LogLevel::Trace,
    })
}

pub(super) fn parse_path(var: &str, v: &str) -> Result<PathBuf, ConfigError> {
    if v.is_empty() {
        Err(invalid(var, v, "a file path"))
    } else {
        Ok(PathBuf::from(v))
    }
}

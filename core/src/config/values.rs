//! Parsing one setting's value, the same for a variable and a TOML key: errors name the variable (or key) and the
//! value, and say what is accepted.

use std::path::PathBuf;

use super::{ConfigError, LogLevel, WEIGHT_RANGE};
use crate::policy::{PolicyKind, Priority};
use crate::units::{parse_size, parse_unsigned};

const SIZE_EXPECTED: &str = "a byte size such as 3000m or 4g (0 = no limit)";
const SM_EXPECTED: &str = "an integer percentage such as 30 (0 or 100 = no limit)";
// HAMi's names: HAMi-core reads only a value's leading digits, and none as 0 = no limit (it fails open, so
// cuquota refuses instead: docs/hami.md).
const SIZE_EXPECTED_HAMI: &str =
    "a byte size HAMi-core reads the same way: digits and at most a last k, m or g, such as 3000m or 4g (0 = no \
     limit); HAMi-core would have read only the leading digits, scaled by a last k, m or g (3000mb = 3000 bytes, \
     1t = 1 byte), and without any digits would have run this container with no memory limit";
const SM_EXPECTED_HAMI: &str =
    "an integer percentage such as 30 (0 or 100 = no limit); HAMi-core would have \
     read only the leading digits, and without any would have run this container with no SM limit";

/// HAMi's variables (`CUDA_…`, `GPU_…`): read as HAMi-core reads them, messages saying what it would have done.
fn is_hami(var: &str) -> bool {
    var.starts_with("CUDA_") || var.starts_with("GPU_")
}

fn invalid(var: &str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::InvalidValue {
        var: var.to_string(),
        value: value.to_string(),
        expected,
    }
}

pub(super) fn parse_memory(var: &str, v: &str) -> Result<u64, ConfigError> {
    if !is_hami(var) {
        return parse_size(v).map_err(|_| invalid(var, v, SIZE_EXPECTED));
    }
    // HAMi's name: only a value HAMi-core reads as the same cap (never a larger one, never "no limit").
    match parse_size(v) {
        Ok(n) if n == hami_core_size(v) => Ok(n),
        _ => Err(invalid(var, v, SIZE_EXPECTED_HAMI)),
    }
}

/// What HAMi-core's `get_limit_from_env` makes of a memory value (0 = no limit): `strtoul(value, _, 0)` (leading
/// white space, a sign, `0x` hex, a leading `0` octal, saturating) times the unit of a last `k`/`m`/`g` (any
/// case), wrapping as `size_t` does.
fn hami_core_size(v: &str) -> u64 {
    let scalar: u64 = match v.bytes().last() {
        Some(b'g' | b'G') => 1 << 30,
        Some(b'm' | b'M') => 1 << 20,
        Some(b'k' | b'K') => 1 << 10,
        _ => 1,
    };
    // C's isspace: ASCII white space and the vertical tab.
    let s = v.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if h.starts_with(|c: char| c.is_ascii_hexdigit()) {
            (16, h)
        } else {
            (8, s)
        }
    } else if s.starts_with('0') {
        (8, s)
    } else {
        (10, s)
    };
    let mut n: u64 = 0;
    for c in digits.chars().map_while(|c| c.to_digit(radix)) {
        n = n.saturating_mul(radix as u64).saturating_add(c as u64);
    }
    let n = if neg && n != u64::MAX { n.wrapping_neg() } else { n };
    n.wrapping_mul(scalar)
}

pub(super) fn parse_sm(var: &str, v: &str) -> Result<u32, ConfigError> {
    let expected = if is_hami(var) {
        SM_EXPECTED_HAMI
    } else {
        SM_EXPECTED
    };
    // `50%` is 50, as HAMi-core reads it.
    let t = v.trim_matches(|c: char| c.is_ascii_whitespace());
    let n = parse_unsigned(t.strip_suffix('%').unwrap_or(t)).map_err(|_| invalid(var, v, expected))?;
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

/// HAMi's `CUDA_TASK_PRIORITY` is a number (0 high, 1 low; HAMi-core and its monitor take any larger number
/// as a lower priority, so cuquota reads it as low); ours a name (either is accepted in both).
pub(super) fn parse_priority(var: &str, v: &str) -> Result<Priority, ConfigError> {
    if is_hami(var) && parse_unsigned(v).is_ok_and(|n| n >= 1) && v.trim().bytes().all(|b| b.is_ascii_digit())
    {
        return Ok(Priority::Low);
    }
    named(
        var,
        v,
        Priority::parse,
        (
            "CUDA_",
            "0 (high) or a larger integer (low); HAMi-core would have read a value without leading digits as 0, \
             high priority",
        ),
        "high or low",
    )
}

/// HAMi's `GPU_CORE_UTILIZATION_POLICY`: a value HAMi-core does not know means its default, as here (the
/// default limits: nothing fails open).
pub(super) fn parse_hami_policy(var: &str, v: &str) -> Result<PolicyKind, ConfigError> {
    if is_hami(var) {
        Ok(PolicyKind::parse(v).unwrap_or(PolicyKind::Default))
    } else {
        parse_policy(var, v)
    }
}

pub(super) fn parse_weight(var: &str, v: &str) -> Result<u32, ConfigError> {
    let expected = "an integer weight from 1 to 1000";
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, expected))?;
    u32::try_from(n)
        .ok()
        .filter(|w| WEIGHT_RANGE.contains(w))
        .ok_or_else(|| invalid(var, v, expected))
}

pub(super) fn parse_time_slice(var: &str, v: &str) -> Result<u32, ConfigError> {
    let expected = "a time slice in µs from 0 (releases not shaped) to 8000";
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, expected))?;
    u32::try_from(n)
        .ok()
        .filter(|&us| us <= super::MAX_TIME_SLICE_US)
        .ok_or_else(|| invalid(var, v, expected))
}

/// `CUQUOTA_ELASTIC_MIN_BYTES`: a size (`k/m/g` suffixes) from 64 KiB to 1 TiB.
pub(super) fn parse_elastic_min(var: &str, v: &str) -> Result<u64, ConfigError> {
    let expected = "a size from 64k to 1t (allocations of at least this many bytes are movable)";
    parse_memory(var, v)
        .ok()
        .filter(|n| (64 << 10..=1 << 40).contains(n))
        .ok_or_else(|| invalid(var, v, expected))
}

pub(super) fn parse_reclaim_wait(var: &str, v: &str) -> Result<u32, ConfigError> {
    let expected = "a wait in ms from 0 (no wait) to 60000";
    let n = parse_unsigned(v).map_err(|_| invalid(var, v, expected))?;
    u32::try_from(n)
        .ok()
        .filter(|&ms| ms <= super::MAX_RECLAIM_WAIT_MS)
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

/// HAMi-core's `LIBCUDA_LOG_LEVEL`: `atoi` of the value (no digits = 0); errors always, 2 (its default) adds
/// warnings, 3 information, 4 debugging (5 and above: cuquota's trace too). A log level never fails a process.
pub(super) fn parse_log_number(_var: &str, v: &str) -> Result<LogLevel, ConfigError> {
    let t = v.trim_start();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let n: u64 = digits.bytes().take_while(u8::is_ascii_digit).fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    });
    Ok(match if neg { 0 } else { n } {
        0 | 1 => LogLevel::Error,
        2 => LogLevel::Warn,
        3 => LogLevel::Info,
        4 => LogLevel::Debug,
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

#[cfg(test)]
mod hami_tests {
    use super::*;

    #[test]
    fn hami_memory_values_are_read_as_hami_core_reads_them_or_refused() {
        const M: u64 = 1 << 20;
        const G: u64 = 1 << 30;
        for (v, core) in [
            ("3000m", 3000 * M),
            ("4g", 4 * G),
            ("4G", 4 * G),
            ("512k", 512 << 10),
            ("1073741824", G),
            ("0x100000", M),
            ("3000mb", 3000),
            ("4gib", 4),
            ("1t", 1),
            ("8g ", 8),
            ("1.5g", G),
            ("010g", 8 * G),
            ("lots", 0),
            ("", 0),
        ] {
            assert_eq!(hami_core_size(v), core, "{v:?}");
        }
        let var = "CUDA_DEVICE_MEMORY_LIMIT";
        assert_eq!(parse_memory(var, "3000m"), Ok(3000 * M));
        assert_eq!(parse_memory(var, "4g"), Ok(4 * G));
        assert_eq!(parse_memory(var, "0x100000"), Ok(M));
        assert_eq!(parse_memory(var, "0"), Ok(0));
        // HAMi-core reads these as smaller caps (or none): cuquota would grant more, so it refuses.
        assert_eq!(parse_memory(var, "010g"), Ok(8 * G), "octal, as strtoul reads it");
        for v in ["3000mb", "4gib", "1t", "2tb", "8g ", "1.5g", "lots", "-1"] {
            let e = parse_memory(var, v).unwrap_err().to_string();
            assert!(e.contains("HAMi-core"), "{v:?}: {e}");
        }
        // cuquota's own name keeps cuquota's syntax.
        assert_eq!(parse_memory("CUQUOTA_MEMORY_LIMIT", "4GiB"), Ok(4 * G));
        assert_eq!(parse_memory("CUQUOTA_MEMORY_LIMIT", "1t"), Ok(1 << 40));
    }
}

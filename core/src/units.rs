//! Byte sizes in HAMi-core's syntax, so values written for `libvgpu.so` mean the same thing here.
//!
//! Grammar: optional surrounding ASCII whitespace, an unsigned integer whose base is detected like C's
//! `strtoul(…, 0)` (`0x`/`0X` → hex, a leading `0` → octal, else decimal), then an optional unit suffix, any
//! case: `k`, `m`, `g`, `t` (×1024¹…⁴), each optionally followed by `b` or `ib`; a bare `b` means bytes.
//! Hex digits are taken greedily as `strtoul` does, so `0x1b` is 27 bytes, not 1 byte.
//!
//! Everything else — empty, a sign, garbage, an unknown suffix, a value that overflows `u64` — is an error:
//! a mistyped limit must never silently become "no limit".

use std::fmt;

/// Why a string is not a byte size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing but whitespace.
    Empty,
    /// A leading `-` or `+`: sizes are unsigned.
    Signed,
    /// No digits where the number should start.
    NoDigits,
    /// Text after the number that is not a known unit.
    BadSuffix(String),
    /// The value does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Empty => f.write_str("empty value"),
            SizeError::Signed => f.write_str("sizes are unsigned"),
            SizeError::NoDigits => f.write_str("no number"),
            SizeError::BadSuffix(s) => write!(f, "unknown unit {s:?} (use k, m, g or t)"),
            SizeError::Overflow => f.write_str("value does not fit in 64 bits"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses an unsigned integer with `strtoul` base-0 detection and no suffix. Returns the value and the
/// unparsed rest of the string.
fn parse_prefix_number(s: &str) -> Result<(u64, &str), SizeError> {
    let (radix, digits) = if let Some(rest) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (16, rest)
    } else if s.starts_with('0') {
        (8, s) // the leading 0 is itself an octal digit; "0" alone is zero
    } else {
        (10, s)
    };
    let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
    if end == 0 {
        // "0x" with nothing after it, or no digit at all.
        return Err(SizeError::NoDigits);
    }
    let value = u64::from_str_radix(&digits[..end], radix).map_err(|_| SizeError::Overflow)?;
    Ok((value, &digits[end..]))
}

/// Parses an unsigned integer with `strtoul` base-0 detection (`0x` hex, leading `0` octal, else decimal) and no
/// unit suffix. Surrounding whitespace is ignored.
pub fn parse_unsigned(s: &str) -> Result<u64, SizeError> {
    let s = s.trim_matches(|c: char| c.is_ascii_whitespace());
    check_sign(s)?;
    let (value, rest) = parse_prefix_number(s)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(SizeError::BadSuffix(rest.to_string()))
    }
}

fn check_sign(s: &str) -> Result<(), SizeError> {
    if s.is_empty() {
        Err(SizeError::Empty)
    } else if s.starts_with('-') || s.starts_with('+') {
        Err(SizeError::Signed)
    } else {
        Ok(())
    }
}

/// Parses a byte size in HAMi's syntax (see the module docs). `0` parses to `0`; callers decide that it
/// means "no limit".
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let s = s.trim_matches(|c: char| c.is_ascii_whitespace());
    check_sign(s)?;
    let (value, rest) = parse_prefix_number(s)?;
    let shift = match rest.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SizeError::BadSuffix(rest.to_string())),
    };
    value.checked_mul(1u64 << shift).ok_or(SizeError::Overflow)
}

/// Formats a byte count for people: the largest binary unit that divides it exactly (`4 GiB`, `3000 MiB`),
/// else two decimals of the largest unit that fits (`1.00 GiB` for 1 GiB + 1 byte).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    if let Some((name, shift)) = UNITS
        .iter()
        .find(|(_, s)| bytes >= 1 << s && bytes & ((1 << s) - 1) == 0)
    {
        return format!("{} {name}", bytes >> shift);
    }
    match UNITS.iter().find(|(_, s)| bytes >= 1 << s) {
        Some((name, shift)) => format!("{:.2} {name}", bytes as f64 / (1u64 << shift) as f64),
        None => format!("{bytes} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_with_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("3000m"), Ok(3000 << 20));
        assert_eq!(parse_size("3000M"), Ok(3000 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4gb"), Ok(4 << 30));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert_eq!(parse_size("17b"), Ok(17));
        assert_eq!(parse_size(" 5m "), Ok(5 << 20));
    }

    #[test]
    fn base_detection_like_strtoul() {
        assert_eq!(parse_size("0x10"), Ok(16));
        assert_eq!(parse_size("0X10m"), Ok(16 << 20));
        assert_eq!(parse_size("010"), Ok(8));
        assert_eq!(parse_size("010k"), Ok(8 << 10));
        // hex digits are greedy: b is a digit here
        assert_eq!(parse_size("0x1b"), Ok(27));
        assert_eq!(parse_size("00"), Ok(0));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        assert_eq!(parse_size("-1"), Err(SizeError::Signed));
        assert_eq!(parse_size("+1"), Err(SizeError::Signed));
        assert_eq!(parse_size("g"), Err(SizeError::NoDigits));
        assert_eq!(parse_size("0x"), Err(SizeError::NoDigits));
        assert_eq!(parse_size("12x"), Err(SizeError::BadSuffix("x".into())));
        assert_eq!(parse_size("08"), Err(SizeError::BadSuffix("8".into())));
        assert_eq!(parse_size("4 g"), Err(SizeError::BadSuffix(" g".into())));
        assert_eq!(parse_size("4gg"), Err(SizeError::BadSuffix("gg".into())));
        assert_eq!(parse_size("1.5g"), Err(SizeError::BadSuffix(".5g".into())));
    }

    #[test]
    fn rejects_overflow() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("18446744073709551616"), Err(SizeError::Overflow));
        assert_eq!(parse_size("16777216t"), Err(SizeError::Overflow));
        assert_eq!(parse_size("16777215t"), Ok(16777215u64 << 40));
        assert_eq!(parse_size("0xffffffffffffffffk"), Err(SizeError::Overflow));
    }

    #[test]
    fn unsigned_without_suffix() {
        assert_eq!(parse_unsigned("30"), Ok(30));
        assert_eq!(parse_unsigned("0x1e"), Ok(30));
        assert!(parse_unsigned("30%").is_err());
        assert!(parse_unsigned("30m").is_err());
        assert!(parse_unsigned("-3").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(3000 << 20), "3000 MiB");
        assert_eq!(format_size(3 << 29), "1536 MiB");
        assert_eq!(format_size((1 << 30) + 1), "1.00 GiB");
    }
}

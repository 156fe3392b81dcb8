//! Kubernetes resource quantities (`4Gi`, `1500M`, `30`, `0.5Gi`, `1e9`) as whole units, the way a claim's
//! `consumedCapacity` and the slice's capacities write them.

/// Parses a quantity to a whole number of base units (bytes, percent), rounding a fraction up as Kubernetes
/// does when it asks for the value in units. `None` for a malformed, negative or overflowing quantity.
pub fn parse(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    // value = (int.frac) × mul × 10^exp10: kept as an exact fraction numerator / 10^frac_digits.
    let (mul, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse::<i32>().ok().filter(|x| x.abs() <= 30)?),
        _ => return None,
    };
    let digits = format!("{int}{frac}");
    if digits.len() > 30 {
        return None;
    }
    let mantissa: u128 = digits.parse().ok()?;
    let scale = exp10 - frac.len() as i32;
    let v = mantissa.checked_mul(mul)?;
    let v = if scale >= 0 {
        v.checked_mul(10u128.checked_pow(scale as u32)?)?
    } else {
        let d = 10u128.checked_pow((-scale) as u32)?;
        v.div_ceil(d)
    };
    u64::try_from(v).ok()
}

/// Formats bytes as a quantity: the largest binary suffix that divides it.
pub fn format_bytes(b: u64) -> String {
    for (shift, suf) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{suf}", b >> shift);
        }
    }
    b.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities() {
        assert_eq!(parse("4Gi"), Some(4 << 30));
        assert_eq!(parse("1500M"), Some(1_500_000_000));
        assert_eq!(parse("30"), Some(30));
        assert_eq!(parse("0.5Gi"), Some(512 << 20));
        assert_eq!(parse("1e9"), Some(1_000_000_000));
        assert_eq!(parse("1E3"), Some(1000));
        assert_eq!(parse("1500m"), Some(2), "a fraction rounds up");
        assert_eq!(parse("80Gi"), Some(80 << 30));
        assert_eq!(parse("+1k"), Some(1000));
        for bad in ["", "-1", "Gi", "1.2.3", "4GB", "1x", "99999999999999999999Ei"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_bytes_with_the_largest_suffix() {
        assert_eq!(format_bytes(4 << 30), "4Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(parse(&format_bytes(80 << 30)), Some(80 << 30));
    }
}

//! Output shared by the commands: JSON reports (serde; every report names its schema, documented in
//! docs/schemas/), left-aligned tables (comfy-table), and the argument parsers for sizes and percentages.

use cuquota_core::units::{format_size, parse_size, parse_unsigned};
use serde::Serialize;

/// Prints a report as one line of JSON on stdout.
pub fn print_json<T: Serialize>(report: &T) -> Result<(), crate::AgentError> {
    let s = serde_json::to_string(report)?;
    println!("{s}");
    Ok(())
}

/// Prints a left-aligned table with columns sized to their widest cell.
pub fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    for line in table_lines(header, rows) {
        println!("{line}");
    }
}

/// The lines of [`print_table`]: comfy-table without borders, columns two spaces apart, sized by display width.
pub fn table_lines<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> Vec<String> {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_header(header.to_vec())
        .add_rows(rows.iter().map(|r| r.to_vec()));
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    t.lines().map(|l| l.trim_end().to_string()).collect()
}

/// `4 GiB`, or `-` for none.
pub fn size_or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), format_size)
}

/// `30%`, or `-` for none.
pub fn pct_or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v}%"))
}

/// `12.3%`, or `-` for none.
pub fn share_or_dash(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}%"))
}

/// Rounds a percentage to 2 decimals for reports.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// A command-line value the parsers below refuse, saying what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// Not a byte size.
    #[error("{0}; expected a byte size such as 4g or 3000m")]
    Size(String),
    /// Not a percentage.
    #[error("expected a percentage from 0 to 100 (0 or 100 = no limit)")]
    Percent,
    /// Not a duration.
    #[error("{0}: expected a duration such as 500ms, 1s or 2m (a plain number is milliseconds)")]
    Duration(String),
}

/// clap parser for a byte size in HAMi's syntax (`4g`, `3000m`, `0x100000`).
pub fn parse_size_arg(s: &str) -> Result<u64, ArgError> {
    parse_size(s).map_err(|e| ArgError::Size(e.to_string()))
}

/// clap parser for an SM percentage: 0–100, where 0 and 100 mean no limit (stored as 0).
pub fn parse_sm_arg(s: &str) -> Result<u32, ArgError> {
    match parse_unsigned(s) {
        Ok(n) if n <= 100 => Ok(if n == 100 { 0 } else { n as u32 }),
        _ => Err(ArgError::Percent),
    }
}

/// clap parser for a duration: `500ms`, `1s`, `2m`, `1s 500ms` (humantime's syntax), or a plain number of
/// milliseconds.
pub fn parse_duration_arg(s: &str) -> Result<std::time::Duration, ArgError> {
    let t = s.trim();
    match t.parse::<u64>() {
        Ok(ms) => Ok(std::time::Duration::from_millis(ms)),
        Err(_) => humantime::parse_duration(t).map_err(|e| ArgError::Duration(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_align() {
        let l = table_lines(
            &["A", "BB"],
            &[["xyz".into(), "1".into()], ["".into(), "22".into()]],
        );
        assert_eq!(l, vec!["A    BB", "xyz  1", "     22"]);
    }

    #[test]
    fn argument_parsers() {
        assert_eq!(parse_size_arg("3000m"), Ok(3000 << 20));
        assert!(parse_size_arg("12x").unwrap_err().to_string().contains("4g"));
        assert_eq!(parse_sm_arg("30"), Ok(30));
        assert_eq!(parse_sm_arg("100"), Ok(0));
        assert!(parse_sm_arg("150").is_err());
        let ms = |s| parse_duration_arg(s).map(|d| d.as_millis());
        assert_eq!(ms("400"), Ok(400));
        assert_eq!(ms("1s 500ms"), Ok(1500));
        assert_eq!(ms("250ms"), Ok(250));
        assert_eq!(ms("2m"), Ok(120_000));
        assert!(ms("-1s").is_err() && ms("soon").is_err());
    }
}

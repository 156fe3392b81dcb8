//! Bad input, fuzzed (proptest, bounded: a few hundred cases per property, seconds in CI): environment values,
//! the TOML config file and the two region files (limits, usage) — truncated, wrong magic or version, hostile
//! sizes and counts, garbage slots. Each gives a clear error or a valid result and fails closed: a limit that
//! was asked for never turns into "no limit", garbage in the shared usage file never lets a charge past the
//! limit, and nothing panics or waits without bound.
//!
//! More cases: `PROPTEST_CASES=5000 cargo test -p cuquota-core --test fuzz` (README.md, *Reliability*, records
//! the last such run).

use cuquota_core::region::{LimitsReader, LimitsWriter, RegionError, UsageRegion};
use cuquota_core::units::{parse_size, parse_unsigned};
use cuquota_core::Config;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn cases(n: u32) -> ProptestConfig {
    // PROPTEST_CASES (the env) overrides, for the documented long run.
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n);
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A file path of this test process, removed on drop.
struct Tmp(PathBuf);
impl Tmp {
    fn new(tag: &str) -> Tmp {
        static N: AtomicU32 = AtomicU32::new(0);
        Tmp(std::env::temp_dir().join(format!(
            "cuquota-fuzz-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Strings near the grammar of sizes and percentages, and plain garbage.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,25}",
        "[0-9]{1,6}[kKmMgGtT]?[iI]?[bB]?",
        " ?[-+]?[0-9]{0,4}(\\.[0-9]{0,3})?[a-zA-Z%]{0,3} ?",
        "[0-9]{1,4}[ ,_/][0-9]{1,4}",
        "\\PC{0,12}",
        Just(String::new()),
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("17179869184t".to_string()),
        Just("0x10".to_string()),
        Just("nan".to_string()),
    ]
}

fn config(vars: &[(&str, &str)]) -> Result<Config, cuquota_core::config::ConfigError> {
    Config::from_vars(vars.iter().copied(), &|_| false)
}

/// HAMi-core's `get_limit_from_env` (multiprocess_memory_limit.c), written from its source: `strtoul(v, _, 0)`
/// (white space, a sign, `0x` hex, a leading `0` octal, saturating) times the unit of a last `k`/`m`/`g`.
fn hami_core(v: &str) -> u64 {
    let unit: u64 = match v.bytes().last().map(|b| b.to_ascii_lowercase()) {
        Some(b'g') => 1 << 30,
        Some(b'm') => 1 << 20,
        Some(b'k') => 1 << 10,
        _ => 1,
    };
    let s = v.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (radix, d) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if h.starts_with(|c: char| c.is_ascii_hexdigit()) => (16, h),
        _ if s.starts_with('0') => (8, s),
        _ => (10, s),
    };
    let n = d.chars().map_while(|c| c.to_digit(radix)).fold(0u64, |n, c| {
        n.saturating_mul(radix as u64).saturating_add(c as u64)
    });
    let n = if neg && n != u64::MAX { n.wrapping_neg() } else { n };
    n.wrapping_mul(unit)
}

proptest! {
    #![proptest_config(cases(512))]

    /// A memory limit variable: accepted exactly when it is a size, and then it is the limit (0 = none);
    /// otherwise an error that names the variable.
    #[test]
    fn env_memory_limit(v in value(), hami in any::<bool>(), ordinal in proptest::option::of(0u32..4)) {
        let base = if hami { "CUDA_DEVICE_MEMORY_LIMIT" } else { "CUQUOTA_MEMORY_LIMIT" };
        let var = match ordinal {
            Some(i) => format!("{base}_{i}"),
            None => base.to_string(),
        };
        let r = config(&[(var.as_str(), v.as_str())]);
        // HAMi's names: only a size HAMi-core reads as the same cap is accepted.
        let want = parse_size(&v).map_err(|_| ()).and_then(|n| if !hami || n == hami_core(&v) { Ok(n) } else { Err(()) });
        match (want, r) {
            (Ok(n), Ok(c)) => {
                let got = c.memory_limit(ordinal.unwrap_or(0));
                prop_assert_eq!(got, (n > 0).then_some(n), "{}={:?}", var, v);
            }
            (Err(_), Err(e)) => {
                prop_assert!(e.to_string().contains(&var), "error does not name {}: {}", var, e);
            }
            (Err(_), Ok(c)) => {
                // Only an empty value may be taken as unset; never as a limit out of thin air, never silently.
                prop_assert!(v.trim().is_empty(), "{}={:?} accepted as {:?}", var, v, c.memory_limit(0));
                prop_assert_eq!(c.memory_limit(0), None);
            }
            (Ok(n), Err(e)) => prop_assert!(false, "{}={:?} is the size {} but was refused: {}", var, v, n, e),
        }
    }

    /// An SM limit variable: an unsigned integer as `strtoul` base 0 reads it (HAMi's syntax: `0x` hex, `0`
    /// octal; ≥ 100 or 0: no limit; a trailing `%`), or an error naming the variable.
    #[test]
    fn env_sm_limit(v in value(), hami in any::<bool>()) {
        let var = if hami { "CUDA_DEVICE_SM_LIMIT" } else { "CUQUOTA_SM_LIMIT" };
        // A trailing `%` is read as HAMi-core reads it (`50%` = 50).
        let t = v.trim_matches(|c: char| c.is_ascii_whitespace());
        match (parse_unsigned(t.strip_suffix('%').unwrap_or(t)), config(&[(var, v.as_str())])) {
            (Ok(n), Ok(c)) => {
                let want = (1..100).contains(&n).then_some(n as u32);
                prop_assert_eq!(c.sm_limit(0), want, "{}={:?}", var, v);
            }
            (Err(_), Err(e)) => {
                prop_assert!(e.to_string().contains(var), "error does not name {}: {}", var, e);
            }
            (Err(_), Ok(c)) => {
                prop_assert!(v.trim().is_empty(), "{}={:?} accepted as {:?}", var, v, c.sm_limit(0));
                prop_assert_eq!(c.sm_limit(0), None);
            }
            (Ok(n), Err(e)) => prop_assert!(false, "{}={:?} is {} but was refused: {}", var, v, n, e),
        }
    }

    /// Any set of variables (known names, HAMi names, misspelt ones, garbage values): no panic, and an
    /// accepted memory limit is always a size some variable asked for.
    #[test]
    fn env_any_mix(vars in proptest::collection::vec((prop_oneof![
        Just("CUDA_DEVICE_MEMORY_LIMIT".to_string()),
        Just("CUDA_DEVICE_MEMORY_LIMIT_0".to_string()),
        Just("CUQUOTA_MEMORY_LIMIT".to_string()),
        Just("CUDA_DEVICE_SM_LIMIT".to_string()),
        Just("CUQUOTA_POLICY".to_string()),
        Just("GPU_CORE_UTILIZATION_POLICY".to_string()),
        Just("CUQUOTA_WEIGHT".to_string()),
        Just("CUQUOTA_PRIORITY".to_string()),
        Just("CUQUOTA_DISABLE".to_string()),
        Just("CUDA_DISABLE_CONTROL".to_string()),
        Just("CUQUOTA_LOG".to_string()),
        Just("CUDA_VISIBLE_DEVICES".to_string()),
        "CUQUOTA_[A-Z_]{1,12}",
        "CUDA_DEVICE_MEMORY_LIMIT_[0-9]{1,5}",
    ], value()), 0..8)) {
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if let Ok(c) = config(&pairs) {
            if let Some(m) = c.memory_limit(0) {
                prop_assert!(
                    vars.iter().any(|(k, v)| k.contains("MEMORY_LIMIT") && parse_size(v) == Ok(m)),
                    "limit {} from nowhere: {:?}", m, vars
                );
            }
        }
    }

    /// The TOML file: a memory limit of any shape is the limit it says or an error naming the file; garbage
    /// around it is an error; nothing panics.
    #[test]
    fn config_file(mem in prop_oneof![
        value().prop_map(|v| format!("{v:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("1.5".to_string()),
        Just("[1, 2]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("true".to_string()),
    ], junk in proptest::option::of("\\PC{0,40}"), cut in proptest::option::of(0usize..60)) {
        let mut text = format!("memory_limit = {mem}\nsm_limit = 30\n");
        if let Some(j) = &junk {
            text.push_str(j);
        }
        if let Some(c) = cut {
            let mut c = c.min(text.len());
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            text.truncate(c);
        }
        let f = Tmp::new("toml");
        std::fs::write(&f.0, &text).expect("write");
        let path = f.0.to_string_lossy().into_owned();
        match config(&[("CUQUOTA_CONFIG", path.as_str())]) {
            Ok(c) => {
                if let Some(m) = c.memory_limit(0) {
                    let said = text.lines().find_map(|l| l.trim().strip_prefix("memory_limit"))
                        .map(|r| r.trim_start().trim_start_matches('=').trim().trim_matches('"').to_string());
                    let said = said.expect("a limit but no memory_limit line");
                    let n: Option<u64> = parse_size(&said).ok().or_else(|| said.parse().ok());
                    prop_assert_eq!(Some(m), n, "{:?}", text);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains(&path), "error does not name the file: {}", e),
        }
    }
}

// ---- region files --------------------------------------------------------------------------------------------

/// A valid usage file's bytes (with one live slot) and a valid limits file's bytes (one entry).
fn valid_files() -> (Vec<u8>, Vec<u8>) {
    let u = Tmp::new("usage-src");
    {
        let r = UsageRegion::open(&u.0).expect("usage");
        let d = r.device(&[7; 16]).expect("device");
        let s = r.claim_slot().expect("slot");
        r.try_charge(s, d, 1 << 20, Some(1 << 30)).expect("charge");
    }
    let l = Tmp::new("limits-src");
    {
        let w = LimitsWriter::create(&l.0).expect("limits");
        w.update(|t| -> Result<(), std::convert::Infallible> {
            let sel = cuquota_core::region::DeviceSelector::Index(0);
            t.entry_mut(sel).expect("entry").memory_limit = 1 << 30;
            Ok(())
        })
        .expect("update")
        .expect("edit");
    }
    (
        std::fs::read(&u.0).expect("read"),
        std::fs::read(&l.0).expect("read"),
    )
}

fn valid() -> &'static (Vec<u8>, Vec<u8>) {
    static V: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    V.get_or_init(valid_files)
}

/// What to do to a file's bytes.
#[derive(Debug, Clone)]
enum Damage {
    /// Keep the first n bytes.
    Truncate(usize),
    /// Overwrite bytes at an offset within the header's identity (magic, ABI version, sizes, counts).
    Header(usize, Vec<u8>),
    /// Overwrite bytes anywhere.
    Anywhere(usize, Vec<u8>),
    /// Fill a range with one byte (0xff: hostile counts and sizes everywhere).
    Fill(usize, usize, u8),
    /// Append bytes.
    Grow(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0usize..1 << 20).prop_map(Damage::Truncate),
        (0usize..IDENTITY, proptest::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(o, b)| Damage::Header(o, b)),
        (0usize..1 << 20, proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(o, b)| Damage::Anywhere(o, b)),
        (0usize..1 << 20, 1usize..1 << 16, any::<u8>()).prop_map(|(o, n, b)| Damage::Fill(o, n, b)),
        (1usize..4096).prop_map(Damage::Grow),
    ]
}

fn apply(bytes: &[u8], d: &Damage) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let len = b.len();
    match d {
        Damage::Truncate(n) => b.truncate(n % len),
        Damage::Header(o, v) | Damage::Anywhere(o, v) => {
            for (i, x) in v.iter().enumerate() {
                let at = (o + i) % len;
                b[at] = *x;
            }
        }
        Damage::Fill(o, n, x) => {
            let o = o % len;
            let end = (o + n).min(len);
            b[o..end].fill(*x);
        }
        Damage::Grow(n) => b.extend(std::iter::repeat_n(0xa5, *n)),
    }
    b
}

/// An error must say which file it is about.
fn names_file(e: &RegionError, f: &Tmp) -> bool {
    e.to_string().contains(&*f.0.to_string_lossy())
}

proptest! {
    #![proptest_config(cases(256))]

    /// The usage file, damaged: opening it is an error naming it (a changed header, size or ABI) or it opens;
    /// then a process can claim a slot or gets an error, and garbage never lets the container's charge pass
    /// the limit; every call returns promptly.
    #[test]
    fn usage_region_damaged(d in damage(), ask in 1u64..(1 << 31)) {
        let (usage, _) = valid();
        let bytes = apply(usage, &d);
        let f = Tmp::new("usage");
        std::fs::write(&f.0, &bytes).expect("write");
        let t0 = Instant::now();
        match UsageRegion::open_existing(&f.0) {
            Err(e) => prop_assert!(names_file(&e, &f), "{}", e),
            Ok(r) => {
                prop_assert!(identity_intact(usage, &bytes, 32), "damaged header accepted: {:?}", d);
                let _ = r.processes();
                let _ = r.devices();
                let limit = 1u64 << 30;
                if let (Ok(slot), Ok(dev)) = (r.claim_slot(), r.device(&[7; 16])) {
                    let before = r.container_used(dev);
                    match r.charge(slot, dev, ask, Some(limit)) {
                        Ok(_) => prop_assert!(
                            r.container_used(dev) <= limit,
                            "charged {} with {} used before: {} over {}", ask, before, r.container_used(dev), limit
                        ),
                        Err(_) => prop_assert_eq!(r.slot_used(slot, dev), 0),
                    }
                    r.uncharge(slot, dev, u64::MAX);
                    prop_assert_eq!(r.slot_used(slot, dev), 0);
                    r.release_slot(slot);
                }
                r.reclaim_dead();
            }
        }
        prop_assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    }

    /// The limits file, damaged: the reader gets an error naming it, or a table; a damaged header never opens;
    /// every call returns within the reader's bounded wait.
    #[test]
    fn limits_region_damaged(d in damage()) {
        let (_, limits) = valid();
        let bytes = apply(limits, &d);
        let f = Tmp::new("limits");
        std::fs::write(&f.0, &bytes).expect("write");
        let t0 = Instant::now();
        match LimitsReader::open(&f.0) {
            Err(e) => prop_assert!(names_file(&e, &f), "{}", e),
            Ok(r) => {
                prop_assert!(identity_intact(limits, &bytes, 28), "damaged header accepted: {:?}", d);
                let _ = r.snapshot().for_device(Some(&[7; 16]), Some(0));
            }
        }
        prop_assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    }
}

/// Bytes of the headers that identify the layout: magic (0..8), ABI version (8..12), header size (12..16), total
/// size (16..24), device count (24..28) and, in the usage file, process count (28..32) — include/cuquota.h.
const IDENTITY: usize = 32;

/// Whether `got` kept the first `n` bytes of `orig` and its length (a file that opened must have).
fn identity_intact(orig: &[u8], got: &[u8], n: usize) -> bool {
    got.len() >= orig.len() && got[..n] == orig[..n]
}

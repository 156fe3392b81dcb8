//! Fault injection (`CUDASIM_FAULT`): chosen driver or NVML calls fail with a chosen error, at the Nth call or
//! at random, so tests can check what a program (and an interposer) does when the driver refuses.
//!
//! ```text
//! CUDASIM_FAULT=RULE[,RULE…]        CUDASIM_FAULT_SEED=<u64> (default 0)
//! RULE  = FUNCTION:WHEN:ERROR
//! WHEN  = N            the Nth call of FUNCTION in this process (counted from 1) fails, once
//!       | N+           every call from the Nth on fails
//!       | random(P)    each call fails with probability P (0 < P ≤ 1), drawn from the seed, the rule and the
//!                      call's number: the same seed gives the same faults
//! ERROR = a cuda.h CUresult name (`OUT_OF_MEMORY` or `CUDA_ERROR_OUT_OF_MEMORY`), an nvml.h nvmlReturn_t name
//!         for NVML functions (`GPU_IS_LOST` or `NVML_ERROR_GPU_IS_LOST`), a number, or `DEVICE_LOST`
//!         (CUDA_ERROR_UNKNOWN for driver calls — cuda.h has no dedicated code; NVML_ERROR_GPU_IS_LOST for NVML)
//! ```
//!
//! FUNCTION is an exported name as a program calls it (`cuMemAlloc_v2`, `nvmlDeviceGetMemoryInfo`); forms that
//! forward to another export (`_ptsz` twins) count as the function they forward to. A failed call does nothing
//! but return its error (nothing is allocated, freed or written). Counting is per process, and every caller in
//! the process counts — an interposer's own calls included, as on a real driver.
//!
//! A malformed value prints `cudasim: invalid CUDASIM_FAULT=…: why` once and fails every call (CUDA:
//! `CUDA_ERROR_INVALID_VALUE`, NVML: `NVML_ERROR_UNKNOWN`), so a typo never runs a test without its faults.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::types::{CUresult, NvmlReturn, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, NVML_ERROR_UNKNOWN};

/// When a rule fires.
#[derive(Clone, Copy, Debug, PartialEq)]
enum When {
    /// The Nth call only.
    Nth(u64),
    /// Every call from the Nth on.
    From(u64),
    /// Each call with this probability.
    Random(f64),
}

/// One `FUNCTION:WHEN:ERROR` rule.
#[derive(Debug)]
struct Rule {
    function: String,
    when: When,
    cuda: CUresult,
    nvml: NvmlReturn,
    calls: AtomicU64,
}

/// The parsed variables.
#[derive(Debug)]
struct Faults {
    rules: Vec<Rule>,
    seed: u64,
}

/// nvml.h's nvmlReturn_t error names (without the `NVML_ERROR_` prefix).
const NVML_ERRORS: &[(&str, NvmlReturn)] = &[
    ("UNINITIALIZED", 1),
    ("INVALID_ARGUMENT", 2),
    ("NOT_SUPPORTED", 3),
    ("NO_PERMISSION", 4),
    ("ALREADY_INITIALIZED", 5),
    ("NOT_FOUND", 6),
    ("INSUFFICIENT_SIZE", 7),
    ("INSUFFICIENT_POWER", 8),
    ("DRIVER_NOT_LOADED", 9),
    ("TIMEOUT", 10),
    ("IRQ_ISSUE", 11),
    ("LIBRARY_NOT_FOUND", 12),
    ("FUNCTION_NOT_FOUND", 13),
    ("CORRUPTED_INFOROM", 14),
    ("GPU_IS_LOST", 15),
    ("RESET_REQUIRED", 16),
    ("OPERATING_SYSTEM", 17),
    ("LIB_RM_VERSION_MISMATCH", 18),
    ("IN_USE", 19),
    ("MEMORY", 20),
    ("NO_DATA", 21),
    ("VGPU_ECC_NOT_SUPPORTED", 22),
    ("INSUFFICIENT_RESOURCES", 23),
    ("FREQ_NOT_SUPPORTED", 24),
    ("ARGUMENT_VERSION_MISMATCH", 25),
    ("DEPRECATED", 26),
    ("NOT_READY", 27),
    ("GPU_NOT_FOUND", 28),
    ("INVALID_STATE", 29),
    ("RESET_TYPE_NOT_SUPPORTED", 30),
    ("UNKNOWN", 999),
];

fn is_nvml(function: &str) -> bool {
    function.starts_with("nvml")
}

/// The error a rule names, for a function of either library.
fn parse_error(function: &str, s: &str) -> Result<(CUresult, NvmlReturn), String> {
    if let Ok(n) = s.parse::<u32>() {
        if n == 0 {
            return Err("error 0 is success, not a fault".into());
        }
        return Ok((n, n));
    }
    if s == "DEVICE_LOST" {
        return Ok((CUDA_ERROR_UNKNOWN, 15));
    }
    if is_nvml(function) {
        let name = s.strip_prefix("NVML_ERROR_").unwrap_or(s);
        NVML_ERRORS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, c)| (c, c))
            .ok_or_else(|| format!("`{s}` is not an nvmlReturn_t error name of nvml.h"))
    } else {
        let name = if s.starts_with("CUDA_ERROR_") {
            s.to_string()
        } else {
            format!("CUDA_ERROR_{s}")
        };
        crate::errors::cuda_error_code(&name)
            .filter(|&c| c != 0)
            .map(|c| (c, c))
            .ok_or_else(|| format!("`{s}` is not a CUresult error name of cuda.h"))
    }
}

fn parse_when(s: &str) -> Result<When, String> {
    if let Some(p) = s.strip_prefix("random(").and_then(|r| r.strip_suffix(')')) {
        let p: f64 = p
            .parse()
            .map_err(|_| format!("`{s}`: the probability must be a number"))?;
        if !(p > 0.0 && p <= 1.0) {
            return Err(format!("`{s}`: the probability must be in (0, 1]"));
        }
        return Ok(When::Random(p));
    }
    let (n, from) = match s.strip_suffix('+') {
        Some(n) => (n, true),
        None => (s, false),
    };
    match n.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(if from { When::From(n) } else { When::Nth(n) }),
        _ => Err(format!(
            "`{s}`: WHEN is N (the Nth call, from 1), N+ (from the Nth call on) or random(P)"
        )),
    }
}

fn parse(rules: &str, seed: Option<&str>) -> Result<Faults, String> {
    let seed = match seed {
        None => 0,
        Some(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("CUDASIM_FAULT_SEED={s:?} is not an unsigned integer"))?,
    };
    let mut out = Vec::new();
    for rule in rules.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let parts: Vec<&str> = rule.split(':').collect();
        let [function, when, error] = parts[..] else {
            return Err(format!("rule `{rule}`: expected FUNCTION:WHEN:ERROR"));
        };
        if !(function.starts_with("cu") || function.starts_with("nvml"))
            || !function.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!(
                "rule `{rule}`: `{function}` is not a driver (cu…) or NVML (nvml…) function name"
            ));
        }
        let when = parse_when(when).map_err(|e| format!("rule `{rule}`: {e}"))?;
        let (cuda, nvml) = parse_error(function, error).map_err(|e| format!("rule `{rule}`: {e}"))?;
        out.push(Rule {
            function: function.to_string(),
            when,
            cuda,
            nvml,
            calls: AtomicU64::new(0),
        });
    }
    Ok(Faults { rules: out, seed })
}

/// splitmix64: a fixed, well-mixed function of its input (the draws must not depend on anything but the seed,
/// the rule and the call's number).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Faults {
    /// Counts a call of `function`; the first rule that fires gives its error.
    fn check(&self, function: &str) -> Option<&Rule> {
        let mut hit = None;
        for (i, r) in self.rules.iter().enumerate() {
            if r.function != function {
                continue;
            }
            let n = r.calls.fetch_add(1, Ordering::Relaxed) + 1;
            let fires = match r.when {
                When::Nth(k) => n == k,
                When::From(k) => n >= k,
                When::Random(p) => {
                    let draw = mix(self.seed ^ mix(((i as u64) << 48) ^ n));
                    ((draw >> 11) as f64 / (1u64 << 53) as f64) < p
                }
            };
            if fires && hit.is_none() {
                hit = Some(r);
            }
        }
        hit
    }
}

/// The parsed `CUDASIM_FAULT` (read once per process); `Err` after printing why it is malformed.
fn faults() -> &'static Result<Option<Faults>, ()> {
    static F: OnceLock<Result<Option<Faults>, ()>> = OnceLock::new();
    F.get_or_init(|| {
        let Ok(v) = std::env::var("CUDASIM_FAULT") else {
            return Ok(None);
        };
        let seed = std::env::var("CUDASIM_FAULT_SEED").ok();
        match parse(&v, seed.as_deref()) {
            Ok(f) if f.rules.is_empty() => Ok(None),
            Ok(f) => Ok(Some(f)),
            Err(e) => {
                eprintln!("cudasim: invalid CUDASIM_FAULT={v}: {e}");
                Err(())
            }
        }
    })
}

/// The error a driver call `function` must return instead of running, if a rule fires for this call.
#[inline]
pub(crate) fn cuda(function: &str) -> Option<CUresult> {
    match faults() {
        Ok(None) => None,
        Ok(Some(f)) => f.check(function).map(|r| r.cuda),
        Err(()) => Some(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The error an NVML call `function` must return instead of running, if a rule fires for this call.
#[inline]
pub(crate) fn nvml(function: &str) -> Option<NvmlReturn> {
    match faults() {
        Ok(None) => None,
        Ok(Some(f)) => f.check(function).map(|r| r.nvml),
        Err(()) => Some(NVML_ERROR_UNKNOWN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(f: &Faults, function: &str, calls: u64) -> Vec<u64> {
        (1..=calls).filter(|_| f.check(function).is_some()).collect()
    }

    #[test]
    fn nth_and_from_nth() {
        let f = parse(
            "cuMemAlloc_v2:3:OUT_OF_MEMORY, cuCtxCreate_v2:2+:CUDA_ERROR_INVALID_CONTEXT",
            None,
        )
        .unwrap();
        assert_eq!(fired(&f, "cuMemAlloc_v2", 6), vec![3]);
        assert_eq!(fired(&f, "cuCtxCreate_v2", 4), vec![2, 3, 4]);
        assert_eq!(fired(&f, "cuMemFree_v2", 4), Vec::<u64>::new());
        assert_eq!(f.rules[0].cuda, 2);
        assert_eq!(f.rules[1].cuda, 201);
    }

    #[test]
    fn random_is_a_function_of_the_seed() {
        let a = parse("cuLaunchKernel:random(0.25):LAUNCH_FAILED", Some("7")).unwrap();
        let b = parse("cuLaunchKernel:random(0.25):LAUNCH_FAILED", Some("7")).unwrap();
        let c = parse("cuLaunchKernel:random(0.25):LAUNCH_FAILED", Some("8")).unwrap();
        let (fa, fb, fc) = (
            fired(&a, "cuLaunchKernel", 4000),
            fired(&b, "cuLaunchKernel", 4000),
            fired(&c, "cuLaunchKernel", 4000),
        );
        assert_eq!(fa, fb);
        assert_ne!(fa, fc);
        assert!((800..1200).contains(&fa.len()), "{} of 4000 at p=0.25", fa.len());
        assert_eq!(a.rules[0].cuda, 719);
    }

    #[test]
    fn nvml_names_and_device_lost() {
        let f = parse(
            "nvmlDeviceGetMemoryInfo:1:GPU_IS_LOST,nvmlInit_v2:1:NVML_ERROR_DRIVER_NOT_LOADED,\
             cuMemGetInfo_v2:1:DEVICE_LOST,nvmlDeviceGetCount_v2:1:DEVICE_LOST",
            None,
        )
        .unwrap();
        assert_eq!(f.rules[0].nvml, 15);
        assert_eq!(f.rules[1].nvml, 9);
        assert_eq!(f.rules[2].cuda, CUDA_ERROR_UNKNOWN);
        assert_eq!(f.rules[3].nvml, 15);
    }

    #[test]
    fn malformed_rules_say_what_is_wrong() {
        for (v, why) in [
            ("cuMemAlloc_v2:3", "FUNCTION:WHEN:ERROR"),
            ("cuMemAlloc_v2:0:OUT_OF_MEMORY", "WHEN is N"),
            ("cuMemAlloc_v2:x:OUT_OF_MEMORY", "WHEN is N"),
            ("cuMemAlloc_v2:random(1.5):OUT_OF_MEMORY", "(0, 1]"),
            ("cuMemAlloc_v2:random(abc):OUT_OF_MEMORY", "must be a number"),
            ("cuMemAlloc_v2:1:OUT_OF_MEMRY", "not a CUresult error name"),
            ("cuMemAlloc_v2:1:0", "success"),
            ("nvmlInit_v2:1:OUT_OF_MEMORY", "not an nvmlReturn_t"),
            ("malloc:1:OUT_OF_MEMORY", "not a driver"),
        ] {
            let e = parse(v, None).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
        assert!(parse("cuInit:1:3", Some("x"))
            .unwrap_err()
            .contains("CUDASIM_FAULT_SEED"));
    }
}

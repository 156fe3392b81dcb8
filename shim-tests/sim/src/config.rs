//! The simulator's configuration, parsed from the `CUDASIM_*` environment (DESIGN.md's simulator table).
//!
//! Pure parsing: `from_env` takes a lookup function so tests can feed it any environment. A bad value is an
//! error naming the variable and the value; cuInit / nvmlInit then fail. Only the process that creates the
//! shared state file uses its own configuration; later processes read it back from the file (`state.rs`).

/// Most devices one state file describes.
pub(crate) const MAX_DEVICES: usize = 16;

/// One simulated GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceConfig {
    /// Device memory in bytes.
    pub memory: u64,
    /// Streaming multiprocessor count.
    pub sms: u32,
    /// GPU UUID (the `GPU-…` name).
    pub uuid: [u8; 16],
}

/// The whole simulated machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SimConfig {
    pub devices: Vec<DeviceConfig>,
    /// Bytes charged per context.
    pub ctx_overhead: u64,
    /// Bytes charged per loaded module or library.
    pub module_overhead: u64,
    /// Allocation granularity in bytes (a power of two).
    pub granularity: u64,
    /// Kernel time per wave when the module does not declare one.
    pub wave_ns: u64,
    /// Copy and memset bandwidth in MB/s (`CUDASIM_COPY_GBPS` × 1000): their time on the device timeline.
    pub copy_mbps: u64,
    /// Copy engines (`CUDASIM_H2D_GBPS`, `CUDASIM_D2H_GBPS`), MB/s: host-to-device and device-to-host copies
    /// run on their direction's engine, next to the kernels; 0 = that direction runs on the device timeline at
    /// `copy_mbps`, as before engines existed.
    pub engine_mbps: [u64; 2],
    /// What cuDriverGetVersion reports (e.g. 13000).
    pub driver_version: u32,
    /// `CUDASIM_SCHED=slice`: the device time of one context switch between processes (`CUDASIM_SWITCH_US`);
    /// `None` = the serialised model (`CUDASIM_SCHED=serial`, the default), switches cost nothing.
    pub switch_ns: Option<u64>,
    /// The time-slicing model's time slice (`CUDASIM_QUANTUM_US`).
    pub quantum_ns: u64,
    /// `CUDASIM_MANAGED=migrate`: the unified memory model's latency per migrated 2 MiB unit
    /// (`CUDASIM_MANAGED_FAULT_US`); `None` = managed memory is resident and charged whole (`resident`, the
    /// default).
    pub managed_fault_ns: Option<u64>,
}

/// Default `CUDASIM_MANAGED_FAULT_US`: 20 µs per migrated 2 MiB unit.
pub(crate) const DEFAULT_MANAGED_FAULT_NS: u64 = 20_000;

/// Default `CUDASIM_SWITCH_US` of the time-slicing model, calibrated to the H200 (shim-tests/sim/README.md).
pub(crate) const DEFAULT_SWITCH_NS: u64 = 222_000;
/// Default `CUDASIM_QUANTUM_US`: 2 ms (docs/sm-limit.md, issue 36).
pub(crate) const DEFAULT_QUANTUM_NS: u64 = 2_000_000;

/// Parses a size: decimal digits with an optional `k`/`m`/`g`/`t` suffix (any case, optional trailing `b` or
/// `ib`), meaning ×1024ⁿ; no suffix = bytes.
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 10),
        'm' => (&t[..t.len() - 1], 20),
        'g' => (&t[..t.len() - 1], 30),
        't' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Parses a UUID written as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (the prefix and dashes are optional).
pub(crate) fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let s = s.trim();
    let s = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .unwrap_or(s);
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Formats `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (or with another prefix).
pub(crate) fn format_uuid(prefix: &str, u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The UUID a device gets when CUDASIM_UUIDS does not name one (stable, distinct per index and `salt`).
pub(crate) fn derived_uuid(index: usize, salt: u8) -> [u8; 16] {
    let mut u = [0u8; 16];
    let mut x: u64 = 0xcbf2_9ce4_8422_2325 ^ (index as u64) ^ ((salt as u64) << 32);
    for b in u.iter_mut() {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 29;
        *b = x as u8;
    }
    // RFC 4122 version 4 / variant bits, so tools that validate UUIDs accept them.
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// The MIG instance UUID of a device (each simulated GPU has one MIG instance).
pub(crate) fn mig_uuid(gpu: &[u8; 16]) -> [u8; 16] {
    let mut u = *gpu;
    u[0] ^= 0x5a;
    u[15] ^= 0xa5;
    u
}

fn err(var: &str, value: &str, why: &str) -> String {
    format!("cudasim: invalid {var}={value:?}: {why}")
}

/// A value or comma list with one entry per device (one value applies to all).
fn per_device<T: Copy>(
    var: &str,
    raw: Option<String>,
    n: usize,
    default: T,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    let Some(raw) = raw else {
        return Ok(vec![default; n]);
    };
    let items: Vec<&str> = raw.split(',').collect();
    let vals = items
        .iter()
        .map(|s| parse(s).ok_or_else(|| err(var, &raw, &format!("{:?} is not a valid value", s.trim()))))
        .collect::<Result<Vec<T>, String>>()?;
    match vals.len() {
        1 => Ok(vec![vals[0]; n]),
        l if l == n => Ok(vals),
        l => Err(err(var, &raw, &format!("{l} values for {n} devices"))),
    }
}

/// Reads the configuration through `get` (normally `std::env::var`).
pub(crate) fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<SimConfig, String> {
    let size = |var: &str, default: u64| -> Result<u64, String> {
        match get(var) {
            None => Ok(default),
            Some(v) => parse_size(&v).ok_or_else(|| err(var, &v, "expected a size like 16g, 256m or 4096")),
        }
    };
    let n = match get("CUDASIM_DEVICES") {
        None => 1,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n <= MAX_DEVICES => n,
            _ => return Err(err("CUDASIM_DEVICES", &v, &format!("expected 0..={MAX_DEVICES}"))),
        },
    };
    let memory = per_device("CUDASIM_MEMORY", get("CUDASIM_MEMORY"), n, 16u64 << 30, |s| {
        parse_size(s).filter(|m| *m > 0)
    })?;
    let sms = per_device("CUDASIM_SMS", get("CUDASIM_SMS"), n, 132u32, |s| {
        s.trim().parse::<u32>().ok().filter(|v| (1..=65536).contains(v))
    })?;
    let uuids = match get("CUDASIM_UUIDS") {
        None => (0..n).map(|i| derived_uuid(i, 0)).collect(),
        Some(raw) => {
            let list: Vec<&str> = raw.split(',').collect();
            if list.len() != n {
                return Err(err(
                    "CUDASIM_UUIDS",
                    &raw,
                    &format!("{} UUIDs for {n} devices", list.len()),
                ));
            }
            let parsed = list
                .iter()
                .map(|s| parse_uuid(s).ok_or_else(|| err("CUDASIM_UUIDS", &raw, &format!("bad UUID {s:?}"))))
                .collect::<Result<Vec<_>, String>>()?;
            for (i, u) in parsed.iter().enumerate() {
                if parsed[..i].contains(u) {
                    return Err(err("CUDASIM_UUIDS", &raw, "duplicate UUID"));
                }
            }
            parsed
        }
    };
    let granularity = size("CUDASIM_GRANULARITY", 2 << 20)?;
    if !granularity.is_power_of_two() || granularity < 4096 {
        return Err(err(
            "CUDASIM_GRANULARITY",
            &get("CUDASIM_GRANULARITY").unwrap_or_default(),
            "expected a power of two ≥ 4k",
        ));
    }
    let wave_ns = match get("CUDASIM_WAVE_NS") {
        None => 20_000,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| err("CUDASIM_WAVE_NS", &v, "expected nanoseconds"))?,
    };
    let copy_mbps = match get("CUDASIM_COPY_GBPS") {
        None => 25_000,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(g) if (0.001..=1e6).contains(&g) => (g * 1000.0).round() as u64,
            _ => return Err(err("CUDASIM_COPY_GBPS", &v, "expected GB/s, 0.001 to 1000000")),
        },
    };
    let mut engine_mbps = [0; 2];
    for (i, name) in ["CUDASIM_H2D_GBPS", "CUDASIM_D2H_GBPS"].into_iter().enumerate() {
        if let Some(v) = get(name) {
            engine_mbps[i] = match v.trim().parse::<f64>() {
                Ok(g) if (0.001..=1e6).contains(&g) => (g * 1000.0).round() as u64,
                _ => return Err(err(name, &v, "expected GB/s, 0.001 to 1000000")),
            };
        }
    }
    let driver_version = match get("CUDASIM_DRIVER_VERSION") {
        None => 13000,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(d) if (1000..1_000_000).contains(&d) => d,
            _ => return Err(err("CUDASIM_DRIVER_VERSION", &v, "expected a version like 13000")),
        },
    };
    let switch_ns = match get("CUDASIM_SCHED").as_deref().map(str::trim) {
        None | Some("serial") => match get("CUDASIM_SWITCH_US") {
            // A switch cost or quantum the serialised model would ignore is a mistake, not a setting.
            Some(v) => return Err(err("CUDASIM_SWITCH_US", &v, "only with CUDASIM_SCHED=slice")),
            None => None,
        },
        Some("slice") => Some(match get("CUDASIM_SWITCH_US") {
            None => DEFAULT_SWITCH_NS,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(us) if (0.0..=1e6).contains(&us) => (us * 1000.0).round() as u64,
                _ => {
                    return Err(err(
                        "CUDASIM_SWITCH_US",
                        &v,
                        "expected microseconds, 0 to 1000000",
                    ))
                }
            },
        }),
        Some(v) => return Err(err("CUDASIM_SCHED", v, "expected serial or slice")),
    };
    let quantum_ns = match get("CUDASIM_QUANTUM_US") {
        None => DEFAULT_QUANTUM_NS,
        Some(v) if switch_ns.is_none() => {
            return Err(err("CUDASIM_QUANTUM_US", &v, "only with CUDASIM_SCHED=slice"))
        }
        Some(v) => match v.trim().parse::<f64>() {
            Ok(us) if (1.0..=1e7).contains(&us) => (us * 1000.0).round() as u64,
            _ => {
                return Err(err(
                    "CUDASIM_QUANTUM_US",
                    &v,
                    "expected microseconds, 1 to 10000000",
                ))
            }
        },
    };
    let managed_fault_ns = match get("CUDASIM_MANAGED").as_deref().map(str::trim) {
        None | Some("resident") => match get("CUDASIM_MANAGED_FAULT_US") {
            // A cost the resident model would ignore is a mistake, not a setting.
            Some(v) => {
                return Err(err(
                    "CUDASIM_MANAGED_FAULT_US",
                    &v,
                    "only with CUDASIM_MANAGED=migrate",
                ))
            }
            None => None,
        },
        Some("migrate") => Some(match get("CUDASIM_MANAGED_FAULT_US") {
            None => DEFAULT_MANAGED_FAULT_NS,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(us) if (0.0..=1e6).contains(&us) => (us * 1000.0).round() as u64,
                _ => {
                    return Err(err(
                        "CUDASIM_MANAGED_FAULT_US",
                        &v,
                        "expected microseconds, 0 to 1000000",
                    ))
                }
            },
        }),
        Some(v) => return Err(err("CUDASIM_MANAGED", v, "expected resident or migrate")),
    };
    Ok(SimConfig {
        devices: (0..n)
            .map(|i| DeviceConfig {
                memory: memory[i],
                sms: sms[i],
                uuid: uuids[i],
            })
            .collect(),
        ctx_overhead: size("CUDASIM_CTX_OVERHEAD", 256 << 20)?,
        module_overhead: size("CUDASIM_MODULE_OVERHEAD", 2 << 20)?,
        granularity,
        wave_ns,
        copy_mbps,
        engine_mbps,
        driver_version,
        switch_ns,
        quantum_ns,
        managed_fault_ns,
    })
}

/// Largest `CUDASIM_HOST_PID_OFFSET` (pid + offset must stay a positive `i32`-sized pid).
pub(crate) const MAX_HOST_PID_OFFSET: u32 = 1 << 30;

/// This process's `CUDASIM_HOST_PID_OFFSET` (default 0): it models a pid namespace, NVML reporting
/// pid + offset for the process (its "host pid"). Per process, unlike the rest of the configuration.
pub(crate) fn host_pid_offset(get: impl Fn(&str) -> Option<String>) -> Result<u32, String> {
    const VAR: &str = "CUDASIM_HOST_PID_OFFSET";
    match get(VAR) {
        None => Ok(0),
        Some(v) => match v.trim().parse::<u32>() {
            Ok(o) if o <= MAX_HOST_PID_OFFSET => Ok(o),
            _ => Err(err(VAR, &v, &format!("expected 0..={MAX_HOST_PID_OFFSET}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16g"), Some(16 << 30));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("2mib"), Some(2 << 20));
        assert_eq!(parse_size("4kb"), Some(4096));
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("g"), None);
        assert_eq!(parse_size("1.5g"), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
    }

    #[test]
    fn defaults() {
        let c = from_env(env(&[])).unwrap();
        assert_eq!(c.devices.len(), 1);
        assert_eq!(c.devices[0].memory, 16 << 30);
        assert_eq!(c.devices[0].sms, 132);
        assert_eq!(c.ctx_overhead, 256 << 20);
        assert_eq!(c.module_overhead, 2 << 20);
        assert_eq!(c.granularity, 2 << 20);
        assert_eq!(c.wave_ns, 20_000);
        assert_eq!(c.copy_mbps, 25_000);
        let slow = from_env(env(&[("CUDASIM_COPY_GBPS", "0.1")])).unwrap();
        assert_eq!(slow.copy_mbps, 100);
        assert_eq!(c.engine_mbps, [0, 0]);
        let engines = from_env(env(&[("CUDASIM_H2D_GBPS", "50"), ("CUDASIM_D2H_GBPS", "0.5")])).unwrap();
        assert_eq!(engines.engine_mbps, [50_000, 500]);
        assert_eq!(c.driver_version, 13000);
        assert_eq!(c.switch_ns, None);
        let sliced = from_env(env(&[("CUDASIM_SCHED", "slice")])).unwrap();
        assert_eq!(sliced.switch_ns, Some(DEFAULT_SWITCH_NS));
        let set = from_env(env(&[("CUDASIM_SCHED", "slice"), ("CUDASIM_SWITCH_US", "12.5")])).unwrap();
        assert_eq!(set.switch_ns, Some(12_500));
        assert_eq!(set.quantum_ns, DEFAULT_QUANTUM_NS);
        assert_eq!(c.managed_fault_ns, None);
        let um = from_env(env(&[("CUDASIM_MANAGED", "migrate")])).unwrap();
        assert_eq!(um.managed_fault_ns, Some(DEFAULT_MANAGED_FAULT_NS));
        let um = from_env(env(&[
            ("CUDASIM_MANAGED", "migrate"),
            ("CUDASIM_MANAGED_FAULT_US", "2.5"),
        ]))
        .unwrap();
        assert_eq!(um.managed_fault_ns, Some(2_500));
    }

    #[test]
    fn lists_and_uuids() {
        let c = from_env(env(&[
            ("CUDASIM_DEVICES", "2"),
            ("CUDASIM_MEMORY", "1g,2g"),
            ("CUDASIM_SMS", "10"),
            (
                "CUDASIM_UUIDS",
                "GPU-00112233-4455-6677-8899-aabbccddeeff,GPU-ffeeddcc-bbaa-9988-7766-554433221100",
            ),
        ]))
        .unwrap();
        assert_eq!(c.devices[1].memory, 2 << 30);
        assert_eq!(c.devices[1].sms, 10);
        assert_eq!(
            format_uuid("GPU", &c.devices[0].uuid),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn errors_name_the_variable() {
        for (k, v) in [
            ("CUDASIM_MEMORY", "lots"),
            ("CUDASIM_DEVICES", "x"),
            ("CUDASIM_DEVICES", "17"),
            ("CUDASIM_SMS", "0"),
            ("CUDASIM_UUIDS", "GPU-nope"),
            ("CUDASIM_CTX_OVERHEAD", "1q"),
            ("CUDASIM_GRANULARITY", "3m"),
            ("CUDASIM_WAVE_NS", "fast"),
            ("CUDASIM_COPY_GBPS", "0"),
            ("CUDASIM_H2D_GBPS", "0"),
            ("CUDASIM_D2H_GBPS", "fast"),
            ("CUDASIM_DRIVER_VERSION", "13.0"),
            ("CUDASIM_SCHED", "fair"),
            ("CUDASIM_SWITCH_US", "100"),
            ("CUDASIM_QUANTUM_US", "2000"),
            ("CUDASIM_MANAGED", "paged"),
            ("CUDASIM_MANAGED_FAULT_US", "20"),
        ] {
            let e = from_env(env(&[(k, v)])).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
        let e = from_env(env(&[("CUDASIM_DEVICES", "2"), ("CUDASIM_MEMORY", "1g,2g,3g")])).unwrap_err();
        assert!(e.contains("CUDASIM_MEMORY"));
        let e = from_env(env(&[("CUDASIM_SCHED", "slice"), ("CUDASIM_SWITCH_US", "-1")])).unwrap_err();
        assert!(e.contains("CUDASIM_SWITCH_US"), "{e}");
        let e = from_env(env(&[("CUDASIM_SCHED", "slice"), ("CUDASIM_QUANTUM_US", "0")])).unwrap_err();
        assert!(e.contains("CUDASIM_QUANTUM_US"), "{e}");
        let e = from_env(env(&[
            ("CUDASIM_MANAGED", "migrate"),
            ("CUDASIM_MANAGED_FAULT_US", "x"),
        ]))
        .unwrap_err();
        assert!(e.contains("CUDASIM_MANAGED_FAULT_US"), "{e}");
    }

    #[test]
    fn host_pid_offsets() {
        assert_eq!(host_pid_offset(env(&[])), Ok(0));
        assert_eq!(
            host_pid_offset(env(&[("CUDASIM_HOST_PID_OFFSET", "100000")])),
            Ok(100_000)
        );
        for v in ["-1", "x", "", "1073741825", "1e5"] {
            let e = host_pid_offset(env(&[("CUDASIM_HOST_PID_OFFSET", v)])).unwrap_err();
            assert!(e.contains("CUDASIM_HOST_PID_OFFSET"), "{e}");
        }
    }

    #[test]
    fn derived_uuids_are_distinct() {
        let a = derived_uuid(0, 0);
        assert_ne!(a, derived_uuid(1, 0));
        assert_ne!(a, mig_uuid(&a));
        assert_eq!(parse_uuid(&format_uuid("GPU", &a)), Some(a));
    }
}

//! Reading the environment: HAMi-core's variable names and ours, conflicts between them, typo detection.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::Path;

use super::layer::{resolve, Layer};
use super::values::{
    parse_bool, parse_elastic_min, parse_hami_policy, parse_log_name, parse_log_number, parse_memory,
    parse_path, parse_priority, parse_reclaim_wait, parse_sm, parse_time_slice, parse_weight,
};
use super::{file, Config, ConfigError, LogLevel, MAX_ORDINAL};
use crate::visible_devices::VisibleDevices;

/// Every `CUQUOTA_*` name cuquota reads (the `_<i>` forms of the two limits are accepted too). Any other
/// `CUQUOTA_*` name is an error, except those under [`RESERVED_PREFIX`].
pub const KNOWN_VARIABLES: &[&str] = &[
    "CUQUOTA_MEMORY_LIMIT",
    "CUQUOTA_MEMORY_REQUEST",
    "CUQUOTA_SM_LIMIT",
    "CUQUOTA_POLICY",
    "CUQUOTA_WEIGHT",
    "CUQUOTA_PRIORITY",
    "CUQUOTA_CONFIG",
    "CUQUOTA_LIMITS_FILE",
    "CUQUOTA_LIMITS_REQUIRED",
    "CUQUOTA_PRIORITY_FILE",
    "CUQUOTA_USAGE_FILE",
    "CUQUOTA_LIBCUDA",
    "CUQUOTA_LIBNVML",
    "CUQUOTA_DISABLE",
    "CUQUOTA_LOG",
    "CUQUOTA_TIME_SLICE_US",
    "CUQUOTA_ELASTIC_MIN_BYTES",
    "CUQUOTA_RECLAIM_WAIT_MS",
];

/// `CUQUOTA_X_*` names are never reported as unknown: they are reserved for experimental or test-only knobs of
/// other components (the shim, the test harness), which read them themselves.
pub const RESERVED_PREFIX: &str = "CUQUOTA_X_";

/// How many `_<i>` ordinals [`Config::from_lookup`] probes.
pub const PROBED_ORDINALS: u32 = 64;

/// Where variable values come from: a full map (typo detection possible) or a lookup function.
struct Source<'a> {
    get: &'a dyn Fn(&str) -> Result<Option<String>, ConfigError>,
    /// Ordinals that have at least one `_<i>` variable (or the probe range for lookups).
    ordinals: BTreeSet<u32>,
}

impl Source<'_> {
    fn get(&self, name: &str) -> Result<Option<String>, ConfigError> {
        (self.get)(name)
    }
}

/// `from_env`: the OS environment, values possibly not UTF-8.
pub(super) fn from_vars_os(
    vars: impl Iterator<Item = (OsString, OsString)>,
    path_exists: &dyn Fn(&Path) -> bool,
) -> Result<Config, ConfigError> {
    let mut map: HashMap<String, Result<String, ConfigError>> = HashMap::new();
    for (k, v) in vars {
        match k.into_string() {
            Ok(k) => {
                let v = v
                    .into_string()
                    .map_err(|_| ConfigError::NotUnicode { var: k.clone() });
                insert_once(&mut map, k, v);
            }
            Err(k) => {
                let lossy = k.to_string_lossy().into_owned();
                if lossy.starts_with("CUQUOTA_") {
                    return Err(ConfigError::UnknownVariable {
                        var: lossy,
                        suggestion: None,
                    });
                }
            }
        }
    }
    from_map(map, path_exists)
}

/// `from_vars`: an explicit list.
pub(super) fn from_vars(
    vars: impl Iterator<Item = (String, String)>,
    path_exists: &dyn Fn(&Path) -> bool,
) -> Result<Config, ConfigError> {
    let mut map = HashMap::new();
    for (k, v) in vars {
        insert_once(&mut map, k, Ok(v));
    }
    from_map(map, path_exists)
}

/// Adds one environment entry. A name seen before with a different value becomes a [`ConfigError::Duplicate`],
/// reported only if cuquota reads that variable (`getenv` would take the first, a map the last).
fn insert_once(
    map: &mut HashMap<String, Result<String, ConfigError>>,
    k: String,
    v: Result<String, ConfigError>,
) {
    use std::collections::hash_map::Entry;
    match map.entry(k) {
        Entry::Vacant(e) => {
            e.insert(v);
        }
        Entry::Occupied(mut e) => {
            if *e.get() != v {
                let show = |x: &Result<String, ConfigError>| match x {
                    Ok(s) => s.clone(),
                    Err(_) => "(not UTF-8)".to_string(),
                };
                let dup = ConfigError::Duplicate {
                    var: e.key().clone(),
                    first: show(e.get()),
                    second: show(&v),
                };
                if !matches!(e.get(), Err(ConfigError::Duplicate { .. })) {
                    *e.get_mut() = Err(dup);
                }
            }
        }
    }
}

fn from_map(
    map: HashMap<String, Result<String, ConfigError>>,
    path_exists: &dyn Fn(&Path) -> bool,
) -> Result<Config, ConfigError> {
    let mut ordinals = BTreeSet::new();
    let mut names: Vec<&String> = map.keys().collect();
    names.sort(); // report the same error whatever the hash order
    for name in names {
        if let Some(i) = check_name(name)? {
            ordinals.insert(i);
        }
    }
    let get = |name: &str| map.get(name).cloned().transpose();
    build(&Source { get: &get, ordinals }, path_exists)
}

/// `from_lookup`: probes known names; cannot detect typos.
pub(super) fn from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
    path_exists: &dyn Fn(&Path) -> bool,
) -> Result<Config, ConfigError> {
    let get = |name: &str| Ok(lookup(name));
    build(
        &Source {
            get: &get,
            ordinals: (0..PROBED_ORDINALS).collect(),
        },
        path_exists,
    )
}

const INDEXED_PREFIXES: [&str; 4] = [
    "CUDA_DEVICE_MEMORY_LIMIT_",
    "CUDA_DEVICE_SM_LIMIT_",
    "CUQUOTA_MEMORY_LIMIT_",
    "CUQUOTA_SM_LIMIT_",
];

/// Validates one variable name. Returns the ordinal of a `_<i>` limit variable; errors on unknown `CUQUOTA_*`
/// names and malformed `_<i>` suffixes.
fn check_name(name: &str) -> Result<Option<u32>, ConfigError> {
    for prefix in INDEXED_PREFIXES {
        if let Some(idx) = name.strip_prefix(prefix) {
            return match canonical_ordinal(idx) {
                Some(i) => Ok(Some(i)),
                None => Err(ConfigError::UnknownVariable {
                    var: name.to_string(),
                    suggestion: None,
                }),
            };
        }
    }
    if name.starts_with("CUQUOTA_") && !name.starts_with(RESERVED_PREFIX) && !KNOWN_VARIABLES.contains(&name)
    {
        return Err(ConfigError::UnknownVariable {
            var: name.to_string(),
            suggestion: suggest(name),
        });
    }
    Ok(None)
}

/// A decimal ordinal written the way `"_%d"` writes it (no sign, no leading zero), below [`MAX_ORDINAL`].
fn canonical_ordinal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse::<u32>().ok().filter(|&i| i < MAX_ORDINAL)
}

/// The known name closest to `name` by edit distance, if it is close (≤ 3 edits).
fn suggest(name: &str) -> Option<&'static str> {
    KNOWN_VARIABLES
        .iter()
        .map(|k| (levenshtein(name, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Reads a HAMi variable and its cuquota twin, parses both and errors if both are set and disagree.
fn paired<T: PartialEq>(
    src: &Source<'_>,
    hami: &str,
    ours: &str,
    parse: &dyn Fn(&str, &str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    let h = src.get(hami)?;
    let o = src.get(ours)?;
    let hv = h.as_deref().map(|v| parse(hami, v)).transpose()?;
    let ov = o.as_deref().map(|v| parse(ours, v)).transpose()?;
    match (hv, ov) {
        (Some(a), Some(b)) if a != b => Err(ConfigError::Conflict {
            hami_var: hami.to_string(),
            hami_value: h.unwrap_or_default(),
            our_var: ours.to_string(),
            our_value: o.unwrap_or_default(),
        }),
        (a, b) => Ok(b.or(a)),
    }
}

/// `CUQUOTA_LOG`, else `LIBCUDA_LOG_LEVEL` (ours wins when both are set: a disagreement here is harmless).
pub(super) fn log_level(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LogLevel>, ConfigError> {
    match get("CUQUOTA_LOG") {
        Some(v) => parse_log_name("CUQUOTA_LOG", &v).map(Some),
        None => get("LIBCUDA_LOG_LEVEL")
            .map(|v| parse_log_number("LIBCUDA_LOG_LEVEL", &v))
            .transpose(),
    }
}

fn single<T>(
    src: &Source<'_>,
    var: &str,
    parse: impl Fn(&str, &str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    src.get(var)?.map(|v| parse(var, &v)).transpose()
}

fn build(src: &Source<'_>, path_exists: &dyn Fn(&Path) -> bool) -> Result<Config, ConfigError> {
    let mut env = Layer::default();

    // Opt-out first: the switches themselves must still be valid.
    let hami_off = single(src, "CUDA_DISABLE_CONTROL", parse_bool)?;
    let our_off = single(src, "CUQUOTA_DISABLE", parse_bool)?;
    env.disabled = match (hami_off, our_off) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(false) || b.unwrap_or(false)),
    };

    env.memory = paired(
        src,
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUQUOTA_MEMORY_LIMIT",
        &parse_memory,
    )?
    .filter(|&m| m != 0);
    env.sm = paired(src, "CUDA_DEVICE_SM_LIMIT", "CUQUOTA_SM_LIMIT", &parse_sm)?.filter(|&p| p != 0);
    // Every device's request; only ever lowers the agent's (`Policy::restrict`), never above a cap.
    env.memory_request = single(src, "CUQUOTA_MEMORY_REQUEST", parse_memory)?.filter(|&m| m != 0);
    if let (Some(r), Some(m)) = (env.memory_request, env.memory) {
        if r > m {
            return Err(ConfigError::InvalidValue {
                var: "CUQUOTA_MEMORY_REQUEST".into(),
                value: src
                    .get("CUQUOTA_MEMORY_REQUEST")?
                    .unwrap_or_else(|| r.to_string()),
                expected:
                    "a request at most the memory limit (CUQUOTA_MEMORY_LIMIT / CUDA_DEVICE_MEMORY_LIMIT)",
            });
        }
    }
    for &i in &src.ordinals {
        let indexed = |hami: &str, ours: &str| (format!("{hami}_{i}"), format!("{ours}_{i}"));
        let (hami, ours) = indexed("CUDA_DEVICE_MEMORY_LIMIT", "CUQUOTA_MEMORY_LIMIT");
        if let Some(m) = paired(src, &hami, &ours, &parse_memory)?.filter(|&m| m != 0) {
            env.device_memory.insert(i, m);
        }
        let (hami, ours) = indexed("CUDA_DEVICE_SM_LIMIT", "CUQUOTA_SM_LIMIT");
        if let Some(s) = paired(src, &hami, &ours, &parse_sm)?.filter(|&s| s != 0) {
            env.device_sm.insert(i, s);
        }
    }
    env.policy = paired(
        src,
        "GPU_CORE_UTILIZATION_POLICY",
        "CUQUOTA_POLICY",
        &parse_hami_policy,
    )?;
    env.weight = single(src, "CUQUOTA_WEIGHT", parse_weight)?;
    env.priority = paired(src, "CUDA_TASK_PRIORITY", "CUQUOTA_PRIORITY", &parse_priority)?;
    // Two files now: HAMi's layout at HAMi's path (for its monitor), ours beside it (docs/hami.md).
    env.usage_path = single(src, "CUQUOTA_USAGE_FILE", parse_path)?;
    env.hami_path = single(src, "CUDA_DEVICE_MEMORY_SHARED_CACHE", parse_path)?;
    env.limits_path = single(src, "CUQUOTA_LIMITS_FILE", parse_path)?;
    env.limits_required = single(src, "CUQUOTA_LIMITS_REQUIRED", parse_bool)?;
    env.priority_path = single(src, "CUQUOTA_PRIORITY_FILE", parse_path)?;
    // Log level: ours wins over HAMi's when both are set (a disagreement here is harmless).
    env.log_level = match single(src, "CUQUOTA_LOG", parse_log_name)? {
        Some(l) => Some(l),
        None => single(src, "LIBCUDA_LOG_LEVEL", parse_log_number)?,
    };
    env.time_slice_us = single(src, "CUQUOTA_TIME_SLICE_US", parse_time_slice)?;
    env.elastic_min_bytes = single(src, "CUQUOTA_ELASTIC_MIN_BYTES", parse_elastic_min)?;
    env.reclaim_wait_ms = single(src, "CUQUOTA_RECLAIM_WAIT_MS", parse_reclaim_wait)?;
    env.libcuda = single(src, "CUQUOTA_LIBCUDA", parse_path)?;
    env.libnvml = single(src, "CUQUOTA_LIBNVML", parse_path)?;

    let visible_devices = src
        .get("CUDA_VISIBLE_DEVICES")?
        .map(|v| VisibleDevices::parse(&v));
    let config_file = single(src, "CUQUOTA_CONFIG", parse_path)?;
    let file_layer = match &config_file {
        Some(path) => file::load(path)?,
        None => Layer::default(),
    };
    Ok(resolve(
        env,
        file_layer,
        visible_devices,
        config_file,
        path_exists,
    ))
}

//! Configuration tests: HAMi compatibility, conflicts, typos, the TOML file, precedence.

use std::io::Write;
use std::path::Path;

use super::*;
use crate::policy::PolicyKind;

fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())), &|_| {
        false
    })
}

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

#[test]
fn empty_environment_means_no_limits() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.memory_limit(0), None);
    assert_eq!(c.sm_limit(0), None);
    assert!(!c.has_limits());
    assert!(!c.disabled);
    assert_eq!(c.usage_path, Path::new(DEFAULT_USAGE_PATH));
    assert!(c.limits_paths.is_empty());
    assert_eq!(c.log_level, LogLevel::Warn);
}

#[test]
fn hami_memory_limits_with_per_device_override_and_fallback() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "3000m"),
        ("CUDA_DEVICE_MEMORY_LIMIT_2", "0"), // HAMi: 0 per device = fall back to the global value
    ])
    .unwrap();
    assert_eq!(c.memory_limit(0), Some(4 * G));
    assert_eq!(c.memory_limit(1), Some(3000 * M));
    assert_eq!(c.memory_limit(2), Some(4 * G));
    assert_eq!(c.memory_limit(7), Some(4 * G));
    let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "0x10m")]).unwrap();
    assert_eq!(c.memory_limit(0), None);
    assert_eq!(c.memory_limit(1), Some(16 * M));
}

#[test]
fn bad_size_names_variable_value_and_expectation() {
    let e = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "12x")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CUDA_DEVICE_MEMORY_LIMIT_1=\"12x\": expected a byte size HAMi-core reads the same way: digits and at most a \
         last k, m or g, such as 3000m or 4g (0 = no limit); HAMi-core would have read only the leading digits, \
         scaled by a last k, m or g (3000mb = 3000 bytes, 1t = 1 byte), and without any digits would have run this \
         container with no memory limit"
    );
    for bad in ["", "-1", "4 g", "1.5g", "99999999999999999999", "16777216t"] {
        assert!(
            matches!(
                cfg(&[("CUQUOTA_MEMORY_LIMIT", bad)]),
                Err(ConfigError::InvalidValue { .. })
            ),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn sm_limits() {
    let c = cfg(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("CUDA_DEVICE_SM_LIMIT_1", "100"),
        ("CUQUOTA_SM_LIMIT_2", "0"),
    ])
    .unwrap();
    assert_eq!(c.sm_limit(0), Some(30));
    assert_eq!(c.sm_limit(1), None, "100 = unlimited");
    assert_eq!(
        c.sm_limit(2),
        Some(30),
        "0 per device falls back to the global value"
    );
    assert_eq!(cfg(&[("CUDA_DEVICE_SM_LIMIT", "250")]).unwrap().sm_limit(0), None);
    assert_eq!(cfg(&[("CUDA_DEVICE_SM_LIMIT", "0")]).unwrap().sm_limit(0), None);
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "30%")]).unwrap().sm_limit(0),
        Some(30),
        "as HAMi-core"
    );
    assert!(cfg(&[("CUQUOTA_SM_LIMIT", "30%%")]).is_err());
    assert!(cfg(&[("CUDA_DEVICE_SM_LIMIT", "-5")]).is_err());
    let c = cfg(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("GPU_CORE_UTILIZATION_POLICY", "DISABLE"),
    ])
    .unwrap();
    assert_eq!(c.default_limits.kind, PolicyKind::Disabled);
    assert_eq!(c.sm_limit(0), None);
    assert_eq!(c.default_limits.sm, Some(30));
}

#[test]
fn ours_and_hami_agree_or_conflict() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
        ("CUQUOTA_MEMORY_LIMIT", "4g"),
    ])
    .unwrap();
    assert_eq!(c.memory_limit(0), Some(4 * G));
    let e = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
        ("CUQUOTA_MEMORY_LIMIT_0", "2g"),
    ])
    .unwrap_err();
    assert!(matches!(e, ConfigError::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_0=\"4g\""), "{e}");
    assert!(cfg(&[
        ("GPU_CORE_UTILIZATION_POLICY", "FORCE"),
        ("CUQUOTA_POLICY", "burst")
    ])
    .is_err());
    assert_eq!(
        cfg(&[
            ("GPU_CORE_UTILIZATION_POLICY", "force"),
            ("CUQUOTA_POLICY", "hard")
        ])
        .unwrap()
        .default_limits
        .kind,
        PolicyKind::Hard
    );
    // Not a pair any more: HAMi's file and cuquota's usage file are two files (docs/hami.md).
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/a"),
        ("CUQUOTA_USAGE_FILE", "/b"),
    ])
    .unwrap();
    assert_eq!(
        (c.hami_path.as_path(), c.usage_path.as_path()),
        (Path::new("/a"), Path::new("/b"))
    );
    assert!(cfg(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUQUOTA_SM_LIMIT", "40")]).is_err());
}

#[test]
fn unknown_cuquota_names_fail_closed() {
    let e = cfg(&[("CUQUOTA_MEMORY_LIMT", "4g")]).unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownVariable {
            var: "CUQUOTA_MEMORY_LIMT".into(),
            suggestion: Some("CUQUOTA_MEMORY_LIMIT")
        }
    );
    assert!(e.to_string().contains("did you mean CUQUOTA_MEMORY_LIMIT"));
    assert!(
        cfg(&[("CUQUOTA_MEMORY_LIMIT_01", "4g")]).is_err(),
        "non-canonical ordinal"
    );
    assert!(cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_x", "4g")]).is_err());
    assert!(
        cfg(&[("CUQUOTA_SM_LIMIT_5000", "4")]).is_err(),
        "ordinal too large"
    );
    // reserved namespace and unrelated CUDA_DEVICE_* names are fine
    assert!(cfg(&[
        ("CUQUOTA_X_THROTTLE_DEBUG", "1"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    ])
    .is_ok());
}

#[test]
fn policy_weight_log_disable() {
    let c = cfg(&[
        ("CUQUOTA_POLICY", "burst"),
        ("CUQUOTA_WEIGHT", "250"),
        ("LIBCUDA_LOG_LEVEL", "3"),
    ])
    .unwrap();
    assert_eq!(c.default_limits.kind, PolicyKind::Burst);
    assert_eq!(c.default_limits.weight, Some(250));
    assert_eq!(c.log_level, LogLevel::Info, "HAMi-core's 3 is information");
    assert_eq!(
        cfg(&[("GPU_CORE_UTILIZATION_POLICY", "DEFAULT")])
            .unwrap()
            .default_limits
            .kind,
        PolicyKind::Default
    );
    assert!(cfg(&[("CUQUOTA_POLICY", "soft")]).is_err());
    assert!(cfg(&[("CUQUOTA_WEIGHT", "0")]).is_err());
    assert!(cfg(&[("CUQUOTA_WEIGHT", "1001")]).is_err());
    assert_eq!(
        cfg(&[("LIBCUDA_LOG_LEVEL", "9")]).unwrap().log_level,
        LogLevel::Trace
    );
    assert_eq!(
        cfg(&[("LIBCUDA_LOG_LEVEL", "0"), ("CUQUOTA_LOG", "info")])
            .unwrap()
            .log_level,
        LogLevel::Info,
        "ours wins"
    );
    assert!(cfg(&[("CUQUOTA_LOG", "loud")]).is_err());
    assert!(cfg(&[("CUDA_DISABLE_CONTROL", "true")]).unwrap().disabled);
    assert!(cfg(&[("CUQUOTA_DISABLE", "1")]).unwrap().disabled);
    assert!(!cfg(&[("CUQUOTA_DISABLE", "0")]).unwrap().disabled);
    assert!(cfg(&[("CUQUOTA_DISABLE", "maybe")]).is_err());
}

#[test]
fn paths_and_default_limits_file() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x.cache"),
        ("CUQUOTA_LIBCUDA", "/sim/libcuda.so.1"),
    ])
    .unwrap();
    // HAMi's file at HAMi's path; ours beside it under a name HAMi's monitor does not pick up.
    assert_eq!(c.hami_path, Path::new("/tmp/x.cache"));
    assert_eq!(c.usage_path, Path::new("/tmp/x.cuquota-usage"));
    assert_eq!(
        usage_path_beside(Path::new("/tmp/shr")),
        Path::new("/tmp/shr.cuquota-usage")
    );
    assert_eq!(c.libcuda_path.as_deref(), Some(Path::new("/sim/libcuda.so.1")));
    // The default limits file applies whenever it exists, even when the variable names another one.
    let exists = |p: &Path| p == Path::new(DEFAULT_LIMITS_PATH);
    let c = Config::from_vars([("CUQUOTA_LIMITS_FILE", "/run/l")], &exists).unwrap();
    assert_eq!(
        c.limits_paths,
        vec![PathBuf::from(DEFAULT_LIMITS_PATH), PathBuf::from("/run/l")]
    );
    let c = Config::from_vars(Vec::<(String, String)>::new(), &exists).unwrap();
    assert_eq!(c.limits_paths, vec![PathBuf::from(DEFAULT_LIMITS_PATH)]);
    assert!(cfg(&[("CUQUOTA_USAGE_FILE", "")]).is_err());
}

#[test]
fn priority_file_from_the_variable_unless_the_agent_default_exists() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.priority_path, None);
    let c = cfg(&[("CUQUOTA_PRIORITY_FILE", "/run/p")]).unwrap();
    assert_eq!(c.priority_path.as_deref(), Some(Path::new("/run/p")));
    // The agent's default cannot be redirected by a process.
    let exists = |p: &Path| p == Path::new(DEFAULT_PRIORITY_PATH);
    let c = Config::from_vars([("CUQUOTA_PRIORITY_FILE", "/run/p")], &exists).unwrap();
    assert_eq!(c.priority_path.as_deref(), Some(Path::new(DEFAULT_PRIORITY_PATH)));
    assert!(cfg(&[("CUQUOTA_PRIORITY_FILE", "")]).is_err());
    let f = write_toml("priority_file = \"/run/q\"\n");
    let c = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap();
    assert_eq!(c.priority_path.as_deref(), Some(Path::new("/run/q")));
}

#[test]
fn lookup_probes_known_names() {
    let c = Config::from_lookup(|n| match n {
        "CUDA_DEVICE_MEMORY_LIMIT_3" => Some("1g".into()),
        "CUQUOTA_SM_LIMIT" => Some("20".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.memory_limit(3), Some(G));
    assert_eq!(c.memory_limit(0), None);
    assert_eq!(c.sm_limit(9), Some(20));
}

#[test]
fn visible_devices_parsed() {
    let c = cfg(&[("CUDA_VISIBLE_DEVICES", "1,0")]).unwrap();
    assert_eq!(c.visible_devices.unwrap().ordinal_of(0, "GPU-x", &[]), Some(1));
}

fn write_toml(text: &str) -> tempfile_path::TempPath {
    tempfile_path::TempPath::with_contents(text)
}

/// A minimal temp file helper (no extra dependency).
mod tempfile_path {
    use std::path::{Path, PathBuf};

    pub(crate) struct TempPath(PathBuf);

    impl TempPath {
        pub(crate) fn with_contents(text: &str) -> TempPath {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "cuquota-cfg-{}-{}.toml",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let mut f = std::fs::File::create(&p).unwrap();
            super::Write::write_all(&mut f, text.as_bytes()).unwrap();
            TempPath(p)
        }
        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn reclaim_wait_default_range() {
    assert_eq!(cfg(&[]).unwrap().reclaim_wait_ms, super::DEFAULT_RECLAIM_WAIT_MS);
    assert_eq!(
        cfg(&[("CUQUOTA_RECLAIM_WAIT_MS", "0")]).unwrap().reclaim_wait_ms,
        0
    );
    assert_eq!(
        cfg(&[("CUQUOTA_RECLAIM_WAIT_MS", "60000")])
            .unwrap()
            .reclaim_wait_ms,
        60_000
    );
    for bad in ["60001", "-1", "3s", ""] {
        let e = cfg(&[("CUQUOTA_RECLAIM_WAIT_MS", bad)]).unwrap_err().to_string();
        assert!(e.contains("CUQUOTA_RECLAIM_WAIT_MS"), "{bad}: {e}");
    }
}

#[test]
fn time_slice_default_range_and_file() {
    assert_eq!(cfg(&[]).unwrap().time_slice_us, super::DEFAULT_TIME_SLICE_US);
    assert_eq!(cfg(&[("CUQUOTA_TIME_SLICE_US", "0")]).unwrap().time_slice_us, 0);
    assert_eq!(
        cfg(&[("CUQUOTA_TIME_SLICE_US", "8000")]).unwrap().time_slice_us,
        8000
    );
    for bad in ["8001", "-1", "2ms", ""] {
        let e = cfg(&[("CUQUOTA_TIME_SLICE_US", bad)]).unwrap_err().to_string();
        assert!(e.contains("CUQUOTA_TIME_SLICE_US"), "{bad}: {e}");
    }
    let f = write_toml("time_slice_us = 1000\n");
    let p = f.path().to_str().unwrap();
    assert_eq!(cfg(&[("CUQUOTA_CONFIG", p)]).unwrap().time_slice_us, 1000);
    let c = cfg(&[("CUQUOTA_CONFIG", p), ("CUQUOTA_TIME_SLICE_US", "500")]).unwrap();
    assert_eq!(c.time_slice_us, 500, "the environment wins");
    let f = write_toml("time_slice_us = 9000\n");
    assert!(cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).is_err());
}

#[test]
fn toml_file_and_precedence() {
    let f = write_toml(
        r#"
memory_limit = "8g"
sm_limit = 40
policy = "burst"
weight = 10
usage_file = "/tmp/from-file"

[[device]]
index = 1
memory_limit = 1073741824
sm_limit = "20"

[[device]]
index = 2
memory_limit = "2g"
"#,
    );
    let p = f.path().to_str().unwrap();
    let c = cfg(&[("CUQUOTA_CONFIG", p)]).unwrap();
    assert_eq!(c.memory_limit(0), Some(8 * G));
    assert_eq!(c.memory_limit(1), Some(G));
    assert_eq!(c.sm_limit(1), Some(20));
    assert_eq!(c.sm_limit(2), Some(40));
    assert_eq!(c.default_limits.kind, PolicyKind::Burst);
    assert_eq!(c.default_limits.weight, Some(10));
    assert_eq!(c.usage_path, Path::new("/tmp/from-file"));
    assert_eq!(c.config_file.as_deref(), Some(f.path()));

    // env wins: env per-device > env global > file per-device > file global
    let c = cfg(&[
        ("CUQUOTA_CONFIG", p),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUQUOTA_MEMORY_LIMIT_2", "3g"),
    ])
    .unwrap();
    assert_eq!(c.memory_limit(0), Some(4 * G));
    assert_eq!(c.memory_limit(1), Some(4 * G));
    assert_eq!(c.memory_limit(2), Some(3 * G));
    assert_eq!(c.sm_limit(1), Some(20));
}

#[test]
fn toml_errors_are_typed() {
    let f = write_toml("memory_limt = \"4g\"\n");
    let e = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap_err();
    assert!(matches!(e, ConfigError::FileParse { .. }), "{e}");
    assert!(e.to_string().contains("memory_limt"), "{e}");

    let f = write_toml("[[device]]\nindex = 0\nmemory_limit = \"12x\"\n");
    let e = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap_err();
    assert!(
        matches!(&e, ConfigError::FileValue { key, .. } if key == "device[0].memory_limit"),
        "{e}"
    );

    let f = write_toml("[[device]]\nindex = 0\n[[device]]\nindex = 0\n");
    assert!(
        cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).is_err(),
        "duplicate index"
    );

    let e = cfg(&[("CUQUOTA_CONFIG", "/nonexistent/cuquota.toml")]).unwrap_err();
    assert!(matches!(e, ConfigError::FileRead { .. }), "{e}");
}

#[test]
fn non_utf8_value_is_an_error_only_when_read() {
    use std::os::unix::ffi::OsStringExt;
    let bad = std::ffi::OsString::from_vec(vec![0xff, 0xfe]);
    let e = env::from_vars_os(
        [("CUQUOTA_MEMORY_LIMIT".into(), bad.clone())].into_iter(),
        &|_| false,
    )
    .unwrap_err();
    assert_eq!(
        e,
        ConfigError::NotUnicode {
            var: "CUQUOTA_MEMORY_LIMIT".into()
        }
    );
    assert!(env::from_vars_os([("SOMETHING_ELSE".into(), bad)].into_iter(), &|_| false).is_ok());
}

#[test]
fn a_variable_set_twice_with_different_values_is_an_error() {
    // execve can pass the same name twice; getenv (the driver, HAMi) reads the first, a map keeps the last.
    // Neither choice is safe for a limit, so two different values are an error when the variable is read.
    let e = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
    ])
    .unwrap_err();
    assert!(
        matches!(&e, ConfigError::Duplicate { var, .. } if var == "CUDA_DEVICE_MEMORY_LIMIT"),
        "{e}"
    );
    assert!(
        e.to_string().contains("\"0\"") && e.to_string().contains("\"4g\""),
        "{e}"
    );
    let e = env::from_vars_os(
        [
            ("CUDA_VISIBLE_DEVICES".into(), "0".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "1".into()),
        ]
        .into_iter(),
        &|_| false,
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Duplicate { .. }), "{e}");
    // The same value twice is harmless; so are duplicates of variables cuquota does not read.
    let c = cfg(&[
        ("CUQUOTA_SM_LIMIT", "30"),
        ("CUQUOTA_SM_LIMIT", "30"),
        ("PATH", "/a"),
        ("PATH", "/b"),
    ])
    .unwrap();
    assert_eq!(c.sm_limit(0), Some(30));
}

#[test]
fn priority_from_hami_ours_and_the_file() {
    use crate::policy::Priority;
    let prio = |vars: &[(&str, &str)]| cfg(vars).map(|c| c.policy(3).priority);
    assert_eq!(prio(&[]).unwrap(), None);
    assert_eq!(
        prio(&[("CUDA_TASK_PRIORITY", "0")]).unwrap(),
        Some(Priority::High)
    );
    assert_eq!(prio(&[("CUDA_TASK_PRIORITY", "1")]).unwrap(), Some(Priority::Low));
    assert_eq!(
        prio(&[("CUQUOTA_PRIORITY", "High")]).unwrap(),
        Some(Priority::High)
    );
    assert_eq!(
        prio(&[("CUDA_TASK_PRIORITY", "1"), ("CUQUOTA_PRIORITY", "low")]).unwrap(),
        Some(Priority::Low),
        "both names, same meaning"
    );
    let e = cfg(&[("CUDA_TASK_PRIORITY", "0"), ("CUQUOTA_PRIORITY", "low")]).unwrap_err();
    assert!(matches!(e, ConfigError::Conflict { .. }), "{e}");
    // HAMi-core and its monitor take any larger number as a lower priority.
    assert_eq!(prio(&[("CUDA_TASK_PRIORITY", "2")]).unwrap(), Some(Priority::Low));
    // No digits: HAMi-core's atoi reads 0, high priority; refused, saying so.
    let e = cfg(&[("CUDA_TASK_PRIORITY", "urgent")]).unwrap_err();
    assert!(e.to_string().contains("HAMi-core would have read"), "{e}");
    assert!(cfg(&[("CUDA_TASK_PRIORITY", "-1")]).is_err());
    assert!(cfg(&[("CUQUOTA_PRIORITY", "urgent")]).is_err());

    let f = write_toml("priority = \"low\"\n");
    let c = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap();
    assert_eq!(c.default_limits.priority, Some(Priority::Low));
    let f = write_toml("priority = 7\n");
    let e = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap_err();
    assert!(
        matches!(&e, ConfigError::FileValue { key, .. } if key == "priority"),
        "{e}"
    );
}

#[test]
fn limits_required_by_env_or_by_the_marker_the_env_cannot_undo() {
    let none = |_: &Path| false;
    let marker = |p: &Path| p == Path::new(LIMITS_REQUIRED_MARKER);
    let c = Config::from_vars(Vec::<(String, String)>::new(), &none).unwrap();
    assert!(!c.limits_required);
    let c = Config::from_vars([("CUQUOTA_LIMITS_REQUIRED", "1")], &none).unwrap();
    assert!(c.limits_required);
    let c = Config::from_vars([("CUQUOTA_LIMITS_REQUIRED", "0")], &marker).unwrap();
    assert!(
        c.limits_required,
        "the marker holds whatever the environment says"
    );
    let e = Config::from_vars([("CUQUOTA_LIMITS_REQUIRED", "perhaps")], &none).unwrap_err();
    assert!(e.to_string().contains("CUQUOTA_LIMITS_REQUIRED"), "{e}");
}

/// Issue 25: each value HAMi's device plugin and users set is read as HAMi-core reads it, except where HAMi-core
/// fails open: there the error says what HAMi-core would have done (docs/hami.md).
#[test]
fn hami_knobs_are_read_as_hami_core_reads_them() {
    let log = |v: &str| cfg(&[("LIBCUDA_LOG_LEVEL", v)]).unwrap().log_level;
    // HAMi-core: errors always, 2 (its default) warnings, 3 information, 4 debugging; atoi, so no digits = 0.
    assert_eq!(log("0"), LogLevel::Error);
    assert_eq!(log("1"), LogLevel::Error);
    assert_eq!(log("2"), LogLevel::Warn);
    assert_eq!(log("3"), LogLevel::Info);
    assert_eq!(log("4"), LogLevel::Debug);
    assert_eq!(log("9"), LogLevel::Trace);
    assert_eq!(
        log("verbose"),
        LogLevel::Error,
        "a log level never fails a process"
    );
    // An unknown utilisation policy is HAMi-core's default (the limits apply); ours stays strict.
    let kind = |k: &str, v: &str| cfg(&[(k, v)]).map(|c| c.default_limits.kind);
    assert_eq!(
        kind("GPU_CORE_UTILIZATION_POLICY", "auto").unwrap(),
        PolicyKind::Default
    );
    assert_eq!(
        kind("GPU_CORE_UTILIZATION_POLICY", "").unwrap(),
        PolicyKind::Default
    );
    assert!(kind("CUQUOTA_POLICY", "auto").is_err());
    // `50%` is 50, as HAMi-core reads it.
    assert_eq!(
        cfg(&[("CUDA_DEVICE_SM_LIMIT", "50%")]).unwrap().sm_limit(0),
        Some(50)
    );
    // HAMi-core fails open on these (no limit at all): refused, naming what HAMi-core would have done.
    for (var, what) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "no memory limit"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "no memory limit"),
        ("CUDA_DEVICE_SM_LIMIT", "no SM limit"),
    ] {
        let e = cfg(&[(var, "lots")]).unwrap_err().to_string();
        assert!(
            e.contains(var) && e.contains("HAMi-core") && e.contains(what),
            "{e}"
        );
    }
    let e = cfg(&[("CUQUOTA_MEMORY_LIMIT", "lots")]).unwrap_err().to_string();
    assert!(
        !e.contains("HAMi-core"),
        "our own names do not speak of HAMi-core: {e}"
    );
}

#[test]
fn a_memory_request_from_the_environment_is_checked_against_the_limit() {
    // Control: a request at most the cap is every device's, and restricts nothing else.
    let c = cfg(&[("CUQUOTA_MEMORY_LIMIT", "4g"), ("CUQUOTA_MEMORY_REQUEST", "1g")]).unwrap();
    assert_eq!(c.policy(3).memory_request, Some(G));
    assert_eq!(c.policy(3).memory, Some(4 * G));
    assert_eq!(
        cfg(&[("CUQUOTA_MEMORY_REQUEST", "0")])
            .unwrap()
            .policy(0)
            .memory_request,
        None
    );
    // Bad input: above the limit, or not a size, names the variable and the value.
    let e = cfg(&[("CUQUOTA_MEMORY_LIMIT", "1g"), ("CUQUOTA_MEMORY_REQUEST", "2g")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CUQUOTA_MEMORY_REQUEST=\"2g\"") && e.contains("at most the memory limit"),
        "{e}"
    );
    let e = cfg(&[("CUQUOTA_MEMORY_REQUEST", "2x")]).unwrap_err().to_string();
    assert!(e.contains("CUQUOTA_MEMORY_REQUEST=\"2x\""), "{e}");
    // The TOML file: the same key, the same check, naming the file's key.
    let f = write_toml("memory_limit = \"4g\"\nmemory_request = \"3g\"\n");
    let c = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).unwrap();
    assert_eq!(c.policy(0).memory_request, Some(3 * G));
    let f = write_toml("memory_limit = \"4g\"\nmemory_request = \"5g\"\n");
    let e = cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("memory_request") && e.contains("at most memory_limit"),
        "{e}"
    );
    let f = write_toml("memory_reqest = \"1g\"\n");
    assert!(
        cfg(&[("CUQUOTA_CONFIG", f.path().to_str().unwrap())]).is_err(),
        "unknown key"
    );
    // A typo is an unknown variable, as for every CUQUOTA_ name.
    assert!(matches!(
        cfg(&[("CUQUOTA_MEMORY_REQEST", "1g")]),
        Err(ConfigError::UnknownVariable { .. })
    ));
}

#[test]
fn elastic_min_bytes_default_range_and_errors() {
    assert_eq!(cfg(&[]).unwrap().elastic_min_bytes, 2 << 20);
    let set = |v| cfg(&[("CUQUOTA_ELASTIC_MIN_BYTES", v)]);
    assert_eq!(set("64k").unwrap().elastic_min_bytes, 64 << 10);
    assert_eq!(set("16m").unwrap().elastic_min_bytes, 16 << 20);
    for bad in ["0", "4k", "2t", "-1", "lots", ""] {
        let e = set(bad).unwrap_err().to_string();
        assert!(
            e.contains("CUQUOTA_ELASTIC_MIN_BYTES") && e.contains("64k"),
            "{bad}: {e}"
        );
    }
}

//! The driver-facts probe (`bench/driver_facts.c`, issue 39 item 6) on the simulator: its table is complete, and
//! its answers are the ones the simulator models (shim-tests/sim/README.md): host VMM memory maps at the same
//! address and keeps every byte, a kernel may touch it, `cuMemUnmap` does not wait for a kernel that has yet to
//! touch the range (which then fails with `CUDA_ERROR_ILLEGAL_ADDRESS`), copies run at the modelled engines'
//! bandwidth. Beside it, the controls that show the probe reports what the driver did rather than what it
//! expects: a refused same-address map is a "no", and a fact that dies leaves its rows saying so.
//!
//! Needs the debug `libcudasim.so` (`cargo build -p cuquota-sim`); no libcuquota.so is loaded.

use shim_tests::{compile_c, workspace_root, Output, Sim};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Every key the table has, in its order.
const KEYS: &[&str] = &[
    "device",
    "granularity",
    "remap_host",
    "remap_host_numa",
    "kernel_host",
    "unmap_sync",
    "cost_device_2MiB",
    "cost_device_64MiB",
    "cost_device_1GiB",
    "cost_host_2MiB",
    "cost_host_64MiB",
    "cost_host_1GiB",
    "bw_h2d_pinned",
    "bw_h2d_pageable",
    "bw_d2h_pinned",
    "bw_d2h_pageable",
];

fn probe() -> PathBuf {
    let root = workspace_root();
    compile_c(
        "driver_facts",
        &root.join("bench/driver_facts.c"),
        &[&root.join("bench/elastic_common.h")],
        &["-lcuda", "-ldl"],
    )
}

/// Runs the probe on a fresh simulated GPU (4 SMs, copy engines of 2 GB/s host-to-device and 4 GB/s back) with
/// `env` added; returns the table's answers by key and the output.
fn facts(env: &[(&str, &str)]) -> (BTreeMap<String, String>, Output) {
    let mut sim = Sim::new()
        .sms("4")
        .env("CUDASIM_H2D_GBPS", "2")
        .env("CUDASIM_D2H_GBPS", "4");
    for (k, v) in env {
        sim = sim.env(k, v);
    }
    let sim = sim.build();
    let out = sim
        .cmd_path(probe())
        .no_preload()
        .env("FACTS_REPS", "3")
        // small copies: the simulator moves their bytes on the host inside the call, which must end before the
        // copy is due on the timeline (100 ms behind the probe's blocking kernel), also on a starved host
        .env("FACTS_BW_MIB", "8")
        .timeout(Duration::from_secs(180))
        .run();
    let mut rows = BTreeMap::new();
    for l in &out.lines {
        let cells: Vec<&str> = l.split(" | ").collect();
        if let [first, answer, ..] = cells[..] {
            if let Some(key) = first.strip_prefix("| ").filter(|k| KEYS.contains(k)) {
                rows.insert(key.to_string(), answer.to_string());
            }
        }
    }
    (rows, out)
}

/// The GB/s a bandwidth answer measured with events.
fn events_gbps(answer: &str, out: &Output) -> f64 {
    answer
        .split(" GB/s (events)")
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no events figure in `{answer}`:{out:?}"))
}

#[test]
fn the_table_is_complete_and_says_what_the_simulator_models() {
    let (rows, out) = facts(&[]);
    assert!(out.success(), "the probe failed:{out:?}");
    for key in KEYS {
        let a = rows.get(*key).unwrap_or_else(|| panic!("no row {key}:{out:?}"));
        assert!(!a.starts_with("no answer"), "{key}: {a}:{out:?}");
    }
    assert!(
        out.lines
            .iter()
            .any(|l| l.starts_with("facts: 16 rows, 16 answered, 0 without an answer")),
        "{out:?}"
    );
    for key in ["remap_host", "remap_host_numa"] {
        assert!(
            rows[key].starts_with("yes: same address to host and back, 8 MiB intact both ways")
                && rows[key].ends_with("took 0 MiB of device memory"),
            "{key}: {}:{out:?}",
            rows[key]
        );
    }
    assert!(rows["kernel_host"].starts_with("works:"), "{out:?}");
    let u = &rows["unmap_sync"];
    assert!(
        u.starts_with("no: ") && u.contains("kernel then: CUDA_ERROR_ILLEGAL_ADDRESS"),
        "unmap_sync: {u}:{out:?}"
    );
    for key in KEYS.iter().filter(|k| k.starts_with("cost_")) {
        let figures: Vec<f64> = rows[*key]
            .trim_end_matches(" us")
            .split(", ")
            .filter_map(|f| f.rsplit(' ').next()?.parse().ok())
            .collect();
        assert_eq!(figures.len(), 5, "{key}: {}:{out:?}", rows[*key]);
    }
    // The engines' bandwidth, from events (the timeline): a probe that timed the wrong thing is far off.
    for (key, model) in [
        ("bw_h2d_pinned", 2.0),
        ("bw_h2d_pageable", 2.0),
        ("bw_d2h_pinned", 4.0),
        ("bw_d2h_pageable", 4.0),
    ] {
        let got = events_gbps(&rows[key], &out);
        assert!(
            got > model * 0.85 && got < model * 1.02,
            "{key}: {got} GB/s against the modelled {model}:{out:?}"
        );
    }
}

/// The control: with the same-address map refused (`CUDASIM_FAULT`: the third cuMemMap of each fact's process,
/// the host allocation at the range's address in `remap_*`), the probe answers "no" naming the step.
#[test]
fn a_refused_same_address_map_is_answered_no() {
    let (rows, out) = facts(&[("CUDASIM_FAULT", "cuMemMap:3:NOT_SUPPORTED")]);
    assert!(out.success(), "{out:?}");
    for key in ["remap_host", "remap_host_numa"] {
        assert_eq!(
            rows[key], "no: cuMemMap of the host allocation at the same address: CUDA_ERROR_NOT_SUPPORTED",
            "{out:?}"
        );
    }
    assert!(rows["kernel_host"].starts_with("works:"), "{out:?}");
}

/// The control: facts that die (their module refused: the facts with a kernel) leave rows that say so, and the
/// probe fails.
#[test]
fn a_fact_that_dies_leaves_no_answer_rows() {
    let (rows, out) = facts(&[("CUDASIM_FAULT", "cuModuleLoadData:1:UNKNOWN")]);
    assert!(!out.success(), "{out:?}");
    let dead = [
        "kernel_host",
        "unmap_sync",
        "bw_h2d_pinned",
        "bw_h2d_pageable",
        "bw_d2h_pinned",
        "bw_d2h_pageable",
    ];
    for key in dead {
        assert!(
            rows[key].starts_with("no answer: exit 1"),
            "{key}: {}:{out:?}",
            rows[key]
        );
    }
    assert_eq!(rows.len(), KEYS.len(), "{out:?}");
    assert!(
        out.lines
            .iter()
            .any(|l| l.starts_with("facts: 16 rows, 10 answered, 6 without an answer")),
        "{out:?}"
    );
}

/// Fail closed: a setting that is not a number in its range stops the probe before any fact runs, naming it.
#[test]
fn a_bad_setting_is_refused_naming_it() {
    let sim = Sim::new().build();
    for (var, value) in [
        ("FACTS_REPS", "0"),
        ("FACTS_BW_MIB", "64m"),
        ("FACTS_TIMEOUT", "-1"),
    ] {
        let out = sim.cmd_path(probe()).no_preload().env(var, value).run();
        assert_eq!(out.status.code(), Some(2), "{var}={value}:{out:?}");
        assert!(
            out.stderr.contains(&format!("invalid {var}={value}")) && out.lines.is_empty(),
            "{var}={value}:{out:?}"
        );
    }
}

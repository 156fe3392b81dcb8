//! #11 class 4, a launch is charged to the device that does the work: the attack (`c/hostile.c stream_device`)
//! launches onto a stream of device 1's context while device 0's context is current — a context-less `CUkernel`
//! (which the driver runs in the stream's context) and a graph made in device 1's context. With a hard 30 % on
//! device 1 only, a throttle that asks the current context which device it is charges device 0 (no limit) and the
//! work runs on device 1 at ~100 %. The counterpart (limit on device 0 only) must leave device 1 untouched: the
//! launches are not charged to the current context's device either.
//!
//! Shares come from the simulator's device timeline (docs/testing.md); 1 ms kernels, one program at a time.

use shim_tests::{compile_c, heavy, workspace_root, Sim, Window};
use std::path::PathBuf;
use std::time::Duration;

fn hostile() -> PathBuf {
    compile_c(
        "hostile",
        &workspace_root().join("shim-tests/c/hostile.c"),
        &[],
        &["-lcuda"],
    )
}

/// Runs the attack on `path` for `secs` under `env` on a fresh 2-device simulator: the launch window and the
/// simulator.
fn attack(path: &str, env: &[(&str, &str)], secs: f64) -> (Sim, Window) {
    let _h = heavy();
    let sim = Sim::new().devices(2).build();
    let mut c = sim
        .cmd_path(hostile())
        .timeout(Duration::from_secs_f64(secs * 4.0 + 30.0))
        .args(&format!("stream_device {path} {secs} 1000000"));
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    (sim, out.window())
}

#[track_caller]
fn assert_band(what: &str, share: f64, lo: f64, hi: f64) {
    println!("{what}: {share:.1} % (band [{lo}, {hi}])");
    assert!(
        (lo..=hi).contains(&share),
        "{what}: {share:.1} % of device 1, outside [{lo}, {hi}]"
    );
}

const HARD30_ON_1: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT_1", "30"), ("CUQUOTA_POLICY", "hard")];
const HARD30_ON_0: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT_0", "30"), ("CUQUOTA_POLICY", "hard")];

#[test]
fn a_launch_onto_another_devices_stream_is_charged_to_that_device() {
    for path in ["kernel", "graph"] {
        let (sim, w) = attack(path, HARD30_ON_1, 2.0);
        // The work ran on device 1, none on device 0 (else the attack measured nothing).
        assert_eq!(sim.busy_ns(0, w.pid, w.t0, w.end), 0, "{path}: work on device 0");
        assert_band(
            &format!("{path}: hard 30 % on device 1"),
            sim.share_pct(1, w.pid, w.t0, w.end),
            5.0,
            45.0,
        );
    }
}

#[test]
fn the_current_contexts_limit_does_not_throttle_another_device() {
    let (sim, w) = attack("kernel", HARD30_ON_0, 1.0);
    assert_band(
        "kernel: hard 30 % on device 0 only",
        sim.share_pct(1, w.pid, w.t0, w.end),
        80.0,
        100.0,
    );
}

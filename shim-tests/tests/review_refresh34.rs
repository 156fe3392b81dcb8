//! Review of 2055e57 (`Devices::refresh` one at a time, `seen` stored once the limits are in force): a device
//! whose policy `Devices::learn` computed before a limits change, but whose table slot it published after a
//! refresh by another thread ran, kept the old limits (the refresh skipped the unset slot and stored the seq as
//! seen), here 258 MiB under a 64 MiB cap and ~95 % under a hard 20 %. The window is widened by a full pipe on
//! the program's own stderr. The three `..._keeps_...` / `..._stalls_...` tests failed on 6a55bdd and before
//! 2055e57 alike; `learn` now works the limits out and publishes the device under the refresh lock. Judged by
//! the simulator's own used bytes and device timeline; the control passes either way.

use shim_tests::{compile_c, workspace_root, Sim, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "review_refresh34",
        &workspace_root().join("shim-tests/c/review_refresh34.c"),
        &[],
        &["-lcuda", "-lnvidia-ml", "-ldl", "-lpthread"],
    )
}

/// Control (passes): the same steps without the stall (thread 1 learns device 0 before the agent's write).
#[test]
fn review_refresh34_control_without_the_stall_the_cap_applies() {
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut p = sim
        .cmd_path(prog())
        .env("CUQUOTA_LOG", "info")
        .env("CQ_NO_STALL", "1")
        .arg(go.to_str().unwrap())
        .arg("256m")
        .spawn();
    assert_eq!(p.wait_for("stalled"), "0");
    sim.agent_memory_limit(0, "64m");
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    println!("{out:?}");
    assert!(out.success(), "{out:?}");
    assert_eq!(out.get("alloc"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(64 * MIB);
}

/// No cap while thread 1 learns device 0 (stalled on its log line, after the policy, before the slot); the agent
/// sets a 64 MiB cap; another thread's NVML call refreshes (no device known yet); then 256 MiB must be refused.
#[test]
fn review_refresh34_device_learned_during_a_refresh_keeps_the_old_cap() {
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut p = sim
        .cmd_path(prog())
        .env("CUQUOTA_LOG", "info")
        .arg(go.to_str().unwrap())
        .arg("256m")
        .spawn();
    let stalled = p.wait_for("stalled");
    sim.agent_memory_limit(0, "64m");
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    println!("{out:?}");
    assert_eq!(stalled, "1", "thread 1 did not stall on its log line: {out:?}");
    assert!(out.success(), "{out:?}");
    assert_eq!(out.get("alloc"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(64 * MIB);
}

/// The same at the default log level: the once-only warning of a priority without a priority file
/// (`CUDA_TASK_PRIORITY=1`, the tenant's own variable) is the line that stalls.
#[test]
fn review_refresh34_default_log_level_stalls_on_the_priority_warning() {
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut p = sim
        .cmd_path(prog())
        .env_remove("CUQUOTA_LOG")
        .env("CUDA_TASK_PRIORITY", "1")
        .arg(go.to_str().unwrap())
        .arg("256m")
        .spawn();
    let stalled = p.wait_for("stalled");
    sim.agent_memory_limit(0, "64m");
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    println!("{out:?}");
    assert!(out.success(), "{out:?}");
    assert_eq!(stalled, "1", "thread 1 did not stall on its log line: {out:?}");
    assert_eq!(out.get("alloc"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(64 * MIB);
}

/// The same race for an SM limit: no limit while thread 1 learns device 0, the agent sets a hard 20 %, another
/// thread's NVML call refreshes, then 1 ms kernels back to back for 3 s: the share must be near 20 %.
#[test]
fn review_refresh34_device_learned_during_a_refresh_keeps_no_sm_limit() {
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut p = sim
        .cmd_path(prog())
        .env("CUQUOTA_LOG", "info")
        .arg(go.to_str().unwrap())
        .arg("sm")
        .arg("3")
        .spawn();
    let stalled = p.wait_for("stalled");
    sim.agent_sm_limit_hard(20);
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    assert!(out.success(), "{out:?}");
    assert_eq!(stalled, "1", "thread 1 did not stall on its log line: {out:?}");
    let w = out.window();
    let share = sim.share_pct(0, w.pid, w.t0 + 500_000_000, w.end);
    println!("share under a hard 20 % limit: {share:.1} % {out:?}");
    assert!(share <= 30.0, "hard 20 % set before the launches: {share:.1} %");
}

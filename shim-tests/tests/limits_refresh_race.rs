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
        "refresh_race",
        &workspace_root().join("shim-tests/c/refresh_race.c"),
        &[],
        &["-lcuda", "-lnvidia-ml", "-ldl", "-lpthread"],
    )
}

/// Runs the program under `env` (without CUQUOTA_LOG unless `env` sets it) with `args` after its go file; once it said
/// whether thread 1 stalled, `limit` is the agent's change, then the go file. Returns what it said and printed.
fn race(
    sim: &Sim,
    env: &[(&str, &str)],
    args: &[&str],
    limit: impl FnOnce(&Sim),
) -> (String, shim_tests::Output) {
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut c = sim.cmd_path(prog()).arg(go.to_str().unwrap());
    if !env.iter().any(|(k, _)| *k == "CUQUOTA_LOG") {
        c = c.env_remove("CUQUOTA_LOG");
    }
    for (k, v) in env {
        c = c.env(k, v);
    }
    for a in args {
        c = c.arg(a);
    }
    let mut p = c.spawn();
    let stalled = p.wait_for("stalled");
    limit(sim);
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    println!("{out:?}");
    assert!(out.success(), "{out:?}");
    (stalled, out)
}

/// A 64 MiB cap set while thread 1 learns device 0 (under `env`): 256 MiB must then be refused.
fn cap_race(env: &[(&str, &str)], stall: &str) {
    let sim = Sim::new().build();
    let (stalled, out) = race(&sim, env, &["256m"], |sim| sim.agent_memory_limit(0, "64m"));
    assert_eq!(stalled, stall, "thread 1's stall on its log line: {out:?}");
    assert_eq!(out.get("alloc"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(64 * MIB);
}

/// Control (passes): the same steps without the stall (thread 1 learns device 0 before the agent's write).
#[test]
fn control_without_the_stall_the_cap_applies() {
    cap_race(&[("CUQUOTA_LOG", "info"), ("CQ_NO_STALL", "1")], "0");
}

/// No cap while thread 1 learns device 0 (stalled on its log line, after the policy, before the slot); the agent
/// sets a 64 MiB cap; another thread's NVML call refreshes (no device known yet); then 256 MiB must be refused.
#[test]
fn device_learned_during_a_refresh_gets_the_new_cap() {
    cap_race(&[("CUQUOTA_LOG", "info")], "1");
}

/// The same at the default log level: the once-only warning of a priority without a priority file
/// (`CUDA_TASK_PRIORITY=1`, the tenant's own variable) is the line that stalls.
#[test]
fn a_stall_on_the_priority_warning_still_gets_the_new_cap() {
    cap_race(&[("CUDA_TASK_PRIORITY", "1")], "1");
}

/// The same race for an SM limit: no limit while thread 1 learns device 0, the agent sets a hard 20 %, another
/// thread's NVML call refreshes, then 1 ms kernels back to back for 3 s: the share must be near 20 %.
#[test]
fn device_learned_during_a_refresh_gets_the_new_sm_limit() {
    let sim = Sim::new().build();
    let (stalled, out) = race(&sim, &[("CUQUOTA_LOG", "info")], &["sm", "3"], |sim| {
        sim.agent_sm_limit_hard(20);
    });
    assert_eq!(stalled, "1", "thread 1 did not stall on its log line: {out:?}");
    let w = out.window();
    let share = sim.share_pct(0, w.pid, w.t0 + 500_000_000, w.end);
    println!("share under a hard 20 % limit: {share:.1} %");
    assert!(share <= 30.0, "hard 20 % set before the launches: {share:.1} %");
}

//! No SM measurement is dropped (issue 21, item 5): launches whose device time the throttle's sampled
//! measurement used to lose are charged in full, however long they run and however their measurement ends.
//!
//! - a context destroyed (or a primary context reset) while its kernel runs (the probe's events die with it):
//!   a 30 % tenant got 63 % (destroyed) and ~100 % (reset) before the fix;
//! - kernels longer than the 5 s a pending measurement used to be waited for (and than the 10 s one charge
//!   holds): a 50 % tenant got ~100 %;
//! - one host launch of a graph whose conditional WHILE node runs its body for seconds, or of a graph whose
//!   kernel launches such a graph from the device: the same.
//!
//! Shares come from the simulator's device timeline over the program's launch window, never from the shim. The
//! bands hold the limit with room for a busy machine; the escapes they catch are at ~100 %. Each program holds
//! `heavy()`: one simulated process at a time per core.

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

/// One test at a time: they time the device.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Share (percent, from the timeline) of `throttle_debt ARGS` at a hard `pct` (None: without cuquota), and the
/// device time (s) it took in the first 5 s of its window (a long launch runs whole: the attack is real).
fn share(pct: Option<u32>, args: &str, secs: f64) -> (f64, f64) {
    let prog = compile_c(
        "throttle_debt",
        &workspace_root().join("shim-tests/c/throttle_debt.c"),
        &[],
        &["-lcuda"],
    );
    let _h = heavy();
    let sim = Sim::new().build();
    let mut c = sim
        .cmd_path(prog)
        .timeout(Duration::from_secs_f64(secs * 3.0 + 60.0))
        .args(args);
    match pct {
        Some(p) => {
            c = c
                .env("CUDA_DEVICE_SM_LIMIT", &p.to_string())
                .env("CUQUOTA_POLICY", "hard")
        }
        None => c = c.no_preload(),
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, w.pid, w.t0, w.end);
    let first = sim.busy_ns(0, w.pid, w.t0, w.t0 + 5_000_000_000) as f64 / 1e9;
    println!(
        "{args} at {pct:?} %: {s:.1} % over {:.2} s, {} launches",
        (w.end - w.t0) as f64 / 1e9,
        out.num("launches")
    );
    (s, first)
}

#[test]
fn a_kernel_whose_context_is_destroyed_while_it_runs_is_charged() {
    let _serial = serial();
    // The attack works without the limit (the control): each round's kernel runs whole.
    let (free, _) = share(None, "ctxkill 1.5 300000000", 1.5);
    assert!(free > 80.0, "control without cuquota: {free:.1} %");
    for mode in ["ctxkill", "reset"] {
        let (s, _) = share(Some(30), &format!("{mode} 3 300000000"), 3.0);
        assert!(
            (15.0..=45.0).contains(&s),
            "30 % tenant whose kernels' contexts die ({mode}): {s:.1} % outside [15, 45]"
        );
    }
}

#[test]
fn kernels_longer_than_a_measurement_used_to_wait_are_charged_in_full() {
    let _serial = serial();
    // 6 s kernels at 50 %: the first runs whole (kernels are not pre-emptible), the next waits until the 6 s are
    // repaid. Before: the measurement was given up after 5 s and every kernel went at the 1 ms fallback.
    let (s, first) = share(Some(50), "long 8 6000000000", 8.0);
    assert!(
        first > 4.9,
        "the first 6 s kernel ran {first:.2} s of its first 5 s"
    );
    assert!(
        (30.0..=65.0).contains(&s),
        "50 % tenant of 6 s kernels: {s:.1} % outside [30, 65]"
    );
}

#[test]
fn a_conditional_while_graph_is_charged_its_device_time() {
    let _serial = serial();
    // One host launch runs its WHILE body 120 times (directly, or launched from the device by a kernel of the
    // host's graph): 6 s of device time.
    for mode in ["while", "device"] {
        let (s, first) = share(Some(50), &format!("{mode} 8 50000000 120"), 8.0);
        assert!(
            first > 4.9,
            "{mode}: the first 6 s launch ran {first:.2} s of its first 5 s"
        );
        assert!(
            (30.0..=65.0).contains(&s),
            "50 % tenant of a 6 s {mode} graph: {s:.1} % outside [30, 65]"
        );
    }
}

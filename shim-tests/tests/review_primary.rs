//! Hostile review (issue 21 item 5): releasing or resetting an idle primary context settles the probe of a
//! kernel running in another context of the same device, at the time the idle context ended. Judged by the
//! simulator's timeline. EXPECTED TO FAIL on the reviewed branch (that is the escape).

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

fn share(args: &str) -> f64 {
    let prog = compile_c(
        "review_primary",
        &workspace_root().join("shim-tests/c/review_primary.c"),
        &[],
        &["-lcuda"],
    );
    let _h = heavy();
    let sim = Sim::new().build();
    let out = sim
        .cmd_path(prog)
        .timeout(Duration::from_secs(90))
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUQUOTA_POLICY", "hard")
        .args(args)
        .run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("{args}: 30 % tenant got {s:.1} %, {} launches", out.num("launches"));
    s
}

#[test]
fn an_idle_primary_context_released_or_reset_settles_another_contexts_probe() {
    let control = share("none 4 300000000");
    assert!(control < 40.0, "control {control:.1} %");
    let rel = share("release 4 300000000");
    let rst = share("reset 4 300000000");
    assert!(rel < 40.0 && rst < 40.0, "release {rel:.1} %, reset {rst:.1} % (control {control:.1} %)");
}

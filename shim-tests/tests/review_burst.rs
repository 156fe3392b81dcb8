//! Hostile review (issue 21 item 5): a tiny probed kernel pulls the process's average (the never-measured
//! estimate) down; right after its probe settles a burst of never-seen shapes of a long kernel goes at that
//! average, none of them measured. Judged by the simulator's timeline. EXPECTED TO FAIL on the reviewed branch.

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

#[test]
fn never_seen_shapes_right_after_a_tiny_probe_go_at_its_time() {
    let prog = compile_c(
        "review_burst",
        &workspace_root().join("shim-tests/c/review_burst.c"),
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
        .args("5 200000000 4")
        .run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("30 % tenant got {s:.1} %, {} long launches", out.num("launches"));
    assert!(s < 40.0, "30 % tenant got {s:.1} %");
}

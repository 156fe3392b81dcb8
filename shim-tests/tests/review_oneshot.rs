//! Hostile review (issue 21 item 5): processes of one container that each launch one long kernel, wait for it and
//! exit. The probe is only settled by a later admission in the same process, so each kernel is charged the 1 ms
//! fallback. Judged by the simulator's timeline (every process of the sim). EXPECTED TO FAIL on the reviewed
//! branch (that is the escape).

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

#[test]
fn one_long_kernel_per_short_lived_process_is_charged_the_fallback() {
    let prog = compile_c(
        "review_oneshot",
        &workspace_root().join("shim-tests/c/review_oneshot.c"),
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
        .args("parent 6 500000000")
        .run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, 0, w.t0, w.end);
    println!("30 % container of one-kernel processes: {s:.1} %, {} processes", out.num("launches"));
    assert!(s < 40.0, "30 % container got {s:.1} %");
}

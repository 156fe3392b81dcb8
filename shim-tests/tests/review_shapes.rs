//! Hostile review (issue 21 item 5): every launch a never-seen shape of the same long kernel. Only the probe's own
//! key is corrected; the others go at the 1 ms fallback after waiting at most 200 ms. Judged by the simulator's
//! timeline. EXPECTED TO FAIL on the reviewed branch (that is the escape).

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

#[test]
fn many_distinct_shapes_of_a_long_kernel_go_at_the_fallback() {
    let prog = compile_c(
        "review_shapes",
        &workspace_root().join("shim-tests/c/review_shapes.c"),
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
        .args("4 300000000")
        .run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, w.pid, w.t0, w.end);
    let first = sim.busy_ns(0, w.pid, w.t0, w.t0 + 4_000_000_000) as f64 / 1e9;
    println!("30 % tenant of distinct shapes: {s:.1} % ({first:.2} s of its first 4 s), {} launches", out.num("launches"));
    assert!(s < 40.0, "30 % tenant got {s:.1} %");
}

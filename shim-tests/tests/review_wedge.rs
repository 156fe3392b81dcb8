//! Hostile review (issue 21 item 5): a race in Engine::context_ended (try_lock of `outstanding`) can leave the
//! device's probe `ending` for ever; then nothing on the device is measured again and never-seen shapes of a long
//! kernel go at the fallback. Judged by the simulator's timeline over phase 2. A race: it may need several runs;
//! EXPECTED TO FAIL (sometimes) on the reviewed branch.

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

#[test]
fn a_probe_left_ending_by_a_racing_poll_stops_all_measurement() {
    let prog = compile_c(
        "review_wedge",
        &workspace_root().join("shim-tests/c/review_wedge.c"),
        &[],
        &["-lcuda", "-lpthread"],
    );
    let _h = heavy();
    let sim = Sim::new().build();
    let out = sim
        .cmd_path(prog)
        .timeout(Duration::from_secs(120))
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUQUOTA_POLICY", "hard")
        .args("6 4 300000000")
        .run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    let s = sim.share_pct(0, w.pid, w.t0, w.end);
    println!(
        "phase 2: 30 % tenant got {s:.1} %, {} launches after {} context destroys",
        out.num("launches"),
        out.num("destroys")
    );
    assert!(s < 40.0, "30 % tenant got {s:.1} %");
}

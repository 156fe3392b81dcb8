//! Hostile review (issue 21 item 5): the estimate is keyed without the device, and a probe below half the
//! estimate replaces it at once. One CUkernel on two devices of different speed: device 0's short probes keep the
//! estimate short, device 1's long launches (not probes) are charged it. Judged by the simulator's timeline on
//! device 1. EXPECTED TO FAIL on the reviewed branch (that is the escape).

use shim_tests::{compile_c, heavy, workspace_root, Sim};
use std::time::Duration;

fn share1(pct: Option<u32>, args: &str) -> f64 {
    let prog = compile_c(
        "review_crosskey",
        &workspace_root().join("shim-tests/c/review_crosskey.c"),
        &[],
        &["-lcuda"],
    );
    let _h = heavy();
    let sim = Sim::new().devices(2).sms("132,1").build();
    let mut c = sim.cmd_path(prog).timeout(Duration::from_secs(60)).args(args);
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
    let s0 = sim.share_pct(0, w.pid, w.t0, w.end);
    let s1 = sim.share_pct(1, w.pid, w.t0, w.end);
    println!("{args} at {pct:?} %: dev0 {s0:.1} % dev1 {s1:.1} %, {} launches", out.num("launches"));
    s1
}

#[test]
fn a_kernel_shared_by_a_fast_and_a_slow_device_is_charged_the_fast_time_on_the_slow_one() {
    let control = share1(Some(30), "only1 4 100000");
    assert!(control < 40.0, "control (device 1 alone) {control:.1} %");
    let s = share1(Some(30), "both 4 100000");
    assert!(s < 40.0, "30 % tenant on device 1 got {s:.1} % (control {control:.1} %)");
}

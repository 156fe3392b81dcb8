//! Threads: 64 threads of one process allocate (every linear, VMM and array path), free, launch kernels and query
//! (cuMemGetInfo, NVML memory and process list) at once, and some exit mid-work leaving their allocations to the
//! process. The totals stay exact — what the shim charges equals what the driver holds, during and after — and a
//! watchdog in the program fails the run if no thread made progress for 10 s (a stall: a lock never released,
//! a wait on something that never comes).

use shim_tests::{Prog, Sim, MIB};
use std::time::Duration;

fn storm(threads: u32, secs: f64, cap: &str, seed: u64) {
    let sim = Sim::new().ctx_overhead("64m").module_overhead("2m").build();
    let out = sim
        .cmd(Prog::Chaos)
        .mem_limit(cap)
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .args(&format!("storm {threads} {secs} {seed}"))
        .timeout(Duration::from_secs_f64(secs * 3.0 + 60.0))
        .run();
    println!("{out:?}");
    assert!(out.success(), "the storm did not end cleanly:{out:?}");
    assert_eq!(out.get("storm.stall"), None, "a thread stalled:{out:?}");
    assert_eq!(
        out.num("storm.err"),
        0,
        "calls failed with other than out-of-memory:{out:?}"
    );
    assert_eq!(out.num("storm.free_err"), 0, "{out:?}");
    assert!(out.num("storm.exited") >= (threads / 8) as u64, "{out:?}");
    assert!(
        out.num("storm.ops") >= threads as u64 * 20,
        "hardly any work done:{out:?}"
    );
    for tag in ["", "_end"] {
        assert_eq!(out.val(&format!("storm.info_rc{tag}")), "CUDA_SUCCESS", "{out:?}");
        assert_eq!(out.num(&format!("storm.raw_rc{tag}")), 0, "{out:?}");
    }
    let (charged, held) = (out.num("storm.charged"), out.num("storm.held"));
    assert_eq!(
        charged, held,
        "after the storm the shim charges {charged} but the driver holds {held}:{out:?}"
    );
    assert!(
        out.num("storm.left") > 0,
        "the exited threads left nothing behind?{out:?}"
    );
    let cap = cuquota_core::units::parse_size(cap).expect("cap");
    assert!(held <= cap, "the driver holds {held} over the {cap} cap:{out:?}");
    // Everything freed: the context and its module remain.
    let (charged, held) = (out.num("storm.charged_end"), out.num("storm.held_end"));
    assert_eq!(charged, held, "{out:?}");
    assert_eq!(
        held,
        66 * MIB,
        "only the context (64m) and the module (2m) should remain:{out:?}"
    );
}

#[test]
fn sixty_four_threads_allocate_launch_query_and_exit_mid_work() {
    storm(64, 8.0, "1g", 1);
}

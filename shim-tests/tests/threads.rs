//! 32 threads allocating and freeing concurrently: exact totals, no over-admission, usage back to the
//! baseline afterwards.

use shim_tests::{Prog, Sim, GIB, MIB};

#[test]
fn thirty_two_threads_with_room() {
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init simused info threads:32:50:16m info simused")
        .timeout(std::time::Duration::from_secs(60))
        .run();
    out.ok();
    assert_eq!(
        out.num("threads.ok"),
        32 * 50,
        "32×16m fit in 1g: every allocation must succeed:{out:?}"
    );
    assert_eq!(out.num("threads.oom"), 0, "{out:?}");
    assert_eq!(out.num("threads.err"), 0, "{out:?}");
    assert_eq!(
        out.nth_num("info.free", 1),
        GIB,
        "container usage not back to the baseline:{out:?}"
    );
    assert_eq!(
        out.nth_num("sim.used.0", 1),
        out.nth_num("sim.used.0", 0),
        "{out:?}"
    );
}

#[test]
fn thirty_two_threads_contending_for_the_cap() {
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("256m")
        .args("init simused threads:32:50:16m info simused")
        .timeout(std::time::Duration::from_secs(60))
        .run();
    out.ok();
    let (ok, oom) = (out.num("threads.ok"), out.num("threads.oom"));
    assert_eq!(out.num("threads.err"), 0, "{out:?}");
    assert_eq!(ok + oom, 32 * 50, "{out:?}");
    assert!(ok >= 16, "at least the first 16 must fit:{out:?}");
    assert!(
        out.num("threads.maxheld") <= 256 / 16,
        "more than 256m held at once:{out:?}"
    );
    assert_eq!(
        out.num("info.free"),
        256 * MIB,
        "container usage not back to the baseline:{out:?}"
    );
    assert_eq!(
        out.nth_num("sim.used.0", 1),
        out.nth_num("sim.used.0", 0),
        "driver memory leaked:{out:?}"
    );
}

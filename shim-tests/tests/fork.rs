//! `fork` while other threads allocate: the shim's fork handlers take every lock its hooks take and release them
//! in parent and child, so a forked child never waits for a lock a vanished parent thread held. Each child
//! allocates, frees 64 addresses (every ledger shard) and asks cuMemGetInfo through the shim (the driver itself
//! refuses a forked child; the shim's locks are what is tested); a child not done within 10 s is stuck on a lock:
//! killed and counted.

use shim_tests::{Prog, Sim};

#[test]
fn children_forked_while_threads_allocate_never_wait_for_a_lock() {
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::Probe)
        .mem_limit("1g")
        .args("init forks:4:100:2m info")
        .timeout(std::time::Duration::from_secs(120))
        .run();
    out.ok();
    assert_eq!(out.num("forks.stuck"), 0, "children stuck on a lock:{out:?}");
    assert_eq!(out.num("forks.ok"), 100, "{out:?}");
}

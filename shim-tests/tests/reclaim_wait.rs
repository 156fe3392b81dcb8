//! The waiting allocation (issue 39): under an agent limits file, an allocation within the limit that the
//! device cannot hold (the driver refuses it) says so in the usage file's `waiting` word and tries again for up
//! to `CUQUOTA_RECLAIM_WAIT_MS`, while the agent reclaims; then the driver's answer.

use std::time::{Duration, Instant};

use cuquota_core::UsageRegion;
use shim_tests::reclaim::{agent_reclaims, free_held, free_held_then_collect, hold_outside, waiter};
use shim_tests::{Sim, MIB};
use std::sync::atomic::Ordering;

/// A 2 GiB device, 1 GiB of it held by a process outside any container (no shim) until released; the
/// container's limit 1536 MiB in the agent's limits file, whose agent reclaims when `reclaim`.
fn full_device_with(reclaim: bool) -> (Sim, shim_tests::Proc) {
    let sim = Sim::new().memory("2g").build();
    sim.agent_memory_limit(0, "1536m");
    if reclaim {
        agent_reclaims(&sim.limits_file());
    }
    let holder = hold_outside(&sim, "1g");
    (sim, holder)
}

fn full_device() -> (Sim, shim_tests::Proc) {
    full_device_with(true)
}

fn waiting_word(sim: &Sim) -> u64 {
    UsageRegion::open_existing(&sim.usage_file())
        .map(|u| u.waiting().load(Ordering::Acquire))
        .unwrap_or(0)
}

#[test]
fn an_allocation_waits_and_gets_the_memory_freed_within_the_bound() {
    let (sim, holder) = full_device();
    let waiter = waiter(&sim, "30000").spawn();
    // It says what it waits for: usage entry 0, 1280 MiB.
    let until = Instant::now() + Duration::from_secs(20);
    let mut word = 0;
    while word == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
        word = waiting_word(&sim);
    }
    assert_eq!(word, (1 << 56) | (1280 * MIB), "no waiting word while it waits");
    let out = free_held_then_collect(holder, waiter);
    assert_eq!(
        out.val("alloc.0"),
        "CUDA_SUCCESS",
        "the memory freed within the bound was not taken:{out:?}"
    );
    assert_eq!(waiting_word(&sim), 0, "the waiting word was left set");
}

#[test]
fn an_allocation_gives_up_after_the_bound_and_only_under_an_agent_file() {
    let (sim, holder) = full_device();
    let t = Instant::now();
    let out = waiter(&sim, "600").run();
    let took = t.elapsed();
    out.ok();
    assert_eq!(out.val("alloc.0"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    assert!(
        took >= Duration::from_millis(600),
        "gave up after {took:?}, before the bound"
    );
    assert_eq!(waiting_word(&sim), 0, "the waiting word was left set");
    // 0 = no wait.
    let out = waiter(&sim, "0").run();
    out.ok();
    assert_eq!(out.val("alloc.0"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    free_held(holder);
    // Without an agent limits file (the environment's cap only): no wait, however long the setting.
    let sim = Sim::new().memory("2g").build();
    let holder = hold_outside(&sim, "1g");
    let t = Instant::now();
    let out = waiter(&sim, "60000").mem_limit("1536m").run();
    out.ok();
    assert_eq!(out.val("alloc.0"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(30), "waited without an agent");
    free_held(holder);
}

/// Under an agent limits file whose agent does not reclaim (`LIMITS_FLAG_RECLAIM` clear: no pinned-host budget,
/// or an older file), nothing waits: the driver's answer at once, no `waiting` word. Control: the first test.
#[test]
fn an_allocation_does_not_wait_when_the_agent_does_not_reclaim() {
    let (sim, holder) = full_device_with(false);
    let t = Instant::now();
    let out = waiter(&sim, "60000").run();
    out.ok();
    assert_eq!(out.val("alloc.0"), "CUDA_ERROR_OUT_OF_MEMORY", "{out:?}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "waited for an agent that does not reclaim"
    );
    assert_eq!(waiting_word(&sim), 0, "a waiting word without a reclaiming agent");
    free_held(holder);
}

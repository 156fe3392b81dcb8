//! Scale: many processes of one container start CUDA at once, and a region outlives more processes than it has
//! slots.
//!
//! - Start-up: N processes (each cuInit, a context, a 1 MiB allocation, cuMemGetInfo, exit) are started at once,
//!   without and with the shim, in the same run, alternating; the time until all have finished is compared
//!   (best of three each). CI runs 64 processes and fails only if the shim makes the start more than 3× slower.
//!   The benchmark (ignored; docs/reliability.md) runs 256 and prints the figures:
//!   `cargo test -p shim-tests --test scale -- --ignored --nocapture`.
//! - Slot reuse: 1100 processes (more than the region's 1024 slots), 16 at a time, each allocating through the
//!   shim and exiting without freeing (a process does not give its slot back at exit: the dead are reclaimed
//!   by those that start later). None is refused, the region never holds more than its slots, no slot names a
//!   live process once all exited, and at the end its usage is exactly zero. (The full-region path — every
//!   slot taken, the dead reclaimed by the claim itself — is core/tests/region.rs's.)

use cuquota_core::UsageRegion;
use shim_tests::{Prog, Sim};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests of this file are CPU-heavy: one at a time.
static ONE: Mutex<()> = Mutex::new(());

/// Starts `n` processes at once and waits for all; the wall time from the first spawn to the last exit.
fn start_all(sim: &Sim, n: usize, preload: bool) -> Duration {
    let t0 = Instant::now();
    let procs: Vec<_> = (0..n)
        .map(|_| {
            let c = sim
                .cmd(Prog::Probe)
                .mem_limit("8g")
                .args("init alloc:mem:1m info")
                .timeout(Duration::from_secs(300));
            if preload { c } else { c.no_preload() }.spawn()
        })
        .collect();
    let outs: Vec<_> = procs.into_iter().map(|p| p.finish()).collect();
    let took = t0.elapsed();
    for out in &outs {
        out.ok();
        out.expect("init", "CUDA_SUCCESS");
        out.expect("alloc.0", "CUDA_SUCCESS");
    }
    took
}

/// (no shim, shim): best of three rounds each, alternating.
fn startup(n: usize) -> (Duration, Duration) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Sim::new().memory("80g").build();
    let (mut bare, mut shim) = (Duration::MAX, Duration::MAX);
    for round in 0..3 {
        let b = start_all(&sim, n, false);
        let s = start_all(&sim, n, true);
        println!("scale: {n} processes, round {round}: no shim {b:?}, shim {s:?}");
        bare = bare.min(b);
        shim = shim.min(s);
    }
    println!(
        "scale: {n} processes start at once: no shim {bare:?}, shim {shim:?} ({:.2}×)",
        shim.as_secs_f64() / bare.as_secs_f64()
    );
    (bare, shim)
}

#[test]
fn sixty_four_processes_start_at_once_not_much_slower_than_without_the_shim() {
    let (bare, shim) = startup(64);
    assert!(
        shim <= bare * 3,
        "64 processes took {shim:?} to start under the shim, {bare:?} without"
    );
}

#[test]
#[ignore = "benchmark (docs/reliability.md): cargo test -p shim-tests --test scale -- --ignored --nocapture"]
fn two_hundred_fifty_six_processes_start_at_once() {
    let (bare, shim) = startup(256);
    assert!(
        shim <= bare * 3,
        "256 processes took {shim:?} to start under the shim, {bare:?} without"
    );
}

#[test]
fn more_processes_than_slots_over_a_regions_lifetime_reuse_them() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Sim::new().memory("80g").build();
    const TOTAL: usize = 1100;
    const AT_ONCE: usize = 16;
    let mut done = 0;
    let mut max_listed = 0;
    while done < TOTAL {
        let batch: Vec<_> = (0..AT_ONCE.min(TOTAL - done))
            .map(|_| {
                sim.cmd(Prog::Probe)
                    .mem_limit("4g")
                    .args("init alloc:mem:64m")
                    .timeout(Duration::from_secs(120))
                    .spawn()
            })
            .collect();
        for p in batch {
            let out = p.finish();
            out.ok();
            assert_eq!(
                out.val("alloc.0"),
                "CUDA_SUCCESS",
                "process {done} was refused:{out:?}"
            );
            done += 1;
        }
        let region = UsageRegion::open_existing(&sim.usage_file()).expect("usage region");
        max_listed = max_listed.max(region.processes().len());
    }
    let region = UsageRegion::open_existing(&sim.usage_file()).expect("usage region");
    for p in region.processes() {
        assert!(
            !cuquota_core::region::liveness::is_alive(p.pid, Some(p.start_time)),
            "slot {:?} names live process {} after all exited",
            p.slot,
            p.pid
        );
    }
    region.reclaim_dead();
    assert_eq!(region.processes(), vec![], "slots left after reclaim");
    for d in region.devices() {
        assert_eq!(d.used, 0, "device entry {:?} still charged {}", d.id, d.used);
    }
    println!("scale: {TOTAL} processes through a 1024-slot region; at most {max_listed} slots held at once");
    assert!(
        max_listed <= cuquota_core::region::layout::MAX_PROCS,
        "{max_listed}"
    );
}

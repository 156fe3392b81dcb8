//! From the hostile review of copies and memsets gated by priority (issue 23). Judged on the simulator's device
//! timeline (burst latency from the high-priority tenant).
//!
//! `fresh_copy_size_classes_queue_past_the_budget`: a copy of a size class the process never measured
//! was estimated at the process's running mean of all measurements (`Estimator::fallback`), which the tenant
//! drags to ~0 with 4-byte memsets; one volley of copies of six unseen classes (2^17..2^22 bytes: 83 ms at
//! 0.1 GB/s) then fit the 400 µs budget of *estimated* queued time and queued back to back ahead of a burst
//! (33–78 ms seen). A never-measured key now goes only onto an empty queue: a burst waits for at most one of
//! them, the largest 42 ms — the bound this test holds ("alone + one best-effort unit"); a burst that meets the
//! volley's start behind several stacked copies breaks it, one that meets only the largest does not (powers of
//! two: the six together are twice the largest), so the test catches the old behaviour only when the timing
//! lines up.

use shim_tests::priority::{bursts_beside, ms, pct, serial, BE_NS, BURST, GAP_NS, KERNEL_NS};
use shim_tests::{Output, Prog, Sim};

const SECS: f64 = 2.0;
/// The volley's largest copy (2^22 bytes at 0.1 GB/s): one unit a burst may wait for.
const LARGEST_COPY_NS: u64 = (1 << 22) * 10;
/// As priority_copies.rs: a burst's 20 kernels, one best-effort item (≤ 5 ms) ahead of it, 5 ms slack.
const GATED_NS: u64 = BURST as u64 * KERNEL_NS + BE_NS.1 + 5_000_000;

/// Burst latencies of a high-priority tenant next to a best-effort one in `PT_BE_COPY=mode`, and its output.
fn bursts(mode: &str, env: &[(&str, &str)]) -> (Vec<u64>, Output) {
    let sim = Sim::new().env("CUDASIM_COPY_GBPS", "0.1").build();
    sim.create_priority_dir();
    let be = sim
        .cmd(Prog::PriorityTenant)
        .container("be")
        .priority("1")
        .env("PT_BE_COPY", mode);
    let be = env.iter().fold(be, |c, (k, v)| c.env(k, v));
    bursts_beside(&sim, be, SECS, GAP_NS)
}

#[test]
fn fresh_copy_size_classes_queue_past_the_budget() {
    let _s = serial();
    let (v, be) = bursts("fresh", &[]);
    let max = v.iter().copied().max().expect("no burst");
    println!(
        "bursts {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (band {:.2} ms); be: {:?}",
        v.len(),
        ms(pct(&v, 50.0)),
        ms(pct(&v, 99.0)),
        ms(max),
        ms(BURST as u64 * KERNEL_NS + LARGEST_COPY_NS + 10_000_000),
        be.stderr
            .lines()
            .filter(|l| l.contains("volley"))
            .collect::<Vec<_>>()
    );
    let bound = BURST as u64 * KERNEL_NS + LARGEST_COPY_NS + 10_000_000;
    assert!(
        max <= bound,
        "a burst waited {:.2} ms > {:.2} ms (alone + the largest copy + 10 ms) behind copies of unseen size classes",
        ms(max),
        ms(bound)
    );
}

/// A graph exec keeps its launch key (and estimate) across `cuGraphExecUpdate`: measured on a 4-byte copy, then
/// updated to a 5.2 ms copy and launched 12 times at the small estimate, over and over (the short sample
/// replaces the estimate at once each cycle). Copies inside graphs "go with the graph's launch".
#[test]
fn graph_exec_update_keeps_a_small_estimate() {
    let _s = serial();
    // The simulator gives a graph's memcpy nodes no device time (run_graph_copies), so the graph's work is a
    // kernel node of the same length (PT_BE_GRAPH_KERNEL): the key and estimate are the exec's either way.
    let (c, _) = bursts(
        "graph",
        &[("PT_BE_GRAPH_KERNEL", "1"), ("PT_BE_GRAPH_BIGONLY", "1")],
    );
    let (v, be) = bursts("graph", &[("PT_BE_GRAPH_KERNEL", "1")]);
    println!(
        "control (same exec, never updated small): p50 {:.2} ms, p99 {:.2} ms",
        ms(pct(&c, 50.0)),
        ms(pct(&c, 99.0))
    );
    println!(
        "bursts {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (band {:.2} ms); be kernels {}",
        v.len(),
        ms(pct(&v, 50.0)),
        ms(pct(&v, 99.0)),
        ms(v.iter().copied().max().unwrap_or(0)),
        ms(GATED_NS),
        be.val("kernels")
    );
    assert!(
        pct(&v, 99.0) <= GATED_NS,
        "p99 {:.2} ms > {:.2} ms: updated graph execs' copies queue past the budget",
        ms(pct(&v, 99.0)),
        ms(GATED_NS)
    );
}

/// A 2D copy is keyed by its `CUDA_MEMCPY2D` as read on entry; the driver reads it again after the gate (which
/// sleeps while a high-priority queue is out): a second thread raising `Height` in between runs 5.2 ms copies
/// keyed and estimated as 64-byte ones.
#[test]
fn copy_2d_struct_changed_during_the_gate() {
    let _s = serial();
    let (v, be) = bursts("race", &[]);
    println!(
        "bursts {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (band {:.2} ms); be copies {}",
        v.len(),
        ms(pct(&v, 50.0)),
        ms(pct(&v, 99.0)),
        ms(v.iter().copied().max().unwrap_or(0)),
        ms(GATED_NS),
        be.val("kernels")
    );
    assert!(
        pct(&v, 99.0) <= GATED_NS,
        "p99 {:.2} ms > {:.2} ms: 2D copies resized after the shim read them queue past the budget",
        ms(pct(&v, 99.0)),
        ms(GATED_NS)
    );
}

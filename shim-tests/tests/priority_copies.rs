//! Copies and memsets are best-effort device work too (issue 23 item 2, docs/priority.md "Threat model"): a
//! best-effort tenant that streams big async copies or memsets and launches no kernel must not delay a
//! high-priority tenant's bursts past the band a kernel-launching one is held to (on the branch base, where
//! they were not gated: p99 far past it). Judged on the simulator's device timeline, where copies and memsets
//! take `bytes / CUDASIM_COPY_GBPS` (0.1 GB/s here: 1–5 ms each moves
//! 100–500 kB, so the host copies far faster than the device's timeline and the tenant can queue ahead).

use shim_tests::priority::{bursts_beside, ms, pct, serial, BE_NS, BURST, GAP_NS, KERNEL_NS};
use shim_tests::{Prog, Sim};

/// Seconds of bursts per run.
const SECS: f64 = 2.0;

/// What a burst may take next to a gated best-effort tenant: its 20 kernels, one best-effort item ahead of it,
/// and slack for a loaded host (as priority_attacks.rs).
const GATED_P99_NS: u64 = BURST as u64 * KERNEL_NS + BE_NS.1 + 5_000_000;

/// High-priority burst latencies (ns) next to a best-effort tenant started 0.5 s before them whose work is
/// kernels (`copy` None) or, with `PT_BE_COPY=copy|set`, copies or memsets of the same lengths.
fn bursts(sim: &Sim, copy: Option<&str>) -> Vec<u64> {
    let be = sim.cmd(Prog::PriorityTenant).container("be").priority("1");
    let be = match copy {
        Some(m) => be.env("PT_BE_COPY", m),
        None => be,
    };
    let (v, be) = bursts_beside(sim, be, SECS, GAP_NS);
    assert!(
        be.val("kernels").parse::<u64>().expect("kernels") > 10,
        "the best-effort tenant hardly worked: {be:?}"
    );
    v
}

#[test]
fn best_effort_copies_and_memsets_are_gated_like_kernels() {
    let _s = serial();
    let sim = Sim::new().env("CUDASIM_COPY_GBPS", "0.1").build();
    sim.create_priority_dir();
    let kernels = bursts(&sim, None);
    let copies = bursts(&sim, Some("copy"));
    let sets = bursts(&sim, Some("set"));
    assert!(kernels.len() >= 20, "the control: only {} bursts", kernels.len());
    println!(
        "burst p50/p99 ms next to best-effort kernels {:.2}/{:.2}, copies {:.2}/{:.2}, memsets {:.2}/{:.2} \
         (band {:.2}; {}/{}/{} bursts)",
        ms(pct(&kernels, 50.0)),
        ms(pct(&kernels, 99.0)),
        ms(pct(&copies, 50.0)),
        ms(pct(&copies, 99.0)),
        ms(pct(&sets, 50.0)),
        ms(pct(&sets, 99.0)),
        ms(GATED_P99_NS),
        kernels.len(),
        copies.len(),
        sets.len()
    );
    for (what, v) in [
        ("kernels (the control)", &kernels),
        ("async copies", &copies),
        ("async memsets", &sets),
    ] {
        assert!(
            pct(v, 99.0) <= GATED_P99_NS,
            "next to best-effort {what}: p99 {:.2} ms > {:.2} ms: they were not gated",
            ms(pct(v, 99.0)),
            ms(GATED_P99_NS)
        );
    }
}

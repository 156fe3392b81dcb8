//! Priority tenants on the time-sliced simulator (`CUDASIM_SCHED=slice`, its H200 calibration; issue 36 item 3):
//! a high-priority tenant's burst p99 stays within its p99 alone + one best-effort kernel + one quantum, and the
//! best-effort tenant gets at least 85 % of the device time the high-priority tenant leaves idle.
//!
//! The run of docs/real-gpu.md (H200, 2026-11-25: best effort 74 % of the run, about 85 % of the time the
//! high-priority tenant left idle; bench/README.md, 2026-12-02): `c/priority_tenant.c`, high priority
//! bursts of 20 × 200 µs kernels 10-40 ms apart, best effort kernels of 1-2 ms synchronising every 8, each in its
//! container with its priority file. Latencies end on the device timeline, shares come from it (`Sim::busy_ns`:
//! the time each process occupied the device, switches belonging to nobody). Each figure over 4.5 s of bursts,
//! the best-effort tenant started 0.5 s before them.

use shim_tests::priority::{done, latencies, ms, pct, serial, BURST, GAP_NS, KERNEL_NS};
use shim_tests::{heavy, mono_ns, Cmd, Prog, Sim, Window};
use std::time::Duration;

/// Seconds of bursts per run.
const SECS: f64 = 4.5;
/// The best-effort kernels of the H200 run (random in this range), ns, and how often it synchronises.
const BE_NS: (u64, u64) = (1_000_000, 2_000_000);
const BE_DEPTH: u32 = 8;
/// The simulator's default time slice (`CUDASIM_QUANTUM_US`).
const QUANTUM_NS: u64 = 2_000_000;

fn sim() -> Sim {
    let s = Sim::new().env("CUDASIM_SCHED", "slice").build();
    s.create_priority_dir();
    s
}

struct Run {
    hp: Window,
    lat_ns: Vec<u64>,
    be: Option<Window>,
}

/// The high-priority tenant (under cuquota, priority high, when `priority`) alone or beside `be` (a best-effort
/// priority_tenant command, container and environment set by the caller) started 0.5 s before it.
fn run(sim: &Sim, priority: bool, be: Option<(Cmd<'_>, (u64, u64))>) -> Run {
    let _h = heavy();
    let t = mono_ns() + 1_500_000_000;
    let timeout = Duration::from_secs_f64(3.0 * SECS + 60.0);
    let be = be.map(|(c, ns)| {
        c.timeout(timeout)
            .args(&format!(
                "be {} {} {} 11 {}",
                SECS + 1.0,
                ns.0,
                ns.1,
                t - 500_000_000
            ))
            .spawn()
    });
    let hp = sim.cmd(Prog::PriorityTenant).container("hp").timeout(timeout);
    let hp = if priority {
        hp.priority("0")
    } else {
        hp.no_preload()
    };
    let hp = done(
        hp.args(&format!(
            "hp {SECS} {BURST} {KERNEL_NS} {} {} 7 {t}",
            GAP_NS.0, GAP_NS.1
        ))
        .spawn()
        .finish(),
    );
    let be = be.map(|p| done(p.finish()).window());
    let lat_ns = latencies(&hp);
    assert!(lat_ns.len() >= 50, "only {} bursts:{hp:?}", lat_ns.len());
    Run {
        hp: hp.window(),
        lat_ns,
        be,
    }
}

/// A best-effort tenant under cuquota in container "be" (kernels in `ns`; `depth`: synchronising every so many,
/// 0 never).
fn be(sim: &Sim, ns: (u64, u64), depth: u32) -> (Cmd<'_>, (u64, u64)) {
    let c = sim.cmd(Prog::PriorityTenant).container("be").priority("1");
    let c = if depth > 0 {
        c.env("PT_BE_DEPTH", &depth.to_string())
    } else {
        c
    };
    (c, ns)
}

/// The best-effort tenant's device time in the high-priority tenant's window over the time the high-priority
/// tenant left the device idle there, in percent.
fn idle_share(sim: &Sim, r: &Run) -> f64 {
    let be = r.be.expect("a best-effort tenant");
    let (from, to) = (r.hp.t0, r.hp.end);
    let hp_busy = sim.busy_ns(0, r.hp.pid, from, to);
    let be_busy = sim.busy_ns(0, be.pid, from, to);
    be_busy as f64 * 100.0 / (to - from).saturating_sub(hp_busy).max(1) as f64
}

fn figures(what: &str, r: &Run, sim: &Sim) -> (u64, f64) {
    let p99 = pct(&r.lat_ns, 99.0);
    let share = r.be.map_or(0.0, |_| idle_share(sim, r));
    println!(
        "{what}: p50 / p99 {:.2} / {:.2} ms, max {:.2} ({} bursts), best-effort share of idle {share:.1} %",
        ms(pct(&r.lat_ns, 50.0)),
        ms(p99),
        ms(*r.lat_ns.iter().max().unwrap()),
        r.lat_ns.len()
    );
    (p99, share)
}

/// The goal of issue 36 item 3 for priority, on the calibrated time-sliced device, in the H200 run's shape.
/// Main's library (2a1d621) on the 2-CPU sandbox at load average 9-13: p99 6.0-7.8 ms (bound ~8.05), 83.4-91.7 %
/// of the idle time (one kernel at a time: the device idles while the process wakes up); with the lead 6.9-7.0
/// ms and 87-93 % (bench/README.md, 2026-12-02).
#[test]
fn bursts_keep_their_bound_and_best_effort_fills_the_idle_time_on_a_time_sliced_gpu() {
    let _s = serial();
    let sim = sim();
    let (a99, _) = figures("alone", &run(&sim, false, None), &sim);
    let (p99, share) = figures(
        "with priority",
        &run(&sim, true, Some(be(&sim, BE_NS, BE_DEPTH))),
        &sim,
    );
    within_bound(p99, a99, BE_NS.1);
    assert!(
        share >= 85.0,
        "best effort got {share:.1} % of the idle time (goal 85 %)"
    );
}

fn within_bound(p99: u64, a99: u64, be_kernel: u64) {
    let bound = a99 + be_kernel + QUANTUM_NS;
    assert!(
        p99 <= bound,
        "p99 {:.2} ms over alone {:.2} + one best-effort kernel {:.1} + one quantum {:.0} = {:.2} ms",
        ms(p99),
        ms(a99),
        ms(be_kernel),
        ms(QUANTUM_NS),
        ms(bound)
    );
}

/// The attack: a best-effort tenant whose kernels are as long as a quantum, launched as fast as it is let (it
/// keeps launches waiting): a kernel running when a burst comes ends with its slice, and one launched while the
/// burst still has a slice to go is given a slice inside the burst. The control is the run above (the same
/// bound, kernels of 1-2 ms synchronised every 8). Main's library: p99 8.42 ms over a bound of 8.07; now
/// 6.9-7.0 ms.
#[test]
fn a_best_effort_tenant_with_kernels_of_a_quantum_keeps_the_bound() {
    let _s = serial();
    let sim = sim();
    let (a99, _) = figures("alone", &run(&sim, false, None), &sim);
    let ns = (QUANTUM_NS * 9 / 10, QUANTUM_NS);
    let (p99, share) = figures("with priority", &run(&sim, true, Some(be(&sim, ns, 0))), &sim);
    within_bound(p99, a99, ns.1);
    assert!(
        share >= 50.0,
        "best effort held back: {share:.1} % of the idle time"
    );
}

/// Next to a high-priority tenant that is present but idle, a best-effort tenant with kernels longer than the
/// budget keeps the device busy: the next kernel is queued before the last one ends (`LEAD_NS`), so a slow
/// wake-up costs no device time. Main's library (one such kernel at a time): 84.3, 84.8 %; now 97-99.9 %.
#[test]
fn next_to_an_idle_high_priority_tenant_best_effort_keeps_the_device_busy() {
    let _s = serial();
    let sim = sim();
    sim.container_priority_file("hp", true);
    let _h = heavy();
    let t = mono_ns() + 500_000_000;
    let (c, ns) = be(&sim, BE_NS, 0);
    let o = done(
        c.timeout(Duration::from_secs(60))
            .args(&format!("be 3 {} {} 11 {t}", ns.0, ns.1))
            .spawn()
            .finish(),
    );
    let w = o.window();
    let share = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("best effort next to an idle high-priority tenant: {share:.1} % of the device");
    assert!(share >= 90.0, "best effort got {share:.1} % of an idle device");
}

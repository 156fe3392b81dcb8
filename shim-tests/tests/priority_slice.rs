//! Priority tenants on the time-sliced simulator (`CUDASIM_SCHED=slice`, its H200 calibration; issue 36 item 3):
//! a high-priority tenant's burst p99 stays within its p99 alone + one best-effort kernel + one quantum, and the
//! best-effort tenant gets at least 85 % of the device time the high-priority tenant leaves idle.
//!
//! The run of docs/real-gpu.md (H200, 2026-11-25: 74 % of the idle time): `c/priority_tenant.c`, high priority
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
const BE_DEPTH: &str = "8";
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
fn run(sim: &Sim, priority: bool, be: Option<Cmd<'_>>) -> Run {
    let _h = heavy();
    let t = mono_ns() + 1_500_000_000;
    let timeout = Duration::from_secs_f64(3.0 * SECS + 60.0);
    let be = be.map(|c| {
        c.timeout(timeout)
            .env(
                "PT_BE_DEPTH",
                &std::env::var("PRIO_SLICE_DEPTH").unwrap_or(BE_DEPTH.into()),
            )
            .args(&format!(
                "be {} {} {} 11 {}",
                SECS + 1.0,
                BE_NS.0,
                BE_NS.1,
                t - 500_000_000
            ))
            .spawn()
    });
    let hp = sim.cmd(Prog::PriorityTenant).container("hp").timeout(timeout);
    let hp = if priority { hp.priority("0") } else { hp.no_preload() };
    let hp = done(
        hp.args(&format!(
            "hp {SECS} {BURST} {KERNEL_NS} {} {} 7 {t}",
            GAP_NS.0, GAP_NS.1
        ))
        .spawn()
        .finish(),
    );
    let be = be.map(|p| {
        let o = done(p.finish());
        if std::env::var_os("PRIO_SLICE_TRACE").is_some() {
            let n = o.stderr.lines().count();
            for l in o.stderr.lines().skip(n / 2).take(60) {
                println!("{l}");
            }
        }
        o.window()
    });
    let lat_ns = latencies(&hp);
    assert!(lat_ns.len() >= 50, "only {} bursts:{hp:?}", lat_ns.len());
    Run {
        hp: hp.window(),
        lat_ns,
        be,
    }
}

/// A best-effort tenant under cuquota in container "be".
fn be(sim: &Sim) -> Cmd<'_> {
    sim.cmd(Prog::PriorityTenant).container("be").priority("1")
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
    if let (Some(be), Some(_)) = (r.be, std::env::var_os("PRIO_SLICE_TRACE")) {
        let (from, bin) = (r.hp.t0 + 1_000_000_000, 50_000);
        let h = sim.busy_bins(0, r.hp.pid, from, from + 200_000_000, bin);
        let b = sim.busy_bins(0, be.pid, from, from + 200_000_000, bin);
        let t: String = h
            .iter()
            .zip(&b)
            .map(|(h, b)| match (*h > bin / 2, *b > bin / 2) {
                (true, _) => 'H',
                (_, true) => 'b',
                _ if h + b > 0 => ':',
                _ => '.',
            })
            .collect();
        for c in t.as_bytes().chunks(200) {
            println!("{}", String::from_utf8_lossy(c));
        }
    }
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

/// The goal of issue 36 item 3 for priority, on the calibrated time-sliced device.
#[test]
fn on_a_time_sliced_gpu_bursts_keep_their_bound_and_best_effort_fills_the_idle_time() {
    let _s = serial();
    let sim = sim();
    let (a99, _) = figures("alone", &run(&sim, false, None), &sim);
    let (p99, share) = figures("with priority", &run(&sim, true, Some(be(&sim))), &sim);
    if std::env::var_os("PRIO_SLICE_BARE").is_some() {
        let bare = be(&sim).no_preload();
        figures("no cuquota", &run(&sim, false, Some(bare)), &sim);
    }
    let bound = a99 + BE_NS.1 + QUANTUM_NS;
    assert!(
        p99 <= bound,
        "p99 {:.2} ms over alone {:.2} + one best-effort kernel {:.0} + one quantum {:.0} = {:.2} ms",
        ms(p99),
        ms(a99),
        ms(BE_NS.1),
        ms(QUANTUM_NS),
        ms(bound)
    );
    assert!(share >= 85.0, "best effort got {share:.1} % of the idle time (goal 85 %)");
}


#[test]
#[ignore]
fn dbg_be_alone_present() {
    let _s = serial();
    let sim = sim();
    sim.container_priority_file("hp", true);
    let t = mono_ns() + 500_000_000;
    let c = if std::env::var_os("PRIO_SLICE_BARE").is_some() { be(&sim).no_preload() } else { be(&sim) };
    let o = done(
        c
            .timeout(Duration::from_secs(60))
            .env("PT_BE_DEPTH", &std::env::var("PRIO_SLICE_DEPTH").unwrap_or(BE_DEPTH.into()))
            .args(&format!("be 3 {} {} 11 {t}", BE_NS.0, BE_NS.1))
            .spawn()
            .finish(),
    );
    let w = o.window();
    println!("be alone, hp present: {:.1} %", sim.share_pct(0, w.pid, w.t0, w.end));
    let b = sim.busy_bins(0, w.pid, w.t0 + 1_000_000_000, w.t0 + 1_300_000_000, 10_000);
    let mut gaps = vec![];
    let mut run = 0;
    for x in b {
        if x < 5_000 { run += 1 } else { if run > 0 { gaps.push(run * 10) } run = 0 }
    }
    println!("gaps us: {gaps:?}");
    for l in o.stderr.lines().take(80) { println!("{l}"); }
}

//! Hostile tenants against priority (issue 23, docs/priority.md "Threat model"): a best-effort tenant writes
//! whatever it can into the priority state it has write access to, and the honest tenants must not notice.
//! Judged on the simulator's device timeline (burst latency from the program's own timeline reads, shares
//! from `Sim::busy_ns`), each attack next to its control (the same tenants without the liar).
//!
//! The liar needs no GPU work, so it is a thread of this test writing the words of the file its container
//! could write (`liar_file`): it adds no simulated process (at most two run at once).

use shim_tests::{mono_ns, Output, PriorityLiar, Prog, Sim, Window};
use std::path::PathBuf;
use std::time::Duration;

/// One test at a time: they time the device, and CI has 2 cores.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const SECS: f64 = 3.0;
const BURST: u32 = 20;
const KERNEL_NS: u64 = 200_000;
const GAP_NS: (u64, u64) = (10_000_000, 40_000_000);
const BE_NS: (u64, u64) = (1_000_000, 5_000_000);

/// The priority state a best-effort container "liar" can write: its own file (on main it was the node's one
/// shared file). The liar claims the device's entry there, as its shim would, once "be" has run on it.
fn liar_file(sim: &Sim) -> PathBuf {
    sim.liar_priority_file("liar", "be")
}

fn setup(sim: &Sim) {
    sim.create_priority_dir();
}

/// A best-effort container's process (priority 1).
fn be_cmd<'a>(sim: &'a Sim, container: &str) -> shim_tests::Cmd<'a> {
    sim.cmd(Prog::PriorityTenant).container(container).priority("1")
}

/// A high-priority container's process (priority 0), or the same program without cuquota.
fn hp_cmd<'a>(sim: &'a Sim, bare: bool) -> shim_tests::Cmd<'a> {
    let c = sim.cmd(Prog::PriorityTenant).container("hp");
    if bare {
        c.no_preload()
    } else {
        c.priority("0")
    }
}

fn done(o: Output) -> Output {
    assert!(o.success(), "{o:?}");
    o
}

fn pct(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s[((s.len() - 1) as f64 * p / 100.0).round() as usize]
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// High-priority burst latencies (ns), alone (`with_be` false) or next to a best-effort tenant started 0.5 s
/// before it; `liar` runs meanwhile.
fn bursts(sim: &Sim, bare: bool, with_be: bool, liar: Option<fn(u64) -> (u64, u64)>) -> Vec<u64> {
    let t = mono_ns() + 1_500_000_000;
    let liar = liar.map(|w| PriorityLiar::start(&liar_file(sim), Duration::from_micros(50), w));
    let be = with_be.then(|| {
        let c = be_cmd(sim, "be");
        let c = if bare { c.no_preload() } else { c };
        c.timeout(Duration::from_secs(60))
            .args(&format!(
                "be {} {} {} 11 {}",
                SECS + 1.0,
                BE_NS.0,
                BE_NS.1,
                t - 500_000_000
            ))
            .spawn()
    });
    let hp = done(
        hp_cmd(sim, bare)
            .timeout(Duration::from_secs(60))
            .args(&format!(
                "hp {SECS} {BURST} {KERNEL_NS} {} {} 7 {t}",
                GAP_NS.0, GAP_NS.1
            ))
            .spawn()
            .finish(),
    );
    if let Some(be) = be {
        done(be.finish());
    }
    if let Some(l) = liar {
        assert!(l.stop() > 100, "the liar hardly wrote");
    }
    let v: Vec<u64> = hp
        .val("lat_ns")
        .split(',')
        .map(|v| v.parse().expect("latency"))
        .collect();
    assert!(!v.is_empty(), "no burst");
    v
}

/// Lie 1 of issue 23: a best-effort tenant with no GPU work keeps the high-priority state erased, so that the
/// other best-effort tenants queue freely in front of the bursts (measured on main: p50 4.4 ms → 1481 ms).
#[test]
fn a_tenant_erasing_the_high_priority_state_does_not_delay_bursts() {
    let _s = serial();
    let sim = Sim::new().build();
    setup(&sim);
    let alone = bursts(&sim, true, false, None);
    let control = bursts(&sim, false, true, None);
    let attacked = bursts(&sim, false, true, Some(PriorityLiar::erase));
    for (what, v) in [("alone", &alone), ("with best-effort", &control)] {
        assert!(v.len() >= 20, "{what}: only {} bursts", v.len());
    }
    let (a99, c99, x99) = (pct(&alone, 99.0), pct(&control, 99.0), pct(&attacked, 99.0));
    println!(
        "burst p50/p99 ms: alone {:.2}/{:.2}, with best-effort {:.2}/{:.2}, and an eraser {:.2}/{:.2} ({} bursts)",
        ms(pct(&alone, 50.0)),
        ms(a99),
        ms(pct(&control, 50.0)),
        ms(c99),
        ms(pct(&attacked, 50.0)),
        ms(x99),
        attacked.len()
    );
    let bound = a99 + BE_NS.1 + 5_000_000;
    assert!(
        c99 <= bound,
        "the control: p99 {:.2} ms > {:.2} ms",
        ms(c99),
        ms(bound)
    );
    assert!(
        x99 <= bound,
        "an eraser delayed the bursts: p99 {:.2} ms > alone + one best-effort kernel + 5 ms = {:.2} ms",
        ms(x99),
        ms(bound)
    );
}

/// The best-effort container "be" alone on the device for `secs`: its share of the device (timeline).
fn be_share(sim: &Sim, secs: f64) -> f64 {
    let o = done(
        be_cmd(sim, "be")
            .timeout(Duration::from_secs(60))
            .args(&format!("be {secs} 1000000 2000000 11"))
            .spawn()
            .finish(),
    );
    let w: Window = o.window();
    sim.share_pct(0, w.pid, w.t0, w.end)
}

/// Lie 2 of issue 23: with no high-priority tenant anywhere, a tenant republishes a busy high-priority queue
/// every 0.5 s (measured on main: another best-effort tenant went from 100 % of the device to 0 %).
#[test]
fn a_tenant_forging_a_busy_high_priority_queue_does_not_stall_others() {
    let _s = serial();
    let sim = Sim::new().build();
    setup(&sim);
    be_share(&sim, 0.2); // the device's entries exist from here on
    let control = be_share(&sim, 2.0);
    let liar = PriorityLiar::start(&liar_file(&sim), Duration::from_millis(500), |now| {
        (now, now + 500_000_000)
    });
    let attacked = be_share(&sim, 2.0);
    liar.stop();
    println!("best-effort share of the device: {control:.1} % alone, {attacked:.1} % next to a forger");
    assert!(
        control >= 50.0,
        "the control: best-effort alone got {control:.1} %"
    );
    assert!(
        attacked >= 0.8 * control,
        "a forged high-priority queue stalled an honest best-effort tenant: {attacked:.1} % (alone {control:.1} %)"
    );
}

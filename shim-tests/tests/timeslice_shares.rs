//! SM shares of tenants that really share a device: hard 30 + 70 on the simulator's time-slicing model
//! (`CUDASIM_SCHED=slice`, shim-tests/sim/README.md), with the throttle releasing a limited tenant's work in
//! bursts of one time slice (`CUQUOTA_TIME_SLICE_US`, docs/sm-limit.md, *Tenants that really share*).
//!
//! The goal (issue 36): each tenant within [limit / Σlimits × T − 1.5, limit + 1] points of its rate alone, and
//! the sum ≥ 0.97 × T, where T is what the same two reach together without cuquota (0.90 on this model).
//! Released one kernel per repaid debt (before: `CUQUOTA_TIME_SLICE_US=0`) the 30 % tenant's ~1 ms bursts cost
//! two switches each and the 70 % tenant gets 0.57, whether limited or not. The bands here are wider than the
//! goal (a busy 2-core machine makes a program launch late, never early): the 70 % tenant must reach 0.60, which
//! the release of today's library never did (0.561-0.584 in five runs, timeslice.rs); the control runs that
//! release and shows the band rejects it.
//!
//! Figures are read from the simulator's timeline over the programs' common window after 0.5 s (≥ 4 s), never
//! from a clock of the programs or the test; compute_loop keeps 32 kernels queued (12.8 ms), so a tenant has to
//! be kept off a CPU longer than that, again and again, to lose device time.

use std::path::{Path, PathBuf};

use shim_tests::compute_loop::{metric, program as compute_loop, window};
use shim_tests::{heavy, Output, Sim};

const SMS: u32 = 132;
/// 0.40 ms kernels: 20 waves at the default 20 µs.
const BLOCKS: u32 = SMS * 20;
const SECONDS: &str = "5";

fn sim() -> Sim {
    Sim::new()
        .sms(&SMS.to_string())
        .env("CUDASIM_SCHED", "slice")
        .build()
}

/// Runs compute_loop in each container of `tenants` (name, hard SM limit or 0 for none, `CUQUOTA_TIME_SLICE_US`
/// or None for the default) at once; each one's share of the device (fraction) over their common window.
fn shares(sim: &Sim, prog: &Path, tenants: &[(&str, u32, Option<&str>)]) -> Vec<f64> {
    let _h = heavy();
    let procs: Vec<_> = tenants
        .iter()
        .map(|&(name, limit, slice)| {
            let mut c = sim
                .cmd_path(prog.to_path_buf())
                .container(name)
                .args(&format!("{SECONDS} {BLOCKS}"));
            if limit > 0 {
                c = c
                    .env("CUDA_DEVICE_SM_LIMIT", &limit.to_string())
                    .env("CUQUOTA_POLICY", "hard");
            }
            if let Some(s) = slice {
                c = c.env("CUQUOTA_TIME_SLICE_US", s);
            }
            c.spawn()
        })
        .collect();
    let outs: Vec<Output> = procs.into_iter().map(|p| p.finish()).collect();
    let (from, to) = window(&outs);
    outs.iter()
        .map(|o| sim.share_pct(0, metric(o, "pid") as u32, from, to) / 100.0)
        .collect()
}

/// Hard 30 + 70 with `slice` (None = the default), as rates relative to compute_loop alone, with T, the
/// unlimited pair's total.
fn pair(slice: Option<&str>) -> (f64, f64, f64) {
    let prog = compute_loop();
    let s = sim();
    let solo = shares(&s, &prog, &[("solo", 0, None)])[0];
    assert!(solo > 0.95, "compute_loop alone keeps the device busy: {solo:.3}");
    let free = shares(&s, &prog, &[("a", 0, None), ("b", 0, None)]);
    let hard = shares(&s, &prog, &[("a", 30, slice), ("b", 70, slice)]);
    let t = (free[0] + free[1]) / solo;
    let (a, b) = (hard[0] / solo, hard[1] / solo);
    println!(
        "slice {slice:?}: alone {solo:.3}; T {t:.3}; hard 30 + 70 {a:.3} + {b:.3} (goal ≥ {:.3} / ≥ {:.3}, sum ≥ {:.3})",
        0.3 * t - 0.015,
        0.7 * t - 0.015,
        0.97 * t
    );
    (a, b, t)
}

/// The band a regression breaks: the 30 % tenant near its share of T and never over 31 %; the 70 % tenant at
/// 0.60 or more (the goal is 0.615: 1.5 points of slack for the busy machine); the pair wastes at most 6 % of T.
fn in_band(a: f64, b: f64, t: f64) -> bool {
    (0.24..=0.31).contains(&a) && (0.60..=0.71).contains(&b) && a + b >= 0.94 * t
}

#[test]
fn hard_30_70_on_a_time_sliced_device_costs_no_device_time() {
    let (a, b, t) = pair(None);
    assert!(
        in_band(a, b, t),
        "hard 30 + 70 on `slice`: {a:.3} + {b:.3}, T {t:.3}: want 0.24-0.31 + 0.60-0.71, sum ≥ 0.94 T"
    );
}

/// Each tenant pays its part of the switching (issue 36): NVML counts the ~7 % of the device lost to switches in
/// no process's figure, so charged its own device time alone the 30 % tenant reached its whole limit (main
/// 0.294-0.299, T 0.90) and the switches came out of the 70 % tenant. Now the 30 % tenant gets about its part
/// of T (0.3 × T = 0.27): at most 2 points above it (0.29 at T 0.90), which a busy machine, making it launch
/// late, never breaks; the pair's band as above.
#[test]
fn on_a_saturated_device_each_tenant_pays_its_part_of_the_switching() {
    let (a, b, t) = pair(None);
    assert!(
        in_band(a, b, t) && a <= 0.3 * t + 0.02,
        "hard 30 + 70 on `slice`: {a:.3} + {b:.3}, T {t:.3}: want the 30 % tenant ≤ {:.3} (0.3 T + 2 points), \
         the pair 0.24-0.31 + 0.60-0.71, sum ≥ 0.94 T",
        0.3 * t + 0.02
    );
}

/// The control: the release of today's library (one launch per repaid debt) costs the pair switches, so the
/// shaped release does more (0.928 against 0.891 of the device, 2026-12-02). Before each tenant paid its part of
/// the switching the unshaped pair also failed the band (its 70 % tenant 0.57); now the 30 % tenant's charge
/// makes room for it even unshaped (0.265 + 0.626), so the sums are compared, in one test.
#[test]
fn released_one_launch_at_a_time_the_pair_loses_device_time_to_switches() {
    let (a, b, _) = pair(Some("0"));
    let (sa, sb, _) = pair(None);
    assert!(
        sa + sb >= a + b + 0.01,
        "hard 30 + 70: unshaped {a:.3} + {b:.3}, shaped {sa:.3} + {sb:.3}: the shaped release should do ≥ 1 point more"
    );
}

/// The attack: a tenant sets the largest time slice (8 ms: every release as big as the bucket holds) to get more
/// than its share beside a neighbour; it still gets at most its limit + 1 point.
#[test]
fn the_largest_time_slice_does_not_raise_a_tenants_share() {
    let prog = compute_loop();
    let s = sim();
    let solo = shares(&s, &prog, &[("solo", 0, None)])[0];
    let hard = shares(&s, &prog, &[("a", 30, Some("8000")), ("b", 0, None)]);
    let (a, b) = (hard[0] / solo, hard[1] / solo);
    println!("30 % at an 8 ms time slice beside an unlimited tenant: {a:.3} + {b:.3}");
    assert!(a <= 0.31, "30 % tenant at an 8 ms time slice: {a:.3}");
    assert!(a >= 0.24, "30 % tenant at an 8 ms time slice: {a:.3}");
}

/// Fail closed: a time slice the bucket cannot hold is refused with the variable named, not clamped silently.
#[test]
fn a_time_slice_beyond_the_bucket_is_refused() {
    let s = Sim::new().build();
    let o = s
        .cmd_path(compute_loop())
        .container("a")
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUQUOTA_TIME_SLICE_US", "8001")
        .args("1")
        .run();
    assert!(!o.success(), "an 8001 µs time slice was accepted: {o:?}");
    assert!(
        o.stderr.contains("CUQUOTA_TIME_SLICE_US"),
        "the error names the variable: {o:?}"
    );
}

/// The attack on a neighbour: under the operator's limits files a tenant sets the smallest time slice (0, one
/// launch per repaid debt) so that its bursts cost the device switches its 70 % neighbour pays for. The slice is
/// raised to the default (docs/threat-model.md, *Where two sources of a setting meet*), so the pair stays in the
/// band (the control above shows what the unshaped release costs).
#[test]
fn under_the_operators_limits_a_tenant_cannot_shrink_its_time_slice() {
    let prog = compute_loop();
    let s = sim();
    let solo = shares(&s, &prog, &[("solo", 0, None)])[0];
    let free = shares(&s, &prog, &[("a", 0, None), ("b", 0, None)]);
    let t = (free[0] + free[1]) / solo;
    let files: Vec<PathBuf> = [("a", 30), ("b", 70)]
        .iter()
        .map(|&(name, pct)| {
            let f = s.dir().join(format!("limits-{name}"));
            s.agent_limits(&f, |r| {
                r.sm_limit = pct;
                r.policy = cuquota_core::region::layout::POLICY_HARD;
            });
            f
        })
        .collect();
    let _h = heavy();
    let procs: Vec<_> = [("a", &files[0], "0"), ("b", &files[1], "2000")]
        .iter()
        .map(|&(name, file, slice)| {
            s.cmd_path(prog.clone())
                .container(name)
                .args(&format!("{SECONDS} {BLOCKS}"))
                .env("CUQUOTA_LIMITS_FILE", file.to_str().expect("utf-8 temp path"))
                .env("CUQUOTA_TIME_SLICE_US", slice)
                .spawn()
        })
        .collect();
    let outs: Vec<Output> = procs.into_iter().map(|p| p.finish()).collect();
    let (from, to) = window(&outs);
    let share = |o: &Output| s.share_pct(0, metric(o, "pid") as u32, from, to) / 100.0 / solo;
    let (a, b) = (share(&outs[0]), share(&outs[1]));
    println!("operator 30 + 70, the 30 % tenant asking a 0 µs slice: {a:.3} + {b:.3}, T {t:.3}");
    assert!(
        in_band(a, b, t),
        "a tenant's 0 µs slice under the operator's limits: {a:.3} + {b:.3}, T {t:.3}: want 0.24-0.31 + 0.60-0.71"
    );
    assert!(
        outs[0].stderr.contains("raised to 2000"),
        "the tenant is told its slice was raised: {:?}",
        outs[0]
    );
}

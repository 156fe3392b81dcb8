//! `--goals`: the goals of issue 36 item 3 (docs/sm-limit.md, *Tenants that really share*), measured on the
//! simulator's time-slicing model (`CUDASIM_SCHED=slice`, `--sched serial` for the old model), one table with
//! each row's figures, its target band and PASS/FAIL.
//!
//! Tenants are `examples/compute_loop.cu` (the program of the H200 run: batches of 8 kernels, four in flight),
//! all of a row starting to launch at one instant. Kernel lengths come from the simulator's waves (132 SMs,
//! 10 µs a wave). A figure is a tenant's **rate relative to its unlimited rate alone**: its device time over the
//! common window of the row's programs after 0.5 s of warm-up (at least 4 s, 2 s with `--quick`), divided by the
//! same program's share when it runs alone without cuquota (measured first, per kernel length). Device time is
//! read from the simulator's timeline by the monitor (`--monitor`: 50 ms bins of `cudasimDeviceBusyNs`), never
//! from a program's clock. Each row first runs the same tenants together without cuquota: T is the sum of their
//! figures.
//!
//! Priority rows reuse `priority.rs` (its high-priority tenant's bursts and a best-effort tenant), on the same
//! model.

use crate::priority::{self, Mode};
use crate::BIN_NS;
use shim_tests::{mono_ns, Output, Sim};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const SMS: u32 = 132;
const WAVE_NS: u64 = 10_000;
const WARMUP_NS: u64 = 500_000_000;
/// Programs start launching this long after they are spawned (they load and warm up meanwhile).
const LEAD_NS: u64 = 1_500_000_000;
/// The simulator's default time slice (`CUDASIM_QUANTUM_US`), which the priority goal allows.
const QUANTUM_NS: u64 = 2_000_000;

/// What cuquota does to a tenant.
#[derive(Clone, Copy)]
enum Set {
    /// No cuquota at all (no preload).
    Bare,
    /// Under cuquota, no SM limit (a container with a memory cap only, say).
    Free,
    Hard(u32),
    /// Burst (work-conserving) limit with a weight.
    Burst(u32, u32),
}

#[derive(Clone, Copy)]
struct Tenant {
    kernel_us: u64,
    set: Set,
}

fn t(kernel_us: u64, set: Set) -> Tenant {
    Tenant { kernel_us, set }
}

/// How a row is judged.
enum Goal {
    /// Each hard tenant within [L / ΣL × T − 1.5, L + 1] points and the sum ≥ 0.97 T (`Free` tenants are
    /// counted as having what the limits leave: 100 − ΣL).
    Share,
    /// Burst: no tenant under its limit and the spare time (the sum above ΣL) split by weight within 3 points.
    Burst,
    /// Alone: within 1 point of the limit.
    Alone,
}

struct Row {
    name: &'static str,
    tenants: Vec<Tenant>,
    goal: Goal,
}

fn rows() -> Vec<Row> {
    use Set::*;
    let pair = |k1, l1, k2, l2| vec![t(k1, Hard(l1)), t(k2, Hard(l2))];
    vec![
        Row {
            name: "hard 30 + 70, 0.4 ms kernels",
            tenants: pair(400, 30, 400, 70),
            goal: Goal::Share,
        },
        Row {
            name: "hard 30 + 70, 50 µs kernels",
            tenants: pair(50, 30, 50, 70),
            goal: Goal::Share,
        },
        Row {
            name: "hard 30 + 70, 5 ms kernels",
            tenants: pair(5000, 30, 5000, 70),
            goal: Goal::Share,
        },
        Row {
            name: "hard 30 (50 µs) + 70 (5 ms)",
            tenants: pair(50, 30, 5000, 70),
            goal: Goal::Share,
        },
        Row {
            name: "hard 30 (5 ms) + 70 (50 µs)",
            tenants: pair(5000, 30, 50, 70),
            goal: Goal::Share,
        },
        Row {
            name: "hard 20 / 30 / 50, 0.4 ms",
            tenants: vec![t(400, Hard(20)), t(400, Hard(30)), t(400, Hard(50))],
            goal: Goal::Share,
        },
        Row {
            name: "burst 25 + 25, weights 1 : 3, 0.4 ms",
            tenants: vec![t(400, Burst(25, 100)), t(400, Burst(25, 300))],
            goal: Goal::Burst,
        },
        Row {
            name: "hard 30 + an uncapped container, 0.4 ms",
            tenants: vec![t(400, Hard(30)), t(400, Free)],
            goal: Goal::Share,
        },
        Row {
            name: "hard 30 alone, 0.4 ms",
            tenants: vec![t(400, Hard(30))],
            goal: Goal::Alone,
        },
        Row {
            name: "hard 70 alone, 0.4 ms",
            tenants: vec![t(400, Hard(70))],
            goal: Goal::Alone,
        },
    ]
}

/// Runs and settings shared by every row.
struct Bench {
    sched: String,
    secs: f64,
    prog: PathBuf,
    /// Unlimited share alone per kernel length (µs).
    alone: BTreeMap<u64, f64>,
}

/// Builds `examples/compute_loop.cu` with the pinned CUDA 13 toolchain, as shim-tests/tests/timeslice.rs does.
fn compute_loop() -> PathBuf {
    let out = shim_tests::target_dir().join("examples/cu13");
    let st = Command::new(shim_tests::workspace_root().join("examples/build.sh"))
        .args(["--cuda", "13", "--out"])
        .arg(&out)
        .arg("compute_loop")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run examples/build.sh");
    assert!(
        st.success(),
        "examples/build.sh failed: the pinned CUDA toolchain is installed by `scripts/setup.sh cu13`"
    );
    out.join("compute_loop")
}

fn sim(sched: &str, extra: &[(&str, &str)]) -> Sim {
    let mut b = Sim::new()
        .sms(&SMS.to_string())
        .env("CUDASIM_SCHED", sched)
        .env("CUDASIM_WAVE_NS", &WAVE_NS.to_string());
    for (k, v) in extra {
        b = b.env(k, v);
    }
    b.build()
}

fn metric(o: &Output, k: &str) -> u64 {
    o.get(&format!("metric {k}"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("compute_loop printed no metric {k}:{o:?}"))
}

impl Bench {
    /// Runs `tenants` together on a fresh simulated GPU; returns each one's share of the device (fraction) over
    /// the common window after the warm-up, and the window's length (ns).
    fn shares(&self, tenants: &[Tenant]) -> (Vec<f64>, u64) {
        let s = sim(&self.sched, &[]);
        let start = mono_ns() + LEAD_NS;
        let timeout = Duration::from_secs_f64(self.secs * 3.0 + 60.0);
        let procs: Vec<_> = tenants
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let blocks = SMS as u64 * (t.kernel_us * 1000).div_ceil(WAVE_NS);
                let mut c = s
                    .cmd_path(self.prog.clone())
                    .container(&format!("c{i}"))
                    .timeout(timeout)
                    .args(&format!("{} {blocks} 0 {start}", self.secs));
                c = match t.set {
                    Set::Bare => c.no_preload(),
                    Set::Free => c,
                    Set::Hard(l) => c
                        .env("CUDA_DEVICE_SM_LIMIT", &l.to_string())
                        .env("CUQUOTA_POLICY", "hard"),
                    Set::Burst(l, w) => c
                        .env("CUDA_DEVICE_SM_LIMIT", &l.to_string())
                        .env("CUQUOTA_POLICY", "burst")
                        .env("CUQUOTA_WEIGHT", &w.to_string()),
                };
                c.spawn()
            })
            .collect();
        let mon = crate::spawn_monitor(&s, start, &procs, timeout);
        let outs: Vec<Output> = procs.into_iter().map(|p| p.finish()).collect();
        let mon = mon.finish();
        for o in &outs {
            assert!(o.success(), "compute_loop failed:{o:?}");
        }
        assert!(mon.success(), "the monitor failed:{mon:?}");
        let from = outs.iter().map(|o| metric(o, "t0_mono_ns")).max().unwrap() + WARMUP_NS;
        let to = outs.iter().map(|o| metric(o, "t1_mono_ns")).min().unwrap();
        // Whole monitor bins inside [from, to).
        let k0 = (from.saturating_sub(start)).div_ceil(BIN_NS) as usize;
        let k1 = (to.saturating_sub(start) / BIN_NS) as usize;
        let bins: Vec<Vec<u64>> = outs
            .iter()
            .map(|o| {
                mon.val(&format!("bins.{}", metric(o, "pid")))
                    .split(',')
                    .map(|v| v.parse().expect("bin"))
                    .collect()
            })
            .collect();
        let k1 = bins.iter().map(Vec::len).fold(k1, usize::min);
        assert!(k1 > k0, "no common window after the warm-up ({from}..{to})");
        let len = (k1 - k0) as u64 * BIN_NS;
        let shares = bins
            .iter()
            .map(|b| b[k0..k1].iter().sum::<u64>() as f64 / len as f64)
            .collect();
        (shares, len)
    }

    /// Each tenant's rate relative to its unlimited rate alone.
    fn rates(&mut self, tenants: &[Tenant]) -> (Vec<f64>, u64) {
        for t in tenants {
            if !self.alone.contains_key(&t.kernel_us) {
                let (s, _) = self.shares(&[Tenant {
                    kernel_us: t.kernel_us,
                    set: Set::Bare,
                }]);
                self.alone.insert(t.kernel_us, s[0]);
            }
        }
        let (s, len) = self.shares(tenants);
        let r = s
            .iter()
            .zip(tenants)
            .map(|(x, t)| x / self.alone[&t.kernel_us])
            .collect();
        (r, len)
    }
}

/// Points (of a fraction), one decimal unless that would show 0.0.
fn pts(v: f64) -> String {
    let p = v * 100.0;
    if p < 0.05 {
        format!("{p:.2}")
    } else {
        format!("{p:.1}")
    }
}

fn f3(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn kernels(ts: &[Tenant]) -> String {
    let k = |us: u64| {
        if us >= 100 {
            format!("{} ms", us as f64 / 1000.0)
        } else {
            format!("{us} µs")
        }
    };
    if ts.iter().all(|t| t.kernel_us == ts[0].kernel_us) {
        k(ts[0].kernel_us)
    } else {
        ts.iter().map(|t| k(t.kernel_us)).collect::<Vec<_>>().join(" / ")
    }
}

/// The target and the verdict of `got` (rates) against `goal` with baseline total `tt`.
fn judge(goal: &Goal, ts: &[Tenant], got: &[f64], tt: f64) -> (String, String) {
    let lim = |t: &Tenant| match t.set {
        Set::Hard(l) | Set::Burst(l, _) => Some(l as f64 / 100.0),
        _ => None,
    };
    let sum: f64 = got.iter().sum();
    let mut miss: Vec<String> = Vec::new();
    let target = match goal {
        Goal::Share => {
            let sl: f64 = ts.iter().filter_map(lim).sum();
            let free = ts.iter().filter(|t| lim(t).is_none()).count() as f64;
            let total = if free > 0.0 { 1.0 } else { sl };
            let mut bands = Vec::new();
            for (t, &x) in ts.iter().zip(got) {
                let Some(l) = lim(t) else {
                    bands.push("–".to_string());
                    continue;
                };
                let (lo, hi) = (l / total * tt - 0.015, l + 0.01);
                bands.push(format!("[{lo:.3}, {hi:.3}]"));
                if x < lo {
                    miss.push(format!("{:.0} %: {} points under", l * 100.0, pts(lo - x)));
                } else if x > hi {
                    miss.push(format!("{:.0} %: {} points over", l * 100.0, pts(x - hi)));
                }
            }
            let mut s = bands.join(" + ");
            if free == 0.0 {
                s += &format!("; sum ≥ {:.3}", 0.97 * tt);
                if sum < 0.97 * tt {
                    miss.push(format!("sum {} points under", pts(0.97 * tt - sum)));
                }
            }
            s
        }
        Goal::Burst => {
            let ls: Vec<f64> = ts.iter().map(|t| lim(t).unwrap_or(0.0)).collect();
            let ws: Vec<f64> = ts
                .iter()
                .map(|t| match t.set {
                    Set::Burst(_, w) => w as f64,
                    _ => 0.0,
                })
                .collect();
            let spare: f64 = got.iter().zip(&ls).map(|(x, l)| x - l).sum();
            let wsum: f64 = ws.iter().sum();
            let mut parts = Vec::new();
            for ((x, l), w) in got.iter().zip(&ls).zip(&ws) {
                let want = l + spare * w / wsum;
                parts.push(format!("{want:.3}"));
                if *x < *l {
                    miss.push(format!(
                        "{:.0} %: under its limit by {} points",
                        l * 100.0,
                        pts(l - x)
                    ));
                }
                if (x - want).abs() > 0.03 {
                    miss.push(format!(
                        "{:.0} %: {} points from its part of the spare",
                        l * 100.0,
                        pts((x - want).abs())
                    ));
                }
            }
            format!(
                "each ≥ its limit; split of the spare {spare:.3}: {} (± 0.03)",
                parts.join(" + ")
            )
        }
        Goal::Alone => {
            let l = lim(&ts[0]).unwrap_or(1.0);
            if (got[0] - l).abs() > 0.01 {
                miss.push(format!("{} points from the limit", pts((got[0] - l).abs())));
            }
            format!("[{:.3}, {:.3}]", l - 0.01, l + 0.01)
        }
    };
    let verdict = if miss.is_empty() {
        "PASS".to_string()
    } else {
        format!("**FAIL** ({})", miss.join("; "))
    };
    (target, verdict)
}

/// Prints the goals table. `filter`: run only rows whose name contains it (`priority` for the priority rows).
pub(crate) fn bench(sched: &str, secs: f64, filter: Option<&str>) {
    let mut b = Bench {
        sched: sched.to_string(),
        secs,
        prog: compute_loop(),
        alone: BTreeMap::new(),
    };
    let want = |name: &str| filter.is_none_or(|f| name.contains(f));
    println!(
        "## Issue 36 goals on the simulator (`CUDASIM_SCHED={sched}`), compute_loop, {:.1} s windows after 0.5 s warm-up\n",
        secs - 0.5
    );
    println!(
        "Figures: rate relative to the unlimited rate alone (device time from the simulator's timeline). \
         T = the row's tenants together without cuquota (sum).\n"
    );
    println!("| goal | kernels | no cuquota (T) | cuquota (sum) | target | result |");
    println!("|---|---|---|---|---|---|");
    for r in rows() {
        if !want(r.name) {
            continue;
        }
        let bare: Vec<Tenant> = r.tenants.iter().map(|x| t(x.kernel_us, Set::Bare)).collect();
        let (base, _) = if matches!(r.goal, Goal::Alone) {
            (vec![1.0], 0)
        } else {
            b.rates(&bare)
        };
        let tt: f64 = base.iter().sum();
        let (got, len) = b.rates(&r.tenants);
        let (target, verdict) = judge(&r.goal, &r.tenants, &got, tt);
        let short = if len < 4_000_000_000 {
            format!(" (window {:.2} s)", len as f64 / 1e9)
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {} ({tt:.3}) | {} ({:.3}){short} | {target} | {verdict} |",
            r.name,
            kernels(&r.tenants),
            if matches!(r.goal, Goal::Alone) {
                "1 (alone)".to_string()
            } else {
                f3(&base)
            },
            f3(&got),
            got.iter().sum::<f64>()
        );
    }
    if want("priority") {
        priority_rows(sched, secs);
    }
    println!(
        "\nUnlimited share alone (the reference of every rate): {}.\n",
        b.alone
            .iter()
            .map(|(k, v)| format!("{k} µs {v:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// High-priority p99 ≤ alone + one best-effort kernel + one quantum; best effort ≥ 85 % of the time the
/// high-priority tenant leaves idle.
fn priority_rows(sched: &str, secs: f64) {
    // (name, best-effort kernel range, PT_BE_DEPTH: launches between synchronisations, 0 = never)
    let cases: [(&str, (u64, u64), u32); 2] = [
        (
            "priority, best effort 1–2 ms kernels, synchronising every 8 (the H200 run)",
            (1_000_000, 2_000_000),
            8,
        ),
        (
            "priority, best effort 50–150 µs kernels, unbounded queue",
            (50_000, 150_000),
            0,
        ),
    ];
    for (name, be, depth) in cases {
        let mut b = Sim::new().env("CUDASIM_SCHED", sched);
        let d = depth.to_string();
        if depth > 0 {
            b = b.env("PT_BE_DEPTH", &d);
        }
        let s = b.build();
        s.create_priority_dir();
        let alone = priority::run(&s, Mode::Bare, None, secs, None);
        let bare = priority::run(&s, Mode::Bare, Some(be), secs, None);
        let prio = priority::run(&s, Mode::Priority, Some(be), secs, None);
        let p99 = |r: &priority::Run| priority::pct(&r.lat, 99.0);
        let goal = p99(&alone) + be.1 + QUANTUM_NS;
        let share = prio.idle_share.unwrap_or(0.0);
        let mut miss = Vec::new();
        if p99(&prio) > goal {
            miss.push(format!("p99 {:.2} ms over", (p99(&prio) - goal) as f64 / 1e6));
        }
        if share < 85.0 {
            miss.push(format!("share {:.1} points under", 85.0 - share));
        }
        println!(
            "| {name} | 20 × 200 µs bursts | p99 {:.2} ms, best effort {:.1} % of idle (alone: p99 {:.2} ms) | \
             p99 {:.2} ms, best effort {:.1} % of idle | p99 ≤ {:.2} ms; ≥ 85 % of idle | {} |",
            p99(&bare) as f64 / 1e6,
            bare.idle_share.unwrap_or(0.0),
            p99(&alone) as f64 / 1e6,
            p99(&prio) as f64 / 1e6,
            share,
            goal as f64 / 1e6,
            if miss.is_empty() {
                "PASS".to_string()
            } else {
                format!("**FAIL** ({})", miss.join("; "))
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(goal: Goal, ts: &[Tenant], got: &[f64], tt: f64) -> bool {
        judge(&goal, ts, got, tt).1 == "PASS"
    }

    /// The bands of issue 36 item 3: the H200's limited pair fails on its 70 % tenant (band from 0.615), a pair
    /// that shares T by the limits passes.
    #[test]
    fn the_h200_pair_fails_and_a_pair_sharing_t_by_the_limits_passes() {
        let ts = [t(400, Set::Hard(30)), t(400, Set::Hard(70))];
        let (target, verdict) = judge(&Goal::Share, &ts, &[0.297, 0.566], 0.902);
        assert_eq!(target, "[0.256, 0.310] + [0.616, 0.710]; sum ≥ 0.875");
        assert!(
            verdict.starts_with("**FAIL** (70 %: 5.0 points under"),
            "{verdict}"
        );
        assert!(pass(Goal::Share, &ts, &[0.27, 0.63], 0.902));
        // Over the limit + 1 fails, and so does wasting device time.
        assert!(!pass(Goal::Share, &ts, &[0.315, 0.62], 0.902));
        assert!(!pass(Goal::Share, &ts, &[0.256, 0.617], 0.902));
    }

    #[test]
    fn an_uncapped_neighbour_leaves_the_rest_of_the_device() {
        let ts = [t(400, Set::Hard(30)), t(400, Set::Free)];
        assert!(pass(Goal::Share, &ts, &[0.26, 0.6], 0.9));
        assert!(!pass(Goal::Share, &ts, &[0.25, 0.6], 0.9));
    }

    #[test]
    fn burst_splits_the_spare_by_weight_and_keeps_each_limit() {
        let ts = [t(400, Set::Burst(25, 100)), t(400, Set::Burst(25, 300))];
        assert!(pass(Goal::Burst, &ts, &[0.35, 0.53], 0.9));
        assert!(!pass(Goal::Burst, &ts, &[0.399, 0.445], 0.9));
        assert!(!pass(Goal::Burst, &ts, &[0.24, 0.27], 0.9));
    }

    #[test]
    fn alone_within_one_point() {
        let ts = [t(400, Set::Hard(30))];
        assert!(pass(Goal::Alone, &ts, &[0.296], 1.0));
        assert!(!pass(Goal::Alone, &ts, &[0.285], 1.0));
    }
}

//! `--only priority`: a latency-critical tenant and a best-effort tenant on one simulated GPU (docs/priority.md).
//!
//! The high-priority tenant (`c/priority_tenant.c hp`, container `hp`) issues bursts of 20 kernels of 200 µs,
//! synchronises, and sleeps a random 10–40 ms; a burst's latency runs from just before its first launch to the
//! end of its last kernel on the device timeline. The best-effort tenant (`priority_tenant be`, container `be`)
//! launches kernels of random length as fast as it is let. Runs per best-effort kernel length: the
//! high-priority tenant alone, both without cuquota, both under cuquota with `CUDA_TASK_PRIORITY` 0 and 1 and
//! the node's priority file, the same next to each lying container, and the high-priority tenant under cuquota
//! next to a best-effort tenant that bypasses it, held only by the node agent. The best-effort tenant's share of idle time is its device time inside the
//! high-priority tenant's window over the time the high-priority tenant left the device idle there (timeline).

use shim_tests::{mono_ns, Output, PriorityLiar, Prog, Sim, Window};
use std::time::Duration;

const BURST: u32 = 20;
const KERNEL_NS: u64 = 200_000;
const GAP_NS: (u64, u64) = (10_000_000, 40_000_000);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Bare,
    Priority,
    /// The high-priority tenant under cuquota, the best-effort one bypassing it (no preload, its queue as deep as
    /// the driver takes) in a container the node agent holds to a hard [`BYPASS_SM`] % (`sm = "throttle"`).
    Bypass,
}

/// The bypassing container's SM limit: a hard limit, as docs/agent.md sets one for a tenant it must hold.
const BYPASS_SM: u32 = 10;

pub(crate) struct Run {
    pub(crate) lat: Vec<u64>,
    /// The best-effort tenant's share of the time the high-priority one left idle, in percent.
    pub(crate) idle_share: Option<f64>,
    /// The best-effort tenant died of a signal (the agent killed it: freezing could not hold its queue).
    be_killed: bool,
}

fn spawn(sim: &Sim, mode: Mode, container: &str, args: String, secs: f64) -> shim_tests::Proc {
    let c = sim
        .cmd(Prog::PriorityTenant)
        .container(container)
        .timeout(Duration::from_secs_f64(secs * 3.0 + 60.0))
        .args(&args);
    match (mode, container) {
        (Mode::Priority | Mode::Bypass, "hp") => c.priority("0"),
        (Mode::Bare | Mode::Bypass, _) => c.no_preload(),
        (Mode::Priority, _) => c.priority("1"),
    }
    .spawn()
}

fn ok(o: Output) -> Output {
    assert!(o.success(), "a tenant failed:{o:?}");
    o
}

/// A lie of issue 23 told by a best-effort container "liar" with no GPU work, through the only file it may
/// write: (words it writes, how often).
type Lie = (fn(u64) -> (u64, u64), Duration);

pub(crate) fn run(sim: &Sim, mode: Mode, be_ns: Option<(u64, u64)>, secs: f64, lie: Option<Lie>) -> Run {
    let t = mono_ns() + 1_500_000_000;
    let liar = lie.map(|(w, every)| PriorityLiar::start(&sim.liar_priority_file("liar", "be"), every, w));
    let be = be_ns.map(|(lo, hi)| {
        let a = format!("be {} {lo} {hi} 11 {}", secs + 1.0, t - 500_000_000);
        spawn(sim, mode, "be", a, secs)
    });
    let agent = (mode == Mode::Bypass).then(|| {
        let b = be.as_ref().expect("a bypassing tenant");
        shim_tests::priority::BypassAgent::start(sim, "be", b.pid(), BYPASS_SM)
    });
    let a = format!("hp {secs} {BURST} {KERNEL_NS} {} {} 7 {t}", GAP_NS.0, GAP_NS.1);
    let hp = spawn(sim, mode, "hp", a, secs);
    // The timeline's ring keeps the last 16384 kernels: short best-effort kernels overwrite a 10 s run's
    // beginning, so the monitor reads it in 50 ms bins while it runs (as for the SM-limit tables).
    let mon = be.as_ref().map(|b| {
        sim.cmd_path(std::env::current_exe().expect("current_exe"))
            .no_preload()
            .timeout(Duration::from_secs_f64(secs * 3.0 + 60.0))
            .arg("--monitor")
            .arg(&t.to_string())
            .arg(&format!("{},{}", hp.pid(), b.pid()))
            .spawn()
    });
    let (hp_pid, be_pid) = (hp.pid(), be.as_ref().map(|b| b.pid()));
    let hp = ok(hp.finish());
    let w: Window = hp.window();
    // The agent thaws what it froze when stopped, so the tenant can finish.
    if let Some(a) = agent {
        a.stop();
    }
    let be_killed = be.is_some_and(|b| {
        let o = b.finish();
        assert!(o.success() || (mode == Mode::Bypass && !o.timed_out), "{o:?}");
        !o.success()
    });
    if let Some(l) = liar {
        l.stop();
    }
    let idle_share = mon.map(|m| {
        let m = m.finish();
        assert!(m.success(), "{m:?}");
        let bins = |pid: u32| -> Vec<u64> {
            m.val(&format!("bins.{pid}"))
                .split(',')
                .map(|v| v.parse().expect("bin"))
                .collect()
        };
        // Whole bins inside the high-priority tenant's window.
        let n = (w.end.saturating_sub(t) / crate::BIN_NS) as usize;
        let (h, b) = (bins(hp_pid), bins(be_pid.expect("be")));
        let n = n.min(h.len()).min(b.len());
        let hb: u64 = h[..n].iter().sum();
        let bb: u64 = b[..n].iter().sum();
        bb as f64 * 100.0 / (n as u64 * crate::BIN_NS).saturating_sub(hb).max(1) as f64
    });
    Run {
        lat: hp
            .val("lat_ns")
            .split(',')
            .map(|v| v.parse().expect("latency"))
            .collect(),
        idle_share,
        be_killed,
    }
}

pub(crate) fn pct(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s[((s.len() - 1) as f64 * p / 100.0).round() as usize]
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn lat(r: &Run) -> String {
    format!(
        "{:.2} / {:.2} ({})",
        ms(pct(&r.lat, 50.0)),
        ms(pct(&r.lat, 99.0)),
        r.lat.len()
    )
}

/// Prints the priority table for `secs`-second runs; `CUDASIM_SCHED=slice` in the bench's environment runs it on
/// the time-sliced device (shim-tests/sim/README.md; the default, `serial`, is the model its goals were set on).
pub(crate) fn bench(secs: f64) {
    let sched = std::env::var("CUDASIM_SCHED").unwrap_or_else(|_| "serial".into());
    println!(
        "## Priority: high-priority bursts ({BURST} × {} µs, gaps {}–{} ms) with a best-effort tenant \
         (`CUDASIM_SCHED={sched}`)\n",
        KERNEL_NS / 1000,
        GAP_NS.0 / 1_000_000,
        GAP_NS.1 / 1_000_000
    );
    println!(
        "Burst latency p50 / p99 ms (bursts). Goals (issue 23): kernels of 1–5 ms: p99 with cuquota ≤ p99 alone \
         + one best-effort kernel, best-effort share of idle time ≥ 90 %; short kernels: p99 ≤ 1.10 × alone, \
         share ≥ 85 %. With a lying best-effort container (an eraser of the high-priority state, a forger of a \
         busy high-priority queue every 0.5 s): the same p99 goal, ≥ 80 % of the share without the liar. \
         A bypasser: the best-effort tenant without cuquota (its queue as deep as the simulator takes: 1024 \
         kernels) in a container the node agent holds to a hard {BYPASS_SM} % (`sm = \"throttle\"`, 200 ms \
         interval), next to the high-priority tenant under cuquota; not part of the goals.\n"
    );
    println!(
        "| best-effort kernels | alone | + best-effort, no cuquota | + best-effort, cuquota priority | \
         goal p99 ≤ | met | best-effort share of idle (no cuquota / priority) | + an eraser: latency / share | \
         + a forger: latency / share | + a bypasser, agent {BYPASS_SM} %: latency / share |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let cases: [(&str, (u64, u64), bool); 3] = [
        ("1–5 ms", (1_000_000, 5_000_000), false),
        ("50–150 µs", (50_000, 150_000), true),
        ("200 µs", (200_000, 200_000), true),
    ];
    for (name, be_ns, short) in cases {
        let sim = Sim::new().env("CUDASIM_SCHED", &sched).build();
        sim.create_priority_dir();
        let alone = run(&sim, Mode::Bare, None, secs, None);
        let bare = run(&sim, Mode::Bare, Some(be_ns), secs, None);
        let prio = run(&sim, Mode::Priority, Some(be_ns), secs, None);
        let erased = run(
            &sim,
            Mode::Priority,
            Some(be_ns),
            secs,
            Some((PriorityLiar::erase, Duration::from_micros(50))),
        );
        let forged = run(
            &sim,
            Mode::Priority,
            Some(be_ns),
            secs,
            Some((PriorityLiar::forge, Duration::from_millis(500))),
        );
        let bypass = run(&sim, Mode::Bypass, Some(be_ns), secs, None);
        let a99 = pct(&alone.lat, 99.0);
        let (goal, share_goal) = if short {
            (a99 + a99 / 10, 85.0)
        } else {
            (a99 + be_ns.1, 90.0)
        };
        let p99 = pct(&prio.lat, 99.0);
        let (ib, ip) = (bare.idle_share.unwrap_or(0.0), prio.idle_share.unwrap_or(0.0));
        let liars = [&erased, &forged].map(|r| {
            let share = r.idle_share.unwrap_or(0.0);
            let ok = pct(&r.lat, 99.0) <= goal && share >= 0.8 * ip;
            (format!("{} / {share:.1} %", lat(r)), ok)
        });
        println!(
            "| {name} | {} | {} | {} | {:.2} | {} | {ib:.1} % / {ip:.1} % | {} | {} | {}, max {:.0} / {:.1} %{} |",
            lat(&alone),
            lat(&bare),
            lat(&prio),
            ms(goal),
            if p99 <= goal && ip >= share_goal && liars.iter().all(|l| l.1) {
                "yes"
            } else {
                "**no**"
            },
            liars[0].0,
            liars[1].0,
            lat(&bypass),
            ms(bypass.lat.iter().copied().max().unwrap_or(0)),
            bypass.idle_share.unwrap_or(0.0),
            if bypass.be_killed { ", killed" } else { "" }
        );
    }
    println!();
}

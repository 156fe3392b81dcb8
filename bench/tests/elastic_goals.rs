//! Issue 39 item 5, the goals elastic memory can be measured on now, through libcuquota.so on the simulator
//! (a bench, not a CI test: `#[ignore]`d, figures printed, nothing asserted but the bytes). Figures:
//! bench/results/2026-12-02-elastic.md.
//!
//! ```text
//! cargo build --release -p cuquota -p cuquota-sim
//! CUQUOTA_TEST_PROFILE=release cargo test --release -p cuquota-bench --test elastic_goals -- --ignored \
//!     --nocapture --test-threads 1
//! ```
//! `ELASTIC_GOALS_COUNTS` (default `1,4,8`: buffers of 64 MiB), `ELASTIC_GOALS_REPS` (default 3),
//! `ELASTIC_GOALS_SECONDS` (default 120: the integrity and eight-tenant runs' budget), `ELASTIC_GOALS_CYCLES`
//! (default 1000), `ELASTIC_GOALS_WAKES` (the eight-tenant run ends after this many wake-ups; default: none).

use shim_tests::reclaim::{agent_reclaims, elastic_limits};
use shim_tests::{compile_c, workspace_root, Proc, Sim, MIB};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The modelled copy engines: below this host's memcpy (bench/results/2026-12-02-elastic-mechanism.md), so the
/// model, not the host, sets the time.
const H2D_GBPS: f64 = 0.25;
const D2H_GBPS: f64 = 0.5;

fn program() -> PathBuf {
    let root = workspace_root();
    compile_c(
        "elastic_goals",
        &root.join("bench/elastic_goals.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// The agent's limits file: an 8 GiB limit with a 1 MiB request (everything movable moves), and the ask.
fn limits(sim: &Sim, evict: bool) {
    elastic_limits(&sim.limits_file(), 8 << 30, MIB, evict);
}

/// The tenant and how many answers of each key it gave.
struct Tenant {
    p: Proc,
    seen: HashMap<&'static str, usize>,
    before: u64,
}

impl Tenant {
    fn start(sim: &Sim, count: u64, mib: u64) -> Tenant {
        let mut p = sim
            .cmd_path(program())
            .arg(&count.to_string())
            .arg(&mib.to_string())
            .timeout(Duration::from_secs(1800))
            .spawn();
        let before = p.wait_for("resident").parse().unwrap();
        p.wait_for("ready");
        let mut seen = HashMap::new();
        seen.insert("resident", 1);
        Tenant { p, seen, before }
    }

    fn get(&mut self, key: &'static str) -> String {
        let n = self.seen.entry(key).or_insert(0);
        *n += 1;
        let n = *n;
        self.p.wait_for_nth(key, n)
    }

    fn num(&mut self, key: &'static str) -> i64 {
        self.get(key).parse().unwrap()
    }

    fn check(&mut self) -> bool {
        self.p.send("check");
        self.get("ok") == "1"
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The `p`th percentile (nearest rank) of `v`; 0 when empty.
fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// /proc/loadavg's three figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

/// Goal: evict at >= 80 % of the modelled D2H bandwidth and restore at >= 80 % of H2D, mapping included.
/// Evict = from the ask (the limits file written) to the simulator's NVML showing the bytes gone (the mover's
/// 20 ms look included); restore = the first launch's call after the ask is cleared (it brings every buffer back
/// before it returns). Baseline in the same run: plain pinned copies of the same buffers.
#[test]
#[ignore = "bench: figures printed (bench/results/2026-12-02-elastic.md)"]
fn evict_and_restore_bandwidth_through_the_library() {
    let counts: Vec<u64> = std::env::var("ELASTIC_GOALS_COUNTS")
        .unwrap_or_else(|_| "1,4,8".into())
        .split(',')
        .map(|c| c.trim().parse().expect("ELASTIC_GOALS_COUNTS: numbers"))
        .collect();
    let reps: usize = env_or("ELASTIC_GOALS_REPS", 3);
    let mib = 64;
    println!(
        "model H2D {H2D_GBPS} GB/s, D2H {D2H_GBPS} GB/s; {reps} cycles a row, medians; ratio = model time / time"
    );
    println!("| buffers | bytes MiB | plain D2H / H2D ratio | evict ms | evict ratio | evict vs plain | restore ms | restore ratio | restore vs plain | launches ms | intact |");
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for count in counts {
        let sim = Sim::new()
            .memory("4g")
            .env("CUDASIM_H2D_GBPS", &H2D_GBPS.to_string())
            .env("CUDASIM_D2H_GBPS", &D2H_GBPS.to_string())
            .build();
        limits(&sim, false);
        let mut t = Tenant::start(&sim, count, mib);
        let bytes = (count * mib * MIB) as f64;
        let model_d2h = bytes / D2H_GBPS; // ns: bytes / (GB/s) = ns
        let model_h2d = bytes / H2D_GBPS;
        t.p.send("base");
        let plain_d2h = t.num("d2h_ns") as f64;
        let plain_h2d = t.num("h2d_ns") as f64;
        let low = t.before - count * mib * MIB;
        let (mut ev, mut re, mut la) = (vec![], vec![], vec![]);
        for rep in 0..reps {
            limits(&sim, true);
            t.p.send(&format!("evict {low}"));
            let e = t.num("evict_ns");
            assert!(e > 0, "{count} x {mib} MiB, cycle {rep}: never evicted");
            limits(&sim, false);
            t.p.send("restore");
            re.push(t.num("restore_ns") as f64);
            la.push(t.num("launches_ns") as f64);
            t.num("sync_ns");
            let r = t.num("resident") as u64;
            assert_eq!(r, t.before, "{count} x {mib} MiB, cycle {rep}: not restored");
            ev.push(e as f64);
        }
        let intact = t.check();
        let (e, r, l) = (median(&mut ev), median(&mut re), median(&mut la));
        println!(
            "| {count} | {} | {:.3} / {:.3} | {:.1} | {:.3} | {:.3} | {:.1} | {:.3} | {:.3} | {:.1} | {} |",
            count * mib,
            model_d2h / plain_d2h,
            model_h2d / plain_h2d,
            ms(e),
            model_d2h / e,
            plain_d2h / e,
            ms(r),
            model_h2d / r,
            plain_h2d / r,
            ms(l),
            if intact { "yes" } else { "NO" }
        );
        t.p.send("quit");
        t.num("resident");
        let out = t.p.finish();
        assert!(out.success(), "{out:?}");
        assert!(intact, "{count} x {mib} MiB: bytes changed");
    }
}

/// Goal: every byte equal after 1000 evict/restore cycles. Two 4 MiB buffers (movable: >= 2 MiB), each cycle:
/// the ask, the bytes gone from the device, a kernel adding 1 to every byte while still evicted (it works on the
/// host copy), the ask cleared, a kernel that restores and adds 1 again, every byte compared. Fast engines
/// (25 GB/s: the host sets the pace); cycles until `ELASTIC_GOALS_CYCLES` or `ELASTIC_GOALS_SECONDS`.
#[test]
#[ignore = "bench: figures printed (bench/results/2026-12-02-elastic.md)"]
fn integrity_over_many_cycles() {
    let want: u64 = env_or("ELASTIC_GOALS_CYCLES", 1000);
    let budget = Duration::from_secs(env_or("ELASTIC_GOALS_SECONDS", 120));
    let (count, mib) = (2u64, 4u64);
    let sim = Sim::new()
        .memory("4g")
        .env("CUDASIM_H2D_GBPS", "25")
        .env("CUDASIM_D2H_GBPS", "25")
        .build();
    limits(&sim, false);
    let mut t = Tenant::start(&sim, count, mib);
    let low = t.before - count * mib * MIB;
    let t0 = Instant::now();
    let (mut cycles, mut bad, mut evict_total, mut restore_total) = (0u64, 0u64, 0f64, 0f64);
    while cycles < want && t0.elapsed() < budget {
        limits(&sim, true);
        t.p.send(&format!("evict {low}"));
        let e = t.num("evict_ns");
        assert!(e > 0, "cycle {cycles}: never evicted");
        evict_total += e as f64;
        // Still asked: the kernel runs on the host copy; nothing comes back.
        t.p.send("restore");
        for k in ["restore_ns", "launches_ns", "sync_ns"] {
            t.num(k);
        }
        let r = t.num("resident") as u64;
        assert!(r <= low, "cycle {cycles}: restored while asked ({r} > {low})");
        limits(&sim, false);
        t.p.send("restore");
        restore_total += t.num("restore_ns") as f64;
        t.num("launches_ns");
        t.num("sync_ns");
        let r = t.num("resident") as u64;
        assert_eq!(r, t.before, "cycle {cycles}: not restored");
        if !t.check() {
            bad += 1;
        }
        cycles += 1;
    }
    let took = t0.elapsed().as_secs_f64();
    println!(
        "integrity: {cycles} cycles of {count} x {mib} MiB in {took:.1} s ({:.1} ms a cycle: evict {:.1} ms, \
         restore {:.2} ms, means), {bad} with a byte wrong (goal: 1000 cycles, 0 wrong)",
        took * 1e3 / cycles as f64,
        ms(evict_total / cycles as f64),
        ms(restore_total / cycles as f64)
    );
    t.p.send("quit");
    t.num("resident");
    let out = t.p.finish();
    assert!(out.success(), "{out:?}");
    assert_eq!(bad, 0, "bytes changed");
}

/// Goal: 8 tenants on one device, the sum of their limits >= 3x the device, at most 2 active at a time: 0
/// out-of-memory failures and 0 kills over 1000 wake-ups. Device 1 GiB; each tenant limit 1 GiB, request
/// `ELASTIC_GOALS_REQUEST_MIB` (default 64; 128 = the sum of requests the device), holding 4 x 64 MiB (2 GiB held in all); the agent with a pinned-host budget of 8 GiB. A wake-up
/// allocates 64 MiB (waiting for the agent's reclaim when the device is full), launches on its buffers (restoring
/// them), synchronises and frees; two tenants wake at a time, round-robin, for `ELASTIC_GOALS_SECONDS`.
/// Needs the release `cuquota` CLI (the agent) too.
#[test]
#[ignore = "bench: figures printed (bench/results/2026-12-02-elastic.md)"]
fn eight_tenants_two_active_no_failures() {
    let budget = Duration::from_secs(env_or("ELASTIC_GOALS_SECONDS", 120));
    let want_wakes: u64 = env_or("ELASTIC_GOALS_WAKES", u64::MAX);
    let request_mib: u64 = env_or("ELASTIC_GOALS_REQUEST_MIB", 64);
    let sim = Sim::new().memory("1g").build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let agent = sim
        .cmd_path(shim_tests::cli_bin())
        .no_preload()
        .timeout(budget + Duration::from_secs(600))
        .args("agent --interval 100ms --idle-threshold 300ms --pinned-host-budget 8g --containers")
        .arg(dir.to_str().unwrap())
        .spawn();
    let (mut ts, mut start_fails) = (vec![], 0);
    for i in 0..8 {
        let name = format!("t{i}");
        let lim = sim.dir().join(format!("limits.{name}"));
        elastic_limits(&lim, 1 << 30, request_mib * MIB, false);
        agent_reclaims(&lim);
        let mut p = sim
            .cmd_path(program())
            .container(&name)
            .env("CUQUOTA_LIMITS_FILE", lim.to_str().unwrap())
            .env("CUQUOTA_RECLAIM_WAIT_MS", "10000")
            .args("4 64")
            .timeout(budget + Duration::from_secs(600))
            .spawn();
        let usage = sim.container_usage_file(&name);
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "limits = {lim:?}\nusage = {usage:?}\n[members]\n{}\n",
                p.subtree()
            ),
        )
        .unwrap();
        if p.wait_for("ready") != "1" {
            println!("t{i} could not start: {}", p.wait_for("start_fail"));
            start_fails += 1;
            let _ = p.finish();
            continue;
        }
        let mut seen = HashMap::new();
        seen.insert("resident", 1);
        ts.push(Tenant { p, seen, before: 0 });
        println!("t{i} ready");
    }
    let n = ts.len();
    let t0 = Instant::now();
    let (mut wakes, mut ooms, mut slowest, mut total) = (0u64, 0u64, 0i64, 0i64);
    let (mut alloc_total, mut first_total, mut all) = (0i64, 0i64, vec![]);
    let mut i = 0;
    while n >= 2 && t0.elapsed() < budget && wakes < want_wakes {
        let (a, b) = (i % n, (i + 1) % n);
        for k in [a, b] {
            ts[k].p.send("wake 64");
        }
        for k in [a, b] {
            alloc_total += ts[k].num("alloc_ns");
            first_total += ts[k].num("first_ns");
            ooms += ts[k].num("oom") as u64;
            let w = ts[k].num("wake_ns");
            slowest = slowest.max(w);
            total += w;
            all.push(w as f64);
            wakes += 1;
        }
        i += 2;
        if wakes % 100 == 0 {
            println!(
                "progress: {wakes} wake-ups in {:.1} s, {ooms} out of memory, load average {}",
                t0.elapsed().as_secs_f64(),
                load_average()
            );
        }
    }
    let mut kills = 0;
    let mut intact = 0;
    for (k, mut t) in ts.into_iter().enumerate() {
        if t.check() {
            intact += 1;
        }
        t.p.send("quit");
        t.num("resident");
        let out = t.p.finish();
        if !out.success() {
            kills += 1;
            eprintln!("t{k}: {out:?}");
        }
    }
    // SAFETY: signalling the agent we started, by pid.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    let out = agent.finish();
    println!(
        "8 tenants, device 1 GiB, limits 8 GiB, requests {request_mib} MiB: {start_fails} could not start (out of memory), {wakes} wake-ups \
         of the {n} others in {:.1} s, {ooms} out of memory, {kills} ended badly, {intact}/{n} intact; wake-up \
         mean {:.1} ms, slowest {:.1} ms (goal: 0 and 0 over 1000)",
        t0.elapsed().as_secs_f64(),
        ms(total as f64 / wakes.max(1) as f64),
        ms(slowest as f64)
    );
    let w = wakes.max(1) as f64;
    println!(
        "wake-up p50 {:.1} ms, p99 {:.1} ms; of a wake-up's mean: allocation {:.1} ms, first launch (restore) \
         {:.1} ms; load average at the end {}",
        ms(pct(&mut all, 50.0)),
        ms(pct(&mut all, 99.0)),
        ms(alloc_total as f64 / w),
        ms(first_total as f64 / w),
        load_average()
    );
    let asked = out.stderr.matches("evict").count();
    println!(
        "agent stderr lines naming evict: {asked}; agent exit ok: {}",
        out.success()
    );
}

/// Goal: an active tenant's kernel p99 <= 1.05x alone while others are evicted and restored. One elastic tenant
/// (1 x 64 MiB, never asked) runs a steady loop of `ELASTIC_GOALS_KERNEL_US` (default 200) µs kernels, each
/// synchronised, for `ELASTIC_GOALS_P99_SECONDS` (default 20) a phase; latency = from just before the launch to
/// the kernel's end on the device timeline (as the priority bench's bursts). Three other elastic tenants (4 x
/// 64 MiB each) on the same device stay idle in the "alone" phases and, in the "moving" phases, cycle for the
/// whole phase: all three asked, every byte on the host (NVML), the ask cleared, a launch in each restoring its
/// buffers. Engines at `ELASTIC_GOALS_P99_ENGINES` (default 25) GB/s each way (the host's memcpy sets the pace:
/// as many moves as the host allows); `none`, the control: no engines, so the moves' copies take the device
/// timeline at `CUDASIM_COPY_GBPS`, serialised with the active tenant's kernels, which the p99 must show.
/// Phases alternate, `ELASTIC_GOALS_P99_ROUNDS` (default 2) of each.
#[test]
#[ignore = "bench: figures printed (bench/results/2026-12-02-elastic.md)"]
fn active_tenant_p99_while_others_move() {
    let secs: f64 = env_or("ELASTIC_GOALS_P99_SECONDS", 20.0);
    let rounds: usize = env_or("ELASTIC_GOALS_P99_ROUNDS", 2);
    let kernel_ns: u64 = env_or::<u64>("ELASTIC_GOALS_KERNEL_US", 200) * 1000;
    let engines: String = env_or("ELASTIC_GOALS_P99_ENGINES", "25".to_string());
    let mut sim = Sim::new().memory("4g");
    if engines != "none" {
        sim = sim
            .env("CUDASIM_H2D_GBPS", &engines)
            .env("CUDASIM_D2H_GBPS", &engines);
    }
    let sim = sim.build();
    let start = |name: &str, count: u64| {
        let lim = sim.dir().join(format!("limits.{name}"));
        elastic_limits(&lim, 8 << 30, MIB, false);
        let mut p = sim
            .cmd_path(program())
            .container(name)
            .env("CUQUOTA_LIMITS_FILE", lim.to_str().unwrap())
            .arg(&count.to_string())
            .arg("64")
            .timeout(Duration::from_secs_f64(secs * 2.0 * rounds as f64 + 600.0))
            .spawn();
        let before: u64 = p.wait_for("resident").parse().unwrap();
        assert_eq!(p.wait_for("ready"), "1", "{name} could not start");
        let seen = HashMap::from([("resident", 1)]);
        (lim, Tenant { p, seen, before })
    };
    let (_, mut active) = start("active", 1);
    // Its kernel's module loaded (and kept) before the others start, so the device's use below is all of it.
    active.p.send(&format!("lat 0.05 {kernel_ns}"));
    active.get("lat_ns");
    active.get("wall_ns");
    let mut others: Vec<(PathBuf, Tenant)> = (0..3).map(|i| start(&format!("o{i}"), 4)).collect();
    // Device memory in use with everything resident, and with the others' 3 x 256 MiB on the host.
    let full = others.last().unwrap().1.before;
    let low = full - 3 * 4 * 64 * MIB;
    println!(
        "kernels of {} µs, phases of {secs} s, copy engines {engines} GB/s; load average at the start {}",
        kernel_ns / 1000,
        load_average()
    );
    println!("| phase | kernels | p50 ms | p99 ms | p99.9 ms | max ms | wall p99 ms | moves of 768 MiB (mean evict / slowest restore call) | load average |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let (mut alone, mut moving) = (vec![], vec![]);
    for round in 0..rounds {
        for phase in ["alone", "moving"] {
            active.p.send(&format!("lat {secs} {kernel_ns}"));
            let t0 = Instant::now();
            let (mut moves, mut evict_ns, mut restore_ns) = (0, 0i64, 0i64);
            while phase == "moving" && t0.elapsed().as_secs_f64() < secs {
                for (lim, _) in &others {
                    elastic_limits(lim, 8 << 30, MIB, true);
                }
                let o = &mut others[0].1;
                o.p.send(&format!("evict {low}"));
                let e = o.num("evict_ns");
                assert!(e > 0, "round {round}: never evicted");
                evict_ns += e;
                for (lim, _) in &others {
                    elastic_limits(lim, 8 << 30, MIB, false);
                }
                for (_, o) in others.iter_mut() {
                    o.p.send("restore");
                }
                let mut slowest = 0;
                for (_, o) in others.iter_mut() {
                    let r = o.num("restore_ns");
                    for k in ["launches_ns", "sync_ns", "resident"] {
                        o.num(k);
                    }
                    slowest = slowest.max(r);
                }
                restore_ns += slowest;
                moves += 1;
            }
            let per = |ns: i64| {
                if moves > 0 {
                    ms(ns as f64) / moves as f64
                } else {
                    0.0
                }
            };
            let parse =
                |s: String| -> Vec<f64> { s.split(',').map(|v| v.parse().expect("latency")).collect() };
            let mut lat = parse(active.get("lat_ns"));
            let mut wall = parse(active.get("wall_ns"));
            println!(
                "| {phase} {round} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {moves} ({:.0} / {:.0} ms) | {} |",
                lat.len(),
                ms(pct(&mut lat, 50.0)),
                ms(pct(&mut lat, 99.0)),
                ms(pct(&mut lat, 99.9)),
                ms(pct(&mut lat, 100.0)),
                ms(pct(&mut wall, 99.0)),
                per(evict_ns),
                per(restore_ns),
                load_average()
            );
            let into = if phase == "alone" { &mut alone } else { &mut moving };
            into.extend(lat);
        }
    }
    let (a, m) = (pct(&mut alone, 99.0), pct(&mut moving, 99.0));
    println!(
        "p99 alone {:.3} ms, p99 while others move {:.3} ms: ratio {:.3} (goal <= 1.05); p50 {:.3} / {:.3} ms, \
         p99.9 {:.3} / {:.3} ms",
        ms(a),
        ms(m),
        m / a,
        ms(pct(&mut alone, 50.0)),
        ms(pct(&mut moving, 50.0)),
        ms(pct(&mut alone, 99.9)),
        ms(pct(&mut moving, 99.9))
    );
    let mut all = others.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    all.push(active);
    for mut t in all {
        assert!(t.check(), "bytes changed");
        t.p.send("quit");
        t.num("resident");
        let out = t.p.finish();
        assert!(out.success(), "{out:?}");
    }
}

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
//! `ELASTIC_GOALS_SECONDS` (default 120: the integrity run's budget), `ELASTIC_GOALS_CYCLES` (default 1000).

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
    let mut i = 0;
    while n >= 2 && t0.elapsed() < budget {
        let (a, b) = (i % n, (i + 1) % n);
        for k in [a, b] {
            ts[k].p.send("wake 64");
        }
        for k in [a, b] {
            ooms += ts[k].num("oom") as u64;
            let w = ts[k].num("wake_ns");
            slowest = slowest.max(w);
            total += w;
            wakes += 1;
        }
        i += 2;
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
    let asked = out.stderr.matches("evict").count();
    println!(
        "agent stderr lines naming evict: {asked}; agent exit ok: {}",
        out.success()
    );
}

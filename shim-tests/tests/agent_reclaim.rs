//! The agent's reclaim (issue 39) on the simulator: a container waiting for memory within its request, or above
//! it within its limit, on a full GPU gets an idle elastic container's `evict_mask` bit set (never a guaranteed
//! one's); the bit is cleared at the eviction timeout when
//! nothing moves (the library cannot evict yet, so NVML never shows it done); a forged `waiting` word gains
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuquota_core::region::LimitsReader;
use cuquota_core::UsageRegion;
use shim_tests::reclaim::{agent_reclaims, elastic_limits};
use shim_tests::{cli_bin, compile_c, workspace_root, Proc, Prog, Sim, GIB, MIB};

fn limits(sim: &Sim, name: &str, args: &[&str]) -> PathBuf {
    let file = sim.dir().join(format!("limits.{name}"));
    sim.cli_limits(&file, args);
    file
}

fn descriptor(dir: &Path, name: &str, limits: &Path, usage: Option<&Path>, members: &str) {
    let usage = usage.map_or_else(String::new, |u| format!("usage = {u:?}\n"));
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!("limits = {limits:?}\n{usage}[members]\n{members}\n"),
    )
    .unwrap();
}

fn evict_mask(limits: &Path) -> u64 {
    LimitsReader::open(limits).unwrap().snapshot().table.evict_mask
}

fn reclaims(limits: &Path) -> bool {
    LimitsReader::open(limits).unwrap().snapshot().reclaims()
}

/// Polls `limits`' evict_mask for `secs` s until `want` holds; returns the last mask.
fn mask_until(limits: &Path, secs: u64, want: impl Fn(u64) -> bool) -> u64 {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let m = evict_mask(limits);
        if want(m) || Instant::now() >= until {
            return m;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process of container `name` under the library, with its limits file.
/// The node agent over the containers described in `dir` (a pass each 200 ms, 8 GiB of pinned host memory).
fn agent_cmd<'a>(sim: &'a Sim, dir: &Path) -> shim_tests::Cmd<'a> {
    sim.cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(120))
        .args("agent --interval 200ms --pinned-host-budget 8g --containers")
        .arg(dir.to_str().unwrap())
}

fn tenant(sim: &Sim, name: &str, limits: &Path, args: &str) -> Proc {
    sim.cmd(Prog::Probe)
        .container(name)
        .env("CUQUOTA_LIMITS_FILE", limits.to_str().unwrap())
        .env("CUQUOTA_RECLAIM_WAIT_MS", "60000")
        .timeout(Duration::from_secs(90))
        .args(args)
        .spawn()
}

#[test]
fn a_wait_within_the_request_sets_an_idle_tenants_bit_and_a_forged_one_does_not() {
    let sim = Sim::new().memory("4g").build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    // idle: elastic (request 1g, limit 3g), 2.5g resident, no kernels. It bypasses the library (NVML sees it).
    let lim_idle = limits(&sim, "idle", &["--memory", "3g", "--request", "1g"]);
    let mut idle = sim
        .cmd(Prog::Probe)
        .no_preload()
        .timeout(Duration::from_secs(90))
        .args("init alloc:mem:2560m wait")
        .spawn();
    idle.wait_ready(1);
    descriptor(&dir, "idle", &lim_idle, None, &idle.subtree());
    // liar: request = limit 1g; it forges its waiting word.
    let lim_liar = limits(&sim, "liar", &["--memory", "1g"]);
    let mut liar = tenant(&sim, "liar", &lim_liar, "init wait");
    liar.wait_ready(1);
    let usage_liar = sim.container_usage_file("liar");
    descriptor(&dir, "liar", &lim_liar, Some(&usage_liar), &liar.subtree());
    let agent = agent_cmd(&sim, &dir).env("CUQUOTA_LOG", "info").spawn();
    // Attack: a wait beyond its limit (0 resident + 3g > 1g = its request), then one within it while the GPU has room
    // (1.5g free): no bit in ~10 passes each.
    let forge = |word: u64| {
        let u = UsageRegion::open_existing(&usage_liar).unwrap();
        u.waiting().store(word, Ordering::Release);
    };
    // An agent with a pinned-host budget says so in the files it owns (the library waits only then).
    let until = Instant::now() + Duration::from_secs(20);
    while !(reclaims(&lim_idle) && reclaims(&lim_liar)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(reclaims(&lim_idle) && reclaims(&lim_liar), "no reclaim flag");
    forge((1 << 56) | (3 * GIB));
    assert_eq!(
        mask_until(&lim_idle, 2, |m| m != 0),
        0,
        "a wait beyond the request evicted"
    );
    forge((1 << 56) | (GIB / 2));
    assert_eq!(
        mask_until(&lim_idle, 2, |m| m != 0),
        0,
        "a wait the GPU has room for evicted"
    );
    forge(0);
    // Control: w (request = limit 2g) holds 1g, leaving 0.5g free, and waits for 1g more, within its request.
    let lim_w = limits(&sim, "w", &["--memory", "2g"]);
    // (Set before w starts, as the agent's first pass over w's descriptor would, which needs w's pid.)
    agent_reclaims(&lim_w);
    let w = tenant(&sim, "w", &lim_w, "init alloc:mem:1g alloc:mem:1g");
    let usage_w = sim.container_usage_file("w");
    descriptor(&dir, "w", &lim_w, Some(&usage_w), &w.subtree());
    let set = mask_until(&lim_idle, 20, |m| m != 0);
    let asked = Instant::now();
    assert_ne!(set, 0, "the idle elastic tenant was not asked to evict");
    assert_eq!(evict_mask(&lim_w), 0, "the waiter was asked to evict");
    assert_eq!(evict_mask(&lim_liar), 0, "the liar was asked to evict");
    // Nothing moves (no eviction in the library yet): cleared at the 5 s timeout.
    assert_eq!(
        mask_until(&lim_idle, 20, |m| m == 0),
        0,
        "the bit was never cleared"
    );
    let t = asked.elapsed();
    assert!(t >= Duration::from_secs(3), "cleared before the timeout: {t:?}");
    // Asked again after its rest; the agent stopping clears it.
    assert_ne!(
        mask_until(&lim_idle, 20, |m| m != 0),
        0,
        "not asked again after its rest"
    );
    // SAFETY: signalling the agent we started, by pid.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    let out = agent.finish();
    assert!(out.success(), "{out:?}");
    assert_eq!(evict_mask(&lim_idle), 0, "the stopped agent left the ask");
    assert!(!reclaims(&lim_idle), "the stopped agent left the reclaim flag");
    assert!(
        out.stderr.contains("container idle") && out.stderr.contains("ignored the ask to evict"),
        "the ignored ask was not reported:{out:?}"
    );
    idle.release();
    liar.release();
    let _ = idle.finish();
    let _ = liar.finish();
    let _ = w.kill();
}

/// A process of `name` past the library holding `alloc` (NVML sees it; it never launches: idle), in `dir`.
fn idle_holder(sim: &Sim, dir: &Path, name: &str, lim: &Path, alloc: &str) -> Proc {
    let mut p = sim
        .cmd(Prog::Probe)
        .no_preload()
        .timeout(Duration::from_secs(90))
        .args(&format!("init alloc:mem:{alloc} wait"))
        .spawn();
    p.wait_ready(1);
    descriptor(dir, name, lim, None, &p.subtree());
    p
}

/// A wait above the waiter's request, within its limit (an elastic tenant growing, or restoring its evicted
/// memory), gets an idle elastic tenant's bit set, and never a guaranteed tenant's, however idle. Control: the
/// wait within the request (above).
#[test]
fn a_wait_above_the_request_sets_an_idle_elastic_tenants_bit_and_never_a_guaranteed_ones() {
    let sim = Sim::new().memory("4g").build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim_idle = limits(&sim, "idle", &["--memory", "3g", "--request", "1g"]);
    let mut idle = idle_holder(&sim, &dir, "idle", &lim_idle, "2g");
    let lim_g = limits(&sim, "guaranteed", &["--memory", "1g"]);
    let mut g = idle_holder(&sim, &dir, "guaranteed", &lim_g, "1g");
    // burst: elastic (request 256m, limit 2g) grows by 1536m with about 1g free: above its request.
    let lim_b = limits(&sim, "burst", &["--memory", "2g", "--request", "256m"]);
    agent_reclaims(&lim_b);
    let agent = agent_cmd(&sim, &dir).spawn();
    let b = tenant(&sim, "burst", &lim_b, "init alloc:mem:1536m");
    let usage_b = sim.container_usage_file("burst");
    descriptor(&dir, "burst", &lim_b, Some(&usage_b), &b.subtree());
    assert_ne!(
        mask_until(&lim_idle, 20, |m| m != 0),
        0,
        "the idle elastic tenant was not asked for a wait above the request"
    );
    // The guaranteed tenant, as idle and holding its whole request, is never asked while it waits.
    assert_eq!(
        mask_until(&lim_g, 2, |m| m != 0),
        0,
        "a guaranteed tenant was asked"
    );
    assert_eq!(evict_mask(&lim_b), 0, "the waiter was asked to evict");
    // SAFETY: signalling the agent we started, by pid.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    assert!(agent.finish().success());
    idle.release();
    g.release();
    let _ = idle.finish();
    let _ = g.finish();
    let _ = b.kill();
}

/// `cuquota_memory_evicted_bytes` of container `name` in the agent's metrics on `port` (None: not served yet).
fn evicted_metric(port: u16, name: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let label = format!("name=\"{name}\"");
    resp.lines()
        .filter(|l| l.starts_with("cuquota_memory_evicted_bytes{") && l.contains(&label))
        .find_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Polls the metric for `secs` s until `want` holds; returns the last value.
fn evicted_until(port: u16, name: &str, secs: u64, want: impl Fn(u64) -> bool) -> Option<u64> {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = evicted_metric(port, name);
        if v.is_some_and(&want) || Instant::now() >= until {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An elastic tenant killed while holding evicted memory: its slot's charge stays in the usage file (nobody of
/// its container reclaims it) with its liveness lock released, and the agent takes that dead charge off
/// (`UsageRegion::dead_held`), so its metrics and its pinned-host estimate stop counting the bytes as evicted
/// (they are in no host memory any more). The control: before the kill the same figure is the evicted range,
/// and after it the dead charge is still there to be (wrongly) counted.
#[test]
fn a_killed_tenant_s_evicted_memory_leaves_the_agent_s_count() {
    let prog = compile_c(
        "elastic_tenant",
        &workspace_root().join("shim-tests/c/elastic_tenant.c"),
        &[],
        &["-lcuda", "-ldl"],
    );
    let sim = Sim::new().memory("4g").build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.e");
    elastic_limits(&lim, GIB, 64 * MIB, false);
    // Under a shell that outlives it (the descriptor's subtree root stays alive once the tenant is killed).
    let script = format!("{} 256; exec sleep 120", prog.display());
    let mut t = sim
        .cmd_path("/bin/sh".into())
        .container("e")
        .env("CUQUOTA_LIMITS_FILE", lim.to_str().unwrap())
        .timeout(Duration::from_secs(90))
        .arg("-c")
        .arg(&script)
        .spawn();
    t.wait_for("ready");
    let usage = sim.container_usage_file("e");
    // Evicted while asked (idle): its resident bytes drop by the range. (Two `resident` lines came before ready.)
    let mut n = 2;
    let mut resident = || {
        t.send("res");
        n += 1;
        t.wait_for_nth("resident", n).parse::<u64>().unwrap()
    };
    let before = resident();
    elastic_limits(&lim, GIB, 64 * MIB, true);
    let until = Instant::now() + Duration::from_secs(10);
    while resident() + 256 * MIB > before {
        if Instant::now() >= until {
            let out = t.kill();
            panic!("not evicted: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    descriptor(&dir, "e", &lim, Some(&usage), &t.subtree());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let agent = agent_cmd(&sim, &dir)
        .arg("--listen")
        .arg(&format!("127.0.0.1:{port}"))
        .spawn();
    let seen = evicted_until(port, "e", 20, |v| v >= 256 * MIB);
    assert!(
        seen.is_some_and(|v| v >= 256 * MIB),
        "control: the evicted range not counted ({seen:?})"
    );
    let children = format!("/proc/{0}/task/{0}/children", t.pid());
    let tenant: i32 = std::fs::read_to_string(&children)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: SIGKILL to the tenant this test started (the shell's one child), by pid.
    assert_eq!(unsafe { libc::kill(tenant, libc::SIGKILL) }, 0);
    let region = UsageRegion::open_existing(&usage).unwrap();
    let dev = region.devices()[0].id;
    let until = Instant::now() + Duration::from_secs(10);
    while region.dead_held(dev) < 256 * MIB && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dead = region.dead_held(dev);
    assert!(
        dead >= 256 * MIB,
        "the killed tenant's charge is not held dead: {dead}"
    );
    let after = evicted_until(port, "e", 20, |v| v == 0);
    assert_eq!(after, Some(0), "a dead tenant's charge still counted as evicted");
    assert!(
        region.dead_held(dev) >= 256 * MIB,
        "reclaimed meanwhile: the check proves nothing"
    );
    // SAFETY: signalling the agent we started, by pid.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    assert!(agent.finish().success());
    let _ = t.kill();
}

//! Review of #21 item 7 (the agent's SM debt throttle and `subtree` membership), as a hostile tenant that
//! bypasses LD_PRELOAD. Each test states what the design promises and FAILS where the promise does not hold
//! (these are reproductions of escapes, not regression tests of fixed behaviour):
//!
//! - `respawning_short_processes_are_never_charged`: device time of a process that exited before the pass is
//!   charged to nobody (members come from /proc at the pass; NVML's samples for a dead pid are dropped by
//!   `ContainerReport::build`), so a tenant that runs its work in short-lived processes is never in debt.
//! - `a_killed_tenant_that_respawns_starts_with_a_clean_slate`: with a limits file for `--device all` (no UUID
//!   entry) a GPU leaves `c.devices` as soon as no member holds it, and `ThrottleState::plan` drops its
//!   balance (`balances.retain(live)`): the debt is forgotten at the escalation kill, the respawn gets full
//!   credit and another grace.
//! - `killing_cuquota_run_then_double_forking_escapes_the_subtree`: a member SIGKILLs its own `cuquota run`
//!   and double-forks in the same instant; the orphan is re-parented away from the remembered survivors.
//! - `a_container_alone_under_burst_is_frozen_because_of_its_own_exited_processes`: the same dead pids count
//!   as "others" (`others_busy`), so a container alone under burst is frozen.
//! - `a_member_forked_after_the_proc_read_continues_the_frozen_ones`: the SIGSTOP freeze is never re-checked;
//!   a member that SIGCONTs the others runs while the agent believes it frozen (a race: usually reproduces).
//! - `a_stranger_reusing_a_finished_roots_pid_becomes_the_container` (root, `--ignored`): a process of no
//!   container that reuses a finished subtree root's pid is judged and killed as that container.
//! - `a_cooperative_tenant_with_long_kernels_under_the_shim_is_killed`: 3 s kernels under the shim at 30 %.
//! - `sixteen_idle_connections_deny_every_scrape`: /metrics (item 8) exhausted by 16 idle connections.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shim_tests::{cli_bin, compile_c, heavy, mono_ns, workspace_root, Proc, Sim};

/// The agent's interval in these tests.
const INTERVAL_MS: u64 = 200;

fn throttle_paths() -> PathBuf {
    compile_c(
        "throttle_paths_direct",
        &workspace_root().join("shim-tests/c/throttle_paths.c"),
        &[],
        &["-DTHR_DIRECT", "-lcuda", "-ldl"],
    )
}

/// `cuquota run` as container `usage`'s root, running `cmd` with `LD_PRELOAD` removed: the tenant bypasses
/// the library.
fn bypassing_container(sim: &Sim, usage: &Path, cmd: &[&str]) -> Proc {
    bypassing_container_for(sim, usage, cmd, 60)
}

/// [`bypassing_container`], killed after `timeout_s` s.
fn bypassing_container_for(sim: &Sim, usage: &Path, cmd: &[&str], timeout_s: u64) -> Proc {
    let mut c = sim
        .cmd_path(cli_bin())
        .no_preload()
        .timeout(Duration::from_secs(timeout_s))
        .args("run -q --usage")
        .arg(usage.to_str().unwrap())
        .args("-- env -u LD_PRELOAD");
    for a in cmd {
        c = c.arg(a);
    }
    c.spawn()
}

fn limits(sim: &Sim, file: &Path, args: &[&str]) {
    let f = file.to_str().unwrap();
    let o = sim.cli(&["limits", "init", f]);
    assert!(o.success(), "{o:?}");
    let mut a = vec!["limits", "set", f, "--device", "all"];
    a.extend_from_slice(args);
    let o = sim.cli(&a);
    assert!(o.success(), "{o:?}");
}

fn descriptor(dir: &Path, name: &str, limits: &Path, members: &str, enforce: &str) {
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!("limits = {limits:?}\n[members]\n{members}\n[enforce]\n{enforce}\n"),
    )
    .unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The value of the metric line starting with `prefix` (labels included), if present.
fn metric(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// A container under a hard `sm` % limit whose tenant bypasses the library and launches 20 µs kernels flat out
/// for `secs` s, watched by an agent (already one pass in) with `sm = "<action>"`.
fn sm_tenant(sm: u32, secs: u32, action: &str) -> (Sim, Agent, Proc) {
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.t");
    limits(&sim, &lim, &["--sm", &sm.to_string(), "--policy", "hard"]);
    let tp = throttle_paths().display().to_string();
    let agent = Agent::start(&sim, &dir);
    agent.wait_passes(1);
    let t = bypassing_container(
        &sim,
        &sim.dir().join("usage.t"),
        &[&tp, "kernel", "direct", &secs.to_string(), "20000"],
    );
    let members = format!("subtree = {}", t.pid());
    descriptor(&dir, "t", &lim, &members, &format!("sm = \"{action}\""));
    (sim, agent, t)
}

/// A running agent: `cuquota agent --interval 200ms --json --listen 127.0.0.1:PORT --containers DIR`.
struct Agent {
    proc: Proc,
    port: u16,
}

impl Agent {
    fn start(sim: &Sim, dir: &Path) -> Agent {
        Agent::start_every(sim, dir, INTERVAL_MS)
    }

    fn start_every(sim: &Sim, dir: &Path, interval_ms: u64) -> Agent {
        Agent::start_env(sim, dir, interval_ms, &[])
    }

    /// An agent whose environment also has `env` (e.g. `CUDASIM_NVML_LISTS`: which NVML lists its simulator
    /// shows processes in).
    fn start_env(sim: &Sim, dir: &Path, interval_ms: u64, env: &[(&str, &str)]) -> Agent {
        let port = free_port();
        let mut cmd = sim.cmd_path(cli_bin());
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let proc = cmd
            .no_preload()
            .timeout(Duration::from_secs(120))
            .env("CUQUOTA_LOG", "info")
            .arg("agent")
            .arg("--interval")
            .arg(&format!("{interval_ms}ms"))
            .arg("--json")
            .arg("--containers")
            .arg(dir.to_str().unwrap())
            .arg("--listen")
            .arg(&format!("127.0.0.1:{port}"))
            .spawn();
        Agent { proc, port }
    }

    fn metrics(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(b) = scrape(self.port).filter(|b| b.contains("cuquota_agent_passes_total ")) {
                return b;
            }
            assert!(Instant::now() < deadline, "no metrics from the agent");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn passes(&self) -> u64 {
        metric(&self.metrics(), "cuquota_agent_passes_total ").unwrap_or(0.0) as u64
    }

    /// Waits until the agent completed `n` more passes.
    fn wait_passes(&self, n: u64) {
        let target = self.passes() + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.passes() < target {
            assert!(Instant::now() < deadline, "the agent stopped passing");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (the agent thaws what it froze and exits 0), then every pass's JSON report.
    fn stop(self) -> (Vec<serde_json::Value>, String) {
        // SAFETY: signalling the agent we started, by pid.
        unsafe { libc::kill(self.proc.pid() as i32, libc::SIGTERM) };
        let out = self.proc.finish();
        assert!(out.success(), "the agent did not exit cleanly on SIGTERM:{out:?}");
        let passes = out
            .lines
            .iter()
            .filter(|l| l.starts_with('{'))
            .map(|l| shim_tests::check_schema("agent.v1.json", l))
            .collect();
        (passes, out.stderr)
    }
}

/// Container `name` in one pass's report.
fn container<'a>(pass: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    pass["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}: {pass}"))
}

/// Every action recorded for `name`, as (pass, action), in the passes that list it.
fn actions(passes: &[serde_json::Value], name: &str) -> Vec<(u64, serde_json::Value)> {
    passes
        .iter()
        .flat_map(|p| {
            let n = p["pass"].as_u64().unwrap();
            p["containers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["name"] == name)
                .flat_map(|c| c["actions"].as_array().unwrap().clone())
                .map(move |a| (n, a))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn pids_of(a: &serde_json::Value) -> Vec<u32> {
    a["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap() as u32)
        .collect()
}

/// State letter of `pid` (`None` once reaped).
fn proc_state(pid: u32) -> Option<u8> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].bytes().next()
}

fn alive(pid: u32) -> bool {
    matches!(proc_state(pid), Some(s) if s != b'Z' && s != b'X')
}

fn sh_tenant(sim: &Sim, name: &str, script: &str, timeout_s: u64) -> Proc {
    bypassing_container_for(
        sim,
        &sim.dir().join(format!("usage.{name}")),
        &["sh", "-c", script],
        timeout_s,
    )
}

/// A hard 30 % limit, sm = "throttle", 200 ms interval. The tenant runs 20 µs kernels flat out, but in a loop
/// of processes that each live 50 ms (launch, synchronise, exit). Only the process alive at a pass (if any)
/// is charged, and only for what it did itself: the container is never in debt and never frozen.
#[test]
fn respawning_short_processes_are_never_charged() {
    let _cpu = heavy();
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.s");
    limits(&sim, &lim, &["--sm", "30", "--policy", "hard"]);
    let tp = throttle_paths().display().to_string();
    let agent = Agent::start(&sim, &dir);
    agent.wait_passes(1);
    let script = format!(
        "end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do {tp} kernel direct 0.05 20000 >/dev/null; done"
    );
    let t = sh_tenant(&sim, "s", &script, 60);
    descriptor(
        &dir,
        "s",
        &lim,
        &format!("subtree = {}", t.pid()),
        "sm = \"throttle\"",
    );
    let start = mono_ns();
    let out = t.finish();
    let (passes, stderr) = agent.stop();
    assert!(out.success(), "{out:?}");
    let from = start + 1_000_000_000;
    let share = sim.share_pct(0, 0, from, from + 6_000_000_000);
    let acts = actions(&passes, "s");
    let freezes = acts.iter().filter(|(_, a)| a["action"] == "freeze").count();
    eprintln!("respawning 50 ms processes under a hard 30 % limit: device share {share:.1} % over 6 s, {freezes} freezes");
    assert!(
        share <= 45.0,
        "a 30 % limit held at {share:.1} % ({freezes} freezes):{stderr}"
    );
}

/// A hard 30 % limit. CMD waits until the agent has seen it, SIGKILLs its `cuquota run` (its parent: the
/// tenant may) and at once double-forks a flat-out GPU process: the survivors the agent remembers (the shell)
/// do not have it as a descendant, so it is nobody's and runs unthrottled.
#[test]
fn killing_cuquota_run_then_double_forking_escapes_the_subtree() {
    let _cpu = heavy();
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.e");
    limits(&sim, &lim, &["--sm", "30", "--policy", "hard"]);
    let tp = throttle_paths().display().to_string();
    let agent = Agent::start(&sim, &dir);
    agent.wait_passes(1);
    let esc = sim.dir().join("escaper.out");
    let script = format!(
        "sleep 1; kill -9 $PPID; ( setsid {tp} kernel direct 5 20000 >{} & ); sleep 7",
        esc.display()
    );
    let t = sh_tenant(&sim, "e", &script, 60);
    descriptor(
        &dir,
        "e",
        &lim,
        &format!("subtree = {}", t.pid()),
        "sm = \"throttle\"",
    );
    let start = mono_ns();
    let _ = t.finish();
    std::thread::sleep(Duration::from_millis(5500));
    let (passes, stderr) = agent.stop();
    let out = std::fs::read_to_string(&esc).unwrap_or_default();
    let pid: Option<u32> = out
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|v| v.parse().ok());
    if let Some(p) = pid {
        // SAFETY: the escaper this test started, by pid.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    let from = start + 2_000_000_000;
    let share = sim.share_pct(0, 0, from, from + 3_500_000_000);
    let members: Vec<String> = passes
        .iter()
        .filter_map(|p| {
            p["containers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "e")
                .map(|c| format!("{}:{}", c["members"]["pids"], c["error"]))
        })
        .collect();
    eprintln!("escaper {pid:?}: device share {share:.1} % under a hard 30 % limit; members by pass {members:?}; escaper's output: {out}");
    assert!(share <= 45.0, "a 30 % limit held at {share:.1} %:{stderr}");
}

/// docs/agent.md: under `burst` a container "is charged at most its limit for an interval in which no other
/// process used the GPU, and not frozen for that GPU". A container alone on the GPU under a burst 30 % limit
/// runs its work as a sequence of processes of 300 ms each (what a job runner does; a cooperative tenant under
/// the shim, bursting alone, looks the same to NVML). Its previous process, exited, is in NVML's samples and
/// a member of nobody, so `others_busy` is true (throttle.rs, `plan`: any sampled pid not in `members`): it is
/// charged in full and frozen although nobody else used the GPU.
#[test]
fn a_container_alone_under_burst_is_frozen_because_of_its_own_exited_processes() {
    let _cpu = heavy();
    let sim = Sim::new().build();
    let dir = sim.dir().join("containers");
    std::fs::create_dir(&dir).unwrap();
    let lim = sim.dir().join("limits.b");
    limits(&sim, &lim, &["--sm", "30", "--policy", "burst"]);
    let tp = throttle_paths().display().to_string();
    let agent = Agent::start(&sim, &dir);
    agent.wait_passes(1);
    let script = format!(
        "end=$(( $(date +%s) + 5 )); while [ $(date +%s) -lt $end ]; do {tp} kernel direct 0.3 20000 >/dev/null; done"
    );
    let t = sh_tenant(&sim, "b", &script, 60);
    descriptor(
        &dir,
        "b",
        &lim,
        &format!("subtree = {}", t.pid()),
        "sm = \"throttle\"",
    );
    let _ = t.finish();
    let (passes, stderr) = agent.stop();
    let freezes = actions(&passes, "b")
        .into_iter()
        .filter(|(_, a)| a["action"] == "freeze")
        .count();
    eprintln!("alone under burst 30 %, sequential 300 ms processes: {freezes} freezes");
    assert_eq!(freezes, 0, "frozen while alone on the GPU under burst:{stderr}");
}

//! What the priority tests (tests/priority.rs, tests/priority_attacks.rs) share: one test at a time, the
//! bursts' shape (c/priority_tenant.c's arguments) and percentiles.

/// One test at a time: they time the device, and CI has 2 cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seconds of bursts per run.
pub const SECS: f64 = 3.0;
/// Kernels per high-priority burst.
pub const BURST: u32 = 20;
/// Each burst kernel, ns.
pub const KERNEL_NS: u64 = 200_000;
/// Idle gap between bursts (random in this range), ns.
pub const GAP_NS: (u64, u64) = (10_000_000, 40_000_000);
/// The best-effort tenant's kernels (random in this range), ns.
pub const BE_NS: (u64, u64) = (1_000_000, 5_000_000);

/// The `p`th percentile of `v` (nearest rank).
pub fn pct(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s[((s.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// Nanoseconds as milliseconds, for messages.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// `o`, which must have succeeded.
pub fn done(o: crate::Output) -> crate::Output {
    assert!(o.success(), "{o:?}");
    o
}

/// High-priority burst latencies (ns): `secs` of bursts from c/priority_tenant.c in container "hp" (priority
/// high), `gap_ns` apart (random in the range), next to the best-effort command `be` (its container, priority
/// and environment set by the caller; a priority_tenant `be` run of [`BE_NS`] work) started 0.5 s before them.
/// Also returns `be`'s output.
pub fn bursts_beside(
    sim: &crate::Sim,
    be: crate::Cmd<'_>,
    secs: f64,
    gap_ns: (u64, u64),
) -> (Vec<u64>, crate::Output) {
    let t = crate::mono_ns() + 1_500_000_000;
    let timeout = std::time::Duration::from_secs_f64(2.0 * secs + 60.0);
    let be = be
        .timeout(timeout)
        .args(&format!(
            "be {} {} {} 11 {}",
            secs + 1.0,
            BE_NS.0,
            BE_NS.1,
            t - 500_000_000
        ))
        .spawn();
    let hp = done(
        sim.cmd(crate::Prog::PriorityTenant)
            .container("hp")
            .priority("0")
            .timeout(timeout)
            .args(&format!(
                "hp {secs} {BURST} {KERNEL_NS} {} {} 7 {t}",
                gap_ns.0, gap_ns.1
            ))
            .spawn()
            .finish(),
    );
    let be = done(be.finish());
    let v = latencies(&hp);
    assert!(!v.is_empty(), "no burst");
    (v, be)
}

/// The burst latencies (ns) a priority_tenant `hp` run printed.
pub fn latencies(hp: &crate::Output) -> Vec<u64> {
    hp.val("lat_ns")
        .split(',')
        .map(|v| v.parse().expect("latency"))
        .collect()
}

/// The node agent holding a best-effort container whose tenant bypasses the library (docs/priority.md, threat
/// model): `cuquota agent --interval 200ms --containers DIR` with one descriptor, members `subtree = PID`, a hard
/// SM limit of `sm_pct` and `sm = "throttle"` (freeze until the measured device time is repaid, kill past the
/// grace: docs/agent.md). The agent reads the simulator's NVML, as on a GPU it reads the driver's.
#[derive(Debug)]
pub struct BypassAgent {
    proc: crate::Proc,
}

impl BypassAgent {
    /// Starts the agent watching process `pid` (and its descendants) as container `name`.
    pub fn start(sim: &crate::Sim, name: &str, pid: u32, sm_pct: u32) -> BypassAgent {
        let dir = sim.dir().join("agent.containers");
        std::fs::create_dir_all(&dir).expect("the agent's containers directory");
        let lim = sim.dir().join(format!("agent.limits.{name}"));
        let l = lim.to_str().expect("utf-8 temp path");
        for args in [
            vec!["limits", "init", l],
            vec![
                "limits",
                "set",
                l,
                "--device",
                "all",
                "--sm",
                &sm_pct.to_string(),
                "--policy",
                "hard",
            ],
        ] {
            let o = sim.cli(&args);
            assert!(o.success(), "{o:?}");
        }
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "limits = {lim:?}\n[members]\n{}\n[enforce]\nsm = \"throttle\"\n",
                crate::subtree_members(pid)
            ),
        )
        .expect("the container's descriptor");
        let proc = sim
            .cmd_path(crate::cli_bin())
            .no_preload()
            .timeout(std::time::Duration::from_secs(300))
            .args("agent --interval 200ms --containers")
            .arg(dir.to_str().expect("utf-8 temp path"))
            .spawn();
        BypassAgent { proc }
    }

    /// SIGTERM (the agent thaws what it froze, so the tenant can finish) and the agent's output.
    pub fn stop(self) -> crate::Output {
        // SAFETY: signalling the agent this process started, by its pid.
        unsafe { libc::kill(self.proc.pid() as i32, libc::SIGTERM) };
        let o = self.proc.finish();
        assert!(o.success(), "the agent did not exit cleanly on SIGTERM:{o:?}");
        o
    }
}

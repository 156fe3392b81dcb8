//! fork and exec from a multi-threaded process that is inside the shim at that moment.
//!
//! - No lock a parent thread held at the fork stalls the child: 6 threads hammer every hot path that takes a
//!   lock (allocation and free — the ledger; pool allocations — the pools; launches under an SM limit — the
//!   throttle's probe state; cuMemGetInfo; NVML queries; module load/unload — overhead and owners) while the
//!   agent rewrites the limits file (each process re-reads it under the readers' lock), and the main thread
//!   forks 200 times. Each child re-enters the shim at once (allocation, frees over every ledger shard,
//!   cuMemGetInfo, a launch, NVML, a module load) or execs a fresh CUDA program. A child that does not finish
//!   within 10 s is stuck on an inherited lock (the `fork_prepare` handlers must take every lock the hot paths
//!   take, in DESIGN.md's order).
//! - A child is its own process in the accounting and nothing is charged twice: after a fork without exec the
//!   child holds no charge (CUDA refuses a forked child; the shim passes that on) and its exit does not release
//!   the parent's; after exec it claims its own slot for what it allocates. Checked in the usage region and
//!   against the driver. (A process's slot outlives it until the next reclaim of the dead — the shim does not
//!   free it at exit — so the checks reclaim first, as any later process of the container would.)

use cuquota_core::region::SlotState;
use cuquota_core::UsageRegion;
use shim_tests::{Prog, Sim, MIB};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[test]
fn children_forked_while_threads_hammer_the_shim_never_stall() {
    let sim = Sim::new().ctx_overhead("64m").build();
    sim.agent_memory_limit(0, "2g");
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        // The agent changes the limits while the program runs: every process re-reads the file (under the
        // readers' lock) at its next allocation.
        sc.spawn(|| {
            let mut flip = false;
            while !stop.load(Ordering::Relaxed) {
                sim.agent_memory_limit(0, if flip { "2g" } else { "2046m" });
                flip = !flip;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let out = sim
            .cmd(Prog::Chaos)
            .mem_limit("2g")
            .env("CUDA_DEVICE_SM_LIMIT", "40")
            .env("CUQUOTA_POLICY", "hard")
            .env("CHAOS_GDB", "1")
            .args("forks 6 200 4")
            .timeout(Duration::from_secs(300))
            .run();
        stop.store(true, Ordering::Relaxed);
        println!("{out:?}");
        assert!(out.success(), "{out:?}");
        assert_eq!(out.num("forks.stuck"), 0, "children stuck on a lock:{out:?}");
        assert_eq!(out.num("forks.failed"), 0, "children failed:{out:?}");
        assert_eq!(out.num("forks.ok"), 200, "{out:?}");
        assert_eq!(
            out.num("forks.exec_ok"),
            50,
            "exec'd children must run CUDA:{out:?}"
        );
    });
}

/// The container's live slots as (pid, bytes charged on device entry 0), after the dead are reclaimed.
fn slots(sim: &Sim) -> Vec<(u32, u64)> {
    let u = UsageRegion::open_existing(&sim.usage_file()).expect("usage region");
    u.reclaim_dead();
    let mut v: Vec<(u32, u64)> = u
        .processes()
        .into_iter()
        .filter(|p| p.state == SlotState::Live)
        .map(|p| (p.pid, p.mem_used[0]))
        .collect();
    v.sort();
    v
}

fn driver_used(sim: &Sim) -> u64 {
    let raw = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    raw.ok();
    raw.num("sim.used.0")
}

#[test]
fn a_forked_child_is_not_charged_and_does_not_release_its_parents_charge() {
    let sim = Sim::new().ctx_overhead("64m").build();
    let mut p = sim.cmd(Prog::Chaos).mem_limit("1g").args("forkhold 128").spawn();
    p.wait_for("held");
    assert_eq!(p.wait_for("fork.child"), "ok");
    let pid: u32 = p.wait_for("pid").parse().expect("pid");
    // CUDA refuses a child forked after cuInit; the shim passes that on and charges nothing.
    assert_eq!(p.wait_for("child.alloc"), "CUDA_ERROR_NOT_INITIALIZED");
    // Before the dead are reclaimed: any slot the child claimed holds nothing, the parent's is untouched.
    let u = UsageRegion::open_existing(&sim.usage_file()).expect("usage region");
    for s in u.processes() {
        let want = if s.pid == pid { 192 * MIB } else { 0 };
        assert_eq!(s.mem_used[0], want, "slot of pid {} (parent {pid})", s.pid);
    }
    assert_eq!(
        slots(&sim),
        vec![(pid, 192 * MIB)],
        "after the child's exit only the parent's slot, with its 128m and 64m context"
    );
    assert_eq!(driver_used(&sim), 192 * MIB);
    p.release();
    let out = p.finish();
    assert!(out.success(), "{out:?}");
    out.expect("done", "1");
}

#[test]
fn an_execd_child_is_its_own_process_in_the_accounting() {
    let sim = Sim::new().ctx_overhead("64m").build();
    let mut p = sim
        .cmd(Prog::Chaos)
        .mem_limit("1g")
        .args("forkhold 128 exec")
        .spawn();
    // Both print `pid=` and `held=1` on the shared stdout: the parent first, then the exec'd child.
    p.wait_for_nth("held", 2);
    let parent: u32 = p.wait_for_nth("pid", 1).parse().expect("pid");
    let child: u32 = p.wait_for("child.pid").parse().expect("child pid");
    assert_eq!(p.wait_for_nth("pid", 2), child.to_string());
    let mut want = vec![(parent, 192 * MIB), (child, 192 * MIB)];
    want.sort();
    assert_eq!(
        slots(&sim),
        want,
        "parent and exec'd child: one slot each, nothing twice"
    );
    assert_eq!(driver_used(&sim), 384 * MIB);
    // One line each for the two readers of the shared stdin.
    p.release();
    p.release();
    let out = p.finish();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.get("exec.child"), Some("ok"), "{out:?}");
    assert_eq!(slots(&sim), vec![], "both exited: their slots are free");
}

//! Elastic memory (issue 39): an elastic tenant's large allocation moves to host memory while the agent's
//! limits file asks (`evict_mask`) and the tenant is idle, at the same address, and comes back before its next
//! launch once the agent cleared the bit. Bytes are checked through copies and a memory-touching kernel, with
//! launches racing the moves and the library's own driver calls failing; each attack beside its control (an
//! inelastic tenant, or no ask, is never moved). Residency is the simulator's NVML (resident bytes only).

use shim_tests::reclaim::{agent_reclaims, elastic_limits};
use shim_tests::{compile_c, workspace_root, Proc, Sim, MIB};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const BIG_MIB: u64 = 256;

fn tenant_prog() -> PathBuf {
    let src = workspace_root().join("shim-tests/c/elastic_tenant.c");
    compile_c("elastic_tenant", &src, &[], &["-lcuda", "-ldl"])
}

/// The agent's limits file: a 1 GiB limit with `request` guaranteed on every device, and the eviction ask.
fn limits(sim: &Sim, request: u64, evict: bool) {
    limits_flagged(sim, request, evict, false);
}

/// [`limits`], and with `reclaim` the agent says it reclaims (`LIMITS_FLAG_RECLAIM`: allocations and restores wait).
fn limits_flagged(sim: &Sim, request: u64, evict: bool, reclaim: bool) {
    elastic_limits(&sim.limits_file(), 1 << 30, request, evict);
    if reclaim {
        agent_reclaims(&sim.limits_file());
    }
}

/// A running tenant and how many answers of each kind it gave.
struct Tenant {
    p: Proc,
    res: usize,
    checks: usize,
    storms: usize,
}

impl Tenant {
    fn start(sim: &Sim, env: &[(&str, &str)]) -> Tenant {
        let mut cmd = sim
            .cmd_path(tenant_prog())
            .arg(&BIG_MIB.to_string())
            .timeout(Duration::from_secs(120));
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let mut p = cmd.spawn();
        p.wait_for("ready");
        Tenant {
            p,
            res: 2,
            checks: 0,
            storms: 0,
        }
    }

    /// (resident bytes on the device, bytes the tenant is charged).
    fn res(&mut self) -> (u64, u64) {
        self.p.send("res");
        self.res += 1;
        let r = self.p.wait_for_nth("resident", self.res).parse().unwrap();
        let u = self.p.wait_for_nth("info_used", self.res).parse().unwrap();
        (r, u)
    }

    /// Whether residency reaches `want` (as `pred` judges) within 10 s.
    fn res_until(&mut self, pred: impl Fn(u64) -> bool) -> Option<u64> {
        let t0 = Instant::now();
        loop {
            let (r, _) = self.res();
            if pred(r) {
                return Some(r);
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn check(&mut self) {
        self.p.send("check");
        self.checks += 1;
        assert_eq!(
            self.p.wait_for_nth("range", self.checks),
            "1",
            "cuMemGetAddressRange"
        );
        let ok = self.p.wait_for_nth("ok", self.checks);
        assert_eq!(ok, "1");
    }

    fn storm(&mut self, n: u32) {
        self.p.send(&format!("storm {n}"));
        self.storms += 1;
        self.p.wait_for_nth("storm", self.storms);
    }

    fn quit(mut self) -> u64 {
        self.p.send("quit");
        self.res += 1;
        let r = self.p.wait_for_nth("resident", self.res).parse().unwrap();
        let out = self.p.finish();
        assert!(out.success(), "{out:?}");
        assert!(out.get("fail").is_none(), "{out:?}");
        r
    }
}

fn sim() -> Sim {
    Sim::new().memory("4g").build()
}

/// Evicted while asked and idle, restored once the ask is gone, N times: every byte right through copies and a
/// kernel that touches the memory, the charge unchanged, nothing left after the free.
#[test]
fn evicted_and_restored_memory_keeps_every_byte() {
    let sim = sim();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, charged) = t.res();
    for cycle in 0..4 {
        limits(&sim, 64 * MIB, true);
        let evicted = t.res_until(|r| r + BIG_MIB * MIB <= before);
        assert!(
            evicted.is_some(),
            "cycle {cycle}: never evicted (resident {before})"
        );
        let (_, charged_now) = t.res();
        assert_eq!(
            charged_now, charged,
            "cycle {cycle}: evicted memory stays charged"
        );
        // Still asked: a kernel that touches it works on host memory, correctly, and nothing comes back.
        t.check();
        let (r, _) = t.res();
        assert!(
            r + BIG_MIB * MIB <= before,
            "cycle {cycle}: restored while still asked"
        );
        limits(&sim, 64 * MIB, false);
        // The next launch restores it first.
        t.check();
        let (r, _) = t.res();
        assert_eq!(r, before, "cycle {cycle}: restored");
    }
    let after = t.quit();
    assert!(
        after + (BIG_MIB + 2) * MIB <= before,
        "freed: {after} vs {before}"
    );
}

/// Control: with the ask but no elasticity (request = limit), or elasticity but no ask, nothing moves.
#[test]
fn an_inelastic_tenant_or_one_not_asked_is_never_moved() {
    for (request, evict) in [(1 << 30, true), (64 * MIB, false), (0, true)] {
        let sim = sim();
        limits(&sim, request, evict);
        let mut t = Tenant::start(&sim, &[]);
        let (before, _) = t.res();
        std::thread::sleep(Duration::from_millis(400));
        t.check();
        let (r, _) = t.res();
        assert_eq!(r, before, "request {request} evict {evict}: moved");
        t.quit();
    }
}

/// Launches racing the moves: the agent flips the ask while the tenant launches a kernel every ~2 ms that
/// adds to every byte; every add lands (the final check counts them all). Launches that arrive during a move
/// wait for it (the gate's lock side). Not caught here: a mover that skips the quiescence check (the simulator
/// applies a pending kernel's touches at its end to whatever is mapped then, so a move under a running kernel
/// still reads right); `gate`'s unit tests cover that side.
#[test]
fn launches_racing_evictions_and_restores_lose_nothing() {
    let sim = sim();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    let mut moved = 0;
    for _ in 0..6 {
        limits(&sim, 64 * MIB, true);
        t.p.send("storm 40");
        t.storms += 1;
        std::thread::sleep(Duration::from_millis(30));
        limits(&sim, 64 * MIB, false);
        t.p.wait_for_nth("storm", t.storms);
        limits(&sim, 64 * MIB, true);
        if t.res_until(|r| r + BIG_MIB * MIB <= before).is_some() {
            moved += 1;
        }
        t.storm(10);
        limits(&sim, 64 * MIB, false);
    }
    assert!(moved >= 1, "the race never had an eviction to race with");
    t.check();
    t.quit();
}

/// The library's own driver calls fail (a copy, a map): nothing is lost, the next try moves it, and nothing
/// leaks (the free gives every resident byte back).
#[test]
fn a_failed_copy_or_map_loses_nothing() {
    for fault in [
        "cuMemcpyAsync:1:UNKNOWN",
        "cuMemMap:3:UNKNOWN",
        "cuMemCreate:2:OUT_OF_MEMORY",
    ] {
        let sim = sim();
        limits(&sim, 64 * MIB, false);
        let mut t = Tenant::start(&sim, &[("CUDASIM_FAULT", fault)]);
        let (before, _) = t.res();
        limits(&sim, 64 * MIB, true);
        assert!(
            t.res_until(|r| r + BIG_MIB * MIB <= before).is_some(),
            "{fault}: never evicted after the failure"
        );
        t.check();
        limits(&sim, 64 * MIB, false);
        t.check();
        assert_eq!(t.res().0, before, "{fault}: restored");
        let after = t.quit();
        assert!(
            after + (BIG_MIB + 2) * MIB <= before,
            "{fault}: leaked: {after} vs {before}"
        );
    }
}

fn waiting_word(sim: &Sim) -> u64 {
    cuquota_core::UsageRegion::open_existing(&sim.usage_file())
        .map(|u| u.waiting().load(std::sync::atomic::Ordering::Acquire))
        .unwrap_or(0)
}

/// A 1 GiB device; the tenant (`CUQUOTA_RECLAIM_WAIT_MS` = `wait_ms`) evicted, then a process outside any
/// container takes all but ~160 MiB (less than the 256 MiB to restore), then the ask is cleared.
fn evicted_on_a_full_device(reclaim: bool, wait_ms: &str) -> (Sim, Tenant, Proc) {
    let sim = Sim::new().memory("1g").build();
    limits_flagged(&sim, 64 * MIB, false, reclaim);
    let mut t = Tenant::start(&sim, &[("CUQUOTA_RECLAIM_WAIT_MS", wait_ms)]);
    let (before, _) = t.res();
    limits_flagged(&sim, 64 * MIB, true, reclaim);
    let low = t
        .res_until(|r| r + BIG_MIB * MIB <= before)
        .expect("never evicted");
    let hog_mib = ((1 << 30) - low) / MIB - 160;
    let mut hog = sim
        .cmd(shim_tests::Prog::Probe)
        .no_preload()
        .args(&format!("init alloc:mem:{hog_mib}m wait"))
        .timeout(Duration::from_secs(120))
        .spawn();
    hog.wait_ready(1);
    assert_eq!(hog.wait_for("alloc.0"), "CUDA_SUCCESS");
    limits_flagged(&sim, 64 * MIB, false, reclaim);
    (sim, t, hog)
}

/// A woken tenant whose memory is in host memory and finds the device full waits for the agent's reclaim
/// (naming the bytes it needs in the `waiting` word) and gets the memory freed meanwhile; after the bound, the
/// launch runs on the host copy (swapped, not out of memory), its bytes intact; without a reclaiming agent it
/// runs at once. Control: a device with room restores at once (`evicted_and_restored_memory_keeps_every_byte`).
#[test]
fn a_restore_on_a_full_device_waits_for_the_reclaim_then_runs_on_the_host_copy() {
    // Room comes within the bound: restored, the launch made.
    let (sim, mut t, mut hog) = evicted_on_a_full_device(true, "30000");
    t.p.send("launch");
    let until = Instant::now() + Duration::from_secs(20);
    while waiting_word(&sim) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(waiting_word(&sim), (1 << 56) | (BIG_MIB * MIB), "no waiting word");
    hog.release();
    hog.finish().ok();
    assert_eq!(t.p.wait_for("launch"), "CUDA_SUCCESS");
    assert_eq!(waiting_word(&sim), 0, "the waiting word was left set");
    t.check();
    t.quit();
    // No room within the bound: made on the host copy after it, nothing lost.
    let (sim, mut t, mut hog) = evicted_on_a_full_device(true, "600");
    let t0 = Instant::now();
    t.p.send("launch");
    assert_eq!(t.p.wait_for("launch"), "CUDA_SUCCESS");
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "gave up before the bound"
    );
    assert_eq!(waiting_word(&sim), 0, "the waiting word was left set");
    hog.release();
    hog.finish().ok();
    t.check();
    t.quit();
    // No reclaiming agent: made at once on the host copy, no waiting word.
    let (sim, mut t, mut hog) = evicted_on_a_full_device(false, "60000");
    let t0 = Instant::now();
    t.p.send("launch");
    assert_eq!(t.p.wait_for("launch"), "CUDA_SUCCESS");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "waited without a reclaiming agent"
    );
    assert_eq!(waiting_word(&sim), 0);
    hog.release();
    hog.finish().ok();
    t.check();
    t.quit();
}

/// The container's charge on its devices, as its usage file holds it (what the agent reads: evicted = charged
/// less NVML's resident).
fn container_charge(sim: &Sim) -> u64 {
    cuquota_core::UsageRegion::open_existing(&sim.usage_file())
        .map(|u| u.devices().iter().map(|d| d.used).sum())
        .unwrap_or(0)
}

/// SIGKILLed in the middle of an eviction (256 MiB at a 0.1 GB/s device-to-host engine: ~2.7 s; killed 1 s
/// after the ask, still all resident): the simulator's device memory is back to what it was before the tenant
/// (device and host backings went with the process), and the dead pid's charge goes at the next process's
/// `cuMemGetInfo` (`Devices::maybe_reclaim`); until then the usage file keeps it (nothing else reclaims it: the
/// agent's pinned-host estimate counts it meanwhile). Control: the same eviction not killed ends only after
/// 2 s, so the kill landed inside it.
#[test]
fn a_tenant_killed_mid_eviction_leaves_nothing_behind() {
    let sim = Sim::new().memory("4g").env("CUDASIM_D2H_GBPS", "0.1").build();
    let baseline = shim_tests::credit::sim_used(&sim);
    limits(&sim, 64 * MIB, false);
    // Control: how long the eviction takes.
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    limits(&sim, 64 * MIB, true);
    let t0 = Instant::now();
    assert!(
        t.res_until(|r| r + BIG_MIB * MIB <= before).is_some(),
        "control: never evicted"
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "control: evicted in {:?}: no window to kill in",
        t0.elapsed()
    );
    limits(&sim, 64 * MIB, false);
    t.quit();
    assert_eq!(
        shim_tests::credit::sim_used(&sim),
        baseline,
        "control: device memory left"
    );
    // What a clean exit leaves once the next process looked (the context's overhead, reclaimed as dead).
    sim.cmd(shim_tests::Prog::Probe).args("init info").run().ok();
    let clean = container_charge(&sim);
    assert!(clean < BIG_MIB * MIB, "control: {clean} left");
    // Attack: killed inside the copy.
    let mut t = Tenant::start(&sim, &[]);
    let (before, charged) = t.res();
    limits(&sim, 64 * MIB, true);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        t.res().0,
        before,
        "evicted already: the kill would not be mid-eviction"
    );
    t.p.kill();
    assert_eq!(
        shim_tests::credit::sim_used(&sim),
        baseline,
        "device memory leaked"
    );
    assert!(
        container_charge(&sim) >= charged,
        "the dead pid's charge went before any process reclaimed it (who did? update the doc)"
    );
    limits(&sim, 64 * MIB, false);
    let out = sim.cmd(shim_tests::Prog::Probe).args("init info").run();
    out.ok();
    assert_eq!(
        container_charge(&sim),
        clean,
        "the dead pid's charge stayed: {out:?}"
    );
}

/// `cuDevicePrimaryCtxReset` ends the context and with it its `cuMemAlloc` memory: a movable range (resident, or
/// in host memory) goes too, so the device and the charge are back to what the context alone holds, and the
/// mover keeps running on nothing. Without it the range's VMM memory (not tied to a context) stayed resident
/// and uncharged: a way past the cap. Control: an inelastic tenant (request = limit), its allocation plain.
#[test]
fn a_context_reset_frees_movable_ranges_resident_or_evicted() {
    for (request, evict) in [(1 << 30, false), (64 * MIB, false), (64 * MIB, true)] {
        let sim = sim();
        limits(&sim, request, false);
        let mut t = Tenant::start(&sim, &[]);
        let start_r: u64 = t.p.wait_for_nth("resident", 1).parse().unwrap();
        let start_u: u64 = t.p.wait_for_nth("info_used", 1).parse().unwrap();
        let (before, _) = t.res();
        assert!(before >= start_r + BIG_MIB * MIB, "request {request}: {before}");
        if evict {
            limits(&sim, request, true);
            assert!(
                t.res_until(|r| r + BIG_MIB * MIB <= before).is_some(),
                "never evicted"
            );
        }
        t.p.send("ctxreset");
        assert_eq!(t.p.wait_for("reset"), "CUDA_SUCCESS");
        t.res += 1;
        let r: u64 = t.p.wait_for_nth("resident", t.res).parse().unwrap();
        let u: u64 = t.p.wait_for_nth("info_used", t.res).parse().unwrap();
        assert!(
            r <= start_r,
            "request {request} evict {evict}: resident {r} after the reset, {start_r} before the allocations"
        );
        assert!(
            u <= start_u,
            "request {request} evict {evict}: charged {u} after the reset, {start_u} before the allocations"
        );
        limits(&sim, request, false);
        std::thread::sleep(Duration::from_millis(100));
        assert!(t.quit() <= start_r, "request {request} evict {evict}: grew after");
    }
}

/// Entry points that copy, set or wait on device memory, called while the big range is in host memory and the
/// ask is cleared: the copies and memsets (cuMemcpyPeer, cuMemcpyPeerAsync, cuMemsetD2D8) pass the gate and bring
/// it back first, and so do stream memory operations (on a buffer too small to move: a gated call brings back
/// every range no longer asked); prefetches do not pass it (they leave it where it is: the host copy, mapped at
/// the same address, is what they would touch); every byte stays right. cuMemcpy3DPeer
/// passes the gate too (`copy::copy_3d_peer`); the simulator does not implement it.
#[test]
fn copies_and_memsets_restore_and_the_rest_stay_correct() {
    for (op, restores) in [
        ("peer", true),
        ("peer_async", true),
        ("memset2d", true),
        ("write32", true),
        ("wait32", true),
        ("prefetch", false),
    ] {
        let sim = sim();
        limits(&sim, 64 * MIB, false);
        let mut t = Tenant::start(&sim, &[]);
        let (before, _) = t.res();
        limits(&sim, 64 * MIB, true);
        let low = t
            .res_until(|r| r + BIG_MIB * MIB <= before)
            .expect("never evicted");
        limits(&sim, 64 * MIB, false);
        t.p.send(&format!("op {op}"));
        let answer = t.p.wait_for("op");
        if op != "prefetch" {
            assert_eq!(answer, "CUDA_SUCCESS", "{op}");
        }
        let (r, _) = t.res();
        if restores {
            assert!(r >= before, "{op}: not restored: {r} vs {before}");
        } else {
            assert!(r <= low + 2 * MIB, "{op}: restored: {r} vs {low}");
        }
        t.check();
        assert!(t.res().0 >= before, "{op}: the check's launch restores");
        t.quit();
    }
}

/// Stream memory operations on the evicted range itself, the ask cleared: each passes the gate and brings the
/// range back first, and a write lands (read back by `peek`). Before, they were not gated and ran on the host
/// copy, leaving it there. cuStreamBatchMemOp: the simulator does not implement it (NOT_SUPPORTED), the
/// restore comes before the call all the same.
#[test]
fn stream_memory_operations_on_a_movable_range_restore_it_first() {
    for op in ["bigwrite32", "bigwait32", "bigbatch"] {
        let sim = sim();
        limits(&sim, 64 * MIB, false);
        let mut t = Tenant::start(&sim, &[]);
        let (before, _) = t.res();
        limits(&sim, 64 * MIB, true);
        t.res_until(|r| r + BIG_MIB * MIB <= before)
            .expect("never evicted");
        limits(&sim, 64 * MIB, false);
        t.p.send(&format!("op {op}"));
        let answer = t.p.wait_for("op");
        if op != "bigbatch" {
            assert_eq!(answer, "CUDA_SUCCESS", "{op}");
        }
        let (r, _) = t.res();
        assert!(r >= before, "{op}: not restored first: {r} vs {before}");
        if op == "bigwrite32" {
            t.p.send("peek");
            assert_eq!(t.p.wait_for("peek"), "1", "the write was lost");
        }
        t.check();
        t.quit();
    }
}

/// A stream waiting (cuStreamWaitValue32) on a word of the movable range is work in flight: the tenant is not
/// quiescent and nothing moves while the wait is pending, however long the agent asks. Control: once the wait
/// is over, the same ask moves the range. Before, the wait was not gated, its stream never asked, and the range
/// moved under it.
#[test]
fn a_pending_stream_wait_on_a_movable_range_keeps_it_resident() {
    let sim = sim();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    t.p.send("hold");
    assert_eq!(t.p.wait_for("hold"), "CUDA_SUCCESS");
    limits(&sim, 64 * MIB, true);
    // 150 polls of the mover: an idle tenant is moved within a few of them (the control below).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let (r, _) = t.res();
        assert!(
            r >= before,
            "moved while a wait on it was pending: {r} vs {before}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.p.send("release");
    assert_eq!(t.p.wait_for("release"), "ok");
    t.res_until(|r| r + BIG_MIB * MIB <= before)
        .expect("control: not moved once the wait was over");
    limits(&sim, 64 * MIB, false);
    t.check();
    t.quit();
}

/// Peer access: a kernel on device 1's NULL stream adds to device 0's movable range. While it runs the tenant
/// is not quiescent and nothing moves; once it finished (control), the same ask moves the range, and every byte
/// is right after. Before, the NULL stream was one entry asked in the range's context (device 0's, idle), and
/// the range moved under the running kernel.
#[test]
fn a_kernel_on_a_peer_device_keeps_the_range_resident_while_it_runs() {
    let sim = Sim::new().devices(2).memory("4g").build();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    t.p.send("peerlaunch 4000");
    assert_eq!(t.p.wait_for("peer"), "CUDA_SUCCESS");
    let launched = Instant::now();
    limits(&sim, 64 * MIB, true);
    // ~100 polls of the mover within the kernel's 4 s (an idle tenant moves within a few: the control below).
    while launched.elapsed() < Duration::from_millis(2500) {
        let (r, _) = t.res();
        assert!(r >= before, "moved under a running peer kernel: {r} vs {before}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t.p.send("peersync");
    assert_eq!(t.p.wait_for("peersync"), "CUDA_SUCCESS");
    t.res_until(|r| r + BIG_MIB * MIB <= before)
        .expect("control: not moved once the kernel finished");
    limits(&sim, 64 * MIB, false);
    t.check();
    t.quit();
}

/// Peer access: VMM memory ignores `cuCtxEnablePeerAccess` (access is per device, `cuMemSetAccess`), so a
/// movable range is granted to every device that can reach it as a peer. A kernel on device 1 adds to device
/// 0's movable range while resident, while evicted (on its host backing, the ask still on) and once restored
/// (the ask gone): each succeeds and every byte is right. Before, only device 0 was granted and the peer kernel
/// failed with CUDA_ERROR_ILLEGAL_ADDRESS (the simulator's per-device access, with its own control in its smoke
/// tests: `vmm_access_is_per_device_and_peer_access_does_not_grant_it`). Control: an inelastic tenant's plain
/// allocation, which peer access covers.
#[test]
fn a_peer_kernel_reaches_a_movable_range_before_during_and_after_an_eviction() {
    fn peer_kernel(t: &mut Tenant, n: usize, when: &str) {
        t.p.send("peerlaunch 5");
        assert_eq!(t.p.wait_for_nth("peer", n), "CUDA_SUCCESS", "{when}");
        t.p.send("peersync");
        assert_eq!(t.p.wait_for_nth("peersync", n), "CUDA_SUCCESS", "{when}");
    }
    let plain = Sim::new().devices(2).memory("4g").build();
    limits(&plain, 1 << 30, false);
    let mut t = Tenant::start(&plain, &[]);
    peer_kernel(&mut t, 1, "control: plain memory");
    t.check();
    t.quit();
    let sim = Sim::new().devices(2).memory("4g").build();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    peer_kernel(&mut t, 1, "resident");
    limits(&sim, 64 * MIB, true);
    t.res_until(|r| r + BIG_MIB * MIB <= before)
        .expect("not moved when asked");
    peer_kernel(&mut t, 2, "on host memory");
    assert!(t.res().0 + BIG_MIB * MIB <= before, "restored while asked");
    limits(&sim, 64 * MIB, false);
    peer_kernel(&mut t, 3, "restored");
    assert!(t.res().0 >= before, "restored before the peer kernel");
    t.check();
    t.quit();
}

/// `cuIpcGetMemHandle` of a movable range: the range is pinned resident for the export (brought back first),
/// but the driver refuses legacy IPC of VMM memory (the simulator does, as a GPU may): then it is unpinned and
/// moves again when asked (before, a refused export pinned it for ever). Control: an inelastic tenant's plain
/// allocation is exported. What is not done: an exported movable range (legacy IPC of it needs the driver's
/// shareable handles, translated for the importer).
#[test]
fn a_refused_ipc_export_does_not_pin_a_movable_range() {
    let plain = sim();
    limits(&plain, 1 << 30, false);
    let mut t = Tenant::start(&plain, &[]);
    t.p.send("ipc");
    assert_eq!(t.p.wait_for("ipc"), "CUDA_SUCCESS", "control");
    t.quit();
    let sim = sim();
    limits(&sim, 64 * MIB, false);
    let mut t = Tenant::start(&sim, &[]);
    let (before, _) = t.res();
    t.p.send("ipc");
    assert_eq!(t.p.wait_for("ipc"), "CUDA_ERROR_INVALID_VALUE");
    limits(&sim, 64 * MIB, true);
    assert!(
        t.res_until(|r| r + BIG_MIB * MIB <= before).is_some(),
        "pinned by a refused export"
    );
    limits(&sim, 64 * MIB, false);
    t.check();
    t.quit();
}

//! Review of issue 21 item 6 (the usage binding by identity). Reproductions of what still gets past it; they
//! are EXPECTED TO FAIL on rev-binding (b4ecae5): each failure is a finding.

use shim_tests::{compile_c, mono_ns, workspace_root, Prog, Sim, GIB};
use std::path::PathBuf;
use std::time::Duration;

fn launcher() -> PathBuf {
    compile_c(
        "throttle_paths_dl",
        &workspace_root().join("shim-tests/c/throttle_paths.c"),
        &[],
        &["-ldl"],
    )
}

fn bind(sim: &Sim, usage: &std::path::Path) {
    let file = sim.limits_file();
    let u = usage.to_str().unwrap();
    let out = sim.cli(&[
        "limits",
        "set",
        file.to_str().unwrap(),
        "--device",
        "all",
        "--usage",
        u,
        "--usage-host",
        u,
    ]);
    assert!(out.success(), "binding failed:{out:?}");
}

/// FINDING (SM): a process whose usage file is no longer the bound one (it started before the agent bound the
/// container, or the agent re-bound it) is "superseded", but `UsageRegion::check` is consulted only by memory
/// admissions (src/memory/mod.rs:180): its launches keep drawing on the SM-time bucket of its old file, which
/// the processes in the bound file never see. Two processes of one container under a hard 20 % limit: the
/// device runs ~2 × 20 %.
#[test]
fn a_superseded_process_keeps_its_own_sm_bucket() {
    let sim = Sim::new().build();
    sim.agent_sm_limit_hard(20);
    let secs_p = 4.0;
    let t0 = mono_ns() + 300_000_000;
    // P: started before the binding, accounting in container "a"'s file (its environment's).
    let mut p = sim
        .cmd_path(launcher())
        .container("a")
        .timeout(Duration::from_secs(60))
        .args(&format!("kernel dlsym {secs_p} 1000000 1 {t0}"))
        .spawn();
    std::thread::sleep(Duration::from_millis(800));
    // The agent binds the container to its file "b" (by identity).
    let b = sim.container_usage_file("b");
    // create + initialise it the way the agent would (--usage-host creates it)
    bind(&sim, &b);
    std::thread::sleep(Duration::from_millis(300));
    let t1 = mono_ns() + 200_000_000;
    let q = sim
        .cmd_path(launcher())
        .container("b")
        .timeout(Duration::from_secs(60))
        .args(&format!("kernel dlsym 2.0 1000000 1 {t1}"))
        .spawn();
    let qo = q.finish();
    assert!(qo.success(), "{qo:?}");
    let po = p.finish();
    assert!(po.success(), "{po:?}");
    let w = qo.window();
    let total = sim.share_pct(0, 0, w.t0, w.end);
    let ps = sim.share_pct(0, po.window().pid, w.t0, w.end);
    let qs = sim.share_pct(0, w.pid, w.t0, w.end);
    println!("device {total:.1} % (P {ps:.1} %, Q {qs:.1} %) under a container-wide hard 20 %");
    assert!(
        total <= 35.0,
        "one container held {total:.1} % of a device limited to 20 % (P superseded {ps:.1} %, Q bound {qs:.1} %)\
         \nP stderr: {}",
        po.stderr
    );
}

/// FINDING (memory, documented residual made concrete): the same superseded process keeps what it allocated
/// before the binding, uncharged in the bound file: 2 × the cap.
#[test]
fn a_process_started_before_the_binding_keeps_an_uncharged_cap() {
    let sim = Sim::new().ctx_overhead("64m").build();
    sim.agent_memory_limit(0, "1g");
    let mut p = sim
        .cmd(Prog::Probe)
        .container("a")
        .args("init alloc:mem:800m wait")
        .spawn();
    p.wait_ready(1);
    let b = sim.container_usage_file("b");
    bind(&sim, &b);
    let mut q = sim
        .cmd(Prog::Probe)
        .container("b")
        .args("init alloc:mem:800m wait")
        .spawn();
    q.wait_ready(1);
    let truth = sim.cmd(Prog::Probe).no_preload().args("simused").run();
    truth.ok();
    q.release();
    let qo = q.finish();
    p.release();
    p.finish();
    let used = truth.num("sim.used.0");
    assert!(
        used <= GIB,
        "{} MiB held by one container under a 1 GiB cap (a process started before the binding):{qo:?}",
        used >> 20
    );
}

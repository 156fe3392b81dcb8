//! Review of 6e6bf07 (the launch exports' pass-through while no limit applies): a limit set live reaches
//! launches made through every way of finding the entry points. Judged by the simulator's device timeline
//! (`Sim::share_pct`) and its used bytes.
//!
//! The review's finding stays on branch `rev33-pass` (`review_pass33_prequeued_work_outlives_a_live_limit`, which
//! fails by design): kernels a program queued while no limit applied (up to 1024 per stream) run at full speed
//! once one is set, before this change as after it; docs/threat-model.md "Known limits" (the agent's SM debt
//! counts that device time).

use shim_tests::{compile_c, mono_ns, throttle_paths_dl, workspace_root, Output, Sim, Window};
use std::path::PathBuf;
use std::time::Duration;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn finished(out: Output) -> Window {
    assert!(out.success(), "{out:?}");
    out.window()
}

fn spawn(sim: &Sim, style: &str, secs: f64, kernel_ns: u64, streams: u32) -> shim_tests::Proc {
    sim.cmd_path(throttle_paths_dl())
        .container("a")
        .timeout(Duration::from_secs(90))
        .env("THR_STREAMS", &streams.to_string())
        .arg("kernel")
        .arg(style)
        .arg(&secs.to_string())
        .arg(&kernel_ns.to_string())
        .arg("1")
        .arg("0")
        .spawn()
}

/// Starts unlimited, fills `streams` queues, gets a hard 20 % limit 1 s in; the share from 1.5 s to 6 s after.
fn share_after_live_limit(style: &str, kernel_ns: u64, streams: u32, secs: f64) -> (f64, f64) {
    let _serial = serial();
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let mut p = spawn(&sim, style, secs, kernel_ns, streams);
    let t0: u64 = p.wait_for("t0_ns").parse().expect("t0_ns");
    std::thread::sleep(Duration::from_nanos(
        (t0 + 1_000_000_000).saturating_sub(mono_ns()),
    ));
    let changed = sim.agent_sm_limit_hard(20);
    let w = finished(p.finish());
    let before = sim.share_pct(0, w.pid, w.t0 + 200_000_000, changed);
    let after = sim.share_pct(0, w.pid, changed + 1_500_000_000, changed + 6_000_000_000);
    println!("{style} {streams} streams of {kernel_ns} ns kernels: before {before:.1} %, after {after:.1} %, {w:?}");
    (before, after)
}

/// Control: through a cuGetProcAddress(PER_THREAD) pointer taken while unlimited, one stream of 1 ms kernels.
#[test]
fn limit_set_live_applies_through_a_gpa_ptsz_pointer() {
    let (before, after) = share_after_live_limit("gpa_ptsz", 1_000_000, 1, 7.5);
    assert!(before > 80.0, "unlimited before the change: {before:.1} %");
    assert!((10.0..=30.0).contains(&after), "hard 20 % set live: {after:.1} %");
}

fn mem_prog() -> PathBuf {
    compile_c(
        "live_cap_first_launch",
        &workspace_root().join("shim-tests/c/live_cap_first_launch.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

/// Control: a module loaded while unlimited (its launches forwarded without a hook), then a 1 GiB cap set live;
/// each kernel's first launch (LOCAL 16384: ~4.6 GiB of stack on the simulator), through cuLaunchKernel, a
/// cuGetProcAddress(PER_THREAD) pointer taken while unlimited, dlsym'd cuLaunchKernelEx and legacy cuLaunchGrid,
/// must be refused: the simulator's used bytes stay under the cap.
#[test]
fn cap_set_live_admits_first_launches_on_every_path() {
    let sim = Sim::new().build();
    sim.agent_limits(&sim.limits_file(), |_| {});
    let go = sim.dir().join("go");
    let mut p = sim
        .cmd_path(mem_prog())
        .arg("16384")
        .arg(go.to_str().unwrap())
        .spawn();
    p.wait_for("ready");
    sim.agent_memory_limit(0, "1g");
    std::fs::write(&go, b"").unwrap();
    let out = p.finish();
    println!("{out:?}");
    assert!(out.success(), "{out:?}");
    for path in ["kernel", "gpa_ptsz", "dlsym_ex", "grid"] {
        let r = out.get(&format!("launch.{path}"));
        assert!(r == Some("CUDA_ERROR_OUT_OF_MEMORY"), "{path}: {r:?}");
    }
    out.assert_used_within(shim_tests::GIB);
}

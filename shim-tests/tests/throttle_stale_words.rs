//! Adversarial cases of the SM-time throttle found in review: shared state a dead process, a buggy one or a
//! previous boot left in the usage file must not stall or unleash the container.

use cuquota_core::UsageRegion;
use shim_tests::{heavy, throttle_paths_dl, Sim};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Shares of the device are measured: one test at a time (CI has 2 cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const HARD50: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "50"), ("CUQUOTA_POLICY", "hard")];

/// Launches 200 µs kernels flat out for `secs` in container "a"; the share of the device its kernels took over
/// its launch window, read from the simulator's timeline. One such CPU-heavy program at a time (`heavy()`).
fn share(sim: &Sim, env: &[(&str, &str)], secs: f64) -> f64 {
    let _h = heavy();
    let mut c = sim
        .cmd_path(throttle_paths_dl())
        .container("a")
        .timeout(Duration::from_secs_f64(secs * 4.0 + 30.0))
        .arg("kernel")
        .arg("dlsym")
        .arg(&secs.to_string())
        .arg("200000")
        .arg("1")
        .arg("0");
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{out:?}");
    let w = out.window();
    sim.share_pct(0, w.pid, w.t0, w.end)
}

/// A bucket word far in the future — garbage from a dead process, or a usage file kept across a reboot
/// (CLOCK_MONOTONIC restarts near 0, so every word of the previous boot lies ahead) — used to make every launch
/// of the container wait until the clock got there. Now it is reset, and the limit holds as before.
#[test]
fn bucket_and_burst_words_from_the_future_do_not_stall_the_container() {
    let _g = serial();
    let sim = Sim::new().build();
    // A first run creates the container's usage file and its device entry.
    let _ = share(&sim, HARD50, 0.3);
    let usage = UsageRegion::open_existing(&sim.container_usage_file("a")).expect("usage file");
    let devs = usage.devices();
    assert!(!devs.is_empty(), "no device entry");
    for d in &devs {
        let w = usage.throttle(d.id);
        w[0].store(u64::MAX - 7, Ordering::SeqCst); // ZERO_AT
        w[2].store(u64::MAX - 7, Ordering::SeqCst); // SAMPLE_AT
    }
    let t0 = Instant::now();
    let s = share(&sim, HARD50, 2.0);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // Neither stalled (≈ 0) nor unleashed (≈ 100): the limit holds as before. (The floor is low: short kernels
    // make this program CPU-heavy, and a starved CPU only lowers a share.)
    assert!((15.0..=62.0).contains(&s), "share {s:.1}% at a hard 50 % limit");
    for d in &devs {
        let z = usage.throttle(d.id)[0].load(Ordering::SeqCst);
        assert!(z < u64::MAX / 2, "bucket word still garbage: {z}");
    }
}

/// The same with a burst limit: a stale `SAMPLE_AT` from the future used to stop the burst controller for good
/// (and overflow in debug builds), leaving whatever rate the stale state said. Alone on the device, burst must
/// still get (nearly) all of it, i.e. the controller samples again.
#[test]
fn burst_controller_resumes_after_a_sample_time_from_the_future() {
    let _g = serial();
    let sim = Sim::new().build();
    let burst30: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUQUOTA_POLICY", "burst")];
    let _ = share(&sim, burst30, 0.3);
    let usage = UsageRegion::open_existing(&sim.container_usage_file("a")).expect("usage file");
    for d in usage.devices() {
        let w = usage.throttle(d.id);
        w[2].store(u64::MAX - 7, Ordering::SeqCst); // SAMPLE_AT
        w[6].store(30, Ordering::SeqCst); // BURST_STATE: eff 30 ‰, "others idle"
    }
    let s = share(&sim, burst30, 2.0);
    assert!(s >= 80.0, "burst alone got {s:.1}%");
}

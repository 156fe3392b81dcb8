//! Issue 36, hostile review of the NVML sampler thread (`src/throttle/sampler.rs`): `throttle_hidelong`'s attack
//! (a long launch charged a short probe's estimate, then over a second without CUDA calls) by a tenant that first
//! tries to starve or stop the thread: every signal blocked, its descriptors closed, 40 forks per round without
//! exec (the children call the shim and exit), the main thread gone by `pthread_exit` (all held), or no thread
//! creatable at all (RLIMIT_AS: the start fails closed, what NVML no longer shows is charged busy). The control is the attack alone. Also the thread's
//! CPU cost while its process is idle. Shares come from the simulator's timeline.

use shim_tests::Sim;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `throttle_starve ARGS` at a hard 30 % limit: the share (percent) of device 0 that every process of the
/// program got over its window, and the run's output.
fn run(args: &str) -> (f64, shim_tests::Output) {
    Sim::new()
        .build()
        .hard_share(30, "throttle_starve", &["-lcuda", "-lpthread"], args, 0, false)
}

/// Held at 29.1-29.5 % each (load 2.7); the control 29.5 %. The same attack with no sampler: 62.4 %
/// (`a_process_that_cannot_start_the_sampler_thread_escapes`).
#[test]
fn blocking_signals_closing_fds_forking_or_exiting_main_does_not_stop_the_sampler() {
    let _s = serial();
    for how in ["none", "sigblock", "closefds", "fork", "mainexit"] {
        let (s, _) = run(&format!("6 2000000000 1200 {how}"));
        assert!(s < 38.0, "{how}: 30 % tenant got {s:.1} %");
    }
}

/// A tenant that leaves no room for a thread (RLIMIT_AS at its current size, or RLIMIT_NPROC without
/// CAP_SYS_RESOURCE) before its first launch has no sampler: what NVML no longer shows of a window is charged as
/// busy (`Engine::set_sampled`). Before that fail-closed rule: 62.4 % (load 2.7) against the control's 29.5 %.
#[test]
fn a_process_that_cannot_start_the_sampler_thread_is_charged_what_nvml_cannot_show() {
    let _s = serial();
    let (control, _) = run("6 2000000000 1200 none");
    let (s, _) = run("6 2000000000 1200 nothread");
    assert!(control < 38.0, "control: {control:.1} %");
    assert!(s < 38.0, "no sampler thread: 30 % tenant got {s:.1} %");
}

/// The sampler's cost while its SM-limited process sleeps: it keeps ticking every 200 ms (a window must close
/// within NVML's second), at under 2 % of a core.
#[test]
fn the_sampler_costs_little_cpu_while_its_process_is_idle() {
    let _s = serial();
    let (_, out) = run("5 0 0 idle");
    assert_eq!(out.num("sampler_thread"), 1, "no sampler thread: {out:?}");
    let ns = out.num("sampler_cpu_ns") as f64;
    let pct = ns / 5e9 * 100.0;
    println!(
        "idle sampler: {:.2} ms of CPU in 5 s: {pct:.3} % of a core",
        ns / 1e6
    );
    assert!(pct < 2.0, "idle sampler takes {pct:.2} % of a core");
}

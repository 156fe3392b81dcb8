//! SM-time escapes a hostile review found in the throttle's measurement (issue 21, item 5), each once worth a
//! 30 % tenant ~100 % of the device, and attacks of the same kind that held (kept as regression tests):
//!
//! - releasing or resetting an idle primary context settled the probe of a kernel running in another context
//!   (100 % before the fix);
//! - one kernel on a fast and a slow device was charged the fast device's time on the slow one (100 %);
//! - short-lived processes that each launch one long kernel, synchronise and exit were charged 1 ms each (99 %);
//! - held: a race of a context's end with a poll, never-seen shapes of a long kernel, a burst of them right after
//!   a tiny probe;
//! - issue 36's review: a long launch behind a short probe (OPEN, docs/threat-model.md); a kernel short when
//!   probed from short-lived processes (held).
//!
//! Shares come from the simulator's device timeline over the program's launch window, never from the shim. The
//! bands hold the limit with room for a busy machine; the escapes they catch are at ~100 %. Each program holds
//! `heavy()`: one simulated process at a time per core.

use shim_tests::Sim;

/// One test at a time: they time the device.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `shim-tests/c/NAME.c ARGS` at a hard 30 % SM limit on a simulator with `devices` devices of `sms` SMs
/// each; returns the share (percent, from the timeline) device `dev` gave the program's process (`all`: every
/// process) over its window.
fn share(name: &str, libs: &[&str], devices: Option<(u32, &str)>, args: &str, dev: u32, all: bool) -> f64 {
    let sim = match devices {
        Some((n, sms)) => Sim::new().devices(n).sms(sms).build(),
        None => Sim::new().build(),
    };
    let (s, out) = sim.hard_share(30, name, libs, args, dev, all);
    println!("{name}: {} launches", out.num("launches"));
    s
}

#[test]
fn releasing_or_resetting_an_idle_primary_context_leaves_another_contexts_probe_alone() {
    let _s = serial();
    for mode in ["none", "release", "reset"] {
        let s = share(
            "throttle_primary",
            &["-lcuda"],
            None,
            &format!("{mode} 4 300000000"),
            0,
            false,
        );
        assert!(s < 40.0, "{mode}: 30 % tenant got {s:.1} %");
    }
}

#[test]
fn a_kernel_on_a_fast_and_a_slow_device_is_charged_each_devices_time() {
    let _s = serial();
    for mode in ["only1", "both"] {
        let s = share(
            "throttle_crossdev",
            &["-lcuda"],
            Some((2, "132,1")),
            &format!("{mode} 4 100000"),
            1,
            false,
        );
        assert!(s < 40.0, "{mode}: 30 % tenant got {s:.1} % of the slow device");
    }
}

#[test]
fn short_lived_processes_of_one_long_kernel_each_are_charged_it() {
    let _s = serial();
    let s = share(
        "throttle_oneshot",
        &["-lcuda"],
        None,
        "parent 6 500000000",
        0,
        true,
    );
    assert!(s < 40.0, "30 % container got {s:.1} %");
}

#[test]
fn a_context_end_racing_polls_does_not_stop_measurement() {
    let _s = serial();
    let s = share(
        "throttle_ctxrace",
        &["-lcuda", "-lpthread"],
        None,
        "6 4 300000000",
        0,
        false,
    );
    assert!(s < 40.0, "30 % tenant got {s:.1} % after the race");
}

#[test]
fn never_seen_shapes_of_a_long_kernel_are_charged() {
    let _s = serial();
    let s = share("throttle_shapes", &["-lcuda"], None, "4 300000000", 0, false);
    assert!(s < 40.0, "30 % tenant got {s:.1} %");
    let s = share("throttle_burst", &["-lcuda"], None, "5 200000000 4", 0, false);
    assert!(s < 40.0, "after tiny probes: 30 % tenant got {s:.1} %");
}

/// Issue 36: a data-dependent kernel (one launch shape, its length a parameter) made 5 us instead of 500 us on
/// the launch after one whose call slept, the launch the throttle probed: every probe measured 5 us and every
/// launch was charged it (the engine's `a_short_launch_right_after_a_sleep_does_not_take_the_device`: 100 %).
/// NVML's figure for the process, from the simulator's timeline, is now the floor on its charge. The control:
/// every launch long. Shares after 1 s of warm-up (measured: control 30.1-30.2 %, attack 29.5-30.6 %, load 0-4).
#[test]
fn a_kernel_short_right_after_each_sleep_is_charged_what_ran() {
    let _s = serial();
    let control = share(
        "throttle_sleepshort",
        &["-lcuda"],
        None,
        "5 500000 5000 0",
        0,
        false,
    );
    assert!(
        (25.0..=33.0).contains(&control),
        "control: 30 % tenant got {control:.1} %"
    );
    let s = share(
        "throttle_sleepshort",
        &["-lcuda"],
        None,
        "5 500000 5000 1",
        0,
        false,
    );
    assert!(s < 40.0, "short after each sleep: 30 % tenant got {s:.1} %");
}

/// Issue 36, hostile review: a launch charged the 5 us estimate of its shape (a 5 us launch, the probe, right
/// before it) that runs 2 s; the program then makes no CUDA call for 1.2 s more, so NVML's samples (the last
/// second only) show it idle when the next probe closes the window. Closed by the NVML sampler thread
/// (`Engine::sample_tick`, every 200 ms whether or not the program calls CUDA): 29.5 % (2 s kernels, with or
/// without the quiet second), 30.0 % (one 10 s kernel), the control (the long launch is the probe) 29.4 %, also
/// with two `yes` hogs (load 2.5-3.5; 29.2-29.8 %). With the sampler disabled: 62.4 % and 60.1 %.
#[test]
fn a_long_launch_behind_a_short_probe_then_a_quiet_second() {
    let _s = serial();
    let run = |args: &str| share("throttle_hidelong", &["-lcuda"], None, args, 0, false);
    let control = run("6 2000000000 1200 0");
    let caught = run("6 2000000000 0 1");
    let hidden = run("6 2000000000 1200 1");
    let ten = run("6 10000000000 0 1");
    println!(
        "hidelong: control {control:.1} %, no quiet second {caught:.1} %, quiet second {hidden:.1} %, 10 s {ten:.1} %"
    );
    assert!(control < 36.0, "control: 30 % tenant got {control:.1} %");
    assert!(caught < 38.0, "no quiet second: 30 % tenant got {caught:.1} %");
    assert!(hidden < 38.0, "quiet second: 30 % tenant got {hidden:.1} %");
    assert!(ten < 38.0, "10 s kernel: 30 % tenant got {ten:.1} %");
}

/// Issue 36, hostile review: `throttle_sleepshort`'s attack from a chain of processes of one container, each
/// living 150 ms or 1 s (a process's floor needs a window closed after a baseline one). Held: 18.6 % and
/// 23.6 % (load 6; 18.4 and 22.3 at load 9); the control, every launch long: 29.0-29.9 %. With the NVML sampler
/// (its windows every 200 ms, and one closed at the child's last synchronize): 30.4 % and 23.5 % (two hogs).
#[test]
fn a_kernel_short_after_each_sleep_from_short_lived_processes() {
    let _s = serial();
    let run = |args: &str| share("throttle_hopshort", &["-lcuda"], None, args, 0, true);
    let control = run("6 150 500000 5000 0");
    let s = run("6 150 500000 5000 1");
    let long = run("6 1000 500000 5000 1");
    println!("hopshort: control {control:.1} %, 150 ms processes {s:.1} %, 1 s processes {long:.1} %");
    assert!(
        (25.0..36.0).contains(&control),
        "control: 30 % container got {control:.1} %"
    );
    assert!(
        s < 36.0 && long < 36.0,
        "short-lived processes: {s:.1} %, {long:.1} %"
    );
}

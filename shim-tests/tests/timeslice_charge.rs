//! Tenants that really share a device are charged the device time they got (issue 36 item 2): on the
//! simulator's time-slicing model (`CUDASIM_SCHED=slice`) a kernel switched out for a neighbour keeps its
//! events running, so a probe's span includes the neighbour's slices and, before, a sharing tenant was
//! over-charged by them. While NVML shows another process on the device, each process now compares what it
//! was charged with the device time NVML says it occupied and gets the difference back (docs/sm-limit.md,
//! "Tenants that really share").
//!
//! `examples/compute_loop.cu` (0.40 ms kernels, as in timeslice.rs) for 5 s per tenant; shares are read from
//! the simulator's timeline over the programs' common window after 0.5 s of warm-up, never from their clocks.
//! With switching made free (`CUDASIM_SWITCH_US=0`) a 30 + 70 pair fills the device, so a tenant's share is
//! its charge's accuracy alone. Two simulated processes at most at once.
//!
//! Attacks beside the controls (each must not raise the tenant above its limit): NVML refused to the tenant
//! alone beside a neighbour; a pid NVML does not list kept written into the tenant's usage slot, beside a
//! neighbour (a naive correction that read the slot's pid gave 34.9 %) and with events refused (main's
//! degraded mode believed it: 93.4 %); NVML answering "nobody ran" with events refused (main: 93.2 %); a
//! second process of the same container whose kernels overlap the first's; a tenant in a real pid namespace
//! whose own pid is another process's host pid (main read that figure: 0.393 under a hard 30 %).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cuquota_core::UsageRegion;
use shim_tests::compute_loop::{metric, program as compute_loop, window, WARMUP_NS};
use shim_tests::{heavy, throttle_paths_dl, Output, Sim};

const SMS: u32 = 132;
/// compute_loop's kernel: SMS × 20 blocks = 20 waves × 20 µs = 0.40 ms, as on the H200.
const BLOCKS: u32 = SMS * 20;
/// `CUDASIM_HOST_PID_OFFSET` of a tenant in a modelled pid namespace.
const OFFSET: u32 = 200_000;

/// The slice model; `switch_us`: the switch cost (None = the calibrated default).
fn sim(switch_us: Option<&str>) -> Sim {
    let mut b = Sim::new().sms(&SMS.to_string()).env("CUDASIM_SCHED", "slice");
    if let Some(s) = switch_us {
        b = b.env("CUDASIM_SWITCH_US", s);
    }
    b.build()
}

/// One compute_loop process: its container, hard SM limit (0 = none), extra environment, and whether the
/// simulator's NVML knows it by a host pid (`OFFSET` added).
struct Tenant<'a> {
    container: &'a str,
    limit: u32,
    env: &'a [(&'a str, &'a str)],
    namespaced: bool,
    /// compute_loop's grid (its kernel length: 20 µs a wave).
    blocks: u32,
}

fn t<'a>(container: &'a str, limit: u32) -> Tenant<'a> {
    Tenant {
        container,
        limit,
        env: &[],
        namespaced: false,
        blocks: BLOCKS,
    }
}

/// Runs compute_loop for each tenant at once (while `during` runs beside them, until they end) and returns
/// each one's share of the device (fraction) over their common window after the warm-up.
fn shares(
    sim: &Sim,
    prog: &Path,
    tenants: &[Tenant<'_>],
    during: impl FnOnce(&AtomicBool) + Send,
) -> Vec<f64> {
    let _h = heavy();
    let procs: Vec<_> = tenants
        .iter()
        .map(|tn| {
            let mut c = sim
                .cmd_path(prog.to_path_buf())
                .container(tn.container)
                .args(&format!("5 {}", tn.blocks));
            if tn.limit > 0 {
                c = c
                    .env("CUDA_DEVICE_SM_LIMIT", &tn.limit.to_string())
                    .env("CUQUOTA_POLICY", "hard");
            }
            if tn.namespaced {
                c = c.env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string());
            }
            for (k, v) in tn.env {
                c = c.env(k, v);
            }
            c.spawn()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let st = stop.clone();
        let h = s.spawn(move || during(&st));
        let outs: Vec<Output> = procs.into_iter().map(|p| p.finish()).collect();
        stop.store(true, Ordering::Relaxed);
        h.join().expect("the side thread");
        let (from, to) = window(&outs);
        outs.iter()
            .zip(tenants)
            .map(|(o, tn)| {
                let pid = metric(o, "pid") as u32 + if tn.namespaced { OFFSET } else { 0 };
                sim.share_pct(0, pid, from, to) / 100.0
            })
            .collect()
    })
}

fn nothing(_: &AtomicBool) {}

/// The control and the goal: hard 30 + 70 with switching free. Main charged each the neighbour's slices its
/// probes spanned: 0.266 + 0.604, 0.253 + 0.613 (load average 13-16). Now the 30 % tenant gets its limit
/// within NVML's rounding (0.291-0.298 over eight runs) and the 70 % one 0.65-0.68, its net charge equal to
/// NVML's figure (the rest is time it leaves unused: see docs/sm-limit.md). That unused time (~3 %) is idle under
/// 15 %, which the library cannot tell from switching: the 30 % tenant pays its part of it (0.286-0.289 with the
/// switching charge), so its floor here is 0.28.
#[test]
fn sharing_tenants_are_charged_the_device_time_they_got() {
    let prog = compute_loop();
    let s = sim(Some("0"));
    let v = shares(&s, &prog, &[t("a", 30), t("b", 70)], nothing);
    println!("slice, switch free, hard 30 + 70: {:.4} + {:.4}", v[0], v[1]);
    assert!(
        (0.28..=0.31).contains(&v[0]) && (0.64..=0.71).contains(&v[1]),
        "hard 30 + 70 with switching free: {:.4} + {:.4} (bands [28, 31] and [64, 71] %)",
        v[0],
        v[1]
    );
}

/// With the calibrated switch cost the pair does no worse than the calibration (timeslice.rs: 0.289-0.300 and
/// 0.561-0.584 of the rate alone): the correction gives nothing back that was not over-charged. The 30 % tenant
/// also pays its part of the switching (issue 36: 0.27-0.28 of its rate alone, goal ≥ 0.3 T − 1.5 points = 0.255).
#[test]
fn with_switching_cost_the_pair_does_no_worse() {
    let prog = compute_loop();
    let s = sim(None);
    let v = shares(&s, &prog, &[t("a", 30), t("b", 70)], nothing);
    println!(
        "slice, default switch cost, hard 30 + 70: {:.4} + {:.4}",
        v[0], v[1]
    );
    assert!(
        (0.255..=0.31).contains(&v[0]) && (0.54..=0.71).contains(&v[1]),
        "hard 30 + 70 with the default switch cost: {:.4} + {:.4} (bands [25.5, 31] and [54, 71] %)",
        v[0],
        v[1]
    );
}

/// Kernels longer than the time slice (5 ms: 250 waves) are switched out at every quantum while the neighbour
/// has work, so each span holds two of its slices (9.9 ms): a quarter of the charge back, in 2 ms steps, left
/// the 30 % tenant at 0.19-0.20. Now up to half of a long span's charge comes back, in steps of a span. The
/// same tenants without cuquota: 0.45 + 0.45.
#[test]
fn kernels_longer_than_the_time_slice_are_charged_the_device_time_they_got() {
    let prog = compute_loop();
    let s = sim(None);
    let long = |c, l| Tenant {
        blocks: SMS * 250,
        ..t(c, l)
    };
    let v = shares(&s, &prog, &[long("a", 30), long("b", 70)], nothing);
    println!("slice, 5 ms kernels, hard 30 + 70: {:.4} + {:.4}", v[0], v[1]);
    assert!(
        (0.25..=0.31).contains(&v[0]) && (0.55..=0.71).contains(&v[1]),
        "hard 30 + 70, 5 ms kernels: {:.4} + {:.4} (bands [25, 31] and [55, 71] %)",
        v[0],
        v[1]
    );
}

/// Attack: NVML refused to the tenant alone (its own process's calls fail; the neighbour's NVML works). Its
/// correction stops and today's charge stands: it gets no more than its limit.
#[test]
fn nvml_refused_to_the_tenant_alone_gains_nothing() {
    let prog = compute_loop();
    let s = sim(Some("0"));
    let faults = [(
        "CUDASIM_FAULT",
        "nvmlDeviceGetProcessUtilization:1+:NOT_FOUND,nvmlDeviceGetProcessesUtilizationInfo:1+:NOT_FOUND",
    )];
    let a = Tenant {
        env: &faults,
        ..t("a", 30)
    };
    let v = shares(&s, &prog, &[a, t("b", 70)], nothing);
    println!("NVML refused to the 30 % tenant: {:.4} + {:.4}", v[0], v[1]);
    assert!(v[0] <= 0.31, "NVML refused: the 30 % tenant got {:.4}", v[0]);
}

/// Keeps writing `pid` as the host pid of every live slot of the usage file until `stop`.
fn forge_host_pids(usage: &Path, pid: u32, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(u) = UsageRegion::open_existing(usage) {
            for p in u.processes() {
                if p.pid != 0 {
                    u.set_host_pid(p.slot, pid);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A pid no process on the simulated device has (NVML lists nobody by it).
const UNLISTED: u32 = 1;

/// Attack: a tenant in a pid namespace (NVML knows it by another pid than its own) writes a pid NVML does not
/// list into its usage slot, so that its NVML figure looks empty. Beside a neighbour (the correction is on):
/// no more than its limit.
#[test]
fn a_pid_written_into_the_usage_slot_gains_nothing_beside_a_neighbour() {
    let prog = compute_loop();
    let s = sim(Some("0"));
    let usage = s.container_usage_file("a");
    let a = Tenant {
        namespaced: true,
        ..t("a", 30)
    };
    let v = shares(&s, &prog, &[a, t("b", 70)], |st| {
        forge_host_pids(&usage, UNLISTED, st)
    });
    println!("forged host pid in the usage slot: {:.4} + {:.4}", v[0], v[1]);
    assert!(v[0] <= 0.31, "forged host pid: the 30 % tenant got {:.4}", v[0]);
}

/// Share (percent, from the timeline) of a program launching 50 µs kernels for 3 s under a hard 30 % with the
/// driver refusing events (degraded mode: the charge is corrected by NVML's figure alone), in a modelled pid
/// namespace, with `faults` added; `forge`: a pid NVML does not list is kept written into its usage slot.
fn degraded_share(faults: &str, forge: bool) -> f64 {
    let _h = heavy();
    let s = Sim::new().build();
    let usage = s.usage_file();
    let stop = AtomicBool::new(false);
    let events = "cuEventCreate:1+:NOT_SUPPORTED,cuEventRecord:1+:NOT_SUPPORTED";
    let faults = if faults.is_empty() {
        events.to_string()
    } else {
        format!("{events},{faults}")
    };
    let out = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            if forge {
                forge_host_pids(&usage, UNLISTED, &stop)
            }
        });
        let out = s
            .cmd_path(throttle_paths_dl())
            .timeout(Duration::from_secs(40))
            .env("CUDA_DEVICE_SM_LIMIT", "30")
            .env("CUQUOTA_POLICY", "hard")
            .env("CUDASIM_HOST_PID_OFFSET", &OFFSET.to_string())
            .env("CUDASIM_FAULT", &faults)
            .args("kernel dlsym 3 50000 1 0")
            .run();
        stop.store(true, Ordering::Relaxed);
        h.join().expect("forger");
        out
    });
    assert!(out.success(), "{out:?}");
    let w = out.window();
    s.share_pct(0, w.pid + OFFSET, w.t0, w.end)
}

/// Degraded mode's band: throttle_degraded.rs's for 30 % is [15, 45]; an escape reads about 100 %. The upper
/// bound here is the limit plus the 3 points of that mode's accuracy.
fn degraded_ok(share: f64) -> bool {
    (15.0..=33.0).contains(&share)
}

/// The control: degraded mode in a pid namespace, nothing forged.
#[test]
fn without_events_in_a_pid_namespace_the_limit_holds() {
    let share = degraded_share("", false);
    println!("events refused, pid namespace: {share:.2} %");
    assert!(
        degraded_ok(share),
        "events refused: {share:.2} % under a hard 30 % (band [15, 33])"
    );
}

/// Attack: the same with a pid NVML does not list kept written into its usage slot: main believed the slot's
/// pid, read the tenant's NVML figure as 0 and gave it back everything it was charged.
#[test]
fn a_pid_written_into_the_usage_slot_gains_nothing_without_events() {
    let share = degraded_share("", true);
    println!("events refused, forged host pid: {share:.2} %");
    assert!(
        degraded_ok(share),
        "events refused, forged host pid: {share:.2} % under a hard 30 % (band [15, 33])"
    );
}

/// Attack: NVML answers "no samples" (`NVML_ERROR_NOT_FOUND`, nobody ran) to the tenant alone: main read that
/// as "used nothing" and gave back everything it was charged (93 %); now an unknown figure, so launches are
/// charged the fallback estimate (docs/sm-limit.md, degraded mode: the tenant only slows itself).
#[test]
fn nvml_answering_nobody_ran_gains_nothing_without_events() {
    let share = degraded_share("nvmlDeviceGetProcessUtilization:1+:NOT_FOUND", false);
    println!("events refused, NVML answering NOT_FOUND: {share:.2} %");
    assert!(
        share <= 33.0,
        "events refused, NVML NOT_FOUND: {share:.2} % under a hard 30 %"
    );
}

/// Runs a hard 30 % tenant in a real pid namespace (`unshare --user --pid --fork`, the host's /proc, so the
/// simulator's NVML reports its host pid as a driver does) beside another container's process at a hard 5 %
/// (started first, so NVML lists it before the tenant's first context); `steal`: the tenant's own pid in
/// the namespace is made that process's host pid (`ns_last_pid`, as forking until the pid comes round would).
/// `faults`: the tenant's `CUDASIM_FAULT`. Returns the tenant's share (fraction, from the timeline: the
/// device's minus the other's) and its own pid.
fn namespaced_beside_a_light_process(steal: bool, faults: &str) -> (f64, u32) {
    let _h = heavy();
    let prog = compute_loop();
    let s = sim(Some("0"));
    let other = s
        .cmd_path(prog.clone())
        .container("b")
        .env("CUDA_DEVICE_SM_LIMIT", "5")
        .env("CUQUOTA_POLICY", "hard")
        .args(&format!("9 {BLOCKS}"))
        .spawn();
    let host = other.pid();
    std::thread::sleep(Duration::from_secs(2));
    // `sh` is pid 1 of the namespace; the program is its next fork: pid `host` with `steal`.
    // Without events compute_loop cannot time itself: throttle_paths launches 0.4 ms kernels for 5 s instead.
    let (tenant_prog, args) = if faults.is_empty() {
        (prog, format!("5 {BLOCKS}"))
    } else {
        (throttle_paths_dl(), "kernel dlsym 5 400000 1 0".to_string())
    };
    let run = format!("\"$0\" {args}; exit $?");
    let script = if steal {
        format!(
            "echo {} > /proc/sys/kernel/ns_last_pid || exit 97; {run}",
            host - 1
        )
    } else {
        run
    };
    let tenant = s
        .cmd_path("unshare".into())
        .container("a")
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUQUOTA_POLICY", "hard")
        .env("CUDASIM_FAULT", faults)
        .args("--user --map-root-user --pid --fork sh -c")
        .arg(&script)
        .arg(tenant_prog.to_str().expect("utf-8 path"))
        .run();
    let outs = [tenant, other.finish()];
    let (from, to, own) = if faults.is_empty() {
        let (from, to) = window(&outs);
        (from, to, metric(&outs[0], "pid") as u32)
    } else {
        assert!(outs[0].success(), "{:?}", outs[0]);
        let w = outs[0].window();
        (w.t0 + WARMUP_NS, w.end, w.pid)
    };
    assert!(
        !steal || own == host,
        "the tenant's pid {own}, not {host}: ns_last_pid not applied"
    );
    let share = (s.share_pct(0, 0, from, to) - s.share_pct(0, host, from, to)) / 100.0;
    (share, own)
}

/// The control: in a real pid namespace the tenant's host pid is proven by the diff of NVML's list around its
/// first context (the one new pid), so its charge is corrected by its own figure: its limit, not more.
#[test]
fn in_a_pid_namespace_the_tenant_reads_its_own_figure() {
    let (share, own) = namespaced_beside_a_light_process(false, "");
    println!("pid namespace (own pid {own}), beside a 5 % process: {share:.4}");
    assert!(
        (0.28..=0.31).contains(&share),
        "pid namespace: the 30 % tenant got {share:.4} (band [28, 31] %)"
    );
}

/// The same with events refused (degraded mode: NVML's figure is the only measure), which shows the proven pid
/// is read: without a figure the 0.4 ms kernels are charged the 1 ms fallback (about 12 %).
#[test]
fn without_events_in_a_pid_namespace_the_tenant_reads_its_own_figure() {
    let events = "cuEventCreate:1+:NOT_SUPPORTED,cuEventRecord:1+:NOT_SUPPORTED";
    let (share, own) = namespaced_beside_a_light_process(false, events);
    println!("pid namespace (own pid {own}), events refused, beside a 5 % process: {share:.4}");
    assert!(
        (0.2..=0.33).contains(&share),
        "pid namespace, events refused: the 30 % tenant got {share:.4} (band [20, 33] %)"
    );
}

/// Attack (a hostile review, issue 36): a tenant in a pid namespace whose own pid is another process's host
/// pid. Main found itself in NVML's list by its own pid and read that process's 5 % as its own, so every
/// window gave back a quarter of its charge. Now its own pid counts only in the initial pid namespace and no
/// member's slot singles out its host pid: no proven pid, no correction, the event charge stands.
#[test]
fn a_namespace_pid_equal_to_another_host_pid_gains_nothing() {
    let (share, own) = namespaced_beside_a_light_process(true, "");
    println!("pid namespace, own pid = the 5 % process's host pid ({own}): {share:.4}");
    assert!(
        share <= 0.31,
        "own pid = another's host pid: the 30 % tenant got {share:.4}"
    );
}

/// Attack: two processes of one container (hard 30 %, one bucket) whose kernels overlap: each sees the other
/// on the device, so each corrects its charge; together they still get no more than the container's 30 %.
#[test]
fn two_processes_of_one_container_overlapping_get_its_share_not_more() {
    let prog = compute_loop();
    let s = sim(Some("0"));
    let v = shares(&s, &prog, &[t("a", 30), t("a", 30)], nothing);
    let sum = v[0] + v[1];
    println!(
        "two processes of one 30 % container: {:.4} + {:.4} = {sum:.4}",
        v[0], v[1]
    );
    assert!(
        (0.285..=0.31).contains(&sum),
        "two processes of one 30 % container: {sum:.4} (band [28.5, 31] %)"
    );
}

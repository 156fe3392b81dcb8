//! SM-time limits on the simulator: every launch path is throttled (by symbol, dlsym and cuGetProcAddress, with
//! and without `_ptsz`), the share holds, unlimited means untouched, live changes apply, burst is
//! work-conserving, and the usage region shows the achieved share.
//!
//! The program (`c/throttle_paths.c`) launches flat out for a while and prints the share of the device its
//! kernels took (kernels × kernel time / wall time until they all finished). Without throttling that share is
//! ~100 %, so a path that escapes fails its check.

use shim_tests::{compile_c, workspace_root, Sim};
use std::path::PathBuf;
use std::time::Duration;

/// Which binary: dlopen-based, or linked with -lcuda (direct symbols), optionally per-thread default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    Dl,
    Direct,
    DirectPtds,
}

/// Every test here measures shares of wall time: they run one at a time so they do not compete for the CPU
/// (CI has 2 cores) and skew each other's shares.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn prog(b: Build) -> PathBuf {
    let (name, flags): (&str, &[&str]) = match b {
        Build::Dl => ("throttle_paths_dl", &["-ldl"]),
        Build::Direct => ("throttle_paths_direct", &["-DTHR_DIRECT", "-lcuda", "-ldl"]),
        Build::DirectPtds => (
            "throttle_paths_direct_ptds",
            &[
                "-DTHR_DIRECT",
                "-DCUDA_API_PER_THREAD_DEFAULT_STREAM",
                "-lcuda",
                "-ldl",
            ],
        ),
    };
    compile_c(
        name,
        &workspace_root().join("shim-tests/c/throttle_paths.c"),
        &[],
        flags,
    )
}

struct Run {
    share: f64,
    ticks: Vec<(u64, u64)>,
}

#[allow(clippy::too_many_arguments)]
fn run(
    sim: &Sim,
    b: Build,
    container: &str,
    env: &[(&str, &str)],
    path: &str,
    style: &str,
    secs: f64,
    kernel_ns: u64,
    start_at: u64,
) -> Run {
    let mut c = sim
        .cmd_path(prog(b))
        .container(container)
        .timeout(Duration::from_secs_f64(secs * 4.0 + 30.0))
        .arg(path)
        .arg(style)
        .arg(&secs.to_string())
        .arg(&kernel_ns.to_string())
        .arg("1")
        .arg(&start_at.to_string());
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.status.success(), "{out:?}");
    let share: f64 = out.val("share").parse().expect("share");
    let ticks = out
        .all("tick")
        .iter()
        .filter_map(|t| {
            let (a, b) = t.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    Run { share, ticks }
}

const HARD30: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUQUOTA_POLICY", "hard")];

/// Runs `cases` (4 at a time, each on its own simulated GPU) at a hard 30 % limit. A path that escapes the
/// throttle runs at ~100 %; a held one at 30 (the bound below leaves room for a loaded CI machine, where a
/// late-woken process can only fall short, never exceed).
fn check_paths(b: Build, cases: &[(&str, &str)]) {
    let mut results: Vec<(String, f64)> = Vec::new();
    for chunk in cases.chunks(4) {
        results.extend(std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|&(path, style)| {
                    s.spawn(move || {
                        let sim = Sim::new().build();
                        let r = run(&sim, b, "a", HARD30, path, style, 1.0, 50_000, 0);
                        (format!("{b:?} {style} {path}"), r.share)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("run")).collect::<Vec<_>>()
        }));
    }
    let bad: Vec<String> = results
        .iter()
        .filter(|(_, s)| !(20.0..=35.0).contains(s))
        .map(|(n, s)| format!("{n}: {s:.1}%"))
        .collect();
    assert!(
        bad.is_empty(),
        "launch paths not held at 30 %: {bad:?}\nall: {results:?}"
    );
}

const ALL: &[&str] = &[
    "kernel",
    "kernel_ex",
    "coop",
    "coop_multi",
    "graph",
    "launch",
    "grid",
    "grid_async",
];
const PTSZ: &[&str] = &["kernel", "kernel_ex", "coop", "graph"];

#[test]
fn every_path_is_throttled_via_dlsym() {
    let _serial = serial();
    let mut cases: Vec<(&str, &str)> = ALL.iter().map(|p| (*p, "dlsym")).collect();
    cases.extend(PTSZ.iter().map(|p| (*p, "dlsym_ptsz")));
    check_paths(Build::Dl, &cases);
}

#[test]
fn every_path_is_throttled_via_cu_get_proc_address() {
    let _serial = serial();
    let mut cases: Vec<(&str, &str)> = ALL.iter().map(|p| (*p, "gpa")).collect();
    cases.extend(PTSZ.iter().map(|p| (*p, "gpa_ptsz")));
    check_paths(Build::Dl, &cases);
}

#[test]
fn every_path_is_throttled_via_direct_symbols() {
    let _serial = serial();
    let cases: Vec<(&str, &str)> = ALL.iter().map(|p| (*p, "direct")).collect();
    check_paths(Build::Direct, &cases);
    let cases: Vec<(&str, &str)> = PTSZ.iter().map(|p| (*p, "direct")).collect();
    check_paths(Build::DirectPtds, &cases);
}

#[test]
fn unlimited_means_untouched_and_the_check_can_fail() {
    let _serial = serial();
    for env in [
        &[][..],
        &[("CUDA_DEVICE_SM_LIMIT", "0")][..],
        &[("CUDA_DEVICE_SM_LIMIT", "100")][..],
        &[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "DISABLE"),
        ][..],
    ] {
        let sim = Sim::new().build();
        let r = run(&sim, Build::Dl, "a", env, "kernel", "dlsym", 0.5, 50_000, 0);
        assert!(r.share > 90.0, "{env:?}: {}", r.share);
    }
}

#[test]
fn long_kernels_hold_the_limit() {
    let _serial = serial();
    let sim = Sim::new().build();
    let r = run(
        &sim,
        Build::Dl,
        "a",
        &[("CUDA_DEVICE_SM_LIMIT", "50"), ("CUQUOTA_POLICY", "hard")],
        "kernel",
        "dlsym",
        2.0,
        10_000_000,
        0,
    );
    assert!((r.share - 50.0).abs() <= 5.0, "{}", r.share);
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn two_containers_split_30_70() {
    let _serial = serial();
    let sim = Sim::new().build();
    let start = mono_ns() + 200_000_000;
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            run(
                &sim,
                Build::Dl,
                "a",
                HARD30,
                "kernel",
                "dlsym",
                2.0,
                50_000,
                start,
            )
            .share
        });
        let b = s.spawn(|| {
            let env = [("CUDA_DEVICE_SM_LIMIT", "70"), ("CUQUOTA_POLICY", "hard")];
            run(&sim, Build::Dl, "b", &env, "kernel", "dlsym", 2.0, 50_000, start).share
        });
        (a.join().expect("a"), b.join().expect("b"))
    });
    assert!(
        (a - 30.0).abs() <= 5.0 && (b - 70.0).abs() <= 5.0,
        "30/70 gave {a:.1}/{b:.1}"
    );
}

#[test]
fn burst_alone_takes_the_device_and_yields_to_a_busy_neighbour() {
    let _serial = serial();
    let burst = [("CUDA_DEVICE_SM_LIMIT", "30"), ("CUQUOTA_POLICY", "burst")];
    let sim = Sim::new().build();
    let alone = run(&sim, Build::Dl, "a", &burst, "kernel", "dlsym", 1.5, 50_000, 0).share;
    assert!(alone >= 90.0, "burst alone: {alone}");
    let sim = Sim::new().build();
    let start = mono_ns() + 200_000_000;
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            run(
                &sim,
                Build::Dl,
                "a",
                &burst,
                "kernel",
                "dlsym",
                2.0,
                50_000,
                start,
            )
            .share
        });
        let b = s.spawn(|| {
            let env = [("CUDA_DEVICE_SM_LIMIT", "70"), ("CUQUOTA_POLICY", "hard")];
            run(
                &sim,
                Build::Dl,
                "b",
                &env,
                "kernel",
                "dlsym",
                2.0,
                1_000_000,
                start,
            )
            .share
        });
        (a.join().expect("a"), b.join().expect("b"))
    });
    // 1 ms kernels: few launches, so a loaded CI machine does not starve either program of CPU.
    assert!(
        b >= 63.0 && a <= 36.0,
        "burst 30 % next to a busy hard 70 %: got {a:.1} / {b:.1}"
    );
}

#[test]
fn live_limit_change_applies_within_200ms() {
    let _serial = serial();
    let sim = Sim::new().build();
    let lf = sim.limits_file();
    let lfs = lf.display().to_string();
    let o = sim.cli(&["limits", "init", &lfs]);
    assert!(o.status.success(), "{o:?}");
    let o = sim.cli(&[
        "limits", "set", &lfs, "--device", "all", "--sm", "20", "--policy", "hard",
    ]);
    assert!(o.status.success(), "{o:?}");
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let env = [("THR_TICK_MS", "100")];
            run(&sim, Build::Dl, "a", &env, "kernel", "dlsym", 2.0, 50_000, 0)
        });
        std::thread::sleep(Duration::from_millis(1000));
        let o = sim.cli(&[
            "limits", "set", &lfs, "--device", "all", "--sm", "80", "--policy", "hard",
        ]);
        assert!(o.status.success(), "{o:?}");
        h.join().expect("run")
    });
    // Share per 100 ms tick, from the kernels launched (each 50 µs).
    let rate = |from: u64, to: u64| {
        let k = |t: u64| {
            r.ticks
                .iter()
                .filter(|(ms, _)| *ms <= t)
                .map(|x| x.1)
                .max()
                .unwrap_or(0)
        };
        (k(to) - k(from)) as f64 * 50_000.0 / ((to - from) as f64 * 1e6) * 100.0
    };
    let before = rate(300, 900);
    // The change lands ~1000 ms after start (+ process start-up); from 1400 ms on it must hold.
    let after = rate(1400, 1900);
    assert!(
        (before - 20.0).abs() <= 5.0,
        "before the change: {before:.1} ({:?})",
        r.ticks
    );
    assert!(
        (after - 80.0).abs() <= 8.0,
        "after the change: {after:.1} ({:?})",
        r.ticks
    );
}

#[test]
fn usage_region_shows_the_achieved_share() {
    let _serial = serial();
    let sim = Sim::new().build();
    let usage = sim.container_usage_file("a").display().to_string();
    std::thread::scope(|s| {
        let h = s.spawn(|| run(&sim, Build::Dl, "a", HARD30, "kernel", "dlsym", 2.0, 50_000, 0));
        std::thread::sleep(Duration::from_millis(700));
        let o = sim.cli(&["status", "--usage", &usage, "--interval", "800", "--json"]);
        assert!(o.status.success(), "{o:?}");
        let text = o.lines.join("\n");
        // The device entry's share_percent (the container's achieved share) ≈ 30.
        let shares: Vec<f64> = text
            .match_indices("\"share_percent\":")
            .filter_map(|(i, k)| {
                let rest = text[i + k.len()..].trim_start().trim_start_matches('"');
                rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert!(
            shares.iter().any(|s| (s - 30.0).abs() <= 5.0),
            "status shares {shares:?}:\n{text}"
        );
        h.join().expect("run");
    });
}

#[test]
fn the_environment_cannot_lift_the_agents_limit() {
    let _serial = serial();
    let sim = Sim::new().build();
    let lfs = sim.limits_file().display().to_string();
    assert!(sim.cli(&["limits", "init", &lfs]).status.success());
    let o = sim.cli(&[
        "limits", "set", &lfs, "--device", "all", "--sm", "30", "--policy", "hard",
    ]);
    assert!(o.status.success(), "{o:?}");
    for env in [
        &[("GPU_CORE_UTILIZATION_POLICY", "DISABLE")][..],
        &[("CUDA_DEVICE_SM_LIMIT", "90"), ("CUQUOTA_POLICY", "burst")][..],
    ] {
        let r = run(&sim, Build::Dl, "a", env, "kernel", "dlsym", 1.0, 50_000, 0);
        assert!(r.share <= 35.0, "{env:?} lifted the agent's 30 %: {}", r.share);
    }
}

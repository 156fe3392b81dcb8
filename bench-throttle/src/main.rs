//! SM-limit benchmarks on the simulated GPU: accuracy of the achieved share for one container at L ∈ {10, 25,
//! 50, 75, 90} % with short (50 µs) and long (10 ms) kernels on simulated GPUs with 16, 132 and 188 SMs; two
//! containers at 30/70 and three at 20/30/50 running together; burst mode alone; a high-priority tenant's
//! burst latency next to a best-effort tenant (`priority`, see `priority.rs`); and the added cost per launch
//! (hook vs the simulator called directly, same run). Prints a markdown table.
//!
//! Ground truth: the simulator runs kernels one at a time on the device timeline with a duration of
//! waves × ns-per-wave; the program counts the kernels it launched and waits for all of them to finish, so its
//! share is (kernels × kernel time) / (wall time until the last one finished).
//!
//! Worst 1 s window: a monitor process (this binary, `--monitor`, run on the same simulated machine without the
//! preload) asks the simulator every 50 ms how many ns each container process occupied the device during the
//! last 50 ms bin (`cudasimDeviceBusyNs`, exact, read from the device timeline's kernel-interval ring — the
//! data NVML utilisation is computed from, without NVML's rounding to whole percent). Every 1 s window
//! starting on a 50 ms boundary from the common start to the end of the run (start-up burst included) is the
//! sum of 20 bins; the table shows the largest. The monitor's total is checked against the program's own count.
//!
//! Usage: `cargo run --release -p bench-throttle -- [--seconds S] [--quick] [--jobs J] [--only accuracy|multi|burst|priority|overhead]` (`--help`)
//! (the recorded table uses the default 10 s windows; `--quick` = 2 s windows and fewer cells). All of these run
//! on the simulator's serialised model. `--goals [--sched slice|serial] [--row TEXT] [--quick]`: instead, the
//! goals of issue 36 on the time-slicing model (`goals.rs`).
//! Build first: `cargo build --release -p cuquota -p cuquota-sim -p bench-throttle`; the bench runs the release
//! libraries (set `CUQUOTA_TEST_PROFILE=debug` to measure the debug ones).

mod goals;
mod priority;

use shim_tests::{include_dir, Sim};
use std::ffi::{c_char, c_void};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Monitor bin: the worst-window search slides by this much.
const BIN_NS: u64 = 50_000_000;
/// The sliding window.
const WINDOW_NS: u64 = 1_000_000_000;
/// The monitor reads a bin this long after it ended (a launch that read the clock just before the bin ended
/// may take its place on the timeline a moment later).
const LAG_NS: u64 = 20_000_000;
/// Programs are started this far ahead of their common start time.
const LEAD_NS: u64 = 500_000_000;

fn compile_prog(sim: &Sim) -> PathBuf {
    let out = shim_tests::target_dir().join("shim-tests-c/throttle_paths_bench");
    std::fs::create_dir_all(out.parent().expect("parent")).expect("mkdir");
    let src = shim_tests::workspace_root().join("shim-tests/c/throttle_paths.c");
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-Wall"])
        .arg(format!("-I{}", include_dir().display()))
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", sim.lib_dir().display()))
        .args(["-ldl"])
        .status()
        .expect("run cc");
    assert!(st.success(), "compile {}", src.display());
    out
}

fn mono_ns() -> u64 {
    let mut ts = libc_timespec();
    // SAFETY: valid out-pointer.
    unsafe { clock_gettime(1, &mut ts) };
    ts.0 as u64 * 1_000_000_000 + ts.1 as u64
}

#[repr(C)]
struct Ts(i64, i64);
fn libc_timespec() -> Ts {
    Ts(0, 0)
}
extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Ts) -> i32;
    fn dlopen(name: *const c_char, flags: i32) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

/// The simulator's `cudasimDeviceBusyNs(index, pid, from_ns, to_ns, *busy_ns) -> nvmlReturn_t`.
type BusyNsFn = unsafe extern "C" fn(u32, u32, u64, u64, *mut u64) -> u32;

/// `throttle-bench --monitor T0_NS PID[,PID…]` (run by the bench on a simulated machine, no preload): from
/// CLOCK_MONOTONIC `T0_NS` on, reads each pid's busy ns per `BIN_NS` bin from the simulator until its stdin
/// closes (the programs have finished) and a bin ends after that; prints `bins.<pid>=b0,b1,…`.
fn monitor(args: &[String]) {
    let t0: u64 = args[0].parse().expect("T0_NS");
    let pids: Vec<u32> = args[1].split(',').map(|p| p.parse().expect("pid")).collect();
    // SAFETY: dlopen/dlsym on NUL-terminated names; the symbol has the `BusyNsFn` signature (simulator export).
    let busy_ns: BusyNsFn = unsafe {
        let h = dlopen(c"libcuda.so.1".as_ptr(), 2 /* RTLD_NOW */);
        assert!(
            !h.is_null(),
            "monitor: cannot dlopen libcuda.so.1 (the simulator)"
        );
        let f = dlsym(h, c"cudasimDeviceBusyNs".as_ptr());
        assert!(!f.is_null(), "monitor: the simulator has no cudasimDeviceBusyNs");
        std::mem::transmute::<*mut c_void, BusyNsFn>(f)
    };
    let stop = Arc::new(AtomicU64::new(0));
    let stop2 = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop2.store(mono_ns(), Ordering::SeqCst);
    });
    let mut bins: Vec<Vec<u64>> = vec![Vec::new(); pids.len()];
    for k in 0.. {
        let (from, to) = (t0 + k * BIN_NS, t0 + (k + 1) * BIN_NS);
        let now = mono_ns();
        if to + LAG_NS > now {
            std::thread::sleep(Duration::from_nanos(to + LAG_NS - now));
        }
        for (pid, b) in pids.iter().zip(bins.iter_mut()) {
            let mut v = 0u64;
            // SAFETY: a valid out-pointer.
            let r = unsafe { busy_ns(0, *pid, from, to, &mut v) };
            assert_eq!(r, 0, "cudasimDeviceBusyNs failed: {r}");
            b.push(v);
        }
        let s = stop.load(Ordering::SeqCst);
        if s != 0 && to >= s {
            break;
        }
    }
    for (pid, b) in pids.iter().zip(&bins) {
        let list: Vec<String> = b.iter().map(|v| v.to_string()).collect();
        println!("bins.{pid}={}", list.join(","));
    }
}

/// What one program achieved: its own 10 s share, the worst 1 s window the monitor saw, and the monitor's total
/// busy time against the program's (ns).
struct Run {
    share: f64,
    worst_1s: f64,
    monitor_ns: u64,
    program_ns: u64,
}

/// Largest busy share (percent) of any `WINDOW_NS` window starting on a bin boundary (a run shorter than a
/// window counts over one window).
fn worst_window(bins: &[u64]) -> f64 {
    let w = (WINDOW_NS / BIN_NS) as usize;
    let best = if bins.len() <= w {
        bins.iter().sum()
    } else {
        bins.windows(w).map(|x| x.iter().sum::<u64>()).max().unwrap_or(0)
    };
    100.0 * best as f64 / WINDOW_NS as f64
}

/// Runs one program per `(container, env)` on `sim`, all starting together, with a monitor watching them.
fn run_group(
    sim: &Sim,
    prog: &Path,
    containers: &[(String, Vec<(&str, String)>)],
    secs: f64,
    kernel_ns: u64,
    blocks: u32,
) -> Vec<Run> {
    let start = mono_ns() + LEAD_NS;
    let timeout = Duration::from_secs_f64(secs * 3.0 + 60.0);
    let procs: Vec<_> = containers
        .iter()
        .map(|(name, env)| {
            let mut c = sim
                .cmd_path(prog.to_path_buf())
                .container(name)
                .timeout(timeout)
                .arg("kernel")
                .arg("dlsym")
                .arg(&format!("{secs}"))
                .arg(&kernel_ns.to_string())
                .arg(&blocks.to_string())
                .arg(&start.to_string());
            for (k, v) in env {
                c = c.env(k, v);
            }
            c.spawn()
        })
        .collect();
    let pids: Vec<String> = procs.iter().map(|p| p.pid().to_string()).collect();
    let mon = spawn_monitor(sim, start, &procs, timeout);
    let outs: Vec<_> = procs.into_iter().map(|p| p.finish()).collect();
    let mon = mon.finish();
    assert!(mon.status.success(), "{mon:?}");
    outs.iter()
        .zip(&pids)
        .map(|(out, pid)| {
            assert!(out.status.success(), "{out:?}");
            let bins: Vec<u64> = mon
                .val(&format!("bins.{pid}"))
                .split(',')
                .map(|v| v.parse().expect("bin"))
                .collect();
            Run {
                share: out.val("share").parse().expect("share"),
                worst_1s: worst_window(&bins),
                monitor_ns: bins.iter().sum(),
                program_ns: out.num("busy_ns"),
            }
        })
        .collect()
}

/// The largest relative difference between the monitor's and the programs' busy time, in percent.
fn max_deviation<'a>(runs: impl IntoIterator<Item = &'a Run>) -> f64 {
    runs.into_iter()
        .map(|r| 100.0 * (r.monitor_ns as f64 - r.program_ns as f64).abs() / r.program_ns.max(1) as f64)
        .fold(0.0, f64::max)
}

/// SM-limit accuracy, multi-container, burst, priority and per-launch overhead benchmarks on the simulated GPU
/// (prints a Markdown table).
#[derive(clap::Parser)]
#[command(name = "throttle-bench")]
struct Opts {
    /// Length of each measured window, in seconds (default 10, or 2 with --quick).
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// 2 s windows and fewer cells.
    #[arg(long)]
    quick: bool,
    /// One-container cells run at once.
    #[arg(long, value_name = "J", default_value_t = 3)]
    jobs: usize,
    /// Run one part only.
    #[arg(long, value_enum)]
    only: Option<Part>,
    /// Instead of the tables above: the goals of issue 36 item 3 (tenants that share the GPU), one table with
    /// each row's no-cuquota baseline, target band and PASS/FAIL (5 s runs, 2.5 s with --quick).
    #[arg(long)]
    goals: bool,
    /// With --goals: the simulator's scheduling model, `slice` (time-slicing, calibrated to an H200) or `serial`.
    #[arg(long, value_name = "MODEL", default_value = "slice", value_parser = ["slice", "serial"])]
    sched: String,
    /// With --goals: only the rows whose name contains this (e.g. `30 + 70`, `burst`, `priority`).
    #[arg(long, value_name = "TEXT")]
    row: Option<String>,
    /// Internal: the monitor process the bench starts (T0_NS, then PID[,PID...]).
    #[arg(long, num_args = 2, value_names = ["T0_NS", "PIDS"], hide = true)]
    monitor: Option<Vec<String>>,
}

/// The parts of the benchmark.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Accuracy,
    Multi,
    Burst,
    Priority,
    Overhead,
}

/// One run of the C program; returns its share in percent.
#[allow(clippy::too_many_arguments)]
fn run_one(
    sim: &Sim,
    prog: &Path,
    container: &str,
    env: &[(&str, String)],
    secs: f64,
    kernel_ns: u64,
    blocks: u32,
    start_at: u64,
) -> f64 {
    let mut c = sim
        .cmd_path(prog.to_path_buf())
        .container(container)
        .timeout(Duration::from_secs_f64(secs * 3.0 + 60.0))
        .arg("kernel")
        .arg("dlsym")
        .arg(&format!("{secs}"))
        .arg(&kernel_ns.to_string())
        .arg(&blocks.to_string())
        .arg(&start_at.to_string());
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.status.success(), "{out:?}");
    out.val("share").parse().expect("share")
}

fn parallel<T: Send>(jobs: usize, tasks: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let n = tasks.len();
    let queue = Mutex::new(tasks.into_iter().enumerate().collect::<Vec<_>>());
    let results = Mutex::new((0..n).map(|_| None).collect::<Vec<Option<T>>>());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let Some((i, t)) = queue.lock().expect("q").pop() else {
                    break;
                };
                let r = t();
                results.lock().expect("r")[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .expect("r")
        .into_iter()
        .map(|r| r.expect("ran"))
        .collect()
}

fn hard(l: u32) -> Vec<(&'static str, String)> {
    vec![
        ("CUDA_DEVICE_SM_LIMIT", l.to_string()),
        ("CUQUOTA_POLICY", "hard".into()),
    ]
}

fn main() {
    let o = <Opts as clap::Parser>::parse();
    if let Some(m) = &o.monitor {
        monitor(m);
        return;
    }
    // Measure the optimised libraries (the harness defaults to the debug profile).
    if std::env::var_os("CUQUOTA_TEST_PROFILE").is_none() {
        std::env::set_var("CUQUOTA_TEST_PROFILE", "release");
    }
    let want = |p: Part| o.only.is_none_or(|x| x == p);
    let secs = o.seconds.unwrap_or(if o.quick { 2.0 } else { 10.0 });
    let probe_sim = Sim::new().build();
    let prog = compile_prog(&probe_sim);
    let date = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let _ = date;
    let sh = |c: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(c)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    if o.goals {
        let secs = o.seconds.unwrap_or(if o.quick { 2.5 } else { 5.0 });
        println!("# cuquota SM-limit goals (simulator)\n");
        println!(
            "Date: {}. Machine: {} CPUs ({}), load average at start {}. Commit {}. Profile: {}.\n",
            sh("date -u '+%Y-%m-%d %H:%M UTC'"),
            sh("nproc"),
            sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
            sh("cut -d' ' -f1-3 /proc/loadavg"),
            sh(&format!(
                "git -C '{}' rev-parse --short HEAD",
                shim_tests::workspace_root().display()
            )),
            std::env::var("CUQUOTA_TEST_PROFILE").unwrap_or_default()
        );
        goals::bench(&o.sched, secs, o.row.as_deref());
        println!(
            "Load average at the end: {}.",
            sh("cut -d' ' -f1-3 /proc/loadavg")
        );
        return;
    }
    println!("# cuquota SM-limit benchmark (simulator), {secs} s windows\n");
    println!(
        "Date: {}. Machine: {} CPUs ({}), load average at start {}. Profile: {}.\n",
        sh("date -u '+%Y-%m-%d %H:%M UTC'"),
        sh("nproc"),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        sh("cut -d' ' -f1-3 /proc/loadavg"),
        std::env::var("CUQUOTA_TEST_PROFILE").unwrap_or_default()
    );

    if want(Part::Accuracy) {
        let sms_list: &[u32] = if o.quick { &[16, 188] } else { &[16, 132, 188] };
        let limits: &[u32] = &[10, 25, 50, 75, 90];
        println!(
            "## One container, hard limit: achieved share % over the run (target ±2) and worst 1 s window (target ≤ L + 2)\n"
        );
        print!("| SMs | kernel |");
        for l in limits {
            print!(" L={l} | worst 1 s |");
        }
        println!();
        print!("|---|---|");
        for _ in limits {
            print!("---|---|");
        }
        println!();
        let mut all = Vec::new();
        for &sms in sms_list {
            for &(kname, kns) in &[("50 µs", 50_000u64), ("10 ms", 10_000_000)] {
                let sims: Vec<Sim> = limits
                    .iter()
                    .map(|_| Sim::new().sms(&sms.to_string()).build())
                    .collect();
                let tasks: Vec<Box<dyn FnOnce() -> Run + Send + '_>> = limits
                    .iter()
                    .zip(sims.iter())
                    .map(|(&l, sim)| {
                        let prog = &prog;
                        Box::new(move || {
                            let c = [("a".to_string(), hard(l))];
                            run_group(sim, prog, &c, secs, kns, 256).remove(0)
                        }) as Box<dyn FnOnce() -> Run + Send>
                    })
                    .collect();
                let runs = parallel(o.jobs, tasks);
                print!("| {sms} | {kname} |");
                for (r, &l) in runs.iter().zip(limits) {
                    let ok = if (r.share - l as f64).abs() <= 2.0 {
                        ""
                    } else {
                        " ✗"
                    };
                    let ok1 = if r.worst_1s <= l as f64 + 2.0 { "" } else { " ✗" };
                    print!(" {:.2}{ok} | {:.2}{ok1} |", r.share, r.worst_1s);
                }
                println!();
                all.extend(runs);
            }
        }
        println!(
            "\nGround-truth check: the monitor's total busy time differs from the programs' own count by at most {:.3} %.\n",
            max_deviation(&all)
        );
    }

    if want(Part::Multi) {
        println!("## Several containers on one device (hard), achieved share % over the run (target ±3) and worst 1 s window (target ≤ L + 2)\n");
        println!("| SMs | kernel | limits | achieved | worst 1 s |");
        println!("|---|---|---|---|---|");
        let sms_list: &[u32] = if o.quick { &[132] } else { &[16, 132, 188] };
        let mut all = Vec::new();
        for &sms in sms_list {
            for &(kname, kns) in &[("50 µs", 50_000u64), ("10 ms", 10_000_000)] {
                for split in [&[30u32, 70][..], &[20, 30, 50][..]] {
                    let sim = Sim::new().sms(&sms.to_string()).build();
                    let c: Vec<(String, Vec<(&str, String)>)> = split
                        .iter()
                        .enumerate()
                        .map(|(i, &l)| (format!("c{i}"), hard(l)))
                        .collect();
                    let runs = run_group(&sim, &prog, &c, secs, kns, 256);
                    let lim: Vec<String> = split.iter().map(|l| l.to_string()).collect();
                    let got: Vec<String> = runs
                        .iter()
                        .zip(split)
                        .map(|(r, &l)| {
                            let ok = if (r.share - l as f64).abs() <= 3.0 {
                                ""
                            } else {
                                " ✗"
                            };
                            format!("{:.2}{ok}", r.share)
                        })
                        .collect();
                    let worst: Vec<String> = runs
                        .iter()
                        .zip(split)
                        .map(|(r, &l)| {
                            let ok = if r.worst_1s <= l as f64 + 2.0 { "" } else { " ✗" };
                            format!("{:.2}{ok}", r.worst_1s)
                        })
                        .collect();
                    println!(
                        "| {sms} | {kname} | {} | {} | {} |",
                        lim.join("/"),
                        got.join(" / "),
                        worst.join(" / ")
                    );
                    all.extend(runs);
                }
            }
        }
        println!(
            "\nGround-truth check: the monitor's total busy time differs from the programs' own count by at most {:.3} %.\n",
            max_deviation(&all)
        );
    }

    if want(Part::Burst) {
        println!("## Burst policy (work-conserving)\n");
        println!("| scenario | kernel | achieved |");
        println!("|---|---|---|");
        for &(kname, kns) in &[("50 µs", 50_000u64), ("10 ms", 10_000_000)] {
            let sim = Sim::new().build();
            let env = vec![
                ("CUDA_DEVICE_SM_LIMIT", "30".to_string()),
                ("CUQUOTA_POLICY", "burst".into()),
            ];
            let s = run_one(&sim, &prog, "a", &env, secs, kns, 256, 0);
            println!(
                "| L=30 burst, alone (target ≥ 95) | {kname} | {s:.2}{} |",
                if s >= 95.0 { "" } else { " ✗" }
            );
            let sim = Sim::new().build();
            let start = mono_ns() + 300_000_000;
            let tasks: Vec<Box<dyn FnOnce() -> f64 + Send + '_>> = vec![
                Box::new(|| run_one(&sim, &prog, "b", &env, secs, kns, 256, start)),
                Box::new(|| run_one(&sim, &prog, "h", &hard(70), secs, kns, 256, start)),
            ];
            let r = parallel(2, tasks);
            println!(
                "| L=30 burst + L=70 hard, both busy (target 30/70) | {kname} | {:.2} / {:.2} |",
                r[0], r[1]
            );
        }
        println!();
    }

    if want(Part::Priority) {
        priority::bench(secs);
    }

    if want(Part::Overhead) {
        println!("## Added cost per cuLaunchKernel (median of 100-launch batches, hook − simulator direct, same run)\n");
        println!("| configuration | hook ns | direct ns | added ns | target |");
        println!("|---|---|---|---|---|");
        let n = if o.quick { "200000" } else { "1000000" };
        for (name, env, target) in [
            ("no limit", vec![], "≤ 50"),
            (
                "limit 50 %, tokens available",
                vec![("CUDA_DEVICE_SM_LIMIT", "50".to_string())],
                "≤ 150",
            ),
        ] {
            let sim = Sim::new().build();
            let mut c = sim
                .cmd_path(prog.clone())
                .container("o")
                .arg("overhead")
                .arg("dlsym")
                .arg(n);
            for (k, v) in &env {
                c = c.env(k, v);
            }
            let out = c.timeout(Duration::from_secs(300)).run();
            assert!(out.status.success(), "{out:?}");
            println!(
                "| {name} | {} | {} | {} | {target} |",
                out.val("hook_ns"),
                out.val("direct_ns"),
                out.val("added_ns")
            );
        }
        println!();
    }
}

/// This binary as the monitor of `procs` (`--monitor START PIDS`), on the same simulated machine, no preload.
pub(crate) fn spawn_monitor(
    sim: &Sim,
    start: u64,
    procs: &[shim_tests::Proc],
    timeout: Duration,
) -> shim_tests::Proc {
    let pids: Vec<String> = procs.iter().map(|p| p.pid().to_string()).collect();
    sim.cmd_path(std::env::current_exe().expect("current_exe"))
        .no_preload()
        .timeout(timeout)
        .arg("--monitor")
        .arg(&start.to_string())
        .arg(&pids.join(","))
        .spawn()
}

//! SM-limit benchmarks on the simulated GPU: accuracy of the achieved share for one container at L ∈ {10, 25,
//! 50, 75, 90} % with short (50 µs) and long (10 ms) kernels on simulated GPUs with 16, 132 and 188 SMs; two
//! containers at 30/70 and three at 20/30/50 running together; burst mode alone; and the added cost per launch
//! (hook vs the simulator called directly, same run). Prints a markdown table.
//!
//! Ground truth: the simulator runs kernels one at a time on the device timeline with a duration of
//! waves × ns-per-wave; the program counts the kernels it launched and waits for all of them to finish, so its
//! share is (kernels × kernel time) / (wall time until the last one finished).
//!
//! Usage: `cargo run --release -p bench-throttle -- [--seconds S] [--quick] [--jobs J] [--only accuracy|multi|burst|overhead]`
//! (the recorded table uses the default 10 s windows; `--quick` = 2 s windows and fewer cells).
//! Build first: `cargo build --release -p cuquota -p cuquota-sim -p bench-throttle`; the bench runs the release
//! libraries (set `CUQUOTA_TEST_PROFILE=debug` to measure the debug ones).

use shim_tests::{include_dir, Sim};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

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
}

struct Opts {
    seconds: f64,
    quick: bool,
    jobs: usize,
    only: Option<String>,
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
    let mut o = Opts {
        seconds: 10.0,
        quick: false,
        jobs: 3,
        only: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--seconds" => {
                i += 1;
                o.seconds = args[i].parse().expect("--seconds N");
            }
            "--quick" => {
                o.quick = true;
                o.seconds = 2.0;
            }
            "--jobs" => {
                i += 1;
                o.jobs = args[i].parse().expect("--jobs N");
            }
            "--only" => {
                i += 1;
                o.only = Some(args[i].clone());
            }
            a => panic!("unknown argument {a}"),
        }
        i += 1;
    }
    // Measure the optimised libraries (the harness defaults to the debug profile).
    if std::env::var_os("CUQUOTA_TEST_PROFILE").is_none() {
        std::env::set_var("CUQUOTA_TEST_PROFILE", "release");
    }
    let want = |s: &str| o.only.as_deref().is_none_or(|x| x == s);
    let secs = o.seconds;
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
    println!("# cuquota SM-limit benchmark (simulator), {secs} s windows\n");
    println!(
        "Date: {}. Machine: {} CPUs ({}), load average at start {}. Profile: {}.\n",
        sh("date -u '+%Y-%m-%d %H:%M UTC'"),
        sh("nproc"),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        sh("cut -d' ' -f1-3 /proc/loadavg"),
        std::env::var("CUQUOTA_TEST_PROFILE").unwrap_or_default()
    );

    if want("accuracy") {
        let sms_list: &[u32] = if o.quick { &[16, 188] } else { &[16, 132, 188] };
        let limits: &[u32] = &[10, 25, 50, 75, 90];
        println!("## One container, hard limit: achieved share % (target ±2)\n");
        print!("| SMs | kernel |");
        for l in limits {
            print!(" L={l} |");
        }
        println!();
        print!("|---|---|");
        for _ in limits {
            print!("---|");
        }
        println!();
        for &sms in sms_list {
            for &(kname, kns) in &[("50 µs", 50_000u64), ("10 ms", 10_000_000)] {
                let sims: Vec<Sim> = limits
                    .iter()
                    .map(|_| Sim::new().sms(&sms.to_string()).build())
                    .collect();
                let tasks: Vec<Box<dyn FnOnce() -> f64 + Send + '_>> = limits
                    .iter()
                    .zip(sims.iter())
                    .map(|(&l, sim)| {
                        let prog = &prog;
                        Box::new(move || run_one(sim, prog, "a", &hard(l), secs, kns, 256, 0))
                            as Box<dyn FnOnce() -> f64 + Send>
                    })
                    .collect();
                let shares = parallel(o.jobs, tasks);
                print!("| {sms} | {kname} |");
                for (s, &l) in shares.iter().zip(limits) {
                    let ok = if (s - l as f64).abs() <= 2.0 { "" } else { " ✗" };
                    print!(" {s:.2}{ok} |");
                }
                println!();
            }
        }
        println!();
    }

    if want("multi") {
        println!("## Several containers on one device (hard), achieved share % (target ±3)\n");
        println!("| SMs | kernel | limits | achieved |");
        println!("|---|---|---|---|");
        let sms_list: &[u32] = if o.quick { &[132] } else { &[16, 132, 188] };
        for &sms in sms_list {
            for &(kname, kns) in &[("50 µs", 50_000u64), ("10 ms", 10_000_000)] {
                for split in [&[30u32, 70][..], &[20, 30, 50][..]] {
                    let sim = Sim::new().sms(&sms.to_string()).build();
                    let start = mono_ns() + 300_000_000;
                    let tasks: Vec<Box<dyn FnOnce() -> f64 + Send + '_>> = split
                        .iter()
                        .enumerate()
                        .map(|(i, &l)| {
                            let (sim, prog) = (&sim, &prog);
                            Box::new(move || {
                                run_one(sim, prog, &format!("c{i}"), &hard(l), secs, kns, 256, start)
                            }) as Box<dyn FnOnce() -> f64 + Send>
                        })
                        .collect();
                    let shares = parallel(split.len(), tasks);
                    let lim: Vec<String> = split.iter().map(|l| l.to_string()).collect();
                    let got: Vec<String> = shares
                        .iter()
                        .zip(split)
                        .map(|(s, &l)| {
                            format!("{s:.2}{}", if (s - l as f64).abs() <= 3.0 { "" } else { " ✗" })
                        })
                        .collect();
                    println!("| {sms} | {kname} | {} | {} |", lim.join("/"), got.join(" / "));
                }
            }
        }
        println!();
    }

    if want("burst") {
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

    if want("overhead") {
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

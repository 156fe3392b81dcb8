//! `cargo run --release -p cuquota-bench [-- --reps N --iters N]`: the added cost of libcuquota.so on a
//! cuMemAlloc_v2 + cuMemFree_v2 pair, on cuMemGetInfo_v2 and on cuLaunchKernel of an empty kernel, against the driver called directly, in the
//! same run, on 1 and 8 threads, with a memory cap set, on two drivers: the simulator, and a stub driver
//! (`bench/stub_driver.c`) whose own calls cost a few ns, so that the shim's cost is not lost in the
//! simulator's. Prints a table of medians; writes nothing.
//!
//! Needs the debug build of the workspace (`cargo build --workspace`) for libcuquota.so and libcudasim.so, or
//! `CUQUOTA_TEST_PROFILE=release` after `cargo build --release --workspace`.

use shim_tests::{alloc_bench_and_stub, Sim};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The added cost of libcuquota.so per call (alloc+free pair, cuMemGetInfo, cuLaunchKernel) on the simulator
/// and on a stub driver, against the driver called directly in the same run (prints a table of medians).
#[derive(clap::Parser)]
#[command(name = "cuquota-bench")]
struct Opts {
    /// Runs of each configuration (the median is printed).
    #[arg(long, value_name = "N", default_value_t = 7)]
    reps: u32,
    /// Operations per thread per run.
    #[arg(long, value_name = "N", default_value_t = 20000)]
    iters: u32,
}

fn main() {
    let Opts { reps, iters } = clap::Parser::parse();
    let (stub_dir, bin) = alloc_bench_and_stub();
    let stub_dir = stub_dir.display().to_string();
    let sim = Sim::new().memory("80g").build();
    println!("cuquota bench: {reps} repetitions × {iters} ops per thread, medians; cap CUDA_DEVICE_MEMORY_LIMIT=64g");
    println!(
        "{:<28} {:<9} {:>7} {:>14} {:>14} {:>12} {:>8} {:>14}",
        "operation", "driver", "threads", "driver ns/op", "shim ns/op", "added ns", "ratio", "shim wall ns"
    );
    let drivers = [("simulator", None), ("stub", Some(stub_dir.as_str()))];
    for (mode, label) in [
        ("pair", "cuMemAlloc+cuMemFree pair"),
        ("info", "cuMemGetInfo"),
        ("launch", "cuLaunchKernel (empty)"),
    ] {
        for (driver, dir) in drivers {
            for threads in [1u32, 8] {
                let (mut base, mut shim, mut wall) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..reps {
                    // interleave so drift hits both alike
                    for preload in [false, true] {
                        let mut cmd = sim.cmd_path(bin.clone()).mem_limit("64g");
                        if let Some(dir) = dir {
                            // The stub alone: no simulator, no NVML (the shim then estimates what it cannot measure).
                            cmd = cmd
                                .env("LD_LIBRARY_PATH", dir)
                                .env("CUQUOTA_LIBCUDA", &format!("{dir}/libcuda.so.1"))
                                .env("CUQUOTA_LIBNVML", &format!("{dir}/no-libnvidia-ml.so.1"));
                        }
                        if !preload {
                            cmd = cmd.no_preload();
                        }
                        let out = cmd
                            .arg(mode)
                            .arg(&threads.to_string())
                            .arg(&iters.to_string())
                            .timeout(std::time::Duration::from_secs(120))
                            .run();
                        assert!(
                            out.success() && out.get("failed") == Some("0"),
                            "bench run failed:{out:?}"
                        );
                        let cpu: f64 = out.val("cpu_ns_per_op").parse().expect("number");
                        if preload {
                            shim.push(cpu);
                            wall.push(out.val("wall_ns_per_op").parse().expect("number"));
                        } else {
                            base.push(cpu);
                        }
                    }
                }
                let (b, s) = (median(base), median(shim));
                println!(
                    "{:<28} {:<9} {:>7} {:>14.0} {:>14.0} {:>12.0} {:>8.2} {:>14.0}",
                    label,
                    driver,
                    threads,
                    b,
                    s,
                    s - b,
                    s / b,
                    median(wall)
                );
            }
        }
    }
}

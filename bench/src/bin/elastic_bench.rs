//! `cargo run --release -p cuquota-bench --bin elastic-bench [-- --sizes 64,256 --cycles 5 --gbps 4:8]`: the
//! cost of elastic memory's mechanism done by hand (`bench/evict_restore.c`: evict = copy to a host VMM
//! allocation, unmap, release, map the host copy at the same address; restore = create, copy back, remap, set
//! access) on the simulator with copy engines of the given bandwidths, as ratios against the modelled
//! bandwidth: issue 39 item 5's goal is restore >= 0.80 of host-to-device and evict >= 0.80 of device-to-host,
//! mapping cost included (the "wall" columns). "copy" columns: the copy alone, from events (the timeline);
//! "plain": a plain copy of the same size to or from cuMemAllocHost memory, wall clock, for the host's own cost.
//! Host memory "fresh": a host allocation created per eviction and released after the restore; "pool": one kept
//! (a pinned-memory budget). Then the unified-memory baseline (`evict_restore managed`, `CUDASIM_MANAGED=migrate`):
//! 8 tenants' managed memory in one process, the sum 3.2 times the device, woken round-robin so that every
//! wake-up pages its tenant's memory back in: the wake-up's time at the model over the time taken.
//! Prints tables; writes nothing. No libcuquota.so is loaded.
//!
//! Needs `libcudasim.so` (`cargo build -p cuquota-sim`, or `--release` with `CUQUOTA_TEST_PROFILE=release`).

use shim_tests::{compile_c, workspace_root, Sim};
use std::time::Duration;

/// Elastic memory's evict/restore sequence on the simulator, as ratios against the modelled copy bandwidth.
#[derive(clap::Parser)]
#[command(name = "elastic-bench")]
struct Opts {
    /// Range sizes, MiB.
    #[arg(long, value_delimiter = ',', default_values_t = [64u64, 256])]
    sizes: Vec<u64>,
    /// Evict/restore cycles per size (medians are printed).
    #[arg(long, default_value_t = 5)]
    cycles: u32,
    /// Modelled engine bandwidths, GB/s, `H2D:D2H`, one or more (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = ["0.25:0.5".to_string(), "25:25".to_string()])]
    gbps: Vec<String>,
}

fn main() {
    let opts: Opts = clap::Parser::parse();
    let root = workspace_root();
    let bin = compile_c(
        "evict_restore",
        &root.join("bench/evict_restore.c"),
        &[&root.join("bench/elastic_common.h")],
        &["-lcuda", "-ldl"],
    );
    println!(
        "elastic-bench: evict/restore by hand on the simulator, {} cycles per row, medians; ratio = time at the \
         modelled bandwidth / time taken",
        opts.cycles
    );
    println!(
        "| size | model H2D / D2H GB/s | host memory | evict, wall | evict, copy | restore, wall | restore, copy | plain D2H / H2D, wall | evict steps ms | restore steps ms |"
    );
    println!("| ---: | --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |");
    for pair in &opts.gbps {
        let (h2d, d2h) = pair
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.parse::<f64>().ok()?)))
            .unwrap_or_else(|| panic!("--gbps {pair}: expected H2D:D2H in GB/s, e.g. 4:8"));
        for (&mib, pool) in opts.sizes.iter().flat_map(|m| [(m, false), (m, true)]) {
            let sim = Sim::new()
                .memory(&format!("{}m", 2 * mib + 1024))
                .env("CUDASIM_H2D_GBPS", &h2d.to_string())
                .env("CUDASIM_D2H_GBPS", &d2h.to_string())
                .build();
            let out = sim
                .cmd_path(bin.clone())
                .no_preload()
                .arg(&mib.to_string())
                .arg(&opts.cycles.to_string())
                .args(if pool { "pool" } else { "" })
                .timeout(Duration::from_secs(600))
                .run();
            assert!(
                out.success() && out.get("intact") == Some("1"),
                "evict_restore failed:{out:?}"
            );
            let bytes = out.num("bytes") as f64;
            // ns at the model: bytes / (GB/s) = ns
            let (at_h2d, at_d2h) = (bytes / h2d, bytes / d2h);
            let r = |model: f64, key: &str| model / out.num(key) as f64;
            let steps = |key: &str| {
                out.val(key)
                    .split(',')
                    .map(|v| format!("{:.1}", v.parse::<f64>().unwrap_or(f64::NAN) / 1e6))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            println!(
                "| {mib} MiB | {h2d} / {d2h} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} / {:.3} | {} | {} |",
                if pool { "pool" } else { "fresh" },
                r(at_d2h, "evict_ns"),
                r(at_d2h, "evict_copy_ns"),
                r(at_h2d, "restore_ns"),
                r(at_h2d, "restore_copy_ns"),
                r(at_d2h, "plain_d2h_wall_ns"),
                r(at_h2d, "plain_h2d_wall_ns"),
                steps("evict_steps_ns"),
                steps("restore_steps_ns"),
            );
        }
    }
    println!(
        "(steps: create / map + access / copy / unmap + release / remap + access; every byte compared after the \
         first and last restore)"
    );
    println!();
    println!("| unified memory: 8 tenants of | device | model H2D GB/s | wake-ups | wake-up ms | ratio | failures | intact |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for pair in &opts.gbps {
        let h2d: f64 = pair
            .split(':')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("--gbps H2D:D2H");
        for &mib in &opts.sizes {
            let device = mib * 8 * 10 / 32; // the sum of the tenants is 3.2 devices
            let sim = Sim::new()
                .memory(&format!("{device}m"))
                .env("CUDASIM_MANAGED", "migrate")
                .env("CUDASIM_H2D_GBPS", &h2d.to_string())
                .build();
            let out = sim
                .cmd_path(bin.clone())
                .no_preload()
                .args(&format!("managed {mib} 8 16"))
                .timeout(Duration::from_secs(600))
                .run();
            assert!(out.success(), "evict_restore managed failed:{out:?}");
            let wake = out.num("wake_ns") as f64;
            println!(
                "| {mib} MiB | {device} MiB | {h2d} | {} | {:.1} | {:.3} | {} | {} |",
                out.val("wakeups"),
                wake / 1e6,
                out.num("wake_bytes") as f64 / h2d / wake,
                out.val("failures"),
                if out.val("intact") == "1" { "yes" } else { "**no**" },
            );
        }
    }
    println!(
        "(a wake-up: a kernel adding 1 to every byte of one tenant, timed with events; ratio = its bytes at the modelled \
         H2D bandwidth over that time)"
    );
}

//! `cuquota status`: per device, the limit processes report, what the container uses, each live process, and
//! the GPU share achieved over a short sampling interval (two readings of the cumulative busy counters).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuquota_core::config::DEFAULT_USAGE_PATH;
use cuquota_core::region::layout::format_uuid;
use cuquota_core::region::{DeviceInfo, ProcessInfo, SlotState, UsageRegion};
use cuquota_core::units::format_size;

use crate::args::Args;
use crate::{json, CliError};

/// `--usage`, else the file the shim would use: `CUQUOTA_USAGE_FILE` / `CUDA_DEVICE_MEMORY_SHARED_CACHE` (an
/// empty one counts as unset; two different ones are an error, as in the shim), else the default.
fn usage_path(arg: Option<String>) -> Result<PathBuf, CliError> {
    if let Some(p) = arg {
        return Ok(PathBuf::from(p));
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    match (var("CUQUOTA_USAGE_FILE"), var("CUDA_DEVICE_MEMORY_SHARED_CACHE")) {
        (Some(a), Some(b)) if a != b => Err(CliError(format!(
            "CUQUOTA_USAGE_FILE={a:?} and CUDA_DEVICE_MEMORY_SHARED_CACHE={b:?} disagree: pass --usage"
        ))),
        (Some(p), _) | (None, Some(p)) => Ok(PathBuf::from(p)),
        (None, None) => Ok(PathBuf::from(DEFAULT_USAGE_PATH)),
    }
}

/// Share of `interval` that a cumulative ns counter advanced by, in percent.
fn share(before: u64, after: u64, interval: Duration) -> Option<f64> {
    let ns = interval.as_nanos() as f64;
    (ns > 0.0).then(|| after.saturating_sub(before) as f64 / ns * 100.0)
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}%"))
}

/// `status [--usage <file>] [--interval MS] [--json]`
pub fn run(mut a: Args) -> Result<(), CliError> {
    let as_json = a.flag("json");
    let path = usage_path(a.value("usage")?)?;
    let interval_ms = match a.value("interval")? {
        None => 500,
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| CliError(format!("--interval {v:?}: expected milliseconds")))?,
    };
    a.finish()?;

    let region = UsageRegion::open_existing(&path)?;
    let reclaimed = region.reclaim_dead();
    let (dev0, procs0, t0) = (region.devices(), region.processes(), Instant::now());
    if interval_ms > 0 {
        std::thread::sleep(Duration::from_millis(interval_ms));
    }
    let (devs, procs, elapsed) = (region.devices(), region.processes(), t0.elapsed());
    let sampled = interval_ms > 0;

    let dev_share = |d: &DeviceInfo| {
        let before = dev0.iter().find(|x| x.id == d.id).map(|x| x.busy_ns)?;
        sampled.then(|| share(before, d.busy_ns, elapsed)).flatten()
    };
    let proc_share = |p: &ProcessInfo, dev: usize| {
        let before = procs0
            .iter()
            .find(|x| x.slot == p.slot && x.pid == p.pid)
            .map(|x| x.gpu_ns[dev])?;
        sampled.then(|| share(before, p.gpu_ns[dev], elapsed)).flatten()
    };
    let live: Vec<&ProcessInfo> = procs.iter().filter(|p| p.state == SlotState::Live).collect();

    if as_json {
        let devices: Vec<String> = devs
            .iter()
            .map(|d| {
                let i = d.id.index();
                let ps: Vec<String> = live
                    .iter()
                    .map(|p| {
                        json::object(&[
                            ("pid", p.pid.to_string()),
                            ("host_pid", json::opt((p.host_pid != 0).then_some(p.host_pid))),
                            ("used", p.mem_used[i].to_string()),
                            ("gpu_ns", p.gpu_ns[i].to_string()),
                            (
                                "share_percent",
                                json::opt(proc_share(p, i).map(|s| format!("{s:.2}"))),
                            ),
                        ])
                    })
                    .collect();
                json::object(&[
                    ("entry", i.to_string()),
                    ("uuid", json::string(&format_uuid(&d.uuid))),
                    ("memory_limit", json::opt(d.limits.memory)),
                    ("sm_limit", json::opt(d.limits.sm_share())),
                    ("policy", json::string(d.limits.kind.as_str())),
                    (
                        "priority",
                        d.limits
                            .priority
                            .map_or_else(|| "null".into(), |p| json::string(p.as_str())),
                    ),
                    ("used", d.used.to_string()),
                    ("busy_ns", d.busy_ns.to_string()),
                    (
                        "share_percent",
                        json::opt(dev_share(d).map(|s| format!("{s:.2}"))),
                    ),
                    ("processes", json::array(&ps)),
                ])
            })
            .collect();
        println!(
            "{}",
            json::object(&[
                ("usage_file", json::string(&path.display().to_string())),
                ("reclaimed", reclaimed.to_string()),
                ("live_processes", live.len().to_string()),
                ("interval_ms", interval_ms.to_string()),
                ("devices", json::array(&devices)),
            ])
        );
        return Ok(());
    }

    println!(
        "{}: {} device(s), {} live process(es), {} dead slot(s) reclaimed{}",
        path.display(),
        devs.len(),
        live.len(),
        reclaimed,
        if sampled {
            format!(", share over {} ms", elapsed.as_millis())
        } else {
            String::new()
        }
    );
    if devs.is_empty() {
        println!("(no device used yet)");
        return Ok(());
    }
    let mut rows = Vec::new();
    for d in &devs {
        let i = d.id.index();
        rows.push([
            format!("{i}"),
            format_uuid(&d.uuid),
            d.limits.memory.map_or_else(|| "-".into(), format_size),
            format_size(d.used),
            d.limits
                .sm_share()
                .map_or_else(|| "-".into(), |s| format!("{s}% {}", d.limits.kind.as_str())),
            pct(dev_share(d)),
        ]);
        for p in live.iter().filter(|p| p.mem_used[i] != 0 || p.gpu_ns[i] != 0) {
            let host = if p.host_pid != 0 {
                format!(" (host {})", p.host_pid)
            } else {
                String::new()
            };
            rows.push([
                String::new(),
                format!("  pid {}{host}", p.pid),
                String::new(),
                format_size(p.mem_used[i]),
                String::new(),
                pct(proc_share(p, i)),
            ]);
        }
    }
    print_rows(
        &[
            "ENTRY",
            "DEVICE / PROCESS",
            "MEM LIMIT",
            "USED",
            "SM LIMIT",
            "GPU SHARE",
        ],
        &rows,
    );
    Ok(())
}

/// Prints a left-aligned table with columns sized to their widest cell.
pub fn print_rows<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .zip(widths.iter())
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_is_rate_over_interval() {
        assert_eq!(share(0, 250_000_000, Duration::from_millis(500)), Some(50.0));
        assert_eq!(
            share(10, 5, Duration::from_millis(500)),
            Some(0.0),
            "counter reset never goes negative"
        );
        assert_eq!(share(0, 1, Duration::ZERO), None);
    }
}

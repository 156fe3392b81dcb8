//! `cuquota status`: per device, the limits the container's processes report, what the container uses, each
//! live process, and the GPU share achieved over a short sampling interval (two readings of the cumulative
//! busy counters). Read from the container's usage file (the shim's own accounting).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use cuquota_core::config::DEFAULT_USAGE_PATH;
use cuquota_core::region::layout::format_uuid;
use cuquota_core::region::{DeviceInfo, LimitsReader, ProcessInfo, SlotState, UsageRegion};
use cuquota_core::Policy;
use serde::Serialize;

use crate::output::{self, parse_duration_arg, round2};
use crate::{CliError, CmdResult};

/// Schema of `status --json` (docs/schemas/status.v1.json).
pub(crate) const SCHEMA: &str = "cuquota.status/v1";

/// `cuquota status`.
#[derive(Args)]
pub(crate) struct StatusArgs {
    /// The container's usage file [default: $CUQUOTA_USAGE_FILE, $CUDA_DEVICE_MEMORY_SHARED_CACHE, then
    /// /tmp/cuquota.usage]
    #[arg(long, value_name = "FILE")]
    usage: Option<PathBuf>,
    /// The agent's limits file, for the memory request [default: $CUQUOTA_LIMITS_FILE, else
    /// /etc/cuquota/limits when it exists]
    #[arg(long, value_name = "FILE")]
    limits: Option<PathBuf>,
    /// How long to sample the achieved GPU share (0 = do not sample)
    #[arg(long, default_value = "500ms", value_parser = parse_duration_arg)]
    interval: Duration,
    /// JSON on stdout (schema cuquota.status/v1)
    #[arg(long)]
    json: bool,
}

/// `--usage`, else the file the shim would use: `CUQUOTA_USAGE_FILE`, else the one beside HAMi's file when
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is set (`X.cache` → `X.cuquota-usage`, docs/hami.md; an empty variable
/// counts as unset), else the default.
pub(crate) fn usage_path(arg: Option<PathBuf>) -> Result<PathBuf, CliError> {
    if let Some(p) = arg {
        return Ok(p);
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    Ok(
        match (var("CUQUOTA_USAGE_FILE"), var("CUDA_DEVICE_MEMORY_SHARED_CACHE")) {
            (Some(p), _) => PathBuf::from(p),
            (None, Some(h)) => cuquota_core::config::usage_path_beside(std::path::Path::new(&h)),
            (None, None) => PathBuf::from(DEFAULT_USAGE_PATH),
        },
    )
}

/// `--limits`, else `CUQUOTA_LIMITS_FILE`, else the agent's default file when it exists, else none. A file
/// found by default that cannot be read is left out with a warning (the request is then not shown); one named
/// with `--limits` is the command's error.
pub(crate) fn limits_path(arg: Option<PathBuf>) -> Option<PathBuf> {
    if arg.is_some() {
        return arg;
    }
    let p = std::env::var_os("CUQUOTA_LIMITS_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            let p = Path::new(cuquota_core::config::DEFAULT_LIMITS_PATH);
            p.exists().then(|| p.to_path_buf())
        })?;
    match LimitsReader::open(&p) {
        Ok(_) => Some(p),
        Err(e) => {
            eprintln!(
                "cuquota: warning: limits file {}: {e}: requests not shown",
                p.display()
            );
            None
        }
    }
}

/// `status --json`.
#[derive(Serialize)]
pub(crate) struct StatusReport {
    schema: &'static str,
    usage_file: String,
    reclaimed_slots: usize,
    live_processes: usize,
    /// How long the share was sampled (0 = not sampled).
    interval_ms: u64,
    /// The devices the container has used.
    pub devices: Vec<StatusDevice>,
}

/// One device the container has used.
#[derive(Serialize)]
pub(crate) struct StatusDevice {
    /// The device's entry in the usage file (order of first use; HAMi's `vdevice_index`).
    pub entry: u32,
    /// NVML index, when NVML is available to map the UUID.
    pub index: Option<u32>,
    /// `GPU-…`.
    pub uuid: String,
    /// The effective cap the container's processes last reported.
    pub memory_limit_bytes: Option<u64>,
    /// The guaranteed memory: the limits file's request for the device (its UUID entry, else `all`), never
    /// above the cap; `None` = the cap (not elastic) or no limits file.
    pub memory_request_bytes: Option<u64>,
    /// The SM limit they last reported.
    pub sm_limit_percent: Option<u32>,
    /// How that SM limit is enforced: `default`, `hard`, `burst` or `disabled`.
    pub policy: &'static str,
    /// `high`, `low`, or none.
    pub priority: Option<&'static str>,
    /// Charged to the container (allocations plus context and module overhead).
    pub memory_used_bytes: u64,
    /// GPU time the SM limiter has accounted, cumulative (counted only while an SM limit applies).
    pub gpu_busy_ns: u64,
    /// Share of the device achieved over the interval, percent.
    pub share_percent: Option<f64>,
    /// Time launches waited for the SM limit, cumulative.
    pub throttled_ns: u64,
    /// Allocations refused at the cap, cumulative.
    pub allocation_refusals: u64,
    /// Live processes with memory or GPU time on this device.
    pub processes: Vec<StatusProcess>,
}

/// One process on one device.
#[derive(Serialize)]
pub(crate) struct StatusProcess {
    /// Pid in the container's pid namespace.
    pub pid: u32,
    /// Pid as NVML (the host) knows it, when learned.
    pub host_pid: Option<u32>,
    /// Bytes charged on this device.
    pub memory_used_bytes: u64,
    /// GPU time accounted on this device.
    pub gpu_busy_ns: u64,
    /// Share of the device over the interval, percent.
    pub share_percent: Option<f64>,
}

/// Share of `interval` that a cumulative ns counter advanced by, in percent.
fn share(before: u64, after: u64, interval: Duration) -> Option<f64> {
    let ns = interval.as_nanos() as f64;
    (ns > 0.0).then(|| round2(after.saturating_sub(before) as f64 / ns * 100.0))
}

/// NVML index of each UUID, when NVML loads (best effort: status works without it). Asked once per process
/// (`cuquota metrics` samples every interval; devices do not renumber while it runs).
fn nvml_indexes() -> &'static [(String, u32)] {
    static INDEXES: std::sync::OnceLock<Vec<(String, u32)>> = std::sync::OnceLock::new();
    INDEXES.get_or_init(|| match crate::nvml::Nvml::load().and_then(|n| n.gpus()) {
        Ok(g) => g.into_iter().map(|g| (g.uuid, g.index)).collect(),
        Err(e) => {
            cuquota_core::log!(
                cuquota_core::log::Level::Debug,
                "status: no NVML ({e}): device indexes unknown"
            );
            Vec::new()
        }
    })
}

impl StatusReport {
    /// Samples the usage file for `interval`; the requests from the limits file `limits`, if any.
    pub(crate) fn sample(
        path: PathBuf,
        limits: Option<&Path>,
        interval: Duration,
    ) -> Result<StatusReport, CliError> {
        let region = UsageRegion::open_existing(&path)?;
        let limits = match limits {
            Some(l) => Some(
                LimitsReader::open(l)
                    .map_err(|e| CliError::new(format!("limits file {}: {e}", l.display())))?
                    .snapshot()
                    .table,
            ),
            None => None,
        };
        let request = |d: &DeviceInfo| {
            let r = limits.as_ref()?.for_device(Some(&d.uuid), None).memory_request?;
            Policy {
                memory: d.limits.memory,
                memory_request: Some(r),
                ..Policy::NONE
            }
            .request_in_force()
            .or(Some(r))
        };
        let reclaimed = region.reclaim_dead();
        let (dev0, procs0, t0) = (region.devices(), region.processes(), Instant::now());
        if !interval.is_zero() {
            std::thread::sleep(interval);
        }
        let (devs, procs, elapsed) = (region.devices(), region.processes(), t0.elapsed());
        let sampled = !interval.is_zero();
        let indexes: &[(String, u32)] = if devs.is_empty() { &[] } else { nvml_indexes() };

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
        let devices = devs
            .iter()
            .map(|d| {
                let i = d.id.index();
                let uuid = format_uuid(&d.uuid);
                StatusDevice {
                    entry: i as u32,
                    index: indexes
                        .iter()
                        .find(|(u, _)| u.eq_ignore_ascii_case(&uuid))
                        .map(|(_, x)| *x),
                    memory_limit_bytes: d.limits.memory,
                    memory_request_bytes: request(d),
                    sm_limit_percent: d.limits.sm_share(),
                    policy: d.limits.kind.as_str(),
                    priority: d.limits.priority.map(|p| p.as_str()),
                    memory_used_bytes: d.used,
                    gpu_busy_ns: d.busy_ns,
                    share_percent: dev_share(d),
                    throttled_ns: d.throttled_ns,
                    allocation_refusals: d.refusals,
                    processes: live
                        .iter()
                        .filter(|p| p.mem_used[i] != 0 || p.gpu_ns[i] != 0)
                        .map(|p| StatusProcess {
                            pid: p.pid,
                            host_pid: (p.host_pid != 0).then_some(p.host_pid),
                            memory_used_bytes: p.mem_used[i],
                            gpu_busy_ns: p.gpu_ns[i],
                            share_percent: proc_share(p, i),
                        })
                        .collect(),
                    uuid,
                }
            })
            .collect();
        Ok(StatusReport {
            schema: SCHEMA,
            usage_file: path.display().to_string(),
            reclaimed_slots: reclaimed,
            live_processes: live.len(),
            interval_ms: if sampled { elapsed.as_millis() as u64 } else { 0 },
            devices,
        })
    }

    fn print_table(&self) {
        println!(
            "{}: {} device(s), {} live process(es), {} dead slot(s) reclaimed{}",
            self.usage_file,
            self.devices.len(),
            self.live_processes,
            self.reclaimed_slots,
            if self.interval_ms > 0 {
                format!(", share over {} ms", self.interval_ms)
            } else {
                String::new()
            }
        );
        if self.devices.is_empty() {
            println!("(no device used yet)");
            return;
        }
        let mut rows = Vec::new();
        for d in &self.devices {
            rows.push([
                d.entry.to_string(),
                d.index.map_or_else(|| "-".into(), |i| i.to_string()),
                d.uuid.clone(),
                output::size_or_dash(d.memory_limit_bytes),
                output::size_or_dash(d.memory_request_bytes.or(d.memory_limit_bytes)),
                output::size_or_dash(Some(d.memory_used_bytes)),
                output::pct_or_dash(d.sm_limit_percent),
                output::share_or_dash(d.share_percent),
            ]);
            for p in &d.processes {
                let host = p.host_pid.map_or_else(String::new, |h| format!(" (host {h})"));
                rows.push([
                    String::new(),
                    String::new(),
                    format!("  pid {}{host}", p.pid),
                    String::new(),
                    String::new(),
                    output::size_or_dash(Some(p.memory_used_bytes)),
                    String::new(),
                    output::share_or_dash(p.share_percent),
                ]);
            }
        }
        output::print_table(
            &[
                "ENTRY",
                "INDEX",
                "DEVICE / PROCESS",
                "MEM LIMIT",
                "REQUEST",
                "USED",
                "SM LIMIT",
                "GPU SHARE",
            ],
            &rows,
        );
    }
}

/// `cuquota status`.
pub(crate) fn run(a: StatusArgs) -> CmdResult {
    let limits = limits_path(a.limits);
    let report = StatusReport::sample(usage_path(a.usage)?, limits.as_deref(), a.interval)?;
    if a.json {
        output::print_json(&report)?;
    } else {
        report.print_table();
    }
    Ok(0)
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

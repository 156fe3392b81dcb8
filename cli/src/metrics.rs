//! `cuquota metrics`: one container's usage file as Prometheus metrics, with the agent's series and endpoint
//! (`cuquota_agent::metrics`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use cuquota_agent::metrics::*;
use cuquota_agent::output::parse_duration_arg;

use crate::status::StatusReport;
use crate::{CliError, CmdResult};

/// `cuquota metrics`.
#[derive(Args)]
pub(crate) struct MetricsArgs {
    #[command(flatten)]
    expose: Exposure,
    /// The container's usage file [default: $CUQUOTA_USAGE_FILE, $CUDA_DEVICE_MEMORY_SHARED_CACHE, then
    /// /tmp/cuquota.usage]
    #[arg(long, value_name = "FILE")]
    usage: Option<PathBuf>,
    /// The agent's limits file, for the memory request [default: $CUQUOTA_LIMITS_FILE, else
    /// /etc/cuquota/limits when it exists]
    #[arg(long, value_name = "FILE")]
    limits: Option<PathBuf>,
    /// Sampling interval (the share is measured over it)
    #[arg(long, default_value = "1s", value_parser = parse_duration_arg)]
    interval: Duration,
    /// Print one sample's metrics on stdout and exit
    #[arg(long)]
    once: bool,
    /// The `name` label [default: the usage file's name]
    #[arg(long)]
    name: Option<String>,
    /// The `namespace` label
    #[arg(long, default_value = "")]
    namespace: String,
    /// The `pod` label
    #[arg(long, default_value = "")]
    pod: String,
    /// The `container` label
    #[arg(long, default_value = "")]
    container: String,
}

/// Turns successive `status` reports of one usage file into metric samples (it remembers when each device's
/// GPU time last grew, for the last-kernel age).
pub(crate) struct UsageSampler {
    base: DeviceLabels,
    last_active: Vec<(String, Instant)>,
}

impl UsageSampler {
    /// A sampler labelling its series with `base` (vdevice_index and device_uuid filled per device).
    pub(crate) fn new(base: DeviceLabels) -> UsageSampler {
        UsageSampler {
            base,
            last_active: Vec::new(),
        }
    }

    /// The samples of one report.
    pub(crate) fn samples(&mut self, r: &StatusReport) -> Vec<DeviceSample> {
        let now = Instant::now();
        r.devices
            .iter()
            .map(|d| {
                if d.share_percent.is_some_and(|s| s > 0.0) {
                    self.last_active.retain(|(u, _)| *u != d.uuid);
                    self.last_active.push((d.uuid.clone(), now));
                }
                let age = self
                    .last_active
                    .iter()
                    .find(|(u, _)| *u == d.uuid)
                    .map(|(_, t)| now.duration_since(*t).as_secs_f64());
                DeviceSample {
                    labels: DeviceLabels {
                        vdevice_index: d.entry.to_string(),
                        device_uuid: d.uuid.clone(),
                        ..self.base.clone()
                    },
                    memory_used_bytes: d.memory_used_bytes,
                    memory_limit_bytes: d.memory_limit_bytes,
                    memory_request_bytes: d.memory_request_bytes,
                    // The usage file alone cannot tell resident from evicted: the agent's NVML can.
                    memory_resident_bytes: d.memory_used_bytes,
                    memory_evicted_bytes: 0,
                    memory_waiting_bytes: 0,
                    sm_limit_percent: d.sm_limit_percent,
                    utilization_percent: d.share_percent,
                    last_kernel_age_seconds: age,
                    gpu_seconds_total: Some(d.gpu_busy_ns as f64 / 1e9),
                    throttled_seconds_total: Some(d.throttled_ns as f64 / 1e9),
                    allocation_refusals_total: Some(d.allocation_refusals),
                    processes: d.processes.len() as u64,
                }
            })
            .collect()
    }
}

/// `cuquota metrics`: samples the usage file every interval and serves the latest sample.
pub(crate) fn run(a: MetricsArgs) -> CmdResult {
    let path = crate::status::usage_path(a.usage)?;
    let limits = crate::status::limits_path(a.limits);
    let name = a.name.unwrap_or_else(|| {
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    });
    let mut sampler = UsageSampler::new(DeviceLabels {
        namespace: a.namespace,
        pod: a.pod,
        container: a.container,
        name,
        ..Default::default()
    });
    if a.expose.listen.is_none() && !a.once {
        return Err(CliError::new("metrics: give --listen ADDR, or --once"));
    }
    let published = Published::default();
    if let Some(bound) = serve(&a.expose, published.clone())? {
        eprintln!(
            "cuquota metrics: serving http://{bound}/metrics from {}",
            path.display()
        );
    }
    loop {
        let report = StatusReport::sample(path.clone(), limits.as_deref(), a.interval)?;
        let snap = Snapshot {
            devices: sampler.samples(&report),
            ..Default::default()
        };
        let text = render(&snap);
        if a.once {
            print!("{text}");
            return Ok(0);
        }
        published.set(text);
    }
}

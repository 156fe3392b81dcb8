//! `cuquota priority …`: create and show a container's priority file (one per container with a priority, in
//! the node's priority directory), through which best-effort tenants yield to high-priority tenants of other
//! containers on the same GPU (docs/priority.md).

use std::path::PathBuf;

use clap::Subcommand;
use cuquota_core::region::layout::format_uuid;
use cuquota_core::region::{PriorityDeviceInfo, PriorityRegion};
use serde::Serialize;

use crate::output;
use crate::CmdResult;

/// Schema of `priority show --json` (docs/schemas/priority.v1.json).
pub(crate) const SCHEMA: &str = "cuquota.priority/v1";

#[derive(Subcommand)]
pub(crate) enum PriorityCommand {
    /// Create a container's priority file (mode 0666), or check an existing one: DIR/NAME.high for a
    /// high-priority container, DIR/NAME.low for the others (rename to change it live). Mount DIR read-only
    /// into every container with a priority at /etc/cuquota/priority.d, and the container's own file
    /// read-write at /etc/cuquota/priority
    Init {
        /// The container's priority file in the node's priority directory
        file: PathBuf,
    },
    /// Per GPU: when a high-priority tenant last launched, its queue, the best-effort token, waits, refusals
    Show {
        /// A container's priority file
        file: PathBuf,
        /// JSON on stdout (schema cuquota.priority/v1)
        #[arg(long)]
        json: bool,
    },
}

/// `priority show --json`.
#[derive(Serialize)]
struct PriorityReport {
    schema: &'static str,
    priority_file: String,
    devices: Vec<DeviceReport>,
}

/// One GPU.
#[derive(Serialize)]
struct DeviceReport {
    uuid: String,
    /// Seconds since a high-priority tenant last launched here (null = never).
    high_last_launch_ago_s: Option<f64>,
    /// Milliseconds of high-priority work estimated still queued (0 = none).
    high_queue_ms: f64,
    high_launches: u64,
    /// Whether a best-effort kernel holds the queue token now.
    best_effort_token_held: bool,
    best_effort_launches: u64,
    best_effort_waits: u64,
    best_effort_waited_s: f64,
    reserve_refusals: u64,
    inflight_bytes: u64,
}

impl DeviceReport {
    fn new(d: &PriorityDeviceInfo, now: u64) -> DeviceReport {
        let ms = |ns: u64| output::round2(ns as f64 / 1e6);
        DeviceReport {
            uuid: format_uuid(&d.uuid),
            high_last_launch_ago_s: (d.hp.last_launch != 0)
                .then(|| output::round2(now.saturating_sub(d.hp.last_launch) as f64 / 1e9)),
            high_queue_ms: ms(d.hp.busy_until.saturating_sub(now)),
            high_launches: d.hp_launches,
            best_effort_token_held: d.be_token > now
                && d.be_token <= now.saturating_add(cuquota_core::region::TOKEN_MAX_AHEAD_NS),
            best_effort_launches: d.be_launches,
            best_effort_waits: d.be_waits,
            best_effort_waited_s: output::round2(d.be_waited_ns as f64 / 1e9),
            reserve_refusals: d.reserve_refusals,
            inflight_bytes: d.inflight_bytes,
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `cuquota priority …`.
pub(crate) fn run(cmd: PriorityCommand) -> CmdResult {
    match cmd {
        PriorityCommand::Init { file } => {
            PriorityRegion::create(&file)?;
            println!("{}: priority file ready", file.display());
        }
        PriorityCommand::Show { file, json } => {
            let region = PriorityRegion::open_file(&file)?;
            let now = monotonic_ns();
            let report = PriorityReport {
                schema: SCHEMA,
                priority_file: file.display().to_string(),
                devices: region
                    .devices(now)
                    .iter()
                    .map(|d| DeviceReport::new(d, now))
                    .collect(),
            };
            if json {
                output::print_json(&report)?;
            } else {
                println!("{}", report.priority_file);
                if report.devices.is_empty() {
                    println!("(no GPU has been used by a tenant with a priority yet)");
                }
                let rows: Vec<[String; 6]> = report
                    .devices
                    .iter()
                    .map(|d| {
                        [
                            d.uuid.clone(),
                            d.high_last_launch_ago_s
                                .map_or_else(|| "never".into(), |s| format!("{s:.2} s ago")),
                            format!("{:.2} ms", d.high_queue_ms),
                            if d.best_effort_token_held { "held" } else { "free" }.into(),
                            format!(
                                "{} ({} waited, {:.2} s)",
                                d.best_effort_launches, d.best_effort_waits, d.best_effort_waited_s
                            ),
                            d.reserve_refusals.to_string(),
                        ]
                    })
                    .collect();
                output::print_table(
                    &[
                        "GPU",
                        "HIGH LAST LAUNCH",
                        "HIGH QUEUE",
                        "BE TOKEN",
                        "BE LAUNCHES",
                        "RESERVE REFUSALS",
                    ],
                    &rows,
                );
            }
        }
    }
    Ok(0)
}

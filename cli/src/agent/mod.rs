//! `cuquota agent`: the node agent. Runs on the host (a DaemonSet in Kubernetes) with the real NVML, never
//! under the shim. Every interval it re-reads the container descriptors in `--containers DIR`, finds each
//! container's processes (cgroup, pid namespace or subtree), reads per-process device memory and SM
//! utilisation from NVML, sums them per container and GPU, compares them with the container's limits file,
//! acts per its `[enforce]` policy (report only in this version), and serves the metrics on `--listen`.
//! `--once` does one pass and prints the report (`--json`: schema cuquota.agent/v1). The shape is documented
//! in docs/agent.md.

pub mod descriptor;
pub mod enforce;
pub mod members;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use cuquota_core::log::Level;
use cuquota_core::region::{LimitsReader, UsageRegion};

use crate::metrics::{self, ActionLabels, DeviceLabels, DeviceSample, Published, Snapshot};
use crate::nvml::{self, Nvml};
use crate::output::{self, parse_duration_arg};
use crate::{CliError, CmdResult};
use enforce::{Actuator, NoActuator};
use members::{MemberState, ProcTable};
use report::{AgentReport, ContainerReport, GpuReport, GpuSample};

/// `cuquota agent`.
#[derive(Args)]
pub struct AgentArgs {
    /// Directory of container descriptors, one <name>.toml per container (see docs/agent.md)
    #[arg(long, value_name = "DIR")]
    containers: PathBuf,
    /// Time between passes; per-process utilisation is averaged over it
    #[arg(long, default_value = "1s", value_parser = parse_duration_arg)]
    interval: Duration,
    /// Serve GET /metrics on this address (HOST:PORT, or :PORT for every interface)
    #[arg(long, value_name = "ADDR", value_parser = metrics::parse_listen)]
    listen: Option<SocketAddr>,
    /// One pass, print the report, exit
    #[arg(long)]
    once: bool,
    /// Print the report as JSON (schema cuquota.agent/v1): once with --once, else one line per pass
    #[arg(long)]
    json: bool,
}

/// What the agent keeps between passes.
struct Agent {
    dir: PathBuf,
    interval: Duration,
    nvml: Option<Nvml>,
    members: MemberState,
    actuator: Box<dyn Actuator>,
    passes: u64,
    last_pass: Option<Instant>,
    /// (container, GPU uuid) → GPU seconds used, integrated from NVML utilisation.
    gpu_seconds: BTreeMap<(String, String), f64>,
    /// (container, GPU uuid) → when NVML last saw it run kernels.
    last_active: BTreeMap<(String, String), Instant>,
    /// (container, action kind) → count.
    actions: BTreeMap<(String, &'static str), u64>,
    /// The last error logged per container (logged again only when it changes).
    errors: BTreeMap<String, String>,
}

impl Agent {
    fn nvml(&mut self) -> Result<&Nvml, CliError> {
        if self.nvml.is_none() {
            self.nvml = Some(Nvml::load().map_err(|e| CliError::new(format!("agent: NVML: {e}")))?);
        }
        Ok(self.nvml.as_ref().expect("loaded above"))
    }

    fn sample_gpus(&mut self) -> Result<Vec<GpuSample>, CliError> {
        let since = nvml::realtime_us().saturating_sub(self.interval.as_micros() as u64);
        let nv = self.nvml()?;
        let mut out = Vec::new();
        for gpu in nv.gpus().map_err(CliError::new)? {
            let processes = nv.processes(&gpu).map_err(CliError::new)?;
            let utilization = match nv.process_utilization(&gpu, since) {
                Ok(u) => Some(u),
                Err(e) => {
                    cuquota_core::log!(Level::Debug, "GPU {}: no per-process utilisation: {e}", gpu.index);
                    None
                }
            };
            out.push(GpuSample {
                gpu,
                processes,
                utilization,
            });
        }
        Ok(out)
    }

    fn note_error(&mut self, name: &str, e: &str) {
        if self.errors.get(name).map(String::as_str) != Some(e) {
            cuquota_core::log!(Level::Warn, "agent: container {name}: {e}");
            self.errors.insert(name.to_string(), e.to_string());
        }
    }

    /// One pass.
    fn pass(&mut self) -> Result<AgentReport, CliError> {
        let gpus = self.sample_gpus()?;
        let table = ProcTable::read();
        let found =
            descriptor::scan(&self.dir).map_err(|e| CliError::new(format!("agent: --containers {e}")))?;
        let mut containers = Vec::new();
        let mut attributed: BTreeSet<u32> = BTreeSet::new();
        for (name, file, d) in found {
            let file = file.display().to_string();
            let d = match d {
                Ok(d) => d,
                Err(e) => {
                    self.note_error(&name, &e);
                    containers.push(ContainerReport::failed(&name, &file, None, e));
                    continue;
                }
            };
            let members = match d.members.discover(&table, &mut self.members) {
                Ok(m) => m,
                Err(e) => {
                    self.note_error(&name, &e);
                    containers.push(ContainerReport::failed(&name, &file, Some(&d), e));
                    continue;
                }
            };
            attributed.extend(&members);
            let limits = match LimitsReader::open(&d.limits) {
                Ok(r) => *r.snapshot(),
                Err(e) => {
                    let e = format!("limits {e}");
                    self.note_error(&name, &e);
                    containers.push(ContainerReport::failed(&name, &file, Some(&d), e));
                    continue;
                }
            };
            // The usage file is the container's own (cooperative) accounting: optional, never required.
            let usage = d
                .usage
                .as_ref()
                .and_then(|p| match UsageRegion::open_existing(p) {
                    Ok(u) => Some(u.devices()),
                    Err(e) => {
                        cuquota_core::log!(Level::Debug, "agent: container {name}: usage {e}");
                        None
                    }
                });
            let mut c = ContainerReport::build(
                &d,
                &file,
                d.members.report(),
                &members,
                &gpus,
                &limits,
                usage.as_deref(),
            );
            let planned = enforce::plan(&d.enforce, &c);
            c.actions = enforce::execute(planned, &members, self.actuator.as_mut());
            for a in &c.actions {
                *self.actions.entry((name.clone(), a.action)).or_default() += 1;
                if a.ok {
                    cuquota_core::log!(Level::Warn, "agent: container {name}: {} {:?}", a.action, a.pids);
                } else {
                    cuquota_core::log!(
                        Level::Error,
                        "agent: container {name}: {} {:?} failed: {}",
                        a.action,
                        a.pids,
                        a.error.as_deref().unwrap_or("")
                    );
                }
            }
            self.errors.remove(&name);
            containers.push(c);
        }
        self.passes += 1;
        let gpus = gpus
            .iter()
            .map(|g| GpuReport {
                index: g.gpu.index,
                uuid: g.gpu.uuid.clone(),
                memory_total_bytes: g.gpu.memory_total_bytes,
                memory_used_bytes: g.gpu.memory_used_bytes,
                utilization_percent: g.gpu.utilization_percent,
                processes: g.processes.len(),
                unattributed_pids: g
                    .processes
                    .iter()
                    .map(|p| p.0)
                    .filter(|p| !attributed.contains(p))
                    .collect(),
            })
            .collect();
        Ok(AgentReport {
            schema: report::SCHEMA,
            time_unix_ms: nvml::realtime_us() / 1000,
            pass: self.passes,
            interval_ms: self.interval.as_millis() as u64,
            nvml_library: self
                .nvml
                .as_ref()
                .map_or_else(String::new, |n| n.library().to_string()),
            gpus,
            containers,
        })
    }

    /// The metrics of a pass (state integrated over passes: GPU seconds, last activity, action counts).
    fn snapshot(&mut self, r: &AgentReport) -> Snapshot {
        let now = Instant::now();
        let dt = self
            .last_pass
            .map_or(self.interval, |t| now.duration_since(t))
            .as_secs_f64();
        self.last_pass = Some(now);
        let live: BTreeSet<&str> = r.containers.iter().map(|c| c.name.as_str()).collect();
        self.gpu_seconds.retain(|k, _| live.contains(k.0.as_str()));
        self.last_active.retain(|k, _| live.contains(k.0.as_str()));
        self.actions.retain(|k, _| live.contains(k.0.as_str()));
        let mut snap = Snapshot {
            agent_passes: Some(self.passes),
            ..Default::default()
        };
        for c in &r.containers {
            for kind in enforce::KINDS {
                snap.actions.push((
                    ActionLabels {
                        namespace: c.namespace.clone(),
                        pod: c.pod.clone(),
                        container: c.container.clone(),
                        name: c.name.clone(),
                        action: kind.to_string(),
                    },
                    self.actions.get(&(c.name.clone(), kind)).copied().unwrap_or(0),
                ));
            }
            for d in &c.devices {
                let key = (c.name.clone(), d.uuid.clone());
                let util = d.utilization_percent.unwrap_or(0.0);
                let secs = self.gpu_seconds.entry(key.clone()).or_default();
                *secs += util / 100.0 * dt;
                let secs = *secs;
                if util > 0.0 {
                    self.last_active.insert(key.clone(), now);
                }
                snap.devices.push(DeviceSample {
                    labels: DeviceLabels {
                        namespace: c.namespace.clone(),
                        pod: c.pod.clone(),
                        container: c.container.clone(),
                        vdevice_index: d.vdevice_index.map_or_else(String::new, |i| i.to_string()),
                        device_uuid: d.uuid.clone(),
                        name: c.name.clone(),
                    },
                    memory_used_bytes: d.memory_used_bytes,
                    memory_limit_bytes: d.memory_limit_bytes,
                    sm_limit_percent: d.sm_limit_percent,
                    utilization_percent: d.utilization_percent,
                    last_kernel_age_seconds: self
                        .last_active
                        .get(&key)
                        .map(|t| now.duration_since(*t).as_secs_f64()),
                    gpu_seconds_total: Some(secs),
                    throttled_seconds_total: d.reported.as_ref().map(|u| u.throttled_ns as f64 / 1e9),
                    allocation_refusals_total: d.reported.as_ref().map(|u| u.allocation_refusals),
                    processes: d.processes.len() as u64,
                });
            }
        }
        snap
    }
}

/// `cuquota agent`.
pub fn run(a: AgentArgs) -> CmdResult {
    if a.interval < Duration::from_millis(10) {
        return Err(CliError::new("--interval must be at least 10ms"));
    }
    if !a.containers.is_dir() {
        return Err(CliError::new(format!(
            "--containers {}: not a directory",
            a.containers.display()
        )));
    }
    let published = Published::default();
    if let Some(addr) = a.listen {
        let bound = metrics::serve(addr, published.clone())?;
        eprintln!("cuquota agent: serving http://{bound}/metrics");
    }
    let mut agent = Agent {
        dir: a.containers,
        interval: a.interval,
        nvml: None,
        members: MemberState::default(),
        actuator: Box::new(NoActuator),
        passes: 0,
        last_pass: None,
        gpu_seconds: BTreeMap::new(),
        last_active: BTreeMap::new(),
        actions: BTreeMap::new(),
        errors: BTreeMap::new(),
    };
    let start = Instant::now();
    for n in 1u32.. {
        match agent.pass() {
            Ok(r) => {
                let snap = agent.snapshot(&r);
                published.set(metrics::render(&snap));
                if a.json {
                    output::print_json(&r)?;
                } else if a.once {
                    r.print_table();
                }
            }
            Err(e) if a.once => return Err(e),
            Err(e) => cuquota_core::log!(Level::Error, "{}", e.msg),
        }
        if a.once {
            return Ok(0);
        }
        // Fixed ticks: a slow pass shortens the next wait rather than drifting.
        let next = start + a.interval * n;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    Ok(0)
}

//! The agent's per-pass report (`agent --once --json`, schema `cuquota.agent/v1`, docs/schemas/agent.v1.json):
//! what NVML says each GPU holds, and per container and device what its member processes use, against its
//! limits file. The same structs print the table and feed the metrics.

use std::collections::{BTreeMap, BTreeSet};

use cuquota_core::region::layout::parse_uuid;
use cuquota_core::region::{DeviceInfo, DeviceSelector, LimitsSnapshot};
use cuquota_core::Policy;
use serde::Serialize;

use super::descriptor::{Descriptor, Enforce};
use super::enforce::ActionReport;
use super::members::SourceReport;
use crate::nvml::Gpu;
use crate::output::{self, round2};

/// Schema of the report.
pub const SCHEMA: &str = "cuquota.agent/v1";

/// One pass.
#[derive(Debug, Serialize)]
pub struct AgentReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// When the pass ran (Unix ms).
    pub time_unix_ms: u64,
    /// Passes so far, this one included.
    pub pass: u64,
    /// The sampling interval (per-process utilisation is averaged over it).
    pub interval_ms: u64,
    /// The NVML library sampled.
    pub nvml_library: String,
    /// Every GPU.
    pub gpus: Vec<GpuReport>,
    /// Every descriptor, sorted by name.
    pub containers: Vec<ContainerReport>,
}

/// One GPU as NVML sees it.
#[derive(Debug, Serialize)]
pub struct GpuReport {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Device memory.
    pub memory_total_bytes: u64,
    /// In use by all processes.
    pub memory_used_bytes: u64,
    /// Busy percentage NVML reports.
    pub utilization_percent: Option<u32>,
    /// Compute processes on it.
    pub processes: usize,
    /// Those that belong to no described container.
    pub unattributed_pids: Vec<u32>,
}

/// One container.
#[derive(Debug, Serialize)]
pub struct ContainerReport {
    /// Its id (the descriptor's stem).
    pub name: String,
    /// Metric labels.
    pub namespace: String,
    /// Metric labels.
    pub pod: String,
    /// Metric labels.
    pub container: String,
    /// The descriptor file.
    pub descriptor: String,
    /// Its limits file.
    pub limits_file: Option<String>,
    /// Its usage file.
    pub usage_file: Option<String>,
    /// How its processes are known, and who they are now.
    pub members: Option<MembersReport>,
    /// Its policy.
    pub enforce: Option<Enforce>,
    /// What stopped the agent from judging it (bad descriptor, members unknown, limits unreadable).
    pub error: Option<String>,
    /// Per device.
    pub devices: Vec<ContainerDevice>,
    /// What the agent did this pass.
    pub actions: Vec<ActionReport>,
}

/// Members.
#[derive(Debug, Serialize)]
pub struct MembersReport {
    /// The source.
    #[serde(flatten)]
    pub source: SourceReport,
    /// Host pids, sorted.
    pub pids: Vec<u32>,
    /// Whether they are published in the limits file (for the shim's NVML filter).
    pub published: bool,
}

/// One container on one GPU.
#[derive(Debug, Serialize, Clone)]
pub struct ContainerDevice {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// The device's entry in the container's usage file (its view), when known.
    pub vdevice_index: Option<u32>,
    /// Device memory its processes hold (NVML).
    pub memory_used_bytes: u64,
    /// Its cap for this device (limits file).
    pub memory_limit_bytes: Option<u64>,
    /// Its guaranteed memory here: the limits file's request, else the cap; null without a cap.
    pub memory_request_bytes: Option<u64>,
    /// Why its request was not admitted on this device (the sum of requests would exceed the device); absent
    /// when admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_request_refused: Option<String>,
    /// Over the cap now.
    pub memory_over_limit: bool,
    /// Its SM limit for this device.
    pub sm_limit_percent: Option<u32>,
    /// Its SM policy for this device.
    pub policy: &'static str,
    /// Sum of its processes' SM utilisation over the interval (NVML), percent; null when NVML has none.
    pub utilization_percent: Option<f64>,
    /// Above the SM limit over the interval.
    pub sm_over_limit: bool,
    /// What its usage file says (cooperative: the container's processes write it).
    pub reported: Option<Reported>,
    /// Its processes on the device.
    pub processes: Vec<ProcessReport>,
}

/// The container's own accounting for a device.
#[derive(Debug, Serialize, Clone)]
pub struct Reported {
    /// Charged in the usage file.
    pub memory_used_bytes: u64,
    /// Time launches waited for the SM limit.
    pub throttled_ns: u64,
    /// Allocations refused at the cap.
    pub allocation_refusals: u64,
}

/// One member process on one GPU.
#[derive(Debug, Serialize, Clone)]
pub struct ProcessReport {
    /// Host pid.
    pub pid: u32,
    /// Device memory (NVML).
    pub memory_used_bytes: u64,
    /// SM utilisation over the interval (NVML), percent.
    pub sm_util_percent: Option<f64>,
}

/// One GPU's NVML sample for a pass.
#[derive(Debug)]
pub struct GpuSample {
    /// The device.
    pub gpu: Gpu,
    /// Compute processes: (pid, bytes).
    pub processes: Vec<(u32, u64)>,
    /// pid → SM utilisation percent over the interval; `None` when NVML could not say.
    pub utilization: Option<BTreeMap<u32, f64>>,
}

/// The limits file's word on a device the agent knows only by UUID: its UUID entry; else — since which CUDA
/// ordinal the container gave this GPU is unknown here — the strictest of the ordinal entries and `all`
/// (fail closed: never more than any entry that might apply).
pub fn limits_for(snap: &LimitsSnapshot, uuid: &[u8; 16]) -> Policy {
    if let Some(e) = snap.get(DeviceSelector::Uuid(*uuid)) {
        return e.limits();
    }
    let mut out: Option<Policy> = None;
    for e in snap.entries.iter().filter(|e| e.is_valid()) {
        if matches!(e.selector(), DeviceSelector::Uuid(_)) {
            continue;
        }
        let l = e.limits();
        out = Some(match out {
            None => l,
            Some(o) => o.restrict(&l),
        });
    }
    out.unwrap_or(Policy::NONE)
}

impl ContainerReport {
    /// A container the agent could not judge.
    pub fn failed(name: &str, file: &str, d: Option<&Descriptor>, error: String) -> ContainerReport {
        ContainerReport {
            name: name.to_string(),
            namespace: d.map(|d| d.namespace.clone()).unwrap_or_default(),
            pod: d.map(|d| d.pod.clone()).unwrap_or_default(),
            container: d.map(|d| d.container.clone()).unwrap_or_default(),
            descriptor: file.to_string(),
            limits_file: d.map(|d| d.limits.display().to_string()),
            usage_file: d.and_then(|d| d.usage.as_ref()).map(|p| p.display().to_string()),
            members: None,
            enforce: d.map(|d| d.enforce),
            error: Some(error),
            devices: Vec::new(),
            actions: Vec::new(),
        }
    }

    /// Sums the member processes' NVML figures per GPU and compares them with the limits. A GPU appears when
    /// a member uses it, the usage file has an entry for it, or the limits file names it by UUID.
    pub fn build(
        d: &Descriptor,
        file: &str,
        source: SourceReport,
        members: &BTreeSet<u32>,
        gpus: &[GpuSample],
        limits: &LimitsSnapshot,
        usage: Option<&[DeviceInfo]>,
    ) -> ContainerReport {
        let mut devices = Vec::new();
        for g in gpus {
            let uuid_bytes = parse_uuid(&g.gpu.uuid).unwrap_or([0; 16]);
            let mut procs: Vec<ProcessReport> = g
                .processes
                .iter()
                .filter(|(p, _)| members.contains(p))
                .map(|&(pid, bytes)| ProcessReport {
                    pid,
                    memory_used_bytes: bytes,
                    sm_util_percent: g
                        .utilization
                        .as_ref()
                        .map(|u| u.get(&pid).copied().unwrap_or(0.0)),
                })
                .collect();
            // A member that ran kernels in the interval but holds no memory (or exited NVML's list meanwhile).
            if let Some(u) = &g.utilization {
                for (&pid, &sm) in u {
                    if members.contains(&pid) && !procs.iter().any(|p| p.pid == pid) {
                        procs.push(ProcessReport {
                            pid,
                            memory_used_bytes: 0,
                            sm_util_percent: Some(sm),
                        });
                    }
                }
            }
            procs.sort_by_key(|p| p.pid);
            let entry = usage.and_then(|u| u.iter().find(|x| x.uuid == uuid_bytes));
            let named = limits.get(DeviceSelector::Uuid(uuid_bytes)).is_some();
            if procs.is_empty() && entry.is_none() && !named {
                continue;
            }
            let l = limits_for(limits, &uuid_bytes);
            let used: u64 = procs.iter().map(|p| p.memory_used_bytes).sum();
            let util = g.utilization.as_ref().map(|_| {
                round2(
                    procs
                        .iter()
                        .filter_map(|p| p.sm_util_percent)
                        .sum::<f64>()
                        .min(100.0),
                )
            });
            let sm_limit = l.sm_share();
            devices.push(ContainerDevice {
                index: g.gpu.index,
                uuid: g.gpu.uuid.clone(),
                vdevice_index: entry.map(|e| e.id.index() as u32),
                memory_used_bytes: used,
                memory_limit_bytes: l.memory,
                memory_request_bytes: l.request_in_force(),
                memory_request_refused: None,
                memory_over_limit: l.memory.is_some_and(|m| used > m),
                sm_limit_percent: sm_limit,
                policy: l.kind.as_str(),
                utilization_percent: util,
                sm_over_limit: matches!((sm_limit, util), (Some(s), Some(u)) if u > f64::from(s)),
                reported: entry.map(|e| Reported {
                    memory_used_bytes: e.used,
                    throttled_ns: e.throttled_ns,
                    allocation_refusals: e.refusals,
                }),
                processes: procs,
            });
        }
        ContainerReport {
            name: d.name.clone(),
            namespace: d.namespace.clone(),
            pod: d.pod.clone(),
            container: d.container.clone(),
            descriptor: file.to_string(),
            limits_file: Some(d.limits.display().to_string()),
            usage_file: d.usage.as_ref().map(|p| p.display().to_string()),
            members: Some(MembersReport {
                source,
                pids: members.iter().copied().collect(),
                published: false,
            }),
            enforce: Some(d.enforce),
            error: None,
            devices,
            actions: Vec::new(),
        }
    }
}

impl AgentReport {
    /// The human-readable table of `agent --once`.
    pub fn print_table(&self) {
        println!(
            "pass {} over {} ms: {} GPU(s), {} container(s) (NVML: {})",
            self.pass,
            self.interval_ms,
            self.gpus.len(),
            self.containers.len(),
            self.nvml_library
        );
        let mut rows = Vec::new();
        for c in &self.containers {
            let pids = c.members.as_ref().map_or(0, |m| m.pids.len());
            if let Some(e) = &c.error {
                rows.push([
                    c.name.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!("ERROR: {e}"),
                ]);
                continue;
            }
            if c.devices.is_empty() {
                rows.push([
                    c.name.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!("0 of {pids}"),
                    "no GPU use".into(),
                ]);
            }
            for d in &c.devices {
                let mut state = Vec::new();
                if d.memory_over_limit {
                    state.push("OVER MEMORY CAP");
                }
                if d.sm_over_limit {
                    state.push("over SM limit");
                }
                if d.memory_request_refused.is_some() {
                    state.push("request refused (sum of requests over the GPU)");
                }
                rows.push([
                    c.name.clone(),
                    format!("{} {}", d.index, d.uuid),
                    format!(
                        "{} / {}",
                        output::size_or_dash(Some(d.memory_used_bytes)),
                        output::size_or_dash(d.memory_limit_bytes)
                    ),
                    format!(
                        "{} / {}",
                        output::share_or_dash(d.utilization_percent),
                        output::pct_or_dash(d.sm_limit_percent)
                    ),
                    format!("{} of {pids}", d.processes.len()),
                    if state.is_empty() {
                        "ok".into()
                    } else {
                        state.join(", ")
                    },
                ]);
            }
        }
        output::print_table(
            &[
                "CONTAINER",
                "GPU",
                "MEMORY / CAP",
                "SM / LIMIT",
                "PROCESSES",
                "STATE",
            ],
            &rows,
        );
        for c in &self.containers {
            for a in &c.actions {
                println!(
                    "{}: {} {:?}{}: {}",
                    c.name,
                    a.action,
                    a.pids,
                    a.error
                        .as_ref()
                        .map_or_else(String::new, |e| format!(" FAILED ({e})")),
                    a.detail.as_deref().unwrap_or("")
                );
            }
        }
        for g in self.gpus.iter().filter(|g| !g.unattributed_pids.is_empty()) {
            println!(
                "GPU {}: processes of no described container: {:?}",
                g.index, g.unattributed_pids
            );
        }
    }
}

/// Test fixture of the agent's modules.
#[cfg(test)]
impl ContainerReport {
    /// Container `name` on one GPU (index 0, `uuid`) with cap and request `cap` and its processes' (pid, bytes).
    pub(crate) fn on_one_gpu(
        name: &str,
        uuid: &str,
        cap: Option<u64>,
        procs: &[(u32, u64)],
    ) -> ContainerReport {
        let mut c = ContainerReport::failed(name, "", None, String::new());
        c.error = None;
        c.devices.push(ContainerDevice {
            index: 0,
            uuid: uuid.into(),
            vdevice_index: None,
            memory_used_bytes: procs.iter().map(|p| p.1).sum(),
            memory_limit_bytes: cap,
            memory_request_bytes: cap,
            memory_request_refused: None,
            memory_over_limit: false,
            sm_limit_percent: None,
            policy: "default",
            utilization_percent: None,
            sm_over_limit: false,
            reported: None,
            processes: procs
                .iter()
                .map(|&(pid, bytes)| ProcessReport {
                    pid,
                    memory_used_bytes: bytes,
                    sm_util_percent: None,
                })
                .collect(),
        });
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuquota_core::region::LimitsTable;

    fn snap(f: impl FnOnce(&mut LimitsTable)) -> LimitsSnapshot {
        let mut t = LimitsTable::default();
        f(&mut t);
        LimitsSnapshot {
            seq: 2,
            generation: 1,
            table: t,
        }
    }

    #[test]
    fn a_device_known_by_uuid_takes_its_entry_else_the_strictest() {
        let u = [7u8; 16];
        let s = snap(|t| {
            t.entry_mut(DeviceSelector::All).unwrap().memory_limit = 8 << 30;
            t.entry_mut(DeviceSelector::Index(1)).unwrap().memory_limit = 2 << 30;
            t.entry_mut(DeviceSelector::Index(0)).unwrap().sm_limit = 40;
        });
        let l = limits_for(&s, &u);
        assert_eq!(
            (l.memory, l.sm),
            (Some(2 << 30), Some(40)),
            "the strictest of every entry that may apply"
        );
        let s2 = snap(|t| {
            t.entry_mut(DeviceSelector::Index(1)).unwrap().memory_limit = 2 << 30;
            t.entry_mut(DeviceSelector::Uuid(u)).unwrap().memory_limit = 6 << 30;
        });
        assert_eq!(
            limits_for(&s2, &u).memory,
            Some(6 << 30),
            "its own UUID entry wins"
        );
        assert_eq!(limits_for(&snap(|_| {}), &u), Policy::NONE);
    }
}

//! `cuquota agent`: the node agent. Runs on the host (a DaemonSet in Kubernetes) with the real NVML, never
//! under the shim. Every interval it re-reads the container descriptors in `--containers DIR`, finds each
//! container's processes (cgroup, pid namespace or subtree), reads per-process device memory and SM
//! utilisation from NVML, sums them per container and GPU, compares them with the container's limits file,
//! acts per its `[enforce]` policy (kill over the memory cap, freeze/thaw over the SM limit, or report), and
//! serves the metrics on `--listen`.
//! `--once` does one pass and prints the report (`--json`: schema cuquota.agent/v1). The shape is documented
//! in docs/agent.md.
//!
//! A library: the `cuquota` binary runs it (`cuquota agent`) and shares its NVML access ([`nvml`]), its
//! metrics series and endpoint ([`metrics`]) and its output helpers ([`output`]).

pub mod admission;
pub mod descriptor;
pub mod elastic;
pub mod enforce;
pub mod members;
pub mod metrics;
pub use cuquota_ffi::nvml_loader as nvml;
pub mod output;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use cuquota_core::log::Level;
use cuquota_core::region::layout::{parse_uuid, LIMITS_FLAG_RECLAIM};
use cuquota_core::region::{
    DeviceSelector, FileId, LimitsReader, LimitsSnapshot, LimitsWriter, SlotState, UsageRegion,
};
use cuquota_core::units::format_size;

use crate::metrics::{ActionLabels, DeviceLabels, DeviceSample, Published, Snapshot};
use crate::nvml::Nvml;
use crate::output::parse_duration_arg;
use descriptor::{Descriptor, SmPolicy};
use enforce::memory::MemoryState;
use enforce::throttle::ThrottleState;
use enforce::{ActionReport, Actuator};
use members::{MemberSource, MemberState, ProcTable};
use report::{AgentReport, ContainerReport, GpuReport, GpuSample};

/// `cuquota agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Directory of container descriptors, one <name>.toml per container (see docs/agent.md)
    #[arg(long, value_name = "DIR")]
    containers: PathBuf,
    /// Time between passes; per-process utilisation is averaged over it
    #[arg(long, default_value = "1s", value_parser = parse_duration_arg)]
    interval: Duration,
    #[command(flatten)]
    expose: metrics::Exposure,
    /// One pass, print the report, exit
    #[arg(long)]
    once: bool,
    /// Print the report as JSON (schema cuquota.agent/v1): once with --once, else one line per pass
    #[arg(long)]
    json: bool,
    /// Node budget of pinned host memory for idle elastic tenants' evicted memory (e.g. 64g; 0 = no reclaim):
    /// an allocation or restore waiting within its limit on a full GPU gets idle tenants above their request evicted
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = output::parse_size_arg)]
    pinned_host_budget: u64,
    /// An elastic tenant NVML saw busy (or that says it used the GPU) within this long is not evicted first
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    idle_threshold: Duration,
}

/// Why the agent stopped (the `cuquota` command prints it on one line and exits 2). A container that cannot be
/// judged is no such failure: it is reported with its error, and the agent goes on.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// NVML did not load (no driver, or `CUQUOTA_LIBNVML` names no NVML).
    #[error("agent: NVML: {0}")]
    NvmlLoad(#[source] nvml::NvmlError),
    /// NVML could not list the GPUs.
    #[error(transparent)]
    Nvml(#[from] nvml::NvmlError),
    /// The descriptor directory could not be read.
    #[error("agent: --containers {0}")]
    Containers(#[source] descriptor::ScanError),
    /// `--interval` below 10 ms.
    #[error("--interval must be at least 10ms")]
    IntervalTooShort,
    /// `--containers` is no directory.
    #[error("--containers {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// The metrics endpoint's token file is unreadable or empty.
    #[error(transparent)]
    Token(#[from] metrics::TokenError),
    /// `--listen` beyond loopback without a token file.
    #[error(
        "--listen {0}: the metrics name every tenant and its usage; serve them beyond loopback only with \
         --token-file FILE (a bearer token), or keep 127.0.0.1 behind an authenticating proxy such as \
         kube-rbac-proxy (docs/agent.md)"
    )]
    NotLoopback(std::net::SocketAddr),
    /// The metrics address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// `--listen`.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Writing the output, or starting the metrics thread.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A report that did not serialise.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// A run's result: the exit code on success.
pub type AgentResult = Result<u8, AgentError>;

/// What the agent keeps about one container between passes.
#[derive(Default)]
struct ContainerState {
    memory: MemoryState,
    throttle: ThrottleState,
    /// Actions done between passes (thaws), for the next pass's report.
    carried: Vec<ActionReport>,
    /// Its limits file, where its members were published.
    limits: Option<PathBuf>,
    /// Action kinds the last pass recorded: a kind that repeats pass after pass is logged at `info` after
    /// its first `warn` (a throttled container is frozen every interval).
    last_kinds: BTreeSet<&'static str>,
    /// Its usage file's `last_use_ns` and `waiting` words at the last pass (its own, untrusted).
    usage_words: (u64, u64),
    /// Per usage-file device entry: bytes still charged there by its processes found dead (not yet reclaimed),
    /// taken off its charge for elastic memory (a killed tenant's evicted bytes are nobody's).
    dead_held: BTreeMap<u32, u64>,
    /// Per GPU (UUID): the `evict_mask` bits of the limits entries that apply there.
    evict_bits: BTreeMap<String, u64>,
    /// Its limits file's `evict_mask` at the last pass.
    evict_mask: u64,
}

/// What the agent keeps between passes.
struct Agent {
    dir: PathBuf,
    interval: Duration,
    nvml: Option<Nvml>,
    members: MemberState,
    actuator: Box<dyn Actuator>,
    /// Per container (by name).
    state: BTreeMap<String, ContainerState>,
    /// CLOCK_REALTIME µs of the last NVML sample: utilisation is read from there on.
    last_sample_us: Option<u64>,
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
    /// The last error publishing a container's members (logged again only when it changes).
    publish_errors: BTreeMap<String, String>,
    /// Per container: its member source (cgroup, subtree), scanned between passes.
    sources: BTreeMap<String, MemberSource>,
    /// Per container: every member seen by a pass or a scan, pid → (start time, last seen). A member that
    /// exited before the pass is still charged its NVML samples (kept [`RECENT`] intervals).
    recent: BTreeMap<String, BTreeMap<u32, (u64, Instant)>>,
    last_scan: Option<Instant>,
    /// The memory requests admitted per GPU.
    admission: admission::Admission,
    /// Elastic memory: whom to ask to evict.
    planner: elastic::Planner,
    /// (container, GPU uuid) → CLOCK_BOOTTIME ns NVML last saw it run kernels.
    busy_ns: BTreeMap<(String, String), u64>,
    /// (container, GPU uuid) → (evicted bytes, waiting bytes) at the last pass, for the metrics.
    elastic_bytes: BTreeMap<(String, String), (u64, u64)>,
}

/// Intervals a member that exited stays charged for its samples.
const RECENT: u32 = 3;

/// Time between membership scans: a process that lives less than this between two passes may be missed.
fn scan_period(interval: Duration) -> Duration {
    (interval / 8).clamp(Duration::from_millis(10), Duration::from_millis(125))
}

impl Agent {
    fn nvml(&mut self) -> Result<&Nvml, AgentError> {
        if self.nvml.is_none() {
            self.nvml = Some(Nvml::load().map_err(AgentError::NvmlLoad)?);
        }
        Ok(self.nvml.as_ref().expect("loaded above"))
    }

    fn sample_gpus(&mut self) -> Result<Vec<GpuSample>, AgentError> {
        // Utilisation since the previous sample (the interval the throttle charges), at most 10 s.
        let now_us = nvml::realtime_us();
        let since = self
            .last_sample_us
            .filter(|&t| t < now_us && now_us - t <= 10_000_000)
            .unwrap_or_else(|| now_us.saturating_sub(self.interval.as_micros() as u64));
        self.last_sample_us = Some(now_us);
        let nv = self.nvml()?;
        let mut out = Vec::new();
        let mut failed = Vec::new();
        for gpu in nv.gpus()? {
            // One GPU's lists failing leaves that GPU out of this pass (its balances carried unchanged), not
            // the node's enforcement.
            let processes = match nv.processes(&gpu) {
                Ok(p) => p,
                Err(e) => {
                    failed.push(format!("GPU {} ({}): {e}", gpu.index, gpu.uuid));
                    continue;
                }
            };
            let utilization = match nv.process_utilization(&gpu, since) {
                // No sample in the window while the GPU reports itself busy: no new sample yet, not idle
                // processes (unknown: balances are carried, nobody is credited for it).
                Ok(u) if u.is_empty() && gpu.utilization_percent.is_some_and(|p| p > 0) => None,
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
        for f in failed {
            cuquota_core::log!(Level::Warn, "agent: {f}: left out of this pass");
        }
        Ok(out)
    }

    fn note_error(&mut self, name: &str, e: &str) {
        if self.errors.get(name).map(String::as_str) != Some(e) {
            cuquota_core::log!(Level::Warn, "agent: container {name}: {e}");
            self.errors.insert(name.to_string(), e.to_string());
        }
    }

    /// Publishes container `name`'s member host pids into its limits file (agent-owned, mounted read-only into
    /// the container), where the shim's NVML filter reads them: a process sees only its container's processes,
    /// by a list the tenant cannot write. Written only when it changed. Returns whether the file holds them.
    fn publish(&mut self, name: &str, limits: &Path, members: &BTreeSet<u32>) -> bool {
        let pids: Vec<u32> = members.iter().copied().collect();
        let r = LimitsWriter::open(limits).and_then(|w| w.set_members(&pids));
        match r {
            Ok(()) => {
                if self.publish_errors.remove(name).is_some() {
                    cuquota_core::log!(Level::Warn, "agent: container {name}: members published again");
                }
                true
            }
            Err(e) => {
                let e = format!("cannot publish the members into {}: {e}", limits.display());
                if self.publish_errors.get(name) != Some(&e) {
                    cuquota_core::log!(Level::Error, "agent: container {name}: {e}");
                    self.publish_errors.insert(name.to_string(), e);
                }
                false
            }
        }
    }

    /// Logs and counts what was done for container `name`. A kind repeated from the last pass is logged at
    /// `info` (a throttle freezes every interval); a first one, a kill and a failure at `warn` / `error`.
    fn record(&mut self, name: &str, reports: &[ActionReport], repeat_ok: &BTreeSet<&'static str>) {
        for a in reports {
            *self.actions.entry((name.to_string(), a.action)).or_default() += 1;
            let detail = a.detail.as_deref().unwrap_or("");
            if !a.ok {
                cuquota_core::log!(
                    Level::Error,
                    "agent: container {name}: {} {:?} failed: {} ({detail})",
                    a.action,
                    a.pids,
                    a.error.as_deref().unwrap_or("")
                );
                continue;
            }
            let level = if a.action == "thaw" || repeat_ok.contains(a.action) {
                Level::Info
            } else {
                Level::Warn
            };
            if cuquota_core::log::enabled(level) {
                cuquota_core::log!(
                    level,
                    "agent: container {name}: {} {:?}: {detail}",
                    a.action,
                    a.pids
                );
            }
        }
    }

    /// Thaws container `name` now if it is frozen (its thaw is due, it is going away, or it can no longer be
    /// judged). The thaw may touch exactly the processes the freeze named. Returns the record.
    fn thaw(&mut self, name: &str, now: Instant, why: &str) -> Option<ActionReport> {
        let st = self.state.get_mut(name)?;
        let (action, why, allowed) = st.throttle.thaw(now, why)?;
        let r = enforce::execute(vec![(action, why)], &allowed, self.actuator.as_mut())
            .pop()
            .expect("one action, one report");
        let repeat: BTreeSet<&'static str> = BTreeSet::new();
        self.record(name, std::slice::from_ref(&r), &repeat);
        Some(r)
    }

    /// Thaws every container whose freeze is due by `now`; the records go into its next report.
    fn thaw_due(&mut self, now: Instant) {
        let due: Vec<String> = self
            .state
            .iter()
            .filter(|(_, s)| s.throttle.thaw_due().is_some_and(|t| t <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(r) = self.thaw(&name, now, "debt repaid") {
                self.state.get_mut(&name).expect("thawed above").carried.push(r);
            }
        }
    }

    /// The earliest thaw due.
    fn next_thaw(&self) -> Option<Instant> {
        self.state.values().filter_map(|s| s.throttle.thaw_due()).min()
    }

    /// Between passes: notes the members of each cgroup or subtree container (pid + start time), so that a
    /// process that exits before the next pass is still charged its device time then.
    fn scan(&mut self) {
        let now = Instant::now();
        self.last_scan = Some(now);
        if self.sources.is_empty() {
            return;
        }
        let table = ProcTable::read();
        for (name, src) in &self.sources {
            if matches!(src, MemberSource::PidNs(_)) {
                continue; // every process's namespace file: too costly between passes
            }
            if let Ok(m) = src.discover(&table, &mut self.members) {
                note_members(self.recent.entry(name.clone()).or_default(), &m, &table, now);
            }
        }
    }

    /// Thaws every frozen container (the agent is stopping).
    fn thaw_all(&mut self, why: &str) {
        let names: Vec<String> = self.state.keys().cloned().collect();
        for name in names {
            self.thaw(&name, Instant::now(), why);
        }
    }

    /// A container that cannot be judged this pass: thawed if frozen (nothing the agent cannot see stays
    /// frozen), reported with its error.
    fn failed(&mut self, name: &str, file: &str, d: Option<&Descriptor>, e: String) -> ContainerReport {
        self.note_error(name, &e);
        let mut c = ContainerReport::failed(name, file, d, e);
        if let Some(r) = self.thaw(name, Instant::now(), "container cannot be judged") {
            c.actions.push(r);
        }
        if let Some(st) = self.state.get_mut(name) {
            c.actions.splice(0..0, std::mem::take(&mut st.carried));
        }
        // A descriptor that no longer parses: its last limits file gets an empty member list.
        if let (None, Some(l)) = (d, self.state.get(name).and_then(|s| s.limits.clone())) {
            self.publish(name, &l, &BTreeSet::new());
        }
        c
    }

    /// One pass: late freezes end, NVML and /proc are sampled, the descriptors read; each container is judged
    /// (members, limits, usage, enforcement); the report.
    fn pass(&mut self) -> Result<AgentReport, AgentError> {
        self.end_late_freezes();
        let gpus = self.sample_gpus()?;
        let table = ProcTable::read();
        let now = Instant::now();
        let found = descriptor::scan(&self.dir).map_err(AgentError::Containers)?;
        self.forget_gone(&found, now);
        let mut containers = Vec::new();
        let mut attributed: BTreeSet<u32> = BTreeSet::new();
        for (name, file, d) in found {
            let (c, members) = self.judge(&name, &file.display().to_string(), d, &gpus, &table, now);
            attributed.extend(members);
            containers.push(c);
        }
        let gpu_reports = gpu_reports(&gpus, &attributed);
        for (name, why) in self.admission.admit(&gpu_reports, &mut containers) {
            cuquota_core::log!(Level::Warn, "container {name}: {why}");
        }
        self.reclaim(&gpu_reports, &containers);
        self.passes += 1;
        Ok(AgentReport {
            schema: report::SCHEMA,
            time_unix_ms: nvml::realtime_us() / 1000,
            pass: self.passes,
            interval_ms: self.interval.as_millis() as u64,
            nvml_library: self
                .nvml
                .as_ref()
                .map_or_else(String::new, |n| n.library().to_string()),
            gpus: gpu_reports,
            containers,
        })
    }

    /// A freeze overdue (a late pass) ends first, before /proc is read. One that is to go on past the pass
    /// stays on (a thaw of even the pass's few milliseconds lets a tenant queue another full launch queue):
    /// the planner keeps the processes it stopped, which /proc shows stopped (state T), in the freeze.
    fn end_late_freezes(&mut self) {
        let pass_start = Instant::now();
        let late: Vec<String> = self
            .state
            .iter()
            .filter(|(_, s)| s.throttle.thaw_due().is_some_and(|t| t <= pass_start))
            .map(|(n, _)| n.clone())
            .collect();
        for name in late {
            if let Some(r) = self.thaw(&name, Instant::now(), "before the next pass") {
                self.state.get_mut(&name).expect("thawed above").carried.push(r);
            }
        }
    }

    /// Containers whose descriptor is gone: thawed, forgotten, their members withdrawn (an empty list, never a
    /// stale one whose pids may be reused).
    fn forget_gone(&mut self, found: &[descriptor::Found], now: Instant) {
        let gone: Vec<String> = self
            .state
            .keys()
            .filter(|n| !found.iter().any(|f| &f.0 == *n))
            .cloned()
            .collect();
        for name in gone {
            self.thaw(&name, now, "descriptor removed");
            self.sources.remove(&name);
            self.recent.remove(&name);
            if let Some(l) = self.state.remove(&name).and_then(|s| s.limits) {
                let _ = LimitsWriter::open(&l).and_then(|w| w.set_members(&[]));
                let _ = write_evict_mask(&l, 0);
            }
            self.publish_errors.remove(&name);
        }
    }

    /// Judges container `name` (descriptor `file`): its members (published into its limits file), what they
    /// hold and use, its `[enforce]` policy carried out. Returns its report and its members (empty when they
    /// could not be found).
    fn judge(
        &mut self,
        name: &str,
        file: &str,
        d: Result<Descriptor, descriptor::DescriptorError>,
        gpus: &[GpuSample],
        table: &ProcTable,
        now: Instant,
    ) -> (ContainerReport, BTreeSet<u32>) {
        let d = match d {
            Ok(d) => d,
            Err(e) => return (self.failed(name, file, None, e.to_string()), BTreeSet::new()),
        };
        let members = match d.members.discover(table, &mut self.members) {
            Ok(m) => m,
            Err(e) => {
                // Members unknown: publish none (each process then sees only itself), never a stale
                // list whose pids may belong to others by now.
                self.publish(name, &d.limits, &BTreeSet::new());
                self.sources.remove(name);
                return (self.failed(name, file, Some(&d), e.to_string()), BTreeSet::new());
            }
        };
        self.sources.insert(name.to_string(), d.members.clone());
        let recent = self.recent.entry(name.to_string()).or_default();
        let charged = charged_members(recent, &members, table, now, self.interval * RECENT);
        let limits = match LimitsReader::open(&d.limits) {
            Ok(r) => *r.snapshot(),
            Err(e) => {
                return (self.failed(name, file, Some(&d), format!("limits {e}")), members);
            }
        };
        let region = usage_region(name, &d, limits.usage_id().ok().flatten());
        let usage = region.as_ref().map(UsageRegion::devices);
        let dead_held: BTreeMap<u32, u64> = match (&region, &usage) {
            (Some(r), Some(u)) => u
                .iter()
                .map(|d| (d.id.index() as u32, r.dead_held(d.id)))
                .filter(|&(_, n)| n > 0)
                .collect(),
            _ => BTreeMap::new(),
        };
        let usage_words = region.as_ref().map_or((0, 0), |u| {
            (
                u.last_use_ns().load(Ordering::Acquire),
                u.waiting().load(Ordering::Acquire),
            )
        });
        let cooperative = cooperative_members(region.as_ref(), &members, table);
        let published = self.publish(name, &d.limits, &members);
        let reclaims = self.planner.settings.pinned_budget > 0;
        if limits.reclaims() != reclaims {
            if let Err(e) = write_reclaim_flag(&d.limits, reclaims) {
                cuquota_core::log!(
                    Level::Error,
                    "agent: container {name}: cannot write the reclaim flag into {}: {e}",
                    d.limits.display()
                );
            }
        }
        self.state.entry(name.to_string()).or_default().limits = Some(d.limits.clone());
        let mut c = ContainerReport::build(
            &d,
            file,
            d.members.report(),
            &charged,
            gpus,
            &limits,
            usage.as_deref(),
        );
        if let Some(m) = c.members.as_mut() {
            m.published = published;
        }
        {
            let st = self.state.entry(name.to_string()).or_default();
            st.usage_words = usage_words;
            st.dead_held = dead_held;
            st.evict_mask = limits.table.evict_mask;
            st.evict_bits = c
                .devices
                .iter()
                .map(|dev| (dev.uuid.clone(), evict_bits(&limits, &dev.uuid)))
                .collect();
        }
        c.actions = self.enforce(name, &d, &c, gpus, &charged, &cooperative, table, now);
        self.errors.remove(name);
        (c, members)
    }

    /// Carries out container `name`'s `[enforce]` policy on its report `c`; returns every action recorded for
    /// it since the last pass (thaws between passes included).
    #[allow(clippy::too_many_arguments)]
    fn enforce(
        &mut self,
        name: &str,
        d: &Descriptor,
        c: &ContainerReport,
        gpus: &[GpuSample],
        members: &BTreeSet<u32>,
        cooperative: &BTreeSet<u32>,
        table: &ProcTable,
        now: Instant,
    ) -> Vec<ActionReport> {
        let st = self.state.entry(name.to_string()).or_default();
        let mut out = std::mem::take(&mut st.carried);
        let cgroup = match &d.members {
            MemberSource::Cgroup(dir) if enforce::actuator::has_freezer(dir) => Some(dir.as_path()),
            _ => None,
        };
        let mut actions = Vec::new();
        let mut fresh = Vec::new();
        if d.enforce.sm == SmPolicy::Throttle {
            actions.extend(st.throttle.recover(members, table, cgroup));
        }
        let mem = st.memory.plan(d.enforce.memory, c, table);
        actions.extend(mem.actions);
        fresh.extend(mem.reports);
        let was_engaged = st.throttle.engaged;
        let sm = st.throttle.plan(
            d.enforce.sm,
            c,
            gpus,
            members,
            cooperative,
            table,
            cgroup,
            self.interval,
            now,
        );
        if was_engaged && !st.throttle.engaged {
            cuquota_core::log!(
                Level::Warn,
                "agent: container {name}: back under its SM limit: throttle released"
            );
        }
        actions.extend(sm.actions);
        fresh.extend(sm.reports);
        let mut done = enforce::execute(actions, members, self.actuator.as_mut());
        done.extend(fresh);
        let repeat = std::mem::take(&mut self.state.get_mut(name).expect("entry above").last_kinds);
        self.record(name, &done, &repeat);
        self.state.get_mut(name).expect("entry above").last_kinds = done.iter().map(|a| a.action).collect();
        out.extend(done);
        out
    }

    /// Elastic memory: feeds the pass's figures to the planner and writes each container's `evict_mask` where
    /// it changed (a container that could not be judged gets 0).
    fn reclaim(&mut self, gpus: &[GpuReport], containers: &[ContainerReport]) {
        let now_ns = boottime_ns();
        let free: BTreeMap<String, elastic::Gpu> = gpus
            .iter()
            .map(|g| {
                let free = g.memory_total_bytes.saturating_sub(g.memory_used_bytes);
                (g.uuid.clone(), elastic::Gpu { free })
            })
            .collect();
        let mut tenants = BTreeMap::new();
        for c in containers.iter().filter(|c| c.error.is_none()) {
            let Some(st) = self.state.get(&c.name) else {
                continue;
            };
            let (last_use_ns, word) = st.usage_words;
            let wait = elastic::decode_waiting(word, cuquota_core::region::layout::MAX_DEVICES);
            for d in &c.devices {
                let key = (c.name.clone(), d.uuid.clone());
                if d.utilization_percent.is_some_and(|u| u > 0.0) {
                    self.busy_ns.insert(key.clone(), now_ns);
                }
                let waiting = match wait {
                    // A request the GPU could not admit is promised nothing.
                    Some((e, b))
                        if d.vdevice_index == Some(e as u32) && d.memory_request_refused.is_none() =>
                    {
                        b
                    }
                    _ => 0,
                };
                tenants.insert(
                    key.clone(),
                    elastic::Tenant {
                        request: d.memory_request_bytes,
                        limit: d.memory_limit_bytes,
                        resident: d.memory_used_bytes,
                        // A dead process's charge (not reclaimed yet) is neither resident nor evicted.
                        charged: d.reported.as_ref().map(|r| {
                            let dead = d.vdevice_index.and_then(|e| st.dead_held.get(&e)).copied();
                            r.memory_used_bytes.saturating_sub(dead.unwrap_or(0))
                        }),
                        last_use_ns,
                        waiting,
                        busy_ns: self.busy_ns.get(&key).copied(),
                    },
                );
            }
        }
        self.busy_ns.retain(|k, _| tenants.contains_key(k));
        self.elastic_bytes = tenants
            .iter()
            .map(|(k, t)| (k.clone(), (t.evicted(), t.waiting)))
            .collect();
        let plan = self.planner.plan(&free, &tenants, now_ns);
        for ((name, gpu), e) in &plan.events {
            let (level, what) = match e {
                elastic::Event::Asked { bytes } => (
                    Level::Info,
                    format!("asked to evict {} (idle, above its request)", format_size(*bytes)),
                ),
                elastic::Event::Done { moved } => (
                    Level::Info,
                    format!("eviction done ({} moved)", format_size(*moved)),
                ),
                elastic::Event::TimedOut { moved: 0 } => (
                    Level::Warn,
                    "ignored the ask to evict (nothing moved before the timeout)".to_string(),
                ),
                elastic::Event::TimedOut { moved } => (
                    Level::Info,
                    format!("eviction timed out after {} moved", format_size(*moved)),
                ),
                elastic::Event::Refused { bytes, why } => (
                    Level::Debug,
                    format!("wait for {} not served: {why}", format_size(*bytes)),
                ),
                elastic::Event::FutureLastUse => (
                    Level::Debug,
                    "last_use_ns in the future: counted as now".to_string(),
                ),
            };
            if cuquota_core::log::enabled(level) {
                cuquota_core::log!(level, "agent: container {name} on {gpu}: {what}");
            }
        }
        let mut want: BTreeMap<&str, u64> = BTreeMap::new();
        for (name, gpu) in &plan.evict {
            let bits = self.state.get(name).and_then(|s| s.evict_bits.get(gpu)).copied();
            *want.entry(name.as_str()).or_default() |= bits.unwrap_or(0);
        }
        for (name, st) in self.state.iter_mut() {
            let mask = want.get(name.as_str()).copied().unwrap_or(0);
            let Some(l) = st.limits.as_ref().filter(|_| mask != st.evict_mask) else {
                continue;
            };
            match write_evict_mask(l, mask) {
                Ok(()) => st.evict_mask = mask,
                Err(e) => cuquota_core::log!(
                    Level::Error,
                    "agent: container {name}: cannot write evict_mask into {}: {e}",
                    l.display()
                ),
            }
        }
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
                    memory_request_bytes: d.memory_request_bytes,
                    // NVML counts resident bytes only (issue 39).
                    memory_resident_bytes: d.memory_used_bytes,
                    memory_evicted_bytes: self.elastic_bytes.get(&key).map_or(0, |b| b.0),
                    memory_waiting_bytes: self.elastic_bytes.get(&key).map_or(0, |b| b.1),
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

/// Set by SIGTERM / SIGINT: the agent thaws what it froze and exits.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs [`on_stop`] for SIGTERM and SIGINT (no SA_RESTART: a sleep returns early).
fn catch_stop_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction with a handler that only stores an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The processes container's judged on: its `members`, and those that exited since the last pass (seen by a
/// scan within `keep`, their pid not reused since). Notes `members` in `recent` first.
fn charged_members(
    recent: &mut BTreeMap<u32, (u64, Instant)>,
    members: &BTreeSet<u32>,
    table: &ProcTable,
    now: Instant,
    keep: Duration,
) -> BTreeSet<u32> {
    note_members(recent, members, table, now);
    recent.retain(|_, (_, seen)| now.duration_since(*seen) <= keep);
    members
        .iter()
        .copied()
        .chain(recent.iter().filter_map(|(&pid, &(st, _))| {
            let gone = table
                .procs
                .get(&pid)
                .is_none_or(|e| e.state == b'Z' && e.start_time == st);
            gone.then_some(pid)
        }))
        .collect()
}

/// Container `name`'s usage file: its own (cooperative) accounting, optional, never required. Another file
/// than the one its limits file binds (`bound`; replaced in the tenant's directory) is ignored: its figures are
/// not the container's, nor are its slots (no cooperative grace from them).
fn usage_region(name: &str, d: &Descriptor, bound: Option<FileId>) -> Option<UsageRegion> {
    let p = d.usage.as_ref()?;
    match UsageRegion::open_existing(p) {
        Ok(u) if bound.zip(u.file_id()).is_some_and(|(b, f)| !b.matches(&f)) => {
            cuquota_core::log!(
                Level::Warn,
                "agent: container {name}: usage file {} is not the one the limits file binds: ignored",
                p.display()
            );
            None
        }
        Ok(u) => Some(u),
        Err(e) => {
            cuquota_core::log!(Level::Debug, "agent: container {name}: usage {e}");
            None
        }
    }
}

/// Members that hold a live slot in the usage file (the shim is loaded: cooperative), by pid and start time.
/// The tenant can forge a slot: what that gains is bounded (throttle.rs, escalation).
fn cooperative_members(
    region: Option<&UsageRegion>,
    members: &BTreeSet<u32>,
    table: &ProcTable,
) -> BTreeSet<u32> {
    region
        .map(|u| {
            u.processes()
                .into_iter()
                .filter(|p| p.state == SlotState::Live)
                .map(|p| (if p.host_pid != 0 { p.host_pid } else { p.pid }, p.start_time))
                .filter(|(pid, st)| {
                    members.contains(pid) && table.procs.get(pid).is_some_and(|e| e.start_time == *st)
                })
                .map(|(pid, _)| pid)
                .collect()
        })
        .unwrap_or_default()
}

/// Each GPU's line of the report; `attributed`: the pids of every container's members.
fn gpu_reports(gpus: &[GpuSample], attributed: &BTreeSet<u32>) -> Vec<GpuReport> {
    gpus.iter()
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
        .collect()
}

/// Records `members` (with their start times) as seen at `now`.
fn note_members(
    recent: &mut BTreeMap<u32, (u64, Instant)>,
    members: &BTreeSet<u32>,
    table: &ProcTable,
    now: Instant,
) {
    for &pid in members {
        if let Some(e) = table.procs.get(&pid) {
            recent.insert(pid, (e.start_time, now));
        }
    }
}

/// The `evict_mask` bits of `limits` that apply on GPU `uuid`: its UUID entry; else every ordinal and `all`
/// entry (which CUDA ordinal the container gave this GPU is unknown here; eviction only moves idle memory).
fn evict_bits(limits: &LimitsSnapshot, uuid: &str) -> u64 {
    let want = parse_uuid(uuid).unwrap_or([0; 16]);
    let valid = || {
        limits
            .table
            .entries
            .iter()
            .enumerate()
            .filter(|(i, e)| *i < 64 && e.is_valid())
    };
    if let Some((i, _)) = valid().find(|(_, e)| e.selector() == DeviceSelector::Uuid(want)) {
        return 1 << i;
    }
    valid()
        .filter(|(_, e)| !matches!(e.selector(), DeviceSelector::Uuid(_)))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// Writes `mask` as the limits file `path`'s `evict_mask` (one seqlock write).
fn write_evict_mask(path: &Path, mask: u64) -> Result<(), cuquota_core::region::RegionError> {
    LimitsWriter::open(path)?
        .update(|t| {
            t.evict_mask = mask;
            Ok::<_, std::convert::Infallible>(())
        })?
        .map(|_| ())
        .map_err(|e| match e {})
}

/// Sets (`on`) or clears the limits file `path`'s [`LIMITS_FLAG_RECLAIM`]: its allocations refused for want of
/// device memory wait for this agent's reclaim only while it is set (one seqlock write).
fn write_reclaim_flag(path: &Path, on: bool) -> Result<(), cuquota_core::region::RegionError> {
    LimitsWriter::open(path)?
        .update(|t| {
            t.flags = if on {
                t.flags | LIMITS_FLAG_RECLAIM
            } else {
                t.flags & !LIMITS_FLAG_RECLAIM
            };
            Ok::<_, std::convert::Infallible>(())
        })?
        .map(|_| ())
        .map_err(|e| match e {})
}

/// CLOCK_BOOTTIME, ns (the clock of the containers' `last_use_ns`).
fn boottime_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a pointer to a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Sleeps until `t`, in slices, returning early when a stop signal arrived.
fn sleep_until(t: Instant) {
    while !STOP.load(Ordering::SeqCst) {
        let Some(left) = t.checked_duration_since(Instant::now()) else {
            return;
        };
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

impl Drop for Agent {
    /// Nothing the agent froze stays frozen, nobody stays asked to evict, when it stops (signal, error, panic).
    fn drop(&mut self) {
        self.thaw_all("the agent is stopping");
        // Nobody reclaims any more: no allocation waits for it.
        if self.planner.settings.pinned_budget > 0 {
            for l in self.state.values().filter_map(|s| s.limits.as_ref()) {
                let _ = write_reclaim_flag(l, false);
            }
        }
        for st in self.state.values_mut().filter(|s| s.evict_mask != 0) {
            if let Some(l) = &st.limits {
                if write_evict_mask(l, 0).is_ok() {
                    st.evict_mask = 0;
                }
            }
        }
    }
}

/// `cuquota agent`.
pub fn run(a: AgentArgs) -> AgentResult {
    if a.interval < Duration::from_millis(10) {
        return Err(AgentError::IntervalTooShort);
    }
    if !a.containers.is_dir() {
        return Err(AgentError::NotADirectory(a.containers));
    }
    let published = Published::default();
    if let Some(bound) = metrics::serve(&a.expose, published.clone())? {
        eprintln!("cuquota agent: serving http://{bound}/metrics");
    }
    catch_stop_signals();
    let mut agent = Agent {
        dir: a.containers,
        interval: a.interval,
        nvml: None,
        members: MemberState::default(),
        actuator: Box::new(enforce::actuator::System),
        state: BTreeMap::new(),
        last_sample_us: None,
        passes: 0,
        last_pass: None,
        gpu_seconds: BTreeMap::new(),
        last_active: BTreeMap::new(),
        actions: BTreeMap::new(),
        errors: BTreeMap::new(),
        publish_errors: BTreeMap::new(),
        sources: BTreeMap::new(),
        recent: BTreeMap::new(),
        last_scan: None,
        admission: Default::default(),
        planner: elastic::Planner::new(elastic::Settings {
            idle_ns: a.idle_threshold.as_nanos().min(u128::from(u64::MAX)) as u64,
            pinned_budget: a.pinned_host_budget,
            ..Default::default()
        }),
        busy_ns: BTreeMap::new(),
        elastic_bytes: BTreeMap::new(),
    };
    let start = Instant::now();
    for n in 1u32.. {
        if STOP.load(Ordering::SeqCst) {
            break;
        }
        match agent.pass() {
            Ok(mut r) => {
                if a.once {
                    // One pass: thaw what it froze before reporting.
                    while let Some(t) = agent.next_thaw() {
                        sleep_until(t);
                        agent.thaw_due(Instant::now().max(t));
                    }
                    for c in &mut r.containers {
                        if let Some(st) = agent.state.get_mut(&c.name) {
                            c.actions.append(&mut st.carried);
                        }
                    }
                }
                let snap = agent.snapshot(&r);
                published.set(metrics::render(&snap));
                if a.json {
                    output::print_json(&r)?;
                } else if a.once {
                    r.print_table();
                }
            }
            Err(e) if a.once => return Err(e),
            Err(e) => cuquota_core::log!(Level::Error, "{e}"),
        }
        if a.once {
            return Ok(0);
        }
        // Fixed ticks: a slow pass shortens the next wait rather than drifting. Thaws fall in between.
        // Membership scans fall in between too.
        let next = start + a.interval * n;
        let period = scan_period(a.interval);
        loop {
            let scan_at = agent.last_scan.map_or(Instant::now(), |t| t + period);
            let wake = agent.next_thaw().map_or(scan_at, |t| t.min(scan_at)).min(next);
            sleep_until(wake);
            if STOP.load(Ordering::SeqCst) || wake >= next {
                break;
            }
            let now = Instant::now();
            if agent.next_thaw().is_some_and(|t| t <= now) {
                agent.thaw_due(now);
            }
            if now >= scan_at {
                agent.scan();
            }
        }
        sleep_until(next);
    }
    agent.thaw_all("the agent was asked to stop");
    Ok(0)
}

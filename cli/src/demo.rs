//! `cuquota demo`: three tenants share one GPU — the simulated one when there is no NVIDIA driver — each with
//! its own memory cap and SM limit in its own agent limits file:
//!
//! | tenant | runs | memory cap | SM limit |
//! | --- | --- | --- | --- |
//! | train | a compute-bound kernel loop | 4 GiB | 50 %, hard |
//! | serve | the same loop | 2 GiB | 20 % hard, raised to 40 % live halfway (`cuquota limits set`) |
//! | notebook | allocate until refused, with every allocation API | 1 GiB | none |
//!
//! While they run it shows each tenant's GPU share as NVML sees it; at the end a table of what each asked for
//! and got. The programs are the bundled CUDA samples (`examples/compute_loop.cu`, `examples/oom_probe.cu`,
//! built by nvcc from PyPI), or on the simulator the C probe programs of the tests when the samples cannot be
//! built (it says which ran). Exit status 1 when a tenant did not get what it asked for.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use cuquota_core::region::{DeviceSelector, LimitsWriter};
use cuquota_core::units::format_size;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::limits::{write_all, PolicyArg};
use crate::locate;
use crate::nvml::{self, Nvml};
use crate::output::{self, parse_duration_arg, round2};
use crate::run::{GpuArgs, Machine};
use crate::{CliError, CmdResult};

/// Schema of `demo --json` (docs/schemas/demo.v1.json).
pub(crate) const SCHEMA: &str = "cuquota.demo/v1";

/// What the tenants run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum WorkloadArg {
    /// The CUDA samples when they can be built, else (simulator only) the C probe programs
    Auto,
    /// The CUDA samples compute_loop and oom_probe (nvcc from PyPI, installed into .deps/ when missing)
    Samples,
    /// The C probe programs of the tests (simulator only)
    Probes,
}

/// `cuquota demo`.
#[derive(Args)]
pub(crate) struct DemoArgs {
    /// How long the compute tenants run; the SM limit changes halfway
    #[arg(long, default_value = "20s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// What the tenants run
    #[arg(long, value_enum, default_value = "auto")]
    workload: WorkloadArg,
    /// Directory holding built samples (compute_loop, oom_probe) [default: the checkout's target/examples/cu13]
    #[arg(long, value_name = "DIR")]
    samples: Option<PathBuf>,
    /// Install nothing: build the samples only with a toolchain already in .deps/
    #[arg(long)]
    offline: bool,
    /// The report as JSON on stdout (schema cuquota.demo/v1); the progress goes to stderr
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Compute,
    Memory,
}

struct Tenant {
    name: &'static str,
    memory: u64,
    sm: Option<u32>,
    sm_after: Option<u32>,
    policy: Option<PolicyArg>,
    job: Job,
}

const GIB: u64 = 1 << 30;

const TENANTS: [Tenant; 3] = [
    Tenant {
        name: "train",
        memory: 4 * GIB,
        sm: Some(50),
        sm_after: None,
        policy: Some(PolicyArg::Hard),
        job: Job::Compute,
    },
    Tenant {
        name: "serve",
        memory: 2 * GIB,
        sm: Some(20),
        sm_after: Some(40),
        policy: Some(PolicyArg::Hard),
        job: Job::Compute,
    },
    Tenant {
        name: "notebook",
        memory: GIB,
        sm: None,
        sm_after: None,
        policy: None,
        job: Job::Memory,
    },
];

/// The programs, resolved.
enum Workload {
    Samples { compute: PathBuf, memory: PathBuf },
    Probes { compute: PathBuf, memory: PathBuf },
}

impl Workload {
    fn kind(&self) -> &'static str {
        match self {
            Workload::Samples { .. } => "samples",
            Workload::Probes { .. } => "probes",
        }
    }

    fn command(&self, job: Job, seconds: f64) -> (Command, &'static str) {
        match (self, job) {
            (Workload::Samples { compute, .. }, Job::Compute) => {
                let mut c = Command::new(compute);
                c.arg(format!("{seconds:.1}"));
                (c, "compute_loop")
            }
            (Workload::Samples { memory, .. }, Job::Memory) => (Command::new(memory), "oom_probe"),
            (Workload::Probes { compute, .. }, Job::Compute) => {
                let mut c = Command::new(compute);
                c.args(["kernel", "dlsym", &format!("{seconds:.1}"), "1000000"]);
                (c, "throttle_paths")
            }
            (Workload::Probes { memory, .. }, Job::Memory) => {
                let mut c = Command::new(memory);
                c.args(["init", "info", "fill:mem:64m"]);
                (c, "probe")
            }
        }
    }
}

/// Why the demo's programs could not be had.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    /// A build step did not start.
    #[error("{program:?}: {source}")]
    Spawn {
        /// The program.
        program: std::ffi::OsString,
        /// Why.
        source: std::io::Error,
    },
    /// A build step failed: its last line of errors.
    #[error("{program:?} failed ({status}): {last}")]
    Failed {
        /// The program.
        program: std::ffi::OsString,
        /// How it ended.
        status: std::process::ExitStatus,
        /// Its last non-empty line on stderr.
        last: String,
    },
    /// Nowhere to build the samples.
    #[error("no source checkout to build the samples in: pass --samples DIR")]
    NoCheckout,
    /// No nvcc, and no installing it.
    #[error("nvcc is not installed (scripts/setup.sh cu13) and --offline was given")]
    NoNvcc,
    /// A sample missing after the build.
    #[error("{} not found", .0.display())]
    NotFound(PathBuf),
    /// Nowhere to build the probes.
    #[error("no source checkout holding shim-tests/c")]
    NoProbeSources,
    /// No CUDA headers to build the probes with.
    #[error("NVIDIA's headers are not in .deps/ (./test.sh installs them)")]
    NoHeaders,
}

fn run_quiet(c: &mut Command) -> Result<(), DemoError> {
    let out = c.output().map_err(|source| DemoError::Spawn {
        program: c.get_program().to_os_string(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        Err(DemoError::Failed {
            program: c.get_program().to_os_string(),
            status: out.status,
            last: last.to_string(),
        })
    }
}

/// The samples: given, or built in the checkout with examples/build.sh (the setup step's cu13 group installed
/// first when missing, unless `offline`).
fn samples(a: &DemoArgs, say: &mut dyn FnMut(&str)) -> Result<Workload, DemoError> {
    let (dir, ws) = match (&a.samples, locate::source_checkout()) {
        (Some(d), _) => (d.clone(), None),
        (None, Some(ws)) => (ws.join("target/examples/cu13"), Some(ws)),
        (None, None) => return Err(DemoError::NoCheckout),
    };
    if let Some(ws) = ws {
        // The toolchain is the cu13 group of the setup step (nvcc 13.0 from PyPI, pinned).
        let ready = Command::new(ws.join("scripts/setup.sh"))
            .args(["--check", "cu13"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ready {
            if a.offline {
                return Err(DemoError::NoNvcc);
            }
            say("installing nvcc 13.0 from PyPI into .deps/ with scripts/setup.sh cu13 (first run only)…");
            run_quiet(Command::new(ws.join("scripts/setup.sh")).arg("cu13"))?;
        }
        run_quiet(Command::new(ws.join("examples/build.sh")).args(["compute_loop", "oom_probe"]))?;
    }
    let (compute, memory) = (dir.join("compute_loop"), dir.join("oom_probe"));
    for p in [&compute, &memory] {
        if !p.is_file() {
            return Err(DemoError::NotFound(p.clone()));
        }
    }
    Ok(Workload::Samples { compute, memory })
}

/// The C probe programs, compiled into `out` against NVIDIA's headers in .deps/.
fn probes(out: &Path) -> Result<Workload, DemoError> {
    let ws = locate::source_checkout().ok_or(DemoError::NoProbeSources)?;
    let inc = [
        ws.join(".deps/nvidia/cu13/include"),
        ws.join(".deps/cu13/nvidia/cu13/include"),
    ]
    .into_iter()
    .find(|d| d.join("cuda.h").is_file())
    .ok_or(DemoError::NoHeaders)?;
    let c = ws.join("shim-tests/c");
    let build = |name: &str, src: &str, defs: &[&str]| -> Result<PathBuf, DemoError> {
        let bin = out.join(name);
        let mut cmd = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
        cmd.args(["-O2", "-w"])
            .arg(format!("-I{}", inc.display()))
            .arg(format!("-I{}", c.display()))
            .args(defs)
            .arg(c.join(src))
            .arg("-o")
            .arg(&bin)
            .args(["-ldl", "-lpthread"]);
        run_quiet(&mut cmd)?;
        Ok(bin)
    };
    Ok(Workload::Probes {
        compute: build("throttle_paths", "throttle_paths.c", &[])?,
        memory: build("probe", "probe.c", &[])?,
    })
}

/// Picks and prepares the workload; the note says what runs and why.
fn workload(a: &DemoArgs, m: &Machine, say: &mut dyn FnMut(&str)) -> Result<(Workload, String), CliError> {
    let probes_ok = |why: String| -> Result<(Workload, String), CliError> {
        if !m.simulated() {
            return Err(CliError::new(format!(
                "the CUDA samples are needed on a real GPU, and they are not available: {why}"
            )));
        }
        let dir = m.dir().join("probes");
        std::fs::create_dir_all(&dir)?;
        let w = probes(&dir)
            .map_err(|e| CliError::new(format!("{why}; the probe programs cannot be built either: {e}")))?;
        Ok((
            w,
            format!("the C probe programs of the tests (throttle_paths, probe), because {why}"),
        ))
    };
    match a.workload {
        WorkloadArg::Samples => samples(a, say)
            .map(|w| {
                (
                    w,
                    "the CUDA samples compute_loop and oom_probe (nvcc 13.0, static CUDA runtime)".into(),
                )
            })
            .map_err(|e| CliError::new(format!("the CUDA samples: {e}"))),
        WorkloadArg::Probes => probes_ok("--workload probes was asked for".into()),
        WorkloadArg::Auto => match samples(a, say) {
            Ok(w) => Ok((
                w,
                "the CUDA samples compute_loop and oom_probe (nvcc 13.0, static CUDA runtime)".into(),
            )),
            Err(e) => probes_ok(format!("the CUDA samples are not available ({e})")),
        },
    }
}

/// A tenant's process and what it printed.
struct Running {
    child: Child,
    program: &'static str,
    readers: Option<(std::thread::JoinHandle<String>, std::thread::JoinHandle<String>)>,
    /// stdout and stderr, once it has exited.
    printed: Option<(String, String)>,
    exit: Option<std::process::ExitStatus>,
}

impl Running {
    /// Notes the exit and collects the output.
    fn poll(&mut self) {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        if self.exit.is_some() {
            if let Some((o, e)) = self.readers.take() {
                self.printed = Some((o.join().unwrap_or_default(), e.join().unwrap_or_default()));
            }
        }
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// What NVML saw of one tenant.
#[derive(Default, Clone)]
struct Seen {
    peak_memory: u64,
    memory: u64,
    util: f64,
    /// (sum of util × dt, sum of dt) per phase.
    phase: [(f64, f64); 2],
}

/// One tenant in the report.
#[derive(Serialize)]
pub(crate) struct TenantReport {
    name: &'static str,
    program: &'static str,
    memory_limit_bytes: u64,
    sm_limit_percent: Option<u32>,
    sm_limit_percent_after_change: Option<u32>,
    policy: &'static str,
    peak_memory_used_bytes: u64,
    /// The GPU size the tenant's program was told (cudaMemGetInfo / cuMemGetInfo total).
    memory_seen_total_bytes: Option<u64>,
    /// Where allocations were refused (bytes the program held), per allocation API.
    memory_refused_at_bytes: BTreeMap<String, u64>,
    share_first_half_percent: Option<f64>,
    share_second_half_percent: Option<f64>,
    exit_status: Option<i32>,
    ok: bool,
    verdict: String,
}

/// `demo --json`.
#[derive(Serialize)]
pub(crate) struct DemoReport {
    schema: &'static str,
    gpu: String,
    simulated: bool,
    workload: &'static str,
    workload_note: String,
    duration_ms: u64,
    /// Finding the GPU and building the programs (a first run builds or installs them).
    setup_ms: u64,
    /// Everything, setup included.
    wall_ms: u64,
    limit_change_at_ms: Option<u64>,
    tenants: Vec<TenantReport>,
}

fn metric<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines().rev().find_map(|l| {
        let l = l.strip_prefix("metric ").unwrap_or(l);
        l.strip_prefix(key)?.strip_prefix('=')
    })
}

/// The memory tenant's results: (total it was shown, refusals per API).
fn memory_results(w: &Workload, out: &str) -> (Option<u64>, BTreeMap<String, u64>) {
    let mut refused = BTreeMap::new();
    match w {
        Workload::Samples { .. } => {
            let total = metric(out, "mem_total").and_then(|v| v.parse().ok());
            for l in out.lines() {
                let Some(rest) = l.strip_prefix("metric ") else {
                    continue;
                };
                if let Some((api, v)) = rest.split_once(".stopped_at_bytes=") {
                    let err = metric(out, &format!("{api}.error")).unwrap_or("");
                    if let (Ok(b), true) = (v.parse::<u64>(), err == "cudaErrorMemoryAllocation") {
                        refused.insert(api.to_string(), b);
                    }
                }
            }
            (total, refused)
        }
        Workload::Probes { .. } => {
            let total = metric(out, "info.total").and_then(|v| v.parse().ok());
            let n: Option<u64> = metric(out, "fill.count").and_then(|v| v.parse().ok());
            if let (Some(n), Some("CUDA_ERROR_OUT_OF_MEMORY")) = (n, metric(out, "fill.rc")) {
                refused.insert("cuMemAlloc_v2".into(), n * (64 << 20));
            }
            (total, refused)
        }
    }
}

/// `cuquota demo`: set up, start the tenants, watch them, judge what each got, report.
pub(crate) fn run(a: DemoArgs) -> CmdResult {
    let started = Instant::now();
    if a.duration < Duration::from_secs(2) || a.duration > Duration::from_secs(600) {
        return Err(CliError::new("--duration must be between 2s and 10m"));
    }
    let mut say = |s: &str| {
        let _ = writeln!(std::io::stderr(), "cuquota demo: {s}");
    };
    let machine = Machine::setup(&a.gpu, "demo")?;
    let (work, note) = workload(&a, &machine, &mut say)?;
    let nvml: Nvml = machine
        .nvml()
        .map_err(|e| CliError::new(format!("demo: NVML: {e}")))?;
    let setup = started.elapsed();
    let mut screen = Screen::new(a.json);
    screen.line(&format!(
        "cuquota demo: 3 tenants share {} for {:.0} s; they run {note}.",
        machine.describe(),
        a.duration.as_secs_f64()
    ));
    let procs = start_tenants(&machine, &work, a.duration.as_secs_f64())?;
    let watched = watch(&a, &machine, &work, &nvml, procs, &mut screen)?;
    screen.finish();
    let tenants = TENANTS
        .iter()
        .zip(&watched.seen)
        .zip(watched.procs)
        .map(|((tn, s), p)| judge(tn, s, p, &work))
        .collect();
    let report = DemoReport {
        schema: SCHEMA,
        gpu: machine.describe(),
        simulated: machine.simulated(),
        workload: work.kind(),
        workload_note: note,
        duration_ms: a.duration.as_millis() as u64,
        setup_ms: setup.as_millis() as u64,
        wall_ms: started.elapsed().as_millis() as u64,
        limit_change_at_ms: watched.changed_at.map(|c| c.as_millis() as u64),
        tenants,
    };
    let ok = report.tenants.iter().all(|t| t.ok);
    if a.json {
        output::print_json(&report)?;
    } else {
        print_summary(&report);
    }
    Ok(if ok { 0 } else { 1 })
}

/// One tenant's line of the live progress: its share as a bar, or (the memory tenant, done) a sentence.
enum Line {
    Share { label: String, pct: f64, rest: String },
    Text(String),
}

/// The live block on a terminal: a clock and a bar per tenant (indicatif redraws them in place).
struct Live {
    multi: MultiProgress,
    clock: ProgressBar,
    tenants: Vec<ProgressBar>,
}

/// Where the progress goes: on a terminal the live block on stdout; elsewhere (a pipe, CI, or stderr under
/// `--json`) plain lines, a short one every 2 s.
struct Screen {
    out: Box<dyn Write>,
    live: Option<Live>,
    /// When the last line was printed off a terminal.
    last_line: Duration,
}

impl Screen {
    fn new(json: bool) -> Screen {
        let out: Box<dyn Write> = if json {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        };
        let live = (!json && std::io::stdout().is_terminal()).then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let clock = multi.add(ProgressBar::no_length().with_style(Self::style("  {msg}")));
            let share = Self::style("  {prefix} {bar:20} {msg}").progress_chars("█░");
            let tenants = TENANTS
                .iter()
                .map(|_| multi.add(ProgressBar::new(1000).with_style(share.clone())))
                .collect();
            Live {
                multi,
                clock,
                tenants,
            }
        });
        Screen {
            out,
            live,
            last_line: Duration::ZERO,
        }
    }

    fn style(template: &str) -> ProgressStyle {
        ProgressStyle::with_template(template).expect("a valid indicatif template")
    }

    /// A line that stays: on a terminal above the live block.
    fn line(&mut self, s: &str) {
        match &self.live {
            Some(l) => {
                let _ = l.multi.println(s);
            }
            None => {
                let _ = writeln!(self.out, "{s}");
            }
        }
    }

    /// One progress update at `t`: on a terminal the live block, else `short` every 2 s.
    fn progress(&mut self, t: Duration, secs: f64, lines: Vec<Line>, short: impl FnOnce() -> String) {
        if let Some(l) = &self.live {
            l.clock
                .set_message(format!("t = {:4.1} s of {secs:.0} s", t.as_secs_f64()));
            for (pb, line) in l.tenants.iter().zip(lines) {
                match line {
                    Line::Share { label, pct, rest } => {
                        pb.set_prefix(label);
                        pb.set_position((pct * 10.0).round().clamp(0.0, 1000.0) as u64);
                        pb.set_message(rest);
                    }
                    Line::Text(text) => {
                        pb.set_style(Self::style("  {msg}"));
                        pb.set_message(text);
                    }
                }
            }
        } else if t >= self.last_line + Duration::from_secs(2) {
            self.last_line = t;
            let _ = writeln!(self.out, "{:5.1}s  {}", t.as_secs_f64(), short());
            let _ = self.out.flush();
        }
    }

    /// Leaves the live block drawn as it last was, for what is printed after it.
    fn finish(self) {
        if let Some(l) = self.live {
            l.clock.abandon();
            for pb in &l.tenants {
                pb.abandon();
            }
        }
    }
}

/// Starts each tenant with its own limits file (the agent's, changed live later) and usage file.
fn start_tenants(machine: &Machine, work: &Workload, secs: f64) -> Result<Vec<Running>, CliError> {
    let mut procs = Vec::new();
    for t in &TENANTS {
        let limits = machine.dir().join(format!("{}.limits", t.name));
        write_all(&limits, Some(t.memory), t.sm, t.policy)?;
        let mut extra: Vec<(OsString, OsString)> = vec![
            ("CUQUOTA_LIMITS_FILE".into(), limits.into_os_string()),
            (
                "CUQUOTA_USAGE_FILE".into(),
                machine.dir().join(format!("{}.usage", t.name)).into_os_string(),
            ),
        ];
        if machine.simulated() {
            extra.push(("CQ_SAMPLES_SIMULATED".into(), "1".into()));
        }
        let (mut cmd, program) = work.command(t.job, secs);
        cmd.env_clear()
            .envs(machine.env(&extra))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| CliError::new(format!("demo: start {program}: {e}")))?;
        let out = reader(child.stdout.take().expect("piped"));
        let err = reader(child.stderr.take().expect("piped"));
        procs.push(Running {
            child,
            program,
            readers: Some((out, err)),
            printed: None,
            exit: None,
        });
    }
    Ok(procs)
}

/// What watching the tenants found.
struct Watched {
    procs: Vec<Running>,
    seen: Vec<Seen>,
    changed_at: Option<Duration>,
}

/// NVML's view of every process on every GPU, by pid.
#[derive(Default)]
struct Sample {
    /// Device memory, bytes.
    mem: BTreeMap<u32, u64>,
    /// Utilisation since the last sample, percent.
    util: BTreeMap<u32, f64>,
}

fn sample(nvml: &Nvml, since_us: u64) -> Result<Sample, CliError> {
    let Sample { mut mem, mut util } = Sample::default();
    for g in nvml.gpus()? {
        for (pid, b) in nvml.processes(&g)? {
            *mem.entry(pid).or_default() += b;
        }
        if let Ok(u) = nvml.process_utilization(&g, since_us) {
            for (pid, s) in u {
                *util.entry(pid).or_default() += s;
            }
        }
    }
    Ok(Sample { mem, util })
}

/// Raises each tenant's SM limit that changes halfway, in its limits file, as the agent would.
fn change_limits_live(machine: &Machine, t: Duration, screen: &mut Screen) -> Result<(), CliError> {
    for tn in &TENANTS {
        if let Some(after) = tn.sm_after {
            let file = machine.dir().join(format!("{}.limits", tn.name));
            LimitsWriter::open(&file)?.update(|tb| -> Result<(), CliError> {
                tb.entry_mut(DeviceSelector::All)?.sm_limit = after;
                Ok(())
            })??;
            screen.line(&format!(
                "{:5.1}s  {}'s SM limit raised {}% → {after}% live (cuquota limits set on its limits file)",
                t.as_secs_f64(),
                tn.name,
                tn.sm.unwrap_or(0)
            ));
        }
    }
    Ok(())
}

/// Samples NVML every 500 ms until every tenant has exited (or the duration + 30 s, then kills them), changing
/// the limits halfway and drawing the progress.
fn watch(
    a: &DemoArgs,
    machine: &Machine,
    work: &Workload,
    nvml: &Nvml,
    mut procs: Vec<Running>,
    screen: &mut Screen,
) -> Result<Watched, CliError> {
    let secs = a.duration.as_secs_f64();
    let t0 = Instant::now();
    let half = a.duration / 2;
    let mut changed_at: Option<Duration> = None;
    let mut seen = vec![Seen::default(); TENANTS.len()];
    let mut last_tick = t0;
    let mut last_us = nvml::realtime_us();
    let deadline = a.duration + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = Instant::now();
        let t = now - t0;
        let dt = (now - last_tick).as_secs_f64();
        last_tick = now;
        let since = last_us;
        last_us = nvml::realtime_us();
        let Sample { mem, util } = sample(nvml, since)?;
        for (p, s) in procs.iter_mut().zip(seen.iter_mut()) {
            p.poll();
            let pid = p.child.id();
            s.memory = mem.get(&pid).copied().unwrap_or(0);
            s.peak_memory = s.peak_memory.max(s.memory);
            s.util = util.get(&pid).copied().unwrap_or(0.0).min(100.0);
            // Phases skip a second after each start (CUDA start-up, the limit change reaching NVML's window).
            let phase = if t > Duration::from_secs(1) && t <= half {
                Some(0)
            } else if changed_at.is_some_and(|c| t > c + Duration::from_secs(1)) && t <= a.duration {
                Some(1)
            } else {
                None
            };
            if let (Some(ph), None) = (phase, p.exit) {
                s.phase[ph].0 += s.util * dt;
                s.phase[ph].1 += dt;
            }
        }
        if changed_at.is_none() && t >= half {
            change_limits_live(machine, t, screen)?;
            changed_at = Some(t);
        }
        let lines = progress_lines(work, &procs, &seen, changed_at.is_some());
        screen.progress(t, secs, lines, || short_progress(work, &procs, &seen));
        if procs.iter().all(|p| p.exit.is_some()) {
            break;
        }
        if t > deadline {
            for p in procs.iter_mut().filter(|p| p.exit.is_none()) {
                let _ = p.child.kill();
                p.exit = p.child.wait().ok();
                p.poll();
            }
            break;
        }
    }
    Ok(Watched {
        procs,
        seen,
        changed_at,
    })
}

/// The live block's lines: per tenant its share bar and memory, or where the memory tenant was refused.
fn progress_lines(work: &Workload, procs: &[Running], seen: &[Seen], changed: bool) -> Vec<Line> {
    TENANTS
        .iter()
        .zip(seen)
        .zip(procs)
        .map(|((tn, s), p)| {
            if let (Job::Memory, Some((out, _))) = (tn.job, &p.printed) {
                let (total, refused) = memory_results(work, out);
                return Line::Text(format!(
                    "{:<9} cap {}: told the GPU has {}; {} allocation API(s) refused at ≤ {}",
                    tn.name,
                    format_size(tn.memory),
                    total.map_or_else(|| "?".into(), format_size),
                    refused.len(),
                    format_size(refused.values().max().copied().unwrap_or(0))
                ));
            }
            let limit = if changed { tn.sm_after.or(tn.sm) } else { tn.sm };
            let lim = limit.map_or_else(|| "no SM limit".to_string(), |l| format!("SM {l:>2}% hard"));
            let state = if p.exit.is_some() { " (done)" } else { "" };
            Line::Share {
                label: format!("{:<9} {:<12}", tn.name, lim),
                pct: s.util,
                rest: format!(
                    "{:>5.1}%  mem {:>8} of {}{state}",
                    s.util,
                    format_size(s.memory),
                    format_size(tn.memory)
                ),
            }
        })
        .collect()
}

/// The progress line off a terminal: each tenant's share, or where the memory tenant was refused.
fn short_progress(work: &Workload, procs: &[Running], seen: &[Seen]) -> String {
    let parts: Vec<String> = TENANTS
        .iter()
        .zip(seen)
        .zip(procs)
        .map(|((tn, s), p)| match (tn.job, &p.printed) {
            (Job::Memory, Some((out, _))) => {
                let (_, refused) = memory_results(work, out);
                let at = refused.values().max().copied().unwrap_or(0);
                format!("{} refused at {}", tn.name, format_size(at))
            }
            (Job::Memory, None) => format!("{} allocating", tn.name),
            _ => format!("{} {:.1}%", tn.name, s.util),
        })
        .collect();
    parts.join("  ·  ")
}

/// What is wrong with what a compute tenant got: each phase's share within [limit − 10, limit + 5].
fn compute_problems(tn: &Tenant, first: Option<f64>, second: Option<f64>) -> Vec<String> {
    let mut problems = Vec::new();
    for (share, limit) in [(first, tn.sm), (second, tn.sm_after.or(tn.sm))] {
        if let Some(l) = limit {
            let l = f64::from(l);
            match share {
                Some(v) if v >= l - 10.0 && v <= l + 5.0 => {}
                Some(v) => problems.push(format!("share {v:.1}% is not within [{}, {}]", l - 10.0, l + 5.0)),
                None => problems.push("no share measured".into()),
            }
        }
    }
    problems
}

/// What is wrong with what the memory tenant got: told its cap as the GPU's size, refused just under it.
fn memory_problems(tn: &Tenant, seen_total: Option<u64>, refused: &BTreeMap<String, u64>) -> Vec<String> {
    let mut problems = Vec::new();
    if seen_total != Some(tn.memory) {
        problems.push(format!(
            "it was told the GPU has {seen_total:?} bytes, not its cap"
        ));
    }
    if refused.is_empty() {
        problems.push("no allocation was refused".into());
    }
    for (api, b) in refused {
        if *b > tn.memory || *b < tn.memory / 2 {
            problems.push(format!(
                "{api} refused at {}, not just under the cap",
                format_size(*b)
            ));
        }
    }
    problems
}

/// What a tenant got, judged against what it asked for.
fn judge(tn: &Tenant, s: &Seen, p: Running, work: &Workload) -> TenantReport {
    let (out, err) = p.printed.clone().unwrap_or_default();
    let avg = |ph: usize| (s.phase[ph].1 > 0.5).then(|| round2(s.phase[ph].0 / s.phase[ph].1));
    let (first, second) = (avg(0), avg(1));
    let code = p.exit.and_then(|e| e.code());
    let (seen_total, refused) = if tn.job == Job::Memory {
        memory_results(work, &out)
    } else {
        (None, BTreeMap::new())
    };
    let mut problems = Vec::new();
    if code != Some(0) {
        let last = err
            .lines()
            .chain(out.lines())
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        problems.push(format!("{} exited {:?}: {}", p.program, p.exit, last.trim()));
    }
    problems.extend(match tn.job {
        Job::Compute => compute_problems(tn, first, second),
        Job::Memory => memory_problems(tn, seen_total, &refused),
    });
    let verdict = if !problems.is_empty() {
        problems.join("; ")
    } else {
        match tn.job {
            Job::Compute => match (tn.sm, tn.sm_after) {
                (Some(b), Some(x)) => format!(
                    "held at {b}% then {x}% after the live change ({:.1}% → {:.1}%)",
                    first.unwrap_or(0.0),
                    second.unwrap_or(0.0)
                ),
                (Some(b), None) => format!(
                    "held at {b}% ({:.1}%, {:.1}%)",
                    first.unwrap_or(0.0),
                    second.unwrap_or(0.0)
                ),
                _ => "ran".into(),
            },
            Job::Memory => {
                let most = refused.values().max().copied().unwrap_or(0);
                let apis = match refused.len() {
                    1 => refused.keys().next().cloned().unwrap_or_default(),
                    n => format!("all {n} allocation APIs"),
                };
                format!(
                    "saw a {} GPU; {apis} refused at ≤ {} (+ its context = the cap)",
                    format_size(tn.memory),
                    format_size(most)
                )
            }
        }
    };
    TenantReport {
        name: tn.name,
        program: p.program,
        memory_limit_bytes: tn.memory,
        sm_limit_percent: tn.sm,
        sm_limit_percent_after_change: tn.sm_after,
        policy: tn.policy.map_or("default", PolicyArg::name),
        peak_memory_used_bytes: s.peak_memory,
        memory_seen_total_bytes: seen_total,
        memory_refused_at_bytes: refused,
        share_first_half_percent: first,
        share_second_half_percent: second,
        exit_status: code,
        ok: problems.is_empty(),
        verdict,
    }
}

fn print_summary(r: &DemoReport) {
    println!();
    let rows: Vec<[String; 7]> = r
        .tenants
        .iter()
        .map(|t| {
            let sm = match (t.sm_limit_percent, t.sm_limit_percent_after_change) {
                (Some(a), Some(b)) => format!("{a}% → {b}% {}", t.policy),
                (Some(a), None) => format!("{a}% {}", t.policy),
                _ => "none".into(),
            };
            let refused = t
                .memory_refused_at_bytes
                .values()
                .max()
                .map_or_else(|| "-".into(), |b| format!("at {}", format_size(*b)));
            [
                t.name.to_string(),
                t.program.to_string(),
                format_size(t.memory_limit_bytes),
                sm,
                output::share_or_dash(t.share_first_half_percent),
                output::share_or_dash(t.share_second_half_percent),
                refused,
            ]
        })
        .collect();
    output::print_table(
        &[
            "TENANT",
            "RUNS",
            "MEMORY CAP",
            "SM LIMIT",
            "SHARE 1ST HALF",
            "SHARE 2ND HALF",
            "ALLOCATIONS REFUSED",
        ],
        &rows,
    );
    println!();
    for t in &r.tenants {
        println!(
            "  {} {:<9} {}",
            if t.ok { "OK  " } else { "FAIL" },
            t.name,
            t.verdict
        );
    }
    println!(
        "\nOn {}; {:.1} s in all. Shares are NVML's per-process utilisation over each half (the first second \
         of each left out); each tenant's cap is the GPU size it is told.",
        r.gpu,
        r.wall_ms as f64 / 1000.0
    );
    println!("Next: cuquota run --memory 1g --sm 30 -- <your CUDA program>   (cuquota --help for the rest)");
}

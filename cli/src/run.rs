//! `cuquota run [--memory SIZE] [--sm PCT] [--policy P] [--device N|UUID …] -- CMD ARGS…`: runs CMD with
//! `libcuquota.so` preloaded and the limits in its environment, on the NVIDIA driver when there is one and on
//! the simulated GPU otherwise (said on stderr). Exits with CMD's status (128+N when signal N killed it).
//!
//! `cuquota run` makes itself a child subreaper, so every descendant of CMD stays its descendant (an orphan is
//! re-parented to it, not to init): the node agent's `subtree = <pid of cuquota run>` membership (with its
//! `subtree_start`, the start time in `/proc/<pid>/stat`) covers the whole process tree. It exits when CMD and every descendant CMD left behind have exited (with CMD's
//! status), so a daemonised child never outlives the tree it belongs to. Signals sent to `cuquota run` (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
//! SIGWINCH) are forwarded to CMD; those the terminal sends reach CMD directly (same process group) and are not
//! sent twice.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use cuquota_core::units::{format_size, parse_size, parse_unsigned};
use cuquota_core::PolicyKind;

use crate::limits::PolicyArg;
use crate::locate;
use crate::output::{parse_size_arg, parse_sm_arg};
use crate::{CliError, CmdResult};

/// Exit code when `cuquota run` itself fails before CMD runs (as `env`, `timeout` and `docker run` do).
const EXIT_SETUP: u8 = 125;

/// Where programs run: the NVIDIA driver or the simulated GPU, and the libraries.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct GpuArgs {
    /// Use the simulated GPU even if an NVIDIA driver is installed
    #[arg(long)]
    pub sim: bool,
    /// Number of simulated devices (implies --sim) [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub sim_devices: Option<u32>,
    /// Memory of each simulated device (implies --sim) [default: 16g]
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub sim_memory: Option<u64>,
    /// libcuquota.so to preload [default: next to cuquota, or its lib/cuquota/]
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
    /// libcudasim.so, the simulated GPU [default: next to cuquota, or its lib/cuquota/]
    #[arg(long, value_name = "PATH")]
    pub simulator: Option<PathBuf>,
}

/// `cuquota run`.
#[derive(Args)]
#[command(after_help = "\
Limits already in the environment (CUDA_DEVICE_MEMORY_LIMIT[_i], CUQUOTA_SM_LIMIT[_i], …) are only ever \
lowered, never raised. The exit status is CMD's (128+N if signal N killed it; 125 if cuquota could not start \
it, 126 if CMD is not executable, 127 if it is not found).")]
pub(crate) struct RunArgs {
    /// Device-memory cap per GPU, in HAMi's syntax (4g, 3000m)
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    memory: Option<u64>,
    /// Guaranteed memory per GPU (the Kubernetes request), at most --memory (CUQUOTA_MEMORY_REQUEST); shown,
    /// not yet acted on
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "memory")]
    memory_request: Option<u64>,
    /// SM-time share per GPU in percent, 1-99 (0 or 100 = no limit)
    #[arg(long, value_name = "PERCENT", value_parser = parse_sm_arg)]
    sm: Option<u32>,
    /// SM policy
    #[arg(long)]
    policy: Option<PolicyArg>,
    /// The GPU(s) CMD sees, by index or GPU-/MIG- UUID (repeat or comma-separate; sets CUDA_VISIBLE_DEVICES)
    #[arg(long, value_name = "N|UUID", value_delimiter = ',')]
    device: Vec<String>,
    /// The container's usage file (shared by CMD's processes) [default: $CUQUOTA_USAGE_FILE, else a fresh one
    /// for this run]
    #[arg(long, value_name = "FILE")]
    usage: Option<PathBuf>,
    /// An agent limits file to apply too (CUQUOTA_LIMITS_FILE; change it live with `cuquota limits set`)
    #[arg(long, value_name = "FILE")]
    limits: Option<PathBuf>,
    /// Do not say on stderr that the simulated GPU is used
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    gpu: GpuArgs,
    /// The program and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// What programs run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The NVIDIA driver (`libcuda.so.1` loads and is not the simulator).
    Driver,
    /// The simulated GPU set up by cuquota: `devices` × `memory` bytes.
    Simulator { devices: u32, memory: u64 },
    /// The simulator is already what `libcuda.so.1` resolves to (the caller set up LD_LIBRARY_PATH).
    SimulatorOnPath,
}

/// The GPU side of a launch: the shim, the backend, a private directory, and the variables every program
/// needs to reach the (simulated) GPU.
pub(crate) struct Machine {
    /// libcuquota.so.
    pub shim: PathBuf,
    /// The backend.
    pub backend: Backend,
    /// libcudasim.so, when cuquota set the simulator up.
    simulator: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    dir: tempfile::TempDir,
}

/// `libcuda.so.1` as the dynamic loader finds it now: None if it does not load; Some(true) if it is the
/// simulator.
fn probe_driver() -> Option<bool> {
    // SAFETY: NUL-terminated names; the handle is closed again.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let sim = !libc::dlsym(h, c"cudasimDeviceBusyNs".as_ptr()).is_null();
        libc::dlclose(h);
        Some(sim)
    }
}

impl Machine {
    /// Finds the libraries and picks the backend (`tag` names the private directory).
    pub(crate) fn setup(a: &GpuArgs, tag: &str) -> Result<Machine, CliError> {
        let shim = locate::library(locate::SHIM, a.library.as_deref())?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("cuquota-{tag}-"))
            .tempdir()
            .map_err(|e| CliError::new(format!("cannot create a temporary directory: {e}")))?;
        let want_sim = a.sim || a.sim_devices.is_some() || a.sim_memory.is_some();
        let found = probe_driver();
        if !want_sim {
            match found {
                Some(false) => {
                    return Ok(Machine {
                        shim,
                        backend: Backend::Driver,
                        simulator: None,
                        env: Vec::new(),
                        dir,
                    })
                }
                Some(true) => {
                    return Ok(Machine {
                        shim,
                        backend: Backend::SimulatorOnPath,
                        simulator: None,
                        env: Vec::new(),
                        dir,
                    })
                }
                None => {}
            }
        }
        let sim = locate::library(locate::SIMULATOR, a.simulator.as_deref())?;
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib)?;
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            std::os::unix::fs::symlink(&sim, lib.join(name))?;
        }
        let mut ld = lib.into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        let devices = a.sim_devices.unwrap_or(1);
        let memory = a.sim_memory.unwrap_or(16 << 30);
        let env = vec![
            ("LD_LIBRARY_PATH".into(), ld),
            (
                "CUDASIM_STATE".into(),
                dir.path().join("sim.state").into_os_string(),
            ),
            ("CUDASIM_DEVICES".into(), devices.to_string().into()),
            ("CUDASIM_MEMORY".into(), memory.to_string().into()),
        ];
        Ok(Machine {
            shim,
            backend: Backend::Simulator { devices, memory },
            simulator: Some(sim),
            env,
            dir,
        })
    }

    /// Whether programs run on the simulator.
    pub(crate) fn simulated(&self) -> bool {
        self.backend != Backend::Driver
    }

    /// The machine's private directory (removed when it is dropped).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// One phrase for messages: "the simulated GPU (1 device of 16 GiB)".
    pub(crate) fn describe(&self) -> String {
        match &self.backend {
            Backend::Driver => "the NVIDIA driver".into(),
            Backend::Simulator { devices, memory } => format!(
                "the simulated GPU ({devices} device{} of {}, {})",
                if *devices == 1 { "" } else { "s" },
                format_size(*memory),
                locate::SIMULATOR
            ),
            Backend::SimulatorOnPath => {
                "the simulated GPU (libcuda.so.1 on the library path is cuquota's simulator)".into()
            }
        }
    }

    /// NVML of this machine, in this process: the simulator's (after giving this process the simulator's
    /// variables, so it sees the same GPU as the programs) or the driver's.
    pub(crate) fn nvml(&self) -> Result<crate::nvml::Nvml, crate::nvml::NvmlError> {
        match &self.simulator {
            Some(sim) => {
                for (k, v) in &self.env {
                    if k.as_bytes().starts_with(b"CUDASIM_") {
                        // Single-threaded at this point: no other thread reads the environment.
                        std::env::set_var(k, v);
                    }
                }
                crate::nvml::Nvml::load_path(&sim.to_string_lossy())
            }
            None => crate::nvml::Nvml::load(),
        }
    }

    /// The environment for a program under cuquota: this process's, plus the preload and the backend's
    /// variables, plus `extra`.
    pub(crate) fn env(&self, extra: &[(OsString, OsString)]) -> BTreeMap<OsString, OsString> {
        let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let mut preload = self.shim.clone().into_os_string();
        if let Some(old) = env.get(OsStr::new("LD_PRELOAD")).filter(|v| !v.is_empty()) {
            if !old
                .as_bytes()
                .split(|b| *b == b':' || *b == b' ')
                .any(|p| p == preload.as_bytes())
            {
                preload.push(":");
                preload.push(old);
            } else {
                preload = old.clone();
            }
        }
        env.insert("LD_PRELOAD".into(), preload);
        for (k, v) in self.env.iter().chain(extra) {
            env.insert(k.clone(), v.clone());
        }
        env
    }
}

/// Lowers every limit variable of one kind in `env` to at most `limit`, and sets the global HAMi name to it:
/// `names` are the HAMi and cuquota names (`CUDA_DEVICE_MEMORY_LIMIT`, `CUQUOTA_MEMORY_LIMIT`), each also with
/// `_<i>`. `parse` reads an existing value's number; `unlimited` says whether it means "no limit". A
/// per-device 0 falls back to the global value (HAMi), which is lowered too. Unparsable values are left alone:
/// the shim refuses them (fail closed).
fn tighten(
    env: &mut BTreeMap<OsString, OsString>,
    names: [&str; 2],
    limit: u64,
    parse: impl Fn(&str) -> Option<u64>,
    unlimited: impl Fn(u64) -> bool,
) {
    let is_global = |k: &[u8]| names.iter().any(|n| k == n.as_bytes());
    let is_device = |k: &[u8]| {
        names.iter().any(|n| {
            k.strip_prefix(n.as_bytes())
                .and_then(|r| r.strip_prefix(b"_"))
                .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
        })
    };
    for (k, v) in env.iter_mut() {
        let (global, device) = (is_global(k.as_bytes()), is_device(k.as_bytes()));
        if !global && !device {
            continue;
        }
        let Some(cur) = v.to_str().and_then(&parse) else {
            continue;
        };
        if device && cur == 0 {
            continue;
        }
        if unlimited(cur) || cur > limit {
            *v = limit.to_string().into();
        }
    }
    let global = OsString::from(names[0]);
    match env.get(OsStr::new(names[1])).cloned() {
        // Both names must agree (the shim refuses a disagreement): the cuquota name, already lowered, wins.
        Some(v) => {
            env.insert(global, v);
        }
        None => {
            env.entry(global).or_insert_with(|| limit.to_string().into());
        }
    }
}

/// Whether `k=v` sets an SM share (a percentage 1-99 under any SM limit name).
fn is_sm_share(k: &OsStr, v: &OsStr) -> bool {
    let k = k.as_bytes();
    let named = ["CUDA_DEVICE_SM_LIMIT", "CUQUOTA_SM_LIMIT"].iter().any(|n| {
        k.strip_prefix(n.as_bytes())
            .is_some_and(|r| r.is_empty() || r.starts_with(b"_"))
    });
    named
        && v.to_str()
            .and_then(|v| parse_unsigned(v).ok())
            .is_some_and(|p| (1..100).contains(&p))
}

/// Limits and devices for a program, applied to its environment.
#[derive(Default, Clone)]
pub(crate) struct Limits {
    /// Memory cap, bytes (0 = none).
    pub memory: Option<u64>,
    /// Memory request, bytes (0 = none: the cap).
    pub memory_request: Option<u64>,
    /// SM share, percent (0 = none).
    pub sm: Option<u32>,
    /// SM policy.
    pub policy: Option<PolicyArg>,
}

impl Limits {
    /// Applies the limits to `env`, only ever lowering what is there.
    pub(crate) fn apply(&self, env: &mut BTreeMap<OsString, OsString>) -> Result<(), CliError> {
        if let Some(m) = self.memory.filter(|m| *m != 0) {
            tighten(
                env,
                ["CUDA_DEVICE_MEMORY_LIMIT", "CUQUOTA_MEMORY_LIMIT"],
                m,
                |s| parse_size(s).ok(),
                |v| v == 0,
            );
        }
        if let Some(r) = self.memory_request.filter(|r| *r != 0) {
            if let Some(m) = self.memory.filter(|m| *m != 0 && r > *m) {
                return Err(CliError::new(format!(
                    "--memory-request {} is above --memory {}: a request is at most the limit",
                    format_size(r),
                    format_size(m)
                )));
            }
            // Never above the cap in force (a lower one already in the environment): the shim refuses that.
            let cap = env
                .get(OsStr::new("CUDA_DEVICE_MEMORY_LIMIT"))
                .and_then(|v| v.to_str())
                .and_then(|v| parse_size(v).ok())
                .filter(|m| *m != 0);
            let r = cap.map_or(r, |m| r.min(m));
            let name = "CUQUOTA_MEMORY_REQUEST";
            tighten(env, [name, name], r, |s| parse_size(s).ok(), |v| v == 0);
        }
        if let Some(s) = self.sm.filter(|s| *s != 0) {
            tighten(
                env,
                ["CUDA_DEVICE_SM_LIMIT", "CUQUOTA_SM_LIMIT"],
                u64::from(s),
                |v| parse_unsigned(v).ok(),
                |v| v == 0 || v >= 100,
            );
        }
        if let Some(p) = self.policy {
            if let Some(v) = env.get(OsStr::new("GPU_CORE_UTILIZATION_POLICY")) {
                return Err(CliError::new(format!(
                    "GPU_CORE_UTILIZATION_POLICY={} is already set: unset it or leave out --policy",
                    v.to_string_lossy()
                )));
            }
            // Only ever stricter: `hard` stays hard, and `disabled` would drop a share already set.
            let rank = |k: PolicyKind| match k {
                PolicyKind::Disabled => 0,
                PolicyKind::Default | PolicyKind::Burst => 1,
                PolicyKind::Hard => 2,
            };
            if let Some(v) = env.get(OsStr::new("CUQUOTA_POLICY")) {
                let cur = v.to_str().and_then(PolicyKind::parse);
                if cur.is_some_and(|c| rank(p.kind()) < rank(c)) {
                    return Err(CliError::new(format!(
                        "CUQUOTA_POLICY={} is already set: --policy {} would loosen it",
                        v.to_string_lossy(),
                        p.name()
                    )));
                }
            }
            if p.kind() == PolicyKind::Disabled {
                if let Some((k, v)) = env.iter().find(|(k, v)| is_sm_share(k, v)) {
                    return Err(CliError::new(format!(
                        "{}={} is set: --policy disabled would drop that SM limit",
                        k.to_string_lossy(),
                        v.to_string_lossy()
                    )));
                }
            }
            env.insert("CUQUOTA_POLICY".into(), p.name().into());
        }
        Ok(())
    }
}

/// `--device` entries → CUDA_VISIBLE_DEVICES, composed with one already set (indices then select from it).
fn visible_devices(devs: &[String], current: Option<&OsStr>) -> Result<OsString, CliError> {
    let current: Option<Vec<String>> = current
        .and_then(OsStr::to_str)
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let mut out = Vec::new();
    for d in devs {
        let d = d.trim();
        let is_uuid = d.starts_with("GPU-") || d.starts_with("MIG-");
        if !is_uuid && (d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit())) {
            return Err(CliError::new(format!(
                "--device {d:?}: expected a device index or a GPU-/MIG- UUID"
            )));
        }
        match &current {
            None => out.push(d.to_string()),
            Some(cur) if is_uuid => {
                if !cur.iter().any(|c| c.starts_with(d) || d.starts_with(c.as_str())) {
                    return Err(CliError::new(format!(
                        "--device {d}: not among the devices this environment may use (CUDA_VISIBLE_DEVICES={})",
                        cur.join(",")
                    )));
                }
                out.push(d.to_string());
            }
            Some(cur) => {
                let i: usize = d
                    .parse()
                    .map_err(|_| CliError::new(format!("--device {d}: bad index")))?;
                let c = cur.get(i).ok_or_else(|| {
                    CliError::new(format!(
                        "--device {d}: this environment sees only {} device(s) (CUDA_VISIBLE_DEVICES={})",
                        cur.len(),
                        cur.join(",")
                    ))
                })?;
                out.push(c.clone());
            }
        }
    }
    Ok(out.join(",").into())
}

/// Makes this process a child subreaper: orphaned descendants are re-parented to it.
pub(crate) fn become_subreaper() -> Result<(), CliError> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(CliError::new(format!(
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Signals forwarded to CMD.
const FORWARDED: [libc::c_int; 7] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// Runs `cmd` to its end, forwarding signals and reaping adopted orphans, and then waits for every
/// descendant CMD left behind (a daemonised child holding the GPU stays in the agent's `subtree` only while
/// this process, its subreaper, lives); returns CMD's exit code. The signals must be blocked before `cmd` is
/// spawned (so none is lost between spawn and wait).
fn supervise(child: u32, set: &libc::sigset_t) -> u8 {
    let child = child as libc::pid_t;
    let mut code: Option<u8> = None;
    loop {
        // SAFETY: a zeroed siginfo is a valid out-buffer; the set holds blocked signals.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid set and out-pointer.
        let sig = unsafe { libc::sigwaitinfo(set, &mut info) };
        if sig < 0 {
            continue; // EINTR
        }
        if sig == libc::SIGCHLD {
            loop {
                let mut status = 0;
                // SAFETY: valid out-pointer.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid < 0 {
                    if let Some(c) = code {
                        return c; // ECHILD: CMD and everything it left behind are gone
                    }
                }
                if pid <= 0 {
                    break;
                }
                if pid == child {
                    code = Some(if libc::WIFEXITED(status) {
                        libc::WEXITSTATUS(status) as u8
                    } else if libc::WIFSIGNALED(status) {
                        (128 + libc::WTERMSIG(status)).min(255) as u8
                    } else {
                        EXIT_SETUP
                    });
                }
            }
            continue;
        }
        // Sent by a process (kill, docker stop): forward, to CMD, or once it is gone to the descendants it left
        // (now our children). From the kernel (the terminal's ^C, ^\): CMD, in our process group, received it
        // too.
        if info.si_code <= 0 {
            let targets = if code.is_none() { vec![child] } else { children() };
            for t in targets {
                // SAFETY: signalling our own child by pid (a child we have not reaped keeps its pid).
                unsafe {
                    libc::kill(t, sig);
                }
            }
        }
    }
}

/// This process's children (its adopted orphans once CMD is gone), from /proc.
fn children() -> Vec<libc::pid_t> {
    let kids = procfs::process::Process::myself().and_then(|p| p.task_main_thread()?.children());
    kids.unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.try_into().ok())
        .collect()
}

/// `cuquota run`.
pub(crate) fn run(a: RunArgs) -> CmdResult {
    let fail = |e: CliError| CliError {
        msg: format!("run: {}", e.msg),
        code: EXIT_SETUP,
    };
    let machine = Machine::setup(&a.gpu, "run").map_err(fail)?;
    let mut extra: Vec<(OsString, OsString)> = Vec::new();
    let usage = match (&a.usage, crate::status::usage_path(None)) {
        (Some(u), _) => u.clone(),
        (None, Ok(p))
            if std::env::var_os("CUQUOTA_USAGE_FILE").is_some()
                || std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE").is_some() =>
        {
            p
        }
        (None, Err(e)) => return Err(fail(e)),
        (None, Ok(_)) => machine.dir().join("usage"),
    };
    extra.push(("CUQUOTA_USAGE_FILE".into(), usage.clone().into_os_string()));
    if let Some(l) = &a.limits {
        match std::env::var_os("CUQUOTA_LIMITS_FILE") {
            Some(cur) if Path::new(&cur) != l => {
                return Err(fail(CliError::new(format!(
                    "CUQUOTA_LIMITS_FILE={} is already set: --limits would replace it",
                    cur.to_string_lossy()
                ))))
            }
            _ => extra.push(("CUQUOTA_LIMITS_FILE".into(), l.clone().into_os_string())),
        }
    }
    let mut env = machine.env(&extra);
    if !a.device.is_empty() {
        let v = visible_devices(
            &a.device,
            env.get(OsStr::new("CUDA_VISIBLE_DEVICES")).map(|v| v.as_os_str()),
        )
        .map_err(fail)?;
        env.insert("CUDA_VISIBLE_DEVICES".into(), v);
    }
    Limits {
        memory: a.memory,
        memory_request: a.memory_request,
        sm: a.sm,
        policy: a.policy,
    }
    .apply(&mut env)
    .map_err(fail)?;

    if machine.simulated() && !a.quiet {
        let why = if a.gpu.sim || a.gpu.sim_devices.is_some() || a.gpu.sim_memory.is_some() {
            "as asked"
        } else {
            "no NVIDIA driver found"
        };
        eprintln!(
            "cuquota run: {why}: running on {}; memory limit {}, SM limit {}",
            machine.describe(),
            a.memory
                .filter(|m| *m != 0)
                .map_or_else(|| "none".into(), format_size),
            a.sm.filter(|s| *s != 0)
                .map_or_else(|| "none".into(), |s| format!("{s}%")),
        );
    }
    cuquota_core::log!(
        cuquota_core::log::Level::Info,
        "run: {} on {}; usage file {}",
        a.command[0].to_string_lossy(),
        machine.describe(),
        usage.display()
    );

    become_subreaper().map_err(fail)?;
    let mut sigs = FORWARDED.to_vec();
    sigs.push(libc::SIGCHLD);
    let set = sigset(&sigs);
    // SAFETY: blocking signals in this (single-threaded) process; the child's mask is reset by std's spawn.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).env_clear().envs(&env);
    let empty = sigset(&[]);
    // SAFETY: between fork and exec only pthread_sigmask (async-signal-safe) runs: CMD starts with no signal
    // blocked, whatever this process blocks to wait for them.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let name = a.command[0].to_string_lossy();
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => EXIT_SETUP,
            };
            return Err(CliError {
                msg: format!("run: {name}: {e}"),
                code,
            });
        }
    };
    let code = supervise(child.id(), &set);
    drop(machine);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> BTreeMap<OsString, OsString> {
        vars.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn get<'a>(e: &'a BTreeMap<OsString, OsString>, k: &str) -> Option<&'a str> {
        e.get(OsStr::new(k)).and_then(|v| v.to_str())
    }

    #[test]
    fn limits_only_go_down() {
        let lim = Limits {
            memory: Some(2 << 30),
            memory_request: None,
            sm: Some(30),
            policy: None,
        };
        let mut e = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "8g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "0"),
            ("CUQUOTA_SM_LIMIT_0", "20"),
            ("CUDA_DEVICE_SM_LIMIT_3", "100"),
            ("CUDA_DEVICE_MEMORY_LIMIT_X", "junk"),
        ]);
        lim.apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUDA_DEVICE_MEMORY_LIMIT"), Some("1g"), "lower already");
        assert_eq!(get(&e, "CUDA_DEVICE_MEMORY_LIMIT_1"), Some("2147483648"));
        assert_eq!(
            get(&e, "CUDA_DEVICE_MEMORY_LIMIT_2"),
            Some("0"),
            "falls back to the global"
        );
        assert_eq!(get(&e, "CUDA_DEVICE_SM_LIMIT"), Some("30"));
        assert_eq!(get(&e, "CUQUOTA_SM_LIMIT_0"), Some("20"));
        assert_eq!(
            get(&e, "CUDA_DEVICE_SM_LIMIT_3"),
            Some("30"),
            "100 = no limit, now 30"
        );
        assert_eq!(
            get(&e, "CUDA_DEVICE_MEMORY_LIMIT_X"),
            Some("junk"),
            "not a limit variable"
        );

        // Both names present: both end up equal (the shim refuses a disagreement).
        let mut e = env(&[("CUQUOTA_MEMORY_LIMIT", "8g"), ("CUDA_DEVICE_MEMORY_LIMIT", "8g")]);
        lim.apply(&mut e).unwrap();
        assert_eq!(
            get(&e, "CUQUOTA_MEMORY_LIMIT"),
            get(&e, "CUDA_DEVICE_MEMORY_LIMIT")
        );
        assert_eq!(get(&e, "CUQUOTA_MEMORY_LIMIT"), Some("2147483648"));

        let mut e = env(&[("GPU_CORE_UTILIZATION_POLICY", "FORCE")]);
        let p = Limits {
            policy: Some(PolicyArg::Burst),
            ..Default::default()
        };
        assert!(p.apply(&mut e).is_err());
    }

    #[test]
    fn a_memory_request_goes_to_the_environment_never_above_the_cap() {
        let lim = |m: u64, r: u64| Limits {
            memory: Some(m),
            memory_request: Some(r),
            ..Default::default()
        };
        // Control: the request beside the cap.
        let mut e = env(&[]);
        lim(4 << 30, 1 << 30).apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUQUOTA_MEMORY_REQUEST"), Some("1073741824"));
        // A lower cap already in the environment lowers the request with it; a lower request stays.
        let mut e = env(&[("CUDA_DEVICE_MEMORY_LIMIT", "512m")]);
        lim(4 << 30, 1 << 30).apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUQUOTA_MEMORY_REQUEST"), Some("536870912"));
        let mut e = env(&[("CUQUOTA_MEMORY_REQUEST", "256m")]);
        lim(4 << 30, 1 << 30).apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUQUOTA_MEMORY_REQUEST"), Some("256m"));
        // Bad input: a request above the cap is refused, naming both.
        let e = lim(1 << 30, 2 << 30).apply(&mut env(&[])).unwrap_err().msg;
        assert!(
            e.contains("--memory-request 2 GiB") && e.contains("--memory 1 GiB"),
            "{e}"
        );
    }

    #[test]
    fn a_policy_flag_never_loosens_the_environment() {
        let with = |p| Limits {
            policy: Some(p),
            ..Default::default()
        };
        // Attacks: `hard` in the environment made `burst`; an SM share dropped by `disabled`.
        for (vars, p) in [
            (&[("CUQUOTA_POLICY", "hard")][..], PolicyArg::Burst),
            (&[("CUQUOTA_POLICY", "hard")][..], PolicyArg::Disabled),
            (&[("CUDA_DEVICE_SM_LIMIT", "30")][..], PolicyArg::Disabled),
            (&[("CUQUOTA_SM_LIMIT_1", "20")][..], PolicyArg::Disabled),
        ] {
            let mut e = env(vars);
            let r = with(p).apply(&mut e);
            assert!(
                r.is_err(),
                "{vars:?} --policy {}: {:?}",
                p.name(),
                get(&e, "CUQUOTA_POLICY")
            );
        }
        // Controls: stricter is fine; disabled where no share is set (100 = none) is too.
        let mut e = env(&[("CUQUOTA_POLICY", "burst"), ("CUDA_DEVICE_SM_LIMIT", "30")]);
        with(PolicyArg::Hard).apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUQUOTA_POLICY"), Some("hard"));
        let mut e = env(&[("CUDA_DEVICE_SM_LIMIT", "100")]);
        with(PolicyArg::Disabled).apply(&mut e).unwrap();
        assert_eq!(get(&e, "CUQUOTA_POLICY"), Some("disabled"));
    }

    #[test]
    fn devices_compose_with_an_existing_list() {
        let d = |v: &[&str], cur: Option<&str>| {
            visible_devices(
                &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                cur.map(OsStr::new),
            )
            .map(|s| s.into_string().unwrap())
        };
        assert_eq!(d(&["1", "0"], None).unwrap(), "1,0");
        assert_eq!(d(&["1"], Some("2,3")).unwrap(), "3");
        assert!(d(&["2"], Some("2,3")).is_err());
        assert_eq!(d(&["GPU-ab"], Some("GPU-abcd,1")).unwrap(), "GPU-ab");
        assert!(d(&["GPU-ff"], Some("GPU-abcd")).is_err());
        assert!(d(&["one"], None).is_err());
    }
}

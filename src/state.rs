//! Process-global state, initialised once on the first intercepted CUDA or NVML call (never inside `dlsym`),
//! and the `fork` handlers that keep it consistent in a child.
//!
//! Three outcomes, decided once:
//! - **Active**: configuration valid, usage region attached → hooks enforce.
//! - **Disabled** (`CUDA_DISABLE_CONTROL=true` / `CUQUOTA_DISABLE=1`, unless an agent limits file forbids opting
//!   out): every export forwards to the real function unchanged.
//! - **Failed**: bad configuration or an unusable region file → the reason is printed once
//!   (`cuquota: <message>; refusing to initialise CUDA`) and every CUDA export returns
//!   `CUDA_ERROR_NOT_INITIALIZED`, every NVML export `NVML_ERROR_UNINITIALIZED`: fail closed.
//!
//! This module owns the state; the policies in it (`devices`, `memory`, `throttle`) own their pieces. It knows
//! nothing of the exports (`abi`) or the hooks: the exports hand it their address lookup at initialisation.

use crate::devices::Devices;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::{Nvml, NvmlTable};
use crate::driver::proc_map::ProcMap;
use crate::driver::Library;
use crate::ffi::cuda::CUresult;
use crate::ffi::nvml::nvmlReturn_t;
use crate::locks::Side;
use crate::log::{self, log, Level};
use crate::memory::Memory;
use crate::throttle::SmThrottle;
use cuquota_core::region::{FileId, LimitsReader, LimitsRegion, PriorityRegion};
use cuquota_core::{Config, LogLevel, UsageRegion};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, OnceLock};

/// Our export's address for a name, if we export it (`abi::cuda::export_address`).
pub(crate) type Exports = fn(&[u8]) -> Option<usize>;

/// The state of an active (enforcing) process.
pub(crate) struct Shim {
    /// The real CUDA driver.
    pub cuda: CudaTable,
    /// The real NVML, when it could be loaded.
    pub nvml: Nvml,
    /// Devices, their effective limits, the usage region.
    pub devices: Arc<Devices>,
    /// Memory accounting.
    pub mem: Memory,
    /// The SM-time throttle.
    pub throttle: SmThrottle,
    /// `cuGetProcAddress` reverse map.
    pub proc_map: ProcMap,
}

impl Shim {
    /// Assembles an active state (production init, and unit tests with fake tables). `exports` gives the
    /// address of our export of a name, for the `cuGetProcAddress` reverse map.
    pub(crate) fn new(cuda: CudaTable, nvml: Option<NvmlTable>, devices: Devices, exports: Exports) -> Shim {
        let devices = Arc::new(devices);
        Shim {
            proc_map: ProcMap::build(cuda.resolved(), exports),
            mem: Memory::new(devices.clone()),
            throttle: SmThrottle::new(devices.clone(), &cuda),
            nvml: Nvml::new(nvml),
            devices,
            cuda,
        }
    }
}

/// What the process decided at initialisation. (One static instance: variant sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Process {
    /// Enforcing.
    Active(Box<Shim>),
    /// Opted out: pass-through.
    Disabled {
        /// Real CUDA.
        cuda: CudaTable,
        /// Real NVML.
        nvml: NvmlTable,
    },
    /// Bad configuration: fail closed.
    Failed,
}

/// What an export does with a call: enforce through the hooks, or forward to the real library.
pub(crate) enum Entry<T: 'static> {
    /// Enforce: call the hook.
    Active(&'static Shim),
    /// Disabled by configuration: forward to the real library.
    PassThrough(&'static T),
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// The active state with CUDA loaded, once initialised: what every hooked CUDA call needs, in one load.
static ACTIVE_CUDA: AtomicPtr<Shim> = AtomicPtr::new(std::ptr::null_mut());

/// The process state, initialising it on first call.
pub(crate) fn process(exports: Exports) -> &'static Process {
    PROCESS.get_or_init(|| {
        crate::throttle::sampler::install(crate::throttle::sampler::Hooks {
            tick: sampler_tick,
            stop: sampler_stop,
        });
        let p = init(exports);
        if let Process::Active(s) = &p {
            if s.cuda.loaded {
                // The box never moves: it lives in `PROCESS` for the rest of the process.
                ACTIVE_CUDA.store(&**s as *const Shim as *mut Shim, Ordering::Release);
            }
        }
        p
    })
}

/// One tick of the throttle's NVML sampler thread (`throttle::sampler`): false ends the thread.
fn sampler_tick() -> bool {
    let Some(Process::Active(s)) = process_if_ready() else {
        return false;
    };
    s.throttle.sampler().tick(|| s.throttle.sample(&s.nvml))
}

/// The sampler's `atexit` handler: waits for a tick in progress, then none runs.
fn sampler_stop() {
    if let Some(Process::Active(s)) = process_if_ready() {
        s.throttle.sampler().stop();
    }
}

/// The process state if already initialised (for fork handlers: never initialises).
pub(crate) fn process_if_ready() -> Option<&'static Process> {
    PROCESS.get()
}

/// The active state with CUDA loaded, if initialised (one load; never initialises).
#[inline(always)]
pub(crate) fn active_cuda() -> Option<&'static Shim> {
    let active = ACTIVE_CUDA.load(Ordering::Acquire);
    // SAFETY: set once from the `Shim` boxed in `PROCESS`, which is never dropped or moved.
    (!active.is_null()).then(|| unsafe { &*active })
}

/// How a CUDA export proceeds.
#[inline]
pub(crate) fn cuda_entry(exports: Exports) -> Result<Entry<CudaTable>, CUresult> {
    match active_cuda() {
        Some(s) => Ok(Entry::Active(s)),
        None => cuda_entry_slow(exports),
    }
}

#[cold]
#[inline(never)]
fn cuda_entry_slow(exports: Exports) -> Result<Entry<CudaTable>, CUresult> {
    match process(exports) {
        Process::Active(s) if s.cuda.loaded => Ok(Entry::Active(s)),
        Process::Active(_) => Err(CUresult::ERROR_NOT_INITIALIZED),
        Process::Disabled { cuda, .. } => Ok(Entry::PassThrough(cuda)),
        Process::Failed => Err(CUresult::ERROR_NOT_INITIALIZED),
    }
}

/// How an NVML export proceeds.
#[inline]
pub(crate) fn nvml_entry(exports: Exports) -> Result<Entry<NvmlTable>, nvmlReturn_t> {
    match process(exports) {
        Process::Active(s) => match s.nvml.table() {
            Some(_) => Ok(Entry::Active(s)),
            None => Err(nvmlReturn_t::ERROR_LIBRARY_NOT_FOUND),
        },
        Process::Disabled { nvml, .. } => Ok(Entry::PassThrough(nvml)),
        Process::Failed => Err(nvmlReturn_t::ERROR_UNINITIALIZED),
    }
}

fn fail(msg: std::fmt::Arguments<'_>) -> Process {
    log::write_line(format_args!("{msg}; refusing to initialise CUDA"));
    Process::Failed
}

fn level_of(l: LogLevel) -> Level {
    match l {
        LogLevel::Error => Level::Error,
        LogLevel::Warn => Level::Warn,
        LogLevel::Info => Level::Info,
        LogLevel::Debug => Level::Debug,
        LogLevel::Trace => Level::Trace,
    }
}

fn load(path: Option<&Path>, soname: &str) -> Option<Library> {
    let c = match path {
        Some(p) => CString::new(p.as_os_str().as_bytes()).ok()?,
        None => CString::new(soname).ok()?,
    };
    match Library::open(&c) {
        Ok(l) => Some(l),
        Err(e) => {
            log!(Level::Warn, "cannot load {}: {e}", c.to_string_lossy());
            None
        }
    }
}

// ---- the environment at load --------------------------------------------------------------------------------
//
// Limits and switches in the environment are the ones the process was started with: a constructor copies the
// environment when the library is loaded (before `main` under LD_PRELOAD or /etc/ld.so.preload), and `init`
// reads that copy, so a program that `setenv`s CUDA_DEVICE_MEMORY_LIMIT, CUDA_DISABLE_CONTROL or
// CUQUOTA_USAGE_FILE before its first CUDA call changes nothing. (A program that dlopens the shim itself runs
// the constructor at that dlopen: it has opted in, and its own environment is its to choose.)

static ENV_AT_LOAD: OnceLock<Vec<(std::ffi::OsString, std::ffi::OsString)>> = OnceLock::new();

extern "C" fn copy_env_at_load() {
    // Never panics (vars_os yields non-UTF-8 pairs as they are), so nothing can unwind out of this extern fn.
    let _ = ENV_AT_LOAD.set(std::env::vars_os().collect());
}

#[used]
#[link_section = ".init_array"]
static COPY_ENV_AT_LOAD: extern "C" fn() = copy_env_at_load;

/// The usage file the agent's limits files bind the container to, if any, with the identity the agent recorded
/// for it; `Err` when two files name different ones.
fn bound_usage(limits: &[(LimitsReader, LimitsRegion)]) -> Result<Option<(PathBuf, Option<FileId>)>, String> {
    let mut bound: Option<(PathBuf, Option<FileId>)> = None;
    for (r, _) in limits {
        let snap = r.snapshot();
        let unreadable = |e| format!("{}: {e}", r.region().path().display());
        if let Some(p) = snap.usage_path().map_err(unreadable)? {
            let this = (p.to_path_buf(), snap.usage_id().map_err(unreadable)?);
            match &bound {
                Some(b) if *b != this => {
                    return Err(format!(
                        "the agent's limits files bind different usage files ({} and {})",
                        b.0.display(),
                        p.display()
                    ))
                }
                _ => bound = Some(this),
            }
        }
    }
    Ok(bound)
}

fn init(exports: Exports) -> Process {
    // The copy the constructor took; the live environment only if it never ran (unit tests of this crate).
    let vars = ENV_AT_LOAD
        .get()
        .cloned()
        .unwrap_or_else(|| std::env::vars_os().collect());
    let mut cfg = match Config::from_vars_os(vars) {
        Ok(c) => c,
        Err(e) => return fail(format_args!("{e}")),
    };
    log::set_level(level_of(cfg.log_level));

    // Agent limits files: every listed one must open and validate (fail closed).
    let mut limits = Vec::new();
    for p in &cfg.limits_paths {
        let reader = match LimitsReader::open(p) {
            Ok(r) => r,
            Err(e) => return fail(format_args!("{e}")),
        };
        let watch = match LimitsRegion::open(p) {
            Ok(w) => w,
            Err(e) => return fail(format_args!("{e}")),
        };
        limits.push((reader, watch));
    }
    if cfg.limits_required && limits.is_empty() {
        return fail(format_args!(
            "an agent limits file is required (CUQUOTA_LIMITS_REQUIRED=1 or {} exists) but there is no agent \
             limits file to read (none at {}, CUQUOTA_LIMITS_FILE not set)",
            cuquota_core::config::LIMITS_REQUIRED_MARKER,
            cuquota_core::config::DEFAULT_LIMITS_PATH
        ));
    }
    // The agent's binding wins over CUQUOTA_USAGE_FILE: a private usage file would be a private cap.
    let bound_id = match bound_usage(&limits) {
        Ok(Some((p, id))) => {
            if p != cfg.usage_path {
                log!(
                    Level::Info,
                    "usage file {} (bound by the agent's limits file; not {})",
                    p.display(),
                    cfg.usage_path.display()
                );
            }
            cfg.usage_path = p;
            if id.is_none() {
                log!(
                    Level::Warn,
                    "usage file {} is bound by path only (the agent recorded no identity): a file put in its \
                     place would be used; re-bind it with `cuquota limits set … --usage`",
                    cfg.usage_path.display()
                );
            }
            id
        }
        Ok(None) => None,
        Err(e) => return fail(format_args!("{e}")),
    };
    let opt_out_allowed = limits.iter().all(|(r, _)| r.snapshot().opt_out_allowed());
    if cfg.disabled && !opt_out_allowed {
        log!(
            Level::Warn,
            "opt-out requested but the agent's limits file forbids it; enforcing"
        );
    }

    // Under the operator's limits the tenant does not choose the driver or NVML (its own wrapper could hide what
    // it takes): the loader resolves the sonames, as for any program.
    let (libcuda, libnvml) = if limits.is_empty() {
        (cfg.libcuda_path.as_deref(), cfg.libnvml_path.as_deref())
    } else {
        if cfg.libcuda_path.is_some() || cfg.libnvml_path.is_some() {
            log!(
                Level::Warn,
                "CUQUOTA_LIBCUDA / CUQUOTA_LIBNVML (or the TOML's libcuda / libnvml) ignored: the agent's limits \
                 file applies, the driver and NVML are the loader's libcuda.so.1 and libnvidia-ml.so.1"
            );
        }
        (None, None)
    };
    let cuda = load(libcuda, "libcuda.so.1")
        .map_or_else(|| CudaTable::empty(false), |l| crate::driver::cuda::load(&l));
    let nvml_lib = load(libnvml, "libnvidia-ml.so.1");

    if cfg.disabled && opt_out_allowed {
        log!(Level::Info, "disabled by configuration: pass-through");
        let nvml = nvml_lib.map_or_else(|| NvmlTable::empty(false), |l| crate::driver::nvml::load(&l));
        return Process::Disabled { cuda, nvml };
    }

    // A bound file is opened only if it is the one the agent bound: never created, never a stand-in.
    let usage = match bound_id.map_or_else(
        || UsageRegion::open(&cfg.usage_path),
        |id| UsageRegion::open_bound(&cfg.usage_path, id),
    ) {
        Ok(u) => u,
        Err(e) => return fail(format_args!("{e}")),
    };
    // The container's priority file and the node's directory beside it: named (or the agent's default), they
    // must open (fail closed).
    let priority = match &cfg.priority_path {
        Some(p) => match PriorityRegion::open(p) {
            Ok(r) => Some(r),
            Err(e) => return fail(format_args!("priority file: {e}")),
        },
        None => None,
    };
    let nvml = nvml_lib.map(|l| crate::driver::nvml::load(&l));
    // A slice below the default releases work in smaller bursts, which costs a time-sliced neighbour switches:
    // under the operator's limits the tenant may only make its bursts larger.
    let time_slice_us = if limits.is_empty()
        || cfg.time_slice_us >= cuquota_core::config::DEFAULT_TIME_SLICE_US
    {
        cfg.time_slice_us
    } else {
        log!(
            Level::Warn,
            "CUQUOTA_TIME_SLICE_US (or the TOML's time_slice_us) {} raised to {}: the agent's limits file applies, \
             and a smaller slice costs the device's other tenants context switches",
            cfg.time_slice_us,
            cuquota_core::config::DEFAULT_TIME_SLICE_US
        );
        cuquota_core::config::DEFAULT_TIME_SLICE_US
    };
    let devices = Devices::new(cfg, usage, limits, priority);
    register_fork_handlers();
    let shim = Shim::new(cuda, nvml, devices, exports);
    shim.throttle.set_time_slice_us(time_slice_us);
    Process::Active(Box::new(shim))
}

// ---- fork --------------------------------------------------------------------------------------------------
//
// A forked child has one thread: a lock another thread of the parent held at the fork would stay held in the
// child for ever. So `fork_prepare` takes every lock the hooks take, and the parent and child handlers release
// them. One order, always (a hook never holds a lock of a later group while it waits for one of an earlier
// group, so taking them in this order cannot deadlock against a running hook):
//
//   0. the throttle's NVML sampler tick (held across NVML calls and taking any lock below);
//   1. memory: the ledger's shards (in index order), the VMM lifetimes, the pools, the graph pools' charges, the graph execs'
//      footprints, the overhead lock, the context/module owners, the host-pid candidates;
//   2. devices: the refresh lock, then the agent limits readers (both taken under the overhead lock by a limit
//      re-read);
//   3. throttle: the engine's outstanding probe per device, then the event probe slot per device (a poll holds
//      the first while it tries the second), then the best-effort tracking slot per device (held alone);
//   4. memory's leaf locks (their holders take no other lock): images, first-use charges, graph kernels.
//
// They are released in the reverse order: unlocked in the parent, reset to unlocked in the child (unlocking
// there would hand a lock to a parent thread parked on it, which the child does not have). In the child, memory
// then forgets the parent's allocations, slot,
// contexts and host pid, and lets the first-use gate go (it guards no data and is held across driver calls, so
// `fork` does not wait for it). What is not a lock needs nothing: the NVML init flag and the throttle's NVML handles
// are atomics; `OnceLock`s are only initialised with values computed before the call.

extern "C" fn fork_prepare() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // First: a sampler tick in progress may still take any of the locks below (and is inside NVML).
        s.throttle.sampler().lock().hold();
        s.mem.fork_prepare();
        s.devices.fork_prepare();
        s.throttle.fork_prepare();
        s.mem.fork_prepare_leaves();
    }
}

/// Releases what [`fork_prepare`] took, in reverse order.
///
/// # Safety
/// `fork_prepare` ran on this thread (or in the parent thread this child is a copy of).
unsafe fn fork_release(s: &Shim, side: Side) {
    // SAFETY: the caller's contract.
    unsafe {
        s.mem.fork_release_leaves(side);
        s.throttle.fork_release(side);
        s.devices.fork_release(side);
        s.mem.fork_release(side);
        s.throttle.sampler().lock().release(side);
    }
}

extern "C" fn fork_parent() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // SAFETY: fork_prepare ran on this thread.
        unsafe { fork_release(s, Side::Parent) };
    }
}

extern "C" fn fork_child() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // SAFETY: fork_prepare ran in the parent thread this child is a copy of.
        unsafe { fork_release(s, Side::Child) };
        s.mem.reset_in_child();
        s.devices.hami_forget_in_child();
    }
}

// ---- exit ----------------------------------------------------------------------------------------------------

/// Runs at a normal exit (and at `dlclose`), after the program's own destructors: gives the process's usage slot
/// back, so its charges leave the container's total at once rather than when someone notices the process died,
/// and puts the program's own `SIGBUS` disposition back.
/// A thread still allocating afterwards claims a new slot, which its liveness lock releases when the process is
/// gone.
extern "C" fn release_at_exit() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // Before the slot goes: the last launch and what the process still owes the SM limit.
        s.throttle.at_exit();
        // Credit is charged in the slot: taken back first, or the slot would look in use and stay.
        s.mem.give_back_all_credit();
        s.devices.usage().release_process_slot();
        s.devices.hami_release();
    }
    // At dlclose our code goes away: leave no SIGBUS handler pointing into it.
    cuquota_core::region::uninstall_sigbus_handler();
}

#[used]
#[link_section = ".fini_array"]
static RELEASE_AT_EXIT: extern "C" fn() = release_at_exit;

fn register_fork_handlers() {
    // SAFETY: registering plain extern "C" handlers that never unwind.
    let r = unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if r != 0 {
        log!(
            Level::Warn,
            "pthread_atfork failed ({r}): a forked child would share its parent's slot"
        );
    }
}

//! Process-global state, initialised once on the first intercepted CUDA or NVML call (never inside `dlsym`).
//!
//! Three outcomes, decided once:
//! - **Active**: configuration valid, usage region attached → hooks enforce.
//! - **Disabled** (`CUDA_DISABLE_CONTROL=true` / `CUQUOTA_DISABLE=1`, unless an agent limits file forbids opting
//!   out): every export forwards to the real function unchanged.
//! - **Failed**: bad configuration or an unusable region file → the reason is printed once
//!   (`cuquota: <message>; refusing to initialise CUDA`) and every CUDA export returns
//!   `CUDA_ERROR_NOT_INITIALIZED`, every NVML export `NVML_ERROR_UNINITIALIZED`: fail closed.

use crate::abi::{CudaEntry, NvmlEntry};
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::NvmlTable;
use crate::driver::Library;
use crate::ffi::cuda::CUresult;
use crate::ffi::nvml::nvmlReturn_t;
use crate::hooks::proc_address::ProcMap;
use crate::log::{self, log, Level};
use crate::memory::Memory;
use cuquota_core::region::{LimitsReader, LimitsRegion};
use cuquota_core::{Config, LogLevel, UsageRegion};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

/// The state of an active (enforcing) process.
pub struct Shim {
    /// The real CUDA driver.
    pub cuda: CudaTable,
    /// The real NVML, when it could be loaded.
    pub nvml: Option<NvmlTable>,
    /// Memory accounting.
    pub mem: Memory,
    /// `cuGetProcAddress` reverse map.
    pub proc_map: ProcMap,
    /// Contexts and modules this process holds (overhead estimate, owner devices).
    pub holdings: crate::hooks::context::Holdings,
    /// Our own `nvmlInit_v2` (for overhead measurement and NVML filtering), done once on demand.
    pub(crate) nvml_ready: OnceLock<bool>,
}

impl Shim {
    /// Assembles an active state from parts (production init and unit tests with fake tables).
    pub fn new(cuda: CudaTable, nvml: Option<NvmlTable>, mem: Memory) -> Shim {
        let proc_map = ProcMap::build(cuda.resolved(), crate::abi::cuda::export_address);
        Shim {
            cuda,
            nvml,
            mem,
            proc_map,
            holdings: Default::default(),
            nvml_ready: OnceLock::new(),
        }
    }

    /// NVML, initialised by us (refcounted by NVML, never shut down), if available.
    pub fn nvml(&self) -> Option<&NvmlTable> {
        let nvml = self.nvml.as_ref()?;
        let ready = *self.nvml_ready.get_or_init(|| {
            // SAFETY: plain NVML call.
            let r = unsafe { nvml.nvmlInit_v2() };
            if !r.ok() {
                log!(
                    Level::Info,
                    "NVML unavailable (error {}): overhead is estimated",
                    r.0
                );
            }
            r.ok()
        });
        ready.then_some(nvml)
    }
}

/// What the process decided at initialisation. (One static instance: variant sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Process {
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

static PROCESS: OnceLock<Process> = OnceLock::new();

/// The process state, initialising it on first call.
pub fn process() -> &'static Process {
    PROCESS.get_or_init(init)
}

/// The process state if already initialised (for fork handlers: never initialises).
pub fn process_if_ready() -> Option<&'static Process> {
    PROCESS.get()
}

/// How a CUDA export proceeds.
pub fn cuda_entry() -> Result<CudaEntry, CUresult> {
    match process() {
        Process::Active(s) if s.cuda.loaded => Ok(CudaEntry::Active(s)),
        Process::Active(_) => Err(CUresult::ERROR_NOT_INITIALIZED),
        Process::Disabled { cuda, .. } => Ok(CudaEntry::PassThrough(cuda)),
        Process::Failed => Err(CUresult::ERROR_NOT_INITIALIZED),
    }
}

/// How an NVML export proceeds.
pub fn nvml_entry() -> Result<NvmlEntry, nvmlReturn_t> {
    match process() {
        Process::Active(s) => match &s.nvml {
            Some(_) => Ok(NvmlEntry::Active(s)),
            None => Err(nvmlReturn_t::ERROR_LIBRARY_NOT_FOUND),
        },
        Process::Disabled { nvml, .. } => Ok(NvmlEntry::PassThrough(nvml)),
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

fn init() -> Process {
    let cfg = match Config::from_env() {
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
    let opt_out_allowed = limits.iter().all(|(r, _)| r.snapshot().opt_out_allowed());
    if cfg.disabled && !opt_out_allowed {
        log!(
            Level::Warn,
            "opt-out requested but the agent's limits file forbids it; enforcing"
        );
    }

    let cuda = load(cfg.libcuda_path.as_deref(), "libcuda.so.1")
        .map_or_else(|| CudaTable::empty(false), |l| CudaTable::load(&l));
    let nvml_lib = load(cfg.libnvml_path.as_deref(), "libnvidia-ml.so.1");

    if cfg.disabled && opt_out_allowed {
        log!(Level::Info, "disabled by configuration: pass-through");
        let nvml = nvml_lib.map_or_else(|| NvmlTable::empty(false), |l| NvmlTable::load(&l));
        return Process::Disabled { cuda, nvml };
    }

    let usage = match UsageRegion::open(&cfg.usage_path) {
        Ok(u) => u,
        Err(e) => return fail(format_args!("{e}")),
    };
    let nvml = nvml_lib.map(|l| NvmlTable::load(&l));
    let mem = Memory::new(cfg, usage, limits);
    register_fork_handlers();
    Process::Active(Box::new(Shim::new(cuda, nvml, mem)))
}

extern "C" fn fork_prepare() {
    if let Some(Process::Active(s)) = process_if_ready() {
        s.mem.fork_prepare();
        s.holdings.fork_prepare();
    }
}

extern "C" fn fork_parent() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // SAFETY: fork_prepare ran on this thread.
        unsafe {
            s.mem.fork_release();
            s.holdings.fork_release(false);
        }
    }
}

extern "C" fn fork_child() {
    if let Some(Process::Active(s)) = process_if_ready() {
        // SAFETY: fork_prepare ran in the parent thread this child is a copy of.
        unsafe {
            s.mem.fork_release();
            s.holdings.fork_release(true);
        }
        s.mem.reset_in_child();
    }
}

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

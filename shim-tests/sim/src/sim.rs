//! The process-wide simulator: configuration, the mapped shared state, the visible devices and this
//! process's slot. Loaded once by cuInit or nvmlInit (whichever comes first); both libraries' names resolve
//! to this one object, so they share it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::OnceLock;

use crate::config::{self, SimConfig};
use crate::device::resolve_visible;
use crate::state::{self, SharedState};
use crate::types::*;

/// Everything fixed after initialisation.
pub(crate) struct Sim {
    /// The configuration in force (the state file creator's).
    pub cfg: SimConfig,
    pub shared: &'static SharedState,
    /// Physical device index of each CUDA ordinal.
    pub visible: Vec<usize>,
    /// This process's `CUDASIM_HOST_PID_OFFSET` (its own, not the creator's): NVML reports pid + offset.
    pub host_pid_offset: u32,
    /// `CUDASIM_PID_SOCKET` (per process): the pid service that tells a process in a container its host pid.
    pub pid_socket: Option<String>,
}

static SIM: OnceLock<Result<Sim, String>> = OnceLock::new();
static CUDA_INITIALISED: AtomicBool = AtomicBool::new(false);
/// The process that ran cuInit: a child forked after it inherits a driver it cannot use (as on a real GPU).
static CUDA_INIT_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// `pid << 32 | (slot + 1)` of the slot this process claimed (0 = none); re-claimed after fork.
static SLOT: AtomicU64 = AtomicU64::new(0);

fn load() -> Result<Sim, String> {
    let own = config::from_env(|k| std::env::var(k).ok())?;
    let host_pid_offset = config::host_pid_offset(|k| std::env::var(k).ok())?;
    let shared = state::open(&state::state_path(), &own)?;
    let cfg = shared.config();
    let uuids: Vec<[u8; 16]> = cfg.devices.iter().map(|d| d.uuid).collect();
    let visible = resolve_visible(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), &uuids);
    Ok(Sim {
        cfg,
        shared,
        visible,
        host_pid_offset,
        pid_socket: std::env::var("CUDASIM_PID_SOCKET").ok().filter(|s| !s.is_empty()),
    })
}

/// Loads the simulator (once). A configuration error is printed once and returned on every call.
pub(crate) fn get() -> Result<&'static Sim, &'static str> {
    SIM.get_or_init(|| {
        let r = load();
        if let Err(e) = &r {
            eprintln!("{e}");
        }
        r
    })
    .as_ref()
    .map_err(|e| e.as_str())
}

/// The simulator if it is loaded (never loads it).
pub(crate) fn loaded() -> Option<&'static Sim> {
    SIM.get().and_then(|r| r.as_ref().ok())
}

/// cuInit: loads the simulator and marks the driver API initialised.
pub(crate) fn cuda_init() -> CuResult<()> {
    let me = std::process::id();
    if CUDA_INITIALISED.load(Acquire) && CUDA_INIT_PID.load(Acquire) != me {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let sim = get().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    CUDA_INIT_PID.store(me, Release);
    CUDA_INITIALISED.store(true, Release);
    if sim.visible.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    Ok(())
}

/// Whether cuInit has succeeded in this process (not in a parent it was forked from).
pub(crate) fn cuda_initialised() -> bool {
    CUDA_INITIALISED.load(Acquire) && CUDA_INIT_PID.load(Acquire) == std::process::id()
}

/// The simulator for a driver API call: CUDA_ERROR_NOT_INITIALIZED before cuInit.
pub(crate) fn cuda() -> CuResult<&'static Sim> {
    if !cuda_initialised() {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    get().map_err(|_| CUDA_ERROR_NOT_INITIALIZED)
}

impl Sim {
    /// Physical index of CUDA ordinal `dev`.
    pub(crate) fn phys(&self, dev: CUdevice) -> CuResult<usize> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.visible.get(d).copied())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// This process's slot in the shared state (claimed on first use, and again in a forked child).
    pub(crate) fn slot(&self) -> CuResult<usize> {
        let pid = std::process::id();
        let cur = SLOT.load(Acquire);
        if cur >> 32 == pid as u64 && cur & 0xffff_ffff != 0 {
            return Ok((cur & 0xffff_ffff) as usize - 1);
        }
        // One claimer at a time in this process, so racing first calls from several threads share a slot.
        static CLAIM: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
        let _claiming = CLAIM.lock();
        let cur = SLOT.load(Acquire);
        if cur >> 32 == pid as u64 && cur & 0xffff_ffff != 0 {
            return Ok((cur & 0xffff_ffff) as usize - 1);
        }
        // NVML reports the pid the host knows: the pid service's answer when one is configured (a container
        // with its own /proc), else /proc/self's (the host's when /proc is an outer namespace's). The start time
        // is that of the pid our /proc knows.
        let in_proc = state::pid_in_proc_namespace().unwrap_or(pid);
        let host = match &self.pid_socket {
            Some(socket) => crate::pid_service::host_pid(socket).map_err(|e| {
                eprintln!("{e}");
                CUDA_ERROR_OPERATING_SYSTEM
            })?,
            None => in_proc,
        };
        let start = state::proc_start_time(in_proc).map(|s| s.0).unwrap_or(0);
        let slot = self
            .shared
            .claim_slot(pid, host + self.host_pid_offset, start)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        SLOT.store(((pid as u64) << 32) | (slot as u64 + 1), Release);
        Ok(slot)
    }

    /// Charges `bytes` on physical device `phys` to this process; CUDA_ERROR_OUT_OF_MEMORY when it does not fit.
    /// With the unified memory model (`CUDASIM_MANAGED=migrate`), what does not fit evicts resident managed
    /// memory first (any process's, this one's included), as the driver does.
    pub(crate) fn charge(&self, phys: usize, bytes: u64) -> CuResult<()> {
        let slot = self.slot()?;
        if self.shared.charge(slot, phys, bytes) {
            return Ok(());
        }
        if self.cfg.managed_fault_ns.is_some() {
            // Another process may free or allocate meanwhile: a few rounds, each evicting what is missing.
            for _ in 0..4 {
                let total = self.cfg.devices[phys].memory;
                let need = (self.shared.used(phys) + bytes).saturating_sub(total);
                if need > 0 && !self.shared.evict_managed(phys, need) {
                    break;
                }
                if self.shared.charge(slot, phys, bytes) {
                    return Ok(());
                }
            }
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Charges `bytes` of managed memory made resident (evictable by `charge`).
    pub(crate) fn charge_managed(&self, phys: usize, bytes: u64) -> CuResult<()> {
        self.charge(phys, bytes)?;
        self.shared.procs[self.slot()?].managed[phys].fetch_add(bytes, SeqCst);
        Ok(())
    }

    /// Returns `bytes` of this process's resident managed memory: what others have not evicted meanwhile is
    /// uncharged, the rest settles what they evicted and this process has not yet marked (`owed`).
    pub(crate) fn uncharge_managed(&self, phys: usize, bytes: u64) {
        let Ok(slot) = self.slot() else { return };
        let p = &self.shared.procs[slot];
        let mut took = 0;
        let _ = p.managed[phys].fetch_update(SeqCst, SeqCst, |m| {
            took = m.min(bytes);
            Some(m - took)
        });
        self.shared.uncharge(slot, phys, took);
        let _ = p.owed[phys].fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes - took)));
    }

    /// Managed bytes others evicted from this process on `phys` that it has not yet marked non-resident.
    pub(crate) fn owed(&self, phys: usize) -> u64 {
        self.slot()
            .map_or(0, |s| self.shared.procs[s].owed[phys].load(SeqCst))
    }

    /// Marks `bytes` of what others evicted as done.
    pub(crate) fn settle(&self, phys: usize, bytes: u64) {
        if let Ok(s) = self.slot() {
            let _ = self.shared.procs[s].owed[phys]
                .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// Returns `bytes` on physical device `phys`.
    pub(crate) fn uncharge(&self, phys: usize, bytes: u64) {
        if let Ok(slot) = self.slot() {
            self.shared.uncharge(slot, phys, bytes);
        }
    }

    /// Counts a context on `phys` (+1 / -1) for NVML's process list.
    pub(crate) fn count_context(&self, phys: usize, delta: i64) {
        if let Ok(slot) = self.slot() {
            let c = &self.shared.procs[slot].contexts[phys];
            let _ = c.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_add_signed(delta)));
        }
    }

    /// (free, total) of physical device `phys`, after releasing dead processes' memory.
    pub(crate) fn mem_info(&self, phys: usize) -> (u64, u64) {
        self.shared.reclaim_dead();
        let total = self.cfg.devices[phys].memory;
        (total.saturating_sub(self.shared.used(phys)), total)
    }

    /// Rounds `bytes` up to the allocation granularity.
    pub(crate) fn round(&self, bytes: u64) -> u64 {
        let g = self.cfg.granularity;
        bytes.div_ceil(g).saturating_mul(g)
    }
}

/// The driver version cuDriverGetVersion reports (for the runtime helper's export tables).
pub(crate) fn driver_version() -> u32 {
    get().map(|s| s.cfg.driver_version).unwrap_or(13000)
}

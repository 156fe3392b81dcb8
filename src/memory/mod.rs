//! Memory accounting: the per-process ledger, the CUDA-ordinal → usage-device map, the effective limits, and
//! admission against the container's budget in the shared usage region (`cuquota_core::UsageRegion`).
//!
//! Hot path of an allocation: one `cuCtxGetDevice`, one atomic load per limits file (did it change?), the
//! region's lock-free reserve-then-sum, one ledger shard lock. No syscall, no allocation beyond the ledger's
//! pre-sized map. Slow paths (first use of a device, a limits-file change, a refused admission) may read files.

pub mod ledger;

use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use cuquota_core::region::{EffectiveLimits, LimitsReader, LimitsRegion};
use cuquota_core::{Config, DeviceId, UsageRegion};
use ledger::Ledger;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// CUDA ordinals tracked (a device at or above this is unplaced: refused while memory limits apply).
pub const MAX_ORDINALS: usize = 64;
/// Fallback allocation granularity when the driver cannot tell (2 MiB).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
const NO_LIMIT: u64 = u64::MAX;

/// A device as the accounting sees it: its CUDA ordinal and its usage-region entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Dev {
    /// CUDA ordinal (= `CUdevice` value).
    pub ordinal: CUdevice,
    /// Usage-region entry (claimed by UUID).
    pub id: DeviceId,
}

/// Per-ordinal facts, learned once.
struct DevInfo {
    id: DeviceId,
    uuid: [u8; 16],
    granularity: u64,
    /// Effective memory limit, `NO_LIMIT` = none; recomputed when a limits file changes.
    limit: AtomicU64,
}

/// An admission refused: the container would exceed its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap;

/// Agent limits files: a lock-free change check per file, readers behind a lock for the (rare) refresh.
struct AgentLimits {
    /// One bare mapping per file, for `seq()` checks without a lock.
    watch: Vec<LimitsRegion>,
    /// The `seq` each file had when we last recomputed.
    seen: Vec<AtomicU64>,
    readers: Mutex<Vec<LimitsReader>>,
    /// Bumped after every re-read, so other caches of derived limits (the throttle's) know to recompute.
    generation: AtomicU64,
}

/// A stream-ordered pool we account.
struct PoolState {
    /// `None` for host pools (not device memory).
    dev: Option<Dev>,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` as last charged.
    charged: u64,
}

/// `CUgraphMem_attribute` values (cuda.h).
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// Slots of the lock-free set of graph execs with memory alloc nodes.
const EXEC_SLOTS: usize = 4096;
const EXEC_EMPTY: usize = 0;
const EXEC_GONE: usize = 1;

/// CUDA graph memory: per device, the graph pool's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` as charged, and the
/// graph execs that have alloc nodes with their footprint (bytes per device their launches may need).
///
/// Launch hot path: [`GraphMem::has_memory`] probes a fixed open-addressed table of atomics (no lock, no
/// allocation); only execs found there take the footprint lock.
pub struct GraphMem {
    charged: Mutex<HashMap<CUdevice, (Dev, u64)>>,
    execs: Box<[std::sync::atomic::AtomicUsize]>,
    /// The table was full once: lookups fall back to `footprints`.
    overflow: AtomicBool,
    footprints: Mutex<HashMap<usize, Vec<(Dev, u64)>>>,
}

fn exec_slot(exec: usize, i: usize) -> usize {
    let h = (exec as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52;
    (h as usize + i) % EXEC_SLOTS
}

impl GraphMem {
    fn new() -> GraphMem {
        GraphMem {
            charged: Mutex::new(HashMap::new()),
            execs: (0..EXEC_SLOTS)
                .map(|_| std::sync::atomic::AtomicUsize::new(EXEC_EMPTY))
                .collect(),
            overflow: AtomicBool::new(false),
            footprints: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `exec` has memory alloc nodes (lock-free unless the table ever overflowed).
    #[inline]
    pub fn has_memory(&self, exec: usize) -> bool {
        if exec > EXEC_GONE {
            for i in 0..EXEC_SLOTS {
                match self.execs[exec_slot(exec, i)].load(Ordering::Acquire) {
                    EXEC_EMPTY => break,
                    v if v == exec => return true,
                    _ => {}
                }
            }
        }
        self.overflow.load(Ordering::Relaxed) && self.footprints.lock().contains_key(&exec)
    }

    fn unmark(&self, exec: usize) {
        for i in 0..EXEC_SLOTS {
            let slot = &self.execs[exec_slot(exec, i)];
            match slot.load(Ordering::Acquire) {
                EXEC_EMPTY => return,
                v if v == exec => {
                    slot.store(EXEC_GONE, Ordering::Release);
                }
                _ => {}
            }
        }
    }

    /// Records a freshly instantiated exec's footprint (empty: it has no alloc nodes; a reused handle value
    /// is forgotten).
    pub fn set_exec(&self, exec: usize, footprint: Vec<(Dev, u64)>) {
        self.forget_exec(exec);
        if footprint.is_empty() || exec <= EXEC_GONE {
            return;
        }
        self.footprints.lock().insert(exec, footprint);
        for i in 0..EXEC_SLOTS {
            let slot = &self.execs[exec_slot(exec, i)];
            let cur = slot.load(Ordering::Acquire);
            if (cur == EXEC_EMPTY || cur == EXEC_GONE)
                && slot
                    .compare_exchange(cur, exec, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return;
            }
        }
        self.overflow.store(true, Ordering::Relaxed);
    }

    /// Forgets an exec (destroyed).
    pub fn forget_exec(&self, exec: usize) {
        if exec > EXEC_GONE {
            self.unmark(exec);
        }
        self.footprints.lock().remove(&exec);
    }

    /// The footprint of an exec with alloc nodes.
    pub fn footprint(&self, exec: usize) -> Option<Vec<(Dev, u64)>> {
        self.footprints.lock().get(&exec).cloned()
    }
}

/// Everything memory accounting keeps for the process.
pub struct Memory {
    /// CUDA graph memory pools and execs with alloc nodes.
    pub graph: GraphMem,
    /// Live allocations of this process.
    pub ledger: Ledger,
    /// The shared usage region.
    pub usage: UsageRegion,
    cfg: Config,
    agent: AgentLimits,
    devices: [OnceLock<DevInfo>; MAX_ORDINALS],
    pools: Mutex<HashMap<usize, PoolState>>,
    /// Bytes this process has charged for allocations (not overhead), per device entry.
    alloc_bytes: [AtomicU64; cuquota_core::region::layout::MAX_DEVICES],
    /// Context/module overhead this process has charged, per device entry.
    overhead: [AtomicU64; cuquota_core::region::layout::MAX_DEVICES],
    /// Serialises overhead re-measurements (slow path only).
    overhead_lock: Mutex<()>,
    last_reclaim_ns: AtomicU64,
    /// A device the program can use found no room in the usage region (more physical GPUs than it has entries).
    unplaced: AtomicU64,
    /// A device at an ordinal from `MAX_ORDINALS` on was seen (also unplaced; logged once).
    beyond: AtomicBool,
    /// The driver shows this process exactly one device.
    single: OnceLock<bool>,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer (vDSO call, no syscall on Linux).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Memory {
    /// Accounting over `usage`, with `limits` the agent files already opened (readers + a watch mapping each).
    pub fn new(cfg: Config, usage: UsageRegion, limits: Vec<(LimitsReader, LimitsRegion)>) -> Memory {
        let mut readers = Vec::new();
        let mut watch = Vec::new();
        let mut seen = Vec::new();
        for (r, w) in limits {
            seen.push(AtomicU64::new(r.snapshot().seq));
            readers.push(r);
            watch.push(w);
        }
        Memory {
            ledger: Ledger::new(),
            usage,
            cfg,
            agent: AgentLimits {
                watch,
                seen,
                readers: Mutex::new(readers),
                generation: AtomicU64::new(0),
            },
            devices: std::array::from_fn(|_| OnceLock::new()),
            pools: Mutex::new(HashMap::new()),
            graph: GraphMem::new(),
            alloc_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            overhead: std::array::from_fn(|_| AtomicU64::new(0)),
            overhead_lock: Mutex::new(()),
            last_reclaim_ns: AtomicU64::new(0),
            unplaced: AtomicU64::new(0),
            beyond: AtomicBool::new(false),
            single: OnceLock::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    // ---- devices -------------------------------------------------------------------------------------------

    /// The device of the calling thread's current context, if any and trackable.
    ///
    /// A process that sees one device (the common container) skips asking the driver: every allocation is on
    /// ordinal 0, and one made without a current context fails in the driver, which undoes its charge.
    pub fn current_device(&self, cuda: &CudaTable) -> Option<Dev> {
        if self.single_device(cuda) {
            return self.device(cuda, 0);
        }
        let mut d: CUdevice = 0;
        // SAFETY: valid out-pointer.
        if !unsafe { cuda.cuCtxGetDevice(&mut d) }.ok() {
            return None;
        }
        self.device(cuda, d)
    }

    /// True when the driver reports exactly one device (asked once, after a successful answer).
    fn single_device(&self, cuda: &CudaTable) -> bool {
        if let Some(&one) = self.single.get() {
            return one;
        }
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; before cuInit the driver answers an error and nothing is cached.
        if !unsafe { cuda.cuDeviceGetCount(&mut n) }.ok() {
            return false;
        }
        *self.single.get_or_init(|| n == 1)
    }

    /// The accounting identity of CUDA device `ordinal`; learned on first use (UUID → usage entry, granularity,
    /// limit). `None` when the driver cannot say (not initialised, bad ordinal) or the region has no room.
    pub fn device(&self, cuda: &CudaTable, ordinal: CUdevice) -> Option<Dev> {
        let info = self.info(cuda, ordinal)?;
        Some(Dev { ordinal, id: info.id })
    }

    fn info(&self, cuda: &CudaTable, ordinal: CUdevice) -> Option<&DevInfo> {
        let index = usize::try_from(ordinal).ok()?;
        if let Some(i) = self.devices.get(index).and_then(|s| s.get()) {
            return Some(i);
        }
        // Entries are never freed: a device that found no room never will (no lookup, no log again).
        if index < MAX_ORDINALS && self.unplaced.load(Ordering::Relaxed) & (1 << index) != 0 {
            return None;
        }
        let mut uuid = CUuuid::default();
        // SAFETY: valid out-pointer.
        let mut r = unsafe { cuda.cuDeviceGetUuid_v2(&mut uuid, ordinal) };
        if !r.ok() {
            // SAFETY: as above.
            r = unsafe { cuda.cuDeviceGetUuid(&mut uuid, ordinal) };
        }
        if !r.ok() {
            return None;
        }
        let Some(slot) = self.devices.get(index) else {
            // A real device (it has a UUID) beyond the ordinals we track: it must not become a way around the
            // cap, so it counts as unplaced (refused while limits apply).
            if !self.beyond.swap(true, Ordering::Relaxed) {
                log!(
                    Level::Error,
                    "device {ordinal} cannot be accounted (ordinals from {MAX_ORDINALS} on are not tracked), its \
                     allocations are refused while memory limits apply"
                );
            }
            return None;
        };
        let id = match self.usage.device(&uuid.bytes) {
            Ok(id) => id,
            Err(e) => {
                log!(
                    Level::Error,
                    "device {ordinal} cannot be accounted, its allocations are refused: {e}"
                );
                self.unplaced.fetch_or(1 << index, Ordering::Relaxed);
                return None;
            }
        };
        let prop = CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: Default::default(),
        };
        let mut g: usize = 0;
        // SAFETY: valid pointers.
        let granularity =
            if unsafe { cuda.cuMemGetAllocationGranularity(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) }
                .ok()
                && g.is_power_of_two()
            {
                g as u64
            } else {
                DEFAULT_GRANULARITY
            };
        let eff = self.effective(u32::try_from(ordinal).ok(), &uuid.bytes);
        let limit = eff.memory;
        self.usage.set_reported_limits(id, eff.memory, eff.sm);
        log!(
            Level::Info,
            "device {ordinal}: entry {}, granularity {granularity}, memory limit {}",
            id.index(),
            limit.map_or("none".to_string(), |l| l.to_string())
        );
        let _ = slot.set(DevInfo {
            id,
            uuid: uuid.bytes,
            granularity,
            limit: AtomicU64::new(limit.unwrap_or(NO_LIMIT)),
        });
        slot.get()
    }

    /// The UUID of a known ordinal.
    pub fn uuid_of(&self, ordinal: CUdevice) -> Option<[u8; 16]> {
        self.devices
            .get(usize::try_from(ordinal).ok()?)?
            .get()
            .map(|i| i.uuid)
    }

    /// Ordinals learned so far, with their entries.
    pub fn known_devices(&self) -> impl Iterator<Item = (Dev, [u8; 16])> + '_ {
        self.devices.iter().enumerate().filter_map(|(o, s)| {
            s.get().map(|i| {
                (
                    Dev {
                        ordinal: o as CUdevice,
                        id: i.id,
                    },
                    i.uuid,
                )
            })
        })
    }

    /// `bytes` rounded up to the device's allocation granularity.
    pub fn round(&self, cuda: &CudaTable, dev: Dev, bytes: u64) -> u64 {
        let g = self
            .info(cuda, dev.ordinal)
            .map_or(DEFAULT_GRANULARITY, |i| i.granularity);
        bytes.div_ceil(g).saturating_mul(g)
    }

    // ---- limits --------------------------------------------------------------------------------------------

    /// Effective limits of a device known by UUID and maybe a CUDA ordinal: env/config for the ordinal,
    /// tightened by every agent file (by UUID, else ordinal, else `all`). NVML-only processes without an
    /// ordinal get only the agent files' entries.
    pub fn effective(&self, ordinal: Option<u32>, uuid: &[u8; 16]) -> EffectiveLimits {
        self.refresh_limits_if_changed();
        let mut eff = ordinal
            .map(|o| EffectiveLimits::from_config(&self.cfg, o))
            .unwrap_or_default();
        for r in self.agent.readers.lock().iter() {
            eff = eff.restrict(&r.snapshot().for_device(Some(uuid), ordinal));
        }
        eff
    }

    /// Effective memory limit (see [`Memory::effective`]).
    pub fn limit_for(&self, ordinal: Option<u32>, uuid: &[u8; 16]) -> Option<u64> {
        self.effective(ordinal, uuid).memory
    }

    /// Re-reads the agent files if one changed; returns the limits generation (changes after every re-read).
    /// One atomic load per file when nothing changed.
    pub fn poll_limits(&self) -> u64 {
        self.refresh_limits_if_changed();
        self.agent.generation.load(Ordering::Acquire)
    }

    /// True when a device could not be given a usage entry while memory limits apply: its allocations must be
    /// refused (fail closed) rather than go uncounted.
    pub fn refuse_unplaced(&self) -> bool {
        (self.unplaced.load(Ordering::Relaxed) != 0 || self.beyond.load(Ordering::Relaxed))
            && (self.cfg.has_limits() || self.has_agent_files())
    }

    /// True when at least one agent limits file is in force.
    pub fn has_agent_files(&self) -> bool {
        !self.agent.watch.is_empty()
    }

    /// True when an agent file sets an SM limit for some device.
    pub fn agent_sets_sm_limit(&self) -> bool {
        self.agent.readers.lock().iter().any(|r| {
            r.snapshot()
                .entries
                .iter()
                .any(|e| e.is_valid() && e.limits().sm.is_some())
        })
    }

    /// Re-reads changed limits files and recomputes every known device's limit. Called on the hot path only
    /// when a file's `seq` moved (one atomic load per file otherwise).
    fn refresh_limits_if_changed(&self) {
        let changed = self
            .agent
            .watch
            .iter()
            .zip(&self.agent.seen)
            .any(|(w, seen)| w.seq() != seen.load(Ordering::Relaxed));
        if !changed {
            return;
        }
        {
            let mut readers = self.agent.readers.lock();
            for ((r, w), seen) in readers.iter_mut().zip(&self.agent.watch).zip(&self.agent.seen) {
                if w.seq() != seen.load(Ordering::Relaxed) {
                    r.refresh();
                    seen.store(w.seq(), Ordering::Relaxed);
                }
            }
        }
        self.agent.generation.fetch_add(1, Ordering::AcqRel);
        for (o, slot) in self.devices.iter().enumerate() {
            if let Some(i) = slot.get() {
                let eff = self.effective(Some(o as u32), &i.uuid);
                let l = eff.memory;
                i.limit.store(l.unwrap_or(NO_LIMIT), Ordering::Relaxed);
                self.usage.set_reported_limits(i.id, eff.memory, eff.sm);
                log!(Level::Info, "device {o}: memory limit now {l:?}");
            }
        }
    }

    /// Current effective memory limit of a device (`None` = no limit).
    pub fn limit(&self, dev: Dev) -> Option<u64> {
        self.refresh_limits_if_changed();
        let l = self
            .devices
            .get(dev.ordinal as usize)?
            .get()?
            .limit
            .load(Ordering::Relaxed);
        (l != NO_LIMIT).then_some(l)
    }

    /// Bytes the whole container has charged on a device.
    pub fn container_used(&self, dev: Dev) -> u64 {
        self.usage.container_used(dev.id)
    }

    /// Reclaims dead processes' slots at most every 100 ms (for `cuMemGetInfo` and NVML queries).
    pub fn maybe_reclaim(&self) {
        let now = monotonic_ns();
        let last = self.last_reclaim_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 100_000_000
            && self
                .last_reclaim_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.usage.reclaim_dead();
        }
    }

    // ---- admission -----------------------------------------------------------------------------------------

    /// Reserves `bytes` for an allocation on `dev` against the effective limit (dead processes are reclaimed
    /// once before giving up). `Err` = over the cap: nothing charged.
    pub fn admit(&self, dev: Dev, bytes: u64) -> Result<(), OverCap> {
        if bytes == 0 {
            return Ok(());
        }
        let limit = self.limit(dev);
        let slot = match self.usage.process_slot() {
            Ok(s) => s,
            Err(e) => {
                log!(Level::Error, "no process slot in the usage region: {e}");
                // Fail closed when a limit applies; without one, allocating unaccounted harms no one.
                return if limit.is_some() { Err(OverCap) } else { Ok(()) };
            }
        };
        match self.usage.charge(slot, dev.id, bytes, limit) {
            Ok(()) => {
                self.alloc_bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                log!(
                    Level::Debug,
                    "refused {bytes} bytes on device {}: {e}",
                    dev.ordinal
                );
                self.usage.count_refusal(dev.id);
                Err(OverCap)
            }
        }
    }

    /// Charges `bytes` whatever the limit (the driver already handed the memory out).
    pub fn force(&self, dev: Dev, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Ok(slot) = self.usage.process_slot() {
            let _ = self.usage.try_charge(slot, dev.id, bytes, None);
            self.alloc_bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Gives back `bytes` charged on `dev`.
    pub fn release(&self, dev: Dev, bytes: u64) {
        self.release_entry(dev.id, bytes);
    }

    /// Gives back `bytes` charged on device entry `id`.
    pub fn release_entry(&self, id: DeviceId, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Some(slot) = self.usage.cached_slot() {
            self.usage.uncharge(slot, id, bytes);
        }
        let _ = self.alloc_bytes[id.index()].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
    }

    /// Corrects an admitted `estimate` to the `exact` charge.
    pub fn settle(&self, dev: Dev, estimate: u64, exact: u64) {
        if exact > estimate {
            self.force(dev, exact - estimate);
        } else {
            self.release(dev, estimate - exact);
        }
    }

    /// Bytes of allocations this process has charged on `dev` (overhead excluded).
    pub fn allocated(&self, dev: Dev) -> u64 {
        self.alloc_bytes[dev.id.index()].load(Ordering::Relaxed)
    }

    // ---- context/module overhead ---------------------------------------------------------------------------

    /// Overhead this process has charged on `dev`.
    pub fn overhead(&self, dev: Dev) -> u64 {
        self.overhead[dev.id.index()].load(Ordering::Relaxed)
    }

    /// Moves this process's overhead charge on `dev` to `target` bytes. Growth is admitted against the cap
    /// when `admit` is true (creation paths); `Err` = refused, nothing changed. Shrinking always succeeds.
    pub fn set_overhead(&self, dev: Dev, target: u64, admit: bool) -> Result<(), OverCap> {
        let _g = self.overhead_lock.lock();
        let cur = self.overhead(dev);
        if target > cur {
            let delta = target - cur;
            let slot = self.usage.process_slot().map_err(|_| OverCap)?;
            let limit = if admit { self.limit(dev) } else { None };
            self.usage
                .charge(slot, dev.id, delta, limit)
                .map_err(|_| OverCap)?;
        } else if target < cur {
            if let Some(slot) = self.usage.cached_slot() {
                self.usage.uncharge(slot, dev.id, cur - target);
            }
        }
        self.overhead[dev.id.index()].store(target, Ordering::Relaxed);
        Ok(())
    }

    // ---- stream-ordered pools ------------------------------------------------------------------------------

    /// Starts tracking `pool` (no-op if known). `dev = None` marks a host pool.
    pub fn track_pool(&self, pool: usize, dev: Option<Dev>) {
        self.pools
            .lock()
            .entry(pool)
            .or_insert(PoolState { dev, charged: 0 });
    }

    /// `Some(dev)` for a known pool (`Some(None)` = host pool), `None` if unknown.
    pub fn pool_device(&self, pool: usize) -> Option<Option<Dev>> {
        self.pools.lock().get(&pool).map(|p| p.dev)
    }

    /// Re-reads a pool's reserved size and charges (unconditionally) or releases the difference.
    pub fn refresh_pool(&self, cuda: &CudaTable, pool: usize) {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get_mut(&pool) {
            self.refresh_locked(cuda, pool, p);
        }
    }

    fn refresh_locked(&self, cuda: &CudaTable, pool: usize, p: &mut PoolState) {
        let Some(dev) = p.dev else { return };
        let mut reserved: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
        let r = unsafe {
            cuda.cuMemPoolGetAttribute(
                pool as CUmemoryPool,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        if !r.ok() {
            return;
        }
        if reserved > p.charged {
            self.force(dev, reserved - p.charged);
        } else {
            self.release(dev, p.charged - reserved);
        }
        p.charged = reserved;
    }

    /// Bytes a tracked pool holds reserved but not handed out (reserved − used): what a new allocation can be
    /// served from without the pool growing. 0 for untracked pools or when the driver cannot tell.
    pub fn pool_slack(&self, cuda: &CudaTable, pool: usize) -> u64 {
        if self.pool_device(pool).is_none() {
            return 0; // not charged by us yet: its reserve is not ours to spend
        }
        let get = |attr| {
            let mut v: u64 = 0;
            // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
            let r = unsafe {
                cuda.cuMemPoolGetAttribute(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast())
            };
            r.ok().then_some(v)
        };
        match (
            get(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            get(CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(reserved), Some(used)) => reserved.saturating_sub(used),
            _ => 0,
        }
    }

    /// Refreshes every pool on a device entry (before refusing a pool allocation).
    pub fn refresh_pools_of(&self, cuda: &CudaTable, id: DeviceId) {
        let mut pools = self.pools.lock();
        for (&pool, p) in pools.iter_mut() {
            if p.dev.is_some_and(|d| d.id == id) {
                self.refresh_locked(cuda, pool, p);
            }
        }
    }

    /// The last context this process had on `dev` is gone (destroyed, reset or released for the last time):
    /// the driver freed every allocation made in it, so their records and charges go too. VMM handles
    /// (`cuMemCreate`) are not tied to a context and stay; pools are re-read.
    pub fn forget_context_allocations(&self, cuda: &CudaTable, dev: Dev) {
        let gone = self
            .ledger
            .remove_where(|space, rec| space != ledger::Space::Vmm && rec.entry == dev.id);
        for rec in gone {
            if rec.kind == ledger::Kind::Direct {
                self.release(dev, rec.bytes);
            }
        }
        self.refresh_pools_of(cuda, dev.id);
        if self.graph.charged.lock().contains_key(&dev.ordinal) {
            self.refresh_graph(cuda, dev);
        }
    }

    // ---- graph memory (memory nodes) -------------------------------------------------------------------------

    fn graph_attr(cuda: &CudaTable, ordinal: CUdevice, attr: c_int) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
        let r = unsafe { cuda.cuDeviceGetGraphMemAttribute(ordinal, attr, (&mut v as *mut u64).cast()) };
        r.ok().then_some(v)
    }

    /// Re-reads a device's reserved graph memory and charges (unconditionally) or releases the difference.
    pub fn refresh_graph(&self, cuda: &CudaTable, dev: Dev) {
        let mut charged = self.graph.charged.lock();
        let Some(reserved) = Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        else {
            return;
        };
        let e = charged.entry(dev.ordinal).or_insert((dev, 0));
        if reserved > e.1 {
            self.force(dev, reserved - e.1);
        } else {
            self.release(dev, e.1 - reserved);
        }
        e.1 = reserved;
    }

    /// Re-reads every device whose graph memory we charge.
    pub fn refresh_graph_all(&self, cuda: &CudaTable) {
        let devs: Vec<Dev> = self.graph.charged.lock().values().map(|e| e.0).collect();
        for d in devs {
            self.refresh_graph(cuda, d);
        }
    }

    /// Graph memory reserved on `dev` but not in use, as far as we charged it: what a launch can reuse.
    pub fn graph_slack(&self, cuda: &CudaTable, dev: Dev) -> u64 {
        let charged = self.graph.charged.lock().get(&dev.ordinal).map_or(0, |e| e.1);
        if charged == 0 {
            return 0;
        }
        match (
            Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
            Self::graph_attr(cuda, dev.ordinal, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(r), Some(u)) => r.saturating_sub(u).min(charged),
            _ => 0,
        }
    }

    /// A destroyed pool: its charge goes back.
    pub fn forget_pool(&self, pool: usize) {
        if let Some(p) = self.pools.lock().remove(&pool) {
            if let Some(dev) = p.dev {
                self.release(dev, p.charged);
            }
        }
    }

    /// Drops per-process accounting after `fork` in the child (the parent keeps its charges; the child claims
    /// its own slot on first use). Call only in the single-threaded child, after the ledger locks were released.
    pub fn reset_in_child(&self) {
        self.usage.forget_slot_in_child();
        self.ledger.clear();
        self.pools.lock().clear();
        self.graph.charged.lock().clear();
        for a in self.alloc_bytes.iter().chain(self.overhead.iter()) {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// Locks taken around `fork` so the child never inherits one held by a vanished thread.
    pub fn fork_prepare(&self) {
        self.ledger.lock_all();
        std::mem::forget(self.pools.lock());
        std::mem::forget(self.graph.charged.lock());
        std::mem::forget(self.graph.footprints.lock());
        std::mem::forget(self.overhead_lock.lock());
    }

    /// Undoes [`Memory::fork_prepare`] (parent and child).
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread.
    pub unsafe fn fork_release(&self) {
        // SAFETY: all locked by fork_prepare, guards forgotten.
        unsafe {
            self.ledger.unlock_all();
            self.pools.force_unlock();
            self.graph.charged.force_unlock();
            self.graph.footprints.force_unlock();
            self.overhead_lock.force_unlock();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use cuquota_core::{DeviceId, UsageRegion};

    /// A fresh usage file under the temp dir (removed on drop of the returned guard).
    pub struct TempRegion {
        pub path: std::path::PathBuf,
    }
    impl Drop for TempRegion {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// A unique temp path for a region file.
    pub fn temp_path(tag: &str) -> TempRegion {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "cuquota-unit-{}-{}-{}",
            std::process::id(),
            tag,
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        TempRegion { path }
    }

    /// A device entry in a throwaway region.
    pub fn device_id() -> (TempRegion, DeviceId) {
        let t = temp_path("dev");
        let r = UsageRegion::open(&t.path).expect("usage region");
        let id = r.device(&[7; 16]).expect("device entry");
        (t, id)
    }
}

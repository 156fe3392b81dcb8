//! The devices this process uses and what each may use: the ground both policies (`memory`, `throttle`) stand
//! on.
//!
//! Owns: the configuration, the container's usage region, the agent's limits files, the container's priority file
//! (when there is one), and per CUDA ordinal the device's identity (UUID → usage-region entry and priority
//! entry), allocation granularity and **effective [`Policy`]** — the
//! process's own (env/config) tightened by every agent limits file. The policy is cached as
//! [`PolicyWords`] (the region's one packing) and recomputed for every known device when a limits file changes,
//! so the memory accounting and the throttle read the same limits from one place.
//!
//! Hot path: [`Devices::refresh_if_changed`] is one atomic load per limits file; [`Devices::policy`] a few
//! relaxed loads. Learning a device (once per ordinal) and re-reading a changed file are slow paths.

use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::locks::Lock;
use crate::log::{log, Level};
use crate::time::monotonic_ns;
use cuquota_core::region::layout::PolicyWords;
use cuquota_core::region::{
    DeviceSelector, FileId, LimitsReader, LimitsRegion, PriorityDeviceId, PriorityEntry, PriorityRegion,
};
use cuquota_core::{Config, DeviceId, Policy, Priority, UsageRegion};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

mod hami;

/// CUDA ordinals tracked (a device at or above this is unplaced: refused while memory limits apply).
pub(crate) const MAX_ORDINALS: usize = 64;
/// Fallback allocation granularity when the driver cannot tell (2 MiB).
pub(crate) const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// [`Devices::pass_seq`] when launches need their hook: no file's seq.
const NEVER: u64 = u64::MAX;

/// `bytes` rounded up to a multiple of `g` (saturating).
#[inline]
fn round_to(g: u64, bytes: u64) -> u64 {
    if g.is_power_of_two() {
        // Every driver's granularity so far (2 MiB): a mask instead of a division.
        return bytes.checked_add(g - 1).map_or(!(g - 1), |b| b & !(g - 1));
    }
    bytes.div_ceil(g).saturating_mul(g)
}

/// A device as the policies see it: its CUDA ordinal and its usage-region entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Dev {
    /// CUDA ordinal (= `CUdevice` value).
    pub ordinal: CUdevice,
    /// Usage-region entry (claimed by UUID).
    pub id: DeviceId,
}

/// Per-ordinal facts, learned once; the policy is recomputed when a limits file changes.
struct DevInfo {
    id: DeviceId,
    /// Its entry in the container's priority file (none without a file, or when the file has no room).
    prio: Option<PriorityDeviceId>,
    uuid: [u8; 16],
    granularity: u64,
    policy: PolicyWords,
    /// The policy's memory request (0: none), outside its words as in the usage file (elastic memory).
    request: AtomicU64,
}

/// Agent limits files: a lock-free change check per file, readers behind a lock for the (rare) refresh.
struct AgentLimits {
    /// One bare mapping per file, for `seq()` checks without a lock.
    watch: Vec<LimitsRegion>,
    /// The `seq` each file had when we last recomputed (stored once the limits it brought are in force).
    seen: Vec<AtomicU64>,
    readers: Lock<Vec<LimitsReader>>,
    /// One refresh at a time: a thread that finds a file changed waits for the refresh under way.
    refreshing: Lock<()>,
}

/// Every device of the process, its limits, and the region they are accounted in.
pub(crate) struct Devices {
    cfg: Config,
    usage: UsageRegion,
    agent: AgentLimits,
    /// Bumped when a limits file changed (before the limits are recomputed): what memory's credit was charged
    /// under is gone.
    limits_gen: AtomicU64,
    table: [OnceLock<DevInfo>; MAX_ORDINALS],
    /// A device the program can use found no room in the usage region (more physical GPUs than it has entries).
    unplaced: AtomicU64,
    /// A device at an ordinal from `MAX_ORDINALS` on was seen (also unplaced; logged once).
    beyond: AtomicBool,
    /// The driver shows this process exactly one device.
    single: OnceLock<bool>,
    /// Some SM share applies somewhere (env/config, or an agent file).
    sm_limited: AtomicBool,
    /// Some SM share or (with a priority file) some priority applies somewhere: the launch hooks' fast "no"
    /// when false.
    launch_limited: AtomicBool,
    /// Some memory cap applies somewhere: first-use checks of launches are skipped when false.
    memory_limited: AtomicBool,
    /// `launch_limited` or `memory_limited`: the launch hooks' one fast "no" when false.
    launch_hooked: AtomicBool,
    /// While no launch needs a hook and at most one limits file is watched: that file's seq (0 without one)
    /// as of the limits in force; else [`NEVER`]. The launch exports forward without the guard while the file
    /// still says it ([`Devices::launch_unhooked`]). Stored after the flags and `seen` it follows.
    pass_seq: AtomicU64,
    /// The container's priority file, with the node's directory of every container's (read-only).
    priority: Option<PriorityRegion>,
    /// A priority applies but there is no priority file (warned once).
    warned_no_priority_file: AtomicBool,
    /// HAMi-core's region for HAMi's vGPU monitor (output only; none when it cannot be opened).
    hami: Option<hami::Hami>,
    /// The pid NVML knows this process by, when proven (0 = not proven): the one new pid in NVML's list around
    /// this process's first context creation on a device, singled out without any member's usage slot (which
    /// a tenant writes). The throttle reads its own NVML figures by it.
    host_pid: AtomicU32,
    /// When dead processes' slots were last reclaimed (`maybe_reclaim`).
    last_reclaim_ns: AtomicU64,
}

impl Devices {
    /// Devices accounted in `usage`, limited by `cfg` and the agent files `limits` (already opened: a reader and
    /// a watch mapping each).
    pub(crate) fn new(
        cfg: Config,
        usage: UsageRegion,
        limits: Vec<(LimitsReader, LimitsRegion)>,
        priority: Option<PriorityRegion>,
    ) -> Devices {
        let mut readers = Vec::new();
        let mut watch = Vec::new();
        let mut seen = Vec::new();
        for (r, w) in limits {
            seen.push(AtomicU64::new(r.snapshot().seq));
            readers.push(r);
            watch.push(w);
        }
        let d = Devices {
            usage,
            limits_gen: AtomicU64::new(0),
            agent: AgentLimits {
                watch,
                seen,
                readers: Lock::new(readers),
                refreshing: Lock::new(()),
            },
            table: std::array::from_fn(|_| OnceLock::new()),
            unplaced: AtomicU64::new(0),
            beyond: AtomicBool::new(false),
            single: OnceLock::new(),
            sm_limited: AtomicBool::new(false),
            launch_limited: AtomicBool::new(false),
            memory_limited: AtomicBool::new(false),
            launch_hooked: AtomicBool::new(false),
            pass_seq: AtomicU64::new(NEVER),
            priority,
            warned_no_priority_file: AtomicBool::new(false),
            hami: hami::Hami::open(&cfg),
            host_pid: AtomicU32::new(0),
            last_reclaim_ns: AtomicU64::new(0),
            cfg,
        };
        d.compute_flags();
        d.publish_pass();
        d
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    /// The container's usage region.
    pub(crate) fn usage(&self) -> &UsageRegion {
        &self.usage
    }

    /// This process's memory on usage entry `id` is now `data` bytes of allocations and `context` of
    /// overhead: HAMi's file shows it (a few relaxed stores; nothing without the file).
    #[inline]
    pub(crate) fn hami_publish(&self, id: DeviceId, data: u64, context: u64) {
        if let Some(h) = &self.hami {
            h.publish(id, data, context);
        }
    }

    /// The process's host pid (learned from NVML by this process), for HAMi's file.
    pub(crate) fn hami_host_pid(&self, host_pid: u32) {
        if let Some(h) = &self.hami {
            h.set_host_pid(host_pid);
        }
    }

    /// Before a launch on the hooked path: HAMi's kernel time and its monitor's launch gate (may sleep while
    /// the monitor blocks this container; only ever stricter).
    #[inline(always)]
    pub(crate) fn hami_pre_launch(&self) {
        if let Some(h) = &self.hami {
            h.pre_launch(|id| {
                let slot = self.usage.cached_slot()?;
                Some(self.usage.gpu_ns(slot, id).load(Ordering::Relaxed))
            });
        }
    }

    /// In a forked child: HAMi's slot is the parent's; the child claims its own when it first needs one.
    pub(crate) fn hami_forget_in_child(&self) {
        self.host_pid.store(0, Ordering::Relaxed);
        if let Some(h) = &self.hami {
            h.forget_in_child();
        }
    }

    /// The host pid is `pid`, proven by a diff of NVML's list (see the field).
    pub(crate) fn host_pid_proven(&self, pid: u32) {
        self.host_pid.store(pid, Ordering::Relaxed);
    }

    /// The pid NVML knows this process by, if a diff proved it (`host_pid_proven`).
    pub(crate) fn host_pid(&self) -> Option<u32> {
        Some(self.host_pid.load(Ordering::Relaxed)).filter(|p| *p != 0)
    }

    /// Dead processes' usage slots (and HAMi's) go back, at most every 100 ms (`cuMemGetInfo` and NVML
    /// queries: a crashed neighbour's memory shows as free, its pid no longer as the container's).
    #[inline]
    pub(crate) fn maybe_reclaim(&self) {
        let now = monotonic_ns();
        let last = self.last_reclaim_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 100_000_000
            && self
                .last_reclaim_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.reclaim_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn reclaim_now(&self) {
        self.usage.reclaim_dead();
        self.hami_reap();
    }

    /// HAMi's slots of processes gone without releasing them go back (slow paths: at most every 100 ms).
    fn hami_reap(&self) {
        if let Some(h) = &self.hami {
            h.reap();
        }
    }

    /// At exit: HAMi's slot goes back.
    pub(crate) fn hami_release(&self) {
        if let Some(h) = &self.hami {
            h.release();
        }
    }

    // ---- which device ----------------------------------------------------------------------------------------

    /// The device of the calling thread's current context, if any and accounted.
    ///
    /// A process that sees one device (the common container) skips asking the driver: every call is on
    /// ordinal 0, and one made without a current context fails in the driver, which undoes what it charged.
    #[inline]
    pub(crate) fn current(&self, cuda: &CudaTable) -> Option<Dev> {
        if self.single_device(cuda) {
            return self.device(cuda, 0);
        }
        self.device(cuda, self.context_ordinal(cuda)?)
    }

    /// [`Devices::current`] and `bytes` rounded up to its allocation granularity (one lookup of the device).
    #[inline(always)]
    pub(crate) fn current_rounded(&self, cuda: &CudaTable, bytes: u64) -> Option<(Dev, u64)> {
        let on = |ordinal| {
            let info = self.info(cuda, ordinal)?;
            Some((Dev { ordinal, id: info.id }, round_to(info.granularity, bytes)))
        };
        if self.single_device(cuda) {
            return on(0);
        }
        on(self.context_ordinal(cuda)?)
    }

    /// The ordinal of the current context's device, asked of the driver.
    fn context_ordinal(&self, cuda: &CudaTable) -> Option<CUdevice> {
        let mut d: CUdevice = 0;
        // SAFETY: valid out-pointer.
        unsafe { cuda.cuCtxGetDevice(&mut d) }.ok().then_some(d)
    }

    /// True when the driver reports exactly one device (asked once, after a successful answer).
    #[inline]
    pub(crate) fn single_device(&self, cuda: &CudaTable) -> bool {
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
    /// limits). `None` when the driver cannot say (not initialised, bad ordinal) or the region has no room.
    #[inline]
    pub(crate) fn device(&self, cuda: &CudaTable, ordinal: CUdevice) -> Option<Dev> {
        let info = self.info(cuda, ordinal)?;
        Some(Dev { ordinal, id: info.id })
    }

    fn info(&self, cuda: &CudaTable, ordinal: CUdevice) -> Option<&DevInfo> {
        let index = usize::try_from(ordinal).ok()?;
        if let Some(i) = self.table.get(index).and_then(|s| s.get()) {
            return Some(i);
        }
        self.learn(cuda, ordinal, index)
    }

    #[cold]
    fn learn(&self, cuda: &CudaTable, ordinal: CUdevice, index: usize) -> Option<&DevInfo> {
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
        let Some(slot) = self.table.get(index) else {
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
        let granularity = granularity(cuda, ordinal);
        let prio = self.priority.as_ref().and_then(|p| match p.device(&uuid.bytes) {
            Ok(id) => Some(id),
            Err(e) => {
                // Fail closed: best-effort work is gated as if a high-priority tenant were present, this
                // process is never high priority there, and a reservation refuses (no shared entry).
                log!(
                    Level::Error,
                    "device {ordinal}: no entry in the priority file ({e}): this process runs there as best                      effort next to an assumed high-priority tenant"
                );
                p.local_device(&uuid.bytes).ok()
            }
        });
        self.refresh_if_changed();
        // Its limits worked out and the device published under the refresh lock: a refresh either saw the
        // device, or ran before and its limits are the ones read here (one that ran in between skipped it).
        let policy = {
            let _one = self.agent.refreshing.lock();
            let policy = self.effective_read(u32::try_from(ordinal).ok(), &uuid.bytes);
            let info = DevInfo {
                id,
                prio,
                uuid: uuid.bytes,
                granularity,
                policy: PolicyWords::new(),
                request: AtomicU64::new(0),
            };
            if slot.set(info).is_ok() {
                if let Some(i) = slot.get() {
                    self.set_policy(index, i, &policy);
                }
            }
            policy
        };
        log!(
            Level::Info,
            "device {ordinal}: entry {}, granularity {granularity}, limits {policy:?}",
            id.index()
        );
        self.warn_unenforced_priority(ordinal, &policy);
        slot.get()
    }

    /// The UUID of a known ordinal.
    pub(crate) fn uuid_of(&self, ordinal: CUdevice) -> Option<[u8; 16]> {
        self.table
            .get(usize::try_from(ordinal).ok()?)?
            .get()
            .map(|i| i.uuid)
    }

    /// Ordinals learned so far, with their UUIDs.
    pub(crate) fn known(&self) -> impl Iterator<Item = (Dev, [u8; 16])> + '_ {
        self.table.iter().enumerate().filter_map(|(o, s)| {
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
    pub(crate) fn round(&self, cuda: &CudaTable, dev: Dev, bytes: u64) -> u64 {
        let g = self
            .info(cuda, dev.ordinal)
            .map_or(DEFAULT_GRANULARITY, |i| i.granularity);
        round_to(g, bytes)
    }

    /// True when a device could not be given a usage entry while memory limits apply: its allocations must be
    /// refused (fail closed) rather than go uncounted.
    pub(crate) fn refuse_unplaced(&self) -> bool {
        (self.unplaced.load(Ordering::Relaxed) != 0 || self.beyond.load(Ordering::Relaxed))
            && (self.cfg.has_limits() || !self.agent.watch.is_empty())
    }

    // ---- limits --------------------------------------------------------------------------------------------

    /// The effective limits of a known device (after picking up a changed limits file).
    #[inline]
    pub(crate) fn policy(&self, dev: Dev) -> Policy {
        self.refresh_if_changed();
        self.table
            .get(dev.ordinal as usize)
            .and_then(|s| s.get())
            .map_or(Policy::NONE, |i| i.policy.load().decode())
    }

    /// A known device's effective memory cap (after picking up a changed limits file): one word of the policy.
    #[inline]
    pub(crate) fn memory_cap(&self, dev: Dev) -> Option<u64> {
        self.refresh_if_changed();
        let i = self.table.get(dev.ordinal as usize).and_then(|s| s.get())?;
        match i.policy.memory_limit.load(Ordering::Relaxed) {
            0 => None,
            cap => Some(cap),
        }
    }

    /// The memory part of a known device's effective limits (after picking up a changed limits file), for
    /// admission: the cap, and the bytes kept for high-priority tenants unless this process is one. Three of
    /// the policy's words, read as [`Devices::policy`] decodes them.
    #[inline(always)]
    pub(crate) fn memory_limits(&self, dev: Dev) -> (Option<u64>, Option<u64>) {
        self.refresh_if_changed();
        let Some(i) = self.table.get(dev.ordinal as usize).and_then(|s| s.get()) else {
            return (None, None);
        };
        let w = &i.policy;
        let cap = w.memory_limit.load(Ordering::Relaxed);
        let reserved = match w.reserved_memory.load(Ordering::Relaxed) {
            0 => None,
            r => self.reserved_unless_high(dev, w, r),
        };
        ((cap != 0).then_some(cap), reserved)
    }

    /// `reserved` bytes kept for high-priority tenants, unless this process is one: high only where the agent
    /// granted it too (the own file's name), never on the process's word alone (out of line: rare).
    #[inline(never)]
    fn reserved_unless_high(&self, dev: Dev, w: &PolicyWords, reserved: u64) -> Option<u64> {
        let high = w.priority.load(Ordering::Relaxed) != cuquota_core::policy::PRIORITY_LOW
            && self
                .priority_entry(dev)
                .is_some_and(|e| e.granted_high(monotonic_ns()));
        (!high).then_some(reserved)
    }

    /// Effective limits of a device known by UUID and maybe a CUDA ordinal: env/config for the ordinal,
    /// tightened by every agent file (by UUID, else ordinal, else `all`). NVML-only processes without an
    /// ordinal get only the agent files' entries.
    pub(crate) fn effective(&self, ordinal: Option<u32>, uuid: &[u8; 16]) -> Policy {
        self.refresh_if_changed();
        self.effective_read(ordinal, uuid)
    }

    /// [`Devices::effective`] from the files as last read (inside a refresh: no refresh of its own).
    fn effective_read(&self, ordinal: Option<u32>, uuid: &[u8; 16]) -> Policy {
        let mut eff = ordinal.map_or(Policy::NONE, |o| self.cfg.policy(o));
        for r in self.agent.readers.lock().iter() {
            eff = eff.restrict(&r.snapshot().for_device(Some(uuid), ordinal));
        }
        eff
    }

    /// Whether NVML pid `pid` is one of the container's processes. When an agent limits file publishes the
    /// container's members (host pids from facts the tenant cannot rewrite), a pid belongs only if every such
    /// file lists it; otherwise the usage file's live slots decide, which is cooperative: any process of the
    /// container can write any pid there. The process's own pids (`own`: its pid and learned host pid) always
    /// belong. Slow path (NVML process queries): a lock and a scan.
    pub(crate) fn is_member(&self, pid: u32, own: &[u32]) -> bool {
        if pid == 0 {
            return false;
        }
        if own.contains(&pid) {
            return true;
        }
        self.refresh_if_changed();
        let mut agent_says = None;
        for r in self.agent.readers.lock().iter() {
            if r.snapshot().members().is_some() {
                agent_says = Some(agent_says.unwrap_or(true) && r.snapshot().is_member(pid));
            }
        }
        agent_says.unwrap_or_else(|| self.usage.is_member(pid))
    }

    /// Whether `dev`'s tenant is elastic (a memory request below its cap) and its guarantee then.
    pub(crate) fn elastic_request(&self, dev: Dev) -> Option<u64> {
        let mut p = self.policy(dev);
        let i = self.table.get(dev.ordinal as usize).and_then(|s| s.get())?;
        p.memory_request = match i.request.load(Ordering::Relaxed) {
            0 => None,
            r => Some(r),
        };
        p.is_elastic().then(|| p.request_in_force()).flatten()
    }

    /// Bytes from which an elastic tenant's linear allocations are movable (`CUQUOTA_ELASTIC_MIN_BYTES`).
    #[inline]
    pub(crate) fn elastic_min_bytes(&self) -> u64 {
        self.cfg.elastic_min_bytes
    }

    /// Whether an agent limits file says its agent reclaims device memory for waiting allocations
    /// (`LIMITS_FLAG_RECLAIM`). Slow path: the readers' lock.
    pub(crate) fn reclaims(&self) -> bool {
        self.refresh_if_changed();
        self.agent.readers.lock().iter().any(|r| r.snapshot().reclaims())
    }

    /// Whether a limits file asks this container to evict its movable memory on `dev` (`evict_mask`: the bit
    /// of the entry that selects `dev`, as `for_device` picks it). Slow path: the readers' lock.
    pub(crate) fn evict_asked(&self, dev: Dev) -> bool {
        let uuid = self.uuid_of(dev.ordinal);
        let ordinal = u32::try_from(dev.ordinal).ok();
        self.agent.readers.lock().iter().any(|r| {
            let t = r.snapshot();
            let at = |sel| t.entries.iter().position(|e| e.is_valid() && e.selector() == sel);
            let i = uuid
                .and_then(|u| at(DeviceSelector::Uuid(u)))
                .or_else(|| ordinal.and_then(|o| at(DeviceSelector::Index(o))))
                .or_else(|| at(DeviceSelector::All));
            i.is_some_and(|i| t.evict_mask >> i & 1 != 0)
        })
    }

    /// Whether an SM share may apply to some device (env/config, or any agent file's entry): false means no
    /// launch needs the throttle. One atomic load per limits file plus one flag.
    #[inline]
    pub(crate) fn sm_limited(&self) -> bool {
        self.refresh_if_changed();
        self.sm_limited.load(Ordering::Relaxed)
    }

    /// Whether a launch may need the throttle or the priority policy on some device: false means no launch
    /// does. One atomic load per limits file plus one flag.
    #[inline]
    pub(crate) fn launch_limited(&self) -> bool {
        self.refresh_if_changed();
        self.launch_limited.load(Ordering::Relaxed)
    }

    /// Whether this process has a priority file (a priority role on some device): copies and memsets are
    /// judged only then. One load, nothing refreshed: the file is opened at start.
    #[inline]
    pub(crate) fn prioritised(&self) -> bool {
        self.priority.is_some()
    }

    /// Whether a memory cap may apply to some device (env/config, or any agent file's entry), as of the last
    /// [`Devices::refresh_if_changed`] (the launch hooks' [`Devices::launch_hooked`] just made one). One load.
    #[inline]
    pub(crate) fn memory_limited(&self) -> bool {
        self.memory_limited.load(Ordering::Relaxed)
    }

    /// Whether a launch may need the throttle, the priority policy or a memory check (first use): false means
    /// no launch does. One atomic load per limits file plus one flag, as `launch_limited` alone cost before.
    #[inline]
    pub(crate) fn launch_hooked(&self) -> bool {
        self.refresh_if_changed();
        self.launch_hooked.load(Ordering::Relaxed)
    }

    fn compute_flags(&self) {
        let readers = self.agent.readers.lock();
        let agent = || {
            readers
                .iter()
                .flat_map(|r| r.snapshot().entries.iter())
                .filter(|e| e.is_valid())
                .map(|e| e.limits())
        };
        let sm = self.cfg.has_sm_limits() || agent().any(|p| p.throttles());
        // A priority file alone gives a role (its name, the agent's grant): every launch is judged.
        let prio = self.priority.is_some();
        self.sm_limited.store(sm, Ordering::Relaxed);
        self.launch_limited.store(sm || prio, Ordering::Relaxed);
        let mem = self.cfg.has_memory_limits() || agent().any(|p| p.memory.is_some());
        self.memory_limited.store(mem, Ordering::Relaxed);
        self.launch_hooked.store(sm || prio || mem, Ordering::Relaxed);
    }

    /// Sets [`Devices::pass_seq`] from the flags and `seen` (after both).
    fn publish_pass(&self) {
        let seq = match &self.agent.seen[..] {
            _ if self.launch_hooked.load(Ordering::Relaxed) => NEVER,
            [] => 0,
            [one] => one.load(Ordering::Relaxed),
            _ => NEVER,
        };
        self.pass_seq.store(seq, Ordering::Release);
    }

    /// The device's entry in the container's priority file, if there is a file and the entry (a local
    /// fallback entry does not count: it coordinates nobody).
    #[inline]
    pub(crate) fn priority_entry(&self, dev: Dev) -> Option<PriorityEntry<'_>> {
        let region = self.priority.as_ref()?;
        let id = self.table.get(dev.ordinal as usize)?.get()?.prio?;
        (!id.is_local()).then(|| region.entry(id))
    }

    /// A launch's priority role on `dev` and the entry it works on, given the process's own `policy`
    /// priority: the lower of that and the agent's grant (the own file's name, `.high` or not); none without a
    /// priority file. With no entry in the own file, best effort on a local entry (fail closed).
    #[inline]
    pub(crate) fn priority_role(
        &self,
        dev: Dev,
        policy: Option<Priority>,
    ) -> Option<(Priority, PriorityEntry<'_>)> {
        let region = self.priority.as_ref()?;
        let e = region.entry(self.table.get(dev.ordinal as usize)?.get()?.prio?);
        let role = if policy != Some(Priority::Low) && e.granted_high(monotonic_ns()) {
            Priority::High
        } else {
            Priority::Low
        };
        Some((role, e))
    }

    /// A priority without a priority file cannot be enforced: say so once (HAMi's deployments set
    /// `CUDA_TASK_PRIORITY` without one; failing every CUDA call there would break them).
    fn warn_unenforced_priority(&self, ordinal: CUdevice, policy: &Policy) {
        if let (Some(p), None) = (policy.priority, &self.priority) {
            if !self.warned_no_priority_file.swap(true, Ordering::Relaxed) {
                log!(
                    Level::Warn,
                    "device {ordinal}: priority {} is not enforced: no priority file (the node agent creates the \
                     container's file with `cuquota priority init`, mounts it read-write at {} and the node's \
                     priority directory read-only beside it, at the same path + `.d`; or set \
                     CUQUOTA_PRIORITY_FILE)",
                    p.as_str(),
                    cuquota_core::config::DEFAULT_PRIORITY_PATH
                );
            }
        }
    }

    /// Re-reads changed limits files and recomputes every known device's limits. One atomic load per file when
    /// nothing changed.
    #[inline]
    pub(crate) fn refresh_if_changed(&self) {
        if self.limits_changed() {
            self.refresh();
        }
    }

    /// Whether a limits file changed since it was last read (one atomic load per file).
    #[inline(always)]
    fn limits_changed(&self) -> bool {
        // Acquire: a new `seen` is stored after the flags and limits it brought (`refresh`).
        let changed = |w: &LimitsRegion, seen: &AtomicU64| seen.load(Ordering::Acquire) != w.seq();
        match (&self.agent.watch[..], &self.agent.seen[..]) {
            // No file, or the agent's one: no loop.
            ([], _) => false,
            ([w], [seen]) => changed(w, seen),
            (watch, seen) => watch.iter().zip(seen).any(|(w, s)| changed(w, s)),
        }
    }

    /// [`Devices::launch_hooked`]'s negation from loads alone, for the exports' pass-through (no refresh, no
    /// lock, nothing that can panic): a changed limits file says "hooked", and the hook re-reads it.
    #[inline(always)]
    pub(crate) fn launch_unhooked(&self) -> bool {
        // The word first (acquire), the file's seq after: a change since the limits in force says "hooked".
        let want = self.pass_seq.load(Ordering::Acquire);
        self.agent.watch.first().map_or(0, |w| w.seq()) == want
    }

    /// Counts limits-file changes (see [`Devices::refresh_if_changed`]).
    #[inline]
    pub(crate) fn limits_gen(&self) -> u64 {
        self.limits_gen.load(Ordering::SeqCst)
    }

    #[cold]
    fn refresh(&self) {
        // Said once the lock is let go: a stalled stderr must not hold every other thread (and fork) here.
        for (o, policy) in self.refresh_locked() {
            self.warn_unenforced_priority(o as CUdevice, &policy);
            log!(Level::Info, "device {o}: limits now {policy:?}");
        }
    }

    /// [`Devices::refresh`] under its lock: the known devices' new limits.
    fn refresh_locked(&self) -> Vec<(usize, Policy)> {
        let _one = self.agent.refreshing.lock();
        if !self.limits_changed() {
            return Vec::new(); // refreshed by another thread meanwhile
        }
        self.limits_gen.fetch_add(1, Ordering::SeqCst);
        // The seq each changed file was read at, stored as seen only once its limits are in force: until then
        // every thread that looks finds the file changed and waits here (no launch or admission in between
        // under the flags of before).
        let mut read = Vec::new();
        {
            let mut readers = self.agent.readers.lock();
            for (i, (r, w)) in readers.iter_mut().zip(&self.agent.watch).enumerate() {
                if self
                    .agent
                    .seen
                    .get(i)
                    .is_some_and(|s| s.load(Ordering::Acquire) != w.seq())
                {
                    r.refresh();
                    // The seq read, not the file's now: a write after the read is still to be seen.
                    read.push((i, r.seen_seq()));
                }
            }
            // Re-bound to another file: this process's charges would be invisible to the container's others.
            // A binding this version cannot read names no file: this one is superseded (fail closed).
            let bound: Vec<_> = readers
                .iter()
                .filter_map(|r| {
                    r.snapshot().usage_id().unwrap_or_else(|e| {
                        log!(Level::Error, "{}: {e}", r.region().path().display());
                        Some(FileId::NONE)
                    })
                })
                .collect();
            if self.usage.follow_binding(&bound) {
                match self.usage.check() {
                    Err(e) => log!(Level::Error, "{e}"),
                    Ok(()) => log!(
                        Level::Info,
                        "usage file {}: bound again",
                        self.usage.path().display()
                    ),
                }
            }
        }
        self.compute_flags();
        let mut now = Vec::new();
        for (o, slot) in self.table.iter().enumerate() {
            if let Some(i) = slot.get() {
                let policy = self.effective_read(Some(o as u32), &i.uuid);
                self.set_policy(o, i, &policy);
                now.push((o, policy));
            }
        }
        for (i, seq) in read {
            self.agent.seen[i].store(seq, Ordering::SeqCst);
        }
        self.publish_pass();
        now
    }

    /// Puts `policy` in force for known device `o` (its words, the usage file's copy, HAMi's file).
    fn set_policy(&self, o: usize, i: &DevInfo, policy: &Policy) {
        i.policy.store(&policy.raw());
        i.request
            .store(policy.memory_request.unwrap_or(0), Ordering::Relaxed);
        self.usage.report_limits(i.id, policy);
        if let Some(h) = &self.hami {
            h.device(o, i.id, &i.uuid, policy);
        }
    }

    // ---- fork ----------------------------------------------------------------------------------------------

    /// Takes the lock of the agent readers (see `state`'s fork handlers for the order).
    pub(crate) fn fork_prepare(&self) {
        crate::locks::hold_all([&self.agent.refreshing]);
        crate::locks::hold_all([&self.agent.readers]);
    }

    /// Undoes [`Devices::fork_prepare`] (parent and child).
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(crate) unsafe fn fork_release(&self, side: crate::locks::Side) {
        // SAFETY: the caller's contract.
        unsafe {
            crate::locks::release_all([&self.agent.readers], side);
            crate::locks::release_all([&self.agent.refreshing], side);
        }
    }
}

/// The device's minimum allocation granularity (`cuMemGetAllocationGranularity`), or the 2 MiB default.
fn granularity(cuda: &CudaTable, ordinal: CUdevice) -> u64 {
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
    let r = unsafe { cuda.cuMemGetAllocationGranularity(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
    if r.ok() && g.is_power_of_two() {
        g as u64
    } else {
        DEFAULT_GRANULARITY
    }
}

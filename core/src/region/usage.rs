//! The usage file: what a container's processes have charged, shared read-write by all of them.
//!
//! Protocols (every shared word an atomic; no lock; nothing a dead process can hold):
//! - **owner words** (slots and device entries): pid, state and a 24-bit generation packed in one `u64`
//!   ([`owner_word`]); every transition is one CAS on the whole word, so it is ABA-free and a half-done
//!   transition is always attributable to a pid that can be checked for liveness.
//! - **slot**: free → claiming(pid) → live(pid) by the owner; live/claiming(dead pid) → reclaiming(reclaimer)
//!   → free by anyone who noticed the death (counters zeroed first). A forked child forgets its parent's
//!   slot ([`UsageRegion::forget_slot_in_child`]) and claims its own.
//! - **device entry**: free → claiming(pid) → live, with the UUID written in between; never freed. A claimer
//!   that died is taken over. Scanners wait for a claiming entry to resolve, so one UUID never gets two
//!   entries.
//! - **admission** ([`UsageRegion::try_charge`]): `fetch_add` on the own slot, then sum every slot up to
//!   `proc_high_water`; over the limit → `fetch_sub` and refuse. All SeqCst: of two racing reservations at
//!   least one sees the other, so the cap is never exceeded.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::header::{self, Header, Word};
use super::layout::*;
use super::liveness::{current_pid, current_start_time, is_alive};
use super::map::{Access, Mapping};
use super::RegionError;
use crate::policy::Policy;

const NO_SLOT: u32 = u32::MAX;
/// How long a device lookup waits for a live claimer to finish its claim.
const DEVICE_CLAIM_WAIT: Duration = Duration::from_secs(2);

/// A process slot index in the usage file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(u32);

impl SlotId {
    /// The slot's index (0-based).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A device entry index in the usage file (not a CUDA ordinal: entries are claimed by UUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(u32);

impl DeviceId {
    /// The entry's index (0-based), which also indexes `mem_used` / `gpu_ns` in slots.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// An allocation refused because the container would exceed its memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    /// Bytes the container had in use (without this request) when the check ran.
    pub used: u64,
    /// The limit, bytes.
    pub limit: u64,
    /// Bytes requested.
    pub requested: u64,
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "allocation of {} refused: container uses {} of its {} limit",
            crate::units::format_size(self.requested),
            crate::units::format_size(self.used),
            crate::units::format_size(self.limit)
        )
    }
}

impl std::error::Error for OverLimit {}

/// State of a process slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Unused.
    Free,
    /// Being claimed by `pid`.
    Claiming,
    /// Owned by a live (or not yet reclaimed) `pid`.
    Live,
    /// Being reclaimed by `pid`.
    Reclaiming,
}

impl SlotState {
    fn from_raw(s: u32) -> SlotState {
        match s {
            STATE_CLAIMING => SlotState::Claiming,
            STATE_LIVE => SlotState::Live,
            STATE_RECLAIMING => SlotState::Reclaiming,
            _ => SlotState::Free,
        }
    }
}

/// A non-free process slot, copied out (slow path: `cuquota status`, NVML filtering).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The slot.
    pub slot: SlotId,
    /// Owner pid (in the container's pid namespace), or the claimer/reclaimer for transient states.
    pub pid: u32,
    /// Owner pid as NVML reports it, 0 if unknown.
    pub host_pid: u32,
    /// Slot state.
    pub state: SlotState,
    /// Owner start time (clock ticks after boot).
    pub start_time: u64,
    /// Bytes charged per device entry.
    pub mem_used: [u64; MAX_DEVICES],
    /// GPU ns per device entry.
    pub gpu_ns: [u64; MAX_DEVICES],
}

/// A claimed device entry, copied out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The entry.
    pub id: DeviceId,
    /// Device UUID.
    pub uuid: [u8; 16],
    /// The effective limits a process last reported enforcing (informational).
    pub limits: Policy,
    /// Bytes the container has charged.
    pub used: u64,
    /// Cumulative GPU busy ns.
    pub busy_ns: u64,
    /// Cumulative ns launches waited for the SM limit.
    pub throttled_ns: u64,
    /// Allocations refused at the cap, cumulative.
    pub refusals: u64,
}

/// The usage file, mapped read-write.
pub struct UsageRegion {
    map: Mapping,
    /// This process's slot (cached by [`UsageRegion::process_slot`]), `NO_SLOT` when none.
    own_slot: AtomicU32,
}

fn next_gen(word: u64) -> u32 {
    owner_generation(word).wrapping_add(1)
}

impl UsageRegion {
    /// Opens `path`, creating it (mode 0666, so every user in the container can share it) and initialising the
    /// header if needed. Safe with any number of processes doing the same at once.
    pub fn open(path: &Path) -> Result<UsageRegion, RegionError> {
        Self::open_with(path, Access::Create(0o666))
    }

    /// Opens an existing, initialised usage file (for `cuquota status`: never creates one).
    pub fn open_existing(path: &Path) -> Result<UsageRegion, RegionError> {
        Self::open_with(path, Access::ReadWrite)
    }

    fn open_with(path: &Path, access: Access) -> Result<UsageRegion, RegionError> {
        let map = Mapping::open(path, access, std::mem::size_of::<UsageFile>())?;
        let region = UsageRegion {
            map,
            own_slot: AtomicU32::new(NO_SLOT),
        };
        region.validate(matches!(access, Access::Create(_)))?;
        Ok(region)
    }

    fn file(&self) -> &UsageFile {
        // SAFETY: the mapping is exactly size_of::<UsageFile>() bytes (checked at open), page-aligned, and
        // UsageFile consists only of atomics, so a shared reference is valid whatever other processes write;
        // it cannot outlive `self`, which owns the mapping.
        unsafe { &*self.map.ptr().cast::<UsageFile>() }
    }

    fn validate(&self, init: bool) -> Result<(), RegionError> {
        let h = &self.file().header;
        let fields = [
            (
                "header_size",
                Word::U32(&h.header_size),
                std::mem::size_of::<UsageHeader>() as u64,
            ),
            (
                "total_size",
                Word::U64(&h.total_size),
                std::mem::size_of::<UsageFile>() as u64,
            ),
            ("max_devices", Word::U32(&h.max_devices), MAX_DEVICES as u64),
            ("max_procs", Word::U32(&h.max_procs), MAX_PROCS as u64),
        ];
        let header = Header {
            magic: (&h.magic, USAGE_MAGIC),
            abi_version: &h.abi_version,
            fields: &fields,
        };
        // A zero body is a valid empty state.
        header::validate(self.map.path(), &header, init)
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    fn high_water(&self) -> usize {
        (self.file().header.proc_high_water.load(Ordering::SeqCst) as usize).min(MAX_PROCS)
    }

    // ---- process slots -------------------------------------------------------------------------------------

    /// Claims a slot for the calling process (pid + start time). Slow path: reads `/proc/self/stat`. If every
    /// slot is taken, reclaims dead processes once and retries.
    pub fn claim_slot(&self) -> Result<SlotId, RegionError> {
        self.claim_slot_as(current_pid(), current_start_time())
    }

    /// Claims a slot recording `pid` and `start_time` (tests use a fake start time to simulate pid reuse).
    pub fn claim_slot_as(&self, pid: u32, start_time: u64) -> Result<SlotId, RegionError> {
        let f = self.file();
        for pass in 0..2 {
            for (i, slot) in f.slots.iter().enumerate() {
                let w = slot.owner.load(Ordering::Acquire);
                if owner_state(w) != STATE_FREE {
                    continue;
                }
                let claiming = owner_word(pid, STATE_CLAIMING, next_gen(w));
                if slot
                    .owner
                    .compare_exchange(w, claiming, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                slot.start_time.store(start_time, Ordering::Relaxed);
                slot.host_pid.store(0, Ordering::Relaxed);
                // Free slots are zero already (reclaim zeroes before freeing); make sure anyway: it is ours.
                for c in slot.mem_used.iter().chain(slot.gpu_ns.iter()) {
                    c.store(0, Ordering::Relaxed);
                }
                // Publish the slot to summers before it can hold any charge.
                f.header.proc_high_water.fetch_max(i as u32 + 1, Ordering::SeqCst);
                let live = owner_word(pid, STATE_LIVE, next_gen(claiming));
                if slot
                    .owner
                    .compare_exchange(claiming, live, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(SlotId(i as u32));
                }
                // Someone judged us dead (only possible with a fake pid): look for another slot.
            }
            if pass == 0 {
                self.reclaim_dead();
            }
        }
        Err(RegionError::SlotsExhausted {
            path: self.path().to_path_buf(),
            max: MAX_PROCS,
        })
    }

    /// Frees `slot` (its charges are dropped): for a process that exits cleanly. Only the owner may call it.
    pub fn release_slot(&self, slot: SlotId) {
        let s = &self.file().slots[slot.index()];
        let w = s.owner.load(Ordering::Acquire);
        if owner_state(w) != STATE_LIVE {
            return;
        }
        let reclaiming = owner_word(owner_pid(w), STATE_RECLAIMING, next_gen(w));
        if s.owner
            .compare_exchange(w, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            Self::zero_and_free(s, reclaiming);
        }
    }

    fn zero_and_free(s: &UsageSlot, reclaiming: u64) {
        for c in s.mem_used.iter().chain(s.gpu_ns.iter()) {
            c.store(0, Ordering::SeqCst);
        }
        s.start_time.store(0, Ordering::Relaxed);
        s.host_pid.store(0, Ordering::Relaxed);
        let _ = s.owner.compare_exchange(
            reclaiming,
            owner_word(0, STATE_FREE, next_gen(reclaiming)),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// This process's slot, claimed on first use and cached. Hot path after the first call: one atomic load.
    pub fn process_slot(&self) -> Result<SlotId, RegionError> {
        let cached = self.own_slot.load(Ordering::Acquire);
        if cached != NO_SLOT {
            return Ok(SlotId(cached));
        }
        let slot = self.claim_slot()?;
        match self
            .own_slot
            .compare_exchange(NO_SLOT, slot.0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(slot),
            Err(other) => {
                // Another thread won the race: keep its slot, give ours back.
                self.release_slot(slot);
                Ok(SlotId(other))
            }
        }
    }

    /// The cached slot of this process, if claimed (one atomic load).
    #[inline]
    pub fn cached_slot(&self) -> Option<SlotId> {
        let s = self.own_slot.load(Ordering::Acquire);
        (s != NO_SLOT).then_some(SlotId(s))
    }

    /// Forgets the cached slot without touching shared memory. Async-signal-safe (one atomic store): call it
    /// from a `pthread_atfork` child handler, so the child claims its own slot instead of charging (or freeing
    /// from) its parent's. The parent's slot is unaffected.
    pub fn forget_slot_in_child(&self) {
        self.own_slot.store(NO_SLOT, Ordering::Release);
    }

    /// Frees this process's cached slot, if any (clean exit).
    pub fn release_process_slot(&self) {
        let s = self.own_slot.swap(NO_SLOT, Ordering::AcqRel);
        if s != NO_SLOT {
            self.release_slot(SlotId(s));
        }
    }

    /// Records the pid NVML reports for the slot's owner (the host pid namespace), for filtering NVML lists.
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) {
        self.file().slots[slot.index()]
            .host_pid
            .store(host_pid, Ordering::Release);
    }

    /// Reclaims the slots of dead processes (pid gone, zombie, or pid reused: start time differs). Returns how
    /// many were reclaimed. Slow path: reads `/proc`.
    pub fn reclaim_dead(&self) -> usize {
        let me = current_pid();
        let mut n = 0;
        for s in &self.file().slots[..self.high_water()] {
            let w = s.owner.load(Ordering::Acquire);
            let dead = match owner_state(w) {
                STATE_FREE => false,
                STATE_LIVE => !is_alive(owner_pid(w), Some(s.start_time.load(Ordering::Relaxed))),
                // A transient state: only a vanished pid means its process died mid-transition.
                _ => !is_alive(owner_pid(w), None),
            };
            if !dead {
                continue;
            }
            let reclaiming = owner_word(me, STATE_RECLAIMING, next_gen(w));
            if s.owner
                .compare_exchange(w, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                Self::zero_and_free(s, reclaiming);
                n += 1;
            }
        }
        n
    }

    /// Non-free slots, copied out (slow path; allocates).
    pub fn processes(&self) -> Vec<ProcessInfo> {
        let mut out = Vec::new();
        for (i, s) in self.file().slots[..self.high_water()].iter().enumerate() {
            let w = s.owner.load(Ordering::Acquire);
            if owner_state(w) == STATE_FREE {
                continue;
            }
            let load = |a: &[AtomicU64; MAX_DEVICES]| {
                let mut v = [0u64; MAX_DEVICES];
                for (o, c) in v.iter_mut().zip(a.iter()) {
                    *o = c.load(Ordering::Relaxed);
                }
                v
            };
            out.push(ProcessInfo {
                slot: SlotId(i as u32),
                pid: owner_pid(w),
                host_pid: s.host_pid.load(Ordering::Relaxed),
                state: SlotState::from_raw(owner_state(w)),
                start_time: s.start_time.load(Ordering::Relaxed),
                mem_used: load(&s.mem_used),
                gpu_ns: load(&s.gpu_ns),
            });
        }
        out
    }

    /// Whether `pid` (container or host pid namespace) owns a live slot: for filtering NVML's process lists
    /// down to this container's processes. Slow path (scans all slots, no allocation).
    pub fn is_member(&self, pid: u32) -> bool {
        pid != 0
            && self.file().slots[..self.high_water()].iter().any(|s| {
                let w = s.owner.load(Ordering::Acquire);
                owner_state(w) == STATE_LIVE
                    && (owner_pid(w) == pid || s.host_pid.load(Ordering::Relaxed) == pid)
            })
    }

    // ---- device entries ------------------------------------------------------------------------------------

    /// The entry for device `uuid`, claiming a free one if no entry has it yet. Slow path (once per process
    /// and device); may wait up to ~2 s for another process's claim in progress.
    pub fn device(&self, uuid: &[u8; 16]) -> Result<DeviceId, RegionError> {
        let words = uuid_to_words(uuid);
        let f = self.file();
        let me = current_pid();
        let deadline = Instant::now() + DEVICE_CLAIM_WAIT;
        loop {
            let mut first_free = None;
            let mut claiming = None;
            for (i, d) in f.devices.iter().enumerate() {
                let w = d.owner.load(Ordering::Acquire);
                match owner_state(w) {
                    STATE_LIVE => {
                        if d.uuid[0].load(Ordering::Relaxed) == words[0]
                            && d.uuid[1].load(Ordering::Relaxed) == words[1]
                        {
                            return Ok(DeviceId(i as u32));
                        }
                    }
                    STATE_FREE => {
                        first_free.get_or_insert((i, w));
                    }
                    _ => {
                        claiming.get_or_insert((i, w));
                    }
                }
            }
            let (i, w) = match (claiming, first_free) {
                // An unfinished claim might be for our UUID: resolve it before claiming a new entry.
                (Some((i, w)), _) => {
                    if is_alive(owner_pid(w), None) {
                        if Instant::now() >= deadline {
                            return Err(RegionError::DeviceClaimBusy {
                                path: self.path().to_path_buf(),
                                pid: owner_pid(w),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    (i, w) // its claimer died: take it over
                }
                (None, Some(free)) => free,
                (None, None) => {
                    return Err(RegionError::DevicesExhausted {
                        path: self.path().to_path_buf(),
                        max: MAX_DEVICES,
                    })
                }
            };
            let d = &f.devices[i];
            let mine = owner_word(me, STATE_CLAIMING, next_gen(w));
            if d.owner
                .compare_exchange(w, mine, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            d.uuid[0].store(words[0], Ordering::Relaxed);
            d.uuid[1].store(words[1], Ordering::Relaxed);
            let ready = owner_word(me, STATE_LIVE, next_gen(mine));
            if d.owner
                .compare_exchange(mine, ready, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(DeviceId(i as u32));
            }
        }
    }

    /// The entry for `uuid` if one is ready (no claiming).
    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<DeviceId> {
        let words = uuid_to_words(uuid);
        self.file()
            .devices
            .iter()
            .position(|d| {
                owner_state(d.owner.load(Ordering::Acquire)) == STATE_LIVE
                    && d.uuid[0].load(Ordering::Relaxed) == words[0]
                    && d.uuid[1].load(Ordering::Relaxed) == words[1]
            })
            .map(|i| DeviceId(i as u32))
    }

    /// Ready device entries with the container's totals (slow path; allocates).
    pub fn devices(&self) -> Vec<DeviceInfo> {
        let f = self.file();
        let mut out = Vec::new();
        for (i, d) in f.devices.iter().enumerate() {
            if owner_state(d.owner.load(Ordering::Acquire)) != STATE_LIVE {
                continue;
            }
            let id = DeviceId(i as u32);
            out.push(DeviceInfo {
                id,
                uuid: words_to_uuid([
                    d.uuid[0].load(Ordering::Relaxed),
                    d.uuid[1].load(Ordering::Relaxed),
                ]),
                limits: d.limits.load().decode(),
                used: self.container_used(id),
                busy_ns: d.busy_ns.load(Ordering::Relaxed),
                throttled_ns: d.throttled_ns.load(Ordering::Relaxed),
                refusals: d.refusals.load(Ordering::Relaxed),
            });
        }
        out
    }

    /// Records the effective limits a process enforces on `dev` (informational, shown by `cuquota status`).
    pub fn report_limits(&self, dev: DeviceId, limits: &Policy) {
        self.file().devices[dev.index()].limits.store(&limits.raw());
    }

    // ---- accounting: the hot path (no allocation, no lock, no syscall) -------------------------------------

    /// Reserves `bytes` on `dev` for `slot` if the container stays within `limit` (`None` = no limit: always
    /// succeeds and just records). Exact under races. Does not reclaim dead processes: see [`UsageRegion::charge`].
    pub fn try_charge(
        &self,
        slot: SlotId,
        dev: DeviceId,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<(), OverLimit> {
        let cell = &self.file().slots[slot.index()].mem_used[dev.index()];
        let Some(limit) = limit else {
            cell.fetch_add(bytes, Ordering::SeqCst);
            return Ok(());
        };
        if bytes > limit {
            return Err(OverLimit {
                used: self.container_used(dev),
                limit,
                requested: bytes,
            });
        }
        cell.fetch_add(bytes, Ordering::SeqCst);
        let used = self.container_used(dev);
        if used > limit {
            cell.fetch_sub(bytes, Ordering::SeqCst);
            return Err(OverLimit {
                used: used.saturating_sub(bytes),
                limit,
                requested: bytes,
            });
        }
        Ok(())
    }

    /// [`UsageRegion::try_charge`], and when it fails, reclaims dead processes (slow path, reads `/proc`) and
    /// retries once. Still no lock.
    pub fn charge(
        &self,
        slot: SlotId,
        dev: DeviceId,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<(), OverLimit> {
        match self.try_charge(slot, dev, bytes, limit) {
            Err(_) if self.reclaim_dead() > 0 => self.try_charge(slot, dev, bytes, limit),
            Err(_) => {
                // A racing reservation may have made us fail spuriously; one more look.
                self.try_charge(slot, dev, bytes, limit)
            }
            ok => ok,
        }
    }

    /// Returns `bytes` on `dev` from `slot`. Never underflows: a counter cannot go below zero (HAMi's
    /// "terabytes used" bug); returns the bytes actually removed.
    pub fn uncharge(&self, slot: SlotId, dev: DeviceId, bytes: u64) -> u64 {
        let cell = &self.file().slots[slot.index()].mem_used[dev.index()];
        let prev = cell
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(bytes))
            })
            .unwrap_or_else(|v| v);
        prev.min(bytes)
    }

    /// Bytes the whole container has charged on `dev` (sum over slots; saturating).
    pub fn container_used(&self, dev: DeviceId) -> u64 {
        let d = dev.index();
        self.file().slots[..self.high_water()]
            .iter()
            .fold(0u64, |acc, s| {
                acc.saturating_add(s.mem_used[d].load(Ordering::SeqCst))
            })
    }

    /// Bytes `slot` has charged on `dev`.
    pub fn slot_used(&self, slot: SlotId, dev: DeviceId) -> u64 {
        self.file().slots[slot.index()].mem_used[dev.index()].load(Ordering::SeqCst)
    }

    // ---- throttle state (meaning owned by the shim's throttle) ---------------------------------------------

    /// The device entry's throttle words.
    pub fn throttle(&self, dev: DeviceId) -> &[AtomicU64; THROTTLE_WORDS] {
        &self.file().devices[dev.index()].throttle
    }

    /// The device entry's cumulative busy time (ns).
    pub fn busy_ns(&self, dev: DeviceId) -> &AtomicU64 {
        &self.file().devices[dev.index()].busy_ns
    }

    /// Time the container's launches on `dev` waited for the SM limit (ns), cumulative.
    pub fn throttled_ns(&self, dev: DeviceId) -> &AtomicU64 {
        &self.file().devices[dev.index()].throttled_ns
    }

    /// Counts one allocation refused at the cap on `dev`.
    pub fn count_refusal(&self, dev: DeviceId) {
        self.file().devices[dev.index()]
            .refusals
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The slot's GPU time on `dev` (ns).
    pub fn gpu_ns(&self, slot: SlotId, dev: DeviceId) -> &AtomicU64 {
        &self.file().slots[slot.index()].gpu_ns[dev.index()]
    }
}

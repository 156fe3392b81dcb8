//! The priority file: one small region shared by every container on a node that has a priority on a GPU, so
//! that best-effort tenants can see what high-priority tenants in *other* containers are doing (each
//! container's usage file is its own; nothing else crosses containers).
//!
//! Per GPU (entries claimed by UUID, like usage device entries) it holds:
//! - what high-priority tenants publish at each launch: when they last launched and when the work they have
//!   queued is estimated to be done ([`PriorityEntry::note_hp_launch`], [`PriorityEntry::hp`]);
//! - the best-effort **queue token**: while a high-priority tenant is present, a best-effort kernel may be
//!   queued only by the holder of this one word, so at most one best-effort kernel (of all best-effort tenants)
//!   sits in front of the next high-priority burst ([`PriorityEntry::take_token`]);
//! - **in-flight reservations**: a best-effort allocation that must leave reserved memory free announces its
//!   size here between reading the device's free memory and the driver's allocation, so two racing
//!   allocations (any containers) each count the other ([`PriorityEntry::claim_inflight`]).
//!
//! Every word is an atomic; nothing is a lock. Every value written here has an expiry or is a time, and a time
//! implausibly far in the future (a scribbling tenant, or a file kept across a reboot: CLOCK_MONOTONIC restarts
//! near 0) is treated as absent — so nobody can make others wait for ever through this file. What a tenant
//! *can* do with its write access is documented in docs/priority.md (threat model).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::claim::claim_device;
use super::header::{self, Header, Word};
use super::layout::*;
use super::map::{Access, Mapping};
use super::RegionError;

/// A high-priority time more than this ahead of `now` is garbage (clocks of one node agree).
pub const HP_MAX_AHEAD_NS: u64 = 10_000_000_000;
/// A token held until more than this ahead of `now` is garbage: free.
pub const TOKEN_MAX_AHEAD_NS: u64 = 10_000_000_000;
/// An in-flight reservation expires this long after it was claimed (its process died mid-allocation).
pub const INFLIGHT_TTL_S: u32 = 10;

/// A device entry index in the priority file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PriorityDeviceId(u32);

impl PriorityDeviceId {
    /// The entry's index (0-based).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The priority file, mapped read-write.
pub struct PriorityRegion {
    map: Mapping,
}

/// What high-priority tenants last published on a device (garbage already dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HpState {
    /// When one last launched (0 = never, or garbage).
    pub last_launch: u64,
    /// When their queued work is estimated done (0 = nothing known, or garbage).
    pub busy_until: u64,
}

/// A claimed in-flight reservation: give it back with [`PriorityEntry::release_inflight`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inflight {
    slot: usize,
    word: u64,
}

/// One device entry's counters and state, copied out (slow path: `cuquota priority show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityDeviceInfo {
    /// The entry.
    pub id: PriorityDeviceId,
    /// Device UUID.
    pub uuid: [u8; 16],
    /// High-priority state as published.
    pub hp: HpState,
    /// High-priority launches, cumulative.
    pub hp_launches: u64,
    /// The token word (0 = free).
    pub be_token: u64,
    /// Best-effort launches made while a high-priority tenant was present.
    pub be_launches: u64,
    /// Best-effort launches that waited.
    pub be_waits: u64,
    /// Total best-effort waiting, ns.
    pub be_waited_ns: u64,
    /// Reservation refusals.
    pub reserve_refusals: u64,
    /// Bytes of unexpired in-flight reservations.
    pub inflight_bytes: u64,
}

impl PriorityRegion {
    /// Creates `path` (mode 0666: containers of different users share it) or opens it, initialising the header
    /// if needed: for the node agent (`cuquota priority init`) and tests.
    pub fn create(path: &Path) -> Result<PriorityRegion, RegionError> {
        Self::open_with(path, Access::Create(0o666))
    }

    /// Opens an existing, initialised priority file read-write (the shim: it never creates one, since a file
    /// created inside one container would coordinate nobody).
    pub fn open(path: &Path) -> Result<PriorityRegion, RegionError> {
        Self::open_with(path, Access::ReadWrite)
    }

    fn open_with(path: &Path, access: Access) -> Result<PriorityRegion, RegionError> {
        let mut map = Mapping::open(path, access, std::mem::size_of::<PriorityFile>())?;
        // Every container with a priority can truncate this file: survive it (fault.rs). Its zero pages read as
        // "no high-priority tenant, no token, nothing in flight" — what a tenant could write anyway.
        map.guard_truncation();
        let region = PriorityRegion { map };
        let h = &region.file().header;
        let fields = [
            (
                "header_size",
                Word::U32(&h.header_size),
                std::mem::size_of::<PriorityHeader>() as u64,
            ),
            (
                "total_size",
                Word::U64(&h.total_size),
                std::mem::size_of::<PriorityFile>() as u64,
            ),
            ("max_devices", Word::U32(&h.max_devices), MAX_DEVICES as u64),
            (
                "inflight_slots",
                Word::U32(&h.inflight_slots),
                PRIORITY_INFLIGHT as u64,
            ),
        ];
        let header = Header {
            magic: (&h.magic, PRIORITY_MAGIC),
            abi_version: &h.abi_version,
            fields: &fields,
        };
        header::validate(region.path(), &header, matches!(access, Access::Create(_)))?;
        Ok(region)
    }

    fn file(&self) -> &PriorityFile {
        // SAFETY: the mapping is exactly size_of::<PriorityFile>() bytes (checked at open), page-aligned, and
        // PriorityFile consists only of atomics, so a shared reference is valid whatever other processes write;
        // it cannot outlive `self`, which owns the mapping.
        unsafe { &*self.map.ptr().cast::<PriorityFile>() }
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// The entry for device `uuid`, claiming a free one if no entry has it yet. Slow path (once per process
    /// and device); may wait up to ~2 s for another process's claim in progress. A claimer in another pid
    /// namespace may look dead from here and have its claim taken over: harmless, the CAS on the owner word
    /// decides, and both end with one entry for the UUID.
    pub fn device(&self, uuid: &[u8; 16]) -> Result<PriorityDeviceId, RegionError> {
        claim_device(&self.file().devices, uuid, self.path()).map(|i| PriorityDeviceId(i as u32))
    }

    /// One device entry's words.
    pub fn entry(&self, id: PriorityDeviceId) -> PriorityEntry<'_> {
        PriorityEntry {
            d: &self.file().devices[id.index()],
        }
    }

    /// Ready device entries, copied out (slow path; allocates).
    pub fn devices(&self, now_ns: u64) -> Vec<PriorityDeviceInfo> {
        let f = self.file();
        let mut out = Vec::new();
        for (i, d) in f.devices.iter().enumerate() {
            if owner_state(d.owner.load(Ordering::Acquire)) != STATE_LIVE {
                continue;
            }
            let e = PriorityEntry { d };
            let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
            out.push(PriorityDeviceInfo {
                id: PriorityDeviceId(i as u32),
                uuid: words_to_uuid([r(&d.uuid[0]), r(&d.uuid[1])]),
                hp: e.hp(now_ns),
                hp_launches: r(&d.hp_launches),
                be_token: r(&d.be_token),
                be_launches: r(&d.be_launches),
                be_waits: r(&d.be_waits),
                be_waited_ns: r(&d.be_waited_ns),
                reserve_refusals: r(&d.reserve_refusals),
                inflight_bytes: e.inflight_bytes(None, (now_ns / 1_000_000_000) as u32),
            });
        }
        out
    }
}

/// The words of one device entry, with the protocols on them. Hot path: atomics only.
#[derive(Clone, Copy)]
pub struct PriorityEntry<'a> {
    d: &'a PriorityDevice,
}

impl<'a> PriorityEntry<'a> {
    /// A view of raw words (the shim's unit tests build entries in memory).
    pub fn new(d: &'a PriorityDevice) -> Self {
        PriorityEntry { d }
    }

    // ---- high priority ---------------------------------------------------------------------------------------

    /// A high-priority launch at `now` whose work (with what its process queued before) is estimated done at
    /// `busy_until`. Two stores in the common case; a garbage `busy_until` word is overwritten.
    #[inline]
    pub fn note_hp_launch(&self, now: u64, busy_until: u64) {
        self.d.hp_last_launch.store(now, Ordering::Release);
        let _ = self
            .d
            .hp_busy_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur < busy_until || cur > now.saturating_add(HP_MAX_AHEAD_NS)).then_some(busy_until)
            });
        self.d.hp_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// What high-priority tenants published, as of `now`; times implausibly in the future read as absent.
    #[inline]
    pub fn hp(&self, now: u64) -> HpState {
        let sane = |t: u64| {
            if t > now.saturating_add(HP_MAX_AHEAD_NS) {
                0
            } else {
                t
            }
        };
        HpState {
            last_launch: sane(self.d.hp_last_launch.load(Ordering::Acquire)),
            busy_until: sane(self.d.hp_busy_until.load(Ordering::Acquire)),
        }
    }

    // ---- the best-effort queue token ------------------------------------------------------------------------

    /// Takes the token if it is free (0), expired (its time passed) or garbage (too far ahead), holding it
    /// until `hold_until` at most. `Ok(value)` = ours (give `value` to [`PriorityEntry::release_token`]);
    /// `Err(until)` = someone holds it, presumably until `until`.
    #[inline]
    pub fn take_token(&self, now: u64, hold_until: u64) -> Result<u64, u64> {
        let mine = hold_until.max(now.saturating_add(1));
        let w = &self.d.be_token;
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur != 0 && cur > now && cur <= now.saturating_add(TOKEN_MAX_AHEAD_NS) {
                return Err(cur);
            }
            match w.compare_exchange_weak(cur, mine, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(mine),
                Err(c) => cur = c,
            }
        }
    }

    /// Gives the token back if it is still the one taken as `value` (an expired token may have been taken over
    /// since: then it is not ours to free).
    #[inline]
    pub fn release_token(&self, value: u64) {
        let _ = self
            .d
            .be_token
            .compare_exchange(value, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Counts one best-effort launch made under the token, and the time it waited (0 = did not wait).
    #[inline]
    pub fn count_be_launch(&self, waited_ns: u64) {
        self.d.be_launches.fetch_add(1, Ordering::Relaxed);
        if waited_ns > 0 {
            self.d.be_waits.fetch_add(1, Ordering::Relaxed);
            self.d.be_waited_ns.fetch_add(waited_ns, Ordering::Relaxed);
        }
    }

    // ---- in-flight reservations -----------------------------------------------------------------------------

    /// Announces an allocation of `bytes` (rounded up to MiB) about to be checked against the reservation,
    /// expiring `INFLIGHT_TTL_S` after `now_s` (CLOCK_MONOTONIC seconds). `None` when every slot is taken by
    /// a live announcement (the caller waits or refuses).
    pub fn claim_inflight(&self, bytes: u64, now_s: u32) -> Option<Inflight> {
        let mib = bytes.div_ceil(1 << 20).clamp(1, u32::MAX as u64) as u32;
        let word = inflight_word(mib, now_s.saturating_add(INFLIGHT_TTL_S));
        for (slot, w) in self.d.inflight.iter().enumerate() {
            let cur = w.load(Ordering::SeqCst);
            if !inflight_live(cur, now_s)
                && w.compare_exchange(cur, word, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(Inflight { slot, word });
            }
        }
        None
    }

    /// Bytes announced by live in-flight reservations, except `own`'s.
    pub fn inflight_bytes(&self, own: Option<Inflight>, now_s: u32) -> u64 {
        self.d
            .inflight
            .iter()
            .enumerate()
            .filter(|(i, _)| own.is_none_or(|o| o.slot != *i))
            .map(|(_, w)| w.load(Ordering::SeqCst))
            .filter(|&w| inflight_live(w, now_s))
            .map(|w| (inflight_mib(w) as u64) << 20)
            .sum()
    }

    /// Withdraws an announcement (after the driver answered).
    pub fn release_inflight(&self, i: Inflight) {
        let _ = self.d.inflight[i.slot].compare_exchange(i.word, 0, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// Counts one allocation refused to keep the reservation.
    pub fn count_reserve_refusal(&self) {
        self.d.reserve_refusals.fetch_add(1, Ordering::Relaxed);
    }
}

/// An in-flight word that counts: set, not expired, and not expiring implausibly late (garbage).
fn inflight_live(word: u64, now_s: u32) -> bool {
    let exp = inflight_expiry(word);
    word != 0 && exp > now_s && exp <= now_s.saturating_add(INFLIGHT_TTL_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn temp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("cuquota-prio-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn create_then_open_and_claim_one_entry_per_uuid() {
        let p = temp("claim");
        let a = PriorityRegion::create(&p).unwrap();
        let b = PriorityRegion::open(&p).unwrap();
        let x = a.device(&[1; 16]).unwrap();
        assert_eq!(b.device(&[1; 16]).unwrap(), x);
        assert_ne!(b.device(&[2; 16]).unwrap(), x);
        assert_eq!(a.devices(0).len(), 2);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn open_never_creates_and_refuses_another_region() {
        let p = temp("missing");
        assert!(PriorityRegion::open(&p).is_err());
        assert!(!p.exists());
        std::fs::write(&p, vec![0u8; std::mem::size_of::<PriorityFile>()]).unwrap();
        assert!(matches!(
            PriorityRegion::open(&p),
            Err(RegionError::NotInitialized { .. })
        ));
        let _ = std::fs::remove_file(&p);
    }

    fn entry() -> &'static PriorityDevice {
        let layout = std::alloc::Layout::new::<PriorityDevice>();
        // SAFETY: all-zero is a valid PriorityDevice (atomics only); leaked for the test's lifetime.
        unsafe { &*(std::alloc::alloc_zeroed(layout) as *const PriorityDevice) }
    }

    #[test]
    fn hp_times_are_published_and_garbage_is_dropped() {
        let e = PriorityEntry::new(entry());
        let now = 1000 * S;
        assert_eq!(e.hp(now), HpState::default());
        e.note_hp_launch(now, now + 5_000_000);
        e.note_hp_launch(now + 1, now + 3_000_000); // an earlier estimate does not shorten the queue
        assert_eq!(
            e.hp(now + 2),
            HpState {
                last_launch: now + 1,
                busy_until: now + 5_000_000
            }
        );
        // From the future (a file kept across a reboot, a scribbler): absent, and overwritten by the next launch.
        e.d.hp_last_launch.store(u64::MAX, Ordering::Relaxed);
        e.d.hp_busy_until.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(e.hp(now), HpState::default());
        e.note_hp_launch(now, now + 7);
        assert_eq!(e.hp(now).busy_until, now + 7);
    }

    #[test]
    fn one_token_holder_at_a_time_and_expiry_frees_it() {
        let e = PriorityEntry::new(entry());
        let now = 1000 * S;
        let a = e.take_token(now, now + 5_000_000).unwrap();
        assert_eq!(e.take_token(now + 1, now + 9_000_000), Err(a));
        // Expired (its holder died or never said): taken over; the old holder cannot free the new one's.
        let b = e.take_token(now + 5_000_001, now + 9_000_000).unwrap();
        e.release_token(a);
        assert_eq!(e.take_token(now + 5_000_002, now + 9_000_000), Err(b));
        e.release_token(b);
        assert!(e.take_token(now + 5_000_003, now + 9_000_000).is_ok());
        // Garbage far ahead is free.
        e.d.be_token.store(u64::MAX, Ordering::Relaxed);
        assert!(e.take_token(now, now + 1).is_ok());
    }

    #[test]
    fn inflight_reservations_count_each_other_and_expire() {
        let e = PriorityEntry::new(entry());
        let t = 500u32;
        let a = e.claim_inflight(3 << 20, t).unwrap();
        let b = e.claim_inflight((1 << 20) + 1, t).unwrap();
        assert_eq!(e.inflight_bytes(Some(a), t), 2 << 20);
        assert_eq!(e.inflight_bytes(Some(b), t), 3 << 20);
        assert_eq!(e.inflight_bytes(None, t), 5 << 20);
        e.release_inflight(a);
        assert_eq!(e.inflight_bytes(None, t), 2 << 20);
        // A dead process's announcement stops counting after the TTL, and its slot is reused.
        assert_eq!(e.inflight_bytes(None, t + INFLIGHT_TTL_S), 0);
        let mut n = 0;
        while e.claim_inflight(1, t + INFLIGHT_TTL_S).is_some() {
            n += 1;
        }
        assert_eq!(n, PRIORITY_INFLIGHT);
        // Garbage (expiring implausibly late) never counts.
        e.d.inflight[0].store(inflight_word(1000, u32::MAX), Ordering::Relaxed);
        assert_eq!(
            e.inflight_bytes(None, t + INFLIGHT_TTL_S),
            (PRIORITY_INFLIGHT as u64 - 1) << 20
        );
    }
}

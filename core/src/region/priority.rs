//! The priority files: one small region **per container** with a priority on a GPU, so that best-effort
//! tenants can see what high-priority tenants in *other* containers are doing (each container's usage file is
//! its own) — without any container being able to write what another one trusts.
//!
//! The node agent keeps one file per such container in a node directory: `NAME.high` for a high-priority
//! container, anything else for the others. The directory is mounted **read-only** into every such container
//! (at `<own file>.d`), and the container's own file **read-write** over its entry. A process writes only its
//! own file ([`PriorityRegion`]) and reads the others' ([`PriorityPeers`]): the high-priority words of `.high`
//! files only, so a best-effort tenant's lies stay in a file nobody trusts (docs/priority.md, threat model).
//!
//! Per GPU (entries claimed by UUID, like usage device entries) a file holds:
//! - what its container's high-priority tenants publish at each launch: when they last launched and when the
//!   work they have queued is estimated to be done ([`PriorityEntry::note_hp_launch`], [`PriorityEntry::hp`]);
//! - the container's best-effort **queue token**: while a high-priority tenant is present, a best-effort
//!   kernel of the container may be queued only by the holder of this one word ([`PriorityEntry::take_token`]);
//! - **in-flight reservations**: a best-effort allocation that must leave reserved memory free announces its
//!   size here between reading the device's free memory and the driver's allocation, and sums every file's
//!   announcements, so two racing allocations (any containers) each count the other
//!   ([`PriorityEntry::claim_inflight`]).
//!
//! Every word is an atomic; nothing is a lock. Every value written here has an expiry or is a time, and a time
//! implausibly far in the future (a scribbling tenant, or a file kept across a reboot: CLOCK_MONOTONIC restarts
//! near 0) is treated as absent — so nobody can make others wait for ever through this file.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

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

/// Marks a [`PriorityDeviceId`] of the process-local fallback entries.
const LOCAL: u32 = 1 << 31;

impl PriorityDeviceId {
    /// The entry's index (0-based; in the local fallback entries for a [`PriorityDeviceId::is_local`] one).
    pub fn index(self) -> usize {
        (self.0 & !LOCAL) as usize
    }

    /// An entry of this process only ([`PriorityRegion::local_device`]): the own file had no room.
    pub fn is_local(self) -> bool {
        self.0 & LOCAL != 0
    }
}

/// Files of other containers a process reads (the node directory's), at most.
pub const MAX_PEERS: usize = 64;
// Every peer file is mapped with a truncation guard (retired ones until freed), beside the process's own files.
const _: () = assert!(super::fault::SLOTS >= MAX_PEERS + MAX_RETIRED + 16);
/// How often the node directory is read again (containers come and go; the agent renames a file to change
/// its container's priority live).
pub const PEER_SCAN_NS: u64 = 1_000_000_000;
/// A high-priority container's file name ends with this.
pub const HIGH_SUFFIX: &str = ".high";
/// The container's counters file is its own file's path with this appended: where the informational counters
/// go (launches, waits, refusals), out of the node directory every container reads. Without it they stay in
/// the own file, where other containers can read them (deployments before issue 35).
pub const COUNTERS_SUFFIX: &str = ".counters";
/// Retired peers (their files left the directory) whose memory waits for readers to finish, at most: past it,
/// gone files keep their slots.
const MAX_RETIRED: usize = 32;
/// How long before `now` a high-priority tenant that is assumed present (fail closed) last launched: present
/// (within 10 s), long quiet, nothing queued.
const ASSUMED_AGO_NS: u64 = 1_000_000_000;

/// A container's own priority file, mapped read-write; with the node directory's files when opened by a
/// tenant ([`PriorityRegion::open`]).
#[derive(Debug)]
pub struct PriorityRegion {
    map: Mapping,
    peers: Option<PriorityPeers>,
    /// The container's counters file (`<path>.counters`), when there is one.
    counters: Option<Counters>,
    /// Where the counters of an entry the counters file has no room for go: nowhere anyone reads.
    sink: Box<PriorityDevice>,
    /// Per own device entry: the entry its counters go to (in the counters file, or `sink`); null = itself.
    counted_in: [AtomicPtr<PriorityDevice>; MAX_DEVICES],
    /// Entries of this process alone, for devices the own file has no room for (its container filled it): a
    /// best-effort process gates on them as if a high-priority tenant were present (fail closed).
    local: Box<[PriorityDevice]>,
}

/// The node directory's priority files (every container's, this one's included), mapped read-only and
/// found again every [`PEER_SCAN_NS`]. The slot of a file that left the directory is emptied at the next scan
/// and reused; its mapping is dropped once no reader is inside (`readers`: no lock on the read side).
#[derive(Debug)]
pub struct PriorityPeers {
    dir: PathBuf,
    /// The own file's identity (its words are read through the own mapping).
    own: (u64, u64),
    /// The own file is named `*.high` in the directory (at the last scan): the agent granted high priority.
    own_high: AtomicBool,
    /// More files in the directory than slots at the last scan: best-effort assumes an unseen high-priority
    /// tenant (fail closed).
    overflow: AtomicBool,
    /// Another container's `*.high` file was in the directory at the last scan (mapped or not: one that does
    /// not open counts): a high-priority tenant is present however long it has been idle, so best-effort keeps
    /// its budget (a request after a long idle finds no deep queue).
    high_present: AtomicBool,
    /// Readers inside [`PriorityPeers::peers`]' results.
    readers: AtomicU64,
    /// Peers taken out of their slots (leaked boxes), freed when no reader is inside. Atomics, no lock: a fork
    /// while a scan is under way leaves the child nothing to wait for (a peer taken by the vanished scanner
    /// leaks).
    retired: [AtomicPtr<Peer>; MAX_RETIRED],
    slots: [AtomicPtr<Peer>; MAX_PEERS],
    next_scan: AtomicU64,
    /// When the scan under way started (0 = none); one older than [`PEER_SCAN_NS`] is taken over (its thread
    /// died with a fork: the child has only the forking thread).
    scanning: AtomicU64,
}

/// The container's counters file: same layout, only the counter words used; entries claimed by UUID.
#[derive(Debug)]
struct Counters {
    map: Mapping,
}

impl Counters {
    fn file(&self) -> &PriorityFile {
        // SAFETY: as `PriorityRegion::file`: the mapping has the file's size (checked at open) and holds
        // atomics only.
        unsafe { &*self.map.ptr().cast::<PriorityFile>() }
    }
}

struct Peer {
    map: Mapping,
    id: (u64, u64),
    /// Named `*.high` at the last scan.
    high: AtomicBool,
    /// Still in the directory at the last scan.
    present: AtomicBool,
    /// Per own device entry: the peer's entry for the same UUID + 1 (0 = not found yet).
    entry: [AtomicU32; MAX_DEVICES],
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

    /// Opens a container's existing, initialised priority file read-write, and the node directory beside it
    /// (`<path>.d`) read-only: the shim. It never creates either: a file created inside one container would
    /// coordinate nobody. A missing directory is an error (the caller fails closed).
    pub fn open(path: &Path) -> Result<PriorityRegion, RegionError> {
        let mut dir = path.as_os_str().to_owned();
        dir.push(".d");
        let dir = PathBuf::from(dir);
        if !dir.exists() {
            // A node-wide file of layout 4 mounted the way pods were then: its words are every container's, as
            // that layout meant (high-priority activity read from this file). Only without a node directory: where
            // one is mounted, a tenant that rewrote its own file's version must not stop seeing its peers.
            if let Ok(map) = Self::map(path, Access::ReadWrite) {
                if validate(path, &map, false, PRIORITY_ABI_VERSION_NODE_FILE).is_ok() {
                    return Ok(Self::with_map(map));
                }
            }
        }
        let mut region = Self::open_with(path, Access::ReadWrite)?;
        region.counters = Self::open_counters(path)?;
        let io = |e: String, p: &Path| RegionError::Io {
            path: p.to_path_buf(),
            op: "open the node's priority directory",
            error: e,
        };
        let own = std::fs::metadata(path).map_err(|e| io(e.to_string(), path))?;
        if !std::fs::metadata(&dir)
            .map_err(|e| io(e.to_string(), &dir))?
            .is_dir()
        {
            return Err(io("not a directory".into(), &dir));
        }
        let peers = PriorityPeers {
            dir,
            own: (own.dev(), own.ino()),
            own_high: AtomicBool::new(false),
            overflow: AtomicBool::new(false),
            high_present: AtomicBool::new(false),
            readers: AtomicU64::new(0),
            retired: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            next_scan: AtomicU64::new(0),
            scanning: AtomicU64::new(0),
        };
        peers.scan(0);
        region.peers = Some(peers);
        Ok(region)
    }

    /// Opens a priority file read-write alone, without the node directory (tools and tests writing one file),
    /// with its counters file if there is one.
    pub fn open_file(path: &Path) -> Result<PriorityRegion, RegionError> {
        let mut region = Self::open_with(path, Access::ReadWrite)?;
        region.counters = Self::open_counters(path)?;
        Ok(region)
    }

    /// The counters file of the own file `path` (`<path>.counters`), if it exists; one that does not open or
    /// validate is an error (the caller fails closed).
    fn open_counters(path: &Path) -> Result<Option<Counters>, RegionError> {
        let mut p = path.as_os_str().to_owned();
        p.push(COUNTERS_SUFFIX);
        let p = PathBuf::from(p);
        if !p.exists() {
            return Ok(None);
        }
        let map = Self::map(&p, Access::ReadWrite)?;
        validate(&p, &map, false, PRIORITY_ABI_VERSION)?;
        Ok(Some(Counters { map }))
    }

    fn open_with(path: &Path, access: Access) -> Result<PriorityRegion, RegionError> {
        let map = Self::map(path, access)?;
        validate(
            path,
            &map,
            matches!(access, Access::Create(_)),
            PRIORITY_ABI_VERSION,
        )?;
        Ok(Self::with_map(map))
    }

    fn with_map(map: Mapping) -> PriorityRegion {
        PriorityRegion {
            map,
            peers: None,
            counters: None,
            // SAFETY: PriorityDevice consists only of atomics, for which all-zero is a valid value.
            sink: Box::new(unsafe { std::mem::zeroed::<PriorityDevice>() }),
            counted_in: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            local: (0..MAX_DEVICES)
                // SAFETY: PriorityDevice consists only of atomics, for which all-zero is a valid value (a free
                // entry).
                .map(|_| unsafe { std::mem::zeroed::<PriorityDevice>() })
                .collect(),
        }
    }

    fn map(path: &Path, access: Access) -> Result<Mapping, RegionError> {
        let mut map = Mapping::open(path, access, std::mem::size_of::<PriorityFile>())?;
        // Every container with a priority can truncate this file: survive it (fault.rs). Its zero pages read as
        // "no high-priority tenant, no token, nothing in flight" — what a tenant could write anyway.
        map.guard_truncation();
        Ok(map)
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
        let i = claim_device(&self.file().devices, uuid, self.path())?;
        if let Some(c) = &self.counters {
            // No room there: this entry's counters go to the sink (never into the file others read).
            let to = match claim_device(&c.file().devices, uuid, c.map.path()) {
                Ok(j) => &c.file().devices[j],
                Err(_) => &*self.sink,
            };
            self.counted_in[i].store(std::ptr::from_ref(to).cast_mut(), Ordering::Release);
        }
        Ok(PriorityDeviceId(i as u32))
    }

    /// An entry for device `uuid` in this process only, when [`PriorityRegion::device`] found no room (a
    /// container that filled its own file): its words coordinate nobody, and a best-effort process gates on it
    /// as if a high-priority tenant were present ([`PriorityEntry::hp`]), never ungated.
    pub fn local_device(&self, uuid: &[u8; 16]) -> Result<PriorityDeviceId, RegionError> {
        claim_device(&self.local, uuid, self.path()).map(|i| PriorityDeviceId(i as u32 | LOCAL))
    }

    /// One device entry's words (with the node directory's view of the device, when opened with it).
    #[inline]
    pub fn entry(&self, id: PriorityDeviceId) -> PriorityEntry<'_> {
        let d = if id.is_local() {
            &self.local[id.index()]
        } else {
            &self.file().devices[id.index()]
        };
        let to = self.counted_in[id.index()].load(Ordering::Acquire);
        let c = if id.is_local() || to.is_null() {
            d
        } else {
            // SAFETY: a non-null `counted_in` points into the counters mapping or `sink`, both owned by `self`
            // and never moved or freed before it; PriorityDevice holds only atomics.
            unsafe { &*to }
        };
        PriorityEntry {
            d,
            c,
            peers: self.peers.as_ref().map(|p| (p, id.index())),
            assume_hp: id.is_local(),
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
            let e = PriorityEntry::new(d);
            let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let uuid = [r(&d.uuid[0]), r(&d.uuid[1])];
            // The counters: in the counters file's entry of the same UUID when there is one.
            let c = match &self.counters {
                Some(k) => k.file().devices.iter().find(|c| {
                    owner_state(c.owner.load(Ordering::Acquire)) == STATE_LIVE
                        && [r(&c.uuid[0]), r(&c.uuid[1])] == uuid
                }),
                None => Some(d),
            };
            let n = |f: fn(&PriorityDevice) -> &AtomicU64| c.map_or(0, |c| r(f(c)));
            out.push(PriorityDeviceInfo {
                id: PriorityDeviceId(i as u32),
                uuid: words_to_uuid(uuid),
                hp: e.hp(now_ns),
                hp_launches: n(|c| &c.hp_launches),
                be_token: r(&d.be_token),
                be_launches: n(|c| &c.be_launches),
                be_waits: n(|c| &c.be_waits),
                be_waited_ns: n(|c| &c.be_waited_ns),
                reserve_refusals: n(|c| &c.reserve_refusals),
                inflight_bytes: e.inflight_bytes(None, (now_ns / 1_000_000_000) as u32),
            });
        }
        out
    }
}

impl PriorityPeers {
    /// Reads the directory again if [`PEER_SCAN_NS`] passed since the last time (one thread at a time; the
    /// others go on with what they have). Slow path, once a second at most: a directory read and a stat per
    /// file, an open and a map per new one.
    #[inline]
    fn refresh(&self, now: u64) {
        if now >= self.next_scan.load(Ordering::Relaxed) {
            self.scan(now);
        }
    }

    #[cold]
    fn scan(&self, now: u64) {
        let cur = self.scanning.load(Ordering::Acquire);
        if (cur != 0 && now.saturating_sub(cur) < PEER_SCAN_NS)
            || self
                .scanning
                .compare_exchange(cur, now.max(1), Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.next_scan
            .store(now.saturating_add(PEER_SCAN_NS), Ordering::Relaxed);
        // Counted as a reader itself: a scan taken over from a slow one never frees what that one holds.
        self.readers.fetch_add(1, Ordering::SeqCst);
        let mut seen: Vec<((u64, u64), bool, PathBuf)> = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for f in rd.flatten() {
                let path = f.path();
                let Ok(m) = std::fs::metadata(&path) else { continue };
                if !m.is_file() {
                    continue;
                }
                let high = f.file_name().to_string_lossy().ends_with(HIGH_SUFFIX);
                seen.push(((m.dev(), m.ino()), high, path));
            }
        }
        self.own_high
            .store(seen.iter().any(|s| s.0 == self.own && s.1), Ordering::Relaxed);
        self.high_present
            .store(seen.iter().any(|s| s.0 != self.own && s.1), Ordering::Relaxed);
        for slot in &self.slots {
            let ptr = slot.load(Ordering::Acquire);
            if ptr.is_null() {
                continue;
            }
            // SAFETY: a non-null slot holds a leaked Box<Peer>, freed only below by this (the one) scanner.
            let p = unsafe { &*ptr };
            let now_here = seen.iter().find(|s| s.0 == p.id);
            p.present.store(now_here.is_some(), Ordering::Relaxed);
            p.high.store(now_here.is_some_and(|s| s.1), Ordering::Relaxed);
            if now_here.is_none() {
                // Parked in a free retired slot first (none free: it keeps its slot), then taken out of its slot:
                // no new reader finds it; freed once the readers that may hold it are out.
                let Some(park) = self.retired.iter().find(|r| {
                    r.compare_exchange(std::ptr::null_mut(), ptr, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                }) else {
                    continue;
                };
                if slot
                    .compare_exchange(ptr, std::ptr::null_mut(), Ordering::SeqCst, Ordering::Relaxed)
                    .is_err()
                {
                    park.store(std::ptr::null_mut(), Ordering::SeqCst); // another scanner took it
                }
            }
        }
        // Readers that found a retired peer entered before it left its slot: when none but this scan is
        // inside now, none holds it (every ordering here SeqCst, as the readers' count and slot loads). A reader
        // that never leaves (its thread vanished in a fork) keeps them: past MAX_RETIRED slots are kept, and
        // at the bound best-effort fails closed.
        if self.readers.load(Ordering::SeqCst) == 1 {
            for r in &self.retired {
                let p = r.swap(std::ptr::null_mut(), Ordering::SeqCst);
                if !p.is_null() {
                    // SAFETY: a leaked Box<Peer> out of its slot, swapped out here: ours alone, no reader holds it.
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
        let mut overflow = false;
        for (id, high, path) in seen {
            if id == self.own || self.peers().any(|p| p.id == id) {
                continue;
            }
            // Another container's file: read-only, its header checked; one that does not open is skipped (its
            // container's own processes fail closed on it; a `*.high` one still counts as present: `high_present`).
            let Ok(mut map) = Mapping::open(&path, Access::ReadOnly, std::mem::size_of::<PriorityFile>())
            else {
                continue;
            };
            // Its container may truncate it: survive, read zero pages ("nothing published"). Never mapped
            // without that (a truncation would kill this process).
            if !map.guard_truncation() || validate(&path, &map, false, PRIORITY_ABI_VERSION).is_err() {
                continue;
            }
            let peer = Box::into_raw(Box::new(Peer {
                map,
                id,
                high: AtomicBool::new(high),
                present: AtomicBool::new(true),
                entry: std::array::from_fn(|_| AtomicU32::new(0)),
            }));
            let free = self.slots.iter().find(|s| {
                s.compare_exchange(std::ptr::null_mut(), peer, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            });
            if free.is_none() {
                // SAFETY: not published in any slot, so ours alone.
                drop(unsafe { Box::from_raw(peer) });
                overflow = true;
                break;
            }
        }
        self.overflow.store(overflow, Ordering::Relaxed);
        self.readers.fetch_sub(1, Ordering::SeqCst);
        self.scanning.store(0, Ordering::Release);
    }

    /// Runs `f` over the files mapped now (present or not), counted as a reader: a peer retired meanwhile is
    /// not freed before `f` returns.
    fn with_peers<R>(&self, f: impl FnOnce(&mut dyn Iterator<Item = &Peer>) -> R) -> R {
        self.readers.fetch_add(1, Ordering::SeqCst);
        let mut it = self.slots.iter().filter_map(|s| {
            let p = s.load(Ordering::SeqCst);
            // SAFETY: a non-null slot holds a leaked Box<Peer>; the scanner frees one taken out of its slot only
            // when no reader is counted, and we are until `f` returns.
            (!p.is_null()).then(|| unsafe { &*p })
        });
        let r = f(&mut it);
        self.readers.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// The files mapped now, for the scanner alone (counted as a reader while it scans).
    fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.slots.iter().filter_map(|s| {
            let p = s.load(Ordering::SeqCst);
            // SAFETY: the scanner, counted as a reader, is the only one that frees a peer, and only when no
            // other reader is counted.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }

    /// Folds `f` over the peer files (present, `high` ones only if asked) that have an entry for `uuid`; `own`
    /// caches the match.
    fn fold_entries<A>(
        &self,
        own: usize,
        uuid: [u64; 2],
        high_only: bool,
        init: A,
        mut f: impl FnMut(A, &PriorityDevice) -> A,
    ) -> A {
        self.with_peers(|peers| {
            peers
                .filter(|p| {
                    p.present.load(Ordering::Relaxed) && (!high_only || p.high.load(Ordering::Relaxed))
                })
                .filter_map(|p| p.device(own, uuid))
                .fold(init, &mut f)
        })
    }
}

impl Drop for PriorityPeers {
    fn drop(&mut self) {
        for p in self.slots.iter_mut().chain(self.retired.iter_mut()) {
            let p = std::mem::replace(p.get_mut(), std::ptr::null_mut());
            if !p.is_null() {
                // SAFETY: a leaked Box<Peer>; `&mut self`: no reader or scanner is inside.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

impl Peer {
    fn file(&self) -> &PriorityFile {
        // SAFETY: as `PriorityRegion::file`: the read-only mapping has the file's size (checked at open) and
        // holds atomics only; zero pages after a truncation are valid values.
        unsafe { &*self.map.ptr().cast::<PriorityFile>() }
    }

    /// The entry for `uuid` (live, same UUID), found once per own entry `own` and cached: entries are never
    /// freed or given another UUID by a shim (a container that scribbles its own entries confuses only the
    /// readers of *its* state).
    #[inline]
    fn device(&self, own: usize, uuid: [u64; 2]) -> Option<&PriorityDevice> {
        let devs = &self.file().devices;
        let matches = |d: &PriorityDevice| {
            owner_state(d.owner.load(Ordering::Acquire)) == STATE_LIVE
                && d.uuid[0].load(Ordering::Relaxed) == uuid[0]
                && d.uuid[1].load(Ordering::Relaxed) == uuid[1]
        };
        let c = self.entry[own].load(Ordering::Relaxed) as usize;
        if c > 0 && devs.get(c - 1).is_some_and(matches) {
            return devs.get(c - 1);
        }
        let i = devs.iter().position(matches)?;
        self.entry[own].store(i as u32 + 1, Ordering::Relaxed);
        Some(&devs[i])
    }
}

/// The words of one device entry, with the protocols on them. Hot path: atomics only.
#[derive(Debug, Clone, Copy)]
pub struct PriorityEntry<'a> {
    d: &'a PriorityDevice,
    /// Where the informational counters go: the counters file's entry, else `d`.
    c: &'a PriorityDevice,
    /// The node directory and this entry's index in the own file (`PriorityRegion::open`'s entries).
    peers: Option<(&'a PriorityPeers, usize)>,
    /// A local entry (the own file had no room): a high-priority tenant is assumed present.
    assume_hp: bool,
}

impl<'a> PriorityEntry<'a> {
    /// A view of raw words alone, as if this file were every container's (the shim's unit tests build entries
    /// in memory; `cuquota priority show` reads one file).
    pub fn new(d: &'a PriorityDevice) -> Self {
        PriorityEntry {
            d,
            c: d,
            peers: None,
            assume_hp: false,
        }
    }

    fn uuid(&self) -> [u64; 2] {
        [
            self.d.uuid[0].load(Ordering::Relaxed),
            self.d.uuid[1].load(Ordering::Relaxed),
        ]
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
        self.c.hp_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// What high-priority tenants published, as of `now`; times implausibly in the future read as absent.
    /// With the node directory: the latest of the `.high` files' (this container's own words count only if its
    /// file is one of them); without: this file's.
    /// A `*.high` file of another container in the directory (readable or not), a local entry, or more files in
    /// the directory than a process maps: a high-priority tenant is present (launched a second ago at the
    /// latest, nothing queued): best-effort work keeps to its budget even while it is idle.
    #[inline]
    pub fn hp(&self, now: u64) -> HpState {
        let Some((peers, own)) = self.peers else {
            return hp_of(self.d, now);
        };
        peers.refresh(now);
        let mut s = peers.fold_entries(own, self.uuid(), true, HpState::default(), |mut s, d| {
            let h = hp_of(d, now);
            s.last_launch = s.last_launch.max(h.last_launch);
            s.busy_until = s.busy_until.max(h.busy_until);
            s
        });
        if self.assume_hp
            || peers.overflow.load(Ordering::Relaxed)
            || peers.high_present.load(Ordering::Relaxed)
        {
            s.last_launch = s.last_launch.max(now.saturating_sub(ASSUMED_AGO_NS).max(1));
        }
        s
    }

    /// Whether the agent granted this container high priority: its own file is named `*.high` in the node
    /// directory (at the last scan; a file not found there is not). Without the directory (tools), true: the
    /// process's own policy decides. Never true for a local entry.
    #[inline]
    pub fn granted_high(&self, now: u64) -> bool {
        let Some((peers, _)) = self.peers else {
            return !self.assume_hp;
        };
        peers.refresh(now);
        !self.assume_hp && peers.own_high.load(Ordering::Relaxed)
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

    /// Extends the hold of the token taken as `value` to `hold_until` (a holder with kernels still queued).
    /// `Err(current)` when it is no longer ours (it expired and was taken over).
    #[inline]
    pub fn renew_token(&self, value: u64, hold_until: u64) -> Result<u64, u64> {
        let mine = hold_until.max(value);
        self.d
            .be_token
            .compare_exchange(value, mine, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| mine)
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
        self.c.be_launches.fetch_add(1, Ordering::Relaxed);
        if waited_ns > 0 {
            self.c.be_waits.fetch_add(1, Ordering::Relaxed);
            self.c.be_waited_ns.fetch_add(waited_ns, Ordering::Relaxed);
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

    /// Bytes announced by live in-flight reservations, except `own`'s: this file's and (with the node
    /// directory) every other container's.
    pub fn inflight_bytes(&self, own: Option<Inflight>, now_s: u32) -> u64 {
        let live = |w: &AtomicU64| Some(w.load(Ordering::SeqCst)).filter(|&w| inflight_live(w, now_s));
        let mine: u64 = self
            .d
            .inflight
            .iter()
            .enumerate()
            .filter(|(i, _)| own.is_none_or(|o| o.slot != *i))
            .filter_map(|(_, w)| live(w))
            .map(|w| (inflight_mib(w) as u64) << 20)
            .sum();
        let Some((peers, idx)) = self.peers else {
            return mine;
        };
        peers.refresh(u64::from(now_s).saturating_mul(1_000_000_000));
        let others: u64 = peers.fold_entries(idx, self.uuid(), false, 0u64, |sum, d| {
            d.inflight
                .iter()
                .filter_map(live)
                .map(|w| (inflight_mib(w) as u64) << 20)
                .fold(sum, u64::saturating_add)
        });
        mine.saturating_add(others)
    }

    /// Withdraws an announcement (after the driver answered).
    pub fn release_inflight(&self, i: Inflight) {
        let _ = self.d.inflight[i.slot].compare_exchange(i.word, 0, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// Counts one allocation refused to keep the reservation.
    pub fn count_reserve_refusal(&self) {
        self.c.reserve_refusals.fetch_add(1, Ordering::Relaxed);
    }
}

/// Checks (with `init`: first initialises a fresh) header of a mapped priority file.
fn validate(path: &Path, map: &Mapping, init: bool, version: u32) -> Result<(), RegionError> {
    // SAFETY: as `PriorityRegion::file`.
    let h = &unsafe { &*map.ptr().cast::<PriorityFile>() }.header;
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
        abi_version: (&h.abi_version, version),
        fields: &fields,
    };
    header::validate(path, &header, init)
}

fn hp_of(d: &PriorityDevice, now: u64) -> HpState {
    let sane = |t: u64| {
        if t > now.saturating_add(HP_MAX_AHEAD_NS) {
            0
        } else {
            t
        }
    };
    HpState {
        last_launch: sane(d.hp_last_launch.load(Ordering::Acquire)),
        busy_until: sane(d.hp_busy_until.load(Ordering::Acquire)),
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
        let b = PriorityRegion::open_file(&p).unwrap();
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

    /// Issue 35 item 5: with a counters file beside the own one, a container's launch, wait and refusal counts
    /// go there, and the file in the node directory (which every container reads) holds only what others use:
    /// the activity words. Without one (before), they were in it.
    #[test]
    fn counters_stay_out_of_the_node_directory_with_a_counters_file() {
        let root = temp("counters");
        let _ = std::fs::remove_dir_all(&root);
        let node = root.join("node");
        std::fs::create_dir_all(&node).unwrap();
        for (name, file) in [("hp", "hp.high"), ("be", "be.low")] {
            PriorityRegion::create(&node.join(file)).unwrap();
            std::fs::hard_link(node.join(file), root.join(name)).unwrap();
            std::os::unix::fs::symlink(&node, root.join(format!("{name}.d"))).unwrap();
            PriorityRegion::create(&root.join(format!("{name}.counters"))).unwrap();
        }
        let (hp, be) = (
            PriorityRegion::open(&root.join("hp")).unwrap(),
            PriorityRegion::open(&root.join("be")).unwrap(),
        );
        let gpu = [3; 16];
        let (eh, eb) = (
            hp.entry(hp.device(&gpu).unwrap()),
            be.entry(be.device(&gpu).unwrap()),
        );
        let t = 100 * S;
        eh.note_hp_launch(t, t + S / 1000);
        eb.count_be_launch(5_000);
        eb.count_reserve_refusal();
        // The owner (its view, or `cuquota priority show` of its file) sees its counts.
        let own = be.devices(t)[0];
        assert_eq!((own.be_launches, own.be_waits, own.be_waited_ns), (1, 1, 5_000));
        assert_eq!(own.reserve_refusals, 1);
        assert_eq!(hp.devices(t)[0].hp_launches, 1);
        // Another container reads the node directory's files: activity, no counts.
        for f in ["hp.high", "be.low"] {
            let bytes = std::fs::read(node.join(f)).unwrap();
            let word = |off: usize| {
                let at = std::mem::offset_of!(PriorityFile, devices) + off;
                u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
            };
            let counts = [
                word(std::mem::offset_of!(PriorityDevice, hp_launches)),
                word(std::mem::offset_of!(PriorityDevice, be_launches)),
                word(std::mem::offset_of!(PriorityDevice, be_waits)),
                word(std::mem::offset_of!(PriorityDevice, be_waited_ns)),
                word(std::mem::offset_of!(PriorityDevice, reserve_refusals)),
            ];
            assert_eq!(counts, [0; 5], "{f}: counts readable by every container");
        }
        assert_eq!(
            eb.hp(t).last_launch,
            t,
            "the high-priority activity is still seen"
        );
        // Control: without counters files the same counts land in the node directory's files.
        let hp_file = PriorityRegion::open_file(&node.join("hp.high")).unwrap();
        let e = hp_file.entry(hp_file.device(&gpu).unwrap());
        e.note_hp_launch(t, t);
        assert_eq!(hp_file.devices(t)[0].hp_launches, 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A node directory with the files of "hp" (high), "liar" (best-effort) and "be" (best-effort, the reader);
    /// `be.d` beside be's own file is the directory (a mount in a real node; a symlink here).
    #[test]
    fn best_effort_reads_only_high_priority_files_and_follows_renames() {
        let root = temp("peers");
        let _ = std::fs::remove_dir_all(&root);
        let node = root.join("node");
        std::fs::create_dir_all(&node).unwrap();
        let hp = PriorityRegion::create(&node.join("hp.high")).unwrap();
        let liar = PriorityRegion::create(&node.join("liar.low")).unwrap();
        PriorityRegion::create(&node.join("be.low")).unwrap();
        std::fs::hard_link(node.join("be.low"), root.join("be")).unwrap();
        std::os::unix::fs::symlink(&node, root.join("be.d")).unwrap();
        let be = PriorityRegion::open(&root.join("be")).unwrap();
        let uuid = [7; 16];
        let (h, l) = (
            hp.entry(hp.device(&uuid).unwrap()),
            liar.entry(liar.device(&uuid).unwrap()),
        );
        let e = be.entry(be.device(&uuid).unwrap());
        let now = 1000 * S;
        h.note_hp_launch(now, now + 5);
        // The liar publishes a busy queue; the best-effort container's own words say "busy" too: neither counts.
        l.note_hp_launch(now + 9, now + 3 * S);
        e.note_hp_launch(now + 9, now + 3 * S);
        assert_eq!(
            e.hp(now + 10),
            HpState {
                last_launch: now,
                busy_until: now + 5
            }
        );
        // In-flight reservations of every container count (fail closed), one's own slot excepted.
        let mine = e.claim_inflight(1 << 20, 500).unwrap();
        l.claim_inflight(2 << 20, 500).unwrap();
        assert_eq!(e.inflight_bytes(Some(mine), 500), 2 << 20);
        // The agent renames a file to change a priority live: seen at the next scan.
        std::fs::rename(node.join("liar.low"), node.join("liar.high")).unwrap();
        assert_eq!(e.hp(now + 10).busy_until, now + 5, "before the next scan");
        assert_eq!(e.hp(now + 10 + PEER_SCAN_NS).busy_until, now + 3 * S);
        std::fs::rename(node.join("hp.high"), node.join("hp.low")).unwrap();
        std::fs::rename(node.join("liar.high"), node.join("liar.low")).unwrap();
        assert_eq!(e.hp(now + 10 + 2 * PEER_SCAN_NS), HpState::default());
        // Without the node directory a tenant's file does not open (the shim fails closed).
        assert!(PriorityRegion::open(&node.join("hp.low")).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// While another container's `.high` file exists a high-priority tenant is present, however long idle, and
    /// whether or not its file opens; without one, nobody is.
    #[test]
    fn a_high_file_keeps_a_tenant_present_idle_or_unreadable() {
        let root = temp("present");
        let _ = std::fs::remove_dir_all(&root);
        let node = root.join("node");
        std::fs::create_dir_all(&node).unwrap();
        PriorityRegion::create(&node.join("be.low")).unwrap();
        std::fs::hard_link(node.join("be.low"), root.join("be")).unwrap();
        std::os::unix::fs::symlink(&node, root.join("be.d")).unwrap();
        let hp = PriorityRegion::create(&node.join("hp.high")).unwrap();
        let be = PriorityRegion::open(&root.join("be")).unwrap();
        let uuid = [5; 16];
        let e = be.entry(be.device(&uuid).unwrap());
        let now = 1000 * S;
        hp.entry(hp.device(&uuid).unwrap()).note_hp_launch(now, now + 5);
        let idle = now + 60 * S;
        assert_eq!(e.hp(idle).last_launch, idle - ASSUMED_AGO_NS, "idle a minute");
        std::fs::rename(node.join("hp.high"), node.join("hp.low")).unwrap();
        let t = idle + PEER_SCAN_NS;
        assert_eq!(e.hp(t), HpState::default(), "no `.high` file: nobody");
        // A `.high` file that does not map (too short) counts as present (fail closed).
        std::fs::write(node.join("broken.high"), b"x").unwrap();
        let t = t + PEER_SCAN_NS;
        assert_eq!(e.hp(t).last_launch, t - ASSUMED_AGO_NS, "unreadable");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn slots_of_departed_files_are_reused_and_too_many_files_fail_closed() {
        let root = temp("churn");
        let _ = std::fs::remove_dir_all(&root);
        let node = root.join("node");
        std::fs::create_dir_all(&node).unwrap();
        PriorityRegion::create(&node.join("be.low")).unwrap();
        std::fs::hard_link(node.join("be.low"), root.join("be")).unwrap();
        std::os::unix::fs::symlink(&node, root.join("be.d")).unwrap();
        let departed: Vec<_> = (0..MAX_PEERS)
            .map(|i| {
                let p = node.join(format!("departed{i}.low"));
                PriorityRegion::create(&p).unwrap();
                p
            })
            .collect();
        let be = PriorityRegion::open(&root.join("be")).unwrap();
        let uuid = [9; 16];
        let e = be.entry(be.device(&uuid).unwrap());
        let now = 1000 * S;
        assert!(!e.granted_high(now), "a `.low` file grants nothing");
        assert_eq!(e.hp(now), HpState::default(), "64 files fit");
        // One more live file than slots: a high-priority tenant is assumed (launched a second ago, idle).
        let extra = node.join("extra.low");
        PriorityRegion::create(&extra).unwrap();
        let later = now + PEER_SCAN_NS;
        assert_eq!(
            e.hp(later).last_launch,
            later - ASSUMED_AGO_NS,
            "fail closed at the bound"
        );
        assert_eq!(e.hp(later).busy_until, 0);
        // The 64 leave; a high-priority container comes: its file takes a freed slot.
        for p in &departed {
            std::fs::remove_file(p).unwrap();
        }
        let hp = PriorityRegion::create(&node.join("hp.high")).unwrap();
        hp.entry(hp.device(&uuid).unwrap())
            .note_hp_launch(later, later + 7);
        let t = later + PEER_SCAN_NS;
        assert_eq!(
            e.hp(t),
            HpState {
                last_launch: later,
                busy_until: later + 7
            }
        );
        // The agent renames the own file: the role follows.
        std::fs::rename(node.join("be.low"), node.join("be.high")).unwrap();
        assert!(e.granted_high(t + PEER_SCAN_NS));
        // A full own file: a local entry, never high, a high-priority tenant assumed.
        for i in 0..MAX_DEVICES as u8 - 1 {
            be.device(&[0xA0 + i; 16]).unwrap();
        }
        assert!(be.device(&[0xF0; 16]).is_err(), "the own file is full");
        let id = be.local_device(&[0xF0; 16]).unwrap();
        assert!(id.is_local());
        let local = be.entry(id);
        let t = t + PEER_SCAN_NS;
        assert!(!local.granted_high(t));
        assert_eq!(local.hp(t).last_launch, t - ASSUMED_AGO_NS);
        let _ = std::fs::remove_dir_all(&root);
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

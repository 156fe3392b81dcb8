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
//! - **shared memory** ([`UsageRegion::share`]): an entry free → claiming → key(live) by the first holder,
//!   which adds the bytes to the entry before taking them off its slot (never counted zero times); others
//!   join by incrementing `holders` only while it is non-zero; the holder that takes it to zero frees the
//!   entry. Reclaiming (or releasing) a slot drops its holds. The container's usage sums slots and entries.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::claim::{claim_device, next_gen};
use super::header::{self, Header, Word};
use super::layout::*;
use super::liveness::{current_pid, current_start_time, is_alive};
use super::map::{Access, Mapping};
use super::RegionError;
use crate::policy::Policy;

const NO_SLOT: u32 = u32::MAX;

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
    /// Bytes charged per device entry, less the credit charged ahead of allocations: what the process holds.
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
    /// Bytes the container's processes hold (its charge less the credit charged ahead of allocations).
    pub used: u64,
    /// Cumulative GPU busy ns.
    pub busy_ns: u64,
    /// Cumulative ns launches waited for the SM limit.
    pub throttled_ns: u64,
    /// Allocations refused at the cap, cumulative.
    pub refusals: u64,
}

/// The usage file, mapped read-write.
#[derive(Debug)]
pub struct UsageRegion {
    /// The mapping; its descriptor is kept open to ask whether slots' liveness locks are held (an open file
    /// description that never holds a lock itself, so every lock shows up as a conflict on it).
    map: Mapping,
    /// This process's slot (cached by [`UsageRegion::process_slot`]), `NO_SLOT` when none.
    own_slot: AtomicU32,
    /// Per slot, the descriptor (its own open file description) holding this process's liveness lock on it;
    /// -1 = none.
    lock_fds: Box<[AtomicI32]>,
    /// The mapped file's identity, taken at open (`None`: it could not be read).
    id: Option<super::FileId>,
    /// Set when the agent has bound the container to another file since: [`UsageRegion::check`] fails.
    superseded: AtomicBool,
}

/// What trying to take a slot's liveness lock found.
enum LockTry {
    /// Taken: the descriptor holding it.
    Locked(i32),
    /// Held by another open file description: a live process owns or is claiming the slot.
    Busy,
    /// Locks are unavailable here (no /proc, a file system without OFD locks): liveness by pid only.
    Unsupported,
}

fn close_fd(fd: i32) {
    if fd >= 0 {
        // SAFETY: a descriptor this region opened and still owns; closed once (callers swap it out first).
        unsafe { libc::close(fd) };
    }
}

/// One `fcntl` OFD-lock call on slot `slot`'s lock byte.
fn ofd_lock(fd: i32, cmd: libc::c_int, typ: libc::c_short, slot: usize) -> std::io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = slot_lock_offset(slot) as libc::off_t;
    fl.l_len = 1;
    // SAFETY: an OFD lock command (l_pid zero, as they require) with a valid flock pointer.
    if unsafe { libc::fcntl(fd, cmd, &mut fl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl)
}

fn same_file(a: i32, b: i32) -> bool {
    // SAFETY: stat is plain data; fstat on descriptors we hold.
    unsafe {
        let mut x: libc::stat = std::mem::zeroed();
        let mut y: libc::stat = std::mem::zeroed();
        libc::fstat(a, &mut x) == 0
            && libc::fstat(b, &mut y) == 0
            && x.st_dev == y.st_dev
            && x.st_ino == y.st_ino
    }
}

impl Drop for UsageRegion {
    /// Closes the liveness-lock descriptors: whatever slots this mapping held are then seen as abandoned (and
    /// reclaimed by whoever needs the room), as if their process had exited.
    fn drop(&mut self) {
        for fd in self.lock_fds.iter() {
            close_fd(fd.swap(-1, Ordering::AcqRel));
        }
    }
}

impl UsageRegion {
    /// Opens `path`, creating it (mode 0666, so every user in the container can share it) and initialising the
    /// header if needed. Safe with any number of processes doing the same at once.
    pub fn open(path: &Path) -> Result<UsageRegion, RegionError> {
        Self::open_with(path, Access::Create(0o666))
    }

    /// Opens the usage file the agent bound the container to: never creates one, and refuses
    /// ([`RegionError::NotTheBoundFile`]) a file at `path` that is not the one with identity `id` (renamed away
    /// and replaced: a fresh file would be a fresh, empty cap). Otherwise as [`UsageRegion::open`].
    pub fn open_bound(path: &Path, id: super::FileId) -> Result<UsageRegion, RegionError> {
        Self::open_with(path, Access::Bound(id))
    }

    /// Opens an existing, initialised usage file (for `cuquota status`: never creates one).
    pub fn open_existing(path: &Path) -> Result<UsageRegion, RegionError> {
        Self::open_with(path, Access::ReadWrite)
    }

    /// Opens the usage file a privileged command binds (`create`: as [`UsageRegion::open`], else as
    /// [`UsageRegion::open_existing`]), resolving no symbolic link in any component of `path`
    /// ([`RegionError::SymlinkInPath`]): its directory is the tenant's to write. Never blocks (a FIFO is
    /// refused as not a regular file); [`UsageRegion::file_id`] is then the identity of the file opened.
    pub fn open_for_binding(path: &Path, create: bool) -> Result<UsageRegion, RegionError> {
        let access = if create {
            Access::Create(0o666)
        } else {
            Access::ReadWrite
        };
        Self::open_mapping(path, access, true)
    }

    fn open_with(path: &Path, access: Access) -> Result<UsageRegion, RegionError> {
        Self::open_mapping(path, access, false)
    }

    fn open_mapping(path: &Path, access: Access, no_symlinks: bool) -> Result<UsageRegion, RegionError> {
        let mut map = Mapping::open_keeping_fd(path, access, std::mem::size_of::<UsageFile>(), no_symlinks)?;
        // Every process of the container can truncate this file: survive it (fault.rs) and fail closed.
        map.guard_truncation();
        let id = map.fd().and_then(|fd| super::FileId::of_fd(fd).ok());
        let region = UsageRegion {
            map,
            own_slot: AtomicU32::new(NO_SLOT),
            lock_fds: (0..MAX_PROCS).map(|_| AtomicI32::new(-1)).collect(),
            id,
            superseded: AtomicBool::new(false),
        };
        region.validate(access.initialises())?;
        Ok(region)
    }

    /// [`UsageHeader::last_use_ns`] moves to `now_ns` (CLOCK_BOOTTIME) when it is more than a millisecond behind
    /// (a launch or copy of an elastic tenant; elastic memory, issue 39): one load, a store at most once a ms.
    pub fn note_use(&self, now_ns: u64) {
        let w = &self.file().header.last_use_ns;
        if w.load(Ordering::Relaxed).saturating_add(1_000_000) < now_ns {
            w.store(now_ns, Ordering::Relaxed);
        }
    }

    /// [`UsageHeader::waiting`]: an allocation of the container waiting for device memory (elastic memory).
    pub fn waiting(&self) -> &AtomicU64 {
        &self.file().header.waiting
    }

    /// [`UsageHeader::last_use_ns`]: when the container last launched or copied (elastic memory).
    pub fn last_use_ns(&self) -> &AtomicU64 {
        &self.file().header.last_use_ns
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
            abi_version: (&h.abi_version, ABI_VERSION),
            fields: &fields,
        };
        // A zero body is a valid empty state.
        header::validate(self.map.path(), &header, init)
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// The mapped file's identity, as taken when it was opened.
    pub fn file_id(&self) -> Option<super::FileId> {
        self.id
    }

    /// Whether the agent's binding still names the mapped file, given every identity the agent's limits files
    /// now bind (none: no binding, nothing to compare). When it does not, [`UsageRegion::check`] fails from
    /// now on (until a binding names this file again): what this process would charge here, the container's
    /// other processes no longer see. Returns whether that changed.
    pub fn follow_binding(&self, bound: &[super::FileId]) -> bool {
        let gone = bound.iter().any(|b| self.id.is_none_or(|mine| !b.matches(&mine)));
        self.superseded.swap(gone, Ordering::Relaxed) != gone
    }

    /// Whether the shared accounting can still be trusted, checked before anything is admitted against it:
    /// `Err` when the file was truncated under this process's mapping (which then holds private zero pages)
    /// or its header no longer says what this version wrote (another process overwrote it: bad magic, ABI
    /// version or sizes). A few atomic loads compared inline; the error is built out of line.
    #[inline]
    pub fn check(&self) -> Result<(), RegionError> {
        if self.intact() {
            return Ok(());
        }
        self.check_failed()
    }

    /// [`UsageRegion::check`]'s fast path: the same words, read in the same order (the header first: on a
    /// truncated file that read is what faults and breaks the mapping), compared with what this version
    /// wrote.
    #[inline]
    fn intact(&self) -> bool {
        let h = &self.file().header;
        !self.superseded.load(Ordering::Relaxed)
            && h.magic.load(Ordering::Acquire) == USAGE_MAGIC
            && h.abi_version.load(Ordering::Acquire) == ABI_VERSION
            && h.header_size.load(Ordering::Relaxed) == std::mem::size_of::<UsageHeader>() as u32
            && h.total_size.load(Ordering::Relaxed) == std::mem::size_of::<UsageFile>() as u64
            && h.max_devices.load(Ordering::Relaxed) == MAX_DEVICES as u32
            && h.max_procs.load(Ordering::Relaxed) == MAX_PROCS as u32
            && !self.map.is_broken()
    }

    /// Which check failed, and how (the full validation of [`UsageRegion::validate`]).
    #[cold]
    #[inline(never)]
    fn check_failed(&self) -> Result<(), RegionError> {
        let broken = |what| RegionError::Broken {
            path: self.path().to_path_buf(),
            what,
        };
        if self.superseded.load(Ordering::Relaxed) {
            return Err(RegionError::Superseded {
                path: self.path().to_path_buf(),
            });
        }
        // Read the header first: on a truncated file that read is what faults and breaks the mapping.
        let header = self.validate(false);
        if self.map.is_broken() {
            return Err(broken("truncated"));
        }
        match header {
            Err(RegionError::NotInitialized { .. }) => Err(broken("zeroed")),
            r => r,
        }
    }

    #[inline]
    fn high_water(&self) -> usize {
        (self.file().header.proc_high_water.load(Ordering::SeqCst) as usize).min(MAX_PROCS)
    }

    // ---- liveness locks --------------------------------------------------------------------------------------
    //
    // A slot's owner holds a write lock on one byte of the file (`slot_lock_offset`) through an open file
    // description of its own. The kernel drops it when the last descriptor of that description closes: when the
    // process dies (or execs: the descriptor is close-on-exec), whatever pid namespace it or an observer lives
    // in. An observer asks with F_OFD_GETLK through the mapping's descriptor, which never holds a lock. So a
    // slot is alive exactly while its byte is locked, and no pid is compared.

    /// A fresh open file description of the usage file (its own, so its lock is released by closing it and by
    /// nothing else), or `None` when there is no way to get one.
    fn open_lock_fd(&self) -> Option<i32> {
        let probe = self.map.fd()?;
        let via_proc = std::ffi::CString::new(format!("/proc/self/fd/{probe}")).ok()?;
        // SAFETY: NUL-terminated path; the flags are plain.
        let mut fd = unsafe { libc::open(via_proc.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            use std::os::unix::ffi::OsStrExt;
            let path = std::ffi::CString::new(self.path().as_os_str().as_bytes()).ok()?;
            // SAFETY: as above.
            fd = unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                )
            };
        }
        if fd < 0 {
            return None;
        }
        if !same_file(fd, probe) {
            close_fd(fd); // the path now names another file: no lock rather than a lock on the wrong one
            return None;
        }
        Some(fd)
    }

    fn try_lock(&self, slot: usize) -> LockTry {
        let Some(fd) = self.open_lock_fd() else {
            return LockTry::Unsupported;
        };
        match ofd_lock(fd, libc::F_OFD_SETLK, libc::F_WRLCK as libc::c_short, slot) {
            Ok(_) => LockTry::Locked(fd),
            Err(e) => {
                close_fd(fd);
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EACCES) => LockTry::Busy,
                    _ => LockTry::Unsupported,
                }
            }
        }
    }

    /// Whether some process holds slot `slot`'s liveness lock; `None` when that cannot be asked.
    fn lock_held(&self, slot: usize) -> Option<bool> {
        let fd = self.map.fd()?;
        let fl = ofd_lock(fd, libc::F_OFD_GETLK, libc::F_WRLCK as libc::c_short, slot).ok()?;
        Some(fl.l_type != libc::F_UNLCK as libc::c_short)
    }

    /// Whether the process a slot's owner word `w` names is alive: by its liveness lock when it holds one (or
    /// when the lock is held at all: a claimer takes it before it claims), else by pid (and, for a live slot,
    /// start time) — which is only meaningful within one pid namespace.
    fn owner_alive(&self, slot: usize, s: &UsageSlot, w: u64) -> bool {
        match self.lock_held(slot) {
            Some(true) => return true,
            Some(false) if s.flags.load(Ordering::Acquire) & SLOT_FLAG_LOCKED != 0 => return false,
            _ => {}
        }
        if owner_state(w) == STATE_LIVE {
            is_alive(owner_pid(w), Some(s.start_time.load(Ordering::Relaxed)))
        } else {
            // A transient state: only a vanished pid means its process died mid-transition.
            is_alive(owner_pid(w), None)
        }
    }

    /// Whether slot `slot` is owned by a live process (its lock, else its pid): what `cuquota status` and
    /// reclaim judge by. Slow path.
    pub fn slot_alive(&self, slot: SlotId) -> bool {
        let s = &self.file().slots[slot.index()];
        let w = s.owner.load(Ordering::Acquire);
        owner_state(w) != STATE_FREE && self.owner_alive(slot.index(), s, w)
    }

    /// Drops this process's liveness lock on `slot`, if it holds one.
    fn unlock(&self, slot: usize) {
        close_fd(self.lock_fds[slot].swap(-1, Ordering::AcqRel));
    }

    // ---- process slots -------------------------------------------------------------------------------------

    /// Claims a slot for the calling process (pid + start time). Slow path: reads `/proc/self/stat`. If every
    /// slot is taken, reclaims dead processes once and retries.
    pub fn claim_slot(&self) -> Result<SlotId, RegionError> {
        self.claim_slot_as(current_pid(), current_start_time())
    }

    /// Claims a slot recording `pid` and `start_time` (tests use a fake start time to simulate pid reuse). The
    /// calling process's own claims take the slot's liveness lock; a claim for another pid (tests simulating
    /// other processes) takes none and is judged by that pid.
    pub fn claim_slot_as(&self, pid: u32, start_time: u64) -> Result<SlotId, RegionError> {
        let f = self.file();
        let own = pid == current_pid() && start_time == current_start_time();
        for pass in 0..2 {
            for (i, slot) in f.slots.iter().enumerate() {
                let w = slot.owner.load(Ordering::Acquire);
                if owner_state(w) != STATE_FREE {
                    continue;
                }
                // The lock first: while it is held, everyone sees the slot as alive, claiming included.
                let lock = if own {
                    self.try_lock(i)
                } else {
                    LockTry::Unsupported
                };
                let fd = match lock {
                    LockTry::Busy => continue,
                    LockTry::Locked(fd) => fd,
                    LockTry::Unsupported => -1,
                };
                let claiming = owner_word(pid, STATE_CLAIMING, next_gen(w));
                if slot
                    .owner
                    .compare_exchange(w, claiming, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    close_fd(fd);
                    continue;
                }
                let locked = if fd >= 0 { SLOT_FLAG_LOCKED } else { 0 };
                slot.flags.store(locked | SLOT_FLAG_CREDIT, Ordering::Release);
                slot.start_time.store(start_time, Ordering::Relaxed);
                slot.host_pid.store(0, Ordering::Relaxed);
                // Free slots are zero already (reclaim zeroes before freeing); make sure anyway: it is ours.
                for c in slot.mem_used.iter().chain(&slot.gpu_ns).chain(&slot.credit) {
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
                    close_fd(self.lock_fds[i].swap(fd, Ordering::AcqRel));
                    return Ok(SlotId(i as u32));
                }
                // Someone judged us dead (a fake pid, or a claim without a lock seen from another pid
                // namespace): look for another slot.
                close_fd(fd);
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
            self.drop_holds(slot.index());
            Self::zero_and_free(s, reclaiming);
        }
        self.unlock(slot.index());
    }

    fn zero_and_free(s: &UsageSlot, reclaiming: u64) {
        for c in s.mem_used.iter().chain(&s.gpu_ns).chain(&s.credit) {
            c.store(0, Ordering::SeqCst);
        }
        s.start_time.store(0, Ordering::Relaxed);
        s.host_pid.store(0, Ordering::Relaxed);
        s.flags.store(0, Ordering::Relaxed);
        let _ = s.owner.compare_exchange(
            reclaiming,
            owner_word(0, STATE_FREE, next_gen(reclaiming)),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// This process's slot, claimed on first use and cached. Hot path after the first call: one atomic load.
    #[inline]
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

    /// Forgets the cached slot without touching shared memory, and closes the child's copies of the parent's
    /// lock descriptors (the parent's locks stay: its own descriptors still refer to them). Async-signal-safe
    /// (atomics and `close`): call it from a `pthread_atfork` child handler, so the child claims its own slot
    /// instead of charging (or freeing from) its parent's, and does not keep its parent's slot alive after the
    /// parent died. The parent's slot is unaffected.
    pub fn forget_slot_in_child(&self) {
        self.own_slot.store(NO_SLOT, Ordering::Release);
        for fd in self.lock_fds.iter() {
            close_fd(fd.swap(-1, Ordering::AcqRel));
        }
    }

    /// Frees this process's cached slot at a clean exit, if it holds nothing: no memory charged and no
    /// shared memory held. A slot that still holds charges is kept: the driver frees a process's memory only
    /// when its device files close, after every exit handler, so freeing the charge here would let a
    /// newcomer in while the GPU still holds it. The kernel drops the slot's liveness lock as it closes the
    /// same process's files, and the next reclaim frees it. Returns whether the slot was freed.
    pub fn release_process_slot(&self) -> bool {
        let s = self.own_slot.load(Ordering::Acquire);
        if s == NO_SLOT || self.slot_holds_anything(s as usize) {
            return false;
        }
        if self
            .own_slot
            .compare_exchange(s, NO_SLOT, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.release_slot(SlotId(s));
        true
    }

    /// Whether slot `i` has memory charged on any device or holds shared memory.
    fn slot_holds_anything(&self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        self.file().slots[i]
            .mem_used
            .iter()
            .any(|c| c.load(Ordering::SeqCst) != 0)
            || self.file().shared[..self.shared_high_water()]
                .iter()
                .any(|e| e.holder_slots[i / 64].load(Ordering::SeqCst) & bit != 0)
    }

    /// Records the pid NVML reports for the slot's owner (the host pid namespace), for filtering NVML lists.
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) {
        self.file().slots[slot.index()]
            .host_pid
            .store(host_pid, Ordering::Release);
    }

    /// Reclaims the slots of dead processes: liveness lock released (or, for slots without one, pid gone,
    /// zombie, or pid reused: start time differs). Returns how many were reclaimed. Slow path: one `fcntl` per
    /// slot, `/proc` for slots without a lock.
    pub fn reclaim_dead(&self) -> usize {
        let me = current_pid();
        let mut n = 0;
        for (i, s) in self.file().slots[..self.high_water()].iter().enumerate() {
            let w = s.owner.load(Ordering::Acquire);
            let dead = owner_state(w) != STATE_FREE && !self.owner_alive(i, s, w);
            if !dead {
                continue;
            }
            let reclaiming = owner_word(me, STATE_RECLAIMING, next_gen(w));
            if s.owner
                .compare_exchange(w, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.drop_holds(i);
                Self::zero_and_free(s, reclaiming);
                n += 1;
            }
        }
        n
    }

    /// Bytes charged on `dev` (credit taken off) by slots whose owner is provably dead, its liveness lock
    /// released, but not yet reclaimed (the library reclaims on its next slow path). A slot that never held a
    /// lock is judged by pid only within one pid namespace, so never here: what a reader outside the container
    /// (the agent) takes off the charge it reads. Slow path: one `fcntl` per slot.
    pub fn dead_held(&self, dev: DeviceId) -> u64 {
        let d = dev.index();
        let mut n = 0u64;
        for (i, s) in self.file().slots[..self.high_water()].iter().enumerate() {
            if owner_state(s.owner.load(Ordering::Acquire)) == STATE_FREE
                || s.flags.load(Ordering::Acquire) & SLOT_FLAG_LOCKED == 0
                || self.lock_held(i) != Some(false)
            {
                continue;
            }
            let used = s.mem_used[d].load(Ordering::SeqCst);
            n = n.saturating_add(used.saturating_sub(Self::credit_of(s, d)));
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
                mem_used: {
                    let mut m = load(&s.mem_used);
                    for (d, u) in m.iter_mut().enumerate() {
                        *u = u.saturating_sub(Self::credit_of(s, d));
                    }
                    m
                },
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
        claim_device(&self.file().devices, uuid, self.path()).map(|i| DeviceId(i as u32))
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
                used: self.container_held(id),
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
    /// `Ok`: the container's usage of `dev` the check saw, this charge included (0 without a limit: no sum is
    /// taken), so a caller can tell how close to the limit it got at no extra cost.
    #[inline(always)]
    pub fn try_charge(
        &self,
        slot: SlotId,
        dev: DeviceId,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<u64, OverLimit> {
        let cell = &self.file().slots[slot.index()].mem_used[dev.index()];
        let Some(limit) = limit else {
            cell.fetch_add(bytes, Ordering::SeqCst);
            return Ok(0);
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
        Ok(used)
    }

    /// Puts back what this process knows `slot` holds (`own(device)`: its in-process ledger) after another
    /// process of the container zeroed the file (erasing every charge) and a newcomer re-initialised it: the
    /// slot's owner word then reads free while this process still holds the slot's liveness lock (so no one
    /// else can claim it). Restores the owner word, the high-water mark and the counter (never lowering it).
    /// One load while the file is sound.
    #[inline]
    pub fn reassert(&self, slot: SlotId, own: impl Fn(DeviceId) -> u64) {
        let w = self.file().slots[slot.index()].owner.load(Ordering::Acquire);
        if owner_state(w) != STATE_FREE {
            return;
        }
        self.reassert_free(slot, w, &own);
    }

    /// [`UsageRegion::reassert`] once the slot's owner word `w` reads free (out of line: the file was zeroed).
    #[cold]
    #[inline(never)]
    fn reassert_free(&self, slot: SlotId, w: u64, own: &dyn Fn(DeviceId) -> u64) {
        let f = self.file();
        let s = &f.slots[slot.index()];
        // Only a slot this process still owns and holds the lock of: not one it gave back at exit (a thread
        // still allocating then claims a new one), and not without a lock (anyone may claim a free slot then).
        if self.own_slot.load(Ordering::Acquire) != slot.0
            || self.lock_fds[slot.index()].load(Ordering::Acquire) < 0
        {
            return;
        }
        let live = owner_word(current_pid(), STATE_LIVE, next_gen(w));
        if s.owner
            .compare_exchange(w, live, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        for (d, cell) in s.mem_used.iter().enumerate() {
            cell.fetch_max(own(DeviceId(d as u32)), Ordering::SeqCst);
        }
        f.header
            .proc_high_water
            .fetch_max(slot.index() as u32 + 1, Ordering::SeqCst);
    }

    /// [`UsageRegion::try_charge`], and when it fails, reclaims dead processes (slow path, reads `/proc`) and
    /// retries once. Still no lock.
    #[inline]
    pub fn charge(
        &self,
        slot: SlotId,
        dev: DeviceId,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<u64, OverLimit> {
        match self.try_charge(slot, dev, bytes, limit) {
            Err(_) => self.charge_again(slot, dev, bytes, limit),
            ok => ok,
        }
    }

    /// [`UsageRegion::charge`] after a refusal: out of line, so the admitted path stays one inlined
    /// `try_charge`.
    #[cold]
    #[inline(never)]
    fn charge_again(
        &self,
        slot: SlotId,
        dev: DeviceId,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<u64, OverLimit> {
        // Dead processes reclaimed, other processes' credit taken back (it is not memory anyone holds), or a
        // racing reservation that made us fail spuriously: one more look.
        self.reclaim_dead();
        self.drain_all_credit(dev);
        self.try_charge(slot, dev, bytes, limit)
    }

    /// Returns `bytes` on `dev` from `slot`. Never underflows: a counter cannot go below zero (HAMi's
    /// "terabytes used" bug); returns the bytes actually removed.
    #[inline]
    pub fn uncharge(&self, slot: SlotId, dev: DeviceId, bytes: u64) -> u64 {
        let cell = &self.file().slots[slot.index()].mem_used[dev.index()];
        let prev = cell
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(bytes))
            })
            .unwrap_or_else(|v| v);
        prev.min(bytes)
    }

    // ---- credit: bytes of a slot's charge taken ahead of its allocations ------------------------------------

    /// `slot`'s credit word for `dev` (`None`: entries past [`CREDIT_DEVICES`] hold no credit).
    #[inline]
    fn credit_cell(&self, slot: SlotId, dev: DeviceId) -> Option<&AtomicU64> {
        self.file().slots[slot.index()].credit.get(dev.index())
    }

    /// Whether slot `s`'s credit words are credit (its owner knows them).
    fn knows_credit(s: &UsageSlot) -> bool {
        s.flags.load(Ordering::Acquire) & SLOT_FLAG_CREDIT != 0
    }

    /// Takes `bytes` of `slot`'s credit on `dev` for an allocation (its charge is already in `mem_used`): false
    /// when the credit holds less (taken back by another process, zeroed with the file, spent) or more than
    /// [`CREDIT_MAX`] (not credit: tampered).
    #[inline]
    pub fn take_credit(&self, slot: SlotId, dev: DeviceId, bytes: u64) -> bool {
        self.credit_cell(slot, dev).is_some_and(|c| {
            c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                if v > CREDIT_MAX {
                    return None;
                }
                v.checked_sub(bytes)
            })
            .is_ok()
        })
    }

    /// Charges `bytes` to `slot` on `dev` as credit if the container stays within `limit` (as
    /// [`UsageRegion::try_charge`]) and every live slot knows credit. False: nothing charged.
    pub fn charge_credit(&self, slot: SlotId, dev: DeviceId, bytes: u64, limit: u64) -> bool {
        let Some(c) = self.credit_cell(slot, dev) else {
            return false;
        };
        let everyone_knows = self.file().slots[..self.high_water()].iter().all(|s| {
            matches!(
                owner_state(s.owner.load(Ordering::Acquire)),
                STATE_FREE | STATE_RECLAIMING
            ) || Self::knows_credit(s)
        });
        if !everyone_knows || self.try_charge(slot, dev, bytes, Some(limit)).is_err() {
            return false;
        }
        if c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            v.checked_add(bytes).filter(|&n| n <= CREDIT_MAX)
        })
        .is_err()
        {
            self.uncharge(slot, dev, bytes);
            return false;
        }
        true
    }

    /// Keeps `bytes` an allocation of `slot` on `dev` gave back as credit (their charge stays in `mem_used`);
    /// past [`CREDIT_MAX`] the credit drops to `keep` and the rest is uncharged. False: no credit word for
    /// `dev` (the caller uncharges).
    #[inline]
    pub fn give_credit(&self, slot: SlotId, dev: DeviceId, bytes: u64, keep: u64) -> bool {
        let Some(c) = self.credit_cell(slot, dev) else {
            return false;
        };
        let grow = |v: u64| {
            let n = v.saturating_add(bytes);
            if n <= CREDIT_MAX {
                n
            } else {
                keep.min(n)
            }
        };
        let Ok(v) = c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            (v <= CREDIT_MAX).then(|| grow(v))
        }) else {
            // Not credit (tampered): the bytes are uncharged as without credit.
            self.uncharge(slot, dev, bytes);
            return true;
        };
        let (n, all) = (grow(v), v.saturating_add(bytes));
        if n < all {
            self.uncharge(slot, dev, all - n);
        }
        true
    }

    /// Takes back `slot`'s credit on `dev`: the word goes to 0 and what it held is uncharged (not a word above
    /// [`CREDIT_MAX`]: nothing stands behind it; not when the slot changed hands meanwhile). Returns the bytes
    /// uncharged.
    pub fn drain_credit(&self, slot: SlotId, dev: DeviceId) -> u64 {
        let s = &self.file().slots[slot.index()];
        let Some(c) = s.credit.get(dev.index()) else {
            return 0;
        };
        if c.load(Ordering::SeqCst) == 0 || !Self::knows_credit(s) {
            return 0;
        }
        let owner = s.owner.load(Ordering::SeqCst);
        let v = c.swap(0, Ordering::SeqCst);
        if v == 0 || v > CREDIT_MAX || s.owner.load(Ordering::SeqCst) != owner {
            return 0;
        }
        self.uncharge(slot, dev, v)
    }

    /// Takes back every process's credit on `dev` (credit is not memory anyone holds: before refusing at the
    /// cap, or asking the driver because of it); returns the bytes uncharged.
    pub fn drain_all_credit(&self, dev: DeviceId) -> u64 {
        (0..self.high_water())
            .map(|i| self.drain_credit(SlotId(i as u32), dev))
            .sum()
    }

    /// Bytes the container's processes hold on `dev`: its charge less the credit charged ahead.
    pub fn container_held(&self, dev: DeviceId) -> u64 {
        self.container_used_held(dev).1
    }

    /// Slot `s`'s credit on device entry `d` as readers count it (none from a slot that does not know credit,
    /// at most [`CREDIT_MAX`]).
    #[inline]
    fn credit_of(s: &UsageSlot, d: usize) -> u64 {
        match s.credit.get(d) {
            Some(w) if Self::knows_credit(s) => w.load(Ordering::SeqCst).min(CREDIT_MAX),
            _ => 0,
        }
    }

    /// [`UsageRegion::container_used`] and [`UsageRegion::container_held`] in one pass over the slots.
    #[inline]
    pub fn container_used_held(&self, dev: DeviceId) -> (u64, u64) {
        let d = dev.index();
        let (used, credit) = self.file().slots[..self.high_water()]
            .iter()
            .fold((0u64, 0u64), |(u, c), s| {
                (
                    u.saturating_add(s.mem_used[d].load(Ordering::SeqCst)),
                    c.saturating_add(Self::credit_of(s, d)),
                )
            });
        let used = used.saturating_add(self.shared_used(dev));
        (used, used.saturating_sub(credit))
    }

    /// Bytes the whole container has charged on `dev` (sum over slots and shared entries; saturating).
    #[inline]
    pub fn container_used(&self, dev: DeviceId) -> u64 {
        let d = dev.index();
        let slots = self.file().slots[..self.high_water()]
            .iter()
            .fold(0u64, |acc, s| {
                acc.saturating_add(s.mem_used[d].load(Ordering::SeqCst))
            });
        slots.saturating_add(self.shared_used(dev))
    }

    // ---- memory shared between processes (not on the allocation path) ------------------------------------

    #[inline]
    fn shared_high_water(&self) -> usize {
        (self.file().header.shared_high_water.load(Ordering::SeqCst) as usize).min(MAX_SHARED)
    }

    /// Bytes of shared entries on `dev` (one atomic load while none was ever claimed).
    #[inline]
    pub fn shared_used(&self, dev: DeviceId) -> u64 {
        match self.shared_high_water() {
            0 => 0,
            n => self.shared_used_in(dev, n),
        }
    }

    fn shared_used_in(&self, dev: DeviceId, n: usize) -> u64 {
        self.file().shared[..n]
            .iter()
            .filter(|e| {
                let k = e.key.load(Ordering::SeqCst);
                k != 0 && k != SHARED_CLAIMING && e.device.load(Ordering::SeqCst) as usize == dev.index()
            })
            .fold(0u64, |acc, e| acc.saturating_add(e.bytes.load(Ordering::SeqCst)))
    }

    fn find_shared(&self, key: u64) -> Option<usize> {
        self.file().shared[..self.shared_high_water()]
            .iter()
            .position(|e| e.key.load(Ordering::Acquire) == key)
    }

    /// Moves `bytes` that `slot` charged on `dev` into a new shared entry under `key` held by `slot` (the
    /// container's usage is unchanged); when `key` already has an entry, joins it instead (and keeps the slot's
    /// charge: a second identity for one allocation must not free anything). Returns the entry index and
    /// whether the slot's charge moved; `None` when the table is full.
    pub fn share(&self, slot: SlotId, dev: DeviceId, key: u64, bytes: u64) -> Option<(usize, bool)> {
        let key = shared_key(key);
        if let Some(i) = self.join_shared(slot, key) {
            return Some((i, false));
        }
        let f = self.file();
        let i = f.shared.iter().position(|e| {
            e.key
                .compare_exchange(0, SHARED_CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let e = &f.shared[i];
        e.bytes.store(bytes, Ordering::SeqCst);
        e.device.store(dev.index() as u32, Ordering::SeqCst);
        for w in &e.holder_slots {
            w.store(0, Ordering::SeqCst);
        }
        e.holder_slots[slot.index() / 64].fetch_or(1 << (slot.index() % 64), Ordering::SeqCst);
        e.holders.store(1, Ordering::SeqCst);
        f.header
            .shared_high_water
            .fetch_max(i as u32 + 1, Ordering::SeqCst);
        e.key.store(key, Ordering::SeqCst);
        // Counted in the entry now: the slot's charge can go.
        self.uncharge(slot, dev, bytes);
        Some((i, true))
    }

    /// `slot` holds the entry under `key`, if this container has one (a process holds an entry once).
    pub fn join_shared(&self, slot: SlotId, key: u64) -> Option<usize> {
        let key = shared_key(key);
        let i = self.find_shared(key)?;
        let e = &self.file().shared[i];
        let bit = 1u64 << (slot.index() % 64);
        if e.holder_slots[slot.index() / 64].load(Ordering::SeqCst) & bit != 0 {
            return Some(i);
        }
        e.holders
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| (h > 0).then_some(h + 1))
            .ok()?;
        if e.key.load(Ordering::SeqCst) != key {
            // Freed and reused between the look-up and the increment: not ours to hold.
            e.holders.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        e.holder_slots[slot.index() / 64].fetch_or(bit, Ordering::SeqCst);
        Some(i)
    }

    /// Whether shared entry `i` still holds the memory of `key` (someone holds it).
    pub fn shared_live(&self, i: usize, key: u64) -> bool {
        let key = shared_key(key);
        self.file()
            .shared
            .get(i)
            .is_some_and(|e| e.key.load(Ordering::SeqCst) == key)
    }

    /// `slot` lets go of shared entry `i` (`key` as given to [`UsageRegion::share`]); the last holder frees it.
    pub fn unshare(&self, slot: SlotId, i: usize, key: u64) {
        let key = shared_key(key);
        if self
            .file()
            .shared
            .get(i)
            .is_some_and(|e| e.key.load(Ordering::SeqCst) == key)
        {
            self.drop_hold(slot.index(), i);
        }
    }

    fn drop_hold(&self, slot: usize, i: usize) {
        let e = &self.file().shared[i];
        let bit = 1u64 << (slot % 64);
        if e.holder_slots[slot / 64].fetch_and(!bit, Ordering::SeqCst) & bit == 0 {
            return;
        }
        if e.holders.fetch_sub(1, Ordering::SeqCst) == 1 {
            let k = e.key.load(Ordering::SeqCst);
            if k != 0 && k != SHARED_CLAIMING {
                e.key.store(SHARED_CLAIMING, Ordering::SeqCst);
                e.bytes.store(0, Ordering::SeqCst);
                e.key.store(0, Ordering::SeqCst);
            }
        }
    }

    /// Drops every hold of `slot` (it is being freed).
    fn drop_holds(&self, slot: usize) {
        for i in 0..self.shared_high_water() {
            self.drop_hold(slot, i);
        }
    }

    /// Shared entries, copied out: (key, device entry index, bytes, holders).
    pub fn shared(&self) -> Vec<(u64, usize, u64, u32)> {
        self.file().shared[..self.shared_high_water()]
            .iter()
            .filter_map(|e| {
                let k = e.key.load(Ordering::SeqCst);
                (k != 0 && k != SHARED_CLAIMING).then(|| {
                    (
                        k,
                        e.device.load(Ordering::SeqCst) as usize,
                        e.bytes.load(Ordering::SeqCst),
                        e.holders.load(Ordering::SeqCst),
                    )
                })
            })
            .collect()
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

/// A key as the table stores it: never 0 (free) or [`SHARED_CLAIMING`].
fn shared_key(key: u64) -> u64 {
    match key {
        0 => 1,
        SHARED_CLAIMING => SHARED_CLAIMING - 1,
        k => k,
    }
}

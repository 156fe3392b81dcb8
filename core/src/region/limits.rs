//! The limits file: the node agent's word on what each device may use, read by the shim without ever waiting.
//!
//! Seqlock protocol (also in `include/cuquota.h` for agents written in C):
//! - **writer**: claim `writer_pid` by CAS (from 0, or from a dead pid), then make `seq` odd (or, when a dead
//!   writer left it odd, finish that write), release fence, write the fields, bump `generation`, store
//!   `seq` even (release), clear `writer_pid` (release). The pid is recorded before anything changes, so a
//!   live writer is never taken over and a dead one always is.
//! - **reader**: load `seq` (acquire); if odd, retry; copy the fields (relaxed atomics); acquire fence; reload
//!   `seq`; equal → the copy is consistent. After a bounded number of tries the reader gives up and keeps its
//!   last good snapshot ([`LimitsReader`]): a writer that died mid-write can never hang a reader.
//! - the hot path only compares `seq` with the last one seen: one atomic load ([`LimitsReader::needs_refresh`]).

use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use super::header::{self, Header, Word};
use super::layout::*;
use super::liveness::{current_pid, is_alive};
use super::map::{Access, FileId, Mapping};
use super::RegionError;
use crate::policy::{Policy, PolicyRaw};

/// Reader attempts before a read reports [`ReadError::Busy`].
const READ_TRIES: u32 = 256;
/// How long [`LimitsReader::new`] and writers wait for a busy seqlock.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// One entry of the limits file, copied out: which device(s) it targets, and its limits as the raw words
/// (a writer's edit keeps words it does not touch exactly as they were). The words read as fields
/// (`entry.memory_limit`, through `Deref`); [`LimitsEntryData::limits`] says what they mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsEntryData {
    /// Device UUID bytes; all zero = match by `cuda_index`.
    pub uuid: [u8; 16],
    /// [`LIMITS_ENTRY_VALID`] when in use.
    pub flags: u32,
    /// CUDA ordinal (when `uuid` is zero); [`LIMITS_INDEX_ALL`] = every device.
    pub cuda_index: u32,
    /// The limits' words.
    pub raw: PolicyRaw,
}

impl std::ops::Deref for LimitsEntryData {
    type Target = PolicyRaw;
    fn deref(&self) -> &PolicyRaw {
        &self.raw
    }
}

impl std::ops::DerefMut for LimitsEntryData {
    fn deref_mut(&mut self) -> &mut PolicyRaw {
        &mut self.raw
    }
}

impl LimitsEntryData {
    /// Whether the entry is in use.
    pub fn is_valid(&self) -> bool {
        self.flags & LIMITS_ENTRY_VALID != 0
    }

    /// Which devices this entry applies to.
    pub fn selector(&self) -> DeviceSelector {
        if self.uuid != [0; 16] {
            DeviceSelector::Uuid(self.uuid)
        } else if self.cuda_index == LIMITS_INDEX_ALL {
            DeviceSelector::All
        } else {
            DeviceSelector::Index(self.cuda_index)
        }
    }

    /// The entry's limits.
    pub fn limits(&self) -> Policy {
        self.raw.decode()
    }

    fn load(e: &LimitsEntry) -> LimitsEntryData {
        LimitsEntryData {
            uuid: words_to_uuid([
                e.uuid[0].load(Ordering::Relaxed),
                e.uuid[1].load(Ordering::Relaxed),
            ]),
            flags: e.flags.load(Ordering::Relaxed),
            cuda_index: e.cuda_index.load(Ordering::Relaxed),
            raw: PolicyRaw {
                memory_request: e.memory_request.load(Ordering::Relaxed),
                ..e.limits.load()
            },
        }
    }

    fn store(&self, e: &LimitsEntry) {
        let w = uuid_to_words(&self.uuid);
        e.uuid[0].store(w[0], Ordering::Relaxed);
        e.uuid[1].store(w[1], Ordering::Relaxed);
        e.flags.store(self.flags, Ordering::Relaxed);
        e.cuda_index.store(self.cuda_index, Ordering::Relaxed);
        e.limits.store(&self.raw);
        e.memory_request.store(self.raw.memory_request, Ordering::Relaxed);
    }
}

/// Which device(s) a limits entry targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSelector {
    /// A physical device by UUID (most specific).
    Uuid([u8; 16]),
    /// A CUDA ordinal.
    Index(u32),
    /// Every device without a more specific entry.
    All,
}

impl DeviceSelector {
    /// Parses `all`, a decimal CUDA ordinal, or a `GPU-…` UUID.
    pub fn parse(s: &str) -> Option<DeviceSelector> {
        if s.eq_ignore_ascii_case("all") {
            Some(DeviceSelector::All)
        } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse()
                .ok()
                .filter(|&i| i != LIMITS_INDEX_ALL)
                .map(DeviceSelector::Index)
        } else {
            parse_uuid(s).filter(|u| *u != [0; 16]).map(DeviceSelector::Uuid)
        }
    }
}

impl std::fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::Uuid(u) => f.write_str(&format_uuid(u)),
            DeviceSelector::Index(i) => write!(f, "{i}"),
            DeviceSelector::All => f.write_str("all"),
        }
    }
}

/// The contents of a limits file (what a writer edits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsTable {
    /// Header flags ([`LIMITS_FLAG_NO_OPT_OUT`], [`LIMITS_FLAG_MEMBERS`]).
    pub flags: u32,
    /// The entries, valid or not.
    pub entries: [LimitsEntryData; MAX_DEVICES],
    /// Valid entries of `members`.
    pub member_count: u32,
    /// Member host pids (sorted, unique) in `[..member_count]`, zero after.
    pub members: [u32; LIMITS_MAX_MEMBERS],
    /// Bytes of `usage_path` in use, 0 = no usage file bound.
    pub usage_path_len: u32,
    /// The bound usage file's path bytes, zero after `usage_path_len`.
    pub usage_path: [u8; LIMITS_USAGE_PATH_MAX],
    /// The bound file's identity; `ino` 0 = none recorded (bound by path only).
    pub usage_id: FileId,
    /// [`LimitsHeader::evict_mask`]: entries whose devices the agent asks to evict (elastic memory), 0 = none.
    pub evict_mask: u64,
}

impl Default for LimitsTable {
    fn default() -> Self {
        LimitsTable {
            flags: 0,
            entries: Default::default(),
            member_count: 0,
            members: [0; LIMITS_MAX_MEMBERS],
            usage_path_len: 0,
            usage_path: [0; LIMITS_USAGE_PATH_MAX],
            usage_id: FileId::default(),
            evict_mask: 0,
        }
    }
}

/// All [`MAX_DEVICES`] entries are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

impl std::fmt::Display for TableFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "all {MAX_DEVICES} limits entries are in use; remove one first")
    }
}

impl std::error::Error for TableFull {}

impl LimitsTable {
    /// The valid entry for exactly this selector.
    pub fn get(&self, sel: DeviceSelector) -> Option<&LimitsEntryData> {
        self.entries.iter().find(|e| e.is_valid() && e.selector() == sel)
    }

    /// The valid entry for exactly this selector, created (all limits 0) in a free entry if missing.
    pub fn entry_mut(&mut self, sel: DeviceSelector) -> Result<&mut LimitsEntryData, TableFull> {
        let idx = match self
            .entries
            .iter()
            .position(|e| e.is_valid() && e.selector() == sel)
        {
            Some(i) => i,
            None => {
                let i = self.entries.iter().position(|e| !e.is_valid()).ok_or(TableFull)?;
                let (uuid, cuda_index) = match sel {
                    DeviceSelector::Uuid(u) => (u, 0),
                    DeviceSelector::Index(i) => ([0; 16], i),
                    DeviceSelector::All => ([0; 16], LIMITS_INDEX_ALL),
                };
                self.entries[i] = LimitsEntryData {
                    uuid,
                    cuda_index,
                    flags: LIMITS_ENTRY_VALID,
                    ..Default::default()
                };
                i
            }
        };
        Ok(&mut self.entries[idx])
    }

    /// Removes the entry for this selector; returns whether there was one.
    pub fn remove(&mut self, sel: DeviceSelector) -> bool {
        match self
            .entries
            .iter()
            .position(|e| e.is_valid() && e.selector() == sel)
        {
            Some(i) => {
                self.entries[i] = LimitsEntryData::default();
                true
            }
            None => false,
        }
    }

    /// Limits for a device known by UUID and/or CUDA ordinal: the UUID entry if any, else the ordinal's entry,
    /// else the `all` entry, else none.
    pub fn for_device(&self, uuid: Option<&[u8; 16]>, cuda_index: Option<u32>) -> Policy {
        let by_uuid = uuid.and_then(|u| self.get(DeviceSelector::Uuid(*u)));
        let by_index = cuda_index.and_then(|i| self.get(DeviceSelector::Index(i)));
        by_uuid
            .or(by_index)
            .or_else(|| self.get(DeviceSelector::All))
            .map(|e| e.limits())
            .unwrap_or_default()
    }

    /// Whether the agent reclaims device memory for waiting allocations ([`LIMITS_FLAG_RECLAIM`]).
    pub fn reclaims(&self) -> bool {
        self.flags & LIMITS_FLAG_RECLAIM != 0
    }

    /// Whether processes may opt out (`CUDA_DISABLE_CONTROL`, `CUQUOTA_DISABLE`): only when the agent allowed
    /// it ([`LIMITS_FLAG_OPT_OUT_ALLOWED`] set, [`LIMITS_FLAG_NO_OPT_OUT`] clear).
    pub fn opt_out_allowed(&self) -> bool {
        self.flags & (LIMITS_FLAG_OPT_OUT_ALLOWED | LIMITS_FLAG_NO_OPT_OUT) == LIMITS_FLAG_OPT_OUT_ALLOWED
    }

    /// The container's member host pids as the agent published them: `None` when the agent publishes no
    /// membership ([`LIMITS_FLAG_MEMBERS`] clear; the shim then falls back to the cooperative usage-file list),
    /// else the list (possibly empty: then a process sees only itself).
    pub fn members(&self) -> Option<&[u32]> {
        (self.flags & LIMITS_FLAG_MEMBERS != 0)
            .then(|| &self.members[..(self.member_count as usize).min(LIMITS_MAX_MEMBERS)])
    }

    /// The usage file the agent bound the container to (as its processes see it), if any; `Err` for a binding
    /// this version cannot read (the caller fails closed).
    pub fn usage_path(&self) -> Result<Option<&std::path::Path>, UnreadableBinding> {
        use std::os::unix::ffi::OsStrExt;
        let n = self.usage_path_len as usize;
        if n > LIMITS_USAGE_PATH_MAX {
            return Err(UnreadableBinding {
                len: self.usage_path_len,
            });
        }
        Ok((n > 0).then(|| std::path::Path::new(std::ffi::OsStr::from_bytes(&self.usage_path[..n]))))
    }

    /// The identity of the bound usage file as the agent recorded it, if it did; `Err` as for
    /// [`LimitsTable::usage_path`].
    pub fn usage_id(&self) -> Result<Option<FileId>, UnreadableBinding> {
        Ok((self.usage_path()?.is_some() && self.usage_id.ino != 0).then_some(self.usage_id))
    }

    /// Binds the container's usage file (`None` unbinds): its path as the container's processes see it and
    /// the identity of that file (`UsageRegion::file_id` of the same file as the agent opened it; `None`
    /// binds by path alone, which a tenant who can write the file's directory defeats). The path must be
    /// absolute, without NUL bytes, and at most [`LIMITS_USAGE_PATH_MAX`] bytes; `Err` names what is wrong
    /// (nothing changed).
    pub fn set_usage(
        &mut self,
        path: Option<&std::path::Path>,
        id: Option<FileId>,
    ) -> Result<(), BadUsagePath> {
        self.set_usage_path(path)?;
        self.usage_id = if path.is_some() {
            id.unwrap_or_default()
        } else {
            FileId::default()
        };
        Ok(())
    }

    fn set_usage_path(&mut self, path: Option<&std::path::Path>) -> Result<(), BadUsagePath> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.map_or(&[][..], |p| p.as_os_str().as_bytes());
        if let Some(p) = path {
            if !p.is_absolute() || bytes.contains(&0) || bytes.len() > LIMITS_USAGE_PATH_MAX {
                return Err(BadUsagePath(p.to_path_buf()));
            }
        }
        self.usage_path = [0; LIMITS_USAGE_PATH_MAX];
        self.usage_path[..bytes.len()].copy_from_slice(bytes);
        self.usage_path_len = bytes.len() as u32;
        Ok(())
    }

    /// Whether `host_pid` is a member the agent published (false without agent membership). Binary search:
    /// the list is sorted.
    pub fn is_member(&self, host_pid: u32) -> bool {
        self.members().is_some_and(|m| m.binary_search(&host_pid).is_ok())
    }

    /// Replaces the member list with `host_pids` (sorted and deduplicated here) and sets
    /// [`LIMITS_FLAG_MEMBERS`]; `Err` (nothing changed) for a pid 0 or more than [`LIMITS_MAX_MEMBERS`] pids.
    pub fn set_members(&mut self, host_pids: &[u32]) -> Result<(), MembersError> {
        let mut v = host_pids.to_vec();
        v.sort_unstable();
        v.dedup();
        if v.first() == Some(&0) {
            return Err(MembersError::ZeroPid);
        }
        if v.len() > LIMITS_MAX_MEMBERS {
            return Err(MembersError::TooMany { count: v.len() });
        }
        self.members = [0; LIMITS_MAX_MEMBERS];
        self.members[..v.len()].copy_from_slice(&v);
        self.member_count = v.len() as u32;
        self.flags |= LIMITS_FLAG_MEMBERS;
        Ok(())
    }

    /// Empties the member list and clears [`LIMITS_FLAG_MEMBERS`].
    pub fn clear_members(&mut self) {
        self.members = [0; LIMITS_MAX_MEMBERS];
        self.member_count = 0;
        self.flags &= !LIMITS_FLAG_MEMBERS;
    }
}

/// A usage file path that cannot be bound: not absolute, with a NUL byte, or longer than
/// [`LIMITS_USAGE_PATH_MAX`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadUsagePath(pub std::path::PathBuf);

impl std::fmt::Display for BadUsagePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "usage file path {}: must be absolute, without NUL bytes, at most {LIMITS_USAGE_PATH_MAX} bytes",
            self.0.display()
        )
    }
}

impl std::error::Error for BadUsagePath {}

/// A member list that cannot be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembersError {
    /// More distinct pids than [`LIMITS_MAX_MEMBERS`].
    TooMany {
        /// Distinct pids given.
        count: usize,
    },
    /// Pid 0 is no process.
    ZeroPid,
}

/// A consistent copy of the limits file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsSnapshot {
    /// The (even) `seq` it was read at.
    pub seq: u64,
    /// Committed writes so far.
    pub generation: u64,
    /// The contents.
    pub table: LimitsTable,
}

impl LimitsSnapshot {
    /// The agent's member host pids: `None` without agent membership, else the (sorted) list. See
    /// [`LimitsTable::members`].
    pub fn members(&self) -> Option<&[u32]> {
        self.table.members()
    }
}

impl std::ops::Deref for LimitsSnapshot {
    type Target = LimitsTable;
    fn deref(&self) -> &LimitsTable {
        &self.table
    }
}

/// A read found no consistent state within its bounded tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// A write was in progress (odd `seq`) or kept changing the file; `seq` is the last value seen and
    /// `writer_pid` the writer then registered (0 = unknown).
    Busy {
        /// Last `seq` observed.
        seq: u64,
        /// Writer pid, 0 = unknown.
        writer_pid: u32,
    },
}

fn limits_file(map: &Mapping) -> &LimitsFile {
    // SAFETY: the mapping is exactly size_of::<LimitsFile>() bytes (checked at open), page-aligned, and
    // LimitsFile consists only of atomics, so a shared reference is valid for any content other processes
    // write; the reference lives no longer than the mapping (tied to `map`).
    unsafe { &*map.ptr().cast::<LimitsFile>() }
}

fn validate(map: &Mapping, writable: bool) -> Result<(), RegionError> {
    let h = &limits_file(map).header;
    let fields = [
        (
            "header_size",
            Word::U32(&h.header_size),
            std::mem::size_of::<LimitsHeader>() as u64,
        ),
        (
            "total_size",
            Word::U64(&h.total_size),
            std::mem::size_of::<LimitsFile>() as u64,
        ),
        ("max_devices", Word::U32(&h.max_devices), MAX_DEVICES as u64),
    ];
    let header = Header {
        magic: (&h.magic, LIMITS_MAGIC),
        abi_version: (&h.abi_version, ABI_VERSION),
        fields: &fields,
    };
    header::validate(map.path(), &header, writable)
}

/// A usage binding this version cannot read: a path longer than the field holds. Before the bound file's
/// identity took the field's last 24 bytes (same ABI version 4, layout.rs), an agent could bind paths of up
/// to 504 bytes; read with this layout, such a path would be cut short and its tail taken for an identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadableBinding {
    /// The path length the file records.
    pub len: u32,
}

impl std::fmt::Display for UnreadableBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the limits file binds a usage file path of {} bytes, and this version reads at most \
             {LIMITS_USAGE_PATH_MAX} (an older agent wrote it): the binding cannot be read, so nothing is \
             admitted; bind the container again with this version's `cuquota limits set --usage` (a path of at \
             most {LIMITS_USAGE_PATH_MAX} bytes)",
            self.len
        )
    }
}

impl std::error::Error for UnreadableBinding {}

/// Copies the header flags, every entry and the members out (relaxed loads; the caller makes them consistent).
fn load_table(file: &LimitsFile) -> LimitsTable {
    let mut table = LimitsTable {
        flags: file.header.flags.load(Ordering::Relaxed),
        evict_mask: file.header.evict_mask.load(Ordering::Relaxed),
        ..Default::default()
    };
    for (out, e) in table.entries.iter_mut().zip(file.devices.iter()) {
        *out = LimitsEntryData::load(e);
    }
    // A count past the table (a torn read, or a foreign writer) is clamped: the seqlock check decides.
    let n = (file.members.count.load(Ordering::Relaxed) as usize).min(LIMITS_MAX_MEMBERS);
    table.member_count = n as u32;
    for (out, p) in table.members[..n].iter_mut().zip(file.members.pids.iter()) {
        *out = p.load(Ordering::Relaxed);
    }
    for (out, w) in table.usage_path.chunks_exact_mut(8).zip(file.usage.path.iter()) {
        out.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    // Not clamped: a length past the field (an older agent's, or a torn read the seqlock check then
    // discards) is an unreadable binding (`usage_path`), never a shorter path.
    table.usage_path_len = file.usage.len.load(Ordering::Relaxed);
    table.usage_id = FileId {
        dev: file.usage.dev.load(Ordering::Relaxed),
        ino: file.usage.ino.load(Ordering::Relaxed),
        btime_ns: file.usage.btime_ns.load(Ordering::Relaxed),
    };
    table
}

/// Stores a table (relaxed; the caller holds the write side of the seqlock).
fn store_table(file: &LimitsFile, table: &LimitsTable) {
    file.header.flags.store(table.flags, Ordering::Relaxed);
    file.header.evict_mask.store(table.evict_mask, Ordering::Relaxed);
    for (d, e) in table.entries.iter().zip(file.devices.iter()) {
        d.store(e);
    }
    let n = (table.member_count as usize).min(LIMITS_MAX_MEMBERS);
    file.members.count.store(n as u32, Ordering::Relaxed);
    for (i, p) in file.members.pids.iter().enumerate() {
        p.store(if i < n { table.members[i] } else { 0 }, Ordering::Relaxed);
    }
    for (w, b) in file.usage.path.iter().zip(table.usage_path.chunks_exact(8)) {
        w.store(
            u64::from_ne_bytes(b.try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
    }
    file.usage.len.store(table.usage_path_len, Ordering::Relaxed);
    file.usage.dev.store(table.usage_id.dev, Ordering::Relaxed);
    file.usage.ino.store(table.usage_id.ino, Ordering::Relaxed);
    file.usage
        .btime_ns
        .store(table.usage_id.btime_ns, Ordering::Relaxed);
}

/// One seqlock read attempt loop.
fn try_read(file: &LimitsFile) -> Result<LimitsSnapshot, ReadError> {
    let h = &file.header;
    let mut last = 0;
    for i in 0..READ_TRIES {
        let s1 = h.seq.load(Ordering::Acquire);
        last = s1;
        if s1 & 1 == 1 {
            backoff(i);
            continue;
        }
        let snap = LimitsSnapshot {
            seq: s1,
            generation: h.generation.load(Ordering::Relaxed),
            table: load_table(file),
        };
        fence(Ordering::Acquire);
        if h.seq.load(Ordering::Relaxed) == s1 {
            return Ok(snap);
        }
        backoff(i);
    }
    Err(ReadError::Busy {
        seq: last,
        writer_pid: h.writer_pid.load(Ordering::Relaxed),
    })
}

fn backoff(i: u32) {
    if i < 64 {
        std::hint::spin_loop();
    } else {
        // Past the spin budget a writer is slow or gone: let it run. (Only reached on a contended slow path.)
        std::thread::yield_now();
    }
}

/// The limits file mapped read-only (the shim's view).
#[derive(Debug)]
pub struct LimitsRegion {
    map: Mapping,
}

impl LimitsRegion {
    /// Maps `path` read-only and validates its header. A file nobody initialised is
    /// [`RegionError::NotInitialized`].
    pub fn open(path: &Path) -> Result<LimitsRegion, RegionError> {
        let map = Mapping::open(path, Access::ReadOnly, std::mem::size_of::<LimitsFile>())?;
        validate(&map, false)?;
        Ok(LimitsRegion { map })
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// Current `seq`: one atomic load, for the hot path.
    #[inline]
    pub fn seq(&self) -> u64 {
        limits_file(&self.map).header.seq.load(Ordering::Acquire)
    }

    /// Whether `seq` differs from `seen` (one atomic load).
    #[inline]
    pub fn changed_since(&self, seen: u64) -> bool {
        self.seq() != seen
    }

    /// One bounded seqlock read. Never blocks for long; `Busy` when a write is in progress or stuck.
    pub fn try_read(&self) -> Result<LimitsSnapshot, ReadError> {
        try_read(limits_file(&self.map))
    }
}

/// A [`LimitsRegion`] plus the last good snapshot: what the shim keeps. `refresh` takes `&mut self`: keep the
/// reader behind the shim's own (in-process) lock, or one per thread; [`LimitsReader::needs_refresh`] (`&self`,
/// one atomic load) is the only hot-path call.
#[derive(Debug)]
pub struct LimitsReader {
    region: LimitsRegion,
    snapshot: LimitsSnapshot,
    seen_seq: u64,
    stale: bool,
}

impl LimitsReader {
    /// Takes the first snapshot, waiting up to ~2 s for a write in progress. With no consistent state at all
    /// (a writer died before the first write completed) it fails closed with [`RegionError::LimitsBusy`].
    pub fn new(region: LimitsRegion) -> Result<LimitsReader, RegionError> {
        let deadline = Instant::now() + BUSY_WAIT;
        loop {
            match region.try_read() {
                Ok(snapshot) => {
                    return Ok(LimitsReader {
                        region,
                        seen_seq: snapshot.seq,
                        snapshot,
                        stale: false,
                    })
                }
                Err(ReadError::Busy { writer_pid, .. }) => {
                    if Instant::now() >= deadline {
                        return Err(RegionError::LimitsBusy {
                            path: region.path().to_path_buf(),
                            writer_pid,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    /// Opens `path` and takes the first snapshot.
    pub fn open(path: &Path) -> Result<LimitsReader, RegionError> {
        LimitsReader::new(LimitsRegion::open(path)?)
    }

    /// The `seq` the snapshot (or, when the writer was busy, the last read attempt) was taken at: a later write
    /// has another.
    pub fn seen_seq(&self) -> u64 {
        self.seen_seq
    }

    /// Whether the file changed since the last [`LimitsReader::refresh`]: one atomic load, no syscall.
    #[inline]
    pub fn needs_refresh(&self) -> bool {
        self.region.changed_since(self.seen_seq)
    }

    /// Re-reads the file. On success the snapshot is replaced; when the writer is busy or stuck the last good
    /// snapshot stays and [`LimitsReader::is_stale`] turns true; the `seq` seen is remembered either way, so a
    /// stuck writer costs one bounded read, not one per call. Returns whether the snapshot's contents changed.
    pub fn refresh(&mut self) -> bool {
        match self.region.try_read() {
            Ok(s) => {
                let changed = s.table != self.snapshot.table;
                self.seen_seq = s.seq;
                self.snapshot = s;
                self.stale = false;
                changed
            }
            Err(ReadError::Busy { seq, .. }) => {
                self.seen_seq = seq;
                self.stale = true;
                false
            }
        }
    }

    /// The last good snapshot.
    pub fn snapshot(&self) -> &LimitsSnapshot {
        &self.snapshot
    }

    /// True when the last refresh could not read a consistent state (the snapshot is older than the file).
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// The underlying region.
    pub fn region(&self) -> &LimitsRegion {
        &self.region
    }
}

/// The limits file mapped read-write: the agent's (and `cuquota limits`') handle.
#[derive(Debug)]
pub struct LimitsWriter {
    map: Mapping,
}

/// Releases the seqlock (as a no-op commit) if the update closure panics.
struct WriteGuard<'a> {
    file: &'a LimitsFile,
    odd_seq: u64,
    armed: bool,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let h = &self.file.header;
            h.seq.store(self.odd_seq + 1, Ordering::Release);
            h.writer_pid.store(0, Ordering::Release);
        }
    }
}

impl LimitsWriter {
    /// Opens `path`, creating it (mode 0644, empty table) if missing.
    pub fn create(path: &Path) -> Result<LimitsWriter, RegionError> {
        let map = Mapping::open(path, Access::Create(0o644), std::mem::size_of::<LimitsFile>())?;
        validate(&map, true)?;
        Ok(LimitsWriter { map })
    }

    /// Opens an existing, initialised limits file for writing.
    pub fn open(path: &Path) -> Result<LimitsWriter, RegionError> {
        let map = Mapping::open(path, Access::ReadWrite, std::mem::size_of::<LimitsFile>())?;
        validate(&map, false)?;
        Ok(LimitsWriter { map })
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// A consistent snapshot (waits up to ~2 s for a live writer).
    pub fn read(&self) -> Result<LimitsSnapshot, RegionError> {
        let deadline = Instant::now() + BUSY_WAIT;
        loop {
            match try_read(limits_file(&self.map)) {
                Ok(s) => return Ok(s),
                Err(ReadError::Busy { writer_pid, .. }) => {
                    if Instant::now() >= deadline {
                        return Err(RegionError::LimitsBusy {
                            path: self.path().to_path_buf(),
                            writer_pid,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    /// Takes the write side of the seqlock; returns the odd `seq` now held.
    ///
    /// `writer_pid` is the writers' lock: claimed by CAS (free, or held by a dead process) *before* `seq` goes
    /// odd and released after it is even again. So a live writer is never taken over, however long it stalls,
    /// and a writer that died at any point is: its pid is recorded before it could change anything.
    fn acquire(&self) -> Result<u64, RegionError> {
        let h = &limits_file(&self.map).header;
        let me = current_pid();
        let deadline = Instant::now() + BUSY_WAIT;
        loop {
            let w = h.writer_pid.load(Ordering::Acquire);
            let free = w == 0 || !is_alive(w, None);
            if free
                && h.writer_pid
                    .compare_exchange(w, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let s = h.seq.load(Ordering::Acquire);
                if s & 1 == 1 {
                    return Ok(s); // a dead writer's unfinished write: ours to finish
                }
                h.seq.store(s + 1, Ordering::Release);
                return Ok(s + 1);
            }
            if Instant::now() >= deadline {
                return Err(RegionError::LimitsBusy {
                    path: self.path().to_path_buf(),
                    writer_pid: w,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Edits the table under the seqlock: `edit` gets the current contents (a writer that died mid-write may
    /// have left some fields half-updated; they are the fields it was changing) and whatever it leaves is
    /// published atomically for readers. Returns the new snapshot, or `edit`'s error (then nothing changes).
    pub fn update<E>(
        &self,
        edit: impl FnOnce(&mut LimitsTable) -> Result<(), E>,
    ) -> Result<Result<LimitsSnapshot, E>, RegionError> {
        let file = limits_file(&self.map);
        let odd = self.acquire()?;
        let mut guard = WriteGuard {
            file,
            odd_seq: odd,
            armed: true,
        };
        fence(Ordering::Release);
        let h = &file.header;
        // Current contents: we hold the write side, so plain relaxed loads are consistent except for what a
        // dead predecessor half-wrote.
        let mut table = load_table(file);
        if let Err(e) = edit(&mut table) {
            return Ok(Err(e)); // guard releases with the contents untouched
        }
        store_table(file, &table);
        let generation = h.generation.load(Ordering::Relaxed) + 1;
        h.generation.store(generation, Ordering::Relaxed);
        guard.armed = false;
        h.seq.store(odd + 1, Ordering::Release);
        h.writer_pid.store(0, Ordering::Release);
        Ok(Ok(LimitsSnapshot {
            seq: odd + 1,
            generation,
            table,
        }))
    }

    /// Publishes the container's member host pids (the agent, every pass): replaces the whole list in one
    /// seqlock write, sorted and deduplicated, and sets [`LIMITS_FLAG_MEMBERS`]. More than
    /// [`LIMITS_MAX_MEMBERS`] distinct pids is [`RegionError::TooManyMembers`], a pid 0
    /// [`RegionError::InvalidMember`]; nothing changes then. A call that would change nothing writes nothing,
    /// so running processes do not re-read the file every pass.
    pub fn set_members(&self, host_pids: &[u32]) -> Result<(), RegionError> {
        let mut want = LimitsTable::default();
        want.set_members(host_pids).map_err(|e| self.members_error(e))?;
        if self.read()?.members() == want.members() {
            return Ok(());
        }
        self.update(|t| t.set_members(host_pids))?
            .map(|_| ())
            .map_err(|e| self.members_error(e))
    }

    /// Withdraws the agent's membership: empties the list and clears [`LIMITS_FLAG_MEMBERS`] (the shim falls
    /// back to the usage file's cooperative list). No write when it is already clear.
    pub fn clear_members(&self) -> Result<(), RegionError> {
        if self.read()?.members().is_none() {
            return Ok(());
        }
        self.update(|t| -> Result<(), std::convert::Infallible> {
            t.clear_members();
            Ok(())
        })?
        .map(|_| ())
        .map_err(|e| match e {})
    }

    fn members_error(&self, e: MembersError) -> RegionError {
        let path = self.path().to_path_buf();
        match e {
            MembersError::TooMany { count } => RegionError::TooManyMembers {
                path,
                count,
                max: LIMITS_MAX_MEMBERS,
            },
            MembersError::ZeroPid => RegionError::InvalidMember { path, pid: 0 },
        }
    }

    /// Test hook: takes the write side, scribbles into the first entry's `memory_limit`, and calls `stop`
    /// (which is expected never to return, e.g. it kills the process) — a writer dying mid-write.
    #[doc(hidden)]
    pub fn begin_write_and_stop(&self, stop: impl FnOnce()) -> Result<(), RegionError> {
        let file = limits_file(&self.map);
        let _odd = self.acquire()?;
        fence(Ordering::Release);
        file.devices[0]
            .limits
            .memory_limit
            .store(0xdead_beef, Ordering::Relaxed);
        stop();
        Ok(())
    }
}

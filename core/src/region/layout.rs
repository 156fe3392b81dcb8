//! The byte layout of both region files: `repr(C)` structs of atomics only, mirrored field for field by
//! `include/cuquota.h` (checked by `tests/header.rs`).
//!
//! Every field is an atomic because another process may write it at any moment; Rust code only ever holds
//! shared references to these structs (atomics are `UnsafeCell`s, so that is sound for memory others mutate).
//! Padding is explicit (`_reserved*`) so the C and Rust layouts cannot drift through compiler choices.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::policy::PolicyRaw;

/// `magic` of the limits file: the bytes `CUQLIMIT` read as a little-endian u64.
pub const LIMITS_MAGIC: u64 = u64::from_le_bytes(*b"CUQLIMIT");
/// `magic` of the usage file: the bytes `CUQUSAGE` read as a little-endian u64.
pub const USAGE_MAGIC: u64 = u64::from_le_bytes(*b"CUQUSAGE");
/// Layout version of both files. Any change of size or meaning bumps it. 2: a device's limits are one
/// [`PolicyWords`] (with priority and reserved memory) in limits entries and usage device entries alike.
/// 3: the limits file carries the container's members as the agent sees them ([`LimitsMembers`]) and the
/// container's usage file ([`LimitsUsage`]). 4: the usage file's table of memory shared between processes
/// ([`UsageShared`], `shared_high_water`). Within 4, the usage binding's last 24 path bytes became the bound
/// file's identity ([`LimitsUsage::ino`]): zero in every older file, which is what "no identity" means.
pub const ABI_VERSION: u32 = 4;
/// Device entries per file.
pub const MAX_DEVICES: usize = 16;
/// Process slots in the usage file.
pub const MAX_PROCS: usize = 1024;
/// Device entries a slot can hold credit for ([`UsageSlot::credit`]): the first five.
pub const CREDIT_DEVICES: usize = 5;
/// Most bytes a credit word holds; a word above it was not written by its owner (tampered): it is not credit.
pub const CREDIT_MAX: u64 = 32 << 20;
/// Entries of the usage file's shared-memory table ([`UsageShared`]).
pub const MAX_SHARED: usize = 256;
/// [`UsageShared::key`] while its claimer fills the entry in (0 = free; any other value = the key).
pub const SHARED_CLAIMING: u64 = u64::MAX;
/// Member host pids the limits file can hold ([`LimitsMembers`]).
pub const LIMITS_MAX_MEMBERS: usize = 1024;
/// Bytes of the usage-file path the limits file can hold ([`LimitsUsage`]). 504 before the file's identity took
/// the last 24 (those bytes were zero in every older file: "no identity recorded").
pub const LIMITS_USAGE_PATH_MAX: usize = 480;
/// Words of throttle state per usage device entry (owned by the shim's throttle).
pub const THROTTLE_WORDS: usize = 8;

/// Limits entry `flags` bit: the entry is in use.
pub const LIMITS_ENTRY_VALID: u32 = 1;
/// Limits entry `cuda_index` value (with an all-zero uuid) that applies to every device without a more
/// specific entry.
pub const LIMITS_INDEX_ALL: u32 = u32::MAX;
/// Limits header `flags` bit: processes may not opt out (`CUDA_DISABLE_CONTROL` / `CUQUOTA_DISABLE` are ignored).
/// Wins over [`LIMITS_FLAG_OPT_OUT_ALLOWED`].
pub const LIMITS_FLAG_NO_OPT_OUT: u32 = 1;
/// Limits header `flags` bit: processes may opt out. Clear (the default of a new file) = they may not: opting
/// out of the agent's limits needs the agent's permission.
pub const LIMITS_FLAG_OPT_OUT_ALLOWED: u32 = 4;
/// Limits header `flags` bit: the agent publishes the container's members ([`LimitsMembers`]); clear = no
/// agent membership (the shim falls back to the cooperative usage-file list).
pub const LIMITS_FLAG_MEMBERS: u32 = 2;
/// Limits header `flags` bit: the agent reclaims device memory for waiting allocations (issue 39): an
/// allocation the driver refuses for want of memory waits (bounded) only while it is set. Clear (every older
/// file) = no wait.
pub const LIMITS_FLAG_RECLAIM: u32 = 8;

// The words of a policy are defined with its one packing, [`PolicyRaw`].
pub use crate::policy::{
    POLICY_BURST, POLICY_DEFAULT, POLICY_DISABLED, POLICY_HARD, PRIORITY_HIGH, PRIORITY_LOW, PRIORITY_NONE,
};

/// Usage slot `flags` bit: the owner holds the slot's liveness lock, an open-file-description lock on byte
/// [`slot_lock_offset`] of the usage file; the kernel drops it when the owner dies, whatever pid namespace it
/// or the observer lives in, so an unlocked byte means the owner is gone.
pub const SLOT_FLAG_LOCKED: u32 = 1;
/// [`UsageSlot::flags`]: the owner knows [`UsageSlot::credit`] (takes credit back before refusing at the cap,
/// zeroes the words when it claims or frees a slot). Credit is charged only while every live slot says so;
/// the credit words of a slot without it are not read.
pub const SLOT_FLAG_CREDIT: u32 = 2;

/// The byte of the usage file whose lock says slot `slot` is owned by a live process: past the end of the
/// file (a lock needs no data there), one byte per slot.
pub const fn slot_lock_offset(slot: usize) -> u64 {
    std::mem::size_of::<UsageFile>() as u64 + slot as u64
}

/// Owner-word state: free.
pub const STATE_FREE: u32 = 0;
/// Owner-word state: being claimed by the pid in the word.
pub const STATE_CLAIMING: u32 = 1;
/// Owner-word state: live (slot) / ready (device entry).
pub const STATE_LIVE: u32 = 2;
/// Owner-word state: being reclaimed by the pid in the word (slots only).
pub const STATE_RECLAIMING: u32 = 3;

/// Packs an owner word: bits 0–31 pid, 32–39 state, 40–63 a generation bumped on every transition (so that a
/// compare-and-swap on the whole word cannot suffer ABA).
pub const fn owner_word(pid: u32, state: u32, generation: u32) -> u64 {
    (pid as u64) | (((state & 0xff) as u64) << 32) | (((generation & 0xff_ffff) as u64) << 40)
}
/// Pid of an owner word.
pub const fn owner_pid(word: u64) -> u32 {
    word as u32
}
/// State of an owner word.
pub const fn owner_state(word: u64) -> u32 {
    ((word >> 32) & 0xff) as u32
}
/// Generation of an owner word.
pub const fn owner_generation(word: u64) -> u32 {
    (word >> 40) as u32
}

/// Header of the limits file (64 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct LimitsHeader {
    /// [`LIMITS_MAGIC`]; written last (release) by the initialiser.
    pub magic: AtomicU64,
    /// [`ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// `size_of::<LimitsHeader>()`.
    pub header_size: AtomicU32,
    /// `size_of::<LimitsFile>()`.
    pub total_size: AtomicU64,
    /// [`MAX_DEVICES`].
    pub max_devices: AtomicU32,
    /// Seqlock-protected flags ([`LIMITS_FLAG_NO_OPT_OUT`]).
    pub flags: AtomicU32,
    /// Seqlock: odd while a write is in progress; +2 per committed write.
    pub seq: AtomicU64,
    /// Number of committed writes (seqlock-protected; informational).
    pub generation: AtomicU64,
    /// Pid of the writer holding the seqlock (0 when none), so a writer that died mid-write can be taken over.
    pub writer_pid: AtomicU32,
    /// Zero.
    pub _reserved0: AtomicU32,
    /// Elastic memory (issue 39; a reserved zero word before, so ABI 4 unchanged), seqlock-protected: bit `i`
    /// set = the agent asks the container to move its movable memory above its request to host memory on the
    /// devices limits entry `i` selects, while it is quiescent. 0 = no ask (a library that predates it ignores
    /// it: nothing moves, which the agent sees through NVML).
    pub evict_mask: AtomicU64,
}

/// A device's limits as words (32 bytes): the one packing of a [`crate::Policy`] (see [`crate::PolicyRaw`]), in
/// limits entries (the agent's word) and usage device entries (what a process enforces).
#[repr(C)]
#[derive(Debug)]
pub struct PolicyWords {
    /// Memory cap in bytes, 0 = none.
    pub memory_limit: AtomicU64,
    /// Memory kept free for high-priority tenants, bytes, 0 = none.
    pub reserved_memory: AtomicU64,
    /// SM share in percent, 0 (or ≥ 100) = none.
    pub sm_limit: AtomicU32,
    /// `POLICY_*`.
    pub policy: AtomicU32,
    /// Burst weight, 0 = default.
    pub weight: AtomicU32,
    /// `PRIORITY_*`.
    pub priority: AtomicU32,
}

impl PolicyWords {
    /// Copies the words out (relaxed loads: callers that need consistency use the limits file's seqlock).
    pub fn load(&self) -> PolicyRaw {
        PolicyRaw {
            memory_limit: self.memory_limit.load(Ordering::Relaxed),
            // Not among these words (limits entries keep it beside them).
            memory_request: 0,
            reserved_memory: self.reserved_memory.load(Ordering::Relaxed),
            sm_limit: self.sm_limit.load(Ordering::Relaxed),
            policy: self.policy.load(Ordering::Relaxed),
            weight: self.weight.load(Ordering::Relaxed),
            priority: self.priority.load(Ordering::Relaxed),
        }
    }

    /// Stores the words (relaxed).
    pub fn store(&self, raw: &PolicyRaw) {
        self.memory_limit.store(raw.memory_limit, Ordering::Relaxed);
        self.reserved_memory.store(raw.reserved_memory, Ordering::Relaxed);
        self.sm_limit.store(raw.sm_limit, Ordering::Relaxed);
        self.policy.store(raw.policy, Ordering::Relaxed);
        self.weight.store(raw.weight, Ordering::Relaxed);
        self.priority.store(raw.priority, Ordering::Relaxed);
    }

    /// Zeroed words (no limits), for in-process copies.
    pub fn new() -> PolicyWords {
        PolicyWords {
            memory_limit: AtomicU64::new(0),
            reserved_memory: AtomicU64::new(0),
            sm_limit: AtomicU32::new(0),
            policy: AtomicU32::new(0),
            weight: AtomicU32::new(0),
            priority: AtomicU32::new(0),
        }
    }
}

impl Default for PolicyWords {
    fn default() -> Self {
        Self::new()
    }
}

/// One device's limits in the limits file (64 bytes). All fields seqlock-protected.
#[repr(C)]
#[derive(Debug)]
pub struct LimitsEntry {
    /// Device UUID, its 16 raw bytes in order (word `i` = native-endian load of bytes `8i..8i+8`). All zero =
    /// match by `cuda_index` instead.
    pub uuid: [AtomicU64; 2],
    /// [`LIMITS_ENTRY_VALID`].
    pub flags: AtomicU32,
    /// CUDA ordinal this entry applies to when `uuid` is zero; [`LIMITS_INDEX_ALL`] = every device.
    pub cuda_index: AtomicU32,
    /// The limits.
    pub limits: PolicyWords,
    /// Guaranteed memory in bytes, 0 = none (the limit). Within ABI 4 (this word was reserved, zero):
    /// [`crate::PolicyRaw::memory_request`] of the entry's policy, outside [`PolicyWords`] because usage
    /// device entries have no word for it.
    pub memory_request: AtomicU64,
}

/// The container's processes as the node agent sees them (4104 bytes): host pids (the pids NVML reports),
/// from facts the tenant cannot rewrite (cgroup, pid namespace, process tree). Seqlock-protected like the rest
/// of the file; meaningful only while the header has [`LIMITS_FLAG_MEMBERS`].
#[repr(C)]
#[derive(Debug)]
pub struct LimitsMembers {
    /// Number of valid entries of `pids` (at most [`LIMITS_MAX_MEMBERS`]).
    pub count: AtomicU32,
    /// Zero.
    pub _reserved0: AtomicU32,
    /// Host pids, sorted ascending, no duplicates; entries from `count` on are zero.
    pub pids: [AtomicU32; LIMITS_MAX_MEMBERS],
}

/// The container's usage file as its processes see it (512 bytes), named by the agent: processes under this
/// limits file account in it whatever their environment says, so a private usage file is no private cap; and
/// the identity of the file the agent bound, so a file put in its place (the tenant can write the directory)
/// is refused rather than taken for a fresh, empty region. Seqlock-protected; `len` 0 = not bound (the
/// environment decides).
#[repr(C)]
#[derive(Debug)]
pub struct LimitsUsage {
    /// Bytes of `path` in use (at most [`LIMITS_USAGE_PATH_MAX`]), 0 = not bound.
    pub len: AtomicU32,
    /// Zero.
    pub _reserved0: AtomicU32,
    /// The absolute path's bytes in memory order (a `char[480]` in C), zero after `len`.
    pub path: [AtomicU64; LIMITS_USAGE_PATH_MAX / 8],
    /// The bound file's `st_dev` (`makedev(major, minor)`).
    pub dev: AtomicU64,
    /// The bound file's inode number; 0 = no identity recorded (an agent before identities: bound by path).
    pub ino: AtomicU64,
    /// The bound file's birth time, ns since the epoch (`statx` `stx_btime`); 0 = the file system reports none.
    pub btime_ns: AtomicU64,
}

/// The whole limits file.
#[repr(C)]
#[derive(Debug)]
pub struct LimitsFile {
    /// Header.
    pub header: LimitsHeader,
    /// Entries.
    pub devices: [LimitsEntry; MAX_DEVICES],
    /// The container's member host pids (ABI 3).
    pub members: LimitsMembers,
    /// The container's usage file (ABI 3).
    pub usage: LimitsUsage,
}

/// Header of the usage file (64 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct UsageHeader {
    /// [`USAGE_MAGIC`]; written last (release) by the initialiser.
    pub magic: AtomicU64,
    /// [`ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// `size_of::<UsageHeader>()`.
    pub header_size: AtomicU32,
    /// `size_of::<UsageFile>()`.
    pub total_size: AtomicU64,
    /// [`MAX_DEVICES`].
    pub max_devices: AtomicU32,
    /// [`MAX_PROCS`].
    pub max_procs: AtomicU32,
    /// One past the highest slot index ever claimed; sums stop here.
    pub proc_high_water: AtomicU32,
    /// One past the highest shared-memory entry ever claimed (ABI 4); sums stop here.
    pub shared_high_water: AtomicU32,
    /// Elastic memory (issue 39; reserved zero words before), the container's report to the agent: a tenant can
    /// write them, so the agent acts on them only within what NVML and the limits allow. When the container
    /// last launched or copied on any device, `CLOCK_BOOTTIME` ns (least recently used first when reclaiming).
    pub last_use_ns: AtomicU64,
    /// An allocation within the container's limit waiting because the device is full: `(entry + 1) << 56 |
    /// bytes` (usage device entry, bytes < 2^56); 0 = none waiting.
    pub waiting: AtomicU64,
    /// Zero.
    pub _reserved: [AtomicU64; 1],
}

/// A physical device in the usage file (144 bytes). Claimed once by UUID, never freed.
#[repr(C)]
#[derive(Debug)]
pub struct UsageDevice {
    /// Device UUID (same encoding as [`LimitsEntry::uuid`]); valid once `owner` says live.
    pub uuid: [AtomicU64; 2],
    /// Owner word ([`owner_word`]): free → claiming (claimer pid) → live (ready).
    pub owner: AtomicU64,
    /// The effective limits a process last reported enforcing (informational, shown by `cuquota status`).
    pub limits: PolicyWords,
    /// Throttle state, owned by the shim's throttle.
    pub throttle: [AtomicU64; THROTTLE_WORDS],
    /// Cumulative GPU busy time achieved by the container on this device, ns.
    pub busy_ns: AtomicU64,
    /// Cumulative time launches of the container's processes waited for the SM limit, ns (informational).
    pub throttled_ns: AtomicU64,
    /// Allocations refused at the memory cap on this device, cumulative (informational).
    pub refusals: AtomicU64,
}

/// One process in the usage file (320 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct UsageSlot {
    /// Owner word ([`owner_word`]): free → claiming → live → reclaiming → free.
    pub owner: AtomicU64,
    /// Start time of the owner (`/proc/<pid>/stat` field 22, clock ticks since boot), to detect pid reuse.
    pub start_time: AtomicU64,
    /// The owner's pid as NVML reports it (host pid namespace), 0 if unknown.
    pub host_pid: AtomicU32,
    /// [`SLOT_FLAG_LOCKED`]: the owner holds the slot's liveness lock (ABI 3; zero before).
    pub flags: AtomicU32,
    /// Bytes charged per usage device entry.
    pub mem_used: [AtomicU64; MAX_DEVICES],
    /// GPU time used per usage device entry, ns (owned by the throttle).
    pub gpu_ns: [AtomicU64; MAX_DEVICES],
    /// Bytes of `mem_used` charged ahead of the owner's allocations on device entries 0..[`CREDIT_DEVICES`]
    /// (zero in files of versions that had these words reserved). The owner takes from it and adds to it;
    /// anyone may take it back: swap it to 0, then subtract what it held from `mem_used`.
    pub credit: [AtomicU64; CREDIT_DEVICES],
}

/// Device memory held by several processes of the container (exported with CUDA IPC, as a shareable VMM
/// handle or as a pool allocation) (160 bytes). Its bytes
/// count once toward the container's usage, whoever holds them, until the last holder lets go; a holder is a
/// slot (its bit in `holder_slots`), so a dead holder is dropped when its slot is reclaimed.
#[repr(C)]
#[derive(Debug)]
pub struct UsageShared {
    /// 0 = free, [`SHARED_CLAIMING`] = being filled in, else the identity both processes see (a hash of the
    /// IPC, fabric or pool-export handle's bytes or of the shareable descriptor's file, never 0 or
    /// `SHARED_CLAIMING`); published last.
    pub key: AtomicU64,
    /// Bytes charged.
    pub bytes: AtomicU64,
    /// Usage device entry charged.
    pub device: AtomicU32,
    /// Slots holding it (= bits set in `holder_slots`); the one that takes it to 0 frees the entry.
    pub holders: AtomicU32,
    /// Bit `i` (word `i / 64`, bit `i % 64`): slot `i` holds it.
    pub holder_slots: [AtomicU64; MAX_PROCS / 64],
    /// Zero.
    pub _reserved: [AtomicU64; 1],
}

/// The whole usage file.
#[repr(C)]
#[derive(Debug)]
pub struct UsageFile {
    /// Header.
    pub header: UsageHeader,
    /// Device entries.
    pub devices: [UsageDevice; MAX_DEVICES],
    /// Process slots.
    pub slots: [UsageSlot; MAX_PROCS],
    /// Memory shared between processes (ABI 4).
    pub shared: [UsageShared; MAX_SHARED],
}

/// `magic` of the priority file: the bytes `CUQPRIOR` read as a little-endian u64.
pub const PRIORITY_MAGIC: u64 = u64::from_le_bytes(*b"CUQPRIOR");
/// Layout version of the priority files (their own since 5; before, [`ABI_VERSION`]). 5: one file per
/// container in a node directory, read-only to every other container (docs/priority.md); same words as 4, new
/// meaning: a file's words are its container's only.
pub const PRIORITY_ABI_VERSION: u32 = 5;
/// The layout version of the node-wide priority file before 5 (commit 315d850's `cuquota priority init`): the
/// same words, shared by every container on the node. The shim still reads one where no node directory exists
/// (a pod spec of that time after a rolling upgrade of the library), as that layout meant.
pub const PRIORITY_ABI_VERSION_NODE_FILE: u32 = 4;
/// Reserved-memory admissions in flight per priority device entry ([`PriorityDevice::inflight`]).
pub const PRIORITY_INFLIGHT: usize = 8;

/// Header of the priority file (64 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct PriorityHeader {
    /// [`PRIORITY_MAGIC`]; written last (release) by the initialiser.
    pub magic: AtomicU64,
    /// [`PRIORITY_ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// `size_of::<PriorityHeader>()`.
    pub header_size: AtomicU32,
    /// `size_of::<PriorityFile>()`.
    pub total_size: AtomicU64,
    /// [`MAX_DEVICES`].
    pub max_devices: AtomicU32,
    /// [`PRIORITY_INFLIGHT`].
    pub inflight_slots: AtomicU32,
    /// Zero.
    pub _reserved: [AtomicU64; 4],
}

/// One physical GPU in a container's priority file (192 bytes): written by that container's processes, read by
/// the other containers' (read-only). Claimed once by UUID (like a usage device entry), never freed. Times are CLOCK_MONOTONIC
/// nanoseconds (every process on the node shares that clock).
#[repr(C)]
#[derive(Debug)]
pub struct PriorityDevice {
    /// Device UUID (same encoding as [`LimitsEntry::uuid`]); valid once `owner` says live.
    pub uuid: [AtomicU64; 2],
    /// Owner word ([`owner_word`]): free → claiming (claimer pid) → live (ready).
    pub owner: AtomicU64,
    /// When a high-priority tenant last launched work here (the latest of all of them), 0 = never.
    pub hp_last_launch: AtomicU64,
    /// When the work high-priority tenants have queued here is estimated to be done (the latest of them).
    pub hp_busy_until: AtomicU64,
    /// Launches of high-priority tenants, cumulative (informational). This and the other counters go to the
    /// container's counters file instead when it has one (`COUNTERS_SUFFIX`), out of the node directory.
    pub hp_launches: AtomicU64,
    /// The best-effort queue token: 0 = free, else the time at which the best-effort kernel holding it is
    /// presumed finished even if its holder never says so (a holder that died).
    pub be_token: AtomicU64,
    /// Best-effort launches made while a high-priority tenant was present, cumulative (informational).
    pub be_launches: AtomicU64,
    /// Best-effort launches that had to wait for a high-priority tenant or the token, cumulative.
    pub be_waits: AtomicU64,
    /// Time best-effort launches waited, ns, cumulative.
    pub be_waited_ns: AtomicU64,
    /// Reserved-memory admissions in flight: 0 = free, else MiB in bits 0–31 and the CLOCK_MONOTONIC second
    /// at which the slot expires (its process died between check and allocation) in bits 32–63.
    pub inflight: [AtomicU64; PRIORITY_INFLIGHT],
    /// Allocations refused to keep the reservation, cumulative (informational).
    pub reserve_refusals: AtomicU64,
    /// Zero.
    pub _reserved: [AtomicU64; 5],
}

/// The whole priority file.
#[repr(C)]
#[derive(Debug)]
pub struct PriorityFile {
    /// Header.
    pub header: PriorityHeader,
    /// Device entries.
    pub devices: [PriorityDevice; MAX_DEVICES],
}

/// Packs an in-flight reservation word: `mib` MiB, expiring at CLOCK_MONOTONIC second `expires_s`.
pub const fn inflight_word(mib: u32, expires_s: u32) -> u64 {
    (mib as u64) | ((expires_s as u64) << 32)
}
/// MiB of an in-flight word.
pub const fn inflight_mib(word: u64) -> u32 {
    word as u32
}
/// Expiry second of an in-flight word.
pub const fn inflight_expiry(word: u64) -> u32 {
    (word >> 32) as u32
}

const _: () = {
    assert!(std::mem::size_of::<PriorityHeader>() == 64);
    assert!(std::mem::size_of::<PriorityDevice>() == 192);
    assert!(std::mem::size_of::<PriorityFile>() == 64 + 192 * MAX_DEVICES);
};

const _: () = {
    assert!(std::mem::size_of::<PolicyWords>() == 32);
    assert!(std::mem::size_of::<LimitsHeader>() == 64);
    assert!(std::mem::size_of::<LimitsEntry>() == 64);
    assert!(std::mem::size_of::<LimitsMembers>() == 8 + 4 * LIMITS_MAX_MEMBERS);
    assert!(std::mem::size_of::<LimitsUsage>() == 512);
    assert!(std::mem::size_of::<LimitsUsage>() == 8 + LIMITS_USAGE_PATH_MAX + 24);
    assert!(std::mem::size_of::<LimitsFile>() == 64 + 64 * MAX_DEVICES + 8 + 4 * LIMITS_MAX_MEMBERS + 512);
    assert!(std::mem::size_of::<UsageHeader>() == 64);
    assert!(std::mem::size_of::<UsageDevice>() == 144);
    assert!(std::mem::size_of::<UsageSlot>() == 320);
    assert!(std::mem::size_of::<UsageShared>() == 160);
    assert!(std::mem::size_of::<UsageFile>() == 64 + 144 * MAX_DEVICES + 320 * MAX_PROCS + 160 * MAX_SHARED);
};

/// UUID bytes → the two words stored in the files.
pub fn uuid_to_words(uuid: &[u8; 16]) -> [u64; 2] {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&uuid[..8]);
    b.copy_from_slice(&uuid[8..]);
    [u64::from_ne_bytes(a), u64::from_ne_bytes(b)]
}

/// The two stored words → UUID bytes.
pub fn words_to_uuid(words: [u64; 2]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&words[0].to_ne_bytes());
    out[8..].copy_from_slice(&words[1].to_ne_bytes());
    out
}

/// Formats UUID bytes as NVIDIA does: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parses `GPU-xxxxxxxx-…` (or `MIG-…`, or the bare 32 hex digits with or without dashes) into UUID bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let s = s.trim();
    let body = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("gpu-"))
        .or_else(|| s.strip_prefix("MIG-"))
        .or_else(|| s.strip_prefix("mig-"))
        .unwrap_or(s);
    let hex: String = body.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_word_round_trips() {
        let w = owner_word(4_000_000, STATE_RECLAIMING, 0xab_cdef);
        assert_eq!(owner_pid(w), 4_000_000);
        assert_eq!(owner_state(w), STATE_RECLAIMING);
        assert_eq!(owner_generation(w), 0xab_cdef);
        // generation wraps at 24 bits
        assert_eq!(owner_generation(owner_word(1, 1, 0x100_0001)), 1);
    }

    #[test]
    fn uuid_round_trips() {
        let s = "GPU-0f3a9c1e-1111-2222-3333-444455556666";
        let u = parse_uuid(s).unwrap();
        assert_eq!(format_uuid(&u), s);
        assert_eq!(words_to_uuid(uuid_to_words(&u)), u);
        assert!(parse_uuid("GPU-123").is_none());
        assert!(parse_uuid("GPU-0f3a9c1e-1111-2222-3333-44445555666z").is_none());
    }
}

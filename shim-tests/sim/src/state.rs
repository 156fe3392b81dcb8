//! The shared state file (`CUDASIM_STATE`): what every process using the same simulated GPU sees.
//!
//! Fixed size, `repr(C)`, every field an atomic: processes only ever hold `&Atomic*` into the mapping, never a
//! reference to plain data someone else writes. Nothing here is a lock: creation is a CAS on `init_owner` (a
//! dead initialiser is taken over), process slots are claimed by CAS and reclaimed when their owner is dead
//! (pid + start time from `/proc/<pid>/stat`), and memory admission is exact under races (`fetch_add`, sum
//! all live slots, undo if over). A dead process's memory therefore returns to the pool, as with a real driver.

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::*};

use crate::config::{DeviceConfig, SimConfig, MAX_DEVICES};

/// Bumped whenever the layout below changes; a file with another version is refused. 3: slot liveness locks;
/// 4: IPC memory exports; 8: copy engines.
const LAYOUT_VERSION: u64 = 10;
const MAGIC: u64 = u64::from_le_bytes(*b"CUDASIM\0");
/// Most processes that can use one state file at a time.
pub(crate) const MAX_PROCS: usize = 1024;
/// Kernel intervals remembered per device (for NVML utilisation).
pub(crate) const RING: usize = 16384;
const INIT_READY: u32 = u32::MAX;
/// Most cuIpcGetMemHandle exports alive at a time (per state file).
pub(crate) const MAX_IPC: usize = 256;
/// `IpcExport::word`: the exporter freed its allocation (the low 32 bits count importers' opens).
pub(crate) const IPC_FREED: u64 = 1 << 32;

/// File header: the configuration the creator wrote.
#[repr(C)]
pub(crate) struct Header {
    magic: AtomicU64,
    layout: AtomicU64,
    size: AtomicU64,
    /// 0 = nobody, a pid = that process is writing the configuration, INIT_READY = done.
    init_owner: AtomicU32,
    device_count: AtomicU32,
    driver_version: AtomicU32,
    /// Highest process slot index ever claimed + 1 (scans stop there).
    proc_high_water: AtomicU32,
    ctx_overhead: AtomicU64,
    module_overhead: AtomicU64,
    granularity: AtomicU64,
    wave_ns: AtomicU64,
    copy_mbps: AtomicU64,
    /// Copy engines' bandwidth, MB/s (host-to-device, device-to-host; 0 = none).
    engine_mbps: [AtomicU64; 2],
    /// The time-slicing model's context-switch cost + 1 (0 = the serialised model).
    switch_ns: AtomicU64,
    quantum_ns: AtomicU64,
    /// The unified memory model's per-fault latency + 1 (0 = managed memory fully resident).
    managed_fault_ns: AtomicU64,
}

/// One kernel interval on a device's timeline. `seq` is odd while the writer fills it in.
#[repr(C)]
pub(crate) struct Interval {
    pub seq: AtomicU64,
    pub pid: AtomicU64,
    pub start: AtomicU64,
    pub end: AtomicU64,
}

/// Slices the time-slicing model keeps ahead per device: a process's run with nobody else queued is one entry,
/// so this bounds only interleaved work (about 1 s of two busy processes' queues at a 2 ms quantum).
pub(crate) const MAX_SLICES: usize = 1024;
/// Shifts remembered per device (a process that has not looked for longer misses the oldest).
pub(crate) const SHIFTS: usize = 8192;

/// One time slice: `owner` (slot + 1) has the device during [start, end).
#[repr(C)]
pub(crate) struct Slice {
    pub owner: AtomicU64,
    pub start: AtomicU64,
    pub end: AtomicU64,
}

/// Reserved work after `at` moved `len` ns later to let in a slice of `owner` (slot + 1).
#[repr(C)]
pub(crate) struct Shift {
    pub at: AtomicU64,
    pub len: AtomicU64,
    pub owner: AtomicU64,
}

/// Per-device state.
#[repr(C)]
pub(crate) struct DeviceState {
    pub memory: AtomicU64,
    pub sms: AtomicU64,
    pub uuid: [AtomicU64; 2],
    /// CLOCK_MONOTONIC ns at which the last scheduled kernel ends.
    pub busy_until: AtomicU64,
    /// Total kernel time ever scheduled.
    pub busy_ns: AtomicU64,
    /// When the copy engines' last copy ends (host-to-device, device-to-host).
    pub engine_until: [AtomicU64; 2],
    /// Time-slicing model (`timeline.rs`), all under `slice_lock` (0 free, else when it was taken): slot + 1
    /// of the process whose work ran last before the slices still listed (0 = none),
    pub owner: AtomicU64,
    pub slice_lock: AtomicU64,
    /// the reserved slices from now on, in order (`n_slices` of them),
    pub n_slices: AtomicU64,
    pub slices: [Slice; MAX_SLICES],
    /// and the shifts of reserved work that let another process's slice in: `shift_seq` counts them, entry
    /// `i % SHIFTS` is the i-th (processes move their own times by them: `timeline::catch_up`).
    pub shift_seq: AtomicU64,
    pub shifts: [Shift; SHIFTS],
    /// Next ring index to claim (monotonic; slot = ring_next % RING).
    pub ring_next: AtomicU64,
    pub ring: [Interval; RING],
}

/// Per-process slot.
#[repr(C)]
pub(crate) struct ProcSlot {
    /// 0 free, 1 being claimed, 2 live, 3 being reclaimed.
    pub state: AtomicU32,
    pub pid: AtomicU32,
    /// The pid NVML reports for this process: `pid + CUDASIM_HOST_PID_OFFSET` of the process (its pid in the
    /// host's pid namespace when it runs in a container's).
    pub host_pid: AtomicU32,
    /// `SLOT_LOCKED`: the owner holds the slot's liveness lock (see `slot_lock`).
    pub flags: AtomicU32,
    pub start_time: AtomicU64,
    /// Bytes charged per device (allocations rounded, context and module overhead, pools, arrays).
    pub mem_used: [AtomicU64; MAX_DEVICES],
    /// Kernel ns scheduled per device.
    pub busy_ns: [AtomicU64; MAX_DEVICES],
    /// Contexts per device (NVML lists a process on a device where it has one).
    pub contexts: [AtomicU64; MAX_DEVICES],
    /// Managed memory resident per device (part of `mem_used`, evictable: `evict_managed`).
    pub managed: [AtomicU64; MAX_DEVICES],
    /// Managed bytes other processes evicted whose units the owner has not yet marked non-resident.
    pub owed: [AtomicU64; MAX_DEVICES],
}

/// One allocation exported (cuIpcGetMemHandle, cuMemExportToShareableHandle). Its bytes stay charged to the
/// exporter's slot until the exporter has let go and no importer holds it (importers that die let go), or the
/// exporter dies.
#[repr(C)]
pub(crate) struct IpcExport {
    /// 0 = free entry; else the export's id, published last (Release) once the fields below are written.
    pub id: AtomicU64,
    /// Opens by importers (low 32 bits) | `IPC_FREED`.
    pub word: AtomicU64,
    pub slot: AtomicU32,
    pub phys: AtomicU32,
    pub bytes: AtomicU64,
    /// A VMM export as device descriptors (`CUDASIM_SHAREABLE_FD=device`): the exporter's descriptor numbers of
    /// the exported device file (low 32 bits) and of the memory's memfd (high), each + 1; 0 otherwise.
    pub device_fds: AtomicU64,
    /// Bit `i` (word `i / 64`): slot `i` has it open (an importer's death drops its open).
    pub holders: [AtomicU64; MAX_PROCS / 64],
}

/// The whole file.
#[repr(C)]
pub(crate) struct SharedState {
    pub header: Header,
    pub devices: [DeviceState; MAX_DEVICES],
    pub procs: [ProcSlot; MAX_PROCS],
    pub ipc: [IpcExport; MAX_IPC],
}

const SLOT_FREE: u32 = 0;
const SLOT_CLAIMING: u32 = 1;
const SLOT_LIVE: u32 = 2;
const SLOT_RECLAIMING: u32 = 3;
const SLOT_LOCKED: u32 = 1;

// Liveness of a slot's owner is a lock, as a driver knows its clients by their open device files, not by pids
// (which mean other processes in other pid namespaces): the owner holds an open-file-description write lock on
// one byte of the state file past its end (one per slot) through a descriptor of its own, which the kernel
// drops when the process dies or execs. Others ask with F_OFD_GETLK through the mapping's descriptor, which
// never holds a lock.

/// The mapping's descriptor (kept open for F_OFD_GETLK), -1 before `open`.
static PROBE_FD: AtomicI32 = AtomicI32::new(-1);
/// This process's lock descriptor, -1 = none; closed in a forked child (which must not keep its parent's slot
/// alive).
static LOCK_FD: AtomicI32 = AtomicI32::new(-1);

fn lock_offset(slot: usize) -> i64 {
    (std::mem::size_of::<SharedState>() + slot) as i64
}

fn ofd(fd: i32, cmd: libc::c_int, slot: usize) -> Option<libc::flock> {
    // SAFETY: flock is plain data; fcntl with an OFD lock command and a valid pointer.
    unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = lock_offset(slot);
        fl.l_len = 1;
        (libc::fcntl(fd, cmd, &mut fl) == 0).then_some(fl)
    }
}

/// Takes slot `slot`'s lock on a fresh descriptor: `Some(fd)`, `None` when held by another process or when
/// locks are unavailable (then `held` says which).
fn take_lock(slot: usize) -> Option<i32> {
    let probe = PROBE_FD.load(Acquire);
    if probe < 0 {
        return None;
    }
    let path = CString::new(format!("/proc/self/fd/{probe}")).ok()?;
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    if ofd(fd, libc::F_OFD_SETLK, slot).is_none() {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Whether slot `slot`'s lock is held: `None` when that cannot be asked.
fn lock_held(slot: usize) -> Option<bool> {
    let probe = PROBE_FD.load(Acquire);
    if probe < 0 {
        return None;
    }
    ofd(probe, libc::F_OFD_GETLK, slot).map(|fl| fl.l_type != libc::F_UNLCK as libc::c_short)
}

extern "C" fn forget_lock_in_child() {
    let fd = LOCK_FD.swap(-1, AcqRel);
    if fd >= 0 {
        // SAFETY: the child's copy of the parent's lock descriptor (the parent keeps its own).
        unsafe { libc::close(fd) };
    }
}

/// This process's pid as the mounted /proc sees it (`/proc/self`): its pid in the host's namespace when the
/// process runs in a pid namespace of its own without its own /proc, which is what a driver reports.
pub(crate) fn pid_in_proc_namespace() -> Option<u32> {
    std::fs::read_link("/proc/self").ok()?.to_str()?.parse().ok()
}

/// Where the state file lives.
pub(crate) fn state_path() -> String {
    std::env::var("CUDASIM_STATE").unwrap_or_else(|_| "/tmp/cudasim.state".into())
}

/// Maps (creating if needed) the state file and makes sure its configuration is written: ours if we are
/// first, the creator's otherwise.
pub(crate) fn open(path: &str, cfg: &SimConfig) -> Result<&'static SharedState, String> {
    let size = std::mem::size_of::<SharedState>();
    let cpath = CString::new(path).map_err(|_| format!("cudasim: CUDASIM_STATE={path:?} contains NUL"))?;
    // SAFETY: plain libc calls on a valid C string; the fd is closed after mmap (the mapping keeps the file).
    let map = unsafe {
        let fd = libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        );
        if fd < 0 {
            return Err(format!(
                "cudasim: cannot open CUDASIM_STATE={path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Racing creators all extend to the same size; extending never clobbers what another wrote.
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st);
        if (st.st_size as usize) < size && libc::ftruncate(fd, size as libc::off_t) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(format!("cudasim: cannot size CUDASIM_STATE={path}: {e}"));
        }
        libc::fstat(fd, &mut st);
        if st.st_size as usize != size {
            libc::close(fd);
            return Err(format!(
                "cudasim: CUDASIM_STATE={path} has size {} but this simulator needs {size} (a file from another \
                 build? remove it)",
                st.st_size
            ));
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if p == libc::MAP_FAILED || PROBE_FD.compare_exchange(-1, fd, AcqRel, Acquire).is_err() {
            libc::close(fd); // kept only for the first mapping (the liveness locks' probe)
        } else {
            libc::pthread_atfork(None, None, Some(forget_lock_in_child));
        }
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cudasim: cannot map CUDASIM_STATE={path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        p
    };
    // SAFETY: the mapping is `size` bytes, page aligned, shared and never unmapped; every field of
    // SharedState is an atomic, for which an all-zero (fresh file) or any previously written pattern is valid.
    let s: &'static SharedState = unsafe { &*(map as *const SharedState) };
    s.initialise(cfg, path)?;
    Ok(s)
}

impl SharedState {
    fn initialise(&self, cfg: &SimConfig, path: &str) -> Result<(), String> {
        let h = &self.header;
        let me = std::process::id();
        loop {
            match h.init_owner.load(Acquire) {
                INIT_READY => break,
                0 => {
                    if h.init_owner.compare_exchange(0, me, AcqRel, Acquire).is_ok() {
                        self.write_config(cfg);
                    }
                }
                owner if owner == me => self.write_config(cfg),
                owner => {
                    if !pid_alive(owner, None) {
                        // The creator died half-way: take over (nobody waits on a dead process).
                        let _ = h.init_owner.compare_exchange(owner, me, AcqRel, Acquire);
                    } else {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
            }
        }
        if h.magic.load(Acquire) != MAGIC
            || h.layout.load(Acquire) != LAYOUT_VERSION
            || h.size.load(Acquire) != std::mem::size_of::<SharedState>() as u64
        {
            return Err(format!(
                "cudasim: CUDASIM_STATE={path} was written by another simulator version; remove it"
            ));
        }
        Ok(())
    }

    fn write_config(&self, cfg: &SimConfig) {
        let h = &self.header;
        h.device_count.store(cfg.devices.len() as u32, Relaxed);
        h.driver_version.store(cfg.driver_version, Relaxed);
        h.ctx_overhead.store(cfg.ctx_overhead, Relaxed);
        h.module_overhead.store(cfg.module_overhead, Relaxed);
        h.granularity.store(cfg.granularity, Relaxed);
        h.wave_ns.store(cfg.wave_ns, Relaxed);
        h.copy_mbps.store(cfg.copy_mbps, Relaxed);
        for (a, &v) in h.engine_mbps.iter().zip(&cfg.engine_mbps) {
            a.store(v, Relaxed);
        }
        h.switch_ns.store(cfg.switch_ns.map_or(0, |s| s + 1), Relaxed);
        h.quantum_ns.store(cfg.quantum_ns, Relaxed);
        h.managed_fault_ns
            .store(cfg.managed_fault_ns.map_or(0, |s| s + 1), Relaxed);
        for (d, dc) in self.devices.iter().zip(&cfg.devices) {
            d.memory.store(dc.memory, Relaxed);
            d.sms.store(dc.sms as u64, Relaxed);
            d.uuid[0].store(
                u64::from_le_bytes(dc.uuid[..8].try_into().unwrap_or_default()),
                Relaxed,
            );
            d.uuid[1].store(
                u64::from_le_bytes(dc.uuid[8..].try_into().unwrap_or_default()),
                Relaxed,
            );
        }
        h.layout.store(LAYOUT_VERSION, Relaxed);
        h.size.store(std::mem::size_of::<SharedState>() as u64, Relaxed);
        h.magic.store(MAGIC, Release);
        h.init_owner.store(INIT_READY, Release);
    }

    /// The configuration as the creator wrote it.
    pub(crate) fn config(&self) -> SimConfig {
        let h = &self.header;
        let n = (h.device_count.load(Acquire) as usize).min(MAX_DEVICES);
        SimConfig {
            devices: self.devices[..n]
                .iter()
                .map(|d| {
                    let mut uuid = [0u8; 16];
                    uuid[..8].copy_from_slice(&d.uuid[0].load(Relaxed).to_le_bytes());
                    uuid[8..].copy_from_slice(&d.uuid[1].load(Relaxed).to_le_bytes());
                    DeviceConfig {
                        memory: d.memory.load(Relaxed),
                        sms: d.sms.load(Relaxed) as u32,
                        uuid,
                    }
                })
                .collect(),
            ctx_overhead: h.ctx_overhead.load(Relaxed),
            module_overhead: h.module_overhead.load(Relaxed),
            granularity: h.granularity.load(Relaxed),
            wave_ns: h.wave_ns.load(Relaxed),
            copy_mbps: h.copy_mbps.load(Relaxed).max(1),
            engine_mbps: [h.engine_mbps[0].load(Relaxed), h.engine_mbps[1].load(Relaxed)],
            driver_version: h.driver_version.load(Relaxed),
            switch_ns: self.switch_ns(),
            quantum_ns: h.quantum_ns.load(Relaxed),
            managed_fault_ns: h.managed_fault_ns.load(Relaxed).checked_sub(1),
        }
    }

    /// The time-slicing model's quantum and switch cost, given its switch cost.
    pub(crate) fn slicing(&self, switch: u64) -> crate::timeline::Slicing {
        crate::timeline::Slicing {
            quantum: self.header.quantum_ns.load(Relaxed),
            switch,
        }
    }

    /// The time-slicing model's switch cost; `None` = the serialised model.
    pub(crate) fn switch_ns(&self) -> Option<u64> {
        self.header.switch_ns.load(Relaxed).checked_sub(1)
    }

    fn high_water(&self) -> usize {
        (self.header.proc_high_water.load(Acquire) as usize).min(MAX_PROCS)
    }

    /// Claims a free slot for process `pid` (started at `start_time`, known to NVML as `host_pid`). Reclaims
    /// dead slots when all are taken.
    pub(crate) fn claim_slot(&self, pid: u32, host_pid: u32, start_time: u64) -> Option<usize> {
        for pass in 0..2 {
            for (i, slot) in self.procs.iter().enumerate() {
                if slot.state.load(Acquire) != SLOT_FREE {
                    continue;
                }
                // The lock first (a held lock means a live claimer or owner); without lock support, none.
                let lock = if pid == std::process::id() {
                    take_lock(i)
                } else {
                    None
                };
                if lock.is_none() && lock_held(i) == Some(true) {
                    continue;
                }
                let release = |fd: Option<i32>| {
                    if let Some(fd) = fd {
                        // SAFETY: our own fresh descriptor.
                        unsafe { libc::close(fd) };
                    }
                };
                if slot
                    .state
                    .compare_exchange(SLOT_FREE, SLOT_CLAIMING, AcqRel, Acquire)
                    .is_err()
                {
                    release(lock);
                    continue;
                }
                {
                    slot.flags
                        .store(if lock.is_some() { SLOT_LOCKED } else { 0 }, Relaxed);
                    if let Some(fd) = lock {
                        let old = LOCK_FD.swap(fd, AcqRel);
                        release((old >= 0).then_some(old));
                    }
                    for d in 0..MAX_DEVICES {
                        slot.mem_used[d].store(0, Relaxed);
                        slot.busy_ns[d].store(0, Relaxed);
                        slot.contexts[d].store(0, Relaxed);
                        slot.managed[d].store(0, Relaxed);
                        slot.owed[d].store(0, Relaxed);
                    }
                    slot.pid.store(pid, Relaxed);
                    slot.host_pid.store(host_pid, Relaxed);
                    slot.start_time.store(start_time, Relaxed);
                    slot.state.store(SLOT_LIVE, Release);
                    self.header.proc_high_water.fetch_max(i as u32 + 1, AcqRel);
                    return Some(i);
                }
            }
            if pass == 0 {
                self.reclaim_dead();
            }
        }
        None
    }

    /// Frees the slots of processes that are gone, releasing their memory.
    pub(crate) fn reclaim_dead(&self) {
        for (i, slot) in self.procs[..self.high_water()].iter().enumerate() {
            if slot.state.load(Acquire) != SLOT_LIVE {
                continue;
            }
            match lock_held(i) {
                Some(true) => continue,
                Some(false) if slot.flags.load(Relaxed) & SLOT_LOCKED != 0 => {}
                _ => {
                    let pid = slot.pid.load(Relaxed);
                    if slot_owner_alive(pid, slot.start_time.load(Relaxed)) {
                        continue;
                    }
                }
            }
            if slot
                .state
                .compare_exchange(SLOT_LIVE, SLOT_RECLAIMING, AcqRel, Acquire)
                .is_ok()
            {
                for d in 0..MAX_DEVICES {
                    slot.mem_used[d].store(0, Relaxed);
                    slot.contexts[d].store(0, Relaxed);
                    slot.managed[d].store(0, Relaxed);
                    slot.owed[d].store(0, Relaxed);
                }
                // A dead process's queued kernels go with its contexts, as the driver tears them down: its
                // intervals end now (found at the first reclaim after its death).
                let host = slot.host_pid.load(Relaxed);
                let now = crate::timeline::now_ns();
                let n = (self.header.device_count.load(Acquire) as usize).min(MAX_DEVICES);
                for dev in &self.devices[..n] {
                    crate::timeline::cut(dev, host, now);
                }
                // Its opens of others' exports go (the last one returns their memory)...
                for (j, e) in self.ipc.iter().enumerate() {
                    if e.holders[i / 64].load(SeqCst) & (1 << (i % 64)) != 0 {
                        self.ipc_drop(j, e.id.load(Acquire), Some(i));
                    }
                }
                // ...and its exports go with its memory: an importer's later close must not uncharge the slot's
                // next owner.
                for e in self.ipc.iter().filter(|e| e.slot.load(Relaxed) == i as u32) {
                    e.id.store(0, Release);
                }
                slot.flags.store(0, Relaxed);
                slot.state.store(SLOT_FREE, Release);
            }
        }
    }

    /// Bytes used on device `dev` by all live processes (no liveness check: call `reclaim_dead` first when
    /// the answer matters).
    pub(crate) fn used(&self, dev: usize) -> u64 {
        self.procs[..self.high_water()]
            .iter()
            .filter(|s| s.state.load(Acquire) == SLOT_LIVE)
            .map(|s| s.mem_used[dev].load(SeqCst))
            .sum()
    }

    /// Charges `bytes` on `dev` to `slot`, exactly: fails (changing nothing) when the device would be over
    /// capacity, after one round of reclaiming dead processes.
    pub(crate) fn charge(&self, slot: usize, dev: usize, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let total = self.devices[dev].memory.load(Relaxed);
        let mine = &self.procs[slot].mem_used[dev];
        mine.fetch_add(bytes, SeqCst);
        for attempt in 0..2 {
            if self.used(dev) <= total {
                return true;
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        mine.fetch_sub(bytes, SeqCst);
        false
    }

    /// Evicts at least `need` bytes of resident managed memory on `dev` (whole 2 MiB units, processes in slot
    /// order): each victim's charge drops at once and its `owed` grows; the victim marks its least recently
    /// used units non-resident at its next managed-memory operation (`managed::sync`). Whether any was evicted.
    pub(crate) fn evict_managed(&self, dev: usize, need: u64) -> bool {
        let unit = crate::managed::UNIT;
        let mut left = need.div_ceil(unit) * unit;
        let mut any = false;
        for slot in &self.procs[..self.high_water()] {
            if left == 0 {
                break;
            }
            if slot.state.load(Acquire) != SLOT_LIVE {
                continue;
            }
            let mut took = 0;
            let _ = slot.managed[dev].fetch_update(SeqCst, SeqCst, |m| {
                took = m.min(left);
                Some(m - took)
            });
            if took > 0 {
                slot.owed[dev].fetch_add(took, SeqCst);
                let _ = slot.mem_used[dev].fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(took)));
                left -= took;
                any = true;
            }
        }
        any
    }

    /// Returns `bytes` on `dev` (never below zero).
    pub(crate) fn uncharge(&self, slot: usize, dev: usize, bytes: u64) {
        let _ =
            self.procs[slot].mem_used[dev].fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
    }

    /// Records an export of `bytes` on `phys` charged to `slot`; its entry index, or None when the table is full.
    pub(crate) fn ipc_export(&self, id: u64, slot: usize, phys: usize, bytes: u64) -> Option<usize> {
        const CLAIMING: u64 = u64::MAX;
        let i = self
            .ipc
            .iter()
            .position(|e| e.id.compare_exchange(0, CLAIMING, AcqRel, Relaxed).is_ok())?;
        let e = &self.ipc[i];
        e.word.store(0, Relaxed);
        e.slot.store(slot as u32, Relaxed);
        e.phys.store(phys as u32, Relaxed);
        e.bytes.store(bytes, Relaxed);
        e.device_fds.store(0, Relaxed);
        for w in &e.holders {
            w.store(0, SeqCst);
        }
        e.id.store(id, Release);
        Some(i)
    }

    /// An importer (process slot `slot`, once per process) opens export `id` at entry `i`: false when it is
    /// gone or its exporter let go already.
    pub(crate) fn ipc_open(&self, i: usize, id: u64, slot: usize) -> bool {
        let Some(e) = self.ipc.get(i).filter(|e| e.id.load(Acquire) == id) else {
            return false;
        };
        let ok = e
            .word
            .fetch_update(AcqRel, Acquire, |w| (w & IPC_FREED == 0).then_some(w + 1))
            .is_ok()
            && e.id.load(Acquire) == id;
        if ok {
            e.holders[slot / 64].fetch_or(1 << (slot % 64), SeqCst);
        }
        ok
    }

    /// The exporter lets go (`importer == None`) or importer slot `importer` closes export `id` at entry `i`:
    /// the last one returns the bytes to the exporter's slot and frees the entry.
    pub(crate) fn ipc_drop(&self, i: usize, id: u64, importer: Option<usize>) {
        let Some(e) = self.ipc.get(i).filter(|e| e.id.load(Acquire) == id) else {
            return;
        };
        if let Some(s) = importer {
            if e.holders[s / 64].fetch_and(!(1 << (s % 64)), SeqCst) & (1 << (s % 64)) == 0 {
                return; // dropped already (its process was reclaimed)
            }
        }
        let close = importer.is_some();
        let old = if close {
            e.word.fetch_sub(1, AcqRel)
        } else {
            e.word.fetch_or(IPC_FREED, AcqRel)
        };
        let last = if close { old == IPC_FREED | 1 } else { old == 0 };
        if last && e.id.compare_exchange(id, 0, AcqRel, Acquire).is_ok() {
            let (slot, phys) = (e.slot.load(Relaxed) as usize, e.phys.load(Relaxed) as usize);
            self.uncharge(slot, phys, e.bytes.load(Relaxed));
        }
    }

    /// Live slots as (pid in the owner's namespace, slot); NVML reports `slot.host_pid`.
    pub(crate) fn live_slots(&self) -> impl Iterator<Item = (u32, &ProcSlot)> {
        self.procs[..self.high_water()]
            .iter()
            .filter(|s| s.state.load(Acquire) == SLOT_LIVE)
            .map(|s| (s.pid.load(Relaxed), s))
    }
}

/// Liveness of a slot's owner, cheap enough to run on every cuMemGetInfo / NVML query with many processes:
/// `kill(pid, 0)` and /proc both not finding the pid answers exactly for exited-and-reaped processes (the
/// common case; both, because a process in a child pid namespace with the host's /proc finds other slots'
/// host pids only in /proc); the full check through /proc (zombie, pid reused by another process) runs at
/// most every 20 ms per owner. The cache is only tried, never waited for: in a child forked while another
/// thread of its parent held it, it stays locked for ever (an NVML query there hung).
fn slot_owner_alive(pid: u32, start_time: u64) -> bool {
    use std::collections::HashMap;
    static VERIFIED: parking_lot::Mutex<Option<HashMap<(u32, u64), u64>>> = parking_lot::Mutex::new(None);
    // SAFETY: signal 0 only checks for existence.
    let gone = pid == 0 || unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 && errno() == libc::ESRCH;
    if gone && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    let now = crate::timeline::now_ns();
    let Some(mut cache) = VERIFIED.try_lock() else {
        return pid_alive(pid, Some(start_time));
    };
    let cache = cache.get_or_insert_with(HashMap::new);
    if cache
        .get(&(pid, start_time))
        .is_some_and(|&t| now.saturating_sub(t) < 20_000_000)
    {
        return true;
    }
    let alive = pid_alive(pid, Some(start_time));
    if alive {
        if cache.len() > 4 * MAX_PROCS {
            cache.clear();
        }
        cache.insert((pid, start_time), now);
    } else {
        cache.remove(&(pid, start_time));
    }
    alive
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Start time of `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot) and whether it is a zombie.
pub(crate) fn proc_start_time(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesised and may contain spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); field 22 is index 19.
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    Some((fields.get(19)?.parse().ok()?, zombie))
}

/// Whether `pid` is alive (and, when given, still the process that started at `start_time`).
pub(crate) fn pid_alive(pid: u32, start_time: Option<u64>) -> bool {
    if pid == 0 {
        return false;
    }
    match proc_start_time(pid) {
        Some((st, zombie)) => !zombie && start_time.is_none_or(|t| t == st),
        None => {
            // /proc unreadable (hidepid, other namespace): fall back to kill(pid, 0).
            // SAFETY: signal 0 only checks for existence.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_state(name: &str) -> String {
        let p = std::env::temp_dir().join(format!("cudasim-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn creator_config_wins_and_charges_are_exact() {
        let path = temp_state("state");
        let mut cfg = crate::config::from_env(|_| None).unwrap();
        cfg.devices[0].memory = 10 << 20;
        let s = open(&path, &cfg).unwrap();
        let mut other = cfg.clone();
        other.devices[0].memory = 99 << 20;
        let s2 = open(&path, &other).unwrap();
        assert_eq!(s2.config(), cfg);
        let me = std::process::id();
        let slot = s
            .claim_slot(me, me + 100_000, proc_start_time(me).unwrap().0)
            .unwrap();
        assert_eq!(s.procs[slot].host_pid.load(Relaxed), me + 100_000);
        assert!(s.charge(slot, 0, 6 << 20));
        assert!(!s.charge(slot, 0, 6 << 20));
        assert_eq!(s.used(0), 6 << 20);
        s.uncharge(slot, 0, 6 << 20);
        assert_eq!(s.used(0), 0);
        // A slot of a dead process is reclaimed when memory runs short.
        let dead = s.claim_slot(0x7fff_fff0, 0x7fff_fff0, 1).unwrap();
        assert!(s.charge(dead, 0, 8 << 20));
        assert!(s.charge(slot, 0, 8 << 20));
        assert_eq!(s.used(0), 8 << 20);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn own_process_is_alive() {
        let me = std::process::id();
        let (st, zombie) = proc_start_time(me).unwrap();
        assert!(!zombie);
        assert!(pid_alive(me, Some(st)));
        assert!(!pid_alive(me, Some(st + 1)));
    }
}

//! HAMi-core's shared region (`shared_region_t`, layout version 1.2), written so that HAMi's vGPU monitor shows
//! a cuquota container's true figures and can drive HAMi's priority feature (docs/hami.md).
//!
//! The layout is HAMi-core's `src/multiprocess/multiprocess_memory_limit.h`; the monitor maps the file with
//! `pkg/monitor/nvidia/v1/spec.go` (major version 1, size at least `sizeof(shared_region_t)`). Every field is an
//! atomic here: the monitor (and any process of the container) writes into it. Nothing read back from this
//! file is ever used for enforcement, except `recent_kernel` / `utilization_switch` as extra launch gating,
//! which can only make cuquota stricter. HAMi-core's semaphores (`sem`, `sem_postinit`) are never used: a
//! cuquota container has no HAMi-core process.

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::map::{Access, Mapping};
use super::RegionError;

/// `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`.
pub const HAMI_MAGIC: i32 = 19_920_718;
/// `MAJOR_VERSION`, `MINOR_VERSION` of HAMi-core's region.
pub const HAMI_MAJOR: u32 = 1;
/// See [`HAMI_MAJOR`].
pub const HAMI_MINOR: u32 = 2;
/// `CUDA_DEVICE_MAX_COUNT`.
pub const HAMI_MAX_DEVICES: usize = 16;
/// `SHARED_REGION_MAX_PROCESS_NUM`.
pub const HAMI_MAX_PROCS: usize = 1024;

/// `device_memory_t`.
#[allow(missing_docs)] // HAMi-core's field names
#[repr(C)]
#[derive(Debug)]
pub struct HamiDeviceMemory {
    pub context_size: AtomicU64,
    pub module_size: AtomicU64,
    pub data_size: AtomicU64,
    pub offset: AtomicU64,
    pub total: AtomicU64,
    pub unused: [AtomicU64; 3],
}

impl HamiDeviceMemory {
    /// Stores `u` (`total` = the sum, as HAMi-core keeps it).
    #[inline]
    pub fn set(&self, u: HamiUsed) {
        self.context_size.store(u.context, Ordering::Relaxed);
        if u.module != 0 {
            // Zero from the claim on: cuquota counts modules in the context figure.
            self.module_size.store(u.module, Ordering::Relaxed);
        }
        self.data_size.store(u.data, Ordering::Relaxed);
        self.total.store(u.context + u.module + u.data, Ordering::Relaxed);
    }
}

/// `device_util_t`.
#[allow(missing_docs)] // HAMi-core's field names
#[repr(C)]
#[derive(Debug)]
pub struct HamiDeviceUtil {
    pub dec_util: AtomicU64,
    pub enc_util: AtomicU64,
    pub sm_util: AtomicU64,
    pub unused: [AtomicU64; 3],
}

/// `shrreg_proc_slot_t`.
#[allow(missing_docs)] // HAMi-core's field names
#[repr(C)]
#[derive(Debug)]
pub struct HamiProcSlot {
    pub pid: AtomicI32,
    pub hostpid: AtomicI32,
    pub used: [HamiDeviceMemory; HAMI_MAX_DEVICES],
    pub monitorused: [AtomicU64; HAMI_MAX_DEVICES],
    pub device_util: [HamiDeviceUtil; HAMI_MAX_DEVICES],
    pub status: AtomicI32,
    pub seqlock: AtomicU64,
    pub unused: [AtomicU64; 2],
}

/// `shared_region_t` (x86-64 / aarch64 Linux: `size_t` 8 bytes, `sem_t` 32 bytes).
#[allow(missing_docs)] // HAMi-core's field names
#[repr(C)]
#[derive(Debug)]
pub struct HamiRegionLayout {
    pub initialized_flag: AtomicI32,
    pub major_version: AtomicU32,
    pub minor_version: AtomicU32,
    pub sm_init_flag: AtomicI32,
    pub owner_pid: AtomicU64,
    pub sem: [AtomicU64; 4],
    pub device_num: AtomicU64,
    /// `char uuids[16][96]`: NVML's UUID string (`GPU-…`), NUL-padded.
    pub uuids: [[AtomicU64; 12]; HAMI_MAX_DEVICES],
    pub limit: [AtomicU64; HAMI_MAX_DEVICES],
    pub sm_limit: [AtomicU64; HAMI_MAX_DEVICES],
    pub procs: [HamiProcSlot; HAMI_MAX_PROCS],
    pub proc_num: AtomicI32,
    pub utilization_switch: AtomicI32,
    pub recent_kernel: AtomicI32,
    pub priority: AtomicI32,
    pub last_kernel_time: AtomicU64,
    pub sem_postinit: [AtomicU64; 4],
}

// The offsets HAMi-core's header gives on 64-bit Linux (and HAMi's Go reader, TestSharedRegionTLayoutMatchesCABI).
const _: () = {
    assert!(size_of::<HamiDeviceMemory>() == 64);
    assert!(size_of::<HamiDeviceUtil>() == 48);
    assert!(offset_of!(HamiProcSlot, used) == 8);
    assert!(offset_of!(HamiProcSlot, monitorused) == 1032);
    assert!(offset_of!(HamiProcSlot, device_util) == 1160);
    assert!(offset_of!(HamiProcSlot, status) == 1928);
    assert!(offset_of!(HamiProcSlot, seqlock) == 1936);
    assert!(size_of::<HamiProcSlot>() == 1960);
    assert!(offset_of!(HamiRegionLayout, owner_pid) == 16);
    assert!(offset_of!(HamiRegionLayout, sem) == 24);
    assert!(offset_of!(HamiRegionLayout, device_num) == 56);
    assert!(offset_of!(HamiRegionLayout, uuids) == 64);
    assert!(offset_of!(HamiRegionLayout, limit) == 1600);
    assert!(offset_of!(HamiRegionLayout, sm_limit) == 1728);
    assert!(offset_of!(HamiRegionLayout, procs) == 1856);
    assert!(offset_of!(HamiRegionLayout, proc_num) == 2_008_896);
    assert!(offset_of!(HamiRegionLayout, utilization_switch) == 2_008_900);
    assert!(offset_of!(HamiRegionLayout, recent_kernel) == 2_008_904);
    assert!(offset_of!(HamiRegionLayout, priority) == 2_008_908);
    assert!(offset_of!(HamiRegionLayout, last_kernel_time) == 2_008_912);
    assert!(size_of::<HamiRegionLayout>() == HAMI_SIZE);
};

/// `sizeof(shared_region_t)`: the file's size, and the monitor's `v1.MinSize()`.
pub const HAMI_SIZE: usize = 2_008_952;

/// A process's figures on one device, as HAMi-core keeps them.
#[allow(missing_docs)] // HAMi-core's field names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HamiUsed {
    pub context: u64,
    pub module: u64,
    pub data: u64,
}

/// The mapped HAMi region (output only).
#[derive(Debug)]
pub struct HamiRegion {
    map: Mapping,
}

impl HamiRegion {
    /// Opens `path`, creating it (mode 0666) at HAMi's size if missing or empty, and initialises the header
    /// as HAMi-core does when its magic is missing (`utilization_switch` 1, `recent_kernel` 2, `priority`).
    /// A file of another size is refused (never resized: it may be a HAMi-core process's of another version).
    /// Guarded against truncation: a truncated file turns into private zero pages (fault.rs), never a crash.
    pub fn open(path: &Path, priority: i32) -> Result<HamiRegion, RegionError> {
        let mut map = Mapping::open(path, Access::Create(0o666), HAMI_SIZE)?;
        map.guard_truncation();
        let r = HamiRegion { map };
        let f = r.file();
        if f.initialized_flag.load(Ordering::Acquire) != HAMI_MAGIC {
            // Racing initialisers write the same values; the magic goes last.
            f.major_version.store(HAMI_MAJOR, Ordering::Relaxed);
            f.minor_version.store(HAMI_MINOR, Ordering::Relaxed);
            f.utilization_switch.store(1, Ordering::Relaxed);
            f.recent_kernel.store(2, Ordering::Relaxed);
            f.priority.store(priority, Ordering::Relaxed);
            f.initialized_flag.store(HAMI_MAGIC, Ordering::Release);
        }
        Ok(r)
    }

    /// The mapped words (every one an atomic).
    #[inline]
    pub fn file(&self) -> &HamiRegionLayout {
        // SAFETY: the mapping is exactly HAMI_SIZE bytes (checked at open), page-aligned, and the layout is
        // atomics only, so a shared reference is valid whatever other processes write; it cannot outlive `self`.
        unsafe { &*self.map.ptr().cast::<HamiRegionLayout>() }
    }

    /// The file was truncated under the mapping (now private zero pages): nothing written reaches the monitor.
    pub fn is_broken(&self) -> bool {
        self.map.is_broken()
    }

    /// Publishes CUDA device `index`: its UUID (as NVML prints it), memory limit (bytes, 0 = none) and SM
    /// limit (percent, 0 = none); `device_num` grows to cover it.
    pub fn set_device(&self, index: usize, uuid: &[u8; 16], memory: u64, sm: u64) {
        if index >= HAMI_MAX_DEVICES {
            return;
        }
        let f = self.file();
        let text = uuid_text(uuid);
        for (w, chunk) in f.uuids[index].iter().zip(text.chunks(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        f.limit[index].store(memory, Ordering::Relaxed);
        f.sm_limit[index].store(sm, Ordering::Relaxed);
        f.device_num.fetch_max(index as u64 + 1, Ordering::Relaxed);
    }

    /// Claims a process slot for `pid` (status 1, figures zero): a free one, or one whose process is dead.
    /// `None` when all 1024 are held by live processes.
    pub fn claim_slot(&self, pid: i32) -> Option<usize> {
        let f = self.file();
        for (i, s) in f.procs.iter().enumerate() {
            let cur = s.pid.load(Ordering::Relaxed);
            // Our own pid: a slot left by the image this process `exec`ed from (no exit handler ran).
            let free = cur == 0 || cur == pid || (cur > 0 && gone(cur));
            if free
                && s.pid
                    .compare_exchange(cur, pid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                clear_figures(s);
                s.hostpid.store(0, Ordering::Relaxed);
                s.status.store(1, Ordering::Release);
                f.proc_num.fetch_max(i as i32 + 1, Ordering::AcqRel);
                return Some(i);
            }
        }
        None
    }

    /// Gives slot `i` back (process exit): figures zero, status 0, pid 0.
    pub fn release_slot(&self, i: usize, pid: i32) {
        let Some(s) = self.file().procs.get(i) else {
            return;
        };
        if s.pid.load(Ordering::Relaxed) != pid {
            return;
        }
        s.status.store(0, Ordering::Relaxed);
        clear_figures(s);
        s.hostpid.store(0, Ordering::Relaxed);
        let _ = s
            .pid
            .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Gives back the slots of processes that are gone without releasing them (killed, `_exit`), so the
    /// monitor stops counting them: one `kill(pid, 0)` per slot in use. A slot being reclaimed holds pid -1.
    pub fn reap_dead(&self) {
        let f = self.file();
        let n = f.proc_num.load(Ordering::Acquire).clamp(0, HAMI_MAX_PROCS as i32) as usize;
        for s in &f.procs[..n] {
            let cur = s.pid.load(Ordering::Relaxed);
            if cur > 0
                && gone(cur)
                && s.pid
                    .compare_exchange(cur, -1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                s.status.store(0, Ordering::Relaxed);
                clear_figures(s);
                s.hostpid.store(0, Ordering::Relaxed);
                s.pid.store(0, Ordering::Release);
            }
        }
    }

    /// Records the host pid of slot `i`'s process.
    pub fn set_host_pid(&self, i: usize, host_pid: i32) {
        if let Some(s) = self.file().procs.get(i) {
            s.hostpid.store(host_pid, Ordering::Relaxed);
        }
    }

    /// Publishes slot `i`'s memory on device `dev` (`total` = the sum, as HAMi-core keeps it).
    #[inline]
    pub fn set_used(&self, i: usize, dev: usize, u: HamiUsed) {
        if let Some(m) = self.used_words(i, dev) {
            m.set(u);
        }
    }

    /// Slot `i`'s memory words on device `dev` (inside the mapping, which lives as long as `self`).
    #[inline]
    pub fn used_words(&self, i: usize, dev: usize) -> Option<&HamiDeviceMemory> {
        self.file().procs.get(i).and_then(|s| s.used.get(dev))
    }

    /// Publishes slot `i`'s SM utilisation (percent) on device `dev`.
    pub fn set_sm_util(&self, i: usize, dev: usize, percent: u64) {
        if let Some(u) = self.file().procs.get(i).and_then(|s| s.device_util.get(dev)) {
            u.sm_util.store(percent, Ordering::Relaxed);
        }
    }

    /// `last_kernel_time` = max(itself, `now_s`) (Unix seconds), as HAMi-core's `pre_launch_kernel`.
    pub fn note_kernel_time(&self, now_s: u64) {
        self.file().last_kernel_time.fetch_max(now_s, Ordering::Relaxed);
    }
}

/// The slot's process no longer exists (`kill(pid, 0)` → `ESRCH`): one syscall, no `/proc` read, since a
/// start of 300 processes scans the live slots before theirs. A zombie keeps its slot until it is reaped.
fn gone(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn clear_figures(s: &HamiProcSlot) {
    for m in &s.used {
        for w in [&m.context_size, &m.module_size, &m.data_size, &m.offset, &m.total] {
            w.store(0, Ordering::Relaxed);
        }
    }
    for u in &s.device_util {
        u.sm_util.store(0, Ordering::Relaxed);
    }
}

/// NVML's form of a UUID, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NUL-padded to HAMi's 96 bytes.
pub fn uuid_text(uuid: &[u8; 16]) -> [u8; 96] {
    let mut s = String::from("GPU-");
    for (i, b) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    let mut out = [0u8; 96];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("cuquota-hami-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn uuid_text_is_nvmls_form() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
        ];
        let t = uuid_text(&u);
        assert_eq!(&t[..40], b"GPU-12345678-9abc-def0-0123-456789abcdef");
        assert!(t[40..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_fresh_file_is_initialised_as_hami_core_does_and_slots_are_reclaimed() {
        let p = temp("init");
        let r = HamiRegion::open(&p, 0).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), HAMI_SIZE as u64);
        let f = r.file();
        assert_eq!(f.initialized_flag.load(Ordering::Relaxed), HAMI_MAGIC);
        assert_eq!(f.major_version.load(Ordering::Relaxed), 1);
        assert_eq!(f.recent_kernel.load(Ordering::Relaxed), 2);
        assert_eq!(f.utilization_switch.load(Ordering::Relaxed), 1);
        // A dead process's slot is taken over; a live one's is not.
        let dead = i32::MAX - 7;
        f.procs[0].pid.store(dead, Ordering::Relaxed);
        f.procs[0].used[0].total.store(5, Ordering::Relaxed);
        f.procs[1].pid.store(1, Ordering::Relaxed);
        let me = std::process::id() as i32;
        assert_eq!(r.claim_slot(me), Some(0));
        assert_eq!(f.procs[0].used[0].total.load(Ordering::Relaxed), 0);
        assert_eq!(r.claim_slot(me + 1), Some(2));
        assert_eq!(f.proc_num.load(Ordering::Relaxed), 3);
        r.release_slot(0, me);
        assert_eq!(f.procs[0].pid.load(Ordering::Relaxed), 0);
        assert_eq!(f.procs[0].status.load(Ordering::Relaxed), 0);
        // A process gone without releasing its slot is reaped; a live one's slot stays.
        f.procs[3].pid.store(dead, Ordering::Relaxed);
        f.procs[3].status.store(1, Ordering::Relaxed);
        f.procs[3].used[0].total.store(5, Ordering::Relaxed);
        f.proc_num.store(4, Ordering::Relaxed);
        r.reap_dead();
        assert_eq!(f.procs[3].pid.load(Ordering::Relaxed), 0);
        assert_eq!(f.procs[3].status.load(Ordering::Relaxed), 0);
        assert_eq!(f.procs[3].used[0].total.load(Ordering::Relaxed), 0);
        assert_eq!(f.procs[1].pid.load(Ordering::Relaxed), 1, "pid 1 lives");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_file_of_another_size_is_refused() {
        let p = temp("size");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        assert!(HamiRegion::open(&p, 1).is_err());
        let _ = std::fs::remove_file(&p);
    }
}

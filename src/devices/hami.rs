//! The HAMi region's owner in the shim: keeps HAMi-core's file (`core::region::hami`) true for HAMi's vGPU
//! monitor, and speaks the monitor's priority protocol at launches (docs/hami.md).
//!
//! Output only: nothing read from the file decides a limit. The one exception is the monitor's launch gate
//! (`recent_kernel < 0` while `utilization_switch` is on), which only ever delays launches. Costs: a slot's
//! figures are stored (relaxed, no syscall) where the memory module changes its own; a launch on the hooked
//! path reads a coarse clock (vDSO) and, when an SM limit applies, one or two shared words.

use crate::log::{log, Level};
use cuquota_core::region::hami::{HamiDeviceMemory, HamiRegion, HamiUsed, HAMI_MAX_DEVICES};
use cuquota_core::{Config, DeviceId, Policy, PolicyKind, Priority};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::OnceLock;

const NO_SLOT: usize = usize::MAX;
const CLAIMING: usize = usize::MAX - 1;
/// HAMi-core sleeps 1 s per check while blocked; a shorter poll resumes sooner after the monitor's write.
const BLOCKED_POLL: std::time::Duration = std::time::Duration::from_millis(50);
/// The longest one launch waits for the monitor's block: its signal is renewed every 5 s while it holds, and a
/// word anyone who can write the file may set must not stall a process for ever.
const BLOCKED_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// How the launch gate reads the monitor's `utilization_switch` (HAMi-core's `GPU_CORE_UTILIZATION_POLICY`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Switch {
    /// `FORCE` (cuquota: policy hard): always on.
    On,
    /// `DISABLE`: never on.
    Off,
    /// Unset / `DEFAULT`: what the monitor wrote.
    File,
}

pub(crate) struct Hami {
    region: HamiRegion,
    /// Our slot index, `NO_SLOT` until claimed (again after a fork).
    slot: AtomicUsize,
    /// The pid that claimed `slot`.
    pid: AtomicI32,
    /// Usage-region entry index → CUDA ordinal + 1 (0: not a device of this process).
    ordinal_of: [AtomicU8; HAMI_MAX_DEVICES],
    /// The usage entries themselves, by index (for utilisation samples).
    ids: [OnceLock<DeviceId>; HAMI_MAX_DEVICES],
    /// Usage entry index → our slot's memory words for its device in the mapping (null: not looked up yet, or
    /// the slot changed): a publish is then its stores.
    words: [AtomicPtr<HamiDeviceMemory>; HAMI_MAX_DEVICES],
    /// Bit `i`: CUDA ordinal `i` has 0 < SM limit < 100. Non-zero: launches set `recent_kernel` and obey the
    /// monitor's block (HAMi-core checks the current device; here any device of the process).
    gate: AtomicU32,
    switch: Switch,
    /// The monitor's block is obeyed: the file is HAMi's, named by `CUDA_DEVICE_MEMORY_SHARED_CACHE` (HAMi's
    /// device plugin puts it in the pod's own directory). At HAMi-core's default path in `/tmp`, which other
    /// tenants may share, it is written but its words are not obeyed.
    obey: bool,
    /// Unix second of the last `last_kernel_time` update (at most one per second, HAMi-core's default).
    last_s: AtomicU64,
    /// GPU time per device entry at the last utilisation sample, and when it was taken.
    last_gpu_ns: [AtomicU64; HAMI_MAX_DEVICES],
    said_blocked: AtomicBool,
    /// Unix second before which a claim is not tried again: a file whose every slot is taken (anyone who can
    /// write it can fill it) must not make each allocation scan 1024 slots with a `kill(2)` each.
    claim_after_s: AtomicU64,
}

impl Hami {
    /// Opens the configured HAMi file; `None` (said at info level) when it cannot be (output only: a missing
    /// monitor file never stops CUDA).
    pub(crate) fn open(cfg: &Config) -> Option<Hami> {
        // Unit tests build default configurations: they leave the node's /tmp alone.
        #[cfg(test)]
        if cfg.hami_path == std::path::Path::new(cuquota_core::config::HAMI_DEFAULT_PATH) {
            return None;
        }
        let priority = match cfg.default_limits.priority {
            Some(Priority::High) => 0,
            _ => 1,
        };
        let region = match HamiRegion::open(&cfg.hami_path, priority) {
            Ok(r) => r,
            Err(e) => {
                log!(
                    Level::Info,
                    "HAMi's monitor file not written (HAMi's per-pod metrics and priority stay off): {e}"
                );
                return None;
            }
        };
        let switch = match cfg.default_limits.kind {
            PolicyKind::Hard => Switch::On,
            PolicyKind::Disabled => Switch::Off,
            _ => Switch::File,
        };
        let h = Hami {
            region,
            slot: AtomicUsize::new(NO_SLOT),
            pid: AtomicI32::new(0),
            ordinal_of: std::array::from_fn(|_| AtomicU8::new(0)),
            ids: std::array::from_fn(|_| OnceLock::new()),
            words: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            gate: AtomicU32::new(0),
            switch,
            obey: cfg.hami_path != std::path::Path::new(cuquota_core::config::HAMI_DEFAULT_PATH),
            last_s: AtomicU64::new(0),
            last_gpu_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            said_blocked: AtomicBool::new(false),
            claim_after_s: AtomicU64::new(0),
        };
        h.slot();
        Some(h)
    }

    /// Our slot, claimed on first need (and again in a forked child, after [`Hami::forget_in_child`]). The
    /// claimed case is one relaxed load: no `getpid` here.
    #[inline]
    fn slot(&self) -> Option<usize> {
        match self.slot.load(Ordering::Acquire) {
            NO_SLOT | CLAIMING => self.claim(),
            s => Some(s),
        }
    }

    /// One claimer per process at a time (`CLAIMING`): a slot left under our pid is then the image's this
    /// process `exec`ed from, never another thread's, and is taken over.
    #[cold]
    fn claim(&self) -> Option<usize> {
        if coarse_unix_s() < self.claim_after_s.load(Ordering::Relaxed) {
            return None;
        }
        loop {
            match self
                .slot
                .compare_exchange(NO_SLOT, CLAIMING, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break,
                // Another thread is claiming: microseconds.
                Err(CLAIMING) => std::thread::yield_now(),
                Err(s) => return Some(s),
            }
        }
        let pid = cuquota_core::region::liveness::current_pid() as i32;
        let got = self.region.claim_slot(pid);
        match got {
            Some(_) => self.pid.store(pid, Ordering::Relaxed),
            None => self.claim_after_s.store(coarse_unix_s() + 1, Ordering::Relaxed),
        }
        self.slot.store(got.unwrap_or(NO_SLOT), Ordering::Release);
        got
    }

    /// In a forked child (single-threaded): the parent's slot stays the parent's; the child claims its own.
    pub(crate) fn forget_in_child(&self) {
        self.slot.store(NO_SLOT, Ordering::SeqCst);
        self.forget_words();
        self.claim_after_s.store(0, Ordering::Relaxed);
        for g in &self.last_gpu_ns {
            g.store(0, Ordering::Relaxed);
        }
    }

    /// A device this process uses: CUDA `ordinal`, usage entry `id`, its effective limits.
    pub(crate) fn device(&self, ordinal: usize, id: DeviceId, uuid: &[u8; 16], p: &Policy) {
        if ordinal >= HAMI_MAX_DEVICES || id.index() >= HAMI_MAX_DEVICES {
            return;
        }
        let _ = self.ids[id.index()].set(id);
        self.ordinal_of[id.index()].store(ordinal as u8 + 1, Ordering::Relaxed);
        self.words[id.index()].store(std::ptr::null_mut(), Ordering::SeqCst);
        let sm = if p.throttles() { p.sm.unwrap_or(0) } else { 0 };
        self.region
            .set_device(ordinal, uuid, p.memory.unwrap_or(0), u64::from(sm));
        if (1..100).contains(&sm) {
            self.gate.fetch_or(1 << ordinal, Ordering::Relaxed);
        } else {
            self.gate.fetch_and(!(1 << ordinal), Ordering::Relaxed);
        }
    }

    /// This process's memory on usage entry `id` changed: allocations `data`, context/module overhead `context`.
    #[inline]
    pub(crate) fn publish(&self, id: DeviceId, data: u64, context: u64) {
        let used = HamiUsed {
            context,
            module: 0,
            data,
        };
        let Some(w) = self.words.get(id.index()) else {
            return;
        };
        let p = w.load(Ordering::Acquire);
        if p.is_null() {
            return self.publish_slow(id, used);
        }
        // SAFETY: `p` was taken from the mapping, which stays mapped as long as `self.region`.
        unsafe { &*p }.set(used);
    }

    /// [`Hami::publish`] before the words' address is known: looked up (slot claimed on first need) and kept,
    /// unless the slot changed meanwhile (a release or a fork clears what was kept after changing it).
    #[cold]
    #[inline(never)]
    fn publish_slow(&self, id: DeviceId, used: HamiUsed) {
        let o = self.ordinal_of[id.index()].load(Ordering::Relaxed);
        if o == 0 {
            return;
        }
        let Some(s) = self.slot() else {
            return;
        };
        let Some(m) = self.region.used_words(s, usize::from(o - 1)) else {
            return;
        };
        m.set(used);
        let w = &self.words[id.index()];
        w.store(std::ptr::from_ref(m).cast_mut(), Ordering::SeqCst);
        if self.slot.load(Ordering::SeqCst) != s {
            w.store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }

    /// Forgets every kept words' address (the slot or a device's ordinal changed).
    fn forget_words(&self) {
        for w in &self.words {
            w.store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }

    /// The process's host pid (as NVML reports it).
    pub(crate) fn set_host_pid(&self, host_pid: u32) {
        if let Some(s) = self.slot() {
            self.region.set_host_pid(s, host_pid as i32);
        }
    }

    /// Before a launch on the hooked path (HAMi-core's `pre_launch_kernel` and `rate_limiter`): the kernel
    /// time at most once a second, with a utilisation sample from `gpu_ns` (this process's GPU time per usage
    /// entry); then, when an SM limit applies and the switch is on, waits while the monitor blocks us and
    /// marks a recent kernel (2).
    #[inline(always)]
    pub(crate) fn pre_launch(&self, gpu_ns: impl Fn(DeviceId) -> Option<u64>) {
        let now = coarse_unix_s();
        let last = self.last_s.load(Ordering::Relaxed);
        if now != last {
            self.new_second(now, last, &gpu_ns);
        }
        if self.gate.load(Ordering::Relaxed) != 0 {
            self.gate_launch();
        }
    }

    /// [`Hami::pre_launch`] in a second that had no launch yet (out of line: at most once a second).
    #[inline(never)]
    fn new_second(&self, now: u64, last: u64, gpu_ns: &dyn Fn(DeviceId) -> Option<u64>) {
        if self
            .last_s
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.region.note_kernel_time(now);
            self.sample(now.saturating_sub(last), gpu_ns);
            self.reap();
        }
    }

    #[cold]
    fn sample(&self, secs: u64, gpu_ns: &dyn Fn(DeviceId) -> Option<u64>) {
        let Some(s) = self.slot() else {
            return;
        };
        for (i, o) in self.ordinal_of.iter().enumerate() {
            let o = o.load(Ordering::Relaxed);
            if o == 0 {
                continue;
            }
            let Some(now) = self.ids[i].get().and_then(|&id| gpu_ns(id)) else {
                continue;
            };
            let before = self.last_gpu_ns[i].swap(now, Ordering::Relaxed);
            // The first sample after a long quiet spell covers it all: a low but true average.
            let pct = if secs == 0 || before == 0 || secs > 3600 {
                0
            } else {
                (now.saturating_sub(before) / 10_000_000 / secs).min(100)
            };
            self.region.set_sm_util(s, usize::from(o - 1), pct);
        }
    }

    fn gate_launch(&self) {
        let f = self.region.file();
        let on = || match self.switch {
            Switch::On => true,
            Switch::Off => false,
            Switch::File => f.utilization_switch.load(Ordering::Relaxed) != 0,
        };
        if !on() {
            return;
        }
        // Blocked while the monitor says so and the switch stays on (a switch turned off means no contention),
        // for at most BLOCKED_MAX per launch.
        if self.obey && f.recent_kernel.load(Ordering::Relaxed) < 0 {
            if !self.said_blocked.swap(true, Ordering::Relaxed) {
                log!(
                    Level::Info,
                    "HAMi's monitor blocks this container's launches (a higher-priority task is running)"
                );
            }
            let until = std::time::Instant::now() + BLOCKED_MAX;
            while f.recent_kernel.load(Ordering::Relaxed) < 0 && on() && std::time::Instant::now() < until {
                std::thread::sleep(BLOCKED_POLL);
            }
            if !on() {
                return;
            }
        }
        if f.recent_kernel.load(Ordering::Relaxed) != 2 {
            f.recent_kernel.store(2, Ordering::Relaxed);
        }
    }

    /// Slots of processes gone without releasing theirs (killed, `_exit`) go back (slow paths only).
    pub(crate) fn reap(&self) {
        self.region.reap_dead();
    }

    /// At exit: the slot goes back (the monitor stops counting this process).
    pub(crate) fn release(&self) {
        let s = self.slot.swap(NO_SLOT, Ordering::SeqCst);
        self.forget_words();
        if s != NO_SLOT && s != CLAIMING {
            self.region.release_slot(s, self.pid.load(Ordering::Relaxed));
        }
    }
}

/// Unix time in seconds, as HAMi-core's `pre_launch_kernel` takes it (`time(2)`: vDSO, one load of the kernel's
/// seconds word, no syscall).
#[inline]
fn coarse_unix_s() -> u64 {
    // SAFETY: a null pointer asks only for the return value.
    unsafe { libc::time(std::ptr::null_mut()) as u64 }
}

//! The NVML sampler: one thread per process, started at the first probed launch (never at load, so a process
//! without an SM limit never has it), that closes each SM-limited device's shared-device window every
//! `SAMPLER_NS` (`Engine::sample_tick`) once the process was charged there: one NVML per-process utilisation
//! read per device per tick.
//! Without it the window closed only from the launch path, so a long kernel hidden behind a short probe, then a
//! second without CUDA calls, had left NVML's second of samples before anyone read it (docs/threat-model.md).
//!
//! It never blocks a launch: it takes no lock a launch takes; the window is claimed by a CAS that whoever loses
//! (launch or sampler) walks away from. Its own lock, held across a tick (NVML calls included), is taken first
//! by `fork`'s prepare handler, so a child never inherits NVML or a region word half-way through a tick; in the
//! child the thread is gone and the next probed launch starts a new one. At exit an `atexit` handler, registered
//! at its start (so it runs before the destructors of every library loaded earlier, the driver's included),
//! waits for the tick in progress and stops it. It runs with every signal blocked: a process-directed signal is
//! never delivered on it.

use super::engine::SAMPLER_NS;
use crate::locks::Lock;
use crate::log::{log, Level};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The process's sampler thread state.
#[derive(Debug, Default)]
pub(crate) struct Sampler {
    /// A thread runs (or is being started) in this process.
    started: AtomicBool,
    /// The process exits: no tick any more.
    stopped: AtomicBool,
    /// Held across one tick.
    tick: Lock<()>,
    /// A start failed (logged once).
    failed: AtomicBool,
}

/// The `atexit` handler is registered once per process image (a forked child inherits it).
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// What the thread and the exit handler do, given by the layer that owns the process (`state`), which the
/// throttle does not reach up to: `tick` runs one tick (`Sampler::tick`) and says whether to go on; `stop`
/// calls `Sampler::stop`. None installed: the thread does not start (fails closed, as a failed spawn).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hooks {
    pub tick: fn() -> bool,
    pub stop: fn(),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Installs the thread's and the exit handler's work (once per process).
pub(crate) fn install(h: Hooks) {
    let _ = HOOKS.set(h);
}

impl Sampler {
    /// Starts the thread unless one runs: one load when it does (called on a probed launch, not every launch).
    /// False when it could not start; the next probe tries again.
    #[inline]
    pub(crate) fn ensure(&self) -> bool {
        self.started.load(Ordering::Relaxed) || self.start()
    }

    #[cold]
    fn start(&self) -> bool {
        if self.started.swap(true, Ordering::AcqRel) || self.stopped.load(Ordering::Relaxed) {
            return true;
        }
        let Some(hooks) = HOOKS.get().copied() else {
            self.started.store(false, Ordering::Release);
            return false;
        };
        if !AT_EXIT.swap(true, Ordering::AcqRel) {
            // SAFETY: registering a plain extern "C" handler that never unwinds.
            if unsafe { libc::atexit(stop_at_exit) } != 0 {
                log!(
                    Level::Warn,
                    "atexit failed: the NVML sampler is stopped only by our exit handler"
                );
            }
        }
        // SAFETY: plain sigset calls on local sets; the caller's mask is put back right after the spawn, and the
        // new thread inherits the blocked one.
        let old = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            old
        };
        let r = std::thread::Builder::new()
            .name("cuquota-nvml".into())
            .stack_size(128 * 1024)
            .spawn(move || run(hooks.tick));
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        match r {
            Ok(_) => true,
            Err(e) => {
                // Fails closed (`Engine::set_sampled`); retried at the next probe.
                self.started.store(false, Ordering::Release);
                if !self.failed.swap(true, Ordering::Relaxed) {
                    log!(
                        Level::Warn,
                        "NVML sampler thread not started ({e}): SM time NVML can no longer show is charged as busy"
                    );
                }
                false
            }
        }
    }

    /// The lock `fork`'s prepare handler takes first.
    pub(crate) fn lock(&self) -> &Lock<()> {
        &self.tick
    }

    /// In a forked child: no thread runs here; the next probed launch starts one.
    pub(crate) fn forget_in_child(&self) {
        self.started.store(false, Ordering::Relaxed);
    }

    /// The process exits: waits for a tick in progress, then none runs again.
    pub(crate) fn stop(&self) {
        let _g = self.tick.lock();
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// One tick: `sample` (the NVML reads) under the tick lock, unless the process exits. False: the thread
    /// ends (exiting, or no device has an SM limit: a later probed launch starts it again).
    pub(crate) fn tick(&self, sample: impl FnOnce() -> bool) -> bool {
        let _g = self.tick.lock();
        if self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        if !sample() {
            self.started.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }
}

extern "C" fn stop_at_exit() {
    if let Some(h) = HOOKS.get() {
        (h.stop)();
    }
}

/// The thread: a tick every `SAMPLER_NS` until one says stop.
fn run(tick: fn() -> bool) {
    loop {
        std::thread::sleep(Duration::from_nanos(SAMPLER_NS));
        if !tick() {
            return;
        }
    }
}

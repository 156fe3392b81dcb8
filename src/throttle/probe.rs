//! Measuring launches on the device with CUDA events: what the throttle's [`Gpu`](super::engine::Gpu) uses on
//! the launch path.
//!
//! One probe slot per usage device (the engine keeps at most one probe outstanding per device per process), each
//! with a start and an end event created once in the context of the stream they are recorded on and reused; a
//! slot whose context changes re-creates its events there. So the hot path creates nothing, and a probe costs two
//! `cuEventRecord`s plus, later, one `cuEventQuery` and one `cuEventElapsedTime`.
//!
//! Function pointers come in as an [`EventApi`] (filled from the driver table), so this file has no view of how
//! the real library was loaded.
//!
//! A driver that refuses the event calls (creation, recording, query or elapsed time fail `FAILS_TO_DEGRADE`
//! times in a row on a device) makes the device unmeasurable ([`EventProbes::usable`] false): the engine then
//! calibrates from NVML instead (degraded mode), and events are tried again every `RETRY_NS`.

use super::engine::Poll;
use crate::ffi::cuda::{CUcontext, CUevent, CUresult, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::locks::Lock;
use cuquota_core::region::layout::MAX_DEVICES;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Consecutive refusals of the event calls on a device after which it counts as unmeasurable.
pub(crate) const FAILS_TO_DEGRADE: u32 = 3;
/// How often an unmeasurable device tries events again (one probe).
pub(crate) const RETRY_NS: u64 = 1_000_000_000;

type CuResult = CUresult;
const CUDA_SUCCESS: CuResult = CUresult::SUCCESS;
const CUDA_ERROR_NOT_READY: CuResult = CUresult::ERROR_NOT_READY;

/// The driver functions a probe needs.
#[allow(non_snake_case, missing_docs)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventApi {
    pub cuEventCreate: unsafe extern "C" fn(*mut CUevent, c_uint) -> CuResult,
    pub cuEventDestroy: unsafe extern "C" fn(CUevent) -> CuResult,
    pub cuEventRecord: unsafe extern "C" fn(CUevent, CUstream) -> CuResult,
    pub cuEventQuery: unsafe extern "C" fn(CUevent) -> CuResult,
    pub cuEventSynchronize: unsafe extern "C" fn(CUevent) -> CuResult,
    pub cuEventElapsedTime: unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CuResult,
    pub cuStreamGetCtx: unsafe extern "C" fn(CUstream, *mut CUcontext) -> CuResult,
    pub cuCtxGetCurrent: unsafe extern "C" fn(*mut CUcontext) -> CuResult,
    pub cuCtxPushCurrent: unsafe extern "C" fn(CUcontext) -> CuResult,
    pub cuCtxPopCurrent: unsafe extern "C" fn(*mut CUcontext) -> CuResult,
}

#[derive(Debug)]
pub(crate) struct Slot {
    ctx: usize,
    start: usize,
    end: usize,
}

/// Event-based probes, one slot per device.
pub(crate) struct EventProbes {
    api: EventApi,
    slots: [Lock<Option<Slot>>; MAX_DEVICES],
    /// Consecutive refusals of the event calls, per device.
    fails: [AtomicU32; MAX_DEVICES],
    /// While unmeasurable: when to try events again (monotonic ns), per device.
    retry_at: [AtomicU64; MAX_DEVICES],
}

impl std::fmt::Debug for EventProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventProbes").finish_non_exhaustive()
    }
}

impl EventProbes {
    /// Probes over `api`.
    pub(crate) fn new(api: EventApi) -> Self {
        EventProbes {
            api,
            slots: std::array::from_fn(|_| Lock::new(None)),
            fails: std::array::from_fn(|_| AtomicU32::new(0)),
            retry_at: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Can launches on `dev` be measured with events at `now`? False after `FAILS_TO_DEGRADE` refusals in a row;
    /// true again for one try every `RETRY_NS` (the next probe's outcome decides).
    pub(crate) fn usable(&self, dev: usize, now: u64) -> bool {
        let (Some(f), Some(r)) = (self.fails.get(dev), self.retry_at.get(dev)) else {
            return false;
        };
        if f.load(Ordering::Relaxed) < FAILS_TO_DEGRADE {
            return true;
        }
        let at = r.load(Ordering::Relaxed);
        now >= at
            && r.compare_exchange(
                at,
                now.saturating_add(RETRY_NS),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The driver refused an event call on `dev`.
    fn refused(&self, dev: usize) {
        if let Some(f) = self.fails.get(dev) {
            if f.fetch_add(1, Ordering::Relaxed) + 1 == FAILS_TO_DEGRADE {
                if let Some(r) = self.retry_at.get(dev) {
                    r.store(
                        crate::time::monotonic_ns().saturating_add(RETRY_NS),
                        Ordering::Relaxed,
                    );
                }
            }
        }
    }

    /// An event pair on `dev` measured a launch.
    fn worked(&self, dev: usize) {
        if let Some(f) = self.fails.get(dev) {
            if f.load(Ordering::Relaxed) != 0 {
                f.store(0, Ordering::Relaxed);
            }
        }
    }

    fn stream_ctx(&self, stream: usize) -> Option<usize> {
        stream_ctx(&self.api, stream)
    }

    /// Destroy a pair this process just created in a live context.
    fn destroy(&self, s: Option<Slot>) {
        for e in s.iter().flat_map(|s| [s.start, s.end]) {
            // SAFETY: an event we created in a context that is alive (we just used it).
            unsafe { (self.api.cuEventDestroy)(e as *mut c_void) };
        }
    }

    /// Create a start/end pair in `ctx` (made current for the call if it is not).
    fn create_pair(&self, ctx: usize) -> Option<Slot> {
        let mut cur: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { (self.api.cuCtxGetCurrent)(&mut cur) };
        let push = cur as usize != ctx;
        // SAFETY: `ctx` is a live context (the launching stream's).
        if push && unsafe { (self.api.cuCtxPushCurrent)(ctx as *mut c_void) } != CUDA_SUCCESS {
            return None;
        }
        let (mut a, mut b): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; flags 0 = default events (timing enabled).
        let ok = unsafe { (self.api.cuEventCreate)(&mut a, 0) } == CUDA_SUCCESS
            // SAFETY: as above.
            && unsafe { (self.api.cuEventCreate)(&mut b, 0) } == CUDA_SUCCESS;
        if push {
            let mut popped: *mut c_void = std::ptr::null_mut();
            // SAFETY: undoes our push.
            unsafe { (self.api.cuCtxPopCurrent)(&mut popped) };
        }
        if !ok {
            for e in [a, b] {
                if !e.is_null() {
                    // SAFETY: an event we created.
                    unsafe { (self.api.cuEventDestroy)(e) };
                }
            }
            return None;
        }
        Some(Slot {
            ctx,
            start: a as usize,
            end: b as usize,
        })
    }
}

impl EventProbes {
    /// Records the start event of a probe on `stream` (see `engine::Gpu`); 0 = could not.
    pub(crate) fn probe_begin(&self, dev: usize, stream: usize) -> u64 {
        let Some(ctx) = self.stream_ctx(stream) else {
            return 0;
        };
        // try_lock: only the holder of the device's probe claim gets here, so the lock is free — unless this is
        // a forked child and a parent thread held it at the fork. Never wait for it.
        let Some(mut g) = self.slots.get(dev).and_then(|s| s.try_lock()) else {
            return 0;
        };
        let fresh = g.as_ref().is_none_or(|s| s.ctx != ctx);
        if fresh {
            // Old events belong to another (maybe destroyed) context: dropping them leaks at most two events
            // per context switch of a device, never touches a dead context.
            *g = self.create_pair(ctx);
        }
        let record = |s: &Slot| {
            // SAFETY: our event, recorded on the program's stream (same context).
            let r = unsafe { (self.api.cuEventRecord)(s.start as *mut c_void, stream as *mut c_void) };
            r == CUDA_SUCCESS
        };
        match g.as_ref() {
            None => {
                self.refused(dev);
                return 0;
            }
            Some(s) if record(s) => return dev as u64 + 1,
            Some(_) => {}
        }
        if fresh {
            // New events of a live context that cannot be recorded on this stream: give them back.
            self.destroy(g.take());
            self.refused(dev);
            return 0;
        }
        // Reused events that no longer work: their context was destroyed and the stream's context got the same
        // handle. Forget them (never touch a dead context) and start over once with a new pair — otherwise no
        // launch of this device would ever be measured again.
        *g = self.create_pair(ctx);
        match g.as_ref() {
            Some(s) if record(s) => dev as u64 + 1,
            _ => {
                self.destroy(g.take());
                self.refused(dev);
                0
            }
        }
    }

    /// Records the end event of probe `p` on `stream`; false if that failed.
    pub(crate) fn probe_end(&self, p: u64, stream: usize) -> bool {
        let Some(g) = self.slot(p).and_then(|s| s.try_lock()) else {
            return false;
        };
        let Some(s) = g.as_ref() else { return false };
        // SAFETY: our event on the program's stream.
        let ok =
            unsafe { (self.api.cuEventRecord)(s.end as *mut c_void, stream as *mut c_void) == CUDA_SUCCESS };
        if !ok {
            self.refused(p as usize - 1);
        }
        ok
    }

    /// Has probe `p` completed?
    pub(crate) fn probe_poll(&self, p: u64) -> Poll {
        let Some(slot) = self.slot(p) else {
            return Poll::Failed;
        };
        let Some(g) = slot.try_lock() else {
            return Poll::Pending;
        };
        let Some(s) = g.as_ref() else { return Poll::Failed };
        let dev = p as usize - 1;
        // SAFETY: our event.
        match unsafe { (self.api.cuEventQuery)(s.end as *mut c_void) } {
            CUDA_SUCCESS => {}
            CUDA_ERROR_NOT_READY => return Poll::Pending,
            _ => {
                self.refused(dev);
                return Poll::Failed;
            }
        }
        let mut ms = 0f32;
        // SAFETY: both our events, both recorded and complete.
        let r =
            unsafe { (self.api.cuEventElapsedTime)(&mut ms, s.start as *mut c_void, s.end as *mut c_void) };
        if r != CUDA_SUCCESS || !ms.is_finite() || ms < 0.0 {
            self.refused(dev);
            return Poll::Failed;
        }
        self.worked(dev);
        Poll::Done((ms as f64 * 1e6) as u64)
    }

    /// Has probe `p`'s launch started (its start event completed)? None = cannot tell.
    pub(crate) fn probe_started(&self, p: u64) -> Option<bool> {
        let g = self.slot(p)?.try_lock()?;
        let s = g.as_ref()?;
        // SAFETY: our event, in a live context (a slot whose context is destroyed is forgotten first).
        match unsafe { (self.api.cuEventQuery)(s.start as *mut c_void) } {
            CUDA_SUCCESS => Some(true),
            CUDA_ERROR_NOT_READY => Some(false),
            _ => None,
        }
    }

    /// Context `ctx` is about to be destroyed: the devices whose probe events live there, forgotten so that
    /// nothing touches them again (the context frees them). Waits for a slot held by a launch or a poll (held
    /// briefly, never while waiting for another lock): a skipped slot would later touch a dead context.
    pub(crate) fn forget_context(&self, ctx: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.lock().as_ref().is_some_and(|s| s.ctx == ctx) {
                out.push(i);
            }
        }
        out
    }

    /// Drops device `dev`'s events (their context is gone).
    pub(crate) fn forget(&self, dev: usize) {
        if let Some(s) = self.slots.get(dev) {
            *s.lock() = None;
        }
    }

    /// In a forked child: the event slots are the parent's (its contexts); forget them.
    pub(crate) fn forget_all(&self) {
        for s in &self.slots {
            if let Some(mut g) = s.try_lock() {
                *g = None;
            }
        }
    }

    fn slot(&self, p: u64) -> Option<&Lock<Option<Slot>>> {
        self.slots.get((p as usize).checked_sub(1)?)
    }

    /// The slots' locks, per device (for the fork handlers).
    pub(crate) fn locks(&self) -> &[Lock<Option<Slot>>] {
        &self.slots
    }
}

/// The context a stream belongs to (the current one for the default streams).
pub(crate) fn stream_ctx(api: &EventApi, stream: usize) -> Option<usize> {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let r = if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
        // SAFETY: valid out-pointer.
        unsafe { (api.cuCtxGetCurrent)(&mut ctx) }
    } else {
        // SAFETY: the stream handle is the one the program passed to the launch; valid out-pointer.
        unsafe { (api.cuStreamGetCtx)(stream as *mut c_void, &mut ctx) }
    };
    (r == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx as usize)
}

#[cfg(test)]
mod tests {
    //! A fake driver in which context handle 0x1000 is destroyed and re-created (same handle, new
    //! generation); events remember the generation they were created in and fail in any other.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static GEN: AtomicUsize = AtomicUsize::new(1);
    /// The fake driver is process-wide: one test at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    /// While set, the fake driver refuses to create events.
    static REFUSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    static LIVE_EVENTS: AtomicUsize = AtomicUsize::new(0);
    const CTX: usize = 0x1000;

    fn live(e: CUevent) -> bool {
        (e as usize >> 20) == GEN.load(Ordering::SeqCst)
    }
    unsafe extern "C" fn create(e: *mut CUevent, _f: c_uint) -> CuResult {
        if REFUSE.load(Ordering::SeqCst) {
            return CUresult(801);
        }
        let h = (GEN.load(Ordering::SeqCst) << 20) | NEXT.fetch_add(1, Ordering::SeqCst);
        LIVE_EVENTS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: out-pointer from the code under test.
        unsafe { *e = h as CUevent };
        CUDA_SUCCESS
    }
    unsafe extern "C" fn destroy(_e: CUevent) -> CuResult {
        LIVE_EVENTS.fetch_sub(1, Ordering::SeqCst);
        CUDA_SUCCESS
    }
    unsafe extern "C" fn record(e: CUevent, _s: CUstream) -> CuResult {
        if live(e) {
            CUDA_SUCCESS
        } else {
            CUresult(400)
        }
    }
    unsafe extern "C" fn query(e: CUevent) -> CuResult {
        if live(e) {
            CUDA_SUCCESS
        } else {
            CUresult(400)
        }
    }
    unsafe extern "C" fn elapsed(ms: *mut f32, _a: CUevent, _b: CUevent) -> CuResult {
        // SAFETY: out-pointer from the code under test.
        unsafe { *ms = 0.05 };
        CUDA_SUCCESS
    }
    unsafe extern "C" fn stream_ctx(_s: CUstream, c: *mut CUcontext) -> CuResult {
        // SAFETY: out-pointer from the code under test.
        unsafe { *c = CTX as CUcontext };
        CUDA_SUCCESS
    }
    unsafe extern "C" fn ctx_current(c: *mut CUcontext) -> CuResult {
        // SAFETY: out-pointer from the code under test.
        unsafe { *c = CTX as CUcontext };
        CUDA_SUCCESS
    }
    unsafe extern "C" fn push(_c: CUcontext) -> CuResult {
        CUDA_SUCCESS
    }
    unsafe extern "C" fn pop(_c: *mut CUcontext) -> CuResult {
        CUDA_SUCCESS
    }

    fn api() -> EventApi {
        EventApi {
            cuEventCreate: create,
            cuEventDestroy: destroy,
            cuEventRecord: record,
            cuEventQuery: query,
            cuEventSynchronize: query,
            cuEventElapsedTime: elapsed,
            cuStreamGetCtx: stream_ctx,
            cuCtxGetCurrent: ctx_current,
            cuCtxPushCurrent: push,
            cuCtxPopCurrent: pop,
        }
    }

    #[test]
    fn refused_events_make_the_device_unmeasurable_and_are_retried() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let p = EventProbes::new(api());
        let (dev, stream) = (5, 0x5000);
        let now = crate::time::monotonic_ns();
        REFUSE.store(true, Ordering::SeqCst);
        for i in 0..FAILS_TO_DEGRADE {
            assert!(p.usable(dev, now), "unmeasurable after {i} refusals");
            assert_eq!(p.probe_begin(dev, stream), 0);
        }
        assert!(
            !p.usable(dev, now),
            "still measurable after {FAILS_TO_DEGRADE} refusals"
        );
        assert!(p.usable(4, now), "another device is not affected");
        // One try per RETRY_NS.
        let later = now + 2 * RETRY_NS;
        assert!(p.usable(dev, later));
        assert!(!p.usable(dev, later + 1));
        // The driver works again: one measured probe makes the device measurable for good.
        REFUSE.store(false, Ordering::SeqCst);
        let h = p.probe_begin(dev, stream);
        assert_ne!(h, 0);
        assert!(p.probe_end(h, stream));
        assert_eq!(p.probe_poll(h), Poll::Done(50_000));
        assert!(p.usable(dev, later + 2));
    }

    #[test]
    fn events_of_a_destroyed_context_whose_handle_was_reused_are_replaced() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let p = EventProbes::new(api());
        let stream = 0x5000;
        let h = p.probe_begin(3, stream);
        assert_ne!(h, 0);
        assert!(p.probe_end(h, stream));
        assert_eq!(p.probe_poll(h), Poll::Done(50_000));
        // The program destroys its context and creates a new one; the driver hands out the same handle.
        GEN.store(2, Ordering::SeqCst);
        let h = p.probe_begin(3, stream);
        assert_ne!(h, 0, "a probe slot with dead events never measures again");
        assert!(p.probe_end(h, stream));
        assert_eq!(p.probe_poll(h), Poll::Done(50_000));
    }
}

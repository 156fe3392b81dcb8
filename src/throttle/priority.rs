//! Priority between the tenants of one GPU: high-priority (latency-critical) tenants publish their activity in
//! the node's priority file; best-effort (low-priority) tenants yield to it. User reference: docs/priority.md.
//!
//! Why this shape: a GPU does not pre-empt a running kernel (nor does the simulator), so what sits in the
//! device's queue when a high-priority burst arrives delays it whole. The one lever an in-process library has
//! is *when best-effort work is submitted*. So, on each device:
//! - a high-priority launch stores its time and raises the estimated end of the high-priority queue (its
//!   process's estimate: the throttle's per-kernel estimates, measured with events);
//! - while a high-priority tenant is **present** (launched within [`PRESENT_NS`]), a best-effort launch needs
//!   the device's one best-effort **token**: at most one best-effort kernel, of all best-effort tenants, is
//!   queued at a time, so a burst waits for at most one of them (the bound that REEF gets by pre-emption and
//!   Orion by limiting outstanding best-effort work, without either);
//! - and it starts only when the high-priority queue is empty and the high-priority tenant has not launched
//!   for [`QUIET_NS`] (so it does not slip in between the kernels of a burst the host is still issuing);
//! - when no high-priority tenant is present, best-effort tenants launch freely (their own SM limit applies).
//!
//! The token holder gives it back when it sees its kernel complete (an event recorded after the launch), at
//! its next launch; a holder that never comes back (exited, died) loses it when its hold expires.

use super::clock::Clock;
use super::probe::{stream_ctx, EventApi};
use crate::ffi::cuda::{CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING};
use crate::locks::Lock;
use cuquota_core::region::layout::MAX_DEVICES;
use cuquota_core::region::PriorityEntry;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// A high-priority tenant that launched within this is present: best-effort tenants keep at most one kernel
/// queued. Long, because a best-effort queue left deep while it was away is what its next request would wait
/// for (a kernel cannot be taken back); one kernel at a time costs a best-effort tenant with kernels of a
/// millisecond or more a few percent of its throughput.
pub(crate) const PRESENT_NS: u64 = 10_000_000_000;
/// A best-effort kernel does not start within this of a high-priority launch (the host may still be issuing
/// the burst, one kernel at a time).
pub(crate) const QUIET_NS: u64 = 200_000;
/// Longest single sleep of a waiting best-effort launch before it looks again.
pub(crate) const MAX_STEP_NS: u64 = 2_000_000;
/// How often a launch waiting for another process's token looks again.
pub(crate) const TOKEN_POLL_NS: u64 = 200_000;
/// How long a token is held when this process has not yet seen one of its kernels complete.
pub(crate) const FIRST_HOLD_NS: u64 = 1_000_000_000;
/// Bounds of a hold learned from this process's kernels (4 × the last one + 5 ms).
pub(crate) const HOLD_RANGE_NS: (u64, u64) = (10_000_000, 2_000_000_000);

/// What a best-effort launch may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// No high-priority tenant present: launch freely.
    Free,
    /// Launch holding the token `value` (track the kernel's completion, or give the token back if the launch
    /// fails); `waited_ns` spent waiting for it.
    Token {
        /// The token's value (see `PriorityEntry::take_token`).
        value: u64,
        /// Time waited before it was granted.
        waited_ns: u64,
    },
}

/// This process's last best-effort kernel per device: did it complete?
pub(crate) trait Tracker {
    /// Waits until this process's tracked kernel on `dev` (if any) has completed and returns its token.
    fn wait_done(&self, dev: usize) -> Option<u64>;
    /// Its token, if the tracked kernel has completed (never waits).
    fn poll_done(&self, dev: usize) -> Option<u64>;
    /// How long this process's last tracked kernel took from launch to seen complete (0 = none seen yet).
    fn last_ns(&self, dev: usize) -> u64;
}

/// Per-process priority state: the high-priority queue estimate per device (usage device index).
pub(crate) struct Priorities {
    tails: [AtomicU64; MAX_DEVICES],
}

impl Default for Priorities {
    fn default() -> Self {
        Priorities {
            tails: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Priorities {
    /// A high-priority launch on `dev` at `now` estimated to take `est_ns`: publish the launch and the end of
    /// this process's queue (work it queued before plus this launch). Two atomic updates and two stores.
    #[inline]
    pub(crate) fn hp_launch(&self, e: PriorityEntry<'_>, dev: usize, now: u64, est_ns: u64) {
        let mut end = 0;
        let _ = self.tails[dev].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            end = t.max(now).saturating_add(est_ns);
            Some(end)
        });
        e.note_hp_launch(now, end);
    }

    /// The hold a token taken now gets: long until this process has seen one of its kernels complete, then
    /// 4 × the last one + 5 ms (bounded).
    pub(crate) fn hold_ns(last_ns: u64) -> u64 {
        if last_ns == 0 {
            FIRST_HOLD_NS
        } else {
            last_ns
                .saturating_mul(4)
                .saturating_add(5_000_000)
                .clamp(HOLD_RANGE_NS.0, HOLD_RANGE_NS.1)
        }
    }

    /// Admits a best-effort launch on `dev` (may sleep; never spins): free while no high-priority tenant is
    /// present; else once this process's previous kernel has completed, the high-priority queue is empty and
    /// quiet, and the token is ours.
    pub(crate) fn be_admit<C: Clock, T: Tracker>(
        &self,
        e: PriorityEntry<'_>,
        dev: usize,
        clock: &C,
        tr: &T,
    ) -> Gate {
        let start = clock.now_ns();
        let mut waited = false;
        loop {
            let now = clock.now_ns();
            let hp = e.hp(now);
            if hp.last_launch == 0 || now.saturating_sub(hp.last_launch) >= PRESENT_NS {
                // Nobody to yield to. A kernel tracked from a restricted launch gives its token back once done.
                if let Some(v) = tr.poll_done(dev) {
                    e.release_token(v);
                }
                return Gate::Free;
            }
            // At most one queued: our previous kernel first (its token comes back with it).
            if let Some(v) = tr.wait_done(dev) {
                e.release_token(v);
                continue;
            }
            let busy_until = hp.busy_until.max(hp.last_launch.saturating_add(QUIET_NS));
            if busy_until > now {
                waited = true;
                clock.sleep_until(busy_until.min(now + MAX_STEP_NS));
                continue;
            }
            match e.take_token(now, now.saturating_add(Self::hold_ns(tr.last_ns(dev)))) {
                Ok(value) => {
                    let waited_ns = if waited { now.saturating_sub(start) } else { 0 };
                    return Gate::Token { value, waited_ns };
                }
                Err(until) => {
                    waited = true;
                    clock.sleep_until(until.min(now + TOKEN_POLL_NS));
                }
            }
        }
    }
}

/// [`Tracker`] with CUDA events: after a best-effort launch under the token, an event (blocking-sync, no
/// timing) is recorded on its stream; waiting for it sleeps in the driver.
pub(crate) struct Completions {
    api: Option<EventApi>,
    slots: [Lock<BeSlot>; MAX_DEVICES],
    last: [AtomicU64; MAX_DEVICES],
}

/// One device's tracking event (created once per context) and what it tracks.
#[derive(Debug, Default)]
pub(crate) struct BeSlot {
    /// (context, event).
    ev: Option<(usize, usize)>,
    /// (token, launch time) of the kernel the event follows.
    pending: Option<(u64, u64)>,
}

impl Completions {
    /// Tracking over `api` (`None`: no events, tokens are held until they expire).
    pub(crate) fn new(api: Option<EventApi>) -> Completions {
        Completions {
            api,
            slots: std::array::from_fn(|_| Lock::new(BeSlot::default())),
            last: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// After a launch under the token `token` on `stream`: record the event that says when it completed.
    /// False when that failed (the token is then held until it expires).
    pub(crate) fn track(&self, dev: usize, stream: usize, token: u64, now: u64) -> bool {
        let Some(api) = self.api.as_ref() else {
            return false;
        };
        let Some(ctx) = stream_ctx(api, stream) else {
            return false;
        };
        let mut g = self.slots[dev].lock();
        if g.ev.is_none_or(|(c, _)| c != ctx) {
            // An event of another (maybe destroyed) context is dropped, never touched again.
            g.ev = create(api, ctx).map(|e| (ctx, e));
        }
        let Some((_, ev)) = g.ev else { return false };
        // SAFETY: our event, recorded on the program's stream of the same context.
        if unsafe { (api.cuEventRecord)(ev as *mut c_void, stream as *mut c_void) }.ok() {
            g.pending = Some((token, now));
            true
        } else {
            g.ev = None;
            false
        }
    }

    fn take(&self, dev: usize, wait: bool) -> Option<u64> {
        let api = self.api.as_ref()?;
        let (ev, (token, launched)) = {
            let mut g = self.slots[dev].lock();
            let ev = g.ev?.1;
            let p = g.pending?;
            if !wait {
                // SAFETY: our event.
                if !unsafe { (api.cuEventQuery)(ev as *mut c_void) }.ok() {
                    return None;
                }
            }
            g.pending = None;
            (ev, p)
        };
        if wait {
            // SAFETY: our event; only the token holder (this process, this pending kernel) waits on it, and no
            // other thread records it until the token is given back.
            unsafe { (api.cuEventSynchronize)(ev as *mut c_void) };
        }
        let now = super::clock::monotonic_ns();
        self.last[dev].store(now.saturating_sub(launched).max(1), Ordering::Relaxed);
        Some(token)
    }

    /// The slots' locks (for the fork handlers).
    pub(crate) fn locks(&self) -> &[Lock<BeSlot>] {
        &self.slots
    }
}

fn create(api: &EventApi, ctx: usize) -> Option<usize> {
    let mut cur: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { (api.cuCtxGetCurrent)(&mut cur) };
    let push = cur as usize != ctx;
    // SAFETY: `ctx` is the live context of the stream the program just launched on.
    if push && !unsafe { (api.cuCtxPushCurrent)(ctx as *mut c_void) }.ok() {
        return None;
    }
    let mut e: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags from cuda.h (sleep in cuEventSynchronize, no timestamps).
    let ok = unsafe { (api.cuEventCreate)(&mut e, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) }.ok();
    if push {
        let mut popped: *mut c_void = std::ptr::null_mut();
        // SAFETY: undoes our push.
        unsafe { (api.cuCtxPopCurrent)(&mut popped) };
    }
    (ok && !e.is_null()).then_some(e as usize)
}

impl Tracker for Completions {
    fn wait_done(&self, dev: usize) -> Option<u64> {
        self.take(dev, true)
    }
    fn poll_done(&self, dev: usize) -> Option<u64> {
        self.take(dev, false)
    }
    fn last_ns(&self, dev: usize) -> u64 {
        self.last[dev].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::fake::FakeClock;
    use super::*;
    use cuquota_core::region::layout::PriorityDevice;
    use std::cell::{Cell, RefCell};

    const MS: u64 = 1_000_000;
    const T0: u64 = 1_000_000 * MS;

    fn entry() -> &'static PriorityDevice {
        let layout = std::alloc::Layout::new::<PriorityDevice>();
        // SAFETY: all-zero is a valid PriorityDevice (atomics only); leaked for the test's lifetime.
        unsafe { &*(std::alloc::alloc_zeroed(layout) as *const PriorityDevice) }
    }

    /// A device timeline for one best-effort process: its tracked kernel ends at `done_at`.
    struct FakeTracker<'c> {
        clock: &'c FakeClock,
        pending: RefCell<Option<(u64, u64)>>, // token, done at
        last: Cell<u64>,
    }

    impl<'c> FakeTracker<'c> {
        fn new(clock: &'c FakeClock) -> Self {
            FakeTracker {
                clock,
                pending: RefCell::new(None),
                last: Cell::new(0),
            }
        }
        fn launched(&self, token: u64, kernel_ns: u64) {
            *self.pending.borrow_mut() = Some((token, self.clock.now_ns() + kernel_ns));
        }
    }

    impl Tracker for FakeTracker<'_> {
        fn wait_done(&self, _dev: usize) -> Option<u64> {
            let (t, at) = self.pending.borrow_mut().take()?;
            self.clock.sleep_until(at);
            self.last.set(1);
            Some(t)
        }
        fn poll_done(&self, _dev: usize) -> Option<u64> {
            let (t, at) = (*self.pending.borrow())?;
            (self.clock.now_ns() >= at).then(|| {
                *self.pending.borrow_mut() = None;
                t
            })
        }
        fn last_ns(&self, _dev: usize) -> u64 {
            self.last.get()
        }
    }

    #[test]
    fn without_a_high_priority_tenant_best_effort_is_free() {
        let clock = FakeClock::new(T0);
        let (p, e) = (Priorities::default(), PriorityEntry::new(entry()));
        let tr = FakeTracker::new(&clock);
        assert_eq!(p.be_admit(e, 0, &clock, &tr), Gate::Free);
        // A high-priority tenant gone for PRESENT_NS no longer restricts anyone.
        p.hp_launch(e, 0, T0, MS);
        clock.advance(PRESENT_NS);
        assert_eq!(p.be_admit(e, 0, &clock, &tr), Gate::Free);
        assert_eq!(clock.now_ns(), T0 + PRESENT_NS, "no wait");
    }

    #[test]
    fn best_effort_waits_for_the_high_priority_queue_and_keeps_one_kernel() {
        let clock = FakeClock::new(T0);
        let (p, e) = (Priorities::default(), PriorityEntry::new(entry()));
        let tr = FakeTracker::new(&clock);
        // A burst of 20 × 200 µs issued at T0: the queue is estimated done at T0 + 4 ms.
        for _ in 0..20 {
            p.hp_launch(e, 0, T0, 200_000);
        }
        assert_eq!(e.hp(T0).busy_until, T0 + 4 * MS);
        let Gate::Token { value, waited_ns } = p.be_admit(e, 0, &clock, &tr) else {
            panic!("a present high-priority tenant must restrict")
        };
        assert_eq!(clock.now_ns(), T0 + 4 * MS, "started when the burst was done");
        assert_eq!(waited_ns, 4 * MS);
        tr.launched(value, 3 * MS);
        // The next best-effort kernel waits for this one (one queued at a time) and gets a fresh token.
        let Gate::Token { value: v2, .. } = p.be_admit(e, 0, &clock, &tr) else {
            panic!()
        };
        assert_eq!(clock.now_ns(), T0 + 7 * MS);
        assert_ne!(v2, value);
        // While that kernel is queued, nobody else (another best-effort process) gets the token.
        tr.launched(v2, 3 * MS);
        let now = clock.now_ns();
        assert_eq!(
            e.take_token(now, now + MS),
            Err(v2),
            "two best-effort kernels queued at once"
        );
    }

    #[test]
    fn a_high_priority_launch_just_made_keeps_best_effort_quiet() {
        let clock = FakeClock::new(T0);
        let (p, e) = (Priorities::default(), PriorityEntry::new(entry()));
        let tr = FakeTracker::new(&clock);
        p.hp_launch(e, 0, T0, 0); // a kernel whose estimate is 0 (unknown), just launched
        let g = p.be_admit(e, 0, &clock, &tr);
        assert!(matches!(g, Gate::Token { .. }));
        assert!(clock.now_ns() >= T0 + QUIET_NS);
    }

    #[test]
    fn a_token_of_a_dead_holder_expires() {
        let clock = FakeClock::new(T0);
        let (p, e) = (Priorities::default(), PriorityEntry::new(entry()));
        let tr = FakeTracker::new(&clock);
        p.hp_launch(e, 0, T0, 0);
        // Someone took the token and died: it is held until its expiry, not for ever.
        let dead = e.take_token(T0, T0 + 50 * MS).unwrap();
        assert!(matches!(p.be_admit(e, 0, &clock, &tr), Gate::Token { .. }));
        assert!(clock.now_ns() >= dead && clock.now_ns() < dead + TOKEN_POLL_NS + 1);
    }

    #[test]
    fn holds_are_bounded() {
        assert_eq!(Priorities::hold_ns(0), FIRST_HOLD_NS);
        assert_eq!(Priorities::hold_ns(1), HOLD_RANGE_NS.0);
        assert_eq!(Priorities::hold_ns(5 * MS), 25 * MS);
        assert_eq!(Priorities::hold_ns(u64::MAX), HOLD_RANGE_NS.1);
    }
}

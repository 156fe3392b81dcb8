//! Priority between the tenants of one GPU: high-priority (latency-critical) tenants publish their activity in
//! their container's priority file; best-effort (low-priority) tenants read the high-priority containers'
//! files (read-only) and yield to it. User reference: docs/priority.md.
//!
//! Why this shape: a GPU does not pre-empt a running kernel (nor does the simulator), so what sits in the
//! device's queue when a high-priority burst arrives delays it whole. The one lever an in-process library has
//! is *when best-effort work is submitted*. So, on each device:
//! - a high-priority launch stores its time and raises the estimated end of the high-priority queue (its
//!   process's estimate: the throttle's per-kernel estimates, measured with events);
//! - while a high-priority tenant is **present** (a `.high` container's file is in the node directory, idle or
//!   not; without the directory: launched within [`PRESENT_NS`]), a best-effort process keeps
//!   at most [`BUDGET_NS`] of estimated kernel time queued (or one kernel, if longer, joining measured work
//!   only within [`LEAD_NS`] of its end) and launches under its
//!   container's **token** (one process of the container at a time), so a burst finds at most that ahead of
//!   it per best-effort container (the bound that REEF gets by pre-emption and Orion by limiting outstanding
//!   best-effort work, without either);
//! - and it starts only when the high-priority queue is empty and the high-priority tenant has not launched
//!   for [`QUIET_NS`] (so it does not slip in between the kernels of a burst the host is still issuing), the
//!   queue's published end moved by how long our own kernels queued before the burst ran past its launch (a
//!   time-sliced GPU gives work launched inside a burst a slice inside it);
//! - when no high-priority tenant is present, best-effort tenants launch freely (their own SM limit applies).
//!
//! The token holder gives it back when it has seen all its kernels complete (an event recorded after each
//! launch), at its next launch; a holder that never comes back (exited, died) loses it when its hold expires.

use super::clock::Clock;
use super::probe::{stream_ctx, EventApi};
use crate::ffi::cuda::{CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING};
use crate::locks::Lock;
use cuquota_core::region::layout::MAX_DEVICES;
use cuquota_core::region::PriorityEntry;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// A high-priority tenant that launched within this is present (a `.high` file in the node directory makes one
/// present however long idle: `PriorityEntry::hp`). Long, because a best-effort queue left deep while it was away is what its next request would wait
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

/// Estimated best-effort device time a process may keep queued while a high-priority tenant is present (the
/// oldest kernel counted by what is left of it): what a burst may find ahead of it (one kernel is always
/// allowed, however long). The next kernel is queued before the current one ends, which hides the wake-up
/// that one kernel at a time paid per kernel (57–70 % of the idle time with 100 µs kernels); 400 µs keeps a
/// 4 ms burst within 1.1 × its time alone (bench-throttle, docs/priority.md).
pub(crate) const BUDGET_NS: u64 = 400_000;

/// What a best-effort launch charged `charged` is gated and tracked by: a key never measured (`sure` false: a
/// new kernel shape, copy size class or updated graph, on one device or several) counts as longer than the
/// budget, so it goes only onto an empty queue and nothing follows it until it is done (its charge, the
/// process's average, is the tenant's to pull down with tiny work).
pub(crate) fn be_estimate(charged: u64, sure: bool) -> u64 {
    if sure {
        charged
    } else {
        charged.max(BUDGET_NS + 1)
    }
}
/// A measured launch longer than the budget may join a queue of measured work estimated to end within this, so
/// the device does not run dry while the process wakes up (83-92 % of the idle time on the time-sliced
/// simulator when each such launch waited for the last to complete; 87-93 % with this). What a burst may find
/// ahead grows to this + one launch; on a time-sliced GPU that stays within one launch + one quantum while this
/// + 3 context switches fit in a quantum (2 ms, 222 µs switches: bench/README.md, 2026-12-02).
pub(crate) const LEAD_NS: u64 = 600_000;
/// Most best-effort kernels a process tracks per device (one event each).
pub(crate) const QUEUE: usize = 16;
/// Contexts of one device whose kernels a process tracks at once (one queue per device counts them all, so
/// launching from several contexts does not reset the budget); events of a context evicted past this are
/// dropped.
pub(crate) const CTXS: usize = 4;

/// What a best-effort launch may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// No high-priority tenant present: launch freely.
    Free,
    /// Launch under the container's token `value` (track the kernel's completion); `waited_ns` spent waiting.
    Token {
        /// The token's value (see `PriorityEntry::take_token`).
        value: u64,
        /// Time waited before it was granted.
        waited_ns: u64,
    },
}

/// This process's best-effort kernels queued under the token, per device.
pub(crate) trait Tracker {
    /// Forgets the kernels seen complete (never waits) and says what is still queued at `now`.
    fn reap(&self, dev: usize, now: u64) -> Queued;
    /// Waits until the oldest kernel still queued has completed.
    fn wait_oldest(&self, dev: usize);
    /// Records that this process holds the token `v` (`None`: no longer).
    fn set_token(&self, dev: usize, v: Option<u64>);
    /// How long this process's last tracked kernel took from launch to seen complete (0 = none seen yet).
    fn last_ns(&self, dev: usize) -> u64;
    /// Whether a launch on `stream` could be tracked now besides what is queued (its context has events, or
    /// one that has none queued can be given to it).
    fn can_track(&self, dev: usize, stream: usize) -> bool;
}

/// This process's best-effort kernels still queued on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Queued {
    /// Estimated device time left: the oldest kernel's estimate less the time it has run (counted from its
    /// launch or the previous one's completion, whichever is later), plus the others'.
    pub(crate) left_ns: u64,
    /// Of it, the oldest kernel's.
    pub(crate) head_left_ns: u64,
    /// How many.
    pub(crate) n: usize,
    /// The container's token, while this process holds it.
    pub(crate) token: Option<u64>,
    /// Whether every queued launch's estimate was measured (a never-measured key is followed by nothing).
    pub(crate) sure: bool,
    /// When the oldest queued launch was made (0: none queued).
    pub(crate) head_launched: u64,
    /// The last launch seen complete: when it was made and when it was seen done (0, 0: none yet).
    pub(crate) last_done: (u64, u64),
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

    /// Admits a best-effort launch on `dev` estimated to take `est_ns` (as [`be_estimate`] has it; may sleep,
    /// never spins): free while no
    /// high-priority tenant is present; else once this process's queued kernels leave room for it in
    /// [`BUDGET_NS`] (or none is queued), the high-priority queue is empty and quiet, and the container's
    /// token is ours (taken, or renewed while our kernels are queued). A launch on `stream` that could not be
    /// tracked waits for our queued kernels (fail closed: never work on the device outside the budget).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn be_admit<C: Clock, T: Tracker>(
        &self,
        e: PriorityEntry<'_>,
        dev: usize,
        stream: usize,
        est_ns: u64,
        sure: bool,
        clock: &C,
        tr: &T,
    ) -> Gate {
        let est_ns = be_estimate(est_ns, sure);
        let start = clock.now_ns();
        let mut waited = false;
        loop {
            let now = clock.now_ns();
            let q = tr.reap(dev, now);
            let (n, held) = (q.n, q.token);
            if let (0, Some(v)) = (n, held) {
                // Everything we queued is done: the token goes back.
                e.release_token(v);
                tr.set_token(dev, None);
            }
            let held = held.filter(|_| n > 0);
            let hp = e.hp(now);
            if hp.last_launch == 0 || now.saturating_sub(hp.last_launch) >= PRESENT_NS {
                return Gate::Free; // nobody to yield to
            }
            let over = q.left_ns.saturating_add(est_ns).saturating_sub(BUDGET_NS);
            if n > 0 && n < QUEUE && !tr.can_track(dev, stream) {
                // Its context has no events to spare (our kernels queued from others hold them all).
                waited = true;
                tr.wait_oldest(dev);
                continue;
            }
            // A measured launch past the budget joins measured work about to end (`LEAD_NS`).
            let lead = sure && q.sure && est_ns > BUDGET_NS;
            let room = if lead {
                q.left_ns.saturating_sub(LEAD_NS)
            } else {
                over
            };
            if n >= QUEUE || (n > 0 && room > 0) {
                // Room comes when the oldest kernel has run `room` more: sleep until then if it will still be
                // running (the next kernel is queued before it ends: no gap), else wait for it to complete.
                waited = true;
                if n < QUEUE && room < q.head_left_ns {
                    clock.sleep_until(now + room);
                } else {
                    tr.wait_oldest(dev);
                }
                continue;
            }
            if n > 0 && q.head_launched <= hp.last_launch {
                // High-priority work was launched behind ours: it ends after ours (by how much, below).
                waited = true;
                tr.wait_oldest(dev);
                continue;
            }
            // The published end is from the high-priority launches' times; our work that was queued before them
            // ran first and moved it (on a time-sliced device, work launched before it ends may be given a slice
            // inside the burst).
            let (launched, done) = q.last_done;
            let moved = if launched <= hp.last_launch {
                done.saturating_sub(hp.last_launch)
            } else {
                0
            };
            let busy_until = hp
                .busy_until
                .saturating_add(moved)
                .max(hp.last_launch.saturating_add(QUIET_NS));
            if busy_until > now {
                waited = true;
                clock.sleep_until(busy_until.min(now + MAX_STEP_NS));
                continue;
            }
            let hold_until = now.saturating_add(Self::hold_ns(tr.last_ns(dev)));
            let got = match held {
                Some(v) => e.renew_token(v, hold_until),
                None => e.take_token(now, hold_until),
            };
            match got {
                Ok(value) => {
                    tr.set_token(dev, Some(value));
                    let waited_ns = if waited { now.saturating_sub(start) } else { 0 };
                    return Gate::Token { value, waited_ns };
                }
                Err(until) => {
                    // Held by another process of the container (ours expired and was taken over: wait until our
                    // kernels are done and it is free again).
                    tr.set_token(dev, None);
                    waited = true;
                    clock.sleep_until(until.min(now + TOKEN_POLL_NS).max(now + 1));
                }
            }
        }
    }
}

/// [`Tracker`] with CUDA events: after a best-effort launch under the token, an event (blocking-sync, no
/// timing) is recorded on its stream; waiting for one sleeps in the driver.
pub(crate) struct Completions {
    api: Option<EventApi>,
    slots: [Lock<BeSlot>; MAX_DEVICES],
    last: [AtomicU64; MAX_DEVICES],
}

/// One device's tracking events (created once per context and ring position) and what they track: one queue
/// for the device, whichever context each kernel was launched from.
#[derive(Debug, Default)]
pub(crate) struct BeSlot {
    /// The contexts the events belong to (0 = unused).
    ctxs: [usize; CTXS],
    /// Events per context, by ring position (0 = not created yet).
    evs: [[usize; QUEUE]; CTXS],
    /// (estimated ns, launch time, context index) of the queued kernels, by ring position.
    q: [(u64, u64, usize); QUEUE],
    /// Which of them have a measured estimate, and when each is estimated done, by ring position.
    sure: [bool; QUEUE],
    ends: [u64; QUEUE],
    /// The last kernel seen complete: its launch time and when it was done (seen, or estimated if earlier:
    /// a wake-up is late).
    last_done: (u64, u64),
    /// Ring position of the oldest queued kernel, and how many are queued.
    head: usize,
    /// Since when the oldest has been running, at the latest (its launch, or the previous one's completion).
    head_since: u64,
    len: usize,
    /// Kernels popped so far (tells a waiter whether the kernel it waited for is still the oldest).
    popped: u64,
    /// The container's token, while this process holds it.
    token: Option<u64>,
}

impl BeSlot {
    /// The event of the oldest queued kernel.
    fn head_event(&self) -> usize {
        self.evs[self.q[self.head].2][self.head]
    }

    /// The index of `ctx`'s events: its own, else a free one, else one no queued kernel uses (its events are
    /// dropped: of a context maybe destroyed, never touched again). `None`: all in use.
    fn ctx_index(&mut self, ctx: usize) -> Option<usize> {
        if let Some(i) = self.ctxs.iter().position(|&c| c == ctx) {
            return Some(i);
        }
        let i = (0..CTXS)
            .find(|&i| self.ctxs[i] == 0)
            .or_else(|| (0..CTXS).find(|&i| !self.queued(i)))?;
        self.ctxs[i] = ctx;
        self.evs[i] = [0; QUEUE];
        Some(i)
    }

    /// Whether a queued kernel uses context index `i`'s events.
    fn queued(&self, i: usize) -> bool {
        (0..self.len).any(|k| self.q[(self.head + k) % QUEUE].2 == i)
    }

    fn pop(&mut self, last: &AtomicU64) {
        let (_, launched, _) = self.q[self.head];
        let now = super::clock::monotonic_ns();
        last.store(now.saturating_sub(launched).max(1), Ordering::Relaxed);
        self.last_done = (launched, now.min(self.ends[self.head]));
        self.head_since = now;
        self.head = (self.head + 1) % QUEUE;
        self.len -= 1;
        self.popped += 1;
    }
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

    /// After a launch under the token on `stream`, estimated `est_ns` (`sure`: measured), made at `at`: record
    /// the event that says when it completed. False when that failed (the kernel is then not counted; the token
    /// expires if nothing else of ours is queued to bring it back).
    pub(crate) fn track(&self, dev: usize, stream: usize, est_ns: u64, sure: bool, at: u64) -> bool {
        let Some(api) = self.api.as_ref() else {
            return false;
        };
        let Some(ctx) = stream_ctx(api, stream) else {
            return false;
        };
        let mut g = self.slots[dev].lock();
        if g.len == QUEUE {
            return false;
        }
        let Some(ci) = g.ctx_index(ctx) else {
            return false;
        };
        let pos = (g.head + g.len) % QUEUE;
        if g.evs[ci][pos] == 0 {
            match create(api, ctx) {
                Some(e) => g.evs[ci][pos] = e,
                None => return false,
            }
        }
        // SAFETY: our event, recorded on the program's stream of the same context.
        if unsafe { (api.cuEventRecord)(g.evs[ci][pos] as *mut c_void, stream as *mut c_void) }.ok() {
            let prev = if g.len > 0 {
                g.ends[(pos + QUEUE - 1) % QUEUE]
            } else {
                0
            };
            g.q[pos] = (est_ns, at, ci);
            g.sure[pos] = sure;
            g.ends[pos] = prev.max(at).saturating_add(est_ns);
            if g.len == 0 {
                g.head_since = at;
            }
            g.len += 1;
            true
        } else {
            g.evs[ci][pos] = 0;
            false
        }
    }

    /// After a launch under the token that could not be tracked (an event call failed): waits until our
    /// tracked kernels are done and then for its estimate, as if it had been (fail closed).
    pub(crate) fn untracked(&self, dev: usize, est_ns: u64) {
        while self.reap(dev, super::clock::monotonic_ns()).n > 0 {
            self.wait_oldest(dev);
        }
        super::clock::Monotonic.sleep_until(super::clock::monotonic_ns().saturating_add(est_ns));
    }

    /// The slots' locks (for the fork handlers).
    pub(crate) fn locks(&self) -> &[Lock<BeSlot>] {
        &self.slots
    }
}

impl Tracker for Completions {
    fn reap(&self, dev: usize, now: u64) -> Queued {
        let mut g = self.slots[dev].lock();
        if let Some(api) = self.api.as_ref() {
            // SAFETY: our events.
            while g.len > 0 && unsafe { (api.cuEventQuery)(g.head_event() as *mut c_void) }.ok() {
                g.pop(&self.last[dev]);
            }
        }
        if g.len == 0 {
            return Queued {
                token: g.token,
                sure: true,
                last_done: g.last_done,
                ..Queued::default()
            };
        }
        let head_left_ns = g.q[g.head].0.saturating_sub(now.saturating_sub(g.head_since));
        let rest: u64 = (1..g.len).map(|i| g.q[(g.head + i) % QUEUE].0).sum();
        Queued {
            left_ns: head_left_ns.saturating_add(rest),
            head_left_ns,
            n: g.len,
            token: g.token,
            sure: (0..g.len).all(|i| g.sure[(g.head + i) % QUEUE]),
            head_launched: g.q[g.head].1,
            last_done: g.last_done,
        }
    }

    fn wait_oldest(&self, dev: usize) {
        let Some(api) = self.api.as_ref() else { return };
        let (ev, seq) = {
            let g = self.slots[dev].lock();
            if g.len == 0 {
                return;
            }
            (g.head_event(), g.popped)
        };
        // SAFETY: our event. Another thread may pop it meanwhile and record it again for a later kernel: then
        // this waits for that one, longer than needed, never wrongly.
        unsafe { (api.cuEventSynchronize)(ev as *mut c_void) };
        let mut g = self.slots[dev].lock();
        if g.len > 0 && g.popped == seq {
            g.pop(&self.last[dev]);
        }
    }

    fn set_token(&self, dev: usize, v: Option<u64>) {
        self.slots[dev].lock().token = v;
    }

    fn last_ns(&self, dev: usize) -> u64 {
        self.last[dev].load(Ordering::Relaxed)
    }

    fn can_track(&self, dev: usize, stream: usize) -> bool {
        let Some(ctx) = self.api.as_ref().and_then(|api| stream_ctx(api, stream)) else {
            return true; // not trackable at all: `untracked` after the launch
        };
        let g = self.slots[dev].lock();
        g.ctxs.contains(&ctx) || (0..CTXS).any(|i| g.ctxs[i] == 0 || !g.queued(i))
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

    /// A device timeline for one best-effort process: its queued kernels run one after another.
    struct FakeTracker {
        clock: FakeClock,
        q: RefCell<std::collections::VecDeque<(u64, u64, u64)>>, // est, done at, launched
        token: Cell<Option<u64>>,
        last: Cell<u64>,
        done: Cell<(u64, u64)>,
    }

    impl FakeTracker {
        fn new() -> Self {
            FakeTracker {
                clock: FakeClock::new(T0),
                q: RefCell::new(Default::default()),
                token: Cell::new(None),
                last: Cell::new(0),
                done: Cell::new((0, 0)),
            }
        }
        /// A kernel of `kernel_ns` launched now (estimated right).
        fn launched(&self, kernel_ns: u64) {
            let mut q = self.q.borrow_mut();
            let now = self.clock.now_ns();
            let start = q.back().map_or(0, |b| b.1).max(now);
            q.push_back((kernel_ns, start + kernel_ns, now));
        }
    }

    impl Tracker for FakeTracker {
        fn reap(&self, _dev: usize, now: u64) -> Queued {
            let mut q = self.q.borrow_mut();
            while let Some(k) = q.front().copied().filter(|k| k.1 <= now) {
                q.pop_front();
                self.last.set(1);
                self.done.set((k.2, k.1));
            }
            let head_left_ns = q.front().map_or(0, |k| k.0.min(k.1 - now));
            Queued {
                left_ns: head_left_ns + q.iter().skip(1).map(|k| k.0).sum::<u64>(),
                head_left_ns,
                n: q.len(),
                token: self.token.get(),
                sure: true,
                head_launched: q.front().map_or(0, |k| k.2),
                last_done: self.done.get(),
            }
        }
        fn wait_oldest(&self, _dev: usize) {
            if let Some((_, at, launched)) = self.q.borrow_mut().pop_front() {
                self.clock.sleep_until(at);
                self.last.set(1);
                self.done.set((launched, at));
            }
        }
        fn set_token(&self, _dev: usize, v: Option<u64>) {
            self.token.set(v);
        }
        fn last_ns(&self, _dev: usize) -> u64 {
            self.last.get()
        }
        fn can_track(&self, _dev: usize, _stream: usize) -> bool {
            true
        }
    }

    /// One best-effort process on device 0 at T0, beside the high-priority tenants of `e`.
    struct Fx {
        p: Priorities,
        e: PriorityEntry<'static>,
        tr: FakeTracker,
    }

    impl Fx {
        fn new() -> Self {
            Fx {
                p: Priorities::default(),
                e: PriorityEntry::new(entry()),
                tr: FakeTracker::new(),
            }
        }
        /// A high-priority launch of unknown length at T0, QUIET_NS ago: a present tenant, an empty queue.
        fn quiet() -> Self {
            let f = Fx::new();
            f.p.hp_launch(f.e, 0, T0, 0);
            f.clock().advance(QUIET_NS);
            f
        }
        fn clock(&self) -> &FakeClock {
            &self.tr.clock
        }
        fn now(&self) -> u64 {
            self.tr.clock.now_ns()
        }
        /// A high-priority burst of 20 × 200 µs issued at `at`: 4 ms of estimated work.
        fn hp_burst(&self, at: u64) {
            for _ in 0..20 {
                self.p.hp_launch(self.e, 0, at, 200_000);
            }
        }
        fn admit(&self, est_ns: u64, sure: bool) -> Gate {
            self.p
                .be_admit(self.e, 0, 0, est_ns, sure, self.clock(), &self.tr)
        }
        /// An admission that must be restricted (under the token); the token's value.
        fn token(&self, est_ns: u64, sure: bool) -> u64 {
            match self.admit(est_ns, sure) {
                Gate::Token { value, .. } => value,
                g => panic!("a present high-priority tenant must restrict: {g:?}"),
            }
        }
    }

    #[test]
    fn without_a_high_priority_tenant_best_effort_is_free() {
        let f = Fx::new();
        assert_eq!(f.admit(MS, true), Gate::Free);
        // A high-priority tenant gone for PRESENT_NS no longer restricts anyone.
        f.p.hp_launch(f.e, 0, T0, MS);
        f.clock().advance(PRESENT_NS);
        assert_eq!(f.admit(MS, true), Gate::Free);
        assert_eq!(f.now(), T0 + PRESENT_NS, "no wait");
    }

    #[test]
    fn best_effort_waits_for_the_high_priority_queue_and_keeps_one_long_kernel() {
        let f = Fx::new();
        f.hp_burst(T0);
        assert_eq!(f.e.hp(T0).busy_until, T0 + 4 * MS);
        let Gate::Token { value, waited_ns } = f.admit(3 * MS, true) else {
            panic!("a present high-priority tenant must restrict")
        };
        assert_eq!(f.now(), T0 + 4 * MS, "started when the burst was done");
        assert_eq!(waited_ns, 4 * MS);
        f.tr.launched(3 * MS);
        // A never-measured launch longer than the budget waits for the kernel; the token is renewed, not taken
        // anew.
        let v2 = f.token(3 * MS, false);
        assert_eq!(f.now(), T0 + 7 * MS);
        assert_ne!(v2, value);
        f.tr.launched(3 * MS);
        // A measured one joins it LEAD_NS before its estimated end, and a third waits for the first.
        f.token(3 * MS, true);
        assert_eq!(f.now(), T0 + 10 * MS - LEAD_NS);
        f.tr.launched(3 * MS);
        let v2 = f.token(3 * MS, true);
        assert_eq!(f.now(), T0 + 13 * MS - LEAD_NS);
        // While that kernel is queued, nobody else (another best-effort process) gets the token.
        f.tr.launched(3 * MS);
        let now = f.now();
        assert_eq!(
            f.e.take_token(now, now + MS),
            Err(v2),
            "two processes' best-effort kernels queued at once"
        );
    }

    #[test]
    fn a_never_measured_launch_counts_as_longer_than_the_budget() {
        // However little it is charged, on one device or as a multi-device launch's part (65a7532): with a
        // 100 µs kernel of ours queued, a measured 100 µs launch joins it at once (the control), a never-measured
        // one waits until ours are done.
        let (f, k) = (Fx::quiet(), 100_000);
        for _ in 0..2 {
            f.token(k, true);
            f.tr.launched(k);
        }
        assert_eq!(f.now(), T0 + QUIET_NS, "measured: queued at once");
        f.token(k, false);
        assert_eq!(
            f.now(),
            T0 + QUIET_NS + 2 * k,
            "never measured: after ours are done"
        );
        assert_eq!(be_estimate(k, false), BUDGET_NS + 1);
        assert_eq!(be_estimate(k, true), k);
    }

    #[test]
    fn a_burst_that_waited_for_our_kernel_is_waited_for_to_its_real_end() {
        let f = Fx::quiet();
        f.token(3 * MS, true);
        // Our kernel runs until T0 + QUIET_NS + 3 ms; a burst of 4 ms issued 1 ms later waits for it: it really
        // ends 2 ms after its published end.
        f.tr.launched(3 * MS);
        let burst = f.now() + MS;
        f.clock().advance(MS);
        f.hp_burst(burst);
        f.token(3 * MS, true);
        assert_eq!(
            f.now(),
            burst + 2 * MS + 4 * MS,
            "launched inside the burst (on a time-sliced GPU: given a slice inside it)"
        );
    }

    #[test]
    fn short_kernels_queue_up_to_the_budget() {
        let (f, k) = (Fx::quiet(), 100_000);
        for _ in 0..(BUDGET_NS / k) {
            f.token(k, true);
            f.tr.launched(k);
        }
        assert_eq!(
            f.now(),
            T0 + QUIET_NS,
            "a budget of 100 µs kernels queued without a wait"
        );
        // The next waits until the first has run its course (sleeping, not waiting for it: no gap between
        // kernels): never more than the budget queued.
        f.token(k, true);
        assert_eq!(f.now(), T0 + QUIET_NS + k);
        assert_eq!(f.tr.reap(0, f.now()).left_ns + k, BUDGET_NS);
        f.tr.launched(k);
        // Two kernels of 3/4 of the budget: the second goes when the first has a quarter of the budget left.
        f.clock().advance(BUDGET_NS);
        assert_eq!(f.tr.reap(0, f.now()).n, 0);
        let l = BUDGET_NS * 3 / 4;
        f.token(l, true);
        f.tr.launched(l);
        let t = f.now();
        f.token(l, true);
        assert_eq!(f.now(), t + 2 * l - BUDGET_NS);
        // All done: the token goes back at the next admission.
        f.tr.launched(k);
        f.clock().advance(PRESENT_NS);
        assert_eq!(f.admit(k, true), Gate::Free);
        assert!(
            f.e.take_token(f.now(), f.now() + 1).is_ok(),
            "the token was not given back"
        );
    }

    #[test]
    fn a_high_priority_launch_just_made_keeps_best_effort_quiet() {
        let f = Fx::new();
        f.p.hp_launch(f.e, 0, T0, 0); // a kernel whose estimate is 0 (unknown), just launched
        f.token(MS, true);
        assert!(f.now() >= T0 + QUIET_NS);
    }

    #[test]
    fn a_token_of_a_dead_holder_expires() {
        let f = Fx::new();
        f.p.hp_launch(f.e, 0, T0, 0);
        // Someone took the token and died: it is held until its expiry, not for ever.
        let dead = f.e.take_token(T0, T0 + 50 * MS).unwrap();
        f.token(MS, true);
        assert!(f.now() >= dead && f.now() < dead + TOKEN_POLL_NS + 1);
    }

    #[test]
    fn holds_are_bounded() {
        assert_eq!(Priorities::hold_ns(0), FIRST_HOLD_NS);
        assert_eq!(Priorities::hold_ns(1), HOLD_RANGE_NS.0);
        assert_eq!(Priorities::hold_ns(5 * MS), 25 * MS);
        assert_eq!(Priorities::hold_ns(u64::MAX), HOLD_RANGE_NS.1);
    }
}

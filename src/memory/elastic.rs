//! Elastic memory (issue 39): memory that can move. An elastic tenant's (its request below its limit) linear
//! allocations of at least `CUQUOTA_ELASTIC_MIN_BYTES` are made on address ranges this library owns (reserve,
//! create, map, access), charged exactly as a plain allocation (the ledger's record). While the agent's limits
//! file asks (`evict_mask`) and the process is quiescent, a background thread (started at the first movable
//! allocation, polling every 20 ms) moves them, above the request, to pinned host memory mapped at the same
//! address: a kernel that touches them before they come back stays correct. Once the agent cleared the bit,
//! the next launch, copy or memset brings them back first (`around`); a device without room makes it wait for
//! the agent's reclaim (`Elastic::reclaim_wait`) once, then the call runs on the host copy. What cannot move stays resident:
//! other allocation kinds, small ones, and a movable one once exported (`pin`).
//!
//! Cost: with no movable allocation, one relaxed load per launch and copy (`on`). With some: the gate (one
//! increment, one load, one decrement, the stream noted) and a second load (`on_host`) for the restore.

mod gate;
mod mover;

use super::driver::Driver;
use crate::devices::{Dev, Devices};
use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::locks::Lock;
use crate::log::{log, Level};
use cuquota_core::region::SlotState;
use cuquota_core::UsageRegion;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How often the background thread looks at the limits file.
pub(crate) const POLL: std::time::Duration = std::time::Duration::from_millis(20);
/// After a reclaim wait found no room: how often a call tries the restore again (without waiting).
const RETRY_NS: u64 = 100_000_000;

/// A movable range.
#[derive(Clone, Copy, Debug)]
struct Range {
    dev: Dev,
    /// The context it was made in (the library's copies run there).
    ctx: usize,
    size: u64,
    /// Its backing now.
    handle: u64,
    on_host: bool,
    /// Exports made or in progress: never moves while any (a refused one is taken back).
    pins: u32,
}

#[derive(Default)]
pub(super) struct Inner {
    ranges: HashMap<u64, Range>,
    /// The library's own copy stream in each context (and the context's device).
    streams: HashMap<usize, (usize, Dev)>,
    /// Each device's ranges' access list (`mover`): the device, then the devices that can access it as a peer.
    access: HashMap<CUdevice, Vec<CUdevice>>,
}

/// The process's movable ranges and what moves them.
#[derive(Default)]
pub(super) struct Ranges {
    /// A movable range was ever made (the only load launches and copies pay otherwise).
    on: AtomicBool,
    /// Ranges on host memory now.
    on_host: AtomicU64,
    /// A restore found no room within the reclaim wait: later calls try again without waiting, at most once
    /// per `RETRY_NS` (from `next_try`), until everything is back or a new eviction.
    wait_spent: AtomicBool,
    next_try: AtomicU64,
    gate: gate::Gate,
    /// Held across every move, every free and every restore of a range: no call sees one half-moved.
    inner: Lock<Inner>,
    started: AtomicBool,
}

/// What an eviction pass did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// Nothing to move.
    Nothing,
    /// A call in flight or a stream busy: try later.
    Busy,
    /// Ranges moved to host memory (their bytes).
    Moved(u64),
    /// A driver call failed (the range stays where it was).
    Failed(CUresult),
}

impl Ranges {
    #[inline(always)]
    pub(super) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Makes a movable range of `size` (granularity-rounded) bytes on `dev`, in the current context.
    pub(super) fn alloc(&self, d: &impl Driver, dev: Dev, size: u64) -> Result<CUdeviceptr, CUresult> {
        let ctx = d.current_context()? as usize;
        if ctx == 0 {
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        let access = access_of(d, &mut self.inner.lock(), dev.ordinal);
        let (ptr, handle) = mover::make(d, size, &access)?;
        let r = Range {
            dev,
            ctx,
            size,
            handle,
            on_host: false,
            pins: 0,
        };
        self.inner.lock().ranges.insert(ptr, r);
        self.on.store(true, Ordering::Relaxed);
        Ok(ptr)
    }

    /// Whether `ptr` is a movable range's address.
    pub(super) fn owns(&self, ptr: u64) -> bool {
        self.on() && self.inner.lock().ranges.contains_key(&ptr)
    }

    /// Frees the movable range at `ptr` as `cuMemFree` would (its work finished first): `None` = not one.
    pub(super) fn free(&self, d: &impl Driver, ptr: u64) -> Option<CUresult> {
        let mut g = self.inner.lock();
        let r = *g.ranges.get(&ptr)?;
        let mut res = d
            .synchronize()
            .and_then(|()| mover::unmake(d, ptr, r.size, r.handle));
        if res == Err(CUresult::ERROR_NOT_SUPPORTED) {
            res = mover::unmake(d, ptr, r.size, r.handle);
        }
        Some(match res {
            Ok(()) => {
                g.ranges.remove(&ptr);
                if r.on_host {
                    self.on_host.fetch_sub(1, Ordering::Relaxed);
                }
                CUresult::SUCCESS
            }
            Err(e) => e,
        })
    }

    /// Contexts ended (destroyed, or a primary context reset or released for the last time): the movable ranges
    /// made in those `gone(ctx, dev)` names are freed, as the driver frees a context's `cuMemAlloc` memory (VMM
    /// memory is not tied to a context, so it would stay resident, uncharged, and its moves fail), and their
    /// copy streams and the gate's entries for their NULL streams are forgotten (a primary context comes back
    /// with the same handle; a destroyed one's may be another's). `dev` is `None` where this library does not
    /// know the context's device (a context that only launched). The bytes freed.
    pub(super) fn contexts_gone(&self, d: &impl Driver, gone: impl Fn(usize, Option<Dev>) -> bool) -> u64 {
        let mut g = self.inner.lock();
        let known: HashMap<usize, Dev> = (g.ranges.values().map(|r| (r.ctx, r.dev)))
            .chain(g.streams.iter().map(|(&c, &(_, dev))| (c, dev)))
            .collect();
        self.gate.forget_null_streams(|c| gone(c, known.get(&c).copied()));
        g.streams.retain(|&ctx, (_, dev)| !gone(ctx, Some(*dev)));
        let dead: Vec<(u64, Range)> = g
            .ranges
            .iter()
            .filter(|(_, r)| gone(r.ctx, Some(r.dev)))
            .map(|(&p, r)| (p, *r))
            .collect();
        let mut freed = 0;
        for (p, r) in dead {
            if let Err(e) = mover::unmake(d, p, r.size, r.handle) {
                log!(
                    Level::Warn,
                    "elastic: freeing {p:#x} of an ended context failed ({e:?})"
                );
            }
            g.ranges.remove(&p);
            if r.on_host {
                self.on_host.fetch_sub(1, Ordering::Relaxed);
            }
            freed += r.size;
        }
        freed
    }

    /// The range at `ptr`, if movable, never moves again and is brought back now if it had moved (an export:
    /// another process maps its device memory).
    /// True when `ptr` is a movable range (the caller calls [`Elastic::unpin`] if the export is refused).
    pub(super) fn pin(&self, d: &impl Driver, ptr: u64) -> bool {
        let mut g = self.inner.lock();
        let Some(r) = g.ranges.get_mut(&ptr) else {
            return false;
        };
        r.pins = r.pins.saturating_add(1);
        if r.on_host {
            let _ = self.restore_locked(d, &mut g, ptr);
        }
        true
    }

    /// An export [`Elastic::pin`] was made for was refused: the range may move again (if no other export holds).
    pub(super) fn unpin(&self, ptr: u64) {
        if let Some(r) = self.inner.lock().ranges.get_mut(&ptr) {
            r.pins = r.pins.saturating_sub(1);
        }
    }

    /// A launch or copy on `streams` is about to be made by `call`: ranges whose device the agent no longer asks
    /// to evict (`asked`) are brought back first, and no range moves while it is in flight. A device without
    /// room for them: `wait(dev, bytes, retry)` (the reclaim wait), see `restore_cleared`.
    #[inline]
    pub(super) fn around(
        &self,
        d: &impl Driver,
        streams: &[usize],
        asked: impl Fn(Dev) -> bool,
        wait: impl Fn(Dev, u64, &dyn Fn() -> CUresult) -> CUresult,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.gate.enter() {
            self.gate.back_out();
            let _g = self.inner.lock();
            self.gate.enter_locked();
        }
        if self.on_host.load(Ordering::Relaxed) != 0 {
            self.restore_cleared(d, &asked, &wait);
        }
        let r = call();
        // The NULL stream is its context's: noted with the context current now (the call's).
        let ctx = if gate::has_legacy(streams) {
            d.current_context().map_or(0, |c| c as usize)
        } else {
            0
        };
        self.gate.leave(streams, ctx);
        r
    }

    /// Brings back the ranges whose device is no longer asked. A device without room for them: the reclaim
    /// wait, once; still none, they stay in host memory, mapped at the same address, so the call is made on
    /// them (correct, slower: swapped, not out of memory), and later calls try again without a wait.
    #[cold]
    fn restore_cleared(
        &self,
        d: &impl Driver,
        asked: &impl Fn(Dev) -> bool,
        wait: &impl Fn(Dev, u64, &dyn Fn() -> CUresult) -> CUresult,
    ) {
        let now = crate::time::monotonic_ns();
        if self.wait_spent.load(Ordering::Relaxed) {
            let next = self.next_try.load(Ordering::Relaxed);
            if now < next
                || self
                    .next_try
                    .compare_exchange(next, now + RETRY_NS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                return;
            }
            if self.restore_pass(d, asked).is_none() {
                self.wait_spent.store(false, Ordering::Relaxed);
            }
            return;
        }
        let Some((dev, bytes)) = self.restore_pass(d, asked) else {
            return;
        };
        // The lock is let go between tries: the reclaim it waits for takes other processes' time, not ours.
        let r = wait(dev, bytes, &|| match self.restore_pass(d, asked) {
            None => CUresult::SUCCESS,
            Some(_) => CUresult::ERROR_OUT_OF_MEMORY,
        });
        if r != CUresult::SUCCESS {
            self.next_try
                .store(crate::time::monotonic_ns() + RETRY_NS, Ordering::Relaxed);
            self.wait_spent.store(true, Ordering::Relaxed);
            log!(
                Level::Warn,
                "elastic: no room on device {} for {bytes} bytes after the reclaim wait: they stay in host \
                 memory (calls on them are slower) and are brought back once there is",
                dev.ordinal
            );
        }
    }

    /// One try at bringing back every range whose device is no longer asked: `Some((dev, bytes))` = the device
    /// had no room for `bytes` of them (the first such device). A range that failed otherwise stays in host
    /// memory, mapped at the same address: the call is still correct on it.
    fn restore_pass(&self, d: &impl Driver, asked: &impl Fn(Dev) -> bool) -> Option<(Dev, u64)> {
        let mut g = self.inner.lock();
        let back: Vec<(u64, Range)> = g
            .ranges
            .iter()
            .filter(|(_, r)| r.on_host && !asked(r.dev))
            .map(|(&p, r)| (p, *r))
            .collect();
        let mut short: Option<(Dev, u64)> = None;
        for (p, r) in back {
            match self.restore_locked(d, &mut g, p) {
                Ok(()) => {}
                Err(CUresult::ERROR_OUT_OF_MEMORY) => match &mut short {
                    Some((dev, bytes)) if *dev == r.dev => *bytes += r.size,
                    Some(_) => {}
                    None => short = Some((r.dev, r.size)),
                },
                Err(e) => log!(
                    Level::Warn,
                    "elastic: restoring {p:#x} failed ({e:?}); it stays in host memory for now"
                ),
            }
        }
        short
    }

    fn restore_locked(&self, d: &impl Driver, g: &mut Inner, ptr: u64) -> Result<(), CUresult> {
        let r = g.ranges[&ptr];
        let stream = copy_stream(d, g, r.ctx, r.dev)?;
        let access = access_of(d, g, r.dev.ordinal);
        let mut res = Err(CUresult::ERROR_INVALID_CONTEXT);
        d.in_context(r.ctx as CUcontext, &mut || {
            res = mover::swap(d, ptr, r.size, &access, r.handle, Some(r.dev.ordinal), stream);
        })?;
        let h = res?;
        let e = g.ranges.get_mut(&ptr).expect("held under the lock");
        e.handle = h;
        e.on_host = false;
        self.on_host.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// One eviction pass: while the process is quiescent, ranges on devices `need` names (given the bytes of
    /// this process's ranges in host memory there, it says the bytes to move: what the container holds above
    /// its request) go to host memory, largest first.
    pub(super) fn evict(&self, d: &impl Driver, need: impl Fn(Dev, u64) -> Option<u64>) -> Pass {
        let mut g = self.inner.lock();
        let mut want: HashMap<u32, u64> = HashMap::new();
        let mut cands: Vec<(u64, Range)> = Vec::new();
        for (&p, r) in &g.ranges {
            if r.on_host || r.pins > 0 {
                continue;
            }
            let n = *want
                .entry(r.dev.id.index() as u32)
                .or_insert_with(|| need(r.dev, evicted_on(&g, r.dev)).unwrap_or(0));
            if n > 0 {
                cands.push((p, *r));
            }
        }
        if cands.is_empty() {
            return Pass::Nothing;
        }
        cands.sort_by(|a, b| b.1.size.cmp(&a.1.size).then(a.0.cmp(&b.0)));
        if !self.gate.begin_move() {
            return Pass::Busy;
        }
        let ctx = cands[0].1.ctx;
        let mut quiet = false;
        let _ = d.in_context(ctx as CUcontext, &mut || {
            let ask = |s: usize| match d.stream_idle(s as CUstream) {
                Ok(idle) => Ok(idle),
                Err(CUresult::ERROR_INVALID_HANDLE) => Err(gate::Gone),
                Err(_) => Ok(false),
            };
            quiet = self.gate.quiescent(|s| match gate::legacy_ctx(s) {
                // Another context's NULL stream (a kernel on a peer device, say): asked there.
                Some(c) => {
                    let mut r = Ok(false);
                    match d.in_context(c as CUcontext, &mut || r = ask(CU_STREAM_LEGACY)) {
                        Ok(()) => r,
                        Err(CUresult::ERROR_INVALID_CONTEXT) => Err(gate::Gone),
                        Err(_) => Ok(false),
                    }
                }
                None => ask(s),
            });
        });
        if !quiet {
            self.gate.end_move();
            return Pass::Busy;
        }
        let mut moved = 0u64;
        let mut out = Pass::Nothing;
        for (p, r) in cands {
            let left = want.get_mut(&(r.dev.id.index() as u32)).expect("counted above");
            if *left == 0 {
                continue;
            }
            match self.evict_locked(d, &mut g, p) {
                Ok(()) => {
                    moved += r.size;
                    *left = left.saturating_sub(r.size);
                }
                Err(e) => {
                    out = Pass::Failed(e);
                    break;
                }
            }
        }
        self.gate.end_move();
        match out {
            Pass::Failed(_) => out,
            _ if moved > 0 => Pass::Moved(moved),
            _ => Pass::Nothing,
        }
    }

    fn evict_locked(&self, d: &impl Driver, g: &mut Inner, ptr: u64) -> Result<(), CUresult> {
        let r = g.ranges[&ptr];
        let stream = copy_stream(d, g, r.ctx, r.dev)?;
        let access = access_of(d, g, r.dev.ordinal);
        let mut res = Err(CUresult::ERROR_INVALID_CONTEXT);
        d.in_context(r.ctx as CUcontext, &mut || {
            res = mover::swap(d, ptr, r.size, &access, r.handle, None, stream);
        })?;
        let h = res?;
        let e = g.ranges.get_mut(&ptr).expect("held under the lock");
        e.handle = h;
        e.on_host = true;
        self.on_host.fetch_add(1, Ordering::Relaxed);
        // A new eviction: its restore may wait for the reclaim again.
        self.wait_spent.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes of ranges on `dev` in host memory now.
    #[cfg(test)]
    pub(super) fn evicted(&self, dev: Dev) -> u64 {
        if self.on_host.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        evicted_on(&self.inner.lock(), dev)
    }

    /// Whether the background thread is to be started now (once).
    fn start_once(&self) -> bool {
        !self.started.swap(true, Ordering::Relaxed)
    }

    /// The lock every move holds (taken before the limits readers' when both are).
    pub(super) fn lock(&self) -> &Lock<Inner> {
        &self.inner
    }

    /// After fork, in the child (whose CUDA state is not usable; the thread did not follow).
    pub(super) fn reset(&self) {
        let mut g = self.inner.lock();
        g.ranges.clear();
        g.streams.clear();
        g.access.clear();
        self.on.store(false, Ordering::Relaxed);
        self.on_host.store(0, Ordering::Relaxed);
        self.started.store(false, Ordering::Relaxed);
        self.gate.reset();
    }
}

fn evicted_on(g: &Inner, dev: Dev) -> u64 {
    g.ranges
        .values()
        .filter(|r| r.on_host && r.dev == dev)
        .map(|r| r.size)
        .sum()
}

/// The devices granted access to `ordinal`'s ranges: `ordinal`, then every device the driver says can access
/// its memory as a peer (asked once per device; a refused question: none).
fn access_of(d: &impl Driver, g: &mut Inner, ordinal: CUdevice) -> Vec<CUdevice> {
    g.access
        .entry(ordinal)
        .or_insert_with(|| {
            let n = d.device_count().unwrap_or(0);
            std::iter::once(ordinal)
                .chain((0..n).filter(|&p| p != ordinal && d.can_access_peer(p, ordinal) == Ok(true)))
                .collect()
        })
        .clone()
}

/// The library's copy stream in context `ctx`, made on first use.
fn copy_stream(d: &impl Driver, g: &mut Inner, ctx: usize, dev: Dev) -> Result<CUstream, CUresult> {
    if let Some(&(s, _)) = g.streams.get(&ctx) {
        return Ok(s as CUstream);
    }
    let mut res = Err(CUresult::ERROR_INVALID_CONTEXT);
    d.in_context(ctx as CUcontext, &mut || res = d.stream_create())?;
    let s = res?;
    g.streams.insert(ctx, (s as usize, dev));
    Ok(s)
}

// ---- what hooks and the background thread call ---------------------------------------------------------

/// The elastic family (issue 39): the movable ranges, what moves them, and the bounded reclaim wait. Hooks reach
/// it as `Memory::elastic`; it owns its state and reads the devices' limits and the usage file itself.
pub(crate) struct Elastic {
    pub(super) devices: Arc<Devices>,
    ranges: Ranges,
}

impl Elastic {
    pub(super) fn new(devices: Arc<Devices>) -> Elastic {
        Elastic {
            devices,
            ranges: Ranges::default(),
        }
    }

    pub(super) fn usage(&self) -> &UsageRegion {
        self.devices.usage()
    }

    /// Whether a movable range exists (one relaxed load: all that launches and copies pay otherwise).
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.ranges.on()
    }

    /// Whether an allocation of `bytes` (rounded) on `dev` is to be movable: `dev`'s tenant is elastic and the
    /// size reaches the threshold.
    #[inline]
    pub(crate) fn movable(&self, dev: Dev, bytes: u64) -> bool {
        bytes >= self.devices.elastic_min_bytes() && self.devices.elastic_request(dev).is_some()
    }

    /// Makes a movable range of `bytes` on `dev` (the caller charged it: `charged_call`'s call).
    pub(crate) fn alloc(&self, cuda: &CudaTable, dev: Dev, bytes: u64) -> Result<u64, CUresult> {
        self.ranges.alloc(cuda, dev, bytes)
    }

    /// True once, for the caller that is to start the mover thread (which calls [`Elastic::tick`] every
    /// [`POLL`]); hooks start it, since the thread reaches the process state, a layer above memory.
    pub(crate) fn start_once(&self) -> bool {
        self.ranges.start_once()
    }

    /// Whether `p` is a movable range.
    #[inline]
    pub(crate) fn is_movable(&self, p: u64) -> bool {
        self.ranges.owns(p)
    }

    /// `cuMemFree` of the movable range at `p` (the charge goes with `free_pointer`).
    pub(crate) fn free(&self, cuda: &CudaTable, p: u64) -> CUresult {
        self.ranges.free(cuda, p).unwrap_or(CUresult::ERROR_INVALID_VALUE)
    }

    /// Context `ctx` was destroyed (`cuCtxDestroy` succeeded): its movable ranges are freed with it.
    pub(super) fn context_destroyed(&self, cuda: &CudaTable, ctx: usize) {
        if self.ranges.on() {
            self.ranges.contexts_gone(cuda, |c, _| c == ctx);
        }
    }

    /// `ordinal`'s primary context was reset or released: if the driver says it is no longer active, the movable
    /// ranges made in it (those of `ordinal` not in a context `owned`, the ones `cuCtxCreate` made) are freed.
    pub(super) fn primary_released(
        &self,
        cuda: &CudaTable,
        ordinal: CUdevice,
        owned: &dyn Fn(usize) -> bool,
    ) {
        let (mut flags, mut active) = (0, 1);
        // SAFETY: valid out-pointers of the call's types.
        let r = unsafe { cuda.cuDevicePrimaryCtxGetState(ordinal, &mut flags, &mut active) };
        if !r.ok() || active != 0 {
            return;
        }
        self.ranges.contexts_gone(cuda, |c, dev| {
            dev.is_some_and(|d| d.ordinal == ordinal) && !owned(c)
        });
    }

    /// The movable range at `p`, if any, stays resident from now on (exported): true if it is one, and then
    /// [`Elastic::unpin`] if the export was refused.
    pub(crate) fn pin(&self, cuda: &CudaTable, p: u64) -> bool {
        self.ranges.on() && self.ranges.pin(cuda, p)
    }

    /// The export [`Elastic::pin`] pinned `p` for was refused.
    pub(crate) fn unpin(&self, p: u64) {
        self.ranges.unpin(p);
    }

    /// A launch or copy on `streams` (`call`) while movable ranges exist.
    #[cold]
    #[inline(never)]
    pub(crate) fn call(
        &self,
        cuda: &CudaTable,
        streams: &[usize],
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.usage().note_use(crate::time::boottime_ns());
        let asked = |dev| self.devices.evict_asked(dev);
        let wait = |dev, bytes, retry: &dyn Fn() -> CUresult| self.reclaim_wait(dev, bytes, retry);
        self.ranges.around(cuda, streams, asked, wait, call)
    }

    /// Whether this process is its container's one mover on `dev`: the live slot with the largest charge there
    /// (the lowest slot on a tie). What each process has evicted is its own (no shared word), so with more than
    /// one mover each would count the others' evicted bytes as resident and all would move, taking the
    /// container below its request. The mover's own evicted bytes are then all the container's; a mover that
    /// holds no movable range moves nothing (the agent's ask times out). Slow path: scans the slots.
    fn mover(&self, dev: Dev) -> bool {
        let Some(me) = self.usage().cached_slot() else {
            return false;
        };
        let d = dev.id.index();
        self.usage()
            .processes()
            .into_iter()
            .filter(|p| p.state == SlotState::Live && p.mem_used[d] > 0)
            .max_by_key(|p| (p.mem_used[d], std::cmp::Reverse(p.slot.index())))
            .is_some_and(|p| p.slot == me)
    }

    /// The background thread's turn: evicts what the agent asks for, if anything.
    pub(crate) fn tick(&self, cuda: &CudaTable) {
        self.devices.refresh_if_changed();
        if !self.ranges.on() {
            return;
        }
        let need = |dev: Dev, evicted: u64| -> Option<u64> {
            if !self.devices.evict_asked(dev) || !self.mover(dev) {
                return None;
            }
            let request = self.devices.elastic_request(dev)?;
            let resident = self.usage().container_used(dev.id).saturating_sub(evicted);
            Some(resident.saturating_sub(request))
        };
        match self.ranges.evict(cuda, need) {
            Pass::Failed(e) => log!(
                Level::Warn,
                "elastic: an eviction failed ({e:?}); nothing moved, tried again later"
            ),
            Pass::Moved(n) => log!(Level::Debug, "elastic: {n} bytes moved to host memory"),
            Pass::Nothing | Pass::Busy => {}
        }
    }

    pub(super) fn lock(&self) -> &Lock<Inner> {
        self.ranges.lock()
    }

    pub(super) fn reset(&self) {
        self.ranges.reset();
    }
}

#[cfg(test)]
mod tests;

//! The driver's figure is the last word on memory: this process's charge is reconciled with what NVML says it
//! holds (`usedGpuMemory`), so memory a path the hooks do not model takes is charged too.
//!
//! - **Near the cap** (an admission that would leave less than [`margin`] = max(10 % of the cap, 256 MiB)
//!   under it) the ledger is never trusted alone: the process's overhead (`used − ledger`) is re-measured
//!   first and the admission refused if the driver's figure leaves no room. Far from the cap the admission
//!   costs nothing more (the region's sum it already takes tells how near it is).
//! - **First use** (lazy loading: a module's or library's code and globals, taken by the driver at
//!   `cuModuleGetFunction`, `cuModuleGetGlobal`, `cuLibraryGetModule`, `cuLibraryGetGlobal`,
//!   `cuKernelGetFunction` or the first launch of a kernel, and the stack the driver grows at a launch of a
//!   kernel with large local memory): refused up front while the container is over its cap; what it may take
//!   (the stack growth, its image's footprint: `memory::image`) reserved against the cap before the call, and
//!   settled by NVML's figure after it — or, without one, kept (the footprint once per image and context, an
//!   unknown image's drop in the driver's free memory). Only while a memory limit applies.
//!
//! Staleness bound: an unmodelled path's bytes `U` are charged at the latest by the next admission near the
//! cap (or the next `cuMemGetInfo` near the cap): while the container stays out of the margin, it holds at
//! most `cap − margin + U`, so the cap is exceeded by at most `max(0, U − margin)`; lazy loads and launch-time
//! stack growth are charged before the call that took them returns.

use super::overhead::{Figure, Image, STACK};
use super::{Memory, OverCap};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::CUresult;
use crate::locks::{Lock, Side};
use crate::log::{log, Level};
use cuquota_core::region::layout::MAX_DEVICES;
use std::cell::Cell;
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The smallest margin under the cap within which admissions reconcile first.
pub(crate) const MIN_MARGIN: u64 = 256 << 20;

/// Bytes left under `cap` below which an admission does not trust the ledger alone.
#[inline]
pub(crate) fn margin(cap: u64) -> u64 {
    (cap / 10).max(MIN_MARGIN)
}

/// Whether an admission that brought the container to `used` under `cap` is near the cap.
#[inline]
pub(crate) fn near_cap(cap: u64, used: u64) -> bool {
    cap.saturating_sub(used) < margin(cap)
}

/// How a handle was used: a handle looked up (a function, module, global) is launched for the first time later.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Use {
    /// Returned by a lookup (`cuModuleGetFunction`, `cuLibraryGetGlobal`, …).
    Lookup,
    /// Launched.
    Launch,
    /// A graph exec launched (its kernel nodes' code and stack are taken at its first launch).
    Graph,
}

type Seen = HashSet<(Use, usize, usize), BuildHasherDefault<super::ledger::KeyHasher>>;

/// A seen-set answer a thread keeps: `(how, h, ctx)` was in the set of the `FirstUse` whose generation is
/// `generation`. Generations come from one process-wide counter, so no two sets (or epochs of one set) share one.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Cached {
    how: Use,
    h: usize,
    ctx: usize,
    generation: u64,
}

const CACHE_WAYS: usize = 16;
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Each thread's direct-mapped cache of seen-set hits (generation 0 never matches).
    static SEEN_CACHE: [Cell<Cached>; CACHE_WAYS] = const {
        [const { Cell::new(Cached { how: Use::Lookup, h: 0, ctx: 0, generation: 0 }) }; CACHE_WAYS]
    };
}

thread_local! {
    /// How many first uses this thread has begun and not ended (it holds the gate while above 0).
    static GATE_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Shards of the seen set (a launch takes one shard's lock, never a process-wide one).
const SHARDS: usize = 16;

/// Handles whose first use was measured, keyed by (how, handle, context): functions launched or looked up,
/// modules, globals. A kernel's first launch in each context is its own (code and stack are per context). And
/// what reconciliations added to the overhead.
pub(crate) struct FirstUse {
    /// A module or library was loaded: first uses may take memory from now on.
    armed: AtomicBool,
    /// This set's generation, new whenever something is removed: threads' cached answers carry it.
    generation: AtomicU64,
    /// Handles returned by lookups, and handles launched (apart: a function looked up is launched later).
    seen: [Lock<Seen>; SHARDS],
    /// The refusal for want of this process in NVML's list was logged.
    unlisted_said: AtomicBool,
    /// Per device entry: what the last reconciliation added to the overhead the last measurement set (the
    /// floor a reconciliation never goes below).
    excess: [AtomicU64; MAX_DEVICES],
    /// Held by a thread from a first use's admission across its driver call to its measurement (see [`Gate`]);
    /// it guards no data, so `fork` does not take it: a forked child lets it go (`forked_child`).
    gate: Lock<()>,
}

/// One lookup of an image of unknown footprint at a time in this process: its size is unknown until it is
/// measured, so one admitted while another is in flight could pass the cap by both. Never held across a launch
/// (a launch may wait on the program). Reentrant on one thread; not `Send` (the depth is the thread's).
pub(crate) struct Gate<'a> {
    first_use: &'a FirstUse,
    _thread: PhantomData<*const ()>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        GATE_DEPTH.with(|d| {
            let n = d.get() - 1;
            d.set(n);
            if n == 0 {
                // SAFETY: taken with `hold` by this thread when its depth left 0 (`FirstUse::enter`).
                unsafe { self.first_use.gate.release(Side::Parent) };
            }
        });
    }
}

impl Default for FirstUse {
    fn default() -> Self {
        FirstUse {
            armed: AtomicBool::new(false),
            generation: AtomicU64::new(GENERATIONS.fetch_add(1, Ordering::Relaxed)),
            unlisted_said: AtomicBool::new(false),
            seen: std::array::from_fn(|_| Lock::default()),
            excess: std::array::from_fn(|_| AtomicU64::new(0)),
            gate: Lock::new(()),
        }
    }
}

impl FirstUse {
    /// A module or library was loaded.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Whether a first use may take memory (a module or library was loaded). One relaxed load.
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// Waits for the gate (unless this thread holds it already).
    fn enter(&self) -> Gate<'_> {
        GATE_DEPTH.with(|d| {
            if d.get() == 0 {
                self.gate.hold();
            }
            d.set(d.get() + 1);
        });
        Gate {
            first_use: self,
            _thread: PhantomData,
        }
    }

    #[inline]
    fn shard(&self, h: usize, ctx: usize) -> &Lock<Seen> {
        let k = (h ^ ctx.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.seen[(k >> 60) % SHARDS]
    }

    /// Whether `h` was used as `how` in context `ctx` already. Every launch under a memory cap asks: answered
    /// from the thread's own cache of what the set held in this generation when it can be, else from the set.
    #[cfg(test)]
    fn seen(&self, how: Use, h: usize, ctx: usize) -> bool {
        self.seen_at(how, h, ctx).is_some()
    }

    /// [`FirstUse::seen`], with the generation it was seen in (a forget after it voids the answer).
    #[inline]
    pub(crate) fn seen_at(&self, how: Use, h: usize, ctx: usize) -> Option<u64> {
        // Read before the set: a forget that removes after this load also bumps after it (see `forgotten`).
        let generation = self.generation.load(Ordering::Acquire);
        let i = ((h ^ ctx.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) % CACHE_WAYS;
        let want = Cached {
            how,
            h,
            ctx,
            generation,
        };
        if SEEN_CACHE.with(|c| c[i].get() == want) {
            return Some(generation);
        }
        self.seen_slow(want, i).then_some(generation)
    }

    #[inline(never)]
    fn seen_slow(&self, want: Cached, i: usize) -> bool {
        let Cached { how, h, ctx, .. } = want;
        let seen = self.shard(h, ctx).lock().contains(&(how, h, ctx));
        if seen {
            SEEN_CACHE.with(|c| c[i].set(want));
        }
        seen
    }

    /// Something is removed from the set: called before the removal (a use that began before it is not recorded
    /// after it, see `first`) and after (every thread's cached answers are void).
    fn forgotten(&self) {
        self.generation
            .store(GENERATIONS.fetch_add(1, Ordering::Relaxed), Ordering::Release);
    }

    /// The set's generation now: what a use reads before its call, for [`FirstUse::first`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records `h` used as `how` in context `ctx` by a call that began at generation `since`; true when it was
    /// not recorded before. Nothing is recorded when something was forgotten since (a module unloaded while
    /// the call ran: `h` may name code never measured by the time it would be found).
    pub(crate) fn first(&self, how: Use, h: usize, ctx: usize, since: u64) -> bool {
        let mut set = self.shard(h, ctx).lock();
        // Under the shard's lock: a forget bumps before it clears this shard, so either this sees the bump or
        // the clear comes after this insert.
        if self.generation() != since {
            return true;
        }
        set.insert((how, h, ctx))
    }

    /// Forgets handle `h` used as `how` in every context (a graph exec updated or destroyed: its next launch, or
    /// an exec at its address, runs other kernels). Cold: a scan of every shard.
    pub(crate) fn forget(&self, how: Use, h: usize) {
        self.forgotten();
        for s in self.seen.iter() {
            s.lock().retain(|&(u, x, _)| !(u == how && x == h));
        }
        self.forgotten();
    }

    /// Forgets every handle (a module or library was unloaded: its handles' addresses may be reused by code
    /// that was never measured). Bounded: the set holds only what was used since the last unload.
    pub(crate) fn forget_all(&self) {
        self.forgotten();
        for s in self.seen.iter() {
            s.lock().clear();
        }
        self.forgotten();
    }

    pub(super) fn set_excess(&self, dev: Dev, bytes: u64) {
        self.excess[dev.id.index()].store(bytes, Ordering::Relaxed);
    }

    fn excess(&self, dev: Dev) -> u64 {
        self.excess[dev.id.index()].load(Ordering::Relaxed)
    }

    /// Forgets everything (a forked child).
    pub(super) fn reset(&self) {
        for e in self.excess.iter() {
            e.store(0, Ordering::Relaxed);
        }
        self.forget_all();
    }

    pub(super) fn locks(&self) -> &[Lock<Seen>; SHARDS] {
        &self.seen
    }

    /// A forked child: the gate is let go if a parent thread held it (it guards no data, so `fork` need not wait
    /// for it: a first use in flight holds it across a driver call). The forking thread's own first use, if a
    /// signal handler forked in it, ends in the child and lets it go then.
    ///
    /// # Safety
    /// In a forked child's only thread.
    pub(super) unsafe fn forked_child(&self) {
        if GATE_DEPTH.with(|d| d.get()) == 0 {
            // SAFETY: the child's only thread, which holds no gate (the caller's contract, its depth).
            unsafe { self.gate.reset_in_child() };
        }
    }
}

impl Memory {
    /// Whether a launch may take memory at first use: a module or library was loaded and a memory limit
    /// applies somewhere (as of the launch hook's refresh of the limits). Two relaxed loads.
    #[inline]
    pub(crate) fn first_use_armed(&self) -> bool {
        self.first_use.armed() && self.devices.memory_limited()
    }

    /// Whether handle `h` was used as `how` in context `ctx` already: the set's generation then (a call whose
    /// generation changed while it ran may have been a first use again: see [`Memory::first_use_generation`]).
    #[inline]
    pub(crate) fn seen(&self, how: Use, h: usize, ctx: usize) -> Option<u64> {
        self.first_use.seen_at(how, h, ctx)
    }

    /// Handle `h` no longer stands for what was used as `how` (see [`FirstUse::forget`]).
    pub(crate) fn forget_use(&self, how: Use, h: usize) {
        self.first_use.forget(how, h);
    }

    /// Whether handle `h` is used as `how` for the first time in context `ctx` by a call that began at
    /// generation `since` ([`Memory::first_use_generation`]); then recorded (see [`FirstUse::first`]).
    pub(crate) fn first_seen(&self, how: Use, h: usize, ctx: usize, since: u64) -> bool {
        self.first_use.first(how, h, ctx, since)
    }

    /// What a first use reads before its call, for [`Memory::first_seen`].
    pub(crate) fn first_use_generation(&self) -> u64 {
        self.first_use.generation()
    }

    /// What `cuMemGetInfo` of `dev` capped at `cap` reports used: the container's charge, which near the cap is
    /// first reconciled with the driver's figure (the ledger alone is not trusted there).
    #[inline]
    pub(crate) fn info_used(&self, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        let (used, held) = self.usage().container_used_held(dev.id);
        if near_cap(cap, used) {
            return self.info_used_slow(nvml, dev, cap);
        }
        held
    }

    #[cold]
    #[inline(never)]
    fn info_used_slow(&self, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        if self.near_cap_without_credit(dev, cap) {
            let _ = self.reconcile(nvml, dev, cap, 0);
        }
        self.container_held(dev)
    }

    /// Whether the container is near `cap` on `dev` by what its processes hold: credit others charged ahead
    /// (idle processes' included) is taken back first, so it never makes anyone ask the driver.
    fn near_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        let (used, held) = self.usage().container_used_held(dev.id);
        if used != held {
            self.usage().drain_all_credit(dev.id);
        }
        near_cap(cap, self.container_used(dev))
    }

    /// An admission of `bytes` on `dev` that brought the container to `used` under `cap`: near the cap the
    /// driver's figure decides, not the ledger alone. `Err`: refused (its charge given back).
    #[inline]
    pub(super) fn near_cap_check(
        &self,
        nvml: &Nvml,
        dev: Dev,
        bytes: u64,
        cap: u64,
        used: u64,
    ) -> Result<(), OverCap> {
        if near_cap(cap, used) {
            return self.near_cap_slow(nvml, dev, bytes, cap);
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn near_cap_slow(&self, nvml: &Nvml, dev: Dev, bytes: u64, cap: u64) -> Result<(), OverCap> {
        if !self.near_cap_without_credit(dev, cap) {
            return Ok(());
        }
        let r = self.reconcile(nvml, dev, cap, bytes);
        if r.is_err() {
            self.release(dev, bytes);
            self.usage().count_refusal(dev.id);
        }
        r
    }

    /// Reconciles this process's overhead on `dev` with NVML's figure, `pending` bytes of its ledger not yet
    /// handed out by the driver (the admission being made); then whether the container fits under `cap`.
    /// Without an NVML figure nothing is changed (the ledger is all there is).
    pub(super) fn reconcile(&self, nvml: &Nvml, dev: Dev, cap: u64, pending: u64) -> Result<(), OverCap> {
        // Near the cap the charge is exact: no credit taken from without the driver's figure.
        self.give_back_credit(dev);
        let figure = self.nvml_figure(nvml, dev);
        self.reconcile_to(nvml, dev, cap, pending, figure)
    }

    /// [`Memory::reconcile`] with NVML's figure for this process already taken.
    fn reconcile_to(
        &self,
        nvml: &Nvml,
        dev: Dev,
        cap: u64,
        pending: u64,
        figure: Figure,
    ) -> Result<(), OverCap> {
        let lingering = self.lingering(dev); // before the overhead lock, as in `measure`
        let _g = self.overhead_lock.lock();
        let used = match figure {
            Figure::Used(u) => u,
            Figure::NoNvml => return Ok(()),
            Figure::NotListed => return self.not_listed(dev),
        };
        let ledger = self
            .allocated(dev)
            .saturating_sub(pending)
            .saturating_add(lingering);
        // Never below what the last measurement (a context or module event) set: allocations admitted but not
        // yet made, and frees made but not yet uncharged, on other threads make the driver's figure read low for
        // an instant. Above it, each reconciliation replaces the last one's excess (so one that caught a
        // charge still being settled is corrected by the next).
        let base = self.overhead(dev).saturating_sub(self.first_use.excess(dev));
        let target = (used.saturating_sub(ledger) + self.holdings.inflight(dev)).max(base);
        if self.set_overhead_locked(dev, target, false).is_ok() {
            self.first_use.set_excess(dev, target - base);
        }
        let total = self.container_used(dev);
        log!(
            Level::Debug,
            "device {}: reconciled near the cap: driver says {used} bytes, overhead {target}, container {total} \
             of {cap}",
            dev.ordinal
        );
        // Over the cap: every process's credit is taken back (none of it may be spent without this check), and
        // the container counted again without it.
        if total > cap && self.over_cap_without_credit(dev, cap) {
            return Err(OverCap);
        }
        // The container's processes each reconcile only themselves: what another one holds past the shim is
        // seen here only in the driver's figure for the whole container (its live processes' `usedGpuMemory`).
        match self.container_figure(nvml, dev) {
            Some(all) if all.saturating_add(pending) > cap => {
                self.usage().drain_all_credit(dev.id);
                log!(
                    Level::Debug,
                    "device {}: the driver says the container holds {all} bytes: {pending} more do not fit in {cap}",
                    dev.ordinal
                );
                Err(OverCap)
            }
            _ => Ok(()),
        }
    }

    /// Whether the container is over `cap` on `dev` once every process's credit was taken back.
    #[cold]
    fn over_cap_without_credit(&self, dev: Dev, cap: u64) -> bool {
        self.usage().drain_all_credit(dev.id);
        self.container_used(dev) > cap
    }

    /// What NVML says the container's live processes hold on `dev` (each listed process that is a member). Slow
    /// path: near the cap only.
    fn container_figure(&self, nvml: &Nvml, dev: Dev) -> Option<u64> {
        let uuid = self.devices.uuid_of(dev.ordinal)?;
        let list = nvml.processes(&uuid)?;
        let own = [std::process::id(), self.host.get().unwrap_or(0)];
        Some(
            list.iter()
                .filter(|p| self.devices.is_member(p.pid, &own))
                .map(|p| p.usedGpuMemory)
                .sum(),
        )
    }

    /// Near the cap, NVML answers but does not list this process (its host pid unknown or ambiguous): the
    /// ledger alone is not trusted there, so the admission is refused (said once per process).
    #[cold]
    fn not_listed(&self, dev: Dev) -> Result<(), OverCap> {
        if !self.first_use.unlisted_said.swap(true, Ordering::Relaxed) {
            log!(
                Level::Warn,
                "device {}: near the memory cap, and NVML does not list this process (its host pid is unknown: a \
                 pid namespace whose host pid could not be learned); allocations near the cap are refused until \
                 it is listed",
                dev.ordinal
            );
        }
        Err(OverCap)
    }

    /// Before a call that may make the driver take memory at first use on `dev` (lazy loading, launch-time
    /// stack growth): what it will take is reserved against the cap first, `Err` (refuse it with
    /// `CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked) while the container is over its cap or the
    /// reservation does not fit: `what.stack` bytes of stack growth and the whole footprint of the image it
    /// loads from (`what.image`; any single first use takes at most that). An image of unknown footprint
    /// reserves nothing: a lookup of one holds the gate across its call (one such load at a time, measured
    /// after), a launch never does (it may block on the program). `Ok(Some(_))`: pass it to
    /// [`Memory::first_use_done`] once the call returned; `Ok(None)`: no cap.
    pub(crate) fn first_use_begin(
        &self,
        cuda: &CudaTable,
        dev: Dev,
        what: FirstUseOf,
    ) -> Result<Option<FirstUseCall<'_>>, OverCap> {
        let Some(cap) = self.limit(dev) else {
            return Ok(None);
        };
        let known = what.image.and_then(|i| i.bytes);
        let gate = (known.is_none() && what.lookup).then(|| self.first_use.enter());
        if self.container_used(dev) > cap && self.over_cap_without_credit(dev, cap) {
            log!(
                Level::Debug,
                "device {}: over the cap: a call that may load code or globals is refused",
                dev.ordinal
            );
            self.usage().count_refusal(dev.id);
            return Err(OverCap);
        }
        let reserved = what.stack.saturating_add(known.unwrap_or(0));
        if self.growing(dev, reserved).is_err() {
            log!(
                Level::Debug,
                "device {}: a first use that may take {reserved} bytes does not fit under the cap: refused",
                dev.ordinal
            );
            self.usage().count_refusal(dev.id);
            return Err(OverCap);
        }
        Ok(Some(FirstUseCall {
            dev,
            what,
            reserved,
            // The driver's free memory is the current context's device's: a delta only where that is `dev`.
            free_before: gate
                .as_ref()
                .filter(|_| self.devices.current(cuda) == Some(dev))
                .and_then(|_| free_on(cuda)),
            _gate: gate,
        }))
    }

    /// A call that has taken memory at first use on `dev` unadmitted (a launch during which the seen set forgot
    /// its context's code): measured ([`Memory::first_use_done`]). `None`: no cap on `dev`.
    pub(crate) fn first_use_watch(&self, dev: Dev) -> Option<FirstUseCall<'_>> {
        self.limit(dev)?;
        Some(FirstUseCall {
            dev,
            what: FirstUseOf::default(),
            reserved: 0,
            free_before: None,
            _gate: None,
        })
    }

    /// The call [`Memory::first_use_begin`] let through returned `r`; `fresh`: the handle it used or gave was
    /// new. With NVML's figure the charge is settled to it (the reservation was an estimate). Without one (no
    /// NVML, an error, this process unlisted) the reservation stays charged once per image and context (a
    /// later first use of that image there gives its reservation back), the stack growth always; a first use
    /// of an unknown image is charged what the driver's free memory fell by across the call.
    pub(crate) fn first_use_done(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        c: FirstUseCall<'_>,
        r: CUresult,
        fresh: bool,
    ) {
        let FirstUseCall {
            dev,
            what,
            reserved,
            free_before,
            _gate,
        } = c;
        let ordinal = dev.ordinal;
        let (key, bytes) = what.image.map_or((0, None), |i| (i.key, i.bytes));
        if !(fresh || reserved > 0) {
            return;
        }
        self.give_back_credit(dev);
        let figure = self.nvml_figure(nvml, dev);
        let took = match (bytes, free_before) {
            (Some(b), _) => b,
            (None, Some(before)) => before.saturating_sub(free_on(cuda).unwrap_or(before)),
            (None, None) => {
                if !measured_now(&figure) && r.ok() {
                    log!(
                        Level::Warn,
                        "device {}: a first use of an image of unknown size could not be measured (no NVML figure, \
                         another device current): not charged",
                        dev.ordinal
                    );
                }
                0
            }
        };
        // Kept for the estimate without NVML, whatever NVML says now (it may fail later).
        let (mut kept, measured) = (0, measured_now(&figure));
        if r.ok() {
            kept += self
                .holdings
                .charge_lazy(STACK, what.ctx, ordinal, what.stack, true);
            // An image's footprint once per context; what an unknown one was measured to take, every time.
            kept += self
                .holdings
                .charge_lazy(key, what.ctx, ordinal, took, bytes.is_none());
        }
        if reserved > 0 && measured {
            let used = match figure {
                Figure::Used(u) => Some(u),
                _ => None,
            };
            let _ = self.grown_to(nvml, dev, reserved, r, None::<fn() -> CUresult>, used);
        } else if measured {
            if let Some(cap) = self.limit(dev) {
                let _ = self.reconcile_to(nvml, dev, cap, 0, figure);
            }
        } else {
            // No figure: the reservation goes, what is kept stays (never admitted: the next admission is).
            let _g = self.overhead_lock.lock();
            self.holdings.settle_inflight(dev, reserved);
            let now = self.overhead(dev).saturating_sub(reserved).saturating_add(kept);
            let _ = self.set_overhead_locked(dev, now, false);
            if kept > 0 {
                log!(
                    Level::Debug,
                    "device {}: a first use charged {kept} bytes without an NVML figure",
                    dev.ordinal
                );
            }
        }
    }
}

/// What a first use may take, for [`Memory::first_use_begin`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FirstUseOf {
    /// Launch-time stack growth.
    pub stack: u64,
    /// The image it may load code and globals from (`None`: unknown; a launch of a loaded function: key 0,
    /// footprint 0).
    pub image: Option<Image>,
    /// The context it loads into (a module's own: 0).
    pub ctx: usize,
    /// A lookup (may hold the gate: it never waits on the program), not a launch.
    pub lookup: bool,
}

fn measured_now(f: &Figure) -> bool {
    matches!(f, Figure::Used(_))
}

/// The device's free memory as the driver says (the current context's device).
fn free_on(cuda: &CudaTable) -> Option<u64> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe { cuda.cuMemGetInfo_v2(&mut free, &mut total) }
        .ok()
        .then_some(free as u64)
}

/// A first-use call let through by [`Memory::first_use_begin`]: holds its reservation (and for a lookup of an
/// unknown image the gate) until it is done.
#[must_use = "end it with first_use_done"]
pub(crate) struct FirstUseCall<'a> {
    dev: Dev,
    what: FirstUseOf,
    reserved: u64,
    free_before: Option<u64>,
    _gate: Option<Gate<'a>>,
}

impl FirstUseCall<'_> {
    /// The device it may take memory on.
    pub(crate) fn dev(&self) -> Dev {
        self.dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_handle_is_not_seen_from_any_threads_cache() {
        let f = FirstUse::default();
        let other = FirstUse::default();
        assert!(f.first(Use::Launch, 0x1000, 7, f.generation()));
        assert!(f.seen(Use::Launch, 0x1000, 7));
        assert!(f.seen(Use::Launch, 0x1000, 7), "a cached hit");
        assert!(!f.seen(Use::Launch, 0x1000, 8), "another context");
        assert!(!f.seen(Use::Graph, 0x1000, 7), "another use");
        assert!(!other.seen(Use::Launch, 0x1000, 7), "another set");
        std::thread::scope(|sc| {
            let (ask, answer) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel());
            let f = &f;
            sc.spawn(move || {
                for _ in 0..3 {
                    answer.0.send(f.seen(Use::Launch, 0x1000, 7)).unwrap();
                    ask.1.recv().unwrap();
                }
                answer.0.send(f.seen(Use::Launch, 0x1000, 7)).unwrap();
            });
            assert!(answer.1.recv().unwrap(), "the thread caches it");
            f.forget(Use::Launch, 0x1000);
            ask.0.send(()).unwrap();
            assert!(
                !answer.1.recv().unwrap(),
                "forgotten, though the thread had it cached"
            );
            assert!(f.first(Use::Launch, 0x1000, 7, f.generation()));
            ask.0.send(()).unwrap();
            assert!(answer.1.recv().unwrap(), "seen again, cached again");
            f.forget_all();
            ask.0.send(()).unwrap();
            assert!(!answer.1.recv().unwrap(), "forgotten by forget_all");
        });
        assert!(!f.seen(Use::Launch, 0x1000, 7));
    }

    #[test]
    fn a_use_that_began_before_a_forget_is_not_recorded() {
        let f = FirstUse::default();
        let since = f.generation();
        f.forget_all();
        assert!(f.first(Use::Launch, 0x1000, 7, since), "first");
        assert!(!f.seen(Use::Launch, 0x1000, 7), "recorded after the forget");
        assert!(f.first(Use::Launch, 0x1000, 7, f.generation()));
        assert!(f.seen(Use::Launch, 0x1000, 7));
    }

    #[test]
    fn the_gate_is_reentrant_on_a_thread_and_exclusive_across_threads() {
        let f = FirstUse::default();
        let outer = f.enter();
        let inner = f.enter();
        std::thread::scope(|sc| {
            let other = sc.spawn(|| f.gate.try_lock().is_some());
            assert!(!other.join().unwrap(), "held by this thread");
            drop(inner);
            let other = sc.spawn(|| f.gate.try_lock().is_some());
            assert!(!other.join().unwrap(), "still held by the outer use");
            drop(outer);
            let other = sc.spawn(|| {
                let _g = f.enter();
                GATE_DEPTH.with(|d| d.get())
            });
            assert_eq!(other.join().unwrap(), 1, "free once every use ended");
        });
        assert!(f.gate.try_lock().is_some());
    }

    #[test]
    fn margin_is_a_tenth_or_256_mib() {
        const M: u64 = 1 << 20;
        assert_eq!(margin(1024 * M), 256 * M);
        assert_eq!(margin(10 * 1024 * M), 1024 * M);
        assert_eq!(margin(100 * M), 256 * M);
        assert!(!near_cap(1024 * M, 700 * M));
        assert!(near_cap(1024 * M, 800 * M));
        assert!(near_cap(1024 * M, 2048 * M));
    }
}

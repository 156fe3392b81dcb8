//! What the driver charges a process beyond its allocations: contexts and loaded modules.
//!
//! A context costs hundreds of MiB of device memory (more on large GPUs) and every loaded module some more; none
//! of it goes through an allocation call. After each context creation / primary-context retain / module or
//! library load (and after each destroy / release / reset / unload) we ask NVML for this process's
//! `usedGpuMemory` on that device (`nvmlDeviceGetComputeRunningProcesses_v3`, device found by UUID) and charge
//! `used − bytes our ledger holds` as this process's overhead there. Growth on a creation path is admitted
//! against the cap: a context that alone would exceed it is refused (the hook destroys it, a module or library
//! is unloaded here, and the call returns `CUDA_ERROR_OUT_OF_MEMORY`). Hooks call one door,
//! [`Overhead::call`] (creations, loads, unloads, destroys, releases, limits); a creation holds its
//! estimate in the [`Creating`] guard.
//!
//! NVML can only measure a context or module once the driver has created it, so each creation first reserves an
//! estimate as overhead ([`Overhead::creating`]): the last cost measured for that kind on that device in
//! this process, else [`CTX_ESTIMATE`] / [`MODULE_ESTIMATE`]. A reservation that does not fit refuses the
//! creation before the driver is called; while creations are in flight their reservations stay charged on top
//! of what NVML measures, and the measurement after the call settles the charge to the truth.
//!
//! In a pid namespace NVML lists host pids, not ours: we are found by the host pid `host_pid` learns.
//! Without NVML (library missing, or our pid not in its list and the host pid not learned) the overhead is
//! estimated: [`CTX_ESTIMATE`] per live context and [`MODULE_ESTIMATE`] per loaded module/library.

use super::driver::Processes;
use super::host_pid::HostPid;
use super::{stack, usage_ok, OverCap, PerDevice};
use crate::devices::{Dev, Devices, MAX_ORDINALS};
use crate::driver::cuda::CudaTable;
use crate::ffi::cuda::*;
use crate::locks::{hold_all, release_all, Lock, Side};
use crate::log::{log, Level};
use cuquota_core::region::layout::MAX_DEVICES;
use parking_lot::MutexGuard;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Estimated device memory of one context when NVML cannot measure it.
pub(crate) const CTX_ESTIMATE: u64 = 256 << 20;
/// Estimated device memory of one loaded module or library when NVML cannot measure it.
pub(crate) const MODULE_ESTIMATE: u64 = 2 << 20;

/// What this process holds per ordinal, for the estimate and to find the device of a destroyed object.
struct Holdings {
    ctxs: [AtomicI64; MAX_ORDINALS],
    primary: [AtomicI64; MAX_ORDINALS],
    modules: AtomicI64,
    /// context handle → ordinal (cuCtxCreate*), module handle → ordinal.
    owners: Lock<HashMap<usize, CUdevice>>,
    /// Per device entry: estimates reserved for creations the driver has not returned from yet.
    inflight: [AtomicU64; MAX_DEVICES],
    /// Per ordinal: the last measured cost of a context and of a module (0: none measured yet).
    learned_ctx: [AtomicU64; MAX_ORDINALS],
    learned_module: [AtomicU64; MAX_ORDINALS],
    /// Per ordinal: a context we never saw created was measured ([`Overhead::adopt_unseen`]).
    unseen_measured: [AtomicBool; MAX_ORDINALS],
    /// Module or library handle → what its image takes at first uses ([`Image`]).
    images: Lock<HashMap<usize, Image>>,
    /// What first uses took (or were estimated to take) per (image key or [`STACK`], context): charged once
    /// each, part of the estimate without NVML (`lazy_sum`), dropped with the module or context.
    lazy: Lock<HashMap<(usize, usize), (CUdevice, u64)>>,
    lazy_sum: [AtomicU64; MAX_ORDINALS],
}

/// The key under which a context's stack growth is kept in [`Holdings`]' first-use charges.
pub(crate) const STACK: usize = usize::MAX;

/// A loaded module's or library's image: what its first uses in a context may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Image {
    /// The module or library whose memory it is (a library's modules share its key).
    pub key: usize,
    /// Its footprint in one context (`memory::image`, plus a module's own cost for a library: loaded into each
    /// context at its first use there); `None`: unknown.
    pub bytes: Option<u64>,
}

/// What a hook is about to create ([`Overhead::creating`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Creation {
    /// A context on this ordinal (cuCtxCreate*).
    Context(CUdevice),
    /// A retain of this ordinal's primary context (only the first one creates it).
    Primary(CUdevice),
    /// A module loaded into the current context.
    Module,
}

impl Creation {
    /// Whether it is a context (its estimate and learned cost are a context's, else a module's).
    fn is_context(self) -> bool {
        !matches!(self, Creation::Module)
    }
}

/// An estimate reserved for one creation.
#[derive(Debug)]
struct Reserved {
    dev: Dev,
    est: u64,
    /// This process's measured overhead on the device when the reservation was made.
    base: u64,
}

/// A creation admitted by [`Overhead::creating`]: holds its estimate as overhead across the driver's call
/// ([`Creating::call`]); [`Creating::created`] counts and measures what the driver made. Dropped without it
/// (the call failed, or gave no handle), the estimate goes back and the charge is re-measured.
#[must_use = "hold it across the driver call; dropping it gives the estimate back"]
pub(crate) struct Creating<'a> {
    overhead: &'a Overhead,
    others: &'a dyn Others,
    cuda: &'a CudaTable,
    nvml: &'a dyn Processes,
    what: Creation,
    res: Option<Reserved>,
    /// The estimate is still held on top of what NVML measures (the driver has not returned).
    inflight: bool,
    /// [`Creating::created`] measured the creation.
    measured: bool,
}

impl Creating<'_> {
    /// The driver's creating call (a context's teaches this process its host pid: `host_pid`). Once it
    /// returned the estimate stops being held on top of what NVML measures.
    pub(crate) fn call(&mut self, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = match self.what {
            Creation::Context(o) | Creation::Primary(o) => {
                self.overhead.creating_context(self.cuda, self.nvml, o, call)
            }
            Creation::Module => call(),
        };
        self.returned();
        r
    }

    fn returned(&mut self) {
        if let (true, Some(res)) = (std::mem::take(&mut self.inflight), &self.res) {
            self.overhead.settle(res.dev, res.est);
        }
    }

    /// The driver made it (`handle`: the context or module; unused for a primary context): counted and its
    /// cost charged, growth admitted against the cap; the cost is learned for the next estimate. `Err`: over
    /// the cap: the caller undoes the creation (its destroy, release or unload hook uncounts it).
    pub(crate) fn created(mut self, handle: usize) -> Result<(), OverCap> {
        self.returned();
        self.measured = true;
        let (v, o, cuda, nvml) = (self.overhead, self.others, self.cuda, self.nvml);
        match self.what {
            Creation::Context(ordinal) => v.context_created(o, cuda, nvml, handle, ordinal)?,
            Creation::Primary(ordinal) => v.primary_retained(o, cuda, nvml, ordinal)?,
            Creation::Module => v.module_loaded(o, cuda, nvml, handle)?,
        }
        if let Some(res) = &self.res {
            v.learn(res.dev, self.what, res.base);
        }
        Ok(())
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.returned();
        if let (false, Some(res)) = (self.measured, &self.res) {
            // Nothing was created: the estimate goes back.
            let _ = self.overhead.measure(self.others, self.nvml, res.dev, false);
        }
    }
}

impl Default for Holdings {
    fn default() -> Self {
        Holdings {
            ctxs: std::array::from_fn(|_| AtomicI64::new(0)),
            primary: std::array::from_fn(|_| AtomicI64::new(0)),
            modules: AtomicI64::new(0),
            owners: Lock::new(HashMap::new()),
            inflight: std::array::from_fn(|_| AtomicU64::new(0)),
            learned_ctx: std::array::from_fn(|_| AtomicU64::new(0)),
            learned_module: std::array::from_fn(|_| AtomicU64::new(0)),
            unseen_measured: std::array::from_fn(|_| AtomicBool::new(false)),
            images: Lock::new(HashMap::new()),
            lazy: Lock::new(HashMap::new()),
            lazy_sum: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The overhead family's state: what this process charged as overhead per device entry, the lock that
/// serialises its re-measurements, the contexts and modules it holds, and the host pid NVML knows it by. The
/// usage file and the cap come from its own `Devices`; what a measurement subtracts (allocations, lingering
/// exports) and what a charge must publish (HAMi's file, a reconciliation's excess) stay with the caller.
pub(super) struct Overhead {
    devices: Arc<Devices>,
    /// Overhead this process has charged, per device entry.
    charged: PerDevice,
    /// Serialises overhead re-measurements (slow path only).
    lock: Lock<()>,
    /// Contexts and modules this process holds (overhead estimate, owner devices).
    holdings: Holdings,
    /// The pid NVML knows this process by.
    host: HostPid,
}

impl Overhead {
    pub(super) fn new(devices: Arc<Devices>) -> Overhead {
        Overhead {
            charged: std::array::from_fn(|_| AtomicU64::new(0)),
            lock: Lock::new(()),
            holdings: Holdings::default(),
            host: HostPid::new(devices.clone()),
            devices,
        }
    }

    /// The charged bytes per device entry (allocations publish them with their own to HAMi's file).
    #[inline(always)]
    pub(super) fn charged(&self) -> &PerDevice {
        &self.charged
    }

    /// Overhead this process has charged on `dev`.
    #[inline(always)]
    pub(super) fn of(&self, dev: Dev) -> u64 {
        self.charged[dev.id.index()].load(Ordering::Relaxed)
    }

    /// Takes the re-measurement lock: [`Overhead::set`] is called under it.
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// The host pid NVML knows this process by.
    #[inline(always)]
    pub(super) fn host(&self) -> &HostPid {
        &self.host
    }

    /// Runs a context-creating driver call on `ordinal`, learning the host pid around it when needed.
    pub(super) fn creating_context(
        &self,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ordinal: CUdevice,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let live = |o| self.live_contexts(o) > 0;
        self.host.creating_context(cuda, nvml, ordinal, live, call)
    }

    /// Retries an ambiguous host-pid diff (a module or library was loaded: see [`HostPid::retry`]).
    pub(super) fn retry_host_pid(&self, nvml: &dyn Processes) {
        self.host.retry(nvml, |o| self.live_contexts(o) > 0);
    }

    /// Moves the charge on `dev` to `target` bytes (the caller holds [`Overhead::lock`]). Growth is admitted
    /// against the cap when `admit` is true (creation paths); `Err` = refused, nothing changed. Shrinking
    /// always succeeds.
    pub(super) fn set(&self, dev: Dev, target: u64, admit: bool) -> Result<(), OverCap> {
        let usage = self.devices.usage();
        let cur = self.of(dev);
        if target > cur {
            let delta = target - cur;
            let slot = usage.process_slot().map_err(|_| OverCap)?;
            let limit = if admit { self.devices.memory_cap(dev) } else { None };
            usage_ok(usage, limit)?;
            usage.charge(slot, dev.id, delta, limit).map_err(|_| OverCap)?;
            if let Err(e) = usage_ok(usage, limit) {
                usage.uncharge(slot, dev.id, delta);
                return Err(e);
            }
        } else if target < cur {
            if let Some(slot) = usage.cached_slot() {
                usage.uncharge(slot, dev.id, cur - target);
            }
        }
        self.charged[dev.id.index()].store(target, Ordering::Relaxed);
        Ok(())
    }

    /// Adds `growth` on `dev` as a reservation in flight (the caller holds [`Overhead::lock`]): admitted
    /// against the cap, kept on top of what measurements find until [`Holdings::settle_inflight`]. The charge
    /// before it, less what was already in flight, is returned (what a creation's cost is learned against).
    pub(super) fn reserve(&self, dev: Dev, growth: u64) -> Result<u64, OverCap> {
        let cur = self.of(dev);
        let base = cur.saturating_sub(self.holdings.inflight(dev));
        self.set(dev, cur.saturating_add(growth), true)?;
        self.holdings.inflight[dev.id.index()].fetch_add(growth, Ordering::Relaxed);
        Ok(base)
    }

    /// Whether an allocation on `d` must first measure a context we never saw created (no context of ours
    /// is live there and none was measured): two relaxed loads, see [`Overhead::adopt_unseen`].
    #[inline(always)]
    pub(super) fn unseen_unmeasured(&self, d: Dev) -> bool {
        if self.holdings.live_contexts(d.ordinal) > 0 {
            return false;
        }
        matches!(self.holdings.unseen_measured.get(d.ordinal as usize), Some(f) if !f.load(Ordering::Relaxed))
    }

    /// Estimates reserved on `dev` for calls the driver has not returned from yet.
    #[inline]
    pub(super) fn inflight(&self, dev: Dev) -> u64 {
        self.holdings.inflight(dev)
    }

    /// A reservation of `bytes` on `dev` is no longer in flight (the caller holds [`Overhead::lock`] or the
    /// charge is re-measured next).
    pub(super) fn settle(&self, dev: Dev, bytes: u64) {
        self.holdings.settle_inflight(dev, bytes);
    }

    /// Live contexts of this process on `ordinal` (a retained primary context counts once).
    #[inline]
    pub(super) fn live_contexts(&self, ordinal: CUdevice) -> i64 {
        self.holdings.live_contexts(ordinal)
    }

    /// The overhead without NVML: an estimate per live context and module, and the first uses charged.
    pub(super) fn estimate(&self, ordinal: CUdevice) -> u64 {
        self.holdings.estimate(ordinal)
    }

    /// What to reserve for creating `what` on `ordinal`: the last measured cost, else the default estimate.
    pub(super) fn creation_estimate(&self, ordinal: CUdevice, what: Creation) -> u64 {
        self.holdings.creation_estimate(ordinal, what)
    }

    /// After a creation of `what` on `dev` was measured: what it cost over `base` (the charge before its
    /// reservation, less others in flight) is the next one's estimate.
    pub(super) fn learn(&self, dev: Dev, what: Creation, base: u64) {
        let now = {
            let _g = self.lock.lock();
            self.of(dev).saturating_sub(self.holdings.inflight(dev))
        };
        let cost = now.saturating_sub(base);
        if cost > 0 {
            if let Some(c) = self.holdings.learned(what).get(dev.ordinal as usize) {
                c.store(cost, Ordering::Relaxed);
            }
        }
    }

    /// A first use of `key` in `ctx` on `ordinal` took `bytes` (see [`Holdings::charge_lazy`]).
    pub(super) fn charge_lazy(
        &self,
        key: usize,
        ctx: usize,
        ordinal: CUdevice,
        bytes: u64,
        accumulate: bool,
    ) -> u64 {
        self.holdings.charge_lazy(key, ctx, ordinal, bytes, accumulate)
    }

    /// Context `ctx` was created on `ordinal`: counted, its owner kept.
    pub(super) fn context_counted(&self, ctx: usize, ordinal: CUdevice) {
        if let Some(c) = self.holdings.ctxs.get(ordinal as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.own(ctx, ordinal);
    }

    /// Context `ctx` on `ordinal` was destroyed: uncounted, its first-use charges dropped.
    pub(super) fn context_uncounted(&self, ctx: usize, ordinal: CUdevice) {
        if let Some(c) = self.holdings.ctxs.get(ordinal as usize) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        self.holdings.drop_lazy(|_, c| c == ctx);
    }

    /// The primary context of `ordinal` was retained.
    pub(super) fn primary_counted(&self, ordinal: CUdevice) {
        if let Some(c) = self.holdings.primary.get(ordinal as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The primary context of `ordinal` was released (`reset`: reset, the count drops to zero).
    pub(super) fn primary_uncounted(&self, ordinal: CUdevice, reset: bool) {
        if let Some(c) = self.holdings.primary.get(ordinal as usize) {
            if reset {
                c.store(0, Ordering::Relaxed);
            } else {
                decrement(c);
            }
        }
    }

    /// Whether creating the primary context of `ordinal` costs anything (this process holds no retain of it).
    pub(super) fn primary_unheld(&self, ordinal: CUdevice) -> bool {
        self.holdings
            .primary
            .get(ordinal as usize)
            .is_some_and(|c| c.load(Ordering::Relaxed) <= 0)
    }

    /// A module or library was loaded.
    pub(super) fn module_counted(&self) {
        self.holdings.modules.fetch_add(1, Ordering::Relaxed);
    }

    /// Module `module` was unloaded: uncounted, its image and first-use charges dropped; its ordinal, when
    /// this process loaded it.
    pub(super) fn module_uncounted(&self, module: usize) -> Option<CUdevice> {
        self.library_uncounted(module);
        self.take_owner(module)
    }

    /// A library was unloaded: uncounted, its image and first-use charges dropped.
    pub(super) fn library_uncounted(&self, library: usize) {
        decrement(&self.holdings.modules);
        self.holdings.image_gone(library);
    }

    /// Context or module `handle` lives on `ordinal`.
    pub(super) fn own(&self, handle: usize, ordinal: CUdevice) {
        self.holdings.owners.lock().insert(handle, ordinal);
    }

    /// The ordinal of context or module `handle`, no longer kept.
    pub(super) fn take_owner(&self, handle: usize) -> Option<CUdevice> {
        self.holdings.owners.lock().remove(&handle)
    }

    /// The ordinal of module `module`, when this process loaded it.
    pub(super) fn owner_of(&self, module: usize) -> Option<CUdevice> {
        self.holdings.owners.lock().get(&module).copied()
    }

    /// Every context this process created and holds.
    pub(super) fn owned_contexts(&self) -> std::collections::HashSet<usize> {
        self.holdings.owners.lock().keys().copied().collect()
    }

    /// Module `module` (a library's, which no load hook saw) lives on `ordinal`; `library`: the library it is
    /// of, whose image it shares.
    pub(super) fn module_on(&self, module: usize, ordinal: CUdevice, library: usize) {
        self.own(module, ordinal);
        let img = self.holdings.images.lock().get(&library).copied();
        if let Some(i) = img {
            self.holdings.images.lock().insert(module, i);
        }
    }

    /// A module (`library` false) or library was loaded from an image whose footprint is `bytes`
    /// (`memory::image`; `None`: unknown). A library is loaded into each context at its first use there: its
    /// module's own cost is part of what that first use takes.
    pub(super) fn image_loaded(&self, handle: usize, library: bool, bytes: Option<u64>) {
        let bytes = bytes.map(|b| b.saturating_add(if library { MODULE_ESTIMATE } else { 0 }));
        self.holdings
            .images
            .lock()
            .insert(handle, Image { key: handle, bytes });
    }

    /// The image of module or library `handle`, when this process saw it loaded.
    pub(super) fn image_of(&self, handle: usize) -> Option<Image> {
        self.holdings.images.lock().get(&handle).copied()
    }

    /// Whether this allocation is the one to measure a context we never saw created on `d` (flag set; see
    /// [`Overhead::unseen_unmeasured`]).
    pub(super) fn unseen_measuring(&self, d: Dev) -> bool {
        self.holdings
            .unseen_measured
            .get(d.ordinal as usize)
            .is_some_and(|f| !f.swap(true, Ordering::Relaxed))
    }

    /// A context we never saw created on `d` is to be measured again (the last measurement was refused, or
    /// this process's contexts there are gone).
    pub(super) fn unseen_unmark(&self, d: Dev) {
        if let Some(f) = self.holdings.unseen_measured.get(d.ordinal as usize) {
            f.store(false, Ordering::Relaxed);
        }
    }

    /// Forgets the parent's charges, contexts, modules and host pid in a forked child.
    pub(super) fn reset(&self) {
        for a in &self.charged {
            a.store(0, Ordering::Relaxed);
        }
        self.holdings.reset();
        self.host.reset();
    }

    /// Takes the family's locks for the fork (after the shared, pool and graph groups).
    pub(super) fn fork_prepare(&self) {
        hold_all([&self.lock]);
        hold_all([&self.holdings.owners]);
        hold_all([&self.host.candidates]);
    }

    /// Undoes [`Overhead::fork_prepare`].
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release(&self, side: Side) {
        // SAFETY: locked by fork_prepare (the caller's contract).
        unsafe {
            release_all([&self.host.candidates], side);
            release_all([&self.holdings.owners], side);
            release_all([&self.lock], side);
        }
    }

    /// Takes the leaf locks (images, first-use charges) for the fork, after every other group.
    pub(super) fn fork_prepare_leaves(&self) {
        self.holdings.fork_prepare_leaves();
    }

    /// Undoes [`Overhead::fork_prepare_leaves`].
    ///
    /// # Safety
    /// Only after `fork_prepare_leaves` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release_leaves(&self, side: Side) {
        // SAFETY: the caller's contract.
        unsafe { self.holdings.fork_release_leaves(side) }
    }
}

/// `c -= 1`, never below 0.
fn decrement(c: &AtomicI64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some((v - 1).max(0)));
}

impl Holdings {
    /// Live contexts of this process on `ordinal` (a retained primary context counts once).
    fn live_contexts(&self, ordinal: CUdevice) -> i64 {
        let o = ordinal as usize;
        self.ctxs.get(o).map_or(0, |c| c.load(Ordering::Relaxed))
            + self
                .primary
                .get(o)
                .map_or(0, |c| (c.load(Ordering::Relaxed) > 0) as i64)
    }

    fn estimate(&self, ordinal: CUdevice) -> u64 {
        let ctxs = self.live_contexts(ordinal).max(0) as u64;
        if ctxs == 0 {
            return 0;
        }
        ctxs * CTX_ESTIMATE
            + self.modules.load(Ordering::Relaxed).max(0) as u64 * MODULE_ESTIMATE
            + self
                .lazy_sum
                .get(ordinal as usize)
                .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// A first use of `key` in `ctx` on `ordinal` took `bytes`: charged once per (key, context), or added up
    /// (`accumulate`: a context's stack growths, measured first uses). Returns what was added.
    fn charge_lazy(&self, key: usize, ctx: usize, ordinal: CUdevice, bytes: u64, accumulate: bool) -> u64 {
        let mut lazy = self.lazy.lock();
        let e = lazy.entry((key, ctx)).or_insert((ordinal, 0));
        let add = if accumulate || e.1 == 0 { bytes } else { 0 };
        e.1 = e.1.saturating_add(add);
        if let Some(c) = self.lazy_sum.get(ordinal as usize) {
            c.fetch_add(add, Ordering::Relaxed);
        }
        add
    }

    /// Drops the first-use charges `gone` selects (a module, library or context went away).
    fn drop_lazy(&self, gone: impl Fn(usize, usize) -> bool) {
        self.lazy.lock().retain(|&(k, c), &mut (o, b)| {
            if gone(k, c) {
                if let Some(s) = self.lazy_sum.get(o as usize) {
                    let _ = s.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                        Some(v.saturating_sub(b))
                    });
                }
                return false;
            }
            true
        });
    }

    /// A module or library went away: its image and its first-use charges.
    fn image_gone(&self, handle: usize) {
        let key = self.images.lock().remove(&handle).map_or(handle, |i| i.key);
        self.images.lock().retain(|_, i| i.key != key);
        self.drop_lazy(|k, _| k == key);
    }

    /// Takes the leaf locks (their holders take no other: images, first-use charges) for the fork, after every
    /// other group.
    fn fork_prepare_leaves(&self) {
        hold_all([&self.images]);
        hold_all([&self.lazy]);
    }

    /// Undoes [`Holdings::fork_prepare_leaves`].
    ///
    /// # Safety
    /// Only after `fork_prepare_leaves` on this thread (or in the child of that thread).
    unsafe fn fork_release_leaves(&self, side: Side) {
        // SAFETY: locked by fork_prepare_leaves (the caller's contract).
        unsafe {
            release_all([&self.lazy], side);
            release_all([&self.images], side);
        }
    }

    /// Forgets the parent's contexts and modules in a forked child.
    fn reset(&self) {
        self.owners.lock().clear();
        for c in self.ctxs.iter().chain(self.primary.iter()) {
            c.store(0, Ordering::Relaxed);
        }
        self.modules.store(0, Ordering::Relaxed);
        self.drop_lazy(|_, _| true);
        for m in self.unseen_measured.iter() {
            m.store(false, Ordering::Relaxed);
        }
        for c in self.inflight.iter() {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// A reservation of `bytes` on `dev` is no longer in flight.
    fn settle_inflight(&self, dev: Dev, bytes: u64) {
        let _ = self.inflight[dev.id.index()].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
    }

    fn inflight(&self, dev: Dev) -> u64 {
        self.inflight[dev.id.index()].load(Ordering::Relaxed)
    }

    fn learned(&self, what: Creation) -> &[AtomicU64; MAX_ORDINALS] {
        if what.is_context() {
            &self.learned_ctx
        } else {
            &self.learned_module
        }
    }

    /// What to reserve for creating `what` on `ordinal`: the last measured cost, else the default estimate.
    fn creation_estimate(&self, ordinal: CUdevice, what: Creation) -> u64 {
        let learned = self
            .learned(what)
            .get(ordinal as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed));
        match (learned, what.is_context()) {
            (0, true) => CTX_ESTIMATE,
            (0, false) => MODULE_ESTIMATE,
            (l, _) => l,
        }
    }
}

/// What overhead needs from the other families (`Memory` composes them; a recorder in unit tests).
pub(super) trait Others {
    /// Bytes of allocations this process has charged on `dev` (not overhead).
    fn allocated(&self, dev: Dev) -> u64;
    /// Bytes on `dev` of exports this process let go of that others still hold (they may still count as this
    /// process's in NVML's figure: not overhead). Read before the overhead lock: the fork handlers take the
    /// shared table's lock first.
    fn lingering(&self, dev: Dev) -> u64;
    /// The overhead charge on `dev` moved: HAMi's file shows it, and a reconciliation's excess is in it now.
    fn published(&self, dev: Dev);
    /// Code and stacks went (a context, module or library, a changed limit): every launch is a first again.
    fn code_gone(&self);
    /// A module or library was loaded: launches may take memory at first use.
    fn code_loaded(&self);
    /// Context `ctx` was destroyed (elastic memory forgets its ranges).
    fn context_destroyed(&self, cuda: &CudaTable, ctx: usize);
    /// The primary context of `ordinal` was released or reset; `owned`: whether this process created a context.
    fn primary_released(&self, cuda: &CudaTable, ordinal: CUdevice, owned: &dyn Fn(usize) -> bool);
    /// A context of this process on `dev` went: with it the allocations made in it (`last`: it was the last
    /// one there), else those the driver freed.
    fn allocations_gone(&self, cuda: &CudaTable, dev: Dev, last: bool);
}

/// Measurement: NVML's figure for this process, what it charges, and the reservations of creations and
/// growing calls it settles.
impl Overhead {
    /// This process's `usedGpuMemory` on `dev` per NVML: `Some(0)` when NVML lists us nowhere and we hold no
    /// context there, `None` when NVML cannot tell. We are the entry with our pid, else with our learned host pid.
    pub(super) fn used(&self, nvml: &dyn Processes, dev: Dev) -> Option<u64> {
        match self.figure(nvml, dev) {
            Figure::Used(u) => Some(u),
            Figure::NoNvml | Figure::NotListed => None,
        }
    }

    /// [`Overhead::used`], telling "NVML answers but does not list this process while it holds a context"
    /// (host pid unknown or ambiguous) from "no NVML figure at all".
    pub(super) fn figure(&self, nvml: &dyn Processes, dev: Dev) -> Figure {
        let Some(uuid) = self.devices.uuid_of(dev.ordinal) else {
            return Figure::NoNvml;
        };
        let Some(list) = nvml.processes(&uuid) else {
            return Figure::NoNvml;
        };
        let me = std::process::id();
        let found = list.iter().find(|p| p.pid == me).or_else(|| {
            let host = self.host.get()?;
            list.iter().find(|p| p.pid == host)
        });
        if let Some(p) = found {
            self.host.listed_as(p.pid);
            return Figure::Used(p.usedGpuMemory);
        }
        if self.live_contexts(dev.ordinal) == 0 {
            return Figure::Used(0);
        }
        Figure::NotListed
    }

    /// Moves the charge on `dev` to `target` bytes (the caller holds [`Overhead::lock`]; see [`Overhead::set`])
    /// and publishes it.
    pub(super) fn set_published(
        &self,
        o: &dyn Others,
        dev: Dev,
        target: u64,
        admit: bool,
    ) -> Result<(), OverCap> {
        self.set(dev, target, admit)?;
        o.published(dev);
        Ok(())
    }

    /// Re-measures this process's overhead on `dev`: NVML's figure less what `o`'s allocations and lingering
    /// exports hold, else the estimate, plus the reservations in flight. `admit`: growth must fit under the cap.
    pub(super) fn measure(
        &self,
        o: &dyn Others,
        nvml: &dyn Processes,
        dev: Dev,
        admit: bool,
    ) -> Result<(), OverCap> {
        let lingering = o.lingering(dev);
        let _g = self.lock();
        let target = match self.used(nvml, dev) {
            Some(used) => used.saturating_sub(o.allocated(dev).saturating_add(lingering)),
            None => self.estimate(dev.ordinal),
        } + self.inflight(dev);
        let r = self.set_published(o, dev, target, admit);
        log!(
            Level::Debug,
            "device {}: overhead {} bytes ({})",
            dev.ordinal,
            target,
            if r.is_ok() { "charged" } else { "over the cap" }
        );
        r
    }

    /// Re-measures every device we know where this process holds a context or a charge (library loads are
    /// context-independent).
    pub(super) fn measure_all(
        &self,
        o: &dyn Others,
        nvml: &dyn Processes,
        admit: bool,
    ) -> Result<(), OverCap> {
        let devs: Vec<Dev> = self.devices.known().map(|(d, _)| d).collect();
        let mut res = Ok(());
        for d in devs {
            if self.live_contexts(d.ordinal) > 0 || self.of(d) > 0 {
                if let Err(e) = self.measure(o, nvml, d, admit) {
                    res = Err(e);
                }
            }
        }
        res
    }

    /// Reserves the estimate for `what` on `dev` (see [`Overhead::creating`]).
    fn reserve_creation(&self, o: &dyn Others, dev: Dev, what: Creation) -> Result<Reserved, OverCap> {
        let est = self.creation_estimate(dev.ordinal, what);
        // Under the lock: a measurement on another thread must see the charge and the in-flight sum together.
        let _g = self.lock();
        let base = self.reserve(dev, est)?;
        o.published(dev);
        Ok(Reserved { dev, est, base })
    }

    /// An allocation admitted on `d` while this process holds no context there that we saw created: that
    /// context came from a path we do not hook (`cuGetExportTable`'s CUDART_INTERFACE slot 2 retains the
    /// primary context inside the driver). Measure this process on `d` with NVML, once (again after its
    /// contexts there are gone), before admitting anything in it; without an NVML figure nothing is guessed.
    /// `Err`: over the cap (measured again at the next allocation, which is refused again).
    #[inline(always)]
    pub(super) fn adopt_unseen(&self, o: &dyn Others, nvml: &impl Processes, d: Dev) -> Result<(), OverCap> {
        if self.unseen_unmeasured(d) {
            return self.adopt_unseen_slow(o, nvml, d);
        }
        Ok(())
    }

    /// [`Overhead::adopt_unseen`] when no context of ours is live on `d` (out of line).
    #[inline(never)]
    fn adopt_unseen_slow(&self, o: &dyn Others, nvml: &dyn Processes, d: Dev) -> Result<(), OverCap> {
        if !self.unseen_measuring(d) || self.used(nvml, d).is_none() {
            return Ok(());
        }
        let r = self.measure(o, nvml, d, true);
        if r.is_err() {
            self.unseen_unmark(d);
        }
        r
    }

    /// Before a call that grows a reservation on `dev` by about `growth` bytes: admitted as overhead (`Err`:
    /// over the cap, nothing charged). Always followed by [`Overhead::grown`] once the call returned.
    pub(super) fn growing(&self, o: &dyn Others, dev: Dev, growth: u64) -> Result<(), OverCap> {
        if growth > 0 {
            // Under the lock, like a creation's reservation: a measurement meanwhile keeps the growth on top.
            let _g = self.lock();
            self.reserve(dev, growth)?;
            o.published(dev);
        }
        Ok(())
    }

    /// The call [`Overhead::growing`] admitted returned `r`: NVML's figure replaces the estimate. With `undo`
    /// (it restores what the call raised), a measured reservation that does not fit is undone and refused: the
    /// result is `r`, or `CUDA_ERROR_OUT_OF_MEMORY` when undone.
    pub(super) fn grown(
        &self,
        o: &dyn Others,
        nvml: &dyn Processes,
        dev: Dev,
        growth: u64,
        r: CUresult,
        undo: Option<impl FnOnce() -> CUresult>,
    ) -> CUresult {
        let used = self.used(nvml, dev);
        self.grown_to(o, nvml, dev, growth, r, undo, used)
    }

    /// [`Overhead::grown`] with NVML's figure for this process on `dev` already taken (`None`: none).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grown_to(
        &self,
        o: &dyn Others,
        nvml: &dyn Processes,
        dev: Dev,
        growth: u64,
        r: CUresult,
        undo: Option<impl FnOnce() -> CUresult>,
        used: Option<u64>,
    ) -> CUresult {
        let lingering = o.lingering(dev); // before the overhead lock, as in `measure`
        let g = self.lock();
        if growth > 0 {
            self.settle(dev, growth);
        }
        match used {
            Some(used) => {
                let target =
                    used.saturating_sub(o.allocated(dev).saturating_add(lingering)) + self.inflight(dev);
                let admit = r.ok() && undo.is_some();
                if self.set_published(o, dev, target, admit).is_err() {
                    drop(g);
                    if let Some(undo) = undo {
                        let u = undo();
                        log!(
                            Level::Warn,
                            "device {}: a raised context limit reserved more than fits under the cap; set back ({u:?})",
                            dev.ordinal
                        );
                    }
                    let _ = self.measure(o, nvml, dev, false);
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
            }
            None if !r.ok() => {
                let _ = self.set_published(o, dev, self.of(dev).saturating_sub(growth), false);
            }
            // A raise with no estimate that NVML cannot measure would go uncharged: set back (fail closed).
            None if growth == 0 && undo.is_some() && self.devices.memory_cap(dev).is_some() => {
                drop(g);
                if let Some(undo) = undo {
                    let _ = undo();
                }
                return CUresult::ERROR_OUT_OF_MEMORY;
            }
            None => {}
        }
        r
    }
}

/// What NVML says this process holds on a device.
pub(super) enum Figure {
    Used(u64),
    /// No NVML (not loaded, no device UUID, the list call failed).
    NoNvml,
    /// NVML answers, but this process (which holds a context there) is not in the list.
    NotListed,
}

/// A call [`Overhead::call`] wraps, its arguments decoded.
pub(crate) enum OverheadCall<'a> {
    /// `cuCtxCreate` (`Creation::Context`) or `cuDevicePrimaryCtxRetain` (`Creation::Primary`): `out` reads the
    /// context once the call succeeded (unused for a primary context); `undo(it)` destroys or releases what the
    /// call made when its cost does not fit under the cap.
    Create {
        what: Creation,
        out: &'a dyn Fn() -> Option<usize>,
        undo: &'a dyn Fn(usize),
    },
    /// `cuCtxDestroy` of a context.
    Destroy(usize),
    /// `cuDevicePrimaryCtxRelease` (`reset`: `cuDevicePrimaryCtxReset`) of `ordinal`'s primary context;
    /// `last()` runs once this process's last retain of it went (not on a reset).
    PrimaryRelease {
        ordinal: CUdevice,
        reset: bool,
        last: &'a dyn Fn(),
    },
    /// `cuCtxSetLimit`.
    SetLimit { limit: CUlimit, value: usize },
    /// `cuModuleLoad*` (`library` false) or `cuLibraryLoad*`: `out` reads the handle once the call succeeded,
    /// `footprint` what its image holds (`memory::image`; `None`: unknown) once the driver accepted it.
    Load {
        library: bool,
        out: &'a dyn Fn() -> Option<usize>,
        footprint: &'a dyn Fn() -> Option<u64>,
    },
    /// `cuModuleUnload` (`library` false) or `cuLibraryUnload` of a handle.
    Unload { library: bool, handle: usize },
}

/// The calls: creations, loads, unloads, destroys, releases and limits, counted and measured.
impl Overhead {
    /// Before the driver creates `what`: its estimate is reserved as overhead on its device (the last cost
    /// measured for that kind there, else [`CTX_ESTIMATE`] / [`MODULE_ESTIMATE`]; nothing on a device without
    /// accounting, or for a primary context this process holds already). `Err`: it does not fit under the cap
    /// (nothing reserved; the caller refuses the creation without calling the driver).
    pub(super) fn creating<'a>(
        &'a self,
        others: &'a dyn Others,
        cuda: &'a CudaTable,
        nvml: &'a dyn Processes,
        what: Creation,
    ) -> Result<Creating<'a>, OverCap> {
        let dev = match what {
            Creation::Context(o) => self.devices.device(cuda, o),
            Creation::Primary(o) if self.primary_unheld(o) => self.devices.device(cuda, o),
            Creation::Primary(_) => None,
            Creation::Module => self.devices.current(cuda),
        };
        let res = match dev {
            Some(d) => Some(self.reserve_creation(others, d, what)?),
            None => None,
        };
        Ok(Creating {
            overhead: self,
            others,
            cuda,
            nvml,
            what,
            inflight: res.is_some(),
            res,
            measured: false,
        })
    }

    /// `call`, the call `what` describes, with what this process's contexts and modules cost: a load is
    /// admitted (an estimate first, [`Overhead::creating`]; over the cap once measured: unloaded here,
    /// `CUDA_ERROR_OUT_OF_MEMORY`); an unload, destroy or release uncounts and re-measures; a raised limit is
    /// admitted ([`Overhead::set_limit`]). `o`: the other families (what a measurement subtracts, what a
    /// destroy, release or unload makes them forget).
    pub(super) fn call(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        what: OverheadCall<'_>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match what {
            OverheadCall::Create { what, out, undo } => {
                let Ok(mut c) = self.creating(o, cuda, nvml, what) else {
                    return CUresult::ERROR_OUT_OF_MEMORY;
                };
                let r = c.call(call);
                let made = match what {
                    Creation::Primary(_) => Some(0),
                    _ => r.ok().then(out).flatten(),
                };
                let Some(made) = made.filter(|_| r.ok()) else {
                    return r;
                };
                if c.created(made).is_err() {
                    undo(made);
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
                r
            }
            OverheadCall::Destroy(ctx) => {
                let owner = self.take_owner(ctx);
                let r = call();
                if r.ok() {
                    o.context_destroyed(cuda, ctx);
                }
                self.context_destroyed(o, cuda, nvml, ctx, owner, r.ok());
                r
            }
            OverheadCall::PrimaryRelease { ordinal, reset, last } => {
                let r = call();
                if r.ok() {
                    self.primary_released(o, cuda, nvml, ordinal, reset);
                    if !reset && self.primary_unheld(ordinal) {
                        last();
                    }
                }
                r
            }
            OverheadCall::SetLimit { limit, value } => self.set_limit(o, cuda, nvml, call, limit, value),
            OverheadCall::Load {
                library: false,
                out,
                footprint,
            } => {
                let Ok(mut c) = self.creating(o, cuda, nvml, Creation::Module) else {
                    return CUresult::ERROR_OUT_OF_MEMORY;
                };
                let r = c.call(call);
                let Some(m) = r.ok().then(out).flatten() else {
                    return r;
                };
                self.image_loaded(m, false, footprint());
                if c.created(m).is_err() {
                    // SAFETY: unloading the module the driver just loaded for this call.
                    if unsafe { cuda.cuModuleUnload(m as CUmodule) }.ok() {
                        self.module_unloaded(o, cuda, nvml, m);
                    }
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
                r
            }
            OverheadCall::Load {
                library: true,
                out,
                footprint,
            } => {
                let r = call();
                let Some(l) = r.ok().then(out).flatten() else {
                    return r;
                };
                self.image_loaded(l, true, footprint());
                if self.library_loaded(o, nvml).is_err() {
                    // SAFETY: unloading the library the driver just loaded for this call.
                    if unsafe { cuda.cuLibraryUnload(l as CUlibrary) }.ok() {
                        self.library_unloaded(o, nvml, l);
                    }
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
                r
            }
            OverheadCall::Unload { library, handle } => {
                let r = call();
                if r.ok() && library {
                    self.library_unloaded(o, nvml, handle);
                } else if r.ok() {
                    self.module_unloaded(o, cuda, nvml, handle);
                }
                r
            }
        }
    }

    /// After a context went away: if it was this process's last one on `d`, its allocations went with it; with
    /// others still live, the driver is asked which of the device's allocations it freed.
    fn contexts_gone(&self, o: &dyn Others, cuda: &CudaTable, nvml: &dyn Processes, d: Dev) {
        if self.live_contexts(d.ordinal) == 0 {
            self.unseen_unmark(d);
            o.allocations_gone(cuda, d, true);
            self.host.last_context_gone(nvml, d.ordinal);
        } else {
            o.allocations_gone(cuda, d, false);
        }
        let _ = self.measure(o, nvml, d, false);
    }

    /// Context `ctx` was created on `ordinal`: count it and charge what it costs. `Err`: over the cap (the
    /// caller destroys it, which undoes all this).
    fn context_created(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ctx: usize,
        ordinal: CUdevice,
    ) -> Result<(), OverCap> {
        let Some(d) = self.devices.device(cuda, ordinal) else {
            return Ok(());
        };
        self.context_counted(ctx, ordinal);
        self.measure(o, nvml, d, true)
    }

    /// The destroy of `ctx` (owned by `owner`) returned: on success uncount it and re-measure; on failure it
    /// still lives.
    fn context_destroyed(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ctx: usize,
        owner: Option<CUdevice>,
        ok: bool,
    ) {
        if ok {
            // Its code and stacks went with it; a context created at the same address starts afresh.
            o.code_gone();
        }
        let Some(ordinal) = owner else { return };
        if !ok {
            self.own(ctx, ordinal);
            return;
        }
        self.context_uncounted(ctx, ordinal);
        if let Some(d) = self.devices.device(cuda, ordinal) {
            self.contexts_gone(o, cuda, nvml, d);
        }
    }

    /// The primary context of `ordinal` was retained: count it, charge it. `Err`: over the cap (the caller
    /// releases it again).
    fn primary_retained(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ordinal: CUdevice,
    ) -> Result<(), OverCap> {
        let Some(d) = self.devices.device(cuda, ordinal) else {
            return Ok(());
        };
        self.primary_counted(ordinal);
        self.measure(o, nvml, d, true)
    }

    /// The primary context of `ordinal` was released (`reset`: reset, our count drops to zero).
    fn primary_released(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        ordinal: CUdevice,
        reset: bool,
    ) {
        // A reset (or the last release) unloads the context's code and stacks; the same handles may follow.
        o.code_gone();
        // The contexts this process created, read once and only if asked.
        let owned = std::cell::OnceCell::new();
        o.primary_released(cuda, ordinal, &|c| {
            owned.get_or_init(|| self.owned_contexts()).contains(&c)
        });
        self.primary_uncounted(ordinal, reset);
        if let Some(d) = self.devices.device(cuda, ordinal) {
            self.contexts_gone(o, cuda, nvml, d);
        }
    }

    /// `cuCtxSetLimit`: the stack size (per thread, for every thread the device can hold), the printf FIFO, the
    /// malloc heap and the device runtime's pending-launch buffer (and its sync depth on older GPUs) reserve device
    /// memory in the current context. Raising one is admitted against the cap first (`CUDA_ERROR_OUT_OF_MEMORY`
    /// over it, the driver not asked) by an estimate where the size is known (stack, FIFO, heap; the others' cost
    /// per unit is the driver's own, so nothing), then the overhead is re-measured: a raised limit whose
    /// reservation does not fit is set back and refused. Any limit this list does not know is treated so too.
    fn set_limit(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        call: impl FnOnce() -> CUresult,
        limit: CUlimit,
        value: usize,
    ) -> CUresult {
        // Cache hints and query-only values: no device memory.
        if matches!(
            limit,
            CU_LIMIT_MAX_L2_FETCH_GRANULARITY
                | CU_LIMIT_PERSISTING_L2_CACHE_SIZE
                | CU_LIMIT_SHMEM_SIZE
                | CU_LIMIT_CIG_ENABLED
                | CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED
        ) {
            return call();
        }
        let Some(dev) = self.devices.current(cuda) else {
            return call();
        };
        let bytes = |v: usize| -> u64 {
            match limit {
                CU_LIMIT_PRINTF_FIFO_SIZE | CU_LIMIT_MALLOC_HEAP_SIZE => v as u64,
                CU_LIMIT_STACK_SIZE => stack::bytes(cuda, dev, v as u64),
                _ => 0,
            }
        };
        let mut cur: usize = 0;
        // SAFETY: valid out-pointer; a failed query leaves 0 (the whole new reservation is admitted).
        let known = unsafe { cuda.cuCtxGetLimit(&mut cur, limit) }.ok();
        let growth = bytes(value).saturating_sub(bytes(cur));
        // SAFETY: setting the limit back to the value it had.
        let undo = (known && value > cur).then_some(|| unsafe { cuda.cuCtxSetLimit(limit, cur) });
        self.setting_limit(o, nvml, dev, growth, call, undo)
    }

    /// `cuCtxSetLimit` of a memory-backed limit on `dev` whose reservation grows by about `growth` bytes: the
    /// growth is admitted as overhead before the driver is asked (over the cap: `CUDA_ERROR_OUT_OF_MEMORY`, the
    /// driver not called); once it answered, NVML's figure replaces the estimate (a lowered limit shrinks it).
    /// A raised limit (`undo` given: it restores the old value) whose measured reservation does not fit, the
    /// estimate being short, is undone and refused with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn setting_limit(
        &self,
        o: &dyn Others,
        nvml: &dyn Processes,
        dev: Dev,
        growth: u64,
        call: impl FnOnce() -> CUresult,
        undo: Option<impl FnOnce() -> CUresult>,
    ) -> CUresult {
        if self.growing(o, dev, growth).is_err() {
            return CUresult::ERROR_OUT_OF_MEMORY;
        }
        let r = call();
        if r.ok() {
            // A lowered stack is grown again by the next launch that needs it: every launch is a first again.
            o.code_gone();
        }
        self.grown(o, nvml, dev, growth, r, undo)
    }

    /// Module `module` was loaded in the current context: count it, re-measure that device. `Err`: over the
    /// cap (the caller unloads it).
    fn module_loaded(
        &self,
        o: &dyn Others,
        cuda: &CudaTable,
        nvml: &dyn Processes,
        module: usize,
    ) -> Result<(), OverCap> {
        self.module_counted();
        o.code_loaded();
        self.retry_host_pid(nvml);
        let Some(d) = self.devices.current(cuda) else {
            return Ok(());
        };
        self.own(module, d.ordinal);
        self.measure(o, nvml, d, true)
    }

    /// The device of module `module`'s context, when this process loaded it.
    pub(super) fn module_device(&self, cuda: &CudaTable, module: usize) -> Option<Dev> {
        let ordinal = self.owner_of(module)?;
        self.devices.device(cuda, ordinal)
    }

    /// Module `module` was unloaded.
    fn module_unloaded(&self, o: &dyn Others, cuda: &CudaTable, nvml: &dyn Processes, module: usize) {
        let owner = self.module_uncounted(module);
        o.code_gone();
        if let Some(d) = owner.and_then(|ordinal| self.devices.device(cuda, ordinal)) {
            let _ = self.measure(o, nvml, d, false);
        }
    }

    /// A library was loaded (context-independent: every device is re-measured). `Err`: over the cap (the
    /// caller unloads it).
    fn library_loaded(&self, o: &dyn Others, nvml: &dyn Processes) -> Result<(), OverCap> {
        self.module_counted();
        o.code_loaded();
        self.retry_host_pid(nvml);
        self.measure_all(o, nvml, true)
    }

    /// A library was unloaded.
    fn library_unloaded(&self, o: &dyn Others, nvml: &dyn Processes, library: usize) {
        self.library_uncounted(library);
        o.code_gone();
        let _ = self.measure_all(o, nvml, false);
    }
}

#[cfg(test)]
mod tests {
    use super::super::driver::fake::Fake;
    use super::super::tests::{capped, device_under, uuid_table, TempRegion};
    use super::*;
    use std::cell::{Cell, RefCell};

    const MIB: u64 = 1 << 20;

    /// A driver that knows device 0's UUID (and nothing else).
    fn cuda() -> CudaTable {
        uuid_table()
    }

    /// The overhead family on device 0 of a fresh usage file, capped at `cap`.
    fn setup(cap: u64) -> (TempRegion, Overhead, Dev) {
        let (t, devices, dev) = device_under("overhead", capped(Some(cap)), &cuda());
        (t, Overhead::new(devices), dev)
    }

    fn used(o: &Overhead, dev: Dev) -> u64 {
        o.devices.usage().container_used(dev.id)
    }

    /// A charge admitted against the cap that does not fit is refused with nothing changed; a measurement
    /// (not admitted) is charged whatever the cap; shrinking gives the bytes back to the usage file.
    #[test]
    fn an_admitted_growth_over_the_cap_is_refused_and_a_measurement_is_not() {
        let (_t, o, dev) = setup(100 * MIB);
        let _g = o.lock();
        assert_eq!(o.set(dev, 60 * MIB, true), Ok(()));
        assert_eq!((o.of(dev), used(&o, dev)), (60 * MIB, 60 * MIB));
        assert_eq!(o.set(dev, 120 * MIB, true), Err(OverCap));
        assert_eq!((o.of(dev), used(&o, dev)), (60 * MIB, 60 * MIB));
        assert_eq!(o.set(dev, 120 * MIB, false), Ok(()));
        assert_eq!((o.of(dev), used(&o, dev)), (120 * MIB, 120 * MIB));
        assert_eq!(o.set(dev, 10 * MIB, true), Ok(()));
        assert_eq!((o.of(dev), used(&o, dev)), (10 * MIB, 10 * MIB));
    }

    /// A reservation is admitted against the cap and stays in flight until settled; it returns the charge
    /// before it less what was already in flight (what a creation's cost is learned against).
    #[test]
    fn a_reservation_is_admitted_in_flight_and_its_base_leaves_others_in_flight_out() {
        let (_t, o, dev) = setup(100 * MIB);
        let _g = o.lock();
        o.set(dev, 10 * MIB, false).expect("measured");
        assert_eq!(o.reserve(dev, 30 * MIB), Ok(10 * MIB));
        assert_eq!(o.reserve(dev, 20 * MIB), Ok(10 * MIB));
        assert_eq!((o.of(dev), o.inflight(dev)), (60 * MIB, 50 * MIB));
        assert_eq!(o.reserve(dev, 50 * MIB), Err(OverCap));
        assert_eq!((o.of(dev), o.inflight(dev)), (60 * MIB, 50 * MIB));
        o.settle(dev, 30 * MIB);
        assert_eq!(o.inflight(dev), 20 * MIB);
    }

    /// An allocation must measure a context it never saw created only while none of ours is live on the
    /// device and none was measured (one allocation measures: the flag is taken); a forked child forgets
    /// charges, holdings and that flag.
    #[test]
    fn an_unseen_context_is_measured_once_and_a_child_starts_afresh() {
        let (_t, o, dev) = setup(100 * MIB);
        assert!(o.unseen_unmeasured(dev));
        o.context_counted(0x10, 0);
        assert!(!o.unseen_unmeasured(dev));
        o.context_uncounted(0x10, 0);
        assert!(o.unseen_unmeasured(dev));
        assert!(o.unseen_measuring(dev) && !o.unseen_measuring(dev));
        assert!(!o.unseen_unmeasured(dev));
        o.unseen_unmark(dev);
        assert!(o.unseen_measuring(dev));
        {
            let _g = o.lock();
            o.reserve(dev, 5 * MIB).expect("fits");
        }
        o.reset();
        assert!(o.unseen_unmeasured(dev));
        assert_eq!((o.of(dev), o.inflight(dev)), (0, 0));
    }

    /// A creation's estimate is the default until one was measured, then what the last one cost over its
    /// base; without NVML the estimate counts live contexts (a primary once), modules and first uses, and an
    /// unloaded module takes its first-use charges and owner with it.
    #[test]
    fn creations_learn_their_cost_and_the_estimate_follows_the_holdings() {
        let (_t, o, dev) = setup(1 << 40);
        let ctx = Creation::Context(0);
        assert_eq!(o.creation_estimate(0, ctx), CTX_ESTIMATE);
        assert_eq!(o.creation_estimate(0, Creation::Module), MODULE_ESTIMATE);
        {
            let _g = o.lock();
            o.set(dev, 300 * MIB, false).expect("measured");
        }
        o.learn(dev, ctx, 100 * MIB);
        assert_eq!(o.creation_estimate(0, ctx), 200 * MIB);
        assert_eq!(o.creation_estimate(0, Creation::Module), MODULE_ESTIMATE);

        assert_eq!(o.estimate(0), 0);
        assert!(o.primary_unheld(0));
        o.primary_counted(0);
        o.primary_counted(0);
        assert!(!o.primary_unheld(0));
        o.context_counted(0x20, 0);
        o.module_counted();
        o.own(0x30, 0);
        o.image_loaded(0x30, false, Some(MIB));
        assert_eq!(o.charge_lazy(0x30, 0x20, 0, 3 * MIB, false), 3 * MIB);
        assert_eq!(o.charge_lazy(0x30, 0x20, 0, 3 * MIB, false), 0);
        assert_eq!(o.estimate(0), 2 * CTX_ESTIMATE + MODULE_ESTIMATE + 3 * MIB);
        assert_eq!(o.image_of(0x30).and_then(|i| i.bytes), Some(MIB));
        assert_eq!(o.module_uncounted(0x30), Some(0));
        assert_eq!((o.image_of(0x30).is_none(), o.owner_of(0x30)), (true, None));
        assert_eq!(o.estimate(0), 2 * CTX_ESTIMATE);
        o.primary_uncounted(0, true);
        assert!(o.primary_unheld(0));
        assert_eq!(o.estimate(0), CTX_ESTIMATE);
    }

    /// The other families as overhead sees them: allocations and lingering exports of fixed sizes, the
    /// publications and forgettings counted.
    #[derive(Default)]
    struct Net {
        allocated: Cell<u64>,
        lingering: Cell<u64>,
        published: Cell<u32>,
        code_gone: Cell<u32>,
        /// Allocations forgotten with a context: `last` of each.
        allocations_gone: RefCell<Vec<bool>>,
    }

    impl Others for Net {
        fn allocated(&self, _dev: Dev) -> u64 {
            self.allocated.get()
        }
        fn lingering(&self, _dev: Dev) -> u64 {
            self.lingering.get()
        }
        fn published(&self, _dev: Dev) {
            self.published.set(self.published.get() + 1);
        }
        fn code_gone(&self) {
            self.code_gone.set(self.code_gone.get() + 1);
        }
        fn code_loaded(&self) {}
        fn context_destroyed(&self, _cuda: &CudaTable, _ctx: usize) {}
        fn primary_released(&self, _cuda: &CudaTable, _ordinal: CUdevice, _owned: &dyn Fn(usize) -> bool) {}
        fn allocations_gone(&self, _cuda: &CudaTable, _dev: Dev, last: bool) {
            self.allocations_gone.borrow_mut().push(last);
        }
    }

    /// A context creation reserves the estimate, then is charged what NVML measured and learns it for the next
    /// one; one whose measured cost does not fit under the cap is undone (its destroy re-measures) and refused;
    /// a failed creation gives its estimate back.
    #[test]
    fn a_created_context_is_charged_its_measured_cost_and_one_over_the_cap_is_undone() {
        let (_t, o, dev) = setup(1024 * MIB);
        let (nvml, net, cuda) = (Fake::default(), Net::default(), cuda());
        let me = std::process::id();
        let ctx = Creation::Context(0);
        nvml.list(Some(&[]));
        let create = |handle: usize, after: u64, undo: &dyn Fn(usize)| {
            let out = || Some(handle);
            let what = OverheadCall::Create {
                what: ctx,
                out: &out,
                undo,
            };
            o.call(&net, &cuda, &nvml, what, || {
                assert_eq!(
                    o.inflight(dev),
                    o.creation_estimate(0, ctx),
                    "held across the call"
                );
                nvml.list(Some(&[(me, after)]));
                CUresult::SUCCESS
            })
        };
        assert_eq!(create(0x10, 300 * MIB, &|_| panic!("fits")), CUresult::SUCCESS);
        assert_eq!(
            (o.of(dev), o.inflight(dev), used(&o, dev)),
            (300 * MIB, 0, 300 * MIB)
        );
        assert_eq!((o.creation_estimate(0, ctx), o.live_contexts(0)), (300 * MIB, 1));

        let destroy = |c: usize| {
            let r = o.call(&net, &cuda, &nvml, OverheadCall::Destroy(c), || {
                nvml.list(Some(&[(me, 300 * MIB)]));
                CUresult::SUCCESS
            });
            assert_eq!(r, CUresult::SUCCESS);
        };
        assert_eq!(create(0x20, 1100 * MIB, &destroy), CUresult::ERROR_OUT_OF_MEMORY);
        assert_eq!(
            (o.of(dev), used(&o, dev), o.live_contexts(0)),
            (300 * MIB, 300 * MIB, 1)
        );
        assert_eq!(*net.allocations_gone.borrow(), [false], "a context is still live");

        let mut c = o.creating(&net, &cuda, &nvml, ctx).expect("fits");
        assert_eq!(o.of(dev), 600 * MIB);
        assert_eq!(
            c.call(|| CUresult::ERROR_INVALID_VALUE),
            CUresult::ERROR_INVALID_VALUE
        );
        drop(c);
        assert_eq!(
            (o.of(dev), o.inflight(dev), o.live_contexts(0)),
            (300 * MIB, 0, 1)
        );
    }

    /// A measurement charges what NVML lists for this process less its allocations and lingering exports,
    /// plus what is in flight, and publishes it; one not admitted (a destroy, an unload) is charged over the
    /// cap, an admitted one (a creation) is refused there with nothing changed. Without NVML it is the estimate.
    #[test]
    fn a_measurement_charges_nvml_s_figure_and_only_an_admitted_one_is_refused() {
        let (_t, o, dev) = setup(400 * MIB);
        let nvml = Fake::default();
        let net = Net::default();
        net.allocated.set(100 * MIB);
        net.lingering.set(20 * MIB);
        o.context_counted(0x10, 0);
        nvml.list(Some(&[(5, MIB), (std::process::id(), 400 * MIB)]));
        assert_eq!(o.measure(&net, &nvml, dev, true), Ok(()));
        assert_eq!(
            (o.of(dev), used(&o, dev), net.published.get()),
            (280 * MIB, 280 * MIB, 1)
        );
        {
            let _g = o.lock();
            o.reserve(dev, 10 * MIB).expect("fits");
        }
        nvml.list(Some(&[(std::process::id(), 700 * MIB)]));
        assert_eq!(o.measure(&net, &nvml, dev, true), Err(OverCap));
        assert_eq!(o.of(dev), 290 * MIB);
        assert_eq!(o.measure(&net, &nvml, dev, false), Ok(()));
        assert_eq!((o.of(dev), used(&o, dev)), (590 * MIB, 590 * MIB));
        nvml.list(None);
        assert_eq!(o.measure(&net, &nvml, dev, false), Ok(()));
        assert_eq!(o.of(dev), CTX_ESTIMATE + 10 * MIB);
    }

    /// An allocation in a context we never saw created measures it once by NVML's figure; without one nothing
    /// is guessed (nor asked again until our contexts there are gone), and a measurement over the cap refuses
    /// and is made again at the next allocation.
    #[test]
    fn an_unseen_context_is_charged_once_by_nvml_s_figure_and_never_guessed() {
        let (_t, o, dev) = setup(400 * MIB);
        let (nvml, net) = (Fake::default(), Net::default());
        assert_eq!(o.adopt_unseen(&net, &nvml, dev), Ok(()));
        assert_eq!(
            (o.of(dev), o.unseen_unmeasured(dev)),
            (0, false),
            "no NVML: nothing guessed"
        );
        o.unseen_unmark(dev);
        nvml.list(Some(&[(std::process::id(), 500 * MIB)]));
        assert_eq!(o.adopt_unseen(&net, &nvml, dev), Err(OverCap));
        assert_eq!((o.of(dev), o.unseen_unmeasured(dev)), (0, true));
        nvml.list(Some(&[(std::process::id(), 300 * MIB)]));
        assert_eq!(o.adopt_unseen(&net, &nvml, dev), Ok(()));
        assert_eq!((o.of(dev), o.unseen_unmeasured(dev)), (300 * MIB, false));
        nvml.list(Some(&[(std::process::id(), 900 * MIB)]));
        assert_eq!(o.adopt_unseen(&net, &nvml, dev), Ok(()));
        assert_eq!((o.of(dev), net.published.get()), (300 * MIB, 1), "measured once");
    }

    /// In a pid namespace (NVML never lists our own pid) the host pid is the one new pid NVML lists after our
    /// first context creation on a device. Two new pids (a sibling created one at the same moment) teach
    /// nothing, not even later while both are listed; once the sibling's is gone, a module load's retry learns
    /// ours, and it is recorded in our usage slot.
    #[test]
    fn an_ambiguous_host_pid_diff_learns_nothing_until_the_other_pid_goes() {
        let (us, sibling, other) = (100_007, 100_008, 5);
        let (_t, o, _dev) = setup(1 << 40);
        let nvml = Fake::default();
        let create = |o: &Overhead, listed: &[(u32, u64)]| {
            nvml.list(Some(&[(other, MIB)]));
            let r = o.creating_context(&cuda(), &nvml, 0, || {
                nvml.list(Some(listed));
                CUresult::SUCCESS
            });
            assert_eq!(r, CUresult::SUCCESS);
        };
        create(&o, &[(other, MIB), (us, 300 * MIB), (sibling, 300 * MIB)]);
        o.context_counted(0x10, 0);
        assert_eq!(o.host().get(), None);
        o.retry_host_pid(&nvml);
        assert_eq!(o.host().get(), None, "both new pids still listed");
        nvml.list(Some(&[(other, MIB), (us, 300 * MIB)]));
        o.retry_host_pid(&nvml);
        assert_eq!(o.host().get(), Some(us));
        let usage = o.devices.usage();
        let slot = usage.cached_slot().expect("our slot");
        let ours = usage.processes().into_iter().find(|p| p.slot == slot);
        assert_eq!(ours.map(|p| p.host_pid), Some(us));

        // The control: a first creation that adds one pid learns it at once.
        let (_t, o, _dev) = setup(1 << 40);
        create(&o, &[(other, MIB), (us, 300 * MIB)]);
        assert_eq!(o.host().get(), Some(us));
    }

    /// A forked child resets the images and first-use charges (`Holdings::reset`): the fork must hold their
    /// locks, or one a parent thread held at the fork keeps the child waiting for ever (a chaos fork run's
    /// stuck child, CI 2026-12-02).
    #[test]
    fn the_fork_holds_the_locks_a_child_resets() {
        let h = Holdings::default();
        h.fork_prepare_leaves();
        assert!(h.images.try_lock().is_none() && h.lazy.try_lock().is_none());
        // SAFETY: prepared just above, on this thread.
        unsafe { h.fork_release_leaves(Side::Child) };
        h.reset();
        assert!(h.images.try_lock().is_some() && h.lazy.try_lock().is_some());
    }
}

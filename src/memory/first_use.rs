//! First use: memory the driver takes at a call that allocates nothing. With lazy loading (CUDA's default) a
//! module's or library's code and globals load at `cuModuleGetFunction`, `cuModuleGetGlobal`,
//! `cuLibraryGetModule`, `cuLibraryGetGlobal`, `cuKernelGetFunction` or a kernel's first launch in a context;
//! a launch of a kernel whose local memory exceeds the context's stack size grows the stack for every thread
//! the device holds (`stack`). While a memory limit applies, such a call is refused up front while the
//! container is over its cap; what it may take (the stack growth, its image's footprint: `memory::image`) is
//! reserved against the cap before the call ([`FirstUseGuard`], given back on drop) and settled by NVML's
//! figure after it — or, without one, kept (the footprint once per image and context, an unknown image's drop
//! in the driver's free memory).
//!
//! The seen set ([`FirstUse`]) remembers which handles were used in which context, so only a first launch
//! pays: a launch seen before costs one thread-local cache probe ([`FirstUse::first_launch`]).
//!
//! [`FirstUse`] owns that logic with its state and its own `Devices` (the caps, the usage file); what it needs of
//! the other families (the reservation as overhead and its settlement by NVML's figure, images, graph execs'
//! kernels) it asks through [`Accounts`], which `Memory` implements by composing them (a fake in unit tests).

use super::overhead::{Figure, Image, STACK};
use super::{stack, Memory, OverCap};
use crate::devices::{Dev, Devices};
use crate::driver::cuda::{in_context, CudaTable};
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::locks::{Lock, Side};
use crate::log::{log, Level};
use std::cell::Cell;
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
/// modules, globals. A kernel's first launch in each context is its own (code and stack are per context).
pub(crate) struct FirstUse {
    /// The devices' caps and the usage file.
    devices: Arc<Devices>,
    /// A module or library was loaded: first uses may take memory from now on.
    armed: AtomicBool,
    /// This set's generation, new whenever something is removed: threads' cached answers carry it.
    generation: AtomicU64,
    /// Handles returned by lookups, and handles launched (apart: a function looked up is launched later).
    seen: [Lock<Seen>; SHARDS],
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

impl FirstUse {
    /// No handle seen yet, on `devices`.
    pub(super) fn new(devices: Arc<Devices>) -> FirstUse {
        FirstUse {
            devices,
            armed: AtomicBool::new(false),
            generation: AtomicU64::new(GENERATIONS.fetch_add(1, Ordering::Relaxed)),
            seen: std::array::from_fn(|_| Lock::default()),
            gate: Lock::new(()),
        }
    }
}

impl FirstUse {
    /// A module or library was loaded.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Whether a launch may take memory at first use: a module or library was loaded and a memory limit
    /// applies somewhere (as of the launch hook's refresh of the limits). Two relaxed loads.
    #[inline]
    pub(super) fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed) && self.devices.memory_limited()
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

    /// Forgets everything (a forked child).
    pub(super) fn reset(&self) {
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

impl FirstUse {
    /// Before a call that may make the driver take memory at first use on `dev` (lazy loading, launch-time
    /// stack growth): what it will take is reserved against the cap first, `Err` (refuse it with
    /// `CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked) while the container is over its cap or the
    /// reservation does not fit: `what.stack` bytes of stack growth and the whole footprint of the image it
    /// loads from (`what.image`; any single first use takes at most that). An image of unknown footprint
    /// reserves nothing: a lookup of one holds the gate across its call (one such load at a time, measured
    /// after), a launch never does (it may block on the program). `Ok(Some(_))`: end it with
    /// [`FirstUseGuard::done`] once the call returned (dropped: refused, the reservation given back);
    /// `Ok(None)`: no cap.
    fn begin<'a>(
        &'a self,
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        dev: Dev,
        what: FirstUseOf,
    ) -> Result<Option<FirstUseGuard<'a>>, OverCap> {
        let Some(cap) = self.devices.memory_cap(dev) else {
            return Ok(None);
        };
        let known = what.image.and_then(|i| i.bytes);
        let gate = (known.is_none() && what.lookup).then(|| self.enter());
        let usage = self.devices.usage();
        let refuse = |why: std::fmt::Arguments<'_>| {
            log!(Level::Debug, "device {}: {why}: refused", dev.ordinal);
            usage.count_refusal(dev.id);
            Err(OverCap)
        };
        // Over the cap once every process's credit was taken back.
        if usage.container_used(dev.id) > cap && {
            usage.drain_all_credit(dev.id);
            usage.container_used(dev.id) > cap
        } {
            return refuse(format_args!("over the cap, a call that may load code or globals"));
        }
        let reserved = what.stack.saturating_add(known.unwrap_or(0));
        if acc.reserve(dev, reserved).is_err() {
            return refuse(format_args!(
                "a first use that may take {reserved} bytes does not fit under the cap"
            ));
        }
        Ok(Some(FirstUseGuard {
            first_use: self,
            acc,
            cuda,
            nvml,
            dev,
            what,
            reserved,
            // The driver's free memory is the current context's device's: a delta only where that is `dev`.
            free_before: gate
                .as_ref()
                .filter(|_| self.devices.current(cuda) == Some(dev))
                .and_then(|_| free_on(cuda)),
            ended: false,
            _gate: gate,
        }))
    }

    /// A call that has taken memory at first use on `dev` unadmitted (a launch during which the seen set forgot
    /// its context's code): measured when the guard ends. `None`: no cap on `dev`.
    fn watch<'a>(
        &'a self,
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        dev: Dev,
    ) -> Option<FirstUseGuard<'a>> {
        self.devices.memory_cap(dev)?;
        Some(FirstUseGuard {
            first_use: self,
            acc,
            cuda,
            nvml,
            dev,
            what: FirstUseOf::default(),
            reserved: 0,
            free_before: None,
            ended: false,
            _gate: None,
        })
    }

    /// The call a guard let through returned `r`; `fresh`: the handle it used or gave was new. With NVML's
    /// figure the charge is settled to it (the reservation was an estimate). Without one (no NVML, an error,
    /// this process unlisted) the reservation stays charged once per image and context (a later first use of
    /// that image there gives its reservation back), the stack growth always; a first use of an unknown image
    /// is charged what the driver's free memory fell by across the call.
    fn done(&self, g: &FirstUseGuard<'_>, r: CUresult, fresh: bool) {
        let (acc, cuda, nvml) = (g.acc, g.cuda, g.nvml);
        let (dev, what, reserved, free_before) = (g.dev, g.what, g.reserved, g.free_before);
        let ordinal = dev.ordinal;
        let (key, bytes) = what.image.map_or((0, None), |i| (i.key, i.bytes));
        if !(fresh || reserved > 0) {
            return;
        }
        acc.credit_back(dev);
        let figure = acc.figure(nvml, dev);
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
        let mut kept = 0;
        if r.ok() {
            kept += acc.charge_lazy(STACK, what.ctx, ordinal, what.stack, true);
            // An image's footprint once per context; what an unknown one was measured to take, every time.
            kept += acc.charge_lazy(key, what.ctx, ordinal, took, bytes.is_none());
        }
        match figure {
            Figure::Used(used) if reserved > 0 => acc.settle_measured(nvml, dev, reserved, r, used),
            Figure::Used(_) => {
                if let Some(cap) = self.devices.memory_cap(dev) {
                    acc.reconcile(nvml, dev, cap, figure);
                }
            }
            _ => {
                // No figure: the reservation goes, what is kept stays (never admitted: the next admission is).
                acc.settle_unmeasured(dev, reserved, kept);
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
}

/// What first use asks of the other families: `Memory` composes them (below), unit tests fake it.
pub(super) trait Accounts {
    /// The first-use family itself (`Memory` holds it; see [`FirstUse::first_launch_to`]).
    fn first_use(&self) -> &FirstUse;
    /// Reserves `bytes` on `dev` as overhead in flight, admitted against the cap (`Err`: nothing charged).
    fn reserve(&self, dev: Dev, bytes: u64) -> Result<(), OverCap>;
    /// Takes this process's credit on `dev` back (a settlement is exact).
    fn credit_back(&self, dev: Dev);
    /// What NVML says this process holds on `dev`.
    fn figure(&self, nvml: &Nvml, dev: Dev) -> Figure;
    /// A first use of `key` in `ctx` on `ordinal` took `bytes`, kept for the estimate without NVML (once per
    /// key and context, or added up: `accumulate`); what was added.
    fn charge_lazy(&self, key: usize, ctx: usize, ordinal: CUdevice, bytes: u64, accumulate: bool) -> u64;
    /// The call a reservation of `reserved` on `dev` admitted returned `r`: NVML's figure `used` replaces it.
    fn settle_measured(&self, nvml: &Nvml, dev: Dev, reserved: u64, r: CUresult, used: u64);
    /// A first use that reserved nothing was measured: the overhead on `dev` reconciled with `figure`.
    fn reconcile(&self, nvml: &Nvml, dev: Dev, cap: u64, figure: Figure);
    /// No figure: the reservation of `reserved` on `dev` goes, `kept` bytes stay charged as overhead.
    fn settle_unmeasured(&self, dev: Dev, reserved: u64, kept: u64);
    /// The image of module or library `handle`, when this process saw it loaded.
    fn image_of(&self, handle: usize) -> Option<Image>;
    /// Module `module` of `library` (which no load hook saw) lives on `ordinal`.
    fn module_on(&self, module: usize, ordinal: CUdevice, library: usize);
    /// The device of module `module`'s context, when this process loaded it.
    fn module_device(&self, cuda: &CudaTable, module: usize) -> Option<Dev>;
    /// The largest local memory per thread among graph exec `exec`'s kernels.
    fn graph_stack(&self, exec: usize) -> u64;
    /// The kernels graph exec `exec` may run.
    fn graph_kernels(&self, exec: usize) -> Vec<usize>;
}

/// What a first use may take, for [`FirstUse::begin`].
#[derive(Clone, Copy, Debug, Default)]
struct FirstUseOf {
    /// Launch-time stack growth.
    stack: u64,
    /// The image it may load code and globals from (`None`: unknown; a launch of a loaded function: key 0,
    /// footprint 0).
    image: Option<Image>,
    /// The context it loads into (a module's own: 0).
    ctx: usize,
    /// A lookup (may hold the gate: it never waits on the program), not a launch.
    lookup: bool,
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

/// A first-use call let through by [`FirstUse::begin`]: holds its reservation (and for a lookup of an
/// unknown image the gate) across the call. [`FirstUseGuard::done`] settles it to what the call took; dropped
/// without it, the call is taken as refused and the reservation goes back.
#[must_use = "hold it across the call; dropping it gives the reservation back"]
pub(crate) struct FirstUseGuard<'a> {
    first_use: &'a FirstUse,
    /// The other families, for the settlement.
    acc: &'a dyn Accounts,
    cuda: &'a CudaTable,
    nvml: &'a Nvml,
    dev: Dev,
    what: FirstUseOf,
    reserved: u64,
    free_before: Option<u64>,
    ended: bool,
    /// Released after the measurement (a field: dropped after `drop` ran).
    _gate: Option<Gate<'a>>,
}

impl FirstUseGuard<'_> {
    /// The call returned `r`; `fresh`: the handle it used or gave was new (see [`FirstUse::done`]).
    fn done(mut self, r: CUresult, fresh: bool) {
        self.end(r, fresh);
    }

    fn end(&mut self, r: CUresult, fresh: bool) {
        if !std::mem::replace(&mut self.ended, true) {
            self.first_use.done(self, r, fresh);
        }
    }
}

impl Drop for FirstUseGuard<'_> {
    fn drop(&mut self) {
        self.end(CUresult::ERROR_OUT_OF_MEMORY, false);
    }
}

/// Whose code or globals a lookup may load.
#[derive(Clone, Copy)]
pub(crate) enum Owner {
    /// A module's (its context's device).
    Module(CUmodule),
    /// A library's (loaded into the current context at its first use there).
    Library(CUlibrary),
    /// A kernel's (its library's, loaded into the current context; `cuKernelGetLibrary`, CUDA 12.5+, else
    /// unknown).
    Kernel(CUkernel),
    /// `cuLibraryGetModule` of a library: as [`Owner::Library`]; the module it returns lives in the current
    /// context, its device and image recorded so that lookups in it from another device are admitted there.
    ModuleOf(CUlibrary),
    /// `cuFuncLoad` of a function: its module's (`cuFuncGetModule`), the function the handle measured once.
    Function(CUfunction),
}

impl FirstUse {
    /// A lookup (`cuModuleGetFunction`, `cuModuleGetGlobal`, `cuLibraryGetGlobal`, `cuLibraryGetManaged`,
    /// `cuLibraryGetModule`, `cuKernelGetFunction`, `cuFuncLoad`): with lazy loading the driver loads the code
    /// and globals here, at first use, not at the module's load: into the module's context (a library's
    /// lookups: the current one). While a memory cap applies, admitted before `call`: the whole footprint of
    /// the owner's image is reserved (refused with `CUDA_ERROR_OUT_OF_MEMORY` when it does not fit, or while the
    /// container is over its cap); the first time a handle comes back (`handle`, read after a successful call;
    /// `None`: cannot be told, measured every time), this process is measured there. A module whose device this
    /// process does not know (`cuFuncGetModule`'s of a kernel's function) may live on any device: refused while
    /// any capped device is over its cap (fail closed), every capped device measured after.
    pub(super) fn lookup(
        &self,
        acc: &dyn Accounts,
        cuda: &CudaTable,
        nvml: &Nvml,
        owner: Owner,
        call: impl FnOnce() -> CUresult,
        handle: impl Fn() -> Option<usize>,
    ) -> CUresult {
        match owner {
            Owner::Function(f) => {
                let mut module: CUmodule = std::ptr::null_mut();
                // SAFETY: valid out-pointer; on failure it stays NULL, a module no one loaded (every device
                // checked).
                let _ = unsafe { cuda.cuFuncGetModule(&mut module, f) };
                self.lookup_in(acc, cuda, nvml, Owner::Module(module), call, || Some(f as usize))
            }
            Owner::ModuleOf(l) => {
                let r = self.lookup_in(acc, cuda, nvml, Owner::Library(l), call, &handle);
                if let (true, Some(m), Some(dev)) = (r.ok(), handle(), self.devices.current(cuda)) {
                    acc.module_on(m, dev.ordinal, l as usize);
                }
                r
            }
            _ => self.lookup_in(acc, cuda, nvml, owner, call, handle),
        }
    }

    fn lookup_in(
        &self,
        acc: &dyn Accounts,
        cuda: &CudaTable,
        nvml: &Nvml,
        owner: Owner,
        call: impl FnOnce() -> CUresult,
        handle: impl FnOnce() -> Option<usize>,
    ) -> CUresult {
        let (devs, image, ctx): (Vec<Dev>, _, _) = match owner {
            Owner::Module(m) => match acc.module_device(cuda, m as usize) {
                Some(d) => (vec![d], acc.image_of(m as usize), 0),
                None => (self.devices.known().map(|(d, _)| d).collect(), None, 0),
            },
            Owner::Library(l) | Owner::ModuleOf(l) => (
                self.devices.current(cuda).into_iter().collect(),
                acc.image_of(l as usize),
                current_ctx(cuda),
            ),
            Owner::Kernel(k) => {
                let mut l: CUlibrary = std::ptr::null_mut();
                // SAFETY: valid out-pointer; the program's kernel handle, which the driver checks.
                let image = unsafe { cuda.cuKernelGetLibrary(&mut l, k) }
                    .ok()
                    .then(|| acc.image_of(l as usize))
                    .flatten();
                (
                    self.devices.current(cuda).into_iter().collect(),
                    image,
                    current_ctx(cuda),
                )
            }
            // Resolved by `lookup`.
            Owner::Function(_) => (Vec::new(), None, 0),
        };
        let what = FirstUseOf {
            stack: 0,
            image,
            ctx,
            lookup: true,
        };
        let mut calls = Vec::with_capacity(devs.len());
        for d in devs {
            match self.begin(acc, cuda, nvml, d, what) {
                Ok(Some(c)) => calls.push(c),
                Ok(None) => {}
                // The guards so far give their reservations back.
                Err(_) => return CUresult::ERROR_OUT_OF_MEMORY,
            }
        }
        if calls.is_empty() {
            return call();
        }
        let since = self.generation();
        let r = call();
        // Without a handle (optional for globals) the lookup cannot be told from the last one: measured every
        // time (such calls are rare; a loop of them costs only its own process).
        let fresh = r.ok() && handle().is_none_or(|h| self.first(Use::Lookup, h, current_ctx(cuda), since));
        for c in calls {
            c.done(r, fresh);
        }
        r
    }
}

/// The context current on this thread (0 when none): a function's first launch is per context.
#[inline]
fn current_ctx(cuda: &CudaTable) -> usize {
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; on failure it stays NULL.
    let _ = unsafe { cuda.cuCtxGetCurrent(&mut c) };
    c as usize
}

/// The context a launch on `stream` (a handle, or `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD` for the NULL
/// stream) runs in, where the driver loads its code and grows its stack: the stream's own, whatever is current.
#[inline]
fn launch_ctx(cuda: &CudaTable, stream: usize) -> usize {
    if stream > CU_STREAM_PER_THREAD {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the program's stream for this launch, which the driver checks.
        if unsafe { cuda.cuStreamGetCtx(stream as CUstream, &mut c) }.ok() && !c.is_null() {
            return c as usize;
        }
    }
    current_ctx(cuda)
}

/// What [`FirstUse::first_launch`] let through; end it with [`FirstUse::launched`] (a first launch dropped
/// without it is taken as refused: its reservation goes back).
pub(crate) enum Launch<'a> {
    /// Launched in its context before, as of this generation of the seen set (a forget since, e.g. a context
    /// reset while the throttle held the launch back, makes it a first use again).
    Seen(u64),
    /// Its first launch in its context (boxed: the launch path carries two words, not the whole record).
    First(Box<FirstLaunch<'a>>),
}

impl Launch<'_> {
    /// Whether `self` and `other` are both first launches on one device (with a cap).
    pub(crate) fn same_device(&self, other: &Launch<'_>) -> bool {
        let dev = |l: &Launch<'_>| match l {
            Launch::First(c) => c.call.as_ref().map(|c| c.dev),
            _ => None,
        };
        dev(self).is_some_and(|d| dev(other) == Some(d))
    }
}

/// A first launch [`FirstUse::first_launch`] let through.
pub(crate) struct FirstLaunch<'a> {
    call: Option<FirstUseGuard<'a>>,
    how: Use,
    f: usize,
    ctx: usize,
    /// The seen set's generation before the launch: a module unloaded since may have freed `f`'s address.
    since: u64,
    /// Made while its stream was capturing: nothing loads or grows until the graph is launched, so the function
    /// is not marked launched.
    capturing: bool,
}

impl FirstUse {
    /// Before a launch of `f` (a function or kernel handle) on `stream` while a memory cap may apply:
    /// [`Launch::Seen`] when `f` was launched in the stream's context already (one thread-local cache probe,
    /// else one shard lock). Otherwise, its first launch there: the code may load now (lazy loading) and a
    /// kernel whose local memory exceeds the context's stack size makes the driver grow the stack for every
    /// thread the device holds. That growth is admitted here, asked of the stream's context and device (`Err`:
    /// refuse the launch with `CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked, `f` not marked);
    /// [`FirstUse::launched`] measures the process after the launch and marks `f` launched in that context if it
    /// succeeded. `how` is [`Use::Launch`] (`f` a function or kernel) or [`Use::Graph`] (`f` a graph exec,
    /// launched or uploaded: the stack its kernels need and their code's loading, listed at instantiation and
    /// update, are admitted the same way).
    #[inline(always)]
    pub(super) fn first_launch<'a>(
        &'a self,
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        stream: usize,
    ) -> Result<Launch<'a>, OverCap> {
        let ctx = launch_ctx(cuda, stream);
        if let Some(since) = self.seen_at(how, f, ctx) {
            return Ok(Launch::Seen(since));
        }
        self.first_launch_slow(acc, cuda, nvml, how, f, ctx, stream)
    }

    /// [`FirstUse::first_launch`] into `slot` (the launch path's form: a launch seen before stores its answer and
    /// goes on, with no refusal to check). False: refused. The family is `acc`'s ([`Accounts::first_use`]): the
    /// launch path keeps one pointer live across its calls, not two (with two, a launch under a cap spilled one
    /// more register: +1 instruction at the gate).
    #[inline(always)]
    pub(super) fn first_launch_to<'a, A: Accounts>(
        acc: &'a A,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        stream: usize,
        slot: &mut Option<Launch<'a>>,
    ) -> bool {
        let ctx = launch_ctx(cuda, stream);
        if let Some(since) = acc.first_use().seen_at(how, f, ctx) {
            *slot = Some(Launch::Seen(since));
            return true;
        }
        Self::first_launch_slow_to(acc, cuda, nvml, how, f, ctx, stream, slot)
    }

    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn first_launch_slow_to<'a>(
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        ctx: usize,
        stream: usize,
        slot: &mut Option<Launch<'a>>,
    ) -> bool {
        match acc
            .first_use()
            .first_launch_slow(acc, cuda, nvml, how, f, ctx, stream)
        {
            Ok(l) => {
                *slot = Some(l);
                true
            }
            Err(_) => false,
        }
    }

    /// The launch on `stream` that [`FirstUse::first_launch`] let through returned `r`.
    #[inline]
    pub(super) fn launched(
        &self,
        acc: &dyn Accounts,
        cuda: &CudaTable,
        nvml: &Nvml,
        l: Launch<'_>,
        stream: usize,
        r: CUresult,
    ) {
        match l {
            Launch::Seen(since) if self.generation() != since => {
                self.forgotten_meanwhile(acc, cuda, nvml, stream, r)
            }
            Launch::Seen(_) => {}
            Launch::First(c) => self.first_launch_done(*c, r),
        }
    }

    /// A launch seen before, during which the seen set forgot something: its code and stack may have been taken
    /// again (a reset context set up anew), unadmitted. Measured after, as a first use whose size is unknown.
    #[cold]
    #[inline(never)]
    fn forgotten_meanwhile(
        &self,
        acc: &dyn Accounts,
        cuda: &CudaTable,
        nvml: &Nvml,
        stream: usize,
        r: CUresult,
    ) {
        let ctx = launch_ctx(cuda, stream) as CUcontext;
        let current = || self.devices.current(cuda);
        let dev = in_context(cuda, ctx, current).unwrap_or_else(current);
        if let Some(c) = dev.and_then(|d| self.watch(acc, cuda, nvml, d)) {
            c.done(r, true);
        }
    }

    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn first_launch_slow<'a>(
        &'a self,
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        ctx: usize,
        stream: usize,
    ) -> Result<Launch<'a>, OverCap> {
        let since = self.generation();
        let mut status: CUstreamCaptureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: valid out-pointer; the program's stream for this launch. Unknown: not capturing (measured,
        // marked).
        let capturing = unsafe { cuda.cuStreamIsCapturing(stream as CUstream, &mut status) }.ok()
            && status != CU_STREAM_CAPTURE_STATUS_NONE;
        // Device, stack size and kernel attributes are the stream's context's. One that cannot be made current
        // (destroyed: the launch fails too) is asked in the current context.
        let call = if ctx == current_ctx(cuda) {
            self.first_launch_begin(acc, cuda, nvml, how, f, ctx)
        } else {
            in_context(cuda, ctx as CUcontext, || {
                self.first_launch_begin(acc, cuda, nvml, how, f, ctx)
            })
            .unwrap_or_else(|| self.first_launch_begin(acc, cuda, nvml, how, f, ctx))
        }?;
        Ok(Launch::First(Box::new(FirstLaunch {
            call,
            how,
            f,
            ctx,
            since,
            capturing,
        })))
    }

    /// The admission of `f`'s first launch in context `ctx`, which must be current: [`Use::Launch`] reserves
    /// `f`'s stack growth and loads its code first ([`FirstUse::loaded`]); [`Use::Graph`] (`f` an exec) reserves
    /// the stack its kernels grow and loads the code of each of its kernels not launched in `ctx` yet: the
    /// launch itself takes no code. Never holds a lock across the launch.
    fn first_launch_begin<'a>(
        &'a self,
        acc: &'a dyn Accounts,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        ctx: usize,
    ) -> Result<Option<FirstUseGuard<'a>>, OverCap> {
        let Some(dev) = self.devices.current(cuda) else {
            return Ok(None);
        };
        if self.devices.memory_cap(dev).is_none() {
            return Ok(None);
        }
        // Never the gate: a launch may wait on the program (a full stream), and nothing else may wait behind it.
        // Its code is loaded before the launch (below): the launch itself may only grow the stack.
        let mut what = FirstUseOf {
            ctx,
            image: Some(Image {
                key: 0,
                bytes: Some(0),
            }),
            ..FirstUseOf::default()
        };
        if how == Use::Graph {
            what.stack = stack::graph_growth(cuda, dev, acc.graph_stack(f));
            let call = self.begin(acc, cuda, nvml, dev, what)?;
            // Each kernel not launched here yet, as its direct first launch would (instantiation refuses an exec
            // whose kernels cannot all be listed while a cap applies).
            let kernels = acc.graph_kernels(f);
            let first = kernels
                .into_iter()
                .filter(|&k| self.seen_at(Use::Launch, k, ctx).is_none());
            return self.loaded_first(acc, cuda, nvml, call, first);
        }
        let f = f as CUfunction;
        let Some(local) = stack::local_size(cuda, f, dev.ordinal) else {
            log!(
                Level::Error,
                "launch of function {f:p} refused: the driver will not give its local memory size, so the stack \
                 its first launch grows cannot be admitted under the memory cap"
            );
            return Err(OverCap);
        };
        if local > 0 {
            what.stack = stack::bytes(cuda, dev, local.saturating_sub(stack::size(cuda)));
        }
        // The stack first: a launch refused for it loads nothing.
        let call = self.begin(acc, cuda, nvml, dev, what)?;
        self.loaded_first(acc, cuda, nvml, call, [f as usize])
    }

    /// `call` (a first launch's admission) once each of `funcs` has its code loaded ([`FirstUse::loaded`]); one
    /// refused refuses the launch (`call` dropped: its reservation goes back).
    fn loaded_first<'a>(
        &self,
        acc: &dyn Accounts,
        cuda: &CudaTable,
        nvml: &Nvml,
        call: Option<FirstUseGuard<'a>>,
        funcs: impl IntoIterator<Item = usize>,
    ) -> Result<Option<FirstUseGuard<'a>>, OverCap> {
        for f in funcs {
            if !self.loaded(acc, cuda, nvml, f as CUfunction) {
                return Err(OverCap);
            }
        }
        Ok(call)
    }

    /// Before a first launch of `f` in the current context: its code is loaded first, as the program's own call
    /// would load it (a lookup: admitted from its image, measured; it never waits on the program), so the launch
    /// itself takes no code. A function (a lazily loaded one may still be unloaded): `cuFuncLoad`; a `CUkernel`
    /// (static cudart 12+ launches those; its library loads into the context): `cuKernelGetFunction`. False:
    /// refused (over the cap). A handle that is neither, or a driver without `cuFuncLoad`, fails in the driver.
    fn loaded(&self, acc: &dyn Accounts, cuda: &CudaTable, nvml: &Nvml, f: CUfunction) -> bool {
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `f` is the program's handle for this launch, which the driver checks.
        let r = if unsafe { cuda.cuFuncGetModule(&mut module, f) }.ok() {
            // SAFETY: the program's handle; the driver checks it.
            let call = || unsafe { cuda.cuFuncLoad(f) };
            self.lookup(acc, cuda, nvml, Owner::Function(f), call, || Some(f as usize))
        } else {
            let mut g: CUfunction = std::ptr::null_mut();
            let gp: *mut CUfunction = &mut g;
            self.lookup(
                acc,
                cuda,
                nvml,
                Owner::Kernel(f as CUkernel),
                // SAFETY: `gp` is a local out-pointer; `f` is the program's handle for this launch.
                || unsafe { cuda.cuKernelGetFunction(gp, f as CUkernel) },
                // SAFETY: `gp` points at `g`, written by the driver on success.
                || Some(unsafe { *gp } as usize),
            )
        };
        r != CUresult::ERROR_OUT_OF_MEMORY
    }

    /// The first launch [`FirstUse::first_launch`] let through returned `r`.
    #[cold]
    #[inline(never)]
    fn first_launch_done(&self, c: FirstLaunch<'_>, r: CUresult) {
        let FirstLaunch {
            call,
            how,
            f,
            ctx,
            since,
            capturing,
        } = c;
        if let Some(call) = call {
            call.done(r, true);
        }
        if r.ok() && !capturing {
            self.first(how, f, ctx, since);
        }
    }
}

impl Accounts for Memory {
    #[inline(always)]
    fn first_use(&self) -> &FirstUse {
        &self.first_use
    }
    fn reserve(&self, dev: Dev, bytes: u64) -> Result<(), OverCap> {
        self.growing(dev, bytes)
    }
    fn credit_back(&self, dev: Dev) {
        self.give_back_credit(dev);
    }
    fn figure(&self, nvml: &Nvml, dev: Dev) -> Figure {
        self.nvml_figure(nvml, dev)
    }
    fn charge_lazy(&self, key: usize, ctx: usize, ordinal: CUdevice, bytes: u64, accumulate: bool) -> u64 {
        self.overhead.charge_lazy(key, ctx, ordinal, bytes, accumulate)
    }
    fn settle_measured(&self, nvml: &Nvml, dev: Dev, reserved: u64, r: CUresult, used: u64) {
        let _ = self.grown_to(nvml, dev, reserved, r, None::<fn() -> CUresult>, Some(used));
    }
    fn reconcile(&self, nvml: &Nvml, dev: Dev, cap: u64, figure: Figure) {
        let _ = self.reconcile.reconcile_to(self, nvml, dev, cap, 0, figure);
    }
    fn settle_unmeasured(&self, dev: Dev, reserved: u64, kept: u64) {
        let _g = self.overhead.lock();
        self.overhead.settle(dev, reserved);
        let now = self
            .overhead_of(dev)
            .saturating_sub(reserved)
            .saturating_add(kept);
        let _ = self.set_overhead_locked(dev, now, false);
    }
    fn image_of(&self, handle: usize) -> Option<Image> {
        self.overhead.image_of(handle)
    }
    fn module_on(&self, module: usize, ordinal: CUdevice, library: usize) {
        self.overhead.module_on(module, ordinal, library);
    }
    fn module_device(&self, cuda: &CudaTable, module: usize) -> Option<Dev> {
        Memory::module_device(self, cuda, module)
    }
    fn graph_stack(&self, exec: usize) -> u64 {
        self.graph.stack(exec)
    }
    fn graph_kernels(&self, exec: usize) -> Vec<usize> {
        self.graph.kernels(exec)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{capped, device_under, uuid, TempRegion};
    use super::*;
    use std::sync::Mutex;

    const MIB: u64 = 1 << 20;
    const MODULE: usize = 0x77;

    thread_local! {
        /// The fake driver's current context and the local memory per thread of every function (this thread's).
        static CTX: Cell<usize> = const { Cell::new(0x100) };
        static LOCAL: Cell<i32> = const { Cell::new(0) };
    }

    unsafe extern "C" fn ctx_device(d: *mut CUdevice) -> CUresult {
        // SAFETY: the caller's out-pointer.
        unsafe { *d = 0 };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn ctx_current(c: *mut CUcontext) -> CUresult {
        // SAFETY: the caller's out-pointer.
        unsafe { *c = CTX.with(|x| x.get()) as CUcontext };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn func_attribute(n: *mut i32, _a: CUfunction_attribute, _f: CUfunction) -> CUresult {
        // SAFETY: the caller's out-pointer.
        unsafe { *n = LOCAL.with(|x| x.get()) };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn func_module(m: *mut CUmodule, _f: CUfunction) -> CUresult {
        // SAFETY: the caller's out-pointer.
        unsafe { *m = MODULE as CUmodule };
        CUresult::SUCCESS
    }
    unsafe extern "C" fn func_load(_f: CUfunction) -> CUresult {
        CUresult::SUCCESS
    }

    /// A driver with one device, whose functions all belong to module [`MODULE`].
    fn driver() -> CudaTable {
        let mut t = CudaTable::empty(true);
        t.cuDeviceGetUuid_v2 = Some(uuid);
        t.cuCtxGetDevice = Some(ctx_device);
        t.cuCtxGetCurrent = Some(ctx_current);
        t.cuFuncGetAttribute = Some(func_attribute);
        t.cuFuncGetModule = Some(func_module);
        t.cuFuncLoad = Some(func_load);
        t
    }

    /// A first-use family on a fresh usage file, its devices capped at `cap`; device 0.
    fn fresh(cap: Option<u64>) -> (TempRegion, FirstUse, Dev) {
        let (t, devices, dev) = device_under("first-use", capped(cap), &driver());
        (t, FirstUse::new(devices), dev)
    }

    /// The other families as first use sees them: an overhead charge that reservations move, NVML's figure
    /// (`None`: no NVML), what was kept for the estimate, and how often a call was measured.
    struct Fake {
        fu: FirstUse,
        dev: Dev,
        /// Room for reservations (a reservation past it is refused).
        room: Cell<u64>,
        figure: Option<u64>,
        image: Option<Image>,
        overhead: Mutex<u64>,
        kept: Mutex<u64>,
        measured: Mutex<u32>,
    }

    impl Fake {
        fn new(fu: FirstUse, dev: Dev, figure: Option<u64>, image: Option<u64>) -> Fake {
            Fake {
                fu,
                dev,
                room: Cell::new(1 << 40),
                figure,
                image: image.map(|b| Image {
                    key: MODULE,
                    bytes: Some(b),
                }),
                overhead: Mutex::new(0),
                kept: Mutex::new(0),
                measured: Mutex::new(0),
            }
        }
        fn overhead(&self) -> u64 {
            *self.overhead.lock().unwrap()
        }
        fn kept(&self) -> u64 {
            *self.kept.lock().unwrap()
        }
        fn measured(&self) -> u32 {
            *self.measured.lock().unwrap()
        }
    }

    impl Accounts for Fake {
        fn first_use(&self) -> &FirstUse {
            &self.fu
        }
        fn reserve(&self, _dev: Dev, bytes: u64) -> Result<(), OverCap> {
            let mut o = self.overhead.lock().unwrap();
            if *o + bytes > self.room.get() {
                return Err(OverCap);
            }
            *o += bytes;
            Ok(())
        }
        fn credit_back(&self, _dev: Dev) {}
        fn figure(&self, _nvml: &Nvml, _dev: Dev) -> Figure {
            *self.measured.lock().unwrap() += 1;
            self.figure.map_or(Figure::NoNvml, Figure::Used)
        }
        fn charge_lazy(&self, _key: usize, _ctx: usize, _o: CUdevice, bytes: u64, _acc: bool) -> u64 {
            *self.kept.lock().unwrap() += bytes;
            bytes
        }
        fn settle_measured(&self, _nvml: &Nvml, _dev: Dev, _reserved: u64, _r: CUresult, used: u64) {
            *self.overhead.lock().unwrap() = used;
        }
        fn reconcile(&self, _nvml: &Nvml, _dev: Dev, _cap: u64, figure: Figure) {
            if let Figure::Used(u) = figure {
                *self.overhead.lock().unwrap() = u;
            }
        }
        fn settle_unmeasured(&self, _dev: Dev, reserved: u64, kept: u64) {
            let mut o = self.overhead.lock().unwrap();
            *o = o.saturating_sub(reserved) + kept;
        }
        fn image_of(&self, _handle: usize) -> Option<Image> {
            self.image
        }
        fn module_on(&self, _module: usize, _ordinal: CUdevice, _library: usize) {}
        fn module_device(&self, _cuda: &CudaTable, _module: usize) -> Option<Dev> {
            Some(self.dev)
        }
        fn graph_stack(&self, _exec: usize) -> u64 {
            0
        }
        fn graph_kernels(&self, _exec: usize) -> Vec<usize> {
            Vec::new()
        }
    }

    /// A launch of `f` on the NULL stream from admission to its end: `Err` refused, else whether it was a first.
    fn launch(fu: &FirstUse, acc: &Fake, cuda: &CudaTable, f: usize, r: CUresult) -> Result<bool, OverCap> {
        let nvml = Nvml::new(None);
        let l = fu.first_launch(acc, cuda, &nvml, Use::Launch, f, 0)?;
        let first = matches!(l, Launch::First(_));
        fu.launched(acc, cuda, &nvml, l, 0, r);
        Ok(first)
    }

    /// A function's first launch in a context loads its code (its module's image, admitted and kept) and is
    /// measured; launched again there it is seen (one cache probe, nothing measured); in another context it is
    /// a first launch again, its image kept once per context.
    #[test]
    fn a_first_launch_is_measured_once_per_handle_and_context() {
        let (_t, fu, dev) = fresh(Some(1 << 30));
        let cuda = driver();
        let acc = Fake::new(fu, dev, None, Some(MIB));
        let fu = &acc.fu;
        CTX.with(|c| c.set(0x100));
        assert!(!fu.armed(), "armed by a module's load");
        fu.arm();
        assert!(fu.armed());
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(true));
        // The code load (a lookup, measured) and the launch (measured): the image kept, no reservation left.
        assert_eq!((acc.measured(), acc.kept(), acc.overhead()), (2, MIB, MIB));
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(false));
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(false));
        assert_eq!(acc.measured(), 2, "a launch seen before is not measured");
        assert_eq!(launch(fu, &acc, &cuda, 0x2000, CUresult::SUCCESS), Ok(true));
        assert_eq!(acc.measured(), 4, "another function");
        CTX.with(|c| c.set(0x200));
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(true));
        assert_eq!(acc.measured(), 6, "another context");
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(false));
        // Without a cap nothing is admitted or measured.
        let (_u, uncapped, dev) = fresh(None);
        uncapped.arm();
        assert!(!uncapped.armed(), "no cap");
        let acc = Fake::new(uncapped, dev, None, Some(MIB));
        assert_eq!(launch(&acc.fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(true));
        assert_eq!((acc.measured(), acc.overhead()), (0, 0));
    }

    /// A launch admitted before a forget (a module unloaded meanwhile: its address may name new code) is not
    /// marked by its end, so the next launch is a first again; a launch seen before whose call ran across a
    /// forget is measured after (its context's code may have been taken again, unadmitted).
    #[test]
    fn a_use_begun_before_a_forget_is_not_recorded_end_to_end() {
        let (_t, fu, dev) = fresh(Some(1 << 30));
        let cuda = driver();
        let nvml = Nvml::new(None);
        let acc = Fake::new(fu, dev, Some(300 * MIB), Some(MIB));
        let fu = &acc.fu;
        CTX.with(|c| c.set(0x300));
        let l = fu
            .first_launch(&acc, &cuda, &nvml, Use::Launch, 0x1000, 0)
            .expect("admitted");
        assert!(matches!(l, Launch::First(_)));
        fu.forget_all();
        fu.launched(&acc, &cuda, &nvml, l, 0, CUresult::SUCCESS);
        assert_eq!(acc.overhead(), 300 * MIB, "measured");
        assert_eq!(
            launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS),
            Ok(true),
            "not recorded"
        );
        let l = fu
            .first_launch(&acc, &cuda, &nvml, Use::Launch, 0x1000, 0)
            .expect("admitted");
        assert!(matches!(l, Launch::Seen(_)));
        let before = acc.measured();
        fu.forget(Use::Graph, 0x5000);
        fu.launched(&acc, &cuda, &nvml, l, 0, CUresult::SUCCESS);
        assert_eq!(
            acc.measured(),
            before + 1,
            "a seen launch across a forget is measured"
        );
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(false));
        assert_eq!(acc.measured(), before + 1);
    }

    /// A first launch that grows the stack reserves the growth before the call: a growth that does not fit
    /// refuses the launch (nothing marked, the driver's code load not even asked); a launch that fails gives its
    /// reservation back and keeps nothing, and is not marked (without NVML, the charge that stays is the kept).
    #[test]
    fn a_failed_launch_charges_nothing() {
        let (_t, fu, dev) = fresh(Some(1 << 30));
        let cuda = driver();
        let acc = Fake::new(fu, dev, None, None);
        let fu = &acc.fu;
        CTX.with(|c| c.set(0x400));
        LOCAL.with(|l| l.set(16));
        let growth = stack::bytes(&cuda, dev, 16);
        assert!(growth > 0);
        acc.room.set(growth - 1);
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Err(OverCap));
        assert_eq!((acc.measured(), acc.overhead(), acc.kept()), (0, 0, 0));
        acc.room.set(1 << 40);
        assert_eq!(
            launch(fu, &acc, &cuda, 0x1000, CUresult::ERROR_INVALID_VALUE),
            Ok(true)
        );
        assert_eq!((acc.overhead(), acc.kept()), (0, 0), "nothing charged");
        assert_eq!(
            launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS),
            Ok(true),
            "not marked"
        );
        assert_eq!(
            (acc.overhead(), acc.kept()),
            (growth, growth),
            "the growth kept without NVML"
        );
        assert_eq!(launch(fu, &acc, &cuda, 0x1000, CUresult::SUCCESS), Ok(false));
        LOCAL.with(|l| l.set(0));
    }

    #[test]
    fn a_forgotten_handle_is_not_seen_from_any_threads_cache() {
        let (_t, f, _) = fresh(None);
        let (_u, other, _) = fresh(None);
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
        let (_t, f, _) = fresh(None);
        let since = f.generation();
        f.forget_all();
        assert!(f.first(Use::Launch, 0x1000, 7, since), "first");
        assert!(!f.seen(Use::Launch, 0x1000, 7), "recorded after the forget");
        assert!(f.first(Use::Launch, 0x1000, 7, f.generation()));
        assert!(f.seen(Use::Launch, 0x1000, 7));
    }

    #[test]
    fn the_gate_is_reentrant_on_a_thread_and_exclusive_across_threads() {
        let (_t, f, _) = fresh(None);
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
}

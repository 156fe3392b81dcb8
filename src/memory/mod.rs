//! Memory accounting: the per-process ledger, admission against the container's budget in the shared usage
//! region and against memory reserved for high-priority tenants (`reserve`), what pools hold (`pools`), and
//! what contexts and modules cost (`overhead`, with the host pid NVML knows us by, `host_pid`). Devices and
//! their limits come from `crate::devices`.
//!
//! Hot path of an allocation: one `cuCtxGetDevice` (none with a single visible device), one atomic load per
//! limits file (did it change?), then either the usage file's header check and a compare-and-swap on the slot's
//! credit word (`credit`: bytes charged ahead, far from the cap) or the region's lock-free reserve-then-sum with the usage
//! file's header checked after the charge (a few loads: a file another process truncated, zeroed or overwrote
//! fails closed, the charge taken back); one compare-and-swap in the ledger's lock-free table. No lock, no
//! syscall, no allocation. Slow paths (first use of a device, a limits-file change, a refused admission) may
//! read files.

mod allocs;
mod charge;
mod credit;
mod driver;
mod elastic;
mod families;
mod first_use;
mod graphs;
mod host_pid;
mod image;
mod interprocess;
mod ledger;
mod overhead;
mod pools;
mod reclaim_wait;
mod reconcile;
mod reserve;
mod shared;
mod stack;
mod vmm;
mod vmm_ops;

use crate::devices::{Dev, Devices};
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::{CUdevice, CUresult};
use crate::locks::{hold_all, release_all, Side};
use crate::log::{log, Level};
use cuquota_core::region::layout::MAX_DEVICES;
use cuquota_core::{DeviceId, UsageRegion};
use graphs::Graphs;
use overhead::Overhead;
use pools::Pools;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) use elastic::POLL as ELASTIC_POLL;
pub(crate) use first_use::{Launch, Owner, Use};
pub(crate) use graphs::{ExecCall, GraphChange};
pub(crate) use image::{
    footprint as image_footprint, footprint_at as image_footprint_at, inside as image_inside,
};
pub(crate) use interprocess::IpcCall;
pub(crate) use ledger::Space;
#[cfg(test)]
pub(crate) use ledger::{Kind, Record};
pub(crate) use overhead::{Creation, OverheadCall};
pub(crate) use pools::PoolCall;
pub(crate) use shared::{fd_key, key as shared_key};
pub(crate) use vmm::{BindKey, Obj};
pub(crate) use vmm_ops::VmmCall;

/// Bytes per device entry.
pub(super) type PerDevice = [AtomicU64; MAX_DEVICES];

/// Whether the usage file can still be trusted to enforce `limit` (`None`: nothing to enforce). A file
/// another process of the container truncated, zeroed or overwrote fails closed: refused, said once.
#[inline]
pub(super) fn usage_ok(usage: &UsageRegion, limit: Option<u64>) -> Result<(), OverCap> {
    if limit.is_none() {
        return Ok(());
    }
    usage.check().map_err(usage_broken)
}

/// [`usage_ok`]'s refusal, said once (out of line: the admitted path only compares).
#[cold]
#[inline(never)]
fn usage_broken(e: cuquota_core::region::RegionError) -> OverCap {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        log!(Level::Error, "{e}");
    }
    OverCap
}

/// An admission refused: the container would exceed its cap, or the device keep less than its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverCap;

/// An admitted allocation. Hold it until the driver call returned: while a reservation applies it keeps the
/// allocation announced to other tenants (see `reserve`).
#[must_use = "hold it until the driver call returned"]
pub(crate) struct Admitted<'a>(#[allow(dead_code)] Option<reserve::Announced<'a>>);

/// Everything memory accounting keeps for the process.
pub(crate) struct Memory {
    devices: Arc<Devices>,
    /// Live allocations, their charge and the credit ahead of them.
    allocs: allocs::Allocs,
    /// Handle references and mappings of its VMM allocations (when their charge goes).
    vmm: vmm::VmmLives,
    /// Memory shared with other processes through CUDA IPC.
    shared: shared::Shared,
    /// CUDA graph memory pools and execs with alloc nodes.
    graph: Graphs,
    /// Stream-ordered pools.
    pools: Pools,
    /// What contexts and modules cost: the charge, what this process holds, its host pid.
    overhead: Overhead,
    /// Handles whose first use (lazy loading, stack growth) was measured.
    first_use: first_use::FirstUse,
    /// Reconciliation with NVML near the cap.
    reconcile: reconcile::Reconcile,
    /// Movable ranges of an elastic tenant (issue 39).
    elastic: elastic::Elastic,
}

impl Memory {
    /// Accounting of the devices in `devices`.
    pub(crate) fn new(devices: Arc<Devices>) -> Memory {
        Memory {
            elastic: elastic::Elastic::new(devices.clone()),
            allocs: allocs::Allocs::new(devices.clone()),
            overhead: Overhead::new(devices.clone()),
            first_use: first_use::FirstUse::new(devices.clone()),
            reconcile: reconcile::Reconcile::new(devices.clone()),
            devices,
            vmm: vmm::VmmLives::default(),
            shared: shared::Shared::default(),
            graph: Graphs::new(),
            pools: Pools::new(),
        }
    }

    /// The elastic family: movable ranges, the mover's turn, the bounded reclaim wait.
    #[inline(always)]
    pub(crate) fn elastic(&self) -> &elastic::Elastic {
        &self.elastic
    }

    /// The host pid NVML knows this process by, once learned.
    pub(super) fn host_pid(&self) -> Option<u32> {
        self.overhead.host().get()
    }

    /// Puts a record in the ledger as if an allocation had made it (unit tests of what hooks do with it).
    #[cfg(test)]
    pub(super) fn record(&self, space: ledger::Space, key: u64, rec: ledger::Record) {
        self.allocs.ledger().insert(space, key, rec);
    }

    fn usage(&self) -> &UsageRegion {
        self.devices.usage()
    }

    /// Bytes the whole container has charged on a device (credit charged ahead included: what admission
    /// decides by).
    #[cfg(test)]
    pub(super) fn container_used(&self, dev: Dev) -> u64 {
        self.usage().container_used(dev.id)
    }

    /// Turns this process's credit off everywhere and takes it back from its slot (at exit, before the slot
    /// is given back).
    pub(crate) fn give_back_all_credit(&self) {
        self.allocs.give_back_all_credit();
    }

    /// Turns this process's credit on `dev` off and takes it back from its slot (before an exact admission or
    /// a reconciliation).
    fn give_back_credit(&self, dev: Dev) {
        self.allocs.give_back_credit(dev);
    }

    // ---- admission -----------------------------------------------------------------------------------------

    /// Reserves `bytes` for an allocation on `dev` (see `Allocs::admit_credit`): a context on `dev` we never saw
    /// created is charged first, and an admission near the cap is reconciled with NVML. `Err` = refused:
    /// nothing charged.
    #[inline(always)]
    pub(super) fn admit(
        &self,
        dev: Dev,
        bytes: u64,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Admitted<'_>, OverCap> {
        if bytes == 0 {
            return Ok(Admitted(None));
        }
        // A context on `dev` we never saw created (the runtime's export table hands out the primary context):
        // its cost is charged before anything is allocated in it.
        self.adopt_unseen_context(nvml, dev)?;
        match self.allocs.admit_credit(self.overhead.charged(), dev, bytes) {
            Ok(admitted) => Ok(admitted),
            Err(limits) => self.admit_charged(dev, bytes, limits, cuda, nvml),
        }
    }

    /// [`Memory::admit`] past the credit (out of line: see `Allocs::admit_charged`).
    #[inline(never)]
    fn admit_charged(
        &self,
        dev: Dev,
        bytes: u64,
        limits: allocs::Limits,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Admitted<'_>, OverCap> {
        let free = |dev, uuid| reserve::device_free(cuda, nvml, dev, uuid);
        let near_cap = |cap, used| self.near_cap_check(nvml, dev, bytes, cap, used);
        self.allocs
            .admit_charged(self.overhead.charged(), dev, bytes, limits, free, near_cap)
    }

    /// What `cuMemGetInfo` of `dev` capped at `cap` reports used: the container's charge, which near the cap is
    /// first reconciled with the driver's figure (`Reconcile`). This process's pools on `dev` are re-read first.
    #[inline(always)]
    pub(super) fn info_used(&self, cuda: &CudaTable, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        self.refresh_pools_of(cuda, dev.id);
        let (used, held) = self.usage().container_used_held(dev.id);
        if reconcile::near_cap(cap, used) {
            return self.reconcile.info_used_slow(self, nvml, dev, cap);
        }
        held
    }

    /// An admission of `bytes` on `dev` that brought the container to `used` under `cap`: near the cap the
    /// driver's figure decides, not the ledger alone (`Reconcile`). `Err`: refused.
    #[inline]
    fn near_cap_check(&self, nvml: &Nvml, dev: Dev, bytes: u64, cap: u64, used: u64) -> Result<(), OverCap> {
        if reconcile::near_cap(cap, used) {
            return self.reconcile.near_cap_slow(self, nvml, dev, bytes, cap);
        }
        Ok(())
    }

    /// Charges `bytes` whatever the limit (the driver already handed the memory out).
    pub(super) fn force(&self, dev: Dev, bytes: u64) {
        self.allocs.force(self.overhead.charged(), dev, bytes);
    }

    /// A charge this process had moved into the shared table comes back onto its slot (an exported pool
    /// allocation returned to its pool's reserve): `allocated` counted it all along.
    pub(crate) fn take_back(&self, id: DeviceId, bytes: u64) {
        if let Ok(slot) = self.usage().process_slot() {
            let _ = self.usage().try_charge(slot, id, bytes, None);
        }
    }

    /// Gives back `bytes` charged on `dev`.
    pub(crate) fn release(&self, dev: Dev, bytes: u64) {
        self.allocs.release(self.overhead.charged(), dev.id, bytes);
    }

    /// Gives back `bytes` charged on device entry `id`.
    pub(crate) fn release_entry(&self, id: DeviceId, bytes: u64) {
        self.allocs.release(self.overhead.charged(), id, bytes);
    }

    /// HAMi's file shows this process's figures on `id` (docs/hami.md): relaxed stores, no syscall.
    #[inline]
    fn hami_publish(&self, id: DeviceId) {
        self.allocs.hami_publish(self.overhead.charged(), id);
    }

    /// Moves `bytes` this process charged on `id` into the container's shared table under `key` (IPC export):
    /// the entry index and whether the charge moved (not when `key` had an entry already). `None`: no slot, or
    /// the table is full.
    pub(crate) fn share(&self, id: DeviceId, key: u64, bytes: u64) -> Option<(usize, bool)> {
        let slot = self.usage().process_slot().ok()?;
        self.usage().share(slot, id, key, bytes)
    }

    /// Holds this container's shared entry under `key`, if there is one (IPC import).
    pub(crate) fn join_shared(&self, key: u64) -> Option<usize> {
        let slot = self.usage().process_slot().ok()?;
        self.usage().join_shared(slot, key)
    }

    /// Lets go of shared entry `entry` (the last holder's going takes its bytes off the container's usage).
    pub(crate) fn unshare(&self, entry: usize, key: u64) {
        if let Some(slot) = self.usage().cached_slot() {
            self.usage().unshare(slot, entry, key);
        }
    }

    /// The exported allocation at `p` (`rec`, its record, already out of the ledger) is gone in this process
    /// (freed, or its context destroyed): this process lets go of its shared entry, where importers may still
    /// hold the memory, and its own charge of it goes.
    fn export_gone(
        &self,
        cuda: &CudaTable,
        p: u64,
        e: shared::Export,
        rec: Option<ledger::Record>,
        stream: Option<usize>,
    ) {
        match rec {
            Some(ledger::Record {
                entry,
                bytes,
                kind: ledger::Kind::Pool(pool),
            }) => {
                // The block goes back into the pool's reserve, still charged to this process: its charge comes
                // back here before this process lets go of the shared entry.
                if e.moved {
                    self.take_back(entry, bytes);
                }
                self.unshare(e.entry, e.key);
                self.pools.back(cuda, self, pool, p, bytes, stream);
            }
            Some(rec) => {
                self.unshare(e.entry, e.key);
                if e.moved {
                    self.forget_allocated(rec.entry, rec.bytes);
                    self.shared.linger(e, rec.bytes, rec.entry, |entry, key| {
                        self.usage().shared_live(entry, key)
                    });
                } else {
                    self.release_entry(rec.entry, rec.bytes);
                }
            }
            None => self.unshare(e.entry, e.key),
        }
    }

    /// Bytes on `dev` of exports this process let go of that others still hold (see `Shared::linger`).
    pub(crate) fn lingering(&self, dev: Dev) -> u64 {
        self.shared
            .lingering(dev.id, |entry, key| self.usage().shared_live(entry, key))
    }

    /// This process no longer holds `bytes` on `id` whose charge it had moved to the shared table.
    pub(crate) fn forget_allocated(&self, id: DeviceId, bytes: u64) {
        self.allocs.forget(self.overhead.charged(), id, bytes);
    }

    /// Corrects an admitted `estimate` to the `exact` charge.
    pub(crate) fn settle(&self, dev: Dev, estimate: u64, exact: u64) {
        if exact > estimate {
            self.force(dev, exact - estimate);
        } else {
            self.release(dev, estimate - exact);
        }
    }

    /// Bytes of allocations this process has charged on `dev` (overhead excluded).
    pub(crate) fn allocated(&self, dev: Dev) -> u64 {
        self.allocs.allocated(dev.id)
    }

    /// Overhead this process has charged on `dev`.
    pub(crate) fn overhead_of(&self, dev: Dev) -> u64 {
        self.overhead.of(dev)
    }

    /// Moves this process's overhead charge on `dev` to `target` bytes (the caller holds the overhead lock; see
    /// `Overhead::set`) and publishes it.
    fn set_overhead_locked(&self, dev: Dev, target: u64, admit: bool) -> Result<(), OverCap> {
        self.overhead.set_published(self, dev, target, admit)
    }

    /// What NVML says this process holds on `dev` (see `Overhead::figure`).
    fn nvml_figure(&self, nvml: &Nvml, dev: Dev) -> overhead::Figure {
        self.overhead.figure(nvml, dev)
    }

    /// Before a call that grows a reservation on `dev` by about `growth` bytes (see `Overhead::growing`).
    fn growing(&self, dev: Dev, growth: u64) -> Result<(), OverCap> {
        self.overhead.growing(self, dev, growth)
    }

    /// The call [`Memory::growing`] admitted returned `r`, NVML's figure `used` (see `Overhead::grown_to`).
    fn grown_to(
        &self,
        nvml: &Nvml,
        dev: Dev,
        growth: u64,
        r: CUresult,
        undo: Option<impl FnOnce() -> CUresult>,
        used: Option<u64>,
    ) -> CUresult {
        self.overhead.grown_to(self, nvml, dev, growth, r, undo, used)
    }

    /// The device of module `module`'s context, when this process loaded it.
    pub(crate) fn module_device(&self, cuda: &CudaTable, module: usize) -> Option<Dev> {
        self.overhead.module_device(cuda, module)
    }

    /// A context on `dev` we never saw created is charged before an allocation in it (see
    /// `Overhead::adopt_unseen`; two relaxed loads when there is none).
    #[inline(always)]
    fn adopt_unseen_context(&self, nvml: &Nvml, dev: Dev) -> Result<(), OverCap> {
        self.overhead.adopt_unseen(self, nvml, dev)
    }

    // ---- pools and what the driver freed on its own -----------------------------------------------------------

    /// `call`, the pool call `what` describes, with what memory keeps of pools (`Pools` holds the logic): an
    /// allocation is admitted as `Pools::alloc` says (`CUDA_ERROR_OUT_OF_MEMORY`, the driver not called, when it
    /// does not fit); a trim re-reads the pool's reserved size; a destroy gives its charge back once its
    /// allocations are freed; a synchronisation lets destroyed pools whose frees it waited for go.
    pub(crate) fn pool(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        what: PoolCall<'_>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match what {
            PoolCall::Alloc {
                pool,
                bytes,
                stream_dev,
                out,
            } => self.pool_alloc(cuda, nvml, pool, bytes, stream_dev, out, call),
            PoolCall::Create { on, out } => self.pools.create(on, call, out),
            PoolCall::Trim(pool) => self.pools.trim(cuda, self, pool, call),
            PoolCall::Destroy(pool) => self.pools.destroy(cuda, self, self.allocs.ledger(), pool, call),
            PoolCall::Synchronize { dev, stream } => self.pools.synchronize(self, dev, stream, call),
        }
    }

    /// [`PoolCall::Alloc`] where `Pools::place` says: a host pool's allocation is not device memory; one on a
    /// device without an accounting identity is `untracked`; one from a current pool the driver will not name
    /// is charged as a plain allocation; a pool allocation is admitted through `Memory::charge` and recorded in
    /// the ledger.
    #[allow(clippy::too_many_arguments)]
    fn pool_alloc(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        pool: Option<usize>,
        bytes: u64,
        stream_dev: &dyn Fn() -> Option<Dev>,
        out: &dyn Fn() -> u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let devs = self.devices.known().map(|(d, _)| d);
        let (dev, pool) = match self.pools.place(cuda, devs, pool, stream_dev) {
            pools::Place::Pool(dev, pool) => (dev, pool),
            pools::Place::Host => return call(),
            pools::Place::Unplaced => return self.untracked(call),
            pools::Place::Plain(dev) => {
                let est = self.devices.round(cuda, dev, bytes);
                return self.charged_call(cuda, nvml, dev, est, call, || {
                    Some((ledger::Space::Pointer, out(), None))
                });
            }
        };
        let len = self.devices.round(cuda, dev, bytes);
        let admit = |n| self.charge(dev, n, cuda, nvml).ok();
        let recorded = || {
            let addr = out();
            let rec = ledger::Record {
                entry: dev.id,
                bytes: len,
                kind: ledger::Kind::Pool(pool),
            };
            let stale = self.allocs.ledger().insert(ledger::Space::Pointer, addr, rec);
            self.release_stale(stale);
            addr
        };
        self.pools
            .alloc(cuda, self, dev, pool, len, admit, call, recorded)
    }

    /// Refreshes every pool on a device entry (before refusing a pool allocation).
    #[inline]
    pub(crate) fn refresh_pools_of(&self, cuda: &CudaTable, id: DeviceId) {
        self.pools.refresh_of(cuda, self, id);
    }

    /// The last context this process had on `dev` is gone (destroyed, reset or released for the last time):
    /// the driver freed every allocation made in it, so their records and charges go too. VMM handles
    /// (`cuMemCreate`) are not tied to a context and stay; pools and graph pools are re-read.
    pub(super) fn forget_context_allocations(&self, cuda: &CudaTable, dev: Dev) {
        self.forget_freed(cuda, |space, _, rec| {
            space != ledger::Space::Vmm && rec.entry == dev.id
        });
        self.pools.context_ended(cuda, self, dev);
        if self.graph.charges(dev) {
            self.graph.settle(cuda, self, dev);
        }
    }

    /// A context on `dev` went away while others live there: the driver freed what was allocated in it, but a
    /// record does not say which context made it. Each direct allocation of the device is asked about (rare and
    /// slow: one driver query per record, while the record is held); one the driver no longer knows at its
    /// address is gone (`allocs::freed_by`). Any other answer keeps the charge (over-count, never under).
    /// Arrays stay charged.
    pub(crate) fn forget_dead_allocations(&self, cuda: &CudaTable, dev: Dev) {
        self.forget_freed(cuda, |space, key, rec| {
            space == ledger::Space::Pointer
                && rec.entry == dev.id
                && rec.kind == ledger::Kind::Direct
                && allocs::freed_by(cuda, key)
        });
    }

    /// Takes the records `gone` names out (see `Allocs::forget_where`): an export lets go of its shared entry
    /// (its charge may live in the shared table, and importers may still hold it), a destroyed pool counts its
    /// allocation down, a plain allocation's charge goes back.
    fn forget_freed(&self, cuda: &CudaTable, gone: impl Fn(ledger::Space, u64, &ledger::Record) -> bool) {
        let exported = |space, key, rec| {
            let e = (space == ledger::Space::Pointer)
                .then(|| self.shared.take_export(key))
                .flatten();
            e.map(|e| self.export_gone(cuda, key, e, Some(rec), None))
                .is_some()
        };
        self.allocs
            .forget_where(self.overhead.charged(), gone, exported, |pool| {
                self.pools.record_gone(self, pool)
            });
    }

    // ---- fork ----------------------------------------------------------------------------------------------

    /// Drops per-process accounting after `fork` in the child (the parent keeps its charges; the child claims
    /// its own slot on first use and learns its own host pid). Call only in the single-threaded child, after
    /// the locks were released.
    pub(crate) fn reset_in_child(&self) {
        self.usage().forget_slot_in_child();
        self.allocs.reset();
        self.vmm.clear();
        self.shared.clear();
        self.pools.reset();
        self.graph.reset();
        self.overhead.reset();
        self.first_use.reset();
        self.reconcile.reset();
        self.elastic.reset();
    }

    /// Takes every lock of memory accounting, in the order `state`'s fork handlers document.
    pub(crate) fn fork_prepare(&self) {
        hold_all([self.elastic.lock()]);
        hold_all(self.allocs.ledger().locks());
        hold_all([self.vmm.lock()]);
        self.shared.fork_prepare();
        self.pools.fork_prepare();
        self.graph.fork_prepare();
        self.overhead.fork_prepare();
        hold_all(self.first_use.locks());
    }

    /// Undoes [`Memory::fork_prepare`] (parent and child).
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(crate) unsafe fn fork_release(&self, side: Side) {
        // SAFETY: all locked by fork_prepare (the caller's contract).
        unsafe {
            release_all(self.first_use.locks(), side);
            self.overhead.fork_release(side);
            self.graph.fork_release(side);
            self.pools.fork_release(side);
            self.shared.fork_release(side);
            release_all([self.vmm.lock()], side);
            release_all(self.allocs.ledger().locks(), side);
            release_all([self.elastic.lock()], side);
            if side == Side::Child {
                self.first_use.forked_child();
            }
        }
    }

    /// Takes memory's leaf locks (held by no one who then waits for another lock: images, first-use charges,
    /// graph kernels) for the fork, after every other group: a child resets what they guard.
    pub(crate) fn fork_prepare_leaves(&self) {
        self.overhead.fork_prepare_leaves();
        self.graph.fork_prepare_leaves();
    }

    /// Undoes [`Memory::fork_prepare_leaves`] (parent and child).
    ///
    /// # Safety
    /// Only after `fork_prepare_leaves` on this thread (or in the child of that thread).
    pub(crate) unsafe fn fork_release_leaves(&self, side: Side) {
        // SAFETY: all locked by fork_prepare_leaves (the caller's contract).
        unsafe {
            self.graph.fork_release_leaves(side);
            self.overhead.fork_release_leaves(side);
        }
    }
}

impl reconcile::Others for Memory {
    fn credit_back(&self, dev: Dev) {
        self.give_back_credit(dev);
    }

    fn figure(&self, nvml: &Nvml, dev: Dev) -> overhead::Figure {
        self.nvml_figure(nvml, dev)
    }

    fn allocated(&self, dev: Dev) -> u64 {
        Memory::allocated(self, dev)
    }

    fn lingering(&self, dev: Dev) -> u64 {
        Memory::lingering(self, dev)
    }

    fn overhead_lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.overhead.lock()
    }

    fn overhead(&self, dev: Dev) -> u64 {
        self.overhead_of(dev)
    }

    fn inflight(&self, dev: Dev) -> u64 {
        self.overhead.inflight(dev)
    }

    fn set_overhead(&self, dev: Dev, target: u64) -> Result<(), OverCap> {
        self.set_overhead_locked(dev, target, false)
    }

    fn host_pid(&self) -> Option<u32> {
        self.overhead.host().get()
    }
}

impl overhead::Others for Memory {
    fn allocated(&self, dev: Dev) -> u64 {
        Memory::allocated(self, dev)
    }

    fn lingering(&self, dev: Dev) -> u64 {
        Memory::lingering(self, dev)
    }

    fn published(&self, dev: Dev) {
        self.hami_publish(dev.id);
        self.reconcile.measured(dev);
    }

    fn code_gone(&self) {
        self.first_use.forget_all();
    }

    fn code_loaded(&self) {
        self.first_use.arm();
    }

    fn context_destroyed(&self, cuda: &CudaTable, ctx: usize) {
        self.elastic.context_destroyed(cuda, ctx);
    }

    fn primary_released(&self, cuda: &CudaTable, ordinal: CUdevice, owned: &dyn Fn(usize) -> bool) {
        if self.elastic.on() {
            self.elastic.primary_released(cuda, ordinal, owned);
        }
    }

    fn allocations_gone(&self, cuda: &CudaTable, dev: Dev, last: bool) {
        if last {
            self.forget_context_allocations(cuda, dev);
        } else {
            self.forget_dead_allocations(cuda, dev);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::devices::{Dev, Devices};
    use crate::driver::cuda::CudaTable;
    use crate::ffi::cuda::{CUdevice, CUresult, CUuuid};
    use cuquota_core::{Config, DeviceId, Policy, UsageRegion};
    use std::sync::Arc;

    /// `cuDeviceGetUuid_v2` of a fake driver: device `dev`'s UUID is 16 bytes of `dev + 5`.
    pub(crate) unsafe extern "C" fn uuid(u: *mut CUuuid, dev: CUdevice) -> CUresult {
        // SAFETY: the caller's out-pointer.
        unsafe { (*u).bytes = [dev as u8 + 5; 16] };
        CUresult::SUCCESS
    }

    /// A driver that knows its devices' UUIDs ([`uuid`]) and nothing else.
    pub(crate) fn uuid_table() -> CudaTable {
        let mut cuda = CudaTable::empty(true);
        cuda.cuDeviceGetUuid_v2 = Some(uuid);
        cuda
    }

    /// Device 0 as `cuda` names it, on a fresh usage file (`tag` in its name) whose devices are under `policy`:
    /// the file's guard, the devices and the device.
    pub(crate) fn device_under(
        tag: &str,
        policy: Policy,
        cuda: &CudaTable,
    ) -> (TempRegion, Arc<Devices>, Dev) {
        let t = temp_path(tag);
        let cfg = Config {
            default_limits: policy,
            ..Default::default()
        };
        let usage = UsageRegion::open(&t.path).expect("usage region");
        let devices = Arc::new(Devices::new(cfg, usage, Vec::new(), None));
        let dev = devices.device(cuda, 0).expect("device 0");
        (t, devices, dev)
    }

    /// A policy of only a memory cap.
    pub(crate) fn capped(cap: Option<u64>) -> Policy {
        Policy {
            memory: cap,
            ..Policy::NONE
        }
    }

    /// A fresh usage file under the temp dir (removed on drop of the returned guard).
    pub(crate) struct TempRegion {
        pub path: std::path::PathBuf,
    }
    impl Drop for TempRegion {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// A unique temp path for a region file.
    pub(crate) fn temp_path(tag: &str) -> TempRegion {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "cuquota-unit-{}-{}-{}",
            std::process::id(),
            tag,
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        TempRegion { path }
    }

    /// A device entry in a throwaway region.
    pub(crate) fn device_id() -> (TempRegion, DeviceId) {
        let t = temp_path("dev");
        let r = UsageRegion::open(&t.path).expect("usage region");
        let id = r.device(&[7; 16]).expect("device entry");
        (t, id)
    }
}

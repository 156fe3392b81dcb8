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
use crate::locks::Lock;
use crate::locks::{hold_all, release_all, Side};
use crate::log::{log, Level};
use cuquota_core::region::layout::MAX_DEVICES;
use cuquota_core::{DeviceId, UsageRegion};
use graphs::Graphs;
use host_pid::HostPid;
use ledger::Ledger;
use overhead::Holdings;
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
    /// Live allocations of this process.
    ledger: Ledger,
    /// Handle references and mappings of its VMM allocations (when their charge goes).
    vmm: vmm::VmmLives,
    /// Memory shared with other processes through CUDA IPC.
    shared: shared::Shared,
    /// CUDA graph memory pools and execs with alloc nodes.
    graph: Graphs,
    /// Stream-ordered pools.
    pools: Pools,
    /// Bytes this process has charged for allocations (not overhead), per device entry.
    alloc_bytes: [AtomicU64; MAX_DEVICES],
    /// Context/module overhead this process has charged, per device entry.
    overhead: [AtomicU64; MAX_DEVICES],
    /// Bytes charged ahead of allocations, per device entry.
    credit: credit::Credit,
    /// Serialises overhead re-measurements (slow path only).
    overhead_lock: Lock<()>,
    /// Contexts and modules this process holds (overhead estimate, owner devices).
    holdings: Holdings,
    /// The pid NVML knows this process by.
    host: HostPid,
    /// Handles whose first use (lazy loading, stack growth) was measured.
    first_use: first_use::FirstUse,
    /// Movable ranges of an elastic tenant (issue 39).
    elastic: elastic::Elastic,
}

impl Memory {
    /// Accounting of the devices in `devices`.
    pub(crate) fn new(devices: Arc<Devices>) -> Memory {
        Memory {
            elastic: elastic::Elastic::new(devices.clone()),
            devices,
            ledger: Ledger::new(),
            vmm: vmm::VmmLives::default(),
            shared: shared::Shared::default(),
            graph: Graphs::new(),
            pools: Pools::new(),
            alloc_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            overhead: std::array::from_fn(|_| AtomicU64::new(0)),
            credit: credit::Credit::default(),
            overhead_lock: Lock::new(()),
            holdings: Holdings::default(),
            host: HostPid::default(),
            first_use: first_use::FirstUse::default(),
        }
    }

    /// The elastic family: movable ranges, the mover's turn, the bounded reclaim wait.
    #[inline(always)]
    pub(crate) fn elastic(&self) -> &elastic::Elastic {
        &self.elastic
    }

    /// The host pid NVML knows this process by, once learned.
    pub(super) fn host_pid(&self) -> Option<u32> {
        self.host.get()
    }

    /// Puts a record in the ledger as if an allocation had made it (unit tests of what hooks do with it).
    #[cfg(test)]
    pub(super) fn record(&self, space: ledger::Space, key: u64, rec: ledger::Record) {
        self.ledger.insert(space, key, rec);
    }

    fn usage(&self) -> &UsageRegion {
        self.devices.usage()
    }

    /// Current effective memory limit of a device (`None` = no limit).
    #[inline]
    fn limit(&self, dev: Dev) -> Option<u64> {
        self.devices.memory_cap(dev)
    }

    /// Bytes the whole container has charged on a device (credit charged ahead included: what admission
    /// decides by).
    pub(super) fn container_used(&self, dev: Dev) -> u64 {
        self.usage().container_used(dev.id)
    }

    /// Bytes the container's processes hold on a device: its charge less the credit (what `cuMemGetInfo` and
    /// NVML report used; credit is taken back before anyone is refused).
    fn container_held(&self, dev: Dev) -> u64 {
        self.usage().container_held(dev.id)
    }

    /// Turns this process's credit off everywhere and takes it back from its slot (at exit, before the slot
    /// is given back).
    pub(crate) fn give_back_all_credit(&self) {
        self.credit.close();
        for dev in self.devices.known().map(|(d, _)| d) {
            self.give_back_credit(dev);
        }
    }

    /// Turns this process's credit on `dev` off and takes it back from its slot (before an exact admission or
    /// a reconciliation).
    fn give_back_credit(&self, dev: Dev) {
        // Off (and the turn-off counted) even when not on: a chunk being charged meanwhile stays off.
        self.credit.off(dev.id.index());
        if let Some(slot) = self.usage().cached_slot() {
            self.usage().drain_credit(slot, dev.id);
        }
    }

    // ---- admission -----------------------------------------------------------------------------------------

    /// Reserves `bytes` for an allocation on `dev` against the effective limit (dead processes are reclaimed
    /// once before giving up) and, when the device's limits keep memory for high-priority tenants and this
    /// process is not one, against the device's free memory (`cuda`, `nvml`). `Err` = refused: nothing
    /// charged.
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
        let (limit, reserved) = self.devices.memory_limits(dev);
        if let (Some(_), None) = (limit, reserved) {
            if self.credit.on_under(dev.id.index(), self.devices.limits_gen())
                && self.take_credit(dev, bytes, limit)
            {
                self.alloc_bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
                self.hami_publish(dev.id);
                return Ok(Admitted(None));
            }
        }
        self.admit_charged(dev, bytes, limit, reserved, cuda, nvml)
    }

    /// `bytes` from this process's credit on `dev`, with the usage file's tamper check (it fails closed here as
    /// on the charged path).
    #[inline(always)]
    fn take_credit(&self, dev: Dev, bytes: u64, limit: Option<u64>) -> bool {
        let u = self.usage();
        match u.cached_slot() {
            Some(slot) => self.shared_ok(limit).is_ok() && u.take_credit(slot, dev.id, bytes),
            None => false,
        }
    }

    /// [`Memory::admit`] past the credit: the credit goes back, the slot is charged and the container summed
    /// (reconciled near the cap), and far from the cap a chunk is charged ahead (`credit`).
    #[inline(never)]
    fn admit_charged(
        &self,
        dev: Dev,
        bytes: u64,
        limit: Option<u64>,
        reserved: Option<u64>,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Admitted<'_>, OverCap> {
        if limit.is_some() {
            self.give_back_credit(dev);
        }
        let used = self.charge_cap(dev, bytes, limit)?;
        if let Some(cap) = limit {
            self.near_cap_check(nvml, dev, bytes, cap, used)?;
        }
        match (reserved, limit) {
            (Some(reserved), _) => self.admit_reserved(dev, bytes, reserved, cuda, nvml),
            (None, Some(cap)) => {
                if credit::far_from_cap(cap, used) && self.credit.wants_chunk(dev.id.index(), bytes) {
                    self.charge_ahead(dev, cap);
                }
                Ok(Admitted(None))
            }
            (None, None) => Ok(Admitted(None)),
        }
    }

    /// Charges a chunk of credit on `dev` under `cap` (nothing when it does not fit, or when an admission near
    /// the cap turned credit off meanwhile).
    fn charge_ahead(&self, dev: Dev, cap: u64) {
        let Some(slot) = self.usage().cached_slot() else {
            return;
        };
        let i = dev.id.index();
        let offs = self.credit.offs(i);
        if !self.usage().charge_credit(slot, dev.id, credit::CHUNK, cap) {
            return;
        }
        // The chunk was judged against `cap`: on only under limits that still say `cap` (a changed limits
        // file seen by another thread meanwhile bumped the generation read here, or changes the cap read after).
        let gen = self.devices.limits_gen();
        if self.devices.memory_cap(dev) != Some(cap) || !self.credit.on_after(i, gen, offs) {
            self.credit.off(i);
            self.usage().drain_credit(slot, dev.id);
        }
    }

    /// The part of [`Memory::admit`] for a device whose limits keep `reserved` bytes for high-priority tenants
    /// (out of line: the capped path does not carry it).
    #[inline(never)]
    fn admit_reserved(
        &self,
        dev: Dev,
        bytes: u64,
        reserved: u64,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Admitted<'_>, OverCap> {
        let Some(e) = self.devices.priority_entry(dev) else {
            log!(
                Level::Error,
                "device {}: {reserved} bytes are reserved for high-priority tenants but there is no priority \
                 file to coordinate through: allocation refused",
                dev.ordinal
            );
            self.release(dev, bytes);
            return Err(OverCap);
        };
        let uuid = self.devices.uuid_of(dev.ordinal);
        match reserve::check(e, bytes, reserved, || reserve::device_free(cuda, nvml, dev, uuid)) {
            Ok(a) => Ok(Admitted(Some(a))),
            Err(why) => {
                log!(
                    Level::Debug,
                    "refused {bytes} bytes on device {}: {why:?} ({reserved} bytes kept for high priority)",
                    dev.ordinal
                );
                self.release(dev, bytes);
                self.usage().count_refusal(dev.id);
                Err(OverCap)
            }
        }
    }

    /// Whether the usage file can still be trusted to enforce `limit` (`None`: nothing to enforce). A file
    /// another process of the container truncated, zeroed or overwrote fails closed: refused, said once.
    #[inline]
    fn shared_ok(&self, limit: Option<u64>) -> Result<(), OverCap> {
        if limit.is_none() {
            return Ok(());
        }
        self.usage().check().map_err(Self::shared_broken)
    }

    /// [`Memory::shared_ok`]'s refusal, said once (out of line: the admitted path only compares).
    #[cold]
    #[inline(never)]
    fn shared_broken(e: cuquota_core::region::RegionError) -> OverCap {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            log!(Level::Error, "{e}");
        }
        OverCap
    }

    /// The container-cap part of [`Memory::admit`]: the container's usage of `dev` after the charge (0 without
    /// a limit).
    fn charge_cap(&self, dev: Dev, bytes: u64, limit: Option<u64>) -> Result<u64, OverCap> {
        let slot = match self.usage().process_slot() {
            Ok(s) => s,
            Err(e) => {
                log!(Level::Error, "no process slot in the usage region: {e}");
                // Fail closed when a limit applies; without one, allocating unaccounted harms no one.
                return if limit.is_some() { Err(OverCap) } else { Ok(0) };
            }
        };
        // What this process holds stays charged even if another process zeroed the file.
        self.usage().reassert(slot, |id| {
            self.alloc_bytes[id.index()].load(Ordering::Relaxed)
                + self.overhead[id.index()].load(Ordering::Relaxed)
        });
        match self.usage().charge(slot, dev.id, bytes, limit) {
            // Checked once, after the charge: a file truncated, zeroed or replaced before it or while it ran
            // (the charge itself may be what faulted: a truncated file's zero pages admit anything) is refused
            // here, and the charge taken back.
            Ok(_) if self.shared_ok(limit).is_err() => {
                self.usage().uncharge(slot, dev.id, bytes);
                Err(OverCap)
            }
            Ok(used) => {
                self.alloc_bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
                self.hami_publish(dev.id);
                Ok(used)
            }
            Err(e) => {
                log!(
                    Level::Debug,
                    "refused {bytes} bytes on device {}: {e}",
                    dev.ordinal
                );
                self.usage().count_refusal(dev.id);
                Err(OverCap)
            }
        }
    }

    /// Charges `bytes` whatever the limit (the driver already handed the memory out).
    pub(super) fn force(&self, dev: Dev, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Ok(slot) = self.usage().process_slot() {
            let _ = self.usage().try_charge(slot, dev.id, bytes, None);
            self.alloc_bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
            self.hami_publish(dev.id);
        }
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
        self.release_entry(dev.id, bytes);
    }

    /// Gives back `bytes` charged on device entry `id`.
    pub(crate) fn release_entry(&self, id: DeviceId, bytes: u64) {
        self.release_entry_inline(id, bytes);
    }

    /// [`Memory::release_entry`] inlined (a free's path).
    #[inline(always)]
    pub(crate) fn release_entry_inline(&self, id: DeviceId, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let held = self.alloc_bytes[id.index()]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            })
            .unwrap_or_else(|v| v);
        if let Some(slot) = self.usage().cached_slot() {
            // Only bytes this process had allocated become credit; the rest is uncharged as before.
            let freed = held.min(bytes);
            let kept = self.credit.on(id.index()) && self.usage().give_credit(slot, id, freed, credit::CHUNK);
            let uncharge = if kept { bytes - freed } else { bytes };
            if uncharge != 0 {
                self.usage().uncharge(slot, id, uncharge);
            }
        }
        self.hami_publish(id);
    }

    /// HAMi's file shows this process's figures on `id` (docs/hami.md): relaxed stores, no syscall.
    #[inline]
    fn hami_publish(&self, id: DeviceId) {
        let i = id.index();
        self.devices.hami_publish(
            id,
            self.alloc_bytes[i].load(Ordering::Relaxed),
            self.overhead[i].load(Ordering::Relaxed),
        );
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
                self.pool_freed(pool, p, bytes, stream);
                self.refresh_pool(cuda, pool);
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
        let _ = self.alloc_bytes[id.index()].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
        self.hami_publish(id);
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
        self.alloc_bytes[dev.id.index()].load(Ordering::Relaxed)
    }

    /// Overhead this process has charged on `dev`.
    pub(crate) fn overhead_of(&self, dev: Dev) -> u64 {
        self.overhead[dev.id.index()].load(Ordering::Relaxed)
    }

    /// Moves this process's overhead charge on `dev` to `target` bytes (the caller holds `overhead_lock`).
    /// Growth is admitted against the cap when `admit` is true (creation paths); `Err` = refused, nothing
    /// changed. Shrinking always succeeds.
    fn set_overhead_locked(&self, dev: Dev, target: u64, admit: bool) -> Result<(), OverCap> {
        let cur = self.overhead_of(dev);
        if target > cur {
            let delta = target - cur;
            let slot = self.usage().process_slot().map_err(|_| OverCap)?;
            let limit = if admit { self.limit(dev) } else { None };
            self.shared_ok(limit)?;
            self.usage()
                .charge(slot, dev.id, delta, limit)
                .map_err(|_| OverCap)?;
            if let Err(e) = self.shared_ok(limit) {
                self.usage().uncharge(slot, dev.id, delta);
                return Err(e);
            }
        } else if target < cur {
            if let Some(slot) = self.usage().cached_slot() {
                self.usage().uncharge(slot, dev.id, cur - target);
            }
        }
        self.overhead[dev.id.index()].store(target, Ordering::Relaxed);
        self.hami_publish(dev.id);
        // A measurement of the truth: what a reconciliation had added on top is in it now.
        self.first_use.set_excess(dev, 0);
        Ok(())
    }

    // ---- fork ----------------------------------------------------------------------------------------------

    /// Drops per-process accounting after `fork` in the child (the parent keeps its charges; the child claims
    /// its own slot on first use and learns its own host pid). Call only in the single-threaded child, after
    /// the locks were released.
    pub(crate) fn reset_in_child(&self) {
        self.usage().forget_slot_in_child();
        self.ledger.clear();
        self.vmm.clear();
        self.shared.clear();
        self.pools.reset();
        self.graph.reset();
        for a in self.alloc_bytes.iter().chain(self.overhead.iter()) {
            a.store(0, Ordering::Relaxed);
        }
        self.credit.reset();
        self.holdings.reset();
        self.host.reset();
        self.first_use.reset();
        self.elastic.reset();
    }

    /// Takes every lock of memory accounting, in the order `state`'s fork handlers document.
    pub(crate) fn fork_prepare(&self) {
        hold_all([self.elastic.lock()]);
        hold_all(self.ledger.locks());
        hold_all([self.vmm.lock()]);
        self.shared.fork_prepare();
        self.pools.fork_prepare();
        self.graph.fork_prepare();
        hold_all([&self.overhead_lock]);
        hold_all([&self.holdings.owners]);
        hold_all([&self.host.candidates]);
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
            release_all([&self.host.candidates], side);
            release_all([&self.holdings.owners], side);
            release_all([&self.overhead_lock], side);
            self.graph.fork_release(side);
            self.pools.fork_release(side);
            self.shared.fork_release(side);
            release_all([self.vmm.lock()], side);
            release_all(self.ledger.locks(), side);
            release_all([self.elastic.lock()], side);
            if side == Side::Child {
                self.first_use.forked_child();
            }
        }
    }

    /// Takes memory's leaf locks (held by no one who then waits for another lock: images, first-use charges,
    /// graph kernels) for the fork, after every other group: a child resets what they guard.
    pub(crate) fn fork_prepare_leaves(&self) {
        self.holdings.fork_prepare_leaves();
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
            self.holdings.fork_release_leaves(side);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use cuquota_core::{DeviceId, UsageRegion};

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

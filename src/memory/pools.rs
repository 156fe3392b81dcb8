//! Memory that stream-ordered pools hold (charged by `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`). Hooks call one
//! door, [`Memory::pool`] ([`PoolCall`] says which call). The devices' graph pools: `graphs`.

use super::{ledger, Memory};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::log::{log, Level};
use cuquota_core::DeviceId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// A stream-ordered pool we account.
pub(super) struct PoolState {
    /// `None` for host pools (not device memory).
    dev: Option<Dev>,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` as last charged.
    charged: u64,
    /// A destroyed pool (keyed [`DESTROYED`] | n): how many of its allocations are still out (below zero for a
    /// moment when frees race the destroy); 0 for a live pool.
    left: isize,
    /// Streams with frees of this pool that may not have run yet (`cuMemFreeAsync`; a destroyed pool's memory
    /// stays until they have): (stream key, sync epoch of the latest). Each goes with a synchronisation of its
    /// stream, or of the context, that began later, or with the context's end. One entry per stream.
    awaiting: Vec<(usize, u64)>,
    /// A destroyed pool whose allocations are still being counted (`destroy_pool`): not released meanwhile.
    counting: bool,
    /// Frees of its allocations between taking their record out of the ledger and putting it back (a refusal)
    /// or not (done): a destroy's count cannot see those records, so the pool is not released meanwhile.
    in_flight: usize,
    /// The handle a destroyed pool had while live (frees that began before the destroy find it by that).
    was: usize,
    /// Blocks this process freed back into the pool's reserve and has not seen handed out again, while the
    /// reserve never shrank: what can serve a request without the pool growing. All forgotten whenever the
    /// reserve shrinks (a synchronisation or trim released some, which is not said) or the pool serves a request
    /// from its reserve at an address not listed (it used a block we cannot tell apart).
    free_blocks: Vec<FreeBlock>,
}

/// The bit that marks a pool key as a destroyed pool's (user-space addresses, which pool handles are, never
/// have it).
pub(super) const DESTROYED: usize = 1 << (usize::BITS - 1);
static NEXT_DESTROYED: AtomicUsize = AtomicUsize::new(1);
/// Bumped by every free in stream order of a pool allocation and by every synchronisation's start.
static SYNC_EPOCH: AtomicU64 = AtomicU64::new(1);
/// Some pool allocation was ever freed in stream order (until then a synchronisation costs one load here).
static ANY_AWAITING: AtomicBool = AtomicBool::new(false);

/// A new sync epoch.
fn mark() -> u64 {
    ANY_AWAITING.store(true, Ordering::Release);
    SYNC_EPOCH.fetch_add(1, Ordering::AcqRel)
}

/// A block freed into a pool's reserve: its address, its size as allocated (the driver's block may be larger).
#[derive(Clone, Copy, Debug)]
struct FreeBlock {
    addr: u64,
    len: u64,
    /// Taken by an allocation in flight that counts on it.
    claimed: bool,
}

impl PoolState {
    /// A free of this pool was enqueued on stream `st`.
    fn awaits(&mut self, st: usize) {
        let epoch = mark();
        match self.awaiting.iter_mut().find(|(s, _)| *s == st) {
            Some(a) => a.1 = epoch,
            None => self.awaiting.push((st, epoch)),
        }
    }
}

/// A stream-ordered pool call [`Memory::pool`] wraps, its arguments decoded.
pub(crate) enum PoolCall<'a> {
    /// `cuMemAllocAsync` (`pool` = `None`: the device's current pool) or `cuMemAllocFromPoolAsync` of `bytes`;
    /// `stream_dev`: the device of the stream; `out` reads the address written once the call succeeded.
    Alloc {
        pool: Option<usize>,
        bytes: u64,
        stream_dev: &'a dyn Fn() -> Option<Dev>,
        out: &'a dyn Fn() -> u64,
    },
    /// `cuMemPoolCreate` of a pool on `on` (`Some(None)`: a host pool; `None`: a device without an accounting
    /// identity, left unknown so that its allocations are refused while limits apply); `out` reads the pool.
    Create {
        on: Option<Option<Dev>>,
        out: &'a dyn Fn() -> Option<usize>,
    },
    /// `cuMemPoolTrimTo`.
    Trim(usize),
    /// `cuMemPoolDestroy`.
    Destroy(usize),
    /// `cuCtxSynchronize` of `dev()`'s context (`stream` = `None`) or `cuStreamSynchronize` of a stream (its
    /// key) on `dev()`.
    Synchronize {
        dev: &'a dyn Fn() -> Option<Dev>,
        stream: Option<usize>,
    },
}

impl Memory {
    /// `call`, the pool call `what` describes, with what memory keeps of pools: an allocation is admitted as
    /// [`Memory::pool_alloc`] says (`CUDA_ERROR_OUT_OF_MEMORY`, the driver not called, when it does not fit); a
    /// trim re-reads the pool's reserved size; a destroy gives its charge back once its allocations are freed;
    /// a synchronisation lets destroyed pools whose frees it waited for go.
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
            } => self.pool_alloc_async(cuda, nvml, pool, bytes, stream_dev, out, call),
            PoolCall::Create { on, out } => {
                let r = call();
                if let (true, Some(on)) = (r.ok(), on) {
                    if let Some(pool) = out() {
                        self.track_pool(pool, on);
                    }
                }
                r
            }
            PoolCall::Trim(pool) => {
                let r = call();
                if r.ok() {
                    self.refresh_pool(cuda, pool);
                }
                r
            }
            PoolCall::Destroy(pool) => {
                // Its reserve as it is now: memory the destroyed pool may hold until frees run in stream order.
                self.refresh_pool(cuda, pool);
                let r = call();
                if r.ok() {
                    self.destroy_pool(pool);
                }
                r
            }
            PoolCall::Synchronize { dev, stream } => {
                let Some(start) = self.sync_starts() else {
                    return call();
                };
                let r = call();
                if let Some(dev) = dev().filter(|_| r.ok()) {
                    self.synchronized(dev, start, stream);
                }
                r
            }
        }
    }

    /// [`PoolCall::Alloc`]: the pool's device (a pool we did not see created: the device whose default or
    /// current pool it is, else the stream's), then [`Memory::pool_alloc`]. A host pool's allocation is not
    /// device memory; one whose device has no accounting identity is `untracked`; one from a current pool the
    /// driver will not name is charged as a plain allocation.
    #[allow(clippy::too_many_arguments)]
    fn pool_alloc_async(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        pool: Option<usize>,
        bytes: u64,
        stream_dev: &dyn Fn() -> Option<Dev>,
        out: &dyn Fn() -> u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let (dev, pool) = match pool {
            Some(pool) => match self.pool_device(pool) {
                Some(Some(dev)) => (dev, pool),
                Some(None) => return call(), // a host pool: not device memory
                None => match self.pool_owner(cuda, pool).or_else(stream_dev) {
                    Some(dev) => (dev, pool),
                    None => return self.untracked(call),
                },
            },
            None => {
                let Some(dev) = stream_dev() else {
                    return self.untracked(call);
                };
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                if !unsafe { cuda.cuDeviceGetMemPool(&mut pool, dev.ordinal) }.ok() || pool.is_null() {
                    // Cannot see the pool: account it as a plain allocation instead.
                    let est = self.devices.round(cuda, dev, bytes);
                    return self.charged_call(cuda, nvml, dev, est, call, || {
                        Some((ledger::Space::Pointer, out(), None))
                    });
                }
                (dev, pool as usize)
            }
        };
        self.pool_alloc(cuda, nvml, dev, pool, bytes, call, out)
    }

    /// The device whose default or current pool `pool` is (a pool this process did not create: from
    /// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool` of any device, which may serve allocations on another
    /// device's stream): remembered for the pool. The stream's device would charge the wrong one.
    fn pool_owner(&self, cuda: &CudaTable, pool: usize) -> Option<Dev> {
        let owns = |d: Dev| {
            let (mut dflt, mut cur): (CUmemoryPool, CUmemoryPool) =
                (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: valid out-pointers.
            unsafe {
                (cuda.cuDeviceGetDefaultMemPool(&mut dflt, d.ordinal).ok() && dflt as usize == pool)
                    || (cuda.cuDeviceGetMemPool(&mut cur, d.ordinal).ok() && cur as usize == pool)
            }
        };
        let devs: Vec<Dev> = self.devices.known().map(|(d, _)| d).collect();
        let dev = devs.into_iter().find(|&d| owns(d))?;
        self.track_pool(pool, Some(dev));
        Some(dev)
    }

    /// A pool allocation of `bytes` from `pool` on `dev` through `call`, which writes the address `out()` reads.
    /// The pool may grow by the whole (rounded) request, so that is what is reserved in the ledger before the
    /// driver is called: no moment exists when the pool holds more than the container was admitted. Only when
    /// the whole request does not fit, and a block this process freed into the pool's reserve (already charged)
    /// can serve it, is it admitted with what the unused reserve cannot cover (usually nothing). Afterwards the
    /// charge settles to the pool's real `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    #[allow(clippy::too_many_arguments)]
    fn pool_alloc(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        dev: Dev,
        pool: usize,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        out: &dyn Fn() -> u64,
    ) -> CUresult {
        let key = pool;
        let len = self.devices.round(cuda, dev, bytes);
        self.track_pool(key, Some(dev));
        self.pool_prepare(cuda, key, len, false);
        // Held until the driver call returns (a reserved-memory announcement lives in the guard).
        let admit = |n| self.charge(dev, n, cuda, nvml).ok();
        let full = admit(len).or_else(|| {
            // The pools may have released memory at a synchronisation since we last looked: refresh, retry once.
            self.refresh_pools_of(cuda, dev.id);
            admit(len)
        });
        let (charge, claimed) = if let Some(c) = full {
            (c, None)
        } else if let Some(block) = self.pool_prepare(cuda, key, len, true) {
            let est = len.saturating_sub(self.pool_slack(cuda, key));
            match admit(est) {
                Some(c) => (c, Some(block)),
                None => {
                    self.pool_unclaim(key, block);
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
            }
        } else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = call();
        if !r.ok() {
            drop(charge);
            if let Some(block) = claimed {
                self.pool_unclaim(key, block);
            }
            return r;
        }
        let addr = out();
        let rec = ledger::Record {
            entry: dev.id,
            bytes: len,
            kind: ledger::Kind::Pool(key),
        };
        let stale = self.ledger.insert(ledger::Space::Pointer, addr, rec);
        self.release_stale(stale);
        // `pool_settle` takes the admitted bytes over.
        let over = self.pool_settle(cuda, key, dev, charge.bytes(), len, addr, claimed);
        charge.keep();
        if over > 0 {
            // Only a driver that grows the pool although a free block of the size was in its reserve gets here.
            log!(
                Level::Warn,
                "pool {key:#x} grew {over} bytes beyond what was admitted for a {len}-byte allocation"
            );
        }
        r
    }

    /// Starts tracking `pool` (no-op if known). `dev = None` marks a host pool.
    pub(super) fn track_pool(&self, pool: usize, dev: Option<Dev>) {
        self.any_pool.store(true, Ordering::Relaxed);
        self.pools.lock().entry(pool).or_insert(PoolState {
            dev,
            charged: 0,
            left: 0,
            awaiting: Vec::new(),
            counting: false,
            in_flight: 0,
            was: pool,
            free_blocks: Vec::new(),
        });
    }

    /// `Some(dev)` for a known pool (`Some(None)` = host pool), `None` if unknown.
    fn pool_device(&self, pool: usize) -> Option<Option<Dev>> {
        self.pools.lock().get(&pool).map(|p| p.dev)
    }

    /// Re-reads a pool's reserved size and charges (unconditionally) or releases the difference.
    pub(super) fn refresh_pool(&self, cuda: &CudaTable, pool: usize) {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get_mut(&pool) {
            self.refresh_locked(cuda, pool, p);
        }
    }

    fn reserved(cuda: &CudaTable, pool: usize) -> Option<u64> {
        let mut reserved: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
        let r = unsafe {
            cuda.cuMemPoolGetAttribute(
                pool as CUmemoryPool,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        r.ok().then_some(reserved)
    }

    fn refresh_locked(&self, cuda: &CudaTable, pool: usize, p: &mut PoolState) {
        if pool & DESTROYED != 0 {
            return; // no handle to read: its charge stays until its last allocation is freed
        }
        let Some(dev) = p.dev else { return };
        let Some(reserved) = Self::reserved(cuda, pool) else {
            return;
        };
        if reserved > p.charged {
            self.force(dev, reserved - p.charged);
        } else {
            if reserved < p.charged {
                p.free_blocks.clear();
            }
            self.release(dev, p.charged - reserved);
        }
        p.charged = reserved;
    }

    /// The pool allocation at `addr`, of `len` (rounded) bytes, was freed: its block is back in the reserve.
    /// `stream`: the free's stream key (`stream_key`) for `cuMemFreeAsync`, `None` for a free that is done.
    pub(crate) fn pool_freed(&self, pool: usize, addr: u64, len: u64, stream: Option<usize>) {
        if pool & DESTROYED != 0 {
            self.destroyed_freed(pool, stream);
            return;
        }
        if let Some(p) = self.pools.lock().get_mut(&pool) {
            if let Some(st) = stream {
                p.awaits(st);
            }
            p.free_blocks.retain(|b| b.addr != addr);
            if len > 0 {
                p.free_blocks.push(FreeBlock {
                    addr,
                    len,
                    claimed: false,
                });
            }
        }
    }

    /// Before a pool allocation of `len` bytes: re-reads the pool (a shrunk reserve forgets its known free
    /// blocks), then, when `claim`, claims the smallest unclaimed known free block of at least `len` bytes for
    /// this allocation and returns its address.
    pub(crate) fn pool_prepare(&self, cuda: &CudaTable, pool: usize, len: u64, claim: bool) -> Option<u64> {
        let mut pools = self.pools.lock();
        let p = pools.get_mut(&pool)?;
        self.refresh_locked(cuda, pool, p);
        if !claim {
            return None;
        }
        let b = p
            .free_blocks
            .iter_mut()
            .filter(|b| !b.claimed && b.len >= len)
            .min_by_key(|b| b.len)?;
        b.claimed = true;
        Some(b.addr)
    }

    /// A claimed block went unused (the driver refused the allocation): free for others again.
    pub(crate) fn pool_unclaim(&self, pool: usize, addr: u64) {
        if let Some(p) = self.pools.lock().get_mut(&pool) {
            for b in p.free_blocks.iter_mut().filter(|b| b.addr == addr) {
                b.claimed = false;
            }
        }
    }

    /// After a successful pool allocation of `len` bytes at `addr`, admitted with `est` (and counting on the
    /// block `claimed`): the pool's growth is charged out of the admitted bytes and the rest given back (growth
    /// beyond them is forced: the driver already handed it out), and the known free blocks follow what the
    /// driver did. Returns the growth beyond `est` (0 when the admission covered it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pool_settle(
        &self,
        cuda: &CudaTable,
        pool: usize,
        dev: Dev,
        est: u64,
        len: u64,
        addr: u64,
        claimed: Option<u64>,
    ) -> u64 {
        let mut pools = self.pools.lock();
        let Some(p) = pools.get_mut(&pool) else {
            self.release(dev, est);
            return 0;
        };
        if let Some(c) = claimed {
            for b in p.free_blocks.iter_mut().filter(|b| b.addr == c) {
                b.claimed = false;
            }
        }
        let known = p.free_blocks.len();
        p.free_blocks.retain(|b| b.addr != addr);
        let reused_known = p.free_blocks.len() < known;
        let Some(reserved) = Self::reserved(cuda, pool) else {
            p.free_blocks.clear();
            self.release(dev, est);
            return 0;
        };
        let over = if reserved >= p.charged {
            let growth = reserved - p.charged;
            if growth < len && !reused_known {
                // Served from the reserve by a block we did not list: which of ours it was, we cannot tell.
                p.free_blocks.clear();
            }
            if growth > est {
                self.force(dev, growth - est);
            } else {
                self.release(dev, est - growth);
            }
            growth.saturating_sub(est)
        } else {
            p.free_blocks.clear();
            self.release(dev, est + (p.charged - reserved));
            0
        };
        p.charged = reserved;
        over
    }

    /// Bytes a tracked pool holds reserved but not handed out (reserved − used): what a new allocation can be
    /// served from without the pool growing. 0 for untracked pools or when the driver cannot tell.
    pub(crate) fn pool_slack(&self, cuda: &CudaTable, pool: usize) -> u64 {
        if self.pool_device(pool).is_none() {
            return 0; // not charged by us yet: its reserve is not ours to spend
        }
        let get = |attr| {
            let mut v: u64 = 0;
            // SAFETY: valid out-pointer of the attribute's type (cuuint64_t).
            let r = unsafe {
                cuda.cuMemPoolGetAttribute(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast())
            };
            r.ok().then_some(v)
        };
        match (
            get(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            get(CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(reserved), Some(used)) => reserved.saturating_sub(used),
            _ => 0,
        }
    }

    /// Refreshes every pool on a device entry (before refusing a pool allocation).
    #[inline]
    pub(crate) fn refresh_pools_of(&self, cuda: &CudaTable, id: DeviceId) {
        // Set before a pool is tracked: a program without pools takes no lock here (cuMemGetInfo's path).
        if self.any_pool.load(Ordering::Relaxed) {
            self.refresh_tracked_pools_of(cuda, id);
        }
    }

    #[inline(never)]
    fn refresh_tracked_pools_of(&self, cuda: &CudaTable, id: DeviceId) {
        let mut pools = self.pools.lock();
        for (&pool, p) in pools.iter_mut() {
            if p.dev.is_some_and(|d| d.id == id) {
                self.refresh_locked(cuda, pool, p);
            }
        }
    }

    /// The last context this process had on `dev` is gone (destroyed, reset or released for the last time):
    /// the driver freed every allocation made in it, so their records and charges go too. VMM handles
    /// (`cuMemCreate`) are not tied to a context and stay; pools are re-read.
    pub(crate) fn forget_context_allocations(&self, cuda: &CudaTable, dev: Dev) {
        let gone = self
            .ledger
            .remove_where(|space, _, rec| space != ledger::Space::Vmm && rec.entry == dev.id);
        self.forget_records(cuda, dev, gone);
        {
            // Nothing of the context runs any more: no free on `dev` is waiting.
            let mut pools = self.pools.lock();
            for (_, p) in pools
                .iter_mut()
                .filter(|(_, p)| p.dev.is_some_and(|d| d.id == dev.id))
            {
                p.awaiting.clear();
            }
            self.release_destroyed_locked(&mut pools);
        }
        self.refresh_pools_of(cuda, dev.id);
        if self.graph.charges(dev) {
            self.refresh_graph(cuda, dev);
        }
    }

    /// A context on `dev` went away while others live there: the driver freed what was allocated in it, but a
    /// record does not say which context made it. Each direct allocation of the device is asked about (rare and
    /// slow: one driver query per record, while the record is held); one the driver no longer knows at its
    /// address is gone. Any other answer keeps the charge (over-count, never under). Arrays stay charged.
    pub(crate) fn forget_dead_allocations(&self, cuda: &CudaTable, dev: Dev) {
        let gone = self.ledger.remove_where(|space, key, rec| {
            space == ledger::Space::Pointer
                && rec.entry == dev.id
                && rec.kind == ledger::Kind::Direct
                && Self::freed_by_driver(cuda, key)
        });
        self.forget_records(cuda, dev, gone);
    }

    /// Whether the driver answers that no allocation starts at `p` any more.
    fn freed_by_driver(cuda: &CudaTable, p: u64) -> bool {
        let mut start: u64 = 0;
        // SAFETY: valid out-pointer of the attribute's type (CUdeviceptr).
        let r = unsafe {
            cuda.cuPointerGetAttribute(
                (&mut start as *mut u64).cast(),
                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                p,
            )
        };
        r == CUresult::ERROR_INVALID_VALUE || (r.ok() && start != p)
    }

    /// Gives back the charges of records the driver freed.
    fn forget_records(&self, cuda: &CudaTable, dev: Dev, gone: Vec<(ledger::Space, u64, ledger::Record)>) {
        for (space, key, rec) in gone {
            if space == ledger::Space::Pointer {
                if let Some(e) = self.shared.take_export(key) {
                    // Exported: its charge may live in the shared table, and importers may still hold it.
                    self.export_gone(cuda, key, e, Some(rec), None);
                    continue;
                }
            }
            match rec.kind {
                ledger::Kind::Direct => self.release(dev, rec.bytes),
                ledger::Kind::Pool(k) if k & DESTROYED != 0 => self.destroyed_freed(k, None),
                ledger::Kind::Pool(_) => {}
            }
        }
    }

    // ---- graph memory (memory nodes) -------------------------------------------------------------------------

    /// `cuMemPoolDestroy` succeeded. With no allocation of this process still out of it and no free waiting
    /// in stream order, its charge goes back; otherwise the pool lives on (cuda.h: its resources go back once no
    /// allocation is outstanding and its frees have run), keyed [`DESTROYED`] | n with its allocations, charged
    /// whole until then.
    fn destroy_pool(&self, pool: usize) {
        let key = DESTROYED | NEXT_DESTROYED.fetch_add(1, Ordering::Relaxed);
        {
            // In place before the records are re-keyed, so a free racing this counts down here.
            let mut pools = self.pools.lock();
            let Some(mut p) = pools.remove(&pool) else {
                return;
            };
            if p.dev.is_none() {
                return;
            }
            p.free_blocks.clear();
            p.counting = true;
            pools.insert(key, p);
        }
        let out = self.ledger.retag_pool(pool, key);
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get_mut(&key) {
            p.left += out as isize;
            p.counting = false;
        }
        self.release_destroyed_locked(&mut pools);
    }

    /// A free of an allocation of `pool` is taking its record out of the ledger and goes to the driver: the
    /// pool (or, when a destroy is counting its records, the destroyed pool it became) is not released until
    /// `Memory::pool_free_done` (or `Memory::pool_free_refused`).
    pub(super) fn pool_free_begins(&self, pool: usize) {
        let mut pools = self.pools.lock();
        let p = match pools.contains_key(&pool) {
            true => pools.get_mut(&pool),
            false => pools
                .iter_mut()
                .find(|(&k, p)| k & DESTROYED != 0 && p.was == pool && p.counting)
                .map(|(_, p)| p),
        };
        if let Some(p) = p {
            p.in_flight += 1;
        }
    }

    /// The free [`Memory::pool_free_begins`] announced succeeded (`stream`: in stream order there). `true`: the
    /// pool was destroyed meanwhile, and its count could not see this record: the free counts for nothing there
    /// but its stream is awaited (the caller skips `pool_freed`).
    pub(super) fn pool_free_done(&self, pool: usize, stream: Option<usize>) -> bool {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get_mut(&pool) {
            p.in_flight = p.in_flight.saturating_sub(1);
            return false;
        }
        let Some(p) = pools
            .iter_mut()
            .find(|(&k, p)| k & DESTROYED != 0 && p.was == pool && p.in_flight > 0)
            .map(|(_, p)| p)
        else {
            return false;
        };
        p.in_flight -= 1;
        if let Some(st) = stream {
            p.awaits(st);
        }
        self.release_destroyed_locked(&mut pools);
        true
    }

    /// The free [`Memory::pool_free_begins`] announced was refused and its record (of `pool`, at `addr`) is back
    /// in the ledger. If the pool was destroyed meanwhile, the record belongs to the destroyed pool and counts
    /// as still out of it, once: re-tagged unless the destroy's count saw it back (waited for).
    pub(super) fn pool_free_refused(&self, pool: usize, addr: u64) {
        let moved = {
            let mut pools = self.pools.lock();
            if let Some(p) = pools.get_mut(&pool) {
                p.in_flight = p.in_flight.saturating_sub(1);
                return;
            }
            match pools
                .iter()
                .find(|&(&k, p)| k & DESTROYED != 0 && p.was == pool && p.in_flight > 0)
            {
                Some((&k, _)) => k,
                None => return,
            }
        };
        // Its count is still running: wait for it (a scan of the ledger, no driver call).
        while self.pools.lock().get(&moved).is_some_and(|p| p.counting) {
            std::thread::yield_now();
        }
        let rec = self.ledger.get(ledger::Space::Pointer, addr);
        let unseen = rec.is_some_and(|r| r.kind == ledger::Kind::Pool(pool));
        if let Some(mut r) = rec.filter(|_| unseen) {
            r.kind = ledger::Kind::Pool(moved);
            self.ledger.insert(ledger::Space::Pointer, addr, r);
        }
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get_mut(&moved) {
            p.in_flight = p.in_flight.saturating_sub(1);
            if unseen {
                p.left += 1;
            }
        }
        self.release_destroyed_locked(&mut pools);
    }

    /// One allocation of destroyed pool `key` is gone (`stream`: freed in stream order there, maybe not yet).
    fn destroyed_freed(&self, key: usize, stream: Option<usize>) {
        let mut pools = self.pools.lock();
        let Some(p) = pools.get_mut(&key) else { return };
        p.left -= 1;
        if let Some(st) = stream {
            p.awaits(st);
        }
        self.release_destroyed_locked(&mut pools);
    }

    /// Gives back the charge of every destroyed pool with no allocation out and nothing awaited.
    fn release_destroyed_locked(&self, pools: &mut HashMap<usize, PoolState>) {
        let done: Vec<usize> = pools
            .iter()
            .filter(|&(&k, p)| {
                k & DESTROYED != 0 && p.left == 0 && p.awaiting.is_empty() && !p.counting && p.in_flight == 0
            })
            .map(|(&k, _)| k)
            .collect();
        for k in done {
            if let Some(p) = pools.remove(&k) {
                if let Some(dev) = p.dev {
                    self.release(dev, p.charged);
                }
            }
        }
    }

    /// A synchronisation is about to start: its epoch, for [`Memory::synchronized`] (`None`: no pool
    /// allocation was ever freed in stream order, nothing to do).
    fn sync_starts(&self) -> Option<u64> {
        ANY_AWAITING
            .load(Ordering::Acquire)
            .then(|| SYNC_EPOCH.fetch_add(1, Ordering::AcqRel))
    }

    /// A synchronisation of `dev`'s context (`stream` = `None`) or of one stream (its key) that started at
    /// epoch `start` returned: the frees enqueued there before it have run.
    fn synchronized(&self, dev: Dev, start: u64, stream: Option<usize>) {
        let mut pools = self.pools.lock();
        for (_, p) in pools
            .iter_mut()
            .filter(|(_, p)| p.dev.is_some_and(|d| d.id == dev.id))
        {
            p.awaiting
                .retain(|&(st, epoch)| !(epoch < start && stream.is_none_or(|s| s == st)));
        }
        self.release_destroyed_locked(&mut pools);
    }
}

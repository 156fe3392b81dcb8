//! Memory that stream-ordered pools hold (charged by `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`). Hooks call one
//! door, [`Memory::pool`] ([`PoolCall`] says which call). [`Pools`] owns what is known of each pool (its
//! charge, a destroyed pool's allocations still out, the frees it waits for, the blocks freed into its
//! reserve); it moves the process's charge through [`Charges`] and asks the driver through [`Driver`], so it
//! is tested with fakes of both. The devices' graph pools: `graphs`.

use super::driver::Driver;
use super::{ledger, Memory};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::locks::{hold_all, release_all, Lock, Side};
use crate::log::{log, Level};
use cuquota_core::DeviceId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// How a pool's re-read moves the process's charge of its device (`Memory`'s charge; a recorder in tests).
pub(super) trait Charges {
    /// Charges `bytes` on `dev` whatever the limit (the driver already handed the memory out).
    fn force(&self, dev: Dev, bytes: u64);
    /// Gives back `bytes` charged on `dev`.
    fn release(&self, dev: Dev, bytes: u64);
}

impl Charges for Memory {
    fn force(&self, dev: Dev, bytes: u64) {
        Memory::force(self, dev, bytes);
    }
    fn release(&self, dev: Dev, bytes: u64) {
        Memory::release(self, dev, bytes);
    }
}

/// The stream-ordered pools this process accounts.
pub(super) struct Pools {
    map: Lock<HashMap<usize, PoolState>>,
    /// Whether a pool was ever tracked (`map` is empty while false).
    any: AtomicBool,
}

/// A stream-ordered pool we account.
struct PoolState {
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
const DESTROYED: usize = 1 << (usize::BITS - 1);
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

    /// Re-reads the reserved size of this pool (handle `pool`) and charges (unconditionally) or releases the
    /// difference.
    fn refresh(&mut self, d: &impl Driver, c: &impl Charges, pool: usize) {
        if pool & DESTROYED != 0 {
            return; // no handle to read: its charge stays until its last allocation is freed
        }
        let Some(dev) = self.dev else { return };
        let Ok(reserved) = d.pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) else {
            return;
        };
        if reserved > self.charged {
            c.force(dev, reserved - self.charged);
        } else {
            if reserved < self.charged {
                self.free_blocks.clear();
            }
            c.release(dev, self.charged - reserved);
        }
        self.charged = reserved;
    }

    /// The block at `addr` is no longer claimed.
    fn unclaim(&mut self, addr: u64) {
        for b in self.free_blocks.iter_mut().filter(|b| b.addr == addr) {
            b.claimed = false;
        }
    }
}

impl Pools {
    pub(super) fn new() -> Pools {
        Pools {
            map: Lock::new(HashMap::new()),
            any: AtomicBool::new(false),
        }
    }

    /// Starts tracking `pool` (no-op if known). `dev = None` marks a host pool.
    pub(super) fn track(&self, pool: usize, dev: Option<Dev>) {
        self.any.store(true, Ordering::Relaxed);
        self.map.lock().entry(pool).or_insert(PoolState {
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
    pub(super) fn device(&self, pool: usize) -> Option<Option<Dev>> {
        self.map.lock().get(&pool).map(|p| p.dev)
    }

    /// Re-reads a pool's reserved size and charges (unconditionally) or releases the difference.
    pub(super) fn refresh(&self, d: &impl Driver, c: &impl Charges, pool: usize) {
        if let Some(p) = self.map.lock().get_mut(&pool) {
            p.refresh(d, c, pool);
        }
    }

    /// Refreshes every pool on a device entry (before refusing a pool allocation).
    #[inline]
    pub(super) fn refresh_of(&self, d: &impl Driver, c: &impl Charges, id: DeviceId) {
        // Set before a pool is tracked: a program without pools takes no lock here (cuMemGetInfo's path).
        if self.any.load(Ordering::Relaxed) {
            self.refresh_tracked_of(d, c, id);
        }
    }

    #[inline(never)]
    fn refresh_tracked_of(&self, d: &impl Driver, c: &impl Charges, id: DeviceId) {
        for (&pool, p) in self.map.lock().iter_mut() {
            if p.dev.is_some_and(|d| d.id == id) {
                p.refresh(d, c, pool);
            }
        }
    }

    /// Before a pool allocation of `len` bytes: re-reads the pool (a shrunk reserve forgets its known free
    /// blocks), then, when `claim`, claims the smallest unclaimed known free block of at least `len` bytes for
    /// this allocation and returns its address.
    pub(super) fn prepare(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        pool: usize,
        len: u64,
        claim: bool,
    ) -> Option<u64> {
        let mut pools = self.map.lock();
        let p = pools.get_mut(&pool)?;
        p.refresh(d, c, pool);
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
    pub(super) fn unclaim(&self, pool: usize, addr: u64) {
        if let Some(p) = self.map.lock().get_mut(&pool) {
            p.unclaim(addr);
        }
    }

    /// After a successful pool allocation of `len` bytes at `addr`, admitted with `est` (and counting on the
    /// block `claimed`): the pool's growth is charged out of the admitted bytes and the rest given back (growth
    /// beyond them is forced: the driver already handed it out), and the known free blocks follow what the
    /// driver did. Returns the growth beyond `est` (0 when the admission covered it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        pool: usize,
        dev: Dev,
        est: u64,
        len: u64,
        addr: u64,
        claimed: Option<u64>,
    ) -> u64 {
        let mut pools = self.map.lock();
        let Some(p) = pools.get_mut(&pool) else {
            c.release(dev, est);
            return 0;
        };
        if let Some(b) = claimed {
            p.unclaim(b);
        }
        let known = p.free_blocks.len();
        p.free_blocks.retain(|b| b.addr != addr);
        let reused_known = p.free_blocks.len() < known;
        let Ok(reserved) = d.pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) else {
            p.free_blocks.clear();
            c.release(dev, est);
            return 0;
        };
        let over = if reserved >= p.charged {
            let growth = reserved - p.charged;
            if growth < len && !reused_known {
                // Served from the reserve by a block we did not list: which of ours it was, we cannot tell.
                p.free_blocks.clear();
            }
            if growth > est {
                c.force(dev, growth - est);
            } else {
                c.release(dev, est - growth);
            }
            growth.saturating_sub(est)
        } else {
            p.free_blocks.clear();
            c.release(dev, est + (p.charged - reserved));
            0
        };
        p.charged = reserved;
        over
    }

    /// Bytes a tracked pool holds reserved but not handed out (reserved − used): what a new allocation can be
    /// served from without the pool growing. 0 for untracked pools or when the driver cannot tell.
    pub(super) fn slack(&self, d: &impl Driver, pool: usize) -> u64 {
        if self.device(pool).is_none() {
            return 0; // not charged by us yet: its reserve is not ours to spend
        }
        match (
            d.pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            d.pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        ) {
            (Ok(reserved), Ok(used)) => reserved.saturating_sub(used),
            _ => 0,
        }
    }

    /// The pool allocation at `addr`, of `len` (rounded) bytes, was freed: its block is back in the reserve.
    /// `stream`: the free's stream key (`stream_key`) for `cuMemFreeAsync`, `None` for a free that is done.
    pub(super) fn freed(&self, c: &impl Charges, pool: usize, addr: u64, len: u64, stream: Option<usize>) {
        if pool & DESTROYED != 0 {
            self.destroyed_freed(c, pool, stream);
            return;
        }
        if let Some(p) = self.map.lock().get_mut(&pool) {
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

    /// One allocation of destroyed pool `key` is gone (`stream`: freed in stream order there, maybe not yet).
    pub(super) fn destroyed_freed(&self, c: &impl Charges, key: usize, stream: Option<usize>) {
        let mut pools = self.map.lock();
        let Some(p) = pools.get_mut(&key) else { return };
        p.left -= 1;
        if let Some(st) = stream {
            p.awaits(st);
        }
        release_destroyed(c, &mut pools);
    }

    /// The last context on `dev` is gone: nothing of it runs any more, so no free on `dev` is waiting.
    pub(super) fn context_gone(&self, c: &impl Charges, dev: Dev) {
        let mut pools = self.map.lock();
        for (_, p) in pools
            .iter_mut()
            .filter(|(_, p)| p.dev.is_some_and(|d| d.id == dev.id))
        {
            p.awaiting.clear();
        }
        release_destroyed(c, &mut pools);
    }

    /// `cuMemPoolDestroy` of `pool` succeeded: a device pool we know moves to a new destroyed key, counting
    /// (not released) until [`Pools::destroy_counted`] says how many of its allocations are out. `None`: not a
    /// device pool we know.
    pub(super) fn destroy_begins(&self, pool: usize) -> Option<usize> {
        let key = DESTROYED | NEXT_DESTROYED.fetch_add(1, Ordering::Relaxed);
        let mut pools = self.map.lock();
        let mut p = pools.remove(&pool)?;
        p.dev?;
        p.free_blocks.clear();
        p.counting = true;
        pools.insert(key, p);
        Some(key)
    }

    /// `out` allocations of destroyed pool `key` are still out: with none out and no free waiting in stream
    /// order, its charge goes back; otherwise the pool lives on (cuda.h: its resources go back once no
    /// allocation is outstanding and its frees have run), charged whole until then.
    pub(super) fn destroy_counted(&self, c: &impl Charges, key: usize, out: usize) {
        let mut pools = self.map.lock();
        if let Some(p) = pools.get_mut(&key) {
            p.left += out as isize;
            p.counting = false;
        }
        release_destroyed(c, &mut pools);
    }

    /// A free of an allocation of `pool` is taking its record out of the ledger and goes to the driver: the
    /// pool (or, when a destroy is counting its records, the destroyed pool it became) is not released until
    /// [`Pools::free_done`] (or the refusal's [`Pools::free_refused`]).
    pub(super) fn free_begins(&self, pool: usize) {
        let mut pools = self.map.lock();
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

    /// The free [`Pools::free_begins`] announced succeeded (`stream`: in stream order there). `true`: the pool
    /// was destroyed meanwhile, and its count could not see this record: the free counts for nothing there but
    /// its stream is awaited (the caller skips [`Pools::freed`]).
    pub(super) fn free_done(&self, c: &impl Charges, pool: usize, stream: Option<usize>) -> bool {
        let mut pools = self.map.lock();
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
        release_destroyed(c, &mut pools);
        true
    }

    /// The free [`Pools::free_begins`] announced was refused and its record is back in the ledger. `None`: the
    /// pool lives (the free is done with); `Some(key)`: it was destroyed meanwhile and became `key`, whose count
    /// has finished (waited for): the caller re-tags the record unless the count saw it, then
    /// [`Pools::refused_counted`].
    pub(super) fn free_refused(&self, pool: usize) -> Option<usize> {
        let moved = {
            let mut pools = self.map.lock();
            if let Some(p) = pools.get_mut(&pool) {
                p.in_flight = p.in_flight.saturating_sub(1);
                return None;
            }
            pools
                .iter()
                .find(|&(&k, p)| k & DESTROYED != 0 && p.was == pool && p.in_flight > 0)
                .map(|(&k, _)| k)?
        };
        // Its count is still running: wait for it (a scan of the ledger, no driver call).
        while self.map.lock().get(&moved).is_some_and(|p| p.counting) {
            std::thread::yield_now();
        }
        Some(moved)
    }

    /// The refused free of destroyed pool `key` is done with; `unseen`: its record was re-tagged to `key` (the
    /// destroy's count had not seen it), so it counts as still out.
    pub(super) fn refused_counted(&self, c: &impl Charges, key: usize, unseen: bool) {
        let mut pools = self.map.lock();
        if let Some(p) = pools.get_mut(&key) {
            p.in_flight = p.in_flight.saturating_sub(1);
            if unseen {
                p.left += 1;
            }
        }
        release_destroyed(c, &mut pools);
    }

    /// A synchronisation is about to start: its epoch, for [`Pools::synchronized`] (`None`: no pool allocation
    /// was ever freed in stream order, nothing to do).
    fn sync_starts(&self) -> Option<u64> {
        ANY_AWAITING
            .load(Ordering::Acquire)
            .then(|| SYNC_EPOCH.fetch_add(1, Ordering::AcqRel))
    }

    /// A synchronisation of `dev`'s context (`stream` = `None`) or of one stream (its key) that started at
    /// epoch `start` returned: the frees enqueued there before it have run.
    fn synchronized(&self, c: &impl Charges, dev: Dev, start: u64, stream: Option<usize>) {
        let mut pools = self.map.lock();
        for (_, p) in pools
            .iter_mut()
            .filter(|(_, p)| p.dev.is_some_and(|d| d.id == dev.id))
        {
            p.awaiting
                .retain(|&(st, epoch)| !(epoch < start && stream.is_none_or(|s| s == st)));
        }
        release_destroyed(c, &mut pools);
    }

    /// Forgets the parent's pools in a forked child.
    pub(super) fn reset(&self) {
        self.map.lock().clear();
    }

    /// Takes the family's lock for the fork handlers.
    pub(super) fn fork_prepare(&self) {
        hold_all([&self.map]);
    }

    /// Undoes [`Pools::fork_prepare`].
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release(&self, side: Side) {
        // SAFETY: locked by fork_prepare (the caller's contract).
        unsafe { release_all([&self.map], side) };
    }
}

/// Gives back the charge of every destroyed pool with no allocation out and nothing awaited.
fn release_destroyed(c: &impl Charges, pools: &mut HashMap<usize, PoolState>) {
    let done: Vec<usize> = pools
        .iter()
        .filter(|&(&k, p)| {
            k & DESTROYED != 0 && p.left == 0 && p.awaiting.is_empty() && !p.counting && p.in_flight == 0
        })
        .map(|(&k, _)| k)
        .collect();
    for k in done {
        if let Some(PoolState {
            dev: Some(dev),
            charged,
            ..
        }) = pools.remove(&k)
        {
            c.release(dev, charged);
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
                        self.pools.track(pool, on);
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
                let Some(start) = self.pools.sync_starts() else {
                    return call();
                };
                let r = call();
                if let Some(dev) = dev().filter(|_| r.ok()) {
                    self.pools.synchronized(self, dev, start, stream);
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
            Some(pool) => match self.pools.device(pool) {
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
                match cuda.mem_pool(dev.ordinal) {
                    Ok(pool) if pool != 0 => (dev, pool),
                    _ => {
                        // Cannot see the pool: account it as a plain allocation instead.
                        let est = self.devices.round(cuda, dev, bytes);
                        return self.charged_call(cuda, nvml, dev, est, call, || {
                            Some((ledger::Space::Pointer, out(), None))
                        });
                    }
                }
            }
        };
        self.pool_alloc(cuda, nvml, dev, pool, bytes, call, out)
    }

    /// The device whose default or current pool `pool` is (a pool this process did not create: from
    /// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool` of any device, which may serve allocations on another
    /// device's stream): remembered for the pool. The stream's device would charge the wrong one.
    fn pool_owner(&self, cuda: &CudaTable, pool: usize) -> Option<Dev> {
        let owns =
            |d: Dev| cuda.default_mem_pool(d.ordinal) == Ok(pool) || cuda.mem_pool(d.ordinal) == Ok(pool);
        let devs: Vec<Dev> = self.devices.known().map(|(d, _)| d).collect();
        let dev = devs.into_iter().find(|&d| owns(d))?;
        self.pools.track(pool, Some(dev));
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
        self.pools.track(key, Some(dev));
        self.pools.prepare(cuda, self, key, len, false);
        // Held until the driver call returns (a reserved-memory announcement lives in the guard).
        let admit = |n| self.charge(dev, n, cuda, nvml).ok();
        let full = admit(len).or_else(|| {
            // The pools may have released memory at a synchronisation since we last looked: refresh, retry once.
            self.refresh_pools_of(cuda, dev.id);
            admit(len)
        });
        let (charge, claimed) = if let Some(c) = full {
            (c, None)
        } else if let Some(block) = self.pools.prepare(cuda, self, key, len, true) {
            let est = len.saturating_sub(self.pools.slack(cuda, key));
            match admit(est) {
                Some(c) => (c, Some(block)),
                None => {
                    self.pools.unclaim(key, block);
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
                self.pools.unclaim(key, block);
            }
            return r;
        }
        let addr = out();
        let rec = ledger::Record {
            entry: dev.id,
            bytes: len,
            kind: ledger::Kind::Pool(key),
        };
        let stale = self.allocs.ledger().insert(ledger::Space::Pointer, addr, rec);
        self.release_stale(stale);
        // The pool's settlement takes the admitted bytes over.
        let over = self
            .pools
            .settle(cuda, self, key, dev, charge.bytes(), len, addr, claimed);
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

    /// Re-reads a pool's reserved size and charges (unconditionally) or releases the difference.
    pub(super) fn refresh_pool(&self, cuda: &CudaTable, pool: usize) {
        self.pools.refresh(cuda, self, pool);
    }

    /// Refreshes every pool on a device entry (before refusing a pool allocation).
    #[inline]
    pub(crate) fn refresh_pools_of(&self, cuda: &CudaTable, id: DeviceId) {
        self.pools.refresh_of(cuda, self, id);
    }

    /// [`Pools::freed`].
    pub(crate) fn pool_freed(&self, pool: usize, addr: u64, len: u64, stream: Option<usize>) {
        self.pools.freed(self, pool, addr, len, stream);
    }

    /// [`Pools::free_begins`].
    pub(super) fn pool_free_begins(&self, pool: usize) {
        self.pools.free_begins(pool);
    }

    /// [`Pools::free_done`].
    pub(super) fn pool_free_done(&self, pool: usize, stream: Option<usize>) -> bool {
        self.pools.free_done(self, pool, stream)
    }

    /// The free [`Memory::pool_free_begins`] announced was refused and its record (of `pool`, at `addr`) is back
    /// in the ledger. If the pool was destroyed meanwhile, the record belongs to the destroyed pool and counts
    /// as still out of it, once: re-tagged unless the destroy's count saw it back (waited for).
    pub(super) fn pool_free_refused(&self, pool: usize, addr: u64) {
        let Some(moved) = self.pools.free_refused(pool) else {
            return;
        };
        let rec = self.allocs.ledger().get(ledger::Space::Pointer, addr);
        let unseen = rec.is_some_and(|r| r.kind == ledger::Kind::Pool(pool));
        if let Some(mut r) = rec.filter(|_| unseen) {
            r.kind = ledger::Kind::Pool(moved);
            self.allocs.ledger().insert(ledger::Space::Pointer, addr, r);
        }
        self.pools.refused_counted(self, moved, unseen);
    }

    /// `cuMemPoolDestroy` succeeded: its allocations still in the ledger move to the destroyed pool's key (in
    /// place before they are re-keyed, so a free racing this counts down there), which keeps the charge until
    /// they are freed and their frees have run.
    fn destroy_pool(&self, pool: usize) {
        if let Some(key) = self.pools.destroy_begins(pool) {
            let out = self.allocs.ledger().retag_pool(pool, key);
            self.pools.destroy_counted(self, key, out);
        }
    }

    /// The last context this process had on `dev` is gone (destroyed, reset or released for the last time):
    /// the driver freed every allocation made in it, so their records and charges go too. VMM handles
    /// (`cuMemCreate`) are not tied to a context and stay; pools are re-read.
    pub(super) fn forget_context_allocations(&self, cuda: &CudaTable, dev: Dev) {
        let gone = self
            .allocs
            .ledger()
            .remove_where(|space, _, rec| space != ledger::Space::Vmm && rec.entry == dev.id);
        self.forget_records(cuda, dev, gone);
        self.pools.context_gone(self, dev);
        self.refresh_pools_of(cuda, dev.id);
        if self.graph.charges(dev) {
            self.graph.settle(cuda, self, dev);
        }
    }

    /// A context on `dev` went away while others live there: the driver freed what was allocated in it, but a
    /// record does not say which context made it. Each direct allocation of the device is asked about (rare and
    /// slow: one driver query per record, while the record is held); one the driver no longer knows at its
    /// address is gone. Any other answer keeps the charge (over-count, never under). Arrays stay charged.
    pub(crate) fn forget_dead_allocations(&self, cuda: &CudaTable, dev: Dev) {
        let gone = self.allocs.ledger().remove_where(|space, key, rec| {
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
                ledger::Kind::Pool(k) if k & DESTROYED != 0 => self.pools.destroyed_freed(self, k, None),
                ledger::Kind::Pool(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::driver::fake::Fake;
    use crate::memory::tests::device_id;
    use std::cell::Cell;

    const MIB: u64 = 1 << 20;
    const P: usize = 0x5000;

    /// What the pools charged, net.
    #[derive(Default)]
    struct Net(Cell<i64>);

    impl Charges for Net {
        fn force(&self, _: Dev, bytes: u64) {
            self.0.set(self.0.get() + bytes as i64);
        }
        fn release(&self, _: Dev, bytes: u64) {
            self.0.set(self.0.get() - bytes as i64);
        }
    }

    impl Net {
        fn get(&self) -> u64 {
            u64::try_from(self.0.get()).expect("never released more than charged")
        }
    }

    fn setup() -> (crate::memory::tests::TempRegion, Dev, Pools, Fake, Net) {
        let (t, id) = device_id();
        (
            t,
            Dev { ordinal: 0, id },
            Pools::new(),
            Fake::default(),
            Net::default(),
        )
    }

    #[test]
    fn a_pools_charge_follows_its_reserved_size_and_host_pools_are_never_charged() {
        let (_t, dev, pools, d, c) = setup();
        // Nothing tracked: a device's refresh asks the driver nothing (cuMemGetInfo's path).
        d.reserve_pool(P, 8 * MIB);
        pools.refresh_of(&d, &c, dev.id);
        assert_eq!(d.asked.get(), 0);
        pools.track(P, Some(dev));
        assert_eq!(pools.device(P), Some(Some(dev)));
        pools.refresh_of(&d, &c, dev.id);
        assert_eq!(c.get(), 8 * MIB);
        d.reserve_pool(P, 2 * MIB);
        pools.refresh(&d, &c, P);
        assert_eq!(c.get(), 2 * MIB);
        // The driver will not say: the charge stays.
        d.reserved.borrow_mut().clear();
        pools.refresh(&d, &c, P);
        assert_eq!(c.get(), 2 * MIB);
        // A host pool is known but holds no device memory.
        pools.track(P + 1, None);
        d.reserve_pool(P + 1, 64 * MIB);
        pools.refresh(&d, &c, P + 1);
        assert_eq!(pools.device(P + 1), Some(None));
        assert_eq!(c.get(), 2 * MIB);
        assert_eq!(
            pools.slack(&d, P + 2),
            0,
            "an unknown pool's reserve is not ours to spend"
        );
    }

    #[test]
    fn a_settlement_charges_the_pools_growth_out_of_what_was_admitted() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        // Admitted 4 MiB (charged by the admission), the pool grew by 2: 2 go back.
        c.force(dev, 4 * MIB);
        d.reserve_pool(P, 2 * MIB);
        assert_eq!(pools.settle(&d, &c, P, dev, 4 * MIB, 4 * MIB, 0x100, None), 0);
        assert_eq!(c.get(), 2 * MIB);
        // Admitted 1 MiB, the pool grew by 4: the driver handed it out, so it is forced and said.
        c.force(dev, MIB);
        d.reserve_pool(P, 6 * MIB);
        assert_eq!(pools.settle(&d, &c, P, dev, MIB, MIB, 0x200, None), 3 * MIB);
        assert_eq!(c.get(), 6 * MIB);
        // The reserve shrank below the charge: the admission and the difference go back.
        c.force(dev, MIB);
        d.reserve_pool(P, 3 * MIB);
        assert_eq!(pools.settle(&d, &c, P, dev, MIB, MIB, 0x300, None), 0);
        assert_eq!(c.get(), 3 * MIB);
        // An untracked pool's settlement gives the admission back.
        c.force(dev, MIB);
        assert_eq!(pools.settle(&d, &c, P + 1, dev, MIB, MIB, 0x400, None), 0);
        assert_eq!(c.get(), 3 * MIB);
    }

    #[test]
    fn freed_blocks_serve_the_smallest_fitting_claim_once_until_the_reserve_shrinks() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 8 * MIB);
        pools.refresh(&d, &c, P);
        pools.freed(&c, P, 0x100, 4 * MIB, None);
        pools.freed(&c, P, 0x200, 2 * MIB, None);
        assert_eq!(
            pools.prepare(&d, &c, P, 2 * MIB, false),
            None,
            "not asked to claim"
        );
        assert_eq!(
            pools.prepare(&d, &c, P, 2 * MIB, true),
            Some(0x200),
            "the smallest that fits"
        );
        assert_eq!(
            pools.prepare(&d, &c, P, 2 * MIB, true),
            Some(0x100),
            "a claimed block is not claimed twice"
        );
        assert_eq!(pools.prepare(&d, &c, P, 2 * MIB, true), None);
        pools.unclaim(P, 0x200);
        assert_eq!(
            pools.prepare(&d, &c, P, MIB, true),
            Some(0x200),
            "unclaimed: free for others again"
        );
        d.used.set(5 * MIB);
        assert_eq!(pools.slack(&d, P), 3 * MIB);
        // A shrunk reserve released blocks it does not name: all are forgotten.
        pools.unclaim(P, 0x200);
        d.reserve_pool(P, 6 * MIB);
        assert_eq!(pools.prepare(&d, &c, P, MIB, true), None);
        assert_eq!(c.get(), 6 * MIB);
    }

    #[test]
    fn a_destroyed_pool_keeps_its_charge_until_its_allocations_are_freed_and_their_streams_synchronized() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 8 * MIB);
        pools.refresh(&d, &c, P);
        let key = pools.destroy_begins(P).expect("a device pool");
        assert_eq!(pools.device(P), None, "the handle is gone");
        pools.destroy_counted(&c, key, 3);
        assert_eq!(c.get(), 8 * MIB);
        pools.destroyed_freed(&c, key, None);
        pools.freed(&c, key, 0x200, MIB, Some(5));
        // A synchronisation that began before the last free was enqueued does not cover it.
        let early = pools.sync_starts().expect("a free in stream order was seen");
        pools.freed(&c, key, 0x100, MIB, Some(5));
        pools.synchronized(&c, dev, early, Some(5));
        assert_eq!(c.get(), 8 * MIB, "the free may not have run yet");
        let late = pools.sync_starts().expect("epoch");
        pools.synchronized(&c, dev, late, Some(6));
        assert_eq!(c.get(), 8 * MIB, "another stream's synchronisation");
        pools.synchronized(&c, dev, late, Some(5));
        assert_eq!(c.get(), 0);
        // A host pool's destroy forgets it: nothing was charged.
        pools.track(P + 1, None);
        assert_eq!(pools.destroy_begins(P + 1), None);
        assert_eq!(pools.device(P + 1), None);
    }

    #[test]
    fn a_free_in_flight_across_a_destroy_holds_the_destroyed_pool_until_it_is_done() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 4 * MIB);
        pools.refresh(&d, &c, P);
        pools.free_begins(P);
        let key = pools.destroy_begins(P).expect("a device pool");
        pools.destroy_counted(&c, key, 0);
        assert_eq!(c.get(), 4 * MIB, "a free is in flight");
        assert!(pools.free_done(&c, P, None), "the destroyed pool took the free");
        assert_eq!(c.get(), 0);
        // A refused free of a destroyed pool counts as still out, once.
        pools.track(P, Some(dev));
        pools.refresh(&d, &c, P);
        pools.free_begins(P);
        let key = pools.destroy_begins(P).expect("a device pool");
        pools.destroy_counted(&c, key, 0);
        assert_eq!(pools.free_refused(P), Some(key));
        pools.refused_counted(&c, key, true);
        assert_eq!(c.get(), 4 * MIB, "its allocation is still out");
        pools.destroyed_freed(&c, key, None);
        assert_eq!(c.get(), 0);
        // A live pool's refused free is simply done with.
        pools.track(P, Some(dev));
        pools.free_begins(P);
        assert_eq!(pools.free_refused(P), None);
    }

    #[test]
    fn a_context_gone_lets_destroyed_pools_waiting_for_its_frees_go() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 4 * MIB);
        pools.refresh(&d, &c, P);
        let key = pools.destroy_begins(P).expect("a device pool");
        pools.destroy_counted(&c, key, 1);
        pools.freed(&c, key, 0x100, MIB, Some(9));
        assert_eq!(c.get(), 4 * MIB);
        pools.context_gone(&c, dev);
        assert_eq!(c.get(), 0);
    }
}

//! Memory that stream-ordered pools hold (charged by `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`). Hooks call one
//! door, [`Memory::pool`] ([`PoolCall`] says which call), which composes [`Pools`] with admission and the
//! ledger. [`Pools`] owns what is known of each pool (its charge, a destroyed pool's allocations still out,
//! the frees it waits for, the blocks freed into its reserve) and the calls' logic; it moves the process's
//! charge through [`Charges`], is admitted through a closure that returns an [`Admission`], takes the ledger
//! by reference and asks the driver through [`Driver`], so it is tested with fakes. The devices' graph pools:
//! `graphs`.

use super::charge::Charge;
use super::driver::Driver;
use super::ledger::{Kind, Ledger, Space};
use super::Memory;
use crate::devices::Dev;
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

/// An admission of a pool allocation's bytes, held until the driver call returned: dropped, the bytes go back;
/// kept, the pool's settlement has taken them over (`Charge` in the shim, a recorder in tests).
pub(super) trait Admission {
    /// Keeps the charge without giving it back.
    fn keep(self);
}

impl Admission for Charge<'_> {
    fn keep(self) {
        Charge::keep(self);
    }
}

/// Where a stream-ordered allocation goes ([`Pools::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// From pool `.1`, charged on device `.0`.
    Pool(Dev, usize),
    /// From a host pool: not device memory.
    Host,
    /// On a device without an accounting identity.
    Unplaced,
    /// From a current pool the driver will not name: charged as a plain allocation on the device.
    Plain(Dev),
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
    /// A destroyed pool whose allocations are still being counted (`Pools::destroy`): not released meanwhile.
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
    fn track(&self, pool: usize, dev: Option<Dev>) {
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
    fn device(&self, pool: usize) -> Option<Option<Dev>> {
        self.map.lock().get(&pool).map(|p| p.dev)
    }

    /// Re-reads a pool's reserved size and charges (unconditionally) or releases the difference.
    fn refresh(&self, d: &impl Driver, c: &impl Charges, pool: usize) {
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
    fn prepare(&self, d: &impl Driver, c: &impl Charges, pool: usize, len: u64, claim: bool) -> Option<u64> {
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
    fn unclaim(&self, pool: usize, addr: u64) {
        if let Some(p) = self.map.lock().get_mut(&pool) {
            p.unclaim(addr);
        }
    }

    /// After a successful pool allocation of `len` bytes at `addr`, admitted with `est` (and counting on the
    /// block `claimed`): the pool's growth is charged out of the admitted bytes and the rest given back (growth
    /// beyond them is forced: the driver already handed it out), and the known free blocks follow what the
    /// driver did. Returns the growth beyond `est` (0 when the admission covered it).
    #[allow(clippy::too_many_arguments)]
    fn settle(
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
    fn slack(&self, d: &impl Driver, pool: usize) -> u64 {
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
    fn freed(&self, c: &impl Charges, pool: usize, addr: u64, len: u64, stream: Option<usize>) {
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
    fn destroyed_freed(&self, c: &impl Charges, key: usize, stream: Option<usize>) {
        let mut pools = self.map.lock();
        let Some(p) = pools.get_mut(&key) else { return };
        p.left -= 1;
        if let Some(st) = stream {
            p.awaits(st);
        }
        release_destroyed(c, &mut pools);
    }

    /// The last context on `dev` is gone: nothing of it runs any more, so no free on `dev` is waiting.
    fn context_gone(&self, c: &impl Charges, dev: Dev) {
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
    fn destroy_begins(&self, pool: usize) -> Option<usize> {
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
    fn destroy_counted(&self, c: &impl Charges, key: usize, out: usize) {
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
    #[inline(never)] // out of a plain free's path (the hot-path gate)
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
    fn free_done(&self, c: &impl Charges, pool: usize, stream: Option<usize>) -> bool {
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
    fn free_refused(&self, pool: usize) -> Option<usize> {
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
    fn refused_counted(&self, c: &impl Charges, key: usize, unseen: bool) {
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

    // ---- the calls: what `Memory::pool` and the frees compose ----------------------------------------------

    /// Where a stream-ordered allocation from `pool` (`None`: the current pool of the stream's device,
    /// `stream_dev()`) goes. A pool we did not see created is charged to the device whose default or current
    /// pool it is (among `devs`; it may serve allocations on another device's stream, whose device would be
    /// the wrong one), else to the stream's.
    pub(super) fn place(
        &self,
        d: &impl Driver,
        devs: impl Iterator<Item = Dev>,
        pool: Option<usize>,
        stream_dev: &dyn Fn() -> Option<Dev>,
    ) -> Place {
        let Some(pool) = pool else {
            let Some(dev) = stream_dev() else {
                return Place::Unplaced;
            };
            return match d.mem_pool(dev.ordinal) {
                Ok(pool) if pool != 0 => Place::Pool(dev, pool),
                _ => Place::Plain(dev),
            };
        };
        match self.device(pool) {
            Some(Some(dev)) => Place::Pool(dev, pool),
            Some(None) => Place::Host,
            None => match self.owner(d, devs, pool).or_else(stream_dev) {
                Some(dev) => Place::Pool(dev, pool),
                None => Place::Unplaced,
            },
        }
    }

    /// The device among `devs` whose default or current pool `pool` is (`cuDeviceGetDefaultMemPool` /
    /// `cuDeviceGetMemPool`): remembered for the pool.
    fn owner(&self, d: &impl Driver, devs: impl Iterator<Item = Dev>, pool: usize) -> Option<Dev> {
        let owns =
            |dev: Dev| d.default_mem_pool(dev.ordinal) == Ok(pool) || d.mem_pool(dev.ordinal) == Ok(pool);
        let devs: Vec<Dev> = devs.collect();
        let dev = devs.into_iter().find(|&dev| owns(dev))?;
        self.track(pool, Some(dev));
        Some(dev)
    }

    /// A pool allocation of `len` (rounded) bytes from `pool` on `dev` through `call`. The pool may grow by the
    /// whole request, so that is what `admit` is asked for before the driver is called: no moment exists when
    /// the pool holds more than the container was admitted (refused, the device's pools are re-read, they may
    /// have released memory at a synchronisation, and it is asked once more). Only when the whole request does
    /// not fit, and a block this process freed into the pool's reserve (already charged) can serve it, is it
    /// admitted with what the unused reserve cannot cover (usually nothing). Refused: `CUDA_ERROR_OUT_OF_MEMORY`,
    /// the driver not called. Once `call` succeeded, `recorded()` records the allocation and says its address,
    /// and the charge settles to the pool's real `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc<A: Admission>(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        dev: Dev,
        pool: usize,
        len: u64,
        admit: impl Fn(u64) -> Option<A>,
        call: impl FnOnce() -> CUresult,
        recorded: impl FnOnce() -> u64,
    ) -> CUresult {
        self.track(pool, Some(dev));
        self.prepare(d, c, pool, len, false);
        // Held until the driver call returns (a reserved-memory announcement lives in it).
        let full = admit(len).or_else(|| {
            self.refresh_of(d, c, dev.id);
            admit(len)
        });
        let (held, admitted, claimed) = if let Some(a) = full {
            (a, len, None)
        } else if let Some(block) = self.prepare(d, c, pool, len, true) {
            let est = len.saturating_sub(self.slack(d, pool));
            match admit(est) {
                Some(a) => (a, est, Some(block)),
                None => {
                    self.unclaim(pool, block);
                    return CUresult::ERROR_OUT_OF_MEMORY;
                }
            }
        } else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = call();
        if !r.ok() {
            drop(held);
            if let Some(block) = claimed {
                self.unclaim(pool, block);
            }
            return r;
        }
        let addr = recorded();
        // The pool's settlement takes the admitted bytes over.
        let over = self.settle(d, c, pool, dev, admitted, len, addr, claimed);
        held.keep();
        if over > 0 {
            // Only a driver that grows the pool although a free block of the size was in its reserve gets here.
            log!(
                Level::Warn,
                "pool {pool:#x} grew {over} bytes beyond what was admitted for a {len}-byte allocation"
            );
        }
        r
    }

    /// `cuMemPoolCreate` through `call`: a pool on `on` (`Some(None)`: a host pool) is tracked from now on
    /// (`out()` names it); one on a device without an accounting identity (`None`) is left unknown, so that its
    /// allocations are refused while limits apply.
    pub(super) fn create(
        &self,
        on: Option<Option<Dev>>,
        call: impl FnOnce() -> CUresult,
        out: &dyn Fn() -> Option<usize>,
    ) -> CUresult {
        let r = call();
        if let (true, Some(on)) = (r.ok(), on) {
            if let Some(pool) = out() {
                self.track(pool, on);
            }
        }
        r
    }

    /// `cuMemPoolTrimTo` of `pool` through `call`: the pool is re-read.
    pub(super) fn trim(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        pool: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r.ok() {
            self.refresh(d, c, pool);
        }
        r
    }

    /// `cuMemPoolDestroy` of `pool` through `call`. Its reserve is re-read first (memory the destroyed pool may
    /// hold until frees run in stream order); once destroyed, its allocations still in `ledger` move to the
    /// destroyed pool's key (in place before they are re-keyed, so a free racing this counts down there), which
    /// keeps the charge until they are freed and their frees have run.
    pub(super) fn destroy(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        ledger: &Ledger,
        pool: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.refresh(d, c, pool);
        let r = call();
        if r.ok() {
            if let Some(key) = self.destroy_begins(pool) {
                let out = ledger.retag_pool(pool, key);
                self.destroy_counted(c, key, out);
            }
        }
        r
    }

    /// `cuCtxSynchronize` of `dev()`'s context (`stream` = `None`) or `cuStreamSynchronize` of a stream (its
    /// key) through `call`: destroyed pools whose frees it waited for go.
    pub(super) fn synchronize(
        &self,
        c: &impl Charges,
        dev: &dyn Fn() -> Option<Dev>,
        stream: Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Some(start) = self.sync_starts() else {
            return call();
        };
        let r = call();
        if let Some(dev) = dev().filter(|_| r.ok()) {
            self.synchronized(c, dev, start, stream);
        }
        r
    }

    /// The pool allocation at `addr` of `len` bytes is back in `pool`'s reserve (`stream`: freed in stream
    /// order there): its block is known free and the pool re-read.
    pub(super) fn back(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        pool: usize,
        addr: u64,
        len: u64,
        stream: Option<usize>,
    ) {
        self.freed(c, pool, addr, len, stream);
        self.refresh(d, c, pool);
    }

    /// The free of the allocation of `pool` at `addr`, of `len` bytes, that [`Pools::free_begins`] announced
    /// succeeded (`stream`: in stream order there): its block is back in the reserve, or the destroyed pool that
    /// took the free over awaits its stream.
    #[inline(never)] // out of a plain free's path (the hot-path gate)
    pub(super) fn free_done_back(
        &self,
        d: &impl Driver,
        c: &impl Charges,
        pool: usize,
        addr: u64,
        len: u64,
        stream: Option<usize>,
    ) {
        if !self.free_done(c, pool, stream) {
            self.back(d, c, pool, addr, len, stream);
        }
    }

    /// The free [`Pools::free_begins`] announced was refused and its record (of `pool`, at `addr`) is back in
    /// `ledger`. If the pool was destroyed meanwhile, the record belongs to the destroyed pool and counts as
    /// still out of it, once: re-tagged unless the destroy's count saw it back (waited for).
    #[inline(never)] // out of a plain free's path (the hot-path gate)
    pub(super) fn free_refused_back(&self, c: &impl Charges, ledger: &Ledger, pool: usize, addr: u64) {
        let Some(moved) = self.free_refused(pool) else {
            return;
        };
        let rec = ledger.get(Space::Pointer, addr);
        let unseen = rec.is_some_and(|r| r.kind == Kind::Pool(pool));
        if let Some(mut r) = rec.filter(|_| unseen) {
            r.kind = Kind::Pool(moved);
            ledger.insert(Space::Pointer, addr, r);
        }
        self.refused_counted(c, moved, unseen);
    }

    /// The driver freed the allocation a record of `pool` named (its context went): a destroyed pool counts it
    /// down; a live pool's reserve is re-read when its context goes.
    pub(super) fn record_gone(&self, c: &impl Charges, pool: usize) {
        if pool & DESTROYED != 0 {
            self.destroyed_freed(c, pool, None);
        }
    }

    /// The last context on `dev` is gone: no free there is awaited any more, and its pools are re-read.
    pub(super) fn context_ended(&self, d: &impl Driver, c: &impl Charges, dev: Dev) {
        self.context_gone(c, dev);
        self.refresh_of(d, c, dev.id);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::driver::fake::Fake;
    use crate::memory::ledger::Record;
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

    /// An admission under `cap` (of what `c` holds), as `Memory::charge` makes it: a guard that gives the bytes
    /// back when dropped.
    struct Held<'a> {
        c: &'a Net,
        dev: Dev,
        bytes: u64,
    }

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.c.release(self.dev, self.bytes);
        }
    }

    impl Admission for Held<'_> {
        fn keep(mut self) {
            self.bytes = 0;
        }
    }

    fn under<'a>(c: &'a Net, dev: Dev, cap: u64) -> impl Fn(u64) -> Option<Held<'a>> {
        move |n| {
            (c.get() + n <= cap).then(|| {
                c.force(dev, n);
                Held { c, dev, bytes: n }
            })
        }
    }

    #[test]
    fn a_pool_allocation_over_the_cap_is_refused_before_the_driver_with_nothing_charged() {
        let (_t, dev, pools, d, c) = setup();
        d.reserve_pool(P, 0);
        let called = Cell::new(false);
        let call = || {
            called.set(true);
            CUresult::SUCCESS
        };
        let r = pools.alloc(&d, &c, dev, P, 8 * MIB, under(&c, dev, 4 * MIB), call, || 0x100);
        assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
        assert!(!called.get(), "the driver was not called");
        assert_eq!(c.get(), 0, "nothing charged");
        // The driver refuses one that fits: its admission goes back.
        let refused = || CUresult::ERROR_INVALID_VALUE;
        let r = pools.alloc(&d, &c, dev, P, 2 * MIB, under(&c, dev, 4 * MIB), refused, || {
            0x100
        });
        assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
        assert_eq!(c.get(), 0);
        // Control: it fits and the pool grows by it; the charge is the pool's reserve.
        let grows = || {
            d.reserve_pool(P, 2 * MIB);
            CUresult::SUCCESS
        };
        let r = pools.alloc(&d, &c, dev, P, 2 * MIB, under(&c, dev, 4 * MIB), grows, || 0x100);
        assert_eq!(r, CUresult::SUCCESS);
        assert_eq!(c.get(), 2 * MIB);
        assert_eq!(pools.device(P), Some(Some(dev)), "tracked");
    }

    #[test]
    fn a_block_freed_into_the_reserve_serves_an_allocation_the_cap_would_refuse_once() {
        let (_t, dev, pools, d, c) = setup();
        let grows = || {
            d.reserve_pool(P, 2 * MIB);
            CUresult::SUCCESS
        };
        let cap = 3 * MIB;
        assert!(pools
            .alloc(&d, &c, dev, P, 2 * MIB, under(&c, dev, cap), grows, || 0x100)
            .ok());
        // Freed in stream order: the block stays in the reserve, charged.
        pools.free_begins(P);
        pools.free_done_back(&d, &c, P, 0x100, 2 * MIB, Some(3));
        assert_eq!(c.get(), 2 * MIB);
        // 2 more MiB would pass the cap, but the reserve serves them: admitted with nothing more.
        let served = || CUresult::SUCCESS;
        assert!(pools
            .alloc(&d, &c, dev, P, 2 * MIB, under(&c, dev, cap), served, || 0x100)
            .ok());
        assert_eq!(c.get(), 2 * MIB);
        // The block is taken: the next one is refused.
        let r = pools.alloc(&d, &c, dev, P, 2 * MIB, under(&c, dev, cap), served, || 0x200);
        assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
        assert_eq!(c.get(), 2 * MIB);
    }

    #[test]
    fn a_trim_re_reads_the_reserved_size_once_the_driver_trimmed() {
        let (_t, dev, pools, d, c) = setup();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 8 * MIB);
        assert!(pools.trim(&d, &c, P, || CUresult::SUCCESS).ok());
        assert_eq!(c.get(), 8 * MIB);
        d.reserve_pool(P, 2 * MIB);
        let refused = pools.trim(&d, &c, P, || CUresult::ERROR_INVALID_VALUE);
        assert_eq!(refused, CUresult::ERROR_INVALID_VALUE);
        assert_eq!(c.get(), 8 * MIB, "not trimmed: not re-read");
        assert!(pools.trim(&d, &c, P, || CUresult::SUCCESS).ok());
        assert_eq!(c.get(), 2 * MIB);
    }

    #[test]
    fn a_destroyed_pools_records_count_down_its_charge_and_a_refused_free_puts_its_record_back() {
        let (_t, dev, pools, d, c) = setup();
        let ledger = Ledger::new();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 4 * MIB);
        let rec = Record {
            entry: dev.id,
            bytes: MIB,
            kind: Kind::Pool(P),
        };
        for a in [0x100, 0x200] {
            ledger.insert(Space::Pointer, a, rec);
        }
        // A free the driver refuses: the record is back, the pool as it was.
        let taken = ledger.remove(Space::Pointer, 0x100).expect("recorded");
        pools.free_begins(P);
        ledger.insert(Space::Pointer, 0x100, taken);
        pools.free_refused_back(&c, &ledger, P, 0x100);
        assert_eq!(ledger.get(Space::Pointer, 0x100), Some(rec));
        // The driver refuses the destroy: nothing moves but the re-read.
        assert!(!pools
            .destroy(&d, &c, &ledger, P, || CUresult::ERROR_INVALID_VALUE)
            .ok());
        assert_eq!(c.get(), 4 * MIB);
        assert_eq!(ledger.get(Space::Pointer, 0x100), Some(rec));
        assert!(pools.destroy(&d, &c, &ledger, P, || CUresult::SUCCESS).ok());
        assert_eq!(pools.device(P), None, "the handle is gone");
        let Some(Record {
            kind: Kind::Pool(key),
            ..
        }) = ledger.get(Space::Pointer, 0x100)
        else {
            panic!("re-tagged")
        };
        assert_ne!(key, P);
        for a in [0x100, 0x200] {
            assert_eq!(c.get(), 4 * MIB, "an allocation is still out");
            let taken = ledger.remove(Space::Pointer, a).expect("recorded");
            pools.free_begins(key);
            pools.free_done_back(&d, &c, key, a, taken.bytes, None);
        }
        assert_eq!(c.get(), 0);
    }

    #[test]
    fn an_allocation_goes_to_its_pools_device_a_host_pool_is_not_charged_and_an_unknown_device_is_unplaced() {
        let (_t, dev, pools, d, _c) = setup();
        let dev1 = Dev { ordinal: 1, ..dev };
        let devs = || [dev, dev1].into_iter();
        let none = || None;
        // A pool we did not see created, device 1's default pool, used on device 0's stream.
        d.device_pools.borrow_mut().insert(1, (P, P + 9));
        let on0 = || Some(dev);
        assert_eq!(pools.place(&d, devs(), Some(P), &on0), Place::Pool(dev1, P));
        assert_eq!(pools.device(P), Some(Some(dev1)), "remembered");
        // Nobody's pool: the stream's device, else none.
        assert_eq!(
            pools.place(&d, devs(), Some(P + 1), &on0),
            Place::Pool(dev, P + 1)
        );
        assert_eq!(pools.place(&d, devs(), Some(P + 2), &none), Place::Unplaced);
        // A host pool created here; one created on a device without an accounting identity stays unknown.
        assert!(pools
            .create(Some(None), || CUresult::SUCCESS, &|| Some(P + 3))
            .ok());
        assert_eq!(pools.place(&d, devs(), Some(P + 3), &none), Place::Host);
        assert!(pools.create(None, || CUresult::SUCCESS, &|| Some(P + 4)).ok());
        assert_eq!(pools.place(&d, devs(), Some(P + 4), &none), Place::Unplaced);
        // The current pool: the driver names it, or the allocation is charged as a plain one.
        let on1 = || Some(dev1);
        assert_eq!(pools.place(&d, devs(), None, &on1), Place::Pool(dev1, P + 9));
        assert_eq!(pools.place(&d, devs(), None, &on0), Place::Plain(dev));
        assert_eq!(pools.place(&d, devs(), None, &none), Place::Unplaced);
    }

    #[test]
    fn only_a_synchronization_that_returned_lets_a_destroyed_pool_waiting_for_its_stream_go() {
        let (_t, dev, pools, d, c) = setup();
        let ledger = Ledger::new();
        pools.track(P, Some(dev));
        d.reserve_pool(P, 4 * MIB);
        let rec = Record {
            entry: dev.id,
            bytes: MIB,
            kind: Kind::Pool(P),
        };
        ledger.insert(Space::Pointer, 0x100, rec);
        assert!(pools.destroy(&d, &c, &ledger, P, || CUresult::SUCCESS).ok());
        let Some(Record {
            kind: Kind::Pool(key),
            ..
        }) = ledger.remove(Space::Pointer, 0x100)
        else {
            panic!("re-tagged")
        };
        pools.free_begins(key);
        pools.free_done_back(&d, &c, key, 0x100, MIB, Some(5));
        assert_eq!(c.get(), 4 * MIB, "its free may not have run");
        let on = || Some(dev);
        let refused = pools.synchronize(&c, &on, Some(5), || CUresult::ERROR_INVALID_VALUE);
        assert_eq!(refused, CUresult::ERROR_INVALID_VALUE);
        assert_eq!(c.get(), 4 * MIB, "refused: nothing is known to have run");
        assert!(pools.synchronize(&c, &on, Some(5), || CUresult::SUCCESS).ok());
        assert_eq!(c.get(), 0);
    }
}
